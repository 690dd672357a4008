//! `offload`: what engines this machine has, and whether they are worth it.
//!
//! ```text
//! offload probe                      # backends, algorithms, availability, power
//! offload bench [--sim qce] [--plot throughput.svg] [--json]
//! offload calibrate --out profile.toml
//! offload explain --alg aes-256-xts --size 1k,64k --sim qce
//! offload scenario omap|qce|mcrc64|eip197
//! offload checksum --alg crc64-nvme [--base64] FILE… | --check LIST
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

mod bench;
mod checksum;
mod key;
mod plot;
mod scenario;
mod setup;

#[derive(Parser)]
#[command(
    name = "offload",
    version,
    about = "Probe, benchmark and calibrate crypto engines against the CPU"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Which backends to use besides the CPU and what is found on this machine.
#[derive(Args, Clone, Debug, Default)]
pub struct Backends {
    /// Add a simulated engine (repeatable): omap, qce, mcrc64, eip197.
    #[arg(long = "sim", value_name = "PRESET")]
    pub sims: Vec<String>,
    /// Selection policy for Auto: latency, throughput, cpu-saving[=MS].
    #[arg(long, default_value = "latency")]
    pub policy: String,
    /// Load the cost model from a saved profile instead of calibrating.
    #[arg(long, value_name = "FILE")]
    pub profile: Option<PathBuf>,
    /// Let the simulated engines skip computing results: for capacity runs
    /// (Throughput, CpuSaving), where the simulator's own CPU work — every
    /// simulated byte is also computed by the CPU code — would be charged to
    /// the CPU the engine is meant to relieve. Results are then wrong.
    #[arg(long)]
    pub sim_skip_results: bool,
    /// Leave out the hardware engines AF_ALG offers (they are used by default).
    #[arg(long)]
    pub no_af_alg: bool,
    /// Bind these kernel drivers through AF_ALG as one more backend,
    /// `af-alg:drivers` (repeatable; CPU-backed drivers such as
    /// cbc-aes-aesni too, which discovery leaves out).
    #[arg(long = "af-alg-driver", value_name = "DRIVER")]
    pub af_alg_drivers: Vec<String>,
    /// Leave out the virtio-crypto devices bound to vfio-pci (they are
    /// opened and used by default).
    #[arg(long)]
    pub no_vfio: bool,
}

#[derive(Subcommand)]
enum Command {
    /// List the backends found here, their algorithms, why any is unavailable, and their power state.
    Probe {
        #[command(flatten)]
        backends: Backends,
    },
    /// Per size: throughput, latency and CPU time per byte of every backend and of Auto,
    /// the per-size best backend (oracle), Auto/oracle and the break-even size.
    Bench(bench::BenchArgs),
    /// Measure the cost model and print (or save) it as a TOML profile.
    Calibrate {
        #[command(flatten)]
        backends: Backends,
        /// Write the profile here.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Show where a request would run, with every candidate's predicted cost.
    Explain {
        #[command(flatten)]
        backends: Backends,
        /// Algorithm, e.g. aes-256-xts, aes-128-gcm, crc-32/iscsi.
        #[arg(long)]
        alg: String,
        /// Request sizes in bytes, comma-separated, with an optional k or m
        /// suffix (KiB, MiB): e.g. `512,1k,2k,4k` around a break-even.
        #[arg(long, value_delimiter = ',', required = true, value_parser = bench::parse_size_arg)]
        size: Vec<usize>,
        /// Explain a decryption / open.
        #[arg(long)]
        decrypt: bool,
    },
    /// Replay one of the seed scenarios on its simulated engine.
    Scenario(scenario::ScenarioArgs),
    /// Print (or with --check, verify) the CRC of each file, as sha256sum
    /// does digests: hex, or S3's base64 form.
    Checksum(checksum::ChecksumArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    log_to_stderr();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("offload: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        // VFIO devices open once per process; every Offload a command
        // builds shares them.
        let backends = match &cli.command {
            Command::Probe { backends }
            | Command::Calibrate { backends, .. }
            | Command::Explain { backends, .. } => Some(backends),
            Command::Bench(args) => Some(&args.backends),
            Command::Checksum(args) => Some(&args.backends),
            Command::Scenario(_) => None,
        };
        if let Some(b) = backends {
            setup::open_vfio(b).await;
        }
        match cli.command {
            Command::Probe { backends } => setup::probe(&backends).await,
            Command::Bench(args) => bench::run(args).await,
            Command::Calibrate { backends, out } => setup::calibrate(&backends, out).await,
            Command::Explain {
                backends,
                alg,
                size,
                decrypt,
            } => setup::explain(&backends, &alg, &size, decrypt).await,
            Command::Scenario(args) => scenario::run(args).await,
            Command::Checksum(args) => checksum::run(args).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("offload: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `OFFLOAD_LOG` (tracing targets and levels, e.g.
/// `crypto_offload=trace` for every observation the model learns from, or
/// `debug`): the library's `tracing` events on standard error. Unset, none.
fn log_to_stderr() {
    let Ok(spec) = std::env::var("OFFLOAD_LOG") else {
        return;
    };
    match spec.parse::<tracing_subscriber::filter::Targets>() {
        Ok(filter) => {
            use tracing_subscriber::layer::SubscriberExt as _;
            use tracing_subscriber::util::SubscriberInitExt as _;
            let fmt = tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(false);
            let _ = tracing_subscriber::registry()
                .with(fmt)
                .with(filter)
                .try_init();
        }
        Err(e) => eprintln!("offload: OFFLOAD_LOG={spec:?} ignored: {e}"),
    }
}
