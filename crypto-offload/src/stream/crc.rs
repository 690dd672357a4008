//! Checksums of what passes through a reader or writer.
//!
//! They feed the session with [`CrcSession::update_from_slice`], on the
//! CPU, as the bytes pass: they are in the cache then, and the CPU's CRC
//! (several GB/s a core even for one 4 KiB read; `fallback/README.md` has
//! the figures) costs less than copying them into a buffer for an engine
//! and waiting for it. To checksum on an engine, hand it owned buffers
//! with [`CrcSession::update`] or [`CrcSession::checksum`].

use core::pin::Pin;
use core::task::{Context, Poll, ready};
use std::io;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::session::CrcSession;

/// Checksums what is read through it and, given the expected value, checks
/// it at the end of the stream: the read that meets the end fails with an
/// `io::Error` of kind `InvalidData` holding
/// [`Error::ChecksumMismatch`](crate::Error::ChecksumMismatch) if it does
/// not match (read it with `get_ref()` and `downcast_ref`).
///
/// # Cancel safety
/// `poll_read` keeps no state between calls beyond the running CRC, which
/// it updates only with bytes it hands out: a dropped `read` future loses
/// nothing.
#[derive(Debug)]
pub struct CrcReader<R> {
    inner: R,
    crc: CrcSession,
    expected: Option<u64>,
}

impl<R: AsyncRead + Unpin> CrcReader<R> {
    /// Checksums what is read from `inner` into `crc` (which may have been
    /// fed already: the checksum covers both).
    pub fn new(inner: R, crc: CrcSession) -> Self {
        CrcReader {
            inner,
            crc,
            expected: None,
        }
    }

    /// Checks the checksum against `expected` when the stream ends.
    pub fn verify_at_end(mut self, expected: u64) -> Self {
        self.expected = Some(expected);
        self
    }

    /// The checksum of what was read so far.
    pub fn checksum(&self) -> u64 {
        self.crc.finalize()
    }

    /// The session, with what was read fed into it.
    pub fn session(&self) -> &CrcSession {
        &self.crc
    }

    /// The inner reader and the session.
    pub fn into_parts(self) -> (R, CrcSession) {
        (self.inner, self.crc)
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for CrcReader<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let room = buf.remaining();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        let new = &buf.filled()[before..];
        if !new.is_empty() {
            this.crc.update_from_slice(new);
        } else if room > 0
            && let Some(expected) = this.expected
        {
            // The end of the stream.
            this.crc.verify(expected)?;
        }
        Poll::Ready(Ok(()))
    }
}

/// Checksums what is written through it (the bytes the inner writer
/// accepted) and, given the expected value, checks it at `shutdown`, after
/// shutting the inner writer down: a mismatch is an `io::Error` of kind
/// `InvalidData` holding
/// [`Error::ChecksumMismatch`](crate::Error::ChecksumMismatch).
///
/// # Cancel safety
/// It buffers nothing: a dropped `write` future wrote nothing or was
/// counted.
#[derive(Debug)]
pub struct CrcWriter<W> {
    inner: W,
    crc: CrcSession,
    expected: Option<u64>,
}

impl<W: AsyncWrite + Unpin> CrcWriter<W> {
    /// Checksums what is written to `inner` into `crc`.
    pub fn new(inner: W, crc: CrcSession) -> Self {
        CrcWriter {
            inner,
            crc,
            expected: None,
        }
    }

    /// Checks the checksum against `expected` at `shutdown`.
    pub fn verify_at_end(mut self, expected: u64) -> Self {
        self.expected = Some(expected);
        self
    }

    /// The checksum of what was written so far.
    pub fn checksum(&self) -> u64 {
        self.crc.finalize()
    }

    /// The session, with what was written fed into it.
    pub fn session(&self) -> &CrcSession {
        &self.crc
    }

    /// The inner writer and the session.
    pub fn into_parts(self) -> (W, CrcSession) {
        (self.inner, self.crc)
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for CrcWriter<W> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let n = ready!(Pin::new(&mut this.inner).poll_write(cx, data))?;
        this.crc.update_from_slice(&data[..n.min(data.len())]);
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(Pin::new(&mut this.inner).poll_shutdown(cx))?;
        if let Some(expected) = this.expected {
            this.crc.verify(expected)?;
        }
        Poll::Ready(Ok(()))
    }
}
