//! CRC-32C sessions for the volume, kept between requests.
//!
//! A `CrcSession` is a running CRC (`&mut self`), so concurrent requests
//! each need their own. Opening one per block would reopen its engine
//! contexts (an AF_ALG socket, say) every time; the pool keeps the idle
//! ones.

use std::sync::{Mutex, PoisonError};

use crypto_offload::{CrcAlg, CrcSession, Offload};

/// Idle sessions kept at most (more are dropped when they come back).
const KEEP: usize = 256;

/// A pool of CRC-32C (iSCSI / Castagnoli) sessions.
pub(crate) struct CrcPool {
    offload: Offload,
    idle: Mutex<Vec<CrcSession>>,
}

impl CrcPool {
    pub(crate) fn new(offload: Offload) -> Self {
        CrcPool {
            offload,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// The CRC-32C of `buf`, and `buf` back.
    ///
    /// # Errors
    /// A session could not be opened (only with a forced backend that has
    /// no CRC-32C).
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped request's session is dropped, not returned to
    /// the pool half-fed; the buffer is lost to the caller.
    pub(crate) async fn checksum(
        &self,
        buf: Vec<u8>,
    ) -> Result<(Vec<u8>, u32), crypto_offload::Error> {
        let taken = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        let mut session = match taken {
            Some(s) => s,
            None => self.offload.crc(CrcAlg::Crc32Iscsi).await?,
        };
        session.reset();
        let buf = session.update(buf).await?;
        // CRC-32C is 32 bits wide: the u64 holds it in its low half.
        let crc = session.finalize() as u32;
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < KEEP {
            idle.push(session);
        }
        Ok((buf, crc))
    }

    /// A CRC-32C for synchronous use (the scan at open and the
    /// superblock, on the blocking pool), on the CPU.
    ///
    /// # Errors
    /// As for [`checksum`](Self::checksum).
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped future opens nothing.
    pub(crate) async fn sync_crc(&self) -> Result<SyncCrc, crypto_offload::Error> {
        Ok(SyncCrc(Mutex::new(
            self.offload.crc(CrcAlg::Crc32Iscsi).await?,
        )))
    }
}

/// A CRC-32C computed synchronously with `update_from_slice`.
pub(crate) struct SyncCrc(Mutex<CrcSession>);

impl SyncCrc {
    /// The CRC-32C of `bytes`.
    pub(crate) fn of(&self, bytes: &[u8]) -> u32 {
        let mut s = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        s.reset();
        s.update_from_slice(bytes);
        s.finalize() as u32
    }
}
