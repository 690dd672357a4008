//! `block-server`: the encrypted block store.
//!
//! ```text
//! block-server --volume /tmp/vol [--listen 127.0.0.1:7700 | --insecure-listen ADDR]
//!              [--blocks 16384] [--block-size 4096] [--max-connections 256] [--idle-timeout 60]
//!              [--policy throughput] [--backend cpu] [--sim qce]
//! ```
//!
//! Prints `listening on ADDR` on stdout once it accepts connections; stops
//! cleanly (in-flight requests finished, volume marked closed) on SIGTERM
//! or Ctrl-C. It authenticates no client, so `--listen` takes loopback
//! addresses only; `--insecure-listen` listens anywhere, with a warning.

#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use crypto_offload::{CipherAlg, CrcAlg};
use offload_examples::backends::{self, BackendArgs};
use offload_examples::block::server::{BlockServer, BlockServerConfig, MAX_IN_FLIGHT};
use offload_examples::block::volume::{Geometry, Volume, VolumeKey};
use offload_examples::lifecycle::{self, Limits};

/// An encrypted block store: AES-256-XTS blocks with a CRC-32C each, over TCP.
#[derive(Parser, Debug)]
#[command(name = "block-server", version)]
struct Args {
    /// Loopback address to listen on (port 0: any free port). The server
    /// authenticates no client: anyone who reaches it reads and writes
    /// every block.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7700", value_parser = lifecycle::loopback)]
    listen: SocketAddr,
    /// Listen on this address even if it is not loopback, open to anyone
    /// who can reach it (instead of --listen).
    #[arg(long, value_name = "ADDR", conflicts_with = "listen")]
    insecure_listen: Option<SocketAddr>,
    /// The volume file (created if missing).
    #[arg(long)]
    volume: PathBuf,
    /// The 64-byte key file (created with a random key if missing);
    /// default: the volume's path with `.key` appended.
    #[arg(long)]
    key_file: Option<PathBuf>,
    /// Bytes per block, for a new volume.
    #[arg(long, default_value_t = Geometry::default().block_size)]
    block_size: usize,
    /// Blocks, for a new volume.
    #[arg(long, default_value_t = Geometry::default().blocks)]
    blocks: u64,
    /// Requests each connection may have in flight.
    #[arg(long, default_value_t = MAX_IN_FLIGHT)]
    max_in_flight: usize,
    #[command(flatten)]
    limits: Limits,
    #[command(flatten)]
    backends: BackendArgs,
    /// Log level on stderr: error, warn, info, debug, trace.
    #[arg(long, default_value = "warn")]
    log: tracing::Level,
}

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The whole program.
///
/// # Cancel safety
/// Only run to its end by `main`.
async fn run(args: Args) -> Result<(), Error> {
    let offloads = args.backends.offloads().await?;
    for alg in offloads.left_on_cpu(&[CipherAlg::Aes256Xts.into(), CrcAlg::Crc32Iscsi.into()]) {
        eprintln!("block-server: the forced backend does not run {alg}: it stays on the CPU");
    }
    let key_path = args.key_file.clone().unwrap_or_else(|| {
        let mut p = args.volume.clone().into_os_string();
        p.push(".key");
        p.into()
    });
    let (key, created_key) = VolumeKey::load_or_create(&key_path)?;
    if created_key {
        eprintln!("block-server: new key in {}", key_path.display());
    }
    let geometry = Geometry {
        block_size: args.block_size,
        blocks: args.blocks,
    };
    let volume = Volume::open(&args.volume, geometry, &key, &offloads).await?;
    drop(key);
    let opened = volume.opened();
    let g = volume.geometry();
    eprintln!(
        "block-server: {} {}: {} blocks of {} B, {} written{}; {}",
        if opened.created { "created" } else { "opened" },
        args.volume.display(),
        g.blocks,
        g.block_size,
        opened.written,
        match (opened.clean, opened.torn_discarded) {
            (true, _) => String::new(),
            (false, 0) => ", recovered after a crash".to_owned(),
            (false, n) => format!(", recovered after a crash ({n} torn writes discarded)"),
        },
        offloads.describe(),
    );
    let shutdown = lifecycle::on_signals()?;
    let listener =
        tokio::net::TcpListener::bind(args.insecure_listen.unwrap_or(args.listen)).await?;
    let addr = listener.local_addr()?;
    if args.insecure_listen.is_some() {
        tracing::warn!(
            %addr,
            "--insecure-listen: the block server authenticates no client and its \
             requests and blocks cross the network in the clear: anyone who can \
             reach {addr} can read and overwrite every block of {}",
            args.volume.display()
        );
    }
    // The tests and scripts wait for this line.
    println!("listening on {addr}");
    let config = BlockServerConfig {
        max_in_flight: args.max_in_flight,
        limits: args.limits,
    };
    let server = BlockServer::new(volume, offloads, config);
    server.serve(listener, shutdown).await?;
    let stats = server.stats();
    server.close().await?;
    eprintln!(
        "block-server: closed cleanly after {} writes, {} reads, {} bad frames; {}",
        stats.writes,
        stats.reads,
        stats.bad_frames,
        backends::format_served(&stats.backends)
    );
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    lifecycle::init_tracing(args.log);
    match lifecycle::block_on("block-server", run(args)) {
        Some(()) => ExitCode::SUCCESS,
        None => ExitCode::FAILURE,
    }
}
