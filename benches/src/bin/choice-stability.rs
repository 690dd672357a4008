//! How often the measured CPU choice changes from one measurement to the
//! next: one batch of rounds against up to `MAX_BATCHES` (extra batches
//! while the choice is in doubt), in alternation.
//!
//! ```text
//! cargo run -p crypto-offload-benches --release --bin choice-stability -- [--runs 100] [--fresh] [--mode xts,crc32c] [--limits 1,3]
//! ```
//!
//! Per mode and per batch limit, every distinct choice (small implementation,
//! large implementation; the boundary between them is left out: it moves
//! with near-equal candidates without changing what runs where either is
//! clearly faster) and how many runs made it, how many runs strayed from
//! the most common choice, and what a measurement took; then whether the
//! limits' most common choices agree. With `--fresh` every run is a new
//! process (this program again), as a server's start is: a fresh process's
//! first measurement strays more often than a warm one's. A machine whose
//! neighbours come and go is the case this is for: run it beside a build.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use clap::Parser;
use crypto_offload_fallback::choice::{self, MAX_BATCHES, Mode};

#[derive(Parser)]
#[command(about = "How often the measured CPU choice changes between measurements")]
struct Args {
    /// Measurements per mode and batch limit.
    #[arg(long, default_value_t = 100)]
    runs: usize,
    /// Each run in a new process (this program again).
    #[arg(long)]
    fresh: bool,
    /// Modes (comma-separated names, e.g. `xts,crc32c`); all when absent.
    #[arg(long, value_delimiter = ',')]
    mode: Vec<String>,
    /// The batch limits compared, in the order each run measures them
    /// (`3,1` puts the doubting measurement first); 1 and `MAX_BATCHES`
    /// when absent.
    #[arg(long, value_delimiter = ',')]
    limits: Vec<usize>,
    /// (Internal: one run of `--fresh`, printed for the parent.)
    #[arg(long, hide = true)]
    child: bool,
}

/// One measurement: the batch limit, the choice, the batches it took and
/// how long.
struct Sample {
    limit: usize,
    choice: String,
    batches: usize,
    took: Duration,
}

/// Every limit's measurement of `mode`, in `limits`' order, here.
fn measure(mode: Mode, limits: &[usize]) -> Vec<Sample> {
    limits
        .iter()
        .map(|&limit| {
            let m = choice::measure_batches(mode, mode.candidates(), limit);
            Sample {
                limit,
                choice: format!("{}/{}", m.choice.small.name(), m.choice.large.name()),
                batches: m.batches,
                took: m.took,
            }
        })
        .collect()
}

/// [`measure`] in a new process.
fn measure_fresh(mode: Mode, limits: &[usize]) -> Vec<Sample> {
    let limits: Vec<String> = limits.iter().map(ToString::to_string).collect();
    let exe = std::env::current_exe().expect("this program's path");
    let out = Command::new(exe)
        .args([
            "--child",
            "--mode",
            mode.name(),
            "--limits",
            &limits.join(","),
        ])
        .output()
        .expect("running this program again");
    assert!(out.status.success(), "child failed: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| {
            let f: Vec<&str> = line.split(' ').collect();
            let [limit, choice, batches, took_ns] = f[..] else {
                panic!("child line {line:?}")
            };
            Sample {
                limit: limit.parse().expect("limit"),
                choice: choice.to_owned(),
                batches: batches.parse().expect("batches"),
                took: Duration::from_nanos(took_ns.parse().expect("ns")),
            }
        })
        .collect()
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
    let limits = if args.limits.is_empty() {
        vec![1, MAX_BATCHES]
    } else {
        args.limits.clone()
    };
    if args.child {
        for mode in modes {
            for s in measure(mode, &limits) {
                println!(
                    "{} {} {} {}",
                    s.limit,
                    s.choice,
                    s.batches,
                    s.took.as_nanos()
                );
            }
        }
        return;
    }
    println!("{}", choice::cpu_line());
    println!(
        "{} measurements per mode and batch limit ({}), alternating; choices as small/large",
        args.runs,
        if args.fresh {
            "each in a new process"
        } else {
            "all in this process"
        }
    );
    let (mut strays, mut total) = (vec![0; limits.len()], 0);
    for mode in modes {
        let mut seen: Vec<BTreeMap<String, usize>> = vec![BTreeMap::new(); limits.len()];
        let mut took = vec![Duration::ZERO; limits.len()];
        let mut batches = vec![0usize; limits.len()];
        for _ in 0..args.runs {
            let samples = if args.fresh {
                measure_fresh(mode, &limits)
            } else {
                measure(mode, &limits)
            };
            for (k, s) in samples.into_iter().enumerate() {
                debug_assert_eq!(s.limit, limits[k]);
                *seen[k].entry(s.choice).or_default() += 1;
                took[k] += s.took;
                batches[k] += s.batches;
            }
        }
        total += args.runs;
        let mut commonest = Vec::new();
        for (k, &limit) in limits.iter().enumerate() {
            let (top, most) = seen[k]
                .iter()
                .max_by_key(|(_, n)| **n)
                .map_or((String::new(), 0), |(c, n)| (c.clone(), *n));
            commonest.push(top);
            strays[k] += args.runs - most;
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
        if commonest.windows(2).any(|w| w[0] != w[1]) {
            println!(
                "{:<11} the limits' most common choices differ: {}",
                mode.name(),
                commonest.join(" vs ")
            );
        }
    }
    for (k, &limit) in limits.iter().enumerate() {
        println!(
            "all modes, at most {limit} batch(es): strayed {} of {total}",
            strays[k]
        );
    }
}
