//! The independent references: RustCrypto's `ctr`, `cbc`, `xts-mode`,
//! `aes-gcm` and the `crc` crate, called directly, never through
//! crypto-offload or its fallback crate. (The fallback itself uses `aes` and
//! `aes-gcm` inside some of its modes; the modes here are RustCrypto's own
//! mode crates, and the CRCs the `crc` crate's plain bytewise table, not the
//! fallback's slicing-by-16 tables or crc-fast's folding.)

use aes::{Aes128, Aes192, Aes256};
use cipher::{BlockModeDecrypt, BlockModeEncrypt, KeyInit, KeyIvInit, StreamCipher};
use crypto_offload::{CipherAlg, CipherMode, CrcAlg};

/// AES-CTR with the whole 128-bit block as a big-endian counter.
pub fn ctr(key: &[u8], iv: &[u8; 16], data: &mut [u8]) {
    match key.len() {
        16 => ctr::Ctr128BE::<Aes128>::new_from_slices(key, iv)
            .expect("16-byte key")
            .apply_keystream(data),
        24 => ctr::Ctr128BE::<Aes192>::new_from_slices(key, iv)
            .expect("24-byte key")
            .apply_keystream(data),
        32 => ctr::Ctr128BE::<Aes256>::new_from_slices(key, iv)
            .expect("32-byte key")
            .apply_keystream(data),
        n => unreachable!("no AES key of {n} bytes"),
    }
}

/// AES-CBC without padding; `data` is whole blocks.
pub fn cbc(key: &[u8], iv: &[u8; 16], data: &mut [u8], encrypt: bool) {
    let (blocks, rest) = data.as_chunks_mut::<16>();
    assert!(rest.is_empty(), "the CBC reference takes whole blocks");
    let blocks = cipher::array::Array::cast_slice_from_core_mut(blocks);
    macro_rules! go {
        ($c:ty) => {
            if encrypt {
                cbc::Encryptor::<$c>::new_from_slices(key, iv)
                    .expect("key length")
                    .encrypt_blocks(blocks)
            } else {
                cbc::Decryptor::<$c>::new_from_slices(key, iv)
                    .expect("key length")
                    .decrypt_blocks(blocks)
            }
        };
    }
    match key.len() {
        16 => go!(Aes128),
        24 => go!(Aes192),
        32 => go!(Aes256),
        n => unreachable!("no AES key of {n} bytes"),
    }
}

/// One XTS data unit (≥ 16 bytes) with `tweak` (IEEE 1619: the data-unit
/// number, 128-bit little-endian); `key` is Key1 ‖ Key2.
pub fn xts_unit(key: &[u8], tweak: [u8; 16], data: &mut [u8], encrypt: bool) {
    let (k1, k2) = key.split_at(key.len() / 2);
    macro_rules! go {
        ($c:ty) => {{
            let x = xts_mode::Xts128::new(
                <$c>::new_from_slice(k1).expect("key half"),
                <$c>::new_from_slice(k2).expect("key half"),
            );
            if encrypt {
                x.encrypt_sector(data, tweak.into())
            } else {
                x.decrypt_sector(data, tweak.into())
            }
        }};
    }
    match k1.len() {
        16 => go!(Aes128),
        24 => go!(Aes192),
        32 => go!(Aes256),
        n => unreachable!("no AES key of {n} bytes"),
    }
}

/// Consecutive XTS data units of `unit` bytes, unit `i` with tweak
/// `first + i` (128-bit little-endian, wrapping), as dm-crypt does a run of
/// sectors.
pub fn xts_units(key: &[u8], first: &[u8; 16], unit: usize, data: &mut [u8], encrypt: bool) {
    let first = u128::from_le_bytes(*first);
    for (i, chunk) in data.chunks_mut(unit).enumerate() {
        let tweak = first.wrapping_add(i as u128).to_le_bytes();
        xts_unit(key, tweak, chunk, encrypt);
    }
}

/// `alg` over `data` in place, in whole data units of `unit` for XTS (the
/// caller has checked the lengths).
pub fn cipher(alg: CipherAlg, key: &[u8], iv: &[u8; 16], unit: usize, data: &mut [u8], enc: bool) {
    match alg.mode() {
        CipherMode::Cbc => cbc(key, iv, data, enc),
        CipherMode::Ctr => ctr(key, iv, data),
        CipherMode::Xts => xts_units(key, iv, unit, data, enc),
        m => unreachable!("a new cipher mode needs a reference: {m:?}"),
    }
}

macro_rules! gcm_dispatch {
    ($key:expr, |$g:ident| $body:expr) => {{
        use aes_gcm::KeyInit as _;
        match $key.len() {
            16 => {
                let $g = aes_gcm::Aes128Gcm::new_from_slice($key).expect("key length");
                $body
            }
            24 => {
                let $g = aes_gcm::AesGcm::<Aes192, cipher::consts::U12>::new_from_slice($key)
                    .expect("key length");
                $body
            }
            32 => {
                let $g = aes_gcm::Aes256Gcm::new_from_slice($key).expect("key length");
                $body
            }
            n => unreachable!("no AES key of {n} bytes"),
        }
    }};
}

/// AES-GCM seal in place: the tag.
pub fn gcm_seal(key: &[u8], nonce: &[u8; 12], aad: &[u8], data: &mut [u8]) -> [u8; 16] {
    use aes_gcm::aead::AeadInOut;
    gcm_dispatch!(key, |g| g
        .encrypt_inout_detached(&(*nonce).into(), aad, data.into())
        .expect("GCM seal")
        .into())
}

/// AES-GCM open of `sealed` = ciphertext ‖ tag: the plaintext, or `None`
/// when the tag does not verify or `sealed` is shorter than a tag.
pub fn gcm_open(key: &[u8], nonce: &[u8; 12], aad: &[u8], sealed: &[u8]) -> Option<Vec<u8>> {
    use aes_gcm::aead::AeadInOut;
    let split = sealed.len().checked_sub(16)?;
    let (ct, tag) = sealed.split_at(split);
    let tag: [u8; 16] = tag.try_into().ok()?;
    let mut pt = ct.to_vec();
    let ok = gcm_dispatch!(key, |g| g
        .decrypt_inout_detached(&(*nonce).into(), aad, pt.as_mut_slice().into(), &tag.into())
        .is_ok());
    ok.then_some(pt)
}

/// A streaming reference CRC (the `crc` crate, bytewise table).
#[derive(Clone)]
pub enum CrcRef {
    /// CRC-32/ISO-HDLC or CRC-32/ISCSI.
    W32(crc::Digest<'static, u32>),
    /// The CRC-64s.
    W64(crc::Digest<'static, u64>),
}

static CRC32_ISO_HDLC: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISO_HDLC);
static CRC32_ISCSI: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISCSI);
static CRC64_NVME: crc::Crc<u64> = crc::Crc::<u64>::new(&crc::CRC_64_NVME);
static CRC64_XZ: crc::Crc<u64> = crc::Crc::<u64>::new(&crc::CRC_64_XZ);
static CRC64_GO_ISO: crc::Crc<u64> = crc::Crc::<u64>::new(&crc::CRC_64_GO_ISO);

impl CrcRef {
    /// A CRC over no data.
    pub fn new(alg: CrcAlg) -> Self {
        match alg {
            CrcAlg::Crc32IsoHdlc => CrcRef::W32(CRC32_ISO_HDLC.digest()),
            CrcAlg::Crc32Iscsi => CrcRef::W32(CRC32_ISCSI.digest()),
            CrcAlg::Crc64Nvme => CrcRef::W64(CRC64_NVME.digest()),
            CrcAlg::Crc64Xz => CrcRef::W64(CRC64_XZ.digest()),
            CrcAlg::Crc64GoIso => CrcRef::W64(CRC64_GO_ISO.digest()),
            a => unreachable!("a new CrcAlg needs a reference here: {a:?}"),
        }
    }

    /// Feeds `data`.
    pub fn update(&mut self, data: &[u8]) {
        match self {
            CrcRef::W32(d) => d.update(data),
            CrcRef::W64(d) => d.update(data),
        }
    }

    /// The CRC so far (the digest goes on).
    pub fn value(&self) -> u64 {
        match self {
            CrcRef::W32(d) => u64::from(d.clone().finalize()),
            CrcRef::W64(d) => d.clone().finalize(),
        }
    }
}

/// The CRC of `data` in one call.
pub fn crc(alg: CrcAlg, data: &[u8]) -> u64 {
    let mut r = CrcRef::new(alg);
    r.update(data);
    r.value()
}
