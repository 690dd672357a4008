//! The backends an `Offload` chooses among, one [`Slot`] each — the
//! backend, what it takes of each algorithm, its cost model, its circuit
//! breaker and its counters — and [`Slots`], the collection with the
//! selection's settings (policy, pin, cores).
//!
//! The CPU is always the first slot ([`SlotId::CPU`]); it has no
//! `dyn Backend` (sessions call its code directly) and runs everything.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use thread_local::ThreadLocal;

use crate::alg::Algorithm;
use crate::backend::{BackendKind, Limits, SharedBackend};
use crate::breaker::Breaker;
use crate::cost::{Cost, Direction, KEYS, Model, alg_index, key};
use crate::cpu::CpuBackend;
use crate::error::BackendError;
use crate::policy::Policy;

/// A slot's place in its [`Slots`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct SlotId(usize);

impl SlotId {
    /// The CPU's slot.
    pub(crate) const CPU: SlotId = SlotId(0);

    #[inline]
    pub(crate) fn is_cpu(self) -> bool {
        self.0 == 0
    }

    /// The slot's position (0 for the CPU), for tables indexed like
    /// [`Slots`].
    #[inline]
    pub(crate) fn index(self) -> usize {
        self.0
    }
}

/// What a slot has served.
///
/// Requests and bytes are counted per thread ([`Tally`]) and summed when
/// read: every inline CPU request counts itself, and two shared
/// `fetch_add`s (`lock xadd`, ~9–10 ns each uncontended on an Intel Xeon
/// family 6 model 207, and a cache line bounced between cores under
/// load) were a third of a session's overhead on a 16-byte request there.
///
/// A thread's tally stays until the `Offload` is dropped (256 bytes with
/// its flag), and `thread_local` groups ids in buckets of powers of two:
/// the first request on a thread whose id is `k` allocates up to
/// `256·(k + 1)` bytes a slot (64 KiB at id 255; ~128 KiB for the last
/// threads of a process that runs 512). Ids are reused lowest first.
#[derive(Default)]
pub(crate) struct Counters {
    served: ThreadLocal<Tally>,
    pub(crate) failures: AtomicU64,
    pub(crate) replayed: AtomicU64,
}

/// One thread's requests and bytes served, on a cache line of its own
/// (128 bytes: the spatial prefetcher pairs lines).
///
/// Only the thread that owns it writes it, so it adds with a load and a
/// store, not a locked read-modify-write. An exited thread's tally passes
/// to the next thread given its id (`thread_local` recycles ids through a
/// mutex, so the new owner sees every count the old one stored).
#[derive(Debug, Default)]
#[repr(align(128))]
struct Tally {
    requests: AtomicU64,
    bytes: AtomicU64,
}

impl Tally {
    #[inline]
    fn add(counter: &AtomicU64, n: u64) {
        counter.store(
            counter.load(Ordering::Relaxed).wrapping_add(n),
            Ordering::Relaxed,
        );
    }
}

impl core::fmt::Debug for Counters {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Counters")
            .field("requests", &self.requests())
            .field("bytes", &self.bytes())
            .field("failures", &self.failures)
            .field("replayed", &self.replayed)
            .finish()
    }
}

impl Counters {
    #[inline]
    pub(crate) fn served(&self, len: usize) {
        let tally = self.served.get_or_default();
        Tally::add(&tally.requests, 1);
        Tally::add(&tally.bytes, len as u64);
    }

    /// Requests served, over every thread.
    pub(crate) fn requests(&self) -> u64 {
        self.served
            .iter()
            .fold(0, |n, t| n.wrapping_add(t.requests.load(Ordering::Relaxed)))
    }

    /// Bytes served, over every thread.
    pub(crate) fn bytes(&self) -> u64 {
        self.served
            .iter()
            .fold(0, |n, t| n.wrapping_add(t.bytes.load(Ordering::Relaxed)))
    }
}

/// One backend as the selector sees it.
pub(crate) struct Slot {
    name: String,
    /// `None` for the CPU.
    engine: Option<SharedBackend>,
    /// Per algorithm ([`alg_index`]): what the backend takes, `None` if it
    /// does not run it. Asked of the backend once, here.
    limits: Box<[Option<Limits>]>,
    pub(crate) model: Model,
    pub(crate) breaker: Arc<Breaker>,
    pub(crate) counters: Counters,
}

impl Slot {
    fn cpu() -> Slot {
        Slot {
            name: CpuBackend::NAME.to_owned(),
            engine: None,
            limits: Algorithm::all().map(|_| Some(Limits::new())).collect(),
            model: Model::default(),
            breaker: Arc::default(),
            counters: Counters::default(),
        }
    }

    fn engine(backend: SharedBackend) -> Slot {
        Slot {
            name: backend.name().to_owned(),
            limits: Algorithm::all()
                .map(|a| {
                    backend.limits(a).map(|l| Limits {
                        length_multiple: l.length_multiple.max(1),
                        ..l
                    })
                })
                .collect(),
            engine: Some(backend),
            model: Model::default(),
            breaker: Arc::default(),
            counters: Counters::default(),
        }
    }

    /// The backend's name (`"cpu"` for the CPU).
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The backend, unless this is the CPU's slot.
    pub(crate) fn backend(&self) -> Option<&SharedBackend> {
        self.engine.as_ref()
    }

    pub(crate) fn kind(&self) -> BackendKind {
        self.engine.as_ref().map_or(BackendKind::Cpu, |b| b.kind())
    }

    /// What the backend takes of `alg`, if it runs it.
    #[inline]
    pub(crate) fn limits(&self, alg: Algorithm) -> Option<&Limits> {
        self.limits[alg_index(alg)].as_ref()
    }

    /// Whether the backend runs `alg`.
    pub(crate) fn runs(&self, alg: Algorithm) -> bool {
        self.limits(alg).is_some()
    }

    /// Whether this is an engine whose device is powered down (a request
    /// there first pays its resume).
    #[inline]
    pub(crate) fn is_cold(&self) -> bool {
        self.engine
            .as_ref()
            .and_then(|b| b.power())
            .is_some_and(|p| !p.is_powered())
    }

    /// Whether any of its costs is measured (or loaded).
    pub(crate) fn calibrated(&self) -> bool {
        self.model.entries.iter().any(|e| e.cost().is_some())
    }
}

/// How close (predicted latency, as a ratio) a runner-up must be to the
/// choice to be sent a request now and then (`select::runner_up`); the CPU
/// bound ([`Slots::refresh_cpu_bound`]) stays this far short of the
/// engines, so that no request it answers at once is one an engine could
/// be explored on.
pub(crate) const EXPLORE_WITHIN: f64 = 1.25;

/// Every slot, CPU first, and the settings the selector applies to them.
pub(crate) struct Slots {
    pub(crate) cpu: CpuBackend,
    slots: Box<[Slot]>,
    /// The slot every session is pinned to, if any.
    pub(crate) pinned: Option<SlotId>,
    pub(crate) policy: Policy,
    /// Cores the CPU path may use at once.
    pub(crate) cores: usize,
    pub(crate) probe_interval: Duration,
    /// Per (algorithm, direction): requests shorter than this run on the CPU
    /// under the Latency policy without weighing the engines (kept by
    /// [`Slots::refresh_cpu_bound`]).
    cpu_bound: Box<[AtomicU64]>,
    /// Per (algorithm, direction): CPU requests shorter than this spend one
    /// unit of tokio's budget (kept with `cpu_bound`).
    one_unit_below: Box<[AtomicU64]>,
}

impl core::ops::Index<SlotId> for Slots {
    type Output = Slot;

    #[inline]
    fn index(&self, id: SlotId) -> &Slot {
        &self.slots[id.0]
    }
}

impl Slots {
    /// The CPU's slot, then one per backend in order. `pin` names the slot
    /// every session is pinned to.
    ///
    /// # Errors
    /// The name, if `pin` names no slot or two backends share a name.
    pub(crate) fn new(
        cpu: CpuBackend,
        backends: Vec<SharedBackend>,
        pin: Option<&str>,
        policy: Policy,
        cores: usize,
        probe_interval: Duration,
    ) -> Result<Slots, String> {
        let mut slots = vec![Slot::cpu()];
        for b in backends {
            if slots.iter().any(|s| s.name == b.name()) {
                return Err(format!("{} (registered twice)", b.name()));
            }
            slots.push(Slot::engine(b));
        }
        let slots = slots.into_boxed_slice();
        let pinned = match pin {
            None => None,
            Some(name) => Some(SlotId(
                slots
                    .iter()
                    .position(|s| s.name == name)
                    .ok_or_else(|| name.to_owned())?,
            )),
        };
        Ok(Slots {
            cpu,
            slots,
            pinned,
            policy,
            cores: cores.max(1),
            probe_interval,
            cpu_bound: (0..KEYS).map(|_| AtomicU64::new(0)).collect(),
            one_unit_below: (0..KEYS)
                .map(|k| {
                    let (alg, dir) = crate::cost::unkey(k);
                    AtomicU64::new(crate::cpu::one_unit_below(None, alg, dir))
                })
                .collect(),
        })
    }

    /// Every slot's id, the CPU's first.
    pub(crate) fn ids(&self) -> impl Iterator<Item = SlotId> + use<> {
        (0..self.slots.len()).map(SlotId)
    }

    /// The engines' ids (every slot but the CPU's).
    pub(crate) fn engine_ids(&self) -> impl Iterator<Item = SlotId> + use<> {
        (1..self.slots.len()).map(SlotId)
    }

    /// Whether there is anything besides the CPU.
    #[inline]
    pub(crate) fn has_engines(&self) -> bool {
        self.slots.len() > 1
    }

    /// The slot of the backend called `name`.
    pub(crate) fn find(&self, name: &str) -> Option<SlotId> {
        self.slots.iter().position(|s| s.name == name).map(SlotId)
    }

    /// The CPU's slot.
    #[inline]
    pub(crate) fn cpu_slot(&self) -> &Slot {
        &self.slots[0]
    }

    /// Requests of (`alg`, `dir`) shorter than this go to the CPU under the
    /// Latency policy without weighing the engines.
    #[inline]
    pub(crate) fn cpu_bound(&self, alg: Algorithm, dir: Direction) -> u64 {
        self.cpu_bound[key(alg, dir)].load(Ordering::Relaxed)
    }

    /// CPU requests of (`alg`, `dir`) shorter than this spend one unit of
    /// tokio's budget without their time being predicted
    /// (`session::spend_budget`, [`crate::cpu::one_unit_below`]).
    #[inline]
    pub(crate) fn one_unit_below(&self, alg: Algorithm, dir: Direction) -> u64 {
        self.one_unit_below[key(alg, dir)].load(Ordering::Relaxed)
    }

    /// Sets a cost from calibration or a profile.
    pub(crate) fn set_cost(&self, id: SlotId, alg: Algorithm, dir: Direction, cost: Cost) {
        self[id].model.entry(alg, dir).set(cost);
        if id.is_cpu() {
            let one_unit = crate::cpu::one_unit_below(Some(cost), alg, dir);
            self.one_unit_below[key(alg, dir)].store(one_unit, Ordering::Relaxed);
        }
        self.refresh_cpu_bound(key(alg, dir));
    }

    /// Folds one completion into `id`'s correction.
    pub(crate) fn observe(
        &self,
        id: SlotId,
        alg: Algorithm,
        dir: Direction,
        len: usize,
        expected: f64,
        observed: f64,
    ) {
        let entry = self[id].model.entry(alg, dir);
        entry.observe(len, expected, observed);
        tracing::trace!(
            backend = self[id].name(),
            %alg,
            ?dir,
            len,
            expected_ns = expected as u64,
            observed_ns = observed as u64,
            correction = entry.correction_at(len),
            "observed"
        );
        self.refresh_cpu_bound(key(alg, dir));
    }

    /// Folds one completion of a request that found `ahead` others in
    /// flight on engine `id`, more than its model had it serve at once,
    /// into the engine's learned parallelism
    /// ([`Entry::observe_loaded`](crate::cost::Entry::observe_loaded)).
    pub(crate) fn observe_loaded(
        &self,
        id: SlotId,
        (alg, dir, len): (Algorithm, Direction, usize),
        base: f64,
        ahead: f64,
        observed: f64,
    ) {
        let entry = self[id].model.entry(alg, dir);
        entry.observe_loaded(len, base, ahead, observed);
        tracing::trace!(
            backend = self[id].name(),
            %alg,
            ?dir,
            len,
            base_ns = base as u64,
            ahead,
            observed_ns = observed as u64,
            servers = entry.servers(),
            "observed under load"
        );
    }

    /// Recomputes, for table entry `k`, the request length under which the
    /// CPU wins under the Latency policy without weighing the engines, and
    /// runs inline ([`crate::cpu::inline_below`]: a request that may go to
    /// the blocking pool is weighed with its hand-off). The CPU wins where
    /// its corrected latency, [`EXPLORE_WITHIN`] over, is below every
    /// engine's fixed latency (which queueing and resumes only add to):
    /// there no engine is near enough to be explored either
    /// (`select::runner_up`), so answering at once skips nothing the
    /// weighing would have done. Walked size class by size class
    /// ([`size_class`](crate::cost::size_class)), each with the
    /// corrections `select::predict` applies there: a CPU slower than
    /// its model for large requests only (its model is fitted on 64 B and
    /// 64 KiB) stops the bound at that class. Engines are corrected where
    /// they are faster than calibrated but not where slower — an engine
    /// slowed by a load swing must still be weighed where it would win
    /// without it, or the selector's probes (`select::runner_up`) never
    /// reach it and its model never sees the swing end. Breakers are not
    /// consulted — an engine behind one only makes the CPU's win surer —
    /// so the bound needs no update when they open or close; it follows
    /// every change of a cost or a correction instead.
    ///
    fn refresh_cpu_bound(&self, k: usize) {
        let (alg, dir) = crate::cost::unkey(k);
        let cpu = self.cpu_slot().model.entry(alg, dir);
        let bound = match cpu.cost() {
            None => 0,
            Some(c) => self
                .cpu_wins_below(k, alg, cpu, &c)
                .min(crate::cpu::inline_below(&c)),
        };
        self.cpu_bound[k].store(bound, Ordering::Relaxed);
    }

    /// [`Slots::refresh_cpu_bound`]'s length under which the CPU, at cost
    /// `c` with `cpu`'s corrections, beats every engine's fixed latency
    /// by [`EXPLORE_WITHIN`].
    fn cpu_wins_below(
        &self,
        k: usize,
        alg: Algorithm,
        cpu: &crate::cost::Entry,
        c: &crate::cost::Cost,
    ) -> u64 {
        use crate::cost::{SIZE_CLASSES, class_lens};
        let at = |class| usize::try_from(class_lens(class).0).unwrap_or(usize::MAX);
        // The least engine latency a request of each size class can have.
        let mut engines = [f64::INFINITY; SIZE_CLASSES];
        for s in self.slots[1..].iter().filter(|s| s.runs(alg)) {
            let e = &s.model.entries[k];
            let Some(fixed) = e.fixed_ns() else {
                continue;
            };
            for (class, least) in engines.iter_mut().enumerate() {
                *least = least.min(fixed * e.correction_at(at(class)).min(1.0));
            }
        }
        for (class, engines) in engines.into_iter().enumerate() {
            let (first, last) = class_lens(class);
            // Where the CPU's latency, corrected and EXPLORE_WITHIN over,
            // reaches the engines' (none: no limit, u64::MAX).
            let margin = cpu.correction_at(at(class)) * EXPLORE_WITHIN;
            let below = c.len_under(engines / margin).unwrap_or(0);
            // This class is not wholly the CPU's: the bound is in it (or
            // at its start).
            if below <= last {
                return below.max(first);
            }
        }
        u64::MAX
    }

    /// Records that `id` failed a request (or a probe): counts it, and
    /// opens its breaker, starting the probe task if none runs.
    pub(crate) fn failed(&self, id: SlotId, error: &BackendError) {
        let slot = &self[id];
        slot.counters.failures.fetch_add(1, Ordering::Relaxed);
        // `Unsupported` from a request is its shape (an AF_ALG engine's
        // operation limit, say), not a failing device: replayed, but the
        // engine stays in service.
        let refused = matches!(error, BackendError::Unsupported(_));
        let Some(backend) = slot.backend() else {
            return;
        };
        if refused || !slot.breaker.trip(error.to_string()) {
            return;
        }
        crate::breaker::spawn_probe(&slot.breaker, backend, self.probe_interval);
    }
}

#[cfg(test)]
mod tests {
    use super::Counters;

    /// Every count from every thread is in the sums: threads that served
    /// at once, threads that exited (their ids, and tallies, go to later
    /// threads), and the reading thread's own requests, seen at once.
    #[test]
    fn counters_sum_every_thread_including_exited_ones() {
        let counters = Counters::default();
        counters.served(5);
        assert_eq!((counters.requests(), counters.bytes()), (1, 5));
        for wave in 0..3u64 {
            std::thread::scope(|s| {
                for t in 0..8u64 {
                    let counters = &counters;
                    s.spawn(move || {
                        for i in 0..1000 {
                            counters.served((wave * 8 + t + i) as usize);
                        }
                    });
                }
            });
        }
        let bytes: u64 = (0..3u64)
            .flat_map(|w| (0..8u64).flat_map(move |t| (0..1000).map(move |i| w * 8 + t + i)))
            .sum();
        assert_eq!(counters.requests(), 1 + 3 * 8 * 1000);
        assert_eq!(counters.bytes(), 5 + bytes);
        let shown = format!("{counters:?}");
        assert!(shown.contains("requests: 24001"), "{shown}");
    }

    /// A reader never sees the sums go down or past the truth while
    /// threads serve, exit and are replaced by threads that reuse their
    /// ids, and sees every request once they are done.
    #[test]
    fn counters_read_while_threads_come_and_go_only_grow() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let counters = Counters::default();
        let done = AtomicBool::new(false);
        let (waves, threads, each) = (20u64, 4u64, 500u64);
        std::thread::scope(|s| {
            let reader = s.spawn(|| {
                let (mut requests, mut bytes, mut reads) = (0, 0, 0u64);
                while !done.load(Ordering::Acquire) || reads == 0 {
                    let (r, b) = (counters.requests(), counters.bytes());
                    assert!(
                        r >= requests && b >= bytes,
                        "{r} < {requests} or {b} < {bytes}"
                    );
                    assert!(r <= waves * threads * each && b <= 3 * waves * threads * each);
                    (requests, bytes, reads) = (r, b, reads + 1);
                }
                reads
            });
            for _ in 0..waves {
                std::thread::scope(|w| {
                    for _ in 0..threads {
                        w.spawn(|| (0..each).for_each(|_| counters.served(3)));
                    }
                });
            }
            done.store(true, Ordering::Release);
            assert!(reader.join().expect("the reader") > 0);
        });
        assert_eq!(counters.requests(), waves * threads * each);
        assert_eq!(counters.bytes(), 3 * waves * threads * each);
    }
}
