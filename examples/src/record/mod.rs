//! The AEAD record server: a TCP echo in which every record is sealed with
//! AES-128-GCM under keys from an X25519 + HKDF-SHA256 exchange (one key
//! per direction, fresh for every HELLO; nonce from a counter, AAD = the
//! record header), and the client and load generator that drive it.

pub mod client;
pub mod handshake;
pub mod load;
pub mod protocol;
pub mod server;
