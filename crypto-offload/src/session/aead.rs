//! AEAD sessions (AES-GCM).

use core::fmt;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};

use std::sync::Arc;

use crypto_offload_fallback::{GCM_MAX_LEN, Gcm};
use zeroize::Zeroize;

use super::iv::IvInput;
use super::request::{CpuJob, OpenContext, Operation, Request};
use super::{BoxedRequest, Contexts, session_key};
use crate::alg::{AeadAlg, Algorithm};
use crate::backend::{AeadContext, Failed, SharedBackend};
use crate::buffer::{Buffer, IoBuf};
use crate::cost::Direction;
use crate::cpu::map_error;
use crate::error::{BackendError, Error, LengthRule, RequestError};
use crate::key::SecretKey;
use crate::select::Request as Asked;
use crate::slot::Slots;

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
/// # Ok::<(), crypto_offload::Error>(()) }).unwrap();
/// ```
pub struct AeadSession {
    alg: AeadAlg,
    cpu: Arc<Gcm>,
    key: SecretKey,
    contexts: Contexts<dyn AeadContext>,
    slots: Arc<Slots>,
}

impl fmt::Debug for AeadSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AeadSession")
            .field("alg", &self.alg)
            .field("engines", &self.contexts.open_on(&self.slots))
            .finish_non_exhaustive()
    }
}

impl AeadSession {
    pub(crate) async fn start(slots: Arc<Slots>, alg: AeadAlg, key: &[u8]) -> Result<Self, Error> {
        let secret = session_key(alg.into(), alg.key_len(), key)?;
        let cpu = Arc::new(slots.cpu.aead(alg, key)?);
        let key = secret;
        let contexts = Contexts::open(&slots, alg.into(), |b| {
            let key = key.clone();
            async move { b.open_aead(alg, &key).await }
        })
        .await?;
        Ok(AeadSession {
            alg,
            cpu,
            key,
            contexts,
            slots,
        })
    }

    /// The algorithm.
    pub fn alg(&self) -> AeadAlg {
        self.alg
    }

    /// The backend a request of `len` bytes would go to now.
    pub fn backend_for(&self, dir: Direction, len: usize) -> &str {
        let asked = Asked::new(self.alg.into(), dir, len);
        self.slots[crate::select::choose(&self.slots, &asked).0].name()
    }

    /// Encrypts `buf` in place and appends the 16-byte tag.
    ///
    /// # Errors
    /// [`Error::IvLength`] for a nonce that is not 12 bytes;
    /// [`Error::DataLength`] above 2^36 − 32 bytes.
    ///
    /// # Cancel safety
    /// As for [`CipherSession::encrypt`](crate::CipherSession::encrypt).
    pub fn seal<'a, B: Buffer>(
        &'a self,
        nonce: impl IvInput<12>,
        aad: &'a [u8],
        buf: B,
    ) -> Seal<'a, B> {
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
        nonce: impl IvInput<12>,
        aad: &'a [u8],
        buf: B,
    ) -> SealDetached<'a, B> {
        SealDetached(Request::new(
            SealOp {
                session: self,
                aad,
                nonce: nonce.into_block(),
            },
            buf,
        ))
    }

    /// Verifies and decrypts `buf` = ciphertext ‖ 16-byte tag; returns the
    /// plaintext (the buffer, shortened by the tag).
    ///
    /// # Errors
    /// [`Error::Authentication`] if the tag does not verify: the buffer in
    /// the [`RequestError`] is then all zeros, shortened by the tag as a
    /// plaintext would be. [`Error::TagLength`] if `buf` is shorter than a
    /// tag; [`Error::IvLength`] as for `seal`.
    ///
    /// # Cancel safety
    /// As for [`seal`](Self::seal). No plaintext is ever observable before
    /// the tag has verified.
    pub fn open<'a, B: Buffer>(
        &'a self,
        nonce: impl IvInput<12>,
        aad: &'a [u8],
        buf: B,
    ) -> Open<'a, B> {
        Open(Request::new(
            OpenOp {
                session: self,
                aad,
                nonce: nonce.into_block(),
                tag: None,
            },
            buf,
        ))
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
        nonce: impl IvInput<12>,
        aad: &'a [u8],
        buf: B,
        tag: &'a [u8],
    ) -> Open<'a, B> {
        Open(Request::new(
            OpenOp {
                session: self,
                aad,
                nonce: nonce.into_block(),
                tag: Some(tag),
            },
            buf,
        ))
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

    fn check(&self, nonce: Result<[u8; 12], u32>, len: usize) -> Result<[u8; 12], Error> {
        let alg: Algorithm = self.alg.into();
        let nonce = nonce.map_err(|given| Error::IvLength {
            alg,
            len: given as usize,
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

/// The threads a blocking-pool GCM job runs on: the plan's parts, where
/// splitting GCM pays (see `Gcm::PARALLEL_MIN_THREADS`), else one.
fn gcm_threads(offered: usize) -> usize {
    if offered >= Gcm::PARALLEL_MIN_THREADS {
        offered
    } else {
        1
    }
}

/// The future of [`AeadSession::seal_detached`].
#[must_use = "futures do nothing unless awaited"]
pub struct SealDetached<'a, B: Buffer>(Request<'a, SealOp<'a>, B>);

impl<B: Buffer> Future for SealDetached<'_, B> {
    type Output = Result<(B, Tag), RequestError<B>>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.get_mut().0).poll(cx)
    }
}

/// The future of [`AeadSession::seal`]: [`SealDetached`] with the tag
/// appended to the buffer.
#[must_use = "futures do nothing unless awaited"]
pub struct Seal<'a, B: Buffer>(SealDetached<'a, B>);

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
pub struct Open<'a, B: Buffer>(Request<'a, OpenOp<'a>, B>);

impl<B: Buffer> Future for Open<'_, B> {
    type Output = Result<B, RequestError<B>>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.get_mut().0).poll(cx)
    }
}

macro_rules! debug_request {
    ($($t:ident),*) => {$(
        impl<B: Buffer> fmt::Debug for $t<'_, B> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($t)).finish_non_exhaustive()
            }
        }
    )*};
}
debug_request!(SealDetached, Seal, Open);

/// A seal: its session, nonce and associated data.
#[derive(Clone, Copy)]
pub(crate) struct SealOp<'a> {
    session: &'a AeadSession,
    aad: &'a [u8],
    nonce: Result<[u8; 12], u32>,
}

impl<'a, B: Buffer> Operation<'a, B> for SealOp<'a> {
    type Params = [u8; 12];
    type Ctx = dyn AeadContext;
    type EngineOut = (IoBuf, Tag);
    type JobOut = Tag;
    type Output = (B, Tag);
    type Caller = (&'a AeadSession, &'a [u8]);
    const NAME: &'static str = "seal";

    #[inline]
    fn alg(&self) -> Algorithm {
        self.session.alg.into()
    }

    #[inline]
    fn dir(&self) -> Direction {
        Direction::Encrypt
    }

    #[inline]
    fn slots(&self) -> &'a Arc<Slots> {
        &self.session.slots
    }

    fn contexts(&self) -> &'a Contexts<dyn AeadContext> {
        &self.session.contexts
    }

    #[inline]
    fn check(&mut self, buf: &mut B) -> Result<[u8; 12], Error> {
        self.session.check(self.nonce, buf.bytes_mut().len())
    }

    #[inline]
    fn run_cpu(&mut self, nonce: &[u8; 12], buf: B) -> Result<(B, Tag), RequestError<B>> {
        self.session.seal_cpu(nonce, self.aad, buf)
    }

    fn cpu_parts(&self, _: &[u8; 12], _len: usize, offered: usize) -> usize {
        gcm_threads(offered)
    }

    fn spawn_cpu(&self, nonce: [u8; 12], mut buf: B, threads: usize) -> CpuJob<Tag, B> {
        let (cpu, aad) = (self.session.cpu.clone(), self.aad.to_vec());
        tokio::task::spawn_blocking(move || {
            let tag = cpu.seal_in_place_detached_parallel(&nonce, &aad, buf.bytes_mut(), threads);
            (tag, buf)
        })
    }

    fn job_done(&mut self, _: &[u8; 12], tag: Tag, buf: B) -> (B, Tag) {
        (buf, tag)
    }

    fn caller(&self) -> Self::Caller {
        (self.session, self.aad)
    }

    fn open_context(
        (session, _): Self::Caller,
        backend: &'a SharedBackend,
    ) -> OpenContext<'a, dyn AeadContext> {
        backend.open_aead(session.alg, &session.key)
    }

    fn call(
        (_, aad): Self::Caller,
        ctx: &'a dyn AeadContext,
        nonce: [u8; 12],
        io: IoBuf,
    ) -> BoxedRequest<'a, (IoBuf, Tag)> {
        ctx.seal(nonce, aad, io)
    }

    fn engine_done(
        &mut self,
        _: &[u8; 12],
        done: Result<(IoBuf, Tag), Failed>,
    ) -> Result<Result<(B, Tag), RequestError<B>>, Failed> {
        done.map(|(io, tag)| Ok((B::from_io(io), tag)))
    }
}

/// An open: its session, nonce, associated data and tag (`None`: the
/// buffer's last 16 bytes).
#[derive(Clone, Copy)]
pub(crate) struct OpenOp<'a> {
    session: &'a AeadSession,
    aad: &'a [u8],
    nonce: Result<[u8; 12], u32>,
    tag: Option<&'a [u8]>,
}

impl<'a, B: Buffer> Operation<'a, B> for OpenOp<'a> {
    type Params = ([u8; 12], Tag);
    type Ctx = dyn AeadContext;
    type EngineOut = IoBuf;
    type JobOut = ();
    type Output = B;
    type Caller = (&'a AeadSession, &'a [u8]);
    const NAME: &'static str = "open";

    #[inline]
    fn alg(&self) -> Algorithm {
        self.session.alg.into()
    }

    #[inline]
    fn dir(&self) -> Direction {
        Direction::Decrypt
    }

    #[inline]
    fn slots(&self) -> &'a Arc<Slots> {
        &self.session.slots
    }

    fn contexts(&self) -> &'a Contexts<dyn AeadContext> {
        &self.session.contexts
    }

    /// Validates the request and takes the tag (off the buffer's end if it
    /// is not detached).
    fn check(&mut self, buf: &mut B) -> Result<([u8; 12], Tag), Error> {
        let alg = self.session.alg.into();
        // Nothing is changed in `buf` until every check has passed: on a
        // parameter error the caller gets it back as it was.
        let (tag, ct_len) = match self.tag {
            Some(t) => match <Tag>::try_from(t) {
                Ok(t) => (t, buf.bytes_mut().len()),
                Err(_) => {
                    return Err(Error::TagLength {
                        alg,
                        len: t.len(),
                        expected: 16,
                    });
                }
            },
            None => {
                let len = buf.bytes_mut().len();
                let Some(ct_len) = len.checked_sub(16) else {
                    return Err(Error::TagLength {
                        alg,
                        len,
                        expected: 16,
                    });
                };
                let mut t = [0u8; 16];
                t.copy_from_slice(&buf.bytes_mut()[ct_len..]);
                (t, ct_len)
            }
        };
        let nonce = self.session.check(self.nonce, ct_len)?;
        if ct_len < buf.bytes_mut().len() {
            buf.shorten(ct_len);
        }
        Ok((nonce, tag))
    }

    #[inline]
    fn run_cpu(&mut self, (nonce, tag): &([u8; 12], Tag), buf: B) -> Result<B, RequestError<B>> {
        self.session.open_cpu(nonce, self.aad, buf, tag)
    }

    fn cpu_parts(&self, _: &([u8; 12], Tag), _len: usize, offered: usize) -> usize {
        gcm_threads(offered)
    }

    fn spawn_cpu(
        &self,
        (nonce, tag): ([u8; 12], Tag),
        mut buf: B,
        threads: usize,
    ) -> CpuJob<(), B> {
        let (cpu, aad) = (self.session.cpu.clone(), self.aad.to_vec());
        tokio::task::spawn_blocking(move || {
            let r =
                cpu.open_in_place_detached_parallel(&nonce, &aad, buf.bytes_mut(), &tag, threads);
            (r, buf)
        })
    }

    fn job_done(&mut self, _: &([u8; 12], Tag), (): (), buf: B) -> B {
        buf
    }

    fn caller(&self) -> Self::Caller {
        (self.session, self.aad)
    }

    fn open_context(
        (session, _): Self::Caller,
        backend: &'a SharedBackend,
    ) -> OpenContext<'a, dyn AeadContext> {
        backend.open_aead(session.alg, &session.key)
    }

    fn call(
        (_, aad): Self::Caller,
        ctx: &'a dyn AeadContext,
        (nonce, tag): ([u8; 12], Tag),
        io: IoBuf,
    ) -> BoxedRequest<'a, IoBuf> {
        ctx.open(nonce, aad, io, tag)
    }

    fn engine_done(
        &mut self,
        _: &([u8; 12], Tag),
        done: Result<IoBuf, Failed>,
    ) -> Result<Result<B, RequestError<B>>, Failed> {
        match done {
            Ok(io) => Ok(Ok(B::from_io(io))),
            // The data's fault, not the engine's: no breaker, and a tag
            // that does not verify is a completed request too.
            Err(failed) if matches!(failed.error, BackendError::Authentication) => Ok(Err(
                RequestError::new(Error::Authentication, wiped(failed.buf)),
            )),
            Err(failed) => Err(failed),
        }
    }
}
