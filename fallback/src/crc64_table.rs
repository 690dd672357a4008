//! Short CRC-64 inputs: slicing-by-16 tables built at compile time.
//!
//! Under 128 bytes crc-fast does not fold, and its CRC-64 kernels take
//! 18–19 ns at 16 bytes and 24 at 64 on AMD Zen 4. A table walk is the
//! fastest there, but not the `crc` crate's `Table<16>` (9.2 ns at 16
//! bytes: it reads the algorithm through a pointer, reflects `init` at run
//! time and checks every index) nor crc64fast's (9.5 ns; its NVMe fork
//! cannot be a dependency anyway: it exports unprefixed C symbols into
//! every link). These tables take the polynomial as a constant, fold 16
//! bytes, then 8, then single bytes, and index only by masked bytes: 5.1
//! ns at 16 bytes, 21 at 64 (the `paired` bench tool, `crc-64` groups).
//! At 128 bytes crc-fast folds and takes over (20 ns, where the tables
//! take more than twice that). On AMD Zen 3 crc-fast is ahead from 64
//! bytes, so the length where it takes over is measured per machine
//! (`crc64_limit`).
//!
//! Every CRC-64 here is reflected with `init` and `xorout` all ones; a test
//! holds each table to the `crc` crate's catalogue entry at every length.

/// Slicing-by-16 tables of a reflected CRC-64: `T[0]` is the
/// byte-at-a-time table, `T[k][b]` is `T[0][b]` carried through `k` more
/// zero bytes.
pub(crate) struct Tables([[u64; 256]; 16]);

impl Tables {
    /// The tables of the (unreflected) polynomial `poly`.
    const fn new(poly: u64) -> Tables {
        let poly = poly.reverse_bits();
        let mut t = [[0u64; 256]; 16];
        let mut b = 0;
        while b < 256 {
            let mut crc = b as u64;
            let mut bit = 0;
            while bit < 8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ poly
                } else {
                    crc >> 1
                };
                bit += 1;
            }
            t[0][b] = crc;
            b += 1;
        }
        let mut k = 1;
        while k < 16 {
            let mut b = 0;
            while b < 256 {
                let prev = t[k - 1][b];
                t[k][b] = (prev >> 8) ^ t[0][(prev & 0xff) as usize];
                b += 1;
            }
            k += 1;
        }
        Tables(t)
    }

    /// The CRC of `data` (`init` and `xorout` all ones).
    #[inline]
    pub(crate) fn checksum(&self, data: &[u8]) -> u64 {
        !self.update(!0, data)
    }

    /// Continues `state` (the register before the final XOR) over `data`.
    #[inline]
    pub(crate) fn update(&self, mut state: u64, data: &[u8]) -> u64 {
        let t = &self.0;
        let byte = |v: u64, shift: u32| ((v >> shift) & 0xff) as usize;
        // Eight bytes folded into `state` as one word, looked up in the
        // eight tables from `k`.
        let fold8 = |v: u64, k: usize| {
            t[k + 7][byte(v, 0)]
                ^ t[k + 6][byte(v, 8)]
                ^ t[k + 5][byte(v, 16)]
                ^ t[k + 4][byte(v, 24)]
                ^ t[k + 3][byte(v, 32)]
                ^ t[k + 2][byte(v, 40)]
                ^ t[k + 1][byte(v, 48)]
                ^ t[k][byte(v, 56)]
        };
        let word = |w: &[u8]| {
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(w);
            u64::from_le_bytes(bytes)
        };
        let mut blocks = data.chunks_exact(16);
        for b in &mut blocks {
            let (lo, hi) = b.split_at(8);
            state = fold8(state ^ word(lo), 8) ^ fold8(word(hi), 0);
        }
        let mut rest = blocks.remainder();
        if rest.len() >= 8 {
            let (w, tail) = rest.split_at(8);
            state = fold8(state ^ word(w), 0);
            rest = tail;
        }
        for &b in rest {
            state = (state >> 8) ^ t[0][byte(state ^ u64::from(b), 0)];
        }
        state
    }
}

/// CRC-64/NVME.
pub(crate) static NVME: Tables = Tables::new(crc::CRC_64_NVME.poly);
/// CRC-64/XZ.
pub(crate) static XZ: Tables = Tables::new(crc::CRC_64_XZ.poly);
/// CRC-64/GO-ISO.
pub(crate) static GO_ISO: Tables = Tables::new(crc::CRC_64_GO_ISO.poly);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_table_is_its_catalogue_entry() {
        let data: Vec<u8> = (0..200u32).map(|i| (i * 37 + 11) as u8).collect();
        for (tables, alg) in [
            (&NVME, &crc::CRC_64_NVME),
            (&XZ, &crc::CRC_64_XZ),
            (&GO_ISO, &crc::CRC_64_GO_ISO),
        ] {
            assert!(alg.refin && alg.refout && alg.init == !0 && alg.xorout == !0);
            assert_eq!(tables.checksum(b"123456789"), alg.check);
            let reference = crc::Crc::<u64>::new(alg);
            for len in 0..data.len() {
                assert_eq!(
                    tables.checksum(&data[..len]),
                    reference.checksum(&data[..len])
                );
            }
        }
    }
}
