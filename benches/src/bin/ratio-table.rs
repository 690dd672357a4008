//! Prints the fallback-vs-fastest-peer table from the last
//! `cargo bench -p crypto-offload-benches --bench fallback` run.
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
    print!(
        "{}",
        crypto_offload_benches::report::table(&rows, "fallback")
    );
    Ok(())
}
