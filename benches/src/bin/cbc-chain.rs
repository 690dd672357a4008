//! CBC encryption's small requests, ours against the `cbc` crate, with
//! consecutive calls independent (as `paired` times them) and chained, each
//! timed many times over to show the spread.
//!
//! ```text
//! cargo run -p crypto-offload-benches --release --bin cbc-chain -- [--sizes 16,64,256] [--repeat 12]
//! ```
//!
//! CBC encryption is one serial chain of AES calls per request, so a
//! request's time is set by AES latency, not throughput. Timed back to back
//! on one buffer with a fixed IV (the `paired` and criterion benches), the
//! next call's first block depends only on the previous call's first
//! block, so the core may overlap consecutive calls — if it predicts that
//! a call's loads do not wait for the previous call's stores to the same
//! buffer. Two modes:
//! * `independent`: that loop (the IV fixed, the buffer encrypted in place);
//! * `chained`: each call's IV is the previous call's last ciphertext block
//!   (a stream of sectors in one CBC chain), so calls cannot overlap and
//!   the figure is the chain's latency.
//!
//! Each contender is timed `--repeat` times in each mode (each time the
//! fastest of 15 slices of about a millisecond), in turn; the table gives
//! the least and the most of those (~2 s with the defaults).
//!
//! Measured on AMD EPYC Zen 3 (family 25 model 1, 2 vCPUs), 2026-12-03, at
//! 64 B: in some runs the independent timings of each contender moved
//! between two levels, ~45 ns and ~91 ns, for ours and the `cbc` crate
//! alike (and whichever 4 KiB page offset the buffer had; ours 46.3–92.3,
//! `cbc` 44.9–91.5 in 12 timings each), in others they stayed at the lower
//! (ours 45.9–46.8, `cbc` 44.3–44.8: 0.96); chained, every timing of every
//! contender was 89.1–95.5 ns. `paired`, the same hour, put ours at 47 ns
//! and its own loop of the `cbc` crate at 34 (0.71), below both levels
//! here; an earlier build of `paired` put that loop at 48 ns (0.94). Its
//! 64 B CBC-encryption row measures how far each loop lets the core
//! overlap consecutive calls, more than the code that encrypts.

use std::hint::black_box;
use std::time::Instant;

use aes::Aes256;
use cipher::{BlockModeEncrypt, InnerIvInit, KeyInit};
use clap::Parser;
use crypto_offload_benches::contenders::KEY;
use crypto_offload_fallback::{Cbc, Implementation};

#[derive(Parser)]
#[command(about = "CBC-256 encryption of small requests: independent and chained calls")]
struct Args {
    /// Request sizes in bytes (multiples of 16).
    #[arg(long, value_delimiter = ',', default_value = "16,64,256")]
    sizes: Vec<usize>,
    /// Timings of each contender in each mode.
    #[arg(long, default_value_t = 12)]
    repeat: usize,
}

/// A contender: encrypts `buf` in place under `iv`.
type Encrypt<'a> = Box<dyn Fn(&[u8; 16], &mut [u8]) + 'a>;

/// The fastest of 15 slices of about a millisecond, in ns a call.
fn time(f: &dyn Fn(&[u8; 16], &mut [u8]), len: usize, chained: bool) -> f64 {
    let mut buf = vec![7u8; len];
    let mut iv = [9u8; 16];
    let iters = (1_000_000 / len as u64).max(100);
    let mut best = f64::MAX;
    for _ in 0..15 {
        let t = Instant::now();
        for _ in 0..iters {
            f(&iv, black_box(&mut buf));
            if chained {
                iv.copy_from_slice(&buf[len - 16..]);
            }
        }
        best = best.min(t.elapsed().as_secs_f64() * 1e9 / iters as f64);
    }
    best
}

/// The `cbc` crate over the `aes` crate, as `paired` calls it.
fn cbc_encrypt(aes: &Aes256, iv: &[u8; 16], buf: &mut [u8]) {
    let (blocks, _) = buf.as_chunks_mut::<16>();
    let blocks = cipher::array::Array::cast_slice_from_core_mut(blocks);
    cbc::Encryptor::<&Aes256>::inner_iv_init(aes, &(*iv).into()).encrypt_blocks(blocks)
}

fn main() {
    let args = Args::parse();
    if let Some(bad) = args.sizes.iter().find(|&&s| s == 0 || s % 16 != 0) {
        eprintln!("cbc-chain: {bad} is not a positive multiple of 16");
        std::process::exit(2);
    }
    let measured = Cbc::new(&KEY[..32]).expect("a 32-byte key");
    let rustcrypto =
        Cbc::with_implementation(&KEY[..32], Implementation::RustCrypto).expect("a 32-byte key");
    let rc = Aes256::new_from_slice(&KEY[..32]).expect("a 32-byte key");
    let contenders: Vec<(&str, Encrypt<'_>)> = vec![
        (
            "fallback",
            Box::new(|iv, buf| measured.encrypt(iv, buf).expect("whole blocks")),
        ),
        (
            "fallback-rustcrypto",
            Box::new(|iv, buf| rustcrypto.encrypt(iv, buf).expect("whole blocks")),
        ),
        ("cbc", Box::new(|iv, buf| cbc_encrypt(&rc, iv, buf))),
    ];
    println!("{}\n", crypto_offload_fallback::choice::cpu_line());
    println!(
        "AES-256-CBC encryption, ns a call: least and most of {} timings\n",
        args.repeat
    );
    println!("| size | contender | independent | chained |");
    println!("|---|---|---|---|");
    for &len in &args.sizes {
        // (least, most) independent, then chained, per contender.
        let mut spread = vec![[(f64::MAX, 0.0f64); 2]; contenders.len()];
        for _ in 0..args.repeat {
            for ((_, f), s) in contenders.iter().zip(&mut spread) {
                for (mode, chained) in [false, true].into_iter().enumerate() {
                    let t = time(&**f, len, chained);
                    s[mode] = (s[mode].0.min(t), s[mode].1.max(t));
                }
            }
        }
        for ((name, _), [ind, ch]) in contenders.iter().zip(&spread) {
            println!(
                "| {len} B | {name} | {:.1}–{:.1} | {:.1}–{:.1} |",
                ind.0, ind.1, ch.0, ch.1
            );
        }
    }
}
