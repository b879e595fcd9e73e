//! Data loss in Redis, noticed: a Redis restarted without persistence, or flushed,
//! holds none of the counters, so every caller and every `total` starts a fresh
//! window. sluice cannot give them back, but it says so: logged, counted
//! (`sluice_store_resets_total`) and shown in `/readyz`.
//!
//! The store keeps a marker key ([`MARKER`], a random epoch, no TTL) beside the
//! counters. Each replica remembers the epoch it saw and looks again every second
//! ([`Resets::check`]): a marker gone (this replica is the first to notice, and
//! writes a new one) or replaced (another replica noticed first) means the data the
//! marker stood beside is gone too. Redis's `run_id` (from `INFO server`, read with
//! it) tells the two causes apart: a changed `run_id` is a restart that came back
//! empty, the same one a flush. A restart that kept its data (an RDB or AOF file)
//! keeps the marker, and is no reset.
//!
//! In a Redis Cluster the marker lives on the master of its slot only: a master
//! that loses its data is noticed when it is that one. Not here: what a reset means
//! for a request (nothing: the counters simply start again).

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::link::Link;
use crate::store::StoreError;

/// The marker key.
pub const MARKER: &str = "sluice:epoch";

/// What this replica has seen of the store's data.
#[derive(Debug, Default)]
pub struct Resets {
    seen: Mutex<Seen>,
    /// Resets noticed since start.
    count: AtomicU64,
}

#[derive(Debug, Default)]
struct Seen {
    /// The marker's epoch as last seen.
    epoch: Option<String>,
    /// Redis's `run_id` as last seen.
    run_id: Option<String>,
    /// The last reset noticed: when (ms since the Unix epoch) and why.
    last: Option<Reset>,
}

/// A reset noticed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Reset {
    /// When it was noticed, in ms since the Unix epoch.
    pub at_ms: u64,
    /// `"restarted empty"` or `"flushed"`.
    pub reason: &'static str,
}

impl Resets {
    /// Resets noticed since start, and the last one.
    pub fn seen(&self) -> (u64, Option<Reset>) {
        (self.count.load(Ordering::Relaxed), self.seen.lock().last)
    }

    /// Looks at the marker (and the `run_id`, unless `cluster`: there each call may
    /// reach another node); returns the reset noticed now, if any. A Redis that does
    /// not answer is not looked at (it is the fallback's fault to handle).
    pub async fn check(
        &self,
        link: &Link,
        cluster: bool,
        now_ms: u64,
    ) -> Result<Option<Reset>, StoreError> {
        let run_id = match cluster {
            true => None,
            false => run_id(link).await?,
        };
        let mut marker = get(link).await?;
        if marker.is_none() {
            let epoch = const_hex::encode(fastrand::u64(..).to_be_bytes());
            link.query(|mut connection| async move {
                redis::cmd("SET")
                    .arg(MARKER)
                    .arg(epoch)
                    .arg("NX")
                    .query_async::<Option<String>>(&mut connection)
                    .await
            })
            .await?;
            // Whichever replica's epoch won.
            marker = get(link).await?;
        }
        let mut seen = self.seen.lock();
        let lost = seen.epoch.is_some() && seen.epoch != marker;
        let restarted = matches!((&seen.run_id, &run_id), (Some(a), Some(b)) if a != b);
        seen.epoch = marker;
        if run_id.is_some() {
            seen.run_id = run_id;
        }
        if !lost {
            return Ok(None);
        }
        let reset = Reset {
            at_ms: now_ms,
            reason: match restarted {
                true => "restarted empty",
                false => "flushed",
            },
        };
        seen.last = Some(reset);
        self.count.fetch_add(1, Ordering::Relaxed);
        Ok(Some(reset))
    }
}

async fn get(link: &Link) -> Result<Option<String>, StoreError> {
    link.query(|mut connection| async move {
        redis::cmd("GET")
            .arg(MARKER)
            .query_async::<Option<String>>(&mut connection)
            .await
    })
    .await
}

/// Redis's `run_id`, new at each start of the server.
async fn run_id(link: &Link) -> Result<Option<String>, StoreError> {
    let info = link
        .query(|mut connection| async move {
            redis::cmd("INFO")
                .arg("server")
                .query_async::<String>(&mut connection)
                .await
        })
        .await?;
    Ok(info
        .lines()
        .find_map(|line| line.strip_prefix("run_id:"))
        .map(|id| id.trim().to_string()))
}
