//! A virtio-crypto device driven from userspace. This module holds the
//! handle ([`CryptoDevice`]) and the state it shares with its sessions and
//! tasks (`DeviceState`), the defaults of its settings, its plain accessors and
//! settings, access to the hardware (gone once released, out of reach in
//! D3hot), whether it takes requests, and what its queues see of it
//! (`Host`); bring-up, the interrupt and removal tasks, the polling wait,
//! submission, power, release and diagnostics are in the submodules.

mod bring_up;
mod diagnose;
mod poll;
mod power;
mod release;
mod submit;
mod tasks;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::dma::{DmaBuf, DmaPool};
use crate::error::Error;
use crate::limits::{DATA_CHAIN, Limits};
use crate::platform::Platform;
use crate::protocol::DeviceConfig;
use crate::queue::{Host, Queue};

/// How long a waiting caller polls the used ring without seeing any
/// completion before it turns the device's interrupts back on and sleeps
/// (the default; [`CryptoDevice::set_poll_for`]). Polling while the device completes requests skips the interrupt, the
/// eventfd and a thread wake-up per batch; with no progress for this long
/// the device is idle or slow, and sleeping burns no core.
pub const POLL_FOR: std::time::Duration = std::time::Duration::from_micros(100);

/// How long a control request — a session's creation or destruction — may
/// take before it fails with [`Error::Timeout`] (the default;
/// [`CryptoDevice::set_control_timeout`]): a device whose control queue
/// hangs must not hang the caller opening a session, nor keep a dropped
/// session's destruction waiting forever.
pub const CONTROL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

pub(crate) struct DeviceState {
    pub(crate) address: String,
    /// The hardware (VFIO, or an emulated device in tests). Released (the
    /// device fd closed, the BARs unmapped) when the kernel asks for the
    /// device back (hot-unplug), so that its removal can finish. Doorbells
    /// are rung under its read lock, and a suspend takes its write lock:
    /// no BAR write crosses the entry into D3hot.
    hw: std::sync::RwLock<Option<Box<dyn Platform>>>,
    pub(crate) pool: Arc<DmaPool>,
    pub(crate) config: DeviceConfig,
    /// What requests keep to, validated from `config` at open.
    pub(crate) limits: Limits,
    pub(crate) data: Queue,
    pub(crate) ctrl: Queue,
    /// Reset, removed or broken: no new requests; what was in flight has
    /// failed.
    gone: AtomicBool,
    /// Why the device is no longer trusted, if it broke the virtio rules.
    broken: Mutex<Option<String>>,
    /// Serialises suspend and resume (the public API allows them from any
    /// thread; `Offload`'s power domain also serialises them).
    power: Mutex<()>,
    /// Buffers of requests failed while the device might still write them,
    /// kept until the device is reset.
    parked: Mutex<Vec<DmaBuf>>,
    /// The completion task.
    reaper: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The interrupt eventfd (a duplicate of the one the completion task
    /// waits on), to bind MSI-X again after a power cycle.
    irq: std::os::fd::OwnedFd,
    /// In the PCI low-power state (D3hot): the device lost its virtio
    /// state and takes no requests until resumed. Set under both queues'
    /// locks (so no request is staged after it) and read under the
    /// hardware's lock before any register access.
    low_power: AtomicBool,
    /// Cipher sessions alive on the device (counted from before their
    /// creation is sent, so that a suspend never crosses one).
    pub(crate) sessions: std::sync::atomic::AtomicUsize,
    /// Completions handed back, per thread (name and id): where the
    /// completion work ran.
    completion_threads: Mutex<Vec<(std::thread::ThreadId, String, u64)>>,
    /// Requests the device held when the kernel asked for it back.
    released_with: std::sync::atomic::AtomicUsize,
    /// The removal-request watcher.
    watcher: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// MSI-X interrupts received.
    interrupts: std::sync::atomic::AtomicU64,
    /// How long a waiting caller polls without progress, in nanoseconds
    /// (0: never; interrupts only).
    poll_for: std::sync::atomic::AtomicU64,
    /// How long a control request (a session's creation or destruction)
    /// may take, in nanoseconds.
    control_timeout: std::sync::atomic::AtomicU64,
}

/// A virtio-crypto PCI device (QEMU's `virtio-crypto-pci`, 1af4:1054) bound
/// to `vfio-pci` and driven from this process. Cheap to clone.
#[derive(Clone)]
pub struct CryptoDevice {
    inner: Arc<DeviceState>,
}

impl std::fmt::Debug for CryptoDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CryptoDevice")
            .field("address", &self.inner.address)
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl CryptoDevice {
    /// Its PCI address.
    pub fn address(&self) -> &str {
        &self.inner.address
    }

    /// What the device advertises.
    pub fn config(&self) -> DeviceConfig {
        self.inner.config
    }

    /// The limits requests on this device keep to (validated from its
    /// configuration at open).
    pub fn limits(&self) -> Limits {
        self.inner.limits
    }

    /// Entries in its data queue.
    pub fn queue_size(&self) -> usize {
        usize::from(self.inner.data.lock().ring.size())
    }

    /// The most data requests the device holds at once: one per entry of
    /// its data queue with indirect tables, one per five without. More
    /// wait for room (back-pressure).
    pub fn queue_depth(&self) -> usize {
        let state = self.inner.data.lock();
        let size = usize::from(state.ring.size());
        if state.ring.indirect() {
            size
        } else {
            size / DATA_CHAIN
        }
    }

    /// The bytes of its DMA pool (4 MiB behind an IOMMU, one 2 MiB huge
    /// page otherwise), from which its rings and every request in flight
    /// are carved: what a caller holding many prepared requests at once
    /// budgets against ([`CipherSession::request_bytes`]).
    ///
    /// [`CipherSession::request_bytes`]: crate::CipherSession::request_bytes
    pub fn pool_bytes(&self) -> usize {
        self.inner.pool.len()
    }

    /// A device-ready buffer of `len` zero bytes, carved from the device's
    /// DMA memory: requests on it through a session of this device
    /// ([`CipherSession::encrypt_buffer`]) copy nothing. `None` when
    /// buffers already take half the pool (the rest stays for requests on
    /// ordinary memory, which are copied through it) or the pool has no
    /// room now: the caller then uses ordinary memory.
    ///
    /// # Errors
    /// [`Error::TooLarge`] above the largest single request
    /// ([`Limits::max_request`]).
    ///
    /// [`CipherSession::encrypt_buffer`]: crate::CipherSession::encrypt_buffer
    pub fn try_buffer(&self, len: usize) -> Result<Option<crate::DmaBuffer>, Error> {
        let max = self.inner.limits.max_request;
        if len > max {
            return Err(Error::TooLarge { len, max });
        }
        crate::buffer::DmaBuffer::try_new(&self.inner.pool, len)
    }

    /// Bytes of its pool held by device-ready buffers (for tests).
    #[cfg(test)]
    pub(crate) fn pool_lent(&self) -> usize {
        self.inner.pool.lent.load(Ordering::Relaxed)
    }

    /// Sets how long a caller waiting for its requests polls the device's
    /// used ring while no completion comes before it sleeps on the
    /// interrupt ([`POLL_FOR`] by default). Zero: never poll — every
    /// completion comes by interrupt (no spinning at all, at the cost of an
    /// interrupt, an eventfd and a thread wake-up per batch).
    pub fn set_poll_for(&self, budget: std::time::Duration) {
        let nanos = u64::try_from(budget.as_nanos()).unwrap_or(u64::MAX);
        self.inner.poll_for.store(nanos, Ordering::Relaxed);
    }

    /// Sets how long a control request (a session's creation or
    /// destruction) may take before it fails with [`Error::Timeout`]
    /// ([`CONTROL_TIMEOUT`] by default). Its memory stays with the driver
    /// until the device completes it or is reset.
    pub fn set_control_timeout(&self, timeout: std::time::Duration) {
        let nanos = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
        self.inner.control_timeout.store(nanos, Ordering::Relaxed);
    }
}

impl DeviceState {
    /// Runs `f` on the device, if it has not been released.
    fn with_hw<T>(&self, f: impl FnOnce(&dyn Platform) -> Result<T, Error>) -> Result<T, Error> {
        let guard = self.hw.read().unwrap_or_else(|p| p.into_inner());
        match guard.as_ref() {
            Some(hw) => f(&**hw),
            None => Err(Error::Gone),
        }
    }

    /// Runs `f` on the device's registers, if it has not been released and
    /// is not in D3hot (checked under the lock a suspend takes for
    /// writing: the device cannot enter D3hot while `f` runs).
    fn with_awake_hw<T>(
        &self,
        f: impl FnOnce(&dyn Platform) -> Result<T, Error>,
    ) -> Result<T, Error> {
        self.with_hw(|hw| {
            if self.low_power.load(Ordering::Acquire) {
                return Err(suspended());
            }
            f(hw)
        })
    }

    /// Whether the device takes requests, suspended or not: one atomic
    /// load on the request path (a broken device is also gone); why not,
    /// only when it does not.
    fn accepting_or_suspended(&self) -> Result<(), Error> {
        if !self.gone.load(Ordering::Acquire) {
            return Ok(());
        }
        match self
            .broken
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            Some(why) => Err(Error::Broken(why.clone())),
            None => Err(Error::Gone),
        }
    }

    /// Why a request failed whose completion will never come: the device
    /// broke the rules, or it was reset or removed.
    fn failure(&self) -> Error {
        match self.accepting_or_suspended() {
            Err(e) => e,
            Ok(()) => Error::Gone,
        }
    }
}

/// The error for requests and register access while in D3hot.
fn suspended() -> Error {
    Error::Device("the device is suspended: resume it first".into())
}

impl Host for DeviceState {
    fn accepting(&self) -> Result<(), Error> {
        self.accepting_or_suspended()?;
        if self.low_power.load(Ordering::Acquire) {
            return Err(suspended());
        }
        Ok(())
    }

    fn notify(&self, q: &Queue) -> Result<(), Error> {
        // Under the read lock a suspend's entry into D3hot takes for
        // writing. Marked suspended already, the device held no request
        // when it was (it refuses otherwise): the one this doorbell was
        // for has completed, and the doorbell is not rung into D3hot.
        self.with_hw(|hw| {
            if self.low_power.load(Ordering::Acquire) {
                return Ok(());
            }
            hw.notify(q.notify_off, q.index)
        })
    }

    fn broken(&self, q: &Queue, error: Error, orphans: Vec<DmaBuf>) {
        {
            let mut broken = self.broken.lock().unwrap_or_else(|p| p.into_inner());
            if broken.is_none() {
                tracing::error!(
                    address = %self.address,
                    queue = q.index,
                    %error,
                    "device broke the virtio rules; failing it"
                );
                *broken = Some(error.to_string());
            }
        }
        self.parked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(orphans);
        self.fail_all();
    }

    fn completed(&self, n: u64) {
        self.count_completions(n);
    }
}

#[cfg(test)]
mod tests;
