//! The volume: a file of fixed-size blocks, each stored as AES-256-XTS
//! ciphertext with the CRC-32C of that ciphertext.
//!
//! ```text
//! offset 0      superblock (4 KiB): magic, format version (2), block size,
//!               blocks, key check, clean flag, generation, CRC-32C of the
//!               superblock
//! 4096 + (2·block + s)·(32 + block_size)
//!               slot s ∈ {0, 1} of block `block`: a 32-byte header
//!               (magic, CRC-32C of the ciphertext, sequence number, block
//!               number) and the ciphertext
//! ```
//!
//! **A tweak per write.** The XTS tweak of a write is its block number
//! (low 8 bytes, little-endian) and its sequence number (high 8 bytes), so
//! no two writes of any block share a tweak: two versions of a block, even
//! of the same data, are unrelated ciphertexts, and a snapshot of the file
//! taken between them does not show which 16-byte pieces changed. A
//! block's sequence numbers increase with each write; each open of the
//! volume starts a new generation (counted in the superblock), and a write
//! takes a number at least `generation · 2³²`, so a number handed out
//! before a crash — by a write that never finished, or by one a power loss
//! took back — is never handed out again. (Version 1 of the format used
//! the block number alone, so both slots of a block shared one tweak; it
//! is refused with [`VolumeError::Version`].)
//!
//! **No torn blocks.** Each block has two slots. A write goes to the slot
//! that is not current, with the next sequence number, and only then becomes
//! current; the current slot is never written over. If the process dies
//! (or the machine loses power) in the middle, the half-written slot fails
//! its CRC and the previous version is still whole in the other slot (a
//! block whose first write was cut short reads as never written: zeros).
//!
//! **What the CRC-32C catches, and what it does not.** A read verifies the
//! slot's CRC-32C before decrypting; a mismatch is [`VolumeError::Corrupt`],
//! and no data is returned. That catches *accidents*: bits rotted on the
//! medium, a torn or misdirected write, a slot of another block. It does
//! not catch *deliberate* changes: the CRC is unkeyed, so anyone who can
//! write the file can change a slot's ciphertext and store the CRC of the
//! result (XTS has no integrity of its own: the block then decrypts to
//! garbage that is returned as data), or put back an older version of a
//! block, slot header and all — a rollback that reads back as valid. A
//! store that must detect tampering needs a keyed check (a MAC or an AEAD
//! per block), and one that must detect rollback needs, besides, a root of
//! those checks kept where the attacker cannot write.
//!
//! Opening tells the two accidental cases apart with the superblock's clean
//! flag: it is cleared when the volume opens and set by [`Volume::close`],
//! so after a crash a newest slot that fails its CRC is a write that never
//! finished (it is discarded and the previous version kept, and counted),
//! while after a clean shutdown it is corruption (reads report it).
//!
//! **Durability.** A write is acknowledged once it is in the file (the OS
//! page cache): it survives the process being killed. [`Volume::flush`]
//! (`fdatasync`) makes every acknowledged write survive a power loss too,
//! as a disk's FLUSH CACHE does.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crypto_offload::{CipherAlg, CipherSession, CrcAlg};
use tokio::sync::RwLock;
use zeroize::Zeroizing;

use super::checksum::CrcPool;
use super::protocol::MAX_BLOCK_SIZE;
use crate::backends::Offloads;

/// Bytes of the superblock at the start of the file.
pub const SUPERBLOCK: u64 = 4096;
/// Bytes of a slot's header.
pub const SLOT_HEADER: usize = 32;
const MAGIC: &[u8; 8] = b"OFFLDVOL";
/// The format version this program reads and writes.
pub const VERSION: u32 = 2;
const SLOT_MAGIC: u32 = 0x4f42_4b31;
/// Stripes of the per-block locks.
const STRIPES: usize = 1024;
/// The tweak of the block whose ciphertext checks the key: no write has it
/// (its block number, `u64::MAX`, is beyond every volume).
const KEY_CHECK_TWEAK: u128 = u128::MAX;

/// Block size and count, for a new volume (an existing one keeps its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Bytes per block: a multiple of 16 from 16 to 1 MiB.
    pub block_size: usize,
    /// Blocks.
    pub blocks: u64,
}

impl Default for Geometry {
    /// 16,384 blocks of 4 KiB (64 MiB of data, 128 MiB of file).
    fn default() -> Self {
        Geometry {
            block_size: 4096,
            blocks: 16384,
        }
    }
}

impl Geometry {
    /// Bytes from one slot to the next.
    pub fn stride(&self) -> u64 {
        (SLOT_HEADER + self.block_size) as u64
    }

    /// Where slot `slot` (0 or 1) of `block` starts in the file.
    pub fn slot_offset(&self, block: u64, slot: u8) -> u64 {
        SUPERBLOCK + (2 * block + u64::from(slot & 1)) * self.stride()
    }

    /// The file's length, if it fits a u64.
    fn file_len(&self) -> Option<u64> {
        self.blocks
            .checked_mul(2)?
            .checked_mul(self.stride())?
            .checked_add(SUPERBLOCK)
    }

    fn check(&self) -> Result<(), VolumeError> {
        let ok = self.block_size >= 16
            && self.block_size.is_multiple_of(16)
            && self.block_size <= MAX_BLOCK_SIZE
            && self.blocks > 0
            && self.blocks < 1 << 62
            && self.file_len().is_some();
        if ok {
            Ok(())
        } else {
            Err(VolumeError::Geometry(*self))
        }
    }
}

/// What went wrong with the volume or a request on it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VolumeError {
    /// The block is beyond the volume.
    #[error("block {block} is out of range (the volume has {blocks} blocks)")]
    OutOfRange {
        /// The block asked for.
        block: u64,
        /// Blocks in the volume.
        blocks: u64,
    },
    /// The data is not one block long.
    #[error("a block is {expected} bytes, not {len}")]
    BlockLength {
        /// The length given.
        len: usize,
        /// The block size.
        expected: usize,
    },
    /// The stored block does not verify: no data is returned.
    #[error("block {block} is corrupt: {why}")]
    Corrupt {
        /// The block.
        block: u64,
        /// What did not match.
        why: String,
    },
    /// Block size and count a volume cannot have.
    #[error("invalid geometry {0:?}: blocks of 16 B to 1 MiB in multiples of 16, at least one")]
    Geometry(Geometry),
    /// The file is not a volume.
    #[error("{path} is not a volume: {why}")]
    NotAVolume {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A volume of a format version this program does not read.
    #[error(
        "{path} is a version-{found} volume; this program reads version {VERSION} only \
         (version 1 encrypted every write of a block under the same XTS tweak): \
         copy its data out with the program that wrote it"
    )]
    Version {
        /// The file.
        path: PathBuf,
        /// Its version.
        found: u32,
    },
    /// The key is not the volume's.
    #[error("the key does not open this volume")]
    WrongKey,
    /// The key file holds no usable key.
    #[error("{path}: {why}")]
    BadKey {
        /// The key file.
        path: PathBuf,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A file operation failed.
    #[error("{op} failed")]
    Io {
        /// The operation.
        op: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Encryption or checksumming failed.
    #[error(transparent)]
    Crypto(#[from] crypto_offload::Error),
}

fn io_err(op: &'static str) -> impl FnOnce(io::Error) -> VolumeError {
    move |source| VolumeError::Io { op, source }
}

/// The volume's 64-byte AES-256-XTS key: zeroized on drop, never printed.
pub struct VolumeKey(Zeroizing<[u8; 64]>);

impl core::fmt::Debug for VolumeKey {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("VolumeKey(..)")
    }
}

impl VolumeKey {
    /// A new random key from the operating system.
    ///
    /// # Errors
    /// [`VolumeError::Io`] if the OS has no randomness to give.
    pub fn generate() -> Result<Self, VolumeError> {
        let mut key = Zeroizing::new([0u8; 64]);
        getrandom::fill(&mut key[..]).map_err(|e| VolumeError::Io {
            op: "getrandom",
            source: io::Error::other(e.to_string()),
        })?;
        Ok(VolumeKey(key))
    }

    /// The key in `path` (64 raw bytes), or a new random one written there
    /// (mode 0600) if the file does not exist. Returns whether it was made.
    ///
    /// # Errors
    /// [`VolumeError::BadKey`] for a file that is not 64 bytes;
    /// [`VolumeError::Io`].
    pub fn load_or_create(path: &Path) -> Result<(Self, bool), VolumeError> {
        match std::fs::read(path) {
            Ok(bytes) => {
                let bytes = Zeroizing::new(bytes);
                let key: [u8; 64] =
                    bytes
                        .as_slice()
                        .try_into()
                        .map_err(|_| VolumeError::BadKey {
                            path: path.to_owned(),
                            why: "a key file holds exactly 64 bytes (AES-256-XTS)",
                        })?;
                Ok((VolumeKey(Zeroizing::new(key)), false))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let key = VolumeKey::generate()?;
                let mut file = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(path)
                    .map_err(io_err("create the key file"))?;
                io::Write::write_all(&mut file, &key.0[..])
                    .map_err(io_err("write the key file"))?;
                file.sync_all().map_err(io_err("sync the key file"))?;
                Ok((key, true))
            }
            Err(e) => Err(VolumeError::Io {
                op: "read the key file",
                source: e,
            }),
        }
    }

    fn expose(&self) -> &[u8] {
        &self.0[..]
    }
}

/// The superblock's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Superblock {
    geometry: Geometry,
    key_check: u32,
    clean: bool,
    /// Opens of the volume so far (see the module docs).
    generation: u64,
}

/// Why a superblock was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BadSuperblock {
    NotAVolume(&'static str),
    Version(u32),
}

impl Superblock {
    const LEN: usize = 44;

    fn encode(&self, crc: impl Fn(&[u8]) -> u32) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[..8].copy_from_slice(MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(self.geometry.block_size as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.geometry.blocks.to_le_bytes());
        b[24..28].copy_from_slice(&self.key_check.to_le_bytes());
        b[28] = u8::from(self.clean);
        b[32..40].copy_from_slice(&self.generation.to_le_bytes());
        let sum = crc(&b[..40]);
        b[40..44].copy_from_slice(&sum.to_le_bytes());
        b
    }

    /// The superblock in `b`. The version is checked before the CRC, whose
    /// place depends on it, so an old volume is named as one.
    fn decode(b: &[u8; Self::LEN], crc: impl Fn(&[u8]) -> u32) -> Result<Self, BadSuperblock> {
        if &b[..8] != MAGIC {
            return Err(BadSuperblock::NotAVolume("no volume magic"));
        }
        let version = le_u32(b, 8);
        if version != VERSION {
            return Err(BadSuperblock::Version(version));
        }
        if le_u32(b, 40) != crc(&b[..40]) {
            return Err(BadSuperblock::NotAVolume("the superblock fails its CRC"));
        }
        Ok(Superblock {
            geometry: Geometry {
                block_size: le_u32(b, 12) as usize,
                blocks: le_u64(b, 16),
            },
            key_check: le_u32(b, 24),
            clean: b[28] == 1,
            generation: le_u64(b, 32),
        })
    }
}

/// A slot's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SlotHeader {
    crc: u32,
    seq: u64,
    block: u64,
}

impl SlotHeader {
    fn encode(&self, out: &mut [u8]) {
        out[..4].copy_from_slice(&SLOT_MAGIC.to_le_bytes());
        out[4..8].copy_from_slice(&self.crc.to_le_bytes());
        out[8..16].copy_from_slice(&self.seq.to_le_bytes());
        out[16..24].copy_from_slice(&self.block.to_le_bytes());
        out[24..SLOT_HEADER].fill(0);
    }

    /// The header in `b`, if it has one (a slot never written is zeros).
    fn decode(b: &[u8]) -> Option<Self> {
        if b.len() < SLOT_HEADER || le_u32(b, 0) != SLOT_MAGIC {
            return None;
        }
        Some(SlotHeader {
            crc: le_u32(b, 4),
            seq: le_u64(b, 8),
            block: le_u64(b, 16),
        })
    }
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    if let Some(s) = b.get(at..at + 4) {
        a.copy_from_slice(s);
    }
    u32::from_le_bytes(a)
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    if let Some(s) = b.get(at..at + 8) {
        a.copy_from_slice(s);
    }
    u64::from_le_bytes(a)
}

/// The XTS tweak of version `seq` of `block`: the block number in the low
/// 8 bytes, the sequence number in the high 8 (a 128-bit little-endian
/// number, as XTS takes a sector number).
fn tweak(block: u64, seq: u64) -> [u8; 16] {
    (u128::from(seq) << 64 | u128::from(block)).to_le_bytes()
}

/// The file and the per-block state, shared with the blocking pool.
struct Store {
    file: File,
    geometry: Geometry,
    /// This open's generation: every write's sequence number is at least
    /// `generation << 32`.
    generation: u64,
    /// Per block: `seq << 1 | slot` of its current slot; 0 if never written.
    state: Box<[AtomicU64]>,
    /// Readers and the writer of a block take its stripe's lock, so a read
    /// never sees the slot a write is filling.
    stripes: Box<[Arc<RwLock<()>>]>,
}

impl Store {
    fn current(&self, block: u64) -> (u64, u8) {
        let v = self.state[block as usize].load(Ordering::Acquire);
        (v >> 1, (v & 1) as u8)
    }

    /// The sequence number and slot of the next write of `block` (its
    /// stripe locked for writing).
    fn next(&self, block: u64) -> (u64, u8) {
        let (seq, current) = self.current(block);
        let target = if seq == 0 { 0 } else { current ^ 1 };
        ((seq + 1).max(self.generation << 32), target)
    }

    fn stripe(&self, block: u64) -> Arc<RwLock<()>> {
        self.stripes[(block % STRIPES as u64) as usize].clone()
    }
}

/// What opening found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opened {
    /// The volume was created now.
    pub created: bool,
    /// It had been closed cleanly (or was new).
    pub clean: bool,
    /// Half-written slots discarded (after a crash).
    pub torn_discarded: u64,
    /// Blocks that hold data.
    pub written: u64,
}

/// An open volume. Requests take `&self` and may run concurrently.
pub struct Volume {
    store: Arc<Store>,
    path: PathBuf,
    xts: CipherSession,
    crcs: CrcPool,
    opened: Opened,
}

impl core::fmt::Debug for Volume {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Volume")
            .field("path", &self.path)
            .field("geometry", &self.store.geometry)
            .field("opened", &self.opened)
            .finish_non_exhaustive()
    }
}

/// Runs file I/O on the blocking pool.
///
/// # Cancel safety
/// Cancel safe: `f` runs to its end on the blocking pool even if the
/// future is dropped; only its result is lost.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, VolumeError> + Send + 'static,
) -> Result<T, VolumeError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| VolumeError::Io {
            op: "the blocking pool",
            source: io::Error::other(e.to_string()),
        })?
}

impl Volume {
    /// Opens the volume at `path`, creating it with `geometry` if the file
    /// does not exist (an existing volume keeps its own geometry), and
    /// recovers it: the newest whole version of every block becomes
    /// current. The volume is marked in use until [`close`](Self::close).
    ///
    /// # Errors
    /// [`VolumeError::WrongKey`], [`VolumeError::NotAVolume`],
    /// [`VolumeError::Geometry`], [`VolumeError::Io`].
    ///
    /// # Cancel safety
    /// Not cancel safe: dropped after the volume was marked in use, the
    /// next open treats it as crashed (which is safe, only slower).
    pub async fn open(
        path: &Path,
        geometry: Geometry,
        key: &VolumeKey,
        offloads: &Offloads,
    ) -> Result<Volume, VolumeError> {
        let crcs = CrcPool::new(offloads.for_alg(CrcAlg::Crc32Iscsi).clone());
        let sync_crc = Arc::new(crcs.sync_crc().await?);
        let sum = {
            let sync_crc = sync_crc.clone();
            move |b: &[u8]| sync_crc.of(b)
        };

        let owned = path.to_owned();
        let (file, existing) = blocking(move || {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&owned)
                .map_err(io_err("open the volume"))?;
            let len = file.metadata().map_err(io_err("stat the volume"))?.len();
            if len == 0 {
                return Ok((file, None));
            }
            let mut b = [0u8; Superblock::LEN];
            file.read_exact_at(&mut b, 0)
                .map_err(|_| VolumeError::NotAVolume {
                    path: owned.clone(),
                    why: "shorter than a superblock",
                })?;
            Ok((file, Some((b, len))))
        })
        .await?;

        let (geometry, clean, key_check, created, generation) = match existing {
            None => {
                geometry.check()?;
                (geometry, true, None, true, 1)
            }
            Some((b, len)) => {
                let sb = Superblock::decode(&b, &sum).map_err(|bad| match bad {
                    BadSuperblock::NotAVolume(why) => VolumeError::NotAVolume {
                        path: path.to_owned(),
                        why,
                    },
                    BadSuperblock::Version(found) => VolumeError::Version {
                        path: path.to_owned(),
                        found,
                    },
                })?;
                sb.geometry.check()?;
                if sb.geometry.file_len() != Some(len) {
                    return Err(VolumeError::NotAVolume {
                        path: path.to_owned(),
                        why: "its length does not match its geometry",
                    });
                }
                (
                    sb.geometry,
                    sb.clean,
                    Some(sb.key_check),
                    false,
                    sb.generation + 1,
                )
            }
        };

        let xts = offloads
            .for_alg(CipherAlg::Aes256Xts)
            .cipher(CipherAlg::Aes256Xts, key.expose())
            .await?
            .with_data_unit(geometry.block_size)?;
        let check_block = xts
            .encrypt(
                KEY_CHECK_TWEAK.to_le_bytes(),
                vec![0u8; geometry.block_size],
            )
            .await
            .map_err(crypto_offload::Error::from)?;
        let check = sum(&check_block);
        if key_check.is_some_and(|k| k != check) {
            return Err(VolumeError::WrongKey);
        }

        // In use from now on, in a new generation: a crash before `close`
        // is seen at the next open, and no write from now on takes a
        // sequence number handed out before.
        let in_use = Superblock {
            geometry,
            key_check: check,
            clean: false,
            generation,
        }
        .encode(&sum);
        let (file, state, torn_discarded) = blocking(move || {
            if created {
                file.set_len(geometry.file_len().unwrap_or(0))
                    .map_err(io_err("size the volume"))?;
            }
            file.write_all_at(&in_use, 0)
                .map_err(io_err("write the superblock"))?;
            file.sync_data().map_err(io_err("sync the volume"))?;
            let (state, torn) = scan(&file, geometry, clean, &sum)?;
            Ok((file, state, torn))
        })
        .await?;
        let written = state
            .iter()
            .filter(|s| s.load(Ordering::Relaxed) != 0)
            .count() as u64;
        let store = Store {
            file,
            geometry,
            generation,
            state,
            stripes: (0..STRIPES).map(|_| Arc::new(RwLock::new(()))).collect(),
        };
        Ok(Volume {
            store: Arc::new(store),
            path: path.to_owned(),
            xts,
            crcs,
            opened: Opened {
                created,
                clean,
                torn_discarded,
                written,
            },
        })
    }

    /// Block size and count.
    pub fn geometry(&self) -> Geometry {
        self.store.geometry
    }

    /// What opening found.
    pub fn opened(&self) -> Opened {
        self.opened
    }

    fn check(&self, block: u64) -> Result<(), VolumeError> {
        let blocks = self.store.geometry.blocks;
        if block >= blocks {
            return Err(VolumeError::OutOfRange { block, blocks });
        }
        Ok(())
    }

    /// Encrypts `data` (one block) and stores it as block `block`.
    ///
    /// # Errors
    /// [`VolumeError::OutOfRange`], [`VolumeError::BlockLength`],
    /// [`VolumeError::Io`], [`VolumeError::Crypto`].
    ///
    /// # Cancel safety
    /// Cancel safe: once the slot is being written, the write, the switch to
    /// the new slot and the release of the block's lock finish on the
    /// blocking pool even if this future is dropped; before that, nothing
    /// has changed. A dropped write may or may not have happened.
    pub async fn write(&self, block: u64, data: Vec<u8>) -> Result<(), VolumeError> {
        self.check(block)?;
        let block_size = self.store.geometry.block_size;
        if data.len() != block_size {
            return Err(VolumeError::BlockLength {
                len: data.len(),
                expected: block_size,
            });
        }
        // The block's lock is taken before its sequence number, which the
        // tweak holds, is chosen: two writes of one block go one after the
        // other, each with a number of its own.
        let guard = self.store.stripe(block).write_owned().await;
        let (seq, target) = self.store.next(block);
        let ciphertext = self
            .xts
            .encrypt(tweak(block, seq), data)
            .await
            .map_err(crypto_offload::Error::from)?;
        let (ciphertext, crc) = self.crcs.checksum(ciphertext).await?;
        let mut slot = vec![0u8; SLOT_HEADER];
        SlotHeader { crc, seq, block }.encode(&mut slot);
        slot.extend_from_slice(&ciphertext);
        let store = self.store.clone();
        blocking(move || {
            let _guard = guard;
            store
                .file
                .write_all_at(&slot, store.geometry.slot_offset(block, target))
                .map_err(io_err("write a block"))?;
            store.state[block as usize].store(seq << 1 | u64::from(target), Ordering::Release);
            Ok(())
        })
        .await
    }

    /// Reads, verifies and decrypts block `block`. A block never written
    /// reads as zeros.
    ///
    /// # Errors
    /// [`VolumeError::Corrupt`] if the stored slot does not verify (no data
    /// is returned); [`VolumeError::OutOfRange`], [`VolumeError::Io`],
    /// [`VolumeError::Crypto`].
    ///
    /// # Cancel safety
    /// Cancel safe: nothing changes; the block's lock is released when the
    /// file read ends.
    pub async fn read(&self, block: u64) -> Result<Vec<u8>, VolumeError> {
        self.check(block)?;
        let geometry = self.store.geometry;
        let guard = self.store.stripe(block).read_owned().await;
        let store = self.store.clone();
        let (seq, mut slot) = blocking(move || {
            let _guard = guard;
            let (seq, current) = store.current(block);
            if seq == 0 {
                return Ok((0, Vec::new()));
            }
            let mut slot = vec![0u8; geometry.stride() as usize];
            store
                .file
                .read_exact_at(&mut slot, geometry.slot_offset(block, current))
                .map_err(io_err("read a block"))?;
            Ok((seq, slot))
        })
        .await?;
        if seq == 0 {
            return Ok(vec![0u8; geometry.block_size]);
        }
        let corrupt = |why: String| VolumeError::Corrupt { block, why };
        let header = SlotHeader::decode(&slot).ok_or_else(|| corrupt("no slot header".into()))?;
        if header.block != block || header.seq != seq {
            return Err(corrupt(format!(
                "the slot holds block {} version {}, not block {block} version {seq}",
                header.block, header.seq
            )));
        }
        slot.drain(..SLOT_HEADER);
        let (ciphertext, crc) = self.crcs.checksum(slot).await?;
        if crc != header.crc {
            return Err(corrupt(format!(
                "CRC-32C {crc:#010x} of the ciphertext, {:#010x} stored",
                header.crc
            )));
        }
        Ok(self
            .xts
            .decrypt(tweak(block, seq), ciphertext)
            .await
            .map_err(crypto_offload::Error::from)?)
    }

    /// Makes every acknowledged write durable (`fdatasync`).
    ///
    /// # Errors
    /// [`VolumeError::Io`].
    ///
    /// # Cancel safety
    /// Cancel safe: the sync runs to its end on the blocking pool.
    pub async fn flush(&self) -> Result<(), VolumeError> {
        let store = self.store.clone();
        blocking(move || store.file.sync_data().map_err(io_err("sync the volume"))).await
    }

    /// Syncs the volume and marks it closed cleanly. Call it after the last
    /// request has finished; requests still running then are not waited for.
    ///
    /// # Errors
    /// [`VolumeError::Io`]: the volume then opens as crashed, which is safe.
    ///
    /// # Cancel safety
    /// Cancel safe: the sync and the superblock write finish on the
    /// blocking pool; a volume whose close was dropped opens as crashed.
    pub async fn close(self) -> Result<(), VolumeError> {
        let sync_crc = self.crcs.sync_crc().await?;
        let geometry = self.store.geometry;
        let generation = self.store.generation;
        let check = self
            .xts
            .encrypt(
                KEY_CHECK_TWEAK.to_le_bytes(),
                vec![0u8; geometry.block_size],
            )
            .await
            .map_err(crypto_offload::Error::from)?;
        let store = self.store.clone();
        blocking(move || {
            let sum = |b: &[u8]| sync_crc.of(b);
            let key_check = sum(&check);
            let clean = Superblock {
                geometry,
                key_check,
                clean: true,
                generation,
            }
            .encode(sum);
            store.file.sync_data().map_err(io_err("sync the volume"))?;
            store
                .file
                .write_all_at(&clean, 0)
                .map_err(io_err("write the superblock"))?;
            store.file.sync_data().map_err(io_err("sync the volume"))
        })
        .await
    }
}

/// Reads every slot header and picks each block's current slot (see the
/// module docs). Returns the state and the number of torn slots discarded.
fn scan(
    file: &File,
    geometry: Geometry,
    clean: bool,
    crc: &dyn Fn(&[u8]) -> u32,
) -> Result<(Box<[AtomicU64]>, u64), VolumeError> {
    let pair = 2 * geometry.stride() as usize;
    let per_chunk = ((1 << 20) / pair).max(1) as u64;
    let mut state = Vec::with_capacity(geometry.blocks as usize);
    let mut torn = 0;
    let mut buf = Vec::new();
    let mut first = 0;
    while first < geometry.blocks {
        let n = per_chunk.min(geometry.blocks - first);
        buf.resize(n as usize * pair, 0);
        file.read_exact_at(&mut buf, geometry.slot_offset(first, 0))
            .map_err(io_err("scan the volume"))?;
        for (i, pair_bytes) in buf.chunks_exact(pair).enumerate() {
            let block = first + i as u64;
            let slots = pair_bytes.split_at(pair / 2);
            let header = |b: &[u8]| SlotHeader::decode(b).filter(|h| h.block == block && h.seq > 0);
            let mut candidates: Vec<(u64, u8, &[u8], u32)> = [slots.0, slots.1]
                .iter()
                .enumerate()
                .filter_map(|(s, b)| header(b).map(|h| (h.seq, s as u8, &b[SLOT_HEADER..], h.crc)))
                .collect();
            candidates.sort_by_key(|c| core::cmp::Reverse(c.0));
            let chosen = match candidates.as_slice() {
                [] => None,
                [newest, rest @ ..] => {
                    // After a crash the newest slot may be a write that never
                    // finished: keep the previous version instead — none if
                    // it was the block's first write, which was never
                    // acknowledged, and the block reads as never written.
                    // After a clean close it can only be corruption, which
                    // reads report.
                    if !clean && crc(newest.2) != newest.3 {
                        torn += 1;
                        rest.first()
                    } else {
                        Some(newest)
                    }
                }
            };
            state.push(AtomicU64::new(
                chosen.map_or(0, |&(seq, slot, _, _)| seq << 1 | u64::from(slot)),
            ));
        }
        first += n;
    }
    Ok((state.into_boxed_slice(), torn))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pattern;

    fn block(seed: u64) -> Vec<u8> {
        let mut b = vec![0u8; 4096];
        pattern::fill(&mut b, seed);
        b
    }

    fn small() -> Geometry {
        Geometry {
            block_size: 4096,
            blocks: 64,
        }
    }

    fn cpu() -> Offloads {
        crypto_offload::Offload::builder().build().unwrap().into()
    }

    async fn open(path: &Path, key: &VolumeKey) -> Volume {
        Volume::open(path, small(), key, &cpu()).await.unwrap()
    }

    /// Flips one byte of block `block`'s current ciphertext in the file.
    fn flip(path: &Path, block: u64, slot: u8) {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap();
        let at = small().slot_offset(block, slot) + SLOT_HEADER as u64 + 100;
        let mut b = [0u8; 1];
        file.read_exact_at(&mut b, at).unwrap();
        file.write_all_at(&[b[0] ^ 0x40], at).unwrap();
    }

    #[tokio::test]
    async fn blocks_round_trip_and_are_stored_encrypted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vol");
        let key = VolumeKey::generate().unwrap();
        let v = open(&path, &key).await;
        assert!(v.opened().created);
        v.write(5, block(1)).await.unwrap();
        v.write(5, block(2)).await.unwrap();
        v.write(63, block(3)).await.unwrap();
        assert_eq!(v.read(5).await.unwrap(), block(2));
        assert_eq!(v.read(63).await.unwrap(), block(3));
        assert_eq!(v.read(0).await.unwrap(), vec![0u8; 4096]);
        assert!(matches!(
            v.read(64).await,
            Err(VolumeError::OutOfRange {
                block: 64,
                blocks: 64
            })
        ));
        assert!(matches!(
            v.write(1, vec![0; 100]).await,
            Err(VolumeError::BlockLength { .. })
        ));
        v.close().await.unwrap();
        let file = std::fs::read(&path).unwrap();
        let plain = block(2);
        assert!(
            !file.windows(64).any(|w| w == &plain[..64]),
            "plaintext on disk"
        );

        let v = open(&path, &key).await;
        assert!(v.opened().clean && !v.opened().created);
        assert_eq!(v.opened().written, 2);
        assert_eq!(v.read(5).await.unwrap(), block(2));
    }

    #[tokio::test]
    async fn a_torn_write_after_a_crash_keeps_the_previous_version() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vol");
        let key = VolumeKey::generate().unwrap();
        let v = open(&path, &key).await;
        v.write(7, block(1)).await.unwrap(); // seq 1, slot 0
        v.write(7, block(2)).await.unwrap(); // seq 2, slot 1
        drop(v); // no close: a crash
        flip(&path, 7, 1); // the newest version, half-written
        let v = open(&path, &key).await;
        assert!(!v.opened().clean);
        assert_eq!(v.opened().torn_discarded, 1);
        assert_eq!(v.read(7).await.unwrap(), block(1));
        // The next write goes over the torn slot, never over the good one.
        v.write(7, block(3)).await.unwrap();
        assert_eq!(v.read(7).await.unwrap(), block(3));
    }

    #[tokio::test]
    async fn a_torn_first_write_after_a_crash_leaves_the_block_unwritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vol");
        let key = VolumeKey::generate().unwrap();
        let v = open(&path, &key).await;
        v.write(4, block(1)).await.unwrap(); // seq 1, slot 0: its only version
        v.write(5, block(2)).await.unwrap();
        drop(v); // no close: a crash
        flip(&path, 4, 0); // the first write, half-written
        let v = open(&path, &key).await;
        assert_eq!(v.opened().torn_discarded, 1);
        assert_eq!(v.opened().written, 1);
        assert_eq!(v.read(4).await.unwrap(), vec![0u8; 4096]);
        assert_eq!(v.read(5).await.unwrap(), block(2));
        // Written again, over the torn slot; whole after a clean close.
        v.write(4, block(3)).await.unwrap();
        v.close().await.unwrap();
        let v = open(&path, &key).await;
        assert_eq!(v.opened().torn_discarded, 0);
        assert_eq!(v.read(4).await.unwrap(), block(3));
    }

    #[tokio::test]
    async fn corruption_after_a_clean_close_is_reported_not_returned() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vol");
        let key = VolumeKey::generate().unwrap();
        let v = open(&path, &key).await;
        v.write(9, block(1)).await.unwrap();
        v.write(9, block(2)).await.unwrap();
        v.close().await.unwrap();
        flip(&path, 9, 1);
        let v = open(&path, &key).await;
        assert_eq!(v.opened().torn_discarded, 0);
        assert!(matches!(
            v.read(9).await,
            Err(VolumeError::Corrupt { block: 9, .. })
        ));
    }

    #[tokio::test]
    async fn another_key_does_not_open_the_volume_and_key_files_persist() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vol");
        let (key, created) = VolumeKey::load_or_create(&dir.path().join("key")).unwrap();
        assert!(created);
        let (again, created) = VolumeKey::load_or_create(&dir.path().join("key")).unwrap();
        assert!(!created);
        assert_eq!(key.expose(), again.expose());
        assert_eq!(format!("{key:?}"), "VolumeKey(..)");
        open(&path, &key).await.close().await.unwrap();
        let offload = cpu();
        let other = VolumeKey::generate().unwrap();
        assert!(matches!(
            Volume::open(&path, small(), &other, &offload).await,
            Err(VolumeError::WrongKey)
        ));
        std::fs::write(dir.path().join("short"), [1u8; 10]).unwrap();
        assert!(matches!(
            VolumeKey::load_or_create(&dir.path().join("short")),
            Err(VolumeError::BadKey { .. })
        ));
        std::fs::write(dir.path().join("junk"), [1u8; 9000]).unwrap();
        assert!(matches!(
            Volume::open(&dir.path().join("junk"), small(), &key, &offload).await,
            Err(VolumeError::NotAVolume { .. })
        ));
    }

    /// Slot `slot` of `block`'s ciphertext, as the file holds it.
    fn ciphertext(file: &[u8], block: u64, slot: u8) -> &[u8] {
        let at = (small().slot_offset(block, slot) as usize) + SLOT_HEADER;
        &file[at..at + 4096]
    }

    /// How many of the 16-byte pieces (XTS blocks) of `a` and `b` are equal.
    fn same_pieces(a: &[u8], b: &[u8]) -> usize {
        a.chunks(16)
            .zip(b.chunks(16))
            .filter(|(x, y)| x == y)
            .count()
    }

    #[tokio::test]
    async fn the_same_data_written_twice_is_stored_as_two_unrelated_ciphertexts() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vol");
        let key = VolumeKey::generate().unwrap();
        let v = open(&path, &key).await;
        v.write(5, block(1)).await.unwrap(); // slot 0
        v.write(5, block(1)).await.unwrap(); // slot 1, the same data
        v.write(6, block(1)).await.unwrap(); // another block, the same data
        assert_eq!(v.read(5).await.unwrap(), block(1));
        v.close().await.unwrap();
        let file = std::fs::read(&path).unwrap();
        let (first, second) = (ciphertext(&file, 5, 0), ciphertext(&file, 5, 1));
        assert!(first.iter().any(|&b| b != 0) && second.iter().any(|&b| b != 0));
        // With one tweak for both writes they would be equal piece for piece.
        assert_eq!(same_pieces(first, second), 0);
        assert_eq!(same_pieces(first, ciphertext(&file, 6, 0)), 0);
        let v = open(&path, &key).await;
        assert_eq!(v.read(5).await.unwrap(), block(1));
    }

    #[tokio::test]
    async fn a_write_after_a_crash_never_reuses_the_tweak_of_a_torn_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vol");
        let key = VolumeKey::generate().unwrap();
        let v = open(&path, &key).await;
        v.write(7, block(1)).await.unwrap(); // slot 0
        v.write(7, block(2)).await.unwrap(); // slot 1
        drop(v); // no close: a crash
        flip(&path, 7, 1); // the newest version, half-written: discarded
        let torn = ciphertext(&std::fs::read(&path).unwrap(), 7, 1).to_vec();
        let v = open(&path, &key).await;
        assert_eq!(v.opened().torn_discarded, 1);
        // The same data again, into the same slot: numbered after the
        // crash, it is not the torn write's ciphertext (that would differ
        // from it in the one flipped piece only).
        v.write(7, block(2)).await.unwrap();
        assert_eq!(v.read(7).await.unwrap(), block(2));
        v.close().await.unwrap();
        let file = std::fs::read(&path).unwrap();
        assert_eq!(same_pieces(&torn, ciphertext(&file, 7, 1)), 0);
        assert_eq!(open(&path, &key).await.read(7).await.unwrap(), block(2));
    }

    #[tokio::test]
    async fn a_version_1_volume_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old");
        let key = VolumeKey::generate().unwrap();
        // A version-1 superblock: magic, version 1, geometry, key check,
        // clean flag, CRC at 32.
        let mut old = vec![0u8; 9000];
        old[..8].copy_from_slice(MAGIC);
        old[8..12].copy_from_slice(&1u32.to_le_bytes());
        old[12..16].copy_from_slice(&4096u32.to_le_bytes());
        old[16..24].copy_from_slice(&1u64.to_le_bytes());
        old[28] = 1;
        std::fs::write(&path, &old).unwrap();
        let err = Volume::open(&path, small(), &key, &cpu())
            .await
            .unwrap_err();
        assert!(
            matches!(err, VolumeError::Version { found: 1, .. }),
            "{err:?}"
        );
        let said = err.to_string();
        assert!(
            said.contains("version-1") && said.contains("version 2"),
            "{said}"
        );
        assert_eq!(std::fs::read(&path).unwrap(), old, "left as it was");
    }

    #[tokio::test]
    async fn bad_geometry_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let key = VolumeKey::generate().unwrap();
        let offload = cpu();
        for g in [
            Geometry {
                block_size: 4100,
                blocks: 8,
            },
            Geometry {
                block_size: 4096,
                blocks: 0,
            },
            Geometry {
                block_size: 1 << 21,
                blocks: 8,
            },
        ] {
            assert!(matches!(
                Volume::open(&dir.path().join("v"), g, &key, &offload).await,
                Err(VolumeError::Geometry(_))
            ));
        }
    }
}
