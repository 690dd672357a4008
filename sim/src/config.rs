//! What a simulated engine is: its costs, queues, power and faults
//! ([`SimConfig`]), and the presets of the seed scenarios.

use std::time::Duration;

use crypto_offload::{AeadAlg, Algorithm, CipherAlg, CipherMode, CrcAlg};
use tokio::sync::Semaphore;

/// The simulated engine's power behaviour.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimPower {
    /// How long a resume takes.
    pub resume: Duration,
    /// How long the device stays on after its last reference goes.
    pub autosuspend: Duration,
    /// Take and drop the power reference around every request (the OMAP
    /// AES driver's mistake) instead of once per session.
    pub per_request: bool,
}

/// Injected faults.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SimFaults {
    /// Fraction of requests that fail with an I/O error (EIO).
    pub error_rate: f64,
    /// Fraction of requests that hang until the engine's own deadline and
    /// fail with a timeout.
    pub timeout_rate: f64,
    /// The engine's request deadline.
    pub timeout: Duration,
    /// After this many requests the device is gone: every request and open
    /// fails from then on.
    pub gone_after: Option<u64>,
    /// The fault generator's seed.
    pub seed: u64,
}

/// How the simulated device wakes a request at its modelled completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SimTimer {
    /// The engine's own queue threads, one per queue, sleep until each
    /// completion and wake the request, as an interrupt would (real time;
    /// a sleeping thread wakes ~50–100 µs late, so short latencies come out
    /// that much longer — calibration measures what they really are).
    #[default]
    Device,
    /// Tokio timers: millisecond granularity in real time, but exact and
    /// instant under tokio's paused clock — for tests.
    Tokio,
}

/// A simulated engine's costs and behaviour.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct SimConfig {
    /// The backend's name.
    pub name: String,
    /// The algorithms it runs.
    pub algorithms: Vec<Algorithm>,
    /// Fixed latency per request.
    pub latency: Duration,
    /// Bytes per second one queue processes.
    pub bandwidth: f64,
    /// Hardware queues, each serving one request at a time.
    pub queues: usize,
    /// Requests each queue holds; more wait for a slot.
    pub queue_depth: usize,
    /// CPU time the submitting thread spends per request.
    pub submit_cpu: Duration,
    /// CPU time a queue's completion handler spends per completion.
    pub completion_cpu: Duration,
    /// Power management, if any.
    pub power: Option<SimPower>,
    /// Injected faults.
    pub faults: SimFaults,
    /// How completions are delivered.
    pub timer: SimTimer,
    /// Compute real results (the default). Turned off, requests come back
    /// unchanged: only for capacity measurements in which the simulator's own
    /// CPU work — every simulated byte also computed by the CPU code — would
    /// be charged to the CPU it is measured against, which a real engine's
    /// bytes are not.
    pub compute_results: bool,
}

fn ciphers(modes: &[CipherMode]) -> impl Iterator<Item = Algorithm> + '_ {
    CipherAlg::ALL
        .into_iter()
        .filter(move |a| modes.contains(&a.mode()))
        .map(Algorithm::Cipher)
}

impl SimConfig {
    /// The presets, by name.
    pub const PRESETS: [&'static str; 4] = ["omap", "qce", "mcrc64", "eip197"];

    /// An engine with the given costs and no power management or faults.
    pub fn new(
        name: impl Into<String>,
        algorithms: Vec<Algorithm>,
        latency: Duration,
        bandwidth: f64,
    ) -> Self {
        SimConfig {
            name: name.into(),
            algorithms,
            latency,
            bandwidth,
            queues: 1,
            queue_depth: 32,
            submit_cpu: Duration::ZERO,
            completion_cpu: Duration::ZERO,
            power: None,
            faults: SimFaults::default(),
            timer: SimTimer::default(),
            compute_results: true,
        }
    }

    /// A preset reproducing one of the seed scenarios:
    ///
    /// * `omap` — TI OMAP AES (CBC, CTR): 45 MB/s, 40 µs a request, one
    ///   queue of one, a 120 µs resume and a 1 s autosuspend.
    /// * `qce` — Qualcomm Crypto Engine / AMCC crypto4xx (CBC, CTR, XTS):
    ///   500 MB/s, 25 µs — 5–10× slower than this CPU single-stream.
    /// * `mcrc64` — TI MCRC64 (CRC-64/NVME): 25 ms of setup a request,
    ///   812 MB/s.
    /// * `eip197` — Inside-Secure EIP-197 (GCM, CBC, CTR): 4 rings of
    ///   2.5 GB/s, 8 µs a request, 4 µs of interrupt handling a completion.
    pub fn preset(name: &str) -> Option<Self> {
        let mib = 1024.0 * 1024.0;
        let us = Duration::from_micros;
        Some(match name {
            "omap" => SimConfig {
                queue_depth: 1,
                submit_cpu: us(5),
                completion_cpu: us(2),
                power: Some(SimPower {
                    resume: us(120),
                    autosuspend: Duration::from_secs(1),
                    per_request: false,
                }),
                ..SimConfig::new(
                    "sim:omap",
                    ciphers(&[CipherMode::Cbc, CipherMode::Ctr]).collect(),
                    us(40),
                    45.0 * mib,
                )
            },
            "qce" => SimConfig {
                submit_cpu: us(3),
                completion_cpu: us(1),
                ..SimConfig::new(
                    "sim:qce",
                    ciphers(&[CipherMode::Cbc, CipherMode::Ctr, CipherMode::Xts]).collect(),
                    us(25),
                    500.0 * mib,
                )
            },
            "mcrc64" => SimConfig {
                queue_depth: 4,
                submit_cpu: us(15),
                completion_cpu: us(2),
                ..SimConfig::new(
                    "sim:mcrc64",
                    vec![Algorithm::Crc(CrcAlg::Crc64Nvme)],
                    Duration::from_millis(25),
                    812e6,
                )
            },
            "eip197" => SimConfig {
                queues: 4,
                queue_depth: 64,
                submit_cpu: us(1),
                completion_cpu: us(4),
                ..SimConfig::new(
                    "sim:eip197",
                    AeadAlg::ALL
                        .into_iter()
                        .map(Algorithm::Aead)
                        .chain(ciphers(&[CipherMode::Cbc, CipherMode::Ctr]))
                        .collect(),
                    us(8),
                    2500.0 * mib,
                )
            },
            _ => return None,
        })
    }

    /// The service time of a `len`-byte request (without queueing), at most
    /// a year.
    pub fn service_time(&self, len: usize) -> Duration {
        let transfer =
            Duration::try_from_secs_f64(len as f64 / self.bandwidth.max(1.0)).unwrap_or(FAR);
        self.latency.saturating_add(transfer).min(FAR)
    }

    /// Settings out of range brought into it, so no setting can make the
    /// engine panic: at least one queue and one slot, at most
    /// [`MAX_QUEUES`](Self::MAX_QUEUES) queues and as many slots as a
    /// semaphore holds, times of at most a year.
    pub(crate) fn normalized(mut self) -> Self {
        self.queues = self.queues.clamp(1, Self::MAX_QUEUES);
        self.queue_depth = self
            .queue_depth
            .clamp(1, Semaphore::MAX_PERMITS / self.queues);
        self.latency = self.latency.min(FAR);
        self.faults.timeout = self.faults.timeout.min(FAR);
        self.submit_cpu = self.submit_cpu.min(FAR);
        self.completion_cpu = self.completion_cpu.min(FAR);
        self
    }

    /// The most queues an engine has (each is a thread with
    /// [`SimTimer::Device`]).
    pub const MAX_QUEUES: usize = 1024;
}

/// The longest time the model deals in: a year (longer settings are cut to
/// it, so that no instant arithmetic can overflow).
pub(crate) const FAR: Duration = Duration::from_secs(365 * 24 * 3600);
