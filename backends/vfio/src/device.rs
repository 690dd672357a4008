//! A virtio-crypto device driven from userspace: open and handshake, the
//! completion task, submission and the adaptive poll/interrupt wait, power
//! and failure handling.

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use nix::sys::eventfd::{EfdFlags, EventFd};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::oneshot;
use tracing::Instrument;

use crate::dma::{DmaBuf, DmaPool};
use crate::error::Error;
use crate::limits::{self, CONTROL_CHAIN, DATA_CHAIN, Limits};
use crate::platform::{Platform, Vfio};
use crate::protocol::{self, CipherAlgo, DeviceConfig, HEADER_LEN, SESSION_INPUT_LEN};
use crate::queue::{Burst, Host, Queue};
use crate::request::Chain;
use crate::session::CipherSession;
use crate::transport::{
    ACKNOWLEDGE, DRIVER, DRIVER_OK, F_ACCESS_PLATFORM, F_INDIRECT_DESC, F_VERSION_1, FAILED,
    NO_VECTOR, wanted,
};
use crate::virtqueue::{Segment, SplitQueue};

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

pub(crate) struct Inner {
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
    inner: Arc<Inner>,
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
        let inner = Arc::new(Inner {
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
        let task = tokio::spawn(reap(Arc::downgrade(&inner), fd));
        *inner.reaper.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
        let req = readable(req)?;
        let watcher = tokio::spawn(watch_removal(Arc::downgrade(&inner), req));
        *inner.watcher.lock().unwrap_or_else(|p| p.into_inner()) = Some(watcher);
        tracing::debug!(?config, limits = ?inner.limits, "virtio-crypto device up");
        Ok(CryptoDevice { inner })
    }

    /// Its PCI address.
    pub fn address(&self) -> &str {
        &self.inner.address
    }

    /// What the device advertises.
    pub fn config(&self) -> DeviceConfig {
        self.inner.config
    }

    /// DMA pool units in use (returns to its idle level when no request is
    /// in flight: nothing leaks).
    pub fn dma_units_in_use(&self) -> usize {
        self.inner.pool.units_in_use()
    }

    /// Requests the device holds.
    pub fn in_flight(&self) -> usize {
        self.inner.data.in_flight() + self.inner.ctrl.in_flight()
    }

    /// The limits requests on this device keep to (validated from its
    /// configuration at open).
    pub fn limits(&self) -> Limits {
        self.inner.limits
    }

    /// Times a submission of data requests found the queue full
    /// (back-pressure: more requests were sent than the device holds). It
    /// staged what fit and waited for room for the rest — unless the
    /// device had made room meanwhile (QEMU's completes requests within the
    /// doorbell's write).
    pub fn queue_full_count(&self) -> u64 {
        self.inner.data.full.load(Ordering::Relaxed)
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

    /// DMA buffers kept from failed requests until the device can no
    /// longer write them (a reset, or its release).
    pub fn parked_buffers(&self) -> usize {
        self.inner
            .parked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// Why the device is no longer trusted, if it broke the virtio rules
    /// (a used entry naming no request, a used index running ahead): it
    /// then takes no requests.
    pub fn broken(&self) -> Option<String> {
        self.inner
            .broken
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The device status and each queue's indices, for diagnosing a device
    /// that stopped answering.
    pub fn diagnose(&self) -> String {
        // Its registers are out of reach in D3hot: `with_awake_hw` says so.
        let status = self
            .inner
            .with_awake_hw(|hw| hw.status())
            .map_or_else(|e| e.to_string(), |s| format!("{s:#x}"));
        let mut out = format!("status {status}");
        if let Some(why) = self.broken() {
            out += &format!("; broken: {why}");
        }
        for (name, q) in [("data", &self.inner.data), ("ctrl", &self.inner.ctrl)] {
            let state = q.lock();
            out += &format!(
                "; {name} queue {}: {} pending, {}",
                q.index,
                state.pending.len(),
                state.ring.diagnose()
            );
        }
        out
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

    /// The bytes of its DMA pool (4 MiB behind an IOMMU, one 2 MiB huge
    /// page otherwise), from which its rings and every request in flight
    /// are carved: what a caller holding many prepared requests at once
    /// budgets against ([`CipherSession::request_bytes`]).
    pub fn pool_bytes(&self) -> usize {
        self.inner.pool.len()
    }

    /// MSI-X interrupts received so far (each can announce many
    /// completions; none come while callers poll).
    pub fn interrupts(&self) -> u64 {
        self.inner.interrupts.load(Ordering::Relaxed)
    }

    /// Completions handed back so far, per thread that found them (by
    /// interrupt or by polling; a tokio worker's name and the thread's
    /// id): where this device's completion work ran.
    pub fn completion_threads(&self) -> Vec<(String, u64)> {
        let map = self
            .inner
            .completion_threads
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let mut v: Vec<_> = map.iter().map(|(_, name, n)| (name.clone(), *n)).collect();
        v.sort();
        v
    }

    /// How many requests the device held when the kernel asked for it back
    /// (0 if it never did).
    pub fn released_with(&self) -> usize {
        self.inner.released_with.load(Ordering::Acquire)
    }

    /// Whether the kernel took the device back (hot-unplug).
    pub fn is_released(&self) -> bool {
        self.inner
            .hw
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .is_none()
    }

    /// Whether the device was reset or removed under its requests.
    pub fn is_gone(&self) -> bool {
        self.inner.gone.load(Ordering::Acquire)
    }

    /// Resets the device — the virtio transport first (its status must
    /// read back 0: the device has let go of the rings and every buffer),
    /// then the function (`VFIO_DEVICE_RESET`): every request in flight
    /// fails with [`Error::Gone`] (its caller's buffer unchanged), and the
    /// device takes no more. The DMA memory of failed requests is reused
    /// only once both resets succeeded; if either fails it stays parked
    /// (the device might still write it) until the device is released.
    ///
    /// # Errors
    /// The reset that failed; [`Error::Device`] while suspended (the
    /// device then holds nothing: it was reset when it was suspended).
    pub fn reset(&self) -> Result<(), Error> {
        let inner = &self.inner;
        inner.fail_all();
        let r = inner.with_awake_hw(|hw| {
            hw.reset()?;
            hw.reset_function()
        });
        match &r {
            // Quiet now: what the device could have written is free again.
            Ok(()) => inner
                .parked
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clear(),
            Err(e) => tracing::warn!(
                address = %inner.address,
                error = %e,
                parked = inner.parked.lock().unwrap_or_else(|p| p.into_inner()).len(),
                "reset failed: failed requests' memory stays parked"
            ),
        }
        r
    }

    /// Puts the device in the PCI low-power state (D3hot, through
    /// `VFIO_DEVICE_FEATURE` LOW_POWER_ENTRY), after the requests still in
    /// flight (a dropped session's destroy) complete. The device loses its
    /// virtio state: it takes no requests until [`CryptoDevice::resume`].
    ///
    /// Safe against concurrent use: no request is staged once the device
    /// is marked suspended (under the queues' locks, where submitters
    /// check), and no doorbell is rung once it enters D3hot (a BAR write
    /// there is a SIGBUS): doorbells are rung under the hardware's read
    /// lock, which the entry takes for writing.
    ///
    /// A no-op on a device already suspended. Suspend and resume from any
    /// thread are serialised: the check, the marking and the entry into
    /// D3hot happen under one lock a resume also takes.
    ///
    /// # Errors
    /// [`Error::Invalid`] while sessions live (their device sessions would
    /// be lost); [`Error::Device`] if requests stay in flight for a second;
    /// the ioctl's error (the device is then set up again and stays
    /// usable).
    ///
    /// # Cancel safety
    /// Cancel safe: the only await is the wait for requests in flight,
    /// before anything changes.
    pub async fn suspend(&self) -> Result<(), Error> {
        let inner = &self.inner;
        let start = std::time::Instant::now();
        loop {
            {
                let _power = inner.power.lock().unwrap_or_else(|p| p.into_inner());
                if inner.low_power.load(Ordering::Acquire) {
                    return Ok(());
                }
                if inner.mark_suspended()? {
                    return inner.enter_low_power_locked();
                }
            }
            if start.elapsed() > std::time::Duration::from_secs(1) {
                return Err(Error::Device("requests still in flight after 1 s".into()));
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }

    /// Brings the device back from [`CryptoDevice::suspend`] (LOW_POWER_EXIT)
    /// and sets it up again: the virtio handshake, MSI-X and both queues.
    /// A no-op on a device that is not suspended.
    ///
    /// # Errors
    /// The ioctl's error, or the device's refusal during set-up.
    pub fn resume(&self) -> Result<(), Error> {
        let inner = &self.inner;
        let _power = inner.power.lock().unwrap_or_else(|p| p.into_inner());
        if !inner.low_power.load(Ordering::Acquire) {
            return Ok(());
        }
        inner.with_hw(|hw| hw.set_low_power(false))?;
        inner.reinit()?;
        inner.low_power.store(false, Ordering::Release);
        Ok(())
    }

    /// Whether the device is in the low-power state (its BARs are then out
    /// of reach: this driver touches none until it is resumed).
    pub fn is_suspended(&self) -> bool {
        self.inner.low_power.load(Ordering::Acquire)
    }

    /// A cipher session: one device session per direction, with `key`.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a key length the mode does not take;
    /// [`Error::Status`] if the device refuses the session (e.g. `NOTSUPP`
    /// for a mode its backend lacks).
    ///
    /// # Cancel safety
    /// Not cancel safe in effect: a dropped future may leave a device
    /// session created and never destroyed (it is reclaimed at reset).
    pub async fn cipher_session(
        &self,
        algo: CipherAlgo,
        key: &[u8],
    ) -> Result<CipherSession, Error> {
        if !algo.key_lens().contains(&key.len()) {
            return Err(Error::Invalid {
                what: "key length",
                detail: format!("{} bytes for {algo:?}", key.len()),
            });
        }
        // Counted before the device hears of it, so that a suspend (which
        // refuses while sessions live) never crosses its creation.
        let reserved = SessionReservation::new(&self.inner);
        let encrypt = self.inner.create_session(algo, key, true).await?;
        let decrypt = match self.inner.create_session(algo, key, false).await {
            Ok(id) => id,
            Err(e) => {
                let _ = self.inner.destroy_session(algo, encrypt).await;
                return Err(e);
            }
        };
        reserved.keep();
        Ok(CipherSession {
            dev: self.inner.clone(),
            algo,
            ids: [encrypt, decrypt],
            closed: false,
            timeout: None,
        })
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

/// A session counted on a device while it is being created: uncounted if
/// the creation fails or its future is dropped.
struct SessionReservation<'a>(Option<&'a Inner>);

impl<'a> SessionReservation<'a> {
    fn new(inner: &'a Inner) -> Self {
        inner.sessions.fetch_add(1, Ordering::AcqRel);
        SessionReservation(Some(inner))
    }

    /// The session exists: it stays counted (until its drop).
    fn keep(mut self) {
        self.0 = None;
    }
}

impl Drop for SessionReservation<'_> {
    fn drop(&mut self) {
        if let Some(inner) = self.0 {
            inner.sessions.fetch_sub(1, Ordering::AcqRel);
        }
    }
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

/// `fd` registered with the runtime, to be awaited when readable.
fn readable(fd: EventFd) -> Result<AsyncFd<EventFd>, Error> {
    // SAFETY: the `EventFd` owns its descriptor, so it stays open for as
    // long as the `AsyncFd` that now owns the `EventFd` lives.
    unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }.map_err(|e| Error::Io {
        op: "AsyncFd::register",
        source: std::io::Error::other(e.to_string()),
    })
}

/// Waits for the kernel's request to have the device back (its removal:
/// VFIO's request interrupt), then releases it.
async fn watch_removal(inner: Weak<Inner>, req: AsyncFd<EventFd>) {
    loop {
        let mut ready = match req.readable().await {
            Ok(r) => r,
            Err(_) => return,
        };
        if let Ok(Ok(_)) = ready.try_io(|fd| fd.get_ref().read().map_err(std::io::Error::from)) {
            if let Some(inner) = inner.upgrade() {
                inner.release();
            }
            return;
        }
    }
}

/// The completion task: each interrupt drains both queues.
async fn reap(inner: Weak<Inner>, irq: AsyncFd<EventFd>) {
    loop {
        let mut ready = match irq.readable().await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(%e, "interrupt eventfd failed");
                return;
            }
        };
        // Consume the count (interrupts since the last read); spurious
        // wake-ups read EAGAIN.
        let count = ready.try_io(|fd| fd.get_ref().read().map_err(std::io::Error::from));
        let Some(inner) = inner.upgrade() else { return };
        if let Ok(Ok(n)) = count {
            inner.interrupts.fetch_add(n, Ordering::Relaxed);
        }
        inner.drain(&inner.data);
        inner.drain(&inner.ctrl);
    }
}

impl Inner {
    /// Hands every completed request of `q` back to its caller; how many
    /// callers that finished (whose tasks may now go on). A completion that
    /// breaks the ring's rules fails the device ([`Host::broken`]).
    fn drain(&self, q: &Queue) -> u64 {
        q.drain(self)
    }

    /// Notes that this thread handed back `n` completions (the spreading
    /// measurement: which threads do the completion work).
    fn count_completions(&self, n: u64) {
        // By thread id (a cheap comparison: this runs for every drain that
        // found something); the name is made once per thread.
        let id = std::thread::current().id();
        let mut threads = self
            .completion_threads
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        match threads.iter_mut().find(|(t, _, _)| *t == id) {
            Some((_, _, count)) => *count += n,
            None => {
                let thread = std::thread::current();
                let name = format!("{} {id:?}", thread.name().unwrap_or("thread"));
                threads.push((id, name, n));
            }
        }
    }

    /// Waits for `rx`, the completion of a request on `q`: polls first
    /// ([`Inner::poll_until`]), then sleeps on the interrupt.
    ///
    /// # Cancel safety
    /// Cancel safe: the request's buffer stays with the queue; dropping the
    /// future turns interrupts back on if it was the last poller.
    pub(crate) async fn wait<T>(
        &self,
        q: &Queue,
        mut rx: oneshot::Receiver<T>,
    ) -> Result<T, Error> {
        let mut got = None;
        self.poll_until(q, || match rx.try_recv() {
            Ok(v) => {
                got = Some(v);
                Ok(true)
            }
            Err(oneshot::error::TryRecvError::Empty) => Ok(false),
            Err(oneshot::error::TryRecvError::Closed) => Err(self.failure()),
        })
        .await?;
        match got {
            Some(v) => Ok(v),
            None => rx.await.map_err(|_| self.failure()),
        }
    }

    /// Waits until every request of `burst` (on `q`) has completed: polls
    /// first ([`Inner::poll_until`]), then sleeps on the interrupt.
    ///
    /// # Cancel safety
    /// As for [`Inner::wait`].
    pub(crate) async fn wait_burst(&self, q: &Queue, burst: &Burst) -> Result<(), Error> {
        if self.poll_until(q, || burst.finished()).await? {
            return Ok(());
        }
        loop {
            let woken = burst.wake.notified();
            if burst.finished()? {
                return Ok(());
            }
            woken.await;
        }
    }

    /// Polls `q`'s used ring for completions (the device asked for no
    /// interrupts meanwhile) until `finished` says so — `Ok(true)` — or
    /// no completion has come for the poll budget (`Ok(false)`: the caller
    /// then sleeps on the interrupt, which is on again). It yields to the
    /// runtime once first (other tasks may have requests to add: the
    /// device then takes them in the same pass), then spins on the ring's
    /// index, yielding again only when nothing comes for a while: a yield
    /// costs a trip through the scheduler's I/O poll, a system call (2.9
    /// µs in the TCG guest against 8 ns for an atomic add), so it is not
    /// done once per look at the ring.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future turns interrupts back on if it was
    /// the last poller.
    async fn poll_until(
        &self,
        q: &Queue,
        mut finished: impl FnMut() -> Result<bool, Error>,
    ) -> Result<bool, Error> {
        /// Looks at the ring's index between yields.
        const SPINS: u32 = 512;
        let budget = std::time::Duration::from_nanos(self.poll_for.load(Ordering::Relaxed));
        if budget.is_zero() {
            // Interrupts only: the completion task drains.
            return finished();
        }
        self.drain(q);
        if finished()? {
            return Ok(true);
        }
        let _polling = Polling::start(self, q);
        // The clock is read once per round of spins that saw nothing, not
        // per completion.
        let mut quiet_since = std::time::Instant::now();
        let mut progress = false;
        tokio::task::yield_now().await;
        loop {
            let others = self.drain(q);
            if finished()? {
                return Ok(true);
            }
            if others > 0 {
                // Other callers' requests or bursts finished: let their
                // tasks run now, so that they send their next ones while the
                // device still works on ours (spinning on until ours are
                // done would let the queue run dry behind them).
                progress = true;
                tokio::task::yield_now().await;
                continue;
            }
            let mut spins = 0;
            while spins < SPINS && !self.has_used(q) {
                std::hint::spin_loop();
                spins += 1;
            }
            if spins < SPINS {
                progress = true;
                continue;
            }
            if std::mem::take(&mut progress) {
                quiet_since = std::time::Instant::now();
            } else if quiet_since.elapsed() > budget {
                // The guard's drop turns interrupts on and drains once more.
                return Ok(false);
            }
            tokio::task::yield_now().await;
        }
    }

    fn has_used(&self, q: &Queue) -> bool {
        q.lock().ring.has_used()
    }

    /// The virtio set-up again after the device lost its state (a power
    /// cycle through D3hot resets it): handshake, MSI-X, both queues from
    /// empty rings.
    fn reinit(&self) -> Result<(), Error> {
        let guard = self.hw.read().unwrap_or_else(|p| p.into_inner());
        let Some(hw) = guard.as_ref() else {
            return Err(Error::Gone);
        };
        hw.reset()?;
        hw.add_status(ACKNOWLEDGE | DRIVER)?;
        let offered = hw.device_features()?;
        hw.negotiate(wanted(offered))?;
        let indirect = wanted(offered) & F_INDIRECT_DESC != 0;
        hw.enable_msix(self.irq.as_fd())?;
        hw.set_config_vector(NO_VECTOR)?;
        for q in [&self.data, &self.ctrl] {
            let mut state = q.lock();
            if !state.pending.is_empty() {
                return Err(Error::Device(
                    "requests in flight across a power cycle".into(),
                ));
            }
            state.ring.reset()?;
            state
                .ring
                .set_indirect(indirect && std::ptr::eq(q, &self.data));
            let size = state.ring.size();
            hw.setup_queue(q.index, size, state.ring.addresses(), 0)?;
        }
        hw.add_status(DRIVER_OK)
    }

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

    /// Marks the device suspended if it holds no request and no session
    /// lives — under both queues' locks, where submitters check, so that
    /// no request is staged after it. `Ok(false)`: requests are still in
    /// flight (wait and try again).
    fn mark_suspended(&self) -> Result<bool, Error> {
        let data = self.data.lock();
        let ctrl = self.ctrl.lock();
        let live = self.sessions.load(Ordering::Acquire);
        if live > 0 {
            return Err(Error::Invalid {
                what: "suspend",
                detail: format!("{live} sessions live on the device"),
            });
        }
        self.accepting_or_suspended()?;
        if !(data.pending.is_empty() && ctrl.pending.is_empty()) {
            return Ok(false);
        }
        self.low_power.store(true, Ordering::Release);
        Ok(true)
    }

    /// The device marked suspended ([`Inner::mark_suspended`], with the
    /// power lock held since, so that no resume came between): resets its
    /// transport and enters D3hot — holding the hardware's write lock, so
    /// that a doorbell already on its way (under the read lock) is rung
    /// before and none after. If that fails the device is set up again
    /// and taken out of the suspended state.
    fn enter_low_power_locked(&self) -> Result<(), Error> {
        let entered = {
            let guard = self.hw.write().unwrap_or_else(|p| p.into_inner());
            match guard.as_ref() {
                Some(hw) => hw.reset().and_then(|()| hw.set_low_power(true)),
                None => Err(Error::Gone),
            }
        };
        let Err(e) = entered else {
            return Ok(());
        };
        // Still in D0 (whatever reset it had, it is set up again).
        match self.reinit() {
            Ok(()) => self.low_power.store(false, Ordering::Release),
            Err(again) => self.broken(
                &self.data,
                Error::Broken(format!(
                    "low-power entry failed ({e}) and the device did not come back: {again}"
                )),
                Vec::new(),
            ),
        }
        Err(e)
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

    /// Gives the device back to the kernel (it asked: hot-unplug): requests
    /// in flight fail, the device fd is closed and the BARs unmapped (the
    /// removal waits for that), and nothing reaches the device again.
    fn release(&self) {
        let held = self.data.in_flight() + self.ctrl.in_flight();
        self.released_with.store(held, Ordering::Release);
        self.fail_all();
        let hw = self.hw.write().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(hw) = hw {
            let _ = hw.disable_msix();
            drop(hw);
        }
        // Its IOMMU mappings went with it: the parked buffers are free.
        self.parked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        tracing::warn!(address = %self.address, held, "device removed; released");
    }

    /// No more requests; those in flight fail (their buffers parked until
    /// a reset).
    fn fail_all(&self) {
        self.gone.store(true, Ordering::Release);
        for q in [&self.data, &self.ctrl] {
            let failed = q.fail_all();
            self.parked
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend(failed);
        }
    }

    /// Submits `chain` (whose memory is all in `buf`) and waits for it on
    /// the interrupt (control requests are rare; no polling), within the
    /// control timeout.
    async fn submit(
        &self,
        q: &Queue,
        buf: DmaBuf,
        chain: &[Segment],
    ) -> Result<(DmaBuf, u32), Error> {
        let limit = std::time::Duration::from_nanos(self.control_timeout.load(Ordering::Relaxed));
        let request = async {
            let rx = q.enqueue_one(self, buf, Chain::new(chain)?, None).await?;
            rx.await.map_err(|_| self.failure())
        };
        tokio::time::timeout(limit, request)
            .await
            .unwrap_or(Err(Error::Timeout(limit)))
    }

    /// Submits a data request (its memory all in `buf`, its chain also
    /// written as an indirect table at `table`), waiting for room in the
    /// queue: [`Queue::enqueue_one`].
    ///
    /// # Cancel safety
    /// As for [`Queue::enqueue_one`].
    pub(crate) async fn enqueue_one(
        &self,
        buf: DmaBuf,
        chain: Chain,
        table: u64,
    ) -> Result<oneshot::Receiver<(DmaBuf, u32)>, Error> {
        self.data.enqueue_one(self, buf, chain, Some(table)).await
    }

    /// Submits the requests of `burst`: [`Queue::enqueue_burst`].
    ///
    /// # Cancel safety
    /// As for [`Queue::enqueue_burst`].
    pub(crate) async fn enqueue_burst(&self, burst: &Arc<Burst>) -> Result<(), Error> {
        self.data.enqueue_burst(self, burst).await
    }

    pub(crate) async fn create_session(
        &self,
        algo: CipherAlgo,
        key: &[u8],
        encrypt: bool,
    ) -> Result<u64, Error> {
        let input_at = (HEADER_LEN + key.len()).next_multiple_of(8);
        let buf = self.pool.alloc(input_at + SESSION_INPUT_LEN).await?;
        buf.write(0, &protocol::create_session(algo, key.len(), encrypt))?;
        buf.write(HEADER_LEN, key)?;
        // The device writes the status; start from "not written".
        buf.write(input_at + 8, &[0xff; 4])?;
        let chain = [
            buf.segment(0, HEADER_LEN, false),
            buf.segment(HEADER_LEN, key.len(), false),
            buf.segment(input_at, SESSION_INPUT_LEN, true),
        ];
        let (buf, _) = self.submit(&self.ctrl, buf, &chain).await?;
        let mut input = [0u8; SESSION_INPUT_LEN];
        buf.read(input_at, &mut input)?;
        let (id, status) = protocol::session_input(&input);
        match u8::try_from(status) {
            Ok(protocol::STATUS_OK) => Ok(id),
            Ok(status) => Err(Error::Status { status }),
            Err(_) => Err(Error::Device(format!("session status {status:#x}"))),
        }
    }

    pub(crate) async fn destroy_session(&self, algo: CipherAlgo, id: u64) -> Result<(), Error> {
        let buf = self.pool.alloc(HEADER_LEN + 8).await?;
        buf.write(0, &protocol::destroy_session(algo, id))?;
        buf.write_u8(HEADER_LEN, 0xff)?;
        let chain = [
            buf.segment(0, HEADER_LEN, false),
            buf.segment(HEADER_LEN, 1, true),
        ];
        let (buf, _) = self.submit(&self.ctrl, buf, &chain).await?;
        match buf.read_u8(HEADER_LEN)? {
            protocol::STATUS_OK => Ok(()),
            status => Err(Error::Status { status }),
        }
    }
}

/// A caller polling a queue: the device is asked for no interrupts while
/// any caller polls; the last one out turns them back on and drains the
/// ring (a completion may have come while they were off, with no
/// interrupt to announce it).
struct Polling<'a> {
    dev: &'a Inner,
    q: &'a Queue,
}

impl<'a> Polling<'a> {
    fn start(dev: &'a Inner, q: &'a Queue) -> Polling<'a> {
        let mut state = q.lock();
        state.pollers += 1;
        if state.pollers == 1 {
            let _ = state.ring.set_interrupts(false);
        }
        Polling { dev, q }
    }
}

impl Drop for Polling<'_> {
    fn drop(&mut self) {
        let mut state = self.q.lock();
        state.pollers -= 1;
        let last = state.pollers == 0;
        if last {
            let _ = state.ring.set_interrupts(true);
        }
        drop(state);
        if last {
            self.dev.drain(self.q);
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(task) = self.reaper.lock().unwrap_or_else(|p| p.into_inner()).take() {
            task.abort();
        }
        // Quiesce the device before its memory is released: reset through
        // the transport (and the function, where it can be). A device in
        // D3hot comes back first: its BARs are unmapped there, and touching
        // them would raise SIGBUS.
        if let Some(task) = self
            .watcher
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            task.abort();
        }
        let hw = self.hw.get_mut().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(hw) = hw {
            let awake = !self.low_power.load(Ordering::Acquire) || hw.set_low_power(false).is_ok();
            // Only with the function out of D3hot are its registers there.
            if awake {
                let _ = hw.reset();
            }
            let _ = hw.disable_msix();
            let _ = hw.reset_function();
        }
    }
}

/// The error for requests and register access while in D3hot.
fn suspended() -> Error {
    Error::Device("the device is suspended: resume it first".into())
}

impl Host for Inner {
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
#[path = "device_tests.rs"]
mod tests;
