//! Which implementation runs a mode on this machine: chosen by measuring
//! the candidates, per size class, once per process.
//!
//! A choice fixed at build time is wrong on some CPU: on AMD Zen 3 (VAES and
//! VPCLMULQDQ with AVX2, no AVX-512) ring's AES-GCM runs at twice
//! aws-lc's (aws-lc has no VAES + AVX2 GCM and falls back to its AES-NI
//! code), on AVX-512 machines aws-lc's is ahead; RustCrypto's CTR and CBC
//! beat aws-lc's on 16–64-byte requests (less set-up a call) and lose on
//! long ones. So [`measured`] times every candidate compiled in
//! ([`Mode::candidates`]) at a small and a large request ([`Mode::probes`])
//! and keeps, for each size class, the fastest — unless it beats the
//! build's default ([`default_choice`]) by less than [`MARGIN`], so that
//! two near-equal candidates do not trade places from one process to the
//! next.
//!
//! Each mode is measured the first time a key of it is made without an
//! explicit implementation, in about a millisecond a mode (the figures are
//! in [`Measured::took`]); [`measure`] runs it again and returns the
//! timings, [`Choice`] can be handed to a key's `with_choice` to skip it (a
//! server that loaded a profile), and `with_implementation` forces one
//! implementation.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::{Cbc, CrcAlg, Ctr, Error, Gcm, Implementation, Xts};

/// A mode whose CPU implementation is chosen per machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Mode {
    /// AES-GCM (seal and open run on the same implementation).
    Gcm,
    /// AES-CTR.
    Ctr,
    /// AES-CBC (encryption and decryption on the same implementation).
    Cbc,
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
    pub const ALL: [Mode; 6] = [
        Mode::Gcm,
        Mode::Ctr,
        Mode::Cbc,
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
            Mode::Xts => "xts",
            Mode::Crc32 => "crc32",
            Mode::Crc32c => "crc32c",
        }
    }

    /// The mode of a CRC whose implementation is chosen (the CRC-32s; the
    /// CRC-64s run on crc-fast, with the `crc` crate's tables under 48
    /// bytes).
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
            Mode::Ctr | Mode::Cbc | Mode::Xts => &[
                Implementation::RustCrypto,
                #[cfg(feature = "aws-lc")]
                Implementation::AwsLc,
            ],
            Mode::Crc32 => &[Implementation::CrcFast, Implementation::Crc32Fast],
            Mode::Crc32c => &[Implementation::CrcFast, Implementation::Crc32c],
        }
    }

    /// The request lengths the small and the large class are measured at:
    /// [`SMALL_PROBE`] and [`LARGE_PROBE`], except XTS, measured where
    /// storage uses it: one 512-byte sector, and four 4 KiB data units
    /// ([`Mode::probe_unit`]).
    pub const fn probes(self) -> (usize, usize) {
        match self {
            Mode::Xts => (512, LARGE_PROBE),
            _ => (SMALL_PROBE, LARGE_PROBE),
        }
    }

    /// The XTS data unit of a `len`-byte probe (the whole of it up to 4 KiB).
    pub const fn probe_unit(len: usize) -> usize {
        if len > 4096 { 4096 } else { len }
    }
}

/// Requests of at most this many bytes are small ([`Choice::small`]).
pub const SMALL_MAX: usize = 512;

/// The request length the small class is measured at (but see
/// [`Mode::probes`]).
pub const SMALL_PROBE: usize = 64;

/// The request length the large class is measured at.
pub const LARGE_PROBE: usize = 16 << 10;

/// How much faster than the default a candidate must measure to be chosen
/// over it. Ties go to the default, so the choice is the same in every
/// process on a machine unless a candidate is clearly faster (on Zen 3,
/// ring's GCM measured 1.9–2.3× aws-lc's).
pub const MARGIN: f64 = 1.10;

/// The implementations of one mode: one for small requests (at most
/// [`SMALL_MAX`] bytes), one for the rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Choice {
    /// Requests of at most [`SMALL_MAX`] bytes.
    pub small: Implementation,
    /// Longer requests.
    pub large: Implementation,
}

impl Choice {
    /// One implementation for every size.
    pub const fn one(imp: Implementation) -> Choice {
        Choice {
            small: imp,
            large: imp,
        }
    }

    /// The implementation a `len`-byte request runs on.
    #[inline]
    pub fn for_len(&self, len: usize) -> Implementation {
        if len <= SMALL_MAX {
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
}

impl<I: RunsOn> Split<I> {
    /// One implementation for every size.
    pub(crate) fn one(imp: I) -> Self {
        Split {
            small: imp,
            large: None,
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
        Ok(Split { small, large })
    }

    /// The implementation of small requests.
    pub(crate) fn small(&self) -> &I {
        &self.small
    }

    /// The implementation of a `len`-byte request.
    #[inline]
    pub(crate) fn for_len(&self, len: usize) -> &I {
        match &self.large {
            Some(large) if len > SMALL_MAX => large,
            _ => &self.small,
        }
    }

    /// What small and large requests run on.
    pub(crate) fn choice(&self) -> Choice {
        Choice {
            small: self.small.implementation(),
            large: self.for_len(usize::MAX).implementation(),
        }
    }
}

/// What one candidate took per request at the two probe sizes (the least
/// of several rounds).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    /// The candidate.
    pub implementation: Implementation,
    /// Per request at the mode's small probe ([`Mode::probes`]).
    pub small: Duration,
    /// Per request at its large probe.
    pub large: Duration,
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
}

/// The build's preference for `mode`, which a candidate must beat by
/// [`MARGIN`] to replace: for the AES modes aws-lc where it is compiled in
/// (the fastest for GCM, CTR, CBC and XTS-AES-256 from 4 KiB on the
/// machines the crate was first tuned on), RustCrypto otherwise; for
/// CRC-32/ISO-HDLC crc32fast for small requests and crc-fast for large
/// ones, for CRC-32C crc-fast (the fastest on the AVX-512 machine).
pub const fn default_choice(mode: Mode) -> Choice {
    match mode {
        Mode::Crc32 => Choice {
            small: Implementation::Crc32Fast,
            large: Implementation::CrcFast,
        },
        Mode::Crc32c => Choice::one(Implementation::CrcFast),
        #[cfg(feature = "aws-lc")]
        _ => Choice::one(Implementation::AwsLc),
        #[cfg(not(feature = "aws-lc"))]
        _ => Choice::one(Implementation::RustCrypto),
    }
}

/// Rounds each candidate is timed in (interleaved, so that a clock or
/// frequency change lands on all of them); the least round counts.
const ROUNDS: usize = 7;

/// Requests per round at the small and the large probe.
const SMALL_PER_ROUND: usize = 64;
const LARGE_PER_ROUND: usize = 8;

/// Times every candidate of `mode` and chooses, per size class.
pub fn measure(mode: Mode) -> Measured {
    measure_among(mode, mode.candidates())
}

/// Times `candidates` (those that run `mode`; the others are left out)
/// and chooses among them, per size class.
pub fn measure_among(mode: Mode, candidates: &[Implementation]) -> Measured {
    let start = Instant::now();
    let mut runners: Vec<Runner> = candidates
        .iter()
        .filter_map(|&imp| Runner::new(mode, imp).ok())
        .collect();
    let mut small = vec![Duration::MAX; runners.len()];
    let mut large = vec![Duration::MAX; runners.len()];
    let (small_len, large_len) = mode.probes();
    let mut short = vec![0u8; small_len];
    let mut long = vec![0u8; large_len];
    // One untimed round first: page faults, lazy CPU detection, caches.
    for r in &mut runners {
        r.run(&mut short, 1);
        r.run(&mut long, 1);
    }
    for _ in 0..ROUNDS {
        for (i, r) in runners.iter_mut().enumerate() {
            small[i] = small[i].min(r.run(&mut short, SMALL_PER_ROUND));
            large[i] = large[i].min(r.run(&mut long, LARGE_PER_ROUND));
        }
    }
    let timings: Vec<Timing> = runners
        .iter()
        .zip(small.iter().zip(&large))
        .map(|(r, (&s, &l))| Timing {
            implementation: r.imp,
            small: s,
            large: l,
        })
        .collect();
    let default = default_choice(mode);
    let choice = Choice {
        small: pick(&timings, default.small, |t| t.small),
        large: pick(&timings, default.large, |t| t.large),
    };
    Measured {
        mode,
        choice,
        timings,
        took: start.elapsed(),
    }
}

/// The fastest of `timings` by `time`, unless it beats `default` by less
/// than [`MARGIN`].
fn pick(
    timings: &[Timing],
    default: Implementation,
    time: impl Fn(&Timing) -> Duration,
) -> Implementation {
    let Some(best) = timings.iter().min_by_key(|t| time(t)) else {
        return default;
    };
    match timings.iter().find(|t| t.implementation == default) {
        // (`>=`: a tie, even at a clock too coarse to tell, keeps it.)
        Some(d) if time(best).as_secs_f64() * MARGIN >= time(d).as_secs_f64() => default,
        _ => best.implementation,
    }
}

/// `mode`'s choice on this machine, measured the first time it is asked
/// for in this process ([`measure`]) and the same afterwards.
pub fn measured(mode: Mode) -> Choice {
    measured_full(mode).choice
}

/// [`measured`] with its timings.
pub fn measured_full(mode: Mode) -> &'static Measured {
    static MEASURED: [OnceLock<Measured>; Mode::ALL.len()] =
        [const { OnceLock::new() }; Mode::ALL.len()];
    MEASURED[mode as usize].get_or_init(|| measure(mode))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn t(imp: Implementation, small_ns: u64, large_ns: u64) -> Timing {
        Timing {
            implementation: imp,
            small: Duration::from_nanos(small_ns),
            large: Duration::from_nanos(large_ns),
        }
    }

    /// The default stays unless a candidate beats it by the margin; a
    /// clear win moves the choice, per size class.
    #[test]
    fn a_candidate_must_beat_the_default_by_the_margin() {
        let d = Implementation::RustCrypto;
        for &other in Implementation::ALL.iter().filter(|&&i| i != d) {
            // 5% faster: within the margin, the default stays.
            let ts = [t(d, 100, 1000), t(other, 95, 950)];
            assert_eq!(pick(&ts, d, |t| t.small), d);
            assert_eq!(pick(&ts, d, |t| t.large), d);
            // 2x faster when small only: the classes part ways.
            let ts = [t(d, 100, 1000), t(other, 50, 990)];
            assert_eq!(pick(&ts, d, |t| t.small), other);
            assert_eq!(pick(&ts, d, |t| t.large), d);
            // The default not measured (it failed to key): the fastest.
            assert_eq!(pick(&ts[1..], d, |t| t.large), other);
        }
        assert_eq!(pick(&[], d, |t| t.small), d);
        // A tie, even at zero (a clock too coarse to tell): the default.
        for &other in Implementation::ALL {
            let ts = [t(other, 0, 0), t(d, 0, 0)];
            assert_eq!(pick(&ts, d, |t| t.small), d);
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
                assert!(t.small > Duration::ZERO && t.small < t.large, "{t:?}");
            }
            assert!(imps.contains(&m.choice.small) && imps.contains(&m.choice.large));
            let first = measured_full(mode);
            assert!(std::ptr::eq(first, measured_full(mode)));
            assert_eq!(measured(mode), first.choice);
            assert_eq!(Mode::from_name(mode.name()), Some(mode));
        }
    }
}
