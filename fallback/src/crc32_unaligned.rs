//! Where CRC-32/ISO-HDLC inputs that crc-fast would take partly a block at
//! a time ([`crate::crc_fast_blocks`]) go back to crc-fast from crc32fast:
//! measured once a process, the first time one is asked for.
//!
//! The measured choice of CRC-32's implementation is made on inputs at
//! 16-byte boundaries whose lengths are powers of two, crc-fast's best
//! case. On an Intel Xeon family 6 model 207 it chose crc-fast from 2 KiB
//! (75 ns at 4 KiB, crc32fast 75), and 8 bytes past a boundary crc-fast
//! then took 110 ns at 2 KiB and 134 at 4 KiB where crc32fast took 39 and
//! 62 (`paired --group crc-32 --offset 8 --all`). So where the choice
//! sends an input to crc-fast and crc-fast would leave 64 bytes or more of
//! it over, crc32fast runs it instead below [`crc32_crc_fast_from_unaligned`]:
//! the length that loses least over [`LADDER`], with both timed 8 bytes
//! past a boundary (128 bytes left over). Where crc32fast still leads at
//! 64 KiB, the length is past the ladder, where the line through the gaps
//! closes, at most 16 times 64 KiB ([`handover::beyond`]): crc-fast's
//! cost for what it leaves over is a fixed ~60–75 ns, a sixteenth as much
//! of a 1 MiB input's time as of a 64 KiB one's.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::crc_fast_blocks::WIDE_MIN;
use crate::handover::{self, handover};

/// The lengths crc-fast and crc32fast are timed at.
pub const LADDER: [usize; 9] = [WIDE_MIN, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536];

/// The measurement: the length and the figures it came from.
#[derive(Debug, Clone)]
pub struct Crc32Unaligned {
    /// Inputs crc-fast would take 64 bytes or more of a block at a time run
    /// on crc32fast below this, where the choice says crc-fast.
    pub crc_fast_from: usize,
    /// `(length, crc32fast, crc-fast)`, both 8 bytes past a 16-byte
    /// boundary: the fastest time one input took.
    pub timings: Vec<(usize, Duration, Duration)>,
    /// How long the measurement took.
    pub took: Duration,
}

/// [`Crc32Unaligned::crc_fast_from`], measured the first time it is asked
/// for.
#[inline]
pub fn crc32_crc_fast_from_unaligned() -> usize {
    match FROM.load(Ordering::Relaxed) {
        0 => crc32_unaligned_measured().crc_fast_from,
        from => from,
    }
}

static FROM: AtomicUsize = AtomicUsize::new(0);

/// [`crc32_crc_fast_from_unaligned`] with the timings it came from.
#[cold]
pub fn crc32_unaligned_measured() -> &'static Crc32Unaligned {
    static MEASURED: OnceLock<Crc32Unaligned> = OnceLock::new();
    let m = MEASURED.get_or_init(measure);
    FROM.store(m.crc_fast_from, Ordering::Relaxed);
    m
}

/// Calls a slice runs, and rounds of slices.
const CALLS: u32 = 8;
const ROUNDS: usize = 7;

fn measure() -> Crc32Unaligned {
    let start = Instant::now();
    let (buf, at) = handover::ladder_data(LADDER[LADDER.len() - 1]);
    let data = &buf[at + 8..];
    let hasher = crc32fast::Hasher::new();
    let slice = |f: &dyn Fn(&[u8]) -> u64, input: &[u8]| handover::time_calls(f, input, CALLS);
    let slow = |d: &[u8]| {
        let mut h = hasher.clone();
        h.update(d);
        u64::from(h.finalize())
    };
    let fast = |d: &[u8]| u64::from(crc_fast::crc32_iso_hdlc(d));
    let timings = LADDER
        .iter()
        .map(|&len| {
            let input = &data[..len];
            let (mut s, mut f) = (Duration::MAX, Duration::MAX);
            for round in 0..ROUNDS {
                if round % 2 == 0 {
                    s = s.min(slice(&slow, input));
                    f = f.min(slice(&fast, input));
                } else {
                    f = f.min(slice(&fast, input));
                    s = s.min(slice(&slow, input));
                }
            }
            (len, s, f)
        })
        .collect::<Vec<_>>();
    Crc32Unaligned {
        crc_fast_from: pick(&timings),
        timings,
        took: start.elapsed(),
    }
}

/// The length from which crc-fast loses least ([`handover()`]: a length
/// timed, or one past them); the longest on the ladder when nothing was
/// timed.
pub(crate) fn pick(timings: &[(usize, Duration, Duration)]) -> usize {
    handover(timings).unwrap_or(LADDER[LADDER.len() - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(len: usize, slow: u64, fast: u64) -> (usize, Duration, Duration) {
        (len, Duration::from_nanos(slow), Duration::from_nanos(fast))
    }

    #[test]
    fn crc_fast_keeps_inputs_from_where_it_stays_ahead_off_alignment() {
        // Model 207, 8 bytes off: crc32fast ahead to 16 KiB.
        let intel = [
            t(256, 12, 82),
            t(1024, 28, 100),
            t(4096, 62, 134),
            t(16384, 200, 259),
            t(65536, 800, 790),
        ];
        assert_eq!(pick(&intel), 65536);
        // Model 207 on 2026-12-05: crc32fast ahead at every length, by a
        // gap that closes by 4 ns from 256 B to 64 KiB: crc-fast takes
        // such inputs from 16 times the longest timed (1 MiB), where its
        // fixed cost is ~0.5% of either's time.
        let ahead = [
            t(256, 14, 71),
            t(4096, 53, 108),
            t(32768, 302, 355),
            t(65536, 680, 733),
        ];
        assert_eq!(pick(&ahead), 16 * 65536);
        // A gap that closes by 20 ns over the last 32 KiB: where the line
        // reaches zero, 2.5 gaps on.
        let closing = [t(32768, 300, 370), t(65536, 600, 650)];
        assert_eq!(pick(&closing), 65536 + 32768 * 50 / 20);
        // crc-fast ahead from 1 KiB (no penalty to speak of).
        let even = [t(256, 12, 14), t(1024, 40, 30), t(4096, 120, 80)];
        assert_eq!(pick(&even), 1024);
        // Ahead everywhere: from the shortest.
        assert_eq!(pick(&[t(256, 20, 10), t(512, 40, 20)]), 256);
        assert_eq!(pick(&[]), 65536);
    }

    #[test]
    fn the_measured_length_is_on_the_ladder_and_cached() {
        let m = crc32_unaligned_measured();
        let top = LADDER[LADDER.len() - 1];
        assert!(
            LADDER.contains(&m.crc_fast_from) || m.crc_fast_from > top,
            "{m:?}"
        );
        assert_eq!(m.timings.len(), LADDER.len());
        assert_eq!(crc32_crc_fast_from_unaligned(), m.crc_fast_from);
    }
}
