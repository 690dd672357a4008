//! Which CPU implementation runs a mode.

/// A CPU implementation of the AES modes or of the CRC-32s.
///
/// Every mode has a pure-Rust RustCrypto implementation; with the `aws-lc`
/// feature (on by default) GCM, CTR and CBC can also run on aws-lc-rs and
/// XTS-AES-256 on AWS-LC's EVP XTS, and with the `ring` feature (on by
/// default) GCM on ring. Which is fastest depends on the CPU and the
/// request size (on AVX2-only VAES machines such as AMD Zen 3 ring's GCM
/// runs at twice aws-lc's; on AVX-512 ones aws-lc's is ahead), so each
/// mode's `new` takes the one measured fastest on this machine, per size
/// class ([`crate::choice`]); `with_implementation` forces one, and
/// `choice()` tells which ones a key uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Implementation {
    /// RustCrypto's `aes` (VAES-512 / VAES-256 / AES-NI / constant-time
    /// software, chosen at run time) with this crate's modes, and `aes-gcm`.
    RustCrypto,
    /// aws-lc-rs (AWS-LC's assembly for AES-NI, VAES and PCLMUL/VPCLMUL).
    #[cfg(feature = "aws-lc")]
    AwsLc,
    /// ring (BoringSSL's assembly: VAES + VPCLMULQDQ with AVX2 or AVX-512,
    /// AES-NI + PCLMULQDQ, and a constant-time fallback). GCM with 128- and
    /// 256-bit keys only.
    #[cfg(feature = "ring")]
    Ring,
    /// crc-fast: carry-less-multiply folding (PCLMULQDQ, VPCLMULQDQ with
    /// AVX-512; PMULL on aarch64) and the SSE4.2 `crc32` instruction for
    /// CRC-32C. Runs every CRC.
    CrcFast,
    /// crc32fast: CRC-32/ISO-HDLC only (slice-by-16 tables, PCLMULQDQ
    /// folding from 64 bytes).
    Crc32Fast,
    /// The `crc32c` crate: CRC-32/ISCSI only (three interleaved streams of
    /// the SSE4.2 `crc32` instruction, tables without it).
    Crc32c,
    /// crypto-offload-native's `Crc64Fold`: the CRC-64s folded 128 bits a
    /// step with PCLMULQDQ, between this crate's table and crc-fast (the
    /// `clmul` feature; lengths measured per machine, not chosen).
    #[cfg(feature = "clmul")]
    Crc64Fold,
}

impl Implementation {
    /// Every implementation of the AES modes compiled into this build.
    pub const ALL: &'static [Implementation] = &[
        Implementation::RustCrypto,
        #[cfg(feature = "aws-lc")]
        Implementation::AwsLc,
        #[cfg(feature = "ring")]
        Implementation::Ring,
    ];

    /// Every implementation of the CRC-32s ([`crate::choice::Mode::Crc32`],
    /// [`crate::choice::Mode::Crc32c`]).
    pub const CRC: &'static [Implementation] = &[
        Implementation::CrcFast,
        Implementation::Crc32Fast,
        Implementation::Crc32c,
    ];

    /// Every implementation in this build, AES and CRC, in declaration
    /// order: `EVERY[imp as usize] == imp`, and so `from_index`.
    #[cfg(test)]
    pub(crate) const EVERY: &'static [Implementation] = &[
        Implementation::RustCrypto,
        #[cfg(feature = "aws-lc")]
        Implementation::AwsLc,
        #[cfg(feature = "ring")]
        Implementation::Ring,
        Implementation::CrcFast,
        Implementation::Crc32Fast,
        Implementation::Crc32c,
        #[cfg(feature = "clmul")]
        Implementation::Crc64Fold,
    ];

    /// The implementation whose discriminant is `i` (`EVERY[i]`), by a
    /// match the compiler reduces to a range check (a table look-up was a
    /// dependent load on every one-shot CRC).
    #[inline]
    pub(crate) const fn from_index(i: usize) -> Option<Implementation> {
        const RUST_CRYPTO: usize = Implementation::RustCrypto as usize;
        #[cfg(feature = "aws-lc")]
        const AWS_LC: usize = Implementation::AwsLc as usize;
        #[cfg(feature = "ring")]
        const RING: usize = Implementation::Ring as usize;
        const CRC_FAST: usize = Implementation::CrcFast as usize;
        const CRC32_FAST: usize = Implementation::Crc32Fast as usize;
        const CRC32C: usize = Implementation::Crc32c as usize;
        #[cfg(feature = "clmul")]
        const CRC64_FOLD: usize = Implementation::Crc64Fold as usize;
        Some(match i {
            RUST_CRYPTO => Implementation::RustCrypto,
            #[cfg(feature = "aws-lc")]
            AWS_LC => Implementation::AwsLc,
            #[cfg(feature = "ring")]
            RING => Implementation::Ring,
            CRC_FAST => Implementation::CrcFast,
            CRC32_FAST => Implementation::Crc32Fast,
            CRC32C => Implementation::Crc32c,
            #[cfg(feature = "clmul")]
            CRC64_FOLD => Implementation::Crc64Fold,
            _ => return None,
        })
    }

    /// A short name for reports and benchmarks.
    pub const fn name(self) -> &'static str {
        match self {
            Implementation::RustCrypto => "rustcrypto",
            #[cfg(feature = "aws-lc")]
            Implementation::AwsLc => "aws-lc",
            #[cfg(feature = "ring")]
            Implementation::Ring => "ring",
            Implementation::CrcFast => "crc-fast",
            Implementation::Crc32Fast => "crc32fast",
            Implementation::Crc32c => "crc32c",
            #[cfg(feature = "clmul")]
            Implementation::Crc64Fold => "crc64-fold",
        }
    }

    /// Whether it runs AES-CTR and AES-CBC (ring runs GCM only).
    pub const fn has_ctr_and_cbc(self) -> bool {
        match self {
            Implementation::RustCrypto => true,
            #[cfg(feature = "aws-lc")]
            Implementation::AwsLc => true,
            _ => false,
        }
    }

    /// The implementation named `name` ([`Implementation::name`]), if this
    /// build has it.
    pub fn from_name(name: &str) -> Option<Implementation> {
        Implementation::ALL
            .iter()
            .chain(Implementation::CRC)
            .copied()
            .find(|i| i.name() == name)
    }
}

#[cfg(test)]
mod tests {
    use super::Implementation;

    #[test]
    fn every_is_indexed_by_discriminant() {
        for (i, &imp) in Implementation::EVERY.iter().enumerate() {
            assert_eq!(imp as usize, i, "{imp:?}");
        }
        for (i, &imp) in Implementation::EVERY.iter().enumerate() {
            assert_eq!(Implementation::from_index(i), Some(imp));
        }
        assert_eq!(
            Implementation::from_index(Implementation::EVERY.len()),
            None
        );
        assert_eq!(Implementation::from_index(usize::MAX), None);
        for imp in Implementation::ALL.iter().chain(Implementation::CRC) {
            assert!(Implementation::EVERY.contains(imp));
        }
    }
}
