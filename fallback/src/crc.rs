//! CRC-32 and CRC-64 in the catalogue's parameterisations, on `crc-fast`
//! (PCLMULQDQ / VPCLMULQDQ folding on x86-64, PMULL on aarch64, chosen at run
//! time, with a table fallback).

use core::fmt;

use crate::Error;

/// A CRC algorithm, named as in Greg Cook's CRC RevEng catalogue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CrcAlg {
    /// CRC-32/ISO-HDLC: zlib, Ethernet, PNG, gzip ("CRC-32").
    Crc32IsoHdlc,
    /// CRC-32/ISCSI (CRC-32C, Castagnoli): iSCSI, ext4, Btrfs, NVMe.
    Crc32Iscsi,
    /// CRC-64/NVME: NVMe end-to-end protection; Linux `crc64-rocksoft`.
    Crc64Nvme,
    /// CRC-64/XZ: the ECMA-182 polynomial, reflected (xz, "CRC-64/GO-ECMA").
    Crc64Xz,
    /// CRC-64/GO-ISO: the ISO 3309 polynomial (Go's `crc64.ISO`).
    Crc64GoIso,
}

impl CrcAlg {
    /// Every algorithm.
    pub const ALL: [CrcAlg; 5] = [
        CrcAlg::Crc32IsoHdlc,
        CrcAlg::Crc32Iscsi,
        CrcAlg::Crc64Nvme,
        CrcAlg::Crc64Xz,
        CrcAlg::Crc64GoIso,
    ];

    /// The catalogue name, e.g. `"CRC-32/ISCSI"`.
    pub const fn name(self) -> &'static str {
        match self {
            CrcAlg::Crc32IsoHdlc => "CRC-32/ISO-HDLC",
            CrcAlg::Crc32Iscsi => "CRC-32/ISCSI",
            CrcAlg::Crc64Nvme => "CRC-64/NVME",
            CrcAlg::Crc64Xz => "CRC-64/XZ",
            CrcAlg::Crc64GoIso => "CRC-64/GO-ISO",
        }
    }

    /// The width in bits (32 or 64).
    pub const fn width(self) -> u32 {
        match self {
            CrcAlg::Crc32IsoHdlc | CrcAlg::Crc32Iscsi => 32,
            CrcAlg::Crc64Nvme | CrcAlg::Crc64Xz | CrcAlg::Crc64GoIso => 64,
        }
    }

    fn fast(self) -> crc_fast::CrcAlgorithm {
        use crc_fast::CrcAlgorithm as A;
        match self {
            CrcAlg::Crc32IsoHdlc => A::Crc32IsoHdlc,
            CrcAlg::Crc32Iscsi => A::Crc32Iscsi,
            CrcAlg::Crc64Nvme => A::Crc64Nvme,
            CrcAlg::Crc64Xz => A::Crc64Xz,
            CrcAlg::Crc64GoIso => A::Crc64GoIso,
        }
    }
}

impl fmt::Display for CrcAlg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A streaming CRC computation.
///
/// ```
/// use crypto_offload_fallback::{Crc, CrcAlg};
/// let mut crc = Crc::new(CrcAlg::Crc32Iscsi);
/// crc.update(b"1234");
/// crc.update(b"56789");
/// assert_eq!(crc.finalize(), 0xe306_9283);
/// assert!(crc.verify(0xe306_9283).is_ok());
/// ```
#[derive(Clone)]
pub struct Crc {
    alg: CrcAlg,
    digest: crc_fast::Digest,
    len: u64,
}

impl fmt::Debug for Crc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Crc")
            .field("alg", &self.alg)
            .field("len", &self.len)
            .finish()
    }
}

impl Crc {
    /// Starts a CRC over no data.
    pub fn new(alg: CrcAlg) -> Self {
        Crc {
            alg,
            digest: crc_fast::Digest::new(alg.fast()),
            len: 0,
        }
    }

    /// Continues a CRC computed elsewhere: `crc` is the (final) CRC of some
    /// `len` bytes, and feeding more data gives the CRC of those bytes
    /// followed by the new data. This is how a stream whose pieces were
    /// checksummed on different engines is put back together.
    pub fn resume(alg: CrcAlg, crc: u64, len: u64) -> Self {
        // Every supported algorithm's final XOR is all ones, and crc-fast
        // keeps its running state before that XOR.
        let mask = if alg.width() == 32 {
            u64::from(u32::MAX)
        } else {
            u64::MAX
        };
        Crc {
            alg,
            digest: crc_fast::Digest::new_with_init_state(alg.fast(), crc ^ mask),
            len,
        }
    }

    /// The algorithm.
    pub fn alg(&self) -> CrcAlg {
        self.alg
    }

    /// Feeds more data.
    #[inline]
    pub fn update(&mut self, data: &[u8]) {
        self.digest.update(data);
        self.len += data.len() as u64;
    }

    /// The CRC of everything fed so far (the computation can go on).
    #[inline]
    pub fn finalize(&self) -> u64 {
        self.digest.finalize()
    }

    /// How many bytes have been fed.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether no data has been fed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Starts over with no data.
    pub fn reset(&mut self) {
        self.digest.reset();
        self.len = 0;
    }

    /// Checks the CRC of everything fed so far against `expected`.
    ///
    /// # Errors
    /// [`Error::ChecksumMismatch`] with both values when they differ.
    pub fn verify(&self, expected: u64) -> Result<(), Error> {
        let computed = self.finalize();
        if computed == expected {
            Ok(())
        } else {
            Err(Error::ChecksumMismatch { expected, computed })
        }
    }
}

/// The CRC of `data` in one call.
#[inline]
pub fn checksum(alg: CrcAlg, data: &[u8]) -> u64 {
    crc_fast::checksum(alg.fast(), data)
}

/// The CRC of `A ‖ B` from `crc(A)`, `crc(B)` and the length of `B`, without
/// the data (O(log len_b) carry-less multiplications). This is what lets a
/// large CRC be split over cores or engines.
#[inline]
pub fn combine(alg: CrcAlg, crc_a: u64, crc_b: u64, len_b: u64) -> u64 {
    crc_fast::checksum_combine(alg.fast(), crc_a, crc_b, len_b)
}
