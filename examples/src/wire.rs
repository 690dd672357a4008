//! Reading length-prefixed frames off a byte stream: whole headers, bodies
//! of a known length, and oversize bodies thrown away so that the stream
//! stays in step.

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::mpsc;

/// Reads an `N`-byte header; `None` if the stream ended cleanly before it.
///
/// # Errors
/// `UnexpectedEof` if the stream ends inside the header; any read error.
///
/// # Cancel safety
/// Not cancel safe: bytes read before the future is dropped are lost, and
/// the stream is out of step. Call it from the task that owns the reader,
/// and drop the connection if it is cancelled.
pub async fn read_header<R: AsyncRead + Unpin, const N: usize>(
    reader: &mut R,
) -> io::Result<Option<[u8; N]>> {
    let mut header = [0u8; N];
    let mut filled = 0;
    while filled < N {
        let n = reader.read(&mut header[filled..]).await?;
        if n == 0 {
            if filled == 0 {
                return Ok(None);
            }
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        filled += n;
    }
    Ok(Some(header))
}

/// Reads a `len`-byte body into a new buffer.
///
/// # Errors
/// `UnexpectedEof` if the stream ends first; any read error.
///
/// # Cancel safety
/// Not cancel safe, as for [`read_header`].
pub async fn read_body<R: AsyncRead + Unpin>(reader: &mut R, len: usize) -> io::Result<Vec<u8>> {
    let mut body = vec![0u8; len];
    reader.read_exact(&mut body).await?;
    Ok(body)
}

/// Reads and throws away `len` bytes (the body of a frame refused as
/// oversize), 64 KiB at a time, so that the next frame is read from its
/// start. Nothing of the size the peer claims is allocated.
///
/// # Errors
/// `UnexpectedEof` if the stream ends first; any read error.
///
/// # Cancel safety
/// Not cancel safe, as for [`read_header`].
pub async fn discard<R: AsyncRead + Unpin>(reader: &mut R, len: u64) -> io::Result<()> {
    let copied = tokio::io::copy(&mut reader.take(len), &mut tokio::io::sink()).await?;
    if copied < len {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

/// Writes the frames sent on `frames` to `writer` until every sender is
/// gone or the peer stops reading, batching: frames already queued are
/// written together and flushed once. Then shuts the writer down.
///
/// # Cancel safety
/// Cancel safe in the sense that matters: frames are written whole or the
/// connection is given up; a dropped future leaves the queued frames unsent.
pub async fn write_frames<W: AsyncWrite + Unpin>(writer: W, mut frames: mpsc::Receiver<Vec<u8>>) {
    let mut writer = BufWriter::with_capacity(64 * 1024, writer);
    while let Some(frame) = frames.recv().await {
        if writer.write_all(&frame).await.is_err() {
            return;
        }
        while let Ok(more) = frames.try_recv() {
            if writer.write_all(&more).await.is_err() {
                return;
            }
        }
        if writer.flush().await.is_err() {
            return;
        }
    }
    let _ = writer.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_clean_end_is_none_and_an_end_inside_a_header_is_an_error() {
        let mut empty: &[u8] = &[];
        assert!(read_header::<_, 4>(&mut empty).await.unwrap().is_none());
        let mut short: &[u8] = &[1, 2];
        let err = read_header::<_, 4>(&mut short).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[tokio::test]
    async fn discard_leaves_the_stream_at_the_next_frame() {
        let data: Vec<u8> = (0..200_000u32)
            .map(|i| i as u8)
            .chain([7, 7, 7, 7])
            .collect();
        let mut reader: &[u8] = &data;
        discard(&mut reader, 200_000).await.unwrap();
        assert_eq!(
            read_header::<_, 4>(&mut reader).await.unwrap(),
            Some([7; 4])
        );
        let mut short: &[u8] = &[0; 10];
        assert!(discard(&mut short, 11).await.is_err());
    }
}
