//! One (policy, plan)'s callers: 64 shards, each a `parking_lot::Mutex` around two
//! `hashbrown::HashTable`s of (caller, [`Runs`]): the anonymous callers and keyed
//! buckets, which hold the store's `max_keys` slots and may be evicted, and the
//! registered consumers, whose space is reserved (they hold no slot and are never
//! evicted).

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use hashbrown::HashTable;
use parking_lot::Mutex;

use super::names::{Names, Refresh};
use crate::limit::{Now, Runs};
use crate::store::CallerKey;

pub(super) const SHARDS: usize = 64;
/// Callers looked at in one shard when room is needed for a new caller: the sample of
/// an approximated LRU (Redis samples 5), read from a random bucket on, so the cost
/// per new caller is bounded however full the table.
pub(super) const SAMPLE: usize = 8;

type Entry = (CallerKey, Runs);

/// One shard's callers, in two tables so that eviction never even looks at a
/// consumer.
#[derive(Debug, Default)]
pub(super) struct Shard {
    /// Anonymous callers and keyed buckets: each holds one of the `max_keys` slots.
    pub(super) callers: HashTable<Entry>,
    /// Registered consumers: reserved, never evicted.
    pub(super) consumers: HashTable<Entry>,
}

impl Shard {
    /// The counters of `key`, whose hash is `hash`, if it is tracked.
    pub(super) fn find_mut(&mut self, hash: u64, key: CallerKey) -> Option<&mut Runs> {
        if let Some((_, runs)) = self.callers.find_mut(hash, |(k, _)| *k == key) {
            return Some(runs);
        }
        if self.consumers.is_empty() {
            return None;
        }
        self.consumers
            .find_mut(hash, |(k, _)| *k == key)
            .map(|(_, runs)| runs)
    }
}

/// One (policy, plan)'s callers.
#[derive(Debug)]
pub struct Table {
    pub(super) shards: Box<[Mutex<Shard>]>,
    pub(super) hasher: foldhash::fast::RandomState,
    /// Slots taken across all tables of the store (shared with it): anonymous callers
    /// and keyed buckets, never above `max_keys`.
    pub(super) tracked: Arc<AtomicUsize>,
    /// Consumers tracked across all tables of the store (shared with it).
    pub(super) reserved: Arc<AtomicUsize>,
    /// Callers evicted to make room since start (shared with the store).
    evicted: Arc<AtomicU64>,
    max_keys: usize,
    /// A keyed policy's buckets by their parts, from its first keyed request on.
    names: OnceLock<Names>,
}

impl Table {
    pub(super) fn new(
        tracked: Arc<AtomicUsize>,
        reserved: Arc<AtomicUsize>,
        evicted: Arc<AtomicU64>,
        max_keys: usize,
    ) -> Table {
        Table {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: foldhash::fast::RandomState::default(),
            tracked,
            reserved,
            evicted,
            max_keys,
            names: OnceLock::new(),
        }
    }

    /// The table's keyed buckets by their parts, made on first use with `refresh`.
    pub(crate) fn names(&self, refresh: Refresh) -> &Names {
        self.names
            .get_or_init(|| Names::new(refresh, self.max_keys))
    }

    /// The table's keyed buckets by their parts, if it ever had any.
    pub(crate) fn known_names(&self) -> Option<&Names> {
        self.names.get()
    }

    /// Whether `key` is tracked here.
    fn holds(&self, key: CallerKey) -> bool {
        let hash = self.hasher.hash_one(key);
        let mut shard = self.shards[shard_of(hash)].lock();
        shard.find_mut(hash, key).is_some()
    }

    /// Adds `key`, whose hash is `hash` and which is not tracked yet, to `shard`: to
    /// the consumers if `consumer`, else to the callers (the caller has taken a slot).
    pub(super) fn insert<'a>(
        &self,
        shard: &'a mut Shard,
        hash: u64,
        key: CallerKey,
        runs: Runs,
        consumer: bool,
    ) -> &'a mut Runs {
        let table = if consumer {
            self.reserved.fetch_add(1, Ordering::Relaxed);
            &mut shard.consumers
        } else {
            &mut shard.callers
        };
        let entry = table.insert_unique(hash, (key, runs), |(k, _)| self.hasher.hash_one(k));
        &mut entry.into_mut().1
    }

    /// Forgets `key` (hash `hash`) in `shard`, giving back its slot; true if it was
    /// tracked.
    pub(super) fn remove(&self, shard: &mut Shard, hash: u64, key: CallerKey) -> bool {
        if let Ok(entry) = shard.callers.find_entry(hash, |(k, _)| *k == key) {
            entry.remove();
            self.tracked.fetch_sub(1, Ordering::Relaxed);
            return true;
        }
        if let Ok(entry) = shard.consumers.find_entry(hash, |(k, _)| *k == key) {
            entry.remove();
            self.reserved.fetch_sub(1, Ordering::Relaxed);
            return true;
        }
        false
    }

    /// Frees a slot by evicting one caller of `shard`: among [`SAMPLE`] callers read
    /// from the bucket that `random` picks on, an idle one (nothing counted any more)
    /// at once, else the least recently seen, whatever its usage. Consumers are not
    /// looked at. False only if the shard holds no caller.
    pub(super) fn evict_one(&self, shard: &mut Shard, now: &Now, random: u64) -> bool {
        match oldest(&mut shard.callers, now, random, SAMPLE).0 {
            Some((_, bucket, _)) => self.evict_bucket(shard, bucket),
            None => false,
        }
    }

    /// Frees a slot like [`Table::evict_one`], for a table whose callers are spread
    /// thin: the sample is gathered across shards (one locked at a time), from shard
    /// `first` on, until it holds [`SAMPLE`] callers or an idle one. False only if the
    /// table holds no caller.
    pub(super) fn evict_sampled(&self, first: usize, now: &Now, random: u64) -> bool {
        let mut best: Option<(u64, CallerKey, usize)> = None;
        let mut sampled = 0;
        for i in 0..SHARDS {
            // 17 is prime to SHARDS, so every shard is visited once.
            let index = (first + i * 17) % SHARDS;
            let mut shard = self.shards[index].lock();
            let random = random.rotate_left(i as u32);
            let (found, seen) = oldest(&mut shard.callers, now, random, SAMPLE - sampled);
            sampled += seen;
            match found {
                Some((0, bucket, _)) => return self.evict_bucket(&mut shard, bucket),
                Some((at, _, key)) if best.is_none_or(|(oldest, _, _)| at < oldest) => {
                    best = Some((at, key, index));
                }
                _ => {}
            }
            if sampled == SAMPLE {
                break;
            }
        }
        // The victim may have been seen again, or evicted by another new caller,
        // since its shard was let go: either way, another new caller's sample will
        // find the next one.
        best.is_some_and(|(_, key, index)| self.evict(index, key))
    }

    fn evict_bucket(&self, shard: &mut Shard, bucket: usize) -> bool {
        let entry = shard.callers.get_bucket_entry(bucket);
        entry
            .map(|entry| {
                entry.remove();
                self.note_evicted();
            })
            .is_ok()
    }

    /// Counts a caller evicted to make room: its slot is free again.
    fn note_evicted(&self) {
        self.tracked.fetch_sub(1, Ordering::Relaxed);
        self.evicted.fetch_add(1, Ordering::Relaxed);
    }

    /// Every caller (not consumer) of every shard with when it was last seen,
    /// dropping idle ones on the way; returns the idle ones dropped.
    pub(super) fn scan(&self, now: &Now, seen: &mut Vec<(u64, CallerKey, usize)>) -> usize {
        let mut idle = 0;
        for (index, shard) in self.shards.iter().enumerate() {
            let mut shard = shard.lock();
            let before = shard.callers.len();
            shard.callers.retain(|(_, runs)| !runs.prune_all(now));
            idle += before - shard.callers.len();
            for (key, runs) in shard.callers.iter() {
                seen.push((runs.last_seen_ms(now), *key, index));
            }
        }
        self.tracked.fetch_sub(idle, Ordering::Relaxed);
        self.evicted.fetch_add(idle as u64, Ordering::Relaxed);
        idle
    }

    /// Evicts caller `key` from shard `index`, if it is still there.
    pub(super) fn evict(&self, index: usize, key: CallerKey) -> bool {
        let hash = self.hasher.hash_one(key);
        let mut shard = self.shards[index].lock();
        let entry = shard.callers.find_entry(hash, |(k, _)| *k == key);
        entry
            .map(|entry| {
                entry.remove();
                self.note_evicted();
            })
            .is_ok()
    }

    /// Moves `key`'s counters, if tracked as a caller, to the consumers: it has become
    /// one, and gives its slot back.
    pub(super) fn reserve(&self, key: CallerKey) {
        let hash = self.hasher.hash_one(key);
        let mut shard = self.shards[shard_of(hash)].lock();
        if let Ok(entry) = shard.callers.find_entry(hash, |(k, _)| *k == key) {
            let ((_, runs), _) = entry.remove();
            self.tracked.fetch_sub(1, Ordering::Relaxed);
            self.insert(&mut shard, hash, key, runs, true);
        }
    }

    /// Moves `key`'s counters, if tracked as a consumer, to the callers: it is no
    /// longer one (its key is not accepted any more). Without a free slot its counters
    /// are dropped, counted as an eviction.
    pub(super) fn release(&self, key: CallerKey) {
        let hash = self.hasher.hash_one(key);
        let mut shard = self.shards[shard_of(hash)].lock();
        if let Ok(entry) = shard.consumers.find_entry(hash, |(k, _)| *k == key) {
            let ((_, runs), _) = entry.remove();
            self.reserved.fetch_sub(1, Ordering::Relaxed);
            if self.try_take_slot() {
                self.insert(&mut shard, hash, key, runs, false);
            } else {
                self.evicted.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    pub(super) fn try_take_slot(&self) -> bool {
        self.tracked
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.max_keys).then_some(n + 1)
            })
            .is_ok()
    }

    /// Drops callers and consumers whose windows are all empty; returns how many.
    pub(super) fn sweep(&self, now: &Now) -> usize {
        let (mut callers, mut consumers) = (0, 0);
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            let before = (shard.callers.len(), shard.consumers.len());
            shard.callers.retain(|(_, runs)| !runs.prune_all(now));
            shard.consumers.retain(|(_, runs)| !runs.prune_all(now));
            callers += before.0 - shard.callers.len();
            consumers += before.1 - shard.consumers.len();
        }
        self.tracked.fetch_sub(callers, Ordering::Relaxed);
        self.reserved.fetch_sub(consumers, Ordering::Relaxed);
        if let Some(names) = self.names.get() {
            names.sweep(now.ms, |key| self.holds(key));
        }
        callers + consumers
    }

    /// Calls `f` with every caller and consumer and its counters, one shard locked at
    /// a time.
    pub(super) fn for_each_caller(&self, mut f: impl FnMut(CallerKey, &Runs)) {
        for shard in self.shards.iter() {
            let shard = shard.lock();
            for (key, runs) in shard.callers.iter().chain(shard.consumers.iter()) {
                f(*key, runs);
            }
        }
    }

    /// The keys of shard `index`'s callers and consumers after `after` (all with
    /// `None`), unordered: copied under the shard's lock, which is held for nothing
    /// else.
    pub(super) fn keys_after(&self, index: usize, after: Option<CallerKey>) -> Vec<CallerKey> {
        let shard = self.shards[index].lock();
        let all = shard.callers.iter().chain(shard.consumers.iter());
        match after {
            Some(after) => all
                .map(|(key, _)| *key)
                .filter(|key| *key > after)
                .collect(),
            None => all.map(|(key, _)| *key).collect(),
        }
    }

    /// The counters of one caller, pruned at `now` (for usage reports and tests).
    pub fn snapshot(&self, caller: CallerKey, now: &Now) -> Option<Runs> {
        let hash = self.hasher.hash_one(caller);
        let mut shard = self.shards[shard_of(hash)].lock();
        shard.find_mut(hash, caller).map(|runs| {
            runs.prune_all(now);
            runs.clone()
        })
    }
}

/// The least recently seen of up to `want` callers read from the bucket `random` picks
/// on, as (last seen, bucket, key), stopping early at an idle one (last seen 0, its
/// expired counts pruned); and how many callers were read.
fn oldest(
    callers: &mut HashTable<Entry>,
    now: &Now,
    random: u64,
    want: usize,
) -> (Option<(u64, usize, CallerKey)>, usize) {
    let mut found: Option<(u64, usize, CallerKey)> = None;
    let mut read = 0;
    // A power of two, and 0 only for a table that never held anything.
    let buckets = callers.num_buckets();
    if callers.is_empty() || want == 0 {
        return (None, 0);
    }
    for step in 0..buckets {
        let bucket = (random as usize).wrapping_add(step) & (buckets - 1);
        let Some((key, runs)) = callers.get_bucket_mut(bucket) else {
            continue;
        };
        read += 1;
        if runs.prune_all(now) {
            return (Some((0, bucket, *key)), read);
        }
        // An entry that counts a request was seen after the epoch: never 0.
        let seen = runs.last_seen_ms(now).max(1);
        if found.is_none_or(|(oldest, _, _)| seen < oldest) {
            found = Some((seen, bucket, *key));
        }
        if read == want {
            break;
        }
    }
    (found, read)
}

/// The shard of a hash: middle bits, because hashbrown uses the low bits for the
/// bucket and the top seven for its control bytes.
pub(super) fn shard_of(hash: u64) -> usize {
    (hash >> 32) as usize % SHARDS
}
