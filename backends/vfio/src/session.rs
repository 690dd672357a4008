//! Cipher sessions on the device: one device session per direction,
//! requests copied through the DMA pool (or prepared in it), long ones
//! chained, XTS data units in a bounded window, and request timeouts.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tracing::Instrument;
use zeroize::{Zeroize, Zeroizing};

use crate::buffer::DmaBuffer;
use crate::device::DeviceState;
use crate::dma::{DmaBuf, UNIT};
use crate::error::{BufferFailed, Error, Failed, Returned};
use crate::protocol::{self, CipherAlgo};
use crate::queue::{Burst, Deadline, Host, Queue, Rescue, Ticket};
use crate::request::{Chain, DmaRequest, HEADER_AT, IV_AT, Layout, STATUS_AT, TABLE_AT};

/// How long a request may take before it is given up as hung: `fixed`
/// plus `per_mib` for each MiB of data. A request that times out comes
/// back with [`Error::Timeout`] and the caller's buffer unchanged; its DMA
/// memory stays with the driver until the device completes it or is reset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestTimeout {
    /// The time every request may take.
    pub fixed: Duration,
    /// More time per MiB of data.
    pub per_mib: Duration,
}

impl RequestTimeout {
    /// The time a `len`-byte request may take (saturating). In integers:
    /// it is computed for every request, and floating point is emulated,
    /// slowly, under TCG (the guest's profile showed it).
    pub fn for_len(self, len: usize) -> Duration {
        let nanos = (self.per_mib.as_nanos().saturating_mul(len as u128)) >> 20;
        let more = match u64::try_from(nanos / 1_000_000_000) {
            Ok(secs) => Duration::new(secs, (nanos % 1_000_000_000) as u32),
            Err(_) => Duration::MAX,
        };
        self.fixed.saturating_add(more)
    }
}

/// The status byte as the driver leaves it for the device to write.
const NOT_WRITTEN: u8 = 0xff;

/// The most XTS data units one request keeps in the device at once.
pub const UNITS_IN_FLIGHT: usize = 64;

/// A cipher session on the device: one device session for each direction,
/// destroyed when this is dropped.
pub struct CipherSession {
    pub(crate) dev: Arc<DeviceState>,
    pub(crate) algo: CipherAlgo,
    /// Encrypt and decrypt session ids.
    pub(crate) ids: [u64; 2],
    /// Destroyed already (by [`CipherSession::close`]).
    pub(crate) closed: bool,
    /// How long a request may take.
    pub(crate) timeout: Option<RequestTimeout>,
}

impl std::fmt::Debug for CipherSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CipherSession")
            .field("device", &self.dev.address)
            .field("algo", &self.algo)
            .field("timeout", &self.timeout)
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

    /// Gives up on a request that takes longer than `timeout` (measured
    /// from its start, including any wait for room in the queue or the DMA
    /// pool): it fails with [`Error::Timeout`] and the caller's buffer
    /// unchanged (a [`CipherSession::run_burst`] loses its requests, as on
    /// a reset). Without one (the default) a request waits for its device
    /// as long as it takes.
    pub fn with_timeout(mut self, timeout: RequestTimeout) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The most data one request carries whole (the device's limits).
    pub fn max_request(&self) -> usize {
        self.dev.limits.max_request
    }

    /// The DMA memory one request of `len` bytes takes from the device's
    /// pool while prepared or in flight (header, IV, status, descriptor
    /// table and data, in whole pool units).
    pub fn request_bytes(&self, len: usize) -> usize {
        Layout::new(self.algo, len).bytes().next_multiple_of(UNIT)
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
    /// little-endian counter, wrapping). At most [`UNITS_IN_FLIGHT`] units
    /// (and a quarter of the DMA pool) are in the device at once, and a
    /// request never waits for DMA memory while it holds any: it collects
    /// its oldest unit first. So any number of requests of any length
    /// share the pool without deadlock. Other modes, or one unit, are one
    /// request.
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
        let span = tracing::trace_span!("vfio.units", encrypt, unit_len, len = buf.len());
        let first = u128::from_le_bytes(*first_tweak);
        let r = self
            .within(buf.len(), self.units(encrypt, first, unit_len, &buf))
            .instrument(span)
            .await;
        match r {
            Ok(mut out) => {
                let mut buf = buf;
                // The input (plaintext, on encryption) is wiped; the
                // result goes back in its place.
                std::mem::swap(&mut buf, &mut *out);
                Ok(buf)
            }
            Err(error) => Err(Failed { error, buf }),
        }
    }

    /// The units of [`CipherSession::crypt_units`] into a fresh buffer
    /// (wiped if the request fails or is given up).
    async fn units(
        &self,
        encrypt: bool,
        first: u128,
        unit_len: usize,
        data: &[u8],
    ) -> Result<Zeroizing<Vec<u8>>, Error> {
        let layout = Layout::new(self.algo, unit_len);
        let bytes = layout.bytes();
        let window = unit_window(self.dev.pool.len(), bytes);
        let mut out = Zeroizing::new(vec![0u8; data.len()]);
        let mut started: VecDeque<(usize, Ticket<&Queue>)> = VecDeque::new();
        for (i, unit) in data.chunks(unit_len).enumerate() {
            // Room for one more: within the window, and never waiting for
            // DMA memory while holding some — the oldest unit is collected
            // (its memory freed) first. Waiting holding nothing cannot
            // deadlock: every unit in the device completes and frees its
            // memory without this request's help.
            let dma = loop {
                if started.len() < window
                    && let Some(dma) = self.dev.pool.try_alloc(bytes)?
                {
                    break dma;
                }
                match started.pop_front() {
                    Some((j, rx)) => {
                        self.collect(rx, layout, &mut out[j * unit_len..][..unit_len])
                            .await?
                    }
                    None => break self.dev.pool.alloc(bytes).await?,
                }
            };
            let tweak = first.wrapping_add(i as u128).to_le_bytes();
            let chain = self.write_request(&dma, encrypt, &tweak, unit)?;
            let table = dma.iova(TABLE_AT);
            started.push_back((
                i,
                self.dev
                    .enqueue_one(&mut Some(dma), chain, table, None, None)
                    .await?,
            ));
        }
        while let Some((j, rx)) = started.pop_front() {
            self.collect(rx, layout, &mut out[j * unit_len..][..unit_len])
                .await?;
        }
        Ok(out)
    }

    /// Waits for a started request and copies its output into `dest`
    /// (its DMA memory is freed on return).
    async fn collect(
        &self,
        rx: Ticket<&Queue>,
        layout: Layout,
        dest: &mut [u8],
    ) -> Result<(), Error> {
        let dma = self.finish(rx).await?;
        dma.read(layout.out_at, dest)
    }

    /// Runs `request` (for `len` bytes) within the session's timeout.
    async fn within<T>(
        &self,
        len: usize,
        request: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        match self.timeout.map(|t| t.for_len(len)) {
            None => request.await,
            Some(limit) => tokio::time::timeout(limit, request)
                .await
                .unwrap_or(Err(Error::Timeout(limit))),
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
        let len = buf.len();
        if len <= self.max_request() {
            // One request (the usual case): the result goes straight into
            // the caller's buffer once the device has succeeded — no second
            // buffer to allocate, fill and wipe. The copy out is the last
            // step, after the last await: a request given up (timed out,
            // dropped) leaves the buffer as it was. Its timeout is a
            // deadline the queue keeps with the request, not a timer of
            // its own ([`Deadline`]).
            let mut buf = buf;
            let deadline = self.timeout.map(|t| Deadline::after(t.for_len(len)));
            let r = async {
                let rx = self.start(encrypt, iv, &buf, deadline).await?;
                let dma = self.finish(rx).await?;
                dma.read(Layout::new(self.algo, len).out_at, &mut buf)
            }
            .instrument(span)
            .await;
            return match r {
                Ok(()) => Ok(buf),
                Err(error) => Err(Failed { error, buf }),
            };
        }
        match self
            .within(len, self.chained(encrypt, iv, &buf))
            .instrument(span)
            .await
        {
            Ok(mut out) => {
                let mut buf = buf;
                std::mem::swap(&mut buf, &mut *out);
                Ok(buf)
            }
            Err(error) => Err(Failed { error, buf }),
        }
    }

    /// Whether `buf` is this session's device's memory (a request on it
    /// goes in place; another device's is refused).
    pub fn owns(&self, buf: &DmaBuffer) -> bool {
        buf.same_pool(&self.dev.pool)
    }

    /// Encrypts a device-ready buffer of this session's device in place:
    /// no copy in or out (the device reads the data's half of the buffer
    /// and writes the other, which then holds the data). The zero-copy
    /// form of [`CipherSession::encrypt`].
    ///
    /// # Errors
    /// As for [`CipherSession::encrypt`], and [`Error::Invalid`] for a
    /// buffer of another device, [`Error::TooLarge`] above
    /// [`CipherSession::max_request`] (such requests go through the copying
    /// path, which chains them). With a validation error or the device's
    /// refusal the buffer comes back as it was ([`Returned::Device`]); if
    /// the device failed with the request in it (reset, removal, timeout)
    /// its memory stays with the driver until the device can no longer
    /// write it, and the input comes back copied out
    /// ([`Returned::Copied`]), for the caller to run elsewhere.
    ///
    /// # Cancel safety
    /// Cancel safe in the sense that matters: a dropped request's buffer
    /// stays with the driver until the device is done with it, then is
    /// wiped and freed (it is not returned).
    pub async fn encrypt_buffer(
        &self,
        iv: &[u8],
        buf: DmaBuffer,
    ) -> Result<DmaBuffer, BufferFailed> {
        self.crypt_buffer(true, iv, buf).await
    }

    /// Decrypts a device-ready buffer in place: as
    /// [`CipherSession::encrypt_buffer`].
    ///
    /// # Errors
    /// As for [`CipherSession::encrypt_buffer`].
    ///
    /// # Cancel safety
    /// As for [`CipherSession::encrypt_buffer`].
    pub async fn decrypt_buffer(
        &self,
        iv: &[u8],
        buf: DmaBuffer,
    ) -> Result<DmaBuffer, BufferFailed> {
        self.crypt_buffer(false, iv, buf).await
    }

    async fn crypt_buffer(
        &self,
        encrypt: bool,
        iv: &[u8],
        buf: DmaBuffer,
    ) -> Result<DmaBuffer, BufferFailed> {
        let refuse = |error, buf| {
            Err(BufferFailed {
                error,
                buf: Returned::Device(Box::new(buf)),
            })
        };
        if let Err(error) = self.check(iv, buf.len()) {
            return refuse(error, buf);
        }
        if !buf.same_pool(&self.dev.pool) {
            let error = Error::Invalid {
                what: "buffer",
                detail: "carved from another device's memory".into(),
            };
            return refuse(error, buf);
        }
        if buf.len() > self.max_request() {
            let error = Error::TooLarge {
                len: buf.len(),
                max: self.max_request(),
            };
            return refuse(error, buf);
        }
        if buf.is_empty() {
            return Ok(buf);
        }
        let span = tracing::trace_span!("vfio.buffer", algo = ?self.algo, encrypt, len = buf.len());
        let padded = Layout::new(self.algo, buf.len()).padded;
        let (input, output) = (buf.half_at(buf.active), buf.half_at(1 - buf.active));
        let written = (|| {
            let dma = &buf.dma;
            let id = self.ids[usize::from(!encrypt)];
            dma.write(
                HEADER_AT,
                &protocol::cipher_request(self.algo, id, encrypt, padded),
            )?;
            dma.write(IV_AT, iv)?;
            dma.write_u8(STATUS_AT, NOT_WRITTEN)?;
            let mut chain = Chain::empty();
            chain.add(dma.segment(HEADER_AT, protocol::HEADER_LEN, false));
            if !iv.is_empty() {
                chain.add(dma.segment(IV_AT, iv.len(), false));
            }
            chain.add(dma.segment(input, padded, false));
            chain.add(dma.segment(output, padded, true));
            chain.add(dma.segment(STATUS_AT, 1, true));
            crate::virtqueue::write_table(dma, TABLE_AT, chain.segments())?;
            Ok::<_, Error>(chain)
        })();
        let chain = match written {
            Ok(chain) => chain,
            Err(error) => return refuse(error, buf),
        };
        let (dma, len, half, active) = buf.into_parts();
        let table = dma.iova(TABLE_AT);
        let rescue = Rescue { at: input, len };
        let deadline = self.timeout.map(|t| Deadline::after(t.for_len(len)));
        let mut dma = Some(dma);
        let r: Result<DmaBuf, (Error, Option<Vec<u8>>)> = async {
            // Submitted (waiting for room in the ring if need be), then
            // awaited: within the timeout both — the queue keeps the
            // deadline with the ticket, no timer a request — the ticket
            // kept here so that the input can still be read if it passes.
            let submitted = self
                .dev
                .enqueue_one(&mut dma, chain, table, Some(rescue), deadline);
            let mut ticket = Deadline::bound(deadline, submitted)
                .await
                .map_err(|e| (e, None))?;
            match self.dev.wait_ticket(&mut ticket).await {
                Ok((done, _)) => Ok(done),
                // Completed as the timeout fired: the result stands.
                // Otherwise the input half (which the device only reads),
                // from wherever the queue keeps the memory now: in the
                // device, or copied out when the device failed.
                Err(error) => match ticket.give_up() {
                    Ok((done, _)) => Ok(done),
                    Err(copied) => Err((error, copied.map(|c| c.to_vec()))),
                },
            }
        }
        .instrument(span)
        .await;
        match r {
            Ok(done) => match done.read_u8(STATUS_AT) {
                Ok(protocol::STATUS_OK) => Ok(DmaBuffer::from_parts(done, len, half, 1 - active)),
                // Completed without a status written: the device handed
                // back a request it did not process, and may write it
                // still. It is not trusted again (its requests fail, their
                // memory parked with this one), and the buffer is not lent
                // out again: the input comes back copied.
                Ok(NOT_WRITTEN) => {
                    let mut copy = vec![0u8; len];
                    let copied = done.read(input, &mut copy);
                    let why = "completed a buffer request without writing its status";
                    self.dev
                        .broken(&self.dev.data, Error::Broken(why.into()), vec![done]);
                    let buf = match copied {
                        Ok(()) => Returned::Copied(copy),
                        Err(_) => Returned::Lost,
                    };
                    Err(BufferFailed {
                        error: Error::Broken(why.into()),
                        buf,
                    })
                }
                // Refused: the input half is as it was.
                Ok(status) => refuse(
                    Error::Status { status },
                    DmaBuffer::from_parts(done, len, half, active),
                ),
                Err(error) => refuse(error, DmaBuffer::from_parts(done, len, half, active)),
            },
            Err((error, copied)) => {
                let buf = match (dma.take(), copied) {
                    // Never submitted: the buffer is still here, untouched.
                    (Some(d), _) => {
                        Returned::Device(Box::new(DmaBuffer::from_parts(d, len, half, active)))
                    }
                    (None, Some(input)) => Returned::Copied(input),
                    (None, None) => Returned::Lost,
                };
                Err(BufferFailed { error, buf })
            }
        }
    }

    /// `data` in requests of at most [`CipherSession::max_request`] bytes,
    /// the IV chained ([`next_iv`]), into a fresh buffer (wiped if the
    /// request fails or is given up).
    async fn chained(
        &self,
        encrypt: bool,
        iv: &[u8],
        data: &[u8],
    ) -> Result<Zeroizing<Vec<u8>>, Error> {
        let mut out = Zeroizing::new(vec![0u8; data.len()]);
        let mut iv = Zeroizing::new(iv.to_vec());
        let max = self.max_request();
        for (piece, dest) in data.chunks(max).zip(out.chunks_mut(max)) {
            let rx = self.start(encrypt, &iv, piece, None).await?;
            self.collect(rx, Layout::new(self.algo, piece.len()), dest)
                .await?;
            next_iv(self.algo, encrypt, &mut iv, piece, dest);
        }
        Ok(out)
    }

    /// Sends one request, waiting only for room in the queue.
    /// Its ticket expires at `deadline`, which also bounds the waits for
    /// memory and for room in the ring (with a timer only if they wait).
    async fn start(
        &self,
        encrypt: bool,
        iv: &[u8],
        data: &[u8],
        deadline: Option<Deadline>,
    ) -> Result<Ticket<&Queue>, Error> {
        let bytes = Layout::new(self.algo, data.len()).bytes();
        let dma = Deadline::bound(deadline, self.dev.pool.alloc(bytes)).await?;
        let chain = self.write_request(&dma, encrypt, iv, data)?;
        let table = dma.iova(TABLE_AT);
        let mut dma = Some(dma);
        Deadline::bound(
            deadline,
            self.dev.enqueue_one(&mut dma, chain, table, None, deadline),
        )
        .await
    }

    /// Writes a whole request into `dma` (header, IV, input, status "not
    /// written"); its descriptor chain.
    fn write_request(
        &self,
        dma: &DmaBuf,
        encrypt: bool,
        iv: &[u8],
        data: &[u8],
    ) -> Result<Chain, Error> {
        let layout = Layout::new(self.algo, data.len());
        let id = self.ids[usize::from(!encrypt)];
        dma.write(
            0,
            &protocol::cipher_request(self.algo, id, encrypt, layout.padded),
        )?;
        dma.write(IV_AT, iv)?;
        dma.write_u8(STATUS_AT, 0xff)?;
        layout.write_input(dma, data)?;
        layout.write_chain(dma, iv.len())
    }

    /// A request for `data` written into the device's DMA memory once, to
    /// be sent any number of times by [`CipherSession::run_burst`] (the
    /// zero-copy path: change its input or IV in place between runs).
    ///
    /// # Errors
    /// As for [`CipherSession::encrypt`]; [`Error::TooLarge`] above the
    /// largest single request ([`CipherSession::max_request`]).
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is allocated until it returns.
    pub async fn prepare(
        &self,
        encrypt: bool,
        iv: &[u8],
        data: &[u8],
    ) -> Result<DmaRequest, Error> {
        self.check(iv, data.len())?;
        if data.is_empty() || data.len() > self.max_request() {
            return Err(Error::TooLarge {
                len: data.len(),
                max: self.max_request(),
            });
        }
        let layout = Layout::new(self.algo, data.len());
        let dma = self.dev.pool.alloc(layout.bytes()).await?;
        let chain = self.write_request(&dma, encrypt, iv, data)?;
        Ok(DmaRequest {
            dma,
            chain,
            session: self.ids[usize::from(!encrypt)],
            encrypt,
            layout,
            iv_len: iv.len(),
            status: None,
        })
    }

    /// Sends every request of `burst` (prepared on this session) with one
    /// notification of the device for as many as the queue takes, then
    /// waits for all of them — polling while completions come, on the
    /// interrupt once the device goes quiet. Each request comes back with
    /// its own result ([`DmaRequest::result`]).
    ///
    /// # Errors
    /// [`Error::Invalid`] for a request of another session (nothing is
    /// sent); [`Error::Gone`] if the device was reset or removed, and
    /// [`Error::Timeout`] past the session's timeout (for the burst's
    /// bytes together): the requests are lost — their memory stays with
    /// the driver until the device can no longer write it.
    ///
    /// # Cancel safety
    /// Cancel safe in the sense that matters: the requests' DMA memory
    /// stays with the driver until the device completes them (or is reset);
    /// the requests themselves are consumed.
    pub async fn run_burst(&self, burst: Vec<DmaRequest>) -> Result<Vec<DmaRequest>, Error> {
        let mut bytes = 0usize;
        for r in &burst {
            if r.session != self.ids[usize::from(!r.encrypt)] || !r.dma.same_pool(&self.dev.pool) {
                return Err(Error::Invalid {
                    what: "request",
                    detail: "prepared on another session".into(),
                });
            }
            r.dma.write_u8(STATUS_AT, 0xff)?;
            bytes = bytes.saturating_add(r.len());
        }
        // The burst holds the requests while the device has them: nothing
        // is moved per request, and a dropped future (or one given up by
        // the timeout) leaves them with the queue until they complete.
        let state = Arc::new(Burst::new(burst));
        self.within(bytes, async {
            self.dev.enqueue_burst(&state).await?;
            self.dev.wait_burst(&self.dev.data, &state).await
        })
        .await?;
        let mut done = state.take();
        for r in &mut done {
            r.status = Some(r.dma.read_u8(STATUS_AT)?);
        }
        Ok(done)
    }

    /// Waits for a started request; its DMA buffer if the device succeeded.
    async fn finish(&self, mut ticket: Ticket<&Queue>) -> Result<DmaBuf, Error> {
        let (dma, _) = self.dev.wait_ticket(&mut ticket).await?;
        match dma.read_u8(STATUS_AT)? {
            protocol::STATUS_OK => Ok(dma),
            status => Err(Error::Status { status }),
        }
    }
}

/// How many units of `unit_bytes` (DMA bytes each) one request keeps in
/// the device at once: [`UNITS_IN_FLIGHT`], and no more than a quarter of
/// a `pool_bytes` pool, but always one.
pub(crate) fn unit_window(pool_bytes: usize, unit_bytes: usize) -> usize {
    let unit = unit_bytes.next_multiple_of(UNIT).max(UNIT);
    (pool_bytes / 4 / unit).clamp(1, UNITS_IN_FLIGHT)
}

/// The IV of the piece after one of a chained request: CBC's is the last
/// ciphertext block (the output's on encryption, the input's on
/// decryption); CTR's counter advances by the piece's blocks (128-bit
/// big-endian, wrapping); ECB and XTS have none to chain. Pieces shorter
/// than a block (only a CTR request's last) leave CBC's IV as it was.
pub(crate) fn next_iv(algo: CipherAlgo, encrypt: bool, iv: &mut [u8], input: &[u8], output: &[u8]) {
    let Ok(iv) = <&mut [u8; 16]>::try_from(iv) else {
        return;
    };
    match algo {
        CipherAlgo::AesCbc => {
            let ciphertext = if encrypt { output } else { input };
            if let Some(last) = ciphertext
                .len()
                .checked_sub(16)
                .and_then(|at| ciphertext.get(at..))
                .and_then(|b| <&[u8; 16]>::try_from(b).ok())
            {
                *iv = *last;
            }
        }
        CipherAlgo::AesCtr => {
            let blocks = input.len().div_ceil(16) as u128;
            *iv = u128::from_be_bytes(*iv).wrapping_add(blocks).to_be_bytes();
        }
        CipherAlgo::AesEcb | CipherAlgo::AesXts => {}
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
                    match dev.destroy_session(algo, id).await {
                        Ok(()) => {}
                        // A device that stopped answering control requests
                        // (its memory stays with the request until it does).
                        Err(e @ Error::Timeout(_)) => tracing::warn!(
                            address = %dev.address,
                            error = %e,
                            "a dropped session's device session was not destroyed"
                        ),
                        // Suspended or gone meanwhile: the virtio spec has
                        // a reset clear the device's state, its sessions
                        // with it. (QEMU's builtin backend, 7.2 at least,
                        // keeps them until its 256 are used up; creating
                        // one then fails with the device's error status.)
                        Err(e) => tracing::debug!(
                            address = %dev.address,
                            error = %e,
                            "a dropped session's device session was not destroyed"
                        ),
                    }
                }
            });
        }
        self.ids.zeroize();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeout_grows_with_the_length_and_saturates() {
        let t = RequestTimeout {
            fixed: Duration::from_secs(2),
            per_mib: Duration::from_millis(100),
        };
        assert_eq!(t.for_len(0), Duration::from_secs(2));
        assert_eq!(t.for_len(1 << 20), Duration::from_millis(2100));
        assert_eq!(t.for_len(512 << 10), Duration::from_millis(2050));
        assert_eq!(t.for_len(3 << 30), Duration::from_millis(2000 + 307_200));
        // 1 byte: 100 ms / 2^20, in whole nanoseconds.
        assert_eq!(t.for_len(1), Duration::from_nanos(2_000_000_095));
        let forever = RequestTimeout {
            fixed: Duration::MAX,
            per_mib: Duration::MAX,
        };
        assert_eq!(forever.for_len(usize::MAX), Duration::MAX);
        let huge = RequestTimeout {
            fixed: Duration::ZERO,
            per_mib: Duration::MAX,
        };
        assert_eq!(huge.for_len(usize::MAX), Duration::MAX);
        assert!(huge.for_len(1) > Duration::from_secs(1 << 40));
    }
}
