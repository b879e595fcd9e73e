//! Stores: where callers' counters live. One contract, several engines.
//!
//! A store decides one request of one caller against the quotas of its plan and the
//! `total` quotas of its policy, all or nothing, and counts it if admitted. The
//! memory store keeps counters in this process; later engines (Redis) keep the same
//! semantics elsewhere. Stores never read the clock: the instant comes with the call.

pub mod blocked;
pub mod memory;
pub mod state;

use std::sync::Arc;

use crate::limit::{Now, Quota, Report};

pub use memory::MemoryStore;

/// A caller as the limiter sees it: 64 bits naming an IP (prefix) or a consumer.
pub type CallerKey = u64;

/// The counters one request is decided against, resolved once per config snapshot.
#[derive(Debug, Clone)]
pub struct Counters {
    /// The caller's plan: counters per caller.
    pub plan: memory::PlanCounters,
    pub quotas: Vec<Quota>,
    /// The policy's `total`: one shared counter, when the policy has total quotas.
    pub total: Option<(memory::TotalCounter, Vec<Quota>)>,
    /// Callers known to be refused for a while; new with every snapshot.
    pub blocked: std::sync::Arc<blocked::Blocked>,
}

/// A store's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Admitted,
    Limited,
    /// The store tracks `max_keys` active callers and cannot take a new one.
    Full,
}

#[derive(Debug, Clone)]
pub enum Store {
    Memory(Arc<MemoryStore>),
}

impl Store {
    pub fn memory(max_keys: usize) -> Store {
        Store::Memory(Arc::new(MemoryStore::new(max_keys)))
    }

    /// Decides `cost` requests of `caller` at `now`, filling `report`.
    pub fn decide(
        &self,
        counters: &Counters,
        caller: CallerKey,
        now: &Now,
        cost: u32,
        report: &mut Report,
    ) -> Verdict {
        match self {
            Store::Memory(store) => store.decide(counters, caller, now, cost, report),
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
        match self {
            Store::Memory(store) => Counters {
                plan: store.plan(policy, plan),
                quotas,
                total: (!total.is_empty()).then(|| (store.total(policy), total.to_vec())),
                blocked: Default::default(),
            },
        }
    }

    /// Fills `report` with the caller's state at `now` without counting anything.
    pub fn peek(&self, counters: &Counters, caller: CallerKey, now: &Now, report: &mut Report) {
        match self {
            Store::Memory(store) => store.peek(counters, caller, now, report),
        }
    }

    /// Forgets everything counted for `caller` under `counters`.
    pub fn reset(&self, counters: &Counters, caller: CallerKey) -> bool {
        match self {
            Store::Memory(store) => store.reset(counters, caller),
        }
    }

    /// Idle callers evicted to make room since start.
    pub fn evicted(&self) -> u64 {
        match self {
            Store::Memory(store) => store.evicted(),
        }
    }

    /// Writes the counters to a state file (memory store).
    pub fn save_state(&self, path: &std::path::Path, now_ms: u64) -> std::io::Result<()> {
        match self {
            Store::Memory(store) => state::save(store, path, now_ms),
        }
    }

    /// Reads counters back from a state file (memory store).
    pub fn restore_state(
        &self,
        path: &std::path::Path,
        now_ms: u64,
    ) -> Result<Option<state::Restored>, state::StateError> {
        match self {
            Store::Memory(store) => state::restore(store, path, now_ms),
        }
    }

    /// Callers currently tracked.
    pub fn tracked(&self) -> usize {
        match self {
            Store::Memory(store) => store.tracked(),
        }
    }

    /// Drops callers whose windows are all empty; returns how many were dropped.
    pub fn sweep(&self, now: &Now) -> usize {
        match self {
            Store::Memory(store) => store.sweep(now),
        }
    }
}
