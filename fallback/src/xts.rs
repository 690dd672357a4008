//! AES-XTS (IEEE Std 1619, NIST SP 800-38E) with ciphertext stealing.
//!
//! Written on the `aes` crate's parallel block API rather than on `xts-mode`:
//! one backend call covers a whole request (every data unit in it), the
//! tweaks for a batch of blocks are computed and XORed in the same pass, and
//! the batch is encrypted with the widest instructions the CPU has (64 blocks
//! per call with VAES-512). `xts-mode` calls the cipher once per 16-byte block
//! and runs at 0.27 GB/s here; this module's numbers are in the crate README.

use aes::Aes128;
use cipher::array::{Array, ArraySize};
use cipher::consts::U16;
use cipher::{
    BlockCipherDecBackend, BlockCipherDecClosure, BlockCipherEncBackend, BlockCipherEncClosure,
    BlockSizeUser,
};

use subtle::ConstantTimeEq;

use crate::block_cipher::{Aes, KeySize, blocks_mut};
use crate::choice::{self, Choice, Mode};
use crate::{Error, Implementation, LengthRule};

pub(crate) type Block = cipher::Block<Aes128>;

const ALG: &str = "AES-XTS";

/// How many data units' initial tweaks are encrypted in one batch.
const TWEAK_BATCH: usize = 64;

/// An AES-XTS key: the data key (Key1) and the tweak key (Key2).
///
/// The tweak is the 16-byte value IEEE 1619 calls the data-unit sequence
/// number, as a little-endian 128-bit integer — what the Linux `xts(aes)`
/// transform, OpenSSL and dm-crypt's `plain64` IV take.
///
/// Two implementations: this crate's, on RustCrypto's `aes` (every key
/// size, every length), and with the `aws-lc` feature AWS-LC's XTS-AES-256
/// (`crypto_offload_native::Xts256`); which runs a request is chosen per
/// size class by measurement ([`choice`]). Both give the same bytes.
pub struct Xts {
    data: Aes,
    tweak: Aes,
    /// AWS-LC's single-block AES for lone units under [`SHORT_MAX`] bytes
    /// ([`SHORT_MAX_BESIDE_EVP`] beside `evp`), when the choice gives small
    /// requests to AWS-LC.
    #[cfg(feature = "aws-lc")]
    short: Option<crate::aws_lc::XtsShort>,
    /// AWS-LC's XTS, when the key is XTS-AES-256 and the choice takes it
    /// for some size class.
    #[cfg(feature = "aws-lc")]
    evp: Option<crypto_offload_native::Xts256>,
    choice: Choice,
}

impl core::fmt::Debug for Xts {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Xts")
            .field("key_size", &self.key_size())
            .field("choice", &self.choice())
            .finish_non_exhaustive()
    }
}

impl Xts {
    /// The build's preferred implementation, which [`Xts::new`] keeps
    /// unless another measures clearly faster on this machine
    /// ([`choice::default_choice`]).
    pub const DEFAULT_IMPLEMENTATION: Implementation = choice::default_choice(Mode::Xts).small;

    /// Expands a 32-, 48- or 64-byte key (Key1 ‖ Key2) for XTS-AES-128,
    /// -192 or -256, on the implementations measured fastest on this
    /// machine, per size class ([`choice::measured`]: the first key in a
    /// process measures them, 1–4 ms).
    ///
    /// # Errors
    /// [`Error::KeyLength`] for any other length; [`Error::XtsWeakKey`] when
    /// the two halves are equal.
    pub fn new(key: &[u8]) -> Result<Self, Error> {
        Self::with_choice(key, choice::measured(Mode::Xts))
    }

    /// Expands a key for a chosen implementation.
    ///
    /// # Errors
    /// As for [`Xts::new`]; [`Error::Unavailable`] for ring (no XTS) and
    /// for AWS-LC with a key that is not XTS-AES-256.
    pub fn with_implementation(key: &[u8], imp: Implementation) -> Result<Self, Error> {
        let unavailable = Error::Unavailable {
            alg: ALG,
            implementation: imp,
        };
        let xts = Self::with_choice(key, Choice::one(imp))?;
        if xts.choice() == Choice::one(imp) {
            Ok(xts)
        } else {
            Err(unavailable)
        }
    }

    /// Expands a key for `choice` (one implementation for small requests,
    /// one for large). One that cannot run this key (AWS-LC and a key that
    /// is not XTS-AES-256, ring) runs it on RustCrypto.
    ///
    /// # Errors
    /// As for [`Xts::new`].
    pub fn with_choice(key: &[u8], choice: Choice) -> Result<Self, Error> {
        if !matches!(key.len(), 32 | 48 | 64) {
            return Err(Error::KeyLength {
                alg: ALG,
                len: key.len(),
                expected: "32, 48 or 64 bytes (two AES keys)",
            });
        }
        let (k1, k2) = key.split_at(key.len() / 2);
        if bool::from(k1.ct_eq(k2)) {
            return Err(Error::XtsWeakKey);
        }
        #[cfg(feature = "aws-lc")]
        let evp = match <&[u8; 64]>::try_from(key) {
            Ok(key) if [choice.small, choice.large].contains(&Implementation::AwsLc) => Some(
                crypto_offload_native::Xts256::new(key)
                    .map_err(|_| Error::ImplementationFailure(Implementation::AwsLc))?,
            ),
            _ => None,
        };
        #[cfg(feature = "aws-lc")]
        let short_unit_key = match choice.small {
            Implementation::AwsLc => Some(crate::aws_lc::XtsShort::new(k1, k2, ALG)?),
            _ => None,
        };
        let runs = |imp| match imp {
            #[cfg(feature = "aws-lc")]
            Implementation::AwsLc if evp.is_some() => imp,
            _ => Implementation::RustCrypto,
        };
        let choice = Choice {
            small: runs(choice.small),
            large: runs(choice.large),
            ..choice
        };
        Ok(Xts {
            data: Aes::new(k1, ALG)?,
            tweak: Aes::new(k2, ALG)?,
            #[cfg(feature = "aws-lc")]
            short: short_unit_key,
            #[cfg(feature = "aws-lc")]
            evp,
            choice,
        })
    }

    /// The implementations this key runs small and large requests on.
    pub fn choice(&self) -> Choice {
        self.choice
    }

    /// The implementation a `len`-byte request runs on (a request whose
    /// data units are over 2^20 blocks, which AWS-LC refuses as IEEE
    /// 1619-2018 and NIST SP 800-38E do, runs on RustCrypto whatever this
    /// says).
    pub fn implementation_for(&self, len: usize) -> Implementation {
        #[cfg(feature = "aws-lc")]
        if self.short_for(len).is_some() {
            return Implementation::AwsLc;
        }
        self.choice.for_len(len)
    }

    /// The size of each of the two AES keys.
    pub fn key_size(&self) -> KeySize {
        self.data.key_size()
    }

    /// Encrypts one data unit (the whole of `data`, at least 16 bytes) in place.
    ///
    /// # Errors
    /// [`Error::DataLength`] when `data` is shorter than 16 bytes.
    pub fn encrypt(&self, tweak: &[u8; 16], data: &mut [u8]) -> Result<(), Error> {
        self.encrypt_units(tweak, data.len(), data)
    }

    /// Decrypts one data unit in place. See [`Xts::encrypt`].
    ///
    /// # Errors
    /// [`Error::DataLength`] when `data` is shorter than 16 bytes.
    pub fn decrypt(&self, tweak: &[u8; 16], data: &mut [u8]) -> Result<(), Error> {
        self.decrypt_units(tweak, data.len(), data)
    }

    /// Encrypts consecutive data units of `unit_len` bytes in place; unit `i`
    /// uses tweak `first_tweak + i` (128-bit little-endian, wrapping), the way
    /// dm-crypt encrypts a run of sectors.
    ///
    /// # Errors
    /// [`Error::DataLength`] when `unit_len` is below 16 or does not divide
    /// `data.len()` (an empty `data` is fine only with a valid unit length).
    #[inline]
    pub fn encrypt_units(
        &self,
        first_tweak: &[u8; 16],
        unit_len: usize,
        data: &mut [u8],
    ) -> Result<(), Error> {
        check_units(unit_len, data.len())?;
        #[cfg(feature = "aws-lc")]
        if let Some(short) = self.short_for(data.len()) {
            short.run(short.tweak(first_tweak), data, Direction::Encrypt);
            return Ok(());
        }
        #[cfg(feature = "aws-lc")]
        if let Some(evp) = self.evp_for(unit_len, data.len()) {
            return evp
                .encrypt_units(first_tweak, unit_len, data)
                .map_err(|_| Error::ImplementationFailure(Implementation::AwsLc));
        }
        self.run(first_tweak, unit_len, data, Direction::Encrypt)
    }

    /// Decrypts consecutive data units in place. See [`Xts::encrypt_units`].
    ///
    /// # Errors
    /// As for [`Xts::encrypt_units`].
    #[inline]
    pub fn decrypt_units(
        &self,
        first_tweak: &[u8; 16],
        unit_len: usize,
        data: &mut [u8],
    ) -> Result<(), Error> {
        check_units(unit_len, data.len())?;
        #[cfg(feature = "aws-lc")]
        if let Some(short) = self.short_for(data.len()) {
            short.run(short.tweak(first_tweak), data, Direction::Decrypt);
            return Ok(());
        }
        #[cfg(feature = "aws-lc")]
        if let Some(evp) = self.evp_for(unit_len, data.len()) {
            return evp
                .decrypt_units(first_tweak, unit_len, data)
                .map_err(|_| Error::ImplementationFailure(Implementation::AwsLc));
        }
        self.run(first_tweak, unit_len, data, Direction::Decrypt)
    }

    /// AWS-LC's single-block AES, if it runs a `len`-byte request: a lone
    /// unit (shorter than two blocks, so one unit) when small requests go
    /// to AWS-LC.
    #[cfg(feature = "aws-lc")]
    #[inline]
    fn short_for(&self, len: usize) -> Option<&crate::aws_lc::XtsShort> {
        let max = match self.evp {
            Some(_) => SHORT_MAX_BESIDE_EVP,
            None => SHORT_MAX,
        };
        self.short.as_ref().filter(|_| (16..max).contains(&len))
    }

    /// AWS-LC's XTS, if it runs a `len`-byte request of `unit_len`-byte
    /// units (its data units stop at 2^20 blocks; longer ones run here).
    #[cfg(feature = "aws-lc")]
    #[inline]
    fn evp_for(&self, unit_len: usize, len: usize) -> Option<&crypto_offload_native::Xts256> {
        match &self.evp {
            Some(evp)
                if self.choice.for_len(len) == Implementation::AwsLc
                    && unit_len <= crypto_offload_native::Xts256::MAX_UNIT =>
            {
                Some(evp)
            }
            _ => None,
        }
    }

    fn run(
        &self,
        first_tweak: &[u8; 16],
        unit_len: usize,
        data: &mut [u8],
        dir: Direction,
    ) -> Result<(), Error> {
        if data.len() == unit_len {
            // One unit: no batch arrays.
            // The tweak on AWS-LC's single-block AES where this key has it
            // (one `aes`-crate call less: ~50 ns on VAES-512 machines).
            #[cfg(feature = "aws-lc")]
            let t0 = match &self.short {
                Some(short) => short.tweak(first_tweak),
                None => self.first_tweak(first_tweak),
            };
            #[cfg(not(feature = "aws-lc"))]
            let t0 = self.first_tweak(first_tweak);
            self.data_pass(data, unit_len, &[t0], dir);
            return Ok(());
        }
        let mut sector = u128::from_le_bytes(*first_tweak);
        let mut tweaks = [Block::default(); TWEAK_BATCH];
        let mut t0 = [0u128; TWEAK_BATCH];
        for group in data.chunks_mut(unit_len.saturating_mul(TWEAK_BATCH)) {
            let units = group.len() / unit_len;
            // Encrypt every unit's sequence number with Key2 in one call.
            for t in &mut tweaks[..units] {
                *t = sector.to_le_bytes().into();
                sector = sector.wrapping_add(1);
            }
            self.tweak.encrypt_with(cipher_blocks(&mut tweaks[..units]));
            for (t, b) in t0.iter_mut().zip(&tweaks[..units]) {
                *t = u128::from_le_bytes(b.0);
            }
            self.data_pass(group, unit_len, &t0[..units], dir);
        }
        Ok(())
    }

    /// `T0` of a lone unit: its sequence number encrypted with Key2.
    fn first_tweak(&self, sector: &[u8; 16]) -> u128 {
        let mut t0 = Block::from(*sector);
        self.tweak
            .encrypt_with(cipher_blocks(core::slice::from_mut(&mut t0)));
        u128::from_le_bytes(t0.0)
    }

    fn data_pass(&self, data: &mut [u8], unit_len: usize, tweaks: &[u128], dir: Direction) {
        let job = Units {
            data,
            unit_len,
            tweaks,
        };
        match dir {
            Direction::Encrypt => self.data.encrypt_with(job),
            Direction::Decrypt => self.data.decrypt_with(job),
        }
    }
}

/// The `aes` crate spends ~50 ns per call broadcasting round keys on
/// VAES-512 machines (~100 on an Intel Xeon, family 6 model 207), and XTS
/// makes two calls (Key2 for the tweak, Key1 for the data): 170–200 ns for
/// a 16-byte unit. With the `aws-lc` feature the single-block tweak
/// encryption of a lone unit runs on AWS-LC's AES (`AES_encrypt` through
/// `crypto_offload_native::AesEncryptBlock`, ~16 ns a block), and when
/// small requests go to AWS-LC so does the whole of a unit shorter than
/// this (~100 ns for 17–31 bytes, three blocks one after another),
/// where the key has no AWS-LC XTS (XTS-AES-128 and -192).
#[cfg(feature = "aws-lc")]
const SHORT_MAX: usize = 32;

/// [`SHORT_MAX`] for a key that AWS-LC's EVP XTS also runs (XTS-AES-256):
/// only a unit of one whole block. With ciphertext stealing (17–31 bytes)
/// EVP XTS is ahead, 82–88 ns through `crypto_offload_native::Xts256`
/// against ~100 (its AES rounds for the blocks overlap; one call a block
/// does not). At 16 bytes the two benches disagree, on the Xeon above,
/// with `Xts256` on per-thread contexts: `paired --group xts-256 --sizes
/// 16 --all` had EVP XTS ahead (47.3–49.7 ns against 52.5–56.4), but the
/// session API's path (`benches/paired-layouts 8 --bin session-overhead
/// --only xts-256 --sizes 16,64`, means over 8 layouts) took 58.0 ns a
/// request on single blocks against 79.7 on EVP XTS (direct calls 35.2
/// against 45.5; 64 B, on EVP XTS in both, 91.0 and 97.3). The path users
/// call decides: a lone block stays on single-block AES.
#[cfg(feature = "aws-lc")]
const SHORT_MAX_BESIDE_EVP: usize = 17;

#[derive(Clone, Copy)]
pub(crate) enum Direction {
    Encrypt,
    Decrypt,
}

#[inline(always)]
fn check_units(unit_len: usize, len: usize) -> Result<(), Error> {
    // A lone unit (the usual request) passes without a division (5 ns or
    // more: a tenth of a short request).
    if unit_len == len && len >= 16 {
        return Ok(());
    }
    check_units_slow(unit_len, len)
}

fn check_units_slow(unit_len: usize, len: usize) -> Result<(), Error> {
    let rule = if unit_len < 16 {
        if unit_len == len {
            LengthRule::AtLeastOneBlock
        } else {
            LengthRule::DataUnitTooSmall
        }
    } else if !len.is_multiple_of(unit_len) {
        LengthRule::MultipleOfDataUnit(unit_len)
    } else {
        return Ok(());
    };
    Err(Error::DataLength {
        alg: ALG,
        len,
        rule,
    })
}

/// Multiplies a tweak by the primitive element α of GF(2^128) (IEEE 1619
/// §5.2: little-endian, reduction polynomial x^128 + x^7 + x^2 + x + 1).
#[inline(always)]
fn mul_alpha(t: u128) -> u128 {
    (t << 1) ^ ((((t as i128) >> 127) as u128) & 0x87)
}

#[inline(always)]
fn xor_block(b: &mut Block, t: u128) {
    *b = (u128::from_le_bytes(b.0) ^ t).to_le_bytes().into();
}

/// A closure that encrypts a slice of blocks with the backend it is given.
fn cipher_blocks(blocks: &mut [Block]) -> PlainBlocks<'_> {
    PlainBlocks(blocks)
}

struct PlainBlocks<'a>(&'a mut [Block]);

impl BlockSizeUser for PlainBlocks<'_> {
    type BlockSize = U16;
}

impl BlockCipherEncClosure for PlainBlocks<'_> {
    #[inline(always)]
    fn call<B: BlockCipherEncBackend<BlockSize = U16>>(self, backend: &B) {
        let (chunks, tail) = Array::<Block, B::ParBlocksSize>::slice_as_chunks_mut(self.0);
        for chunk in chunks {
            backend.encrypt_par_blocks_inplace(chunk);
        }
        backend.encrypt_tail_blocks_inplace(tail);
    }
}

/// One backend call's worth of XTS work: equal-length data units, each with
/// its encrypted initial tweak `T0`.
pub(crate) struct Units<'a> {
    pub(crate) data: &'a mut [u8],
    pub(crate) unit_len: usize,
    pub(crate) tweaks: &'a [u128],
}

impl BlockSizeUser for Units<'_> {
    type BlockSize = U16;
}

/// The block-cipher operation of one direction, as XTS needs it: a batch of
/// `P` blocks at once, or a single block.
pub(crate) trait BlockOp<P: ArraySize> {
    fn par(&self, blocks: &mut Array<Block, P>);
    fn one(&self, block: &mut Block);
}

struct Enc<'b, B>(&'b B);
struct Dec<'b, B>(&'b B);

impl<B: BlockCipherEncBackend<BlockSize = U16>> BlockOp<B::ParBlocksSize> for Enc<'_, B> {
    #[inline(always)]
    fn par(&self, blocks: &mut Array<Block, B::ParBlocksSize>) {
        self.0.encrypt_par_blocks_inplace(blocks);
    }
    #[inline(always)]
    fn one(&self, block: &mut Block) {
        self.0.encrypt_block_inplace(block);
    }
}

impl<B: BlockCipherDecBackend<BlockSize = U16>> BlockOp<B::ParBlocksSize> for Dec<'_, B> {
    #[inline(always)]
    fn par(&self, blocks: &mut Array<Block, B::ParBlocksSize>) {
        self.0.decrypt_par_blocks_inplace(blocks);
    }
    #[inline(always)]
    fn one(&self, block: &mut Block) {
        self.0.decrypt_block_inplace(block);
    }
}

impl BlockCipherEncClosure for Units<'_> {
    #[inline(always)]
    fn call<B: BlockCipherEncBackend<BlockSize = U16>>(self, backend: &B) {
        self.process(&Enc(backend), Direction::Encrypt);
    }
}

impl BlockCipherDecClosure for Units<'_> {
    #[inline(always)]
    fn call<B: BlockCipherDecBackend<BlockSize = U16>>(self, backend: &B) {
        self.process(&Dec(backend), Direction::Decrypt);
    }
}

impl Units<'_> {
    #[inline(always)]
    pub(crate) fn process<P: ArraySize>(self, op: &impl BlockOp<P>, dir: Direction) {
        if self.unit_len.is_multiple_of(16) {
            // Every unit is whole blocks: one stream of blocks whose tweak
            // restarts at each unit boundary, so batches span units.
            let (blocks, _) = blocks_mut(self.data);
            bulk(
                op,
                blocks,
                &mut Tweaks::new(self.tweaks, self.unit_len / 16),
            );
            return;
        }
        // Ciphertext stealing in every unit.
        let full = self.unit_len / 16;
        for (unit, t0) in self.data.chunks_exact_mut(self.unit_len).zip(self.tweaks) {
            let (head, last) = unit.split_at_mut((full - 1) * 16);
            let (head, _) = blocks_mut(head);
            let mut tweaks = Tweaks::new(core::slice::from_ref(t0), full + 1);
            bulk(op, head, &mut tweaks);
            let t_last_full = tweaks.next();
            let t_partial = tweaks.next();
            steal(op, last, t_last_full, t_partial, dir);
        }
    }
}

/// The tweaks of a run of blocks: `T0` of each unit, then `T0·α^j`.
///
/// Doubling is a serial chain (each tweak needs the previous one), which
/// costs ~3 cycles a block. Past the first 8 blocks of a unit, each tweak is
/// instead made from the one 8 blocks back (`T·α^8`): 8 independent chains
/// the CPU runs side by side.
struct Tweaks<'a> {
    units: core::slice::Iter<'a, u128>,
    unit_blocks: usize,
    /// Blocks left in the current unit (0: the next block starts a unit).
    left: usize,
    /// The tweak of the block before the next one.
    prev: u128,
}

impl<'a> Tweaks<'a> {
    fn new(units: &'a [u128], unit_blocks: usize) -> Self {
        Tweaks {
            units: units.iter(),
            unit_blocks,
            left: 0,
            prev: 0,
        }
    }

    /// The next block's tweak.
    #[inline(always)]
    fn next(&mut self) -> u128 {
        let mut one = [0u128];
        self.fill(&mut one);
        one[0]
    }

    /// Fills `ts` with the tweaks of the next `ts.len()` blocks.
    #[inline(always)]
    fn fill(&mut self, ts: &mut [u128]) {
        let mut i = 0;
        while i < ts.len() {
            let first = if self.left == 0 {
                self.left = self.unit_blocks;
                self.units.next().copied().unwrap_or(0)
            } else {
                mul_alpha(self.prev)
            };
            let seg = &mut ts[i..];
            let n = seg.len().min(self.left);
            let seg = &mut seg[..n];
            seg[0] = first;
            let serial = n.min(8);
            for j in 1..serial {
                seg[j] = mul_alpha(seg[j - 1]);
            }
            for j in 8..n {
                seg[j] = mul_alpha8(seg[j - 8]);
            }
            self.prev = seg[n - 1];
            self.left -= n;
            i += n;
        }
    }
}

/// Multiplies a tweak by α^8: shift a byte and fold the byte that fell off
/// back in with the reduction polynomial (0x87 = x^7 + x^2 + x + 1).
#[inline(always)]
fn mul_alpha8(t: u128) -> u128 {
    (t << 8) ^ u128::from(FOLD8[(t >> 120) as usize])
}

/// `FOLD8[h]` = h · (x^7 + x^2 + x + 1) carry-less: what the byte `h`
/// shifted out of the top contributes back at the bottom.
const FOLD8: [u16; 256] = {
    let mut t = [0u16; 256];
    let mut h = 0;
    while h < 256 {
        let v = h as u16;
        t[h] = v ^ (v << 1) ^ (v << 2) ^ (v << 7);
        h += 1;
    }
    t
};

/// XTS over whole blocks with tweaks from `tweaks`.
#[inline(always)]
fn bulk<P: ArraySize>(op: &impl BlockOp<P>, blocks: &mut [Block], tweaks: &mut Tweaks<'_>) {
    let (chunks, tail) = Array::<Block, P>::slice_as_chunks_mut(blocks);
    if tail.len() < padded_tail_min(P::USIZE) && chunks.is_empty() {
        // A few blocks: no batch buffers at all.
        for b in tail.iter_mut() {
            let t = tweaks.next();
            xor_block(b, t);
            op.one(b);
            xor_block(b, t);
        }
        return;
    }
    let mut ts = Array::<u128, P>::default();
    for chunk in chunks {
        tweaks.fill(&mut ts);
        for (b, &t) in chunk.iter_mut().zip(ts.iter()) {
            xor_block(b, t);
        }
        op.par(chunk);
        for (b, &t) in chunk.iter_mut().zip(ts.iter()) {
            xor_block(b, t);
        }
    }
    if tail.is_empty() {
        return;
    }
    let ts = &mut ts[..tail.len()];
    tweaks.fill(ts);
    for (b, &t) in tail.iter_mut().zip(ts.iter()) {
        xor_block(b, t);
    }
    if tail.len() >= padded_tail_min(P::USIZE) {
        // Pad to a whole batch: the wide instructions on a partly empty
        // batch beat a loop of single-block calls.
        let mut pad = Array::<Block, P>::default();
        pad[..tail.len()].copy_from_slice(tail);
        op.par(&mut pad);
        tail.copy_from_slice(&pad[..tail.len()]);
    } else {
        for b in tail.iter_mut() {
            op.one(b);
        }
    }
    for (b, &t) in tail.iter_mut().zip(ts.iter()) {
        xor_block(b, t);
    }
}

/// Below this many blocks, the tail of a request is done block by block
/// rather than as one padded batch of `par` blocks: a padded batch costs as
/// much as a full one, single blocks about half a batch slot each (measured
/// with VAES-512, `par` = 64, and AES-NI, `par` = 8).
pub(crate) const fn padded_tail_min(par: usize) -> usize {
    if par / 2 > 4 { par / 2 } else { 4 }
}

/// The last full block and the partial block of a unit (`last` is 17..=31
/// bytes), with the tweaks of the last full block and of the partial one.
#[inline(always)]
fn steal<P: ArraySize>(
    op: &impl BlockOp<P>,
    last: &mut [u8],
    t: u128,
    t_next: u128,
    dir: Direction,
) {
    let Some((full, part)) = last.split_first_chunk_mut::<16>() else {
        return;
    };
    let r = part.len();
    // Encryption uses T(m-1) then T(m); decryption the other way round.
    let (first_t, second_t) = match dir {
        Direction::Encrypt => (t, t_next),
        Direction::Decrypt => (t_next, t),
    };
    let mut cc: Block = (*full).into();
    xor_block(&mut cc, first_t);
    op.one(&mut cc);
    xor_block(&mut cc, first_t);
    // cc = CC (enc) or PP (dec). Swap in the partial block.
    let mut pp = cc;
    pp[..r].copy_from_slice(part);
    part.copy_from_slice(&cc[..r]);
    xor_block(&mut pp, second_t);
    op.one(&mut pp);
    xor_block(&mut pp, second_t);
    full.copy_from_slice(&pp);
}
