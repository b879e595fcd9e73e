//! Concurrency caps: at most `max` requests of a policy's routes served at once, the
//! next `queue` waiting in arrival order for at most `queue_timeout`, and at most
//! `per_caller` of one caller at once.
//!
//! A [`Cap`] belongs to a policy name and outlives config snapshots, like the
//! counters: a reload that changes `max` keeps the requests in flight, new admissions
//! use the new numbers, and permits taken under the old `max` are released correctly
//! (a shrink that finds permits in use is owed, and paid back as they come home). A
//! [`Permit`] is a guard: the response body holds it until its last byte is sent or
//! the client goes away, and dropping it is the only way a slot comes back, so none can
//! leak. Waiting is tokio's semaphore, which is fair (first come, first served) and
//! cancel-safe: a request whose client goes away while it waits leaves the queue.
//! The caps are per replica; this module decides nothing about rates.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use prometheus::{Histogram, IntGauge};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::clock::Stopwatch;
use crate::config::ConcurrencyConfig;
use crate::observe::metrics::Metrics;
use crate::store::CallerKey;

/// Shards of the per-caller counts: callers of one policy rarely share a lock.
const CALLER_SHARDS: usize = 16;

/// Why a request did not get a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NoSlot {
    /// The caller already has `per_caller` requests in flight on the policy (429).
    PerCaller {
        /// The policy's `per_caller`.
        limit: u32,
    },
    /// Every slot is taken and the queue is full (503).
    QueueFull {
        /// `Retry-After`: the policy's `queue_timeout` rounded up to whole seconds, at
        /// least 1.
        retry_after_secs: u64,
    },
    /// The request waited `queue_timeout` without getting a slot (503).
    TimedOut {
        /// `Retry-After`: the policy's `queue_timeout` rounded up to whole seconds, at
        /// least 1.
        retry_after_secs: u64,
    },
}

/// Every policy's cap, kept across config snapshots.
#[derive(Debug, Default)]
pub(crate) struct Caps {
    by_policy: Mutex<HashMap<String, Arc<Cap>>>,
}

impl Caps {
    /// The caps of `policies` (name and settings; `None` for a policy without a
    /// cap), reusing and reconfiguring the cap of every policy already known; caps
    /// of policies no longer listed are dropped here (requests in flight keep theirs).
    pub(crate) fn resolve<'a>(
        &self,
        policies: impl IntoIterator<Item = (&'a str, Option<&'a ConcurrencyConfig>)>,
        metrics: &Metrics,
    ) -> Vec<Option<Arc<Cap>>> {
        let mut by_policy = self.by_policy.lock();
        let mut kept = HashMap::with_capacity(by_policy.len());
        let resolved = policies
            .into_iter()
            .map(|(name, config)| {
                let config = config?;
                metrics.set_queue_limit(name, config.queue);
                let cap = match by_policy.get(name) {
                    Some(cap) => {
                        cap.reconfigure(config);
                        cap.clone()
                    }
                    None => Arc::new(Cap::new(config, metrics, name)),
                };
                kept.insert(name.to_string(), cap.clone());
                Some(cap)
            })
            .collect();
        *by_policy = kept;
        resolved
    }
}

/// One policy's cap.
#[derive(Debug)]
pub struct Cap {
    slots: Arc<Semaphore>,
    /// `max` as last configured.
    max: AtomicU32,
    queue: AtomicU32,
    queue_timeout_ms: AtomicU64,
    /// 0 = no per-caller cap.
    per_caller: AtomicU32,
    /// Slots owed after `max` shrank while they were in use: a returning permit pays
    /// one off instead of going back to the semaphore.
    debt: AtomicU32,
    /// Requests waiting for a slot right now.
    waiting: AtomicU32,
    /// Requests in flight per caller, for `per_caller`.
    callers: Box<[Mutex<HashMap<CallerKey, u32>>]>,
    /// Serialises reconfigurations (reloads), never taken on the request path.
    resizing: Mutex<()>,
    depth: IntGauge,
    waited: Histogram,
}

impl Cap {
    fn new(config: &ConcurrencyConfig, metrics: &Metrics, policy: &str) -> Cap {
        let (depth, waited) = metrics.queue(policy);
        let cap = Cap {
            slots: Arc::new(Semaphore::new(config.max.get() as usize)),
            max: AtomicU32::new(config.max.get()),
            queue: AtomicU32::new(0),
            queue_timeout_ms: AtomicU64::new(0),
            per_caller: AtomicU32::new(0),
            debt: AtomicU32::new(0),
            waiting: AtomicU32::new(0),
            callers: (0..CALLER_SHARDS).map(|_| Mutex::default()).collect(),
            resizing: Mutex::new(()),
            depth,
            waited,
        };
        cap.reconfigure(config);
        cap
    }

    /// Applies new settings; in-flight permits stay valid.
    fn reconfigure(&self, config: &ConcurrencyConfig) {
        let _resizing = self.resizing.lock();
        let (old, new) = (self.max.load(Ordering::Relaxed), config.max.get());
        if new > old {
            let grow = new - old;
            let paid = self
                .debt
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |d| {
                    Some(d.saturating_sub(grow))
                })
                .map_or(0, |d| d.min(grow));
            self.slots.add_permits((grow - paid) as usize);
        } else if new < old {
            let shrink = old - new;
            let forgotten = self.slots.forget_permits(shrink as usize) as u32;
            self.debt.fetch_add(shrink - forgotten, Ordering::AcqRel);
        }
        self.max.store(new, Ordering::Relaxed);
        self.queue.store(config.queue, Ordering::Relaxed);
        let timeout_ms = u64::try_from(config.queue_timeout.as_millis()).unwrap_or(u64::MAX);
        self.queue_timeout_ms.store(timeout_ms, Ordering::Relaxed);
        let per_caller = config.per_caller.map_or(0, |n| n.get());
        self.per_caller.store(per_caller, Ordering::Relaxed);
    }

    /// The per-caller cap, if the policy has one.
    pub(crate) fn per_caller(&self) -> Option<u32> {
        Some(self.per_caller.load(Ordering::Relaxed)).filter(|&n| n > 0)
    }

    /// A slot for a request of `caller`: at once, after waiting in the queue, or not.
    pub(crate) async fn acquire(self: &Arc<Self>, caller: CallerKey) -> Result<Permit, NoSlot> {
        let mut permit = Permit {
            cap: self.clone(),
            slot: None,
            caller: None,
            queued: false,
            also: Vec::new(),
        };
        if let Some(limit) = self.per_caller() {
            let mut callers = self.callers[shard_of(caller)].lock();
            let count = callers.entry(caller).or_default();
            if *count >= limit {
                if *count == 0 {
                    callers.remove(&caller);
                }
                return Err(NoSlot::PerCaller { limit });
            }
            *count += 1;
            permit.caller = Some(caller);
        }
        if let Ok(slot) = self.slots.clone().try_acquire_owned() {
            permit.slot = Some(slot);
            return Ok(permit);
        }
        let timeout = Duration::from_millis(self.queue_timeout_ms.load(Ordering::Relaxed));
        let retry_after_secs = timeout.as_secs_f64().ceil().max(1.0) as u64;
        let queue = self.queue.load(Ordering::Relaxed);
        let admitted = self
            .waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < queue).then_some(n + 1)
            })
            .is_ok();
        if !admitted {
            return Err(NoSlot::QueueFull { retry_after_secs });
        }
        let waiting = Waiting::enter(self);
        let waited = tokio::time::timeout(timeout, self.slots.clone().acquire_owned()).await;
        drop(waiting);
        match waited {
            Ok(Ok(slot)) => {
                permit.slot = Some(slot);
                permit.queued = true;
                Ok(permit)
            }
            // The semaphore is never closed; a timeout is the only other way out.
            Ok(Err(_)) | Err(_) => Err(NoSlot::TimedOut { retry_after_secs }),
        }
    }

    /// Requests it serves at once (`max`).
    pub fn max(&self) -> u32 {
        self.max.load(Ordering::Relaxed)
    }

    /// Requests that may wait for a slot (`queue`).
    pub fn queue(&self) -> u32 {
        self.queue.load(Ordering::Relaxed)
    }

    /// Slots free right now (for tests, metrics and the status page).
    pub fn available(&self) -> usize {
        self.slots.available_permits()
    }

    /// Requests waiting right now.
    pub fn waiting(&self) -> u32 {
        self.waiting.load(Ordering::Relaxed)
    }
}

fn shard_of(caller: CallerKey) -> usize {
    (caller.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 60) as usize % CALLER_SHARDS
}

/// A request in the queue: counted in `waiting` and the depth gauge while it waits,
/// however the wait ends (a slot, the timeout, or the client going away).
struct Waiting<'a> {
    cap: &'a Cap,
    since: Stopwatch,
}

impl<'a> Waiting<'a> {
    fn enter(cap: &'a Cap) -> Waiting<'a> {
        cap.depth.inc();
        Waiting {
            cap,
            since: Stopwatch::start(),
        }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.cap.waiting.fetch_sub(1, Ordering::AcqRel);
        self.cap.depth.dec();
        self.cap.waited.observe(self.since.elapsed_secs());
    }
}

/// A request's place under a cap; the slot (and the caller's share) comes back when
/// it is dropped.
#[derive(Debug)]
pub(crate) struct Permit {
    cap: Arc<Cap>,
    slot: Option<OwnedSemaphorePermit>,
    caller: Option<CallerKey>,
    /// The request waited in the queue for its slot.
    queued: bool,
    /// The request's places under the caps of a stacked route's other policies,
    /// given back with this one.
    also: Vec<Permit>,
}

impl Permit {
    /// Whether the request waited in the queue before it got its slot.
    pub(crate) fn queued(&self) -> bool {
        self.queued
    }

    /// Holds `other` (a place under another policy's cap, on a route of several
    /// policies) until this permit is dropped.
    pub(crate) fn hold_also(&mut self, other: Permit) {
        self.also.push(other);
    }

    /// How many more requests the caller may have in flight now (with `per_caller`).
    pub(crate) fn caller_remaining(&self) -> Option<u32> {
        let (caller, limit) = (self.caller?, self.cap.per_caller()?);
        let callers = self.cap.callers[shard_of(caller)].lock();
        Some(limit.saturating_sub(callers.get(&caller).copied().unwrap_or(0)))
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            let owed = self
                .cap
                .debt
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |d| d.checked_sub(1))
                .is_ok();
            if owed {
                slot.forget();
            }
        }
        if let Some(caller) = self.caller {
            let mut callers = self.cap.callers[shard_of(caller)].lock();
            if let Some(count) = callers.get_mut(&caller) {
                *count -= 1;
                if *count == 0 {
                    callers.remove(&caller);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use super::*;

    fn config(max: u32, queue: u32, per_caller: u32) -> ConcurrencyConfig {
        ConcurrencyConfig {
            max: NonZeroU32::new(max).unwrap(),
            queue,
            queue_timeout: Duration::from_millis(200),
            per_caller: NonZeroU32::new(per_caller),
        }
    }

    fn cap(config: &ConcurrencyConfig) -> (Caps, Arc<Cap>) {
        let caps = Caps::default();
        let cap = caps.resolve([("p", Some(config))], &Metrics::default())[0]
            .clone()
            .unwrap();
        (caps, cap)
    }

    #[tokio::test]
    async fn max_in_flight_then_a_fifo_queue_then_refusals() {
        let (_caps, cap) = cap(&config(2, 2, 0));
        let a = cap.acquire(1).await.unwrap();
        let _b = cap.acquire(2).await.unwrap();
        // Two wait, in order; the third finds the queue full.
        let first = tokio::spawn({
            let cap = cap.clone();
            async move { cap.acquire(3).await.map(|_| 3) }
        });
        tokio::task::yield_now().await;
        let second = tokio::spawn({
            let cap = cap.clone();
            async move { cap.acquire(4).await.map(|p| (4, p)) }
        });
        tokio::task::yield_now().await;
        while cap.waiting() < 2 {
            tokio::task::yield_now().await;
        }
        assert!(matches!(
            cap.acquire(5).await,
            Err(NoSlot::QueueFull { .. })
        ));
        drop(a);
        assert_eq!(first.await.unwrap(), Ok(3));
        // The second got the slot the first gave back; nobody waits any more.
        let (who, _permit) = second.await.unwrap().unwrap();
        assert_eq!(who, 4);
        assert_eq!(cap.waiting(), 0);
    }

    #[tokio::test]
    async fn a_wait_longer_than_the_queue_timeout_is_refused_and_leaves_no_trace() {
        let (_caps, cap) = cap(&config(1, 5, 0));
        let held = cap.acquire(1).await.unwrap();
        assert!(matches!(
            cap.acquire(2).await,
            Err(NoSlot::TimedOut {
                retry_after_secs: 1
            })
        ));
        assert_eq!(cap.waiting(), 0);
        drop(held);
        assert_eq!(cap.available(), 1);
    }

    #[tokio::test]
    async fn a_cancelled_wait_leaves_the_queue_and_frees_nothing_twice() {
        let (_caps, cap) = cap(&config(1, 5, 0));
        let held = cap.acquire(1).await.unwrap();
        let waiting = tokio::spawn({
            let cap = cap.clone();
            async move { cap.acquire(2).await.map(drop) }
        });
        while cap.waiting() < 1 {
            tokio::task::yield_now().await;
        }
        waiting.abort();
        let _ = waiting.await;
        assert_eq!(cap.waiting(), 0);
        drop(held);
        assert_eq!(cap.available(), 1);
    }

    #[tokio::test]
    async fn per_caller_counts_each_caller_separately() {
        let (_caps, cap) = cap(&config(10, 0, 2));
        let a1 = cap.acquire(7).await.unwrap();
        let a2 = cap.acquire(7).await.unwrap();
        assert_eq!(a2.caller_remaining(), Some(0));
        assert_eq!(
            cap.acquire(7).await.unwrap_err(),
            NoSlot::PerCaller { limit: 2 }
        );
        let b = cap.acquire(8).await.unwrap();
        assert_eq!(b.caller_remaining(), Some(1));
        drop(a1);
        let again = cap.acquire(7).await.unwrap();
        drop((a2, again, b));
        assert!(cap.callers.iter().all(|shard| shard.lock().is_empty()));
        assert_eq!(cap.available(), 10);
    }

    #[tokio::test]
    async fn a_reload_that_shrinks_max_under_load_pays_back_and_one_that_grows_adds() {
        let caps = Caps::default();
        let metrics = Metrics::default();
        let cap = caps.resolve([("p", Some(&config(4, 0, 0)))], &metrics)[0]
            .clone()
            .unwrap();
        let held: Vec<_> = futures_join(&cap, 4).await;
        // Shrink to 2 with all 4 in use: two are owed.
        caps.resolve([("p", Some(&config(2, 0, 0)))], &metrics);
        let mut held = held.into_iter();
        drop(held.next());
        assert_eq!(cap.available(), 0, "the first returning permit pays a debt");
        drop(held.next());
        assert_eq!(cap.available(), 0, "so does the second");
        drop(held.next());
        assert_eq!(cap.available(), 1, "then slots come back under the new max");
        drop(held.next());
        assert_eq!(cap.available(), 2);
        // Grow to 5: three more.
        caps.resolve([("p", Some(&config(5, 0, 0)))], &metrics);
        assert_eq!(cap.available(), 5);
        // Shrink while idle: forgotten at once.
        caps.resolve([("p", Some(&config(1, 0, 0)))], &metrics);
        assert_eq!(cap.available(), 1);
    }

    async fn futures_join(cap: &Arc<Cap>, n: u64) -> Vec<Permit> {
        let mut held = Vec::new();
        for caller in 0..n {
            held.push(cap.acquire(caller).await.unwrap());
        }
        held
    }
}
