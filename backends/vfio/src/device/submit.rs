//! Submitting requests: data requests and bursts handed to the data queue,
//! control requests (a session's creation and destruction) sent and awaited
//! within the control timeout, and [`CryptoDevice::cipher_session`], which
//! counts a session on the device (`SessionReservation`) before its
//! creation is sent.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{CryptoDevice, DeviceState};
use crate::dma::DmaBuf;
use crate::error::Error;
use crate::protocol::{self, CipherAlgo, HEADER_LEN, SESSION_INPUT_LEN};
use crate::queue::{Burst, Deadline, Queue, Rescue, Ticket};
use crate::request::Chain;
use crate::session::CipherSession;
use crate::virtqueue::Segment;

/// How often a control request waiting for its interrupt looks at the
/// ring itself. Its completion otherwise has one path, the interrupt to
/// the completion task (the data queue has pollers and a watchdog too):
/// twice in CI under load a session's background destroy held its DMA
/// unit past two 5 s control timeouts, as if the interrupt never came.
const CONTROL_LOOK_EVERY: std::time::Duration = std::time::Duration::from_millis(50);

impl CryptoDevice {
    /// A cipher session: one device session per direction, with `key`.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a key length the mode does not take;
    /// [`Error::Status`] if the device refuses the session (e.g. `NOTSUPP`
    /// for a mode its backend lacks).
    ///
    /// # Cancel safety
    /// Not cancel safe in effect: a dropped future may leave a device
    /// session created and never destroyed. By the virtio spec a reset
    /// clears it; QEMU's builtin backend keeps it (it holds 256).
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

/// A session counted on a device while it is being created: uncounted if
/// the creation fails or its future is dropped.
struct SessionReservation<'a>(Option<&'a DeviceState>);

impl<'a> SessionReservation<'a> {
    fn new(inner: &'a DeviceState) -> Self {
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

impl DeviceState {
    /// Submits a data request (its memory all in `buf`, its chain also
    /// written as an indirect table at `table`), waiting for room in the
    /// queue: [`Queue::enqueue_one`]. Its ticket expires at `deadline`
    /// (the wait for room is the caller's to bound: [`Deadline::bound`]).
    ///
    /// # Cancel safety
    /// As for [`Queue::enqueue_one`].
    ///
    /// Not an `async fn` of its own: the queue's future is returned as it
    /// is, without a layer holding the arguments a second time.
    pub(crate) fn enqueue_one<'q, 'b>(
        &'q self,
        buf: &'b mut Option<DmaBuf>,
        chain: Chain,
        table: u64,
        rescue: Option<Rescue>,
        deadline: Option<Deadline>,
    ) -> impl std::future::Future<Output = Result<Ticket<&'q Queue>, Error>> + use<'q, 'b> {
        self.data
            .enqueue_one(self, buf, chain, Some(table), rescue, deadline)
    }

    /// Submits the requests of `burst`: [`Queue::enqueue_burst`].
    ///
    /// # Cancel safety
    /// As for [`Queue::enqueue_burst`].
    pub(crate) async fn enqueue_burst(&self, burst: &Arc<Burst>) -> Result<(), Error> {
        self.data.enqueue_burst(self, burst).await
    }

    /// Submits `chain` (whose memory is all in `buf`) and waits for it on
    /// the interrupt (control requests are rare; no spinning), looking at
    /// the ring itself every [`CONTROL_LOOK_EVERY`] in case the interrupt
    /// never comes, within the control timeout.
    async fn submit(
        &self,
        q: &Queue,
        buf: DmaBuf,
        chain: &[Segment],
    ) -> Result<(DmaBuf, u32), Error> {
        let limit = std::time::Duration::from_nanos(self.control_timeout.load(Ordering::Relaxed));
        let request = async {
            let mut ticket = q
                .enqueue_one(self, &mut Some(buf), Chain::new(chain)?, None, None, None)
                .await?;
            loop {
                tokio::select! {
                    r = ticket.sleep() => break r.map_err(|()| self.failure()),
                    () = tokio::time::sleep(CONTROL_LOOK_EVERY) => {
                        self.drain(q);
                    }
                }
            }
        };
        tokio::time::timeout(limit, request)
            .await
            .unwrap_or(Err(Error::Timeout(limit)))
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
