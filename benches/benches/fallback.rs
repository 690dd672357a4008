//! The CPU fallback against the fastest CPU implementations available to Rust
//! and the RustCrypto reference crates, at 16 B – 1 MiB, single core.
//!
//! ```text
//! cargo bench -p crypto-offload-benches --bench fallback
//! cargo run -p crypto-offload-benches --release --bin ratio-table
//! ```
//!
//! The contenders and their names are [`crypto_offload_benches::contenders`]
//! (shared with the `paired` binary, which times the same calls in
//! interleaved rounds). The GCM thread split is timed here only.

use std::hint::black_box;
use std::time::{Duration, Instant};

mod common;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use crypto_offload_benches::contenders::{self, KEY};
use crypto_offload_benches::data;
use crypto_offload_fallback::{Gcm, Implementation};

fn group<'a>(
    c: &'a mut Criterion,
    name: &str,
) -> criterion::BenchmarkGroup<'a, criterion::measurement::WallTime> {
    common::group(c, name, Duration::from_millis(900), 20)
}

/// Every contender of every group at each of its sizes.
fn fallback(c: &mut Criterion) {
    for mut gr in contenders::groups() {
        let mut g = group(c, &gr.name);
        for cont in &mut gr.contenders {
            for &size in &gr.sizes {
                g.throughput(Throughput::Bytes(size as u64));
                let mut buf = data(size);
                g.bench_function(BenchmarkId::new(&cont.name, size), |b| {
                    b.iter_custom(|iters| {
                        let start = Instant::now();
                        cont.run(&mut buf, iters);
                        start.elapsed()
                    })
                });
            }
        }
        g.finish();
    }
}

/// GCM split over threads against the serial call, per implementation, at
/// sizes a blocking-pool job has (the session splits only from
/// `Gcm::PARALLEL_MIN_THREADS` threads; this shows why).
fn gcm_threads(c: &mut Criterion) {
    let mut g = group(c, "gcm-128-seal-threads");
    let nonce = [3u8; 12];
    for &imp in Implementation::ALL {
        let k = Gcm::with_implementation(&KEY[..16], imp).unwrap();
        for threads in [1usize, 2] {
            let name = format!("{}-{threads}-thread", imp.name());
            for size in [1 << 20, 16 << 20] {
                g.throughput(Throughput::Bytes(size as u64));
                let mut buf = data(size);
                g.bench_with_input(BenchmarkId::new(&name, size), &size, |b, _| {
                    b.iter(|| {
                        black_box(
                            k.seal_in_place_detached_parallel(&nonce, b"", &mut buf, threads)
                                .unwrap(),
                        )
                    })
                });
            }
        }
    }
    g.finish();
}

criterion_group!(benches, fallback, gcm_threads);
criterion_main!(benches);
