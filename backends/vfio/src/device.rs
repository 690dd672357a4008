//! A virtio-crypto device driven from userspace: open and handshake, the
//! completion task, submission and the adaptive poll/interrupt wait, power
//! and failure handling.

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use nix::sys::eventfd::{EfdFlags, EventFd};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::{Notify, oneshot};
use tracing::Instrument;

use crate::dma::{DmaBuf, DmaPool};
use crate::error::Error;
use crate::protocol::{self, CipherAlgo, DeviceConfig, HEADER_LEN, SESSION_INPUT_LEN};
use crate::queue::{Burst, Pending, Pendings, Queue, QueueState};
use crate::request::{Chain, TABLE_AT};
use crate::session::CipherSession;
use crate::transport::{
    ACKNOWLEDGE, DRIVER, DRIVER_OK, F_ACCESS_PLATFORM, F_INDIRECT_DESC, F_VERSION_1, FAILED,
    NO_VECTOR, Transport, wanted,
};
use crate::vfio::Device;
use crate::virtqueue::{Segment, SplitQueue};

/// The DMA pool's size: queues, and room for many requests in flight.
pub const POOL_BYTES: usize = 4 << 20;
/// Where the pool sits in the device's address space (inside the IOVA
/// ranges the guest's IOMMU offers, clear of the MSI window at 0xfee00000).
const POOL_IOVA: u64 = 0x4000_0000;
/// Entries per queue, at most (the device may offer fewer).
const QUEUE_SIZE: u16 = 1024;
/// The largest request this driver sends whole (XTS units up to this;
/// longer CBC, CTR and ECB requests go in pieces of it, chained).
pub const MAX_REQUEST: usize = 256 << 10;

/// How long a waiting caller polls the used ring without seeing any
/// completion before it turns the device's interrupts back on and sleeps
/// (the default; [`CryptoDevice::set_poll_for`]). Polling while the device completes requests skips the interrupt, the
/// eventfd and a thread wake-up per batch; with no progress for this long
/// the device is idle or slow, and sleeping burns no core.
pub const POLL_FOR: std::time::Duration = std::time::Duration::from_micros(100);

/// The device itself: its VFIO handle and its registers. Released (the
/// device fd closed, the BARs unmapped) when the kernel asks for the device
/// back (hot-unplug), so that its removal can finish.
struct Hw {
    vfio: Device,
    transport: Transport,
}

pub(crate) struct Inner {
    pub(crate) address: String,
    hw: std::sync::RwLock<Option<Hw>>,
    pub(crate) pool: Arc<DmaPool>,
    pub(crate) config: DeviceConfig,
    pub(crate) data: Queue,
    pub(crate) ctrl: Queue,
    /// Reset or removed: no new requests; what was in flight has failed.
    gone: AtomicBool,
    /// Buffers of requests failed while the device might still write them,
    /// kept until the device is reset.
    parked: Mutex<Vec<DmaBuf>>,
    /// The completion task.
    reaper: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The interrupt eventfd (a duplicate of the one the completion task
    /// waits on), to bind MSI-X again after a power cycle.
    irq: std::os::fd::OwnedFd,
    /// In the PCI low-power state (D3hot): the device lost its virtio
    /// state and takes no requests until resumed.
    low_power: AtomicBool,
    /// Cipher sessions alive on the device.
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
    /// Outside a tokio runtime.
    ///
    /// # Cancel safety
    /// Cancel safe: the device is set up synchronously before the first
    /// await point; dropping the future drops the half-open device, which
    /// resets it.
    pub async fn open(address: &str) -> Result<CryptoDevice, Error> {
        let span = tracing::debug_span!("vfio.open", address);
        async {
            let vfio = Device::open(address)?;
            vfio.enable_bus_master()?;
            let transport = Transport::new(&vfio)?;
            transport.reset()?;
            transport.add_status(ACKNOWLEDGE | DRIVER)?;
            // Whatever fails from here, the device is told (virtio §3.1.1).
            let (config, pool, irq, data, ctrl) = set_up(&vfio, &transport).inspect_err(|_| {
                let _ = transport.add_status(FAILED);
            })?;
            // The kernel's request for the device back (hot-unplug).
            let req = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
                .map_err(|e| Error::sys("eventfd", e))?;
            vfio.enable_req_irq(req.as_fd())?;
            let irq_dup = irq
                .as_fd()
                .try_clone_to_owned()
                .map_err(|source| Error::Io {
                    op: "dup eventfd",
                    source,
                })?;
            let inner = Arc::new(Inner {
                address: address.to_owned(),
                hw: std::sync::RwLock::new(Some(Hw { vfio, transport })),
                pool,
                config,
                data,
                ctrl,
                gone: AtomicBool::new(false),
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
            });
            let fd = readable(irq)?;
            let task = tokio::spawn(reap(Arc::downgrade(&inner), fd));
            *inner.reaper.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
            let req = readable(req)?;
            let watcher = tokio::spawn(watch_removal(Arc::downgrade(&inner), req));
            *inner.watcher.lock().unwrap_or_else(|p| p.into_inner()) = Some(watcher);
            tracing::debug!(?config, "virtio-crypto device up");
            Ok(CryptoDevice { inner })
        }
        .instrument(span)
        .await
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
        [&self.inner.data, &self.inner.ctrl]
            .iter()
            .map(|q| {
                q.state
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .pending
                    .len()
            })
            .sum()
    }

    /// The device status and each queue's indices, for diagnosing a device
    /// that stopped answering.
    pub fn diagnose(&self) -> String {
        if self.is_suspended() {
            // Its registers are out of reach in D3hot.
            return "suspended (D3hot)".into();
        }
        let status = self
            .inner
            .with_hw(|hw| hw.transport.status())
            .map_or_else(|e| e.to_string(), |s| format!("{s:#x}"));
        let mut out = format!("status {status}");
        for (name, q) in [("data", &self.inner.data), ("ctrl", &self.inner.ctrl)] {
            let state = q.state.lock().unwrap_or_else(|p| p.into_inner());
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

    /// Resets the device (`VFIO_DEVICE_RESET`): every request in flight
    /// fails with [`Error::Gone`] (its caller's buffer unchanged), and the
    /// device takes no more.
    pub fn reset(&self) -> Result<(), Error> {
        self.inner.fail_all();
        let r = self.inner.with_hw(|hw| hw.vfio.reset());
        // Quiet now: what the device could have written is free again.
        self.inner
            .parked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        r
    }

    /// Puts the device in the PCI low-power state (D3hot, through
    /// `VFIO_DEVICE_FEATURE` LOW_POWER_ENTRY), after the requests still in
    /// flight (a dropped session's destroy) complete. The device loses its
    /// virtio state: it takes no requests until [`CryptoDevice::resume`].
    ///
    /// # Errors
    /// [`Error::Invalid`] while sessions live (their device sessions would
    /// be lost); [`Error::Device`] if requests stay in flight for a second;
    /// the ioctl's error.
    ///
    /// # Cancel safety
    /// Cancel safe until the device is reset (the last step, synchronous).
    pub async fn suspend(&self) -> Result<(), Error> {
        let inner = &self.inner;
        if inner.low_power.load(Ordering::Acquire) {
            return Ok(());
        }
        let live = inner.sessions.load(Ordering::Acquire);
        if live > 0 {
            return Err(Error::Invalid {
                what: "suspend",
                detail: format!("{live} sessions live on the device"),
            });
        }
        let start = std::time::Instant::now();
        while self.in_flight() > 0 {
            if start.elapsed() > std::time::Duration::from_secs(1) {
                return Err(Error::Device("requests still in flight after 1 s".into()));
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        inner.low_power.store(true, Ordering::Release);
        inner.with_hw(|hw| {
            hw.transport.reset()?;
            hw.vfio.set_low_power(true)
        })
    }

    /// Brings the device back from [`CryptoDevice::suspend`] (LOW_POWER_EXIT)
    /// and sets it up again: the virtio handshake, MSI-X and both queues.
    /// A no-op on a device that is not suspended.
    ///
    /// # Errors
    /// The ioctl's error, or the device's refusal during set-up.
    pub fn resume(&self) -> Result<(), Error> {
        let inner = &self.inner;
        if !inner.low_power.load(Ordering::Acquire) {
            return Ok(());
        }
        inner.with_hw(|hw| hw.vfio.set_low_power(false))?;
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
        let encrypt = self.inner.create_session(algo, key, true).await?;
        let decrypt = match self.inner.create_session(algo, key, false).await {
            Ok(id) => id,
            Err(e) => {
                let _ = self.inner.destroy_session(algo, encrypt).await;
                return Err(e);
            }
        };
        self.inner.sessions.fetch_add(1, Ordering::AcqRel);
        Ok(CipherSession {
            dev: self.inner.clone(),
            algo,
            ids: [encrypt, decrypt],
            closed: false,
        })
    }
}

/// Features, device configuration, the DMA pool, MSI-X and both queues;
/// then DRIVER_OK.
#[allow(clippy::type_complexity)]
fn set_up(
    vfio: &Device,
    transport: &Transport,
) -> Result<(DeviceConfig, Arc<DmaPool>, EventFd, Queue, Queue), Error> {
    let offered = transport.device_features()?;
    if offered & F_VERSION_1 == 0 {
        return Err(Error::Device(
            "no VIRTIO_F_VERSION_1 (a legacy-only device)".into(),
        ));
    }
    // With ACCESS_PLATFORM the device's DMA goes through the IOMMU, at
    // the IOVAs VFIO maps; without it, the device takes guest-physical
    // addresses (QEMU's iommu_platform=off) and the pool must give those.
    let translated = offered & F_ACCESS_PLATFORM != 0;
    transport.negotiate(wanted(offered))?;
    let config = transport.read_device_config(|w| {
        Ok(DeviceConfig {
            status: w(DeviceConfig::STATUS)?,
            max_dataqueues: w(DeviceConfig::MAX_DATAQUEUES)?,
            crypto_services: w(DeviceConfig::CRYPTO_SERVICES)?,
            cipher_algo_l: w(DeviceConfig::CIPHER_ALGO_L)?,
            max_cipher_key_len: w(DeviceConfig::MAX_CIPHER_KEY_LEN)?,
            max_size: u64::from(w(DeviceConfig::MAX_SIZE)?)
                | (u64::from(w(DeviceConfig::MAX_SIZE + 4)?) << 32),
        })
    })?;
    if config.max_dataqueues == 0 {
        return Err(Error::Device("no data queues".into()));
    }
    let pool = Arc::new(if translated {
        DmaPool::new(vfio.container(), POOL_IOVA, POOL_BYTES)?
    } else {
        DmaPool::physical(vfio.container()).map_err(|e| {
            Error::Device(format!(
                "no VIRTIO_F_ACCESS_PLATFORM: the device bypasses the IOMMU and needs \
                 guest-physical addresses, from a huge page: {e}"
            ))
        })?
    });
    let irq = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
        .map_err(|e| Error::sys("eventfd", e))?;
    if vfio.msix_vectors()? == 0 {
        return Err(Error::Device("no MSI-X".into()));
    }
    vfio.enable_msix(&[irq.as_fd()])?;
    transport.set_config_vector(NO_VECTOR)?;
    // Queues 0..max_dataqueues carry data; the control queue is next.
    let ctrl_index = u16::try_from(config.max_dataqueues)
        .map_err(|_| Error::Device("too many data queues".into()))?;
    // Data requests go through indirect tables when the device takes them;
    // control requests (rare) as plain chains.
    let data = queue(transport, &pool, 0, wanted(offered) & F_INDIRECT_DESC != 0)?;
    let ctrl = queue(transport, &pool, ctrl_index, false)?;
    transport.add_status(DRIVER_OK)?;
    Ok((config, pool, irq, data, ctrl))
}

/// Sets queue `index` up in the pool, on MSI-X vector 0.
fn queue(
    transport: &Transport,
    pool: &Arc<DmaPool>,
    index: u16,
    indirect: bool,
) -> Result<Queue, Error> {
    let max = transport.queue_max_size(index)?;
    if max == 0 {
        return Err(Error::Device(format!("no queue {index}")));
    }
    // The largest power of two within both limits.
    let size = 1u16 << (15 - QUEUE_SIZE.min(max).leading_zeros().min(15));
    let mem = pool
        .try_alloc(SplitQueue::bytes(size))?
        .ok_or_else(|| Error::Device("no DMA room for a queue".into()))?;
    let mut ring = SplitQueue::new(mem, size)?;
    ring.set_indirect(indirect);
    let notify_off = transport.setup_queue(index, size, ring.addresses(), 0)?;
    Ok(Queue {
        index,
        notify_off,
        state: Mutex::new(QueueState {
            ring,
            pending: Pendings::new(size),
            pollers: 0,
        }),
        room: Notify::new(),
        room_waiters: std::sync::atomic::AtomicUsize::new(0),
    })
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
    /// Hands every completed request back to its caller; how many callers
    /// that finished (whose tasks may now go on).
    fn drain(&self, q: &Queue) -> u64 {
        let mut state = q.state.lock().unwrap_or_else(|p| p.into_inner());
        let mut freed = 0u64;
        let mut finished = 0u64;
        loop {
            match state.ring.pop_used() {
                Ok(Some((head, len))) => {
                    freed += 1;
                    if let Some(p) = state.pending.remove(head) {
                        finished += u64::from(p.complete(len));
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::error!(%e, queue = q.index, "device broke its ring");
                    drop(state);
                    self.fail_all();
                    return finished;
                }
            }
        }
        drop(state);
        if freed > 0 {
            if q.room_waiters.load(Ordering::Acquire) > 0 {
                q.room.notify_waiters();
            }
            self.count_completions(freed);
        }
        finished
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
            Err(oneshot::error::TryRecvError::Closed) => Err(Error::Gone),
        })
        .await?;
        match got {
            Some(v) => Ok(v),
            None => rx.await.map_err(|_| Error::Gone),
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
        q.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .ring
            .has_used()
    }

    /// The virtio set-up again after the device lost its state (a power
    /// cycle through D3hot resets it): handshake, MSI-X, both queues from
    /// empty rings.
    fn reinit(&self) -> Result<(), Error> {
        let guard = self.hw.read().unwrap_or_else(|p| p.into_inner());
        let Some(hw) = guard.as_ref() else {
            return Err(Error::Gone);
        };
        let t = &hw.transport;
        t.reset()?;
        t.add_status(ACKNOWLEDGE | DRIVER)?;
        let offered = t.device_features()?;
        t.negotiate(wanted(offered))?;
        let indirect = wanted(offered) & F_INDIRECT_DESC != 0;
        hw.vfio.enable_msix(&[self.irq.as_fd()])?;
        t.set_config_vector(NO_VECTOR)?;
        for q in [&self.data, &self.ctrl] {
            let mut state = q.state.lock().unwrap_or_else(|p| p.into_inner());
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
            t.setup_queue(q.index, size, state.ring.addresses(), 0)?;
        }
        t.add_status(DRIVER_OK)
    }

    /// Runs `f` on the device, if it has not been released.
    fn with_hw<T>(&self, f: impl FnOnce(&Hw) -> Result<T, Error>) -> Result<T, Error> {
        let guard = self.hw.read().unwrap_or_else(|p| p.into_inner());
        match guard.as_ref() {
            Some(hw) => f(hw),
            None => Err(Error::Gone),
        }
    }

    /// Gives the device back to the kernel (it asked: hot-unplug): requests
    /// in flight fail, the device fd is closed and the BARs unmapped (the
    /// removal waits for that), and nothing reaches the device again.
    fn release(&self) {
        let held: usize = [&self.data, &self.ctrl]
            .iter()
            .map(|q| {
                q.state
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .pending
                    .len()
            })
            .sum();
        self.released_with.store(held, Ordering::Release);
        self.fail_all();
        let hw = self.hw.write().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(hw) = hw {
            let _ = hw.vfio.disable_msix();
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
            let mut state = q.state.lock().unwrap_or_else(|p| p.into_inner());
            let mut parked = self.parked.lock().unwrap_or_else(|p| p.into_inner());
            // Dropping the sender fails the waiting caller.
            parked.extend(state.pending.drain().flat_map(Pending::fail));
            drop(state);
            q.room.notify_waiters();
        }
    }

    /// Submits `chain` (whose memory is all in `buf`) and waits for it on
    /// the interrupt (control requests are rare; no polling).
    async fn submit(
        &self,
        q: &Queue,
        buf: DmaBuf,
        chain: &[Segment],
    ) -> Result<(DmaBuf, u32), Error> {
        self.enqueue_one(q, buf, Chain::new(chain)?, None)
            .await?
            .await
            .map_err(|_| Error::Gone)
    }

    /// Submits one chain (whose memory is all in `buf`; with `table`, the
    /// offset in `buf` where [`Layout::write_chain`] wrote it as an
    /// indirect table), waiting for room in the queue (back-pressure); the
    /// receiver gets `buf` back when the device completes it.
    ///
    /// [`Layout::write_chain`]: crate::request::Layout::write_chain
    ///
    /// # Cancel safety
    /// Cancel safe: the request is either queued (its buffer held by the
    /// queue until completion) or dropped unsent.
    pub(crate) async fn enqueue_one(
        &self,
        q: &Queue,
        buf: DmaBuf,
        chain: Chain,
        table: Option<usize>,
    ) -> Result<oneshot::Receiver<(DmaBuf, u32)>, Error> {
        let (tx, rx) = oneshot::channel();
        let table = table.map(|at| buf.iova(at));
        let mut one = Some(Pending::One { buf, tx });
        self.enqueue_with(q, 1, |state, _| {
            let staged = match table {
                Some(table) => state.ring.stage_request(chain.segments(), table),
                None => state.ring.stage(chain.segments()),
            };
            match (staged, one.take()) {
                (Ok(Some(head)), Some(p)) => {
                    state.pending.insert(head, p);
                    (1, Ok(()))
                }
                (Err(e), _) => (0, Err(e)),
                _ => (0, Ok(())),
            }
        })
        .await?;
        Ok(rx)
    }

    /// Submits the requests of `burst` (prepared with their indirect
    /// tables), as many as the queue takes under one lock and with one
    /// notification, waiting for room for the rest.
    ///
    /// # Cancel safety
    /// As for [`Inner::enqueue_one`]: whatever was queued is held by the
    /// queue (through the burst) until it completes.
    pub(crate) async fn enqueue_burst(&self, q: &Queue, burst: &Arc<Burst>) -> Result<(), Error> {
        self.enqueue_with(q, burst.len, |state, mut next| {
            // The burst's lock once per pass, not per request.
            burst.with_requests(|requests| {
                for r in &requests[next.min(requests.len())..] {
                    match state
                        .ring
                        .stage_request(r.chain.segments(), r.dma.iova(TABLE_AT))
                    {
                        Ok(Some(head)) => {
                            state.pending.insert(head, Pending::Burst(burst.clone()));
                            next += 1;
                        }
                        Ok(None) => break,
                        Err(e) => return (next, Err(e)),
                    }
                }
                (next, Ok(()))
            })
        })
        .await
    }

    /// Submits `n` requests: `stage(state, next)` writes requests from
    /// `next` on into the ring, with what the queue holds for each until it
    /// completes, as many as fit; it returns where it stopped (and an error
    /// that stopped it). Those go to the device with one index write and
    /// one notification; then this waits for room for the rest
    /// (back-pressure).
    ///
    /// # Cancel safety
    /// Cancel safe: a request is either queued (its memory held by the
    /// queue until completion) or dropped unsent.
    async fn enqueue_with(
        &self,
        q: &Queue,
        n: usize,
        mut stage: impl FnMut(&mut QueueState, usize) -> (usize, Result<(), Error>),
    ) -> Result<(), Error> {
        let mut next = 0;
        while next < n {
            let room = q.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            // Counted before the ring is looked at under its lock, so that
            // a drain that frees descriptors after that look sees it.
            let _waiting = RoomWaiter::new(q);
            let (notify, full) = {
                let mut state = q.state.lock().unwrap_or_else(|p| p.into_inner());
                if self.gone.load(Ordering::Acquire) {
                    return Err(Error::Gone);
                }
                if self.low_power.load(Ordering::Acquire) {
                    return Err(Error::Device(
                        "the device is suspended: resume it first".into(),
                    ));
                }
                let (done, staged) = stage(&mut state, next);
                let pushed = done > next;
                next = done;
                // What was staged goes out even if a later request failed:
                // its memory is the queue's now and comes back on completion.
                if pushed {
                    state.ring.publish()?;
                }
                staged?;
                let full = (next < n).then(|| state.ring.free_descriptors());
                (pushed && state.ring.needs_notify()?, full)
            };
            if notify {
                self.with_hw(|hw| hw.transport.notify(q.notify_off, q.index))?;
            }
            if let Some(free) = full {
                // Queue full: completions free descriptors. Look at the
                // ring first (interrupts may be off for pollers), then wait.
                self.drain(q);
                if q.state
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .ring
                    .free_descriptors()
                    <= free
                {
                    room.await;
                }
            }
        }
        Ok(())
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

/// A submitter that may wait for room in a queue, counted so that drains
/// wake waiters only when there are any.
struct RoomWaiter<'a>(&'a Queue);

impl<'a> RoomWaiter<'a> {
    fn new(q: &'a Queue) -> RoomWaiter<'a> {
        q.room_waiters.fetch_add(1, Ordering::AcqRel);
        RoomWaiter(q)
    }
}

impl Drop for RoomWaiter<'_> {
    fn drop(&mut self) {
        self.0.room_waiters.fetch_sub(1, Ordering::AcqRel);
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
        let mut state = q.state.lock().unwrap_or_else(|p| p.into_inner());
        state.pollers += 1;
        if state.pollers == 1 {
            let _ = state.ring.set_interrupts(false);
        }
        Polling { dev, q }
    }
}

impl Drop for Polling<'_> {
    fn drop(&mut self) {
        let mut state = self.q.state.lock().unwrap_or_else(|p| p.into_inner());
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
            if self.low_power.load(Ordering::Acquire) {
                let _ = hw.vfio.set_low_power(false);
            }
            let _ = hw.transport.reset();
            let _ = hw.vfio.disable_msix();
            let _ = hw.vfio.reset();
        }
    }
}
