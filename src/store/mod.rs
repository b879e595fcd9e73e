//! Stores: where callers' counters live. One contract, several engines.
//!
//! A store decides one request of one caller against the quotas of its plan and the
//! `total` quotas of its policy, all or nothing, and counts it if admitted. The
//! memory store keeps counters in this process; the Redis store keeps the same
//! semantics in Redis, shared by every replica, with the memory store as its local
//! fallback. Stores never read the clock: the instant comes with the call (Redis
//! uses its own `TIME`, so replicas agree).

pub mod batch;
pub mod blocked;
pub mod memory;
pub mod redis;
pub mod state;

use std::sync::Arc;

use crate::config::{Backend, OnError, StoreConfig};
use crate::limit::{Now, Quota, Report};

pub use memory::MemoryStore;
pub use redis::{RedisKeys, RedisStore};

/// A caller as the limiter sees it: 64 bits naming an IP (prefix) or a consumer.
pub type CallerKey = u64;

/// The counters one request is decided against, resolved once per config snapshot.
#[derive(Debug, Clone)]
pub struct Counters {
    /// The caller's plan: counters per caller (in memory; with Redis, the fallback).
    pub plan: memory::PlanCounters,
    pub quotas: Vec<Quota>,
    /// The policy's `total`: one shared counter, when the policy has total quotas.
    pub total: Option<(memory::TotalCounter, Vec<Quota>)>,
    /// Callers known to be refused for a while; new with every snapshot.
    pub blocked: Arc<blocked::Blocked>,
    /// Where these counters live in Redis, with the Redis store.
    pub redis: Option<RedisKeys>,
}

impl Counters {
    /// The policy's total quotas (empty without a total).
    pub fn total_quotas(&self) -> &[Quota] {
        self.total
            .as_ref()
            .map_or(&[], |(_, quotas)| quotas.as_slice())
    }

    /// Whether `caller` (`hash` in the memo) is known to be refused at `now_ms`; if so
    /// fills `report` with what it was told. Only single requests: a larger cost
    /// may have to wait longer than the remembered wait.
    fn recall(
        &self,
        hash: u64,
        caller: CallerKey,
        now_ms: u64,
        cost: u32,
        report: &mut Report,
    ) -> bool {
        cost == 1
            && self.blocked.check(
                hash,
                caller,
                now_ms,
                (&self.quotas, self.total_quotas()),
                report,
            )
    }

    /// Remembers a refusal of a single request for [`Counters::recall`].
    fn remember(&self, hash: u64, caller: CallerKey, now_ms: u64, cost: u32, report: &Report) {
        if cost == 1 {
            self.blocked.insert(hash, caller, now_ms, report);
        }
    }
}

/// A store's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Admitted,
    Limited,
    /// The store tracks `max_keys` active callers and cannot take a new one.
    Full,
    /// The shared store cannot be reached and `on_error = "deny"`.
    Unavailable,
}

#[derive(Debug, Clone)]
pub enum Store {
    Memory(Arc<MemoryStore>),
    Redis(Arc<RedisStore>),
}

impl Store {
    pub fn memory(max_keys: usize) -> Store {
        Store::Memory(Arc::new(MemoryStore::new(max_keys)))
    }

    /// The store a config asks for.
    pub fn from_config(config: &StoreConfig) -> Result<Store, String> {
        match &config.backend {
            Backend::Memory => Ok(Store::memory(config.max_keys)),
            Backend::Redis {
                url,
                on_error,
                timeout,
            } => RedisStore::new(url, *timeout, *on_error, config.max_keys)
                .map(|store| Store::Redis(Arc::new(store)))
                .map_err(|err| format!("cannot use redis at {url}: {err}")),
        }
    }

    /// The backend label of metrics.
    pub fn backend(&self) -> &'static str {
        match self {
            Store::Memory(_) => "memory",
            Store::Redis(_) => "redis",
        }
    }

    /// The in-process store: the memory store itself, or Redis's local fallback.
    pub fn local(&self) -> &MemoryStore {
        match self {
            Store::Memory(store) => store,
            Store::Redis(store) => &store.local,
        }
    }

    /// Decides `cost` requests of `caller` at `now`, all or nothing, filling `report`.
    pub async fn decide(
        &self,
        counters: &Counters,
        caller: CallerKey,
        now: &Now,
        cost: u32,
        report: &mut Report,
    ) -> Verdict {
        match (self, &counters.redis) {
            (Store::Redis(store), Some(keys)) => {
                let hash = blocked::hash(caller);
                if counters.recall(hash, caller, now.ms, cost, report) {
                    return Verdict::Limited;
                }
                let verdict = store
                    .decide(counters, keys, caller, now, cost, report)
                    .await;
                if verdict == Verdict::Limited {
                    counters.remember(hash, caller, now.ms, cost, report);
                }
                verdict
            }
            _ => self.local().decide(counters, caller, now, cost, report),
        }
    }

    /// Resolves the counters of (policy, plan) for a new config snapshot, keeping the
    /// existing ones so that a reload keeps every caller's history.
    pub fn counters(
        &self,
        policy: &str,
        plan: &str,
        quotas: Vec<Quota>,
        total: &[Quota],
    ) -> Counters {
        let local = self.local();
        let redis = match self {
            Store::Memory(_) => None,
            Store::Redis(_) => Some(RedisKeys::new(policy, plan, &quotas, total)),
        };
        Counters {
            plan: local.plan(policy, plan),
            quotas,
            total: (!total.is_empty()).then(|| (local.total(policy), total.to_vec())),
            blocked: Default::default(),
            redis,
        }
    }

    /// Whether the store can decide now (readiness): Redis answers, or its
    /// `on_error` mode keeps deciding without it.
    pub async fn ready(&self) -> bool {
        match self {
            Store::Memory(_) => true,
            Store::Redis(store) => store.on_error() != OnError::Deny || store.ping().await,
        }
    }

    /// Errors talking to a shared store since start.
    pub fn errors(&self) -> u64 {
        match self {
            Store::Memory(_) => 0,
            Store::Redis(store) => store.errors(),
        }
    }

    /// Whether `on_error` is deciding because the shared store is down.
    pub fn in_fallback(&self) -> bool {
        match self {
            Store::Memory(_) => false,
            Store::Redis(store) => store.in_fallback(),
        }
    }

    /// Fills `report` with the caller's state at `now` without counting anything.
    pub async fn peek(
        &self,
        counters: &Counters,
        caller: CallerKey,
        now: &Now,
        report: &mut Report,
    ) {
        match (self, &counters.redis) {
            (Store::Redis(store), Some(keys)) => {
                store.peek(counters, keys, caller, now, report).await;
            }
            _ => self.local().peek(counters, caller, now, report),
        }
    }

    /// Forgets everything counted for `caller` under `counters`.
    pub async fn reset(&self, counters: &Counters, caller: CallerKey) -> bool {
        match (self, &counters.redis) {
            (Store::Redis(store), Some(keys)) => {
                counters.blocked.forget(blocked::hash(caller), caller);
                store.reset(counters, keys, caller).await
            }
            _ => self.local().reset(counters, caller),
        }
    }

    /// Idle callers evicted to make room since start.
    pub fn evicted(&self) -> u64 {
        self.local().evicted()
    }

    /// Writes the counters to a state file (memory store).
    pub fn save_state(&self, path: &std::path::Path, now_ms: u64) -> std::io::Result<()> {
        state::save(self.local(), path, now_ms)
    }

    /// Reads counters back from a state file (memory store).
    pub fn restore_state(
        &self,
        path: &std::path::Path,
        now_ms: u64,
    ) -> Result<Option<state::Restored>, state::StateError> {
        state::restore(self.local(), path, now_ms)
    }

    /// Callers currently tracked.
    pub fn tracked(&self) -> usize {
        self.local().tracked()
    }

    /// Drops callers whose windows are all empty; returns how many were dropped.
    pub fn sweep(&self, now: &Now) -> usize {
        self.local().sweep(now)
    }
}
