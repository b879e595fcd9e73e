//! [`Runs`]: one caller's counters for every window, in as few bytes as possible.
//!
//! The counters of a window are a list of entries, oldest first. For a limit of at
//! most [`super::window::EXACT_UP_TO`] the window is an exact log: one word per
//! admitted request, the millisecond it was made (a request of cost c takes c words,
//! so the count is the length). Above, the window is cut into 125 buckets and an
//! entry is a run of two words `(bucket, count)`, one per bucket that saw admitted
//! requests and still counts; the runs follow one word holding their total, so the
//! count of a window with a hundred live buckets is read, not summed. All windows of
//! a caller share one small vector of `u32` words:
//!
//! ```text
//! [header lo, header hi, words of second, minute, hour, day, calendar day]
//!  |                      `- exact: ms, ms, ...   bucketed: total, bucket, count, ...
//!  `- entry count per slot, one byte each, then one "exact" bit per sliding slot
//!     saying whether its entries are single milliseconds or (bucket, count) runs
//! ```
//!
//! Six words live inline, so a caller with one request in each of two windows needs
//! no heap allocation at all; a busy caller spills to the heap (a window has at most
//! 125 exact words, or 126 live runs). An empty `Runs` has no words. When a reload
//! moves a limit across the exact threshold, the slot's entries are converted in the
//! direction that can only hold requests longer. Deciding is pure: these methods take
//! the instant and the quotas and never read a clock or lock.

use smallvec::SmallVec;

use super::window::{CALENDAR_SLOT, Clocking, SLOTS, Window};
use super::{LimitStatus, Now, Quota, Report};

const HEADER_WORDS: usize = 2;
/// Bits per slot in the header for its entry count.
const LEN_BITS: usize = 8;
/// Most entries a slot holds (exact words or bucket runs).
const MAX_RUNS: usize = (1 << LEN_BITS) - 1;
/// Most words a caller's counters can take: every slot full of two-word runs.
pub const MAX_WORDS: usize = HEADER_WORDS + (1 + 2 * MAX_RUNS) * SLOTS;
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
            let entries = self.span_words(span);
            let limit = quota.limit.get();
            let fits = u64::from(used) + u64::from(cost) <= u64::from(limit);
            let retry_ms = if fits {
                None
            } else {
                admit = false;
                Some(retry_ms(entries, span.width, &clock, used, limit, cost))
            };
            let oldest = entries.first().copied().unwrap_or(clock.current());
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

    /// Counts `cost` requests at `now` in every quota's window. Call it after
    /// [`Runs::check`] with the same quotas and instant, which has brought every
    /// window into the quota's unit.
    pub fn commit(&mut self, quotas: &[Quota], now: &Now, cost: u32) {
        for quota in quotas {
            let slot = quota.window.slot(now);
            let exact = self.is_exact(slot);
            debug_assert_eq!(exact, counts_exactly(quota, slot));
            self.add(slot, Clocking::of_slot(slot, exact, now).current(), cost);
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
        let unused_bits = runs.header() >> (EXACT_SHIFT + Window::ALL.len());
        let well_formed = words.len() >= HEADER_WORDS
            && unused_bits == 0
            && words.len() == Span::of(runs.header(), SLOTS - 1).end()
            && (0..SLOTS).all(|slot| {
                let span = runs.span(slot);
                span.width == 1 || runs.used(span) == runs.sum_of_runs(span)
            });
        well_formed.then_some(runs)
    }

    /// Runs from words in the first state-file layout, where every entry was a
    /// `(bucket, count)` pair, exact milliseconds included.
    pub fn from_v1_words(words: &[u32]) -> Option<Runs> {
        if words.is_empty() {
            return Some(Runs::default());
        }
        let [lo, hi, pairs @ ..] = words else {
            return None;
        };
        let header = u64::from(*lo) | (u64::from(*hi) << 32);
        let len = |slot: usize| ((header >> (LEN_BITS * slot)) as usize) & MAX_RUNS;
        let unused_bits = header >> (EXACT_SHIFT + Window::ALL.len());
        if unused_bits != 0 || pairs.len() != 2 * (0..SLOTS).map(len).sum::<usize>() {
            return None;
        }
        let mut runs = Runs::default();
        let exact_bits = header >> EXACT_SHIFT << EXACT_SHIFT;
        runs.set_header(exact_bits);
        let mut pairs = pairs.chunks_exact(2);
        for slot in 0..SLOTS {
            for pair in pairs.by_ref().take(len(slot)) {
                runs.add(slot, pair[0], pair[1]);
            }
        }
        Some(runs)
    }

    /// The slot of `quota` and its clocking at `now`, converting the slot's runs if
    /// the quota's bucket size differs from the one they were counted in.
    fn prepare(&mut self, quota: &Quota, now: &Now) -> (usize, Clocking) {
        let slot = quota.window.slot(now);
        let exact = counts_exactly(quota, slot);
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
        // The slot is empty, so changing its entry width moves nothing.
        self.set_exact(slot, exact);
        for (bucket, count) in converted {
            self.add(slot, bucket, count);
        }
    }

    #[inline]
    fn header(&self) -> u64 {
        match self.words.as_slice() {
            [lo, hi, ..] => u64::from(*lo) | (u64::from(*hi) << 32),
            _ => 0,
        }
    }

    #[inline]
    fn set_header(&mut self, header: u64) {
        if self.words.len() < HEADER_WORDS {
            self.words.extend_from_slice(&[0; HEADER_WORDS]);
        }
        self.words[0] = header as u32;
        self.words[1] = (header >> 32) as u32;
    }

    /// Where `slot`'s runs are in the words.
    #[inline]
    fn span(&self, slot: usize) -> Span {
        Span::of(self.header(), slot)
    }

    #[cfg(test)]
    fn len(&self, slot: usize) -> usize {
        self.span(slot).len
    }

    #[inline]
    fn is_exact(&self, slot: usize) -> bool {
        exact_in(self.header(), slot)
    }

    fn set_exact(&mut self, slot: usize, exact: bool) {
        let bit = 1u64 << (EXACT_SHIFT + slot);
        let header = self.header();
        let header = if exact { header | bit } else { header & !bit };
        if header != self.header() {
            self.set_header(header);
        }
    }

    /// The words of a span's entries: `[ms, ms, ...]` for an exact slot,
    /// `[bucket, count, bucket, count, ...]` otherwise (none while the caller has no
    /// words at all).
    #[inline]
    fn span_words(&self, span: Span) -> &[u32] {
        self.words
            .get(span.entries_start()..span.end())
            .unwrap_or_default()
    }

    /// `slot`'s entries, oldest first, as (bucket, count).
    fn runs(&self, slot: usize) -> impl Iterator<Item = (u32, u32)> + '_ {
        let span = self.span(slot);
        self.span_words(span)
            .chunks_exact(span.width)
            .map(|entry| (entry[0], entry.get(1).copied().unwrap_or(1)))
    }

    #[inline]
    fn used(&self, span: Span) -> u32 {
        match (span.width, span.len) {
            (1, len) => len as u32,
            (_, 0) => 0,
            _ => self.words[span.start],
        }
    }

    /// The counts of a bucketed span's runs added up (what its total word holds).
    fn sum_of_runs(&self, span: Span) -> u32 {
        count_of_runs(self.span_words(span))
    }

    /// Drops `slot`'s leading entries that no longer count; returns what is left.
    fn prune(&mut self, slot: usize, clock: &Clocking) -> Span {
        let header = self.header();
        let span = Span::of(header, slot);
        let expired = expired_entries(self.span_words(span), span.width, clock);
        if expired == 0 {
            return span;
        }
        let left = span.len - expired;
        if left == 0 {
            self.words.drain(span.start..span.end());
        } else {
            let entries = span.entries_start();
            if span.width == 2 {
                let (gone, kept) = self.span_words(span).split_at(2 * expired);
                let total = self.words[span.start];
                // A total that saturated no longer says what is left: count again.
                self.words[span.start] = if total == u32::MAX {
                    count_of_runs(kept)
                } else {
                    total - count_of_runs(gone)
                };
            }
            self.words.drain(entries..entries + span.width * expired);
        }
        self.set_header(Span::with_len(header, slot, left));
        Span { len: left, ..span }
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
        if span.width == 1 {
            self.add_exact(header, slot, span, bucket, cost);
            return;
        }
        let end = span.end();
        if span.len == 0 {
            if self.words.is_empty() {
                self.words.extend_from_slice(&[0; HEADER_WORDS]);
            }
            self.words.insert_from_slice(end, &[cost, bucket, cost]);
            self.set_header(Span::with_len(header, slot, 1));
            return;
        }
        self.words[span.start] = self.words[span.start].saturating_add(cost);
        if self.words[end - 2] == bucket || span.len == MAX_RUNS {
            // Same bucket as the newest run; or no room for another run: then the
            // newest run moves up to this bucket, which holds its requests longer,
            // never shorter, so the window can only over-count.
            self.words[end - 2] = bucket;
            self.words[end - 1] = self.words[end - 1].saturating_add(cost);
            return;
        }
        self.words.insert_from_slice(end, &[bucket, cost]);
        self.set_header(Span::with_len(header, slot, span.len + 1));
    }

    /// Appends `cost` words of millisecond `ms` to an exact slot. An exact limit is
    /// at most 125, so a slot never needs more than [`MAX_RUNS`] words to admit; only
    /// a conversion from buckets can bring more, and then the oldest are dropped: the
    /// slot still counts `MAX_RUNS` (more than its limit) until every dropped request
    /// would have expired too, so it never admits early.
    fn add_exact(&mut self, header: u64, slot: usize, span: Span, ms: u32, cost: u32) {
        let cost = (cost as usize).min(MAX_RUNS);
        let dropped = (span.len + cost).saturating_sub(MAX_RUNS);
        if dropped > 0 {
            self.words.drain(span.start..span.start + dropped);
        }
        let end = span.end() - dropped;
        if cost == 1 {
            self.words.insert(end, ms);
        } else {
            self.words.insert_many(end, std::iter::repeat_n(ms, cost));
        }
        self.set_header(Span::with_len(header, slot, span.len - dropped + cost));
    }
}

/// Whether `quota`, counted in `slot`, keeps an exact log (calendar days never do).
fn counts_exactly(quota: &Quota, slot: usize) -> bool {
    slot != CALENDAR_SLOT && Window::is_exact(quota.limit.get())
}

/// How many of the leading entries (each `width` words) no longer count.
#[inline]
fn expired_entries(entries: &[u32], width: usize, clock: &Clocking) -> usize {
    if width == 1 {
        entries
            .iter()
            .take_while(|&&ms| clock.expires_in(ms) == 0)
            .count()
    } else {
        entries
            .chunks_exact(2)
            .take_while(|run| clock.expires_in(run[0]) == 0)
            .count()
    }
}

/// The requests counted by `(bucket, count)` runs (saturating).
fn count_of_runs(runs: &[u32]) -> u32 {
    runs.chunks_exact(2)
        .fold(0u32, |sum, run| sum.saturating_add(run[1]))
}

/// Ms until enough of the oldest requests in `entries` (each `width` words) have
/// expired for `cost` more to fit under `limit`.
fn retry_ms(
    entries: &[u32],
    width: usize,
    clock: &Clocking,
    used: u32,
    limit: u32,
    cost: u32,
) -> u64 {
    let mut remaining = u64::from(used);
    for entry in entries.chunks_exact(width) {
        remaining -= entry.get(1).map_or(1, |&count| u64::from(count));
        if remaining + u64::from(cost) <= u64::from(limit) {
            return clock.expires_in(entry[0]).max(1);
        }
    }
    // `cost` exceeds the limit itself: it never fits; answer a whole window.
    clock.expires_in(clock.current()).max(1)
}

/// Whether `header` marks `slot` as an exact log (calendar days never are).
#[inline]
fn exact_in(header: u64, slot: usize) -> bool {
    slot != CALENDAR_SLOT && header & (1 << (EXACT_SHIFT + slot)) != 0
}

/// One slot's entries within the words: index of the first word, number of
/// entries and words per entry (1 for exact milliseconds, 2 for bucket runs).
#[derive(Debug, Clone, Copy)]
struct Span {
    start: usize,
    len: usize,
    width: usize,
}

impl Span {
    /// The span of `slot` under `header`: it starts after the entries of the slots
    /// before.
    #[inline]
    fn of(header: u64, slot: usize) -> Span {
        let len = |s: usize| ((header >> (LEN_BITS * s)) as usize) & MAX_RUNS;
        let width = |s: usize| if exact_in(header, s) { 1 } else { 2 };
        let before: usize = (0..slot).map(|s| Span::words(len(s), width(s))).sum();
        Span {
            start: HEADER_WORDS + before,
            len: len(slot),
            width: width(slot),
        }
    }

    /// Words taken by `len` entries of `width`: a bucketed slot with runs has a
    /// total word before them.
    #[inline]
    fn words(len: usize, width: usize) -> usize {
        match (width, len) {
            (1, len) => len,
            (_, 0) => 0,
            (width, len) => 1 + width * len,
        }
    }

    /// The first word of the entries, after a bucketed slot's total.
    #[inline]
    fn entries_start(self) -> usize {
        self.end() - self.width * self.len
    }

    #[inline]
    fn end(self) -> usize {
        self.start + Span::words(self.len, self.width)
    }

    /// `header` with `slot`'s run count set to `len`.
    #[inline]
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

    /// Counters after one request at each of `times` (each must be admitted).
    fn after_requests(quotas: &[Quota], times: &[u64]) -> Runs {
        let mut runs = Runs::default();
        for &ms in times {
            assert!(
                !attempt(&mut runs, quotas, ms).rejected(),
                "refused at {ms}"
            );
        }
        runs
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
        let mut runs = after_requests(&[quota(Window::Minute, 2)], &[100, 5_000]);
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
        // Header, one exact millisecond, the day's total and its (bucket, count) run.
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
    fn an_exact_log_takes_one_word_per_request() {
        let quotas = [quota(Window::Minute, 100)];
        let mut runs = after_requests(&quotas, &[0, 0, 7, 9]);
        let minute = Window::Minute as usize;
        let header: u64 = (4 << (LEN_BITS * minute)) | (1 << (EXACT_SHIFT + minute));
        let words = [header as u32, (header >> 32) as u32, 0, 0, 7, 9];
        assert_eq!(runs.words.as_slice(), &words);
        assert!(Runs::from_words(runs.words()).is_some());
        assert!(Runs::from_words(&runs.words()[..5]).is_none());
        // The two requests at 0 leave together; the count is the number of words.
        let now = Now::sliding(60_000);
        assert_eq!(runs.used_at(&quotas[0], &now), 2);
        assert_eq!(runs.words.len(), 4);
    }

    #[test]
    fn a_bucketed_window_keeps_its_total_through_adds_and_expiry() {
        let quotas = [quota(Window::Second, 1_000)];
        // Buckets of 8 ms: 0, 0, 1, 62.
        let mut runs = after_requests(&quotas, &[0, 3, 10, 500]);
        assert_eq!(&runs.words[HEADER_WORDS..], &[4, 0, 2, 1, 1, 62, 1]);
        // Bucket 0 counts while t < 8 + 1 000 - 1.
        assert_eq!(runs.used_at(&quotas[0], &Now::sliding(1_006)), 4);
        assert_eq!(runs.used_at(&quotas[0], &Now::sliding(1_007)), 2);
        assert_eq!(&runs.words[HEADER_WORDS..], &[2, 1, 1, 62, 1]);
        assert!(Runs::from_words(runs.words()).is_some());
        // A total that disagrees with its runs is malformed.
        let mut words = runs.words().to_vec();
        words[HEADER_WORDS] = 3;
        assert!(Runs::from_words(&words).is_none());
        // Once every run has expired the slot takes no words at all.
        assert_eq!(runs.used_at(&quotas[0], &Now::sliding(2_000)), 0);
        assert_eq!(runs.words.len(), HEADER_WORDS);
    }

    #[test]
    fn first_layout_pairs_become_one_word_per_exact_request() {
        let (minute, day) = (Window::Minute as usize, Window::Day as usize);
        let header: u64 =
            (2 << (LEN_BITS * minute)) | (1 << (LEN_BITS * day)) | (1 << (EXACT_SHIFT + minute));
        // Minute (exact): 1 request at 100, 2 at 5 000. Day (bucketed): 7 in bucket 0.
        let v1 = [header as u32, (header >> 32) as u32, 100, 1, 5_000, 2, 0, 7];
        let runs = Runs::from_v1_words(&v1).unwrap();
        assert_eq!(
            runs.runs(minute).collect::<Vec<_>>(),
            [(100, 1), (5_000, 1), (5_000, 1)]
        );
        assert_eq!(runs.runs(day).collect::<Vec<_>>(), [(0, 7)]);
        assert_eq!(Runs::from_words(runs.words()), Some(runs));
        // A pair too many for the header is malformed.
        assert!(Runs::from_v1_words(&[v1.as_slice(), &[9, 1]].concat()).is_none());
    }

    #[test]
    fn a_full_bucket_becomes_the_newest_exact_requests_and_never_admits_early() {
        let mut runs = Runs::default();
        // 300 requests at once under 1 000 a minute: one bucket, [0, 480).
        for _ in 0..3 {
            let now = Now::sliding(100);
            let mut report = Report::default();
            let quotas = [quota(Window::Minute, 1_000)];
            assert!(runs.check(&quotas, &now, 100, false, &mut report));
            runs.commit(&quotas, &now, 100);
        }
        // Reloaded to 100 a minute: exact, 255 words kept, all at the bucket's last ms.
        let exact = quota(Window::Minute, 100);
        assert_eq!(runs.used_at(&exact, &Now::sliding(1_000)), MAX_RUNS as u32);
        assert_eq!(runs.used_at(&exact, &Now::sliding(60_478)), MAX_RUNS as u32);
        assert_eq!(runs.used_at(&exact, &Now::sliding(60_479)), 0);
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
