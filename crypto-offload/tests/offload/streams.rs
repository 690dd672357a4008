//! The `tokio::io` adapters (`crypto_offload::stream`) against the
//! whole-buffer API: random read and write sizes, flushes at random points,
//! inner readers and writers that take a few bytes at a time and say
//! `Pending`, on the CPU, on a `dyn Backend` engine and on a simulated
//! engine whose queue holds far fewer requests than the stream sends.

use crate::common;

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use crypto_offload::stream::{CipherReader, CipherWriter, CrcReader, CrcWriter, StreamOptions};
use crypto_offload::{
    Algorithm, CipherAlg, CipherMode, CipherSession, CrcAlg, Direction, Error, LengthRule, Offload,
};
use crypto_offload_fallback as fb;
use crypto_offload_sim::{SimConfig, SimEngine, SimTimer};
use proptest::prelude::*;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

/// An inner reader that hands out `sizes[i]` bytes at a time (cycling)
/// and, unless `pending` is 0, says `Pending` (waking at once) before
/// every `pending + 1`-th.
struct Trickle {
    data: Vec<u8>,
    at: usize,
    sizes: Vec<usize>,
    turn: usize,
    pending: usize,
}

impl Trickle {
    fn new(data: Vec<u8>, sizes: Vec<usize>, pending: usize) -> Self {
        Trickle {
            data,
            at: 0,
            sizes,
            turn: 0,
            pending,
        }
    }

    /// Whether this turn says `Pending`; the next size otherwise.
    fn next(&mut self, cx: &mut Context<'_>) -> Option<usize> {
        self.turn += 1;
        if self.pending > 0 && self.turn.is_multiple_of(self.pending + 1) {
            cx.waker().wake_by_ref();
            return None;
        }
        Some(self.sizes[self.turn % self.sizes.len()].max(1))
    }
}

impl AsyncRead for Trickle {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let Some(size) = this.next(cx) else {
            return Poll::Pending;
        };
        let n = size.min(buf.remaining()).min(this.data.len() - this.at);
        buf.put_slice(&this.data[this.at..this.at + n]);
        this.at += n;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Trickle {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let Some(size) = this.next(cx) else {
            return Poll::Pending;
        };
        let n = size.min(data.len());
        this.data.extend_from_slice(&data[..n]);
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The CPU alone; a `dyn Backend` engine that completes at once; a
/// simulated engine with one queue of two, on its own timer threads.
fn offloads() -> Vec<Offload> {
    let mut sim = SimConfig::new(
        "sim:narrow",
        CipherAlg::ALL.into_iter().map(Algorithm::Cipher).collect(),
        Duration::from_micros(5),
        4e9,
    );
    sim.queue_depth = 2;
    sim.timer = SimTimer::Device;
    vec![
        Offload::builder().build().unwrap(),
        Offload::builder()
            .backend(common::Engine::new("engine").shared())
            .pin("engine")
            .build()
            .unwrap(),
        Offload::builder()
            .backend(Arc::new(SimEngine::new(sim)))
            .pin("sim:narrow")
            .build()
            .unwrap(),
    ]
}

fn bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29) ^ seed ^ (i >> 8) as u8)
        .collect()
}

fn key(alg: CipherAlg, seed: u8) -> Vec<u8> {
    let mut key = bytes(alg.key_len(), seed);
    key[0] ^= 0xff; // XTS halves always differ
    key
}

async fn session(offload: &Offload, alg: CipherAlg, seed: u8, unit: usize) -> Arc<CipherSession> {
    let s = offload.cipher(alg, &key(alg, seed)).await.unwrap();
    Arc::new(if alg.mode() == CipherMode::Xts {
        s.with_data_unit(unit).unwrap()
    } else {
        s
    })
}

/// A length the mode takes whole: CBC whole blocks, XTS whole units.
fn whole_len(alg: CipherAlg, len: usize, unit: usize) -> usize {
    match alg.mode() {
        CipherMode::Cbc => len / 16 * 16,
        CipherMode::Xts => len / unit * unit,
        _ => len,
    }
}

/// What the whole-buffer API gives for all of `data` in one request.
async fn whole(s: &CipherSession, dir: Direction, iv: [u8; 16], data: &[u8]) -> Vec<u8> {
    if data.is_empty() {
        return Vec::new();
    }
    match dir {
        Direction::Encrypt => s.encrypt(iv, data.to_vec()).await.unwrap(),
        Direction::Decrypt => s.decrypt(iv, data.to_vec()).await.unwrap(),
    }
}

fn algs() -> impl Strategy<Value = CipherAlg> {
    prop::sample::select(CipherAlg::ALL.to_vec())
}

fn dirs() -> impl Strategy<Value = Direction> {
    prop_oneof![Just(Direction::Encrypt), Just(Direction::Decrypt)]
}

fn units() -> impl Strategy<Value = usize> {
    prop_oneof![Just(512usize), Just(4096), 16usize..200]
}

fn lens() -> impl Strategy<Value = usize> {
    prop_oneof![3 => 0usize..300, 3 => 0usize..20_000, 1 => 0usize..200_000]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn a_cipher_reader_gives_what_one_request_gives(
        alg in algs(), dir in dirs(), unit in units(), len in lens(), seed: u8, iv: [u8; 16],
        inner_sizes in prop::collection::vec(1usize..9000, 1..6), pending in 0usize..4,
        reads in prop::collection::vec(1usize..9000, 1..6),
        chunk in 1usize..20_000, depth in 1usize..9,
    ) {
        let rt = runtime();
        let len = whole_len(alg, len, unit);
        let data = bytes(len, seed);
        for offload in offloads() {
            let (got, want) = rt.block_on(async {
                let s = session(&offload, alg, seed, unit).await;
                let want = whole(&s, dir, iv, &data).await;
                let options = StreamOptions::default().chunk(chunk).depth(depth);
                let inner = Trickle::new(data.clone(), inner_sizes.clone(), pending);
                let mut r = CipherReader::new(inner, s, dir, iv, options).unwrap();
                let mut got = Vec::new();
                let mut buf = vec![0u8; 9000];
                for i in 0.. {
                    let n = r.read(&mut buf[..reads[i % reads.len()]]).await.unwrap();
                    if n == 0 {
                        break;
                    }
                    got.extend_from_slice(&buf[..n]);
                }
                (got, want)
            });
            prop_assert!(got == want, "{} {:?} on {:?}: {} bytes, want {}", alg, dir, offload, got.len(), want.len());
        }
    }

    #[test]
    fn a_cipher_writer_gives_what_one_request_gives(
        alg in algs(), dir in dirs(), unit in units(), len in lens(), seed: u8, iv: [u8; 16],
        writes in prop::collection::vec(1usize..9000, 1..6),
        inner_sizes in prop::collection::vec(1usize..9000, 1..6), pending in 0usize..4,
        flush_every in 0usize..5, chunk in 1usize..20_000, depth in 1usize..9,
    ) {
        let rt = runtime();
        let len = whole_len(alg, len, unit);
        let data = bytes(len, seed);
        for offload in offloads() {
            let (got, want) = rt.block_on(async {
                let s = session(&offload, alg, seed, unit).await;
                let want = whole(&s, dir, iv, &data).await;
                let options = StreamOptions::default().chunk(chunk).depth(depth);
                let inner = Trickle::new(Vec::new(), inner_sizes.clone(), pending);
                let mut w = CipherWriter::new(inner, s, dir, iv, options).unwrap();
                let mut at = 0;
                for i in 0.. {
                    if at == len {
                        break;
                    }
                    let end = (at + writes[i % writes.len()]).min(len);
                    w.write_all(&data[at..end]).await.unwrap();
                    at = end;
                    if flush_every > 0 && i % flush_every == 0 {
                        w.flush().await.unwrap();
                        // After a flush the inner writer holds every whole
                        // block (CTR: every byte) written so far.
                        let flushed = w.get_ref().data.len();
                        let granule = match alg.mode() {
                            CipherMode::Ctr => 1,
                            CipherMode::Cbc => 16,
                            _ => unit,
                        };
                        assert_eq!(flushed, at / granule * granule);
                    }
                }
                w.shutdown().await.unwrap();
                (w.into_inner().data, want)
            });
            prop_assert!(got == want, "{} {:?} on {:?}: {} bytes, want {}", alg, dir, offload, got.len(), want.len());
        }
    }

    #[test]
    fn crc_adapters_give_the_one_shot_checksum(
        alg in prop::sample::select(CrcAlg::ALL.to_vec()), len in lens(), seed: u8,
        sizes in prop::collection::vec(1usize..9000, 1..6), pending in 0usize..4,
    ) {
        let rt = runtime();
        let data = bytes(len, seed);
        let want = fb::checksum(alg, &data);
        let offload = Offload::builder().build().unwrap();
        rt.block_on(async {
            let crc = offload.crc(alg).await.unwrap();
            let mut r = CrcReader::new(Trickle::new(data.clone(), sizes.clone(), pending), crc)
                .verify_at_end(want);
            let mut back = Vec::new();
            r.read_to_end(&mut back).await.unwrap();
            assert_eq!(back, data);
            assert_eq!(r.checksum(), want);

            let crc = offload.crc(alg).await.unwrap();
            let mut w = CrcWriter::new(Trickle::new(Vec::new(), sizes.clone(), pending), crc)
                .verify_at_end(want);
            w.write_all(&data).await.unwrap();
            w.shutdown().await.unwrap();
            assert_eq!(w.checksum(), want);
            assert_eq!(w.into_parts().0.data, data);
        });
    }
}

fn inner_error(e: &io::Error) -> &Error {
    e.get_ref()
        .and_then(|e| e.downcast_ref::<Error>())
        .unwrap_or_else(|| panic!("no crypto_offload::Error in {e:?}"))
}

#[tokio::test]
async fn a_checksum_that_does_not_match_fails_the_read_that_ends_the_stream() {
    let offload = Offload::builder().build().unwrap();
    let data = bytes(10_000, 3);
    let right = fb::checksum(CrcAlg::CRC32C, &data);
    let crc = offload.crc(CrcAlg::CRC32C).await.unwrap();
    let mut r = CrcReader::new(&data[..], crc).verify_at_end(right ^ 1);
    let mut back = Vec::new();
    let e = r.read_to_end(&mut back).await.unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    assert!(matches!(
        inner_error(&e),
        Error::ChecksumMismatch { expected, computed } if *expected == right ^ 1 && *computed == right
    ));
    // Every byte was handed out before the end was found wrong.
    assert_eq!(back, data);

    let crc = offload.crc(CrcAlg::CRC32C).await.unwrap();
    let mut w = CrcWriter::new(Vec::new(), crc).verify_at_end(right ^ 1);
    w.write_all(&data).await.unwrap();
    let e = w.shutdown().await.unwrap_err();
    assert!(matches!(inner_error(&e), Error::ChecksumMismatch { .. }));
}

#[tokio::test]
async fn an_xts_stream_needs_a_data_unit_and_whole_units() {
    let offload = Offload::builder().build().unwrap();
    let plain = Arc::new(
        offload
            .cipher(CipherAlg::Aes128Xts, &key(CipherAlg::Aes128Xts, 1))
            .await
            .unwrap(),
    );
    let e = CipherReader::new(
        &[][..],
        plain,
        Direction::Encrypt,
        [0; 16],
        StreamOptions::default(),
    )
    .unwrap_err();
    assert!(matches!(
        e,
        Error::DataLength {
            rule: LengthRule::DataUnitNotSet,
            ..
        }
    ));

    let s = session(&offload, CipherAlg::Aes128Xts, 1, 512).await;
    // 3 units and 100 bytes: the reader hands out the units, then fails.
    let data = bytes(3 * 512 + 100, 2);
    let options = StreamOptions::default().chunk(512);
    let mut r =
        CipherReader::new(&data[..], s.clone(), Direction::Encrypt, [0; 16], options).unwrap();
    let mut got = Vec::new();
    let e = r.read_to_end(&mut got).await.unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    assert!(matches!(
        inner_error(&e),
        Error::DataLength {
            len: 1636,
            rule: LengthRule::MultipleOfDataUnit(512),
            ..
        }
    ));
    assert_eq!(
        got,
        whole(&s, Direction::Encrypt, [0; 16], &data[..1536]).await
    );
    // The stream stays failed.
    assert!(r.read(&mut [0; 16]).await.is_err());

    let mut w =
        CipherWriter::new(Vec::new(), s.clone(), Direction::Encrypt, [0; 16], options).unwrap();
    w.write_all(&data).await.unwrap();
    w.flush().await.unwrap();
    assert_eq!(w.get_ref().len(), 1536, "a flush writes whole units only");
    let e = w.shutdown().await.unwrap_err();
    assert!(matches!(inner_error(&e), Error::DataLength { .. }));
    assert!(w.write(&[0]).await.is_err());
}

#[tokio::test]
async fn a_cbc_stream_that_ends_inside_a_block_fails() {
    let offload = Offload::builder().build().unwrap();
    let s = session(&offload, CipherAlg::Aes256Cbc, 1, 0).await;
    let data = bytes(40, 2);
    let mut r = CipherReader::new(
        &data[..],
        s,
        Direction::Decrypt,
        [9; 16],
        StreamOptions::default(),
    )
    .unwrap();
    let e = r.read_to_end(&mut Vec::new()).await.unwrap_err();
    assert!(matches!(
        inner_error(&e),
        Error::DataLength {
            len: 40,
            rule: LengthRule::MultipleOfBlock,
            ..
        }
    ));
}

#[tokio::test]
async fn a_wrong_iv_length_is_refused() {
    let offload = Offload::builder().build().unwrap();
    let s = session(&offload, CipherAlg::Aes128Ctr, 1, 0).await;
    let e = CipherWriter::new(
        Vec::new(),
        s,
        Direction::Encrypt,
        &[0u8; 12][..],
        StreamOptions::default(),
    )
    .unwrap_err();
    assert!(matches!(
        e,
        Error::IvLength {
            len: 12,
            expected: 16,
            ..
        }
    ));
}

/// An inner writer that fails, or accepts nothing.
struct Broken(bool);

impl AsyncWrite for Broken {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, _: &[u8]) -> Poll<io::Result<usize>> {
        Poll::Ready(if self.0 {
            Err(io::Error::other("disk on fire"))
        } else {
            Ok(0)
        })
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[tokio::test]
async fn an_inner_writer_s_errors_come_through() {
    let offload = Offload::builder().build().unwrap();
    let s = session(&offload, CipherAlg::Aes128Ctr, 1, 0).await;
    for (broken, kind) in [
        (true, io::ErrorKind::Other),
        (false, io::ErrorKind::WriteZero),
    ] {
        let mut w = CipherWriter::new(
            Broken(broken),
            s.clone(),
            Direction::Encrypt,
            [0; 16],
            StreamOptions::default().chunk(16),
        )
        .unwrap();
        // The first chunk is gathered and sent; writing it out fails.
        let e = w.write_all(&[1; 100]).await.unwrap_err();
        assert_eq!(e.kind(), kind);
    }
}

/// Far more requests in flight than the engine's queue holds (one queue of
/// two; the stream sends 64), a megabyte through 1 KiB requests: the
/// engine's back-pressure holds the rest, nothing is lost or reordered, and
/// the engine ran them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deep_stream_on_a_narrow_engine_loses_nothing() {
    let (engine, offload) = pinned_sim(
        "sim:narrow",
        CipherAlg::Aes256Xts,
        Duration::from_micros(20),
        2e9,
        2,
    );
    let s = session(&offload, CipherAlg::Aes256Xts, 4, 512).await;
    let data = bytes(1 << 20, 5);
    let options = StreamOptions::default().depth(64).chunk(1024);
    let mut w = CipherWriter::new(
        Vec::new(),
        s.clone(),
        Direction::Encrypt,
        7u128.to_le_bytes(),
        options,
    )
    .unwrap();
    w.write_all(&data).await.unwrap();
    w.shutdown().await.unwrap();
    let sealed = w.into_inner();
    assert_eq!(
        sealed,
        whole(&s, Direction::Encrypt, 7u128.to_le_bytes(), &data).await
    );
    let mut r = CipherReader::new(
        &sealed[..],
        s,
        Direction::Decrypt,
        7u128.to_le_bytes(),
        options,
    )
    .unwrap();
    let mut back = Vec::new();
    r.read_to_end(&mut back).await.unwrap();
    assert!(back == data);
    assert!(
        engine.requests() >= 2 * 1024,
        "the engine ran {} requests",
        engine.requests()
    );
}

/// An inner reader that hands out its data, fails once, then ends.
struct FailsOnce {
    data: Vec<u8>,
    at: usize,
    failed: bool,
}

impl AsyncRead for FailsOnce {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.at == this.data.len() && !this.failed {
            this.failed = true;
            return Poll::Ready(Err(io::ErrorKind::ConnectionReset.into()));
        }
        let n = buf.remaining().min(this.data.len() - this.at).min(7000);
        buf.put_slice(&this.data[this.at..this.at + n]);
        this.at += n;
        Poll::Ready(Ok(()))
    }
}

/// The inner reader's error comes after every byte it delivered before it
/// (read ahead, in requests), and reading goes on after it.
#[tokio::test]
async fn an_inner_reader_s_error_comes_after_what_it_delivered() {
    let offload = Offload::builder().build().unwrap();
    for alg in [CipherAlg::Aes128Ctr, CipherAlg::Aes256Xts] {
        let s = session(&offload, alg, 3, 512).await;
        let data = bytes(100_352, 4); // 196 units of 512
        let inner = FailsOnce {
            data: data.clone(),
            at: 0,
            failed: false,
        };
        let options = StreamOptions::default().chunk(8192).depth(4);
        let mut r =
            CipherReader::new(inner, s.clone(), Direction::Encrypt, [1; 16], options).unwrap();
        let mut got = Vec::new();
        let e = r.read_to_end(&mut got).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionReset);
        assert_eq!(got.len(), data.len(), "{alg}: the bytes before the error");
        assert_eq!(r.read(&mut [0; 16]).await.unwrap(), 0, "then the end");
        assert_eq!(got, whole(&s, Direction::Encrypt, [1; 16], &data).await);
    }
}

/// The CTR counter and the XTS tweak wrap at 2^128 across requests and
/// flushed partial blocks, as one request's do.
#[tokio::test]
async fn counters_and_tweaks_wrap_across_requests() {
    let offload = Offload::builder().build().unwrap();
    let cases = [
        (CipherAlg::Aes128Ctr, (u128::MAX - 3).to_be_bytes()),
        (CipherAlg::Aes256Xts, (u128::MAX - 1).to_le_bytes()),
    ];
    for (alg, iv) in cases {
        let s = session(&offload, alg, 5, 16).await;
        let data = bytes(16 * 9, 6);
        let options = StreamOptions::default().chunk(16).depth(3);
        let mut w =
            CipherWriter::new(Vec::new(), s.clone(), Direction::Encrypt, iv, options).unwrap();
        for piece in data.chunks(5) {
            w.write_all(piece).await.unwrap();
            w.flush().await.unwrap();
        }
        w.shutdown().await.unwrap();
        assert_eq!(
            w.into_inner(),
            whole(&s, Direction::Encrypt, iv, &data).await,
            "{alg}"
        );
    }
}

#[tokio::test]
async fn a_writer_refuses_writes_after_shutdown_and_a_second_shutdown_is_a_no_op() {
    let offload = Offload::builder().build().unwrap();
    let s = session(&offload, CipherAlg::Aes128Ctr, 1, 0).await;
    let mut w = CipherWriter::new(
        Vec::new(),
        s,
        Direction::Encrypt,
        [0; 16],
        StreamOptions::default(),
    )
    .unwrap();
    w.write_all(b"abc").await.unwrap();
    w.shutdown().await.unwrap();
    w.shutdown().await.unwrap();
    assert_eq!(
        w.write(b"d").await.unwrap_err().kind(),
        io::ErrorKind::BrokenPipe
    );
    assert_eq!(w.get_ref().len(), 3);
}

/// After a stream fails, every later call fails with the same kind.
#[tokio::test]
async fn a_failed_stream_keeps_its_error_kind() {
    let offload = Offload::builder().build().unwrap();
    let s = session(&offload, CipherAlg::Aes128Cbc, 1, 0).await;
    let data = bytes(20, 1);
    let mut r = CipherReader::new(
        &data[..],
        s,
        Direction::Encrypt,
        [0; 16],
        StreamOptions::default(),
    )
    .unwrap();
    let mut got = Vec::new();
    assert_eq!(
        r.read_to_end(&mut got).await.unwrap_err().kind(),
        io::ErrorKind::InvalidInput
    );
    assert_eq!(got.len(), 16);
    let again = r.read(&mut [0; 16]).await.unwrap_err();
    assert_eq!(again.kind(), io::ErrorKind::InvalidInput);
    assert!(again.to_string().contains("failed earlier"), "{again}");
}

/// The engine vanishes in the middle of a stream: its requests complete on
/// the CPU, and the stream's output is whole and in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_that_vanishes_mid_stream_loses_nothing() {
    let (engine, offload) = pinned_sim(
        "sim:vanishing",
        CipherAlg::Aes128Ctr,
        Duration::from_micros(30),
        2e9,
        4,
    );
    let s = session(&offload, CipherAlg::Aes128Ctr, 2, 0).await;
    let data = bytes(1 << 20, 9);
    let options = StreamOptions::default().depth(16).chunk(4096);
    let mut w =
        CipherWriter::new(Vec::new(), s.clone(), Direction::Encrypt, [3; 16], options).unwrap();
    w.write_all(&data[..300_000]).await.unwrap();
    engine.set_gone(true);
    w.write_all(&data[300_000..]).await.unwrap();
    w.shutdown().await.unwrap();
    let ran = engine.requests();
    assert!(ran > 0 && ran < 256, "the engine ran {ran} of 256 requests");
    engine.set_gone(false);
    assert_eq!(
        w.into_inner(),
        whole(&s, Direction::Encrypt, [3; 16], &data).await
    );
}

/// A reader dropped with requests in flight on an engine: the engine
/// finishes them and idles, and the session goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_stream_with_requests_in_flight_is_safe() {
    let (engine, offload) = pinned_sim(
        "sim:slow",
        CipherAlg::Aes256Ctr,
        Duration::from_millis(2),
        1e9,
        2,
    );
    let s = session(&offload, CipherAlg::Aes256Ctr, 2, 0).await;
    let data = bytes(1 << 18, 9);
    let options = StreamOptions::default().depth(8).chunk(4096);
    let mut r =
        CipherReader::new(&data[..], s.clone(), Direction::Encrypt, [3; 16], options).unwrap();
    let mut first = [0u8; 100];
    r.read_exact(&mut first).await.unwrap();
    drop(r);
    tokio::time::timeout(Duration::from_secs(10), engine.idle())
        .await
        .expect("the engine idles");
    let again = s.encrypt([3; 16], data[..4096].to_vec()).await.unwrap();
    assert_eq!(&again[..100], &first[..]);
}

/// A simulated engine for `alg` alone, with one queue of `depth`, and an
/// `Offload` pinned to it.
fn pinned_sim(
    name: &str,
    alg: CipherAlg,
    latency: Duration,
    bandwidth: f64,
    depth: usize,
) -> (Arc<SimEngine>, Offload) {
    let mut sim = SimConfig::new(name, vec![Algorithm::Cipher(alg)], latency, bandwidth);
    sim.queue_depth = depth;
    let engine = Arc::new(SimEngine::new(sim));
    let offload = Offload::builder()
        .backend(engine.clone())
        .pin(name)
        .build()
        .unwrap();
    (engine, offload)
}
