//! The fuzz targets' logic outside libFuzzer: every seed decodes to the
//! input it encodes and passes every target, the selector really sends
//! requests to both of its backends, and a backend that returns wrong
//! bytes is caught — a differential check that could not fail would be
//! worthless.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::Duration;

use crypto_offload::{Algorithm, Offload};
use crypto_offload_fuzz::{Harness, Subject, aead, cipher, crc, harness, lifecycle, seed, vectors};
use crypto_offload_sim::{SimConfig, SimEngine, SimTimer};

fn records() -> Vec<vectors::Record> {
    vectors::load(&vectors::default_dir()).expect("the vector files")
}

fn round_trip<T>(seeds: Vec<(String, T)>, encode: fn(&T) -> Vec<u8>) -> Vec<T>
where
    T: for<'a> arbitrary::Arbitrary<'a> + PartialEq + std::fmt::Debug,
{
    assert!(!seeds.is_empty());
    seeds
        .into_iter()
        .map(|(name, input)| {
            let back: Option<T> = seed::decode(&encode(&input));
            assert_eq!(back.as_ref(), Some(&input), "{name}");
            input
        })
        .collect()
}

#[test]
fn every_cipher_seed_passes() {
    for input in round_trip(cipher::seeds(&records()), cipher::encode) {
        cipher::check(harness(), &input);
    }
}

#[test]
fn every_aead_seed_passes() {
    for input in round_trip(aead::seeds(&records()), aead::encode) {
        aead::check(harness(), &input);
    }
}

#[test]
fn every_crc_seed_passes() {
    for input in round_trip(crc::seeds(&records()), crc::encode) {
        crc::check(harness(), &input);
    }
}

#[test]
fn every_lifecycle_seed_passes() {
    for input in round_trip(lifecycle::seeds(&records()), lifecycle::encode) {
        lifecycle::check(&input);
    }
}

/// Auto's subject must not quietly run everything on the CPU: small
/// requests go to the CPU and large ones to the engine, and over the seeds
/// the engine serves requests.
#[test]
fn auto_sends_requests_to_the_cpu_and_to_the_engine() {
    let h = harness();
    let auto = h
        .subjects
        .iter()
        .find(|s| s.name == "auto")
        .expect("an auto subject");
    for alg in crypto_offload::Algorithm::all() {
        let offload = auto.offload();
        let small = offload.explain(alg, crypto_offload::Direction::Encrypt, 64);
        let large = offload.explain(alg, crypto_offload::Direction::Encrypt, 4096);
        assert_eq!(
            (small.choice.as_str(), large.choice.as_str()),
            ("cpu", "sim:auto"),
            "{alg}"
        );
    }
}

/// An engine that hands every buffer back unchanged (a `SimEngine` that
/// skips computing results), pinned, beside the CPU.
fn lying_harness() -> Harness {
    Harness::with_subjects(|| {
        let mut c = SimConfig::new("sim:liar", Algorithm::all().collect(), Duration::ZERO, 1e12);
        c.timer = SimTimer::Tokio;
        c.compute_results = false;
        vec![
            Subject::new("cpu", Offload::builder().build().unwrap()),
            Subject::new(
                "sim:liar",
                Offload::builder()
                    .backend(Arc::new(SimEngine::new(c)))
                    .pin("sim:liar")
                    .build()
                    .unwrap(),
            ),
        ]
    })
}

fn panic_message(f: impl FnOnce()) -> String {
    let err = catch_unwind(AssertUnwindSafe(f)).expect_err("the wrong engine must be caught");
    err.downcast_ref::<String>().cloned().unwrap_or_default()
}

#[test]
fn a_wrong_engine_is_caught_and_named() {
    let h = lying_harness();
    let seeds = cipher::seeds(&records());
    let msg = panic_message(|| cipher::check(&h, &seeds[0].1));
    assert!(msg.starts_with("MISMATCH backend=sim:liar alg="), "{msg}");
    assert!(msg.contains(" dir=") && msg.contains(" len="), "{msg}");

    let seeds = aead::seeds(&records());
    let msg = panic_message(|| aead::check(&h, &seeds[0].1));
    assert!(
        msg.starts_with("MISMATCH backend=sim:liar alg=aes-"),
        "{msg}"
    );

    // A CRC of nothing is 0, which is what the liar answers: use data.
    let seeds = crc::seeds(&records());
    let (_, input) = seeds.iter().find(|(_, i)| !i.data.is_empty()).unwrap();
    let msg = panic_message(|| crc::check(&h, input));
    assert!(
        msg.starts_with("MISMATCH backend=sim:liar alg=CRC-"),
        "{msg}"
    );
}

#[cfg(feature = "aws-lc")]
#[test]
fn every_xts_seed_passes() {
    use crypto_offload_fuzz::xts;
    for input in round_trip(xts::seeds(&records()), xts::encode) {
        xts::check(&input);
    }
}

/// The `vector` seeds are the `aes-256-xts` records themselves (IEEE 1619
/// vectors 10-14 and the edge cases): the native XTS gives each record's
/// ciphertext.
#[cfg(feature = "aws-lc")]
#[test]
fn xts_vector_seeds_give_the_records_ciphertext() {
    use crypto_offload_fuzz::xts;
    let records = records();
    let seeds = xts::seeds(&records);
    let vectors: Vec<_> = records
        .iter()
        .filter(|r| r.alg() == "aes-256-xts")
        .zip(seeds.iter().filter(|(name, _)| name.ends_with("-vector")))
        .collect();
    assert!(vectors.len() >= 5, "IEEE 1619 vectors 10-14 at least");
    for (record, (name, input)) in vectors {
        let xts = crypto_offload_native::Xts256::new(&input.key()).unwrap();
        let mut data = input.plaintext();
        let (unit_len, _) = input.unit_len();
        xts.encrypt_units(&input.first_tweak(), unit_len, &mut data)
            .unwrap();
        assert_eq!(data, record.hex("ct"), "{name}");
    }
}
