//! The AF_ALG backend through `Offload` (feature `af-alg`).
//!
//! On a host without AF_ALG: discovery yields a CPU-only `Offload` and says
//! why. In the QEMU guest (`cargo xtask vm-test` sets
//! `CRYPTO_OFFLOAD_GUEST=1`, and `VMTEST_RUN=virtio` with the
//! virtio-crypto device): every kernel driver that runs one of this crate's
//! algorithms passes the known-answer harness by driver name, with no
//! request replayed on the CPU, and discovery finds the virtio engine.
#![cfg(all(feature = "af-alg", target_os = "linux"))]

use std::sync::Arc;

use crypto_offload::af_alg::{AfAlgBackend, AfAlgMechanism};
use crypto_offload::backend::Backend;
use crypto_offload::{Algorithm, CipherAlg, Offload, testing};
use crypto_offload_af_alg as af;

fn in_guest() -> bool {
    std::env::var_os("CRYPTO_OFFLOAD_GUEST").is_some()
}

fn in_virtio_guest() -> bool {
    std::env::var("VMTEST_RUN").is_ok_and(|r| r == "virtio")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_says_why_af_alg_is_missing_or_finds_its_engines() {
    let offload = Offload::discover().await.unwrap();
    let names: Vec<String> = offload.backends().into_iter().map(|b| b.name).collect();
    match AfAlgBackend::discover() {
        Err(why) => {
            assert!(!in_guest(), "AF_ALG must work in the guest: {}", why.0);
            // The host case: a CPU-only Offload, and a reason to show.
            assert_eq!(names, vec!["cpu".to_owned()]);
            assert!(why.0.contains("AF_ALG"), "{}", why.0);
        }
        Ok(engines) => {
            for e in &engines {
                assert!(names.iter().any(|n| n == e.name()), "{names:?}");
            }
            if in_virtio_guest() {
                let virtio = engines
                    .iter()
                    .find(|e| e.name() == "af-alg:virtio_crypto")
                    .expect("the virtio engine is discovered");
                assert!(
                    virtio
                        .limits(Algorithm::Cipher(CipherAlg::Aes128Cbc))
                        .is_some()
                );
                assert!(
                    virtio
                        .limits(Algorithm::Cipher(CipherAlg::Aes128Xts))
                        .is_none()
                );
            } else if in_guest() {
                // The plain guest has only the kernel's CPU drivers, which
                // are not engines.
                assert!(engines.is_empty(), "{names:?}");
            }
        }
    }
}

/// Every driver in `/proc/crypto` that runs one of this crate's algorithms.
fn drivers() -> Vec<String> {
    let mut out: Vec<String> = af::proc_crypto::read()
        .unwrap_or_default()
        .into_iter()
        .filter(|r| r.af_alg_type().is_some() && r.selftest_passed)
        .filter(|r| AfAlgBackend::with_drivers("probe", &[r.driver.as_str()]).is_ok())
        .map(|r| r.driver)
        .collect();
    out.sort();
    out.dedup();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kernel_driver_passes_the_known_answers() {
    if af::probe().is_err() {
        assert!(!in_guest(), "AF_ALG must work in the guest");
        return;
    }
    let drivers = drivers();
    eprintln!("drivers: {drivers:?}");
    for want in ["cbc", "ctr", "xts", "gcm", "crc32c"] {
        assert!(
            drivers.iter().any(|d| d.contains(want)),
            "no {want} driver in {drivers:?}"
        );
    }
    if in_virtio_guest() {
        assert!(drivers.iter().any(|d| d == "virtio_crypto_aes_cbc"));
    }
    for driver in &drivers {
        let backend = AfAlgBackend::with_drivers("af-alg:under-test", &[driver]).unwrap();
        passes_the_known_answers(backend, driver).await;
    }
    // By generic name: whichever driver the kernel ranks first.
    let generic = AfAlgBackend::generic("af-alg:under-test").unwrap();
    for alg in ["aes-128-cbc", "aes-256-xts", "aes-128-gcm", "CRC-32/ISCSI"] {
        let alg = Algorithm::all().find(|a| a.name() == alg).unwrap();
        assert!(generic.driver(alg).is_some(), "{alg:?} by generic name");
    }
    passes_the_known_answers(generic, "generic names").await;
}

/// Runs the vector harness pinned to `backend` (named
/// `af-alg:under-test`): every vector passes, on AF_ALG, none replayed.
async fn passes_the_known_answers(backend: AfAlgBackend, what: &str) {
    let offload = Offload::builder()
        .backend(Arc::new(backend))
        .pin("af-alg:under-test")
        .build()
        .unwrap();
    let report = testing::run_vectors(&offload).await;
    eprintln!("{what}: {report}");
    // Also fails on any request AF_ALG failed (replays on the CPU would hide
    // a wrong driver) and on a claimed algorithm it served no vector of.
    report.assert_ok();
}

/// The guest's engine (or, with none — the plain guest — the kernel's best
/// CBC driver standing in), with `mechanism`; `None` where AF_ALG is
/// missing (the host).
fn engine(mechanism: AfAlgMechanism) -> Option<Arc<dyn Backend>> {
    let Ok(engines) = AfAlgBackend::discover() else {
        assert!(!in_guest());
        return None;
    };
    Some(match engines.into_iter().next() {
        Some(e) => Arc::new(e.with_mechanism(mechanism)),
        None => {
            let cbc = af::proc_crypto::read()
                .unwrap()
                .into_iter()
                .filter(|r| r.name == "cbc(aes)" && r.af_alg_type() == Some("skcipher"))
                .max_by_key(|r| r.priority)
                .expect("a cbc(aes) driver");
            Arc::new(
                AfAlgBackend::with_drivers("af-alg:cpu", &[&cbc.driver])
                    .unwrap()
                    .with_mechanism(mechanism),
            )
        }
    })
}

/// A small deterministic generator (xorshift64*) for the drop points.
fn next(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// Through `Offload` pinned to the engine, on each mechanism: 64 tasks,
/// each request dropped at a random point (after its first poll, or at a
/// random deadline of up to 3 ms, before or after the kernel took it) or
/// run to the end. Every one that completes is right, none is replayed on
/// the CPU, and the session still computes right afterwards (the sockets
/// of dropped requests — the kernel's to finish — are checked in
/// `backends/af-alg/tests/kernel.rs`, alone in a process).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_through_offload_dropped_at_random_points_lose_nothing() {
    for mechanism in [AfAlgMechanism::Aio, AfAlgMechanism::Threads] {
        let Some(backend) = engine(mechanism) else {
            return;
        };
        let name = backend.name().to_owned();
        let offload = Offload::builder()
            .backend(backend)
            .pin(name.clone())
            .build()
            .unwrap();
        let key = [0x42u8; 16];
        let s = Arc::new(offload.cipher(CipherAlg::Aes128Cbc, &key).await.unwrap());
        let tasks: Vec<_> = (0..64u64)
            .map(|t| {
                let s = s.clone();
                tokio::spawn(async move {
                    let mut rng = 0x9e37_79b9_7f4a_7c15 ^ (t + 1);
                    let (mut completed, mut dropped) = (0u32, 0u32);
                    for i in 0..16u64 {
                        let len = 16 * (1 + next(&mut rng) as usize % 128);
                        let plain: Vec<u8> = (0..len).map(|j| (j as u64 ^ i ^ t) as u8).collect();
                        let iv = [(i ^ t) as u8; 16];
                        let mut want = plain.clone();
                        crypto_offload_fallback::Cbc::new(&key)
                            .unwrap()
                            .encrypt(&iv, &mut want)
                            .unwrap();
                        match next(&mut rng) % 3 {
                            0 => {
                                let f = s.encrypt(iv, plain);
                                let mut f = std::pin::pin!(f);
                                let waker = std::task::Waker::noop();
                                let _ = std::future::Future::poll(
                                    f.as_mut(),
                                    &mut std::task::Context::from_waker(waker),
                                );
                                dropped += 1;
                            }
                            1 => {
                                let wait = std::time::Duration::from_micros(next(&mut rng) % 3000);
                                match tokio::time::timeout(wait, s.encrypt(iv, plain)).await {
                                    Err(_) => dropped += 1,
                                    Ok(got) => {
                                        assert!(got.unwrap() == want, "{mechanism:?} {t}/{i}");
                                        completed += 1;
                                    }
                                }
                            }
                            _ => {
                                let got = s.encrypt(iv, plain).await.unwrap();
                                assert!(got == want, "{mechanism:?} {t}/{i}");
                                completed += 1;
                            }
                        }
                    }
                    (completed, dropped)
                })
            })
            .collect();
        let (mut completed, mut dropped) = (0, 0);
        for t in tasks {
            let (c, d) = t.await.unwrap();
            completed += c;
            dropped += d;
        }
        eprintln!("{name} {mechanism:?}: {completed} completed, {dropped} dropped");
        assert!(completed > 0 && dropped > 0);
        let mut want = vec![5u8; 2048];
        crypto_offload_fallback::Cbc::new(&key)
            .unwrap()
            .encrypt(&[6; 16], &mut want)
            .unwrap();
        assert!(s.encrypt([6; 16], vec![5u8; 2048]).await.unwrap() == want);
        let stats = offload
            .backends()
            .into_iter()
            .find(|b| b.name == name)
            .unwrap()
            .stats;
        assert_eq!(
            stats.failures, 0,
            "{name} {mechanism:?}: replayed on the CPU"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_requests_in_flight_through_sessions() {
    let Some(backend) = engine(AfAlgMechanism::default()) else {
        return;
    };
    let name = backend.name().to_owned();
    let offload = Offload::builder()
        .backend(backend)
        .pin(name.clone())
        .build()
        .unwrap();
    let key = [0x24u8; 16];
    let sessions = [
        Arc::new(offload.cipher(CipherAlg::Aes128Cbc, &key).await.unwrap()),
        Arc::new(offload.cipher(CipherAlg::Aes128Cbc, &key).await.unwrap()),
    ];
    let mut tasks = Vec::new();
    for i in 0..64usize {
        let s = sessions[i % 2].clone();
        tasks.push(tokio::spawn(async move {
            let iv = [i as u8; 16];
            let plain = vec![i as u8; 64 * (1 + i % 16)];
            let got = s.encrypt(iv, plain.clone()).await.unwrap();
            let mut want = plain;
            crypto_offload_fallback::Cbc::new(&key)
                .unwrap()
                .encrypt(&iv, &mut want)
                .unwrap();
            assert_eq!(got, want, "request {i}");
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let stats = offload
        .backends()
        .into_iter()
        .find(|b| b.name == name)
        .unwrap()
        .stats;
    assert_eq!((stats.requests, stats.failures), (64, 0), "{name}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_holds_the_engines_runtime_pm_and_its_drop_releases_it() {
    if !in_virtio_guest() {
        return;
    }
    let engine = AfAlgBackend::discover()
        .unwrap()
        .into_iter()
        .find(|e| e.name() == "af-alg:virtio_crypto")
        .expect("the virtio engine");
    let devices = engine.power_devices().to_vec();
    assert!(
        !devices.is_empty(),
        "no power/control for the virtio engine"
    );
    let control = || std::fs::read_to_string(devices[0].join("power/control")).unwrap();
    let offload = Offload::builder()
        .backend(Arc::new(engine))
        .pin("af-alg:virtio_crypto")
        .build()
        .unwrap();
    let stats = || {
        offload
            .backends()
            .into_iter()
            .find(|b| b.name == "af-alg:virtio_crypto")
            .unwrap()
            .power
            .unwrap()
    };
    let s = offload
        .cipher(CipherAlg::Aes128Cbc, &[1; 16])
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    for i in 0..200u128 {
        buf = s.encrypt(i.to_le_bytes(), buf).await.unwrap();
    }
    assert_eq!(control().trim(), "on");
    assert_eq!((stats().resumes, stats().suspends), (1, 0));
    drop(s);
    // Released after the autosuspend delay; how long after depends on
    // the guest's load (500 ms was not enough once in CI): up to 10 s.
    tokio::time::sleep(crypto_offload::af_alg::AUTOSUSPEND_DELAY).await;
    let started = std::time::Instant::now();
    while (control().trim() != "auto" || stats().suspends == 0)
        && started.elapsed() < std::time::Duration::from_secs(10)
    {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(control().trim(), "auto");
    assert_eq!((stats().resumes, stats().suspends), (1, 1));
}
