//! One (policy, plan)'s callers: 64 shards, each a `parking_lot::Mutex` around a
//! `hashbrown::HashTable` of (caller, [`Runs`]), and the share of `max_keys` they take.

use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use arc_swap::ArcSwap;
use hashbrown::HashTable;
use parking_lot::Mutex;

use crate::limit::{Now, Quota, Runs};
use crate::store::{BanTable, CallerKey};

pub(super) const SHARDS: usize = 64;
/// Entries looked at in one shard when room is needed for a new caller: the sample of
/// an approximated LRU (Redis samples 5), enough to find an idle or cold caller in a
/// table of active ones at a bounded cost per new caller.
pub(super) const SAMPLE: usize = 8;

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
    /// The plan's quotas as the newest config has them: what "cold" is judged by.
    quotas: ArcSwap<Vec<Quota>>,
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
            quotas: ArcSwap::default(),
        }
    }

    /// The plan's quotas, for judging which callers are cold.
    pub(super) fn set_quotas(&self, quotas: &[Quota]) {
        self.quotas.store(Arc::new(quotas.to_vec()));
    }

    /// Frees a slot by evicting one caller among the first `sample` of `shard`: an
    /// idle one (nothing counted any more) at once, else the least recently seen of the
    /// cold ones (under half of every limit); never a caller near a limit, never a
    /// banned one. True if one went.
    pub(super) fn evict_one(
        &self,
        shard: &mut HashTable<(CallerKey, Runs)>,
        now: &Now,
        sample: usize,
        bans: &BanTable,
    ) -> bool {
        let quotas = self.quotas.load();
        let mut victim: Option<(CallerKey, u64)> = None;
        for (key, runs) in shard.iter_mut().take(sample) {
            if runs.prune_all(now) {
                victim = Some((*key, 0));
                break;
            }
            if bans.banned(*key, now.ms).is_some() || !runs.is_cold(&quotas, now) {
                continue;
            }
            let seen = runs.last_seen_ms(now);
            if victim.is_none_or(|(_, oldest)| seen < oldest) {
                victim = Some((*key, seen));
            }
        }
        let Some((key, _)) = victim else {
            return false;
        };
        let hash = self.hasher.hash_one(key);
        if let Ok(entry) = shard.find_entry(hash, |(k, _)| *k == key) {
            entry.remove();
            self.tracked.fetch_sub(1, Ordering::Relaxed);
            self.evicted.fetch_add(1, Ordering::Relaxed);
        }
        true
    }

    /// Cold, unbanned callers of every shard with when each was last seen, dropping
    /// idle ones on the way; returns the idle ones dropped.
    pub(super) fn scan(
        &self,
        now: &Now,
        bans: &BanTable,
        cold: &mut Vec<(u64, CallerKey, usize)>,
    ) -> usize {
        let quotas = self.quotas.load();
        let mut idle = 0;
        for (index, shard) in self.shards.iter().enumerate() {
            let mut shard = shard.lock();
            let before = shard.len();
            shard.retain(|(_, runs)| !runs.prune_all(now));
            idle += before - shard.len();
            for (key, runs) in shard.iter_mut() {
                if bans.banned(*key, now.ms).is_none() && runs.is_cold(&quotas, now) {
                    cold.push((runs.last_seen_ms(now), *key, index));
                }
            }
        }
        self.tracked.fetch_sub(idle, Ordering::Relaxed);
        self.evicted.fetch_add(idle as u64, Ordering::Relaxed);
        idle
    }

    /// Evicts `key` from shard `index`, if it is still there.
    pub(super) fn evict(&self, index: usize, key: CallerKey) -> bool {
        let hash = self.hasher.hash_one(key);
        let mut shard = self.shards[index].lock();
        match shard.find_entry(hash, |(k, _)| *k == key) {
            Ok(entry) => {
                entry.remove();
                self.tracked.fetch_sub(1, Ordering::Relaxed);
                self.evicted.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(_) => false,
        }
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
