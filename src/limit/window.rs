//! Window arithmetic: lengths, bucket sizes, which bucket an instant falls in and
//! when a bucket stops counting.
//!
//! A limit of at most [`EXACT_UP_TO`] per window is counted exactly: its "buckets"
//! are single milliseconds, so a request counts until precisely `W` ms after it was
//! made. A larger limit cuts its window W into 125 buckets of G = W/125 ms. A bucket
//! `b` covers `[b*G, (b+1)*G)`; it counts at instant t while its last millisecond is
//! inside `(t - W, t]`, i.e. while `t < (b+1)*G + W - 1`. A request in the bucket may
//! really have left the window up to G - 1 ms earlier, so the count errs only upward.
//! A calendar day is one bucket per local day that counts until local midnight; a
//! billing period (`per_month`, `per_year`) is one bucket per period, named by the
//! minute it ends at, that counts until then (see `period`).

use super::period::Period;
use super::{CalendarDay, Now};

/// The six windows a plan can limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Window {
    /// `per_second`: a sliding window of one second.
    Second,
    /// `per_minute`: a sliding window of one minute.
    Minute,
    /// `per_hour`: a sliding window of one hour.
    Hour,
    /// `per_day`: a sliding 24 h window, or the local calendar day with
    /// `[limits] day = "calendar"`.
    Day,
    /// `per_month`: the calendar month (or billing month from a consumer's anchor)
    /// in `[limits] timezone`, counted exactly.
    Month,
    /// `per_year`: the calendar year (or billing year from a consumer's anchor).
    Year,
}

impl Window {
    /// Every window, shortest first.
    pub const ALL: [Window; 6] = [
        Window::Second,
        Window::Minute,
        Window::Hour,
        Window::Day,
        Window::Month,
        Window::Year,
    ];

    /// The sliding windows, in slot order.
    pub const SLIDING: [Window; 4] = [Window::Second, Window::Minute, Window::Hour, Window::Day];

    /// Whether this is a billing period (`per_month`, `per_year`).
    pub fn is_period(self) -> bool {
        matches!(self, Window::Month | Window::Year)
    }

    /// The name used in headers, metrics and problem bodies.
    pub fn name(self) -> &'static str {
        match self {
            Window::Second => "second",
            Window::Minute => "minute",
            Window::Hour => "hour",
            Window::Day => "day",
            Window::Month => "month",
            Window::Year => "year",
        }
    }

    /// The `total` flavour of the name, e.g. `total-second`.
    pub fn total_name(self) -> &'static str {
        match self {
            Window::Second => "total-second",
            Window::Minute => "total-minute",
            Window::Hour => "total-hour",
            Window::Day => "total-day",
            Window::Month => "total-month",
            Window::Year => "total-year",
        }
    }

    /// The config key, e.g. `per_minute`.
    pub fn key(self) -> &'static str {
        match self {
            Window::Second => "per_second",
            Window::Minute => "per_minute",
            Window::Hour => "per_hour",
            Window::Day => "per_day",
            Window::Month => "per_month",
            Window::Year => "per_year",
        }
    }

    /// The window's length W in milliseconds; `Day` is the sliding 24 h (a calendar
    /// day ends at local midnight instead); a billing period's nominal length (30
    /// and 365 days), which its real one differs from by month lengths and DST.
    pub fn length_ms(self) -> u64 {
        match self {
            Window::Second => 1_000,
            Window::Minute => 60_000,
            Window::Hour => 3_600_000,
            Window::Day => 86_400_000,
            Window::Month => 30 * 86_400_000,
            Window::Year => 365 * 86_400_000,
        }
    }

    /// Bucket size G of a bucketed limit, W/125: the only source of approximation.
    pub fn bucket_ms(self) -> u64 {
        match self {
            Window::Second => 8,
            Window::Minute => 480,
            Window::Hour => 28_800,
            Window::Day => 691_200,
            // One bucket per period.
            Window::Month => 30 * 86_400_000,
            Window::Year => 365 * 86_400_000,
        }
    }

    /// Whether a limit of `limit` per window is counted exactly (1 ms buckets).
    pub fn is_exact(limit: u32) -> bool {
        limit <= EXACT_UP_TO
    }

    /// Slot of this window in a caller's [`super::Runs`]; calendar days use slot 4,
    /// months 5 and years 6.
    #[inline]
    pub(crate) fn slot(self, now: &Now) -> usize {
        match (self, now.calendar) {
            (Window::Day, Some(_)) => CALENDAR_SLOT,
            (Window::Month, _) => MONTH_SLOT,
            (Window::Year, _) => YEAR_SLOT,
            _ => self as usize,
        }
    }
}

/// Limits up to this many per window are counted exactly, as a log of the
/// milliseconds of admitted requests (at most this many runs).
pub(super) const EXACT_UP_TO: u32 = 125;

/// The runs slot of calendar-day counters.
pub(crate) const CALENDAR_SLOT: usize = 4;
/// The runs slot of `per_month` counters.
pub(crate) const MONTH_SLOT: usize = 5;
/// The runs slot of `per_year` counters.
pub(crate) const YEAR_SLOT: usize = 6;
/// How many slots a caller's runs have.
pub(crate) const SLOTS: usize = 7;

/// Whether `slot` counts one bucket per calendar span (a day or a billing period)
/// rather than sliding buckets.
#[inline]
pub(crate) fn is_calendar(slot: usize) -> bool {
    slot >= CALENDAR_SLOT
}

/// How bucket numbers of one slot map to time, at one instant.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Clocking {
    Sliding {
        bucket_ms: u64,
        length_ms: u64,
        /// The current bucket, `now_ms / bucket_ms`.
        current: u64,
        now_ms: u64,
    },
    Calendar(CalendarDay, u64),
    /// A billing period: its current bucket (0 when the instant carries no periods:
    /// only expiry is asked then) and the instant.
    Period {
        current: u32,
        now_ms: u64,
    },
}

impl Clocking {
    /// The clocking of `slot` at `now`; `exact` slots count in single milliseconds.
    #[inline]
    pub(crate) fn of_slot(slot: usize, exact: bool, now: &Now) -> Clocking {
        match (slot, now.calendar) {
            (MONTH_SLOT | YEAR_SLOT, _) => {
                let window = if slot == MONTH_SLOT {
                    Window::Month
                } else {
                    Window::Year
                };
                Clocking::Period {
                    current: now.period(window).map_or(0, |p| p.bucket()),
                    now_ms: now.ms,
                }
            }
            (CALENDAR_SLOT, Some(day)) => Clocking::Calendar(day, now.ms),
            // Calendar runs without a calendar clock (the day mode changed): expired.
            (CALENDAR_SLOT, None) => Clocking::Calendar(
                CalendarDay {
                    index: u32::MAX,
                    starts_ms: 0,
                    ends_ms: now.ms,
                },
                now.ms,
            ),
            (slot, _) => {
                let window = Window::SLIDING[slot];
                let (bucket_ms, current) = if exact {
                    (1, now.ms)
                } else {
                    (window.bucket_ms(), now.bucket(window))
                };
                Clocking::Sliding {
                    bucket_ms,
                    length_ms: window.length_ms(),
                    current,
                    now_ms: now.ms,
                }
            }
        }
    }

    /// The bucket number of the current instant (wrapping to 32 bits).
    #[inline]
    pub(crate) fn current(&self) -> u32 {
        match *self {
            Clocking::Sliding { current, .. } => current as u32,
            Clocking::Calendar(day, _) => day.index,
            Clocking::Period { current, .. } => current,
        }
    }

    /// The full bucket number of a stored 32-bit one: the nearest to the current
    /// bucket, so a bucket "ahead" of now (the clock stepped back) stays ahead and
    /// keeps counting instead of looking ancient.
    #[inline]
    pub(crate) fn absolute(&self, bucket: u32) -> Option<u64> {
        match *self {
            Clocking::Sliding { current, .. } => {
                let age = i64::from((current as u32).wrapping_sub(bucket) as i32);
                u64::try_from(current as i64 - age).ok()
            }
            Clocking::Calendar(..) | Clocking::Period { .. } => Some(u64::from(bucket)),
        }
    }

    /// The stored bucket holding absolute millisecond `ms` under this clocking.
    pub(crate) fn bucket_of_ms(&self, ms: u64) -> u32 {
        match *self {
            Clocking::Sliding { bucket_ms, .. } => (ms / bucket_ms) as u32,
            Clocking::Calendar(day, _) => day.index,
            Clocking::Period { current, .. } => current,
        }
    }

    /// The last millisecond of stored bucket `bucket`.
    pub(crate) fn last_ms_of(&self, bucket: u32) -> Option<u64> {
        match *self {
            Clocking::Sliding { bucket_ms, .. } => {
                self.absolute(bucket).map(|b| (b + 1) * bucket_ms - 1)
            }
            Clocking::Calendar(..) | Clocking::Period { .. } => None,
        }
    }

    /// Milliseconds from now until bucket `bucket` stops counting; 0 if it already has.
    #[inline]
    pub(crate) fn expires_in(&self, bucket: u32) -> u64 {
        match *self {
            Clocking::Sliding {
                bucket_ms,
                length_ms,
                now_ms,
                ..
            } => {
                let Some(bucket) = self.absolute(bucket) else {
                    return 0;
                };
                let end = (bucket + 1) * bucket_ms + length_ms - 1;
                end.saturating_sub(now_ms)
            }
            // A later day than today means the clock went back: keep counting it.
            Clocking::Calendar(day, now_ms) if bucket >= day.index && bucket != u32::MAX => {
                day.ends_ms.saturating_sub(now_ms).max(1)
            }
            Clocking::Calendar(..) => 0,
            Clocking::Period { now_ms, .. } => Period::expires_in(bucket, now_ms),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exact_request_counts_for_exactly_one_window_length() {
        let at = |ms| Clocking::of_slot(Window::Minute as usize, true, &Now::sliding(ms));
        let made = at(59_999).current();
        assert_eq!(at(59_999).expires_in(made), 60_000);
        assert_eq!(at(119_998).expires_in(made), 1);
        assert_eq!(at(119_999).expires_in(made), 0);
    }

    #[test]
    fn a_bucket_counts_until_its_last_millisecond_leaves_the_window() {
        // Minute buckets are 480 ms: bucket 124 is [59_520, 60_000).
        let at = |ms| Clocking::of_slot(Window::Minute as usize, false, &Now::sliding(ms));
        assert_eq!(at(59_999).current(), 124);
        assert_eq!(at(59_999).expires_in(124), 60_000);
        assert_eq!(at(119_999).expires_in(124), 0);
        // A request at the bucket's first ms is held at most G - 1 ms longer.
        assert_eq!(at(59_520).expires_in(124), 60_479);
    }

    #[test]
    fn calendar_buckets_count_until_local_midnight() {
        let now = Now::new(
            1_000,
            Some(CalendarDay {
                index: 7,
                starts_ms: 0,
                ends_ms: 5_000,
            }),
        );
        let clock = Clocking::of_slot(CALENDAR_SLOT, false, &now);
        assert_eq!(clock.current(), 7);
        assert_eq!(clock.expires_in(7), 4_000);
        assert_eq!(clock.expires_in(6), 0);
        // A later day (the clock went back) still counts.
        assert_eq!(clock.expires_in(8), 4_000);
    }

    #[test]
    fn current_buckets_match_the_bucket_sizes() {
        let ms = 1_763_700_000_123;
        for window in Window::SLIDING {
            assert_eq!(Now::sliding(ms).bucket(window), ms / window.bucket_ms());
            assert_eq!(window.length_ms(), 125 * window.bucket_ms());
        }
    }

    #[test]
    fn old_buckets_expire_and_buckets_ahead_of_a_clock_that_went_back_still_count() {
        let clock = Clocking::of_slot(Window::Second as usize, false, &Now::sliding(10_000_000));
        assert_eq!(clock.expires_in(0), 0);
        let ahead = clock.current().wrapping_add(5);
        assert_eq!(clock.expires_in(ahead), 6 * 8 + 999);
    }
}
