//! Mapped memory the device also sees: the DMA pool (anonymous memory the
//! IOMMU maps for the device) and BARs (device registers). Never as Rust
//! references while the device may change it behind the compiler's back —
//! only through bounds-checked volatile loads and stores and explicit
//! copies — with one exception: a device-ready buffer's data, lent to its
//! owner as a slice while no request holds it ([`Mapping::slice_mut`]).
//! Every `unsafe` touching mapped memory is in this module.

use std::num::NonZeroUsize;
use std::os::fd::BorrowedFd;
use std::ptr::NonNull;

use nix::sys::mman::{MapFlags, MmapAdvise, ProtFlags, madvise, mmap, mmap_anonymous, munmap};

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
        let mapping = Mapping {
            ptr: ptr.cast(),
            len,
        };
        // Keys and plaintext pass through this memory: a child process
        // (fork) gets none of it — nor would the pinned pages be shared
        // copy-on-write with it, which breaks DMA into them — and a core
        // dump leaves it out.
        for (advice, what) in [
            (MmapAdvise::MADV_DONTFORK, "madvise MADV_DONTFORK"),
            (MmapAdvise::MADV_DONTDUMP, "madvise MADV_DONTDUMP"),
        ] {
            // SAFETY: the range is exactly the mapping just made, which
            // this process owns; neither advice changes its contents.
            unsafe { madvise(mapping.ptr.cast(), len, advice) }.map_err(|e| Error::sys(what, e))?;
        }
        Ok(mapping)
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

    /// Copies `data` into the mapping at `offset`, with volatile stores:
    /// the device may read this memory at any time, and the compiler must
    /// neither drop, merge nor reorder the stores as if only this thread
    /// could see them. Aligned 8-byte stores where the mapping's side is
    /// aligned, single bytes at the ends.
    ///
    /// (Hand-written rather than `vm-memory`'s `VolatileSlice::copy_from`:
    /// that copies with a plain `memcpy` above 8 bytes. The cost, measured
    /// on the build machine (AMD EPYC, 2 cores; `cargo test --release -p
    /// crypto-offload-vfio --lib -- --ignored volatile_copy_speed
    /// --nocapture`, two runs): 4 KiB in 66–67 ns (61–63 GB/s, 0.52–0.57x
    /// `memcpy` from cache), 256 KiB in 5.6–6.1 µs (43–47 GB/s) — a
    /// request's copy in or out, beside the device's 65–95 µs a request in
    /// the test guest.)
    pub(crate) fn write_bytes(&self, offset: usize, data: &[u8]) -> Result<(), Error> {
        let p = self.at_aligned(offset, data.len(), 1)?;
        let (head, words, tail) = split_aligned(p.as_ptr() as usize, data.len());
        for (i, b) in data[..head].iter().enumerate() {
            // SAFETY: `i < data.len()`, and the range `offset..offset +
            // data.len()` is inside the mapping (checked above).
            unsafe { p.as_ptr().add(i).write_volatile(*b) };
        }
        for (k, chunk) in data[head..head + 8 * words].chunks_exact(8).enumerate() {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            // SAFETY: `head + 8k + 8 <= data.len()`, inside the mapping as
            // above; `p + head` is 8-aligned (`split_aligned`), so each
            // word's address is too.
            unsafe {
                p.as_ptr()
                    .add(head + 8 * k)
                    .cast::<u64>()
                    .write_volatile(u64::from_ne_bytes(word))
            };
        }
        let rest = head + 8 * words;
        for (i, b) in data[rest..rest + tail].iter().enumerate() {
            // SAFETY: `rest + i < data.len()`, inside the mapping as above.
            unsafe { p.as_ptr().add(rest + i).write_volatile(*b) };
        }
        Ok(())
    }

    /// Copies from the mapping at `offset` into `out`, with volatile loads
    /// (the device may write this memory at any time: each byte is read
    /// once, as it is when read, never assumed to be what it was), as
    /// [`Mapping::write_bytes`] in the other direction.
    pub(crate) fn read_bytes(&self, offset: usize, out: &mut [u8]) -> Result<(), Error> {
        let p = self.at_aligned(offset, out.len(), 1)?;
        let (head, words, tail) = split_aligned(p.as_ptr() as usize, out.len());
        for (i, b) in out[..head].iter_mut().enumerate() {
            // SAFETY: `i < out.len()`, and `offset..offset + out.len()` is
            // inside the mapping (checked above).
            *b = unsafe { p.as_ptr().add(i).read_volatile() };
        }
        for (k, chunk) in out[head..head + 8 * words].chunks_exact_mut(8).enumerate() {
            // SAFETY: inside the mapping as above; `p + head` is 8-aligned,
            // so each word's address is too.
            let word = unsafe { p.as_ptr().add(head + 8 * k).cast::<u64>().read_volatile() };
            chunk.copy_from_slice(&word.to_ne_bytes());
        }
        let rest = head + 8 * words;
        for (i, b) in out[rest..rest + tail].iter_mut().enumerate() {
            // SAFETY: `rest + i < out.len()`, inside the mapping as above.
            *b = unsafe { p.as_ptr().add(rest + i).read_volatile() };
        }
        Ok(())
    }

    /// The `len` bytes at `offset` as a slice, for a buffer the caller
    /// fills and reads in place (a device-ready buffer).
    ///
    /// # Safety
    /// The caller holds the range exclusively for the slice's life: no
    /// other slice, copy or descriptor handed to the device covers it
    /// meanwhile (a [`DmaBuf`](crate::dma::DmaBuf) owns its range, and
    /// lends it to the device only inside a request, which takes it by
    /// value).
    // A `&mut` from `&self` is the point: the mapping is shared, the
    // range is not (the caller's promise).
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice_mut(&self, offset: usize, len: usize) -> Result<&mut [u8], Error> {
        let p = self.at_aligned(offset, len, 1)?;
        // SAFETY: the range is inside the mapping (checked), which stays
        // mapped while `self` lives (the slice borrows it); bytes have no
        // invalid values and the mapping is initialised (anonymous memory
        // reads as zeros); exclusive access is the caller's promise.
        Ok(unsafe { std::slice::from_raw_parts_mut(p.as_ptr(), len) })
    }

    /// The `len` bytes at `offset` as a shared slice.
    ///
    /// # Safety
    /// As for [`Mapping::slice_mut`]: nothing writes the range (neither
    /// this process nor the device) for the slice's life.
    pub(crate) unsafe fn slice(&self, offset: usize, len: usize) -> Result<&[u8], Error> {
        let p = self.at_aligned(offset, len, 1)?;
        // SAFETY: in the mapping (checked), which outlives the borrow;
        // initialised bytes; no writer meanwhile is the caller's promise.
        Ok(unsafe { std::slice::from_raw_parts(p.as_ptr(), len) })
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

/// How a copy of `len` bytes at address `addr` splits: bytes up to the
/// first 8-aligned address, whole 8-byte words, and the bytes left.
fn split_aligned(addr: usize, len: usize) -> (usize, usize, usize) {
    let head = addr.wrapping_neg() % 8;
    let head = head.min(len);
    let words = (len - head) / 8;
    (head, words, len - head - 8 * words)
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

    #[test]
    fn copies_in_and_out_are_exact_at_every_alignment_and_length() {
        let m = Mapping::anonymous(4096).unwrap();
        let data: Vec<u8> = (0..100u8).map(|b| b.wrapping_mul(37) ^ 0x5a).collect();
        for offset in 0..17 {
            for len in [0, 1, 7, 8, 9, 15, 16, 17, 31, 64, 100] {
                m.wipe(0, 256).unwrap();
                m.write_bytes(offset, &data[..len]).unwrap();
                let mut all = vec![0xffu8; 256];
                m.read_bytes(0, &mut all).unwrap();
                assert_eq!(&all[offset..offset + len], &data[..len], "{offset} {len}");
                assert!(
                    all[..offset].iter().all(|&b| b == 0),
                    "before {offset} {len}"
                );
                assert!(
                    all[offset + len..].iter().all(|&b| b == 0),
                    "after {offset} {len}"
                );
                // Read back at each alignment of the destination too.
                let mut out = vec![0u8; len + 3];
                m.read_bytes(offset, &mut out[3..]).unwrap();
                assert_eq!(&out[3..], &data[..len]);
            }
        }
    }

    /// The smaps flags of the mapping that holds `addr`.
    fn vm_flags(addr: u64) -> String {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ')
                && let Some((lo, hi)) = range.split_once('-')
                && let (Ok(lo), Ok(hi)) = (u64::from_str_radix(lo, 16), u64::from_str_radix(hi, 16))
            {
                inside = (lo..hi).contains(&addr);
            } else if inside && let Some(flags) = line.strip_prefix("VmFlags:") {
                return flags.trim().to_owned();
            }
        }
        panic!("no mapping holds {addr:#x}")
    }

    #[test]
    fn dma_memory_is_left_out_of_forks_and_core_dumps() {
        let m = Mapping::anonymous(8192).unwrap();
        let flags = vm_flags(m.addr());
        // VM_DONTCOPY shows as "dc", VM_DONTDUMP as "dd".
        for flag in ["dc", "dd"] {
            assert!(
                flags.split_whitespace().any(|f| f == flag),
                "{flag} not in {flags}"
            );
        }
    }

    /// Copy speed through the volatile accessors against `memcpy`, in one
    /// run (the figure quoted in [`Mapping::write_bytes`]'s docs).
    #[test]
    #[ignore = "a measurement: run with --release -- --ignored --nocapture"]
    fn volatile_copy_speed() {
        let m = Mapping::anonymous(1 << 20).unwrap();
        for len in [4096usize, 256 << 10] {
            let data = vec![0x5au8; len];
            let mut out = vec![0u8; len];
            let mut plain = vec![0u8; len];
            let rounds = (64 << 20) / len;
            let t = std::time::Instant::now();
            for _ in 0..rounds {
                m.write_bytes(0, std::hint::black_box(&data)).unwrap();
                m.read_bytes(0, std::hint::black_box(&mut out)).unwrap();
            }
            let volatile = t.elapsed();
            let t = std::time::Instant::now();
            for _ in 0..rounds {
                plain.copy_from_slice(std::hint::black_box(&data));
                out.copy_from_slice(std::hint::black_box(&plain));
            }
            let memcpy = t.elapsed();
            let gbps = |d: std::time::Duration| (2 * rounds * len) as f64 / d.as_secs_f64() / 1e9;
            println!(
                "{len} B: volatile {:.1} GB/s, memcpy {:.1} GB/s ({:.2}x), {:.0} ns per copy",
                gbps(volatile),
                gbps(memcpy),
                gbps(volatile) / gbps(memcpy),
                volatile.as_nanos() as f64 / (2 * rounds) as f64
            );
        }
    }
}
