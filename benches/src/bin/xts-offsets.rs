//! Small XTS requests at every buffer offset within a page: whether where
//! the data sits moves a request's time.
//!
//! ```text
//! cargo run -p crypto-offload-benches --release --bin xts-offsets -- [--implementation aws-lc,rustcrypto] [--len 16] [--step 64]
//! ```
//!
//! The measured CPU choice and the `paired` bench time each candidate on
//! one buffer, and on AMD EPYC Zen 3 (family 25 model 1, 2 vCPUs) the
//! small-request time of XTS (and CBC encryption: `cbc-chain`) has two
//! levels, ~30 ns apart at 16 B. This tool asks whether the buffer's
//! offset within a page picks the level: every `--step`-th offset, each
//! followed at once by offset 0 as a reference (a slow spell in time slows
//! both, a slow offset only the first), the second of two passes printed,
//! with a mark where an offset is over 1.25× the least.
//!
//! 2026-12-03, 16 B XTS-AES-256, on that machine: an earlier scan without
//! the reference found AWS-LC at 59–61 ns at most offsets and 88–94 in one
//! contiguous run of offsets ~800 B long, a different run in each of three
//! processes — but offsets scanned in order are also moments in a row.
//! Later runs of this tool found 0 to 51 of 64 offsets slow for AWS-LC and
//! 0 to 24 for the RustCrypto XTS, one process slow at every offset
//! (83.7–97.4 ns), and then, with the reference, one slow offset in three
//! processes (2048: 75.1 ns, offset 0 right after it 60.1). So the levels
//! come and go in time and per process, with at most a weak link to the
//! offset; the cause is not known.
//!
//! 2026-12-04, same machine: the slow level is the machine's, not the
//! layout's. Timed alternately in one process (40 slices each), AWS-LC's
//! and RustCrypto's 16 B XTS were slow together for whole ~370 ms
//! processes (76–85 and 85–103 ns) or fast together (59 and 54), one
//! process switching mid-run; each is slowed by a factor of its own, so
//! the two can swap places. 80 stack depths and 16 key objects × 4
//! buffers in one process made no difference.

use std::hint::black_box;
use std::time::Instant;

use clap::Parser;
use crypto_offload_benches::contenders::KEY;
use crypto_offload_fallback::{Implementation, Xts};

#[derive(Parser)]
#[command(about = "Small XTS-AES-256 requests at every buffer offset within a page")]
struct Args {
    /// Implementations to scan (comma-separated names).
    #[arg(long, value_delimiter = ',', default_value = "aws-lc,rustcrypto")]
    implementation: Vec<String>,
    /// Request length in bytes (one data unit; 16 to 4096).
    #[arg(long, default_value_t = 16)]
    len: usize,
    /// Distance between the offsets timed, in bytes.
    #[arg(long, default_value_t = 64)]
    step: usize,
}

/// The fastest of 7 slices of 20,000 encryptions of `buf`, in ns a call.
fn time(key: &Xts, buf: &mut [u8]) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..7 {
        let t = Instant::now();
        for _ in 0..20_000 {
            key.encrypt(&[1u8; 16], black_box(&mut *buf))
                .expect("a whole data unit");
        }
        best = best.min(t.elapsed().as_secs_f64() * 1e9 / 20_000.0);
    }
    best
}

fn main() {
    let args = Args::parse();
    if !(16..=4096).contains(&args.len) || args.step == 0 {
        eprintln!("xts-offsets: --len must be 16..=4096 and --step positive");
        std::process::exit(2);
    }
    println!("{}\n", crypto_offload_fallback::choice::cpu_line());
    for name in &args.implementation {
        let Some(imp) = Implementation::from_name(name) else {
            eprintln!("xts-offsets: no implementation named {name}");
            std::process::exit(2);
        };
        let key = match Xts::with_implementation(&KEY, imp) {
            Ok(key) => key,
            Err(e) => {
                eprintln!("xts-offsets: {name}: {e}");
                continue;
            }
        };
        let mut page = vec![0u8; 3 * 4096];
        let start = 4096 - page.as_ptr() as usize % 4096;
        // Each offset, then offset 0 right after it: a slow spell in time
        // slows both, a slow offset only the first.
        let mut times = Vec::new();
        for pass in 0..2 {
            for off in (0..4096).step_by(args.step) {
                let t = time(&key, &mut page[start + off..start + off + args.len]);
                let r = time(&key, &mut page[start..start + args.len]);
                if pass == 1 {
                    times.push((off, t, r));
                }
            }
        }
        let least = times.iter().map(|t| t.1).fold(f64::MAX, f64::min);
        let most = times.iter().map(|t| t.1).fold(0.0, f64::max);
        let slow = times.iter().filter(|t| t.1 > least * 1.25).count();
        println!(
            "{name}, {} B: {least:.1}–{most:.1} ns; {slow} of {} offsets over 1.25× the least",
            args.len,
            times.len()
        );
        for (off, t, r) in &times {
            let mark = if *t > least * 1.25 { "  <" } else { "" };
            println!("  offset {off:4}: {t:6.1} ns (offset 0 right after: {r:6.1}){mark}");
        }
    }
}
