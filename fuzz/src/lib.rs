//! Differential fuzzing of crypto-offload: every backend this build has, and
//! the selector ("Auto") over them, against the independent RustCrypto
//! reference crates (`ctr`, `cbc`, `xts-mode`, `aes-gcm`, `crc`), byte for
//! byte; and `crypto_offload_native::Xts256` (AWS-LC's XTS) against
//! `xts-mode` and the fallback's RustCrypto XTS ([`xts`], feature `aws-lc`).
//!
//! The fuzz targets in `fuzz_targets/` are one line each; the checks live
//! here so that the seed generator (`src/bin/seeds.rs`) and this crate's unit
//! tests can run exactly what libFuzzer runs. Every mismatch panics through
//! [`mismatch`], whose message names the backend, the algorithm, the
//! direction and the length, so that a crash report alone says what broke.

#![forbid(unsafe_code)]

pub mod aead;
pub mod cipher;
pub mod crc;
pub mod lifecycle;
pub mod reference;
pub mod seed;
pub mod subjects;
pub mod vectors;
#[cfg(feature = "aws-lc")]
pub mod xts;

use core::fmt;

pub use subjects::{Harness, Subject, harness};

/// Stops the run on a disagreement. libFuzzer turns the panic into a crash
/// and saves the input; the message is what a person reads first, so it
/// names everything needed to tell which backend, algorithm, direction and
/// length went wrong.
#[track_caller]
pub fn mismatch(backend: &str, alg: &str, dir: &str, len: usize, what: fmt::Arguments<'_>) -> ! {
    panic!("MISMATCH backend={backend} alg={alg} dir={dir} len={len}: {what}")
}

/// Where two byte strings first differ, for mismatch messages (the whole
/// buffers may be megabytes).
pub fn first_difference(got: &[u8], want: &[u8]) -> String {
    if got.len() != want.len() {
        return format!("length {} (want {})", got.len(), want.len());
    }
    match got.iter().zip(want).position(|(a, b)| a != b) {
        None => "equal".to_owned(),
        Some(i) => {
            let end = (i + 16).min(got.len());
            format!(
                "first difference at byte {i}: got {} want {}",
                hex(&got[i..end]),
                hex(&want[i..end])
            )
        }
    }
}

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Deterministic filler bytes (xorshift), eight at a time: the lifecycle
/// target and the large inputs need many bytes from a few input bytes, and
/// under coverage instrumentation a byte-at-a-time loop costs more than the
/// AES it feeds.
pub fn filler(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// The length of a large request: 64 KiB, where the CPU path may leave
/// the inline path for the blocking pool and split over cores
/// (`BLOCKING_MIN_LEN` in crypto-offload), which small inputs never reach.
pub const LARGE: usize = 64 << 10;

/// Grows `data` to a large request when `scale` is 0xff (one random input
/// in 256: large requests cost a hundred small ones): [`LARGE`] + the
/// input's length, the input's bytes repeated (filler when it has none).
pub fn scaled(data: &[u8], scale: u8) -> Vec<u8> {
    if scale != 0xff {
        return data.to_vec();
    }
    let len = LARGE + data.len();
    if data.is_empty() {
        return filler(len, 0xff);
    }
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        let take = data.len().min(len - out.len());
        out.extend_from_slice(&data[..take]);
    }
    out
}
