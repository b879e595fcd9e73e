//! Stores: where callers' counters live. One contract, two engines.
//!
//! The contract speaks in policies, plans, callers, costs and instants. A [`Scope`]
//! is what a request is decided against: one (policy, plan)'s quotas and the policy's
//! `total`, bound to the store once per config snapshot so a request does no name
//! lookups. [`Store::decide`] counts `cost` requests of a caller all or nothing;
//! [`Store::decide_stacked`] counts them in several scopes (a route of several
//! policies, each under its own key) all or nothing across all of them;
//! [`Store::refund`] gives back a request that was refused after it was admitted (a
//! concurrency cap); [`Store::peek`] and [`Store::reset`] serve the admin API.
//!
//! Each engine owns its key layout: the memory engine ([`memory`]) keeps sharded tables
//! per (policy, plan), bounded by `max_keys`, and the state file; the Redis engine
//! ([`redis`]) keeps hash-tagged keys decided by one Lua script per batch, so every
//! replica shares one limit. Two wrappers sit in front of the engines, each in one
//! place: the refusal memo ([`memo`]) answers callers known to be refused without
//! asking an engine, and the fallback ([`fallback`]) decides by `on_error` while Redis
//! is down. Stores never read the clock: the instant comes with the call (Redis uses
//! its own `TIME`, so replicas agree, and says in the report which instant it used).
//! Ban state ([`bans`]) is the other half of the contract: checked per request from an
//! in-process table, which the memory engine owns (and saves in its state file) and
//! the Redis engine keeps in step with the fleet's bans in Redis.
//!
//! A store owns its lifecycle ([`upkeep`]): [`Store::start`] starts what its engine
//! does in the background (the memory engine's state-file saves, the Redis engine's
//! ban sync) and [`Upkeep::stop`] ends it with a last save. The Redis engine's
//! connection lives on a thread of the engine's own from open until the store is
//! dropped ([`redis::link`]), never on the runtime of whoever used it first; each
//! runtime that decides batches its own decisions ([`redis::batch`]).
//!
//! What a store reports about itself (readiness, errors, evictions, the fleet's board)
//! is in `status.rs`, apart from the contract's decisions.

mod ban_sync;
pub mod bans;
pub mod breaker;
pub mod fallback;
mod give_back;
mod key_parts;
pub mod listing;
pub mod memo;
pub mod memory;
pub mod redis;
mod status;
pub mod upkeep;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::config::{AutoBan, Backend, StoreConfig};
use crate::limit::{Now, Quota, Report};

pub use bans::{Ban, BanTable, Reason};
pub use fallback::Fallback;
pub use memory::MemoryStore;
pub use redis::RedisStore;
pub use upkeep::Upkeep;

/// A caller as the limiter sees it: 64 bits naming an IP (prefix) or a consumer.
pub type CallerKey = u64;

/// A store's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Counted: every quota had room for the cost.
    Admitted,
    /// Refused by at least one quota; nothing was counted.
    Limited,
    /// The shared store cannot be reached and `on_error = "deny"`.
    Unavailable,
}

/// Why a store could not be built or could not answer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The `[store] url` cannot be used at start.
    #[error("cannot use redis at {url}: {source}")]
    Open {
        /// The URL as configured.
        url: String,
        /// What the client said.
        source: Arc<::redis::RedisError>,
    },
    /// A command failed (connection lost, script error).
    #[error("redis: {0}")]
    Redis(Arc<::redis::RedisError>),
    /// Redis did not answer within `[store] timeout`.
    #[error("no answer from redis within {0:?}")]
    Timeout(Duration),
    /// Redis ran a decision after its caller stopped waiting (the call's deadline),
    /// and counted nothing.
    #[error("redis ran the decision after its deadline and counted nothing")]
    Late,
    /// The store's thread that talks to Redis is gone (the store is shutting down).
    #[error("the redis batcher has stopped")]
    Stopped,
    /// The store's thread could not be started.
    #[error("cannot start the redis store's thread: {0}")]
    Thread(Arc<std::io::Error>),
    /// Fewer replicas than `wait_replicas` acknowledged a decision's counts in time.
    #[error("{acked} of {wanted} replicas acknowledged the counts in time")]
    Unreplicated {
        /// Replicas that acknowledged.
        acked: i64,
        /// `wait_replicas`.
        wanted: u32,
    },
    /// The sentinels have not named a master (yet).
    #[error("no redis master named by the sentinels yet")]
    NoMaster,
    /// Redis answered something the script never returns.
    #[error("a malformed answer from redis: {0}")]
    Protocol(&'static str),
}

impl From<::redis::RedisError> for StoreError {
    fn from(err: ::redis::RedisError) -> Self {
        StoreError::Redis(Arc::new(err))
    }
}

/// One (policy, plan)'s quotas and its policy's `total`, bound to the store: what a
/// request of that plan on a route of that policy is decided against.
#[derive(Debug)]
pub struct Scope {
    quotas: Vec<Quota>,
    total: Vec<Quota>,
    /// Callers known to be refused for a while; new with every snapshot.
    memo: memo::Memo,
    /// Where the counters live, as the store's engine defines it.
    handle: Handle,
}

/// Where a [`Scope`]'s counters live: a handle each engine defines, bound once per
/// config snapshot so that a decision does no name lookups.
#[derive(Debug)]
pub(crate) enum Handle {
    /// The memory engine's table of the (policy, plan) and its policy's total.
    Memory(memory::Bound),
    /// The Redis engine's keys, and the in-process counters its fallback decides with.
    Redis(fallback::Bound),
}

impl Scope {
    /// The plan's quotas, in report order.
    pub fn quotas(&self) -> &[Quota] {
        &self.quotas
    }

    /// The policy's `total` quotas, reported after the plan's.
    pub fn total(&self) -> &[Quota] {
        &self.total
    }
}

/// One policy of a stacked decision ([`Store::decide_stacked`]): its scope, the key
/// its budget is counted under, and the instant as its quotas are decided at.
#[derive(Debug, Clone, Copy)]
pub struct Stacked<'s> {
    /// The (policy, plan)'s quotas and counters.
    pub scope: &'s Scope,
    /// The key the policy counts the request under (its `key`, or the caller's).
    pub caller: CallerKey,
    /// The instant, with the caller's billing periods when this scope has any.
    pub now: Now,
    /// The policy is in shadow mode: its refusal refuses nothing, and a request it
    /// would refuse is charged nothing there.
    pub shadow: bool,
}

/// The store a gateway counts in, as `[store] backend` chose it.
#[derive(Debug, Clone)]
pub enum Store {
    /// In this process: sharded tables, bounded by `max_keys`, saved to `state_file`.
    Memory(Arc<MemoryStore>),
    /// Redis, with `on_error` deciding while it is down.
    Redis(Arc<Fallback>),
}

impl Store {
    /// A memory store without a state file.
    pub fn memory(max_keys: usize) -> Store {
        Store::Memory(Arc::new(MemoryStore::new(max_keys, None)))
    }

    /// The in-process ban table: the memory store's, or Redis's local copy.
    pub fn ban_table(&self) -> &BanTable {
        match self {
            Store::Memory(store) => &store.bans,
            Store::Redis(store) => store.ban_table(),
        }
    }

    /// When `key`'s ban ends, if it is banned at `now_ms` (one lookup in memory,
    /// skipped entirely while nobody is banned).
    pub fn banned(&self, key: CallerKey, now_ms: u64) -> Option<u64> {
        self.ban_table().banned(key, now_ms)
    }

    /// Counts a refusal of `key` toward an automatic ban; returns the ban if this
    /// refusal earned it here and now. With Redis the count goes to the fleet (a ban
    /// made there reaches this replica within a second).
    pub fn strike(
        &self,
        key: CallerKey,
        caller: impl FnOnce() -> String,
        now_ms: u64,
        auto: &AutoBan,
    ) -> Option<Ban> {
        match self {
            Store::Memory(store) => store.bans.strike(key, caller, now_ms, auto),
            Store::Redis(store) => store.strike(key, caller, now_ms, auto),
        }
    }

    /// Bans `key` by hand until `until_ms`; false if the table is full of live bans.
    pub async fn ban(&self, key: CallerKey, ban: Ban, now_ms: u64) -> bool {
        match self {
            Store::Memory(store) => store.bans.set(key, ban, now_ms),
            Store::Redis(store) => store.ban(key, ban, now_ms).await,
        }
    }

    /// Lifts `key`'s ban, automatic or manual; true if it was banned.
    pub async fn lift(&self, key: CallerKey, now_ms: u64) -> bool {
        match self {
            Store::Memory(store) => store.bans.lift(key, now_ms),
            Store::Redis(store) => store.lift(key, now_ms).await,
        }
    }

    /// The store a config asks for. A memory store reads its state file back (a
    /// missing or bad file is logged, never fatal); a Redis store connects lazily, so
    /// a Redis that is down at start follows `on_error`, but a URL that cannot be
    /// used at all is an error.
    pub fn open(config: &StoreConfig, now_ms: u64) -> Result<Store, StoreError> {
        match &config.backend {
            Backend::Memory => {
                let store = MemoryStore::new(config.max_keys, config.state_file.clone());
                store.restore_state(now_ms);
                Ok(Store::Memory(Arc::new(store)))
            }
            Backend::Redis {
                target,
                on_error,
                timeout,
                ca_file,
                wait_replicas,
            } => {
                let ca = ca_file.as_ref().map(std::fs::read).transpose();
                let ca = ca.map_err(|err| StoreError::Open {
                    url: format!(
                        "ca_file {}",
                        ca_file.as_deref().unwrap_or(Path::new("")).display()
                    ),
                    source: Arc::new(err.into()),
                })?;
                let redis = RedisStore::new(target, ca, *timeout, *wait_replicas)?;
                let local = MemoryStore::new(config.max_keys, None);
                Ok(Store::Redis(Arc::new(Fallback::new(
                    redis, local, *on_error,
                ))))
            }
        }
    }

    /// The backend label of metrics.
    pub fn backend(&self) -> &'static str {
        match self {
            Store::Memory(_) => "memory",
            Store::Redis(_) => "redis",
        }
    }

    /// Binds (policy, plan)'s `quotas` and the policy's `total` for a new config
    /// snapshot. The counters are found by name, so a reload keeps every caller's
    /// history as long as the policy and plan still exist.
    pub fn scope(&self, policy: &str, plan: &str, quotas: Vec<Quota>, total: &[Quota]) -> Scope {
        let (handle, refunds) = match self {
            Store::Memory(store) => (
                Handle::Memory(store.bind(policy, plan, !total.is_empty())),
                store.refunds(policy),
            ),
            Store::Redis(store) => (
                Handle::Redis(store.bind(policy, plan, &quotas, total)),
                store.refunds(policy),
            ),
        };
        Scope {
            memo: memo::Memo::new(refunds),
            quotas,
            total: total.to_vec(),
            handle,
        }
    }

    /// Decides `cost` requests of `caller` at `now`, all or nothing, filling `report`
    /// (and `report.at_ms` with the instant the store decided at).
    pub async fn decide(
        &self,
        scope: &Scope,
        caller: CallerKey,
        now: &Now,
        cost: u32,
        report: &mut Report,
    ) -> Verdict {
        if let Some(verdict) = self.decide_now(scope, caller, now, cost, report) {
            return verdict;
        }
        if recalled(scope, caller, now, cost, report) {
            return Verdict::Limited;
        }
        let (Store::Redis(store), Handle::Redis(bound)) = (self, &scope.handle) else {
            // A scope bound by another store: this one holds none of its counters.
            return Verdict::Unavailable;
        };
        let verdict = store.decide(scope, bound, caller, now, cost, report).await;
        let keep_ms = Some(memo::FLEET_KEEP_MS);
        remembered(scope, caller, now, cost, report, verdict, keep_ms)
    }

    /// [`Store::decide`] without waiting, for the store that answers at once: the
    /// memory engine. `None` for Redis (or a scope bound by another store), whose
    /// answer [`Store::decide`] waits for.
    pub fn decide_now(
        &self,
        scope: &Scope,
        caller: CallerKey,
        now: &Now,
        cost: u32,
        report: &mut Report,
    ) -> Option<Verdict> {
        let (Store::Memory(store), Handle::Memory(bound)) = (self, &scope.handle) else {
            return None;
        };
        if recalled(scope, caller, now, cost, report) {
            return Some(Verdict::Limited);
        }
        let verdict = store.decide(scope, bound, caller, now, cost, report);
        Some(remembered(scope, caller, now, cost, report, verdict, None))
    }

    /// Decides `cost` requests against every part of `parts` at once, all or nothing:
    /// counted in each part whose quotas have room if every enforcing part's do,
    /// nowhere otherwise (a shadow part that would refuse is charged nothing and
    /// refuses nothing). One report per part, in order; each report's `at_ms` is the
    /// instant the store decided at. In memory, one check-then-commit under every
    /// lock the parts need; in Redis, one script call, whose keys share the first
    /// part's hash tag (one Cluster slot).
    pub async fn decide_stacked(
        &self,
        parts: &[Stacked<'_>],
        cost: u32,
        reports: &mut [Report],
    ) -> Verdict {
        match self {
            Store::Memory(store) => {
                let bounds: Option<Vec<&memory::Bound>> = (parts.iter())
                    .map(|part| match &part.scope.handle {
                        Handle::Memory(bound) => Some(bound),
                        Handle::Redis(_) => None,
                    })
                    .collect();
                match bounds {
                    Some(bounds) => store.decide_stacked(parts, &bounds, cost, reports),
                    None => Verdict::Unavailable,
                }
            }
            Store::Redis(store) => {
                let bounds: Option<Vec<&fallback::Bound>> = (parts.iter())
                    .map(|part| match &part.scope.handle {
                        Handle::Redis(bound) => Some(bound),
                        Handle::Memory(_) => None,
                    })
                    .collect();
                match bounds {
                    Some(bounds) => store.decide_stacked(parts, &bounds, cost, reports).await,
                    None => Verdict::Unavailable,
                }
            }
        }
    }

    /// Gives back each part's cost of `costs` (0: nothing there), counted by a
    /// stacked decision at each part's `now.ms` (its report's `at_ms`), in the
    /// counters that decision counted in; with `charge`, counts each whether or not
    /// it fits instead (a cost learnt after the response). Each part on its own:
    /// these always apply, so there is nothing to decide all or nothing.
    pub async fn settle_stacked(&self, parts: &[Stacked<'_>], costs: &[u32], charge: bool) {
        for (part, &cost) in parts.iter().zip(costs) {
            if !charge && cost > 0 {
                part.scope
                    .memo
                    .forget_refunded(part.caller, !part.scope.total.is_empty());
            }
        }
        match self {
            Store::Memory(store) => {
                let each = parts.iter().zip(costs).filter(|(_, cost)| **cost > 0);
                for (part, &cost) in each {
                    let Handle::Memory(bound) = &part.scope.handle else {
                        continue;
                    };
                    let (scope, caller, now) = (part.scope, part.caller, &part.now);
                    match charge {
                        true => store.charge(scope, bound, caller, now, cost),
                        false => store.refund(scope, bound, caller, now, cost),
                    }
                }
            }
            Store::Redis(store) => {
                let bounds: Option<Vec<&fallback::Bound>> = (parts.iter())
                    .map(|part| match &part.scope.handle {
                        Handle::Redis(bound) => Some(bound),
                        Handle::Memory(_) => None,
                    })
                    .collect();
                if let Some(bounds) = bounds {
                    store.settle_stacked(parts, &bounds, costs, charge).await;
                }
            }
        }
    }

    /// Gives back `cost` requests of `caller` admitted under `scope` at `at_ms` (the
    /// report's `at_ms`): a request refused after admission consumes no quota. `now`
    /// carries the calendar day of the refund (the admission's, or the next one).
    pub async fn refund(&self, scope: &Scope, caller: CallerKey, at_ms: u64, now: &Now, cost: u32) {
        scope.memo.forget_refunded(caller, !scope.total.is_empty());
        let at = Now { ms: at_ms, ..*now };
        match (self, &scope.handle) {
            (Store::Memory(store), Handle::Memory(bound)) => {
                store.refund(scope, bound, caller, &at, cost)
            }
            (Store::Redis(store), Handle::Redis(bound)) => {
                store.refund(scope, bound, caller, &at, cost).await
            }
            _ => {}
        }
    }

    /// Counts `cost` more of `caller` at `now` whether or not it fits: a cost learnt
    /// after the response, which may take the caller below zero (debt). The caller
    /// is then refused until its windows have paid the debt back.
    pub async fn charge(&self, scope: &Scope, caller: CallerKey, now: &Now, cost: u32) {
        if cost == 0 {
            return;
        }
        match (self, &scope.handle) {
            (Store::Memory(store), Handle::Memory(bound)) => {
                store.charge(scope, bound, caller, now, cost)
            }
            (Store::Redis(store), Handle::Redis(bound)) => {
                store.charge(scope, bound, caller, now, cost).await
            }
            _ => {}
        }
    }

    /// Fills `report` with the caller's state at `now` without counting anything.
    pub async fn peek(&self, scope: &Scope, caller: CallerKey, now: &Now, report: &mut Report) {
        match (self, &scope.handle) {
            (Store::Memory(store), Handle::Memory(bound)) => {
                store.peek(scope, bound, caller, now, report)
            }
            (Store::Redis(store), Handle::Redis(bound)) => {
                store.peek(scope, bound, caller, now, report).await
            }
            _ => {}
        }
    }

    /// Forgets everything counted for `caller` under `scope`; true if anything was.
    pub async fn reset(&self, scope: &Scope, caller: CallerKey) -> bool {
        scope.memo.forget(caller);
        match (self, &scope.handle) {
            (Store::Memory(store), Handle::Memory(bound)) => store.reset(bound, caller),
            (Store::Redis(store), Handle::Redis(bound)) => store.reset(bound, caller).await,
            _ => false,
        }
    }

    /// The registered consumers' keys: their counters in this process's memory take
    /// none of `max_keys` and are never evicted.
    pub fn reserve(&self, keys: impl IntoIterator<Item = CallerKey>) {
        match self {
            Store::Memory(store) => store.reserve(keys),
            Store::Redis(store) => store.reserve(keys),
        }
    }

    /// Drops callers whose windows are all empty, and ban entries that no longer
    /// matter; returns how many callers were dropped.
    pub fn sweep(&self, now: &Now, ban_within_ms: u64) -> usize {
        self.ban_table().sweep(now.ms, ban_within_ms);
        match self {
            Store::Memory(store) => store.sweep(now),
            Store::Redis(store) => store.sweep(now),
        }
    }
}

/// Whether `scope`'s memo still holds `caller`'s last refusal for `cost` at `now`
/// (filling `report` as that refusal did, at `now`): then no engine is asked.
fn recalled(scope: &Scope, caller: CallerKey, now: &Now, cost: u32, report: &mut Report) -> bool {
    let recalled = scope.memo.recall(scope, caller, now.ms, cost, report);
    if recalled {
        report.at_ms = now.ms;
    }
    recalled
}

/// `verdict`, an engine's answer, with a refusal remembered in `scope`'s memo for
/// `keep_ms` (`None`: until the report's retry time).
fn remembered(
    scope: &Scope,
    caller: CallerKey,
    now: &Now,
    cost: u32,
    report: &Report,
    verdict: Verdict,
    keep_ms: Option<u64>,
) -> Verdict {
    if verdict == Verdict::Limited {
        scope.memo.remember(caller, now.ms, cost, report, keep_ms);
    }
    verdict
}
