//! How often the measured CPU choice changes from one measurement to the
//! next: one batch of rounds against up to `MAX_BATCHES` (extra batches
//! while the choice is in doubt), in alternation, in one process.
//!
//! ```text
//! cargo run -p crypto-offload-benches --release --bin choice-stability -- [--runs 100] [--mode xts,crc32c] [--limits 1,3]
//! ```
//!
//! Per mode and per batch limit, every distinct choice (small implementation,
//! large implementation; the boundary between them is left out: it moves
//! with near-equal candidates without changing what runs where either is
//! clearly faster) and how many runs made it, then how many runs strayed
//! from the most common choice and what the measurements took. A machine
//! whose neighbours come and go is the case this is for: run it beside a
//! build.

use std::collections::BTreeMap;
use std::time::Duration;

use clap::Parser;
use crypto_offload_fallback::choice::{self, MAX_BATCHES, Mode};

#[derive(Parser)]
#[command(about = "How often the measured CPU choice changes between measurements")]
struct Args {
    /// Measurements per mode and batch limit.
    #[arg(long, default_value_t = 100)]
    runs: usize,
    /// Modes (comma-separated names, e.g. `xts,crc32c`); all when absent.
    #[arg(long, value_delimiter = ',')]
    mode: Vec<String>,
    /// The batch limits compared, in the order each run measures them
    /// (`3,1` puts the doubting measurement first: a fresh process's first
    /// measurement is the one a server makes); 1 and `MAX_BATCHES` when
    /// absent.
    #[arg(long, value_delimiter = ',')]
    limits: Vec<usize>,
}

fn main() {
    let args = Args::parse();
    let modes: Vec<Mode> = if args.mode.is_empty() {
        Mode::ALL.to_vec()
    } else {
        args.mode
            .iter()
            .map(|n| Mode::from_name(n).unwrap_or_else(|| panic!("no mode {n:?}")))
            .collect()
    };
    println!("{}", choice::cpu_line());
    println!(
        "{} measurements per mode and batch limit, alternating; choices as small/large",
        args.runs
    );
    for mode in modes {
        let limits = if args.limits.is_empty() {
            vec![1, MAX_BATCHES]
        } else {
            args.limits.clone()
        };
        let mut seen: Vec<BTreeMap<String, usize>> = vec![BTreeMap::new(); limits.len()];
        let mut took = vec![Duration::ZERO; limits.len()];
        let mut batches = vec![0usize; limits.len()];
        for _ in 0..args.runs {
            for (k, &limit) in limits.iter().enumerate() {
                let m = choice::measure_batches(mode, mode.candidates(), limit);
                let c = m.choice;
                let name = format!("{}/{}", c.small.name(), c.large.name());
                *seen[k].entry(name).or_default() += 1;
                took[k] += m.took;
                batches[k] += m.batches;
            }
        }
        for (k, &limit) in limits.iter().enumerate() {
            let most = seen[k].values().copied().max().unwrap_or(0);
            let each: Vec<String> = seen[k].iter().map(|(c, n)| format!("{c} {n}")).collect();
            println!(
                "{:<11} at most {limit} batch(es): strayed {:>3} of {}; {:.1} batches, {:.2} ms a measurement; {}",
                mode.name(),
                args.runs - most,
                args.runs,
                batches[k] as f64 / args.runs as f64,
                took[k].as_secs_f64() * 1e3 / args.runs as f64,
                each.join(", ")
            );
        }
    }
}
