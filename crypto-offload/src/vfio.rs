//! Userspace-driven PCI engines through VFIO (the `vfio` feature): each
//! virtio-crypto device bound to `vfio-pci` becomes a backend of its own,
//! named `vfio:<PCI address>`, running the AES modes its device accepts —
//! probed by creating a session for each, not read from the bitmaps it
//! advertises.
//!
//! ```no_run
//! # async fn run() -> Result<(), crypto_offload::Error> {
//! use std::sync::Arc;
//!
//! use crypto_offload::Offload;
//! use crypto_offload::vfio::VfioBackend;
//!
//! let mut builder = Offload::builder();
//! match VfioBackend::discover().await {
//!     Ok(devices) => {
//!         for device in devices {
//!             println!("{}: {} in flight", device.address(), device.in_flight());
//!             builder = builder.backend(Arc::new(device));
//!         }
//!     }
//!     Err(why) => eprintln!("VFIO: {why}"),
//! }
//! let offload = builder.build()?;
//! # Ok(()) }
//! ```

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use crypto_offload_vfio as vfio;

use crate::alg::{AeadAlg, Algorithm, CipherAlg, CipherMode, CrcAlg};
use crate::backend::{
    AeadContext, Backend, BackendKind, CipherContext, CipherParams, CrcContext, DeviceMemory,
    Failed, Limits,
};
use crate::buffer::IoBuf;
pub use crate::engine::{AUTOSUSPEND_DELAY, RequestTimeout, Unavailable};
use crate::engine::{UnitCipher, xts_per_unit};
use crate::error::BackendError;
use crate::key::SecretKey;
use crate::power::{PowerControl, PowerDomain, PowerRef};

/// A virtio-crypto device driven through VFIO.
#[derive(Debug)]
pub struct VfioBackend {
    name: Arc<str>,
    device: vfio::CryptoDevice,
    /// The algorithms a session could be created for at open.
    supported: Vec<CipherAlg>,
    /// The device's PCI power state (D0 / D3hot), switched through VFIO.
    power: PowerDomain,
}

/// How long a VFIO request may take before it is given up as hung and
/// replayed on the CPU (the caller's buffer comes back unchanged: the
/// driver works on a copy in DMA memory, which it keeps until the device
/// lets go of it): 2 s, plus 100 ms a MiB — a 10 MB/s floor, as for
/// AF_ALG. Measured from the request's start, waits for room in the queue
/// and the DMA pool included. The timer is tokio's: under a paused clock
/// (`tokio::time::pause`) it fires as soon as the runtime idles.
pub const REQUEST_TIMEOUT: RequestTimeout = RequestTimeout::ENGINE;

/// [`REQUEST_TIMEOUT`] as the driver takes it.
fn timeout() -> vfio::RequestTimeout {
    vfio::RequestTimeout {
        fixed: REQUEST_TIMEOUT.fixed,
        per_mib: REQUEST_TIMEOUT.per_mib,
    }
}

/// How long a request waiting for its completion polls the device, by
/// default, without seeing one before it sleeps on the interrupt
/// ([`VfioBackend::set_poll_for`]). Polling while the device completes
/// requests skips an interrupt and a thread wake-up per batch; with no
/// progress for this long the device is idle or slow, and sleeping burns no
/// core.
pub const POLL_FOR: Duration = vfio::POLL_FOR;

/// The power switch: VFIO's low-power entry and exit (D3hot and back; the
/// device is set up again after, as D3hot resets it).
struct LowPower(vfio::CryptoDevice);

#[async_trait]
impl PowerControl for LowPower {
    async fn power_on(&self) -> Result<(), BackendError> {
        self.0.resume().map_err(backend_error)
    }

    async fn power_off(&self) -> Result<(), BackendError> {
        self.0.suspend().await.map_err(backend_error)
    }
}

impl VfioBackend {
    /// Every usable device (bound to `vfio-pci`, 1af4:1054), opened, each
    /// its own backend; devices that fail to open are left out (their
    /// errors logged).
    ///
    /// # Errors
    /// Why no device is usable (no VFIO, no device, bound elsewhere).
    ///
    /// # Cancel safety
    /// Dropping the future closes the devices opened so far.
    pub async fn discover() -> Result<Vec<VfioBackend>, Unavailable> {
        let (out, left_out) = VfioBackend::discover_each(&[]).await?;
        if out.is_empty() {
            let why: Vec<String> = left_out.iter().map(|(a, e)| format!("{a}: {e}")).collect();
            return Err(Unavailable(why.join("; ")));
        }
        Ok(out)
    }

    /// [`discover`](Self::discover), skipping the devices at `skip`, with
    /// each device left out and why.
    pub(crate) async fn discover_each(
        skip: &[String],
    ) -> Result<(Vec<VfioBackend>, Vec<(String, Unavailable)>), Unavailable> {
        let (usable, _) = vfio::devices();
        if usable.is_empty() {
            return Err(Unavailable(
                vfio::unavailable_reason().unwrap_or_else(|| "no device".into()),
            ));
        }
        let mut out = Vec::new();
        let mut left_out = Vec::new();
        for address in usable.into_iter().filter(|a| !skip.contains(a)) {
            match VfioBackend::open(&address).await {
                Ok(b) => out.push(b),
                Err(e) => {
                    tracing::warn!(%address, error = %e.0, "VFIO device left out");
                    left_out.push((address, e));
                }
            }
        }
        Ok((out, left_out))
    }

    /// Opens the device at `address` and probes which algorithms it takes.
    ///
    /// # Errors
    /// The device cannot be opened, or takes none of this crate's
    /// algorithms.
    ///
    /// # Cancel safety
    /// Dropping the future closes the device (a probe session it
    /// interrupts is left to the device's reset: cleared by the virtio
    /// spec, kept by QEMU's builtin backend, which holds 256).
    pub async fn open(address: &str) -> Result<VfioBackend, Unavailable> {
        let device = vfio::CryptoDevice::open(address)
            .await
            .map_err(|e| Unavailable(e.to_string()))?;
        VfioBackend::from_device(address, device).await
    }

    /// A backend on a device already brought up (by
    /// [`CryptoDevice::open`](vfio::CryptoDevice::open), or the driver's
    /// emulated device on a host without one), named `vfio:` and
    /// `address`: probes which algorithms it takes, then leaves it in low
    /// power until a session needs it.
    ///
    /// # Errors
    /// The device takes none of this crate's algorithms, or refuses to
    /// enter low power.
    ///
    /// # Cancel safety
    /// Dropping the future drops `device` (a clone the caller kept keeps it
    /// open; a probe session it interrupts is left to the device's reset,
    /// as for [`VfioBackend::open`]).
    pub async fn from_device(
        address: &str,
        device: vfio::CryptoDevice,
    ) -> Result<VfioBackend, Unavailable> {
        let mut supported = Vec::new();
        let mut refusal = None;
        for alg in CipherAlg::ALL {
            let key = SecretKey::for_tests(alg.key_len());
            match device.cipher_session(algo_of(alg), key.expose()).await {
                Ok(s) => {
                    let _ = s.close().await;
                    supported.push(alg);
                }
                Err(e) => refusal = Some(e),
            }
        }
        if supported.is_empty() {
            // The device's answer, which says more than "none": QEMU's
            // builtin backend answers VIRTIO_CRYPTO_ERR to an algorithm it
            // lacks and to a create when its 256 sessions are taken.
            let why = refusal.map_or_else(String::new, |e| format!(" (last: {e})"));
            return Err(Unavailable(format!(
                "{address} accepts no AES cipher session{why}"
            )));
        }
        // Unpowered until a session needs it: the domain starts so.
        device
            .suspend()
            .await
            .map_err(|e| Unavailable(format!("{address}: low-power entry: {e}")))?;
        let name = format!("vfio:{address}");
        let power = PowerDomain::new(name.clone(), LowPower(device.clone()), AUTOSUSPEND_DELAY);
        let name = Arc::from(name);
        Ok(VfioBackend {
            name,
            device,
            supported,
            power,
        })
    }

    /// The device's PCI address (`0000:01:00.0`; the backend is named
    /// `vfio:` and this).
    pub fn address(&self) -> &str {
        self.device.address()
    }

    /// Requests the device holds now.
    pub fn in_flight(&self) -> usize {
        self.device.in_flight()
    }

    /// Units of the device's DMA pool in use: back at its idle level when
    /// no request is in flight (nothing leaks; cancelled requests keep
    /// theirs until the device is done with them).
    pub fn dma_units_in_use(&self) -> usize {
        self.device.dma_units_in_use()
    }

    /// Bytes of the device's DMA pool held by device-ready buffers
    /// (`Offload::buffer`), in flight or not: 0 once every one is dropped.
    pub fn buffer_bytes(&self) -> usize {
        self.device.buffer_bytes()
    }

    /// Times a submission found the device's queue full and waited for room
    /// (back-pressure: more requests were sent than it holds).
    pub fn queue_full_count(&self) -> u64 {
        self.device.queue_full_count()
    }

    /// Whether the device is in its low-power state now (D3hot: from its
    /// open until a session needs it, and again [`AUTOSUSPEND_DELAY`] after
    /// the last one closes).
    pub fn is_suspended(&self) -> bool {
        self.device.is_suspended()
    }

    /// The device's status and its queues' indices, in one line: for
    /// diagnosing a device that stopped answering.
    pub fn diagnose(&self) -> String {
        self.device.diagnose()
    }

    /// Sets how long a request waiting for its completion polls the device
    /// without seeing one before it sleeps on the interrupt ([`POLL_FOR`]
    /// by default). Zero: never poll — every completion comes by
    /// interrupt, so requests stay in the device until it raises one (no
    /// spinning, at the cost of an interrupt and a thread wake-up per
    /// batch).
    pub fn set_poll_for(&self, budget: Duration) {
        self.device.set_poll_for(budget);
    }

    /// The driver's device, for this workspace's guest tests and benches
    /// that reset it, watch its hot-unplug, or drive it directly beside
    /// the backend (a VFIO group opens once: they cannot open a second
    /// handle). Not part of the API: its type is the driver crate's, whose
    /// version this crate does not promise.
    #[doc(hidden)]
    pub fn driver_device(&self) -> &vfio::CryptoDevice {
        &self.device
    }
}

fn algo_of(alg: CipherAlg) -> vfio::CipherAlgo {
    match alg.mode() {
        CipherMode::Cbc => vfio::CipherAlgo::AesCbc,
        CipherMode::Ctr => vfio::CipherAlgo::AesCtr,
        CipherMode::Xts => vfio::CipherAlgo::AesXts,
    }
}

fn backend_error(e: vfio::Error) -> BackendError {
    match e {
        vfio::Error::Gone => BackendError::DeviceGone,
        vfio::Error::Timeout(_) => BackendError::Timeout,
        vfio::Error::Invalid { .. } | vfio::Error::TooLarge { .. } => {
            BackendError::Unsupported(e.to_string())
        }
        vfio::Error::Io { op, source } => BackendError::Io { op, source },
        other => BackendError::Other(Box::new(other)),
    }
}

fn failed(f: vfio::Failed) -> Failed {
    Failed::new(backend_error(f.error), IoBuf::from(f.buf))
}

#[async_trait]
impl Backend for VfioBackend {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> BackendKind {
        BackendKind::Device
    }

    fn limits(&self, alg: Algorithm) -> Option<Limits> {
        let Algorithm::Cipher(c) = alg else {
            return None;
        };
        if !self.supported.contains(&c) {
            return None;
        }
        let max = self.device.limits().max_request;
        // More wait for room in the ring (back-pressure, never lost); the
        // selector sends no more than it holds.
        let depth = self.device.queue_depth();
        Some(if c.mode() == CipherMode::Xts {
            // One tweak per request: an XTS data unit goes whole, up to
            // what the device takes (validated at open). QEMU's builtin
            // backend has no XTS ciphertext stealing ("Length 20 must be a
            // multiple of block size 16", measured).
            xts_per_unit(max)
                .with_length_multiple(16)
                .with_queue_depth(depth)
        } else {
            // Longer CBC and CTR requests go in chained pieces of this size
            // (CTR tails are padded by the driver).
            Limits::new()
                .with_operation_len(max)
                .with_queue_depth(depth)
        })
    }

    fn power(&self) -> Option<&PowerDomain> {
        Some(&self.power)
    }

    fn buffer(&self, len: usize) -> Option<Box<dyn DeviceMemory>> {
        // Room for an AEAD tag past the data (the buffer may go to a GCM
        // session on the CPU), in whole blocks.
        let mut buf = self.device.try_buffer(len.checked_add(16)?).ok()??;
        buf.set_len(len).ok()?;
        Some(Box::new(DmaMemory {
            buf: Some(buf),
            owner: self.name.clone(),
        }))
    }

    async fn open_cipher(
        &self,
        alg: CipherAlg,
        key: &SecretKey,
    ) -> Result<Box<dyn CipherContext>, BackendError> {
        if !self.supported.contains(&alg) {
            return Err(BackendError::Unsupported(format!(
                "{} on {}",
                alg.name(),
                self.name
            )));
        }
        // The device up first (the reference lives as long as the session).
        let power = self.power.acquire().await?;
        let s = self
            .device
            .cipher_session(algo_of(alg), key.expose())
            .await
            .map_err(backend_error)?
            .with_timeout(timeout());
        Ok(Box::new(VfioCipher {
            session: s,
            _power: power,
        }))
    }

    async fn open_aead(
        &self,
        alg: AeadAlg,
        _key: &SecretKey,
    ) -> Result<Box<dyn AeadContext>, BackendError> {
        // virtio-crypto devices here offer no AEAD service.
        Err(BackendError::Unsupported(format!(
            "{} on {}",
            alg.name(),
            self.name
        )))
    }

    async fn open_crc(&self, alg: CrcAlg) -> Result<Box<dyn CrcContext>, BackendError> {
        Err(BackendError::Unsupported(format!(
            "{} on {}",
            alg.name(),
            self.name
        )))
    }
}

/// A device-ready buffer's memory, lent by [`VfioBackend::buffer`]
/// (`Backend::buffer`): carved from the device's DMA pool.
///
/// The buffer is out (`None`) only while a request on it is in the device
/// ([`VfioCipher::in_place`]), which puts it, or what the device gave back,
/// into the same box: a request costs no allocation here.
struct DmaMemory {
    buf: Option<vfio::DmaBuffer>,
    owner: Arc<str>,
}

impl DeviceMemory for DmaMemory {
    fn as_slice(&self) -> &[u8] {
        self.buf.as_ref().map_or(&[], |b| b.as_slice())
    }
    fn as_mut_slice(&mut self) -> &mut [u8] {
        self.buf.as_mut().map_or(&mut [], |b| b.as_mut_slice())
    }
    fn set_len(&mut self, len: usize) -> bool {
        self.buf.as_mut().is_some_and(|b| b.set_len(len).is_ok())
    }
    fn owner(&self) -> &str {
        &self.owner
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any + Send> {
        self
    }
}

/// A cipher context on the device: requests on its own device-ready
/// buffers in place, others copied through its DMA pool; holding the
/// device's power for the session's life (dropped after the session: its
/// close goes out before the device may suspend).
struct VfioCipher {
    session: vfio::CipherSession,
    _power: PowerRef,
}

impl VfioCipher {
    async fn crypt(
        &self,
        encrypt: bool,
        params: CipherParams,
        buf: IoBuf,
    ) -> Result<IoBuf, Failed> {
        // In place: this device's memory, and one request (an XTS request
        // of several data units goes through the copying path, which
        // windows its units).
        let one = self.session.algo() != vfio::CipherAlgo::AesXts || params.data_unit == buf.len();
        // This device's memory: by its pool, not the backend's name (a
        // buffer kept across a re-open of the same address is another
        // pool's, and goes through the copying path).
        let buf = match buf.into_device() {
            Ok(m) if one && m.as_any().is::<DmaMemory>() => {
                match m.into_any().downcast::<DmaMemory>() {
                    Ok(d) if d.buf.as_ref().is_some_and(|b| self.session.owns(b)) => {
                        return self.in_place(encrypt, &params.iv, d).await;
                    }
                    Ok(d) => IoBuf::from_device(d),
                    // Never: the type was checked.
                    Err(_) => {
                        return Err(Failed::new(
                            BackendError::Other("device memory of another type".into()),
                            IoBuf::from(Vec::new()),
                        ));
                    }
                }
            }
            Ok(m) => IoBuf::from_device(m),
            Err(buf) => buf,
        };
        // Boxed: the copying path's future is twice the in-place one's
        // (2.7 KB against 1.4), and this one is moved into the engine
        // call's box on every request, whichever path it takes.
        Box::pin(self.copied(encrypt, params, buf)).await
    }

    /// Through the DMA pool: copied in and out.
    async fn copied(
        &self,
        encrypt: bool,
        params: CipherParams,
        buf: IoBuf,
    ) -> Result<IoBuf, Failed> {
        UnitCipher::crypt_units(
            &self.session,
            encrypt,
            &params.iv,
            params.data_unit,
            buf.into(),
        )
        .await
        .map(IoBuf::from)
    }

    /// On the device's own memory: nothing copied.
    /// `m` holds a buffer of this session's device (checked by the caller).
    async fn in_place(
        &self,
        encrypt: bool,
        iv: &[u8; 16],
        mut m: Box<DmaMemory>,
    ) -> Result<IoBuf, Failed> {
        let Some(buf) = m.buf.take() else {
            return Err(Failed::new(
                BackendError::Other("a device buffer without its memory".into()),
                IoBuf::from(Vec::new()),
            ));
        };
        let iv = &iv[..self.session.algo().iv_len()];
        let r = if encrypt {
            self.session.encrypt_buffer(iv, buf).await
        } else {
            self.session.decrypt_buffer(iv, buf).await
        };
        let memory = |buf| {
            m.buf = Some(buf);
            IoBuf::from_device(m)
        };
        match r {
            Ok(buf) => Ok(memory(buf)),
            Err(vfio::BufferFailed { error, buf }) => {
                let buf = match buf {
                    vfio::Returned::Device(b) => memory(*b),
                    // The device failed with it: its input, copied out, to
                    // be replayed (the caller's buffer is ordinary memory
                    // from here on).
                    vfio::Returned::Copied(v) => IoBuf::from(v),
                    // Not replayable: the session layer sees the length
                    // differ and fails the request instead.
                    vfio::Returned::Lost => IoBuf::from(Vec::new()),
                };
                Err(Failed::new(backend_error(error), buf))
            }
        }
    }
}

#[async_trait]
impl CipherContext for VfioCipher {
    async fn encrypt(&self, params: CipherParams, buf: IoBuf) -> Result<IoBuf, Failed> {
        self.crypt(true, params, buf).await
    }

    async fn decrypt(&self, params: CipherParams, buf: IoBuf) -> Result<IoBuf, Failed> {
        self.crypt(false, params, buf).await
    }
}

impl UnitCipher for vfio::CipherSession {
    async fn crypt_units(
        &self,
        encrypt: bool,
        first_tweak: &[u8; 16],
        unit: usize,
        buf: Vec<u8>,
    ) -> Result<Vec<u8>, Failed> {
        vfio::CipherSession::crypt_units(self, encrypt, first_tweak, unit, buf)
            .await
            .map_err(failed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the session layer does with each driver error: a timeout or a
    /// device that broke the rules is the engine's failure (the request is
    /// replayed on the CPU and the breaker opens); a length the device
    /// cannot take is not (replayed, breaker closed).
    #[test]
    fn driver_errors_map_to_what_the_selector_must_do() {
        let timeout = backend_error(vfio::Error::Timeout(Duration::from_secs(2)));
        assert!(matches!(timeout, BackendError::Timeout));
        let broken = backend_error(vfio::Error::Broken("used id 999".into()));
        assert!(matches!(broken, BackendError::Other(_)));
        assert!(broken.to_string().contains("used id 999"), "{broken}");
        assert!(matches!(
            backend_error(vfio::Error::Gone),
            BackendError::DeviceGone
        ));
        assert!(matches!(
            backend_error(vfio::Error::TooLarge { len: 9, max: 8 }),
            BackendError::Unsupported(_)
        ));
        let io = vfio::Error::Io {
            op: "VFIO_DEVICE_RESET",
            source: std::io::Error::from_raw_os_error(25),
        };
        assert_eq!(backend_error(io).raw_os_error(), Some(25));
    }
}
