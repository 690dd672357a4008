//! The record server. Per connection: a reader that checks each record's
//! framing and answers each HELLO with a key exchange of its own, a
//! pipeline that opens and re-seals up to `depth` DATA records at once (so
//! one connection can keep an engine busy) and delivers them in order, and
//! a writer. At most [`Limits::max_connections`] connections at once, each
//! closed once it has sent no whole record for [`Limits::idle_timeout`].

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crypto_offload::{AeadAlg, AeadSession, Offload};
use futures::StreamExt;
use tokio::io::{AsyncRead, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tracing::Instrument;

use super::handshake::{self, CLIENT_HELLO, Psk};
use super::protocol::{
    FROM_SERVER, HEADER, Header, MAX_PAYLOAD, RecordStats, TAG, TO_SERVER, alert, alert_record,
    kind, open_record, record, seal_record,
};
use crate::backends::Offloads;
use crate::lifecycle::{Limits, accept_until, process_cpu_ns, refuse_with, stopped};
use crate::wire::{discard, read_body, read_header, write_frames};

/// DATA records one connection may have in the pipeline by default.
pub const DEPTH: usize = 32;

/// How a record server treats its connections.
#[derive(Debug, Clone)]
pub struct RecordServerConfig {
    /// DATA records each connection opens and seals at once.
    pub depth: usize,
    /// The largest payload taken (at most [`MAX_PAYLOAD`]).
    pub max_payload: usize,
    /// A key both sides must hold: mixed into every key exchange, which it
    /// authenticates. `None`: the exchange resists passive eavesdropping
    /// only.
    pub psk: Option<Psk>,
    /// Connections at once, and the idle timeout.
    pub limits: Limits,
}

impl Default for RecordServerConfig {
    /// [`DEPTH`], [`MAX_PAYLOAD`], no PSK, the default [`Limits`].
    fn default() -> Self {
        RecordServerConfig {
            depth: DEPTH,
            max_payload: MAX_PAYLOAD,
            psk: None,
            limits: Limits::default(),
        }
    }
}

#[derive(Debug, Default)]
struct Counters {
    connections: AtomicU64,
    refused: AtomicU64,
    idle_closed: AtomicU64,
    handshakes: AtomicU64,
    records: AtomicU64,
    bytes: AtomicU64,
    tampered: AtomicU64,
    replayed: AtomicU64,
    bad_frames: AtomicU64,
}

fn bump(counter: &AtomicU64, by: u64) {
    counter.fetch_add(by, Ordering::Relaxed);
}

/// A record server.
#[derive(Debug)]
pub struct RecordServer {
    offload: Offload,
    offloads: Offloads,
    counters: Counters,
    depth: usize,
    max_payload: usize,
    psk: Option<Psk>,
    limits: Limits,
}

/// One key exchange's sessions: the client's records open under one key,
/// the server's are sealed under the other.
#[derive(Debug)]
struct Sessions {
    open: AeadSession,
    seal: AeadSession,
}

/// What the reader hands the pipeline.
enum Job {
    /// A DATA record to open and echo sealed as `reply_seq`.
    Data {
        sessions: Arc<Sessions>,
        header: [u8; HEADER],
        seq: u64,
        body: Vec<u8>,
        reply_seq: u64,
    },
    /// New keys: the server's HELLO to send, and sequence numbers start
    /// over (under the new keys).
    Rekeyed(Vec<u8>),
    /// STATS, answered once every record before it is counted.
    Stats { seq: u64 },
    /// A record to send as it is (an ALERT).
    Send(Vec<u8>),
}

/// What the pipeline hands the in-order stage.
enum Outcome {
    Echo {
        seq: u64,
        len: usize,
        record: Vec<u8>,
    },
    Tampered {
        seq: u64,
    },
    Failed {
        seq: u64,
        why: String,
    },
    Rekeyed(Vec<u8>),
    Stats {
        seq: u64,
    },
    Send(Vec<u8>),
}

/// What a connection's reader got.
enum Incoming {
    /// A record no longer than the server takes.
    Record { header: [u8; HEADER], body: Vec<u8> },
    /// A longer one, its body thrown away.
    Oversize { header: [u8; HEADER] },
}

impl RecordServer {
    /// A server whose sessions open on `offloads`, treating connections as
    /// `config` says.
    pub fn new(offloads: Offloads, config: RecordServerConfig) -> Arc<Self> {
        Arc::new(RecordServer {
            offload: offloads.for_alg(AeadAlg::Aes128Gcm).clone(),
            offloads,
            counters: Counters::default(),
            depth: config.depth.max(1),
            max_payload: config.max_payload.min(MAX_PAYLOAD),
            psk: config.psk,
            limits: config.limits,
        })
    }

    /// A server with [`RecordServerConfig::default`].
    pub fn with_defaults(offloads: Offloads) -> Arc<Self> {
        RecordServer::new(offloads, RecordServerConfig::default())
    }

    /// The counters STATS returns.
    pub fn stats(&self) -> RecordStats {
        let c = &self.counters;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RecordStats {
            connections: load(&c.connections),
            refused: load(&c.refused),
            idle_closed: load(&c.idle_closed),
            handshakes: load(&c.handshakes),
            records: load(&c.records),
            bytes: load(&c.bytes),
            tampered: load(&c.tampered),
            replayed: load(&c.replayed),
            bad_frames: load(&c.bad_frames),
            cpu_ns: process_cpu_ns(),
            selection: self.offloads.selection(),
            backends: self.offloads.served(),
        }
    }

    /// Accepts connections on `listener` until `shutdown` turns true (or
    /// its sender is dropped); then every connection stops reading, echoes
    /// what it has read, and closes. A connection beyond the limit gets an
    /// ALERT (`BUSY`) and is closed.
    ///
    /// # Errors
    /// Accepting failed.
    ///
    /// # Cancel safety
    /// Dropping the future drops every connection at once.
    pub async fn serve(
        self: &Arc<Self>,
        listener: TcpListener,
        shutdown: watch::Receiver<bool>,
    ) -> io::Result<()> {
        let max = self.limits.max_connections;
        let busy = alert_record(
            0,
            alert::BUSY,
            &format!("busy: this server takes {max} connections at once"),
        );
        accept_until(
            listener,
            shutdown.clone(),
            max,
            |stream| {
                bump(&self.counters.refused, 1);
                refuse_with(stream, &busy);
            },
            |stream| {
                bump(&self.counters.connections, 1);
                self.clone().connection(stream, shutdown.clone())
            },
        )
        .await
    }

    /// Serves one connection until the peer closes it, sends no whole
    /// record within the idle timeout, or shutdown; what was read before
    /// is still echoed.
    ///
    /// # Cancel safety
    /// Dropping the future stops reading; the pipeline and the writer run on
    /// their own tasks and finish what was read.
    async fn connection(self: Arc<Self>, stream: TcpStream, mut shutdown: watch::Receiver<bool>) {
        let _ = stream.set_nodelay(true);
        let (reader, writer) = stream.into_split();
        let (frames, queued) = mpsc::channel(self.depth + 8);
        let writing = tokio::spawn(write_frames(writer, queued).in_current_span());
        let (jobs, pending) = mpsc::channel(self.depth);
        let delivering = tokio::spawn(self.clone().deliver(pending, frames).in_current_span());
        tokio::select! {
            () = self.read_records(reader, jobs) => {}
            () = stopped(&mut shutdown) => {}
        }
        let _ = delivering.await;
        let _ = writing.await;
    }

    /// Reads records and queues the work; refuses bad ones with an ALERT.
    ///
    /// # Cancel safety
    /// Not cancel safe: a record partly read is lost, and the connection with it
    /// (the caller drops the connection when it cancels this).
    async fn read_records(&self, reader: tokio::net::tcp::OwnedReadHalf, jobs: mpsc::Sender<Job>) {
        let mut reader = BufReader::with_capacity(64 * 1024, reader);
        let max_body = (self.max_payload + TAG).max(CLIENT_HELLO);
        let mut sessions: Option<Arc<Sessions>> = None;
        // The sequence number of the last record sealed under `sessions`.
        let mut reply_seq = 0u64;
        loop {
            // The idle clock runs while the server waits for the next whole
            // record, not while the pipeline is full: a record trickled in a
            // byte at a time is cut off too.
            let idle = self.limits.idle_timeout;
            let (header, body) =
                match tokio::time::timeout(idle, next_record(&mut reader, max_body)).await {
                    Err(_) => {
                        bump(&self.counters.idle_closed, 1);
                        tracing::debug!(?idle, "no whole record within the idle timeout: closing");
                        return;
                    }
                    Ok(Ok(Some(Incoming::Record { header, body }))) => (header, body),
                    Ok(Ok(Some(Incoming::Oversize { header }))) => (header, Vec::new()),
                    Ok(Ok(None)) => return,
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "connection ended inside a record");
                        return;
                    }
                };
            let h = Header::decode(&header);
            let len = h.len as usize;
            let refusal = if len > max_body {
                Some((
                    alert::OVERSIZE,
                    format!("{len}-byte record: at most {max_body}"),
                ))
            } else {
                match h.kind {
                    kind::HELLO if len != CLIENT_HELLO => Some((
                        alert::TRUNCATED,
                        format!(
                            "HELLO carries {CLIENT_HELLO} bytes (a public key and a random), not {len}"
                        ),
                    )),
                    kind::DATA if len < TAG => Some((
                        alert::TRUNCATED,
                        format!("{len}-byte DATA record: shorter than its tag"),
                    )),
                    kind::DATA if sessions.is_none() => {
                        Some((alert::NO_KEY, "DATA before HELLO".to_owned()))
                    }
                    kind::HELLO | kind::DATA | kind::STATS => None,
                    other => Some((
                        alert::UNKNOWN_TYPE,
                        format!("unknown record type {other:#04x}"),
                    )),
                }
            };
            let job = if let Some((code, why)) = refusal {
                bump(&self.counters.bad_frames, 1);
                tracing::debug!(seq = h.seq, %why, "refused");
                Job::Send(alert_record(h.seq, code, &why))
            } else {
                match h.kind {
                    kind::HELLO => match self.hello(&body).await {
                        Ok((hello, new)) => {
                            bump(&self.counters.handshakes, 1);
                            sessions = Some(Arc::new(new));
                            reply_seq = 0;
                            Job::Rekeyed(hello)
                        }
                        Err((code, why)) => {
                            bump(&self.counters.bad_frames, 1);
                            tracing::debug!(seq = h.seq, %why, "HELLO refused");
                            Job::Send(alert_record(h.seq, code, &why))
                        }
                    },
                    kind::STATS => Job::Stats { seq: h.seq },
                    _ => {
                        let Some(sessions) = sessions.clone() else {
                            return;
                        };
                        // Numbered as read, whether it opens or not: a
                        // sequence number is never handed out twice.
                        reply_seq += 1;
                        Job::Data {
                            sessions,
                            header,
                            seq: h.seq,
                            body,
                            reply_seq,
                        }
                    }
                }
            };
            if jobs.send(job).await.is_err() {
                return;
            }
        }
    }

    /// Answers a client's HELLO body: the server's HELLO record and the
    /// sessions of the new keys, or the alert code and why not.
    ///
    /// # Cancel safety
    /// Cancel safe: the keys are dropped (and wiped) with it.
    async fn hello(&self, body: &[u8]) -> Result<(Vec<u8>, Sessions), (u8, String)> {
        let (reply, keys) = handshake::respond(body, self.psk.as_ref())
            .map_err(|e| (alert::HANDSHAKE, e.to_string()))?;
        let failed = |e: crypto_offload::Error| (alert::FAILED, e.to_string());
        let sessions = Sessions {
            open: self
                .offload
                .aead(AeadAlg::Aes128Gcm, keys.to_server())
                .await
                .map_err(failed)?,
            seal: self
                .offload
                .aead(AeadAlg::Aes128Gcm, keys.to_client())
                .await
                .map_err(failed)?,
        };
        Ok((record(kind::HELLO, 0, &reply), sessions))
    }

    /// Opens and re-seals up to `depth` records at once, and delivers the
    /// results in order: an echo only if its sequence number is above every
    /// one delivered before (a replay is dropped), a record that does not
    /// open never.
    ///
    /// # Cancel safety
    /// Cancel safe: records not yet delivered are dropped with it, never sent
    /// half-written (the writer task sends whole frames).
    async fn deliver(self: Arc<Self>, jobs: mpsc::Receiver<Job>, frames: mpsc::Sender<Vec<u8>>) {
        let c = &self.counters;
        let outcomes = futures::stream::unfold(jobs, |mut jobs| async move {
            jobs.recv().await.map(|job| (job, jobs))
        })
        .map(process)
        .buffered(self.depth);
        futures::pin_mut!(outcomes);
        let mut last: Option<u64> = None;
        while let Some(outcome) = outcomes.next().await {
            let frame = match outcome {
                Outcome::Echo { seq, len, record } => {
                    if last.is_some_and(|l| seq <= l) {
                        bump(&c.replayed, 1);
                        tracing::debug!(seq, "replayed record dropped");
                        continue;
                    }
                    last = Some(seq);
                    bump(&c.records, 1);
                    bump(&c.bytes, len as u64);
                    record
                }
                Outcome::Tampered { seq } => {
                    bump(&c.tampered, 1);
                    tracing::debug!(seq, "record does not open: dropped");
                    continue;
                }
                Outcome::Failed { seq, why } => {
                    tracing::warn!(seq, %why, "record failed");
                    alert_record(seq, alert::FAILED, &why)
                }
                Outcome::Rekeyed(hello) => {
                    last = None;
                    hello
                }
                Outcome::Stats { seq } => {
                    let json = serde_json::to_vec(&self.stats()).unwrap_or_default();
                    record(kind::STATS, seq, &json)
                }
                Outcome::Send(frame) => frame,
            };
            if frames.send(frame).await.is_err() {
                return;
            }
        }
    }
}

/// Opens one DATA record and seals its plaintext as the reply.
///
/// # Cancel safety
/// Cancel safe: the record is lost, nothing else.
async fn process(job: Job) -> Outcome {
    let (sessions, header, seq, body, reply_seq) = match job {
        Job::Data {
            sessions,
            header,
            seq,
            body,
            reply_seq,
        } => (sessions, header, seq, body, reply_seq),
        Job::Rekeyed(hello) => return Outcome::Rekeyed(hello),
        Job::Stats { seq } => return Outcome::Stats { seq },
        Job::Send(frame) => return Outcome::Send(frame),
    };
    let span = tracing::debug_span!("record", seq, len = body.len());
    async move {
        let plain = match open_record(&sessions.open, TO_SERVER, &header, body).await {
            Ok(p) => p,
            Err(crypto_offload::Error::Authentication) => return Outcome::Tampered { seq },
            Err(e) => {
                return Outcome::Failed {
                    seq,
                    why: e.to_string(),
                };
            }
        };
        let len = plain.len();
        match seal_record(&sessions.seal, FROM_SERVER, reply_seq, plain).await {
            Ok(record) => Outcome::Echo { seq, len, record },
            Err(e) => Outcome::Failed {
                seq,
                why: e.to_string(),
            },
        }
    }
    .instrument(span)
    .await
}

/// Reads the next record: its header and body, or, for a record longer
/// than `max_body`, its header once the body has been thrown away. `None`
/// at a clean end.
///
/// # Errors
/// The stream ended inside a record; any read error.
///
/// # Cancel safety
/// Not cancel safe: a record partly read is lost, and the stream is out of
/// step; the caller drops the connection.
async fn next_record<R: AsyncRead + Unpin>(
    reader: &mut R,
    max_body: usize,
) -> io::Result<Option<Incoming>> {
    let Some(header) = read_header::<_, HEADER>(reader).await? else {
        return Ok(None);
    };
    let len = Header::decode(&header).len;
    if len as usize > max_body {
        discard(reader, u64::from(len)).await?;
        return Ok(Some(Incoming::Oversize { header }));
    }
    let body = read_body(reader, len as usize).await?;
    Ok(Some(Incoming::Record { header, body }))
}
