//! The Redis engine: one limit shared by every replica, decided atomically in Redis.
//!
//! Each request is decided by one Lua script run (`limit.lua`, sent as EVALSHA and
//! loaded again after NOSCRIPT; requests waiting together share a run, see [`batch`])
//! that prunes, checks and counts the caller's windows and the policy's total all or
//! nothing, using Redis's `TIME`, so replicas with skewed clocks agree; a refund is a
//! request of the same script that takes back what an admission at a given Redis
//! instant counted. Keys carry a TTL and a hash tag, so one request's keys share a
//! Redis Cluster slot: the policy when it has a `total` (caller and total must be
//! together), else the policy, plan and caller. The target is one server, a Redis
//! Cluster (a batch is then split by master, one script call per master, see
//! [`spread`]) or a master named by Sentinel and followed across failovers
//! ([`sentinel`]). Connections are multiplexed and pipelined, reconnecting by
//! themselves, on a thread of the engine's own ([`link`]); no lock is held across a
//! round trip. Every call has a
//! timeout; what to do when Redis fails is the fallback's business
//! (`super::fallback`), not this engine's.
//!
//! The key layout (names, hash tags, a stacked decision's keys in one slot) is
//! `keys.rs`'s.

pub mod bans;
pub mod batch;
pub mod board;
pub mod deadline;
mod keys;
pub mod link;
mod listing;
mod parts;
pub mod reset;
pub mod sentinel;
pub mod shards;
pub mod spread;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

pub(crate) use keys::Bound;

use batch::{Answer, Job, Member, Shape};
use keys::stacked_keys;
use link::Link;

use super::breaker::Breaker;
use super::{CallerKey, Scope, Stacked, StoreError, Verdict};
use crate::config::RedisTarget;
use crate::limit::{LimitStatus, Now, Quota, Report, Window};

/// The number of the next store, which names its batchers.
static STORES: AtomicU64 = AtomicU64::new(0);

/// A request's quotas (the caller's plan, then the policy's total) and, with calendar
/// days, yesterday, today and tomorrow: whichever holds Redis's clock; with billing
/// periods, the current and the next of each.
fn shape(plan: &[Quota], total: &[Quota], now: &Now) -> Shape {
    let calendar = now.calendar;
    let days = if calendar.is_some() { 3 } else { 0 };
    let mut shape = Shape::new(plan.len(), total.len(), days);
    for quota in plan.iter().chain(total) {
        let (slot, bucket_ms) = match (quota.window, calendar) {
            (Window::Month, _) => (5, 0),
            (Window::Year, _) => (6, 0),
            (Window::Day, Some(_)) => (4, 0),
            (window, _) if Window::is_exact(quota.limit.get()) => (window as u8, 1),
            (window, _) => (window as u8, window.bucket_ms() as u32),
        };
        shape.quota(slot, quota.limit.get(), bucket_ms);
    }
    if let Some(day) = calendar {
        shape.day(day.index.saturating_sub(1), 0, day.starts_ms);
        shape.day(day.index, day.starts_ms, day.ends_ms);
        shape.day(day.index + 1, day.ends_ms, day.ends_ms + 2 * 86_400_000);
    }
    if let Some(periods) = now.periods {
        for (slot, period) in [(5, periods.month), (6, periods.year)] {
            shape.period(slot, period.starts_ms, period.ends_ms, period.next_ends_ms);
        }
    }
    shape
}

/// The Redis engine: one limit shared by every replica, decided by a Lua script.
#[derive(Debug)]
pub struct RedisStore {
    /// Names this store's batchers (one per runtime that decides, see [`batch`]).
    id: u64,
    link: Link,
    timeout: Duration,
    /// The target is a Cluster: a stacked decision's keys are placed in one slot.
    cluster: bool,
    /// Data losses of the store noticed since start.
    resets: reset::Resets,
}

/// What one script call does with `cost`.
#[derive(Debug, Clone, Copy)]
enum Op {
    /// Counts it if it fits (0: only reads the counters).
    Count,
    /// Takes it back, as counted at Redis instant `at_ms`.
    Refund { at_ms: u64 },
    /// Counts it whether or not it fits.
    Charge,
    /// Takes it back from the newest counts, whenever they were made.
    GiveBack,
}

impl RedisStore {
    /// A store for `target` (trusting the PEM CA `ca` for `rediss://`), with its
    /// thread started, whose decisions wait for `wait_replicas` replicas; connects
    /// lazily, so a Redis that is down at start is a fault like any other, but a URL
    /// the client cannot use is an error now.
    pub fn new(
        target: &RedisTarget,
        ca: Option<Vec<u8>>,
        timeout: Duration,
        wait_replicas: u32,
    ) -> Result<RedisStore, StoreError> {
        Ok(RedisStore {
            id: STORES.fetch_add(1, Ordering::Relaxed),
            link: Link::open(target, ca, timeout)?.waiting_for(wait_replicas),
            timeout,
            cluster: matches!(target, RedisTarget::Cluster(_)),
            resets: reset::Resets::default(),
        })
    }

    pub(crate) async fn decide(
        &self,
        scope: &Scope,
        keys: &Bound,
        caller: CallerKey,
        now: &Now,
        cost: u32,
        report: &mut Report,
    ) -> Result<Verdict, StoreError> {
        let answer = self.call(scope, keys, keys.caller(caller), now, cost, Op::Count);
        let answer = answer.await?;
        fill(scope, &answer.statuses, answer.at_ms, report);
        Ok(if answer.admitted {
            Verdict::Admitted
        } else {
            Verdict::Limited
        })
    }

    /// Takes back `cost` requests counted at Redis instant `at.ms`.
    pub(crate) async fn refund(
        &self,
        scope: &Scope,
        keys: &Bound,
        caller: CallerKey,
        at: &Now,
        cost: u32,
    ) -> Result<(), StoreError> {
        let key = keys.caller(caller);
        self.call(scope, keys, key, at, cost, Op::Refund { at_ms: at.ms })
            .await
            .map(drop)
    }

    /// Takes up to `units` off a caller's newest counts (and its total's): one
    /// atomic script step, so a fleet gives them back exactly once.
    pub(crate) async fn give_back(
        &self,
        scope: &Scope,
        keys: &Bound,
        caller: CallerKey,
        now: &Now,
        units: u32,
    ) -> Result<(), StoreError> {
        self.call(scope, keys, keys.caller(caller), now, units, Op::GiveBack)
            .await
            .map(drop)
    }

    /// Counts `cost` more of a caller at Redis's now, whether or not it fits: one
    /// atomic script step, so a fleet charges it exactly once.
    pub(crate) async fn charge(
        &self,
        scope: &Scope,
        keys: &Bound,
        caller: CallerKey,
        now: &Now,
        cost: u32,
    ) -> Result<(), StoreError> {
        self.call(scope, keys, keys.caller(caller), now, cost, Op::Charge)
            .await
            .map(drop)
    }

    /// Decides `cost` against every part of a stacked decision in one script call,
    /// all or nothing (see [`super::Store::decide_stacked`]).
    pub(crate) async fn decide_stacked(
        &self,
        parts: &[Stacked<'_>],
        bounds: &[&Bound],
        cost: u32,
        reports: &mut [Report],
    ) -> Result<Verdict, StoreError> {
        let mut keys = stacked_keys(parts, bounds, self.cluster).into_iter();
        let (Some(first), Some(first_bound), Some(lead)) =
            (parts.first(), bounds.first(), keys.next())
        else {
            return Ok(Verdict::Admitted);
        };
        let members = (parts.iter().zip(bounds).skip(1).zip(keys))
            .map(|((part, bound), key)| Member {
                caller: key,
                shape: job_shape(part.scope, bound, &part.now),
                shadow: part.shadow,
            })
            .collect();
        let (answer_to, answer) = oneshot::channel();
        let job = Job {
            caller: lead,
            total: (!first.scope.total.is_empty())
                .then(|| first_bound.total.clone())
                .flatten(),
            cost,
            refund_at: None,
            charge: false,
            shape: job_shape(first.scope, first_bound, &first.now),
            answer_to,
            deadline: Some(Instant::now() + self.timeout),
            stacked: Some(batch::Stack {
                shadow: first.shadow,
                members,
            }),
        };
        batch::send(self.id, &self.link, job)?;
        let answer = tokio::time::timeout(self.timeout, answer)
            .await
            .map_err(|_| StoreError::Timeout(self.timeout))?
            .map_err(|_| StoreError::Stopped)??;
        let mut statuses = answer.statuses.as_slice();
        for ((part, report), &checked) in parts.iter().zip(reports.iter_mut()).zip(&answer.parts) {
            let (mine, rest) = statuses.split_at(usize::from(checked).min(statuses.len()));
            fill(part.scope, mine, answer.at_ms, report);
            statuses = rest;
        }
        Ok(if answer.admitted {
            Verdict::Admitted
        } else {
            Verdict::Limited
        })
    }

    /// Takes back (`Op::Refund`) or counts whether or not it fits (`Op::Charge`) each
    /// part's cost of `costs` in the keys a stacked decision counted them in.
    async fn settle_stacked(
        &self,
        parts: &[Stacked<'_>],
        bounds: &[&Bound],
        costs: &[u32],
        charge: bool,
    ) -> Result<(), StoreError> {
        let keys = stacked_keys(parts, bounds, self.cluster);
        let each = parts.iter().zip(bounds).zip(keys).zip(costs);
        for (((part, bound), key), &cost) in each.filter(|(_, cost)| **cost > 0) {
            let op = match charge {
                true => Op::Charge,
                false => Op::Refund { at_ms: part.now.ms },
            };
            // A later part has no total (config), so only its own key counts.
            self.call(part.scope, bound, key, &part.now, cost, op)
                .await?;
        }
        Ok(())
    }

    /// Takes back each part's cost of `costs`, counted by a stacked decision at Redis
    /// instant `part.now.ms`.
    pub(crate) async fn refund_stacked(
        &self,
        parts: &[Stacked<'_>],
        bounds: &[&Bound],
        costs: &[u32],
    ) -> Result<(), StoreError> {
        self.settle_stacked(parts, bounds, costs, false).await
    }

    /// Counts each part's cost of `costs` whether or not it fits, in the keys of a
    /// stacked decision.
    pub(crate) async fn charge_stacked(
        &self,
        parts: &[Stacked<'_>],
        bounds: &[&Bound],
        costs: &[u32],
    ) -> Result<(), StoreError> {
        self.settle_stacked(parts, bounds, costs, true).await
    }

    /// The caller's counters as Redis has them, counting nothing (cost 0).
    pub(crate) async fn peek(
        &self,
        scope: &Scope,
        keys: &Bound,
        caller: CallerKey,
        now: &Now,
        report: &mut Report,
    ) -> Result<(), StoreError> {
        let answer = self.call(scope, keys, keys.caller(caller), now, 0, Op::Count);
        let answer = answer.await?;
        fill(scope, &answer.statuses, answer.at_ms, report);
        Ok(())
    }

    /// Takes up to `amount` off a caller's counts in its billing periods holding
    /// `now`: a refund, at that instant, of the period quotas alone.
    pub(crate) async fn credit(
        &self,
        scope: &Scope,
        keys: &Bound,
        caller: CallerKey,
        now: &Now,
        amount: u32,
    ) -> Result<(), StoreError> {
        self.credit_key(scope, keys.caller(caller), now, amount)
            .await
    }

    /// Forgets a caller's counters in Redis; true if there were any.
    pub(crate) async fn reset(&self, keys: &Bound, caller: CallerKey) -> Result<bool, StoreError> {
        self.reset_key(keys.caller(caller)).await
    }

    /// Forgets the counters under `key`; true if there were any.
    pub(crate) async fn reset_key(&self, key: String) -> Result<bool, StoreError> {
        let deleted = self
            .link
            .query(|mut connection| async move {
                redis::cmd("DEL")
                    .arg(key)
                    .query_async::<u64>(&mut connection)
                    .await
            })
            .await?;
        Ok(deleted > 0)
    }

    /// On a Redis Cluster, the health of the master serving `caller`'s counters
    /// under `keys`, as the slot map last read has it: `None` on one server, a
    /// Sentinel's master, or a slot the map does not know (yet).
    pub(crate) fn health(&self, keys: &Bound, caller: CallerKey) -> Option<Arc<Breaker>> {
        if !self.cluster {
            return None;
        }
        let map = self.link.shards()?;
        let master = map.at_slot(keys.slot(caller))?;
        Some(master.health.clone())
    }

    /// On a Redis Cluster, each master of the slot map as last read (`host:port`)
    /// and whether its health is open (its slots' decisions follow `on_error`);
    /// empty elsewhere.
    pub fn masters_health(&self) -> Vec<(String, bool)> {
        self.link.shards().map_or_else(Vec::new, |map| {
            (map.first_slots().into_iter())
                .map(|(_, address, master)| (address.to_string(), master.health.is_open()))
                .collect()
        })
    }

    /// On a Redis Cluster, the masters of the slot map whose health is open (their
    /// slots' decisions follow `on_error`); 0 elsewhere.
    pub fn masters_down(&self) -> usize {
        self.link.shards().map_or(0, |map| {
            map.masters().filter(|m| m.health.is_open()).count()
        })
    }

    /// The link to this Redis, for its other users (bans).
    pub(crate) fn link(&self) -> Link {
        self.link.clone()
    }

    /// Looks for a loss of the store's data since the last look ([`reset`]); logs
    /// one noticed now.
    pub async fn check_reset(&self, now_ms: u64) {
        let noticed = self.resets.check(&self.link, self.cluster, now_ms).await;
        for reset in noticed.unwrap_or_default() {
            let master = reset.master.as_deref().unwrap_or("");
            tracing::warn!(
                reason = reset.reason,
                master,
                "the redis store lost its data ({}): every caller and every total in it starts a fresh window",
                reset.reason
            );
        }
    }

    /// Data losses noticed since start, and the last one.
    pub fn resets(&self) -> (u64, Option<reset::Reset>) {
        self.resets.seen()
    }

    /// Whether Redis answers a PING now.
    pub async fn ping(&self) -> bool {
        let pong = self.link.query(|mut connection| async move {
            redis::cmd("PING")
                .query_async::<String>(&mut connection)
                .await
        });
        pong.await.is_ok()
    }

    async fn call(
        &self,
        scope: &Scope,
        keys: &Bound,
        caller: String,
        now: &Now,
        cost: u32,
        op: Op,
    ) -> Result<Answer, StoreError> {
        let (refund_at, charge) = match op {
            Op::Count => (None, false),
            Op::Refund { at_ms } => (Some(at_ms), false),
            Op::Charge => (None, true),
            Op::GiveBack => (Some(batch::NEWEST), false),
        };
        let shape = job_shape(scope, keys, now);
        let (answer_to, answer) = oneshot::channel();
        let job = Job {
            stacked: None,
            caller,
            total: (!scope.total.is_empty())
                .then(|| keys.total.clone())
                .flatten(),
            cost,
            refund_at,
            charge,
            shape,
            answer_to,
            // A read (cost 0) counts nothing: late or not, its answer is good.
            deadline: (matches!(op, Op::Count) && cost > 0).then(|| Instant::now() + self.timeout),
        };
        batch::send(self.id, &self.link, job)?;
        tokio::time::timeout(self.timeout, answer)
            .await
            .map_err(|_| StoreError::Timeout(self.timeout))?
            .map_err(|_| StoreError::Stopped)?
    }
}

/// The shape of a request of `scope` at `now`: the one bound up front, unless the
/// instant carries calendar days or billing periods.
fn job_shape(scope: &Scope, keys: &Bound, now: &Now) -> Arc<Shape> {
    match (now.calendar, now.periods) {
        (None, None) => keys.shape.clone(),
        _ => Arc::new(shape(&scope.quotas, &scope.total, now)),
    }
}

/// The statuses of a script answer, in report order.
fn fill(scope: &Scope, statuses: &[[i64; 3]], at_ms: u64, report: &mut Report) {
    report.at_ms = at_ms;
    let quotas = scope
        .quotas
        .iter()
        .map(|q| (q, false))
        .chain(scope.total.iter().map(|q| (q, true)));
    for ((quota, is_total), [used, reset, retry]) in quotas.zip(statuses) {
        report.push(LimitStatus {
            quota: *quota,
            total: is_total,
            used: u32::try_from(*used).unwrap_or(u32::MAX),
            reset_ms: u64::try_from(*reset).unwrap_or(0),
            retry_ms: u64::try_from(*retry).ok(),
        });
    }
}
