//! One (policy, plan)'s callers: 64 shards, each a `parking_lot::Mutex` around a
//! `hashbrown::HashTable` of (caller, [`Runs`]), and the share of `max_keys` they take.

use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use hashbrown::HashTable;
use parking_lot::Mutex;

use crate::limit::{Now, Runs};
use crate::store::CallerKey;

pub(super) const SHARDS: usize = 64;

type Shard = Mutex<HashTable<(CallerKey, Runs)>>;

/// One (policy, plan)'s callers.
#[derive(Debug)]
pub struct Table {
    pub(super) shards: Box<[Shard]>,
    pub(super) hasher: foldhash::fast::RandomState,
    /// Callers tracked across all tables of the store (shared with it).
    pub(super) tracked: Arc<AtomicUsize>,
    /// Callers evicted to make room since start (shared with the store).
    evicted: Arc<AtomicU64>,
    max_keys: usize,
}

impl Table {
    pub(super) fn new(
        tracked: Arc<AtomicUsize>,
        evicted: Arc<AtomicU64>,
        max_keys: usize,
    ) -> Table {
        Table {
            shards: (0..SHARDS).map(|_| Mutex::new(HashTable::new())).collect(),
            hasher: foldhash::fast::RandomState::default(),
            tracked,
            evicted,
            max_keys,
        }
    }

    /// Makes room for one more caller in `shard`; false if the store is full of
    /// active callers.
    pub(super) fn reserve(&self, shard: &mut HashTable<(CallerKey, Runs)>, now: &Now) -> bool {
        if self.try_take_slot() {
            return true;
        }
        let before = shard.len();
        shard.retain(|(_, runs)| !runs.prune_all(now));
        let freed = before - shard.len();
        if freed == 0 {
            return false;
        }
        // Hand the freed slots back, keeping one for the new caller.
        self.tracked.fetch_sub(freed - 1, Ordering::Relaxed);
        self.evicted.fetch_add(freed as u64, Ordering::Relaxed);
        true
    }

    pub(super) fn try_take_slot(&self) -> bool {
        self.tracked
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.max_keys).then_some(n + 1)
            })
            .is_ok()
    }

    pub(super) fn sweep(&self, now: &Now) -> usize {
        let mut dropped = 0;
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            let before = shard.len();
            shard.retain(|(_, runs)| !runs.prune_all(now));
            dropped += before - shard.len();
        }
        self.tracked.fetch_sub(dropped, Ordering::Relaxed);
        dropped
    }

    /// Calls `f` with every caller and its counters, one shard locked at a time.
    pub(super) fn for_each_caller(&self, mut f: impl FnMut(CallerKey, &Runs)) {
        for shard in self.shards.iter() {
            for (key, runs) in shard.lock().iter() {
                f(*key, runs);
            }
        }
    }

    /// The counters of one caller, pruned at `now` (for usage reports and tests).
    pub fn snapshot(&self, caller: CallerKey, now: &Now) -> Option<Runs> {
        let hash = self.hasher.hash_one(caller);
        let mut shard = self.shards[shard_of(hash)].lock();
        shard
            .find_mut(hash, |(key, _)| *key == caller)
            .map(|(_, runs)| {
                runs.prune_all(now);
                runs.clone()
            })
    }
}

/// The shard of a hash: middle bits, because hashbrown uses the low bits for the
/// bucket and the top seven for its control bytes.
pub(super) fn shard_of(hash: u64) -> usize {
    (hash >> 32) as usize % SHARDS
}
