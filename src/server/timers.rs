//! The time limits of one connection, all kept by one timer: `header_timeout` (a
//! request head is due that long after the connection opened or its previous
//! response ended) and `idle_timeout` (no byte in either direction), and the
//! deadline of a connection asked to close.
//!
//! [`Timers`] only decides: it is told the time and what the connection did, and
//! answers when to wake next and whether to close or drop the connection. Sleeping
//! and closing are the connection supervisor's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The per-connection limits.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnLimits {
    /// No byte in either direction for this long closes the connection.
    pub idle: Duration,
    /// The first request head must arrive within this.
    pub header: Duration,
    /// hyper's HTTP/1 read buffer: no request head is longer.
    pub max_head: usize,
}

/// What the connection's timer found.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Check {
    /// Nothing is due before this.
    Wait(tokio::time::Instant),
    /// Idle: close gracefully, and check again then.
    Close(tokio::time::Instant),
    /// A limit passed: drop the connection.
    Cut(&'static str),
}

/// The time limits of one connection, all kept by one timer.
pub(super) struct Timers {
    opened: tokio::time::Instant,
    header_timeout: Duration,
    /// A quarter of `idle_timeout`: the idle check's period.
    tick: Duration,
    /// The next idle check, until the connection is closing.
    idle_check: Option<tokio::time::Instant>,
    quiet_ticks: u32,
    /// A connection asked to close that has not closed by then is dropped.
    force_close: Option<tokio::time::Instant>,
}

impl Timers {
    /// The limits of a connection that opened at `opened`.
    pub(super) fn new(limits: ConnLimits, opened: tokio::time::Instant) -> Timers {
        let tick = limits.idle / 4;
        Timers {
            opened,
            header_timeout: limits.header,
            tick,
            idle_check: Some(opened + tick),
            quiet_ticks: 0,
            force_close: None,
        }
    }

    /// How long a request head may take: the connection's `header_timeout`.
    pub(super) fn header_timeout(&self) -> Duration {
        self.header_timeout
    }

    /// When the timer first wakes: the first head or idle check, whichever is due
    /// first.
    pub(super) fn first_check(&self) -> tokio::time::Instant {
        self.earliest(self.opened + self.header_timeout)
    }

    /// Checks every limit at `now`. `head_due` is when the awaited request head is
    /// due, as time after the connection opened (`Exchanges::head_due`), None while no
    /// head is awaited; `active` says whether a byte moved since the last idle check,
    /// and is cleared by the idle check.
    pub(super) fn check(
        &mut self,
        now: tokio::time::Instant,
        head_due: Option<Duration>,
        active: &AtomicBool,
    ) -> Check {
        if self.force_close.is_some_and(|at| now >= at) {
            return Check::Cut("connection did not close gracefully in time; dropping it");
        }
        // A request being served puts the head check off by a whole header_timeout:
        // its answer ends later than now, so the head after it is due later still.
        let head_due = match head_due {
            Some(due) => self.opened + due,
            None => now + self.header_timeout,
        };
        if now >= head_due {
            return Check::Cut("no request head within header_timeout");
        }
        let mut close = false;
        if let Some(at) = self.idle_check
            && now >= at
        {
            // A connection is closed after between 1 and 1.25 idle_timeouts without a
            // byte in either direction.
            if active.swap(false, Ordering::Relaxed) {
                self.quiet_ticks = 0;
                self.idle_check = Some(now + self.tick);
            } else {
                self.quiet_ticks += 1;
                if self.quiet_ticks >= 4 {
                    close = true;
                    self.idle_check = None;
                    self.force_close = Some(now + self.tick * 4);
                } else {
                    self.idle_check = Some(now + self.tick);
                }
            }
        }
        let next = self.earliest(head_due);
        if close {
            Check::Close(next)
        } else {
            Check::Wait(next)
        }
    }

    /// No more idle checks: the connection is closing for another reason.
    pub(super) fn stop_idle_checks(&mut self) {
        self.idle_check = None;
    }

    /// Drops the connection at `at` if it has not closed by then (the timer must
    /// wake by then too).
    pub(super) fn force_close_at(&mut self, at: tokio::time::Instant) {
        self.idle_check = None;
        self.force_close = Some(at);
    }

    /// The next wake: the earliest of the head deadline, the idle check and the
    /// forced close.
    fn earliest(&self, head_due: tokio::time::Instant) -> tokio::time::Instant {
        [Some(head_due), self.idle_check, self.force_close]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(head_due)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::Instant;

    const HEADER: Duration = Duration::from_secs(10);
    const IDLE: Duration = Duration::from_secs(60);
    /// A quarter of `IDLE`: the idle check's period.
    const TICK: Duration = Duration::from_secs(15);
    const NO_HEAD: &str = "no request head within header_timeout";
    const NOT_CLOSED: &str = "connection did not close gracefully in time; dropping it";

    fn timers(opened: Instant) -> Timers {
        let limits = ConnLimits {
            idle: IDLE,
            header: HEADER,
            max_head: 8192,
        };
        Timers::new(limits, opened)
    }

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_first_wake_is_the_first_head_deadline_or_idle_check_whichever_comes_first() {
        let t0 = Instant::now();
        assert_eq!(timers(t0).first_check(), t0 + HEADER);
        let short_idle = ConnLimits {
            idle: secs(20),
            header: HEADER,
            max_head: 8192,
        };
        assert_eq!(Timers::new(short_idle, t0).first_check(), t0 + secs(5));
    }

    #[test]
    fn no_first_head_within_header_timeout_of_the_open_cuts_the_connection() {
        let t0 = Instant::now();
        let mut timers = timers(t0);
        let active = AtomicBool::new(true);
        let due = Some(HEADER);
        assert_eq!(
            timers.check(t0 + HEADER - ms(1), due, &active),
            Check::Wait(t0 + HEADER)
        );
        assert_eq!(timers.check(t0 + HEADER, due, &active), Check::Cut(NO_HEAD));
    }

    #[test]
    fn the_next_head_is_due_header_timeout_after_the_last_response_ended() {
        let t0 = Instant::now();
        let mut timers = timers(t0);
        let active = AtomicBool::new(true);
        // The last answer ended 3 s after the connection opened.
        let due = Some(secs(3) + HEADER);
        assert_eq!(
            timers.check(t0 + HEADER, due, &active),
            Check::Wait(t0 + secs(13))
        );
        assert_eq!(
            timers.check(t0 + secs(13) - ms(1), due, &active),
            Check::Wait(t0 + secs(13))
        );
        assert_eq!(
            timers.check(t0 + secs(13), due, &active),
            Check::Cut(NO_HEAD)
        );
    }

    #[test]
    fn a_request_being_served_puts_the_head_deadline_off_by_a_whole_header_timeout() {
        let t0 = Instant::now();
        let mut timers = timers(t0);
        let active = AtomicBool::new(true);
        // Long past the first head's deadline, but a request is being served.
        assert_eq!(
            timers.check(t0 + secs(11), None, &active),
            Check::Wait(t0 + TICK)
        );
        // The idle check was at 15 s: the next is at 30 s, the head check is sooner.
        assert_eq!(
            timers.check(t0 + TICK, None, &active),
            Check::Wait(t0 + TICK + HEADER)
        );
        assert_eq!(
            timers.check(t0 + TICK + HEADER, None, &active),
            Check::Wait(t0 + secs(30))
        );
    }

    #[test]
    fn a_check_before_the_idle_check_is_due_leaves_the_activity_flag_alone() {
        let t0 = Instant::now();
        let mut timers = timers(t0);
        let active = AtomicBool::new(true);
        timers.check(t0 + secs(5), None, &active);
        assert!(active.load(Ordering::Relaxed));
        // The idle check reads and clears it.
        timers.check(t0 + TICK, None, &active);
        assert!(!active.load(Ordering::Relaxed));
    }

    #[test]
    fn four_quiet_idle_checks_close_gracefully_and_idle_timeout_later_cut() {
        let t0 = Instant::now();
        let mut timers = timers(t0);
        let quiet = AtomicBool::new(false);
        // No head is awaited (HTTP/2 after its first request): only idle_timeout applies.
        for tick in 1..4 {
            let now = t0 + TICK * tick;
            assert_eq!(
                timers.check(now, None, &quiet),
                Check::Wait(now + HEADER),
                "quiet tick {tick}"
            );
        }
        let closing = t0 + IDLE;
        assert_eq!(
            timers.check(closing, None, &quiet),
            Check::Close(closing + HEADER)
        );
        // No more idle checks; the connection has idle_timeout to close.
        assert_eq!(
            timers.check(closing + HEADER, None, &quiet),
            Check::Wait(closing + HEADER * 2)
        );
        assert_eq!(
            timers.check(closing + IDLE - ms(1), None, &quiet),
            Check::Wait(closing + IDLE)
        );
        assert_eq!(
            timers.check(closing + IDLE, None, &quiet),
            Check::Cut(NOT_CLOSED)
        );
    }

    #[test]
    fn a_byte_moved_since_the_last_idle_check_starts_the_quiet_count_again() {
        let t0 = Instant::now();
        let mut timers = timers(t0);
        let active = AtomicBool::new(false);
        for tick in 1..4 {
            timers.check(t0 + TICK * tick, None, &active);
        }
        // A byte moved just before the fourth check.
        active.store(true, Ordering::Relaxed);
        assert!(matches!(
            timers.check(t0 + TICK * 4, None, &active),
            Check::Wait(_)
        ));
        // Closed between 1 and 1.25 idle_timeouts after that byte: four quiet checks.
        for tick in 5..8 {
            assert!(matches!(
                timers.check(t0 + TICK * tick, None, &active),
                Check::Wait(_)
            ));
        }
        assert!(matches!(
            timers.check(t0 + TICK * 8, None, &active),
            Check::Close(_)
        ));
    }

    #[test]
    fn an_idle_check_that_comes_late_schedules_the_next_a_tick_after_it_ran() {
        let t0 = Instant::now();
        let mut timers = timers(t0);
        let active = AtomicBool::new(true);
        // The head is due far off, so the next wake is the idle check.
        let due = Some(secs(1000));
        let late = t0 + TICK + secs(2);
        assert_eq!(timers.check(late, due, &active), Check::Wait(late + TICK));
    }

    #[test]
    fn after_idle_checks_stop_a_quiet_connection_is_never_closed_for_idling() {
        let t0 = Instant::now();
        let mut timers = timers(t0);
        let quiet = AtomicBool::new(false);
        timers.stop_idle_checks();
        for tick in 1..=8 {
            let now = t0 + TICK * tick;
            assert_eq!(timers.check(now, None, &quiet), Check::Wait(now + HEADER));
        }
    }

    #[test]
    fn a_forced_close_cuts_at_its_instant_and_is_woken_for() {
        let t0 = Instant::now();
        let mut timers = timers(t0);
        let active = AtomicBool::new(true);
        let at = t0 + secs(2);
        timers.force_close_at(at);
        assert_eq!(timers.check(t0 + secs(1), None, &active), Check::Wait(at));
        assert_eq!(timers.check(at, None, &active), Check::Cut(NOT_CLOSED));
    }

    #[test]
    fn a_forced_close_ends_the_idle_checks() {
        let t0 = Instant::now();
        let mut timers = timers(t0);
        let quiet = AtomicBool::new(false);
        timers.force_close_at(t0 + secs(1000));
        for tick in 1..=8 {
            let now = t0 + TICK * tick;
            assert_eq!(timers.check(now, None, &quiet), Check::Wait(now + HEADER));
        }
    }

    #[test]
    fn the_forced_close_is_reported_before_a_missed_head() {
        let t0 = Instant::now();
        let mut timers = timers(t0);
        let active = AtomicBool::new(true);
        timers.force_close_at(t0 + HEADER);
        assert_eq!(
            timers.check(t0 + HEADER, Some(HEADER), &active),
            Check::Cut(NOT_CLOSED)
        );
    }

    #[test]
    fn the_next_wake_is_the_earliest_of_head_deadline_idle_check_and_forced_close() {
        let t0 = Instant::now();
        let active = AtomicBool::new(true);
        let now = t0 + secs(1);
        // The head deadline first.
        let mut timers = timers(t0);
        assert_eq!(
            timers.check(now, Some(secs(5)), &active),
            Check::Wait(t0 + secs(5))
        );
        // The idle check first.
        assert_eq!(
            timers.check(now, Some(secs(100)), &active),
            Check::Wait(t0 + TICK)
        );
        // The forced close first.
        timers.force_close_at(t0 + secs(3));
        assert_eq!(
            timers.check(now, Some(secs(5)), &active),
            Check::Wait(t0 + secs(3))
        );
    }
}
