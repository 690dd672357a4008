#![doc = include_str!("../README.md")]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod device;
pub mod discover;
pub mod dma;
mod error;
mod mem;
mod pci;
pub mod protocol;
mod queue;
mod request;
mod session;
mod sys;
pub mod transport;
pub mod vfio;
pub mod virtqueue;

pub use device::{CryptoDevice, MAX_REQUEST, POLL_FOR, POOL_BYTES};
pub use discover::{VIRTIO_CRYPTO, devices, unavailable_reason};
pub use error::{Error, Failed, status_name};
pub use protocol::CipherAlgo;
pub use request::DmaRequest;
pub use session::CipherSession;
