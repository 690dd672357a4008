//! A one-shot CRC's choice of implementation as the range of lengths that
//! run on crc-fast, so that choosing costs a subtraction and a compare
//! before a direct call.
//!
//! Measured on AMD Zen 4 with `benches/paired-layouts 64 --group crc-32
//! --sizes 16,64,256 --ms 100` (the `paired` table over 64 link layouts):
//! decoding a [`Choice`] per call and then matching on the implementation
//! ran a CRC-32C at a mean 0.85 / 0.83 of crc-fast's own one-shot at 16 /
//! 64 B and a CRC-32 at 0.84 / 0.91 of crc32fast's; this runs them at
//! 0.89 / 0.88 and 0.88 / 0.94 (means). With crc32fast's hasher made once
//! ([`crc32fast_once`]) CRC-32's medians over 24 layouts went from 0.88 /
//! 0.95 to 0.95 / 0.97.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::Implementation;
use crate::choice::Choice;
use crate::crc::{CrcAlg, crc_choice, small_limit};
use crate::crc64_table;

/// A CRC's implementations resolved to the lengths that run on crc-fast
/// (`len` with `len - lo < span`, wrapping). The other lengths run on the
/// algorithm's other implementation: crc32fast for CRC-32, the `crc32c`
/// crate for CRC-32C, this crate's table for the CRC-64s.
///
/// Made once from a [`Choice`] (a session keeps one), it answers a
/// one-shot [`CrcPlan::checksum`] without decoding the choice again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CrcPlan {
    alg: CrcAlg,
    lo: usize,
    span: usize,
}

/// The lengths from `lo` up as `(lo, span)`; none (`(0, 0)`) from past
/// the longest slice, so that no plan has the `lo` of [`UNMEASURED`].
const fn from(lo: usize) -> (usize, usize) {
    if lo == 0 {
        (0, usize::MAX)
    } else if lo > isize::MAX as usize {
        (0, 0)
    } else {
        (lo, 0usize.wrapping_sub(lo))
    }
}

/// Whether a `len`-byte input runs on crc-fast.
#[inline(always)]
const fn on_crc_fast(lo: usize, span: usize, len: usize) -> bool {
    len.wrapping_sub(lo) < span
}

/// Expands to a match on `$alg` whose every arm calls
/// `$run($($arg,)* crc_fast_fn, other_fn)` with that algorithm's two
/// one-shots as closures: with the algorithm a constant in each arm,
/// crc-fast's typed one-shots (`inline(always)`) fold its own dispatch.
macro_rules! per_alg {
    ($alg:expr, $run:ident($($arg:expr),*)) => {{
        use crc_fast::CrcAlgorithm as A;
        match $alg {
            CrcAlg::Crc32IsoHdlc => $run(
                $($arg,)*
                |d: &[u8]| u64::from(crc_fast::crc32_iso_hdlc(d)),
                |d: &[u8]| u64::from(crc32fast_once(d)),
            ),
            CrcAlg::Crc32Iscsi => $run(
                $($arg,)*
                |d: &[u8]| u64::from(crc_fast::crc32_iscsi(d)),
                |d: &[u8]| u64::from(crc32c::crc32c(d)),
            ),
            CrcAlg::Crc64Nvme => $run(
                $($arg,)*
                |d: &[u8]| crc_fast::crc64_nvme(d),
                |d: &[u8]| crc64_table::NVME.checksum(d),
            ),
            CrcAlg::Crc64Xz => $run(
                $($arg,)*
                |d: &[u8]| crc_fast::checksum(A::Crc64Xz, d),
                |d: &[u8]| crc64_table::XZ.checksum(d),
            ),
            CrcAlg::Crc64GoIso => $run(
                $($arg,)*
                |d: &[u8]| crc_fast::checksum(A::Crc64GoIso, d),
                |d: &[u8]| crc64_table::GO_ISO.checksum(d),
            ),
        }
    }};
}

/// crc32fast's one-shot CRC-32 of `data` without its per-call CPU check:
/// `crc32fast::hash` makes a `Hasher`, which asks for up to eight CPU
/// features each time; this clones one made once.
#[inline(always)]
fn crc32fast_once(data: &[u8]) -> u32 {
    let mut h = match CRC32FAST.get() {
        Some(h) => h.clone(),
        None => crc32fast_cold(),
    };
    h.update(data);
    h.finalize()
}

/// The `Hasher` [`crc32fast_once`] clones (its CPU features checked once).
static CRC32FAST: OnceLock<crc32fast::Hasher> = OnceLock::new();

#[cold]
#[inline(never)]
fn crc32fast_cold() -> crc32fast::Hasher {
    CRC32FAST.get_or_init(crc32fast::Hasher::new).clone()
}

/// `alg`'s implementation other than crc-fast: crc32fast, the `crc32c`
/// crate, or (named `RustCrypto`, not an implementation that is chosen)
/// this crate's CRC-64 table.
pub(crate) const fn other(alg: CrcAlg) -> Implementation {
    match alg {
        CrcAlg::Crc32IsoHdlc => Implementation::Crc32Fast,
        CrcAlg::Crc32Iscsi => Implementation::Crc32c,
        CrcAlg::Crc64Nvme | CrcAlg::Crc64Xz | CrcAlg::Crc64GoIso => Implementation::RustCrypto,
    }
}

impl CrcPlan {
    /// `alg` on `choice`; an implementation that does not run `alg` means
    /// crc-fast. A CRC-64 runs inputs under its measured table limit on the
    /// table and the rest on crc-fast, whatever `choice` says.
    pub fn new(alg: CrcAlg, choice: Choice) -> CrcPlan {
        if alg.width() == 64 {
            let (lo, span) = from(small_limit(alg));
            return CrcPlan { alg, lo, span };
        }
        let other = other(alg);
        let (lo, span) = match (choice.small != other, choice.large != other) {
            (true, true) => (0, usize::MAX),
            (false, false) => (0, 0),
            // Small inputs are those up to `small_max` bytes.
            (true, false) => (0, choice.small_max.saturating_add(1)),
            (false, true) => match choice.small_max.checked_add(1) {
                Some(lo) => from(lo),
                None => (0, 0),
            },
        };
        CrcPlan { alg, lo, span }
    }

    /// [`crc_choice`]'s plan (measured once a process).
    pub fn measured(alg: CrcAlg) -> CrcPlan {
        CrcPlan::new(alg, crc_choice(alg))
    }

    /// The algorithm.
    pub fn alg(&self) -> CrcAlg {
        self.alg
    }

    /// Whether a `len`-byte input runs on crc-fast (else on the
    /// algorithm's other implementation, see [`CrcPlan`]), for the lengths
    /// a slice can have (up to `isize::MAX`).
    pub fn runs_on_crc_fast(&self, len: usize) -> bool {
        on_crc_fast(self.lo, self.span, len)
    }

    /// The implementation a `len`-byte input runs on ([`other`] where not
    /// crc-fast).
    #[inline]
    pub(crate) fn implementation_for(&self, len: usize) -> Implementation {
        if self.runs_on_crc_fast(len) {
            Implementation::CrcFast
        } else {
            other(self.alg)
        }
    }

    /// The CRC of `data`.
    #[inline(always)]
    pub fn checksum(&self, data: &[u8]) -> u64 {
        per_alg!(self.alg, run_planned(self.lo, self.span, data))
    }
}

#[inline(always)]
fn run_planned(
    lo: usize,
    span: usize,
    data: &[u8],
    fast: impl FnOnce(&[u8]) -> u64,
    other: impl FnOnce(&[u8]) -> u64,
) -> u64 {
    if on_crc_fast(lo, span, data.len()) {
        fast(data)
    } else {
        other(data)
    }
}

/// [`CrcPlan::measured`] for each algorithm as `(lo, span)`; `lo` is
/// [`UNMEASURED`] (and `span` 0) until the first call makes it.
static MEASURED: [(AtomicUsize, AtomicUsize); CrcAlg::ALL.len()] =
    [const { (AtomicUsize::new(UNMEASURED), AtomicUsize::new(0)) }; CrcAlg::ALL.len()];

/// The `lo` of a plan not made yet.
const UNMEASURED: usize = usize::MAX;

/// The CRC of `data` on [`CrcPlan::measured`], read from [`MEASURED`].
#[inline(always)]
pub(crate) fn checksum_measured(alg: CrcAlg, data: &[u8]) -> u64 {
    // The algorithm first, so that each arm is one range check before two
    // direct calls: matching on it again after the check cost 0.5 ns of a
    // 5.7 ns CRC-32 at 16 bytes on AMD Zen 4.
    per_alg!(alg, run_measured(alg, data))
}

#[inline(always)]
fn run_measured(
    alg: CrcAlg,
    data: &[u8],
    fast: impl FnOnce(&[u8]) -> u64,
    other: impl FnOnce(&[u8]) -> u64,
) -> u64 {
    let (lo, span) = &MEASURED[alg as usize];
    let lo = lo.load(Ordering::Relaxed);
    if on_crc_fast(lo, span.load(Ordering::Relaxed), data.len()) {
        fast(data)
    } else if lo != UNMEASURED {
        other(data)
    } else {
        checksum_cold(alg, data)
    }
}

#[cold]
#[inline(never)]
fn checksum_cold(alg: CrcAlg, data: &[u8]) -> u64 {
    let plan = CrcPlan::measured(alg);
    let (lo, span) = &MEASURED[alg as usize];
    // Relaxed: another thread may see either value old or new, in any
    // mix; every mix picks one of the algorithm's implementations, and
    // each gives the same CRC (the old `lo` means the cold path again).
    span.store(plan.span, Ordering::Relaxed);
    lo.store(plan.lo, Ordering::Relaxed);
    plan.checksum(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn choice(small: Implementation, large: Implementation, small_max: usize) -> Choice {
        Choice {
            small,
            large,
            small_max,
        }
    }

    #[test]
    fn a_plan_runs_each_length_where_its_choice_says() {
        use Implementation::{Crc32Fast as Other, CrcFast as Fast, RustCrypto};
        let alg = CrcAlg::Crc32IsoHdlc;
        let lens = [0, 1, 15, 16, 17, 4095, 4096, 4097, 1 << 20, usize::MAX - 1];
        for small_max in [0, 16, 4096, usize::MAX - 1, usize::MAX] {
            // RustCrypto does not run a CRC: it means crc-fast.
            for (small, large) in [
                (Fast, Fast),
                (Fast, Other),
                (Other, Fast),
                (Other, Other),
                (RustCrypto, Other),
                (Other, RustCrypto),
            ] {
                let c = choice(small, large, small_max);
                let plan = CrcPlan::new(alg, c);
                for len in lens {
                    assert_eq!(
                        plan.runs_on_crc_fast(len),
                        c.for_len(len) != Other,
                        "{c:?} at {len}"
                    );
                }
            }
        }
    }

    #[test]
    fn no_plan_reads_as_unmeasured() {
        use Implementation::{Crc32Fast as Other, CrcFast as Fast};
        for small_max in [
            0,
            1,
            isize::MAX as usize,
            usize::MAX - 2,
            usize::MAX - 1,
            usize::MAX,
        ] {
            for (small, large) in [(Fast, Fast), (Fast, Other), (Other, Fast), (Other, Other)] {
                let plan = CrcPlan::new(CrcAlg::Crc32IsoHdlc, choice(small, large, small_max));
                assert_ne!(plan.lo, UNMEASURED, "{small:?} {large:?} {small_max}");
            }
        }
    }

    #[test]
    fn a_crc64_plan_runs_its_table_under_the_measured_limit() {
        let limit = small_limit(CrcAlg::Crc64Nvme);
        let plan = CrcPlan::new(CrcAlg::Crc64Nvme, Choice::one(Implementation::Crc32c));
        for len in
            [0, 1, 16, 64, 1 << 20]
                .into_iter()
                .chain([limit.saturating_sub(1), limit, limit + 1])
        {
            assert_eq!(plan.runs_on_crc_fast(len), len >= limit, "{len}");
        }
    }

    /// crc32fast's kernels part at 16, 128, 256 and 2048 B (and the
    /// AVX-512 one's tail at 2048 + 128): every length to 4500 B, at two
    /// alignments, and lengths either side of 8 and 64 KiB.
    #[test]
    fn crc32fast_once_is_crc32fast_hash_at_every_length() {
        let reference = crc::Crc::<u32, crc::Table<16>>::new(&crc::CRC_32_ISO_HDLC);
        let data: Vec<u8> = (0..70_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for len in (0..=4_500).chain([8_191, 8_192, 8_193, 65_535, 65_536, 65_537, 69_999]) {
            for off in [0, 1] {
                let d = &data[off..off + len];
                assert_eq!(
                    crc32fast_once(d),
                    reference.checksum(d),
                    "{len} B at +{off}"
                );
                assert_eq!(crc32fast_once(d), crc32fast::hash(d), "{len} B at +{off}");
            }
        }
        assert_eq!(crc32fast_once(b"123456789"), 0xcbf4_3926);
    }

    #[test]
    fn each_plan_and_the_measured_one_give_the_reference_crc() {
        let data: Vec<u8> = (0..5000u32).map(|i| (i * 31 + 7) as u8).collect();
        for alg in CrcAlg::ALL {
            let want = |d: &[u8]| {
                let mut c = crc_fast::Digest::new(alg.fast());
                c.update(d);
                c.finalize()
            };
            for len in [0, 1, 7, 16, 63, 64, 255, 256, 1000, 5000] {
                let d = &data[..len];
                assert_eq!(checksum_measured(alg, d), want(d), "{alg} measured {len}");
                for imp in Implementation::CRC
                    .iter()
                    .chain(Implementation::ALL)
                    .copied()
                {
                    for small_max in [0, 64, usize::MAX] {
                        let c = choice(imp, Implementation::Crc32c, small_max);
                        assert_eq!(
                            CrcPlan::new(alg, c).checksum(d),
                            want(d),
                            "{alg} {c:?} {len}"
                        );
                        let c = choice(Implementation::Crc32Fast, imp, small_max);
                        assert_eq!(
                            CrcPlan::new(alg, c).checksum(d),
                            want(d),
                            "{alg} {c:?} {len}"
                        );
                    }
                }
            }
        }
    }
}
