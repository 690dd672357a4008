//! The device side: the hardware queues, the completion threads that wake
//! requests at their modelled completion (`SimTimer::Device`), and what a
//! request holds — its slot, power reference and buffer — until then, even
//! if its future is dropped.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crypto_offload::backend::{IoBuf, PowerRef};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

/// A hardware queue (ring): it serves one request at a time, in order.
pub(crate) struct Queue {
    /// When the queue finishes the last request given to it.
    free_at: Mutex<Instant>,
    /// Held while a completion is handled (the queue's interrupt).
    completion: Mutex<()>,
}

impl Queue {
    /// An idle queue.
    pub(crate) fn new(now: Instant) -> Self {
        Queue {
            free_at: Mutex::new(now),
            completion: Mutex::new(()),
        }
    }

    /// Handles a completion on this queue's "interrupt": one at a time per
    /// queue, each spending `cpu` of real CPU time.
    pub(crate) fn complete(&self, cpu: Duration) {
        let _irq = self.completion.lock().unwrap_or_else(|p| p.into_inner());
        spin(cpu);
    }
}

/// Puts a request that takes `service` on the least busy queue: the queue
/// and the request's completion time.
pub(crate) fn schedule(queues: &[Queue], service: Duration) -> (usize, Instant) {
    let now = Instant::now();
    let (q, _) = queues
        .iter()
        .enumerate()
        .map(|(i, q)| (i, *q.free_at.lock().unwrap_or_else(|p| p.into_inner())))
        .min_by_key(|&(_, t)| t)
        .unwrap_or((0, now));
    let mut free = queues[q].free_at.lock().unwrap_or_else(|p| p.into_inner());
    let done = (*free).max(now) + service;
    *free = done;
    (q, done)
}

/// Spends `d` of real CPU time on this thread.
pub(crate) fn spin(d: Duration) {
    if d.is_zero() {
        return;
    }
    let start = std::time::Instant::now();
    while start.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// What a request holds while the "device" works on it (with
/// [`SimTimer::Tokio`](crate::SimTimer::Tokio)). If the request is cancelled, the device still
/// finishes: the buffer, the power reference and the queue slot stay taken
/// until the modelled completion, as a DMA would keep them; the buffer is
/// freed first, so that a free slot means its buffer is gone too.
pub(crate) struct InFlight {
    held: Held,
    buf: IoBuf,
    until: Instant,
    finished: bool,
}

/// A request's power reference and queue slot.
pub(crate) type Held = (Option<PowerRef>, Option<OwnedSemaphorePermit>);

impl InFlight {
    /// `buf` and `held` are the device's until `until`.
    pub(crate) fn new(held: Held, buf: IoBuf, until: Instant) -> Self {
        InFlight {
            held,
            buf,
            until,
            finished: false,
        }
    }

    /// The device completed the request: it lets go of the power and the
    /// slot, and hands the buffer back.
    pub(crate) fn complete(mut self) -> IoBuf {
        self.finished = true;
        drop(core::mem::take(&mut self.held));
        core::mem::replace(&mut self.buf, IoBuf::from(Vec::new()))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let held = core::mem::take(&mut self.held);
        let buf = core::mem::replace(&mut self.buf, IoBuf::from(Vec::new()));
        let until = self.until;
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                tokio::time::sleep_until(until).await;
                drop(buf);
                drop(held);
            });
        }
    }
}

/// The lock of a request's buffer shared with the device thread.
pub(crate) fn lock(dma: &Mutex<IoBuf>) -> std::sync::MutexGuard<'_, IoBuf> {
    dma.lock().unwrap_or_else(|p| p.into_inner())
}

/// A queue's completion thread ([`SimTimer::Device`](crate::SimTimer::Device)): it sleeps until each
/// request's modelled completion, spends the completion's CPU time (the
/// interrupt handler's share), releases what the request held and wakes it.
pub(crate) struct Device {
    state: Mutex<DeviceState>,
    wake: std::sync::Condvar,
}

#[derive(Default)]
struct DeviceState {
    /// Completions in order (a queue serves in order, so `done` rises).
    pending: std::collections::VecDeque<Completion>,
    stop: bool,
}

struct Completion {
    done: std::time::Instant,
    hung: bool,
    held: Held,
    /// The request's buffer, shared with the request: if the request was
    /// dropped, the device's is the last reference and frees it.
    dma: Arc<Mutex<IoBuf>>,
    tx: tokio::sync::oneshot::Sender<()>,
}

impl Device {
    pub(crate) fn start(name: String, completion_cpu: Duration) -> Arc<Device> {
        let device = Arc::new(Device {
            state: Mutex::new(DeviceState::default()),
            wake: std::sync::Condvar::new(),
        });
        let d = device.clone();
        let spawned = std::thread::Builder::new()
            .name(name)
            .spawn(move || d.run(completion_cpu));
        if spawned.is_err() {
            // No thread: every request fails as if the device were gone.
            device.lock().stop = true;
        }
        device
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, DeviceState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn submit(
        &self,
        done: std::time::Instant,
        hung: bool,
        held: Held,
        dma: Arc<Mutex<IoBuf>>,
    ) -> tokio::sync::oneshot::Receiver<()> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let mut state = self.lock();
        if !state.stop {
            // A hung request does not hold up the queue's later completions.
            let at = state
                .pending
                .iter()
                .position(|c| c.done > done)
                .unwrap_or(state.pending.len());
            state.pending.insert(
                at,
                Completion {
                    done,
                    hung,
                    held,
                    dma,
                    tx,
                },
            );
            drop(state);
            self.wake.notify_one();
        }
        rx
    }

    fn run(&self, completion_cpu: Duration) {
        let mut state = self.lock();
        loop {
            if state.stop {
                return;
            }
            let now = std::time::Instant::now();
            match state.pending.front().map(|c| c.done) {
                None => state = self.wake.wait(state).unwrap_or_else(|p| p.into_inner()),
                Some(done) if done > now => {
                    state = self
                        .wake
                        .wait_timeout(state, done - now)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
                Some(_) => {
                    let Some(c) = state.pending.pop_front() else {
                        continue;
                    };
                    drop(state);
                    if !c.hung {
                        spin(completion_cpu);
                    }
                    // A dropped request's buffer goes before its slot, so
                    // that a free slot means its buffer is gone too.
                    drop(c.dma);
                    drop(c.held);
                    let _ = c.tx.send(());
                    state = self.lock();
                }
            }
        }
    }

    pub(crate) fn stop(&self) {
        self.lock().stop = true;
        self.wake.notify_all();
    }
}
