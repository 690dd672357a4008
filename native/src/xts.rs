//! XTS-AES-256 on AWS-LC's EVP interface (feature `aws-lc`): aws-lc-rs has
//! no XTS, and AWS-LC's own (AES-NI, and VAES-512 where the CPU has
//! AVX-512) ran at 1.2–2.4× `crypto-offload-fallback`'s on the two AMD
//! machines measured (`fallback/README.md`).
//!
//! An `EVP_CIPHER_CTX` holds the key schedules *and* the current data
//! unit's tweak, so one context cannot serve two threads at once. [`Xts256`]
//! keeps one keyed context as a template that is never run, and runs each
//! request on a context of its own: one taken from a few spare slots (an
//! atomic swap, no lock), or a copy of the template when every slot is
//! empty (more requests at once than slots; the copy is put back in a slot
//! afterwards, or freed when they are all full). Each data unit re-arms the
//! context with its tweak only: the key schedule is made once, in
//! [`Xts256::new`].
//!
//! With AWS-LC's default allocator the key schedules are wiped when a
//! context is freed (`OPENSSL_free` cleanses every allocation it returns);
//! a process that installs its own (`CRYPTO_set_mem_functions`) gets them
//! unwiped in its free hook (`tests/xts_review.rs` shows it). The key this
//! crate is given stays the caller's.

use core::ffi::c_int;
use core::ptr::{self, NonNull};
use core::sync::atomic::{AtomicPtr, Ordering};

use subtle::ConstantTimeEq;

use aws_lc_sys::{
    EVP_CIPHER_CTX, EVP_CIPHER_CTX_copy, EVP_CIPHER_CTX_free, EVP_CIPHER_CTX_new,
    EVP_CipherInit_ex, EVP_CipherUpdate, EVP_aes_256_xts,
};

/// Why an [`Xts256`] call did nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum XtsError {
    /// The two halves of the key are equal (IEEE 1619 and FIPS forbid
    /// it; AWS-LC refuses such a key).
    #[error("XTS key halves are equal")]
    EqualHalves,
    /// A data unit shorter than 16 bytes or longer than
    /// [`Xts256::MAX_UNIT`], or one that does not divide the data.
    #[error("data of {len} bytes cannot be run as {unit_len}-byte XTS data units")]
    UnitLength {
        /// The data unit length asked for.
        unit_len: usize,
        /// The data's length.
        len: usize,
    },
    /// AWS-LC reported a failure (out of memory, or a call it refused).
    /// Data units before the failing one have been processed in place.
    #[error("AWS-LC's XTS failed")]
    Failed,
}

/// An XTS-AES-256 key (Key1 ‖ Key2, 64 bytes) on AWS-LC, usable from any
/// number of threads at once.
///
/// The tweak of a data unit is its 16-byte sequence number as a
/// little-endian integer (what dm-crypt's `plain64`, Linux's `xts(aes)` and
/// OpenSSL take); ciphertext stealing covers data units that are not a
/// whole number of blocks.
///
/// ```
/// use crypto_offload_native::Xts256;
///
/// let mut key = [0u8; 64];
/// key[32] = 1; // Key2 must differ from Key1
/// let xts = Xts256::new(&key).unwrap();
/// let mut sectors = vec![7u8; 3 * 512];
/// xts.encrypt_units(&5u128.to_le_bytes(), 512, &mut sectors).unwrap();
/// xts.decrypt_units(&5u128.to_le_bytes(), 512, &mut sectors).unwrap();
/// assert!(sectors.iter().all(|&b| b == 7));
/// ```
pub struct Xts256 {
    enc: Contexts,
    dec: Contexts,
}

impl core::fmt::Debug for Xts256 {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Xts256").finish_non_exhaustive()
    }
}

impl Xts256 {
    /// The key length: two AES-256 keys.
    pub const KEY_LEN: usize = 64;

    /// The longest data unit AWS-LC takes: 2^20 blocks (IEEE 1619-2018 and
    /// NIST SP 800-38E).
    pub const MAX_UNIT: usize = 16 << 20;

    /// Expands `key` (Key1 ‖ Key2) for both directions.
    ///
    /// # Errors
    /// [`XtsError::EqualHalves`] when Key1 = Key2; [`XtsError::Failed`] when
    /// AWS-LC cannot allocate a context.
    pub fn new(key: &[u8; 64]) -> Result<Self, XtsError> {
        if bool::from(key[..32].ct_eq(&key[32..])) {
            return Err(XtsError::EqualHalves);
        }
        Ok(Xts256 {
            enc: Contexts::new(key, Direction::Encrypt)?,
            dec: Contexts::new(key, Direction::Decrypt)?,
        })
    }

    /// Encrypts consecutive data units of `unit_len` bytes in place; unit
    /// `i` has tweak `first_tweak + i` (little-endian, wrapping at 2^128).
    ///
    /// # Errors
    /// [`XtsError::UnitLength`] (nothing is touched), [`XtsError::Failed`].
    pub fn encrypt_units(
        &self,
        first_tweak: &[u8; 16],
        unit_len: usize,
        data: &mut [u8],
    ) -> Result<(), XtsError> {
        self.enc.run(first_tweak, unit_len, data)
    }

    /// Decrypts consecutive data units in place. See
    /// [`Xts256::encrypt_units`].
    ///
    /// # Errors
    /// As for [`Xts256::encrypt_units`].
    pub fn decrypt_units(
        &self,
        first_tweak: &[u8; 16],
        unit_len: usize,
        data: &mut [u8],
    ) -> Result<(), XtsError> {
        self.dec.run(first_tweak, unit_len, data)
    }
}

#[derive(Clone, Copy)]
enum Direction {
    Encrypt,
    Decrypt,
}

/// How many idle contexts a direction keeps: more requests at once than
/// this copy the template (~0.1 µs here) and free the copy afterwards.
const SPARES: usize = 4;

/// One direction's contexts: a keyed template and the idle spares.
struct Contexts {
    /// Keyed, never run, never handed out: only read (copied) after `new`.
    template: Ctx,
    /// Idle keyed contexts; null where empty. A context is owned by whoever
    /// swapped it out of its slot.
    spares: [AtomicPtr<EVP_CIPHER_CTX>; SPARES],
}

impl Contexts {
    fn new(key: &[u8; 64], dir: Direction) -> Result<Self, XtsError> {
        let template = Ctx::new()?;
        let enc = match dir {
            Direction::Encrypt => 1,
            Direction::Decrypt => 0,
        };
        // SAFETY: `template` is a live context this function owns;
        // EVP_aes_256_xts returns a static cipher; `key` is valid for the 64
        // bytes an AES-256-XTS key is read as; a null engine and IV are
        // allowed (the IV is set per data unit).
        let ok = unsafe {
            EVP_CipherInit_ex(
                template.0.as_ptr(),
                EVP_aes_256_xts(),
                ptr::null_mut(),
                key.as_ptr(),
                ptr::null(),
                enc,
            )
        };
        if ok != 1 {
            return Err(XtsError::Failed);
        }
        Ok(Contexts {
            template,
            spares: Default::default(),
        })
    }

    /// An idle context, or a fresh copy of the template.
    fn take(&self) -> Result<Ctx, XtsError> {
        for slot in &self.spares {
            if let Some(p) = NonNull::new(slot.swap(ptr::null_mut(), Ordering::Acquire)) {
                return Ok(Ctx(p));
            }
        }
        let ctx = Ctx::new()?;
        // SAFETY: `ctx` is a live, fresh context owned here; the template is
        // live and keyed, and only read: EVP_CIPHER_CTX_copy takes it as
        // `const`, and XTS's copy hook (EVP_CTRL_COPY) reads it and writes
        // only the copy, so copies made at once on several threads do not
        // race.
        let ok = unsafe { EVP_CIPHER_CTX_copy(ctx.0.as_ptr(), self.template.0.as_ptr()) };
        if ok != 1 {
            return Err(XtsError::Failed);
        }
        Ok(ctx)
    }

    /// Puts `ctx` back in an empty slot, or frees it.
    fn give_back(&self, ctx: Ctx) {
        let p = ctx.0.as_ptr();
        for slot in &self.spares {
            if slot
                .compare_exchange(ptr::null_mut(), p, Ordering::Release, Ordering::Relaxed)
                .is_ok()
            {
                core::mem::forget(ctx);
                return;
            }
        }
        drop(ctx);
    }

    fn run(
        &self,
        first_tweak: &[u8; 16],
        unit_len: usize,
        data: &mut [u8],
    ) -> Result<(), XtsError> {
        if !(16..=Xts256::MAX_UNIT).contains(&unit_len) || !data.len().is_multiple_of(unit_len) {
            return Err(XtsError::UnitLength {
                unit_len,
                len: data.len(),
            });
        }
        if data.is_empty() {
            return Ok(());
        }
        let len = c_int::try_from(unit_len).map_err(|_| XtsError::Failed)?;
        let ctx = self.take()?;
        let mut sector = u128::from_le_bytes(*first_tweak);
        for unit in data.chunks_exact_mut(unit_len) {
            let tweak = sector.to_le_bytes();
            sector = sector.wrapping_add(1);
            // SAFETY: `ctx` is a live context keyed for this direction and
            // owned by this call; a null cipher, engine and key keep the
            // key schedules, `tweak` is the 16 bytes XTS reads as its IV,
            // and -1 keeps the context's direction.
            let armed = unsafe {
                EVP_CipherInit_ex(
                    ctx.0.as_ptr(),
                    ptr::null(),
                    ptr::null_mut(),
                    ptr::null(),
                    tweak.as_ptr(),
                    -1,
                )
            };
            if armed != 1 {
                return Err(XtsError::Failed);
            }
            let mut written: c_int = 0;
            let p = unit.as_mut_ptr();
            // SAFETY: `ctx` is armed with this unit's tweak (above); `p` is
            // valid for reads and writes of `len` bytes (16 to 2^24, checked
            // above) and is both input and output: AWS-LC's XTS reads each
            // block before it writes it, and with a block size of 1 it writes
            // exactly `len` bytes; `written` is a valid out-pointer.
            let ok = unsafe { EVP_CipherUpdate(ctx.0.as_ptr(), p, &mut written, p, len) };
            if ok != 1 || written != len {
                // A context that failed is freed, not reused.
                return Err(XtsError::Failed);
            }
        }
        self.give_back(ctx);
        Ok(())
    }
}

impl Drop for Contexts {
    fn drop(&mut self) {
        for slot in &mut self.spares {
            if let Some(p) = NonNull::new(*slot.get_mut()) {
                drop(Ctx(p));
            }
        }
    }
}

/// An owned `EVP_CIPHER_CTX`, freed (and its key schedules wiped) on drop.
struct Ctx(NonNull<EVP_CIPHER_CTX>);

impl Ctx {
    fn new() -> Result<Self, XtsError> {
        // SAFETY: no preconditions; the result is an owned context or null.
        NonNull::new(unsafe { EVP_CIPHER_CTX_new() })
            .map(Ctx)
            .ok_or(XtsError::Failed)
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        // SAFETY: the context is live and owned by this value alone (never
        // in a slot while a `Ctx` holds it); it is not used afterwards.
        unsafe { EVP_CIPHER_CTX_free(self.0.as_ptr()) }
    }
}

// SAFETY: a context is plain heap memory AWS-LC does not tie to a thread;
// `Ctx` owns it exclusively.
unsafe impl Send for Ctx {}

// SAFETY: `Contexts` shares only the template across threads, and only for
// reading (EVP_CIPHER_CTX_copy, see `take`); every context that is run is
// owned by one call at a time (moved out of its slot by an atomic swap).
unsafe impl Sync for Contexts {}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> [u8; 64] {
        core::array::from_fn(|i| i as u8)
    }

    /// IEEE 1619-2007 vector 10 (XTS-AES-256, 512-byte unit, tweak 0xff).
    #[test]
    fn ieee_1619_vector_10() {
        let key: [u8; 64] = hex(concat!(
            "2718281828459045235360287471352662497757247093699959574966967627",
            "3141592653589793238462643383279502884197169399375105820974944592"
        ))
        .try_into()
        .unwrap();
        let plain: Vec<u8> = (0..512).map(|i| i as u8).collect();
        let mut data = plain.clone();
        let xts = Xts256::new(&key).unwrap();
        xts.encrypt_units(&0xffu128.to_le_bytes(), 512, &mut data)
            .unwrap();
        assert_eq!(
            &data[..32],
            &hex("1c3b3a102f770386e4836c99e370cf9bea00803f5e482357a4ae12d414a3e63b")[..]
        );
        assert_eq!(
            &data[480..],
            &hex("773dad38014bd2092fa755c824bb5e54c4f36ffda9fcea70b9c6e693e148c151")[..]
        );
        xts.decrypt_units(&0xffu128.to_le_bytes(), 512, &mut data)
            .unwrap();
        assert_eq!(data, plain);
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// Bad lengths are refused before anything is touched; equal halves
    /// are refused.
    #[test]
    fn bad_lengths_and_equal_halves_are_refused() {
        let xts = Xts256::new(&key()).unwrap();
        for (unit, len) in [
            (15, 15),
            (0, 0),
            (16, 24),
            (512, 1000),
            (Xts256::MAX_UNIT + 16, Xts256::MAX_UNIT + 16),
        ] {
            let mut data = vec![9u8; len];
            assert_eq!(
                xts.encrypt_units(&[0; 16], unit, &mut data),
                Err(XtsError::UnitLength {
                    unit_len: unit,
                    len
                }),
            );
            assert!(data.iter().all(|&b| b == 9));
        }
        assert_eq!(xts.encrypt_units(&[0; 16], 16, &mut []), Ok(()));
        assert_eq!(Xts256::new(&[3u8; 64]).unwrap_err(), XtsError::EqualHalves);
    }

    /// Many units in one call equal one call per unit with consecutive
    /// tweaks (wrapping at 2^128), for whole-block and stolen lengths.
    #[test]
    fn a_run_of_units_is_units_one_by_one() {
        let xts = Xts256::new(&key()).unwrap();
        for unit in [16, 17, 31, 512, 520, 4096] {
            let first = u128::MAX - 1;
            let plain: Vec<u8> = (0..unit * 4).map(|i| (i * 7) as u8).collect();
            let mut whole = plain.clone();
            xts.encrypt_units(&first.to_le_bytes(), unit, &mut whole)
                .unwrap();
            let mut parts = plain.clone();
            for (i, u) in parts.chunks_mut(unit).enumerate() {
                let t = first.wrapping_add(i as u128);
                xts.encrypt_units(&t.to_le_bytes(), unit, u).unwrap();
            }
            assert_eq!(whole, parts, "unit {unit}");
            assert_ne!(whole, plain);
            xts.decrypt_units(&first.to_le_bytes(), unit, &mut whole)
                .unwrap();
            assert_eq!(whole, plain, "unit {unit}");
        }
    }

    /// More threads at once than spare contexts: every result right.
    #[test]
    fn more_callers_at_once_than_spare_contexts() {
        let xts = Xts256::new(&key()).unwrap();
        let mut want = vec![1u8; 4096];
        xts.encrypt_units(&[0; 16], 512, &mut want).unwrap();
        std::thread::scope(|s| {
            for _ in 0..(SPARES * 3) {
                s.spawn(|| {
                    for _ in 0..200 {
                        let mut data = vec![1u8; 4096];
                        xts.encrypt_units(&[0; 16], 512, &mut data).unwrap();
                        assert_eq!(data, want);
                        xts.decrypt_units(&[0; 16], 512, &mut data).unwrap();
                        assert!(data.iter().all(|&b| b == 1));
                    }
                });
            }
        });
    }
}
