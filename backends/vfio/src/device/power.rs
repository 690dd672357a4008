//! Power and reset: [`CryptoDevice::reset`] (the transport, then the
//! function; parked memory freed only if both succeed), and
//! [`CryptoDevice::suspend`] and [`CryptoDevice::resume`] — marking the
//! device suspended under the queues' locks, then entering D3hot under the
//! hardware's write lock, and setting it up again on the way back.

use std::sync::atomic::Ordering;

use super::{CryptoDevice, DeviceState};
use crate::error::Error;
use crate::queue::Host;

impl CryptoDevice {
    /// Resets the device — the virtio transport first (its status must
    /// read back 0: the device has let go of the rings and every buffer),
    /// then the function (`VFIO_DEVICE_RESET`): every request in flight
    /// fails with [`Error::Gone`] (its caller's buffer unchanged), and the
    /// device takes no more. The DMA memory of failed requests is reused
    /// only once both resets succeeded; if either fails it stays parked
    /// (the device might still write it) until the device is released.
    ///
    /// # Errors
    /// The reset that failed; [`Error::Device`] while suspended (the
    /// device then holds nothing: it was reset when it was suspended).
    pub fn reset(&self) -> Result<(), Error> {
        let inner = &self.inner;
        inner.fail_all();
        let r = inner.with_awake_hw(|hw| {
            hw.reset()?;
            hw.reset_function()
        });
        match &r {
            // Quiet now: what the device could have written is free again.
            Ok(()) => inner
                .parked
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clear(),
            Err(e) => tracing::warn!(
                address = %inner.address,
                error = %e,
                parked = inner.parked.lock().unwrap_or_else(|p| p.into_inner()).len(),
                "reset failed: failed requests' memory stays parked"
            ),
        }
        r
    }

    /// Puts the device in the PCI low-power state (D3hot, through
    /// `VFIO_DEVICE_FEATURE` LOW_POWER_ENTRY), after the requests still in
    /// flight (a dropped session's destroy) complete. The device loses its
    /// virtio state: it takes no requests until [`CryptoDevice::resume`].
    ///
    /// Safe against concurrent use: no request is staged once the device
    /// is marked suspended (under the queues' locks, where submitters
    /// check), and no doorbell is rung once it enters D3hot (a BAR write
    /// there is a SIGBUS): doorbells are rung under the hardware's read
    /// lock, which the entry takes for writing.
    ///
    /// A no-op on a device already suspended. Suspend and resume from any
    /// thread are serialised: the check, the marking and the entry into
    /// D3hot happen under one lock a resume also takes.
    ///
    /// # Errors
    /// [`Error::Invalid`] while sessions live (their device sessions would
    /// be lost); [`Error::Device`] if requests stay in flight for a second;
    /// the ioctl's error (the device is then set up again and stays
    /// usable).
    ///
    /// # Cancel safety
    /// Cancel safe: the only await is the wait for requests in flight,
    /// before anything changes.
    pub async fn suspend(&self) -> Result<(), Error> {
        let inner = &self.inner;
        let start = std::time::Instant::now();
        loop {
            {
                let _power = inner.power.lock().unwrap_or_else(|p| p.into_inner());
                if inner.low_power.load(Ordering::Acquire) {
                    return Ok(());
                }
                if inner.mark_suspended()? {
                    return inner.enter_low_power_locked();
                }
            }
            if start.elapsed() > std::time::Duration::from_secs(1) {
                return Err(Error::Device("requests still in flight after 1 s".into()));
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }

    /// Brings the device back from [`CryptoDevice::suspend`] (LOW_POWER_EXIT)
    /// and sets it up again: the virtio handshake, MSI-X and both queues.
    /// A no-op on a device that is not suspended.
    ///
    /// # Errors
    /// The ioctl's error, or the device's refusal during set-up.
    pub fn resume(&self) -> Result<(), Error> {
        let inner = &self.inner;
        let _power = inner.power.lock().unwrap_or_else(|p| p.into_inner());
        if !inner.low_power.load(Ordering::Acquire) {
            return Ok(());
        }
        inner.with_hw(|hw| hw.set_low_power(false))?;
        inner.reinit()?;
        inner.low_power.store(false, Ordering::Release);
        Ok(())
    }

    /// Whether the device is in the low-power state (its BARs are then out
    /// of reach: this driver touches none until it is resumed).
    pub fn is_suspended(&self) -> bool {
        self.inner.low_power.load(Ordering::Acquire)
    }
}

impl DeviceState {
    /// Marks the device suspended if it holds no request and no session
    /// lives — under both queues' locks, where submitters check, so that
    /// no request is staged after it. `Ok(false)`: requests are still in
    /// flight (wait and try again).
    fn mark_suspended(&self) -> Result<bool, Error> {
        let data = self.data.lock();
        let ctrl = self.ctrl.lock();
        let live = self.sessions.load(Ordering::Acquire);
        if live > 0 {
            return Err(Error::Invalid {
                what: "suspend",
                detail: format!("{live} sessions live on the device"),
            });
        }
        self.accepting_or_suspended()?;
        if !(data.pending.is_empty() && ctrl.pending.is_empty()) {
            return Ok(false);
        }
        self.low_power.store(true, Ordering::Release);
        Ok(true)
    }

    /// The device marked suspended ([`DeviceState::mark_suspended`], with the
    /// power lock held since, so that no resume came between): resets its
    /// transport and enters D3hot — holding the hardware's write lock, so
    /// that a doorbell already on its way (under the read lock) is rung
    /// before and none after. If that fails the device is set up again
    /// and taken out of the suspended state.
    fn enter_low_power_locked(&self) -> Result<(), Error> {
        let entered = {
            let guard = self.hw.write().unwrap_or_else(|p| p.into_inner());
            match guard.as_ref() {
                Some(hw) => hw.reset().and_then(|()| hw.set_low_power(true)),
                None => Err(Error::Gone),
            }
        };
        let Err(e) = entered else {
            return Ok(());
        };
        // Still in D0 (whatever reset it had, it is set up again).
        match self.reinit() {
            Ok(()) => self.low_power.store(false, Ordering::Release),
            Err(again) => self.broken(
                &self.data,
                Error::Broken(format!(
                    "low-power entry failed ({e}) and the device did not come back: {again}"
                )),
                Vec::new(),
            ),
        }
        Err(e)
    }
}
