//! A block store client: one TCP connection carrying many requests at once,
//! matched to their responses by id.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::io::BufReader;
use tokio::net::TcpStream;
use tokio::net::tcp::OwnedReadHalf;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use super::protocol::{
    BlockStats, MAX_RESPONSE, Request, Response, ResponseError, Status, decode_response,
};
use crate::wire::{read_body, read_header, write_frames};

/// What a client call can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The connection could not be made.
    #[error("cannot connect to {addr}")]
    Connect {
        /// The server's address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The connection is gone (the server closed it, or died).
    #[error("the connection closed")]
    Closed,
    /// The server answered with an error.
    #[error("server said {status:?}: {message}")]
    Server {
        /// The status.
        status: Status,
        /// Its message.
        message: String,
    },
    /// A response the client cannot read.
    #[error(transparent)]
    Response(#[from] ResponseError),
    /// STATS was not the JSON expected.
    #[error("STATS: {0}")]
    Stats(#[from] serde_json::Error),
}

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Response>>>>;

/// A connection to a block server. Calls take `&self`: share it between
/// tasks to keep several requests in flight on one connection.
#[derive(Debug)]
pub struct BlockClient {
    frames: mpsc::Sender<Vec<u8>>,
    pending: Pending,
    closed: Arc<AtomicBool>,
    next_id: AtomicU64,
    reading: JoinHandle<()>,
    writing: JoinHandle<()>,
}

impl Drop for BlockClient {
    fn drop(&mut self) {
        self.reading.abort();
        self.writing.abort();
    }
}

impl BlockClient {
    /// Connects to the server at `addr`.
    ///
    /// # Errors
    /// [`ClientError::Connect`].
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped connect leaves nothing behind.
    pub async fn connect(addr: SocketAddr) -> Result<Self, ClientError> {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|source| ClientError::Connect { addr, source })?;
        let _ = stream.set_nodelay(true);
        let (reader, writer) = stream.into_split();
        let (frames, queued) = mpsc::channel(1024);
        let pending: Pending = Arc::default();
        let closed = Arc::new(AtomicBool::new(false));
        let reading = tokio::spawn(read_responses(reader, pending.clone(), closed.clone()));
        let writing = tokio::spawn(write_frames(writer, queued));
        Ok(BlockClient {
            frames,
            pending,
            closed,
            next_id: AtomicU64::new(1),
            reading,
            writing,
        })
    }

    /// Sends `request` and waits for its response, whatever its status.
    ///
    /// # Errors
    /// [`ClientError::Closed`] if the connection is gone.
    ///
    /// # Cancel safety
    /// Cancel safe: the request is sent whole or not at all; a response
    /// that comes after the future was dropped is thrown away.
    pub async fn call(&self, request: &Request) -> Result<Response, ClientError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut frame = Vec::new();
        request.encode(id, &mut frame);
        self.call_frame(id, frame).await
    }

    /// Sends raw bytes (anything: the tests' bad frames) and waits for the
    /// response carrying `id`.
    ///
    /// # Errors
    /// As for [`call`](Self::call).
    ///
    /// # Cancel safety
    /// As for [`call`](Self::call).
    pub async fn call_frame(&self, id: u64, frame: Vec<u8>) -> Result<Response, ClientError> {
        let (tx, rx) = oneshot::channel();
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, tx);
        // The reader sets `closed` before it drops the waiters: a waiter
        // added after that would wait for ever.
        if self.closed.load(Ordering::Acquire) {
            self.forget(id);
            return Err(ClientError::Closed);
        }
        if self.frames.send(frame).await.is_err() {
            self.forget(id);
            return Err(ClientError::Closed);
        }
        rx.await.map_err(|_| ClientError::Closed)
    }

    /// Whether the connection has ended (the server closed it, or died).
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    fn forget(&self, id: u64) {
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id);
    }

    /// Like [`call`](Self::call), with any status but OK an error.
    ///
    /// # Errors
    /// [`ClientError::Server`] for an error status; [`ClientError::Closed`].
    ///
    /// # Cancel safety
    /// As for [`call`](Self::call).
    pub async fn ok(&self, request: &Request) -> Result<Vec<u8>, ClientError> {
        let response = self.call(request).await?;
        match response.status {
            Status::Ok => Ok(response.payload),
            status => Err(ClientError::Server {
                status,
                message: String::from_utf8_lossy(&response.payload).into_owned(),
            }),
        }
    }

    /// Writes block `block`.
    ///
    /// # Errors
    /// As for [`ok`](Self::ok).
    ///
    /// # Cancel safety
    /// As for [`call`](Self::call): a dropped write may or may not happen.
    pub async fn write(&self, block: u64, data: Vec<u8>) -> Result<(), ClientError> {
        self.ok(&Request::Write { block, data }).await.map(drop)
    }

    /// Reads block `block`.
    ///
    /// # Errors
    /// As for [`ok`](Self::ok); a corrupt block is
    /// `ClientError::Server { status: Status::Corrupt, .. }`.
    ///
    /// # Cancel safety
    /// As for [`call`](Self::call).
    pub async fn read(&self, block: u64) -> Result<Vec<u8>, ClientError> {
        self.ok(&Request::Read { block }).await
    }

    /// Makes every acknowledged write durable.
    ///
    /// # Errors
    /// As for [`ok`](Self::ok).
    ///
    /// # Cancel safety
    /// As for [`call`](Self::call).
    pub async fn flush(&self) -> Result<(), ClientError> {
        self.ok(&Request::Flush).await.map(drop)
    }

    /// The server's counters.
    ///
    /// # Errors
    /// As for [`ok`](Self::ok); [`ClientError::Stats`].
    ///
    /// # Cancel safety
    /// As for [`call`](Self::call).
    pub async fn stats(&self) -> Result<BlockStats, ClientError> {
        Ok(serde_json::from_slice(&self.ok(&Request::Stats).await?)?)
    }
}

/// Reads responses and hands each to the call waiting for its id. When the
/// connection ends, every waiting call gets [`ClientError::Closed`].
///
/// # Cancel safety
/// Runs as the connection's own task; aborting it closes the connection
/// for every call (they get [`ClientError::Closed`]).
async fn read_responses(reader: OwnedReadHalf, pending: Pending, closed: Arc<AtomicBool>) {
    let mut reader = BufReader::with_capacity(64 * 1024, reader);
    loop {
        let Ok(Some(header)) = read_header::<_, 4>(&mut reader).await else {
            break;
        };
        let len = u32::from_be_bytes(header) as usize;
        if len > MAX_RESPONSE {
            tracing::warn!(len, "oversize response: closing");
            break;
        }
        let Ok(body) = read_body(&mut reader, len).await else {
            break;
        };
        match decode_response(body) {
            // Refused at the server's connection limit: every call gets the
            // refusal (`ClientError::Server` with `Status::Busy`).
            Ok(response) if response.status == Status::Busy => {
                tracing::warn!(?response, "the server is busy: closing");
                let waiters: Vec<_> = pending
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .drain()
                    .collect();
                for (_, waiter) in waiters {
                    let _ = waiter.send(response.clone());
                }
                break;
            }
            Ok(response) => {
                let waiter = pending
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&response.id);
                match waiter {
                    Some(w) => {
                        let _ = w.send(response);
                    }
                    None => tracing::debug!(?response, "response nobody waits for"),
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "bad response: closing");
                break;
            }
        }
    }
    closed.store(true, Ordering::Release);
    pending
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clear();
}
