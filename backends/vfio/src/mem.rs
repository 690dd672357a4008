//! Mapped memory the device also sees: the DMA pool (anonymous memory the
//! IOMMU maps for the device) and BARs (device registers). Never as Rust
//! references — the device changes it behind the compiler's back — only
//! through bounds-checked volatile loads and stores and explicit copies.
//! Every `unsafe` touching mapped memory is in this module.

use std::num::NonZeroUsize;
use std::os::fd::BorrowedFd;
use std::ptr::NonNull;

use nix::sys::mman::{MapFlags, ProtFlags, mmap, mmap_anonymous, munmap};

use crate::error::Error;

/// The huge page size the DMA pool uses for physical addressing (x86-64's
/// default).
pub(crate) const HUGE_PAGE: usize = 2 << 20;

/// A mapping, unmapped on drop.
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a `Mapping` is a region of memory, not tied to a thread; every
// access goes through `&self` methods doing volatile or bounded copies, and
// which offsets may be touched concurrently is the callers' protocol (ring
// indices under a lock, buffers owned by one request at a time).
unsafe impl Send for Mapping {}
// SAFETY: as for `Send`: shared access is only through the methods below.
unsafe impl Sync for Mapping {}

macro_rules! volatile_accessors {
    ($($read:ident, $write:ident, $t:ty;)*) => {$(
        /// A volatile load of a little-endian value at `offset`.
        pub(crate) fn $read(&self, offset: usize) -> Result<$t, Error> {
            let p = self.at(offset, size_of::<$t>())?;
            // SAFETY: `at` checked that `offset..offset + size` is inside the
            // mapping and aligned for the type; the mapping is live while
            // `self` is.
            Ok(<$t>::from_le(unsafe { p.cast::<$t>().as_ptr().read_volatile() }))
        }

        /// A volatile store of a little-endian value at `offset`.
        pub(crate) fn $write(&self, offset: usize, value: $t) -> Result<(), Error> {
            let p = self.at(offset, size_of::<$t>())?;
            // SAFETY: as for the load; the mapping is writable (both kinds
            // are mapped read-write).
            unsafe { p.cast::<$t>().as_ptr().write_volatile(value.to_le()) };
            Ok(())
        }
    )*};
}

impl Mapping {
    /// `len` bytes of zeroed anonymous memory, populated now (so that the
    /// IOMMU mapping pins it at once).
    pub(crate) fn anonymous(len: usize) -> Result<Mapping, Error> {
        Mapping::populated(len, MapFlags::empty(), "mmap")
    }

    /// `len` bytes (a multiple of [`HUGE_PAGE`]) of zeroed anonymous
    /// memory in huge pages, populated now: each huge page is physically
    /// contiguous, so a device that takes guest-physical addresses can be
    /// given one (from the reserved pool: `/proc/sys/vm/nr_hugepages`).
    pub(crate) fn anonymous_huge(len: usize) -> Result<Mapping, Error> {
        if !len.is_multiple_of(HUGE_PAGE) {
            return Err(Error::Invalid {
                what: "huge mapping length",
                detail: format!("{len} bytes"),
            });
        }
        Mapping::populated(
            len,
            MapFlags::MAP_HUGETLB,
            "mmap MAP_HUGETLB (no huge pages reserved?)",
        )
    }

    fn populated(len: usize, extra: MapFlags, op: &'static str) -> Result<Mapping, Error> {
        let size = NonZeroUsize::new(len).ok_or(Error::Invalid {
            what: "mapping length",
            detail: "zero".into(),
        })?;
        // SAFETY: a fresh private anonymous mapping aliases nothing.
        let ptr = unsafe {
            mmap_anonymous(
                None,
                size,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_PRIVATE | MapFlags::MAP_POPULATE | extra,
            )
        }
        .map_err(|e| Error::sys(op, e))?;
        Ok(Mapping {
            ptr: ptr.cast(),
            len,
        })
    }

    /// The physical address of byte `offset`, from `/proc/self/pagemap`
    /// (which shows frame numbers to CAP_SYS_ADMIN only).
    pub(crate) fn physical_address(&self, offset: usize) -> Result<u64, Error> {
        use std::io::{Read, Seek, SeekFrom};
        let vaddr = self.addr() + offset as u64;
        let mut entry = [0u8; 8];
        let mut f = std::fs::File::open("/proc/self/pagemap").map_err(|source| Error::Io {
            op: "open /proc/self/pagemap",
            source,
        })?;
        f.seek(SeekFrom::Start(vaddr / 4096 * 8))
            .and_then(|_| f.read_exact(&mut entry))
            .map_err(|source| Error::Io {
                op: "read /proc/self/pagemap",
                source,
            })?;
        let entry = u64::from_le_bytes(entry);
        let pfn = entry & ((1 << 55) - 1);
        if entry & (1 << 63) == 0 || pfn == 0 {
            return Err(Error::Unavailable {
                what: "physical addresses".into(),
                detail: "page not present or frame numbers hidden (needs CAP_SYS_ADMIN)".into(),
            });
        }
        Ok(pfn * 4096 + vaddr % 4096)
    }

    /// `len` bytes of a device region (a BAR) at `offset` in the device
    /// file.
    pub(crate) fn device(fd: BorrowedFd<'_>, offset: u64, len: usize) -> Result<Mapping, Error> {
        let size = NonZeroUsize::new(len).ok_or(Error::Invalid {
            what: "mapping length",
            detail: "zero".into(),
        })?;
        // SAFETY: a shared mapping of device registers; this process never
        // forms Rust references into it (volatile access only).
        let ptr = unsafe {
            mmap(
                None,
                size,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                fd,
                offset as i64,
            )
        }
        .map_err(|e| Error::sys("mmap BAR", e))?;
        Ok(Mapping {
            ptr: ptr.cast(),
            len,
        })
    }

    /// Its length.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Its address in this process (for `VFIO_IOMMU_MAP_DMA`).
    pub(crate) fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// A pointer to `size` bytes at `offset`, if inside and aligned to
    /// `size` (loads and stores of 1, 2, 4, 8 bytes) — or any alignment for
    /// byte copies (`size` then being their length, `align` 1).
    fn at(&self, offset: usize, size: usize) -> Result<NonNull<u8>, Error> {
        self.at_aligned(offset, size, size)
    }

    fn at_aligned(&self, offset: usize, size: usize, align: usize) -> Result<NonNull<u8>, Error> {
        let inside = offset.checked_add(size).is_some_and(|end| end <= self.len);
        if !inside || !offset.is_multiple_of(align.max(1)) {
            return Err(Error::Device(format!(
                "access of {size} bytes at {offset:#x} outside a {:#x}-byte mapping or misaligned",
                self.len
            )));
        }
        // SAFETY: `offset < len` (or `offset == len` with size 0), so the
        // result stays within (or one past) the mapping.
        Ok(unsafe { self.ptr.add(offset) })
    }

    volatile_accessors! {
        read_u8, write_u8, u8;
        read_u16, write_u16, u16;
        read_u32, write_u32, u32;
        read_u64, write_u64, u64;
    }

    /// Copies `data` into the mapping at `offset`. Only for memory the
    /// device is not using (a buffer before it is handed over).
    pub(crate) fn write_bytes(&self, offset: usize, data: &[u8]) -> Result<(), Error> {
        let p = self.at_aligned(offset, data.len(), 1)?;
        // SAFETY: the range is inside the mapping (checked), and `data` is
        // ordinary memory that cannot overlap an anonymous or device
        // mapping this type owns.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p.as_ptr(), data.len()) };
        Ok(())
    }

    /// Copies from the mapping at `offset` into `out`. Only for memory the
    /// device has finished with (a completed request's buffer).
    pub(crate) fn read_bytes(&self, offset: usize, out: &mut [u8]) -> Result<(), Error> {
        let p = self.at_aligned(offset, out.len(), 1)?;
        // SAFETY: as for `write_bytes`, in the other direction.
        unsafe { std::ptr::copy_nonoverlapping(p.as_ptr(), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Zeroes `len` bytes at `offset` (a wipe: the fence keeps the
    /// compiler from dropping it as a dead store).
    pub(crate) fn wipe(&self, offset: usize, len: usize) -> Result<(), Error> {
        let p = self.at_aligned(offset, len, 1)?;
        // SAFETY: the range is inside the mapping (checked).
        unsafe { std::ptr::write_bytes(p.as_ptr(), 0, len) };
        std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping was made by `mmap` with this address and
        // length, and nothing refers into it once its owner drops it (the
        // DMA pool unmaps it from the IOMMU first).
        let _ = unsafe { munmap(self.ptr.cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accesses_are_bounds_and_alignment_checked() {
        let m = Mapping::anonymous(4096).unwrap();
        m.write_u32(8, 0xdead_beef).unwrap();
        assert_eq!(m.read_u32(8).unwrap(), 0xdead_beef);
        assert_eq!(m.read_u8(8).unwrap(), 0xef, "little-endian");
        m.write_u64(4088, u64::MAX).unwrap();
        assert!(m.read_u64(4096).is_err(), "past the end");
        assert!(m.read_u32(4094).is_err(), "straddles the end");
        assert!(m.read_u32(2).is_err(), "misaligned");
        assert!(m.write_bytes(4090, &[0; 7]).is_err());
        m.write_bytes(100, b"hello").unwrap();
        let mut out = [0u8; 5];
        m.read_bytes(100, &mut out).unwrap();
        assert_eq!(&out, b"hello");
        m.wipe(100, 5).unwrap();
        m.read_bytes(100, &mut out).unwrap();
        assert_eq!(out, [0; 5]);
        assert!(m.read_bytes(usize::MAX, &mut out).is_err(), "overflow");
    }
}
