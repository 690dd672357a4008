//! Peers for the benchmarks: the fastest CPU implementations available to
//! Rust, and the RustCrypto reference crates, behind one small interface so
//! the benches and the agreement test use exactly the same calls
//! ([`contenders`]).
//!
//! aws-lc-rs has no safe XTS API, so [`AwsLcXts`] calls AWS-LC's EVP interface
//! through aws-lc-sys: the only `unsafe` outside the driver crates, and only
//! in this unpublished bench crate.

pub mod aws_lc_xts;
pub mod contenders;
pub mod report;

pub use aws_lc_xts::AwsLcXts;

/// The sizes every algorithm is measured at.
pub const SIZES: [usize; 6] = [16, 64, 1024, 4096, 65536, 1 << 20];

/// Deterministic test data.
pub fn data(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 + 7) as u8).collect()
}

/// A key of `len` bytes for the session benches (`session`,
/// `session-overhead`).
pub fn key(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(1))
        .collect()
}

/// An `Offload` with a simulated engine for CRC-32C and AES-128-CTR that
/// costs 25 µs a request, slower than the CPU at every size, its costs and
/// the CPU's calibrated: every request on it is a choice, and what the
/// session benches' `auto-` rows measure is what deciding costs.
///
/// # Panics
/// If the `Offload` cannot be built or calibrated.
///
/// # Cancel safety
/// Not cancel safe: dropped before it completes, the calibration is lost
/// (a bench setup, awaited to the end).
pub async fn offload_with_slow_engine() -> crypto_offload::Offload {
    use crypto_offload::{Algorithm, CipherAlg, CrcAlg, Offload};
    use crypto_offload_sim::{SimConfig, SimEngine};
    let sim = SimEngine::new(SimConfig::new(
        "sim",
        vec![
            Algorithm::Crc(CrcAlg::Crc32Iscsi),
            Algorithm::Cipher(CipherAlg::Aes128Ctr),
        ],
        std::time::Duration::from_micros(25),
        1e9,
    ));
    let offload = Offload::builder()
        .backend(std::sync::Arc::new(sim))
        .build()
        .expect("an Offload with the simulated engine");
    offload.calibrate().await.expect("calibrating");
    offload
}

/// A size argument: bytes, or with a `k` or `m` suffix (KiB, MiB).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim().to_ascii_lowercase();
    let (num, mul) = match t.strip_suffix('k') {
        Some(n) => (n, 1 << 10),
        None => match t.strip_suffix('m') {
            Some(n) => (n, 1 << 20),
            None => (t.as_str(), 1),
        },
    };
    num.parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mul))
        .ok_or_else(|| format!("{s:?} is not a size (bytes, or with a k or m suffix)"))
}
