//! The aws-lc-rs halves of the modes that have one (feature `aws-lc`).

use aws_lc_rs::cipher::{
    AES_128, AES_192, AES_256, DecryptingKey, DecryptionContext, EncryptingKey, EncryptionContext,
    UnboundCipherKey,
};
use aws_lc_rs::error::Unspecified;
use aws_lc_rs::iv::FixedLength;

use cipher::array::Array;
use cipher::consts::U1;

use crypto_offload_native::{AesDecryptBlock, AesEncryptBlock};

use crate::block_cipher::KeySize;
use crate::xts::{Block, BlockOp, Direction, Units};
use crate::{Error, Implementation};

fn failure(_: Unspecified) -> Error {
    Error::ImplementationFailure(Implementation::AwsLc)
}

/// Builds an aws-lc cipher key of the given mode (`EncryptingKey::ctr`, …).
pub(crate) fn cipher_key<K>(
    key: &[u8],
    size: KeySize,
    alg: &'static str,
    mode: fn(UnboundCipherKey) -> Result<K, Unspecified>,
) -> Result<K, Error> {
    let algorithm = match size {
        KeySize::Aes128 => &AES_128,
        KeySize::Aes192 => &AES_192,
        KeySize::Aes256 => &AES_256,
    };
    let err = |_| Error::KeyLength {
        alg,
        len: key.len(),
        expected: "16, 24 or 32 bytes",
    };
    mode(UnboundCipherKey::new(algorithm, key).map_err(err)?).map_err(err)
}

/// Encrypts `data` in place with a 16-byte IV (CTR or CBC by the key's mode).
pub(crate) fn encrypt_with_iv(
    key: &EncryptingKey,
    iv: &[u8; 16],
    data: &mut [u8],
) -> Result<(), Error> {
    let ctx = EncryptionContext::Iv128(FixedLength::from(*iv));
    key.less_safe_encrypt(data, ctx).map(drop).map_err(failure)
}

/// Decrypts `data` in place with a 16-byte IV.
pub(crate) fn decrypt_with_iv(
    key: &DecryptingKey,
    iv: &[u8; 16],
    data: &mut [u8],
) -> Result<(), Error> {
    let ctx = DecryptionContext::Iv128(FixedLength::from(*iv));
    key.decrypt(data, ctx).map(drop).map_err(failure)
}

/// AES-XTS for one short data unit, block by block on AWS-LC's single-block
/// AES (`crypto_offload_native::AesEncryptBlock`; see `xts::SHORT_MAX` for
/// why).
pub(crate) struct XtsShort {
    data_enc: AesEncryptBlock,
    data_dec: AesDecryptBlock,
    tweak: AesEncryptBlock,
}

impl XtsShort {
    pub(crate) fn new(k1: &[u8], k2: &[u8], alg: &'static str) -> Result<Self, Error> {
        let err = |_| Error::KeyLength {
            alg,
            len: k1.len() * 2,
            expected: "32, 48 or 64 bytes (two AES keys)",
        };
        Ok(XtsShort {
            data_enc: AesEncryptBlock::new(k1).map_err(err)?,
            data_dec: AesDecryptBlock::new(k1).map_err(err)?,
            tweak: AesEncryptBlock::new(k2).map_err(err)?,
        })
    }

    /// `T0`: the sequence number encrypted with Key2.
    #[inline]
    pub(crate) fn tweak(&self, sector: &[u8; 16]) -> u128 {
        let mut t0 = *sector;
        self.tweak.encrypt(&mut t0);
        u128::from_le_bytes(t0)
    }

    /// One whole data unit, given its `T0`.
    #[inline]
    pub(crate) fn run(&self, t0: u128, data: &mut [u8], dir: Direction) {
        let unit_len = data.len();
        let units = Units {
            data,
            unit_len,
            tweaks: &[t0],
        };
        match dir {
            Direction::Encrypt => units.process(&Ecb::Enc(&self.data_enc), dir),
            Direction::Decrypt => units.process(&Ecb::Dec(&self.data_dec), dir),
        }
    }
}

/// AWS-LC's single-block AES as the XTS block operation.
enum Ecb<'a> {
    Enc(&'a AesEncryptBlock),
    Dec(&'a AesDecryptBlock),
}

impl BlockOp<U1> for Ecb<'_> {
    #[inline]
    fn par(&self, blocks: &mut Array<Block, U1>) {
        self.one(&mut blocks[0]);
    }

    #[inline]
    fn one(&self, block: &mut Block) {
        match self {
            Ecb::Enc(k) => k.encrypt(&mut block.0),
            Ecb::Dec(k) => k.decrypt(&mut block.0),
        }
    }
}
