//! Completion spreading over VFIO devices: aggregate AES-128-CBC throughput
//! of many clients sending 16 KiB requests, with one virtio-crypto device
//! and with two, in one run (the ratio is what counts) — on the devices
//! alone (clients take turns across the devices' sessions), then through
//! `Offload` under the Throughput policy with the CPU as the third party;
//! and on which worker threads each device's completions were handled. Linux, with devices bound to `vfio-pci` (the
//! QEMU test guest's `vfio` run has two: `cargo xtask vm-test --run vfio`).
//!
//! `cargo run --release -p crypto-offload-benches --bin vfio-spread [SECONDS] [CLIENTS]`

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crypto_offload::backend::Backend;
use crypto_offload::vfio::VfioBackend;
use crypto_offload::{CipherAlg, Offload, Policy};

const SIZE: usize = 16 * 1024;

/// Bytes per second from `clients` tasks sending requests back to back for
/// `time`, client `i` on `sessions[i % sessions.len()]` through `request`.
async fn drive<S, F, Fut>(sessions: &[S], clients: usize, time: Duration, request: F) -> f64
where
    S: Clone + Send + 'static,
    F: Fn(S, Vec<u8>) -> Fut + Copy + Send + 'static,
    Fut: std::future::Future<Output = Vec<u8>> + Send,
{
    let bytes = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|i| {
            let (session, bytes) = (sessions[i % sessions.len()].clone(), bytes.clone());
            tokio::spawn(async move {
                let mut buf = vec![i as u8; SIZE];
                while start.elapsed() < time {
                    buf = request(session.clone(), buf).await;
                    bytes.fetch_add(SIZE as u64, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("a client");
    }
    bytes.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

/// On the devices' own sessions.
async fn run_devices(
    sessions: &[Arc<crypto_offload_vfio::CipherSession>],
    clients: usize,
    time: Duration,
) -> f64 {
    drive(sessions, clients, time, |s, buf| async move {
        s.encrypt(&[0; 16], buf).await.expect("a request")
    })
    .await
}

/// Through `offload`'s selector.
async fn run(offload: &Offload, clients: usize, time: Duration) -> f64 {
    let session = Arc::new(
        offload
            .cipher(CipherAlg::Aes128Cbc, &[7; 16])
            .await
            .expect("a session"),
    );
    drive(&[session], clients, time, |s, buf| async move {
        s.encrypt([0; 16], buf).await.expect("a request")
    })
    .await
}

fn main() {
    let mut args = std::env::args().skip(1);
    let secs: f64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(3.0);
    let clients: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(32);
    let time = Duration::from_secs_f64(secs);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let devices = match VfioBackend::discover().await {
            Ok(d) if d.len() >= 2 => d,
            Ok(d) => {
                eprintln!("vfio-spread needs two devices; {} found", d.len());
                std::process::exit(1);
            }
            Err(why) => {
                eprintln!("no VFIO devices: {}", why.0);
                std::process::exit(1);
            }
        };
        let devices: Vec<Arc<VfioBackend>> = devices.into_iter().map(Arc::new).collect();
        println!(
            "AES-128-CBC encrypt, {SIZE}-byte requests, {clients} clients, {secs} s a configuration"
        );
        // The devices alone: sessions on the driver's own handle of each
        // backend's device (a VFIO group opens once, so not a second one).
        let mut sessions = Vec::new();
        for d in &devices {
            d.driver_device().resume().expect("device up");
            let s = d
                .driver_device()
                .cipher_session(crypto_offload_vfio::CipherAlgo::AesCbc, &[7; 16])
                .await
                .expect("a session");
            sessions.push(Arc::new(s));
        }
        let one = run_devices(&sessions[..1], clients, time).await;
        let two = run_devices(&sessions, clients, time).await;
        println!("devices alone, 1 device: {:8.2} MB/s", one / 1e6);
        println!("devices alone, 2 devices: {:7.2} MB/s", two / 1e6);
        println!("devices alone, two / one: {:.2}x", two / one);
        drop(sessions);
        println!("through Offload, Throughput policy (the CPU is a backend too):");
        let mut results = Vec::new();
        for n in [1usize, 2] {
            let mut b = Offload::builder().policy(Policy::Throughput);
            for d in &devices[..n] {
                b = b.backend(d.clone());
            }
            let offload = b.build().expect("an Offload");
            offload.calibrate().await.expect("calibration");
            // What the selector predicts for one request of this size with
            // nothing in flight: the engines' latency and the CPU time they
            // take here, against the CPU's own.
            print!(
                "{}",
                offload.explain(
                    CipherAlg::Aes128Cbc,
                    crypto_offload::Direction::Encrypt,
                    SIZE
                )
            );
            let rate = run(&offload, clients, time).await;
            let served: Vec<String> = offload
                .backends()
                .into_iter()
                .map(|b| format!("{} {}", b.name, b.stats.requests))
                .collect();
            println!(
                "{n} device(s): {:8.2} MB/s   requests: {}",
                rate / 1e6,
                served.join(", ")
            );
            results.push(rate);
        }
        println!(
            "through Offload, two devices / one: {:.2}x",
            results[1] / results[0]
        );
        for d in &devices {
            let threads: Vec<String> = d
                .driver_device()
                .completion_threads()
                .into_iter()
                .map(|(t, n)| format!("{t}: {n}"))
                .collect();
            println!(
                "{} completions handled on: {}",
                d.name(),
                threads.join(", ")
            );
        }
    });
}
