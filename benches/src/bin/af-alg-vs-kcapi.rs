//! The AF_ALG backend through `Offload` against libkcapi, the reference
//! AF_ALG user, on the same kernel driver in one run (issue 17):
//! AES-128-CBC at 64 B, 256 B, 1 KiB and 2 KiB with 64 requests in flight.
//!
//! Ours: `--tasks` tokio tasks (2 workers, the guest's vCPUs) each awaiting
//! `encrypt(iv, Vec)` on a session of an `Offload` pinned to an
//! `AfAlgBackend` binding only `--driver` — the path an application calls —
//! once with each mechanism (`threads`: the request threads; `aio`: batched
//! native AIO), plus one task alone (a lone request's latency). The peer:
//! `kcapi-peer` (benches/kcapi-peer, built against libkcapi and packed by
//! `cargo xtask vm-test --bin-file kcapi-peer=…`) with the same driver,
//! sizes and depth, two ways: `iov` (one handle, `kcapi_cipher_encrypt_aio`
//! with 64 iovecs a call, one IV for all) and `handles` (64 threads, a
//! handle each, one request a call). Ops/s, and CPU time per request: this
//! process's (or the peer's) user+system, and the whole guest's busy time
//! from /proc/stat (kernel threads and interrupts included).
//!
//! Every column is measured once a round, in alternating rounds (the host
//! running the guest is shared), and the median round of each is shown.
//!
//! `af-alg-vs-kcapi [--peer /bin/kcapi-peer] [--time-ms 500] [--rounds 3] [--tasks 64]`

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use crypto_offload::af_alg::{AfAlgBackend, AfAlgMechanism};
use crypto_offload::{CipherAlg, Offload};

#[derive(Parser, Debug)]
struct Args {
    /// The libkcapi peer (skipped if missing).
    #[arg(long, default_value = "/bin/kcapi-peer")]
    peer: PathBuf,
    /// The kernel driver both sides bind.
    #[arg(long, default_value = "virtio_crypto_aes_cbc")]
    driver: String,
    /// Milliseconds each measurement runs.
    #[arg(long, default_value_t = 500)]
    time_ms: u64,
    /// Requests in flight (tasks; the peer's depth, at most 64).
    #[arg(long, default_value_t = 64)]
    tasks: usize,
    /// Also run the peer's iov mode (64 reads on one socket per call). Off
    /// by default: on QEMU 10.0's virtio-crypto it makes the guest driver
    /// send a zero-length buffer, which QEMU rejects ("virtio: zero sized
    /// buffers are not allowed"), breaking the device for the rest of the
    /// boot.
    #[arg(long)]
    kcapi_iov: bool,
    /// Rounds (each measures every column once; the median is shown).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Request sizes in bytes.
    #[arg(long, value_delimiter = ',', default_values_t = [64usize, 256, 1024, 2048])]
    sizes: Vec<usize>,
}

/// CPU time in seconds: this process's (user + system), and the guest's
/// busy time over all CPUs (everything but idle and iowait).
#[derive(Clone, Copy)]
struct Cpu {
    process: f64,
    guest: f64,
}

/// USER_HZ: /proc reports times in these ticks (100 on every Linux ABI).
const TICK: f64 = 0.01;

fn cpu_now() -> Cpu {
    let process = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            // Fields after the command's closing parenthesis; utime and
            // stime are the 14th and 15th of the line.
            let rest = &s[s.rfind(')')? + 2..];
            let f: Vec<&str> = rest.split_whitespace().collect();
            Some((f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?) * TICK)
        })
        .unwrap_or(0.0);
    let guest = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| {
            let line = s.lines().next()?;
            let v: Vec<f64> = line
                .split_whitespace()
                .skip(1)
                .filter_map(|x| x.parse().ok())
                .collect();
            // user nice system idle iowait irq softirq steal ...
            let all: f64 = v.iter().take(8).sum();
            Some((all - v.get(3)? - v.get(4)?) * TICK)
        })
        .unwrap_or(0.0);
    Cpu { process, guest }
}

/// One measurement: requests a second, and µs of CPU a request (process,
/// guest).
#[derive(Clone, Copy, Default)]
struct Row {
    ops_per_s: f64,
    cpu_us: f64,
    guest_us: f64,
}

fn row(ops: u64, secs: f64, before: Cpu, after: Cpu) -> Row {
    let n = ops.max(1) as f64;
    Row {
        ops_per_s: ops as f64 / secs,
        cpu_us: (after.process - before.process) * 1e6 / n,
        guest_us: (after.guest - before.guest) * 1e6 / n,
    }
}

/// Ours, through `Offload`: `tasks` tasks for `time`, and one task alone.
/// Returns (loaded, lone µs per request, reads per io_submit).
async fn ours(
    args: &Args,
    mechanism: AfAlgMechanism,
    size: usize,
) -> Result<(Row, f64, f64), String> {
    let name = "af-alg:virtio_crypto";
    let backend = AfAlgBackend::with_drivers(name, &[args.driver.as_str()])
        .map_err(|e| e.0)?
        .with_mechanism(mechanism);
    let offload = Offload::builder()
        .backend(Arc::new(backend))
        .pin(name)
        .build()
        .map_err(|e| e.to_string())?;
    let session = Arc::new(
        offload
            .cipher(CipherAlg::Aes128Cbc, &[0x24; 16])
            .await
            .map_err(|e| e.to_string())?,
    );
    // Warm up: operation sockets for every task, the AIO context.
    let warm: Vec<_> = (0..args.tasks)
        .map(|_| {
            let s = session.clone();
            tokio::spawn(async move { s.encrypt([1; 16], vec![7u8; size]).await.is_ok() })
        })
        .collect();
    for t in warm {
        t.await.map_err(|e| e.to_string())?;
    }
    let time = Duration::from_millis(args.time_ms);
    // A lone request at a time.
    let lone = {
        let start = Instant::now();
        let mut n = 0u32;
        let mut buf = vec![7u8; size];
        while start.elapsed() < time / 4 || n < 3 {
            buf = session
                .encrypt([2; 16], buf)
                .await
                .map_err(|e| e.to_string())?;
            n += 1;
        }
        start.elapsed().as_secs_f64() * 1e6 / f64::from(n)
    };
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let c0 = crypto_offload_af_alg::aio_counts();
    let before = cpu_now();
    let start = Instant::now();
    let tasks: Vec<_> = (0..args.tasks)
        .map(|i| {
            let (s, stop, done) = (session.clone(), stop.clone(), done.clone());
            tokio::spawn(async move {
                let mut buf = vec![i as u8; size];
                let iv = [i as u8; 16];
                while !stop.load(Ordering::Relaxed) {
                    buf = match s.encrypt(iv, buf).await {
                        Ok(b) => b,
                        Err(e) => return Err(e.to_string()),
                    };
                    done.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            })
        })
        .collect();
    tokio::time::sleep(time).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.map_err(|e| e.to_string())??;
    }
    let secs = start.elapsed().as_secs_f64();
    let after = cpu_now();
    let c1 = crypto_offload_af_alg::aio_counts();
    let stats = offload
        .backends()
        .into_iter()
        .find(|b| b.name == name)
        .map(|b| b.stats)
        .ok_or("no stats")?;
    if stats.failures != 0 {
        return Err(format!(
            "{} requests failed over to the CPU",
            stats.failures
        ));
    }
    let ratio = |a: u64, b: u64| if b > 0 { a as f64 / b as f64 } else { 0.0 };
    let batch = ratio(c1.submitted - c0.submitted, c1.submits - c0.submits);
    let reaped = ratio(c1.reaped - c0.reaped, c1.reaps - c0.reaps);
    if mechanism == AfAlgMechanism::Aio {
        println!(
            "# aio size={size}: {} io_submit ({batch:.2} reads each), {} io_getevents ({reaped:.2} completions each) in {secs:.2} s",
            c1.submits - c0.submits,
            c1.reaps - c0.reaps
        );
    }
    Ok((
        row(done.load(Ordering::Relaxed), secs, before, after),
        lone,
        batch,
    ))
}

/// The median round by ops/s (all zero if none).
fn median_row(rows: &mut [Row]) -> Row {
    rows.sort_by(|a, b| a.ops_per_s.total_cmp(&b.ops_per_s));
    rows.get(rows.len() / 2).copied().unwrap_or_default()
}

/// [`median_row`] for our rounds: the median by ops/s, with the median
/// lone latency and batch of all rounds.
fn median(rows: &mut [(Row, f64, f64)]) -> (Row, f64, f64) {
    let mid = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    let lone = mid(rows.iter().map(|r| r.1).collect());
    let batch = mid(rows.iter().map(|r| r.2).collect());
    let mut loaded: Vec<Row> = rows.iter().map(|r| r.0).collect();
    (median_row(&mut loaded), lone, batch)
}

/// The peer, one mode at one size: its own report, with the guest's busy
/// time around it.
fn peer(args: &Args, mode: &str, size: usize) -> Result<Row, String> {
    let before = cpu_now();
    let mut child = std::process::Command::new(&args.peer)
        .args(["-d", &args.driver, "-m", mode])
        .args(["-t", &args.time_ms.to_string()])
        .args(["-q", &args.tasks.min(64).to_string()])
        .arg(size.to_string())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("{}: {e}", args.peer.display()))?;
    // A hung engine must not hang the bench: the peer has no timeout.
    let limit = Instant::now() + Duration::from_millis(args.time_ms * 4 + 10_000);
    while child.try_wait().map_err(|e| e.to_string())?.is_none() {
        if Instant::now() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("kcapi-peer {mode} {size}: hung, killed"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    let after = cpu_now();
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "kcapi-peer {mode} {size}: {}\n{text}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let line = text
        .lines()
        .find(|l| l.starts_with("kcapi "))
        .ok_or_else(|| format!("kcapi-peer printed no result: {text}"))?;
    println!("# {line}");
    let field = |k: &str| -> Option<f64> {
        line.split_whitespace()
            .find_map(|f| f.strip_prefix(k)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
    };
    let ops = field("ops").ok_or("no ops")?;
    Ok(Row {
        ops_per_s: field("ops_per_s").ok_or("no ops_per_s")?,
        cpu_us: field("cpu_us_per_op").ok_or("no cpu")?,
        // Around the whole process (its set-up too): an upper bound.
        guest_us: (after.guest - before.guest) * 1e6 / ops.max(1.0),
    })
}

fn main() {
    let args = Args::parse();
    if let Err(e) = crypto_offload_af_alg::probe() {
        eprintln!("{}", crypto_offload_af_alg::unavailable_reason(&e));
        std::process::exit(1);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .expect("a runtime");
    let has_peer = args.peer.exists();
    if !has_peer {
        println!(
            "# {} missing: libkcapi's columns are skipped (build it with benches/kcapi-peer/build)",
            args.peer.display()
        );
    }
    println!(
        "# AES-128-CBC on {}, {} requests in flight, {} ms a measurement; \
         ops/s, then CPU µs a request (process / whole guest); median of {} rounds",
        args.driver, args.tasks, args.time_ms, args.rounds
    );
    let mut table = Vec::new();
    let mut failed = false;
    let n = args.sizes.len();
    let mut threads = vec![Vec::new(); n];
    let mut aio = vec![Vec::new(); n];
    let mut kcapi = vec![[Vec::new(), Vec::new()]; n];
    // Alternating rounds, so that drift in the guest's speed (the host is
    // shared) falls on every column alike; the median round of each. Ours
    // first in each round, then the peer (its iov mode last: a QEMU device
    // that breaks would take only the later columns with it).
    for round in 0..args.rounds {
        for (k, &size) in args.sizes.iter().enumerate() {
            for (mechanism, rows) in [
                (AfAlgMechanism::Threads, &mut threads[k]),
                (AfAlgMechanism::Aio, &mut aio[k]),
            ] {
                match rt.block_on(ours(&args, mechanism, size)) {
                    Ok(r) => {
                        println!(
                            "# round {round} {mechanism:?} size={size} ops_per_s={:.0} cpu_us={:.0} guest_us={:.0} lone_us={:.0} batch={:.2}",
                            r.0.ops_per_s, r.0.cpu_us, r.0.guest_us, r.1, r.2
                        );
                        rows.push(r);
                    }
                    Err(e) => {
                        eprintln!("{mechanism:?} {size}: {e}");
                        failed = true;
                    }
                }
            }
        }
        if has_peer {
            let modes: &[(usize, &str)] = if args.kcapi_iov {
                &[(1, "handles"), (0, "iov")]
            } else {
                &[(1, "handles")]
            };
            for &(i, mode) in modes {
                for (k, &size) in args.sizes.iter().enumerate() {
                    match peer(&args, mode, size) {
                        Ok(r) => kcapi[k][i].push(r),
                        Err(e) => {
                            eprintln!("{e}");
                            failed = true;
                        }
                    }
                }
            }
        }
    }
    for (k, &size) in args.sizes.iter().enumerate() {
        let [iov, handles] = &mut kcapi[k];
        let peer = [median_row(iov), median_row(handles)];
        table.push((size, median(&mut threads[k]), median(&mut aio[k]), peer));
    }
    let cell = |r: &Row| format!("{:>8.0} {:>6.0}/{:<6.0}", r.ops_per_s, r.cpu_us, r.guest_us);
    println!(
        "{:>6} | {:>21} {:>8} | {:>21} {:>8} {:>6} | {:>21} | {:>21} | {:>9} {:>9} {:>9}",
        "size",
        "threads ops/s cpu",
        "lone µs",
        "aio ops/s cpu",
        "lone µs",
        "batch",
        "kcapi iov ops/s cpu",
        "kcapi handles",
        "aio/iov",
        "aio/hndl",
        "aio/thr"
    );
    for (size, (t, t_lone, _), (a, a_lone, batch), k) in &table {
        let ratio = |x: f64, y: f64| if y > 0.0 { x / y } else { f64::NAN };
        println!(
            "{:>6} | {} {:>8.0} | {} {:>8.0} {:>6.2} | {} | {} | {:>9.2} {:>9.2} {:>9.2}",
            size,
            cell(t),
            t_lone,
            cell(a),
            a_lone,
            batch,
            cell(&k[0]),
            cell(&k[1]),
            ratio(a.ops_per_s, k[0].ops_per_s),
            ratio(a.ops_per_s, k[1].ops_per_s),
            ratio(a.ops_per_s, t.ops_per_s),
        );
    }
    if failed {
        std::process::exit(1);
    }
}
