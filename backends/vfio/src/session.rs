//! Cipher sessions on the device: one device session per direction,
//! requests copied through the DMA pool (or prepared in it), long ones
//! chained, XTS data units all in flight at once.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::oneshot;
use tracing::Instrument;
use zeroize::Zeroize;

use crate::device::{Inner, MAX_REQUEST};
use crate::dma::{DmaBuf, UNIT};
use crate::error::{Error, Failed};
use crate::protocol::{self, CipherAlgo};
use crate::queue::Burst;
use crate::request::{Chain, DmaRequest, IV_AT, Layout, STATUS_AT, TABLE_AT};

/// A cipher session on the device: one device session for each direction,
/// destroyed when this is dropped.
pub struct CipherSession {
    pub(crate) dev: Arc<Inner>,
    pub(crate) algo: CipherAlgo,
    /// Encrypt and decrypt session ids.
    pub(crate) ids: [u64; 2],
    /// Destroyed already (by [`CipherSession::close`]).
    pub(crate) closed: bool,
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
                dma.read(Layout::new(self.algo, unit_len).out_at, piece)?;
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
            .and_then(|dma| dma.read(Layout::new(self.algo, buf.len()).out_at, &mut buf));
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
            dma.read(Layout::new(self.algo, piece.len()).out_at, dest)?;
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
        let dma = self
            .dev
            .pool
            .alloc(Layout::new(self.algo, data.len()).bytes())
            .await?;
        let chain = self.write_request(&dma, encrypt, iv, data)?;
        self.dev
            .enqueue_one(&self.dev.data, dma, chain, Some(TABLE_AT))
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
    /// largest single request ([`MAX_REQUEST`] or the device's limit).
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
    /// sent); [`Error::Gone`] if the device was reset or removed (the
    /// requests are lost: their memory stays with the driver until the
    /// device can no longer write it).
    ///
    /// # Cancel safety
    /// Cancel safe in the sense that matters: the requests' DMA memory
    /// stays with the driver until the device completes them (or is reset);
    /// the requests themselves are consumed.
    pub async fn run_burst(&self, burst: Vec<DmaRequest>) -> Result<Vec<DmaRequest>, Error> {
        for r in &burst {
            if r.session != self.ids[usize::from(!r.encrypt)] || !r.dma.same_pool(&self.dev.pool) {
                return Err(Error::Invalid {
                    what: "request",
                    detail: "prepared on another session".into(),
                });
            }
            r.dma.write_u8(STATUS_AT, 0xff)?;
        }
        // The burst holds the requests while the device has them: nothing
        // is moved per request, and a dropped future leaves them with the
        // queue until they complete.
        let state = Arc::new(Burst::new(burst));
        self.dev.enqueue_burst(&self.dev.data, &state).await?;
        self.dev.wait_burst(&self.dev.data, &state).await?;
        let mut done = state.take();
        for r in &mut done {
            r.status = Some(r.dma.read_u8(STATUS_AT)?);
        }
        Ok(done)
    }

    /// Waits for a started request; its DMA buffer if the device succeeded.
    async fn finish(&self, rx: oneshot::Receiver<(DmaBuf, u32)>) -> Result<DmaBuf, Error> {
        let (dma, _) = self.dev.wait(&self.dev.data, rx).await?;
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
