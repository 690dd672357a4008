//! Building `Offload`s from the command line, and the small commands.

use std::path::PathBuf;
use std::sync::Arc;

use crypto_offload::af_alg::AfAlgBackend;
use crypto_offload::backend::Backend;
use crypto_offload::vfio::VfioBackend;
use crypto_offload::{Algorithm, Direction, Offload, OffloadBuilder, Policy, Profile};
use crypto_offload_sim::{SimConfig, SimEngine};

use crate::Backends;

/// The error every command returns: a message for the user.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// Parses `latency`, `throughput`, `cpu-saving` or `cpu-saving=MS`.
pub fn policy(s: &str) -> Result<Policy, Error> {
    Ok(s.parse()?)
}

/// Parses an algorithm name (`aes-256-xts`, `crc-32/iscsi`, `crc32c`, …).
pub fn algorithm(s: &str) -> Result<Algorithm, Error> {
    Algorithm::from_name(s).ok_or_else(|| {
        let names: Vec<&str> = Algorithm::all().map(|a| a.name()).collect();
        format!("unknown algorithm {s:?}; one of: {}", names.join(", ")).into()
    })
}

/// The simulated engines named on the command line.
pub fn sims(b: &Backends) -> Result<Vec<Arc<SimEngine>>, Error> {
    b.sims
        .iter()
        .map(|name| {
            SimConfig::preset(name)
                .map(|mut c| {
                    c.compute_results = !b.sim_skip_results;
                    Arc::new(SimEngine::new(c))
                })
                .ok_or_else(|| {
                    format!(
                        "unknown --sim {name:?}; presets: {}",
                        SimConfig::PRESETS.join(", ")
                    )
                    .into()
                })
        })
        .collect()
}

/// The AF_ALG backends asked for (the engines discovery finds, unless
/// `--no-af-alg`, and the `--af-alg-driver`s), and a line saying what AF_ALG
/// offers here.
pub fn af_alg(b: &Backends) -> Result<(Vec<Arc<AfAlgBackend>>, String), Error> {
    let mut out = Vec::new();
    let status = match AfAlgBackend::discover() {
        Err(why) => format!("AF_ALG: unavailable: {}", why.0),
        Ok(engines) if b.no_af_alg => format!(
            "AF_ALG: {} hardware engine(s) left out (--no-af-alg)",
            engines.len()
        ),
        Ok(engines) => {
            let names: Vec<String> = engines.iter().map(|e| e.name().to_owned()).collect();
            out.extend(engines.into_iter().map(Arc::new));
            if names.is_empty() {
                "AF_ALG: available; no hardware engine (CPU-backed kernel drivers are not \
                 offered: --af-alg-driver binds one)"
                    .to_owned()
            } else {
                format!("AF_ALG: hardware engines {}", names.join(", "))
            }
        }
    };
    if !b.af_alg_drivers.is_empty() {
        let drivers: Vec<&str> = b.af_alg_drivers.iter().map(String::as_str).collect();
        let explicit = AfAlgBackend::with_drivers("af-alg:drivers", &drivers)
            .map_err(|why| format!("--af-alg-driver: {}", why.0))?;
        out.push(Arc::new(explicit));
    }
    Ok((out, status))
}

/// The VFIO devices this process opened ([`open_vfio`]), and a line
/// saying what VFIO offers here.
static VFIO: std::sync::OnceLock<(Vec<Arc<VfioBackend>>, String)> = std::sync::OnceLock::new();

/// Opens the virtio-crypto devices bound to `vfio-pci` (unless
/// `--no-vfio`), once for the process: a device opens once at a time, and
/// every `Offload` a command builds shares them.
pub async fn open_vfio(b: &Backends) {
    if VFIO.get().is_some() {
        return;
    }
    let opened = match VfioBackend::discover().await {
        Err(why) => (Vec::new(), format!("VFIO: unavailable: {}", why.0)),
        Ok(devices) if b.no_vfio => (
            Vec::new(),
            format!("VFIO: {} device(s) left out (--no-vfio)", devices.len()),
        ),
        Ok(devices) => {
            let names: Vec<String> = devices.iter().map(|d| d.name().to_owned()).collect();
            (
                devices.into_iter().map(Arc::new).collect(),
                format!("VFIO: devices {}", names.join(", ")),
            )
        }
    };
    let _ = VFIO.set(opened);
}

/// The opened VFIO backends and the VFIO status line.
fn vfio() -> (Vec<Arc<VfioBackend>>, String) {
    VFIO.get()
        .cloned()
        .unwrap_or_else(|| (Vec::new(), "VFIO: not probed".to_owned()))
}

/// A builder with the CPU, the AF_ALG engines, the VFIO devices, the
/// simulated engines and the policy.
pub fn builder(b: &Backends, sims: &[Arc<SimEngine>]) -> Result<OffloadBuilder, Error> {
    let mut builder = Offload::builder().policy(policy(&b.policy)?);
    for engine in af_alg(b)?.0 {
        builder = builder.backend(engine);
    }
    for device in vfio().0 {
        builder = builder.backend(device);
    }
    for sim in sims {
        builder = builder.backend(sim.clone());
    }
    if let Some(path) = &b.profile {
        builder = builder.profile(Profile::from_toml(&std::fs::read_to_string(path)?)?);
    }
    Ok(builder)
}

/// A calibrated (or profiled) `Offload`.
pub async fn offload(b: &Backends, sims: &[Arc<SimEngine>]) -> Result<Offload, Error> {
    let offload = builder(b, sims)?.build()?;
    if b.profile.is_none() {
        offload.calibrate().await?;
    }
    Ok(offload)
}

pub async fn probe(b: &Backends) -> Result<(), Error> {
    let sims = sims(b)?;
    let offload = offload(b, &sims).await?;
    println!(
        "{:<14} {:<10} {:<12} {:<44} algorithms",
        "backend", "kind", "power", "status"
    );
    for info in offload.backends() {
        let power = match info.power {
            None => "-".to_owned(),
            Some(p) => format!(
                "{} r{}/s{}",
                if p.powered { "on" } else { "off" },
                p.resumes,
                p.suspends
            ),
        };
        let status = info
            .unavailable
            .clone()
            .unwrap_or_else(|| "available".to_owned());
        let algs: Vec<&str> = info.algorithms.iter().map(|a| a.name()).collect();
        // A simulated engine is `BackendKind::Other` to crypto-offload: the kind
        // column still says what it is.
        let kind = if sims.iter().any(|s| s.name() == info.name) {
            "simulated".to_owned()
        } else {
            format!("{:?}", info.kind).to_lowercase()
        };
        println!(
            "{:<14} {:<10} {:<12} {:<44} {}",
            info.name,
            kind,
            power,
            status,
            algs.join(" ")
        );
    }
    println!("\n{}", crypto_offload::cpu_choice::cpu_line());
    if crypto_offload::cpu_choice::built_unoptimised() {
        println!(
            "WARNING: the CPU code is built unoptimised (opt-level {}): the timings below are \
             ~50x what a release build gets (build with --release, or set \
             [profile.dev.package.\"*\"] opt-level = 3)",
            crypto_offload::cpu_choice::OPT_LEVEL
        );
    }
    print!("{}", cpu_implementations(&offload));
    println!("\n{}", af_alg(b)?.1);
    println!("{}", vfio().1);
    Ok(())
}

/// Per CPU mode, the implementations chosen and up to which length each
/// runs, and why: the measured time a request of every candidate at each
/// probe length, or where the choice was given.
pub fn cpu_implementations(offload: &crypto_offload::Offload) -> String {
    use crypto_offload::cpu::ChoiceSource;
    use crypto_offload::cpu_choice::{self, Mode, PROBES};
    let probes: Vec<String> = PROBES.iter().map(|&p| size_name(p)).collect();
    let mut out = format!(
        "CPU implementations (measured: ns a request at {}):\n",
        probes.join(" / ")
    );
    for mode in Mode::ALL {
        let (choice, source) = offload.cpu_choice(mode);
        let why = match source {
            ChoiceSource::Measured => {
                let m = cpu_choice::measured_full(mode);
                let each: Vec<String> = m
                    .timings
                    .iter()
                    .map(|t| {
                        let ns: Vec<String> =
                            t.times.iter().map(|d| d.as_nanos().to_string()).collect();
                        format!("{} {}", t.implementation.name(), ns.join("/"))
                    })
                    .collect();
                let batches = match m.batches {
                    1 => String::new(),
                    n => format!(", {n} batches: in doubt after one"),
                };
                format!(
                    "measured in {:.1} ms{batches}: {}",
                    m.took.as_secs_f64() * 1e3,
                    each.join(", ")
                )
            }
            ChoiceSource::Given => "from the profile".to_owned(),
            ChoiceSource::Forced => "forced".to_owned(),
            _ => format!("{source:?}"),
        };
        let runs = if choice.small == choice.large {
            choice.small.name().to_owned()
        } else {
            format!(
                "{} to {}, then {}",
                choice.small.name(),
                size_name(choice.small_max),
                choice.large.name()
            )
        };
        out += &format!("  {:<11} {runs:<30} ({why})\n", mode.name());
    }
    let crc64 = cpu_choice::crc64_limit_measured();
    let ns =
        |d: Option<std::time::Duration>| d.map_or("-".to_owned(), |d| d.as_nanos().to_string());
    let each: Vec<String> = crc64
        .timings
        .iter()
        .map(|t| {
            format!(
                "{} B {}/{}/{}/{}",
                t.len,
                ns(t.table),
                ns(t.fold),
                t.crc_fast.as_nanos(),
                t.crc_fast_unaligned.as_nanos()
            )
        })
        .collect();
    let runs = if crc64.crc_fast_from > crc64.limit {
        format!(
            "table to {}, fold to {} ({} unaligned), then crc-fast",
            size_name(crc64.limit - 1),
            size_name(crc64.crc_fast_from - 1),
            upto(crc64.crc_fast_from_unaligned)
        )
    } else {
        format!("table to {}, then crc-fast", size_name(crc64.limit - 1))
    };
    out += &format!(
        "  {:<11} {runs:<30} (measured in {:.2} ms, ns table/fold/crc-fast/crc-fast 8 bytes off: {})\n",
        "crc-64",
        crc64.took.as_secs_f64() * 1e3,
        each.join(", ")
    );
    let c32 = cpu_choice::crc32_unaligned_measured();
    let each: Vec<String> = c32
        .timings
        .iter()
        .map(|(len, slow, fast)| {
            format!(
                "{} {}/{}",
                size_name(*len),
                slow.as_nanos(),
                fast.as_nanos()
            )
        })
        .collect();
    out += &format!(
        "  {:<11} {:<30} (measured in {:.2} ms, 8 bytes off a boundary, ns crc32fast/crc-fast: {})\n",
        "crc32 off",
        format!(
            "crc32fast {} where crc-fast leaves 64 B or more over",
            upto(c32.crc_fast_from)
        ),
        c32.took.as_secs_f64() * 1e3,
        each.join(", ")
    );
    out
}

/// `to <the longest length below from>` ([`size_name`]), or `at any
/// length` where a measured limit is past every length (`usize::MAX`).
fn upto(from: usize) -> String {
    match from {
        usize::MAX => "at any length".into(),
        from => format!("to {}", size_name(from.saturating_sub(1))),
    }
}

/// `len` bytes as people write it: `512 B`, `4 KiB`, `1500 B`.
fn size_name(len: usize) -> String {
    if len >= 1024 && len.is_multiple_of(1024) {
        format!("{} KiB", len >> 10)
    } else {
        format!("{len} B")
    }
}

pub async fn calibrate(b: &Backends, out: Option<PathBuf>) -> Result<(), Error> {
    let sims = sims(b)?;
    let offload = builder(b, &sims)?.build()?;
    let started = std::time::Instant::now();
    offload.calibrate().await?;
    let toml = offload.profile().to_toml()?;
    match out {
        Some(path) => {
            std::fs::write(&path, toml)?;
            eprintln!(
                "calibrated {} backends in {:.0} ms; profile written to {}",
                offload.backends().len(),
                started.elapsed().as_secs_f64() * 1e3,
                path.display()
            );
        }
        None => print!("{toml}"),
    }
    Ok(())
}

pub async fn explain(b: &Backends, alg: &str, sizes: &[usize], decrypt: bool) -> Result<(), Error> {
    let sims = sims(b)?;
    let offload = offload(b, &sims).await?;
    let dir = if decrypt {
        Direction::Decrypt
    } else {
        Direction::Encrypt
    };
    let alg = algorithm(alg)?;
    for &size in sizes {
        print!("{}", offload.explain(alg, dir, size));
    }
    Ok(())
}
