//! A record client: a key exchange (HELLO) on a fresh connection, then a
//! sending half that seals and a receiving half that opens, which can run
//! on separate tasks. The client sends one HELLO per connection: it does
//! not rekey (the server would take another HELLO; see
//! [`protocol`](super::protocol)).

use std::net::SocketAddr;

use crypto_offload::{AeadAlg, AeadSession, Offload};
use tokio::io::{AsyncWriteExt, BufReader, BufWriter};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

use super::handshake::{ClientHandshake, HandshakeError, Psk, SERVER_HELLO, SessionKeys};
use super::protocol::{
    FROM_SERVER, HEADER, Header, MAX_PAYLOAD, RecordStats, TAG, TO_SERVER, kind, open_record,
    record, seal_record,
};
use crate::wire::{read_body, read_header};

/// What a record client call can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    /// The connection could not be made.
    #[error("cannot connect to {addr}")]
    Connect {
        /// The server's address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Reading or writing the connection failed, or it closed.
    #[error("the connection failed")]
    Io(#[from] std::io::Error),
    /// The key exchange failed (a wrong PSK among others).
    #[error(transparent)]
    Handshake(#[from] HandshakeError),
    /// The server refused with an ALERT (`protocol::alert`), before any
    /// keys: busy, or a HELLO it could not take.
    #[error("the server refused: {message}")]
    Refused {
        /// The alert code.
        code: u8,
        /// What the server said.
        message: String,
    },
    /// The AEAD session could not be opened, or sealing failed.
    #[error(transparent)]
    Crypto(#[from] crypto_offload::Error),
    /// A record from the server did not open.
    #[error("a record from the server does not open")]
    Authentication,
    /// A record from the server repeated or went back in sequence.
    #[error("record {seq} from the server after {last}")]
    OutOfSequence {
        /// Its sequence number.
        seq: u64,
        /// The last one taken.
        last: u64,
    },
    /// Every sequence number of this key has been used: connect again.
    #[error("the connection's sequence numbers are used up: connect again")]
    SequenceExhausted,
    /// A record this client cannot take.
    #[error("bad record from the server: {0}")]
    BadRecord(String),
    /// STATS was not the JSON expected.
    #[error("STATS: {0}")]
    Stats(#[from] serde_json::Error),
}

/// What the server sent.
#[derive(Debug, Clone, PartialEq)]
pub enum Received {
    /// An echoed record's plaintext.
    Data(Vec<u8>),
    /// A STATS reply.
    Stats(Box<RecordStats>),
    /// A refusal: the code (`protocol::alert`), the refused record's
    /// sequence number and the message.
    Alert {
        /// The alert code.
        code: u8,
        /// The refused record's sequence number.
        seq: u64,
        /// What the server said.
        message: String,
    },
}

/// Connects, runs the key exchange (with `psk` if the server has one), and
/// opens the connection's two AES-128-GCM sessions on `offload`: the same
/// as [`handshake`] and then [`open`].
///
/// # Errors
/// [`RecordError::Connect`], [`RecordError::Handshake`] (a wrong PSK is
/// [`HandshakeError::KeyMismatch`]), [`RecordError::Refused`] (a busy
/// server), [`RecordError::Crypto`], [`RecordError::Io`].
///
/// # Cancel safety
/// Cancel safe: a dropped connect drops the connection.
pub async fn connect(
    addr: SocketAddr,
    offload: &Offload,
    psk: Option<&Psk>,
) -> Result<(RecordSender, RecordReceiver), RecordError> {
    let mut stream = TcpStream::connect(addr)
        .await
        .map_err(|source| RecordError::Connect { addr, source })?;
    let _ = stream.set_nodelay(true);
    let keys = handshake(&mut stream, psk).await?;
    open(stream, &keys, offload).await
}

/// The key exchange on a fresh connection: sends HELLO, reads the
/// server's, and gives the keys once the server's confirmation checks out.
/// Nothing secret is written: the HELLO carries a public key and a random.
///
/// # Errors
/// [`RecordError::Handshake`], [`RecordError::Refused`],
/// [`RecordError::BadRecord`], [`RecordError::Io`].
///
/// # Cancel safety
/// Not cancel safe: the connection is out of step; drop it.
pub async fn handshake(
    stream: &mut TcpStream,
    psk: Option<&Psk>,
) -> Result<SessionKeys, RecordError> {
    let client = ClientHandshake::new()?;
    stream
        .write_all(&record(kind::HELLO, 0, client.hello()))
        .await?;
    // Read unbuffered: the bytes after the server's HELLO belong to the
    // receiving half.
    let Some(header) = read_header::<_, HEADER>(stream).await? else {
        return Err(RecordError::BadRecord(
            "closed before the server's HELLO".into(),
        ));
    };
    let h = Header::decode(&header);
    let len = h.len as usize;
    if len > 1024 {
        return Err(RecordError::BadRecord(format!(
            "{len}-byte record for HELLO"
        )));
    }
    let body = read_body(stream, len).await?;
    match h.kind {
        kind::HELLO if len == SERVER_HELLO => Ok(client.finish(&body, psk)?),
        kind::ALERT => {
            let (code, message) = body.split_first().map_or((0, &[][..]), |(c, m)| (*c, m));
            Err(RecordError::Refused {
                code,
                message: String::from_utf8_lossy(message).into_owned(),
            })
        }
        other => Err(RecordError::BadRecord(format!(
            "record type {other:#04x} of {len} bytes for HELLO"
        ))),
    }
}

/// The sending and receiving halves of a connection whose key exchange
/// gave `keys`, their sessions opened on `offload`. The keys can be dropped
/// (and so wiped) once this returns.
///
/// # Errors
/// [`RecordError::Crypto`].
///
/// # Cancel safety
/// Cancel safe: a dropped future drops the connection.
pub async fn open(
    stream: TcpStream,
    keys: &SessionKeys,
    offload: &Offload,
) -> Result<(RecordSender, RecordReceiver), RecordError> {
    let seal = offload.aead(AeadAlg::Aes128Gcm, keys.to_server()).await?;
    let open = offload.aead(AeadAlg::Aes128Gcm, keys.to_client()).await?;
    let (reader, writer) = stream.into_split();
    let sender = RecordSender {
        writer: BufWriter::with_capacity(64 * 1024, writer),
        session: seal,
        seq: 0,
    };
    let receiver = RecordReceiver {
        reader: BufReader::with_capacity(64 * 1024, reader),
        session: open,
        last: 0,
    };
    Ok((sender, receiver))
}

/// The sending half: seals DATA records with the next sequence number.
#[derive(Debug)]
pub struct RecordSender {
    writer: BufWriter<OwnedWriteHalf>,
    session: AeadSession,
    seq: u64,
}

impl RecordSender {
    /// Seals `payload` as the next DATA record and returns the whole record
    /// (to send with [`send_raw`](Self::send_raw), or to tamper with first).
    ///
    /// # Errors
    /// [`RecordError::Crypto`], [`RecordError::SequenceExhausted`].
    ///
    /// # Cancel safety
    /// Cancel safe; the sequence number is used up either way.
    pub async fn seal(&mut self, payload: Vec<u8>) -> Result<Vec<u8>, RecordError> {
        self.seq = self
            .seq
            .checked_add(1)
            .ok_or(RecordError::SequenceExhausted)?;
        Ok(seal_record(&self.session, TO_SERVER, self.seq, payload).await?)
    }

    /// Queues bytes as they are (a record from [`seal`](Self::seal), or any
    /// bytes at all); [`flush`](Self::flush) sends them.
    ///
    /// # Errors
    /// [`RecordError::Io`].
    ///
    /// # Cancel safety
    /// Not cancel safe: part of the bytes may have been queued.
    pub async fn send_raw(&mut self, bytes: &[u8]) -> Result<(), RecordError> {
        Ok(self.writer.write_all(bytes).await?)
    }

    /// Seals and queues `payload`.
    ///
    /// # Errors
    /// As for [`seal`](Self::seal) and [`send_raw`](Self::send_raw).
    ///
    /// # Cancel safety
    /// Not cancel safe, as for [`send_raw`](Self::send_raw).
    pub async fn send(&mut self, payload: Vec<u8>) -> Result<(), RecordError> {
        let record = self.seal(payload).await?;
        self.send_raw(&record).await
    }

    /// Queues a STATS request.
    ///
    /// # Errors
    /// [`RecordError::Io`].
    ///
    /// # Cancel safety
    /// Not cancel safe, as for [`send_raw`](Self::send_raw).
    pub async fn request_stats(&mut self) -> Result<(), RecordError> {
        self.send_raw(&record(kind::STATS, 0, &[])).await
    }

    /// Sends everything queued.
    ///
    /// # Errors
    /// [`RecordError::Io`].
    ///
    /// # Cancel safety
    /// Cancel safe: what is not sent stays queued.
    pub async fn flush(&mut self) -> Result<(), RecordError> {
        Ok(self.writer.flush().await?)
    }

    /// The last sequence number used.
    pub fn seq(&self) -> u64 {
        self.seq
    }
}

/// The receiving half: opens the server's DATA records and checks that
/// their sequence numbers increase.
#[derive(Debug)]
pub struct RecordReceiver {
    reader: BufReader<OwnedReadHalf>,
    session: AeadSession,
    last: u64,
}

impl RecordReceiver {
    /// The next record from the server; `None` when it closed the
    /// connection cleanly.
    ///
    /// # Errors
    /// [`RecordError::Authentication`], [`RecordError::OutOfSequence`],
    /// [`RecordError::BadRecord`], [`RecordError::Io`],
    /// [`RecordError::Stats`].
    ///
    /// # Cancel safety
    /// Not cancel safe: a record partly read is lost and the stream is out
    /// of step.
    pub async fn recv(&mut self) -> Result<Option<Received>, RecordError> {
        let Some(header) = read_header::<_, HEADER>(&mut self.reader).await? else {
            return Ok(None);
        };
        let h = Header::decode(&header);
        let len = h.len as usize;
        if len > MAX_PAYLOAD + TAG + 1024 {
            return Err(RecordError::BadRecord(format!("{len}-byte record")));
        }
        let body = read_body(&mut self.reader, len).await?;
        Ok(Some(match h.kind {
            kind::DATA => {
                if h.seq <= self.last {
                    return Err(RecordError::OutOfSequence {
                        seq: h.seq,
                        last: self.last,
                    });
                }
                let plain = open_record(&self.session, FROM_SERVER, &header, body)
                    .await
                    .map_err(|_| RecordError::Authentication)?;
                self.last = h.seq;
                Received::Data(plain)
            }
            kind::STATS => Received::Stats(Box::new(serde_json::from_slice(&body)?)),
            kind::ALERT => {
                let (code, message) = body.split_first().map_or((0, &[][..]), |(c, m)| (*c, m));
                Received::Alert {
                    code,
                    seq: h.seq,
                    message: String::from_utf8_lossy(message).into_owned(),
                }
            }
            kind::HELLO => {
                return Err(RecordError::BadRecord(
                    "a HELLO after the key exchange: this client does not rekey".into(),
                ));
            }
            other => return Err(RecordError::BadRecord(format!("record type {other:#04x}"))),
        }))
    }
}

/// The server's counters, over a connection of their own (no key needed).
///
/// # Errors
/// [`RecordError::Connect`], [`RecordError::Io`], [`RecordError::Stats`];
/// [`RecordError::BadRecord`] if the reply is not STATS.
///
/// # Cancel safety
/// Cancel safe: the connection is dropped.
pub async fn stats(addr: SocketAddr) -> Result<RecordStats, RecordError> {
    let mut stream = TcpStream::connect(addr)
        .await
        .map_err(|source| RecordError::Connect { addr, source })?;
    stream.write_all(&record(kind::STATS, 0, &[])).await?;
    let Some(header) = read_header::<_, HEADER>(&mut stream).await? else {
        return Err(RecordError::BadRecord("closed before STATS".into()));
    };
    let h = Header::decode(&header);
    if h.kind != kind::STATS || h.len as usize > 1 << 20 {
        return Err(RecordError::BadRecord(format!(
            "record type {:#04x} for STATS",
            h.kind
        )));
    }
    let body = read_body(&mut stream, h.len as usize).await?;
    Ok(serde_json::from_slice(&body)?)
}
