//! Waiting for completions: `DeviceState::wait` and `DeviceState::wait_burst` poll the
//! used ring with the device's interrupts off while completions keep coming
//! (`DeviceState::poll_until`, within the poll budget), then sleep on the
//! interrupt; `Polling` turns interrupts off for the first poller of a
//! queue and back on (draining once more) for the last.

use std::ops::Deref;
use std::sync::atomic::Ordering;
use std::task::Poll;

use super::DeviceState;
use crate::dma::DmaBuf;
use crate::error::Error;
use crate::queue::{Burst, Queue, Ticket, TicketPoll};

impl DeviceState {
    /// Waits for `ticket`, the completion of a request on `q`. One caller
    /// at a time polls the ring (the first to find nobody polling); the
    /// others sleep on their tickets, woken by its drains — so a request
    /// arriving while the device is busy costs no poll loop, no yield and
    /// no channel, and a lone request polls for itself at once. A poller
    /// whose request is done hands the ring to a sleeper whose request is
    /// not ([`Queue::stop_polling`]); one that saw nothing for the poll
    /// budget sleeps on the interrupt like the rest. A ticket past its
    /// deadline ([`Queue::expire`]) fails with [`Error::Timeout`] (the
    /// request stays with the queue until the device is done with it).
    ///
    /// # Cancel safety
    /// Cancel safe: the request's buffer stays with the queue (freed when
    /// the device is done with it, the ticket being dropped); a dropped
    /// poller turns interrupts back on if it was the last.
    pub(crate) async fn wait_ticket<Q: Deref<Target = Queue>>(
        &self,
        ticket: &mut Ticket<Q>,
    ) -> Result<(DmaBuf, u32), Error> {
        let polls = self.poll_for.load(Ordering::Relaxed) > 0;
        // After a quiet stop, not at once: asleep until something wakes it
        // (a completion by interrupt, a hand-off).
        let mut quiet = false;
        loop {
            let mut first = true;
            let lead = std::future::poll_fn(|cx| {
                let lead = polls && !(quiet && std::mem::take(&mut first));
                match ticket.poll(cx.waker(), lead) {
                    TicketPoll::Ready(r) => Poll::Ready(Err(r.map_err(|()| self.failure()))),
                    TicketPoll::Expired(limit) => Poll::Ready(Err(Err(Error::Timeout(limit)))),
                    TicketPoll::Lead => Poll::Ready(Ok(())),
                    TicketPoll::Asleep => Poll::Pending,
                }
            })
            .await;
            match lead {
                Err(r) => return r,
                Ok(()) => {
                    let q = ticket.queue();
                    let mut polling = Polling::adopt(self, q);
                    let done = self.poll_until(q, &mut polling, || Ok(ticket.is_settled()));
                    // Quiet for the budget: sleep like the others
                    // (interrupts back on when the guard goes).
                    quiet = !done.await?;
                    polling.quiet = quiet;
                }
            }
        }
    }

    /// Waits until every request of `burst` (on `q`) has completed: polls
    /// first ([`DeviceState::poll_until`]), then sleeps on the interrupt.
    ///
    /// # Cancel safety
    /// As for [`DeviceState::wait`].
    pub(crate) async fn wait_burst(&self, q: &Queue, burst: &Burst) -> Result<(), Error> {
        if self.poll_for.load(Ordering::Relaxed) > 0 {
            self.drain(q);
            if burst.finished()? {
                return Ok(());
            }
            let mut polling = Polling::start(self, q);
            if self
                .poll_until(q, &mut polling, || burst.finished())
                .await?
            {
                return Ok(());
            }
            polling.quiet = true;
        }
        loop {
            let woken = burst.wake.notified();
            if burst.finished()? {
                return Ok(());
            }
            // Another caller may poll (interrupts off) with its future held
            // unpolled: the completion task watches for this burst too.
            q.watch_behind_poller();
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
        _polling: &mut Polling<'_>,
        mut finished: impl FnMut() -> Result<bool, Error>,
    ) -> Result<bool, Error> {
        /// Looks at the ring's index between yields.
        const SPINS: u32 = 512;
        let budget = std::time::Duration::from_nanos(self.poll_for.load(Ordering::Relaxed));
        self.drain(q);
        if finished()? {
            return Ok(true);
        }
        // The clock is read once per round of spins that saw nothing, not
        // per completion.
        let mut quiet_since = std::time::Instant::now();
        let mut progress = false;
        let current_thread = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread);
        let_others_run(current_thread).await;
        loop {
            // What the tasks that just ran published, to the device in one
            // notification.
            q.kick(self);
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
                let_others_run(current_thread).await;
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
                // The caller's guard turns interrupts on and drains once
                // more.
                return Ok(false);
            }
            tokio::task::yield_now().await;
        }
    }

    fn has_used(&self, q: &Queue) -> bool {
        q.lock().ring.has_used()
    }
}

/// Lets tasks that are ready — those a drain just woke, or that have
/// requests to add — run before this one goes on. On a current-thread
/// runtime a self-wake queues this task behind them, without the trip
/// through the I/O driver (a system call: 2.2–2.9 µs in the TCG guest) that
/// `tokio::task::yield_now` makes; on a multi-thread runtime a self-wake
/// would land in the worker's LIFO slot, ahead of them, so there it is
/// `yield_now`.
async fn let_others_run(current_thread: bool) {
    if !current_thread {
        return tokio::task::yield_now().await;
    }
    let mut woken = false;
    std::future::poll_fn(|cx| {
        if std::mem::replace(&mut woken, true) {
            return std::task::Poll::Ready(());
        }
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    })
    .await;
}

/// A caller polling a queue: the device is asked for no interrupts while
/// any caller polls; the last one out turns them back on and drains the
/// ring (a completion may have come while they were off, with no
/// interrupt to announce it), and hands the ring to a sleeping caller
/// unless it stopped because the device went quiet.
struct Polling<'a> {
    dev: &'a DeviceState,
    q: &'a Queue,
    /// Stopped for want of completions: no hand-off.
    quiet: bool,
}

impl<'a> Polling<'a> {
    fn start(dev: &'a DeviceState, q: &'a Queue) -> Polling<'a> {
        q.start_polling();
        Polling::adopt(dev, q)
    }

    /// The lead [`Queue::poll_ticket`] gave (already counted).
    fn adopt(dev: &'a DeviceState, q: &'a Queue) -> Polling<'a> {
        Polling {
            dev,
            q,
            quiet: false,
        }
    }
}

impl Drop for Polling<'_> {
    fn drop(&mut self) {
        if self.q.stop_polling(!self.quiet) {
            // Nobody polls now: requests published meanwhile rang the
            // doorbell themselves; those before are rung for here.
            self.q.kick(self.dev);
            self.dev.drain(self.q);
        }
    }
}
