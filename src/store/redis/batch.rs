//! Coalescing Redis decisions: the requests waiting at one moment go to Redis as one
//! script call.
//!
//! Redis spends most of a small script's cost on running a script at all (argument
//! tables, the call, `TIME`, the reply), not on the few hash commands a decision
//! needs. A batcher task owns a queue: it takes every decision waiting, up to
//! [`MAX_BATCH`], and sends them as one `EVALSHA`, which decides them one after the
//! other, atomically; up to [`IN_FLIGHT`] such calls per batcher are pipelined on
//! the store's one connection (on a Redis Cluster, per batcher and master). Under light load a batch is one request and costs what
//! it did alone; under heavy load the batches grow and Redis's cost per decision falls.
//!
//! Each runtime that decides has a batcher of its own (each worker's, and each thread
//! of a multi-threaded one), found through a thread-local table by store and runtime,
//! without a lock: the requests one pass of a worker's scheduler makes ready join one
//! batch without crossing threads. The call itself is made on the engine's thread
//! ([`super::link`]), which owns the connection, and its answer comes back as one
//! message, handed out here. A batcher ends with its runtime; the store does not: a
//! decision on any other runtime starts that runtime's batcher. One batcher on the
//! engine's thread, fed by every worker, costs a third more CPU per request, because
//! every decision then crosses threads on its own and batches stay small
//! (`docs/fleet.md`, "Where the batcher runs").
//!
//! A batch mixes callers, so its keys span Redis Cluster slots. One server (or a
//! Sentinel-named master) takes the batch as one call. On a Redis Cluster the batch
//! is split by master (the slot map of [`super::shards`]): one call per master, all
//! sent at once on the engine's own connection to each master (as to one server),
//! each declaring only its first key and carrying the rest in its arguments, with the
//! script's `allow-cross-slot-keys` flag (a part of one hash tag declares its keys as
//! usual). The calls in flight are counted per master: a master that is frozen holds
//! its own slots' requests while its calls wait for their timeout, never another
//! master's (`super::spread`). Every key of one request shares its caller's hash
//! tag (see `super`). If
//! the map was stale (a slot moved), the master refuses the call before the script
//! writes anything (`MOVED`, `ASK`, or a key it does not serve); the map is read
//! again and that part is sent split by hash tag, one call per tag with all its keys
//! declared, through the cluster connection, which routes and redirects it.

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, LazyLock};
use std::time::Instant;

use tokio::runtime;
use tokio::sync::{Semaphore, mpsc, oneshot};

use super::deadline;
use super::link::{Link, Master};
use super::spread;
use crate::store::StoreError;

/// The Lua script, loaded once per Redis and called by its SHA-1; static, so that a
/// call built here can be sent to the engine's thread.
static SCRIPT: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("limit.lua")));

/// The same script allowed to touch keys of several slots of one Cluster node (Redis
/// 7 and Valkey): what one call per node needs.
static SPREAD_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(&format!(
        "#!lua flags=allow-cross-slot-keys\n{}",
        include_str!("limit.lua")
    ))
});

/// A batcher's queue, by store and by the runtime the batcher runs on.
type Queues = Vec<(u64, runtime::Id, mpsc::UnboundedSender<Job>)>;

thread_local! {
    /// The queues of the batchers this thread has sent jobs to.
    static BATCHERS: RefCell<Queues> = const { RefCell::new(Vec::new()) };
}

/// Decisions per script call at most.
pub const MAX_BATCH: usize = 128;
/// Script calls waiting for Redis at once at most, per batcher (and, on a Redis
/// Cluster, per master).
pub const IN_FLIGHT: usize = 2;
/// Scheduler passes a batch waits for more requests at most.
const MAX_PASSES: usize = 4;

/// One request's part of a batch.
pub struct Job {
    /// The caller's counters.
    pub caller: String,
    /// The policy's total counters, when the request has total quotas.
    pub total: Option<Arc<str>>,
    /// Requests to count (0 = only report).
    pub cost: u32,
    /// Set for a refund: the Redis instant (ms) the refunded request was admitted at,
    /// or [`NEWEST`] to take from the newest counts, whenever they were made.
    pub refund_at: Option<u64>,
    /// A charge: `cost` is counted whether or not it fits (a cost known after the
    /// response may take a caller into debt).
    pub charge: bool,
    /// The quotas and calendar days the request is decided against.
    pub shape: Arc<Shape>,
    /// Where the request's answer goes.
    pub answer_to: oneshot::Sender<Result<Answer, StoreError>>,
    /// A decision: when its caller stops waiting for it (the store timeout after
    /// it was queued); Redis counts nothing for it after that
    /// ([`super::deadline`]). `None`: a refund or a charge, which counts whenever
    /// Redis runs it.
    pub deadline: Option<Instant>,
    /// A stacked decision: the job's own key, total and shape are its first
    /// policy's, and these the others', decided with it all or nothing.
    pub stacked: Option<Stack>,
}

/// The policies of a stacked decision after its first.
pub struct Stack {
    /// The first policy is in shadow mode (its refusal refuses nothing).
    pub shadow: bool,
    /// The other policies, in order.
    pub members: Vec<Member>,
}

/// One policy of a stacked decision after its first: its key (under the first's
/// hash tag), its quotas, and whether it is in shadow mode. It has no total.
pub struct Member {
    /// Its counters' key.
    pub caller: String,
    /// Its quotas, calendar days and billing periods.
    pub shape: Arc<Shape>,
    /// It is in shadow mode (its refusal refuses nothing).
    pub shadow: bool,
}

/// The script's answer to one job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// Redis's clock when the batch ran, in ms.
    pub at_ms: u64,
    /// Whether the job's cost was counted.
    pub admitted: bool,
    /// Per quota checked: (used, reset ms, retry ms or -1).
    pub statuses: Vec<[i64; 3]>,
    /// A stacked decision: the quotas checked per policy, in order (their statuses
    /// follow one another in `statuses`); empty otherwise.
    pub parts: Vec<u8>,
}

/// The `admitted` of a decision Redis ran after its deadline.
const LATE: u8 = 2;
/// A refund's instant that takes from the newest counts (sent as -1).
pub const NEWEST: u64 = u64::MAX;
/// The cost bit that marks a refund in the packed requests.
const REFUND: u32 = 1 << 31;
/// The cost bit that marks a charge (counted even over a limit).
const CHARGE: u32 = 1 << 30;
/// The cost bit that marks a stacked decision (more policies follow the request).
const STACK: u32 = 1 << 29;

/// A request's quotas and calendar days, packed as the script reads them. Requests
/// of one policy and plan at one moment have equal shapes, sent once per batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape(Vec<u8>);

impl Shape {
    /// A shape for `plan` quotas of the caller, then `total` quotas of the policy,
    /// then `days` calendar days, then any billing periods; add them in that order.
    pub fn new(plan: usize, total: usize, days: usize) -> Shape {
        let mut bytes = Vec::with_capacity(4 + 9 * (plan + total) + 20 * days);
        bytes.extend([plan, total, days, 0].map(|n| u8::try_from(n).unwrap_or(u8::MAX)));
        Shape(bytes)
    }

    /// A quota: its runs slot (0-3 sliding, 4 calendar day, 5 month, 6 year), limit
    /// and bucket size (1 = exact milliseconds).
    pub fn quota(&mut self, slot: u8, limit: u32, bucket_ms: u32) {
        self.0.push(slot);
        self.0.extend(limit.to_le_bytes());
        self.0.extend(bucket_ms.to_le_bytes());
    }

    /// A calendar day and the local milliseconds it spans.
    pub fn day(&mut self, index: u32, starts_ms: u64, ends_ms: u64) {
        self.0.extend(index.to_le_bytes());
        self.0.extend((starts_ms as f64).to_le_bytes());
        self.0.extend((ends_ms as f64).to_le_bytes());
    }

    /// A billing period of `slot` (5 month, 6 year): when the period holding the
    /// gateway's clock starts and ends and when the next one ends, so the script
    /// counts in whichever holds Redis's clock.
    pub fn period(&mut self, slot: u8, starts_ms: u64, ends_ms: u64, next_ends_ms: u64) {
        self.0[3] = self.0[3].saturating_add(1);
        self.0.push(slot);
        for ms in [starts_ms, ends_ms, next_ends_ms] {
            self.0.extend((ms as f64).to_le_bytes());
        }
    }
}

/// Queues `job` with store `store`'s batcher on the runtime this runs on, starting
/// one there if it has none (the first decision there, or an ID reused after the
/// runtime of that ID ended).
pub fn send(store: u64, link: &Link, job: Job) -> Result<(), StoreError> {
    let runtime = runtime::Handle::try_current().map_err(|_| StoreError::Stopped)?;
    let here = runtime.id();
    BATCHERS.with_borrow_mut(|queues| {
        let mine = queues.iter().position(|q| q.0 == store && q.1 == here);
        let job = match mine {
            Some(at) => match queues[at].2.send(job) {
                Ok(()) => return Ok(()),
                Err(mpsc::error::SendError(job)) => job,
            },
            None => job,
        };
        // Queues of batchers whose runtime ended go with them.
        queues.retain(|q| !q.2.is_closed());
        let jobs = spawn(&runtime, link.clone());
        jobs.send(job).map_err(|_| StoreError::Stopped)?;
        queues.push((store, here, jobs));
        Ok(())
    })
}

/// Starts a batcher on `runtime`; it ends with the runtime (or this thread). On a
/// Redis Cluster, its calls in flight are counted per master ([`spread::batcher`]).
fn spawn(runtime: &runtime::Handle, link: Link) -> mpsc::UnboundedSender<Job> {
    let (jobs, queue) = mpsc::unbounded_channel::<Job>();
    match link.shards() {
        Some(_) => runtime.spawn(spread::batcher(link, queue)),
        None => runtime.spawn(one_server(link, queue)),
    };
    jobs
}

/// The batcher of one server (or a Sentinel-named master): it takes the next batch
/// once fewer than [`IN_FLIGHT`] calls are in flight, so that requests arriving
/// meanwhile wait in the queue and join one larger batch.
async fn one_server(link: Link, mut queue: mpsc::UnboundedReceiver<Job>) {
    let slots = Arc::new(Semaphore::new(IN_FLIGHT));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = queue.recv().await else {
            return;
        };
        let batch = gather(first, &mut queue).await;
        let link = link.clone();
        tokio::spawn(async move {
            run(&link, batch).await;
            drop(slot);
        });
    }
}

/// A batch: `first`, then the requests that are ready to run on this runtime, up to
/// [`MAX_BATCH`]. They reach the queue first: a larger batch for the cost of a pass
/// of the scheduler. Passes go on while they bring more requests (a few at most), so
/// a lone request waits one pass.
pub(super) async fn gather(first: Job, queue: &mut mpsc::UnboundedReceiver<Job>) -> Vec<Job> {
    for _ in 0..MAX_PASSES {
        let waiting = queue.len();
        tokio::task::yield_now().await;
        if queue.len() == waiting {
            break;
        }
    }
    let mut batch = Vec::with_capacity(queue.len().min(MAX_BATCH - 1) + 1);
    batch.push(first);
    while batch.len() < MAX_BATCH {
        match queue.try_recv() {
            Ok(job) => batch.push(job),
            Err(_) => break,
        }
    }
    batch
}

/// Sends one batch to the one server and hands each job its part of the answer.
async fn run(link: &Link, batch: Vec<Job>) {
    let batch = still_waiting(batch);
    if batch.is_empty() {
        return;
    }
    let answer = invoke(link, &batch, false, None).await;
    answer_all(answer, batch);
}

/// The jobs whose requests still wait for their answer: a request that gave up
/// waiting has been decided without Redis, and is not counted.
pub(super) fn still_waiting(batch: Vec<Job>) -> Vec<Job> {
    batch
        .into_iter()
        .filter(|job| !job.answer_to.is_closed())
        .collect()
}

/// Starts one script call for `batch` on the engine's thread now (then `WAIT`, with
/// `wait_replicas`), on `on` (a Cluster master) or the link's connection; the future
/// returned waits for the packed answer. `spread`: only the first key is declared,
/// and every key follows the batch in the arguments. The call carries its decisions'
/// deadline in that server's clock, and its answer teaches that clock's skew.
pub(super) fn invoke(
    link: &Link,
    batch: &[Job],
    spread: bool,
    on: Option<&Master>,
) -> impl Future<Output = Result<Vec<u8>, StoreError>> + Send + 'static + use<> {
    let skew = on.map_or_else(|| link.skew(), |master| master.skew.clone());
    let (timeout, sent) = (link.timeout(), Instant::now());
    let sent_ms = deadline::mono_ms(sent);
    let first = batch.iter().filter_map(|job| job.deadline).min();
    let deadline = first.map_or(0, |first| {
        skew.deadline(sent_ms, first.saturating_duration_since(sent), timeout)
    });
    let (keys, packed) = encode(batch, deadline);
    let script = if spread { &SPREAD_SCRIPT } else { &SCRIPT };
    let mut invocation = script.prepare_invoke();
    if spread {
        invocation.key(keys[0]).arg(packed);
        for key in keys {
            invocation.arg(key);
        }
    } else {
        for key in keys {
            invocation.key(key);
        }
        invocation.arg(packed);
    }
    let (wanted, wait_ms) = (link.wait_replicas(), timeout.as_millis() as u64);
    let on = on.map(|master| master.connection.clone());
    let answer = link.start(on, move |mut connection| async move {
        let answer = invocation.invoke_async::<Vec<u8>>(&mut connection).await?;
        if wanted == 0 {
            return Ok((answer, 0));
        }
        // WAIT covers every write this connection made before it: this call's.
        let acked = redis::cmd("WAIT")
            .arg(wanted)
            .arg(wait_ms)
            .query_async::<i64>(&mut connection)
            .await?;
        Ok((answer, acked))
    });
    async move {
        let (answer, acked) = answer.await?;
        if let Some(at) = answer.first_chunk::<8>() {
            let at_ms = f64::from_le_bytes(*at) as u64;
            skew.learn(at_ms, sent_ms, sent.elapsed(), timeout);
        }
        match acked < i64::from(wanted) {
            true => Err(StoreError::Unreplicated { acked, wanted }),
            false => Ok(answer),
        }
    }
}

/// Hands each job its part of `answer`, or the error.
pub(super) fn answer_all(answer: Result<Vec<u8>, StoreError>, batch: Vec<Job>) {
    match answer {
        Ok(answer) => split(&answer, batch),
        Err(err) => {
            for job in batch {
                let _ = job.answer_to.send(Err(err.clone()));
            }
        }
    }
}

/// The batch as the script reads it: its distinct keys, and the packed requests
/// (`N, S, deadline, S shapes, N x (cost, caller key, total key, shape[, refund
/// at])`, see `limit.lua`); `deadline` is the Redis instant after which its
/// decisions count nothing (0: none).
fn encode<'a>(batch: &'a [Job], deadline: u64) -> (Vec<&'a str>, Vec<u8>) {
    let mut keys: Vec<&'a str> = Vec::new();
    let mut key_at: HashMap<&'a str, u16> = HashMap::with_capacity(batch.len());
    let mut shapes: Vec<&'a Arc<Shape>> = Vec::new();
    let mut requests = Vec::with_capacity(10 * batch.len());
    for job in batch {
        let mut at = |key| {
            *key_at.entry(key).or_insert_with(|| {
                keys.push(key);
                keys.len() as u16
            })
        };
        let caller = at(job.caller.as_str());
        let total = job.total.as_deref().map_or(0, &mut at);
        let members: Vec<u16> = (job.stacked.iter())
            .flat_map(|stack| &stack.members)
            .map(|member| at(member.caller.as_str()))
            .collect();
        let mut shape_of = |wanted: &'a Arc<Shape>| {
            let same = |shape: &&Arc<Shape>| Arc::ptr_eq(shape, wanted) || **shape == *wanted;
            match shapes.iter().position(same) {
                Some(found) => found + 1,
                None => {
                    shapes.push(wanted);
                    shapes.len()
                }
            }
        };
        let shape = shape_of(&job.shape);
        let cost = match (job.refund_at, job.charge, &job.stacked) {
            (Some(_), _, _) => job.cost.min(REFUND - 1) | REFUND,
            (None, true, _) => job.cost.min(CHARGE - 1) | CHARGE,
            (None, false, Some(_)) => job.cost.min(STACK - 1) | STACK,
            (None, false, None) => job.cost.min(STACK - 1),
        };
        requests.extend(cost.to_le_bytes());
        requests.extend(caller.to_le_bytes());
        requests.extend(total.to_le_bytes());
        requests.extend((shape as u16).to_le_bytes());
        if let Some(at) = job.refund_at {
            let at = if at == NEWEST { -1.0 } else { at as f64 };
            requests.extend(at.to_le_bytes());
        }
        if let Some(stack) = job
            .stacked
            .as_ref()
            .filter(|_| job.refund_at.is_none() && !job.charge)
        {
            requests.push(u8::from(stack.shadow));
            requests.push(u8::try_from(stack.members.len()).unwrap_or(u8::MAX));
            for (member, key) in stack.members.iter().zip(&members) {
                requests.extend(key.to_le_bytes());
                requests.extend((shape_of(&member.shape) as u16).to_le_bytes());
                requests.push(u8::from(member.shadow));
            }
        }
    }
    let shape_bytes: usize = shapes.iter().map(|shape| shape.0.len()).sum();
    let mut packed = Vec::with_capacity(12 + shape_bytes + requests.len());
    packed.extend((batch.len() as u16).to_le_bytes());
    packed.extend((shapes.len() as u16).to_le_bytes());
    packed.extend((deadline as f64).to_le_bytes());
    for shape in shapes {
        packed.extend(&shape.0);
    }
    packed.extend(requests);
    (keys, packed)
}

/// Splits the script's answer, Redis's now `f64` then per job `admitted u8, Q u8,
/// Q x 3 f64`, among the jobs.
fn split(answer: &[u8], batch: Vec<Job>) {
    let Some((now, mut rest)) = answer.split_first_chunk::<8>() else {
        for job in batch {
            let _ = job
                .answer_to
                .send(Err(StoreError::Protocol("no clock in the answer")));
        }
        return;
    };
    let at_ms = f64::from_le_bytes(*now) as u64;
    for job in batch {
        let reply = match &job.stacked {
            None => record(&mut rest).map(|(admitted, statuses)| Answer {
                at_ms,
                admitted,
                statuses,
                parts: Vec::new(),
            }),
            Some(stack) => stacked_answer(&mut rest, stack, at_ms),
        };
        let _ = job.answer_to.send(reply);
    }
}

/// One request's record of the answer, `admitted u8, Q u8, Q x 3 f64`, taken off
/// the front of `rest`; `admitted` 2 (and Q 0) is a decision Redis ran after its
/// deadline, counting nothing.
fn record(rest: &mut &[u8]) -> Result<(bool, Vec<[i64; 3]>), StoreError> {
    let all: &[u8] = rest;
    match *all {
        [LATE, 0, ref after @ ..] => {
            *rest = after;
            Err(StoreError::Late)
        }
        [admitted, checked, ref values @ ..] if values.len() >= 24 * usize::from(checked) => {
            let (values, after) = values.split_at(24 * usize::from(checked));
            *rest = after;
            let number =
                |bytes: &[u8]| f64::from_le_bytes(bytes.try_into().unwrap_or_default()) as i64;
            let statuses = values
                .chunks_exact(24)
                .map(|s| [number(&s[..8]), number(&s[8..16]), number(&s[16..])])
                .collect();
            Ok((admitted == 1, statuses))
        }
        _ => Err(StoreError::Protocol("a short answer from the script")),
    }
}

/// A stacked decision's answer: one record per policy, each saying whether that
/// policy had room; admitted when every enforcing policy had (the script counted
/// by the same rule).
fn stacked_answer(rest: &mut &[u8], stack: &Stack, at_ms: u64) -> Result<Answer, StoreError> {
    let shadows = std::iter::once(stack.shadow).chain(stack.members.iter().map(|m| m.shadow));
    let mut answer = Answer {
        at_ms,
        admitted: true,
        statuses: Vec::new(),
        parts: Vec::with_capacity(1 + stack.members.len()),
    };
    for shadow in shadows {
        let (room, statuses) = record(rest)?;
        answer.admitted &= room || shadow;
        answer
            .parts
            .push(u8::try_from(statuses.len()).unwrap_or(u8::MAX));
        answer.statuses.extend(statuses);
    }
    Ok(answer)
}

#[cfg(test)]
mod tests;
