//! AES-128-GCM seal on aws-lc-rs and ring over time: ns a call in
//! consecutive windows, the two implementations alternating within each
//! window, to show whether their relative speed holds still.
//!
//! ```text
//! cargo run -p crypto-offload-benches --release --bin gcm-spells -- [--secs 8] [--window-ms 100] [--size 16]
//! ```
//!
//! Each window runs aws-lc-rs (`seal_in_place_scatter`) for half of it and
//! ring (`seal_in_place_separate_tag`) for the other half, on the same
//! buffer, and prints both rows; then how many windows had aws-lc-rs at
//! under 0.85 of ring's time, over 1.15 of it, or between, and each one's
//! mean. Pin it (`taskset -c N`) to watch one vCPU.
//!
//! Why: on an Intel Xeon family 6 model 207 (AVX-512, a 2-vCPU VM,
//! 2026-12-05) `paired`'s GCM rows at 16–256 B came out either way from
//! one run to the next. Here aws-lc-rs's AVX-512 seal read 60–66 ns at
//! 16 B most of the time and 110–123 ns in spells of 0.2–2 s, on either
//! vCPU, while ring's AVX2 seal stayed at 74–89 ns: a per-process choice
//! measured in a few milliseconds sees one state or the other
//! (`fallback/README.md`, "Why the small class is a tie here").

use std::hint::black_box;
use std::time::{Duration, Instant};

use clap::Parser;

#[derive(Parser)]
#[command(about = "AES-128-GCM seal on aws-lc-rs and ring, window by window")]
struct Args {
    /// Seconds to run.
    #[arg(long, default_value_t = 8.0)]
    secs: f64,
    /// Milliseconds a window (half each implementation).
    #[arg(long, default_value_t = 100)]
    window_ms: u64,
    /// Bytes a seal.
    #[arg(long, default_value_t = 16)]
    size: usize,
}

const KEY: [u8; 16] = [7; 16];

/// Seals `buf` in place over and over for `budget`, a fresh nonce each
/// call: ns a call.
fn time(budget: Duration, buf: &mut [u8], mut seal: impl FnMut(u32, &mut [u8])) -> f64 {
    let start = Instant::now();
    let mut n = 0u32;
    while start.elapsed() < budget {
        for _ in 0..64 {
            seal(n, buf);
            n = n.wrapping_add(1);
            black_box(&mut *buf);
        }
    }
    start.elapsed().as_nanos() as f64 / f64::from(n.max(1))
}

fn nonce(n: u32) -> [u8; 12] {
    let mut nonce = [0u8; 12];
    nonce[..4].copy_from_slice(&n.to_le_bytes());
    nonce
}

fn main() {
    let args = Args::parse();
    println!("{}", crypto_offload_fallback::choice::cpu_line());
    let aws = aws_lc_rs::aead::LessSafeKey::new(
        aws_lc_rs::aead::UnboundKey::new(&aws_lc_rs::aead::AES_128_GCM, &KEY)
            .expect("a 16-byte key"),
    );
    let ring = ring::aead::LessSafeKey::new(
        ring::aead::UnboundKey::new(&ring::aead::AES_128_GCM, &KEY).expect("a 16-byte key"),
    );
    let mut buf = vec![0u8; args.size];
    let mut tag = [0u8; 16];
    let half = Duration::from_millis(args.window_ms.max(2)) / 2;
    let (mut a, mut r) = (Vec::new(), Vec::new());
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < args.secs {
        a.push(time(half, &mut buf, |n, buf| {
            aws.seal_in_place_scatter(
                aws_lc_rs::aead::Nonce::assume_unique_for_key(nonce(n)),
                aws_lc_rs::aead::Aad::empty(),
                buf,
                &[],
                &mut tag,
            )
            .expect("seal");
        }));
        r.push(time(half, &mut buf, |n, buf| {
            let t = ring
                .seal_in_place_separate_tag(
                    ring::aead::Nonce::assume_unique_for_key(nonce(n)),
                    ring::aead::Aad::empty(),
                    buf,
                )
                .expect("seal");
            tag.copy_from_slice(t.as_ref());
        }));
    }
    let row = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.0}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!(
        "AES-128-GCM seal, {} B, ns a call per {} ms window:",
        args.size, args.window_ms
    );
    println!("aws-lc-rs: {}", row(&a));
    println!("ring:      {}", row(&r));
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let mean_of = |v: &[f64]| {
        if v.is_empty() {
            "-".to_owned()
        } else {
            format!("{:.2}", mean(v))
        }
    };
    let (mut fast, mut slow, mut even) = (Vec::new(), Vec::new(), Vec::new());
    for (&x, &y) in a.iter().zip(&r) {
        let ratio = x / y;
        if ratio < 0.85 {
            fast.push(ratio);
        } else if ratio > 1.15 {
            slow.push(ratio);
        } else {
            even.push(ratio);
        }
    }
    println!(
        "{} windows: aws-lc-rs under 0.85 of ring in {} (mean {}), over 1.15 in {} (mean {}), \
         between in {}; means: aws-lc-rs {:.1} ns, ring {:.1} ns",
        a.len(),
        fast.len(),
        mean_of(&fast),
        slow.len(),
        mean_of(&slow),
        even.len(),
        mean(&a),
        mean(&r)
    );
}
