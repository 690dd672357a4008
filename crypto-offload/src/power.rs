//! Power domains: one reference count per device, with autosuspend.
//!
//! The lesson of the OMAP AES driver (it lost up to half its throughput
//! calling runtime-PM get/put around every block): power belongs to
//! sessions, not requests. A session takes a [`PowerRef`] when it first uses
//! a device and drops it when the session drops; requests in flight hold a
//! clone until they complete (so a cancelled request cannot cut the power
//! under a DMA). The first reference resumes the device; when the last one
//! goes, the device is suspended after `autosuspend_delay` unless a new
//! reference arrives first — so a stream of short sessions does not thrash.
//!
//! Drivers supply the on/off primitive ([`PowerControl`]: VFIO low-power
//! entry/exit, sysfs runtime-PM, or the simulated engine's model); the
//! domain counts transitions and resume latency ([`PowerStats`]).

use core::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;
use tracing::Instrument;

use crate::error::BackendError;

/// A device's power switch, as its driver provides it.
#[async_trait]
pub trait PowerControl: Send + Sync + 'static {
    /// Brings the device to full power (resume).
    ///
    /// # Cancel safety
    /// The domain never drops this future before it completes.
    async fn power_on(&self) -> Result<(), BackendError>;

    /// Lets the device go to its low-power state (suspend).
    ///
    /// # Cancel safety
    /// The domain never drops this future before it completes.
    async fn power_off(&self) -> Result<(), BackendError>;
}

/// Transition counts and resume latency of a [`PowerDomain`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PowerStats {
    /// Completed resumes (power-on transitions).
    pub resumes: u64,
    /// Completed suspends (power-off transitions).
    pub suspends: u64,
    /// Time spent in resumes, summed.
    pub resume_time: Duration,
    /// The last resume's latency.
    pub last_resume: Duration,
    /// Whether the device is powered now.
    pub powered: bool,
    /// References held now (sessions and in-flight requests).
    pub references: usize,
    /// Transitions that failed (the device stays in its previous state).
    pub failures: u64,
}

/// A device's reference-counted power state. Cheap to clone (an `Arc`).
#[derive(Clone)]
pub struct PowerDomain {
    inner: Arc<Domain>,
}

struct Domain {
    name: String,
    control: Box<dyn PowerControl>,
    delay: Duration,
    /// Counts, under a plain mutex: dropping a reference is synchronous.
    counts: Mutex<Counts>,
    /// Serialises transitions (held across `power_on`/`power_off`).
    transition: tokio::sync::Mutex<()>,
    /// Where delayed suspends run.
    runtime: Option<tokio::runtime::Handle>,
}

#[derive(Default)]
struct Counts {
    refs: usize,
    /// Bumped by every acquire and every last release: a pending suspend
    /// goes ahead only if nothing happened since it was scheduled.
    generation: u64,
    stats: PowerStats,
}

impl fmt::Debug for PowerDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PowerDomain")
            .field("name", &self.inner.name)
            .field("autosuspend_delay", &self.inner.delay)
            .field("stats", &self.stats())
            .finish()
    }
}

impl PowerDomain {
    /// A domain for the device `name`, initially unpowered (its first
    /// reference resumes it). The delayed suspend runs on the tokio runtime
    /// the last reference is dropped in (or the one this was created in);
    /// with no runtime at all the device simply stays powered.
    pub fn new(
        name: impl Into<String>,
        control: impl PowerControl,
        autosuspend_delay: Duration,
    ) -> Self {
        PowerDomain {
            inner: Arc::new(Domain {
                name: name.into(),
                control: Box::new(control),
                delay: autosuspend_delay,
                counts: Mutex::new(Counts::default()),
                transition: tokio::sync::Mutex::new(()),
                runtime: tokio::runtime::Handle::try_current().ok(),
            }),
        }
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The autosuspend delay.
    pub fn autosuspend_delay(&self) -> Duration {
        self.inner.delay
    }

    /// Takes a reference, resuming the device if it is not powered.
    ///
    /// # Errors
    /// The driver's error if the resume fails (no reference is taken).
    ///
    /// # Cancel safety
    /// The resume runs in its own task (on the domain's tokio runtime), so
    /// dropping this future does not cut it short: it completes, and the
    /// reference it took is dropped, which schedules the usual autosuspend.
    /// Outside any tokio runtime the resume runs in this future instead.
    pub async fn acquire(&self) -> Result<PowerRef, BackendError> {
        let resume = self.inner.clone().resume_and_take();
        match self.inner.runtime() {
            Some(rt) => rt.spawn(resume).await.unwrap_or_else(|e| {
                Err(BackendError::Other(
                    format!("power_on did not complete: {e}").into(),
                ))
            }),
            None => resume.await,
        }
    }

    /// The counts so far.
    pub fn stats(&self) -> PowerStats {
        self.inner.lock().stats
    }

    /// Whether the device is powered now.
    pub fn is_powered(&self) -> bool {
        self.stats().powered
    }
}

impl Domain {
    fn lock(&self) -> MutexGuard<'_, Counts> {
        // The counts stay consistent even if a holder panicked: every
        // critical section is a few integer updates.
        self.counts
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Where transitions and delayed suspends run: the caller's runtime, or
    /// the one the domain was created in.
    fn runtime(&self) -> Option<tokio::runtime::Handle> {
        tokio::runtime::Handle::try_current()
            .ok()
            .or_else(|| self.runtime.clone())
    }

    /// Resumes the device if it is off and takes a reference, all under the
    /// transition lock (so no suspend can slip in between).
    async fn resume_and_take(self: Arc<Self>) -> Result<PowerRef, BackendError> {
        let _transition = self.transition.lock().await;
        let powered = {
            let mut c = self.lock();
            c.generation += 1;
            c.stats.powered
        };
        if !powered {
            let span = tracing::debug_span!("power_on", device = %self.name);
            let start = Instant::now();
            let result = self.control.power_on().instrument(span).await;
            let took = start.elapsed();
            let mut c = self.lock();
            match result {
                Ok(()) => {
                    c.stats.powered = true;
                    c.stats.resumes += 1;
                    c.stats.resume_time += took;
                    c.stats.last_resume = took;
                }
                Err(e) => {
                    c.stats.failures += 1;
                    return Err(e);
                }
            }
        }
        let mut c = self.lock();
        c.refs += 1;
        c.stats.references = c.refs;
        drop(c);
        Ok(PowerRef {
            domain: self.clone(),
            released: false,
        })
    }

    /// Suspends the device now, under the transition lock, if it is on and
    /// no reference has been taken since.
    async fn suspend(&self, generation: u64) {
        let _transition = self.transition.lock().await;
        {
            let c = self.lock();
            if c.refs > 0 || c.generation != generation || !c.stats.powered {
                return;
            }
        }
        let span = tracing::debug_span!("power_off", device = %self.name);
        let result = self.control.power_off().instrument(span).await;
        let mut c = self.lock();
        match result {
            Ok(()) => {
                c.stats.powered = false;
                c.stats.suspends += 1;
            }
            Err(e) => {
                c.stats.failures += 1;
                tracing::warn!(device = %self.name, error = %e, "suspend failed; the device stays powered");
            }
        }
    }

    fn release(self: &Arc<Self>) {
        let generation = {
            let mut c = self.lock();
            c.refs = c.refs.saturating_sub(1);
            c.stats.references = c.refs;
            if c.refs > 0 {
                return;
            }
            c.generation += 1;
            c.generation
        };
        let Some(runtime) = self.runtime() else {
            return;
        };
        let domain = self.clone();
        runtime.spawn(async move {
            tokio::time::sleep(domain.delay).await;
            domain.suspend(generation).await;
        });
    }
}

/// A held power reference: the device stays powered while any exists.
/// Cloning takes another reference (the device is already on); dropping the
/// last one schedules the autosuspend.
pub struct PowerRef {
    domain: Arc<Domain>,
    /// Already uncounted (by `put_sync`).
    released: bool,
}

impl PowerRef {
    /// Drops this reference and, if it was the last, suspends the device
    /// now rather than after the autosuspend delay — what a driver calling
    /// `pm_runtime_put_sync` per request does (and what sessions exist to
    /// avoid: it is here so the simulated engine can reproduce the cost).
    ///
    /// # Cancel safety
    /// The release and the suspend run in their own task (on the domain's
    /// tokio runtime), so dropping this future does not stop them. Outside
    /// any tokio runtime they run in this future; dropped there, the device
    /// stays powered, as the domain's delayed suspends need a runtime too.
    pub async fn put_sync(mut self) {
        let domain = self.domain.clone();
        // Uncounted here, synchronously, whatever happens to this future.
        self.released = true;
        drop(self);
        let generation = {
            let mut c = domain.lock();
            c.refs = c.refs.saturating_sub(1);
            c.stats.references = c.refs;
            if c.refs > 0 {
                return;
            }
            c.generation += 1;
            c.generation
        };
        let runtime = domain.runtime();
        let suspend = async move { domain.suspend(generation).await };
        match runtime {
            Some(rt) => {
                // A panic in the driver's `power_off` stays in its task.
                let _ = rt.spawn(suspend).await;
            }
            None => suspend.await,
        }
    }
}

impl Clone for PowerRef {
    fn clone(&self) -> Self {
        let mut c = self.domain.lock();
        c.refs += 1;
        c.stats.references = c.refs;
        drop(c);
        PowerRef {
            domain: self.domain.clone(),
            released: false,
        }
    }
}

impl Drop for PowerRef {
    fn drop(&mut self) {
        if !self.released {
            self.domain.release();
        }
    }
}

impl fmt::Debug for PowerRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PowerRef")
            .field("device", &self.domain.name)
            .finish()
    }
}
