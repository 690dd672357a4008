//! Fault injection: what becomes of each request ([`Fate`]), drawn from a
//! seeded generator, and the "device gone" state.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::config::SimFaults;

/// What the device does with one request.
pub(crate) enum Fate {
    /// It completes.
    Complete,
    /// It fails with an I/O error (EIO).
    Error,
    /// It hangs until the engine's own deadline, then times out.
    Hang,
    /// The device is gone.
    Gone,
}

/// The engine's fault state: the request count, whether the device is gone,
/// and the fault generator.
pub(crate) struct Faults {
    config: SimFaults,
    requests: AtomicU64,
    gone: AtomicBool,
    rng: Rng,
}

impl Faults {
    pub(crate) fn new(config: SimFaults) -> Self {
        Faults {
            config,
            requests: AtomicU64::new(0),
            gone: AtomicBool::new(false),
            rng: Rng::new(config.seed),
        }
    }

    /// Requests submitted so far.
    pub(crate) fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    pub(crate) fn is_gone(&self) -> bool {
        self.gone.load(Ordering::Relaxed)
    }

    pub(crate) fn set_gone(&self, gone: bool) {
        self.gone.store(gone, Ordering::Relaxed);
    }

    /// Counts a request and draws its fate.
    pub(crate) fn fate(&self) -> Fate {
        let n = self.requests.fetch_add(1, Ordering::Relaxed) + 1;
        let f = &self.config;
        if f.gone_after.is_some_and(|g| n > g) {
            self.set_gone(true);
        }
        if self.is_gone() {
            return Fate::Gone;
        }
        if f.error_rate > 0.0 || f.timeout_rate > 0.0 {
            let r = self.rng.next_f64();
            if r < f.error_rate {
                return Fate::Error;
            }
            if r < f.error_rate + f.timeout_rate {
                return Fate::Hang;
            }
        }
        Fate::Complete
    }
}

/// A xorshift64 generator shared by the engine's submitters (lock-free: a
/// compare-and-swap per draw), so that a seed gives one sequence of fates
/// in submission order.
struct Rng(AtomicU64);

impl Rng {
    fn new(seed: u64) -> Self {
        // xorshift's state must not be 0.
        Rng(AtomicU64::new(seed | 1))
    }

    /// A uniform draw in [0, 1).
    fn next_f64(&self) -> f64 {
        let mut x = self.0.load(Ordering::Relaxed);
        loop {
            let mut y = x;
            y ^= y << 13;
            y ^= y >> 7;
            y ^= y << 17;
            match self
                .0
                .compare_exchange_weak(x, y, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return (y >> 11) as f64 / (1u64 << 53) as f64,
                Err(now) => x = now,
            }
        }
    }
}
