//! AES-CBC without padding (NIST SP 800-38A §6.2): the data must be whole
//! 16-byte blocks. Padding, when a protocol wants it, belongs to the caller.
//!
//! On RustCrypto, both directions run the `cbc` crate over the `aes` crate,
//! except decryption of requests from `CHAIN_FROM` bytes on a backend
//! that decrypts 64 blocks at once (VAES-512): there this crate's own
//! chain (`Chain`) runs. Measured in paired rounds (`paired --group cbc`,
//! AES-256): on AMD Zen 3, where the `aes` crate runs AES-NI (8 blocks at
//! once: `cpufeatures` 0.3.1 reports VAES only with AVX-512 state enabled),
//! the `cbc` crate decrypts 64 B in 21 ns against the own chain's 41 and is
//! ahead up to 4 KiB (7.1 vs 6.8 GB/s) and level beyond; encryption is
//! serial and the two are level. On AMD Zen 4 (VAES-512) the `cbc` crate is
//! ahead at 16–64 B (0.24 vs 0.21 GB/s at 16 B) and the own chain from
//! 1 KiB (4.6 vs 4.2 GB/s; 6.5 vs 5.5 at 64 KiB).

use aes::{Aes128, Aes192, Aes256};
use cbc::{Decryptor, Encryptor};
use cipher::array::Array;
use cipher::consts::U16;
use cipher::typenum::Unsigned;
use cipher::{BlockCipherDecBackend, BlockCipherDecClosure, BlockSizeUser};

use crate::block_cipher::{Aes, KeySize, blocks_mut};
use crate::choice::{self, Choice, Mode, RunsOn, Split};
use crate::{Error, Implementation, LengthRule};

type Block = cipher::Block<Aes128>;

const ALG: &str = "AES-CBC";

/// An AES-CBC key.
///
/// Encryption and decryption each run on their own choice
/// ([`Mode::Cbc`], [`Mode::CbcDecrypt`]): one is serial and the other
/// parallel, and the fastest implementation differs between them.
pub struct Cbc {
    imp: Split<Imp>,
    /// Decryption's, when its choice differs from encryption's.
    dec: Option<Box<Split<Imp>>>,
}

// The key schedule stays inline (no pointer chase per request); a key is
// built once per session.
#[allow(clippy::large_enum_variant)]
enum Imp {
    /// The key schedule, and the request length from which decryption runs
    /// the own chain ([`chain_from`]).
    RustCrypto(Aes, usize),
    #[cfg(feature = "aws-lc")]
    AwsLc {
        enc: aws_lc_rs::cipher::EncryptingKey,
        dec: aws_lc_rs::cipher::DecryptingKey,
        size: KeySize,
    },
}

impl Imp {
    fn new(key: &[u8], imp: Implementation) -> Result<Imp, Error> {
        let aes = Aes::new(key, ALG)?;
        Ok(match imp {
            Implementation::RustCrypto => {
                let from = chain_from(&aes);
                Imp::RustCrypto(aes, from)
            }
            #[cfg(feature = "aws-lc")]
            Implementation::AwsLc => {
                use aws_lc_rs::cipher::{DecryptingKey, EncryptingKey};
                let size = aes.key_size();
                drop(aes);
                Imp::AwsLc {
                    enc: crate::aws_lc::cipher_key(key, size, ALG, EncryptingKey::cbc)?,
                    dec: crate::aws_lc::cipher_key(key, size, ALG, DecryptingKey::cbc)?,
                    size,
                }
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
            Imp::RustCrypto(..) => Implementation::RustCrypto,
            #[cfg(feature = "aws-lc")]
            Imp::AwsLc { .. } => Implementation::AwsLc,
        }
    }
}

impl core::fmt::Debug for Cbc {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Cbc")
            .field("key_size", &self.key_size())
            .field("choice", &self.choice())
            .field("decrypt_choice", &self.decrypt_choice())
            .finish_non_exhaustive()
    }
}

impl Cbc {
    /// The build's preferred implementation, which [`Cbc::new`] keeps
    /// unless another measures clearly faster on this machine
    /// ([`choice::default_choice`]).
    pub const DEFAULT_IMPLEMENTATION: Implementation = choice::default_choice(Mode::Cbc).small;

    /// Expands a 16-, 24- or 32-byte key on the implementations measured
    /// fastest on this machine, per direction and size class
    /// ([`choice::measured`]: the first key in a process measures them,
    /// 1–6 ms).
    ///
    /// # Errors
    /// [`Error::KeyLength`] for any other length.
    pub fn new(key: &[u8]) -> Result<Self, Error> {
        Self::with_choices(
            key,
            choice::measured(Mode::Cbc),
            choice::measured(Mode::CbcDecrypt),
        )
    }

    /// Expands a key for a chosen implementation.
    ///
    /// # Errors
    /// [`Error::KeyLength`] for a key that is not 16, 24 or 32 bytes;
    /// [`Error::Unavailable`] for ring (GCM only).
    pub fn with_implementation(key: &[u8], imp: Implementation) -> Result<Self, Error> {
        Ok(Cbc {
            imp: Split::one(Imp::new(key, imp)?),
            dec: None,
        })
    }

    /// Expands a key for `choice` (one implementation for small requests,
    /// one for large), in both directions. One that has no CBC (ring) is
    /// replaced by the build's default.
    ///
    /// # Errors
    /// [`Error::KeyLength`] for a key that is not 16, 24 or 32 bytes.
    pub fn with_choice(key: &[u8], choice: Choice) -> Result<Self, Error> {
        Self::with_choices(key, choice, choice)
    }

    /// Expands a key for `encrypt`'s choice in encryption and `decrypt`'s
    /// in decryption (e.g. both saved in a profile). When they differ, the
    /// key is expanded for each.
    ///
    /// # Errors
    /// [`Error::KeyLength`] for a key that is not 16, 24 or 32 bytes.
    pub fn with_choices(key: &[u8], encrypt: Choice, decrypt: Choice) -> Result<Self, Error> {
        let split = |choice| {
            Split::new(choice, Self::DEFAULT_IMPLEMENTATION, |imp| {
                Imp::new(key, imp)
            })
        };
        let imp = split(encrypt)?;
        let dec = if decrypt == encrypt {
            None
        } else {
            Some(Box::new(split(decrypt)?))
        };
        Ok(Cbc { imp, dec })
    }

    /// The AES key size.
    pub fn key_size(&self) -> KeySize {
        match self.imp.small() {
            Imp::RustCrypto(aes, _) => aes.key_size(),
            #[cfg(feature = "aws-lc")]
            Imp::AwsLc { size, .. } => *size,
        }
    }

    /// The implementation of small requests (at most
    /// [`Choice::small_max`](choice::Choice::small_max) bytes); [`Cbc::choice`] has both.
    pub fn implementation(&self) -> Implementation {
        self.imp.small().implementation()
    }

    /// The implementations this key encrypts small and large requests on.
    pub fn choice(&self) -> Choice {
        self.imp.choice()
    }

    /// The implementations this key decrypts small and large requests on.
    pub fn decrypt_choice(&self) -> Choice {
        self.decryptor().choice()
    }

    /// The implementation a `len`-byte encryption runs on.
    pub fn implementation_for(&self, len: usize) -> Implementation {
        self.imp.for_len(len).implementation()
    }

    /// The implementation a `len`-byte decryption runs on.
    pub fn decrypt_implementation_for(&self, len: usize) -> Implementation {
        self.decryptor().for_len(len).implementation()
    }

    #[inline]
    fn decryptor(&self) -> &Split<Imp> {
        self.dec.as_deref().unwrap_or(&self.imp)
    }

    /// Encrypts `data` (a multiple of 16 bytes, possibly empty) in place.
    ///
    /// # Errors
    /// [`Error::DataLength`] when the length is not a multiple of 16.
    #[inline]
    pub fn encrypt(&self, iv: &[u8; 16], data: &mut [u8]) -> Result<(), Error> {
        check_len(data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        match self.imp.for_len(data.len()) {
            Imp::RustCrypto(aes, _) => {
                cbc_crate_encrypt(aes, iv, blocks_mut(data).0);
                Ok(())
            }
            #[cfg(feature = "aws-lc")]
            Imp::AwsLc { enc, .. } => crate::aws_lc::encrypt_with_iv(enc, iv, data),
        }
    }

    /// Decrypts `data` (a multiple of 16 bytes, possibly empty) in place.
    ///
    /// # Errors
    /// [`Error::DataLength`] when the length is not a multiple of 16.
    #[inline]
    pub fn decrypt(&self, iv: &[u8; 16], data: &mut [u8]) -> Result<(), Error> {
        check_len(data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        let data_len = data.len();
        match self.decryptor().for_len(data_len) {
            Imp::RustCrypto(aes, chain_from) => {
                let (blocks, _) = blocks_mut(data);
                if data_len >= *chain_from {
                    aes.decrypt_with(Chain {
                        blocks,
                        iv: (*iv).into(),
                    });
                } else {
                    cbc_crate_decrypt(aes, iv, blocks);
                }
                Ok(())
            }
            #[cfg(feature = "aws-lc")]
            Imp::AwsLc { dec, .. } => crate::aws_lc::decrypt_with_iv(dec, iv, data),
        }
    }
}

/// CBC encryption on the `cbc` crate, over whichever key size `aes` has.
fn cbc_crate_encrypt(aes: &Aes, iv: &[u8; 16], blocks: &mut [Block]) {
    use cipher::{BlockModeEncrypt, InnerIvInit};
    let iv = &(*iv).into();
    match aes {
        Aes::A128(c) => Encryptor::<&Aes128>::inner_iv_init(c, iv).encrypt_blocks(blocks),
        Aes::A192(c) => Encryptor::<&Aes192>::inner_iv_init(c, iv).encrypt_blocks(blocks),
        Aes::A256(c) => Encryptor::<&Aes256>::inner_iv_init(c, iv).encrypt_blocks(blocks),
    }
}

/// CBC decryption on the `cbc` crate, over whichever key size `aes` has.
fn cbc_crate_decrypt(aes: &Aes, iv: &[u8; 16], blocks: &mut [Block]) {
    use cipher::{BlockModeDecrypt, InnerIvInit};
    let iv = &(*iv).into();
    match aes {
        Aes::A128(c) => Decryptor::<&Aes128>::inner_iv_init(c, iv).decrypt_blocks(blocks),
        Aes::A192(c) => Decryptor::<&Aes192>::inner_iv_init(c, iv).decrypt_blocks(blocks),
        Aes::A256(c) => Decryptor::<&Aes256>::inner_iv_init(c, iv).decrypt_blocks(blocks),
    }
}

fn check_len(len: usize) -> Result<(), Error> {
    if len.is_multiple_of(16) {
        Ok(())
    } else {
        Err(Error::DataLength {
            alg: ALG,
            len,
            rule: LengthRule::MultipleOfBlock,
        })
    }
}

/// Requests from this many bytes decrypt on the own chain when the
/// backend is VAES-512's 64 blocks wide (see the module docs).
const CHAIN_FROM: usize = 1024;

/// The request length from which `aes` decrypts on [`Chain`]: [`CHAIN_FROM`]
/// on a backend that runs more than 32 blocks at once (VAES-512, where it
/// was measured ahead), never on narrower ones (AES-NI's 8, where the
/// `cbc` crate is ahead; VAES-256's 30, not measured).
fn chain_from(aes: &Aes) -> usize {
    let mut par = 0;
    aes.decrypt_with(ParBlocks(&mut par));
    if par > 32 { CHAIN_FROM } else { usize::MAX }
}

/// Reads the batch size of the backend the `aes` crate runs on this CPU.
struct ParBlocks<'a>(&'a mut usize);

impl BlockSizeUser for ParBlocks<'_> {
    type BlockSize = U16;
}

impl BlockCipherDecClosure for ParBlocks<'_> {
    fn call<B: BlockCipherDecBackend<BlockSize = U16>>(self, _: &B) {
        *self.0 = <B::ParBlocksSize as Unsigned>::USIZE;
    }
}

/// CBC decryption of whole blocks in the backend's widest batches.
struct Chain<'a> {
    blocks: &'a mut [Block],
    iv: Block,
}

impl BlockSizeUser for Chain<'_> {
    type BlockSize = U16;
}

#[inline(always)]
fn xor_into(b: &mut Block, k: &Block) {
    *b = (u128::from_ne_bytes(b.0) ^ u128::from_ne_bytes(k.0))
        .to_ne_bytes()
        .into();
}

impl BlockCipherDecClosure for Chain<'_> {
    #[inline(always)]
    fn call<B: BlockCipherDecBackend<BlockSize = U16>>(self, backend: &B) {
        let mut prev = self.iv;
        let (chunks, tail) = Array::<Block, B::ParBlocksSize>::slice_as_chunks_mut(self.blocks);
        for chunk in chunks {
            let ct = chunk.clone();
            backend.decrypt_par_blocks_inplace(chunk);
            xor_into(&mut chunk[0], &prev);
            for (b, c) in chunk[1..].iter_mut().zip(ct.iter()) {
                xor_into(b, c);
            }
            prev = ct[ct.len() - 1];
        }
        if tail.is_empty() {
            return;
        }
        if tail.len() < crate::xts::padded_tail_min(<B::ParBlocksSize as Unsigned>::USIZE) {
            // A few blocks, one at a time from the last: each one's chaining
            // value is the ciphertext block before it, still in place, so no
            // copy is kept (a batch-sized copy cost ~10 ns of a 64-byte
            // request's ~40).
            for i in (0..tail.len()).rev() {
                let chain = if i == 0 { prev } else { tail[i - 1] };
                backend.decrypt_block_inplace(&mut tail[i]);
                xor_into(&mut tail[i], &chain);
            }
            return;
        }
        let mut ct = Array::<Block, B::ParBlocksSize>::default();
        ct[..tail.len()].copy_from_slice(tail);
        let mut pad = ct.clone();
        backend.decrypt_par_blocks_inplace(&mut pad);
        tail.copy_from_slice(&pad[..tail.len()]);
        xor_into(&mut tail[0], &prev);
        for (b, c) in tail[1..].iter_mut().zip(ct.iter()) {
            xor_into(b, c);
        }
    }
}

#[cfg(test)]
mod tests {
    use cipher::consts::{U8, U30, U64};
    use cipher::inout::InOut;
    use cipher::{
        BlockCipherDecrypt, BlockModeDecrypt, InnerIvInit, KeyInit, ParBlocksSizeUser,
        array::ArraySize,
    };
    use proptest::prelude::*;

    use super::*;

    /// A backend `P` blocks wide made of single-block AES: runs the own
    /// chain's batch, short-tail and padded-tail paths at VAES-256's and
    /// VAES-512's widths on any CPU.
    struct Wide<'a, C, P>(&'a C, core::marker::PhantomData<P>);

    impl<C, P> BlockSizeUser for Wide<'_, C, P> {
        type BlockSize = U16;
    }

    impl<C, P: ArraySize> ParBlocksSizeUser for Wide<'_, C, P> {
        type ParBlocksSize = P;
    }

    impl<C: BlockCipherDecrypt<BlockSize = U16>, P: ArraySize> BlockCipherDecBackend
        for Wide<'_, C, P>
    {
        fn decrypt_block(&self, mut block: InOut<'_, '_, cipher::Block<Self>>) {
            let mut b = block.clone_in();
            self.0.decrypt_block(&mut b);
            *block.get_out() = b;
        }
    }

    fn chain_on<C: BlockCipherDecrypt<BlockSize = U16>, P: ArraySize>(
        c: &C,
        iv: [u8; 16],
        data: &mut [u8],
    ) {
        let (blocks, _) = blocks_mut(data);
        Chain {
            blocks,
            iv: iv.into(),
        }
        .call(&Wide::<C, P>(c, core::marker::PhantomData));
    }

    proptest! {
        /// The own chain runs only on VAES-512 backends from 1 KiB, so it
        /// is checked here directly — on the backend this CPU has and at
        /// 8, 30 and 64 blocks a batch, for every key size — at every
        /// length: whole batches, short tails and padded ones.
        #[test]
        fn the_own_chain_decrypts_as_the_cbc_crate_does(
            key in any::<[u8; 32]>(),
            key_len in prop::sample::select(vec![16usize, 24, 32]),
            iv in any::<[u8; 16]>(),
            data in proptest::collection::vec(any::<u8>(), 0..2048),
        ) {
            let mut data = data;
            data.truncate(data.len() / 16 * 16);
            let key = &key[..key_len];
            let mut want = data.clone();
            let aes = Aes::new(key, ALG).unwrap();
            cbc_crate_decrypt(&aes, &iv, blocks_mut(&mut want).0);
            let mut ours = data.clone();
            let (blocks, _) = blocks_mut(&mut ours);
            aes.decrypt_with(Chain { blocks, iv: iv.into() });
            prop_assert_eq!(&ours, &want, "this CPU's backend");
            macro_rules! wide {
                ($($p:ty),*) => {$(
                    let mut ours = data.clone();
                    match &aes {
                        Aes::A128(c) => chain_on::<_, $p>(c, iv, &mut ours),
                        Aes::A192(c) => chain_on::<_, $p>(c, iv, &mut ours),
                        Aes::A256(c) => chain_on::<_, $p>(c, iv, &mut ours),
                    }
                    prop_assert_eq!(&ours, &want, "{} blocks a batch", <$p as Unsigned>::USIZE);
                )*};
            }
            wide!(U8, U30, U64);
        }
    }

    #[test]
    fn only_a_backend_over_32_blocks_wide_takes_the_own_chain() {
        let aes = Aes::new(&[7; 16], ALG).unwrap();
        let mut par = 0;
        aes.decrypt_with(ParBlocks(&mut par));
        let want = if par > 32 { CHAIN_FROM } else { usize::MAX };
        assert_eq!(chain_from(&aes), want, "{par} blocks a batch");
    }

    #[test]
    fn decryption_either_side_of_the_chain_length_is_cbc() {
        // 1008, 1024 and 1040 bytes: the cbc crate below CHAIN_FROM, the
        // own chain from it (on VAES-512), one IV chain throughout.
        let key = [3u8; 32];
        let rc = Aes256::new_from_slice(&key).unwrap();
        for imp in Mode::CbcDecrypt.candidates() {
            let cbc = Cbc::with_implementation(&key, *imp).unwrap();
            for len in [CHAIN_FROM - 16, CHAIN_FROM, CHAIN_FROM + 16] {
                let data: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
                let mut want = data.clone();
                let (blocks, _) = blocks_mut(&mut want);
                Decryptor::<&Aes256>::inner_iv_init(&rc, &[1; 16].into()).decrypt_blocks(blocks);
                let mut got = data.clone();
                cbc.decrypt(&[1; 16], &mut got).unwrap();
                assert_eq!(got, want, "{imp:?} {len}");
            }
        }
    }
}
