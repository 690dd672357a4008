//! A record client: HELLO with a fresh key, then a sending half that seals
//! and a receiving half that opens, which can run on separate tasks.

use std::net::SocketAddr;
use std::sync::Arc;

use crypto_offload::{AeadAlg, AeadSession, Offload};
use tokio::io::{AsyncWriteExt, BufReader, BufWriter};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use zeroize::Zeroizing;

use super::protocol::{
    FROM_SERVER, HEADER, Header, KEY, MAX_PAYLOAD, RecordStats, TAG, TO_SERVER, kind, nonce, record,
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
    /// No randomness for the key.
    #[error("no randomness for the connection key: {0}")]
    Random(String),
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

/// Connects, sends HELLO with a fresh random key, and opens the
/// connection's AES-128-GCM session on `offload`.
///
/// # Errors
/// [`RecordError::Connect`], [`RecordError::Random`],
/// [`RecordError::Crypto`], [`RecordError::Io`].
///
/// # Cancel safety
/// Cancel safe: a dropped connect drops the connection.
pub async fn connect(
    addr: SocketAddr,
    offload: &Offload,
) -> Result<(RecordSender, RecordReceiver), RecordError> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|source| RecordError::Connect { addr, source })?;
    let _ = stream.set_nodelay(true);
    let mut key = Zeroizing::new([0u8; KEY]);
    getrandom::fill(&mut key[..]).map_err(|e| RecordError::Random(e.to_string()))?;
    let session = Arc::new(offload.aead(AeadAlg::Aes128Gcm, &key[..]).await?);
    let (reader, mut writer) = stream.into_split();
    // Straight to the socket: through the BufWriter, a copy of the key would
    // stay in its buffer, unwiped, until overwritten.
    let hello = Zeroizing::new(record(kind::HELLO, 0, &key[..]));
    writer.write_all(&hello).await?;
    let sender = RecordSender {
        writer: BufWriter::with_capacity(64 * 1024, writer),
        session: session.clone(),
        seq: 0,
    };
    let receiver = RecordReceiver {
        reader: BufReader::with_capacity(64 * 1024, reader),
        session,
        last: 0,
    };
    Ok((sender, receiver))
}

/// The sending half: seals DATA records with the next sequence number.
#[derive(Debug)]
pub struct RecordSender {
    writer: BufWriter<OwnedWriteHalf>,
    session: Arc<AeadSession>,
    seq: u64,
}

impl RecordSender {
    /// Seals `payload` as the next DATA record and returns the whole record
    /// (to send with [`send_raw`](Self::send_raw), or to tamper with first).
    ///
    /// # Errors
    /// [`RecordError::Crypto`].
    ///
    /// # Cancel safety
    /// Cancel safe; the sequence number is used up either way.
    pub async fn seal(&mut self, payload: Vec<u8>) -> Result<Vec<u8>, RecordError> {
        self.seq += 1;
        let header = Header::data(self.seq, payload.len()).encode();
        let sealed = self
            .session
            .seal(&nonce(TO_SERVER, self.seq), &header, payload)
            .await
            .map_err(crypto_offload::Error::from)?;
        let mut out = Vec::with_capacity(HEADER + sealed.len());
        out.extend_from_slice(&header);
        out.extend_from_slice(&sealed);
        Ok(out)
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
    session: Arc<AeadSession>,
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
                let plain = self
                    .session
                    .open(&nonce(FROM_SERVER, h.seq), &header, body)
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
