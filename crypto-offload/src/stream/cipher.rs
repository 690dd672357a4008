//! Cipher streams: a [`CipherSession`] over `AsyncRead` / `AsyncWrite`,
//! several requests in flight.

use core::pin::Pin;
use core::task::{Context, Poll, ready};
use std::io;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::queue::{Chunk, Queue, Running};
use crate::alg::{Algorithm, CipherMode};
use crate::cost::Direction;
use crate::error::{Error, LengthRule};
use crate::session::{CipherSession, IvInput};

/// How a cipher stream cuts its data into requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamOptions {
    depth: usize,
    chunk: usize,
}

impl Default for StreamOptions {
    /// Four requests of 64 KiB in flight (384 KiB held at most).
    fn default() -> Self {
        StreamOptions {
            depth: 4,
            chunk: 64 << 10,
        }
    }
}

impl StreamOptions {
    /// The largest request a stream sends: 16 MiB.
    pub const MAX_CHUNK: usize = 16 << 20;

    /// Requests in flight at most (at least 1). CBC encryption chains each
    /// request's IV to the previous one's last ciphertext block, so it
    /// always runs one at a time.
    pub fn depth(mut self, depth: usize) -> Self {
        self.depth = depth.max(1);
        self
    }

    /// Bytes a request carries: at most [`MAX_CHUNK`](Self::MAX_CHUNK),
    /// rounded down to whole blocks (CBC, CTR) or data units (XTS), and at
    /// least one. The stream holds up to (`depth` + 2) × `chunk` bytes: the
    /// requests in flight, the one being gathered and the one being handed
    /// on.
    pub fn chunk(mut self, len: usize) -> Self {
        self.chunk = len;
        self
    }

    /// Requests in flight at most.
    pub fn get_depth(&self) -> usize {
        self.depth
    }

    /// Bytes a request carries, before rounding to the mode's granule.
    pub fn get_chunk(&self) -> usize {
        self.chunk
    }
}

/// Bytes gathered for the next request: `buf[skip..end]` is the stream's,
/// `buf[..skip]` pads a CTR request that starts inside a counter block.
struct Filling {
    buf: Vec<u8>,
    skip: usize,
    end: usize,
}

/// What a reader and a writer share: the session, where the stream is,
/// and the requests in flight.
struct Pipeline {
    session: Arc<CipherSession>,
    encrypt: bool,
    mode: CipherMode,
    /// Requests carry whole multiples of this (CBC 16, XTS the data unit;
    /// CTR 16, except the last and a flushed one).
    granule: usize,
    chunk: usize,
    depth: usize,
    /// The IV of the next request.
    iv: [u8; 16],
    /// CTR: bytes of the next request's first counter block already used.
    skip: usize,
    /// Bytes sent so far (for the error a trailing partial unit gets).
    sent: u64,
    queue: Queue,
    spare: Vec<Vec<u8>>,
    /// The error that ended the stream: its kind and message, which every
    /// later call repeats.
    failed: Option<(io::ErrorKind, String)>,
}

impl Pipeline {
    fn new(
        session: Arc<CipherSession>,
        dir: Direction,
        iv: impl IvInput<16>,
        options: StreamOptions,
    ) -> Result<(Self, Filling), Error> {
        let alg: Algorithm = session.alg().into();
        let iv = iv.into_block().map_err(|len| Error::IvLength {
            alg,
            len: len as usize,
            expected: 16,
        })?;
        let mode = session.alg().mode();
        let granule = match mode {
            CipherMode::Xts => session.data_unit().ok_or(Error::DataLength {
                alg,
                len: 0,
                rule: LengthRule::DataUnitNotSet,
            })?,
            CipherMode::Cbc | CipherMode::Ctr => 16,
        };
        let chunk = (options.chunk.min(StreamOptions::MAX_CHUNK) / granule).max(1) * granule;
        let mut pipe = Pipeline {
            session,
            encrypt: dir == Direction::Encrypt,
            mode,
            granule,
            chunk,
            depth: options.depth,
            iv,
            skip: 0,
            sent: 0,
            queue: Queue::default(),
            spare: Vec::new(),
            failed: None,
        };
        let first = pipe.fresh();
        Ok((pipe, first))
    }

    /// A filling for the next request, its room `chunk` bytes after the pad.
    fn fresh(&mut self) -> Filling {
        let buf = self.spare.pop().unwrap_or_else(|| vec![0; self.chunk + 16]);
        Filling {
            buf,
            skip: self.skip,
            end: self.skip,
        }
    }

    fn room(&self, f: &Filling) -> usize {
        f.skip + self.chunk - f.end
    }

    /// Whether another request may start: fewer than `depth` in flight,
    /// and for CBC encryption none (its IV is the last one's output).
    fn can_send(&self) -> bool {
        if self.mode == CipherMode::Cbc && self.encrypt {
            self.queue.is_empty()
        } else {
            self.queue.len() < self.depth
        }
    }

    /// Ends the stream with `e`: the requests in flight are dropped (an
    /// engine holding a buffer keeps it until it is done), and every later
    /// call fails with `e`'s kind.
    fn fail(&mut self, e: io::Error) -> io::Error {
        self.failed = Some((e.kind(), e.to_string()));
        self.queue.clear();
        e
    }

    /// The error of a call after the stream failed.
    fn failed_before(&self) -> Option<io::Error> {
        self.failed
            .as_ref()
            .map(|(kind, msg)| io::Error::new(*kind, format!("the stream failed earlier: {msg}")))
    }

    /// Sends the filling's data — all of it for CTR, its whole blocks or
    /// data units otherwise (the rest moves to the next filling) — and
    /// starts the next filling. Nothing happens when there is not a whole
    /// granule to send.
    fn send(&mut self, f: &mut Filling) {
        let data = f.end - f.skip;
        let whole = if self.mode == CipherMode::Ctr {
            data
        } else {
            data / self.granule * self.granule
        };
        if whole == 0 {
            return;
        }
        let rest = data - whole;
        let end = f.skip + whole;
        let mut buf = core::mem::take(&mut f.buf);
        let skip = f.skip;
        let mut next = self.spare.pop().unwrap_or_else(|| vec![0; self.chunk + 16]);
        // Only CBC and XTS leave a rest, and their requests have no pad.
        next[..rest].copy_from_slice(&buf[end..end + rest]);
        buf.truncate(end);
        self.start(buf, skip, whole);
        *f = Filling {
            buf: next,
            skip: self.skip,
            end: self.skip + rest,
        };
    }

    /// At the end of the stream, after [`send`](Self::send): what is left
    /// in the filling is an error unless it is nothing (CBC and XTS streams
    /// end on a block or data unit; CTR sends everything).
    fn check_end(&self, f: &Filling) -> Result<(), Error> {
        let left = f.end - f.skip;
        if left == 0 {
            return Ok(());
        }
        let rule = match self.mode {
            CipherMode::Xts => LengthRule::MultipleOfDataUnit(self.granule),
            _ => LengthRule::MultipleOfBlock,
        };
        Err(Error::DataLength {
            alg: self.session.alg().into(),
            len: usize::try_from(self.sent)
                .unwrap_or(usize::MAX)
                .saturating_add(left),
            rule,
        })
    }

    /// Starts a request on `buf` (`skip` bytes of pad, then `len` of data)
    /// with the stream's IV, and moves the IV past it.
    fn start(&mut self, buf: Vec<u8>, skip: usize, len: usize) {
        let iv = self.iv;
        match self.mode {
            CipherMode::Ctr => {
                let blocks = (skip + len) / 16;
                self.iv = (u128::from_be_bytes(iv).wrapping_add(blocks as u128)).to_be_bytes();
                self.skip = (skip + len) % 16;
            }
            CipherMode::Xts => {
                let units = (len / self.granule) as u128;
                self.iv = (u128::from_le_bytes(iv).wrapping_add(units)).to_le_bytes();
            }
            CipherMode::Cbc if !self.encrypt => {
                self.iv.copy_from_slice(&buf[buf.len() - 16..]);
            }
            // CBC encryption: the IV is this request's last output block,
            // taken when it completes (`poll_next`).
            CipherMode::Cbc => {}
        }
        self.sent += len as u64;
        let session = self.session.clone();
        let encrypt = self.encrypt;
        let request: Running = Box::pin(async move {
            if encrypt {
                session.encrypt(iv, buf).await
            } else {
                session.decrypt(iv, buf).await
            }
        });
        self.queue.push(request, skip);
    }

    /// The oldest request's output, once done (see [`Queue::poll_next`]).
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<io::Result<Chunk>>> {
        let out = ready!(self.queue.poll_next(cx));
        Poll::Ready(out.map(|done| match done {
            Ok(c) => {
                if self.mode == CipherMode::Cbc && self.encrypt {
                    self.iv.copy_from_slice(&c.buf[c.buf.len() - 16..]);
                }
                Ok(c)
            }
            Err(e) => Err(self.fail(e)),
        }))
    }

    /// Keeps a drained output buffer for a later request.
    fn recycle(&mut self, mut buf: Vec<u8>) {
        if self.spare.len() <= self.depth && buf.capacity() >= self.chunk + 16 {
            buf.resize(self.chunk + 16, 0);
            self.spare.push(buf);
        }
    }
}

/// Encrypts or decrypts what it reads from an `AsyncRead`.
///
/// It reads ahead: up to [`StreamOptions::depth`] requests of
/// [`StreamOptions::chunk`] bytes each are read from the inner reader and
/// in flight while the caller consumes the output, which comes in stream
/// order. A request is sent when its chunk is full, or — so that a slow
/// source (a socket) is not held back — with what it has when the inner
/// reader has nothing more yet and nothing is in flight.
///
/// Errors: a failed request (rare: a failing engine's requests are
/// replayed on the CPU) and a CBC or XTS stream that ends inside a block or
/// data unit ([`Error::DataLength`], kind `InvalidInput`, after the output
/// of every whole one before it) end the stream: later reads fail with the
/// same kind. The inner reader's errors are passed on after the output of
/// what it delivered before them, and the stream can be read again.
///
/// # Cancel safety
/// `poll_read` keeps its state in the reader, so a `read` future dropped
/// before it completes loses nothing. Dropping the reader drops the
/// requests in flight (an engine holding a buffer keeps it until it is
/// done with it) and what was read ahead.
pub struct CipherReader<R> {
    inner: R,
    pipe: Pipeline,
    filling: Filling,
    /// An output being handed to the caller, and how far.
    out: Option<(Vec<u8>, usize)>,
    eof: bool,
    /// The stream ended inside a block or data unit: the error, handed out
    /// after the output before it.
    end_error: Option<Error>,
    /// The inner reader's error, handed out after the output of what it
    /// delivered before it; reading goes on after it.
    inner_error: Option<io::Error>,
}

impl<R> core::fmt::Debug for CipherReader<R> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CipherReader")
            .field("session", &self.pipe.session)
            .field("in_flight", &self.pipe.queue.len())
            .field("eof", &self.eof)
            .finish_non_exhaustive()
    }
}

impl<R: AsyncRead + Unpin> CipherReader<R> {
    /// A stream that reads from `inner` and encrypts (`Direction::Encrypt`)
    /// or decrypts it with `session`. `iv` is what the session's own
    /// requests take for the stream's first byte: the CTR counter block, the
    /// XTS tweak of the first data unit (`unit.to_le_bytes()`; each later
    /// unit's is one more), or the CBC IV.
    ///
    /// # Errors
    /// [`Error::IvLength`]; [`Error::DataLength`] with
    /// [`LengthRule::DataUnitNotSet`] for an XTS session without
    /// [`with_data_unit`](CipherSession::with_data_unit).
    pub fn new(
        inner: R,
        session: Arc<CipherSession>,
        dir: Direction,
        iv: impl IvInput<16>,
        options: StreamOptions,
    ) -> Result<Self, Error> {
        let (pipe, filling) = Pipeline::new(session, dir, iv, options)?;
        Ok(CipherReader {
            inner,
            pipe,
            filling,
            out: None,
            eof: false,
            end_error: None,
            inner_error: None,
        })
    }

    /// The inner reader.
    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    /// The inner reader, back (what was read ahead is dropped).
    pub fn into_inner(self) -> R {
        self.inner
    }

    /// Reads ahead into fillings and sends them while requests may start;
    /// whether the inner reader is waiting. An inner error is kept (what
    /// came before it is sent) until the output before it is handed out.
    fn read_ahead(&mut self, cx: &mut Context<'_>) -> bool {
        while !self.eof && self.inner_error.is_none() && self.pipe.can_send() {
            let room = self.pipe.room(&self.filling);
            if room == 0 {
                self.pipe.send(&mut self.filling);
                continue;
            }
            let f = &mut self.filling;
            let mut rb = ReadBuf::new(&mut f.buf[f.end..f.end + room]);
            match Pin::new(&mut self.inner).poll_read(cx, &mut rb) {
                Poll::Pending => return true,
                Poll::Ready(Err(e)) => {
                    self.inner_error = Some(e);
                    self.pipe.send(&mut self.filling);
                }
                Poll::Ready(Ok(())) => {
                    let n = rb.filled().len();
                    if n == 0 {
                        self.eof = true;
                        self.pipe.send(&mut self.filling);
                        self.end_error = self.pipe.check_end(&self.filling).err();
                    } else {
                        f.end += n;
                    }
                }
            }
        }
        false
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for CipherReader<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(e) = this.pipe.failed_before() {
            return Poll::Ready(Err(e));
        }
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            if let Some((v, pos)) = &mut this.out {
                let n = buf.remaining().min(v.len() - *pos);
                buf.put_slice(&v[*pos..*pos + n]);
                *pos += n;
                if *pos == v.len()
                    && let Some((v, _)) = this.out.take()
                {
                    this.pipe.recycle(v);
                }
                // Requests a first poll left waiting (tokio's budget) go to
                // their engine now, not after the caller drains this one.
                this.pipe.queue.poll_all(cx);
                return Poll::Ready(Ok(()));
            }
            let waiting = this.read_ahead(cx);
            if waiting && this.pipe.queue.is_empty() {
                // A slow source: send what there is rather than wait for a
                // full chunk.
                this.pipe.send(&mut this.filling);
            }
            match ready!(this.pipe.poll_next(cx)) {
                Some(Ok(c)) => this.out = Some((c.buf, c.skip)),
                Some(Err(e)) => return Poll::Ready(Err(e)),
                None if this.inner_error.is_some() => {
                    if let Some(e) = this.inner_error.take() {
                        return Poll::Ready(Err(e));
                    }
                }
                None if this.eof => {
                    return Poll::Ready(match this.end_error.take() {
                        Some(e) => Err(this.pipe.fail(e.into())),
                        None => Ok(()),
                    });
                }
                // The inner reader registered the waker.
                None => return Poll::Pending,
            }
        }
    }
}

/// Encrypts or decrypts what is written to it, and writes the result to an
/// `AsyncWrite`.
///
/// Writes are gathered into requests of [`StreamOptions::chunk`] bytes, up
/// to [`StreamOptions::depth`] in flight; their output is written to the
/// inner writer in stream order. `flush` sends what is gathered and waits
/// for it to reach the inner writer — all of it for CTR, the whole blocks
/// or data units of CBC and XTS (a partial one waits for the rest). Call
/// `shutdown` at the end: it sends the rest and shuts the inner writer down.
///
/// Errors: a failed request and a CBC or XTS stream that is shut down
/// inside a block or data unit ([`Error::DataLength`], once every whole one
/// before it is written; the inner writer is not shut down) end the stream;
/// the inner writer's errors are passed on. After `shutdown`, writes fail
/// (`BrokenPipe`) and another `shutdown` does nothing.
///
/// # Cancel safety
/// The poll methods keep their state in the writer, so a `write` or
/// `flush` future dropped before it completes loses nothing: bytes a
/// `write` accepted are written later. Dropping the writer without
/// `shutdown` loses what was gathered and not yet written, as dropping a
/// `BufWriter` does.
pub struct CipherWriter<W> {
    inner: W,
    pipe: Pipeline,
    filling: Filling,
    /// An output being written to the inner writer, and how far.
    out: Option<(Vec<u8>, usize)>,
    /// `shutdown` completed: writes fail, a second `shutdown` does nothing.
    shut: bool,
}

impl<W> core::fmt::Debug for CipherWriter<W> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CipherWriter")
            .field("session", &self.pipe.session)
            .field("in_flight", &self.pipe.queue.len())
            .finish_non_exhaustive()
    }
}

impl<W: AsyncWrite + Unpin> CipherWriter<W> {
    /// A stream that encrypts (`Direction::Encrypt`) or decrypts what is
    /// written with `session` and writes it to `inner`. `iv` as for
    /// [`CipherReader::new`].
    ///
    /// # Errors
    /// As for [`CipherReader::new`].
    pub fn new(
        inner: W,
        session: Arc<CipherSession>,
        dir: Direction,
        iv: impl IvInput<16>,
        options: StreamOptions,
    ) -> Result<Self, Error> {
        let (pipe, filling) = Pipeline::new(session, dir, iv, options)?;
        Ok(CipherWriter {
            inner,
            pipe,
            filling,
            out: None,
            shut: false,
        })
    }

    /// The inner writer.
    pub fn get_ref(&self) -> &W {
        &self.inner
    }

    /// The inner writer, back (call `shutdown` or `flush` first: what was
    /// gathered and not written is dropped).
    pub fn into_inner(self) -> W {
        self.inner
    }

    /// Writes finished requests' output to the inner writer, oldest first,
    /// until the inner writer or the oldest request is not ready (the
    /// waker is then registered with it) or nothing is in flight.
    fn pump(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        loop {
            if let Some((v, pos)) = &mut self.out {
                while *pos < v.len() {
                    match Pin::new(&mut self.inner).poll_write(cx, &v[*pos..]) {
                        Poll::Pending => {
                            // The later requests go on meanwhile.
                            self.pipe.queue.poll_all(cx);
                            return Ok(());
                        }
                        Poll::Ready(Ok(0)) => return Err(io::ErrorKind::WriteZero.into()),
                        Poll::Ready(Ok(n)) => *pos += n,
                        Poll::Ready(Err(e)) => return Err(e),
                    }
                }
                if let Some((v, _)) = self.out.take() {
                    self.pipe.recycle(v);
                }
            }
            match self.pipe.poll_next(cx) {
                Poll::Ready(Some(Ok(c))) => self.out = Some((c.buf, c.skip)),
                Poll::Ready(Some(Err(e))) => return Err(e),
                Poll::Ready(None) | Poll::Pending => return Ok(()),
            }
        }
    }

    /// Flush (`last` false) or shutdown (`last` true): sends what is
    /// gathered, waits for every request's output to be written, then
    /// flushes or shuts down the inner writer.
    fn poll_finish(&mut self, cx: &mut Context<'_>, last: bool) -> Poll<io::Result<()>> {
        if let Some(e) = self.pipe.failed_before() {
            return Poll::Ready(Err(e));
        }
        if self.shut {
            return Poll::Ready(Ok(()));
        }
        loop {
            self.pump(cx)?;
            let data = self.filling.end - self.filling.skip;
            let sendable = if self.pipe.mode == CipherMode::Ctr {
                data
            } else {
                data / self.pipe.granule * self.pipe.granule
            };
            if sendable > 0 {
                if !self.pipe.can_send() {
                    // pump registered the waker with the oldest request.
                    return Poll::Pending;
                }
                self.pipe.send(&mut self.filling);
                continue;
            }
            if !self.pipe.queue.is_empty() || self.out.is_some() {
                return Poll::Pending;
            }
            let inner = Pin::new(&mut self.inner);
            if !last {
                return inner.poll_flush(cx);
            }
            // Everything whole is written: a partial block or unit left
            // is the caller's error.
            if let Err(e) = self.pipe.check_end(&self.filling) {
                return Poll::Ready(Err(self.pipe.fail(e.into())));
            }
            ready!(inner.poll_shutdown(cx))?;
            self.shut = true;
            return Poll::Ready(Ok(()));
        }
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for CipherWriter<W> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Some(e) = this.pipe.failed_before() {
            return Poll::Ready(Err(e));
        }
        if this.shut {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "written after shutdown",
            )));
        }
        if data.is_empty() {
            return Poll::Ready(Ok(0));
        }
        loop {
            this.pump(cx)?;
            let room = this.pipe.room(&this.filling);
            if room > 0 {
                let n = room.min(data.len());
                let f = &mut this.filling;
                f.buf[f.end..f.end + n].copy_from_slice(&data[..n]);
                f.end += n;
                if n == room && this.pipe.can_send() {
                    this.pipe.send(&mut this.filling);
                    // Start it now: a request goes to its engine on its
                    // first poll.
                    this.pipe.queue.poll_all(cx);
                }
                return Poll::Ready(Ok(n));
            }
            if !this.pipe.can_send() {
                // pump registered the waker with the oldest request.
                return Poll::Pending;
            }
            this.pipe.send(&mut this.filling);
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().poll_finish(cx, false)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().poll_finish(cx, true)
    }
}
