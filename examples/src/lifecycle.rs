//! What both servers share about starting and stopping: where they may
//! listen, how many connections they serve and for how long they wait on
//! an idle one, the shutdown signal, accept errors that leave the listener
//! usable, and the process's CPU time for STATS.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tracing::Instrument;

/// Why an address was refused for `--listen`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ListenError {
    /// Not `IP:PORT`.
    #[error("{0:?} is not an address and port, such as 127.0.0.1:7700")]
    Parse(String),
    /// Not on this machine only.
    #[error(
        "{0} is not a loopback address: --listen serves this machine only; \
         --insecure-listen {0} listens there, open to anyone who can reach it"
    )]
    NotLoopback(SocketAddr),
}

/// The value parser of `--listen`: a loopback address (127.0.0.0/8, `::1`,
/// or `::ffff:127.x.y.z`), nothing else.
///
/// # Errors
/// [`ListenError::Parse`], [`ListenError::NotLoopback`].
pub fn loopback(s: &str) -> Result<SocketAddr, ListenError> {
    let addr: SocketAddr = s.parse().map_err(|_| ListenError::Parse(s.to_owned()))?;
    if addr.ip().to_canonical().is_loopback() {
        Ok(addr)
    } else {
        Err(ListenError::NotLoopback(addr))
    }
}

/// How many connections a server serves at once and how long it waits for
/// a request: the `--max-connections` and `--idle-timeout` flags.
#[derive(clap::Args, Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once; one more is refused (an error frame,
    /// then closed) and counted, never queued.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,
    /// Seconds a connection may take to send its next whole request (or
    /// record) before it is closed.
    #[arg(long = "idle-timeout", value_name = "SECS", default_value = "60", value_parser = seconds)]
    pub idle_timeout: Duration,
}

impl Default for Limits {
    /// 256 connections, 60 s.
    fn default() -> Self {
        Limits {
            max_connections: 256,
            idle_timeout: Duration::from_secs(60),
        }
    }
}

/// A positive number of seconds.
fn seconds(s: &str) -> Result<Duration, String> {
    match s.parse::<f64>().map(Duration::try_from_secs_f64) {
        Ok(Ok(d)) if !d.is_zero() => Ok(d),
        _ => Err(format!("{s:?} is not a positive number of seconds")),
    }
}

/// Resolves once `shutdown` is true or its sender is gone.
///
/// # Cancel safety
/// Cancel safe.
pub async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|&stop| stop).await;
}

/// A shutdown signal that turns true on SIGTERM or SIGINT (Ctrl-C).
///
/// # Errors
/// The signal handlers could not be installed.
pub fn on_signals() -> io::Result<watch::Receiver<bool>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = int.recv() => tracing::info!("SIGINT: shutting down"),
        }
        let _ = tx.send(true);
        // Keep the sender: a dropped one reads as "stop" too, but only once
        // the signal came.
        std::future::pending::<()>().await;
    });
    Ok(rx)
}

/// Accept errors that leave the listener usable (a peer that gave up, out
/// of descriptors or memory for now).
pub fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::OutOfMemory
    ) || matches!(e.raw_os_error(), Some(23 | 24 | 105)) // ENFILE, EMFILE, ENOBUFS
}

/// This process's CPU time (user + system) so far, in ns.
pub fn process_cpu_ns() -> u64 {
    u64::try_from(cpu_time::ProcessTime::now().as_duration().as_nanos()).unwrap_or(u64::MAX)
}

/// Sets up `tracing` output on stderr at `level`.
pub fn init_tracing(level: tracing::Level) {
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(level)
        .try_init();
}

/// Accepts connections on `listener` until `shutdown` turns true (or its
/// sender is dropped), running `connection(stream)` for each on its own
/// task in a `connection` span, at most `max_connections` at once; then
/// waits for every connection to finish. A connection beyond the limit is
/// handed to `refuse` (which answers and drops it) at once: the listener
/// never queues more than the kernel's backlog. Transient accept errors (out
/// of descriptors, a connection reset before it was accepted) are logged
/// and retried: the listener is fine.
///
/// # Errors
/// Accepting failed otherwise.
///
/// # Cancel safety
/// Dropping the future aborts the connections' tasks (what they spawned
/// themselves runs on).
pub async fn accept_until<F>(
    listener: TcpListener,
    mut shutdown: watch::Receiver<bool>,
    max_connections: u32,
    mut refuse: impl FnMut(TcpStream),
    mut connection: impl FnMut(TcpStream) -> F,
) -> io::Result<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    let permits = Arc::new(Semaphore::new(max_connections as usize));
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = stopped(&mut shutdown) => break,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) if is_transient(&e) => {
                tracing::warn!(error = %e, "accept");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        while connections.try_join_next().is_some() {}
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            tracing::warn!(%peer, max_connections, "connection refused: at the limit");
            refuse(stream);
            continue;
        };
        let span = tracing::info_span!("connection", %peer);
        let serving = connection(stream);
        connections.spawn(
            async move {
                serving.await;
                drop(permit);
            }
            .instrument(span),
        );
    }
    while connections.join_next().await.is_some() {}
    Ok(())
}

/// Writes `frame` to a connection being refused, if its socket takes it at
/// once (a fresh socket's send buffer does), and closes the connection.
/// Never waits: a refusal must not hold up the accept loop.
pub fn refuse_with(stream: TcpStream, frame: &[u8]) {
    // As a std socket the write goes straight to the kernel, with no wait
    // for the runtime to see the socket writable; it stays non-blocking.
    if let Ok(mut socket) = stream.into_std() {
        let _ = io::Write::write(&mut socket, frame);
        let _ = socket.shutdown(std::net::Shutdown::Both);
    }
}

/// A binary's `main`: runs `main` on a new multi-threaded runtime and
/// gives its output, or prints `name: error` (the runtime's or `main`'s)
/// and gives `None`.
pub fn block_on<T, E: std::fmt::Display>(
    name: &str,
    main: impl Future<Output = Result<T, E>>,
) -> Option<T> {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{name}: cannot start the runtime: {e}");
            return None;
        }
    };
    match runtime.block_on(main) {
        Ok(t) => Some(t),
        Err(e) => {
            eprintln!("{name}: {e}");
            None
        }
    }
}
