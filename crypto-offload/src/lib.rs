#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

#[cfg(feature = "af-alg")]
mod af_alg;
mod alg;
mod backend;
mod breaker;
mod buffer;
mod calibrate;
mod cost;
mod cpu;
#[cfg(any(feature = "af-alg", feature = "vfio"))]
mod engine;
mod error;
mod key;
mod offload;
mod policy;
mod power;
mod select;
mod session;
mod slot;
#[cfg(feature = "vfio")]
mod vfio;

#[cfg(feature = "testing")]
pub mod testing;

#[cfg(feature = "af-alg")]
pub use af_alg::AfAlgBackend;
pub use alg::{AeadAlg, Algorithm, CipherAlg, CipherMode, CrcAlg};
pub use backend::{
    AeadContext, Backend, BackendKind, CipherContext, CipherParams, CrcContext, Failed, Limits,
    SharedBackend,
};
pub use buffer::{Buffer, IoBuf};
pub use cost::{Cost, Direction, Profile, ProfileEntry, ProfileError};
pub use cpu::CpuBackend;
pub use crypto_offload_fallback::Implementation;
#[cfg(any(feature = "af-alg", feature = "vfio"))]
pub use engine::{AUTOSUSPEND_DELAY, Unavailable};
pub use error::{BackendError, Error, LengthRule, RequestError};
pub use key::{MAX_KEY_LEN, SecretKey};
pub use offload::{BackendInfo, BackendStats, Offload, OffloadBuilder};
pub use policy::{ParsePolicyError, Policy};
pub use power::{PowerControl, PowerDomain, PowerRef, PowerStats};
pub use select::{Candidate, Explanation};
pub use session::{
    AeadSession, CipherRequest, CipherSession, CrcSession, CrcUpdate, Open, Seal, SealDetached, Tag,
};
#[cfg(feature = "vfio")]
pub use vfio::VfioBackend;

/// CRC combination: the CRC of `A ‖ B` from `crc(A)`, `crc(B)` and `len(B)`.
pub use crypto_offload_fallback::combine as crc_combine;
