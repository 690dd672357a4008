//! What a session costs a request on the inline CPU path, direct calls and
//! session requests timed in alternating slices in one process.
//!
//! ```text
//! cargo run -p crypto-offload-benches --release --bin session-overhead -- [--sizes 16,1k,4k] [--ms 400]
//! ```
//!
//! The `session` criterion bench times the direct calls and the session's
//! requests as separate benchmarks, seconds apart; on a shared 2-vCPU VM
//! whose speed moves by 1.5× for hundreds of milliseconds at a time
//! (`xts-offsets`), two such figures can come from different spells, and
//! their difference is not the session's. Here each round times a slice
//! of direct calls and a slice of session requests back to back (which
//! goes first alternates), on the same buffer, and each side keeps its
//! fastest slice, as `paired` does.
//!
//! The session side is what a server runs: requests `.await`ed one after
//! the other in a task on a tokio current-thread runtime (its cooperative
//! budget included), on an `Offload` found by `Offload::discover()` (the
//! CPU only, on a machine without engines) or, for the `auto-` rows, one
//! with a simulated engine that is slower at every size, so that every
//! request is a choice.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use crypto_offload::{AeadAlg, CipherAlg, CrcAlg, Offload};
use crypto_offload_benches::{data, key, offload_with_slow_engine, parse_size};
use crypto_offload_fallback as fb;

#[derive(Parser)]
#[command(about = "A session's cost per request against direct calls, interleaved")]
struct Args {
    /// Request sizes (e.g. `16,1k,4k`).
    #[arg(long, value_delimiter = ',', value_parser = parse_size, default_value = "16,1k,4k")]
    sizes: Vec<usize>,
    /// Milliseconds of rounds per request kind and size.
    #[arg(long, default_value_t = 400)]
    ms: u64,
    /// Run the session's loop outside tokio's cooperative budget
    /// (`tokio::task::unconstrained`), to see what the budget costs.
    #[arg(long)]
    unconstrained: bool,
    /// Only the rows of these names (e.g. `gcm-128-seal`), to profile one.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
}

/// `--unconstrained`.
static UNCONSTRAINED: AtomicBool = AtomicBool::new(false);

/// `--only`: the rows to time (all if empty).
static ONLY: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();

/// Whether the row `name` is timed.
fn wanted(name: &str) -> bool {
    ONLY.get()
        .is_none_or(|only| only.is_empty() || only.iter().any(|o| o == name))
}

/// Calls in a slice of `size`-byte requests: ~20 µs of the fastest.
fn per_slice(size: usize) -> usize {
    ((64 << 10) / size.max(1)).clamp(8, 1000)
}

/// One row: the fastest slice of each side, in ns a request.
struct Row {
    name: &'static str,
    size: usize,
    direct: f64,
    session: f64,
}

/// Times `$direct` (on `&mut Vec<u8>`) against `$session` (moving the `Vec`
/// in and out, inside `$rt`) in alternating slices for `$ms`.
macro_rules! overhead {
    ($rows:expr, $rt:expr, $name:expr, $size:expr, $ms:expr,
     |$d:ident| $direct:expr, |$s:ident| $session:expr) => {{
        if wanted($name) {
            let (size, n) = ($size, per_slice($size));
            let mut buf = data(size);
            let (mut direct, mut session) = (f64::MAX, f64::MAX);
            let end = Instant::now() + Duration::from_millis($ms);
            let mut round = 0u64;
            while Instant::now() < end || round < 4 {
                for side in [round % 2, (round + 1) % 2] {
                    if side == 0 {
                        let t = Instant::now();
                        for _ in 0..n {
                            let $d = black_box(&mut buf);
                            black_box($direct);
                        }
                        direct = direct.min(t.elapsed().as_secs_f64() * 1e9 / n as f64);
                    } else {
                        let run = async {
                            let mut b = buf;
                            let t = Instant::now();
                            for _ in 0..n {
                                let $s = black_box(b);
                                b = $session;
                            }
                            (b, t.elapsed())
                        };
                        let (back, took) = if UNCONSTRAINED.load(Ordering::Relaxed) {
                            $rt.block_on(tokio::task::unconstrained(run))
                        } else {
                            $rt.block_on(run)
                        };
                        buf = back;
                        session = session.min(took.as_secs_f64() * 1e9 / n as f64);
                    }
                }
                round += 1;
            }
            $rows.push(Row {
                name: $name,
                size,
                direct,
                session,
            });
        }
    }};
}

fn main() {
    let args = Args::parse();
    UNCONSTRAINED.store(args.unconstrained, Ordering::Relaxed);
    ONLY.set(args.only).expect("set once");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let cpu = rt.block_on(Offload::discover()).expect("Offload::discover");
    let engine = rt.block_on(offload_with_slow_engine());
    let ms = args.ms;
    let mut rows = Vec::new();
    for &size in &args.sizes {
        let direct = fb::Ctr::new(&key(16)).expect("a CTR key");
        for (name, offload) in [("ctr-128", &cpu), ("auto-ctr-128", &engine)] {
            let s = rt
                .block_on(offload.cipher(CipherAlg::Aes128Ctr, &key(16)))
                .expect("a CTR session");
            overhead!(
                rows,
                rt,
                name,
                size,
                ms,
                |buf| direct.apply_keystream(&[1; 16], buf).expect("CTR"),
                |buf| s.encrypt([1; 16], buf).await.expect("CTR")
            );
        }

        let direct = fb::Xts::new(&key(64)).expect("an XTS key");
        let s = rt
            .block_on(cpu.cipher(CipherAlg::Aes256Xts, &key(64)))
            .expect("an XTS session");
        overhead!(
            rows,
            rt,
            "xts-256",
            size,
            ms,
            |buf| direct.encrypt(&[1; 16], buf).expect("XTS"),
            |buf| s.encrypt([1; 16], buf).await.expect("XTS")
        );

        let direct = fb::Gcm::new(&key(16)).expect("a GCM key");
        let s = rt
            .block_on(cpu.aead(AeadAlg::Aes128Gcm, &key(16)))
            .expect("a GCM session");
        overhead!(
            rows,
            rt,
            "gcm-128-seal",
            size,
            ms,
            |buf| direct
                .seal_in_place_detached(&[2; 12], b"", buf)
                .expect("GCM"),
            |buf| {
                let (buf, tag) = s.seal_detached([2; 12], b"", buf).await.expect("GCM");
                black_box(tag);
                buf
            }
        );

        let mut direct = fb::Crc::new(fb::CrcAlg::Crc32Iscsi);
        for (name, offload) in [("crc32c", &cpu), ("auto-crc32c", &engine)] {
            let mut s = rt
                .block_on(offload.crc(CrcAlg::Crc32Iscsi))
                .expect("a CRC session");
            overhead!(rows, rt, name, size, ms, |buf| direct.update(buf), |buf| s
                .update(buf)
                .await
                .expect("CRC"));
        }
        black_box(direct.finalize());

        // CRC-64/NVME: its table, fold and crc-fast split at lengths
        // measured in the process.
        let mut direct = fb::Crc::new(fb::CrcAlg::Crc64Nvme);
        let mut s = rt
            .block_on(cpu.crc(CrcAlg::Crc64Nvme))
            .expect("a CRC session");
        overhead!(
            rows,
            rt,
            "crc64-nvme",
            size,
            ms,
            |buf| direct.update(buf),
            |buf| s.update(buf).await.expect("CRC")
        );
        black_box(direct.finalize());
    }

    println!("{}\n", fb::choice::cpu_line());
    println!(
        "A session's cost a request (fastest slice of each side, in alternating rounds, {ms} ms per row):\n"
    );
    println!(
        "| request | size | direct ns | session ns | overhead ns | session / direct throughput |"
    );
    println!("|---|---|---|---|---|---|");
    rows.sort_by(|a, b| a.name.cmp(b.name).then(a.size.cmp(&b.size)));
    for r in &rows {
        println!(
            "| {} | {} | {:.1} | {:.1} | {:+.1} | **{:.3}** |",
            r.name,
            size_name(r.size),
            r.direct,
            r.session,
            r.session - r.direct,
            r.direct / r.session
        );
    }
    // Which implementation GCM ran on: measured per process, and on some
    // CPUs (Intel Xeon family 6 model 207) a near tie at 16–256 B.
    let gcm = fb::Gcm::new(&key(16)).expect("a GCM key");
    let on: Vec<String> = args
        .sizes
        .iter()
        .map(|&n| format!("{} at {}", gcm.implementation_for(n).name(), size_name(n)))
        .collect();
    println!("\nGCM ran on {}.", on.join(", "));
}

fn size_name(n: usize) -> String {
    match n {
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{} KiB", n >> 10),
        n => format!("{n} B"),
    }
}
