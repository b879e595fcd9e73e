//! The in-process store: sharded hash tables of callers' [`Runs`].
//!
//! Each (policy, plan) has a table of 64 shards, each a `parking_lot::Mutex` around
//! a `hashbrown::HashTable`; a request locks one shard for the few hundred
//! nanoseconds its decision takes, so there is no global lock. A policy's `total`
//! is one mutex-protected counter. The number of tracked callers is bounded by
//! `max_keys` across all tables: a new caller first evicts idle callers (all windows
//! empty) of its shard, then of every table (at most one such scan a second); if
//! none is idle, it is refused ([`Verdict::Full`]) rather than evicting anybody's
//! live counts.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use hashbrown::HashTable;
use parking_lot::Mutex;

use super::{CallerKey, Counters, Verdict};
use crate::limit::{Now, Report, Runs};

const SHARDS: usize = 64;
/// How long a search that found no idle caller to evict holds for.
const FULL_RETRY_MS: u64 = 1_000;

/// Counters of one (policy, plan) for every caller.
pub type PlanCounters = Arc<Table>;
/// Counter of one policy's `total`.
pub type TotalCounter = Arc<Mutex<Runs>>;

#[derive(Debug)]
pub struct MemoryStore {
    /// Tables by (policy, plan); touched only when a config is compiled.
    tables: Mutex<HashMap<(String, String), PlanCounters>>,
    totals: Mutex<HashMap<String, TotalCounter>>,
    /// Callers tracked across all tables, never above `max_keys`.
    tracked: Arc<AtomicUsize>,
    max_keys: usize,
    /// Callers evicted to make room since start.
    evicted: Arc<AtomicU64>,
    /// While full of active callers: no new search for idle ones before this instant.
    full_until_ms: AtomicU64,
    /// Held while the state file is written, so two saves never interleave.
    pub(crate) saving: Mutex<()>,
}

impl MemoryStore {
    pub fn new(max_keys: usize) -> MemoryStore {
        MemoryStore {
            tables: Mutex::new(HashMap::new()),
            totals: Mutex::new(HashMap::new()),
            tracked: Arc::new(AtomicUsize::new(0)),
            max_keys,
            evicted: Arc::new(AtomicU64::new(0)),
            full_until_ms: AtomicU64::new(0),
            saving: Mutex::new(()),
        }
    }

    pub(crate) fn plan(&self, policy: &str, plan: &str) -> PlanCounters {
        let mut tables = self.tables.lock();
        tables
            .entry((policy.to_string(), plan.to_string()))
            .or_insert_with(|| {
                Arc::new(Table::new(
                    self.tracked.clone(),
                    self.evicted.clone(),
                    self.max_keys,
                ))
            })
            .clone()
    }

    pub(crate) fn total(&self, policy: &str) -> TotalCounter {
        self.totals
            .lock()
            .entry(policy.to_string())
            .or_default()
            .clone()
    }

    pub fn tracked(&self) -> usize {
        self.tracked.load(Ordering::Relaxed)
    }

    pub fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    pub fn sweep(&self, now: &Now) -> usize {
        let tables: Vec<_> = self.tables.lock().values().cloned().collect();
        tables.iter().map(|t| t.sweep(now)).sum()
    }

    /// When the store is full, evicts idle callers of every table; false if none
    /// was idle. A fruitless search is not repeated for [`FULL_RETRY_MS`], so a flood
    /// of new callers costs at most one full scan a second.
    fn make_room(&self, now: &Now) -> bool {
        if now.ms < self.full_until_ms.load(Ordering::Relaxed) {
            return false;
        }
        let freed = self.sweep(now);
        if freed == 0 {
            self.full_until_ms
                .store(now.ms + FULL_RETRY_MS, Ordering::Relaxed);
            return false;
        }
        self.evicted.fetch_add(freed as u64, Ordering::Relaxed);
        true
    }

    pub fn decide(
        &self,
        counters: &Counters,
        caller: CallerKey,
        now: &Now,
        cost: u32,
        report: &mut Report,
    ) -> Verdict {
        let table = &counters.plan;
        let hash = table.hasher.hash_one(caller);
        if counters.recall(hash, caller, now.ms, cost, report) {
            return Verdict::Limited;
        }
        let mut shard = table.shards[shard_of(hash)].lock();
        let known = shard
            .find_mut(hash, |(key, _)| *key == caller)
            .map(|(_, runs)| count(counters, runs, now, cost, report));
        let (verdict, idle) = match known {
            Some(decided) => decided,
            None => {
                if !table.reserve(&mut shard, now) {
                    // Nothing idle in this shard: look through every table, without
                    // holding this shard's lock, then try once more.
                    drop(shard);
                    if !self.make_room(now) {
                        return Verdict::Full;
                    }
                    shard = table.shards[shard_of(hash)].lock();
                    if shard.find(hash, |(key, _)| *key == caller).is_none()
                        && !table.try_take_slot()
                    {
                        return Verdict::Full;
                    }
                }
                let runs = match shard.find_mut(hash, |(key, _)| *key == caller) {
                    Some((_, runs)) => runs,
                    None => {
                        let hasher = &table.hasher;
                        let entry =
                            shard.insert_unique(hash, (caller, Runs::default()), |(key, _)| {
                                hasher.hash_one(key)
                            });
                        &mut entry.into_mut().1
                    }
                };
                count(counters, runs, now, cost, report)
            }
        };
        if verdict == Verdict::Limited {
            counters.remember(hash, caller, now.ms, cost, report);
            if idle && let Ok(entry) = shard.find_entry(hash, |(key, _)| *key == caller) {
                entry.remove();
                table.tracked.fetch_sub(1, Ordering::Relaxed);
            }
        }
        verdict
    }
}

/// Decides one request against a caller's counters (and its policy's total), all or
/// nothing: counts it everywhere if every window has room, nowhere otherwise. Also
/// says whether the caller's counters are now empty.
fn count(
    counters: &Counters,
    runs: &mut Runs,
    now: &Now,
    cost: u32,
    report: &mut Report,
) -> (Verdict, bool) {
    let mut admit = runs.check(&counters.quotas, now, cost, false, report);
    if admit && let Some((total, quotas)) = &counters.total {
        let mut total = total.lock();
        admit = total.check(quotas, now, cost, true, report);
        if admit {
            total.commit(quotas, now, cost);
        }
    }
    if admit {
        runs.commit(&counters.quotas, now, cost);
        return (Verdict::Admitted, false);
    }
    (Verdict::Limited, runs.is_empty())
}

impl MemoryStore {
    /// Calls `f` with every table's (policy, plan) and the table.
    pub(crate) fn for_each_table(&self, mut f: impl FnMut(&str, &str, &Table)) {
        let tables: Vec<_> = self
            .tables
            .lock()
            .iter()
            .map(|(k, t)| (k.clone(), t.clone()))
            .collect();
        for ((policy, plan), table) in tables {
            f(&policy, &plan, &table);
        }
    }

    /// Calls `f` with every policy's total counter.
    pub(crate) fn for_each_total(&self, mut f: impl FnMut(&str, &Runs)) {
        let totals: Vec<_> = self
            .totals
            .lock()
            .iter()
            .map(|(k, t)| (k.clone(), t.clone()))
            .collect();
        for (policy, total) in totals {
            f(&policy, &total.lock());
        }
    }

    /// Puts back a caller's counters read from a state file; false if full.
    pub(crate) fn restore(&self, policy: &str, plan: &str, caller: CallerKey, runs: Runs) -> bool {
        let table = self.plan(policy, plan);
        if !table.try_take_slot() {
            return false;
        }
        let hash = table.hasher.hash_one(caller);
        let mut shard = table.shards[shard_of(hash)].lock();
        match shard.find_mut(hash, |(key, _)| *key == caller) {
            Some(entry) => {
                entry.1 = runs;
                table.tracked.fetch_sub(1, Ordering::Relaxed);
            }
            None => {
                let hasher = &table.hasher;
                shard.insert_unique(hash, (caller, runs), |(key, _)| hasher.hash_one(key));
            }
        }
        true
    }

    /// Puts back a policy's total counter read from a state file.
    pub(crate) fn restore_total(&self, policy: &str, runs: Runs) {
        *self.total(policy).lock() = runs;
    }

    /// The caller's state under `counters` at `now`, without counting anything.
    pub(crate) fn peek(
        &self,
        counters: &Counters,
        caller: CallerKey,
        now: &Now,
        report: &mut Report,
    ) {
        let mut runs = counters.plan.snapshot(caller, now).unwrap_or_default();
        runs.check(&counters.quotas, now, 0, false, report);
    }

    /// Forgets everything counted for `caller` under `counters`; true if it was tracked.
    pub(crate) fn reset(&self, counters: &Counters, caller: CallerKey) -> bool {
        let table = &counters.plan;
        let hash = table.hasher.hash_one(caller);
        counters.blocked.forget(hash, caller);
        let mut shard = table.shards[shard_of(hash)].lock();
        match shard.find_entry(hash, |(key, _)| *key == caller) {
            Ok(entry) => {
                entry.remove();
                table.tracked.fetch_sub(1, Ordering::Relaxed);
                true
            }
            Err(_) => false,
        }
    }
}

type Shard = Mutex<HashTable<(CallerKey, Runs)>>;

/// One (policy, plan)'s callers.
#[derive(Debug)]
pub struct Table {
    shards: Box<[Shard]>,
    hasher: foldhash::fast::RandomState,
    tracked: Arc<AtomicUsize>,
    evicted: Arc<AtomicU64>,
    max_keys: usize,
}

impl Table {
    fn new(tracked: Arc<AtomicUsize>, evicted: Arc<AtomicU64>, max_keys: usize) -> Table {
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
    fn reserve(&self, shard: &mut HashTable<(CallerKey, Runs)>, now: &Now) -> bool {
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

    fn try_take_slot(&self) -> bool {
        self.tracked
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.max_keys).then_some(n + 1)
            })
            .is_ok()
    }

    fn sweep(&self, now: &Now) -> usize {
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
    pub(crate) fn for_each_caller(&self, mut f: impl FnMut(CallerKey, &Runs)) {
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
fn shard_of(hash: u64) -> usize {
    (hash >> 32) as usize % SHARDS
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use super::*;
    use crate::limit::{Quota, Window};
    use crate::store::Store;

    fn minute(limit: u32) -> Vec<Quota> {
        vec![Quota {
            window: Window::Minute,
            limit: NonZeroU32::new(limit).unwrap(),
        }]
    }

    fn decide(store: &Store, counters: &Counters, key: u64, ms: u64) -> Verdict {
        store
            .local()
            .decide(counters, key, &Now::sliding(ms), 1, &mut Report::default())
    }

    #[test]
    fn a_flood_of_new_callers_never_evicts_an_active_callers_counts() {
        let store = Store::memory(10);
        let counters = store.counters("p", "anonymous", minute(2), &[]);
        // Ten active callers, each at its limit.
        for key in 0..10 {
            for _ in 0..2 {
                assert_eq!(decide(&store, &counters, key, 1_000), Verdict::Admitted);
            }
        }
        // A flood of fresh keys finds the store full of active callers.
        for key in 100..1_100 {
            assert_eq!(decide(&store, &counters, key, 2_000), Verdict::Full);
        }
        assert_eq!(store.tracked(), 10);
        assert_eq!(store.evicted(), 0);
        // Every active caller still has its spent budget.
        for key in 0..10 {
            assert_eq!(decide(&store, &counters, key, 3_000), Verdict::Limited);
        }
        // Once their windows are empty they are idle, and new callers take their place.
        let later = 1_000 + 62_000;
        assert_eq!(decide(&store, &counters, 5_000, later), Verdict::Admitted);
        assert!(store.evicted() >= 1);
        assert!(store.tracked() <= 10);
    }

    #[test]
    fn the_sweep_drops_idle_callers_only() {
        let store = Store::memory(100);
        let counters = store.counters("p", "anonymous", minute(5), &[]);
        decide(&store, &counters, 1, 0);
        decide(&store, &counters, 2, 30_000);
        assert_eq!(store.sweep(&Now::sliding(61_500)), 1);
        assert_eq!(store.tracked(), 1);
        assert_eq!(store.sweep(&Now::sliding(100_000)), 1);
        assert_eq!(store.tracked(), 0);
    }
}
