//! The circuit breaker in front of a Redis server (or of one master of a Cluster).
//!
//! It opens on a sustained failure rate, not on one slow call: a call that fails
//! (an error or its timeout) opens it only when, within the last [`PERIOD_MS`], at
//! least [`MIN_FAILURES`] decisions failed and they were at least [`TRIP_PERCENT`] %
//! of the decisions sent. One stall of the server fails every decision in flight at
//! once (a batch is one call), so a rule of "n failures in a row" opened the breaker
//! for every caller on each stall; the rate keeps it closed while most decisions
//! succeed, and a stall then costs the decisions it held, no more.
//!
//! Open, it keeps decisions away for [`PROBE_AFTER_MS`]; then one decision is sent
//! as a probe (half-open) while the others still do without: a good answer closes
//! it, a failure opens it again for as long. A probe whose answer never came back
//! (its request was dropped) is replaced after [`STALE_PROBE_MS`].
//!
//! Counts are kept in ten buckets of a tenth of the period each, per decision, with
//! plain atomics: the request path takes no lock. Two decisions that start a new
//! bucket at the same instant may lose one count of that bucket: the rate is an
//! estimate, which is all a threshold needs. It reads no clock: instants come with
//! each call.

use std::sync::atomic::{AtomicU64, Ordering};

/// The sliding period over which the failure rate is measured.
pub const PERIOD_MS: u64 = 1_000;
/// Failed decisions within the period below which the breaker never opens.
pub const MIN_FAILURES: u64 = 3;
/// The share of the period's decisions that must have failed to open it, in %.
pub const TRIP_PERCENT: u64 = 50;
/// How long an open breaker keeps decisions away before it sends a probe.
pub const PROBE_AFTER_MS: u64 = 250;
/// A probe not answered within this long is given up and another one sent.
pub const STALE_PROBE_MS: u64 = 5_000;

const BUCKETS: usize = 10;
const BUCKET_MS: u64 = PERIOD_MS / BUCKETS as u64;
/// A failure's share of a bucket's packed counts: failures in the high half, all
/// decisions in the low half.
const FAILED: u64 = 1 << 32;

/// What a decision may do while the breaker is as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permit {
    /// Closed: ask the server.
    Closed,
    /// Half-open: this decision is the probe; its outcome closes or reopens.
    Probe,
}

/// A breaker: closed, open until an instant, or half-open with one probe out.
#[derive(Debug, Default)]
pub struct Breaker {
    buckets: [Bucket; BUCKETS],
    /// Local ms from which a probe may be sent; 0 = closed.
    open_until_ms: AtomicU64,
    /// Local ms the outstanding probe was sent at; 0 = none.
    probe_at_ms: AtomicU64,
}

/// One tenth of the period: which tenth it holds, and its packed counts.
#[derive(Debug, Default)]
struct Bucket {
    epoch: AtomicU64,
    counts: AtomicU64,
}

impl Breaker {
    /// Whether a decision at `now_ms` may ask the server, and as what.
    pub fn permit(&self, now_ms: u64) -> Option<Permit> {
        let until = self.open_until_ms.load(Ordering::Acquire);
        if until == 0 {
            return Some(Permit::Closed);
        }
        if now_ms < until {
            return None;
        }
        let out = self.probe_at_ms.load(Ordering::Acquire);
        let free = out == 0 || now_ms.saturating_sub(out) >= STALE_PROBE_MS;
        let mine = free
            && (self.probe_at_ms)
                .compare_exchange(out, now_ms.max(1), Ordering::AcqRel, Ordering::Relaxed)
                .is_ok();
        mine.then_some(Permit::Probe)
    }

    /// The server answered a decision sent with `permit`.
    pub fn succeeded(&self, now_ms: u64, permit: Permit) {
        match permit {
            Permit::Closed => self.count(now_ms, 1),
            Permit::Probe => {
                // A fresh start: the failures that opened it are behind us.
                for bucket in &self.buckets {
                    bucket.counts.store(0, Ordering::Relaxed);
                }
                self.count(now_ms, 1);
                self.open_until_ms.store(0, Ordering::Release);
                self.probe_at_ms.store(0, Ordering::Release);
            }
        }
    }

    /// A decision sent with `permit` failed; true if the breaker is open after it.
    pub fn failed(&self, now_ms: u64, permit: Permit) -> bool {
        self.count(now_ms, 1 | FAILED);
        let open = match permit {
            Permit::Probe => {
                self.probe_at_ms.store(0, Ordering::Release);
                true
            }
            Permit::Closed if self.is_open() => return true,
            Permit::Closed => {
                let (sent, failed) = self.counts(now_ms);
                failed >= MIN_FAILURES && failed * 100 >= sent * TRIP_PERCENT
            }
        };
        if open {
            let until = (now_ms + PROBE_AFTER_MS).max(1);
            self.open_until_ms.store(until, Ordering::Release);
        }
        open
    }

    /// Whether it is open (or half-open): decisions do without the server.
    pub fn is_open(&self) -> bool {
        self.open_until_ms.load(Ordering::Acquire) != 0
    }

    fn count(&self, now_ms: u64, what: u64) {
        let epoch = now_ms / BUCKET_MS;
        let bucket = &self.buckets[(epoch % BUCKETS as u64) as usize];
        let seen = bucket.epoch.load(Ordering::Acquire);
        if seen != epoch
            && (bucket.epoch)
                .compare_exchange(seen, epoch, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            bucket.counts.store(0, Ordering::Relaxed);
        }
        bucket.counts.fetch_add(what, Ordering::Relaxed);
    }

    /// Decisions sent and failed within the period ending at `now_ms`.
    fn counts(&self, now_ms: u64) -> (u64, u64) {
        let epoch = now_ms / BUCKET_MS;
        let oldest = epoch.saturating_sub(BUCKETS as u64 - 1);
        let recent = self.buckets.iter().filter(|bucket| {
            let at = bucket.epoch.load(Ordering::Acquire);
            (oldest..=epoch).contains(&at)
        });
        recent.fold((0, 0), |(sent, failed), bucket| {
            let counts = bucket.counts.load(Ordering::Relaxed);
            (sent + (counts & (FAILED - 1)), failed + (counts >> 32))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sends one decision at `at` and records its outcome; whether it was sent.
    fn decide(breaker: &Breaker, at: u64, ok: bool) -> Option<Permit> {
        let permit = breaker.permit(at)?;
        match ok {
            true => breaker.succeeded(at, permit),
            false => {
                breaker.failed(at, permit);
            }
        }
        Some(permit)
    }

    #[test]
    fn a_stall_that_fails_a_minority_of_decisions_never_opens_it() {
        let breaker = Breaker::default();
        // 1 000 decisions a second; after a good second, every second's first
        // 250 ms fail (a 200 ms stall and the 50 ms timeout of the calls in flight).
        for ms in 9_000..15_000u64 {
            let ok = ms < 10_000 || ms % 1_000 >= 250;
            assert_eq!(decide(&breaker, ms, ok), Some(Permit::Closed), "at {ms}");
        }
        assert!(!breaker.is_open());
    }

    #[test]
    fn a_sustained_failure_rate_opens_it_and_the_first_good_probe_closes_it() {
        let breaker = Breaker::default();
        for ms in 0..100 {
            decide(&breaker, 10_000 + ms, true);
        }
        // A dead server: failures from 10 100 ms on, one every ms.
        let mut at = 10_100;
        while !breaker.is_open() {
            decide(&breaker, at, false);
            at += 1;
        }
        // About as many failures as the successes before, then open.
        assert!((10_195..=10_205).contains(&at), "opened at {at}");
        assert_eq!(breaker.permit(at), None, "open: nothing is sent");
        assert_eq!(breaker.permit(at + PROBE_AFTER_MS - 2), None);
        // Half-open: one probe, nobody else.
        let probe_at = at - 1 + PROBE_AFTER_MS;
        assert_eq!(breaker.permit(probe_at), Some(Permit::Probe));
        assert_eq!(breaker.permit(probe_at), None, "one probe at a time");
        assert!(
            breaker.failed(probe_at, Permit::Probe),
            "a failed probe reopens"
        );
        assert_eq!(breaker.permit(probe_at + 1), None);
        let next = probe_at + PROBE_AFTER_MS;
        assert_eq!(breaker.permit(next), Some(Permit::Probe));
        breaker.succeeded(next, Permit::Probe);
        assert!(!breaker.is_open(), "the first good probe closes it");
        // Closed afresh: the failures that opened it count no more.
        for ms in 1..MIN_FAILURES {
            assert_eq!(decide(&breaker, next + ms, false), Some(Permit::Closed));
        }
        assert!(!breaker.is_open(), "fewer failures than the minimum");
        decide(&breaker, next + MIN_FAILURES, false);
        assert!(breaker.is_open(), "3 of 4 failed");
    }

    #[test]
    fn old_failures_leave_the_period() {
        let breaker = Breaker::default();
        for ms in 1..MIN_FAILURES {
            decide(&breaker, 1_000 + ms, false);
        }
        // A second later those are outside the period: as many more do not open it.
        for ms in 1..MIN_FAILURES {
            decide(&breaker, 2_100 + ms, false);
        }
        assert!(!breaker.is_open());
        decide(&breaker, 2_200, false);
        assert!(breaker.is_open(), "the minimum within one period");
    }

    #[test]
    fn a_probe_whose_answer_never_came_is_replaced() {
        let breaker = Breaker::default();
        for ms in 0..MIN_FAILURES {
            decide(&breaker, 1_000 + ms, false);
        }
        let at = 1_000 + MIN_FAILURES + PROBE_AFTER_MS;
        assert_eq!(breaker.permit(at), Some(Permit::Probe));
        assert_eq!(breaker.permit(at + STALE_PROBE_MS - 1), None);
        assert_eq!(breaker.permit(at + STALE_PROBE_MS), Some(Permit::Probe));
    }
}
