//! The key parts of a keyed policy's buckets: a side table of one (policy, plan)'s
//! table, from a bucket's key (a digest of its parts) to the parts as text
//! (`header:x-org=acme&path:2=orders`, see `crate::admission`), so the usage export
//! can name a bucket by what it counts.
//!
//! Created on a table's first keyed request, so a policy without `key` pays nothing,
//! per caller or per request. Bounded by `max_keys`; a bucket that finds it full is
//! exported by its digest. In the memory engine an entry lives as long as its bucket
//! (dropped by the sweep once the bucket is gone); in front of Redis, where the parts
//! are written beside the bucket's counters, an entry only remembers when they were
//! written, and goes after [`Refresh::Every`] so they are written again.

use std::collections::HashMap;
use std::hash::BuildHasher;

use parking_lot::Mutex;

use crate::store::CallerKey;

/// Shards of the side table: a keyed request locks one for a lookup.
const SHARDS: usize = 16;

/// How long an entry stands for its bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refresh {
    /// As long as the bucket is tracked here (the memory engine).
    Never,
    /// For this many ms after the parts were written to Redis; then they are
    /// written again (the bucket may have expired and come back without them).
    Every(u64),
}

/// One bucket's parts, and when they were noted (written, in front of Redis).
#[derive(Debug)]
struct Named {
    parts: Box<str>,
    at_ms: u64,
}

type Shard = HashMap<CallerKey, Named, foldhash::fast::RandomState>;

/// One (policy, plan)'s keyed buckets by their parts.
#[derive(Debug)]
pub(crate) struct Names {
    shards: Box<[Mutex<Shard>]>,
    hasher: foldhash::fast::RandomState,
    refresh: Refresh,
    max: usize,
}

impl Names {
    /// An empty table holding at most `max` buckets' parts.
    pub(crate) fn new(refresh: Refresh, max: usize) -> Names {
        Names {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: foldhash::fast::RandomState::default(),
            refresh,
            max: max.div_ceil(SHARDS).max(1),
        }
    }

    fn shard(&self, key: CallerKey) -> &Mutex<Shard> {
        let hash = self.hasher.hash_one(key);
        &self.shards[(hash >> 40) as usize % SHARDS]
    }

    /// Notes `key`'s parts at `now_ms` (`parts` renders them, called only when they
    /// are new or due again). Returns them when they are to be written to Redis:
    /// new, or last written [`Refresh::Every`] ago; `None` when already known or
    /// when the table is full.
    pub(crate) fn note(
        &self,
        key: CallerKey,
        now_ms: u64,
        parts: impl FnOnce() -> String,
    ) -> Option<Box<str>> {
        let mut shard = self.shard(key).lock();
        if let Some(named) = shard.get_mut(&key) {
            return match self.refresh {
                Refresh::Every(ms) if now_ms.saturating_sub(named.at_ms) >= ms => {
                    named.at_ms = now_ms;
                    Some(named.parts.clone())
                }
                _ => None,
            };
        }
        if shard.len() >= self.max {
            return None;
        }
        let parts: Box<str> = parts().into();
        let named = Named {
            parts: parts.clone(),
            at_ms: now_ms,
        };
        shard.insert(key, named);
        Some(parts)
    }

    /// `key`'s parts, if known here.
    pub(crate) fn get(&self, key: CallerKey) -> Option<Box<str>> {
        (self.shard(key).lock().get(&key)).map(|named| named.parts.clone())
    }

    /// Puts back parts read from a state file.
    pub(crate) fn restore(&self, key: CallerKey, parts: &str, now_ms: u64) {
        self.note(key, now_ms, || parts.to_string());
    }

    /// Drops the entries that no longer stand for a bucket at `now_ms`: in the
    /// memory engine those whose bucket is not `tracked` any more, in front of Redis
    /// those due to be written again.
    pub(crate) fn sweep(&self, now_ms: u64, tracked: impl Fn(CallerKey) -> bool) {
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            match self.refresh {
                Refresh::Never => shard.retain(|&key, _| tracked(key)),
                Refresh::Every(ms) => {
                    shard.retain(|_, named| now_ms.saturating_sub(named.at_ms) < ms)
                }
            }
        }
    }

    /// Every (bucket, parts), one shard locked at a time (for the state file).
    pub(crate) fn entries(&self) -> Vec<(CallerKey, Box<str>)> {
        let mut all = Vec::new();
        for shard in self.shards.iter() {
            let shard = shard.lock();
            all.extend(shard.iter().map(|(&key, named)| (key, named.parts.clone())));
        }
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_noted_once_and_again_when_due_and_swept_with_their_bucket() {
        let names = Names::new(Refresh::Never, 100);
        assert_eq!(names.note(7, 0, || "a=1".into()).as_deref(), Some("a=1"));
        assert_eq!(names.note(7, 1_000_000, || unreachable!()), None);
        assert_eq!(names.get(7).as_deref(), Some("a=1"));
        names.sweep(0, |key| key != 7);
        assert_eq!(names.get(7), None);

        let written = Names::new(Refresh::Every(30_000), 100);
        assert!(written.note(7, 0, || "a=1".into()).is_some());
        assert_eq!(written.note(7, 29_999, || unreachable!()), None);
        assert_eq!(
            written.note(7, 30_000, || unreachable!()).as_deref(),
            Some("a=1")
        );
        written.sweep(60_000, |_| true);
        assert_eq!(written.get(7), None);
    }

    #[test]
    fn a_full_table_notes_nothing_more() {
        let names = Names::new(Refresh::Never, SHARDS);
        let noted = (0..1000u64)
            .filter(|&key| names.note(key, 0, || "a=1".into()).is_some())
            .count();
        assert!(noted <= SHARDS, "{noted}");
        assert_eq!(names.entries().len(), noted);
    }
}
