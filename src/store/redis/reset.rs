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
//! In a Redis Cluster each master keeps a marker of its own (`sluice:epoch:{n}`, in
//! the lowest slot it serves), looked at on the engine's own connection to it: a
//! master that loses its data is noticed whichever it is, and named. The marker
//! travels with its slot: a replica promoted by a failover holds it (no reset), a
//! master that comes back empty or is flushed does not. A master whose health is
//! open is not looked at until it answers again. Not here: what a reset means for a
//! request (nothing: the counters simply start again).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use redis::aio::ConnectionManager;

use super::link::Link;
use super::shards::key_in_slot;
use crate::store::StoreError;

/// The marker key of one server (or a Sentinel's master).
pub const MARKER: &str = "sluice:epoch";
/// The start of a Cluster master's marker key, `sluice:epoch:{n}`.
pub const CLUSTER_MARKER: &str = "sluice:epoch:";

/// What this replica has seen of the store's data.
#[derive(Debug, Default)]
pub struct Resets {
    seen: Mutex<Seen>,
    /// Resets noticed since start.
    count: AtomicU64,
}

#[derive(Debug, Default)]
struct Seen {
    /// Per marker key: what was last seen beside it.
    markers: HashMap<String, Marker>,
    /// On a Cluster, the marker key of each slot looked at.
    keys: HashMap<u16, String>,
    /// The last reset noticed.
    last: Option<Reset>,
}

/// One marker as last seen.
#[derive(Debug, Default)]
struct Marker {
    /// Its epoch.
    epoch: Option<String>,
    /// The `run_id` of the server holding it.
    run_id: Option<String>,
}

/// A reset noticed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Reset {
    /// When it was noticed, in ms since the Unix epoch.
    pub at_ms: u64,
    /// `"restarted empty"` or `"flushed"`.
    pub reason: &'static str,
    /// On a Cluster, the master that lost its data (`host:port`).
    pub master: Option<String>,
}

/// Where one marker is looked at: its key, and on a Cluster its master's address
/// and the engine's connection to it.
type Target = (String, Option<(String, ConnectionManager)>);

impl Resets {
    /// Resets noticed since start, and the last one.
    pub fn seen(&self) -> (u64, Option<Reset>) {
        (
            self.count.load(Ordering::Relaxed),
            self.seen.lock().last.clone(),
        )
    }

    /// Looks at the marker of the server, or of each Cluster master (`cluster`);
    /// returns the resets noticed now. A Redis that does not answer is not looked
    /// at (it is the fallback's fault to handle); on a Cluster the other masters
    /// still are.
    pub async fn check(
        &self,
        link: &Link,
        cluster: bool,
        now_ms: u64,
    ) -> Result<Vec<Reset>, StoreError> {
        let targets = match cluster {
            true => self.cluster_targets(link),
            false => vec![(MARKER.to_string(), None)],
        };
        let mut noticed = Vec::new();
        for (key, master) in &targets {
            let on = master.as_ref().map(|(_, connection)| connection.clone());
            let (epoch, run_id) = match look(link, on, key).await {
                Ok(seen) => seen,
                Err(_) if cluster => continue,
                Err(err) => return Err(err),
            };
            let address = master.as_ref().map(|(address, _)| address.clone());
            noticed.extend(self.compare(key, epoch, run_id, address, now_ms));
        }
        if cluster {
            let mut seen = self.seen.lock();
            seen.markers
                .retain(|key, _| targets.iter().any(|(k, _)| k == key));
        }
        Ok(noticed)
    }

    /// The marker of each master of the slot map whose health is not open.
    fn cluster_targets(&self, link: &Link) -> Vec<Target> {
        let Some(map) = link.shards() else {
            return Vec::new();
        };
        let mut seen = self.seen.lock();
        (map.first_slots().into_iter())
            .filter(|(_, _, master)| !master.health.is_open())
            .map(|(slot, address, master)| {
                let key = (seen.keys.entry(slot))
                    .or_insert_with(|| key_in_slot(CLUSTER_MARKER, slot))
                    .clone();
                let on = (address.to_string(), master.connection.clone());
                (key, Some(on))
            })
            .collect()
    }

    /// Records what was seen at `key`; the reset it shows, if any.
    fn compare(
        &self,
        key: &str,
        epoch: Option<String>,
        run_id: Option<String>,
        master: Option<String>,
        now_ms: u64,
    ) -> Option<Reset> {
        let mut seen = self.seen.lock();
        let marker = seen.markers.entry(key.to_string()).or_default();
        let lost = marker.epoch.is_some() && marker.epoch != epoch;
        let restarted = matches!((&marker.run_id, &run_id), (Some(a), Some(b)) if a != b);
        marker.epoch = epoch;
        if run_id.is_some() {
            marker.run_id = run_id;
        }
        if !lost {
            return None;
        }
        let reset = Reset {
            at_ms: now_ms,
            reason: match restarted {
                true => "restarted empty",
                false => "flushed",
            },
            master,
        };
        seen.last = Some(reset.clone());
        self.count.fetch_add(1, Ordering::Relaxed);
        Some(reset)
    }
}

/// The marker at `key` (written first if it is missing: whichever replica's epoch
/// wins) and the `run_id` of the server holding it, on `on` or the link's
/// connection.
async fn look(
    link: &Link,
    on: Option<ConnectionManager>,
    key: &str,
) -> Result<(Option<String>, Option<String>), StoreError> {
    let info = query::<String>(link, on.clone(), redis::cmd("INFO").arg("server")).await?;
    let run_id = (info.lines())
        .find_map(|line| line.strip_prefix("run_id:"))
        .map(|id| id.trim().to_string());
    let mut marker = query::<Option<String>>(link, on.clone(), redis::cmd("GET").arg(key)).await?;
    if marker.is_none() {
        let epoch = const_hex::encode(fastrand::u64(..).to_be_bytes());
        let set = redis::cmd("SET").arg(key).arg(epoch).arg("NX").clone();
        query::<Option<String>>(link, on.clone(), &set).await?;
        marker = query::<Option<String>>(link, on, redis::cmd("GET").arg(key)).await?;
    }
    Ok((marker, run_id))
}

/// Sends `command` on `on` or the link's connection.
async fn query<T: redis::FromRedisValue + Send + 'static>(
    link: &Link,
    on: Option<ConnectionManager>,
    command: &redis::Cmd,
) -> Result<T, StoreError> {
    let command = command.clone();
    link.start(on, move |mut connection| async move {
        command.query_async::<T>(&mut connection).await
    })
    .await
}
