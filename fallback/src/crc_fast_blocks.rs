//! What crc-fast's wide loop leaves over, and so takes a block at a time.
//!
//! crc-fast (1.10) folds CRC-32/ISO-HDLC and the CRC-64s in 128-byte
//! blocks from the first 16-byte boundary of its input (512 bits a step
//! with VPCLMULQDQ on AVX-512 CPUs). The bytes ahead of that boundary, and
//! those after its last whole block, it takes one 16-byte block (or one
//! byte) at a time. On an Intel Xeon family 6 model 207 that cost 10 ns
//! for 16 bytes left over and ~60–75 for 128: `crc_fast::crc64_nvme` on
//! 1024 B took 37 ns, on 1040 B 48, on 1024 B 8 bytes past a boundary 110;
//! `crc_fast::crc32_iso_hdlc` on 4096 B took 75 ns, 8 bytes past a
//! boundary 149 (crc32fast: 75 either way). The fold and crc32fast take
//! the same time at any address, so inputs that would leave crc-fast 64
//! bytes or more stay on them up to lengths measured per process
//! (`crc64_limit`, `crc32_unaligned`).

/// Inputs this long or longer run crc-fast's 128-byte blocks at all.
pub(crate) const WIDE_MIN: usize = 256;

/// The bytes of `data` outside crc-fast's 128-byte blocks: those ahead of
/// the first 16-byte boundary and those after the last whole block.
#[inline(always)]
pub(crate) fn left_over(data: &[u8]) -> usize {
    let head = data.as_ptr().align_offset(16).min(data.len());
    head + (data.len() - head) % 128
}

/// Whether crc-fast would take enough of `data` a block at a time (64
/// bytes or more, the measurements' case being 128) that another
/// implementation should, below `until()` bytes (asked for only then: it
/// may measure).
#[inline(always)]
pub(crate) fn mostly_left_over(data: &[u8], until: impl FnOnce() -> usize) -> bool {
    data.len() >= WIDE_MIN && left_over(data) >= 64 && data.len() < until()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn left_over_counts_the_head_and_the_tail() {
        let buf = vec![0u8; 4096 + 64];
        let base = buf.as_ptr().align_offset(64).min(64);
        let at = |off: usize, len: usize| &buf[base + off..base + off + len];
        assert_eq!(left_over(at(0, 1024)), 0);
        assert_eq!(left_over(at(0, 1040)), 16);
        assert_eq!(left_over(at(8, 1024)), 8 + 1016 % 128);
        assert_eq!(left_over(at(8, 1032)), 8);
        assert_eq!(left_over(at(1, 10)), 10);
        assert_eq!(left_over(at(0, 0)), 0);
        assert!(mostly_left_over(at(8, 1024), || 2048));
        assert!(!mostly_left_over(at(8, 1024), || 1024));
        // Aligned or short inputs do not ask for the limit.
        assert!(!mostly_left_over(at(0, 1024), || unreachable!()));
        assert!(!mostly_left_over(at(8, 200), || unreachable!()));
    }
}
