//! The known-answer harness against the CPU backend: every implementation,
//! inline and through the `dyn Backend` path.

mod common;

use crypto_offload::testing::{self, Case, FILES};
use crypto_offload::{Implementation, Offload};

#[test]
fn vector_files_parse_with_the_expected_record_counts() {
    let expected = [
        ("sp800-38a.txt", 6),
        ("ieee1619-xts.txt", 18),
        ("gcm-spec.txt", 20),
        ("crc-catalogue.txt", 15),
        ("edge-cases.txt", 73),
    ];
    for ((file, text), (name, count)) in FILES.iter().zip(expected) {
        assert_eq!(*file, name);
        let v = testing::parse(file, text).unwrap();
        assert_eq!(v.len(), count, "{file}");
    }
    let (all, skipped) = testing::vectors();
    let wycheproof = all
        .iter()
        .filter(|v| v.source.starts_with("wycheproof"))
        .count();
    // aes_gcm: 197 with 96-bit nonces and 128-bit tags; aes_cbc_pkcs5: 216;
    // aes_xts: 123.
    assert_eq!(wycheproof, 197 + 216 + 123, "wycheproof vectors");
    assert!(
        skipped > 0,
        "the non-96-bit-nonce GCM groups are counted as skipped"
    );
    let invalid_aead = all
        .iter()
        .filter(|v| matches!(v.case, Case::Aead { valid: false, .. }))
        .count();
    assert!(
        invalid_aead >= 8 + 81,
        "{invalid_aead} invalid AEAD vectors"
    );
}

#[test]
fn a_malformed_record_is_reported_with_its_number() {
    let text = "# header\nalg = aes-128-cbc\nkey = 00\niv = 00\npt = \nct = \n\nalg = aes-128-cbc\nkey = zz\n";
    let err = testing::parse("x.txt", text).unwrap_err().to_string();
    assert!(err.contains("record 2"), "{err}");
    assert!(testing::parse("x.txt", "alg = rot13\n").is_err());
}

#[tokio::test]
async fn cpu_backend_passes_every_vector() {
    let offload = Offload::discover().await.unwrap();
    let report = testing::run_vectors(&offload).await;
    report.assert_ok();
    assert_eq!(report.unsupported, 0);
    println!("{report:?}");
}

#[tokio::test]
async fn every_cpu_implementation_passes_every_vector() {
    for &imp in Implementation::ALL {
        let offload = Offload::builder().cpu_implementation(imp).build().unwrap();
        let report = testing::run_vectors(&offload).await;
        report.assert_ok();
        assert_eq!(report.unsupported, 0, "{imp:?}");
    }
}

#[tokio::test]
async fn a_pinned_dyn_backend_passes_every_vector() {
    let engine = common::Engine::new("engine");
    let requests = engine.requests.clone();
    let offload = Offload::builder()
        .backend(engine.shared())
        .pin("engine")
        .build()
        .unwrap();
    let report = testing::run_vectors(&offload).await;
    report.assert_ok();
    assert!(
        requests.load(std::sync::atomic::Ordering::Relaxed) > 1000,
        "requests reached the engine"
    );
}

#[tokio::test]
async fn a_backend_that_runs_one_algorithm_counts_the_rest_unsupported() {
    let alg = crypto_offload::Algorithm::Crc(crypto_offload::CrcAlg::Crc32Iscsi);
    let offload = Offload::builder()
        .backend(common::Engine::new("crc32c-only").only(alg).shared())
        .pin("crc32c-only")
        .build()
        .unwrap();
    let report = testing::run_vectors(&offload).await;
    report.assert_ok();
    // The three CRC-32/ISCSI catalogue records, and IEEE 1619 vector 1,
    // whose weak key the session refuses before any backend is asked.
    assert_eq!(report.passed, 4);
    assert!(report.unsupported > 500);
}

#[tokio::test]
async fn the_harness_catches_a_backend_that_returns_wrong_bytes() {
    let offload = Offload::builder()
        .backend(common::Engine::new("broken").corrupting().shared())
        .pin("broken")
        .build()
        .unwrap();
    let report = testing::run_vectors(&offload).await;
    // Every vector whose result the corruption touches must be caught: the
    // non-empty cipher vectors (but the weak XTS key, refused before the
    // backend), the valid AEAD vectors (the tag) and every CRC of a
    // non-empty input (an empty piece adds nothing when combined).
    let (all, _) = testing::vectors();
    let touched = all
        .iter()
        .filter(|v| match &v.case {
            Case::Cipher { key, pt, .. } => {
                !pt.is_empty() && key[..key.len() / 2] != key[key.len() / 2..]
            }
            Case::Aead { valid, .. } => *valid,
            Case::Crc { input, .. } => !input.is_empty(),
            _ => false,
        })
        .count();
    assert_eq!(report.failures.len(), touched, "{:#?}", report.failures);
    assert!(std::panic::catch_unwind(|| report.assert_ok()).is_err());
}
