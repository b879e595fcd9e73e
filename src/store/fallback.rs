//! The fallback: Redis with `on_error` deciding while it is down.
//!
//! Every Redis call has a short timeout. After [`TRIP_AFTER`] failures in a row a
//! circuit breaker opens and requests stop waiting on Redis for [`OPEN_FOR_MS`]; then
//! one request probes, and success closes it. While Redis cannot answer, `on_error`
//! decides: `local` counts in this replica's memory engine (the same algorithm, but
//! every replica enforces the limits on its own, so a fleet of N admits up to N times a
//! `total`), `allow` admits, `deny` refuses with 503. This is the only place that knows
//! what a failed Redis call means for a request.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use super::{CallerKey, MemoryStore, RedisStore, Scope, StoreError, Verdict};
use crate::config::OnError;
use crate::limit::{Now, Report};

/// Consecutive failures that open the breaker.
pub const TRIP_AFTER: u32 = 3;
/// How long an open breaker keeps requests away from Redis before a probe.
pub const OPEN_FOR_MS: u64 = 1_000;

#[derive(Debug)]
pub struct Fallback {
    redis: RedisStore,
    /// Counts while Redis is unreachable and `on_error = "local"`.
    local: MemoryStore,
    on_error: OnError,
    breaker: Breaker,
    /// Errors talking to Redis since start.
    errors: AtomicU64,
}

impl Fallback {
    pub fn new(redis: RedisStore, local: MemoryStore, on_error: OnError) -> Fallback {
        Fallback {
            redis,
            local,
            on_error,
            breaker: Breaker::default(),
            errors: AtomicU64::new(0),
        }
    }

    pub fn local(&self) -> &MemoryStore {
        &self.local
    }

    pub fn on_error(&self) -> OnError {
        self.on_error
    }

    /// Errors talking to Redis since start.
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    /// Whether requests are currently decided by `on_error` instead of Redis.
    pub fn in_fallback(&self) -> bool {
        self.breaker.is_open()
    }

    /// Whether requests can be decided: Redis answers, or `on_error` decides anyway.
    pub async fn ready(&self) -> bool {
        self.on_error != OnError::Deny || self.redis.ping().await
    }

    fn failed(&self, now_ms: u64, err: &StoreError) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        self.breaker.failed(now_ms);
        tracing::warn!(error = %err, on_error = ?self.on_error, "redis store call failed");
    }

    pub(crate) async fn decide(
        &self,
        scope: &Scope,
        caller: CallerKey,
        now: &Now,
        cost: u32,
        report: &mut Report,
    ) -> Verdict {
        if self.breaker.permits(now.ms) {
            match self.redis.decide(scope, caller, now, cost, report).await {
                Ok(verdict) => {
                    self.breaker.succeeded();
                    return verdict;
                }
                Err(err) => {
                    self.failed(now.ms, &err);
                    *report = Report::default();
                }
            }
        }
        report.at_ms = now.ms;
        match self.on_error {
            OnError::Local => self.local.decide(scope, caller, now, cost, report),
            OnError::Allow => Verdict::Admitted,
            OnError::Deny => Verdict::Unavailable,
        }
    }

    /// Refunds where the request was most likely counted: in Redis while the
    /// breaker is closed, else in the local engine. A refund is a few seconds at most
    /// after its admission, so only a breaker that changed state in between sends it
    /// to the engine that did not count it, which then finds nothing of that caller
    /// at that instant, or one of its own requests there. A refund Redis cannot take
    /// is lost, which errs toward refusing.
    pub(crate) async fn refund(&self, scope: &Scope, caller: CallerKey, at: &Now, cost: u32) {
        if self.breaker.is_open() {
            self.local.refund(scope, caller, at, cost);
            return;
        }
        if let Err(err) = self.redis.refund(scope, caller, at, cost).await {
            self.failed(at.ms, &err);
        }
    }

    /// The caller's counters in Redis; the local fallback's when Redis cannot answer.
    pub(crate) async fn peek(
        &self,
        scope: &Scope,
        caller: CallerKey,
        now: &Now,
        report: &mut Report,
    ) {
        if self.redis.peek(scope, caller, now, report).await.is_err() {
            *report = Report::default();
            self.local.peek(scope, caller, now, report);
        }
    }

    /// Forgets a caller's counters in Redis and locally.
    pub(crate) async fn reset(&self, scope: &Scope, caller: CallerKey) -> bool {
        let local = self.local.reset(scope, caller);
        matches!(self.redis.reset(scope, caller).await, Ok(true)) || local
    }
}

#[derive(Debug, Default)]
struct Breaker {
    failures: AtomicU32,
    /// Local ms until which Redis is not asked; 0 = closed.
    open_until_ms: AtomicU64,
    probing: AtomicBool,
}

impl Breaker {
    /// Whether this request may ask Redis.
    fn permits(&self, now_ms: u64) -> bool {
        let until = self.open_until_ms.load(Ordering::Relaxed);
        until == 0 || (now_ms >= until && !self.probing.swap(true, Ordering::AcqRel))
    }

    fn succeeded(&self) {
        self.failures.store(0, Ordering::Relaxed);
        self.open_until_ms.store(0, Ordering::Relaxed);
        self.probing.store(false, Ordering::Release);
    }

    fn failed(&self, now_ms: u64) {
        let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if failures >= TRIP_AFTER || self.probing.load(Ordering::Acquire) {
            self.open_until_ms
                .store(now_ms + OPEN_FOR_MS, Ordering::Relaxed);
        }
        self.probing.store(false, Ordering::Release);
    }

    fn is_open(&self) -> bool {
        self.open_until_ms.load(Ordering::Relaxed) != 0
    }
}
