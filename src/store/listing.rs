//! Listing a policy's tracked callers, page by page, for the usage export
//! (`GET /admin/usage?policy=P`).
//!
//! A page is the callers of the policy's plans ([`Scope`]s, one per plan) from a
//! [`Cursor`] on, at most about `want` of them, and the cursor after them. Only keys
//! are listed here; each caller's counters are then read one at a time with
//! [`Store::peek_listed`], so no lock is held while an answer is written. The memory
//! engine lists each table shard by shard, in key order within a shard (a shard's
//! lock is held while its keys are copied, never while anything is written), so a
//! caller tracked for the whole export is listed exactly once, whatever the traffic
//! adds or evicts meanwhile. The Redis engine lists with `SCAN` in bounded batches
//! (`COUNT`), every master of a Cluster in turn, so the page comes from the fleet's
//! counters, not from this replica's memory; `SCAN` lists a key that lives through
//! the whole export at least once (twice only if Redis resizes its keyspace
//! meanwhile).
//!
//! It decides nothing and writes nothing: it reads.

use std::fmt;

use super::{CallerKey, Handle, Scope, Store, StoreError};
use crate::limit::{Now, Report};

/// Where a listing has got to; its text form is the export's `cursor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cursor {
    /// The memory engine: the table (the index of its scope in the list), the shard,
    /// and the last caller listed in that shard, if any.
    Memory {
        /// Index of the table's scope.
        table: u16,
        /// Shard of the table.
        shard: u8,
        /// The shard's callers up to this key were listed.
        after: Option<CallerKey>,
    },
    /// Redis: the master (0 on one server) and its `SCAN` cursor.
    Redis {
        /// Index of the master in the Cluster's slot map.
        node: u16,
        /// `SCAN`'s cursor on that master.
        scan: u64,
    },
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cursor::Memory {
                table,
                shard,
                after: Some(key),
            } => write!(f, "m{table}.{shard}.{key:016x}"),
            Cursor::Memory { table, shard, .. } => write!(f, "m{table}.{shard}"),
            Cursor::Redis { node, scan } => write!(f, "r{node}.{scan}"),
        }
    }
}

impl std::str::FromStr for Cursor {
    type Err = ();

    fn from_str(text: &str) -> Result<Cursor, ()> {
        let (kind, rest) = text.split_at_checked(1).ok_or(())?;
        let parts: Vec<&str> = rest.split('.').collect();
        match (kind, parts.as_slice()) {
            ("m", [table, shard, after @ ..]) if after.len() <= 1 => Ok(Cursor::Memory {
                table: table.parse().map_err(drop)?,
                shard: shard.parse().map_err(drop)?,
                after: match after {
                    [key] if key.len() == 16 => Some(u64::from_str_radix(key, 16).map_err(drop)?),
                    [_] => return Err(()),
                    _ => None,
                },
            }),
            ("r", [node, scan]) => Ok(Cursor::Redis {
                node: node.parse().map_err(drop)?,
                scan: scan.parse().map_err(drop)?,
            }),
            _ => Err(()),
        }
    }
}

/// A caller a listing found: the index of the scope (plan) it is tracked in, its
/// key, and in Redis the name of the key its counters are under.
#[derive(Debug, Clone)]
pub struct Listed {
    /// Index of its scope in the list given.
    pub scope: usize,
    /// The caller (or keyed bucket).
    pub caller: CallerKey,
    /// Redis: the key its counters live under (its own, or placed with the first
    /// policy's of a stacked route on a Cluster).
    pub(crate) at: Option<String>,
}

/// One page of a listing: the callers, and where the next page starts (`None`: this
/// was the last).
pub type Page = (Vec<Listed>, Option<Cursor>);

impl Store {
    /// About `want` callers tracked under `scopes` (a policy's plans), from `from`
    /// (`None`: the start). A cursor of the other engine, or out of range, is an
    /// empty last page.
    pub async fn list(
        &self,
        scopes: &[&Scope],
        from: Option<Cursor>,
        want: usize,
    ) -> Result<Page, StoreError> {
        match self {
            Store::Memory(store) => {
                let bounds: Vec<_> = (scopes.iter())
                    .filter_map(|scope| match &scope.handle {
                        Handle::Memory(bound) => Some(bound),
                        Handle::Redis(_) => None,
                    })
                    .collect();
                let start = match from {
                    None => Some((0, 0, None)),
                    Some(Cursor::Memory {
                        table,
                        shard,
                        after,
                    }) => Some((usize::from(table), usize::from(shard), after)),
                    Some(Cursor::Redis { .. }) => None,
                };
                Ok(match start {
                    Some(start) => store.list(&bounds, start, want),
                    None => (Vec::new(), None),
                })
            }
            Store::Redis(store) => {
                let bounds: Vec<_> = (scopes.iter())
                    .filter_map(|scope| match &scope.handle {
                        Handle::Redis(bound) => Some(bound.redis()),
                        Handle::Memory(_) => None,
                    })
                    .collect();
                let start = match from {
                    None => (0, 0),
                    Some(Cursor::Redis { node, scan }) => (node, scan),
                    Some(Cursor::Memory { .. }) => return Ok((Vec::new(), None)),
                };
                store.redis().list(&bounds, start, want).await
            }
        }
    }

    /// The counters of a caller `list` found, under `scope` (its own, or its
    /// consumer's), at `now`, counting nothing. In Redis the fleet's counters: an
    /// error is an error here, not the local fallback's counts.
    pub async fn peek_listed(
        &self,
        scope: &Scope,
        listed: &Listed,
        now: &Now,
        report: &mut Report,
    ) -> Result<(), StoreError> {
        match (self, &scope.handle) {
            (Store::Memory(store), Handle::Memory(bound)) => {
                store.peek(scope, bound, listed.caller, now, report);
                Ok(())
            }
            (Store::Redis(store), Handle::Redis(bound)) => {
                let (redis, keys) = (store.redis(), bound.redis());
                match &listed.at {
                    Some(key) => redis.peek_key(scope, keys, key.clone(), now, report).await,
                    None => redis.peek(scope, keys, listed.caller, now, report).await,
                }
            }
            _ => Ok(()),
        }
    }
}

/// A Redis Cluster places the counters of a stacked route's later policies with its
/// first policy's bucket (one slot for the script), under a hash tag that the later
/// policy's caller alone does not name. The admin API's reads, credits and resets of
/// one caller find them here: one `SCAN` of every master for the caller's placed keys,
/// then each is read, credited or forgotten like the caller's own key.
impl Store {
    /// The keys of `callers` placed with other policies' buckets: on a Redis
    /// Cluster, found by `SCAN` on every master; none elsewhere.
    pub async fn placed(&self, callers: &[CallerKey]) -> Result<Vec<String>, StoreError> {
        match self {
            Store::Memory(_) => Ok(Vec::new()),
            Store::Redis(store) => store.redis().placed(callers).await,
        }
    }

    /// Of `placed`, the keys that hold `caller`'s counters under `scope`.
    pub fn placed_under(&self, scope: &Scope, caller: CallerKey, placed: &[String]) -> Vec<Listed> {
        let Handle::Redis(bound) = &scope.handle else {
            return Vec::new();
        };
        (placed.iter())
            .filter(|key| bound.redis().owner(key) == Some(caller))
            .map(|key| Listed {
                scope: 0,
                caller,
                at: Some(key.clone()),
            })
            .collect()
    }

    /// Credits the billing periods of `listed`'s key under `scope` (see
    /// [`Store::credit`]); false if Redis did not take it.
    pub async fn credit_listed(
        &self,
        scope: &Scope,
        listed: &Listed,
        now: &Now,
        amount: u32,
    ) -> bool {
        scope.memo.forget(listed.caller);
        match (self, &listed.at) {
            (Store::Redis(store), Some(key)) => {
                let credited = store.redis().credit_key(scope, key.clone(), now, amount);
                credited.await.is_ok()
            }
            _ => self.credit(scope, listed.caller, now, amount).await,
        }
    }

    /// Forgets the counters under `listed`'s key; true if there were any.
    pub async fn reset_listed(&self, scope: &Scope, listed: &Listed) -> bool {
        scope.memo.forget(listed.caller);
        match (self, &listed.at) {
            (Store::Redis(store), Some(key)) => {
                matches!(store.redis().reset_key(key.clone()).await, Ok(true))
            }
            _ => self.reset(scope, listed.caller).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_read_back_as_written_and_nothing_else_reads() {
        for cursor in [
            Cursor::Memory {
                table: 2,
                shard: 63,
                after: Some(0xffff_7f00_0001),
            },
            Cursor::Memory {
                table: 0,
                shard: 5,
                after: None,
            },
            Cursor::Redis { node: 1, scan: 917 },
        ] {
            assert_eq!(cursor.to_string().parse(), Ok(cursor), "{cursor}");
        }
        for bad in [
            "", "m", "m1", "m1.x", "m1.2.123", "r1", "r1.2.3", "x1.2", "m1.2.3.4",
        ] {
            assert_eq!(bad.parse::<Cursor>(), Err(()), "{bad}");
        }
    }
}
