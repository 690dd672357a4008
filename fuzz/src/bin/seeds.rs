//! Writes seed corpora from the known-answer vectors:
//! `cargo run --bin seeds [-- VECTORS_DIR [CORPUS_DIR]]` (defaults
//! `../crypto-offload/vectors` and `corpus`) writes
//! `CORPUS_DIR/<target>/<name>` for every target, one file per seed.
//!
//! Every seed is decoded again as the target will decode it and compared
//! with the input it was meant to be before it is written.

use std::path::PathBuf;

use crypto_offload_fuzz::{aead, cipher, crc, lifecycle, seed, vectors};

fn write<T>(
    dir: &std::path::Path,
    target: &str,
    seeds: Vec<(String, T)>,
    encode: fn(&T) -> Vec<u8>,
) -> std::io::Result<usize>
where
    T: for<'a> arbitrary::Arbitrary<'a> + PartialEq + std::fmt::Debug,
{
    let dir = dir.join(target);
    std::fs::create_dir_all(&dir)?;
    for (name, input) in &seeds {
        let bytes = encode(input);
        let back: Option<T> = seed::decode(&bytes);
        assert_eq!(
            back.as_ref(),
            Some(input),
            "{target}/{name}: the seed does not decode to its input"
        );
        std::fs::write(dir.join(format!("seed-{name}")), bytes)?;
    }
    Ok(seeds.len())
}

fn main() -> std::io::Result<()> {
    let mut args = std::env::args_os().skip(1);
    let vectors_dir = args.next().map_or_else(vectors::default_dir, PathBuf::from);
    let corpus = args
        .next()
        .map_or_else(|| PathBuf::from("corpus"), PathBuf::from);
    let records = vectors::load(&vectors_dir)?;
    let n = [
        (
            "cipher",
            write(&corpus, "cipher", cipher::seeds(&records), cipher::encode)?,
        ),
        (
            "aead",
            write(&corpus, "aead", aead::seeds(&records), aead::encode)?,
        ),
        (
            "crc",
            write(&corpus, "crc", crc::seeds(&records), crc::encode)?,
        ),
        (
            "lifecycle",
            write(
                &corpus,
                "lifecycle",
                lifecycle::seeds(&records),
                lifecycle::encode,
            )?,
        ),
    ];
    for (target, count) in n {
        println!("{count:4} seeds in {}", corpus.join(target).display());
    }
    #[cfg(feature = "aws-lc")]
    {
        use crypto_offload_fuzz::xts;
        let count = write(&corpus, "xts", xts::seeds(&records), xts::encode)?;
        println!("{count:4} seeds in {}", corpus.join("xts").display());
    }
    // The virtqueue target's inputs are raw bytes: the driver's harness
    // names its own.
    let dir = corpus.join("virtqueue");
    std::fs::create_dir_all(&dir)?;
    let seeds = crypto_offload_vfio::harness::seeds();
    for (name, bytes) in &seeds {
        std::fs::write(dir.join(format!("seed-{name}")), bytes)?;
    }
    println!("{:4} seeds in {}", seeds.len(), dir.display());
    Ok(())
}
