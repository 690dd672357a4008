//! `record-server`: the AES-128-GCM record echo.
//!
//! ```text
//! record-server [--listen 127.0.0.1:7701 | --insecure-listen ADDR] [--psk-file PATH] [--depth 32]
//!               [--max-connections 256] [--idle-timeout 60]
//!               [--policy throughput] [--backend cpu] [--sim eip197]
//! ```
//!
//! Prints `listening on ADDR` on stdout once it accepts connections; stops
//! cleanly on SIGTERM or Ctrl-C. Without `--psk-file` its key exchange is
//! unauthenticated (it resists passive eavesdropping only), so `--listen`
//! takes loopback addresses only; `--insecure-listen` listens anywhere,
//! with a warning.

#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use crypto_offload::AeadAlg;
use offload_examples::backends::{self, BackendArgs};
use offload_examples::lifecycle::{self, Limits};
use offload_examples::record::handshake::Psk;
use offload_examples::record::protocol::MAX_PAYLOAD;
use offload_examples::record::server::{DEPTH, RecordServer, RecordServerConfig};

/// An echo of AES-128-GCM records, each opened, verified and sealed again.
#[derive(Parser, Debug)]
#[command(name = "record-server", version)]
struct Args {
    /// Loopback address to listen on (port 0: any free port).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7701", value_parser = lifecycle::loopback)]
    listen: SocketAddr,
    /// Listen on this address even if it is not loopback, open to anyone
    /// who can reach it (instead of --listen). Use --psk-file with it.
    #[arg(long, value_name = "ADDR", conflicts_with = "listen")]
    insecure_listen: Option<SocketAddr>,
    /// A pre-shared key (a file of at least 16 random bytes) every client
    /// must hold: it authenticates the key exchange. Without it the
    /// exchange resists passive eavesdropping only.
    #[arg(long, value_name = "PATH")]
    psk_file: Option<PathBuf>,
    /// Records each connection opens and seals at once.
    #[arg(long, default_value_t = DEPTH)]
    depth: usize,
    /// The largest payload taken.
    #[arg(long, default_value_t = MAX_PAYLOAD)]
    max_payload: usize,
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
    let psk = args.psk_file.as_deref().map(Psk::load).transpose()?;
    let offloads = args.backends.offloads().await?;
    for alg in offloads.left_on_cpu(&[AeadAlg::Aes128Gcm.into()]) {
        eprintln!("record-server: the forced backend does not run {alg}: it stays on the CPU");
    }
    eprintln!(
        "record-server: {}; key exchange X25519 + HKDF-SHA256, {}",
        offloads.describe(),
        if psk.is_some() {
            "authenticated by the pre-shared key"
        } else {
            "unauthenticated (no --psk-file): it resists passive eavesdropping only"
        }
    );
    let shutdown = lifecycle::on_signals()?;
    let listener =
        tokio::net::TcpListener::bind(args.insecure_listen.unwrap_or(args.listen)).await?;
    let addr = listener.local_addr()?;
    if args.insecure_listen.is_some() {
        if psk.is_some() {
            tracing::warn!(
                %addr,
                "--insecure-listen: anyone who can reach {addr} can connect; only \
                 clients with the pre-shared key get records through, but anyone \
                 can ask STATS and use up connections"
            );
        } else {
            tracing::warn!(
                %addr,
                "--insecure-listen without --psk-file: clients are not authenticated \
                 and the key exchange is not either: a man in the middle on the way \
                 to {addr} can read and change every record"
            );
        }
    }
    // The tests and scripts wait for this line.
    println!("listening on {addr}");
    let config = RecordServerConfig {
        depth: args.depth,
        max_payload: args.max_payload.min(MAX_PAYLOAD),
        psk,
        limits: args.limits,
    };
    let server = RecordServer::new(offloads, config);
    server.serve(listener, shutdown).await?;
    let s = server.stats();
    eprintln!(
        "record-server: stopped after {} records, {} tampered and {} replayed dropped, {} bad frames; {}",
        s.records,
        s.tampered,
        s.replayed,
        s.bad_frames,
        backends::format_served(&s.backends)
    );
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    lifecycle::init_tracing(args.log);
    match lifecycle::block_on("record-server", run(args)) {
        Some(()) => ExitCode::SUCCESS,
        None => ExitCode::FAILURE,
    }
}
