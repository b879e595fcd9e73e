//! The layout of a caller's words: the header's per-slot entry counts and "exact"
//! flags, where each slot's entries sit ([`Span`]), and the reads over a slot's
//! entries (expired ones, the count of runs, when enough will have expired).

use super::super::Quota;
use super::super::window::{CALENDAR_SLOT, Clocking, SLOTS, Window, is_calendar};

pub(super) const HEADER_WORDS: usize = 2;
/// Bits per slot in the header for its entry count.
pub(super) const LEN_BITS: usize = 8;
/// Most entries a slot holds (exact words or bucket runs).
pub(super) const MAX_RUNS: usize = (1 << LEN_BITS) - 1;
/// Most words a caller's counters can take: every slot full of two-word runs.
pub const MAX_WORDS: usize = HEADER_WORDS + (1 + 2 * MAX_RUNS) * SLOTS;
/// The slots of the first header layout (sliding windows and the calendar day),
/// whose entry counts sit below the "exact" flags.
pub(super) const FIRST_SLOTS: usize = CALENDAR_SLOT + 1;
/// First header bit of the per-slot "exact" flags (one per sliding window).
pub(super) const EXACT_SHIFT: usize = LEN_BITS * FIRST_SLOTS;
/// Header bits in use: the first slots' counts, the exact flags, then the billing
/// periods' counts (added after the exact flags, so older state files read as is).
pub(super) const HEADER_BITS: usize = EXACT_SHIFT + Window::SLIDING.len() + LEN_BITS * 2;

/// Where `slot`'s entry count sits in the header.
#[inline]
pub(super) const fn len_shift(slot: usize) -> usize {
    if slot < FIRST_SLOTS {
        LEN_BITS * slot
    } else {
        EXACT_SHIFT + Window::SLIDING.len() + LEN_BITS * (slot - FIRST_SLOTS)
    }
}

/// Whether `quota`, counted in `slot`, keeps an exact log (calendar spans never do:
/// they count one bucket each, exactly).
pub(super) fn counts_exactly(quota: &Quota, slot: usize) -> bool {
    !is_calendar(slot) && Window::is_exact(quota.limit.get())
}

/// How many of the leading entries (each `width` words) no longer count.
#[inline]
pub(super) fn expired_entries(entries: &[u32], width: usize, clock: &Clocking) -> usize {
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
pub(super) fn count_of_runs(runs: &[u32]) -> u32 {
    runs.chunks_exact(2)
        .fold(0u32, |sum, run| sum.saturating_add(run[1]))
}

/// Ms until enough of the oldest requests in `entries` (each `width` words) have
/// expired for `cost` more to fit under `limit`.
pub(super) fn retry_ms(
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

/// Whether `header` marks `slot` as an exact log (calendar spans never are).
#[inline]
pub(super) fn exact_in(header: u64, slot: usize) -> bool {
    !is_calendar(slot) && header & (1 << (EXACT_SHIFT + slot)) != 0
}

/// One slot's entries within the words: index of the first word, number of
/// entries and words per entry (1 for exact milliseconds, 2 for bucket runs).
#[derive(Debug, Clone, Copy)]
pub(super) struct Span {
    pub(super) start: usize,
    pub(super) len: usize,
    pub(super) width: usize,
}

impl Span {
    /// The span of `slot` under `header`: it starts after the entries of the slots
    /// before.
    #[inline]
    pub(super) fn of(header: u64, slot: usize) -> Span {
        let len = |s: usize| ((header >> len_shift(s)) as usize) & MAX_RUNS;
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
    pub(super) fn words(len: usize, width: usize) -> usize {
        match (width, len) {
            (1, len) => len,
            (_, 0) => 0,
            (width, len) => 1 + width * len,
        }
    }

    /// The first word of the entries, after a bucketed slot's total.
    #[inline]
    pub(super) fn entries_start(self) -> usize {
        self.end() - self.width * self.len
    }

    #[inline]
    pub(super) fn end(self) -> usize {
        self.start + Span::words(self.len, self.width)
    }

    /// `header` with `slot`'s run count set to `len`.
    #[inline]
    pub(super) fn with_len(header: u64, slot: usize, len: usize) -> u64 {
        debug_assert!(len <= MAX_RUNS);
        let shift = len_shift(slot);
        (header & !((MAX_RUNS as u64) << shift)) | ((len as u64) << shift)
    }
}
