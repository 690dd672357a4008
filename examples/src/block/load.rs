//! The block store's load generator: `connections × depth` lanes, each
//! keeping one request in flight on blocks of its own, so that what every
//! block must hold is known exactly and each read is checked against it.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::client::{BlockClient, ClientError};
use super::protocol::BlockStats;
use crate::backends::{Served, format_served, served_since};
use crate::latency::{Latencies, Summary};
use crate::pattern::{self, SplitMix};

/// What to run.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    /// The server (a loopback address).
    pub addr: SocketAddr,
    /// TCP connections.
    pub connections: usize,
    /// Requests in flight on each connection.
    pub depth: usize,
    /// Stop after this many requests in all (`None`: only the time bounds it).
    pub requests: Option<u64>,
    /// Stop after this long.
    pub duration: Duration,
    /// Percent of requests that read back a block this run has written (the
    /// rest write; until a lane has written a block, it only writes).
    pub read_percent: u32,
    /// Percent of requests on a random block (the rest go through the
    /// blocks in order: a lane's own blocks for writes, the ones it has
    /// written for reads).
    pub random_percent: u32,
    /// Seed of the data and of the choices.
    pub seed: u64,
    /// Use only the first `blocks` blocks of the volume (`None`: all).
    pub blocks: Option<u64>,
}

impl LoadConfig {
    /// 4 connections × 8, half reads, half random, 5 s, against `addr`.
    pub fn new(addr: SocketAddr) -> Self {
        LoadConfig {
            addr,
            connections: 4,
            depth: 8,
            requests: None,
            duration: Duration::from_secs(5),
            read_percent: 50,
            random_percent: 50,
            seed: pattern::random_u64(),
            blocks: None,
        }
    }
}

/// Why a load run could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// Load goes to this machine only.
    #[error("{0} is not a loopback address: the load generator only targets this machine")]
    NotLoopback(SocketAddr),
    /// No connection, or no STATS at the start.
    #[error(transparent)]
    Client(#[from] ClientError),
}

/// What a block must hold: the version last acknowledged, and one a write
/// may have left if it was in flight when the run stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Expect {
    /// Last acknowledged version (0: none; the block reads as zeros).
    pub acked: u64,
    /// A version written but not acknowledged.
    pub pending: Option<u64>,
}

/// Every block a run wrote and what it must hold.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    /// The run's seed (the data of each version derives from it).
    pub seed: u64,
    /// Bytes per block.
    pub block_size: usize,
    /// Per block.
    pub blocks: BTreeMap<u64, Expect>,
}

/// The result of checking a ledger against the server.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verified {
    /// Blocks read back.
    pub checked: u64,
    /// Blocks whose content was a version the ledger allows.
    pub intact: u64,
    /// Blocks that were not (block, what was found).
    pub lost: Vec<(u64, String)>,
}

impl Ledger {
    /// The content of `version` of `block` (zeros for version 0).
    pub fn content(&self, block: u64, version: u64) -> Vec<u8> {
        let mut data = vec![0u8; self.block_size];
        if version > 0 {
            pattern::fill(&mut data, pattern::seed(self.seed, block, version));
        }
        data
    }

    /// Whether `data` is a version of `block` the ledger allows.
    pub fn allows(&self, block: u64, data: &[u8]) -> bool {
        let e = self.blocks.get(&block).copied().unwrap_or_default();
        let is = |v: u64| {
            if v == 0 {
                data.iter().all(|&b| b == 0)
            } else {
                pattern::matches(data, pattern::seed(self.seed, block, v))
            }
        };
        data.len() == self.block_size && (is(e.acked) || e.pending.is_some_and(is))
    }

    /// Reads every block in the ledger back through `client` and checks it
    /// (after a crash: every acknowledged write must be there).
    ///
    /// # Errors
    /// [`ClientError::Closed`] if the connection goes.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn verify(&self, client: &BlockClient) -> Result<Verified, ClientError> {
        let mut v = Verified::default();
        for &block in self.blocks.keys() {
            v.checked += 1;
            match client.read(block).await {
                Ok(data) if self.allows(block, &data) => v.intact += 1,
                Ok(_) => v.lost.push((block, "other data".into())),
                Err(ClientError::Closed) => return Err(ClientError::Closed),
                Err(e) => v.lost.push((block, e.to_string())),
            }
        }
        Ok(v)
    }
}

/// What a run did.
#[derive(Debug, Clone, Default)]
pub struct LoadReport {
    /// The configuration's summary line.
    pub config: String,
    /// Wall time.
    pub elapsed: Duration,
    /// Blocks written (acknowledged).
    pub writes: u64,
    /// Blocks read and checked.
    pub reads: u64,
    /// Reads whose data was not what was written.
    pub mismatches: u64,
    /// Requests that failed (the first few messages are in `error_messages`).
    pub errors: u64,
    /// The first errors.
    pub error_messages: Vec<String>,
    /// Request latencies.
    pub latency: Summary,
    /// Bytes per block.
    pub block_size: usize,
    /// Server CPU time during the run (from STATS before and after).
    pub server_cpu: Option<Duration>,
    /// What each of the server's backends served during the run.
    pub served: Vec<Served>,
    /// The server's selection (policy or forced backend).
    pub selection: String,
    /// Every block written and what it must hold.
    pub ledger: Ledger,
}

impl LoadReport {
    /// Requests per second.
    pub fn iops(&self) -> f64 {
        (self.writes + self.reads) as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Block bytes moved per second, in MB/s.
    pub fn mb_per_s(&self) -> f64 {
        self.iops() * self.block_size as f64 / 1e6
    }

    /// Whether every request succeeded and every read matched.
    pub fn is_clean(&self) -> bool {
        self.mismatches == 0 && self.errors == 0
    }
}

impl fmt::Display for LoadReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}; server {}", self.config, self.selection)?;
        writeln!(
            f,
            "{:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>11}",
            "writes", "reads", "IOPS", "MB/s", "p50 µs", "p99 µs", "max µs", "server CPU"
        )?;
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        writeln!(
            f,
            "{:>9} {:>9} {:>9.0} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>11}",
            self.writes,
            self.reads,
            self.iops(),
            self.mb_per_s(),
            us(self.latency.p50),
            us(self.latency.p99),
            us(self.latency.max),
            self.server_cpu.map_or("?".to_owned(), |c| format!(
                "{:.2} s ({:.0}%, {:.0} µs/req)",
                c.as_secs_f64(),
                100.0 * c.as_secs_f64() / self.elapsed.as_secs_f64().max(1e-9),
                c.as_secs_f64() * 1e6 / ((self.writes + self.reads) as f64).max(1.0)
            )),
        )?;
        writeln!(f, "server backends: {}", format_served(&self.served))?;
        write!(
            f,
            "verified {} reads: {} mismatches, {} errors",
            self.reads, self.mismatches, self.errors
        )?;
        for m in &self.error_messages {
            write!(f, "\n  error: {m}")?;
        }
        Ok(())
    }
}

/// What a lane hands back.
#[derive(Default)]
struct Lane {
    writes: u64,
    reads: u64,
    mismatches: u64,
    errors: u64,
    messages: Vec<String>,
    latencies: Latencies,
    blocks: BTreeMap<u64, Expect>,
}

impl Lane {
    fn error(&mut self, message: String) {
        self.errors += 1;
        if self.messages.len() < 3 {
            self.messages.push(message);
        }
    }
}

/// Shared by the lanes: the request budget and the stop.
struct Budget {
    limit: Option<u64>,
    issued: AtomicU64,
    deadline: Instant,
    stop: Arc<AtomicBool>,
}

impl Budget {
    fn take(&self) -> bool {
        if self.stop.load(Ordering::Relaxed) || Instant::now() >= self.deadline {
            return false;
        }
        match self.limit {
            None => true,
            Some(limit) => self.issued.fetch_add(1, Ordering::Relaxed) < limit,
        }
    }
}

/// Runs the load and reports. Stops at the request count, the time, when
/// `stop` turns true, or when the server goes away (the report then says
/// so in its errors, and its ledger still holds every acknowledged write).
///
/// # Errors
/// [`LoadError::NotLoopback`]; [`LoadError::Client`] if the first
/// connection or its STATS fails.
///
/// # Cancel safety
/// Cancel safe: dropping it drops the connections; writes in flight may or
/// may not happen.
pub async fn run(config: &LoadConfig, stop: Arc<AtomicBool>) -> Result<LoadReport, LoadError> {
    if !config.addr.ip().is_loopback() {
        return Err(LoadError::NotLoopback(config.addr));
    }
    let mut clients = Vec::new();
    for _ in 0..config.connections.max(1) {
        clients.push(Arc::new(BlockClient::connect(config.addr).await?));
    }
    let before: BlockStats = clients[0].stats().await?;
    let block_size = before.block_size;
    let blocks = config
        .blocks
        .map_or(before.blocks, |b| b.min(before.blocks));
    let depth = config.depth.max(1);
    let lanes = (clients.len() * depth) as u64;
    let budget = Arc::new(Budget {
        limit: config.requests,
        issued: AtomicU64::new(0),
        deadline: Instant::now() + config.duration,
        stop,
    });
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for lane in 0..lanes {
        let client = clients[(lane as usize) % clients.len()].clone();
        let budget = budget.clone();
        let ledger = Ledger {
            seed: config.seed,
            block_size,
            blocks: BTreeMap::new(),
        };
        let config = config.clone();
        tasks.spawn(run_lane(
            client, lane, lanes, blocks, ledger, config, budget,
        ));
    }
    let mut report = LoadReport {
        config: format!(
            "{} connections × {depth} deep, {}% reads, {}% random, {blocks} blocks of {block_size} B",
            clients.len(),
            config.read_percent.min(100),
            config.random_percent.min(100),
        ),
        block_size,
        ledger: Ledger {
            seed: config.seed,
            block_size,
            blocks: BTreeMap::new(),
        },
        ..LoadReport::default()
    };
    let mut latencies = Latencies::default();
    while let Some(lane) = tasks.join_next().await {
        let Ok(lane) = lane else { continue };
        report.writes += lane.writes;
        report.reads += lane.reads;
        report.mismatches += lane.mismatches;
        report.errors += lane.errors;
        for m in lane.messages {
            if report.error_messages.len() < 5 {
                report.error_messages.push(m);
            }
        }
        latencies.merge(lane.latencies);
        report.ledger.blocks.extend(lane.blocks);
    }
    report.elapsed = started.elapsed();
    report.latency = latencies.summary();
    if let Ok(after) = clients[0].stats().await {
        report.server_cpu = Some(Duration::from_nanos(
            after.cpu_ns.saturating_sub(before.cpu_ns),
        ));
        report.served = served_since(&before.backends, &after.backends);
        report.selection = after.selection;
    } else {
        report.selection = before.selection;
    }
    Ok(report)
}

/// One lane: one request at a time on the blocks `lane`, `lane + lanes`, …
///
/// # Cancel safety
/// Cancel safe: a dropped lane loses its counts; a write in flight may or
/// may not happen.
async fn run_lane(
    client: Arc<BlockClient>,
    lane: u64,
    lanes: u64,
    blocks: u64,
    ledger: Ledger,
    config: LoadConfig,
    budget: Arc<Budget>,
) -> Lane {
    let mut out = Lane::default();
    // This lane's blocks: lane, lane + lanes, lane + 2·lanes, …
    let owned = if lane < blocks {
        (blocks - lane).div_ceil(lanes)
    } else {
        0
    };
    if owned == 0 {
        return out;
    }
    let mut rng = SplitMix::new(pattern::seed(config.seed, lane, u64::MAX));
    let mut cursor = rng.below(owned);
    let mut read_cursor = 0;
    let mut ledger = ledger;
    // The lane's blocks written so far (as `k`), the ones it can read back.
    let mut written: Vec<u64> = Vec::new();
    let random = |rng: &mut SplitMix| rng.below(100) < u64::from(config.random_percent);
    while budget.take() {
        let read = !written.is_empty() && rng.below(100) < u64::from(config.read_percent);
        let k = if read {
            let n = written.len() as u64;
            let i = if random(&mut rng) {
                rng.below(n)
            } else {
                read_cursor = (read_cursor + 1) % n;
                read_cursor
            };
            written[i as usize]
        } else if random(&mut rng) {
            rng.below(owned)
        } else {
            cursor = (cursor + 1) % owned;
            cursor
        };
        let block = lane + k * lanes;
        let expect = ledger.blocks.get(&block).copied().unwrap_or_default();
        let started = Instant::now();
        if read {
            match client.read(block).await {
                Ok(data) => {
                    out.latencies.record(started.elapsed());
                    out.reads += 1;
                    if !ledger.allows(block, &data) {
                        out.mismatches += 1;
                        out.error(format!("block {block}: read back other data than written"));
                    }
                }
                Err(ClientError::Closed) => {
                    out.error(format!("block {block}: READ: the connection closed"));
                    break;
                }
                Err(e) => out.error(format!("block {block}: READ: {e}")),
            }
        } else {
            let version = expect.acked.max(expect.pending.unwrap_or(0)) + 1;
            let data = ledger.content(block, version);
            ledger.blocks.insert(
                block,
                Expect {
                    acked: expect.acked,
                    pending: Some(version),
                },
            );
            match client.write(block, data).await {
                Ok(()) => {
                    out.latencies.record(started.elapsed());
                    out.writes += 1;
                    if expect.acked == 0 {
                        written.push(k);
                    }
                    ledger.blocks.insert(
                        block,
                        Expect {
                            acked: version,
                            pending: None,
                        },
                    );
                }
                Err(ClientError::Closed) => {
                    out.error(format!("block {block}: WRITE: the connection closed"));
                    break;
                }
                // It failed on the server: it may still have landed.
                Err(e) => out.error(format!("block {block}: WRITE: {e}")),
            }
        }
    }
    out.blocks = ledger.blocks;
    out
}
