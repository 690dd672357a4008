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
    impl Sealed for super::DeviceBuf {}
}

/// A buffer type requests accept: `Vec<u8>`, `bytes::BytesMut` and
/// [`DeviceBuf`].
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
            Storage::Device(m) => m.as_slice().to_vec(),
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
            Storage::Device(m) => BytesMut::from(m.as_slice()),
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

/// A buffer carved from an engine's own memory ([`Offload::buffer`]): a
/// request on it to that engine copies nothing in or out — the engine
/// works on it in place — and anywhere else (the CPU, another engine) it
/// is ordinary bytes. Read and written as a `[u8]` (`Deref`), handed to
/// requests by value like a `Vec<u8>`. Where no engine offers memory it is
/// ordinary memory from the start; a request that has to move it (an
/// AEAD tag past its capacity, a failure the engine could not hand the
/// memory back from) moves it to ordinary memory, bytes intact. Wiped
/// when dropped (engine memory by its engine; ordinary memory here).
///
/// [`Offload::buffer`]: crate::Offload::buffer
pub struct DeviceBuf(IoBuf);

impl DeviceBuf {
    /// A buffer in `memory`, an engine's.
    pub(crate) fn device(memory: Box<dyn DeviceMemory>) -> DeviceBuf {
        DeviceBuf(IoBuf(Storage::Device(memory)))
    }

    /// Whether its bytes are in an engine's memory (else ordinary memory).
    pub fn is_device_memory(&self) -> bool {
        matches!(self.0.0, Storage::Device(_))
    }

    /// The engine whose memory it is, if any.
    pub fn device_owner(&self) -> Option<&str> {
        match &self.0.0 {
            Storage::Device(m) => Some(m.owner()),
            _ => None,
        }
    }

    /// Its bytes in a `Vec` (copied out of engine memory, which is then
    /// wiped and freed).
    pub fn into_vec(self) -> Vec<u8> {
        Vec::from_io(self.into_io())
    }
}

impl From<Vec<u8>> for DeviceBuf {
    /// A `DeviceBuf` in ordinary memory.
    fn from(v: Vec<u8>) -> Self {
        DeviceBuf(v.into_io())
    }
}

impl core::ops::Deref for DeviceBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.0.as_slice()
    }
}

impl core::ops::DerefMut for DeviceBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.0.as_mut_slice()
    }
}

/// Only where it lives and its length: the bytes may be plaintext.
impl core::fmt::Debug for DeviceBuf {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("DeviceBuf")
            .field("len", &self.0.len())
            .field("device", &self.device_owner())
            .finish()
    }
}

impl Drop for DeviceBuf {
    fn drop(&mut self) {
        // Engine memory is wiped by its engine when freed.
        if let Storage::Vec(v) = &mut self.0.0 {
            v.zeroize();
        }
    }
}

impl Buffer for DeviceBuf {
    fn into_io(mut self) -> IoBuf {
        std::mem::replace(&mut self.0, IoBuf(Storage::Vec(Vec::new())))
    }
    fn from_io(io: IoBuf) -> Self {
        DeviceBuf(io)
    }
    #[inline]
    fn bytes_mut(&mut self) -> &mut [u8] {
        self.0.as_mut_slice()
    }
    fn append(&mut self, data: &[u8]) {
        if let Storage::Device(m) = &mut self.0.0 {
            let len = m.as_slice().len();
            if m.set_len(len + data.len()) {
                m.as_mut_slice()[len..].copy_from_slice(data);
                return;
            }
        }
        let mut v = Vec::from_io(std::mem::replace(
            &mut self.0,
            IoBuf(Storage::Vec(Vec::new())),
        ));
        v.extend_from_slice(data);
        self.0 = v.into_io();
    }
    fn shorten(&mut self, len: usize) {
        match &mut self.0.0 {
            Storage::Device(m) => {
                let len = len.min(m.as_slice().len());
                m.as_mut_slice()[len..].zeroize();
                m.set_len(len);
            }
            Storage::Vec(v) => v.truncate(len),
            Storage::Bytes(b) => b.truncate(len),
        }
    }
}

/// Memory an engine lends for a [`DeviceBuf`]: bytes it can work on in
/// place when the buffer comes back to it in a request
/// ([`IoBuf::into_device`], then a downcast of [`DeviceMemory::into_any`]
/// to its own type). Implemented by engines ([`Backend::buffer`]).
///
/// [`Backend::buffer`]: crate::backend::Backend::buffer
pub trait DeviceMemory: Send + 'static {
    /// The bytes.
    fn as_slice(&self) -> &[u8];
    /// The bytes, to write in place.
    fn as_mut_slice(&mut self) -> &mut [u8];
    /// Sets the length, within the memory's capacity; `false` (nothing
    /// changed) past it.
    fn set_len(&mut self, len: usize) -> bool;
    /// The name of the backend whose memory it is.
    fn owner(&self) -> &str;
    /// Itself, for its engine to check the type before taking it.
    fn as_any(&self) -> &dyn std::any::Any;
    /// Itself, for its engine to downcast.
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any + Send>;
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
/// caller's `Vec<u8>`, `BytesMut` or [`DeviceBuf`], moved, not copied. Its
/// storage does not move while the backend holds it.
pub struct IoBuf(Storage);

enum Storage {
    Vec(Vec<u8>),
    Bytes(BytesMut),
    /// An engine's memory ([`DeviceBuf`]).
    Device(Box<dyn DeviceMemory>),
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
            Storage::Device(m) => m.as_slice(),
        }
    }

    /// The bytes, to transform in place.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        match &mut self.0 {
            Storage::Vec(v) => v,
            Storage::Bytes(b) => b,
            Storage::Device(m) => m.as_mut_slice(),
        }
    }

    /// An engine's memory as a buffer (an engine handing back a
    /// [`DeviceBuf`]'s memory).
    pub fn from_device(memory: Box<dyn DeviceMemory>) -> IoBuf {
        IoBuf(Storage::Device(memory))
    }

    /// The engine memory this buffer is, if it is ([`DeviceBuf`]); else
    /// the buffer back.
    ///
    /// # Errors
    /// The buffer itself, when it is ordinary memory.
    pub fn into_device(self) -> Result<Box<dyn DeviceMemory>, IoBuf> {
        match self.0 {
            Storage::Device(m) => Ok(m),
            other => Err(IoBuf(other)),
        }
    }

    /// The backend whose memory this buffer is, if it is engine memory.
    pub fn device_owner(&self) -> Option<&str> {
        match &self.0 {
            Storage::Device(m) => Some(m.owner()),
            _ => None,
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
