//! The request pipeline every session shares, and the slots under it:
//! cancellation while a context opens, replays with the original
//! parameters, a bad tag on an engine and on the blocking pool, the probe
//! task's lifetime, calibration's per-algorithm limits, and the futures'
//! sizes.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_trait::async_trait;
use crypto_offload::backend::{
    AeadContext, Backend, BackendError, CipherContext, CipherParams, CrcContext, Failed, IoBuf,
    Limits, SecretKey, SharedBackend,
};
use crypto_offload::{
    AeadAlg, Algorithm, BackendKind, CipherAlg, CrcAlg, Direction, Error, Offload,
};

fn key(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(7))
        .collect()
}

const CBC: CipherAlg = CipherAlg::Aes128Cbc;

#[tokio::test(start_paused = true)]
async fn the_probe_task_stops_once_offload_and_sessions_are_gone_though_the_user_keeps_the_backend()
{
    let engine = Arc::new(common::Engine::new("e").failing_every(1));
    let shared: SharedBackend = engine.clone();
    let offload = Offload::builder()
        .backend(shared.clone())
        .pin("e")
        .probe_interval(Duration::from_millis(10))
        .build()
        .unwrap();
    let s = offload.cipher(CBC, &key(16)).await.unwrap();
    let cpu = Offload::builder().build().unwrap();
    let want = cpu
        .cipher(CBC, &key(16))
        .await
        .unwrap()
        .encrypt([3; 16], vec![9u8; 64])
        .await
        .unwrap();
    assert_eq!(s.encrypt([3; 16], vec![9u8; 64]).await.unwrap(), want);
    let b = offload.backends();
    assert_eq!(
        (
            b[1].stats.failures,
            b[0].stats.replayed,
            b[1].stats.breaker_opened
        ),
        (1, 1, 1)
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let probed = engine.requests.load(Ordering::Relaxed);
    assert!(probed > 2, "probes ran: {probed}");
    drop(s);
    drop(offload);
    // Longest back-off is 32 × 10 ms: the task wakes, finds the breaker gone.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let settled = engine.requests.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(
        engine.requests.load(Ordering::Relaxed),
        settled,
        "still probing"
    );
    // Only the test's two handles remain (the task held it weakly).
    assert_eq!(Arc::strong_count(&engine), 2);
}

#[tokio::test]
async fn a_tag_that_fails_on_an_engine_is_authentication_zeroed_and_trips_nothing() {
    let engine = Arc::new(common::Engine::new("e"));
    let offload = Offload::builder()
        .backend(engine.clone())
        .pin("e")
        .build()
        .unwrap();
    let g = offload.aead(AeadAlg::Aes128Gcm, &key(16)).await.unwrap();
    let mut sealed = g.seal([1; 12], b"aad", vec![5u8; 100]).await.unwrap();
    let on_engine = engine.requests.load(Ordering::Relaxed);
    assert_eq!(on_engine, 1);
    for detached in [false, true] {
        sealed[3] ^= 1;
        let r = if detached {
            let (ct, tag) = sealed.split_at(100);
            g.open_detached([1; 12], b"aad", ct.to_vec(), tag).await
        } else {
            g.open([1; 12], b"aad", sealed.clone()).await
        };
        sealed[3] ^= 1;
        let e = r.unwrap_err();
        assert!(
            matches!(e.error(), Error::Authentication),
            "{:?}",
            e.error()
        );
        let buf = e.into_buffer();
        assert_eq!(buf.len(), 100);
        assert!(buf.iter().all(|&b| b == 0));
    }
    assert_eq!(
        engine.requests.load(Ordering::Relaxed),
        3,
        "both opens ran on the engine"
    );
    let b = offload.backends();
    assert_eq!(b[1].stats.failures, 0);
    assert_eq!(b[1].stats.breaker_opened, 0);
    assert_eq!(b[0].stats.replayed, 0);
    assert_eq!(b[0].stats.requests, 0, "not replayed on the CPU");
    assert_eq!(
        g.open([1; 12], b"aad", sealed).await.unwrap(),
        vec![5u8; 100]
    );
}

#[tokio::test]
async fn a_tag_that_fails_on_the_blocking_pool_is_authentication_zeroed() {
    let offload = Offload::builder().build().unwrap();
    let g = offload.aead(AeadAlg::Aes256Gcm, &key(32)).await.unwrap();
    let len = 16 << 20; // > 500 µs at the default 8 B/ns: the blocking pool.
    let mut sealed = g.seal([1; 12], b"", vec![5u8; len]).await.unwrap();
    sealed[len - 1] ^= 1;
    let e = g.open([1; 12], b"", sealed).await.unwrap_err();
    assert!(matches!(e.error(), Error::Authentication));
    let buf = e.into_buffer();
    assert_eq!(buf.len(), len);
    assert!(buf.iter().all(|&b| b == 0));
}

/// Every request the engine gets fails (or every other one): each is
/// replayed on the CPU with its original parameters.
#[tokio::test]
async fn replays_use_the_original_parameters_for_every_operation() {
    for every in [1, 2] {
        let engine = Arc::new(common::Engine::new("e").failing_every(every));
        let offload = Offload::builder()
            .backend(engine.clone())
            .pin("e")
            .probe_interval(Duration::from_secs(3600))
            .build()
            .unwrap();
        let cpu = Offload::builder().build().unwrap();
        // XTS over 8 data units of 512.
        let xts = offload
            .cipher(CipherAlg::Aes256Xts, &key(64))
            .await
            .unwrap()
            .with_data_unit(512)
            .unwrap();
        let xts_cpu = cpu
            .cipher(CipherAlg::Aes256Xts, &key(64))
            .await
            .unwrap()
            .with_data_unit(512)
            .unwrap();
        let pt: Vec<u8> = (0..4096u32).map(|i| i as u8).collect();
        for sector in 0..4u128 {
            let iv = (sector * 8).to_le_bytes();
            let want = xts_cpu.encrypt(iv, pt.clone()).await.unwrap();
            assert_eq!(xts.encrypt(iv, pt.clone()).await.unwrap(), want);
            assert_eq!(xts.decrypt(iv, want).await.unwrap(), pt);
        }
        // GCM: seal, open (tag on the end), open detached.
        let g = offload.aead(AeadAlg::Aes128Gcm, &key(16)).await.unwrap();
        let gc = cpu.aead(AeadAlg::Aes128Gcm, &key(16)).await.unwrap();
        for n in 0..4u8 {
            let nonce = [n; 12];
            let want = gc.seal(nonce, b"hdr", pt.clone()).await.unwrap();
            assert_eq!(g.seal(nonce, b"hdr", pt.clone()).await.unwrap(), want);
            assert_eq!(g.open(nonce, b"hdr", want.clone()).await.unwrap(), pt);
            let (ct, tag) = want.split_at(pt.len());
            assert_eq!(
                g.open_detached(nonce, b"hdr", ct.to_vec(), tag)
                    .await
                    .unwrap(),
                pt
            );
        }
        // CRC over pieces, some on the engine, some replayed.
        let mut c = offload.crc(CrcAlg::Crc64Nvme).await.unwrap();
        let mut whole = Vec::new();
        for i in 0..9usize {
            let piece: Vec<u8> = (0..(i * 37 + 1)).map(|j| (j * i) as u8).collect();
            whole.extend_from_slice(&piece);
            assert_eq!(c.update(piece.clone()).await.unwrap(), piece);
        }
        let mut r = cpu.crc(CrcAlg::Crc64Nvme).await.unwrap();
        r.update_from_slice(&whole);
        assert_eq!((c.finalize(), c.len()), (r.finalize(), r.len()));
        let b = offload.backends();
        assert_eq!(b[0].stats.replayed, b[1].stats.failures);
        assert!(b[1].stats.failures > 0);
        if every == 2 {
            assert!(b[1].stats.requests > 0);
        }
    }
}

/// A backend whose contexts take `open` to open.
#[derive(Debug)]
struct SlowOpen(common::Engine, Duration);

#[async_trait]
impl Backend for SlowOpen {
    fn name(&self) -> &str {
        self.0.name()
    }
    fn kind(&self) -> BackendKind {
        BackendKind::Other
    }
    fn limits(&self, alg: Algorithm) -> Option<Limits> {
        // A third party can set the field directly: 0 must be taken as 1.
        let mut l = self.0.limits(alg)?;
        l.length_multiple = 0;
        Some(l)
    }
    async fn open_cipher(
        &self,
        alg: CipherAlg,
        key: &SecretKey,
    ) -> Result<Box<dyn CipherContext>, BackendError> {
        tokio::time::sleep(self.1).await;
        self.0.open_cipher(alg, key).await
    }
    async fn open_aead(
        &self,
        alg: AeadAlg,
        key: &SecretKey,
    ) -> Result<Box<dyn AeadContext>, BackendError> {
        tokio::time::sleep(self.1).await;
        self.0.open_aead(alg, key).await
    }
    async fn open_crc(&self, alg: CrcAlg) -> Result<Box<dyn CrcContext>, BackendError> {
        tokio::time::sleep(self.1).await;
        self.0.open_crc(alg).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_request_dropped_while_its_context_opens_frees_its_buffer_and_its_slot() {
    // Pin-free: make the engine win every request by profile.
    let mut text = String::new();
    for (b, ns) in [("cpu", 1e9), ("slow", 1.0)] {
        for alg in ["aes-128-cbc"] {
            for dir in ["encrypt", "decrypt"] {
                text += &format!(
                    "[[entry]]\nbackend = \"{b}\"\nalg = \"{alg}\"\ndir = \"{dir}\"\n\
                     fixed_ns = {ns:?}\nper_byte_ns = 0.0\ncpu_fixed_ns = 0.0\n\
                     cpu_per_byte_ns = 0.0\nparallelism = 1\nqueue_depth = 64\n"
                );
            }
        }
    }
    let profile = crypto_offload::Profile::from_toml(&text).unwrap();
    let offload = Offload::builder()
        .backend(Arc::new(SlowOpen(
            common::Engine::new("slow"),
            Duration::from_secs(1),
        )))
        .profile(profile)
        .build()
        .unwrap();
    assert_eq!(
        offload.explain(CBC, Direction::Encrypt, 4096).choice,
        "slow"
    );
    let s = offload.cipher(CBC, &key(16)).await.unwrap();
    for _ in 0..3 {
        let (buf, kept) = common::tracked(&[7u8; 4096]);
        let r = tokio::time::timeout(Duration::from_millis(300), s.encrypt([0; 16], buf)).await;
        assert!(r.is_err(), "still opening");
        assert!(kept.is_unique(), "the buffer was freed");
        let e = offload.explain(CBC, Direction::Encrypt, 1);
        assert!(e.candidates.iter().all(|c| c.in_flight == 0), "{e}");
    }
    // The next one opens the context and completes on the engine.
    let ct = s.encrypt([0; 16], vec![7u8; 4096]).await.unwrap();
    let want = Offload::builder()
        .build()
        .unwrap()
        .cipher(CBC, &key(16))
        .await
        .unwrap()
        .encrypt([0; 16], vec![7u8; 4096])
        .await
        .unwrap();
    assert_eq!(ct, want);
    let b = offload.backends();
    assert_eq!((b[1].stats.requests, b[1].stats.failures), (1, 0), "{b:#?}");
    drop(offload);
}

/// Contexts that take `delay` a request (on tokio's clock).
struct Slow<C: ?Sized>(Box<C>, Duration);

#[async_trait]
impl CipherContext for Slow<dyn CipherContext> {
    async fn encrypt(&self, p: CipherParams, buf: IoBuf) -> Result<IoBuf, Failed> {
        tokio::time::sleep(self.1).await;
        self.0.encrypt(p, buf).await
    }
    async fn decrypt(&self, p: CipherParams, buf: IoBuf) -> Result<IoBuf, Failed> {
        tokio::time::sleep(self.1).await;
        self.0.decrypt(p, buf).await
    }
}

#[async_trait]
impl AeadContext for Slow<dyn AeadContext> {
    async fn seal(
        &self,
        nonce: [u8; 12],
        aad: &[u8],
        buf: IoBuf,
    ) -> Result<(IoBuf, [u8; 16]), Failed> {
        tokio::time::sleep(self.1).await;
        self.0.seal(nonce, aad, buf).await
    }
    async fn open(
        &self,
        nonce: [u8; 12],
        aad: &[u8],
        buf: IoBuf,
        tag: [u8; 16],
    ) -> Result<IoBuf, Failed> {
        tokio::time::sleep(self.1).await;
        self.0.open(nonce, aad, buf, tag).await
    }
}

/// CBC with no queue limit, GCM with a queue of 4; 150 ms a request.
#[derive(Debug)]
struct TwoQueues;

#[async_trait]
impl Backend for TwoQueues {
    fn name(&self) -> &str {
        "two-queues"
    }
    fn kind(&self) -> BackendKind {
        BackendKind::Other
    }
    fn limits(&self, alg: Algorithm) -> Option<Limits> {
        match alg {
            Algorithm::Cipher(CipherAlg::Aes128Cbc) => Some(Limits::new()),
            Algorithm::Aead(AeadAlg::Aes128Gcm) => Some(Limits::new().with_queue_depth(4)),
            _ => None,
        }
    }
    async fn open_cipher(
        &self,
        alg: CipherAlg,
        key: &SecretKey,
    ) -> Result<Box<dyn CipherContext>, BackendError> {
        let c = crypto_offload::cpu::CpuBackend::new()
            .open_cipher(alg, key)
            .await?;
        Ok(Box::new(Slow(c, Duration::from_millis(150))))
    }
    async fn open_aead(
        &self,
        alg: AeadAlg,
        key: &SecretKey,
    ) -> Result<Box<dyn AeadContext>, BackendError> {
        let c = crypto_offload::cpu::CpuBackend::new()
            .open_aead(alg, key)
            .await?;
        Ok(Box::new(Slow(c, Duration::from_millis(150))))
    }
    async fn open_crc(&self, _: CrcAlg) -> Result<Box<dyn CrcContext>, BackendError> {
        Err(BackendError::Unsupported("crc".into()))
    }
}

/// `Limits::queue_depth` is per algorithm now, but an entry calibration has
/// no time left for copies the last measured entry's cost whole — that
/// algorithm's queue depth included.
#[tokio::test(start_paused = true)]
async fn calibration_keeps_each_algorithms_own_queue_depth() {
    let offload = Offload::builder()
        .backend(Arc::new(TwoQueues))
        .build()
        .unwrap();
    offload.calibrate().await.unwrap();
    let depth = |alg: &str| {
        offload
            .profile()
            .entries
            .iter()
            .filter(|e| e.backend == "two-queues" && e.alg == alg)
            .map(|e| e.cost.queue_depth)
            .collect::<Vec<_>>()
    };
    assert_eq!(depth("aes-128-cbc"), vec![u32::MAX, u32::MAX]);
    assert_eq!(
        depth("aes-128-gcm"),
        vec![4, 4],
        "GCM declared a queue of 4"
    );
}

/// The futures stay small: they are moved on every poll of the inline CPU
/// path. (Before the pipeline was shared: cipher 56, seal 64, open 80 and
/// CRC 32 bytes; a CRC update holding three borrows of its session was 56.)
#[test]
fn future_sizes() {
    use core::mem::size_of;
    use crypto_offload::{CipherRequest, CrcUpdate, Open, SealDetached};
    let sizes = [
        size_of::<CipherRequest<'_, Vec<u8>>>(),
        size_of::<SealDetached<'_, Vec<u8>>>(),
        size_of::<Open<'_, Vec<u8>>>(),
        size_of::<CrcUpdate<'_, Vec<u8>>>(),
    ];
    assert!(
        sizes[0] <= 56 && sizes[1] <= 64 && sizes[2] <= 80 && sizes[3] <= 40,
        "cipher, seal, open, crc: {sizes:?}"
    );
}

/// A backend breaking its contract: its CRC contexts hand back a buffer
/// shorter than the one they were given (with the right CRC of the whole).
#[derive(Debug)]
struct Shortening(common::Engine);

struct ShortCrc(Box<dyn CrcContext>);

#[async_trait]
impl CrcContext for ShortCrc {
    async fn checksum(&self, buf: IoBuf) -> Result<(IoBuf, u64), Failed> {
        let (buf, crc) = self.0.checksum(buf).await?;
        let mut v = Vec::from(buf);
        v.truncate(v.len() / 2);
        Ok((v.into(), crc))
    }
}

#[async_trait]
impl Backend for Shortening {
    fn name(&self) -> &str {
        self.0.name()
    }
    fn kind(&self) -> BackendKind {
        BackendKind::Other
    }
    fn limits(&self, alg: Algorithm) -> Option<Limits> {
        self.0.limits(alg)
    }
    async fn open_cipher(
        &self,
        alg: CipherAlg,
        key: &SecretKey,
    ) -> Result<Box<dyn CipherContext>, BackendError> {
        self.0.open_cipher(alg, key).await
    }
    async fn open_aead(
        &self,
        alg: AeadAlg,
        key: &SecretKey,
    ) -> Result<Box<dyn AeadContext>, BackendError> {
        self.0.open_aead(alg, key).await
    }
    async fn open_crc(&self, alg: CrcAlg) -> Result<Box<dyn CrcContext>, BackendError> {
        Ok(Box::new(ShortCrc(self.0.open_crc(alg).await?)))
    }
}

/// A CRC piece is folded in with the length it was sent with, whatever
/// buffer comes back: the running value and length stay the CPU's.
#[tokio::test]
async fn a_crc_piece_folds_in_with_the_length_it_was_sent_with() {
    let offload = Offload::builder()
        .backend(Arc::new(Shortening(common::Engine::new("short"))))
        .pin("short")
        .build()
        .unwrap();
    let mut crc = offload.crc(CrcAlg::Crc32Iscsi).await.unwrap();
    let mut cpu = Offload::builder()
        .build()
        .unwrap()
        .crc(CrcAlg::Crc32Iscsi)
        .await
        .unwrap();
    for piece in [vec![1u8; 100], vec![2u8; 7], vec![3u8; 4096]] {
        crc.update(piece.clone()).await.unwrap();
        cpu.update(piece).await.unwrap();
    }
    assert_eq!((crc.finalize(), crc.len()), (cpu.finalize(), cpu.len()));
    assert_eq!(offload.backends()[1].stats.requests, 3, "ran on the engine");
}
