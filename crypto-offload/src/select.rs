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
//! The selector is a function of the [`Slots`] (their costs, corrections,
//! queues, breakers and power) and the request: [`decide`] for a request
//! about to run, [`choose`] for a question (`explain`, `break_even`). Its
//! only state of its own is the ski-rental regret it keeps in a cold
//! engine's model, and whether a decision explores is an argument, so the
//! tests below drive every rule with hand-made costs.
//!
//! [`Offload::explain`]: crate::Offload::explain

use core::fmt;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::alg::Algorithm;
use crate::cost::{Direction, ns};
use crate::policy::Policy;
use crate::slot::{SlotId, Slots};

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
    /// The part of `latency` that is powering the engine up: it is
    /// suspended now (no session holds it), and the first request pays its
    /// resume. The engine's latency once powered is `latency - resume`.
    pub resume: Option<Duration>,
    /// Why the backend is not eligible, if it is not.
    pub excluded: Option<String>,
    /// What else is true of it: why the choice has no predicted cost
    /// (the CPU is always eligible, a pinned backend is the only one), or
    /// that sessions are pinned to it.
    pub note: Option<String>,
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
                (None, None, _) | (None, _, None) => writeln!(
                    f,
                    "  {:<24} {}",
                    c.backend,
                    c.note.as_deref().unwrap_or("no predicted cost")
                )?,
                (None, Some(l), Some(cpu)) => {
                    write!(
                        f,
                        "  {:<24} latency {:>12?}  cpu {:>12?}  in flight {}",
                        c.backend, l, cpu, c.in_flight
                    )?;
                    if let Some(r) = c.resume {
                        write!(
                            f,
                            "  (suspended: {r:?} of it is the resume; {:?} once powered)",
                            l.saturating_sub(r)
                        )?;
                    }
                    match &c.note {
                        Some(note) => writeln!(f, "  ({note})")?,
                        None => writeln!(f)?,
                    }
                }
            }
        }
        Ok(())
    }
}

use crate::slot::EXPLORE_WITHIN;

/// One decision in this many (per thread) goes to a near runner-up.
const EXPLORE_EVERY: u32 = 32;

/// A thread's call counters, one per (algorithm, direction)
/// ([`key`](crate::cost::key)).
///
/// One counter per thread for all requests aliased with the requests'
/// order: a task that alternates two kinds of request (a CRC, then an
/// encryption, of each block) and is timed one call in 8 timed only the
/// encryptions, so a hog never showed in the CRC's model; the same for
/// exploration turns. Counted per kind, each is sampled at its own rate.
pub(crate) type Ticks = [core::cell::Cell<u32>; crate::cost::KEYS];

/// A thread's [`Ticks`], all at 0 (for `thread_local!`'s `const` form).
pub(crate) const fn no_ticks() -> Ticks {
    [const { core::cell::Cell::new(0) }; crate::cost::KEYS]
}

/// Every `every`th call on this thread for (`alg`, `dir`) with `ticks` (a
/// thread-local counter, so no shared one to contend on): `Some(turn)`,
/// counting those calls.
#[inline]
pub(crate) fn nth_call(
    ticks: &'static std::thread::LocalKey<Ticks>,
    alg: Algorithm,
    dir: Direction,
    every: u32,
) -> Option<u32> {
    ticks.with(|t| {
        let t = t.get(crate::cost::key(alg, dir))?;
        let n = t.get().wrapping_add(1);
        t.set(n);
        n.is_multiple_of(every).then(|| n / every)
    })
}

/// Whether this decision explores, and which turn it is: every
/// [`EXPLORE_EVERY`]th for (`alg`, `dir`) on this thread.
#[inline]
pub(crate) fn explore_turn(alg: Algorithm, dir: Direction) -> Option<u32> {
    thread_local! {
        static TICKS: Ticks = const { no_ticks() };
    }
    nth_call(&TICKS, alg, dir, EXPLORE_EVERY)
}

/// Under the Throughput policy, requests in flight per engine server up to
/// which the engine takes more: one being served and one ready behind it.
const QUEUE_PER_SERVER: f64 = 2.0;

/// A request as the selector weighs it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Request {
    pub(crate) alg: Algorithm,
    pub(crate) dir: Direction,
    /// Its length in bytes.
    pub(crate) len: usize,
    /// Its data unit (XTS; the whole length otherwise): an engine that
    /// takes one unit per operation pays its fixed costs per unit.
    pub(crate) unit: usize,
}

impl Request {
    /// A request of one data unit.
    pub(crate) fn new(alg: Algorithm, dir: Direction, len: usize) -> Self {
        Request {
            alg,
            dir,
            len,
            unit: len,
        }
    }
}

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
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Prediction {
    pub(crate) slot: SlotId,
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
    /// Requests in flight on the slot when it was sent, and how many the
    /// model had the slot serve at once: a completion that found more
    /// ahead than that teaches the engine's parallelism
    /// ([`Entry::observe_loaded`](crate::cost::Entry::observe_loaded)), not
    /// its correction.
    pub(crate) ahead: f64,
    pub(crate) servers: f64,
    /// The prediction includes a device resume: the request's time is not a
    /// service time, and is left out of the model (the resume has its own
    /// measurement, taken by the power domain).
    pub(crate) cold: bool,
    /// Sent to a runner-up to correct its model ([`runner_up`]), or a CPU
    /// choice the model weighed and samples ([`TIME_CPU_EVERY`]): always
    /// timed, even on the CPU's inline path, which times one request in 64.
    pub(crate) explored: bool,
    /// The correction applied to the service time: what a probe of a
    /// backend slowed by a load swing looks past ([`runner_up`]).
    pub(crate) correction: f64,
}

impl Prediction {
    /// The latency as predicted were the backend no slower than
    /// calibrated (its correction at most 1): what it would cost once a
    /// load swing that slowed it is over.
    fn unslowed(&self) -> f64 {
        self.latency - self.expected * (self.correction - 1.0).max(0.0)
    }
}

/// Where a request runs, with the prediction when the choice was made from
/// the model.
pub(crate) type Decision = (SlotId, Option<Prediction>);

/// Whether slot `id` takes `req` now (runs its algorithm, circuit closed,
/// a shape within its limits); if so, the operations it pays for (an
/// engine that takes a data unit per operation pays, and is limited, per
/// unit). No model, no floating point: what a pinned request is checked
/// against every time.
fn fits(slots: &Slots, id: SlotId, req: &Request) -> Result<usize, Exclusion> {
    if id.is_cpu() {
        return Ok(1);
    }
    let slot = &slots[id];
    let Some(limits) = slot.limits(req.alg) else {
        return Err(Exclusion::Unsupported);
    };
    if slot.breaker.is_open() {
        return Err(Exclusion::CircuitOpen);
    }
    let (len, unit) = (req.len, req.unit);
    let (shape, units) = if limits.one_operation_per_unit {
        (unit.min(len), len.div_ceil(unit.max(1)))
    } else {
        (len, 1)
    };
    if limits.max_request.is_some_and(|max| shape > max) {
        return Err(Exclusion::TooLarge);
    }
    if !shape.is_multiple_of(limits.length_multiple) {
        return Err(Exclusion::Length);
    }
    Ok(units)
}

/// One pinned request in this many is predicted and its completion timed
/// into the engine's model (what `explain` reports); the others only have
/// their shape checked. Under TCG, where floating point is emulated, the
/// model's arithmetic on every request cost the pinned VFIO path several
/// µs a request.
const PINNED_SAMPLE_EVERY: u32 = 16;

/// The prediction for one slot, or why it is not eligible.
pub(crate) fn predict(slots: &Slots, id: SlotId, req: &Request) -> Result<Prediction, Exclusion> {
    let Request { alg, dir, len, .. } = *req;
    let slot = &slots[id];
    let units = fits(slots, id, req)?;
    let model = &slot.model;
    let entry = model.entry(alg, dir);
    let Some(cost) = entry.cost() else {
        return Err(Exclusion::Uncalibrated);
    };
    let base = cost.latency_ns_ops(len, units);
    // A long CPU job runs on the blocking pool and pays its hand-off.
    let handoff = if id.is_cpu() && crate::cpu::blocks(len, base) {
        model.handoff_ns.get()
    } else {
        0.0
    };
    let correction = entry.correction_at(len);
    let service = base * correction + handoff;
    let queued = model.in_flight.load(Ordering::Relaxed) as f64;
    let servers = if id.is_cpu() {
        slots.cores as f64
    } else {
        entry.servers()
    };
    let waiting = if id.is_cpu() && slots.policy != Policy::Throughput {
        // Inline on the calling task: the CPU path does not queue.
        0.0
    } else {
        (queued + 1.0 - servers).max(0.0) / servers
    };
    let wait = waiting * service;
    let cold = slot.is_cold();
    let resume = if cold { model.resume_ns.get() } else { 0.0 };
    Ok(Prediction {
        slot: id,
        latency: service + wait + resume,
        cpu: cost.cpu_ns_ops(len, units),
        base,
        expected: base * (1.0 + waiting),
        ahead: queued,
        servers,
        cold,
        explored: false,
        correction,
    })
}

/// The slot a request that is about to run goes to: as [`choose`], then
/// [`rent_or_buy`] under the Latency policy, and — when `explore` (asked
/// only then: [`explore_turn`] for a request) says it is a turn — a near
/// runner-up instead ([`runner_up`]). Unlike `choose`, which `explain` and
/// `break_even` ask freely, this keeps account of what cold engines would
/// have saved: call it once per request.
#[inline(always)]
pub(crate) fn decide(
    slots: &Slots,
    req: &Request,
    explore: impl FnOnce() -> Option<u32>,
) -> Decision {
    settle(slots, req, choose(slots, req), explore)
}

/// [`decide`] without [`cpu_at_once`]'s answer: for a request under the
/// CPU bound that the CPU would still send to the blocking pool (a bound
/// refreshed from a CPU cost since replaced), which is weighed with its
/// hand-off as any request that leaves the task.
#[inline(never)]
pub(crate) fn decide_weighed(
    slots: &Slots,
    req: &Request,
    explore: impl FnOnce() -> Option<u32>,
) -> Decision {
    settle(slots, req, choose_among(slots, req), explore)
}

#[inline(always)]
fn settle(
    slots: &Slots,
    req: &Request,
    (slot, predicted): Decision,
    explore: impl FnOnce() -> Option<u32>,
) -> Decision {
    match predicted {
        Some(p) if slots.pinned.is_none() && slots.policy == Policy::Latency => {
            rent_or_explore(slots, p, req, explore())
        }
        _ => (slot, predicted),
    }
}

/// [`decide`]'s second step, out of line: the common answers (the CPU
/// alone, a pin, a request under the CPU bound) return before it. `decide`
/// itself is always inlined: called, it received the request through memory
/// written a byte at a time and read back in words, a store-forwarding stall
/// that cost a 16-byte CRC ~6 ns of its ~35 (measured with `perf annotate`
/// on the session bench).
#[inline(never)]
fn rent_or_explore(slots: &Slots, p: Prediction, req: &Request, turn: Option<u32>) -> Decision {
    let mut p = rent_or_buy(slots, p, req);
    if let Some(turn) = turn {
        p = runner_up(slots, p, req, turn).unwrap_or(p);
    }
    if p.slot.is_cpu() && !p.explored {
        thread_local! {
            static TICKS: Ticks = const { no_ticks() };
        }
        p.explored = nth_call(&TICKS, req.alg, req.dir, TIME_CPU_EVERY).is_some();
    }
    (p.slot, Some(p))
}

/// One CPU request in this many of those the model weighed against an
/// engine is timed into the CPU's model (the inline path times one in 64
/// under 64 KiB and, from there, one in this many:
/// `session::TIME_LARGE_EVERY`). The CPU's correction learns only from timed requests, and a
/// CPU slowed by a hog must be seen within a few dozen requests to give
/// way to an engine: at one in 64 the three slow samples that move it
/// ([`SHIFT_UP_RUN`](crate::cost::SHIFT_UP_RUN)) took ~190 requests. A
/// weighed request is one an engine could win or be explored on, so it
/// takes at least 1/[`EXPLORE_WITHIN`] of an engine's fixed latency (µs):
/// two clock reads (~50 ns) and the model's update on one in 8 are a few
/// per cent of it at most.
pub(crate) const TIME_CPU_EVERY: u32 = 8;

/// A warm backend other than `chosen` predicted within [`EXPLORE_WITHIN`]
/// of it, or that would be were it no slower than calibrated (a probe:
/// see below) — the `turn`th of them, so that every one is tried in turn. A
/// backend's correction learns only from the requests it serves, so without
/// this the one a calibration happened to favour keeps every request of a
/// size while a near-equal rival's model is never put right (measured in
/// the guest: two VFIO devices 5% apart at 256 KiB, Auto held the slower
/// one at 0.94 of the oracle; and with only the nearest rival tried, the
/// CPU, third, was never re-measured at 16 KiB, 0.93). One request in
/// [`EXPLORE_EVERY`] of such near ties goes to a rival, costing at most
/// `(EXPLORE_WITHIN - 1) / EXPLORE_EVERY` (under 1%) while it lasts.
///
/// A backend that a load swing slowed (its correction above 1) is probed
/// the same way when only its correction keeps it out of reach: without
/// it, a backend that looked slow during a swing was never sent a request
/// again, and its model never saw the swing end (measured in a QEMU guest
/// on a loaded host: Auto at 0.68–0.75 of the oracle). Such a probe costs
/// at most what the swing adds to one request in [`EXPLORE_EVERY`] (a 3×
/// swing on an engine that won by 1.7×: 2% while it lasts); two probes
/// that find it back ([`SHIFT_DOWN_RUN`](crate::cost::SHIFT_DOWN_RUN))
/// put its correction back.
fn runner_up(slots: &Slots, chosen: Prediction, req: &Request, turn: u32) -> Option<Prediction> {
    let near = || {
        slots
            .ids()
            .filter(move |&id| id != chosen.slot)
            .filter_map(move |id| predict(slots, id, req).ok())
            .filter(move |p| !p.cold && p.unslowed() <= chosen.latency * EXPLORE_WITHIN)
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

/// Ski rental for powered-down engines. A cold engine's prediction carries
/// its whole resume, which one request rarely repays and a stream of them
/// does: with only the per-request view the CPU wins every request of the
/// stream and the engine never wakes. So while a request goes elsewhere
/// although a cold engine, once powered, would have been faster, the time
/// it would have saved accumulates; when that reaches the engine's resume
/// time, this request pays the resume. A stream then costs at most about
/// twice what the best choice in hindsight would have (the classic
/// break-even bound), and a lone request never wakes a device for nothing.
fn rent_or_buy(slots: &Slots, chosen: Prediction, req: &Request) -> Prediction {
    let mut buy: Option<Prediction> = None;
    for id in slots.engine_ids() {
        // Only a powered-down engine is weighed, and whether it is one is
        // an atomic load: predicting each warm engine again (after
        // `choose`) doubled the decision's cost, 2.6 µs of 5.4 under TCG in
        // the guest (float arithmetic is emulated there).
        if id == chosen.slot || !slots[id].is_cold() {
            continue;
        }
        let Ok(p) = predict(slots, id, req) else {
            continue;
        };
        if !p.cold {
            continue;
        }
        let model = &slots[id].model;
        let resume = model.resume_ns.get();
        let saving = chosen.latency - (p.latency - resume);
        if saving <= 0.0 {
            continue;
        }
        // Not an atomic read-modify-write: concurrent requests may lose a
        // little of each other's regret, which only delays the wake.
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

/// The slot a request would run on now, with its prediction when the
/// choice was made from the model. Free of side effects.
#[inline(always)]
pub(crate) fn choose(slots: &Slots, req: &Request) -> Decision {
    // The fast answers, inline in the request's poll: the CPU alone or
    // pinned (nothing to choose, nothing for a choice to learn), or a
    // request the CPU wins before the engines' queues are even looked at.
    // (Measured: reaching them through the out-of-line `choose_among` cost
    // a 16-byte CRC-64 request 15 ns, a quarter of its time.)
    if cpu_at_once(slots, req) {
        return (SlotId::CPU, None);
    }
    choose_among(slots, req)
}

/// Whether `req` goes to the CPU without weighing anything ([`choose`]'s
/// fast answers): the CPU alone or pinned, or a request under the CPU
/// bound. A request's poll asks this before [`decide`], so that on this
/// path no [`Decision`] is built: its `None` prediction, a byte written
/// and then read back in a word when the decision was copied, stalled
/// store forwarding for ~28% of a 16-byte CRC-32C request's pipeline on
/// AMD Zen 3 (`perf annotate`).
#[inline(always)]
pub(crate) fn cpu_at_once(slots: &Slots, req: &Request) -> bool {
    match slots.pinned {
        None if !slots.has_engines() => true,
        Some(p) => p.is_cpu(),
        None => {
            slots.policy == Policy::Latency && (req.len as u64) < slots.cpu_bound(req.alg, req.dir)
        }
    }
}

#[inline(never)]
fn choose_among(slots: &Slots, req: &Request) -> Decision {
    if let Some(p) = slots.pinned {
        // Pinned to an engine: a sample of its completions still teaches
        // its model (what `explain` reports). A request of a shape it
        // cannot take (too large, a length it cannot divide) runs on the
        // CPU rather than fail there.
        thread_local! {
            static TICKS: Ticks = const { no_ticks() };
        }
        let sampled = nth_call(&TICKS, req.alg, req.dir, PINNED_SAMPLE_EVERY).is_some();
        let fit = if sampled {
            predict(slots, p, req).map(Some)
        } else {
            fits(slots, p, req).map(|_| None)
        };
        return match fit {
            Ok(prediction) => (p, prediction),
            Err(Exclusion::TooLarge | Exclusion::Length) => (SlotId::CPU, None),
            Err(_) => (p, None),
        };
    }
    let best = match slots.policy {
        Policy::Latency => least(slots, req, |p, b| p.latency < b.latency),
        Policy::CpuSaving { max_latency } => {
            let bound = max_latency.as_nanos() as f64;
            least(slots, req, |p, b| {
                match (p.latency <= bound, b.latency <= bound) {
                    (true, false) => true,
                    (false, true) => false,
                    (true, true) => p.cpu < b.cpu || (p.cpu == b.cpu && p.latency < b.latency),
                    (false, false) => p.latency < b.latency,
                }
            })
        }
        Policy::Throughput => spread(slots, req),
    };
    match best {
        Some(p) => (p.slot, Some(p)),
        // Nothing calibrated: the CPU, which runs everything.
        None => (SlotId::CPU, None),
    }
}

/// The eligible prediction that `better` ranks first.
fn least(
    slots: &Slots,
    req: &Request,
    better: impl Fn(&Prediction, &Prediction) -> bool,
) -> Option<Prediction> {
    slots
        .ids()
        .filter_map(|id| predict(slots, id, req).ok())
        .reduce(|b, p| if better(&p, &b) { p } else { b })
}

/// Throughput: while a core is free the request runs here on the CPU —
/// unless an engine with room would finish it sooner, which then takes it:
/// a free core is worth using only for work it does no slower than the
/// engine would. (A CPU without AES instructions took 13 ms of a core for a
/// 64 KiB XTS block that a device did in ~1.3 ms, in the weak-CPU guest;
/// "free" counts only the CPU's crypto in flight, not the server's own work
/// that core was needed for, and the block store under Throughput ran at
/// 0.62x of the device alone.) "Free" counts the deciding thread as taken:
/// the CPU's in-flight count is the CPU requests running on *other*
/// threads, so with every worker busy a worker sees at most `cores - 1` of
/// them, and `busy < cores` would never send anything to an engine
/// (measured on `offload scenario qce`, 2 cores: the engine got 0 of
/// ~10,500 requests and Throughput / sum of capacities fell from 0.96–1.00
/// to 0.85–0.94). Once the CPU is busy, a request goes to an engine that
/// has room — fewer than [`QUEUE_PER_SERVER`] requests per server in
/// flight, so it always has the next one ready and never idles — and that
/// takes less of this machine's CPU than doing the work here would
/// (otherwise offloading frees nothing). The CPU takes the rest. Engines
/// and CPU then work at once, each at its own capacity.
fn spread(slots: &Slots, req: &Request) -> Option<Prediction> {
    let cpu = predict(slots, SlotId::CPU, req).ok();
    let cpu_busy = slots.cpu_slot().model.in_flight.load(Ordering::Relaxed);
    let core_free = cpu.is_some() && (cpu_busy == 0 || cpu_busy + 1 < slots.cores);
    let here = cpu.map_or(f64::MAX, |c| c.base);
    let engine = slots
        .engine_ids()
        .filter_map(|id| {
            let p = predict(slots, id, req).ok()?;
            let model = &slots[id].model;
            let cost = model.entry(req.alg, req.dir).cost()?;
            let queued = model.in_flight.load(Ordering::Relaxed) as f64;
            let keep_fed = QUEUE_PER_SERVER * model.entry(req.alg, req.dir).servers();
            // Room: fewer than it needs to stay fed, or — a queue the CPU
            // would not beat — its completion, queue included, still
            // sooner than the CPU's (a weak CPU: a device ~10x faster,
            // 2 a server left a third of 64 KiB XTS to a CPU that took
            // 13 ms a block, in the weak-CPU guest's block store).
            let sooner = cpu.is_some_and(|c| p.latency < c.latency);
            let room = queued < f64::from(cost.queue_depth) && (queued < keep_fed || sooner);
            (room && p.cpu < here).then_some(p)
        })
        .reduce(|b, p| if p.latency < b.latency { p } else { b });
    match (engine, cpu) {
        (Some(e), Some(c)) if core_free && c.latency <= e.latency => Some(c),
        (Some(e), _) => Some(e),
        (None, c) => c,
    }
}

/// Every candidate's reckoning for a `len`-byte request, and the choice.
pub(crate) fn explain(slots: &Slots, alg: Algorithm, dir: Direction, len: usize) -> Explanation {
    let req = &Request::new(alg, dir, len);
    let (choice, _) = choose(slots, req);
    let candidates = slots
        .ids()
        .map(|id| {
            let slot = &slots[id];
            let in_flight = slot.model.in_flight.load(Ordering::Relaxed);
            let backend = slot.name().to_owned();
            // What runs the request is never "excluded" (a pinned session's
            // request of a shape its engine cannot take runs on the CPU).
            let excluded = match slots.pinned {
                Some(p) if p != id && id != choice => {
                    Some(format!("sessions are pinned to {}", slots[p].name()))
                }
                _ => None,
            };
            let limits = slot.limits(alg).copied().unwrap_or_default();
            let predicted = predict(slots, id, req).map_err(|e| match e {
                Exclusion::Unsupported => "does not run this algorithm".to_owned(),
                Exclusion::TooLarge => format!(
                    "takes at most {} bytes a request",
                    limits.max_request.unwrap_or(usize::MAX)
                ),
                Exclusion::Length => {
                    format!("takes only multiples of {} bytes", limits.length_multiple)
                }
                Exclusion::Uncalibrated => "not calibrated".to_owned(),
                Exclusion::CircuitOpen => format!(
                    "circuit open: {}",
                    slot.breaker.reason().unwrap_or_default()
                ),
            });
            let pinned_here = slots.pinned == Some(id);
            match (excluded, predicted) {
                // What runs the request is never "excluded": say why it has
                // no predicted cost instead.
                (None, Err(why)) if id == choice => Candidate {
                    backend,
                    latency: None,
                    cpu_time: None,
                    in_flight,
                    resume: None,
                    excluded: None,
                    note: Some(if pinned_here {
                        format!("pinned; no predicted cost ({why})")
                    } else if id.is_cpu() && slots.pinned.is_some() {
                        "runs it: the pinned backend cannot take this request".to_owned()
                    } else if id.is_cpu() {
                        "always eligible; its cost is not measured (nothing to weigh it against)"
                            .to_owned()
                    } else {
                        why
                    }),
                },
                (Some(why), _) | (None, Err(why)) => Candidate {
                    backend,
                    latency: None,
                    cpu_time: None,
                    in_flight,
                    resume: None,
                    excluded: Some(why),
                    note: None,
                },
                (None, Ok(p)) => Candidate {
                    backend,
                    latency: Some(ns(p.latency)),
                    cpu_time: Some(ns(p.cpu)),
                    in_flight,
                    resume: p.cold.then(|| ns(slot.model.resume_ns.get())),
                    excluded: None,
                    note: pinned_here.then(|| "pinned".to_owned()),
                },
            }
        })
        .collect();
    Explanation {
        alg,
        dir,
        len,
        policy: slots.policy,
        candidates,
        choice: slots[choice].name().to_owned(),
    }
}

#[cfg(test)]
mod tests;
