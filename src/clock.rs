//! The only place sluice reads the wall clock (`clippy.toml` forbids it elsewhere).
//!
//! [`Clock`] is either the system clock or a manual clock that tests move by hand;
//! everything else receives milliseconds (or a `Now` from [`crate::limit::calendar`]) and
//! never asks for the time itself.
//!
//! For tests of a real process across a month or a DST change, the environment
//! variable [`TEST_NOW`] (`SLUICE_TEST_NOW=2026-01-31T23:59:50Z`) starts the system
//! clock at that instant instead of now; it then runs at the wall clock's pace. It
//! moves this process's clock only (Redis still decides by its own `TIME`), is logged
//! as a warning at start, and has no place outside tests.
#![allow(clippy::disallowed_methods)]

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of wall-clock milliseconds.
#[derive(Debug, Clone)]
pub enum Clock {
    /// The wall clock, read through the CPU's time-stamp counter ([`SystemClock`]).
    System(Arc<SystemClock>),
    /// A clock that only moves when a test says so.
    Manual(Arc<AtomicU64>),
}

impl Default for Clock {
    fn default() -> Self {
        Clock::System(Arc::new(SystemClock::new()))
    }
}

impl Clock {
    /// The system clock.
    pub fn system() -> Clock {
        Clock::default()
    }

    /// A manual clock starting at `ms`, and the handle that moves it.
    pub fn manual(ms: u64) -> (Clock, Arc<AtomicU64>) {
        let handle = Arc::new(AtomicU64::new(ms));
        (Clock::Manual(handle.clone()), handle)
    }

    /// Milliseconds since the Unix epoch.
    pub fn now_ms(&self) -> u64 {
        match self {
            Clock::System(clock) => clock.now_ms(),
            Clock::Manual(ms) => ms.load(Ordering::Relaxed),
        }
    }

    /// Re-aligns the system clock with the wall clock (called every second).
    pub fn resync(&self) {
        if let Clock::System(clock) = self {
            clock.resync();
        }
    }
}

/// Wall-clock milliseconds from the CPU's time-stamp counter.
///
/// Reading `SystemTime` costs a vDSO call per request (about 20 ns here, as much as a
/// whole limiter decision on a hot key); the TSC (through `quanta`) costs a few
/// nanoseconds. The TSC-derived time is anchored to the wall clock at start and
/// re-anchored by `SystemClock::resync` every second, in both directions, so a TSC
/// that runs fast or slow, or a wall clock that NTP steps, is followed within a second:
/// readings stay within the drift of one second (well under a millisecond) of the
/// wall clock. A step back of that size is harmless: the limiter keeps counting
/// requests stamped "ahead" of the clock until their windows have passed.
#[derive(Debug)]
pub struct SystemClock {
    tsc: quanta::Clock,
    start: u64,
    /// Ms added to every wall-clock reading: 0, unless [`TEST_NOW`] moved the clock.
    shift_ms: i64,
    /// Wall-clock ms at `start`, as the last resync measured it.
    offset_ms: AtomicI64,
}

impl SystemClock {
    fn new() -> SystemClock {
        let tsc = quanta::Clock::new();
        let start = tsc.raw();
        let shift_ms = test_shift_ms(std::env::var(TEST_NOW).ok().as_deref(), wall_ms());
        SystemClock {
            tsc,
            start,
            shift_ms,
            offset_ms: AtomicI64::new(wall_ms() as i64 + shift_ms),
        }
    }

    fn elapsed_ms(&self) -> u64 {
        self.tsc.delta_as_nanos(self.start, self.tsc.raw()) / 1_000_000
    }

    fn now_ms(&self) -> u64 {
        self.at(self.elapsed_ms())
    }

    /// The wall-clock ms `elapsed_ms` TSC milliseconds after start.
    fn at(&self, elapsed_ms: u64) -> u64 {
        let ms = self.offset_ms.load(Ordering::Relaxed) + elapsed_ms as i64;
        u64::try_from(ms).unwrap_or(0)
    }

    fn resync(&self) {
        let wall = u64::try_from(wall_ms() as i64 + self.shift_ms).unwrap_or(0);
        self.resync_at(wall, self.elapsed_ms());
    }

    /// Anchors the TSC so that `elapsed_ms` reads as `wall_ms`.
    fn resync_at(&self, wall_ms: u64, elapsed_ms: u64) {
        self.offset_ms
            .store(wall_ms as i64 - elapsed_ms as i64, Ordering::Relaxed);
    }
}

/// The environment variable that starts the system clock at another instant (an RFC
/// 3339 timestamp), for tests only.
pub const TEST_NOW: &str = "SLUICE_TEST_NOW";

/// The ms `TEST_NOW`'s value `value` moves the clock by at wall-clock `wall_ms`; 0
/// without one, or for one that is not a timestamp (logged).
fn test_shift_ms(value: Option<&str>, wall_ms: u64) -> i64 {
    let Some(value) = value else { return 0 };
    match value.parse::<jiff::Timestamp>() {
        Ok(at) => {
            tracing::warn!(%at, "{TEST_NOW} is set: the clock starts at {at}, not now (tests only)");
            at.as_millisecond() - wall_ms as i64
        }
        Err(err) => {
            tracing::warn!(
                value,
                "{TEST_NOW} is not an RFC 3339 timestamp ({err}); ignored"
            );
            0
        }
    }
}

/// The one wall-clock read of the program.
fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Measures short durations (request latency) with the TSC; never used for limits.
#[derive(Debug, Clone, Copy)]
pub struct Stopwatch(quanta::Instant);

impl Stopwatch {
    /// A stopwatch started now.
    pub fn start() -> Stopwatch {
        Stopwatch(quanta::Instant::now())
    }

    /// Seconds since the stopwatch started.
    pub fn elapsed_secs(&self) -> f64 {
        self.elapsed().as_secs_f64()
    }

    /// Time since the stopwatch started.
    pub fn elapsed(&self) -> std::time::Duration {
        quanta::Instant::now() - self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_test_instant_shifts_the_clock_and_anything_else_is_ignored() {
        let wall = 1_000_000;
        let at = "1970-01-01T00:16:41Z";
        assert_eq!(test_shift_ms(Some(at), wall), 1_001_000 - wall as i64);
        assert_eq!(test_shift_ms(Some("tomorrow"), wall), 0);
        assert_eq!(test_shift_ms(None, wall), 0);
    }

    #[test]
    fn the_system_clock_follows_the_wall_clock() {
        let clock = Clock::system();
        let first = clock.now_ms();
        assert!(first.abs_diff(wall_ms()) < 1_000);
        clock.resync();
        assert!(clock.now_ms().abs_diff(wall_ms()) < 1_000);
    }

    #[test]
    fn a_resync_follows_a_fast_or_a_slow_tsc_both_ways() {
        let clock = SystemClock::new();
        clock.resync_at(1_000_000, 0);
        // The TSC ran 1 % fast: 10 100 TSC ms passed while the wall clock moved 10 000.
        assert_eq!(clock.at(10_100), 1_010_100);
        clock.resync_at(1_010_000, 10_100);
        assert_eq!(clock.at(10_100), 1_010_000, "pulled back to the wall clock");
        // Then 1 % slow: 9 900 TSC ms for 10 000 wall ms.
        clock.resync_at(1_020_000, 20_000);
        assert_eq!(
            clock.at(20_000),
            1_020_000,
            "pushed forward to the wall clock"
        );
        // Over many resyncs the error never grows beyond one interval's drift.
        let mut wall = 1_020_000;
        let mut tsc = 20_000;
        for _ in 0..1_000 {
            wall += 1_000;
            tsc += 1_010;
            assert!(clock.at(tsc).abs_diff(wall) <= 10);
            clock.resync_at(wall, tsc);
        }
    }
}
