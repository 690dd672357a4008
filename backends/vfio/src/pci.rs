//! PCI config space: finding the virtio capabilities that say where the
//! transport's structures live.

/// `VIRTIO_PCI_CAP_*_CFG`.
pub(crate) const CAP_COMMON: u8 = 1;
pub(crate) const CAP_NOTIFY: u8 = 2;
pub(crate) const CAP_DEVICE: u8 = 4;

/// A `struct virtio_pci_cap` (with the notify capability's multiplier).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct VirtioCap {
    pub(crate) cfg_type: u8,
    pub(crate) bar: u8,
    pub(crate) offset: u32,
    pub(crate) length: u32,
    /// `notify_off_multiplier` (notify capabilities only).
    pub(crate) notify_multiplier: u32,
}

fn le32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// The vendor (virtio) capabilities in `config` (the first 256 bytes of
/// config space), in list order. A malformed list ends the walk.
pub(crate) fn virtio_caps(config: &[u8]) -> Vec<VirtioCap> {
    let mut out = Vec::new();
    let has_list = config.get(6).is_some_and(|s| s & 0x10 != 0);
    if !has_list {
        return out;
    }
    let mut at = usize::from(config.get(0x34).copied().unwrap_or(0) & 0xfc);
    // A capability seen twice means a loop.
    let mut seen = [false; 256];
    loop {
        if !(0x40..256).contains(&at) || seen[at] {
            break;
        }
        seen[at] = true;
        let (Some(&id), Some(&next)) = (config.get(at), config.get(at + 1)) else {
            break;
        };
        if id == 0x09 {
            let cap = (|| {
                Some(VirtioCap {
                    cfg_type: *config.get(at + 3)?,
                    bar: *config.get(at + 4)?,
                    offset: le32(config, at + 8)?,
                    length: le32(config, at + 12)?,
                    notify_multiplier: if config.get(at + 3) == Some(&CAP_NOTIFY) {
                        le32(config, at + 16)?
                    } else {
                        0
                    },
                })
            })();
            out.extend(cap);
        }
        at = usize::from(next & 0xfc);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cap(cfg: &mut [u8], at: usize, next: u8, cfg_type: u8, bar: u8, offset: u32, len: u32) {
        cfg[at] = 0x09;
        cfg[at + 1] = next;
        cfg[at + 2] = if cfg_type == CAP_NOTIFY { 20 } else { 16 };
        cfg[at + 3] = cfg_type;
        cfg[at + 4] = bar;
        cfg[at + 8..at + 12].copy_from_slice(&offset.to_le_bytes());
        cfg[at + 12..at + 16].copy_from_slice(&len.to_le_bytes());
    }

    #[test]
    fn walks_the_list_and_skips_other_capabilities() {
        let mut cfg = vec![0u8; 256];
        cfg[0..4].copy_from_slice(&[0xf4, 0x1a, 0x54, 0x10]);
        cfg[6] = 0x10;
        cfg[0x34] = 0x40;
        // MSI-X at 0x40, then common, notify (multiplier 4), device.
        cfg[0x40] = 0x11;
        cfg[0x41] = 0x50;
        cap(&mut cfg, 0x50, 0x64, CAP_COMMON, 4, 0, 0x1000);
        cap(&mut cfg, 0x64, 0x7c, CAP_NOTIFY, 4, 0x3000, 0x1000);
        cfg[0x64 + 16..0x64 + 20].copy_from_slice(&4u32.to_le_bytes());
        cap(&mut cfg, 0x7c, 0, CAP_DEVICE, 4, 0x2000, 0x1000);
        let caps = virtio_caps(&cfg);
        assert_eq!(caps.len(), 3);
        assert_eq!(caps[1].cfg_type, CAP_NOTIFY);
        assert_eq!((caps[1].offset, caps[1].notify_multiplier), (0x3000, 4));
        assert_eq!((caps[2].bar, caps[2].offset), (4, 0x2000));
    }

    #[test]
    fn a_looping_or_truncated_list_ends() {
        let mut cfg = vec![0u8; 256];
        cfg[6] = 0x10;
        cfg[0x34] = 0x40;
        cap(&mut cfg, 0x40, 0x40, CAP_COMMON, 0, 0, 16);
        assert_eq!(virtio_caps(&cfg).len(), 1, "a self-loop stops");
        assert!(virtio_caps(&cfg[..0x48]).is_empty(), "truncated");
        assert!(virtio_caps(&[]).is_empty());
    }
}
