//! What a store says about itself and its fleet, for the admin listener, the status
//! page and the metrics: readiness, a ping, errors, losses of Redis's data, the
//! fallback, evictions, callers tracked, and the fleet's board where replicas post
//! their status.
//!
//! None of it decides a request: the contract's decisions are in the parent module.

use super::{Store, redis};

impl Store {
    /// Whether requests are refused while the store does not answer (Redis with
    /// `on_error = "deny"`): readiness then follows a [`Store::ping`].
    pub fn denies_when_down(&self) -> bool {
        match self {
            Store::Memory(_) => false,
            Store::Redis(store) => store.on_error() == crate::config::OnError::Deny,
        }
    }

    /// Pings the shared store: `None` for the memory store, else whether it
    /// answered within its timeout.
    pub async fn ping(&self) -> Option<bool> {
        match self {
            Store::Memory(_) => None,
            Store::Redis(store) => Some(store.ping().await),
        }
    }

    /// Posts this replica's `document` under `name` on the fleet's board, which
    /// every replica reads ([`Store::board`]). Redis only: false for the memory
    /// store, and when Redis did not take it.
    pub async fn post(&self, name: &str, replica: &str, now_ms: u64, document: String) -> bool {
        match self {
            Store::Memory(_) => false,
            Store::Redis(store) => store.post(name, replica, now_ms, document).await,
        }
    }

    /// The documents the fleet's replicas posted under `name` in the last
    /// `redis::board::STALE_MS`; `None` for the memory store, or when Redis did not
    /// answer.
    pub async fn board(&self, name: &str, now_ms: u64) -> Option<Vec<String>> {
        match self {
            Store::Memory(_) => None,
            Store::Redis(store) => store.board(name, now_ms).await,
        }
    }

    /// Losses of the shared store's data (a Redis restarted empty or flushed)
    /// noticed since start, and the last one; `(0, None)` for the memory store.
    pub fn resets(&self) -> (u64, Option<redis::reset::Reset>) {
        match self {
            Store::Memory(_) => (0, None),
            Store::Redis(store) => store.resets(),
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

    /// On a Redis Cluster, each master (`host:port`) and whether its breaker is open
    /// (its slots' decisions follow `on_error`); empty for other stores.
    pub fn masters_health(&self) -> Vec<(String, bool)> {
        match self {
            Store::Memory(_) => Vec::new(),
            Store::Redis(store) => store.masters_health(),
        }
    }

    /// Callers evicted to make room since start (in this process: with Redis, by
    /// its fallback's counters).
    pub fn evicted(&self) -> u64 {
        match self {
            Store::Memory(store) => store.evicted(),
            Store::Redis(store) => store.evicted(),
        }
    }

    /// Callers currently tracked in this process's memory.
    pub fn tracked(&self) -> usize {
        match self {
            Store::Memory(store) => store.tracked(),
            Store::Redis(store) => store.tracked(),
        }
    }
}
