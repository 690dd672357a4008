//! The seed scenarios through the selector, on simulated engines
//! (`crypto-offload-sim`): the choices per policy and size, calibration,
//! the model's online learning, the circuit breaker — on tokio's paused
//! clock where the check is about behaviour (transitions, choices), so the
//! numbers are exact and the tests instant. Throughput ratios are measured
//! by `offload bench` and the benches, not here. The simulated engine's own
//! model is tested in `sim/tests/sim.rs`.

use std::sync::Arc;
use std::time::Duration;

use crypto_offload::{Algorithm, CipherAlg, CrcAlg, Direction, Offload, Policy};
use crypto_offload_sim::{SimConfig, SimEngine, SimFaults, SimPower, SimTimer};

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
async fn mcrc64_stays_on_the_cpu_for_latency_and_takes_big_requests_to_save_cpu() {
    let alg = Algorithm::Crc(CrcAlg::Crc64Nvme);
    let sizes = [
        16usize,
        1 << 10,
        64 << 10,
        1 << 20,
        4 << 20,
        64 << 20,
        1 << 30,
    ];

    let latency = Offload::builder()
        .backend(Arc::new(SimEngine::new(preset("mcrc64"))))
        .build()
        .unwrap();
    latency.calibrate().await.unwrap();
    for len in sizes {
        let e = latency.explain(alg, Direction::Encrypt, len);
        assert_eq!(e.choice, "cpu", "{e}");
    }
    assert_eq!(latency.break_even(alg, Direction::Encrypt), None);

    let saving = Offload::builder()
        .backend(Arc::new(SimEngine::new(preset("mcrc64"))))
        .policy(Policy::CpuSaving {
            max_latency: Duration::from_secs(1),
        })
        .profile(latency.profile())
        .build()
        .unwrap();
    let be = saving
        .break_even(alg, Direction::Encrypt)
        .expect("a break-even exists");
    // The engine takes ~17 µs of CPU a request; the CPU's CRC-64 runs at
    // ~50 GB/s: the crossover is around a megabyte.
    assert!((100 << 10..16 << 20).contains(&be), "break-even {be}");
    assert_eq!(
        saving.explain(alg, Direction::Encrypt, be / 2).choice,
        "cpu"
    );
    assert_eq!(
        saving.explain(alg, Direction::Encrypt, be * 2).choice,
        "sim:mcrc64"
    );
    // Beyond the latency bound (25 ms + len / 812 MB/s > 1 s) the CPU again.
    assert_eq!(
        saving.explain(alg, Direction::Encrypt, 1 << 30).choice,
        "cpu"
    );

    // And requests really go there.
    let mut s = saving.crc(CrcAlg::Crc64Nvme).await.unwrap();
    s.update(vec![1u8; be * 2]).await.unwrap();
    s.update(vec![1u8; 64]).await.unwrap();
    let stats = saving.backends();
    assert_eq!(stats[1].stats.requests, 1, "{stats:?}");
    let mut want = crypto_offload_fallback::Crc::new(CrcAlg::Crc64Nvme);
    want.update(&vec![1u8; be * 2]);
    want.update(&[1u8; 64]);
    assert_eq!(s.finalize(), want.finalize());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qce_latency_keeps_the_cpu_and_throughput_uses_both() {
    let sim = Arc::new(SimEngine::preset("qce").unwrap());
    let profile = {
        let o = Offload::builder().backend(sim.clone()).build().unwrap();
        o.calibrate().await.unwrap();
        o.profile()
    };
    for policy in [Policy::Latency, Policy::Throughput] {
        // One core for the CPU path, kept busy by a long job on the blocking
        // pool while another task sends 1 MiB requests.
        let offload = Offload::builder()
            .backend(sim.clone())
            .policy(policy)
            .profile(profile.clone())
            .cores(1)
            .build()
            .unwrap();
        let s = offload
            .cipher(CipherAlg::Aes256Xts, &key(64))
            .await
            .unwrap();
        let big = {
            let offload = offload.clone();
            let data = vec![1u8; 256 << 20];
            tokio::spawn(async move {
                let units = offload
                    .cipher(CipherAlg::Aes256Xts, &key(64))
                    .await
                    .unwrap()
                    .with_data_unit(4096)
                    .unwrap();
                units.encrypt([0; 16], data).await.unwrap().len()
            })
        };
        // Wait until the job is running on the CPU.
        let busy = || {
            offload
                .explain(CipherAlg::Aes256Xts, Direction::Encrypt, 1)
                .candidates[0]
                .in_flight
        };
        for _ in 0..1000 {
            if busy() > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_micros(100)).await;
        }
        assert_eq!(busy(), 1, "the long job is in flight on the CPU");
        // 1 MiB requests: at 64 KiB the engine's 4 µs of CPU a request is
        // more than the CPU's own work on a VAES CPU (3.6 µs on an Intel
        // Xeon with AWS-LC's XTS), and Throughput rightly stays on the CPU.
        for i in 0..8u128 {
            let pt = vec![i as u8; 1 << 20];
            let ct = s.encrypt(i.to_le_bytes(), pt.clone()).await.unwrap();
            assert_eq!(s.decrypt(i.to_le_bytes(), ct).await.unwrap(), pt);
        }
        assert_eq!(big.await.unwrap(), 256 << 20);
        let engine = offload.backends()[1].stats.requests;
        match policy {
            Policy::Latency => assert_eq!(engine, 0, "the engine is slower at every size"),
            _ => assert!(engine > 0, "with the CPU busy, Throughput feeds the engine"),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn faults_are_completed_on_the_cpu_and_the_breaker_opens_then_closes() {
    let mut c = SimConfig::new(
        "sim:flaky",
        vec![Algorithm::Cipher(CipherAlg::Aes128Ctr)],
        Duration::from_micros(10),
        1e9,
    );
    c.timer = SimTimer::Tokio;
    c.faults = SimFaults {
        error_rate: 0.3,
        timeout_rate: 0.1,
        timeout: Duration::from_millis(5),
        gone_after: None,
        seed: 7,
    };
    let sim = Arc::new(SimEngine::new(c));
    let offload = Offload::builder()
        .backend(sim.clone())
        .pin("sim:flaky")
        .probe_interval(Duration::from_millis(50))
        .build()
        .unwrap();
    let s = offload
        .cipher(CipherAlg::Aes128Ctr, &key(16))
        .await
        .unwrap();
    let cpu = Offload::builder().build().unwrap();
    let reference = cpu.cipher(CipherAlg::Aes128Ctr, &key(16)).await.unwrap();
    for i in 0..500u128 {
        let pt = vec![(i % 251) as u8; 100 + i as usize];
        let got = s.encrypt(i.to_be_bytes(), pt.clone()).await.unwrap();
        let want = reference.encrypt(i.to_be_bytes(), pt).await.unwrap();
        assert_eq!(got, want, "request {i}");
    }
    let b = offload.backends();
    assert!(b[1].stats.failures > 100, "{b:?}");
    assert_eq!(b[0].stats.replayed, b[1].stats.failures);
    assert_eq!(b[1].stats.requests + b[1].stats.failures, 500);
    assert!(b[1].stats.breaker_opened >= 1);

    // The device goes away for good: every request completes on the CPU and
    // the breaker stays open with the reason; when it comes back, a probe
    // closes it.
    sim.set_gone(true);
    let got = s.encrypt([1; 16], vec![3u8; 64]).await.unwrap();
    assert_eq!(
        got,
        reference.encrypt([1; 16], vec![3u8; 64]).await.unwrap()
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let why = offload.backends()[1]
        .unavailable
        .clone()
        .unwrap_or_default();
    assert!(why.contains("gone"), "{why}");
    sim.set_gone(false);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let b = offload.backends();
    assert!(b[1].unavailable.is_none(), "{b:?}");
    assert!(b[1].stats.breaker_closed >= 1);
}

#[tokio::test(start_paused = true)]
async fn explain_lists_every_backend_and_profiles_round_trip() {
    let offload = Offload::builder()
        .backend(Arc::new(SimEngine::preset("qce").unwrap()))
        .backend(Arc::new(SimEngine::new(preset("mcrc64"))))
        .build()
        .unwrap();
    let before = offload.explain(CipherAlg::Aes256Xts, Direction::Encrypt, 4096);
    assert_eq!(before.choice, "cpu");
    assert!(
        before.candidates[1]
            .excluded
            .as_deref()
            .is_some_and(|w| w.contains("not calibrated"))
    );
    offload.calibrate().await.unwrap();
    let e = offload.explain(CipherAlg::Aes256Xts, Direction::Encrypt, 4096);
    assert_eq!(e.candidates.len(), 3);
    assert!(e.candidates[0].latency.is_some() && e.candidates[1].latency.is_some());
    assert!(e.candidates[2].excluded.as_deref() == Some("does not run this algorithm"));
    let text = e.to_string();
    assert!(
        text.contains("sim:qce") && text.contains("latency"),
        "{text}"
    );

    let toml = offload.profile().to_toml().unwrap();
    let back = crypto_offload::Profile::from_toml(&toml).unwrap();
    assert_eq!(back, offload.profile());
    assert!(
        toml.contains("[[entry]]") && toml.contains("sim:qce"),
        "{toml}"
    );
    // The engine's limits travel with its costs.
    let qce = back
        .entries
        .iter()
        .find(|e| e.backend == "sim:qce")
        .unwrap();
    assert_eq!(qce.cost.queue_depth, 32);
    assert!(qce.cost.parallelism >= 1);
    let cpu = back.entries.iter().find(|e| e.backend == "cpu").unwrap();
    assert_eq!(cpu.cost.queue_depth, u32::MAX);
}

#[tokio::test(start_paused = true)]
async fn discovery_on_a_profile_calibrates_only_the_engines_it_lacks() {
    // A profile made where only sim:qce was...
    let made = Offload::builder()
        .backend(Arc::new(SimEngine::new(preset("qce"))))
        .build()
        .unwrap();
    made.calibrate().await.unwrap();
    let saved = made.profile();
    assert!(!saved.entries.iter().any(|e| e.backend == "sim:mcrc64"));
    // ...loaded where sim:mcrc64 has joined it.
    let offload = Offload::discover_with(
        Offload::builder()
            .backend(Arc::new(SimEngine::new(preset("qce"))))
            .backend(Arc::new(SimEngine::new(preset("mcrc64"))))
            .profile(saved.clone()),
    )
    .await
    .unwrap();
    let b = offload.backends();
    assert!(b.iter().all(|b| b.unavailable.is_none()), "{b:?}");
    let now = offload.profile();
    assert!(
        now.entries.iter().any(|e| e.backend == "sim:mcrc64"),
        "the engine the profile lacked was calibrated: {now:?}"
    );
    // The CPU's and sim:qce's costs are the profile's, not measured again.
    for e in &saved.entries {
        assert!(now.entries.contains(e), "{e:?} kept");
    }
}

#[tokio::test(start_paused = true)]
async fn calibration_stays_within_its_budget() {
    // On the paused clock only the engines' (virtual) time counts: the
    // CPU's calibration spins in real time.
    for name in ["omap", "mcrc64", "qce", "eip197"] {
        let offload = Offload::builder()
            .backend(Arc::new(SimEngine::new(preset(name))))
            .build()
            .unwrap();
        let start = tokio::time::Instant::now();
        offload.calibrate().await.unwrap();
        let took = start.elapsed();
        // 200 ms, plus the resume and first request kept out of the timings
        // (which the paused clock rounds up to whole milliseconds).
        assert!(took <= Duration::from_millis(260), "{name}: {took:?}");
        let profile = offload.profile();
        let engine = profile
            .entries
            .iter()
            .filter(|e| e.backend.starts_with("sim:"))
            .count();
        let supported = offload.backends()[1].algorithms.len();
        let want = supported * if name == "mcrc64" { 1 } else { 2 };
        assert_eq!(engine, want, "{name}: every pair has costs");
    }
}

/// The engine's predicted latency for `len`, from `explain`.
fn engine_prediction(offload: &Offload, alg: CipherAlg, len: usize) -> Duration {
    let ex = offload.explain(alg, Direction::Encrypt, len);
    ex.candidates
        .iter()
        .find(|c| c.backend.starts_with("sim"))
        .and_then(|c| c.latency)
        .unwrap_or_else(|| panic!("the engine is not eligible: {ex:?}"))
}

/// A profile with the given costs (ns) for AES-256-XTS encryption on the
/// CPU and on the engine `sim`.
fn xts_profile(cpu: (f64, f64), sim: (f64, f64), resume_ns: f64) -> crypto_offload::Profile {
    let entry = |backend: &str, (fixed, per_byte): (f64, f64), cpu_share: f64, resume: f64| {
        format!(
            "[[entry]]\nbackend = \"{backend}\"\nalg = \"aes-256-xts\"\ndir = \"encrypt\"\n\
             fixed_ns = {fixed:?}\nper_byte_ns = {per_byte:?}\ncpu_fixed_ns = {:?}\n\
             cpu_per_byte_ns = {:?}\nparallelism = 1\nresume_ns = {resume:?}\n",
            fixed * cpu_share,
            per_byte * cpu_share
        )
    };
    let text = entry("cpu", cpu, 1.0, 0.0) + &entry("sim", sim, 0.0, resume_ns);
    crypto_offload::Profile::from_toml(&text).unwrap()
}

/// An AES-256-XTS engine `name` that takes `latency` a request (plus 1 ns
/// a KB) and skips computing results (its costs are what is tested).
fn xts_engine(name: &str, latency: Duration) -> SimConfig {
    let mut c = SimConfig::new(
        name,
        vec![Algorithm::Cipher(CipherAlg::Aes256Xts)],
        latency,
        1e12,
    );
    c.compute_results = false;
    c
}

#[tokio::test(start_paused = true)]
async fn a_resume_does_not_teach_the_model_that_the_engine_is_slow() {
    // Each session starts on a suspended device: its first request waits
    // for the resume (and the context's open). That time is the resume's,
    // not the engine's service time, and must not inflate the correction.
    // Costs from a profile, so the test does not depend on the machine.
    let mut c = xts_engine("sim", Duration::from_millis(2));
    c.timer = SimTimer::Tokio;
    c.power = Some(SimPower {
        resume: Duration::from_millis(6),
        autosuspend: Duration::from_millis(5),
        per_request: false,
    });
    let sim = Arc::new(SimEngine::new(c));
    let offload = Offload::builder()
        .backend(sim.clone())
        .profile(xts_profile((1e3, 1.0), (2e6, 0.0), 6e6))
        .build()
        .unwrap();
    let len = 16 << 20; // 16.8 ms on the CPU, 2 ms (8 ms cold) on the engine
    let before = engine_prediction(&offload, CipherAlg::Aes256Xts, len);
    let mut buf = vec![0u8; len];
    for i in 0..8u128 {
        let s = offload
            .cipher(CipherAlg::Aes256Xts, &key(64))
            .await
            .unwrap();
        assert_eq!(
            s.backend_for(Direction::Encrypt, len),
            "sim",
            "session {i}: {:?}",
            offload.explain(CipherAlg::Aes256Xts, Direction::Encrypt, len)
        );
        buf = s.encrypt(i.to_le_bytes(), buf).await.unwrap();
        drop(s);
        tokio::time::sleep(Duration::from_millis(30)).await; // suspended again
    }
    assert_eq!(sim.power_stats().resumes, 8, "one per session");
    let after = engine_prediction(&offload, CipherAlg::Aes256Xts, len);
    assert!(
        after.as_secs_f64() < before.as_secs_f64() * 1.1,
        "cold starts inflated the engine's prediction: {before:?} -> {after:?}"
    );
    // Suspended now (no session): explain says how much of the engine's
    // predicted latency is the resume, and what it is once powered.
    let ex = offload.explain(CipherAlg::Aes256Xts, Direction::Encrypt, len);
    let engine = ex.candidates.iter().find(|c| c.backend == "sim").unwrap();
    let (latency, resume) = (engine.latency.unwrap(), engine.resume.unwrap());
    assert_eq!(resume, Duration::from_millis(6), "{ex}");
    assert!(latency > resume, "{ex}");
    assert!(ex.to_string().contains("of it is the resume"), "{ex}");
    // Powered by a request (before its autosuspend): no resume in it.
    let s = offload
        .cipher(CipherAlg::Aes256Xts, &key(64))
        .await
        .unwrap();
    let _ = s.encrypt([0; 16], buf).await.unwrap();
    let ex = offload.explain(CipherAlg::Aes256Xts, Direction::Encrypt, len);
    let engine = ex.candidates.iter().find(|c| c.backend == "sim").unwrap();
    assert_eq!(engine.resume, None, "{ex}");
    assert!(engine.latency.unwrap() < latency - resume / 2, "{ex}");
}

#[tokio::test(start_paused = true)]
async fn an_engine_serving_many_at_once_is_learned_so_under_load() {
    // Profiled single-stream (parallelism 1), the engine in fact serves 8
    // requests at once (8 queues): 64 requests in flight each come back
    // after ~8 services, not 64. The model learns it from what it sees
    // under load — the correction (the service time) stays as it was.
    let parallelism = |o: &Offload| {
        o.profile()
            .entries
            .iter()
            .find(|e| e.backend == "sim" && e.dir == Direction::Encrypt)
            .map(|e| e.cost.parallelism)
            .unwrap()
    };
    let mut c = xts_engine("sim", Duration::from_millis(1));
    c.timer = SimTimer::Tokio;
    c.queues = 8;
    c.queue_depth = 16;
    let offload = Offload::builder()
        .backend(Arc::new(SimEngine::new(c)))
        .profile(xts_profile((1e3, 1.0), (1e6, 0.0), 0.0))
        .pin("sim")
        .build()
        .unwrap();
    assert_eq!(parallelism(&offload), 1);
    let one = engine_prediction(&offload, CipherAlg::Aes256Xts, 4096);
    let s = Arc::new(
        offload
            .cipher(CipherAlg::Aes256Xts, &key(64))
            .await
            .unwrap(),
    );
    for _ in 0..40 {
        let tasks: Vec<_> = (0..64u128)
            .map(|i| {
                let s = s.clone();
                tokio::spawn(async move { s.encrypt(i.to_le_bytes(), vec![0; 4096]).await })
            })
            .collect();
        for t in tasks {
            t.await.unwrap().unwrap();
        }
    }
    let learned = parallelism(&offload);
    assert!(
        (6..=10).contains(&learned),
        "learned {learned}, served 8 at once"
    );
    let after = engine_prediction(&offload, CipherAlg::Aes256Xts, 4096);
    assert!(
        after.as_secs_f64() < one.as_secs_f64() * 1.2,
        "an idle engine's service time moved: {one:?} -> {after:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_cpu_jobs_do_not_teach_the_model_that_one_core_is_faster() {
    // A 16 MiB job runs on the blocking pool in up to `cores` pieces at
    // once; its wall time is not one core's service time.
    let sim = Arc::new(SimEngine::new(SimConfig::new(
        "sim",
        vec![Algorithm::Cipher(CipherAlg::Aes128Ctr)],
        Duration::from_secs(1),
        1e6,
    )));
    let offload = Offload::builder().backend(sim).cores(8).build().unwrap();
    offload.calibrate().await.unwrap();
    let cpu_4k = |o: &Offload| {
        let ex = o.explain(CipherAlg::Aes128Ctr, Direction::Encrypt, 4096);
        ex.candidates[0].latency.unwrap()
    };
    let before = cpu_4k(&offload);
    let s = offload
        .cipher(CipherAlg::Aes128Ctr, &key(16))
        .await
        .unwrap();
    let mut buf = vec![0u8; 16 << 20];
    for i in 0..20u128 {
        buf = s.encrypt(i.to_be_bytes(), buf).await.unwrap();
    }
    let after = cpu_4k(&offload);
    assert!(
        after.as_secs_f64() > before.as_secs_f64() * 0.95,
        "split jobs deflated the CPU's prediction: {before:?} -> {after:?}"
    );
}

#[test]
fn without_a_runtime_live_traffic_reopens_a_tripped_backend() {
    // The crate runs on any executor. With no tokio runtime there is no
    // probe task: after the probe interval the breaker lets a request
    // through, and its success closes the breaker.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (sim, offload) = rt.block_on(async {
        // Results skipped, so the engine is cheaper than the CPU here (the
        // replay on the CPU is what is compared).
        let c = xts_engine("sim", Duration::from_micros(20));
        let sim = Arc::new(SimEngine::new(c));
        let offload = Offload::builder()
            .backend(sim.clone())
            // Longer than the 32 MiB replay on the CPU takes with other
            // tests running (it took > 20 ms: the breaker was half-open
            // again before it was looked at).
            .probe_interval(Duration::from_millis(300))
            // Costs from a profile (calibrated, the choice at 32 MiB moved
            // with the load of tests running alongside): 33 ms on the CPU,
            // 20 µs on the engine.
            .profile(xts_profile((1e3, 1.0), (20e3, 0.0), 0.0))
            .build()
            .unwrap();
        (sim, offload)
    });
    drop(rt);
    futures::executor::block_on(async {
        let len = 32 << 20;
        let s = offload
            .cipher(CipherAlg::Aes256Xts, &key(64))
            .await
            .unwrap();
        let reference = Offload::builder()
            .build()
            .unwrap()
            .cipher(CipherAlg::Aes256Xts, &key(64))
            .await
            .unwrap();
        assert_eq!(
            s.backend_for(Direction::Encrypt, len),
            "sim",
            "{:?}",
            offload.explain(CipherAlg::Aes256Xts, Direction::Encrypt, len)
        );
        let pt: Vec<u8> = (0..len).map(|i| i as u8).collect();
        let want = reference.encrypt([3; 16], pt.clone()).await.unwrap();

        sim.set_gone(true);
        let got = s.encrypt([3; 16], pt.clone()).await.unwrap();
        assert_eq!(got, want, "completed on the CPU");
        assert_eq!(s.backend_for(Direction::Encrypt, len), "cpu", "tripped");
        assert!(offload.backends()[1].unavailable.is_some());

        sim.set_gone(false);
        std::thread::sleep(Duration::from_millis(310));
        assert_eq!(s.backend_for(Direction::Encrypt, len), "sim", "half-open");
        s.encrypt([3; 16], pt).await.unwrap();
        let b = offload.backends();
        assert!(b[1].unavailable.is_none(), "closed by the success: {b:?}");
        assert_eq!(
            (b[1].stats.breaker_opened, b[1].stats.breaker_closed),
            (1, 1)
        );
        assert_eq!(b[1].stats.requests, 1);
    });
}

/// A powered-down engine ten times faster than the CPU at 64 KiB but with
/// a 1 ms resume: one request alone does not repay the resume, so the first
/// request of a stream runs on the CPU; once the requests would have saved
/// as much as the resume costs, the next one wakes the engine and it takes
/// the following ones (ski rental). A lone request leaves it asleep.
#[tokio::test(start_paused = true)]
async fn a_cold_engine_is_woken_once_a_stream_would_have_repaid_its_resume() {
    let alg = Algorithm::Cipher(CipherAlg::Aes128Ctr);
    let mut c = SimConfig::new("sim:cold", vec![alg], Duration::from_micros(1), 1e9);
    c.timer = SimTimer::Tokio;
    c.power = Some(SimPower {
        resume: Duration::from_millis(1),
        autosuspend: Duration::from_secs(1),
        per_request: false,
    });
    let sim = Arc::new(SimEngine::new(c));
    // CPU: 1 µs + 10 ns/B (656 µs at 64 KiB); engine: 1 µs + 1 ns/B
    // (66 µs); the engine's resume 1 ms.
    let profile = crypto_offload::Profile::from_toml(
        r#"
[[entry]]
backend = "cpu"
alg = "aes-128-ctr"
dir = "encrypt"
fixed_ns = 1000.0
per_byte_ns = 10.0
cpu_fixed_ns = 1000.0
cpu_per_byte_ns = 10.0
parallelism = 1

[[entry]]
backend = "sim:cold"
alg = "aes-128-ctr"
dir = "encrypt"
fixed_ns = 1000.0
per_byte_ns = 1.0
cpu_fixed_ns = 100.0
cpu_per_byte_ns = 0.0
parallelism = 1
resume_ns = 1000000.0
"#,
    )
    .unwrap();
    let offload = Offload::builder()
        .backend(sim.clone())
        .policy(Policy::Latency)
        .profile(profile)
        .build()
        .unwrap();
    let s = offload
        .cipher(CipherAlg::Aes128Ctr, &key(16))
        .await
        .unwrap();
    let engine = || offload.backends()[1].stats.requests;
    // One request: the CPU, the engine stays down.
    s.encrypt([0; 16], vec![0u8; 64 << 10]).await.unwrap();
    assert_eq!((engine(), sim.power_stats().resumes), (0, 0));
    // With the second request the regret (2 x 590 µs) passes the 1 ms
    // resume: it wakes the engine, which takes the following ones. (A
    // short stream: on the paused clock the CPU's own work takes no time,
    // and a long one would teach the model that the CPU is free.)
    let mut seen = Vec::new();
    for i in 1..5u8 {
        s.encrypt([i; 16], vec![i; 64 << 10]).await.unwrap();
        seen.push(engine());
    }
    assert_eq!(seen, [1, 2, 3, 4], "requests 2..5 on the engine");
    assert_eq!(sim.power_stats().resumes, 1);
}

#[test]
fn the_blocking_pool_hand_off_is_learned_apart_from_inline_requests() {
    // A 1 MiB CPU job leaves the calling task for tokio's blocking pool.
    // Here the pool's only thread is busy for 50 ms, so the job waits that
    // long for it: a hand-off the inline model knows nothing of. The CPU's
    // prediction for such jobs must take it in (the engine then wins them),
    // and its predictions for inline requests must not.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .max_blocking_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let c = xts_engine("sim", Duration::from_millis(20));
        let offload = Offload::builder()
            .backend(Arc::new(SimEngine::new(c)))
            .cores(1)
            .profile(xts_profile((1e3, 1.0), (20e6, 0.0), 0.0))
            .build()
            .unwrap();
        let cpu = |len: usize| {
            let ex = offload.explain(CipherAlg::Aes256Xts, Direction::Encrypt, len);
            ex.candidates[0].latency.unwrap()
        };
        let len = 1 << 20; // 1.05 ms predicted on the CPU, 20 ms on the engine
        let s = offload
            .cipher(CipherAlg::Aes256Xts, &key(64))
            .await
            .unwrap();
        assert_eq!(s.backend_for(Direction::Encrypt, len), "cpu");
        let small = cpu(4096);

        let hog = tokio::task::spawn_blocking(|| std::thread::sleep(Duration::from_millis(50)));
        let plain: Vec<u8> = (0..len).map(|i| i as u8).collect();
        let sealed = s.encrypt([0u8; 16], plain.clone()).await.unwrap();
        hog.await.unwrap();
        let opened = s.decrypt([0u8; 16], sealed).await.unwrap();
        assert!(opened == plain, "the request ran wrong");

        let large = cpu(len);
        assert!(
            large > Duration::from_millis(40),
            "the hand-off was not learned: {large:?}"
        );
        assert_eq!(
            s.backend_for(Direction::Encrypt, len),
            "sim",
            "{:?}",
            offload.explain(CipherAlg::Aes256Xts, Direction::Encrypt, len)
        );
        let after = cpu(4096);
        assert!(
            after.as_secs_f64() < small.as_secs_f64() * 1.1,
            "the hand-off leaked into inline predictions: {small:?} -> {after:?}"
        );
    });
}

/// Runs `requests` 4 KiB AES-256-XTS encryptions under Auto (Latency, on
/// tokio's paused clock) with the CPU profiled at `cpu_ms` and engines
/// `(name, profiled ms, real ms)`: which backend took the first request
/// and which one Auto chooses after them all (with `explain` for a failed
/// assertion).
async fn choice_before_and_after(
    cpu_ms: f64,
    engines: &[(&str, f64, u64)],
    requests: u128,
) -> (String, String, String) {
    let entry = |backend: &str, ms: f64, share: f64| {
        format!(
            "[[entry]]\nbackend = \"{backend}\"\nalg = \"aes-256-xts\"\ndir = \"encrypt\"\n\
             fixed_ns = {:?}\nper_byte_ns = 0.0\ncpu_fixed_ns = {:?}\n\
             cpu_per_byte_ns = 0.0\nparallelism = 1\nresume_ns = 0.0\n",
            ms * 1e6,
            ms * 1e6 * share
        )
    };
    let mut profile = entry("cpu", cpu_ms, 1.0);
    let mut builder = Offload::builder();
    for &(name, profiled, real) in engines {
        profile += &entry(name, profiled, 0.0);
        let mut c = xts_engine(name, Duration::from_millis(real));
        c.timer = SimTimer::Tokio;
        builder = builder.backend(Arc::new(SimEngine::new(c)));
    }
    let offload = builder
        .profile(crypto_offload::Profile::from_toml(&profile).unwrap())
        .build()
        .unwrap();
    let s = offload
        .cipher(CipherAlg::Aes256Xts, &key(64))
        .await
        .unwrap();
    let len = 4096;
    let before = s.backend_for(Direction::Encrypt, len).to_owned();
    let mut buf = vec![0u8; len];
    for i in 0..requests {
        buf = s.encrypt(i.to_le_bytes(), buf).await.unwrap();
    }
    let after = s.backend_for(Direction::Encrypt, len).to_owned();
    let why = offload
        .explain(CipherAlg::Aes256Xts, Direction::Encrypt, len)
        .to_string();
    (before, after, why)
}

#[tokio::test(start_paused = true)]
async fn a_near_tie_is_explored_and_the_faster_engine_found() {
    // The profile has engine `a` at 10 ms and `b` at 12 ms; in fact `a`
    // takes 10 ms and `b` 6 ms. Serving only `a` would never correct `b`:
    // Auto must now and then try the near runner-up, learn, and move.
    let (before, after, why) =
        choice_before_and_after(100.0, &[("a", 10.0, 10), ("b", 12.0, 6)], 300).await;
    assert_eq!((before.as_str(), after.as_str()), ("a", "b"), "{why}");
}

#[tokio::test(start_paused = true)]
async fn every_near_rival_is_tried_the_cpu_included() {
    // The profile has the CPU at 12 ms, engine `a` at 10 ms and `b` at
    // 11 ms; `a` and `b` are right, and the CPU takes microseconds. Trying
    // only the nearest rival (`b`) would never re-measure the CPU, and
    // the CPU's inline path times only one request in 64: a request sent to
    // the CPU to correct its model must be timed, and every near rival
    // must have its turn.
    let (before, after, why) =
        choice_before_and_after(12.0, &[("a", 10.0, 10), ("b", 11.0, 11)], 300).await;
    assert_eq!((before.as_str(), after.as_str()), ("a", "cpu"), "{why}");
}

/// A simulated engine whose requests take `slowdown` times as long (a load
/// swing on its host): each request waits the extra on tokio's clock after
/// the engine completes it. `crypto-offload-sim` has no speed to change
/// at run time; this wraps it through the public `Backend` API.
#[derive(Debug)]
struct Swung {
    sim: SimEngine,
    latency: Duration,
    slowdown: Arc<std::sync::atomic::AtomicU32>,
}

struct SwungCipher {
    inner: Box<dyn crypto_offload::backend::CipherContext>,
    latency: Duration,
    slowdown: Arc<std::sync::atomic::AtomicU32>,
}

impl SwungCipher {
    async fn swing(&self) {
        let factor = self.slowdown.load(std::sync::atomic::Ordering::Relaxed);
        tokio::time::sleep(self.latency * factor.saturating_sub(1)).await;
    }
}

#[crypto_offload::backend::async_trait]
impl crypto_offload::backend::CipherContext for SwungCipher {
    async fn encrypt(
        &self,
        params: crypto_offload::backend::CipherParams,
        buf: crypto_offload::backend::IoBuf,
    ) -> Result<crypto_offload::backend::IoBuf, crypto_offload::backend::Failed> {
        let out = self.inner.encrypt(params, buf).await;
        self.swing().await;
        out
    }
    async fn decrypt(
        &self,
        params: crypto_offload::backend::CipherParams,
        buf: crypto_offload::backend::IoBuf,
    ) -> Result<crypto_offload::backend::IoBuf, crypto_offload::backend::Failed> {
        let out = self.inner.decrypt(params, buf).await;
        self.swing().await;
        out
    }
}

#[crypto_offload::backend::async_trait]
impl crypto_offload::backend::Backend for Swung {
    fn name(&self) -> &str {
        self.sim.name()
    }
    fn kind(&self) -> crypto_offload::BackendKind {
        self.sim.kind()
    }
    fn limits(&self, alg: Algorithm) -> Option<crypto_offload::backend::Limits> {
        self.sim.limits(alg)
    }
    async fn open_cipher(
        &self,
        alg: CipherAlg,
        key: &crypto_offload::backend::SecretKey,
    ) -> Result<
        Box<dyn crypto_offload::backend::CipherContext>,
        crypto_offload::backend::BackendError,
    > {
        Ok(Box::new(SwungCipher {
            inner: self.sim.open_cipher(alg, key).await?,
            latency: self.latency,
            slowdown: self.slowdown.clone(),
        }))
    }
    async fn open_aead(
        &self,
        alg: crypto_offload::AeadAlg,
        key: &crypto_offload::backend::SecretKey,
    ) -> Result<Box<dyn crypto_offload::backend::AeadContext>, crypto_offload::backend::BackendError>
    {
        self.sim.open_aead(alg, key).await
    }
    async fn open_crc(
        &self,
        alg: CrcAlg,
    ) -> Result<Box<dyn crypto_offload::backend::CrcContext>, crypto_offload::backend::BackendError>
    {
        self.sim.open_crc(alg).await
    }
}

#[tokio::test(start_paused = true)]
async fn an_engine_slowed_by_a_load_swing_is_left_and_found_again_once_it_ends() {
    // Engine `a` (1 ms a request) beats `b` (2 ms); the CPU, profiled at
    // 100 ms, is out of the running. A swing makes `a` 3× slower for 300
    // requests: Auto must leave it within 5 requests, and come back within
    // 64 once it ends — by probing it, since nothing else is sent there.
    use crypto_offload::backend::Backend as _;
    let slowdown = Arc::new(std::sync::atomic::AtomicU32::new(1));
    let engine = |name: &str, ms: u64| {
        let mut c = xts_engine(name, Duration::from_millis(ms));
        c.timer = SimTimer::Tokio;
        SimEngine::new(c)
    };
    let a = Swung {
        sim: engine("a", 1),
        latency: Duration::from_millis(1),
        slowdown: slowdown.clone(),
    };
    assert_eq!(a.name(), "a");
    let entry = |backend: &str, ms: f64| {
        format!(
            "[[entry]]\nbackend = \"{backend}\"\nalg = \"aes-256-xts\"\ndir = \"encrypt\"\n\
             fixed_ns = {:?}\nper_byte_ns = 0.0\ncpu_fixed_ns = 0.0\n\
             cpu_per_byte_ns = 0.0\nparallelism = 1\nresume_ns = 0.0\n",
            ms * 1e6
        )
    };
    let profile = entry("cpu", 100.0) + &entry("a", 1.0) + &entry("b", 2.0);
    let offload = Offload::builder()
        .backend(Arc::new(a))
        .backend(Arc::new(engine("b", 2)))
        .profile(crypto_offload::Profile::from_toml(&profile).unwrap())
        .build()
        .unwrap();
    let s = offload
        .cipher(CipherAlg::Aes256Xts, &key(64))
        .await
        .unwrap();
    let len = 4096;
    let why = || offload.explain(CipherAlg::Aes256Xts, Direction::Encrypt, len);
    let mut stream = (vec![0u8; len], 0u128);
    assert_eq!(
        requests_until(&s, &mut stream, "a", 100).await,
        Some(1),
        "{}",
        why()
    );
    slowdown.store(3, std::sync::atomic::Ordering::Relaxed);
    let left = requests_until(&s, &mut stream, "b", 5).await;
    assert!(left.is_some(), "{}", why());
    // The swing lasts: `b` throughout (the probes of `a` see it slow).
    let stayed = requests_until(&s, &mut stream, "a", 300).await;
    assert_eq!(stayed, None, "{}", why());
    slowdown.store(1, std::sync::atomic::Ordering::Relaxed);
    let back = requests_until(&s, &mut stream, "a", 64).await;
    assert!(back.is_some(), "{}", why());
}

/// Sends requests of `stream`'s buffer (its IVs counted in it) until the
/// session's next one would go to `want`: how many, if at most `limit`.
async fn requests_until(
    s: &crypto_offload::CipherSession,
    (buf, i): &mut (Vec<u8>, u128),
    want: &str,
    limit: u32,
) -> Option<u32> {
    let len = buf.len();
    for n in 1..=limit {
        *i += 1;
        *buf = s
            .encrypt(i.to_le_bytes(), std::mem::take(buf))
            .await
            .unwrap();
        if s.backend_for(Direction::Encrypt, len) == want {
            return Some(n);
        }
    }
    None
}
