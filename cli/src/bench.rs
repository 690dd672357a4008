//! `offload bench`: every backend and Auto, size by size, in one run.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use cpu_time::ProcessTime;
use crypto_offload::{
    AeadSession, Algorithm, CipherMode, CipherSession, CrcSession, Direction, Implementation,
    Offload,
};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use crate::Backends;
use crate::key::key;
use crate::setup::{self, Error};

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub backends: Backends,
    /// Algorithms, comma-separated [default: aes-256-xts, aes-128-gcm,
    /// crc-32/iscsi, and the main algorithm of each --sim engine].
    #[arg(long = "alg", value_delimiter = ',')]
    pub algs: Vec<String>,
    /// Request sizes, comma-separated, with optional k/m suffixes
    /// [default: 16,64,256,1k,4k,16k,64k,256k,1m,4m].
    #[arg(long, value_delimiter = ',')]
    pub sizes: Vec<String>,
    /// Measuring time per (backend, size) point, in milliseconds, spent in
    /// 1 ms rounds that take turns across the backends (each round runs at
    /// least one request).
    #[arg(long, default_value_t = 100)]
    pub time_ms: u64,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
    /// Print the results as JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Plot throughput against size (with break-evens marked) to FILE.svg or FILE.png.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// Fail (exit non-zero) unless the model finds a break-even for every
    /// algorithm an engine here runs: the check of a machine whose engines
    /// are meant to win somewhere (the weak-CPU guest).
    #[arg(long)]
    pub expect_break_even: bool,
    /// Measure, in Auto's place, a second session pinned to this backend:
    /// its "auto/oracle" against its own pinned row is the noise of the
    /// measurement itself (1.0 if the rounds were exact), on the machine
    /// and at the sizes of the run.
    #[arg(long, value_name = "BACKEND")]
    pub control: Option<String>,
    /// Also measure the CPU forced onto each of its implementations of the
    /// algorithm (`cpu/ring`, `cpu/aws-lc`, `cpu/rustcrypto`, `cpu/crc32c`,
    /// …, where it has more than one) beside `cpu` as chosen on this machine: every
    /// candidate side by side, and the oracle the fastest of them.
    #[arg(long)]
    pub cpu_candidates: bool,
}

/// The CPU implementations `alg` can be forced onto, when it has a choice.
fn cpu_candidates(alg: Algorithm) -> Vec<Implementation> {
    use crypto_offload::cpu_choice::Mode;
    let all: Vec<Implementation> = match alg {
        Algorithm::Aead(_) => Mode::Gcm.candidates().to_vec(),
        Algorithm::Cipher(c) => match c.mode() {
            CipherMode::Cbc => Mode::Cbc.candidates().to_vec(),
            CipherMode::Ctr => Mode::Ctr.candidates().to_vec(),
            // AWS-LC's XTS is XTS-AES-256 only.
            CipherMode::Xts if c.key_len() == 64 => Mode::Xts.candidates().to_vec(),
            _ => Vec::new(),
        },
        Algorithm::Crc(c) => Mode::of_crc(c).map_or_else(Vec::new, |m| m.candidates().to_vec()),
        _ => Vec::new(),
    };
    if all.len() > 1 { all } else { Vec::new() }
}

/// Whether a row is the CPU's: `cpu` as chosen, or a forced candidate.
fn is_cpu(name: &str, cpu_name: &str) -> bool {
    name == cpu_name
        || name
            .strip_prefix(cpu_name)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// How long one measuring round of a target lasts (at least one request).
/// Rounds are interleaved across targets; a target's throughput is its best
/// round, and Auto/oracle the median of the per-round paired ratios: many
/// short rounds, so every target samples the same states of a shared,
/// throttled host. (With ten 10 ms rounds, two targets running the
/// very same code differed by up to 18% at one size; with 1 ms rounds the
/// spread is a few per cent.)
const ROUND: Duration = Duration::from_millis(1);

/// Untimed requests before each round (at most a tenth of it).
const WARM_UP: Duration = Duration::from_micros(100);

/// One measured point.
#[derive(Debug, Clone, Serialize)]
pub struct Point {
    pub size: usize,
    pub requests: u64,
    /// Bytes per second.
    pub throughput: f64,
    /// Mean seconds per request (per stream).
    pub latency: f64,
    /// Process CPU nanoseconds per byte.
    pub cpu_ns_per_byte: f64,
}

/// A backend's (or Auto's) row of points.
#[derive(Debug, Clone, Serialize)]
pub struct Series {
    pub backend: String,
    pub points: Vec<Option<Point>>,
}

/// Everything measured for one algorithm.
#[derive(Debug, Clone, Serialize)]
pub struct AlgBench {
    pub alg: String,
    pub policy: String,
    pub concurrency: usize,
    pub sizes: Vec<usize>,
    pub backends: Vec<Series>,
    pub auto: Series,
    /// What Auto chose per size (at rest, from `explain`).
    pub auto_choice: Vec<String>,
    /// Per size, how many requests Auto sent to each backend while it was
    /// measured (warm-ups included), in the order of `backends`.
    pub auto_mix: Vec<Vec<u64>>,
    /// Per size, right after it was measured: Auto's predicted latency (in
    /// seconds, online corrections included) of each backend in the order
    /// of `backends` (`None`: excluded) — what the model had learned when
    /// it made the size's last choices.
    pub auto_model: Vec<Vec<Option<f64>>>,
    /// Per size, Auto's paired ratio against each backend, in the order of
    /// `backends` (the oracle's is `auto_over_oracle`).
    pub auto_over_each: Vec<Vec<Option<f64>>>,
    /// The best single backend per size, and its throughput: the backend
    /// that Auto's paired ratio is lowest against.
    pub oracle: Vec<Option<(String, f64)>>,
    /// Auto's throughput over the oracle's, per size.
    pub auto_over_oracle: Vec<Option<f64>>,
    /// How many paired rounds each ratio is the median of (0: no round
    /// ran both, the ratio is of their best rounds).
    pub auto_over_oracle_rounds: Vec<usize>,
    /// Smallest size at which Auto leaves the CPU, from its model after
    /// the bench (the online corrections it learned included).
    pub break_even: Option<usize>,
    /// The same from the calibrated model alone (the profile, nothing
    /// learned), asked while every engine was powered: what `offload
    /// explain` on the profile predicts.
    pub calibrated_break_even: Option<usize>,
    /// Where the measured crossover lies: `(cpu, engine)`, the largest
    /// size the CPU won and the next measured size, from which an engine
    /// won every larger size (`cpu` 0 when an engine won them all); `None`
    /// when the CPU won the largest size.
    pub measured_crossover: Option<(usize, usize)>,
}

/// The measured crossover of `backends` over `sizes` (see
/// [`AlgBench::measured_crossover`]): by each size's best throughput, the
/// CPU's (`cpu_name`) against the best engine's.
pub fn measured_crossover(
    sizes: &[usize],
    backends: &[Series],
    cpu_name: &str,
) -> Option<(usize, usize)> {
    let best = |i: usize, cpu: bool| {
        backends
            .iter()
            .filter(|s| is_cpu(&s.backend, cpu_name) == cpu)
            .filter_map(|s| s.points.get(i)?.as_ref().map(|p| p.throughput))
            .reduce(f64::max)
    };
    let engine_wins = |i: usize| match (best(i, false), best(i, true)) {
        (Some(e), Some(c)) => Some(e > c),
        _ => None,
    };
    // From the largest measured size down, while the engine keeps winning.
    let measured: Vec<usize> = (0..sizes.len())
        .filter(|&i| engine_wins(i).is_some())
        .collect();
    let mut first = None;
    for &i in measured.iter().rev() {
        if engine_wins(i) == Some(true) {
            first = Some(i);
        } else {
            break;
        }
    }
    let first = first?;
    let below = measured
        .iter()
        .rev()
        .find(|&&i| i < first)
        .map(|&i| sizes[i]);
    Some((below.unwrap_or(0), sizes[first]))
}

/// Whether the predicted break-even `predicted` lies within 2x of a
/// crossover in `(cpu, engine]`: some size in that interval is within a
/// factor two of it.
pub fn within_twice(predicted: usize, (cpu, engine): (usize, usize)) -> bool {
    let p = predicted as f64;
    // The interval (cpu, engine] meets [p/2, 2p].
    (engine as f64) >= p / 2.0 && (cpu as f64) < 2.0 * p
}

/// A size argument for clap: bytes, or with a `k` / `m` suffix.
pub fn parse_size_arg(s: &str) -> Result<usize, String> {
    parse_size(s).map_err(|e| format!("{s:?}: {e} (a size is bytes, or with a k or m suffix)"))
}

fn parse_size(s: &str) -> Result<usize, Error> {
    let s = s.trim().to_ascii_lowercase();
    let (num, mul) = match s.strip_suffix('k') {
        Some(n) => (n, 1 << 10),
        None => match s.strip_suffix('m') {
            Some(n) => (n, 1 << 20),
            None => (s.as_str(), 1),
        },
    };
    Ok(num.parse::<usize>()? * mul)
}

pub fn human(size: usize) -> String {
    match size {
        s if s >= 1 << 20 && s.is_multiple_of(1 << 20) => format!("{} MiB", s >> 20),
        s if s >= 1 << 10 && s.is_multiple_of(1 << 10) => format!("{} KiB", s >> 10),
        s => format!("{s} B"),
    }
}

/// Whether `alg` takes a `size`-byte request.
fn fits(alg: Algorithm, size: usize) -> bool {
    match alg {
        Algorithm::Cipher(c) => match c.mode() {
            CipherMode::Cbc => size.is_multiple_of(16),
            CipherMode::Xts => size >= 16,
            _ => true,
        },
        _ => true,
    }
}

enum Session {
    Cipher(Arc<CipherSession>),
    Aead(Arc<AeadSession>),
    Crc(Box<CrcSession>),
}

async fn session(offload: &Offload, alg: Algorithm) -> Result<Session, Error> {
    Ok(match alg {
        Algorithm::Cipher(c) => {
            Session::Cipher(Arc::new(offload.cipher(c, &key(c.key_len())).await?))
        }
        Algorithm::Aead(a) => Session::Aead(Arc::new(offload.aead(a, &key(a.key_len())).await?)),
        Algorithm::Crc(c) => Session::Crc(Box::new(offload.crc(c).await?)),
        _ => return Err("unsupported algorithm".into()),
    })
}

impl Session {
    /// A second handle for another task (CRC streams are per task).
    async fn fork(&self, offload: &Offload, alg: Algorithm) -> Result<Session, Error> {
        Ok(match self {
            Session::Cipher(s) => Session::Cipher(s.clone()),
            Session::Aead(s) => Session::Aead(s.clone()),
            Session::Crc(_) => session(offload, alg).await?,
        })
    }

    async fn once(&mut self, buf: Vec<u8>, i: u64) -> Result<Vec<u8>, Error> {
        Ok(match self {
            Session::Cipher(s) => s.encrypt(u128::from(i).to_le_bytes(), buf).await?,
            Session::Aead(s) => {
                let mut nonce = [0u8; 12];
                nonce[..8].copy_from_slice(&i.to_le_bytes());
                s.seal_detached(nonce, b"", buf).await?.0
            }
            Session::Crc(s) => s.update(buf).await?,
        })
    }
}

/// Runs `concurrency` streams of `size`-byte requests for `time` (and at
/// least one request each), on sessions opened for it.
pub async fn measure(
    offload: &Offload,
    alg: Algorithm,
    size: usize,
    time: Duration,
    concurrency: usize,
) -> Result<Point, Error> {
    let mut streams = open_streams(offload, alg, concurrency).await?;
    measure_on(&mut streams, size, time).await
}

/// `concurrency` sessions of `alg` (at least one), one per stream; each
/// target keeps its own across a size's rounds, as a server keeps its
/// sessions: opening one (on a device, a control-queue round trip; the
/// first request on an engine opens its context) and closing it (the
/// device's destroy runs on the runtime afterwards) is not what a round
/// measures, and would land in whichever target's round came next.
async fn open_streams(
    offload: &Offload,
    alg: Algorithm,
    concurrency: usize,
) -> Result<Vec<Session>, Error> {
    let first = session(offload, alg).await?;
    let mut streams = Vec::new();
    for _ in 1..concurrency.max(1) {
        streams.push(first.fork(offload, alg).await?);
    }
    streams.insert(0, first);
    Ok(streams)
}

/// One round: the `streams` run `size`-byte requests for `time` (and at
/// least one request each) after a short untimed warm-up.
async fn measure_on(
    streams: &mut Vec<Session>,
    size: usize,
    time: Duration,
) -> Result<Point, Error> {
    let concurrency = streams.len();
    // Warm up: the first round opens the engine context (and resumes the
    // device); every round keeps the core busy for a moment first, so that
    // a target measured right after an idle one (an engine's long waits)
    // does not start on a core coming out of idle.
    let warm = streams.first_mut().ok_or("no streams")?;
    let mut buf = warm.once(vec![0u8; size], u64::MAX).await?;
    let busy = Instant::now() + WARM_UP.min(time / 10);
    while Instant::now() < busy {
        buf = warm.once(buf, u64::MAX).await?;
    }
    drop(buf);
    let cpu = ProcessTime::now();
    let start = Instant::now();
    let deadline = start + time;
    let mut tasks = Vec::new();
    for (n, mut s) in streams.drain(..).enumerate() {
        tasks.push(tokio::spawn(async move {
            let mut buf = vec![n as u8; size];
            let mut count = 0u64;
            while count < 1 || Instant::now() < deadline {
                buf = s.once(buf, count).await?;
                count += 1;
            }
            Ok::<(u64, Session), Error>((count, s))
        }));
    }
    let mut requests = 0;
    for t in tasks {
        let (count, s) = t.await??;
        requests += count;
        streams.push(s);
    }
    let elapsed = start.elapsed().as_secs_f64();
    let cpu = cpu.elapsed().as_nanos() as f64;
    let bytes = requests as f64 * size as f64;
    Ok(Point {
        size,
        requests,
        throughput: bytes / elapsed,
        latency: elapsed * concurrency as f64 / requests as f64,
        cpu_ns_per_byte: cpu / bytes.max(1.0),
    })
}

/// Requests each pinned target's backend has served for `auto` so far, in
/// the order of `targets` (Auto, the last, excluded).
fn served(auto: &Offload, targets: &[(String, Offload)]) -> Vec<u64> {
    let backends = auto.backends();
    targets[..targets.len() - 1]
        .iter()
        .map(|(name, _)| {
            backends
                .iter()
                .find(|b| &b.name == name)
                .map_or(0, |b| b.stats.requests)
        })
        .collect()
}

/// The median, over the rounds in which both ran, of target `a`'s
/// throughput over target `b`'s: a paired comparison, so that a slow spell
/// of the host touches both sides of each ratio. `None` with no such round.
/// With the number of rounds it is the median of.
fn paired_ratio(by_round: &[Vec<Option<f64>>], a: usize, b: usize) -> Option<(f64, usize)> {
    let ratios: Vec<f64> = by_round
        .iter()
        .filter_map(|r| match (r[a], r[b]) {
            (Some(x), Some(y)) if y > 0.0 => Some(x / y),
            _ => None,
        })
        .collect();
    let n = ratios.len();
    median(ratios).map(|m| (m, n))
}

/// Paired rounds below which an Auto/oracle ratio is flagged as noise (a
/// request that outlasts the round leaves a size few rounds).
const MIN_PAIRED_ROUNDS: usize = 5;

/// The median of `values` (the mean of the middle two for an even count);
/// `None` when empty.
pub fn median(mut values: Vec<f64>) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let m = values.len() / 2;
    Some(if values.len() % 2 == 1 {
        values[m]
    } else {
        (values[m - 1] + values[m]) / 2.0
    })
}

pub async fn run(args: BenchArgs) -> Result<(), Error> {
    let sims = setup::sims(&args.backends)?;
    let mut algs: Vec<Algorithm> = args
        .algs
        .iter()
        .map(|a| setup::algorithm(a))
        .collect::<Result<_, _>>()?;
    if algs.is_empty() {
        for name in ["aes-256-xts", "aes-128-gcm", "CRC-32/ISCSI"] {
            algs.push(setup::algorithm(name)?);
        }
        for sim in &sims {
            let main = match sim.config().name.as_str() {
                "sim:omap" => "aes-128-cbc",
                "sim:qce" => "aes-256-xts",
                "sim:mcrc64" => "CRC-64/NVME",
                _ => "aes-128-gcm",
            };
            let a = setup::algorithm(main)?;
            if !algs.contains(&a) {
                algs.push(a);
            }
        }
    }
    let sizes: Vec<usize> = if args.sizes.is_empty() {
        vec![
            16,
            64,
            256,
            1 << 10,
            4 << 10,
            16 << 10,
            64 << 10,
            256 << 10,
            1 << 20,
            4 << 20,
        ]
    } else {
        args.sizes
            .iter()
            .map(|s| parse_size(s))
            .collect::<Result<_, _>>()?
    };
    let time = Duration::from_millis(args.time_ms);

    // One calibration, shared by Auto and the pinned runs.
    let auto = setup::offload(&args.backends, &sims).await?;
    let profile = auto.profile();
    let names: Vec<String> = auto.backends().into_iter().map(|b| b.name).collect();

    let targets: usize = algs
        .iter()
        .map(|&a| {
            let backends = auto
                .backends()
                .into_iter()
                .filter(|b| b.algorithms.contains(&a))
                .count();
            let candidates = if args.cpu_candidates {
                cpu_candidates(a).len()
            } else {
                0
            };
            (backends + candidates + 1) * sizes.iter().filter(|&&s| fits(a, s)).count()
        })
        .sum();
    let bar = if args.json {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(targets as u64)
    };
    bar.set_style(
        ProgressStyle::with_template("{spinner} {bar:40} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );

    let mut results = Vec::new();
    for &alg in &algs {
        // Every target for this algorithm: each backend pinned, then Auto.
        let mut targets: Vec<(String, Offload)> = Vec::new();
        for name in &names {
            let runs = auto
                .backends()
                .into_iter()
                .any(|b| &b.name == name && b.algorithms.contains(&alg));
            if runs {
                let pinned = setup::builder(&args.backends, &sims)?
                    .profile(profile.clone())
                    .pin(name.clone())
                    .build()?;
                targets.push((name.clone(), pinned));
            }
        }
        if args.cpu_candidates {
            for imp in cpu_candidates(alg) {
                let forced = setup::builder(&args.backends, &sims)?
                    .profile(profile.clone())
                    .pin("cpu")
                    .cpu_implementation(imp)
                    .build()?;
                targets.push((format!("cpu/{}", imp.name()), forced));
            }
        }
        let last = match &args.control {
            Some(name) => setup::builder(&args.backends, &sims)?
                .profile(profile.clone())
                .pin(name.clone())
                .build()?,
            None => auto.clone(),
        };
        targets.push(("auto".to_owned(), last));
        let mut rows: Vec<Vec<Option<Point>>> = vec![Vec::new(); targets.len()];
        let mut paired: Vec<Vec<Option<(f64, usize)>>> = Vec::new();
        let mut mix: Vec<Vec<u64>> = Vec::new();
        let mut model: Vec<Vec<Option<f64>>> = Vec::new();
        // Per size, the backends that do not take it as too large (from
        // the same explanation as `model`).
        let mut too_large: Vec<Vec<String>> = Vec::new();
        // The calibrated model alone, asked once the engines are powered
        // (the targets' sessions hold them; a suspended engine's resume
        // would otherwise be in every prediction).
        let calibrated = setup::builder(&args.backends, &sims)?
            .profile(profile.clone())
            .build()?;
        let mut calibrated_break_even = None;
        for &size in &sizes {
            if !fits(alg, size) {
                rows.iter_mut().for_each(|r| r.push(None));
                paired.push(Vec::new());
                mix.push(Vec::new());
                model.push(Vec::new());
                too_large.push(Vec::new());
                continue;
            }
            // Interleaved rounds, so a drift in the machine's speed touches
            // every target alike.
            let n = targets.len();
            let mut acc: Vec<Option<Point>> = vec![None; n];
            // Every round's throughput per target, for the paired ratios.
            let mut by_round: Vec<Vec<Option<f64>>> = Vec::new();
            let mut spent = vec![Duration::ZERO; n];
            let served_before = served(&auto, &targets);
            // Each target's sessions, opened in its first round (untimed).
            let mut open: Vec<Option<Vec<Session>>> = (0..n).map(|_| None).collect();
            let round = ROUND.min(time);
            // The same order for every run of the same sizes.
            let mut order = fastrand::Rng::with_seed(size as u64);
            for _ in 0.. {
                // Each round takes the targets in a fresh random order, so
                // that no target always follows the same one (rotating the
                // start did not: target t still followed t - 1, and a
                // session pinned to a VFIO device, measured twice, read
                // 1.04–1.33x itself in the weak-CPU guest when one copy
                // always followed the other on the same device, whose
                // poller was then warm); a target whose requests are
                // longer than a round (a slow engine) gets fewer rounds.
                let mut due: Vec<usize> = (0..n).filter(|&t| spent[t] < time).collect();
                order.shuffle(&mut due);
                if due.is_empty() {
                    break;
                }
                let mut this_round = vec![None; n];
                for t in due {
                    let (name, offload) = &targets[t];
                    bar.set_message(format!("{} {name} {}", alg.name(), human(size)));
                    let started = Instant::now();
                    let streams = match &mut open[t] {
                        Some(streams) => streams,
                        empty => empty.insert(open_streams(offload, alg, args.concurrency).await?),
                    };
                    let p = measure_on(streams, size, round).await?;
                    spent[t] += started.elapsed();
                    this_round[t] = Some(p.throughput);
                    acc[t] = Some(match acc[t].take() {
                        Some(a) if a.throughput >= p.throughput => a,
                        _ => p,
                    });
                }
                by_round.push(this_round);
            }
            mix.push(
                served(&auto, &targets)
                    .iter()
                    .zip(served_before)
                    .map(|(after, before)| after - before)
                    .collect(),
            );
            if calibrated_break_even.is_none() {
                calibrated_break_even = Some(calibrated.break_even(alg, Direction::Encrypt));
            }
            let explained = auto.explain(alg, Direction::Encrypt, size).candidates;
            model.push(
                targets[..n - 1]
                    .iter()
                    .map(|(name, _)| {
                        explained
                            .iter()
                            .find(|c| &c.backend == name)
                            .and_then(|c| c.latency)
                            .map(|l| l.as_secs_f64())
                    })
                    .collect(),
            );
            too_large.push(
                explained
                    .into_iter()
                    .filter(|c| {
                        c.excluded
                            .as_deref()
                            .is_some_and(|e| e.starts_with("takes at most"))
                    })
                    .map(|c| c.backend)
                    .collect(),
            );
            // Auto (the last target) over each backend, round by round.
            paired.push(
                (0..n - 1)
                    .map(|t| paired_ratio(&by_round, n - 1, t))
                    .collect::<Vec<_>>(),
            );
            for (row, p) in rows.iter_mut().zip(acc) {
                row.push(p);
                bar.inc(1);
            }
        }
        let auto_points = rows.pop().unwrap_or_default();
        // A size an engine does not take (longer than its largest request:
        // an XTS request is one tweak, the VFIO device's is at most
        // 256 KiB) ran on the CPU behind its pinned session: not the
        // engine's figure, left out ("-").
        // (`too_large`, from each size's explanation.)
        let backends: Vec<Series> = targets
            .iter()
            .zip(rows)
            .map(|((name, _), mut points)| {
                for (p, excluded) in points.iter_mut().zip(&too_large) {
                    if excluded.contains(name) {
                        *p = None;
                    }
                }
                Series {
                    backend: name.clone(),
                    points,
                }
            })
            .collect();
        let auto_choice = sizes
            .iter()
            .map(|&size| auto.explain(alg, Direction::Encrypt, size).choice)
            .collect();
        let mut oracle = Vec::new();
        let mut ratio = Vec::new();
        let mut ratio_rounds = Vec::new();
        for (i, a) in auto_points.iter().enumerate() {
            // Auto over each backend: the median of the rounds' ratios where
            // both ran in the round, else the ratio of their best rounds.
            // The oracle is the backend Auto fares worst against. (Picking
            // it by best round instead favours the noisiest backend.)
            let against = backends.iter().enumerate().filter_map(|(t, s)| {
                let (a, b) = (a.as_ref()?, s.points[i].as_ref()?);
                let (r, n) = paired
                    .get(i)
                    .and_then(|p| p.get(t).copied().flatten())
                    .unwrap_or((a.throughput / b.throughput, 0));
                Some((t, b.throughput, r, n))
            });
            let worst = against.min_by(|x, y| x.2.total_cmp(&y.2));
            ratio.push(worst.map(|w| w.2));
            ratio_rounds.push(worst.map_or(0, |w| w.3));
            oracle.push(worst.map(|(t, b, ..)| (backends[t].backend.clone(), b)));
        }
        results.push(AlgBench {
            alg: alg.name().to_owned(),
            policy: auto.policy().to_string(),
            concurrency: args.concurrency,
            sizes: sizes.clone(),
            backends,
            auto: Series {
                backend: "auto".to_owned(),
                points: auto_points,
            },
            auto_choice,
            auto_mix: mix,
            auto_model: model,
            auto_over_each: paired
                .iter()
                .map(|p| p.iter().map(|r| r.map(|(r, _)| r)).collect())
                .collect(),
            oracle,
            auto_over_oracle: ratio,
            auto_over_oracle_rounds: ratio_rounds,
            break_even: auto.break_even(alg, Direction::Encrypt),
            calibrated_break_even: calibrated_break_even.flatten(),
            measured_crossover: None,
        });
        if let Some(r) = results.last_mut() {
            r.measured_crossover = measured_crossover(&r.sizes, &r.backends, "cpu");
        }
    }
    bar.finish_and_clear();

    if args.json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    } else {
        for r in &results {
            print_table(r);
        }
    }
    if let Some(path) = &args.plot {
        crate::plot::draw(path, &results)?;
        if !args.json {
            println!("plot written to {}", path.display());
        }
    }
    if args.expect_break_even {
        let missing: Vec<&str> = results
            .iter()
            .filter(|r| {
                r.backends.iter().any(|s| !is_cpu(&s.backend, "cpu"))
                    && r.calibrated_break_even.is_none()
            })
            .map(|r| r.alg.as_str())
            .collect();
        if !missing.is_empty() {
            return Err(format!(
                "--expect-break-even: the calibrated model finds no break-even for {} (the CPU \
                 wins every size)",
                missing.join(", ")
            )
            .into());
        }
    }
    Ok(())
}

fn print_table(r: &AlgBench) {
    let be = |b: Option<usize>| b.map_or("none (the CPU wins at every size)".to_owned(), human);
    let near = |p: Option<usize>| match (r.measured_crossover, p) {
        (Some((c, e)), Some(p)) if c > 0 => {
            if within_twice(p, (c, e)) {
                ", within 2x"
            } else {
                ", NOT within 2x"
            }
        }
        _ => "",
    };
    let measured = match r.measured_crossover {
        None => "the CPU won the largest size".to_owned(),
        Some((0, e)) => format!("an engine won every size from {}", human(e)),
        Some((c, e)) => format!("crossover in ({}, {}]", human(c), human(e)),
    };
    println!(
        "\n{} — encrypt, {} stream(s), Auto policy {}; measured: {measured}; break-even of the \
         calibrated model {}{}, of Auto's after the bench {}{}",
        r.alg,
        r.concurrency,
        r.policy,
        be(r.calibrated_break_even),
        near(r.calibrated_break_even),
        be(r.break_even),
        near(r.break_even),
    );
    print!("{:>8}", "size");
    for s in &r.backends {
        print!(" | {:>26}", format!("{} GB/s µs ns/B", s.backend));
    }
    println!(
        " | {:>22} | {:>12} | {:>6}",
        "auto GB/s (choice)", "oracle", "auto/oracle"
    );
    for (i, &size) in r.sizes.iter().enumerate() {
        print!("{:>8}", human(size));
        for s in &r.backends {
            match &s.points[i] {
                Some(p) => print!(
                    " | {:>8.3} {:>9.1} {:>7.3}",
                    p.throughput / 1e9,
                    p.latency * 1e6,
                    p.cpu_ns_per_byte
                ),
                None => print!(" | {:>26}", "-"),
            }
        }
        match (&r.auto.points[i], &r.oracle[i], r.auto_over_oracle[i]) {
            (Some(a), Some((name, _)), Some(ratio)) => println!(
                " | {:>8.3} ({:>11}) | {:>12} | {:>6.3}{}",
                a.throughput / 1e9,
                r.auto_choice[i],
                name,
                ratio,
                if r.auto_over_oracle_rounds[i] < MIN_PAIRED_ROUNDS {
                    "*"
                } else {
                    ""
                }
            ),
            _ => println!(" | {:>22} | {:>12} | {:>6}", "-", "-", "-"),
        }
    }
    let well_measured = |i: &usize| r.auto_over_oracle_rounds[*i] >= MIN_PAIRED_ROUNDS;
    let flagged = (0..r.sizes.len())
        .filter(|i| r.auto_over_oracle[*i].is_some() && !well_measured(i))
        .count();
    if let Some(min) = (0..r.sizes.len())
        .filter(well_measured)
        .filter_map(|i| r.auto_over_oracle[i])
        .reduce(f64::min)
    {
        println!("min auto/oracle over sizes: {min:.3}");
    }
    // Where Auto split a size's requests, how, and what its model
    // predicted once the size was measured (beside the table's measured
    // latencies): the mix is what the selector did while measured, the
    // choice column what it says at rest.
    for (i, &size) in r.sizes.iter().enumerate() {
        let mix = &r.auto_mix[i];
        let total: u64 = mix.iter().sum();
        if r.auto_over_each.get(i).is_none_or(|e| e.is_empty()) {
            continue;
        }
        let shares: Vec<String> = r
            .backends
            .iter()
            .zip(mix)
            .filter(|(_, n)| **n > 0)
            .map(|(s, &n)| format!("{} {:.1}%", s.backend, 100.0 * n as f64 / total as f64))
            .collect();
        let shares = if shares.is_empty() {
            vec!["(not Auto's: --control)".to_owned()]
        } else {
            shares
        };
        let predicted: Vec<String> = r
            .backends
            .iter()
            .zip(r.auto_model.get(i).into_iter().flatten())
            .filter_map(|(s, l)| Some(format!("{} {:.1}", s.backend, (*l)? * 1e6)))
            .collect();
        let against: Vec<String> = r
            .backends
            .iter()
            .zip(r.auto_over_each.get(i).into_iter().flatten())
            .filter_map(|(s, x)| Some(format!("{} {:.2}", s.backend, (*x)?)))
            .collect();
        println!(
            "auto at {}: requests {}; model µs {}; auto over each {}",
            human(size),
            shares.join(", "),
            predicted.join(", "),
            against.join(", ")
        );
    }
    if flagged > 0 {
        println!(
            "* {flagged} size(s) had fewer than {MIN_PAIRED_ROUNDS} paired rounds (requests outlast \
             the {} ms rounds): noise, left out of the minimum; raise --time-ms",
            ROUND.as_millis()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(name: &str, throughputs: &[f64]) -> Series {
        Series {
            backend: name.into(),
            points: throughputs
                .iter()
                .map(|&t| {
                    (t > 0.0).then_some(Point {
                        size: 0,
                        requests: 1,
                        throughput: t,
                        latency: 1.0,
                        cpu_ns_per_byte: 0.0,
                    })
                })
                .collect(),
        }
    }

    #[test]
    fn the_measured_crossover_is_where_an_engine_wins_every_larger_size() {
        let sizes = [1024, 2048, 4096, 8192, 16384];
        let cpu = series("cpu", &[5.0, 5.0, 5.0, 5.0, 5.0]);
        // An engine that wins from 8 KiB, and one that wins once at 2 KiB
        // (noise) but not after: the crossover is (4 KiB, 8 KiB].
        let a = series("vfio:a", &[1.0, 2.0, 4.0, 6.0, 9.0]);
        let b = series("vfio:b", &[1.0, 6.0, 1.0, 1.0, 1.0]);
        let all = [cpu.clone(), a.clone(), b];
        assert_eq!(measured_crossover(&sizes, &all, "cpu"), Some((4096, 8192)));
        // A forced CPU candidate is the CPU's (here faster than the
        // chosen one at 8 KiB): not an engine, and it moves the crossover.
        let ring = series("cpu/ring", &[5.0, 5.0, 5.0, 7.0, 5.0]);
        let with = [cpu.clone(), ring, a.clone()];
        assert_eq!(
            measured_crossover(&sizes, &with, "cpu"),
            Some((8192, 16384))
        );
        assert!(is_cpu("cpu/aws-lc", "cpu") && !is_cpu("cpux", "cpu"));
        assert!(within_twice(8192, (4096, 8192)));
        assert!(within_twice(3000, (4096, 8192)));
        assert!(within_twice(16384, (4096, 8192)));
        assert!(!within_twice(1024, (4096, 8192)));
        assert!(!within_twice(65536, (4096, 8192)));
        // The CPU wins the largest size: none.
        let slow = series("vfio:a", &[1.0, 2.0, 4.0, 6.0, 4.0]);
        assert_eq!(
            measured_crossover(&sizes, &[cpu.clone(), slow], "cpu"),
            None
        );
        // An engine wins every size; an unmeasured size is skipped.
        let fast = series("vfio:a", &[9.0, 9.0, 0.0, 9.0, 9.0]);
        assert_eq!(
            measured_crossover(&sizes, &[cpu.clone(), fast], "cpu"),
            Some((0, 1024))
        );
        // No engine: none.
        assert_eq!(measured_crossover(&sizes, &[cpu, a][..1], "cpu"), None);
    }

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(Vec::new()), None);
    }

    #[test]
    fn paired_ratio_pairs_rounds_and_skips_missing() {
        // Round 2 is a slow spell for both targets: paired, it is no outlier.
        let rounds = vec![
            vec![Some(2.0), Some(1.0)],
            vec![Some(0.2), Some(0.1)],
            vec![Some(3.0), None],
            vec![Some(1.8), Some(1.0)],
        ];
        assert_eq!(paired_ratio(&rounds, 0, 1), Some((2.0, 3)));
        assert_eq!(paired_ratio(&rounds[2..3], 0, 1), None);
    }
}
