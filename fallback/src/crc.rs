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
///
/// Short inputs do not go through crc-fast: its folding kernels carry a
/// fixed cost of ~15–20 ns per call (and a slow path for tails under 128
/// bytes), where crc32fast's slice-by-16 does a 16-byte CRC-32 in 6 ns and
/// the `crc` crate's 16-way table a 16-byte CRC-64 in 8 ns (measured on the
/// build machines; the crossovers are in `small_limit`). The running value
/// moves between the implementations as a plain CRC, so mixing is exact.
#[derive(Clone)]
pub struct Crc {
    alg: CrcAlg,
    /// The CRC of everything fed so far, unless `digest` holds it.
    value: u64,
    /// crc-fast's running state, while large updates are being fed.
    digest: Option<crc_fast::Digest>,
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

/// Inputs shorter than this go to the small-input implementation of `alg`
/// (crc32fast for CRC-32/ISO-HDLC, the `crc` crate's `Table<16>` for the
/// CRC-64s); CRC-32/ISCSI always uses crc-fast, whose SSE4.2 `crc32` path is
/// already the fastest at every size.
pub const fn small_limit(alg: CrcAlg) -> usize {
    match alg {
        CrcAlg::Crc32IsoHdlc => 512,
        CrcAlg::Crc32Iscsi => 0,
        CrcAlg::Crc64Nvme | CrcAlg::Crc64Xz | CrcAlg::Crc64GoIso => 48,
    }
}

static NVME16: crc::Crc<u64, crc::Table<16>> =
    crc::Crc::<u64, crc::Table<16>>::new(&crc::CRC_64_NVME);
static XZ16: crc::Crc<u64, crc::Table<16>> = crc::Crc::<u64, crc::Table<16>>::new(&crc::CRC_64_XZ);
static GO_ISO16: crc::Crc<u64, crc::Table<16>> =
    crc::Crc::<u64, crc::Table<16>>::new(&crc::CRC_64_GO_ISO);

impl CrcAlg {
    /// The final XOR; every supported algorithm's is all ones, and each
    /// implementation's running state is the CRC before it.
    const fn xorout(self) -> u64 {
        if self.width() == 32 {
            u32::MAX as u64
        } else {
            u64::MAX
        }
    }
}

/// Continues `value` (the CRC of earlier data) over `data` with the
/// small-input implementation.
fn small_update(alg: CrcAlg, value: u64, data: &[u8]) -> u64 {
    // Both crates are reflected-only here: their register is the CRC before
    // the final XOR, and `crc` takes its initial register bit-reversed.
    let table = match alg {
        CrcAlg::Crc32IsoHdlc => {
            let mut h = crc32fast::Hasher::new_with_initial(value as u32);
            h.update(data);
            return u64::from(h.finalize());
        }
        CrcAlg::Crc64Nvme => &NVME16,
        CrcAlg::Crc64Xz => &XZ16,
        CrcAlg::Crc64GoIso => &GO_ISO16,
        CrcAlg::Crc32Iscsi => return crc_fast_update(alg, value, data),
    };
    let mut d = table.digest_with_initial((value ^ alg.xorout()).reverse_bits());
    d.update(data);
    d.finalize()
}

fn crc_fast_update(alg: CrcAlg, value: u64, data: &[u8]) -> u64 {
    let mut d = crc_fast::Digest::new_with_init_state(alg.fast(), value ^ alg.xorout());
    d.update(data);
    d.finalize()
}

impl Crc {
    /// Starts a CRC over no data.
    pub fn new(alg: CrcAlg) -> Self {
        Crc::resume(alg, checksum(alg, &[]), 0)
    }

    /// Continues a CRC computed elsewhere: `crc` is the (final) CRC of some
    /// `len` bytes, and feeding more data gives the CRC of those bytes
    /// followed by the new data. This is how a stream whose pieces were
    /// checksummed on different engines is put back together.
    pub fn resume(alg: CrcAlg, crc: u64, len: u64) -> Self {
        Crc {
            alg,
            value: crc,
            digest: None,
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
        // Saturates rather than overflowing on a nonsense `resume` length.
        self.len = self.len.saturating_add(data.len() as u64);
        if data.len() < small_limit(self.alg) {
            if let Some(d) = self.digest.take() {
                self.value = d.finalize();
            }
            self.value = small_update(self.alg, self.value, data);
        } else {
            let value = self.value;
            let alg = self.alg;
            self.digest
                .get_or_insert_with(|| {
                    crc_fast::Digest::new_with_init_state(alg.fast(), value ^ alg.xorout())
                })
                .update(data);
        }
    }

    /// The CRC of everything fed so far (the computation can go on).
    #[inline]
    pub fn finalize(&self) -> u64 {
        match &self.digest {
            Some(d) => d.finalize(),
            None => self.value,
        }
    }

    /// How many bytes have been fed (including the `len` given to
    /// [`resume`](Self::resume); at most `u64::MAX`).
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether no data has been fed.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Starts over with no data.
    pub fn reset(&mut self) {
        *self = Crc::new(self.alg);
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
    if alg == CrcAlg::Crc32IsoHdlc && data.len() < small_limit(alg) {
        // crc32fast's one-shot entry skips the hasher set-up (5.5 ns against
        // 8 ns for 16 bytes).
        u64::from(crc32fast::hash(data))
    } else if data.len() < small_limit(alg) {
        // The CRC of nothing is 0 for every supported algorithm.
        small_update(alg, 0, data)
    } else {
        crc_fast::checksum(alg.fast(), data)
    }
}

/// The CRC of `A ‖ B` from `crc(A)`, `crc(B)` and the length of `B`, without
/// the data (O(log len_b) carry-less multiplications). This is what lets a
/// large CRC be split over cores or engines.
#[inline]
pub fn combine(alg: CrcAlg, crc_a: u64, crc_b: u64, len_b: u64) -> u64 {
    crc_fast::checksum_combine(alg.fast(), crc_a, crc_b, len_b)
}
