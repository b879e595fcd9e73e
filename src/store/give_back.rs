//! Giving units back without the instant they were counted at: a credit to a
//! caller's billing periods (`/admin/usage/credit`), and Envoy's `is_negative_hits`,
//! a client handing back what it took earlier, which each engine takes off the
//! caller's newest counts (and the policy's total's). Never below zero; with Redis
//! in one script step, so a fleet gives back once.

use super::breaker::Permit;
use super::{CallerKey, Fallback, Handle, Scope, Store, fallback};
use crate::limit::Now;

impl Store {
    /// Gives `amount` units back to `caller` in its current billing periods under
    /// `scope` (the `per_month` and `per_year` that hold `now`): a top-up. A count
    /// never goes below zero: a credit larger than the usage only empties it. With
    /// Redis it is one script call, for the whole fleet. False if the store could
    /// not take it (Redis did not answer); nothing was credited then.
    pub async fn credit(&self, scope: &Scope, caller: CallerKey, now: &Now, amount: u32) -> bool {
        scope.memo.forget(caller);
        match (self, &scope.handle) {
            (Store::Memory(store), Handle::Memory(bound)) => {
                store.credit(scope, bound, caller, now, amount);
                true
            }
            (Store::Redis(store), Handle::Redis(bound)) => {
                store.credit(scope, bound, caller, now, amount).await
            }
            _ => false,
        }
    }

    /// Takes up to `units` off `caller`'s newest counts under `scope` at `now`.
    pub async fn give_back(&self, scope: &Scope, caller: CallerKey, now: &Now, units: u32) {
        if units == 0 {
            return;
        }
        scope.memo.forget(caller);
        match (self, &scope.handle) {
            (Store::Memory(store), Handle::Memory(bound)) => {
                store.give_back(scope, bound, caller, now, units)
            }
            (Store::Redis(store), Handle::Redis(bound)) => {
                store.give_back(scope, bound, caller, now, units).await
            }
            _ => {}
        }
    }
}

impl Fallback {
    /// Gives back in Redis while the breaker is closed, else in the local engine
    /// (which counted while Redis was down). One Redis cannot take is lost, which
    /// errs toward refusing.
    async fn give_back(
        &self,
        scope: &Scope,
        bound: &fallback::Bound,
        caller: CallerKey,
        now: &Now,
        units: u32,
    ) {
        let node = self.health(bound, caller);
        let breaker = node.as_deref().unwrap_or(&self.breaker);
        if breaker.is_open() {
            (self.local).give_back(scope, &bound.local, caller, now, units);
            return;
        }
        let given = (self.redis).give_back(scope, &bound.redis, caller, now, units);
        if let Err(err) = given.await {
            self.failed_on(breaker, now.ms, Permit::Closed, &err);
        }
    }
}
