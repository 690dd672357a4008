//! The block server binary, end to end: a verified load, the bad frames,
//! corruption on disk, a clean shutdown, kill -9 in the middle of a load,
//! loopback-only listening, the connection limit and the idle timeout.

mod common;

use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use common::{Server, run_load};
use offload_examples::block::client::{BlockClient, ClientError};
use offload_examples::block::load::{self, LoadConfig};
use offload_examples::block::protocol::{
    Request, Response, Status, decode_response, max_request, op,
};
use offload_examples::block::volume::{Geometry, SLOT_HEADER};

const SERVER: &str = env!("CARGO_BIN_EXE_block-server");
const LOAD: &str = env!("CARGO_BIN_EXE_block-load");

fn start(volume: &std::path::Path, extra: &[&str]) -> Server {
    let mut args = vec!["--volume", volume.to_str().unwrap(), "--blocks", "512"];
    args.extend_from_slice(extra);
    Server::start(SERVER, &args)
}

fn block(byte: u8) -> Vec<u8> {
    vec![byte; 4096]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bounded_load_verifies_every_read_and_the_server_stops_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let volume = dir.path().join("vol");
    let server = start(&volume, &[]);
    // The load generator binary (its blocks are overwritten below).
    let addr = server.addr.to_string();
    let (ok, out, err) = run_load(
        LOAD,
        &[
            "--addr",
            &addr,
            "--requests",
            "400",
            "--connections",
            "2",
            "--depth",
            "2",
        ],
    );
    assert!(ok, "{out}\n{err}");
    assert!(
        out.contains("verified") && out.contains("0 mismatches, 0 errors"),
        "{out}"
    );

    let config = LoadConfig {
        connections: 2,
        depth: 4,
        requests: Some(3000),
        duration: Duration::from_secs(20),
        read_percent: 40,
        random_percent: 50,
        ..LoadConfig::new(server.addr)
    };
    let report = load::run(&config, Arc::new(AtomicBool::new(false)))
        .await
        .unwrap();
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.writes + report.reads, 3000, "{report}");
    assert!(report.reads > 500 && report.writes > 500, "{report}");
    assert!(report.latency.p50 > Duration::ZERO && report.latency.p99 >= report.latency.p50);
    let cpu = report.served.iter().find(|s| s.name == "cpu").unwrap();
    // Every block written and read went through XTS and CRC-32C once.
    assert_eq!(cpu.bytes, 2 * 4096 * 3000, "{report}");
    assert!(report.server_cpu.is_some_and(|c| c > Duration::ZERO));
    assert_eq!(report.selection, "auto (throughput)");

    let (status, stderr) = server.terminate();
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("closed cleanly"), "{stderr}");

    // Reopened: clean, and every block holds its last write.
    let server = start(&volume, &[]);
    let client = BlockClient::connect(server.addr).await.unwrap();
    let stats = client.stats().await.unwrap();
    assert!(stats.opened_clean);
    let verified = report.ledger.verify(&client).await.unwrap();
    assert!(verified.lost.is_empty(), "{:?}", verified.lost);
    assert!(verified.checked > 0);
}

#[tokio::test]
async fn bad_frames_get_an_error_frame_and_the_connection_stays_usable() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(&dir.path().join("vol"), &[]);
    let client = BlockClient::connect(server.addr).await.unwrap();
    let max = max_request(4096);

    // (frame bytes, the id its error comes back with, the status)
    let mut cases: Vec<(&str, Vec<u8>, u64, Status)> = Vec::new();
    let mut frame = Vec::new();
    Request::Write {
        block: 1,
        data: vec![1; 100],
    }
    .encode(10, &mut frame);
    cases.push(("truncated WRITE", frame, 10, Status::BadFrame));
    let mut frame = Vec::new();
    Request::Read { block: 1 }.encode(11, &mut frame);
    frame.extend_from_slice(&[0; 3]);
    frame[..4].copy_from_slice(&((9 + 8 + 3) as u32).to_be_bytes());
    cases.push(("READ with trailing bytes", frame, 11, Status::BadFrame));
    let mut frame = ((max + 5000) as u32).to_be_bytes().to_vec();
    frame.extend(std::iter::repeat_n(0xa5, max + 5000));
    cases.push(("oversize frame", frame, 0, Status::BadFrame));
    let mut frame = vec![0, 0, 0, 9, 42];
    frame.extend_from_slice(&12u64.to_be_bytes());
    cases.push(("unknown opcode", frame, 12, Status::BadFrame));
    cases.push((
        "too short for an id",
        vec![0, 0, 0, 3, op::READ, 0, 0],
        0,
        Status::BadFrame,
    ));
    let mut frame = Vec::new();
    Request::Read { block: 512 }.encode(13, &mut frame);
    cases.push(("READ out of range", frame, 13, Status::OutOfRange));
    let mut frame = Vec::new();
    Request::Write {
        block: u64::MAX,
        data: block(1),
    }
    .encode(14, &mut frame);
    cases.push(("WRITE out of range", frame, 14, Status::OutOfRange));

    for (i, (what, frame, id, status)) in cases.into_iter().enumerate() {
        let response = client.call_frame(id, frame).await.unwrap();
        assert_eq!(response.status, status, "{what}: {response:?}");
        assert!(!response.payload.is_empty(), "{what}: an error says why");
        // Still usable: a write and a read back on the same connection.
        let b = 100 + i as u64;
        client.write(b, block(i as u8 + 1)).await.unwrap();
        assert_eq!(
            client.read(b).await.unwrap(),
            block(i as u8 + 1),
            "after {what}"
        );
    }
    let stats = client.stats().await.unwrap();
    assert_eq!(stats.bad_frames, 5);
    assert_eq!(stats.writes, 7);
    client.flush().await.unwrap();
    // A frame cut short by the peer closing ends only that connection.
    {
        use tokio::io::AsyncWriteExt;
        let mut other = tokio::net::TcpStream::connect(server.addr).await.unwrap();
        other
            .write_all(&[0, 0, 0, 17, op::READ, 0, 0])
            .await
            .unwrap();
    }
    assert_eq!(client.read(100).await.unwrap(), block(1));
    let (status, stderr) = server.terminate();
    assert!(status.success(), "{stderr}");
}

#[tokio::test]
async fn a_corrupt_block_is_reported_never_returned() {
    let dir = tempfile::tempdir().unwrap();
    let volume = dir.path().join("vol");
    let server = start(&volume, &[]);
    let client = BlockClient::connect(server.addr).await.unwrap();
    for b in 0..8 {
        client.write(b, block(b as u8)).await.unwrap();
    }
    drop(client);
    let (status, _) = server.terminate();
    assert!(status.success());

    // Rot one bit of block 3's ciphertext (its only version is in slot 0).
    let geometry = Geometry {
        block_size: 4096,
        blocks: 512,
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&volume)
        .unwrap();
    let at = geometry.slot_offset(3, 0) + SLOT_HEADER as u64 + 2000;
    let mut byte = [0u8; 1];
    file.read_exact_at(&mut byte, at).unwrap();
    file.write_all_at(&[byte[0] ^ 1], at).unwrap();
    drop(file);

    let server = start(&volume, &[]);
    let client = BlockClient::connect(server.addr).await.unwrap();
    let response = client.call(&Request::Read { block: 3 }).await.unwrap();
    assert_eq!(response.status, Status::Corrupt, "{response:?}");
    assert!(String::from_utf8_lossy(&response.payload).contains("CRC-32C"));
    for b in (0..8).filter(|&b| b != 3) {
        assert_eq!(client.read(b).await.unwrap(), block(b as u8));
    }
    // Rewriting the block heals it.
    client.write(3, block(33)).await.unwrap();
    assert_eq!(client.read(3).await.unwrap(), block(33));
    assert_eq!(client.stats().await.unwrap().corrupt, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_write_survives_kill_9_in_the_middle_of_a_load() {
    let dir = tempfile::tempdir().unwrap();
    let volume = dir.path().join("vol");
    let server = start(&volume, &[]);
    let addr = server.addr;
    let config = LoadConfig {
        connections: 4,
        depth: 4,
        requests: None,
        duration: Duration::from_secs(30),
        read_percent: 20,
        random_percent: 70,
        ..LoadConfig::new(addr)
    };
    let running =
        tokio::spawn(async move { load::run(&config, Arc::new(AtomicBool::new(false))).await });
    // Let writes be acknowledged, then kill the server mid-load.
    let watcher = BlockClient::connect(addr).await.unwrap();
    for _ in 0..500 {
        if watcher.stats().await.unwrap().writes >= 3000 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    server.kill9();
    let report = running.await.unwrap().unwrap();
    assert!(report.errors > 0, "the load saw the server go: {report}");
    assert_eq!(report.mismatches, 0, "{report}");
    let acked = report
        .ledger
        .blocks
        .values()
        .filter(|e| e.acked > 0)
        .count();
    assert!(acked > 100, "{report}");
    let in_flight = report
        .ledger
        .blocks
        .values()
        .filter(|e| e.pending.is_some())
        .count();

    let server = start(&volume, &[]);
    let said = server.stderr_with("recovered after a crash", Duration::from_secs(10));
    assert!(said.contains("recovered after a crash"), "{said}");
    let client = BlockClient::connect(server.addr).await.unwrap();
    assert!(!client.stats().await.unwrap().opened_clean);
    let verified = report.ledger.verify(&client).await.unwrap();
    assert!(
        verified.lost.is_empty(),
        "lost after kill -9: {:?}",
        verified.lost
    );
    assert_eq!(verified.intact as usize, report.ledger.blocks.len());
    eprintln!(
        "kill -9 after {} acknowledged writes; {acked} blocks checked intact, {in_flight} were in flight",
        report.writes
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_serves_every_block_when_forced_and_auto_accounts_for_every_byte() {
    let dir = tempfile::tempdir().unwrap();
    for (name, extra) in [
        ("forced", &["--sim", "qce", "--backend", "sim:qce"][..]),
        ("auto", &["--sim", "qce"][..]),
    ] {
        let server = start(&dir.path().join(name), extra);
        let config = LoadConfig {
            connections: 2,
            depth: 8,
            requests: Some(600),
            duration: Duration::from_secs(20),
            read_percent: 50,
            ..LoadConfig::new(server.addr)
        };
        let report = load::run(&config, Arc::new(AtomicBool::new(false)))
            .await
            .unwrap();
        assert!(report.is_clean(), "{name}: {report}");
        let on = |backend: &str| {
            report
                .served
                .iter()
                .find(|s| s.name == backend)
                .map_or(0, |s| s.bytes)
        };
        let blocks = 4096 * (report.writes + report.reads);
        // XTS and CRC-32C of every block, wherever they ran.
        assert_eq!(on("cpu") + on("sim:qce"), 2 * blocks, "{name}: {report}");
        if name == "forced" {
            // The engine has XTS but no CRC-32C: those stay on the CPU.
            assert_eq!(on("sim:qce"), blocks, "{report}");
            assert_eq!(report.selection, "forced sim:qce");
        }
        let (status, stderr) = server.terminate();
        assert!(status.success(), "{stderr}");
    }
}

#[test]
fn listen_takes_loopback_addresses_only_unless_insecure_listen_is_given() {
    let dir = tempfile::tempdir().unwrap();
    let volume = dir.path().join("vol");
    let args = ["--volume", volume.to_str().unwrap(), "--blocks", "64"];
    let (status, stderr) =
        common::refused(SERVER, &[&args[..], &["--listen", "0.0.0.0:7700"]].concat());
    assert!(!status.success(), "{stderr}");
    assert!(!volume.exists(), "refused before it touched the volume");
    common::listens_on_loopback_only(SERVER, &args, "can read and overwrite every block");
}

/// Reads a whole response frame off a raw connection; `None` at its end.
async fn raw_response(stream: &mut tokio::net::TcpStream) -> Option<Response> {
    use tokio::io::AsyncReadExt;
    let mut len = [0u8; 4];
    stream.read_exact(&mut len).await.ok()?;
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
    stream.read_exact(&mut body).await.ok()?;
    Some(decode_response(body).unwrap())
}

/// Waits at most 10 s for the server to close `stream`: whether it did.
async fn closed_by_server(stream: &mut tokio::net::TcpStream) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 64];
    loop {
        match tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

#[tokio::test]
async fn past_the_connection_limit_a_connection_is_refused_until_one_closes() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(&dir.path().join("vol"), &["--max-connections", "2"]);
    let first = BlockClient::connect(server.addr).await.unwrap();
    let second = BlockClient::connect(server.addr).await.unwrap();
    // Both served: a round trip each.
    first.write(1, block(1)).await.unwrap();
    assert_eq!(second.read(1).await.unwrap(), block(1));

    // The third gets BUSY at once and is closed; it is never queued.
    let mut third = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let busy = tokio::time::timeout(Duration::from_secs(5), raw_response(&mut third))
        .await
        .expect("refused at once, not queued")
        .expect("a BUSY response before the close");
    assert_eq!((busy.id, busy.status), (0, Status::Busy), "{busy:?}");
    assert!(String::from_utf8_lossy(&busy.payload).contains("2 connections"));
    assert!(closed_by_server(&mut third).await);
    // Through the client: every call gets the refusal.
    let refused = BlockClient::connect(server.addr).await.unwrap();
    match refused.read(1).await {
        Err(ClientError::Server { status, .. }) => assert_eq!(status, Status::Busy),
        Err(ClientError::Closed) => {} // the close won the race with the call
        other => panic!("a refusal expected: {other:?}"),
    }
    assert_eq!(first.stats().await.unwrap().refused, 2);

    // Once one closes, a new connection is served.
    drop(second);
    let mut served = None;
    for _ in 0..100 {
        let client = BlockClient::connect(server.addr).await.unwrap();
        if client.read(1).await.is_ok() {
            served = Some(client);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let fourth = served.expect("served once a connection closed");
    assert_eq!(fourth.read(1).await.unwrap(), block(1));
    assert_eq!(first.read(1).await.unwrap(), block(1), "still served");
}

#[tokio::test]
async fn a_connection_that_sends_no_whole_request_within_the_idle_timeout_is_closed() {
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    let server = start(&dir.path().join("vol"), &["--idle-timeout", "1.5"]);
    let started = std::time::Instant::now();
    let mut silent = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    // Half a frame header, and nothing more: a trickle is idle too.
    let mut trickle = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    trickle.write_all(&[0, 0]).await.unwrap();
    // A client that sends a request every 0.3 s stays open past 1.5 s.
    let busy = BlockClient::connect(server.addr).await.unwrap();
    for i in 0..8u8 {
        busy.write(3, block(i)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(busy.read(3).await.unwrap(), block(7));
    assert!(started.elapsed() > Duration::from_millis(2400));
    assert!(closed_by_server(&mut silent).await);
    assert!(closed_by_server(&mut trickle).await);
    assert_eq!(busy.stats().await.unwrap().idle_closed, 2);
    // Idle in its turn, it is closed too, after the timeout and not before.
    let last = std::time::Instant::now();
    let mut closed = false;
    while last.elapsed() < Duration::from_secs(10) && !closed {
        tokio::time::sleep(Duration::from_millis(100)).await;
        closed = busy.is_closed();
    }
    assert!(closed, "still open 10 s after its last request");
    assert!(
        last.elapsed() >= Duration::from_millis(1400),
        "{:?}",
        last.elapsed()
    );
}
