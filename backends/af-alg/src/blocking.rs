//! Running a request's blocking system calls off the async workers, and the
//! pool of operation sockets a transform reuses.
//!
//! An AF_ALG `read` sleeps in the kernel until the transform finishes — the
//! socket's readiness says only that data was queued, so `AsyncFd` cannot
//! wait for it. Each request therefore runs on a thread of this crate's own
//! pool, on its own operation socket, and the caller's task waits on a
//! channel: no async worker blocks while an engine works, and a session has
//! as many requests in flight as it has callers (up to [`MAX_THREADS`]; more
//! wait their turn).
//!
//! Why a pool of its own rather than tokio's blocking pool: a request to an
//! engine that hangs never returns from the kernel, and a tokio runtime's
//! shutdown waits for its blocking threads — one hung engine would hang the
//! process's exit. These threads are detached. It also works under any
//! executor. Native AIO (`io_submit`, [`crate::aio`]) saves one thread
//! hand-off per request and was measured against this in the QEMU guest
//! (`af-alg-overhead`): within ~10% one request at a time, but 1.35–1.55×
//! dearer per request with 16 in flight on an asynchronous engine
//! (virtio_crypto; only the kernel's synchronous AES-NI driver did as well
//! or better with AIO). Engines are what AF_ALG is for, and servers keep
//! many requests in flight: threads it is.

use std::collections::VecDeque;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

use zeroize::{Zeroize, Zeroizing};

use crate::error::{Error, Failed};
use crate::socket::{Op, Transform};

/// The accessors every transform type has: its bound name, its driver, and
/// `with_timeout`.
macro_rules! bound_accessors {
    () => {
        /// The name it was bound with (generic or driver).
        pub fn bound_name(&self) -> &str {
            self.shared.tfm.name()
        }

        /// The implementation the kernel bound, as `/proc/crypto` names it
        /// (`None` where `/proc/crypto` is unreadable).
        pub fn driver(&self) -> Option<&str> {
            self.shared.tfm.driver()
        }

        /// Gives requests up as hung after `timeout`: each then fails with
        /// [`Error::Timeout`](crate::Error::Timeout) and a copy of its input,
        /// taken before it is sent. Off by default (no copy). Works under any
        /// executor.
        pub fn with_timeout(mut self, timeout: crate::RequestTimeout) -> Self {
            self.timeout = Some(timeout);
            self
        }

        /// Hands operations of `min_len` bytes or more to the kernel by
        /// `vmsplice`/`splice` (its pages, no copy) instead of `sendmsg`
        /// (a copy into the socket); `None` always copies. The default,
        /// 16 KiB, is where splicing measured cheaper (the crate's README);
        /// a kernel that refuses it gets copies. Applies to this transform
        /// and its clones.
        pub fn with_splice_from(self, min_len: Option<usize>) -> Self {
            self.shared.tfm.set_splice_from(min_len);
            self
        }

        /// From which length operations are spliced; `None` if never
        /// (asked so, or the kernel refused a splice).
        pub fn splice_from(&self) -> Option<usize> {
            self.shared.tfm.splice_from()
        }

        /// How many operations this transform (with its clones) handed to
        /// the kernel spliced rather than copied.
        pub fn spliced_operations(&self) -> u64 {
            self.shared.tfm.spliced()
        }
    };
}
pub(crate) use bound_accessors;

/// Idle operation sockets kept per transform; more are closed when done.
const IDLE_OPS: usize = 128;

/// The most request threads at once (requests beyond wait in a queue).
pub const MAX_THREADS: usize = 256;

/// Requests of one transform given up as hung and still in the kernel,
/// beyond which its new requests fail at once with [`Error::Timeout`]
/// instead of taking one more thread into the hung engine (the pool is
/// shared by every transform). As hung requests return, requests resume.
pub const MAX_STUCK: usize = 4;

/// How long an idle request thread waits for work before it exits.
const IDLE_EXIT: Duration = Duration::from_secs(10);

/// How long a request may take before it is given up as hung: `fixed` plus
/// `per_mib` for each MiB of data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestTimeout {
    /// The time every request may take.
    pub fixed: Duration,
    /// More time per MiB of data.
    pub per_mib: Duration,
}

impl RequestTimeout {
    /// The time a `len`-byte request may take (saturating: `Duration::MAX`
    /// means no limit).
    pub(crate) fn for_len(self, len: usize) -> Duration {
        let mib = len as f64 / f64::from(1u32 << 20);
        let more =
            Duration::try_from_secs_f64(self.per_mib.as_secs_f64() * mib).unwrap_or(Duration::MAX);
        self.fixed.saturating_add(more)
    }
}

/// The timer behind request timeouts: one thread for the process, holding
/// the deadlines in a heap and firing each one's channel when it passes
/// (a request that finished first has dropped the other end). Its own, so
/// that timeouts work under any executor — a tokio runtime built without
/// its timer would make `tokio::time::timeout` panic.
struct Watchdog {
    heap: Mutex<std::collections::BinaryHeap<Deadline>>,
    wake: Condvar,
}

struct Deadline {
    at: std::time::Instant,
    fire: tokio::sync::oneshot::Sender<()>,
}

impl PartialEq for Deadline {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at
    }
}
impl Eq for Deadline {}
impl PartialOrd for Deadline {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Deadline {
    /// Reversed: the heap's top is the earliest deadline.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other.at.cmp(&self.at)
    }
}

impl Watchdog {
    /// The process's watchdog, started on first use; `None` if no thread
    /// could be started (requests then have no timeout).
    fn get() -> Option<&'static Watchdog> {
        static DOG: OnceLock<Option<&'static Watchdog>> = OnceLock::new();
        *DOG.get_or_init(|| {
            let dog: &'static Watchdog = Box::leak(Box::new(Watchdog {
                heap: Mutex::new(std::collections::BinaryHeap::new()),
                wake: Condvar::new(),
            }));
            std::thread::Builder::new()
                .name("af-alg-watchdog".into())
                .spawn(move || dog.run())
                .ok()
                .map(|_| dog)
        })
    }

    /// A channel that fires `after` from now (or never, for a deadline past
    /// the clock's range).
    fn arm(&self, after: Duration) -> tokio::sync::oneshot::Receiver<()> {
        let (fire, fired) = tokio::sync::oneshot::channel();
        if let Some(at) = std::time::Instant::now().checked_add(after) {
            let mut heap = self.heap.lock().unwrap_or_else(|p| p.into_inner());
            let earliest = heap.peek().is_none_or(|d| at < d.at);
            heap.push(Deadline { at, fire });
            drop(heap);
            if earliest {
                self.wake.notify_one();
            }
        } else {
            // Never fires: keep the sender alive for the process.
            std::mem::forget(fire);
        }
        fired
    }

    fn run(&self) {
        let mut heap = self.heap.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let now = std::time::Instant::now();
            while heap
                .peek()
                .is_some_and(|d| d.at <= now || d.fire.is_closed())
            {
                if let Some(d) = heap.pop() {
                    let _ = d.fire.send(());
                }
            }
            heap = match heap.peek().map(|d| d.at) {
                None => self.wake.wait(heap).unwrap_or_else(|p| p.into_inner()),
                Some(at) => {
                    self.wake
                        .wait_timeout(heap, at.saturating_duration_since(now))
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
            };
        }
    }
}

/// A transform and its idle operation sockets.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) tfm: Transform,
    idle: Mutex<Vec<Op>>,
    /// Requests given up as hung whose threads are still in the kernel.
    pub(crate) stuck: Arc<AtomicUsize>,
}

impl Shared {
    pub(crate) fn new(tfm: Transform) -> Arc<Shared> {
        Arc::new(Shared {
            tfm,
            idle: Mutex::new(Vec::new()),
            stuck: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// An idle operation socket, or a new one.
    pub(crate) fn take(&self) -> Result<Op, Error> {
        let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        match idle {
            Some(op) => Ok(op),
            None => self.tfm.accept(),
        }
    }

    /// Returns a socket whose operation completed.
    pub(crate) fn give_back(&self, op: Op) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < IDLE_OPS {
            idle.push(op);
        }
    }

    /// Runs `f` on an operation socket, returning it to the pool on success
    /// (a failed one is closed: its kernel state is not trusted).
    pub(crate) fn with_op<T>(&self, f: impl FnOnce(&Op) -> Result<T, Error>) -> Result<T, Error> {
        let op = self.take()?;
        let r = f(&op);
        if r.is_ok() {
            self.give_back(op);
        }
        r
    }
}

type Job = Box<dyn FnOnce() + Send>;

const RUNNING: u8 = 0;
const DONE: u8 = 1;
const ABANDONED: u8 = 2;

#[derive(Default)]
struct Pool {
    state: Mutex<PoolState>,
    wake: Condvar,
}

#[derive(Default)]
struct PoolState {
    queue: VecDeque<Job>,
    threads: usize,
    idle: usize,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(Pool::default)
}

impl Pool {
    fn submit(&'static self, job: Job) -> Result<(), Job> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.queue.push_back(job);
        // Each idle thread takes one queued job; jobs beyond them need new
        // threads.
        if s.queue.len() > s.idle && s.threads < MAX_THREADS {
            let spawned = std::thread::Builder::new()
                .name("af-alg-request".into())
                .spawn(move || self.work());
            match spawned {
                Ok(_) => s.threads += 1,
                // No thread and none to come: hand the job back, unless a
                // running thread will get to it.
                Err(_) if s.threads == 0 => return Err(s.queue.pop_back().expect("just pushed")),
                Err(_) => {}
            }
        }
        drop(s);
        self.wake.notify_one();
        Ok(())
    }

    fn work(&self) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(job) = s.queue.pop_front() {
                drop(s);
                job();
                s = self.state.lock().unwrap_or_else(|p| p.into_inner());
                continue;
            }
            s.idle += 1;
            let (next, timeout) = self
                .wake
                .wait_timeout(s, IDLE_EXIT)
                .unwrap_or_else(|p| p.into_inner());
            s = next;
            s.idle -= 1;
            if timeout.timed_out() && s.queue.is_empty() {
                s.threads -= 1;
                return;
            }
        }
    }
}

/// Runs `job` on `buf` on a request thread. The buffer always comes back —
/// with the job's error if it failed, even if it panicked — except after a
/// timeout, when a copy of the input taken before the job comes back with
/// [`Error::Timeout`] and the original stays with the kernel. Works under
/// any executor.
///
/// # Cancel safety
/// Dropping the returned future does not stop the job: it runs to the end
/// on its thread, which owns the buffer (and the socket) until the kernel is
/// done with them, and then frees both. Nothing is left half-done in the
/// kernel.
pub(crate) async fn run<T: Send + 'static>(
    stuck: &Arc<AtomicUsize>,
    buf: Vec<u8>,
    timeout: Option<RequestTimeout>,
    job: impl FnOnce(&mut Vec<u8>) -> Result<T, Error> + Send + 'static,
) -> Result<(Vec<u8>, T), Failed> {
    run_with(stuck, buf, timeout, job)
        .await
        .map_err(|(error, buf)| Failed { error, buf })
}

/// [`run`] for any buffer that can be wiped. A result no one will take —
/// its future was dropped, or it came after the timeout gave up on it —
/// is wiped before it is freed (it may hold plaintext, or what the kernel
/// computed with the key); so is the copy of the input a timeout keeps.
pub(crate) async fn run_with<B, T>(
    stuck: &Arc<AtomicUsize>,
    mut buf: B,
    timeout: Option<RequestTimeout>,
    job: impl FnOnce(&mut B) -> Result<T, Error> + Send + 'static,
) -> Result<(B, T), (Error, B)>
where
    B: AsRef<[u8]> + Zeroize + Clone + Default + Send + 'static,
    T: Send + 'static,
{
    if timeout.is_some() && stuck.load(Ordering::Acquire) >= MAX_STUCK {
        // The engine has not returned the last ones: do not send it more.
        return Err((Error::Timeout(Duration::ZERO), buf));
    }
    // RUNNING → DONE by the job, or → ABANDONED by a timed-out waiter;
    // whichever comes second knows what the other did.
    let state = Arc::new(AtomicU8::new(RUNNING));
    let (job_state, job_stuck) = (state.clone(), stuck.clone());
    let guard = match (timeout, Watchdog::get()) {
        (Some(t), Some(dog)) => {
            let limit = t.for_len(buf.as_ref().len());
            // The copy may be plaintext: wiped however this future ends.
            Some((Zeroizing::new(buf.clone()), limit, dog.arm(limit)))
        }
        _ => None,
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    let work: Job = Box::new(move || {
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| job(&mut buf)))
            .unwrap_or(Err(Error::Worker));
        let abandoned = job_state
            .compare_exchange(RUNNING, DONE, Ordering::AcqRel, Ordering::Acquire)
            .is_err();
        if abandoned {
            job_stuck.fetch_sub(1, Ordering::AcqRel);
        }
        if let Err((mut unclaimed, _)) = tx.send((buf, r)) {
            unclaimed.zeroize();
        }
    });
    if let Err(work) = pool().submit(work) {
        // No thread could be started: run here rather than fail.
        work();
    }
    let done = match guard {
        None => rx.await.ok(),
        Some((mut copy, limit, mut fired)) => {
            let mut rx = rx;
            let first = std::future::poll_fn(|cx| {
                use std::task::Poll;
                if let Poll::Ready(done) = std::pin::Pin::new(&mut rx).poll(cx) {
                    return Poll::Ready(Some(done.ok()));
                }
                match std::pin::Pin::new(&mut fired).poll(cx) {
                    Poll::Ready(_) => Poll::Ready(None),
                    Poll::Pending => Poll::Pending,
                }
            })
            .await;
            match first {
                Some(done) => done,
                None => {
                    // Counted before it is marked, so the job's decrement
                    // (only after the mark) never precedes it.
                    stuck.fetch_add(1, Ordering::AcqRel);
                    let abandoned = state
                        .compare_exchange(RUNNING, ABANDONED, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok();
                    if abandoned {
                        return Err((Error::Timeout(limit), std::mem::take(&mut *copy)));
                    }
                    // It finished as the deadline passed: take its result.
                    stuck.fetch_sub(1, Ordering::AcqRel);
                    rx.await.ok()
                }
            }
        }
    };
    match done {
        Some((buf, Ok(t))) => Ok((buf, t)),
        Some((buf, Err(error))) => Err((error, buf)),
        // The job never reports only if its thread died outside it.
        None => Err((Error::Worker, B::default())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
    }

    #[test]
    fn a_hung_request_times_out_with_a_copy_of_its_input() {
        let timeout = RequestTimeout {
            fixed: Duration::from_millis(50),
            per_mib: Duration::ZERO,
        };
        let stuck = Arc::new(AtomicUsize::new(0));
        // No tokio runtime, no timer: the watchdog is the crate's own.
        let f = futures::executor::block_on(run(&stuck, vec![7u8; 100], Some(timeout), |b| {
            b.fill(0); // the "kernel" has started writing...
            std::thread::sleep(Duration::from_millis(400)); // ...and hangs
            Ok(())
        }))
        .unwrap_err();
        assert!(matches!(f.error, Error::Timeout(_)), "{f:?}");
        assert_eq!(f.buf, vec![7u8; 100]);
        assert_eq!(
            stuck.load(Ordering::Acquire),
            1,
            "the hung request is counted"
        );
        // With MAX_STUCK requests hung, the next fails at once, untouched.
        stuck.store(MAX_STUCK, Ordering::Release);
        let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let job_ran = ran.clone();
        let f = futures::executor::block_on(run(&stuck, vec![3u8; 5], Some(timeout), move |_| {
            job_ran.store(true, Ordering::Release);
            Ok(())
        }))
        .unwrap_err();
        assert!(matches!(f.error, Error::Timeout(_)) && f.buf == vec![3u8; 5]);
        assert!(!ran.load(Ordering::Acquire), "refused before it ran");
        stuck.store(1, Ordering::Release);
        // When the hung request returns, it is no longer counted.
        let waited = std::time::Instant::now();
        while stuck.load(Ordering::Acquire) != 0 && waited.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(stuck.load(Ordering::Acquire), 0);
        // A request that finishes in time is not disturbed by its deadline
        // (a generous one: a loaded TCG guest can take 50 ms to start a
        // thread, which is what failed CI once).
        let roomy = RequestTimeout {
            fixed: Duration::from_secs(30),
            per_mib: Duration::ZERO,
        };
        let (buf, ()) = rt()
            .block_on(run(&stuck, vec![1u8; 10], Some(roomy), |b| {
                b[0] = 2;
                Ok(())
            }))
            .unwrap();
        assert_eq!(buf[0], 2);
        // Saturating: "no limit" does not overflow.
        let forever = RequestTimeout {
            fixed: Duration::MAX,
            per_mib: Duration::MAX,
        };
        assert_eq!(forever.for_len(usize::MAX), Duration::MAX);
    }

    #[test]
    fn a_panicking_job_hands_the_buffer_back() {
        let f = rt()
            .block_on(run(
                &Arc::default(),
                vec![1u8; 8],
                None,
                |_| -> Result<(), Error> { panic!("boom") },
            ))
            .unwrap_err();
        assert!(matches!(f.error, Error::Worker));
        assert_eq!(f.buf, vec![1u8; 8]);
    }

    #[test]
    fn runs_without_a_tokio_runtime_and_many_at_once() {
        let (buf, n) = futures::executor::block_on(run(&Arc::default(), vec![2u8; 4], None, |b| {
            b[0] = 3;
            Ok(b.len())
        }))
        .unwrap();
        assert_eq!((buf, n), (vec![3, 2, 2, 2], 4));
        // 64 jobs that each wait for all the others: only threads of their
        // own can finish them.
        let barrier = Arc::new(std::sync::Barrier::new(64));
        let stuck = Arc::default();
        let jobs: Vec<_> = (0..64)
            .map(|i| {
                let barrier = barrier.clone();
                run(&stuck, vec![i as u8], None, move |_| {
                    barrier.wait();
                    Ok(())
                })
            })
            .collect();
        let done = futures::executor::block_on(futures::future::join_all(jobs));
        assert!(done.iter().all(Result::is_ok));
    }

    /// A buffer that records, when freed, whether it was wiped first.
    #[derive(Default, Debug)]
    struct Tracked {
        id: u32,
        bytes: Vec<u8>,
        freed: Arc<Mutex<Vec<(u32, bool)>>>,
    }

    impl Clone for Tracked {
        fn clone(&self) -> Self {
            Tracked {
                id: self.id + 1000,
                bytes: self.bytes.clone(),
                freed: self.freed.clone(),
            }
        }
    }

    impl AsRef<[u8]> for Tracked {
        fn as_ref(&self) -> &[u8] {
            &self.bytes
        }
    }

    impl Zeroize for Tracked {
        fn zeroize(&mut self) {
            self.bytes.iter_mut().for_each(|b| *b = 0);
        }
    }

    impl Drop for Tracked {
        fn drop(&mut self) {
            let wiped = self.bytes.iter().all(|&b| b == 0);
            self.freed.lock().unwrap().push((self.id, wiped));
        }
    }

    /// Whether buffer `id` was freed, and wiped if so.
    fn freed(log: &Arc<Mutex<Vec<(u32, bool)>>>, id: u32) -> Option<bool> {
        log.lock()
            .unwrap()
            .iter()
            .find(|(i, _)| *i == id)
            .map(|(_, w)| *w)
    }

    #[test]
    fn a_result_nobody_takes_is_wiped_before_it_is_freed() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let tracked = |id| Tracked {
            id,
            bytes: vec![7u8; 64],
            freed: log.clone(),
        };
        // The "kernel" writes its result, slowly.
        let job = |b: &mut Tracked| {
            std::thread::sleep(Duration::from_millis(150));
            b.bytes.fill(0xaa);
            Ok(())
        };
        // 1. The request's future is dropped while the job runs.
        {
            let stuck = Arc::default();
            let mut f = std::pin::pin!(run_with(&stuck, tracked(1), None, job));
            let waker = std::task::Waker::noop();
            let _ = f.as_mut().poll(&mut std::task::Context::from_waker(waker));
        }
        // 2. The request times out; its result arrives later.
        let timeout = RequestTimeout {
            fixed: Duration::from_millis(20),
            per_mib: Duration::ZERO,
        };
        let (error, copy) =
            futures::executor::block_on(run_with(&Arc::default(), tracked(2), Some(timeout), job))
                .unwrap_err();
        assert!(matches!(error, Error::Timeout(_)));
        assert_eq!(copy.bytes, vec![7u8; 64], "the caller gets its input back");
        drop(copy);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while (freed(&log, 1).is_none() || freed(&log, 2).is_none())
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(freed(&log, 1), Some(true), "dropped request's result");
        assert_eq!(freed(&log, 2), Some(true), "timed-out request's result");
    }
}
