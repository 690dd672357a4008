//! The DMA pool: one region of this process's memory, mapped for the device
//! once at open (mapping costs 5–15 ms a MiB in the test guest — never per
//! request), from which request buffers are carved and returned.

use std::sync::{Arc, Mutex};

use crate::error::Error;
use crate::mem::{HUGE_PAGE, Mapping};
use crate::units::Units;
use crate::vfio::Container;
use crate::virtqueue::Segment;

/// The allocation unit: small requests (a header, an IV, a status byte and
/// a few blocks of data) take one unit, not a page.
pub const UNIT: usize = 512;

/// A region the device reads and writes at `iova`.
#[derive(Debug)]
pub struct DmaPool {
    mem: Mapping,
    iova: u64,
    /// The container whose IOMMU maps it (`None`: not mapped for any
    /// device, for tests of the structures that live in it).
    container: Option<Arc<Container>>,
    /// Which [`UNIT`]s are in use.
    used: Mutex<Units>,
    /// Wakes a request waiting for room.
    freed: tokio::sync::Notify,
    /// Requests waiting on `freed` (counted before they look again).
    waiters: std::sync::atomic::AtomicUsize,
    /// Bytes held by device-ready buffers (`DmaBuffer`), which may take
    /// at most half the pool.
    pub(crate) lent: std::sync::atomic::AtomicUsize,
}

impl DmaPool {
    /// `len` bytes (rounded up to whole pages) mapped for the container's
    /// devices at `iova`.
    pub(crate) fn new(container: Arc<Container>, iova: u64, len: usize) -> Result<DmaPool, Error> {
        let mem = Mapping::anonymous(round_up(len, 4096))?;
        container.map_dma(&mem, iova)?;
        Ok(DmaPool::with(mem, iova, Some(container)))
    }

    /// A pool for a device that bypasses the IOMMU and takes guest-physical
    /// addresses (a virtio device without VIRTIO_F_ACCESS_PLATFORM, as
    /// DPDK's `--iova-mode=pa`): one huge page (physically contiguous),
    /// mapped for the container at its own physical address so that the
    /// addresses are right whether or not the device's DMA is translated.
    pub(crate) fn physical(container: Arc<Container>) -> Result<DmaPool, Error> {
        let mem = Mapping::anonymous_huge(HUGE_PAGE)?;
        let pa = mem.physical_address(0)?;
        // The page's last byte too: same frame run (it is one huge page,
        // but the kernel is asked, not assumed).
        let last = mem.physical_address(HUGE_PAGE - 1)?;
        if last != pa + HUGE_PAGE as u64 - 1 {
            return Err(Error::Device(format!(
                "huge page not physically contiguous ({pa:#x}..{last:#x})"
            )));
        }
        container.map_dma(&mem, pa)?;
        Ok(DmaPool::with(mem, pa, Some(container)))
    }

    /// A pool in plain memory that no device sees (for tests).
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn unmapped(len: usize) -> Result<DmaPool, Error> {
        let mem = Mapping::anonymous(round_up(len, 4096))?;
        Ok(DmaPool::with(mem, 0x1000_0000, None))
    }

    fn with(mem: Mapping, iova: u64, container: Option<Arc<Container>>) -> DmaPool {
        let units = mem.len() / UNIT;
        DmaPool {
            mem,
            iova,
            container,
            used: Mutex::new(Units::new(units)),
            freed: tokio::sync::Notify::new(),
            waiters: std::sync::atomic::AtomicUsize::new(0),
            lent: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.mem.len()
    }

    #[cfg(test)]
    pub(crate) fn mem(&self) -> &Mapping {
        &self.mem
    }

    /// The device address of byte `offset`.
    pub(crate) fn iova(&self, offset: usize) -> u64 {
        self.iova + offset as u64
    }

    /// `len` bytes, if there is room now.
    pub fn try_alloc(self: &Arc<Self>, len: usize) -> Result<Option<DmaBuf>, Error> {
        let units = len.max(1).div_ceil(UNIT);
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        if units > used.len() {
            return Err(Error::TooLarge {
                len,
                max: used.len() * UNIT,
            });
        }
        let Some(first) = used.find_free(units) else {
            return Ok(None);
        };
        used.mark(first, units, true);
        Ok(Some(DmaBuf {
            pool: self.clone(),
            offset: first * UNIT,
            len: units * UNIT,
            lent: false,
        }))
    }

    /// `len` bytes for a device-ready buffer, if there is room now and
    /// buffers (counted in whole units, in flight or not, until the memory
    /// is freed) stay within half the pool.
    pub(crate) fn try_alloc_lent(self: &Arc<Self>, len: usize) -> Result<Option<DmaBuf>, Error> {
        let bytes = len.max(1).div_ceil(UNIT) * UNIT;
        let total = self
            .lent
            .fetch_add(bytes, std::sync::atomic::Ordering::AcqRel)
            .saturating_add(bytes);
        let buf = if total > self.len() / 2 {
            Ok(None)
        } else {
            self.try_alloc(len)
        };
        match buf {
            Ok(Some(mut b)) => {
                b.lent = true;
                Ok(Some(b))
            }
            other => {
                self.lent
                    .fetch_sub(bytes, std::sync::atomic::Ordering::AcqRel);
                other
            }
        }
    }

    /// `len` bytes, waiting for requests to free room if need be.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is allocated until it returns.
    pub async fn alloc(self: &Arc<Self>, len: usize) -> Result<DmaBuf, Error> {
        // Room now (the usual case): no lock of the waiter list.
        if let Some(buf) = self.try_alloc(len)? {
            return Ok(buf);
        }
        loop {
            // Registered, counted, then looked at again: a free after the
            // registration wakes this; one before it is seen by the look.
            let mut notified = std::pin::pin!(self.freed.notified());
            notified.as_mut().enable();
            let _counted = Waiting::new(&self.waiters);
            if let Some(buf) = self.try_alloc(len)? {
                return Ok(buf);
            }
            notified.await;
        }
    }

    fn free(&self, offset: usize, len: usize) {
        // What requests left here (keys, plaintext) does not outlive them.
        let _ = self.mem.wipe(offset, len);
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        used.mark(offset / UNIT, len / UNIT, false);
        drop(used);
        // Only when someone waits: `notify_waiters` locks the waiter list.
        if self.waiters.load(std::sync::atomic::Ordering::Acquire) > 0 {
            self.freed.notify_waiters();
        }
    }

    /// Units in use (for tests and stats).
    pub fn units_in_use(&self) -> usize {
        let used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        used.count_used()
    }
}

/// The device's access to the pool, by device address (for the emulated
/// device of the tests and the fuzz harness, which play the device over
/// plain memory): bounds-checked, through the same volatile accessors.
#[cfg(any(test, feature = "fuzzing"))]
impl DmaPool {
    /// The pool offset of `len` bytes at device address `iova`, if they
    /// are all inside the pool.
    fn device_offset(&self, iova: u64, len: usize) -> Result<usize, Error> {
        let offset = iova
            .checked_sub(self.iova)
            .and_then(|o| usize::try_from(o).ok())
            .filter(|&o| o.checked_add(len).is_some_and(|end| end <= self.mem.len()));
        offset.ok_or_else(|| {
            Error::Device(format!(
                "device access of {len} bytes at {iova:#x} outside the pool"
            ))
        })
    }

    /// The device reads `out.len()` bytes at `iova`.
    pub fn device_read(&self, iova: u64, out: &mut [u8]) -> Result<(), Error> {
        self.mem
            .read_bytes(self.device_offset(iova, out.len())?, out)
    }

    /// The device writes `data` at `iova`.
    pub fn device_write(&self, iova: u64, data: &[u8]) -> Result<(), Error> {
        self.mem
            .write_bytes(self.device_offset(iova, data.len())?, data)
    }

    /// The device reads a little-endian `u16` at `iova`.
    pub fn device_read_u16(&self, iova: u64) -> Result<u16, Error> {
        self.mem.read_u16(self.device_offset(iova, 2)?)
    }

    /// The device reads a little-endian `u32` at `iova`.
    pub fn device_read_u32(&self, iova: u64) -> Result<u32, Error> {
        self.mem.read_u32(self.device_offset(iova, 4)?)
    }

    /// The device reads a little-endian `u64` at `iova`.
    pub fn device_read_u64(&self, iova: u64) -> Result<u64, Error> {
        self.mem.read_u64(self.device_offset(iova, 8)?)
    }

    /// The device writes a little-endian `u16` at `iova`.
    pub fn device_write_u16(&self, iova: u64, value: u16) -> Result<(), Error> {
        self.mem.write_u16(self.device_offset(iova, 2)?, value)
    }

    /// The device writes a little-endian `u32` at `iova`.
    pub fn device_write_u32(&self, iova: u64, value: u32) -> Result<(), Error> {
        self.mem.write_u32(self.device_offset(iova, 4)?, value)
    }

    /// Whether every byte of `iova..iova + len` belongs to a buffer handed
    /// out and not yet returned (memory a chain in the device may point
    /// at must be).
    pub fn is_allocated(&self, iova: u64, len: usize) -> bool {
        let Ok(offset) = self.device_offset(iova, len.max(1)) else {
            return false;
        };
        let used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        let last = (offset + len.max(1) - 1) / UNIT;
        used.all_used(offset / UNIT, last)
    }
}

impl Drop for DmaPool {
    fn drop(&mut self) {
        if let Some(c) = &self.container {
            // The device must not reach this memory once it is unmapped.
            let _ = c.unmap_dma(self.iova, self.mem.len() as u64);
        }
    }
}

/// Volatile little-endian loads and stores at offsets into a [`DmaBuf`]
/// (ring indices and statuses the device writes).
macro_rules! dma_accessors {
    ($($read:ident, $write:ident, $t:ty;)*) => {$(
        #[allow(dead_code)]
        pub(crate) fn $read(&self, at: usize) -> Result<$t, Error> {
            let offset = self.check(at, size_of::<$t>())?;
            self.pool.mem.$read(offset)
        }

        #[allow(dead_code)]
        pub(crate) fn $write(&self, at: usize, value: $t) -> Result<(), Error> {
            let offset = self.check(at, size_of::<$t>())?;
            self.pool.mem.$write(offset, value)
        }
    )*};
}

/// A piece of the pool, wiped and returned when dropped.
#[derive(Debug)]
pub struct DmaBuf {
    pool: Arc<DmaPool>,
    offset: usize,
    len: usize,
    /// A device-ready buffer's memory: counted in the pool's `lent` bytes
    /// until freed (wherever it is meanwhile: with its owner, in the
    /// device, parked).
    lent: bool,
}

impl DmaBuf {
    /// Its length (whole units).
    pub fn len(&self) -> usize {
        self.len
    }

    /// The descriptor segment for `len` bytes at `at`, which the device
    /// reads, or writes if `device_writes`.
    pub(crate) fn segment(&self, at: usize, len: usize, device_writes: bool) -> Segment {
        Segment {
            iova: self.iova(at),
            len: len as u32,
            device_writes,
        }
    }

    /// Whether it comes from `pool`.
    pub fn same_pool(&self, pool: &Arc<DmaPool>) -> bool {
        Arc::ptr_eq(&self.pool, pool)
    }

    /// The device address of byte `at`.
    pub fn iova(&self, at: usize) -> u64 {
        self.pool.iova(self.offset + at)
    }

    fn check(&self, at: usize, len: usize) -> Result<usize, Error> {
        match at.checked_add(len) {
            Some(end) if end <= self.len => Ok(self.offset + at),
            _ => Err(Error::Invalid {
                what: "DMA buffer range",
                detail: format!("{len} bytes at {at} of {}", self.len),
            }),
        }
    }

    /// `len` bytes at `at` as a shared slice: a device-ready buffer's
    /// data.
    ///
    /// # Safety
    /// Nothing writes the range while the slice lives: no write through
    /// this buffer (`write` and the like take `&self`), and the buffer is
    /// not in the device.
    pub(crate) unsafe fn slice(&self, at: usize, len: usize) -> Result<&[u8], Error> {
        let offset = self.check(at, len)?;
        // SAFETY: the range is this buffer's (the pool hands a unit to one
        // buffer at a time); no writer while the slice lives is the
        // caller's promise.
        unsafe { self.pool.mem.slice(offset, len) }
    }

    /// `len` bytes at `at` as a slice, to fill or read in place: a
    /// device-ready buffer's data.
    ///
    /// # Safety
    /// The buffer is not in the device while the slice lives (`&mut self`
    /// excludes every other access through it).
    pub(crate) unsafe fn slice_mut(&mut self, at: usize, len: usize) -> Result<&mut [u8], Error> {
        let offset = self.check(at, len)?;
        // SAFETY: this `DmaBuf` owns `offset..offset + len` (the pool hands
        // a unit to one buffer at a time), `&mut self` excludes every other
        // access through it for the slice's life, and the device does not
        // have it (the caller's promise).
        unsafe { self.pool.mem.slice_mut(offset, len) }
    }

    /// Copies `data` in at `at`.
    pub fn write(&self, at: usize, data: &[u8]) -> Result<(), Error> {
        let offset = self.check(at, data.len())?;
        self.pool.mem.write_bytes(offset, data)
    }

    /// Copies out from `at`.
    pub fn read(&self, at: usize, out: &mut [u8]) -> Result<(), Error> {
        let offset = self.check(at, out.len())?;
        self.pool.mem.read_bytes(offset, out)
    }

    dma_accessors! {
        read_u8, write_u8, u8;
        read_u16, write_u16, u16;
        read_u32, write_u32, u32;
        read_u64, write_u64, u64;
    }
}

impl Drop for DmaBuf {
    fn drop(&mut self) {
        self.pool.free(self.offset, self.len);
        if self.lent {
            self.pool
                .lent
                .fetch_sub(self.len, std::sync::atomic::Ordering::AcqRel);
        }
    }
}

/// A request counted as waiting for pool room while it lives (a dropped
/// future uncounts itself).
struct Waiting<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> Waiting<'a> {
    fn new(count: &'a std::sync::atomic::AtomicUsize) -> Waiting<'a> {
        count.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Waiting(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

fn round_up(n: usize, to: usize) -> usize {
    n.div_ceil(to).max(1) * to
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocation_is_first_fit_in_units_and_returns_wiped() {
        // A page: eight units.
        let pool = Arc::new(DmaPool::unmapped(4096).unwrap());
        let a = pool.try_alloc(1).unwrap().unwrap();
        let b = pool.try_alloc(UNIT + 1).unwrap().unwrap();
        assert_eq!((a.len(), b.len()), (UNIT, 2 * UNIT));
        assert_eq!(b.iova(0), a.iova(0) + UNIT as u64);
        a.write(0, b"secret").unwrap();
        let offset = a.offset;
        drop(a);
        let mut left = [1u8; 6];
        pool.mem().read_bytes(offset, &mut left).unwrap();
        assert_eq!(left, [0; 6], "wiped on return");
        assert_eq!(pool.units_in_use(), 2);
        assert!(
            pool.try_alloc(6 * UNIT).unwrap().is_none(),
            "no room in a row"
        );
        assert!(matches!(
            pool.try_alloc(9 * UNIT),
            Err(Error::TooLarge { .. })
        ));
        let c = pool.try_alloc(UNIT).unwrap().unwrap();
        assert_eq!(c.offset, 0, "first fit reuses the freed unit");
        assert!(c.write(UNIT - 1, &[0, 0]).is_err(), "past its end");
    }

    #[tokio::test]
    async fn alloc_waits_for_room() {
        let pool = Arc::new(DmaPool::unmapped(4096).unwrap());
        let held = pool.alloc(4096).await.unwrap();
        let p = pool.clone();
        let waiter = tokio::spawn(async move { p.alloc(UNIT).await.map(|b| b.len()) });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(held);
        assert_eq!(waiter.await.unwrap().unwrap(), UNIT);
    }

    /// A request waiting for room is woken by a free (and only a waiting
    /// one costs the waiter list's lock); one dropped while waiting is no
    /// longer counted.
    #[tokio::test]
    async fn a_full_pool_wakes_its_waiter_on_a_free_and_forgets_a_dropped_one() {
        use std::sync::atomic::Ordering;
        let pool = Arc::new(DmaPool::unmapped(4096).unwrap());
        let all = pool.try_alloc(4096).unwrap().unwrap();
        let dropped =
            tokio::time::timeout(std::time::Duration::from_millis(10), pool.alloc(512)).await;
        assert!(dropped.is_err(), "no room: it waits");
        assert_eq!(
            pool.waiters.load(Ordering::Acquire),
            0,
            "the dropped one uncounted"
        );
        let waiter = {
            let pool = pool.clone();
            tokio::spawn(async move { pool.alloc(512).await.map(|b| b.len()) })
        };
        while pool.waiters.load(Ordering::Acquire) == 0 {
            tokio::task::yield_now().await;
        }
        drop(all);
        assert_eq!(waiter.await.unwrap().unwrap(), 512);
        assert_eq!(pool.waiters.load(Ordering::Acquire), 0);
    }
}
