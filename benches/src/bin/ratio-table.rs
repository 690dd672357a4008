//! Prints the fallback-vs-fastest-peer table and the session-overhead table
//! from the last `cargo bench -p crypto-offload-benches` run.
//!
//! Usage: `cargo run -p crypto-offload-benches --release --bin ratio-table
//! [--best-of-two] [CRITERION_DIR]` (`--best-of-two`: each benchmark's
//! faster of the last two runs, for shared machines).

use std::path::PathBuf;

fn main() -> std::io::Result<()> {
    let mut args: Vec<_> = std::env::args_os().skip(1).collect();
    let best_of_two = args.iter().any(|a| a == "--best-of-two");
    args.retain(|a| a != "--best-of-two");
    let dir = args.first().map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../target/criterion"))
    });
    let rows = crypto_offload_benches::report::load(&dir, best_of_two)?;
    if rows.is_empty() {
        eprintln!(
            "no criterion results under {}: run the bench first",
            dir.display()
        );
        std::process::exit(1);
    }
    println!(
        "Fallback against the fastest CPU peer (median of criterion's samples{}):\n",
        if best_of_two {
            ", the faster of the last two runs"
        } else {
            ""
        }
    );
    print!(
        "{}",
        crypto_offload_benches::report::table(&rows, "fallback")
    );
    let sessions = crypto_offload_benches::report::session_table(&rows);
    if sessions.lines().count() > 2 {
        println!("\nSession API against the direct fallback call:\n");
        print!("{sessions}");
    }
    Ok(())
}
