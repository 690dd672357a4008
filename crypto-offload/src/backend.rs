//! The `Backend` trait: what an engine implements to serve sessions.
//!
//! The backends this crate ships are dispatched through an enum; the trait
//! is for everything else — a third party's engine, a test double — and is
//! object-safe (`Arc<dyn Backend>`), with async methods via `async-trait`.
//!
//! A backend never sees invalid input: sessions check key, IV, nonce, tag
//! and data lengths (and XTS weak keys) before a request reaches it, the same
//! way for every backend.

use core::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::alg::{AeadAlg, Algorithm, CipherAlg, CrcAlg};
use crate::buffer::IoBuf;
use crate::error::BackendError;
use crate::key::SecretKey;
use crate::power::PowerDomain;

/// What kind of engine a backend drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BackendKind {
    /// This process's CPU (the fallback; always present).
    Cpu,
    /// A kernel-driven engine reached through a system-call interface
    /// (AF_ALG).
    Kernel,
    /// A device driven from userspace (VFIO).
    Device,
    /// Anything else a third party plugs in.
    Other,
}

/// A cipher request's parameters (already validated by the session).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct CipherParams {
    /// The CBC IV, CTR counter block, or XTS tweak of the first data unit.
    pub iv: [u8; 16],
    /// XTS: the data-unit length; the buffer is a whole number of units and
    /// unit `i` uses tweak `iv + i` (128-bit little-endian). Equal to the
    /// buffer length for a single unit; unused by CBC and CTR.
    pub data_unit: usize,
}

impl CipherParams {
    /// Parameters for one request.
    pub fn new(iv: [u8; 16], data_unit: usize) -> Self {
        CipherParams { iv, data_unit }
    }
}

/// A request that failed: the reason, and the caller's buffer handed back
/// **unchanged** (so the session can replay it elsewhere) — except after a
/// failed AEAD open, where it must be zeroed.
#[derive(Debug)]
#[non_exhaustive]
pub struct Failed {
    /// What went wrong.
    pub error: BackendError,
    /// The buffer.
    pub buf: IoBuf,
}

impl Failed {
    /// A failure with its buffer.
    pub fn new(error: BackendError, buf: IoBuf) -> Self {
        Failed { error, buf }
    }
}

/// An engine that can open keyed contexts.
///
/// # Cancel safety (for implementors)
/// A request future may be dropped at any await point. An implementation
/// must then keep any memory the engine may still access alive until the
/// engine is done with it (park it), and must not leave a slot or descriptor
/// leaked. The caller's `IoBuf` is owned precisely so that it can be parked.
#[async_trait]
pub trait Backend: Send + Sync + fmt::Debug + 'static {
    /// A short unique name, e.g. `"cpu"` or `"af-alg:virtio_crypto"`.
    fn name(&self) -> &str;

    /// What kind of engine this is.
    fn kind(&self) -> BackendKind;

    /// Whether this backend can run `alg` at all.
    fn supports(&self, alg: Algorithm) -> bool;

    /// The backend's device power domain, if it manages power (its contexts
    /// hold a [`PowerRef`](crate::PowerRef) while open, and each request in
    /// flight a clone). The selector counts a resume when it is suspended.
    fn power(&self) -> Option<&PowerDomain> {
        None
    }

    /// The CPU time a request takes from this machine — per request and per
    /// byte — when the backend knows it better than calibration can measure
    /// it. Calibration otherwise measures the process's CPU time per request.
    /// The simulated engine declares its modelled cost here: its real cost
    /// includes computing results on the CPU, which an engine would not.
    fn declared_cpu_cost(&self, _alg: Algorithm) -> Option<(Duration, f64)> {
        None
    }

    /// How many requests the engine can hold in flight, over all its queues,
    /// if it has a limit (the selector sends no more than that).
    fn queue_depth(&self) -> Option<usize> {
        None
    }

    /// The largest request (in bytes) the backend takes for `alg`, if it
    /// has a limit: the selector sends larger ones elsewhere, and
    /// calibration measures within it.
    fn max_request(&self, _alg: Algorithm) -> Option<usize> {
        None
    }

    /// The largest operation the engine carries a request of `alg` in, if
    /// it splits larger requests into several (each paying the fixed
    /// costs): the cost model counts the operations.
    fn operation_len(&self, _alg: Algorithm) -> Option<usize> {
        None
    }

    /// Whether the engine takes one data unit per operation for `alg` (an
    /// XTS request of several units costs it several operations, each
    /// paying the fixed costs; an AF_ALG engine, whose XTS takes one tweak
    /// per operation). The selector then charges per unit, and applies
    /// [`Backend::max_request`] to a unit.
    fn one_operation_per_unit(&self, _alg: Algorithm) -> bool {
        false
    }

    /// The lengths the engine takes for `alg` are multiples of this (of a
    /// data unit's, where [`Backend::one_operation_per_unit`]): other
    /// requests go elsewhere, as if it did not run the algorithm. 1 by
    /// default. (QEMU's virtio-crypto device has no XTS ciphertext
    /// stealing: 16.)
    fn length_multiple(&self, _alg: Algorithm) -> usize {
        1
    }

    /// Opens a keyed cipher context (both directions).
    ///
    /// # Cancel safety
    /// Dropping the future before it completes opens nothing.
    async fn open_cipher(
        &self,
        alg: CipherAlg,
        key: &SecretKey,
    ) -> Result<Box<dyn CipherContext>, BackendError>;

    /// Opens a keyed AEAD context.
    ///
    /// # Cancel safety
    /// Dropping the future before it completes opens nothing.
    async fn open_aead(
        &self,
        alg: AeadAlg,
        key: &SecretKey,
    ) -> Result<Box<dyn AeadContext>, BackendError>;

    /// Opens a CRC context.
    ///
    /// # Cancel safety
    /// Dropping the future before it completes opens nothing.
    async fn open_crc(&self, alg: CrcAlg) -> Result<Box<dyn CrcContext>, BackendError>;
}

/// A keyed cipher context on one backend. Requests take `&self`, so many can
/// be in flight at once.
#[async_trait]
pub trait CipherContext: Send + Sync {
    /// Encrypts `buf` in place.
    ///
    /// # Cancel safety
    /// See [`Backend`]: a dropped request must park memory the engine may
    /// still touch.
    async fn encrypt(&self, params: CipherParams, buf: IoBuf) -> Result<IoBuf, Failed>;

    /// Decrypts `buf` in place.
    ///
    /// # Cancel safety
    /// As for [`CipherContext::encrypt`].
    async fn decrypt(&self, params: CipherParams, buf: IoBuf) -> Result<IoBuf, Failed>;
}

/// A keyed AEAD context on one backend.
#[async_trait]
pub trait AeadContext: Send + Sync {
    /// Encrypts `buf` in place and returns the tag over `aad` and the
    /// ciphertext.
    ///
    /// # Cancel safety
    /// As for [`CipherContext::encrypt`].
    async fn seal(
        &self,
        nonce: [u8; 12],
        aad: &[u8],
        buf: IoBuf,
    ) -> Result<(IoBuf, [u8; 16]), Failed>;

    /// Verifies `tag` and decrypts `buf` in place. A tag that does not verify
    /// is [`BackendError::Authentication`] with the buffer zeroed.
    ///
    /// # Cancel safety
    /// As for [`CipherContext::encrypt`].
    async fn open(
        &self,
        nonce: [u8; 12],
        aad: &[u8],
        buf: IoBuf,
        tag: [u8; 16],
    ) -> Result<IoBuf, Failed>;
}

/// A CRC context on one backend: it computes the CRC of one buffer, from the
/// algorithm's standard initial value; sessions chain buffers together with
/// CRC combination, so consecutive updates may run on different backends.
#[async_trait]
pub trait CrcContext: Send + Sync {
    /// The CRC of `buf` alone.
    ///
    /// # Cancel safety
    /// As for [`CipherContext::encrypt`].
    async fn checksum(&self, buf: IoBuf) -> Result<(IoBuf, u64), Failed>;
}

/// A backend as an `Offload` holds it.
pub type SharedBackend = Arc<dyn Backend>;
