#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

// The crate root is the application API: an `Offload`, its sessions and
// their requests, the algorithms, errors and what `Offload` reports. What
// an engine's implementor needs is in `backend`; each engine this crate
// ships is a module of its own (`cpu`, `af_alg`, `vfio`).

#[cfg(all(feature = "af-alg", target_os = "linux"))]
pub mod af_alg;
mod alg;
pub mod backend;
mod breaker;
mod buffer;
mod calibrate;
mod cost;
pub mod cpu;
#[cfg(all(any(feature = "af-alg", feature = "vfio"), target_os = "linux"))]
mod engine;
mod error;
mod key;
mod offload;
mod policy;
mod power;
mod select;
mod session;
mod slot;
pub mod stream;
#[cfg(all(feature = "vfio", target_os = "linux"))]
pub mod vfio;

#[cfg(feature = "testing")]
pub mod testing;

pub use alg::{AeadAlg, Algorithm, CipherAlg, CipherMode, CrcAlg};
/// The `bytes` crate this one takes `BytesMut` buffers from: the same
/// version, without a dependency of your own.
pub use bytes;
// In `BackendInfo`, what `Offload::backends` reports: an application that
// reads them should not need the implementor's module.
pub use backend::{BackendKind, PowerStats};
pub use buffer::{Buffer, DeviceBuf};
pub use cost::{Cost, CpuImplementation, Direction, Profile, ProfileEntry, ProfileError};
pub use crypto_offload_fallback::Implementation;
/// Which CPU implementation runs each mode, measured per machine: the
/// modes, a [`Choice`](cpu_choice::Choice) per size class, and the
/// measurement.
pub use crypto_offload_fallback::choice as cpu_choice;
pub use error::{Error, LengthRule, RequestError};
pub use offload::{
    BackendInfo, BackendStats, EngineSearch, Offload, OffloadBuilder, SearchOutcome,
};
pub use policy::{ParsePolicyError, Policy};
pub use select::{Candidate, Explanation};
pub use session::{
    AeadSession, CipherRequest, CipherSession, CrcChecksum, CrcSession, CrcUpdate, IvInput, Open,
    Seal, SealDetached, Tag,
};

/// CRC combination: the CRC of `A ‖ B` from `crc(A)`, `crc(B)` and `len(B)`.
pub use crypto_offload_fallback::combine as crc_combine;
