//! A virtio-crypto device driven from userspace: open and handshake,
//! queues, the completion task, and cipher sessions.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use nix::sys::eventfd::{EfdFlags, EventFd};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::{Notify, oneshot};
use tracing::Instrument;
use zeroize::Zeroize;

use crate::dma::{DmaBuf, DmaPool};
use crate::error::{Error, Failed};
use crate::protocol::{self, CipherAlgo, DeviceConfig, HEADER_LEN, SESSION_INPUT_LEN};
use crate::transport::{
    ACKNOWLEDGE, DRIVER, DRIVER_OK, F_ACCESS_PLATFORM, F_VERSION_1, FAILED, NO_VECTOR, Transport,
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

/// Where a data request's parts sit in its DMA buffer.
const IV_AT: usize = 80;
const STATUS_AT: usize = 96;
const DATA_AT: usize = 128;

/// A request the device holds: its buffer (parked here, not in the
/// caller's future, so that a cancelled request never frees memory the
/// device may still write) and where to send it back.
struct Pending {
    buf: DmaBuf,
    done: oneshot::Sender<(DmaBuf, u32)>,
}

struct Queue {
    index: u16,
    notify_off: usize,
    state: Mutex<QueueState>,
    /// Descriptors were freed.
    room: Notify,
}

struct QueueState {
    ring: SplitQueue,
    pending: HashMap<u16, Pending>,
}

/// The device itself: its VFIO handle and its registers. Released (the
/// device fd closed, the BARs unmapped) when the kernel asks for the device
/// back (hot-unplug), so that its removal can finish.
struct Hw {
    vfio: Device,
    transport: Transport,
}

struct Inner {
    address: String,
    hw: std::sync::RwLock<Option<Hw>>,
    pool: Arc<DmaPool>,
    config: DeviceConfig,
    data: Queue,
    ctrl: Queue,
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
    sessions: std::sync::atomic::AtomicUsize,
    /// Interrupts handled, per thread (name or id): where completions ran.
    completion_threads: Mutex<HashMap<String, u64>>,
    /// Requests the device held when the kernel asked for it back.
    released_with: std::sync::atomic::AtomicUsize,
    /// The removal-request watcher.
    watcher: Mutex<Option<tokio::task::JoinHandle<()>>>,
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
                completion_threads: Mutex::new(HashMap::new()),
                released_with: std::sync::atomic::AtomicUsize::new(0),
                watcher: Mutex::new(None),
            });
            // SAFETY: the `EventFd` owns its descriptor, so it stays open for
            // as long as the `AsyncFd` that now owns the `EventFd` lives.
            let fd = unsafe { AsyncFd::register_with_interest(irq, Interest::READABLE) }.map_err(
                |e| Error::Io {
                    op: "AsyncFd::register",
                    source: std::io::Error::other(e.to_string()),
                },
            )?;
            let task = tokio::spawn(reap(Arc::downgrade(&inner), fd));
            *inner.reaper.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
            // SAFETY: as above, for the request eventfd.
            let req = unsafe { AsyncFd::register_with_interest(req, Interest::READABLE) }.map_err(
                |e| Error::Io {
                    op: "AsyncFd::register",
                    source: std::io::Error::other(e.to_string()),
                },
            )?;
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

    /// Interrupts handled so far, per thread that handled them (a tokio
    /// worker's name, or the thread's id): where this device's completions
    /// ran.
    pub fn completion_threads(&self) -> Vec<(String, u64)> {
        let map = self
            .inner
            .completion_threads
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let mut v: Vec<_> = map.iter().map(|(k, v)| (k.clone(), *v)).collect();
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
    // ACCESS_PLATFORM only if offered: the device then translates
    // through the IOMMU (which VFIO has set up either way).
    transport.negotiate(F_VERSION_1 | (offered & F_ACCESS_PLATFORM))?;
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
    let pool = Arc::new(DmaPool::new(vfio.container(), POOL_IOVA, POOL_BYTES)?);
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
    let data = queue(transport, &pool, 0)?;
    let ctrl = queue(transport, &pool, ctrl_index)?;
    transport.add_status(DRIVER_OK)?;
    Ok((config, pool, irq, data, ctrl))
}

/// Sets queue `index` up in the pool, on MSI-X vector 0.
fn queue(transport: &Transport, pool: &Arc<DmaPool>, index: u16) -> Result<Queue, Error> {
    let max = transport.queue_max_size(index)?;
    if max == 0 {
        return Err(Error::Device(format!("no queue {index}")));
    }
    // The largest power of two within both limits.
    let size = 1u16 << (15 - QUEUE_SIZE.min(max).leading_zeros().min(15));
    let mem = pool
        .try_alloc(SplitQueue::bytes(size))?
        .ok_or_else(|| Error::Device("no DMA room for a queue".into()))?;
    let ring = SplitQueue::new(mem, size)?;
    let notify_off = transport.setup_queue(index, size, ring.addresses(), 0)?;
    Ok(Queue {
        index,
        notify_off,
        state: Mutex::new(QueueState {
            ring,
            pending: HashMap::new(),
        }),
        room: Notify::new(),
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
        // Consume the count; spurious wake-ups read EAGAIN.
        let _ = ready.try_io(|fd| fd.get_ref().read().map_err(std::io::Error::from));
        let Some(inner) = inner.upgrade() else { return };
        let thread = std::thread::current();
        let name = format!("{} {:?}", thread.name().unwrap_or("thread"), thread.id());
        *inner
            .completion_threads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(name)
            .or_default() += 1;
        inner.drain(&inner.data);
        inner.drain(&inner.ctrl);
    }
}

impl Inner {
    /// Hands every completed request back to its caller.
    fn drain(&self, q: &Queue) {
        let mut freed = false;
        let mut state = q.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            match state.ring.pop_used() {
                Ok(Some((head, len))) => {
                    freed = true;
                    if let Some(p) = state.pending.remove(&head) {
                        // A caller that went away drops the buffer: free.
                        let _ = p.done.send((p.buf, len));
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::error!(%e, queue = q.index, "device broke its ring");
                    drop(state);
                    self.fail_all();
                    return;
                }
            }
        }
        drop(state);
        if freed {
            q.room.notify_waiters();
        }
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
        t.negotiate(F_VERSION_1 | (offered & F_ACCESS_PLATFORM))?;
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
            parked.extend(state.pending.drain().map(|(_, p)| p.buf));
            drop(state);
            q.room.notify_waiters();
        }
    }

    /// Submits `chain` (whose memory is all in `buf`) and waits for it.
    async fn submit(
        &self,
        q: &Queue,
        buf: DmaBuf,
        chain: &[Segment],
    ) -> Result<(DmaBuf, u32), Error> {
        self.enqueue(q, buf, chain)
            .await?
            .await
            .map_err(|_| Error::Gone)
    }

    /// Submits `chain` (whose memory is all in `buf`), waiting for room in
    /// the queue; the receiver gets `buf` back when the device completes.
    async fn enqueue(
        &self,
        q: &Queue,
        buf: DmaBuf,
        chain: &[Segment],
    ) -> Result<oneshot::Receiver<(DmaBuf, u32)>, Error> {
        let (tx, rx) = oneshot::channel();
        let mut buf = Some(buf);
        let mut tx = Some(tx);
        loop {
            let room = q.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            let notify = {
                let mut state = q.state.lock().unwrap_or_else(|p| p.into_inner());
                if self.gone.load(Ordering::Acquire) {
                    return Err(Error::Gone);
                }
                if self.low_power.load(Ordering::Acquire) {
                    return Err(Error::Device(
                        "the device is suspended: resume it first".into(),
                    ));
                }
                match state.ring.push(chain)? {
                    Some(head) => {
                        let (Some(buf), Some(done)) = (buf.take(), tx.take()) else {
                            return Err(Error::Device("request submitted twice".into()));
                        };
                        state.pending.insert(head, Pending { buf, done });
                        Some(state.ring.needs_notify()?)
                    }
                    None => None,
                }
            };
            match notify {
                Some(needed) => {
                    if needed {
                        self.with_hw(|hw| hw.transport.notify(q.notify_off, q.index))?;
                    }
                    break;
                }
                // Queue full: wait for completions (back-pressure).
                None => room.await,
            }
        }
        Ok(rx)
    }

    async fn create_session(
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
            Segment {
                iova: buf.iova(0),
                len: HEADER_LEN as u32,
                device_writes: false,
            },
            Segment {
                iova: buf.iova(HEADER_LEN),
                len: key.len() as u32,
                device_writes: false,
            },
            Segment {
                iova: buf.iova(input_at),
                len: SESSION_INPUT_LEN as u32,
                device_writes: true,
            },
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

    async fn destroy_session(&self, algo: CipherAlgo, id: u64) -> Result<(), Error> {
        let buf = self.pool.alloc(HEADER_LEN + 8).await?;
        buf.write(0, &protocol::destroy_session(algo, id))?;
        buf.write_u8(HEADER_LEN, 0xff)?;
        let chain = [
            Segment {
                iova: buf.iova(0),
                len: HEADER_LEN as u32,
                device_writes: false,
            },
            Segment {
                iova: buf.iova(HEADER_LEN),
                len: 1,
                device_writes: true,
            },
        ];
        let (buf, _) = self.submit(&self.ctrl, buf, &chain).await?;
        match buf.read_u8(HEADER_LEN)? {
            protocol::STATUS_OK => Ok(()),
            status => Err(Error::Status { status }),
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

/// A cipher session on the device: one device session for each direction,
/// destroyed when this is dropped.
pub struct CipherSession {
    dev: Arc<Inner>,
    algo: CipherAlgo,
    /// Encrypt and decrypt session ids.
    ids: [u64; 2],
    /// Destroyed already (by [`CipherSession::close`]).
    closed: bool,
}

impl std::fmt::Debug for CipherSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CipherSession")
            .field("device", &self.dev.address)
            .field("algo", &self.algo)
            .finish_non_exhaustive()
    }
}

impl CipherSession {
    /// Destroys the device sessions now and waits for it (dropping a
    /// session destroys them in the background).
    ///
    /// # Errors
    /// The device's refusal (the sessions are gone from this side anyway).
    ///
    /// # Cancel safety
    /// A dropped future may leave a device session alive until the device
    /// is reset.
    pub async fn close(mut self) -> Result<(), Error> {
        self.closed = true;
        let mut result = Ok(());
        for id in self.ids {
            if let Err(e) = self.dev.destroy_session(self.algo, id).await {
                result = Err(e);
            }
        }
        result
    }

    /// Its mode.
    pub fn algo(&self) -> CipherAlgo {
        self.algo
    }

    /// Encrypts `buf` with `iv` (the XTS tweak; empty for ECB); the result
    /// comes back in the same buffer.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a wrong IV length or a length the mode cannot
    /// take (ECB, CBC and XTS: whole blocks — the device has no ciphertext
    /// stealing), [`Error::Status`]
    /// if the device refuses, [`Error::Gone`] if it was reset or removed;
    /// the buffer comes back unchanged with any error.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped request's DMA memory stays with the driver
    /// until the device completes it (or is reset); the caller's buffer is
    /// only read before the first await and written after the last.
    pub async fn encrypt(&self, iv: &[u8], buf: Vec<u8>) -> Result<Vec<u8>, Failed> {
        self.crypt(true, iv, buf).await
    }

    /// Decrypts `buf`: as [`CipherSession::encrypt`].
    ///
    /// # Errors
    /// As for [`CipherSession::encrypt`].
    ///
    /// # Cancel safety
    /// As for [`CipherSession::encrypt`].
    pub async fn decrypt(&self, iv: &[u8], buf: Vec<u8>) -> Result<Vec<u8>, Failed> {
        self.crypt(false, iv, buf).await
    }

    fn check(&self, iv: &[u8], len: usize) -> Result<(), Error> {
        if iv.len() != self.algo.iv_len() {
            return Err(Error::Invalid {
                what: "IV length",
                detail: format!(
                    "{} bytes, {:?} takes {}",
                    iv.len(),
                    self.algo,
                    self.algo.iv_len()
                ),
            });
        }
        let ok = match self.algo {
            // XTS too: QEMU's builtin backend has no ciphertext stealing
            // ("Length 20 must be a multiple of block size 16").
            CipherAlgo::AesEcb | CipherAlgo::AesCbc | CipherAlgo::AesXts => len.is_multiple_of(16),
            CipherAlgo::AesCtr => true,
        };
        if !ok {
            return Err(Error::Invalid {
                what: "length",
                detail: format!("{len} bytes for {:?}", self.algo),
            });
        }
        // XTS: one tweak, one request; other modes are chained.
        let max = self.max_request();
        if self.algo == CipherAlgo::AesXts && len > max {
            return Err(Error::TooLarge { len, max });
        }
        Ok(())
    }

    /// Encrypts or decrypts `buf` as consecutive XTS data units of
    /// `unit_len` bytes, unit `i` with tweak `first_tweak + i` (a 128-bit
    /// little-endian counter, wrapping), all units in flight at once. Other
    /// modes, or one unit, are one request.
    ///
    /// # Errors
    /// As for [`CipherSession::encrypt`]; [`Error::Invalid`] for units
    /// shorter than a block or not dividing the buffer.
    ///
    /// # Cancel safety
    /// As for [`CipherSession::encrypt`].
    pub async fn crypt_units(
        &self,
        encrypt: bool,
        first_tweak: &[u8; 16],
        unit_len: usize,
        buf: Vec<u8>,
    ) -> Result<Vec<u8>, Failed> {
        if self.algo != CipherAlgo::AesXts || unit_len == buf.len() {
            return self.crypt(encrypt, first_tweak, buf).await;
        }
        if unit_len < 16 || !buf.len().is_multiple_of(unit_len) {
            let error = Error::Invalid {
                what: "data unit",
                detail: format!("{unit_len}-byte units in {} bytes", buf.len()),
            };
            return Err(Failed { error, buf });
        }
        if let Err(error) = self.check(first_tweak, unit_len) {
            return Err(Failed { error, buf });
        }
        let first = u128::from_le_bytes(*first_tweak);
        let r = async {
            let mut started = Vec::with_capacity(buf.len() / unit_len);
            for (i, unit) in buf.chunks(unit_len).enumerate() {
                let tweak = first.wrapping_add(i as u128).to_le_bytes();
                started.push(self.start(encrypt, &tweak, unit).await?);
            }
            let mut done = Vec::with_capacity(started.len());
            for rx in started {
                done.push(self.finish(rx).await?);
            }
            Ok::<_, Error>(done)
        }
        .await;
        let mut buf = buf;
        match r.and_then(|done| {
            let mut out = vec![0u8; buf.len()];
            for (dma, piece) in done.iter().zip(out.chunks_mut(unit_len)) {
                dma.read(DATA_AT + unit_len.next_multiple_of(16), piece)?;
            }
            Ok(out)
        }) {
            Ok(mut out) => {
                std::mem::swap(&mut buf, &mut out);
                out.zeroize();
                Ok(buf)
            }
            Err(error) => Err(Failed { error, buf }),
        }
    }

    async fn crypt(&self, encrypt: bool, iv: &[u8], buf: Vec<u8>) -> Result<Vec<u8>, Failed> {
        if let Err(error) = self.check(iv, buf.len()) {
            return Err(Failed { error, buf });
        }
        if buf.is_empty() {
            return Ok(buf);
        }
        let span = tracing::trace_span!("vfio.cipher", algo = ?self.algo, encrypt, len = buf.len());
        if buf.len() <= self.max_request() {
            // One request (the usual case): the result goes straight into
            // the caller's buffer once the device has succeeded — no second
            // buffer to allocate, fill and wipe.
            let mut buf = buf;
            let r = async {
                let rx = self.start(encrypt, iv, &buf).await?;
                self.finish(rx).await
            }
            .instrument(span)
            .await
            .and_then(|dma| dma.read(DATA_AT + buf.len().next_multiple_of(16), &mut buf));
            return match r {
                Ok(()) => Ok(buf),
                Err(error) => Err(Failed { error, buf }),
            };
        }
        match self.chained(encrypt, iv, &buf).instrument(span).await {
            Ok(mut out) => {
                let mut buf = buf;
                std::mem::swap(&mut buf, &mut out);
                out.zeroize();
                Ok(buf)
            }
            Err(error) => Err(Failed { error, buf }),
        }
    }

    /// `data` in requests of at most [`MAX_REQUEST`] bytes, the IV chained
    /// (CBC: the last ciphertext block; CTR: the counter advanced), into a
    /// fresh buffer.
    async fn chained(&self, encrypt: bool, iv: &[u8], data: &[u8]) -> Result<Vec<u8>, Error> {
        let mut out = vec![0u8; data.len()];
        let mut iv = iv.to_vec();
        for (piece, dest) in data
            .chunks(self.max_request())
            .zip(out.chunks_mut(self.max_request()))
        {
            let rx = self.start(encrypt, &iv, piece).await?;
            let dma = self.finish(rx).await?;
            dma.read(DATA_AT + piece.len().next_multiple_of(16), dest)?;
            match self.algo {
                CipherAlgo::AesCbc if encrypt => iv.copy_from_slice(&dest[dest.len() - 16..]),
                CipherAlgo::AesCbc => iv.copy_from_slice(&piece[piece.len() - 16..]),
                CipherAlgo::AesCtr => {
                    let n = u128::from_be_bytes(iv[..16].try_into().unwrap_or_default());
                    let blocks = piece.len().div_ceil(16) as u128;
                    iv.copy_from_slice(&n.wrapping_add(blocks).to_be_bytes());
                }
                _ => {}
            }
        }
        Ok(out)
    }

    /// The most one request carries: XTS takes one tweak per request, so
    /// its whole length; other modes are chained in pieces of this size.
    fn max_request(&self) -> usize {
        MAX_REQUEST.min(usize::try_from(self.dev.config.max_size).unwrap_or(usize::MAX))
    }

    /// Sends one request, waiting only for room in the queue.
    async fn start(
        &self,
        encrypt: bool,
        iv: &[u8],
        data: &[u8],
    ) -> Result<oneshot::Receiver<(DmaBuf, u32)>, Error> {
        // QEMU's builtin backend refuses a CTR request that ends in a
        // partial block (status ERR, measured); CTR being a stream, the
        // input padded to whole blocks gives the same first `len` bytes.
        let len = match self.algo {
            CipherAlgo::AesCtr => data.len().next_multiple_of(16),
            _ => data.len(),
        };
        let out_at = DATA_AT + len.next_multiple_of(16);
        let dma = self.dev.pool.alloc(out_at + len).await?;
        let id = self.ids[usize::from(!encrypt)];
        dma.write(0, &protocol::cipher_request(self.algo, id, encrypt, len))?;
        dma.write(IV_AT, iv)?;
        dma.write_u8(STATUS_AT, 0xff)?;
        dma.write(DATA_AT, data)?;
        dma.write(DATA_AT + data.len(), &[0u8; 16][..len - data.len()])?;
        let mut chain = Vec::with_capacity(5);
        chain.push(Segment {
            iova: dma.iova(0),
            len: HEADER_LEN as u32,
            device_writes: false,
        });
        if !iv.is_empty() {
            chain.push(Segment {
                iova: dma.iova(IV_AT),
                len: iv.len() as u32,
                device_writes: false,
            });
        }
        chain.push(Segment {
            iova: dma.iova(DATA_AT),
            len: len as u32,
            device_writes: false,
        });
        chain.push(Segment {
            iova: dma.iova(out_at),
            len: len as u32,
            device_writes: true,
        });
        chain.push(Segment {
            iova: dma.iova(STATUS_AT),
            len: 1,
            device_writes: true,
        });
        self.dev.enqueue(&self.dev.data, dma, &chain).await
    }

    /// Waits for a started request; its DMA buffer if the device succeeded.
    async fn finish(&self, rx: oneshot::Receiver<(DmaBuf, u32)>) -> Result<DmaBuf, Error> {
        let (dma, _) = rx.await.map_err(|_| Error::Gone)?;
        match dma.read_u8(STATUS_AT)? {
            protocol::STATUS_OK => Ok(dma),
            status => Err(Error::Status { status }),
        }
    }
}

impl Drop for CipherSession {
    fn drop(&mut self) {
        self.dev.sessions.fetch_sub(1, Ordering::AcqRel);
        if self.closed {
            return;
        }
        // Destroying takes a round trip to the device: on the runtime if
        // there is one; otherwise the sessions live until the device resets.
        let (dev, algo, ids) = (self.dev.clone(), self.algo, self.ids);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                for id in ids {
                    let _ = dev.destroy_session(algo, id).await;
                }
            });
        }
        self.ids.zeroize();
    }
}
