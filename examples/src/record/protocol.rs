//! The record server's wire format.
//!
//! Every record is a 13-byte header and a body:
//!
//! ```text
//! header: type u8 | seq u64 | len u32          (big-endian)
//!   HELLO 0x01  client → server: the connection's 16-byte AES-128-GCM key
//!   STATS 0x02  client → server: empty; server → client: JSON (`RecordStats`)
//!   ALERT 0x15  server → client: code u8 | UTF-8 message (a refused record)
//!   DATA  0x17  both ways: ciphertext ‖ 16-byte tag
//! ```
//!
//! A DATA record is sealed under the connection's key with the nonce
//! `direction u32 | seq u64` (direction 0 towards the server, 1 from it,
//! so the two sides never share a nonce) and the header as AAD: a record
//! whose header, body or tag was changed does not open. Each side numbers
//! its records from a counter; a receiver takes only increasing sequence
//! numbers, so a replayed record is dropped too.
//!
//! HELLO carries the key in the clear. It stands in for the key exchange a
//! real protocol has (TLS's handshake, IKE): these examples are about the
//! record layer, and the load generator only talks over loopback.

use serde::{Deserialize, Serialize};

use crate::backends::Served;

/// Bytes of a record header.
pub const HEADER: usize = 13;
/// Bytes of the GCM tag.
pub const TAG: usize = 16;
/// Bytes of the connection key (AES-128).
pub const KEY: usize = 16;
/// The largest payload a server takes by default (TLS's 2^14).
pub const MAX_PAYLOAD: usize = 16 * 1024;

/// Record types.
pub mod kind {
    /// The connection key.
    pub const HELLO: u8 = 0x01;
    /// The server's counters.
    pub const STATS: u8 = 0x02;
    /// A refused record.
    pub const ALERT: u8 = 0x15;
    /// Sealed application data.
    pub const DATA: u8 = 0x17;
}

/// Alert codes.
pub mod alert {
    /// The record is longer than the server takes (its body was skipped).
    pub const OVERSIZE: u8 = 1;
    /// The body is too short for its type (DATA without a whole tag, a
    /// HELLO that is not one key).
    pub const TRUNCATED: u8 = 2;
    /// A record type the server does not know.
    pub const UNKNOWN_TYPE: u8 = 3;
    /// DATA before HELLO.
    pub const NO_KEY: u8 = 4;
    /// The server could not do it.
    pub const FAILED: u8 = 5;
}

/// Nonce direction: records sent to the server.
pub const TO_SERVER: u32 = 0;
/// Nonce direction: records sent by the server.
pub const FROM_SERVER: u32 = 1;

/// A record header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The record type.
    pub kind: u8,
    /// The sender's sequence number.
    pub seq: u64,
    /// Bytes of body that follow.
    pub len: u32,
}

impl Header {
    /// The 13 bytes (also the AAD of a DATA record).
    pub fn encode(&self) -> [u8; HEADER] {
        let mut b = [0u8; HEADER];
        b[0] = self.kind;
        b[1..9].copy_from_slice(&self.seq.to_be_bytes());
        b[9..13].copy_from_slice(&self.len.to_be_bytes());
        b
    }

    /// The header in 13 bytes (every value is a header; the reader judges it).
    pub fn decode(b: &[u8; HEADER]) -> Self {
        let mut seq = [0u8; 8];
        seq.copy_from_slice(&b[1..9]);
        let mut len = [0u8; 4];
        len.copy_from_slice(&b[9..13]);
        Header {
            kind: b[0],
            seq: u64::from_be_bytes(seq),
            len: u32::from_be_bytes(len),
        }
    }

    /// A DATA header for `payload` bytes of plaintext.
    pub fn data(seq: u64, payload: usize) -> Self {
        Header {
            kind: kind::DATA,
            seq,
            len: u32::try_from(payload + TAG).unwrap_or(u32::MAX),
        }
    }
}

/// The 96-bit nonce of record `seq` in `direction`.
pub fn nonce(direction: u32, seq: u64) -> [u8; 12] {
    let mut n = [0u8; 12];
    n[..4].copy_from_slice(&direction.to_be_bytes());
    n[4..].copy_from_slice(&seq.to_be_bytes());
    n
}

/// A whole record: header and body.
pub fn record(kind: u8, seq: u64, body: &[u8]) -> Vec<u8> {
    let header = Header {
        kind,
        seq,
        len: u32::try_from(body.len()).unwrap_or(u32::MAX),
    };
    let mut out = Vec::with_capacity(HEADER + body.len());
    out.extend_from_slice(&header.encode());
    out.extend_from_slice(body);
    out
}

/// An ALERT record about the record numbered `seq`.
pub fn alert_record(seq: u64, code: u8, message: &str) -> Vec<u8> {
    let mut body = vec![code];
    body.extend_from_slice(message.as_bytes());
    record(kind::ALERT, seq, &body)
}

/// The server's counters, the STATS reply's JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordStats {
    /// Connections accepted.
    pub connections: u64,
    /// DATA records opened and echoed.
    pub records: u64,
    /// Their plaintext bytes.
    pub bytes: u64,
    /// DATA records that did not open (tampered or wrongly keyed): dropped.
    pub tampered: u64,
    /// DATA records that opened but repeated an earlier sequence number:
    /// dropped.
    pub replayed: u64,
    /// Records refused with an ALERT.
    pub bad_frames: u64,
    /// CPU time of the server process so far (user + system), in ns.
    pub cpu_ns: u64,
    /// The `Offload`'s policy, or the backend every request is forced to.
    pub selection: String,
    /// What each backend has served (opens and seals alike).
    pub backends: Vec<Served>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_nonces_differ_by_direction() {
        let h = Header::data(0x0102_0304_0506_0708, 1500);
        assert_eq!(Header::decode(&h.encode()), h);
        assert_eq!(h.len, 1516);
        assert_ne!(nonce(TO_SERVER, 5), nonce(FROM_SERVER, 5));
        assert_ne!(nonce(TO_SERVER, 5), nonce(TO_SERVER, 6));
        let a = alert_record(9, alert::OVERSIZE, "too long");
        let mut head = [0u8; HEADER];
        head.copy_from_slice(&a[..HEADER]);
        let h = Header::decode(&head);
        assert_eq!(
            (h.kind, h.seq, h.len as usize),
            (kind::ALERT, 9, a.len() - HEADER)
        );
        assert_eq!(a[HEADER], alert::OVERSIZE);
    }
}
