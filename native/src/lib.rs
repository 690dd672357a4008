#![doc = include_str!("../README.md")]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

#[cfg(feature = "aws-lc")]
mod aes_block;
mod crc64_fold;
mod wiped;
#[cfg(feature = "aws-lc")]
mod xts;

#[cfg(feature = "aws-lc")]
pub use aes_block::{AesDecryptBlock, AesEncryptBlock, AesKeyLength};
pub use crc64_fold::{Clmul, Crc64Fold};
pub use wiped::Wiped;
#[cfg(feature = "aws-lc")]
pub use xts::{Xts256, XtsError};

/// Bytes from hex digits (the unit tests' vectors).
#[cfg(all(test, feature = "aws-lc"))]
fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}
