//! Letting go of the device: `DeviceState::fail_all` (no more requests; those in
//! flight fail, their memory parked), `DeviceState::release` (the kernel asked
//! for the device back: it is closed and its BARs unmapped), and the drop
//! of the last handle, which quiesces the device — out of D3hot first —
//! before its memory goes.

use std::sync::atomic::Ordering;

use super::DeviceState;

impl DeviceState {
    /// Gives the device back to the kernel (it asked: hot-unplug): requests
    /// in flight fail, the device fd is closed and the BARs unmapped (the
    /// removal waits for that), and nothing reaches the device again.
    pub(super) fn release(&self) {
        let held = self.data.in_flight() + self.ctrl.in_flight();
        self.released_with.store(held, Ordering::Release);
        self.fail_all();
        let hw = self.hw.write().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(hw) = hw {
            let _ = hw.disable_msix();
            drop(hw);
        }
        // Its IOMMU mappings went with it: the parked buffers are free.
        self.parked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        tracing::warn!(address = %self.address, held, "device removed; released");
    }

    /// No more requests; those in flight fail (their buffers parked until
    /// a reset).
    pub(super) fn fail_all(&self) {
        self.gone.store(true, Ordering::Release);
        for q in [&self.data, &self.ctrl] {
            q.fail_all_into(|failed| {
                self.parked
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .extend(failed);
            });
        }
    }
}

impl Drop for DeviceState {
    fn drop(&mut self) {
        if let Some(task) = self.reaper.lock().unwrap_or_else(|p| p.into_inner()).take() {
            task.abort();
        }
        // Quiesce the device before its memory is released: reset through
        // the transport (and the function, where it can be). A device in
        // D3hot comes back first: its BARs are unmapped there, and touching
        // them would raise SIGBUS.
        if let Some(task) = self
            .watcher
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            task.abort();
        }
        let hw = self.hw.get_mut().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(hw) = hw {
            let awake = !self.low_power.load(Ordering::Acquire) || hw.set_low_power(false).is_ok();
            // Only with the function out of D3hot are its registers there.
            if awake {
                let _ = hw.reset();
            }
            let _ = hw.disable_msix();
            let _ = hw.reset_function();
        }
    }
}
