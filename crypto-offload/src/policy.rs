//! The selection policy: how the selector trades latency against CPU time.

use core::fmt;
use std::time::Duration;

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
