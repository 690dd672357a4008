//! Peers for the benchmarks: the fastest CPU implementations available to
//! Rust, and the RustCrypto reference crates, behind one small interface so
//! the benches and the agreement test use exactly the same calls
//! ([`contenders`]).
//!
//! aws-lc-rs has no safe XTS API, so [`AwsLcXts`] calls AWS-LC's EVP interface
//! through aws-lc-sys: the only `unsafe` outside the driver crates, and only
//! in this unpublished bench crate.

pub mod aws_lc_xts;
pub mod contenders;
pub mod report;

pub use aws_lc_xts::AwsLcXts;

/// The sizes every algorithm is measured at.
pub const SIZES: [usize; 6] = [16, 64, 1024, 4096, 65536, 1 << 20];

/// Deterministic test data.
pub fn data(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 + 7) as u8).collect()
}

/// A criterion group with this crate's timing: short warm-up, `measure`
/// per benchmark, `samples` samples (the suite has ~350 benchmarks).
pub fn group<'a>(
    c: &'a mut criterion::Criterion,
    name: &str,
    measure: std::time::Duration,
    samples: usize,
) -> criterion::BenchmarkGroup<'a, criterion::measurement::WallTime> {
    let mut g = c.benchmark_group(name);
    g.warm_up_time(std::time::Duration::from_millis(300))
        .measurement_time(measure)
        .sample_size(samples);
    g
}

/// A size argument: bytes, or with a `k` or `m` suffix (KiB, MiB).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim().to_ascii_lowercase();
    let (num, mul) = match t.strip_suffix('k') {
        Some(n) => (n, 1 << 10),
        None => match t.strip_suffix('m') {
            Some(n) => (n, 1 << 20),
            None => (t.as_str(), 1),
        },
    };
    num.parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mul))
        .ok_or_else(|| format!("{s:?} is not a size (bytes, or with a k or m suffix)"))
}
