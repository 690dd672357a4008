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
//! is open. The probe task ([`spawn_probe`]) lives here with the breaker it
//! closes. Outside any tokio runtime there is no probe task: after
//! `probe_interval` the breaker goes half-open and live traffic is the probe
//! (a failure is still replayed on the CPU, and trips it again).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crypto_offload_fallback as fb;

use crate::alg::Algorithm;
use crate::backend::{AnyContext, Backend, CipherParams, SharedBackend};
use crate::buffer::IoBuf;
use crate::cpu::CpuBackend;
use crate::error::BackendError;
use crate::key::SecretKey;

/// A backend's breaker state. `open` is read on every selection; every
/// transition happens under `state`'s lock, so a trip and a close cannot
/// interleave into an open breaker that nothing probes.
#[derive(Debug, Default)]
pub(crate) struct Breaker {
    open: AtomicBool,
    /// A probe task runs (it owns closing the breaker).
    probing: AtomicBool,
    pub(crate) opened: AtomicU64,
    pub(crate) closed: AtomicU64,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    reason: Option<String>,
    /// With no runtime to probe from: when to let live traffic try the
    /// backend again (half-open). A request that then succeeds closes the
    /// breaker; one that fails is replayed on the CPU and trips it again.
    retry_at: Option<Instant>,
}

impl Breaker {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the backend is out of selection.
    #[inline]
    pub(crate) fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire) && self.closed_to_traffic()
    }

    #[cold]
    fn closed_to_traffic(&self) -> bool {
        if self.probing.load(Ordering::Acquire) {
            return true;
        }
        self.state().retry_at.is_none_or(|t| Instant::now() < t)
    }

    /// Opens the breaker with `reason`; returns whether the caller should
    /// start the probe task (exactly one caller does).
    pub(crate) fn trip(&self, reason: String) -> bool {
        let mut state = self.state();
        state.reason = Some(reason);
        state.retry_at = None;
        if !self.open.swap(true, Ordering::AcqRel) {
            self.opened.fetch_add(1, Ordering::Relaxed);
        }
        !self.probing.swap(true, Ordering::AcqRel)
    }

    /// Closes the breaker after a successful probe.
    pub(crate) fn close(&self) {
        let mut state = self.state();
        state.reason = None;
        state.retry_at = None;
        if self.open.swap(false, Ordering::AcqRel) {
            self.closed.fetch_add(1, Ordering::Relaxed);
        }
        self.probing.store(false, Ordering::Release);
    }

    /// No probe task can run (no tokio runtime): live traffic probes the
    /// backend instead, `after` from now.
    pub(crate) fn probe_by_traffic(&self, after: Duration) {
        let mut state = self.state();
        state.retry_at = Some(Instant::now() + after.min(Duration::from_secs(3600)));
        self.probing.store(false, Ordering::Release);
    }

    /// A request on the backend succeeded: if the breaker is half-open
    /// (open with no probe task), that closes it.
    #[inline]
    pub(crate) fn succeeded(&self) {
        if self.open.load(Ordering::Acquire) && !self.probing.load(Ordering::Acquire) {
            self.close();
        }
    }

    /// Why the breaker is open, if it is.
    pub(crate) fn reason(&self) -> Option<String> {
        if !self.open.load(Ordering::Acquire) {
            return None;
        }
        self.state().reason.clone()
    }
}

/// Probes `backend` every `interval` (doubling up to 32× while probes
/// fail) until one succeeds, then closes `breaker`. The task holds both
/// weakly: it stops when the `Offload` that owns them is dropped. Outside a
/// tokio runtime live traffic probes instead ([`Breaker::probe_by_traffic`]).
pub(crate) fn spawn_probe(breaker: &Arc<Breaker>, backend: &SharedBackend, interval: Duration) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        breaker.probe_by_traffic(interval);
        return;
    };
    let (breaker, backend) = (Arc::downgrade(breaker), Arc::downgrade(backend));
    runtime.spawn(async move {
        let mut wait = interval;
        loop {
            tokio::time::sleep(wait).await;
            let (Some(breaker), Some(backend)) = (breaker.upgrade(), backend.upgrade()) else {
                return;
            };
            match probe(&*backend).await {
                Ok(()) => {
                    tracing::info!(
                        backend = backend.name(),
                        "probe succeeded; closing the circuit"
                    );
                    breaker.close();
                    return;
                }
                Err(e) => {
                    tracing::debug!(backend = backend.name(), error = %e, "probe failed");
                    wait = wait.saturating_mul(2).min(interval.saturating_mul(32));
                }
            }
        }
    });
}

/// A small known-answer request on the first algorithm the backend runs,
/// checked against the CPU.
async fn probe(backend: &dyn Backend) -> Result<(), BackendError> {
    let Some(alg) = Algorithm::all().find(|&a| backend.limits(a).is_some()) else {
        return Ok(());
    };
    let wrong = || BackendError::Other("probe: wrong result".into());
    let other = |e: crate::error::Error| BackendError::Other(Box::new(e));
    let data: Vec<u8> = (0..64u8).collect();
    let right = match (AnyContext::open(backend, alg).await?, alg) {
        (AnyContext::Cipher(c), Algorithm::Cipher(a)) => {
            let params = CipherParams::new([5; 16], data.len());
            let got = c
                .encrypt(params, IoBuf::from(data.clone()))
                .await
                .map_err(|f| f.error)?;
            let cpu = CpuBackend::new()
                .cipher(a, SecretKey::for_tests(a.key_len()).expose())
                .map_err(other)?;
            let mut want = data;
            cpu.run(true, &params, &mut want)
                .map_err(|e| BackendError::Other(Box::new(e)))?;
            Vec::from(got) == want
        }
        (AnyContext::Aead(g), Algorithm::Aead(a)) => {
            let (ct, tag) = g
                .seal([5; 12], b"probe", IoBuf::from(data.clone()))
                .await
                .map_err(|f| f.error)?;
            let cpu = CpuBackend::new()
                .aead(a, SecretKey::for_tests(a.key_len()).expose())
                .map_err(other)?;
            let mut want = data;
            let want_tag = cpu
                .seal_in_place_detached(&[5; 12], b"probe", &mut want)
                .map_err(|e| BackendError::Other(Box::new(e)))?;
            Vec::from(ct) == want && tag == want_tag
        }
        (AnyContext::Crc(c), Algorithm::Crc(a)) => {
            let (_, crc) = c
                .checksum(IoBuf::from(data.clone()))
                .await
                .map_err(|f| f.error)?;
            crc == fb::checksum(a, &data)
        }
        _ => false,
    };
    if right { Ok(()) } else { Err(wrong()) }
}
