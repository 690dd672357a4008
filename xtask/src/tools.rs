//! The host programs and files `vm-test` needs, found (never installed).
//!
//! Each missing piece is reported with the Debian package that provides it;
//! all of them are checked before anything is built, and reported together.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::{env, fs};

use anyhow::{Context, Result, bail};

use crate::{elf, kernel};

/// Where Debian's kernel packages put the images.
const BOOT_DIR: &str = "/boot";
/// Where Debian's kernel packages put the modules, one folder per version.
pub const MODULES_ROOT: &str = "/lib/modules";

/// Everything found on the host.
#[derive(Debug)]
pub struct HostTools {
    /// `qemu-system-x86_64`.
    pub qemu: PathBuf,
    /// A statically linked busybox.
    pub busybox: PathBuf,
    /// `ldd`, to list the test binaries' shared libraries.
    pub ldd: PathBuf,
    /// The kernel to boot and its modules.
    pub kernel: KernelChoice,
}

/// A kernel image with the modules built for it.
#[derive(Debug, Clone)]
pub struct KernelChoice {
    /// The image to boot (a bzImage, or an ELF vmlinux).
    pub image: PathBuf,
    /// Its release, e.g. `6.1.0-57-amd64`: the folder under /lib/modules.
    pub version: String,
    /// `/lib/modules/<version>`, holding `modules.dep`.
    pub modules_dir: PathBuf,
}

/// Finds every host tool; `kernel` overrides the choice of image.
///
/// Fails naming each missing piece and its Debian package.
pub fn find(kernel: Option<&Path>) -> Result<HostTools> {
    let qemu = find_in_path("qemu-system-x86_64")
        .context("qemu-system-x86_64 is not in PATH (Debian package qemu-system-x86)");
    let busybox = find_static_busybox();
    let ldd = find_in_path("ldd").context("ldd is not in PATH (Debian package libc-bin)");
    let kernel = match kernel {
        Some(image) => kernel_from_image(image),
        None => newest_kernel(Path::new(BOOT_DIR), Path::new(MODULES_ROOT)),
    };
    match (qemu, busybox, ldd, kernel) {
        (Ok(qemu), Ok(busybox), Ok(ldd), Ok(kernel)) => Ok(HostTools {
            qemu,
            busybox,
            ldd,
            kernel,
        }),
        (qemu, busybox, ldd, kernel) => {
            let mut message =
                String::from("the host lacks what vm-test needs (nothing is installed for you):");
            for problem in [qemu.err(), busybox.err(), ldd.err(), kernel.err()]
                .into_iter()
                .flatten()
            {
                let _ = write!(message, "\n  - {problem:#}");
            }
            message.push_str(
                "\n  as root: apt-get install -y qemu-system-x86 busybox-static linux-image-amd64",
            );
            bail!(message)
        }
    }
}

/// The first executable file called `name` on `PATH`.
pub fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = env::var_os("PATH")?;
    env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// busybox-static installs `/bin/busybox`; the dynamically linked `busybox`
/// package installs the same path, so the ELF is checked for a loader.
fn find_static_busybox() -> Result<PathBuf> {
    let candidates = ["/bin/busybox", "/usr/bin/busybox"].map(PathBuf::from);
    let path = candidates
        .into_iter()
        .find(|p| is_executable(p))
        .or_else(|| find_in_path("busybox"))
        .context("busybox is not installed (Debian package busybox-static)")?;
    let bytes = fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    match elf::interpreter(&bytes)
        .with_context(|| format!("{} is not an x86-64 ELF", path.display()))?
    {
        None => Ok(path),
        Some(loader) => bail!(
            "{} is dynamically linked (loader {loader}); the guest needs a static one (Debian package busybox-static)",
            path.display()
        ),
    }
}

/// A kernel given with `--kernel`: its release comes from the bzImage header,
/// else from a `vmlinuz-<release>` / `vmlinux-<release>` file name.
fn kernel_from_image(image: &Path) -> Result<KernelChoice> {
    let bytes =
        fs::read(image).with_context(|| format!("reading the kernel image {}", image.display()))?;
    let version = kernel::bzimage_release(&bytes)
        .or_else(|| {
            let name = image.file_name()?.to_str()?;
            let release = name
                .strip_prefix("vmlinuz-")
                .or_else(|| name.strip_prefix("vmlinux-"))?;
            Some(release.to_owned())
        })
        .with_context(|| {
            format!(
                "cannot tell the kernel release of {}: not a bzImage, nor named vmlinuz-<release>",
                image.display()
            )
        })?;
    let modules_dir = Path::new(MODULES_ROOT).join(&version);
    if !modules_dir.join("modules.dep").is_file() {
        bail!(
            "{} has no modules.dep for the kernel {} (Debian package linux-image-amd64, or the image's own package)",
            modules_dir.display(),
            image.display()
        );
    }
    Ok(KernelChoice {
        image: image.to_owned(),
        version,
        modules_dir,
    })
}

/// The newest `vmlinuz-<release>` in `boot` whose `<modules_root>/<release>/modules.dep` exists.
pub fn newest_kernel(boot: &Path, modules_root: &Path) -> Result<KernelChoice> {
    let mut releases: Vec<String> = fs::read_dir(boot)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_prefix("vmlinuz-")
                .map(str::to_owned)
        })
        .collect();
    if releases.is_empty() {
        bail!(
            "no kernel image {}/vmlinuz-* (Debian package linux-image-amd64)",
            boot.display()
        );
    }
    releases.sort_by(|a, b| compare_versions(b, a));
    for release in &releases {
        let modules_dir = modules_root.join(release);
        if modules_dir.join("modules.dep").is_file() {
            return Ok(KernelChoice {
                image: boot.join(format!("vmlinuz-{release}")),
                version: release.clone(),
                modules_dir,
            });
        }
    }
    bail!(
        "no {}/<release>/modules.dep for any of the kernels {} (Debian package linux-image-amd64)",
        modules_root.display(),
        releases.join(", ")
    )
}

/// Orders version strings like `sort -V`: runs of digits compare as numbers,
/// everything else byte-wise.
pub fn compare_versions(a: &str, b: &str) -> std::cmp::Ordering {
    let (mut a, mut b) = (a.as_bytes(), b.as_bytes());
    loop {
        match (a.first(), b.first()) {
            (None, None) => return std::cmp::Ordering::Equal,
            (None, Some(_)) => return std::cmp::Ordering::Less,
            (Some(_), None) => return std::cmp::Ordering::Greater,
            (Some(x), Some(y)) if x.is_ascii_digit() && y.is_ascii_digit() => {
                let (na, ra) = split_digits(a);
                let (nb, rb) = split_digits(b);
                let na = trim_zeros(na);
                let nb = trim_zeros(nb);
                let order = na.len().cmp(&nb.len()).then_with(|| na.cmp(nb));
                if order.is_ne() {
                    return order;
                }
                (a, b) = (ra, rb);
            }
            (Some(x), Some(y)) => {
                if x != y {
                    return x.cmp(y);
                }
                (a, b) = (&a[1..], &b[1..]);
            }
        }
    }
}

fn split_digits(s: &[u8]) -> (&[u8], &[u8]) {
    let end = s
        .iter()
        .position(|c| !c.is_ascii_digit())
        .unwrap_or(s.len());
    s.split_at(end)
}

fn trim_zeros(digits: &[u8]) -> &[u8] {
    let start = digits
        .iter()
        .position(|&c| c != b'0')
        .unwrap_or(digits.len());
    &digits[start..]
}

#[cfg(test)]
mod tests {
    use std::cmp::Ordering;

    use super::*;

    #[test]
    fn versions_compare_numerically() {
        assert_eq!(
            compare_versions("6.1.0-57-amd64", "6.1.0-9-amd64"),
            Ordering::Greater
        );
        assert_eq!(
            compare_versions("6.12.1-amd64", "6.1.99-amd64"),
            Ordering::Greater
        );
        assert_eq!(
            compare_versions("6.1.0-57-amd64", "6.1.0-57-amd64"),
            Ordering::Equal
        );
        assert_eq!(
            compare_versions("6.1.0-57-amd64", "6.1.0-57-cloud-amd64"),
            Ordering::Less
        );
        assert_eq!(compare_versions("6.1", "6.1.0"), Ordering::Less);
        assert_eq!(compare_versions("6.01", "6.1"), Ordering::Equal);
    }

    #[test]
    fn the_newest_kernel_with_modules_wins() {
        let dir = std::env::temp_dir().join(format!("xtask-kernels-{}", std::process::id()));
        let (boot, modules) = (dir.join("boot"), dir.join("modules"));
        for release in ["6.1.0-9-amd64", "6.1.0-57-amd64", "6.2.0-1-amd64"] {
            fs::create_dir_all(&boot).unwrap();
            fs::write(boot.join(format!("vmlinuz-{release}")), b"").unwrap();
        }
        for release in ["6.1.0-9-amd64", "6.1.0-57-amd64"] {
            fs::create_dir_all(modules.join(release)).unwrap();
            fs::write(modules.join(release).join("modules.dep"), b"").unwrap();
        }
        let chosen = newest_kernel(&boot, &modules).unwrap();
        fs::remove_dir_all(&dir).unwrap();
        assert_eq!(chosen.version, "6.1.0-57-amd64");
        assert_eq!(chosen.image, boot.join("vmlinuz-6.1.0-57-amd64"));
    }

    #[test]
    fn no_kernel_names_the_package() {
        let dir = std::env::temp_dir().join(format!("xtask-no-kernel-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let error = newest_kernel(&dir, &dir).unwrap_err();
        fs::remove_dir_all(&dir).unwrap();
        assert!(
            format!("{error:#}").contains("linux-image-amd64"),
            "{error:#}"
        );
    }
}
