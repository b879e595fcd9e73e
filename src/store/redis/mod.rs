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

pub mod bans;
pub mod batch;
pub mod link;
pub mod sentinel;
pub mod shards;
pub mod spread;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::sync::oneshot;

use batch::{Answer, Job, Shape};
use link::Link;

use super::{CallerKey, Scope, StoreError, Verdict};
use crate::config::RedisTarget;
use crate::limit::{LimitStatus, Now, Quota, Report, Window};

/// The number of the next store, which names its batchers.
static STORES: AtomicU64 = AtomicU64::new(0);

/// Where a (policy, plan)'s counters live in Redis: this engine's part of a
/// [`Scope`]'s handle.
#[derive(Debug, Clone)]
pub(crate) struct Bound {
    /// Everything before the caller in the caller's key.
    caller_prefix: String,
    /// Everything after the caller (the closing brace of a per-caller hash tag).
    caller_suffix: &'static str,
    /// The policy's total, when it has one; shared by every request's batch job.
    total: Option<Arc<str>>,
    /// The quotas as the script reads them, for requests without calendar days.
    shape: Arc<Shape>,
}

impl Bound {
    pub(crate) fn new(policy: &str, plan: &str, quotas: &[Quota], total: &[Quota]) -> Bound {
        let shape = Arc::new(shape(quotas, total, &Now::sliding(0)));
        let (policy, plan) = (short_hash(policy), short_hash(plan));
        if total.is_empty() {
            Bound {
                caller_prefix: format!("sluice:{{{policy}:{plan}:"),
                caller_suffix: "}",
                total: None,
                shape,
            }
        } else {
            Bound {
                caller_prefix: format!("sluice:{{{policy}}}:{plan}:"),
                caller_suffix: "",
                total: Some(format!("sluice:{{{policy}}}:total").into()),
                shape,
            }
        }
    }

    fn caller(&self, caller: CallerKey) -> String {
        format!("{}{caller:016x}{}", self.caller_prefix, self.caller_suffix)
    }
}

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

/// Names in keys are hashed: short, and free of `{` and `}`.
fn short_hash(name: &str) -> String {
    const_hex::encode(&Sha256::digest(name.as_bytes())[..6])
}

/// The Redis engine: one limit shared by every replica, decided by a Lua script.
#[derive(Debug)]
pub struct RedisStore {
    /// Names this store's batchers (one per runtime that decides, see [`batch`]).
    id: u64,
    link: Link,
    timeout: Duration,
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
        let answer = self.call(scope, keys, caller, now, cost, Op::Count).await?;
        fill(scope, &answer, report);
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
        self.call(scope, keys, caller, at, cost, Op::Refund { at_ms: at.ms })
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
        self.call(scope, keys, caller, now, cost, Op::Charge)
            .await
            .map(drop)
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
        let answer = self.call(scope, keys, caller, now, 0, Op::Count).await?;
        fill(scope, &answer, report);
        Ok(())
    }

    /// Forgets a caller's counters in Redis; true if there were any.
    pub(crate) async fn reset(&self, keys: &Bound, caller: CallerKey) -> Result<bool, StoreError> {
        let key = keys.caller(caller);
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

    /// The link to this Redis, for its other users (bans).
    pub(crate) fn link(&self) -> Link {
        self.link.clone()
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
        caller: CallerKey,
        now: &Now,
        cost: u32,
        op: Op,
    ) -> Result<Answer, StoreError> {
        let (refund_at, charge) = match op {
            Op::Count => (None, false),
            Op::Refund { at_ms } => (Some(at_ms), false),
            Op::Charge => (None, true),
        };
        let shape = match (now.calendar, now.periods) {
            (None, None) => keys.shape.clone(),
            _ => Arc::new(shape(&scope.quotas, &scope.total, now)),
        };
        let (answer_to, answer) = oneshot::channel();
        let job = Job {
            caller: keys.caller(caller),
            total: (!scope.total.is_empty())
                .then(|| keys.total.clone())
                .flatten(),
            cost,
            refund_at,
            charge,
            shape,
            answer_to,
        };
        batch::send(self.id, &self.link, job)?;
        tokio::time::timeout(self.timeout, answer)
            .await
            .map_err(|_| StoreError::Timeout(self.timeout))?
            .map_err(|_| StoreError::Stopped)?
    }
}

/// The statuses of a script answer, in report order.
fn fill(scope: &Scope, answer: &Answer, report: &mut Report) {
    report.at_ms = answer.at_ms;
    let quotas = scope
        .quotas
        .iter()
        .map(|q| (q, false))
        .chain(scope.total.iter().map(|q| (q, true)));
    for ((quota, is_total), [used, reset, retry]) in quotas.zip(&answer.statuses) {
        report.push(LimitStatus {
            quota: *quota,
            total: is_total,
            used: u32::try_from(*used).unwrap_or(u32::MAX),
            reset_ms: u64::try_from(*reset).unwrap_or(0),
            retry_ms: u64::try_from(*retry).ok(),
        });
    }
}
