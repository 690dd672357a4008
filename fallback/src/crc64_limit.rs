//! Where CRC-64 inputs move from this crate's slicing-by-16 table to
//! crc-fast's folding: measured once a process.
//!
//! The table wins on short inputs (crc-fast's SIMD set-up costs more than a
//! few table steps), crc-fast on long ones, and where they cross depends on
//! the CPU: above 64 bytes on AMD Zen 4 (the table 1.12× crc-fast at 64 B),
//! near 56 on AMD Zen 3 (crc-fast 1.15× the table at 64 B and 1.5× at 96 B,
//! in paired rounds). A fixed limit of 128 bytes, tuned on Zen 4, left Zen 3
//! at 0.64–0.76× of crc-fast from 64 to 127 bytes. So the two are timed at
//! each of [`LADDER`] in interleaved rounds (~0.2 ms, the first time a
//! CRC-64 is computed in a process), and inputs shorter than the length
//! that, as the limit, loses least over the ladder run on the table
//! ([`pick`]).
//!
//! The three CRC-64s share the measurement (CRC-64/NVME's): the table's
//! work does not depend on the polynomial, and crc-fast folds each the same
//! way.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::crc64_table;

/// The input lengths the table and crc-fast are timed at.
pub const LADDER: [usize; 11] = [16, 32, 48, 64, 80, 96, 112, 128, 160, 192, 256];

/// The measurement: the limit and the figures it came from.
#[derive(Debug, Clone)]
pub struct Crc64Limit {
    /// Inputs shorter than this run on the table, longer ones on crc-fast.
    pub limit: usize,
    /// The fastest time one input took at each [`LADDER`] length:
    /// `(length, table, crc-fast)`.
    pub timings: Vec<(usize, Duration, Duration)>,
    /// How long the measurement took.
    pub took: Duration,
}

/// The length from which CRC-64 inputs run on crc-fast rather than the
/// table, measured the first time it is asked for in a process
/// ([`crc64_limit_measured`]).
#[inline]
pub fn crc64_table_limit() -> usize {
    match LIMIT.load(Ordering::Relaxed) {
        0 => limit_cold(),
        limit => limit,
    }
}

/// The cached limit (0 before it is measured).
static LIMIT: AtomicUsize = AtomicUsize::new(0);

#[cold]
#[inline(never)]
fn limit_cold() -> usize {
    crc64_limit_measured().limit
}

/// [`crc64_table_limit`] with the timings it was chosen from.
pub fn crc64_limit_measured() -> &'static Crc64Limit {
    static MEASURED: OnceLock<Crc64Limit> = OnceLock::new();
    let m = MEASURED.get_or_init(measure);
    if LIMIT.load(Ordering::Relaxed) == 0 {
        LIMIT.store(m.limit, Ordering::Relaxed);
    }
    m
}

/// Calls a slice of each contender runs, and rounds of slices.
const CALLS: u32 = 32;
const ROUNDS: usize = 7;

fn measure() -> Crc64Limit {
    let start = Instant::now();
    // Not all one value: neither side gets a pattern it could short-cut.
    let data: Vec<u8> = (0..LADDER[LADDER.len() - 1] as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let slice = |f: &dyn Fn(&[u8]) -> u64, input: &[u8]| {
        let t = Instant::now();
        for _ in 0..CALLS {
            std::hint::black_box(f(std::hint::black_box(input)));
        }
        t.elapsed() / CALLS
    };
    let table = |d: &[u8]| crc64_table::NVME.checksum(d);
    let fast = |d: &[u8]| crc_fast::crc64_nvme(d);
    let timings = LADDER
        .iter()
        .map(|&len| {
            let input = &data[..len];
            let (mut t, mut f) = (Duration::MAX, Duration::MAX);
            for round in 0..ROUNDS {
                // Each goes first every other round.
                if round % 2 == 0 {
                    t = t.min(slice(&table, input));
                    f = f.min(slice(&fast, input));
                } else {
                    f = f.min(slice(&fast, input));
                    t = t.min(slice(&table, input));
                }
            }
            (len, t, f)
        })
        .collect::<Vec<_>>();
    Crc64Limit {
        limit: pick(&timings),
        timings,
        took: start.elapsed(),
    }
}

/// The length timed that, as the limit, loses least against the faster
/// of the two at every length timed (each length's time over the better
/// one's, summed): one noisy slice moves the limit neither up nor down
/// unless it outweighs all the others. Ties go to the shorter limit; the
/// longest length timed when nothing was.
pub(crate) fn pick(timings: &[(usize, Duration, Duration)]) -> usize {
    let loss = |limit: usize| -> f64 {
        timings
            .iter()
            .map(|&(len, table, fast)| {
                let ran = if len < limit { table } else { fast };
                ran.as_secs_f64() / table.min(fast).as_secs_f64().max(f64::MIN_POSITIVE)
            })
            .sum()
    };
    timings
        .iter()
        .map(|t| (t.0, loss(t.0)))
        .fold(None, |best: Option<(usize, f64)>, (len, l)| match best {
            Some((_, b)) if b <= l => best,
            _ => Some((len, l)),
        })
        .map_or(LADDER[LADDER.len() - 1], |(len, _)| len)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(len: usize, table: u64, fast: u64) -> (usize, Duration, Duration) {
        (len, Duration::from_nanos(table), Duration::from_nanos(fast))
    }

    #[test]
    fn the_limit_is_where_crc_fast_stays_ahead() {
        // Zen 3-like: crc-fast ahead from 64 bytes.
        let zen3 = [
            t(16, 7, 20),
            t(32, 13, 20),
            t(48, 18, 21),
            t(64, 26, 22),
            t(96, 40, 26),
        ];
        assert_eq!(pick(&zen3), 64);
        // A lone dip at 32 bytes does not pull the limit down...
        let dip = [t(16, 7, 20), t(32, 21, 20), t(48, 18, 21), t(64, 26, 22)];
        assert_eq!(pick(&dip), 64);
        // ...nor a lone slow crc-fast slice at 160 push it up.
        let bump = [
            t(64, 20, 26),
            t(128, 60, 20),
            t(160, 70, 75),
            t(192, 80, 22),
            t(256, 100, 25),
        ];
        assert_eq!(pick(&bump), 128);
        // crc-fast ahead everywhere: every input on crc-fast but the
        // shortest timed.
        assert_eq!(pick(&[t(16, 9, 8), t(32, 20, 9)]), 16);
        // The table never behind: it takes everything below the longest.
        assert_eq!(pick(&[t(16, 7, 20), t(256, 90, 95)]), 256);
        assert_eq!(pick(&[]), 256);
    }

    #[test]
    fn the_measured_limit_is_on_the_ladder_and_cached() {
        let m = crc64_limit_measured();
        assert!(LADDER.contains(&m.limit), "{m:?}");
        assert_eq!(m.timings.len(), LADDER.len());
        assert_eq!(crc64_table_limit(), m.limit);
    }
}
