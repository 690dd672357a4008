//! The `lifecycle` target: sequences of session opens, requests, concurrent
//! requests, requests dropped mid-flight, session drops and waits, on a
//! simulated engine whose costs, queues, power management and faults (I/O
//! errors, hangs until its deadline, the device vanishing) the input sets,
//! pinned or behind the selector under each policy.
//!
//! What must hold whatever the sequence:
//! * every request that completes gives the reference's bytes (a failed
//!   engine request is replayed on the CPU, so faults never show), and a
//!   CRC session's running value is the reference's;
//! * opening a session pinned to the engine fails exactly when the engine
//!   does not run the algorithm (`Unsupported`) or may be gone
//!   (`Backend`); through the selector it never fails;
//! * nothing hangs: every step finishes within an hour of (virtual) time;
//! * when every session and request is gone and the engine has had time to
//!   finish what it was given, no power reference is left and the device
//!   is powered down, with as many suspends as resumes.
//!
//! Each input runs on its own runtime on tokio's paused clock, so modelled
//! latencies, timeouts and autosuspend delays take no wall time, and
//! nothing one input leaves behind reaches the next. (The engine's
//! `SimTimer::Device` completion threads run in real time and are left out:
//! with a paused clock their deadlines would be meaningless.)

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use arbitrary::Arbitrary;
use bytes::BytesMut;
use crypto_offload::backend::Backend;
use crypto_offload::{
    AeadAlg, AeadSession, Algorithm, CipherAlg, CipherMode, CipherSession, CrcAlg, CrcSession,
    Error, Offload, Policy, Profile,
};
use crypto_offload_sim::{SimConfig, SimEngine, SimFaults, SimPower, SimTimer};

use crate::reference::{self, CrcRef};
use crate::subjects::{profile, profile_text};
use crate::{filler, first_difference, mismatch, seed};

/// The engine's name.
pub const ENGINE: &str = "sim:life";
/// Operations run per input (the rest are ignored).
pub const MAX_OPS: usize = 48;
/// Sessions open at once.
pub const MAX_SESSIONS: usize = 6;
/// The longest any one step may take, in virtual time, before it counts as
/// hung.
const HUNG: Duration = Duration::from_secs(3600);

/// The engine and the `Offload` around it.
#[derive(Arbitrary, Debug, Clone, PartialEq, Eq)]
pub struct Engine {
    /// Bits: 0 CBC, 1 CTR, 2 XTS, 3 GCM, 4 CRC (all key sizes and CRCs);
    /// 0 for everything.
    pub algs: u8,
    /// Fixed latency, µs.
    pub latency_us: u8,
    /// Bandwidth, (1 + v) × 16 MiB/s.
    pub bandwidth: u8,
    /// Queues, 1 + v % 4.
    pub queues: u8,
    /// Requests per queue, 1 + v % 8.
    pub queue_depth: u8,
    /// v % 3: no power management, a reference per session, per request.
    pub power: u8,
    /// Resume latency, µs.
    pub resume_us: u8,
    /// Autosuspend delay, ms.
    pub autosuspend_ms: u8,
    /// Requests failing with EIO, min(v, 100) %.
    pub error_pct: u8,
    /// Requests hanging until the deadline, min(v, 100) %.
    pub timeout_pct: u8,
    /// The engine's deadline, 1 + v ms.
    pub timeout_ms: u8,
    /// The device is gone after this many requests; 0 never.
    pub gone_after: u8,
    /// The fault generator's seed.
    pub seed: u8,
    /// v % 4: pinned, or the selector with Latency, Throughput or
    /// CpuSaving; bit 2: the CPU model says 20 ns a byte, so requests of
    /// 64 KiB and more go to the blocking pool, split.
    pub setup: u8,
    /// The breaker's probe interval, 10 + v ms.
    pub probe_ms: u8,
}

/// One step.
#[derive(Arbitrary, Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Opens a cipher session (`CipherAlg::ALL[alg % 9]`, a key from `key`);
    /// XTS with data units of 16 × `unit` bytes when `unit` > 0.
    OpenCipher {
        /// Which algorithm.
        alg: u8,
        /// The key's seed.
        key: u8,
        /// XTS data unit, in 16-byte blocks.
        unit: u8,
    },
    /// Opens an AEAD session.
    OpenAead {
        /// Which algorithm.
        alg: u8,
        /// The key's seed.
        key: u8,
    },
    /// Opens a CRC session.
    OpenCrc {
        /// Which algorithm.
        alg: u8,
    },
    /// One request on session `session % open`, awaited.
    Request {
        /// Which session.
        session: u8,
        /// Its length (see [`length`]).
        len: [u8; 2],
        /// The data's seed.
        seed: u8,
        /// Decrypt / open (else encrypt / seal).
        decrypt: bool,
    },
    /// A request on every open session at once, and `extra % 4` more on
    /// each cipher and AEAD session, all awaited together.
    Concurrent {
        /// Their length (see [`length`]).
        len: [u8; 2],
        /// The data's seed.
        seed: u8,
        /// More requests per session.
        extra: u8,
    },
    /// A request dropped after `after_us` µs if it has not completed.
    Cancel {
        /// Which session.
        session: u8,
        /// Its length (see [`length`]).
        len: [u8; 2],
        /// The data's seed.
        seed: u8,
        /// How long it may run, µs.
        after_us: [u8; 2],
    },
    /// Drops session `session % open`.
    Drop {
        /// Which session.
        session: u8,
    },
    /// Waits `ms` × 16 ms.
    Sleep {
        /// How long.
        ms: u8,
    },
    /// The device vanishes (or comes back).
    Gone {
        /// Gone or back.
        gone: bool,
    },
}

/// One input.
#[derive(Arbitrary, Debug, Clone, PartialEq, Eq)]
pub struct Input {
    /// The engine and the `Offload`.
    pub engine: Engine,
    /// The steps (at most [`MAX_OPS`] run).
    pub ops: Vec<Op>,
}

/// A request length from two bytes: mostly up to 4 KiB; from 0xff00 (one
/// in 256: they cost a hundred small ones), 64 KiB and up to 4 KiB more,
/// the sizes that may go to the blocking pool.
pub fn length(len: [u8; 2]) -> usize {
    match u16::from_le_bytes(len) {
        v @ 0xff00.. => crate::LARGE + usize::from(v & 0xff) * 16,
        v => usize::from(v) % 4097,
    }
}

fn pct(v: u8) -> f64 {
    f64::from(v.min(100)) / 100.0
}

impl Engine {
    fn algorithms(&self) -> Vec<Algorithm> {
        let bits = if self.algs & 0x1f == 0 {
            0x1f
        } else {
            self.algs
        };
        Algorithm::all()
            .filter(|a| {
                let bit = match a {
                    Algorithm::Cipher(c) => match c.mode() {
                        CipherMode::Cbc => 0,
                        CipherMode::Ctr => 1,
                        _ => 2,
                    },
                    Algorithm::Aead(_) => 3,
                    _ => 4,
                };
                bits >> bit & 1 == 1
            })
            .collect()
    }

    fn config(&self) -> SimConfig {
        let mut c = SimConfig::new(
            ENGINE,
            self.algorithms(),
            Duration::from_micros(self.latency_us.into()),
            (1.0 + f64::from(self.bandwidth)) * 16.0 * 1024.0 * 1024.0,
        );
        c.timer = SimTimer::Tokio;
        c.queues = 1 + usize::from(self.queues % 4);
        c.queue_depth = 1 + usize::from(self.queue_depth % 8);
        c.power = match self.power % 3 {
            0 => None,
            p => Some(SimPower {
                resume: Duration::from_micros(self.resume_us.into()),
                autosuspend: Duration::from_millis(self.autosuspend_ms.into()),
                per_request: p == 2,
            }),
        };
        c.faults = SimFaults {
            error_rate: pct(self.error_pct),
            timeout_rate: pct(self.timeout_pct),
            timeout: Duration::from_millis(1 + u64::from(self.timeout_ms)),
            gone_after: (self.gone_after > 0).then_some(self.gone_after.into()),
            seed: self.seed.into(),
        };
        c
    }

    fn pinned(&self) -> bool {
        self.setup.is_multiple_of(4)
    }

    fn offload(&self, sim: Arc<SimEngine>) -> Offload {
        // Parsed once: TOML parsing under coverage instrumentation costs
        // more than a whole input's requests.
        static PROFILES: LazyLock<[Profile; 2]> = LazyLock::new(|| {
            let engine = profile_text(ENGINE, 2000.0, 0.2);
            [
                profile(&(engine.clone() + &profile_text("cpu", 100.0, 1.0))),
                profile(&(engine + &profile_text("cpu", 100.0, 20.0))),
            ]
        });
        let b = Offload::builder()
            .backend(sim)
            .profile(PROFILES[usize::from(self.setup & 4 != 0)].clone())
            .cores(4)
            .probe_interval(Duration::from_millis(10 + u64::from(self.probe_ms)));
        let b = match self.setup % 4 {
            0 => b.pin(ENGINE),
            1 => b.policy(Policy::Latency),
            2 => b.policy(Policy::Throughput),
            _ => b.policy(Policy::CpuSaving {
                max_latency: Duration::from_micros(50),
            }),
        };
        b.build().expect("the lifecycle Offload")
    }
}

/// An open session and what the reference knows of it.
// At most `MAX_SESSIONS` live at once: boxing the larger variant would buy
// nothing.
#[allow(clippy::large_enum_variant)]
enum Live {
    Cipher {
        s: CipherSession,
        key: Vec<u8>,
        unit: Option<usize>,
    },
    Aead {
        s: AeadSession,
        key: Vec<u8>,
    },
    Crc {
        s: CrcSession,
        want: CrcRef,
        fed: u64,
        /// An update was dropped mid-flight: the session's state is
        /// undefined until it is reset (its documented contract).
        tainted: bool,
    },
}

fn key_for(len: usize, seed: u8, xts: bool) -> Vec<u8> {
    let mut key = filler(len, u64::from(seed) + 1);
    if xts {
        let (a, b) = key.split_at(len / 2);
        if a == b {
            key[0] ^= 0xff;
        }
    }
    key
}

/// The length a session of this kind takes nearest `len`.
fn fit(live: &Live, len: usize) -> usize {
    match live {
        Live::Cipher { s, unit, .. } => match s.alg().mode() {
            CipherMode::Cbc => len / 16 * 16,
            CipherMode::Xts => match unit {
                Some(u) => (len / u).max(1) * u,
                None => len.max(16),
            },
            _ => len,
        },
        _ => len,
    }
}

/// A cipher or AEAD request (`&self`: many may run at once), checked.
async fn shared_request(backend: &str, live: &Live, len: usize, seed: u8, decrypt: bool) {
    let len = fit(live, len);
    let data = filler(len, u64::from(seed));
    let iv = filler(16, u64::from(seed) ^ 0x55);
    let dir = if decrypt { "decrypt" } else { "encrypt" };
    match live {
        Live::Cipher { s, key, unit } => {
            let iv16: [u8; 16] = iv.clone().try_into().expect("16 bytes");
            let mut want = data.clone();
            reference::cipher(
                s.alg(),
                key,
                &iv16,
                unit.unwrap_or(len),
                &mut want,
                !decrypt,
            );
            let got = if decrypt {
                s.decrypt(&iv, BytesMut::from(&data[..]))
                    .await
                    .map(|b| b.to_vec())
                    .map_err(|e| e.error().to_string())
            } else {
                s.encrypt(&iv, data)
                    .await
                    .map_err(|e| e.error().to_string())
            };
            match got {
                Ok(got) if got == want => {}
                Ok(got) => mismatch(
                    backend,
                    s.alg().name(),
                    dir,
                    len,
                    format_args!("{}", first_difference(&got, &want)),
                ),
                Err(e) => mismatch(backend, s.alg().name(), dir, len, format_args!("{e}")),
            }
        }
        Live::Aead { s, key } => {
            let nonce: [u8; 12] = iv[..12].try_into().expect("12 bytes");
            let aad = &iv[..usize::from(seed % 17)];
            let mut sealed = data.clone();
            let tag = reference::gcm_seal(key, &nonce, aad, &mut sealed);
            sealed.extend_from_slice(&tag);
            let (got, want) = if decrypt {
                (s.open(nonce, aad, sealed).await, data)
            } else {
                (s.seal(nonce, aad, data).await, sealed)
            };
            let dir = if decrypt { "open" } else { "seal" };
            match got {
                Ok(got) if got == want => {}
                Ok(got) => mismatch(
                    backend,
                    s.alg().name(),
                    dir,
                    len,
                    format_args!("{}", first_difference(&got, &want)),
                ),
                Err(e) => mismatch(
                    backend,
                    s.alg().name(),
                    dir,
                    len,
                    format_args!("{}", e.error()),
                ),
            }
        }
        Live::Crc { .. } => unreachable!("CRC updates take the session mutably"),
    }
}

/// A CRC update, checked; a tainted session is reset first.
async fn crc_request(backend: &str, live: &mut Live, len: usize, seed: u8) {
    let Live::Crc {
        s,
        want,
        fed,
        tainted,
    } = live
    else {
        unreachable!("a CRC session");
    };
    if *tainted {
        s.reset();
        *want = CrcRef::new(s.alg());
        *fed = 0;
        *tainted = false;
    }
    let data = filler(len, u64::from(seed));
    *tainted = true; // until the update is known to have completed
    let back = s.update(data.clone()).await;
    *tainted = false;
    want.update(&data);
    *fed += len as u64;
    let alg = s.alg().name();
    match back {
        Ok(b) if b == data => {}
        Ok(_) => mismatch(
            backend,
            alg,
            "checksum",
            len,
            format_args!("the buffer came back changed"),
        ),
        Err(e) => mismatch(backend, alg, "checksum", len, format_args!("{}", e.error())),
    }
    if s.finalize() != want.value() || s.len() != *fed {
        mismatch(
            backend,
            alg,
            "checksum",
            len,
            format_args!(
                "running crc {:#x} (len {}) want {:#x} (len {})",
                s.finalize(),
                s.len(),
                want.value(),
                fed
            ),
        );
    }
}

async fn request(backend: &str, live: &mut Live, len: usize, seed: u8, decrypt: bool) {
    if matches!(live, Live::Crc { .. }) {
        crc_request(backend, live, len, seed).await;
    } else {
        shared_request(backend, live, len, seed, decrypt).await;
    }
}

/// Runs one input on a fresh runtime.
pub fn check(input: &Input) {
    let rt = crate::subjects::runtime_paused();
    rt.block_on(run(input));
    // Dropping the runtime cancels whatever the input left (probe tasks,
    // parked completions): the next input starts clean.
}

async fn run(input: &Input) {
    let e = &input.engine;
    let sim = Arc::new(SimEngine::new(e.config()));
    let offload = e.offload(sim.clone());
    let backend = if e.pinned() { ENGINE } else { "auto" };
    let supported = e.algorithms();
    let mut maybe_gone = e.gone_after > 0;
    let mut sessions: Vec<Live> = Vec::new();
    for (step, op) in input.ops.iter().take(MAX_OPS).enumerate() {
        let done = tokio::time::timeout(HUNG, async {
            match *op {
                Op::OpenCipher { alg, key, unit } => {
                    let alg = CipherAlg::ALL[usize::from(alg) % CipherAlg::ALL.len()];
                    let xts = alg.mode() == CipherMode::Xts;
                    let key = key_for(alg.key_len(), key, xts);
                    let unit = (xts && unit > 0).then_some(16 * usize::from(unit));
                    let opened = offload.cipher(alg, &key).await;
                    if let Some(s) = opened_ok(
                        backend,
                        alg.into(),
                        opened,
                        e.pinned(),
                        &supported,
                        maybe_gone,
                    ) {
                        let s = match unit {
                            Some(u) => s.with_data_unit(u).expect("a data unit of ≥ 16 bytes"),
                            None => s,
                        };
                        push(&mut sessions, Live::Cipher { s, key, unit });
                    }
                }
                Op::OpenAead { alg, key } => {
                    let alg = AeadAlg::ALL[usize::from(alg) % AeadAlg::ALL.len()];
                    let key = key_for(alg.key_len(), key, false);
                    let opened = offload.aead(alg, &key).await;
                    if let Some(s) = opened_ok(
                        backend,
                        alg.into(),
                        opened,
                        e.pinned(),
                        &supported,
                        maybe_gone,
                    ) {
                        push(&mut sessions, Live::Aead { s, key });
                    }
                }
                Op::OpenCrc { alg } => {
                    let alg = CrcAlg::ALL[usize::from(alg) % CrcAlg::ALL.len()];
                    let opened = offload.crc(alg).await;
                    if let Some(s) = opened_ok(
                        backend,
                        alg.into(),
                        opened,
                        e.pinned(),
                        &supported,
                        maybe_gone,
                    ) {
                        push(
                            &mut sessions,
                            Live::Crc {
                                want: CrcRef::new(alg),
                                s,
                                fed: 0,
                                tainted: false,
                            },
                        );
                    }
                }
                Op::Request {
                    session,
                    len,
                    seed,
                    decrypt,
                } => {
                    if let Some(live) = pick(&mut sessions, session) {
                        request(backend, live, length(len), seed, decrypt).await;
                    }
                }
                Op::Concurrent { len, seed, extra } => {
                    let len = length(len);
                    let mut all: Vec<Pin<Box<dyn Future<Output = ()> + '_>>> = Vec::new();
                    for (i, live) in sessions.iter_mut().enumerate() {
                        let seed = seed.wrapping_add(i as u8);
                        if matches!(live, Live::Crc { .. }) {
                            all.push(Box::pin(crc_request(backend, live, len, seed)));
                        } else {
                            let live: &Live = live;
                            for k in 0..=extra % 4 {
                                let seed = seed.wrapping_add(16 * k);
                                all.push(Box::pin(shared_request(
                                    backend,
                                    live,
                                    len,
                                    seed,
                                    k % 2 == 1,
                                )));
                            }
                        }
                    }
                    futures::future::join_all(all).await;
                }
                Op::Cancel {
                    session,
                    len,
                    seed,
                    after_us,
                } => {
                    if let Some(live) = pick(&mut sessions, session) {
                        let after = Duration::from_micros(u16::from_le_bytes(after_us).into());
                        let decrypt = seed & 1 == 1;
                        let _ = tokio::time::timeout(
                            after,
                            request(backend, live, length(len), seed, decrypt),
                        )
                        .await;
                    }
                }
                Op::Drop { session } => {
                    if !sessions.is_empty() {
                        let i = usize::from(session) % sessions.len();
                        drop(sessions.remove(i));
                    }
                }
                Op::Sleep { ms } => {
                    tokio::time::sleep(Duration::from_millis(16 * u64::from(ms))).await
                }
                Op::Gone { gone } => {
                    maybe_gone |= gone;
                    sim.set_gone(gone);
                }
            }
        })
        .await;
        if done.is_err() {
            mismatch(
                backend,
                "-",
                "-",
                0,
                format_args!("step {step} ({op:?}) hung for an hour of virtual time"),
            );
        }
    }
    drop(sessions);
    drop(offload);
    // Long enough for every queued completion and the autosuspend delay.
    tokio::time::sleep(Duration::from_secs(600)).await;
    if let Some(power) = sim.power() {
        let p = power.stats();
        if p.references != 0 || p.powered || p.resumes != p.suspends {
            mismatch(
                ENGINE,
                "-",
                "power",
                0,
                format_args!("with every session and request gone: {p:?}"),
            );
        }
    }
}

fn push(sessions: &mut Vec<Live>, live: Live) {
    if sessions.len() == MAX_SESSIONS {
        sessions.remove(0);
    }
    sessions.push(live);
}

fn pick(sessions: &mut [Live], i: u8) -> Option<&mut Live> {
    let n = sessions.len();
    (n > 0).then(|| &mut sessions[usize::from(i) % n])
}

/// Checks an open: through the selector it always succeeds; pinned, it
/// fails with `Unsupported` exactly when the engine lacks the algorithm,
/// and with `Backend` only if the device may be gone.
fn opened_ok<S>(
    backend: &str,
    alg: Algorithm,
    opened: Result<S, Error>,
    pinned: bool,
    supported: &[Algorithm],
    maybe_gone: bool,
) -> Option<S> {
    let runs = supported.contains(&alg);
    match opened {
        Ok(s) if !pinned || runs => Some(s),
        Ok(_) => mismatch(
            backend,
            alg.name(),
            "open",
            0,
            format_args!("a pinned session opened on an engine without the algorithm"),
        ),
        Err(Error::Unsupported { .. }) if pinned && !runs => None,
        Err(Error::Backend { .. }) if pinned && maybe_gone => None,
        Err(e) => mismatch(backend, alg.name(), "open", 0, format_args!("{e}")),
    }
}

/// Hand-written scenarios over the algorithms the vector files name: each
/// opens a session of one algorithm, runs requests one at a time, at once,
/// cancelled mid-flight, drops it, under a few engine settings (plain, with
/// faults, with per-request power, gone midway).
pub fn seeds(records: &[crate::vectors::Record]) -> Vec<(String, Input)> {
    let mut algs: Vec<Algorithm> = Vec::new();
    for r in records {
        if let Some(a) = Algorithm::all().find(|a| a.name().eq_ignore_ascii_case(r.alg()))
            && !algs.contains(&a)
        {
            algs.push(a);
        }
    }
    let engines = [
        (
            "plain",
            Engine {
                algs: 0,
                latency_us: 20,
                bandwidth: 30,
                queues: 1,
                queue_depth: 7,
                power: 1,
                resume_us: 100,
                autosuspend_ms: 50,
                error_pct: 0,
                timeout_pct: 0,
                timeout_ms: 5,
                gone_after: 0,
                seed: 1,
                setup: 0,
                probe_ms: 10,
            },
        ),
        (
            "faults",
            Engine {
                algs: 0,
                latency_us: 5,
                bandwidth: 200,
                queues: 3,
                queue_depth: 1,
                power: 1,
                resume_us: 50,
                autosuspend_ms: 10,
                error_pct: 20,
                timeout_pct: 10,
                timeout_ms: 3,
                gone_after: 0,
                seed: 7,
                setup: 2,
                probe_ms: 0,
            },
        ),
        (
            "per-request",
            Engine {
                algs: 0,
                latency_us: 40,
                bandwidth: 2,
                queues: 0,
                queue_depth: 0,
                power: 2,
                resume_us: 120,
                autosuspend_ms: 0,
                error_pct: 0,
                timeout_pct: 0,
                timeout_ms: 5,
                gone_after: 0,
                seed: 3,
                setup: 5,
                probe_ms: 0,
            },
        ),
        (
            "gone",
            Engine {
                algs: 0,
                latency_us: 1,
                bandwidth: 255,
                queues: 1,
                queue_depth: 3,
                power: 1,
                resume_us: 10,
                autosuspend_ms: 1,
                error_pct: 0,
                timeout_pct: 0,
                timeout_ms: 5,
                gone_after: 5,
                seed: 9,
                setup: 0,
                probe_ms: 0,
            },
        ),
    ];
    let mut out = Vec::new();
    for (k, alg) in algs.iter().enumerate() {
        let open = match *alg {
            Algorithm::Cipher(c) => Op::OpenCipher {
                alg: CipherAlg::ALL.iter().position(|&a| a == c).unwrap_or(0) as u8,
                key: k as u8,
                unit: if c.mode() == CipherMode::Xts { 32 } else { 0 },
            },
            Algorithm::Aead(a) => Op::OpenAead {
                alg: AeadAlg::ALL.iter().position(|&x| x == a).unwrap_or(0) as u8,
                key: k as u8,
            },
            Algorithm::Crc(c) => Op::OpenCrc {
                alg: CrcAlg::ALL.iter().position(|&x| x == c).unwrap_or(0) as u8,
            },
            _ => continue,
        };
        let (name, engine) = &engines[k % engines.len()];
        let ops = vec![
            open.clone(),
            Op::Request {
                session: 0,
                len: 512u16.to_le_bytes(),
                seed: 1,
                decrypt: false,
            },
            Op::Request {
                session: 0,
                len: 100u16.to_le_bytes(),
                seed: 2,
                decrypt: true,
            },
            Op::Concurrent {
                len: 4096u16.to_le_bytes(),
                seed: 3,
                extra: 3,
            },
            Op::Cancel {
                session: 0,
                len: 0xff10u16.to_le_bytes(),
                seed: 4,
                after_us: 30u16.to_le_bytes(),
            },
            Op::Request {
                session: 0,
                len: 0xff01u16.to_le_bytes(),
                seed: 5,
                decrypt: false,
            },
            open,
            Op::Drop { session: 0 },
            Op::Sleep { ms: 4 },
            Op::Request {
                session: 0,
                len: 33u16.to_le_bytes(),
                seed: 6,
                decrypt: true,
            },
        ];
        out.push((
            format!("{}-{name}", alg.name().to_lowercase().replace('/', "-")),
            Input {
                engine: engine.clone(),
                ops,
            },
        ));
    }
    out
}

/// `input` in the layout the target decodes.
pub fn encode(input: &Input) -> Vec<u8> {
    let e = &input.engine;
    let mut w = seed::Writer::default();
    for v in [
        e.algs,
        e.latency_us,
        e.bandwidth,
        e.queues,
        e.queue_depth,
        e.power,
        e.resume_us,
        e.autosuspend_ms,
        e.error_pct,
        e.timeout_pct,
        e.timeout_ms,
        e.gone_after,
        e.seed,
        e.setup,
        e.probe_ms,
    ] {
        w.u8(v);
    }
    const N: u32 = 9;
    for op in &input.ops {
        w.bool(true); // `Vec`'s "one more" flag
        match *op {
            Op::OpenCipher { alg, key, unit } => w.variant(0, N).u8(alg).u8(key).u8(unit),
            Op::OpenAead { alg, key } => w.variant(1, N).u8(alg).u8(key),
            Op::OpenCrc { alg } => w.variant(2, N).u8(alg),
            Op::Request {
                session,
                len,
                seed,
                decrypt,
            } => w
                .variant(3, N)
                .u8(session)
                .bytes(&len)
                .u8(seed)
                .bool(decrypt),
            Op::Concurrent { len, seed, extra } => w.variant(4, N).bytes(&len).u8(seed).u8(extra),
            Op::Cancel {
                session,
                len,
                seed,
                after_us,
            } => w
                .variant(5, N)
                .u8(session)
                .bytes(&len)
                .u8(seed)
                .bytes(&after_us),
            Op::Drop { session } => w.variant(6, N).u8(session),
            Op::Sleep { ms } => w.variant(7, N).u8(ms),
            Op::Gone { gone } => w.variant(8, N).bool(gone),
        };
    }
    w.0
}
