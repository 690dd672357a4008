//! CRC sessions.

use core::fmt;
use core::future::Future;
use core::mem;
use core::pin::Pin;
use core::task::{Context, Poll};

use crypto_offload_fallback::{Crc, combine};
use tracing::Instrument;

use super::{Engine, EngineFuture, open_engine, replaying};
use crate::alg::CrcAlg;
use crate::backend::CrcContext;
use crate::buffer::{Buffer, IoBuf};
use crate::cpu::map_error;
use crate::error::{Error, RequestError};
use crate::offload::Offload;
use crate::route::{Route, route};

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
/// let offload = Offload::discover().await?;
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
    engine: Option<Engine<dyn CrcContext>>,
    _offload: Offload,
}

impl fmt::Debug for CrcSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CrcSession")
            .field("alg", &self.alg)
            .field("len", &self.state.len())
            .field("engine", &self.engine.as_ref().map(|e| &*e.name))
            .finish_non_exhaustive()
    }
}

impl CrcSession {
    pub(crate) async fn start(offload: Offload, alg: CrcAlg) -> Result<Self, Error> {
        let engine = open_engine(
            &offload,
            alg.into(),
            |b| async move { b.open_crc(alg).await },
        )
        .await?;
        Ok(CrcSession {
            alg,
            state: Crc::new(alg),
            engine,
            _offload: offload,
        })
    }

    /// The algorithm.
    pub fn alg(&self) -> CrcAlg {
        self.alg
    }

    /// The backend updates go to (`"cpu"` unless one is pinned).
    pub fn backend(&self) -> &str {
        self.engine
            .as_ref()
            .map_or(crate::CpuBackend::NAME, |e| &e.name)
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

enum UpdateState<'a, B> {
    Start {
        session: &'a mut CrcSession,
        buf: B,
    },
    Engine {
        /// The session's fields the completion needs; the context itself is
        /// borrowed by `fut`.
        alg: CrcAlg,
        state: &'a mut Crc,
        name: &'a str,
        len: u64,
        fut: EngineFuture<'a, (IoBuf, u64)>,
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
                    let CrcSession {
                        alg, state, engine, ..
                    } = session;
                    let engine = match (route(engine.is_some()), engine.as_ref()) {
                        (Route::Engine, Some(engine)) => engine,
                        _ => {
                            state.update(buf.bytes_mut());
                            return Poll::Ready(Ok(buf));
                        }
                    };
                    let io = buf.into_io();
                    let len = io.len() as u64;
                    let span =
                        tracing::trace_span!("crc", backend = &*engine.name, alg = %alg, len);
                    this.state = UpdateState::Engine {
                        alg: *alg,
                        state,
                        name: &engine.name,
                        len,
                        fut: engine.ctx.checksum(io).instrument(span),
                    };
                }
                UpdateState::Engine {
                    alg,
                    state,
                    name,
                    len,
                    mut fut,
                } => {
                    return match Pin::new(&mut fut).poll(cx) {
                        Poll::Pending => {
                            this.state = UpdateState::Engine {
                                alg,
                                state,
                                name,
                                len,
                                fut,
                            };
                            Poll::Pending
                        }
                        Poll::Ready(Ok((io, piece))) => {
                            let value = combine(alg, state.finalize(), piece, len);
                            *state = Crc::resume(alg, value, state.len() + len);
                            Poll::Ready(Ok(B::from_io(io)))
                        }
                        Poll::Ready(Err(failed)) => {
                            replaying(name, &failed.error);
                            let mut buf = B::from_io(failed.buf);
                            state.update(buf.bytes_mut());
                            Poll::Ready(Ok(buf))
                        }
                    };
                }
                UpdateState::Done => panic!("CrcUpdate polled after it completed"),
            }
        }
    }
}
