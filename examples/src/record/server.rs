//! The record server. Per connection: a reader that checks each record's
//! framing, a pipeline that opens and re-seals up to `depth` DATA records
//! at once (so one connection can keep an engine busy) and delivers them in
//! order, and a writer.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crypto_offload::{AeadAlg, AeadSession, Offload};
use futures::StreamExt;
use tokio::io::BufReader;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tracing::Instrument;
use zeroize::Zeroizing;

use super::protocol::{
    FROM_SERVER, HEADER, Header, KEY, MAX_PAYLOAD, RecordStats, TAG, TO_SERVER, alert,
    alert_record, kind, nonce, record,
};
use crate::backends::Offloads;
use crate::lifecycle::{accept_until, process_cpu_ns, stopped};
use crate::wire::{discard, read_body, read_header, write_frames};

/// DATA records one connection may have in the pipeline by default.
pub const DEPTH: usize = 32;

#[derive(Debug, Default)]
struct Counters {
    connections: AtomicU64,
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
}

/// What the reader hands the pipeline.
enum Job {
    /// A DATA record to open and echo sealed as `reply_seq`.
    Data {
        session: Arc<AeadSession>,
        header: [u8; HEADER],
        seq: u64,
        body: Vec<u8>,
        reply_seq: u64,
    },
    /// A new key: sequence numbers start over.
    Rekeyed,
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
    Rekeyed,
    Stats {
        seq: u64,
    },
    Send(Vec<u8>),
}

impl RecordServer {
    /// A server whose sessions open on `offloads`, with `depth` DATA
    /// records in each connection's pipeline and payloads up to
    /// `max_payload` bytes.
    pub fn new(offloads: Offloads, depth: usize, max_payload: usize) -> Arc<Self> {
        Arc::new(RecordServer {
            offload: offloads.for_alg(AeadAlg::Aes128Gcm).clone(),
            offloads,
            counters: Counters::default(),
            depth: depth.max(1),
            max_payload,
        })
    }

    /// A server with the default depth and [`MAX_PAYLOAD`].
    pub fn with_defaults(offloads: Offloads) -> Arc<Self> {
        RecordServer::new(offloads, DEPTH, MAX_PAYLOAD)
    }

    /// The counters STATS returns.
    pub fn stats(&self) -> RecordStats {
        let c = &self.counters;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RecordStats {
            connections: load(&c.connections),
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
    /// what it has read, and closes.
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
        accept_until(listener, shutdown.clone(), |stream| {
            bump(&self.counters.connections, 1);
            self.clone().connection(stream, shutdown.clone())
        })
        .await
    }

    /// Serves one connection until the peer closes it or shutdown; what was
    /// read before is still echoed.
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
        let max_body = self.max_payload + TAG;
        let mut session: Option<Arc<AeadSession>> = None;
        let mut reply_seq = 0u64;
        loop {
            let header = match read_header::<_, HEADER>(&mut reader).await {
                Ok(Some(h)) => h,
                Ok(None) => return,
                Err(e) => {
                    tracing::debug!(error = %e, "connection ended inside a record");
                    return;
                }
            };
            let h = Header::decode(&header);
            let len = h.len as usize;
            let refusal = if len > max_body.max(KEY) {
                Some((
                    alert::OVERSIZE,
                    format!("{len}-byte record: at most {max_body}"),
                ))
            } else {
                match h.kind {
                    kind::HELLO if len != KEY => Some((
                        alert::TRUNCATED,
                        format!("HELLO carries a {KEY}-byte key, not {len} bytes"),
                    )),
                    kind::DATA if len < TAG => Some((
                        alert::TRUNCATED,
                        format!("{len}-byte DATA record: shorter than its tag"),
                    )),
                    kind::DATA if session.is_none() => {
                        Some((alert::NO_KEY, "DATA before HELLO".to_owned()))
                    }
                    kind::HELLO | kind::DATA | kind::STATS => None,
                    other => Some((
                        alert::UNKNOWN_TYPE,
                        format!("unknown record type {other:#04x}"),
                    )),
                }
            };
            if let Some((code, why)) = refusal {
                bump(&self.counters.bad_frames, 1);
                tracing::debug!(seq = h.seq, %why, "refused");
                if discard(&mut reader, u64::from(h.len)).await.is_err()
                    || jobs
                        .send(Job::Send(alert_record(h.seq, code, &why)))
                        .await
                        .is_err()
                {
                    return;
                }
                continue;
            }
            let Ok(mut body) = read_body(&mut reader, len).await else {
                return;
            };
            let job = match h.kind {
                kind::HELLO => {
                    let key = Zeroizing::new(std::mem::take(&mut body));
                    match self.offload.aead(AeadAlg::Aes128Gcm, &key).await {
                        Ok(s) => {
                            session = Some(Arc::new(s));
                            reply_seq = 0;
                            Job::Rekeyed
                        }
                        Err(e) => {
                            bump(&self.counters.bad_frames, 1);
                            Job::Send(alert_record(h.seq, alert::FAILED, &e.to_string()))
                        }
                    }
                }
                kind::STATS => Job::Stats { seq: h.seq },
                _ => {
                    let Some(session) = session.clone() else {
                        return;
                    };
                    reply_seq += 1;
                    Job::Data {
                        session,
                        header,
                        seq: h.seq,
                        body,
                        reply_seq,
                    }
                }
            };
            if jobs.send(job).await.is_err() {
                return;
            }
        }
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
                Outcome::Rekeyed => {
                    last = None;
                    continue;
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
    let (session, header, seq, body, reply_seq) = match job {
        Job::Data {
            session,
            header,
            seq,
            body,
            reply_seq,
        } => (session, header, seq, body, reply_seq),
        Job::Rekeyed => return Outcome::Rekeyed,
        Job::Stats { seq } => return Outcome::Stats { seq },
        Job::Send(frame) => return Outcome::Send(frame),
    };
    let span = tracing::debug_span!("record", seq, len = body.len());
    async move {
        let plain = match session.open(&nonce(TO_SERVER, seq), &header, body).await {
            Ok(p) => p,
            Err(e) if matches!(e.error(), crypto_offload::Error::Authentication) => {
                return Outcome::Tampered { seq };
            }
            Err(e) => {
                return Outcome::Failed {
                    seq,
                    why: e.to_string(),
                };
            }
        };
        let len = plain.len();
        let reply = Header::data(reply_seq, len).encode();
        match session
            .seal(&nonce(FROM_SERVER, reply_seq), &reply, plain)
            .await
        {
            Ok(sealed) => {
                let mut record = Vec::with_capacity(HEADER + sealed.len());
                record.extend_from_slice(&reply);
                record.extend_from_slice(&sealed);
                Outcome::Echo { seq, len, record }
            }
            Err(e) => Outcome::Failed {
                seq,
                why: e.to_string(),
            },
        }
    }
    .instrument(span)
    .await
}
