#![doc = include_str!("../README.md")]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

#[cfg(feature = "aws-lc")]
mod aes_block;
mod wiped;
#[cfg(feature = "aws-lc")]
mod xts;

#[cfg(feature = "aws-lc")]
pub use aes_block::{AesDecryptBlock, AesEncryptBlock, AesKeyLength};
pub use wiped::Wiped;
#[cfg(feature = "aws-lc")]
pub use xts::{Xts256, XtsError};
