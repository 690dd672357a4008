//! The device's two background tasks and what they do: `reap`, the
//! completion task, which wakes on the MSI-X eventfd and drains both queues
//! (`DeviceState::drain`, also called by polling callers), and `watch_removal`,
//! which waits for the kernel's request to have the device back
//! (hot-unplug) and releases it; `readable` registers their eventfds with
//! the runtime.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use nix::sys::eventfd::EventFd;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::Notify;

use super::DeviceState;
use crate::error::Error;
use crate::queue::Queue;

/// `fd` registered with the runtime, to be awaited when readable.
pub(super) fn readable(fd: EventFd) -> Result<AsyncFd<EventFd>, Error> {
    // SAFETY: the `EventFd` owns its descriptor, so it stays open for as
    // long as the `AsyncFd` that now owns the `EventFd` lives.
    unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }.map_err(|e| Error::Io {
        op: "AsyncFd::register",
        source: std::io::Error::other(e.to_string()),
    })
}

/// Waits for the kernel's request to have the device back (its removal:
/// VFIO's request interrupt), then releases it.
pub(super) async fn watch_removal(inner: Weak<DeviceState>, req: AsyncFd<EventFd>) {
    loop {
        let mut ready = match req.readable().await {
            Ok(r) => r,
            Err(_) => return,
        };
        if let Ok(Ok(_)) = ready.try_io(|fd| fd.get_ref().read().map_err(std::io::Error::from)) {
            if let Some(inner) = inner.upgrade() {
                inner.release();
            }
            return;
        }
    }
}

/// How often the completion task drains the data queue itself while
/// callers sleep behind a poller and no interrupt comes (the device's
/// interrupts are off while one polls): the bound on how long a poller
/// whose future is not being polled can hold up the others.
pub(super) const WATCHDOG: std::time::Duration = std::time::Duration::from_millis(1);

/// The completion task: each interrupt drains both queues; while callers
/// sleep behind a poller, it also drains the data queue every
/// [`WATCHDOG`] without an interrupt; and it gives up on requests whose
/// deadline has come ([`Queue::expire`]: one timer here for the earliest,
/// not one a request).
pub(super) async fn reap(inner: Weak<DeviceState>, irq: AsyncFd<EventFd>, watch: Arc<Notify>) {
    loop {
        let (watching, earliest) = match inner.upgrade() {
            Some(inner) => inner.data.watch_state(),
            None => return,
        };
        let wake_at = if watching {
            let tick = tokio::time::Instant::now() + WATCHDOG;
            Some(earliest.map_or(tick, |e| e.min(tick)))
        } else {
            earliest
        };
        let ready = match wake_at {
            Some(at) => tokio::select! {
                r = irq.readable() => Some(r),
                () = watch.notified() => None,
                () = tokio::time::sleep_until(at) => None,
            },
            None => tokio::select! {
                r = irq.readable() => Some(r),
                () = watch.notified() => None,
            },
        };
        let Some(ready) = ready else {
            let Some(inner) = inner.upgrade() else { return };
            if watching {
                inner.data.kick(&*inner);
                inner.drain(&inner.data);
            }
            inner.data.expire(tokio::time::Instant::now());
            continue;
        };
        let mut ready = match ready {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(%e, "interrupt eventfd failed");
                return;
            }
        };
        // Consume the count (interrupts since the last read); spurious
        // wake-ups read EAGAIN.
        let count = ready.try_io(|fd| fd.get_ref().read().map_err(std::io::Error::from));
        let Some(inner) = inner.upgrade() else { return };
        if let Ok(Ok(n)) = count {
            inner.interrupts.fetch_add(n, Ordering::Relaxed);
        }
        inner.drain(&inner.data);
        inner.drain(&inner.ctrl);
        // Interrupts may keep winning the race with the deadline's timer.
        let now = tokio::time::Instant::now();
        if earliest.is_some_and(|e| e <= now) {
            inner.data.expire(now);
        }
    }
}

impl DeviceState {
    /// Hands every completed request of `q` back to its caller; how many
    /// callers that finished (whose tasks may now go on). A completion that
    /// breaks the ring's rules fails the device ([`Host::broken`]).
    ///
    /// [`Host::broken`]: crate::queue::Host::broken
    pub(super) fn drain(&self, q: &Queue) -> u64 {
        q.drain(self)
    }
}
