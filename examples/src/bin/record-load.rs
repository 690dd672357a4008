//! `record-load`: records/s and MB/s of a record server, per record size
//! and number of connections, every echo opened and checked.
//!
//! ```text
//! record-load [--addr 127.0.0.1:7701] [--sizes 64,512,1500,16384] [--connections 1,16]
//!             [--duration 2] [--window 32] [--psk-file PATH] [--policy …] [--backend …] [--sim …]
//! ```
//!
//! The `--policy`, `--backend` and `--sim` flags choose the load
//! generator's own backends (it seals and opens too). Exits non-zero if
//! any echo differed or any connection failed.

#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use offload_examples::backends::{BackendArgs, format_served};
use offload_examples::record::handshake::Psk;
use offload_examples::record::load::{self, RecordLoadConfig};
use offload_examples::{lifecycle, pattern};

/// Load for a record server: a table of kpps and MB/s.
#[derive(Parser, Debug)]
#[command(name = "record-load", version)]
struct Args {
    /// The server (loopback only).
    #[arg(long, default_value = "127.0.0.1:7701")]
    addr: SocketAddr,
    /// Record sizes in bytes.
    #[arg(long, value_delimiter = ',', default_values_t = [64, 512, 1500, 16384])]
    sizes: Vec<usize>,
    /// Connection counts.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 16])]
    connections: Vec<usize>,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 2.0)]
    duration: f64,
    /// Records in flight per connection.
    #[arg(long, default_value_t = 32)]
    window: usize,
    /// Stop each connection after this many records.
    #[arg(long)]
    records: Option<u64>,
    /// The pre-shared key file the server was given with --psk-file.
    #[arg(long, value_name = "PATH")]
    psk_file: Option<PathBuf>,
    #[command(flatten)]
    backends: BackendArgs,
}

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The whole program.
///
/// # Cancel safety
/// Only run to its end by `main`.
async fn run(args: Args) -> Result<bool, Error> {
    let Ok(duration) = Duration::try_from_secs_f64(args.duration) else {
        return Err("--duration must be a number of seconds".into());
    };
    let psk = args
        .psk_file
        .as_deref()
        .map(Psk::load)
        .transpose()?
        .map(Arc::new);
    let offloads = args.backends.offloads().await?;
    let offload = offloads.for_alg(crypto_offload::AeadAlg::Aes128Gcm).clone();
    let mut clean = true;
    let mut header = false;
    for &size in &args.sizes {
        for &connections in &args.connections {
            let config = RecordLoadConfig {
                size,
                connections,
                window: args.window,
                duration,
                records: args.records,
                seed: pattern::random_u64(),
                psk: psk.clone(),
                ..RecordLoadConfig::new(args.addr)
            };
            let p = load::run(&config, &offload).await?;
            if !header {
                println!("server {}", p.selection);
                println!(
                    "{:>7} {:>5} {:>9} {:>8} {:>8} {:>8} {:>8} {:>11}  server backends",
                    "size", "conns", "records", "kpps", "MB/s", "p50 µs", "p99 µs", "server CPU"
                );
                header = true;
            }
            let us = |d: Duration| d.as_secs_f64() * 1e6;
            println!(
                "{:>7} {:>5} {:>9} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>11}  {}",
                size,
                p.connections,
                p.records,
                p.kpps(),
                p.mb_per_s(),
                us(p.latency.p50),
                us(p.latency.p99),
                p.server_cpu.map_or("?".to_owned(), |c| format!(
                    "{:.0}%",
                    100.0 * c.as_secs_f64() / p.elapsed.as_secs_f64().max(1e-9)
                )),
                format_served(&p.served),
            );
            if !p.is_clean() {
                clean = false;
                eprintln!(
                    "record-load: {size} B × {connections}: {} mismatches, {} failed connections {:?}",
                    p.mismatches, p.errors, p.error_messages
                );
            }
        }
    }
    Ok(clean)
}

fn main() -> ExitCode {
    let args = Args::parse();
    match lifecycle::block_on("record-load", run(args)) {
        Some(true) => ExitCode::SUCCESS,
        _ => ExitCode::FAILURE,
    }
}
