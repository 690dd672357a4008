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
/// that runs below the length chosen and of the one that runs from it,
/// ascending by length), the length that loses least against the faster
/// of the two at every row (each row's time over the better one's,
/// summed): one noisy row moves it neither up nor down unless it outweighs
/// all the others. Ties go to the shorter; `None` without rows.
///
/// Past the last row is a candidate too ([`beyond`]), chosen when `before`
/// running every row loses strictly least: handing over at the last row
/// would give it to `from` where it was measured slower. CRC-32 8 bytes off
/// a boundary on an Intel Xeon family 6 model 207 (2026-12-05): crc32fast
/// led crc-fast at every row to 64 KiB (680 against 733 ns there), and
/// handing over at 64 KiB ran that length at 0.93 of crc32fast.
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
        .map(|r| r.0)
        .chain(beyond(rows))
        .map(|from| (from, loss(from)))
        .fold(None, |best: Option<(usize, f64)>, (from, l)| match best {
            Some((_, b)) if b <= l => best,
            _ => Some((from, l)),
        })
        .map(|(from, _)| from)
}

/// How far past the longest length timed [`beyond`] may put a handover:
/// 16 times it. The candidates these measurements hand over to are the
/// faster by the byte for long inputs (crc-fast's 512-bit loops: the
/// measured choice sends long inputs to them, and the fold is 128 bits a
/// step), behind only by a fixed cost for what they leave over; 16 times
/// past the last length timed that cost weighs a sixteenth of what it did
/// there. A line drawn through noise cannot send inputs past it, either:
/// on an Intel Xeon family 6 model 207 CRC-32's gap 8 bytes off a boundary
/// measured 53 ns at 32 and 64 KiB in one process, 39 and 62 in another.
pub(crate) const BEYOND_MAX: usize = 16;

/// Where `from` would overtake `before` past the last of `rows`: where the
/// least-squares line through the gaps between them (`from`'s time less
/// `before`'s, against length) reaches zero, at most [`BEYOND_MAX`] times
/// the last length, and that if the gaps do not close. `None` with fewer
/// than two rows (no line to draw: the last row hands over).
///
/// The gaps, not the last two rows alone: one row's noise would move the
/// line's end by as much as its slope.
pub(crate) fn beyond(rows: &[(usize, Duration, Duration)]) -> Option<usize> {
    let &(last, b, a) = rows.last()?;
    if rows.len() < 2 {
        return None;
    }
    let cap = last.saturating_mul(BEYOND_MAX).max(last.saturating_add(1));
    let gap = |b: Duration, a: Duration| a.as_secs_f64() - b.as_secs_f64();
    let n = rows.len() as f64;
    let mean_len = rows.iter().map(|r| r.0 as f64).sum::<f64>() / n;
    let mean_gap = rows.iter().map(|r| gap(r.1, r.2)).sum::<f64>() / n;
    let (mut cov, mut var) = (0.0, 0.0);
    for &(len, b, a) in rows {
        let dl = len as f64 - mean_len;
        cov += dl * (gap(b, a) - mean_gap);
        var += dl * dl;
    }
    // Zero where the line reaches zero from the last row's own gap.
    let last_gap = gap(b, a);
    let at = if last_gap <= 0.0 {
        // Already overtaken at the last row: just past it.
        last as f64 + 1.0
    } else if var > 0.0 && cov < 0.0 {
        last as f64 + last_gap / (-cov / var)
    } else {
        f64::INFINITY
    };
    // (`as` saturates: an infinite or huge length is usize::MAX.)
    Some((at.round() as usize).clamp(last.saturating_add(1), cap))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(len: usize, before: u64, from: u64) -> (usize, Duration, Duration) {
        (
            len,
            Duration::from_nanos(before),
            Duration::from_nanos(from),
        )
    }

    #[test]
    fn the_handover_is_where_the_second_loses_least() {
        assert_eq!(handover(&[]), None);
        // Ahead from the second row.
        let rows = [r(256, 10, 70), r(1024, 40, 30), r(4096, 120, 80)];
        assert_eq!(handover(&rows), Some(1024));
        // One noisy row does not move it.
        let rows = [
            r(256, 10, 70),
            r(1024, 40, 30),
            r(2048, 70, 90),
            r(4096, 120, 80),
        ];
        assert_eq!(handover(&rows), Some(1024));
        // Ahead everywhere: from the first.
        assert_eq!(handover(&[r(16, 20, 10), r(32, 40, 20)]), Some(16));
    }

    #[test]
    fn past_the_last_row_the_gaps_line_decides_within_a_bound() {
        let cap = |last: usize| last * BEYOND_MAX;
        // The first ahead at every row, by a gap that stays: handed over
        // at the bound, 16 times the last length.
        let rows = [r(256, 14, 67), r(32768, 302, 355), r(65536, 680, 733)];
        assert_eq!(beyond(&rows), Some(cap(65536)));
        assert_eq!(handover(&rows), Some(cap(65536)));
        // Model 207's CRC-32 8 bytes off (gaps 57, 53, 53 ns): closing
        // slowly, past 64 KiB and short of the bound.
        let rows = [r(256, 14, 71), r(32768, 302, 355), r(65536, 680, 733)];
        let at = handover(&rows).unwrap();
        assert!(at > 65536 && at < cap(65536), "{at}");
        // A gap closing by 10 ns every 1 KiB from 30 ns: 3 KiB on.
        let rows = [r(1024, 100, 140), r(2048, 200, 230)];
        assert_eq!(beyond(&rows), Some(2048 + 3 * 1024));
        assert_eq!(handover(&rows), Some(5120));
        // Gaps of 70, 65, 68, 60 ns: the line through all of them
        // crosses at ~26 KiB. The last row 8 ns slower flattens the line
        // and moves the crossing out, but no further than the bound
        // (the last two rows alone would have drawn no crossing at all).
        let quiet = [
            r(1024, 40, 110),
            r(2048, 70, 135),
            r(3072, 82, 150),
            r(4096, 110, 170),
        ];
        let noisy = [
            r(1024, 40, 110),
            r(2048, 70, 135),
            r(3072, 82, 150),
            r(4096, 110, 178),
        ];
        let (q, n) = (beyond(&quiet).unwrap(), beyond(&noisy).unwrap());
        assert!((26_000..28_000).contains(&q), "{q}");
        assert_eq!(n, cap(4096));
        // One row: no line; the last row hands over, as before.
        assert_eq!(beyond(&[r(64, 10, 20)]), None);
        assert_eq!(handover(&[r(4096, 110, 165)]), Some(4096));
        // Overtaken at the last row: just past it, which loses to the
        // last row itself.
        let rows = [r(1024, 100, 140), r(2048, 200, 190)];
        assert_eq!(beyond(&rows), Some(2049));
        assert_eq!(handover(&rows), Some(2048));
        // A gap closing over a tiny slope stops at the bound; huge
        // lengths saturate, not wrap.
        let rows = [r(1, 0, 1_000_000_000), r(2, 0, 999_999_999)];
        assert_eq!(beyond(&rows), Some(cap(2)));
        let rows = [r(usize::MAX - 1, 0, 10), r(usize::MAX, 0, 10)];
        assert_eq!(beyond(&rows), Some(usize::MAX));
        // Equal lengths: no slope, the bound.
        assert_eq!(beyond(&[r(64, 0, 10), r(64, 0, 10)]), Some(cap(64)));
        assert_eq!(beyond(&[]), None);
    }
}
