//! The AES key schedule shared by every mode, over the three key sizes.
//!
//! The `aes` crate picks VAES-512, VAES-256, AES-NI or a constant-time
//! software implementation at run time. Its per-call cost is loading (and on
//! VAES, broadcasting) the round keys, so the modes in this crate hand it
//! whole runs of blocks through [`BlockCipherEncClosure`]s instead of calling
//! it once per block: the closure body is inlined into the target-feature
//! function, so the mode's own XORs and tweak arithmetic get the same vector
//! instructions.

use aes::{Aes128, Aes192, Aes256};
use cipher::consts::U16;
use cipher::{
    BlockCipherDecClosure, BlockCipherDecrypt, BlockCipherEncClosure, BlockCipherEncrypt, KeyInit,
};

use crate::Error;

/// The AES key sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeySize {
    /// AES-128: a 16-byte key.
    Aes128,
    /// AES-192: a 24-byte key.
    Aes192,
    /// AES-256: a 32-byte key.
    Aes256,
}

impl KeySize {
    /// The key length in bytes.
    pub const fn key_len(self) -> usize {
        match self {
            KeySize::Aes128 => 16,
            KeySize::Aes192 => 24,
            KeySize::Aes256 => 32,
        }
    }

    /// The key size for an AES key of `len` bytes, if there is one.
    pub const fn from_len(len: usize) -> Option<Self> {
        match len {
            16 => Some(KeySize::Aes128),
            24 => Some(KeySize::Aes192),
            32 => Some(KeySize::Aes256),
            _ => None,
        }
    }
}

/// An expanded AES key (encryption and decryption round keys). The `aes`
/// crate's `zeroize` feature wipes the round keys on drop.
#[derive(Clone)]
pub(crate) enum Aes {
    A128(Aes128),
    A192(Aes192),
    A256(Aes256),
}

impl Aes {
    /// Expands a 16-, 24- or 32-byte key; `alg` names the mode in the error.
    pub(crate) fn new(key: &[u8], alg: &'static str) -> Result<Self, Error> {
        let err = || Error::KeyLength {
            alg,
            len: key.len(),
            expected: "16, 24 or 32 bytes",
        };
        Ok(match key.len() {
            16 => Aes::A128(Aes128::new_from_slice(key).map_err(|_| err())?),
            24 => Aes::A192(Aes192::new_from_slice(key).map_err(|_| err())?),
            32 => Aes::A256(Aes256::new_from_slice(key).map_err(|_| err())?),
            _ => return Err(err()),
        })
    }

    pub(crate) fn key_size(&self) -> KeySize {
        match self {
            Aes::A128(_) => KeySize::Aes128,
            Aes::A192(_) => KeySize::Aes192,
            Aes::A256(_) => KeySize::Aes256,
        }
    }

    /// Runs `f` with the encryption backend (round keys loaded once).
    #[inline]
    pub(crate) fn encrypt_with(&self, f: impl BlockCipherEncClosure<BlockSize = U16>) {
        match self {
            Aes::A128(c) => c.encrypt_with_backend(f),
            Aes::A192(c) => c.encrypt_with_backend(f),
            Aes::A256(c) => c.encrypt_with_backend(f),
        }
    }

    /// Runs `f` with the decryption backend (round keys loaded once).
    #[inline]
    pub(crate) fn decrypt_with(&self, f: impl BlockCipherDecClosure<BlockSize = U16>) {
        match self {
            Aes::A128(c) => c.decrypt_with_backend(f),
            Aes::A192(c) => c.decrypt_with_backend(f),
            Aes::A256(c) => c.decrypt_with_backend(f),
        }
    }
}

/// Views whole 16-byte blocks of `data` as cipher blocks; the tail (fewer
/// than 16 bytes) is returned separately.
#[inline(always)]
pub(crate) fn blocks_mut(data: &mut [u8]) -> (&mut [cipher::Block<Aes128>], &mut [u8]) {
    let (blocks, tail) = data.as_chunks_mut::<16>();
    (cipher::array::Array::cast_slice_from_core_mut(blocks), tail)
}
