//! CRC sessions.

use core::fmt;
use core::future::Future;
use core::mem;
use core::pin::Pin;
use core::task::{Context, Poll};

use crypto_offload_fallback::{Crc, combine};
use tracing::Instrument;

use super::{
    BoxedRequest, Dispatch, EngineFuture, Engines, cpu_plan, inline_cpu, join_failed, spend_budget,
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

enum UpdateState<'a, B> {
    Start {
        session: &'a mut CrcSession,
        buf: B,
    },
    Engine {
        fut: EngineFuture<'a, (IoBuf, u64)>,
        pending: Pending<'a>,
    },
    Cpu {
        job: CrcJob<B>,
        pending: Pending<'a>,
    },
    Done,
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
        loop {
            match mem::replace(&mut this.state, UpdateState::Done) {
                UpdateState::Start { session, mut buf } => {
                    let len = buf.bytes_mut().len();
                    let budget = spend_budget(
                        cx,
                        session.offload.inner(),
                        0,
                        session.alg.into(),
                        Direction::Encrypt,
                        len,
                    );
                    if !budget {
                        this.state = UpdateState::Start { session, buf };
                        return Poll::Pending;
                    }
                    let CrcSession {
                        alg,
                        state,
                        engines,
                        offload,
                    } = session;
                    let alg = *alg;
                    let inner = offload.shared();
                    let (slot, predicted) = inner.choose(alg.into(), Direction::Encrypt, len);
                    let plan = if slot == 0 {
                        cpu_plan(inner, alg.into(), Direction::Encrypt, len)
                    } else {
                        None
                    };
                    if slot == 0 && plan.is_none() {
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
                    let pending = Pending {
                        alg,
                        crc: state,
                        len: len as u64,
                        dispatch: Dispatch::new(
                            inner,
                            slot,
                            alg.into(),
                            Direction::Encrypt,
                            len,
                            predicted,
                        )
                        .unobserved_if(plan.is_some_and(|p| p > 1) || engines.opens_first(slot)),
                    };
                    if slot == 0 {
                        let parts = plan.unwrap_or(1);
                        let job = tokio::task::spawn_blocking(move || {
                            (checksum_split(alg, buf.bytes_mut(), parts), buf)
                        });
                        this.state = UpdateState::Cpu { job, pending };
                    } else {
                        let backend = &inner.backends[slot - 1];
                        let span =
                            tracing::trace_span!("crc", backend = backend.name(), alg = %alg, len);
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
                        this.state = UpdateState::Engine {
                            fut: fut.instrument(span),
                            pending,
                        };
                    }
                }
                UpdateState::Cpu { mut job, pending } => {
                    return match Pin::new(&mut job).poll(cx) {
                        Poll::Pending => {
                            this.state = UpdateState::Cpu { job, pending };
                            Poll::Pending
                        }
                        Poll::Ready(Ok((piece, buf))) => {
                            pending.fold(piece);
                            Poll::Ready(Ok(buf))
                        }
                        Poll::Ready(Err(e)) => join_failed(e),
                    };
                }
                UpdateState::Engine { mut fut, pending } => {
                    return match Pin::new(&mut fut).poll(cx) {
                        Poll::Pending => {
                            this.state = UpdateState::Engine { fut, pending };
                            Poll::Pending
                        }
                        Poll::Ready(Ok((io, piece))) => {
                            pending.fold(piece);
                            Poll::Ready(Ok(B::from_io(io)))
                        }
                        Poll::Ready(Err(failed)) => {
                            let Pending { crc, dispatch, .. } = pending;
                            dispatch.failed(&failed.error);
                            let mut buf = B::from_io(failed.buf);
                            crc.update(buf.bytes_mut());
                            Poll::Ready(Ok(buf))
                        }
                    };
                }
                UpdateState::Done => panic!("CrcUpdate polled after it completed"),
            }
        }
    }
}
