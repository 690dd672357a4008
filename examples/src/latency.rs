//! Request latencies, and their percentiles.

use std::time::Duration;

/// Latencies recorded by one or more load generator lanes.
#[derive(Debug, Clone, Default)]
pub struct Latencies {
    nanos: Vec<u64>,
}

/// The percentiles a load generator reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Summary {
    /// Requests measured.
    pub count: usize,
    /// Median.
    pub p50: Duration,
    /// 99th percentile.
    pub p99: Duration,
    /// The slowest.
    pub max: Duration,
}

impl Latencies {
    /// Records one request's latency.
    pub fn record(&mut self, latency: Duration) {
        self.nanos
            .push(u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX));
    }

    /// Adds another lane's latencies.
    pub fn merge(&mut self, other: Latencies) {
        self.nanos.extend(other.nanos);
    }

    /// Requests recorded.
    pub fn len(&self) -> usize {
        self.nanos.len()
    }

    /// Whether none is recorded.
    pub fn is_empty(&self) -> bool {
        self.nanos.is_empty()
    }

    /// p50, p99 and max (nearest rank); all zero when nothing is recorded.
    pub fn summary(mut self) -> Summary {
        self.nanos.sort_unstable();
        let at = |q: f64| -> Duration {
            let n = self.nanos.len();
            if n == 0 {
                return Duration::ZERO;
            }
            // Nearest rank: the smallest value with at least q of the samples at or below it.
            let rank = ((q * n as f64).ceil() as usize).clamp(1, n);
            Duration::from_nanos(self.nanos[rank - 1])
        };
        Summary {
            count: self.nanos.len(),
            p50: at(0.50),
            p99: at(0.99),
            max: at(1.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let mut l = Latencies::default();
        for us in (1..=100).rev() {
            l.record(Duration::from_micros(us));
        }
        let s = l.summary();
        assert_eq!(s.count, 100);
        assert_eq!(s.p50, Duration::from_micros(50));
        assert_eq!(s.p99, Duration::from_micros(99));
        assert_eq!(s.max, Duration::from_micros(100));
        assert_eq!(Latencies::default().summary(), Summary::default());
    }
}
