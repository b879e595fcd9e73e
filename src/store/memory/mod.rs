//! The memory engine: callers' [`Runs`] in sharded tables, in this process.
//!
//! Each (policy, plan) has a [`Table`] of 64 shards; a request locks one shard for the
//! few hundred nanoseconds its decision takes, so there is no global lock. A policy's
//! `total` is one mutex-protected counter, taken after the caller's shard (always in
//! that order, so no deadlock), only when the caller's own windows admit.
//!
//! Memory is bounded. Registered consumers are a bounded set, named by the config
//! (each config snapshot hands the store their keys, [`MemoryStore::reserve`]): their
//! counters sit apart in each shard, hold no slot and are never evicted. Anonymous
//! callers and keyed buckets share `max_keys` slots across all tables. When those are
//! all taken, a new caller evicts one: an idle caller (all windows empty) first, else
//! the least recently seen, whatever its usage. The choice is sampled, in the manner
//! of Redis's approximated LRU: the least recently seen of eight callers read from a
//! random bucket of the caller's shard, or across the table's shards when that one
//! holds fewer. Only if the table holds no caller at all (other tables hold the slots)
//! is every caller scanned, evicting the least recently seen in a batch so the next
//! new callers need no scan of their own. A new caller is never refused because the
//! table is full: if a racing new caller takes the slot just freed, the request is
//! decided against fresh counters that are not kept, which is what evicting it at
//! once would give. Bans live in their own table, bounded by `max_bans`: evicting a
//! banned caller's counters leaves its ban in force. docs/limits.md has the security
//! argument.
//!
//! The engine also keeps its state file (`state`): the counters are written every
//! few seconds and at shutdown, and read back at start, so a restart keeps quotas.

mod give_back;
pub(crate) mod listing;
pub(crate) mod names;
mod stacked;
mod state;
mod table;

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

use arc_swap::ArcSwap;
use parking_lot::Mutex;

use super::{BanTable, CallerKey, Scope, Verdict};
use crate::limit::{Now, Report, Runs};

pub use state::SAVE_EVERY;
pub use table::Table;
use table::{SAMPLE, Shard, shard_of};

/// A shard of a table, locked.
type ShardGuard<'t> = parking_lot::MutexGuard<'t, Shard>;

/// Counter of one policy's `total`.
type TotalCounter = Arc<Mutex<Runs>>;

/// The keys of the registered consumers.
type Consumers = HashSet<CallerKey, foldhash::fast::RandomState>;

/// Where one (policy, plan)'s counters live in this engine: its handle in a
/// [`Scope`](super::Scope).
#[derive(Debug, Clone)]
pub(crate) struct Bound {
    table: Arc<Table>,
    /// The policy's total counter, when the policy has a `total`.
    total: Option<TotalCounter>,
}

/// The memory engine: every (policy, plan)'s table of callers in this process.
#[derive(Debug)]
pub struct MemoryStore {
    /// Tables by (policy, plan); touched only when a config is compiled.
    tables: Mutex<HashMap<(String, String), Arc<Table>>>,
    totals: Mutex<HashMap<String, TotalCounter>>,
    /// Each policy's refund epoch (see `memo`), by policy name.
    refunds: Mutex<HashMap<String, Arc<AtomicU32>>>,
    /// Anonymous callers and keyed buckets tracked across all tables, never above
    /// `max_keys`.
    tracked: Arc<AtomicUsize>,
    /// Consumers tracked across all tables: outside `max_keys`, never evicted.
    reserved: Arc<AtomicUsize>,
    max_keys: usize,
    /// Callers evicted to make room since start.
    evicted: Arc<AtomicU64>,
    /// The keys of the registered consumers, as the newest config names them.
    consumers: ArcSwap<Consumers>,
    /// Held while the consumers change, so two reloads never interleave their moves.
    reserving: Mutex<()>,
    /// Where the counters are kept across restarts, if anywhere.
    state_file: Option<PathBuf>,
    /// Held while the state file is written, so two saves never interleave.
    saving: Mutex<()>,
    /// Banned callers (and refusal counts toward bans); saved in the state file.
    /// Apart from the counters: evicting a banned caller's counters keeps its ban.
    pub bans: BanTable,
}

/// Ban table entries at most until a config says otherwise.
const DEFAULT_MAX_BANS: usize = 100_000;

impl Bound {
    /// The table's keyed buckets by their parts, made on first use with `refresh`.
    pub(crate) fn names(&self, refresh: names::Refresh) -> &names::Names {
        self.table.names(refresh)
    }

    /// The table's keyed buckets by their parts, if it ever had any.
    pub(crate) fn known_names(&self) -> Option<&names::Names> {
        self.table.known_names()
    }
}

impl MemoryStore {
    /// An empty store tracking at most `max_keys` anonymous callers and keyed buckets,
    /// writing its counters and bans to `state_file` if given.
    pub fn new(max_keys: usize, state_file: Option<PathBuf>) -> MemoryStore {
        MemoryStore {
            tables: Mutex::new(HashMap::new()),
            totals: Mutex::new(HashMap::new()),
            refunds: Mutex::new(HashMap::new()),
            tracked: Arc::new(AtomicUsize::new(0)),
            reserved: Arc::new(AtomicUsize::new(0)),
            max_keys,
            evicted: Arc::new(AtomicU64::new(0)),
            consumers: ArcSwap::default(),
            reserving: Mutex::new(()),
            state_file,
            saving: Mutex::new(()),
            bans: BanTable::new(DEFAULT_MAX_BANS),
        }
    }

    /// The counters of (policy, plan), created on first use and kept across reloads.
    pub(crate) fn bind(&self, policy: &str, plan: &str, total: bool) -> Bound {
        Bound {
            table: self.table(policy, plan),
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
                    self.reserved.clone(),
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

    /// Makes `keys` the registered consumers' (each config snapshot does, with its
    /// consumers): their counters are kept apart from `max_keys` and never evicted.
    /// Counters already tracked move: a new consumer's give their slot back; a former
    /// consumer's take one, or are dropped if none is free (its key is no longer
    /// accepted, so only the decision API could still count against them).
    pub fn reserve(&self, keys: impl IntoIterator<Item = CallerKey>) {
        let _one = self.reserving.lock();
        let new: Arc<Consumers> = Arc::new(keys.into_iter().collect());
        let old = self.consumers.swap(new.clone());
        if old == new {
            return;
        }
        // The new set is in place before any move, and a new caller is placed by the
        // set under its shard's lock, so each move below sees every counter placed by
        // the old set.
        let tables: Vec<_> = self.tables.lock().values().cloned().collect();
        for table in &tables {
            new.difference(&old).for_each(|&key| table.reserve(key));
            old.difference(&new).for_each(|&key| table.release(key));
        }
    }

    fn is_consumer(&self, key: CallerKey) -> bool {
        self.consumers.load().contains(&key)
    }

    /// Callers and consumers tracked.
    pub fn tracked(&self) -> usize {
        self.tracked.load(Ordering::Relaxed) + self.reserved.load(Ordering::Relaxed)
    }

    /// Callers evicted to make room since start.
    pub fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    /// Drops callers whose windows are all empty; returns how many went.
    pub fn sweep(&self, now: &Now) -> usize {
        let tables: Vec<_> = self.tables.lock().values().cloned().collect();
        tables.iter().map(|t| t.sweep(now)).sum()
    }

    /// Frees a slot for a new caller of `table` whose hash is `hash`, when its own
    /// shard holds too few callers for a sample: a sample gathered across the
    /// table's shards, else (no caller in the table: other tables hold the slots) a
    /// scan of every table, dropping idle callers and, if there were none, the least
    /// recently seen ones in a batch. False if nobody was evicted (the slots are all
    /// held by callers being added right now).
    fn make_room(&self, table: &Table, hash: u64, now: &Now) -> bool {
        if table.evict_sampled(shard_of(hash), now, sample_start(hash)) {
            return true;
        }
        let tables: Vec<_> = self.tables.lock().values().cloned().collect();
        let mut seen = Vec::new();
        let mut freed = 0;
        for (index, table) in tables.iter().enumerate() {
            let mut found = Vec::new();
            freed += table.scan(now, &mut found);
            seen.extend(
                found
                    .into_iter()
                    .map(|(seen, key, shard)| (seen, key, index, shard)),
            );
        }
        if freed == 0 {
            // A batch, so that the next new callers need no scan of their own.
            let batch = (self.max_keys / 1_000).clamp(1, 1_000).min(seen.len());
            if batch < seen.len() {
                seen.select_nth_unstable(batch);
            }
            for &(_, key, table, shard) in &seen[..batch] {
                freed += usize::from(tables[table].evict(shard, key));
            }
        }
        freed > 0
    }

    /// Room for `caller`, new to `table` (its shard, `shard`, does not hold it): a
    /// `consumer`'s reserved place, a free slot, or one freed by evicting an idle or
    /// the least recently seen caller. Returns the shard locked again (it may have
    /// been let go to look further), or None when the slot freed went to another new
    /// caller.
    fn room_for<'t>(
        &self,
        table: &'t Table,
        mut shard: ShardGuard<'t>,
        new: Newcomer,
        now: &Now,
    ) -> Option<ShardGuard<'t>> {
        let Newcomer {
            hash,
            caller,
            consumer,
        } = new;
        let room = consumer
            || table.try_take_slot()
            || (shard.callers.len() >= SAMPLE
                && table.evict_one(&mut shard, now, sample_start(hash))
                && table.try_take_slot());
        if !room {
            // Too few callers in this shard for a sample: look further, without
            // holding this shard's lock, then try once more.
            drop(shard);
            let room = self.make_room(table, hash, now);
            shard = table.shards[shard_of(hash)].lock();
            if shard.find_mut(hash, caller).is_none() && !(room && table.try_take_slot()) {
                return None;
            }
        }
        Some(shard)
    }

    /// Decides `cost` requests of `caller` at `now` under `scope`, whose counters
    /// here are `bound`, all or nothing. A new caller always finds room
    /// (an idle or the least recently seen one is evicted).
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
        let (verdict, idle) = match shard.find_mut(hash, caller) {
            Some(runs) => count(scope, bound, runs, now, cost, report),
            None => {
                let new = Newcomer {
                    hash,
                    caller,
                    consumer: self.is_consumer(caller),
                };
                let Some(locked) = self.room_for(table, shard, new, now) else {
                    // The slot went to another new caller: decide on fresh
                    // counters, as if this caller were evicted at once.
                    return count(scope, bound, &mut Runs::default(), now, cost, report).0;
                };
                shard = locked;
                let runs = find_or_insert(table, &mut shard, new);
                count(scope, bound, runs, now, cost, report)
            }
        };
        if verdict == Verdict::Limited && idle {
            table.remove(&mut shard, hash, caller);
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
        if let Some(runs) = shard.find_mut(hash, caller) {
            runs.refund(&scope.quotas, at, cost);
        }
        if let Some(total) = &bound.total {
            total.lock().refund(&scope.total, at, cost);
        }
    }

    /// Counts `cost` more of `caller` at `now` whether or not it fits (a cost known
    /// after the response: the caller may go into debt). An exact window holds at
    /// most 255 entries, so its debt is held up to that. A caller evicted since its
    /// admission (its response took long, and newcomers churned the table) is
    /// tracked again for the charge, as a returning caller would be: the bill for
    /// work already done is not dropped with its counters.
    pub(crate) fn charge(
        &self,
        scope: &Scope,
        bound: &Bound,
        caller: CallerKey,
        now: &Now,
        cost: u32,
    ) {
        let table = &bound.table;
        let hash = table.hasher.hash_one(caller);
        let mut report = Report::default();
        let settle = |runs: &mut Runs, report: &mut Report| {
            runs.check(&scope.quotas, now, cost, false, report);
            runs.commit(&scope.quotas, now, cost);
        };
        // The shard is let go before the total is taken.
        {
            let mut shard = table.shards[shard_of(hash)].lock();
            if let Some(runs) = shard.find_mut(hash, caller) {
                settle(runs, &mut report);
            } else {
                let new = Newcomer {
                    hash,
                    caller,
                    consumer: self.is_consumer(caller),
                };
                if let Some(mut shard) = self.room_for(table, shard, new, now) {
                    settle(find_or_insert(table, &mut shard, new), &mut report);
                }
            }
        }
        if let Some(total) = &bound.total {
            let mut total = total.lock();
            total.check(&scope.total, now, cost, true, &mut report);
            total.commit(&scope.total, now, cost);
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

    /// Takes up to `amount` off `caller`'s counts in its billing periods holding `now`.
    pub(crate) fn credit(
        &self,
        scope: &Scope,
        bound: &Bound,
        caller: CallerKey,
        now: &Now,
        amount: u32,
    ) {
        let periods: Vec<_> = (scope.quotas.iter())
            .filter(|q| q.window.is_period())
            .copied()
            .collect();
        let table = &bound.table;
        let hash = table.hasher.hash_one(caller);
        let mut shard = table.shards[shard_of(hash)].lock();
        if let Some(runs) = shard.find_mut(hash, caller) {
            runs.refund(&periods, now, amount);
        }
    }

    /// Forgets everything counted for `caller` in `bound`; true if it was tracked.
    pub(crate) fn reset(&self, bound: &Bound, caller: CallerKey) -> bool {
        let table = &bound.table;
        let hash = table.hasher.hash_one(caller);
        let mut shard = table.shards[shard_of(hash)].lock();
        table.remove(&mut shard, hash, caller)
    }
}

/// `caller`'s counters in `shard`, added (fresh) after `room_for` made room, unless
/// a request that raced this one while the lock was let go added them first.
fn find_or_insert<'s>(table: &Table, shard: &'s mut Shard, new: Newcomer) -> &'s mut Runs {
    let Newcomer {
        hash,
        caller,
        consumer,
    } = new;
    if shard.find_mut(hash, caller).is_none() {
        return table.insert(shard, hash, caller, Runs::default(), consumer);
    }
    shard.find_mut(hash, caller).expect("found just now")
}

/// A caller its table does not hold yet, as `room_for` and `find_or_insert` place it.
#[derive(Debug, Clone, Copy)]
struct Newcomer {
    /// The caller's hash under the table's hasher.
    hash: u64,
    caller: CallerKey,
    /// A configured consumer: its place is reserved, it takes no `max_keys` slot.
    consumer: bool,
}

/// Where the eviction sample for a new caller of hash `hash` starts: bits of the hash
/// that pick neither the shard nor the caller's own bucket, so the sample is random to
/// anyone who does not know the table's hash seed.
fn sample_start(hash: u64) -> u64 {
    hash.rotate_right(40)
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
pub(crate) mod tests;
