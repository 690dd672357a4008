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
    let past = beyond(rows)?;
    rows.iter()
        .map(|r| r.0)
        .chain([past])
        .map(|from| (from, loss(from)))
        .fold(None, |best: Option<(usize, f64)>, (from, l)| match best {
            Some((_, b)) if b <= l => best,
            _ => Some((from, l)),
        })
        .map(|(from, _)| from)
}

/// Where `from` would overtake `before` past the last of `rows`: where the
/// straight line through the gap between them at the last two rows
/// reaches zero, or `usize::MAX` if the gap does not close (or there is
/// one row). At least one past the last row; `None` without rows.
///
/// The gap is what `from` costs over `before`; from the last two rows it
/// estimates how fast the first's lead grows with length. The CRC
/// measurements' candidates past their ladders differ by a fixed cost
/// and their speeds, so a line is their model.
pub(crate) fn beyond(rows: &[(usize, Duration, Duration)]) -> Option<usize> {
    let &(last, b2, a2) = rows.last()?;
    let gap = |b: Duration, a: Duration| a.as_secs_f64() - b.as_secs_f64();
    let g2 = gap(b2, a2);
    let closing = match rows.len().checked_sub(2).map(|i| rows[i]) {
        Some((first, b1, a1)) if last > first && gap(b1, a1) > g2 => {
            Some((gap(b1, a1) - g2) / (last - first) as f64)
        }
        _ => None,
    };
    let at = match closing {
        // Already overtaken at the last row: just past it.
        _ if g2 <= 0.0 => last as f64 + 1.0,
        Some(per_byte) => last as f64 + g2 / per_byte,
        None => f64::INFINITY,
    };
    // (`as` saturates: an infinite or huge length is usize::MAX.)
    Some((at.round() as usize).max(last.saturating_add(1)))
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
    fn past_the_last_row_the_gaps_line_decides() {
        // The first ahead at every row, by a gap that grows or stays:
        // never handed over.
        let rows = [r(256, 14, 71), r(32768, 302, 355), r(65536, 680, 733)];
        assert_eq!(beyond(&rows), Some(usize::MAX));
        assert_eq!(handover(&rows), Some(usize::MAX));
        // A gap closing by 10 ns every 1 KiB from 30 ns: 3 KiB on.
        let rows = [r(1024, 100, 140), r(2048, 200, 230)];
        assert_eq!(beyond(&rows), Some(2048 + 3 * 1024));
        assert_eq!(handover(&rows), Some(5120));
        // One row: nothing to draw a line with.
        assert_eq!(beyond(&[r(64, 10, 20)]), Some(usize::MAX));
        // Overtaken at the last row: just past it, which loses to the
        // last row itself.
        let rows = [r(1024, 100, 140), r(2048, 200, 190)];
        assert_eq!(beyond(&rows), Some(2049));
        assert_eq!(handover(&rows), Some(2048));
        // A gap closing over a tiny slope saturates, not wraps.
        let rows = [r(1, 0, 1_000_000_000), r(2, 0, 999_999_999)];
        assert!(beyond(&rows).is_some_and(|b| b > 2));
        assert_eq!(beyond(&[]), None);
    }
}
