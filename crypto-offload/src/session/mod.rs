//! Sessions: keyed state for one algorithm, with a context on each backend
//! the session has used.
//!
//! Each request asks the selector ([`crate::select`]) where to run: inline on
//! the CPU (large CPU jobs go to the blocking pool, split over cores where
//! that pays), or on an engine whose context the session opens the first
//! time it is chosen (taking the device's power reference then). A request
//! an engine fails is replayed on the CPU with the same (unchanged) buffer,
//! and the engine goes behind its circuit breaker.

mod aead;
mod cipher;
mod crc;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

pub use aead::{AeadSession, Open, Seal, SealDetached, Tag};
pub use cipher::{CipherRequest, CipherSession};
pub use crc::{CrcSession, CrcUpdate};
use tokio::sync::OnceCell;
use tokio::time::Instant;
use tracing::Instrument;

use crate::alg::Algorithm;
use crate::backend::SharedBackend;
use crate::cost::Direction;
use crate::error::{BackendError, Error};
use crate::offload::{Inner, Offload};
use crate::select::Prediction;

/// A backend request, as the `Backend` trait's contexts return it.
pub(crate) type BoxedRequest<'a, T> = core::pin::Pin<
    Box<dyn core::future::Future<Output = Result<T, crate::backend::Failed>> + Send + 'a>,
>;

/// A backend request in flight, inside its tracing span.
pub(crate) type EngineFuture<'a, T> = tracing::instrument::Instrumented<BoxedRequest<'a, T>>;

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

/// A session's contexts on the non-CPU backends, opened on first use.
pub(crate) struct Engines<C: ?Sized> {
    cells: Box<[OnceCell<Box<C>>]>,
}

impl<C: ?Sized> Engines<C> {
    /// Contexts for every backend of `offload`; when sessions are pinned to
    /// an engine, its context is opened now (so a backend that cannot run
    /// the algorithm is an error at open, and its power is taken now).
    pub(crate) async fn open<Fut>(
        offload: &Offload,
        alg: Algorithm,
        open: impl FnOnce(SharedBackend) -> Fut,
    ) -> Result<Self, Error>
    where
        Fut: core::future::Future<Output = Result<Box<C>, BackendError>>,
    {
        let inner = offload.inner();
        let cells: Box<[OnceCell<Box<C>>]> =
            inner.backends.iter().map(|_| OnceCell::new()).collect();
        if let Some(slot) = inner.pinned.filter(|&s| s > 0) {
            let backend = &inner.backends[slot - 1];
            if !backend.supports(alg) {
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
            let _ = cells[slot - 1].set(ctx);
        }
        Ok(Engines { cells })
    }

    /// The context on `slot` (> 0), if open.
    pub(crate) fn cell(&self, slot: usize) -> &OnceCell<Box<C>> {
        &self.cells[slot - 1]
    }

    /// Whether a request on `slot` waits for its context to open first (the
    /// CPU, slot 0, needs none).
    pub(crate) fn opens_first(&self, slot: usize) -> bool {
        slot > 0 && !self.cells[slot - 1].initialized()
    }

    /// Names of the backends this session has a context on.
    pub(crate) fn open_on<'a>(&self, inner: &'a Inner) -> Vec<&'a str> {
        self.cells
            .iter()
            .enumerate()
            .filter(|(_, c)| c.initialized())
            .map(|(i, _)| inner.backends[i].name())
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
    inner: &'a Arc<Inner>,
    pub(crate) slot: usize,
    alg: Algorithm,
    dir: Direction,
    len: usize,
    started: Started,
    predicted: Option<Prediction>,
    _in_flight: InFlight<'a>,
}

/// When a dispatched request started. Engines are timed on tokio's clock (a
/// simulated engine under a paused clock completes in tokio time); CPU jobs
/// on the wall clock, which is the time they take whatever tokio's clock does.
enum Started {
    Tokio(Instant),
    Wall(std::time::Instant),
}

impl<'a> Dispatch<'a> {
    pub(crate) fn new(
        inner: &'a Arc<Inner>,
        slot: usize,
        alg: Algorithm,
        dir: Direction,
        len: usize,
        predicted: Option<Prediction>,
    ) -> Self {
        Dispatch {
            inner,
            slot,
            alg,
            dir,
            len,
            started: if slot == 0 {
                Started::Wall(std::time::Instant::now())
            } else {
                Started::Tokio(Instant::now())
            },
            // A request that waits for its device to resume is not a
            // service time: left out of the model.
            predicted: predicted.filter(|p| !p.cold),
            _in_flight: InFlight::new(&inner.models[slot].in_flight),
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
        self.inner.stats[self.slot].served(self.len);
        self.inner.breakers[self.slot].succeeded();
        if let Some(p) = self.predicted {
            let elapsed = match self.started {
                Started::Tokio(t) => t.elapsed(),
                Started::Wall(t) => t.elapsed(),
            };
            let observed = elapsed.as_nanos() as f64;
            if self.slot == 0 {
                // A CPU job dispatched away ran on the blocking pool: what it
                // took beyond the inline model is the hand-off.
                let model = &self.inner.models[0];
                let inline = p.expected * model.entry(self.alg, self.dir).correction_at(self.len);
                model.observe_handoff(inline, observed);
            } else {
                self.inner.observe(
                    self.slot, self.alg, self.dir, self.len, p.expected, observed,
                );
            }
        }
    }

    /// The backend failed the request: count it, open its breaker, and note
    /// the replay on the CPU.
    pub(crate) fn failed(self, error: &BackendError) {
        let name = self.inner.slot_name(self.slot);
        tracing::warn!(backend = name, error = %error, "backend failed a request; completing it on the CPU");
        self.inner.failed(self.slot, error);
        self.inner.stats[0].replayed.fetch_add(1, Ordering::Relaxed);
    }
}

/// Runs `f`, an inline CPU request: counted, and — when the `Offload` has
/// engines to weigh the CPU against — tracked in flight (the Throughput
/// policy watches it) and, one request in 64, timed into the CPU's model.
#[inline]
pub(crate) fn inline_cpu<T>(
    inner: &Inner,
    alg: Algorithm,
    dir: Direction,
    len: usize,
    predicted: Option<Prediction>,
    f: impl FnOnce() -> T,
) -> T {
    inner.stats[0].served(len);
    if inner.backends.is_empty() {
        return f();
    }
    // Only the Throughput policy weighs the CPU's load.
    let _in_flight = (inner.policy == crate::select::Policy::Throughput)
        .then(|| InFlight::new(&inner.models[0].in_flight));
    if !sample_now() && !predicted.is_some_and(|p| p.explored) {
        return f();
    }
    // Inline, the request does not queue: it is compared with the bare
    // service time (the selector's fast path makes no prediction).
    let base = match predicted {
        Some(p) => p.base,
        None => match inner.models[0].entry(alg, dir).cost() {
            Some(c) => c.latency_ns(len),
            None => return f(),
        },
    };
    // Real time: CPU work does not advance tokio's (possibly paused) clock.
    let start = std::time::Instant::now();
    let out = f();
    let observed = start.elapsed().as_nanos() as f64;
    inner.observe(0, alg, dir, len, base, observed);
    out
}

/// One call in 64 on each thread (no shared counter to contend on): two
/// clock reads cost ~50 ns here, so timing every request would double the
/// cost of a small one; one in 64 is under 1 ns a request and still
/// thousands of samples a second on a busy session.
fn sample_now() -> bool {
    thread_local! {
        static TICK: core::cell::Cell<u32> = const { core::cell::Cell::new(0) };
    }
    TICK.with(|t| {
        let n = t.get().wrapping_add(1);
        t.set(n);
        n.is_multiple_of(64)
    })
}

/// Spends tokio's cooperative budget for one request: one unit for an
/// engine request or a small CPU one, and one per ~0.8 µs of predicted inline
/// CPU work (at most 64) — so a task looping over inline requests yields to
/// the scheduler about every 100 µs of work (tokio's budget is 128 units),
/// and completions of other tasks' engine requests are not held up behind it.
/// `false` when the budget ran out: the caller returns `Pending` (the waker
/// is registered) and the request starts on the next poll.
#[inline]
pub(crate) fn spend_budget(
    cx: &mut core::task::Context<'_>,
    inner: &Inner,
    slot: usize,
    alg: Algorithm,
    dir: Direction,
    len: usize,
) -> bool {
    if slot != 0 || len < 4096 {
        return match tokio::task::coop::poll_proceed(cx) {
            core::task::Poll::Ready(coop) => {
                coop.made_progress();
                true
            }
            core::task::Poll::Pending => false,
        };
    }
    spend_units(cx, inner, alg, dir, len)
}

/// [`spend_budget`] for a larger CPU request: units in proportion to its
/// predicted time.
fn spend_units(
    cx: &mut core::task::Context<'_>,
    inner: &Inner,
    alg: Algorithm,
    dir: Direction,
    len: usize,
) -> bool {
    let ns = match inner.models[0].entry(alg, dir).cost() {
        Some(c) => c.latency_ns(len),
        None => len as f64 / default_rate(alg, dir),
    };
    let units = ((ns / 800.0) as u32).clamp(1, 64);
    for _ in 0..units {
        match tokio::task::coop::poll_proceed(cx) {
            core::task::Poll::Ready(coop) => coop.made_progress(),
            core::task::Poll::Pending => return false,
        }
    }
    true
}

/// A CPU job predicted to take at least this long leaves the async worker
/// for the blocking pool. The hand-off costs ~30 µs of latency (measured
/// with `offload bench`: a 256 KiB CRC-32C took 41 µs through the pool and
/// 5 µs inline; a 1 MiB XTS unit ran at 3.3 GB/s through it against 4.2
/// inline), so a job must be long for the hand-off to be small beside it.
pub(crate) const CPU_BLOCKING_NS: f64 = 500_000.0;

/// Each part of a job split over cores should be at least this long: a
/// scoped thread costs ~30–50 µs to start and join.
pub(crate) const CPU_SPLIT_PART_NS: f64 = 250_000.0;

/// Rough single-core rates (bytes/ns) when the CPU model is uncalibrated:
/// the build machines' numbers from the fallback's README, rounded down.
fn default_rate(alg: Algorithm, dir: Direction) -> f64 {
    use crate::alg::CipherMode;
    match alg {
        Algorithm::Crc(_) => 40.0,
        Algorithm::Aead(_) => 8.0,
        Algorithm::Cipher(c) => match (c.mode(), dir) {
            (CipherMode::Cbc, Direction::Encrypt) => 0.8,
            (CipherMode::Cbc, Direction::Decrypt) => 6.0,
            (CipherMode::Ctr, _) => 6.0,
            _ => 3.0,
        },
    }
}

/// Whether a CPU request of `len` bytes predicted (uncorrected) at `ns`
/// inline goes to the blocking pool, inside a runtime — and so pays the
/// learned hand-off ([`Model::observe_handoff`]).
///
/// [`Model::observe_handoff`]: crate::cost::Model::observe_handoff
#[inline]
pub(crate) fn blocks(len: usize, ns: f64) -> bool {
    len >= BLOCKING_MIN_LEN && ns >= CPU_BLOCKING_NS
}

/// No CPU request shorter than this leaves the calling task.
pub(crate) const BLOCKING_MIN_LEN: usize = 64 * 1024;

/// How a CPU request of `len` bytes runs: `None` inline, or `Some(parts)`
/// on the blocking pool in that many pieces (only inside a tokio runtime).
#[inline]
pub(crate) fn cpu_plan(inner: &Inner, alg: Algorithm, dir: Direction, len: usize) -> Option<usize> {
    // Cheap exit for the common small request.
    if len < BLOCKING_MIN_LEN {
        return None;
    }
    cpu_plan_large(inner, alg, dir, len)
}

fn cpu_plan_large(inner: &Inner, alg: Algorithm, dir: Direction, len: usize) -> Option<usize> {
    let ns = match inner.models[0].entry(alg, dir).cost() {
        Some(c) => c.latency_ns(len),
        None => len as f64 / default_rate(alg, dir),
    };
    if !blocks(len, ns) || tokio::runtime::Handle::try_current().is_err() {
        return None;
    }
    let parts = ((ns / CPU_SPLIT_PART_NS) as usize).clamp(1, inner.cores.clamp(1, 8));
    Some(parts)
}

/// Re-raises a blocking CPU job's panic (there is no buffer to hand back).
/// Polls a blocking-pool job of `alg`: `None` while it runs, then its
/// output with the buffer, or the typed error with the buffer.
pub(crate) fn poll_cpu_job<T, B>(
    job: &mut tokio::task::JoinHandle<(Result<T, crypto_offload_fallback::Error>, B)>,
    cx: &mut std::task::Context<'_>,
    alg: Algorithm,
) -> Option<Result<(T, B), crate::error::RequestError<B>>> {
    use std::task::Poll;
    match std::pin::Pin::new(job).poll(cx) {
        Poll::Pending => None,
        Poll::Ready(Ok((Ok(t), buf))) => Some(Ok((t, buf))),
        Poll::Ready(Ok((Err(e), buf))) => Some(Err(crate::error::RequestError::new(
            crate::cpu::map_error(alg, e),
            buf,
        ))),
        Poll::Ready(Err(e)) => join_failed(e),
    }
}

pub(crate) fn join_failed(e: tokio::task::JoinError) -> ! {
    match e.try_into_panic() {
        Ok(panic) => std::panic::resume_unwind(panic),
        Err(e) => panic!("the CPU job was cancelled: {e}"),
    }
}
