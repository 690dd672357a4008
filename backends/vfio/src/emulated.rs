//! An emulated virtio-crypto device behind the [`Platform`] trait, for the
//! driver's host tests: a thread that plays the device over plain memory
//! (the DMA pool, by device address), computing with the fallback crate,
//! with faults to inject — a device that hangs, completes requests in its
//! own order, writes nonsense into its used ring, refuses to reset or to
//! enter low power, reports a bad configuration — and a record of every
//! register access made while it is in D3hot (a SIGBUS on real hardware).

use std::collections::HashMap;
use std::io::Write;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crypto_offload_fallback as fb;

use crate::device_ring::{Desc, DeviceRing};
use crate::dma::DmaPool;
use crate::error::Error;
use crate::platform::Platform;
use crate::protocol::{self, DeviceConfig};
use crate::transport::{F_ACCESS_PLATFORM, F_INDIRECT_DESC, F_VERSION_1};

/// What the emulated device is and does wrong.
#[derive(Debug, Clone)]
pub(crate) struct Setup {
    pub(crate) config: DeviceConfig,
    pub(crate) features: u64,
    /// The largest size each queue takes (data, control).
    pub(crate) queue_max: [u16; 2],
    pub(crate) pool_bytes: usize,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            config: DeviceConfig {
                status: 1,
                max_dataqueues: 1,
                crypto_services: 1,
                cipher_algo_l: (1 << 2) | (1 << 3) | (1 << 4) | (1 << 13),
                max_cipher_key_len: 64,
                max_size: u64::MAX,
            },
            features: F_VERSION_1 | F_ACCESS_PLATFORM | F_INDIRECT_DESC,
            queue_max: [1024, 64],
            pool_bytes: crate::platform::POOL_BYTES,
        }
    }
}

/// Faults to inject, changeable while the device runs.
#[derive(Debug, Default, Clone)]
pub(crate) struct Faults {
    /// Data requests are taken but not completed (until cleared).
    pub(crate) hang: bool,
    /// Control requests are left in the ring (until cleared).
    pub(crate) hang_control: bool,
    /// The transport's reset never reads back 0.
    pub(crate) transport_reset_fails: bool,
    /// The function has no reset (`VFIO_DEVICE_RESET` fails).
    pub(crate) function_reset_fails: bool,
    /// Low-power entry fails.
    pub(crate) low_power_fails: bool,
    /// After this many more data completions, the next used entry names
    /// this id instead of the request's head.
    pub(crate) lie_after: Option<(u64, u32)>,
    /// Interrupts for data completions even while the driver asked for
    /// none (VIRTQ_AVAIL_F_NO_INTERRUPT): by default the device honours
    /// the flag, as QEMU's does.
    pub(crate) ignore_no_interrupt: bool,
    /// Control completions raise no interrupt (one lost, as seen from the
    /// driver): only a look at the used ring finds them.
    pub(crate) silent_control: bool,
    /// The device holds at most this many sessions and answers a create
    /// beyond them with VIRTIO_CRYPTO_ERR, as QEMU's builtin backend does
    /// past its 256 (which, unlike this device, it keeps across a reset).
    pub(crate) session_limit: Option<usize>,
}

/// `VIRTIO_CRYPTO_ERR`: what QEMU's builtin backend answers a session
/// create with when its session table is full.
pub(crate) const STATUS_ERR: u8 = 1;

/// What the emulated device saw.
#[derive(Debug, Default, Clone)]
pub(crate) struct Seen {
    /// Register accesses (doorbells included) while in D3hot.
    pub(crate) touched_in_d3hot: u64,
    /// Doorbells rung.
    pub(crate) notifies: u64,
    /// Data requests completed.
    pub(crate) completed: u64,
    /// Resets, in order: "transport" or "function".
    pub(crate) resets: Vec<&'static str>,
}

struct State {
    setup: Setup,
    faults: Faults,
    seen: Seen,
    status: u8,
    low_power: bool,
    pool: Option<Arc<DmaPool>>,
    /// Set-up queues by index (0 data, 1 control).
    rings: HashMap<u16, DeviceRing>,
    /// Data requests taken while hung: completed once the hang clears.
    held: Vec<u16>,
    irq: Option<std::fs::File>,
    /// Device sessions: id → (algorithm number, key, encrypt).
    sessions: HashMap<u64, (u32, Vec<u8>, bool)>,
    next_session: u64,
    /// Doorbells not yet served.
    rung: bool,
    stop: bool,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The test's handle on an emulated device: faults in, observations out.
#[derive(Clone)]
pub(crate) struct Handle(Arc<Shared>);

impl Handle {
    /// Changes the faults.
    pub(crate) fn faults(&self, f: impl FnOnce(&mut Faults)) {
        let mut state = self.0.lock();
        f(&mut state.faults);
        state.rung = true;
        drop(state);
        self.0.wake.notify_all();
    }

    /// What it saw so far.
    pub(crate) fn seen(&self) -> Seen {
        self.0.lock().seen.clone()
    }

    /// The sessions it holds now.
    pub(crate) fn sessions(&self) -> usize {
        self.0.lock().sessions.len()
    }
}

/// The device, as the driver holds it (its [`Platform`]).
pub(crate) struct Emulated(Arc<Shared>);

impl Emulated {
    /// A device set up as `setup`, its thread running; and the test's
    /// handle on it.
    pub(crate) fn new(setup: Setup) -> (Emulated, Handle) {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                setup,
                faults: Faults::default(),
                seen: Seen::default(),
                status: 0,
                low_power: false,
                pool: None,
                rings: HashMap::new(),
                held: Vec::new(),
                irq: None,
                sessions: HashMap::new(),
                next_session: 1,
                rung: false,
                stop: false,
            }),
            wake: Condvar::new(),
        });
        let device = shared.clone();
        std::thread::Builder::new()
            .name("emulated-virtio-crypto".into())
            .spawn(move || run(&device))
            .expect("a thread for the emulated device");
        (Emulated(shared.clone()), Handle(shared))
    }

    /// The state, for a register access: counted as a fault in D3hot.
    fn registers(&self) -> MutexGuard<'_, State> {
        let mut state = self.0.lock();
        if state.low_power {
            state.seen.touched_in_d3hot += 1;
        }
        state
    }
}

impl Drop for Emulated {
    fn drop(&mut self) {
        self.0.lock().stop = true;
        self.0.wake.notify_all();
    }
}

/// The device loses its virtio state (reset, D3hot).
fn lose_state(state: &mut State) {
    state.status = 0;
    state.rings.clear();
    state.held.clear();
    state.sessions.clear();
}

impl Platform for Emulated {
    fn status(&self) -> Result<u8, Error> {
        Ok(self.registers().status)
    }

    fn add_status(&self, bits: u8) -> Result<(), Error> {
        self.registers().status |= bits;
        Ok(())
    }

    fn reset(&self) -> Result<(), Error> {
        let mut state = self.registers();
        state.seen.resets.push("transport");
        if state.faults.transport_reset_fails {
            return Err(Error::Device("did not reset within 1 s".into()));
        }
        lose_state(&mut state);
        Ok(())
    }

    fn device_features(&self) -> Result<u64, Error> {
        Ok(self.registers().setup.features)
    }

    fn negotiate(&self, features: u64) -> Result<(), Error> {
        let mut state = self.registers();
        if features & !state.setup.features != 0 {
            return Err(Error::Device("refused features".into()));
        }
        state.status |= crate::transport::FEATURES_OK;
        Ok(())
    }

    fn read_config(&self) -> Result<DeviceConfig, Error> {
        Ok(self.registers().setup.config)
    }

    fn queue_max_size(&self, index: u16) -> Result<u16, Error> {
        let state = self.registers();
        Ok(match index {
            0 => state.setup.queue_max[0],
            1 => state.setup.queue_max[1],
            _ => 0,
        })
    }

    fn setup_queue(
        &self,
        index: u16,
        size: u16,
        addresses: (u64, u64, u64),
        _vector: u16,
    ) -> Result<usize, Error> {
        let mut state = self.registers();
        let pool = state
            .pool
            .clone()
            .ok_or_else(|| Error::Device("queue before the DMA pool".into()))?;
        state
            .rings
            .insert(index, DeviceRing::new(pool, size, addresses));
        Ok(usize::from(index) * 4)
    }

    fn set_config_vector(&self, _vector: u16) -> Result<(), Error> {
        drop(self.registers());
        Ok(())
    }

    fn notify(&self, _off: usize, _index: u16) -> Result<(), Error> {
        let mut state = self.registers();
        state.seen.notifies += 1;
        state.rung = true;
        drop(state);
        self.0.wake.notify_all();
        Ok(())
    }

    fn dma_pool(&self, _translated: bool) -> Result<Arc<DmaPool>, Error> {
        let mut state = self.0.lock();
        let pool = Arc::new(DmaPool::unmapped(state.setup.pool_bytes)?);
        state.pool = Some(pool.clone());
        Ok(pool)
    }

    fn msix_vectors(&self) -> Result<u32, Error> {
        Ok(1)
    }

    fn enable_msix(&self, fd: BorrowedFd<'_>) -> Result<(), Error> {
        let fd: OwnedFd = fd.try_clone_to_owned().map_err(|source| Error::Io {
            op: "dup eventfd",
            source,
        })?;
        self.0.lock().irq = Some(std::fs::File::from(fd));
        Ok(())
    }

    fn disable_msix(&self) -> Result<(), Error> {
        self.0.lock().irq = None;
        Ok(())
    }

    fn enable_req_irq(&self, _fd: BorrowedFd<'_>) -> Result<(), Error> {
        Ok(())
    }

    fn reset_function(&self) -> Result<(), Error> {
        let mut state = self.0.lock();
        state.seen.resets.push("function");
        if state.faults.function_reset_fails {
            return Err(Error::Io {
                op: "VFIO_DEVICE_RESET",
                source: std::io::Error::from_raw_os_error(25),
            });
        }
        lose_state(&mut state);
        state.low_power = false;
        Ok(())
    }

    fn set_low_power(&self, on: bool) -> Result<(), Error> {
        let mut state = self.0.lock();
        if on && state.faults.low_power_fails {
            return Err(Error::Io {
                op: "VFIO_DEVICE_FEATURE low power",
                source: std::io::Error::from_raw_os_error(22),
            });
        }
        if on {
            lose_state(&mut state);
        }
        state.low_power = on;
        Ok(())
    }
}

/// The device's thread: serves the queues whenever a doorbell rings (or a
/// fault changes), until the driver lets go of it.
fn run(shared: &Shared) {
    let mut state = shared.lock();
    loop {
        while !state.rung && !state.stop {
            state = shared.wake.wait(state).unwrap_or_else(|p| p.into_inner());
        }
        if state.stop {
            return;
        }
        state.rung = false;
        if state.low_power {
            continue;
        }
        let served = serve(&mut state);
        if served && let Some(irq) = state.irq.as_mut() {
            let _ = irq.write_all(&1u64.to_ne_bytes());
        }
    }
}

/// Serves what both queues have available; whether anything completed.
fn serve(state: &mut State) -> bool {
    let mut any = false;
    for index in [1u16, 0] {
        let before = any;
        if index == 1 && state.faults.hang_control {
            continue;
        }
        let Some(mut ring) = state.rings.remove(&index) else {
            continue;
        };
        if index == 0 && !state.faults.hang {
            for head in std::mem::take(&mut state.held) {
                any |= complete(state, &ring, head);
            }
        }
        while let Ok(Some(head)) = ring.pop_avail() {
            if index == 0 && state.faults.hang {
                state.held.push(head);
                continue;
            }
            any |= if index == 0 {
                complete(state, &ring, head)
            } else {
                control(state, &ring, head) && !state.faults.silent_control
            };
        }
        if index == 0
            && !before
            && any
            && !state.faults.ignore_no_interrupt
            && !ring.interrupts_wanted()
        {
            any = false;
        }
        state.rings.insert(index, ring);
    }
    any
}

/// Completes data request `head`: computes it (or its error status) and
/// writes its used entry — or the lie the faults ask for.
fn complete(state: &mut State, ring: &DeviceRing, head: u16) -> bool {
    let Ok(chain) = ring.chain(head) else {
        return false;
    };
    let written = data(state, ring.pool(), &chain).unwrap_or(0);
    state.seen.completed += 1;
    let mut id = u32::from(head);
    if let Some((after, lie)) = state.faults.lie_after {
        if after == 0 {
            id = lie;
            state.faults.lie_after = None;
        } else {
            state.faults.lie_after = Some((after - 1, lie));
        }
    }
    ring.push_used(id, written).is_ok()
}

/// A cipher request: header, IV (if any), source, destination, status.
/// The bytes written, or `None` if the chain is not one.
fn data(state: &State, pool: &DmaPool, chain: &[Desc]) -> Option<u32> {
    let header = read(pool, chain.first()?)?;
    let status_at = chain.last()?;
    let word = |at: usize| u32::from_le_bytes(header[at..at + 4].try_into().unwrap_or_default());
    let id = u64::from_le_bytes(header[8..16].try_into().ok()?);
    let iv_len = word(24) as usize;
    let (iv, src, dst) = match chain.len() {
        5 => (read(pool, &chain[1])?, &chain[2], &chain[3]),
        4 => (Vec::new(), &chain[1], &chain[2]),
        _ => return None,
    };
    let mut buf = read(pool, src)?;
    let status = match state.sessions.get(&id) {
        Some((algo, key, encrypt)) if iv.len() == iv_len => {
            let encrypting = word(0) == protocol::CIPHER_ENCRYPT;
            if *encrypt == encrypting && compute(*algo, key, *encrypt, &iv, &mut buf) {
                pool.device_write(dst.addr, &buf[..buf.len().min(dst.len as usize)])
                    .ok()?;
                protocol::STATUS_OK
            } else {
                1
            }
        }
        Some(_) => 1,
        None => 4,
    };
    pool.device_write(status_at.addr, &[status]).ok()?;
    Some(dst.len + 1)
}

/// AES as the device computes it: whole blocks only (as QEMU's builtin
/// backend), with the fallback crate.
fn compute(algo: u32, key: &[u8], encrypt: bool, iv: &[u8], buf: &mut [u8]) -> bool {
    if !buf.len().is_multiple_of(16) {
        return false;
    }
    let iv16: [u8; 16] = iv.try_into().unwrap_or([0; 16]);
    let r = match algo {
        2 => fb::Cbc::new(key).and_then(|c| {
            buf.chunks_mut(16).try_for_each(|b| {
                if encrypt {
                    c.encrypt(&[0; 16], b)
                } else {
                    c.decrypt(&[0; 16], b)
                }
            })
        }),
        3 => fb::Cbc::new(key).and_then(|c| {
            if encrypt {
                c.encrypt(&iv16, buf)
            } else {
                c.decrypt(&iv16, buf)
            }
        }),
        4 => fb::Ctr::new(key).and_then(|c| c.apply_keystream(&iv16, buf)),
        13 => fb::Xts::new(key).and_then(|x| {
            if encrypt {
                x.encrypt(&iv16, buf)
            } else {
                x.decrypt(&iv16, buf)
            }
        }),
        _ => return false,
    };
    r.is_ok()
}

/// A control request: create a session (header, key, session input) or
/// destroy one (header, status).
fn control(state: &mut State, ring: &DeviceRing, head: u16) -> bool {
    let Ok(chain) = ring.chain(head) else {
        return false;
    };
    let pool = ring.pool().clone();
    let Some(header) = chain.first().and_then(|d| read(&pool, d)) else {
        return false;
    };
    let word = |at: usize| u32::from_le_bytes(header[at..at + 4].try_into().unwrap_or_default());
    let written = match (word(0), chain.as_slice()) {
        (protocol::CIPHER_CREATE_SESSION, [_, key, input]) => {
            let Some(key) = read(&pool, key) else {
                return false;
            };
            let mut out = [0u8; 16];
            if state
                .faults
                .session_limit
                .is_some_and(|limit| state.sessions.len() >= limit)
            {
                out[8..12].copy_from_slice(&u32::from(STATUS_ERR).to_le_bytes());
                let _ = pool.device_write(input.addr, &out);
                return ring.push_used(u32::from(head), 16).is_ok();
            }
            let id = state.next_session;
            state.next_session += 1;
            state
                .sessions
                .insert(id, (word(16), key, word(24) == protocol::OP_ENCRYPT));
            out[..8].copy_from_slice(&id.to_le_bytes());
            let _ = pool.device_write(input.addr, &out);
            16
        }
        (protocol::CIPHER_DESTROY_SESSION, [_, status]) => {
            let id = u64::from_le_bytes(header[16..24].try_into().unwrap_or_default());
            let ok = state.sessions.remove(&id).is_some();
            let _ = pool.device_write(status.addr, &[if ok { 0 } else { 4 }]);
            1
        }
        _ => 0,
    };
    ring.push_used(u32::from(head), written).is_ok()
}

/// The bytes a descriptor the device reads points at.
fn read(pool: &DmaPool, d: &Desc) -> Option<Vec<u8>> {
    let mut out = vec![0u8; d.len as usize];
    pool.device_read(d.addr, &mut out).ok()?;
    Some(out)
}
