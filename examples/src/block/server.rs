//! The block server: one task per connection reading frames, one task per
//! request (up to a bound per connection, so a client cannot queue without
//! limit), and one task writing responses in the order they finish. At most
//! [`Limits::max_connections`] connections at once, each closed once it has
//! sent no whole request for [`Limits::idle_timeout`].
//!
//! It authenticates no one: anyone who can connect reads and writes every
//! block. Listen on loopback, or put an authenticated transport in front.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncRead, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::task::JoinSet;
use tracing::Instrument;

use super::protocol::{
    BlockStats, FrameError, Request, Status, decode_request, encode_response, max_request,
};
use super::volume::{Volume, VolumeError};
use crate::backends::Offloads;
use crate::lifecycle::{Limits, accept_until, process_cpu_ns, refuse_with, stopped};
use crate::wire::{discard, read_body, read_header, write_frames};

/// Requests one connection may have in flight by default.
pub const MAX_IN_FLIGHT: usize = 64;

/// How a block server treats its connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockServerConfig {
    /// Requests each connection may have in flight.
    pub max_in_flight: usize,
    /// Connections at once, and the idle timeout.
    pub limits: Limits,
}

impl Default for BlockServerConfig {
    /// [`MAX_IN_FLIGHT`] and the default [`Limits`].
    fn default() -> Self {
        BlockServerConfig {
            max_in_flight: MAX_IN_FLIGHT,
            limits: Limits::default(),
        }
    }
}

#[derive(Debug, Default)]
struct Counters {
    writes: AtomicU64,
    reads: AtomicU64,
    flushes: AtomicU64,
    bad_frames: AtomicU64,
    corrupt: AtomicU64,
    failed: AtomicU64,
    refused: AtomicU64,
    idle_closed: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// A block server over one volume.
#[derive(Debug)]
pub struct BlockServer {
    volume: Volume,
    offloads: Offloads,
    counters: Counters,
    max_in_flight: usize,
    limits: Limits,
}

/// What a connection's reader got.
enum Frame {
    /// A request body, to decode.
    Body(Vec<u8>),
    /// A frame longer than any request, thrown away: its claimed length.
    Oversize(u64),
}

impl BlockServer {
    /// A server for `volume`, whose sessions were opened on `offloads`
    /// (for STATS), treating connections as `config` says.
    pub fn new(volume: Volume, offloads: Offloads, config: BlockServerConfig) -> Arc<Self> {
        Arc::new(BlockServer {
            volume,
            offloads,
            counters: Counters::default(),
            max_in_flight: config.max_in_flight.max(1),
            limits: config.limits,
        })
    }

    /// The volume.
    pub fn volume(&self) -> &Volume {
        &self.volume
    }

    /// The counters STATS returns.
    pub fn stats(&self) -> BlockStats {
        let c = &self.counters;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let geometry = self.volume.geometry();
        let opened = self.volume.opened();
        BlockStats {
            block_size: geometry.block_size,
            blocks: geometry.blocks,
            writes: load(&c.writes),
            reads: load(&c.reads),
            flushes: load(&c.flushes),
            bad_frames: load(&c.bad_frames),
            corrupt: load(&c.corrupt),
            failed: load(&c.failed),
            refused: load(&c.refused),
            idle_closed: load(&c.idle_closed),
            torn_discarded: opened.torn_discarded,
            opened_clean: opened.clean,
            cpu_ns: process_cpu_ns(),
            selection: self.offloads.selection(),
            backends: self.offloads.served(),
        }
    }

    /// Accepts connections on `listener` until `shutdown` turns true (or
    /// its sender is dropped), then stops reading, lets every request in
    /// flight finish and its response go out, and returns. Close the
    /// volume after it ([`BlockServer::close`]). A connection beyond the
    /// limit gets a BUSY response and is closed.
    ///
    /// # Errors
    /// Accepting failed.
    ///
    /// # Cancel safety
    /// Dropping the future drops the connections (their requests in flight
    /// still finish, each on its own task) without marking the volume
    /// closed: the next open then recovers it as after a crash.
    pub async fn serve(
        self: &Arc<Self>,
        listener: TcpListener,
        shutdown: watch::Receiver<bool>,
    ) -> io::Result<()> {
        let max = self.limits.max_connections;
        let mut busy = Vec::new();
        let message = format!("busy: this server takes {max} connections at once");
        encode_response(0, Status::Busy, message.as_bytes(), &mut busy);
        accept_until(
            listener,
            shutdown.clone(),
            max,
            |stream| {
                bump(&self.counters.refused);
                refuse_with(stream, &busy);
            },
            |stream| self.clone().connection(stream, shutdown.clone()),
        )
        .await
    }

    /// Marks the volume closed cleanly, once [`serve`](Self::serve) has
    /// returned. If the server is still shared, the volume is only flushed
    /// and stays marked in use.
    ///
    /// # Errors
    /// [`VolumeError::Io`].
    ///
    /// # Cancel safety
    /// As for [`Volume::close`].
    pub async fn close(self: Arc<Self>) -> Result<(), VolumeError> {
        match Arc::try_unwrap(self) {
            Ok(server) => server.volume.close().await,
            Err(shared) => shared.volume.flush().await,
        }
    }

    /// Serves one connection until the peer closes it, sends no whole
    /// request within the idle timeout, or shutdown: every request read is
    /// answered before the connection closes.
    ///
    /// # Cancel safety
    /// Dropping the future stops reading and drops the connection; requests
    /// already running finish on their own tasks (their responses are lost).
    async fn connection(self: Arc<Self>, stream: TcpStream, mut shutdown: watch::Receiver<bool>) {
        let _ = stream.set_nodelay(true);
        let block_size = self.volume.geometry().block_size;
        let max = max_request(block_size);
        let (reader, writer) = stream.into_split();
        let mut reader = BufReader::with_capacity(64 * 1024, reader);
        let (responses, queued) = mpsc::channel(self.max_in_flight + 8);
        let writing = tokio::spawn(write_frames(writer, queued).in_current_span());
        let slots = Arc::new(Semaphore::new(self.max_in_flight));
        let mut requests = JoinSet::new();
        loop {
            let slot = tokio::select! {
                s = slots.clone().acquire_owned() => s,
                () = stopped(&mut shutdown) => break,
            };
            let Ok(slot) = slot else { break };
            // The idle clock runs while the server waits for the next whole
            // frame, not while the client waits for its answers: a frame
            // trickled in a byte at a time is cut off too.
            let idle = self.limits.idle_timeout;
            let frame = tokio::select! {
                f = tokio::time::timeout(idle, next_frame(&mut reader, max)) => f,
                () = stopped(&mut shutdown) => break,
            };
            let frame = match frame {
                Err(_) => {
                    bump(&self.counters.idle_closed);
                    tracing::debug!(?idle, "no whole request within the idle timeout: closing");
                    break;
                }
                Ok(Ok(Some(frame))) => frame,
                Ok(Ok(None)) => break,
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "connection ended inside a frame");
                    break;
                }
            };
            let body = match frame {
                Frame::Body(body) => body,
                Frame::Oversize(len) => {
                    self.refuse(&responses, 0, FrameError::Oversize { len, max })
                        .await;
                    continue;
                }
            };
            match decode_request(body, block_size) {
                Err((id, why)) => self.refuse(&responses, id, why).await,
                Ok((id, request)) => {
                    let span = tracing::debug_span!("request", id, request = ?request);
                    let server = self.clone();
                    let responses = responses.clone();
                    requests.spawn(
                        async move {
                            let frame = server.handle(id, request).await;
                            let _ = responses.send(frame).await;
                            drop(slot);
                        }
                        .instrument(span),
                    );
                }
            }
            while requests.try_join_next().is_some() {}
        }
        while requests.join_next().await.is_some() {}
        drop(responses);
        let _ = writing.await;
    }

    /// Counts and answers a refused frame.
    ///
    /// # Cancel safety
    /// Cancel safe: the error response is queued whole or not at all.
    async fn refuse(&self, responses: &mpsc::Sender<Vec<u8>>, id: u64, why: FrameError) {
        bump(&self.counters.bad_frames);
        tracing::debug!(id, %why, "refused");
        let mut frame = Vec::new();
        encode_response(id, Status::BadFrame, why.to_string().as_bytes(), &mut frame);
        let _ = responses.send(frame).await;
    }

    /// Runs one request; the response frame.
    ///
    /// # Cancel safety
    /// As for the [`Volume`] request it runs: a dropped write may or may not
    /// have happened.
    async fn handle(&self, id: u64, request: Request) -> Vec<u8> {
        let c = &self.counters;
        let result: Result<Vec<u8>, VolumeError> = match request {
            Request::Write { block, data } => self.volume.write(block, data).await.map(|()| {
                bump(&c.writes);
                Vec::new()
            }),
            Request::Read { block } => self.volume.read(block).await.inspect(|_| bump(&c.reads)),
            Request::Flush => self.volume.flush().await.map(|()| {
                bump(&c.flushes);
                Vec::new()
            }),
            Request::Stats => Ok(serde_json::to_vec(&self.stats()).unwrap_or_default()),
        };
        let mut frame = Vec::new();
        match result {
            Ok(payload) => encode_response(id, Status::Ok, &payload, &mut frame),
            Err(e) => {
                let status = match &e {
                    VolumeError::OutOfRange { .. } => Status::OutOfRange,
                    VolumeError::BlockLength { .. } => Status::BadFrame,
                    VolumeError::Corrupt { .. } => {
                        bump(&c.corrupt);
                        tracing::warn!(error = %e, "corrupt block");
                        Status::Corrupt
                    }
                    _ => {
                        bump(&c.failed);
                        tracing::warn!(error = %e, "request failed");
                        Status::Failed
                    }
                };
                encode_response(id, status, e.to_string().as_bytes(), &mut frame);
            }
        }
        frame
    }
}

/// Reads the next frame: its body, or, for a frame longer than `max`, its
/// length once the body has been thrown away. `None` at a clean end.
///
/// # Errors
/// The stream ended inside a frame; any read error.
///
/// # Cancel safety
/// Not cancel safe: a frame partly read is lost, and the stream is out of
/// step; the caller drops the connection.
async fn next_frame<R: AsyncRead + Unpin>(reader: &mut R, max: usize) -> io::Result<Option<Frame>> {
    let Some(header) = read_header::<_, 4>(reader).await? else {
        return Ok(None);
    };
    let len = u64::from(u32::from_be_bytes(header));
    if len > max as u64 {
        discard(reader, len).await?;
        return Ok(Some(Frame::Oversize(len)));
    }
    Ok(Some(Frame::Body(read_body(reader, len as usize).await?)))
}
