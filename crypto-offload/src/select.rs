//! The selector: which backend a request runs on, and why.
//!
//! For each request the selector predicts, for every backend that runs the
//! algorithm and is neither uncalibrated nor behind an open circuit breaker,
//! the completion time (service time from the cost model, times its online
//! correction, plus waiting behind the requests in flight, plus a resume if
//! the device is suspended, plus — for a CPU job long enough to leave for
//! tokio's blocking pool — the hand-off learned from such jobs) and the CPU time it takes from this machine.
//! The [`Policy`] turns those into a choice. [`Offload::explain`] returns the
//! whole reckoning.
//!
//! [`Offload::explain`]: crate::Offload::explain

use core::fmt;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::alg::Algorithm;
use crate::cost::{Direction, ns};
use crate::offload::Inner;

/// How the selector trades latency against CPU time.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[non_exhaustive]
pub enum Policy {
    /// Least predicted completion time for this request. The CPU path runs
    /// inline on the calling task, so it never waits behind other requests;
    /// engines do, behind their queues.
    #[default]
    Latency,
    /// Spread concurrent requests over the backends in proportion to their
    /// capacity, so that engines and the CPU work at once: the CPU is a
    /// server with one slot per core, and every backend's queue counts.
    Throughput,
    /// Least CPU time among the backends whose predicted latency is within
    /// `max_latency` (falling back to least latency when none is): frees the
    /// CPU for other work, as a slow engine with a high fixed cost (TI
    /// MCRC64) is worth for large requests only.
    CpuSaving {
        /// The latency a request may take.
        max_latency: Duration,
    },
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Policy::Latency => f.write_str("latency"),
            Policy::Throughput => f.write_str("throughput"),
            Policy::CpuSaving { max_latency } => write!(f, "cpu-saving (≤ {max_latency:?})"),
        }
    }
}

/// Parses the names [`Policy`]'s `Display` writes, as a command line takes
/// them: `latency`, `throughput`, `cpu-saving` (a 100 ms bound) or
/// `cpu-saving=MS`.
///
/// ```
/// use std::time::Duration;
/// use crypto_offload::Policy;
///
/// assert_eq!("throughput".parse::<Policy>()?, Policy::Throughput);
/// assert_eq!(
///     "cpu-saving=5".parse::<Policy>()?,
///     Policy::CpuSaving { max_latency: Duration::from_millis(5) },
/// );
/// assert!("fastest".parse::<Policy>().is_err());
/// # Ok::<(), crypto_offload::ParsePolicyError>(())
/// ```
impl core::str::FromStr for Policy {
    type Err = ParsePolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || ParsePolicyError(s.to_owned());
        Ok(match s.split_once('=') {
            None if s == "latency" => Policy::Latency,
            None if s == "throughput" => Policy::Throughput,
            None if s == "cpu-saving" => Policy::CpuSaving {
                max_latency: Duration::from_millis(100),
            },
            Some(("cpu-saving", ms)) => Policy::CpuSaving {
                max_latency: Duration::from_millis(ms.parse().map_err(|_| bad())?),
            },
            _ => return Err(bad()),
        })
    }
}

/// A policy name [`Policy::from_str`](core::str::FromStr::from_str) does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown policy {0:?} (latency, throughput, cpu-saving[=MS])")]
pub struct ParsePolicyError(pub String);

/// One backend's side of a decision.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Candidate {
    /// The backend's name.
    pub backend: String,
    /// Predicted completion time, if the backend is eligible.
    pub latency: Option<Duration>,
    /// Predicted CPU time taken from this machine, if eligible.
    pub cpu_time: Option<Duration>,
    /// Requests in flight on the backend now.
    pub in_flight: usize,
    /// Why the backend is not eligible, if it is not.
    pub excluded: Option<String>,
}

/// What [`Offload::explain`](crate::Offload::explain) returns: every
/// candidate's predicted cost and the choice.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Explanation {
    /// The algorithm.
    pub alg: Algorithm,
    /// The direction.
    pub dir: Direction,
    /// The request size in bytes.
    pub len: usize,
    /// The policy applied.
    pub policy: Policy,
    /// Every backend, CPU first.
    pub candidates: Vec<Candidate>,
    /// The chosen backend's name.
    pub choice: String,
}

impl fmt::Display for Explanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} {:?} {} B, policy {}: {}",
            self.alg, self.dir, self.len, self.policy, self.choice
        )?;
        for c in &self.candidates {
            match (&c.excluded, c.latency, c.cpu_time) {
                (Some(why), _, _) => writeln!(f, "  {:<24} excluded: {why}", c.backend)?,
                (None, Some(l), Some(cpu)) => writeln!(
                    f,
                    "  {:<24} latency {:>12?}  cpu {:>12?}  in flight {}",
                    c.backend, l, cpu, c.in_flight
                )?,
                _ => {}
            }
        }
        Ok(())
    }
}

/// How close (predicted latency, as a ratio) a runner-up must be to the
/// choice to be sent a request now and then ([`Inner::runner_up`]).
const EXPLORE_WITHIN: f64 = 1.25;

/// One decision in this many (per thread) goes to a near runner-up.
const EXPLORE_EVERY: u32 = 32;

/// Whether this decision explores, and which turn it is: every
/// [`EXPLORE_EVERY`]th on this thread (a thread-local tick, so no shared
/// counter to contend on).
fn explore_turn() -> Option<u32> {
    thread_local! {
        static TICK: core::cell::Cell<u32> = const { core::cell::Cell::new(0) };
    }
    TICK.with(|t| {
        let n = t.get().wrapping_add(1);
        t.set(n);
        n.is_multiple_of(EXPLORE_EVERY).then_some(n / EXPLORE_EVERY)
    })
}

/// Under the Throughput policy, requests in flight per engine server up to
/// which the engine takes more: one being served and one ready behind it.
const QUEUE_PER_SERVER: f64 = 2.0;

/// Why a backend is not a candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exclusion {
    Unsupported,
    CircuitOpen,
    /// Longer than the backend's largest request.
    TooLarge,
    /// A length (or data unit) the backend's granularity does not divide.
    Length,
    Uncalibrated,
}

/// A predicted cost, in ns.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Prediction {
    pub(crate) slot: usize,
    pub(crate) latency: f64,
    pub(crate) cpu: f64,
    /// The service time before correction.
    pub(crate) base: f64,
    /// The completion time before correction: service plus the wait behind
    /// the requests in flight when it was sent. Observations are compared
    /// with this, so that queueing (which the prediction already counts)
    /// does not pass for a slower engine, and the correction does not feed
    /// back on itself.
    pub(crate) expected: f64,
    /// The prediction includes a device resume: the request's time is not a
    /// service time, and is left out of the model (the resume has its own
    /// measurement, taken by the power domain).
    pub(crate) cold: bool,
    /// Sent to a runner-up to correct its model ([`Inner::runner_up`]):
    /// always timed, even on the CPU's inline path, which times one request
    /// in 64.
    pub(crate) explored: bool,
}

impl Inner {
    /// The prediction for one slot, or why it is not eligible.
    pub(crate) fn predict(
        &self,
        slot: usize,
        alg: Algorithm,
        dir: Direction,
        len: usize,
        unit: usize,
    ) -> Result<Prediction, Exclusion> {
        let k = crate::cost::key(alg, dir);
        if slot > 0 {
            if !self.supported[slot][k / 2] {
                return Err(Exclusion::Unsupported);
            }
            if self.breakers[slot].is_open() {
                return Err(Exclusion::CircuitOpen);
            }
            // An engine that takes a data unit per operation is limited per
            // unit.
            let per_unit = self.per_unit[slot][k / 2];
            let shape = if per_unit { unit.min(len) } else { len };
            if shape > self.max_request[slot][k / 2] {
                return Err(Exclusion::TooLarge);
            }
            if !shape.is_multiple_of(self.multiple[slot][k / 2]) {
                return Err(Exclusion::Length);
            }
        }
        let model = &self.models[slot];
        let entry = &model.entries[k];
        let Some(cost) = entry.cost() else {
            return Err(Exclusion::Uncalibrated);
        };
        // Operations the request takes: a unit each on an engine that takes
        // one unit per operation.
        let units = if slot > 0 && self.per_unit[slot][k / 2] {
            len.div_ceil(unit.max(1))
        } else {
            1
        };
        let base = cost.latency_ns_ops(len, units);
        // A long CPU job runs on the blocking pool and pays its hand-off.
        let handoff = if slot == 0 && crate::session::blocks(len, base) {
            model.handoff_ns.get()
        } else {
            0.0
        };
        let service = base * entry.correction_at(len) + handoff;
        let queued = model.in_flight.load(Ordering::Relaxed) as f64;
        let waiting = if slot == 0 && self.policy != Policy::Throughput {
            // Inline on the calling task: the CPU path does not queue.
            0.0
        } else {
            let servers = if slot == 0 {
                self.cores as f64
            } else {
                f64::from(cost.parallelism)
            };
            (queued + 1.0 - servers).max(0.0) / servers
        };
        let wait = waiting * service;
        let cold = self.is_cold(slot);
        let resume = if cold { model.resume_ns.get() } else { 0.0 };
        Ok(Prediction {
            slot,
            latency: service + wait + resume,
            cpu: cost.cpu_ns_ops(len, units),
            base,
            expected: base * (1.0 + waiting),
            cold,
            explored: false,
        })
    }

    /// Whether `slot` is an engine whose device is powered down (a request
    /// there first pays its resume).
    #[inline]
    fn is_cold(&self, slot: usize) -> bool {
        slot > 0
            && self.backends[slot - 1]
                .power()
                .is_some_and(|p| !p.is_powered())
    }

    /// Recomputes, for table entry `k`, the request length under which the
    /// CPU wins under the Latency policy without weighing the engines: its
    /// corrected latency is below every engine's corrected fixed latency
    /// (which queueing and resumes only add to). Breakers are not consulted
    /// — an engine behind one only makes the CPU's win surer — so the bound
    /// needs no update when they open or close; it follows every change of
    /// a cost or a correction instead.
    pub(crate) fn refresh_cpu_bound(&self, k: usize) {
        let cpu = &self.models[0].entries[k];
        let bound = match cpu.cost() {
            None => 0,
            Some(c) => {
                let engines = (1..=self.backends.len())
                    .filter(|&slot| self.supported[slot][k / 2])
                    .filter_map(|slot| {
                        let e = &self.models[slot].entries[k];
                        e.cost().map(|ec| ec.fixed_ns * e.correction())
                    })
                    .fold(f64::INFINITY, f64::min);
                let room = engines / cpu.correction() - c.fixed_ns;
                let bound = if room <= 0.0 {
                    0
                } else if c.per_byte_ns <= 0.0 {
                    u64::MAX
                } else {
                    // Saturating: an infinite room (no engine) is u64::MAX.
                    (room / c.per_byte_ns) as u64
                };
                // Only inline requests: one that may go to the blocking pool
                // is weighed with its hand-off.
                bound.min(crate::session::BLOCKING_MIN_LEN as u64)
            }
        };
        self.cpu_bound[k].store(bound, Ordering::Relaxed);
    }

    /// Sets a cost from calibration or a profile.
    pub(crate) fn set_cost(
        &self,
        slot: usize,
        alg: Algorithm,
        dir: Direction,
        cost: crate::cost::Cost,
    ) {
        self.models[slot].entry(alg, dir).set(cost);
        self.refresh_cpu_bound(crate::cost::key(alg, dir));
    }

    /// Folds one completion into `slot`'s correction.
    pub(crate) fn observe(
        &self,
        slot: usize,
        alg: Algorithm,
        dir: Direction,
        len: usize,
        expected: f64,
        observed: f64,
    ) {
        self.models[slot]
            .entry(alg, dir)
            .observe(len, expected, observed);
        self.refresh_cpu_bound(crate::cost::key(alg, dir));
    }

    /// The slot a request runs on (0 = CPU), with its prediction when the
    /// choice was made from the model.
    #[inline]
    pub(crate) fn choose(
        &self,
        alg: Algorithm,
        dir: Direction,
        len: usize,
    ) -> (usize, Option<Prediction>) {
        self.choose_unit(alg, dir, len, len)
    }

    /// The slot a request that is about to run goes to: as
    /// [`Inner::choose_unit`], then [`Inner::rent_or_buy`] under the
    /// Latency policy. Unlike `choose`, which `explain` and `break_even`
    /// ask freely, this keeps account of what cold engines would have
    /// saved: call it once per request.
    #[inline]
    pub(crate) fn decide(
        &self,
        alg: Algorithm,
        dir: Direction,
        len: usize,
        unit: usize,
    ) -> (usize, Option<Prediction>) {
        let (slot, predicted) = self.choose_unit(alg, dir, len, unit);
        match predicted {
            Some(p) if self.pinned.is_none() && self.policy == Policy::Latency => {
                let mut p = self.rent_or_buy(p, alg, dir, len, unit);
                if let Some(turn) = explore_turn() {
                    p = self.runner_up(p, alg, dir, len, unit, turn).unwrap_or(p);
                }
                (p.slot, Some(p))
            }
            _ => (slot, predicted),
        }
    }

    /// A warm backend other than `chosen` predicted within
    /// [`EXPLORE_WITHIN`] of it — the `turn`th of them, so that every one
    /// is tried in turn. A backend's correction learns only from the
    /// requests it serves, so without this the one a calibration happened
    /// to favour keeps every request of a size while a near-equal rival's
    /// model is never put right (measured in the guest: two VFIO devices 5%
    /// apart at 256 KiB, Auto held the slower one at 0.94 of the oracle; and
    /// with only the nearest rival tried, the CPU, third, was never
    /// re-measured at 16 KiB, 0.93). One request in [`EXPLORE_EVERY`] of
    /// such near ties goes to a rival, costing at most
    /// `(EXPLORE_WITHIN - 1) / EXPLORE_EVERY` (under 1%) while it lasts.
    fn runner_up(
        &self,
        chosen: Prediction,
        alg: Algorithm,
        dir: Direction,
        len: usize,
        unit: usize,
        turn: u32,
    ) -> Option<Prediction> {
        let near = || {
            (0..=self.backends.len())
                .filter(move |&slot| slot != chosen.slot)
                .filter_map(move |slot| self.predict(slot, alg, dir, len, unit).ok())
                .filter(move |p| !p.cold && p.latency <= chosen.latency * EXPLORE_WITHIN)
        };
        let n = near().count();
        if n == 0 {
            return None;
        }
        near().nth(turn as usize % n).map(|p| Prediction {
            explored: true,
            ..p
        })
    }

    /// Ski rental for powered-down engines. A cold engine's prediction
    /// carries its whole resume, which one request rarely repays and a
    /// stream of them does: with only the per-request view the CPU wins
    /// every request of the stream and the engine never wakes. So while a
    /// request goes elsewhere although a cold engine, once powered, would
    /// have been faster, the time it would have saved accumulates; when
    /// that reaches the engine's resume time, this request pays the resume.
    /// A stream then costs at most about twice what the best choice in
    /// hindsight would have (the classic break-even bound), and a lone
    /// request never wakes a device for nothing (`tests/sim.rs`,
    /// `a_cold_engine_is_woken_once_a_stream_would_have_repaid_its_resume`).
    fn rent_or_buy(
        &self,
        chosen: Prediction,
        alg: Algorithm,
        dir: Direction,
        len: usize,
        unit: usize,
    ) -> Prediction {
        let mut buy: Option<Prediction> = None;
        for slot in 1..=self.backends.len() {
            // Only a powered-down engine is weighed, and whether it is one
            // is an atomic load: predicting each warm engine again (after
            // `choose`) doubled the decision's cost, 2.6 µs of 5.4 under TCG
            // in the guest (float arithmetic is emulated there).
            if slot == chosen.slot || !self.is_cold(slot) {
                continue;
            }
            let Ok(p) = self.predict(slot, alg, dir, len, unit) else {
                continue;
            };
            if !p.cold {
                continue;
            }
            let model = &self.models[slot];
            let resume = model.resume_ns.get();
            let saving = chosen.latency - (p.latency - resume);
            if saving <= 0.0 {
                continue;
            }
            // Not an atomic read-modify-write: concurrent requests may lose
            // a little of each other's regret, which only delays the wake.
            let regret = model.regret_ns.get() + saving;
            if regret >= resume {
                model.regret_ns.set(0.0);
                if buy.is_none_or(|b| p.latency - resume < b.latency) {
                    buy = Some(p);
                }
            } else {
                model.regret_ns.set(regret);
            }
        }
        buy.unwrap_or(chosen)
    }

    /// As [`Inner::choose`], for a request of `len`-byte data units (XTS):
    /// an engine that takes one unit per operation pays its fixed costs per
    /// unit.
    #[inline]
    pub(crate) fn choose_unit(
        &self,
        alg: Algorithm,
        dir: Direction,
        len: usize,
        unit: usize,
    ) -> (usize, Option<Prediction>) {
        // The fast answers, inline in the request's poll: the CPU alone or
        // pinned (nothing to choose, nothing for a choice to learn), or a
        // request the CPU wins before the engines' queues are even looked at.
        // (Measured: reaching them through the out-of-line `choose_among`
        // cost a 16-byte CRC-64 request 15 ns, a quarter of its time.)
        match self.pinned {
            None if self.backends.is_empty() => return (0, None),
            Some(0) => return (0, None),
            None if self.policy == Policy::Latency
                && (len as u64)
                    < self.cpu_bound[crate::cost::key(alg, dir)].load(Ordering::Relaxed) =>
            {
                return (0, None);
            }
            _ => {}
        }
        self.choose_among(alg, dir, len, unit)
    }

    #[inline(never)]
    fn choose_among(
        &self,
        alg: Algorithm,
        dir: Direction,
        len: usize,
        unit: usize,
    ) -> (usize, Option<Prediction>) {
        if let Some(p) = self.pinned {
            // Pinned to an engine: its completions still teach its model
            // (what `explain` reports). A request of a shape it cannot take
            // (too large, a length it cannot divide) runs on the CPU rather
            // than fail there.
            return match self.predict(p, alg, dir, len, unit) {
                Ok(prediction) => (p, Some(prediction)),
                Err(Exclusion::TooLarge | Exclusion::Length) => (0, None),
                Err(_) => (p, None),
            };
        }
        let best = match self.policy {
            Policy::Latency => self.least(alg, dir, len, unit, |p, b| p.latency < b.latency),
            Policy::CpuSaving { max_latency } => {
                let bound = max_latency.as_nanos() as f64;
                self.least(alg, dir, len, unit, |p, b| {
                    match (p.latency <= bound, b.latency <= bound) {
                        (true, false) => true,
                        (false, true) => false,
                        (true, true) => p.cpu < b.cpu || (p.cpu == b.cpu && p.latency < b.latency),
                        (false, false) => p.latency < b.latency,
                    }
                })
            }
            Policy::Throughput => self.spread(alg, dir, len, unit),
        };
        match best {
            Some(p) => (p.slot, Some(p)),
            // Nothing calibrated: the CPU, which runs everything.
            None => (0, None),
        }
    }

    /// The eligible prediction that `better` ranks first.
    fn least(
        &self,
        alg: Algorithm,
        dir: Direction,
        len: usize,
        unit: usize,
        better: impl Fn(&Prediction, &Prediction) -> bool,
    ) -> Option<Prediction> {
        (0..=self.backends.len())
            .filter_map(|slot| self.predict(slot, alg, dir, len, unit).ok())
            .reduce(|b, p| if better(&p, &b) { p } else { b })
    }

    /// Throughput: while a core is free the request runs here on the CPU.
    /// "Free" counts the deciding thread as taken: `cpu_busy` is the CPU
    /// requests running on *other* threads, so with every worker busy a
    /// worker sees at most `cores - 1` of them, and `cpu_busy < cores` would
    /// never send anything to an engine (measured on `offload scenario qce`,
    /// 2 cores: the engine got 0 of ~10,500 requests and Throughput / sum of
    /// capacities fell from 0.96–1.00 to 0.85–0.94). Once the CPU is busy, a request goes to an engine that has room —
    /// fewer than [`QUEUE_PER_SERVER`] requests per server in flight, so it
    /// always has the next one ready and never idles — and that takes less
    /// of this machine's CPU than doing the work here would (otherwise
    /// offloading frees nothing). The CPU takes the rest. Engines and CPU
    /// then work at once, each at its own capacity.
    fn spread(
        &self,
        alg: Algorithm,
        dir: Direction,
        len: usize,
        unit: usize,
    ) -> Option<Prediction> {
        let cpu = self.predict(0, alg, dir, len, unit).ok();
        let cpu_busy = self.models[0].in_flight.load(Ordering::Relaxed);
        if cpu.is_some() && (cpu_busy == 0 || cpu_busy + 1 < self.cores) {
            return cpu;
        }
        let here = cpu.map_or(f64::MAX, |c| c.base);
        let engine = (1..=self.backends.len())
            .filter_map(|slot| {
                let p = self.predict(slot, alg, dir, len, unit).ok()?;
                let cost = self.models[slot].entry(alg, dir).cost()?;
                let queued = self.models[slot].in_flight.load(Ordering::Relaxed) as f64;
                let keep_fed = QUEUE_PER_SERVER * f64::from(cost.parallelism);
                let room = queued < keep_fed.min(f64::from(cost.queue_depth));
                (room && p.cpu < here).then_some(p)
            })
            .reduce(|b, p| if p.latency < b.latency { p } else { b });
        engine.or(cpu)
    }

    pub(crate) fn slot_name(&self, slot: usize) -> &str {
        if slot == 0 {
            crate::CpuBackend::NAME
        } else {
            self.backends[slot - 1].name()
        }
    }

    pub(crate) fn explain(&self, alg: Algorithm, dir: Direction, len: usize) -> Explanation {
        let (choice, _) = self.choose(alg, dir, len);
        let candidates = (0..=self.backends.len())
            .map(|slot| {
                let in_flight = self.models[slot].in_flight.load(Ordering::Relaxed);
                let backend = self.slot_name(slot).to_owned();
                let excluded = match self.pinned {
                    Some(p) if p != slot => {
                        Some(format!("sessions are pinned to {}", self.slot_name(p)))
                    }
                    _ => None,
                };
                let predicted = self.predict(slot, alg, dir, len, len).map_err(|e| match e {
                    Exclusion::Unsupported => "does not run this algorithm".to_owned(),
                    Exclusion::TooLarge => format!(
                        "takes at most {} bytes a request",
                        self.max_request[slot][crate::cost::key(alg, dir) / 2]
                    ),
                    Exclusion::Length => format!(
                        "takes only multiples of {} bytes",
                        self.multiple[slot][crate::cost::key(alg, dir) / 2]
                    ),
                    Exclusion::Uncalibrated => "not calibrated".to_owned(),
                    Exclusion::CircuitOpen => format!(
                        "circuit open: {}",
                        self.breakers[slot].reason().unwrap_or_default()
                    ),
                });
                match (excluded, predicted) {
                    (Some(why), _) | (None, Err(why)) => Candidate {
                        backend,
                        latency: None,
                        cpu_time: None,
                        in_flight,
                        excluded: Some(why),
                    },
                    (None, Ok(p)) => Candidate {
                        backend,
                        latency: Some(ns(p.latency)),
                        cpu_time: Some(ns(p.cpu)),
                        in_flight,
                        excluded: None,
                    },
                }
            })
            .collect();
        Explanation {
            alg,
            dir,
            len,
            policy: self.policy,
            candidates,
            choice: self.slot_name(choice).to_owned(),
        }
    }
}
