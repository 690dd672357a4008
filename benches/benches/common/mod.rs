//! What the two criterion benches share. Here rather than in the crate's
//! library, so that criterion is a dev-dependency: the release binaries the
//! QEMU guests run (`af-alg-overhead`, `vfio-vs-dpdk`, ...) link the
//! library and no longer build criterion and its tree.

use std::time::Duration;

use criterion::Criterion;
use criterion::measurement::WallTime;

/// A criterion group with this crate's timing: short warm-up, `measure`
/// per benchmark, `samples` samples (the suite has ~350 benchmarks).
pub fn group<'a>(
    c: &'a mut Criterion,
    name: &str,
    measure: Duration,
    samples: usize,
) -> criterion::BenchmarkGroup<'a, WallTime> {
    let mut g = c.benchmark_group(name);
    g.warm_up_time(Duration::from_millis(300))
        .measurement_time(measure)
        .sample_size(samples);
    g
}
