//! `Offload`: the set of backends sessions run on, as a value.

use core::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crypto_offload_fallback::Implementation;

use crate::alg::{AeadAlg, Algorithm, CipherAlg, CrcAlg};
use crate::backend::{BackendKind, SharedBackend};
use crate::buffer::DeviceBuf;
use crate::cost::CpuImplementation;
use crate::cost::{Direction, Profile, ProfileEntry};
use crate::cpu::CpuBackend;
use crate::error::Error;
use crate::policy::Policy;
use crate::power::PowerStats;
use crate::select::{Explanation, Request};
use crate::session::{AeadSession, CipherSession, CrcSession};
use crate::slot::{SlotId, Slots};

/// The engines this process may use, and the policy for choosing among them.
///
/// A handle, not a plain value: build one with [`Offload::discover`] or
/// [`Offload::builder`] and hand clones of it (an `Arc` bump) to whatever
/// opens sessions. Clones — and every session opened from them — share one
/// learning cost model, the circuit breakers with their probe tasks, and
/// the counters [`backends`](Offload::backends) reports; an `Offload` built
/// separately shares nothing. There is no hidden global. `Offload` is
/// `Send + Sync`; its backends (and their probe tasks) are released when
/// the last clone and the last session are dropped.
///
/// The CPU backend is always present and runs every algorithm. With other
/// backends, each request goes where the cost model and the [`Policy`] say
/// ([`explain`](Offload::explain) shows why), unless sessions are pinned.
#[derive(Clone)]
pub struct Offload {
    slots: Arc<Slots>,
    discovery: Arc<[EngineSearch]>,
}

/// What [`Offload::discover`] did about one kind of engine
/// ([`Offload::discovery`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EngineSearch {
    /// `"AF_ALG"` or `"VFIO"`.
    pub kind: &'static str,
    /// What came of it.
    pub outcome: SearchOutcome,
}

/// What came of looking for one kind of engine.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SearchOutcome {
    /// Not looked for: this build does not have it (the feature named is
    /// off, or this platform has no such engines).
    NotCompiled {
        /// The cargo feature that adds it, e.g. `"vfio"`.
        feature: &'static str,
    },
    /// Looked for, and none is usable here: why.
    Unavailable(String),
    /// Looked for: the backends that joined (possibly none: AF_ALG with no
    /// hardware engine), and each device left out with the reason.
    Found {
        /// The names of the backends that joined.
        backends: Vec<String>,
        /// Devices seen but not used, each with why.
        left_out: Vec<String>,
    },
}

impl core::fmt::Display for EngineSearch {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match &self.outcome {
            SearchOutcome::NotCompiled { feature } => write!(
                f,
                "{}: not looked for (feature `{feature}` is off, or not this platform)",
                self.kind
            ),
            SearchOutcome::Unavailable(why) => write!(f, "{}: unavailable: {why}", self.kind),
            SearchOutcome::Found { backends, left_out } => {
                if backends.is_empty() {
                    write!(f, "{}: none found", self.kind)?;
                } else {
                    write!(f, "{}: {}", self.kind, backends.join(", "))?;
                }
                if !left_out.is_empty() {
                    write!(f, "; left out: {}", left_out.join("; "))?;
                }
                Ok(())
            }
        }
    }
}

/// VFIO devices this process has opened through discovery, so that a
/// second `Offload::discover` shares them (a VFIO group opens once per
/// process) instead of listing them as busy; and the addresses it ever
/// opened. Behind an async lock held for the whole VFIO part of a
/// discovery: two discoveries at once would both open each device, and
/// the loser would find it busy.
#[cfg(all(feature = "vfio", target_os = "linux"))]
static VFIO_OPENED: tokio::sync::Mutex<VfioOpened> = tokio::sync::Mutex::const_new(VfioOpened {
    live: Vec::new(),
    ever: Vec::new(),
});

#[cfg(all(feature = "vfio", target_os = "linux"))]
struct VfioOpened {
    live: Vec<std::sync::Weak<crate::vfio::VfioBackend>>,
    ever: Vec<String>,
}

/// How long a device this process opened before may stay busy after its
/// last `Offload` is gone: its power domain's autosuspend and its session
/// teardown still hold it ([`crate::engine::AUTOSUSPEND_DELAY`], 1 s), so a
/// discovery right after waits for it rather than leave it out.
#[cfg(all(feature = "vfio", target_os = "linux"))]
const VFIO_RELEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// Every compiled-in engine that works here, and what was found per kind.
// One push a kind of engine, each behind its feature: no `vec![]` fits
// every build.
#[allow(clippy::vec_init_then_push)]
async fn discover_engines() -> (Vec<SharedBackend>, Vec<EngineSearch>) {
    #[allow(unused_imports)]
    use crate::backend::Backend as _;
    #[allow(unused_mut)]
    let mut found: Vec<SharedBackend> = Vec::new();
    let mut searches = Vec::new();
    #[cfg(all(feature = "af-alg", target_os = "linux"))]
    searches.push(EngineSearch {
        kind: "AF_ALG",
        outcome: match crate::af_alg::AfAlgBackend::discover() {
            Ok(engines) => {
                let backends = engines.iter().map(|e| e.name().to_owned()).collect();
                found.extend(engines.into_iter().map(|e| Arc::new(e) as SharedBackend));
                SearchOutcome::Found {
                    backends,
                    left_out: Vec::new(),
                }
            }
            Err(e) => SearchOutcome::Unavailable(e.0),
        },
    });
    #[cfg(not(all(feature = "af-alg", target_os = "linux")))]
    searches.push(EngineSearch {
        kind: "AF_ALG",
        outcome: SearchOutcome::NotCompiled { feature: "af-alg" },
    });
    #[cfg(all(feature = "vfio", target_os = "linux"))]
    {
        use crate::vfio::VfioBackend;
        let mut opened = VFIO_OPENED.lock().await;
        opened.live.retain(|w| w.strong_count() > 0);
        // A device reset, removed or broken stays so: it is not handed out
        // again (a fresh open says why it is unusable).
        let shared: Vec<Arc<VfioBackend>> = opened
            .live
            .iter()
            .filter_map(std::sync::Weak::upgrade)
            .filter(|d| !d.driver_device().is_gone() && !d.driver_device().is_released())
            .collect();
        let skip: Vec<String> = shared.iter().map(|d| d.address().to_owned()).collect();
        let mut result = VfioBackend::discover_each(&skip).await;
        // Devices this process opened before and let go of may still be
        // held for a moment by their own teardown: wait for them.
        let deadline = tokio::time::Instant::now() + VFIO_RELEASE_WAIT;
        while let Ok((devices, left_out)) = &mut result {
            let busy: Vec<String> = left_out
                .iter()
                .filter(|(a, _)| opened.ever.contains(a))
                .map(|(a, _)| a.clone())
                .collect();
            if busy.is_empty() || tokio::time::Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            let again: Vec<String> = skip
                .iter()
                .cloned()
                .chain(devices.iter().map(|d| d.address().to_owned()))
                .chain(
                    left_out
                        .iter()
                        .map(|(a, _)| a.clone())
                        .filter(|a| !busy.contains(a)),
                )
                .collect();
            if let Ok((more, still)) = VfioBackend::discover_each(&again).await {
                left_out.retain(|(a, _)| !busy.contains(a));
                left_out.extend(still);
                devices.extend(more);
            }
        }
        let outcome = match result {
            Ok((devices, left_out)) => {
                let devices: Vec<Arc<VfioBackend>> = devices.into_iter().map(Arc::new).collect();
                for d in &devices {
                    opened.live.push(Arc::downgrade(d));
                    if !opened.ever.iter().any(|a| a == d.address()) {
                        opened.ever.push(d.address().to_owned());
                    }
                }
                drop(opened);
                let all: Vec<Arc<VfioBackend>> = shared.into_iter().chain(devices).collect();
                let backends = all.iter().map(|d| d.name().to_owned()).collect();
                found.extend(all.into_iter().map(|d| d as SharedBackend));
                SearchOutcome::Found {
                    backends,
                    left_out: left_out
                        .into_iter()
                        .map(|(address, why)| format!("{address}: {why}"))
                        .collect(),
                }
            }
            Err(e) => SearchOutcome::Unavailable(e.0),
        };
        searches.push(EngineSearch {
            kind: "VFIO",
            outcome,
        });
    }
    #[cfg(not(all(feature = "vfio", target_os = "linux")))]
    searches.push(EngineSearch {
        kind: "VFIO",
        outcome: SearchOutcome::NotCompiled { feature: "vfio" },
    });
    for s in &searches {
        tracing::info!(kind = s.kind, "{s}");
    }
    (found, searches)
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
    /// through AF_ALG joins ([`AfAlgBackend::discover`](crate::af_alg::AfAlgBackend::discover));
    /// with `vfio`, every virtio-crypto device bound to `vfio-pci`
    /// ([`VfioBackend::discover`](crate::vfio::VfioBackend::discover)). A backend that is compiled
    /// in but unavailable here (no AF_ALG, no device, no permission) is left
    /// out, never an error.
    ///
    /// With `vfio`, discoveries in a process take turns (they share the
    /// devices they open), so this future may wait for another discovery,
    /// and for up to 3 s on a tokio timer for a device this process opened
    /// before to be let go of; run it on a tokio runtime, or with any
    /// executor when there is no VFIO device. Without `vfio` it completes
    /// without waiting.
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
    /// there is more than the CPU. With a profile, only the backends it has
    /// no costs for are calibrated (a profile made on another machine, or
    /// before a device joined or moved to another address), the others
    /// keep the profile's. For servers that take a policy, a forced
    /// backend or a saved profile from their command line.
    ///
    /// ```
    /// # futures::executor::block_on(async {
    /// use crypto_offload::{Offload, Policy};
    ///
    /// let offload = Offload::discover_with(Offload::builder().policy(Policy::Throughput)).await?;
    /// assert_eq!(offload.policy(), Policy::Throughput);
    /// # Ok::<(), crypto_offload::Error>(()) }).unwrap();
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
        let (engines, discovery) = discover_engines().await;
        for engine in engines {
            builder = builder.backend(engine);
        }
        let profiled = builder.profile.is_some();
        let mut offload = builder.build()?;
        offload.discovery = Arc::from(discovery);
        // With the CPU alone there is nothing to choose between.
        if offload.slots.has_engines() {
            if profiled {
                crate::calibrate::run_uncalibrated(&offload.slots).await;
            } else {
                offload.calibrate().await?;
            }
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
    pub async fn discover_backends() -> Vec<SharedBackend> {
        discover_engines().await.0
    }

    /// What [`discover`](Offload::discover) looked for and found, per kind
    /// of engine: not compiled in (and which feature adds it), looked for
    /// and unusable (and why), or the backends that joined and the devices
    /// left out. Empty for an `Offload` made by the builder alone.
    ///
    /// ```
    /// # futures::executor::block_on(async {
    /// use crypto_offload::{Offload, SearchOutcome};
    ///
    /// let offload = Offload::discover().await?;
    /// for search in offload.discovery() {
    ///     match &search.outcome {
    ///         SearchOutcome::NotCompiled { feature } => println!("{}: feature `{feature}` is off", search.kind),
    ///         SearchOutcome::Unavailable(why) => println!("{}: {why}", search.kind),
    ///         SearchOutcome::Found { backends, left_out } => println!("{}: {backends:?}, left out {left_out:?}", search.kind),
    ///         _ => {}
    ///     }
    /// }
    /// # Ok::<(), crypto_offload::Error>(()) }).unwrap();
    /// ```
    pub fn discovery(&self) -> &[EngineSearch] {
        &self.discovery
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
        crate::calibrate::run(&self.slots).await;
        Ok(())
    }

    /// The CPU implementations `mode` runs on (per size class) and where
    /// that choice came from: measured in this process, given (a loaded
    /// profile, [`OffloadBuilder::cpu_choice`]) or forced
    /// ([`OffloadBuilder::cpu_implementation`]). Asking measures the mode
    /// if nothing has yet (0.5–6 ms a mode on a 2-vCPU Zen 3, up to three
    /// batches of rounds where the first leaves it in doubt:
    /// [`cpu_choice::MAX_BATCHES`](crate::cpu_choice::MAX_BATCHES)).
    pub fn cpu_choice(
        &self,
        mode: crate::cpu_choice::Mode,
    ) -> (crate::cpu_choice::Choice, crate::cpu::ChoiceSource) {
        self.slots.cpu.choice(mode)
    }

    /// The measured model, as a profile to save and load later (with the
    /// CPU implementations chosen here: [`Offload::cpu_choice`]).
    pub fn profile(&self) -> Profile {
        let mut entries = Vec::new();
        for id in self.slots.ids() {
            let slot = &self.slots[id];
            for (k, e) in slot.model.entries.iter().enumerate() {
                let Some(cost) = e.cost() else { continue };
                let (alg, dir) = crate::cost::unkey(k);
                entries.push(ProfileEntry {
                    backend: slot.name().to_owned(),
                    alg: alg.name().to_owned(),
                    dir,
                    cost,
                    resume_ns: slot.model.resume_ns.get(),
                });
            }
        }
        let cpu = &self.slots.cpu;
        let cpu_implementations = crate::cpu_choice::Mode::ALL
            .into_iter()
            .map(|mode| CpuImplementation::new(mode, cpu.choice(mode).0))
            .collect();
        Profile {
            entries,
            cpu_implementations,
        }
    }

    /// Which backend a `len`-byte request of `alg` would run on now, and
    /// every candidate's predicted latency and CPU time.
    /// A CRC has one direction: pass `Direction::Encrypt`, or use
    /// [`explain_crc`](Self::explain_crc).
    pub fn explain(&self, alg: impl Into<Algorithm>, dir: Direction, len: usize) -> Explanation {
        crate::select::explain(&self.slots, alg.into(), dir, len)
    }

    /// [`explain`](Self::explain) for a CRC of `len` bytes.
    ///
    /// ```
    /// use crypto_offload::{CrcAlg, Offload};
    ///
    /// let offload = Offload::builder().build()?;
    /// let why = offload.explain_crc(CrcAlg::CRC32C, 4096);
    /// assert_eq!(why.choice, "cpu");
    /// # Ok::<(), crypto_offload::Error>(())
    /// ```
    pub fn explain_crc(&self, alg: CrcAlg, len: usize) -> Explanation {
        self.explain(alg, Direction::Encrypt, len)
    }

    /// The smallest request size at which the selector would leave the CPU
    /// for an engine with nothing in flight (under the current policy), if
    /// any size up to 1 GiB would. (Found between the first power of two
    /// that leaves the CPU and the one before it.)
    pub fn break_even(&self, alg: impl Into<Algorithm>, dir: Direction) -> Option<usize> {
        let alg = alg.into();
        let on_engine = |len| {
            !crate::select::choose(&self.slots, &Request::new(alg, dir, len))
                .0
                .is_cpu()
        };
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
        self.slots.policy
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
        CipherSession::start(self.slots.clone(), alg, key).await
    }

    /// Opens an AEAD session for `alg` keyed with `key`.
    ///
    /// # Errors
    /// As for [`Offload::cipher`].
    ///
    /// # Cancel safety
    /// Dropping the future before it completes opens nothing.
    pub async fn aead(&self, alg: AeadAlg, key: &[u8]) -> Result<AeadSession, Error> {
        AeadSession::start(self.slots.clone(), alg, key).await
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
        CrcSession::start(self.slots.clone(), alg).await
    }

    /// A buffer of `len` zero bytes for requests to work on in place: in
    /// the memory of the engine requests would go to — the pinned backend,
    /// else the first engine that lends memory and whose circuit is
    /// closed — so a request there copies nothing in or out; in ordinary
    /// memory where none lends any (the CPU, AF_ALG, an engine whose
    /// memory for buffers is used up). Any request takes it, on any
    /// engine; elsewhere it is ordinary bytes.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), crypto_offload::Error> {
    /// use crypto_offload::{CipherAlg, Offload};
    ///
    /// let offload = Offload::builder().build()?;
    /// let session = offload.cipher(CipherAlg::Aes128Cbc, &[7; 16]).await?;
    /// let mut buf = offload.buffer(4096);
    /// buf.copy_from_slice(&[1; 4096]); // or read(2) into it
    /// let buf = session.encrypt(&[0; 16], buf).await?;
    /// assert_ne!(&buf[..], &[1; 4096][..]);
    /// # Ok(()) }
    /// ```
    pub fn buffer(&self, len: usize) -> DeviceBuf {
        let slots = &self.slots;
        let lends = |id: SlotId| {
            let slot = &slots[id];
            if slot.breaker.reason().is_some() {
                return None;
            }
            slot.backend()?.buffer(len)
        };
        let memory = match slots.pinned {
            Some(id) => lends(id),
            None => slots.ids().filter(|id| !id.is_cpu()).find_map(lends),
        };
        match memory {
            Some(m) => DeviceBuf::device(m),
            None => DeviceBuf::from(vec![0u8; len]),
        }
    }

    /// The backends, CPU first, with their state and what they served.
    pub fn backends(&self) -> Vec<BackendInfo> {
        let slots = &self.slots;
        slots
            .ids()
            .map(|id| {
                let slot = &slots[id];
                let unavailable = slot
                    .breaker
                    .reason()
                    .map(|r| format!("circuit open: {r}"))
                    .or_else(|| {
                        (!id.is_cpu() && !slot.calibrated() && slots.pinned != Some(id)).then(
                            || {
                                "not calibrated: run Offload::calibrate or load a profile"
                                    .to_owned()
                            },
                        )
                    });
                let c = &slot.counters;
                BackendInfo {
                    name: slot.name().to_owned(),
                    kind: slot.kind(),
                    algorithms: Algorithm::all().filter(|&a| slot.runs(a)).collect(),
                    pinned: slots.pinned == Some(id),
                    unavailable,
                    power: slot.backend().and_then(|b| b.power()).map(|p| p.stats()),
                    stats: BackendStats {
                        requests: c.requests(),
                        bytes: c.bytes(),
                        failures: c.failures.load(Ordering::Relaxed),
                        replayed: c.replayed.load(Ordering::Relaxed),
                        breaker_opened: slot.breaker.opened.load(Ordering::Relaxed),
                        breaker_closed: slot.breaker.closed.load(Ordering::Relaxed),
                    },
                }
            })
            .collect()
    }
}

impl fmt::Debug for Offload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let slots = &self.slots;
        let names: Vec<&str> = slots.ids().map(|id| slots[id].name()).collect();
        f.debug_struct("Offload")
            .field("backends", &names)
            .field("policy", &slots.policy)
            .field("pinned", &slots.pinned.map(|id| slots[id].name()))
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
    ///
    /// Pinning is for the whole `Offload`, and strict: a session of an
    /// algorithm the pinned backend does not run fails to open with
    /// [`Error::Unsupported`] (a backend under test must not pass by
    /// handing its work to the CPU). To pin ciphers to one engine and
    /// leave everything else to the selector, build a second `Offload`
    /// with the same backends: a backend can serve several.
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

    /// Forces the CPU backend's modes onto one implementation (RustCrypto,
    /// aws-lc, or ring for GCM), for tests and benchmarks: every mode that
    /// has it, at every size.
    pub fn cpu_implementation(mut self, imp: Implementation) -> Self {
        self.cpu = CpuBackend::with_implementation(imp);
        self
    }

    /// Runs CPU `mode` on `choice` (per size class) instead of the
    /// implementations measured fastest here ([`crate::cpu_choice`]).
    pub fn cpu_choice(
        mut self,
        mode: crate::cpu_choice::Mode,
        choice: crate::cpu_choice::Choice,
    ) -> Self {
        self.cpu = self.cpu.with_choice(mode, choice);
        self
    }

    /// The `Offload`.
    ///
    /// # Errors
    /// [`Error::UnknownBackend`] if [`pin`](Self::pin) names no backend, or
    /// if two backends share a name.
    pub fn build(mut self) -> Result<Offload, Error> {
        warn_if_unoptimised();
        // The profile's CPU implementations, where `cpu_choice` gave none
        // (a forced implementation wins over both).
        for (mode, choice) in self
            .profile
            .iter()
            .flat_map(|p| &p.cpu_implementations)
            .filter_map(CpuImplementation::choice)
        {
            if self.cpu.given(mode).is_none() {
                self.cpu = self.cpu.with_choice(mode, choice);
            }
        }
        let cores = self
            .cores
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        let slots = Slots::new(
            self.cpu,
            self.backends,
            self.pin.as_deref(),
            self.policy,
            cores,
            self.probe_interval,
        )
        .map_err(Error::UnknownBackend)?;
        if let Some(profile) = &self.profile {
            for e in &profile.entries {
                let (Some(id), Some(alg)) = (slots.find(&e.backend), Profile::alg(&e.alg)) else {
                    continue;
                };
                // The backend says how it splits requests today (a profile
                // saved before it did reads as unsplit).
                let cost = if id == SlotId::CPU {
                    e.cost
                } else {
                    e.cost
                        .with_operation_len(slots[id].limits(alg).and_then(|l| l.operation_len))
                };
                slots.set_cost(id, alg, e.dir, cost);
                slots[id].model.resume_ns.set(e.resume_ns);
            }
        }
        Ok(Offload {
            slots: Arc::new(slots),
            discovery: Arc::from(Vec::new()),
        })
    }
}

/// Once a process: a `tracing` warning when the CPU code was compiled
/// without optimisation (a dependent project's debug build), where AES and
/// CRC run ~50x slower and calibration would learn that.
fn warn_if_unoptimised() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    if crate::cpu_choice::built_unoptimised() {
        ONCE.call_once(|| {
            tracing::warn!(
                "crypto-offload's CPU code is built unoptimised (opt-level 0): AES and CRC \
                 run ~50x slower than in release, and the cost model learns it; add \
                 `[profile.dev.package.\"*\"] opt-level = 3` to your Cargo.toml"
            );
        });
    }
}
