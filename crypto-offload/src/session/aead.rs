//! AEAD sessions (AES-GCM).

use core::fmt;
use core::future::Future;
use core::mem;
use core::pin::Pin;
use core::task::{Context, Poll};

use crypto_offload_fallback::{GCM_MAX_LEN, Gcm};
use tracing::Instrument;
use zeroize::Zeroize;

use super::{Engine, EngineFuture, open_engine, replaying};
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
        let secret = SecretKey::new(key).ok_or_else(bad_key)?;
        let engine = open_engine(&offload, alg.into(), |b| async move {
            b.open_aead(alg, &secret).await
        })
        .await?;
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
    pub fn seal<'a, B: Buffer>(&'a self, nonce: &'a [u8], aad: &'a [u8], buf: B) -> Seal<'a, B> {
        Seal(self.seal_detached(nonce, aad, buf))
    }

    /// Encrypts `buf` in place and returns the tag separately.
    ///
    /// # Errors
    /// As for [`seal`](Self::seal).
    ///
    /// # Cancel safety
    /// As for [`seal`](Self::seal).
    pub fn seal_detached<'a, B: Buffer>(
        &'a self,
        nonce: &'a [u8],
        aad: &'a [u8],
        buf: B,
    ) -> SealDetached<'a, B> {
        SealDetached {
            session: self,
            aad,
            state: SealState::Start { nonce, buf },
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
    pub fn open<'a, B: Buffer>(&'a self, nonce: &'a [u8], aad: &'a [u8], buf: B) -> Open<'a, B> {
        Open {
            session: self,
            aad,
            state: OpenState::Start {
                nonce,
                buf,
                tag: None,
            },
        }
    }

    /// Verifies `tag` and decrypts `buf` in place.
    ///
    /// # Errors
    /// As for [`open`](Self::open); [`Error::TagLength`] if `tag` is not 16
    /// bytes (the buffer is then untouched).
    ///
    /// # Cancel safety
    /// As for [`open`](Self::open).
    pub fn open_detached<'a, B: Buffer>(
        &'a self,
        nonce: &'a [u8],
        aad: &'a [u8],
        buf: B,
        tag: &'a [u8],
    ) -> Open<'a, B> {
        Open {
            session: self,
            aad,
            state: OpenState::Start {
                nonce,
                buf,
                tag: Some(tag),
            },
        }
    }

    #[inline]
    fn seal_cpu<B: Buffer>(
        &self,
        nonce: &[u8; 12],
        aad: &[u8],
        mut buf: B,
    ) -> Result<(B, Tag), RequestError<B>> {
        match self.cpu.seal_in_place_detached(nonce, aad, buf.bytes_mut()) {
            Ok(tag) => Ok((buf, tag)),
            Err(e) => Err(RequestError::new(map_error(self.alg.into(), e), buf)),
        }
    }

    #[inline]
    fn open_cpu<B: Buffer>(
        &self,
        nonce: &[u8; 12],
        aad: &[u8],
        mut buf: B,
        tag: &Tag,
    ) -> Result<B, RequestError<B>> {
        match self
            .cpu
            .open_in_place_detached(nonce, aad, buf.bytes_mut(), tag)
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

/// The future of [`AeadSession::seal_detached`].
#[must_use = "futures do nothing unless awaited"]
pub struct SealDetached<'a, B> {
    session: &'a AeadSession,
    aad: &'a [u8],
    state: SealState<'a, B>,
}

enum SealState<'a, B> {
    Start {
        nonce: &'a [u8],
        buf: B,
    },
    Engine {
        nonce: [u8; 12],
        fut: EngineFuture<'a, (IoBuf, Tag)>,
    },
    Done,
}

impl<B: Buffer> Future for SealDetached<'_, B> {
    type Output = Result<(B, Tag), RequestError<B>>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let (session, aad) = (this.session, this.aad);
        loop {
            match mem::replace(&mut this.state, SealState::Done) {
                SealState::Start { nonce, mut buf } => {
                    let nonce = match session.check(nonce, buf.bytes_mut().len()) {
                        Ok(n) => n,
                        Err(e) => return Poll::Ready(Err(RequestError::new(e, buf))),
                    };
                    let engine = match (route(session.engine.is_some()), &session.engine) {
                        (Route::Engine, Some(engine)) => engine,
                        _ => return Poll::Ready(session.seal_cpu(&nonce, aad, buf)),
                    };
                    let io = buf.into_io();
                    let span = tracing::trace_span!("seal", backend = &*engine.name, alg = %session.alg, len = io.len());
                    this.state = SealState::Engine {
                        nonce,
                        fut: engine.ctx.seal(nonce, aad, io).instrument(span),
                    };
                }
                SealState::Engine { nonce, mut fut } => {
                    return match Pin::new(&mut fut).poll(cx) {
                        Poll::Pending => {
                            this.state = SealState::Engine { nonce, fut };
                            Poll::Pending
                        }
                        Poll::Ready(Ok((io, tag))) => Poll::Ready(Ok((B::from_io(io), tag))),
                        Poll::Ready(Err(failed)) => {
                            if let Some(engine) = &session.engine {
                                replaying(&engine.name, &failed.error);
                            }
                            Poll::Ready(session.seal_cpu(&nonce, aad, B::from_io(failed.buf)))
                        }
                    };
                }
                SealState::Done => panic!("SealDetached polled after it completed"),
            }
        }
    }
}

/// The future of [`AeadSession::seal`]: [`SealDetached`] with the tag
/// appended to the buffer.
#[must_use = "futures do nothing unless awaited"]
pub struct Seal<'a, B>(SealDetached<'a, B>);

impl<B: Buffer> Future for Seal<'_, B> {
    type Output = Result<B, RequestError<B>>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.get_mut().0).poll(cx).map(|r| {
            r.map(|(mut buf, tag)| {
                buf.append(&tag);
                buf
            })
        })
    }
}

/// The future of [`AeadSession::open`] and
/// [`open_detached`](AeadSession::open_detached).
#[must_use = "futures do nothing unless awaited"]
pub struct Open<'a, B> {
    session: &'a AeadSession,
    aad: &'a [u8],
    state: OpenState<'a, B>,
}

enum OpenState<'a, B> {
    /// `tag`: detached, or `None` for the buffer's last 16 bytes.
    Start {
        nonce: &'a [u8],
        buf: B,
        tag: Option<&'a [u8]>,
    },
    Engine {
        nonce: [u8; 12],
        tag: Tag,
        fut: EngineFuture<'a, IoBuf>,
    },
    Done,
}

impl<B: Buffer> Open<'_, B> {
    /// Validates the request and takes the tag (off the buffer's end if it
    /// is not detached).
    fn start(
        session: &AeadSession,
        nonce: &[u8],
        mut buf: B,
        tag: Option<&[u8]>,
    ) -> Result<([u8; 12], Tag, B), RequestError<B>> {
        let alg = session.alg.into();
        let tag = match tag {
            Some(t) => match <Tag>::try_from(t) {
                Ok(t) => t,
                Err(_) => {
                    let e = Error::TagLength {
                        alg,
                        len: t.len(),
                        expected: 16,
                    };
                    return Err(RequestError::new(e, buf));
                }
            },
            None => {
                let len = buf.bytes_mut().len();
                let Some(ct_len) = len.checked_sub(16) else {
                    let e = Error::TagLength {
                        alg,
                        len,
                        expected: 16,
                    };
                    return Err(RequestError::new(e, buf));
                };
                let mut t = [0u8; 16];
                t.copy_from_slice(&buf.bytes_mut()[ct_len..]);
                buf.shorten(ct_len);
                t
            }
        };
        match session.check(nonce, buf.bytes_mut().len()) {
            Ok(nonce) => Ok((nonce, tag, buf)),
            Err(e) => Err(RequestError::new(e, buf)),
        }
    }
}

impl<B: Buffer> Future for Open<'_, B> {
    type Output = Result<B, RequestError<B>>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let (session, aad) = (this.session, this.aad);
        loop {
            match mem::replace(&mut this.state, OpenState::Done) {
                OpenState::Start { nonce, buf, tag } => {
                    let (nonce, tag, buf) = match Self::start(session, nonce, buf, tag) {
                        Ok(v) => v,
                        Err(e) => return Poll::Ready(Err(e)),
                    };
                    let engine = match (route(session.engine.is_some()), &session.engine) {
                        (Route::Engine, Some(engine)) => engine,
                        _ => return Poll::Ready(session.open_cpu(&nonce, aad, buf, &tag)),
                    };
                    let io = buf.into_io();
                    let span = tracing::trace_span!("open", backend = &*engine.name, alg = %session.alg, len = io.len());
                    this.state = OpenState::Engine {
                        nonce,
                        tag,
                        fut: engine.ctx.open(nonce, aad, io, tag).instrument(span),
                    };
                }
                OpenState::Engine {
                    nonce,
                    tag,
                    mut fut,
                } => {
                    return match Pin::new(&mut fut).poll(cx) {
                        Poll::Pending => {
                            this.state = OpenState::Engine { nonce, tag, fut };
                            Poll::Pending
                        }
                        Poll::Ready(Ok(io)) => Poll::Ready(Ok(B::from_io(io))),
                        Poll::Ready(Err(failed))
                            if matches!(failed.error, BackendError::Authentication) =>
                        {
                            Poll::Ready(Err(RequestError::new(
                                Error::Authentication,
                                wiped(failed.buf),
                            )))
                        }
                        Poll::Ready(Err(failed)) => {
                            if let Some(engine) = &session.engine {
                                replaying(&engine.name, &failed.error);
                            }
                            Poll::Ready(session.open_cpu(&nonce, aad, B::from_io(failed.buf), &tag))
                        }
                    };
                }
                OpenState::Done => panic!("Open polled after it completed"),
            }
        }
    }
}

macro_rules! debug_request {
    ($($t:ident),*) => {$(
        impl<B> fmt::Debug for $t<'_, B> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($t)).finish_non_exhaustive()
            }
        }
    )*};
}
debug_request!(SealDetached, Seal, Open);
