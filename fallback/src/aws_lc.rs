//! The aws-lc-rs halves of the modes that have one (feature `aws-lc`).

use aws_lc_rs::cipher::{
    AES_128, AES_192, AES_256, DecryptingKey, DecryptionContext, EncryptingKey, EncryptionContext,
    UnboundCipherKey,
};
use aws_lc_rs::error::Unspecified;
use aws_lc_rs::iv::FixedLength;

use core::cell::Cell;

use cipher::array::Array;
use cipher::consts::U1;

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

/// AES-XTS for one short data unit, block by block on AWS-LC's AES-ECB (see
/// `xts::SHORT_MAX` for why).
pub(crate) struct XtsShort {
    data_enc: EncryptingKey,
    data_dec: DecryptingKey,
    tweak: EncryptingKey,
}

impl XtsShort {
    pub(crate) fn new(k1: &[u8], k2: &[u8], alg: &'static str) -> Result<Self, Error> {
        let size = KeySize::from_len(k1.len()).ok_or(Error::KeyLength {
            alg,
            len: k1.len() * 2,
            expected: "32, 48 or 64 bytes (two AES keys)",
        })?;
        Ok(XtsShort {
            data_enc: cipher_key(k1, size, alg, EncryptingKey::ecb)?,
            data_dec: cipher_key(k1, size, alg, DecryptingKey::ecb)?,
            tweak: cipher_key(k2, size, alg, EncryptingKey::ecb)?,
        })
    }

    /// `T0`: the sequence number encrypted with Key2.
    pub(crate) fn tweak(&self, sector: &[u8; 16]) -> Result<u128, Error> {
        let mut t0 = *sector;
        self.tweak
            .less_safe_encrypt(&mut t0, EncryptionContext::None)
            .map_err(failure)?;
        Ok(u128::from_le_bytes(t0))
    }

    /// One whole data unit, given its `T0`.
    pub(crate) fn run(&self, t0: u128, data: &mut [u8], dir: Direction) -> Result<(), Error> {
        let op = Ecb {
            enc: &self.data_enc,
            dec: &self.data_dec,
            dir,
            failed: Cell::new(false),
        };
        let unit_len = data.len();
        Units {
            data,
            unit_len,
            tweaks: &[t0],
        }
        .process(&op, dir);
        if op.failed.get() {
            return Err(Error::ImplementationFailure(Implementation::AwsLc));
        }
        Ok(())
    }
}

/// AWS-LC's single-block AES as the XTS block operation; a failure (never
/// seen: a 16-byte block is always valid) is recorded and reported.
struct Ecb<'a> {
    enc: &'a EncryptingKey,
    dec: &'a DecryptingKey,
    dir: Direction,
    failed: Cell<bool>,
}

impl BlockOp<U1> for Ecb<'_> {
    fn par(&self, blocks: &mut Array<Block, U1>) {
        self.one(&mut blocks[0]);
    }

    fn one(&self, block: &mut Block) {
        let ok = match self.dir {
            Direction::Encrypt => self
                .enc
                .less_safe_encrypt(&mut block.0, EncryptionContext::None)
                .is_ok(),
            Direction::Decrypt => self
                .dec
                .decrypt(&mut block.0, DecryptionContext::None)
                .is_ok(),
        };
        if !ok {
            self.failed.set(true);
        }
    }
}
