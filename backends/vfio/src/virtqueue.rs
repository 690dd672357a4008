//! A split virtqueue (virtio 1.x §2.7) in DMA memory: the descriptor
//! table, the driver ("available") ring and the device ("used") ring, with
//! a free list of descriptors kept on this side.

use std::sync::atomic::{Ordering, fence};

use crate::dma::DmaBuf;
use crate::error::Error;

const DESC_F_NEXT: u16 = 1;
const DESC_F_WRITE: u16 = 2;
const DESC_F_INDIRECT: u16 = 4;
/// The bytes of one descriptor, in the table or in an indirect table.
pub const DESC_BYTES: usize = 16;
/// `VIRTQ_USED_F_NO_NOTIFY`: the device asks not to be notified.
const USED_F_NO_NOTIFY: u16 = 1;
/// `VIRTQ_AVAIL_F_NO_INTERRUPT`: the driver asks for no interrupts.
const AVAIL_F_NO_INTERRUPT: u16 = 1;

/// One buffer of a request: a device address, a length, and whether the
/// device writes it (else reads).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Its device address.
    pub iova: u64,
    /// Its length.
    pub len: u32,
    /// The device writes it.
    pub device_writes: bool,
}

/// A split virtqueue of `size` descriptors.
#[derive(Debug)]
pub struct SplitQueue {
    mem: DmaBuf,
    size: u16,
    /// Free descriptors, first freed first reused: a head comes back to
    /// the device a ring's length after it was freed at the earliest, so
    /// a device that repeats a recent completion names a free descriptor
    /// (caught), not the head of the next request.
    free: std::collections::VecDeque<u16>,
    /// Which descriptors the device holds (to catch a double completion
    /// without searching the free stack).
    busy: Vec<bool>,
    /// Which descriptors head a chain the device holds: the only ids a used
    /// entry may name.
    head: Vec<bool>,
    /// Chains the device holds (staged or published, not yet completed):
    /// the most completions the used ring may announce.
    chains: usize,
    /// Each descriptor's successor in its chain (this side's copy: the
    /// device may scribble on the table).
    next: Vec<Option<u16>>,
    /// Where the next available entry goes (free-running).
    avail_idx: u16,
    /// The used entries consumed so far (free-running).
    last_used: u16,
    /// VIRTIO_RING_F_INDIRECT_DESC was negotiated: a request whose chain
    /// is also written as a table in its own memory takes one descriptor
    /// ([`SplitQueue::stage_request`]).
    indirect: bool,
}

impl SplitQueue {
    /// Bytes of DMA memory a queue of `size` needs.
    pub fn bytes(size: u16) -> usize {
        let n = usize::from(size);
        Self::used_offset(size) + 6 + 8 * n
    }

    fn avail_offset(size: u16) -> usize {
        16 * usize::from(size)
    }

    fn used_offset(size: u16) -> usize {
        // The used ring is 4-byte aligned.
        (Self::avail_offset(size) + 6 + 2 * usize::from(size)).next_multiple_of(4)
    }

    /// A queue of `size` (a power of two up to 32768) in `mem` (at least
    /// [`SplitQueue::bytes`] long, zeroed).
    pub fn new(mem: DmaBuf, size: u16) -> Result<SplitQueue, Error> {
        if size == 0 || !size.is_power_of_two() || size > 32768 || mem.len() < Self::bytes(size) {
            return Err(Error::Invalid {
                what: "queue size",
                detail: format!("{size} in {} bytes", mem.len()),
            });
        }
        Ok(SplitQueue {
            mem,
            size,
            free: (0..size).collect(),
            busy: vec![false; usize::from(size)],
            head: vec![false; usize::from(size)],
            chains: 0,
            next: vec![None; usize::from(size)],
            avail_idx: 0,
            last_used: 0,
            indirect: false,
        })
    }

    /// Lets [`SplitQueue::stage_request`] send chains through indirect
    /// tables (only once VIRTIO_RING_F_INDIRECT_DESC is negotiated).
    pub fn set_indirect(&mut self, on: bool) {
        self.indirect = on;
    }

    /// Whether requests go through indirect tables.
    pub fn indirect(&self) -> bool {
        self.indirect
    }

    /// Empties the rings (zeroed memory, every descriptor free, indices
    /// from 0), for a device that was reset and sets the queue up anew.
    pub fn reset(&mut self) -> Result<(), Error> {
        self.mem.write(0, &vec![0u8; Self::bytes(self.size)])?;
        self.free = (0..self.size).collect();
        self.busy = vec![false; usize::from(self.size)];
        self.head = vec![false; usize::from(self.size)];
        self.chains = 0;
        self.next = vec![None; usize::from(self.size)];
        self.avail_idx = 0;
        self.last_used = 0;
        Ok(())
    }

    /// Its size.
    pub fn size(&self) -> u16 {
        self.size
    }

    /// Free descriptors.
    pub fn free_descriptors(&self) -> usize {
        self.free.len()
    }

    /// Chains the device holds (made available, not yet completed).
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn chains_in_flight(&self) -> usize {
        self.chains
    }

    /// The descriptors of the chain headed by `head`, by this side's links
    /// (`None` if `head` heads no chain the device holds).
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn chain_of(&self, head: u16) -> Option<Vec<u16>> {
        if !self.head.get(usize::from(head)).copied().unwrap_or(false) {
            return None;
        }
        let mut out = vec![head];
        let mut at = self.next[usize::from(head)];
        while let Some(d) = at {
            if out.len() > usize::from(self.size) {
                return None;
            }
            out.push(d);
            at = self.next[usize::from(d)];
        }
        Some(out)
    }

    /// Descriptors marked busy (for invariant checks: each belongs to
    /// exactly one chain the device holds).
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn busy_descriptors(&self) -> usize {
        self.busy.iter().filter(|b| **b).count()
    }

    /// The device addresses of the descriptor table, the available ring and
    /// the used ring.
    pub fn addresses(&self) -> (u64, u64, u64) {
        (
            self.mem.iova(0),
            self.mem.iova(Self::avail_offset(self.size)),
            self.mem.iova(Self::used_offset(self.size)),
        )
    }

    /// Makes `chain` available to the device; its head descriptor's index,
    /// or `None` if there are not enough free descriptors (try again after
    /// completions).
    #[cfg(test)]
    pub fn push(&mut self, chain: &[Segment]) -> Result<Option<u16>, Error> {
        let head = self.stage(chain)?;
        if head.is_some() {
            self.publish()?;
        }
        Ok(head)
    }

    /// Writes `chain` into the rings without telling the device yet:
    /// [`SplitQueue::publish`] makes everything staged available at once
    /// (one index write and fence for a whole burst). Its head descriptor's
    /// index, or `None` if there are not enough free descriptors.
    pub fn stage(&mut self, chain: &[Segment]) -> Result<Option<u16>, Error> {
        if chain.is_empty() || chain.len() > usize::from(self.size) {
            return Err(Error::Invalid {
                what: "descriptor chain",
                detail: format!("{} segments", chain.len()),
            });
        }
        if self.free.len() < chain.len() {
            return Ok(None);
        }
        // The chain takes the front of the free list (no allocation: this
        // runs for every request).
        let id_at = |i: usize| self.free[i];
        for (i, seg) in chain.iter().enumerate() {
            let id = id_at(i);
            let next = (i + 1 < chain.len()).then(|| id_at(i + 1));
            let mut flags = if seg.device_writes { DESC_F_WRITE } else { 0 };
            if next.is_some() {
                flags |= DESC_F_NEXT;
            }
            self.write_desc(id, seg.iova, seg.len, flags, next.unwrap_or(0))?;
            self.next[usize::from(id)] = next;
            self.busy[usize::from(id)] = true;
        }
        let head = id_at(0);
        self.free.drain(..chain.len());
        self.head[usize::from(head)] = true;
        self.chains += 1;
        let slot = usize::from(self.avail_idx % self.size);
        let avail = Self::avail_offset(self.size);
        self.mem.write_u16(avail + 4 + 2 * slot, head)?;
        self.avail_idx = self.avail_idx.wrapping_add(1);
        Ok(Some(head))
    }

    /// Stages a request whose `chain` is also written, by
    /// [`write_table`], as an indirect table at `table` (a device
    /// address): one descriptor pointing at the table if the device takes
    /// indirect tables, else the chain itself. The table is written once
    /// when the request is built, so a request sent again and again costs
    /// one descriptor a time (DPDK's virtio PMDs do the same).
    pub fn stage_request(&mut self, chain: &[Segment], table: u64) -> Result<Option<u16>, Error> {
        if !self.indirect || chain.len() < 2 {
            return self.stage(chain);
        }
        let Some(&id) = self.free.front() else {
            return Ok(None);
        };
        let len = u32::try_from(chain.len() * DESC_BYTES).map_err(|_| Error::Invalid {
            what: "descriptor chain",
            detail: format!("{} segments", chain.len()),
        })?;
        self.write_desc(id, table, len, DESC_F_INDIRECT, 0)?;
        self.free.pop_front();
        self.next[usize::from(id)] = None;
        self.busy[usize::from(id)] = true;
        self.head[usize::from(id)] = true;
        self.chains += 1;
        let slot = usize::from(self.avail_idx % self.size);
        let avail = Self::avail_offset(self.size);
        self.mem.write_u16(avail + 4 + 2 * slot, id)?;
        self.avail_idx = self.avail_idx.wrapping_add(1);
        Ok(Some(id))
    }

    /// Makes the staged chains available to the device.
    pub fn publish(&mut self) -> Result<(), Error> {
        // The entries before the index that publishes them.
        fence(Ordering::SeqCst);
        self.mem
            .write_u16(Self::avail_offset(self.size) + 2, self.avail_idx)?;
        // The index before the notification (or the check whether one is
        // needed).
        fence(Ordering::SeqCst);
        Ok(())
    }

    /// Its indices: this side's and what the rings in memory say.
    pub fn diagnose(&self) -> String {
        let avail = self.mem.read_u16(Self::avail_offset(self.size) + 2);
        let used = self.mem.read_u16(Self::used_offset(self.size) + 2);
        let flags = self.mem.read_u16(Self::used_offset(self.size));
        format!(
            "size {}, avail {} (ring {:?}), used ring {:?} flags {:?}, consumed {}, {} free",
            self.size,
            self.avail_idx,
            avail.ok(),
            used.ok(),
            flags.ok(),
            self.last_used,
            self.free.len()
        )
    }

    /// Whether the device wants a notification for what was pushed.
    pub fn needs_notify(&self) -> Result<bool, Error> {
        let used = Self::used_offset(self.size);
        Ok(self.mem.read_u16(used)? & USED_F_NO_NOTIFY == 0)
    }

    /// Asks the device for interrupts on completions, or for none (the
    /// driver polls the used ring). Only a hint to the device; after
    /// turning them back on, check the used ring again: a completion may
    /// have come while they were off.
    pub fn set_interrupts(&self, on: bool) -> Result<(), Error> {
        let flags = if on { 0 } else { AVAIL_F_NO_INTERRUPT };
        self.mem.write_u16(Self::avail_offset(self.size), flags)?;
        // The flag before any read of the used ring that follows.
        fence(Ordering::SeqCst);
        Ok(())
    }

    /// Whether it asks for interrupts.
    #[cfg(test)]
    pub fn interrupts(&self) -> Result<bool, Error> {
        Ok(self.mem.read_u16(Self::avail_offset(self.size))? & AVAIL_F_NO_INTERRUPT == 0)
    }

    /// Whether the device has completed anything not yet popped (one
    /// volatile load: cheap enough to spin on).
    pub fn has_used(&self) -> bool {
        self.mem
            .read_u16(Self::used_offset(self.size) + 2)
            .is_ok_and(|idx| idx != self.last_used)
    }

    /// The next completion: the head of a chain the device is done with and
    /// the bytes it wrote; its descriptors are free again.
    ///
    /// The device is trusted with nothing here: a used index that runs
    /// ahead of the chains it holds (more completions than requests, or a
    /// jump past the ring), and an entry that names anything but the head
    /// of a chain it holds (out of range, a free descriptor, the middle of
    /// a live chain, a chain completed already) are [`Error::Broken`] —
    /// and nothing is freed for them, so no memory a live chain points at
    /// is handed out again. A broken queue is not to be used again before
    /// [`SplitQueue::reset`].
    pub fn pop_used(&mut self) -> Result<Option<(u16, u32)>, Error> {
        let used = Self::used_offset(self.size);
        let idx = self.mem.read_u16(used + 2)?;
        let announced = idx.wrapping_sub(self.last_used);
        if announced == 0 {
            return Ok(None);
        }
        if usize::from(announced) > self.chains {
            return Err(Error::Broken(format!(
                "used index {idx} announces {announced} completions after {}, with {} chains \
                 in the device (ring of {})",
                self.last_used, self.chains, self.size
            )));
        }
        // The index before the entry it covers.
        fence(Ordering::SeqCst);
        let slot = usize::from(self.last_used % self.size);
        let id = self.mem.read_u32(used + 4 + 8 * slot)?;
        let len = self.mem.read_u32(used + 8 + 8 * slot)?;
        // Poison the entry (before its chain is freed, so the device cannot
        // be writing it now): a device that publishes a later index before
        // writing this slot again is caught, not believed with a stale id.
        self.mem.write_u32(used + 4 + 8 * slot, u32::MAX)?;
        let head = u16::try_from(id)
            .ok()
            .filter(|&h| h < self.size && self.head[usize::from(h)])
            .ok_or_else(|| {
                Error::Broken(format!(
                    "used entry {} names descriptor {id}, which heads no chain in the device",
                    self.last_used
                ))
            })?;
        self.last_used = self.last_used.wrapping_add(1);
        self.head[usize::from(head)] = false;
        self.chains -= 1;
        // Free the chain, by this side's links (the device cannot change
        // them: they are not in its memory).
        let mut at = Some(head);
        while let Some(d) = at {
            // Links are this side's own and each chain's are disjoint: a
            // descriptor that is not busy here is a bug in this driver.
            debug_assert!(self.busy[usize::from(d)], "descriptor {d} freed twice");
            self.busy[usize::from(d)] = false;
            self.free.push_back(d);
            at = self.next[usize::from(d)].take();
        }
        Ok(Some((head, len)))
    }

    fn write_desc(&self, id: u16, addr: u64, len: u32, flags: u16, next: u16) -> Result<(), Error> {
        write_desc(
            &self.mem,
            DESC_BYTES * usize::from(id),
            addr,
            len,
            flags,
            next,
        )
    }
}

/// Writes one descriptor at byte `at` of `mem`.
fn write_desc(
    mem: &DmaBuf,
    at: usize,
    addr: u64,
    len: u32,
    flags: u16,
    next: u16,
) -> Result<(), Error> {
    // Two stores, not four: `len`, `flags` and `next` are the second
    // little-endian u64 of the descriptor.
    mem.write_u64(at, addr)?;
    mem.write_u64(
        at + 8,
        u64::from(len) | u64::from(flags) << 32 | u64::from(next) << 48,
    )
}

/// Writes `chain` as an indirect descriptor table at byte `at` of `mem`
/// (`chain.len()` × [`DESC_BYTES`]), for [`SplitQueue::stage_request`].
///
/// A request's table (five descriptors at most) is built on the stack and
/// copied in with one bounds check: a checked store per half-descriptor
/// was ~640 instructions of the driver's per-request path (callgrind
/// around the `per_request_cost` test), and under TCG every instruction
/// counts.
pub fn write_table(mem: &DmaBuf, at: usize, chain: &[Segment]) -> Result<(), Error> {
    const ON_STACK: usize = 8;
    let fields = |i: usize| {
        let last = i + 1 == chain.len();
        let mut flags = if chain[i].device_writes {
            DESC_F_WRITE
        } else {
            0
        };
        if !last {
            flags |= DESC_F_NEXT;
        }
        (flags, if last { 0 } else { (i + 1) as u16 })
    };
    let mut table = [0u8; DESC_BYTES * ON_STACK];
    let on_stack = chain.len().min(ON_STACK);
    for (i, d) in table
        .chunks_exact_mut(DESC_BYTES)
        .take(on_stack)
        .enumerate()
    {
        let (flags, next) = fields(i);
        d[..8].copy_from_slice(&chain[i].iova.to_le_bytes());
        d[8..12].copy_from_slice(&chain[i].len.to_le_bytes());
        d[12..14].copy_from_slice(&flags.to_le_bytes());
        d[14..].copy_from_slice(&next.to_le_bytes());
    }
    mem.write(at, &table[..on_stack * DESC_BYTES])?;
    for (i, seg) in chain.iter().enumerate().skip(ON_STACK) {
        let (flags, next) = fields(i);
        write_desc(mem, at + DESC_BYTES * i, seg.iova, seg.len, flags, next)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::dma::DmaPool;

    /// Plays the device: takes the next available chain and completes it.
    fn device_completes(
        q: &SplitQueue,
        seen_avail: &mut u16,
        written: u32,
    ) -> Vec<(u64, u32, u16)> {
        let avail = SplitQueue::avail_offset(q.size);
        let used = SplitQueue::used_offset(q.size);
        let idx = q.mem.read_u16(avail + 2).unwrap();
        assert_ne!(idx, *seen_avail, "nothing available");
        let head = q
            .mem
            .read_u16(avail + 4 + 2 * usize::from(*seen_avail % q.size))
            .unwrap();
        *seen_avail = seen_avail.wrapping_add(1);
        let mut chain = Vec::new();
        let mut d = head;
        loop {
            let at = 16 * usize::from(d);
            let addr = q.mem.read_u64(at).unwrap();
            let len = q.mem.read_u32(at + 8).unwrap();
            let flags = q.mem.read_u16(at + 12).unwrap();
            chain.push((addr, len, flags));
            if flags & DESC_F_NEXT == 0 {
                break;
            }
            d = q.mem.read_u16(at + 14).unwrap();
        }
        let uidx = q.mem.read_u16(used + 2).unwrap();
        let slot = usize::from(uidx % q.size);
        q.mem
            .write_u32(used + 4 + 8 * slot, u32::from(head))
            .unwrap();
        q.mem.write_u32(used + 8 + 8 * slot, written).unwrap();
        q.mem.write_u16(used + 2, uidx.wrapping_add(1)).unwrap();
        chain
    }

    fn queue(size: u16) -> SplitQueue {
        let pool = Arc::new(DmaPool::unmapped(64 * 1024).unwrap());
        let mem = pool.try_alloc(SplitQueue::bytes(size)).unwrap().unwrap();
        SplitQueue::new(mem, size).unwrap()
    }

    #[test]
    fn chains_go_out_linked_and_come_back_free() {
        let mut q = queue(4);
        let seg = |iova, len, device_writes| Segment {
            iova,
            len,
            device_writes,
        };
        let head = q
            .push(&[
                seg(0x1000, 72, false),
                seg(0x2000, 16, true),
                seg(0x3000, 1, true),
            ])
            .unwrap()
            .unwrap();
        assert_eq!(q.free_descriptors(), 1);
        assert!(
            q.push(&[seg(0, 1, false), seg(0, 1, false)])
                .unwrap()
                .is_none(),
            "full"
        );
        assert!(q.needs_notify().unwrap());
        let mut seen = 0;
        let chain = device_completes(&q, &mut seen, 17);
        assert_eq!(
            chain,
            vec![
                (0x1000, 72, DESC_F_NEXT),
                (0x2000, 16, DESC_F_NEXT | DESC_F_WRITE),
                (0x3000, 1, DESC_F_WRITE)
            ]
        );
        assert_eq!(q.pop_used().unwrap(), Some((head, 17)));
        assert_eq!(q.pop_used().unwrap(), None);
        assert_eq!(q.free_descriptors(), 4);
    }

    #[test]
    fn a_table_reads_back_descriptor_by_descriptor_past_the_stack_copy() {
        let pool = Arc::new(DmaPool::unmapped(64 * 1024).unwrap());
        let table = pool.try_alloc(DESC_BYTES * 12 + 16).unwrap().unwrap();
        let chain: Vec<Segment> = (0..11u32)
            .map(|i| Segment {
                iova: 0x1_0000_0000 * u64::from(i) + 0x1000,
                len: 100 + i,
                device_writes: i % 2 == 1,
            })
            .collect();
        write_table(&table, 16, &chain).unwrap();
        for (i, seg) in chain.iter().enumerate() {
            let at = 16 + DESC_BYTES * i;
            assert_eq!(table.read_u64(at).unwrap(), seg.iova, "descriptor {i}");
            assert_eq!(table.read_u32(at + 8).unwrap(), seg.len);
            let last = i + 1 == chain.len();
            let flags = table.read_u16(at + 12).unwrap();
            assert_eq!(flags & DESC_F_WRITE != 0, seg.device_writes);
            assert_eq!(flags & DESC_F_NEXT != 0, !last);
            let next = if last { 0 } else { i as u16 + 1 };
            assert_eq!(table.read_u16(at + 14).unwrap(), next);
        }
        let near_end = table.len() - DESC_BYTES * 4;
        assert!(
            write_table(&table, near_end, &chain[..5]).is_err(),
            "a table past the buffer's end is refused"
        );
    }

    #[test]
    fn a_request_with_a_table_takes_one_descriptor_once_indirect_is_on() {
        let pool = Arc::new(DmaPool::unmapped(64 * 1024).unwrap());
        let mut q =
            SplitQueue::new(pool.try_alloc(SplitQueue::bytes(4)).unwrap().unwrap(), 4).unwrap();
        let seg = |iova, len, device_writes| Segment {
            iova,
            len,
            device_writes,
        };
        let chain = [
            seg(0x1000, 72, false),
            seg(0x2000, 16, true),
            seg(0x3000, 1, true),
        ];
        let table = pool.try_alloc(128).unwrap().unwrap();
        write_table(&table, 16, &chain).unwrap();
        let at = table.iova(16);
        // Not negotiated: the chain itself.
        q.stage_request(&chain, at).unwrap().unwrap();
        q.publish().unwrap();
        assert_eq!(q.free_descriptors(), 1);
        let mut seen = 0;
        assert_eq!(device_completes(&q, &mut seen, 1).len(), 3);
        q.pop_used().unwrap().unwrap();
        assert_eq!(q.free_descriptors(), 4);

        q.set_indirect(true);
        let heads: Vec<u16> = (0..4)
            .map(|_| q.stage_request(&chain, at).unwrap().unwrap())
            .collect();
        assert!(q.stage_request(&chain, at).unwrap().is_none(), "full");
        q.publish().unwrap();
        assert_eq!(
            device_completes(&q, &mut seen, 17),
            vec![(at, 48, DESC_F_INDIRECT)]
        );
        let desc = |i: usize| {
            let d = 16 + DESC_BYTES * i;
            (
                table.read_u64(d).unwrap(),
                table.read_u32(d + 8).unwrap(),
                table.read_u16(d + 12).unwrap(),
                table.read_u16(d + 14).unwrap(),
            )
        };
        assert_eq!(
            [desc(0), desc(1), desc(2)],
            [
                (0x1000, 72, DESC_F_NEXT, 1),
                (0x2000, 16, DESC_F_NEXT | DESC_F_WRITE, 2),
                (0x3000, 1, DESC_F_WRITE, 0)
            ]
        );
        assert_eq!(q.pop_used().unwrap(), Some((heads[0], 17)));
        assert_eq!(q.free_descriptors(), 1);
        // A one-segment chain needs no table.
        let one = q.stage_request(&chain[..1], at).unwrap().unwrap();
        let d = DESC_BYTES * usize::from(one);
        assert_eq!(
            (q.mem.read_u64(d).unwrap(), q.mem.read_u16(d + 12).unwrap()),
            (0x1000, 0)
        );
    }

    #[test]
    fn interrupts_are_asked_for_unless_turned_off() {
        let q = queue(4);
        let flags = || q.mem.read_u16(SplitQueue::avail_offset(4)).unwrap();
        assert!(q.interrupts().unwrap());
        q.set_interrupts(false).unwrap();
        assert_eq!(flags(), AVAIL_F_NO_INTERRUPT);
        assert!(!q.interrupts().unwrap());
        q.set_interrupts(true).unwrap();
        assert_eq!(flags(), 0);
    }

    #[test]
    fn indices_wrap_around_the_ring_and_past_u16() {
        let mut q = queue(2);
        let mut seen = 0u16;
        for i in 0..70_000u32 {
            let head = q
                .push(&[Segment {
                    iova: u64::from(i),
                    len: 1,
                    device_writes: false,
                }])
                .unwrap()
                .unwrap();
            device_completes(&q, &mut seen, i);
            assert_eq!(q.pop_used().unwrap(), Some((head, i)));
        }
        assert_eq!(q.free_descriptors(), 2);
    }

    #[test]
    fn a_reset_queue_starts_over_empty() {
        let mut q = queue(4);
        let mut seen = 0;
        q.push(&[Segment {
            iova: 1,
            len: 1,
            device_writes: false,
        }])
        .unwrap();
        device_completes(&q, &mut seen, 1);
        q.push(&[Segment {
            iova: 2,
            len: 1,
            device_writes: false,
        }])
        .unwrap();
        q.reset().unwrap();
        assert_eq!(q.free_descriptors(), 4);
        assert_eq!(q.mem.read_u16(SplitQueue::avail_offset(4) + 2).unwrap(), 0);
        assert_eq!(q.mem.read_u16(SplitQueue::used_offset(4) + 2).unwrap(), 0);
        let mut seen = 0;
        let head = q
            .push(&[Segment {
                iova: 3,
                len: 1,
                device_writes: false,
            }])
            .unwrap()
            .unwrap();
        assert_eq!(device_completes(&q, &mut seen, 5), vec![(3, 1, 0)]);
        assert_eq!(q.pop_used().unwrap(), Some((head, 5)));
    }

    #[test]
    fn a_lying_device_is_an_error_not_a_panic() {
        let mut q = queue(2);
        q.push(&[Segment {
            iova: 0,
            len: 1,
            device_writes: false,
        }])
        .unwrap();
        let used = SplitQueue::used_offset(2);
        q.mem.write_u32(used + 4, 7).unwrap(); // no descriptor 7
        q.mem.write_u16(used + 2, 1).unwrap();
        assert!(matches!(q.pop_used(), Err(Error::Broken(_))));
        assert!(SplitQueue::new(q.mem, 3).is_err(), "not a power of two");
    }

    #[test]
    fn a_chain_completed_twice_is_an_error() {
        let mut q = queue(4);
        let mut seen = 0;
        let head = q
            .push(&[Segment {
                iova: 0,
                len: 1,
                device_writes: false,
            }])
            .unwrap()
            .unwrap();
        device_completes(&q, &mut seen, 1);
        assert_eq!(q.pop_used().unwrap(), Some((head, 1)));
        // The device repeats the same head in the next used entry.
        let used = SplitQueue::used_offset(4);
        q.mem.write_u32(used + 4 + 8, u32::from(head)).unwrap();
        q.mem.write_u16(used + 2, 2).unwrap();
        assert!(matches!(q.pop_used(), Err(Error::Broken(_))));
        assert_eq!(q.free_descriptors(), 4, "freed once");
    }

    fn one(iova: u64) -> [Segment; 1] {
        [Segment {
            iova,
            len: 1,
            device_writes: false,
        }]
    }

    /// Writes used entry `slot` and the used index as a (lying) device.
    fn device_writes_used(q: &SplitQueue, entry: u16, id: u32, idx: u16) {
        let used = SplitQueue::used_offset(q.size);
        let slot = usize::from(entry % q.size);
        q.mem.write_u32(used + 4 + 8 * slot, id).unwrap();
        q.mem.write_u32(used + 8 + 8 * slot, 0).unwrap();
        q.mem.write_u16(used + 2, idx).unwrap();
    }

    #[test]
    fn a_used_entry_naming_the_middle_of_a_live_chain_frees_nothing() {
        let mut q = queue(8);
        let seg = |iova| Segment {
            iova,
            len: 1,
            device_writes: false,
        };
        let head = q.push(&[seg(1), seg(2), seg(3)]).unwrap().unwrap();
        let chain = q.chain_of(head).unwrap();
        assert_eq!(chain.len(), 3);
        // The device names the chain's second descriptor: busy, but no head.
        device_writes_used(&q, 0, u32::from(chain[1]), 1);
        assert!(matches!(q.pop_used(), Err(Error::Broken(_))));
        assert_eq!(
            q.free_descriptors(),
            5,
            "the live chain keeps its descriptors"
        );
        assert_eq!(q.chains_in_flight(), 1);
        // A free descriptor is no head either.
        let free = (0..8).find(|d| !chain.contains(d)).unwrap();
        device_writes_used(&q, 0, u32::from(free), 1);
        assert!(matches!(q.pop_used(), Err(Error::Broken(_))));
        assert_eq!(q.free_descriptors(), 5);
    }

    #[test]
    fn a_used_index_that_runs_ahead_of_the_requests_is_broken() {
        let mut q = queue(8);
        let heads: Vec<u16> = (0..2).map(|i| q.push(&one(i)).unwrap().unwrap()).collect();
        // Two chains in the device: an index 3 ahead announces one too many
        // (and 9 ahead, past the ring, many too many).
        for idx in [3u16, 9, 0x8000, u16::MAX] {
            device_writes_used(&q, 0, u32::from(heads[0]), idx);
            assert!(
                matches!(q.pop_used(), Err(Error::Broken(_))),
                "index {idx} accepted"
            );
            assert_eq!(q.free_descriptors(), 6, "nothing freed for index {idx}");
        }
        // Within the chains it holds, completions are taken in order.
        device_writes_used(&q, 0, u32::from(heads[1]), 1);
        assert_eq!(q.pop_used().unwrap(), Some((heads[1], 0)));
        assert_eq!(q.chains_in_flight(), 1);
    }

    #[test]
    fn a_head_completed_twice_is_broken_even_with_others_in_flight() {
        let mut q = queue(8);
        let a = q.push(&one(1)).unwrap().unwrap();
        let b = q.push(&one(2)).unwrap().unwrap();
        device_writes_used(&q, 0, u32::from(a), 1);
        assert_eq!(q.pop_used().unwrap(), Some((a, 0)));
        // Entry 1 names `a` again while `b` is still in the device.
        device_writes_used(&q, 1, u32::from(a), 2);
        assert!(matches!(q.pop_used(), Err(Error::Broken(_))));
        assert_eq!(q.chain_of(b), Some(vec![b]), "b is untouched");
        assert_eq!(q.busy_descriptors(), 1);
    }
}
