//! One Space-Saving summary (Metwally, Agrawal and El Abbadi, 2005): the heaviest
//! keys of a stream in [`CAPACITY`] counters, whatever the number of keys.
//!
//! A key already counted adds to its counter. A new key takes a free counter, or
//! else the smallest one, inheriting its count as its error: so every count is an
//! over-estimate by at most its `error`, and `error` is at most `N / CAPACITY` for a
//! stream of `N` hits. Any key hit more than `N / CAPACITY` times is held. Counters
//! are plain arrays scanned linearly (128 keys is one kilobyte, faster to scan than
//! to hash into), with the last key hit checked first: a caller hammering a limit
//! finds its counter in one comparison.
//!
//! What a key stands for (its name, the limit that refused it) is its tag, made
//! when the key takes a counter and updated in place after; memory is fixed by
//! `CAPACITY` and the tag's size.

/// Counters per summary.
pub(crate) const CAPACITY: usize = 128;

/// The heaviest keys of a stream, each with what it stands for.
#[derive(Debug, Clone)]
pub(crate) struct Summary<T> {
    keys: [u64; CAPACITY],
    counts: [u32; CAPACITY],
    errors: [u32; CAPACITY],
    tags: Vec<T>,
    /// Hits counted since the summary was cleared.
    total: u64,
    /// The counter hit last.
    last: usize,
}

/// One held key, as read.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Held<T> {
    pub key: u64,
    /// An over-estimate of the key's hits: the true number is in
    /// `count - error ..= count`.
    pub count: u64,
    pub error: u64,
    pub tag: T,
}

impl<T: Clone> Summary<T> {
    /// An empty summary.
    pub(crate) fn new() -> Summary<T> {
        Summary {
            keys: [0; CAPACITY],
            counts: [0; CAPACITY],
            errors: [0; CAPACITY],
            tags: Vec::with_capacity(CAPACITY),
            total: 0,
            last: 0,
        }
    }

    /// Counts one hit of `key` and returns what it stands for, to update in place;
    /// `make` makes that when the key was not held (and is called only then).
    pub(crate) fn hit(&mut self, key: u64, make: impl FnOnce() -> T) -> &mut T {
        self.total += 1;
        let held = self.tags.len();
        let found = if self.last < held && self.keys[self.last] == key {
            Some(self.last)
        } else {
            self.keys[..held].iter().position(|&k| k == key)
        };
        let slot = match found {
            Some(slot) => {
                self.counts[slot] = self.counts[slot].saturating_add(1);
                slot
            }
            None if held < CAPACITY => {
                self.keys[held] = key;
                self.counts[held] = 1;
                self.errors[held] = 0;
                self.tags.push(make());
                held
            }
            None => {
                let smallest = (0..CAPACITY).min_by_key(|&i| self.counts[i]).unwrap_or(0);
                let inherited = self.counts[smallest];
                self.keys[smallest] = key;
                self.counts[smallest] = inherited.saturating_add(1);
                self.errors[smallest] = inherited;
                self.tags[smallest] = make();
                smallest
            }
        };
        self.last = slot;
        &mut self.tags[slot]
    }

    /// Forgets every key.
    pub(crate) fn clear(&mut self) {
        self.tags.clear();
        self.total = 0;
        self.last = 0;
    }

    /// Hits counted since the summary was cleared.
    pub(crate) fn total(&self) -> u64 {
        self.total
    }

    /// The most any held count overstates (and any key not held may have had): the
    /// smallest counter once every counter is taken, else 0.
    pub(crate) fn error_bound(&self) -> u64 {
        match self.tags.len() {
            CAPACITY => u64::from(self.counts.iter().copied().min().unwrap_or(0)),
            _ => 0,
        }
    }

    /// The held keys, in no order.
    pub(crate) fn held(&self) -> impl Iterator<Item = Held<T>> + '_ {
        self.tags.iter().enumerate().map(|(i, tag)| Held {
            key: self.keys[i],
            count: u64::from(self.counts[i]),
            error: u64::from(self.errors[i]),
            tag: tag.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{CAPACITY, Summary};

    fn hit(summary: &mut Summary<u64>, key: u64) {
        summary.hit(key, || key);
    }

    #[test]
    fn counts_exactly_while_the_keys_fit() {
        let mut summary = Summary::new();
        for key in 0..CAPACITY as u64 {
            for _ in 0..=key {
                hit(&mut summary, key);
            }
        }
        assert_eq!(summary.error_bound(), 1);
        for held in summary.held() {
            assert_eq!((held.count, held.error), (held.key + 1, 0));
        }
    }

    /// A stream with known counts: ten heavy keys among 100 000 keys hit once or
    /// twice, interleaved. Every heavy key is held; every held count is within its
    /// error of the truth, and every error within `N / CAPACITY`.
    #[test]
    fn heavy_keys_are_held_within_the_bound() {
        let mut summary = Summary::new();
        let mut truth = std::collections::HashMap::<u64, u64>::new();
        let mut n = 0u64;
        for round in 0..100_000u64 {
            let light = 1_000 + round;
            for _ in 0..=(round % 2) {
                hit(&mut summary, light);
                *truth.entry(light).or_default() += 1;
                n += 1;
            }
            if round % 20 == 0 {
                let heavy = round / 20 % 10;
                for _ in 0..(heavy + 1) * 10 {
                    hit(&mut summary, heavy);
                    *truth.entry(heavy).or_default() += 1;
                    n += 1;
                }
            }
        }
        assert_eq!(summary.total(), n);
        let bound = n / CAPACITY as u64;
        assert!(summary.error_bound() <= bound, "{}", summary.error_bound());
        let held: Vec<_> = summary.held().collect();
        for heavy in 0..10u64 {
            let truth = truth[&heavy];
            assert!(truth > bound, "the test's heavy keys must be over N/m");
            let found = held.iter().find(|h| h.key == heavy);
            let found = found.unwrap_or_else(|| panic!("heavy key {heavy} not held"));
            assert!(found.count >= truth && found.count - found.error <= truth);
        }
        for held in &held {
            let truth = truth[&held.key];
            assert!(held.count >= truth, "{held:?} under {truth}");
            assert!(held.count - held.error <= truth, "{held:?} vs {truth}");
            assert!(held.error <= bound);
        }
    }

    #[test]
    fn a_held_key_keeps_its_tag_to_update_in_place() {
        let mut summary = Summary::<u64>::new();
        *summary.hit(7, || 1) += 0;
        *summary.hit(7, || 100) += 1;
        summary.hit(7, || 100);
        let held: Vec<_> = summary.held().collect();
        assert_eq!((held[0].count, held[0].tag), (3, 2));
        summary.clear();
        assert_eq!(summary.held().count(), 0);
        assert_eq!(summary.total(), 0);
    }
}
