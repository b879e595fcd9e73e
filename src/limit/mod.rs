//! The limiter core: strict sliding windows, decided purely from state and `now`.
//!
//! Nothing here reads a clock, takes a lock or does I/O: a caller's counters
//! ([`Runs`]) plus the instant ([`Now`]) and the quotas go in, a verdict and the new
//! counters come out. Stores (`store`) own the maps of callers and the locking; the
//! clock module produces `Now`. The algorithm and its error bound are described in
//! `docs/limits.md`: limits up to 125 per window keep an exact log of milliseconds;
//! larger ones cut the window into 125 buckets, and a bucket counts while any instant
//! of it is still inside the window, so the count can only over-estimate and the
//! limit is never exceeded.

pub mod calendar;
pub mod period;
mod runs;
mod window;

#[cfg(test)]
mod oracle;

use std::num::NonZeroU32;

pub use period::{Anchor, Period, Periods};
pub use runs::{MAX_WORDS, Runs};
pub use window::Window;

/// One limit: at most `limit` requests per `window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    /// The window requests are counted over (`per_minute`: [`Window::Minute`]).
    pub window: Window,
    /// The most requests admitted within any one window (1 to 4 294 967 295).
    pub limit: NonZeroU32,
}

/// `limit` per `window`, for tests, benches and examples; panics on 0 (config
/// compiles its quotas with a diagnostic instead).
pub fn quota(window: Window, limit: u32) -> Quota {
    let limit = NonZeroU32::new(limit).expect("a quota's limit is positive");
    Quota { window, limit }
}

/// The instant a decision is made at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    /// Wall-clock milliseconds since the Unix epoch.
    pub ms: u64,
    /// The local calendar day, when `per_day` resets at midnight.
    pub calendar: Option<CalendarDay>,
    /// The caller's billing periods, when its quotas have `per_month` or `per_year`.
    pub periods: Option<Periods>,
}

impl Now {
    /// An instant with sliding days only.
    pub fn sliding(ms: u64) -> Now {
        Now::new(ms, None)
    }

    /// An instant; `calendar` is the local day when days are calendar days.
    pub fn new(ms: u64, calendar: Option<CalendarDay>) -> Now {
        Now {
            ms,
            calendar,
            periods: None,
        }
    }

    /// This instant with the billing periods of the caller it decides for.
    pub fn with_periods(self, periods: Periods) -> Now {
        Now {
            periods: Some(periods),
            ..self
        }
    }

    /// The billing period of `window` (`per_month`, `per_year`) at this instant.
    #[inline]
    pub(crate) fn period(&self, window: Window) -> Option<Period> {
        let periods = self.periods?;
        match window {
            Window::Month => Some(periods.month),
            Window::Year => Some(periods.year),
            _ => None,
        }
    }

    /// The current bucket number of a sliding window (a constant divisor per
    /// window, so a multiplication, not a division).
    #[inline]
    pub(crate) fn bucket(&self, window: Window) -> u64 {
        match window {
            Window::Second => self.ms / Window::Second.bucket_ms(),
            Window::Minute => self.ms / Window::Minute.bucket_ms(),
            Window::Hour => self.ms / Window::Hour.bucket_ms(),
            Window::Day => self.ms / Window::Day.bucket_ms(),
            // Billing periods are one bucket each, named by their end (see `period`).
            Window::Month | Window::Year => 0,
        }
    }
}

/// A local calendar day: its number and when it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CalendarDay {
    /// Days since 1970-01-01 in the configured zone.
    pub index: u32,
    /// Wall-clock ms of the local midnight that began it.
    pub starts_ms: u64,
    /// Wall-clock ms of the next local midnight (23 or 25 h away across DST).
    pub ends_ms: u64,
}

/// What one quota looked like when a request was decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitStatus {
    /// The window and limit this status is about.
    pub quota: Quota,
    /// True for a policy's `total` limits, false for the caller's plan limits.
    pub total: bool,
    /// Requests counted in the window, including this one if it was admitted.
    pub used: u32,
    /// Milliseconds until the oldest counted request leaves the window; for an empty
    /// window, until a request made now would.
    pub reset_ms: u64,
    /// Set when this quota rejected the request: ms until it would be admitted.
    pub retry_ms: Option<u64>,
}

impl LimitStatus {
    /// Requests the window still admits (0 when full): the `r` of the `RateLimit`
    /// header.
    pub fn remaining(&self) -> u32 {
        self.quota.limit.get().saturating_sub(self.used)
    }

    /// Whether the window holds more than its limit: only a cost charged after the
    /// response (or the decision API's `charge`) can put it there, so a refusal by
    /// this window is the caller's debt, not its request count.
    pub fn in_debt(&self) -> bool {
        self.used > self.quota.limit.get()
    }

    /// The limit that fired, as metrics and the access log's `would_refuse` name it:
    /// `cost` for a window in debt, else the window's name (`minute`, `total-minute`).
    pub fn limit_name(&self) -> &'static str {
        match (self.in_debt(), self.total) {
            (true, _) => "cost",
            (false, true) => self.quota.window.total_name(),
            (false, false) => self.quota.window.name(),
        }
    }
}

/// Up to twelve limit statuses (six plan windows, six total windows) without allocating.
#[derive(Debug, Clone, Default)]
pub struct Report {
    items: [Option<LimitStatus>; 12],
    len: usize,
    /// The instant the store decided at, in its own clock (Redis decides with its
    /// `TIME`): what a refund of an admitted request must name.
    pub at_ms: u64,
}

impl Report {
    /// Adds one quota's status; past the twelfth, statuses are dropped.
    pub fn push(&mut self, status: LimitStatus) {
        if self.len < self.items.len() {
            self.items[self.len] = Some(status);
            self.len += 1;
        }
    }

    /// The statuses, in the order they were pushed.
    pub fn iter(&self) -> impl Iterator<Item = &LimitStatus> {
        self.items[..self.len].iter().flatten()
    }

    /// Whether no quota status was recorded.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Records that the request was admitted: every window now counts it.
    pub fn admit(&mut self, cost: u32) {
        for status in self.items[..self.len].iter_mut().flatten() {
            status.used = status.used.saturating_add(cost);
        }
    }

    /// Records that an admitted request's `cost` was given back.
    pub fn refund(&mut self, cost: u32) {
        for status in self.items[..self.len].iter_mut().flatten() {
            status.used = status.used.saturating_sub(cost);
        }
    }

    /// Whether any quota rejected the request.
    pub fn rejected(&self) -> bool {
        self.iter().any(|s| s.retry_ms.is_some())
    }

    /// The position and wait of the rejecting quota that frees up last: the one
    /// that decides when the request could be admitted.
    pub fn binding_rejection(&self) -> Option<(usize, u64)> {
        self.iter()
            .enumerate()
            .filter_map(|(i, s)| s.retry_ms.map(|ms| (i, ms)))
            .max_by_key(|&(_, ms)| ms)
    }

    /// The names of the quotas that rejected the request (`minute`, `total-minute`),
    /// as `violated-policies` and the access log spell them.
    pub fn rejecting(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.iter()
            .filter(|s| s.retry_ms.is_some())
            .map(|s| match s.total {
                true => s.quota.window.total_name(),
                false => s.quota.window.name(),
            })
    }

    /// The limits that fired, for metrics and `would_refuse`: as [`Report::rejecting`],
    /// but a window in debt is `cost` (once, however many windows are in debt).
    pub fn fired(&self) -> impl Iterator<Item = &'static str> + '_ {
        let debt = self
            .iter()
            .position(|s| s.retry_ms.is_some() && s.in_debt());
        self.iter()
            .enumerate()
            .filter(move |&(i, s)| s.retry_ms.is_some() && (!s.in_debt() || Some(i) == debt))
            .map(|(_, s)| s.limit_name())
    }

    /// Milliseconds until every rejecting quota would admit the request.
    pub fn retry_ms(&self) -> Option<u64> {
        self.iter().filter_map(|s| s.retry_ms).max()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(window: Window, total: bool, limit: u32, used: u32, refused: bool) -> LimitStatus {
        LimitStatus {
            quota: quota(window, limit),
            total,
            used,
            reset_ms: 1_000,
            retry_ms: refused.then_some(1_000),
        }
    }

    #[test]
    fn a_window_in_debt_fires_as_cost_once_and_others_by_name() {
        let mut report = Report::default();
        report.push(status(Window::Second, false, 5, 1, false));
        report.push(status(Window::Minute, false, 100, 151, true));
        report.push(status(Window::Hour, false, 1_000, 1_051, true));
        report.push(status(Window::Minute, true, 500, 500, true));
        let fired: Vec<_> = report.fired().collect();
        assert_eq!(fired, ["cost", "total-minute"]);
        // violated-policies still names the windows, as the RateLimit headers do.
        let rejecting: Vec<_> = report.rejecting().collect();
        assert_eq!(rejecting, ["minute", "hour", "total-minute"]);
    }

    #[test]
    fn a_full_window_is_not_debt() {
        let mut report = Report::default();
        report.push(status(Window::Minute, false, 100, 100, true));
        assert_eq!(report.fired().collect::<Vec<_>>(), ["minute"]);
    }
}
