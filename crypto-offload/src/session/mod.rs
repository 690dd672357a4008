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
    started: Instant,
    predicted: Option<Prediction>,
    _in_flight: InFlight<'a>,
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
            started: Instant::now(),
            predicted,
            _in_flight: InFlight::new(&inner.models[slot].in_flight),
        }
    }

    /// The request completed: count it and fold its latency into the model.
    pub(crate) fn completed(self) {
        self.inner.stats[self.slot].served(self.len);
        if let Some(p) = self.predicted {
            let observed = self.started.elapsed().as_nanos() as f64;
            self.inner.models[self.slot]
                .entry(self.alg, self.dir)
                .observe(p.base, observed);
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
/// policy watches it) and, one request in 16, timed into the CPU's model.
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
    let _in_flight = InFlight::new(&inner.models[0].in_flight);
    let Some(p) = predicted.filter(|_| {
        inner
            .samples
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(16)
    }) else {
        return f();
    };
    // Real time: CPU work does not advance tokio's (possibly paused) clock.
    let start = std::time::Instant::now();
    let out = f();
    let observed = start.elapsed().as_nanos() as f64;
    inner.models[0].entry(alg, dir).observe(p.base, observed);
    out
}

/// CPU requests at least this long leave the async worker for the blocking
/// pool (≥ ~60 µs of AES-XTS or ~20 µs of GCM on the build machines).
pub(crate) const CPU_BLOCKING_MIN: usize = 256 * 1024;

/// CPU requests at least this long are also split over the cores.
pub(crate) const CPU_SPLIT_MIN: usize = 1024 * 1024;

/// Whether a CPU request of `len` bytes goes to the blocking pool (only
/// inside a tokio runtime).
pub(crate) fn cpu_blocking(len: usize) -> bool {
    len >= CPU_BLOCKING_MIN && tokio::runtime::Handle::try_current().is_ok()
}

/// How many parts a CPU request of `len` bytes is split into.
pub(crate) fn cpu_parts(inner: &Inner, len: usize) -> usize {
    if len >= CPU_SPLIT_MIN {
        inner.cores.clamp(1, 8)
    } else {
        1
    }
}

/// Re-raises a blocking CPU job's panic (there is no buffer to hand back).
pub(crate) fn join_failed(e: tokio::task::JoinError) -> ! {
    match e.try_into_panic() {
        Ok(panic) => std::panic::resume_unwind(panic),
        Err(e) => panic!("the CPU job was cancelled: {e}"),
    }
}
