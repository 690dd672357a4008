//! What is fuzzed: every backend this build can reach, each as an
//! [`Offload`] that sends every request to it, and the selector over all of
//! them.
//!
//! * `cpu/<implementation>`: the CPU backend forced onto each CPU
//!   implementation compiled in (RustCrypto, and aws-lc with the `aws-lc`
//!   feature);
//! * `cpu-split`: the CPU with a cost model that calls every request of
//!   64 KiB or more slow, so that those go to tokio's blocking pool and split
//!   over four cores (CTR, XTS units, CBC decryption, GCM, CRC with
//!   combination) — paths the inline small requests never take;
//! * `sim:pinned`: a simulated engine (`crypto_offload_sim::SimEngine`) with
//!   sessions pinned to it: a `dyn Backend` with owned `IoBuf` round trips,
//!   the engine's context, queue and completion;
//! * `auto`: the backends `Offload::discover()` adds — AF_ALG engines and VFIO
//!   devices when built with the `af-alg` / `vfio` features and run where
//!   they exist — plus a second simulated engine, with the selector choosing
//!   per request (a fresh model per input when there is no real engine:
//!   see [`Subject::offload`]);
//! * `<engine> (pinned)`: each of those engines, pinned (sharing it with `auto`).
//!
//! Only the CPU-only builds run without a clock: the simulated engines wait
//! on tokio timers, and the harness's runtime runs on tokio's paused clock,
//! which jumps to the next timer whenever every task waits, so modelled
//! latencies cost no wall time. With real engines compiled in, the clock is
//! real (a paused clock would fire the AF_ALG and VFIO request deadlines
//! while the kernel or the device works), and the simulated engines use
//! their own completion threads instead.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use crypto_offload::{Algorithm, Direction, Implementation, Offload, Profile};
use crypto_offload_sim::{SimConfig, SimEngine, SimTimer};

/// One way of running requests, under the name mismatch reports use.
pub struct Subject {
    /// The name reports use.
    pub name: String,
    /// The `Offload` sessions are opened on.
    pub offload: Offload,
    /// Shorter requests are not run here: they would take a path another
    /// subject already covers (`cpu-split` is the plain CPU below 64 KiB).
    pub min_len: usize,
    /// Makes a new `Offload` for every input instead (see [`Subject::offload`]).
    pub fresh: Option<Box<dyn Fn() -> Offload + Send + Sync>>,
}

impl Subject {
    /// A subject that runs every request.
    pub fn new(name: impl Into<String>, offload: Offload) -> Self {
        Subject {
            name: name.into(),
            offload,
            min_len: 0,
            fresh: None,
        }
    }

    /// The `Offload` to open this input's sessions on: the subject's own,
    /// or for Auto over simulated engines only, a new one with the
    /// profile's model. The selector learns from what requests take, and on
    /// the paused clock a simulated engine's completions are rounded up to
    /// tokio's millisecond: a long-lived Auto learns within some 10,000
    /// inputs that the engine is slow and then sends it nothing (measured).
    /// A fresh model per input routes by size as the profile says (the CPU
    /// below about 1 KiB, the engine above), which also makes each input's
    /// routing independent of the inputs before it, so crashes reproduce.
    pub fn offload(&self) -> Offload {
        match &self.fresh {
            Some(make) => make(),
            None => self.offload.clone(),
        }
    }

    /// Whether a request of `alg` and `len` bytes runs on this subject: a
    /// pinned engine that lacks `alg` refuses the session at open, as
    /// documented (the bad-input table tests that), so its inputs are not
    /// compared there — AF_ALG's virtio_crypto runs AES-CBC only.
    pub fn runs(&self, alg: impl Into<Algorithm>, len: usize) -> bool {
        let alg = alg.into();
        len >= self.min_len
            && self
                .offload
                .backends()
                .iter()
                .find(|b| b.pinned)
                .is_none_or(|b| b.algorithms.contains(&alg))
    }
}

/// The process-wide runtime and subjects: built once (calibrating real
/// engines takes up to 200 ms each), reused by every input.
pub struct Harness {
    rt: tokio::runtime::Runtime,
    /// Every subject, CPU first.
    pub subjects: Vec<Subject>,
}

/// Whether real engines may be compiled in (then the clock must be real).
pub const REAL_ENGINES: bool = cfg!(any(feature = "af-alg", feature = "vfio"));

/// The runtime the targets run on: one thread (libFuzzer's), tokio's clock
/// paused unless real engines are compiled in — and then with the I/O
/// driver, on which a VFIO device waits for its interrupts.
pub fn runtime() -> tokio::runtime::Runtime {
    let mut b = tokio::runtime::Builder::new_current_thread();
    b.enable_time();
    if REAL_ENGINES {
        b.enable_io();
    } else {
        b.start_paused(true);
    }
    b.build().expect("a tokio runtime")
}

/// A runtime on tokio's paused clock, whatever is compiled in (the
/// lifecycle target, whose only engine is simulated).
pub fn runtime_paused() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a tokio runtime")
}

/// The harness, built on first use.
pub fn harness() -> &'static Harness {
    static HARNESS: LazyLock<Harness> = LazyLock::new(Harness::new);
    &HARNESS
}

/// A simulated engine running every algorithm, as cheap as the model
/// allows: no latency, no CPU cost, no faults (the lifecycle target fuzzes
/// those).
pub fn plain_engine(name: &str) -> Arc<SimEngine> {
    let mut c = SimConfig::new(name, Algorithm::all().collect(), Duration::ZERO, 1e12);
    c.timer = if REAL_ENGINES {
        SimTimer::Device
    } else {
        SimTimer::Tokio
    };
    Arc::new(SimEngine::new(c))
}

/// A profile giving every algorithm and direction on `backend` the latency
/// `fixed_ns + per_byte_ns × len`, all of it CPU time for the CPU and none
/// of it for an engine.
pub fn profile_text(backend: &str, fixed_ns: f64, per_byte_ns: f64) -> String {
    let cpu_share = if backend == "cpu" { 1.0 } else { 0.0 };
    let mut text = String::new();
    for alg in Algorithm::all() {
        for dir in [Direction::Encrypt, Direction::Decrypt] {
            if matches!(alg, Algorithm::Crc(_)) && dir == Direction::Decrypt {
                continue;
            }
            let dir = match dir {
                Direction::Encrypt => "encrypt",
                Direction::Decrypt => "decrypt",
            };
            text += &format!(
                "[[entry]]\nbackend = \"{backend}\"\nalg = \"{}\"\ndir = \"{dir}\"\n\
                 fixed_ns = {fixed_ns:?}\nper_byte_ns = {per_byte_ns:?}\n\
                 cpu_fixed_ns = {:?}\ncpu_per_byte_ns = {:?}\nparallelism = 1\n\n",
                alg.name(),
                fixed_ns * cpu_share,
                per_byte_ns * cpu_share,
            );
        }
    }
    text
}

/// Parses profile text made by [`profile_text`].
pub fn profile(text: &str) -> Profile {
    Profile::from_toml(text).expect("a well-formed profile")
}

/// The CPU model of `cpu-split`: 20 ns a byte, so 64 KiB is predicted at
/// 1.3 ms — over the 500 µs at which a request leaves the inline path — and
/// split into four parts (one per 250 µs, at most the four cores given).
pub fn slow_cpu_profile() -> Profile {
    profile(&profile_text("cpu", 100.0, 20.0))
}

/// Auto's model: the CPU at 100 ns + 1 ns/B, the engine at 1 µs + 0.1 ns/B:
/// a break-even near 1 KiB, inside the sizes the fuzzer makes, so that the
/// selector sends requests both ways (and learns from what they take).
pub fn auto_profile(engine: &str) -> Profile {
    profile(&(profile_text("cpu", 100.0, 1.0) + &profile_text(engine, 1000.0, 0.1)))
}

impl Harness {
    fn new() -> Self {
        let rt = runtime();
        let subjects = rt.block_on(build_subjects());
        for s in &subjects {
            let names: Vec<String> = s.offload.backends().into_iter().map(|b| b.name).collect();
            eprintln!("crypto-offload-fuzz: subject {} over {names:?}", s.name);
        }
        Harness { rt, subjects }
    }

    /// A harness over other subjects (made inside its runtime): the tests
    /// use it to show that a wrong backend is caught.
    pub fn with_subjects(make: impl FnOnce() -> Vec<Subject>) -> Self {
        let rt = runtime();
        let subjects = {
            let _in = rt.enter();
            make()
        };
        Harness { rt, subjects }
    }

    /// Runs `f` to completion on the harness's runtime.
    pub fn block_on<F: Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }
}

async fn build_subjects() -> Vec<Subject> {
    let mut subjects = Vec::new();
    // Every CPU implementation forced: the AES ones, and the CRC-32 ones
    // (each forces the CRC-32 it runs; the rest of its subject runs as
    // measured).
    for &imp in Implementation::ALL.iter().chain(Implementation::CRC) {
        subjects.push(Subject::new(
            format!("cpu/{}", imp.name()),
            Offload::builder()
                .cpu_implementation(imp)
                .build()
                .expect("a CPU-only Offload"),
        ));
    }
    subjects.push(Subject {
        min_len: crate::LARGE,
        ..Subject::new(
            "cpu-split",
            Offload::builder()
                .profile(slow_cpu_profile())
                .cores(4)
                .build()
                .expect("a CPU-only Offload"),
        )
    });
    subjects.push(Subject::new(
        "sim:pinned",
        Offload::builder()
            .backend(plain_engine("sim:pinned"))
            .pin("sim:pinned")
            .build()
            .expect("an Offload pinned to the simulated engine"),
    ));

    // Auto: the engines discovery finds, plus a simulated engine. The
    // profile seeds the model for the CPU and the simulated engine
    // (calibrating the simulated engine on the paused clock would measure
    // tokio's millisecond timer granularity); real engines, if any, are
    // calibrated. The real engines are discovered once and shared with
    // their pinned subjects below: a VFIO device opens only once (its
    // group is held), and an engine's power domain is its own, so two
    // `Offload`s may share it.
    let found = Offload::discover_backends().await;
    let mut builder = Offload::builder()
        .backend(plain_engine("sim:auto"))
        .profile(auto_profile("sim:auto"));
    for engine in &found {
        builder = builder.backend(engine.clone());
    }
    let auto = builder.build().expect("Auto over the engines found");
    if found.is_empty() {
        // Only the CPU and the simulated engine: a fresh model per input
        // (see `Subject::offload`), sharing the engine.
        let engine = plain_engine("sim:auto");
        let profile = auto_profile("sim:auto");
        let make = move || {
            Offload::builder()
                .backend(engine.clone())
                .profile(profile.clone())
                .build()
                .expect("Auto over the CPU and a simulated engine")
        };
        subjects.push(Subject {
            fresh: Some(Box::new(make)),
            ..Subject::new("auto", auto)
        });
    } else {
        // Real engines are measured once; Auto then learns as in service.
        auto.calibrate().await.expect("calibration");
        subjects.push(Subject::new("auto", auto));
    }
    for engine in found {
        let name = engine.name().to_owned();
        let pinned = Offload::builder()
            .backend(engine)
            .pin(name.clone())
            .build()
            .expect("an Offload pinned to an engine found");
        subjects.push(Subject::new(format!("{name} (pinned)"), pinned));
    }
    subjects
}
