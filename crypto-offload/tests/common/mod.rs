//! Test doubles shared by the integration tests.

#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crypto_offload::backend::{
    AeadContext, Backend, BackendError, BackendKind, CipherContext, CipherParams, CrcContext,
    Failed, IoBuf, Limits, SecretKey, async_trait,
};
use crypto_offload::cpu::CpuBackend;
use crypto_offload::{AeadAlg, Algorithm, CipherAlg, CrcAlg};

/// The CPU backend under another name and behind `dyn`: exercises the
/// third-party path (boxed contexts, `IoBuf` round trips, CRC combination).
/// With `fail_every = n`, every n-th request fails with `DeviceGone` and
/// hands its buffer back unchanged, as the contract requires.
#[derive(Debug)]
pub struct Engine {
    pub name: &'static str,
    pub fail_every: usize,
    pub only: Option<Algorithm>,
    pub corrupt: bool,
    /// Failures say "not this request's shape" (`Unsupported`) instead.
    pub refuse: bool,
    /// It takes one XTS data unit per operation.
    pub per_unit: bool,
    /// It takes only lengths (data units) that are multiples of this.
    pub multiple: usize,
    /// It takes requests of at most this many bytes.
    pub max: Option<usize>,
    /// It claims its algorithms but refuses every session (`Unsupported`).
    pub refuse_sessions: bool,
    pub requests: Arc<AtomicUsize>,
}

impl Engine {
    pub fn new(name: &'static str) -> Self {
        Engine {
            name,
            fail_every: 0,
            only: None,
            corrupt: false,
            refuse: false,
            per_unit: false,
            multiple: 1,
            max: None,
            refuse_sessions: false,
            requests: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// It takes one XTS data unit per operation, as AF_ALG engines do.
    pub fn per_unit(mut self) -> Self {
        self.per_unit = true;
        self
    }

    /// It takes only lengths that are multiples of `n` (as a device without
    /// XTS ciphertext stealing).
    pub fn multiple_of(mut self, n: usize) -> Self {
        self.multiple = n;
        self
    }

    /// It takes requests of at most `n` bytes (larger ones go elsewhere).
    pub fn at_most(mut self, n: usize) -> Self {
        self.max = Some(n);
        self
    }

    /// Its failures are `Unsupported` (a request shape it does not take).
    pub fn refusing(mut self) -> Self {
        self.refuse = true;
        self
    }

    /// It claims its algorithms in `limits` but refuses to open a session
    /// of any of them: a backend whose claims are not true.
    pub fn refusing_sessions(mut self) -> Self {
        self.refuse_sessions = true;
        self
    }

    pub fn failing_every(mut self, n: usize) -> Self {
        self.fail_every = n;
        self
    }

    /// Flips a bit of every non-empty result (and of every CRC).
    pub fn corrupting(mut self) -> Self {
        self.corrupt = true;
        self
    }

    pub fn only(mut self, alg: Algorithm) -> Self {
        self.only = Some(alg);
        self
    }

    pub fn shared(self) -> crypto_offload::backend::SharedBackend {
        Arc::new(self)
    }
}

struct Counter {
    fail_every: usize,
    corrupt: bool,
    refuse: bool,
    requests: Arc<AtomicUsize>,
}

fn spoil(corrupt: bool, mut buf: IoBuf) -> IoBuf {
    if corrupt && let Some(b) = buf.as_mut_slice().first_mut() {
        *b ^= 1;
    }
    buf
}

impl Counter {
    /// The error a failing request returns.
    fn error(&self, otherwise: BackendError) -> BackendError {
        if self.refuse {
            BackendError::Unsupported("request shape".into())
        } else {
            otherwise
        }
    }

    fn fails(&self) -> bool {
        let n = self.requests.fetch_add(1, Ordering::Relaxed) + 1;
        self.fail_every != 0 && n.is_multiple_of(self.fail_every)
    }
}

struct Cipher(Box<dyn CipherContext>, Counter);
struct Aead(Box<dyn AeadContext>, Counter);
struct Crc(Box<dyn CrcContext>, Counter);

#[async_trait]
impl CipherContext for Cipher {
    async fn encrypt(&self, p: CipherParams, buf: IoBuf) -> Result<IoBuf, Failed> {
        if self.1.fails() {
            return Err(Failed::new(self.1.error(BackendError::DeviceGone), buf));
        }
        self.0
            .encrypt(p, buf)
            .await
            .map(|b| spoil(self.1.corrupt, b))
    }
    async fn decrypt(&self, p: CipherParams, buf: IoBuf) -> Result<IoBuf, Failed> {
        if self.1.fails() {
            return Err(Failed::new(self.1.error(BackendError::DeviceGone), buf));
        }
        self.0
            .decrypt(p, buf)
            .await
            .map(|b| spoil(self.1.corrupt, b))
    }
}

#[async_trait]
impl AeadContext for Aead {
    async fn seal(
        &self,
        nonce: [u8; 12],
        aad: &[u8],
        buf: IoBuf,
    ) -> Result<(IoBuf, [u8; 16]), Failed> {
        if self.1.fails() {
            return Err(Failed::new(self.1.error(BackendError::Timeout), buf));
        }
        let (buf, mut tag) = self.0.seal(nonce, aad, buf).await?;
        if self.1.corrupt {
            tag[0] ^= 1;
        }
        Ok((buf, tag))
    }
    async fn open(
        &self,
        nonce: [u8; 12],
        aad: &[u8],
        buf: IoBuf,
        tag: [u8; 16],
    ) -> Result<IoBuf, Failed> {
        if self.1.fails() {
            return Err(Failed::new(self.1.error(BackendError::Timeout), buf));
        }
        self.0.open(nonce, aad, buf, tag).await
    }
}

#[async_trait]
impl CrcContext for Crc {
    async fn checksum(&self, buf: IoBuf) -> Result<(IoBuf, u64), Failed> {
        if self.1.fails() {
            return Err(Failed::new(self.1.error(BackendError::DeviceGone), buf));
        }
        let (buf, crc) = self.0.checksum(buf).await?;
        Ok((buf, crc ^ u64::from(self.1.corrupt)))
    }
}

#[async_trait]
impl Backend for Engine {
    fn name(&self) -> &str {
        self.name
    }
    fn kind(&self) -> BackendKind {
        BackendKind::Other
    }
    fn limits(&self, alg: Algorithm) -> Option<Limits> {
        if self.only.is_some_and(|a| a != alg) {
            return None;
        }
        let mut limits = Limits::new().with_length_multiple(self.multiple);
        if self.per_unit {
            limits = limits.with_one_operation_per_unit();
        }
        if let Some(max) = self.max {
            limits = limits.with_max_request(max);
        }
        Some(limits)
    }
    async fn open_cipher(
        &self,
        alg: CipherAlg,
        key: &SecretKey,
    ) -> Result<Box<dyn CipherContext>, BackendError> {
        self.open_check()?;
        let inner = CpuBackend::new().open_cipher(alg, key).await?;
        Ok(Box::new(Cipher(inner, self.counter())))
    }
    async fn open_aead(
        &self,
        alg: AeadAlg,
        key: &SecretKey,
    ) -> Result<Box<dyn AeadContext>, BackendError> {
        self.open_check()?;
        let inner = CpuBackend::new().open_aead(alg, key).await?;
        Ok(Box::new(Aead(inner, self.counter())))
    }
    async fn open_crc(&self, alg: CrcAlg) -> Result<Box<dyn CrcContext>, BackendError> {
        self.open_check()?;
        let inner = CpuBackend::new().open_crc(alg).await?;
        Ok(Box::new(Crc(inner, self.counter())))
    }
}

impl Engine {
    fn open_check(&self) -> Result<(), BackendError> {
        if self.refuse_sessions {
            return Err(BackendError::Unsupported("no such session here".into()));
        }
        Ok(())
    }

    fn counter(&self) -> Counter {
        Counter {
            fail_every: self.fail_every,
            corrupt: self.corrupt,
            refuse: self.refuse,
            requests: self.requests.clone(),
        }
    }
}

/// A request buffer whose release can be watched: a `BytesMut` sharing its
/// allocation with a one-byte `Bytes` kept by the test. The crate's
/// `Buffer` trait is sealed (only `Vec<u8>` and `BytesMut`), so a type that
/// counts its own drops cannot be handed in; instead, `split_to` makes the
/// two halves share one reference-counted allocation (documented as O(1),
/// no copy), and the kept half is unique exactly when the request's half is
/// gone — freed, or copied away by a reallocation (appending a GCM tag to a
/// buffer without room). Use it only on buffers the test does not keep.
pub fn tracked(data: &[u8]) -> (bytes::BytesMut, bytes::Bytes) {
    let mut whole = bytes::BytesMut::with_capacity(data.len() + 1);
    whole.extend_from_slice(&[0]);
    whole.extend_from_slice(data);
    let kept = whole.split_to(1).freeze();
    (whole, kept)
}

/// This process's peak resident set so far (`VmHWM`), in KiB; 0 where
/// `/proc` does not say.
pub fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// A cost profile for simulated engines against the CPU: every engine at
/// `engine_ns` a request (its parallelism and queue depth its queues and
/// slots, 1% of that in CPU time), the CPU at `cpu_ns`, for every algorithm
/// the engines run. Tests that want Auto to keep engines busy profile the
/// CPU slower than it is: its online correction moves it at most 20x.
pub fn profile(
    engines: &[&crypto_offload_sim::SimEngine],
    engine_ns: f64,
    cpu_ns: f64,
) -> crypto_offload::Profile {
    let mut text = String::new();
    let mut entry = |backend: &str, alg: Algorithm, ns: f64, cpu: f64, par: usize, depth: usize| {
        let dirs: &[&str] = match alg {
            Algorithm::Crc(_) => &["encrypt"],
            _ => &["encrypt", "decrypt"],
        };
        for dir in dirs {
            text += &format!(
                "[[entry]]\nbackend = \"{backend}\"\nalg = \"{}\"\ndir = \"{dir}\"\n\
                 fixed_ns = {ns:?}\nper_byte_ns = 0.0\ncpu_fixed_ns = {:?}\n\
                 cpu_per_byte_ns = 0.0\nparallelism = {par}\nqueue_depth = {depth}\n",
                alg.name(),
                ns * cpu,
            );
        }
    };
    for alg in Algorithm::all() {
        if !engines.iter().any(|e| e.config().algorithms.contains(&alg)) {
            continue;
        }
        entry("cpu", alg, cpu_ns, 1.0, 1, u32::MAX as usize);
        for e in engines {
            let c = e.config();
            if c.algorithms.contains(&alg) {
                let slots = c.queues * c.queue_depth;
                entry(&c.name, alg, engine_ns, 0.01, c.queues, slots);
            }
        }
    }
    crypto_offload::Profile::from_toml(&text).unwrap()
}
