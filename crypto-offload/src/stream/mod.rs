//! `tokio::io` adapters: checksums and ciphers over `AsyncRead` and
//! `AsyncWrite`, for servers that move data as streams.
//!
//! * [`CrcReader`] / [`CrcWriter`] checksum the bytes that pass through and
//!   can verify the result at the end (a mismatch is an `io::Error` of kind
//!   `InvalidData` holding [`Error::ChecksumMismatch`](crate::Error)).
//! * [`CipherReader`] / [`CipherWriter`] encrypt or decrypt a stream with a
//!   [`CipherSession`](crate::CipherSession): CTR of any length, XTS in
//!   whole data units (the tweak of each unit its number, counted from the
//!   unit the stream starts at), CBC in whole blocks. They cut the stream
//!   into requests of [`StreamOptions::chunk`] bytes and keep up to
//!   [`StreamOptions::depth`] of them in flight, so an engine is used at
//!   depth while the caller reads or writes; output comes in order.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> std::io::Result<()> {
//! use std::sync::Arc;
//! use crypto_offload::stream::{CipherReader, CipherWriter, CrcReader, StreamOptions};
//! use crypto_offload::{CipherAlg, CrcAlg, Direction, Offload};
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//!
//! let offload = Offload::builder().build()?;
//! let key: Vec<u8> = (0..64).collect();
//! let disk = Arc::new(offload.cipher(CipherAlg::Aes256Xts, &key).await?.with_data_unit(4096)?);
//! let file = vec![5u8; 10 * 4096];
//!
//! // Encrypt while writing, from sector 100 on, eight 64 KiB requests in flight.
//! let options = StreamOptions::default().depth(8).chunk(64 << 10);
//! let mut sealed = CipherWriter::new(Vec::new(), disk.clone(), Direction::Encrypt, 100u128.to_le_bytes(), options)?;
//! sealed.write_all(&file).await?;
//! sealed.shutdown().await?;
//! let sealed = sealed.into_inner();
//!
//! // Decrypt while reading, checksumming the plaintext as it passes.
//! let plain = CipherReader::new(&sealed[..], disk, Direction::Decrypt, 100u128.to_le_bytes(), options)?;
//! let crc = offload.crc(CrcAlg::CRC32C).await?;
//! let mut reader = CrcReader::new(plain, crc);
//! let mut back = Vec::new();
//! reader.read_to_end(&mut back).await?;
//! assert_eq!(back, file);
//! let mut whole = offload.crc(CrcAlg::CRC32C).await?;
//! whole.update_from_slice(&file);
//! assert_eq!(reader.checksum(), whole.finalize());
//! # Ok(()) }
//! ```

mod cipher;
mod crc;
mod queue;

pub use cipher::{CipherReader, CipherWriter, StreamOptions};
pub use crc::{CrcReader, CrcWriter};
