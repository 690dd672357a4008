//! Calibration: seeding the cost model by measurement.
//!
//! Calibration is bounded: each backend gets [`BUDGET`] of wall time for all
//! the (algorithm, direction) pairs it runs, each pair a share of what is
//! left. For each pair it times requests of two sizes (64 bytes and 64 KiB;
//! up to 16 MiB for an engine whose per-byte cost hides under its fixed
//! cost, while that fits), fits `fixed + per_byte × len` through the fastest
//! repetition of each, and the process CPU time per request through the
//! median of each (its slope only as far as the samples tell it from noise). Once
//! per engine it times 4 concurrent requests against one to estimate how
//! many the engine serves at once. Pairs the budget leaves no time for take
//! the last measured pair's costs. (A request that alone takes longer than
//! the budget, as a 25 ms engine's second one does, still runs: a bound
//! cannot be met below one request per size.)

use core::future::Future;
use core::pin::Pin;
use core::task::Poll;
use std::time::Duration;

use cpu_time::ProcessTime;
use crypto_offload_fallback as fb;
use tokio::time::Instant;

use crate::alg::Algorithm;
use crate::backend::{AnyContext as Ctx, Backend, CipherParams};
use crate::buffer::IoBuf;
use crate::cost::{Cost, Direction};
use crate::error::BackendError;
use crate::key::SecretKey;
use crate::slot::{SlotId, Slots};

/// Wall time calibration may spend on one backend (all its algorithms).
pub const BUDGET: Duration = Duration::from_millis(200);

const SMALL: usize = 64;
const LARGE: usize = 64 * 1024;
const LARGEST: usize = 16 << 20;

fn pairs(supports: impl Fn(Algorithm) -> bool) -> Vec<(Algorithm, Direction)> {
    let mut out = Vec::new();
    for alg in Algorithm::all().filter(|&a| supports(a)) {
        out.push((alg, Direction::Encrypt));
        if !matches!(alg, Algorithm::Crc(_)) {
            out.push((alg, Direction::Decrypt));
        }
    }
    out
}

/// Measures every slot's costs (see the module docs).
pub(crate) async fn run(slots: &Slots) {
    run_where(slots, |_| true).await;
}

/// Measures the costs of the slots that have none: those a loaded profile
/// did not cover (made on another machine, or before an engine joined).
/// The others keep the profile's.
pub(crate) async fn run_uncalibrated(slots: &Slots) {
    run_where(slots, |id| !slots[id].calibrated()).await;
}

/// Measures the costs of the slots `which` picks.
async fn run_where(slots: &Slots, which: impl Fn(SlotId) -> bool) {
    if which(SlotId::CPU) {
        calibrate_cpu(slots);
    }
    for id in slots.engine_ids().filter(|&id| which(id)) {
        let Some(backend) = slots[id].backend().cloned() else {
            continue;
        };
        if let Err(e) = calibrate_engine(slots, id, &*backend).await {
            tracing::warn!(backend = backend.name(), error = %e, "calibration failed");
            slots.failed(id, &e);
        }
    }
}

/// Times `f` over `len`-byte requests: the fastest of the repetitions that
/// fit in `budget` (at least 3), in ns per request.
fn time_inline(len: usize, budget: Duration, mut f: impl FnMut(&mut [u8])) -> f64 {
    let mut buf = vec![0x5au8; len];
    f(&mut buf); // warm up
    let start = std::time::Instant::now();
    let mut best = f64::MAX;
    let mut reps = 0;
    // Batches of requests amortise the clock reads for small sizes.
    let batch = (LARGE / len.max(1)).clamp(1, 64);
    while reps < 3 || start.elapsed() < budget {
        let t = std::time::Instant::now();
        for _ in 0..batch {
            f(&mut buf);
        }
        best = best.min(t.elapsed().as_nanos() as f64 / batch as f64);
        reps += 1;
        if reps > 10_000 {
            break;
        }
    }
    best
}

fn calibrate_cpu(slots: &Slots) {
    let all = pairs(|_| true);
    let per = BUDGET / (2 * all.len() as u32);
    for (alg, dir) in all {
        let enc = dir == Direction::Encrypt;
        let (small, large) = match alg {
            Algorithm::Cipher(c) => {
                let Ok(k) = slots
                    .cpu
                    .cipher(c, SecretKey::for_tests(c.key_len()).expose())
                else {
                    continue;
                };
                let run = |len| {
                    let p = CipherParams::new([7; 16], len);
                    time_inline(len, per, |d| {
                        let _ = k.run(enc, &p, d);
                    })
                };
                (run(SMALL), run(LARGE))
            }
            Algorithm::Aead(a) => {
                let Ok(k) = slots
                    .cpu
                    .aead(a, SecretKey::for_tests(a.key_len()).expose())
                else {
                    continue;
                };
                let seal = |len| {
                    time_inline(len, per, |d| {
                        let _ = k.seal_in_place_detached(&[1; 12], b"", d);
                    })
                };
                let (s, l) = (seal(SMALL), seal(LARGE));
                if enc {
                    (s, l)
                } else {
                    // Open needs a valid tag: time seal + open, less the seal.
                    let both = |len| {
                        time_inline(len, per, |d| {
                            if let Ok(tag) = k.seal_in_place_detached(&[1; 12], b"", d) {
                                let _ = k.open_in_place_detached(&[1; 12], b"", d, &tag);
                            }
                        })
                    };
                    ((both(SMALL) - s).max(1.0), (both(LARGE) - l).max(1.0))
                }
            }
            Algorithm::Crc(c) => {
                let run = |len| {
                    time_inline(len, per, |d| {
                        std::hint::black_box(fb::checksum(c, d));
                    })
                };
                (run(SMALL), run(LARGE))
            }
        };
        let (fixed, per_byte) = Cost::fit((SMALL, small), (LARGE, large));
        // On the CPU, latency is CPU time; it serves one request per core.
        let cores = u32::try_from(slots.cores).unwrap_or(u32::MAX);
        slots.set_cost(
            SlotId::CPU,
            alg,
            dir,
            Cost::new(fixed, per_byte, fixed, per_byte, cores),
        );
    }
}

/// One request on an engine context; the buffer comes back (or the error).
async fn request(ctx: &Ctx, dir: Direction, len: usize) -> Result<(), BackendError> {
    let buf = IoBuf::from(vec![0x3cu8; len]);
    // One XTS data unit of the whole buffer; CBC/CTR ignore the unit.
    let params = CipherParams::new([9; 16], len);
    let r = match (ctx, dir) {
        (Ctx::Cipher(c), Direction::Encrypt) => c.encrypt(params, buf).await.map(drop),
        (Ctx::Cipher(c), Direction::Decrypt) => c.decrypt(params, buf).await.map(drop),
        (Ctx::Aead(a), Direction::Encrypt) => a.seal([2; 12], b"", buf).await.map(drop),
        (Ctx::Aead(a), Direction::Decrypt) => {
            // A valid message to open: seal first (not timed by the caller's
            // clock, which the caller restarts; see `time_engine`).
            let (sealed, tag) = a.seal([2; 12], b"", buf).await.map_err(|f| f.error)?;
            a.open([2; 12], b"", sealed, tag).await.map(drop)
        }
        (Ctx::Crc(c), _) => c.checksum(buf).await.map(drop),
    };
    r.map_err(|f| f.error)
}

/// Repetitions of one engine request: the least wall time, and every
/// repetition's process-CPU time.
#[derive(Debug, Clone, PartialEq)]
struct Timing {
    wall: f64,
    cpu: Vec<f64>,
}

impl Timing {
    fn merge(mut self, other: Timing) -> Timing {
        self.wall = self.wall.min(other.wall);
        self.cpu.extend(other.cpu);
        self
    }

    /// The median CPU time and its standard error (from the median
    /// absolute deviation: a few disturbed repetitions move neither).
    fn cpu_median(&self) -> (f64, f64) {
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            let m = v.len() / 2;
            match v.len() {
                0 => 0.0,
                n if n % 2 == 1 => v[m],
                _ => (v[m - 1] + v[m]) / 2.0,
            }
        };
        let mut cpu = self.cpu.clone();
        let center = median(&mut cpu);
        if cpu.len() < 2 {
            // One sample (a slow engine, whose budget allows no more) says
            // nothing of its spread: the line is taken as measured.
            return (center, 0.0);
        }
        let mut dev: Vec<f64> = cpu.iter().map(|c| (c - center).abs()).collect();
        // 1.4826 × MAD estimates a normal spread; the median's standard
        // error is 1.2533 × that over √n.
        let spread = 1.4826 * median(&mut dev);
        (center, 1.2533 * spread / (cpu.len() as f64).sqrt())
    }
}

/// `cpu_fixed + cpu_per_byte × len` through two sizes' median CPU times,
/// with the slope shrunk by twice the standard error of the difference: only a
/// difference the samples can tell from noise becomes a cost per byte.
///
/// Why: the process's CPU clock reaches other threads' time (the engine's
/// completion thread, the runtime's workers) only as the kernel accounts
/// it, and batches of 30 requests of the `qce` preset took 33–48 µs of CPU
/// each at every size from 64 B to 1 MiB. A plain line through 64 B and
/// 64 KiB put the CPU per byte anywhere in 0–0.25 ns over ten calibrations,
/// which at 1 MiB (×16 beyond the measured span) made offloading look
/// dearer than the 240 µs of doing the work here, and the Throughput policy
/// then never used the engine.
fn fit_cpu(small: (usize, &Timing), large: (usize, &Timing)) -> (f64, f64) {
    let ((s, s_err), (l, l_err)) = (small.1.cpu_median(), large.1.cpu_median());
    let noise = 2.0 * s_err.hypot(l_err);
    let dx = (large.0 as f64 - small.0 as f64).max(1.0);
    let per_byte = (l - s - noise).max(0.0) / dx;
    let fixed = (s - per_byte * small.0 as f64).max(0.0);
    (fixed, per_byte)
}

/// Times `reps` engine requests of `len` bytes.
async fn time_engine(
    ctx: &Ctx,
    dir: Direction,
    len: usize,
    reps: usize,
) -> Result<Timing, BackendError> {
    let mut t = Timing {
        wall: f64::MAX,
        cpu: Vec::with_capacity(reps.max(1)),
    };
    for _ in 0..reps.max(1) {
        let (wall, cpu) = (Instant::now(), ProcessTime::now());
        request(ctx, dir, len).await?;
        t.wall = t.wall.min(wall.elapsed().as_nanos() as f64);
        t.cpu.push(cpu.elapsed().as_nanos() as f64);
    }
    if matches!((ctx, dir), (Ctx::Aead(_), Direction::Decrypt)) {
        // That timed seal + open; take the seal off.
        let seal = Box::pin(time_engine(ctx, Direction::Encrypt, len, reps)).await?;
        let seal_cpu = seal.cpu_median().0;
        t.wall = (t.wall - seal.wall).max(1.0);
        for c in &mut t.cpu {
            *c = (*c - seal_cpu).max(0.0);
        }
    }
    Ok(t)
}

/// Polls every future to completion, concurrently, on the current task.
async fn join_all<F: Future>(futs: Vec<F>) -> Vec<F::Output> {
    let mut futs: Vec<Pin<Box<F>>> = futs.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, o) in futs.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => *o = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    out.into_iter().flatten().collect()
}

async fn calibrate_engine(
    slots: &Slots,
    id: SlotId,
    backend: &dyn Backend,
) -> Result<(), BackendError> {
    let slot = &slots[id];
    let all = pairs(|a| slot.runs(a));
    let started = Instant::now();
    let mut contexts: Vec<(Algorithm, Ctx)> = Vec::new();
    // Measured once: the queues are the engine's, whatever the algorithm.
    let mut parallelism: Option<u32> = None;
    // Entries the budget leaves no time for take the last measured one's
    // costs (the closest: the same mode's other direction or key size).
    let mut last: Option<Cost> = None;
    let count = all.len();
    for (i, (alg, dir)) in all.into_iter().enumerate() {
        let left = BUDGET.saturating_sub(started.elapsed());
        if left.is_zero() {
            if let Some(c) = last {
                // The closest entry's costs, with this algorithm's own
                // operation size.
                let l = slot.limits(alg).copied().unwrap_or_default();
                let mut c = c.with_operation_len(l.operation_len);
                c.queue_depth = l
                    .queue_depth
                    .map_or(u32::MAX, |d| u32::try_from(d).unwrap_or(u32::MAX).max(1));
                if let Some((fixed, per_byte)) = l.cpu_cost {
                    (c.cpu_fixed_ns, c.cpu_per_byte_ns) = (fixed.as_nanos() as f64, per_byte);
                }
                slots.set_cost(id, alg, dir, c);
            }
            continue;
        }
        // This entry's share of what is left.
        let share = left / u32::try_from(count - i).unwrap_or(u32::MAX);
        let deadline = Instant::now() + share;
        let remaining = || {
            deadline
                .saturating_duration_since(Instant::now())
                .as_nanos() as f64
        };
        let ctx = match contexts.iter().position(|(a, _)| *a == alg) {
            Some(k) => &contexts[k].1,
            None => {
                contexts.push((alg, Ctx::open(backend, alg).await?));
                let ctx = &contexts[contexts.len() - 1].1;
                // The first request may pay a resume: keep it out of the timings.
                request(ctx, dir, SMALL).await?;
                ctx
            }
        };
        let one = time_engine(ctx, dir, SMALL, 1).await?.wall;
        let reps = ((remaining() / 4.0 / one.max(1.0)) as usize).clamp(1, 8);
        let small = time_engine(ctx, dir, SMALL, reps).await?;
        // Within the backend's largest request.
        let limits = slot.limits(alg).copied().unwrap_or_default();
        let operation = limits.operation_len;
        let max = limits
            .max_request
            .unwrap_or(usize::MAX)
            .min(operation.unwrap_or(usize::MAX));
        let mut len = LARGE.min(max).max(SMALL + 1);
        let mut large = time_engine(ctx, dir, len, 1).await?;
        // Grow the large size while the per-byte cost hides under the fixed
        // one, if a request 16 times larger still fits.
        while large.wall - small.wall < 0.25 * small.wall
            && len < LARGEST
            && len.saturating_mul(16) <= max
            && large.wall + 16.0 * (large.wall - small.wall).max(0.0) < remaining() / 2.0
        {
            len *= 16;
            large = time_engine(ctx, dir, len, 1).await?;
        }
        let more = ((remaining() / 2.0 / large.wall.max(1.0)) as usize).min(7);
        if more > 0 {
            large = large.merge(time_engine(ctx, dir, len, more).await?);
        }
        let (fixed, per_byte) = Cost::fit((SMALL, small.wall), (len, large.wall));
        // A request split into operations pays some costs once (an AF_ALG
        // request's thread hand-off) and some per operation: time one of
        // four operations, if it fits, for the latter.
        let op_fixed = match operation {
            Some(op) if op == len && 4.0 * large.wall < remaining() => {
                let four = time_engine(ctx, dir, 4 * op, 1).await?.wall;
                Some(((four - fixed - per_byte * (4 * op) as f64) / 3.0).clamp(0.0, fixed))
            }
            _ => None,
        };
        let (cpu_fixed, cpu_per_byte) = match limits.cpu_cost {
            Some((fixed, per_byte)) => (fixed.as_nanos() as f64, per_byte),
            None => fit_cpu((SMALL, &small), (len, &large)),
        };
        // Concurrency, once: `n` requests at once against one, at the
        // largest size whose `n` requests fit in what is left (serially,
        // worst case) — 4, then 16 and 64 (within the engine's queue) while
        // the engine keeps up: a device that batches what arrives while it
        // is busy (one notification, one pass over its ring for many)
        // serves many at once for little more than one, and the selector
        // must know it to send it what it wins under load.
        if parallelism.is_none() {
            let depth = limits.queue_depth.unwrap_or(usize::MAX);
            let mut found = None;
            for n in [4usize, 16, 64] {
                if n > depth.max(4) {
                    break;
                }
                let probe = [(len, large.wall), (SMALL, small.wall)]
                    .into_iter()
                    .find(|&(_, t)| n as f64 * t <= remaining());
                let Some((size, single)) = probe else {
                    break;
                };
                let t = Instant::now();
                for r in join_all((0..n).map(|_| request(ctx, dir, size)).collect()).await {
                    r?;
                }
                let all = t.elapsed().as_nanos() as f64;
                let p = ((n as f64 * single / all.max(1.0)).round() as u32).clamp(1, n as u32);
                found = Some(found.map_or(p, |f: u32| f.max(p)));
                // Saturated: more at once would only queue.
                if (p as usize) * 2 < n {
                    break;
                }
            }
            parallelism = found;
        }
        let mut cost = Cost::new(
            fixed,
            per_byte,
            cpu_fixed,
            cpu_per_byte,
            parallelism.unwrap_or(1),
        );
        if let Some(depth) = limits.queue_depth {
            cost = cost.with_queue_depth(u32::try_from(depth).unwrap_or(u32::MAX));
        }
        cost = cost
            .with_operation_len(operation)
            .with_op_fixed_ns(op_fixed);
        slots.set_cost(id, alg, dir, cost);
        last = Some(cost);
    }
    if let Some(power) = backend.power() {
        slot.model
            .resume_ns
            .set(power.stats().last_resume.as_nanos() as f64);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing(cpu: &[f64]) -> Timing {
        Timing {
            wall: 1.0,
            cpu: cpu.to_vec(),
        }
    }

    #[test]
    fn cpu_slope_within_the_noise_is_no_slope() {
        // The qce preset's shape: ~40 µs a request at every size, ±8 µs.
        let small = timing(&[33e3, 48e3, 41e3, 36e3, 45e3, 40e3, 38e3, 44e3]);
        let large = timing(&[47e3, 37e3, 52e3, 44e3, 40e3, 49e3, 43e3, 46e3]);
        let (fixed, per_byte) = fit_cpu((64, &small), (65536, &large));
        assert_eq!(per_byte, 0.0);
        assert!((40e3..43e3).contains(&fixed), "{fixed}");
        // The plain line through the medians would have charged a slope.
        let naive = Cost::fit((64, 40.5e3), (65536, 45e3)).1;
        assert!(naive > 0.05, "{naive}");
    }

    #[test]
    fn a_clear_cpu_slope_is_kept() {
        // 10 µs + 1 ns a byte, with ±1 µs of noise.
        let small = timing(&[10.0e3, 11.0e3, 9.5e3, 10.5e3, 10.2e3]);
        let large = timing(&[75.5e3, 76.0e3, 75.0e3, 76.5e3, 75.8e3]);
        let (fixed, per_byte) = fit_cpu((64, &small), (65536, &large));
        assert!((0.95..1.0).contains(&per_byte), "{per_byte}");
        assert!((9e3..11e3).contains(&fixed), "{fixed}");
    }

    #[test]
    fn one_disturbed_repetition_moves_nothing() {
        let small = timing(&[10e3, 10e3, 10e3, 10e3, 10e3]);
        let calm = timing(&[10e3, 10e3, 10e3, 10e3, 10e3]);
        let disturbed = timing(&[10e3, 10e3, 4e6, 10e3, 10e3]);
        assert_eq!(
            fit_cpu((64, &small), (65536, &calm)),
            fit_cpu((64, &small), (65536, &disturbed))
        );
    }

    #[test]
    fn single_samples_give_the_plain_line() {
        let single = fit_cpu((64, &timing(&[10e3])), (65536, &timing(&[25e3])));
        assert_eq!(single, Cost::fit((64, 10e3), (65536, 25e3)));
    }
}
