//! Cipher sessions (AES-CBC, -CTR, -XTS).

use core::fmt;
use core::future::Future;
use core::mem;
use core::pin::Pin;
use core::task::{Context, Poll};
use std::sync::Arc;

use tracing::Instrument;

use super::{
    BoxedRequest, Dispatch, EngineFuture, Engines, cpu_plan, inline_cpu, poll_cpu_job, session_key,
    spend_budget,
};
use crate::alg::{Algorithm, CipherAlg, CipherMode};
use crate::backend::{CipherContext, CipherParams, Failed};
use crate::buffer::{Buffer, IoBuf};
use crate::cost::Direction;
use crate::cpu::{CpuCipher, map_error};
use crate::error::{Error, LengthRule, RequestError};
use crate::key::SecretKey;
use crate::offload::Offload;

/// A keyed cipher session.
///
/// Requests take `&self`: one session can have many requests in flight, and
/// can be shared between tasks (`CipherSession` is `Send + Sync`). Dropping
/// the session releases its backend contexts (and, with hardware backends,
/// its power references).
///
/// ```
/// # futures::executor::block_on(async {
/// use crypto_offload::{CipherAlg, Offload};
///
/// let offload = Offload::builder().build()?;
/// let key: Vec<u8> = (0..64).collect();
/// let xts = offload.cipher(CipherAlg::Aes256Xts, &key).await?.with_data_unit(512)?;
/// let sector_7 = 7u128.to_le_bytes();
/// let ct = xts.encrypt(&sector_7, vec![0u8; 4096]).await?;   // sectors 7..15
/// let pt = xts.decrypt(&sector_7, ct).await?;
/// assert_eq!(pt, vec![0u8; 4096]);
/// # Ok::<(), crypto_offload::Error>(()) });
/// ```
pub struct CipherSession {
    alg: CipherAlg,
    data_unit: Option<usize>,
    cpu: Arc<CpuCipher>,
    key: SecretKey,
    engines: Engines<dyn CipherContext>,
    offload: Offload,
}

impl fmt::Debug for CipherSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CipherSession")
            .field("alg", &self.alg)
            .field("data_unit", &self.data_unit)
            .field("engines", &self.engines.open_on(self.offload.inner()))
            .finish_non_exhaustive()
    }
}

impl CipherSession {
    pub(crate) async fn start(offload: Offload, alg: CipherAlg, key: &[u8]) -> Result<Self, Error> {
        let secret = session_key(alg.into(), alg.key_len(), key)?;
        let cpu = Arc::new(offload.inner().cpu.cipher(alg, key)?);
        let key = secret;
        let engines = Engines::open(&offload, alg.into(), |b| {
            let key = key.clone();
            async move { b.open_cipher(alg, &key).await }
        })
        .await?;
        Ok(CipherSession {
            alg,
            data_unit: None,
            cpu,
            key,
            engines,
            offload,
        })
    }

    /// The algorithm.
    pub fn alg(&self) -> CipherAlg {
        self.alg
    }

    /// The backend a request of `len` bytes would go to now.
    pub fn backend_for(&self, dir: Direction, len: usize) -> &str {
        let inner = self.offload.inner();
        let unit = self.data_unit.unwrap_or(len);
        inner.slot_name(inner.choose_unit(self.alg.into(), dir, len, unit).0)
    }

    /// XTS: treats each request as consecutive data units of `len` bytes
    /// (512 or 4096 for disks), unit `i` taking tweak `iv + i` — one request
    /// then covers many sectors. Without it a request is one data unit.
    ///
    /// # Errors
    /// [`Error::DataLength`] if `len` < 16, or if the session is not XTS.
    pub fn with_data_unit(mut self, len: usize) -> Result<Self, Error> {
        if self.alg.mode() != CipherMode::Xts || len < 16 {
            return Err(Error::DataLength {
                alg: self.alg.into(),
                len,
                rule: LengthRule::DataUnitTooSmall,
            });
        }
        self.data_unit = Some(len);
        Ok(self)
    }

    /// The XTS data-unit length set with [`with_data_unit`](Self::with_data_unit).
    pub fn data_unit(&self) -> Option<usize> {
        self.data_unit
    }

    /// Encrypts `buf` in place and returns it.
    ///
    /// `iv` is the CBC IV, the CTR initial counter block (the whole 128 bits
    /// count, big-endian, wrapping), or the XTS tweak of the first data unit
    /// (the sector number, 128-bit little-endian); always 16 bytes.
    ///
    /// # Errors
    /// [`Error::IvLength`]; [`Error::DataLength`] for CBC data that is not
    /// whole blocks, XTS data under 16 bytes or not whole data units. The
    /// buffer comes back untouched in the [`RequestError`].
    ///
    /// # Cancel safety
    /// Dropping the future is safe at any point: on the CPU the work is done
    /// within one poll (or on the blocking pool, which finishes it); an
    /// engine keeps the buffer until it is done with it. The buffer is then
    /// lost to the caller.
    #[inline]
    pub fn encrypt<'a, B: Buffer>(&'a self, iv: &'a [u8], buf: B) -> CipherRequest<'a, B> {
        CipherRequest::new(self, true, iv, buf)
    }

    /// Decrypts `buf` in place and returns it. See [`encrypt`](Self::encrypt).
    ///
    /// # Errors
    /// As for [`encrypt`](Self::encrypt).
    ///
    /// # Cancel safety
    /// As for [`encrypt`](Self::encrypt).
    #[inline]
    pub fn decrypt<'a, B: Buffer>(&'a self, iv: &'a [u8], buf: B) -> CipherRequest<'a, B> {
        CipherRequest::new(self, false, iv, buf)
    }

    fn params(&self, iv: &[u8], len: usize) -> Result<CipherParams, Error> {
        let alg: Algorithm = self.alg.into();
        let Ok(iv) = <[u8; 16]>::try_from(iv) else {
            return Err(Error::IvLength {
                alg,
                len: iv.len(),
                expected: 16,
            });
        };
        let rule = match self.alg.mode() {
            CipherMode::Cbc if !len.is_multiple_of(16) => Some(LengthRule::MultipleOfBlock),
            CipherMode::Xts if len < 16 => Some(LengthRule::AtLeastOneBlock),
            CipherMode::Xts => match self.data_unit {
                Some(u) if !len.is_multiple_of(u) => Some(LengthRule::MultipleOfDataUnit(u)),
                _ => None,
            },
            _ => None,
        };
        if let Some(rule) = rule {
            return Err(Error::DataLength { alg, len, rule });
        }
        Ok(CipherParams::new(iv, self.data_unit.unwrap_or(len)))
    }

    #[inline]
    fn run_cpu<B: Buffer>(
        &self,
        encrypt: bool,
        params: &CipherParams,
        mut buf: B,
    ) -> Result<B, RequestError<B>> {
        match self.cpu.run(encrypt, params, buf.bytes_mut()) {
            Ok(()) => Ok(buf),
            Err(e) => Err(RequestError::new(map_error(self.alg.into(), e), buf)),
        }
    }

    /// The engine future for `slot`: the request on its context, opening the
    /// context first if this is the session's first request there.
    fn engine_future<'a>(
        &'a self,
        slot: usize,
        encrypt: bool,
        params: CipherParams,
        io: IoBuf,
    ) -> EngineFuture<'a, IoBuf> {
        let inner = self.offload.inner();
        let backend = &inner.backends[slot - 1];
        let span = tracing::trace_span!("cipher", backend = backend.name(), alg = %self.alg, len = io.len(), encrypt);
        let cell = self.engines.cell(slot);
        let fut: BoxedRequest<'a, IoBuf> = match cell.get() {
            Some(ctx) if encrypt => ctx.encrypt(params, io),
            Some(ctx) => ctx.decrypt(params, io),
            None => Box::pin(async move {
                let ctx = match cell
                    .get_or_try_init(|| backend.open_cipher(self.alg, &self.key))
                    .await
                {
                    Ok(ctx) => ctx,
                    Err(e) => return Err(Failed::new(e, io)),
                };
                if encrypt {
                    ctx.encrypt(params, io).await
                } else {
                    ctx.decrypt(params, io).await
                }
            }),
        };
        fut.instrument(span)
    }
}

/// The future of a [`CipherSession::encrypt`] or
/// [`decrypt`](CipherSession::decrypt) request.
///
/// A named, small future (not an `async fn`'s state machine): on the inline
/// CPU path it does the work in its first poll and moves only the buffer.
#[must_use = "futures do nothing unless awaited"]
pub struct CipherRequest<'a, B> {
    session: &'a CipherSession,
    encrypt: bool,
    state: State<'a, B>,
}

type CpuJob<B> = tokio::task::JoinHandle<(Result<(), crypto_offload_fallback::Error>, B)>;

/// The request's state. Only `Start` is on the inline CPU path; a request
/// sent to an engine or the blocking pool is boxed (one allocation beside
/// that round trip), so that the future stays small and cheap to move.
enum State<'a, B> {
    Start { iv: &'a [u8], buf: B },
    Away(Box<Away<'a, B>>),
    Done,
}

/// A request on an engine or the blocking pool.
struct Away<'a, B> {
    dispatch: Dispatch<'a>,
    /// For the replay on the CPU if the engine fails the request.
    params: CipherParams,
    on: On<'a, B>,
}

enum On<'a, B> {
    Engine(EngineFuture<'a, IoBuf>),
    Cpu(CpuJob<B>),
}

impl<'a, B: Buffer> CipherRequest<'a, B> {
    fn new(session: &'a CipherSession, encrypt: bool, iv: &'a [u8], buf: B) -> Self {
        CipherRequest {
            session,
            encrypt,
            state: State::Start { iv, buf },
        }
    }

    /// Polls a request sent away, keeping it while it is pending.
    fn poll_away(
        &mut self,
        mut away: Box<Away<'a, B>>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<B, RequestError<B>>> {
        let session = self.session;
        let done = match &mut away.on {
            On::Cpu(job) => {
                poll_cpu_job(job, cx, session.alg.into()).map(|r| Ok(r.map(|((), buf)| buf)))
            }
            On::Engine(fut) => match Pin::new(fut).poll(cx) {
                Poll::Pending => None,
                Poll::Ready(Ok(io)) => Some(Ok(Ok(B::from_io(io)))),
                Poll::Ready(Err(failed)) => Some(Err(failed)),
            },
        };
        let Some(done) = done else {
            self.state = State::Away(away);
            return Poll::Pending;
        };
        let Away {
            dispatch, params, ..
        } = *away;
        Poll::Ready(match done {
            Ok(result) => {
                dispatch.completed();
                result
            }
            Err(failed) => {
                dispatch.failed(&failed.error);
                session.run_cpu(self.encrypt, &params, B::from_io(failed.buf))
            }
        })
    }
}

/// Sends a request to an engine (`slot` > 0) or the blocking pool.
#[cold]
#[inline(never)]
fn send_away<'a, B: Buffer>(
    session: &'a CipherSession,
    encrypt: bool,
    params: CipherParams,
    mut buf: B,
    slot: usize,
    plan: Option<usize>,
    predicted: Option<crate::select::Prediction>,
) -> Box<Away<'a, B>> {
    let inner = session.offload.shared();
    let dir = if encrypt {
        Direction::Encrypt
    } else {
        Direction::Decrypt
    };
    let len = buf.bytes_mut().len();
    // A job split over cores is not one core's service time; one that runs
    // whole (CBC encryption, a single XTS unit) is, however many parts the
    // plan offered.
    let split =
        plan.is_some_and(|p| p > 1) && session.cpu.split_step(encrypt, &params, len).is_some();
    let dispatch = Dispatch::new(inner, slot, session.alg.into(), dir, len, predicted)
        .unobserved_if(split || session.engines.opens_first(slot));
    let on = if slot == 0 {
        let cpu = session.cpu.clone();
        let parts = plan.unwrap_or(1);
        On::Cpu(tokio::task::spawn_blocking(move || {
            let r = cpu.run_split(encrypt, &params, buf.bytes_mut(), parts);
            (r, buf)
        }))
    } else {
        On::Engine(session.engine_future(slot, encrypt, params, buf.into_io()))
    };
    Box::new(Away {
        dispatch,
        params,
        on,
    })
}

impl<B> fmt::Debug for CipherRequest<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CipherRequest")
            .field("alg", &self.session.alg)
            .field("encrypt", &self.encrypt)
            .finish_non_exhaustive()
    }
}

impl<B: Buffer> Future for CipherRequest<'_, B> {
    type Output = Result<B, RequestError<B>>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let (session, encrypt) = (this.session, this.encrypt);
        let (iv, mut buf) = match mem::replace(&mut this.state, State::Done) {
            State::Start { iv, buf } => (iv, buf),
            State::Away(away) => return this.poll_away(away, cx),
            State::Done => panic!("CipherRequest polled after it completed"),
        };
        let dir = if encrypt {
            Direction::Encrypt
        } else {
            Direction::Decrypt
        };
        let alg = session.alg.into();
        let len = buf.bytes_mut().len();
        let inner = session.offload.shared();
        if !spend_budget(cx, inner, 0, alg, dir, len) {
            this.state = State::Start { iv, buf };
            return Poll::Pending;
        }
        let params = match session.params(iv, len) {
            Ok(p) => p,
            Err(e) => return Poll::Ready(Err(RequestError::new(e, buf))),
        };
        // XTS over several data units: params.data_unit (the whole request
        // otherwise).
        let (slot, predicted) = inner.decide(alg, dir, len, params.data_unit);
        let plan = if slot == 0 {
            cpu_plan(inner, alg, dir, len)
        } else {
            None
        };
        if slot == 0 && plan.is_none() {
            return Poll::Ready(inline_cpu(inner, alg, dir, len, predicted, || {
                session.run_cpu(encrypt, &params, buf)
            }));
        }
        let away = send_away(session, encrypt, params, buf, slot, plan, predicted);
        this.poll_away(away, cx)
    }
}
