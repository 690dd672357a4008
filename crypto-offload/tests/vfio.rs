//! The VFIO backend through `Offload` (feature `vfio`).
//!
//! On a host without devices: discovery yields no VFIO backend and says
//! why. In the QEMU guest's `vfio` run (`VMTEST_VFIO_DEVICES` lists the
//! virtio-crypto devices it bound to `vfio-pci`): discovery opens each as
//! its own backend, each passes the known-answer harness with no request
//! replayed on the CPU, and many requests in flight across sessions come
//! back right.
#![cfg(feature = "vfio")]

use std::sync::Arc;

use crypto_offload::{Algorithm, Backend, CipherAlg, Offload, VfioBackend, testing};

fn guest_devices() -> Option<Vec<String>> {
    std::env::var("VMTEST_VFIO_DEVICES")
        .ok()
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
}

/// A VFIO group opens once at a time: tests take turns with the devices.
fn exclusive() -> std::sync::MutexGuard<'static, ()> {
    static DEVICES: std::sync::Mutex<()> = std::sync::Mutex::new(());
    DEVICES.lock().unwrap_or_else(|p| p.into_inner())
}

#[test]
fn discovery_opens_every_device_or_says_why_there_is_none() {
    let _turn = exclusive();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        match (VfioBackend::discover().await, guest_devices()) {
            (Err(why), None) => {
                eprintln!("no VFIO device here ({}): device tests not run", why.0);
                assert!(!why.0.is_empty());
            }
            (Err(why), Some(listed)) => panic!("the guest bound {listed:?} but: {}", why.0),
            (Ok(backends), listed) => {
                let names: Vec<&str> = backends.iter().map(|b| b.name()).collect();
                if let Some(listed) = listed {
                    let want: Vec<String> = listed.iter().map(|a| format!("vfio:{a}")).collect();
                    assert_eq!(names, want);
                }
                for b in &backends {
                    for alg in [
                        CipherAlg::Aes128Cbc,
                        CipherAlg::Aes256Ctr,
                        CipherAlg::Aes256Xts,
                    ] {
                        assert!(b.supports(Algorithm::Cipher(alg)), "{} {alg:?}", b.name());
                    }
                    assert!(!b.supports(Algorithm::Aead(crypto_offload::AeadAlg::Aes128Gcm)));
                }
            }
        }
    });
}

#[test]
fn every_device_passes_the_known_answers_through_offload() {
    let _turn = exclusive();
    if guest_devices().is_none() {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let backends = VfioBackend::discover().await.unwrap();
        for b in backends {
            let name = b.name().to_owned();
            let offload = Offload::builder()
                .backend(Arc::new(b))
                .pin(name.clone())
                .build()
                .unwrap();
            let report = testing::run_vectors(&offload).await;
            report.assert_ok();
            let stats = offload
                .backends()
                .into_iter()
                .find(|s| s.name == name)
                .unwrap()
                .stats;
            eprintln!(
                "{name}: {} vectors passed, {} requests on the device",
                report.passed, stats.requests
            );
            assert!(stats.requests > 0, "{name}: nothing ran on the device");
            assert_eq!(stats.failures, 0, "{name}: requests failed over to the CPU");
        }
    });
}
