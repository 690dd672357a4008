//! The engine's device power, through sysfs runtime PM.
//!
//! A kernel driver takes its device's runtime-PM reference while a
//! transform is open (so a session keeps its transform open), but whether
//! the device may suspend at all when idle is userspace's call:
//! `power/control` is `on` (never suspend) or `auto` (suspend when idle).
//! [`RuntimePm`] finds the devices a driver module has bound and switches
//! that control — `on` while a session needs the engine, `auto` after.

use std::path::{Path, PathBuf};

/// The runtime-PM controls of the devices a driver module has bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimePm {
    devices: Vec<PathBuf>,
}

impl RuntimePm {
    /// The union of two sets of devices (an engine family spread over
    /// several modules).
    pub fn merge(mut self, other: RuntimePm) -> RuntimePm {
        for d in other.devices {
            if !self.devices.contains(&d) {
                self.devices.push(d);
            }
        }
        self
    }
}

impl RuntimePm {
    /// The devices bound to `module`'s drivers (from
    /// `/sys/module/<module>/drivers/*/`), each taken at the bus device that
    /// has the power: a virtio device's PCI function, for instance. `None`
    /// if the module has bound none with a `power/control`.
    pub fn for_module(module: &str) -> Option<RuntimePm> {
        RuntimePm::for_module_in(Path::new("/sys"), module)
    }

    /// As [`RuntimePm::for_module`], under another sysfs root (for tests).
    pub fn for_module_in(sysfs: &Path, module: &str) -> Option<RuntimePm> {
        let drivers = sysfs.join("module").join(module).join("drivers");
        let mut devices = Vec::new();
        for driver in std::fs::read_dir(drivers).ok()?.flatten() {
            let Ok(entries) = std::fs::read_dir(driver.path()) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                // Bound devices are symlinks with a `power` directory; the
                // driver's own attributes (bind, uevent, module) are not.
                let Ok(device) = std::fs::canonicalize(&path) else {
                    continue;
                };
                if !device.join("power").is_dir() || entry.file_name() == "module" {
                    continue;
                }
                let device = power_holder(&device);
                if device.join("power/control").is_file() && !devices.contains(&device) {
                    devices.push(device);
                }
            }
        }
        (!devices.is_empty()).then_some(RuntimePm { devices })
    }

    /// The devices (sysfs paths).
    pub fn devices(&self) -> &[PathBuf] {
        &self.devices
    }

    /// Whether this process may switch every device's control (opening it
    /// for writing; nothing is written). Only root may, usually.
    pub fn writable(&self) -> bool {
        self.devices.iter().all(|d| {
            std::fs::OpenOptions::new()
                .write(true)
                .open(d.join("power/control"))
                .is_ok()
        })
    }

    /// Lets the devices suspend when idle (`auto`) or keeps them up (`on`).
    ///
    /// # Errors
    /// A control that cannot be written (not root, read-only sysfs).
    pub fn set_active(&self, on: bool) -> std::io::Result<()> {
        for d in &self.devices {
            std::fs::write(d.join("power/control"), if on { "on" } else { "auto" })?;
        }
        Ok(())
    }

    /// Each device's `power/control` and `power/runtime_status`, as read.
    pub fn state(&self) -> Vec<(String, String)> {
        let read = |d: &PathBuf, f: &str| {
            std::fs::read_to_string(d.join("power").join(f))
                .map(|s| s.trim().to_owned())
                .unwrap_or_default()
        };
        self.devices
            .iter()
            .map(|d| (read(d, "control"), read(d, "runtime_status")))
            .collect()
    }
}

/// The device whose power a bound device's engine runs on: a virtio
/// device's transport (its parent, the PCI function); anything else itself.
fn power_holder(device: &Path) -> PathBuf {
    let subsystem = std::fs::canonicalize(device.join("subsystem"))
        .ok()
        .and_then(|s| s.file_name().map(|n| n.to_string_lossy().into_owned()));
    match (subsystem.as_deref(), device.parent()) {
        (Some("virtio"), Some(parent)) => parent.to_path_buf(),
        _ => device.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_virtio_engines_pci_function_in_a_fake_sysfs() {
        let root = std::env::temp_dir().join(format!("af-alg-sysfs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let pci = root.join("devices/pci0000:00/0000:00:03.0");
        let virtio = pci.join("virtio0");
        std::fs::create_dir_all(pci.join("power")).unwrap();
        std::fs::write(pci.join("power/control"), "on").unwrap();
        std::fs::create_dir_all(virtio.join("power")).unwrap();
        std::fs::create_dir_all(root.join("bus/virtio")).unwrap();
        std::os::unix::fs::symlink(root.join("bus/virtio"), virtio.join("subsystem")).unwrap();
        let driver = root.join("module/virtio_crypto/drivers/virtio:virtio_crypto");
        std::fs::create_dir_all(&driver).unwrap();
        std::os::unix::fs::symlink(&virtio, driver.join("virtio0")).unwrap();
        std::fs::write(driver.join("bind"), "").unwrap();

        let pm = RuntimePm::for_module_in(&root, "virtio_crypto").unwrap();
        assert_eq!(pm.devices(), [std::fs::canonicalize(&pci).unwrap()]);
        pm.set_active(false).unwrap();
        assert_eq!(pm.state()[0].0, "auto");
        pm.set_active(true).unwrap();
        assert_eq!(pm.state()[0].0, "on");
        assert!(RuntimePm::for_module_in(&root, "no_such_module").is_none());
        let _ = std::fs::remove_dir_all(&root);
    }
}
