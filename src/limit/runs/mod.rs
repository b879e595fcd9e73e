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

use super::window::{Clocking, SLOTS, Window, is_calendar};
use super::{LimitStatus, Now, Quota, Report};

mod give_back;
mod layout;

pub use layout::MAX_WORDS;
use layout::{
    EXACT_SHIFT, FIRST_SLOTS, HEADER_BITS, HEADER_WORDS, LEN_BITS, MAX_RUNS, Span, count_of_runs,
    counts_exactly, exact_in, expired_entries, retry_ms,
};

/// One caller's counters for every window, packed into `u32` words (six inline
/// before it allocates); the module doc draws the layout.
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

    /// Takes back `cost` requests that [`Runs::commit`] counted at `at`: a request
    /// refused after it was admitted gives its quota back. Only entries of `at`'s own
    /// bucket are removed; if they are gone (expired, merged into a newer run, or
    /// converted by a reload), nothing is, so a refund never frees more than the
    /// request took and never lets a window admit early.
    pub fn refund(&mut self, quotas: &[Quota], at: &Now, cost: u32) {
        for quota in quotas {
            let slot = quota.window.slot(at);
            let exact = self.is_exact(slot);
            if !is_calendar(slot) && exact != counts_exactly(quota, slot) {
                continue;
            }
            let bucket = Clocking::of_slot(slot, exact, at).current();
            self.remove(slot, bucket, cost);
        }
    }

    /// Removes up to `cost` requests counted in `bucket` of `slot`, newest first.
    fn remove(&mut self, slot: usize, bucket: u32, cost: u32) {
        let header = self.header();
        let span = Span::of(header, slot);
        if span.len == 0 || cost == 0 {
            return;
        }
        if span.width == 1 {
            let mut left = cost;
            let mut removed = 0;
            for i in (span.start..span.end()).rev() {
                if left == 0 {
                    break;
                }
                if self.words[i] == bucket {
                    self.words.remove(i);
                    left -= 1;
                    removed += 1;
                }
            }
            self.set_header(Span::with_len(header, slot, span.len - removed));
            return;
        }
        let entries = span.entries_start();
        let Some(run) = (0..span.len)
            .rev()
            .map(|i| entries + 2 * i)
            .find(|&at| self.words[at] == bucket)
        else {
            return;
        };
        let taken = cost.min(self.words[run + 1]);
        self.words[run + 1] -= taken;
        if self.words[run + 1] == 0 {
            self.words.drain(run..run + 2);
            if span.len == 1 {
                // No run left: the slot's total word goes too.
                self.words.remove(span.start);
            }
            self.set_header(Span::with_len(header, slot, span.len - 1));
        }
        let span = Span::of(self.header(), slot);
        if span.len > 0 {
            let total = self.words[span.start];
            // A total that saturated no longer says what is left: count again.
            self.words[span.start] = if total == u32::MAX {
                self.sum_of_runs(span)
            } else {
                total.saturating_sub(taken)
            };
        }
    }

    /// Drops every expired run; true if nothing is counted any more (the caller is idle).
    pub fn prune_all(&mut self, now: &Now) -> bool {
        for slot in 0..SLOTS {
            if slot == super::window::CALENDAR_SLOT && now.calendar.is_none() {
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

    /// The last millisecond of the newest counted request (0 if none): when the caller
    /// was last admitted, to a bucket.
    pub fn last_seen_ms(&self, now: &Now) -> u64 {
        (0..SLOTS)
            .filter(|&slot| !is_calendar(slot))
            .filter_map(|slot| {
                let span = self.span(slot);
                let newest = self.span_words(span).chunks_exact(span.width).last()?;
                Clocking::of_slot(slot, span.width == 1, now).last_ms_of(newest[0])
            })
            .max()
            .unwrap_or(0)
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
        let unused_bits = runs.header() >> HEADER_BITS;
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
        let unused_bits = header >> (EXACT_SHIFT + Window::SLIDING.len());
        if unused_bits != 0 || pairs.len() != 2 * (0..FIRST_SLOTS).map(len).sum::<usize>() {
            return None;
        }
        let mut runs = Runs::default();
        let exact_bits = header >> EXACT_SHIFT << EXACT_SHIFT;
        runs.set_header(exact_bits);
        let mut pairs = pairs.chunks_exact(2);
        for slot in 0..FIRST_SLOTS {
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
        if !is_calendar(slot) && self.is_exact(slot) != exact {
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

#[cfg(test)]
mod tests;
