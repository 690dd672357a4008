//! Errors, keeping the errno of the system call that failed.

use nix::errno::Errno;

/// What opening or using a VFIO virtio-crypto device reports.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The device cannot be used here: no VFIO, no such device, not bound
    /// to `vfio-pci`, its IOMMU group not viable, or no permission.
    #[error("VFIO device {what} is unavailable: {detail}")]
    Unavailable {
        /// The device (its PCI address) or `"VFIO"`.
        what: String,
        /// Why.
        detail: String,
    },
    /// A system call failed.
    #[error("{op} failed: {source}")]
    Io {
        /// The call, e.g. `"VFIO_IOMMU_MAP_DMA"`.
        op: &'static str,
        /// The OS error, with its errno.
        #[source]
        source: std::io::Error,
    },
    /// The device does not behave as the virtio specification says (a
    /// missing capability, a feature it refuses, a malformed completion).
    #[error("device: {0}")]
    Device(String),
    /// The device broke the virtio rules (a used entry naming no chain it
    /// holds, a used index running ahead of its requests, a configuration
    /// no driver can work with): it is no longer trusted. Every request it
    /// held failed (their memory stays with the driver until a reset) and
    /// it takes no more until it is opened again.
    #[error("the device broke the virtio rules and is no longer trusted: {0}")]
    Broken(String),
    /// A request took longer than its timeout (the device may be hung);
    /// the caller's buffer comes back unchanged, and the request's DMA
    /// memory stays with the driver until the device completes it or is
    /// reset.
    #[error("the request timed out after {0:?}")]
    Timeout(std::time::Duration),
    /// The device answered a request with an error status.
    #[error("the device answered {status}: {}", status_name(*.status))]
    Status {
        /// The `VIRTIO_CRYPTO_*` status.
        status: u8,
    },
    /// A parameter this driver checks before the device sees it.
    #[error("invalid {what}: {detail}")]
    Invalid {
        /// Which parameter.
        what: &'static str,
        /// Why.
        detail: String,
    },
    /// The request is larger than the DMA pool can ever hold.
    #[error("request of {len} bytes exceeds the {max}-byte limit")]
    TooLarge {
        /// The request's length.
        len: usize,
        /// The most one request carries.
        max: usize,
    },
    /// The device was reset or removed with the request in flight; its
    /// completion will never come.
    #[error("the device was reset or removed")]
    Gone,
}

impl Error {
    pub(crate) fn sys(op: &'static str, errno: Errno) -> Error {
        Error::Io {
            op,
            source: std::io::Error::from_raw_os_error(errno as i32),
        }
    }

    /// The errno behind this error, if a system call failed.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            Error::Io { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

/// The name of a `VIRTIO_CRYPTO_*` status.
pub fn status_name(status: u8) -> &'static str {
    match status {
        0 => "OK",
        1 => "ERR",
        2 => "BADMSG",
        3 => "NOTSUPP",
        4 => "INVSESS",
        5 => "NOSPC",
        6 => "KEY_REJECTED",
        _ => "unknown",
    }
}

/// A failed request: the error and the caller's buffer, unchanged.
#[derive(thiserror::Error)]
#[error("{error}")]
pub struct Failed {
    /// What went wrong.
    #[source]
    pub error: Error,
    /// The caller's buffer, as it was handed in.
    pub buf: Vec<u8>,
}

impl std::fmt::Debug for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The buffer may hold plaintext: its length only.
        f.debug_struct("Failed")
            .field("error", &self.error)
            .field("buf_len", &self.buf.len())
            .finish()
    }
}

/// A failed request on a device-ready buffer: the error, and the data.
#[derive(thiserror::Error)]
#[error("{error}")]
pub struct BufferFailed {
    /// What went wrong.
    #[source]
    pub error: Error,
    /// The request's input, as it was handed in.
    pub buf: Returned,
}

impl std::fmt::Debug for BufferFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufferFailed")
            .field("error", &self.error)
            .field("buf", &self.buf)
            .finish()
    }
}

/// Where a failed device-ready request's input is.
pub enum Returned {
    /// In its buffer, as it was (the request was refused before or by the
    /// device).
    Device(Box<crate::DmaBuffer>),
    /// Copied out: the device failed with the request in it, and its
    /// memory stays with the driver until the device can no longer write
    /// it.
    Copied(Vec<u8>),
    /// Not recoverable (the driver could not read its own memory back:
    /// never expected).
    Lost,
}

impl std::fmt::Debug for Returned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The bytes may be plaintext: lengths only.
        match self {
            Returned::Device(b) => write!(f, "Device({} bytes)", b.len()),
            Returned::Copied(v) => write!(f, "Copied({} bytes)", v.len()),
            Returned::Lost => f.write_str("Lost"),
        }
    }
}
