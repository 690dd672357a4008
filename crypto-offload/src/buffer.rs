//! Owned buffers: what requests take and give back.
//!
//! A request takes the caller's buffer by value and returns it (encrypted,
//! decrypted, or — after a failed AEAD open — zeroed). Owning the buffer is
//! what lets a device or the kernel work on it after the call returns, and
//! what lets a dropped request future park the buffer until the engine is
//! done with it instead of freeing memory a DMA may still write.

use bytes::BytesMut;
use zeroize::Zeroize;

mod sealed {
    pub trait Sealed {}
    impl Sealed for Vec<u8> {}
    impl Sealed for bytes::BytesMut {}
}

/// A buffer type requests accept: `Vec<u8>` and `bytes::BytesMut`.
///
/// Sealed: the crate moves buffers between tasks, threads and devices, and
/// only types whose heap storage stays put when moved can go there.
pub trait Buffer: sealed::Sealed + Send + Unpin + 'static {
    /// Hands the buffer to a backend.
    #[doc(hidden)]
    fn into_io(self) -> IoBuf;
    /// Takes it back. A backend returns the same `IoBuf` it was given; if one
    /// ever returns another kind, the bytes are copied, never lost.
    #[doc(hidden)]
    fn from_io(io: IoBuf) -> Self;
    /// The bytes, for the inline CPU path.
    #[doc(hidden)]
    fn bytes_mut(&mut self) -> &mut [u8];
    /// Appends (the AEAD tag).
    #[doc(hidden)]
    fn append(&mut self, data: &[u8]);
    /// Shortens (drops the AEAD tag).
    #[doc(hidden)]
    fn shorten(&mut self, len: usize);
}

impl Buffer for Vec<u8> {
    fn into_io(self) -> IoBuf {
        IoBuf(Storage::Vec(self))
    }
    fn from_io(io: IoBuf) -> Self {
        match io.0 {
            Storage::Vec(v) => v,
            Storage::Bytes(mut b) => vec_from_bytes(&mut b),
        }
    }
    #[inline]
    fn bytes_mut(&mut self) -> &mut [u8] {
        self
    }
    fn append(&mut self, data: &[u8]) {
        self.extend_from_slice(data);
    }
    fn shorten(&mut self, len: usize) {
        self.truncate(len);
    }
}

impl Buffer for BytesMut {
    fn into_io(self) -> IoBuf {
        IoBuf(Storage::Bytes(self))
    }
    fn from_io(io: IoBuf) -> Self {
        match io.0 {
            Storage::Bytes(b) => b,
            Storage::Vec(mut v) => bytes_from_vec(&mut v),
        }
    }
    #[inline]
    fn bytes_mut(&mut self) -> &mut [u8] {
        self
    }
    fn append(&mut self, data: &[u8]) {
        self.extend_from_slice(data);
    }
    fn shorten(&mut self, len: usize) {
        self.truncate(len);
    }
}

/// The bytes of `b` in a `Vec` of their own; `b`'s memory — its bytes and
/// its spare capacity — wiped before it is freed (or left to whoever shares
/// its allocation): it may hold plaintext, and a copy must not leave one
/// behind. (`Vec::from(BytesMut)` copies, or moves the bytes within the
/// allocation, and frees or keeps the rest unwiped.)
fn vec_from_bytes(b: &mut BytesMut) -> Vec<u8> {
    let v = b.to_vec();
    b.as_mut().zeroize();
    b.spare_capacity_mut().zeroize();
    v
}

/// The bytes of `v` in a `BytesMut`; `v`'s memory (bytes and spare
/// capacity) wiped before it is freed.
fn bytes_from_vec(v: &mut Vec<u8>) -> BytesMut {
    let b = BytesMut::from(&v[..]);
    v.as_mut_slice().zeroize();
    v.spare_capacity_mut().zeroize();
    b
}

/// The owned buffer a [`Backend`](crate::backend::Backend) works on: the
/// caller's `Vec<u8>` or `BytesMut`, moved, not copied. Its heap storage does
/// not move while the backend holds it.
pub struct IoBuf(Storage);

enum Storage {
    Vec(Vec<u8>),
    Bytes(BytesMut),
}

/// Only the length: the bytes may be plaintext.
impl core::fmt::Debug for IoBuf {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("IoBuf")
            .field("len", &self.len())
            .finish_non_exhaustive()
    }
}

impl IoBuf {
    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        match &self.0 {
            Storage::Vec(v) => v,
            Storage::Bytes(b) => b,
        }
    }

    /// The bytes, to transform in place.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        match &mut self.0 {
            Storage::Vec(v) => v,
            Storage::Bytes(b) => b,
        }
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl From<Vec<u8>> for IoBuf {
    fn from(v: Vec<u8>) -> Self {
        v.into_io()
    }
}

impl From<BytesMut> for IoBuf {
    fn from(b: BytesMut) -> Self {
        b.into_io()
    }
}

impl From<IoBuf> for Vec<u8> {
    fn from(io: IoBuf) -> Self {
        Vec::from_io(io)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conversion_wipes_the_buffer_it_copied_from() {
        let mut b = BytesMut::with_capacity(128);
        b.extend_from_slice(&[7u8; 64]);
        assert_eq!(vec_from_bytes(&mut b), vec![7u8; 64]);
        assert_eq!(&b[..], &[0u8; 64], "the BytesMut left behind is wiped");
        let mut v = vec![9u8; 16];
        assert_eq!(&bytes_from_vec(&mut v)[..], &[9u8; 16]);
        assert_eq!(v, vec![0u8; 16], "the Vec left behind is wiped");
        // Round trips through IoBuf keep the bytes.
        let back: Vec<u8> = Vec::from_io(BytesMut::from(&[1u8, 2, 3][..]).into_io());
        assert_eq!(back, vec![1, 2, 3]);
        let back = BytesMut::from_io(vec![4u8, 5].into_io());
        assert_eq!(&back[..], &[4, 5]);
    }
}
