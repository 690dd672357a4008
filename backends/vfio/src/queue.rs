//! A queue as the driver keeps it: its ring, the requests the device
//! holds (by head descriptor), where each completion goes, and the bursts
//! that wait for theirs.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, oneshot};

use crate::dma::DmaBuf;
use crate::error::Error;
use crate::virtqueue::SplitQueue;

/// A request the device holds: its buffer (parked here, not in the
/// caller's future, so that a cancelled request never frees memory the
/// device may still write) and where to send it back.
pub(crate) struct Pending {
    pub(crate) buf: DmaBuf,
    pub(crate) done: Completion,
}

/// Where a completed request's buffer goes.
pub(crate) enum Completion {
    /// To the one caller waiting for it.
    One(oneshot::Sender<(DmaBuf, u32)>),
    /// Into slot `.1` of a burst (one allocation for the whole burst, not
    /// one channel per request).
    Burst(Arc<Burst>, usize),
}

impl Completion {
    /// Hands the buffer on; whether that finished a caller's wait (a
    /// request, or the last of a burst).
    pub(crate) fn complete(self, buf: DmaBuf, len: u32) -> bool {
        match self {
            // A caller that went away drops the buffer: free.
            Completion::One(tx) => tx.send((buf, len)).is_ok(),
            Completion::Burst(burst, i) => burst.complete(i, buf, len),
        }
    }
}

/// The requests of one [`CipherSession::run_burst`], as they complete.
pub(crate) struct Burst {
    pub(crate) done: Mutex<Vec<Option<(DmaBuf, u32)>>>,
    pub(crate) left: AtomicUsize,
    /// The device failed (reset, removed) with some still in it.
    pub(crate) failed: AtomicBool,
    /// Wakes the waiter when the last one completes or the device fails.
    pub(crate) wake: Notify,
}

impl Burst {
    pub(crate) fn new(n: usize) -> Burst {
        Burst {
            done: Mutex::new((0..n).map(|_| None).collect()),
            left: AtomicUsize::new(n),
            failed: AtomicBool::new(false),
            wake: Notify::new(),
        }
    }

    /// Files request `i`'s completion; whether it was the burst's last.
    pub(crate) fn complete(&self, i: usize, buf: DmaBuf, len: u32) -> bool {
        if let Some(slot) = self
            .done
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(i)
        {
            *slot = Some((buf, len));
        }
        let last = self.left.fetch_sub(1, Ordering::AcqRel) == 1;
        if last {
            self.wake.notify_one();
        }
        last
    }

    pub(crate) fn fail(&self) {
        self.failed.store(true, Ordering::Release);
        self.wake.notify_one();
    }

    /// All done (`Ok(true)`), not yet (`Ok(false)`), or the device failed.
    pub(crate) fn finished(&self) -> Result<bool, Error> {
        if self.failed.load(Ordering::Acquire) {
            return Err(Error::Gone);
        }
        Ok(self.left.load(Ordering::Acquire) == 0)
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

    #[test]
    fn pendings_count_what_they_hold() {
        let pool = Arc::new(DmaPool::unmapped(1 << 16).unwrap());
        let mut p = Pendings::new(8);
        let (tx, _rx) = oneshot::channel();
        p.insert(
            3,
            Pending {
                buf: buf(&pool),
                done: Completion::One(tx),
            },
        );
        assert_eq!(p.len(), 1);
        assert!(p.remove(2).is_none());
        assert!(p.remove(9).is_none(), "past the ring: nothing, no panic");
        assert!(p.remove(3).is_some());
        assert!(p.is_empty());
        for head in [1, 5] {
            let (tx, _rx) = oneshot::channel();
            p.insert(
                head,
                Pending {
                    buf: buf(&pool),
                    done: Completion::One(tx),
                },
            );
        }
        assert_eq!(p.drain().count(), 2);
        assert!(p.is_empty());
    }

    #[test]
    fn a_burst_finishes_with_its_last_completion_or_fails_whole() {
        let pool = Arc::new(DmaPool::unmapped(1 << 16).unwrap());
        let burst = Arc::new(Burst::new(2));
        Completion::Burst(burst.clone(), 1).complete(buf(&pool), 7);
        assert!(!burst.finished().unwrap());
        Completion::Burst(burst.clone(), 0).complete(buf(&pool), 8);
        assert!(burst.finished().unwrap());
        let lens: Vec<u32> = burst
            .done
            .lock()
            .unwrap()
            .iter()
            .map(|d| d.as_ref().unwrap().1)
            .collect();
        assert_eq!(lens, vec![8, 7]);
        let failed = Burst::new(3);
        failed.fail();
        assert!(matches!(failed.finished(), Err(Error::Gone)));
    }
}
