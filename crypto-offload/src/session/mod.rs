//! Sessions: keyed state for one algorithm, with a context on each backend
//! the session has used.
//!
//! Every request goes through one pipeline ([`request`]): spend the task's
//! budget, validate, ask the selector ([`crate::select`]) where to run,
//! then run inline on the CPU (large CPU jobs go to the blocking pool,
//! split over cores where that pays) or on an engine whose context the
//! session opens the first time it is chosen (taking the device's power
//! reference then). A request an engine fails is replayed on the CPU with
//! the same (unchanged) buffer, and the engine goes behind its circuit
//! breaker. The sessions ([`cipher`], [`aead`], [`crc`]) say only what
//! differs: their parameters, their CPU code and their engine call.

mod aead;
mod cipher;
mod crc;
mod iv;
mod request;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

pub use aead::{AeadSession, Open, Seal, SealDetached, Tag};
pub use cipher::{CipherRequest, CipherSession};
pub use crc::{CrcChecksum, CrcSession, CrcUpdate};
pub use iv::IvInput;
use tokio::sync::OnceCell;
use tokio::time::Instant;
use tracing::Instrument;

use crate::alg::Algorithm;
use crate::backend::SharedBackend;
use crate::cost::Direction;
use crate::error::{BackendError, Error};
use crate::select::Prediction;
use crate::slot::{SlotId, Slots};

/// A backend request, as the `Backend` trait's contexts return it.
pub(crate) type BoxedRequest<'a, T> = core::pin::Pin<
    Box<dyn core::future::Future<Output = Result<T, crate::backend::Failed>> + Send + 'a>,
>;

/// The session's copy of its key, once its length is right for `alg`.
pub(crate) fn session_key(
    alg: Algorithm,
    expected: usize,
    key: &[u8],
) -> Result<crate::key::SecretKey, Error> {
    let bad = || Error::KeyLength {
        alg,
        len: key.len(),
        expected,
    };
    if key.len() != expected {
        return Err(bad());
    }
    crate::key::SecretKey::new(key).ok_or_else(bad)
}

/// A session's contexts on the engines (one cell per slot; the CPU's stays
/// empty), each opened on first use.
pub(crate) struct Contexts<C: ?Sized> {
    cells: Box<[OnceCell<Box<C>>]>,
}

impl<C: ?Sized> Contexts<C> {
    /// A cell for every slot; when sessions are pinned to an engine, its
    /// context is opened now (so a backend that cannot run the algorithm is
    /// an error at open, and its power is taken now).
    pub(crate) async fn open<Fut>(
        slots: &Slots,
        alg: Algorithm,
        open: impl FnOnce(SharedBackend) -> Fut,
    ) -> Result<Self, Error>
    where
        Fut: core::future::Future<Output = Result<Box<C>, BackendError>>,
    {
        let cells: Box<[OnceCell<Box<C>>]> = slots.ids().map(|_| OnceCell::new()).collect();
        if let Some(id) = slots.pinned {
            let slot = &slots[id];
            if let Some(backend) = slot.backend() {
                if !slot.runs(alg) {
                    return Err(Error::Unsupported {
                        alg,
                        backend: backend.name().to_owned(),
                    });
                }
                let span = tracing::debug_span!("open", backend = backend.name(), alg = %alg);
                let ctx = open(backend.clone())
                    .instrument(span)
                    .await
                    .map_err(|source| Error::Backend {
                        backend: backend.name().to_owned(),
                        source,
                    })?;
                let _ = cells[id.index()].set(ctx);
            }
        }
        Ok(Contexts { cells })
    }

    /// The context on engine `id`, if open.
    pub(crate) fn cell(&self, id: SlotId) -> &OnceCell<Box<C>> {
        &self.cells[id.index()]
    }

    /// Whether a request on `id` waits for its context to open first (the
    /// CPU needs none).
    pub(crate) fn opens_first(&self, id: SlotId) -> bool {
        !id.is_cpu() && !self.cells[id.index()].initialized()
    }

    /// Names of the backends this session has a context on.
    pub(crate) fn open_on<'a>(&self, slots: &'a Slots) -> Vec<&'a str> {
        slots
            .ids()
            .filter(|&id| self.cells[id.index()].initialized())
            .map(|id| slots[id].name())
            .collect()
    }
}

/// Counts a request in flight on a backend for the model; uncounted when
/// dropped, including when the request is cancelled.
pub(crate) struct InFlight<'a>(&'a AtomicUsize);

impl<'a> InFlight<'a> {
    pub(crate) fn new(counter: &'a AtomicUsize) -> Self {
        counter.fetch_add(1, Ordering::Relaxed);
        InFlight(counter)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One request's bookkeeping on the backend it was sent to.
pub(crate) struct Dispatch<'a> {
    slots: &'a Arc<Slots>,
    pub(crate) slot: SlotId,
    alg: Algorithm,
    dir: Direction,
    len: usize,
    /// Read only for a request the model observes (a pinned engine's are
    /// one in 16): a clock read is ~14% of an engine request's pipeline
    /// on the host (`engine_request_overhead`), more under emulation.
    started: Option<Started>,
    predicted: Option<Prediction>,
    _in_flight: InFlight<'a>,
}

/// When a dispatched request started. Engines are timed on tokio's clock (a
/// simulated engine under a paused clock completes in tokio time); CPU jobs
/// on the wall clock, which is the time they take whatever tokio's clock does.
#[derive(Clone, Copy)]
enum Started {
    Tokio(Instant),
    Wall(std::time::Instant),
}

impl<'a> Dispatch<'a> {
    pub(crate) fn new(
        slots: &'a Arc<Slots>,
        slot: SlotId,
        alg: Algorithm,
        dir: Direction,
        len: usize,
        predicted: Option<Prediction>,
    ) -> Self {
        // A request that waits for its device to resume is not a service
        // time: left out of the model.
        let predicted = predicted.filter(|p| !p.cold);
        Dispatch {
            slots,
            slot,
            alg,
            dir,
            len,
            started: predicted.map(|_| {
                if slot.is_cpu() {
                    Started::Wall(std::time::Instant::now())
                } else {
                    Started::Tokio(Instant::now())
                }
            }),
            predicted,
            _in_flight: InFlight::new(&slots[slot].model.in_flight),
        }
    }

    /// Leaves this request out of the model, when its time is not the
    /// service time the model predicts: the session opens its context on the
    /// engine first, or a CPU job is split over cores (the model is of one
    /// core).
    pub(crate) fn unobserved_if(mut self, skip: bool) -> Self {
        if skip {
            self.predicted = None;
        }
        self
    }

    /// The request completed: count it and fold its latency into the model.
    pub(crate) fn completed(self) {
        let slot = &self.slots[self.slot];
        slot.counters.served(self.len);
        slot.breaker.succeeded();
        if let (Some(p), Some(started)) = (self.predicted, self.started) {
            let elapsed = match started {
                Started::Tokio(t) => t.elapsed(),
                Started::Wall(t) => t.elapsed(),
            };
            let observed = elapsed.as_nanos() as f64;
            if self.slot.is_cpu() {
                // A CPU job dispatched away ran on the blocking pool: what it
                // took beyond the inline model is the hand-off.
                let model = &slot.model;
                let inline = p.expected * model.entry(self.alg, self.dir).correction_at(self.len);
                model.observe_handoff(inline, observed);
            } else if p.ahead + 1.0 > p.servers {
                // It shared the engine with more than the model said the
                // engine serves at once: a lesson in parallelism, not in
                // service time.
                let req = (self.alg, self.dir, self.len);
                self.slots
                    .observe_loaded(self.slot, req, p.base, p.ahead, observed);
            } else {
                self.slots.observe(
                    self.slot, self.alg, self.dir, self.len, p.expected, observed,
                );
            }
        }
    }

    /// The request's length.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The backend failed the request and could not hand its input back
    /// whole: count the failure and open its breaker; nothing is replayed.
    /// The backend's name.
    pub(crate) fn lost(self, error: &BackendError) -> String {
        let name = self.slots[self.slot].name();
        tracing::error!(backend = name, error = %error, "backend failed a request and lost its input");
        self.slots.failed(self.slot, error);
        name.to_owned()
    }

    /// The backend failed the request: count it, open its breaker, and note
    /// the replay on the CPU.
    pub(crate) fn failed(self, error: &BackendError) {
        let name = self.slots[self.slot].name();
        tracing::warn!(backend = name, error = %error, "backend failed a request; completing it on the CPU");
        self.slots.failed(self.slot, error);
        self.slots
            .cpu_slot()
            .counters
            .replayed
            .fetch_add(1, Ordering::Relaxed);
    }
}

/// Runs `f`, an inline CPU request: counted, and — when there are engines
/// to weigh the CPU against — tracked in flight (the Throughput policy
/// watches it) and, one request in 64, timed into the CPU's model.
///
/// `f` is called in one place, so that it is inlined into the request's
/// poll: called from three, it was not, and its result came back through
/// memory written in words and read in 16-byte moves, a store-forwarding
/// stall that `perf annotate` put at 16% of a 16-byte CRC-32C request's
/// pipeline on AMD Zen 3.
#[inline]
pub(crate) fn inline_cpu<T>(
    slots: &Slots,
    alg: Algorithm,
    dir: Direction,
    len: usize,
    predicted: Option<Prediction>,
    f: impl FnOnce() -> T,
) -> T {
    let cpu = slots.cpu_slot();
    cpu.counters.served(len);
    let watch = if slots.has_engines() {
        Watch::start(slots, alg, dir, len, predicted)
    } else {
        None
    };
    let out = f();
    if let Some(watch) = watch {
        watch.finish(slots, alg, dir, len);
    }
    out
}

/// What [`inline_cpu`] keeps while an inline request runs beside engines:
/// its place in the CPU's in-flight count (the Throughput policy only)
/// and, when it is timed, the clock and the prediction it is compared
/// with.
struct Watch<'a> {
    _in_flight: Option<InFlight<'a>>,
    timed: Option<(std::time::Instant, f64)>,
}

impl<'a> Watch<'a> {
    #[inline]
    fn start(
        slots: &'a Slots,
        alg: Algorithm,
        dir: Direction,
        len: usize,
        predicted: Option<Prediction>,
    ) -> Option<Self> {
        let cpu = slots.cpu_slot();
        // Only the Throughput policy weighs the CPU's load.
        let in_flight = (slots.policy == crate::policy::Policy::Throughput)
            .then(|| InFlight::new(&cpu.model.in_flight));
        let timed = if sample_now(alg, dir, len) || predicted.is_some_and(|p| p.explored) {
            // Inline, the request does not queue: it is compared with the
            // bare service time (the selector's fast path makes no
            // prediction).
            let base = match predicted {
                Some(p) => Some(p.base),
                None => cpu.model.entry(alg, dir).cost().map(|c| c.latency_ns(len)),
            };
            // Real time: CPU work does not advance tokio's (possibly
            // paused) clock.
            base.map(|base| (std::time::Instant::now(), base))
        } else {
            None
        };
        if in_flight.is_none() && timed.is_none() {
            return None;
        }
        Some(Watch {
            _in_flight: in_flight,
            timed,
        })
    }

    #[inline]
    fn finish(self, slots: &Slots, alg: Algorithm, dir: Direction, len: usize) {
        if let Some((start, base)) = self.timed {
            let observed = start.elapsed().as_nanos() as f64;
            slots.observe(SlotId::CPU, alg, dir, len, base, observed);
        }
    }
}

/// Whether this inline CPU request is timed into the CPU's model: one in
/// [`TIME_INLINE_EVERY`] of its (algorithm, direction) on each thread
/// ([`Ticks`](crate::select::Ticks)), and from
/// [`BLOCKING_MIN_LEN`](crate::cpu::BLOCKING_MIN_LEN) one in
/// [`TIME_LARGE_EVERY`].
#[inline]
fn sample_now(alg: Algorithm, dir: Direction, len: usize) -> bool {
    use crate::select::{Ticks, no_ticks, nth_call};
    thread_local! {
        static SMALL: Ticks = const { no_ticks() };
        static LARGE: Ticks = const { no_ticks() };
    }
    if len < crate::cpu::BLOCKING_MIN_LEN {
        nth_call(&SMALL, alg, dir, TIME_INLINE_EVERY).is_some()
    } else {
        nth_call(&LARGE, alg, dir, TIME_LARGE_EVERY).is_some()
    }
}

/// One small inline request in this many is timed: two clock reads cost
/// ~50 ns here, so timing every request would double the cost of a small
/// one; one in 64 is under 1 ns a request and still thousands of samples a
/// second on a busy session.
pub(crate) const TIME_INLINE_EVERY: u32 = 64;

/// One inline request in this many from 64 KiB is timed, as the weighed
/// requests are (`select::TIME_CPU_EVERY`): the CPU bound reaches past
/// 64 KiB where the CPU wins at once, and a CPU slowed by a hog must show
/// in its model within a few dozen such requests for the bound to shrink
/// and an engine to take them (three slow samples move it,
/// [`SHIFT_UP_RUN`](crate::cost::SHIFT_UP_RUN)). It costs the clock reads
/// and the model's update on one request in 8: ~35 ns a 64 KiB CRC-32C
/// beside an engine on AMD Zen 4 (3% of its 1.13 µs; under 1% from
/// 64 KiB for the AES modes).
pub(crate) const TIME_LARGE_EVERY: u32 = crate::select::TIME_CPU_EVERY;

/// Spends tokio's cooperative budget for one request: one unit for a small
/// request, and for a larger one one per ~0.8 µs of predicted inline CPU
/// work (at most 64) — so a task looping over inline requests yields to the
/// scheduler about every 100 µs of work (tokio's budget is 128 units), and
/// completions of other tasks' engine requests are not held up behind it.
/// `false` when the budget ran out: the caller returns `Pending` (the waker
/// is registered) and the request starts on the next poll.
///
/// A request shorter than [`Slots::one_unit_below`] spends its one unit
/// without the CPU's cost being read: 4 KiB, or where the CPU's cost (or
/// default rate) puts two units' time. Before, every request from 4 KiB
/// read the cost and divided: in a profile of `session-overhead --sizes 4k`
/// on AMD Zen 4, `spend_units` took 3.2% of the samples and the pipeline's
/// own functions (tokio's included) 8.6%; without it 7.2%.
#[inline]
pub(crate) fn spend_budget(
    cx: &mut core::task::Context<'_>,
    slots: &Slots,
    alg: Algorithm,
    dir: Direction,
    len: usize,
) -> bool {
    if len < crate::cpu::ONE_UNIT_LEN as usize || (len as u64) < slots.one_unit_below(alg, dir) {
        return match tokio::task::coop::poll_proceed(cx) {
            core::task::Poll::Ready(coop) => {
                coop.made_progress();
                true
            }
            core::task::Poll::Pending => false,
        };
    }
    spend_units(cx, slots, alg, dir, len)
}

/// [`spend_budget`] for a larger request: units in proportion to its
/// predicted time on the CPU.
fn spend_units(
    cx: &mut core::task::Context<'_>,
    slots: &Slots,
    alg: Algorithm,
    dir: Direction,
    len: usize,
) -> bool {
    let cost = slots.cpu_slot().model.entry(alg, dir).cost();
    let ns = crate::cpu::inline_ns(cost, alg, dir, len);
    for _ in 0..crate::cpu::units(ns) {
        match tokio::task::coop::poll_proceed(cx) {
            core::task::Poll::Ready(coop) => coop.made_progress(),
            core::task::Poll::Pending => return false,
        }
    }
    true
}

/// How a CPU request of `len` bytes runs: `None` inline, or `Some(parts)`
/// on the blocking pool ([`crate::cpu::plan`] with the CPU slot's cost).
#[inline]
pub(crate) fn cpu_plan(slots: &Slots, alg: Algorithm, dir: Direction, len: usize) -> Option<usize> {
    crate::cpu::plan(
        || slots.cpu_slot().model.entry(alg, dir).cost(),
        slots.cores,
        alg,
        dir,
        len,
    )
}

/// Re-raises a blocking CPU job's panic (there is no buffer to hand back).
pub(crate) fn join_failed(e: tokio::task::JoinError) -> ! {
    match e.try_into_panic() {
        Ok(panic) => std::panic::resume_unwind(panic),
        Err(e) => panic!("the CPU job was cancelled: {e}"),
    }
}
