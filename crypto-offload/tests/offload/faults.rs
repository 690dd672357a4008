//! 100,000 requests under Auto against simulated engines that fail: I/O
//! errors, requests that hang until the engine's deadline, completions far
//! slower than the engine's profile, a device that vanishes for a while and
//! one that vanishes for good. On tokio's paused clock (the engines' time is
//! virtual, so the run takes seconds of real time and the breaker's timeline
//! is exact).
//!
//! Checked: no request is lost and none is corrupted (every result against
//! the CPU's); every request an engine failed was completed on the CPU (the
//! CPU's `replayed` equals the engines' `failures`, and every request is
//! counted once); and the circuit breaker behaves as `breaker.rs` documents,
//! watched through `Offload::backends()` every millisecond: a failure opens
//! it with the error as the reason, no request is sent to an engine while it
//! is open (beyond those already in flight), a probe closes it one probe
//! interval later when the engine works again, and a device gone for good
//! stays out. The probes' back-off (doubling while they fail, up to 32
//! intervals) is timed on its own in `probes_back_off_doubling_up_to_32_intervals`.
//!
//! The figures are in `docs/benchmarks.md`, section 3 (`--nocapture` prints
//! them).

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use crypto_offload::{
    AeadAlg, AeadSession, Algorithm, CipherAlg, CipherSession, Direction, Offload, Policy, Profile,
};
use crypto_offload_sim::{SimConfig, SimEngine, SimFaults, SimTimer};
use tokio::time::Instant;

const REQUESTS: usize = 100_000;
/// Requests in flight at once.
const WORKERS: usize = 128;
const PROBE: Duration = Duration::from_millis(10);

fn key(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13) ^ 0xa5)
        .collect()
}

/// An engine for the algorithms under test, on tokio timers.
fn engine(
    name: &str,
    latency: Duration,
    queues: usize,
    depth: usize,
    faults: SimFaults,
) -> SimConfig {
    let mut c = SimConfig::new(
        name,
        vec![
            Algorithm::Cipher(CipherAlg::Aes128Ctr),
            Algorithm::Cipher(CipherAlg::Aes256Xts),
            Algorithm::Aead(AeadAlg::Aes128Gcm),
        ],
        latency,
        4e9,
    );
    c.timer = SimTimer::Tokio;
    c.queues = queues;
    c.queue_depth = depth;
    c.faults = faults;
    c
}

fn faults(error_rate: f64, timeout_rate: f64, gone_after: Option<u64>, seed: u64) -> SimFaults {
    SimFaults {
        error_rate,
        timeout_rate,
        timeout: Duration::from_millis(50),
        gone_after,
        seed,
    }
}

/// Every engine profiled at 1 ms a request and the CPU at 100 s, so that
/// Auto keeps sending the engines all it can: the CPU's online correction
/// (at most 20x down) leaves it at 5 s, which no engine's predicted queue
/// reaches here. The CPU serves what no engine can take (every breaker
/// open) and the replays. With a CPU profiled nearer the truth, the paused
/// clock would end the run early: there the CPU's work takes no time, so
/// once the CPU looked cheaper than the engines' queues, the workers would
/// run every remaining request on it in one virtual instant, no engine
/// completing meanwhile to make its queue look shorter (measured: 74% of
/// the requests on the CPU, all in one instant, with the CPU at 1 s).
fn profile(engines: &[Arc<SimEngine>]) -> Profile {
    let engines: Vec<&SimEngine> = engines.iter().map(|e| &**e).collect();
    common::profile(&engines, 1e6, 1e11)
}

struct Sessions {
    ctr: CipherSession,
    xts: CipherSession,
    gcm: AeadSession,
}

impl Sessions {
    async fn open(offload: &Offload) -> Sessions {
        Sessions {
            ctr: offload
                .cipher(CipherAlg::Aes128Ctr, &key(16))
                .await
                .unwrap(),
            xts: offload
                .cipher(CipherAlg::Aes256Xts, &key(64))
                .await
                .unwrap(),
            gcm: offload.aead(AeadAlg::Aes128Gcm, &key(16)).await.unwrap(),
        }
    }
}

/// Request `n` on `s` and on the CPU-only `reference`: what each returned.
/// Its kind, IV and data follow from `n`.
async fn request(s: &Sessions, reference: &Sessions, n: usize, pool: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let len = 16 + (n * 7919) % 4080;
    let at = (n * 104_729) % (pool.len() - len);
    let data = pool[at..at + len].to_vec();
    let iv = (n as u128).to_le_bytes();
    let (nonce, aad) = iv.split_at(12);
    match n % 5 {
        0 => (
            s.ctr.encrypt(iv, data.clone()).await.unwrap(),
            reference.ctr.encrypt(iv, data).await.unwrap(),
        ),
        1 => (
            s.ctr.decrypt(iv, data.clone()).await.unwrap(),
            reference.ctr.decrypt(iv, data).await.unwrap(),
        ),
        2 => (
            s.xts.encrypt(iv, data.clone()).await.unwrap(),
            reference.xts.encrypt(iv, data).await.unwrap(),
        ),
        3 => (
            s.gcm.seal(nonce, aad, data.clone()).await.unwrap(),
            reference.gcm.seal(nonce, aad, data).await.unwrap(),
        ),
        _ => {
            let sealed = reference.gcm.seal(nonce, aad, data.clone()).await.unwrap();
            (s.gcm.open(nonce, aad, sealed).await.unwrap(), data)
        }
    }
}

/// One backend's breaker as one sample saw it.
#[derive(Debug, Clone)]
struct Seen {
    at: Duration,
    open: Option<String>,
    opened: u64,
    closed: u64,
    /// Requests it has been given (served and failed).
    given: u64,
    in_flight: usize,
}

const EIO: usize = 0;
const HANG: usize = 1;
const SLOW: usize = 2;
const FLAP: usize = 3;
const UNPLUGGED: usize = 4;

#[tokio::test(start_paused = true)]
async fn a_hundred_thousand_requests_against_failing_engines_lose_nothing() {
    let wall = std::time::Instant::now();
    let ms = Duration::from_millis;
    let engines: Vec<Arc<SimEngine>> = [
        // 2% of requests fail with EIO.
        engine("sim:eio", ms(1), 4, 8, faults(0.02, 0.0, None, 11)),
        // 1% hang until the engine's 50 ms deadline, then time out.
        engine("sim:hang", ms(1), 4, 8, faults(0.0, 0.01, None, 12)),
        // Every completion 20x later than its profile says.
        engine("sim:slow", ms(20), 2, 8, faults(0.0, 0.0, None, 13)),
        // Unplugged from 25% to 50% of the run (`set_gone` below).
        engine("sim:flap", ms(1), 4, 8, faults(0.0, 0.0, None, 14)),
        // Gone for good after its 2,000th request.
        engine(
            "sim:unplugged",
            ms(1),
            4,
            8,
            faults(0.0, 0.0, Some(2_000), 15),
        ),
    ]
    .into_iter()
    .map(|c| Arc::new(SimEngine::new(c)))
    .collect();
    let mut builder = Offload::builder()
        .policy(Policy::Latency)
        .profile(profile(&engines))
        .probe_interval(PROBE);
    for e in &engines {
        builder = builder.backend(e.clone());
    }
    let offload = builder.build().unwrap();
    let cpu = Offload::builder().build().unwrap();
    let start = Instant::now();
    let rss_before = common::peak_rss_kib();

    // The breakers' timeline, sampled every millisecond of virtual time
    // until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let watch = {
        let (offload, stop) = (offload.clone(), stop.clone());
        tokio::spawn(async move {
            let mut timeline: Vec<Vec<Seen>> = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let flight = offload.explain(CipherAlg::Aes128Ctr, Direction::Encrypt, 1);
                let seen = offload.backends()[1..]
                    .iter()
                    .zip(&flight.candidates[1..])
                    .map(|(b, c)| Seen {
                        at: start.elapsed(),
                        open: b.unavailable.clone(),
                        opened: b.stats.breaker_opened,
                        closed: b.stats.breaker_closed,
                        given: b.stats.requests + b.stats.failures,
                        in_flight: c.in_flight,
                    })
                    .collect();
                timeline.push(seen);
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            timeline
        })
    };

    // The flapping engine goes at request 25,000 and comes back at 50,000:
    // when, in virtual time (µs).
    let flap_at = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let next = Arc::new(AtomicUsize::new(0));
    let sessions = Arc::new(Sessions::open(&offload).await);
    let reference = Arc::new(Sessions::open(&cpu).await);
    let pool: Arc<Vec<u8>> = Arc::new((0..8192u32).map(|i| (i * 7 + i / 251) as u8).collect());
    let mut workers = Vec::new();
    for _ in 0..WORKERS {
        let (next, flap, flap_at) = (next.clone(), engines[FLAP].clone(), flap_at.clone());
        let (s, r, pool) = (sessions.clone(), reference.clone(), pool.clone());
        workers.push(tokio::spawn(async move {
            let mut wrong = Vec::new();
            let mut done = 0usize;
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= REQUESTS {
                    return (done, wrong);
                }
                for (i, at) in [REQUESTS / 4, REQUESTS / 2].into_iter().enumerate() {
                    if n == at {
                        flap.set_gone(i == 0);
                        flap_at[i].store(start.elapsed().as_micros() as u64, Ordering::Relaxed);
                    }
                }
                let (got, want) = request(&s, &r, n, &pool).await;
                if got != want {
                    wrong.push(n);
                }
                done += 1;
            }
        }));
    }
    // No deadlock: the whole run within a (virtual) hour.
    let all = futures::future::join_all(workers);
    let results = tokio::time::timeout(Duration::from_secs(3600), all)
        .await
        .expect("the requests did not all complete");
    let mut completed = 0;
    let mut wrong = Vec::new();
    for r in results {
        let (done, bad) = r.unwrap();
        completed += done;
        wrong.extend(bad);
    }
    let traffic = start.elapsed();
    // Let every breaker that can close do so: the longest probe wait is 32
    // intervals, and a probe that hangs takes the 50 ms deadline.
    tokio::time::sleep(PROBE * 64 + Duration::from_millis(100)).await;
    stop.store(true, Ordering::Relaxed);
    let timeline = watch.await.unwrap();
    let rss_after = common::peak_rss_kib();
    let b = offload.backends();

    eprintln!(
        "{REQUESTS} requests, {WORKERS} at a time: wall {:.2?}, virtual {traffic:.2?}; \
         peak RSS {rss_before} -> {rss_after} KiB",
        wall.elapsed()
    );
    for x in &b {
        eprintln!(
            "  {:<14} served {:>6}  failed {:>4}  replayed {:>4}  breaker opened {:>3} closed {:>3}  now {:?}",
            x.name,
            x.stats.requests,
            x.stats.failures,
            x.stats.replayed,
            x.stats.breaker_opened,
            x.stats.breaker_closed,
            x.unavailable
        );
    }

    // Nothing lost, nothing corrupted.
    assert_eq!(completed, REQUESTS);
    assert!(
        wrong.is_empty(),
        "{} wrong results, the first {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(10)]
    );
    // The breakers, as documented.
    let reasons = ["sim request failed", "timed out", "", "gone", "gone"];
    let series = |i: usize| timeline.iter().map(move |t| &t[i]);
    for (i, reason) in reasons.iter().enumerate() {
        let name = &b[1 + i].name;
        let mut prev: Option<&Seen> = None;
        for s in series(i) {
            // Open with the error that opened it.
            if let Some(why) = &s.open {
                assert!(
                    why.starts_with("circuit open") && why.contains(reason),
                    "{name}: {why}"
                );
            }
            if let Some(p) = prev {
                // No request given to an engine whose breaker stayed open
                // from one sample to the next, but those already in flight.
                let stayed_open = p.open.is_some()
                    && s.open.is_some()
                    && (p.opened, p.closed) == (s.opened, s.closed);
                if stayed_open {
                    assert!(
                        s.given - p.given <= p.in_flight as u64,
                        "{name}: given {} requests while open at {:?}",
                        s.given - p.given,
                        s.at
                    );
                }
                // A breaker closes only after a probe interval: from the
                // last sample that had not seen it open to the first that
                // sees it closed again.
                if s.closed > p.closed {
                    let opened_after = series(i)
                        .take_while(|x| x.opened < s.closed)
                        .last()
                        .map_or(Duration::ZERO, |x| x.at);
                    assert!(
                        s.at - opened_after >= PROBE,
                        "{name}: closed {:?} after opening",
                        s.at - opened_after
                    );
                }
            }
            prev = Some(s);
        }
    }
    // Every request counted once, where it completed: inline on the CPU, on
    // an engine, or failed there and replayed on the CPU.
    let engine_failures: u64 = b[1..].iter().map(|x| x.stats.failures).sum();
    let given: u64 = b[1..]
        .iter()
        .map(|x| x.stats.requests + x.stats.failures)
        .sum();
    assert_eq!(
        b[0].stats.replayed, engine_failures,
        "every failure replayed on the CPU"
    );
    assert_eq!(b[0].stats.requests + given, REQUESTS as u64);
    for i in [EIO, HANG, FLAP, UNPLUGGED] {
        assert!(
            b[1 + i].stats.failures > 0,
            "{}: no faults were hit",
            b[1 + i].name
        );
    }
    assert!(
        b[1..].iter().all(|x| x.stats.requests > 0),
        "every engine served: {b:#?}"
    );
    // A slow engine is slow, not failing.
    assert_eq!(b[1 + SLOW].stats.failures, 0);
    assert_eq!(b[1 + SLOW].stats.breaker_opened, 0);

    // Failing engines tripped and, working again, were closed by probes.
    for i in [EIO, HANG, FLAP] {
        let x = &b[1 + i];
        assert!(x.stats.breaker_opened >= 1, "{}", x.name);
        assert_eq!(x.stats.breaker_opened, x.stats.breaker_closed, "{}", x.name);
        assert!(x.unavailable.is_none(), "{}: {:?}", x.name, x.unavailable);
    }
    // The one gone for good stays out, saying why.
    let x = &b[1 + UNPLUGGED];
    assert_eq!((x.stats.breaker_opened, x.stats.breaker_closed), (1, 0));
    assert!(x.unavailable.as_deref().is_some_and(|w| w.contains("gone")));

    // The flapping engine: open the whole time it was gone (from the first
    // request after it went), one episode, and closed within the longest
    // probe wait (32 intervals) of its return, plus the probe and a sample.
    let (gone, back) = (
        Duration::from_micros(flap_at[0].load(Ordering::Relaxed)),
        Duration::from_micros(flap_at[1].load(Ordering::Relaxed)),
    );
    let tripped = series(FLAP)
        .find(|s| s.open.is_some())
        .expect("the flapping engine's breaker opened");
    assert!(tripped.at >= gone, "opened before the engine went");
    assert!(
        series(FLAP)
            .filter(|s| s.at >= tripped.at && s.at <= back)
            .all(|s| s.open.is_some()),
        "closed while the engine was gone"
    );
    let closed = series(FLAP)
        .find(|s| s.at > back && s.open.is_none())
        .expect("the flapping engine's breaker closed");
    eprintln!(
        "  sim:flap gone at {gone:.1?}, breaker open at {:.1?}, back at {back:.1?}, closed at {:.1?}",
        tripped.at, closed.at
    );
    assert!(
        closed.at <= back + PROBE * 32 + Duration::from_millis(3),
        "closed {:?} after the engine came back",
        closed.at - back
    );
}

/// The probe schedule `breaker.rs` documents: after a failure opens the
/// breaker, probes wait one interval, then twice as long after each failed
/// probe, up to 32 intervals. An engine that comes back 20 intervals after
/// the trip is first probed again at 1 + 2 + 4 + 8 + 16 = 31 intervals (a
/// fixed interval would close it at 21); one that comes back after 70, at
/// 31 + 32 + 32 = 95 (without the cap: 127). Each probe also takes the
/// engine's latency, which the window allows for.
#[tokio::test(start_paused = true)]
async fn probes_back_off_doubling_up_to_32_intervals() {
    back_off(PROBE, PROBE).await;
}

/// A zero probe interval would probe a failed engine in a busy loop: the
/// builder takes it as 1 ms, and the back-off runs from there.
#[tokio::test(start_paused = true)]
async fn a_zero_probe_interval_is_one_millisecond() {
    back_off(Duration::ZERO, Duration::from_millis(1)).await;
}

/// Trips an engine's breaker twice, brings it back 20 and 70 intervals
/// later, and checks when probes closed it (`probe`: what the builder is
/// given; `interval`: what it should use).
async fn back_off(probe: Duration, interval: Duration) {
    let flap = Arc::new(SimEngine::new(engine(
        "sim:flap",
        Duration::from_micros(100),
        1,
        8,
        faults(0.0, 0.0, None, 21),
    )));
    let offload = Offload::builder()
        .policy(Policy::Latency)
        .profile(profile(std::slice::from_ref(&flap)))
        .probe_interval(probe)
        .backend(flap.clone())
        .build()
        .unwrap();
    let session = offload
        .cipher(CipherAlg::Aes128Ctr, &key(16))
        .await
        .unwrap();
    let reference = Offload::builder()
        .build()
        .unwrap()
        .cipher(CipherAlg::Aes128Ctr, &key(16))
        .await
        .unwrap();
    let data = vec![0x3c; 4096];
    let want = reference.encrypt([7; 16], data.clone()).await.unwrap();
    let breaker = || offload.backends()[1].clone();

    for (episode, back_after, closes_after) in [(1, 20, 31), (2, 70, 95)] {
        flap.set_gone(true);
        // The request fails on the engine, opens its breaker and completes
        // on the CPU.
        let got = session.encrypt([7; 16], data.clone()).await.unwrap();
        assert_eq!(got, want);
        let tripped = Instant::now();
        let b = breaker();
        assert_eq!(b.stats.breaker_opened, episode, "{b:?}");
        assert!(b.unavailable.is_some(), "{b:?}");

        tokio::time::sleep_until(tripped + interval * back_after).await;
        assert!(breaker().unavailable.is_some(), "closed while gone");
        flap.set_gone(false);
        while breaker().unavailable.is_some() {
            tokio::time::sleep(Duration::from_micros(100)).await;
        }
        let closed = tripped.elapsed();
        eprintln!("episode {episode}: back after {back_after} intervals, closed at {closed:?}");
        let expected = interval * closes_after;
        assert!(
            closed >= expected && closed <= expected + Duration::from_millis(3),
            "episode {episode}: closed {closed:?} after the trip, expected {expected:?} \
             (+ up to 3 ms of probe latency)"
        );
        assert_eq!(breaker().stats.breaker_closed, episode);
    }
}
