//! The simulated engine's own model, on tokio's paused clock where the
//! check is about behaviour (transitions, parked buffers), so the numbers
//! are exact and the tests instant: power held per session or per request
//! (the OMAP scenario), requests dropped mid-flight keeping their slot,
//! power and buffer until the device is done, EIP-197's rings in parallel,
//! settings out of range. Each runs through an `Offload` pinned to the
//! engine, as a user's requests would. How the selector uses the engine is
//! tested in `crypto-offload/tests/offload/scenarios.rs`.

use std::sync::Arc;
use std::time::Duration;

use crypto_offload::{Algorithm, CipherAlg, CrcAlg, Offload};
use crypto_offload_sim::{SimConfig, SimEngine, SimTimer};

/// A request buffer whose release can be watched: a `BytesMut` sharing its
/// allocation with a one-byte `Bytes` kept by the test (the two halves of
/// one `split_to` share one reference-counted allocation), so the kept half
/// is unique exactly when the request's half is gone. As
/// `crypto-offload/tests/common::tracked`.
fn tracked(data: &[u8]) -> (bytes::BytesMut, bytes::Bytes) {
    let mut whole = bytes::BytesMut::with_capacity(data.len() + 1);
    whole.extend_from_slice(&[0]);
    whole.extend_from_slice(data);
    let kept = whole.split_to(1).freeze();
    (whole, kept)
}

/// A preset on tokio timers, for the paused clock.
fn preset(name: &str) -> SimConfig {
    let mut c = SimConfig::preset(name).unwrap();
    c.timer = SimTimer::Tokio;
    c
}

fn key(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(7).wrapping_add(1))
        .collect()
}

const MB20: usize = 20 << 20;
const BLOCK: usize = 4096;

/// Streams 20 MB in 4 KiB requests through one session pinned to `sim`;
/// returns the virtual time it took.
async fn omap_stream(sim: Arc<SimEngine>) -> Duration {
    let offload = Offload::builder()
        .backend(sim.clone())
        .pin("sim:omap")
        .build()
        .unwrap();
    let s = offload
        .cipher(CipherAlg::Aes128Cbc, &key(16))
        .await
        .unwrap();
    let start = tokio::time::Instant::now();
    let mut buf = vec![0u8; BLOCK];
    for i in 0..MB20 / BLOCK {
        buf = s.encrypt((i as u128).to_be_bytes(), buf).await.unwrap();
    }
    start.elapsed()
}

fn omap(per_request: bool) -> Arc<SimEngine> {
    let mut c = preset("omap");
    // Real CPU spins do not advance the paused clock; leave them out here.
    c.submit_cpu = Duration::ZERO;
    c.completion_cpu = Duration::ZERO;
    if let Some(p) = &mut c.power {
        p.per_request = per_request;
    }
    Arc::new(SimEngine::new(c))
}

#[tokio::test(start_paused = true)]
async fn omap_power_follows_the_session_not_the_request() {
    let per_session = omap(false);
    let t_session = omap_stream(per_session.clone()).await;
    let power = per_session.as_ref().power_stats();
    assert_eq!(
        (power.resumes, power.suspends),
        (1, 0),
        "one resume for 5,120 requests"
    );
    tokio::time::sleep(Duration::from_secs(2)).await; // the session is gone: autosuspend
    assert_eq!(per_session.power_stats().suspends, 1);

    let per_request = omap(true);
    let t_request = omap_stream(per_request.clone()).await;
    let power = per_request.power_stats();
    assert_eq!(
        (power.resumes, power.suspends),
        (5120, 5120),
        "a transition pair per request"
    );

    // 4 KiB at 45 MiB/s + 40 µs = 126.8 µs a request, plus a 120 µs resume:
    // per-request power costs ~95% more time (the paused clock rounds each
    // timer up to the millisecond, so compare ratios, not absolutes).
    let ratio = t_request.as_secs_f64() / t_session.as_secs_f64();
    assert!(
        ratio > 1.5,
        "per-request power cycling should cost: {ratio:.2}x"
    );
}

trait PowerStatsExt {
    fn power_stats(&self) -> crypto_offload::PowerStats;
}

impl PowerStatsExt for SimEngine {
    fn power_stats(&self) -> crypto_offload::PowerStats {
        use crypto_offload::backend::Backend;
        self.power().map(|p| p.stats()).unwrap_or_default()
    }
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_request_keeps_the_device_powered_until_it_completes() {
    let sim = omap(false);
    let offload = Offload::builder()
        .backend(sim.clone())
        .pin("sim:omap")
        .build()
        .unwrap();
    let s = offload
        .cipher(CipherAlg::Aes128Ctr, &key(16))
        .await
        .unwrap();
    {
        let request = s.encrypt([0; 16], vec![0u8; 1 << 20]); // ~22 ms on the device
        let _ = tokio::time::timeout(Duration::from_millis(1), request).await;
    } // the request future is dropped mid-flight
    drop(s);
    tokio::time::sleep(Duration::from_millis(5)).await;
    let p = sim.power_stats();
    assert!(
        p.powered && p.references == 1,
        "the in-flight request holds power: {p:?}"
    );
    tokio::time::sleep(Duration::from_millis(30)).await; // the device finishes
    assert_eq!(sim.power_stats().references, 0);
    assert!(sim.power_stats().powered, "then the autosuspend delay runs");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!sim.power_stats().powered);
    assert_eq!(sim.power_stats().resumes, 1);
}

/// An engine with `latency`, pinned, and an AES-128-CTR session on it.
async fn ctr_on(
    timer: SimTimer,
    latency: Duration,
) -> (Arc<SimEngine>, crypto_offload::CipherSession) {
    let mut c = SimConfig::new(
        "sim",
        vec![Algorithm::Cipher(CipherAlg::Aes128Ctr)],
        latency,
        1e12,
    );
    c.timer = timer;
    let sim = Arc::new(SimEngine::new(c));
    let offload = Offload::builder()
        .backend(sim.clone())
        .pin("sim")
        .build()
        .unwrap();
    let s = offload
        .cipher(CipherAlg::Aes128Ctr, &key(16))
        .await
        .unwrap();
    (sim, s)
}

/// A dropped request's buffer stays with the device until the modelled
/// completion, as a DMA engine's must (freeing it earlier is what lets a
/// device write into reused memory), and so does its queue slot; then both
/// are given back. Here on tokio timers; below on the device threads.
#[tokio::test(start_paused = true)]
async fn a_cancelled_request_parks_its_buffer_until_the_device_completes() {
    let (sim, s) = ctr_on(SimTimer::Tokio, Duration::from_millis(10)).await;
    let start = tokio::time::Instant::now();
    let (buf, kept) = tracked(&[7u8; 4096]);
    let request = s.encrypt([0; 16], buf);
    assert!(
        tokio::time::timeout(Duration::from_millis(1), request)
            .await
            .is_err()
    );
    assert!(!kept.is_unique(), "the buffer was freed under the device");
    assert_eq!(sim.in_flight(), 1);
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert!(!kept.is_unique(), "freed before the completion");
    sim.idle().await;
    assert!(start.elapsed() >= Duration::from_millis(10));
    assert!(kept.is_unique(), "the buffer was never freed");
    assert_eq!(sim.in_flight(), 0);
    // The session goes on.
    let (buf, _) = tracked(&[7u8; 64]);
    assert_eq!(s.encrypt([0; 16], buf).await.unwrap().len(), 64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_request_parks_its_buffer_on_the_device_thread_too() {
    // 200 ms of modelled latency against a 1 ms deadline: the checks right
    // after the drop have that much margin on a loaded machine.
    let (sim, s) = ctr_on(SimTimer::Device, Duration::from_millis(200)).await;
    let (buf, kept) = tracked(&[7u8; 4096]);
    let request = s.encrypt([0; 16], buf);
    assert!(
        tokio::time::timeout(Duration::from_millis(1), request)
            .await
            .is_err()
    );
    assert!(!kept.is_unique(), "the buffer was freed under the device");
    assert_eq!(sim.in_flight(), 1);
    sim.idle().await;
    assert!(kept.is_unique(), "the buffer was never freed");
    assert_eq!(sim.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn eip197_rings_serve_in_parallel() {
    // Four rings finish 64 concurrent requests in a quarter of one ring's time.
    let mut one = preset("eip197");
    one.queues = 1;
    one.completion_cpu = Duration::ZERO;
    one.submit_cpu = Duration::ZERO;
    let mut four = one.clone();
    four.queues = 4;
    let mut times = Vec::new();
    for config in [one, four] {
        let offload = Offload::builder()
            .backend(Arc::new(SimEngine::new(config)))
            .pin("sim:eip197")
            .build()
            .unwrap();
        let g = Arc::new(
            offload
                .aead(crypto_offload::AeadAlg::Aes128Gcm, &key(16))
                .await
                .unwrap(),
        );
        let start = tokio::time::Instant::now();
        let mut tasks = Vec::new();
        for i in 0..64u8 {
            let g = g.clone();
            tasks.push(tokio::spawn(async move {
                g.seal([i; 12], b"", vec![i; 1 << 20]).await.unwrap()
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        times.push(start.elapsed().as_secs_f64());
    }
    let speedup = times[0] / times[1];
    assert!((3.5..4.5).contains(&speedup), "{speedup:.2}x");
}

#[tokio::test(start_paused = true)]
async fn short_sessions_within_the_autosuspend_delay_resume_once() {
    let sim = omap(false);
    let offload = Offload::builder()
        .backend(sim.clone())
        .pin("sim:omap")
        .build()
        .unwrap();
    for i in 0..50u128 {
        let s = offload
            .cipher(CipherAlg::Aes128Cbc, &key(16))
            .await
            .unwrap();
        s.encrypt(i.to_be_bytes(), vec![0u8; 4096]).await.unwrap();
        drop(s);
        tokio::time::sleep(Duration::from_millis(100)).await; // < the 1 s delay
    }
    let p = sim.power_stats();
    assert_eq!((p.resumes, p.suspends), (1, 0), "{p:?}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(sim.power_stats().suspends, 1);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_request_keeps_per_request_power_until_it_completes() {
    let sim = omap(true);
    let offload = Offload::builder()
        .backend(sim.clone())
        .pin("sim:omap")
        .build()
        .unwrap();
    let s = offload
        .cipher(CipherAlg::Aes128Ctr, &key(16))
        .await
        .unwrap();
    {
        let request = s.encrypt([0; 16], vec![0u8; 1 << 20]); // ~22 ms on the device
        let _ = tokio::time::timeout(Duration::from_millis(2), request).await;
    }
    tokio::time::sleep(Duration::from_millis(5)).await;
    let p = sim.power_stats();
    assert!(p.powered && p.suspends == 0, "cut under the DMA: {p:?}");
    tokio::time::sleep(Duration::from_millis(40)).await; // the device finishes
    let p = sim.power_stats();
    assert_eq!(
        (p.powered, p.suspends, p.references),
        (false, 1, 0),
        "{p:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn out_of_range_settings_do_not_panic() {
    let mut c = SimConfig::new(
        "sim",
        vec![Algorithm::Crc(CrcAlg::Crc32Iscsi)],
        Duration::MAX,
        f64::NAN,
    );
    c.timer = SimTimer::Tokio;
    c.queues = 0;
    c.queue_depth = usize::MAX;
    c.faults.timeout = Duration::MAX;
    assert_eq!(c.service_time(usize::MAX), Duration::from_secs(365 * 86400));
    let sim = Arc::new(SimEngine::new(c));
    let offload = Offload::builder().backend(sim).pin("sim").build().unwrap();
    let mut crc = offload.crc(CrcAlg::Crc32Iscsi).await.unwrap();
    let request = crc.update(vec![1u8; 64]);
    // A year of modelled latency: the request is pending, not a panic.
    assert!(
        tokio::time::timeout(Duration::from_secs(1), request)
            .await
            .is_err()
    );
}
