//! Waiting for completions: `DeviceState::wait` and `DeviceState::wait_burst` poll the
//! used ring with the device's interrupts off while completions keep coming
//! (`DeviceState::poll_until`, within the poll budget), then sleep on the
//! interrupt; `Polling` turns interrupts off for the first poller of a
//! queue and back on (draining once more) for the last.

use std::sync::atomic::Ordering;

use tokio::sync::oneshot;

use super::DeviceState;
use crate::error::Error;
use crate::queue::{Burst, Queue};

impl DeviceState {
    /// Waits for `rx`, the completion of a request on `q`: polls first
    /// ([`DeviceState::poll_until`]), then sleeps on the interrupt.
    ///
    /// # Cancel safety
    /// Cancel safe: the request's buffer stays with the queue; dropping the
    /// future turns interrupts back on if it was the last poller.
    pub(crate) async fn wait<T>(
        &self,
        q: &Queue,
        mut rx: oneshot::Receiver<T>,
    ) -> Result<T, Error> {
        let mut got = None;
        self.poll_until(q, || match rx.try_recv() {
            Ok(v) => {
                got = Some(v);
                Ok(true)
            }
            Err(oneshot::error::TryRecvError::Empty) => Ok(false),
            Err(oneshot::error::TryRecvError::Closed) => Err(self.failure()),
        })
        .await?;
        match got {
            Some(v) => Ok(v),
            None => rx.await.map_err(|_| self.failure()),
        }
    }

    /// Waits until every request of `burst` (on `q`) has completed: polls
    /// first ([`DeviceState::poll_until`]), then sleeps on the interrupt.
    ///
    /// # Cancel safety
    /// As for [`DeviceState::wait`].
    pub(crate) async fn wait_burst(&self, q: &Queue, burst: &Burst) -> Result<(), Error> {
        if self.poll_until(q, || burst.finished()).await? {
            return Ok(());
        }
        loop {
            let woken = burst.wake.notified();
            if burst.finished()? {
                return Ok(());
            }
            woken.await;
        }
    }

    /// Polls `q`'s used ring for completions (the device asked for no
    /// interrupts meanwhile) until `finished` says so — `Ok(true)` — or
    /// no completion has come for the poll budget (`Ok(false)`: the caller
    /// then sleeps on the interrupt, which is on again). It yields to the
    /// runtime once first (other tasks may have requests to add: the
    /// device then takes them in the same pass), then spins on the ring's
    /// index, yielding again only when nothing comes for a while: a yield
    /// costs a trip through the scheduler's I/O poll, a system call (2.9
    /// µs in the TCG guest against 8 ns for an atomic add), so it is not
    /// done once per look at the ring.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future turns interrupts back on if it was
    /// the last poller.
    async fn poll_until(
        &self,
        q: &Queue,
        mut finished: impl FnMut() -> Result<bool, Error>,
    ) -> Result<bool, Error> {
        /// Looks at the ring's index between yields.
        const SPINS: u32 = 512;
        let budget = std::time::Duration::from_nanos(self.poll_for.load(Ordering::Relaxed));
        if budget.is_zero() {
            // Interrupts only: the completion task drains.
            return finished();
        }
        self.drain(q);
        if finished()? {
            return Ok(true);
        }
        let _polling = Polling::start(self, q);
        // The clock is read once per round of spins that saw nothing, not
        // per completion.
        let mut quiet_since = std::time::Instant::now();
        let mut progress = false;
        tokio::task::yield_now().await;
        loop {
            let others = self.drain(q);
            if finished()? {
                return Ok(true);
            }
            if others > 0 {
                // Other callers' requests or bursts finished: let their
                // tasks run now, so that they send their next ones while the
                // device still works on ours (spinning on until ours are
                // done would let the queue run dry behind them).
                progress = true;
                tokio::task::yield_now().await;
                continue;
            }
            let mut spins = 0;
            while spins < SPINS && !self.has_used(q) {
                std::hint::spin_loop();
                spins += 1;
            }
            if spins < SPINS {
                progress = true;
                continue;
            }
            if std::mem::take(&mut progress) {
                quiet_since = std::time::Instant::now();
            } else if quiet_since.elapsed() > budget {
                // The guard's drop turns interrupts on and drains once more.
                return Ok(false);
            }
            tokio::task::yield_now().await;
        }
    }

    fn has_used(&self, q: &Queue) -> bool {
        q.lock().ring.has_used()
    }
}

/// A caller polling a queue: the device is asked for no interrupts while
/// any caller polls; the last one out turns them back on and drains the
/// ring (a completion may have come while they were off, with no
/// interrupt to announce it).
struct Polling<'a> {
    dev: &'a DeviceState,
    q: &'a Queue,
}

impl<'a> Polling<'a> {
    fn start(dev: &'a DeviceState, q: &'a Queue) -> Polling<'a> {
        let mut state = q.lock();
        state.pollers += 1;
        if state.pollers == 1 {
            let _ = state.ring.set_interrupts(false);
        }
        Polling { dev, q }
    }
}

impl Drop for Polling<'_> {
    fn drop(&mut self) {
        let mut state = self.q.lock();
        state.pollers -= 1;
        let last = state.pollers == 0;
        if last {
            let _ = state.ring.set_interrupts(true);
        }
        drop(state);
        if last {
            self.dev.drain(self.q);
        }
    }
}
