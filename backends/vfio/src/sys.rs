//! The VFIO ioctls, and nothing else: every `unsafe` call into the kernel's
//! VFIO interface is here, each wrapped in a safe function whose arguments
//! make it sound. Structures come from `vfio-bindings`; request numbers are
//! `_IO(VFIO_TYPE, VFIO_BASE + n)` as `<linux/vfio.h>` defines them.
//!
//! (rust-vmm's `vfio-ioctls` wraps most of these but not
//! `VFIO_DEVICE_FEATURE`, and brings `vm-memory` and a VMM's view of
//! devices with it; a userspace driver needs a dozen calls.)

use std::ffi::CString;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::errno::Errno;
use nix::libc::{c_char, c_int, c_ulong};
use vfio_bindings::bindings::vfio::{
    VFIO_BASE, VFIO_TYPE, vfio_group_status, vfio_iommu_type1_dma_map, vfio_iommu_type1_dma_unmap,
    vfio_irq_info, vfio_region_info,
};

/// `_IO(VFIO_TYPE, VFIO_BASE + n)`.
const fn io(n: u32) -> c_ulong {
    nix::request_code_none!(VFIO_TYPE, VFIO_BASE + n) as c_ulong
}

const GET_API_VERSION: c_ulong = io(0);
const CHECK_EXTENSION: c_ulong = io(1);
const SET_IOMMU: c_ulong = io(2);
const GROUP_GET_STATUS: c_ulong = io(3);
const GROUP_SET_CONTAINER: c_ulong = io(4);
const GROUP_GET_DEVICE_FD: c_ulong = io(6);
const DEVICE_GET_REGION_INFO: c_ulong = io(8);
const DEVICE_GET_IRQ_INFO: c_ulong = io(9);
const DEVICE_SET_IRQS: c_ulong = io(10);
const DEVICE_RESET: c_ulong = io(11);
const DEVICE_FEATURE: c_ulong = io(17);
const IOMMU_MAP_DMA: c_ulong = io(13);
const IOMMU_UNMAP_DMA: c_ulong = io(14);

fn result(r: c_int) -> Result<c_int, Errno> {
    if r < 0 { Err(Errno::last()) } else { Ok(r) }
}

/// An ioctl whose argument is a plain integer.
///
/// # Safety
/// `request` must take its argument by value (an integer, or none): the
/// kernel must read no memory through it.
unsafe fn ioctl_int(fd: BorrowedFd<'_>, request: c_ulong, arg: c_ulong) -> Result<c_int, Errno> {
    // SAFETY: the caller's contract: the request reads no memory through
    // its argument.
    result(unsafe { nix::libc::ioctl(fd.as_raw_fd(), request as _, arg) })
}

/// An ioctl that reads and may write `*arg`.
///
/// # Safety
/// `request` must be one whose argument is a pointer to a `T`: a
/// `#[repr(C)]` structure from `vfio-bindings` of exactly the layout the
/// kernel expects for it (or a plain `c_int` where the request takes a
/// pointer to one), with its `argsz` field, if it has one, set to
/// `size_of::<T>()` — so that the kernel reads and writes only within
/// `*arg`. The kernel must not keep the pointer past the call.
unsafe fn ioctl_struct<T>(
    fd: BorrowedFd<'_>,
    request: c_ulong,
    arg: &mut T,
) -> Result<c_int, Errno> {
    // SAFETY: `arg` is a live, exclusive, properly aligned `T`; the
    // caller's contract says it is what `request` reads and writes, and
    // that the kernel stays within it and keeps no pointer to it.
    result(unsafe { nix::libc::ioctl(fd.as_raw_fd(), request as _, arg as *mut T) })
}

/// An ioctl whose argument is a variable-length structure in `buf` (a
/// fixed header beginning with `argsz`, then data). `argsz` is set here to
/// `buf`'s length in bytes.
///
/// # Safety
/// `request` must be one whose argument is such a structure (its first
/// word `argsz`, 4-byte aligned), laid out in `buf` as the kernel expects
/// for it, so that the kernel reads and writes only within `argsz` bytes
/// of it and keeps no pointer to it past the call.
unsafe fn ioctl_buf(fd: BorrowedFd<'_>, request: c_ulong, buf: &mut [u32]) -> Result<c_int, Errno> {
    let bytes = u32::try_from(std::mem::size_of_val(buf)).map_err(|_| Errno::EINVAL)?;
    let Some(argsz) = buf.first_mut() else {
        return Err(Errno::EINVAL);
    };
    *argsz = bytes;
    // SAFETY: `buf` is live, exclusive and 4-byte aligned; its first word,
    // `argsz`, is its length in bytes (set above), beyond which the kernel
    // does not read or write; the layout is the caller's contract.
    result(unsafe { nix::libc::ioctl(fd.as_raw_fd(), request as _, buf.as_mut_ptr()) })
}

/// `VFIO_GET_API_VERSION`.
pub(crate) fn api_version(container: BorrowedFd<'_>) -> Result<c_int, Errno> {
    // SAFETY: VFIO_GET_API_VERSION takes no argument.
    unsafe { ioctl_int(container, GET_API_VERSION, 0) }
}

/// `VFIO_CHECK_EXTENSION`: whether the container supports `extension`.
pub(crate) fn check_extension(container: BorrowedFd<'_>, extension: u32) -> Result<bool, Errno> {
    // SAFETY: VFIO_CHECK_EXTENSION takes the extension's number by value.
    unsafe { ioctl_int(container, CHECK_EXTENSION, c_ulong::from(extension)) }.map(|r| r > 0)
}

/// `VFIO_SET_IOMMU`.
pub(crate) fn set_iommu(container: BorrowedFd<'_>, kind: u32) -> Result<(), Errno> {
    // SAFETY: VFIO_SET_IOMMU takes the IOMMU type by value.
    unsafe { ioctl_int(container, SET_IOMMU, c_ulong::from(kind)) }.map(drop)
}

/// `VFIO_GROUP_GET_STATUS`: the group's flags.
pub(crate) fn group_status(group: BorrowedFd<'_>) -> Result<u32, Errno> {
    let mut s = vfio_group_status {
        argsz: size_of::<vfio_group_status>() as u32,
        flags: 0,
    };
    // SAFETY: VFIO_GROUP_GET_STATUS takes a `struct vfio_group_status`,
    // with its `argsz` set.
    unsafe { ioctl_struct(group, GROUP_GET_STATUS, &mut s) }?;
    Ok(s.flags)
}

/// `VFIO_GROUP_SET_CONTAINER`.
pub(crate) fn group_set_container(
    group: BorrowedFd<'_>,
    container: BorrowedFd<'_>,
) -> Result<(), Errno> {
    let mut fd: c_int = container.as_raw_fd();
    // SAFETY: VFIO_GROUP_SET_CONTAINER reads a pointer to the container's
    // `int` descriptor.
    unsafe { ioctl_struct(group, GROUP_SET_CONTAINER, &mut fd) }.map(drop)
}

/// `VFIO_GROUP_GET_DEVICE_FD` for the device at `address` (e.g.
/// `0000:01:00.0`).
pub(crate) fn group_get_device(group: BorrowedFd<'_>, address: &str) -> Result<OwnedFd, Errno> {
    let name = CString::new(address).map_err(|_| Errno::EINVAL)?;
    // SAFETY: the request reads a NUL-terminated string, which `name` is,
    // alive for the call.
    let fd = result(unsafe {
        nix::libc::ioctl(
            group.as_raw_fd(),
            GROUP_GET_DEVICE_FD as _,
            name.as_ptr() as *const c_char,
        )
    })?;
    // SAFETY: on success the ioctl returned a new descriptor that nothing
    // else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `VFIO_DEVICE_GET_REGION_INFO` for region `index` (capabilities not read).
pub(crate) fn region_info(device: BorrowedFd<'_>, index: u32) -> Result<vfio_region_info, Errno> {
    let mut info = vfio_region_info {
        argsz: size_of::<vfio_region_info>() as u32,
        index,
        ..Default::default()
    };
    // SAFETY: VFIO_DEVICE_GET_REGION_INFO takes a `struct
    // vfio_region_info` whose `argsz` (set: no room for capabilities)
    // bounds what the kernel writes.
    unsafe { ioctl_struct(device, DEVICE_GET_REGION_INFO, &mut info) }?;
    Ok(info)
}

/// `VFIO_DEVICE_GET_IRQ_INFO` for interrupt `index`.
pub(crate) fn irq_info(device: BorrowedFd<'_>, index: u32) -> Result<vfio_irq_info, Errno> {
    let mut info = vfio_irq_info {
        argsz: size_of::<vfio_irq_info>() as u32,
        index,
        ..Default::default()
    };
    // SAFETY: VFIO_DEVICE_GET_IRQ_INFO takes a `struct vfio_irq_info`,
    // with its `argsz` set.
    unsafe { ioctl_struct(device, DEVICE_GET_IRQ_INFO, &mut info) }?;
    Ok(info)
}

/// `VFIO_DEVICE_SET_IRQS`: triggers `start..start + fds.len()` of interrupt
/// `index` signal the eventfds `fds` (an empty `fds` with `flags` of
/// `DATA_NONE` disables them).
pub(crate) fn set_irqs(
    device: BorrowedFd<'_>,
    index: u32,
    flags: u32,
    start: u32,
    count: u32,
    fds: &[BorrowedFd<'_>],
) -> Result<(), Errno> {
    // struct vfio_irq_set: argsz (set by ioctl_buf), flags, index, start,
    // count, then data.
    let mut buf = vec![0u32; 5 + fds.len()];
    buf[1] = flags;
    buf[2] = index;
    buf[3] = start;
    buf[4] = count;
    for (slot, fd) in buf[5..].iter_mut().zip(fds) {
        *slot = fd.as_raw_fd() as u32;
    }
    // SAFETY: VFIO_DEVICE_SET_IRQS takes a `struct vfio_irq_set` (argsz,
    // flags, index, start, count) followed by `count` eventfds as `s32`,
    // which is `buf`'s layout.
    unsafe { ioctl_buf(device, DEVICE_SET_IRQS, &mut buf) }.map(drop)
}

/// `VFIO_DEVICE_RESET`.
pub(crate) fn device_reset(device: BorrowedFd<'_>) -> Result<(), Errno> {
    // SAFETY: VFIO_DEVICE_RESET takes no argument.
    unsafe { ioctl_int(device, DEVICE_RESET, 0) }.map(drop)
}

/// `VFIO_DEVICE_FEATURE` with no data (e.g. `SET | LOW_POWER_ENTRY`).
pub(crate) fn device_feature(device: BorrowedFd<'_>, flags: u32) -> Result<(), Errno> {
    // struct vfio_device_feature: argsz, flags.
    let mut buf = [8u32, flags];
    // SAFETY: VFIO_DEVICE_FEATURE takes a `struct vfio_device_feature`
    // (argsz, flags) followed by the feature's data, none for these.
    unsafe { ioctl_buf(device, DEVICE_FEATURE, &mut buf) }.map(drop)
}

/// `VFIO_IOMMU_MAP_DMA`: the device may read and write `size` bytes at
/// `iova`, backed by this process's memory at `vaddr`.
///
/// # Safety
/// `vaddr..vaddr + size` must be memory this process owns and keeps mapped
/// until [`unmap_dma`] (the device writes into it at any time meanwhile).
pub(crate) unsafe fn map_dma(
    container: BorrowedFd<'_>,
    vaddr: u64,
    iova: u64,
    size: u64,
) -> Result<(), Errno> {
    let mut map = vfio_iommu_type1_dma_map {
        argsz: size_of::<vfio_iommu_type1_dma_map>() as u32,
        flags: vfio_bindings::bindings::vfio::VFIO_DMA_MAP_FLAG_READ
            | vfio_bindings::bindings::vfio::VFIO_DMA_MAP_FLAG_WRITE,
        vaddr,
        iova,
        size,
    };
    // SAFETY: VFIO_IOMMU_MAP_DMA takes a `struct
    // vfio_iommu_type1_dma_map`, with its `argsz` set; the memory it maps
    // is the caller's contract.
    unsafe { ioctl_struct(container, IOMMU_MAP_DMA, &mut map) }.map(drop)
}

/// `VFIO_IOMMU_UNMAP_DMA` of a range [`map_dma`] mapped.
pub(crate) fn unmap_dma(container: BorrowedFd<'_>, iova: u64, size: u64) -> Result<(), Errno> {
    let mut unmap = vfio_iommu_type1_dma_unmap {
        argsz: size_of::<vfio_iommu_type1_dma_unmap>() as u32,
        iova,
        size,
        ..Default::default()
    };
    // SAFETY: VFIO_IOMMU_UNMAP_DMA takes a `struct
    // vfio_iommu_type1_dma_unmap`, with its `argsz` set (no dirty bitmap:
    // the kernel writes only the struct's `size`).
    unsafe { ioctl_struct(container, IOMMU_UNMAP_DMA, &mut unmap) }.map(drop)
}

/// `pread` of a device region (config space, a BAR) at `offset`.
pub(crate) fn pread(device: BorrowedFd<'_>, buf: &mut [u8], offset: u64) -> Result<usize, Errno> {
    nix::sys::uio::pread(device, buf, offset as i64)
}

/// `pwrite` to a device region at `offset`.
pub(crate) fn pwrite(device: BorrowedFd<'_>, buf: &[u8], offset: u64) -> Result<usize, Errno> {
    nix::sys::uio::pwrite(device, buf, offset as i64)
}
