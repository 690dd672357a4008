//! The known-answer harness against the CPU backend: every implementation,
//! inline and through the `dyn Backend` path.

use crate::common;

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
    println!("{report}");
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

/// The harness on an `Offload` pinned to `engine`.
async fn run_pinned(engine: common::Engine) -> testing::Report {
    let name = engine.name;
    let offload = Offload::builder()
        .backend(engine.shared())
        .pin(name)
        .build()
        .unwrap();
    testing::run_vectors(&offload).await
}

#[tokio::test]
async fn a_pinned_engine_reports_what_it_served() {
    let report = run_pinned(common::Engine::new("engine")).await;
    report.assert_ok();
    let p = report.pinned.as_ref().expect("pinned");
    assert_eq!(p.name, "engine");
    assert!(p.requests > 1000, "{report}");
    assert_eq!((p.failures, p.replayed), (0, 0), "{report}");
    // Every algorithm has vectors, and every vector ran on the engine.
    assert_eq!(p.served.len(), crypto_offload::Algorithm::all().count());
    assert!(
        p.served.iter().all(|&(_, ran, on)| ran > 0 && on == ran),
        "{p:?}"
    );
    assert!(report.to_string().contains("engine: "), "{report}");
}

#[tokio::test]
async fn the_harness_catches_an_engine_that_fails_every_request() {
    // Every request fails and is completed on the CPU: every answer is
    // right, and the run must still fail.
    let report = run_pinned(common::Engine::new("failing").failing_every(1)).await;
    assert!(report.failures.is_empty(), "{:#?}", report.failures);
    let p = report.pinned.as_ref().unwrap();
    assert_eq!(p.requests, 0, "{report}");
    assert!(p.failures > 1000 && p.replayed == p.failures, "{report}");
    let problems = report.problems().join("\n");
    assert!(problems.contains("failing failed"), "{problems}");
    assert!(problems.contains("served none"), "{problems}");
    assert!(std::panic::catch_unwind(|| report.assert_ok()).is_err());
}

#[tokio::test]
async fn the_harness_catches_an_engine_that_fails_some_requests() {
    let report = run_pinned(common::Engine::new("flaky").failing_every(97)).await;
    assert!(report.failures.is_empty(), "{:#?}", report.failures);
    let p = report.pinned.as_ref().unwrap();
    assert!(p.failures > 0 && p.replayed == p.failures, "{report}");
    assert!(std::panic::catch_unwind(|| report.assert_ok()).is_err());
}

#[tokio::test]
async fn the_harness_catches_an_engine_that_claims_what_it_refuses() {
    // It lists every algorithm but opens no session: every vector fails
    // (none counts as merely "unsupported"), and it served nothing.
    let report = run_pinned(common::Engine::new("liar").refusing_sessions()).await;
    assert_eq!(report.unsupported, 0);
    assert!(report.failures.len() > 600, "{}", report.failures.len());
    assert!(
        report.failures[0].contains("open: "),
        "{}",
        report.failures[0]
    );
    assert_eq!(report.pinned.as_ref().unwrap().requests, 0);
    assert!(std::panic::catch_unwind(|| report.assert_ok()).is_err());
}

#[tokio::test]
async fn the_harness_catches_an_engine_whose_limits_send_everything_elsewhere() {
    // Claims every algorithm with limits no vector fits (lengths that are
    // multiples of 2^20 bytes): only empty inputs reach it, and the
    // algorithms with no empty vector are served by the CPU alone.
    let report = run_pinned(common::Engine::new("elsewhere").multiple_of(1 << 20)).await;
    assert!(report.failures.is_empty(), "{:#?}", report.failures);
    let p = report.pinned.as_ref().unwrap();
    assert_eq!((p.failures, p.replayed), (0, 0));
    let problems = report.problems();
    assert!(
        problems
            .iter()
            .any(|l| l.contains("claims aes-256-xts but served none")),
        "{problems:#?}"
    );
    assert!(report.to_string().contains("ran elsewhere"), "{report}");
    assert!(std::panic::catch_unwind(|| report.assert_ok()).is_err());
}

#[tokio::test]
async fn an_engine_with_narrow_limits_still_passes() {
    // Lengths of whole blocks only (a device without ciphertext stealing):
    // some vectors run on the CPU, counted, and every algorithm still has
    // vectors it serves.
    let report = run_pinned(common::Engine::new("blocks").multiple_of(16)).await;
    report.assert_ok();
    let p = report.pinned.as_ref().unwrap();
    assert!(p.served.iter().any(|&(_, ran, on)| on < ran), "{p:?}");
}

#[tokio::test]
async fn empty_requests_do_not_count_as_served() {
    // One CRC, with limits no non-empty input fits: the catalogue's empty
    // input reaches the engine (and passes), nothing else does.
    let alg = crypto_offload::Algorithm::Crc(crypto_offload::CrcAlg::Crc32Iscsi);
    let report = run_pinned(
        common::Engine::new("empty-only")
            .only(alg)
            .multiple_of(1 << 20),
    )
    .await;
    assert!(report.failures.is_empty(), "{:#?}", report.failures);
    let problems = report.problems().join("\n");
    assert!(
        problems.contains("claims CRC-32/ISCSI but served none"),
        "{problems}"
    );
    assert!(std::panic::catch_unwind(|| report.assert_ok()).is_err());
}
