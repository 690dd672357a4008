//! The virtio-pci modern transport (virtio 1.x §4.1): the common
//! configuration, notification and device-configuration structures in the
//! device's BARs, found through its vendor capabilities.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::mem::Mapping;
use crate::pci::{self, CAP_COMMON, CAP_DEVICE, CAP_NOTIFY, VirtioCap};
use crate::vfio::Device;

/// Device status bits.
pub(crate) const ACKNOWLEDGE: u8 = 1;
pub(crate) const DRIVER: u8 = 2;
pub(crate) const DRIVER_OK: u8 = 4;
pub(crate) const FEATURES_OK: u8 = 8;
pub(crate) const FAILED: u8 = 0x80;

/// `VIRTIO_F_VERSION_1`.
pub const F_VERSION_1: u64 = 1 << 32;
/// `VIRTIO_F_ACCESS_PLATFORM`: the device's DMA goes through the IOMMU.
pub const F_ACCESS_PLATFORM: u64 = 1 << 33;
/// `VIRTIO_RING_F_INDIRECT_DESC`: a descriptor may point at a table of
/// descriptors.
pub const F_INDIRECT_DESC: u64 = 1 << 28;

/// The features this driver takes of those `offered`: VERSION_1 (required
/// separately), and ACCESS_PLATFORM and INDIRECT_DESC when offered.
pub(crate) fn wanted(offered: u64) -> u64 {
    F_VERSION_1 | (offered & (F_ACCESS_PLATFORM | F_INDIRECT_DESC))
}

/// `VIRTIO_MSI_NO_VECTOR`.
pub(crate) const NO_VECTOR: u16 = 0xffff;

/// Offsets in `struct virtio_pci_common_cfg`.
mod common {
    pub(super) const DEVICE_FEATURE_SELECT: usize = 0;
    pub(super) const DEVICE_FEATURE: usize = 4;
    pub(super) const DRIVER_FEATURE_SELECT: usize = 8;
    pub(super) const DRIVER_FEATURE: usize = 12;
    pub(super) const MSIX_CONFIG: usize = 16;
    pub(super) const DEVICE_STATUS: usize = 20;
    pub(super) const CONFIG_GENERATION: usize = 21;
    pub(super) const QUEUE_SELECT: usize = 22;
    pub(super) const QUEUE_SIZE: usize = 24;
    pub(super) const QUEUE_MSIX_VECTOR: usize = 26;
    pub(super) const QUEUE_ENABLE: usize = 28;
    pub(super) const QUEUE_NOTIFY_OFF: usize = 30;
    pub(super) const QUEUE_DESC: usize = 32;
    pub(super) const QUEUE_DRIVER: usize = 40;
    pub(super) const QUEUE_DEVICE: usize = 48;
    pub(super) const LEN: usize = 56;
}

/// A structure in a BAR.
#[derive(Debug, Clone)]
struct Window {
    bar: Arc<Mapping>,
    offset: usize,
    len: usize,
}

impl Window {
    fn at(&self, at: usize, size: usize) -> Result<usize, Error> {
        if at + size > self.len {
            return Err(Error::Device(format!(
                "access at {at:#x} past a {:#x}-byte structure",
                self.len
            )));
        }
        Ok(self.offset + at)
    }
}

/// The transport of one device.
#[derive(Debug)]
pub struct Transport {
    common: Window,
    notify: Window,
    notify_multiplier: u32,
    device: Window,
}

impl Transport {
    /// Finds the structures through `dev`'s config space and maps their
    /// BARs.
    pub fn new(dev: &Device) -> Result<Transport, Error> {
        let mut config = vec![0u8; 256];
        let n = dev.read_config(0, &mut config)?;
        config.truncate(n);
        let caps = pci::virtio_caps(&config);
        let find = |t: u8| -> Result<VirtioCap, Error> {
            caps.iter()
                .find(|c| c.cfg_type == t && c.bar < 6)
                .copied()
                .ok_or_else(|| Error::Device(format!("no virtio capability of type {t}")))
        };
        let (common, notify, device) = (find(CAP_COMMON)?, find(CAP_NOTIFY)?, find(CAP_DEVICE)?);
        let mut bars: BTreeMap<u8, Arc<Mapping>> = BTreeMap::new();
        let mut window = |cap: VirtioCap| -> Result<Window, Error> {
            let bar = match bars.get(&cap.bar) {
                Some(b) => b.clone(),
                None => {
                    let b = Arc::new(dev.map_bar(u32::from(cap.bar))?);
                    bars.insert(cap.bar, b.clone());
                    b
                }
            };
            let (offset, len) = (cap.offset as usize, cap.length as usize);
            if offset.checked_add(len).is_none_or(|end| end > bar.len()) {
                return Err(Error::Device(format!(
                    "capability type {} at {offset:#x}+{len:#x} outside BAR {}",
                    cap.cfg_type, cap.bar
                )));
            }
            Ok(Window { bar, offset, len })
        };
        let t = Transport {
            common: window(common)?,
            notify: window(notify)?,
            notify_multiplier: notify.notify_multiplier,
            device: window(device)?,
        };
        if t.common.len < common::LEN {
            return Err(Error::Device("common configuration too short".into()));
        }
        Ok(t)
    }

    fn c8(&self, at: usize) -> Result<u8, Error> {
        self.common.bar.read_u8(self.common.at(at, 1)?)
    }
    fn w8(&self, at: usize, v: u8) -> Result<(), Error> {
        self.common.bar.write_u8(self.common.at(at, 1)?, v)
    }
    fn c16(&self, at: usize) -> Result<u16, Error> {
        self.common.bar.read_u16(self.common.at(at, 2)?)
    }
    fn w16(&self, at: usize, v: u16) -> Result<(), Error> {
        self.common.bar.write_u16(self.common.at(at, 2)?, v)
    }
    fn c32(&self, at: usize) -> Result<u32, Error> {
        self.common.bar.read_u32(self.common.at(at, 4)?)
    }
    fn w32(&self, at: usize, v: u32) -> Result<(), Error> {
        self.common.bar.write_u32(self.common.at(at, 4)?, v)
    }
    /// 64-bit fields are written as two 32-bit halves, low first.
    fn w64(&self, at: usize, v: u64) -> Result<(), Error> {
        self.w32(at, v as u32)?;
        self.w32(at + 4, (v >> 32) as u32)
    }

    /// The device status.
    pub fn status(&self) -> Result<u8, Error> {
        self.c8(common::DEVICE_STATUS)
    }

    /// Sets status bits (on top of the current ones).
    pub fn add_status(&self, bits: u8) -> Result<(), Error> {
        let s = self.status()?;
        self.w8(common::DEVICE_STATUS, s | bits)
    }

    /// Resets the device: status 0, then waits (up to a second) for it to
    /// read back 0.
    pub fn reset(&self) -> Result<(), Error> {
        self.w8(common::DEVICE_STATUS, 0)?;
        let start = Instant::now();
        while self.status()? != 0 {
            if start.elapsed() > Duration::from_secs(1) {
                return Err(Error::Device("did not reset within 1 s".into()));
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        Ok(())
    }

    /// The device's feature bits.
    pub fn device_features(&self) -> Result<u64, Error> {
        self.w32(common::DEVICE_FEATURE_SELECT, 0)?;
        let lo = self.c32(common::DEVICE_FEATURE)?;
        self.w32(common::DEVICE_FEATURE_SELECT, 1)?;
        let hi = self.c32(common::DEVICE_FEATURE)?;
        Ok(u64::from(lo) | (u64::from(hi) << 32))
    }

    /// Writes the driver's feature bits, sets FEATURES_OK and checks that
    /// the device kept it.
    pub fn negotiate(&self, features: u64) -> Result<(), Error> {
        self.w32(common::DRIVER_FEATURE_SELECT, 0)?;
        self.w32(common::DRIVER_FEATURE, features as u32)?;
        self.w32(common::DRIVER_FEATURE_SELECT, 1)?;
        self.w32(common::DRIVER_FEATURE, (features >> 32) as u32)?;
        self.add_status(FEATURES_OK)?;
        if self.status()? & FEATURES_OK == 0 {
            return Err(Error::Device(format!(
                "refused features {features:#x} (FEATURES_OK not kept)"
            )));
        }
        Ok(())
    }

    /// The largest size queue `index` takes (0: no such queue).
    pub fn queue_max_size(&self, index: u16) -> Result<u16, Error> {
        self.w16(common::QUEUE_SELECT, index)?;
        self.c16(common::QUEUE_SIZE)
    }

    /// Sets queue `index` up at the given addresses with `size` entries,
    /// interrupting on MSI-X `vector`, and enables it. Returns the queue's
    /// notification offset in the notify structure.
    pub fn setup_queue(
        &self,
        index: u16,
        size: u16,
        (desc, driver, device): (u64, u64, u64),
        vector: u16,
    ) -> Result<usize, Error> {
        self.w16(common::QUEUE_SELECT, index)?;
        self.w16(common::QUEUE_SIZE, size)?;
        self.w64(common::QUEUE_DESC, desc)?;
        self.w64(common::QUEUE_DRIVER, driver)?;
        self.w64(common::QUEUE_DEVICE, device)?;
        self.w16(common::QUEUE_MSIX_VECTOR, vector)?;
        if self.c16(common::QUEUE_MSIX_VECTOR)? != vector {
            return Err(Error::Device(format!(
                "queue {index}: MSI-X vector {vector} refused"
            )));
        }
        let off =
            usize::from(self.c16(common::QUEUE_NOTIFY_OFF)?) * self.notify_multiplier as usize;
        self.notify.at(off, 2)?;
        self.w16(common::QUEUE_ENABLE, 1)?;
        Ok(off)
    }

    /// Configuration changes interrupt on `vector` (or none).
    pub fn set_config_vector(&self, vector: u16) -> Result<(), Error> {
        self.w16(common::MSIX_CONFIG, vector)
    }

    /// Tells the device queue `index` (notification offset `off`) has new
    /// buffers.
    pub fn notify(&self, off: usize, index: u16) -> Result<(), Error> {
        let at = self.notify.at(off, 2)?;
        self.notify.bar.write_u16(at, index)
    }

    /// Reads the device configuration with `read`, retrying while the
    /// configuration generation changes under it.
    pub fn read_device_config<T>(
        &self,
        read: impl Fn(&dyn Fn(usize) -> Result<u32, Error>) -> Result<T, Error>,
    ) -> Result<T, Error> {
        for _ in 0..100 {
            let before = self.c8(common::CONFIG_GENERATION)?;
            let dev = &self.device;
            let word = |at: usize| dev.bar.read_u32(dev.at(at, 4)?);
            let value = read(&word)?;
            if self.c8(common::CONFIG_GENERATION)? == before {
                return Ok(value);
            }
        }
        Err(Error::Device("configuration kept changing".into()))
    }
}
