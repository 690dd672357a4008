//! AEAD sessions (AES-GCM).

use core::fmt;
use core::future::Future;
use core::mem;
use core::pin::Pin;
use core::task::{Context, Poll};

use std::sync::Arc;

use crypto_offload_fallback::{GCM_MAX_LEN, Gcm};
use tracing::Instrument;
use zeroize::Zeroize;

use super::{
    BoxedRequest, Dispatch, EngineFuture, Engines, cpu_plan, inline_cpu, poll_cpu_job, session_key,
    spend_budget,
};
use crate::alg::{AeadAlg, Algorithm};
use crate::backend::{AeadContext, Failed};
use crate::buffer::{Buffer, IoBuf};
use crate::cost::Direction;
use crate::cpu::map_error;
use crate::error::{BackendError, Error, LengthRule, RequestError};
use crate::key::SecretKey;
use crate::offload::Offload;

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
    cpu: Arc<Gcm>,
    key: SecretKey,
    engines: Engines<dyn AeadContext>,
    offload: Offload,
}

impl fmt::Debug for AeadSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AeadSession")
            .field("alg", &self.alg)
            .field("engines", &self.engines.open_on(self.offload.inner()))
            .finish_non_exhaustive()
    }
}

impl AeadSession {
    pub(crate) async fn start(offload: Offload, alg: AeadAlg, key: &[u8]) -> Result<Self, Error> {
        let secret = session_key(alg.into(), alg.key_len(), key)?;
        let cpu = Arc::new(offload.inner().cpu.aead(alg, key)?);
        let key = secret;
        let engines = Engines::open(&offload, alg.into(), |b| {
            let key = key.clone();
            async move { b.open_aead(alg, &key).await }
        })
        .await?;
        Ok(AeadSession {
            alg,
            cpu,
            key,
            engines,
            offload,
        })
    }

    /// The algorithm.
    pub fn alg(&self) -> AeadAlg {
        self.alg
    }

    /// The backend a request of `len` bytes would go to now.
    pub fn backend_for(&self, dir: Direction, len: usize) -> &str {
        let inner = self.offload.inner();
        inner.slot_name(inner.choose(self.alg.into(), dir, len).0)
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
    /// the [`RequestError`] is then all zeros, shortened by the tag as a
    /// plaintext would be. [`Error::TagLength`] if `buf` is shorter than a
    /// tag; [`Error::IvLength`] as for `seal`.
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

impl AeadSession {
    fn seal_future<'a>(
        &'a self,
        slot: usize,
        nonce: [u8; 12],
        aad: &'a [u8],
        io: IoBuf,
    ) -> EngineFuture<'a, (IoBuf, Tag)> {
        let backend = &self.offload.inner().backends[slot - 1];
        let span =
            tracing::trace_span!("seal", backend = backend.name(), alg = %self.alg, len = io.len());
        let cell = self.engines.cell(slot);
        let fut: BoxedRequest<'a, (IoBuf, Tag)> = match cell.get() {
            Some(ctx) => ctx.seal(nonce, aad, io),
            None => Box::pin(async move {
                match cell
                    .get_or_try_init(|| backend.open_aead(self.alg, &self.key))
                    .await
                {
                    Ok(ctx) => ctx.seal(nonce, aad, io).await,
                    Err(e) => Err(Failed::new(e, io)),
                }
            }),
        };
        fut.instrument(span)
    }

    fn open_future<'a>(
        &'a self,
        slot: usize,
        nonce: [u8; 12],
        aad: &'a [u8],
        io: IoBuf,
        tag: Tag,
    ) -> EngineFuture<'a, IoBuf> {
        let backend = &self.offload.inner().backends[slot - 1];
        let span =
            tracing::trace_span!("open", backend = backend.name(), alg = %self.alg, len = io.len());
        let cell = self.engines.cell(slot);
        let fut: BoxedRequest<'a, IoBuf> = match cell.get() {
            Some(ctx) => ctx.open(nonce, aad, io, tag),
            None => Box::pin(async move {
                match cell
                    .get_or_try_init(|| backend.open_aead(self.alg, &self.key))
                    .await
                {
                    Ok(ctx) => ctx.open(nonce, aad, io, tag).await,
                    Err(e) => Err(Failed::new(e, io)),
                }
            }),
        };
        fut.instrument(span)
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

type SealJob<B> = tokio::task::JoinHandle<(Result<Tag, crypto_offload_fallback::Error>, B)>;

/// Only `Start` is on the inline CPU path; a request sent to an engine or
/// the blocking pool is boxed (one allocation beside that round trip), so
/// that the future stays small and cheap to move.
enum SealState<'a, B> {
    Start { nonce: &'a [u8], buf: B },
    Away(Box<SealAway<'a, B>>),
    Done,
}

/// A seal on an engine or the blocking pool.
struct SealAway<'a, B> {
    dispatch: Dispatch<'a>,
    /// For the replay on the CPU if the engine fails the request.
    nonce: [u8; 12],
    on: On<'a, SealJob<B>, (IoBuf, Tag)>,
}

/// Where a request sent away runs.
enum On<'a, J, T> {
    Engine(EngineFuture<'a, T>),
    Cpu(J),
}

impl<'a, B: Buffer> SealDetached<'a, B> {
    /// Polls a request sent away, keeping it while it is pending.
    fn poll_away(
        &mut self,
        mut away: Box<SealAway<'a, B>>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(B, Tag), RequestError<B>>> {
        let (session, aad) = (self.session, self.aad);
        let done = match &mut away.on {
            On::Cpu(job) => poll_cpu_job(job, cx, session.alg.into())
                .map(|r| Ok(r.map(|(tag, buf)| (buf, tag)))),
            On::Engine(fut) => match Pin::new(fut).poll(cx) {
                Poll::Pending => None,
                Poll::Ready(Ok((io, tag))) => Some(Ok(Ok((B::from_io(io), tag)))),
                Poll::Ready(Err(failed)) => Some(Err(failed)),
            },
        };
        let Some(done) = done else {
            self.state = SealState::Away(away);
            return Poll::Pending;
        };
        let SealAway {
            dispatch, nonce, ..
        } = *away;
        Poll::Ready(match done {
            Ok(Ok(sealed)) => {
                dispatch.completed();
                Ok(sealed)
            }
            Ok(Err(e)) => Err(e),
            Err(failed) => {
                dispatch.failed(&failed.error);
                session.seal_cpu(&nonce, aad, B::from_io(failed.buf))
            }
        })
    }
}

/// The threads a blocking-pool GCM job runs on: the plan's parts, where
/// splitting GCM pays (see `Gcm::PARALLEL_MIN_THREADS`), else one.
fn gcm_threads(plan: Option<usize>) -> usize {
    match plan {
        Some(parts) if parts >= Gcm::PARALLEL_MIN_THREADS => parts,
        _ => 1,
    }
}

/// Sends a seal to an engine (`slot` > 0) or the blocking pool.
#[cold]
#[inline(never)]
fn send_seal<'a, B: Buffer>(
    session: &'a AeadSession,
    aad: &'a [u8],
    nonce: [u8; 12],
    mut buf: B,
    slot: usize,
    threads: usize,
    predicted: Option<crate::select::Prediction>,
) -> Box<SealAway<'a, B>> {
    let inner = session.offload.shared();
    let len = buf.bytes_mut().len();
    let dispatch = Dispatch::new(
        inner,
        slot,
        session.alg.into(),
        Direction::Encrypt,
        len,
        predicted,
    )
    .unobserved_if(threads > 1 || session.engines.opens_first(slot));
    let on = if slot == 0 {
        let (cpu, aad) = (session.cpu.clone(), aad.to_vec());
        On::Cpu(tokio::task::spawn_blocking(move || {
            (
                cpu.seal_in_place_detached_parallel(&nonce, &aad, buf.bytes_mut(), threads),
                buf,
            )
        }))
    } else {
        On::Engine(session.seal_future(slot, nonce, aad, buf.into_io()))
    };
    Box::new(SealAway {
        dispatch,
        nonce,
        on,
    })
}

impl<B: Buffer> Future for SealDetached<'_, B> {
    type Output = Result<(B, Tag), RequestError<B>>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let (session, aad) = (this.session, this.aad);
        let (nonce, mut buf) = match mem::replace(&mut this.state, SealState::Done) {
            SealState::Start { nonce, buf } => (nonce, buf),
            SealState::Away(away) => return this.poll_away(away, cx),
            SealState::Done => panic!("SealDetached polled after it completed"),
        };
        let alg = session.alg.into();
        let len = buf.bytes_mut().len();
        let inner = session.offload.shared();
        if !spend_budget(cx, inner, 0, alg, Direction::Encrypt, len) {
            this.state = SealState::Start { nonce, buf };
            return Poll::Pending;
        }
        let nonce = match session.check(nonce, len) {
            Ok(n) => n,
            Err(e) => return Poll::Ready(Err(RequestError::new(e, buf))),
        };
        let (slot, predicted) = inner.decide(alg, Direction::Encrypt, len, len);
        let plan = if slot == 0 {
            cpu_plan(inner, alg, Direction::Encrypt, len)
        } else {
            None
        };
        if slot == 0 && plan.is_none() {
            return Poll::Ready(inline_cpu(
                inner,
                alg,
                Direction::Encrypt,
                len,
                predicted,
                || session.seal_cpu(&nonce, aad, buf),
            ));
        }
        let away = send_seal(session, aad, nonce, buf, slot, gcm_threads(plan), predicted);
        this.poll_away(away, cx)
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

type OpenJob<B> = tokio::task::JoinHandle<(Result<(), crypto_offload_fallback::Error>, B)>;

/// Only `Start` is on the inline CPU path; a request sent away is boxed.
enum OpenState<'a, B> {
    /// `tag`: detached, or `None` for the buffer's last 16 bytes.
    Start {
        nonce: &'a [u8],
        buf: B,
        tag: Option<&'a [u8]>,
    },
    Away(Box<OpenAway<'a, B>>),
    Done,
}

/// An open on an engine or the blocking pool.
struct OpenAway<'a, B> {
    dispatch: Dispatch<'a>,
    /// For the replay on the CPU if the engine fails the request.
    nonce: [u8; 12],
    tag: Tag,
    on: On<'a, OpenJob<B>, IoBuf>,
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
        // Nothing is changed in `buf` until every check has passed: on a
        // parameter error the caller gets it back as it was.
        let (tag, ct_len) = match tag {
            Some(t) => match <Tag>::try_from(t) {
                Ok(t) => (t, buf.bytes_mut().len()),
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
                (t, ct_len)
            }
        };
        let nonce = match session.check(nonce, ct_len) {
            Ok(nonce) => nonce,
            Err(e) => return Err(RequestError::new(e, buf)),
        };
        if ct_len < buf.bytes_mut().len() {
            buf.shorten(ct_len);
        }
        Ok((nonce, tag, buf))
    }
}

impl<'a, B: Buffer> Open<'a, B> {
    /// Polls a request sent away, keeping it while it is pending.
    fn poll_away(
        &mut self,
        mut away: Box<OpenAway<'a, B>>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<B, RequestError<B>>> {
        let (session, aad) = (self.session, self.aad);
        let done = match &mut away.on {
            On::Cpu(job) => {
                poll_cpu_job(job, cx, session.alg.into()).map(|r| Ok(r.map(|((), buf)| buf)))
            }
            On::Engine(fut) => match Pin::new(fut).poll(cx) {
                Poll::Pending => None,
                Poll::Ready(Ok(io)) => Some(Ok(Ok(B::from_io(io)))),
                // The data's fault, not the engine's: no breaker.
                Poll::Ready(Err(failed))
                    if matches!(failed.error, BackendError::Authentication) =>
                {
                    Some(Ok(Err(RequestError::new(
                        Error::Authentication,
                        wiped(failed.buf),
                    ))))
                }
                Poll::Ready(Err(failed)) => Some(Err(failed)),
            },
        };
        let Some(done) = done else {
            self.state = OpenState::Away(away);
            return Poll::Pending;
        };
        let OpenAway {
            dispatch,
            nonce,
            tag,
            ..
        } = *away;
        Poll::Ready(match done {
            // A tag that does not verify is a completed request too.
            Ok(result) => {
                dispatch.completed();
                result
            }
            Err(failed) => {
                dispatch.failed(&failed.error);
                session.open_cpu(&nonce, aad, B::from_io(failed.buf), &tag)
            }
        })
    }
}

/// Sends an open to an engine (`slot` > 0) or the blocking pool.
#[cold]
#[inline(never)]
fn send_open<'a, B: Buffer>(
    session: &'a AeadSession,
    aad: &'a [u8],
    (nonce, tag): ([u8; 12], Tag),
    mut buf: B,
    slot: usize,
    threads: usize,
    predicted: Option<crate::select::Prediction>,
) -> Box<OpenAway<'a, B>> {
    let inner = session.offload.shared();
    let len = buf.bytes_mut().len();
    let dispatch = Dispatch::new(
        inner,
        slot,
        session.alg.into(),
        Direction::Decrypt,
        len,
        predicted,
    )
    .unobserved_if(threads > 1 || session.engines.opens_first(slot));
    let on = if slot == 0 {
        let (cpu, aad) = (session.cpu.clone(), aad.to_vec());
        On::Cpu(tokio::task::spawn_blocking(move || {
            (
                cpu.open_in_place_detached_parallel(&nonce, &aad, buf.bytes_mut(), &tag, threads),
                buf,
            )
        }))
    } else {
        On::Engine(session.open_future(slot, nonce, aad, buf.into_io(), tag))
    };
    Box::new(OpenAway {
        dispatch,
        nonce,
        tag,
        on,
    })
}

impl<B: Buffer> Future for Open<'_, B> {
    type Output = Result<B, RequestError<B>>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let (session, aad) = (this.session, this.aad);
        let (nonce, mut buf, tag) = match mem::replace(&mut this.state, OpenState::Done) {
            OpenState::Start { nonce, buf, tag } => (nonce, buf, tag),
            OpenState::Away(away) => return this.poll_away(away, cx),
            OpenState::Done => panic!("Open polled after it completed"),
        };
        let alg = session.alg.into();
        let len = buf.bytes_mut().len();
        let inner = session.offload.shared();
        if !spend_budget(cx, inner, 0, alg, Direction::Decrypt, len) {
            this.state = OpenState::Start { nonce, buf, tag };
            return Poll::Pending;
        }
        let (nonce, tag, buf) = match Self::start(session, nonce, buf, tag) {
            Ok(v) => v,
            Err(e) => return Poll::Ready(Err(e)),
        };
        let mut buf = buf;
        let len = buf.bytes_mut().len();
        let (slot, predicted) = inner.decide(alg, Direction::Decrypt, len, len);
        let plan = if slot == 0 {
            cpu_plan(inner, alg, Direction::Decrypt, len)
        } else {
            None
        };
        if slot == 0 && plan.is_none() {
            return Poll::Ready(inline_cpu(
                inner,
                alg,
                Direction::Decrypt,
                len,
                predicted,
                || session.open_cpu(&nonce, aad, buf, &tag),
            ));
        }
        let away = send_open(
            session,
            aad,
            (nonce, tag),
            buf,
            slot,
            gcm_threads(plan),
            predicted,
        );
        this.poll_away(away, cx)
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
