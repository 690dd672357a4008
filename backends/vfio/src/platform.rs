//! What the driver needs of a device's hardware — the virtio-pci transport
//! (status, features, configuration, queues, doorbells) and the PCI
//! function (DMA memory, MSI-X, reset, power) — as one trait, so that
//! everything above it (the handshake, the queues, requests, power and
//! failure handling) runs the same over VFIO and over the emulated device
//! the tests use (rust-vmm's "mock twin"). [`Vfio`] is the real one.

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;

use crate::dma::DmaPool;
use crate::error::Error;
use crate::protocol::DeviceConfig;
use crate::transport::Transport;
use crate::vfio::Device;

/// The DMA pool's size: queues, and room for many requests in flight.
pub const POOL_BYTES: usize = 4 << 20;
/// Where the pool sits in the device's address space (inside the IOVA
/// ranges the guest's IOMMU offers, clear of the MSI window at 0xfee00000).
const POOL_IOVA: u64 = 0x4000_0000;

/// A virtio-crypto device's hardware, as the driver reaches it. Every
/// method that touches the device's registers must only be called while
/// the function is powered (not in D3hot); the driver keeps to that.
pub(crate) trait Platform: Send + Sync + 'static {
    /// The device status.
    fn status(&self) -> Result<u8, Error>;
    /// Sets status bits on top of the current ones.
    fn add_status(&self, bits: u8) -> Result<(), Error>;
    /// Resets the virtio device: status 0, waiting for it to read back 0
    /// (then the device no longer touches the rings or any buffer).
    fn reset(&self) -> Result<(), Error>;
    /// The device's feature bits.
    fn device_features(&self) -> Result<u64, Error>;
    /// Writes the driver's features and FEATURES_OK, checking it was kept.
    fn negotiate(&self, features: u64) -> Result<(), Error>;
    /// The device configuration (read consistently).
    fn read_config(&self) -> Result<DeviceConfig, Error>;
    /// The largest size queue `index` takes (0: no such queue).
    fn queue_max_size(&self, index: u16) -> Result<u16, Error>;
    /// Sets queue `index` up and enables it; its notification offset.
    fn setup_queue(
        &self,
        index: u16,
        size: u16,
        addresses: (u64, u64, u64),
        vector: u16,
    ) -> Result<usize, Error>;
    /// Configuration changes interrupt on `vector` (or none).
    fn set_config_vector(&self, vector: u16) -> Result<(), Error>;
    /// Rings queue `index`'s doorbell (notification offset `off`).
    fn notify(&self, off: usize, index: u16) -> Result<(), Error>;
    /// The DMA pool for this device: at IOVAs of the driver's choosing if
    /// its DMA is `translated` by the IOMMU, else at physical addresses.
    fn dma_pool(&self, translated: bool) -> Result<Arc<DmaPool>, Error>;
    /// How many MSI-X vectors the function has.
    fn msix_vectors(&self) -> Result<u32, Error>;
    /// MSI-X vector 0 signals `fd`.
    fn enable_msix(&self, fd: BorrowedFd<'_>) -> Result<(), Error>;
    /// Turns MSI-X off.
    fn disable_msix(&self) -> Result<(), Error>;
    /// The host's requests for the device back (its removal) signal `fd`.
    fn enable_req_irq(&self, fd: BorrowedFd<'_>) -> Result<(), Error>;
    /// A function-level reset (`VFIO_DEVICE_RESET`).
    fn reset_function(&self) -> Result<(), Error>;
    /// Enters (`true`) or leaves the PCI low-power state (D3hot).
    fn set_low_power(&self, on: bool) -> Result<(), Error>;
}

/// A device bound to `vfio-pci`: the VFIO handle and the virtio-pci
/// transport in its BARs.
pub(crate) struct Vfio {
    pub(crate) device: Device,
    pub(crate) transport: Transport,
}

impl Vfio {
    /// Opens the device at `address`, lets it master the bus and finds its
    /// transport.
    pub(crate) fn open(address: &str) -> Result<Vfio, Error> {
        let device = Device::open(address)?;
        device.enable_bus_master()?;
        let transport = Transport::new(&device)?;
        Ok(Vfio { device, transport })
    }
}

impl Platform for Vfio {
    fn status(&self) -> Result<u8, Error> {
        self.transport.status()
    }

    fn add_status(&self, bits: u8) -> Result<(), Error> {
        self.transport.add_status(bits)
    }

    fn reset(&self) -> Result<(), Error> {
        self.transport.reset()
    }

    fn device_features(&self) -> Result<u64, Error> {
        self.transport.device_features()
    }

    fn negotiate(&self, features: u64) -> Result<(), Error> {
        self.transport.negotiate(features)
    }

    fn read_config(&self) -> Result<DeviceConfig, Error> {
        self.transport.read_device_config(|w| {
            Ok(DeviceConfig {
                status: w(DeviceConfig::STATUS)?,
                max_dataqueues: w(DeviceConfig::MAX_DATAQUEUES)?,
                crypto_services: w(DeviceConfig::CRYPTO_SERVICES)?,
                cipher_algo_l: w(DeviceConfig::CIPHER_ALGO_L)?,
                max_cipher_key_len: w(DeviceConfig::MAX_CIPHER_KEY_LEN)?,
                max_size: u64::from(w(DeviceConfig::MAX_SIZE)?)
                    | (u64::from(w(DeviceConfig::MAX_SIZE + 4)?) << 32),
            })
        })
    }

    fn queue_max_size(&self, index: u16) -> Result<u16, Error> {
        self.transport.queue_max_size(index)
    }

    fn setup_queue(
        &self,
        index: u16,
        size: u16,
        addresses: (u64, u64, u64),
        vector: u16,
    ) -> Result<usize, Error> {
        self.transport.setup_queue(index, size, addresses, vector)
    }

    fn set_config_vector(&self, vector: u16) -> Result<(), Error> {
        self.transport.set_config_vector(vector)
    }

    fn notify(&self, off: usize, index: u16) -> Result<(), Error> {
        self.transport.notify(off, index)
    }

    fn dma_pool(&self, translated: bool) -> Result<Arc<DmaPool>, Error> {
        let pool = if translated {
            DmaPool::new(self.device.container(), POOL_IOVA, POOL_BYTES)
        } else {
            DmaPool::physical(self.device.container()).map_err(|e| {
                Error::Device(format!(
                    "no VIRTIO_F_ACCESS_PLATFORM: the device bypasses the IOMMU and needs \
                     guest-physical addresses, from a huge page: {e}"
                ))
            })
        };
        pool.map(Arc::new)
    }

    fn msix_vectors(&self) -> Result<u32, Error> {
        self.device.msix_vectors()
    }

    fn enable_msix(&self, fd: BorrowedFd<'_>) -> Result<(), Error> {
        self.device.enable_msix(&[fd.as_fd()])
    }

    fn disable_msix(&self) -> Result<(), Error> {
        self.device.disable_msix()
    }

    fn enable_req_irq(&self, fd: BorrowedFd<'_>) -> Result<(), Error> {
        self.device.enable_req_irq(fd)
    }

    fn reset_function(&self) -> Result<(), Error> {
        self.device.reset()
    }

    fn set_low_power(&self, on: bool) -> Result<(), Error> {
        self.device.set_low_power(on)
    }
}
