//! The AEAD record server: a TCP echo in which every record is sealed with
//! AES-128-GCM under a per-connection key (nonce from a counter, AAD = the
//! record header), and the client and load generator that drive it.

pub mod client;
pub mod load;
pub mod protocol;
pub mod server;
