//! Giving units back without the instant they were counted at (a negative hit):
//! the newest entries of the caller's windows and of the policy's total.

use std::hash::BuildHasher;

use super::{Bound, MemoryStore, shard_of};
use crate::limit::Now;
use crate::store::{CallerKey, Scope};

impl MemoryStore {
    /// Takes up to `units` off `caller`'s newest counts under `scope` at `now`, and
    /// off the total's; a caller not tracked has nothing to give back.
    pub(crate) fn give_back(
        &self,
        scope: &Scope,
        bound: &Bound,
        caller: CallerKey,
        now: &Now,
        units: u32,
    ) {
        let table = &bound.table;
        let hash = table.hasher.hash_one(caller);
        {
            let mut shard = table.shards[shard_of(hash)].lock();
            if let Some(runs) = shard.find_mut(hash, caller) {
                runs.give_back(&scope.quotas, now, units);
            }
        }
        if let Some(total) = &bound.total {
            total.lock().give_back(&scope.total, now, units);
        }
    }
}
