//! The kernel QEMU boots: the uncompressed ELF vmlinux pulled out of the
//! bzImage when possible, cached, or the bzImage itself.
//!
//! Under TCG the bzImage's own xz decompressor is slow: the probe measured a
//! shell after ~2.5 s from the ELF against ~7.5 s from the bzImage. QEMU boots
//! an ELF vmlinux through its PVH entry note (`CONFIG_PVH=y`, as in Debian's
//! kernels). The payload is found through the x86 boot protocol header
//! (`payload_offset`/`payload_length`, protocol 2.08+), else by scanning for
//! compression magic; xz (with its x86 BCJ filter) and gzip are decoded.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Instant, UNIX_EPOCH};

use anyhow::{Context, Result, bail};

use crate::elf;

/// The xz stream magic.
const XZ_MAGIC: &[u8] = b"\xfd7zXZ\x00";
/// The gzip magic with the deflate method byte.
const GZIP_MAGIC: &[u8] = b"\x1f\x8b\x08";

/// The image QEMU is given with `-kernel`.
#[derive(Debug)]
pub struct BootImage {
    /// The file to boot.
    pub path: PathBuf,
    /// What was done to get it, for the log.
    pub note: String,
}

/// The kernel release (`uname -r`) recorded in a bzImage's boot header.
pub fn bzimage_release(image: &[u8]) -> Option<String> {
    if image.get(0x202..0x206)? != b"HdrS" {
        return None;
    }
    let pointer = u16::from_le_bytes(image.get(0x20e..0x210)?.try_into().ok()?);
    if pointer == 0 {
        return None;
    }
    let text = image.get(usize::from(pointer) + 0x200..)?;
    let text = &text[..text.iter().position(|&b| b == 0)?];
    let release = std::str::from_utf8(text).ok()?.split_whitespace().next()?;
    Some(release.to_owned())
}

/// The compressed payload a bzImage's header points at (boot protocol 2.08+).
pub fn bzimage_payload(image: &[u8]) -> Option<&[u8]> {
    if image.get(0x202..0x206)? != b"HdrS" {
        return None;
    }
    let protocol = u16::from_le_bytes(image.get(0x206..0x208)?.try_into().ok()?);
    if protocol < 0x208 {
        return None;
    }
    let setup_sectors = match *image.get(0x1f1)? {
        0 => 4,
        n => usize::from(n),
    };
    let offset = u32::from_le_bytes(image.get(0x248..0x24c)?.try_into().ok()?);
    let length = u32::from_le_bytes(image.get(0x24c..0x250)?.try_into().ok()?);
    let start = (setup_sectors + 1) * 512 + usize::try_from(offset).ok()?;
    image.get(start..start.checked_add(usize::try_from(length).ok()?)?)
}

/// Decompresses a kernel payload by its magic: xz or gzip. Bytes after the
/// compressed stream (the kernel appends the uncompressed size) are ignored.
pub fn decompress(payload: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    if payload.starts_with(XZ_MAGIC) {
        liblzma::read::XzDecoder::new(payload)
            .read_to_end(&mut out)
            .context("xz")?;
    } else if payload.starts_with(GZIP_MAGIC) {
        flate2::read::GzDecoder::new(payload)
            .read_to_end(&mut out)
            .context("gzip")?;
    } else {
        let magic: Vec<String> = payload.iter().take(4).map(|b| format!("{b:02x}")).collect();
        bail!("unsupported compression (magic {})", magic.join(" "));
    }
    Ok(out)
}

/// Pulls the ELF vmlinux out of a bzImage: the header's payload first, else
/// every xz or gzip magic in the file in turn.
pub fn extract_vmlinux(image: &[u8]) -> Result<Vec<u8>> {
    let mut last_error = None;
    let from_header = bzimage_payload(image).into_iter();
    let scanned = magic_offsets(image).map(|at| &image[at..]);
    for payload in from_header.chain(scanned) {
        match decompress(payload) {
            Ok(bytes) if elf::is_elf(&bytes) => return Ok(bytes),
            Ok(_) => {
                last_error = Some(anyhow::anyhow!(
                    "a payload decompressed to something other than an ELF"
                ))
            }
            Err(e) => last_error = Some(e),
        }
    }
    Err(last_error.unwrap_or_else(|| anyhow::anyhow!("no xz or gzip payload found")))
}

/// Offsets of xz and gzip magic in `image`, in file order.
fn magic_offsets(image: &[u8]) -> impl Iterator<Item = usize> + '_ {
    (0..image.len())
        .filter(move |&at| image[at..].starts_with(XZ_MAGIC) || image[at..].starts_with(GZIP_MAGIC))
}

/// Chooses what to boot: `image` itself if it is an ELF, else the vmlinux
/// extracted from it (cached in `cache_dir` by name, size and mtime), else
/// the bzImage with a note saying why.
pub fn boot_image(image: &Path, cache_dir: &Path) -> Result<BootImage> {
    let bytes = fs::read(image).with_context(|| format!("reading {}", image.display()))?;
    if elf::is_elf(&bytes) {
        return Ok(BootImage {
            path: image.to_owned(),
            note: "an ELF vmlinux, booted as given".into(),
        });
    }
    let cached = cache_dir.join(cache_name(image)?);
    if cached.is_file() {
        return Ok(BootImage {
            path: cached.clone(),
            note: format!("the ELF vmlinux cached at {}", cached.display()),
        });
    }
    let started = Instant::now();
    let extracted = extract_vmlinux(&bytes).and_then(|vmlinux| {
        if !elf::has_pvh_entry(&vmlinux)? {
            bail!("the vmlinux has no PVH entry note (CONFIG_PVH), which QEMU needs to boot it");
        }
        Ok(vmlinux)
    });
    match extracted {
        Ok(vmlinux) => {
            fs::create_dir_all(cache_dir)
                .with_context(|| format!("creating {}", cache_dir.display()))?;
            remove_stale_caches(cache_dir);
            let partial = cache_dir.join("vmlinux.partial");
            fs::write(&partial, &vmlinux)
                .with_context(|| format!("writing {}", partial.display()))?;
            fs::rename(&partial, &cached)
                .with_context(|| format!("renaming to {}", cached.display()))?;
            Ok(BootImage {
                path: cached.clone(),
                note: format!(
                    "the ELF vmlinux ({} MiB) extracted in {:.1} s, cached at {}",
                    vmlinux.len() >> 20,
                    started.elapsed().as_secs_f64(),
                    cached.display()
                ),
            })
        }
        Err(e) => Ok(BootImage {
            path: image.to_owned(),
            note: format!(
                "the bzImage itself (slower under TCG): no vmlinux could be extracted: {e:#}"
            ),
        }),
    }
}

/// Removes vmlinux files extracted from earlier kernel images (~60 MiB each).
fn remove_stale_caches(cache_dir: &Path) {
    for entry in fs::read_dir(cache_dir).into_iter().flatten().flatten() {
        if entry.file_name().to_string_lossy().starts_with("vmlinux-") {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// `vmlinux-<image name>-<size>-<mtime>`: a new image gets a new cache entry.
fn cache_name(image: &Path) -> Result<String> {
    let meta = fs::metadata(image).with_context(|| format!("reading {}", image.display()))?;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    let name = image
        .file_name()
        .map_or_else(|| "kernel".into(), |n| n.to_string_lossy().into_owned());
    Ok(format!("vmlinux-{name}-{}-{mtime}", meta.len()))
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;

    /// A fake bzImage: a boot header pointing at `payload` and a version string.
    fn bzimage(payload: &[u8], release: &str) -> Vec<u8> {
        let setup_sectors = 3u8;
        let mut image = vec![0u8; (usize::from(setup_sectors) + 1) * 512];
        image[0x1f1] = setup_sectors;
        image[0x202..0x206].copy_from_slice(b"HdrS");
        image[0x206..0x208].copy_from_slice(&0x20fu16.to_le_bytes());
        let version_at = 0x400;
        let text = format!("{release} (builder@example) #1 SMP\0");
        image[version_at..version_at + text.len()].copy_from_slice(text.as_bytes());
        image[0x20e..0x210]
            .copy_from_slice(&u16::try_from(version_at - 0x200).unwrap().to_le_bytes());
        let offset = 0x40u32;
        image[0x248..0x24c].copy_from_slice(&offset.to_le_bytes());
        image[0x24c..0x250]
            .copy_from_slice(&u32::try_from(payload.len() + 4).unwrap().to_le_bytes());
        image.extend(vec![0xcc; offset as usize]);
        image.extend(payload);
        image.extend(12345u32.to_le_bytes());
        image
    }

    fn fake_vmlinux() -> Vec<u8> {
        let mut elf = b"\x7fELF\x02\x01".to_vec();
        elf.extend((0..4000u32).flat_map(|i| (i % 251).to_le_bytes()));
        elf
    }

    #[test]
    fn the_release_comes_from_the_header() {
        let image = bzimage(b"", "6.1.0-57-amd64");
        assert_eq!(bzimage_release(&image).as_deref(), Some("6.1.0-57-amd64"));
        assert_eq!(bzimage_release(b"not a kernel"), None);
    }

    #[test]
    fn an_xz_payload_is_extracted_with_its_size_trailer() {
        let vmlinux = fake_vmlinux();
        let mut xz = liblzma::write::XzEncoder::new(Vec::new(), 6);
        xz.write_all(&vmlinux).unwrap();
        let image = bzimage(&xz.finish().unwrap(), "6.1.0-1-amd64");
        assert!(bzimage_payload(&image).unwrap().starts_with(XZ_MAGIC));
        assert_eq!(extract_vmlinux(&image).unwrap(), vmlinux);
    }

    #[test]
    fn a_gzip_payload_is_found_by_scanning_without_a_header() {
        let vmlinux = fake_vmlinux();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&vmlinux).unwrap();
        let mut image = vec![0u8; 1000];
        image.extend(gz.finish().unwrap());
        assert_eq!(bzimage_payload(&image), None);
        assert_eq!(extract_vmlinux(&image).unwrap(), vmlinux);
    }

    #[test]
    fn an_unknown_compression_is_an_error() {
        let image = bzimage(b"\x28\xb5\x2f\xfdzstd data", "6.1.0-1-amd64");
        let error = extract_vmlinux(&image).unwrap_err();
        assert!(
            format!("{error:#}").contains("unsupported compression"),
            "{error:#}"
        );
    }
}
