//! Billing periods: `per_month` and `per_year` as calendar periods of a time zone,
//! starting at local midnight on an anchor day.
//!
//! A month starts on the anchor's day of every month (the 1st by default; a 31st
//! anchor starts shorter months on their last day), a year on the anchor's day and
//! month (January 1st by default; February 29th falls on the 28th in other years).
//! Periods are computed with jiff (IANA zones, DST-aware), so a period's length in
//! milliseconds is whatever the zone's clocks made it, and cached per anchor until
//! the period ends, so a request costs one atomic load.
//!
//! A period is counted in one bucket named by the minute its period ends at
//! ([`Period::bucket`]): a count then says by itself when it stops counting, without
//! knowing the anchor or the zone it was counted under (the sweeper and a store
//! deciding by its own clock need neither). Local midnights fall on whole minutes in
//! every zone since 1972; an end that does not is rounded up, which only holds a count
//! longer. Nothing here reads a clock.

use std::sync::Arc;

use arc_swap::ArcSwap;
use jiff::tz::TimeZone;
use jiff::{Timestamp, civil};

/// The day billing periods start on: day of the month for `per_month`, day and
/// month for `per_year`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Anchor {
    month: i8,
    day: i8,
}

impl Anchor {
    /// Periods starting on the 1st, years on January 1st: the calendar's own.
    pub const CALENDAR: Anchor = Anchor { month: 1, day: 1 };

    /// The anchor of a consumer's `billing_anchor` date: its day of the month (and
    /// month, for years); the year does not matter.
    pub fn of_date(date: civil::Date) -> Anchor {
        Anchor {
            month: date.month(),
            day: date.day(),
        }
    }

    /// The anchor as the date it was read from would print in `year`, e.g. `03-15`.
    pub fn month_day(self) -> (i8, i8) {
        (self.month, self.day)
    }

    /// A dense index for per-anchor caches: 0 to 371.
    fn index(self) -> usize {
        (self.month as usize - 1) * 31 + (self.day as usize - 1)
    }
}

impl Default for Anchor {
    fn default() -> Anchor {
        Anchor::CALENDAR
    }
}

/// One billing period holding an instant: when it started and ends, and when the one
/// after it ends (a store deciding by its own clock picks whichever holds its now).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Period {
    /// Wall-clock ms of the local midnight that began it.
    pub starts_ms: u64,
    /// Wall-clock ms of the local midnight that ends it (the next period's start).
    pub ends_ms: u64,
    /// Wall-clock ms at which the next period ends.
    pub next_ends_ms: u64,
}

impl Period {
    /// The bucket a period ending at `ends_ms` counts in: the minute it ends at
    /// (rounded up), so a bucket says when it stops counting.
    pub fn bucket_of(ends_ms: u64) -> u32 {
        u32::try_from(ends_ms.div_ceil(60_000)).unwrap_or(u32::MAX)
    }

    /// This period's bucket.
    pub fn bucket(&self) -> u32 {
        Period::bucket_of(self.ends_ms)
    }

    /// Ms from `now_ms` until a bucket stops counting; 0 if it already has. A bucket
    /// ending later than the current period (the clock went back, or the anchor moved)
    /// keeps counting until its own end.
    pub fn expires_in(bucket: u32, now_ms: u64) -> u64 {
        (u64::from(bucket) * 60_000).saturating_sub(now_ms)
    }
}

/// The month and year periods holding one instant for one anchor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Periods {
    /// The `per_month` period.
    pub month: Period,
    /// The `per_year` period.
    pub year: Period,
}

impl Periods {
    /// Whether both periods still hold `ms`.
    fn hold(&self, ms: u64) -> bool {
        let holds = |p: &Period| p.starts_ms <= ms && ms < p.ends_ms;
        holds(&self.month) && holds(&self.year)
    }
}

/// The periods of `anchor` holding `ms` in `zone`.
pub fn periods(zone: &TimeZone, anchor: Anchor, ms: u64) -> Periods {
    let date = local_date(zone, ms);
    Periods {
        month: month_period(zone, anchor, date, ms),
        year: year_period(zone, anchor, date, ms),
    }
}

fn local_date(zone: &TimeZone, ms: u64) -> civil::Date {
    let ts = Timestamp::from_millisecond(ms as i64).unwrap_or(Timestamp::UNIX_EPOCH);
    ts.to_zoned(zone.clone()).date()
}

/// The day `anchor_day` in (year, month), or the month's last day if it is shorter.
fn clamped(year: i16, month: i8, anchor_day: i8) -> civil::Date {
    let first = civil::date(year, month, 1);
    civil::date(year, month, anchor_day.min(first.days_in_month()))
}

fn month_after(year: i16, month: i8) -> (i16, i8) {
    if month == 12 {
        (year + 1, 1)
    } else {
        (year, month + 1)
    }
}

fn month_before(year: i16, month: i8) -> (i16, i8) {
    if month == 1 {
        (year - 1, 12)
    } else {
        (year, month - 1)
    }
}

/// The ms of local midnight starting `date` in `zone` (the first instant of the day,
/// should a DST change skip midnight itself).
fn midnight(zone: &TimeZone, date: civil::Date, fallback: u64) -> u64 {
    date.to_zoned(zone.clone())
        .map(|z| z.timestamp().as_millisecond().max(0) as u64)
        .unwrap_or(fallback)
}

fn month_period(zone: &TimeZone, anchor: Anchor, date: civil::Date, ms: u64) -> Period {
    let (mut year, mut month) = (date.year(), date.month());
    if date < clamped(year, month, anchor.day) {
        (year, month) = month_before(year, month);
    }
    let start = clamped(year, month, anchor.day);
    let (ny, nm) = month_after(year, month);
    let end = clamped(ny, nm, anchor.day);
    let (ay, am) = month_after(ny, nm);
    let after = clamped(ay, am, anchor.day);
    let ends_ms = midnight(zone, end, ms + 1);
    Period {
        starts_ms: midnight(zone, start, ms),
        ends_ms,
        next_ends_ms: midnight(zone, after, ends_ms + 1),
    }
}

fn year_period(zone: &TimeZone, anchor: Anchor, date: civil::Date, ms: u64) -> Period {
    let mut year = date.year();
    if date < clamped(year, anchor.month, anchor.day) {
        year -= 1;
    }
    let at = |y: i16| clamped(y, anchor.month, anchor.day);
    let ends_ms = midnight(zone, at(year + 1), ms + 1);
    Period {
        starts_ms: midnight(zone, at(year), ms),
        ends_ms,
        next_ends_ms: midnight(zone, at(year + 2), ends_ms + 1),
    }
}

/// Turns instants into billing periods of one time zone, per anchor, caching each
/// anchor's periods until one of them ends.
#[derive(Debug)]
pub struct Calendars {
    zone: TimeZone,
    /// The last periods computed per anchor ([`Anchor::index`]).
    cached: Box<[ArcSwap<Option<Periods>>]>,
}

impl Calendars {
    /// Billing periods in `zone` (`[limits] timezone`).
    pub fn new(zone: TimeZone) -> Calendars {
        Calendars {
            zone,
            cached: (0..12 * 31).map(|_| ArcSwap::from_pointee(None)).collect(),
        }
    }

    /// The time zone periods are counted in.
    pub fn zone(&self) -> &TimeZone {
        &self.zone
    }

    /// The periods of `anchor` holding `ms`.
    pub fn periods(&self, anchor: Anchor, ms: u64) -> Periods {
        let slot = &self.cached[anchor.index()];
        if let Some(cached) = **slot.load()
            && cached.hold(ms)
        {
            return cached;
        }
        let fresh = periods(&self.zone, anchor, ms);
        slot.store(Arc::new(Some(fresh)));
        fresh
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(text: &str) -> u64 {
        text.parse::<Timestamp>().unwrap().as_millisecond() as u64
    }

    fn anchor(month: i8, day: i8) -> Anchor {
        Anchor::of_date(civil::date(2026, month, day))
    }

    #[test]
    fn calendar_months_start_at_local_midnight_on_the_first() {
        let utc = TimeZone::UTC;
        let p = periods(&utc, Anchor::CALENDAR, ms("2026-02-14T10:00:00Z"));
        assert_eq!(p.month.starts_ms, ms("2026-02-01T00:00:00Z"));
        assert_eq!(p.month.ends_ms, ms("2026-03-01T00:00:00Z"));
        assert_eq!(p.month.next_ends_ms, ms("2026-04-01T00:00:00Z"));
        assert_eq!(p.year.starts_ms, ms("2026-01-01T00:00:00Z"));
        assert_eq!(p.year.ends_ms, ms("2027-01-01T00:00:00Z"));
        // The boundary itself belongs to the next period.
        let next = periods(&utc, Anchor::CALENDAR, ms("2026-03-01T00:00:00Z"));
        assert_eq!(next.month.starts_ms, ms("2026-03-01T00:00:00Z"));
        let before = periods(&utc, Anchor::CALENDAR, ms("2026-03-01T00:00:00Z") - 1);
        assert_eq!(before.month, p.month);
    }

    #[test]
    fn a_month_across_a_dst_change_ends_exactly_at_local_midnight() {
        let paris = TimeZone::get("Europe/Paris").unwrap();
        // March 2026 in Paris loses an hour on the 29th: 30 days and 23 hours.
        let p = periods(&paris, Anchor::CALENDAR, ms("2026-03-29T12:00:00+02:00"));
        assert_eq!(p.month.starts_ms, ms("2026-03-01T00:00:00+01:00"));
        assert_eq!(p.month.ends_ms, ms("2026-04-01T00:00:00+02:00"));
        assert_eq!(
            p.month.ends_ms - p.month.starts_ms,
            (31 * 24 - 1) * 3_600_000
        );
        // October gains it back.
        let oct = periods(&paris, Anchor::CALENDAR, ms("2026-10-25T02:30:00+01:00"));
        assert_eq!(
            oct.month.ends_ms - oct.month.starts_ms,
            (31 * 24 + 1) * 3_600_000
        );
        assert_eq!(oct.year.ends_ms, ms("2027-01-01T00:00:00+01:00"));
    }

    #[test]
    fn an_anchor_on_the_31st_starts_shorter_months_on_their_last_day() {
        let utc = TimeZone::UTC;
        let a = anchor(1, 31);
        let p = periods(&utc, a, ms("2026-02-15T00:00:00Z"));
        assert_eq!(p.month.starts_ms, ms("2026-01-31T00:00:00Z"));
        assert_eq!(p.month.ends_ms, ms("2026-02-28T00:00:00Z"));
        assert_eq!(p.month.next_ends_ms, ms("2026-03-31T00:00:00Z"));
        let p = periods(&utc, a, ms("2026-04-30T00:00:00Z"));
        assert_eq!(p.month.starts_ms, ms("2026-04-30T00:00:00Z"));
        assert_eq!(p.month.ends_ms, ms("2026-05-31T00:00:00Z"));
        // Leap year February.
        let p = periods(&utc, a, ms("2028-02-29T12:00:00Z"));
        assert_eq!(p.month.starts_ms, ms("2028-02-29T00:00:00Z"));
        assert_eq!(p.month.ends_ms, ms("2028-03-31T00:00:00Z"));
    }

    #[test]
    fn a_mid_month_anchor_and_its_year() {
        let utc = TimeZone::UTC;
        let a = anchor(3, 15);
        let p = periods(&utc, a, ms("2026-03-14T23:59:59.999Z"));
        assert_eq!(p.month.starts_ms, ms("2026-02-15T00:00:00Z"));
        assert_eq!(p.month.ends_ms, ms("2026-03-15T00:00:00Z"));
        assert_eq!(p.year.starts_ms, ms("2025-03-15T00:00:00Z"));
        assert_eq!(p.year.ends_ms, ms("2026-03-15T00:00:00Z"));
        let p = periods(&utc, a, ms("2026-12-20T00:00:00Z"));
        assert_eq!(p.month.starts_ms, ms("2026-12-15T00:00:00Z"));
        assert_eq!(p.month.ends_ms, ms("2027-01-15T00:00:00Z"));
        // A February 29th anchor falls on the 28th in other years.
        let leap = Anchor::of_date(civil::date(2028, 2, 29));
        let p = periods(&utc, leap, ms("2026-06-01T00:00:00Z"));
        assert_eq!(p.year.starts_ms, ms("2026-02-28T00:00:00Z"));
        assert_eq!(p.year.ends_ms, ms("2027-02-28T00:00:00Z"));
        assert_eq!(p.year.next_ends_ms, ms("2028-02-29T00:00:00Z"));
    }

    #[test]
    fn buckets_say_when_they_stop_counting() {
        let utc = TimeZone::UTC;
        let p = periods(&utc, Anchor::CALENDAR, ms("2026-02-14T10:00:00Z"));
        let bucket = p.month.bucket();
        let now = ms("2026-02-14T10:00:00Z");
        assert_eq!(Period::expires_in(bucket, now), p.month.ends_ms - now);
        assert_eq!(Period::expires_in(bucket, p.month.ends_ms), 0);
        assert_eq!(Period::expires_in(bucket, p.month.ends_ms - 1), 1);
        // An end off the minute rounds up: held longer, never shorter.
        assert_eq!(Period::bucket_of(60_001), 2);
    }

    #[test]
    fn the_cache_answers_until_a_period_ends() {
        let calendars = Calendars::new(TimeZone::get("America/New_York").unwrap());
        let a = anchor(1, 31);
        let first = calendars.periods(a, ms("2026-02-27T23:59:59.999-05:00"));
        assert_eq!(calendars.periods(a, ms("2026-02-10T00:00:00-05:00")), first);
        let next = calendars.periods(a, ms("2026-02-28T00:00:00-05:00"));
        assert_eq!(next.month.starts_ms, first.month.ends_ms);
        // A clock that goes back gets its own period again.
        assert_eq!(calendars.periods(a, ms("2026-02-10T00:00:00-05:00")), first);
    }
}
