//! A server loop: requests arrive, each is sealed on whatever engine the
//! selector picks, many in flight on one session, until shutdown — which
//! drops the requests still in flight, as a server that stops accepting
//! does. Every request future is cancel-safe: dropping one mid-flight
//! loses nothing else and leaks nothing (an engine holding its buffer
//! keeps it until the device lets go).
//!
//! ```text
//! cargo run --release -p crypto-offload --example server
//! ```

use std::sync::Arc;
use std::time::Duration;

use crypto_offload::{AeadAlg, AeadSession, Offload};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

/// One request: a record to seal, and where to send the result.
struct Job {
    id: u64,
    record: Vec<u8>,
    reply: mpsc::Sender<(u64, Vec<u8>)>,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let offload = Offload::discover().await?;
    let session = Arc::new(offload.aead(AeadAlg::Aes256Gcm, &[9; 32]).await?);
    let (jobs, incoming) = mpsc::channel::<Job>(256);
    let (stop, stopped) = watch::channel(false);
    let server = tokio::spawn(serve(session, incoming, stopped));

    // A client that never stops: records of 16 KiB, answers collected as
    // they come, until the server shuts down 200 ms in.
    let (reply, mut answers) = mpsc::channel(256);
    let client = tokio::spawn(async move {
        for id in 0u64.. {
            let job = Job {
                id,
                record: vec![id as u8; 16 << 10],
                reply: reply.clone(),
            };
            if jobs.send(job).await.is_err() {
                break;
            }
        }
    });
    let mut sealed = 0u64;
    let deadline = tokio::time::sleep(Duration::from_millis(200));
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            Some((_, out)) = answers.recv() => {
                assert_eq!(out.len(), (16 << 10) + 16);
                sealed += 1;
            }
            // Shut down mid-stream: whatever is in flight is dropped.
            () = &mut deadline => break,
        }
    }
    let _ = stop.send(true);
    let dropped = server.await?;
    client.abort();
    println!("sealed {sealed} records before shutdown; {dropped} in flight were dropped");
    for b in offload.backends() {
        println!("  {:<20} {} requests", b.name, b.stats.requests);
    }
    Ok(())
}

/// Serves jobs until `stopped` turns true; then drops every request still
/// in flight and says how many there were.
async fn serve(
    session: Arc<AeadSession>,
    mut incoming: mpsc::Receiver<Job>,
    mut stopped: watch::Receiver<bool>,
) -> usize {
    let mut in_flight = JoinSet::new();
    let mut nonce = 0u64;
    loop {
        tokio::select! {
            biased;
            _ = stopped.changed() => break,
            Some(done) = in_flight.join_next(), if !in_flight.is_empty() => {
                let _ = done;
            }
            Some(job) = incoming.recv() => {
                nonce += 1;
                let mut n = [0u8; 12];
                n[..8].copy_from_slice(&nonce.to_le_bytes());
                let s = session.clone();
                in_flight.spawn(async move {
                    // A unique nonce a record: never reuse one under a key.
                    if let Ok(out) = s.seal(n, b"", job.record).await {
                        let _ = job.reply.send((job.id, out)).await;
                    }
                });
            }
        }
    }
    let dropped = in_flight.len();
    // Cancellation: each request future is dropped where it stands.
    in_flight.abort_all();
    while in_flight.join_next().await.is_some() {}
    dropped
}
