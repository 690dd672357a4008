//! The encrypted block store: a file-backed volume of AES-256-XTS blocks
//! with a CRC-32C of each ciphertext, served over a small binary protocol,
//! and the client and load generator that drive it.

mod checksum;
pub mod client;
pub mod load;
pub mod protocol;
pub mod server;
pub mod volume;
