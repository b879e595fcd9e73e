//! The Redis store: one limit shared by every replica, decided atomically in Redis.
//!
//! Each request is decided by one Lua script run (`limit.lua`, sent as EVALSHA and
//! loaded again after NOSCRIPT; requests waiting together share a run, see
//! [`super::batch`]) that prunes, checks and counts the caller's windows and the
//! policy's total all or nothing, using Redis's `TIME`, so replicas with skewed clocks
//! agree. Keys carry a TTL and a hash tag, so one request's keys share a Redis
//! Cluster slot: the policy when it has a `total` (caller and total must be together),
//! else the policy, plan and caller. Connections are multiplexed and pipelined
//! (redis-rs `ConnectionManager`, reconnecting by itself); no lock is held across a
//! round trip.
//!
//! Faults: every call has a short timeout. After [`TRIP_AFTER`] failures in a row a
//! circuit breaker opens and requests stop waiting on Redis for [`OPEN_FOR_MS`]; then
//! one request probes, and success closes it. While open, `on_error` decides: `local`
//! counts in this replica's memory store (the same algorithm, but every replica
//! enforces the limits on its own, so a fleet of N admits up to N times a `total`),
//! `allow` admits, `deny` refuses with 503.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, oneshot};

use super::batch::{self, Job, Shape};

use super::memory::MemoryStore;
use super::{CallerKey, Counters, Verdict};
use crate::config::OnError;
use crate::limit::{CalendarDay, LimitStatus, Now, Quota, Report, Window};

/// Consecutive failures that open the breaker.
pub const TRIP_AFTER: u32 = 3;
/// How long an open breaker keeps requests away from Redis before a probe.
pub const OPEN_FOR_MS: u64 = 1_000;

/// The Lua script, loaded once per Redis and called by its SHA-1.
static SCRIPT: &str = include_str!("limit.lua");

/// Where a (policy, plan)'s counters live in Redis.
#[derive(Debug, Clone)]
pub struct RedisKeys {
    /// Everything before the caller in the caller's key.
    caller_prefix: String,
    /// Everything after the caller (the closing brace of a per-caller hash tag).
    caller_suffix: &'static str,
    /// The policy's total, when it has one; shared by every request's batch job.
    total: Option<Arc<str>>,
    /// The quotas as the script reads them, for requests without calendar days.
    shape: Arc<Shape>,
}

impl RedisKeys {
    pub fn new(policy: &str, plan: &str, quotas: &[Quota], total: &[Quota]) -> RedisKeys {
        let shape = Arc::new(shape(quotas, total, None));
        let (policy, plan) = (short_hash(policy), short_hash(plan));
        if total.is_empty() {
            RedisKeys {
                caller_prefix: format!("sluice:{{{policy}:{plan}:"),
                caller_suffix: "}",
                total: None,
                shape,
            }
        } else {
            RedisKeys {
                caller_prefix: format!("sluice:{{{policy}}}:{plan}:"),
                caller_suffix: "",
                total: Some(format!("sluice:{{{policy}}}:total").into()),
                shape,
            }
        }
    }

    pub fn caller(&self, caller: CallerKey) -> String {
        format!("{}{caller:016x}{}", self.caller_prefix, self.caller_suffix)
    }
}

/// A request's quotas (the caller's plan, then the policy's total) and, with calendar
/// days, yesterday, today and tomorrow: whichever holds Redis's clock.
fn shape(plan: &[Quota], total: &[Quota], calendar: Option<CalendarDay>) -> Shape {
    let days = if calendar.is_some() { 3 } else { 0 };
    let mut shape = Shape::new(plan.len(), total.len(), days);
    for quota in plan.iter().chain(total) {
        let (slot, bucket_ms) = match (quota.window, calendar) {
            (Window::Day, Some(_)) => (4, 0),
            (window, _) if Window::is_exact(quota.limit.get()) => (window as u8, 1),
            (window, _) => (window as u8, window.bucket_ms() as u32),
        };
        shape.quota(slot, quota.limit.get(), bucket_ms);
    }
    if let Some(day) = calendar {
        shape.day(day.index.saturating_sub(1), 0, day.starts_ms);
        shape.day(day.index, day.starts_ms, day.ends_ms);
        shape.day(day.index + 1, day.ends_ms, day.ends_ms + 2 * 86_400_000);
    }
    shape
}

/// Names in keys are hashed: short, and free of `{` and `}`.
fn short_hash(name: &str) -> String {
    hex::encode(&Sha256::digest(name.as_bytes())[..6])
}

#[derive(Debug, Default)]
struct Breaker {
    failures: AtomicU32,
    /// Local ms until which Redis is not asked; 0 = closed.
    open_until_ms: AtomicU64,
    probing: AtomicBool,
}

impl Breaker {
    /// Whether this request may ask Redis.
    fn permits(&self, now_ms: u64) -> bool {
        let until = self.open_until_ms.load(Ordering::Relaxed);
        until == 0 || (now_ms >= until && !self.probing.swap(true, Ordering::AcqRel))
    }

    fn succeeded(&self) {
        self.failures.store(0, Ordering::Relaxed);
        self.open_until_ms.store(0, Ordering::Relaxed);
        self.probing.store(false, Ordering::Release);
    }

    fn failed(&self, now_ms: u64) {
        let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if failures >= TRIP_AFTER || self.probing.load(Ordering::Acquire) {
            self.open_until_ms
                .store(now_ms + OPEN_FOR_MS, Ordering::Relaxed);
        }
        self.probing.store(false, Ordering::Release);
    }

    fn is_open(&self) -> bool {
        self.open_until_ms.load(Ordering::Relaxed) != 0
    }
}

pub struct RedisStore {
    connection: ConnectionManager,
    script: redis::Script,
    timeout: Duration,
    on_error: OnError,
    /// Counts while Redis is unreachable and `on_error = "local"`.
    pub(crate) local: MemoryStore,
    breaker: Breaker,
    errors: AtomicU64,
    /// The queue of the task that sends decisions in batches; started on first use.
    batcher: OnceLock<mpsc::UnboundedSender<Job>>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("timeout", &self.timeout)
            .field("on_error", &self.on_error)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// A store for `url`; connects lazily, so a Redis that is down at start is a
    /// fault like any other, not a failure to start.
    pub fn new(
        url: &str,
        timeout: Duration,
        on_error: OnError,
        max_keys: usize,
    ) -> redis::RedisResult<RedisStore> {
        let client = redis::Client::open(url)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout.max(Duration::from_millis(200))))
            .set_response_timeout(Some(timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(500));
        let connection = ConnectionManager::new_lazy_with_config(client, config)?;
        Ok(RedisStore {
            connection,
            script: redis::Script::new(SCRIPT),
            timeout,
            on_error,
            local: MemoryStore::new(max_keys),
            breaker: Breaker::default(),
            errors: AtomicU64::new(0),
            batcher: OnceLock::new(),
        })
    }

    /// Errors talking to Redis since start.
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    /// Whether requests are currently decided by `on_error` instead of Redis.
    pub fn in_fallback(&self) -> bool {
        self.breaker.is_open()
    }

    pub fn on_error(&self) -> OnError {
        self.on_error
    }

    pub async fn decide(
        &self,
        counters: &Counters,
        keys: &RedisKeys,
        caller: CallerKey,
        now: &Now,
        cost: u32,
        report: &mut Report,
    ) -> Verdict {
        if self.breaker.permits(now.ms) {
            match self.call(counters, keys, caller, now, cost, report).await {
                Ok(verdict) => {
                    self.breaker.succeeded();
                    return verdict;
                }
                Err(err) => {
                    self.errors.fetch_add(1, Ordering::Relaxed);
                    self.breaker.failed(now.ms);
                    tracing::warn!(error = %err, on_error = ?self.on_error, "redis store call failed");
                    *report = Report::default();
                }
            }
        }
        match self.on_error {
            OnError::Local => self.local.decide(counters, caller, now, cost, report),
            OnError::Allow => Verdict::Admitted,
            OnError::Deny => Verdict::Unavailable,
        }
    }

    /// Forgets a caller's counters in Redis (and locally).
    pub async fn reset(&self, counters: &Counters, keys: &RedisKeys, caller: CallerKey) -> bool {
        let local = self.local.reset(counters, caller);
        let mut connection = self.connection.clone();
        let deleted = tokio::time::timeout(
            self.timeout,
            redis::cmd("DEL")
                .arg(keys.caller(caller))
                .query_async::<u64>(&mut connection),
        )
        .await;
        matches!(deleted, Ok(Ok(n)) if n > 0) || local
    }

    /// The caller's counters as Redis has them, counting nothing (cost 0); the local
    /// fallback's when Redis cannot be asked.
    pub async fn peek(
        &self,
        counters: &Counters,
        keys: &RedisKeys,
        caller: CallerKey,
        now: &Now,
        report: &mut Report,
    ) {
        match self.call(counters, keys, caller, now, 0, report).await {
            Ok(_) => {}
            Err(_) => {
                *report = Report::default();
                self.local.peek(counters, caller, now, report);
            }
        }
    }

    /// Whether Redis answers a PING now.
    pub async fn ping(&self) -> bool {
        let mut connection = self.connection.clone();
        let pong = tokio::time::timeout(
            self.timeout,
            redis::cmd("PING").query_async::<String>(&mut connection),
        )
        .await;
        matches!(pong, Ok(Ok(_)))
    }

    async fn call(
        &self,
        counters: &Counters,
        keys: &RedisKeys,
        caller: CallerKey,
        now: &Now,
        cost: u32,
        report: &mut Report,
    ) -> Result<Verdict, String> {
        let total = counters.total_quotas();
        let shape = match now.calendar {
            None => keys.shape.clone(),
            Some(_) => Arc::new(shape(&counters.quotas, total, now.calendar)),
        };
        let (answer_to, answer) = oneshot::channel();
        let job = Job {
            caller: keys.caller(caller),
            total: (!total.is_empty()).then(|| keys.total.clone()).flatten(),
            cost,
            shape,
            answer_to,
        };
        let jobs = self.batcher.get_or_init(|| {
            batch::spawn(self.connection.clone(), self.script.clone(), self.timeout)
        });
        jobs.send(job)
            .map_err(|_| "the redis batcher has stopped".to_string())?;
        let answer = tokio::time::timeout(self.timeout, answer)
            .await
            .map_err(|_| format!("no answer within {:?}", self.timeout))?
            .map_err(|_| "the redis batcher dropped the request".to_string())??;
        let admitted = answer.first().copied() == Some(1);
        let quotas = counters
            .quotas
            .iter()
            .map(|q| (q, false))
            .chain(total.iter().map(|q| (q, true)));
        for ((quota, is_total), values) in
            quotas.zip(answer.get(2..).unwrap_or(&[]).chunks_exact(3))
        {
            let [used, reset, retry] = values else { break };
            report.push(LimitStatus {
                quota: *quota,
                total: is_total,
                used: u32::try_from(*used).unwrap_or(u32::MAX),
                reset_ms: u64::try_from(*reset).unwrap_or(0),
                retry_ms: u64::try_from(*retry).ok(),
            });
        }
        Ok(if admitted {
            Verdict::Admitted
        } else {
            Verdict::Limited
        })
    }
}
