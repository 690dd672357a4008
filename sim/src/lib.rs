#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

//! # How it is built
//!
//! It models an engine with `queues` hardware queues (rings), each serving
//! one request at a time in order, holding up to `queue_depth` requests. A
//! request costs the submitting thread `submit_cpu` of real CPU time (the
//! driver's share), waits for its queue, is served in `latency + len /
//! bandwidth`, and costs its queue's completion handler `completion_cpu`
//! (the interrupt's share: with one queue every completion is handled in
//! turn, with several they spread over the worker threads, as EIP-197's
//! rings spread over CPUs). Results are real: they are computed by the CPU
//! code when the request completes (a few per cent of the modelled time for
//! engines slower than the CPU). Waiting is a tokio timer, so no worker
//! thread is held while the "device" works, and tests on tokio's paused
//! clock are exact and instant.
//!
//! A request whose future is dropped is still finished by the device, which
//! keeps its queue slot, power reference and buffer until the modelled
//! completion, as a DMA engine must ([`SimEngine::in_flight`] counts them,
//! [`SimEngine::idle`] waits for them).
//!
//! It has a [`PowerDomain`] (resume latency, autosuspend) whose reference its
//! contexts hold — or, in `per_request` mode, each request takes and drops,
//! as the OMAP AES driver did before it was fixed — and fault injection:
//! an error rate, a timeout rate, and a "device gone" point after which
//! every request and every open fails.
//!
//! The crate uses only crypto-offload's public API (the [`Backend`] trait
//! and its context traits, [`PowerDomain`],
//! [`IoBuf`](crypto_offload::backend::IoBuf), [`SecretKey`]) and
//! `crypto-offload-fallback`'s ciphers and CRCs: a third party's backend
//! is built the same way. By module: `config` (the settings and presets),
//! `fate` (fault injection), `device` (queues, completion threads, parked
//! requests), `power` (the power switch), `engine` (the request path),
//! `context` (the keyed contexts).

mod config;
mod context;
mod device;
mod engine;
mod fate;
mod power;

use core::fmt;
use std::sync::Arc;

use crypto_offload::backend::async_trait;
use crypto_offload::backend::{
    AeadContext, Backend, BackendError, CipherContext, CrcContext, Limits, PowerDomain, SecretKey,
};
use crypto_offload::{AeadAlg, Algorithm, BackendKind, CipherAlg, CrcAlg};

pub use config::{SimConfig, SimFaults, SimPower, SimTimer};

use context::{SimAead, SimCipher, SimCrc};
use engine::Shared;

/// A simulated engine. Create it inside a tokio runtime.
pub struct SimEngine {
    shared: Arc<Shared>,
}

impl fmt::Debug for SimEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimEngine")
            .field("config", &self.shared.config)
            .field("requests", &self.requests())
            .finish()
    }
}

impl SimEngine {
    /// An engine with `config`.
    pub fn new(config: SimConfig) -> Self {
        SimEngine {
            shared: Arc::new(Shared::new(config)),
        }
    }

    /// A preset (see [`SimConfig::preset`]).
    pub fn preset(name: &str) -> Option<Self> {
        SimConfig::preset(name).map(SimEngine::new)
    }

    /// The configuration.
    pub fn config(&self) -> &SimConfig {
        &self.shared.config
    }

    /// Requests submitted so far.
    pub fn requests(&self) -> u64 {
        self.shared.faults.requests()
    }

    /// Requests holding a slot on the device now: submitted and not yet
    /// completed, including those whose request future was dropped (the
    /// device still finishes them, and keeps their buffers until then).
    /// Requests waiting for a free slot are not counted. A slot that is
    /// never given back shows here, so tests of cancellation watch it
    /// return to 0.
    pub fn in_flight(&self) -> usize {
        self.shared.capacity() - self.shared.slots.available_permits()
    }

    /// Waits until the device holds no request ([`in_flight`] is 0): every
    /// request submitted so far has completed, and the buffers of those
    /// whose request futures were dropped have been freed. Requests
    /// submitted meanwhile wait behind it (the slots are handed out in
    /// order). For tests: the signal that the device is done, where a
    /// sleep would only guess.
    ///
    /// [`in_flight`]: Self::in_flight
    pub async fn idle(&self) {
        let mut all = self.shared.capacity();
        let mut taken = Vec::new();
        while all > 0 {
            let n = u32::try_from(all).unwrap_or(u32::MAX);
            match self.shared.slots.acquire_many(n).await {
                Ok(p) => taken.push(p),
                Err(_) => return,
            }
            all -= n as usize;
        }
    }

    /// Makes the device vanish (or come back), as a hot-unplug would.
    pub fn set_gone(&self, gone: bool) {
        self.shared.faults.set_gone(gone);
    }
}

#[async_trait]
impl Backend for SimEngine {
    fn name(&self) -> &str {
        &self.shared.config.name
    }

    /// [`BackendKind::Other`]: to crypto-offload it is a third party's
    /// engine like any other.
    fn kind(&self) -> BackendKind {
        BackendKind::Other
    }

    /// The configured algorithms; the queues' capacity as the queue
    /// depth; and, while it computes real results, the modelled CPU cost.
    fn limits(&self, alg: Algorithm) -> Option<Limits> {
        let c = &self.shared.config;
        if !c.algorithms.contains(&alg) {
            return None;
        }
        let limits = Limits::new().with_queue_depth(self.shared.capacity());
        // Computing real results is the simulator's own CPU work, which the
        // modelled engine would not do: declare the model's cost instead of
        // letting calibration measure it. Without results there is no such
        // artefact, and calibration measures what requests really cost.
        Some(if c.compute_results {
            limits.with_cpu_cost(c.submit_cpu.saturating_add(c.completion_cpu), 0.0)
        } else {
            limits
        })
    }

    fn power(&self) -> Option<&PowerDomain> {
        self.shared.power.as_ref()
    }

    async fn open_cipher(
        &self,
        alg: CipherAlg,
        key: &SecretKey,
    ) -> Result<Box<dyn CipherContext>, BackendError> {
        Ok(Box::new(
            SimCipher::open(&self.shared, alg, key.expose()).await?,
        ))
    }

    async fn open_aead(
        &self,
        alg: AeadAlg,
        key: &SecretKey,
    ) -> Result<Box<dyn AeadContext>, BackendError> {
        Ok(Box::new(
            SimAead::open(&self.shared, alg, key.expose()).await?,
        ))
    }

    async fn open_crc(&self, alg: CrcAlg) -> Result<Box<dyn CrcContext>, BackendError> {
        Ok(Box::new(SimCrc::open(&self.shared, alg).await?))
    }
}
