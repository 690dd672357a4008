//! Which devices this driver can take: PCI functions bound to `vfio-pci`
//! whose vendor and device IDs name a known engine.

use std::path::Path;

use crate::vfio::SYSFS_PCI;

/// virtio-crypto (modern): vendor 0x1af4, device 0x1040 + 20.
pub const VIRTIO_CRYPTO: (u16, u16) = (0x1af4, 0x1054);

fn hex_id(path: &Path) -> Option<u16> {
    let s = std::fs::read_to_string(path).ok()?;
    u16::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok()
}

/// The PCI addresses of virtio-crypto functions bound to `vfio-pci`, in
/// sysfs order; and, for the report, those present but bound elsewhere.
pub fn devices() -> (Vec<String>, Vec<(String, String)>) {
    devices_in(Path::new(SYSFS_PCI))
}

pub(crate) fn devices_in(sysfs: &Path) -> (Vec<String>, Vec<(String, String)>) {
    let mut usable = Vec::new();
    let mut elsewhere = Vec::new();
    let Ok(entries) = std::fs::read_dir(sysfs) else {
        return (usable, elsewhere);
    };
    let mut names: Vec<_> = entries.flatten().map(|e| e.file_name()).collect();
    names.sort();
    for name in names {
        let dev = sysfs.join(&name);
        let ids = (hex_id(&dev.join("vendor")), hex_id(&dev.join("device")));
        if ids != (Some(VIRTIO_CRYPTO.0), Some(VIRTIO_CRYPTO.1)) {
            continue;
        }
        let address = name.to_string_lossy().into_owned();
        let driver = std::fs::read_link(dev.join("driver"))
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
        match driver.as_deref() {
            Some("vfio-pci") => usable.push(address),
            other => elsewhere.push((address, other.unwrap_or("no driver").to_owned())),
        }
    }
    (usable, elsewhere)
}

/// Why no device is usable, for `offload probe` (`None` if one is).
pub fn unavailable_reason() -> Option<String> {
    let (usable, elsewhere) = devices();
    if !usable.is_empty() {
        return None;
    }
    if !Path::new("/dev/vfio/vfio").exists() {
        return Some("no /dev/vfio/vfio (the vfio modules are not loaded)".into());
    }
    Some(match elsewhere.as_slice() {
        [] => "no virtio-crypto device (1af4:1054) on the PCI bus".into(),
        found => format!(
            "virtio-crypto devices are bound to other drivers ({}): bind them to vfio-pci",
            found
                .iter()
                .map(|(a, d)| format!("{a}: {d}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_virtio_crypto_functions_by_id_and_driver() {
        let dir = std::env::temp_dir().join(format!("vfio-discover-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let add = |addr: &str, vendor: &str, device: &str, driver: Option<&str>| {
            let d = dir.join(addr);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("vendor"), format!("{vendor}\n")).unwrap();
            std::fs::write(d.join("device"), format!("{device}\n")).unwrap();
            if let Some(drv) = driver {
                let target = dir.join("drivers").join(drv);
                std::fs::create_dir_all(&target).unwrap();
                std::os::unix::fs::symlink(&target, d.join("driver")).unwrap();
            }
        };
        add("0000:01:00.0", "0x1af4", "0x1054", Some("vfio-pci"));
        add("0000:02:00.0", "0x1af4", "0x1054", Some("virtio-pci"));
        add("0000:03:00.0", "0x1af4", "0x1041", Some("vfio-pci"));
        add("0000:04:00.0", "0x1af4", "0x1054", None);
        let (usable, elsewhere) = devices_in(&dir);
        assert_eq!(usable, vec!["0000:01:00.0"]);
        assert_eq!(
            elsewhere,
            vec![
                ("0000:02:00.0".to_owned(), "virtio-pci".to_owned()),
                ("0000:04:00.0".to_owned(), "no driver".to_owned())
            ]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
