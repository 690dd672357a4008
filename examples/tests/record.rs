//! The record server binary, end to end: verified echoes at several sizes
//! and connection counts, tampered and replayed records, bad frames, an
//! engine, a clean shutdown; the key exchange (no key on the wire, keys of
//! their own for every connection and HELLO, replayed connections, the
//! PSK); loopback-only listening, the connection limit and the idle
//! timeout.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{Server, run_load};
use crypto_offload::{AeadAlg, AeadSession, Offload};
use offload_examples::pattern;
use offload_examples::record::client::{self, Received, RecordError, RecordReceiver};
use offload_examples::record::handshake::{
    self, CLIENT_HELLO, HandshakeError, PUBLIC, Psk, SERVER_HELLO, SessionKeys,
};
use offload_examples::record::load::{self, RecordLoadConfig};
use offload_examples::record::protocol::{
    FROM_SERVER, HEADER, Header, MAX_PAYLOAD, RecordStats, TO_SERVER, alert, kind, open_record,
    record, seal_record,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use x25519_dalek::{PublicKey, StaticSecret};

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
    let (mut tx, mut rx) = client::connect(server.addr, &offload, None).await.unwrap();
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
    let (mut tx, mut rx) = client::connect(server.addr, &offload, None).await.unwrap();
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

fn payload(n: u64, len: usize) -> Vec<u8> {
    let mut p = vec![0u8; len];
    pattern::fill(&mut p, n);
    p
}

/// A TCP relay to `server` for one connection that keeps every byte: what
/// the client sent, and what the server sent, once both ends have closed.
async fn recording_proxy(
    server: SocketAddr,
) -> (SocketAddr, tokio::task::JoinHandle<(Vec<u8>, Vec<u8>)>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let relay = tokio::spawn(async move {
        let (client, _) = listener.accept().await.unwrap();
        let upstream = TcpStream::connect(server).await.unwrap();
        let (client_read, client_write) = client.into_split();
        let (server_read, server_write) = upstream.into_split();
        let to_server = tokio::spawn(copy_recording(client_read, server_write));
        let to_client = tokio::spawn(copy_recording(server_read, client_write));
        (to_server.await.unwrap(), to_client.await.unwrap())
    });
    (addr, relay)
}

/// Copies until the reader ends, then shuts the writer down; what it copied.
async fn copy_recording(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
) -> Vec<u8> {
    let mut seen = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    while let Ok(n @ 1..) = from.read(&mut buf).await {
        seen.extend_from_slice(&buf[..n]);
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
    seen
}

/// The next record on a raw connection (within 10 s); `None` at its end.
async fn raw_record(stream: &mut TcpStream) -> Option<([u8; HEADER], Vec<u8>)> {
    let read = async {
        let mut header = [0u8; HEADER];
        stream.read_exact(&mut header).await.ok()?;
        let mut body = vec![0u8; Header::decode(&header).len as usize];
        stream.read_exact(&mut body).await.ok()?;
        Some((header, body))
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("a record or the end within 10 s")
}

/// Waits at most 10 s for the server to close `stream`: whether it did.
async fn closed_by_server(stream: &mut TcpStream) -> bool {
    let mut buf = [0u8; 256];
    loop {
        match tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

/// A hand-made client: a secret it can use for more than one HELLO (as
/// one replaying its HELLO would), and its HELLO body.
struct HandMade {
    secret: StaticSecret,
    hello: [u8; CLIENT_HELLO],
}

impl HandMade {
    fn new() -> Self {
        let secret = StaticSecret::random();
        let mut hello = [0u8; CLIENT_HELLO];
        hello[..PUBLIC].copy_from_slice(PublicKey::from(&secret).as_bytes());
        getrandom::fill(&mut hello[PUBLIC..]).unwrap();
        HandMade { secret, hello }
    }

    /// Sends HELLO and reads the server's: its body.
    async fn hello(&self, stream: &mut TcpStream) -> Vec<u8> {
        stream
            .write_all(&record(kind::HELLO, 0, &self.hello))
            .await
            .unwrap();
        let (header, body) = raw_record(stream).await.expect("the server's HELLO");
        assert_eq!(Header::decode(&header).kind, kind::HELLO);
        assert_eq!(body.len(), SERVER_HELLO);
        body
    }

    /// The keys of the exchange the server's HELLO `reply` finished,
    /// derived with `psk` — whatever the server's confirmation says, as a
    /// man in the middle would.
    fn keys(&self, reply: &[u8], psk: Option<&Psk>) -> SessionKeys {
        let server: [u8; PUBLIC] = reply[..PUBLIC].try_into().unwrap();
        let shared = self.secret.diffie_hellman(&PublicKey::from(server));
        handshake::derive(&shared, &self.hello, &server, psk).unwrap()
    }
}

async fn gcm(key: &[u8]) -> AeadSession {
    let offload = Offload::builder().build().unwrap();
    offload.aead(AeadAlg::Aes128Gcm, key).await.unwrap()
}

/// Reads records off a raw connection up to a STATS reply: the others,
/// and the stats.
async fn until_stats(stream: &mut TcpStream) -> (Vec<([u8; HEADER], Vec<u8>)>, RecordStats) {
    let mut others = Vec::new();
    loop {
        let (header, body) = raw_record(stream).await.expect("records up to STATS");
        if Header::decode(&header).kind == kind::STATS {
            return (others, serde_json::from_slice(&body).unwrap());
        }
        others.push((header, body));
    }
}

#[tokio::test]
async fn the_key_exchange_puts_no_key_on_the_wire() {
    let server = Server::start(SERVER, &[]);
    let offload = Offload::builder().build().unwrap();
    let (proxy, recorded) = recording_proxy(server.addr).await;
    // The library client, through a relay that records both directions.
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    let keys = client::handshake(&mut stream, None).await.unwrap();
    let derived = [*keys.to_server(), *keys.to_client()];
    let (mut tx, mut rx) = client::open(stream, &keys, &offload).await.unwrap();
    drop(keys);
    for n in 0..3 {
        tx.send(payload(n, 300)).await.unwrap();
    }
    tx.flush().await.unwrap();
    for n in 0..3 {
        // The keys at hand are the ones in use: the echoes open.
        assert_eq!(next(&mut rx).await, Received::Data(payload(n, 300)));
    }
    drop((tx, rx));
    let (to_server, to_client) = recorded.await.unwrap();
    // What crossed: a 48-byte HELLO, three records, and the answers.
    assert_eq!(to_server[0], kind::HELLO);
    assert_eq!(
        to_server.len(),
        HEADER + CLIENT_HELLO + 3 * (HEADER + 300 + 16)
    );
    assert_eq!(
        to_client.len(),
        HEADER + SERVER_HELLO + 3 * (HEADER + 300 + 16)
    );
    for key in derived {
        for wire in [&to_server, &to_client] {
            for piece in key.chunks(8) {
                assert!(
                    !wire.windows(8).any(|w| w == piece),
                    "8 bytes of a derived key on the wire"
                );
            }
        }
    }
}

#[tokio::test]
async fn every_connection_and_every_hello_gets_keys_of_its_own() {
    let server = Server::start(SERVER, &[]);
    // Two connections of the library client.
    let mut a = TcpStream::connect(server.addr).await.unwrap();
    let mut b = TcpStream::connect(server.addr).await.unwrap();
    let (ka, kb) = (
        client::handshake(&mut a, None).await.unwrap(),
        client::handshake(&mut b, None).await.unwrap(),
    );
    assert_ne!(ka.to_server(), kb.to_server());
    assert_ne!(ka.to_client(), kb.to_client());
    assert_ne!(ka.to_server(), ka.to_client());

    // One connection, the same HELLO twice, word for word.
    let me = HandMade::new();
    let mut c = TcpStream::connect(server.addr).await.unwrap();
    let first = me.hello(&mut c).await;
    let k1 = me.keys(&first, None);
    let (seal_1, open_1) = (gcm(k1.to_server()).await, gcm(k1.to_client()).await);
    let record_1 = seal_record(&seal_1, TO_SERVER, 1, payload(1, 100)).await;
    c.write_all(&record_1.unwrap()).await.unwrap();
    let (header, body) = raw_record(&mut c).await.unwrap();
    assert_eq!(Header::decode(&header).seq, 1);
    let echo = open_record(&open_1, FROM_SERVER, &header, body).await;
    assert_eq!(echo.unwrap(), payload(1, 100));

    let second = me.hello(&mut c).await;
    assert_ne!(first[..PUBLIC], second[..PUBLIC], "a fresh server key");
    let k2 = me.keys(&second, None);
    assert_ne!(k1.to_server(), k2.to_server());
    assert_ne!(k1.to_client(), k2.to_client());
    let (seal_2, open_2) = (gcm(k2.to_server()).await, gcm(k2.to_client()).await);
    // Under the new keys both sides number from 1 again: the new key's
    // record 1 is echoed as record 1 — the nonce of the first echo — under
    // the new key, and not the old one. A record under the old key no
    // longer opens.
    let new = seal_record(&seal_2, TO_SERVER, 1, payload(3, 100)).await;
    let old = seal_record(&seal_1, TO_SERVER, 2, payload(2, 100)).await;
    c.write_all(&new.unwrap()).await.unwrap();
    c.write_all(&old.unwrap()).await.unwrap();
    c.write_all(&record(kind::STATS, 9, &[])).await.unwrap();
    let (mut echoes, stats) = until_stats(&mut c).await;
    assert_eq!(echoes.len(), 1, "the old key's record is dropped");
    let (header, body) = echoes.pop().unwrap();
    assert_eq!(Header::decode(&header).seq, 1);
    let under_old = open_record(&open_1, FROM_SERVER, &header, body.clone()).await;
    assert!(matches!(
        under_old,
        Err(crypto_offload::Error::Authentication)
    ));
    let under_new = open_record(&open_2, FROM_SERVER, &header, body).await;
    assert_eq!(under_new.unwrap(), payload(3, 100));
    assert_eq!((stats.handshakes, stats.tampered, stats.records), (4, 1, 2));
}

#[tokio::test]
async fn a_replayed_connection_gets_new_keys_and_its_records_are_dropped_unanswered() {
    let server = Server::start(SERVER, &[]);
    let offload = Offload::builder().build().unwrap();
    let (proxy, recorded) = recording_proxy(server.addr).await;
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    let keys = client::handshake(&mut stream, None).await.unwrap();
    let to_client_key = gcm(keys.to_client()).await;
    let (mut tx, mut rx) = client::open(stream, &keys, &offload).await.unwrap();
    for n in 0..3 {
        tx.send(payload(n, 500)).await.unwrap();
    }
    tx.flush().await.unwrap();
    for n in 0..3 {
        assert_eq!(next(&mut rx).await, Received::Data(payload(n, 500)));
    }
    drop((tx, rx));
    let (sent, answered) = recorded.await.unwrap();

    // Every byte the client sent, HELLO and records, again on a new
    // connection.
    let mut replay = TcpStream::connect(server.addr).await.unwrap();
    replay.write_all(&sent).await.unwrap();
    replay
        .write_all(&record(kind::STATS, 0, &[]))
        .await
        .unwrap();
    let (records, stats) = until_stats(&mut replay).await;
    // A HELLO with another server key, and nothing sealed: the records,
    // under the first connection's keys, do not open under the new ones.
    assert_eq!(records.len(), 1, "no echo of a replayed record");
    let (header, hello) = &records[0];
    assert_eq!(Header::decode(header).kind, kind::HELLO);
    let first_hello = &answered[HEADER..HEADER + SERVER_HELLO];
    assert_ne!(hello[..PUBLIC], first_hello[..PUBLIC], "a fresh server key");
    assert_eq!((stats.tampered, stats.records, stats.handshakes), (3, 3, 2));
    // And what the server sent the first time opens under its keys only.
    let (header, body) = answered[HEADER + SERVER_HELLO..].split_at(HEADER);
    let header: [u8; HEADER] = header.try_into().unwrap();
    let body = body[..Header::decode(&header).len as usize].to_vec();
    assert_eq!(
        open_record(&to_client_key, FROM_SERVER, &header, body)
            .await
            .unwrap(),
        payload(0, 500)
    );
}

#[tokio::test]
async fn with_another_psk_the_client_stops_and_forged_records_do_not_open() {
    let dir = tempfile::tempdir().unwrap();
    let (path, other_path) = (dir.path().join("psk"), dir.path().join("other"));
    std::fs::write(&path, payload(1, 32)).unwrap();
    std::fs::write(&other_path, payload(2, 32)).unwrap();
    let (psk, other) = (Psk::load(&path).unwrap(), Psk::load(&other_path).unwrap());
    let server = Server::start(SERVER, &["--psk-file", path.to_str().unwrap()]);
    let said = server.stderr_with("authenticated", Duration::from_secs(10));
    assert!(
        said.contains("authenticated by the pre-shared key"),
        "{said}"
    );
    let offload = Offload::builder().build().unwrap();

    // The same PSK: records go through.
    let (mut tx, mut rx) = client::connect(server.addr, &offload, Some(&psk))
        .await
        .unwrap();
    tx.send(payload(3, 200)).await.unwrap();
    tx.flush().await.unwrap();
    assert_eq!(next(&mut rx).await, Received::Data(payload(3, 200)));

    // Another PSK, or none: the client refuses the server's HELLO.
    for wrong in [Some(&other), None] {
        let refused = client::connect(server.addr, &offload, wrong).await;
        assert!(
            matches!(
                refused,
                Err(RecordError::Handshake(HandshakeError::KeyMismatch))
            ),
            "{refused:?}"
        );
    }

    // One who goes on regardless (a man in the middle without the PSK):
    // what it seals under the keys it derives does not open at the server.
    // With the PSK, the same hand-made client gets through.
    for (guess, opens) in [(Some(&other), false), (None, false), (Some(&psk), true)] {
        let me = HandMade::new();
        let mut stream = TcpStream::connect(server.addr).await.unwrap();
        let reply = me.hello(&mut stream).await;
        let keys = me.keys(&reply, guess);
        let seal = gcm(keys.to_server()).await;
        for seq in 1..=3 {
            let r = seal_record(&seal, TO_SERVER, seq, payload(seq, 64)).await;
            stream.write_all(&r.unwrap()).await.unwrap();
        }
        stream
            .write_all(&record(kind::STATS, 0, &[]))
            .await
            .unwrap();
        let before = client::stats(server.addr).await.unwrap().tampered;
        let (echoes, stats) = until_stats(&mut stream).await;
        if opens {
            assert_eq!(echoes.len(), 3);
        } else {
            assert!(echoes.is_empty(), "a forged record was echoed");
            assert!(stats.tampered >= 3 && stats.tampered >= before);
        }
    }
    let stats = client::stats(server.addr).await.unwrap();
    assert_eq!((stats.tampered, stats.records), (6, 4));

    // The load generator takes the PSK file too, and fails without it.
    let addr = server.addr.to_string();
    let args = [
        "--addr",
        &addr,
        "--sizes",
        "64",
        "--connections",
        "1",
        "--records",
        "20",
    ];
    let with = [&args[..], &["--psk-file", path.to_str().unwrap()]].concat();
    let (ok, out, err) = run_load(LOAD, &with);
    assert!(ok, "{out}\n{err}");
    let (ok, out, err) = run_load(LOAD, &args);
    assert!(!ok, "{out}\n{err}");
    assert!(err.contains("does not confirm the keys"), "{err}");
}

#[test]
fn listen_takes_loopback_addresses_only_unless_insecure_listen_is_given() {
    common::listens_on_loopback_only(SERVER, &[], "a man in the middle");
}

#[tokio::test]
async fn past_the_connection_limit_a_connection_is_refused_until_one_closes() {
    let server = Server::start(SERVER, &["--max-connections", "2"]);
    let offload = Offload::builder().build().unwrap();
    let (mut tx1, mut rx1) = client::connect(server.addr, &offload, None).await.unwrap();
    let (mut tx2, mut rx2) = client::connect(server.addr, &offload, None).await.unwrap();
    for (tx, rx) in [(&mut tx1, &mut rx1), (&mut tx2, &mut rx2)] {
        tx.send(payload(1, 100)).await.unwrap();
        tx.flush().await.unwrap();
        assert_eq!(next(rx).await, Received::Data(payload(1, 100)));
    }

    // The third gets an ALERT at once and is closed; it is never queued.
    let mut third = TcpStream::connect(server.addr).await.unwrap();
    let (header, body) = raw_record(&mut third).await.expect("an ALERT");
    assert_eq!(Header::decode(&header).kind, kind::ALERT);
    assert_eq!(body[0], alert::BUSY);
    assert!(String::from_utf8_lossy(&body).contains("2 connections"));
    assert!(closed_by_server(&mut third).await);
    // Through the client: an error at connect.
    match client::connect(server.addr, &offload, None).await {
        Err(RecordError::Refused { code, .. }) => assert_eq!(code, alert::BUSY),
        Err(RecordError::Io(_)) => {} // the close won the race with the HELLO
        other => panic!("a refusal expected: {:?}", other.map(|_| ())),
    }
    tx1.request_stats().await.unwrap();
    tx1.flush().await.unwrap();
    let Received::Stats(stats) = next(&mut rx1).await else {
        panic!("STATS expected");
    };
    assert_eq!((stats.refused, stats.connections), (2, 2));

    // Once one closes, a new connection is served.
    drop((tx2, rx2));
    let started = Instant::now();
    let (mut tx, mut rx) = loop {
        match client::connect(server.addr, &offload, None).await {
            Ok(c) => break c,
            Err(e) if started.elapsed() < Duration::from_secs(5) => {
                drop(e);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("not served once a connection closed: {e}"),
        }
    };
    tx.send(payload(2, 100)).await.unwrap();
    tx.flush().await.unwrap();
    assert_eq!(next(&mut rx).await, Received::Data(payload(2, 100)));
}

#[tokio::test]
async fn a_connection_that_sends_no_whole_record_within_the_idle_timeout_is_closed() {
    let server = Server::start(SERVER, &["--idle-timeout", "1.5"]);
    let offload = Offload::builder().build().unwrap();
    let started = Instant::now();
    let mut silent = TcpStream::connect(server.addr).await.unwrap();
    // Part of a header, and nothing more: a trickle is idle too.
    let mut trickle = TcpStream::connect(server.addr).await.unwrap();
    trickle.write_all(&[kind::DATA, 0, 0]).await.unwrap();
    // A client that sends a record every 0.3 s stays open past 1.5 s.
    let (mut tx, mut rx) = client::connect(server.addr, &offload, None).await.unwrap();
    for n in 0..8 {
        tx.send(payload(n, 64)).await.unwrap();
        tx.flush().await.unwrap();
        assert_eq!(next(&mut rx).await, Received::Data(payload(n, 64)));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(started.elapsed() > Duration::from_millis(2400));
    assert!(closed_by_server(&mut silent).await);
    assert!(closed_by_server(&mut trickle).await);
    tx.request_stats().await.unwrap();
    tx.flush().await.unwrap();
    let Received::Stats(stats) = next(&mut rx).await else {
        panic!("STATS expected");
    };
    assert_eq!(stats.idle_closed, 2);
    // Idle in its turn, it is closed too, after the timeout and not before.
    let last = Instant::now();
    let end = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await;
    assert!(matches!(end, Ok(Ok(None))), "closed by the server: {end:?}");
    assert!(
        last.elapsed() >= Duration::from_millis(1400),
        "{:?}",
        last.elapsed()
    );
}
