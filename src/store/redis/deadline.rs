//! A decision's deadline in Redis's clock: a call Redis runs after the gateway gave
//! up on it counts nothing.
//!
//! A decision that waits longer than `[store] timeout` is decided by `on_error`
//! (`deny`: a 503), but the script call is already on its way: a Redis that was
//! frozen, or slow, runs it when it can and would count a request its caller was
//! refused. So each call carries the moment, in Redis's `TIME`, after which its
//! decisions must count nothing (`limit.lua` answers them "too late", and the
//! gateway treats that as the timeout it already was).
//!
//! A decision's deadline is the instant its wait started plus the timeout, on the
//! monotonic clock the wait itself is timed with; [`Skew`] maps that clock onto
//! Redis's, learnt from the answers themselves (Redis's instant in each answer
//! against the instant the call was sent), keeping only answers that came back
//! quickly, so a freeze's late answers teach it nothing. Until it has learnt, calls
//! carry no deadline. Each Redis server (each Cluster master) has its own clock and
//! its own `Skew`.
//!
//! Deliberately not here: the wall clock (`crate::clock`); this is a duration.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

/// The value of a [`Skew`] that has learnt nothing yet.
const UNKNOWN: i64 = i64::MIN;

/// The origin of the monotonic milliseconds the skew is kept against.
static ORIGIN: LazyLock<Instant> = LazyLock::new(Instant::now);

/// `at` in monotonic milliseconds since `ORIGIN`, this process's first use of it.
pub fn mono_ms(at: Instant) -> i64 {
    at.saturating_duration_since(*ORIGIN).as_millis() as i64
}

/// Redis's clock minus the monotonic one, in ms, as learnt from quick answers; an
/// overestimate by the time a quick call takes to reach Redis.
#[derive(Debug)]
pub struct Skew(AtomicI64);

impl Default for Skew {
    fn default() -> Skew {
        Skew(AtomicI64::new(UNKNOWN))
    }
}

impl Skew {
    /// Learns from one answer: Redis ran the call at `redis_ms`; it was sent at
    /// monotonic `sent_ms` and took `round_trip` of a `timeout`. A slow answer (over
    /// a quarter of the timeout) is ignored. A smaller difference is taken at once
    /// (the quickest answers are the truest); a larger one is followed by an eighth
    /// of the way, so a Redis clock stepped forward is caught up with in a few dozen
    /// answers and one slow answer moves little.
    pub fn learn(&self, redis_ms: u64, sent_ms: i64, round_trip: Duration, timeout: Duration) {
        if round_trip > timeout / 4 {
            return;
        }
        let seen = redis_ms as i64 - sent_ms;
        let known = self.0.load(Ordering::Relaxed);
        let next = if known == UNKNOWN || seen <= known {
            seen
        } else {
            known + (seen - known + 7) / 8
        };
        self.0.store(next, Ordering::Relaxed);
    }

    /// The Redis instant (ms) after which a call sent at monotonic `sent_ms`, whose
    /// first decision stops waiting `left` later, must count nothing; 0 (none) until
    /// the skew is known. A tenth of the `timeout` (at least 1 ms) is kept for the
    /// answer's way back.
    pub fn deadline(&self, sent_ms: i64, left: Duration, timeout: Duration) -> u64 {
        let known = self.0.load(Ordering::Relaxed);
        if known == UNKNOWN {
            return 0;
        }
        let margin = (timeout.as_millis() as i64 / 10).max(1);
        let left = left.as_millis() as i64;
        u64::try_from(sent_ms + known + left - margin).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_millis(50);
    const QUICK: Duration = Duration::from_millis(1);

    #[test]
    fn no_deadline_until_an_answer_taught_the_skew() {
        let skew = Skew::default();
        assert_eq!(skew.deadline(1_000, TIMEOUT, TIMEOUT), 0);
        skew.learn(5_000, 1_000, QUICK, TIMEOUT);
        assert_eq!(
            skew.deadline(1_000, TIMEOUT, TIMEOUT),
            1_000 + 4_000 + 50 - 5
        );
        // A decision that has already waited 30 ms of its 50.
        let left = Duration::from_millis(20);
        assert_eq!(skew.deadline(1_000, left, TIMEOUT), 1_000 + 4_000 + 20 - 5);
    }

    #[test]
    fn a_slow_answer_teaches_nothing_and_a_quicker_one_wins_at_once() {
        let skew = Skew::default();
        skew.learn(1_002, 1_000, QUICK, TIMEOUT);
        // A frozen Redis's answer, 3 s late.
        skew.learn(4_000, 1_000, Duration::from_secs(3), TIMEOUT);
        assert_eq!(skew.deadline(0, TIMEOUT, TIMEOUT), 2 + 45);
        skew.learn(2_000, 2_000, QUICK, TIMEOUT);
        assert_eq!(skew.deadline(0, TIMEOUT, TIMEOUT), 45);
    }

    #[test]
    fn a_larger_skew_is_followed_by_an_eighth_each_answer() {
        let skew = Skew::default();
        skew.learn(0, 0, QUICK, TIMEOUT);
        // Redis's clock stepped forward 800 ms.
        let mut seen = Vec::new();
        for _ in 0..3 {
            skew.learn(10_800, 10_000, QUICK, TIMEOUT);
            seen.push(skew.deadline(0, TIMEOUT, TIMEOUT) - 45);
        }
        assert_eq!(seen, [100, 188, 265]);
        for _ in 0..60 {
            skew.learn(10_800, 10_000, QUICK, TIMEOUT);
        }
        assert_eq!(skew.deadline(0, TIMEOUT, TIMEOUT), 800 + 45);
    }
}
