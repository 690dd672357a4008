//! A simulated engine: a [`Backend`] whose costs are configured, for tests,
//! benchmarks and examples — not a substitute for the real backends.
//!
//! It models an engine with `queues` hardware queues (rings), each serving
//! one request at a time in order, holding up to `queue_depth` requests. A
//! request costs the submitting thread `submit_cpu` of real CPU time (the
//! driver's share), waits for its queue, is served in `latency + len /
//! bandwidth`, and costs its queue's completion handler `completion_cpu`
//! (the interrupt's share: with one queue every completion is handled in
//! turn, with several they spread over the worker threads, as EIP-197's
//! rings spread over CPUs). Results are real: they are computed by the CPU
//! code when the request completes (a few per cent of the modelled time for
//! engines slower than the CPU). Waiting is a tokio timer, so no worker
//! thread is held while the "device" works, and tests on tokio's paused
//! clock are exact and instant.
//!
//! A request whose future is dropped is still finished by the device, which
//! keeps its queue slot, power reference and buffer until the modelled
//! completion, as a DMA engine must ([`SimEngine::in_flight`] counts them,
//! [`SimEngine::idle`] waits for them).
//!
//! It has a [`PowerDomain`] (resume latency, autosuspend) whose reference its
//! contexts hold — or, in `per_request` mode, each request takes and drops,
//! as the OMAP AES driver did before it was fixed — and fault injection:
//! an error rate, a timeout rate, and a "device gone" point after which
//! every request and every open fails.

use core::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use crypto_offload_fallback as fb;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::alg::{AeadAlg, Algorithm, CipherAlg, CipherMode, CrcAlg};
use crate::backend::{
    AeadContext, Backend, BackendKind, CipherContext, CipherParams, CrcContext, Failed, Limits,
};
use crate::buffer::IoBuf;
use crate::cpu::{CpuBackend, CpuCipher};
use crate::error::BackendError;
use crate::key::SecretKey;
use crate::power::{PowerControl, PowerDomain, PowerRef};

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
    fn normalized(mut self) -> Self {
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

/// A simulated engine. Create it inside a tokio runtime.
pub struct SimEngine {
    shared: Arc<Shared>,
}

struct Shared {
    config: SimConfig,
    cpu: CpuBackend,
    queues: Vec<Queue>,
    /// With `SimTimer::Device`: each queue's completion thread.
    devices: Vec<Arc<Device>>,
    slots: Arc<Semaphore>,
    power: Option<PowerDomain>,
    requests: AtomicU64,
    gone: AtomicBool,
    rng: AtomicU64,
}

struct Queue {
    /// When the queue finishes the last request given to it.
    free_at: Mutex<Instant>,
    /// Held while a completion is handled (the queue's interrupt).
    completion: Mutex<()>,
}

impl fmt::Debug for SimEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimEngine")
            .field("config", &self.shared.config)
            .field("requests", &self.requests())
            .finish()
    }
}

/// The simulated power switch: a resume takes `resume`.
struct SimSwitch {
    resume: Duration,
    timer: SimTimer,
}

#[async_trait]
impl PowerControl for SimSwitch {
    async fn power_on(&self) -> Result<(), BackendError> {
        match self.timer {
            SimTimer::Tokio => tokio::time::sleep(self.resume).await,
            // A thread's sleep is ~60 µs precise, a tokio timer 1 ms.
            SimTimer::Device => {
                let d = self.resume;
                tokio::task::spawn_blocking(move || std::thread::sleep(d))
                    .await
                    .map_err(|e| BackendError::Other(Box::new(e)))?;
            }
        }
        Ok(())
    }
    async fn power_off(&self) -> Result<(), BackendError> {
        Ok(())
    }
}

/// The longest time the model deals in: a year (longer settings are cut to
/// it, so that no instant arithmetic can overflow).
const FAR: Duration = Duration::from_secs(365 * 24 * 3600);

/// Spends `d` of real CPU time on this thread.
fn spin(d: Duration) {
    if d.is_zero() {
        return;
    }
    let start = std::time::Instant::now();
    while start.elapsed() < d {
        std::hint::spin_loop();
    }
}

enum Fate {
    Complete,
    Error,
    Hang,
    Gone,
}

impl SimEngine {
    /// An engine with `config`.
    pub fn new(config: SimConfig) -> Self {
        let config = config.normalized();
        let power = config.power.map(|p| {
            let delay = if p.per_request {
                Duration::ZERO
            } else {
                p.autosuspend
            };
            let switch = SimSwitch {
                resume: p.resume,
                timer: config.timer,
            };
            PowerDomain::new(config.name.clone(), switch, delay)
        });
        let now = Instant::now();
        let queues = (0..config.queues)
            .map(|_| Queue {
                free_at: Mutex::new(now),
                completion: Mutex::new(()),
            })
            .collect();
        let slots = Arc::new(Semaphore::new(config.queues * config.queue_depth));
        let seed = config.faults.seed | 1;
        let devices = match config.timer {
            SimTimer::Tokio => Vec::new(),
            SimTimer::Device => (0..config.queues)
                .map(|q| Device::start(format!("{}-q{q}", config.name), config.completion_cpu))
                .collect(),
        };
        SimEngine {
            shared: Arc::new(Shared {
                config,
                cpu: CpuBackend::new(),
                queues,
                devices,
                slots,
                power,
                requests: AtomicU64::new(0),
                gone: AtomicBool::new(false),
                rng: AtomicU64::new(seed),
            }),
        }
    }

    /// A preset (see [`SimConfig::preset`]).
    pub fn preset(name: &str) -> Option<Self> {
        SimConfig::preset(name).map(SimEngine::new)
    }

    /// The configuration.
    pub fn config(&self) -> &SimConfig {
        &self.shared.config
    }

    /// Requests submitted so far.
    pub fn requests(&self) -> u64 {
        self.shared.requests.load(Ordering::Relaxed)
    }

    /// Requests holding a slot on the device now: submitted and not yet
    /// completed, including those whose request future was dropped (the
    /// device still finishes them, and keeps their buffers until then).
    /// Requests waiting for a free slot are not counted. A slot that is
    /// never given back shows here, so tests of cancellation watch it
    /// return to 0.
    pub fn in_flight(&self) -> usize {
        let c = &self.shared.config;
        c.queues * c.queue_depth - self.shared.slots.available_permits()
    }

    /// Waits until the device holds no request ([`in_flight`] is 0): every
    /// request submitted so far has completed, and the buffers of those
    /// whose request futures were dropped have been freed. Requests
    /// submitted meanwhile wait behind it (the slots are handed out in
    /// order). For tests: the signal that the device is done, where a
    /// sleep would only guess.
    ///
    /// [`in_flight`]: Self::in_flight
    pub async fn idle(&self) {
        let c = &self.shared.config;
        let mut all = c.queues * c.queue_depth;
        let mut taken = Vec::new();
        while all > 0 {
            let n = u32::try_from(all).unwrap_or(u32::MAX);
            match self.shared.slots.acquire_many(n).await {
                Ok(p) => taken.push(p),
                Err(_) => return,
            }
            all -= n as usize;
        }
    }

    /// Makes the device vanish (or come back), as a hot-unplug would.
    pub fn set_gone(&self, gone: bool) {
        self.shared.gone.store(gone, Ordering::Relaxed);
    }
}

impl Shared {
    fn random(&self) -> f64 {
        let mut x = self.rng.load(Ordering::Relaxed);
        loop {
            let mut y = x;
            y ^= y << 13;
            y ^= y >> 7;
            y ^= y << 17;
            match self
                .rng
                .compare_exchange_weak(x, y, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return (y >> 11) as f64 / (1u64 << 53) as f64,
                Err(now) => x = now,
            }
        }
    }

    fn fate(&self) -> Fate {
        let n = self.requests.fetch_add(1, Ordering::Relaxed) + 1;
        let f = &self.config.faults;
        if f.gone_after.is_some_and(|g| n > g) {
            self.gone.store(true, Ordering::Relaxed);
        }
        if self.gone.load(Ordering::Relaxed) {
            return Fate::Gone;
        }
        if f.error_rate > 0.0 || f.timeout_rate > 0.0 {
            let r = self.random();
            if r < f.error_rate {
                return Fate::Error;
            }
            if r < f.error_rate + f.timeout_rate {
                return Fate::Hang;
            }
        }
        Fate::Complete
    }

    /// Puts a request on the least busy queue: its completion time.
    fn schedule(&self, len: usize) -> (usize, Instant) {
        let now = Instant::now();
        let service = self.config.service_time(len);
        let (q, _) = self
            .queues
            .iter()
            .enumerate()
            .map(|(i, q)| (i, *q.free_at.lock().unwrap_or_else(|p| p.into_inner())))
            .min_by_key(|&(_, t)| t)
            .unwrap_or((0, now));
        let mut free = self.queues[q]
            .free_at
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let done = (*free).max(now) + service;
        *free = done;
        (q, done)
    }

    async fn session_power(&self) -> Result<Option<PowerRef>, BackendError> {
        match (&self.power, self.config.power) {
            (Some(d), Some(p)) if !p.per_request => Ok(Some(d.acquire().await?)),
            _ => Ok(None),
        }
    }

    /// Runs one request through the model; `compute` makes the real result
    /// in place when it completes. On any failure `buf` comes back unchanged.
    async fn run<T: Default>(
        self: &Arc<Self>,
        power: &Option<PowerRef>,
        buf: IoBuf,
        compute: impl FnOnce(&mut [u8]) -> Result<T, fb::Error>,
    ) -> Result<(IoBuf, T), Failed> {
        if self.gone.load(Ordering::Relaxed) {
            return Err(Failed::new(BackendError::DeviceGone, buf));
        }
        let Ok(permit) = self.slots.clone().acquire_owned().await else {
            return Err(Failed::new(BackendError::DeviceGone, buf));
        };
        // Per session: a clone of the session's reference. Per request (the
        // OMAP mistake): a resume now and a synchronous suspend at the end.
        let per_request = self.config.power.is_some_and(|p| p.per_request);
        let hold = match (power, &self.power) {
            (Some(r), _) => Some(r.clone()),
            (None, Some(d)) if per_request => match d.acquire().await {
                Ok(r) => Some(r),
                Err(e) => return Err(Failed::new(e, buf)),
            },
            _ => None,
        };
        spin(self.config.submit_cpu);
        let fate = self.fate();
        let (queue, done) = self.schedule(buf.len());
        if matches!(fate, Fate::Gone) {
            return Err(Failed::new(BackendError::DeviceGone, buf));
        }
        let hung = matches!(fate, Fate::Hang);
        // The device holds the request (and, like a DMA, its buffer) until
        // its completion, or until its own deadline for one that hangs.
        let wake = if hung {
            Instant::now() + self.config.faults.timeout
        } else {
            done
        };
        // Per-request power is released by the request itself, synchronously,
        // once the device has let go of its clone at the completion. If the
        // request is cancelled, that clone keeps the device up until then.
        let own = if per_request { hold.clone() } else { None };
        let held = (hold, Some(permit));
        let mut buf = match &self.devices.get(queue) {
            None => {
                let in_flight = InFlight {
                    held,
                    buf,
                    until: wake,
                    finished: false,
                };
                tokio::time::sleep_until(wake).await;
                if !hung {
                    let _irq = self.queues[queue]
                        .completion
                        .lock()
                        .unwrap_or_else(|p| p.into_inner());
                    spin(self.config.completion_cpu);
                }
                in_flight.complete()
            }
            Some(device) => {
                // The device thread keeps the request's power, slot and
                // buffer until the completion, even if this future is
                // dropped; the buffer is then freed there.
                let dma = Arc::new(Mutex::new(buf));
                let rx = device.submit(wake.into_std(), hung, held, dma.clone());
                let answered = rx.await.is_ok();
                let buf = core::mem::replace(&mut *lock(&dma), IoBuf::from(Vec::new()));
                if !answered {
                    return Err(Failed::new(BackendError::DeviceGone, buf));
                }
                buf
            }
        };
        if let Some(r) = own {
            r.put_sync().await;
        }
        if hung {
            return Err(Failed::new(BackendError::Timeout, buf));
        }
        if matches!(fate, Fate::Error) {
            let eio = std::io::Error::from_raw_os_error(5);
            return Err(Failed::new(
                BackendError::Io {
                    op: "sim request",
                    source: eio,
                },
                buf,
            ));
        }
        if !self.config.compute_results {
            return Ok((buf, T::default()));
        }
        match compute(buf.as_mut_slice()) {
            Ok(t) => Ok((buf, t)),
            Err(fb::Error::Authentication) => Err(Failed::new(BackendError::Authentication, buf)),
            Err(e) => Err(Failed::new(BackendError::Other(Box::new(e)), buf)),
        }
    }
}

/// What a request holds while the "device" works on it (with
/// [`SimTimer::Tokio`]). If the request is cancelled, the device still
/// finishes: the buffer, the power reference and the queue slot stay taken
/// until the modelled completion, as a DMA would keep them; the buffer is
/// freed first, so that a free slot means its buffer is gone too.
struct InFlight {
    held: Held,
    buf: IoBuf,
    until: Instant,
    finished: bool,
}

/// A request's power reference and queue slot.
type Held = (Option<PowerRef>, Option<OwnedSemaphorePermit>);

impl InFlight {
    /// The device completed the request: it lets go of the power and the
    /// slot, and hands the buffer back.
    fn complete(mut self) -> IoBuf {
        self.finished = true;
        drop(core::mem::take(&mut self.held));
        core::mem::replace(&mut self.buf, IoBuf::from(Vec::new()))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let held = core::mem::take(&mut self.held);
        let buf = core::mem::replace(&mut self.buf, IoBuf::from(Vec::new()));
        let until = self.until;
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                tokio::time::sleep_until(until).await;
                drop(buf);
                drop(held);
            });
        }
    }
}

/// The lock of a request's buffer shared with the device thread.
fn lock(dma: &Mutex<IoBuf>) -> std::sync::MutexGuard<'_, IoBuf> {
    dma.lock().unwrap_or_else(|p| p.into_inner())
}

/// A queue's completion thread (`SimTimer::Device`): it sleeps until each
/// request's modelled completion, spends the completion's CPU time (the
/// interrupt handler's share), releases what the request held and wakes it.
struct Device {
    state: Mutex<DeviceState>,
    wake: std::sync::Condvar,
}

#[derive(Default)]
struct DeviceState {
    /// Completions in order (a queue serves in order, so `done` rises).
    pending: std::collections::VecDeque<Completion>,
    stop: bool,
}

struct Completion {
    done: std::time::Instant,
    hung: bool,
    held: Held,
    /// The request's buffer, shared with the request: if the request was
    /// dropped, the device's is the last reference and frees it.
    dma: Arc<Mutex<IoBuf>>,
    tx: tokio::sync::oneshot::Sender<()>,
}

impl Device {
    fn start(name: String, completion_cpu: Duration) -> Arc<Device> {
        let device = Arc::new(Device {
            state: Mutex::new(DeviceState::default()),
            wake: std::sync::Condvar::new(),
        });
        let d = device.clone();
        let spawned = std::thread::Builder::new()
            .name(name)
            .spawn(move || d.run(completion_cpu));
        if spawned.is_err() {
            // No thread: every request fails as if the device were gone.
            device.lock().stop = true;
        }
        device
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, DeviceState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn submit(
        &self,
        done: std::time::Instant,
        hung: bool,
        held: Held,
        dma: Arc<Mutex<IoBuf>>,
    ) -> tokio::sync::oneshot::Receiver<()> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let mut state = self.lock();
        if !state.stop {
            // A hung request does not hold up the queue's later completions.
            let at = state
                .pending
                .iter()
                .position(|c| c.done > done)
                .unwrap_or(state.pending.len());
            state.pending.insert(
                at,
                Completion {
                    done,
                    hung,
                    held,
                    dma,
                    tx,
                },
            );
            drop(state);
            self.wake.notify_one();
        }
        rx
    }

    fn run(&self, completion_cpu: Duration) {
        let mut state = self.lock();
        loop {
            if state.stop {
                return;
            }
            let now = std::time::Instant::now();
            match state.pending.front().map(|c| c.done) {
                None => state = self.wake.wait(state).unwrap_or_else(|p| p.into_inner()),
                Some(done) if done > now => {
                    state = self
                        .wake
                        .wait_timeout(state, done - now)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
                Some(_) => {
                    let Some(c) = state.pending.pop_front() else {
                        continue;
                    };
                    drop(state);
                    if !c.hung {
                        spin(completion_cpu);
                    }
                    // A dropped request's buffer goes before its slot, so
                    // that a free slot means its buffer is gone too.
                    drop(c.dma);
                    drop(c.held);
                    let _ = c.tx.send(());
                    state = self.lock();
                }
            }
        }
    }

    fn stop(&self) {
        self.lock().stop = true;
        self.wake.notify_all();
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        for d in &self.devices {
            d.stop();
        }
    }
}

struct SimCipher {
    shared: Arc<Shared>,
    cpu: Arc<CpuCipher>,
    power: Option<PowerRef>,
}

#[async_trait]
impl CipherContext for SimCipher {
    async fn encrypt(&self, params: CipherParams, buf: IoBuf) -> Result<IoBuf, Failed> {
        let cpu = &self.cpu;
        let (buf, ()) = self
            .shared
            .run(&self.power, buf, |d| cpu.run(true, &params, d))
            .await?;
        Ok(buf)
    }
    async fn decrypt(&self, params: CipherParams, buf: IoBuf) -> Result<IoBuf, Failed> {
        let cpu = &self.cpu;
        let (buf, ()) = self
            .shared
            .run(&self.power, buf, |d| cpu.run(false, &params, d))
            .await?;
        Ok(buf)
    }
}

struct SimAead {
    shared: Arc<Shared>,
    cpu: fb::Gcm,
    power: Option<PowerRef>,
}

#[async_trait]
impl AeadContext for SimAead {
    async fn seal(
        &self,
        nonce: [u8; 12],
        aad: &[u8],
        buf: IoBuf,
    ) -> Result<(IoBuf, [u8; 16]), Failed> {
        let cpu = &self.cpu;
        self.shared
            .run(&self.power, buf, |d| {
                cpu.seal_in_place_detached(&nonce, aad, d)
            })
            .await
    }
    async fn open(
        &self,
        nonce: [u8; 12],
        aad: &[u8],
        buf: IoBuf,
        tag: [u8; 16],
    ) -> Result<IoBuf, Failed> {
        let cpu = &self.cpu;
        let (buf, ()) = self
            .shared
            .run(&self.power, buf, |d| {
                cpu.open_in_place_detached(&nonce, aad, d, &tag)
            })
            .await?;
        Ok(buf)
    }
}

struct SimCrc {
    shared: Arc<Shared>,
    alg: CrcAlg,
    power: Option<PowerRef>,
}

#[async_trait]
impl CrcContext for SimCrc {
    async fn checksum(&self, buf: IoBuf) -> Result<(IoBuf, u64), Failed> {
        let alg = self.alg;
        self.shared
            .run(&self.power, buf, |d| Ok(fb::checksum(alg, d)))
            .await
    }
}

fn unsupported(alg: Algorithm) -> BackendError {
    BackendError::Unsupported(alg.name().to_owned())
}

impl Shared {
    fn check_open(&self, alg: Algorithm) -> Result<(), BackendError> {
        if self.gone.load(Ordering::Relaxed) {
            return Err(BackendError::DeviceGone);
        }
        if !self.config.algorithms.contains(&alg) {
            return Err(unsupported(alg));
        }
        Ok(())
    }
}

#[async_trait]
impl Backend for SimEngine {
    fn name(&self) -> &str {
        &self.shared.config.name
    }

    fn kind(&self) -> BackendKind {
        BackendKind::Other
    }

    fn limits(&self, alg: Algorithm) -> Option<Limits> {
        let c = &self.shared.config;
        if !c.algorithms.contains(&alg) {
            return None;
        }
        let limits = Limits::new().with_queue_depth(c.queues * c.queue_depth);
        // Computing real results is the simulator's own CPU work, which the
        // modelled engine would not do: declare the model's cost instead of
        // letting calibration measure it. Without results there is no such
        // artefact, and calibration measures what requests really cost.
        Some(if c.compute_results {
            limits.with_cpu_cost(c.submit_cpu.saturating_add(c.completion_cpu), 0.0)
        } else {
            limits
        })
    }

    fn power(&self) -> Option<&PowerDomain> {
        self.shared.power.as_ref()
    }

    async fn open_cipher(
        &self,
        alg: CipherAlg,
        key: &SecretKey,
    ) -> Result<Box<dyn CipherContext>, BackendError> {
        self.shared.check_open(alg.into())?;
        let cpu = self
            .shared
            .cpu
            .cipher(alg, key.expose())
            .map_err(|e| BackendError::Other(Box::new(e)))?;
        Ok(Box::new(SimCipher {
            shared: self.shared.clone(),
            cpu: Arc::new(cpu),
            power: self.shared.session_power().await?,
        }))
    }

    async fn open_aead(
        &self,
        alg: AeadAlg,
        key: &SecretKey,
    ) -> Result<Box<dyn AeadContext>, BackendError> {
        self.shared.check_open(alg.into())?;
        let cpu = self
            .shared
            .cpu
            .aead(alg, key.expose())
            .map_err(|e| BackendError::Other(Box::new(e)))?;
        Ok(Box::new(SimAead {
            shared: self.shared.clone(),
            cpu,
            power: self.shared.session_power().await?,
        }))
    }

    async fn open_crc(&self, alg: CrcAlg) -> Result<Box<dyn CrcContext>, BackendError> {
        self.shared.check_open(alg.into())?;
        Ok(Box::new(SimCrc {
            shared: self.shared.clone(),
            alg,
            power: self.shared.session_power().await?,
        }))
    }
}
