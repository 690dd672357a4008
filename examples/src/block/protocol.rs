//! The block store's wire format.
//!
//! Every frame is a 4-byte big-endian length and that many bytes of body.
//!
//! ```text
//! request  body: op u8 | id u64 | op's fields
//!   WRITE 1: block u64 | data (exactly one block)
//!   READ  2: block u64
//!   FLUSH 3: —
//!   STATS 4: —
//! response body: status u8 | id u64 | payload
//!   OK 0: READ → the block; STATS → JSON (`BlockStats`); else empty
//!   BAD_FRAME 1, OUT_OF_RANGE 2, CORRUPT 3, FAILED 4, BUSY 5: a UTF-8 message
//! ```
//!
//! All integers are big-endian. `id` is the client's: responses carry it
//! back and may come in any order. A frame the server cannot take gets an
//! error response (id 0 if the frame was too short to carry one) and the
//! connection goes on. A connection beyond the server's limit gets one
//! BUSY response (id 0) and is closed.
//!
//! Nothing here authenticates the client: whoever can connect can read and
//! overwrite every block. That is why the server listens on loopback only
//! unless told otherwise (`--insecure-listen`).

use serde::{Deserialize, Serialize};

use crate::backends::Served;

/// Bytes of a frame's length prefix.
pub const LEN_BYTES: usize = 4;
/// Bytes before a request's fields: op and id.
pub const REQUEST_HEAD: usize = 1 + 8;
/// Bytes before a response's payload: status and id.
pub const RESPONSE_HEAD: usize = 1 + 8;
/// The largest block size a server takes.
pub const MAX_BLOCK_SIZE: usize = 1 << 20;

/// The longest request body for `block_size`-byte blocks: a WRITE.
pub fn max_request(block_size: usize) -> usize {
    REQUEST_HEAD + 8 + block_size
}

/// The longest response body a client accepts: a READ of the largest
/// block, or STATS.
pub const MAX_RESPONSE: usize = RESPONSE_HEAD + MAX_BLOCK_SIZE;

/// Opcodes.
pub mod op {
    /// Write one block.
    pub const WRITE: u8 = 1;
    /// Read one block.
    pub const READ: u8 = 2;
    /// Make every acknowledged write durable (fdatasync).
    pub const FLUSH: u8 = 3;
    /// The server's counters, as JSON.
    pub const STATS: u8 = 4;
}

/// A request.
#[derive(Clone, PartialEq, Eq)]
pub enum Request {
    /// Store `data` as block `block`.
    Write {
        /// Block number.
        block: u64,
        /// Exactly one block of plaintext.
        data: Vec<u8>,
    },
    /// Fetch block `block`.
    Read {
        /// Block number.
        block: u64,
    },
    /// Make every acknowledged write durable.
    Flush,
    /// The server's counters.
    Stats,
}

// Block contents are the user's data: print only their length.
impl core::fmt::Debug for Request {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Request::Write { block, data } => f
                .debug_struct("Write")
                .field("block", block)
                .field("len", &data.len())
                .finish(),
            Request::Read { block } => f.debug_struct("Read").field("block", block).finish(),
            Request::Flush => f.write_str("Flush"),
            Request::Stats => f.write_str("Stats"),
        }
    }
}

impl Request {
    /// The opcode.
    pub fn op(&self) -> u8 {
        match self {
            Request::Write { .. } => op::WRITE,
            Request::Read { .. } => op::READ,
            Request::Flush => op::FLUSH,
            Request::Stats => op::STATS,
        }
    }

    /// Appends the whole frame, length prefix included.
    pub fn encode(&self, id: u64, out: &mut Vec<u8>) {
        let (block, data): (Option<u64>, &[u8]) = match self {
            Request::Write { block, data } => (Some(*block), data),
            Request::Read { block } => (Some(*block), &[]),
            Request::Flush | Request::Stats => (None, &[]),
        };
        let len = REQUEST_HEAD + block.map_or(0, |_| 8) + data.len();
        out.extend_from_slice(&frame_len(len).to_be_bytes());
        out.push(self.op());
        out.extend_from_slice(&id.to_be_bytes());
        if let Some(block) = block {
            out.extend_from_slice(&block.to_be_bytes());
        }
        out.extend_from_slice(data);
    }
}

/// A length as the 4-byte prefix carries it (saturating: no frame here
/// comes near 4 GiB).
fn frame_len(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

/// Why a request frame was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// Longer than any request of this server (its body was skipped).
    #[error("oversize frame: {len} bytes (at most {max})")]
    Oversize {
        /// The length the frame claimed.
        len: u64,
        /// The longest this server takes.
        max: usize,
    },
    /// Shorter than its opcode needs.
    #[error("truncated frame: {what} needs {expected} bytes, got {len}")]
    Truncated {
        /// What was being read.
        what: &'static str,
        /// The body's length.
        len: usize,
        /// The length needed.
        expected: usize,
    },
    /// Longer than its opcode takes.
    #[error("{what} takes {expected} bytes, got {len}")]
    TrailingBytes {
        /// The request.
        what: &'static str,
        /// The body's length.
        len: usize,
        /// The length it takes.
        expected: usize,
    },
    /// An opcode this server does not know.
    #[error("unknown opcode {0}")]
    UnknownOpcode(u8),
}

/// A request body refused: the id it carried (0 if it was too short to
/// carry one) and why.
pub type Refused = (u64, FrameError);

/// Decodes a request body (the frame without its length prefix) for a
/// server with `block_size`-byte blocks. Never panics, whatever the bytes.
///
/// # Errors
/// The id and the [`FrameError`].
pub fn decode_request(mut body: Vec<u8>, block_size: usize) -> Result<(u64, Request), Refused> {
    let len = body.len();
    let (Some(&opcode), Some(id)) = (body.first(), be_u64(&body, 1)) else {
        return Err((
            0,
            FrameError::Truncated {
                what: "a request",
                len,
                expected: REQUEST_HEAD,
            },
        ));
    };
    let exact = |what: &'static str, expected: usize| -> Result<(), Refused> {
        match len.cmp(&expected) {
            core::cmp::Ordering::Less => Err((
                id,
                FrameError::Truncated {
                    what,
                    len,
                    expected,
                },
            )),
            core::cmp::Ordering::Greater => Err((
                id,
                FrameError::TrailingBytes {
                    what,
                    len,
                    expected,
                },
            )),
            core::cmp::Ordering::Equal => Ok(()),
        }
    };
    let request = match opcode {
        op::WRITE => {
            exact("WRITE", REQUEST_HEAD + 8 + block_size)?;
            let block = be_u64(&body, REQUEST_HEAD).unwrap_or(0);
            body.drain(..REQUEST_HEAD + 8);
            Request::Write { block, data: body }
        }
        op::READ => {
            exact("READ", REQUEST_HEAD + 8)?;
            Request::Read {
                block: be_u64(&body, REQUEST_HEAD).unwrap_or(0),
            }
        }
        op::FLUSH => {
            exact("FLUSH", REQUEST_HEAD)?;
            Request::Flush
        }
        op::STATS => {
            exact("STATS", REQUEST_HEAD)?;
            Request::Stats
        }
        other => return Err((id, FrameError::UnknownOpcode(other))),
    };
    Ok((id, request))
}

/// The big-endian u64 at `at`, if the bytes are there.
fn be_u64(bytes: &[u8], at: usize) -> Option<u64> {
    let b: [u8; 8] = bytes.get(at..at.checked_add(8)?)?.try_into().ok()?;
    Some(u64::from_be_bytes(b))
}

/// A response status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
#[non_exhaustive]
pub enum Status {
    /// Done.
    Ok = 0,
    /// The frame was refused ([`FrameError`]).
    BadFrame = 1,
    /// The block is beyond the volume.
    OutOfRange = 2,
    /// The stored block failed its CRC: no data is returned.
    Corrupt = 3,
    /// The server could not do it (I/O error, a backend failure).
    Failed = 4,
    /// The server serves as many connections as it takes: this one is
    /// closed after this response (id 0).
    Busy = 5,
}

impl Status {
    /// The status of a byte; `None` for a value no server sends.
    pub fn from_u8(b: u8) -> Option<Status> {
        Some(match b {
            0 => Status::Ok,
            1 => Status::BadFrame,
            2 => Status::OutOfRange,
            3 => Status::Corrupt,
            4 => Status::Failed,
            5 => Status::Busy,
            _ => return None,
        })
    }
}

/// Appends a whole response frame, length prefix included.
pub fn encode_response(id: u64, status: Status, payload: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&frame_len(RESPONSE_HEAD + payload.len()).to_be_bytes());
    out.push(status as u8);
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(payload);
}

/// A decoded response.
#[derive(Clone, PartialEq, Eq)]
pub struct Response {
    /// The request's id.
    pub id: u64,
    /// How it went.
    pub status: Status,
    /// The block, the stats, or the error message.
    pub payload: Vec<u8>,
}

impl core::fmt::Debug for Response {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let mut d = f.debug_struct("Response");
        d.field("id", &self.id).field("status", &self.status);
        match self.status {
            Status::Ok => d.field("len", &self.payload.len()),
            _ => d.field("message", &String::from_utf8_lossy(&self.payload)),
        };
        d.finish()
    }
}

/// Why a response frame could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResponseError {
    /// Shorter than status and id.
    #[error("response of {0} bytes is shorter than its head")]
    Truncated(usize),
    /// A status no server sends.
    #[error("unknown status {0}")]
    UnknownStatus(u8),
}

/// Decodes a response body (the frame without its length prefix).
///
/// # Errors
/// [`ResponseError`].
pub fn decode_response(mut body: Vec<u8>) -> Result<Response, ResponseError> {
    let (Some(&status), Some(id)) = (body.first(), be_u64(&body, 1)) else {
        return Err(ResponseError::Truncated(body.len()));
    };
    let status = Status::from_u8(status).ok_or(ResponseError::UnknownStatus(status))?;
    body.drain(..RESPONSE_HEAD);
    Ok(Response {
        id,
        status,
        payload: body,
    })
}

/// The server's counters, the STATS response's JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BlockStats {
    /// Bytes per block.
    pub block_size: usize,
    /// Blocks in the volume.
    pub blocks: u64,
    /// Blocks written.
    pub writes: u64,
    /// Blocks read.
    pub reads: u64,
    /// FLUSHes done.
    pub flushes: u64,
    /// Frames refused.
    pub bad_frames: u64,
    /// Reads refused because the block failed its CRC.
    pub corrupt: u64,
    /// Connections refused at the connection limit.
    pub refused: u64,
    /// Connections closed for sending no whole request within the idle
    /// timeout.
    pub idle_closed: u64,
    /// Requests that failed for another reason.
    pub failed: u64,
    /// Half-written slots found and discarded when the volume was opened
    /// after a crash.
    pub torn_discarded: u64,
    /// Whether the volume had been shut down cleanly before this start.
    pub opened_clean: bool,
    /// CPU time of the server process so far (user + system), in ns.
    pub cpu_ns: u64,
    /// The `Offload`'s policy, or the backend every request is forced to.
    pub selection: String,
    /// What each backend has served (XTS and CRC-32C requests alike).
    pub backends: Vec<Served>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pattern::SplitMix;

    fn body(frame: &[u8]) -> Vec<u8> {
        frame[LEN_BYTES..].to_vec()
    }

    #[test]
    fn requests_round_trip() {
        for request in [
            Request::Write {
                block: 9,
                data: vec![5; 512],
            },
            Request::Read { block: u64::MAX },
            Request::Flush,
            Request::Stats,
        ] {
            let mut frame = Vec::new();
            request.encode(77, &mut frame);
            let len = u32::from_be_bytes(frame[..4].try_into().unwrap()) as usize;
            assert_eq!(len, frame.len() - LEN_BYTES);
            assert_eq!(decode_request(body(&frame), 512), Ok((77, request)));
        }
    }

    #[test]
    fn bad_bodies_are_refused_with_their_id() {
        let mut write = Vec::new();
        Request::Write {
            block: 1,
            data: vec![0; 100],
        }
        .encode(3, &mut write);
        assert!(matches!(
            decode_request(body(&write), 512),
            Err((3, FrameError::Truncated { what: "WRITE", .. }))
        ));
        let mut read = Vec::new();
        Request::Read { block: 1 }.encode(4, &mut read);
        read.push(0);
        assert!(matches!(
            decode_request(body(&read), 512),
            Err((4, FrameError::TrailingBytes { .. }))
        ));
        let mut unknown = vec![0, 0, 0, 9, 42];
        unknown.extend_from_slice(&5u64.to_be_bytes());
        assert_eq!(
            decode_request(body(&unknown), 512),
            Err((5, FrameError::UnknownOpcode(42)))
        );
        assert!(matches!(
            decode_request(vec![op::READ, 1, 2], 512),
            Err((0, FrameError::Truncated { .. }))
        ));
    }

    #[test]
    fn random_bodies_never_panic() {
        let mut g = SplitMix::new(11);
        for _ in 0..20_000 {
            let len = g.below(40) as usize;
            let mut b: Vec<u8> = (0..len).map(|_| g.next_u64() as u8).collect();
            if let Some(first) = b.first_mut() {
                *first %= 6;
            }
            let _ = decode_request(b.clone(), 16);
            let _ = decode_response(b);
        }
    }

    #[test]
    fn responses_round_trip_and_bad_ones_are_errors() {
        let mut frame = Vec::new();
        encode_response(8, Status::Corrupt, b"block 3 is corrupt", &mut frame);
        let r = decode_response(body(&frame)).unwrap();
        assert_eq!(
            (r.id, r.status, &r.payload[..]),
            (8, Status::Corrupt, &b"block 3 is corrupt"[..])
        );
        assert_eq!(
            decode_response(vec![0; 3]),
            Err(ResponseError::Truncated(3))
        );
        assert_eq!(
            decode_response(vec![9; 9]),
            Err(ResponseError::UnknownStatus(9))
        );
    }
}
