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

use super::connection::{Exchanges, Limits};

/// What the connection's timer found.
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
    pub(super) fn new(limits: Limits, opened: tokio::time::Instant) -> Timers {
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

    /// When the timer first wakes: the first head or idle check, whichever is due
    /// first.
    pub(super) fn first_check(&self) -> tokio::time::Instant {
        self.earliest(self.opened + self.header_timeout)
    }

    /// Checks every limit at `now`.
    pub(super) fn check(
        &mut self,
        now: tokio::time::Instant,
        exchanges: &Exchanges,
        active: &AtomicBool,
    ) -> Check {
        if self.force_close.is_some_and(|at| now >= at) {
            return Check::Cut("connection did not close gracefully in time; dropping it");
        }
        // A request being served puts the head check off by a whole header_timeout:
        // its answer ends later than now, so the head after it is due later still.
        let head_due = match exchanges.head_due(self.header_timeout) {
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

    fn earliest(&self, head_due: tokio::time::Instant) -> tokio::time::Instant {
        [Some(head_due), self.idle_check, self.force_close]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(head_due)
    }
}
