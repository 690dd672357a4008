//! CRC sessions.

use core::fmt;

use crypto_offload_fallback::{Crc, combine};
use tracing::Instrument;

use super::{Engine, engine_for, open_failed, replaying};
use crate::alg::CrcAlg;
use crate::backend::CrcContext;
use crate::buffer::Buffer;
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
        let engine = match engine_for(&offload, alg.into())? {
            None => None,
            Some(backend) => {
                let span = tracing::debug_span!("open_crc", backend = backend.name(), alg = %alg);
                let ctx = backend
                    .open_crc(alg)
                    .instrument(span)
                    .await
                    .map_err(|e| open_failed(backend, e))?;
                Some(Engine {
                    name: backend.name().into(),
                    ctx,
                })
            }
        };
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
    pub async fn update<B: Buffer>(&mut self, mut buf: B) -> Result<B, RequestError<B>> {
        if let (Route::Engine, Some(engine)) = (route(self.engine.is_some()), &self.engine) {
            let io = buf.into_io();
            let len = io.len() as u64;
            let span = tracing::trace_span!("crc", backend = &*engine.name, alg = %self.alg, len);
            match engine.ctx.checksum(io).instrument(span).await {
                Ok((io, piece)) => {
                    let value = combine(self.alg, self.state.finalize(), piece, len);
                    self.state = Crc::resume(self.alg, value, self.state.len() + len);
                    return Ok(B::from_io(io));
                }
                Err(failed) => {
                    replaying(&engine.name, &failed.error);
                    buf = B::from_io(failed.buf);
                }
            }
        }
        self.state.update(buf.bytes_mut());
        Ok(buf)
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
        let computed = self.finalize();
        if computed == expected {
            Ok(())
        } else {
            Err(Error::ChecksumMismatch { expected, computed })
        }
    }
}
