//! The fallback: Redis with `on_error` deciding while it is down.
//!
//! Every Redis call has a short timeout. When the calls fail at a sustained rate a
//! circuit breaker ([`super::breaker`]) opens and requests stop waiting on Redis;
//! after a short while one request probes, and success closes it. While Redis cannot answer, `on_error`
//! decides: `local` counts in this replica's memory engine (the same algorithm, but
//! every replica enforces the limits on its own, so a fleet of N admits up to N times a
//! `total`), `allow` admits, `deny` refuses with 503. This is the only place that knows
//! what a failed Redis call means for a request.
//!
//! On a Redis Cluster each master has a breaker of its own (kept with the slot map,
//! `redis::link::Master`): a decision uses the breaker of the master that serves its
//! counters, so a master that dies opens its own breaker, its slots' decisions
//! follow `on_error` at once without waiting on it, and every other master's callers
//! go on being decided in Redis. Once the cluster promotes a replica and the slot
//! map is read again (after each failed call or probe), the new master is used with
//! a fresh breaker. The store's own breaker then serves what no slot names: bans,
//! and slots the map does not know yet.
//!
//! Bans follow the same modes. Every replica checks bans in its own table, kept in
//! step with Redis (`redis::bans`); while Redis is down, the bans already known stay in
//! force until they end, and new refusals count toward bans in this replica alone with
//! `local` (like its limits), or not at all with `allow` and `deny` (`deny` refuses
//! every limited request with 503 anyway).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use super::bans::{Ban, BanTable};
use super::breaker::{Breaker, Permit};
use super::redis::bans::RedisBans;
use super::{
    CallerKey, MemoryStore, RedisStore, Scope, Stacked, StoreError, Verdict, memory, redis,
};
use crate::config::{AutoBan, OnError};
use crate::limit::{Now, Quota, Report};

/// Where one (policy, plan)'s counters live with this store: its handle in a
/// [`Scope`]. Both are bound up front, so falling back costs no lookup.
#[derive(Debug, Clone)]
pub(crate) struct Bound {
    /// The keys in Redis.
    pub(super) redis: redis::Bound,
    /// The counters `on_error = "local"` decides with.
    pub(super) local: memory::Bound,
}

/// The Redis engine with its fallback: decides in Redis while it answers, and by
/// `on_error` while it does not.
#[derive(Debug)]
pub struct Fallback {
    pub(super) redis: RedisStore,
    pub(super) bans: RedisBans,
    /// Counts while Redis is unreachable and `on_error = "local"`.
    pub(super) local: MemoryStore,
    pub(super) on_error: OnError,
    pub(super) breaker: Breaker,
    /// Errors talking to Redis since start.
    pub(super) errors: AtomicU64,
    /// The bans sync is failing (logged once per outage, `super::ban_sync`).
    pub(super) bans_down: AtomicBool,
}

impl Bound {
    /// The keys in Redis.
    pub(crate) fn redis(&self) -> &redis::Bound {
        &self.redis
    }
}

impl Fallback {
    /// The Redis engine itself, without the fallback (the usage export reads it).
    pub(crate) fn redis(&self) -> &RedisStore {
        &self.redis
    }

    /// `redis`, with `local` to count in while it is down and `on_error = "local"`.
    pub fn new(redis: RedisStore, local: MemoryStore, on_error: OnError) -> Fallback {
        Fallback {
            bans: RedisBans::new(redis.link()),
            redis,
            local,
            on_error,
            breaker: Breaker::default(),
            errors: AtomicU64::new(0),
            bans_down: AtomicBool::new(false),
        }
    }

    /// Binds (policy, plan)'s counters in Redis and in the local fallback.
    pub(crate) fn bind(
        &self,
        policy: &str,
        plan: &str,
        quotas: &[Quota],
        total: &[Quota],
    ) -> Bound {
        Bound {
            redis: redis::Bound::new(policy, plan, quotas, total),
            local: self.local.bind(policy, plan, !total.is_empty()),
        }
    }

    /// The registered consumers' keys, whose fallback counters are never evicted.
    pub(crate) fn reserve(&self, keys: impl IntoIterator<Item = CallerKey>) {
        self.local.reserve(keys);
    }

    /// The refund epoch of `policy` (see `memo`).
    pub(crate) fn refunds(&self, policy: &str) -> Arc<AtomicU32> {
        self.local.refunds(policy)
    }

    /// This replica's copy of the fleet's bans, which answers the per-request checks.
    pub fn ban_table(&self) -> &BanTable {
        &self.local.bans
    }

    /// Callers the local fallback tracks.
    pub fn tracked(&self) -> usize {
        self.local.tracked()
    }

    /// Callers the local fallback evicted to make room since start.
    pub fn evicted(&self) -> u64 {
        self.local.evicted()
    }

    /// Drops the local fallback's idle callers; returns how many.
    pub fn sweep(&self, now: &Now) -> usize {
        self.local.sweep(now)
    }

    /// Posts this replica's `document` under `name` on the fleet's board
    /// (`redis::board`); false if Redis did not take it.
    pub async fn post(&self, name: &str, replica: &str, now_ms: u64, document: String) -> bool {
        let link = self.redis.link();
        redis::board::post(&link, name, replica, now_ms, document)
            .await
            .is_ok()
    }

    /// The fleet's fresh documents under `name`; `None` if Redis did not answer.
    pub async fn board(&self, name: &str, now_ms: u64) -> Option<Vec<String>> {
        redis::board::read(&self.redis.link(), name, now_ms)
            .await
            .ok()
    }

    /// What decides while Redis is down.
    pub fn on_error(&self) -> OnError {
        self.on_error
    }

    /// Errors talking to Redis since start.
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    /// Whether requests are currently decided by `on_error` instead of Redis: all
    /// of them, or on a Cluster those of a master that is down.
    pub fn in_fallback(&self) -> bool {
        self.breaker.is_open() || self.redis.masters_down() > 0
    }

    /// On a Redis Cluster, each master (`host:port`) and whether its breaker is open.
    pub fn masters_health(&self) -> Vec<(String, bool)> {
        self.redis.masters_health()
    }

    /// Losses of Redis's data noticed since start, and the last one.
    pub fn resets(&self) -> (u64, Option<redis::reset::Reset>) {
        self.redis.resets()
    }

    /// Looks for a loss of Redis's data (`redis::reset`).
    pub async fn check_reset(&self, now_ms: u64) {
        self.redis.check_reset(now_ms).await;
    }

    /// Whether Redis answers a PING within its timeout.
    pub async fn ping(&self) -> bool {
        self.redis.ping().await
    }

    /// The health of the Redis server that holds `caller`'s counters under `bound`:
    /// on a Cluster its master's (as the slot map has it), else the store's one.
    pub(super) fn health(&self, bound: &Bound, caller: CallerKey) -> Option<Arc<Breaker>> {
        self.redis.health(&bound.redis, caller)
    }

    fn failed(&self, now_ms: u64, permit: Permit, err: &StoreError) {
        self.failed_on(&self.breaker, now_ms, permit, err);
    }

    pub(super) fn failed_on(
        &self,
        breaker: &Breaker,
        now_ms: u64,
        permit: Permit,
        err: &StoreError,
    ) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        breaker.failed(now_ms, permit);
        tracing::warn!(error = %err, on_error = ?self.on_error, "redis store call failed");
    }

    pub(crate) async fn decide(
        &self,
        scope: &Scope,
        bound: &Bound,
        caller: CallerKey,
        now: &Now,
        cost: u32,
        report: &mut Report,
    ) -> Verdict {
        let node = self.health(bound, caller);
        let breaker = node.as_deref().unwrap_or(&self.breaker);
        if let Some(permit) = breaker.permit(now.ms) {
            match (self.redis)
                .decide(scope, &bound.redis, caller, now, cost, report)
                .await
            {
                Ok(verdict) => {
                    breaker.succeeded(now.ms, permit);
                    return verdict;
                }
                Err(err) => {
                    self.failed_on(breaker, now.ms, permit, &err);
                    *report = Report::default();
                }
            }
        }
        report.at_ms = now.ms;
        match self.on_error {
            OnError::Local => (self.local).decide(scope, &bound.local, caller, now, cost, report),
            OnError::Allow => Verdict::Admitted,
            OnError::Deny => Verdict::Unavailable,
        }
    }

    /// The health of the Redis server a stacked decision is made on (its first
    /// part's, with whose keys the others' are placed on a Cluster).
    fn stacked_health(&self, parts: &[Stacked<'_>], bounds: &[&Bound]) -> Option<Arc<Breaker>> {
        let (part, bound) = parts.first().zip(bounds.first())?;
        self.health(bound, part.caller)
    }

    /// A stacked decision: in Redis (one script call) while it answers, else by
    /// `on_error`, as [`Fallback::decide`].
    pub(crate) async fn decide_stacked(
        &self,
        parts: &[Stacked<'_>],
        bounds: &[&Bound],
        cost: u32,
        reports: &mut [Report],
    ) -> Verdict {
        let now_ms = parts.first().map_or(0, |part| part.now.ms);
        let node = self.stacked_health(parts, bounds);
        let breaker = node.as_deref().unwrap_or(&self.breaker);
        if let Some(permit) = breaker.permit(now_ms) {
            let redis: Vec<&redis::Bound> = bounds.iter().map(|b| &b.redis).collect();
            match (self.redis)
                .decide_stacked(parts, &redis, cost, reports)
                .await
            {
                Ok(verdict) => {
                    breaker.succeeded(now_ms, permit);
                    return verdict;
                }
                Err(err) => {
                    self.failed_on(breaker, now_ms, permit, &err);
                    reports.iter_mut().for_each(|r| *r = Report::default());
                }
            }
        }
        reports.iter_mut().for_each(|r| r.at_ms = now_ms);
        match self.on_error {
            OnError::Local => {
                let local: Vec<&memory::Bound> = bounds.iter().map(|b| &b.local).collect();
                self.local.decide_stacked(parts, &local, cost, reports)
            }
            OnError::Allow => Verdict::Admitted,
            OnError::Deny => Verdict::Unavailable,
        }
    }

    /// Refunds (or, with `charge`, charges) each part's cost of a stacked decision
    /// where it was most likely counted, as [`Fallback::refund`] and
    /// [`Fallback::charge`] do for one.
    pub(crate) async fn settle_stacked(
        &self,
        parts: &[Stacked<'_>],
        bounds: &[&Bound],
        costs: &[u32],
        charge: bool,
    ) {
        let now_ms = parts.first().map_or(0, |part| part.now.ms);
        let node = self.stacked_health(parts, bounds);
        let breaker = node.as_deref().unwrap_or(&self.breaker);
        if !breaker.is_open() {
            let redis: Vec<&redis::Bound> = bounds.iter().map(|b| &b.redis).collect();
            let settled = match charge {
                true => self.redis.charge_stacked(parts, &redis, costs).await,
                false => self.redis.refund_stacked(parts, &redis, costs).await,
            };
            match settled {
                Ok(()) => return,
                Err(err) => self.failed_on(breaker, now_ms, Permit::Closed, &err),
            }
            if !charge {
                // A refund Redis cannot take is lost, which errs toward refusing.
                return;
            }
        }
        let each = parts.iter().zip(bounds).zip(costs);
        for ((part, bound), &cost) in each.filter(|(_, cost)| **cost > 0) {
            let (scope, caller, now) = (part.scope, part.caller, &part.now);
            match charge {
                true => self.local.charge(scope, &bound.local, caller, now, cost),
                false => self.local.refund(scope, &bound.local, caller, now, cost),
            }
        }
    }

    /// Refunds where the request was most likely counted: in Redis while the
    /// breaker is closed, else in the local engine. A refund is a few seconds at most
    /// after its admission, so only a breaker that changed state in between sends it
    /// to the engine that did not count it, which then finds nothing of that caller
    /// at that instant, or one of its own requests there. A refund Redis cannot take
    /// is lost, which errs toward refusing.
    pub(crate) async fn refund(
        &self,
        scope: &Scope,
        bound: &Bound,
        caller: CallerKey,
        at: &Now,
        cost: u32,
    ) {
        let node = self.health(bound, caller);
        let breaker = node.as_deref().unwrap_or(&self.breaker);
        if breaker.is_open() {
            self.local.refund(scope, &bound.local, caller, at, cost);
            return;
        }
        let refunded = self.redis.refund(scope, &bound.redis, caller, at, cost);
        if let Err(err) = refunded.await {
            self.failed_on(breaker, at.ms, Permit::Closed, &err);
        }
    }

    /// Charges `cost` in Redis while the breaker is closed, else in the local engine;
    /// a charge Redis cannot take goes to the local engine.
    pub(crate) async fn charge(
        &self,
        scope: &Scope,
        bound: &Bound,
        caller: CallerKey,
        now: &Now,
        cost: u32,
    ) {
        let node = self.health(bound, caller);
        let breaker = node.as_deref().unwrap_or(&self.breaker);
        if !breaker.is_open() {
            let charged = self.redis.charge(scope, &bound.redis, caller, now, cost);
            match charged.await {
                Ok(()) => return,
                Err(err) => self.failed_on(breaker, now.ms, Permit::Closed, &err),
            }
        }
        self.local.charge(scope, &bound.local, caller, now, cost);
    }

    /// The caller's counters in Redis; the local fallback's when Redis cannot answer.
    pub(crate) async fn peek(
        &self,
        scope: &Scope,
        bound: &Bound,
        caller: CallerKey,
        now: &Now,
        report: &mut Report,
    ) {
        let peeked = self.redis.peek(scope, &bound.redis, caller, now, report);
        if peeked.await.is_err() {
            *report = Report::default();
            self.local.peek(scope, &bound.local, caller, now, report);
        }
    }

    /// Counts a refusal toward a ban: in Redis at the next sync, or here while Redis is
    /// down and `on_error = "local"` (then a ban can be made at once, for this replica).
    pub(crate) fn strike(
        &self,
        key: CallerKey,
        caller: impl FnOnce() -> String,
        now_ms: u64,
        auto: &AutoBan,
    ) -> Option<Ban> {
        if !self.breaker.is_open() {
            self.bans.queue(key, caller, auto);
            return None;
        }
        match self.on_error {
            OnError::Local => self.local.bans.strike(key, caller, now_ms, auto),
            OnError::Allow | OnError::Deny => None,
        }
    }

    /// A manual ban, in Redis (for the fleet) and here; only here while Redis is down.
    pub(crate) async fn ban(&self, key: CallerKey, ban: Ban, now_ms: u64) -> bool {
        let duration_ms = ban.until_ms.saturating_sub(now_ms);
        let ban = match self.bans.ban(key, &ban, duration_ms).await {
            Ok(stored) => Ban {
                // Redis's clock set the end; keep the duration asked for on ours.
                until_ms: now_ms + duration_ms,
                ..stored
            },
            Err(err) => {
                self.failed(now_ms, Permit::Closed, &err);
                ban
            }
        };
        self.local.bans.set(key, ban, now_ms)
    }

    /// Lifts a ban in Redis and here.
    pub(crate) async fn lift(&self, key: CallerKey, now_ms: u64) -> bool {
        let local = self.local.bans.lift(key, now_ms);
        match self.bans.lift(key).await {
            Ok(existed) => existed || local,
            Err(err) => {
                self.failed(now_ms, Permit::Closed, &err);
                local
            }
        }
    }

    /// Credits a caller's current billing periods in Redis (the fleet's counts); the
    /// local fallback's too, which count while Redis is down. False if Redis did not
    /// take it.
    pub(crate) async fn credit(
        &self,
        scope: &Scope,
        bound: &Bound,
        caller: CallerKey,
        now: &Now,
        amount: u32,
    ) -> bool {
        self.local.credit(scope, &bound.local, caller, now, amount);
        match self
            .redis
            .credit(scope, &bound.redis, caller, now, amount)
            .await
        {
            Ok(()) => true,
            Err(err) => {
                self.failed(now.ms, Permit::Closed, &err);
                false
            }
        }
    }

    /// Forgets a caller's counters in Redis and locally.
    pub(crate) async fn reset(&self, bound: &Bound, caller: CallerKey) -> bool {
        let local = self.local.reset(&bound.local, caller);
        matches!(self.redis.reset(&bound.redis, caller).await, Ok(true)) || local
    }
}
