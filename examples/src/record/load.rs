//! The record server's load generator: connections that each keep a window
//! of sealed records in flight, open every echo and check it against what
//! was sent.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crypto_offload::Offload;
use tokio::sync::Semaphore;

use super::client::{self, Received, RecordError};
use super::handshake::Psk;
use super::protocol::MAX_PAYLOAD;
use crate::backends::{Served, served_since};
use crate::latency::{Latencies, Summary};
use crate::pattern;

/// One measurement: a record size and a number of connections.
#[derive(Debug, Clone)]
pub struct RecordLoadConfig {
    /// The server (a loopback address).
    pub addr: SocketAddr,
    /// Plaintext bytes per record.
    pub size: usize,
    /// TCP connections.
    pub connections: usize,
    /// Records each connection keeps in flight.
    pub window: usize,
    /// Stop sending after this long.
    pub duration: Duration,
    /// Stop sending after this many records per connection.
    pub records: Option<u64>,
    /// Seed of the payloads.
    pub seed: u64,
    /// The server's pre-shared key, if it has one.
    pub psk: Option<Arc<Psk>>,
}

impl RecordLoadConfig {
    /// 1500-byte records, one connection, a window of 32, 2 s.
    pub fn new(addr: SocketAddr) -> Self {
        RecordLoadConfig {
            addr,
            size: 1500,
            connections: 1,
            window: 32,
            duration: Duration::from_secs(2),
            records: None,
            seed: pattern::random_u64(),
            psk: None,
        }
    }
}

/// Why a measurement could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecordLoadError {
    /// Load goes to this machine only.
    #[error("{0} is not a loopback address: the load generator only targets this machine")]
    NotLoopback(SocketAddr),
    /// A record size the server does not take.
    #[error("{0}-byte records: the server takes at most {MAX_PAYLOAD}")]
    Size(usize),
    /// STATS before the run failed.
    #[error(transparent)]
    Record(#[from] RecordError),
}

/// What one measurement did.
#[derive(Debug, Clone, Default)]
pub struct RecordPoint {
    /// Plaintext bytes per record.
    pub size: usize,
    /// Connections.
    pub connections: usize,
    /// Records echoed and verified.
    pub records: u64,
    /// Echoes whose plaintext was not what was sent.
    pub mismatches: u64,
    /// Connections that failed (the first messages are in `error_messages`).
    pub errors: u64,
    /// The first errors.
    pub error_messages: Vec<String>,
    /// Wall time, first record to last echo.
    pub elapsed: Duration,
    /// Round-trip times, sealing to the echo opened.
    pub latency: Summary,
    /// Server CPU time during the run.
    pub server_cpu: Option<Duration>,
    /// What each of the server's backends served during the run.
    pub served: Vec<Served>,
    /// The server's selection (policy or forced backend).
    pub selection: String,
}

impl RecordPoint {
    /// Thousands of records per second.
    pub fn kpps(&self) -> f64 {
        self.records as f64 / self.elapsed.as_secs_f64().max(1e-9) / 1e3
    }

    /// Plaintext megabytes per second (one way).
    pub fn mb_per_s(&self) -> f64 {
        self.records as f64 * self.size as f64 / self.elapsed.as_secs_f64().max(1e-9) / 1e6
    }

    /// Whether every echo matched and no connection failed.
    pub fn is_clean(&self) -> bool {
        self.mismatches == 0 && self.errors == 0
    }
}

/// One connection's results.
#[derive(Default)]
struct Conn {
    records: u64,
    mismatches: u64,
    latencies: Latencies,
}

/// Runs one measurement: every connection sends for the duration (or its
/// record count), then sends STATS as a fence, and counts the echoes that
/// come back before it: a connection whose echoes are fewer than the
/// records it sent counts as failed.
///
/// # Errors
/// [`RecordLoadError::NotLoopback`], [`RecordLoadError::Size`],
/// [`RecordLoadError::Record`] if STATS before the run fails. A connection
/// that fails later is counted in the report's errors.
///
/// # Cancel safety
/// Cancel safe: dropping it drops the connections.
pub async fn run(
    config: &RecordLoadConfig,
    offload: &Offload,
) -> Result<RecordPoint, RecordLoadError> {
    if !config.addr.ip().is_loopback() {
        return Err(RecordLoadError::NotLoopback(config.addr));
    }
    if config.size > MAX_PAYLOAD {
        return Err(RecordLoadError::Size(config.size));
    }
    let before = client::stats(config.addr).await?;
    let started = Instant::now();
    let deadline = started + config.duration;
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..config.connections.max(1) {
        let config = config.clone();
        let offload = offload.clone();
        let seed = pattern::seed(config.seed, c as u64, u64::MAX);
        tasks.spawn(async move { connection(&config, &offload, seed, deadline).await });
    }
    let mut point = RecordPoint {
        size: config.size,
        connections: config.connections.max(1),
        ..RecordPoint::default()
    };
    let mut latencies = Latencies::default();
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok(Ok(c)) => {
                point.records += c.records;
                point.mismatches += c.mismatches;
                latencies.merge(c.latencies);
            }
            Ok(Err(e)) => {
                point.errors += 1;
                if point.error_messages.len() < 5 {
                    point.error_messages.push(e.to_string());
                }
            }
            Err(e) => {
                point.errors += 1;
                point.error_messages.push(e.to_string());
            }
        }
    }
    point.elapsed = started.elapsed();
    point.latency = latencies.summary();
    match client::stats(config.addr).await {
        Ok(after) => {
            point.server_cpu = Some(Duration::from_nanos(
                after.cpu_ns.saturating_sub(before.cpu_ns),
            ));
            point.served = served_since(&before.backends, &after.backends);
            point.selection = after.selection;
        }
        Err(_) => point.selection = before.selection,
    }
    Ok(point)
}

/// One connection of a measurement: a task sealing and sending, this one
/// opening and checking.
///
/// # Cancel safety
/// Cancel safe: dropping it drops the receiving half; the sending task runs
/// on to its deadline or record count, then ends.
async fn connection(
    config: &RecordLoadConfig,
    offload: &Offload,
    seed: u64,
    deadline: Instant,
) -> Result<Conn, RecordError> {
    let (mut tx, mut rx) = client::connect(config.addr, offload, config.psk.as_deref()).await?;
    let window = Arc::new(Semaphore::new(config.window.max(1)));
    let sent_at: Arc<Mutex<VecDeque<Instant>>> = Arc::default();
    let size = config.size;
    let limit = config.records;
    let sending = {
        let window = window.clone();
        let sent_at = sent_at.clone();
        tokio::spawn(async move {
            let mut sent = 0u64;
            while Instant::now() < deadline && limit.is_none_or(|l| sent < l) {
                // Send what is queued before waiting for room in the window.
                let permit = match window.try_acquire() {
                    Ok(p) => p,
                    Err(_) => {
                        tx.flush().await?;
                        let Ok(p) = window.acquire().await else { break };
                        p
                    }
                };
                permit.forget();
                sent += 1;
                let mut payload = vec![0u8; size];
                pattern::fill(&mut payload, pattern::seed(seed, sent, 0));
                sent_at
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push_back(Instant::now());
                tx.send(payload).await?;
            }
            // The server answers in order: its STATS reply comes after the
            // last echo.
            tx.request_stats().await?;
            tx.flush().await?;
            Ok::<_, RecordError>((tx, sent))
        })
    };
    let mut out = Conn::default();
    let result = loop {
        match rx.recv().await {
            Ok(Some(Received::Data(plain))) => {
                let t0 = sent_at
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .pop_front();
                if let Some(t0) = t0 {
                    out.latencies.record(t0.elapsed());
                }
                out.records += 1;
                if !pattern::matches(&plain, pattern::seed(seed, out.records, 0)) {
                    out.mismatches += 1;
                }
                window.add_permits(1);
            }
            Ok(Some(Received::Stats(_))) => break Ok(()),
            Ok(Some(Received::Alert { message, .. })) => {
                break Err(RecordError::BadRecord(format!("alert: {message}")));
            }
            Ok(None) => break Err(RecordError::BadRecord("the server closed".into())),
            Err(e) => break Err(e),
        }
    };
    window.close();
    let sent = sending.await;
    result?;
    match sent {
        // Every record sent must have come back before the fence.
        Ok(Ok((_tx, sent))) if sent != out.records => Err(RecordError::BadRecord(format!(
            "{sent} records sent, {} echoed before the STATS reply",
            out.records
        ))),
        Ok(Ok(_)) => Ok(out),
        Ok(Err(e)) => Err(e),
        Err(e) => Err(RecordError::BadRecord(format!("sender: {e}"))),
    }
}
