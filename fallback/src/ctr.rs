//! AES-CTR with a 128-bit big-endian counter (NIST SP 800-38A §6.5, the
//! counter-block layout of Linux's `ctr(aes)` and OpenSSL's AES-CTR).
//!
//! The whole counter block is incremented as one 128-bit integer, so a
//! counter of `ff…ff` wraps to `00…00` instead of stopping or carrying into
//! nothing.

use aes::Aes128;
use cipher::array::Array;
use cipher::consts::U16;
use cipher::typenum::Unsigned;
use cipher::{BlockCipherEncBackend, BlockCipherEncClosure, BlockSizeUser};

use crate::block_cipher::{Aes, KeySize, blocks_mut};
use crate::choice::{self, Choice, Mode, RunsOn, Split};
use crate::{Error, Implementation};

type Block = cipher::Block<Aes128>;

const ALG: &str = "AES-CTR";

/// An AES-CTR key.
pub struct Ctr {
    imp: Split<Imp>,
}

// The key schedule stays inline (no pointer chase per request); a key is
// built once per session.
#[allow(clippy::large_enum_variant)]
enum Imp {
    RustCrypto(Aes),
    #[cfg(feature = "aws-lc")]
    AwsLc(aws_lc_rs::cipher::EncryptingKey, KeySize),
}

impl Imp {
    fn new(key: &[u8], imp: Implementation) -> Result<Imp, Error> {
        let aes = Aes::new(key, ALG)?;
        Ok(match imp {
            Implementation::RustCrypto => Imp::RustCrypto(aes),
            #[cfg(feature = "aws-lc")]
            Implementation::AwsLc => {
                let size = aes.key_size();
                drop(aes);
                Imp::AwsLc(
                    crate::aws_lc::cipher_key(
                        key,
                        size,
                        ALG,
                        aws_lc_rs::cipher::EncryptingKey::ctr,
                    )?,
                    size,
                )
            }
            // ring (GCM only) and the CRC implementations.
            _ => {
                return Err(Error::Unavailable {
                    alg: ALG,
                    implementation: imp,
                });
            }
        })
    }
}

impl RunsOn for Imp {
    fn implementation(&self) -> Implementation {
        match self {
            Imp::RustCrypto(_) => Implementation::RustCrypto,
            #[cfg(feature = "aws-lc")]
            Imp::AwsLc(..) => Implementation::AwsLc,
        }
    }
}

impl core::fmt::Debug for Ctr {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Ctr")
            .field("key_size", &self.key_size())
            .field("choice", &self.choice())
            .finish_non_exhaustive()
    }
}

impl Ctr {
    /// The build's preferred implementation, which [`Ctr::new`] keeps
    /// unless another measures clearly faster on this machine
    /// ([`choice::default_choice`]).
    pub const DEFAULT_IMPLEMENTATION: Implementation = choice::default_choice(Mode::Ctr).small;

    /// Expands a 16-, 24- or 32-byte key on the implementations measured
    /// fastest on this machine, per size class ([`choice::measured`]: the
    /// first key in a process measures them, 1–4 ms).
    ///
    /// # Errors
    /// [`Error::KeyLength`] for any other length.
    pub fn new(key: &[u8]) -> Result<Self, Error> {
        Self::with_choice(key, choice::measured(Mode::Ctr))
    }

    /// Expands a key for a chosen implementation.
    ///
    /// # Errors
    /// [`Error::KeyLength`] for a key that is not 16, 24 or 32 bytes;
    /// [`Error::Unavailable`] for ring (GCM only).
    pub fn with_implementation(key: &[u8], imp: Implementation) -> Result<Self, Error> {
        Ok(Ctr {
            imp: Split::one(Imp::new(key, imp)?),
        })
    }

    /// Expands a key for `choice` (one implementation for small requests,
    /// one for large). One that has no CTR (ring) is replaced by the
    /// build's default.
    ///
    /// # Errors
    /// [`Error::KeyLength`] for a key that is not 16, 24 or 32 bytes.
    pub fn with_choice(key: &[u8], choice: Choice) -> Result<Self, Error> {
        Ok(Ctr {
            imp: Split::new(choice, Self::DEFAULT_IMPLEMENTATION, |imp| {
                Imp::new(key, imp)
            })?,
        })
    }

    /// The AES key size.
    pub fn key_size(&self) -> KeySize {
        match self.imp.small() {
            Imp::RustCrypto(aes) => aes.key_size(),
            #[cfg(feature = "aws-lc")]
            Imp::AwsLc(_, size) => *size,
        }
    }

    /// The implementation of small requests (at most
    /// [`Choice::small_max`](choice::Choice::small_max) bytes); [`Ctr::choice`] has both.
    pub fn implementation(&self) -> Implementation {
        self.imp.small().implementation()
    }

    /// The implementations this key runs small and large requests on.
    pub fn choice(&self) -> Choice {
        self.imp.choice()
    }

    /// The implementation a `len`-byte request runs on.
    pub fn implementation_for(&self, len: usize) -> Implementation {
        self.imp.for_len(len).implementation()
    }

    /// XORs the keystream that starts at counter block `iv` into `data`
    /// (encryption and decryption are the same operation). Any length,
    /// including zero.
    ///
    /// # Errors
    /// [`Error::ImplementationFailure`] if aws-lc rejects the request (it has
    /// never been seen: its only documented failures are inputs this type
    /// rules out).
    #[inline]
    pub fn apply_keystream(&self, iv: &[u8; 16], data: &mut [u8]) -> Result<(), Error> {
        match self.imp.for_len(data.len()) {
            Imp::RustCrypto(aes) => {
                apply_keystream(aes, u128::from_be_bytes(*iv), data);
                Ok(())
            }
            #[cfg(feature = "aws-lc")]
            Imp::AwsLc(key, _) => crate::aws_lc::encrypt_with_iv(key, iv, data),
        }
    }
}

/// XORs the AES-CTR keystream from counter `ctr` into `data`; returns the
/// counter after the last (possibly partial) block. Shared with GCM.
pub(crate) fn apply_keystream(aes: &Aes, ctr: u128, data: &mut [u8]) -> u128 {
    if data.is_empty() {
        return ctr;
    }
    let mut job = Keystream { data, ctr };
    aes.encrypt_with(&mut job);
    job.ctr
}

struct Keystream<'a> {
    data: &'a mut [u8],
    ctr: u128,
}

impl BlockSizeUser for &mut Keystream<'_> {
    type BlockSize = U16;
}

impl BlockCipherEncClosure for &mut Keystream<'_> {
    #[inline(always)]
    fn call<B: BlockCipherEncBackend<BlockSize = U16>>(self, backend: &B) {
        let mut ctr = self.ctr;
        let (blocks, rest) = blocks_mut(self.data);
        let (chunks, tail) = Array::<Block, B::ParBlocksSize>::slice_as_chunks_mut(blocks);
        let mut ks = Array::<Block, B::ParBlocksSize>::default();
        for chunk in chunks {
            for k in ks.iter_mut() {
                *k = ctr.to_be_bytes().into();
                ctr = ctr.wrapping_add(1);
            }
            backend.encrypt_par_blocks_inplace(&mut ks);
            for (b, k) in chunk.iter_mut().zip(ks.iter()) {
                xor_into(b, k);
            }
        }
        let partial = usize::from(!rest.is_empty());
        let n = tail.len() + partial;
        if n >= crate::xts::padded_tail_min(<B::ParBlocksSize as Unsigned>::USIZE) {
            for k in ks[..n].iter_mut() {
                *k = ctr.to_be_bytes().into();
                ctr = ctr.wrapping_add(1);
            }
            backend.encrypt_par_blocks_inplace(&mut ks);
            for (b, k) in tail.iter_mut().zip(ks.iter()) {
                xor_into(b, k);
            }
            xor_bytes(rest, &ks[tail.len()]);
        } else {
            for b in tail.iter_mut() {
                let mut k: Block = ctr.to_be_bytes().into();
                ctr = ctr.wrapping_add(1);
                backend.encrypt_block_inplace(&mut k);
                xor_into(b, &k);
            }
            if partial == 1 {
                let mut k: Block = ctr.to_be_bytes().into();
                ctr = ctr.wrapping_add(1);
                backend.encrypt_block_inplace(&mut k);
                xor_bytes(rest, &k);
            }
        }
        self.ctr = ctr;
    }
}

#[inline(always)]
fn xor_into(b: &mut Block, k: &Block) {
    *b = (u128::from_ne_bytes(b.0) ^ u128::from_ne_bytes(k.0))
        .to_ne_bytes()
        .into();
}

#[inline(always)]
fn xor_bytes(data: &mut [u8], k: &Block) {
    for (d, k) in data.iter_mut().zip(k.iter()) {
        *d ^= k;
    }
}
