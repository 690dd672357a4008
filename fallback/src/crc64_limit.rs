//! Where CRC-64 inputs move from this crate's slicing-by-16 table to the
//! PCLMULQDQ fold (the `clmul` feature) and from there to crc-fast:
//! measured once a process.
//!
//! The table wins on short inputs (crc-fast's SIMD set-up costs more than a
//! few table steps), crc-fast on long ones, and where they cross depends on
//! the CPU: above 64 bytes on AMD Zen 4 (the table 1.12× crc-fast at 64 B),
//! near 56 on AMD Zen 3 (crc-fast 1.15× the table at 64 B and 1.5× at 96 B,
//! in paired rounds). A fixed limit of 128 bytes, tuned on Zen 4, left Zen 3
//! at 0.64–0.76× of crc-fast from 64 to 127 bytes.
//!
//! Between them, the fold (`crypto_offload_native::Crc64Fold`, 128 bits a
//! step) wins where crc-fast runs its 512-bit loop: on an Intel Xeon
//! family 6 model 207 it took 4.6 / 6.2 / 9.1 / 12.4 / 23.5 ns at 16 / 64 /
//! 128 / 256 / 512 B where the table took 6.0 / 20 and crc-fast 21 / 23 /
//! 20 / 34 / 34, and crc-fast was ahead again from 1 KiB (36 ns, the fold
//! 46). On CPUs without VPCLMULQDQ crc-fast folds 128 bits a step too.
//!
//! So the three are timed at each of [`LADDER`] in interleaved rounds
//! (0.8–1.1 ms in a release build, the first time a CRC-64 is computed in
//! a process; the table only up to [`TABLE_MAX`], past which it is far
//! behind), and the two limits that lose least over the ladder are kept
//! ([`pick`]); crc-fast is timed 8 bytes off a boundary too, for the
//! inputs it takes longer on ([`pick_unaligned`]).
//!
//! The three CRC-64s share the measurement (CRC-64/NVME's): the table's
//! and the fold's work do not depend on the polynomial, and crc-fast folds
//! each the same way.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

#[cfg(feature = "clmul")]
use crypto_offload_native::{Clmul, Crc64Fold};

use crate::crc64_table;
use crate::handover::{self, handover};

/// The input lengths the table, the fold and crc-fast are timed at.
pub const LADDER: [usize; 19] = [
    16, 32, 48, 64, 80, 96, 112, 128, 160, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096,
];

/// The longest length the table is timed at (and so the longest it can
/// run): 4–9× behind the others there.
pub const TABLE_MAX: usize = 256;

/// The measurement: the limits and the figures they came from.
#[derive(Debug, Clone)]
pub struct Crc64Limit {
    /// Inputs shorter than this run on the table.
    pub limit: usize,
    /// Inputs from [`limit`](Self::limit) and shorter than this run on the
    /// fold, longer ones on crc-fast: `limit` where there is no fold (a
    /// build without the `clmul` feature, a CPU without PCLMULQDQ).
    pub crc_fast_from: usize,
    /// The same for inputs that leave crc-fast 64 bytes or more outside its
    /// 128-byte blocks ([`crc_fast_from`](Self::crc_fast_from) or more):
    /// crc-fast takes up to ~75 ns longer on them, the fold no longer.
    /// Measured 8 bytes past a 64-byte boundary (128 bytes left over).
    pub crc_fast_from_unaligned: usize,
    /// The fastest time one input took on each at each [`LADDER`] length.
    pub timings: Vec<Crc64Timing>,
    /// How long the measurement took.
    pub took: Duration,
}

/// The three CRC-64 implementations' times at one length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Crc64Timing {
    /// The input length.
    pub len: usize,
    /// This crate's table (not timed past [`TABLE_MAX`]).
    pub table: Option<Duration>,
    /// The PCLMULQDQ fold, where this build and CPU have it.
    pub fold: Option<Duration>,
    /// crc-fast, on an input whose address is a multiple of 64.
    pub crc_fast: Duration,
    /// crc-fast on the same length 8 bytes further on.
    pub crc_fast_unaligned: Duration,
}

/// The length from which CRC-64 inputs leave the table (for the fold or
/// crc-fast), measured the first time it is asked for in a process
/// ([`crc64_limit_measured`]).
#[inline]
pub fn crc64_table_limit() -> usize {
    match LIMIT.load(Ordering::Relaxed) {
        0 => limit_cold().limit,
        limit => limit,
    }
}

/// The length from which CRC-64 inputs run on crc-fast, measured with
/// [`crc64_table_limit`].
#[inline]
pub fn crc64_crc_fast_from() -> usize {
    match CRC_FAST_FROM.load(Ordering::Relaxed) {
        0 => limit_cold().crc_fast_from,
        from => from,
    }
}

/// The length from which CRC-64 inputs that leave crc-fast 64 bytes or
/// more outside its 128-byte blocks run on it
/// ([`Crc64Limit::crc_fast_from_unaligned`]).
#[inline]
pub fn crc64_crc_fast_from_unaligned() -> usize {
    match CRC_FAST_FROM_UNALIGNED.load(Ordering::Relaxed) {
        0 => limit_cold().crc_fast_from_unaligned,
        from => from,
    }
}

/// The cached limits (0 before they are measured).
static LIMIT: AtomicUsize = AtomicUsize::new(0);
static CRC_FAST_FROM: AtomicUsize = AtomicUsize::new(0);
static CRC_FAST_FROM_UNALIGNED: AtomicUsize = AtomicUsize::new(0);

/// The fold's proof of PCLMULQDQ, kept where the measurement found one.
#[cfg(feature = "clmul")]
static CLMUL: OnceLock<Clmul> = OnceLock::new();

/// The fold's token, once the limits are measured on a CPU that has it.
#[cfg(feature = "clmul")]
#[inline(always)]
pub(crate) fn clmul() -> Option<Clmul> {
    CLMUL.get().copied()
}

#[cold]
#[inline(never)]
fn limit_cold() -> &'static Crc64Limit {
    crc64_limit_measured()
}

/// [`crc64_table_limit`] and [`crc64_crc_fast_from`] with the timings they
/// were chosen from.
pub fn crc64_limit_measured() -> &'static Crc64Limit {
    static MEASURED: OnceLock<Crc64Limit> = OnceLock::new();
    let m = MEASURED.get_or_init(measure);
    if CRC_FAST_FROM_UNALIGNED.load(Ordering::Relaxed) == 0 {
        // Each read alone (a reader may see one stored and not another:
        // it then measures, which is this, cached).
        LIMIT.store(m.limit, Ordering::Relaxed);
        CRC_FAST_FROM.store(m.crc_fast_from, Ordering::Relaxed);
        CRC_FAST_FROM_UNALIGNED.store(m.crc_fast_from_unaligned, Ordering::Relaxed);
    }
    m
}

/// One implementation's one-shot CRC.
type Contender<'a> = dyn Fn(&[u8]) -> u64 + 'a;

/// Calls a slice of each contender runs, and rounds of slices.
const CALLS: u32 = 32;
const ROUNDS: usize = 7;

fn measure() -> Crc64Limit {
    let start = Instant::now();
    // Inputs at an address that is a multiple of 64, and 8 bytes on.
    let (buf, at) = handover::ladder_data(LADDER[LADDER.len() - 1]);
    let data = &buf[at..];
    let slice = |f: &dyn Fn(&[u8]) -> u64, input: &[u8]| handover::time_calls(f, input, CALLS);
    let table = |d: &[u8]| crc64_table::NVME.checksum(d);
    let fast = |d: &[u8]| crc_fast::crc64_nvme(d);
    #[cfg(feature = "clmul")]
    let clmul = Clmul::detect();
    #[cfg(feature = "clmul")]
    let fold = clmul.map(|c| move |d: &[u8]| Crc64Fold::NVME.update(c, u64::MAX, d) ^ u64::MAX);
    #[cfg(not(feature = "clmul"))]
    let fold: Option<fn(&[u8]) -> u64> = None;
    let timings = LADDER
        .iter()
        .map(|&len| {
            let input = &data[..len];
            let unaligned = &data[8..8 + len];
            let mut fast_unaligned = Duration::MAX;
            let mut contenders: Vec<(&Contender<'_>, Duration)> = vec![(&fast, Duration::MAX)];
            if len <= TABLE_MAX {
                contenders.push((&table, Duration::MAX));
            }
            if let Some(f) = &fold {
                contenders.push((f, Duration::MAX));
            }
            for round in 0..ROUNDS {
                // Each goes first in turn.
                let n = contenders.len();
                for k in 0..n {
                    let (f, best) = &mut contenders[(round + k) % n];
                    *best = (*best).min(slice(*f, input));
                }
                fast_unaligned = fast_unaligned.min(slice(&fast, unaligned));
            }
            let mut times = contenders.iter().map(|c| c.1);
            let crc_fast = times.next().unwrap_or(Duration::MAX);
            Crc64Timing {
                len,
                table: (len <= TABLE_MAX).then(|| times.next().unwrap_or(Duration::MAX)),
                fold: fold.as_ref().map(|_| times.next().unwrap_or(Duration::MAX)),
                crc_fast,
                crc_fast_unaligned: fast_unaligned,
            }
        })
        .collect::<Vec<_>>();
    let (limit, crc_fast_from) = pick(&timings);
    let crc_fast_from_unaligned = pick_unaligned(&timings, crc_fast_from);
    #[cfg(feature = "clmul")]
    if let Some(c) = clmul {
        let _ = CLMUL.set(c);
    }
    Crc64Limit {
        limit,
        crc_fast_from,
        crc_fast_from_unaligned,
        timings,
        took: start.elapsed(),
    }
}

/// The fold's time as [`pick`] and [`pick_unaligned`] weigh it: 10% over
/// what it measured. Timed here, in slices of 32 calls each after the
/// others', crc-fast's 512-bit loop took 8–15 ns more than in `paired`'s
/// 20 µs slices (Intel Xeon model 207: 42 ns against 34–36 at 512 B, 48
/// against 37 at 1 KiB) and the fold no more, which put the limit for
/// aligned inputs at 1.5 KiB in most processes where `paired` has crc-fast
/// ahead from ~800 B (1 KiB: 37 ns against the fold's 47). Weighed so,
/// the near tie at 1 KiB goes to crc-fast, as it did before the fold.
fn handicapped(fold: Duration) -> Duration {
    fold.saturating_add(fold / 10)
}

/// The two limits that lose least against the fastest at every length
/// timed (each length's time over the best one's, summed): inputs shorter
/// than the first on the table, from it and shorter than the second on the
/// fold, the rest on crc-fast. One noisy slice moves a limit neither up
/// nor down unless it outweighs all the others. Both are lengths timed;
/// ties go to the shorter; the table keeps everything below the longest
/// length it was timed at when nothing was. Without fold timings the two
/// are one.
pub(crate) fn pick(timings: &[Crc64Timing]) -> (usize, usize) {
    let loss = |limit: usize, until: usize| -> f64 {
        timings
            .iter()
            .map(|t| {
                let t = Crc64Timing {
                    fold: t.fold.map(handicapped),
                    ..*t
                };
                let best = [t.table, t.fold, Some(t.crc_fast)]
                    .into_iter()
                    .flatten()
                    .min()
                    .unwrap_or(t.crc_fast);
                let ran = if t.len < limit {
                    t.table
                } else if t.len < until {
                    t.fold
                } else {
                    Some(t.crc_fast)
                };
                match ran {
                    Some(ran) => ran.as_secs_f64() / best.as_secs_f64().max(f64::MIN_POSITIVE),
                    None => f64::INFINITY,
                }
            })
            .sum()
    };
    let has_fold = timings.iter().any(|t| t.fold.is_some());
    let mut best: Option<(usize, usize, f64)> = None;
    for a in timings.iter().filter(|t| t.table.is_some()) {
        let untils: Vec<usize> = if has_fold {
            timings
                .iter()
                .map(|t| t.len)
                .filter(|&b| b >= a.len)
                .collect()
        } else {
            vec![a.len]
        };
        for b in untils {
            let l = loss(a.len, b);
            if best.is_none_or(|(_, _, x)| l < x) {
                best = Some((a.len, b, l));
            }
        }
    }
    best.map_or((TABLE_MAX, TABLE_MAX), |(a, b, _)| (a, b))
}

/// Where inputs at other addresses and lengths leave the fold for
/// crc-fast, no sooner than aligned ones (`from`): of the lengths timed
/// from `from`, the one from which crc-fast 8 bytes off loses least
/// against the (handicapped) fold ([`handover()`]); `from` without fold
/// timings.
pub(crate) fn pick_unaligned(timings: &[Crc64Timing], from: usize) -> usize {
    if !timings.iter().any(|t| t.fold.is_some()) {
        return from;
    }
    let rows: Vec<_> = timings
        .iter()
        .filter(|t| t.len >= from)
        .map(|t| {
            let fold = t.fold.map_or(Duration::MAX, handicapped);
            (t.len, fold, t.crc_fast_unaligned)
        })
        .collect();
    handover(&rows).unwrap_or(from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(len: usize, table: u64, fast: u64) -> Crc64Timing {
        Crc64Timing {
            len,
            table: Some(Duration::from_nanos(table)),
            fold: None,
            crc_fast: Duration::from_nanos(fast),
            crc_fast_unaligned: Duration::from_nanos(fast),
        }
    }

    fn off(mut t: Crc64Timing, unaligned: u64) -> Crc64Timing {
        t.crc_fast_unaligned = Duration::from_nanos(unaligned);
        t
    }

    fn with_fold(mut t: Crc64Timing, fold: u64) -> Crc64Timing {
        t.fold = Some(Duration::from_nanos(fold));
        t
    }

    fn untabled(mut t: Crc64Timing) -> Crc64Timing {
        t.table = None;
        t
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
        assert_eq!(pick(&zen3), (64, 64));
        // A lone dip at 32 bytes does not pull the limit down...
        let dip = [t(16, 7, 20), t(32, 21, 20), t(48, 18, 21), t(64, 26, 22)];
        assert_eq!(pick(&dip), (64, 64));
        // ...nor a lone slow crc-fast slice at 160 push it up.
        let bump = [
            t(64, 20, 26),
            t(128, 60, 20),
            t(160, 70, 75),
            t(192, 80, 22),
            t(256, 100, 25),
        ];
        assert_eq!(pick(&bump), (128, 128));
        // crc-fast ahead everywhere: every input on crc-fast but the
        // shortest timed.
        assert_eq!(pick(&[t(16, 9, 8), t(32, 20, 9)]), (16, 16));
        // The table never behind: it takes everything below the longest.
        assert_eq!(pick(&[t(16, 7, 20), t(256, 90, 95)]), (256, 256));
        assert_eq!(pick(&[]), (TABLE_MAX, TABLE_MAX));
    }

    #[test]
    fn the_fold_runs_between_the_table_and_crc_fast_where_it_wins() {
        // The figures of an Intel Xeon model 207 (ns): the fold ahead of
        // the table from 16 B and of crc-fast's 512-bit loop to 512 B.
        let intel = [
            with_fold(t(16, 6, 21), 5),
            with_fold(t(64, 20, 23), 6),
            with_fold(t(128, 55, 20), 9),
            with_fold(t(256, 110, 34), 12),
            with_fold(untabled(t(512, 0, 34)), 24),
            with_fold(untabled(t(1024, 0, 36)), 46),
            with_fold(untabled(t(2048, 0, 43)), 90),
        ];
        assert_eq!(pick(&intel), (16, 1024));
        // A table ahead at 16 and 32 B keeps them.
        let mut slow_fold = intel;
        slow_fold[0] = with_fold(t(16, 5, 21), 9);
        let mut v = slow_fold.to_vec();
        v.insert(1, with_fold(t(32, 9, 21), 10));
        assert_eq!(pick(&v), (64, 1024));
        // A fold that never wins is never run.
        let behind: Vec<_> = [t(16, 7, 20), t(64, 26, 22), t(256, 100, 25)]
            .into_iter()
            .map(|x| with_fold(x, 200))
            .collect();
        assert_eq!(pick(&behind), (64, 64));
        // A fold ahead everywhere runs to the end of the ladder: crc-fast
        // from the longest length timed.
        let ahead: Vec<_> = [t(16, 7, 20), t(64, 26, 22), t(256, 100, 25)]
            .into_iter()
            .map(|x| with_fold(x, 3))
            .collect();
        assert_eq!(pick(&ahead), (16, 256));
    }

    #[test]
    fn unaligned_inputs_stay_on_the_fold_while_it_beats_crc_fast_off_alignment() {
        // Model 207's figures: crc-fast ~60 ns slower 8 bytes off.
        let intel = [
            with_fold(off(t(256, 110, 36), 92), 13),
            with_fold(off(untabled(t(512, 0, 35)), 100), 25),
            with_fold(off(untabled(t(1024, 0, 37)), 110), 47),
            with_fold(off(untabled(t(2048, 0, 48)), 118), 93),
            with_fold(off(untabled(t(4096, 0, 71)), 130), 178),
        ];
        let (limit, from) = pick(&intel);
        assert_eq!((limit, from), (256, 1024));
        assert_eq!(pick_unaligned(&intel, from), 4096);
        // Never sooner than aligned inputs, even where crc-fast off
        // alignment would win earlier.
        let odd = [
            with_fold(off(t(256, 110, 36), 10), 13),
            with_fold(off(untabled(t(1024, 0, 37)), 30), 47),
        ];
        assert_eq!(pick_unaligned(&odd, 1024), 1024);
        // Without a fold: where aligned ones go.
        assert_eq!(pick_unaligned(&[off(t(64, 20, 22), 80)], 64), 64);
        assert_eq!(pick_unaligned(&[], 256), 256);
    }

    #[test]
    fn the_measured_limits_are_on_the_ladder_and_cached() {
        let m = crc64_limit_measured();
        assert!(LADDER.contains(&m.limit), "{m:?}");
        assert!(m.limit <= TABLE_MAX, "{m:?}");
        assert!(LADDER.contains(&m.crc_fast_from), "{m:?}");
        assert!(m.limit <= m.crc_fast_from, "{m:?}");
        // (Past the ladder where the fold still leads at its top.)
        let top = LADDER[LADDER.len() - 1];
        assert!(
            LADDER.contains(&m.crc_fast_from_unaligned) || m.crc_fast_from_unaligned > top,
            "{m:?}"
        );
        assert!(m.crc_fast_from <= m.crc_fast_from_unaligned, "{m:?}");
        assert_eq!(m.timings.len(), LADDER.len());
        for t in &m.timings {
            assert_eq!(t.table.is_some(), t.len <= TABLE_MAX, "{t:?}");
            #[cfg(feature = "clmul")]
            assert_eq!(t.fold.is_some(), Clmul::detect().is_some(), "{t:?}");
            #[cfg(not(feature = "clmul"))]
            assert_eq!(t.fold, None);
        }
        if m.timings.iter().all(|t| t.fold.is_none()) {
            assert_eq!(m.limit, m.crc_fast_from);
            assert_eq!(m.crc_fast_from, m.crc_fast_from_unaligned);
        }
        assert_eq!(crc64_table_limit(), m.limit);
        assert_eq!(crc64_crc_fast_from(), m.crc_fast_from);
        assert_eq!(crc64_crc_fast_from_unaligned(), m.crc_fast_from_unaligned);
        #[cfg(feature = "clmul")]
        assert_eq!(clmul(), Clmul::detect());
    }
}
