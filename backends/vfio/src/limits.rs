//! What the driver sends a device, decided once at open from what the
//! device says of itself — validated, so that no request path takes the
//! device's word for a length or a size. A device whose configuration no
//! driver could work with is refused at open, with the reason.

use crate::error::Error;
use crate::protocol::DeviceConfig;

/// The largest request this driver sends whole (XTS units up to this;
/// longer CBC, CTR and ECB requests go in pieces of it, chained).
pub const MAX_REQUEST: usize = 256 << 10;

/// Entries per queue, at most (the device may offer fewer).
pub const QUEUE_SIZE: u16 = 1024;

/// Descriptors in the longest chain the driver sends without an indirect
/// table: a data request's header, IV, input, output and status.
pub const DATA_CHAIN: usize = 5;

/// Descriptors in the longest control request: a session's header, key
/// and the status the device writes.
pub const CONTROL_CHAIN: usize = 3;

/// The limits requests on a device keep to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The most data one request carries: whole AES blocks, at least one,
    /// at most [`MAX_REQUEST`] (the device's `max_size`, rounded down to
    /// whole blocks, if that is less).
    pub max_request: usize,
}

impl Limits {
    /// The limits for a device configured as `config`.
    ///
    /// # Errors
    /// [`Error::Device`] if the device takes less than one AES block per
    /// request (`max_size` under 16): no request could be sent.
    pub fn of(config: &DeviceConfig) -> Result<Limits, Error> {
        if config.max_size < 16 {
            return Err(Error::Device(format!(
                "max_size {} is less than one AES block",
                config.max_size
            )));
        }
        let device = usize::try_from(config.max_size).unwrap_or(usize::MAX);
        Ok(Limits {
            max_request: MAX_REQUEST.min(device / 16 * 16),
        })
    }
}

/// The size of a queue the device offers up to `offered` entries for: the
/// largest power of two within both that and [`QUEUE_SIZE`].
///
/// # Errors
/// [`Error::Device`] if the device offers no such queue (`offered` 0) or
/// one too small for the longest chain it must carry (`longest`
/// descriptors: [`DATA_CHAIN`], or 1 with indirect tables;
/// [`CONTROL_CHAIN`]).
pub fn queue_size(index: u16, offered: u16, longest: usize) -> Result<u16, Error> {
    if offered == 0 {
        return Err(Error::Device(format!("no queue {index}")));
    }
    let within = QUEUE_SIZE.min(offered);
    let size = 1u16 << (15 - within.leading_zeros());
    if usize::from(size) < longest {
        return Err(Error::Device(format!(
            "queue {index} holds {size} descriptors, fewer than a request's {longest}"
        )));
    }
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(max_size: u64) -> DeviceConfig {
        DeviceConfig {
            max_size,
            ..DeviceConfig::default()
        }
    }

    #[test]
    fn a_device_max_size_is_rounded_down_to_blocks_and_capped() {
        for bad in [0, 1, 15] {
            assert!(
                matches!(Limits::of(&config(bad)), Err(Error::Device(_))),
                "max_size {bad} accepted"
            );
        }
        let max = |m| Limits::of(&config(m)).unwrap().max_request;
        assert_eq!(max(16), 16);
        assert_eq!(max(31), 16);
        assert_eq!(max(4097), 4096);
        assert_eq!(max(u64::MAX), MAX_REQUEST);
        assert_eq!(max(MAX_REQUEST as u64 + 15), MAX_REQUEST);
    }

    #[test]
    fn queue_sizes_are_powers_of_two_within_both_limits() {
        assert!(matches!(queue_size(0, 0, 1), Err(Error::Device(_))));
        assert_eq!(queue_size(0, 1, 1).unwrap(), 1);
        assert!(matches!(
            queue_size(0, 4, DATA_CHAIN),
            Err(Error::Device(_))
        ));
        assert_eq!(queue_size(0, 8, DATA_CHAIN).unwrap(), 8);
        assert_eq!(queue_size(0, 1000, 1).unwrap(), 512);
        assert_eq!(queue_size(0, 1024, 1).unwrap(), 1024);
        assert_eq!(queue_size(0, u16::MAX, 1).unwrap(), QUEUE_SIZE);
        for offered in 1..=u16::MAX {
            if let Ok(size) = queue_size(1, offered, 1) {
                assert!(size.is_power_of_two() && size <= offered && size <= QUEUE_SIZE);
            }
        }
    }
}
