//! A stacked decision in memory: several policies' counters, all or nothing.
//!
//! A route of several policies (`policy = ["org", "per_key"]`) decides one request
//! against each policy's table under its own key. The decision is one check-then-
//! commit under every lock it needs: the callers' shards, taken in address order
//! (two stacked decisions never wait on each other in a cycle), then the totals in
//! address order (after the shards, as a single decision takes them). Nothing is
//! counted unless every enforcing policy admits; a policy in shadow mode that would
//! refuse is charged nothing and refuses nothing.
//!
//! A caller new to a table is given its place first, one table at a time, as a
//! single decision would (an idle or the least recently seen caller may be evicted);
//! if the request is then refused, the places taken for it that hold nothing are
//! given back, so a refused newcomer leaves no trace.

use std::hash::BuildHasher;
use std::sync::Arc;

use parking_lot::MutexGuard;

use super::table::shard_of;
use super::{Bound, MemoryStore, Newcomer, ShardGuard, find_or_insert};
use crate::limit::{Report, Runs};
use crate::store::{Stacked, Verdict};

impl MemoryStore {
    /// Decides `cost` requests against every part of `parts` (each with the counters
    /// `bounds` holds for it), all or nothing, filling one report per part.
    pub(crate) fn decide_stacked(
        &self,
        parts: &[Stacked<'_>],
        bounds: &[&Bound],
        cost: u32,
        reports: &mut [Report],
    ) -> Verdict {
        let hashes: Vec<u64> = (parts.iter().zip(bounds))
            .map(|(part, bound)| bound.table.hasher.hash_one(part.caller))
            .collect();
        let placed = self.place(parts, bounds, &hashes);
        let mut locked = Locked::take(bounds, &hashes);
        let admits = locked.check(parts, &hashes, cost, reports);
        let admitted = (admits.iter().zip(parts)).all(|(&admit, part)| admit || part.shadow);
        if admitted && cost > 0 {
            locked.commit(parts, &hashes, &admits, cost);
        }
        if !admitted {
            locked.give_back(parts, bounds, &hashes, &placed);
        }
        match admitted {
            true => Verdict::Admitted,
            false => Verdict::Limited,
        }
    }

    /// Gives every part's caller its place in its table, one lock at a time (finding
    /// room may let a lock go): which parts' callers were new there.
    fn place(&self, parts: &[Stacked<'_>], bounds: &[&Bound], hashes: &[u64]) -> Vec<bool> {
        let mut placed = vec![false; parts.len()];
        for (i, (part, bound)) in parts.iter().zip(bounds).enumerate() {
            let table = &bound.table;
            let shard = table.shards[shard_of(hashes[i])].lock();
            let mut shard = shard;
            if shard.find_mut(hashes[i], part.caller).is_some() {
                continue;
            }
            let new = Newcomer {
                hash: hashes[i],
                caller: part.caller,
                consumer: self.is_consumer(part.caller),
            };
            if let Some(mut locked) = self.room_for(table, shard, new, &part.now) {
                find_or_insert(table, &mut locked, new);
                placed[i] = true;
            }
        }
        placed
    }
}

/// Every lock a stacked decision holds, by part: a part whose shard (or total) is
/// another part's holds none of its own.
struct Locked<'a> {
    /// Dropped first: the totals were taken last.
    totals: Vec<Option<MutexGuard<'a, Runs>>>,
    shards: Vec<Option<ShardGuard<'a>>>,
}

impl<'a> Locked<'a> {
    /// Every shard, in address order; then every total, in address order.
    fn take(bounds: &[&'a Bound], hashes: &[u64]) -> Locked<'a> {
        let mut order: Vec<usize> = (0..bounds.len()).collect();
        let shard_at = |i: usize| &bounds[i].table.shards[shard_of(hashes[i])];
        order.sort_by_key(|&i| std::ptr::from_ref(shard_at(i)) as usize);
        order.dedup_by_key(|i| std::ptr::from_ref(shard_at(*i)) as usize);
        let mut shards: Vec<Option<ShardGuard<'a>>> = (0..bounds.len()).map(|_| None).collect();
        for &i in &order {
            shards[i] = Some(shard_at(i).lock());
        }
        let mut totals: Vec<usize> = (0..bounds.len())
            .filter(|&i| bounds[i].total.is_some())
            .collect();
        let total_at = |i: usize| {
            bounds[i]
                .total
                .as_ref()
                .map_or(0, |t| Arc::as_ptr(t) as usize)
        };
        totals.sort_by_key(|&i| total_at(i));
        let mut total_guards: Vec<Option<MutexGuard<'a, Runs>>> =
            (0..bounds.len()).map(|_| None).collect();
        for &i in &totals {
            total_guards[i] = bounds[i].total.as_ref().map(|t| t.lock());
        }
        Locked {
            totals: total_guards,
            shards,
        }
    }

    /// Checks every part, filling its report: whether each admits. A caller that
    /// lost its place (a racing newcomer took the slot) is decided on fresh counters
    /// that are not kept.
    fn check(
        &mut self,
        parts: &[Stacked<'_>],
        hashes: &[u64],
        cost: u32,
        reports: &mut [Report],
    ) -> Vec<bool> {
        let mut fresh: Vec<Runs> = vec![Runs::default(); parts.len()];
        let mut admits = vec![false; parts.len()];
        for (i, part) in parts.iter().enumerate() {
            let report = &mut reports[i];
            report.at_ms = part.now.ms;
            let Some(guard) = self.shards[i].as_mut() else {
                continue;
            };
            let runs = match guard.find_mut(hashes[i], part.caller) {
                Some(runs) => runs,
                None => &mut fresh[i],
            };
            let scope = part.scope;
            let mut admit = runs.check(&scope.quotas, &part.now, cost, false, report);
            if admit && let Some(total) = self.totals[i].as_mut() {
                admit = total.check(&scope.total, &part.now, cost, true, report);
            }
            admits[i] = admit;
        }
        admits
    }

    /// Counts `cost` in every part that admitted (a shadow part that would refuse
    /// is charged nothing).
    fn commit(&mut self, parts: &[Stacked<'_>], hashes: &[u64], admits: &[bool], cost: u32) {
        for (i, part) in parts.iter().enumerate().filter(|&(i, _)| admits[i]) {
            let scope = part.scope;
            if let Some(runs) = self.shards[i]
                .as_mut()
                .and_then(|g| g.find_mut(hashes[i], part.caller))
            {
                runs.commit(&scope.quotas, &part.now, cost);
            }
            if let Some(total) = self.totals[i].as_mut() {
                total.commit(&scope.total, &part.now, cost);
            }
        }
    }

    /// Gives back the places taken for a refused request that hold nothing.
    fn give_back(
        &mut self,
        parts: &[Stacked<'_>],
        bounds: &[&Bound],
        hashes: &[u64],
        placed: &[bool],
    ) {
        for (i, part) in parts.iter().enumerate().filter(|&(i, _)| placed[i]) {
            let table = &bounds[i].table;
            if let Some(guard) = self.shards[i].as_mut()
                && guard
                    .find_mut(hashes[i], part.caller)
                    .is_some_and(|r| r.is_empty())
            {
                table.remove(guard, hashes[i], part.caller);
            }
        }
    }
}
