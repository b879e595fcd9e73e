//! The memory engine's part of a usage export: a policy's callers, table by table
//! and shard by shard, in key order within a shard, each shard's lock held only
//! while its keys are copied.

use super::table::SHARDS;
use super::{Bound, MemoryStore};
use crate::store::CallerKey;
use crate::store::listing::{Cursor, Listed, Page};

/// Where a memory listing starts: the table, the shard, the last key listed there.
pub(crate) type Start = (usize, usize, Option<CallerKey>);

impl MemoryStore {
    /// Up to `want` callers of `bounds`' tables from `start` on, and where the next
    /// page starts. A shard's keys are copied under its lock (only those after the
    /// cursor's), then sorted and taken without it.
    pub(crate) fn list(&self, bounds: &[&Bound], start: Start, want: usize) -> Page {
        let (first_table, first_shard, mut after) = start;
        let mut listed = Vec::new();
        for (index, bound) in bounds.iter().enumerate().skip(first_table) {
            let from = if index == first_table { first_shard } else { 0 };
            for shard in from..SHARDS {
                if listed.len() == want {
                    return (listed, Some(cursor(index, shard, after)));
                }
                let mut keys = bound.table.keys_after(shard, after);
                after = None;
                keys.sort_unstable();
                let room = want - listed.len();
                if keys.len() > room {
                    keys.truncate(room);
                    let last = keys.last().copied();
                    listed.extend(keys.into_iter().map(|caller| found(index, caller)));
                    return (listed, Some(cursor(index, shard, last)));
                }
                listed.extend(keys.into_iter().map(|caller| found(index, caller)));
            }
        }
        (listed, None)
    }
}

fn found(scope: usize, caller: CallerKey) -> Listed {
    Listed {
        scope,
        caller,
        at: None,
    }
}

fn cursor(table: usize, shard: usize, after: Option<CallerKey>) -> Cursor {
    Cursor::Memory {
        table: u16::try_from(table).unwrap_or(u16::MAX),
        shard: u8::try_from(shard).unwrap_or(u8::MAX),
        after,
    }
}
