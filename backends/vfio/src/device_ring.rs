//! The device's side of a split virtqueue (virtio 1.x §2.7), over the DMA
//! pool by device address: what a device reads (available ring,
//! descriptors, indirect tables) and writes (used ring). The emulated
//! device of the tests and the fuzz harness play the device with it, over
//! plain memory — and are free to write anything a broken device would.

use std::sync::Arc;

use crate::dma::DmaPool;
use crate::error::Error;

/// `VIRTQ_DESC_F_NEXT`.
pub const DESC_F_NEXT: u16 = 1;
/// `VIRTQ_DESC_F_WRITE`.
pub const DESC_F_WRITE: u16 = 2;
/// `VIRTQ_DESC_F_INDIRECT`.
pub const DESC_F_INDIRECT: u16 = 4;

/// One descriptor as the device reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Desc {
    /// The buffer's device address.
    pub addr: u64,
    /// Its length.
    pub len: u32,
    /// `VIRTQ_DESC_F_*`.
    pub flags: u16,
    /// The next descriptor, with `VIRTQ_DESC_F_NEXT`.
    pub next: u16,
}

impl Desc {
    /// The device writes this buffer (else reads it).
    pub fn device_writes(&self) -> bool {
        self.flags & DESC_F_WRITE != 0
    }
}

/// A split virtqueue as its device sees it.
#[derive(Debug)]
pub struct DeviceRing {
    pool: Arc<DmaPool>,
    size: u16,
    desc: u64,
    avail: u64,
    used: u64,
    /// The available entries taken so far (free-running).
    last_avail: u16,
}

impl DeviceRing {
    /// The queue of `size` entries whose descriptor table, available ring
    /// and used ring the driver put at `addresses` (as the driver's
    /// `SplitQueue::addresses` gives them), in `pool`.
    pub fn new(pool: Arc<DmaPool>, size: u16, addresses: (u64, u64, u64)) -> DeviceRing {
        let (desc, avail, used) = addresses;
        DeviceRing {
            pool,
            size,
            desc,
            avail,
            used,
            last_avail: 0,
        }
    }

    /// Its size.
    pub fn size(&self) -> u16 {
        self.size
    }

    /// The pool it lives in.
    pub fn pool(&self) -> &Arc<DmaPool> {
        &self.pool
    }

    /// The next head the driver made available, if any (taken: the next
    /// call gives the one after).
    pub fn pop_avail(&mut self) -> Result<Option<u16>, Error> {
        let idx = self.pool.device_read_u16(self.avail + 2)?;
        if idx == self.last_avail {
            return Ok(None);
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        let slot = u64::from(self.last_avail % self.size);
        let head = self.pool.device_read_u16(self.avail + 4 + 2 * slot)?;
        self.last_avail = self.last_avail.wrapping_add(1);
        Ok(Some(head))
    }

    /// Whether the driver asks for interrupts (`VIRTQ_AVAIL_F_NO_INTERRUPT`
    /// clear).
    pub fn interrupts_wanted(&self) -> bool {
        self.pool
            .device_read_u16(self.avail)
            .is_ok_and(|f| f & 1 == 0)
    }

    /// Descriptor `i` of the table at `table` (the ring's, or an indirect
    /// one).
    fn read_desc(&self, table: u64, i: u16) -> Result<Desc, Error> {
        let at = table + 16 * u64::from(i);
        let word = self.pool.device_read_u64(at + 8)?;
        Ok(Desc {
            addr: self.pool.device_read_u64(at)?,
            len: word as u32,
            flags: (word >> 32) as u16,
            next: (word >> 48) as u16,
        })
    }

    /// Descriptor `head` of the ring's table as written (for an indirect
    /// chain: the pointer to its table).
    pub fn head_desc(&self, head: u16) -> Result<Desc, Error> {
        if head >= self.size {
            return Err(Error::Device(format!(
                "head {head} past a ring of {}",
                self.size
            )));
        }
        self.read_desc(self.desc, head)
    }

    /// The chain headed by `head`, following `NEXT` links and an indirect
    /// table (whose descriptors it returns in its place), as a device
    /// must: a chain longer than its table, or a link out of it, is an
    /// error.
    pub fn chain(&self, head: u16) -> Result<Vec<Desc>, Error> {
        let bad = |why: String| Err(Error::Device(format!("chain at {head}: {why}")));
        if head >= self.size {
            return bad(format!("head past a ring of {}", self.size));
        }
        let first = self.read_desc(self.desc, head)?;
        let (table, entries, mut at) = if first.flags & DESC_F_INDIRECT != 0 {
            if first.len == 0 || first.len % 16 != 0 {
                return bad(format!("indirect table of {} bytes", first.len));
            }
            (first.addr, first.len / 16, 0u16)
        } else {
            (self.desc, u32::from(self.size), head)
        };
        let mut out = Vec::new();
        loop {
            if out.len() as u32 >= entries {
                return bad("longer than its table".into());
            }
            let d = self.read_desc(table, at)?;
            out.push(d);
            if d.flags & DESC_F_NEXT == 0 {
                return Ok(out);
            }
            if u32::from(d.next) >= entries {
                return bad(format!("link to {} past the table", d.next));
            }
            at = d.next;
        }
    }

    /// The used ring's index.
    pub fn used_idx(&self) -> Result<u16, Error> {
        self.pool.device_read_u16(self.used + 2)
    }

    /// Writes used entry `entry` (free-running: its slot is `entry % size`).
    pub fn write_used_entry(&self, entry: u16, id: u32, len: u32) -> Result<(), Error> {
        let slot = u64::from(entry % self.size);
        self.pool.device_write_u32(self.used + 4 + 8 * slot, id)?;
        self.pool.device_write_u32(self.used + 8 + 8 * slot, len)
    }

    /// Publishes the used index (after the entries it covers).
    pub fn set_used_idx(&self, idx: u16) -> Result<(), Error> {
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        self.pool.device_write_u16(self.used + 2, idx)
    }

    /// Completes the chain headed by `id` with `len` bytes written: its
    /// used entry, then the index.
    pub fn push_used(&self, id: u32, len: u32) -> Result<(), Error> {
        let idx = self.used_idx()?;
        self.write_used_entry(idx, id, len)?;
        self.set_used_idx(idx.wrapping_add(1))
    }
}
