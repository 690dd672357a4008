//! A queue as the driver keeps it: its ring, the requests the device
//! holds (by head descriptor), where each completion goes, and the bursts
//! that wait for theirs.

use std::ops::Deref;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};

use tokio::sync::Notify;
use zeroize::Zeroizing;

use crate::dma::DmaBuf;
use crate::error::Error;
use crate::request::{Chain, DmaRequest, TABLE_AT};
use crate::virtqueue::SplitQueue;

/// A request the device holds, and where its completion goes. Its memory
/// is held here (not in the caller's future), so that a cancelled request
/// never frees memory the device may still write.
pub(crate) enum Pending {
    /// A request with its own buffer, back to the one caller waiting on
    /// its ticket; `rescue`, bytes of the buffer copied out for the caller
    /// if the device fails with it (the input of a request on a
    /// device-ready buffer, whose memory the driver keeps).
    One {
        buf: DmaBuf,
        ticket: u32,
        rescue: Option<Rescue>,
    },
    /// One request of a burst: the burst holds all their memory (one
    /// reference per request in the device, nothing moved per request).
    Burst(Arc<Burst>),
}

impl Pending {
    /// Hands the completion on (the caller's waker, if it sleeps, into
    /// `wake`); whether that finished a caller's wait (a request, or the
    /// last of a burst).
    pub(crate) fn complete(self, len: u32, tickets: &mut Tickets, wake: &mut Vec<Waker>) -> bool {
        match self {
            // A caller that went away: the buffer is freed.
            Pending::One { buf, ticket, .. } => tickets.complete(ticket, buf, len, wake),
            Pending::Burst(burst) => burst.complete(),
        }
    }

    /// The device failed with the request in it: the caller's wait fails
    /// (its ticket marked, the burst marked); the memory the device may
    /// still write, to be parked until it no longer can.
    pub(crate) fn fail(self, tickets: &mut Tickets, wake: &mut Vec<Waker>) -> Vec<DmaBuf> {
        match self {
            Pending::One {
                buf,
                ticket,
                rescue,
            } => {
                tickets.fail(ticket, rescue.and_then(|r| r.copy(&buf)), wake);
                vec![buf]
            }
            Pending::Burst(burst) => burst.fail(),
        }
    }
}

/// Bytes of a request's buffer (`at`, `len`) to copy out for its caller if
/// the device fails with it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rescue {
    pub(crate) at: usize,
    pub(crate) len: usize,
}

impl Rescue {
    fn copy(self, buf: &DmaBuf) -> Option<Zeroizing<Vec<u8>>> {
        let mut out = Zeroizing::new(vec![0u8; self.len]);
        buf.read(self.at, &mut out).ok().map(|()| out)
    }
}

/// When a request is given up: its session's timeout, kept by the queue
/// with the request (not a timer a request: the completion task wakes for
/// the earliest, [`Queue::expire`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline {
    pub(crate) at: tokio::time::Instant,
    /// The timeout it came from, for the caller's [`Error::Timeout`].
    pub(crate) limit: std::time::Duration,
}

impl Deadline {
    /// `limit` from now.
    pub(crate) fn after(limit: std::time::Duration) -> Deadline {
        let now = tokio::time::Instant::now();
        Deadline {
            // Saturating: "no limit" is far enough.
            at: now
                .checked_add(limit)
                .unwrap_or_else(|| now + std::time::Duration::from_secs(86_400 * 365 * 30)),
            limit,
        }
    }

    /// Runs `f` within the deadline, with no timer unless `f` has to wait:
    /// the usual submission finds room and memory at once, and a tokio
    /// timer set up and torn down for it would cost more than the rest of
    /// the request (0.7–1 µs a request on the host). A named future, not an
    /// `async fn`: that held `f` twice (its argument, then pinned), and
    /// the timer inline, 2 KB for an 880-byte submission; each request's
    /// future is moved into a box on the way through `Offload`, and a
    /// memmove was 7% of the guest's CPU on that path.
    pub(crate) fn bound<F>(deadline: Option<Deadline>, f: F) -> Bound<F> {
        Bound {
            f,
            deadline,
            timer: None,
        }
    }
}

pin_project_lite::pin_project! {
    /// [`Deadline::bound`]'s future.
    pub(crate) struct Bound<F> {
        #[pin]
        f: F,
        deadline: Option<Deadline>,
        // Boxed: set up only by a wait, which is rare.
        timer: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    }
}

impl<T, F: std::future::Future<Output = Result<T, Error>>> std::future::Future for Bound<F> {
    type Output = Result<T, Error>;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(r) = this.f.poll(cx) {
            return Poll::Ready(r);
        }
        let Some(d) = *this.deadline else {
            return Poll::Pending;
        };
        let timer = this
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(d.at)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(Error::Timeout(d.limit))),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// Where a single request's completion waits for its caller.
#[derive(Debug)]
enum TicketState {
    Free,
    /// In the device; the caller's waker once it sleeps; when it is given
    /// up, and whether that time has come (the caller then gets
    /// [`TicketPoll::Expired`]; a completion still wins until it looks).
    Waiting {
        waker: Option<Waker>,
        deadline: Option<Deadline>,
        expired: bool,
    },
    /// Completed: the request's memory and the length the device wrote.
    Done(DmaBuf, u32),
    /// The device failed with it (and the bytes it asked to have
    /// rescued, copied out before its memory was parked).
    Failed(Option<Zeroizing<Vec<u8>>>),
    /// Its caller went away while the device had it: the completion (or
    /// the failure) frees it.
    Abandoned,
}

/// The completions of single requests, one slot per request from its
/// submission until its caller takes the result: the caller's waker and
/// then the result live in the queue (under the lock the completion is
/// handled under anyway), so a request costs no channel and no allocation
/// once the table has grown to the number of requests in flight. A slot is
/// reused only once its caller is done with it (or gone, and the device
/// too), so a caller's ticket never names another's request.
#[derive(Debug, Default)]
pub(crate) struct Tickets {
    slots: Vec<TicketState>,
    free: Vec<u32>,
}

/// What [`Queue::poll_ticket`] found.
pub(crate) enum TicketPoll {
    /// The result: the request's memory and length, or the device failed.
    Ready(Result<(DmaBuf, u32), ()>),
    /// Not yet, and nobody polls the ring: the caller polls it now (it is
    /// counted as a poller already).
    Lead,
    /// Not yet; the caller's waker is registered.
    Asleep,
    /// Not yet, and its deadline passed (the timeout it came from): the
    /// caller gives up on it (dropping the ticket abandons it).
    Expired(std::time::Duration),
}

impl Tickets {
    /// A slot for a request being submitted.
    fn open(&mut self, deadline: Option<Deadline>) -> u32 {
        let waiting = TicketState::Waiting {
            waker: None,
            deadline,
            expired: false,
        };
        match self.free.pop() {
            Some(id) => {
                self.slots[id as usize] = waiting;
                id
            }
            None => {
                self.slots.push(waiting);
                (self.slots.len() - 1) as u32
            }
        }
    }

    /// Marks the waiting tickets whose deadline is `now` or past as
    /// expired, their callers' wakers into `wake`; the earliest deadline
    /// still to come.
    fn expire(
        &mut self,
        now: tokio::time::Instant,
        wake: &mut Vec<Waker>,
    ) -> Option<tokio::time::Instant> {
        let mut next: Option<tokio::time::Instant> = None;
        for slot in &mut self.slots {
            if let TicketState::Waiting {
                waker,
                deadline: Some(d),
                expired: expired @ false,
            } = slot
            {
                if d.at <= now {
                    *expired = true;
                    wake.extend(waker.take());
                } else {
                    next = Some(next.map_or(d.at, |n| n.min(d.at)));
                }
            }
        }
        next
    }

    fn release(&mut self, id: u32) {
        if let Some(slot) = self.slots.get_mut(id as usize) {
            *slot = TicketState::Free;
            self.free.push(id);
        }
    }

    fn complete(&mut self, id: u32, buf: DmaBuf, len: u32, wake: &mut Vec<Waker>) -> bool {
        let Some(slot) = self.slots.get_mut(id as usize) else {
            return false;
        };
        match std::mem::replace(slot, TicketState::Done(buf, len)) {
            TicketState::Waiting { waker, .. } => {
                wake.extend(waker);
                true
            }
            // Its caller went away: the memory is freed (and wiped) now.
            _ => {
                self.release(id);
                false
            }
        }
    }

    fn fail(&mut self, id: u32, rescued: Option<Zeroizing<Vec<u8>>>, wake: &mut Vec<Waker>) {
        let Some(slot) = self.slots.get_mut(id as usize) else {
            return;
        };
        match std::mem::replace(slot, TicketState::Failed(rescued)) {
            TicketState::Waiting { waker, .. } => wake.extend(waker),
            _ => self.release(id),
        }
    }

    /// The caller went away: a result is freed now; a request still in
    /// the device is freed when it completes or fails.
    fn abandon(&mut self, id: u32) {
        let Some(slot) = self.slots.get_mut(id as usize) else {
            return;
        };
        match slot {
            TicketState::Waiting { .. } => *slot = TicketState::Abandoned,
            TicketState::Done(..) | TicketState::Failed(_) => self.release(id),
            TicketState::Free | TicketState::Abandoned => {}
        }
    }

    /// The result if there is one: a completion is taken (the slot
    /// freed); a failure is reported and kept (for [`Ticket::give_up`]
    /// until the ticket is dropped).
    fn take(&mut self, id: u32) -> Option<Result<(DmaBuf, u32), ()>> {
        let slot = self.slots.get_mut(id as usize)?;
        let result = match std::mem::replace(slot, TicketState::Free) {
            TicketState::Done(buf, len) => Ok((buf, len)),
            failed @ TicketState::Failed(_) => {
                *slot = failed;
                return Some(Err(()));
            }
            other => {
                *slot = other;
                return None;
            }
        };
        self.free.push(id);
        Some(result)
    }

    /// How many slots are in each state (for `CryptoDevice::diagnose`):
    /// a `Done` slot holds its request's memory until its caller takes it.
    pub(crate) fn diagnose(&self) -> String {
        let (mut waiting, mut done, mut failed, mut abandoned) = (0, 0, 0, 0);
        for slot in &self.slots {
            match slot {
                TicketState::Waiting { .. } => waiting += 1,
                TicketState::Done(..) => done += 1,
                TicketState::Failed(_) => failed += 1,
                TicketState::Abandoned => abandoned += 1,
                TicketState::Free => {}
            }
        }
        format!(
            "{} slots ({waiting} waiting, {done} done, {failed} failed, {abandoned} abandoned)",
            self.slots.len()
        )
    }

    /// Whether `id` has its result (or is past its deadline).
    fn settled(&self, id: u32) -> bool {
        matches!(
            self.slots.get(id as usize),
            Some(
                TicketState::Done(..)
                    | TicketState::Failed(_)
                    | TicketState::Waiting { expired: true, .. }
            ) | None
        )
    }

    /// A sleeping caller still waiting for the device, to take over
    /// polling the ring.
    fn sleeper(&self) -> Option<Waker> {
        self.slots.iter().find_map(|s| match s {
            TicketState::Waiting {
                waker: Some(w),
                expired: false,
                ..
            } => Some(w.clone()),
            _ => None,
        })
    }

    /// Slots in use (waiting, done and not yet taken, or abandoned).
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn in_use(&self) -> usize {
        self.slots.len() - self.free.len()
    }
}

/// A caller's claim on a single request's completion (a slot of the queue's
/// [`Tickets`]). Dropped before the result is taken, the request is
/// abandoned: its memory is freed when the device is done with it.
pub(crate) struct Ticket<Q: Deref<Target = Queue>> {
    q: Q,
    id: u32,
    settled: bool,
}

impl<Q: Deref<Target = Queue>> Ticket<Q> {
    /// Its queue.
    pub(crate) fn queue(&self) -> &Queue {
        &self.q
    }

    /// The same claim held through another handle on its queue.
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn rehome<R: Deref<Target = Queue>>(mut self, q: R) -> Ticket<R> {
        debug_assert!(std::ptr::eq(&*q, &*self.q));
        self.settled = true;
        Ticket {
            q,
            id: self.id,
            settled: false,
        }
    }

    /// Polls for the result: [`TicketPoll::Lead`] (counted as the queue's
    /// poller) only if `lead` and nobody polls the ring.
    pub(crate) fn poll(&mut self, waker: &Waker, lead: bool) -> TicketPoll {
        let r = self.q.poll_ticket(self.id, waker, lead);
        // A failure stays in the slot (for `give_up`) until the drop.
        if matches!(r, TicketPoll::Ready(Ok(_))) {
            self.settled = true;
        }
        r
    }

    /// Gives up on the request, in one look under the queue's lock: its
    /// result if it completed after all (the caller keeps it: a
    /// completion that comes as the caller gives up is not lost), else
    /// the bytes its request asked to have rescued ([`Rescue`]), wherever
    /// its memory is now — in the device, or copied out when the device
    /// failed — never read from memory freed meanwhile. A take and a
    /// rescue under two locks lost the input of a request completed
    /// between them (CI, `random_cancellations_under_hangs_multi_thread`).
    ///
    /// Consumes the ticket: once a result is taken its slot is free for
    /// another request, which a second look would take instead.
    pub(crate) fn give_up(mut self) -> Result<(DmaBuf, u32), Option<Zeroizing<Vec<u8>>>> {
        let mut state = self.q.lock();
        if let Some(Ok(done)) = state.tickets.take(self.id) {
            self.settled = true;
            return Ok(done);
        }
        Err(match state.tickets.slots.get(self.id as usize) {
            Some(TicketState::Failed(copy)) => copy.clone(),
            Some(TicketState::Waiting { .. }) => state.pending_rescue(self.id),
            _ => None,
        })
    }

    /// Whether the result is there.
    pub(crate) fn is_settled(&self) -> bool {
        self.q.lock().tickets.settled(self.id)
    }

    /// The result, if it is there.
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn try_take(&mut self) -> Option<Result<(DmaBuf, u32), ()>> {
        let r = self.q.lock().tickets.take(self.id);
        if matches!(r, Some(Ok(_))) {
            self.settled = true;
        }
        r
    }

    /// Waits for the result without polling the ring (the interrupt, or
    /// another caller's polling, delivers it): `Err(())` if the device
    /// failed with the request.
    ///
    /// # Cancel safety
    /// Cancel safe: the ticket stays valid.
    pub(crate) async fn sleep(&mut self) -> Result<(DmaBuf, u32), ()> {
        std::future::poll_fn(|cx| match self.poll(cx.waker(), false) {
            TicketPoll::Ready(r) => Poll::Ready(r),
            // (Its requests have no deadline: the caller times them.)
            TicketPoll::Lead | TicketPoll::Asleep | TicketPoll::Expired(_) => Poll::Pending,
        })
        .await
    }
}

impl<Q: Deref<Target = Queue>> Drop for Ticket<Q> {
    fn drop(&mut self) {
        if !self.settled {
            self.q.lock().tickets.abandon(self.id);
        }
    }
}

/// The requests of one [`CipherSession::run_burst`], held while the device
/// has them.
///
/// [`CipherSession::run_burst`]: crate::CipherSession::run_burst
pub(crate) struct Burst {
    requests: Mutex<Vec<DmaRequest>>,
    /// How many requests it has.
    pub(crate) len: usize,
    left: AtomicUsize,
    /// The device failed (reset, removed) with some still in it.
    failed: AtomicBool,
    /// Wakes the waiter when the last one completes or the device fails.
    pub(crate) wake: Notify,
}

impl Burst {
    pub(crate) fn new(requests: Vec<DmaRequest>) -> Burst {
        Burst {
            len: requests.len(),
            left: AtomicUsize::new(requests.len()),
            requests: Mutex::new(requests),
            failed: AtomicBool::new(false),
            wake: Notify::new(),
        }
    }

    /// Runs `f` on the requests (to stage them).
    pub(crate) fn with_requests<T>(&self, f: impl FnOnce(&[DmaRequest]) -> T) -> T {
        f(&self.requests.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// One request completed; whether it was the burst's last.
    pub(crate) fn complete(&self) -> bool {
        let last = self.left.fetch_sub(1, Ordering::AcqRel) == 1;
        if last {
            self.wake.notify_one();
        }
        last
    }

    /// The device failed: the waiter is told; the requests' memory is
    /// returned to be parked (once: the burst's other requests find none).
    pub(crate) fn fail(&self) -> Vec<DmaBuf> {
        self.failed.store(true, Ordering::Release);
        self.wake.notify_one();
        std::mem::take(&mut *self.requests.lock().unwrap_or_else(|p| p.into_inner()))
            .into_iter()
            .map(|r| r.dma)
            .collect()
    }

    /// All done (`Ok(true)`), not yet (`Ok(false)`), or the device failed.
    pub(crate) fn finished(&self) -> Result<bool, Error> {
        if self.failed.load(Ordering::Acquire) {
            return Err(Error::Gone);
        }
        Ok(self.left.load(Ordering::Acquire) == 0)
    }

    /// The requests back, once [`Burst::finished`].
    pub(crate) fn take(&self) -> Vec<DmaRequest> {
        std::mem::take(&mut *self.requests.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// A request [`Pendings::insert`] would not take, with why.
pub(crate) struct Refused {
    pub(crate) error: Error,
    pub(crate) pending: Pending,
}

/// The requests a queue's device holds, by head descriptor (a slot per
/// descriptor: no hashing on the per-request path).
pub(crate) struct Pendings {
    pub(crate) slots: Vec<Option<Pending>>,
    pub(crate) len: usize,
}

impl Pendings {
    pub(crate) fn new(size: u16) -> Pendings {
        Pendings {
            slots: (0..size).map(|_| None).collect(),
            len: 0,
        }
    }

    /// Records `pending` under `head`. A head that is out of range or
    /// still holds a request is refused (the request stays where it was,
    /// to be failed, never silently dropped): the ring handed out a head
    /// it had not got back, which is a broken ring.
    pub(crate) fn insert(&mut self, head: u16, pending: Pending) -> Result<(), Refused> {
        match self.slots.get_mut(usize::from(head)) {
            Some(slot @ None) => {
                *slot = Some(pending);
                self.len += 1;
                Ok(())
            }
            // Keep the live request; the new one goes back to be failed.
            Some(Some(_)) => Err(Refused {
                error: Error::Broken(format!("head {head} reused while its request is pending")),
                pending,
            }),
            None => Err(Refused {
                error: Error::Broken(format!("head {head} past the ring")),
                pending,
            }),
        }
    }

    /// Whether `head` holds a request.
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn contains(&self, head: u16) -> bool {
        self.slots
            .get(usize::from(head))
            .is_some_and(Option::is_some)
    }

    pub(crate) fn remove(&mut self, head: u16) -> Option<Pending> {
        let taken = self.slots.get_mut(usize::from(head))?.take();
        if taken.is_some() {
            self.len -= 1;
        }
        taken
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn drain(&mut self) -> impl Iterator<Item = Pending> + '_ {
        self.len = 0;
        self.slots.iter_mut().filter_map(Option::take)
    }
}

/// What a queue needs from the device it belongs to.
pub(crate) trait Host {
    /// Whether the device takes requests now (called under the queue's
    /// lock, so that a suspend or a failure that takes the same lock is
    /// never crossed by a request).
    fn accepting(&self) -> Result<(), Error>;
    /// Tells the device that `q` has new requests (a BAR write). Called
    /// after the queue's lock is released.
    fn notify(&self, q: &Queue) -> Result<(), Error>;
    /// The device broke the ring's rules on `q`: it must be failed whole
    /// (every queue's requests failed, their memory parked, with
    /// `orphans`: memory a chain in the ring points at that no request
    /// holds) and never trusted again.
    fn broken(&self, q: &Queue, error: Error, orphans: Vec<DmaBuf>);
    /// `n` completions were handed back by this thread.
    fn completed(&self, _n: u64) {}
}

pub(crate) struct Queue {
    pub(crate) index: u16,
    pub(crate) notify_off: usize,
    pub(crate) state: Mutex<QueueState>,
    /// Descriptors were freed.
    pub(crate) room: Notify,
    /// Submitters that may be waiting on `room`.
    pub(crate) room_waiters: AtomicUsize,
    /// Times a submission found the ring full: it staged what fit, and the
    /// rest waited for room (unless the device had made room meanwhile).
    pub(crate) full: AtomicU64,
    /// Tells the completion task that callers sleep behind a poller, so
    /// that it watches for a poller that stopped polling
    /// ([`Queue::watch_state`]).
    pub(crate) watch: Arc<Notify>,
    /// Requests were published while a caller polled, and the device was
    /// not notified of them: the poller does it once for all of them
    /// ([`Queue::kick`]) — one doorbell a batch, not one a request (a
    /// doorbell is an exit to the hypervisor: 10–14% of the guest's CPU on
    /// the per-request path when every request rang it).
    pub(crate) unkicked: AtomicBool,
}

pub(crate) struct QueueState {
    pub(crate) ring: SplitQueue,
    pub(crate) pending: Pendings,
    /// Where single requests' completions wait for their callers.
    pub(crate) tickets: Tickets,
    /// Callers polling this queue for their completions; the device is
    /// asked for no interrupts while there are any.
    pub(crate) pollers: usize,
    /// Its requests were failed (reset, removal, broken): completions of
    /// the chains they left in the ring are expected, and ignored.
    pub(crate) failed: bool,
    /// The completion task was told that callers sleep behind a poller.
    pub(crate) watched: bool,
    /// The earliest deadline of a waiting ticket the completion task
    /// knows of (it may have completed since: the task then finds nothing
    /// to expire); `None` when none has one.
    pub(crate) earliest: Option<tokio::time::Instant>,
}

impl QueueState {
    /// The rescue bytes of ticket `id`'s request, which the device holds.
    fn pending_rescue(&self, id: u32) -> Option<Zeroizing<Vec<u8>>> {
        self.pending.slots.iter().flatten().find_map(|p| match p {
            Pending::One {
                buf,
                ticket,
                rescue: Some(r),
            } if *ticket == id => r.copy(buf),
            _ => None,
        })
    }
}

impl Queue {
    pub(crate) fn new(index: u16, notify_off: usize, ring: SplitQueue) -> Queue {
        let size = ring.size();
        Queue {
            index,
            notify_off,
            state: Mutex::new(QueueState {
                ring,
                pending: Pendings::new(size),
                tickets: Tickets::default(),
                pollers: 0,
                failed: false,
                watched: false,
                earliest: None,
            }),
            room: Notify::new(),
            room_waiters: AtomicUsize::new(0),
            full: AtomicU64::new(0),
            watch: Arc::new(Notify::new()),
            unkicked: AtomicBool::new(false),
        }
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Requests the device holds on this queue.
    pub(crate) fn in_flight(&self) -> usize {
        self.lock().pending.len()
    }

    /// Hands every completed request back to its caller; how many callers
    /// that finished (whose tasks may now go on). A completion that breaks
    /// the ring's rules is reported to `host` ([`Host::broken`]), which
    /// fails the device; nothing is freed for it.
    pub(crate) fn drain(&self, host: &impl Host) -> u64 {
        let mut state = self.lock();
        let mut freed = 0u64;
        let mut finished = 0u64;
        // Woken after the lock is released: a wake-up may reach another
        // thread, which should not find the queue locked.
        let mut wake = Vec::new();
        loop {
            match state.ring.pop_used() {
                Ok(Some((head, len))) => {
                    freed += 1;
                    let QueueState {
                        pending, tickets, ..
                    } = &mut *state;
                    match pending.remove(head) {
                        Some(p) => finished += u64::from(p.complete(len, tickets, &mut wake)),
                        None if state.failed => {}
                        None => {
                            // The ring and the requests are kept together
                            // under this lock: a head the ring held that no
                            // request owns is this driver's bug, never
                            // papered over.
                            drop(state);
                            wake.into_iter().for_each(Waker::wake);
                            host.broken(
                                self,
                                Error::Broken(format!(
                                    "completion of head {head} owned by no request"
                                )),
                                Vec::new(),
                            );
                            return finished;
                        }
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::error!(%e, queue = self.index, "device broke its ring");
                    drop(state);
                    wake.into_iter().for_each(Waker::wake);
                    host.broken(self, e, Vec::new());
                    return finished;
                }
            }
        }
        drop(state);
        wake.into_iter().for_each(Waker::wake);
        if freed > 0 {
            if self.room_waiters.load(Ordering::Acquire) > 0 {
                self.room.notify_waiters();
            }
            host.completed(freed);
        }
        finished
    }

    /// The result of ticket `id`, if it is there; else, if `lead` and no
    /// caller polls this queue, the lead (counted as a poller, with the
    /// device's interrupts turned off for it); else asleep, with `waker`
    /// registered. One lock for all three, so that a poller leaving
    /// ([`Queue::stop_polling`]) always finds the sleepers it should
    /// hand the ring to.
    pub(crate) fn poll_ticket(&self, id: u32, waker: &Waker, lead: bool) -> TicketPoll {
        let mut state = self.lock();
        if let Some(r) = state.tickets.take(id) {
            return TicketPoll::Ready(r);
        }
        if let Some(TicketState::Waiting {
            deadline: Some(d),
            expired: true,
            ..
        }) = state.tickets.slots.get(id as usize)
        {
            return TicketPoll::Expired(d.limit);
        }
        if lead && state.pollers == 0 && !state.failed {
            state.pollers = 1;
            let _ = state.ring.set_interrupts(false);
            // Callers already asleep on the interrupt (which is off now)
            // rely on this poller: if its future is held unpolled, the
            // completion task's watch must drain for them.
            let others = state.pending.len() > 1;
            self.ask_watch(&mut state, others);
            // The poller looks for its result itself: no wake-up for it,
            // and no hand-off to it.
            if let Some(TicketState::Waiting { waker, .. }) =
                state.tickets.slots.get_mut(id as usize)
            {
                *waker = None;
            }
            return TicketPoll::Lead;
        }
        match state.tickets.slots.get_mut(id as usize) {
            Some(TicketState::Waiting { waker: w, .. }) => match w {
                Some(w) if w.will_wake(waker) => {}
                _ => *w = Some(waker.clone()),
            },
            // Not a live ticket (never: a ticket is taken once): failed.
            _ => return TicketPoll::Ready(Err(())),
        }
        // Asleep behind a poller: the completion task watches that the
        // poller keeps polling (its future may be held and not polled, by
        // a `select!` or by this very task awaiting another request).
        let behind = state.pollers > 0;
        self.ask_watch(&mut state, behind);
        TicketPoll::Asleep
    }

    /// Whether callers may sleep behind a poller now (one polls, and the
    /// device holds requests): the completion task then drains the ring
    /// itself whenever no interrupt came for a while, so that a poller
    /// whose future is not being polled stalls nobody. If not, the next
    /// sleeper tells it again. With it, the earliest deadline of a waiting
    /// ticket (when the completion task should call [`Queue::expire`]).
    pub(crate) fn watch_state(&self) -> (bool, Option<tokio::time::Instant>) {
        let mut state = self.lock();
        let watch = state.pollers > 0 && !state.pending.is_empty();
        if !watch {
            state.watched = false;
        }
        (watch, state.earliest)
    }

    /// Gives up on the waiting tickets whose deadline has come (their
    /// callers are woken to find [`TicketPoll::Expired`]); the next
    /// deadline is remembered for the completion task.
    pub(crate) fn expire(&self, now: tokio::time::Instant) {
        let mut state = self.lock();
        if state.earliest.is_none_or(|e| e > now) {
            return;
        }
        let mut wake = Vec::new();
        state.earliest = state.tickets.expire(now, &mut wake);
        drop(state);
        wake.into_iter().for_each(Waker::wake);
    }

    /// A caller starts polling the ring: the device's interrupts are off
    /// while any caller polls.
    pub(crate) fn start_polling(&self) {
        let mut state = self.lock();
        state.pollers += 1;
        if state.pollers == 1 {
            let _ = state.ring.set_interrupts(false);
            // As for a ticket's lead ([`Queue::poll_ticket`]): callers
            // asleep on the interrupt rely on this poller now.
            if !state.watched {
                let asleep = state.tickets.sleeper().is_some();
                self.ask_watch(&mut state, asleep);
            }
        }
    }

    /// A caller stops polling the ring. The last one turns the device's
    /// interrupts back on and, unless it stopped because the device went
    /// quiet (`handoff` false), wakes one sleeping caller whose request is
    /// still in the device, to poll in its place: the ring keeps a poller
    /// while requests keep completing, without every caller polling.
    /// Whether it was the last.
    pub(crate) fn stop_polling(&self, handoff: bool) -> bool {
        let mut state = self.lock();
        state.pollers = state.pollers.saturating_sub(1);
        let last = state.pollers == 0;
        let mut next = None;
        if last {
            let _ = state.ring.set_interrupts(true);
            if handoff && !state.pending.is_empty() {
                next = state.tickets.sleeper();
            }
        }
        drop(state);
        if let Some(w) = next {
            w.wake();
        }
        last
    }

    /// Has the completion task watch the ring (drain and ring every
    /// watchdog tick, 1 ms) while a caller polls it, if it
    /// does not already: for callers that wait behind a poller without a
    /// ticket asleep (a submitter waiting for room, a burst asleep).
    pub(crate) fn watch_behind_poller(&self) {
        let mut state = self.lock();
        let behind = state.pollers > 0;
        self.ask_watch(&mut state, behind);
    }

    /// Tells the completion task to watch the ring, if `needed` and it was
    /// not told already (it stops when it finds nothing to watch:
    /// [`Queue::watch_state`]). The one place `watched` is set.
    fn ask_watch(&self, state: &mut QueueState, needed: bool) {
        if needed && !state.watched {
            state.watched = true;
            self.watch.notify_one();
        }
    }

    /// Rings the doorbell for requests published while a caller polled
    /// ([`Queue::unkicked`]), if there are any. For the pollers, between
    /// their looks at the ring; for the last one leaving; and for the
    /// completion task's watch (a poller whose future is not polled).
    pub(crate) fn kick(&self, host: &impl Host) {
        if self.unkicked.load(Ordering::Acquire) && self.unkicked.swap(false, Ordering::AcqRel) {
            // A device that is failing fails its requests anyway.
            if let Err(e) = host.notify(self) {
                tracing::debug!(%e, queue = self.index, "a deferred notification failed");
            }
        }
    }

    /// Fails every request the device holds here: their callers' waits
    /// fail; their memory, which the device may still write, is returned
    /// to be parked until it no longer can. Submitters waiting for room
    /// are woken (to find the device failed).
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn fail_all(&self) -> Vec<DmaBuf> {
        let mut parked = Vec::new();
        self.fail_all_into(|failed| parked = failed);
        parked
    }

    /// [`Queue::fail_all`], with the memory handed to `park` before any
    /// caller is woken: a caller that sees its request fail finds its
    /// memory parked already (counted by `parked_buffers`).
    pub(crate) fn fail_all_into(&self, park: impl FnOnce(Vec<DmaBuf>)) {
        let mut state = self.lock();
        state.failed = true;
        let mut wake = Vec::new();
        let QueueState {
            pending, tickets, ..
        } = &mut *state;
        let parked = pending
            .drain()
            .flat_map(|p| p.fail(tickets, &mut wake))
            .collect();
        drop(state);
        park(parked);
        wake.into_iter().for_each(Waker::wake);
        self.room.notify_waiters();
    }

    /// Submits one chain (whose memory is all in `buf`; with `table`, the
    /// device address where [`Layout::write_chain`] wrote it as an indirect
    /// table), waiting for room in the queue (back-pressure); the ticket
    /// gets the buffer back when the device completes it.
    ///
    /// [`Layout::write_chain`]: crate::request::Layout::write_chain
    ///
    /// # Cancel safety
    /// Cancel safe: the buffer is taken out of `one` only when the ring
    /// takes the chain (then the queue holds it until the completion); an
    /// error, or a future dropped before, leaves it in `one`.
    pub(crate) async fn enqueue_one(
        &self,
        host: &impl Host,
        one: &mut Option<DmaBuf>,
        chain: Chain,
        table: Option<u64>,
        rescue: Option<Rescue>,
        deadline: Option<Deadline>,
    ) -> Result<Ticket<&Self>, Error> {
        let mut ticket = None;
        // The completion task is told of a deadline earlier than any it
        // knows of (rarely: under a steady load each request's comes after
        // the one before's).
        let mut sooner = false;
        let staged = self
            .enqueue_with(host, 1, |state, _, orphans| {
                let staged = match table {
                    Some(table) => state.ring.stage_request(chain.segments(), table),
                    None => state.ring.stage(chain.segments()),
                };
                match staged {
                    // Staged once only: the loop stops at 1.
                    Ok(Some(head)) => match one.take() {
                        Some(buf) => {
                            let id = state.tickets.open(deadline);
                            if let Some(d) = deadline
                                && state.earliest.is_none_or(|e| d.at < e)
                            {
                                state.earliest = Some(d.at);
                                sooner = true;
                            }
                            ticket = Some(id);
                            let p = Pending::One {
                                buf,
                                ticket: id,
                                rescue,
                            };
                            (1, record(state, head, p, orphans))
                        }
                        None => (1, Ok(())),
                    },
                    // Full: the request stays with this future.
                    Ok(None) => (0, Ok(())),
                    Err(e) => (0, Err(e)),
                }
            })
            .await;
        if sooner {
            self.watch.notify_one();
        }
        match (staged, ticket) {
            (Ok(()), Some(id)) => Ok(Ticket {
                q: self,
                id,
                settled: false,
            }),
            // Staged, then publishing or the notification failed: the
            // request is the queue's until the device completes it or
            // fails; the caller waits for that (a device that failed
            // fails its requests), with its buffer still in the queue.
            (Err(e), Some(id)) => {
                tracing::warn!(%e, queue = self.index, "a staged request's notification failed");
                Ok(Ticket {
                    q: self,
                    id,
                    settled: false,
                })
            }
            (Err(e), None) => Err(e),
            (Ok(()), None) => Err(Error::Broken("a staged request has no ticket".into())),
        }
    }

    /// Submits the requests of `burst` (prepared with their indirect
    /// tables), as many as the queue takes under one lock and with one
    /// notification, waiting for room for the rest.
    ///
    /// # Cancel safety
    /// As for [`Queue::enqueue_one`]: whatever was queued is held by the
    /// queue (through the burst) until it completes.
    pub(crate) async fn enqueue_burst(
        &self,
        host: &impl Host,
        burst: &Arc<Burst>,
    ) -> Result<(), Error> {
        self.enqueue_with(host, burst.len, |state, mut next, orphans| {
            // The burst's lock once per pass, not per request.
            burst.with_requests(|requests| {
                for r in &requests[next.min(requests.len())..] {
                    match state
                        .ring
                        .stage_request(r.chain.segments(), r.dma.iova(TABLE_AT))
                    {
                        Ok(Some(head)) => {
                            next += 1;
                            let p = Pending::Burst(burst.clone());
                            if let Err(e) = record(state, head, p, orphans) {
                                return (next, Err(e));
                            }
                        }
                        Ok(None) => break,
                        Err(e) => return (next, Err(e)),
                    }
                }
                (next, Ok(()))
            })
        })
        .await
    }

    /// Submits `n` requests: `stage(state, next, orphans)` writes requests
    /// from `next` on into the ring, with what the queue holds for each
    /// until it completes, as many as fit; it returns where it stopped (and
    /// an error that stopped it). Those go to the device with one index
    /// write and one notification; then this waits for room for the rest
    /// (back-pressure). A [`Error::Broken`] from staging fails the device
    /// (with `orphans`, memory staged chains point at that no request
    /// holds).
    ///
    /// # Cancel safety
    /// Cancel safe: a request is either queued (its memory held by the
    /// queue until completion) or dropped unsent.
    async fn enqueue_with(
        &self,
        host: &impl Host,
        n: usize,
        mut stage: impl FnMut(&mut QueueState, usize, &mut Vec<DmaBuf>) -> (usize, Result<(), Error>),
    ) -> Result<(), Error> {
        let mut next = 0;
        while next < n {
            let mut orphans = Vec::new();
            let step = {
                let mut state = self.lock();
                host.accepting()?;
                let (done, staged) = stage(&mut state, next, &mut orphans);
                let pushed = done > next;
                next = done;
                // What was staged goes out even if a later request failed:
                // its memory is the queue's now and comes back on completion.
                let published = if pushed { state.ring.publish() } else { Ok(()) };
                published.and(staged).and_then(|()| {
                    let full = (next < n).then(|| state.ring.free_descriptors());
                    let mut notify = pushed && state.ring.needs_notify()?;
                    // A caller polls the ring: it rings the doorbell for
                    // everything published since its last look (under this
                    // lock, so that a poller leaving sees the flag).
                    if notify && state.pollers > 0 {
                        self.unkicked.store(true, Ordering::Release);
                        notify = false;
                    }
                    Ok((notify, full))
                })
            };
            let (notify, full) = match step {
                Ok(step) => step,
                Err(Error::Broken(why)) => {
                    host.broken(self, Error::Broken(why.clone()), orphans);
                    return Err(Error::Broken(why));
                }
                Err(e) => return Err(e),
            };
            if notify {
                host.notify(self)?;
            }
            if let Some(free) = full {
                // Queue full: completions free descriptors. Registered as a
                // waiter only now (a submission that finds room, the usual
                // case, takes no lock of the waiter list), then the ring is
                // looked at again (interrupts may be off for pollers): a
                // drain that frees descriptors after the registration wakes
                // this; one before it left more free than `free`, seen here.
                self.full.fetch_add(1, Ordering::Relaxed);
                let mut room = std::pin::pin!(self.room.notified());
                room.as_mut().enable();
                let _waiting = RoomWaiter::new(self);
                // What this submission published may have left its
                // doorbell to a poller; that poller's future may be held
                // unpolled (a `select!`), and this one is not a ticket
                // asleep behind it, which would have the completion task
                // watch: ring now, and have the task watch.
                self.kick(host);
                self.watch_behind_poller();
                self.drain(host);
                if self.lock().ring.free_descriptors() <= free {
                    room.await;
                }
            }
        }
        Ok(())
    }
}

/// Records `p` as the request the device holds under `head`; a refusal
/// (the ring handed out a head it had not got back) hands the request's
/// memory to `orphans`, to be parked with the failed device.
fn record(
    state: &mut QueueState,
    head: u16,
    p: Pending,
    orphans: &mut Vec<DmaBuf>,
) -> Result<(), Error> {
    state.pending.insert(head, p).map_err(|refused| {
        let mut wake = Vec::new();
        orphans.extend(refused.pending.fail(&mut state.tickets, &mut wake));
        // Under the queue's lock; a waker registered this early is rare
        // (the caller has not awaited yet) and only schedules its task.
        wake.into_iter().for_each(Waker::wake);
        refused.error
    })
}

/// A submitter that may wait for room in a queue, counted so that drains
/// wake waiters only when there are any.
struct RoomWaiter<'a>(&'a Queue);

impl<'a> RoomWaiter<'a> {
    fn new(q: &'a Queue) -> RoomWaiter<'a> {
        q.room_waiters.fetch_add(1, Ordering::AcqRel);
        RoomWaiter(q)
    }
}

impl Drop for RoomWaiter<'_> {
    fn drop(&mut self) {
        self.0.room_waiters.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device_ring::DeviceRing;
    use crate::dma::DmaPool;
    use crate::virtqueue::Segment;
    use std::time::Duration;

    fn buf(pool: &Arc<DmaPool>) -> DmaBuf {
        pool.try_alloc(16).unwrap().unwrap()
    }

    fn one(pool: &Arc<DmaPool>) -> Pending {
        Pending::One {
            buf: buf(pool),
            ticket: 0,
            rescue: None,
        }
    }

    fn request(pool: &Arc<DmaPool>) -> DmaRequest {
        DmaRequest {
            dma: buf(pool),
            chain: crate::request::Chain::empty(),
            session: 1,
            encrypt: true,
            layout: crate::request::Layout::new(crate::protocol::CipherAlgo::AesCbc, 16),
            iv_len: 16,
            status: None,
        }
    }

    #[test]
    fn pendings_count_what_they_hold_and_refuse_a_taken_head() {
        let pool = Arc::new(DmaPool::unmapped(1 << 16).unwrap());
        let mut p = Pendings::new(8);
        assert!(p.insert(3, one(&pool)).is_ok());
        assert_eq!(p.len(), 1);
        assert!(p.contains(3));
        // A head still pending is refused, and the request handed back
        // (its memory to be parked, never dropped while a chain names it).
        let refused = p.insert(3, one(&pool)).err().unwrap();
        assert!(matches!(refused.error, Error::Broken(_)));
        assert_eq!(
            refused
                .pending
                .fail(&mut Tickets::default(), &mut Vec::new())
                .len(),
            1
        );
        assert!(p.insert(9, one(&pool)).is_err(), "past the ring");
        assert_eq!(p.len(), 1);
        assert!(p.remove(2).is_none());
        assert!(p.remove(9).is_none(), "past the ring: nothing, no panic");
        assert!(p.remove(3).is_some());
        assert!(p.is_empty());
        for head in [1, 5] {
            assert!(p.insert(head, one(&pool)).is_ok());
        }
        assert_eq!(p.drain().count(), 2);
        assert!(p.is_empty());
    }

    #[test]
    fn a_burst_finishes_with_its_last_completion_or_fails_whole() {
        let pool = Arc::new(DmaPool::unmapped(1 << 16).unwrap());
        let burst = Arc::new(Burst::new(vec![request(&pool), request(&pool)]));
        let (mut t, mut w) = (Tickets::default(), Vec::new());
        assert!(!Pending::Burst(burst.clone()).complete(7, &mut t, &mut w));
        assert!(!burst.finished().unwrap());
        assert!(Pending::Burst(burst.clone()).complete(8, &mut t, &mut w));
        assert!(burst.finished().unwrap());
        assert_eq!(burst.take().len(), 2);
        // Failed with requests in the device: their memory is handed over
        // to be parked, once.
        let failed = Arc::new(Burst::new(Vec::new()));
        assert!(
            Pending::Burst(failed.clone())
                .fail(&mut t, &mut w)
                .is_empty()
        );
        let failed = Arc::new(Burst::new((0..3).map(|_| request(&pool)).collect()));
        assert_eq!(Pending::Burst(failed.clone()).fail(&mut t, &mut w).len(), 3);
        assert!(
            Pending::Burst(failed.clone())
                .fail(&mut t, &mut w)
                .is_empty()
        );
        assert!(matches!(failed.finished(), Err(Error::Gone)));
        assert!(failed.take().is_empty());
    }

    /// A device host that takes everything and records what it is told.
    #[derive(Default)]
    struct TestHost {
        notified: AtomicU64,
        broken: Mutex<Option<String>>,
        parked: Mutex<Vec<DmaBuf>>,
    }

    impl Host for TestHost {
        fn accepting(&self) -> Result<(), Error> {
            match &*self.broken.lock().unwrap() {
                Some(why) => Err(Error::Broken(why.clone())),
                None => Ok(()),
            }
        }
        fn notify(&self, _q: &Queue) -> Result<(), Error> {
            self.notified.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
        fn broken(&self, q: &Queue, error: Error, orphans: Vec<DmaBuf>) {
            *self.broken.lock().unwrap() = Some(error.to_string());
            let mut parked = self.parked.lock().unwrap();
            parked.extend(orphans);
            parked.extend(q.fail_all());
        }
    }

    /// A queue of `size` entries in its own pool, and the device's side.
    fn queue(size: u16) -> (Arc<Queue>, DeviceRing, Arc<DmaPool>) {
        let pool = Arc::new(DmaPool::unmapped(1 << 20).unwrap());
        let mem = pool.try_alloc(SplitQueue::bytes(size)).unwrap().unwrap();
        let ring = SplitQueue::new(mem, size).unwrap();
        let device = DeviceRing::new(pool.clone(), size, ring.addresses());
        (Arc::new(Queue::new(0, 0, ring)), device, pool)
    }

    /// A one-segment request whose buffer carries `tag`.
    fn tagged(pool: &Arc<DmaPool>, tag: u64) -> (DmaBuf, Chain) {
        let b = pool.try_alloc(64).unwrap().unwrap();
        b.write_u64(0, tag).unwrap();
        let chain = Chain::new(&[Segment {
            iova: b.iova(0),
            len: 64,
            device_writes: true,
        }])
        .unwrap();
        (b, chain)
    }

    /// Four times as many requests as the ring holds, all submitted at
    /// once: each waits for room (none is lost), every chain the device
    /// sees points at memory its request still holds, and every caller
    /// gets its own buffer back.
    #[tokio::test]
    async fn more_requests_than_the_ring_holds_all_complete_to_their_callers() {
        let (q, mut device, pool) = queue(4);
        let idle = pool.units_in_use();
        let host = Arc::new(TestHost::default());
        let tasks: Vec<_> = (0..16u64)
            .map(|tag| {
                let (q, host, pool) = (q.clone(), host.clone(), pool.clone());
                tokio::spawn(async move {
                    let (b, chain) = tagged(&pool, tag);
                    let mut ticket = q
                        .enqueue_one(&*host, &mut Some(b), chain, None, None, None)
                        .await?;
                    let (b, len) = ticket.sleep().await.map_err(|()| Error::Gone)?;
                    Ok::<_, Error>((tag, b.read_u64(0)?, len))
                })
            })
            .collect();
        let mut completed = 0u32;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !tasks.iter().all(|t| t.is_finished()) {
            assert!(
                std::time::Instant::now() < deadline,
                "requests lost: {} of 16 callers still waiting after 10 s",
                tasks.iter().filter(|t| !t.is_finished()).count()
            );
            tokio::task::yield_now().await;
            while let Some(head) = device.pop_avail().unwrap() {
                for d in device.chain(head).unwrap() {
                    assert!(
                        pool.is_allocated(d.addr, d.len as usize),
                        "the device was handed a chain into freed memory"
                    );
                }
                completed += 1;
                device.push_used(u32::from(head), completed).unwrap();
            }
            q.drain(&*host);
        }
        for t in tasks {
            let (tag, back, _) = t.await.unwrap().unwrap();
            assert_eq!(tag, back, "a caller got another's buffer");
        }
        assert_eq!(completed, 16, "the device saw every request once");
        assert!(host.broken.lock().unwrap().is_none());
        let state = q.lock();
        assert_eq!((state.pending.len(), state.ring.chains_in_flight()), (0, 0));
        assert_eq!(
            state.ring.busy_descriptors(),
            0,
            "no chain left in the ring"
        );
        drop(state);
        assert_eq!(pool.units_in_use(), idle, "every buffer returned");
    }

    /// A used entry naming no chain the device holds fails the device:
    /// every request is failed, their memory parked (not freed), and no
    /// more are taken.
    #[tokio::test]
    async fn a_rule_breaking_completion_fails_everything_and_parks_the_memory() {
        let (q, mut device, pool) = queue(8);
        let host = TestHost::default();
        let mut rxs = Vec::new();
        for tag in 0..3 {
            let (b, chain) = tagged(&pool, tag);
            rxs.push(
                q.enqueue_one(&host, &mut Some(b), chain, None, None, None)
                    .await
                    .unwrap(),
            );
        }
        let held = pool.units_in_use();
        let head = device.pop_avail().unwrap().unwrap();
        // An id past the ring, as the next used entry.
        device.write_used_entry(0, 77, 0).unwrap();
        device.set_used_idx(1).unwrap();
        q.drain(&host);
        assert!(host.broken.lock().unwrap().is_some());
        for mut rx in rxs {
            assert!(
                rx.sleep().await.is_err(),
                "a failed request's caller is told"
            );
        }
        assert_eq!(host.parked.lock().unwrap().len(), 3, "parked, not freed");
        assert_eq!(pool.units_in_use(), held);
        let (b, chain) = tagged(&pool, 9);
        assert!(matches!(
            q.enqueue_one(&host, &mut Some(b), chain, None, None, None)
                .await,
            Err(Error::Broken(_))
        ));
        let _ = head;
    }

    async fn submit<'q>(
        q: &'q Queue,
        h: &TestHost,
        pool: &Arc<DmaPool>,
        tag: u64,
    ) -> Ticket<&'q Queue> {
        let (b, c) = tagged(pool, tag);
        q.enqueue_one(h, &mut Some(b), c, None, None, None)
            .await
            .unwrap()
    }

    /// A device that publishes its used index before the entry it covers
    /// (a missing write barrier): the slot still holds the entry of the
    /// lap before, which names a head that is live again. The driver must
    /// not believe it (it poisons each entry it has read): believed, the
    /// wrong request completed and its memory was freed while the device
    /// still worked on it.
    #[tokio::test]
    async fn a_stale_used_entry_is_not_believed() {
        let (q, mut dev, pool) = queue(4);
        let h = TestHost::default();
        // One lap of the used ring, a request at a time.
        for tag in 0..4 {
            let mut rx = submit(&q, &h, &pool, tag).await;
            let head = dev.pop_avail().unwrap().unwrap();
            dev.push_used(u32::from(head), 0).unwrap();
            q.drain(&h);
            rx.sleep().await.unwrap();
        }
        let mut rx_b = submit(&q, &h, &pool, 100).await;
        let _rx_c = submit(&q, &h, &pool, 200).await;
        let (hb, hc) = (
            dev.pop_avail().unwrap().unwrap(),
            dev.pop_avail().unwrap().unwrap(),
        );
        let b_chain = dev.chain(hb).unwrap();
        // Used slot 0 last held head 0's completion, and B has head 0.
        assert_eq!(hb, 0);
        // The device finishes C: index first, the driver looks, then the
        // entry.
        dev.set_used_idx(5).unwrap();
        q.drain(&h);
        dev.write_used_entry(4, u32::from(hc), 0).unwrap();
        q.drain(&h);
        let b_completed = rx_b.sleep().await.is_ok();
        let b_held = pool.is_allocated(b_chain[0].addr, b_chain[0].len as usize);
        assert!(
            !b_completed && b_held && h.broken.lock().unwrap().is_some(),
            "B completed: {b_completed}, memory held: {b_held}"
        );
    }

    /// A device that completes a request twice: by then the driver may have
    /// given the head to a new request. Free descriptors are reused last
    /// in, last out (a ring's length later), so a repeat soon after names a
    /// free descriptor: the device is broken, and the new request's memory
    /// stays held.
    #[tokio::test]
    async fn a_repeated_completion_does_not_complete_the_next_request() {
        let (q, mut dev, pool) = queue(8);
        let h = TestHost::default();
        let mut rx_a = submit(&q, &h, &pool, 1).await;
        let ha = dev.pop_avail().unwrap().unwrap();
        dev.push_used(u32::from(ha), 0).unwrap();
        q.drain(&h);
        rx_a.sleep().await.unwrap();
        let mut rx_b = submit(&q, &h, &pool, 2).await;
        let hb = dev.pop_avail().unwrap().unwrap();
        assert_ne!(ha, hb, "the head is not reused at once");
        let b_chain = dev.chain(hb).unwrap();
        dev.push_used(u32::from(ha), 0).unwrap();
        q.drain(&h);
        assert!(h.broken.lock().unwrap().is_some());
        assert!(
            rx_b.sleep().await.is_err(),
            "B failed with the device, not completed"
        );
        assert!(pool.is_allocated(b_chain[0].addr, b_chain[0].len as usize));
    }

    /// More than 65,536 requests through a ring of 4, completed out of
    /// order two at a time: the u16 indices wrap, and nothing is lost.
    #[tokio::test]
    async fn indices_wrap_with_requests_completed_out_of_order() {
        let (q, mut dev, pool) = queue(4);
        let h = TestHost::default();
        let idle = pool.units_in_use();
        for i in 0..35_000u64 {
            let mut a = submit(&q, &h, &pool, 2 * i).await;
            let mut b = submit(&q, &h, &pool, 2 * i + 1).await;
            let ha = dev.pop_avail().unwrap().unwrap();
            let hb = dev.pop_avail().unwrap().unwrap();
            dev.push_used(u32::from(hb), 0).unwrap();
            dev.push_used(u32::from(ha), 0).unwrap();
            q.drain(&h);
            assert_eq!(a.sleep().await.unwrap().0.read_u64(0).unwrap(), 2 * i);
            assert_eq!(b.sleep().await.unwrap().0.read_u64(0).unwrap(), 2 * i + 1);
        }
        assert!(h.broken.lock().unwrap().is_none());
        assert_eq!(pool.units_in_use(), idle);
    }

    /// A waker that counts its wake-ups.
    struct Count(AtomicUsize);

    impl std::task::Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counting() -> (Arc<Count>, Waker) {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        (count.clone(), Waker::from(count))
    }

    /// One caller polls the ring at a time: the first to look leads (the
    /// device's interrupts off), the next sleeps with its waker; the
    /// leader done, the sleeper is woken to lead in its place — but not
    /// when the leader stopped because the device went quiet (the
    /// interrupt brings completions then), and not once nothing is left
    /// in the device.
    #[tokio::test]
    async fn one_caller_polls_and_hands_the_ring_to_a_sleeper() {
        let (q, mut dev, pool) = queue(8);
        let h = TestHost::default();
        let mut a = submit(&q, &h, &pool, 1).await;
        let mut b = submit(&q, &h, &pool, 2).await;
        let (wa, a_waker) = counting();
        let (wb, b_waker) = counting();
        assert!(matches!(a.poll(&a_waker, true), TicketPoll::Lead));
        assert!(
            !q.lock().ring.interrupts().unwrap(),
            "a poller turns them off"
        );
        assert!(matches!(b.poll(&b_waker, true), TicketPoll::Asleep));
        // A's request completes (drained by its poller); A stops polling
        // with B's still in the device: B is woken to lead.
        let ha = dev.pop_avail().unwrap().unwrap();
        dev.push_used(u32::from(ha), 0).unwrap();
        assert_eq!(q.drain(&h), 1);
        assert!(q.stop_polling(true));
        assert!(q.lock().ring.interrupts().unwrap());
        assert_eq!(
            wb.0.load(Ordering::SeqCst),
            1,
            "the sleeper is handed the ring"
        );
        assert!(matches!(a.poll(&a_waker, true), TicketPoll::Ready(Ok(_))));
        assert!(matches!(b.poll(&b_waker, true), TicketPoll::Lead));
        // B goes quiet: nobody else is woken (there is nobody, and a
        // quiet stop hands over to no one anyway).
        let mut c = submit(&q, &h, &pool, 3).await;
        let (wc, c_waker) = counting();
        assert!(matches!(c.poll(&c_waker, true), TicketPoll::Asleep));
        assert!(q.stop_polling(false));
        assert_eq!(wc.0.load(Ordering::SeqCst), 0, "no hand-off when quiet");
        // Completions by interrupt (the drain) wake the sleepers.
        while let Some(head) = dev.pop_avail().unwrap() {
            dev.push_used(u32::from(head), 0).unwrap();
        }
        assert_eq!(q.drain(&h), 2);
        assert_eq!(
            (wb.0.load(Ordering::SeqCst), wc.0.load(Ordering::SeqCst)),
            (1, 1)
        );
        // Without leading (lead false), a caller never polls.
        assert!(matches!(b.poll(&b_waker, false), TicketPoll::Ready(Ok(_))));
        assert!(matches!(c.poll(&c_waker, false), TicketPoll::Ready(Ok(_))));
        assert_eq!(wa.0.load(Ordering::SeqCst), 0, "the poller was never woken");
        assert_eq!(q.lock().tickets.in_use(), 0);
    }

    /// A caller that goes away: its request's memory stays held while the
    /// device has it and is freed by the completion; a result nobody took
    /// is freed when the ticket is dropped; a failed device's abandoned
    /// tickets are freed too. Slots are reused and none is left.
    #[tokio::test]
    async fn an_abandoned_ticket_frees_its_memory_only_once_the_device_is_done() {
        let (q, mut dev, pool) = queue(8);
        let h = TestHost::default();
        let idle = pool.units_in_use();
        let gone = submit(&q, &h, &pool, 1).await;
        let head = dev.pop_avail().unwrap().unwrap();
        let chain = dev.chain(head).unwrap();
        drop(gone);
        assert!(
            pool.is_allocated(chain[0].addr, chain[0].len as usize),
            "freed while the device holds it"
        );
        assert_eq!(q.lock().tickets.in_use(), 1);
        dev.push_used(u32::from(head), 0).unwrap();
        q.drain(&h);
        assert_eq!(pool.units_in_use(), idle, "freed by the completion");
        assert_eq!(q.lock().tickets.in_use(), 0);
        // Completed, never taken, then dropped.
        let done = submit(&q, &h, &pool, 2).await;
        let head = dev.pop_avail().unwrap().unwrap();
        dev.push_used(u32::from(head), 0).unwrap();
        q.drain(&h);
        assert!(pool.units_in_use() > idle);
        drop(done);
        assert_eq!(pool.units_in_use(), idle);
        // The slot is reused: the table does not grow with requests.
        for tag in 0..100 {
            let mut t = submit(&q, &h, &pool, tag).await;
            let head = dev.pop_avail().unwrap().unwrap();
            dev.push_used(u32::from(head), 0).unwrap();
            q.drain(&h);
            assert_eq!(t.try_take().unwrap().unwrap().0.read_u64(0).unwrap(), tag);
        }
        assert_eq!(q.lock().tickets.slots.len(), 1);
        // Abandoned, then the device fails: parked, the slot freed.
        let gone = submit(&q, &h, &pool, 7).await;
        drop(gone);
        let parked = q.fail_all();
        assert_eq!(parked.len(), 1);
        assert_eq!(q.lock().tickets.in_use(), 0);
    }

    /// `Tickets` derives Debug; a failed ticket keeps the rescued
    /// input (plaintext) in `Failed(Zeroizing<Vec<u8>>)`, whose Debug prints
    /// the bytes.
    #[test]
    fn a_failed_tickets_debug_prints_no_bytes() {
        let mut t = Tickets::default();
        let id = t.open(None);
        t.fail(
            id,
            Some(Zeroizing::new(b"secret".to_vec())),
            &mut Vec::new(),
        );
        let s = format!("{t:?}");
        eprintln!("DEBUG: {s}");
        assert!(!s.contains("115, 101, 99, 114, 101, 116"), "{s}");
    }

    /// A ticket past its deadline is given up only when its caller looks:
    /// a completion that came first wins; the completion task is left the
    /// next deadline still to come, and told of one sooner than it knows.
    #[tokio::test(flavor = "current_thread")]
    async fn deadlines_expire_waiters_and_a_completion_still_wins() {
        let (q, mut dev, pool) = queue(8);
        let h = TestHost::default();
        let soon = Deadline::after(Duration::from_secs(10));
        let later = Deadline::after(Duration::from_secs(20));
        let mut tickets = Vec::new();
        for (tag, d) in [(1u64, soon), (2, later), (3, soon)] {
            let (b, chain) = tagged(&pool, tag);
            let t = q
                .enqueue_one(&h, &mut Some(b), chain, None, None, Some(d))
                .await
                .unwrap();
            tickets.push(t);
        }
        assert_eq!(q.watch_state().1, Some(soon.at), "the earliest");
        let waker = Waker::noop().clone();
        for t in &mut tickets {
            assert!(matches!(t.poll(&waker, false), TicketPoll::Asleep));
        }
        // Not yet: nothing expires.
        q.expire(tokio::time::Instant::now());
        assert!(matches!(tickets[0].poll(&waker, false), TicketPoll::Asleep));
        // The clock as the completion task would read it 15 s on.
        let then = tokio::time::Instant::now() + Duration::from_secs(15);
        // Ticket 3's request completes before anyone looks at the clock.
        let heads: Vec<u16> = (0..3).map(|_| dev.pop_avail().unwrap().unwrap()).collect();
        dev.push_used(u32::from(heads[2]), 0).unwrap();
        q.drain(&h);
        q.expire(then);
        assert_eq!(q.watch_state().1, Some(later.at), "the next to come");
        assert!(
            matches!(tickets[0].poll(&waker, false), TicketPoll::Expired(l) if l == soon.limit)
        );
        assert!(tickets[0].is_settled(), "a poller stops for it");
        assert!(matches!(tickets[1].poll(&waker, false), TicketPoll::Asleep));
        let TicketPoll::Ready(Ok((buf, _))) = tickets[2].poll(&waker, false) else {
            panic!("the completion lost to the deadline");
        };
        assert_eq!(buf.read_u64(0).unwrap(), 3);
        // Given up: the memory stays the queue's until the device is done.
        let gone = tickets.remove(0);
        drop(gone);
        dev.push_used(u32::from(heads[0]), 0).unwrap();
        dev.push_used(u32::from(heads[1]), 0).unwrap();
        q.drain(&h);
        assert!(matches!(
            tickets[0].poll(&waker, false),
            TicketPoll::Ready(Ok(_))
        ));
        drop(tickets);
        drop(buf);
        assert_eq!(q.lock().tickets.in_use(), 0);
    }

    /// A caller giving up on an expired request gets, in one look, the
    /// result if the device completed it meanwhile (after the caller saw
    /// the deadline pass), else the rescued input from the memory the
    /// device still holds, else the copy made when the device failed:
    /// never nothing.
    #[tokio::test(flavor = "current_thread")]
    async fn giving_up_keeps_a_late_completion_or_rescues_the_input() {
        let (q, mut dev, pool) = queue(8);
        let h = TestHost::default();
        let soon = Deadline::after(Duration::from_secs(10));
        let then = tokio::time::Instant::now() + Duration::from_secs(15);
        let rescue = || Some(Rescue { at: 0, len: 8 });
        let mut tickets = Vec::new();
        for tag in [1u64, 2, 3] {
            let (b, chain) = tagged(&pool, tag);
            let t = q
                .enqueue_one(&h, &mut Some(b), chain, None, rescue(), Some(soon))
                .await
                .unwrap();
            tickets.push(t);
        }
        q.expire(then);
        let waker = Waker::noop().clone();
        for t in &mut tickets {
            assert!(matches!(t.poll(&waker, false), TicketPoll::Expired(_)));
        }
        // 1 completes after its caller saw the deadline pass, before it
        // gives up: the result is kept, not lost between two looks.
        let heads: Vec<u16> = (0..3).map(|_| dev.pop_avail().unwrap().unwrap()).collect();
        dev.push_used(u32::from(heads[0]), 0).unwrap();
        q.drain(&h);
        let mut tickets = tickets.into_iter();
        let mut next = || tickets.next().unwrap();
        let Ok((done, _)) = next().give_up() else {
            panic!("a completion that came as its caller gave up was lost");
        };
        assert_eq!(done.read_u64(0).unwrap(), 1);
        // 2 is still in the device: its input is read from there.
        let copy = next().give_up().err().flatten().expect("rescued");
        assert_eq!(copy[..], 2u64.to_le_bytes());
        // 3's device fails: the copy made then.
        let last = next();
        let parked = q.fail_all();
        let copy = last.give_up().err().flatten().expect("copied out");
        assert_eq!(copy[..], 3u64.to_le_bytes());
        drop((done, parked));
        assert_eq!(q.lock().tickets.in_use(), 0);
    }

    /// `Deadline::after` with `Duration::MAX` (or anything past what an
    /// `Instant` holds) saturates far off instead of panicking; `bound`
    /// with it arms a timer that does not fire, and with a deadline
    /// already past it times out a waiting future (one ready at once
    /// still wins).
    #[tokio::test(flavor = "current_thread")]
    async fn huge_and_past_deadlines_bound_without_panicking() {
        let now = tokio::time::Instant::now();
        let d = Deadline::after(Duration::MAX);
        assert_eq!(d.limit, Duration::MAX);
        assert!(d.at > now + Duration::from_secs(86_400 * 365 * 29));
        let never = std::future::pending::<Result<(), Error>>();
        let r =
            tokio::time::timeout(Duration::from_millis(50), Deadline::bound(Some(d), never)).await;
        assert!(r.is_err(), "a 30-year deadline fired");
        let past = Deadline::after(Duration::ZERO);
        let never = std::future::pending::<Result<(), Error>>();
        let r = tokio::time::timeout(Duration::from_secs(10), Deadline::bound(Some(past), never))
            .await
            .expect("a past deadline never fired");
        assert!(matches!(r, Err(Error::Timeout(l)) if l == Duration::ZERO));
        let ready = std::future::ready(Ok::<u8, Error>(7));
        assert_eq!(Deadline::bound(Some(past), ready).await.unwrap(), 7);
    }

    /// The completion task is left no deadline to wake for once the
    /// tickets that had one are gone: failed with the device, abandoned
    /// and completed, or expired (no timer re-armed for the past, no
    /// stale deadline kept).
    #[tokio::test(flavor = "current_thread")]
    async fn no_deadline_is_left_once_its_tickets_are_gone() {
        let (q, mut dev, pool) = queue(8);
        let h = TestHost::default();
        let d = Deadline::after(Duration::from_secs(10));
        let mut t = Vec::new();
        for tag in 0..3 {
            let (b, chain) = tagged(&pool, tag);
            t.push(
                q.enqueue_one(&h, &mut Some(b), chain, None, None, Some(d))
                    .await
                    .unwrap(),
            );
        }
        assert_eq!(q.watch_state().1, Some(d.at));
        // One abandoned and completed, one expired, one failed.
        drop(t.remove(0));
        let head = dev.pop_avail().unwrap().unwrap();
        dev.push_used(u32::from(head), 0).unwrap();
        q.drain(&h);
        let later = tokio::time::Instant::now() + Duration::from_secs(11);
        q.expire(later);
        assert_eq!(q.watch_state().1, None, "expired: nothing left to wake for");
        let waker = Waker::noop().clone();
        assert!(matches!(t[0].poll(&waker, false), TicketPoll::Expired(_)));
        q.fail_all();
        assert!(matches!(
            t[1].poll(&waker, false),
            TicketPoll::Ready(Err(()))
        ));
        q.expire(later + Duration::from_secs(1));
        assert_eq!(q.watch_state().1, None);
    }

    /// Requests published while a caller polls leave the doorbell to it:
    /// not rung at submission, rung once by `kick` for all of them, and
    /// not again; with nobody polling, each rings at once.
    #[tokio::test(flavor = "current_thread")]
    async fn requests_behind_a_poller_are_rung_once_by_kick() {
        let (q, _dev, pool) = queue(8);
        let h = TestHost::default();
        let mut keep = Vec::new();
        keep.push(submit(&q, &h, &pool, 0).await);
        assert_eq!(
            h.notified.load(Ordering::Relaxed),
            1,
            "a lone request rings"
        );
        q.start_polling();
        for tag in 1..4 {
            keep.push(submit(&q, &h, &pool, tag).await);
        }
        assert_eq!(
            h.notified.load(Ordering::Relaxed),
            1,
            "deferred to the poller"
        );
        assert!(q.unkicked.load(Ordering::Acquire));
        q.kick(&h);
        q.kick(&h);
        assert_eq!(
            h.notified.load(Ordering::Relaxed),
            2,
            "one doorbell for three"
        );
        keep.push(submit(&q, &h, &pool, 9).await);
        assert!(q.stop_polling(false));
        q.kick(&h);
        assert_eq!(
            h.notified.load(Ordering::Relaxed),
            3,
            "the last poller out rings"
        );
        keep.push(submit(&q, &h, &pool, 10).await);
        assert_eq!(
            h.notified.load(Ordering::Relaxed),
            4,
            "nobody polls: at once"
        );
    }
}
