//! A one-shot CRC's choice of implementation as the lengths that run on
//! crc-fast (those under one bound and those from another), so that
//! choosing costs a load and a compare before a direct call where crc-fast
//! runs every length or the small ones.
//!
//! Measured on AMD Zen 4 with `benches/paired-layouts 64 --group crc-32
//! --sizes 16,64,256 --ms 100` (the `paired` table over 64 link layouts):
//! decoding a [`Choice`] per call and then matching on the implementation
//! ran a CRC-32C at a mean 0.85 / 0.83 of crc-fast's own one-shot at 16 /
//! 64 B and a CRC-32 at 0.84 / 0.91 of crc32fast's; a range check
//! (`len - lo < span`, two loads) ran them at 0.89 / 0.88 and 0.88 / 0.94
//! (means). With crc32fast's hasher made once ([`crc32fast_once`])
//! CRC-32's medians over 24 layouts went from 0.88 / 0.95 to 0.95 / 0.97.
//! Testing `len < below` first, with `from` read only past it, moved
//! CRC-32C's medians over 32 layouts (`--group crc --sizes 16,64,256`)
//! from 0.905 / 0.885 / 0.96 to 0.905–0.925 / 0.94 / 0.99 at 16 / 64 /
//! 256 B in two runs (means 0.918 / 0.897 / 0.962 to 0.915–0.927 /
//! 0.913–0.923 / 0.987–0.989).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::Implementation;
use crate::choice::Choice;
use crate::crc::{CrcAlg, crc_choice, small_limit};
use crate::crc64;

/// A CRC's implementations resolved to the lengths that run on crc-fast:
/// those under `below` and those from `from` up. The other lengths run on
/// the algorithm's other implementation: crc32fast for CRC-32, the
/// `crc32c` crate for CRC-32C, this crate's table or fold for the CRC-64s
/// (split at [`crate::choice::crc64_table_limit`]).
///
/// Made once from a [`Choice`] (a session keeps one), it answers a
/// one-shot [`CrcPlan::checksum`] without decoding the choice again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CrcPlan {
    alg: CrcAlg,
    below: usize,
    from: usize,
}

/// A `from` no slice reaches (a slice has at most `isize::MAX` bytes),
/// and not [`UNMEASURED`].
const NEVER: usize = isize::MAX as usize + 1;

/// `from` for crc-fast from `lo` bytes up.
const fn from(lo: usize) -> usize {
    if lo > NEVER { NEVER } else { lo }
}

/// Whether a `len`-byte input runs on crc-fast.
#[inline(always)]
const fn on_crc_fast(below: usize, from: usize, len: usize) -> bool {
    len < below || len >= from
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
                |d: &[u8]| u64::from(if crc32_keeps(d) {
                    crc32fast_once(d)
                } else {
                    crc_fast::crc32_iso_hdlc(d)
                }),
                |d: &[u8]| u64::from(crc32fast_once(d)),
            ),
            CrcAlg::Crc32Iscsi => $run(
                $($arg,)*
                |d: &[u8]| u64::from(crc_fast::crc32_iscsi(d)),
                |d: &[u8]| u64::from(crc32c::crc32c(d)),
            ),
            CrcAlg::Crc64Nvme => $run(
                $($arg,)*
                |d: &[u8]| if crc64::fold_takes(d) {
                    crc64::NVME.checksum(d)
                } else {
                    crc_fast::crc64_nvme(d)
                },
                |d: &[u8]| crc64::NVME.checksum(d),
            ),
            CrcAlg::Crc64Xz => $run(
                $($arg,)*
                |d: &[u8]| if crc64::fold_takes(d) {
                    crc64::XZ.checksum(d)
                } else {
                    crc_fast::checksum(A::Crc64Xz, d)
                },
                |d: &[u8]| crc64::XZ.checksum(d),
            ),
            CrcAlg::Crc64GoIso => $run(
                $($arg,)*
                |d: &[u8]| if crc64::fold_takes(d) {
                    crc64::GO_ISO.checksum(d)
                } else {
                    crc_fast::checksum(A::Crc64GoIso, d)
                },
                |d: &[u8]| crc64::GO_ISO.checksum(d),
            ),
        }
    }};
}

/// Whether a CRC-32/ISO-HDLC input the choice sends to crc-fast runs on
/// crc32fast instead: crc-fast would take 64 bytes or more of it a block
/// at a time, and it is short of the length measured for those
/// ([`crate::crc32_unaligned`]).
#[inline(always)]
pub(crate) fn crc32_keeps(data: &[u8]) -> bool {
    crate::crc_fast_blocks::mostly_left_over(
        data,
        crate::crc32_unaligned::crc32_crc_fast_from_unaligned,
    )
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

/// `alg`'s implementation other than crc-fast for a `len`-byte input:
/// crc32fast, the `crc32c` crate, or this crate's CRC-64 fold or table
/// (the table named `RustCrypto`: neither is chosen, both measured).
pub(crate) fn other(alg: CrcAlg, len: usize) -> Implementation {
    match alg {
        CrcAlg::Crc32IsoHdlc => Implementation::Crc32Fast,
        CrcAlg::Crc32Iscsi => Implementation::Crc32c,
        CrcAlg::Crc64Nvme | CrcAlg::Crc64Xz | CrcAlg::Crc64GoIso => crc64::implementation_for(len),
    }
}

impl CrcPlan {
    /// `alg` on `choice`; an implementation that does not run `alg` means
    /// crc-fast. A CRC-64 runs inputs under its measured table limit on the
    /// table and the rest on crc-fast, whatever `choice` says.
    pub fn new(alg: CrcAlg, choice: Choice) -> CrcPlan {
        if alg.width() == 64 {
            let from = from(small_limit(alg));
            return CrcPlan {
                alg,
                below: 0,
                from,
            };
        }
        let other = other(alg, 0);
        let (below, from) = match (choice.small != other, choice.large != other) {
            (true, true) => (usize::MAX, NEVER),
            (false, false) => (0, NEVER),
            // Small inputs are those up to `small_max` bytes.
            (true, false) => (choice.small_max.saturating_add(1), NEVER),
            (false, true) => (0, from(choice.small_max.saturating_add(1))),
        };
        CrcPlan { alg, below, from }
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
        on_crc_fast(self.below, self.from, len)
    }

    /// The implementation a `len`-byte input runs on ([`other`] where not
    /// crc-fast).
    #[inline]
    pub(crate) fn implementation_for(&self, len: usize) -> Implementation {
        if self.runs_on_crc_fast(len) {
            Implementation::CrcFast
        } else {
            other(self.alg, len)
        }
    }

    /// The CRC of `data`.
    #[inline(always)]
    pub fn checksum(&self, data: &[u8]) -> u64 {
        per_alg!(self.alg, run_planned(self.below, self.from, data))
    }
}

#[inline(always)]
fn run_planned(
    below: usize,
    from: usize,
    data: &[u8],
    fast: impl FnOnce(&[u8]) -> u64,
    other: impl FnOnce(&[u8]) -> u64,
) -> u64 {
    if on_crc_fast(below, from, data.len()) {
        fast(data)
    } else {
        other(data)
    }
}

/// [`CrcPlan::measured`] for each algorithm as `(below, from)`; `from`
/// is [`UNMEASURED`] (and `below` 0) until the first call makes it.
static MEASURED: [Slot; CrcAlg::ALL.len()] =
    [const { (AtomicUsize::new(0), AtomicUsize::new(UNMEASURED)) }; CrcAlg::ALL.len()];

/// The `from` of a plan not made yet.
const UNMEASURED: usize = usize::MAX;

/// The CRC of `data` on [`CrcPlan::measured`], read from [`MEASURED`].
#[inline(always)]
pub(crate) fn checksum_measured(alg: CrcAlg, data: &[u8]) -> u64 {
    // The algorithm first, so that each arm is one range check before two
    // direct calls: matching on it again after the check cost 0.5 ns of a
    // 5.7 ns CRC-32 at 16 bytes on AMD Zen 4.
    per_alg!(alg, run_measured(&MEASURED[alg as usize], alg, data))
}

/// A plan as [`MEASURED`] keeps it: `(below, from)`.
type Slot = (AtomicUsize, AtomicUsize);

/// Where crc-fast runs every length (CRC-32C on AMD Zen 4) or the small
/// ones, the one load of `below` and a compare decide.
#[inline(always)]
fn run_measured(
    slot: &Slot,
    alg: CrcAlg,
    data: &[u8],
    fast: impl FnOnce(&[u8]) -> u64,
    other: impl FnOnce(&[u8]) -> u64,
) -> u64 {
    let (below, from) = slot;
    let len = data.len();
    // (`||` short-circuits: `from` is read only for lengths from `below`;
    // `len` is never `UNMEASURED`)
    if len < below.load(Ordering::Relaxed) || len >= from.load(Ordering::Relaxed) {
        fast(data)
    } else if from.load(Ordering::Relaxed) != UNMEASURED {
        other(data)
    } else {
        checksum_cold(slot, alg, data)
    }
}

#[cold]
#[inline(never)]
fn checksum_cold(slot: &Slot, alg: CrcAlg, data: &[u8]) -> u64 {
    let plan = CrcPlan::measured(alg);
    let (below, from) = slot;
    // Relaxed: another thread may see either value old or new, in any
    // mix; every mix picks one of the algorithm's implementations, and
    // each gives the same CRC (the old `from` means the cold path again).
    below.store(plan.below, Ordering::Relaxed);
    from.store(plan.from, Ordering::Relaxed);
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
        let lens = [
            0,
            1,
            15,
            16,
            17,
            4095,
            4096,
            4097,
            1 << 20,
            isize::MAX as usize - 1,
            isize::MAX as usize,
        ];
        for small_max in [
            0,
            16,
            4096,
            isize::MAX as usize - 1,
            isize::MAX as usize,
            usize::MAX - 1,
            usize::MAX,
        ] {
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
                assert_ne!(plan.from, UNMEASURED, "{small:?} {large:?} {small_max}");
            }
        }
    }

    /// The measured path runs each length where the plan's [`Choice`]
    /// says, a slot half stored by a racing first call runs one of the two
    /// or the cold path, and an unmeasured slot takes the cold path, which
    /// stores the measured plan.
    #[test]
    fn the_measured_path_runs_each_length_where_its_plan_says() {
        use Implementation::{Crc32c as Other, CrcFast as Fast};
        let alg = CrcAlg::Crc32Iscsi;
        let lens = [0, 1, 15, 16, 17, 64, 4095, 4096, 4097, 1 << 20];
        let data = vec![0x5a; 1 << 20];
        let run = |slot: &Slot, len: usize| run_measured(slot, alg, &data[..len], |_| 1, |_| 2);
        let crc = |len: usize| u64::from(crc_fast::crc32_iscsi(&data[..len]));
        for small_max in [0, 16, 4096, usize::MAX - 1, usize::MAX] {
            for (small, large) in [(Fast, Fast), (Fast, Other), (Other, Fast), (Other, Other)] {
                let c = choice(small, large, small_max);
                let plan = CrcPlan::new(alg, c);
                let slot = (AtomicUsize::new(plan.below), AtomicUsize::new(plan.from));
                for len in lens {
                    let want = if c.for_len(len) == Fast { 1 } else { 2 };
                    assert_eq!(run(&slot, len), want, "{c:?} at {len}");
                    // Half stored by a racing first call (either word
                    // new, the other as it starts): one implementation
                    // or the cold path, which computes the CRC itself.
                    for half in [
                        (AtomicUsize::new(plan.below), AtomicUsize::new(UNMEASURED)),
                        (AtomicUsize::new(0), AtomicUsize::new(plan.from)),
                    ] {
                        let got = run(&half, len);
                        assert!(got == 1 || got == 2 || got == crc(len), "{c:?} at {len}");
                    }
                }
            }
        }
        let slot: Slot = (AtomicUsize::new(0), AtomicUsize::new(UNMEASURED));
        assert_eq!(run(&slot, 64), crc(64));
        let plan = CrcPlan::measured(alg);
        assert_eq!(
            (slot.0.into_inner(), slot.1.into_inner()),
            (plan.below, plan.from)
        );
    }

    #[test]
    fn a_crc64_plan_runs_crc_fast_from_the_measured_length() {
        let m = crate::choice::crc64_limit_measured();
        let from = small_limit(CrcAlg::Crc64Nvme);
        assert_eq!(from, m.crc_fast_from);
        let plan = CrcPlan::new(CrcAlg::Crc64Nvme, Choice::one(Implementation::Crc32c));
        for len in [0, 1, 16, 64, 1 << 20].into_iter().chain(
            [m.limit, from]
                .into_iter()
                .flat_map(|l| [l.saturating_sub(1), l, l + 1]),
        ) {
            assert_eq!(plan.runs_on_crc_fast(len), len >= from, "{len}");
            let want = if len >= from {
                Implementation::CrcFast
            } else if len < m.limit {
                Implementation::RustCrypto
            } else {
                #[cfg(feature = "clmul")]
                let fold = Implementation::Crc64Fold;
                #[cfg(not(feature = "clmul"))]
                let fold = Implementation::RustCrypto;
                fold
            };
            assert_eq!(plan.implementation_for(len), want, "{len}");
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

    /// CRC-32/ISO-HDLC at every address offset mod 16, either side of the
    /// lengths where crc-fast's blocks and the measured limits part,
    /// one-shot (measured, and on a plan with crc-fast for every length)
    /// and streamed: the reference CRC; and crc32fast keeps exactly the
    /// inputs crc-fast would take 64 bytes or more of a block at a time.
    #[test]
    fn crc32_off_crc_fast_s_blocks_gives_the_reference_crc() {
        use crate::Crc;
        let from = crate::choice::crc32_crc_fast_from_unaligned();
        // (Past the ladder, up to 16 times its top: the edge is tested at
        // most 4 times past the top, 256 KiB.)
        let top =
            crate::choice::CRC32_UNALIGNED_LADDER[crate::choice::CRC32_UNALIGNED_LADDER.len() - 1];
        let edge = from.min(4 * top);
        let buf: Vec<u8> = (0..edge as u32 + 300)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let base = buf.as_ptr().align_offset(64).min(64);
        let reference = crc::Crc::<u32, crc::Table<16>>::new(&crc::CRC_32_ISO_HDLC);
        let all_fast = CrcPlan::new(CrcAlg::Crc32IsoHdlc, Choice::one(Implementation::CrcFast));
        for len in [0, 100, 255, 256, 257, 320, 1000, 1024, 1040, 2048, 4104]
            .into_iter()
            .chain([edge.saturating_sub(1), edge, edge + 8])
        {
            for off in 0..16 {
                let d = &buf[base + off..base + off + len];
                let want = u64::from(reference.checksum(d));
                assert_eq!(
                    checksum_measured(CrcAlg::Crc32IsoHdlc, d),
                    want,
                    "{len} +{off}"
                );
                assert_eq!(all_fast.checksum(d), want, "{len} +{off}");
                let mut c =
                    Crc::with_choice(CrcAlg::Crc32IsoHdlc, Choice::one(Implementation::CrcFast));
                let (a, b) = d.split_at(len / 2);
                c.update(a);
                c.update(b);
                assert_eq!(c.finalize(), want, "{len} +{off} streamed");
                let head = ((16 - off % 16) % 16).min(len);
                let left = head + (len - head) % 128;
                assert_eq!(
                    crc32_keeps(d),
                    len >= 256 && len < from && left >= 64,
                    "{len} +{off}"
                );
            }
        }
    }
}
