//! Linux native AIO for the operation socket's read, batched: the kernel
//! runs an AF_ALG read submitted with `io_submit` asynchronously
//! (`algif_skcipher` completes it from the engine's callback), so no thread
//! waits in the kernel and none is handed the request.
//!
//! * **Submission.** Each request sends its operation (`sendmsg` with the
//!   IV and direction) on its own operation socket from the calling task,
//!   then queues the read's iocb. A request that finds no submission under
//!   way submits at once — a lone request waits for nobody — and, until the
//!   queue is empty, also submits whatever iocbs other requests queued
//!   meanwhile, several in one `io_submit` (natural batching: batches form
//!   only because requests arrive while the kernel is busy).
//! * **Completion.** One reaper thread for the process takes up to
//!   [`REAP_MAX`] completions per `io_getevents` and wakes each request's
//!   task through the waker kept in the request's own state: no channel,
//!   and one thread wake-up per batch rather than per request.
//! * **Back-pressure.** A request waits for room in the context (a
//!   semaphore of [`AIO_DEPTH`] permits, each given back when the kernel's
//!   completion is reaped), so more requests in flight than the context
//!   holds wait their turn instead of failing with `EAGAIN`.
//! * **Ownership.** The output buffer and the socket are kept in the
//!   pending table from before `io_submit` until the completion is reaped,
//!   whatever happens to the request's future: the kernel never writes into
//!   memory that was freed. A request given up (its future dropped, or its
//!   deadline passed) has its result wiped and its socket closed there.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use nix::libc;
use zeroize::Zeroize;

use crate::socket::Op;

/// `struct iocb` (include/uapi/linux/aio_abi.h), little-endian layout.
#[cfg(target_endian = "little")]
#[repr(C)]
#[derive(Clone, Copy)]
struct Iocb {
    aio_data: u64,
    aio_key: u32,
    aio_rw_flags: i32,
    aio_lio_opcode: u16,
    aio_reqprio: i16,
    aio_fildes: u32,
    aio_buf: u64,
    aio_nbytes: u64,
    aio_offset: i64,
    aio_reserved2: u64,
    aio_flags: u32,
    aio_resfd: u32,
}

/// `struct io_event`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct IoEvent {
    data: u64,
    obj: u64,
    res: i64,
    res2: i64,
}

const _: () = assert!(std::mem::size_of::<Iocb>() == 64);
const _: () = assert!(std::mem::size_of::<IoEvent>() == 32);

/// `IOCB_CMD_PREAD`.
const CMD_PREAD: u16 = 0;

/// Requests in flight at once (the context's size; more wait for room).
/// Each holds an operation socket until it completes, so this also bounds
/// the descriptors AIO requests hold (as [`crate::MAX_THREADS`] does for
/// the request threads), well inside the usual limit of 1024.
pub const AIO_DEPTH: usize = 256;

/// The most completions one `io_getevents` takes.
const REAP_MAX: usize = 256;

/// How often the reaper looks for requests past their deadline.
const EXPIRY_SCAN: Duration = Duration::from_millis(100);

/// What a completion hands back: the output buffer, the socket, and the
/// read's result (bytes, or a negated errno).
pub(crate) type Completion = (Vec<u8>, Op, i64);

/// A submitted read, kept whole until its completion: the kernel writes
/// into `out` and reads nothing else of ours after `io_submit` returns, but
/// the buffer and the socket must outlive the operation.
struct Pending {
    out: Vec<u8>,
    op: Op,
    req: Arc<Req>,
    deadline: Option<Instant>,
}

/// A request's state, shared by its future ([`Ticket`]) and the reaper.
struct Req {
    state: Mutex<State>,
    /// The transform's count of requests given up and still in the kernel.
    stuck: Arc<AtomicUsize>,
}

enum State {
    /// In the kernel; the waker of the task that last polled.
    Waiting(Option<Waker>),
    /// Completed, not yet taken.
    Done(Completion),
    /// Its deadline passed (counted in `stuck`); not yet seen by its future.
    TimedOut,
    /// Its future is gone while the kernel still has it; `stuck` if it was
    /// counted as such.
    Abandoned { stuck: bool },
    /// Its result was taken, or dropped after completion.
    Over,
}

/// What a request's [`Ticket`] resolves to.
pub(crate) enum Outcome {
    Done(Completion),
    /// Given up after its deadline: the kernel still has the buffer and
    /// socket, and frees them when it completes.
    TimedOut,
}

fn wipe((mut out, _op, _res): Completion) {
    out.zeroize();
}

impl Req {
    /// The kernel completed it: hands back the waker to wake, if a future
    /// waits for it.
    fn finish(&self, c: Completion) -> Option<Waker> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match std::mem::replace(&mut *state, State::Over) {
            State::Waiting(waker) => {
                *state = State::Done(c);
                return waker;
            }
            State::TimedOut | State::Abandoned { stuck: true } => {
                self.stuck.fetch_sub(1, Ordering::AcqRel);
            }
            State::Abandoned { stuck: false } | State::Over => {}
            State::Done(earlier) => wipe(earlier),
        }
        drop(state);
        // Nobody takes the result (it may be plaintext): wiped, and the
        // socket closed.
        wipe(c);
        None
    }

    /// Its deadline passed: gives it up, if still waiting.
    fn expire(&self) -> Option<Waker> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let State::Waiting(waker) = &mut *state {
            let waker = waker.take();
            // Counted before its future can see it, so the decrement in
            // `finish` never precedes it.
            self.stuck.fetch_add(1, Ordering::AcqRel);
            *state = State::TimedOut;
            return waker;
        }
        None
    }
}

/// Waits for one submitted request.
///
/// # Cancel safety
/// Dropping it leaves the read with the kernel: its buffer and socket stay
/// in the pending table until the completion is reaped, then are wiped and
/// closed.
pub(crate) struct Ticket {
    req: Arc<Req>,
}

impl Future for Ticket {
    type Output = Outcome;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Outcome> {
        let mut state = self.req.state.lock().unwrap_or_else(|p| p.into_inner());
        match &mut *state {
            State::Waiting(waker) => {
                match waker {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    _ => *waker = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
            State::Done(_) => match std::mem::replace(&mut *state, State::Over) {
                State::Done(c) => Poll::Ready(Outcome::Done(c)),
                _ => unreachable!("matched Done"),
            },
            State::TimedOut => {
                *state = State::Abandoned { stuck: true };
                Poll::Ready(Outcome::TimedOut)
            }
            State::Abandoned { .. } | State::Over => Poll::Ready(Outcome::TimedOut),
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut state = self.req.state.lock().unwrap_or_else(|p| p.into_inner());
        match std::mem::replace(&mut *state, State::Over) {
            State::Waiting(_) => *state = State::Abandoned { stuck: false },
            State::TimedOut => *state = State::Abandoned { stuck: true },
            State::Done(c) => {
                drop(state);
                wipe(c);
            }
            s @ State::Abandoned { .. } => *state = s,
            State::Over => {}
        }
    }
}

/// Room for one request in the context, taken before its operation is sent.
pub(crate) struct Room(tokio::sync::SemaphorePermit<'static>);

/// The submitter's claim on the queue (`busy`): released if its loop
/// unwinds (a normal end clears `busy` under the lock itself and forgets
/// this).
struct Submitting<'a>(&'a Mutex<Queue>);

impl Drop for Submitting<'_> {
    fn drop(&mut self) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).busy = false;
    }
}

/// The submission queue: iocbs sent but not yet submitted, and whether a
/// request is submitting them.
#[derive(Default)]
struct Queue {
    iocbs: Vec<Iocb>,
    busy: bool,
}

pub(crate) struct Aio {
    ctx: u64,
    pending: Mutex<HashMap<u64, Pending>>,
    queue: Mutex<Queue>,
    room: tokio::sync::Semaphore,
    next: AtomicU64,
    /// `io_submit` calls and the iocbs they carried, `io_getevents` calls
    /// that returned events and the events (for the benches).
    submits: AtomicU64,
    submitted: AtomicU64,
    reaps: AtomicU64,
    reaped: AtomicU64,
}

/// What the process's batched AIO did so far: `io_submit` calls and the
/// reads they carried (their ratio is the submission batch), and the
/// reaper's `io_getevents` calls that returned completions and the
/// completions (their ratio is the completion batch).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AioCounts {
    /// `io_submit` calls.
    pub submits: u64,
    /// Reads they submitted.
    pub submitted: u64,
    /// `io_getevents` calls that returned completions.
    pub reaps: u64,
    /// Completions they returned.
    pub reaped: u64,
}

/// [`AioCounts`] for the process (all zero before its first AIO request).
pub fn aio_counts() -> AioCounts {
    match Aio::get() {
        Some(a) => AioCounts {
            submits: a.submits.load(Ordering::Relaxed),
            submitted: a.submitted.load(Ordering::Relaxed),
            reaps: a.reaps.load(Ordering::Relaxed),
            reaped: a.reaped.load(Ordering::Relaxed),
        },
        None => AioCounts::default(),
    }
}

impl Aio {
    /// The process's AIO context and its reaper, set up on first use;
    /// `None` where the kernel has no native AIO (or no thread starts).
    pub(crate) fn get() -> Option<&'static Aio> {
        static AIO: OnceLock<Option<&'static Aio>> = OnceLock::new();
        *AIO.get_or_init(|| {
            let mut ctx: u64 = 0;
            // SAFETY: io_setup writes the new context id to the u64 we pass
            // (aio_context_t is an unsigned long, 64 bits here) and reads
            // nothing else.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_io_setup,
                    AIO_DEPTH as libc::c_long,
                    &mut ctx as *mut u64,
                )
            };
            if r != 0 {
                return None;
            }
            let aio: &'static Aio = Box::leak(Box::new(Aio {
                ctx,
                pending: Mutex::new(HashMap::new()),
                queue: Mutex::new(Queue::default()),
                room: tokio::sync::Semaphore::new(AIO_DEPTH),
                next: AtomicU64::new(1),
                submits: AtomicU64::new(0),
                submitted: AtomicU64::new(0),
                reaps: AtomicU64::new(0),
                reaped: AtomicU64::new(0),
            }));
            std::thread::Builder::new()
                .name("af-alg-aio".into())
                .spawn(move || aio.reap())
                .ok()
                .map(|_| aio)
        })
    }

    /// Waits for room for one more request in the context.
    ///
    /// # Cancel safety
    /// Dropping the future before it resolves takes no room.
    pub(crate) async fn room(&'static self) -> Room {
        // The semaphore is never closed.
        Room(self.room.acquire().await.expect("never closed"))
    }

    /// Queues a read of `out.len()` bytes from `op` (whose operation was
    /// sent) into `out`, and submits it with whatever else is queued unless
    /// another request is submitting already (it then submits this one).
    /// Given up at `deadline`, if any.
    pub(crate) fn submit(
        &'static self,
        room: Room,
        op: Op,
        mut out: Vec<u8>,
        deadline: Option<Instant>,
        stuck: Arc<AtomicUsize>,
    ) -> Ticket {
        // The room stays taken until the completion is reaped.
        room.0.forget();
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let iocb = Iocb {
            aio_data: id,
            aio_key: 0,
            aio_rw_flags: 0,
            aio_lio_opcode: CMD_PREAD,
            aio_reqprio: 0,
            aio_fildes: op.raw_fd() as u32,
            aio_buf: out.as_mut_ptr() as u64,
            aio_nbytes: out.len() as u64,
            aio_offset: 0,
            aio_reserved2: 0,
            aio_flags: 0,
            aio_resfd: 0,
        };
        let req = Arc::new(Req {
            state: Mutex::new(State::Waiting(None)),
            stuck,
        });
        // Registered before the submit (the completion may come at once):
        // the Vec's heap storage, which the iocb names, does not move when
        // the Vec moves into the table.
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                id,
                Pending {
                    out,
                    op,
                    req: req.clone(),
                    deadline,
                },
            );
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        q.iocbs.push(iocb);
        if !q.busy {
            q.busy = true;
            let mut batch = std::mem::take(&mut q.iocbs);
            drop(q);
            // Cleared however this ends: a panic in the loop must not leave
            // every later read queued behind a submitter that is gone.
            let submitting = Submitting(&self.queue);
            // Not under the lock during io_submit: others queue meanwhile
            // (for a synchronous driver the operations run inside it).
            loop {
                self.submit_batch(&mut batch);
                batch.clear();
                let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
                if q.iocbs.is_empty() {
                    q.busy = false;
                    // Keep the allocation for the next batch.
                    q.iocbs = batch;
                    break;
                }
                std::mem::swap(&mut q.iocbs, &mut batch);
            }
            std::mem::forget(submitting);
        }
        Ticket { req }
    }

    /// Submits `batch` in as few calls as the kernel takes it; an iocb the
    /// kernel refuses completes at once with the errno.
    fn submit_batch(&self, batch: &mut [Iocb]) {
        // Mutable: the kernel writes each iocb's `aio_key` as it takes it.
        let mut ptrs: Vec<*mut Iocb> = batch.iter_mut().map(|i| i as *mut Iocb).collect();
        let mut done = 0;
        while done < ptrs.len() {
            // SAFETY: `ptrs[done..]` are valid, exclusive pointers to
            // initialised iocbs in `batch` (borrowed mutably), alive across
            // the call; the kernel reads each iocb and writes its `aio_key`
            // during it, and keeps no pointer to it after. The buffers and sockets they name are held in
            // the pending table until their completions are reaped (or, for
            // an iocb not submitted, until `refuse` removes them below).
            let r = unsafe {
                libc::syscall(
                    libc::SYS_io_submit,
                    self.ctx as libc::c_ulong,
                    (ptrs.len() - done) as libc::c_long,
                    ptrs[done..].as_mut_ptr(),
                )
            };
            self.submits.fetch_add(1, Ordering::Relaxed);
            if r > 0 {
                self.submitted.fetch_add(r as u64, Ordering::Relaxed);
                done += r as usize;
                continue;
            }
            // The first iocb left was refused (io_submit fails only when
            // the first it is given is): it completes with the errno, and
            // the rest are submitted on.
            let errno = if r < 0 {
                nix::errno::Errno::last()
            } else {
                nix::errno::Errno::EAGAIN
            };
            self.complete([(batch[done].aio_data, -(errno as i64))]);
            done += 1;
        }
    }

    /// Delivers completions `(id, result)`: each request's buffer and socket
    /// go to its future (or are wiped and closed if it is gone), its room
    /// is given back, and the waiting tasks are woken, after the locks.
    fn complete(&self, done: impl IntoIterator<Item = (u64, i64)>) {
        let mut wake = Vec::new();
        let mut freed = 0;
        {
            let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            for (id, res) in done {
                if let Some(p) = pending.remove(&id) {
                    freed += 1;
                    wake.extend(p.req.finish((p.out, p.op, res)));
                }
            }
        }
        self.room.add_permits(freed);
        for w in wake {
            w.wake();
        }
    }

    /// Gives up the requests past their deadline.
    fn expire(&self, now: Instant) {
        let mut wake = Vec::new();
        {
            let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            for p in pending.values_mut() {
                if p.deadline.is_some_and(|d| d <= now) {
                    p.deadline = None;
                    wake.extend(p.req.expire());
                }
            }
        }
        for w in wake {
            w.wake();
        }
    }

    fn reap(&self) {
        let mut events = [IoEvent::default(); REAP_MAX];
        let mut scanned = Instant::now();
        loop {
            let wait = libc::timespec {
                tv_sec: 0,
                tv_nsec: EXPIRY_SCAN.as_nanos() as libc::c_long,
            };
            // SAFETY: the event array is valid for REAP_MAX entries, which
            // the kernel fills; the timeout is a valid timespec it reads.
            let n = unsafe {
                libc::syscall(
                    libc::SYS_io_getevents,
                    self.ctx as libc::c_ulong,
                    1 as libc::c_long,
                    events.len() as libc::c_long,
                    events.as_mut_ptr(),
                    &wait as *const libc::timespec,
                )
            };
            if n < 0 {
                // EINTR; anything else would repeat, so pause rather than spin.
                if nix::errno::Errno::last() != nix::errno::Errno::EINTR {
                    std::thread::sleep(Duration::from_millis(10));
                }
                continue;
            }
            if n > 0 {
                self.reaps.fetch_add(1, Ordering::Relaxed);
                self.reaped.fetch_add(n as u64, Ordering::Relaxed);
            }
            self.complete(events[..n as usize].iter().map(|e| (e.data, e.res)));
            let now = Instant::now();
            if now.duration_since(scanned) >= EXPIRY_SCAN {
                scanned = now;
                self.expire(now);
            }
        }
    }
}
