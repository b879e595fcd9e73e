//! Calendar days: turning clock readings into [`Now`], with the local day when
//! `per_day` resets at midnight.
//!
//! Days are computed with jiff (IANA zones, DST-aware) and cached until the next local
//! midnight, so a request costs one clock read and one atomic load.

use std::sync::Arc;

use arc_swap::ArcSwap;
use jiff::tz::TimeZone;
use jiff::{Timestamp, civil};

use super::{CalendarDay, Now};

/// How `per_day` is counted.
#[derive(Debug, Clone)]
pub enum DayMode {
    /// A sliding 24 h window, like every other window.
    Sliding,
    /// Reset at local midnight of this time zone (23 or 25 h days across DST).
    Calendar(jiff::tz::TimeZone),
}

/// Turns clock readings into [`Now`], with the calendar day when `per_day` is calendar.
#[derive(Debug)]
pub struct Days {
    zone: Option<TimeZone>,
    /// The last day computed, valid for `[starts_ms, day.ends_ms)`.
    cached: ArcSwap<(u64, CalendarDay)>,
}

impl Days {
    /// Days as `[limits] day` counts them: sliding, or calendar days in its time zone.
    pub fn new(mode: &DayMode) -> Days {
        let zone = match mode {
            DayMode::Sliding => None,
            DayMode::Calendar(zone) => Some(zone.clone()),
        };
        let empty = CalendarDay {
            index: 0,
            starts_ms: 0,
            ends_ms: 0,
        };
        Days {
            zone,
            cached: ArcSwap::from_pointee((0, empty)),
        }
    }

    /// The instant `ms`, with its local calendar day if days are calendar days.
    pub fn now(&self, ms: u64) -> Now {
        let Some(zone) = &self.zone else {
            return Now::sliding(ms);
        };
        let (starts_ms, cached) = **self.cached.load();
        let day = if starts_ms <= ms && ms < cached.ends_ms {
            cached
        } else {
            let (starts_ms, day) = calendar_day_span(zone, ms);
            self.cached.store(Arc::new((starts_ms, day)));
            day
        };
        Now::new(ms, Some(day))
    }
}

/// The local day containing `ms` in `zone`, and when it ends.
pub fn calendar_day(zone: &TimeZone, ms: u64) -> CalendarDay {
    calendar_day_span(zone, ms).1
}

/// The local day containing `ms`, with the ms at which it started.
fn calendar_day_span(zone: &TimeZone, ms: u64) -> (u64, CalendarDay) {
    let ts = Timestamp::from_millisecond(ms as i64).unwrap_or(Timestamp::UNIX_EPOCH);
    let date = ts.to_zoned(zone.clone()).date();
    let epoch = civil::date(1970, 1, 1);
    let index = (date - epoch).get_days().max(0) as u32;
    let at_midnight = |d: civil::Date| {
        d.to_zoned(zone.clone())
            .map(|z| z.timestamp().as_millisecond().max(0) as u64)
    };
    let starts_ms = at_midnight(date).unwrap_or(ms);
    let ends_ms = date
        .tomorrow()
        .and_then(at_midnight)
        .unwrap_or(ms + 86_400_000);
    (
        starts_ms,
        CalendarDay {
            index,
            starts_ms,
            ends_ms,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(text: &str) -> u64 {
        text.parse::<Timestamp>().unwrap().as_millisecond() as u64
    }

    #[test]
    fn days_end_at_local_midnight_including_dst_days() {
        let paris = TimeZone::get("Europe/Paris").unwrap();
        // 2026-03-29 is 23 hours long in Paris (clocks jump 02:00 -> 03:00).
        let day = calendar_day(&paris, ms("2026-03-29T12:00:00+02:00"));
        assert_eq!(day.ends_ms, ms("2026-03-30T00:00:00+02:00"));
        let next = calendar_day(&paris, day.ends_ms);
        assert_eq!(next.index, day.index + 1);
        let previous = calendar_day(&paris, day.ends_ms - 23 * 3_600_000 - 1);
        assert_eq!(previous.index, day.index - 1);
        // 2026-10-25 is 25 hours long.
        let long = calendar_day(&paris, ms("2026-10-25T01:00:00+02:00"));
        assert_eq!(long.ends_ms, ms("2026-10-26T00:00:00+01:00"));
    }

    #[test]
    fn the_cached_day_is_replaced_at_midnight_and_after_clock_jumps() {
        let days = Days::new(&DayMode::Calendar(TimeZone::UTC));
        let midnight = ms("2026-11-21T00:00:00Z");
        let before = days.now(midnight - 1).calendar.unwrap();
        let after = days.now(midnight).calendar.unwrap();
        assert_eq!(after.index, before.index + 1);
        assert_eq!(days.now(midnight - 1).calendar.unwrap(), before);
    }
}
