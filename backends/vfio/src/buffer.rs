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
    /// Its memory, counted among the pool's lent bytes until freed.
    pub(crate) dma: DmaBuf,
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
        Ok(pool
            .try_alloc_lent(DATA_AT + 2 * half)?
            .map(|dma| DmaBuffer {
                dma,
                len,
                half,
                active: 0,
            }))
    }

    /// A buffer again, around memory a request gave back.
    pub(crate) fn from_parts(dma: DmaBuf, len: usize, half: usize, active: usize) -> DmaBuffer {
        DmaBuffer {
            dma,
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
        // SAFETY: a `DmaBuffer` never writes through its memory while it
        // is borrowed (requests take it by value: they write the header,
        // IV, status and table and hand it to the device only then), so
        // nothing writes the data while `&self` lives — but a device that
        // breaks the virtio rules by writing memory it was not handed, or
        // after it completed a request (the driver declares a device that
        // completes a buffer request without writing its status broken,
        // and parks that memory): the data are plain bytes, with no invalid
        // values and no pointers, so such a device can make them wrong,
        // never make the slice unsound to use.
        unsafe { self.dma.slice(self.half_at(self.active), self.len) }.unwrap_or_default()
    }

    /// The data, to fill or transform in place.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let (at, len) = (self.half_at(self.active), self.len);
        // In range by construction (`len <= half`, two halves after
        // `DATA_AT`); an error would be this module's bug, and an empty
        // slice is the answer that breaks nothing.
        // SAFETY: not in the device: a request takes the `DmaBuffer` by
        // value and gives the memory back only once the device has
        // completed it (as for `as_slice`, a device that writes memory it
        // was not handed can only make plain bytes wrong).
        unsafe { self.dma.slice_mut(at, len) }.unwrap_or_default()
    }

    /// Whether it was carved from `pool`.
    pub(crate) fn same_pool(&self, pool: &Arc<DmaPool>) -> bool {
        self.dma.same_pool(pool)
    }

    /// Its memory, handed to a request (still counted as lent until it is
    /// freed, wherever it goes), with its length, half size and active
    /// half.
    pub(crate) fn into_parts(self) -> (DmaBuf, usize, usize, usize) {
        (self.dma, self.len, self.half, self.active)
    }
}
