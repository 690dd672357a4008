//! Writing inputs in the byte layout `arbitrary`'s derive reads, so that seed
//! corpora can be made from known-answer vectors.
//!
//! The layout (arbitrary 1.x): fields in order; integers little-endian from
//! as many bytes (zeros once the input runs out); `bool` is the low bit of
//! a byte; an enum's variant is a `u32` `v`, variant `(v × count) >> 32`;
//! the last field of the top-level struct takes the rest of the input (a
//! `Vec<u8>` its bytes, a `Vec<T>` as many `T`s as fit). Every seed is
//! decoded again and compared with what was meant before it is written
//! (`seeds` and the unit tests do), so a change of layout cannot slip by.

/// Bytes in `arbitrary`'s layout.
#[derive(Debug, Default, Clone)]
pub struct Writer(pub Vec<u8>);

impl Writer {
    /// A `u8`.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }

    /// A `u16`.
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// A `bool`.
    pub fn bool(&mut self, v: bool) -> &mut Self {
        self.u8(u8::from(v))
    }

    /// A fixed-size array of bytes (or the rest of the input).
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.0.extend_from_slice(v);
        self
    }

    /// Variant `index` of an enum with `count` variants.
    pub fn variant(&mut self, index: u32, count: u32) -> &mut Self {
        // The smallest v with (v * count) >> 32 == index.
        let v = ((u64::from(index) << 32).div_ceil(u64::from(count))) as u32;
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
}

/// The rest of the input, as it is: the byte strings the targets
/// encrypt, seal and checksum. (`Vec<u8>`'s own `arbitrary_take_rest`
/// puts a "one more" flag byte before every element, which would halve
/// the data and stop it at the first even byte.)
///
/// # Errors
/// None: any rest, even empty, is a byte string.
pub fn rest(u: &mut arbitrary::Unstructured<'_>) -> arbitrary::Result<Vec<u8>> {
    let n = u.len();
    Ok(u.bytes(n)?.to_vec())
}

/// Decodes `bytes` as `T` (as libFuzzer's `fuzz_target!` does).
pub fn decode<'a, T: arbitrary::Arbitrary<'a>>(bytes: &'a [u8]) -> Option<T> {
    T::arbitrary_take_rest(arbitrary::Unstructured::new(bytes)).ok()
}

/// A key of `len` bytes from the start of `key`, zero-padded to 64.
pub fn key64(key: &[u8]) -> [u8; 64] {
    let mut k = [0u8; 64];
    let n = key.len().min(64);
    k[..n].copy_from_slice(&key[..n]);
    k
}
