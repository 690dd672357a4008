//! CRC sessions.

use core::fmt;
use core::future::Future;
use core::mem;
use core::pin::Pin;
use core::task::{Context, Poll};

use crypto_offload_fallback::{Crc, combine};
use tracing::Instrument;

use super::{
    BoxedRequest, Dispatch, EngineFuture, Engines, Prediction, cpu_plan, inline_cpu, join_failed,
    spend_budget,
};
use crate::alg::CrcAlg;
use crate::backend::{CrcContext, Failed};
use crate::buffer::{Buffer, IoBuf};
use crate::cost::Direction;
use crate::cpu::{checksum_split, map_error};
use crate::error::{Error, RequestError};
use crate::offload::Offload;

/// A streaming CRC.
///
/// Each update may run on a different backend: a backend computes the CRC of
/// its buffer alone and the session folds it into the running value with CRC
/// combination, so the result is the same wherever each piece ran.
///
/// ```
/// # futures::executor::block_on(async {
/// use crypto_offload::{CrcAlg, Offload};
///
/// let offload = Offload::builder().build()?;
/// let mut crc = offload.crc(CrcAlg::Crc32Iscsi).await?;
/// let buf = crc.update(b"1234".to_vec()).await?;   // the buffer comes back
/// crc.update_from_slice(b"56789");
/// assert_eq!(crc.finalize(), 0xe306_9283);
/// crc.verify(0xe306_9283)?;
/// # let _ = buf;
/// # Ok::<(), crypto_offload::Error>(()) });
/// ```
pub struct CrcSession {
    alg: CrcAlg,
    state: Crc,
    engines: Engines<dyn CrcContext>,
    offload: Offload,
}

impl fmt::Debug for CrcSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CrcSession")
            .field("alg", &self.alg)
            .field("len", &self.state.len())
            .field("engines", &self.engines.open_on(self.offload.inner()))
            .finish_non_exhaustive()
    }
}

impl CrcSession {
    pub(crate) async fn start(offload: Offload, alg: CrcAlg) -> Result<Self, Error> {
        let engines = Engines::open(
            &offload,
            alg.into(),
            |b| async move { b.open_crc(alg).await },
        )
        .await?;
        Ok(CrcSession {
            alg,
            state: Crc::new(alg),
            engines,
            offload,
        })
    }

    /// The algorithm.
    pub fn alg(&self) -> CrcAlg {
        self.alg
    }

    /// The backend an update of `len` bytes would go to now.
    pub fn backend_for(&self, len: usize) -> &str {
        let inner = self.offload.inner();
        inner.slot_name(inner.choose(self.alg.into(), Direction::Encrypt, len).0)
    }

    /// Feeds `buf` and hands it back.
    ///
    /// # Errors
    /// None in practice: a backend failure is replayed on the CPU. The
    /// `Result` keeps the shape of the other sessions.
    ///
    /// # Cancel safety
    /// If the future is dropped before it completes, the update may or may
    /// not have been applied: drop the session (or [`reset`](Self::reset)
    /// it) rather than continue the stream.
    #[inline]
    pub fn update<B: Buffer>(&mut self, buf: B) -> CrcUpdate<'_, B> {
        CrcUpdate {
            state: UpdateState::Start { session: self, buf },
        }
    }

    /// Feeds borrowed bytes, on the CPU, synchronously.
    pub fn update_from_slice(&mut self, data: &[u8]) {
        self.state.update(data);
    }

    /// The CRC of everything fed so far (the stream can go on).
    pub fn finalize(&self) -> u64 {
        self.state.finalize()
    }

    /// Bytes fed so far.
    pub fn len(&self) -> u64 {
        self.state.len()
    }

    /// Whether nothing has been fed.
    pub fn is_empty(&self) -> bool {
        self.state.is_empty()
    }

    /// Starts over.
    pub fn reset(&mut self) {
        self.state.reset();
    }

    /// Checks the CRC of everything fed so far.
    ///
    /// # Errors
    /// [`Error::ChecksumMismatch`] with both values.
    pub fn verify(&self, expected: u64) -> Result<(), Error> {
        self.state
            .verify(expected)
            .map_err(|e| map_error(self.alg.into(), e))
    }
}

/// The future of [`CrcSession::update`].
#[must_use = "futures do nothing unless awaited"]
pub struct CrcUpdate<'a, B> {
    state: UpdateState<'a, B>,
}

type CrcJob<B> = tokio::task::JoinHandle<(u64, B)>;

/// Where the running CRC lives while a piece is computed elsewhere.
struct Pending<'a> {
    alg: CrcAlg,
    crc: &'a mut Crc,
    len: u64,
    dispatch: Dispatch<'a>,
}

impl Pending<'_> {
    /// Folds the CRC of the piece into the running value.
    fn fold(self, piece: u64) {
        let value = combine(self.alg, self.crc.finalize(), piece, self.len);
        *self.crc = Crc::resume(self.alg, value, self.crc.len().saturating_add(self.len));
        self.dispatch.completed();
    }
}

/// The request's state. Only `Start` is on the inline CPU path; the states
/// of a request that was sent away are boxed (one allocation beside an
/// engine round trip or a blocking-pool hand-off), so that the future stays
/// small and cheap to move for the common case.
enum UpdateState<'a, B> {
    Start { session: &'a mut CrcSession, buf: B },
    Away(Box<Away<'a, B>>),
    Done,
}

/// A request on an engine or the blocking pool.
enum Away<'a, B> {
    Engine {
        fut: EngineFuture<'a, (IoBuf, u64)>,
        pending: Pending<'a>,
    },
    Cpu {
        job: CrcJob<B>,
        pending: Pending<'a>,
    },
}

impl<B> fmt::Debug for CrcUpdate<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CrcUpdate").finish_non_exhaustive()
    }
}

impl<B: Buffer> Future for CrcUpdate<'_, B> {
    type Output = Result<B, RequestError<B>>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let (session, mut buf) = match mem::replace(&mut this.state, UpdateState::Done) {
            UpdateState::Start { session, buf } => (session, buf),
            UpdateState::Away(away) => return this.poll_away(away, cx),
            UpdateState::Done => panic!("CrcUpdate polled after it completed"),
        };
        let len = buf.bytes_mut().len();
        let alg = session.alg;
        let inner = session.offload.shared();
        if !spend_budget(cx, inner, 0, alg.into(), Direction::Encrypt, len) {
            this.state = UpdateState::Start { session, buf };
            return Poll::Pending;
        }
        let (slot, predicted) = inner.decide(alg.into(), Direction::Encrypt, len, len);
        let plan = if slot == 0 {
            cpu_plan(inner, alg.into(), Direction::Encrypt, len)
        } else {
            None
        };
        if slot == 0 && plan.is_none() {
            let state = &mut session.state;
            inline_cpu(
                inner,
                alg.into(),
                Direction::Encrypt,
                len,
                predicted,
                || state.update(buf.bytes_mut()),
            );
            return Poll::Ready(Ok(buf));
        }
        let away = send_away(session, buf, slot, plan, predicted);
        this.poll_away(away, cx)
    }
}

impl<'a, B: Buffer> CrcUpdate<'a, B> {
    fn poll_away(
        &mut self,
        away: Box<Away<'a, B>>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<B, RequestError<B>>> {
        match away.poll(cx) {
            Ok(done) => Poll::Ready(done),
            Err(away) => {
                self.state = UpdateState::Away(away);
                Poll::Pending
            }
        }
    }
}

/// Sends a request to an engine (`slot` > 0) or the blocking pool.
#[cold]
#[inline(never)]
fn send_away<'a, B: Buffer>(
    session: &'a mut CrcSession,
    buf: B,
    slot: usize,
    plan: Option<usize>,
    predicted: Option<Prediction>,
) -> Box<Away<'a, B>> {
    let CrcSession {
        alg,
        state,
        engines,
        offload,
    } = session;
    let alg = *alg;
    let inner = offload.shared();
    let mut buf = buf;
    let len = buf.bytes_mut().len();
    let pending = Pending {
        alg,
        crc: state,
        len: len as u64,
        dispatch: Dispatch::new(inner, slot, alg.into(), Direction::Encrypt, len, predicted)
            .unobserved_if(plan.is_some_and(|p| p > 1) || engines.opens_first(slot)),
    };
    if slot == 0 {
        let parts = plan.unwrap_or(1);
        let job =
            tokio::task::spawn_blocking(move || (checksum_split(alg, buf.bytes_mut(), parts), buf));
        return Box::new(Away::Cpu { job, pending });
    }
    let backend = &inner.backends[slot - 1];
    let span = tracing::trace_span!("crc", backend = backend.name(), alg = %alg, len);
    let cell = engines.cell(slot);
    let io = buf.into_io();
    let fut: BoxedRequest<'_, (IoBuf, u64)> = match cell.get() {
        Some(ctx) => ctx.checksum(io),
        None => Box::pin(async move {
            match cell.get_or_try_init(|| backend.open_crc(alg)).await {
                Ok(ctx) => ctx.checksum(io).await,
                Err(e) => Err(Failed::new(e, io)),
            }
        }),
    };
    Box::new(Away::Engine {
        fut: fut.instrument(span),
        pending,
    })
}

/// What a request sent away came back with.
enum Outcome<B> {
    Cpu(Result<(u64, B), tokio::task::JoinError>),
    Engine(Result<(IoBuf, u64), Failed>),
}

impl<B: Buffer> Away<'_, B> {
    /// Polls the request: `Err(self)` while it is pending.
    fn poll(
        mut self: Box<Self>,
        cx: &mut Context<'_>,
    ) -> Result<Result<B, RequestError<B>>, Box<Self>> {
        let outcome = match &mut *self {
            Away::Cpu { job, .. } => Pin::new(job).poll(cx).map(Outcome::Cpu),
            Away::Engine { fut, .. } => Pin::new(fut).poll(cx).map(Outcome::Engine),
        };
        let Poll::Ready(outcome) = outcome else {
            return Err(self);
        };
        let (Away::Cpu { pending, .. } | Away::Engine { pending, .. }) = *self;
        Ok(match outcome {
            Outcome::Cpu(Ok((piece, buf))) => {
                pending.fold(piece);
                Ok(buf)
            }
            Outcome::Cpu(Err(e)) => join_failed(e),
            Outcome::Engine(Ok((io, piece))) => {
                pending.fold(piece);
                Ok(B::from_io(io))
            }
            Outcome::Engine(Err(failed)) => {
                let Pending { crc, dispatch, .. } = pending;
                dispatch.failed(&failed.error);
                let mut buf = B::from_io(failed.buf);
                crc.update(buf.bytes_mut());
                Ok(buf)
            }
        })
    }
}
