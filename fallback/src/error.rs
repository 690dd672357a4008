//! The one error type of the fallback crate.

use core::fmt;

/// What went wrong with a request to a fallback primitive.
///
/// Every variant is about the caller's input; the CPU implementations
/// themselves cannot fail. [`Error::Authentication`] is deliberately opaque:
/// it says only that the tag did not verify, never why or where.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The key has a length the algorithm does not take.
    #[error("{alg}: a {len}-byte key is not valid (expected {expected})")]
    KeyLength {
        /// The algorithm family, e.g. `"AES-XTS"`.
        alg: &'static str,
        /// The length that was given.
        len: usize,
        /// The accepted lengths, e.g. `"16, 24 or 32 bytes"`.
        expected: &'static str,
    },
    /// An XTS key whose two halves are equal (IEEE 1619-2018 §5.1 and
    /// NIST SP 800-38E forbid it: the tweak key would equal the data key).
    #[error("AES-XTS: the two halves of the key are equal")]
    XtsWeakKey,
    /// The data has a length the mode cannot take.
    #[error("{alg}: {len} bytes of data is not valid ({rule})")]
    DataLength {
        /// The mode, e.g. `"AES-CBC"`.
        alg: &'static str,
        /// The length that was given.
        len: usize,
        /// The rule the length broke.
        rule: LengthRule,
    },
    /// The AEAD tag did not verify. No plaintext was released: the buffer
    /// was overwritten with zeros.
    #[error("authentication failed")]
    Authentication,
    /// The implementation rejected a request this crate had already
    /// validated. Not seen in practice; the buffer's contents are
    /// unspecified.
    #[error("the {0:?} implementation failed unexpectedly")]
    ImplementationFailure(crate::Implementation),
    /// The implementation asked for does not run this algorithm or key
    /// size (ring has no AES-192-GCM, and no CTR, CBC or XTS).
    #[error("{alg} is not available on the {implementation:?} implementation")]
    Unavailable {
        /// The algorithm, e.g. `"AES-192-GCM"`.
        alg: &'static str,
        /// The implementation asked for.
        implementation: crate::Implementation,
    },
    /// A CRC did not match the expected value.
    #[error("checksum mismatch: expected {expected:#x}, computed {computed:#x}")]
    ChecksumMismatch {
        /// The value the caller expected.
        expected: u64,
        /// The value computed over the data.
        computed: u64,
    },
}

/// A rule about data lengths that a mode imposes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LengthRule {
    /// The length must be a multiple of the 16-byte block (CBC, ECB).
    MultipleOfBlock,
    /// The length must be at least one 16-byte block (XTS).
    AtLeastOneBlock,
    /// The length must be a multiple of the configured data-unit size.
    MultipleOfDataUnit(usize),
    /// The data-unit size must be at least 16 bytes.
    DataUnitTooSmall,
    /// The message is longer than the mode allows (GCM: 2^36 - 32 bytes).
    TooLong(u64),
    /// An XTS stream needs a data unit set.
    DataUnitNotSet,
}

impl fmt::Display for LengthRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LengthRule::MultipleOfBlock => f.write_str("must be a multiple of 16"),
            LengthRule::AtLeastOneBlock => f.write_str("must be at least 16"),
            LengthRule::MultipleOfDataUnit(u) => {
                write!(f, "must be a multiple of the {u}-byte data unit")
            }
            LengthRule::DataUnitTooSmall => f.write_str("the data unit must be at least 16 bytes"),
            LengthRule::TooLong(max) => write!(f, "must be at most {max}"),
            LengthRule::DataUnitNotSet => f.write_str("an XTS stream needs a data unit"),
        }
    }
}
