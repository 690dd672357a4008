//! Bringing the device up: [`CryptoDevice::open`] over VFIO and the
//! bring-up behind it (`start`: the virtio handshake, feature negotiation,
//! the validated configuration, the DMA pool, MSI-X, both queues, and the
//! completion and removal tasks), and `DeviceState::reinit`, the same set-up
//! again after a power cycle has reset the device.

use std::os::fd::AsFd;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use nix::sys::eventfd::{EfdFlags, EventFd};
use tracing::Instrument;

use super::tasks::{readable, reap, watch_removal};
use super::{CONTROL_TIMEOUT, CryptoDevice, DeviceState, POLL_FOR};
use crate::dma::DmaPool;
use crate::error::Error;
use crate::limits::{self, CONTROL_CHAIN, DATA_CHAIN, Limits};
use crate::platform::{Platform, Vfio};
use crate::protocol::DeviceConfig;
use crate::queue::Queue;
use crate::transport::{
    ACKNOWLEDGE, DRIVER, DRIVER_OK, F_ACCESS_PLATFORM, F_INDIRECT_DESC, F_VERSION_1, FAILED,
    NO_VECTOR, wanted,
};
use crate::virtqueue::SplitQueue;

impl CryptoDevice {
    /// Opens the device at `address` (e.g. `0000:01:00.0`): VFIO container,
    /// group and device, the DMA pool mapped once, the virtio handshake
    /// (VERSION_1 and ACCESS_PLATFORM), one data queue and the control
    /// queue, MSI-X vector 0 for both, awaited by a task on the current
    /// tokio runtime.
    ///
    /// # Errors
    /// [`Error::Unavailable`] if the device is not bound to `vfio-pci`, its
    /// group is not viable or VFIO is missing; [`Error::Device`] if it does
    /// not behave as a virtio-crypto device.
    ///
    /// # Panics
    /// Outside a tokio runtime, or in one without its I/O and time drivers
    /// (`Builder::enable_all`): interrupts are awaited with `AsyncFd`, and
    /// request timeouts and the wait before a suspend use tokio's timer.
    /// Checked here, at open, rather than at the first request.
    ///
    /// # Cancel safety
    /// Cancel safe: the device is set up synchronously before the first
    /// await point; dropping the future drops the half-open device, which
    /// resets it.
    pub async fn open(address: &str) -> Result<CryptoDevice, Error> {
        let span = tracing::debug_span!("vfio.open", address);
        async { CryptoDevice::start(address, Box::new(Vfio::open(address)?)) }
            .instrument(span)
            .await
    }

    /// Brings up the device behind `hw` (named `address`): the virtio
    /// handshake, the DMA pool, MSI-X and both queues, and the completion
    /// and removal tasks on the current tokio runtime.
    pub(crate) fn start(address: &str, hw: Box<dyn Platform>) -> Result<CryptoDevice, Error> {
        // Panics now, with tokio's message, if the runtime has no timer.
        drop(tokio::time::sleep(std::time::Duration::ZERO));
        hw.reset()?;
        hw.add_status(ACKNOWLEDGE | DRIVER)?;
        // Whatever fails from here, the device is told (virtio §3.1.1).
        let up = set_up(&*hw).inspect_err(|_| {
            let _ = hw.add_status(FAILED);
        })?;
        // The kernel's request for the device back (hot-unplug).
        let req = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
            .map_err(|e| Error::sys("eventfd", e))?;
        hw.enable_req_irq(req.as_fd())?;
        let irq_dup = up
            .irq
            .as_fd()
            .try_clone_to_owned()
            .map_err(|source| Error::Io {
                op: "dup eventfd",
                source,
            })?;
        let config = up.config;
        let inner = Arc::new(DeviceState {
            address: address.to_owned(),
            hw: std::sync::RwLock::new(Some(hw)),
            pool: up.pool,
            config,
            limits: up.limits,
            data: up.data,
            ctrl: up.ctrl,
            gone: AtomicBool::new(false),
            broken: Mutex::new(None),
            power: Mutex::new(()),
            parked: Mutex::new(Vec::new()),
            reaper: Mutex::new(None),
            irq: irq_dup,
            low_power: AtomicBool::new(false),
            sessions: std::sync::atomic::AtomicUsize::new(0),
            completion_threads: Mutex::new(Vec::new()),
            released_with: std::sync::atomic::AtomicUsize::new(0),
            watcher: Mutex::new(None),
            interrupts: std::sync::atomic::AtomicU64::new(0),
            poll_for: std::sync::atomic::AtomicU64::new(POLL_FOR.as_nanos() as u64),
            control_timeout: std::sync::atomic::AtomicU64::new(CONTROL_TIMEOUT.as_nanos() as u64),
        });
        let fd = readable(up.irq)?;
        let task = tokio::spawn(reap(Arc::downgrade(&inner), fd, inner.data.watch.clone()));
        *inner.reaper.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
        let req = readable(req)?;
        let watcher = tokio::spawn(watch_removal(Arc::downgrade(&inner), req));
        *inner.watcher.lock().unwrap_or_else(|p| p.into_inner()) = Some(watcher);
        tracing::debug!(?config, limits = ?inner.limits, "virtio-crypto device up");
        Ok(CryptoDevice { inner })
    }
}

/// What [`set_up`] brings up.
struct Up {
    config: DeviceConfig,
    limits: Limits,
    pool: Arc<DmaPool>,
    irq: EventFd,
    data: Queue,
    ctrl: Queue,
}

/// Features, device configuration (validated: [`Limits::of`]), the DMA
/// pool, MSI-X and both queues; then DRIVER_OK.
fn set_up(hw: &dyn Platform) -> Result<Up, Error> {
    let offered = hw.device_features()?;
    if offered & F_VERSION_1 == 0 {
        return Err(Error::Device(
            "no VIRTIO_F_VERSION_1 (a legacy-only device)".into(),
        ));
    }
    // With ACCESS_PLATFORM the device's DMA goes through the IOMMU, at
    // the IOVAs VFIO maps; without it, the device takes guest-physical
    // addresses (QEMU's iommu_platform=off) and the pool must give those.
    let translated = offered & F_ACCESS_PLATFORM != 0;
    hw.negotiate(wanted(offered))?;
    let config = hw.read_config()?;
    if config.max_dataqueues == 0 {
        return Err(Error::Device("no data queues".into()));
    }
    let limits = Limits::of(&config)?;
    let pool = hw.dma_pool(translated)?;
    let irq = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
        .map_err(|e| Error::sys("eventfd", e))?;
    if hw.msix_vectors()? == 0 {
        return Err(Error::Device("no MSI-X".into()));
    }
    hw.enable_msix(irq.as_fd())?;
    hw.set_config_vector(NO_VECTOR)?;
    // Queues 0..max_dataqueues carry data; the control queue is next.
    let ctrl_index = u16::try_from(config.max_dataqueues)
        .map_err(|_| Error::Device("too many data queues".into()))?;
    // Data requests go through indirect tables when the device takes them;
    // control requests (rare) as plain chains.
    let data = queue(hw, &pool, 0, wanted(offered) & F_INDIRECT_DESC != 0)?;
    let ctrl = queue(hw, &pool, ctrl_index, false)?;
    hw.add_status(DRIVER_OK)?;
    Ok(Up {
        config,
        limits,
        pool,
        irq,
        data,
        ctrl,
    })
}

/// Sets queue `index` up in the pool, on MSI-X vector 0.
fn queue(
    hw: &dyn Platform,
    pool: &Arc<DmaPool>,
    index: u16,
    indirect: bool,
) -> Result<Queue, Error> {
    let longest = match (index, indirect) {
        (0, true) => 1,
        (0, false) => DATA_CHAIN,
        _ => CONTROL_CHAIN,
    };
    let size = limits::queue_size(index, hw.queue_max_size(index)?, longest)?;
    let mem = pool
        .try_alloc(SplitQueue::bytes(size))?
        .ok_or_else(|| Error::Device("no DMA room for a queue".into()))?;
    let mut ring = SplitQueue::new(mem, size)?;
    ring.set_indirect(indirect);
    let notify_off = hw.setup_queue(index, size, ring.addresses(), 0)?;
    Ok(Queue::new(index, notify_off, ring))
}

impl DeviceState {
    /// The virtio set-up again after the device lost its state (a power
    /// cycle through D3hot resets it): handshake, MSI-X, both queues from
    /// empty rings.
    pub(super) fn reinit(&self) -> Result<(), Error> {
        let guard = self.hw.read().unwrap_or_else(|p| p.into_inner());
        let Some(hw) = guard.as_ref() else {
            return Err(Error::Gone);
        };
        // Before the reset, which would strand them unfailed.
        for q in [&self.data, &self.ctrl] {
            if !q.lock().pending.is_empty() {
                return Err(Error::Device(
                    "requests in flight across a power cycle".into(),
                ));
            }
        }
        hw.reset()?;
        hw.add_status(ACKNOWLEDGE | DRIVER)?;
        let offered = hw.device_features()?;
        hw.negotiate(wanted(offered))?;
        let indirect = wanted(offered) & F_INDIRECT_DESC != 0;
        hw.enable_msix(self.irq.as_fd())?;
        hw.set_config_vector(NO_VECTOR)?;
        for q in [&self.data, &self.ctrl] {
            let mut state = q.lock();
            state.ring.reset()?;
            state
                .ring
                .set_indirect(indirect && std::ptr::eq(q, &self.data));
            let size = state.ring.size();
            hw.setup_queue(q.index, size, state.ring.addresses(), 0)?;
        }
        hw.add_status(DRIVER_OK)
    }
}
