//! VFIO's three objects — container (an IOMMU address space), group (the
//! devices the IOMMU cannot tell apart) and device — as owned handles.

use std::fs::OpenOptions;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;

use nix::errno::Errno;
use vfio_bindings::bindings::vfio::{
    VFIO_API_VERSION, VFIO_DEVICE_FEATURE_LOW_POWER_ENTRY, VFIO_DEVICE_FEATURE_LOW_POWER_EXIT,
    VFIO_DEVICE_FEATURE_SET, VFIO_GROUP_FLAGS_VIABLE, VFIO_IRQ_SET_ACTION_TRIGGER,
    VFIO_IRQ_SET_DATA_EVENTFD, VFIO_IRQ_SET_DATA_NONE, VFIO_PCI_CONFIG_REGION_INDEX,
    VFIO_PCI_MSIX_IRQ_INDEX, VFIO_PCI_REQ_IRQ_INDEX, VFIO_TYPE1v2_IOMMU,
};

use crate::error::Error;
use crate::mem::Mapping;
use crate::sys;

/// Where sysfs lists PCI devices.
pub const SYSFS_PCI: &str = "/sys/bus/pci/devices";

fn open_rw(path: &Path) -> Result<OwnedFd, Error> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map(OwnedFd::from)
        .map_err(|e| Error::Unavailable {
            what: path.display().to_string(),
            detail: e.to_string(),
        })
}

/// A VFIO container with the type-1 (v2) IOMMU set.
#[derive(Debug)]
pub struct Container {
    fd: OwnedFd,
}

impl Container {
    fn open() -> Result<Container, Error> {
        let fd = open_rw(Path::new("/dev/vfio/vfio"))?;
        let version =
            sys::api_version(fd.as_fd()).map_err(|e| Error::sys("VFIO_GET_API_VERSION", e))?;
        if version != VFIO_API_VERSION as i32 {
            return Err(Error::Unavailable {
                what: "VFIO".into(),
                detail: format!("API version {version}, not {VFIO_API_VERSION}"),
            });
        }
        let type1v2 = sys::check_extension(fd.as_fd(), VFIO_TYPE1v2_IOMMU)
            .map_err(|e| Error::sys("VFIO_CHECK_EXTENSION", e))?;
        if !type1v2 {
            return Err(Error::Unavailable {
                what: "VFIO".into(),
                detail: "no type-1 v2 IOMMU (no-IOMMU mode is not supported)".into(),
            });
        }
        Ok(Container { fd })
    }

    /// Maps `mem` for the container's devices at `iova`. The caller unmaps
    /// it ([`Container::unmap_dma`]) before `mem` is dropped.
    pub(crate) fn map_dma(&self, mem: &Mapping, iova: u64) -> Result<(), Error> {
        // SAFETY: `mem` is this process's own anonymous mapping; its owner
        // (the DMA pool) unmaps it from the IOMMU in its `Drop`, before the
        // mapping itself is unmapped.
        unsafe { sys::map_dma(self.fd.as_fd(), mem.addr(), iova, mem.len() as u64) }
            .map_err(|e| Error::sys("VFIO_IOMMU_MAP_DMA", e))
    }

    /// Unmaps what [`Container::map_dma`] mapped.
    pub(crate) fn unmap_dma(&self, iova: u64, size: u64) -> Result<(), Error> {
        sys::unmap_dma(self.fd.as_fd(), iova, size)
            .map_err(|e| Error::sys("VFIO_IOMMU_UNMAP_DMA", e))
    }
}

/// An IOMMU group, attached to its container.
#[derive(Debug)]
pub struct Group {
    fd: OwnedFd,
    container: Arc<Container>,
}

impl Group {
    fn open(id: u32) -> Result<Group, Error> {
        let container = Arc::new(Container::open()?);
        let fd = open_rw(&Path::new("/dev/vfio").join(id.to_string()))?;
        let flags =
            sys::group_status(fd.as_fd()).map_err(|e| Error::sys("VFIO_GROUP_GET_STATUS", e))?;
        if flags & VFIO_GROUP_FLAGS_VIABLE == 0 {
            return Err(Error::Unavailable {
                what: format!("IOMMU group {id}"),
                detail: "not viable: another device of the group is bound to a host driver".into(),
            });
        }
        sys::group_set_container(fd.as_fd(), container.fd.as_fd())
            .map_err(|e| Error::sys("VFIO_GROUP_SET_CONTAINER", e))?;
        sys::set_iommu(container.fd.as_fd(), VFIO_TYPE1v2_IOMMU)
            .map_err(|e| Error::sys("VFIO_SET_IOMMU", e))?;
        Ok(Group { fd, container })
    }
}

/// A region of a device (config space, a BAR) as VFIO describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    /// Its offset in the device file.
    pub offset: u64,
    /// Its size in bytes.
    pub size: u64,
    /// `VFIO_REGION_INFO_FLAG_*`.
    pub flags: u32,
}

/// A PCI device opened through VFIO.
#[derive(Debug)]
pub struct Device {
    fd: OwnedFd,
    group: Group,
    config: Region,
}

impl Device {
    /// Opens the device at `address` (e.g. `0000:01:00.0`), which must be
    /// bound to `vfio-pci`, in a container of its own.
    pub fn open(address: &str) -> Result<Device, Error> {
        let dev = Path::new(SYSFS_PCI).join(address);
        let unavailable = |detail: String| Error::Unavailable {
            what: address.to_owned(),
            detail,
        };
        let driver = std::fs::read_link(dev.join("driver"))
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
        if driver.as_deref() != Some("vfio-pci") {
            return Err(unavailable(format!(
                "bound to {}, not vfio-pci",
                driver.as_deref().unwrap_or("no driver")
            )));
        }
        let group = std::fs::read_link(dev.join("iommu_group"))
            .ok()
            .and_then(|p| p.file_name()?.to_str()?.parse::<u32>().ok())
            .ok_or_else(|| unavailable("no IOMMU group".into()))?;
        let group = Group::open(group)?;
        let fd = sys::group_get_device(group.fd.as_fd(), address)
            .map_err(|e| Error::sys("VFIO_GROUP_GET_DEVICE_FD", e))?;
        let config = region(fd.as_fd(), VFIO_PCI_CONFIG_REGION_INDEX)?;
        Ok(Device { fd, group, config })
    }

    pub(crate) fn container(&self) -> Arc<Container> {
        self.group.container.clone()
    }

    /// Region `index` (BAR 0–5 are 0–5, config space 7).
    pub fn region(&self, index: u32) -> Result<Region, Error> {
        region(self.fd.as_fd(), index)
    }

    /// Reads config space from `offset` (short at its end).
    pub fn read_config(&self, offset: u64, buf: &mut [u8]) -> Result<usize, Error> {
        if offset >= self.config.size {
            return Ok(0);
        }
        sys::pread(self.fd.as_fd(), buf, self.config.offset + offset)
            .map_err(|e| Error::sys("pread config", e))
    }

    /// Writes config space at `offset`.
    pub fn write_config(&self, offset: u64, buf: &[u8]) -> Result<(), Error> {
        let n = sys::pwrite(self.fd.as_fd(), buf, self.config.offset + offset)
            .map_err(|e| Error::sys("pwrite config", e))?;
        if n != buf.len() {
            return Err(Error::Device(format!(
                "config write of {} bytes took {n}",
                buf.len()
            )));
        }
        Ok(())
    }

    /// Lets the device master the bus (PCI command bit 2; with memory space,
    /// bit 1): without it, its DMA reads and writes go nowhere. `vfio-pci`
    /// leaves this to the driver.
    pub fn enable_bus_master(&self) -> Result<(), Error> {
        let mut cmd = [0u8; 2];
        if self.read_config(4, &mut cmd)? != 2 {
            return Err(Error::Device("config space too short".into()));
        }
        let value = u16::from_le_bytes(cmd) | 0b110;
        self.write_config(4, &value.to_le_bytes())
    }

    /// Maps BAR `index` whole.
    pub(crate) fn map_bar(&self, index: u32) -> Result<Mapping, Error> {
        let r = self.region(index)?;
        if r.flags & vfio_bindings::bindings::vfio::VFIO_REGION_INFO_FLAG_MMAP == 0 {
            return Err(Error::Device(format!("BAR {index} cannot be mapped")));
        }
        let len = usize::try_from(r.size).map_err(|_| Error::Device("BAR too large".into()))?;
        Mapping::device(self.fd.as_fd(), r.offset, len)
    }

    /// How many MSI-X vectors it has.
    pub fn msix_vectors(&self) -> Result<u32, Error> {
        sys::irq_info(self.fd.as_fd(), VFIO_PCI_MSIX_IRQ_INDEX)
            .map(|i| i.count)
            .map_err(|e| Error::sys("VFIO_DEVICE_GET_IRQ_INFO", e))
    }

    /// MSI-X vectors `0..fds.len()` signal `fds`.
    pub(crate) fn enable_msix(&self, fds: &[BorrowedFd<'_>]) -> Result<(), Error> {
        sys::set_irqs(
            self.fd.as_fd(),
            VFIO_PCI_MSIX_IRQ_INDEX,
            VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER,
            0,
            fds.len() as u32,
            fds,
        )
        .map_err(|e| Error::sys("VFIO_DEVICE_SET_IRQS", e))
    }

    /// The kernel's requests for the device back (its removal) signal `fd`
    /// (VFIO's request interrupt).
    pub(crate) fn enable_req_irq(&self, fd: BorrowedFd<'_>) -> Result<(), Error> {
        sys::set_irqs(
            self.fd.as_fd(),
            VFIO_PCI_REQ_IRQ_INDEX,
            VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER,
            0,
            1,
            &[fd],
        )
        .map_err(|e| Error::sys("VFIO_DEVICE_SET_IRQS request", e))
    }

    /// Turns MSI-X off.
    pub(crate) fn disable_msix(&self) -> Result<(), Error> {
        sys::set_irqs(
            self.fd.as_fd(),
            VFIO_PCI_MSIX_IRQ_INDEX,
            VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_TRIGGER,
            0,
            0,
            &[],
        )
        .map_err(|e| Error::sys("VFIO_DEVICE_SET_IRQS", e))
    }

    /// `VFIO_DEVICE_RESET`: a function-level reset.
    pub fn reset(&self) -> Result<(), Error> {
        sys::device_reset(self.fd.as_fd()).map_err(|e| Error::sys("VFIO_DEVICE_RESET", e))
    }

    /// Enters (`true`) or leaves the PCI low-power state (D3hot) through
    /// `VFIO_DEVICE_FEATURE` LOW_POWER_ENTRY / EXIT.
    pub fn set_low_power(&self, low: bool) -> Result<(), Error> {
        let feature = if low {
            VFIO_DEVICE_FEATURE_LOW_POWER_ENTRY
        } else {
            VFIO_DEVICE_FEATURE_LOW_POWER_EXIT
        };
        sys::device_feature(self.fd.as_fd(), VFIO_DEVICE_FEATURE_SET | feature)
            .map_err(|e| Error::sys("VFIO_DEVICE_FEATURE low power", e))
    }
}

fn region(fd: BorrowedFd<'_>, index: u32) -> Result<Region, Error> {
    let info = sys::region_info(fd, index)
        .map_err(|e: Errno| Error::sys("VFIO_DEVICE_GET_REGION_INFO", e))?;
    Ok(Region {
        offset: info.offset,
        size: info.size,
        flags: info.flags,
    })
}
