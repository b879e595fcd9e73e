//! ns per limiter decision: sluice's memory store against governor's keyed limiter
//! (a GCRA), on the same workloads, in the same run.
//!
//! Workloads: one hot key; 1 000 000 distinct keys visited round robin; two threads
//! contending on one key. Both limiters read their clock once per decision (sluice's
//! system clock; governor's default quanta clock) and use a quota of 100 per minute.
//!
//! The 1 M-key group has a third contender, `minimal_log`: the least any exact sliding
//! log can do per decision, one per-minute log of `u32` milliseconds per key in the
//! same kind of sharded table, and nothing else (no other windows, no report, no memo
//! of refused callers). It is the yardstick for how much of sluice's time the
//! sliding log itself costs on this workload.
//!
//! `clock_read` prices the clock read that each decision includes.
//!
//! Run: `cargo bench --bench limiter`

#![allow(clippy::unwrap_used)] // a benchmark fails by panicking

use std::hash::BuildHasher;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use futures_util::FutureExt;
use governor::{Quota as GQuota, RateLimiter};
use hashbrown::HashTable;
use parking_lot::Mutex;
use sluice::clock::Clock;
use sluice::limit::{Now, Report, Window, quota};
use sluice::store::{Scope, Store};

const LIMIT: u32 = 100;
const KEYS: u64 = 1_000_000;

fn sluice_limiter() -> (Store, Scope) {
    let store = Store::memory(2_000_000);
    let counters = store.scope(
        "bench",
        "anonymous",
        vec![quota(Window::Minute, LIMIT)],
        &[],
    );
    (store, counters)
}

fn governor_limiter() -> governor::DefaultKeyedRateLimiter<u64> {
    RateLimiter::keyed(GQuota::per_minute(NonZeroU32::new(LIMIT).unwrap()))
}

fn decide(store: &Store, counters: &Scope, clock: &Clock, key: u64) -> bool {
    let now = Now::sliding(clock.now_ms());
    let mut report = Report::default();
    let verdict = store
        .decide(counters, key, &now, 1, &mut report)
        .now_or_never();
    verdict == Some(sluice::store::Verdict::Admitted)
}

/// A key and the milliseconds of its admitted requests, oldest first.
type KeyLog = (u64, Vec<u32>);

/// The minimal exact sliding log.
struct MinimalLog {
    shards: Vec<Mutex<HashTable<KeyLog>>>,
    hasher: foldhash::fast::RandomState,
}

impl MinimalLog {
    const WINDOW_MS: u32 = 60_000;

    fn new() -> MinimalLog {
        MinimalLog {
            shards: (0..64).map(|_| Mutex::new(HashTable::new())).collect(),
            hasher: foldhash::fast::RandomState::default(),
        }
    }

    fn decide(&self, clock: &Clock, key: u64) -> bool {
        let now = clock.now_ms() as u32;
        let hash = self.hasher.hash_one(key);
        let mut shard = self.shards[(hash >> 32) as usize % 64].lock();
        let log = match shard.find_mut(hash, |(k, _)| *k == key) {
            Some((_, log)) => log,
            None => {
                let entry =
                    shard.insert_unique(hash, (key, Vec::new()), |(k, _)| self.hasher.hash_one(k));
                &mut entry.into_mut().1
            }
        };
        let expired = log
            .iter()
            .take_while(|&&ms| now.wrapping_sub(ms) >= Self::WINDOW_MS)
            .count();
        log.drain(..expired);
        let admit = log.len() < LIMIT as usize;
        if admit {
            log.push(now);
        }
        admit
    }
}

fn hot_key(c: &mut Criterion) {
    let mut group = c.benchmark_group("hot_key");
    let (store, counters) = sluice_limiter();
    let clock = Clock::system();
    group.bench_function("sluice", |b| {
        b.iter(|| decide(&store, &counters, &clock, black_box(7)))
    });
    let governor = governor_limiter();
    group.bench_function("governor", |b| {
        b.iter(|| governor.check_key(&black_box(7)).is_ok())
    });
    group.finish();
}

fn million_keys(c: &mut Criterion) {
    let mut group = c.benchmark_group("keys_1m");
    let (store, counters) = sluice_limiter();
    let clock = Clock::system();
    for key in 0..KEYS {
        decide(&store, &counters, &clock, key);
    }
    let mut key = 0u64;
    group.bench_function("sluice", |b| {
        b.iter(|| {
            key = (key + 7_919) % KEYS;
            decide(&store, &counters, &clock, black_box(key))
        })
    });
    let governor = governor_limiter();
    for key in 0..KEYS {
        let _ = governor.check_key(&key);
    }
    group.bench_function("governor", |b| {
        b.iter(|| {
            key = (key + 7_919) % KEYS;
            governor.check_key(&black_box(key)).is_ok()
        })
    });
    drop(governor);
    let minimal = MinimalLog::new();
    for key in 0..KEYS {
        minimal.decide(&clock, key);
    }
    group.bench_function("minimal_log", |b| {
        b.iter(|| {
            key = (key + 7_919) % KEYS;
            minimal.decide(&clock, black_box(key))
        })
    });
    group.finish();
}

/// Runs `decision` on two threads at once for `iters` decisions each; the time per
/// decision is wall time divided by the iterations of one thread.
fn contended(iters: u64, decision: Arc<dyn Fn() + Send + Sync>) -> Duration {
    let start = Instant::now();
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let decision = decision.clone();
            std::thread::spawn(move || {
                for _ in 0..iters {
                    decision();
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("bench thread");
    }
    start.elapsed()
}

fn two_threads(c: &mut Criterion) {
    let mut group = c.benchmark_group("contended_2_threads");
    let (store, counters) = sluice_limiter();
    let clock = Clock::system();
    let sluice = Arc::new(move || {
        black_box(decide(&store, &counters, &clock, 7));
    });
    group.bench_function("sluice", |b| {
        b.iter_custom(|iters| contended(iters, sluice.clone()))
    });
    let governor = Arc::new(governor_limiter());
    let governor = Arc::new(move || {
        black_box(governor.check_key(&7).is_ok());
    });
    group.bench_function("governor", |b| {
        b.iter_custom(|iters| contended(iters, governor.clone()))
    });
    group.finish();
}

/// What one clock read costs: sluice's TSC-anchored clock against reading the system
/// clock (`SystemTime::now`, a vDSO call) each time, which a decision would otherwise do.
fn clock_read(c: &mut Criterion) {
    let mut group = c.benchmark_group("clock_read");
    let clock = Clock::system();
    group.bench_function("sluice", |b| b.iter(|| black_box(clock.now_ms())));
    #[allow(clippy::disallowed_methods)]
    group.bench_function("system_time", |b| {
        b.iter(|| {
            black_box(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64),
            )
        })
    });
    group.finish();
}

criterion_group!(benches, hot_key, million_keys, two_threads, clock_read);
criterion_main!(benches);
