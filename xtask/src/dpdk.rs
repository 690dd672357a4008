//! DPDK's `dpdk-test-crypto-perf` for the vfio run's `dpdk-crypto-perf`
//! step: DPDK 22.11's crypto_virtio PMD, the peer the userspace VFIO driver
//! is compared with. Packed when the host has it (Debian package
//! `dpdk-dev`); without it the step is skipped.
//!
//! Debian builds DPDK as shared libraries, and its drivers (PMDs) are EAL
//! plugins in `/usr/lib/x86_64-linux-gnu/dpdk/pmds-<ABI>/`, which EAL loads
//! all of at start when that folder exists. The guest gets only what
//! crypto_virtio on PCI needs: the binary's libraries (from `ldd`, at the
//! paths `ldd` resolves them to: mostly the multiarch folder, plus
//! `librte_bus_vdev` and `librte_crypto_scheduler`, which the binary links
//! through its RUNPATH, the plugin folder) and [`PLUGINS`] with their
//! libraries, loaded with EAL's `-d` from the multiarch folder, where `ldd`
//! finds them as dependencies of one another. One path per library matters:
//! the initramfs has no symlinks, so a second path to the same library would
//! be a second copy, loaded twice (a bus registered twice). The plugin
//! folder in the guest holds only the two linked libraries, which EAL's scan
//! opens again at the same paths (a no-op); EAL skips that scan when the
//! folder is missing, so a DPDK that links none would work too. Debian's
//! whole plugin folder is ~30 MiB and its mlx5/ibverbs drivers drag in more.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::shared_libs;

/// Where Debian's `dpdk-dev` installs the test application.
pub const HOST_BINARY: &str = "/usr/bin/dpdk-test-crypto-perf";
/// Its place in the guest.
pub const GUEST_BINARY: &str = "/bin/dpdk-test-crypto-perf";
/// The guest script that runs it on a device (`xtask/guest/dpdk-crypto-perf`).
pub const GUEST_SCRIPT: &str = "/bin/dpdk-crypto-perf";
/// The script itself.
pub const SCRIPT: &str = include_str!("../guest/dpdk-crypto-perf");
/// The guest file listing the plugins' paths, one a line, for EAL's `-d`.
pub const PLUGINS_PATH: &str = "/etc/vmtest/dpdk-plugins";
/// The EAL plugins crypto_virtio on PCI needs, as `librte_<name>.so.<ABI>`:
/// the PCI bus, the ring mempool driver (the default ops of mbuf, crypto-op
/// and session pools; without it pool creation fails) and the PMD.
pub const PLUGINS: [&str; 3] = ["bus_pci", "mempool_ring", "crypto_virtio"];

/// DPDK's files for the guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dpdk {
    /// `dpdk-test-crypto-perf` on the host.
    pub binary: PathBuf,
    /// The plugins to load with `-d`, at the same path on the host and in
    /// the guest.
    pub plugins: Vec<PathBuf>,
    /// The libraries of the binary and the plugins (loader included), at
    /// the same path on the host and in the guest.
    pub libraries: Vec<PathBuf>,
}

impl Dpdk {
    /// The plugins file: one guest path a line.
    pub fn plugins_list(&self) -> String {
        self.plugins
            .iter()
            .map(|p| format!("{}\n", p.display()))
            .collect()
    }
}

/// DPDK's files, or `None` if the host has no [`HOST_BINARY`].
pub fn find(ldd: &Path) -> Result<Option<Dpdk>> {
    let binary = PathBuf::from(HOST_BINARY);
    if !binary.exists() {
        return Ok(None);
    }
    let mut libraries = shared_libs::libraries_of(ldd, &binary)?;
    let plugins = plugin_paths(&libraries)?;
    for plugin in &plugins {
        if !plugin.exists() {
            bail!(
                "{} is missing: {HOST_BINARY} cannot drive virtio-crypto without it",
                plugin.display()
            );
        }
        libraries.extend(shared_libs::libraries_of(ldd, plugin)?);
    }
    libraries.sort();
    libraries.dedup();
    Ok(Some(Dpdk {
        binary,
        plugins,
        libraries,
    }))
}

/// The [`PLUGINS`] beside the binary's `librte_eal.so.<ABI>`, same ABI.
pub fn plugin_paths(libraries: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let eal = libraries
        .iter()
        .find(|l| {
            l.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("librte_eal.so."))
        })
        .with_context(|| format!("{HOST_BINARY} does not link librte_eal"))?;
    let name = eal.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let abi = name.trim_start_matches("librte_eal.so.");
    let dir = eal.parent().unwrap_or(Path::new("/"));
    Ok(PLUGINS
        .iter()
        .map(|plugin| dir.join(format!("librte_{plugin}.so.{abi}")))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plugins_sit_beside_eal_with_its_abi() {
        let libraries = [
            "/lib/x86_64-linux-gnu/libm.so.6",
            "/lib/x86_64-linux-gnu/librte_eal.so.23",
            "/usr/lib/x86_64-linux-gnu/dpdk/pmds-23.0/librte_bus_vdev.so.23",
        ]
        .map(PathBuf::from);
        assert_eq!(
            plugin_paths(&libraries).unwrap(),
            [
                "/lib/x86_64-linux-gnu/librte_bus_pci.so.23",
                "/lib/x86_64-linux-gnu/librte_mempool_ring.so.23",
                "/lib/x86_64-linux-gnu/librte_crypto_virtio.so.23",
            ]
            .map(PathBuf::from)
        );
        assert!(plugin_paths(&libraries[..1]).is_err());
        let dpdk = Dpdk {
            binary: HOST_BINARY.into(),
            plugins: plugin_paths(&libraries).unwrap(),
            libraries: Vec::new(),
        };
        assert_eq!(
            dpdk.plugins_list(),
            "/lib/x86_64-linux-gnu/librte_bus_pci.so.23\n\
             /lib/x86_64-linux-gnu/librte_mempool_ring.so.23\n\
             /lib/x86_64-linux-gnu/librte_crypto_virtio.so.23\n"
        );
    }

    #[test]
    fn the_script_takes_its_arguments_and_always_gives_the_device_back() {
        assert!(SCRIPT.starts_with("#!/bin/busybox sh\n"));
        for needed in [
            "VMTEST_VIRTIO_DEVICES",
            "64,256,1024,2048",
            "1000000",
            GUEST_BINARY,
            PLUGINS_PATH,
            "--iova-mode=pa",
            "--devtype crypto_virtio",
            "vfio-pci",
            "give_back",
            "exit \"$rc\"",
        ] {
            assert!(SCRIPT.contains(needed), "{needed}");
        }
    }
}
