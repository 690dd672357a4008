//! Requests dropped at random points under load.
//!
//! Every request future documents that dropping it is safe at any point: an
//! engine keeps the buffer until it is done with it, nothing leaks, and the
//! session goes on. Here batches of concurrent requests on simulated engines
//! with latency, queues, power and faults are cut short — after a random
//! number of polls, by `tokio::time::timeout` or `select!` with a random
//! deadline, or by aborting the task that runs them — and after each batch:
//!
//! * every request that completed returned its buffer with the CPU's result;
//! * every buffer of a dropped request was freed once the engines were idle
//!   (watched through a shared allocation, see `common::tracked`; the
//!   crate's `Buffer` trait is sealed, so no drop-counting type can go in —
//!   double frees and invalid accesses are valgrind's part, below);
//! * a buffer an engine still holds for a dropped request holds its slot
//!   (they never outnumber `SimEngine::in_flight`), and some did: the cuts
//!   caught requests on the devices, not only before or after;
//! * no device slot leaked (`SimEngine::idle` returns) and no request is
//!   still counted in flight by the selector (`Offload::explain`);
//! * the sessions and the `Offload` still give correct results.
//!
//! The RNG is seeded (`CANCEL_SEED` overrides the seed), so a failing
//! workload replays; which backend serves a request still varies, as the
//! cost model learns from real CPU time.
//!
//! CI runs this binary under valgrind memcheck (`.ci/valgrind-cancel`): no
//! invalid reads or writes, no double free, no definite leak. That is why it
//! is its own test binary and small: about 10,700 requests, under a minute
//! under valgrind on two cores (the budget is three).

mod common;

use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use crypto_offload::{
    AeadAlg, AeadSession, Algorithm, Buffer, CipherAlg, CipherSession, CrcAlg, CrcSession, Error,
    Offload, Policy, RequestError,
};
use crypto_offload_fallback::Crc;
use crypto_offload_sim::{SimConfig, SimEngine, SimFaults, SimPower, SimTimer};

/// SplitMix64: a seeded generator small enough to read.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, p: f64) -> bool {
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
    fn micros(&mut self, max: u64) -> Duration {
        Duration::from_micros(self.below(max + 1))
    }
}

fn seed() -> u64 {
    std::env::var("CANCEL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x0ff1_0ad5)
}

fn key(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29) ^ 0x5a)
        .collect()
}

/// Requests this long or longer may run on tokio's blocking pool when the
/// CPU serves them (the crate's `BLOCKING_MIN_LEN`): a dropped one's buffer
/// is freed when the pool's job ends, which only the runtime's shutdown
/// waits for, so those buffers are checked after it.
const POOL_LEN: usize = 64 << 10;

/// The sessions a batch runs on: one of each shape, on one `Offload`.
struct Sessions {
    cbc: CipherSession,
    ctr: CipherSession,
    xts: CipherSession,
    /// XTS over 512-byte data units.
    xts_units: CipherSession,
    gcm: AeadSession,
    /// `CrcSession::update` takes `&mut self`: one request at a time per
    /// stream.
    crcs: Vec<tokio::sync::Mutex<CrcStream>>,
}

/// A CRC session and the reference CRC of what it was fed.
struct CrcStream {
    session: CrcSession,
    reference: Crc,
    /// An update was cut short: it may or may not have been applied, so
    /// the stream starts over (as `CrcSession::update` documents).
    dirty: bool,
}

const CRC_STREAMS: usize = 6;

impl Sessions {
    async fn open(offload: &Offload) -> Sessions {
        let mut crcs = Vec::new();
        for i in 0..CRC_STREAMS {
            let alg = [CrcAlg::Crc32Iscsi, CrcAlg::Crc64Nvme, CrcAlg::Crc32IsoHdlc][i % 3];
            crcs.push(tokio::sync::Mutex::new(CrcStream {
                session: offload.crc(alg).await.unwrap(),
                reference: Crc::new(alg),
                dirty: false,
            }));
        }
        Sessions {
            cbc: offload
                .cipher(CipherAlg::Aes128Cbc, &key(16))
                .await
                .unwrap(),
            ctr: offload
                .cipher(CipherAlg::Aes256Ctr, &key(32))
                .await
                .unwrap(),
            xts: offload
                .cipher(CipherAlg::Aes256Xts, &key(64))
                .await
                .unwrap(),
            xts_units: offload
                .cipher(CipherAlg::Aes128Xts, &key(32))
                .await
                .unwrap()
                .with_data_unit(512)
                .unwrap(),
            gcm: offload.aead(AeadAlg::Aes256Gcm, &key(32)).await.unwrap(),
            crcs,
        }
    }
}

/// One request: what it does.
#[derive(Debug, Clone, Copy)]
enum Op {
    Cbc(bool),
    Ctr(bool),
    Xts(bool),
    XtsUnits(bool),
    Seal,
    Open { tampered: bool },
    Crc(usize),
}

impl Op {
    fn random(rng: &mut Rng) -> Op {
        let encrypt = rng.chance(0.5);
        match rng.below(8) {
            0 => Op::Cbc(encrypt),
            1 => Op::Ctr(encrypt),
            2 => Op::Xts(encrypt),
            3 => Op::XtsUnits(encrypt),
            4 => Op::Seal,
            5 => Op::Open {
                tampered: rng.chance(0.2),
            },
            _ => Op::Crc(rng.below(CRC_STREAMS as u64) as usize),
        }
    }

    /// A length this operation takes: mostly under 16 KiB, one in 40 long
    /// enough for the CPU's blocking pool.
    fn len(self, rng: &mut Rng) -> usize {
        let n = if rng.chance(1.0 / 40.0) {
            POOL_LEN + rng.below(POOL_LEN as u64) as usize
        } else {
            rng.below(16 << 10) as usize
        };
        match self {
            Op::Cbc(_) => n / 16 * 16,
            Op::Xts(_) => n.max(16),
            Op::XtsUnits(_) => (n / 512).max(1) * 512,
            _ => n,
        }
    }
}

fn cipher<'a, B: Buffer>(
    s: &'a CipherSession,
    encrypt: bool,
    iv: &'a [u8],
    buf: B,
) -> crypto_offload::CipherRequest<'a, B> {
    if encrypt {
        s.encrypt(iv, buf)
    } else {
        s.decrypt(iv, buf)
    }
}

/// A request's input and what it must produce.
struct Job {
    op: Op,
    iv: [u8; 16],
    /// The request's input (for an open: the sealed message).
    input: Vec<u8>,
    /// What it must return: the CPU's result (for CRC updates, the data
    /// itself, handed back unchanged).
    want: Vec<u8>,
}

impl Job {
    /// A random job, its expected result computed on `cpu`'s sessions.
    async fn new(rng: &mut Rng, cpu: &Sessions, pool: &[u8]) -> Job {
        let op = Op::random(rng);
        let len = op.len(rng);
        let at = rng.below((pool.len() - len) as u64) as usize;
        let data = pool[at..at + len].to_vec();
        let mut iv = [0u8; 16];
        iv.iter_mut().for_each(|b| *b = rng.next() as u8);
        let (nonce, aad) = iv.split_at(12);
        let d = data.clone();
        let (input, want) = match op {
            Op::Cbc(e) => (data, cipher(&cpu.cbc, e, &iv, d).await.unwrap()),
            Op::Ctr(e) => (data, cipher(&cpu.ctr, e, &iv, d).await.unwrap()),
            Op::Xts(e) => (data, cipher(&cpu.xts, e, &iv, d).await.unwrap()),
            Op::XtsUnits(e) => (data, cipher(&cpu.xts_units, e, &iv, d).await.unwrap()),
            Op::Seal => (data, cpu.gcm.seal(nonce, aad, d).await.unwrap()),
            Op::Open { tampered } => {
                let mut sealed = cpu.gcm.seal(nonce, aad, d).await.unwrap();
                if tampered {
                    let i = rng.below(sealed.len() as u64) as usize;
                    sealed[i] ^= 1 << rng.below(8);
                }
                (sealed, data)
            }
            Op::Crc(_) => (data, d),
        };
        Job {
            op,
            iv,
            input,
            want,
        }
    }

    /// Runs the job on `s` with the buffer `buf` (the input, as `B`):
    /// `Err` says what came back wrong.
    async fn run<B: Buffer + AsRef<[u8]>>(self, s: Arc<Sessions>, buf: B) -> Result<(), String> {
        let Job { op, iv, want, .. } = self;
        let (nonce, aad) = iv.split_at(12);
        let done: Result<B, RequestError<B>> = match op {
            Op::Cbc(e) => cipher(&s.cbc, e, &iv, buf).await,
            Op::Ctr(e) => cipher(&s.ctr, e, &iv, buf).await,
            Op::Xts(e) => cipher(&s.xts, e, &iv, buf).await,
            Op::XtsUnits(e) => cipher(&s.xts_units, e, &iv, buf).await,
            Op::Seal => s.gcm.seal(nonce, aad, buf).await,
            Op::Open { tampered: false } => s.gcm.open(nonce, aad, buf).await,
            Op::Open { tampered: true } => {
                // The ciphertext comes back, the tag taken off, all zeros.
                let len = buf.as_ref().len() - 16;
                return match s.gcm.open(nonce, aad, buf).await {
                    Err(e) if matches!(e.error(), Error::Authentication) => {
                        let back = e.into_buffer();
                        let back = back.as_ref();
                        if back.len() == len && back.iter().all(|&b| b == 0) {
                            Ok(())
                        } else {
                            Err(format!(
                                "{op:?}: the buffer came back not wiped: {} of {len} bytes, {} not zero",
                                back.len(),
                                back.iter().filter(|&&b| b != 0).count()
                            ))
                        }
                    }
                    other => Err(format!("{op:?}: {:?}", other.map(|_| "plaintext"))),
                };
            }
            Op::Crc(i) => {
                let mut stream = s.crcs[i].lock().await;
                let stream = &mut *stream;
                if stream.dirty {
                    stream.session.reset();
                    stream.reference.reset();
                }
                stream.dirty = true;
                let back = stream.session.update(buf).await;
                let back = back.map_err(|e| format!("{op:?}: {}", e.error()))?;
                if back.as_ref() != want.as_slice() {
                    return Err(format!("{op:?}: the buffer came back changed"));
                }
                stream.reference.update(&want);
                stream.dirty = false;
                let (got, expected) = (stream.session.finalize(), stream.reference.finalize());
                return if got == expected {
                    Ok(())
                } else {
                    Err(format!("{op:?}: crc {got:x}, expected {expected:x}"))
                };
            }
        };
        match done {
            Ok(out) if out.as_ref() == want.as_slice() => Ok(()),
            Ok(_) => Err(format!("{op:?}: wrong result")),
            Err(e) => Err(format!("{op:?}: {}", e.error())),
        }
    }
}

/// How a request is abandoned.
#[derive(Debug, Clone, Copy)]
enum Cut {
    /// Awaited to the end.
    Never,
    /// Dropped after this many polls if still pending (0: never polled).
    Polls(u32),
    /// `tokio::time::timeout` with this deadline.
    Timeout(Duration),
    /// `select!` against a sleep of this long.
    Select(Duration),
    /// The task running it is aborted after this long.
    Abort(Duration),
}

impl Cut {
    /// A random cut, with deadlines up to `max_us` (a little beyond the
    /// engines' latency, so requests are caught at every stage: waiting for
    /// a slot, on the device, or about to complete).
    fn random(rng: &mut Rng, max_us: u64) -> Cut {
        match rng.below(10) {
            0 | 1 => Cut::Never,
            2 | 3 => Cut::Polls(rng.below(5) as u32),
            4 | 5 => Cut::Timeout(rng.micros(max_us)),
            6 | 7 => Cut::Select(rng.micros(max_us)),
            _ => Cut::Abort(rng.micros(max_us)),
        }
    }

    /// Runs `fut` under this cut: `None` if it was dropped unfinished.
    async fn apply<F>(self, fut: F) -> Option<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match self {
            Cut::Never => Some(fut.await),
            Cut::Polls(n) => {
                AfterPolls {
                    fut: Some(Box::pin(fut)),
                    left: n,
                }
                .await
            }
            Cut::Timeout(d) => tokio::time::timeout(d, fut).await.ok(),
            Cut::Select(d) => tokio::select! {
                out = fut => Some(out),
                () = tokio::time::sleep(d) => None,
            },
            Cut::Abort(d) => {
                let task = tokio::spawn(fut);
                tokio::time::sleep(d).await;
                task.abort();
                match task.await {
                    Ok(out) => Some(out),
                    Err(e) if e.is_cancelled() => None,
                    Err(e) => std::panic::resume_unwind(e.into_panic()),
                }
            }
        }
    }
}

/// Polls `fut` at most `left` times, then drops it.
struct AfterPolls<F> {
    fut: Option<Pin<Box<F>>>,
    left: u32,
}

impl<F: Future> Future for AfterPolls<F> {
    type Output = Option<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let Some(fut) = this.fut.as_mut().filter(|_| this.left > 0) else {
            this.fut = None;
            return Poll::Ready(None);
        };
        this.left -= 1;
        match fut.as_mut().poll(cx) {
            Poll::Ready(out) => Poll::Ready(Some(out)),
            Poll::Pending if this.left == 0 => {
                this.fut = None;
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

/// What a batch left behind.
#[derive(Default)]
struct Tally {
    completed: usize,
    cut: usize,
    wrong: Vec<String>,
    /// The kept halves of the tracked buffers of cut requests.
    dropped: Vec<(usize, Bytes)>,
}

/// A job under its cut: `None` if it was cut short, and the job's index.
type Run = Pin<Box<dyn Future<Output = (Option<Result<(), String>>, usize)> + Send>>;

/// Runs `jobs` concurrently, each under its cut on its sessions, with a
/// tracked `BytesMut` for three buffers in four and a `Vec<u8>` for the
/// rest.
async fn batch(rng: &mut Rng, jobs: Vec<(Job, Cut, Arc<Sessions>)>) -> Tally {
    let mut runs: Vec<Run> = Vec::new();
    let mut kept = Vec::new();
    for (i, (job, cut, s)) in jobs.into_iter().enumerate() {
        let len = job.input.len();
        if rng.chance(0.75) {
            let (buf, k) = common::tracked(&job.input);
            kept.push((i, len, k));
            runs.push(Box::pin(
                async move { (cut.apply(job.run(s, buf)).await, i) },
            ));
        } else {
            let buf = job.input.clone();
            runs.push(Box::pin(
                async move { (cut.apply(job.run(s, buf)).await, i) },
            ));
        }
    }
    let mut tally = Tally::default();
    let mut cut = vec![false; runs.len()];
    for (out, i) in futures::future::join_all(runs).await {
        match out {
            Some(Ok(())) => tally.completed += 1,
            Some(Err(e)) => {
                tally.completed += 1;
                tally.wrong.push(e);
            }
            None => {
                tally.cut += 1;
                cut[i] = true;
            }
        }
    }
    tally.dropped = kept
        .into_iter()
        .filter(|(i, ..)| cut[*i])
        .map(|(_, len, k)| (len, k))
        .collect();
    tally
}

/// A simulated engine running every algorithm.
fn engine(name: &str, timer: SimTimer, latency_ms: u64, queues: usize, depth: usize) -> SimConfig {
    let mut c = SimConfig::new(
        name,
        Algorithm::all().collect(),
        Duration::from_millis(latency_ms),
        2e9,
    );
    c.timer = timer;
    c.queues = queues;
    c.queue_depth = depth;
    c
}

/// The engines and `Offload`s under test: one engine pinned (everything
/// goes to it, waiting for its 16 slots), and Auto over the CPU and two
/// engines; faults and power on both sides.
struct Rig {
    engines: Vec<Arc<SimEngine>>,
    pinned: Offload,
    auto: Offload,
}

fn rig(timer: SimTimer) -> Rig {
    let faults = |error_rate, timeout_rate, seed| SimFaults {
        error_rate,
        timeout_rate,
        timeout: Duration::from_millis(4),
        gone_after: None,
        seed,
    };
    let power = Some(SimPower {
        resume: Duration::from_millis(1),
        autosuspend: Duration::from_millis(5),
        per_request: false,
    });
    let mut p = engine("sim:pinned", timer, 2, 2, 8);
    p.faults = faults(0.03, 0.02, 1);
    p.power = power;
    let mut a = engine("sim:a", timer, 1, 4, 4);
    a.faults = faults(0.02, 0.0, 2);
    let mut b = engine("sim:b", timer, 3, 1, 16);
    b.faults = faults(0.0, 0.02, 3);
    b.power = power;
    let engines: Vec<Arc<SimEngine>> = [p, a, b]
        .into_iter()
        .map(|c| Arc::new(SimEngine::new(c)))
        .collect();
    let pinned = Offload::builder()
        .backend(engines[0].clone())
        .pin("sim:pinned")
        .probe_interval(Duration::from_millis(5))
        .build()
        .unwrap();
    let auto = Offload::builder()
        .backend(engines[1].clone())
        .backend(engines[2].clone())
        .policy(Policy::Latency)
        // The engines at 1 ms, the CPU at 100 ms (corrected to 5 ms at
        // most): Auto sends the engines requests until their queues make
        // the CPU the better choice.
        .profile(common::profile(&[&engines[1], &engines[2]], 1e6, 1e8))
        .probe_interval(Duration::from_millis(5))
        .build()
        .unwrap();
    Rig {
        engines,
        pinned,
        auto,
    }
}

/// What one torture run did, for the assertions' messages.
#[derive(Debug, Default)]
struct Totals {
    completed: usize,
    cut: usize,
    /// Buffers of dropped requests an engine still held after the batch.
    parked: usize,
    tracked_freed: usize,
}

/// `rounds` batches of `size` requests with cuts up to `max_us`, on `rt`,
/// then one batch with no cuts; the checks of the module's doc after each.
fn torture(rt: tokio::runtime::Runtime, timer: SimTimer, rounds: usize, size: usize, max_us: u64) {
    let mut rng = Rng(seed());
    let mut pool = vec![0u8; 3 * POOL_LEN];
    pool.iter_mut().for_each(|b| *b = rng.next() as u8);
    let (late, mut totals) = rt.block_on(async {
        let rig = rig(timer);
        let cpu = Sessions::open(&Offload::builder().build().unwrap()).await;
        let pinned = Arc::new(Sessions::open(&rig.pinned).await);
        let auto = Arc::new(Sessions::open(&rig.auto).await);
        let mut totals = Totals::default();
        let mut late = Vec::new();
        for round in 0..=rounds {
            let last = round == rounds;
            // Fresh sessions on Auto too, whose first request on an engine
            // opens its context there (and may wait for a resume): cut
            // while opening.
            let fresh = Arc::new(Sessions::open(&rig.auto).await);
            let mut jobs = Vec::new();
            for _ in 0..size {
                let job = Job::new(&mut rng, &cpu, &pool).await;
                let cut = if last {
                    Cut::Never
                } else {
                    Cut::random(&mut rng, max_us)
                };
                let on = [&pinned, &auto, &fresh][rng.below(3) as usize].clone();
                jobs.push((job, cut, on));
            }
            let tally = batch(&mut rng, jobs).await;
            assert!(
                tally.wrong.is_empty(),
                "round {round} (seed {}): {} wrong results: {:?}",
                seed(),
                tally.wrong.len(),
                &tally.wrong[..tally.wrong.len().min(5)]
            );
            if last {
                assert_eq!(tally.completed, size, "the final batch is uncut");
            }
            totals.completed += tally.completed;
            totals.cut += tally.cut;
            // Buffers of dropped requests the engines still hold: each
            // holds its slot until the buffer is freed (slots counted
            // first, so a completion in between only lowers the count).
            let held: usize = rig.engines.iter().map(|e| e.in_flight()).sum();
            let parked = tally
                .dropped
                .iter()
                .filter(|(len, kept)| *len < POOL_LEN && !kept.is_unique())
                .count();
            assert!(
                parked <= held,
                "round {round}: {parked} buffers held past their slots ({held})"
            );
            totals.parked += parked;
            for sim in &rig.engines {
                tokio::time::timeout(Duration::from_secs(60), sim.idle())
                    .await
                    .unwrap_or_else(|_| panic!("{}: a device slot leaked", sim.config().name));
            }
            for offload in [&rig.pinned, &rig.auto] {
                let e =
                    offload.explain(CipherAlg::Aes128Cbc, crypto_offload::Direction::Encrypt, 1);
                assert!(
                    e.candidates.iter().all(|c| c.in_flight == 0),
                    "round {round}: requests still counted in flight: {e}"
                );
            }
            for (len, kept) in tally.dropped {
                if len < POOL_LEN {
                    assert!(
                        kept.is_unique(),
                        "round {round}: a {len}-byte buffer of a dropped request was never freed"
                    );
                    totals.tracked_freed += 1;
                } else {
                    late.push(kept);
                }
            }
        }
        // Every engine served, and failures were replayed on the CPU.
        for offload in [&rig.pinned, &rig.auto] {
            let b = offload.backends();
            let failures: u64 = b[1..].iter().map(|x| x.stats.failures).sum();
            assert_eq!(b[0].stats.replayed, failures, "{b:#?}");
            assert!(b[1..].iter().all(|x| x.stats.requests > 0), "{b:#?}");
        }
        (late, totals)
    });
    // The runtime's shutdown waits for the blocking pool's jobs.
    drop(rt);
    for kept in &late {
        assert!(kept.is_unique(), "a pool-sized buffer was never freed");
    }
    totals.tracked_freed += late.len();
    eprintln!("{totals:?}");
    // The cuts caught requests on the devices, not only before or after
    // (on the paused clock, where that does not depend on how fast this
    // machine runs: under valgrind, real-time devices finish before the
    // batch does).
    if timer == SimTimer::Tokio {
        assert!(totals.parked > 0, "{totals:?}");
    }
}

#[test]
fn requests_dropped_at_random_points_on_the_paused_clock() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    torture(rt, SimTimer::Tokio, 120, 64, 6_000);
}

#[test]
fn requests_dropped_at_random_points_on_two_workers_and_device_threads() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    torture(rt, SimTimer::Device, 60, 48, 6_000);
}
