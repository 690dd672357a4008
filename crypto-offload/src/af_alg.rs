//! The AF_ALG backend (feature `af-alg`): the kernel's crypto engines,
//! through [`crypto_offload_af_alg`].
//!
//! [`AfAlgBackend::discover`] makes one backend per hardware engine family
//! `/proc/crypto` lists (each with its own cost model), with the
//! highest-priority driver of that family for each algorithm. Kernel drivers
//! that run on the CPU (AES-NI, ARM CE, generic C) are left out — they never
//! beat this process's own CPU code — but [`AfAlgBackend::with_drivers`]
//! binds any drivers by name, CPU-backed ones included.
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use crypto_offload::Offload;
//! use crypto_offload::af_alg::AfAlgBackend;
//!
//! let mut builder = Offload::builder();
//! match AfAlgBackend::discover() {
//!     Ok(engines) => {
//!         for engine in engines {
//!             builder = builder.backend(Arc::new(engine));
//!         }
//!     }
//!     Err(why) => eprintln!("AF_ALG: {why}"),
//! }
//! let offload = builder.build()?;
//! # Ok::<(), crypto_offload::Error>(())
//! ```

use std::collections::BTreeMap;

use async_trait::async_trait;
use crypto_offload_af_alg as af;

use crate::alg::{AeadAlg, Algorithm, CipherAlg, CipherMode, CrcAlg};
use crate::backend::{
    AeadContext, Backend, BackendKind, CipherContext, CrcContext, Failed, Limits,
};
use crate::buffer::IoBuf;
pub use crate::engine::{AUTOSUSPEND_DELAY, RequestTimeout, Unavailable};
use crate::engine::{Cipher, UnitCipher, xts_per_unit};
use crate::error::BackendError;
use crate::key::SecretKey;
use crate::power::{PowerControl, PowerDomain, PowerRef};

/// An engine reached through AF_ALG.
#[derive(Debug)]
pub struct AfAlgBackend {
    name: String,
    /// The engine's devices' runtime PM, where sysfs exposes it.
    power: Option<PowerDomain>,
    devices: Vec<std::path::PathBuf>,
    /// The driver bound for each algorithm it runs.
    drivers: Vec<(Algorithm, String)>,
    /// Sessions bind by generic name ("cbc(aes)"), the kernel choosing the
    /// driver (`drivers` then says which it ranks first).
    generic: bool,
    limit: usize,
    mechanism: AfAlgMechanism,
}

/// How an AF_ALG backend's cipher requests wait for the kernel (see
/// [`AfAlgBackend::with_mechanism`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum AfAlgMechanism {
    /// A request thread per request in flight (two thread hand-offs a
    /// request; the default, steadier in the measurements of
    /// `docs/benchmarks.md` §4).
    #[default]
    Threads,
    /// Native AIO, batched: concurrent requests' reads go to the kernel
    /// several per `io_submit`, and their completions wake their tasks
    /// several per wake-up. Requests of more than one operation, or
    /// spliced, use the request threads.
    Aio,
}

impl AfAlgBackend {
    /// One backend per hardware engine family found in `/proc/crypto`
    /// (named `af-alg:<family>`, e.g. `af-alg:virtio_crypto`).
    ///
    /// # Errors
    /// Why AF_ALG offers nothing here: no AF_ALG in this kernel,
    /// `af_alg_restrict`, no permission, or no readable `/proc/crypto`.
    /// Never a reason to fail the caller: the CPU runs everything.
    pub fn discover() -> Result<Vec<AfAlgBackend>, Unavailable> {
        af::probe().map_err(|e| Unavailable(af::unavailable_reason(&e)))?;
        let table =
            af::proc_crypto::read().map_err(|e| Unavailable(format!("/proc/crypto: {e}")))?;
        let mut families: BTreeMap<&'static str, Vec<af::proc_crypto::Registered>> =
            BTreeMap::new();
        for r in table {
            let engine = af::engine::classify(&r.driver);
            if engine.hardware && r.selftest_passed && r.af_alg_type().is_some() {
                families.entry(engine.short_name).or_default().push(r);
            }
        }
        Ok(families
            .into_iter()
            .map(|(family, regs)| {
                AfAlgBackend::from_registered(&format!("af-alg:{family}"), &regs).bindable_only()
            })
            .filter(|b| !b.drivers.is_empty())
            .collect())
    }

    /// A backend named `name` that binds exactly `drivers` (as
    /// `/proc/crypto` names them; CPU-backed kernel drivers too).
    ///
    /// # Errors
    /// AF_ALG is unavailable, or `/proc/crypto` lists none of `drivers`.
    pub fn with_drivers(name: &str, drivers: &[&str]) -> Result<AfAlgBackend, Unavailable> {
        af::probe().map_err(|e| Unavailable(af::unavailable_reason(&e)))?;
        let table =
            af::proc_crypto::read().map_err(|e| Unavailable(format!("/proc/crypto: {e}")))?;
        let regs: Vec<_> = table
            .into_iter()
            .filter(|r| drivers.contains(&r.driver.as_str()) && r.af_alg_type().is_some())
            .collect();
        let b = AfAlgBackend::from_registered(name, &regs).bindable_only();
        if b.drivers.is_empty() {
            return Err(Unavailable(format!(
                "none of {drivers:?} runs an algorithm this crate offers"
            )));
        }
        Ok(b)
    }

    /// A backend named `name` that binds every algorithm by its generic
    /// name (`cbc(aes)`, `gcm(aes)`, `crc32c` …): whichever driver the kernel
    /// ranks first, CPU-backed ones included — what a program that names no
    /// driver gets from AF_ALG. Its power domain covers the drivers ranked
    /// first now.
    ///
    /// # Errors
    /// AF_ALG is unavailable, or it runs none of this crate's algorithms.
    pub fn generic(name: &str) -> Result<AfAlgBackend, Unavailable> {
        af::probe().map_err(|e| Unavailable(af::unavailable_reason(&e)))?;
        let table =
            af::proc_crypto::read().map_err(|e| Unavailable(format!("/proc/crypto: {e}")))?;
        // Each algorithm bound by its generic name once, to learn which
        // driver the kernel gives it.
        let mut algs: Vec<Algorithm> = table.iter().flat_map(algorithms_of).collect();
        algs.sort_by_key(|a| a.name());
        algs.dedup();
        let drivers: Vec<(Algorithm, String)> = algs
            .into_iter()
            .filter_map(|alg| Some((alg, bound_driver(alg)?)))
            .collect();
        if drivers.is_empty() {
            return Err(Unavailable(
                "AF_ALG runs none of this crate's algorithms".to_owned(),
            ));
        }
        let regs: Vec<_> = table
            .into_iter()
            .filter(|r| drivers.iter().any(|(_, d)| *d == r.driver))
            .collect();
        let mut b = AfAlgBackend::with_bindings(name, drivers, &regs);
        b.generic = true;
        Ok(b)
    }

    fn from_registered(name: &str, regs: &[af::proc_crypto::Registered]) -> AfAlgBackend {
        let mut best: Vec<(Algorithm, i32, String)> = Vec::new();
        for r in regs {
            for alg in algorithms_of(r) {
                match best.iter_mut().find(|(a, ..)| *a == alg) {
                    Some(b) if r.priority > b.1 => *b = (alg, r.priority, r.driver.clone()),
                    Some(_) => {}
                    None => best.push((alg, r.priority, r.driver.clone())),
                }
            }
        }
        let drivers = best.into_iter().map(|(a, _, d)| (a, d)).collect();
        AfAlgBackend::with_bindings(name, drivers, regs)
    }

    /// A backend binding `drivers`, with a power domain over the devices of
    /// their modules (`regs` lists them).
    fn with_bindings(
        name: &str,
        drivers: Vec<(Algorithm, String)>,
        regs: &[af::proc_crypto::Registered],
    ) -> AfAlgBackend {
        let modules: Vec<&str> = regs
            .iter()
            .filter(|r| drivers.iter().any(|(_, d)| *d == r.driver))
            .map(|r| r.module.as_str())
            .collect();
        // Only a control this process may switch makes a power domain (a
        // non-root process still uses the engine, unmanaged).
        let pm = modules
            .into_iter()
            .filter_map(af::RuntimePm::for_module)
            .reduce(af::RuntimePm::merge)
            .filter(af::RuntimePm::writable);
        AfAlgBackend {
            name: name.to_owned(),
            devices: pm
                .as_ref()
                .map(|p| p.devices().to_vec())
                .unwrap_or_default(),
            power: pm.map(|pm| PowerDomain::new(name, SysfsPower(pm), AUTOSUSPEND_DELAY)),
            drivers,
            generic: false,
            limit: af::operation_limit(),
            mechanism: AfAlgMechanism::default(),
        }
    }

    /// Chooses how cipher requests wait for the kernel (AEAD and CRC
    /// requests always use the request threads).
    pub fn with_mechanism(mut self, mechanism: AfAlgMechanism) -> Self {
        self.mechanism = mechanism;
        self
    }

    /// How cipher requests wait for the kernel.
    pub fn mechanism(&self) -> AfAlgMechanism {
        self.mechanism
    }

    /// The sysfs devices whose runtime PM the backend's power domain
    /// switches (none where sysfs exposes no control).
    pub fn power_devices(&self) -> &[std::path::PathBuf] {
        &self.devices
    }

    /// Keeps the algorithms whose driver really binds with a key of that
    /// size: `/proc/crypto` lists no key sizes for AEADs, and engines often
    /// refuse 192-bit keys within a listed range — which a session would
    /// otherwise learn at open, with the engine's breaker opened for it.
    fn bindable_only(mut self) -> AfAlgBackend {
        self.drivers.retain(|(alg, driver)| bindable(*alg, driver));
        self
    }

    /// The driver bound for `alg`, if this backend runs it.
    pub fn driver(&self, alg: Algorithm) -> Option<&str> {
        self.drivers
            .iter()
            .find(|(a, _)| *a == alg)
            .map(|(_, d)| d.as_str())
    }

    async fn power_ref(&self) -> Result<Option<PowerRef>, BackendError> {
        match &self.power {
            Some(p) => p.acquire().await.map(Some),
            None => Ok(None),
        }
    }

    /// The most one kernel operation carries for `alg` here: the socket's
    /// limit, or the engine's own (a quirk in the engine table) if lower.
    fn operation(&self, alg: Algorithm) -> usize {
        self.driver(alg)
            .and_then(|d| af::engine::classify(d).max_request)
            .map_or(self.limit, |e| e.min(self.limit))
    }

    /// What a session for `alg` binds: its driver's name, or `None` for the
    /// generic name.
    fn binding(&self, alg: Algorithm) -> Result<Option<&str>, BackendError> {
        let driver = self
            .driver(alg)
            .ok_or_else(|| BackendError::Unsupported(format!("{} on {}", alg.name(), self.name)))?;
        Ok((!self.generic).then_some(driver))
    }
}

/// How long an AF_ALG request may take before it is given up as hung and
/// replayed on the CPU (from a copy of its input): 2 s, plus 100 ms a MiB (a
/// 10 MB/s floor, below any engine this crate would choose).
pub const REQUEST_TIMEOUT: RequestTimeout = RequestTimeout::ENGINE;

/// [`REQUEST_TIMEOUT`] as the binding takes it.
fn timeout() -> af::RequestTimeout {
    af::RequestTimeout {
        fixed: REQUEST_TIMEOUT.fixed,
        per_mib: REQUEST_TIMEOUT.per_mib,
    }
}

/// The power switch: the devices' `power/control`, `on` while a session
/// holds the domain and `auto` (suspend when idle) after. The kernel driver
/// also holds its own runtime-PM reference while a transform is open, so a
/// request still in the kernel when its session drops keeps the device up.
struct SysfsPower(af::RuntimePm);

impl SysfsPower {
    /// Writes the control off the async workers (writing `on` runs the
    /// device's resume before it returns).
    async fn set(&self, on: bool) -> Result<(), BackendError> {
        let pm = self.0.clone();
        let write = move || pm.set_active(on);
        let r = match tokio::runtime::Handle::try_current() {
            Ok(h) => h
                .spawn_blocking(write)
                .await
                .unwrap_or_else(|e| Err(std::io::Error::other(e))),
            Err(_) => write(),
        };
        r.map_err(|source| BackendError::Io {
            op: "write power/control",
            source,
        })
    }
}

#[async_trait]
impl PowerControl for SysfsPower {
    async fn power_on(&self) -> Result<(), BackendError> {
        self.set(true).await
    }

    async fn power_off(&self) -> Result<(), BackendError> {
        self.set(false).await
    }
}

/// The crate's algorithms a `/proc/crypto` entry runs (every key size in
/// its `min keysize`–`max keysize` range).
fn algorithms_of(r: &af::proc_crypto::Registered) -> Vec<Algorithm> {
    let keys = |alg_key: usize| {
        let get = |k: &str| r.other.get(k).and_then(|v| v.parse::<usize>().ok());
        match (get("min keysize"), get("max keysize")) {
            (Some(lo), Some(hi)) => (lo..=hi).contains(&alg_key),
            _ => true,
        }
    };
    let mode = match r.name.as_str() {
        "cbc(aes)" => Some(CipherMode::Cbc),
        "ctr(aes)" => Some(CipherMode::Ctr),
        "xts(aes)" => Some(CipherMode::Xts),
        _ => None,
    };
    let mut out = Vec::new();
    if let Some(mode) = mode.filter(|_| r.af_alg_type() == Some("skcipher")) {
        out.extend(
            CipherAlg::ALL
                .into_iter()
                .filter(|a| a.mode() == mode && keys(a.key_len()))
                .map(Algorithm::Cipher),
        );
    }
    if r.name == "gcm(aes)" && r.af_alg_type() == Some("aead") {
        out.extend(
            AeadAlg::ALL
                .into_iter()
                .filter(|a| keys(a.key_len()))
                .map(Algorithm::Aead),
        );
    }
    if r.af_alg_type() == Some("hash") {
        let crc = match r.name.as_str() {
            "crc32" => Some(CrcAlg::Crc32IsoHdlc),
            "crc32c" => Some(CrcAlg::Crc32Iscsi),
            "crc64-rocksoft" | "crc64-nvme" => Some(CrcAlg::Crc64Nvme),
            _ => None,
        };
        out.extend(crc.map(Algorithm::Crc));
    }
    out
}

/// The driver the kernel binds for `alg`'s generic name with a key of its
/// size (as `/proc/crypto` tells), if it binds.
fn bound_driver(alg: Algorithm) -> Option<String> {
    let key = |len: usize| SecretKey::for_tests(len).expose().to_vec();
    match alg {
        Algorithm::Cipher(c) => af::Skcipher::bind(mode_of(c), None, &key(c.key_len()))
            .ok()?
            .driver()
            .map(str::to_owned),
        Algorithm::Aead(a) => af::Aead::bind(None, &key(a.key_len()))
            .ok()?
            .driver()
            .map(str::to_owned),
        Algorithm::Crc(c) => af::Crc::bind(crc_kind(c)?, None)
            .ok()?
            .driver()
            .map(str::to_owned),
    }
}

/// Whether `driver` binds for `alg` with a key of its size.
fn bindable(alg: Algorithm, driver: &str) -> bool {
    let key = |len: usize| SecretKey::for_tests(len).expose().to_vec();
    let driver = Some(driver);
    match alg {
        Algorithm::Cipher(c) => af::Skcipher::bind(mode_of(c), driver, &key(c.key_len())).is_ok(),
        Algorithm::Aead(a) => af::Aead::bind(driver, &key(a.key_len())).is_ok(),
        Algorithm::Crc(c) => crc_kind(c).is_some_and(|k| af::Crc::bind(k, driver).is_ok()),
    }
}

fn mode_of(alg: CipherAlg) -> af::Mode {
    match alg.mode() {
        CipherMode::Cbc => af::Mode::Cbc,
        CipherMode::Ctr => af::Mode::Ctr,
        CipherMode::Xts => af::Mode::Xts,
    }
}

fn crc_kind(alg: CrcAlg) -> Option<af::CrcKind> {
    match alg {
        CrcAlg::Crc32IsoHdlc => Some(af::CrcKind::Crc32),
        CrcAlg::Crc32Iscsi => Some(af::CrcKind::Crc32c),
        CrcAlg::Crc64Nvme => Some(af::CrcKind::Crc64Nvme),
        _ => None,
    }
}

/// The crate's error for the binding's, keeping the errno.
fn backend_error(e: af::Error) -> BackendError {
    match e {
        af::Error::Authentication => BackendError::Authentication,
        af::Error::Timeout(_) => BackendError::Timeout,
        af::Error::TooLarge { .. } | af::Error::Invalid { .. } => {
            BackendError::Unsupported(e.to_string())
        }
        af::Error::Unavailable { source, .. } => BackendError::Io { op: "bind", source },
        af::Error::InvalidParameter { op, source } | af::Error::Io { op, source } => {
            BackendError::Io { op, source }
        }
        other => BackendError::Other(Box::new(other)),
    }
}

fn failed(f: af::Failed) -> Failed {
    Failed::new(backend_error(f.error), IoBuf::from(f.buf))
}

#[async_trait]
impl Backend for AfAlgBackend {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> BackendKind {
        BackendKind::Kernel
    }

    fn limits(&self, alg: Algorithm) -> Option<Limits> {
        self.driver(alg)?;
        let operation = self.operation(alg);
        Some(match alg {
            // The kernel's xts(aes) takes one tweak (a data unit) per
            // operation, of at most an operation's length.
            Algorithm::Cipher(c) if c.mode() == CipherMode::Xts => xts_per_unit(operation),
            // CBC and CTR requests go to the kernel in operations of at
            // most this size (the binding chains the IV), each paying the
            // engine's fixed cost.
            Algorithm::Cipher(_) => Limits::new().with_operation_len(operation),
            // One message per operation; GCM's room leaves 4 KiB for
            // associated data and the tag.
            Algorithm::Aead(_) => Limits::new().with_max_request(operation.saturating_sub(4096)),
            // CRCs are split into operations by the binding.
            Algorithm::Crc(_) => Limits::new(),
        })
    }

    fn power(&self) -> Option<&PowerDomain> {
        self.power.as_ref()
    }

    async fn open_cipher(
        &self,
        alg: CipherAlg,
        key: &SecretKey,
    ) -> Result<Box<dyn CipherContext>, BackendError> {
        let driver = self.binding(alg.into())?;
        // The device up first, then the transform (whose open is the
        // driver's own runtime-PM get).
        let power = self.power_ref().await?;
        let mechanism = match self.mechanism {
            AfAlgMechanism::Aio => af::Mechanism::Aio,
            AfAlgMechanism::Threads => af::Mechanism::Threads,
        };
        let s = af::Skcipher::bind(mode_of(alg), driver, key.expose())
            .map_err(backend_error)?
            .with_timeout(timeout())
            .with_mechanism(mechanism);
        Ok(Box::new(Cipher::new(s, power)))
    }

    async fn open_aead(
        &self,
        alg: AeadAlg,
        key: &SecretKey,
    ) -> Result<Box<dyn AeadContext>, BackendError> {
        let driver = self.binding(alg.into())?;
        // The device up first, then the transform (whose open is the
        // driver's own runtime-PM get).
        let power = self.power_ref().await?;
        let a = af::Aead::bind(driver, key.expose())
            .map_err(backend_error)?
            .with_timeout(timeout());
        Ok(Box::new(Aead(a, power)))
    }

    async fn open_crc(&self, alg: CrcAlg) -> Result<Box<dyn CrcContext>, BackendError> {
        let driver = self.binding(alg.into())?;
        // The device up first, then the transform (whose open is the
        // driver's own runtime-PM get).
        let power = self.power_ref().await?;
        let kind = crc_kind(alg)
            .ok_or_else(|| BackendError::Unsupported(format!("{} on AF_ALG", alg.name())))?;
        let c = af::Crc::bind(kind, driver)
            .map_err(backend_error)?
            .with_timeout(timeout());
        Ok(Box::new(Crc(c, power)))
    }
}

impl UnitCipher for af::Skcipher {
    async fn crypt_units(
        &self,
        encrypt: bool,
        first_tweak: &[u8; 16],
        unit: usize,
        buf: Vec<u8>,
    ) -> Result<Vec<u8>, Failed> {
        af::Skcipher::crypt_units(self, encrypt, first_tweak, unit, buf)
            .await
            .map_err(failed)
    }
}

/// Each context holds the engine's power for the session's life.
struct Aead(af::Aead, #[allow(dead_code)] Option<PowerRef>);

#[async_trait]
impl AeadContext for Aead {
    async fn seal(
        &self,
        nonce: [u8; 12],
        aad: &[u8],
        buf: IoBuf,
    ) -> Result<(IoBuf, [u8; 16]), Failed> {
        self.0
            .seal(nonce, aad, buf.into())
            .await
            .map(|(b, tag)| (IoBuf::from(b), tag))
            .map_err(failed)
    }

    async fn open(
        &self,
        nonce: [u8; 12],
        aad: &[u8],
        buf: IoBuf,
        tag: [u8; 16],
    ) -> Result<IoBuf, Failed> {
        self.0
            .open(nonce, aad, buf.into(), tag)
            .await
            .map(IoBuf::from)
            .map_err(failed)
    }
}

struct Crc(af::Crc, #[allow(dead_code)] Option<PowerRef>);

#[async_trait]
impl CrcContext for Crc {
    async fn checksum(&self, buf: IoBuf) -> Result<(IoBuf, u64), Failed> {
        self.0
            .checksum(buf.into())
            .await
            .map(|(b, v)| (IoBuf::from(b), v))
            .map_err(failed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(text: &str) -> af::proc_crypto::Registered {
        af::proc_crypto::parse(text).remove(0)
    }

    #[test]
    fn proc_crypto_entries_map_to_algorithms_by_key_size() {
        let virtio = reg(
            "name : cbc(aes)\ndriver : virtio_crypto_aes_cbc\npriority : 150\n\
                          type : skcipher\nselftest : passed\ninternal : no\n\
                          min keysize : 16\nmax keysize : 32\n",
        );
        assert_eq!(
            algorithms_of(&virtio),
            vec![
                Algorithm::Cipher(CipherAlg::Aes128Cbc),
                Algorithm::Cipher(CipherAlg::Aes192Cbc),
                Algorithm::Cipher(CipherAlg::Aes256Cbc),
            ]
        );
        let xts = reg("name : xts(aes)\ndriver : xts-aes-qce\ntype : skcipher\n\
                       min keysize : 32\nmax keysize : 64\n");
        assert_eq!(algorithms_of(&xts).len(), 3);
        let crc = reg("name : crc64-rocksoft\ndriver : crc64-rocksoft-generic\ntype : shash\n");
        assert_eq!(algorithms_of(&crc), vec![Algorithm::Crc(CrcAlg::Crc64Nvme)]);
        let internal = reg(
            "name : __cbc(aes)\ndriver : __cbc-aes-aesni\ntype : skcipher\n\
                            internal : yes\n",
        );
        assert!(algorithms_of(&internal).is_empty());
    }

    #[test]
    fn the_highest_priority_driver_of_a_family_wins() {
        let regs = af::proc_crypto::parse(
            "name : cbc(aes)\ndriver : cbc-aes-omap\npriority : 300\ntype : skcipher\n\n\
             name : cbc(aes)\ndriver : cbc-aes-omap-slow\npriority : 100\ntype : skcipher\n",
        );
        let b = AfAlgBackend::from_registered("af-alg:omap", &regs);
        assert_eq!(
            b.driver(Algorithm::Cipher(CipherAlg::Aes128Cbc)),
            Some("cbc-aes-omap")
        );
        assert!(b.limits(Algorithm::Cipher(CipherAlg::Aes128Ctr)).is_none());
    }

    #[test]
    fn errors_keep_their_errno_and_meaning() {
        let e = backend_error(af::Error::Authentication);
        assert!(matches!(e, BackendError::Authentication));
        let e = backend_error(af::Error::TooLarge { len: 9, max: 8 });
        assert!(matches!(e, BackendError::Unsupported(_)));
        let io = af::Error::Io {
            op: "read",
            source: std::io::Error::from_raw_os_error(5),
        };
        assert_eq!(backend_error(io).raw_os_error(), Some(5));
    }
}
