//! The engine's state, shared by the [`SimEngine`](crate::SimEngine) and
//! its contexts, and the request path through the model: slot, power,
//! submission cost, fate, queue, completion, result.

use std::sync::{Arc, Mutex};

use crypto_offload::Algorithm;
use crypto_offload::backend::{BackendError, Failed, IoBuf, PowerDomain, PowerRef};
use crypto_offload_fallback as fb;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::config::{SimConfig, SimTimer};
use crate::device::{self, Device, InFlight, Queue, spin};
use crate::fate::{Fate, Faults};

pub(crate) struct Shared {
    pub(crate) config: SimConfig,
    queues: Vec<Queue>,
    /// With `SimTimer::Device`: each queue's completion thread.
    devices: Vec<Arc<Device>>,
    pub(crate) slots: Arc<Semaphore>,
    pub(crate) power: Option<PowerDomain>,
    pub(crate) faults: Faults,
}

impl Shared {
    /// The engine `config` describes (normalized), its queues' threads
    /// started.
    pub(crate) fn new(config: SimConfig) -> Self {
        let config = config.normalized();
        let power = config
            .power
            .map(|p| crate::power::domain(&config.name, p, config.timer));
        let now = Instant::now();
        let queues = (0..config.queues).map(|_| Queue::new(now)).collect();
        let slots = Arc::new(Semaphore::new(config.queues * config.queue_depth));
        let devices = match config.timer {
            SimTimer::Tokio => Vec::new(),
            SimTimer::Device => (0..config.queues)
                .map(|q| Device::start(format!("{}-q{q}", config.name), config.completion_cpu))
                .collect(),
        };
        Shared {
            faults: Faults::new(config.faults),
            config,
            queues,
            devices,
            slots,
            power,
        }
    }

    /// The slots of all queues.
    pub(crate) fn capacity(&self) -> usize {
        self.config.queues * self.config.queue_depth
    }

    pub(crate) fn check_open(&self, alg: Algorithm) -> Result<(), BackendError> {
        if self.faults.is_gone() {
            return Err(BackendError::DeviceGone);
        }
        if !self.config.algorithms.contains(&alg) {
            return Err(BackendError::Unsupported(alg.name().to_owned()));
        }
        Ok(())
    }

    /// The power reference a context holds for its lifetime: one per
    /// session, or none in `per_request` mode (each request takes its own).
    pub(crate) async fn session_power(&self) -> Result<Option<PowerRef>, BackendError> {
        match (&self.power, self.config.power) {
            (Some(d), Some(p)) if !p.per_request => Ok(Some(d.acquire().await?)),
            _ => Ok(None),
        }
    }

    /// Runs one request through the model; `compute` makes the real result
    /// in place when it completes. On any failure `buf` comes back unchanged.
    pub(crate) async fn run<T: Default>(
        self: &Arc<Self>,
        power: &Option<PowerRef>,
        buf: IoBuf,
        compute: impl FnOnce(&mut [u8]) -> Result<T, fb::Error>,
    ) -> Result<(IoBuf, T), Failed> {
        if self.faults.is_gone() {
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
        let fate = self.faults.fate();
        let (queue, done) = device::schedule(&self.queues, self.config.service_time(buf.len()));
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
                let in_flight = InFlight::new(held, buf, wake);
                tokio::time::sleep_until(wake).await;
                if !hung {
                    self.queues[queue].complete(self.config.completion_cpu);
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
                let buf = core::mem::replace(&mut *device::lock(&dma), IoBuf::from(Vec::new()));
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

impl Drop for Shared {
    fn drop(&mut self) {
        for d in &self.devices {
            d.stop();
        }
    }
}
