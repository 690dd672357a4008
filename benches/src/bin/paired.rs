//! The fallback against its peers in interleaved rounds: the ratio table
//! for shared machines.
//!
//! ```text
//! cargo run -p crypto-offload-benches --release --bin paired -- [--group gcm,crc-32] [--sizes 16,64,4k] [--ms 300]
//! ```
//!
//! Criterion times one benchmark after another; on a VM whose neighbours
//! come and go, two benchmarks a minute apart can differ by 10–30% with no
//! change in the code, and the ratio table inherits that. Here every
//! contender of a (group, size) runs a short slice (~20 µs) in turn, round
//! after round, for `--ms` milliseconds; each keeps its fastest slice.
//! Interference only ever slows a slice, and it hits every contender
//! alike, so the fastest slices are the code's own speeds, side by side.
//! The contenders are the criterion bench's ([`contenders`]).

use std::time::{Duration, Instant};

use clap::Parser;
use crypto_offload_benches::contenders::{self, Contender};
use crypto_offload_benches::report::{self, Row};
use crypto_offload_benches::{data, parse_size};

#[derive(Parser)]
#[command(about = "The fallback against its peers in interleaved rounds")]
struct Args {
    /// Groups whose name contains one of these (comma-separated), e.g.
    /// `gcm,crc-32`; all when absent.
    #[arg(long, value_delimiter = ',')]
    group: Vec<String>,
    /// Request sizes (e.g. `16,64,4k,1m`); each group's own when absent.
    #[arg(long, value_delimiter = ',', value_parser = parse_size)]
    sizes: Vec<usize>,
    /// Milliseconds of rounds per group and size.
    #[arg(long, default_value_t = 300)]
    ms: u64,
    /// Also print every contender's ns a call, the fallback forced onto
    /// each of its implementations (`fallback-<name>`) included.
    #[arg(long)]
    all: bool,
    /// Bytes past a 64-byte boundary where the data starts (0: on it).
    /// crc-fast's 512-bit CRC loops take 15–75 ns more on data whose
    /// address or length is not a multiple of 16.
    #[arg(long, default_value_t = 0)]
    offset: usize,
}

/// Nanoseconds a slice of each contender aims at: long against the clock's
/// ~20 ns cost, short against a neighbour's burst.
const SLICE_NS: f64 = 20_000.0;

/// The fastest ns per call of each contender over interleaved rounds.
fn race(contenders: &mut [Contender], size: usize, offset: usize, budget: Duration) -> Vec<f64> {
    // One buffer for all: each contender finds it as warm as the last
    // one left it (with a buffer each, a contender's data is as cold as
    // the contenders between its turns make it, which depends on order).
    let mut whole = data(size + 64 + offset);
    let start = whole.as_ptr().align_offset(64).min(64) + offset;
    let buf = &mut whole[start..start + size];
    // Iterations per slice, timed after a warm-up (a first call may
    // measure the CPU's implementations: milliseconds).
    let iters: Vec<u64> = contenders
        .iter_mut()
        .map(|c| {
            c.run(buf, 2);
            let mut n = 1u64;
            loop {
                let start = Instant::now();
                c.run(buf, n);
                let ns = start.elapsed().as_nanos() as f64;
                if ns >= SLICE_NS / 4.0 || n >= 1 << 20 {
                    break ((SLICE_NS / (ns / n as f64)) as u64).max(1);
                }
                n *= 4;
            }
        })
        .collect();
    let mut best = vec![f64::INFINITY; contenders.len()];
    let start = Instant::now();
    let mut round = 0usize;
    while round < 30 || (start.elapsed() < budget && round < 100_000) {
        // A different contender goes first each round.
        for k in 0..contenders.len() {
            let i = (k + round) % contenders.len();
            // Half a slice untimed first. The rotation keeps each
            // contender's predecessor the same round after round, and on
            // Intel a core whose last ~20 µs ran no 512-bit code runs its
            // first AVX-512 instructions slowly for that long: at 1 MiB (a
            // slice is one call) the fallback, listed first, always
            // followed the scalar table CRCs and timed at 0.6–0.9 of
            // crc-fast running the same code (Xeon family 6 model 207),
            // and aws-lc's small GCM seals at 100 ns instead of 65.
            contenders[i].run(buf, iters[i].div_ceil(2));
            let t = Instant::now();
            contenders[i].run(buf, iters[i]);
            let ns = t.elapsed().as_nanos() as f64 / iters[i] as f64;
            best[i] = best[i].min(ns);
        }
        round += 1;
    }
    best
}

fn main() {
    let args = Args::parse();
    let budget = Duration::from_millis(args.ms);
    let mut rows = Vec::new();
    for mut g in contenders::groups() {
        if !args.group.is_empty() && !args.group.iter().any(|s| g.name.contains(s.as_str())) {
            continue;
        }
        let sizes = if args.sizes.is_empty() {
            g.sizes.clone()
        } else {
            args.sizes.clone()
        };
        for size in sizes {
            eprint!("\r{} {size} B          ", g.name);
            let best = race(&mut g.contenders, size, args.offset, budget);
            rows.extend(g.contenders.iter().zip(best).map(|(c, ns)| Row {
                group: g.name.clone(),
                function: c.name.clone(),
                size: size as u64,
                ns,
            }));
        }
    }
    eprintln!();
    println!("{}\n", crypto_offload_fallback::choice::cpu_line());
    println!(
        "Fallback against the fastest CPU peer (fastest ~20 µs slice of each, in interleaved rounds, {} ms per size, data {} bytes past a 64-byte boundary):\n",
        args.ms, args.offset
    );
    print!("{}", report::table(&rows, "fallback"));
    if args.all {
        println!("\nns a call, every contender:\n");
        let mut last = None;
        for r in &rows {
            if last != Some((&r.group, r.size)) {
                print!("\n{} {} B:", r.group, r.size);
                last = Some((&r.group, r.size));
            }
            print!("  {} {:.1}", r.function, r.ns);
        }
        println!();
    }
}
