//! `offload checksum` end to end, against the `crc` crate. A test binary
//! of its own: the 4 GiB sparse file keeps a core busy for seconds, which
//! would starve the timing-sensitive tests of `tests/cli.rs` if they ran
//! beside it (cargo runs test binaries one after another).

use std::process::Command;

mod common;

use common::offload;

/// The reference CRC of a file: the `crc` crate's 16-way table over its
/// bytes, read in 1 MiB pieces.
fn reference(alg: &'static crc::Algorithm<u64>, path: &std::path::Path) -> u64 {
    use std::io::Read;
    let crc = crc::Crc::<u64, crc::Table<16>>::new(alg);
    let mut d = crc.digest();
    let mut f = std::fs::File::open(path).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        d.update(&buf[..n]);
    }
    d.finalize()
}

fn reference32(alg: &'static crc::Algorithm<u32>, data: &[u8]) -> u64 {
    u64::from(crc::Crc::<u32>::new(alg).checksum(data))
}

#[test]
fn checksum_matches_the_crc_crate_at_empty_one_byte_and_odd_sizes() {
    let dir = std::env::temp_dir().join(format!("offload-checksum-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut files = Vec::new();
    for len in [0usize, 1, 15, 4095, 4097, (1 << 20) + 3] {
        let data: Vec<u8> = (0..len).map(|i| (i * 131 + 7) as u8).collect();
        let path = dir.join(format!("f{len}"));
        std::fs::write(&path, &data).unwrap();
        files.push((path, data));
    }
    let names: Vec<&str> = files.iter().map(|(p, _)| p.to_str().unwrap()).collect();
    type Reference = Box<dyn Fn(&[u8]) -> u64>;
    let algs: [(&str, usize, Reference); 5] = [
        (
            "crc32c",
            8,
            Box::new(|d| reference32(&crc::CRC_32_ISCSI, d)),
        ),
        (
            "crc32",
            8,
            Box::new(|d| reference32(&crc::CRC_32_ISO_HDLC, d)),
        ),
        (
            "crc64-nvme",
            16,
            Box::new(|d| crc::Crc::<u64>::new(&crc::CRC_64_NVME).checksum(d)),
        ),
        (
            "CRC-64/XZ",
            16,
            Box::new(|d| crc::Crc::<u64>::new(&crc::CRC_64_XZ).checksum(d)),
        ),
        (
            "crc64-go-iso",
            16,
            Box::new(|d| crc::Crc::<u64>::new(&crc::CRC_64_GO_ISO).checksum(d)),
        ),
    ];
    for (alg, width, want) in &algs {
        // Small chunks and depth: many requests in flight per file.
        let mut args = vec!["checksum", "--alg", alg, "--chunk", "4k", "--depth", "16"];
        args.extend(&names);
        let (ok, out, err) = offload(&args);
        assert!(ok, "{alg}: {err}");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), files.len(), "{out}");
        for (line, (path, data)) in lines.iter().zip(&files) {
            let expected = format!("{:0width$x}  {}", want(data), path.display());
            assert_eq!(*line, expected, "{alg}, {} bytes", data.len());
        }
    }
    // Standard input, and a list checked back (one entry altered).
    let data = &files[3].1;
    let mut child = Command::new(env!("CARGO_BIN_EXE_offload"))
        .args(["checksum", "-", "--base64", "--alg", "crc64-nvme"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        child.stdin.take().unwrap().write_all(data).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let crc = crc::Crc::<u64>::new(&crc::CRC_64_NVME).checksum(data);
    let b64 = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(crc.to_be_bytes())
    };
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{b64}  -\n"));

    let (ok, out, _) = offload(&[&["checksum", "--alg", "crc32c"][..], &names].concat());
    assert!(ok);
    let list = dir.join("list");
    std::fs::write(&list, &out).unwrap();
    let (ok, out, err) = offload(&[
        "checksum",
        "--alg",
        "crc32c",
        "--check",
        list.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert_eq!(out.matches(": OK").count(), files.len(), "{out}");
    let text = std::fs::read_to_string(&list).unwrap();
    let first = text.lines().next().unwrap();
    let bad = format!(
        "{}{}",
        if first.starts_with('0') { "1" } else { "0" },
        &first[1..]
    );
    std::fs::write(&list, text.replacen(first, &bad, 1) + "garbage line\n").unwrap();
    let (ok, out, err) = offload(&[
        "checksum",
        "--alg",
        "crc32c",
        "--check",
        list.to_str().unwrap(),
    ]);
    assert!(!ok, "{out}");
    assert!(out.contains(": FAILED"), "{out}");
    assert_eq!(out.matches(": OK").count(), files.len() - 1, "{out}");
    assert!(err.contains("1 computed checksums did NOT match"), "{err}");
    assert!(err.contains("1 lines are improperly formatted"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn checksum_of_a_sparse_file_past_4_gib() {
    // 4 GiB + 5 bytes, all holes but a few bytes either side of 2^32:
    // lengths and offsets that do not fit 32 bits.
    let path = std::env::temp_dir().join(format!("offload-sparse-{}", std::process::id()));
    {
        use std::io::{Seek, SeekFrom, Write};
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(b"head").unwrap();
        f.seek(SeekFrom::Start((1 << 32) - 2)).unwrap();
        f.write_all(b"mid!").unwrap();
        f.set_len((1 << 32) + 5).unwrap();
    }
    let (ok, out, err) = offload(&["checksum", "--alg", "crc64-nvme", path.to_str().unwrap()]);
    let want = reference(&crc::CRC_64_NVME, &path);
    std::fs::remove_file(&path).unwrap();
    assert!(ok, "{err}");
    assert_eq!(out, format!("{want:016x}  {}\n", path.display()));
}

#[test]
fn checksum_refuses_what_it_cannot_do_with_a_reason() {
    let (ok, _, err) = offload(&["checksum", "--alg", "crc16", "/dev/null"]);
    assert!(!ok && err.contains("unknown CRC"), "{err}");
    let (ok, _, err) = offload(&["checksum", "--chunk", "0", "/dev/null"]);
    assert!(!ok && err.contains("0 bytes"), "{err}");
    let (ok, out, err) = offload(&["checksum", "/no/such/file", "/dev/null"]);
    assert!(!ok, "{out}");
    assert!(err.contains("/no/such/file"), "{err}");
    assert!(out.contains("00000000  /dev/null"), "{out}");
}
