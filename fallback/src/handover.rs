//! What the CRC limits' measurements share (`crc64_limit`,
//! `crc32_unaligned`): their data, the timing of a slice of calls, and
//! the length from which one implementation hands over to another.

use std::time::{Duration, Instant};

/// `len` bytes, not all one value (no contender gets a pattern it could
/// short-cut), with 72 more so that they can start at a 64-byte boundary
/// and 8 bytes past it: the buffer and where that boundary is.
pub(crate) fn ladder_data(len: usize) -> (Vec<u8>, usize) {
    let buf: Vec<u8> = (0..len as u32 + 72)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let at = buf.as_ptr().align_offset(64).min(64);
    (buf, at)
}

/// The time one of `calls` calls of `f` on `input` took.
pub(crate) fn time_calls(f: &dyn Fn(&[u8]) -> u64, input: &[u8], calls: u32) -> Duration {
    let t = Instant::now();
    for _ in 0..calls {
        std::hint::black_box(f(std::hint::black_box(input)));
    }
    t.elapsed() / calls
}

/// Of `rows` `(length, before, from)` (the times of the implementation
/// that runs below the length chosen and of the one that runs from it),
/// the length that loses least against the faster of the two at every
/// row (each row's time over the better one's, summed): one noisy row
/// moves it neither up nor down unless it outweighs all the others. Ties
/// go to the shorter; `None` without rows.
pub(crate) fn handover(rows: &[(usize, Duration, Duration)]) -> Option<usize> {
    let loss = |from: usize| -> f64 {
        rows.iter()
            .map(|&(len, before, after)| {
                let ran = if len < from { before } else { after };
                ran.as_secs_f64() / before.min(after).as_secs_f64().max(f64::MIN_POSITIVE)
            })
            .sum()
    };
    rows.iter()
        .map(|r| (r.0, loss(r.0)))
        .fold(None, |best: Option<(usize, f64)>, (len, l)| match best {
            Some((_, b)) if b <= l => best,
            _ => Some((len, l)),
        })
        .map(|(len, _)| len)
}
