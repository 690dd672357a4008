//! What the engine adapters (`af_alg`, `vfio`) share: the power and
//! timeout settings, the "not here" reason, the shape of an engine that
//! takes one XTS data unit per operation, and the cipher context over a
//! driver session that encrypts data units. The public items are
//! re-exported from both engine modules.

use core::future::Future;
use std::time::Duration;

use crate::backend::{Failed, Limits};

/// How long an engine stays up after its last session closes.
pub const AUTOSUSPEND_DELAY: Duration = Duration::from_secs(1);

/// A request to an engine is given up as hung, and replayed on the CPU,
/// after this much time plus [`TIMEOUT_PER_MIB`] a MiB: a 10 MB/s floor,
/// below any engine the selector would choose.
pub(crate) const TIMEOUT_FIXED: Duration = Duration::from_secs(2);

/// See [`TIMEOUT_FIXED`].
pub(crate) const TIMEOUT_PER_MIB: Duration = Duration::from_millis(100);

/// How long a request to an engine may take before it is given up as hung
/// (and replayed on the CPU): [`fixed`](RequestTimeout::fixed), plus
/// [`per_mib`](RequestTimeout::per_mib) for each MiB of data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct RequestTimeout {
    /// The time every request may take.
    pub fixed: Duration,
    /// More time per MiB of data.
    pub per_mib: Duration,
}

impl RequestTimeout {
    /// The engines' timeout: [`TIMEOUT_FIXED`] plus [`TIMEOUT_PER_MIB`].
    pub(crate) const ENGINE: RequestTimeout = RequestTimeout {
        fixed: TIMEOUT_FIXED,
        per_mib: TIMEOUT_PER_MIB,
    };

    /// The time a `len`-byte request may take (saturating at
    /// `Duration::MAX`).
    ///
    /// ```
    /// # #[cfg(all(feature = "af-alg", target_os = "linux"))] {
    /// use std::time::Duration;
    /// use crypto_offload::af_alg::REQUEST_TIMEOUT;
    ///
    /// assert_eq!(REQUEST_TIMEOUT.for_len(0), Duration::from_secs(2));
    /// assert_eq!(REQUEST_TIMEOUT.for_len(10 << 20), Duration::from_secs(3));
    /// # }
    /// ```
    pub fn for_len(self, len: usize) -> Duration {
        let mib = len as f64 / f64::from(1u32 << 20);
        let more =
            Duration::try_from_secs_f64(self.per_mib.as_secs_f64() * mib).unwrap_or(Duration::MAX);
        self.fixed.saturating_add(more)
    }
}

/// Why a kind of engine offers nothing on this machine (for `offload
/// probe`): no AF_ALG in the kernel, no device bound to `vfio-pci`, no
/// permission, ….
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unavailable(pub String);

/// The limits of an engine whose XTS takes one data unit (one tweak) per
/// operation, of at most `max` bytes.
pub(crate) fn xts_per_unit(max: usize) -> Limits {
    Limits::new()
        .with_one_operation_per_unit()
        .with_max_request(max)
}

/// A driver's cipher session that encrypts or decrypts consecutive data
/// units in place (both drivers' `crypt_units`), its errors already this
/// crate's. Not `async_trait`: `Cipher<S>` is generic over it, so the
/// driver's future is awaited inside the context's (one box a request, as
/// before this was shared).
pub(crate) trait UnitCipher: Send + Sync + 'static {
    fn crypt_units(
        &self,
        encrypt: bool,
        first_tweak: &[u8; 16],
        unit: usize,
        buf: Vec<u8>,
    ) -> impl Future<Output = Result<Vec<u8>, Failed>> + Send;
}

/// A cipher context over a driver session (AF_ALG's; VFIO's has its own,
/// for requests in place on device memory).
#[cfg(all(feature = "af-alg", target_os = "linux"))]
pub(crate) use cipher::Cipher;

#[cfg(all(feature = "af-alg", target_os = "linux"))]
mod cipher {
    use async_trait::async_trait;

    use super::UnitCipher;
    use crate::backend::{CipherContext, CipherParams, Failed};
    use crate::buffer::IoBuf;
    use crate::power::PowerRef;

    /// A cipher context over a driver session, holding the engine's power for
    /// the session's life (dropped after the session: its close goes out
    /// before the device may suspend). AF_ALG's (VFIO's has its own, for
    /// requests in place on device memory).
    pub(crate) struct Cipher<S> {
        session: S,
        _power: Option<PowerRef>,
    }

    impl<S> Cipher<S> {
        pub(crate) fn new(session: S, power: Option<PowerRef>) -> Self {
            Cipher {
                session,
                _power: power,
            }
        }
    }

    #[async_trait]
    impl<S: UnitCipher> CipherContext for Cipher<S> {
        async fn encrypt(&self, params: CipherParams, buf: IoBuf) -> Result<IoBuf, Failed> {
            self.session
                .crypt_units(true, &params.iv, params.data_unit, buf.into())
                .await
                .map(IoBuf::from)
        }

        async fn decrypt(&self, params: CipherParams, buf: IoBuf) -> Result<IoBuf, Failed> {
            self.session
                .crypt_units(false, &params.iv, params.data_unit, buf.into())
                .await
                .map(IoBuf::from)
        }
    }
}
