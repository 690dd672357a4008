//! AEAD sessions (AES-GCM).

use core::fmt;

use crypto_offload_fallback::{GCM_MAX_LEN, Gcm};
use tracing::Instrument;
use zeroize::Zeroize;

use super::{Engine, engine_for, open_failed, replaying};
use crate::alg::{AeadAlg, Algorithm};
use crate::backend::AeadContext;
use crate::buffer::{Buffer, IoBuf};
use crate::cpu::map_error;
use crate::error::{BackendError, Error, LengthRule, RequestError};
use crate::key::SecretKey;
use crate::offload::Offload;
use crate::route::{Route, route};

/// A detached AEAD tag.
pub type Tag = [u8; 16];

/// A keyed AEAD session (AES-GCM, 96-bit nonce, 128-bit tag).
///
/// Requests take `&self` (many in flight; `Send + Sync`). The caller owns
/// nonce uniqueness: never seal two messages with the same key and nonce.
///
/// ```
/// # futures::executor::block_on(async {
/// use crypto_offload::{AeadAlg, Error, Offload};
///
/// let offload = Offload::discover().await?;
/// let gcm = offload.aead(AeadAlg::Aes128Gcm, &[1u8; 16]).await?;
/// let nonce = [0u8; 12];
/// let sealed = gcm.seal(&nonce, b"header", b"hello".to_vec()).await?;  // ciphertext ‖ tag
/// assert_eq!(sealed.len(), 5 + 16);
///
/// let mut tampered = sealed.clone();
/// tampered[0] ^= 1;
/// let err = gcm.open(&nonce, b"header", tampered).await.unwrap_err();
/// assert!(matches!(err.error(), Error::Authentication));
/// assert!(err.into_buffer().iter().all(|&b| b == 0));        // nothing released
///
/// assert_eq!(gcm.open(&nonce, b"header", sealed).await?, b"hello");
/// # Ok::<(), crypto_offload::Error>(()) });
/// ```
pub struct AeadSession {
    alg: AeadAlg,
    cpu: Gcm,
    engine: Option<Engine<dyn AeadContext>>,
    _offload: Offload,
}

impl fmt::Debug for AeadSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AeadSession")
            .field("alg", &self.alg)
            .field("engine", &self.engine.as_ref().map(|e| &*e.name))
            .finish_non_exhaustive()
    }
}

impl AeadSession {
    pub(crate) async fn start(offload: Offload, alg: AeadAlg, key: &[u8]) -> Result<Self, Error> {
        let bad_key = || Error::KeyLength {
            alg: alg.into(),
            len: key.len(),
            expected: alg.key_len(),
        };
        if key.len() != alg.key_len() {
            return Err(bad_key());
        }
        let cpu = offload.inner().cpu.aead(alg, key)?;
        let engine = match engine_for(&offload, alg.into())? {
            None => None,
            Some(backend) => {
                let secret = SecretKey::new(key).ok_or_else(bad_key)?;
                let span = tracing::debug_span!("open_aead", backend = backend.name(), alg = %alg);
                let ctx = backend
                    .open_aead(alg, &secret)
                    .instrument(span)
                    .await
                    .map_err(|e| open_failed(backend, e))?;
                Some(Engine {
                    name: backend.name().into(),
                    ctx,
                })
            }
        };
        Ok(AeadSession {
            alg,
            cpu,
            engine,
            _offload: offload,
        })
    }

    /// The algorithm.
    pub fn alg(&self) -> AeadAlg {
        self.alg
    }

    /// The backend requests go to (`"cpu"` unless one is pinned).
    pub fn backend(&self) -> &str {
        self.engine
            .as_ref()
            .map_or(crate::CpuBackend::NAME, |e| &e.name)
    }

    /// Encrypts `buf` in place and appends the 16-byte tag.
    ///
    /// # Errors
    /// [`Error::IvLength`] for a nonce that is not 12 bytes;
    /// [`Error::DataLength`] above 2^36 − 32 bytes.
    ///
    /// # Cancel safety
    /// As for [`CipherSession::encrypt`](crate::CipherSession::encrypt).
    pub async fn seal<B: Buffer>(
        &self,
        nonce: &[u8],
        aad: &[u8],
        buf: B,
    ) -> Result<B, RequestError<B>> {
        let (mut buf, tag) = self.seal_detached(nonce, aad, buf).await?;
        buf.append(&tag);
        Ok(buf)
    }

    /// Encrypts `buf` in place and returns the tag separately.
    ///
    /// # Errors
    /// As for [`seal`](Self::seal).
    ///
    /// # Cancel safety
    /// As for [`seal`](Self::seal).
    pub async fn seal_detached<B: Buffer>(
        &self,
        nonce: &[u8],
        aad: &[u8],
        mut buf: B,
    ) -> Result<(B, Tag), RequestError<B>> {
        let nonce = match self.check(nonce, buf.bytes_mut().len()) {
            Ok(n) => n,
            Err(e) => return Err(RequestError::new(e, buf)),
        };
        if let (Route::Engine, Some(engine)) = (route(self.engine.is_some()), &self.engine) {
            let io = buf.into_io();
            let span = tracing::trace_span!("seal", backend = &*engine.name, alg = %self.alg, len = io.len());
            match engine.ctx.seal(nonce, aad, io).instrument(span).await {
                Ok((io, tag)) => return Ok((B::from_io(io), tag)),
                Err(failed) => {
                    replaying(&engine.name, &failed.error);
                    buf = B::from_io(failed.buf);
                }
            }
        }
        match self
            .cpu
            .seal_in_place_detached(&nonce, aad, buf.bytes_mut())
        {
            Ok(tag) => Ok((buf, tag)),
            Err(e) => Err(RequestError::new(map_error(self.alg.into(), e), buf)),
        }
    }

    /// Verifies and decrypts `buf` = ciphertext ‖ 16-byte tag; returns the
    /// plaintext (the buffer, shortened by the tag).
    ///
    /// # Errors
    /// [`Error::Authentication`] if the tag does not verify: the buffer in
    /// the [`RequestError`] is then all zeros. [`Error::TagLength`] if `buf`
    /// is shorter than a tag; [`Error::IvLength`] as for `seal`.
    ///
    /// # Cancel safety
    /// As for [`seal`](Self::seal). No plaintext is ever observable before
    /// the tag has verified.
    pub async fn open<B: Buffer>(
        &self,
        nonce: &[u8],
        aad: &[u8],
        mut buf: B,
    ) -> Result<B, RequestError<B>> {
        let len = buf.bytes_mut().len();
        let Some(ct_len) = len.checked_sub(16) else {
            let e = Error::TagLength {
                alg: self.alg.into(),
                len,
                expected: 16,
            };
            return Err(RequestError::new(e, buf));
        };
        let mut tag = [0u8; 16];
        tag.copy_from_slice(&buf.bytes_mut()[ct_len..]);
        buf.shorten(ct_len);
        self.open_detached(nonce, aad, buf, &tag).await
    }

    /// Verifies `tag` and decrypts `buf` in place.
    ///
    /// # Errors
    /// As for [`open`](Self::open); [`Error::TagLength`] if `tag` is not 16
    /// bytes (the buffer is then untouched).
    ///
    /// # Cancel safety
    /// As for [`open`](Self::open).
    pub async fn open_detached<B: Buffer>(
        &self,
        nonce: &[u8],
        aad: &[u8],
        mut buf: B,
        tag: &[u8],
    ) -> Result<B, RequestError<B>> {
        let checked = self.check(nonce, buf.bytes_mut().len()).and_then(|n| {
            let t = <[u8; 16]>::try_from(tag).map_err(|_| Error::TagLength {
                alg: self.alg.into(),
                len: tag.len(),
                expected: 16,
            })?;
            Ok((n, t))
        });
        let (nonce, tag) = match checked {
            Ok(v) => v,
            Err(e) => return Err(RequestError::new(e, buf)),
        };
        if let (Route::Engine, Some(engine)) = (route(self.engine.is_some()), &self.engine) {
            let io = buf.into_io();
            let span = tracing::trace_span!("open", backend = &*engine.name, alg = %self.alg, len = io.len());
            match engine.ctx.open(nonce, aad, io, tag).instrument(span).await {
                Ok(io) => return Ok(B::from_io(io)),
                Err(failed) if matches!(failed.error, BackendError::Authentication) => {
                    return Err(RequestError::new(Error::Authentication, wiped(failed.buf)));
                }
                Err(failed) => {
                    replaying(&engine.name, &failed.error);
                    buf = B::from_io(failed.buf);
                }
            }
        }
        match self
            .cpu
            .open_in_place_detached(&nonce, aad, buf.bytes_mut(), &tag)
        {
            Ok(()) => Ok(buf),
            Err(e) => Err(RequestError::new(map_error(self.alg.into(), e), buf)),
        }
    }

    fn check(&self, nonce: &[u8], len: usize) -> Result<[u8; 12], Error> {
        let alg: Algorithm = self.alg.into();
        let nonce = <[u8; 12]>::try_from(nonce).map_err(|_| Error::IvLength {
            alg,
            len: nonce.len(),
            expected: 12,
        })?;
        if len as u64 > GCM_MAX_LEN {
            return Err(Error::DataLength {
                alg,
                len,
                rule: LengthRule::TooLong(GCM_MAX_LEN),
            });
        }
        Ok(nonce)
    }
}

/// A buffer a backend failed to authenticate, zeroed again here so that a
/// careless backend cannot release plaintext.
fn wiped<B: Buffer>(io: IoBuf) -> B {
    let mut buf = B::from_io(io);
    buf.bytes_mut().zeroize();
    buf
}
