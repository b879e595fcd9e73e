//! The memory engine: callers' [`Runs`] in sharded tables, in this process.
//!
//! Each (policy, plan) has a [`Table`] of 64 shards; a request locks one shard for the
//! few hundred nanoseconds its decision takes, so there is no global lock. A policy's
//! `total` is one mutex-protected counter, taken after the caller's shard (always in
//! that order, so no deadlock), only when the caller's own windows admit.
//!
//! The number of tracked callers is bounded by `max_keys` across all tables. When the
//! store is full, a new caller evicts one: an idle caller (all windows empty) first,
//! else the least recently seen of the cold callers (under half of every limit),
//! never a caller near a limit and never a banned one. The choice is sampled, in the
//! manner of Redis's approximated LRU: a few entries of the caller's shard, then of a
//! few more shards; only if those hold no candidate is every caller scanned, at most
//! once a second, evicting the oldest cold callers in a batch. A new caller is refused
//! ([`Verdict::Full`]) only when that scan found every tracked caller near a limit or
//! banned: a spray of fresh keys cannot lock newcomers out, and cannot reset the
//! budget of a caller near its limit (docs/limits.md has the argument).
//!
//! The engine also keeps its state file ([`state`]): the counters are written every
//! few seconds and at shutdown, and read back at start, so a restart keeps quotas.

mod state;
mod table;

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;

use super::{BanTable, CallerKey, Scope, Verdict};
use crate::limit::{Now, Quota, Report, Runs};

pub use state::SAVE_EVERY;
pub use table::Table;
use table::{SAMPLE, SHARDS, shard_of};

/// How long a scan that found no caller to evict holds for.
const FULL_RETRY_MS: u64 = 1_000;
/// More shards of the caller's table sampled before a full scan.
const SAMPLE_SHARDS: usize = 4;

/// Counter of one policy's `total`.
type TotalCounter = Arc<Mutex<Runs>>;

/// Where one (policy, plan)'s counters live in this engine: its handle in a
/// [`Scope`](super::Scope).
#[derive(Debug, Clone)]
pub(crate) struct Bound {
    table: Arc<Table>,
    /// The policy's total counter, when the policy has a `total`.
    total: Option<TotalCounter>,
}

#[derive(Debug)]
pub struct MemoryStore {
    /// Tables by (policy, plan); touched only when a config is compiled.
    tables: Mutex<HashMap<(String, String), Arc<Table>>>,
    totals: Mutex<HashMap<String, TotalCounter>>,
    /// Each policy's refund epoch (see `memo`), by policy name.
    refunds: Mutex<HashMap<String, Arc<AtomicU32>>>,
    /// Callers tracked across all tables, never above `max_keys`.
    tracked: Arc<AtomicUsize>,
    max_keys: usize,
    /// Callers evicted to make room since start.
    evicted: Arc<AtomicU64>,
    /// While full of active callers: no new search for idle ones before this instant.
    full_until_ms: AtomicU64,
    /// Where the counters are kept across restarts, if anywhere.
    state_file: Option<PathBuf>,
    /// Held while the state file is written, so two saves never interleave.
    saving: Mutex<()>,
    /// Banned callers (and refusal counts toward bans); saved in the state file.
    pub bans: BanTable,
}

/// Ban table entries at most until a config says otherwise.
const DEFAULT_MAX_BANS: usize = 100_000;

impl MemoryStore {
    pub fn new(max_keys: usize, state_file: Option<PathBuf>) -> MemoryStore {
        MemoryStore {
            tables: Mutex::new(HashMap::new()),
            totals: Mutex::new(HashMap::new()),
            refunds: Mutex::new(HashMap::new()),
            tracked: Arc::new(AtomicUsize::new(0)),
            max_keys,
            evicted: Arc::new(AtomicU64::new(0)),
            full_until_ms: AtomicU64::new(0),
            state_file,
            saving: Mutex::new(()),
            bans: BanTable::new(DEFAULT_MAX_BANS),
        }
    }

    /// The counters of (policy, plan), created on first use and kept across reloads;
    /// `quotas` are the plan's, as the new config has them.
    pub(crate) fn bind(&self, policy: &str, plan: &str, quotas: &[Quota], total: bool) -> Bound {
        let table = self.table(policy, plan);
        table.set_quotas(quotas);
        Bound {
            table,
            total: total.then(|| self.total(policy)),
        }
    }

    fn table(&self, policy: &str, plan: &str) -> Arc<Table> {
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

    fn total(&self, policy: &str) -> TotalCounter {
        self.totals
            .lock()
            .entry(policy.to_string())
            .or_default()
            .clone()
    }

    /// The refund epoch of `policy`, shared by the memos of its plans.
    pub(crate) fn refunds(&self, policy: &str) -> Arc<AtomicU32> {
        self.refunds
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

    /// Frees a slot for a new caller of `table` whose hash is `hash`: samples a few
    /// more shards of the table, then (at most once a [`FULL_RETRY_MS`]) scans every
    /// table, dropping idle callers and, if there were none, the least recently seen
    /// cold ones in a batch. False if nobody may be evicted.
    fn make_room(&self, table: &Table, hash: u64, now: &Now) -> bool {
        let home = shard_of(hash);
        for i in 1..=SAMPLE_SHARDS {
            let index = (home + i * 17) % SHARDS;
            let mut shard = table.shards[index].lock();
            if table.evict_one(&mut shard, now, SAMPLE, &self.bans) {
                return true;
            }
        }
        if now.ms < self.full_until_ms.load(Ordering::Relaxed) {
            return false;
        }
        let tables: Vec<_> = self.tables.lock().values().cloned().collect();
        let mut cold = Vec::new();
        let mut freed = 0;
        for (index, table) in tables.iter().enumerate() {
            let mut found = Vec::new();
            freed += table.scan(now, &self.bans, &mut found);
            cold.extend(
                found
                    .into_iter()
                    .map(|(seen, key, shard)| (seen, key, index, shard)),
            );
        }
        if freed == 0 {
            // A batch, so that the next new callers need no scan of their own.
            let batch = (self.max_keys / 1_000).clamp(1, 1_000);
            cold.sort_unstable();
            for (_, key, table, shard) in cold.into_iter().take(batch) {
                freed += usize::from(tables[table].evict(shard, key));
            }
        }
        if freed == 0 {
            self.full_until_ms
                .store(now.ms + FULL_RETRY_MS, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Decides `cost` requests of `caller` at `now` under `scope`, whose counters
    /// here are `bound`, all or nothing.
    pub(crate) fn decide(
        &self,
        scope: &Scope,
        bound: &Bound,
        caller: CallerKey,
        now: &Now,
        cost: u32,
        report: &mut Report,
    ) -> Verdict {
        report.at_ms = now.ms;
        let table = &bound.table;
        let hash = table.hasher.hash_one(caller);
        let mut shard = table.shards[shard_of(hash)].lock();
        let known = shard
            .find_mut(hash, |(key, _)| *key == caller)
            .map(|(_, runs)| count(scope, bound, runs, now, cost, report));
        let (verdict, idle) = match known {
            Some(decided) => decided,
            None => {
                let room = table.try_take_slot()
                    || (table.evict_one(&mut shard, now, SAMPLE, &self.bans)
                        && table.try_take_slot());
                if !room {
                    // Nobody to evict in this shard: look further, without holding
                    // this shard's lock, then try once more.
                    drop(shard);
                    if !self.make_room(table, hash, now) {
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
                count(scope, bound, runs, now, cost, report)
            }
        };
        if verdict == Verdict::Limited
            && idle
            && let Ok(entry) = shard.find_entry(hash, |(key, _)| *key == caller)
        {
            entry.remove();
            table.tracked.fetch_sub(1, Ordering::Relaxed);
        }
        verdict
    }

    /// Takes back `cost` requests of `caller` counted at `at` under `scope`.
    pub(crate) fn refund(
        &self,
        scope: &Scope,
        bound: &Bound,
        caller: CallerKey,
        at: &Now,
        cost: u32,
    ) {
        let table = &bound.table;
        let hash = table.hasher.hash_one(caller);
        let mut shard = table.shards[shard_of(hash)].lock();
        if let Some((_, runs)) = shard.find_mut(hash, |(key, _)| *key == caller) {
            runs.refund(&scope.quotas, at, cost);
        }
        if let Some(total) = &bound.total {
            total.lock().refund(&scope.total, at, cost);
        }
    }

    /// The caller's state under `scope` at `now`, without counting anything.
    pub(crate) fn peek(
        &self,
        scope: &Scope,
        bound: &Bound,
        caller: CallerKey,
        now: &Now,
        report: &mut Report,
    ) {
        report.at_ms = now.ms;
        let mut runs = bound.table.snapshot(caller, now).unwrap_or_default();
        runs.check(&scope.quotas, now, 0, false, report);
    }

    /// Forgets everything counted for `caller` in `bound`; true if it was tracked.
    pub(crate) fn reset(&self, bound: &Bound, caller: CallerKey) -> bool {
        let table = &bound.table;
        let hash = table.hasher.hash_one(caller);
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

    /// The state file, if the store keeps one.
    pub fn state_file(&self) -> Option<&Path> {
        self.state_file.as_deref()
    }

    /// Reads the state file back, if there is one; a bad file is logged and ignored.
    pub fn restore_state(&self, now_ms: u64) {
        let Some(path) = &self.state_file else {
            return;
        };
        match state::restore(self, path, now_ms) {
            Ok(Some(restored)) => tracing::info!(
                file = %path.display(),
                callers = restored.callers,
                totals = restored.totals,
                dropped = restored.dropped,
                bans = restored.bans,
                saved_at_ms = restored.saved_at_ms,
                "counters restored from the state file"
            ),
            Ok(None) => {
                tracing::info!(file = %path.display(), "no state file yet; counters start empty")
            }
            Err(err) => tracing::error!("{err}; counters start empty"),
        }
    }

    /// Writes the state file now, if there is one; a failure is logged.
    pub fn save_state(&self, now_ms: u64) {
        let Some(path) = &self.state_file else {
            return;
        };
        if let Err(err) = state::save(self, path, now_ms) {
            tracing::error!(file = %path.display(), error = %err, "cannot write the state file");
        }
    }

    /// Calls `f` with every table's (policy, plan) and the table.
    fn for_each_table(&self, mut f: impl FnMut(&str, &str, &Table)) {
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
    fn for_each_total(&self, mut f: impl FnMut(&str, &Runs)) {
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
    fn restore(&self, policy: &str, plan: &str, caller: CallerKey, runs: Runs) -> bool {
        let table = self.table(policy, plan);
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
    fn restore_total(&self, policy: &str, runs: Runs) {
        *self.total(policy).lock() = runs;
    }
}

/// Decides one request against a caller's counters (and its policy's total), all or
/// nothing: counts it everywhere if every window has room, nowhere otherwise. Also
/// says whether the caller's counters are now empty.
fn count(
    scope: &Scope,
    bound: &Bound,
    runs: &mut Runs,
    now: &Now,
    cost: u32,
    report: &mut Report,
) -> (Verdict, bool) {
    let mut admit = runs.check(&scope.quotas, now, cost, false, report);
    if admit && let Some(total) = &bound.total {
        let mut total = total.lock();
        admit = total.check(&scope.total, now, cost, true, report);
        if admit {
            total.commit(&scope.total, now, cost);
        }
    }
    if admit {
        runs.commit(&scope.quotas, now, cost);
        return (Verdict::Admitted, false);
    }
    (Verdict::Limited, runs.is_empty())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::limit::{Quota, Window, quota};
    use crate::store::{Handle, Store};

    fn minute(limit: u32) -> Vec<Quota> {
        vec![quota(Window::Minute, limit)]
    }

    /// A memory store, and the same store behind the contract.
    pub(crate) fn memory_store(max_keys: usize) -> (Arc<MemoryStore>, Store) {
        let memory = Arc::new(MemoryStore::new(max_keys, None));
        (memory.clone(), Store::Memory(memory))
    }

    /// Decides one request in the memory engine itself, without the memo in front.
    pub(crate) fn decide(store: &MemoryStore, scope: &Scope, key: u64, ms: u64) -> Verdict {
        let Handle::Memory(bound) = &scope.handle else {
            panic!("a scope of another engine");
        };
        store.decide(
            scope,
            bound,
            key,
            &Now::sliding(ms),
            1,
            &mut Report::default(),
        )
    }

    #[test]
    fn a_flood_of_new_callers_never_evicts_an_active_callers_counts() {
        let (memory, store) = memory_store(10);
        let counters = store.scope("p", "anonymous", minute(2), &[]);
        // Ten active callers, each at its limit.
        for key in 0..10 {
            for _ in 0..2 {
                assert_eq!(decide(&memory, &counters, key, 1_000), Verdict::Admitted);
            }
        }
        // A flood of fresh keys finds the store full of active callers.
        for key in 100..1_100 {
            assert_eq!(decide(&memory, &counters, key, 2_000), Verdict::Full);
        }
        assert_eq!(store.tracked(), 10);
        assert_eq!(store.evicted(), 0);
        // Every active caller still has its spent budget.
        for key in 0..10 {
            assert_eq!(decide(&memory, &counters, key, 3_000), Verdict::Limited);
        }
        // Once their windows are empty they are idle, and new callers take their place.
        let later = 1_000 + 62_000;
        assert_eq!(decide(&memory, &counters, 5_000, later), Verdict::Admitted);
        assert!(store.evicted() >= 1);
        assert!(store.tracked() <= 10);
    }

    #[test]
    fn the_sweep_drops_idle_callers_only() {
        let (memory, store) = memory_store(100);
        let counters = store.scope("p", "anonymous", minute(5), &[]);
        decide(&memory, &counters, 1, 0);
        decide(&memory, &counters, 2, 30_000);
        assert_eq!(memory.sweep(&Now::sliding(61_500)), 1);
        assert_eq!(store.tracked(), 1);
        assert_eq!(memory.sweep(&Now::sliding(100_000)), 1);
        assert_eq!(store.tracked(), 0);
    }
}
