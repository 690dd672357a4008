//! Sessions: keyed state for one algorithm, with a context on each backend
//! the session may run on.
//!
//! Where a request runs is decided in [`route`](crate::route); a request a
//! backend fails is replayed on the CPU with the same (unchanged) buffer.

mod aead;
mod cipher;
mod crc;

use std::sync::Arc;

use tracing::Instrument;

pub use aead::{AeadSession, Open, Seal, SealDetached, Tag};
pub use cipher::{CipherRequest, CipherSession};
pub use crc::{CrcSession, CrcUpdate};

use crate::alg::Algorithm;
use crate::backend::SharedBackend;
use crate::error::{BackendError, Error};
use crate::offload::Offload;

/// A backend request in flight, inside its tracing span.
pub(crate) type EngineFuture<'a, T> = tracing::instrument::Instrumented<
    core::pin::Pin<
        Box<dyn core::future::Future<Output = Result<T, crate::backend::Failed>> + Send + 'a>,
    >,
>;

/// A session's context on a non-CPU backend.
pub(crate) struct Engine<C: ?Sized> {
    pub(crate) name: Arc<str>,
    pub(crate) ctx: Box<C>,
}

/// Opens a new session's context on its pinned backend, if it has one:
/// `open` is the backend's `open_cipher`/`open_aead`/`open_crc` call.
pub(crate) async fn open_engine<C, Fut>(
    offload: &Offload,
    alg: Algorithm,
    open: impl FnOnce(SharedBackend) -> Fut,
) -> Result<Option<Engine<C>>, Error>
where
    C: ?Sized,
    Fut: core::future::Future<Output = Result<Box<C>, BackendError>>,
{
    let Some(backend) = engine_for(offload, alg)? else {
        return Ok(None);
    };
    let span = tracing::debug_span!("open", backend = backend.name(), alg = %alg);
    let ctx = open(backend.clone())
        .instrument(span)
        .await
        .map_err(|e| open_failed(backend, e))?;
    Ok(Some(Engine {
        name: backend.name().into(),
        ctx,
    }))
}

/// The backend a new session of `alg` opens a context on, if not the CPU.
fn engine_for(offload: &Offload, alg: Algorithm) -> Result<Option<&SharedBackend>, Error> {
    let inner = offload.inner();
    let Some(i) = inner.pinned else {
        return Ok(None);
    };
    let backend = &inner.backends[i];
    if !backend.supports(alg) {
        return Err(Error::Unsupported {
            alg,
            backend: backend.name().to_owned(),
        });
    }
    Ok(Some(backend))
}

fn open_failed(backend: &SharedBackend, source: BackendError) -> Error {
    Error::Backend {
        backend: backend.name().to_owned(),
        source,
    }
}

/// Records that `backend` failed a request that is being replayed on the CPU.
pub(crate) fn replaying(backend: &str, error: &BackendError) {
    tracing::warn!(backend, error = %error, "backend failed a request; completing it on the CPU");
}
