//! Errors: what the caller did wrong, what a backend reported, and the
//! deliberately opaque authentication failure.

use core::fmt;

pub use crypto_offload_fallback::LengthRule;

use crate::alg::Algorithm;

/// The error of a session or of `Offload` itself.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The key has a length the algorithm does not take.
    #[error("{alg}: a {len}-byte key is not valid ({expected} bytes expected)")]
    KeyLength {
        /// The algorithm.
        alg: Algorithm,
        /// The length given.
        len: usize,
        /// The length expected.
        expected: usize,
    },
    /// An XTS key whose two halves are equal (IEEE 1619-2018 §5.1, NIST SP
    /// 800-38E).
    #[error("{alg}: the two halves of the XTS key are equal")]
    WeakKey {
        /// The algorithm.
        alg: Algorithm,
    },
    /// The IV, counter block, tweak or nonce has the wrong length.
    #[error("{alg}: a {len}-byte IV/nonce is not valid ({expected} bytes expected)")]
    IvLength {
        /// The algorithm.
        alg: Algorithm,
        /// The length given.
        len: usize,
        /// The length expected.
        expected: usize,
    },
    /// A detached AEAD tag of the wrong length, or a sealed message shorter
    /// than its tag.
    #[error("{alg}: a {len}-byte tag is not valid ({expected} bytes expected)")]
    TagLength {
        /// The algorithm.
        alg: Algorithm,
        /// The length given (for `open`, the whole message's).
        len: usize,
        /// The length expected.
        expected: usize,
    },
    /// The data has a length the mode cannot take.
    #[error("{alg}: {len} bytes of data is not valid ({rule})")]
    DataLength {
        /// The algorithm.
        alg: Algorithm,
        /// The length given.
        len: usize,
        /// The rule broken.
        rule: LengthRule,
    },
    /// The AEAD tag did not verify. No plaintext is released: the buffer
    /// handed back is all zeros. Nothing else is said, on purpose.
    #[error("authentication failed")]
    Authentication,
    /// A CRC did not match.
    #[error("checksum mismatch: expected {expected:#x}, computed {computed:#x}")]
    ChecksumMismatch {
        /// The expected value.
        expected: u64,
        /// The computed value.
        computed: u64,
    },
    /// No backend of this `Offload` can run the algorithm (only possible with
    /// a pinned backend: the CPU runs everything).
    #[error("{alg} is not supported by backend {backend:?}")]
    Unsupported {
        /// The algorithm.
        alg: Algorithm,
        /// The backend that was asked.
        backend: String,
    },
    /// The builder named a backend that is not registered.
    #[error("no backend named {0:?}")]
    UnknownBackend(String),
    /// A backend failed and the request could not be completed elsewhere.
    #[error("backend {backend:?} failed")]
    Backend {
        /// The backend's name.
        backend: String,
        /// What it reported.
        #[source]
        source: BackendError,
    },
}

/// What a backend reports when it cannot complete a request or open a
/// context. Backends keep the OS error (and so the errno) where there is one.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// A system call failed.
    #[error("{op} failed")]
    Io {
        /// The operation, e.g. `"bind"` or `"VFIO_DEVICE_RESET"`.
        op: &'static str,
        /// The OS error (with its errno).
        #[source]
        source: std::io::Error,
    },
    /// The device or engine went away.
    #[error("the device is gone")]
    DeviceGone,
    /// The request did not complete in time.
    #[error("the request timed out")]
    Timeout,
    /// The backend does not run this algorithm, key size or request shape.
    /// From a request, it is replayed on the CPU without opening the
    /// backend's circuit breaker (the engine is fine; the request is not for
    /// it).
    #[error("not supported by this backend: {0}")]
    Unsupported(String),
    /// The tag did not verify (AEAD open): the backend returned no plaintext.
    #[error("authentication failed")]
    Authentication,
    /// Anything else, with its cause.
    #[error(transparent)]
    Other(Box<dyn std::error::Error + Send + Sync + 'static>),
}

impl BackendError {
    /// The errno behind this error, if it came from a system call.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            BackendError::Io { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

/// A failed request: the error and the caller's buffer, handed back.
///
/// On a parameter error the buffer is untouched; after a failed AEAD `open`
/// it is all zeros. It converts into [`Error`] (dropping the buffer), so `?`
/// works in functions that return `Result<_, crypto_offload::Error>`.
///
/// Boxed, so that a request's `Result` is no bigger than the buffer itself:
/// the success path moves 24 bytes, not 80 (the box is only allocated when a
/// request fails).
pub struct RequestError<B>(Box<(Error, B)>);

impl<B> RequestError<B> {
    pub(crate) fn new(error: Error, buf: B) -> Self {
        RequestError(Box::new((error, buf)))
    }

    /// What went wrong.
    pub fn error(&self) -> &Error {
        &self.0.0
    }

    /// The buffer, to reuse or to retry with.
    pub fn into_buffer(self) -> B {
        self.0.1
    }

    /// Both parts.
    pub fn into_parts(self) -> (Error, B) {
        *self.0
    }
}

impl<B> From<RequestError<B>> for Error {
    fn from(e: RequestError<B>) -> Error {
        e.0.0
    }
}

impl Error {
    /// The [`std::io::ErrorKind`] this error maps to in `io::Result` code:
    /// `InvalidInput` for what the caller passed (lengths, a weak key, an
    /// unknown backend name), `InvalidData` for data that does not verify
    /// (a tag, a CRC), `Unsupported`, and for a backend's failure
    /// `TimedOut`, `NotConnected` (a device that is gone) or `Other`. Never
    /// the OS error's own kind: an `EINTR` or `EAGAIN` inside a backend is
    /// not the caller's to retry (`write_all` loops on `Interrupted`), nor
    /// a driver's `EINVAL` the caller's bad input. The errno stays in the
    /// error's source chain.
    pub fn io_kind(&self) -> std::io::ErrorKind {
        use std::io::ErrorKind as K;
        match self {
            Error::KeyLength { .. }
            | Error::WeakKey { .. }
            | Error::IvLength { .. }
            | Error::TagLength { .. }
            | Error::DataLength { .. }
            | Error::UnknownBackend(_) => K::InvalidInput,
            Error::Authentication | Error::ChecksumMismatch { .. } => K::InvalidData,
            Error::Unsupported { .. } => K::Unsupported,
            Error::Backend { source, .. } => match source {
                BackendError::Io { source, .. } if source.kind() == K::TimedOut => K::TimedOut,
                BackendError::Io { .. } => K::Other,
                BackendError::DeviceGone => K::NotConnected,
                BackendError::Timeout => K::TimedOut,
                BackendError::Unsupported(_) => K::Unsupported,
                BackendError::Authentication => K::InvalidData,
                BackendError::Other(_) => K::Other,
            },
        }
    }
}

/// For servers that live in `io::Result`: the kind from
/// [`Error::io_kind`], and the error itself inside (reach it with
/// [`std::io::Error::get_ref`] and `downcast_ref::<Error>()`).
impl From<Error> for std::io::Error {
    fn from(e: Error) -> std::io::Error {
        std::io::Error::new(e.io_kind(), e)
    }
}

/// A failed request as an `io::Error` (the buffer is dropped; keep it with
/// [`RequestError::into_parts`] first if you want it back).
impl<B> From<RequestError<B>> for std::io::Error {
    fn from(e: RequestError<B>) -> std::io::Error {
        Error::from(e).into()
    }
}

// The buffer may hold plaintext: print only that there is one.
impl<B> fmt::Debug for RequestError<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestError")
            .field("error", self.error())
            .finish_non_exhaustive()
    }
}

impl<B> fmt::Display for RequestError<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self.error(), f)
    }
}

impl<B> std::error::Error for RequestError<B> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(self.error())
    }
}
