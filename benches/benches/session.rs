//! The session API against direct calls to the fallback: what an `Offload`
//! session costs per request on the inline CPU path.
//!
//! ```text
//! cargo bench -p crypto-offload-benches --bench session
//! cargo run -p crypto-offload-benches --release --bin ratio-table
//! ```
//!
//! Measured the way a server uses a session: requests `.await`ed back to back
//! inside one task (the loop runs inside one future, polled once with a no-op
//! waker, since the CPU path never waits), against the same loop calling the
//! fallback directly — on the very same buffer, so that both see the same
//! alignment and cache state.

use std::hint::black_box;
use std::time::{Duration, Instant};

mod common;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use crypto_offload::{AeadAlg, CipherAlg, CrcAlg, Offload};
use crypto_offload_benches::{data, key, offload_with_slow_engine};
use crypto_offload_fallback as fb;
use futures::FutureExt;

const SIZES: [usize; 4] = [16, 1024, 4096, 65536];

fn group<'a>(
    c: &'a mut Criterion,
    name: &str,
) -> criterion::BenchmarkGroup<'a, criterion::measurement::WallTime> {
    common::group(c, name, Duration::from_millis(1500), 30)
}

fn block<F: std::future::Future>(f: F) -> F::Output {
    f.now_or_never().expect("the CPU path never waits")
}

/// Benches `direct` (on `&mut Vec<u8>`) and `session` (moving the `Vec` in
/// and out) over one shared buffer per size.
macro_rules! pair {
    ($g:expr, |$d:ident| $direct:expr, |$s:ident| $session:expr) => {
        for size in SIZES {
            $g.throughput(Throughput::Bytes(size as u64));
            let mut slot = Some(data(size));
            $g.bench_with_input(BenchmarkId::new("direct", size), &size, |b, _| {
                b.iter_custom(|iters| {
                    let mut buf = slot.take().unwrap();
                    let start = Instant::now();
                    for _ in 0..iters {
                        let $d = black_box(&mut buf);
                        black_box($direct);
                    }
                    let elapsed = start.elapsed();
                    slot = Some(buf);
                    elapsed
                })
            });
            $g.bench_with_input(BenchmarkId::new("session", size), &size, |b, _| {
                b.iter_custom(|iters| {
                    let buf = slot.take().unwrap();
                    let start = Instant::now();
                    let buf = block(async {
                        let mut buf = buf;
                        for _ in 0..iters {
                            let $s = black_box(buf);
                            buf = $session;
                        }
                        buf
                    });
                    let elapsed = start.elapsed();
                    slot = Some(buf);
                    elapsed
                })
            });
        }
    };
}

fn session(c: &mut Criterion) {
    let offload = futures::executor::block_on(Offload::discover()).unwrap();

    let mut g = group(c, "session-ctr-128");
    let direct = fb::Ctr::new(&key(16)).unwrap();
    let s = block(offload.cipher(CipherAlg::Aes128Ctr, &key(16))).unwrap();
    pair!(
        g,
        |buf| direct.apply_keystream(&[1; 16], buf).unwrap(),
        |buf| s.encrypt([1; 16], buf).await.unwrap()
    );
    g.finish();

    // What `'static` request futures would cost: the request holds an
    // `Arc` of its session (a clone and a drop a request), as a spawned
    // task or the `stream` adapters hold it. Beside `session-ctr-128`, it
    // is the measured case for keeping the futures borrowing.
    let mut g = group(c, "session-ctr-128-arc");
    let direct = fb::Ctr::new(&key(16)).unwrap();
    let s = std::sync::Arc::new(block(offload.cipher(CipherAlg::Aes128Ctr, &key(16))).unwrap());
    pair!(
        g,
        |buf| direct.apply_keystream(&[1; 16], buf).unwrap(),
        |buf| {
            let s = s.clone();
            async move { s.encrypt([1; 16], buf).await }.await.unwrap()
        }
    );
    g.finish();

    let mut g = group(c, "session-xts-256");
    let direct = fb::Xts::new(&key(64)).unwrap();
    let s = block(offload.cipher(CipherAlg::Aes256Xts, &key(64))).unwrap();
    pair!(g, |buf| direct.encrypt(&[1; 16], buf).unwrap(), |buf| s
        .encrypt([1; 16], buf)
        .await
        .unwrap());
    g.finish();

    let mut g = group(c, "session-gcm-128-seal");
    let direct = fb::Gcm::new(&key(16)).unwrap();
    let s = block(offload.aead(AeadAlg::Aes128Gcm, &key(16))).unwrap();
    pair!(
        g,
        |buf| direct.seal_in_place_detached(&[2; 12], b"", buf).unwrap(),
        |buf| {
            let (buf, tag) = s.seal_detached([2; 12], b"", buf).await.unwrap();
            black_box(tag);
            buf
        }
    );
    g.finish();

    let mut g = group(c, "session-crc32c");
    let mut direct = fb::Crc::new(fb::CrcAlg::Crc32Iscsi);
    let mut s = block(offload.crc(CrcAlg::Crc32Iscsi)).unwrap();
    pair!(g, |buf| direct.update(buf), |buf| s
        .update(buf)
        .await
        .unwrap());
    black_box(direct.finalize());
    g.finish();

    // The same with an engine on the machine, so that every request is a
    // choice (the engine is slower at every size here: the CPU wins, and
    // what is measured is what deciding that costs).
    let engine = with_engine();
    let mut g = group(c, "session-auto-crc32c");
    let mut direct = fb::Crc::new(fb::CrcAlg::Crc32Iscsi);
    let mut s = block(engine.crc(CrcAlg::Crc32Iscsi)).unwrap();
    pair!(g, |buf| direct.update(buf), |buf| s
        .update(buf)
        .await
        .unwrap());
    black_box(direct.finalize());
    g.finish();

    let mut g = group(c, "session-auto-ctr-128");
    let direct = fb::Ctr::new(&key(16)).unwrap();
    let s = block(engine.cipher(CipherAlg::Aes128Ctr, &key(16))).unwrap();
    pair!(
        g,
        |buf| direct.apply_keystream(&[1; 16], buf).unwrap(),
        |buf| s.encrypt([1; 16], buf).await.unwrap()
    );
    g.finish();
}

/// [`offload_with_slow_engine`] on a runtime of its own.
fn with_engine() -> Offload {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(offload_with_slow_engine())
}

criterion_group!(benches, session);
criterion_main!(benches);
