//! A keyed bucket's parts in Redis: field `k` of the bucket's own key, beside the
//! counters the script keeps in field `m` (the script reads only `m` and its run
//! fields, so `k` is carried along), written only into a key that exists, so the
//! parts expire and are deleted with the counters and never outlive them.

use super::RedisStore;
use super::keys::Bound;
use crate::store::{CallerKey, StoreError};

/// Sets field `k` of KEYS[1] to ARGV[1] if the key exists and has none yet.
const WRITE: &str = "if redis.call('EXISTS', KEYS[1]) == 1 then \
                     return redis.call('HSETNX', KEYS[1], 'k', ARGV[1]) end return 0";

impl RedisStore {
    /// Writes `parts` into `caller`'s key under `keys`, without waiting: a bucket
    /// whose write fails is exported by its digest until a later request writes
    /// them.
    pub(crate) fn write_parts(&self, keys: &Bound, caller: CallerKey, parts: Box<str>) {
        let key = keys.caller(caller);
        let written = self.link.start(None, move |mut connection| async move {
            redis::cmd("EVAL")
                .arg(WRITE)
                .arg(1)
                .arg(key)
                .arg(&*parts)
                .query_async::<i64>(&mut connection)
                .await
        });
        // The call runs on the engine's thread whether or not its answer is awaited.
        drop(written);
    }

    /// The parts written into `caller`'s key under `keys`, or into `at` (the key a
    /// listing found), if any.
    pub(crate) async fn read_parts(
        &self,
        keys: &Bound,
        caller: CallerKey,
        at: Option<String>,
    ) -> Result<Option<Box<str>>, StoreError> {
        let key = at.unwrap_or_else(|| keys.caller(caller));
        let parts = self
            .link
            .query(move |mut connection| async move {
                redis::cmd("HGET")
                    .arg(key)
                    .arg("k")
                    .query_async::<Option<String>>(&mut connection)
                    .await
            })
            .await?;
        Ok(parts.map(String::into_boxed_str))
    }
}
