//! Making a gateway and installing a config in it: the first snapshot at start, and
//! each reload's swap of the snapshot new requests are served with. Counters,
//! pools, caps and flood memory outlive the swap.
//!
//! It does not read or watch config files (`reload` does) nor serve a request.

use std::sync::Arc;

use arc_swap::ArcSwap;

use super::{Gateway, cors};
use crate::admission::Admission;
use crate::clock::Clock;
use crate::concurrency::Caps;
use crate::config::Config;
use crate::observe::access_log::AccessLog;
use crate::observe::metrics::Metrics;
use crate::proxy::Pools;
use crate::server::Offenders;
use crate::snapshot::{Shared, Snapshot};
use crate::store::{Store, StoreError};

impl Gateway {
    /// A gateway serving `config`, writing its access log to `log_out` (stdout when
    /// run); fails if its store cannot be used at all.
    pub fn new(
        config: Config,
        clock: Clock,
        log_out: impl std::io::Write + Send + 'static,
    ) -> Result<Gateway, StoreError> {
        let store = Store::open(&config.store, clock.now_ms())?;
        store.ban_table().set_max(config.ban.max_bans);
        let metrics = Metrics::new(&config);
        metrics
            .tracked_callers_limit
            .set(i64::try_from(config.store.max_keys).unwrap_or(i64::MAX));
        let access_log = AccessLog::start(
            log_out,
            metrics.access_log_dropped.clone(),
            metrics.access_log_suppressed.clone(),
        );
        metrics.store_errors.with_label_values(&[store.backend()]);
        let pools = Pools::default();
        let caps = Caps::default();
        let shared = Shared {
            store: &store,
            pools: &pools,
            caps: &caps,
            metrics: &metrics,
        };
        let mut snapshot = Snapshot::build(config, 1, shared);
        (snapshot.identifier).attach_jwks(None, &metrics.jwks_refreshes);
        metrics.config_generation.set(1);
        Ok(Gateway {
            snapshot: ArcSwap::from_pointee(snapshot),
            admission: Admission::new(store, clock, metrics),
            pools,
            caps,
            access_log,
            offenders: Offenders::default(),
            preflights: cors::Preflights::default(),
        })
    }

    /// The snapshot new requests are served with.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.load_full()
    }

    /// Serves new requests with `config` from now on; returns its generation.
    pub fn install(&self, config: Config) -> u64 {
        self.replace(config).0
    }

    /// [`Self::install`], handing back the snapshot it replaced, so the caller
    /// chooses the thread that frees it (a million consumers' snapshot takes a
    /// while to free, which a request's worker thread should not pay).
    pub(crate) fn replace(&self, config: Config) -> (u64, Arc<Snapshot>) {
        let generation = self.snapshot.load().generation + 1;
        self.store().ban_table().set_max(config.ban.max_bans);
        let shared = Shared {
            store: self.store(),
            pools: &self.pools,
            caps: &self.caps,
            metrics: self.metrics(),
        };
        let mut snapshot = Snapshot::build(config, generation, shared);
        let previous = self.snapshot.load();
        let refreshes = &self.metrics().jwks_refreshes;
        (snapshot.identifier).attach_jwks(Some(&previous.identifier), refreshes);
        drop(previous);
        let previous = self.snapshot.swap(Arc::new(snapshot));
        self.metrics().config_generation.set(generation as i64);
        (generation, previous)
    }
}
