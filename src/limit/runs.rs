//! [`Runs`]: one caller's counters for every window, in as few bytes as possible.
//!
//! The counters of a window are a list of runs `(bucket, count)`, oldest first, one
//! run per bucket that saw admitted requests and still counts. For a limit of at
//! most [`super::window::EXACT_UP_TO`] a bucket is one millisecond (an exact log);
//! above, it is 1/125 of the window. All windows of a caller share one small vector
//! of `u32` words:
//!
//! ```text
//! [header lo, header hi, bucket, count, bucket, count, ...]
//!  `- run count per slot, one byte each (second, minute, hour, day, calendar day),
//!     then one "exact" bit per sliding slot saying which bucket size its runs use
//! ```
//!
//! Six words live inline, so a caller with one request in each of two windows needs
//! no heap allocation at all; a busy caller spills to the heap (a window has at most
//! 126 live runs: 125 exact milliseconds, or 126 live buckets). An empty `Runs` has no
//! words. When a reload moves a limit across the exact threshold, the slot's runs are
//! converted in the direction that can only hold requests longer. Deciding is pure:
//! these methods take the instant and the quotas and never read a clock or lock.

use smallvec::SmallVec;

use super::window::{CALENDAR_SLOT, Clocking, SLOTS, Window};
use super::{LimitStatus, Now, Quota, Report};

const HEADER_WORDS: usize = 2;
/// Bits per slot in the header for its run count.
const LEN_BITS: usize = 8;
const MAX_RUNS: usize = (1 << LEN_BITS) - 1;
/// First header bit of the per-slot "exact" flags.
const EXACT_SHIFT: usize = LEN_BITS * SLOTS;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Runs {
    words: SmallVec<[u32; 6]>,
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
            let (slot, clock) = self.prepare(&quota, now);
            let span = self.prune(slot, &clock);
            let used = self.used(span);
            let runs = self.span_words(span);
            let limit = quota.limit.get();
            let fits = u64::from(used) + u64::from(cost) <= u64::from(limit);
            let retry_ms = if fits {
                None
            } else {
                admit = false;
                Some(retry_ms(runs, &clock, used, limit, cost))
            };
            let oldest = runs.first().copied().unwrap_or(clock.current());
            report.push(LimitStatus {
                quota,
                total,
                used,
                reset_ms: clock.expires_in(oldest),
                retry_ms,
            });
        }
        admit
    }

    /// Counts `cost` requests at `now` in every quota's window.
    pub fn commit(&mut self, quotas: &[Quota], now: &Now, cost: u32) {
        for quota in quotas {
            let (slot, clock) = self.prepare(quota, now);
            self.add(slot, clock.current(), cost);
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
            let clock = Clocking::of_slot(slot, self.is_exact(slot), now);
            self.prune(slot, &clock);
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
        let (slot, clock) = self.prepare(quota, now);
        let span = self.prune(slot, &clock);
        self.used(span)
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
        let unused_bits = runs.header() >> (EXACT_SHIFT + Window::ALL.len());
        let well_formed = words.len() >= HEADER_WORDS
            && unused_bits == 0
            && words.len() == HEADER_WORDS + 2 * runs_len;
        well_formed.then_some(runs)
    }

    /// The slot of `quota` and its clocking at `now`, converting the slot's runs if
    /// the quota's bucket size differs from the one they were counted in.
    fn prepare(&mut self, quota: &Quota, now: &Now) -> (usize, Clocking) {
        let slot = quota.window.slot(now);
        let exact = slot != CALENDAR_SLOT && Window::is_exact(quota.limit.get());
        if slot != CALENDAR_SLOT && self.is_exact(slot) != exact {
            self.convert(slot, exact, now);
        }
        (slot, Clocking::of_slot(slot, exact, now))
    }

    /// Re-expresses a sliding slot's runs in the other bucket size, never releasing
    /// a request earlier than before: exact milliseconds go into the bucket that holds
    /// them; a bucket becomes its last millisecond.
    fn convert(&mut self, slot: usize, exact: bool, now: &Now) {
        let from = Clocking::of_slot(slot, !exact, now);
        let to = Clocking::of_slot(slot, exact, now);
        let mut converted: Vec<(u32, u32)> = Vec::new();
        for (bucket, count) in self.runs(slot) {
            let Some(last_ms) = from.last_ms_of(bucket) else {
                continue;
            };
            let bucket = to.bucket_of_ms(last_ms);
            match converted.last_mut() {
                Some(run) if run.0 == bucket => run.1 = run.1.saturating_add(count),
                _ => converted.push((bucket, count)),
            }
        }
        self.clear(slot);
        for (bucket, count) in converted {
            self.add(slot, bucket, count);
        }
        self.set_exact(slot, exact);
    }

    fn header(&self) -> u64 {
        match self.words.as_slice() {
            [lo, hi, ..] => u64::from(*lo) | (u64::from(*hi) << 32),
            _ => 0,
        }
    }

    fn set_header(&mut self, header: u64) {
        if self.words.len() < HEADER_WORDS {
            self.words.extend_from_slice(&[0; HEADER_WORDS]);
        }
        self.words[0] = header as u32;
        self.words[1] = (header >> 32) as u32;
    }

    /// Where `slot`'s runs are in the words.
    fn span(&self, slot: usize) -> Span {
        Span::of(self.header(), slot)
    }

    fn len(&self, slot: usize) -> usize {
        self.span(slot).len
    }

    fn is_exact(&self, slot: usize) -> bool {
        slot != CALENDAR_SLOT && self.header() & (1 << (EXACT_SHIFT + slot)) != 0
    }

    fn set_exact(&mut self, slot: usize, exact: bool) {
        let bit = 1u64 << (EXACT_SHIFT + slot);
        let header = self.header();
        let header = if exact { header | bit } else { header & !bit };
        if header != self.header() {
            self.set_header(header);
        }
    }

    /// The words of a span's runs: `[bucket, count, bucket, count, ...]` (none
    /// while the caller has no words at all).
    fn span_words(&self, span: Span) -> &[u32] {
        self.words.get(span.start..span.end()).unwrap_or_default()
    }

    /// `slot`'s runs, oldest first, as (bucket, count).
    fn runs(&self, slot: usize) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.span_words(self.span(slot))
            .chunks_exact(2)
            .map(|run| (run[0], run[1]))
    }

    fn used(&self, span: Span) -> u32 {
        self.span_words(span)
            .chunks_exact(2)
            .fold(0u32, |sum, run| sum.saturating_add(run[1]))
    }

    /// Drops `slot`'s leading runs that no longer count; returns what is left.
    fn prune(&mut self, slot: usize, clock: &Clocking) -> Span {
        let header = self.header();
        let span = Span::of(header, slot);
        let expired = self
            .span_words(span)
            .chunks_exact(2)
            .take_while(|run| clock.expires_in(run[0]) == 0)
            .count();
        if expired == 0 {
            return span;
        }
        self.words.drain(span.start..span.start + 2 * expired);
        let left = span.len - expired;
        self.set_header(Span::with_len(header, slot, left));
        Span {
            start: span.start,
            len: left,
        }
    }

    fn clear(&mut self, slot: usize) {
        let header = self.header();
        let span = Span::of(header, slot);
        if span.len > 0 {
            self.words.drain(span.start..span.end());
            self.set_header(Span::with_len(header, slot, 0));
        }
    }

    fn add(&mut self, slot: usize, bucket: u32, cost: u32) {
        let header = self.header();
        let span = Span::of(header, slot);
        let end = span.end();
        if span.len > 0 && (self.words[end - 2] == bucket || span.len == MAX_RUNS) {
            // Same bucket as the newest run; or no room for another run: then the
            // newest run moves up to this bucket, which holds its requests longer,
            // never shorter, so the window can only over-count.
            self.words[end - 2] = bucket;
            self.words[end - 1] = self.words[end - 1].saturating_add(cost);
            return;
        }
        if self.words.is_empty() {
            self.words.extend_from_slice(&[0; HEADER_WORDS]);
        }
        self.words.insert_from_slice(end, &[bucket, cost]);
        self.set_header(Span::with_len(header, slot, span.len + 1));
    }
}

/// Ms until enough of `runs`' oldest requests have expired for `cost` more to fit
/// under `limit`.
fn retry_ms(runs: &[u32], clock: &Clocking, used: u32, limit: u32, cost: u32) -> u64 {
    let mut remaining = u64::from(used);
    for run in runs.chunks_exact(2) {
        remaining -= u64::from(run[1]);
        if remaining + u64::from(cost) <= u64::from(limit) {
            return clock.expires_in(run[0]).max(1);
        }
    }
    // `cost` exceeds the limit itself: it never fits; answer a whole window.
    clock.expires_in(clock.current()).max(1)
}

/// One slot's runs within the words: index of the first word and number of runs.
#[derive(Debug, Clone, Copy)]
struct Span {
    start: usize,
    len: usize,
}

impl Span {
    /// The span of `slot` under `header`: it starts after the runs of the slots before.
    fn of(header: u64, slot: usize) -> Span {
        let len = |s: usize| ((header >> (LEN_BITS * s)) as usize) & MAX_RUNS;
        let before: usize = (0..slot).map(len).sum();
        Span {
            start: HEADER_WORDS + 2 * before,
            len: len(slot),
        }
    }

    fn end(self) -> usize {
        self.start + 2 * self.len
    }

    /// `header` with `slot`'s run count set to `len`.
    fn with_len(header: u64, slot: usize, len: usize) -> u64 {
        debug_assert!(len <= MAX_RUNS);
        let shift = LEN_BITS * slot;
        (header & !((MAX_RUNS as u64) << shift)) | ((len as u64) << shift)
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
    fn a_small_limit_is_exact_and_waits_exactly_one_window() {
        let quotas = [quota(Window::Minute, 3)];
        let mut runs = Runs::default();
        for ms in [0, 10, 20] {
            assert!(!attempt(&mut runs, &quotas, ms).rejected());
        }
        let report = attempt(&mut runs, &quotas, 30);
        assert!(report.rejected());
        // The first request (at 0) leaves the window at 60_000.
        assert_eq!(report.retry_ms(), Some(60_000 - 30));
        assert!(attempt(&mut runs, &quotas, 59_999).rejected());
        assert!(!attempt(&mut runs, &quotas, 60_000).rejected());
    }

    #[test]
    fn a_large_limit_counts_in_buckets_and_waits_for_the_whole_bucket() {
        let quotas = [quota(Window::Minute, 200)];
        let mut runs = Runs::default();
        for i in 0..200 {
            assert!(!attempt(&mut runs, &quotas, 100 + i).rejected());
        }
        let report = attempt(&mut runs, &quotas, 1_000);
        // Bucket 0 is [0, 480): it stops counting at 480 + 60_000 - 1.
        assert_eq!(report.retry_ms(), Some(60_479 - 1_000));
        assert!(attempt(&mut runs, &quotas, 60_478).rejected());
        assert!(!attempt(&mut runs, &quotas, 60_479).rejected());
    }

    #[test]
    fn a_reload_across_the_exact_threshold_never_releases_a_request_early() {
        let mut runs = Runs::default();
        for ms in [100, 5_000] {
            attempt(&mut runs, &[quota(Window::Minute, 2)], ms);
        }
        // Now 200 a minute: bucketed. The two requests still count...
        let bucketed = [quota(Window::Minute, 200)];
        assert_eq!(runs.used_at(&bucketed[0], &Now::sliding(60_099)), 2);
        // ...the first until the end of its 480 ms bucket, not before.
        assert_eq!(runs.used_at(&bucketed[0], &Now::sliding(60_478)), 2);
        assert_eq!(runs.used_at(&bucketed[0], &Now::sliding(60_479)), 1);
        // And back to exact: each bucket becomes its last millisecond.
        let exact = [quota(Window::Minute, 2)];
        assert_eq!(runs.used_at(&exact[0], &Now::sliding(60_479)), 1);
        assert_eq!(runs.used_at(&exact[0], &Now::sliding(65_279)), 0);
    }

    #[test]
    fn one_request_in_two_windows_stays_inline() {
        let quotas = [quota(Window::Minute, 10), quota(Window::Day, 1000)];
        let mut runs = Runs::default();
        attempt(&mut runs, &quotas, 5);
        assert_eq!(runs.heap_bytes(), 0);
        assert_eq!(runs.words.len(), 6);
        assert_eq!(std::mem::size_of::<Runs>(), 32);
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
                    starts_ms: 0,
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
        let mut runs = Runs::default();
        for bucket in 0..MAX_RUNS as u32 {
            runs.add(Window::Second as usize, bucket, 1);
        }
        // One more bucket than there is room for: the newest run moves up to it.
        runs.add(Window::Second as usize, MAX_RUNS as u32 + 7, 1);
        assert_eq!(runs.len(Window::Second as usize), MAX_RUNS);
        let newest = runs.runs(Window::Second as usize).last().unwrap();
        assert_eq!(newest, (MAX_RUNS as u32 + 7, 2));
        assert!(Runs::from_words(runs.words()).is_some());
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
