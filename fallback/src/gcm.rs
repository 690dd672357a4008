//! AES-GCM (NIST SP 800-38D) with a 96-bit nonce and a 16-byte tag, sealed
//! and opened in place with the tag detached.
//!
//! A tag that does not verify yields [`Error::Authentication`] and the buffer
//! is overwritten with zeros: no unauthenticated plaintext is ever released,
//! whichever implementation ran.

use aes_gcm::aead::AeadInOut;
use aes_gcm::{Aes128Gcm, Aes256Gcm, AesGcm, KeyInit};
use cipher::consts::U12;
use zeroize::Zeroize;

use crate::block_cipher::KeySize;
use crate::choice::{self, Choice, Mode, RunsOn, Split};
use crate::{Error, Implementation, LengthRule};

const ALG: &str = "AES-GCM";

/// The GCM nonce length this crate supports (the one NIST recommends).
pub const NONCE_LEN: usize = 12;
/// The GCM tag length.
pub const TAG_LEN: usize = 16;
/// The longest plaintext GCM can take (NIST SP 800-38D §5.2.1.1).
pub const MAX_LEN: u64 = (1 << 36) - 32;

/// A detached GCM authentication tag.
pub type Tag = [u8; TAG_LEN];

type Aes192Gcm = AesGcm<aes::Aes192, U12>;

/// An AES-GCM key.
pub struct Gcm {
    imp: Split<Imp>,
    /// The key itself, for the parallel path's CTR key (built per request:
    /// ~100 ns beside a request long enough to split). Wiped on drop.
    key: KeyBytes,
}

struct KeyBytes {
    bytes: [u8; 32],
    len: usize,
}

impl KeyBytes {
    /// `key` (at most 32 bytes: checked by the key schedule first).
    fn new(key: &[u8]) -> Self {
        let mut bytes = [0u8; 32];
        let len = key.len().min(32);
        bytes[..len].copy_from_slice(&key[..len]);
        KeyBytes { bytes, len }
    }
}

impl Drop for KeyBytes {
    fn drop(&mut self) {
        self.bytes.zeroize();
    }
}

// The key schedules stay inline (no pointer chase per request).
#[allow(clippy::large_enum_variant)]
enum Imp {
    A128(Aes128Gcm),
    A192(Aes192Gcm),
    A256(Aes256Gcm),
    #[cfg(feature = "aws-lc")]
    AwsLc(aws_lc_rs::aead::LessSafeKey, KeySize),
    /// ring's key has no `Zeroize` (its round keys and GHASH table are
    /// inline, the first round key is the AES-128 key itself): boxed in
    /// `Wiped`, zeroed once dropped.
    #[cfg(feature = "ring")]
    Ring(
        crypto_offload_native::Wiped<ring::aead::LessSafeKey>,
        KeySize,
    ),
}

impl Imp {
    fn new(key: &[u8], imp: Implementation) -> Result<Imp, Error> {
        let bad_key = Error::KeyLength {
            alg: ALG,
            len: key.len(),
            expected: "16, 24 or 32 bytes",
        };
        let size = KeySize::from_len(key.len()).ok_or(bad_key)?;
        Ok(match imp {
            Implementation::RustCrypto => match size {
                KeySize::Aes128 => Imp::A128(Aes128Gcm::new_from_slice(key).map_err(|_| bad_key)?),
                KeySize::Aes192 => Imp::A192(Aes192Gcm::new_from_slice(key).map_err(|_| bad_key)?),
                KeySize::Aes256 => Imp::A256(Aes256Gcm::new_from_slice(key).map_err(|_| bad_key)?),
            },
            #[cfg(feature = "aws-lc")]
            Implementation::AwsLc => {
                use aws_lc_rs::aead::{
                    AES_128_GCM, AES_192_GCM, AES_256_GCM, LessSafeKey, UnboundKey,
                };
                let alg = match size {
                    KeySize::Aes128 => &AES_128_GCM,
                    KeySize::Aes192 => &AES_192_GCM,
                    KeySize::Aes256 => &AES_256_GCM,
                };
                Imp::AwsLc(
                    LessSafeKey::new(UnboundKey::new(alg, key).map_err(|_| bad_key)?),
                    size,
                )
            }
            #[cfg(feature = "ring")]
            Implementation::Ring => {
                use ring::aead::{AES_128_GCM, AES_256_GCM, LessSafeKey, UnboundKey};
                let alg = match size {
                    KeySize::Aes128 => &AES_128_GCM,
                    KeySize::Aes256 => &AES_256_GCM,
                    KeySize::Aes192 => {
                        return Err(Error::Unavailable {
                            alg: "AES-192-GCM",
                            implementation: imp,
                        });
                    }
                };
                Imp::Ring(
                    crypto_offload_native::Wiped::new(LessSafeKey::new(
                        UnboundKey::new(alg, key).map_err(|_| bad_key)?,
                    )),
                    size,
                )
            }
            _ => {
                return Err(Error::Unavailable {
                    alg: ALG,
                    implementation: imp,
                });
            }
        })
    }

    fn key_size(&self) -> KeySize {
        match self {
            Imp::A128(_) => KeySize::Aes128,
            Imp::A192(_) => KeySize::Aes192,
            Imp::A256(_) => KeySize::Aes256,
            #[cfg(feature = "aws-lc")]
            Imp::AwsLc(_, size) => *size,
            #[cfg(feature = "ring")]
            Imp::Ring(_, size) => *size,
        }
    }
}

impl RunsOn for Imp {
    fn implementation(&self) -> Implementation {
        match self {
            Imp::A128(_) | Imp::A192(_) | Imp::A256(_) => Implementation::RustCrypto,
            #[cfg(feature = "aws-lc")]
            Imp::AwsLc(..) => Implementation::AwsLc,
            #[cfg(feature = "ring")]
            Imp::Ring(..) => Implementation::Ring,
        }
    }
}

impl core::fmt::Debug for Gcm {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Gcm")
            .field("key_size", &self.key_size())
            .field("choice", &self.choice())
            .finish_non_exhaustive()
    }
}

impl Gcm {
    /// The build's preferred implementation ([`choice::default_choice`]):
    /// the one a key size another implementation does not take (ring and
    /// AES-192) runs on. [`Gcm::new`] keeps it unless another measures
    /// clearly faster on this machine, for small requests starting from
    /// the CPU's seed instead ([`choice::seeded_choice`]: ring on AMD
    /// family 25).
    pub const DEFAULT_IMPLEMENTATION: Implementation = choice::default_choice(Mode::Gcm).small;

    /// Expands a 16-, 24- or 32-byte key on the implementations measured
    /// fastest on this machine, per size class ([`choice::measured`]: the
    /// first key in a process measures them, 1–4 ms).
    ///
    /// # Errors
    /// [`Error::KeyLength`] for any other length.
    pub fn new(key: &[u8]) -> Result<Self, Error> {
        Self::with_choice(key, choice::measured(Mode::Gcm))
    }

    /// Expands a key for a chosen implementation.
    ///
    /// # Errors
    /// [`Error::KeyLength`] for a key that is not 16, 24 or 32 bytes;
    /// [`Error::Unavailable`] for an implementation that does not take
    /// this key size (ring has no AES-192-GCM).
    pub fn with_implementation(key: &[u8], imp: Implementation) -> Result<Self, Error> {
        Ok(Gcm {
            imp: Split::one(Imp::new(key, imp)?),
            key: KeyBytes::new(key),
        })
    }

    /// Expands a key for `choice` (one implementation for small requests,
    /// one for large: e.g. a choice saved in a profile). An implementation
    /// that does not take the key size (ring and AES-192) is replaced by
    /// the build's default.
    ///
    /// # Errors
    /// [`Error::KeyLength`] for a key that is not 16, 24 or 32 bytes.
    pub fn with_choice(key: &[u8], choice: Choice) -> Result<Self, Error> {
        Ok(Gcm {
            imp: Split::new(choice, Self::DEFAULT_IMPLEMENTATION, |imp| {
                Imp::new(key, imp)
            })?,
            key: KeyBytes::new(key),
        })
    }

    /// The implementation of a `len`-byte request.
    #[inline]
    fn imp_for(&self, len: usize) -> &Imp {
        self.imp.for_len(len)
    }

    pub(crate) fn key_bytes(&self) -> &[u8] {
        &self.key.bytes[..self.key.len]
    }

    /// The AES key size.
    pub fn key_size(&self) -> KeySize {
        self.imp.small().key_size()
    }

    /// The implementation of small requests (at most
    /// [`Choice::small_max`](choice::Choice::small_max) bytes); [`Gcm::choice`] has both.
    pub fn implementation(&self) -> Implementation {
        self.imp.small().implementation()
    }

    /// The implementation of a `len`-byte request.
    pub fn implementation_for(&self, len: usize) -> Implementation {
        self.imp_for(len).implementation()
    }

    /// The implementations this key runs small and large requests on.
    pub fn choice(&self) -> Choice {
        self.imp.choice()
    }

    /// Encrypts `data` in place and returns the tag over `aad` and the
    /// ciphertext. `data` and `aad` may be empty.
    ///
    /// # Errors
    /// [`Error::DataLength`] when `data` is longer than [`MAX_LEN`].
    //
    // Always inlined: left to `#[inline]`, the compiler kept it out of
    // line where the caller's loop is small, and the call and the tag's
    // copy through the returned `Result` cost ~5 ns of a ~73 ns seal at
    // 16 B on AMD Zen 4 (ring through here at 0.91 of ring called
    // directly, 0.97 inlined: `benches/paired-layouts 16 --group gcm
    // --sizes 16,64,1k`). Keep the arms as they are: moving the `aes-gcm`
    // arms and the error paths out of line split the tag's copies into
    // the session's result differently and cost the session API's 16 B
    // seal 10 ns (the `session-overhead` bench over 8 code layouts).
    #[inline(always)]
    pub fn seal_in_place_detached(
        &self,
        nonce: &[u8; NONCE_LEN],
        aad: &[u8],
        data: &mut [u8],
    ) -> Result<Tag, Error> {
        check_len(data.len())?;
        let imp = self.imp_for(data.len());
        let failed = Error::ImplementationFailure(imp.implementation());
        match imp {
            Imp::A128(k) => Ok(k
                .encrypt_inout_detached(&(*nonce).into(), aad, data.into())
                .map_err(|_| failed)?
                .0),
            Imp::A192(k) => Ok(k
                .encrypt_inout_detached(&(*nonce).into(), aad, data.into())
                .map_err(|_| failed)?
                .0),
            Imp::A256(k) => Ok(k
                .encrypt_inout_detached(&(*nonce).into(), aad, data.into())
                .map_err(|_| failed)?
                .0),
            // The tag written straight into ours: aws-lc-rs's
            // `seal_in_place_separate_tag` returns its `Tag` (16 bytes and a
            // length), read back through an out-of-line `as_ref`.
            #[cfg(feature = "aws-lc")]
            Imp::AwsLc(k, _) => {
                use aws_lc_rs::aead::{Aad, Nonce};
                let mut tag = [0u8; TAG_LEN];
                k.seal_in_place_scatter(
                    Nonce::assume_unique_for_key(*nonce),
                    Aad::from(aad),
                    data,
                    &[],
                    &mut tag,
                )
                .map_err(|_| failed)?;
                Ok(tag)
            }
            #[cfg(feature = "ring")]
            Imp::Ring(k, _) => {
                use ring::aead::{Aad, Nonce};
                let tag = k
                    .seal_in_place_separate_tag(
                        Nonce::assume_unique_for_key(*nonce),
                        Aad::from(aad),
                        data,
                    )
                    .map_err(|_| failed)?;
                let mut out = [0u8; TAG_LEN];
                out.copy_from_slice(tag.as_ref());
                Ok(out)
            }
        }
    }

    /// Verifies `tag` over `aad` and the ciphertext in `data`, then decrypts
    /// `data` in place.
    ///
    /// # Errors
    /// [`Error::Authentication`] when the tag does not verify: `data` is then
    /// all zeros. [`Error::DataLength`] when `data` is longer than
    /// [`MAX_LEN`] (`data` is untouched).
    // Always inlined, as the seal is.
    #[inline(always)]
    pub fn open_in_place_detached(
        &self,
        nonce: &[u8; NONCE_LEN],
        aad: &[u8],
        data: &mut [u8],
        tag: &Tag,
    ) -> Result<(), Error> {
        check_len(data.len())?;
        let ok = match self.imp_for(data.len()) {
            Imp::A128(k) => k
                .decrypt_inout_detached(&(*nonce).into(), aad, data.into(), tag.into())
                .is_ok(),
            Imp::A192(k) => k
                .decrypt_inout_detached(&(*nonce).into(), aad, data.into(), tag.into())
                .is_ok(),
            Imp::A256(k) => k
                .decrypt_inout_detached(&(*nonce).into(), aad, data.into(), tag.into())
                .is_ok(),
            #[cfg(feature = "aws-lc")]
            Imp::AwsLc(k, _) => {
                use aws_lc_rs::aead::{Aad, Nonce};
                k.open_in_place_separate_tag(
                    Nonce::assume_unique_for_key(*nonce),
                    Aad::from(aad),
                    tag,
                    data,
                )
                .is_ok()
            }
            #[cfg(feature = "ring")]
            Imp::Ring(k, _) => {
                use ring::aead::{Aad, Nonce};
                k.open_in_place_separate_tag(
                    Nonce::assume_unique_for_key(*nonce),
                    Aad::from(aad),
                    ring::aead::Tag::from(*tag),
                    data,
                    0..,
                )
                .is_ok()
            }
        };
        if ok {
            Ok(())
        } else {
            // aws-lc and ring may have written unauthenticated plaintext
            // (ring documents that it may); wipe it.
            data.zeroize();
            Err(Error::Authentication)
        }
    }
}

pub(crate) fn check_len(len: usize) -> Result<(), Error> {
    if len as u64 > MAX_LEN {
        return Err(Error::DataLength {
            alg: ALG,
            len,
            rule: LengthRule::TooLong(MAX_LEN),
        });
    }
    Ok(())
}
