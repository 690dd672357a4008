//! Which [`UNIT`](crate::dma::UNIT)s of a DMA pool are in use: a bitmap
//! searched first-fit a word at a time.
//!
//! It replaced a `Vec<bool>` walked a unit at a time, which was 19% of the
//! instructions of a request's caller thread on the driver's everyday path
//! (`valgrind --tool=callgrind --separate-threads=yes` around the
//! `per_request_cost` test: ~1,230 instructions a request in
//! `DmaPool::try_alloc`, walking past the rings and the requests in
//! flight). Under TCG a guest pays for every instruction it runs, so a
//! search that steps over a used word in one comparison is worth its code.

/// One bit per unit, set while in use.
#[derive(Debug, Clone)]
pub(crate) struct Units {
    words: Vec<u64>,
    /// Units in all (bits past it in the last word stay clear and are
    /// never handed out).
    len: usize,
}

impl Units {
    /// `len` units, all free.
    pub(crate) fn new(len: usize) -> Units {
        Units {
            words: vec![0; len.div_ceil(64)],
            len,
        }
    }

    /// Units in all.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The first of the lowest run of `n` free units, if there is one
    /// (`n` of 0 is taken as 1).
    pub(crate) fn find_free(&self, n: usize) -> Option<usize> {
        let n = n.max(1);
        let (mut i, mut start, mut run) = (0, 0, 0);
        while i < self.len {
            let bits = self.words[i / 64] >> (i % 64);
            let left = (64 - i % 64).min(self.len - i);
            if bits & 1 == 1 {
                // Used: step over the whole used stretch of this word.
                i += (bits.trailing_ones() as usize).min(left);
                (start, run) = (i, 0);
            } else {
                // Free: take the whole free stretch of this word (the
                // shift brought in zeros, hence the cap).
                let free = (bits.trailing_zeros() as usize).min(left);
                run += free;
                i += free;
                if run >= n {
                    return Some(start);
                }
            }
        }
        None
    }

    /// Marks `first..first + n` used (`set`) or free.
    ///
    /// # Panics
    /// If the range is past the end (callers pass ranges they found or
    /// were handed).
    pub(crate) fn mark(&mut self, first: usize, n: usize, set: bool) {
        assert!(first + n <= self.len, "units {first}+{n} past {}", self.len);
        let mut i = first;
        let end = first + n;
        while i < end {
            let (word, bit) = (i / 64, i % 64);
            let take = (64 - bit).min(end - i);
            let mask = if take == 64 {
                u64::MAX
            } else {
                ((1u64 << take) - 1) << bit
            };
            if set {
                self.words[word] |= mask;
            } else {
                self.words[word] &= !mask;
            }
            i += take;
        }
    }

    /// Whether every unit of `first..=last` is in use.
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn all_used(&self, first: usize, last: usize) -> bool {
        (first..=last).all(|i| i < self.len && self.words[i / 64] >> (i % 64) & 1 == 1)
    }

    /// Units in use.
    pub(crate) fn count_used(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The unit-at-a-time first fit it replaced: the model.
    fn model_find(used: &[bool], n: usize) -> Option<usize> {
        let n = n.max(1);
        let mut run = 0;
        for (i, u) in used.iter().enumerate() {
            run = if *u { 0 } else { run + 1 };
            if run == n {
                return Some(i + 1 - n);
            }
        }
        None
    }

    #[test]
    fn runs_cross_words_and_stop_at_the_end() {
        let mut u = Units::new(130);
        assert_eq!(u.find_free(130), Some(0));
        assert_eq!(u.find_free(131), None);
        u.mark(0, 60, true);
        // 4 free at the end of word 0, all of word 1: a run across them.
        assert_eq!(u.find_free(10), Some(60));
        u.mark(64, 64, true);
        assert_eq!(u.find_free(4), Some(60));
        assert_eq!(u.find_free(5), None, "60..64 then 128..130: no 5");
        assert_eq!(u.find_free(2), Some(60));
        u.mark(60, 4, true);
        assert_eq!(u.find_free(2), Some(128));
        assert_eq!(u.find_free(3), None, "the bits past len are not units");
        assert_eq!(u.count_used(), 128);
        assert!(u.all_used(0, 127) && !u.all_used(127, 128));
        u.mark(0, 130, false);
        assert_eq!(u.count_used(), 0);
        assert!(!u.all_used(129, 130), "past the end is not in use");
    }

    proptest! {
        /// Any sequence of allocations and frees finds what the
        /// unit-at-a-time search found, and keeps the same units in use.
        #[test]
        fn matches_the_unit_at_a_time_search(
            len in 1usize..300,
            ops in prop::collection::vec((1usize..80, any::<bool>(), any::<prop::sample::Index>()), 1..120),
        ) {
            let mut units = Units::new(len);
            let mut model = vec![false; len];
            let mut held: Vec<(usize, usize)> = Vec::new();
            for (n, alloc, pick) in ops {
                if alloc || held.is_empty() {
                    let found = units.find_free(n);
                    prop_assert_eq!(found, model_find(&model, n));
                    if let Some(first) = found {
                        units.mark(first, n, true);
                        model[first..first + n].iter_mut().for_each(|u| *u = true);
                        held.push((first, n));
                    }
                } else {
                    let (first, n) = held.swap_remove(pick.index(held.len()));
                    units.mark(first, n, false);
                    model[first..first + n].iter_mut().for_each(|u| *u = false);
                }
                prop_assert_eq!(units.count_used(), model.iter().filter(|u| **u).count());
                for (first, n) in &held {
                    prop_assert!(units.all_used(*first, first + n - 1));
                }
            }
        }
    }
}
