//! Window arithmetic: lengths, bucket sizes, which bucket an instant falls in and
//! when a bucket stops counting.
//!
//! A sliding window of length W is cut into buckets of G ms (W/60; 16 ms for the
//! one-second window). A bucket `b` covers `[b*G, (b+1)*G)`; it counts toward the
//! window at instant t while its last millisecond is inside `(t - W, t]`, i.e. while
//! `t < (b+1)*G + W - 1`. A request in the bucket may really have left the window up
//! to G - 1 ms earlier, so the count errs only upward. A calendar day is one bucket
//! per local day that counts until local midnight.

use super::{CalendarDay, Now};

/// The four windows a plan can limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Window {
    Second,
    Minute,
    Hour,
    Day,
}

impl Window {
    pub const ALL: [Window; 4] = [Window::Second, Window::Minute, Window::Hour, Window::Day];

    /// The name used in headers, metrics and problem bodies.
    pub fn name(self) -> &'static str {
        match self {
            Window::Second => "second",
            Window::Minute => "minute",
            Window::Hour => "hour",
            Window::Day => "day",
        }
    }

    /// The `total` flavour of the name, e.g. `total-second`.
    pub fn total_name(self) -> &'static str {
        match self {
            Window::Second => "total-second",
            Window::Minute => "total-minute",
            Window::Hour => "total-hour",
            Window::Day => "total-day",
        }
    }

    /// The config key, e.g. `per_minute`.
    pub fn key(self) -> &'static str {
        match self {
            Window::Second => "per_second",
            Window::Minute => "per_minute",
            Window::Hour => "per_hour",
            Window::Day => "per_day",
        }
    }

    pub fn length_ms(self) -> u64 {
        match self {
            Window::Second => 1_000,
            Window::Minute => 60_000,
            Window::Hour => 3_600_000,
            Window::Day => 86_400_000,
        }
    }

    /// Bucket size G: the only source of approximation, bounded by G / (W + G).
    pub fn bucket_ms(self) -> u64 {
        match self {
            Window::Second => 16,
            Window::Minute => 1_000,
            Window::Hour => 60_000,
            Window::Day => 1_440_000,
        }
    }

    /// Slot of this window in a caller's [`super::Runs`]; calendar days use slot 4.
    pub(crate) fn slot(self, now: &Now) -> usize {
        match (self, now.calendar) {
            (Window::Day, Some(_)) => CALENDAR_SLOT,
            _ => self as usize,
        }
    }
}

/// The runs slot of calendar-day counters.
pub(crate) const CALENDAR_SLOT: usize = 4;
/// How many slots a caller's runs have.
pub(crate) const SLOTS: usize = 5;

/// `ms / bucket_ms` for the four sliding windows, with constant divisors.
pub(crate) fn buckets_at(ms: u64) -> [u64; 4] {
    [ms / 16, ms / 1_000, ms / 60_000, ms / 1_440_000]
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
}

impl Clocking {
    /// The clocking of `slot` at `now`.
    pub(crate) fn of_slot(slot: usize, now: &Now) -> Clocking {
        match (slot, now.calendar) {
            (CALENDAR_SLOT, Some(day)) => Clocking::Calendar(day, now.ms),
            // Calendar runs without a calendar clock (the day mode changed): expired.
            (CALENDAR_SLOT, None) => Clocking::Calendar(
                CalendarDay {
                    index: u32::MAX,
                    ends_ms: now.ms,
                },
                now.ms,
            ),
            (slot, _) => {
                let window = Window::ALL[slot];
                Clocking::Sliding {
                    bucket_ms: window.bucket_ms(),
                    length_ms: window.length_ms(),
                    current: now.bucket(window),
                    now_ms: now.ms,
                }
            }
        }
    }

    /// The bucket number of the current instant (wrapping to 32 bits).
    pub(crate) fn current(&self) -> u32 {
        match *self {
            Clocking::Sliding { current, .. } => current as u32,
            Clocking::Calendar(day, _) => day.index,
        }
    }

    /// Milliseconds from now until bucket `bucket` stops counting; 0 if it already has.
    pub(crate) fn expires_in(&self, bucket: u32) -> u64 {
        match *self {
            Clocking::Sliding {
                bucket_ms,
                length_ms,
                current,
                now_ms,
            } => {
                // Buckets are stored in 32 bits; `age` is how many buckets ago it was.
                let age = u64::from((current as u32).wrapping_sub(bucket));
                if age > current {
                    return 0;
                }
                let end = (current - age + 1) * bucket_ms + length_ms - 1;
                end.saturating_sub(now_ms)
            }
            Clocking::Calendar(day, now_ms) if bucket == day.index => {
                day.ends_ms.saturating_sub(now_ms)
            }
            Clocking::Calendar(..) => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_counts_for_exactly_one_window_length_with_exact_buckets() {
        // With the minute window, a request at t = 59_999 (bucket 59) counts until
        // the bucket's last ms (59_999) is W ms old: t = 119_999.
        let at = |ms| Clocking::of_slot(Window::Minute as usize, &Now::sliding(ms));
        assert_eq!(at(59_999).current(), 59);
        assert_eq!(at(59_999).expires_in(59), 60_000);
        assert_eq!(at(119_998).expires_in(59), 1);
        assert_eq!(at(119_999).expires_in(59), 0);
    }

    #[test]
    fn early_requests_in_a_bucket_are_held_at_most_one_bucket_longer() {
        // A request at t = 59_000 shares bucket 59 and is held until 119_999:
        // 999 ms beyond its own window, never less than the window.
        let clock = Clocking::of_slot(Window::Minute as usize, &Now::sliding(59_000));
        assert_eq!(clock.expires_in(59), 60_999);
    }

    #[test]
    fn calendar_buckets_count_until_local_midnight() {
        let now = Now::new(
            1_000,
            Some(CalendarDay {
                index: 7,
                ends_ms: 5_000,
            }),
        );
        let clock = Clocking::of_slot(CALENDAR_SLOT, &now);
        assert_eq!(clock.current(), 7);
        assert_eq!(clock.expires_in(7), 4_000);
        assert_eq!(clock.expires_in(6), 0);
    }

    #[test]
    fn precomputed_buckets_match_the_bucket_sizes() {
        let ms = 1_763_700_000_123;
        for window in Window::ALL {
            assert_eq!(Now::sliding(ms).bucket(window), ms / window.bucket_ms());
        }
    }

    #[test]
    fn buckets_from_long_ago_have_expired() {
        let clock = Clocking::of_slot(Window::Second as usize, &Now::sliding(10_000_000));
        assert_eq!(clock.expires_in(0), 0);
        assert_eq!(clock.expires_in(clock.current().wrapping_add(5)), 0);
    }
}
