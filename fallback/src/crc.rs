//! CRC-32 and CRC-64 in the catalogue's parameterisations, on `crc-fast`
//! (PCLMULQDQ / VPCLMULQDQ folding on x86-64, PMULL on aarch64, chosen at run
//! time, with a table fallback).

use core::fmt;

use crate::choice::{self, Choice, Mode};
use crate::crc_plan::CrcPlan;
use crate::crc64::{self, Crc64};
use crate::crc64_limit::crc64_crc_fast_from;
use crate::{Error, Implementation};

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

    /// CRC-32C (Castagnoli), as most code names it:
    /// [`CrcAlg::Crc32Iscsi`].
    pub const CRC32C: CrcAlg = CrcAlg::Crc32Iscsi;

    /// "CRC-32" (zlib, gzip, Ethernet, PNG): [`CrcAlg::Crc32IsoHdlc`].
    pub const CRC32: CrcAlg = CrcAlg::Crc32IsoHdlc;

    /// The short name tools use: `crc32`, `crc32c`, `crc64-nvme`,
    /// `crc64-xz`, `crc64-go-iso`.
    pub const fn short_name(self) -> &'static str {
        match self {
            CrcAlg::Crc32IsoHdlc => "crc32",
            CrcAlg::Crc32Iscsi => "crc32c",
            CrcAlg::Crc64Nvme => "crc64-nvme",
            CrcAlg::Crc64Xz => "crc64-xz",
            CrcAlg::Crc64GoIso => "crc64-go-iso",
        }
    }

    /// The algorithm named `name`, ignoring case: its catalogue name
    /// (`CRC-32/ISCSI`), its short name (`crc32c`), or a common alias
    /// (`crc-32c`, `castagnoli`, `crc-32`, `crc64nvme`, `crc64`: NVMe's).
    pub fn from_name(name: &str) -> Option<CrcAlg> {
        let n = name.trim().to_ascii_lowercase();
        if let Some(alg) = CrcAlg::ALL
            .into_iter()
            .find(|a| a.name().eq_ignore_ascii_case(&n) || a.short_name() == n)
        {
            return Some(alg);
        }
        Some(match n.as_str() {
            "crc-32c" | "castagnoli" | "iscsi" => CrcAlg::Crc32Iscsi,
            "crc-32" | "zlib" => CrcAlg::Crc32IsoHdlc,
            "crc64nvme" | "crc-64-nvme" | "crc64" | "nvme" => CrcAlg::Crc64Nvme,
            "crc64xz" | "crc-64-xz" | "xz" => CrcAlg::Crc64Xz,
            "crc64goiso" | "crc-64-go-iso" => CrcAlg::Crc64GoIso,
            _ => return None,
        })
    }

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

    pub(crate) fn fast(self) -> crc_fast::CrcAlgorithm {
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
/// The CRC-32s run on the implementations measured fastest on this
/// machine, per size class of each `update` ([`choice`]: crc-fast,
/// crc32fast for CRC-32/ISO-HDLC, the `crc32c` crate for CRC-32C). The
/// CRC-64s run on this crate's slicing-by-16 table, then (the `clmul`
/// feature, a CPU with PCLMULQDQ) its 128-bit fold, then crc-fast, from
/// lengths measured on this machine ([`crate::choice::crc64_limit_measured`]:
/// on an Intel Xeon model 207 the fold from 16 bytes and crc-fast from
/// 1 KiB; without the fold, the table to 64 bytes on AMD Zen 4 and to
/// 48–64 on Zen 3). The running value moves between the implementations as
/// a plain CRC, so mixing is exact.
#[derive(Clone)]
pub struct Crc {
    /// The CRC-32s' implementations per size class.
    choice: Choice,
    /// The algorithm, and `choice` as the lengths each update runs on
    /// crc-fast (the CRC-64 table limit measured in it).
    plan: CrcPlan,
    /// The CRC of everything fed so far, unless `digest` holds it.
    value: u64,
    /// crc-fast's running state, while large updates are being fed.
    digest: Option<crc_fast::Digest>,
    len: u64,
}

impl fmt::Debug for Crc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Crc")
            .field("alg", &self.plan.alg())
            .field("len", &self.len)
            .finish()
    }
}

/// CRC-64 inputs shorter than this go to this crate's table or its fold
/// (measured: [`crc64_crc_fast_from`]); the CRC-32s follow their measured
/// [`Choice`] instead (0 here).
#[inline]
pub(crate) fn small_limit(alg: CrcAlg) -> usize {
    match alg {
        CrcAlg::Crc32IsoHdlc | CrcAlg::Crc32Iscsi => 0,
        CrcAlg::Crc64Nvme | CrcAlg::Crc64Xz | CrcAlg::Crc64GoIso => crc64_crc_fast_from(),
    }
}

/// The choice `Crc::new` and [`checksum`] use for `alg`: measured once a
/// process for the CRC-32s, crc-fast for the CRC-64s.
#[inline]
pub fn crc_choice(alg: CrcAlg) -> Choice {
    match Mode::of_crc(alg) {
        Some(mode) => choice::measured(mode),
        None => Choice::one(Implementation::CrcFast),
    }
}

/// A CRC-64's table and fold (none for the CRC-32s).
fn crc64(alg: CrcAlg) -> Option<&'static Crc64> {
    match alg {
        CrcAlg::Crc64Nvme => Some(&crc64::NVME),
        CrcAlg::Crc64Xz => Some(&crc64::XZ),
        CrcAlg::Crc64GoIso => Some(&crc64::GO_ISO),
        CrcAlg::Crc32IsoHdlc | CrcAlg::Crc32Iscsi => None,
    }
}

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

/// Continues `value` (the CRC of earlier data) over `data` on `imp`, one of
/// the implementations that keep no state between calls (crc32fast,
/// `crc32c`, and the CRC-64 table and fold).
fn plain_update(alg: CrcAlg, imp: Implementation, value: u64, data: &[u8]) -> u64 {
    // Every crate here continues from a final CRC; the CRC-64 table and
    // fold from the register before the final XOR.
    match (alg, imp) {
        (_, Implementation::Crc32Fast) => {
            let mut h = crc32fast::Hasher::new_with_initial(value as u32);
            h.update(data);
            u64::from(h.finalize())
        }
        (_, Implementation::Crc32c) => u64::from(crc32c::crc32c_append(value as u32, data)),
        _ => match crc64(alg) {
            Some(c) => c.update(value ^ alg.xorout(), data) ^ alg.xorout(),
            None => crc_fast_update(alg, value, data),
        },
    }
}

fn crc_fast_update(alg: CrcAlg, value: u64, data: &[u8]) -> u64 {
    let mut d = crc_fast::Digest::new_with_init_state(alg.fast(), value ^ alg.xorout());
    d.update(data);
    d.finalize()
}

impl Crc {
    /// Starts a CRC over no data, on the implementations measured fastest
    /// here ([`crc_choice`]).
    pub fn new(alg: CrcAlg) -> Self {
        Crc::with_choice(alg, crc_choice(alg))
    }

    /// Starts a CRC over no data on `choice` (e.g. a choice saved in a
    /// profile). An implementation that does not run `alg` means crc-fast.
    pub fn with_choice(alg: CrcAlg, choice: Choice) -> Self {
        // The CRC of nothing is 0 for every supported algorithm.
        Crc::resume_with_choice(alg, choice, 0, 0)
    }

    /// Continues a CRC computed elsewhere: `crc` is the (final) CRC of some
    /// `len` bytes, and feeding more data gives the CRC of those bytes
    /// followed by the new data. This is how a stream whose pieces were
    /// checksummed on different engines is put back together.
    pub fn resume(alg: CrcAlg, crc: u64, len: u64) -> Self {
        Crc::resume_with_choice(alg, crc_choice(alg), crc, len)
    }

    /// [`Crc::resume`] on `choice`.
    pub fn resume_with_choice(alg: CrcAlg, choice: Choice, crc: u64, len: u64) -> Self {
        // (A CRC-64's limits are measured in the plan, not in its first
        // update.)
        Crc {
            choice,
            plan: CrcPlan::new(alg, choice),
            value: crc,
            digest: None,
            len,
        }
    }

    /// The algorithm.
    pub fn alg(&self) -> CrcAlg {
        self.plan.alg()
    }

    /// The implementations small and large updates run on (for the
    /// CRC-32s; the CRC-64s run on their table, their fold and crc-fast by
    /// length: [`implementation_for`](Self::implementation_for)).
    pub fn choice(&self) -> Choice {
        self.choice
    }

    /// The implementation a `len`-byte update runs on (`RustCrypto` names
    /// this crate's table that short CRC-64 updates run on). For a CRC-64,
    /// that of an update whose address is a multiple of 16 and length of
    /// 128: others may keep the fold longer (see
    /// `choice::crc64_limit_measured`).
    pub fn implementation_for(&self, len: usize) -> Implementation {
        self.plan.implementation_for(len)
    }

    /// Feeds more data.
    #[inline]
    pub fn update(&mut self, data: &[u8]) {
        // Saturates rather than overflowing on a nonsense `resume` length.
        self.len = self.len.saturating_add(data.len() as u64);
        let mut imp = self.plan.implementation_for(data.len());
        if imp == Implementation::CrcFast {
            // Inputs crc-fast would take partly a block at a time.
            match self.plan.alg() {
                CrcAlg::Crc32IsoHdlc if crate::crc_plan::crc32_keeps(data) => {
                    imp = Implementation::Crc32Fast;
                }
                CrcAlg::Crc64Nvme | CrcAlg::Crc64Xz | CrcAlg::Crc64GoIso
                    if crc64::fold_takes(data) =>
                {
                    imp = crc64::implementation_for(data.len());
                }
                _ => {}
            }
        }
        if imp != Implementation::CrcFast {
            if let Some(d) = self.digest.take() {
                self.value = d.finalize();
            }
            self.value = plain_update(self.plan.alg(), imp, self.value, data);
        } else {
            let value = self.value;
            let alg = self.plan.alg();
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

    /// Starts over with no data (on the same implementations).
    pub fn reset(&mut self) {
        *self = Crc::with_choice(self.plan.alg(), self.choice);
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

/// The CRC of `data` in one call, on the implementation measured fastest
/// here for its length ([`crc_choice`], as a [`CrcPlan`] made on the first
/// call).
#[inline(always)]
pub fn checksum(alg: CrcAlg, data: &[u8]) -> u64 {
    crate::crc_plan::checksum_measured(alg, data)
}

/// [`checksum`] on `choice` (a [`CrcPlan`] kept and reused skips turning
/// the choice into one on every call).
#[inline]
pub fn checksum_with(alg: CrcAlg, choice: Choice, data: &[u8]) -> u64 {
    CrcPlan::new(alg, choice).checksum(data)
}

/// The CRC of `A ‖ B` from `crc(A)`, `crc(B)` and the length of `B`, without
/// the data (O(log len_b) carry-less multiplications). This is what lets a
/// large CRC be split over cores or engines.
#[inline]
pub fn combine(alg: CrcAlg, crc_a: u64, crc_b: u64, len_b: u64) -> u64 {
    crc_fast::checksum_combine(alg.fast(), crc_a, crc_b, len_b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_crc_parses_from_its_names_and_aliases() {
        for alg in CrcAlg::ALL {
            assert_eq!(CrcAlg::from_name(alg.name()), Some(alg));
            assert_eq!(CrcAlg::from_name(&alg.name().to_lowercase()), Some(alg));
            assert_eq!(CrcAlg::from_name(alg.short_name()), Some(alg));
            assert_eq!(
                CrcAlg::from_name(&alg.short_name().to_uppercase()),
                Some(alg)
            );
        }
        for (name, alg) in [
            ("crc-32c", CrcAlg::CRC32C),
            ("Castagnoli", CrcAlg::Crc32Iscsi),
            ("CRC-32", CrcAlg::CRC32),
            ("crc64nvme", CrcAlg::Crc64Nvme),
            (" crc64-xz ", CrcAlg::Crc64Xz),
        ] {
            assert_eq!(CrcAlg::from_name(name), Some(alg), "{name}");
        }
        for bad in ["", "crc", "crc16", "sha256", "crc-32/iscsi/x"] {
            assert_eq!(CrcAlg::from_name(bad), None, "{bad}");
        }
    }
}
