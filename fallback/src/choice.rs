//! Which implementation runs a mode on this machine: chosen by measuring
//! the candidates over a ladder of request sizes, once per process.
//!
//! A choice fixed at build time is wrong on some CPU: on AMD Zen 3 (VAES and
//! VPCLMULQDQ with AVX2, no AVX-512) ring's AES-GCM runs at twice
//! aws-lc's (aws-lc has no VAES + AVX2 GCM and falls back to its AES-NI
//! code), on AVX-512 machines aws-lc's is ahead from 4 KiB and ring's below
//! 2 KiB; RustCrypto's CTR and CBC beat aws-lc's on 16–64-byte requests on
//! Zen 3 and lose to them on Zen 4. So [`measured`] times every candidate
//! compiled in ([`Mode::candidates`]) at each of [`PROBES`] (16 B to
//! 16 KiB) and keeps two: the fastest at the smallest probes and the fastest
//! over the two largest ([`Class`]) — unless it beats the default (the
//! build's, with the CRC-32s' and GCM's seeded from the CPU:
//! [`seeded_choice`]) by less than [`MARGIN`], so that two near-equal
//! candidates do not trade places from one process to the next — with the
//! request length where the two cross ([`Choice::small_max`]), found
//! between the probes.
//!
//! Each mode is measured the first time a key of it is made without an
//! explicit implementation, in one to a few milliseconds a mode (the figures
//! are in [`Measured::took`]; a choice left in doubt by the first batch of
//! rounds takes up to [`MAX_BATCHES`]); [`measure`] runs it again and returns the
//! timings, [`Choice`] can be handed to a key's `with_choice` to skip it (a
//! server that loaded a profile), and `with_implementation` forces one
//! implementation.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::{Cbc, CrcAlg, Ctr, Error, Gcm, Implementation, Xts};

/// The CRC-64s are not a [`Mode`]: they run on this crate's table below a
/// measured length, then on its PCLMULQDQ fold (the `clmul` feature) below
/// another, and on crc-fast from there.
/// Where CRC-32/ISO-HDLC inputs crc-fast would take partly a block at a
/// time go to crc-fast after all (crc32fast below).
pub use crate::crc32_unaligned::{
    Crc32Unaligned, LADDER as CRC32_UNALIGNED_LADDER, crc32_crc_fast_from_unaligned,
    crc32_unaligned_measured,
};
pub use crate::crc64_limit::{
    Crc64Limit, Crc64Timing, LADDER as CRC64_LADDER, TABLE_MAX as CRC64_TABLE_MAX,
    crc64_crc_fast_from, crc64_crc_fast_from_unaligned, crc64_limit_measured, crc64_table_limit,
};

/// A mode whose CPU implementation is chosen per machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Mode {
    /// AES-GCM (seal and open run on the same implementation).
    Gcm,
    /// AES-CTR.
    Ctr,
    /// AES-CBC encryption (serial: one block after the other).
    Cbc,
    /// AES-CBC decryption (parallel), chosen apart from encryption: on
    /// AMD Zen 3 aws-lc encrypts 1 KiB 1.07× faster than the `cbc` crate
    /// and decrypts it 1.12× slower.
    CbcDecrypt,
    /// AES-XTS (AWS-LC's is XTS-AES-256 only: XTS-AES-128 and -192 keys
    /// run on RustCrypto whatever the choice).
    Xts,
    /// CRC-32/ISO-HDLC (zlib, Ethernet).
    Crc32,
    /// CRC-32/ISCSI (CRC-32C).
    Crc32c,
}

impl Mode {
    /// Every mode chosen by measurement.
    pub const ALL: [Mode; 7] = [
        Mode::Gcm,
        Mode::Ctr,
        Mode::Cbc,
        Mode::CbcDecrypt,
        Mode::Xts,
        Mode::Crc32,
        Mode::Crc32c,
    ];

    /// A short name for reports and profiles.
    pub const fn name(self) -> &'static str {
        match self {
            Mode::Gcm => "gcm",
            Mode::Ctr => "ctr",
            Mode::Cbc => "cbc",
            Mode::CbcDecrypt => "cbc-decrypt",
            Mode::Xts => "xts",
            Mode::Crc32 => "crc32",
            Mode::Crc32c => "crc32c",
        }
    }

    /// The mode of a CRC whose implementation is chosen (the CRC-32s; the
    /// CRC-64s run on this crate's table and fold and on crc-fast, split at
    /// measured lengths: [`crc64_limit_measured`]).
    pub const fn of_crc(alg: CrcAlg) -> Option<Mode> {
        match alg {
            CrcAlg::Crc32IsoHdlc => Some(Mode::Crc32),
            CrcAlg::Crc32Iscsi => Some(Mode::Crc32c),
            _ => None,
        }
    }

    /// The mode named `name` ([`Mode::name`]).
    pub fn from_name(name: &str) -> Option<Mode> {
        Mode::ALL.into_iter().find(|m| m.name() == name)
    }

    /// The implementations this build can run the mode on.
    pub fn candidates(self) -> &'static [Implementation] {
        match self {
            Mode::Gcm => Implementation::ALL,
            Mode::Ctr | Mode::Cbc | Mode::CbcDecrypt | Mode::Xts => &[
                Implementation::RustCrypto,
                #[cfg(feature = "aws-lc")]
                Implementation::AwsLc,
            ],
            Mode::Crc32 => &[Implementation::CrcFast, Implementation::Crc32Fast],
            Mode::Crc32c => &[Implementation::CrcFast, Implementation::Crc32c],
        }
    }

    /// The data unit of an XTS request of `len` bytes when measured (the
    /// whole of it up to 4 KiB: the 16 KiB probe is four 4 KiB units, as
    /// storage writes them).
    pub const fn probe_unit(len: usize) -> usize {
        if len > 4096 { 4096 } else { len }
    }
}

/// The boundary between the small and the large implementation when it
/// was not measured ([`Choice::split`], [`default_choice`], a profile
/// without one), and the one a measurement keeps when the two candidates
/// are within 5% of each other around it.
pub const SMALL_MAX: usize = 512;

/// The request lengths every mode is measured at: the smallest picks
/// [`Choice::small`], the largest [`Choice::large`], and those between
/// place [`Choice::small_max`].
pub const PROBES: [usize; 6] = [16, 64, 256, 1024, 4096, 16 << 10];

/// How much faster than the default a candidate must measure to be chosen
/// over it. Ties go to the default, so the choice is the same in every
/// process on a machine unless a candidate is clearly faster (on Zen 3,
/// ring's GCM measured 1.9–2.3× aws-lc's).
pub const MARGIN: f64 = 1.10;

/// The implementations of one mode: one for requests of at most
/// [`small_max`](Choice::small_max) bytes, one for the rest.
///
/// Two choices with the same implementation for both are equal whatever
/// their `small_max`.
#[derive(Debug, Clone, Copy, Eq)]
pub struct Choice {
    /// Requests of at most `small_max` bytes.
    pub small: Implementation,
    /// Longer requests.
    pub large: Implementation,
    /// The longest request that runs on `small`: measured, where the two
    /// cross (at most the largest of [`PROBES`]); else [`SMALL_MAX`].
    pub small_max: usize,
}

/// The `small_max` [`Choice::encode`] stores for that or longer (read back
/// as `usize::MAX`). Measured choices part at most at the largest probe.
const MAX_CODED: u32 = u16::MAX as u32;

impl PartialEq for Choice {
    fn eq(&self, other: &Choice) -> bool {
        self.small == other.small
            && self.large == other.large
            && (self.small == self.large || self.small_max == other.small_max)
    }
}

impl core::hash::Hash for Choice {
    fn hash<H: core::hash::Hasher>(&self, state: &mut H) {
        self.small.hash(state);
        self.large.hash(state);
        if self.small != self.large {
            self.small_max.hash(state);
        }
    }
}

impl Choice {
    /// One implementation for every size.
    pub const fn one(imp: Implementation) -> Choice {
        Choice {
            small: imp,
            large: imp,
            small_max: SMALL_MAX,
        }
    }

    /// `small` for requests of at most [`SMALL_MAX`] bytes, `large` for
    /// the rest.
    pub const fn split(small: Implementation, large: Implementation) -> Choice {
        Choice {
            small,
            large,
            small_max: SMALL_MAX,
        }
    }

    /// The choice as a non-zero `u32` for the [`measured`] cache: a byte
    /// an implementation (its discriminant plus one),
    /// then `small_max` in 16 bits (exact up to 65,534 bytes, past every
    /// probe; longer reads back as `usize::MAX`).
    const fn encode(self) -> u32 {
        let max = if self.small_max >= MAX_CODED as usize {
            MAX_CODED
        } else {
            self.small_max as u32
        };
        (self.small as u32 + 1) | ((self.large as u32 + 1) << 8) | (max << 16)
    }

    /// The choice [`Choice::encode`] made `code`, or `None` for 0.
    #[inline]
    fn decode(code: u32) -> Option<Choice> {
        let imp = |byte: u32| {
            Implementation::from_index(usize::try_from(byte & 0xff).ok()?.checked_sub(1)?)
        };
        Some(Choice {
            small: imp(code)?,
            large: imp(code >> 8)?,
            small_max: match code >> 16 {
                MAX_CODED => usize::MAX,
                max => max as usize,
            },
        })
    }

    /// The implementation a `len`-byte request runs on.
    #[inline]
    pub fn for_len(&self, len: usize) -> Implementation {
        if len <= self.small_max {
            self.small
        } else {
            self.large
        }
    }
}

/// What a keyed implementation runs on.
pub(crate) trait RunsOn {
    fn implementation(&self) -> Implementation;
}

/// A key on its implementations: one for small requests, and one for
/// large ones when the choice differs by size (boxed: a large request does
/// not feel the pointer).
pub(crate) struct Split<I> {
    small: I,
    large: Option<Box<I>>,
    small_max: usize,
}

impl<I: RunsOn> Split<I> {
    /// One implementation for every size.
    pub(crate) fn one(imp: I) -> Self {
        Split {
            small: imp,
            large: None,
            small_max: SMALL_MAX,
        }
    }

    /// The key on `choice`, made by `make`; an implementation `make` says
    /// is [`Error::Unavailable`] for this key is replaced by `default`.
    pub(crate) fn new(
        choice: Choice,
        default: Implementation,
        make: impl Fn(Implementation) -> Result<I, Error>,
    ) -> Result<Self, Error> {
        let make = |imp| match make(imp) {
            Err(Error::Unavailable { .. }) => make(default),
            other => other,
        };
        let small = make(choice.small)?;
        let large = if choice.large == choice.small {
            None
        } else {
            Some(Box::new(make(choice.large)?))
        };
        Ok(Split {
            small,
            large,
            small_max: choice.small_max,
        })
    }

    /// The implementation of small requests.
    pub(crate) fn small(&self) -> &I {
        &self.small
    }

    /// The implementation of a `len`-byte request.
    #[inline]
    pub(crate) fn for_len(&self, len: usize) -> &I {
        match &self.large {
            Some(large) if len > self.small_max => large,
            _ => &self.small,
        }
    }

    /// What small and large requests run on.
    pub(crate) fn choice(&self) -> Choice {
        let small = self.small.implementation();
        Choice {
            small,
            large: self.large.as_ref().map_or(small, |l| l.implementation()),
            small_max: self.small_max,
        }
    }
}

/// What one candidate took per request at each of [`PROBES`] (the least
/// of several rounds).
#[derive(Debug, Clone, PartialEq)]
pub struct Timing {
    /// The candidate.
    pub implementation: Implementation,
    /// Per request at each of [`PROBES`], in order.
    pub times: Vec<Duration>,
}

impl Timing {
    /// Per request at the smallest probe.
    pub fn small(&self) -> Duration {
        self.times.first().copied().unwrap_or(Duration::MAX)
    }

    /// Per request at the largest probe, from the two largest: their
    /// per-byte times averaged, scaled to the largest probe. The large
    /// class runs everything from the boundary up, and one probe alone
    /// flapped: CRC-32C's crc32c is 1.46× crc-fast at 1 KiB on AMD Zen 3
    /// but 1.08–1.27× at 16 KiB from one process to the next, across the
    /// [`MARGIN`], which left crc-fast running 1 KiB at 0.66× of crc32c;
    /// over 4 and 16 KiB it is 1.25× or more.
    pub fn large(&self) -> Duration {
        let n = self.times.len().min(PROBES.len());
        match n {
            0 => Duration::MAX,
            1 => self.times[0],
            _ => {
                let (a, b) = (self.times[n - 2], self.times[n - 1]);
                let scale = (PROBES[n - 1] / PROBES[n - 2]) as u32;
                a.saturating_mul(scale).saturating_add(b) / 2
            }
        }
    }
}

/// A mode's choice and the timings it was made from.
#[derive(Debug, Clone, PartialEq)]
pub struct Measured {
    /// The mode.
    pub mode: Mode,
    /// What was chosen.
    pub choice: Choice,
    /// Every candidate's timing, in the order they were given.
    pub timings: Vec<Timing>,
    /// How long the measurement took.
    pub took: Duration,
    /// How many batches of [`ROUNDS`] rounds it took: more than one when
    /// the first left the choice in doubt ([`MAX_BATCHES`]).
    pub batches: usize,
}

/// The build's preference for `mode`, which a candidate must beat by
/// [`MARGIN`] to replace: for the AES modes aws-lc where it is compiled in
/// (the fastest for GCM, CTR, CBC and XTS-AES-256 from 4 KiB on the
/// machines the crate was first tuned on), RustCrypto otherwise; for
/// CRC-32/ISO-HDLC crc32fast for small requests and crc-fast for large
/// ones, for CRC-32C crc-fast (the fastest on the AVX-512 machine).
pub const fn default_choice(mode: Mode) -> Choice {
    match mode {
        Mode::Crc32 => Choice::split(Implementation::Crc32Fast, Implementation::CrcFast),
        Mode::Crc32c => Choice::one(Implementation::CrcFast),
        #[cfg(feature = "aws-lc")]
        _ => Choice::one(Implementation::AwsLc),
        #[cfg(not(feature = "aws-lc"))]
        _ => Choice::one(Implementation::RustCrypto),
    }
}

/// The choice a measurement of `mode` keeps unless a candidate beats it by
/// the [`MARGIN`]: [`default_choice`], with the large class of the two
/// CRC-32s seeded from the CPU's features, and GCM's small class from
/// VAES and AVX2.
///
/// crc-fast's large-input CRC-32 code is AVX-512 (`avx512vl` and
/// `vpclmulqdq`); without it, crc32fast's folding and the `crc32c` crate's
/// three interleaved `crc32` streams are faster from 1 KiB. Measured, that
/// is a clear win for crc32fast (1.9× on AMD Zen 3) but a near one for
/// crc32c, whose lead over crc-fast on the 4 and 16 KiB probes moves
/// between 1.10× and 1.8× with the machine's load: against crc-fast as
/// the default, CRC-32C's large class fell back to crc-fast in 1 to 23 of
/// 60 fresh processes on Zen 3 (`choice-stability --fresh --mode crc32c`,
/// 2026-12-04), crc-fast/crc32c being the choice of the rest. Seeded
/// with crc32c, crc-fast must beat it by the margin to take it back. With
/// AVX-512 (AMD Zen 4, Intel Xeon family 6 model 167) crc-fast was the
/// fastest from 1 KiB for both, 2–2.5× crc32c's.
///
/// GCM's small requests run fastest on ring's VAES + AVX2 code on AMD Zen 3
/// (1.7–1.9× aws-lc) and Zen 4 (1.2–1.3×, ring 72–74 ns at 16 B against
/// aws-lc's 89–90), but on the Intel Xeon aws-lc led by 1.05–1.12×, so
/// neither can be the build's default for all. Against aws-lc as the
/// default, Zen 4 measured aws-lc for small GCM in 4 of 1000 fresh
/// processes of GCM alone and 4 of 500 of every mode (`choice-stability
/// --runs 500 --fresh`, 2026-12-04): in those, ring measured 80–86 ns at
/// 16 B through all three batches (a slow level of its own that lasts the
/// measurement; aws-lc 88–89), gains of 1.04–1.10, not over the margin. So
/// on every CPU with VAES and AVX2 the small class is seeded with ring,
/// which aws-lc must then beat by the margin. In another 1000 fresh
/// processes so seeded on Zen 4, all chose ring; the old default would
/// have strayed in 8 of them, and aws-lc's best gain over ring was 0.92.
///
/// On an Intel Xeon family 6 model 207 (AVX-512) the two are a near tie at
/// 16–64 B and ring leads by ~1.3× at 256 B (aws-lc runs CTR and GHASH as
/// two passes under 288 B); aws-lc's AVX-512 code, cold at the start of
/// each timed batch, measured 137–148 ns at 16 B against ring's 92–112
/// (~67–73 warm). Against aws-lc as the default, fresh processes chose
/// ring in 169 and 32 of 200 (`choice-stability --runs 200 --fresh --mode
/// gcm --limits 3`, two runs minutes apart, 2026-12-05), and those on
/// aws-lc ran 256 B at ~0.77 of ring. Seeded with ring there: 0 of 400,
/// and 0 of 200 beside a busy loop on the other core. The tie has a cause
/// a measurement cannot settle: on that VM aws-lc's AVX-512 seal has
/// spells of 0.2–2 s at ~1.8× its usual time (16 B: 107–123 ns against
/// 58–66; ring's stays at 74–89 ns), more or fewer of them with the
/// host's load (`gcm-spells` in crypto-offload-benches), so a process
/// chooses whichever state its measurement met: aws-lc in 60 of 200
/// processes at one hour and 77 of 100 at another, each choice within
/// 0.98 of the faster one averaged over time.
pub fn seeded_choice(mode: Mode) -> Choice {
    let default = default_choice(mode);
    match mode {
        Mode::Crc32 | Mode::Crc32c if !crc_fast_is_wide() => {
            let large = match mode {
                Mode::Crc32 => Implementation::Crc32Fast,
                _ => Implementation::Crc32c,
            };
            Choice { large, ..default }
        }
        #[cfg(feature = "ring")]
        Mode::Gcm if ring_leads_small_gcm() => Choice {
            small: Implementation::Ring,
            ..default
        },
        _ => default,
    }
}

/// Whether ring's VAES + AVX2 GCM is the seed for small requests: on every
/// x86-64 CPU with VAES and AVX2 ([`seeded_choice`]).
#[cfg(feature = "ring")]
fn ring_leads_small_gcm() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("vaes") && std::arch::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The value of `key` for the first processor in `cpuinfo` (the text of
/// `/proc/cpuinfo`, whose first block ends at a blank line), trimmed.
fn cpuinfo_field<'a>(cpuinfo: &'a str, key: &str) -> Option<&'a str> {
    cpuinfo
        .lines()
        .map_while(|l| l.split_once(':'))
        .find(|(k, _)| k.trim() == key)
        .map(|(_, v)| v.trim())
}

/// [`seeded_choice`] for a measurement among `imps`: a seeded class whose
/// implementation is not among them (ring left out, or failing to key)
/// keeps [`default_choice`]'s, as it did before the seed, rather than leave
/// the first candidate listed to stand in for it.
fn seeded_among(mode: Mode, imps: &[Implementation]) -> Choice {
    let (seed, default) = (seeded_choice(mode), default_choice(mode));
    let among = |seeded: Implementation, default: Implementation| {
        if imps.contains(&seeded) {
            seeded
        } else {
            default
        }
    };
    Choice {
        small: among(seed.small, default.small),
        large: among(seed.large, default.large),
        small_max: seed.small_max,
    }
}

/// Whether crc-fast runs its widest CRC-32 code on this CPU (on x86_64
/// its AVX-512 code).
fn crc_fast_is_wide() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("vpclmulqdq")
    }
    // Elsewhere (aarch64: PMULL) crc-fast's code is its fastest: the
    // build's default stands.
    #[cfg(not(target_arch = "x86_64"))]
    {
        true
    }
}

/// Rounds each candidate is timed in (interleaved, so that a clock or
/// frequency change lands on all of them); the least round counts.
pub const ROUNDS: usize = 7;

/// The most batches of [`ROUNDS`] rounds a measurement takes. A batch after
/// the first runs only while the choice is in doubt ([`in_doubt`]): the
/// fastest other candidate within [`DOUBT`] of the [`MARGIN`] against the
/// default, or two candidates that would replace the default within
/// [`DOUBT`] of each other; or while a choice that splits the sizes
/// between two implementations is not yet confirmed by a second batch
/// (`sample`). Each batch's rounds join the earlier ones (the least of
/// all counts), so a candidate that a neighbour slowed through one batch
/// gets more chances, and a clear choice of one implementation costs one
/// batch, a clear split two.
///
/// What it buys, measured with `choice-stability` (crypto-offload-benches)
/// on a 2-vCPU AMD Zen 3, one batch against up to three in alternation,
/// counting the choices that strayed from each mode's most common one.
/// Within one process it steadies the choice: 29 → 15 strays of 420
/// measurements on a quiet machine (XTS 12 → 5, CRC-32C 17 → 10), 4 → 1
/// of 420 beside a compiling CI run. Across fresh processes (`--fresh`) it
/// does not: 19 → 18 of 560 quiet, 32 → 30 of 560 beside the build —
/// nearly all CRC-32C, whose faster candidate at 16 B is a tie and for
/// large inputs changes with the neighbours' load (a busy sibling thread
/// slows the `crc32` instruction more than carry-less multiplies), and
/// XTS at 16 B, a tie. Those are conditions, not noise: a profile
/// (`offload calibrate`) fixes a server's choice. The extra batches cost
/// what they measure: CTR 1.0 → 2.1 ms, CBC decryption 0.9 → 2.3 ms, XTS
/// 2.0 → 5.4 ms, the others unchanged.
pub const MAX_BATCHES: usize = 3;

/// How near the [`MARGIN`] (or each other) candidates must measure for a
/// choice to be in doubt: within 10% (a factor of 1.1 either way).
pub const DOUBT: f64 = 1.10;

/// Requests a round at a `len`-byte probe: 128 KiB of them, from 8 to 64
/// requests.
const fn per_round(len: usize) -> usize {
    let n = (128 << 10) / if len == 0 { 1 } else { len };
    if n < 8 {
        8
    } else if n > 64 {
        64
    } else {
        n
    }
}

/// Times every candidate of `mode` and chooses.
pub fn measure(mode: Mode) -> Measured {
    measure_among(mode, mode.candidates())
}

/// Times `candidates` (those that run `mode`; the others are left out)
/// at every one of [`PROBES`] and chooses among them (the first listed
/// standing in for the default if the default is not among them).
pub fn measure_among(mode: Mode, candidates: &[Implementation]) -> Measured {
    measure_batches(mode, candidates, MAX_BATCHES)
}

/// [`measure_among`] with at most `max_batches` batches of rounds (at
/// least one): what the stability tool compares (`choice-stability` in
/// crypto-offload-benches).
pub fn measure_batches(mode: Mode, candidates: &[Implementation], max_batches: usize) -> Measured {
    let start = Instant::now();
    let mut runners: Vec<Runner> = candidates
        .iter()
        .filter_map(|&imp| Runner::new(mode, imp).ok())
        .collect();
    // At a 64-byte boundary whatever the allocator gives: crc-fast's CRC-32
    // is timed through the crate's dispatch, which sends inputs off a
    // 16-byte boundary to crc32fast (`crc_fast_blocks`), and the choice is
    // about inputs crc-fast takes whole.
    let mut whole = vec![0u8; PROBES[PROBES.len() - 1] + 64];
    let at = whole.as_ptr().align_offset(64).min(64);
    let buf = &mut whole[at..at + PROBES[PROBES.len() - 1]];
    // One untimed round first: page faults, lazy CPU detection, caches.
    for r in &mut runners {
        for len in PROBES {
            r.run(&mut buf[..len], 1);
        }
    }
    let imps: Vec<Implementation> = runners.iter().map(|r| r.imp).collect();
    let default = seeded_among(mode, &imps);
    let (timings, batches) = sample(&imps, default, max_batches, |times| {
        // Odd rounds run the candidates and the probes in reverse order, so
        // that no probe always follows the same code. In a fixed order,
        // crc32fast's 4 KiB CRC-32 (after crc-fast's 512-bit loops and its
        // own shorter probes) measured 61–101 ns instead of 52–54 through
        // all 7 rounds of 8 in 80 one-batch measurements on an Intel Xeon
        // family 6 model 207, a phase of each process that held for
        // milliseconds; in alternating order, 0 of 80 (2026-12-05).
        for round in 0..ROUNDS {
            // The k-th of `n` in this round's order.
            let nth = |k: usize, n: usize| if round % 2 == 0 { k } else { n - 1 - k };
            for i in 0..runners.len() {
                let i = nth(i, runners.len());
                for j in 0..PROBES.len() {
                    let j = nth(j, PROBES.len());
                    let len = PROBES[j];
                    let t = &mut times[i][j];
                    *t = (*t).min(runners[i].run(&mut buf[..len], per_round(len)));
                }
            }
        }
    });
    Measured {
        mode,
        choice: choose(&timings, default),
        timings,
        took: start.elapsed(),
        batches,
    }
}

/// Runs `batch` (which folds one batch of rounds into each candidate's
/// least times, in `imps`' order) once, then again while the choice is
/// [`in_doubt`] or a split's boundary is not yet confirmed, at most
/// `max_batches` times in all: the timings and how many batches ran.
///
/// A choice that splits the sizes between two implementations stops only
/// once a batch leaves it where the one before had it (boundary
/// included): the boundary rests on the probes where the two are nearest,
/// and there one slow batch moves it. On an Intel Xeon family 6 model 207
/// (2026-12-05) crc32fast's 4 KiB CRC-32 measured 63 ns instead of 51 in
/// about one batch of five, in spells lasting a few batches, at any
/// buffer placement; such a batch put crc-fast on 4 KiB (boundary
/// ~2.9 KiB instead of 8 KiB) at ~0.9 of crc32fast, and, that batch
/// leaving no class in doubt, it was the only one: 13 of 40 fresh
/// processes parted below 4 KiB (`offload probe`), 8 of 40 with the
/// second batch (the spells outlast some). A split costs a second batch.
fn sample(
    imps: &[Implementation],
    default: Choice,
    max_batches: usize,
    mut batch: impl FnMut(&mut [[Duration; PROBES.len()]]),
) -> (Vec<Timing>, usize) {
    let mut times = vec![[Duration::MAX; PROBES.len()]; imps.len()];
    let mut batches = 0;
    let mut before: Option<Choice> = None;
    loop {
        batch(&mut times);
        batches += 1;
        let timings = timings_of(imps, &times);
        let now = choose(&timings, default);
        let settled = now.small == now.large || before.is_some_and(|b| same_split(b, now));
        if batches >= max_batches || (settled && !in_doubt(&timings, default)) {
            return (timings, batches);
        }
        before = Some(now);
    }
}

/// Whether two choices run every probe on the same implementation: the
/// same two, parting between the same two probes (where between them
/// moves with the times, a few bytes from one batch to the next).
fn same_split(a: Choice, b: Choice) -> bool {
    let cut = |c: Choice| probes_up_to(c.small_max);
    a.small == b.small && a.large == b.large && (a.small == a.large || cut(a) == cut(b))
}

/// How many of [`PROBES`] a choice's small class runs: those of at most
/// `small_max` bytes (where the cut between the two classes lies).
fn probes_up_to(small_max: usize) -> usize {
    PROBES.iter().take_while(|&&p| p <= small_max).count()
}

/// Each of `imps` with its least times so far.
fn timings_of(imps: &[Implementation], times: &[[Duration; PROBES.len()]]) -> Vec<Timing> {
    imps.iter()
        .zip(times)
        .map(|(&implementation, times)| Timing {
            implementation,
            times: times.to_vec(),
        })
        .collect()
}

/// Whether `timings` leave the choice of either size class in doubt
/// ([`MAX_BATCHES`]): the best candidate other than the default within
/// [`DOUBT`] of beating it by the [`MARGIN`] ([`Class::gain`]), or, where
/// it beats it by nearly that, the second best within [`DOUBT`] of it.
pub fn in_doubt(timings: &[Timing], default: Choice) -> bool {
    doubtful(timings, default.small, Class::Small) || doubtful(timings, default.large, Class::Large)
}

/// A size class of a [`Choice`], as a measurement judges it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Class {
    /// Requests up to [`Choice::small_max`]: judged at the three smallest
    /// probes (16, 64 and 256 B; [`Class::gain`]).
    Small,
    /// Longer requests: judged on [`Timing::large`].
    Large,
}

impl Class {
    /// A candidate's time in this class, to rank candidates when there is
    /// no default to beat.
    pub fn time(self, t: &Timing) -> Duration {
        match self {
            Class::Small => t.small(),
            Class::Large => t.large(),
        }
    }

    /// How many times faster `candidate` is than `default` in this class
    /// (above 1: faster).
    ///
    /// The small class takes the gain at 16 B, capped by the greater of
    /// those at 64 and 256 B: a candidate replaces the default for small
    /// requests only if it beats it at 16 B *and* at one of the next two
    /// probes, so that one probe alone does not decide (nor, at 64 B, stop
    /// a candidate that wins at 16 and 256 B). At 16 B alone the choice
    /// strayed: in 4 of 100 fresh processes on AMD Zen 3 (2026-12-03)
    /// AWS-LC's XTS measured 94–97 ns at 16 B against its usual 58 (the
    /// machine has a slow level that lasts for hundreds of milliseconds
    /// and slows each implementation by a factor of its own) while
    /// RustCrypto's measured 59, and RustCrypto was chosen for requests up
    /// to 30–128 B, where at 64 and 256 B it was level or slower (85
    /// against 84, 132 against 121). The small choices that are clear wins
    /// are clear at all three probes (on Zen 3: RustCrypto's CTR and CBC
    /// decryption by 1.3–2.1×, ring's GCM by 1.7–1.9×) or at two of them
    /// (RustCrypto's CBC encryption: 2.4× at 16 B, 1.4× at 64 B, level at
    /// 256 B).
    pub fn gain(self, default: &Timing, candidate: &Timing) -> f64 {
        // (Equal times, even both zero on a clock too coarse to tell, are
        // a tie: 1.)
        let ratio = |d: Duration, c: Duration| {
            if d == c {
                1.0
            } else {
                d.as_secs_f64() / c.as_secs_f64().max(f64::MIN_POSITIVE)
            }
        };
        match self {
            Class::Small => {
                let n = default.times.len().min(candidate.times.len());
                let g = |j: usize| ratio(default.times[j], candidate.times[j]);
                match n {
                    0 => ratio(default.small(), candidate.small()),
                    1 => g(0),
                    2 => g(0).min(g(1)),
                    _ => g(0).min(g(1).max(g(2))),
                }
            }
            Class::Large => ratio(default.large(), candidate.large()),
        }
    }
}

/// [`in_doubt`] for one size class.
fn doubtful(timings: &[Timing], default: Implementation, class: Class) -> bool {
    let Some(d) = anchor(timings, default) else {
        return false;
    };
    let mut gains: Vec<f64> = timings
        .iter()
        .filter(|t| t.implementation != d.implementation)
        .map(|c| class.gain(d, c))
        .collect();
    // Best first.
    gains.sort_by(|a, b| b.total_cmp(a));
    let Some(&gain) = gains.first() else {
        return false;
    };
    let near_each_other = gains
        .get(1)
        .is_some_and(|&second| gain / second.max(f64::MIN_POSITIVE) < DOUBT);
    // In doubt from MARGIN / DOUBT (a tie, 1.0) up to MARGIN * DOUBT (1.21).
    let near_margin = (MARGIN / DOUBT..MARGIN * DOUBT).contains(&gain);
    near_margin || (gain >= MARGIN / DOUBT && near_each_other)
}

/// The choice `timings` make: the fastest for small requests and the
/// fastest for large ones ([`pick`]: each kept at `default`'s unless
/// another beats it by [`MARGIN`] in its [`Class`]), and, when those
/// differ, where one hands over to the other ([`boundary`]).
fn choose(timings: &[Timing], default: Choice) -> Choice {
    let small = pick(timings, default.small, Class::Small);
    let large = pick(timings, default.large, Class::Large);
    let of = |imp| timings.iter().find(|t| t.implementation == imp);
    let (Some(s), Some(l)) = (of(small), of(large)) else {
        // (Only when nothing was measured: the default as it is.)
        return Choice {
            small,
            large,
            small_max: default.small_max,
        };
    };
    if small == large {
        return Choice::one(small);
    }
    match boundary(&s.times, &l.times, default.small_max) {
        Some(small_max) => Choice {
            small,
            large,
            small_max,
        },
        // `small` (kept by the margin at the smallest probes) loses
        // wherever it matters: `large` runs everything.
        None => Choice::one(large),
    }
}

/// How much slower than the other the implementation running a probe may
/// be before [`boundary`] counts it as a loss: rounds on a shared machine
/// differ by a few percent, and a cut moved by such noise would differ
/// from one process to the next.
const TOLERANCE: f64 = 1.05;

/// The longest request `small` should run, from both implementations'
/// times at each of [`PROBES`]: `None` if `large` should run everything.
///
/// Each cut between probes (`small` runs the probes below it, `large` the
/// rest) loses, at each probe, by how much the one running it is slower
/// than the other beyond [`TOLERANCE`]; the cut that loses least wins, so
/// one noisy probe does not move it, and among equal cuts the one
/// `default_max` falls in, kept exactly, so near-equal implementations
/// leave the default boundary where it was. Any other cut is placed where
/// the straight lines between the two probes either side cross (their
/// geometric middle if noise has them not crossing there).
fn boundary(small: &[Duration], large: &[Duration], default_max: usize) -> Option<usize> {
    let n = PROBES.len().min(small.len()).min(large.len());
    let slower = |a: Duration, b: Duration| {
        let (a, b) = (a.as_secs_f64(), b.as_secs_f64());
        if a <= b {
            0.0
        } else {
            a / b.max(f64::MIN_POSITIVE)
        }
    };
    let loss_small = |j: usize| (slower(small[j], large[j]) - TOLERANCE).max(0.0);
    let loss_large = |j: usize| (slower(large[j], small[j]) - TOLERANCE).max(0.0);
    let loss = |cut: usize| -> f64 {
        (0..cut).map(loss_small).sum::<f64>() + (cut..n).map(loss_large).sum::<f64>()
    };
    let default_cut = probes_up_to(default_max).min(n);
    let least = (0..=n).map(loss).fold(f64::INFINITY, f64::min);
    let cut = (0..=n)
        .filter(|&c| loss(c) <= least)
        .min_by_key(|&c| c.abs_diff(default_cut))
        .unwrap_or(default_cut);
    if cut == default_cut {
        return Some(default_max);
    }
    if cut == 0 {
        return None;
    }
    if cut == n {
        return Some(PROBES[n - 1]);
    }
    // `small` runs probe cut - 1, `large` probe cut: between them.
    let (a, b) = (PROBES[cut - 1], PROBES[cut]);
    let gain = |j: usize| large[j].as_secs_f64() - small[j].as_secs_f64();
    let (ga, gb) = (gain(cut - 1), gain(cut));
    let at = if ga >= 0.0 && gb < 0.0 {
        a as f64 + (b - a) as f64 * ga / (ga - gb)
    } else {
        (a as f64 * b as f64).sqrt()
    };
    Some((at as usize).clamp(a, b - 1))
}

/// The candidate of `timings` that beats `default` by the most in `class`
/// ([`Class::gain`]; of equal gains the first listed), unless that is by
/// less than [`MARGIN`] ([`anchor`]).
fn pick(timings: &[Timing], default: Implementation, class: Class) -> Implementation {
    let Some(d) = anchor(timings, default) else {
        return default;
    };
    let mut best: Option<(f64, Implementation)> = None;
    for c in timings
        .iter()
        .filter(|t| t.implementation != d.implementation)
    {
        let gain = class.gain(d, c);
        if best.is_none_or(|(b, _)| gain > b) {
            best = Some((gain, c.implementation));
        }
    }
    match best {
        // (`>`: a tie, even at a clock too coarse to tell, keeps it.)
        Some((gain, imp)) if gain > MARGIN => imp,
        _ => d.implementation,
    }
}

/// The timing a choice keeps unless another beats it by the [`MARGIN`]:
/// `default`'s, or, when the default was not measured (a subset given to
/// [`measure_among`]), the first listed's, so that the rule is the same
/// and as steady from one measurement to the next; `None` if nothing was
/// measured.
fn anchor(timings: &[Timing], default: Implementation) -> Option<&Timing> {
    timings
        .iter()
        .find(|t| t.implementation == default)
        .or(timings.first())
}

/// `mode`'s choice on this machine, measured the first time it is asked
/// for in this process ([`measure`]) and the same afterwards.
///
/// After the first call this is one relaxed atomic load: a one-shot CRC of
/// 16 bytes takes 6 ns on crc32fast, and the `OnceLock` path (a call and an
/// acquire check) added 2–7 ns to it on AMD Zen 4.
#[inline]
pub fn measured(mode: Mode) -> Choice {
    match Choice::decode(CHOSEN[mode as usize].load(Ordering::Relaxed)) {
        Some(choice) => choice,
        None => measured_cold(mode),
    }
}

#[cold]
#[inline(never)]
fn measured_cold(mode: Mode) -> Choice {
    measured_full(mode).choice
}

/// Each mode's [`measured`] choice once made ([`Choice::encode`]; 0 before).
static CHOSEN: [AtomicU32; Mode::ALL.len()] = [const { AtomicU32::new(0) }; Mode::ALL.len()];

/// [`measured`] with its timings.
pub fn measured_full(mode: Mode) -> &'static Measured {
    static MEASURED: [OnceLock<Measured>; Mode::ALL.len()] =
        [const { OnceLock::new() }; Mode::ALL.len()];
    let m = MEASURED[mode as usize].get_or_init(|| measure(mode));
    // Every thread that gets here stores the same value; stored once, so
    // that callers of this function do not keep the cache line moving.
    let chosen = &CHOSEN[mode as usize];
    if chosen.load(Ordering::Relaxed) == 0 {
        chosen.store(m.choice.encode(), Ordering::Relaxed);
    }
    m
}

/// A keyed candidate and the request it is timed on.
struct Runner {
    imp: Implementation,
    key: Keyed,
}

// Short-lived (a measurement): the size difference does not matter.
#[allow(clippy::large_enum_variant)]
enum Keyed {
    Gcm(Gcm),
    Ctr(Ctr),
    Cbc(Cbc),
    CbcDecrypt(Cbc),
    Xts(Xts),
    Crc(CrcAlg, Choice),
}

impl Runner {
    fn new(mode: Mode, imp: Implementation) -> Result<Self, Error> {
        // A fixed key: the timing does not depend on it. XTS is timed with
        // two AES-256 keys (AWS-LC has no XTS-AES-128); the others with
        // AES-128, as GCM's choice was first made.
        let key = [0x5au8; 16];
        let mut xts_key = [0x5au8; 64];
        xts_key[32..].fill(0xa5);
        let runner = Runner {
            imp,
            key: match mode {
                Mode::Gcm => Keyed::Gcm(Gcm::with_implementation(&key, imp)?),
                Mode::Ctr => Keyed::Ctr(Ctr::with_implementation(&key, imp)?),
                Mode::Cbc => Keyed::Cbc(Cbc::with_implementation(&key, imp)?),
                Mode::CbcDecrypt => Keyed::CbcDecrypt(Cbc::with_implementation(&key, imp)?),
                Mode::Xts => Keyed::Xts(Xts::with_implementation(&xts_key, imp)?),
                Mode::Crc32 | Mode::Crc32c if !mode.candidates().contains(&imp) => {
                    return Err(Error::Unavailable {
                        alg: mode.name(),
                        implementation: imp,
                    });
                }
                Mode::Crc32 => Keyed::Crc(CrcAlg::Crc32IsoHdlc, Choice::one(imp)),
                Mode::Crc32c => Keyed::Crc(CrcAlg::Crc32Iscsi, Choice::one(imp)),
            },
        };
        // A candidate that fails a request is not one (its failures would
        // time as fast).
        runner.request(0, &mut [0; 64])?;
        Ok(runner)
    }

    /// One request over `buf`.
    #[inline]
    fn request(&self, i: usize, buf: &mut [u8]) -> Result<(), Error> {
        let iv = [i as u8; 16];
        match &self.key {
            Keyed::Gcm(k) => k.seal_in_place_detached(&[i as u8; 12], &[], buf).map(drop),
            Keyed::Ctr(k) => k.apply_keystream(&iv, buf),
            Keyed::Cbc(k) => k.encrypt(&iv, buf),
            Keyed::CbcDecrypt(k) => k.decrypt(&iv, buf),
            Keyed::Xts(k) => k.encrypt_units(&iv, Mode::probe_unit(buf.len()), buf),
            Keyed::Crc(alg, c) => {
                std::hint::black_box(crate::crc::checksum_with(*alg, *c, buf));
                Ok(())
            }
        }
    }

    /// Runs `n` requests over `buf`; the time a request.
    fn run(&mut self, buf: &mut [u8], n: usize) -> Duration {
        let start = Instant::now();
        for i in 0..n {
            std::hint::black_box(self.request(i, buf).ok());
        }
        start.elapsed() / n.max(1) as u32
    }
}

/// The optimisation level this crate was compiled at (`"0"`–`"3"`, `"s"`,
/// `"z"`; empty if the build did not say). A project's debug profile
/// builds its dependencies at `0` unless told otherwise, and then a 4 KiB
/// XTS request takes ~90 µs instead of ~2: measurement chooses among
/// unoptimised candidates, and a cost model calibrated there learns it.
pub const OPT_LEVEL: &str = env!("CRYPTO_OFFLOAD_FALLBACK_OPT_LEVEL");

/// Whether this crate (and so, normally, the AES and CRC crates under it)
/// was built without optimisation; the remedy, in the project's
/// `Cargo.toml`: `[profile.dev.package."*"]` `opt-level = 3`.
pub const fn built_unoptimised() -> bool {
    matches!(OPT_LEVEL.as_bytes(), b"0")
}

/// The CPU, and the features the implementations choose by, for reports
/// (`offload probe`, the benches): `CPU: <model> (family F model M); aes
/// pclmulqdq …; without avx512f …` (the model from `/proc/cpuinfo`, else
/// the architecture).
pub fn cpu_line() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |k: &str| cpuinfo_field(&info, k).map(str::to_owned);
    let model = field("model name").unwrap_or_else(|| std::env::consts::ARCH.to_owned());
    let family = match (field("cpu family"), field("model")) {
        (Some(f), Some(m)) => format!(" (family {f} model {m})"),
        _ => String::new(),
    };
    let (has, lacks) = cpu_features();
    let lacks = if lacks.is_empty() {
        String::new()
    } else {
        format!("; without {}", lacks.join(" "))
    };
    format!("CPU: {model}{family}; {}{lacks}", has.join(" "))
}

/// The CPU features the AES and CRC code paths choose by: (present, absent).
fn cpu_features() -> (Vec<&'static str>, Vec<&'static str>) {
    let mut has = Vec::new();
    let mut lacks = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! check {
            ($($f:tt),*) => {$(
                if std::arch::is_x86_feature_detected!($f) { has.push($f) } else { lacks.push($f) }
            )*};
        }
        check!(
            "aes",
            "pclmulqdq",
            "sse4.2",
            "avx2",
            "vaes",
            "vpclmulqdq",
            "avx512f"
        );
    }
    #[cfg(target_arch = "aarch64")]
    {
        macro_rules! check {
            ($($f:tt),*) => {$(
                if std::arch::is_aarch64_feature_detected!($f) { has.push($f) } else { lacks.push($f) }
            )*};
        }
        check!("aes", "pmull", "crc", "sha3");
    }
    (has, lacks)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A timing from `small_ns` at the first probe to `large_ns` at the
    /// last, in a straight line between.
    fn t(imp: Implementation, small_ns: u64, large_ns: u64) -> Timing {
        let (first, last) = (PROBES[0] as f64, PROBES[PROBES.len() - 1] as f64);
        let times = PROBES
            .iter()
            .map(|&p| {
                let f = (p as f64 - first) / (last - first);
                Duration::from_nanos(
                    (small_ns as f64 + (large_ns as f64 - small_ns as f64) * f) as u64,
                )
            })
            .collect();
        Timing {
            implementation: imp,
            times,
        }
    }

    /// The default stays unless a candidate beats it by the margin; a
    /// clear win moves the choice, per size class.
    #[test]
    fn the_build_says_its_optimisation_level() {
        // Set by build.rs from cargo's OPT_LEVEL; this workspace builds the
        // crate at 3 even in dev (the root Cargo.toml).
        assert!(
            ["0", "1", "2", "3", "s", "z"].contains(&OPT_LEVEL),
            "{OPT_LEVEL:?}"
        );
        assert_eq!(built_unoptimised(), OPT_LEVEL == "0");
        assert_eq!(OPT_LEVEL, "3");
    }

    #[test]
    fn the_large_class_is_judged_on_the_two_largest_probes() {
        // CRC-32C on Zen 3: crc32c 1.46x crc-fast at 4 KiB, 1.08x at 16 KiB.
        let at = |imp, t4k: u64, t16k: u64| {
            let mut times = vec![Duration::from_nanos(1); PROBES.len()];
            times[PROBES.len() - 2] = Duration::from_nanos(t4k);
            times[PROBES.len() - 1] = Duration::from_nanos(t16k);
            Timing {
                implementation: imp,
                times,
            }
        };
        let fast = at(Implementation::CrcFast, 420, 1080);
        let c = at(Implementation::Crc32c, 288, 1000);
        // (420·4 + 1080) / 2 = 1380 ns against (288·4 + 1000) / 2 = 1076.
        assert_eq!(fast.large(), Duration::from_nanos(1380));
        assert_eq!(
            pick(&[fast, c], Implementation::CrcFast, Class::Large),
            Implementation::Crc32c
        );
        let one = Timing {
            implementation: Implementation::CrcFast,
            times: vec![Duration::from_nanos(5)],
        };
        assert_eq!(one.large(), Duration::from_nanos(5));
    }

    #[test]
    fn a_candidate_must_beat_the_default_by_the_margin() {
        let d = Implementation::RustCrypto;
        for &other in Implementation::ALL.iter().filter(|&&i| i != d) {
            // 5% faster: within the margin, the default stays.
            let ts = [t(d, 100, 1000), t(other, 95, 950)];
            assert_eq!(pick(&ts, d, Class::Small), d);
            assert_eq!(pick(&ts, d, Class::Large), d);
            // 2x faster when small only: the classes part ways.
            let ts = [t(d, 100, 1000), t(other, 50, 990)];
            assert_eq!(pick(&ts, d, Class::Small), other);
            assert_eq!(pick(&ts, d, Class::Large), d);
            // The default not measured: the only one there.
            assert_eq!(pick(&ts[1..], d, Class::Large), other);
        }
        assert_eq!(pick(&[], d, Class::Small), d);
        assert_eq!(Choice::decode(0), None);
        for &a in Implementation::EVERY {
            for &b in Implementation::EVERY {
                for small_max in [0, 24, SMALL_MAX, 3000, 16384, 65534, usize::MAX] {
                    let c = Choice {
                        small: a,
                        large: b,
                        small_max,
                    };
                    let back = Choice::decode(c.encode()).unwrap();
                    assert_eq!(back, c, "{c:?}");
                }
            }
        }
        // A tie, even at zero (a clock too coarse to tell): the default.
        for &other in Implementation::ALL {
            let ts = [t(other, 0, 0), t(d, 0, 0)];
            assert_eq!(pick(&ts, d, Class::Small), d);
        }
    }

    /// A choice is in doubt when the best other candidate is within 10%
    /// of the margin against the default, or two would-be replacements
    /// are within 10% of each other; clear wins and clear losses are not.
    #[test]
    fn doubt_is_near_the_margin_or_between_replacements() {
        use Implementation::{Crc32Fast as D, CrcFast as B, RustCrypto as A};
        let def = Choice::one(D);
        // (default ns, other ns) at both ends: gains 1.0, 1.1, 1.2 are in
        // doubt; 0.8 (a clear loss) and 1.25 or more are not.
        for (d, a, doubt) in [
            (100, 100, true),
            (110, 100, true),
            (120, 100, true),
            (80, 100, false),
            (125, 100, false),
            (200, 100, false),
        ] {
            let ts = [t(D, d, d * 10), t(A, a, a * 10)];
            assert_eq!(in_doubt(&ts, def), doubt, "default {d} other {a}");
        }
        // In the small class only: in doubt.
        let ts = [
            at(D, [110, 330, 440, 1100, 8000, 20000]),
            at(A, [100, 300, 400, 1000, 4000, 10000]),
        ];
        assert!(in_doubt(&ts, def));
        // In the large class only: in doubt.
        let ts = [
            at(D, [300, 330, 440, 1100, 4400, 11000]),
            at(A, [100, 300, 400, 1000, 4000, 10000]),
        ];
        assert!(in_doubt(&ts, def));
        // Two replacements 2x faster than the default, 5% apart: which
        // one is in doubt; 50% apart, not.
        let ts = [t(D, 200, 2000), t(A, 100, 1000), t(B, 105, 1050)];
        assert!(in_doubt(&ts, def));
        let ts = [t(D, 200, 2000), t(A, 100, 1000), t(B, 150, 1500)];
        assert!(!in_doubt(&ts, def));
        // Two others 5% apart, both clearly slower than the default: no
        // doubt (the default stays whichever of them is faster).
        let ts = [t(D, 100, 1000), t(A, 200, 2000), t(B, 205, 2050)];
        assert!(!in_doubt(&ts, def));
        // No default measured (a subset): the first listed stands in for
        // it, so another within 10% of the margin against it is in doubt;
        // 50% faster or slower, not.
        assert!(in_doubt(&[t(A, 105, 1050), t(B, 100, 1000)], def));
        assert!(in_doubt(&[t(A, 100, 1000), t(B, 100, 1000)], def));
        assert!(!in_doubt(&[t(A, 150, 1500), t(B, 100, 1000)], def));
        assert!(!in_doubt(&[t(A, 100, 1000), t(B, 150, 1500)], def));
        // The default not measured, or alone: nothing to doubt.
        assert!(!in_doubt(&[t(A, 100, 1000)], def));
        assert!(!in_doubt(&[t(D, 100, 1000)], def));
    }

    /// A batch that a neighbour disturbed (one candidate 1.5x slow) leaves
    /// the choice in doubt; the next batch's rounds join it and the clear
    /// choice is made. A clear first batch is the only one; a true tie
    /// stops at `MAX_BATCHES`.
    #[test]
    fn a_disturbed_batch_is_followed_by_another_and_a_tie_is_bounded() {
        use Implementation::{Crc32Fast as D, RustCrypto as A};
        let imps = [D, A];
        let def = Choice::one(D);
        // Undisturbed, A is 1.3x faster than the default everywhere.
        let quiet = |imp| if imp == A { 100u64 } else { 130 };
        let fill = |times: &mut [[Duration; PROBES.len()]], slow: Implementation, by: f64| {
            for (&imp, times) in imps.iter().zip(times.iter_mut()) {
                let f = if imp == slow { by } else { 1.0 };
                for (t, len) in times.iter_mut().zip(PROBES) {
                    let ns = (quiet(imp) as f64 * f) as u64 * (len as u64 / 16);
                    *t = (*t).min(Duration::from_nanos(ns));
                }
            }
        };
        // First batch: A slowed 1.25x (gain 1.04: in doubt), then quiet.
        let mut n = 0;
        let (timings, batches) = sample(&imps, def, MAX_BATCHES, |times| {
            n += 1;
            fill(times, A, if n == 1 { 1.25 } else { 1.0 });
        });
        assert_eq!(batches, 2);
        assert_eq!(choose(&timings, def), Choice::one(A));
        // What one batch would have chosen: the default, at 0.77x of A.
        let mut once = vec![[Duration::MAX; PROBES.len()]; 2];
        fill(&mut once, A, 1.25);
        assert_eq!(choose(&timings_of(&imps, &once), def), Choice::one(D));
        // Each batch slows a different candidate: the timings are the
        // least of all rounds (batch 1's D, batch 2's A), not the last
        // batch's.
        let mut n = 0;
        let (timings, batches) = sample(&imps, def, MAX_BATCHES, |times| {
            n += 1;
            let mut batch = vec![[Duration::MAX; PROBES.len()]; 2];
            fill(&mut batch, if n == 1 { A } else { D }, 1.25);
            for (t, b) in times.iter_mut().zip(&batch) {
                for (t, b) in t.iter_mut().zip(b) {
                    *t = (*t).min(*b);
                }
            }
        });
        assert_eq!(batches, 2);
        assert_eq!(choose(&timings, def), Choice::one(A));
        assert_eq!(timings[0].small(), Duration::from_nanos(130));
        assert_eq!(timings[1].small(), Duration::from_nanos(100));
        // Clear at once: one batch.
        let (_, batches) = sample(&imps, def, MAX_BATCHES, |times| fill(times, D, 1.0));
        assert_eq!(batches, 1);
        // A tie that no batch settles: bounded.
        let (timings, batches) = sample(&imps, def, MAX_BATCHES, |times| fill(times, A, 1.3));
        assert_eq!(batches, MAX_BATCHES);
        assert_eq!(choose(&timings, def), def);
    }

    /// A split is confirmed by a second batch before it stands, and one
    /// batch slowed at the probe the boundary rests on does not move it:
    /// CRC-32 on an Intel Xeon family 6 model 207, where crc32fast's 4 KiB
    /// measured 63 ns instead of 51 in some batches.
    #[test]
    fn a_split_is_confirmed_and_one_slow_probe_does_not_move_its_boundary() {
        use Implementation::{Crc32Fast as S, CrcFast as L};
        let imps = [L, S];
        let def = Choice::split(S, L);
        let ns = |v: [u64; 6]| v.map(Duration::from_nanos);
        let fast = ns([14, 27, 30, 31, 49, 148]);
        let quiet = ns([7, 9, 9, 21, 46, 145]);
        let mut slow = quiet;
        slow[4] = Duration::from_nanos(63);
        let run = |batches: &[[Duration; 6]]| {
            let mut n = 0;
            sample(&imps, def, MAX_BATCHES, |times| {
                let b = batches[n.min(batches.len() - 1)];
                n += 1;
                for (t, new) in times[0].iter_mut().zip(fast) {
                    *t = (*t).min(new);
                }
                for (t, new) in times[1].iter_mut().zip(b) {
                    *t = (*t).min(new);
                }
            })
        };
        // What the slow batch alone chooses: crc-fast from below 4 KiB.
        let (alone, _) = sample(&imps, def, 1, |times| {
            times[0] = fast;
            times[1] = slow;
        });
        let cut = |t: &[Timing]| choose(t, def).small_max;
        assert!(cut(&alone) < 4096, "{}", cut(&alone));
        // Slow first, quiet next: the boundary moves past 4 KiB and a
        // third batch confirms it there.
        let (timings, batches) = run(&[slow, quiet]);
        assert!(cut(&timings) >= 4096, "{}", cut(&timings));
        assert_eq!(batches, 3);
        // Quiet throughout: 8 KiB as well (three batches: the large
        // class is a near tie, in doubt).
        let (timings, batches) = run(&[quiet]);
        assert!(cut(&timings) >= 4096);
        assert_eq!(batches, MAX_BATCHES);
        // A clear split (crc-fast 2x ahead on the large probes, as with
        // AVX-512 on AMD Zen 4): the second batch confirms the first.
        let wide = ns([14, 27, 30, 31, 24, 74]);
        let (timings, batches) = sample(&imps, def, MAX_BATCHES, |times| {
            times[0] = wide;
            times[1] = quiet;
        });
        assert_eq!(choose(&timings, def).large, L);
        assert_eq!(batches, 2);
        // One implementation throughout: one batch.
        let (_, batches) = sample(&imps, def, MAX_BATCHES, |times| {
            times[0] = wide;
            times[1] = wide.map(|t| t * 2);
        });
        assert_eq!(batches, 1);
        // The same choice across batches whatever the interpolated bytes.
        let a = Choice {
            small_max: 5000,
            ..def
        };
        assert!(same_split(
            a,
            Choice {
                small_max: 9000,
                ..def
            }
        ));
        assert!(!same_split(
            a,
            Choice {
                small_max: 3000,
                ..def
            }
        ));
        assert!(same_split(
            Choice::one(S),
            Choice {
                small_max: 1,
                ..Choice::one(S)
            }
        ));
    }

    /// Two different choices at the two ends part at the length where
    /// their lines cross; a default kept by the margin but slower
    /// everywhere runs nothing; one never slower keeps the whole ladder.
    #[test]
    fn the_small_and_large_choices_part_where_they_cross() {
        let (a, b) = (Implementation::RustCrypto, Implementation::CrcFast);
        // a: 20 + 1.0 ns/B; b: 100 + 0.5 ns/B: equal at 160 bytes.
        let line = |imp, fixed: f64, per_byte: f64| Timing {
            implementation: imp,
            times: PROBES
                .iter()
                .map(|&p| Duration::from_nanos((fixed + per_byte * p as f64) as u64))
                .collect(),
        };
        let ts = [line(a, 20.0, 1.0), line(b, 100.0, 0.5)];
        let c = choose(&ts, Choice::one(a));
        assert_eq!((c.small, c.large), (a, b));
        assert!((150..=170).contains(&c.small_max), "{c:?}");
        assert_eq!(c.for_len(c.small_max), a);
        assert_eq!(c.for_len(c.small_max + 1), b);
        // The default a, within the margin at the first probe but slower
        // at every one: b everywhere.
        let ts = [line(a, 105.0, 1.0), line(b, 100.0, 0.5)];
        assert_eq!(choose(&ts, Choice::one(a)), Choice::one(b));
        // Never slower, and clearly faster up to 1 KiB (within the
        // tolerance from 4 KiB): a at least to 1 KiB, not past 4 KiB.
        let ts = [line(a, 10.0, 0.5), line(b, 100.0, 0.5)];
        let max = boundary(&ts[0].times, &ts[1].times, SMALL_MAX).unwrap();
        assert!((1024..4096).contains(&max), "{max}");
        // Clearly faster everywhere: a to the last probe.
        let ts = [line(a, 10.0, 0.5), line(b, 100.0, 0.6)];
        assert_eq!(
            boundary(&ts[0].times, &ts[1].times, SMALL_MAX),
            Some(PROBES[5])
        );
        // One implementation: one choice, whatever small_max says.
        let ts = [line(a, 10.0, 0.5), line(b, 100.0, 1.0)];
        assert_eq!(choose(&ts, Choice::one(b)), Choice::one(a));
        assert_eq!(
            Choice {
                small_max: 7,
                ..Choice::one(a)
            },
            Choice::one(a)
        );
        // Nothing measured: the default.
        let d = Choice::split(a, b);
        assert_eq!(choose(&[], d), d);
    }

    fn at(imp: Implementation, ns: [u64; 6]) -> Timing {
        Timing {
            implementation: imp,
            times: ns.iter().map(|&n| Duration::from_nanos(n)).collect(),
        }
    }

    /// The default small implementation, kept by the margin at 16 B where
    /// it is a little slower, still runs the sizes it wins (64 B–1 KiB):
    /// whether it measured 5% slower or 5% faster at 16 B.
    #[test]
    fn a_default_a_little_slower_at_the_first_probe_keeps_what_it_wins() {
        let default = default_choice(Mode::Crc32);
        let (f, c) = (Implementation::Crc32Fast, Implementation::CrcFast);
        for first in [105, 95] {
            let ts = [
                at(f, [first, 60, 80, 150, 500, 2000]),
                at(c, [100, 90, 120, 200, 450, 1500]),
            ];
            let got = choose(&ts, default);
            assert_eq!((got.small, got.large), (f, c), "{got:?}");
            assert!((1024..4096).contains(&got.small_max), "{got:?}");
        }
    }

    /// The CRC-32s' large class is seeded by whether crc-fast has its
    /// AVX-512 code here, GCM's small class by VAES and AVX2; the other
    /// classes and every other AES mode keep the build's default.
    #[test]
    fn the_crc32_seeds_follow_crc_fast_s_wide_code() {
        for mode in Mode::ALL {
            let (seed, default) = (seeded_choice(mode), default_choice(mode));
            #[cfg(feature = "ring")]
            let small = match mode {
                Mode::Gcm if ring_leads_small_gcm() => Implementation::Ring,
                _ => default.small,
            };
            #[cfg(not(feature = "ring"))]
            let small = default.small;
            assert_eq!(seed.small, small, "{mode:?}");
            assert!(mode.candidates().contains(&seed.small), "{mode:?}");
            assert_eq!(seed.small_max, default.small_max, "{mode:?}");
            let large = match mode {
                Mode::Crc32 if !crc_fast_is_wide() => Implementation::Crc32Fast,
                Mode::Crc32c if !crc_fast_is_wide() => Implementation::Crc32c,
                _ => default.large,
            };
            assert_eq!(seed.large, large, "{mode:?}");
            assert!(mode.candidates().contains(&seed.large), "{mode:?}");
        }
        // A tie keeps the seed: Zen 3's CRC-32C at its closest, crc32c
        // 1.08× crc-fast over 4 and 16 KiB, crc-fast level at 16–256 B.
        let (f, c) = (Implementation::CrcFast, Implementation::Crc32c);
        let ts = [
            at(f, [14, 15, 23, 106, 296, 1000]),
            at(c, [19, 20, 32, 71, 253, 976]),
        ];
        let seed = Choice::split(f, c);
        assert_eq!(choose(&ts, seed), seed);
        assert_eq!(choose(&ts, Choice::one(f)), Choice::one(f));
    }

    /// A Zen 4 process in which ring's GCM ran at its slow level through
    /// the whole measurement (2026-12-04): against aws-lc as the default
    /// its small gain (1.035) is under the margin and aws-lc kept small
    /// requests, which it runs at 0.8× ring's in every other process;
    /// seeded with ring, as [`seeded_choice`] does with VAES and AVX2, ring
    /// keeps them, and aws-lc still takes the large class by its measure.
    #[cfg(all(feature = "ring", feature = "aws-lc"))]
    #[test]
    fn a_slow_ring_process_keeps_ring_for_small_gcm_when_seeded_with_it() {
        use Implementation::{AwsLc, Ring, RustCrypto};
        let ts = [
            at(RustCrypto, [174, 165, 227, 545, 1735, 6490]),
            at(AwsLc, [89, 94, 113, 203, 444, 1399]),
            at(Ring, [86, 86, 103, 178, 476, 1669]),
        ];
        assert_eq!(choose(&ts, default_choice(Mode::Gcm)), Choice::one(AwsLc));
        let seeded = choose(&ts, Choice::split(Ring, AwsLc));
        assert_eq!((seeded.small, seeded.large), (Ring, AwsLc), "{seeded:?}");
        assert!((1024..4096).contains(&seeded.small_max), "{seeded:?}");
    }

    /// A GCM measurement without ring (left out, or failing to key) judges
    /// small requests against the build's default, as before the ring
    /// seed, not against the first candidate listed: a near-tie between
    /// RustCrypto and aws-lc stays on aws-lc, on every CPU.
    #[cfg(feature = "aws-lc")]
    #[test]
    fn a_seed_that_is_not_measured_leaves_the_default_to_judge() {
        use Implementation::{AwsLc, RustCrypto};
        let imps = [RustCrypto, AwsLc];
        let seed = seeded_among(Mode::Gcm, &imps);
        assert_eq!((seed.small, seed.large), (AwsLc, AwsLc));
        let ts = [
            at(RustCrypto, [95, 100, 150, 545, 1735, 6490]),
            at(AwsLc, [100, 104, 155, 203, 444, 1399]),
        ];
        assert_eq!(choose(&ts, seed), Choice::one(AwsLc));
        for mode in Mode::ALL {
            let s = seeded_among(mode, mode.candidates());
            assert_eq!(s, seeded_choice(mode), "{mode:?}");
        }
    }

    /// A candidate that wins at 16 B alone does not take the small class:
    /// the stray XTS measurement on AMD Zen 3 (2026-12-03), AWS-LC at its
    /// slow level at 16 B only.
    #[test]
    fn one_fast_probe_does_not_take_the_small_class() {
        let (r, a) = (Implementation::RustCrypto, Implementation::CrcFast);
        let stray = [
            at(r, [59, 85, 132, 452, 1857, 7232]),
            at(a, [97, 84, 121, 265, 865, 3323]),
        ];
        assert!((Class::Small.gain(&stray[1], &stray[0]) - 84.0 / 85.0).abs() < 1e-9);
        assert_eq!(choose(&stray, Choice::one(a)), Choice::one(a));
        // What the same machine measures at its usual level: also a.
        let usual = [
            at(r, [58, 87, 129, 397, 1466, 5824]),
            at(a, [64, 65, 98, 230, 765, 3037]),
        ];
        assert_eq!(choose(&usual, Choice::one(a)), Choice::one(a));
        // A win at 16 and 64 B, or at 16 and 256 B, takes it; the gain is
        // the one at 16 B, capped by the better of the other two.
        for (b64, b256, gain) in [(120, 150, 1.2), (80, 250, 1.25), (95, 350, 1.5)] {
            let ts = [
                at(r, [40, 100, 200, 500, 2000, 8000]),
                at(a, [60, b64, b256, 400, 1000, 4000]),
            ];
            let got = Class::Small.gain(&ts[1], &ts[0]);
            assert!((got - gain).abs() < 1e-9, "{b64} {b256}: {got}");
            assert_eq!(choose(&ts, Choice::one(a)).small, r, "{b64} {b256}");
        }
        // In doubt near the margin at the capped gain, not at 16 B's.
        let near = [
            at(r, [40, 100, 200, 500, 2000, 8000]),
            at(a, [80, 110, 150, 400, 1000, 4000]),
        ];
        assert!(in_doubt(&near, Choice::one(a)));
    }

    /// Of challengers that beat the default by the same gain, the first
    /// listed is taken; equal times, even both zero, are a tie (gain 1, in
    /// doubt); without the default the first listed is kept unless beaten
    /// by the same rule (the stray XTS timings keep it, either way round).
    #[test]
    fn ties_and_a_missing_default_are_settled_by_the_order() {
        use Implementation::{Crc32Fast, Crc32c, CrcFast, RustCrypto};
        let ts = [
            at(CrcFast, [200; 6]),
            at(Crc32Fast, [100; 6]),
            at(Crc32c, [100; 6]),
        ];
        assert_eq!(pick(&ts, CrcFast, Class::Large), Crc32Fast);
        assert_eq!(pick(&ts, CrcFast, Class::Small), Crc32Fast);
        let zero = [at(CrcFast, [0; 6]), at(Crc32Fast, [0; 6])];
        assert_eq!(Class::Large.gain(&zero[0], &zero[1]), 1.0);
        assert_eq!(Class::Small.gain(&zero[0], &zero[1]), 1.0);
        assert!(in_doubt(&zero, Choice::one(CrcFast)));
        assert_eq!(pick(&zero, CrcFast, Class::Small), CrcFast);
        let (r, a) = (RustCrypto, CrcFast);
        let rt = at(r, [59, 85, 132, 452, 1857, 7232]);
        let at_ = at(a, [97, 84, 121, 265, 865, 3323]);
        let absent = Choice::one(Crc32c);
        assert_eq!(choose(&[at_.clone(), rt.clone()], absent).for_len(64), a);
        assert_eq!(choose(&[at_.clone(), rt.clone()], absent).for_len(16), a);
        // RustCrypto listed first keeps the small class (aws-lc does not
        // beat it at 16 B), and aws-lc takes the large one (2.2x).
        let c = choose(&[rt, at_], absent);
        assert_eq!((c.small, c.large), (r, a), "{c:?}");
        assert!(choose(&[], absent) == absent);
    }

    /// One probe where the small implementation loses does not cut it off
    /// below the sizes it wins after.
    #[test]
    fn one_noisy_probe_does_not_move_the_boundary() {
        let (a, b) = (Implementation::RustCrypto, Implementation::CrcFast);
        let ts = [
            at(a, [50, 100, 100, 200, 400, 1000]),
            at(b, [100, 90, 150, 300, 300, 900]),
        ];
        let got = choose(&ts, Choice::one(b));
        assert_eq!((got.small, got.large), (a, b), "{got:?}");
        assert!((1024..4096).contains(&got.small_max), "{got:?}");
    }

    /// Candidates within the tolerance of each other everywhere (or a
    /// clock too coarse to tell them apart) leave the default as it is,
    /// boundary included.
    #[test]
    fn ties_keep_the_default_boundary() {
        let default = default_choice(Mode::Crc32);
        let (f, c) = (Implementation::Crc32Fast, Implementation::CrcFast);
        for ts in [
            [at(f, [0; 6]), at(c, [0; 6])],
            [
                at(f, [100, 102, 98, 100, 101, 100]),
                at(c, [101, 100, 100, 99, 100, 103]),
            ],
        ] {
            assert_eq!(choose(&ts, default), default);
            assert_eq!(choose(&ts, default).small_max, SMALL_MAX);
        }
    }

    /// Every candidate is timed, the choice is one of them, and asking
    /// twice in a process gives the same answer without measuring again.
    #[test]
    fn measuring_times_every_candidate_once_a_process() {
        for mode in Mode::ALL {
            let m = measure(mode);
            let imps: Vec<_> = m.timings.iter().map(|t| t.implementation).collect();
            assert_eq!(imps, mode.candidates(), "{mode:?}");
            for t in &m.timings {
                assert_eq!(t.times.len(), PROBES.len());
                assert!(t.small() > Duration::ZERO && t.small() < t.large(), "{t:?}");
            }
            assert!(imps.contains(&m.choice.small) && imps.contains(&m.choice.large));
            let first = measured_full(mode);
            assert!(std::ptr::eq(first, measured_full(mode)));
            assert_eq!(measured(mode), first.choice);
            assert_eq!(Choice::decode(first.choice.encode()), Some(first.choice));
            assert_eq!(Mode::from_name(mode.name()), Some(mode));
        }
    }
}
