//! The Redis store's bans sync, every `redis::bans::SYNC_EVERY`: this replica's
//! refusals flushed to Redis, the fleet's ban changes polled in.
//!
//! A sync that fails is counted like any failed call (`sluice_store_errors_total`,
//! the store's breaker) but logged once per outage, not four times a second: its
//! first failure is a warning, and the first sync that works again says so. On a
//! Redis Cluster the bans live on one master, so a dead master that holds them
//! would otherwise fill the log for as long as the failover takes.
//!
//! Not here: the ban table the requests are checked against (`super::bans`) and
//! the Redis script (`redis::bans`).

use std::sync::atomic::Ordering;

use super::StoreError;
use super::bans::Ban;
use super::breaker::Permit;
use super::fallback::Fallback;
use crate::config::OnError;

impl Fallback {
    /// Flushes this replica's refusals to Redis and polls the fleet's ban changes;
    /// each ban this replica's refusals made in Redis is handed to `on_ban` before
    /// it is enforced here. While Redis is down the refusals count here with
    /// `on_error = "local"` (a ban the local table earns is set as it is earned,
    /// then handed on), and are dropped otherwise.
    pub async fn sync_bans(&self, now_ms: u64, on_ban: impl Fn(&Ban)) {
        let (refusals, auto) = self.bans.take();
        let mut failed = None;
        if let Some(auto) = auto {
            match self.bans.flush(&refusals, &auto).await {
                Ok(made) => {
                    for (key, ban) in made {
                        on_ban(&ban);
                        self.local.bans.set(key, ban, now_ms);
                    }
                }
                Err(err) => {
                    failed = Some(err);
                    if self.on_error == OnError::Local {
                        for (key, (count, caller)) in refusals {
                            let ban =
                                (self.local.bans).strikes(key, count, || caller, now_ms, &auto);
                            ban.iter().for_each(&on_ban);
                        }
                    }
                }
            }
        }
        if let Err(err) = self.bans.poll(&self.local.bans, now_ms).await {
            failed = Some(err);
        }
        self.synced(now_ms, failed);
    }

    /// Counts a failed sync, and logs the first failure of an outage and its end.
    fn synced(&self, now_ms: u64, failed: Option<StoreError>) {
        let Some(err) = failed else {
            if self.bans_down.swap(false, Ordering::Relaxed) {
                tracing::info!("the redis bans sync works again");
            }
            return;
        };
        self.errors.fetch_add(1, Ordering::Relaxed);
        self.breaker.failed(now_ms, Permit::Closed);
        if !self.bans_down.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                error = %err,
                on_error = ?self.on_error,
                "the redis bans sync failed (logged once until it works again; \
                 sluice_store_errors_total counts each failure)"
            );
        }
    }
}
