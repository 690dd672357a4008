//! What an engine implements to serve sessions: the [`Backend`] trait and
//! everything its implementation names.
//!
//! Every engine but the CPU is reached through this trait: the AF_ALG and
//! VFIO backends this crate ships (`crypto_offload::af_alg` and
//! `crypto_offload::vfio`, behind their features), a third party's engine,
//! a test double. It is object-safe ([`SharedBackend`] is
//! `Arc<dyn Backend>`), with async methods through [`macro@async_trait`],
//! re-exported here so that an implementation needs no dependency of its
//! own for it. (The CPU backend, [`CpuBackend`](crate::cpu::CpuBackend),
//! implements it too, but sessions call the CPU code directly, without a
//! virtual call or an allocation.)
//!
//! A backend never sees invalid input: sessions check key, IV, nonce, tag
//! and data lengths (and XTS weak keys) before a request reaches it, the same
//! way for every backend. It works on the caller's buffer, moved ([`IoBuf`]),
//! and hands it back — with a [`BackendError`] in a [`Failed`] when the
//! request fails, so the session can replay it on the CPU. A backend that
//! manages its device's power gives it a [`PowerDomain`] over its own
//! [`PowerControl`]. Check an implementation with the known-answer harness
//! (`crypto_offload::testing`, feature `testing`).
//!
//! ```
//! use std::sync::Arc;
//!
//! use crypto_offload::backend::{
//!     AeadContext, Backend, BackendError, BackendKind, CipherContext, CrcContext, Limits,
//!     SecretKey, SharedBackend, async_trait,
//! };
//! use crypto_offload::cpu::CpuBackend;
//! use crypto_offload::{AeadAlg, Algorithm, CipherAlg, CrcAlg, Offload};
//!
//! /// The CPU under another name: a stand-in for a real engine's driver.
//! #[derive(Debug)]
//! struct Engine;
//!
//! #[async_trait]
//! impl Backend for Engine {
//!     fn name(&self) -> &str {
//!         "my-engine"
//!     }
//!     fn kind(&self) -> BackendKind {
//!         BackendKind::Other
//!     }
//!     fn limits(&self, alg: Algorithm) -> Option<Limits> {
//!         matches!(alg, Algorithm::Cipher(_)).then(Limits::new)
//!     }
//!     async fn open_cipher(
//!         &self,
//!         alg: CipherAlg,
//!         key: &SecretKey,
//!     ) -> Result<Box<dyn CipherContext>, BackendError> {
//!         CpuBackend::new().open_cipher(alg, key).await
//!     }
//!     async fn open_aead(
//!         &self,
//!         alg: AeadAlg,
//!         _key: &SecretKey,
//!     ) -> Result<Box<dyn AeadContext>, BackendError> {
//!         Err(BackendError::Unsupported(alg.name().to_owned()))
//!     }
//!     async fn open_crc(&self, alg: CrcAlg) -> Result<Box<dyn CrcContext>, BackendError> {
//!         Err(BackendError::Unsupported(alg.name().to_owned()))
//!     }
//! }
//!
//! let engine: SharedBackend = Arc::new(Engine);
//! let offload = Offload::builder().backend(engine).pin("my-engine").build()?;
//! assert_eq!(offload.backends()[1].name, "my-engine");
//! # Ok::<(), crypto_offload::Error>(())
//! ```

use core::fmt;
use std::sync::Arc;
use std::time::Duration;

/// The attribute that makes the traits' async methods object-safe (the
/// [`async-trait`](https://docs.rs/async-trait) crate's), for
/// implementations of [`Backend`], its contexts and [`PowerControl`].
pub use async_trait::async_trait;

pub use crate::buffer::{DeviceMemory, IoBuf};
pub use crate::error::BackendError;
pub use crate::key::{MAX_KEY_LEN, SecretKey};
pub use crate::power::{PowerControl, PowerDomain, PowerRef, PowerStats};

use crate::alg::{AeadAlg, Algorithm, CipherAlg, CrcAlg};

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

/// What a backend takes of one algorithm and how it carries it: the shape
/// and cost hints the selector and calibration read once
/// ([`Backend::limits`]). The default is no limit at all.
///
/// ```
/// use crypto_offload::backend::Limits;
///
/// // An engine whose XTS takes one 16-byte-multiple data unit per operation,
/// // at most 64 KiB, with 256 requests in flight.
/// let xts = Limits::new()
///     .with_max_request(64 * 1024)
///     .with_one_operation_per_unit()
///     .with_length_multiple(16)
///     .with_queue_depth(256);
/// assert_eq!(xts.max_request, Some(64 * 1024));
/// assert_eq!(Limits::default().length_multiple, 1);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct Limits {
    /// The largest request (in bytes) the backend takes, if it has a limit:
    /// the selector sends larger ones elsewhere, and calibration measures
    /// within it. Applies to one data unit where
    /// [`one_operation_per_unit`](Limits::one_operation_per_unit).
    pub max_request: Option<usize>,
    /// The largest operation the engine carries a request in, if it splits
    /// larger requests into several (each paying the fixed costs): the cost
    /// model counts the operations.
    pub operation_len: Option<usize>,
    /// The engine takes one data unit per operation (an XTS request of
    /// several units costs it several operations, each paying the fixed
    /// costs — the kernel's `xts(aes)` takes one tweak per operation). The
    /// selector then charges per unit.
    pub one_operation_per_unit: bool,
    /// The lengths the engine takes are multiples of this (of a data
    /// unit's, where [`one_operation_per_unit`](Limits::one_operation_per_unit));
    /// other requests go elsewhere. At least 1. (QEMU's virtio-crypto device
    /// has no XTS ciphertext stealing: 16.)
    pub length_multiple: usize,
    /// How many requests the engine holds in flight, over all its queues,
    /// if it has a limit (the selector sends no more than that).
    pub queue_depth: Option<usize>,
    /// The CPU time a request takes from this machine — per request and
    /// per byte — when the backend knows it better than calibration can
    /// measure it (calibration otherwise measures the process's CPU time
    /// per request). A simulated engine declares its modelled cost here:
    /// its real cost includes computing results on the CPU, which an engine
    /// would not.
    pub cpu_cost: Option<(Duration, f64)>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits::new()
    }
}

impl Limits {
    /// No limits: any length, any size, one operation a request.
    pub const fn new() -> Self {
        Limits {
            max_request: None,
            operation_len: None,
            one_operation_per_unit: false,
            length_multiple: 1,
            queue_depth: None,
            cpu_cost: None,
        }
    }

    /// Sets [`max_request`](Limits::max_request).
    #[must_use]
    pub const fn with_max_request(mut self, bytes: usize) -> Self {
        self.max_request = Some(bytes);
        self
    }

    /// Sets [`operation_len`](Limits::operation_len).
    #[must_use]
    pub const fn with_operation_len(mut self, bytes: usize) -> Self {
        self.operation_len = Some(bytes);
        self
    }

    /// Sets [`one_operation_per_unit`](Limits::one_operation_per_unit).
    #[must_use]
    pub const fn with_one_operation_per_unit(mut self) -> Self {
        self.one_operation_per_unit = true;
        self
    }

    /// Sets [`length_multiple`](Limits::length_multiple) (0 is taken as 1).
    #[must_use]
    pub const fn with_length_multiple(mut self, bytes: usize) -> Self {
        self.length_multiple = if bytes == 0 { 1 } else { bytes };
        self
    }

    /// Sets [`queue_depth`](Limits::queue_depth).
    #[must_use]
    pub const fn with_queue_depth(mut self, requests: usize) -> Self {
        self.queue_depth = Some(requests);
        self
    }

    /// Sets [`cpu_cost`](Limits::cpu_cost).
    #[must_use]
    pub const fn with_cpu_cost(mut self, per_request: Duration, per_byte_ns: f64) -> Self {
        self.cpu_cost = Some((per_request, per_byte_ns));
        self
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

    /// Whether the backend runs `alg`, and if so the shapes it takes and
    /// how it carries them ([`Limits`]); `None` if it does not run it.
    ///
    /// **Read once**, for every algorithm, when the backend joins an
    /// `Offload` ([`OffloadBuilder::build`](crate::OffloadBuilder::build)):
    /// the selector and calibration use that copy, so an answer that changes
    /// later is not seen (build a new `Offload`).
    fn limits(&self, alg: Algorithm) -> Option<Limits>;

    /// The backend's device power domain, if it manages power (its contexts
    /// hold a [`PowerRef`] while open, and each request in
    /// flight a clone). The selector counts a resume when it is suspended.
    fn power(&self) -> Option<&PowerDomain> {
        None
    }

    /// `len` zero bytes of the engine's own memory, for a [`DeviceBuf`]
    /// its requests work on in place (no copy in or out); `None` (the
    /// default) where it has none to lend now — the buffer is then
    /// ordinary memory. Called by [`Offload::buffer`]: keep it cheap and
    /// never block.
    ///
    /// [`DeviceBuf`]: crate::DeviceBuf
    /// [`Offload::buffer`]: crate::Offload::buffer
    fn buffer(&self, _len: usize) -> Option<Box<dyn DeviceMemory>> {
        None
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

/// A keyed context of any kind on an engine, for calibration and probes.
pub(crate) enum AnyContext {
    Cipher(Box<dyn CipherContext>),
    Aead(Box<dyn AeadContext>),
    Crc(Box<dyn CrcContext>),
}

impl AnyContext {
    /// A context for `alg` on `backend`, keyed with [`SecretKey::for_tests`].
    pub(crate) async fn open(backend: &dyn Backend, alg: Algorithm) -> Result<Self, BackendError> {
        Ok(match alg {
            Algorithm::Cipher(c) => AnyContext::Cipher(
                backend
                    .open_cipher(c, &SecretKey::for_tests(c.key_len()))
                    .await?,
            ),
            Algorithm::Aead(a) => AnyContext::Aead(
                backend
                    .open_aead(a, &SecretKey::for_tests(a.key_len()))
                    .await?,
            ),
            Algorithm::Crc(c) => AnyContext::Crc(backend.open_crc(c).await?),
        })
    }
}
