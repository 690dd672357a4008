//! The VFIO backend through `Offload` on the driver's emulated
//! virtio-crypto device (`crypto_offload_vfio::emulated_device`: a thread
//! that plays the device over plain memory), on any host: many tasks'
//! requests on `Vec`s and on `Offload::buffer`s, more in flight than the
//! ring holds, come back as the CPU computes them, buffers on the device
//! path in place. The real device is the guest's (`tests/vfio.rs`).
//!
//! Also the host's measurement of what `Offload` adds to the driver's
//! per-request path, side by side in one run (ignored: a measurement):
//! `cargo test --release -p crypto-offload --test offload --
//! --ignored --nocapture vfio_emulated::`.
#![cfg(all(feature = "vfio", target_os = "linux"))]

use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crypto_offload::backend::Backend;
use crypto_offload::vfio::VfioBackend;
use crypto_offload::{CipherAlg, DeviceBuf, Offload};
use crypto_offload_vfio::{CipherAlgo, EmulatedControl, emulated_device};

const KEY: [u8; 16] = [0x2b; 16];
const IV: [u8; 16] = [0x0f; 16];

/// RustCrypto's `cbc` directly: not the fallback crate, which the
/// emulated device computes with.
fn reference_cbc(data: &[u8]) -> Vec<u8> {
    use cipher::{BlockModeEncrypt, KeyIvInit};
    let mut out = data.to_vec();
    let (blocks, rest) = out.as_chunks_mut::<16>();
    assert!(rest.is_empty());
    let blocks = cipher::array::Array::cast_slice_from_core_mut(blocks);
    cbc::Encryptor::<aes::Aes128>::new_from_slices(&KEY, &IV)
        .unwrap()
        .encrypt_blocks(blocks);
    out
}

/// A current-thread runtime and a local set: the device's tasks and the
/// callers share one thread, as in the guest's measurement.
fn local<F: std::future::Future>(f: F) -> F::Output {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tokio::task::LocalSet::new().block_on(&rt, f)
}

async fn backend() -> (Arc<VfioBackend>, EmulatedControl) {
    let (dev, control) = emulated_device().expect("the emulated device comes up");
    let backend = VfioBackend::from_device("emulated", dev)
        .await
        .expect("a backend on it");
    (Arc::new(backend), control)
}

fn pinned(backend: &Arc<VfioBackend>) -> Offload {
    Offload::builder()
        .backend(backend.clone())
        .pin(backend.name())
        .build()
        .unwrap()
}

#[test]
fn many_tasks_on_vecs_and_device_buffers_fill_the_ring_then_all_complete() {
    local(async {
        let (backend, control) = backend().await;
        let name = backend.name().to_owned();
        let offload = pinned(&backend);
        let session = Rc::new(offload.cipher(CipherAlg::Aes128Cbc, &KEY).await.unwrap());
        let idle_units = backend.dma_units_in_use();
        // The device takes requests but answers none: 1,500 at once, more
        // than the 1,024-entry ring, so the last wait for room.
        control.hang(true);
        let tasks: Vec<_> = (0..1500usize)
            .map(|i| {
                let session = session.clone();
                let len = 16 * (1 + i % 4);
                let data: Vec<u8> = (0..len).map(|b| (b ^ i) as u8).collect();
                let mut buf = if i % 2 == 0 {
                    offload.buffer(len)
                } else {
                    DeviceBuf::from(vec![0; len])
                };
                let on_device = buf.is_device_memory();
                buf.copy_from_slice(&data);
                tokio::task::spawn_local(async move {
                    let out = session.encrypt(IV, buf).await.unwrap();
                    (data, on_device, out)
                })
            })
            .collect();
        let filled = Instant::now();
        while backend.queue_full_count() == 0 && filled.elapsed() < Duration::from_secs(1) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let (in_flight, waits) = (backend.in_flight(), backend.queue_full_count());
        // Released well within the requests' 2 s timeout.
        control.hang(false);
        assert!(waits > 0, "the ring never filled ({in_flight} in flight)");
        assert!(
            in_flight >= 1024,
            "{in_flight} in flight with the ring full"
        );
        let mut lent = 0;
        for t in tasks {
            let (data, on_device, out) = t.await.unwrap();
            assert_eq!(out.to_vec(), reference_cbc(&data));
            assert_eq!(
                out.is_device_memory(),
                on_device,
                "a buffer comes back as it went"
            );
            lent += usize::from(on_device);
        }
        assert!(lent > 0, "no request went on the device's own memory");
        let stats = offload
            .backends()
            .into_iter()
            .find(|b| b.name == name)
            .unwrap()
            .stats;
        assert_eq!(stats.failures, 0, "requests failed over to the CPU");
        assert!(stats.requests >= 1500, "{}", stats.requests);
        assert_eq!(backend.in_flight(), 0);
        assert_eq!(backend.dma_units_in_use(), idle_units, "DMA units leaked");
    });
}

/// Ops/s and this thread's CPU per request of 64 tasks (`TASKS=n`) each
/// awaiting `request` on its own buffer, 20,000 each (`EACH=n`, e.g. fewer
/// under `valgrind --tool=callgrind`).
async fn rate<B: 'static, F, Fut>(make: impl Fn() -> B, request: F) -> (f64, f64)
where
    F: Fn(B) -> Fut + Clone + 'static,
    Fut: std::future::Future<Output = B> + 'static,
{
    let tasks: usize = std::env::var("TASKS")
        .ok()
        .and_then(|e| e.parse().ok())
        .unwrap_or(64);
    let each: usize = std::env::var("EACH")
        .ok()
        .and_then(|e| e.parse().ok())
        .unwrap_or(20_000);
    let (start, cpu) = (Instant::now(), cpu_time::ThreadTime::now());
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let mut buf = make();
            let request = request.clone();
            tokio::task::spawn_local(async move {
                for _ in 0..each {
                    buf = request(buf).await;
                }
            })
        })
        .collect();
    for t in handles {
        t.await.unwrap();
    }
    let n = (tasks * each) as f64;
    (
        n / start.elapsed().as_secs_f64(),
        cpu.elapsed().as_secs_f64() * 1e9 / n,
    )
}

#[test]
#[ignore = "a measurement: cargo test --release -p crypto-offload --test offload -- --ignored --nocapture vfio_emulated::"]
fn offload_over_the_drivers_own_path() {
    local(async {
        let (backend, _control) = backend().await;
        let dev = backend.driver_device().clone();
        dev.resume().unwrap();
        let drv = Rc::new(dev.cipher_session(CipherAlgo::AesCbc, &KEY).await.unwrap());
        let offload = pinned(&backend);
        let s = Rc::new(offload.cipher(CipherAlg::Aes128Cbc, &KEY).await.unwrap());
        println!("64 B AES-128-CBC, emulated device: ops/s, ns of this thread a request");
        let rounds = if std::env::var_os("EACH").is_some() {
            1
        } else {
            3
        };
        for round in 0..rounds {
            let d = drv.clone();
            let drv_vec = rate(
                || vec![0u8; 64],
                move |b| {
                    let d = d.clone();
                    async move { d.encrypt(&IV, b).await.unwrap() }
                },
            )
            .await;
            let d = drv.clone();
            let drv_buf = rate(
                || dev.try_buffer(64).unwrap().unwrap(),
                move |b| {
                    let d = d.clone();
                    async move { d.encrypt_buffer(&IV, b).await.unwrap() }
                },
            )
            .await;
            let o = s.clone();
            let off_vec = rate(
                || DeviceBuf::from(vec![0u8; 64]),
                move |b| {
                    let o = o.clone();
                    async move { o.encrypt(IV, b).await.unwrap() }
                },
            )
            .await;
            let o = s.clone();
            let off_buf = rate(
                || offload.buffer(64),
                move |b| {
                    let o = o.clone();
                    async move { o.encrypt(IV, b).await.unwrap() }
                },
            )
            .await;
            println!(
                "round {round}: driver Vec {:.0} {:.0} ns, driver buffer {:.0} {:.0} ns, \
                 Offload Vec {:.0} {:.0} ns, Offload buffer {:.0} {:.0} ns \
                 (Offload buffer over driver buffer: +{:.0} ns)",
                drv_vec.0,
                drv_vec.1,
                drv_buf.0,
                drv_buf.1,
                off_vec.0,
                off_vec.1,
                off_buf.0,
                off_buf.1,
                off_buf.1 - drv_buf.1
            );
        }
    });
}
