#![doc = include_str!("../README.md")]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod aead;
mod aio;
pub(crate) mod blocking;
pub mod engine;
mod error;
mod hash;
mod power;
mod probe;
pub mod proc_crypto;
mod skcipher;
mod socket;

pub use aead::{Aead, TAG_LEN};
pub use aio::{AIO_DEPTH, AioCounts, aio_counts};
pub use blocking::{MAX_THREADS, RequestTimeout};
pub use error::{Error, Failed};
pub use hash::{Crc, CrcKind, Hash};
pub use power::RuntimePm;
pub use probe::{RESTRICT_SYSCTL, operation_limit, probe, restrict_level, unavailable_reason};
pub use skcipher::{Mechanism, Mode, Skcipher};
