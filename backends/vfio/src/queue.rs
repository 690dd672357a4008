//! A queue as the driver keeps it: its ring, the requests the device
//! holds (by head descriptor), where each completion goes, and the bursts
//! that wait for theirs.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, oneshot};

use crate::dma::DmaBuf;
use crate::error::Error;
use crate::request::DmaRequest;
use crate::virtqueue::SplitQueue;

/// A request the device holds, and where its completion goes. Its memory
/// is held here (not in the caller's future), so that a cancelled request
/// never frees memory the device may still write.
pub(crate) enum Pending {
    /// A request with its own buffer, back to the one caller waiting.
    One {
        buf: DmaBuf,
        tx: oneshot::Sender<(DmaBuf, u32)>,
    },
    /// One request of a burst: the burst holds all their memory (one
    /// reference per request in the device, nothing moved per request).
    Burst(Arc<Burst>),
}

impl Pending {
    /// Hands the completion on; whether that finished a caller's wait (a
    /// request, or the last of a burst).
    pub(crate) fn complete(self, len: u32) -> bool {
        match self {
            // A caller that went away drops the buffer: free.
            Pending::One { buf, tx } => tx.send((buf, len)).is_ok(),
            Pending::Burst(burst) => burst.complete(),
        }
    }

    /// The device failed with the request in it: the caller's wait fails
    /// (the sender is dropped, the burst marked); the memory the device may
    /// still write, to be parked until it no longer can.
    pub(crate) fn fail(self) -> Vec<DmaBuf> {
        match self {
            Pending::One { buf, .. } => vec![buf],
            Pending::Burst(burst) => burst.fail(),
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

    pub(crate) fn insert(&mut self, head: u16, pending: Pending) {
        if let Some(slot) = self.slots.get_mut(usize::from(head))
            && slot.replace(pending).is_none()
        {
            self.len += 1;
        }
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

pub(crate) struct Queue {
    pub(crate) index: u16,
    pub(crate) notify_off: usize,
    pub(crate) state: Mutex<QueueState>,
    /// Descriptors were freed.
    pub(crate) room: Notify,
    /// Submitters that may be waiting on `room`.
    pub(crate) room_waiters: AtomicUsize,
}

pub(crate) struct QueueState {
    pub(crate) ring: SplitQueue,
    pub(crate) pending: Pendings,
    /// Callers polling this queue for their completions; the device is
    /// asked for no interrupts while there are any.
    pub(crate) pollers: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dma::DmaPool;

    fn buf(pool: &Arc<DmaPool>) -> DmaBuf {
        pool.try_alloc(16).unwrap().unwrap()
    }

    fn one(pool: &Arc<DmaPool>) -> Pending {
        let (tx, _rx) = oneshot::channel();
        Pending::One { buf: buf(pool), tx }
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
    fn pendings_count_what_they_hold() {
        let pool = Arc::new(DmaPool::unmapped(1 << 16).unwrap());
        let mut p = Pendings::new(8);
        p.insert(3, one(&pool));
        assert_eq!(p.len(), 1);
        assert!(p.remove(2).is_none());
        assert!(p.remove(9).is_none(), "past the ring: nothing, no panic");
        assert!(p.remove(3).is_some());
        assert!(p.is_empty());
        for head in [1, 5] {
            p.insert(head, one(&pool));
        }
        assert_eq!(p.drain().count(), 2);
        assert!(p.is_empty());
    }

    #[test]
    fn a_burst_finishes_with_its_last_completion_or_fails_whole() {
        let pool = Arc::new(DmaPool::unmapped(1 << 16).unwrap());
        let burst = Arc::new(Burst::new(vec![request(&pool), request(&pool)]));
        assert!(!Pending::Burst(burst.clone()).complete(7));
        assert!(!burst.finished().unwrap());
        assert!(Pending::Burst(burst.clone()).complete(8));
        assert!(burst.finished().unwrap());
        assert_eq!(burst.take().len(), 2);
        // Failed with requests in the device: their memory is handed over
        // to be parked, once.
        let failed = Arc::new(Burst::new(Vec::new()));
        assert!(Pending::Burst(failed.clone()).fail().is_empty());
        let failed = Arc::new(Burst::new((0..3).map(|_| request(&pool)).collect()));
        assert_eq!(Pending::Burst(failed.clone()).fail().len(), 3);
        assert!(Pending::Burst(failed.clone()).fail().is_empty());
        assert!(matches!(failed.finished(), Err(Error::Gone)));
        assert!(failed.take().is_empty());
    }
}
