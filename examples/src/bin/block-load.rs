//! `block-load`: drives a block server and checks every block it reads.
//!
//! ```text
//! block-load [--addr 127.0.0.1:7700] [--connections 4] [--depth 8] [--duration 5]
//!            [--requests N] [--read-percent 50] [--random-percent 50]
//! ```
//!
//! Exits non-zero if any read returned other data than was written, or any
//! request failed.

#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use clap::Parser;
use offload_examples::block::load::{self, LoadConfig};
use offload_examples::{lifecycle, pattern};

/// Load for a block server: connections × depth, reads checked.
#[derive(Parser, Debug)]
#[command(name = "block-load", version)]
struct Args {
    /// The server (loopback only).
    #[arg(long, default_value = "127.0.0.1:7700")]
    addr: SocketAddr,
    /// TCP connections.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// Requests in flight per connection.
    #[arg(long, default_value_t = 8)]
    depth: usize,
    /// Seconds to run.
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Stop after this many requests.
    #[arg(long)]
    requests: Option<u64>,
    /// Percent of requests that read back a block written in this run.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(0..=100))]
    read_percent: u32,
    /// Percent of requests on a random block (the rest are sequential).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(0..=100))]
    random_percent: u32,
    /// Use only the first N blocks of the volume.
    #[arg(long)]
    blocks: Option<u64>,
    /// Seed of the data (default: random).
    #[arg(long)]
    seed: Option<u64>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let Ok(duration) = Duration::try_from_secs_f64(args.duration) else {
        eprintln!("block-load: --duration must be a number of seconds");
        return ExitCode::FAILURE;
    };
    let config = LoadConfig {
        connections: args.connections,
        depth: args.depth,
        requests: args.requests,
        duration,
        read_percent: args.read_percent,
        random_percent: args.random_percent,
        seed: args.seed.unwrap_or_else(pattern::random_u64),
        blocks: args.blocks,
        ..LoadConfig::new(args.addr)
    };
    match lifecycle::block_on(
        "block-load",
        load::run(&config, Arc::new(AtomicBool::new(false))),
    ) {
        Some(report) => {
            println!("{report}");
            if report.is_clean() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        None => ExitCode::FAILURE,
    }
}
