#![doc = include_str!("../README.md")]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod buffer;
mod device;
#[cfg(any(test, feature = "fuzzing"))]
pub mod device_ring;
mod discover;
mod dma;
#[cfg(any(test, feature = "fuzzing"))]
#[cfg_attr(not(test), allow(dead_code))]
mod emulated;
mod error;
#[cfg(any(test, feature = "fuzzing"))]
pub mod harness;
mod limits;
mod mem;
mod pci;
mod platform;
mod protocol;
mod queue;
mod request;
mod session;
mod sys;
mod transport;
mod units;
mod vfio;
mod virtqueue;

pub use buffer::DmaBuffer;
pub use device::{CONTROL_TIMEOUT, CryptoDevice, POLL_FOR};
pub use discover::{VIRTIO_CRYPTO, devices, unavailable_reason};
pub use error::{BufferFailed, Error, Failed, Returned, status_name};
pub use limits::{Limits, MAX_REQUEST};
pub use platform::POOL_BYTES;
pub use protocol::{CipherAlgo, DeviceConfig};
pub use request::DmaRequest;
pub use session::{CipherSession, RequestTimeout, UNITS_IN_FLIGHT};

/// A device over an emulated virtio-crypto device — a thread that plays
/// the device over plain memory, as the driver's own tests use — so the
/// layers above the driver (`crypto-offload`'s VFIO backend) can be tested
/// and measured on a host without one; and the hold on it that injects a
/// hang. Not API: the `fuzzing` feature.
///
/// # Errors
/// As [`CryptoDevice::open`]'s bring-up.
///
/// # Panics
/// Outside a tokio runtime with a timer (as the device's tasks need).
#[cfg(feature = "fuzzing")]
pub fn emulated_device() -> Result<(CryptoDevice, EmulatedControl), Error> {
    let (emulated, handle) = emulated::Emulated::new(emulated::Setup::default());
    let dev = CryptoDevice::start("emulated", Box::new(emulated))?;
    Ok((dev, EmulatedControl(handle)))
}

/// The test's hold on an [`emulated_device`]. Not API.
#[cfg(feature = "fuzzing")]
pub struct EmulatedControl(emulated::Handle);

#[cfg(feature = "fuzzing")]
impl EmulatedControl {
    /// While `on`, data requests are taken from the ring but not
    /// completed; cleared, the device completes them.
    pub fn hang(&self, on: bool) {
        self.0.faults(|f| f.hang = on);
    }
}
