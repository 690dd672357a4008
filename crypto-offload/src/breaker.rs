//! The circuit breaker: a backend that fails a request is taken out of
//! selection until a periodic probe succeeds.
//!
//! A failure (any error but an authentication failure, which is the data's
//! fault, not the engine's) opens the breaker: the selector stops choosing
//! the backend, the failed request is replayed on the CPU, and a probe task
//! retries the backend with a small known-answer request every
//! `probe_interval` (doubling up to 32× while it keeps failing). The first
//! probe that succeeds closes the breaker. `offload probe` and
//! [`Offload::backends`](crate::Offload::backends) show the reason while it
//! is open.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// A backend's breaker state.
#[derive(Debug, Default)]
pub(crate) struct Breaker {
    open: AtomicBool,
    probing: AtomicBool,
    pub(crate) opened: AtomicU64,
    pub(crate) closed: AtomicU64,
    reason: Mutex<Option<String>>,
}

impl Breaker {
    /// Whether the backend is out of selection.
    #[inline]
    pub(crate) fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    /// Opens the breaker with `reason`; returns whether the caller should
    /// start the probe task (exactly one caller does).
    pub(crate) fn trip(&self, reason: String) -> bool {
        if let Ok(mut r) = self.reason.lock() {
            *r = Some(reason);
        }
        if !self.open.swap(true, Ordering::AcqRel) {
            self.opened.fetch_add(1, Ordering::Relaxed);
        }
        !self.probing.swap(true, Ordering::AcqRel)
    }

    /// Closes the breaker after a successful probe.
    pub(crate) fn close(&self) {
        if let Ok(mut r) = self.reason.lock() {
            *r = None;
        }
        if self.open.swap(false, Ordering::AcqRel) {
            self.closed.fetch_add(1, Ordering::Relaxed);
        }
        self.probing.store(false, Ordering::Release);
    }

    /// Stops probing without closing (the runtime went away).
    pub(crate) fn stop_probing(&self) {
        self.probing.store(false, Ordering::Release);
    }

    /// Why the breaker is open, if it is.
    pub(crate) fn reason(&self) -> Option<String> {
        if !self.is_open() {
            return None;
        }
        self.reason.lock().ok().and_then(|r| r.clone())
    }
}
