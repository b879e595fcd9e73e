//! [`Runs`]: one caller's counters for every window, in as few bytes as possible.
//!
//! The counters of a window are a list of runs `(bucket, count)`, oldest first, one
//! run per bucket that saw admitted requests and still counts. All windows of a
//! caller share one small vector of `u32` words:
//!
//! ```text
//! [header, bucket, count, bucket, count, ...]
//!  `- run count per slot, six bits each (second, minute, hour, day, calendar day)
//! ```
//!
//! Five words live inline, so a caller with one request in each of two windows needs
//! no heap allocation at all; a busy caller spills to the heap (at most 63 runs per
//! window: a sliding window has at most 63 live buckets, and were a 64th needed it
//! would be merged into the newest run, which only holds it longer). An empty `Runs`
//! has no words. Deciding is pure: these
//! methods take the instant and the quotas and never read a clock or lock.

use smallvec::SmallVec;

use super::window::{CALENDAR_SLOT, Clocking, SLOTS};
use super::{LimitStatus, Now, Quota, Report};

const HEADER_WORDS: usize = 1;
/// Bits per slot in the header.
const LEN_BITS: usize = 6;
const MAX_RUNS: usize = (1 << LEN_BITS) - 1;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Runs {
    words: SmallVec<[u32; 5]>,
}

impl Runs {
    /// Checks whether `cost` more requests fit every quota at `now`, recording each
    /// quota's state in `report`. Expired runs of the checked windows are dropped;
    /// nothing is counted until [`Runs::commit`].
    pub fn check(
        &mut self,
        quotas: &[Quota],
        now: &Now,
        cost: u32,
        total: bool,
        report: &mut Report,
    ) -> bool {
        let mut admit = true;
        for &quota in quotas {
            let slot = quota.window.slot(now);
            let clock = Clocking::of_slot(slot, now);
            self.prune(slot, &clock);
            let used = self.used(slot);
            let limit = quota.limit.get();
            let fits = u64::from(used) + u64::from(cost) <= u64::from(limit);
            let retry_ms = if fits {
                None
            } else {
                admit = false;
                Some(self.retry_ms(slot, &clock, used, limit, cost))
            };
            let reset_ms = match self.runs(slot).next() {
                Some((bucket, _)) => clock.expires_in(bucket),
                None => clock.expires_in(clock.current()),
            };
            report.push(LimitStatus {
                quota,
                total,
                used,
                reset_ms,
                retry_ms,
            });
        }
        admit
    }

    /// Counts `cost` requests at `now` in every quota's window.
    pub fn commit(&mut self, quotas: &[Quota], now: &Now, cost: u32) {
        for quota in quotas {
            let slot = quota.window.slot(now);
            let bucket = Clocking::of_slot(slot, now).current();
            self.add(slot, bucket, cost);
        }
    }

    /// Drops every expired run; true if nothing is counted any more (the caller is idle).
    pub fn prune_all(&mut self, now: &Now) -> bool {
        for slot in 0..SLOTS {
            if slot == CALENDAR_SLOT && now.calendar.is_none() {
                // Calendar runs without a calendar clock: the day mode changed; drop them.
                self.clear(slot);
                continue;
            }
            self.prune(slot, &Clocking::of_slot(slot, now));
        }
        if self.is_empty() {
            self.words = SmallVec::new();
            return true;
        }
        false
    }

    /// True when no window holds a run (possibly an expired one).
    pub fn is_empty(&self) -> bool {
        self.words.len() <= HEADER_WORDS
    }

    /// Requests counted in `quota`'s window at `now` (after dropping expired runs).
    pub fn used_at(&mut self, quota: &Quota, now: &Now) -> u32 {
        let slot = quota.window.slot(now);
        self.prune(slot, &Clocking::of_slot(slot, now));
        self.used(slot)
    }

    /// Heap bytes held beyond the inline words (for memory accounting).
    pub fn heap_bytes(&self) -> usize {
        if self.words.spilled() {
            self.words.capacity() * std::mem::size_of::<u32>()
        } else {
            0
        }
    }

    /// The raw words, for the state file.
    pub fn words(&self) -> &[u32] {
        &self.words
    }

    /// Runs from raw words, if they are well formed (header lengths match).
    pub fn from_words(words: &[u32]) -> Option<Runs> {
        let runs = Runs {
            words: SmallVec::from_slice(words),
        };
        if words.is_empty() {
            return Some(runs);
        }
        let runs_len: usize = (0..SLOTS).map(|slot| runs.len(slot)).sum();
        let unused_bits = runs.header() >> (LEN_BITS * SLOTS);
        (unused_bits == 0 && words.len() == HEADER_WORDS + 2 * runs_len).then_some(runs)
    }

    fn header(&self) -> u32 {
        self.words.first().copied().unwrap_or(0)
    }

    fn set_header(&mut self, header: u32) {
        match self.words.first_mut() {
            Some(word) => *word = header,
            None => self.words.push(header),
        }
    }

    fn len(&self, slot: usize) -> usize {
        ((self.header() >> (LEN_BITS * slot)) as usize) & MAX_RUNS
    }

    fn set_len(&mut self, slot: usize, len: usize) {
        debug_assert!(len <= MAX_RUNS);
        let shift = LEN_BITS * slot;
        let mask = (MAX_RUNS as u32) << shift;
        let header = (self.header() & !mask) | ((len as u32) << shift);
        self.set_header(header);
    }

    /// Index of the first word of `slot`'s runs.
    fn start(&self, slot: usize) -> usize {
        HEADER_WORDS + (0..slot).map(|s| 2 * self.len(s)).sum::<usize>()
    }

    /// `slot`'s runs, oldest first, as (bucket, count).
    fn runs(&self, slot: usize) -> impl Iterator<Item = (u32, u32)> + '_ {
        let start = self.start(slot);
        let words = &self.words[start.min(self.words.len())..];
        words[..2 * self.len(slot)]
            .chunks_exact(2)
            .map(|run| (run[0], run[1]))
    }

    fn used(&self, slot: usize) -> u32 {
        self.runs(slot)
            .fold(0u32, |sum, (_, count)| sum.saturating_add(count))
    }

    /// Drops `slot`'s leading runs that no longer count.
    fn prune(&mut self, slot: usize, clock: &Clocking) {
        let expired = self
            .runs(slot)
            .take_while(|&(bucket, _)| clock.expires_in(bucket) == 0)
            .count();
        if expired > 0 {
            let start = self.start(slot);
            self.words.drain(start..start + 2 * expired);
            let len = self.len(slot) - expired;
            self.set_len(slot, len);
        }
    }

    fn clear(&mut self, slot: usize) {
        let len = self.len(slot);
        if len > 0 {
            let start = self.start(slot);
            self.words.drain(start..start + 2 * len);
            self.set_len(slot, 0);
        }
    }

    /// Ms until enough old runs have expired for `cost` more to fit under `limit`.
    fn retry_ms(&self, slot: usize, clock: &Clocking, used: u32, limit: u32, cost: u32) -> u64 {
        let mut remaining = u64::from(used);
        for (bucket, count) in self.runs(slot) {
            remaining -= u64::from(count);
            if remaining + u64::from(cost) <= u64::from(limit) {
                return clock.expires_in(bucket).max(1);
            }
        }
        // `cost` exceeds the limit itself: it never fits; answer a whole window.
        clock.expires_in(clock.current()).max(1)
    }

    fn add(&mut self, slot: usize, bucket: u32, cost: u32) {
        let len = self.len(slot);
        let end = self.start(slot) + 2 * len;
        if len > 0 && (self.words[end - 2] == bucket || len == MAX_RUNS) {
            // Same bucket as the newest run; or no room for another run: then the
            // newest run moves up to this bucket, which holds its requests longer,
            // never shorter, so the window can only over-count.
            self.words[end - 2] = bucket;
            self.words[end - 1] = self.words[end - 1].saturating_add(cost);
            return;
        }
        if self.words.is_empty() {
            self.set_header(0);
        }
        let end = self.start(slot) + 2 * len;
        self.words.insert_many(end, [bucket, cost]);
        self.set_len(slot, len + 1);
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use super::*;
    use crate::limit::{CalendarDay, Window};

    fn quota(window: Window, limit: u32) -> Quota {
        Quota {
            window,
            limit: NonZeroU32::new(limit).unwrap(),
        }
    }

    fn attempt(runs: &mut Runs, quotas: &[Quota], ms: u64) -> Report {
        let now = Now::sliding(ms);
        let mut report = Report::default();
        if runs.check(quotas, &now, 1, false, &mut report) {
            runs.commit(quotas, &now, 1);
        }
        report
    }

    #[test]
    fn admits_up_to_the_limit_then_rejects_with_the_exact_wait() {
        let quotas = [quota(Window::Minute, 3)];
        let mut runs = Runs::default();
        for ms in [0, 10, 20] {
            assert!(!attempt(&mut runs, &quotas, ms).rejected());
        }
        let report = attempt(&mut runs, &quotas, 30);
        assert!(report.rejected());
        // The first request (bucket 0, last ms 999) leaves at 60_999.
        assert_eq!(report.retry_ms(), Some(60_999 - 30));
        assert!(attempt(&mut runs, &quotas, 60_998).rejected());
        assert!(!attempt(&mut runs, &quotas, 60_999).rejected());
    }

    #[test]
    fn one_request_in_two_windows_stays_inline() {
        let quotas = [quota(Window::Minute, 10), quota(Window::Day, 1000)];
        let mut runs = Runs::default();
        attempt(&mut runs, &quotas, 5);
        assert_eq!(runs.heap_bytes(), 0);
        assert_eq!(runs.words.len(), 5);
    }

    #[test]
    fn a_rejected_request_counts_in_no_window() {
        let quotas = [quota(Window::Second, 100), quota(Window::Minute, 1)];
        let mut runs = Runs::default();
        attempt(&mut runs, &quotas, 0);
        let before = runs.clone();
        let report = attempt(&mut runs, &quotas, 500);
        assert!(report.rejected());
        assert_eq!(runs.runs(Window::Second as usize).count(), 1);
        assert_eq!(runs, before);
    }

    #[test]
    fn calendar_days_reset_at_midnight() {
        let quotas = [quota(Window::Day, 2)];
        let day = |index, ms| {
            Now::new(
                ms,
                Some(CalendarDay {
                    index,
                    ends_ms: 1_000,
                }),
            )
        };
        let mut runs = Runs::default();
        for _ in 0..2 {
            let mut report = Report::default();
            assert!(runs.check(&quotas, &day(1, 10), 1, false, &mut report));
            runs.commit(&quotas, &day(1, 10), 1);
        }
        let mut report = Report::default();
        assert!(!runs.check(&quotas, &day(1, 900), 1, false, &mut report));
        assert_eq!(report.retry_ms(), Some(100));
        let mut report = Report::default();
        assert!(runs.check(&quotas, &day(2, 1_000), 1, false, &mut report));
    }

    #[test]
    fn a_full_run_list_holds_requests_longer_never_shorter() {
        // 2_000 per second at one request per 16 ms bucket: 63 runs fill the slot,
        // the 64th bucket must not be counted in an older one.
        let quotas = [quota(Window::Second, 2_000)];
        let mut runs = Runs::default();
        for i in 0..=MAX_RUNS as u64 {
            assert!(!attempt(&mut runs, &quotas, i * 16).rejected());
        }
        assert_eq!(runs.len(Window::Second as usize), MAX_RUNS);
        let newest = runs.runs(Window::Second as usize).last().unwrap();
        assert_eq!(newest, ((MAX_RUNS as u64 * 16 / 16) as u32, 2));
        let now = Now::sliding(MAX_RUNS as u64 * 16);
        let clock = Clocking::of_slot(Window::Second as usize, &now);
        assert_eq!(clock.expires_in(newest.0), 16 + 999);
    }

    #[test]
    fn idle_callers_prune_to_nothing() {
        let quotas = [quota(Window::Second, 5), quota(Window::Minute, 5)];
        let mut runs = Runs::default();
        attempt(&mut runs, &quotas, 0);
        assert!(!runs.prune_all(&Now::sliding(30_000)));
        assert!(runs.prune_all(&Now::sliding(61_000)));
        assert!(runs.words.is_empty());
    }
}
