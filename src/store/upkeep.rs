//! The store's upkeep: what an engine does in the background while it serves.
//!
//! [`Store::start`] starts it on the caller's runtime and hands back an [`Upkeep`];
//! [`Upkeep::stop`] ends it, then writes what the engine keeps across a restart. The
//! memory engine writes its state file every [`SAVE_EVERY`] when it keeps one (on a
//! blocking thread), and once more when stopped. The Redis engine flushes this
//! replica's refusals to the fleet and polls the fleet's bans every [`SYNC_EVERY`],
//! and hands each ban this replica's refusals made to the `on_ban` it was started
//! with (the gateway counts and logs it); once a second it looks for a loss of the
//! store's data (`redis::reset`).
//!
//! Not here: re-anchoring the clock (the clock's business); dropping idle callers
//! ([`Store::sweep`], run by the gateway's maintenance, because what is idle depends on
//! the config's calendar and ban rules); and the Redis engine's connection and
//! batchers, which live from open until the store is dropped (`redis::link`,
//! `redis::batch`), so that a store decides whether or not it was started.

use std::sync::Arc;

use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;

pub use super::memory::SAVE_EVERY;
pub use super::redis::bans::SYNC_EVERY;
use super::{Ban, Fallback, MemoryStore, Store};
use crate::clock::Clock;

/// A store's background work, running until [`Upkeep::stop`]. Dropping it stops the
/// work too, without the last save.
#[derive(Debug)]
pub struct Upkeep {
    store: Store,
    clock: Clock,
    /// The engine's periodic task, if it needs one.
    task: Option<JoinHandle<()>>,
}

impl Store {
    /// Starts what this store's engine does in the background, on the current
    /// runtime, reading instants from `clock`; each ban this replica's refusals made
    /// in the fleet is handed to `on_ban`.
    pub fn start(&self, clock: &Clock, on_ban: impl Fn(&Ban) + Send + Sync + 'static) -> Upkeep {
        let task = match self {
            Store::Memory(store) => (store.state_file().is_some())
                .then(|| tokio::spawn(save_every(store.clone(), clock.clone()))),
            Store::Redis(store) => Some(tokio::spawn(sync_every(
                store.clone(),
                clock.clone(),
                on_ban,
            ))),
        };
        Upkeep {
            store: self.clone(),
            clock: clock.clone(),
            task,
        }
    }
}

impl Upkeep {
    /// Stops the background work, then writes the memory engine's state file one
    /// last time (if it keeps one); returns once it is written.
    pub async fn stop(mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        if let Store::Memory(store) = &self.store {
            let (store, clock) = (store.clone(), self.clock.clone());
            let _ = tokio::task::spawn_blocking(move || store.save_state(clock.now_ms())).await;
        }
    }
}

impl Drop for Upkeep {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Writes the state file every [`SAVE_EVERY`], the first time one period after start.
async fn save_every(store: Arc<MemoryStore>, clock: Clock) {
    let mut every = tokio::time::interval(SAVE_EVERY);
    every.set_missed_tick_behavior(MissedTickBehavior::Delay);
    every.tick().await;
    loop {
        every.tick().await;
        let (store, clock) = (store.clone(), clock.clone());
        let _ = tokio::task::spawn_blocking(move || store.save_state(clock.now_ms())).await;
    }
}

/// How often the Redis engine looks for a loss of the store's data
/// (`redis::reset`): every fourth ban sync, once a second.
const RESET_CHECK_EVERY: u32 = 4;

/// This replica's refusals out, the fleet's bans in, every [`SYNC_EVERY`]; a look
/// for a loss of the store's data every [`RESET_CHECK_EVERY`] of those (the first
/// at start, which notes what the store holds).
async fn sync_every(store: Arc<Fallback>, clock: Clock, on_ban: impl Fn(&Ban)) {
    let mut every = tokio::time::interval(SYNC_EVERY);
    every.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut ticks = 0u32;
    loop {
        every.tick().await;
        if ticks.is_multiple_of(RESET_CHECK_EVERY) {
            store.check_reset(clock.now_ms()).await;
        }
        ticks = ticks.wrapping_add(1);
        store.sync_bans(clock.now_ms(), &on_ban).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{Now, Report, Window, quota};
    use crate::store::Verdict;

    fn stateful(path: &std::path::Path) -> Store {
        let store = MemoryStore::new(10, Some(path.to_path_buf()));
        store.restore_state(1_000);
        Store::Memory(Arc::new(store))
    }

    async fn decide(store: &Store, ms: u64) -> Verdict {
        let scope = store.scope("p", "anonymous", vec![quota(Window::Minute, 1)], &[]);
        let mut report = Report::default();
        store
            .decide(&scope, 7, &Now::sliding(ms), 1, &mut report)
            .await
    }

    #[tokio::test]
    async fn stopping_a_memory_store_writes_its_state_file_one_last_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sluice.state");
        let store = stateful(&path);
        let (clock, _) = Clock::manual(1_000);
        let upkeep = store.start(&clock, |_| {});
        assert_eq!(decide(&store, 1_000).await, Verdict::Admitted);
        assert!(!path.exists(), "written before its first period");
        upkeep.stop().await;
        assert!(path.exists(), "not written when stopped");

        // A store that reads it back finds the caller's minute spent.
        let restarted = stateful(&path);
        assert_eq!(decide(&restarted, 2_000).await, Verdict::Limited);
        assert_eq!(decide(&restarted, 61_000).await, Verdict::Admitted);
    }

    #[tokio::test]
    async fn a_memory_store_without_a_state_file_has_nothing_to_run() {
        let (clock, _) = Clock::manual(1_000);
        let upkeep = Store::memory(10).start(&clock, |_| {});
        assert!(upkeep.task.is_none());
        upkeep.stop().await;
    }
}
