//! Errors, keeping the errno of the system call that failed.

use nix::errno::Errno;

/// What an AF_ALG operation reports.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// AF_ALG cannot be used here: the kernel has no AF_ALG
    /// (`EAFNOSUPPORT`, also what `af_alg_restrict = 2` gives), the
    /// algorithm or driver does not exist or is not allowed (`ENOENT`, also
    /// what the `af_alg_restrict = 1` allowlist gives), or the process may
    /// not use it (`EPERM`, `EACCES`). Not a request error: the algorithm is
    /// simply not on offer.
    #[error("AF_ALG {what} is unavailable: {source}")]
    Unavailable {
        /// The algorithm or driver asked for, or `"sockets"`.
        what: String,
        /// The OS error (with its errno).
        #[source]
        source: std::io::Error,
    },
    /// The kernel rejected a parameter (`EINVAL`): a key, IV or length the
    /// transform does not take.
    #[error("invalid parameter for {op}: {source}")]
    InvalidParameter {
        /// The operation, e.g. `"ALG_SET_KEY"`.
        op: &'static str,
        /// The OS error (`EINVAL`).
        #[source]
        source: std::io::Error,
    },
    /// A parameter this binding checks before the kernel sees it.
    #[error("invalid {what}: {detail}")]
    Invalid {
        /// Which parameter.
        what: &'static str,
        /// Why.
        detail: String,
    },
    /// The AEAD tag did not verify (`EBADMSG`); no plaintext was released
    /// (the buffer handed back is zeroed).
    #[error("authentication failed")]
    Authentication,
    /// The request is larger than one kernel operation can take here (the
    /// socket's send buffer), and the mode cannot be split.
    #[error("request of {len} bytes exceeds this transform's {max}-byte limit")]
    TooLarge {
        /// The request's length, in bytes.
        len: usize,
        /// The most one operation takes.
        max: usize,
    },
    /// Any other failed system call.
    #[error("{op} failed: {source}")]
    Io {
        /// The operation, e.g. `"sendmsg"`.
        op: &'static str,
        /// The OS error (with its errno).
        #[source]
        source: std::io::Error,
    },
    /// The kernel did not complete the request within its timeout (see
    /// [`RequestTimeout`](crate::RequestTimeout)): the engine may be hung.
    /// The buffer handed back is a copy of the input taken before the
    /// request; the original stays with the kernel.
    #[error("the request did not complete within {0:?}")]
    Timeout(std::time::Duration),
    /// The thread running the request failed (it panicked).
    #[error("the request's worker thread failed")]
    Worker,
}

impl Error {
    /// The errno behind this error, if a system call failed.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            Error::Unavailable { source, .. }
            | Error::InvalidParameter { source, .. }
            | Error::Io { source, .. } => source.raw_os_error(),
            Error::Authentication => Some(Errno::EBADMSG as i32),
            Error::Timeout(_) => Some(Errno::ETIMEDOUT as i32),
            _ => None,
        }
    }

    /// Whether this says the algorithm is not on offer here (as opposed to a
    /// request that failed).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Error::Unavailable { .. })
    }

    /// Maps a failed system call: the errnos with a meaning of their own
    /// become their variants.
    pub(crate) fn sys(op: &'static str, what: &str, errno: Errno) -> Error {
        let source = std::io::Error::from(errno);
        match errno {
            Errno::EAFNOSUPPORT | Errno::ENOENT | Errno::EPERM | Errno::EACCES
                if matches!(op, "socket" | "bind") =>
            {
                Error::Unavailable {
                    what: what.to_owned(),
                    source,
                }
            }
            Errno::EBADMSG => Error::Authentication,
            Errno::EINVAL => Error::InvalidParameter { op, source },
            _ => Error::Io { op, source },
        }
    }
}

/// A request that failed, with the caller's buffer handed back: unchanged,
/// except after a failed AEAD open, where it is zeroed. Its `Debug` shows
/// the buffer's length only (the bytes may be plaintext).
#[derive(thiserror::Error)]
#[error("{error}")]
pub struct Failed {
    /// What went wrong.
    #[source]
    pub error: Error,
    /// The caller's buffer.
    pub buf: Vec<u8>,
}

impl std::fmt::Debug for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Failed")
            .field("error", &self.error)
            .field("buf_len", &self.buf.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errnos_map_to_their_meaning() {
        assert!(Error::sys("bind", "gcm(aes)", Errno::ENOENT).is_unavailable());
        assert!(Error::sys("socket", "sockets", Errno::EAFNOSUPPORT).is_unavailable());
        assert!(Error::sys("bind", "x", Errno::EPERM).is_unavailable());
        // ENOENT elsewhere is an ordinary failure, not "unavailable".
        assert!(!Error::sys("read", "x", Errno::ENOENT).is_unavailable());
        assert!(matches!(
            Error::sys("read", "x", Errno::EBADMSG),
            Error::Authentication
        ));
        let e = Error::sys("ALG_SET_KEY", "x", Errno::EINVAL);
        assert!(matches!(e, Error::InvalidParameter { .. }));
        assert_eq!(e.raw_os_error(), Some(Errno::EINVAL as i32));
        assert_eq!(
            Error::sys("sendmsg", "x", Errno::EIO).raw_os_error(),
            Some(Errno::EIO as i32)
        );
        let f = Failed {
            error: Error::Worker,
            buf: b"secret plaintext".to_vec(),
        };
        let shown = format!("{f:?}");
        assert!(
            shown.contains("buf_len: 16") && !shown.contains("115"),
            "{shown}"
        );
    }
}
