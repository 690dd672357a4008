#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod block_cipher;
mod cbc;
pub mod choice;
mod crc;
mod crc32_unaligned;
mod crc64;
mod crc64_limit;
mod crc64_table;
mod crc_fast_blocks;
mod crc_plan;
mod ctr;
mod error;
mod gcm;
mod gcm_parallel;
mod handover;
mod implementation;
mod xts;

#[cfg(feature = "aws-lc")]
mod aws_lc;

pub use block_cipher::KeySize;
pub use cbc::Cbc;
pub use crc::{Crc, CrcAlg, checksum, checksum_with, combine, crc_choice};
pub use crc_plan::CrcPlan;
pub use ctr::Ctr;
pub use error::{Error, LengthRule};
pub use gcm::{
    Gcm, MAX_LEN as GCM_MAX_LEN, NONCE_LEN as GCM_NONCE_LEN, TAG_LEN as GCM_TAG_LEN, Tag,
};
pub use implementation::Implementation;
pub use xts::Xts;
