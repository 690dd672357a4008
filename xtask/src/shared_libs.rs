//! The shared libraries a dynamically linked binary loads, from `ldd`.
//!
//! The test binaries link against the host's glibc, so the guest gets each
//! library (and the ELF interpreter, `/lib64/ld-linux-x86-64.so.2`) at the
//! absolute path `ldd` resolves it to. Debian's loader searches the multiarch
//! folders on its own, so no `ld.so.cache` is needed in the guest.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// Parses `ldd` output into the absolute paths of the libraries and loader.
///
/// The vDSO (no path) is skipped; a library `ldd` could not find is an error.
pub fn parse_ldd(output: &str) -> Result<Vec<PathBuf>> {
    let mut libraries = Vec::new();
    for line in output.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if line.contains("statically linked") || line.contains("not a dynamic executable") {
            continue;
        }
        let target = match line.split_once("=>") {
            Some((name, target)) => {
                let target = target.trim();
                if target.starts_with("not found") {
                    bail!("ldd: {} not found", name.trim());
                }
                target
            }
            None => line,
        };
        // What is left is `PATH (0xADDRESS)`, or `(0xADDRESS)` for the vDSO.
        let path = target.split(" (0x").next().unwrap_or_default().trim();
        if path.starts_with('/') {
            libraries.push(PathBuf::from(path));
        }
    }
    Ok(libraries)
}

/// Runs `ldd` on `binary` and returns the libraries it loads.
pub fn libraries_of(ldd: &Path, binary: &Path) -> Result<Vec<PathBuf>> {
    let output = Command::new(ldd)
        .arg(binary)
        .output()
        .with_context(|| format!("running {}", ldd.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    // ldd exits 1 for a static binary ("not a dynamic executable").
    if !output.status.success() && !stdout.contains("not a dynamic executable") {
        let stderr = String::from_utf8_lossy(&output.stderr);
        if !stderr.contains("not a dynamic executable") {
            bail!(
                "ldd {} failed: {}{}",
                binary.display(),
                stdout.trim(),
                stderr.trim()
            );
        }
    }
    parse_ldd(&stdout).with_context(|| format!("the libraries of {}", binary.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libraries_and_the_loader_are_listed_and_the_vdso_skipped() {
        let output = "\tlinux-vdso.so.1 (0x00007ffd5a3e2000)
\tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f68ea0dd000)
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f68e9efb000)
\t/lib64/ld-linux-x86-64.so.2 (0x00007f68ea1e2000)
";
        assert_eq!(
            parse_ldd(output).unwrap(),
            [
                "/lib/x86_64-linux-gnu/libgcc_s.so.1",
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/lib64/ld-linux-x86-64.so.2"
            ]
            .map(PathBuf::from)
        );
    }

    #[test]
    fn a_missing_library_is_an_error() {
        let output =
            "\tlibfoo.so.1 => not found\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x1)\n";
        let error = parse_ldd(output).unwrap_err();
        assert!(error.to_string().contains("libfoo.so.1"), "{error}");
    }

    #[test]
    fn a_static_binary_has_no_libraries() {
        assert!(parse_ldd("\tstatically linked\n").unwrap().is_empty());
        assert!(
            parse_ldd("\tnot a dynamic executable\n")
                .unwrap()
                .is_empty()
        );
    }
}
