//! CRC sessions.

use core::fmt;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use std::sync::Arc;

use crypto_offload_fallback::{Crc, CrcPlan, combine};

use super::request::{CpuJob, OpenContext, Operation, Request};
use super::{BoxedRequest, Contexts};
use crate::alg::{Algorithm, CrcAlg};
use crate::backend::{CrcContext, Failed, SharedBackend};
use crate::buffer::{Buffer, IoBuf};
use crate::cost::Direction;
use crate::cpu::{checksum_split, map_error};
use crate::error::{Error, RequestError};
use crate::select::Request as Asked;
use crate::slot::Slots;

/// A streaming CRC.
///
/// Each update may run on a different backend: a backend computes the CRC of
/// its buffer alone and the session folds it into the running value with CRC
/// combination, so the result is the same wherever each piece ran.
///
/// ```
/// # futures::executor::block_on(async {
/// use crypto_offload::{CrcAlg, Offload};
///
/// let offload = Offload::builder().build()?;
/// let mut crc = offload.crc(CrcAlg::Crc32Iscsi).await?;
/// let buf = crc.update(b"1234".to_vec()).await?;   // the buffer comes back
/// crc.update_from_slice(b"56789");
/// assert_eq!(crc.finalize(), 0xe306_9283);
/// crc.verify(0xe306_9283)?;
/// # let _ = buf;
/// # Ok::<(), crypto_offload::Error>(()) }).unwrap();
/// ```
pub struct CrcSession {
    alg: CrcAlg,
    state: Crc,
    on: Engines,
}

/// What a CRC session's requests read but never change: the algorithm, the
/// CPU's implementations for it, the slots and the session's contexts on
/// them (one reference for an update to hold beside the running CRC it
/// changes, so the future stays small).
struct Engines {
    alg: CrcAlg,
    /// The running CRC's choice, resolved once for one-shots.
    plan: CrcPlan,
    contexts: Contexts<dyn CrcContext>,
    slots: Arc<Slots>,
}

impl Engines {
    /// The CRC of `buf` alone on the blocking pool, in `parts` pieces on
    /// as many threads, combined.
    fn spawn_checksum<B: Buffer>(&self, mut buf: B, parts: usize) -> CpuJob<u64, B> {
        let plan = self.plan;
        tokio::task::spawn_blocking(move || (Ok(checksum_split(plan, buf.bytes_mut(), parts)), buf))
    }
}

impl fmt::Debug for CrcSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CrcSession")
            .field("alg", &self.alg)
            .field("len", &self.state.len())
            .field("engines", &self.on.contexts.open_on(&self.on.slots))
            .finish_non_exhaustive()
    }
}

impl CrcSession {
    pub(crate) async fn start(slots: Arc<Slots>, alg: CrcAlg) -> Result<Self, Error> {
        let contexts =
            Contexts::open(&slots, alg.into(), |b| async move { b.open_crc(alg).await }).await?;
        let choice = slots.cpu.crc_choice(alg);
        Ok(CrcSession {
            alg,
            state: Crc::with_choice(alg, choice),
            on: Engines {
                alg,
                plan: CrcPlan::new(alg, choice),
                contexts,
                slots,
            },
        })
    }

    /// The algorithm.
    pub fn alg(&self) -> CrcAlg {
        self.alg
    }

    /// The backend an update of `len` bytes would go to now.
    pub fn backend_for(&self, len: usize) -> &str {
        let asked = Asked::new(self.on.alg.into(), Direction::Encrypt, len);
        self.on.slots[crate::select::choose(&self.on.slots, &asked).0].name()
    }

    /// Feeds `buf` and hands it back.
    ///
    /// # Errors
    /// None in practice: a backend failure is replayed on the CPU. The
    /// `Result` keeps the shape of the other sessions.
    ///
    /// # Cancel safety
    /// If the future is dropped before it completes, the update may or may
    /// not have been applied: drop the session (or [`reset`](Self::reset)
    /// it) rather than continue the stream.
    #[inline]
    pub fn update<B: Buffer>(&mut self, buf: B) -> CrcUpdate<'_, B> {
        CrcUpdate(Request::new(
            CrcOp {
                crc: &mut self.state,
                on: &self.on,
            },
            buf,
        ))
    }

    /// The CRC of `buf` alone, handed back with it: a one-shot that takes
    /// `&self`, so one session serves any number of checksums in flight
    /// (sectors, packets) from any number of tasks. The running CRC of
    /// [`update`](Self::update) is neither read nor changed.
    ///
    /// ```
    /// # futures::executor::block_on(async {
    /// use crypto_offload::{CrcAlg, Offload};
    ///
    /// let offload = Offload::builder().build()?;
    /// let crc = offload.crc(CrcAlg::CRC32C).await?;
    /// let (a, b) = futures::future::join(
    ///     crc.checksum(b"123456789".to_vec()),
    ///     crc.checksum(vec![0u8; 4096]),
    /// )
    /// .await;
    /// assert_eq!(a?.1, 0xe306_9283);
    /// assert_eq!(b?.1, 0x98f9_4189);
    /// # Ok::<(), crypto_offload::Error>(()) }).unwrap();
    /// ```
    ///
    /// # Errors
    /// None in practice: a backend failure is replayed on the CPU.
    ///
    /// # Cancel safety
    /// Dropping the future drops the request (the buffer with it, once an
    /// engine holding it lets go); the session is unaffected.
    #[inline]
    pub fn checksum<B: Buffer>(&self, buf: B) -> CrcChecksum<'_, B> {
        CrcChecksum(Request::new(ChecksumOp { on: &self.on }, buf))
    }

    /// Feeds borrowed bytes, on the CPU, synchronously.
    pub fn update_from_slice(&mut self, data: &[u8]) {
        self.state.update(data);
    }

    /// The CRC of everything fed so far (the stream can go on). Every CRC
    /// comes as a `u64`; a CRC-32's is in the low 32 bits
    /// ([`finalize_u32`](Self::finalize_u32) gives it as a `u32`).
    pub fn finalize(&self) -> u64 {
        self.state.finalize()
    }

    /// A CRC-32's value as a `u32`; `None` for a CRC-64.
    ///
    /// ```
    /// # futures::executor::block_on(async {
    /// use crypto_offload::{CrcAlg, Offload};
    ///
    /// let offload = Offload::builder().build()?;
    /// let mut crc = offload.crc(CrcAlg::CRC32C).await?;
    /// crc.update_from_slice(b"123456789");
    /// let value: u32 = crc.finalize_u32().expect("a CRC-32");
    /// assert_eq!(value.to_be_bytes(), [0xe3, 0x06, 0x92, 0x83]);
    /// assert_eq!(offload.crc(CrcAlg::Crc64Nvme).await?.finalize_u32(), None);
    /// # Ok::<(), crypto_offload::Error>(()) }).unwrap();
    /// ```
    pub fn finalize_u32(&self) -> Option<u32> {
        (self.alg.width() == 32).then(|| self.state.finalize() as u32)
    }

    /// Bytes fed so far.
    pub fn len(&self) -> u64 {
        self.state.len()
    }

    /// Whether nothing has been fed.
    pub fn is_empty(&self) -> bool {
        self.state.is_empty()
    }

    /// Starts over.
    pub fn reset(&mut self) {
        self.state.reset();
    }

    /// Checks the CRC of everything fed so far.
    ///
    /// # Errors
    /// [`Error::ChecksumMismatch`] with both values.
    pub fn verify(&self, expected: u64) -> Result<(), Error> {
        self.state
            .verify(expected)
            .map_err(|e| map_error(self.on.alg.into(), e))
    }
}

/// The future of [`CrcSession::update`].
#[must_use = "futures do nothing unless awaited"]
pub struct CrcUpdate<'a, B: Buffer>(Request<'a, CrcOp<'a>, B>);

impl<B: Buffer> Future for CrcUpdate<'_, B> {
    type Output = Result<B, RequestError<B>>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.get_mut().0).poll(cx)
    }
}

impl<B: Buffer> fmt::Debug for CrcUpdate<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CrcUpdate").finish_non_exhaustive()
    }
}

/// The future of [`CrcSession::checksum`]: the buffer and its CRC.
#[must_use = "futures do nothing unless awaited"]
pub struct CrcChecksum<'a, B: Buffer>(Request<'a, ChecksumOp<'a>, B>);

impl<B: Buffer> Future for CrcChecksum<'_, B> {
    type Output = Result<(B, u64), RequestError<B>>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.get_mut().0).poll(cx)
    }
}

impl<B: Buffer> fmt::Debug for CrcChecksum<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CrcChecksum").finish_non_exhaustive()
    }
}

/// A one-shot: the CRC of the buffer alone, nothing of the session's
/// running state.
pub(crate) struct ChecksumOp<'a> {
    on: &'a Engines,
}

impl<'a, B: Buffer> Operation<'a, B> for ChecksumOp<'a> {
    type Params = ();
    type Ctx = dyn CrcContext;
    type EngineOut = (IoBuf, u64);
    type JobOut = u64;
    type Output = (B, u64);
    type Caller = CrcAlg;
    const NAME: &'static str = "crc checksum";

    #[inline]
    fn alg(&self) -> Algorithm {
        self.on.alg.into()
    }

    #[inline]
    fn dir(&self) -> Direction {
        Direction::Encrypt
    }

    #[inline]
    fn slots(&self) -> &'a Arc<Slots> {
        &self.on.slots
    }

    fn contexts(&self) -> &'a Contexts<dyn CrcContext> {
        &self.on.contexts
    }

    #[inline]
    fn check(&mut self, _: &mut B) -> Result<(), Error> {
        Ok(())
    }

    #[inline]
    fn run_cpu(&mut self, _: &(), mut buf: B) -> Result<(B, u64), RequestError<B>> {
        let crc = self.on.plan.checksum(buf.bytes_mut());
        Ok((buf, crc))
    }

    fn cpu_parts(&self, _: &(), _len: usize, offered: usize) -> usize {
        offered
    }

    fn spawn_cpu(&self, _: (), buf: B, parts: usize) -> CpuJob<u64, B> {
        self.on.spawn_checksum(buf, parts)
    }

    fn job_done(&mut self, _: &(), crc: u64, buf: B) -> (B, u64) {
        (buf, crc)
    }

    fn caller(&self) -> CrcAlg {
        self.on.alg
    }

    fn open_context(alg: CrcAlg, backend: &'a SharedBackend) -> OpenContext<'a, dyn CrcContext> {
        backend.open_crc(alg)
    }

    fn call(
        _: CrcAlg,
        ctx: &'a dyn CrcContext,
        _: (),
        io: IoBuf,
    ) -> BoxedRequest<'a, (IoBuf, u64)> {
        ctx.checksum(io)
    }

    fn engine_done(
        &mut self,
        _: &(),
        done: Result<(IoBuf, u64), Failed>,
    ) -> Result<Result<(B, u64), RequestError<B>>, Failed> {
        let (io, crc) = done?;
        Ok(Ok((B::from_io(io), crc)))
    }
}

/// An update: the session's running CRC (borrowed apart from its
/// contexts, which an engine request borrows meanwhile).
pub(crate) struct CrcOp<'a> {
    crc: &'a mut Crc,
    on: &'a Engines,
}

impl CrcOp<'_> {
    /// Folds the CRC of a `len`-byte piece into the running value.
    fn fold(&mut self, piece: u64, len: usize) {
        let len = len as u64;
        let alg = self.on.alg;
        let value = combine(alg, self.crc.finalize(), piece, len);
        *self.crc = Crc::resume_with_choice(
            alg,
            self.crc.choice(),
            value,
            self.crc.len().saturating_add(len),
        );
    }
}

impl<'a, B: Buffer> Operation<'a, B> for CrcOp<'a> {
    /// The length sent: what a piece's CRC is folded in with, whatever
    /// length comes back.
    type Params = usize;
    type Ctx = dyn CrcContext;
    type EngineOut = (IoBuf, u64);
    type JobOut = u64;
    type Output = B;
    type Caller = CrcAlg;
    const NAME: &'static str = "crc";

    #[inline]
    fn alg(&self) -> Algorithm {
        self.on.alg.into()
    }

    #[inline]
    fn dir(&self) -> Direction {
        Direction::Encrypt
    }

    #[inline]
    fn slots(&self) -> &'a Arc<Slots> {
        &self.on.slots
    }

    fn contexts(&self) -> &'a Contexts<dyn CrcContext> {
        &self.on.contexts
    }

    #[inline]
    fn check(&mut self, buf: &mut B) -> Result<usize, Error> {
        Ok(buf.bytes_mut().len())
    }

    #[inline]
    fn run_cpu(&mut self, _: &usize, mut buf: B) -> Result<B, RequestError<B>> {
        self.crc.update(buf.bytes_mut());
        Ok(buf)
    }

    fn cpu_parts(&self, _: &usize, _len: usize, offered: usize) -> usize {
        offered
    }

    fn spawn_cpu(&self, _: usize, buf: B, parts: usize) -> CpuJob<u64, B> {
        self.on.spawn_checksum(buf, parts)
    }

    fn job_done(&mut self, &sent: &usize, piece: u64, buf: B) -> B {
        self.fold(piece, sent);
        buf
    }

    fn caller(&self) -> CrcAlg {
        self.on.alg
    }

    fn open_context(alg: CrcAlg, backend: &'a SharedBackend) -> OpenContext<'a, dyn CrcContext> {
        backend.open_crc(alg)
    }

    fn call(
        _: CrcAlg,
        ctx: &'a dyn CrcContext,
        _: usize,
        io: IoBuf,
    ) -> BoxedRequest<'a, (IoBuf, u64)> {
        ctx.checksum(io)
    }

    fn engine_done(
        &mut self,
        &sent: &usize,
        done: Result<(IoBuf, u64), Failed>,
    ) -> Result<Result<B, RequestError<B>>, Failed> {
        let (io, piece) = done?;
        self.fold(piece, sent);
        Ok(Ok(B::from_io(io)))
    }
}
