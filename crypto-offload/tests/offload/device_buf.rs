//! Device-ready buffers (`Offload::buffer`, `DeviceBuf`) through the
//! session pipeline, over an engine that lends memory (`Lender`): the
//! buffer comes from the pinned engine, requests there run in place, the
//! CPU works on it in place too, an AEAD tag fits in its capacity, a
//! failure that hands the buffer back is replayed on the CPU, and one
//! that loses the input is an error — never a replay on other bytes
//! passed off as a result. The VFIO device's own memory is tested in the
//! guest (`tests/vfio.rs`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use async_trait::async_trait;
use crypto_offload::backend::{
    AeadContext, Backend, BackendError, CipherContext, CipherParams, CrcContext, DeviceMemory,
    Failed, IoBuf, Limits, SecretKey,
};
use crypto_offload::{
    AeadAlg, Algorithm, BackendKind, CipherAlg, CipherMode, CrcAlg, DeviceBuf, Error, Offload,
};

const CBC: CipherAlg = CipherAlg::Aes128Cbc;
const KEY: [u8; 16] = [0x5a; 16];

/// Memory "on the engine": a Vec with room to grow.
struct Lent {
    bytes: Vec<u8>,
    len: usize,
    owner: &'static str,
}

impl DeviceMemory for Lent {
    fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
    fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.bytes[..self.len]
    }
    fn set_len(&mut self, len: usize) -> bool {
        if len > self.bytes.len() {
            return false;
        }
        self.len = len;
        true
    }
    fn owner(&self) -> &str {
        self.owner
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any + Send> {
        self
    }
}

/// What the lender does with a request.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Serve,
    /// Fails, handing the buffer back as it was.
    FailKeeping,
    /// Fails, handing back nothing of the input.
    FailLosing,
    /// Hands the buffer back untouched (the pipeline's own cost, for
    /// `engine_request_overhead`).
    Echo,
}

#[derive(Debug)]
struct Lender {
    name: &'static str,
    mode: std::sync::Mutex<u8>,
    in_place: AtomicU64,
    copied: AtomicU64,
    lent: AtomicUsize,
}

impl Lender {
    fn new(name: &'static str) -> Arc<Lender> {
        Arc::new(Lender {
            name,
            mode: std::sync::Mutex::new(0),
            in_place: AtomicU64::new(0),
            copied: AtomicU64::new(0),
            lent: AtomicUsize::new(0),
        })
    }
    fn set(&self, mode: Mode) {
        *self.mode.lock().unwrap() = mode as u8;
    }
    fn mode(&self) -> Mode {
        match *self.mode.lock().unwrap() {
            0 => Mode::Serve,
            1 => Mode::FailKeeping,
            2 => Mode::FailLosing,
            _ => Mode::Echo,
        }
    }
}

struct Ctx(Arc<Lender>);

#[async_trait]
impl CipherContext for Ctx {
    async fn encrypt(&self, params: CipherParams, mut buf: IoBuf) -> Result<IoBuf, Failed> {
        match self.0.mode() {
            Mode::Serve => {}
            Mode::Echo => return Ok(buf),
            Mode::FailKeeping => return Err(Failed::new(BackendError::DeviceGone, buf)),
            Mode::FailLosing => {
                return Err(Failed::new(
                    BackendError::DeviceGone,
                    IoBuf::from(Vec::new()),
                ));
            }
        }
        if buf.device_owner() == Some(self.0.name) {
            self.0.in_place.fetch_add(1, Ordering::Relaxed);
        } else {
            self.0.copied.fetch_add(1, Ordering::Relaxed);
        }
        crypto_offload_fallback::Cbc::new(&KEY)
            .and_then(|c| c.encrypt(&params.iv, buf.as_mut_slice()))
            .map_err(|e| BackendError::Other(Box::new(e)))
            .map_err(|e| Failed::new(e, IoBuf::from(Vec::new())))?;
        Ok(buf)
    }
    async fn decrypt(&self, _params: CipherParams, buf: IoBuf) -> Result<IoBuf, Failed> {
        Err(Failed::new(
            BackendError::Unsupported("encrypt only".into()),
            buf,
        ))
    }
}

struct Handle(Arc<Lender>);

impl std::fmt::Debug for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.name)
    }
}

#[async_trait]
impl Backend for Handle {
    fn name(&self) -> &str {
        self.0.name
    }
    fn kind(&self) -> BackendKind {
        BackendKind::Device
    }
    fn limits(&self, alg: Algorithm) -> Option<Limits> {
        matches!(alg, Algorithm::Cipher(c) if c.mode() == CipherMode::Cbc)
            .then(|| Limits::new().with_length_multiple(16))
    }
    fn buffer(&self, len: usize) -> Option<Box<dyn DeviceMemory>> {
        self.0.lent.fetch_add(1, Ordering::Relaxed);
        Some(Box::new(Lent {
            bytes: vec![0; len + 16],
            len,
            owner: self.0.name,
        }))
    }
    async fn open_cipher(
        &self,
        _alg: CipherAlg,
        _key: &SecretKey,
    ) -> Result<Box<dyn CipherContext>, BackendError> {
        Ok(Box::new(Ctx(self.0.clone())))
    }
    async fn open_aead(
        &self,
        _alg: AeadAlg,
        _key: &SecretKey,
    ) -> Result<Box<dyn AeadContext>, BackendError> {
        Err(BackendError::Unsupported("no AEAD".into()))
    }
    async fn open_crc(&self, _alg: CrcAlg) -> Result<Box<dyn CrcContext>, BackendError> {
        Err(BackendError::Unsupported("no CRC".into()))
    }
}

fn pinned(lender: &Arc<Lender>) -> Offload {
    Offload::builder()
        .backend(Arc::new(Handle(lender.clone())))
        .pin(lender.name)
        .build()
        .unwrap()
}

async fn cpu_cbc(iv: [u8; 16], data: Vec<u8>) -> Vec<u8> {
    let cpu = Offload::builder().build().unwrap();
    cpu.cipher(CBC, &KEY)
        .await
        .unwrap()
        .encrypt(iv, data)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_buffer_from_the_pinned_engine_runs_there_in_place() {
    let lender = Lender::new("lender");
    let offload = pinned(&lender);
    let session = offload.cipher(CBC, &KEY).await.unwrap();
    let mut buf = offload.buffer(4096);
    assert_eq!(buf.device_owner(), Some("lender"));
    assert!(buf.iter().all(|&b| b == 0), "zeros");
    buf.fill(7);
    let buf = session.encrypt([1; 16], buf).await.unwrap();
    assert!(buf.is_device_memory(), "still the engine's memory");
    assert!(buf[..] == cpu_cbc([1; 16], vec![7; 4096]).await[..]);
    assert_eq!(lender.in_place.load(Ordering::Relaxed), 1);
    assert_eq!(lender.copied.load(Ordering::Relaxed), 0);
    // Ordinary memory to the same engine: not in place.
    let v = session.encrypt([1; 16], vec![7; 4096]).await.unwrap();
    assert_eq!(lender.copied.load(Ordering::Relaxed), 1);
    assert!(v[..] == buf[..]);
    // Its Debug shows no bytes.
    let shown = format!("{buf:?}");
    assert!(
        shown.contains("4096") && shown.contains("lender"),
        "{shown}"
    );
    assert!(!shown.contains('['), "bytes in its Debug: {shown}");
}

#[tokio::test]
async fn without_a_lending_engine_a_buffer_is_ordinary_memory_and_the_cpu_works_on_either() {
    let cpu_only = Offload::builder().build().unwrap();
    let mut buf = cpu_only.buffer(64);
    assert!(!buf.is_device_memory());
    buf.fill(3);
    let session = cpu_only.cipher(CBC, &KEY).await.unwrap();
    let buf = session.encrypt([2; 16], buf).await.unwrap();
    assert!(buf[..] == cpu_cbc([2; 16], vec![3; 64]).await[..]);
    // Engine memory on the CPU (a session of another Offload): in place,
    // still the engine's.
    let lender = Lender::new("lender");
    let mut lent = pinned(&lender).buffer(64);
    lent.fill(3);
    let lent = session.encrypt([2; 16], lent).await.unwrap();
    assert!(lent.is_device_memory());
    assert!(lent[..] == buf[..]);
    assert_eq!(lent.into_vec(), buf.into_vec());
}

#[tokio::test]
async fn an_aead_tag_fits_in_the_buffers_capacity_and_open_takes_it_off() {
    let lender = Lender::new("lender");
    let offload = pinned(&lender);
    let cpu = Offload::builder().build().unwrap();
    let gcm = cpu.aead(AeadAlg::Aes128Gcm, &KEY).await.unwrap();
    let mut buf = offload.buffer(100);
    buf.fill(9);
    let sealed = gcm.seal([4; 12], b"aad", buf).await.unwrap();
    assert_eq!(sealed.len(), 116);
    assert!(sealed.is_device_memory(), "the tag fit in the capacity");
    let want = gcm.seal([4; 12], b"aad", vec![9u8; 100]).await.unwrap();
    assert!(sealed[..] == want[..]);
    let opened = gcm.open([4; 12], b"aad", sealed).await.unwrap();
    assert!(opened[..] == [9u8; 100][..]);
    assert!(opened.is_device_memory());
    // A tag past the capacity: the bytes move to ordinary memory, intact.
    let mut full = offload.buffer(100);
    assert!(full.is_device_memory());
    full.fill(9);
    let sealed = gcm.seal([4; 12], b"aad", full).await.unwrap();
    let sealed = gcm.seal([4; 12], b"", sealed).await.unwrap();
    assert_eq!(sealed.len(), 132);
    assert!(!sealed.is_device_memory(), "past the capacity: moved");
}

#[tokio::test]
async fn a_failure_that_keeps_the_buffer_is_replayed_and_one_that_loses_it_is_an_error() {
    let lender = Lender::new("lender");
    let offload = pinned(&lender);
    let session = offload.cipher(CBC, &KEY).await.unwrap();
    lender.set(Mode::FailKeeping);
    let mut buf = offload.buffer(64);
    buf.fill(5);
    let got = session.encrypt([6; 16], buf).await.unwrap();
    assert!(
        got[..] == cpu_cbc([6; 16], vec![5; 64]).await[..],
        "replayed right"
    );
    assert_eq!(offload.backends()[0].stats.replayed, 1);
    // A new Offload: the first one's breaker is open now.
    let offload = pinned(&lender);
    let session = offload.cipher(CBC, &KEY).await.unwrap();
    lender.set(Mode::FailLosing);
    let mut buf = offload.buffer(64);
    buf.fill(5);
    match session.encrypt([6; 16], buf).await {
        Err(e) => assert!(
            matches!(e.error(), Error::Backend { backend, .. } if backend == "lender"),
            "{e}"
        ),
        Ok(b) => panic!("a request whose input was lost passed for a result: {b:?}"),
    }
    assert_eq!(offload.backends()[0].stats.replayed, 0, "nothing replayed");
    assert_eq!(offload.backends()[1].stats.failures, 1);
    let _ = DeviceBuf::from(vec![1, 2, 3]);
}

/// What the session pipeline costs an engine request: 64 tasks on one
/// thread each awaiting `encrypt` of 64 bytes through an `Offload` pinned
/// to an engine that answers at once, untouched (no crypto: the
/// pipeline's own cost). A measurement, not a check.
#[test]
#[ignore = "a measurement: cargo test --release -p crypto-offload --test offload -- --ignored --nocapture device_buf::"]
fn engine_request_overhead() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async {
        let lender = Lender::new("lender");
        lender.set(Mode::Echo);
        let offload = pinned(&lender);
        let s = std::rc::Rc::new(offload.cipher(CBC, &KEY).await.unwrap());
        for round in 0..3 {
            let start = std::time::Instant::now();
            let tasks: Vec<_> = (0..64)
                .map(|_| {
                    let s = s.clone();
                    tokio::task::spawn_local(async move {
                        let mut buf = vec![0u8; 64];
                        for _ in 0..20_000 {
                            buf = s.encrypt([0; 16], buf).await.unwrap();
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await.unwrap();
            }
            let n = 64.0 * 20_000.0;
            println!(
                "round {round}: {:.0} ns a request",
                start.elapsed().as_nanos() as f64 / n
            );
        }
    });
}
