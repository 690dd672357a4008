//! `Offload`: the set of backends sessions run on, as a value.

use core::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crypto_offload_fallback::Implementation;

use crate::alg::{AeadAlg, Algorithm, CipherAlg, CrcAlg};
use crate::backend::{BackendKind, SharedBackend};
use crate::breaker::Breaker;
use crate::cost::{Direction, Model, Profile, ProfileEntry};
use crate::cpu::CpuBackend;
use crate::error::{BackendError, Error};
use crate::power::PowerStats;
use crate::select::{Explanation, Policy};
use crate::session::{AeadSession, CipherSession, CrcSession};

/// The engines this process may use, and the policy for choosing among them.
///
/// A plain value, like a rustls `CryptoProvider`: build one with
/// [`Offload::discover`] or [`Offload::builder`], and hand it (or clones of
/// it — cloning is an `Arc` bump) to whatever opens sessions. There is no
/// hidden global. `Offload` is `Send + Sync`.
///
/// The CPU backend is always present and runs every algorithm. With other
/// backends, each request goes where the cost model and the [`Policy`] say
/// ([`explain`](Offload::explain) shows why), unless sessions are pinned.
#[derive(Clone)]
pub struct Offload {
    inner: Arc<Inner>,
}

/// Slot 0 is the CPU; slot `i > 0` is `backends[i - 1]`.
pub(crate) struct Inner {
    pub(crate) cpu: CpuBackend,
    pub(crate) backends: Vec<SharedBackend>,
    /// The slot every session is pinned to, if any.
    pub(crate) pinned: Option<usize>,
    pub(crate) policy: Policy,
    pub(crate) models: Vec<Model>,
    pub(crate) breakers: Vec<Breaker>,
    pub(crate) stats: Vec<Counters>,
    /// Cores the CPU path may use at once.
    pub(crate) cores: usize,
    pub(crate) probe_interval: Duration,
    /// `supported[slot][algorithm index]`, asked of each backend once.
    pub(crate) supported: Vec<Box<[bool]>>,
    /// `max_request[slot][algorithm index]`: the largest request the backend
    /// takes (`usize::MAX` for no limit), asked once.
    pub(crate) max_request: Vec<Box<[usize]>>,
    /// `per_unit[slot][algorithm index]`: the backend takes one data unit
    /// per operation (see [`crate::Backend::one_operation_per_unit`]).
    pub(crate) per_unit: Vec<Box<[bool]>>,
    /// `multiple[slot][algorithm index]`: the lengths (or data units) the
    /// backend takes are multiples of this (see
    /// [`crate::Backend::length_multiple`]).
    pub(crate) multiple: Vec<Box<[usize]>>,
    /// Per (algorithm, direction): requests shorter than this run on the CPU
    /// under the Latency policy without weighing the engines (kept by
    /// [`Inner::refresh_cpu_bound`]).
    pub(crate) cpu_bound: Box<[AtomicU64]>,
}

/// Per-slot counters.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) requests: AtomicU64,
    pub(crate) bytes: AtomicU64,
    pub(crate) failures: AtomicU64,
    pub(crate) replayed: AtomicU64,
}

impl Counters {
    #[inline]
    pub(crate) fn served(&self, len: usize) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(len as u64, Ordering::Relaxed);
    }
}

/// One backend of an `Offload`, as [`Offload::backends`] lists it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct BackendInfo {
    /// The backend's name.
    pub name: String,
    /// What kind of engine it is.
    pub kind: BackendKind,
    /// The algorithms it runs.
    pub algorithms: Vec<Algorithm>,
    /// Whether sessions are pinned to it.
    pub pinned: bool,
    /// Why the selector is not using it now (circuit open, uncalibrated), if
    /// it is not.
    pub unavailable: Option<String>,
    /// Its device's power state and transitions, if it has power management.
    pub power: Option<PowerStats>,
    /// What it has served.
    pub stats: BackendStats,
}

/// What one backend has served.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BackendStats {
    /// Requests completed on it.
    pub requests: u64,
    /// Bytes of those requests.
    pub bytes: u64,
    /// Requests it failed (each completed elsewhere).
    pub failures: u64,
    /// Requests it completed for another backend that had failed them
    /// (the CPU's count).
    pub replayed: u64,
    /// Times its circuit breaker opened.
    pub breaker_opened: u64,
    /// Times a probe closed it again.
    pub breaker_closed: u64,
}

impl Offload {
    /// A builder, starting from the CPU backend alone.
    pub fn builder() -> OffloadBuilder {
        OffloadBuilder::default()
    }

    /// Every compiled-in backend that works on this machine, plus the CPU,
    /// calibrated when there is more than the CPU to choose from.
    ///
    /// With the `af-alg` feature, every hardware engine the kernel offers
    /// through AF_ALG joins ([`AfAlgBackend::discover`](crate::AfAlgBackend::discover));
    /// with `vfio`, every virtio-crypto device bound to `vfio-pci`
    /// ([`VfioBackend::discover`](crate::VfioBackend::discover)). A backend that is compiled
    /// in but unavailable here (no AF_ALG, no device, no permission) is left
    /// out, never an error.
    ///
    /// # Errors
    /// None today; the signature leaves room for a probe that must fail
    /// loudly (a malformed explicit configuration).
    ///
    /// # Cancel safety
    /// Dropping the future before it completes leaves nothing behind.
    pub async fn discover() -> Result<Offload, Error> {
        Offload::discover_with(Offload::builder()).await
    }

    /// [`discover`](Offload::discover) on top of `builder`: every
    /// compiled-in backend that works here joins the backends, policy, pin
    /// and profile `builder` already has, and the result is calibrated when
    /// there is more than the CPU (unless a profile was given). For servers
    /// that take a policy or a forced backend from their command line.
    ///
    /// ```
    /// # futures::executor::block_on(async {
    /// use crypto_offload::{Offload, Policy};
    ///
    /// let offload = Offload::discover_with(Offload::builder().policy(Policy::Throughput)).await?;
    /// assert_eq!(offload.policy(), Policy::Throughput);
    /// # Ok::<(), crypto_offload::Error>(()) });
    /// ```
    ///
    /// # Errors
    /// As for [`OffloadBuilder::build`]: a pin naming no backend, a name
    /// registered twice.
    ///
    /// # Cancel safety
    /// Dropping the future before it completes leaves nothing behind.
    pub async fn discover_with(builder: OffloadBuilder) -> Result<Offload, Error> {
        let mut builder = builder;
        for engine in Offload::discover_engines().await {
            builder = builder.backend(engine);
        }
        let profiled = builder.profile.is_some();
        let offload = builder.build()?;
        // With the CPU alone there is nothing to choose between.
        if !offload.inner.backends.is_empty() && !profiled {
            offload.calibrate().await?;
        }
        Ok(offload)
    }

    /// The engines [`discover`](Offload::discover) adds, each opened once:
    /// every compiled-in AF_ALG engine and VFIO device that works here (none
    /// without the `af-alg` and `vfio` features). For callers that share an
    /// engine among several `Offload`s — a pinned one beside an Auto one, as
    /// the fuzz harness does: a VFIO device opens only once (its group is
    /// held), and an engine's power domain is its own.
    ///
    /// # Cancel safety
    /// Dropping the future before it completes leaves nothing behind.
    pub async fn discover_engines() -> Vec<SharedBackend> {
        #[allow(unused_mut)]
        let mut found: Vec<SharedBackend> = Vec::new();
        #[cfg(feature = "af-alg")]
        if let Ok(engines) = crate::AfAlgBackend::discover() {
            found.extend(
                engines
                    .into_iter()
                    .map(|e| std::sync::Arc::new(e) as SharedBackend),
            );
        }
        #[cfg(feature = "vfio")]
        if let Ok(devices) = crate::VfioBackend::discover().await {
            found.extend(
                devices
                    .into_iter()
                    .map(|d| std::sync::Arc::new(d) as SharedBackend),
            );
        }
        found
    }

    /// Measures every backend's costs for every algorithm it runs (bounded:
    /// about 200 ms of wall time per backend), replacing the model's
    /// entries. Engines are only chosen once calibrated (or loaded from a
    /// [`Profile`]).
    ///
    /// # Errors
    /// None today: a backend that fails during calibration stays
    /// uncalibrated and its breaker opens.
    ///
    /// # Cancel safety
    /// Dropping the future leaves the entries measured so far in place.
    pub async fn calibrate(&self) -> Result<(), Error> {
        crate::calibrate::run(self).await;
        Ok(())
    }

    /// The measured model, as a profile to save and load later.
    pub fn profile(&self) -> Profile {
        let inner = &self.inner;
        let mut entries = Vec::new();
        for (slot, model) in inner.models.iter().enumerate() {
            for (k, e) in model.entries.iter().enumerate() {
                let Some(cost) = e.cost() else { continue };
                let (alg, dir) = crate::cost::unkey(k);
                entries.push(ProfileEntry {
                    backend: inner.slot_name(slot).to_owned(),
                    alg: alg.name().to_owned(),
                    dir,
                    cost,
                    resume_ns: model.resume_ns.get(),
                });
            }
        }
        Profile { entries }
    }

    /// Which backend a `len`-byte request of `alg` would run on now, and
    /// every candidate's predicted latency and CPU time.
    pub fn explain(&self, alg: impl Into<Algorithm>, dir: Direction, len: usize) -> Explanation {
        self.inner.explain(alg.into(), dir, len)
    }

    /// The smallest request size at which the selector would leave the CPU
    /// for an engine with nothing in flight (under the current policy), if
    /// any size up to 1 GiB would. (Found between the first power of two
    /// that leaves the CPU and the one before it.)
    pub fn break_even(&self, alg: impl Into<Algorithm>, dir: Direction) -> Option<usize> {
        let alg = alg.into();
        let on_engine = |len| self.inner.choose(alg, dir, len).0 != 0;
        // The first power of two that leaves the CPU, then bisect below it.
        let mut hi = (0..=30).map(|k| 1usize << k).find(|&len| on_engine(len))?;
        let mut lo = hi / 2;
        if lo == 0 {
            return Some(hi);
        }
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if on_engine(mid) { hi = mid } else { lo = mid }
        }
        Some(hi)
    }

    /// The policy.
    pub fn policy(&self) -> Policy {
        self.inner.policy
    }

    /// Opens a cipher session for `alg` keyed with `key`.
    ///
    /// # Errors
    /// [`Error::KeyLength`] unless `key` is `alg.key_len()` bytes;
    /// [`Error::WeakKey`] for an XTS key with equal halves;
    /// [`Error::Unsupported`] / [`Error::Backend`] if the pinned backend
    /// cannot run it.
    ///
    /// # Cancel safety
    /// Dropping the future before it completes opens nothing.
    pub async fn cipher(&self, alg: CipherAlg, key: &[u8]) -> Result<CipherSession, Error> {
        CipherSession::start(self.clone(), alg, key).await
    }

    /// Opens an AEAD session for `alg` keyed with `key`.
    ///
    /// # Errors
    /// As for [`Offload::cipher`].
    ///
    /// # Cancel safety
    /// Dropping the future before it completes opens nothing.
    pub async fn aead(&self, alg: AeadAlg, key: &[u8]) -> Result<AeadSession, Error> {
        AeadSession::start(self.clone(), alg, key).await
    }

    /// Opens a CRC session for `alg`.
    ///
    /// # Errors
    /// [`Error::Unsupported`] / [`Error::Backend`] if the pinned backend
    /// cannot run it.
    ///
    /// # Cancel safety
    /// Dropping the future before it completes opens nothing.
    pub async fn crc(&self, alg: CrcAlg) -> Result<CrcSession, Error> {
        CrcSession::start(self.clone(), alg).await
    }

    /// The backends, CPU first, with their state and what they served.
    pub fn backends(&self) -> Vec<BackendInfo> {
        let inner = &self.inner;
        (0..=inner.backends.len())
            .map(|slot| {
                let (kind, algorithms, power) = if slot == 0 {
                    (BackendKind::Cpu, Algorithm::all().collect(), None)
                } else {
                    let b = &inner.backends[slot - 1];
                    (
                        b.kind(),
                        Algorithm::all().filter(|&a| b.supports(a)).collect(),
                        b.power().map(|p| p.stats()),
                    )
                };
                let calibrated = inner.models[slot]
                    .entries
                    .iter()
                    .any(|e| e.cost().is_some());
                let unavailable = inner.breakers[slot]
                    .reason()
                    .map(|r| format!("circuit open: {r}"))
                    .or_else(|| {
                        (slot > 0 && !calibrated && inner.pinned != Some(slot)).then(|| {
                            "not calibrated: run Offload::calibrate or load a profile".to_owned()
                        })
                    });
                let c = &inner.stats[slot];
                BackendInfo {
                    name: inner.slot_name(slot).to_owned(),
                    kind,
                    algorithms,
                    pinned: inner.pinned == Some(slot),
                    unavailable,
                    power,
                    stats: BackendStats {
                        requests: c.requests.load(Ordering::Relaxed),
                        bytes: c.bytes.load(Ordering::Relaxed),
                        failures: c.failures.load(Ordering::Relaxed),
                        replayed: c.replayed.load(Ordering::Relaxed),
                        breaker_opened: inner.breakers[slot].opened.load(Ordering::Relaxed),
                        breaker_closed: inner.breakers[slot].closed.load(Ordering::Relaxed),
                    },
                }
            })
            .collect()
    }

    pub(crate) fn inner(&self) -> &Inner {
        &self.inner
    }

    pub(crate) fn shared(&self) -> &Arc<Inner> {
        &self.inner
    }
}

impl Inner {
    /// Records that `slot` failed a request (or a probe): counts it, and
    /// opens its breaker, starting the probe task if none runs.
    pub(crate) fn failed(self: &Arc<Self>, slot: usize, error: &BackendError) {
        self.stats[slot].failures.fetch_add(1, Ordering::Relaxed);
        // `Unsupported` from a request is its shape (an AF_ALG engine's
        // operation limit, say), not a failing device: replayed, but the
        // engine stays in service.
        let refused = matches!(error, BackendError::Unsupported(_));
        if slot == 0 || refused || !self.breakers[slot].trip(error.to_string()) {
            return;
        }
        crate::calibrate::spawn_probe(self.clone(), slot);
    }
}

impl fmt::Debug for Offload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = &self.inner;
        let names: Vec<&str> = (0..=inner.backends.len())
            .map(|s| inner.slot_name(s))
            .collect();
        f.debug_struct("Offload")
            .field("backends", &names)
            .field("policy", &inner.policy)
            .field("pinned", &inner.pinned.map(|s| inner.slot_name(s)))
            .finish()
    }
}

/// Builds an [`Offload`].
///
/// ```
/// use crypto_offload::{Implementation, Offload, Policy};
///
/// // Third-party engines join with `.backend(Arc::new(engine))`; `.pin`
/// // sends every session to one of them.
/// let offload = Offload::builder()
///     .policy(Policy::Throughput)
///     .cpu_implementation(Implementation::RustCrypto)
///     .build()?;
/// assert_eq!(offload.backends()[0].name, "cpu");
/// assert!(Offload::builder().pin("no-such-engine").build().is_err());
/// # Ok::<(), crypto_offload::Error>(())
/// ```
pub struct OffloadBuilder {
    cpu: CpuBackend,
    backends: Vec<SharedBackend>,
    pin: Option<String>,
    policy: Policy,
    profile: Option<Profile>,
    cores: Option<usize>,
    probe_interval: Duration,
}

impl Default for OffloadBuilder {
    fn default() -> Self {
        OffloadBuilder {
            cpu: CpuBackend::default(),
            backends: Vec::new(),
            pin: None,
            policy: Policy::default(),
            profile: None,
            cores: None,
            probe_interval: Duration::from_secs(1),
        }
    }
}

impl OffloadBuilder {
    /// Adds a backend (a third party's engine, a simulated one, …).
    pub fn backend(mut self, backend: SharedBackend) -> Self {
        self.backends.push(backend);
        self
    }

    /// Runs every session on the backend called `name` (`"cpu"` for the
    /// CPU), bypassing the selector. Requests that backend fails are still
    /// completed on the CPU.
    pub fn pin(mut self, name: impl Into<String>) -> Self {
        self.pin = Some(name.into());
        self
    }

    /// The selection policy (default [`Policy::Latency`]).
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// Seeds the cost model from a saved profile (entries for backends or
    /// algorithms this `Offload` lacks are ignored).
    pub fn profile(mut self, profile: Profile) -> Self {
        self.profile = Some(profile);
        self
    }

    /// How many cores the CPU path may use at once (default: all).
    pub fn cores(mut self, cores: usize) -> Self {
        self.cores = Some(cores.max(1));
        self
    }

    /// How often a backend behind an open circuit breaker is probed
    /// (default 1 s; doubled while probes keep failing, up to 32×). At
    /// least 1 ms: a shorter interval is taken as 1 ms (zero would probe a
    /// failed engine in a busy loop).
    pub fn probe_interval(mut self, every: Duration) -> Self {
        self.probe_interval = every.max(Duration::from_millis(1));
        self
    }

    /// Forces the CPU backend's modes onto one implementation (RustCrypto or
    /// aws-lc), for tests and benchmarks.
    pub fn cpu_implementation(mut self, imp: Implementation) -> Self {
        self.cpu = CpuBackend::with_implementation(imp);
        self
    }

    /// The `Offload`.
    ///
    /// # Errors
    /// [`Error::UnknownBackend`] if [`pin`](Self::pin) names no backend, or
    /// if two backends share a name.
    pub fn build(self) -> Result<Offload, Error> {
        let mut names: Vec<String> = vec![CpuBackend::NAME.to_owned()];
        for b in &self.backends {
            if names.iter().any(|n| n == b.name()) {
                return Err(Error::UnknownBackend(format!(
                    "{} (registered twice)",
                    b.name()
                )));
            }
            names.push(b.name().to_owned());
        }
        let pinned = match self.pin.as_deref() {
            None => None,
            Some(name) => Some(
                names
                    .iter()
                    .position(|n| n == name)
                    .ok_or_else(|| Error::UnknownBackend(name.to_owned()))?,
            ),
        };
        let slots = names.len();
        let cores = self
            .cores
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        let supported = std::iter::once(Algorithm::all().map(|_| true).collect())
            .chain(
                self.backends
                    .iter()
                    .map(|b| Algorithm::all().map(|a| b.supports(a)).collect()),
            )
            .collect();
        let max_request = std::iter::once(Algorithm::all().map(|_| usize::MAX).collect())
            .chain(self.backends.iter().map(|b| {
                Algorithm::all()
                    .map(|a| b.max_request(a).unwrap_or(usize::MAX))
                    .collect()
            }))
            .collect();
        let per_unit = std::iter::once(Algorithm::all().map(|_| false).collect())
            .chain(self.backends.iter().map(|b| {
                Algorithm::all()
                    .map(|a| b.one_operation_per_unit(a))
                    .collect()
            }))
            .collect();
        let multiple = std::iter::once(Algorithm::all().map(|_| 1).collect())
            .chain(self.backends.iter().map(|b| {
                Algorithm::all()
                    .map(|a| b.length_multiple(a).max(1))
                    .collect()
            }))
            .collect();
        let inner = Inner {
            supported,
            max_request,
            per_unit,
            multiple,
            cpu: self.cpu,
            backends: self.backends,
            pinned,
            policy: self.policy,
            models: (0..slots).map(|_| Model::default()).collect(),
            cpu_bound: (0..crate::cost::KEYS).map(|_| AtomicU64::new(0)).collect(),
            breakers: (0..slots).map(|_| Breaker::default()).collect(),
            stats: (0..slots).map(|_| Counters::default()).collect(),
            cores,
            probe_interval: self.probe_interval,
        };
        if let Some(profile) = &self.profile {
            for e in &profile.entries {
                let (Some(slot), Some(alg)) = (
                    names.iter().position(|n| *n == e.backend),
                    Profile::alg(&e.alg),
                ) else {
                    continue;
                };
                // The backend says how it splits requests today (a profile
                // saved before it did reads as unsplit).
                let cost = match slot {
                    0 => e.cost,
                    _ => e
                        .cost
                        .with_operation_len(inner.backends[slot - 1].operation_len(alg)),
                };
                inner.set_cost(slot, alg, e.dir, cost);
                inner.models[slot].resume_ns.set(e.resume_ns);
            }
        }
        Ok(Offload {
            inner: Arc::new(inner),
        })
    }
}
