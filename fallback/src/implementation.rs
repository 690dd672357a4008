//! Which CPU implementation runs a mode.

/// A CPU implementation of the AES modes.
///
/// Every mode has a pure-Rust RustCrypto implementation; with the `aws-lc`
/// feature (on by default) GCM, CTR and CBC can also run on aws-lc-rs. Each
/// mode's `new` picks the faster one on this machine (see the crate README
/// for the measurements); `with_implementation` forces one, and
/// `implementation()` tells which one a key uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Implementation {
    /// RustCrypto's `aes` (VAES-512 / VAES-256 / AES-NI / constant-time
    /// software, chosen at run time) with this crate's modes, and `aes-gcm`.
    RustCrypto,
    /// aws-lc-rs (AWS-LC's assembly for AES-NI, VAES and PCLMUL/VPCLMUL).
    #[cfg(feature = "aws-lc")]
    AwsLc,
}

impl Implementation {
    /// Every implementation compiled into this build.
    pub const ALL: &'static [Implementation] = &[
        Implementation::RustCrypto,
        #[cfg(feature = "aws-lc")]
        Implementation::AwsLc,
    ];

    /// A short name for reports and benchmarks.
    pub const fn name(self) -> &'static str {
        match self {
            Implementation::RustCrypto => "rustcrypto",
            #[cfg(feature = "aws-lc")]
            Implementation::AwsLc => "aws-lc",
        }
    }
}
