//! Prints the fallback-vs-fastest-peer table and the session-overhead table
//! from the last `cargo bench -p crypto-offload-benches` run.
//!
//! Usage: `cargo run -p crypto-offload-benches --release --bin ratio-table [CRITERION_DIR]`

use std::path::PathBuf;

fn main() -> std::io::Result<()> {
    let dir = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../target/criterion"))
        });
    let rows = crypto_offload_benches::report::load(&dir)?;
    if rows.is_empty() {
        eprintln!(
            "no criterion results under {}: run the bench first",
            dir.display()
        );
        std::process::exit(1);
    }
    println!("Fallback against the fastest CPU peer (median of criterion's samples):\n");
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
