//! Who is being limited now: the callers refused most in the last minute, by which
//! limit, and the callers at or above 80 % of a window, for the status page.
//!
//! Each is a Space-Saving summary (`summary`) of [`summary::CAPACITY`] counters,
//! never a scan of every caller: memory is fixed whatever the number of callers.
//! The minute is [`SLOTS`] summaries of [`SLOT_MS`] each, the oldest cleared as time
//! moves on, so "the last minute" is the last 60 to 72 seconds. Each worker thread
//! counts in a shard of its own (the threads are spread over [`SHARDS`] shards), so
//! the request path takes a lock nobody else holds; a reader merges the shards.
//!
//! Merged counts are over-estimates: a key's count is its counters' sum, within
//! [`Top::error_bound`] of the truth, itself at most `N / CAPACITY` for `N` hits in the
//! minute (Agarwal et al., "Mergeable summaries", 2012: the error of summaries added
//! together is the sum of their errors). Only refusals and admissions near a limit
//! are counted; everything else passes by with one comparison.

mod summary;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;

use summary::{CAPACITY, Summary};

/// Shards the worker threads count in (threads beyond it share).
pub(crate) const SHARDS: usize = 4;
/// One summary's span of time.
pub(crate) const SLOT_MS: u64 = 12_000;
/// Summaries per minute: the current one and the five before it.
pub(crate) const SLOTS: usize = 6;
/// Callers listed at most.
pub(crate) const TOP: usize = 50;

/// The share of a window from which a caller counts as near its limit: 80 %, as
/// `used * 5 >= limit * 4`.
pub(crate) fn near_limit(used: u32, limit: u32) -> bool {
    u64::from(used) * 5 >= u64::from(limit) * 4
}

/// A refused caller: its name, and the limit that refused it last.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub(crate) struct RefusedBy {
    pub caller: Box<str>,
    pub policy: Box<str>,
    /// The window (`minute`, `total-minute`, `cost`) or `concurrency`.
    pub limit: &'static str,
}

/// A caller near a limit: its name, and the fullest window it was seen at.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub(crate) struct NearLimit {
    pub caller: Box<str>,
    pub policy: Box<str>,
    pub window: &'static str,
    pub used: u32,
    pub limit: u32,
}

impl NearLimit {
    fn ratio(&self) -> f64 {
        f64::from(self.used) / f64::from(self.limit.max(1))
    }
}

/// A minute of one kind of hit in one shard: a summary per slot.
#[derive(Debug)]
struct Minute<T> {
    slots: Vec<(u64, Summary<T>)>,
}

impl<T: Clone> Minute<T> {
    fn new() -> Minute<T> {
        Minute {
            slots: (0..SLOTS).map(|_| (u64::MAX, Summary::new())).collect(),
        }
    }

    /// The summary of `now_ms`'s slot, cleared first if it held an older one.
    fn current(&mut self, now_ms: u64) -> &mut Summary<T> {
        let epoch = now_ms / SLOT_MS;
        let (held, summary) = &mut self.slots[(epoch % SLOTS as u64) as usize];
        if *held != epoch {
            summary.clear();
            *held = epoch;
        }
        summary
    }

    /// The summaries of the last minute at `now_ms`.
    fn live(&self, now_ms: u64) -> impl Iterator<Item = &Summary<T>> {
        let epoch = now_ms / SLOT_MS;
        let oldest = epoch.saturating_sub(SLOTS as u64 - 1);
        (self.slots.iter())
            .filter(move |(held, _)| (oldest..=epoch).contains(held))
            .map(|(_, summary)| summary)
    }
}

#[derive(Debug)]
struct Shard {
    refused: Minute<RefusedBy>,
    near: Minute<NearLimit>,
}

/// The refused and near-limit callers of the last minute.
#[derive(Debug)]
pub(crate) struct Hitters {
    shards: Box<[Mutex<Shard>]>,
}

impl Default for Hitters {
    fn default() -> Self {
        let shard = || {
            Mutex::new(Shard {
                refused: Minute::new(),
                near: Minute::new(),
            })
        };
        Hitters {
            shards: (0..SHARDS).map(|_| shard()).collect(),
        }
    }
}

/// The shard of the calling thread: threads take shards in turn as they first count.
fn shard_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SHARD: usize = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
    }
    SHARD.with(|shard| *shard)
}

/// The heaviest keys of the last minute, merged over shards and slots.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Top<T> {
    /// Hits counted in the minute (refusals, or admissions near a limit).
    pub total: u64,
    /// The most any count may be off by, either way (the sum of the summaries'
    /// smallest counters once full; 0 while every key was counted exactly).
    pub error_bound: u64,
    pub callers: Vec<Counted<T>>,
}

/// One caller of a [`Top`].
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Counted<T> {
    pub count: u64,
    #[serde(flatten)]
    pub tag: T,
}

impl Hitters {
    /// Counts a refusal of the caller `key` at `now_ms`; `tag` names it and the
    /// limit, called only when the caller is new to this slot of this shard.
    pub(crate) fn refused(&self, key: u64, now_ms: u64, tag: impl FnOnce() -> RefusedBy) {
        let mut shard = self.shards[shard_index()].lock();
        shard.refused.current(now_ms).hit(key, tag);
    }

    /// Counts an admission of the caller `key` that found a window at or above
    /// 80 % (`used` of `limit` in `window` of `policy`); `caller` names it, called
    /// only when the caller is new to this slot of this shard.
    pub(crate) fn near(
        &self,
        key: u64,
        now_ms: u64,
        caller: impl FnOnce() -> Box<str>,
        at: (&str, &'static str, u32, u32),
    ) {
        let (policy, window, used, limit) = at;
        let mut shard = self.shards[shard_index()].lock();
        let tag = shard.near.current(now_ms).hit(key, || NearLimit {
            caller: caller(),
            policy: Box::from(policy),
            window,
            used,
            limit: 0,
        });
        // The fullest window wins; the same one takes its latest count.
        let fuller =
            u64::from(used) * u64::from(tag.limit.max(1)) >= u64::from(tag.used) * u64::from(limit);
        if tag.limit == 0 || fuller || (tag.window == window && *tag.policy == *policy) {
            if *tag.policy != *policy {
                tag.policy = Box::from(policy);
            }
            (tag.window, tag.used, tag.limit) = (window, used, limit);
        }
    }

    /// The callers refused most in the last minute at `now_ms`, with the latest
    /// limit that refused each.
    pub(crate) fn top_refused(&self, now_ms: u64) -> Top<RefusedBy> {
        self.top(now_ms, |shard| &shard.refused, |_, _| false)
    }

    /// The callers near a limit in the last minute at `now_ms`, fullest first seen.
    pub(crate) fn top_near(&self, now_ms: u64) -> Top<NearLimit> {
        self.top(
            now_ms,
            |shard| &shard.near,
            |old, new| new.ratio() > old.ratio(),
        )
    }

    fn top<T: Clone>(
        &self,
        now_ms: u64,
        minute: impl Fn(&Shard) -> &Minute<T>,
        better: impl Fn(&T, &T) -> bool,
    ) -> Top<T> {
        let (mut total, mut error_bound) = (0, 0);
        let mut merged: HashMap<u64, Counted<T>> = HashMap::new();
        for shard in &self.shards {
            let shard = shard.lock();
            // Slots in time order: a later slot's tag is the latest.
            let mut live: Vec<&Summary<T>> = minute(&shard).live(now_ms).collect();
            live.reverse();
            for summary in live {
                total += summary.total();
                error_bound += summary.error_bound();
                for held in summary.held() {
                    let entry = merged.entry(held.key).or_insert_with(|| Counted {
                        count: 0,
                        tag: held.tag.clone(),
                    });
                    entry.count += held.count;
                    if better(&entry.tag, &held.tag) {
                        entry.tag = held.tag;
                    }
                }
            }
        }
        let mut callers: Vec<Counted<T>> = merged.into_values().collect();
        callers.sort_by_key(|c| std::cmp::Reverse(c.count));
        callers.truncate(TOP);
        Top {
            total,
            error_bound,
            callers,
        }
    }

    /// Bytes the summaries take at most: their counters, and the names they hold
    /// at their longest (a caller's 265 bytes, a policy's 64).
    pub(crate) fn max_bytes() -> usize {
        let counters = std::mem::size_of::<Summary<RefusedBy>>()
            + std::mem::size_of::<Summary<NearLimit>>()
            + CAPACITY * (std::mem::size_of::<RefusedBy>() + std::mem::size_of::<NearLimit>());
        let names = CAPACITY * 2 * (crate::identity::MAX_NAME_BYTES + 9 + MAX_POLICY_NAME);
        SHARDS * SLOTS * (counters + names)
    }
}

/// The longest policy name the bound of [`Hitters::max_bytes`] assumes.
const MAX_POLICY_NAME: usize = 64;

#[cfg(test)]
mod tests {
    use super::{Hitters, RefusedBy, SLOT_MS, near_limit};

    fn refused_by(caller: &str) -> RefusedBy {
        RefusedBy {
            caller: caller.into(),
            policy: "standard".into(),
            limit: "minute",
        }
    }

    #[test]
    fn the_last_minute_only() {
        let hitters = Hitters::default();
        for _ in 0..3 {
            hitters.refused(1, 0, || refused_by("ip:10.0.0.1"));
        }
        hitters.refused(2, 30_000, || refused_by("ip:10.0.0.2"));
        let top = hitters.top_refused(50_000);
        assert_eq!(top.total, 4);
        assert_eq!(top.callers[0].count, 3);
        assert_eq!(&*top.callers[0].tag.caller, "ip:10.0.0.1");
        // 72 s later the first slot has gone; the second is still within the minute.
        let top = hitters.top_refused(6 * SLOT_MS);
        assert_eq!(top.total, 1);
        assert_eq!(&*top.callers[0].tag.caller, "ip:10.0.0.2");
        // A slot reused after a minute is cleared first.
        hitters.refused(3, 6 * SLOT_MS, || refused_by("ip:10.0.0.3"));
        let top = hitters.top_refused(6 * SLOT_MS);
        assert_eq!(top.callers.len(), 2);
    }

    #[test]
    fn near_keeps_the_fullest_window() {
        let hitters = Hitters::default();
        let name = || Box::from("consumer:acme");
        hitters.near(9, 0, name, ("standard", "minute", 80, 100));
        hitters.near(9, 0, name, ("standard", "day", 900, 1000));
        hitters.near(9, 0, name, ("standard", "minute", 85, 100));
        let top = hitters.top_near(1_000);
        let tag = &top.callers[0].tag;
        assert_eq!((tag.window, tag.used, tag.limit), ("day", 900, 1000));
        assert_eq!(top.callers[0].count, 3);
        assert!(near_limit(80, 100) && !near_limit(79, 100) && near_limit(1, 1));
    }
}
