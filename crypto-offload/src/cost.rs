//! The cost model: what a request of a given size costs on each backend.
//!
//! Per (backend, algorithm, direction) the model keeps the latency of a
//! request as `fixed + per_byte × len`, the CPU time it takes from the
//! submitting thread as `cpu_fixed + cpu_per_byte × len`, and how many
//! requests the engine works on at once (its parallelism) and can hold
//! (queue depth). Per backend it keeps the resume latency and the requests
//! in flight. It is seeded by [`Offload::calibrate`](crate::Offload::calibrate)
//! (a bounded measurement) or a saved [`Profile`], and corrected online: each
//! completion's observed latency over the prediction moves a correction
//! factor ([`Level`]): an exponentially weighted moving average of the
//! samples clamped to a band around it, so that one outlier barely moves it,
//! and a run of samples all beyond the band — a load swing starting or
//! ending — moves it to the new level at once rather than averaging
//! through the shift.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::alg::{AeadAlg, Algorithm, CipherAlg, CrcAlg};

/// Which way a request goes. CRC requests count as `Encrypt`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// Encrypt, seal, or checksum.
    Encrypt,
    /// Decrypt or open.
    Decrypt,
}

/// The measured costs of one (backend, algorithm, direction).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Cost {
    /// Latency of a request, independent of its size, in ns.
    pub fixed_ns: f64,
    /// Latency per byte, in ns.
    pub per_byte_ns: f64,
    /// CPU time the submitting thread spends per request, in ns.
    pub cpu_fixed_ns: f64,
    /// CPU time the submitting thread spends per byte, in ns.
    pub cpu_per_byte_ns: f64,
    /// Requests the engine serves at once (its queues or cores).
    pub parallelism: u32,
    /// Requests the engine can hold in flight (its queue depth over all its
    /// queues); unbounded when the backend does not say.
    #[serde(default = "unbounded")]
    pub queue_depth: u32,
    /// The engine carries a request in operations of at most this many
    /// bytes, each paying the fixed costs (an AF_ALG engine's largest
    /// operation); unbounded when the backend does not split.
    #[serde(default = "unsplit")]
    pub operation_len: u64,
    /// Latency of each operation after a split request's first, in ns,
    /// where calibration measured it (a lone request's `fixed_ns` also pays
    /// what a request pays once: an AF_ALG request's thread hand-off, say);
    /// `fixed_ns` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op_fixed_ns: Option<f64>,
}

fn unbounded() -> u32 {
    u32::MAX
}

fn unsplit() -> u64 {
    u64::MAX
}

impl Cost {
    /// A cost (all in nanoseconds).
    pub fn new(
        fixed_ns: f64,
        per_byte_ns: f64,
        cpu_fixed_ns: f64,
        cpu_per_byte_ns: f64,
        parallelism: u32,
    ) -> Self {
        Cost {
            fixed_ns,
            per_byte_ns,
            cpu_fixed_ns,
            cpu_per_byte_ns,
            parallelism: parallelism.max(1),
            queue_depth: u32::MAX,
            operation_len: u64::MAX,
            op_fixed_ns: None,
        }
    }

    /// The same cost with a measured latency per further operation.
    pub fn with_op_fixed_ns(mut self, ns: Option<f64>) -> Self {
        self.op_fixed_ns = ns.filter(|n| n.is_finite() && *n >= 0.0);
        self
    }

    /// The same cost for an engine that carries requests in operations of
    /// at most `len` bytes.
    pub fn with_operation_len(mut self, len: Option<usize>) -> Self {
        self.operation_len = len.map_or(u64::MAX, |l| (l as u64).max(1));
        self
    }

    /// How many operations carry a `len`-byte request (at least one).
    fn operations(&self, len: usize) -> f64 {
        (len as u64).div_ceil(self.operation_len).max(1) as f64
    }

    /// The same cost with the engine's queue depth.
    pub fn with_queue_depth(mut self, depth: u32) -> Self {
        self.queue_depth = depth.max(1);
        self
    }

    /// The length under which every request of this cost is predicted
    /// under `ns` ([`Cost::latency_ns`]): solved for a request of one
    /// operation (the CPU's own costs) and checked, so a cost of several
    /// operations a request, or nonsense, gives `None` unless the solution
    /// holds. `u64::MAX` when no length reaches `ns`.
    pub(crate) fn len_under(&self, ns: f64) -> Option<u64> {
        let room = ns - self.fixed_ns;
        // (A NaN fails this too.)
        if room.partial_cmp(&0.0) != Some(core::cmp::Ordering::Greater) {
            return None;
        }
        let len = if self.per_byte_ns > 0.0 {
            // Saturating.
            (room / self.per_byte_ns) as u64
        } else {
            u64::MAX
        };
        let last = usize::try_from(len.saturating_sub(1)).unwrap_or(usize::MAX);
        (self.latency_ns(last) < ns).then_some(len)
    }

    /// The service latency of a `len`-byte request, in ns.
    pub fn latency_ns(&self, len: usize) -> f64 {
        self.latency_ns_ops(len, 1)
    }

    /// The submitting CPU's time for a `len`-byte request, in ns.
    pub fn cpu_ns(&self, len: usize) -> f64 {
        self.cpu_fixed_ns * self.operations(len) + self.cpu_per_byte_ns * len as f64
    }

    /// As [`Cost::latency_ns`], for a request the engine takes in at least
    /// `ops` operations (one per data unit, say).
    pub fn latency_ns_ops(&self, len: usize, ops: usize) -> f64 {
        let further = self.operations(len).max(ops as f64) - 1.0;
        self.fixed_ns
            + self.op_fixed_ns.unwrap_or(self.fixed_ns) * further
            + self.per_byte_ns * len as f64
    }

    /// As [`Cost::cpu_ns`], for at least `ops` operations.
    pub fn cpu_ns_ops(&self, len: usize, ops: usize) -> f64 {
        self.cpu_fixed_ns * self.operations(len).max(ops as f64) + self.cpu_per_byte_ns * len as f64
    }

    /// Throughput of one stream of `len`-byte requests, bytes per second.
    pub fn throughput(&self, len: usize) -> f64 {
        len as f64 * 1e9 / self.latency_ns(len).max(1e-3)
    }

    /// The line through two measured points: `(len, ns)` pairs.
    pub(crate) fn fit(small: (usize, f64), large: (usize, f64)) -> (f64, f64) {
        let dx = (large.0 as f64 - small.0 as f64).max(1.0);
        let per_byte = ((large.1 - small.1) / dx).max(0.0);
        let fixed = (small.1 - per_byte * small.0 as f64).max(0.0);
        (fixed, per_byte)
    }
}

/// The number of (algorithm, direction) slots in a backend's table.
pub(crate) const KEYS: usize = 2 * (CipherAlg::ALL.len() + AeadAlg::ALL.len() + CrcAlg::ALL.len());

/// The table index of (algorithm, direction). On every request's path:
/// arithmetic on the discriminants (the `ALL` arrays list the variants in
/// declaration order, which a test checks), not a search.
#[inline]
pub(crate) fn key(alg: Algorithm, dir: Direction) -> usize {
    let a = match alg {
        Algorithm::Cipher(c) => c as usize,
        Algorithm::Aead(a) => CipherAlg::ALL.len() + a as usize,
        Algorithm::Crc(c) => {
            CipherAlg::ALL.len()
                + AeadAlg::ALL.len()
                + match c {
                    CrcAlg::Crc32IsoHdlc => 0,
                    CrcAlg::Crc32Iscsi => 1,
                    CrcAlg::Crc64Nvme => 2,
                    CrcAlg::Crc64Xz => 3,
                    CrcAlg::Crc64GoIso => 4,
                    // A CRC added to the fallback later: a table slot of
                    // its own is a compile-time change here.
                    _ => CrcAlg::ALL.len() - 1,
                }
        }
    };
    2 * a + usize::from(dir == Direction::Decrypt)
}

/// The algorithm's index in per-algorithm tables (`key(alg, _) / 2`).
#[inline]
pub(crate) fn alg_index(alg: Algorithm) -> usize {
    key(alg, Direction::Encrypt) / 2
}

/// (algorithm, direction) of a table index.
pub(crate) fn unkey(k: usize) -> (Algorithm, Direction) {
    let dir = if k.is_multiple_of(2) {
        Direction::Encrypt
    } else {
        Direction::Decrypt
    };
    let a = k / 2;
    let c = CipherAlg::ALL.len();
    let e = AeadAlg::ALL.len();
    let alg = if a < c {
        Algorithm::Cipher(CipherAlg::ALL[a])
    } else if a < c + e {
        Algorithm::Aead(AeadAlg::ALL[a - c])
    } else {
        Algorithm::Crc(CrcAlg::ALL[(a - c - e).min(CrcAlg::ALL.len() - 1)])
    };
    (alg, dir)
}

/// An `f64` that can be read and written from any thread.
#[derive(Debug, Default)]
pub(crate) struct AtomicF64(AtomicU64);

impl AtomicF64 {
    pub(crate) fn new(v: f64) -> Self {
        AtomicF64(AtomicU64::new(v.to_bits()))
    }
    pub(crate) fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }
    pub(crate) fn set(&self, v: f64) {
        self.0.store(v.to_bits(), Ordering::Relaxed);
    }
}

/// One model entry: the calibrated cost and its online correction.
#[derive(Debug, Default)]
pub(crate) struct Entry {
    calibrated: AtomicBool,
    fixed: AtomicF64,
    per_byte: AtomicF64,
    cpu_fixed: AtomicF64,
    cpu_per_byte: AtomicF64,
    queue_depth: AtomicU64,
    operation_len: AtomicU64,
    /// `op_fixed_ns`, negative for none.
    op_fixed: AtomicF64,
    /// Requests the engine serves at once, learned: starts at the
    /// calibrated `parallelism` and follows what requests that found the
    /// engine busy took ([`Entry::observe_loaded`]) — a device that
    /// batches what arrives while it works serves many for little more
    /// than one, and how many is a matter of load, not of one calibration.
    servers: AtomicF64,
    /// Observed latency over predicted, smoothed; multiplies the latency.
    correction: Level,
    samples: AtomicU64,
    /// The same per size class ([`size_class`]): a linear model's error
    /// is not one factor at every size, and two backends within a few per
    /// cent at one size are told apart only by what was seen at that size.
    /// A class with no sample yet falls back to `correction`.
    class_correction: [Level; SIZE_CLASSES],
    class_samples: [AtomicU64; SIZE_CLASSES],
}

/// How far (a factor either way) a sample may stray from the correction
/// before it counts as a sign of a shift rather than as noise. Beyond it a
/// sample is clamped to the band's edge, so one outlier (a 20× slow
/// completion: a page fault, a preempted thread) moves the correction by at
/// most [`EWMA_WEIGHT`] × (`SHIFT_BAND` − 1), 5%, where the bare average
/// moved it 190% and could flip a choice that nothing then put back. ±30%
/// of jitter stays inside it.
pub(crate) const SHIFT_BAND: f64 = 1.5;

/// Consecutive samples slower than the band after which the correction
/// moves to the least slow of them: a load swing (on a loaded host, in a
/// QEMU guest, Auto read 0.68–0.75 of the oracle) is followed within this
/// many completions instead of the 7 the average took to cross two thirds
/// of a 3× one, and an outlier among them does not set the new level.
pub(crate) const SHIFT_UP_RUN: i32 = 3;

/// Consecutive samples faster than the band after which the correction
/// moves to the least fast of them. Fewer than [`SHIFT_UP_RUN`]: a
/// correction too low corrects itself (the backend is chosen, every
/// request of it observed, and a slow run puts it back), one too high does
/// not (a backend not chosen is observed only by the selector's probes,
/// one decision in 32), so the evidence asked for the recovery is less.
pub(crate) const SHIFT_DOWN_RUN: i32 = 2;

/// A correction factor learned from samples of observed over predicted
/// latency: the average of [`EWMA_WEIGHT`] over samples clamped to
/// [`SHIFT_BAND`], with shift detection (a run of samples all beyond the
/// band on one side moves it there at once). Atomics only, like the bare
/// average it replaces: concurrent completions may interleave their reads
/// and writes, which loses or shortens a run now and then — the shift is
/// then detected a sample later — and never leaves a value outside what
/// one of them would have written.
#[derive(Debug, Default)]
pub(crate) struct Level {
    value: AtomicF64,
    /// Consecutive samples beyond the band: positive slower, negative
    /// faster, 0 after one within it.
    run: AtomicI32,
    /// The run's least extreme sample: its smallest when slower, its
    /// largest when faster (what the new level is, robustly: the whole run
    /// says at least that much).
    edge: AtomicF64,
}

impl Level {
    /// The factor, 0 when never set.
    pub(crate) fn get(&self) -> f64 {
        self.value.get()
    }

    /// Starts over at `v`.
    pub(crate) fn reset(&self, v: f64) {
        self.value.set(v);
        self.run.store(0, Ordering::Relaxed);
    }

    /// Folds in one sample `ratio` (observed over predicted), the factor
    /// being `c` before it (the class's falls back to the entry's).
    pub(crate) fn observe(&self, c: f64, ratio: f64) {
        let run = self.run.load(Ordering::Relaxed);
        let (run, edge) = if ratio > c * SHIFT_BAND {
            let run = run.max(0) + 1;
            (
                run,
                if run == 1 {
                    ratio
                } else {
                    self.edge.get().min(ratio)
                },
            )
        } else if ratio * SHIFT_BAND < c {
            let run = run.min(0) - 1;
            (
                run,
                if run == -1 {
                    ratio
                } else {
                    self.edge.get().max(ratio)
                },
            )
        } else {
            (0, ratio)
        };
        if run >= SHIFT_UP_RUN || -run >= SHIFT_DOWN_RUN {
            // A shift: the run says the level moved, and at least how far.
            self.reset(edge);
            return;
        }
        self.edge.set(edge);
        self.run.store(run, Ordering::Relaxed);
        let sample = ratio.clamp(c / SHIFT_BAND, c * SHIFT_BAND);
        self.value.set(c + EWMA_WEIGHT * (sample - c));
    }
}

/// Size classes of the corrections: powers of four from 256 B (below: class
/// 0) to 16 MiB (and above: the last).
pub(crate) const SIZE_CLASSES: usize = 10;

/// The size class of a `len`-byte request.
pub(crate) fn size_class(len: usize) -> usize {
    let log2 = (usize::BITS - 1 - len.max(1).leading_zeros()) as usize;
    (log2 / 2).saturating_sub(3).min(SIZE_CLASSES - 1)
}

/// The request lengths of size class `class` ([`size_class`]): from the
/// first to the last, inclusive.
pub(crate) fn class_lens(class: usize) -> (u64, u64) {
    let first = match class {
        0 => 0,
        c => 1u64 << (2 * c.min(SIZE_CLASSES - 1) + 6),
    };
    let last = if class + 1 >= SIZE_CLASSES {
        u64::MAX
    } else {
        (1u64 << (2 * class + 8)) - 1
    };
    (first, last)
}

/// How fast the correction follows observations (weight of a new sample).
pub const EWMA_WEIGHT: f64 = 0.1;

impl Entry {
    pub(crate) fn cost(&self) -> Option<Cost> {
        if !self.calibrated.load(Ordering::Acquire) {
            return None;
        }
        Some(Cost {
            fixed_ns: self.fixed.get(),
            per_byte_ns: self.per_byte.get(),
            cpu_fixed_ns: self.cpu_fixed.get(),
            cpu_per_byte_ns: self.cpu_per_byte.get(),
            parallelism: (self.servers().round() as u32).max(1),
            queue_depth: u32::try_from(self.queue_depth.load(Ordering::Relaxed))
                .unwrap_or(u32::MAX),
            operation_len: self.operation_len.load(Ordering::Relaxed).max(1),
            op_fixed_ns: Some(self.op_fixed.get()).filter(|n| *n >= 0.0),
        })
    }

    pub(crate) fn set(&self, c: Cost) {
        self.fixed.set(c.fixed_ns);
        self.per_byte.set(c.per_byte_ns);
        self.cpu_fixed.set(c.cpu_fixed_ns);
        self.cpu_per_byte.set(c.cpu_per_byte_ns);
        self.servers.set(f64::from(c.parallelism.max(1)));
        self.queue_depth
            .store(u64::from(c.queue_depth.max(1)), Ordering::Relaxed);
        self.operation_len
            .store(c.operation_len.max(1), Ordering::Relaxed);
        self.op_fixed.set(c.op_fixed_ns.unwrap_or(-1.0));
        self.correction.reset(1.0);
        for (n, c) in self.class_samples.iter().zip(&self.class_correction) {
            n.store(0, Ordering::Relaxed);
            c.reset(1.0);
        }
        self.calibrated.store(true, Ordering::Release);
    }

    /// Requests the engine serves at once, as learned (at least 1).
    pub(crate) fn servers(&self) -> f64 {
        self.servers.get().max(1.0)
    }

    /// Folds in one completion of a `len`-byte request that found `ahead`
    /// requests in flight on the engine, more than it was modelled to
    /// serve at once: with `n = ahead + 1` sharing it, a request whose
    /// service alone takes `s` (`base_ns`, corrected) and that came back
    /// after `observed_ns` says the engine served `n·s/observed` at once
    /// (between 1 and `n`). The learned count follows it; the correction
    /// does not (queueing the model got wrong is not a slower service).
    pub(crate) fn observe_loaded(&self, len: usize, base_ns: f64, ahead: f64, observed_ns: f64) {
        if base_ns <= 0.0 || observed_ns <= 0.0 || !self.calibrated.load(Ordering::Acquire) {
            return;
        }
        let n = ahead.max(0.0) + 1.0;
        let service = base_ns * self.correction_at(len);
        let seen = (n * service / observed_ns).clamp(1.0, n);
        let s = self.servers();
        self.servers.set(s + EWMA_WEIGHT * (seen - s));
    }

    /// The fixed latency of the cost, once there is one (two loads, where
    /// [`Entry::cost`] makes nine).
    pub(crate) fn fixed_ns(&self) -> Option<f64> {
        self.calibrated
            .load(Ordering::Acquire)
            .then(|| self.fixed.get())
    }

    /// The correction over all sizes.
    pub(crate) fn correction(&self) -> f64 {
        let c = self.correction.get();
        if c > 0.0 { c } else { 1.0 }
    }

    /// The correction for a `len`-byte request: its size class's once it
    /// has a sample, else the one over all sizes.
    pub(crate) fn correction_at(&self, len: usize) -> f64 {
        let class = size_class(len);
        if self.class_samples[class].load(Ordering::Relaxed) == 0 {
            return self.correction();
        }
        let c = self.class_correction[class].get();
        if c > 0.0 { c } else { self.correction() }
    }

    /// Folds in one completion of a `len`-byte request: it took
    /// `observed_ns`; the model, before correction, predicted
    /// `predicted_ns`.
    pub(crate) fn observe(&self, len: usize, predicted_ns: f64, observed_ns: f64) {
        if predicted_ns <= 0.0 || !self.calibrated.load(Ordering::Acquire) {
            return;
        }
        let ratio = (observed_ns / predicted_ns).clamp(0.05, 50.0);
        // The class starts from what all sizes say, then follows its own.
        let class = size_class(len);
        let c = self.correction_at(len);
        self.class_correction[class].observe(c, ratio);
        self.class_samples[class].fetch_add(1, Ordering::Relaxed);
        self.correction.observe(self.correction(), ratio);
        self.samples.fetch_add(1, Ordering::Relaxed);
    }
}

/// A backend's model: one entry per (algorithm, direction), the requests in
/// flight, and the resume latency.
#[derive(Debug)]
pub(crate) struct Model {
    pub(crate) entries: Box<[Entry]>,
    pub(crate) in_flight: AtomicUsize,
    pub(crate) resume_ns: AtomicF64,
    /// Time requests would have saved on this engine, had it been powered,
    /// since it was last woken for one (see `select::rent_or_buy`).
    pub(crate) regret_ns: AtomicF64,
    /// The CPU's only: what a job sent to tokio's blocking pool takes beyond
    /// its inline service time (the hand-off to a pool thread, the wake-up
    /// back; learned from such jobs, see [`Model::observe_handoff`]).
    pub(crate) handoff_ns: AtomicF64,
    /// Blocking-pool jobs observed (the first sets `handoff_ns` outright).
    handoffs: AtomicU64,
}

impl Default for Model {
    fn default() -> Self {
        Model {
            entries: (0..KEYS).map(|_| Entry::default()).collect(),
            in_flight: AtomicUsize::new(0),
            resume_ns: AtomicF64::new(0.0),
            regret_ns: AtomicF64::new(0.0),
            handoff_ns: AtomicF64::new(0.0),
            handoffs: AtomicU64::new(0),
        }
    }
}

impl Model {
    pub(crate) fn entry(&self, alg: Algorithm, dir: Direction) -> &Entry {
        &self.entries[key(alg, dir)]
    }

    /// Folds in one blocking-pool job that took `observed_ns` where the
    /// corrected inline model expected `inline_ns`: the difference is the
    /// hand-off. It is additive — a thread wake-up and a task wake-up, the
    /// same for 64 KiB as for 16 MiB — and so is kept apart from the
    /// entries' multiplicative corrections, which would otherwise carry it
    /// into every inline prediction (a 4 KiB request does not pay it).
    pub(crate) fn observe_handoff(&self, inline_ns: f64, observed_ns: f64) {
        let sample = (observed_ns - inline_ns).max(0.0);
        let h = if self.handoffs.fetch_add(1, Ordering::Relaxed) == 0 {
            sample
        } else {
            let h = self.handoff_ns.get();
            h + HANDOFF_WEIGHT * (sample - h)
        };
        self.handoff_ns.set(h);
    }
}

/// How fast the learned hand-off follows blocking-pool jobs. Heavier than
/// [`EWMA_WEIGHT`]: such jobs are few (each is ≥ 500 µs of work), so each
/// sample counts for more.
const HANDOFF_WEIGHT: f64 = 0.25;

/// A saved cost model: what `offload calibrate --out` writes and
/// [`OffloadBuilder::profile`](crate::OffloadBuilder::profile) loads (TOML).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Profile {
    /// The measured entries.
    #[serde(default, rename = "entry")]
    pub entries: Vec<ProfileEntry>,
    /// The CPU implementation each mode runs on, per size class, as
    /// measured where the profile was made ([`crate::cpu_choice`]): loaded,
    /// the CPU backend takes them instead of measuring at start.
    #[serde(default, rename = "cpu_implementation")]
    pub cpu_implementations: Vec<CpuImplementation>,
}

/// The CPU implementations of one mode in a [`Profile`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct CpuImplementation {
    /// The mode ([`Mode::name`](crate::cpu_choice::Mode::name): `"gcm"`).
    pub mode: String,
    /// The implementation of small requests
    /// ([`Implementation::name`](crate::Implementation::name)).
    pub small: String,
    /// The implementation of large requests.
    pub large: String,
    /// The longest request that runs on `small`
    /// ([`Choice::small_max`](crate::cpu_choice::Choice::small_max); a
    /// profile without it means
    /// [`SMALL_MAX`](crate::cpu_choice::SMALL_MAX)).
    #[serde(default = "default_small_max")]
    pub small_max: usize,
}

fn default_small_max() -> usize {
    crate::cpu_choice::SMALL_MAX
}

impl CpuImplementation {
    /// `mode`'s `choice`.
    pub fn new(mode: crate::cpu_choice::Mode, choice: crate::cpu_choice::Choice) -> Self {
        CpuImplementation {
            mode: mode.name().to_owned(),
            small: choice.small.name().to_owned(),
            large: choice.large.name().to_owned(),
            // (TOML integers are i64: no request is longer anyway.)
            small_max: choice.small_max.min(i64::MAX as usize),
        }
    }

    /// The mode and choice, if this build has the mode and both
    /// implementations (a profile made by a build with ring, loaded by
    /// one without, names one it lacks: that mode is measured instead).
    pub fn choice(&self) -> Option<(crate::cpu_choice::Mode, crate::cpu_choice::Choice)> {
        use crate::Implementation;
        Some((
            crate::cpu_choice::Mode::from_name(&self.mode)?,
            crate::cpu_choice::Choice {
                small: Implementation::from_name(&self.small)?,
                large: Implementation::from_name(&self.large)?,
                small_max: self.small_max,
            },
        ))
    }
}

/// One measured (backend, algorithm, direction).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ProfileEntry {
    /// The backend's name.
    pub backend: String,
    /// The algorithm's name (`"aes-256-xts"`, `"CRC-32/ISCSI"`, …).
    pub alg: String,
    /// The direction.
    pub dir: Direction,
    /// The costs.
    #[serde(flatten)]
    pub cost: Cost,
    /// The backend's resume latency, in ns (0 without power management).
    #[serde(default)]
    pub resume_ns: f64,
}

impl Profile {
    /// Parses a TOML profile (what [`Profile::to_toml`] writes).
    ///
    /// ```
    /// use crypto_offload::{Profile, ProfileError};
    ///
    /// let profile = crypto_offload::Offload::builder().build()?.profile();
    /// assert_eq!(Profile::from_toml(&profile.to_toml()?)?, profile);
    ///
    /// let err = Profile::from_toml("[[entry]]\nbackend = 3\n").unwrap_err();
    /// assert!(matches!(err, ProfileError::Parse { line: Some(2), .. }), "{err}");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// [`ProfileError::Parse`]: the text is not TOML, or not a profile (a
    /// field missing or of the wrong type), with the line and column.
    pub fn from_toml(text: &str) -> Result<Self, ProfileError> {
        toml::from_str(text).map_err(|e| ProfileError::parse(text, e))
    }

    /// Writes the profile as TOML.
    ///
    /// # Errors
    /// [`ProfileError::Serialize`] (not expected: every field is
    /// representable).
    pub fn to_toml(&self) -> Result<String, ProfileError> {
        toml::to_string_pretty(self).map_err(|e| ProfileError::Serialize {
            message: e.to_string(),
            source: Box::new(e),
        })
    }

    /// The algorithm a profile entry names.
    pub(crate) fn alg(name: &str) -> Option<Algorithm> {
        Algorithm::all().find(|a| a.name().eq_ignore_ascii_case(name))
    }
}

/// Why a [`Profile`] could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProfileError {
    /// The text is not a profile: not TOML, or a field missing or of the
    /// wrong type ([`Profile::from_toml`]).
    #[error("{}{message}", location(.line, .column))]
    Parse {
        /// What is wrong, as the parser says it.
        message: String,
        /// The line it is on (1-based), where the parser knows it.
        line: Option<usize>,
        /// The column (1-based, in characters), where the parser knows it.
        column: Option<usize>,
        /// The parser's error (its `Display` quotes the line).
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
    /// The profile could not be written as TOML ([`Profile::to_toml`]).
    #[error("cannot write the profile: {message}")]
    Serialize {
        /// What went wrong, as the writer says it.
        message: String,
        /// The writer's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
}

impl ProfileError {
    /// A parse error of `text`, located.
    fn parse(text: &str, e: toml::de::Error) -> Self {
        let (line, column) = match e.span() {
            Some(span) => {
                let before = &text[..span.start.min(text.len())];
                let line_start = before.rfind('\n').map_or(0, |i| i + 1);
                (
                    Some(before.matches('\n').count() + 1),
                    Some(before[line_start..].chars().count() + 1),
                )
            }
            None => (None, None),
        };
        ProfileError::Parse {
            message: e.message().trim_end().to_owned(),
            line,
            column,
            source: Box::new(e),
        }
    }
}

/// `"profile line 3, column 7: "`, or as much of it as is known.
fn location(line: &Option<usize>, column: &Option<usize>) -> String {
    match (*line, *column) {
        (Some(l), Some(c)) => format!("profile line {l}, column {c}: "),
        (Some(l), None) => format!("profile line {l}: "),
        _ => "invalid profile: ".to_owned(),
    }
}

/// How long a resume takes, as a `Duration`.
pub(crate) fn ns(d: f64) -> Duration {
    Duration::from_nanos(d.max(0.0).min(u64::MAX as f64) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_size_class_learns_its_own_correction() {
        assert_eq!(
            [
                0,
                255,
                256,
                1023,
                1024,
                4096,
                16 << 10,
                1 << 20,
                16 << 20,
                usize::MAX
            ]
            .map(size_class),
            [0, 0, 1, 1, 2, 3, 4, 7, 9, 9]
        );
        let e = Entry::default();
        e.set(Cost::new(100.0, 1.0, 0.0, 0.0, 1));
        // Slower than predicted at 16 KiB only.
        for _ in 0..50 {
            e.observe(16 << 10, 1000.0, 1200.0);
        }
        assert!((e.correction_at(16 << 10) - 1.2).abs() < 0.01);
        assert!((e.correction_at(20 << 10) - 1.2).abs() < 0.01, "same class");
        // Right at 1 KiB: that class moves back to 1, the 16 KiB one stays.
        for _ in 0..50 {
            e.observe(1024, 1000.0, 1000.0);
        }
        assert!((e.correction_at(1024) - 1.0).abs() < 0.01);
        assert!((e.correction_at(16 << 10) - 1.2).abs() < 0.01);
        // A class never seen takes the correction over all sizes.
        assert_eq!(e.correction_at(1 << 20), e.correction());
    }

    #[test]
    fn an_outlier_barely_moves_a_correction_and_a_run_moves_it_at_once() {
        let l = Level::default();
        l.reset(1.0);
        // One 20× sample: clamped to the band, 5%.
        l.observe(l.get(), 20.0);
        assert!((l.get() - 1.05).abs() < 1e-9, "{}", l.get());
        // Within the band: the plain average.
        l.observe(l.get(), 1.05);
        assert!((l.get() - 1.05).abs() < 1e-9);
        // Three slower than the band in a row: the least slow of them.
        for r in [3.5, 2.6, 20.0] {
            l.observe(l.get(), r);
        }
        assert_eq!(l.get(), 2.6);
        // A sample within the band breaks a run: two slow, one normal, two
        // slow is no shift.
        for r in [2.6, 8.0, 8.0, 2.6, 8.0, 8.0] {
            l.observe(l.get(), r);
        }
        assert!(l.get() < 4.0, "{}", l.get());
        l.reset(3.0);
        // Faster: two in a row suffice, and the new level is the least fast.
        l.observe(l.get(), 0.9);
        assert!(l.get() < 3.0 && l.get() > 2.8, "{}", l.get());
        l.observe(l.get(), 1.2);
        assert_eq!(l.get(), 1.2);
    }

    #[test]
    fn the_first_job_sets_the_handoff_and_later_ones_move_it() {
        let m = Model::default();
        assert_eq!(m.handoff_ns.get(), 0.0);
        m.observe_handoff(900e3, 1_300e3);
        assert_eq!(m.handoff_ns.get(), 400e3);
        m.observe_handoff(900e3, 900e3);
        assert_eq!(m.handoff_ns.get(), 300e3);
        // Faster than inline (a noisy sample) counts as no hand-off, never a
        // negative one.
        m.observe_handoff(900e3, 100e3);
        assert_eq!(m.handoff_ns.get(), 225e3);
    }

    #[test]
    fn a_split_request_pays_the_fixed_cost_per_operation() {
        let c = Cost::new(100.0, 1.0, 10.0, 0.5, 1).with_operation_len(Some(1000));
        assert_eq!(c.latency_ns(1000), 1100.0);
        assert_eq!(c.latency_ns(2500), 3.0 * 100.0 + 2500.0);
        assert_eq!(c.cpu_ns(2500), 3.0 * 10.0 + 1250.0);
        assert_eq!(c.latency_ns(0), 100.0);
        let whole = Cost::new(100.0, 1.0, 10.0, 0.5, 1);
        assert_eq!(whole.latency_ns(2500), 2600.0);
        // Further operations at their measured cost.
        let measured = c.with_op_fixed_ns(Some(40.0));
        assert_eq!(measured.latency_ns(2500), 100.0 + 2.0 * 40.0 + 2500.0);
        assert_eq!(measured.latency_ns(1000), 1100.0);
        // A saved profile without the field reads as unsplit.
        let toml = "fixed_ns = 1.0\nper_byte_ns = 0.0\ncpu_fixed_ns = 0.0\ncpu_per_byte_ns = 0.0\nparallelism = 1\n";
        let read: Cost = toml::from_str(toml).unwrap();
        assert_eq!(read.operation_len, u64::MAX);
    }

    #[test]
    fn a_profile_error_says_where_and_keeps_the_parser_error() {
        let text = "[[entry]]\nbackend = \"cpu\"\nalg = 7\n";
        let err = Profile::from_toml(text).unwrap_err();
        let ProfileError::Parse {
            message,
            line,
            column,
            ..
        } = &err
        else {
            panic!("{err:?}");
        };
        assert_eq!((*line, *column), (Some(3), Some(7)), "{err}");
        assert!(message.contains("string"), "{message}");
        assert!(
            err.to_string().starts_with("profile line 3, column 7: "),
            "{err}"
        );
        let source = std::error::Error::source(&err).expect("the parser's error");
        assert!(source.to_string().contains("alg = 7"), "{source}");
        // Not TOML at all.
        let err = Profile::from_toml("[[entry]\n").unwrap_err();
        assert!(
            matches!(err, ProfileError::Parse { line: Some(1), .. }),
            "{err}"
        );
    }

    #[test]
    fn key_and_unkey_are_inverse_over_the_whole_table() {
        for k in 0..KEYS {
            let (alg, dir) = unkey(k);
            assert_eq!(key(alg, dir), k, "{alg} {dir:?}");
        }
        assert_eq!(Algorithm::all().count() * 2, KEYS);
    }
}
