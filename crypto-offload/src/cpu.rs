//! The CPU backend: `crypto-offload-fallback` behind the session API.
//!
//! Sessions call it inline (synchronously, on the calling task, through an
//! enum — no boxing, no allocation); it also implements [`Backend`] so it can
//! be handed around as `Arc<dyn Backend>` like any other engine.

use async_trait::async_trait;
use crypto_offload_fallback as fb;
use fb::choice::{Choice, Mode};
use fb::{CrcPlan, Implementation};

use crate::alg::{AeadAlg, Algorithm, CipherAlg, CipherMode, CrcAlg};
use crate::backend::{
    AeadContext, Backend, BackendKind, CipherContext, CipherParams, CrcContext, Failed, Limits,
};
use crate::buffer::IoBuf;
use crate::cost::{Cost, Direction};
use crate::error::{BackendError, Error};
use crate::key::SecretKey;

/// The CPU backend. Always present; runs every algorithm.
///
/// Each mode with several implementations runs, per size class, on the one
/// measured fastest on this machine ([`cpu_choice`](crate::cpu_choice):
/// measured once per process, the first time a key of the mode is made),
/// unless a choice was given ([`CpuBackend::with_choice`], a loaded
/// [`Profile`](crate::Profile)) or one implementation forced.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuBackend {
    implementation: Option<Implementation>,
    /// The choice given for each mode, by `Mode as usize`.
    given: [Option<Choice>; Mode::ALL.len()],
}

impl CpuBackend {
    /// The backend's name.
    pub const NAME: &'static str = "cpu";

    /// The CPU backend with each mode on its fastest implementation.
    pub fn new() -> Self {
        CpuBackend::default()
    }

    /// The CPU backend with every mode that has a choice forced onto `imp`
    /// (for tests and benchmarks of one implementation).
    pub fn with_implementation(imp: Implementation) -> Self {
        CpuBackend {
            implementation: Some(imp),
            given: [None; Mode::ALL.len()],
        }
    }

    /// The forced implementation, if any.
    pub fn implementation(&self) -> Option<Implementation> {
        self.implementation
    }

    /// This backend with `mode` on `choice` (e.g. from a profile saved on
    /// this machine: no measurement at start).
    pub fn with_choice(mut self, mode: Mode, choice: Choice) -> Self {
        self.given[mode as usize] = Some(choice);
        self
    }

    /// The choice given for `mode` (a profile, [`CpuBackend::with_choice`]),
    /// if any; nothing is measured.
    pub fn given(&self, mode: Mode) -> Option<Choice> {
        self.given[mode as usize]
    }

    /// What `mode` runs on, and why (measuring it if nothing was given or
    /// forced and it has not been yet). A forced or given implementation
    /// that does not take a key's size (ring and AES-192) runs that key on
    /// the build's default instead.
    ///
    /// CBC decryption given nothing of its own takes what CBC encryption
    /// was given (a profile saved before the two were chosen apart, or a
    /// builder that set [`Mode::Cbc`] meaning both).
    pub fn choice(&self, mode: Mode) -> (Choice, ChoiceSource) {
        let given = match mode {
            Mode::CbcDecrypt => self.given(mode).or(self.given(Mode::Cbc)),
            _ => self.given(mode),
        };
        match (self.implementation, given) {
            (Some(i), _) if mode.candidates().contains(&i) => {
                (Choice::one(i), ChoiceSource::Forced)
            }
            (_, Some(c)) => (c, ChoiceSource::Given),
            _ => (
                crypto_offload_fallback::choice::measured(mode),
                ChoiceSource::Measured,
            ),
        }
    }

    pub(crate) fn cipher(&self, alg: CipherAlg, key: &[u8]) -> Result<CpuCipher, Error> {
        let map = |e| map_key_error(alg.into(), e);
        // A forced implementation a mode does not have (ring and CTR) is
        // not forced on it; one a key size does not have (AWS-LC and
        // XTS-AES-128) runs that key on the default.
        Ok(match alg.mode() {
            CipherMode::Cbc => {
                let (enc, dec) = (self.choice(Mode::Cbc).0, self.choice(Mode::CbcDecrypt).0);
                CpuCipher::Cbc(fb::Cbc::with_choices(key, enc, dec).map_err(map)?)
            }
            CipherMode::Ctr => {
                CpuCipher::Ctr(fb::Ctr::with_choice(key, self.choice(Mode::Ctr).0).map_err(map)?)
            }
            CipherMode::Xts => {
                CpuCipher::Xts(fb::Xts::with_choice(key, self.choice(Mode::Xts).0).map_err(map)?)
            }
        })
    }

    /// The implementations a CRC of `alg` runs on (the CRC-32s' choice;
    /// crc-fast for the CRC-64s).
    pub(crate) fn crc_choice(&self, alg: CrcAlg) -> Choice {
        match Mode::of_crc(alg) {
            Some(mode) => self.choice(mode).0,
            None => fb::crc_choice(alg),
        }
    }

    pub(crate) fn aead(&self, alg: AeadAlg, key: &[u8]) -> Result<fb::Gcm, Error> {
        let map = |e| map_key_error(alg.into(), e);
        let (choice, _) = self.choice(Mode::Gcm);
        fb::Gcm::with_choice(key, choice).map_err(map)
    }
}

/// Where a [`CpuBackend`]'s choice for a mode comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ChoiceSource {
    /// Measured in this process ([`crate::cpu_choice::measured`]).
    Measured,
    /// Given: a loaded profile or [`CpuBackend::with_choice`].
    Given,
    /// One implementation forced for every mode that has it
    /// ([`CpuBackend::with_implementation`]).
    Forced,
}

fn map_key_error(alg: Algorithm, e: fb::Error) -> Error {
    match e {
        fb::Error::XtsWeakKey => Error::WeakKey { alg },
        fb::Error::KeyLength { len, .. } => Error::KeyLength {
            alg,
            len,
            expected: match alg {
                Algorithm::Cipher(a) => a.key_len(),
                Algorithm::Aead(a) => a.key_len(),
                _ => 0,
            },
        },
        other => map_error(alg, other),
    }
}

/// Maps a fallback error to the session error, for `alg`.
pub(crate) fn map_error(alg: Algorithm, e: fb::Error) -> Error {
    match e {
        fb::Error::DataLength { len, rule, .. } => Error::DataLength { alg, len, rule },
        fb::Error::Authentication => Error::Authentication,
        fb::Error::XtsWeakKey => Error::WeakKey { alg },
        fb::Error::ChecksumMismatch { expected, computed } => {
            Error::ChecksumMismatch { expected, computed }
        }
        other => Error::Backend {
            backend: CpuBackend::NAME.to_owned(),
            source: BackendError::Other(Box::new(other)),
        },
    }
}

/// A keyed cipher on the CPU. The key schedules stay inline: a session holds
/// one, and requests skip a pointer chase.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub(crate) enum CpuCipher {
    Cbc(fb::Cbc),
    Ctr(fb::Ctr),
    Xts(fb::Xts),
}

impl CpuCipher {
    #[inline]
    pub(crate) fn run(
        &self,
        encrypt: bool,
        params: &CipherParams,
        data: &mut [u8],
    ) -> Result<(), fb::Error> {
        match (self, encrypt) {
            (CpuCipher::Cbc(k), true) => k.encrypt(&params.iv, data),
            (CpuCipher::Cbc(k), false) => k.decrypt(&params.iv, data),
            (CpuCipher::Ctr(k), _) => k.apply_keystream(&params.iv, data),
            (CpuCipher::Xts(k), true) => k.encrypt_units(&params.iv, params.data_unit, data),
            (CpuCipher::Xts(k), false) => k.decrypt_units(&params.iv, params.data_unit, data),
        }
    }
}

impl CpuCipher {
    /// The piece size [`run_split`](Self::run_split) cuts at, or `None` when
    /// a request of `len` bytes runs whole whatever the parts asked.
    pub(crate) fn split_step(
        &self,
        encrypt: bool,
        params: &CipherParams,
        len: usize,
    ) -> Option<usize> {
        let (step, split) = match self {
            CpuCipher::Ctr(_) => (16, true),
            CpuCipher::Xts(_) => (params.data_unit, params.data_unit < len),
            CpuCipher::Cbc(_) => (16, !encrypt),
        };
        (split && step > 0).then_some(step)
    }

    /// [`run`](Self::run), split into `parts` pieces on as many threads
    /// where the mode allows it: CTR at block boundaries (each piece's
    /// counter advanced), XTS at data-unit boundaries (each piece's tweak
    /// advanced), CBC decryption at block boundaries (each piece's IV is the
    /// ciphertext block before it, saved before any piece runs). CBC
    /// encryption is a chain and a single XTS unit has one tweak sequence:
    /// both run whole.
    pub(crate) fn run_split(
        &self,
        encrypt: bool,
        params: &CipherParams,
        data: &mut [u8],
        parts: usize,
    ) -> Result<(), fb::Error> {
        let len = data.len();
        let step = match self.split_step(encrypt, params, len) {
            Some(step) if parts > 1 => step,
            _ => return self.run(encrypt, params, data),
        };
        let steps = len / step;
        let per = steps.div_ceil(parts) * step;
        let mut pieces: Vec<(CipherParams, &mut [u8])> = Vec::with_capacity(parts);
        let mut offset = 0usize;
        let mut rest = data;
        while !rest.is_empty() {
            let take = per.min(rest.len());
            let iv = match self {
                CpuCipher::Ctr(_) => u128::from_be_bytes(params.iv)
                    .wrapping_add((offset / 16) as u128)
                    .to_be_bytes(),
                CpuCipher::Xts(_) => u128::from_le_bytes(params.iv)
                    .wrapping_add((offset / step) as u128)
                    .to_le_bytes(),
                CpuCipher::Cbc(_) => match pieces.last() {
                    None => params.iv,
                    Some((_, prev)) => {
                        let mut iv = [0u8; 16];
                        iv.copy_from_slice(&prev[prev.len() - 16..]);
                        iv
                    }
                },
            };
            let (piece, tail) = rest.split_at_mut(take);
            pieces.push((CipherParams::new(iv, params.data_unit), piece));
            offset += take;
            rest = tail;
        }
        std::thread::scope(|scope| {
            let mut iter = pieces.into_iter();
            let first = iter.next();
            let handles: Vec<_> = iter
                .map(|(p, piece)| scope.spawn(move || self.run(encrypt, &p, piece)))
                .collect();
            let mut result = match first {
                Some((p, piece)) => self.run(encrypt, &p, piece),
                None => Ok(()),
            };
            for h in handles {
                let r = h
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                if result.is_ok() {
                    result = r;
                }
            }
            result
        })
    }
}

/// The CRC of `data` on `plan`, in `parts` pieces on as many threads,
/// combined.
pub(crate) fn checksum_split(plan: CrcPlan, data: &[u8], parts: usize) -> u64 {
    if parts <= 1 {
        return plan.checksum(data);
    }
    let alg = plan.alg();
    let per = data.len().div_ceil(parts).max(1);
    std::thread::scope(|scope| {
        let mut chunks = data.chunks(per);
        let first = chunks.next().unwrap_or(&[]);
        let handles: Vec<_> = chunks
            .map(|c| (c.len(), scope.spawn(move || plan.checksum(c))))
            .collect();
        let mut crc = plan.checksum(first);
        for (len, h) in handles {
            let piece = h
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            crc = fb::combine(alg, crc, piece, len as u64);
        }
        crc
    })
}

/// Converts a fallback failure inside a backend request into a `Failed`.
fn failed(e: fb::Error, buf: IoBuf) -> Failed {
    let error = match e {
        fb::Error::Authentication => BackendError::Authentication,
        other => BackendError::Other(Box::new(other)),
    };
    Failed::new(error, buf)
}

struct CipherCtx(CpuCipher);

#[async_trait]
impl CipherContext for CipherCtx {
    async fn encrypt(&self, params: CipherParams, mut buf: IoBuf) -> Result<IoBuf, Failed> {
        match self.0.run(true, &params, buf.as_mut_slice()) {
            Ok(()) => Ok(buf),
            Err(e) => Err(failed(e, buf)),
        }
    }

    async fn decrypt(&self, params: CipherParams, mut buf: IoBuf) -> Result<IoBuf, Failed> {
        match self.0.run(false, &params, buf.as_mut_slice()) {
            Ok(()) => Ok(buf),
            Err(e) => Err(failed(e, buf)),
        }
    }
}

struct AeadCtx(fb::Gcm);

#[async_trait]
impl AeadContext for AeadCtx {
    async fn seal(
        &self,
        nonce: [u8; 12],
        aad: &[u8],
        mut buf: IoBuf,
    ) -> Result<(IoBuf, [u8; 16]), Failed> {
        match self
            .0
            .seal_in_place_detached(&nonce, aad, buf.as_mut_slice())
        {
            Ok(tag) => Ok((buf, tag)),
            Err(e) => Err(failed(e, buf)),
        }
    }

    async fn open(
        &self,
        nonce: [u8; 12],
        aad: &[u8],
        mut buf: IoBuf,
        tag: [u8; 16],
    ) -> Result<IoBuf, Failed> {
        match self
            .0
            .open_in_place_detached(&nonce, aad, buf.as_mut_slice(), &tag)
        {
            Ok(()) => Ok(buf),
            Err(e) => Err(failed(e, buf)),
        }
    }
}

struct CrcCtx(CrcPlan);

#[async_trait]
impl CrcContext for CrcCtx {
    async fn checksum(&self, buf: IoBuf) -> Result<(IoBuf, u64), Failed> {
        let crc = self.0.checksum(buf.as_slice());
        Ok((buf, crc))
    }
}

fn backend_error(e: Error) -> BackendError {
    BackendError::Other(Box::new(e))
}

#[async_trait]
impl Backend for CpuBackend {
    fn name(&self) -> &str {
        CpuBackend::NAME
    }

    fn kind(&self) -> BackendKind {
        BackendKind::Cpu
    }

    fn limits(&self, _alg: Algorithm) -> Option<Limits> {
        Some(Limits::new())
    }

    async fn open_cipher(
        &self,
        alg: CipherAlg,
        key: &SecretKey,
    ) -> Result<Box<dyn CipherContext>, BackendError> {
        Ok(Box::new(CipherCtx(
            self.cipher(alg, key.expose()).map_err(backend_error)?,
        )))
    }

    async fn open_aead(
        &self,
        alg: AeadAlg,
        key: &SecretKey,
    ) -> Result<Box<dyn AeadContext>, BackendError> {
        Ok(Box::new(AeadCtx(
            self.aead(alg, key.expose()).map_err(backend_error)?,
        )))
    }

    async fn open_crc(&self, alg: CrcAlg) -> Result<Box<dyn CrcContext>, BackendError> {
        Ok(Box::new(CrcCtx(CrcPlan::new(alg, self.crc_choice(alg)))))
    }
}

/// A CPU job predicted to take at least this long leaves the async worker
/// for the blocking pool. The hand-off costs ~30 µs of latency (measured
/// with `offload bench`: a 256 KiB CRC-32C took 41 µs through the pool and
/// 5 µs inline; a 1 MiB XTS unit ran at 3.3 GB/s through it against 4.2
/// inline), so a job must be long for the hand-off to be small beside it.
pub(crate) const CPU_BLOCKING_NS: f64 = 500_000.0;

/// Each part of a job split over cores should be at least this long: a
/// scoped thread costs ~30–50 µs to start and join.
pub(crate) const CPU_SPLIT_PART_NS: f64 = 250_000.0;

/// No CPU request shorter than this leaves the calling task.
pub(crate) const BLOCKING_MIN_LEN: usize = 64 * 1024;

/// Rough single-core rates (bytes/ns) when the CPU model is uncalibrated:
/// the build machines' numbers from the fallback's README, rounded down.
pub(crate) fn default_rate(alg: Algorithm, dir: Direction) -> f64 {
    match alg {
        Algorithm::Crc(_) => 40.0,
        Algorithm::Aead(_) => 8.0,
        Algorithm::Cipher(c) => match (c.mode(), dir) {
            (CipherMode::Cbc, Direction::Encrypt) => 0.8,
            (CipherMode::Cbc, Direction::Decrypt) => 6.0,
            (CipherMode::Ctr, _) => 6.0,
            _ => 3.0,
        },
    }
}

/// The predicted inline time of a `len`-byte CPU request: from the CPU's
/// measured `cost` if there is one, else from a default rate.
pub(crate) fn inline_ns(cost: Option<Cost>, alg: Algorithm, dir: Direction, len: usize) -> f64 {
    match cost {
        Some(c) => c.latency_ns(len),
        None => len as f64 / default_rate(alg, dir),
    }
}

/// Whether a CPU request of `len` bytes predicted (uncorrected) at `ns`
/// inline goes to the blocking pool, inside a runtime — and so pays the
/// learned hand-off ([`Model::observe_handoff`]).
///
/// [`Model::observe_handoff`]: crate::cost::Model::observe_handoff
#[inline]
pub(crate) fn blocks(len: usize, ns: f64) -> bool {
    len >= BLOCKING_MIN_LEN && ns >= CPU_BLOCKING_NS
}

/// The request length under which every CPU request of `cost` runs inline
/// ([`plan`] with that cost): [`BLOCKING_MIN_LEN`], and past it as far as
/// the prediction stays under [`CPU_BLOCKING_NS`] — for CRC-32C at
/// ~17 GB/s, ~8 MB. The selector answers requests below its CPU bound
/// without weighing the engines ([`Slots::cpu_bound`]); capped at
/// `BLOCKING_MIN_LEN` instead, every request from 64 KiB was weighed,
/// ~100 ns a request on AMD Zen 4 (`session-overhead`: an `Offload` with a
/// slower engine took 1,272 ns for a 64 KiB CRC-32C against 1,159 with the
/// CPU alone, and 34 ns over a direct call at 60 KiB).
///
/// [`Slots::cpu_bound`]: crate::slot::Slots::cpu_bound
pub(crate) fn inline_below(cost: &Cost) -> u64 {
    let floor = BLOCKING_MIN_LEN as u64;
    cost.len_under(CPU_BLOCKING_NS)
        .map_or(floor, |len| len.max(floor))
}

/// Requests shorter than this spend one unit of tokio's budget whatever
/// their predicted time (`session::spend_budget`).
pub(crate) const ONE_UNIT_LEN: u64 = 4096;

/// The predicted inline CPU time one unit of budget stands for.
const UNIT_NS: f64 = 800.0;

/// Units of budget for a request predicted at `ns` inline: one per
/// [`UNIT_NS`], at least one and at most 64.
pub(crate) fn units(ns: f64) -> u32 {
    ((ns / UNIT_NS) as u32).clamp(1, 64)
}

/// The length under which a CPU request of (`alg`, `dir`) spends one unit
/// of budget (`session::spend_units` counts one below two units' time),
/// from the CPU's measured `cost` or, without one, the default rate
/// [`inline_ns`] predicts from: at least [`ONE_UNIT_LEN`].
pub(crate) fn one_unit_below(cost: Option<Cost>, alg: Algorithm, dir: Direction) -> u64 {
    let two_units = 2.0 * UNIT_NS;
    let len = match cost {
        Some(c) => c.len_under(two_units),
        // len / rate < two_units; saturating.
        None => Some((two_units * default_rate(alg, dir)) as u64),
    };
    len.map_or(ONE_UNIT_LEN, |len| len.max(ONE_UNIT_LEN))
}

/// How a CPU request of `len` bytes runs: `None` inline, or `Some(parts)`
/// on the blocking pool in that many pieces (only inside a tokio runtime),
/// given the CPU's measured `cost` (if any) and the cores it may use.
#[inline]
pub(crate) fn plan(
    cost: impl FnOnce() -> Option<Cost>,
    cores: usize,
    alg: Algorithm,
    dir: Direction,
    len: usize,
) -> Option<usize> {
    // Cheap exit for the common small request.
    if len < BLOCKING_MIN_LEN {
        return None;
    }
    plan_large(cost(), cores, alg, dir, len)
}

fn plan_large(
    cost: Option<Cost>,
    cores: usize,
    alg: Algorithm,
    dir: Direction,
    len: usize,
) -> Option<usize> {
    let ns = inline_ns(cost, alg, dir, len);
    if !blocks(len, ns) || tokio::runtime::Handle::try_current().is_err() {
        return None;
    }
    Some(((ns / CPU_SPLIT_PART_NS) as usize).clamp(1, cores.clamp(1, 8)))
}
