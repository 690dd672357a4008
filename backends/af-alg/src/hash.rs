//! Hashes (`hash`), and the CRCs the kernel offers through them with the
//! standard catalogue's results.

use std::io::{IoSlice, IoSliceMut};
use std::sync::Arc;

use tracing::Instrument;

use crate::blocking::{self, RequestTimeout, Shared};
use crate::error::{Error, Failed};
use crate::socket::{Control, Op, Transform};

/// A keyed (or unkeyed) hash transform.
#[derive(Debug, Clone)]
pub struct Hash {
    shared: Arc<Shared>,
    timeout: Option<RequestTimeout>,
    digest_len: usize,
}

impl Hash {
    /// Binds hash `name` (generic, e.g. `"crc32c"`, or a driver name) with
    /// an optional key, whose digest is `digest_len` bytes.
    ///
    /// # Errors
    /// [`Error::Unavailable`] if AF_ALG or the algorithm is not on offer
    /// here; [`Error::InvalidParameter`] if the kernel refuses the key.
    pub fn bind(name: &str, key: Option<&[u8]>, digest_len: usize) -> Result<Hash, Error> {
        Hash::bind_as(name, false, key, digest_len)
    }

    /// As [`Hash::bind`], told whether `name` is a driver name.
    fn bind_as(
        name: &str,
        is_driver: bool,
        key: Option<&[u8]>,
        digest_len: usize,
    ) -> Result<Hash, Error> {
        let tfm = Transform::bind("hash", name, is_driver)?;
        if let Some(key) = key {
            tfm.set_key(key)?;
        }
        Ok(Hash {
            shared: Shared::new(tfm),
            timeout: None,
            digest_len,
        })
    }

    blocking::bound_accessors!();

    /// The digest of `buf`, with `buf` handed back unchanged.
    ///
    /// # Errors
    /// A failed system call; the buffer comes back with the error.
    ///
    /// # Cancel safety
    /// Dropping the future does not stop the request: it completes on its
    /// thread, which owns `buf` until then and then frees it.
    pub async fn digest(&self, buf: Vec<u8>) -> Result<(Vec<u8>, Vec<u8>), Failed> {
        let (shared, n) = (self.shared.clone(), self.digest_len);
        let span = tracing::trace_span!("af_alg.hash", name = shared.tfm.name(), len = buf.len());
        blocking::run(&self.shared.stuck, buf, self.timeout, move |data| {
            shared.with_op(|op| digest(op, data, n))
        })
        .instrument(span)
        .await
    }
}

fn digest(op: &Op, data: &[u8], digest_len: usize) -> Result<Vec<u8>, Error> {
    // A hash takes any length in one operation: the kernel feeds it in
    // pieces itself.
    op.send(Control::default(), &[IoSlice::new(data)])?;
    let mut out = vec![0u8; digest_len];
    let got = op.recv(&mut [IoSliceMut::new(&mut out)])?;
    if got != digest_len {
        return Err(Error::Io {
            op: "read",
            source: std::io::Error::other(format!("digest of {got} bytes, not {digest_len}")),
        });
    }
    Ok(out)
}

/// A CRC the kernel computes, with the standard catalogue's parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CrcKind {
    /// CRC-32/ISO-HDLC (zlib, Ethernet): the kernel's `crc32`, which starts
    /// from its key (default 0) and does not invert at the end; this binding
    /// keys it with `0xffffffff` and inverts the result.
    Crc32,
    /// CRC-32/ISCSI (CRC-32C): the kernel's `crc32c`.
    Crc32c,
    /// CRC-64/NVME: the kernel's `crc64-nvme` (from 6.14; `crc64-rocksoft`
    /// before — the same CRC under its former name).
    Crc64Nvme,
}

impl CrcKind {
    /// Every kind.
    pub const ALL: [CrcKind; 3] = [CrcKind::Crc32, CrcKind::Crc32c, CrcKind::Crc64Nvme];

    /// The kernel's generic names for it, newest first.
    pub fn kernel_names(self) -> &'static [&'static str] {
        match self {
            CrcKind::Crc32 => &["crc32"],
            CrcKind::Crc32c => &["crc32c"],
            CrcKind::Crc64Nvme => &["crc64-nvme", "crc64-rocksoft"],
        }
    }

    fn width(self) -> usize {
        match self {
            CrcKind::Crc32 | CrcKind::Crc32c => 4,
            CrcKind::Crc64Nvme => 8,
        }
    }
}

/// A CRC through AF_ALG, returning the catalogue value.
#[derive(Debug, Clone)]
pub struct Crc {
    hash: Hash,
    kind: CrcKind,
}

impl Crc {
    /// Binds the kernel's CRC — by its generic name (trying the names the
    /// kernel has used, newest first) or with `driver` exactly (e.g.
    /// `"crc32c-intel"`).
    ///
    /// # Errors
    /// [`Error::Unavailable`] if AF_ALG or the CRC is not on offer here.
    pub fn bind(kind: CrcKind, driver: Option<&str>) -> Result<Crc, Error> {
        // The kernel's crc32 starts from its key; a standard CRC-32 starts
        // from all ones (little-endian key bytes).
        let key = (kind == CrcKind::Crc32).then_some(&[0xffu8; 4][..]);
        let names: Vec<&str> = match driver {
            Some(d) => vec![d],
            None => kind.kernel_names().to_vec(),
        };
        let mut last = None;
        for name in names {
            match Hash::bind_as(name, driver.is_some(), key, kind.width()) {
                Ok(hash) => return Ok(Crc { hash, kind }),
                Err(e) if e.is_unavailable() => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or(Error::Invalid {
            what: "CRC",
            detail: "no kernel name".to_owned(),
        }))
    }

    /// Gives requests up as hung after `timeout`: see
    /// [`Hash::with_timeout`].
    pub fn with_timeout(mut self, timeout: RequestTimeout) -> Self {
        self.hash = self.hash.with_timeout(timeout);
        self
    }

    /// Splices operations from `min_len` bytes: see
    /// [`Hash::with_splice_from`].
    pub fn with_splice_from(mut self, min_len: Option<usize>) -> Self {
        self.hash = self.hash.with_splice_from(min_len);
        self
    }

    /// From which length operations are spliced: see
    /// [`Hash::splice_from`].
    pub fn splice_from(&self) -> Option<usize> {
        self.hash.splice_from()
    }

    /// Operations sent spliced: see [`Hash::spliced_operations`].
    pub fn spliced_operations(&self) -> u64 {
        self.hash.spliced_operations()
    }

    /// The kind.
    pub fn kind(&self) -> CrcKind {
        self.kind
    }

    /// The name it was bound with.
    pub fn bound_name(&self) -> &str {
        self.hash.bound_name()
    }

    /// The implementation the kernel bound.
    pub fn driver(&self) -> Option<&str> {
        self.hash.driver()
    }

    /// The CRC of `buf` alone (from the standard initial value), with `buf`
    /// handed back.
    ///
    /// # Errors
    /// A failed system call; the buffer comes back with the error.
    ///
    /// # Cancel safety
    /// As for [`Hash::digest`].
    pub async fn checksum(&self, buf: Vec<u8>) -> Result<(Vec<u8>, u64), Failed> {
        let (buf, digest) = self.hash.digest(buf).await?;
        Ok((buf, crc_value(self.kind, &digest)))
    }
}

/// The catalogue value from the kernel's digest bytes (little-endian).
fn crc_value(kind: CrcKind, digest: &[u8]) -> u64 {
    let mut le = [0u8; 8];
    let n = digest.len().min(8);
    le[..n].copy_from_slice(&digest[..n]);
    let v = u64::from_le_bytes(le);
    match kind {
        CrcKind::Crc32 => u64::from(!(v as u32)),
        CrcKind::Crc32c | CrcKind::Crc64Nvme => v,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_read_little_endian_and_crc32_inverts() {
        assert_eq!(
            crc_value(CrcKind::Crc32c, &[0x83, 0x92, 0x06, 0xe3]),
            0xe306_9283
        );
        assert_eq!(crc_value(CrcKind::Crc32, &[0, 0, 0, 0]), 0xffff_ffff);
        assert_eq!(
            crc_value(CrcKind::Crc64Nvme, &[1, 0, 0, 0, 0, 0, 0, 0x80]),
            0x8000_0000_0000_0001
        );
    }
}
