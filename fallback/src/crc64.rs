//! A CRC-64 below the length crc-fast takes over from: this crate's table,
//! or from a measured length the PCLMULQDQ fold (the `clmul` feature;
//! lengths in [`crate::crc64_limit`]); and the inputs past that length
//! that the fold keeps ([`fold_takes`]).

#[cfg(feature = "clmul")]
use crypto_offload_native::Crc64Fold;

use crate::Implementation;
use crate::crc64_limit::crc64_table_limit;
use crate::crc64_table::{self, Tables};

/// One CRC-64's table and fold.
pub(crate) struct Crc64 {
    table: &'static Tables,
    #[cfg(feature = "clmul")]
    fold: Crc64Fold,
}

/// CRC-64/NVME.
pub(crate) static NVME: Crc64 = Crc64 {
    table: &crc64_table::NVME,
    #[cfg(feature = "clmul")]
    fold: Crc64Fold::NVME,
};
/// CRC-64/XZ.
pub(crate) static XZ: Crc64 = Crc64 {
    table: &crc64_table::XZ,
    #[cfg(feature = "clmul")]
    fold: Crc64Fold::XZ,
};
/// CRC-64/GO-ISO.
pub(crate) static GO_ISO: Crc64 = Crc64 {
    table: &crc64_table::GO_ISO,
    #[cfg(feature = "clmul")]
    fold: Crc64Fold::GO_ISO,
};

impl Crc64 {
    /// The CRC of `data` (`init` and `xorout` all ones).
    #[inline(always)]
    pub(crate) fn checksum(&self, data: &[u8]) -> u64 {
        !self.update(!0, data)
    }

    /// Continues `state` (the register before the final XOR) over `data`:
    /// on the fold from [`crc64_table_limit`] where it was measured, else
    /// on the table.
    #[inline(always)]
    pub(crate) fn update(&self, state: u64, data: &[u8]) -> u64 {
        self.update_from(crc64_table_limit(), state, data)
    }

    /// [`update`](Self::update) with the fold from `fold_from` bytes.
    #[inline(always)]
    pub(crate) fn update_from(&self, fold_from: usize, state: u64, data: &[u8]) -> u64 {
        #[cfg(feature = "clmul")]
        if data.len() >= fold_from
            && let Some(clmul) = crate::crc64_limit::clmul()
        {
            return self.fold.update(clmul, state, data);
        }
        let _ = fold_from;
        self.table.update(state, data)
    }
}

/// Whether a CRC-64 input at or past crc-fast's measured length runs on
/// the fold instead: one that leaves crc-fast 64 bytes or more outside its
/// 128-byte blocks ([`crate::crc_fast_blocks`]), below
/// [`crc64_crc_fast_from_unaligned`].
///
/// [`crc64_crc_fast_from_unaligned`]: crate::choice::crc64_crc_fast_from_unaligned
#[inline(always)]
pub(crate) fn fold_takes(data: &[u8]) -> bool {
    #[cfg(feature = "clmul")]
    {
        crate::crc_fast_blocks::mostly_left_over(
            data,
            crate::crc64_limit::crc64_crc_fast_from_unaligned,
        )
    }
    #[cfg(not(feature = "clmul"))]
    {
        let _ = data;
        false
    }
}

/// What a `len`-byte CRC-64 below crc-fast runs on: the fold, or the table
/// (named `RustCrypto`: this crate's own code).
pub(crate) fn implementation_for(len: usize) -> Implementation {
    #[cfg(feature = "clmul")]
    if len >= crc64_table_limit() && crate::crc64_limit::clmul().is_some() {
        return Implementation::Crc64Fold;
    }
    let _ = len;
    Implementation::RustCrypto
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both halves at every length to 1100 B, and the measured split,
    /// against the `crc` crate; a CRC continued across them is the CRC of
    /// the whole.
    #[test]
    fn the_table_and_the_fold_give_the_catalogues_crc() {
        let data: Vec<u8> = (0..1100u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for (crc64, alg) in [
            (&NVME, &crc::CRC_64_NVME),
            (&XZ, &crc::CRC_64_XZ),
            (&GO_ISO, &crc::CRC_64_GO_ISO),
        ] {
            // The fold runs once the limits are measured (on a CPU with
            // PCLMULQDQ).
            crate::crc64_limit::crc64_limit_measured();
            let reference = crc::Crc::<u64>::new(alg);
            for len in 0..data.len() {
                let d = &data[..len];
                let want = reference.checksum(d);
                assert_eq!(crc64.checksum(d), want, "{} B", len);
                for fold_from in [0, usize::MAX] {
                    assert_eq!(!crc64.update_from(fold_from, !0, d), want, "{len} B");
                }
                let at = len / 3;
                let s = crc64.update_from(0, !0, &d[..at]);
                assert_eq!(!crc64.update_from(usize::MAX, s, &d[at..]), want);
                let s = crc64.update_from(usize::MAX, !0, &d[..at]);
                assert_eq!(!crc64.update_from(0, s, &d[at..]), want);
            }
        }
    }

    /// Either side of every measured limit, at every address offset mod
    /// 16, one-shot and streamed in three pieces: the `crc` crate's CRC;
    /// and inputs stay off crc-fast exactly when they would leave it 64
    /// bytes or more outside its blocks and are short of the unaligned
    /// limit.
    #[test]
    fn every_limit_at_every_alignment_gives_the_catalogues_crc() {
        use crate::{Crc, CrcAlg};
        let m = crate::choice::crc64_limit_measured();
        // (The unaligned limit may be past the ladder, up to 16 times its
        // top, 64 KiB: tested there.)
        let top = crate::crc64_limit::LADDER[crate::crc64_limit::LADDER.len() - 1];
        let unaligned = m.crc_fast_from_unaligned.min(16 * top);
        let buf: Vec<u8> = (0..unaligned as u32 + 200)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let base = buf.as_ptr().align_offset(64).min(64);
        let lens: Vec<usize> = [m.limit, m.crc_fast_from, unaligned]
            .into_iter()
            .flat_map(|l| [l.saturating_sub(17), l.saturating_sub(1), l, l + 1, l + 16])
            .chain([0, 15, 16, 17, 100])
            .collect();
        for (alg, reference) in [
            (CrcAlg::Crc64Nvme, &crc::CRC_64_NVME),
            (CrcAlg::Crc64Xz, &crc::CRC_64_XZ),
            (CrcAlg::Crc64GoIso, &crc::CRC_64_GO_ISO),
        ] {
            let reference = crc::Crc::<u64>::new(reference);
            for &len in &lens {
                for off in 0..16 {
                    let d = &buf[base + off..base + off + len];
                    let want = reference.checksum(d);
                    assert_eq!(crate::checksum(alg, d), want, "{alg} {len} B +{off}");
                    let mut c = Crc::new(alg);
                    let (a, b) = d.split_at(len / 3);
                    let (b, e) = b.split_at(b.len() / 2);
                    for piece in [a, b, e] {
                        c.update(piece);
                    }
                    assert_eq!(c.finalize(), want, "{alg} {len} B +{off} in pieces");
                    // From the address's offset, independently.
                    let head = ((16 - off % 16) % 16).min(len);
                    let left = head + (len - head) % 128;
                    let kept = left >= 64 && len >= 256 && len < m.crc_fast_from_unaligned;
                    #[cfg(feature = "clmul")]
                    assert_eq!(fold_takes(d), kept, "{len} B +{off} {m:?}");
                    #[cfg(not(feature = "clmul"))]
                    assert!(!fold_takes(d) && (!kept || len < m.crc_fast_from));
                }
            }
        }
    }
}
