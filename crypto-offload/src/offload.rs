//! `Offload`: the set of backends sessions run on, as a value.

use core::fmt;
use std::sync::Arc;

use crypto_offload_fallback::Implementation;

use crate::alg::{AeadAlg, Algorithm, CipherAlg, CrcAlg};
use crate::backend::{BackendKind, SharedBackend};
use crate::cpu::CpuBackend;
use crate::error::Error;
use crate::session::{AeadSession, CipherSession, CrcSession};

/// The engines this process may use, and the policy for using them.
///
/// A plain value, like a rustls `CryptoProvider`: build one with
/// [`Offload::discover`] or [`Offload::builder`], and hand it (or clones of
/// it — cloning is an `Arc` bump) to whatever opens sessions. There is no
/// hidden global. `Offload` is `Send + Sync`.
///
/// The CPU backend is always present and runs every algorithm.
#[derive(Clone)]
pub struct Offload {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) cpu: CpuBackend,
    pub(crate) backends: Vec<SharedBackend>,
    /// The backend every session is pinned to (index into `backends`);
    /// `None` runs sessions on the CPU.
    pub(crate) pinned: Option<usize>,
}

/// One backend of an `Offload`, as [`Offload::backends`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BackendInfo {
    /// The backend's name.
    pub name: String,
    /// What kind of engine it is.
    pub kind: BackendKind,
    /// The algorithms it runs.
    pub algorithms: Vec<Algorithm>,
    /// Whether sessions are pinned to it.
    pub pinned: bool,
}

impl Offload {
    /// A builder, starting from the CPU backend alone.
    pub fn builder() -> OffloadBuilder {
        OffloadBuilder::default()
    }

    /// Every compiled-in backend that works on this machine, plus the CPU.
    ///
    /// In this release the only compiled-in backend is the CPU; the AF_ALG
    /// and VFIO backends join behind their features. A backend that is
    /// compiled in but unavailable here (no device, no permission) is left
    /// out, never an error.
    ///
    /// # Errors
    /// None today; the signature leaves room for a probe that must fail
    /// loudly (a malformed explicit configuration).
    ///
    /// # Cancel safety
    /// Dropping the future before it completes leaves nothing behind.
    pub async fn discover() -> Result<Offload, Error> {
        Offload::builder().build()
    }

    /// Opens a cipher session for `alg` keyed with `key`.
    ///
    /// # Errors
    /// [`Error::KeyLength`] unless `key` is `alg.key_len()` bytes;
    /// [`Error::WeakKey`] for an XTS key with equal halves;
    /// [`Error::Unsupported`] / [`Error::Backend`] if the pinned backend
    /// cannot run it.
    ///
    /// # Cancel safety
    /// Dropping the future before it completes opens nothing.
    pub async fn cipher(&self, alg: CipherAlg, key: &[u8]) -> Result<CipherSession, Error> {
        CipherSession::start(self.clone(), alg, key).await
    }

    /// Opens an AEAD session for `alg` keyed with `key`.
    ///
    /// # Errors
    /// As for [`Offload::cipher`].
    ///
    /// # Cancel safety
    /// Dropping the future before it completes opens nothing.
    pub async fn aead(&self, alg: AeadAlg, key: &[u8]) -> Result<AeadSession, Error> {
        AeadSession::start(self.clone(), alg, key).await
    }

    /// Opens a CRC session for `alg`.
    ///
    /// # Errors
    /// [`Error::Unsupported`] / [`Error::Backend`] if the pinned backend
    /// cannot run it.
    ///
    /// # Cancel safety
    /// Dropping the future before it completes opens nothing.
    pub async fn crc(&self, alg: CrcAlg) -> Result<CrcSession, Error> {
        CrcSession::start(self.clone(), alg).await
    }

    /// The backends, CPU first.
    pub fn backends(&self) -> Vec<BackendInfo> {
        let mut out = vec![BackendInfo {
            name: CpuBackend::NAME.to_owned(),
            kind: BackendKind::Cpu,
            algorithms: Algorithm::all().collect(),
            pinned: self.inner.pinned.is_none(),
        }];
        for (i, b) in self.inner.backends.iter().enumerate() {
            out.push(BackendInfo {
                name: b.name().to_owned(),
                kind: b.kind(),
                algorithms: Algorithm::all().filter(|&a| b.supports(a)).collect(),
                pinned: self.inner.pinned == Some(i),
            });
        }
        out
    }

    pub(crate) fn inner(&self) -> &Inner {
        &self.inner
    }
}

impl fmt::Debug for Offload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = core::iter::once(CpuBackend::NAME)
            .chain(self.inner.backends.iter().map(|b| b.name()))
            .collect();
        f.debug_struct("Offload")
            .field("backends", &names)
            .field(
                "pinned",
                &self
                    .inner
                    .pinned
                    .map(|i| self.inner.backends[i].name())
                    .unwrap_or(CpuBackend::NAME),
            )
            .finish()
    }
}

/// Builds an [`Offload`].
///
/// ```
/// use crypto_offload::{Implementation, Offload};
///
/// // Third-party engines join with `.backend(Arc::new(engine))`; `.pin`
/// // sends every session to one of them.
/// let offload = Offload::builder()
///     .cpu_implementation(Implementation::RustCrypto)
///     .pin("cpu")
///     .build()?;
/// assert_eq!(offload.backends()[0].name, "cpu");
/// assert!(Offload::builder().pin("no-such-engine").build().is_err());
/// # Ok::<(), crypto_offload::Error>(())
/// ```
#[derive(Default)]
pub struct OffloadBuilder {
    cpu: CpuBackend,
    backends: Vec<SharedBackend>,
    pin: Option<String>,
}

impl OffloadBuilder {
    /// Adds a backend (a third party's engine, a simulated one, …).
    pub fn backend(mut self, backend: SharedBackend) -> Self {
        self.backends.push(backend);
        self
    }

    /// Runs every session on the backend called `name` (`"cpu"` for the
    /// CPU). Requests that backend fails are still completed on the CPU.
    pub fn pin(mut self, name: impl Into<String>) -> Self {
        self.pin = Some(name.into());
        self
    }

    /// Forces the CPU backend's modes onto one implementation (RustCrypto or
    /// aws-lc), for tests and benchmarks.
    pub fn cpu_implementation(mut self, imp: Implementation) -> Self {
        self.cpu = CpuBackend::with_implementation(imp);
        self
    }

    /// The `Offload`.
    ///
    /// # Errors
    /// [`Error::UnknownBackend`] if [`pin`](Self::pin) names no backend, or
    /// if two backends share a name.
    pub fn build(self) -> Result<Offload, Error> {
        let mut names = vec![CpuBackend::NAME];
        for b in &self.backends {
            if names.contains(&b.name()) {
                return Err(Error::UnknownBackend(format!(
                    "{} (registered twice)",
                    b.name()
                )));
            }
            names.push(b.name());
        }
        let pinned = match self.pin.as_deref() {
            None | Some(CpuBackend::NAME) => None,
            Some(name) => Some(
                self.backends
                    .iter()
                    .position(|b| b.name() == name)
                    .ok_or_else(|| Error::UnknownBackend(name.to_owned()))?,
            ),
        };
        Ok(Offload {
            inner: Arc::new(Inner {
                cpu: self.cpu,
                backends: self.backends,
                pinned,
            }),
        })
    }
}
