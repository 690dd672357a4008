//! What this machine has, and where requests would run.
//!
//! ```text
//! cargo run --release -p crypto-offload --example discover
//! ```
//!
//! Discovers every engine (AF_ALG with the default features, VFIO with
//! `--features vfio`), says what was looked for and why anything is
//! missing, runs one request of each kind, and explains where requests of a
//! few sizes would go and why.

use crypto_offload::{AeadAlg, CipherAlg, CrcAlg, Direction, Offload};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let offload = Offload::discover().await?;

    println!("looked for:");
    for search in offload.discovery() {
        println!("  {search}");
    }
    println!("backends:");
    for b in offload.backends() {
        let status = b.unavailable.as_deref().unwrap_or("available");
        println!(
            "  {:<20} {:?}, {} algorithms, {status}",
            b.name,
            b.kind,
            b.algorithms.len()
        );
    }

    // A 4 KiB disk sector (XTS, tweak = sector number), a GCM record, and a
    // CRC-32C of the sector, each handed its buffer and handing it back.
    let key: Vec<u8> = (0..64).collect();
    let disk = offload.cipher(CipherAlg::Aes256Xts, &key).await?;
    let sector = disk.encrypt(7u128.to_le_bytes(), vec![0x5a; 4096]).await?;
    let gcm = offload.aead(AeadAlg::Aes128Gcm, &key[..16]).await?;
    let record = gcm.seal([1; 12], b"header", b"payload".to_vec()).await?;
    let payload = gcm.open([1; 12], b"header", record).await?;
    assert_eq!(payload, b"payload");
    let crc = offload.crc(CrcAlg::CRC32C).await?;
    let (_sector, crc32c) = crc.checksum(sector).await?;
    println!("sector 7 encrypted, CRC-32C {crc32c:08x}; a GCM record sealed and opened");

    for len in [512, 4096, 65536, 1 << 20] {
        print!(
            "{}",
            offload.explain(CipherAlg::Aes256Xts, Direction::Encrypt, len)
        );
    }
    Ok(())
}
