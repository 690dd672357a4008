//! One AES block at a time on AWS-LC's `AES_KEY` (feature `aws-lc`): for
//! XTS data units too short to pay for a batch call.
//!
//! aws-lc-rs reaches single-block AES only through its ECB cipher keys,
//! whose `less_safe_encrypt` checks the length and the mode and goes
//! through `EVP` on every call: ~15–25 ns a block. `AES_encrypt` on a
//! key expanded once is the AES rounds and a feature test, ~16 ns for
//! AES-256 on an Intel Xeon (family 6 model 207), where a lone 16-byte XTS
//! unit on it (the tweak, then the data) takes 49–53 ns against 45–51 for
//! AWS-LC's EVP XTS driven directly (`fallback/README.md`).
//!
//! An expanded key is only read by `AES_encrypt` / `AES_decrypt`, so one
//! key serves any number of threads at once; it lives in a [`Wiped`] box,
//! zeroed when dropped.

use core::ffi::c_uint;
use core::mem::MaybeUninit;

use aws_lc_sys::{
    AES_KEY, AES_decrypt, AES_encrypt, AES_set_decrypt_key, AES_set_encrypt_key,
    CRYPTO_library_init,
};

use crate::Wiped;

/// A key that is not 16, 24 or 32 bytes long.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("an AES key is 16, 24 or 32 bytes, not {len}")]
pub struct AesKeyLength {
    /// The length given.
    pub len: usize,
}

/// An AES key expanded for encrypting single blocks.
///
/// ```
/// use crypto_offload_native::{AesDecryptBlock, AesEncryptBlock};
///
/// let key = [9u8; 32];
/// let mut block = [1u8; 16];
/// AesEncryptBlock::new(&key).unwrap().encrypt(&mut block);
/// assert_ne!(block, [1u8; 16]);
/// AesDecryptBlock::new(&key).unwrap().decrypt(&mut block);
/// assert_eq!(block, [1u8; 16]);
/// ```
pub struct AesEncryptBlock(Wiped<AES_KEY>);

/// An AES key expanded for decrypting single blocks. See
/// [`AesEncryptBlock`].
pub struct AesDecryptBlock(Wiped<AES_KEY>);

impl AesEncryptBlock {
    /// Expands a 16-, 24- or 32-byte key.
    ///
    /// # Errors
    /// [`AesKeyLength`] for any other length.
    pub fn new(key: &[u8]) -> Result<Self, AesKeyLength> {
        expand(key, AES_set_encrypt_key).map(AesEncryptBlock)
    }

    /// Encrypts one block in place.
    #[inline]
    pub fn encrypt(&self, block: &mut [u8; 16]) {
        let p = block.as_mut_ptr();
        // SAFETY: `p` is valid for reading and writing 16 bytes, and
        // AES_encrypt allows `in == out` (it loads the block before it
        // stores); the key was expanded by AES_set_encrypt_key (`expand`)
        // and is only read.
        unsafe { AES_encrypt(p, p, &*self.0) }
    }
}

impl AesDecryptBlock {
    /// Expands a 16-, 24- or 32-byte key.
    ///
    /// # Errors
    /// [`AesKeyLength`] for any other length.
    pub fn new(key: &[u8]) -> Result<Self, AesKeyLength> {
        expand(key, AES_set_decrypt_key).map(AesDecryptBlock)
    }

    /// Decrypts one block in place.
    #[inline]
    pub fn decrypt(&self, block: &mut [u8; 16]) {
        let p = block.as_mut_ptr();
        // SAFETY: as in `AesEncryptBlock::encrypt`; the key was expanded
        // by AES_set_decrypt_key.
        unsafe { AES_decrypt(p, p, &*self.0) }
    }
}

/// An expanded key, built in its box (no unwiped copy of the schedule is
/// left on the stack).
fn expand(
    key: &[u8],
    set: unsafe extern "C" fn(*const u8, c_uint, *mut AES_KEY) -> core::ffi::c_int,
) -> Result<Wiped<AES_KEY>, AesKeyLength> {
    let bits = match key.len() {
        16 | 24 | 32 => key.len() as c_uint * 8,
        len => return Err(AesKeyLength { len }),
    };
    // AES_set_*_key and AES_encrypt pick AES-NI, vpaes or the constant-time
    // C code by the CPU features AWS-LC has recorded, and the schedule's
    // layout differs between them: the features must be read before the
    // key is expanded. A static constructor does that in the usual build;
    // this makes sure of it in a build without one (a no-op after the
    // first call).
    // SAFETY: no preconditions; idempotent and thread-safe.
    unsafe { CRYPTO_library_init() };
    // SAFETY: AES_KEY is a plain C struct of integers, for which all
    // zeroes is a valid value; it is overwritten in place, in the box.
    let zero = unsafe { MaybeUninit::<AES_KEY>::zeroed().assume_init() };
    Wiped::new_with(zero, |schedule| {
        // SAFETY: `key` is valid for `bits / 8` bytes (matched above) and
        // `schedule` for writing one AES_KEY.
        let ok = unsafe { set(key.as_ptr(), bits, schedule) };
        // 0 on success; -1 / -2 only for a null pointer or a bad bit
        // count, both ruled out above.
        if ok == 0 {
            Ok(())
        } else {
            Err(AesKeyLength { len: key.len() })
        }
    })
}

impl core::fmt::Debug for AesEncryptBlock {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("AesEncryptBlock(..)")
    }
}

impl core::fmt::Debug for AesDecryptBlock {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("AesDecryptBlock(..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hex;

    /// FIPS-197 appendix C: every key size, both directions.
    #[test]
    fn fips_197_appendix_c() {
        let plain: [u8; 16] = hex("00112233445566778899aabbccddeeff").try_into().unwrap();
        for (key, want) in [
            (
                "000102030405060708090a0b0c0d0e0f",
                "69c4e0d86a7b0430d8cdb78070b4c55a",
            ),
            (
                "000102030405060708090a0b0c0d0e0f1011121314151617",
                "dda97ca4864cdfe06eaf70a0ec0d7191",
            ),
            (
                "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f",
                "8ea2b7ca516745bfeafc49904b496089",
            ),
        ] {
            let key = hex(key);
            let mut block = plain;
            AesEncryptBlock::new(&key).unwrap().encrypt(&mut block);
            assert_eq!(block.to_vec(), hex(want));
            AesDecryptBlock::new(&key).unwrap().decrypt(&mut block);
            assert_eq!(block, plain);
        }
    }

    #[test]
    fn other_key_lengths_are_refused() {
        for len in [0, 1, 15, 17, 20, 31, 33, 64] {
            let key = vec![1u8; len];
            assert_eq!(
                AesEncryptBlock::new(&key).unwrap_err(),
                AesKeyLength { len }
            );
            assert_eq!(
                AesDecryptBlock::new(&key).unwrap_err(),
                AesKeyLength { len }
            );
        }
    }

    #[test]
    fn debug_shows_no_key() {
        let key = [0x5au8; 16];
        let shown = format!(
            "{:?} {:?}",
            AesEncryptBlock::new(&key).unwrap(),
            AesDecryptBlock::new(&key).unwrap()
        );
        assert_eq!(shown, "AesEncryptBlock(..) AesDecryptBlock(..)");
    }
}
