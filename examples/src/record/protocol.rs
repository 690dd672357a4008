//! The record server's wire format.
//!
//! Every record is a 13-byte header and a body:
//!
//! ```text
//! header: type u8 | seq u64 | len u32          (big-endian)
//!   HELLO 0x01  client → server: X25519 public key (32) | random (16)
//!               server → client: X25519 public key (32) | key confirmation (32)
//!   STATS 0x02  client → server: empty; server → client: JSON (`RecordStats`)
//!   ALERT 0x15  server → client: code u8 | UTF-8 message (a refused record)
//!   DATA  0x17  both ways: ciphertext ‖ 16-byte tag
//! ```
//!
//! **Keys.** The HELLOs are an ephemeral X25519 exchange; HKDF-SHA256 turns
//! its shared secret (and a pre-shared key, if both sides have one) into
//! two AES-128-GCM keys, one per direction
//! ([`handshake`](super::handshake) has the key schedule and what it
//! protects against). No key crosses the wire. The server answers every
//! HELLO with a fresh secret of its own, so each connection, and each
//! HELLO on one connection, has keys of its own, even when a client's HELLO
//! is sent again word for word.
//!
//! **Records.** A DATA record is sealed under its direction's key with the
//! nonce `direction u32 | seq u64` (direction 0 towards the server, 1 from
//! it) and the header as AAD: a record whose header, body or tag was
//! changed does not open. Each side numbers the records it sends under a
//! key from 1, and a receiver takes only increasing sequence numbers, so a
//! replayed record is dropped too. A HELLO starts both directions' numbers
//! again under the new keys; no (key, nonce) pair is ever used twice,
//! because no key is.

use crypto_offload::AeadSession;
use serde::{Deserialize, Serialize};

use crate::backends::Served;

/// Bytes of a record header.
pub const HEADER: usize = 13;
/// Bytes of the GCM tag.
pub const TAG: usize = 16;
/// Bytes of each direction's key (AES-128).
pub const KEY: usize = 16;
/// The largest payload a server takes by default (TLS's 2^14).
pub const MAX_PAYLOAD: usize = 16 * 1024;

/// Record types.
pub mod kind {
    /// A key exchange: the client's half, or the server's answer.
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
    /// HELLO of another length than a public key and a random).
    pub const TRUNCATED: u8 = 2;
    /// A record type the server does not know.
    pub const UNKNOWN_TYPE: u8 = 3;
    /// DATA before HELLO.
    pub const NO_KEY: u8 = 4;
    /// The server could not do it.
    pub const FAILED: u8 = 5;
    /// A HELLO the server cannot take (a low-order public key); the
    /// connection keeps the keys it had.
    pub const HANDSHAKE: u8 = 6;
    /// The server serves as many connections as it takes: this one is
    /// closed after the alert.
    pub const BUSY: u8 = 7;
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

/// Seals `payload` as DATA record `seq` sent in `direction`: the whole
/// record, header ‖ ciphertext ‖ tag.
///
/// # Errors
/// The session's.
///
/// # Cancel safety
/// Cancel safe: the payload is lost, nothing else.
pub async fn seal_record(
    session: &AeadSession,
    direction: u32,
    seq: u64,
    payload: Vec<u8>,
) -> Result<Vec<u8>, crypto_offload::Error> {
    let header = Header::data(seq, payload.len()).encode();
    let sealed = session
        .seal(nonce(direction, seq), &header, payload)
        .await
        .map_err(crypto_offload::Error::from)?;
    let mut out = Vec::with_capacity(HEADER + sealed.len());
    out.extend_from_slice(&header);
    out.extend_from_slice(&sealed);
    Ok(out)
}

/// Opens the body of the DATA record whose header is `header`, sent in
/// `direction`: its plaintext.
///
/// # Errors
/// [`crypto_offload::Error::Authentication`] if it does not open (another
/// key, or a changed header, body or tag); the session's other errors.
///
/// # Cancel safety
/// Cancel safe: the record is lost, nothing else.
pub async fn open_record(
    session: &AeadSession,
    direction: u32,
    header: &[u8; HEADER],
    body: Vec<u8>,
) -> Result<Vec<u8>, crypto_offload::Error> {
    let seq = Header::decode(header).seq;
    session
        .open(nonce(direction, seq), header, body)
        .await
        .map_err(crypto_offload::Error::from)
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
    /// Connections refused at the connection limit.
    pub refused: u64,
    /// Connections closed for sending no whole record within the idle
    /// timeout.
    pub idle_closed: u64,
    /// Key exchanges done (HELLOs answered).
    pub handshakes: u64,
    /// DATA records opened and echoed.
    pub records: u64,
    /// Their plaintext bytes.
    pub bytes: u64,
    /// DATA records that did not open (tampered, replayed from another
    /// connection or from before a HELLO, or sealed with another PSK):
    /// dropped.
    pub tampered: u64,
    /// DATA records that opened but repeated an earlier sequence number:
    /// dropped.
    pub replayed: u64,
    /// Records refused with an ALERT (HELLOs refused included).
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
