//! Device-ready buffers: memory carved from the device's DMA pool that the
//! caller fills and reads in place, so a request on it costs no copy in
//! and no copy out ([`CryptoDevice::try_buffer`],
//! [`CipherSession::encrypt_buffer`]).
//!
//! A buffer holds a request's header, IV, status and descriptor table and
//! two halves for the data. A request reads the half that holds the data
//! and has the device write the other, which then holds the data: the
//! input is never overwritten, so a request the device fails (reset,
//! removal, a timeout) still has its input, which is copied out for the
//! caller to replay elsewhere.
//!
//! [`CryptoDevice::try_buffer`]: crate::CryptoDevice::try_buffer
//! [`CipherSession::encrypt_buffer`]: crate::CipherSession::encrypt_buffer

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::dma::{DmaBuf, DmaPool};
use crate::error::Error;
use crate::request::DATA_AT;

/// A buffer in a device's DMA memory, read and written in place as a byte
/// slice ([`DmaBuffer::as_mut_slice`]); requests on it through
/// [`CipherSession::encrypt_buffer`] of a session on the same device copy
/// nothing. Its memory is wiped when it is dropped.
///
/// [`CipherSession::encrypt_buffer`]: crate::CipherSession::encrypt_buffer
pub struct DmaBuffer {
    pub(crate) dma: DmaBuf,
    /// Counted among the pool's lent bytes while the caller holds it.
    _lease: Lease,
    /// The data's length.
    pub(crate) len: usize,
    /// The bytes of each half: the longest data, padded to whole blocks.
    pub(crate) half: usize,
    /// The half holding the data (0 or 1).
    pub(crate) active: usize,
}

impl std::fmt::Debug for DmaBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The bytes may be plaintext: the shape only.
        f.debug_struct("DmaBuffer")
            .field("len", &self.len)
            .field("capacity", &self.half)
            .finish_non_exhaustive()
    }
}

impl DmaBuffer {
    /// A buffer of `len` zero bytes in `pool`, if there is room: buffers
    /// take at most half the pool between them, so that requests on
    /// ordinary memory (copied through the pool) always have room.
    pub(crate) fn try_new(pool: &Arc<DmaPool>, len: usize) -> Result<Option<DmaBuffer>, Error> {
        let half = len.next_multiple_of(16);
        let bytes = DATA_AT + 2 * half;
        let limit = pool.len() / 2;
        let lease = Lease::new(pool, bytes);
        if lease.total > limit {
            return Ok(None);
        }
        Ok(pool.try_alloc(bytes)?.map(|dma| DmaBuffer {
            dma,
            _lease: lease,
            len,
            half,
            active: 0,
        }))
    }

    /// A buffer again, around memory a request gave back.
    pub(crate) fn from_parts(dma: DmaBuf, len: usize, half: usize, active: usize) -> DmaBuffer {
        let lease = Lease::new(dma.pool(), dma.len());
        DmaBuffer {
            dma,
            _lease: lease,
            len,
            half,
            active,
        }
    }

    /// Its length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The longest it can be ([`DmaBuffer::set_len`]).
    pub fn capacity(&self) -> usize {
        self.half
    }

    /// Sets its length (up to [`DmaBuffer::capacity`]); bytes it gains
    /// are whatever the memory held (zeros, or earlier data of this
    /// buffer).
    ///
    /// # Errors
    /// [`Error::TooLarge`] past the capacity.
    pub fn set_len(&mut self, len: usize) -> Result<(), Error> {
        if len > self.half {
            return Err(Error::TooLarge {
                len,
                max: self.half,
            });
        }
        self.len = len;
        Ok(())
    }

    /// Where half `which` starts in the buffer.
    pub(crate) fn half_at(&self, which: usize) -> usize {
        DATA_AT + which * self.half
    }

    /// The data, to read in place.
    pub fn as_slice(&self) -> &[u8] {
        self.dma
            .slice(self.half_at(self.active), self.len)
            .unwrap_or_default()
    }

    /// The data, to fill or transform in place.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let (at, len) = (self.half_at(self.active), self.len);
        // In range by construction (`len <= half`, two halves after
        // `DATA_AT`); an error would be this module's bug, and an empty
        // slice is the answer that breaks nothing.
        self.dma.slice_mut(at, len).unwrap_or_default()
    }

    /// Whether it was carved from `pool`.
    pub(crate) fn same_pool(&self, pool: &Arc<DmaPool>) -> bool {
        self.dma.same_pool(pool)
    }

    /// Its memory, handed to a request (no longer counted as lent: a
    /// request that fails or is dropped frees it with the queue), with
    /// its length, half size and active half.
    pub(crate) fn into_parts(self) -> (DmaBuf, usize, usize, usize) {
        (self.dma, self.len, self.half, self.active)
    }
}

/// Bytes of a pool counted as lent to device-ready buffers, uncounted on
/// drop.
struct Lease {
    pool: Arc<DmaPool>,
    bytes: usize,
    /// The pool's lent bytes with these.
    total: usize,
}

impl Lease {
    fn new(pool: &Arc<DmaPool>, bytes: usize) -> Lease {
        let total = pool
            .lent
            .fetch_add(bytes, Ordering::AcqRel)
            .saturating_add(bytes);
        Lease {
            pool: pool.clone(),
            bytes,
            total,
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.pool.lent.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}
