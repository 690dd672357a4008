//! What the device tells about itself: DMA units, requests in flight and
//! back-pressure counts, parked buffers, why it is broken, a register and
//! ring dump ([`CryptoDevice::diagnose`]), interrupts received, the threads
//! that handed completions back (counted by `DeviceState::count_completions`),
//! and whether it was released or is gone.

use std::sync::atomic::Ordering;

use super::{CryptoDevice, DeviceState};

impl CryptoDevice {
    /// DMA pool units in use (returns to its idle level when no request is
    /// in flight: nothing leaks).
    pub fn dma_units_in_use(&self) -> usize {
        self.inner.pool.units_in_use()
    }

    /// Bytes of the DMA pool held by device-ready buffers
    /// ([`CryptoDevice::try_buffer`]), in whole units, in flight or not:
    /// 0 once every buffer is dropped.
    pub fn buffer_bytes(&self) -> usize {
        self.inner.pool.lent.load(Ordering::Acquire)
    }

    /// Requests the device holds.
    pub fn in_flight(&self) -> usize {
        self.inner.data.in_flight() + self.inner.ctrl.in_flight()
    }

    /// Times a submission of data requests found the queue full
    /// (back-pressure: more requests were sent than the device holds). It
    /// staged what fit and waited for room for the rest — unless the
    /// device had made room meanwhile (QEMU's completes requests within the
    /// doorbell's write).
    pub fn queue_full_count(&self) -> u64 {
        self.inner.data.full.load(Ordering::Relaxed)
    }

    /// DMA buffers kept from failed requests until the device can no
    /// longer write them (a reset, or its release).
    pub fn parked_buffers(&self) -> usize {
        self.inner
            .parked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// Why the device is no longer trusted, if it broke the virtio rules
    /// (a used entry naming no request, a used index running ahead): it
    /// then takes no requests.
    pub fn broken(&self) -> Option<String> {
        self.inner
            .broken
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The device status and each queue's indices, for diagnosing a device
    /// that stopped answering.
    pub fn diagnose(&self) -> String {
        // Its registers are out of reach in D3hot: `with_awake_hw` says so.
        let status = self
            .inner
            .with_awake_hw(|hw| hw.status())
            .map_or_else(|e| e.to_string(), |s| format!("{s:#x}"));
        let mut out = format!("status {status}");
        if let Some(why) = self.broken() {
            out += &format!("; broken: {why}");
        }
        for (name, q) in [("data", &self.inner.data), ("ctrl", &self.inner.ctrl)] {
            let state = q.lock();
            out += &format!(
                "; {name} queue {}: {} pending, tickets {}, {}",
                q.index,
                state.pending.len(),
                state.tickets.diagnose(),
                state.ring.diagnose()
            );
        }
        out += &format!(
            "; {} DMA units in use, {} buffers parked, {} sessions live{}",
            self.inner.pool.units_in_use(),
            self.parked_buffers(),
            self.inner.sessions.load(Ordering::Acquire),
            if self.is_suspended() {
                ", suspended"
            } else {
                ""
            }
        );
        out
    }

    /// MSI-X interrupts received so far (each can announce many
    /// completions; none come while callers poll).
    pub fn interrupts(&self) -> u64 {
        self.inner.interrupts.load(Ordering::Relaxed)
    }

    /// Completions handed back so far, per thread that found them (by
    /// interrupt or by polling; a tokio worker's name and the thread's
    /// id): where this device's completion work ran.
    pub fn completion_threads(&self) -> Vec<(String, u64)> {
        let map = self
            .inner
            .completion_threads
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let mut v: Vec<_> = map.iter().map(|(_, name, n)| (name.clone(), *n)).collect();
        v.sort();
        v
    }

    /// How many requests the device held when the kernel asked for it back
    /// (0 if it never did).
    pub fn released_with(&self) -> usize {
        self.inner.released_with.load(Ordering::Acquire)
    }

    /// Whether the kernel took the device back (hot-unplug).
    pub fn is_released(&self) -> bool {
        self.inner
            .hw
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .is_none()
    }

    /// Whether the device was reset or removed under its requests.
    pub fn is_gone(&self) -> bool {
        self.inner.gone.load(Ordering::Acquire)
    }
}

impl DeviceState {
    /// Notes that this thread handed back `n` completions (the spreading
    /// measurement: which threads do the completion work).
    pub(super) fn count_completions(&self, n: u64) {
        // By thread id (a cheap comparison: this runs for every drain that
        // found something); the name is made once per thread.
        let id = std::thread::current().id();
        let mut threads = self
            .completion_threads
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        match threads.iter_mut().find(|(t, _, _)| *t == id) {
            Some((_, _, count)) => *count += n,
            None => {
                let thread = std::thread::current();
                let name = format!("{} {id:?}", thread.name().unwrap_or("thread"));
                threads.push((id, name, n));
            }
        }
    }
}
