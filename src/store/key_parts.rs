//! The key parts of keyed buckets, kept so the usage export can name a bucket by
//! what it counts (`header:x-org=acme`) rather than by the digest it is counted
//! under.
//!
//! Admission notes a keyed bucket's parts after deciding it ([`Store::name`]): the
//! memory engine keeps them in a side table of the bucket's table, for as long as
//! the bucket lives (and in its state file); the Redis engine writes them once into
//! the bucket's own key (field `k`, only if the key exists: they expire and are
//! deleted with the counters), and remembers for a while that it did, so a request
//! pays a lookup, not a round trip. The export reads them back ([`Store::key_parts`]).
//! A bucket whose parts were never noted (counted before an upgrade, restored from an
//! older state file, or whose side table is full) has none: it is exported by its
//! digest.

use super::memory::names::Refresh;
use super::{CallerKey, Handle, Scope, Store, StoreError};
use crate::store::listing::Listed;

/// How long a replica in front of Redis trusts that it wrote a bucket's parts:
/// after this a request writes them again, in case the bucket expired (or was reset)
/// and came back without them.
const REWRITE_MS: u64 = 30_000;

impl Store {
    /// Notes the parts of keyed bucket `key` under `scope` at `now_ms`; `parts`
    /// renders them, and is called only when the store does not know them yet.
    pub fn name(&self, scope: &Scope, key: CallerKey, now_ms: u64, parts: impl FnOnce() -> String) {
        match (self, &scope.handle) {
            (Store::Memory(_), Handle::Memory(bound)) => {
                bound.names(Refresh::Never).note(key, now_ms, parts);
            }
            (Store::Redis(store), Handle::Redis(bound)) => {
                let names = bound.local.names(Refresh::Every(REWRITE_MS));
                if let Some(parts) = names.note(key, now_ms, parts) {
                    store.redis().write_parts(bound.redis(), key, parts);
                }
            }
            _ => {}
        }
    }

    /// The parts of `listed`, a bucket a listing of `scope` found, if they are known.
    pub async fn key_parts(
        &self,
        scope: &Scope,
        listed: &Listed,
    ) -> Result<Option<Box<str>>, StoreError> {
        match (self, &scope.handle) {
            (Store::Memory(_), Handle::Memory(bound)) => {
                Ok((bound.known_names()).and_then(|names| names.get(listed.caller)))
            }
            (Store::Redis(store), Handle::Redis(bound)) => {
                let at = listed.at.clone();
                (store.redis())
                    .read_parts(bound.redis(), listed.caller, at)
                    .await
            }
            _ => Ok(None),
        }
    }
}
