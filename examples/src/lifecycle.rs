//! What both servers share about starting and stopping: the shutdown
//! signal, accept errors that leave the listener usable, and the process's
//! CPU time for STATS.

use std::io;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::Instrument;

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
/// task in a `connection` span; then waits for every connection to finish.
/// Transient accept errors (out of descriptors, a connection reset before
/// it was accepted) are logged and retried: the listener is fine.
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
    mut connection: impl FnMut(TcpStream) -> F,
) -> io::Result<()>
where
    F: Future<Output = ()> + Send + 'static,
{
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
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        let span = tracing::info_span!("connection", %peer);
        connections.spawn(connection(stream).instrument(span));
        while connections.try_join_next().is_some() {}
    }
    while connections.join_next().await.is_some() {}
    Ok(())
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
