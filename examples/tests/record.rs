//! The record server binary, end to end: verified echoes at several sizes
//! and connection counts, tampered and replayed records, bad frames, an
//! engine, and a clean shutdown.

mod common;

use std::time::Duration;

use common::{Server, run_load};
use crypto_offload::Offload;
use offload_examples::pattern;
use offload_examples::record::client::{self, Received, RecordReceiver};
use offload_examples::record::load::{self, RecordLoadConfig};
use offload_examples::record::protocol::{HEADER, MAX_PAYLOAD, alert, kind, record};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SERVER: &str = env!("CARGO_BIN_EXE_record-server");
const LOAD: &str = env!("CARGO_BIN_EXE_record-load");

async fn next(rx: &mut RecordReceiver) -> Received {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("a reply within 10 s")
        .unwrap()
        .expect("the connection is open")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_of_every_size_echo_verified_on_one_and_many_connections() {
    let server = Server::start(SERVER, &[]);
    let offload = Offload::builder().build().unwrap();
    let mut total = 0;
    for (size, connections) in [(64, 1), (512, 2), (1500, 4), (MAX_PAYLOAD, 2)] {
        let config = RecordLoadConfig {
            size,
            connections,
            records: Some(300),
            duration: Duration::from_secs(20),
            ..RecordLoadConfig::new(server.addr)
        };
        let p = load::run(&config, &offload).await.unwrap();
        assert!(p.is_clean(), "{size} B × {connections}: {p:?}");
        assert_eq!(p.records, 300 * connections as u64, "{p:?}");
        assert!(p.kpps() > 0.0 && p.mb_per_s() > 0.0);
        // The server opened and sealed each record: twice its bytes.
        let cpu = p.served.iter().find(|s| s.name == "cpu").unwrap();
        assert_eq!(cpu.bytes, 2 * p.records * size as u64, "{p:?}");
        total += p.records;
    }
    let stats = client::stats(server.addr).await.unwrap();
    assert_eq!(stats.records, total);
    assert_eq!(
        (stats.tampered, stats.replayed, stats.bad_frames),
        (0, 0, 0)
    );

    let addr = server.addr.to_string();
    let (ok, out, err) = run_load(
        LOAD,
        &[
            "--addr",
            &addr,
            "--sizes",
            "64,1500",
            "--connections",
            "1,3",
            "--records",
            "50",
        ],
    );
    assert!(ok, "{out}\n{err}");
    assert_eq!(
        out.lines()
            .filter(|l| l.trim_start().starts_with("64 ") || l.trim_start().starts_with("1500 "))
            .count(),
        4,
        "{out}"
    );

    let (status, stderr) = server.terminate();
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("stopped after"), "{stderr}");
}

#[tokio::test]
async fn tampered_and_replayed_records_are_dropped_and_counted_never_delivered() {
    let server = Server::start(SERVER, &[]);
    let offload = Offload::builder().build().unwrap();
    let (mut tx, mut rx) = client::connect(server.addr, &offload).await.unwrap();
    let payload = |n: u64| {
        let mut p = vec![0u8; 700];
        pattern::fill(&mut p, n);
        p
    };

    let first = tx.seal(payload(1)).await.unwrap();
    tx.send_raw(&first).await.unwrap();
    tx.flush().await.unwrap();
    assert_eq!(next(&mut rx).await, Received::Data(payload(1)));

    let mut body_flipped = tx.seal(payload(2)).await.unwrap();
    body_flipped[HEADER + 10] ^= 1;
    let mut tag_flipped = tx.seal(payload(3)).await.unwrap();
    let last = tag_flipped.len() - 1;
    tag_flipped[last] ^= 0x80;
    let mut header_flipped = tx.seal(payload(4)).await.unwrap();
    header_flipped[4] ^= 1; // the sequence number: part of the AAD and the nonce
    for bad in [&body_flipped, &tag_flipped, &header_flipped, &first] {
        tx.send_raw(bad).await.unwrap();
    }
    tx.send(payload(5)).await.unwrap();
    tx.request_stats().await.unwrap();
    tx.flush().await.unwrap();
    // Nothing of the bad four comes back: the next echo is the good record.
    assert_eq!(next(&mut rx).await, Received::Data(payload(5)));
    let Received::Stats(stats) = next(&mut rx).await else {
        panic!("STATS expected");
    };
    assert_eq!((stats.tampered, stats.replayed, stats.records), (3, 1, 2));
    drop(tx);
    let (status, stderr) = server.terminate();
    assert!(status.success(), "{stderr}");
}

#[tokio::test]
async fn bad_frames_get_an_alert_and_the_connection_stays_usable() {
    let server = Server::start(SERVER, &[]);

    // DATA before HELLO, on a bare connection.
    let mut bare = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    bare.write_all(&record(kind::DATA, 1, &[0; 40]))
        .await
        .unwrap();
    let mut head = [0u8; HEADER];
    bare.read_exact(&mut head).await.unwrap();
    assert_eq!(head[0], kind::ALERT);
    let len = u32::from_be_bytes(head[9..13].try_into().unwrap()) as usize;
    let mut body = vec![0u8; len];
    bare.read_exact(&mut body).await.unwrap();
    assert_eq!(body[0], alert::NO_KEY);
    // The connection goes on: STATS (which needs no key) is answered.
    bare.write_all(&record(kind::STATS, 2, &[])).await.unwrap();
    bare.read_exact(&mut head).await.unwrap();
    assert_eq!(head[0], kind::STATS);
    drop(bare);

    let offload = Offload::builder().build().unwrap();
    let (mut tx, mut rx) = client::connect(server.addr, &offload).await.unwrap();
    let oversize = record(kind::DATA, 7, &vec![0x5a; MAX_PAYLOAD + 1000]);
    let cases: [(&str, Vec<u8>, u8); 5] = [
        ("oversize", oversize, alert::OVERSIZE),
        ("unknown type", record(0x42, 8, b"abc"), alert::UNKNOWN_TYPE),
        (
            "DATA shorter than a tag",
            record(kind::DATA, 9, &[1; 5]),
            alert::TRUNCATED,
        ),
        (
            "HELLO without a whole key",
            record(kind::HELLO, 10, &[1; 3]),
            alert::TRUNCATED,
        ),
        (
            "empty DATA record",
            record(kind::DATA, 11, &[]),
            alert::TRUNCATED,
        ),
    ];
    for (i, (what, frame, expected)) in cases.into_iter().enumerate() {
        tx.send_raw(&frame).await.unwrap();
        tx.flush().await.unwrap();
        match next(&mut rx).await {
            Received::Alert { code, message, .. } => {
                assert_eq!(code, expected, "{what}: {message}");
            }
            other => panic!("{what}: {other:?}"),
        }
        // Still keyed and in step: a record echoes.
        let p = vec![i as u8; 100];
        tx.send(p.clone()).await.unwrap();
        tx.flush().await.unwrap();
        assert_eq!(next(&mut rx).await, Received::Data(p), "after {what}");
    }
    let stats = client::stats(server.addr).await.unwrap();
    assert_eq!(stats.bad_frames, 6);
    assert_eq!(stats.records, 5);
    drop((tx, rx));
    let (status, stderr) = server.terminate();
    assert!(status.success(), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_seals_every_record_when_forced_and_auto_accounts_for_every_byte() {
    for (name, extra) in [
        (
            "forced",
            &["--sim", "eip197", "--backend", "sim:eip197"][..],
        ),
        ("auto", &["--sim", "eip197"][..]),
    ] {
        let server = Server::start(SERVER, extra);
        let offload = Offload::builder().build().unwrap();
        let config = RecordLoadConfig {
            size: 1500,
            connections: 4,
            records: Some(200),
            duration: Duration::from_secs(20),
            ..RecordLoadConfig::new(server.addr)
        };
        let p = load::run(&config, &offload).await.unwrap();
        assert!(p.is_clean(), "{name}: {p:?}");
        let on = |backend: &str| {
            p.served
                .iter()
                .find(|s| s.name == backend)
                .map_or(0, |s| s.bytes)
        };
        assert_eq!(
            on("cpu") + on("sim:eip197"),
            2 * 1500 * p.records,
            "{name}: {p:?}"
        );
        if name == "forced" {
            assert_eq!(on("sim:eip197"), 2 * 1500 * p.records, "{p:?}");
            assert_eq!(p.selection, "forced sim:eip197");
        }
        let (status, stderr) = server.terminate();
        assert!(status.success(), "{stderr}");
    }
}
