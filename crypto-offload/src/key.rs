//! Key material: held in one type that wipes itself and never prints.

use core::fmt;

use zeroize::{Zeroize, ZeroizeOnDrop};

/// The longest key any algorithm takes (XTS-AES-256: two 32-byte keys).
pub const MAX_KEY_LEN: usize = 64;

/// A secret key: zeroized on drop, and its `Debug` shows only the length.
///
/// Sessions copy the caller's key into one of these (and the CPU
/// implementations expand it into round keys that are wiped on drop too);
/// backends receive it by reference and must not keep other copies beyond
/// their own key schedule.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct SecretKey {
    bytes: [u8; MAX_KEY_LEN],
    len: u8,
}

impl SecretKey {
    /// Copies `key`; `None` if it is longer than [`MAX_KEY_LEN`].
    pub fn new(key: &[u8]) -> Option<Self> {
        let len = u8::try_from(key.len())
            .ok()
            .filter(|&l| usize::from(l) <= MAX_KEY_LEN)?;
        let mut bytes = [0u8; MAX_KEY_LEN];
        bytes[..key.len()].copy_from_slice(key);
        Some(SecretKey { bytes, len })
    }

    /// A fixed, public key of `len` bytes (at most [`MAX_KEY_LEN`]) that
    /// every algorithm of that key length accepts (its XTS halves differ):
    /// for calibration and probes, whose data is not secret.
    pub(crate) fn for_tests(len: usize) -> Self {
        let mut bytes = [0u8; MAX_KEY_LEN];
        for (i, b) in bytes.iter_mut().enumerate().take(len.min(MAX_KEY_LEN)) {
            *b = (i as u8).wrapping_mul(97).wrapping_add(13);
        }
        SecretKey {
            bytes,
            len: len.min(MAX_KEY_LEN) as u8,
        }
    }

    /// The key bytes.
    pub fn expose(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// The key length in bytes.
    pub fn len(&self) -> usize {
        usize::from(self.len)
    }

    /// Whether the key is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretKey")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}
