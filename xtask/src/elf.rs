//! The few facts the harness reads from ELF64 little-endian files: the
//! dynamic loader a program asks for (`PT_INTERP`), and whether a vmlinux has
//! the PVH entry note QEMU needs to boot it directly.

use anyhow::{Context, Result, bail};

/// `PT_INTERP`: the program header naming an ELF's dynamic loader.
const PT_INTERP: u32 = 3;
/// `PT_NOTE`: a program header holding notes.
const PT_NOTE: u32 = 4;
/// `XEN_ELFNOTE_PHYS32_ENTRY`: the PVH entry point, owner "Xen".
const XEN_ELFNOTE_PHYS32_ENTRY: u32 = 18;

/// True if `bytes` starts with the ELF magic.
pub fn is_elf(bytes: &[u8]) -> bool {
    bytes.starts_with(b"\x7fELF")
}

/// One program header: its type and the file bytes it covers.
struct Segment<'a> {
    kind: u32,
    data: &'a [u8],
}

fn segments(elf: &[u8]) -> Result<Vec<Segment<'_>>> {
    if !is_elf(elf) {
        bail!("no ELF magic");
    }
    if elf.get(4) != Some(&2) || elf.get(5) != Some(&1) {
        bail!("not a 64-bit little-endian ELF");
    }
    let phoff = read_u64(elf, 0x20)?;
    let phentsize = u64::from(read_u16(elf, 0x36)?);
    let phnum = u64::from(read_u16(elf, 0x38)?);
    (0..phnum)
        .map(|i| {
            let header = i
                .checked_mul(phentsize)
                .and_then(|at| at.checked_add(phoff))
                .and_then(|at| usize::try_from(at).ok())
                .context("program headers past the end of the address space")?;
            let kind = read_u32(elf, header)?;
            let offset = usize::try_from(read_u64(elf, header.saturating_add(8))?)?;
            let size = usize::try_from(read_u64(elf, header.saturating_add(32))?)?;
            let data = elf
                .get(offset..offset.saturating_add(size))
                .context("a program header points past the end of the file")?;
            Ok(Segment { kind, data })
        })
        .collect()
}

/// The dynamic loader the ELF asks for (its `PT_INTERP`), or `None` for a
/// statically linked one.
pub fn interpreter(elf: &[u8]) -> Result<Option<String>> {
    Ok(segments(elf)?
        .into_iter()
        .find(|s| s.kind == PT_INTERP)
        .map(|s| {
            let name = s.data.split(|&b| b == 0).next().unwrap_or_default();
            String::from_utf8_lossy(name).into_owned()
        }))
}

/// True if the ELF carries a PVH entry note (`CONFIG_PVH=y`): without one,
/// QEMU's `-kernel` cannot boot an uncompressed vmlinux.
pub fn has_pvh_entry(elf: &[u8]) -> Result<bool> {
    for segment in segments(elf)?.into_iter().filter(|s| s.kind == PT_NOTE) {
        let mut notes = segment.data;
        while notes.len() >= 12 {
            let name_size = usize::try_from(read_u32(notes, 0)?)?;
            let desc_size = usize::try_from(read_u32(notes, 4)?)?;
            let kind = read_u32(notes, 8)?;
            let name_end = name_size.saturating_add(12);
            let next = name_size
                .next_multiple_of(4)
                .saturating_add(desc_size.next_multiple_of(4))
                .saturating_add(12);
            if notes.get(12..name_end) == Some(b"Xen\0".as_slice())
                && kind == XEN_ELFNOTE_PHYS32_ENTRY
            {
                return Ok(true);
            }
            notes = notes.get(next..).unwrap_or_default();
        }
    }
    Ok(false)
}

fn read_u16(bytes: &[u8], at: usize) -> Result<u16> {
    let raw = bytes
        .get(at..at.saturating_add(2))
        .context("truncated ELF")?;
    Ok(u16::from_le_bytes(raw.try_into()?))
}

fn read_u32(bytes: &[u8], at: usize) -> Result<u32> {
    let raw = bytes
        .get(at..at.saturating_add(4))
        .context("truncated ELF")?;
    Ok(u32::from_le_bytes(raw.try_into()?))
}

fn read_u64(bytes: &[u8], at: usize) -> Result<u64> {
    let raw = bytes
        .get(at..at.saturating_add(8))
        .context("truncated ELF")?;
    Ok(u64::from_le_bytes(raw.try_into()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ELF64 file with the given program headers (type, payload).
    pub(crate) fn elf_with(segments: &[(u32, &[u8])]) -> Vec<u8> {
        let mut elf = vec![0u8; 64];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[4] = 2;
        elf[5] = 1;
        elf[0x20..0x28].copy_from_slice(&64u64.to_le_bytes());
        elf[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        elf[0x38..0x3a].copy_from_slice(&u16::try_from(segments.len()).unwrap().to_le_bytes());
        let data_start = 64 + segments.len() * 56;
        let mut data = Vec::new();
        for (kind, payload) in segments {
            let mut header = vec![0u8; 56];
            header[..4].copy_from_slice(&kind.to_le_bytes());
            header[8..16].copy_from_slice(&((data_start + data.len()) as u64).to_le_bytes());
            header[32..40].copy_from_slice(&(payload.len() as u64).to_le_bytes());
            elf.extend(header);
            data.extend_from_slice(payload);
        }
        elf.extend(data);
        elf
    }

    fn note(name: &[u8], kind: u32, desc: &[u8]) -> Vec<u8> {
        let mut n = Vec::new();
        n.extend(u32::try_from(name.len()).unwrap().to_le_bytes());
        n.extend(u32::try_from(desc.len()).unwrap().to_le_bytes());
        n.extend(kind.to_le_bytes());
        n.extend(name);
        n.resize(12 + name.len().next_multiple_of(4), 0);
        n.extend(desc);
        n.resize(n.len().next_multiple_of(4), 0);
        n
    }

    #[test]
    fn a_static_elf_has_no_interpreter() {
        let elf = elf_with(&[(1, b"code")]);
        assert_eq!(interpreter(&elf).unwrap(), None);
    }

    #[test]
    fn a_dynamic_elf_names_its_loader() {
        let elf = elf_with(&[(6, b""), (PT_INTERP, b"/lib64/ld-linux-x86-64.so.2\0")]);
        assert_eq!(
            interpreter(&elf).unwrap().as_deref(),
            Some("/lib64/ld-linux-x86-64.so.2")
        );
    }

    #[test]
    fn non_elf_and_truncated_files_are_errors() {
        assert!(interpreter(b"#!/bin/sh\n").is_err());
        let mut elf = elf_with(&[(PT_INTERP, b"/lib64/ld.so\0")]);
        elf.truncate(80);
        assert!(interpreter(&elf).is_err());
    }

    #[test]
    fn hostile_offsets_are_errors_not_panics() {
        let mut elf = elf_with(&[(PT_INTERP, b"/lib64/ld.so\0")]);
        elf[0x20..0x28].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(interpreter(&elf).is_err());
        let mut elf = elf_with(&[(PT_INTERP, b"/lib64/ld.so\0")]);
        elf[64 + 8..64 + 16].copy_from_slice(&(u64::MAX - 4).to_le_bytes());
        assert!(interpreter(&elf).is_err());
    }

    #[test]
    fn the_pvh_note_is_found_among_other_notes() {
        let mut notes = note(b"GNU\0", 3, &[1, 2, 3, 4, 5]);
        notes.extend(note(
            b"Xen\0",
            XEN_ELFNOTE_PHYS32_ENTRY,
            &0x100_0000u32.to_le_bytes(),
        ));
        assert!(has_pvh_entry(&elf_with(&[(1, b"text"), (PT_NOTE, &notes)])).unwrap());
    }

    #[test]
    fn other_xen_notes_are_not_a_pvh_entry() {
        let notes = note(b"Xen\0", 1, b"linux\0");
        assert!(!has_pvh_entry(&elf_with(&[(PT_NOTE, &notes)])).unwrap());
        assert!(!has_pvh_entry(&elf_with(&[(1, b"text")])).unwrap());
    }
}
