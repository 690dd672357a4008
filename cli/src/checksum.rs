//! `offload checksum`: CRCs of files, as `sha256sum` prints digests, on
//! whatever engine the selector picks, several requests in flight.
//!
//! Each file is read in chunks; every chunk is a one-shot request
//! ([`CrcSession::checksum`]) on one shared session, up to `--depth` in
//! flight while the next chunks are read, and the chunks' CRCs are folded
//! in file order with CRC combination. `--base64` prints the big-endian
//! bytes in base64, the form of S3's `x-amz-checksum-crc32c` /
//! `x-amz-checksum-crc64nvme` headers (full-object checksums).

use std::collections::VecDeque;
use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine as _;
use clap::Args;
use crypto_offload::{CrcAlg, CrcSession, Offload, crc_combine};
use indicatif::{ProgressBar, ProgressStyle};
use tokio::task::JoinHandle;

use crate::Backends;
use crate::setup::{self, Error};

#[derive(Args, Clone, Debug)]
pub struct ChecksumArgs {
    #[command(flatten)]
    pub backends: Backends,
    /// Files to checksum (`-`: standard input; none: standard input).
    #[arg(value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// The CRC: crc32c, crc32, crc64-nvme, crc64-xz, crc64-go-iso (or a
    /// catalogue name such as CRC-32/ISCSI).
    #[arg(long, default_value = "crc32c", value_parser = parse_alg)]
    pub alg: CrcAlg,
    /// Print the CRC's big-endian bytes in base64 (S3's `x-amz-checksum-*`
    /// form) instead of hex.
    #[arg(long)]
    pub base64: bool,
    /// Read CRCs and file names from this list (lines as this command
    /// prints them, hex or base64) and check them, as `sha256sum -c` does.
    #[arg(long, value_name = "LIST")]
    pub check: Option<PathBuf>,
    /// Requests in flight per file.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub depth: u16,
    /// Bytes a request (with a k or m suffix: KiB, MiB).
    #[arg(long, default_value = "1m", value_parser = parse_chunk)]
    pub chunk: usize,
    /// No progress bar, even on a terminal.
    #[arg(long, short)]
    pub quiet: bool,
}

fn parse_alg(s: &str) -> Result<CrcAlg, String> {
    CrcAlg::from_name(s).ok_or_else(|| {
        let names: Vec<&str> = CrcAlg::ALL.iter().map(|a| a.short_name()).collect();
        format!("unknown CRC {s:?}; one of: {}", names.join(", "))
    })
}

fn parse_chunk(s: &str) -> Result<usize, String> {
    match crate::bench::parse_size_arg(s)? {
        0 => Err("a chunk of 0 bytes".to_owned()),
        n if n > 1 << 30 => Err("chunks of at most 1 GiB".to_owned()),
        n => Ok(n),
    }
}

/// The CRC as printed: hex of its width, or base64 of its big-endian bytes.
pub fn format_crc(alg: CrcAlg, crc: u64, base64: bool) -> String {
    let bytes = crc.to_be_bytes();
    let width = (alg.width() / 8) as usize;
    let be = &bytes[8 - width..];
    if base64 {
        base64::engine::general_purpose::STANDARD.encode(be)
    } else {
        be.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// A CRC as written in a check list: hex of the algorithm's width, or
/// base64 of its big-endian bytes.
pub fn parse_crc(alg: CrcAlg, text: &str) -> Option<u64> {
    let width = (alg.width() / 8) as usize;
    if text.len() == width * 2 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return u64::from_str_radix(text, 16).ok();
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .ok()?;
    (bytes.len() == width).then(|| bytes.iter().fold(0u64, |v, &b| (v << 8) | u64::from(b)))
}

pub async fn run(args: ChecksumArgs) -> Result<(), Error> {
    let sims = setup::sims(&args.backends)?;
    let offload = setup::offload(&args.backends, &sims).await?;
    let session = Arc::new(offload.crc(args.alg).await?);
    let progress = !args.quiet && std::io::stderr().is_terminal();
    if let Some(list) = &args.check {
        return check(&args, &offload, &session, list, progress).await;
    }
    let files = if args.files.is_empty() {
        vec![PathBuf::from("-")]
    } else {
        args.files.clone()
    };
    let mut failed = 0;
    for file in &files {
        match crc_of(&args, &session, file, progress).await {
            Ok(crc) => println!(
                "{}  {}",
                format_crc(args.alg, crc, args.base64),
                file.display()
            ),
            Err(e) => {
                eprintln!("offload: {}: {e}", file.display());
                failed += 1;
            }
        }
    }
    match failed {
        0 => Ok(()),
        n => Err(format!("{n} of {} files could not be read", files.len()).into()),
    }
}

/// `--check LIST`: each line's CRC against the file's.
async fn check(
    args: &ChecksumArgs,
    _offload: &Offload,
    session: &Arc<CrcSession>,
    list: &Path,
    progress: bool,
) -> Result<(), Error> {
    let text = std::fs::read_to_string(list).map_err(|e| format!("{}: {e}", list.display()))?;
    let (mut mismatched, mut unreadable, mut malformed) = (0, 0, 0);
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let parsed = line
            .split_once("  ")
            .and_then(|(crc, name)| Some((parse_crc(args.alg, crc.trim())?, name)));
        let Some((want, name)) = parsed else {
            malformed += 1;
            continue;
        };
        match crc_of(args, session, Path::new(name), progress).await {
            Ok(got) if got == want => println!("{name}: OK"),
            Ok(_) => {
                println!("{name}: FAILED");
                mismatched += 1;
            }
            Err(e) => {
                println!("{name}: FAILED open or read");
                eprintln!("offload: {name}: {e}");
                unreadable += 1;
            }
        }
    }
    let mut problems = Vec::new();
    if malformed > 0 {
        problems.push(format!("{malformed} lines are improperly formatted"));
    }
    if unreadable > 0 {
        problems.push(format!("{unreadable} listed files could not be read"));
    }
    if mismatched > 0 {
        problems.push(format!("{mismatched} computed checksums did NOT match"));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; ").into())
    }
}

/// The CRC of `file` (`-`: standard input).
async fn crc_of(
    args: &ChecksumArgs,
    session: &Arc<CrcSession>,
    file: &Path,
    progress: bool,
) -> Result<u64, Error> {
    if file == Path::new("-") {
        let bar = bar(progress, None, "stdin");
        crc_of_reader(args, session, Box::new(std::io::stdin()), &bar).await
    } else {
        let f = std::fs::File::open(file)?;
        let len = f.metadata().ok().map(|m| m.len());
        let bar = bar(progress, len, &file.display().to_string());
        crc_of_reader(args, session, Box::new(f), &bar).await
    }
}

fn bar(shown: bool, len: Option<u64>, name: &str) -> ProgressBar {
    if !shown {
        return ProgressBar::hidden();
    }
    let (bar, template) = match len {
        Some(len) => (
            ProgressBar::new(len),
            "{msg} {bar:30} {bytes}/{total_bytes} {binary_bytes_per_sec} {eta}",
        ),
        None => (
            ProgressBar::new_spinner(),
            "{msg} {spinner} {bytes} {binary_bytes_per_sec}",
        ),
    };
    bar.set_style(
        ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message(name.to_owned());
    bar
}

/// A file or standard input, read on the blocking pool.
type Source = Box<dyn Read + Send>;

/// Reads `source` to its end in chunks (each read on the blocking pool,
/// straight into the request's buffer: `tokio::fs` would copy every byte
/// once more), `--depth` one-shot requests in flight, and folds their CRCs
/// in order.
async fn crc_of_reader(
    args: &ChecksumArgs,
    session: &Arc<CrcSession>,
    mut source: Source,
    bar: &ProgressBar,
) -> Result<u64, Error> {
    type Job = JoinHandle<Result<(Vec<u8>, u64), crypto_offload::Error>>;
    let mut in_flight: VecDeque<Job> = VecDeque::new();
    let mut spare: Vec<Vec<u8>> = Vec::new();
    // The CRC of no data is 0 for every algorithm here.
    let mut crc = 0u64;
    let fold = |crc: &mut u64, piece: u64, len: usize| {
        *crc = crc_combine(args.alg, *crc, piece, len as u64);
        bar.inc(len as u64);
    };
    let chunk = args.chunk;
    loop {
        let mut buf = spare.pop().unwrap_or_else(|| vec![0; chunk]);
        buf.resize(chunk, 0);
        let (back, buf, n) = tokio::task::spawn_blocking(move || {
            let n = read_full(&mut source, &mut buf);
            (source, buf, n)
        })
        .await?;
        source = back;
        let n = n?;
        if n == 0 {
            break;
        }
        let mut buf = buf;
        buf.truncate(n);
        let s = session.clone();
        in_flight.push_back(tokio::spawn(async move {
            s.checksum(buf).await.map_err(crypto_offload::Error::from)
        }));
        if in_flight.len() >= usize::from(args.depth)
            && let Some(job) = in_flight.pop_front()
        {
            let (buf, piece) = job.await??;
            fold(&mut crc, piece, buf.len());
            spare.push(buf);
        }
        if n < chunk {
            break;
        }
    }
    while let Some(job) = in_flight.pop_front() {
        let (buf, piece) = job.await??;
        fold(&mut crc, piece, buf.len());
    }
    bar.finish_and_clear();
    Ok(crc)
}

/// Reads until `buf` is full or the source ends; the bytes read.
fn read_full(source: &mut Source, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match source.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crcs_print_and_parse_as_hex_and_s3_base64() {
        // S3's documented example values are for "Hello, World!"-style
        // bodies; here the catalogue check inputs: CRC-32C("123456789") =
        // e3069283, big-endian base64 "4waSgw==".
        assert_eq!(format_crc(CrcAlg::CRC32C, 0xe306_9283, false), "e3069283");
        assert_eq!(format_crc(CrcAlg::CRC32C, 0xe306_9283, true), "4waSgw==");
        assert_eq!(
            format_crc(CrcAlg::Crc64Nvme, 0xae8b_1486_0a79_9888, false),
            "ae8b14860a799888"
        );
        assert_eq!(
            format_crc(CrcAlg::Crc64Nvme, 0xae8b_1486_0a79_9888, true),
            "rosUhgp5mIg="
        );
        for alg in CrcAlg::ALL {
            for crc in [0, 1, 0xe306_9283, u64::MAX >> (64 - alg.width())] {
                for b64 in [false, true] {
                    let text = format_crc(alg, crc, b64);
                    assert_eq!(parse_crc(alg, &text), Some(crc), "{alg} {text}");
                }
            }
        }
        assert_eq!(parse_crc(CrcAlg::CRC32C, "e306928"), None);
        assert_eq!(parse_crc(CrcAlg::CRC32C, "rosUhgp5mIg="), None);
        assert_eq!(parse_crc(CrcAlg::CRC32C, "not base64!"), None);
    }
}
