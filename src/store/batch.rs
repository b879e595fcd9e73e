//! Coalescing Redis decisions: the requests waiting at one moment go to Redis as one
//! script call.
//!
//! Redis spends most of a small script's cost on running a script at all (argument
//! tables, the call, `TIME`, the reply), not on the few hash commands a decision
//! needs. One task owns the queue: it takes every decision waiting, up to
//! [`MAX_BATCH`], and sends them as one `EVALSHA`, which decides them one after the
//! other, atomically; up to [`IN_FLIGHT`] such calls are pipelined on the shared
//! connection. Under light load a batch is one request and costs what it did alone;
//! under heavy load the batches grow and Redis's cost per decision falls.
//!
//! A batch mixes callers, so its keys span Redis Cluster slots: this works with a
//! standalone Redis (or Valkey, or a primary with replicas), which is what the store
//! connects to.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionManager;
use tokio::sync::{Semaphore, mpsc, oneshot};

/// Decisions per script call at most.
pub const MAX_BATCH: usize = 128;
/// Script calls waiting for Redis at once at most.
pub const IN_FLIGHT: usize = 2;

/// One request's part of a batch.
pub struct Job {
    /// The caller's counters.
    pub caller: String,
    /// The policy's total counters, when the request has total quotas.
    pub total: Option<Arc<str>>,
    /// The request's arguments to the script (see `limit.lua`).
    pub args: Vec<u64>,
    /// Where the request's answer goes: admitted, Q, then Q x (used, reset, retry).
    pub answer_to: oneshot::Sender<Result<Vec<i64>, String>>,
}

/// Starts the task that batches jobs; it ends when every sender is dropped.
pub fn spawn(
    connection: ConnectionManager,
    script: redis::Script,
    timeout: Duration,
) -> mpsc::UnboundedSender<Job> {
    let (jobs, mut queue) = mpsc::unbounded_channel::<Job>();
    let slots = Arc::new(Semaphore::new(IN_FLIGHT));
    let script = Arc::new(script);
    tokio::spawn(async move {
        loop {
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return;
            };
            let Some(first) = queue.recv().await else {
                return;
            };
            // Let the requests that are ready to run reach the queue first: a larger
            // batch for the cost of one pass of the scheduler.
            tokio::task::yield_now().await;
            let mut batch = Vec::with_capacity(queue.len().min(MAX_BATCH - 1) + 1);
            batch.push(first);
            while batch.len() < MAX_BATCH {
                match queue.try_recv() {
                    Ok(job) => batch.push(job),
                    Err(_) => break,
                }
            }
            let (mut connection, script) = (connection.clone(), script.clone());
            tokio::spawn(async move {
                run(&mut connection, &script, batch, timeout).await;
                drop(slot);
            });
        }
    });
    jobs
}

/// Sends one batch and hands each job its part of the answer.
async fn run(
    connection: &mut ConnectionManager,
    script: &redis::Script,
    batch: Vec<Job>,
    timeout: Duration,
) {
    // A request that gave up waiting has been decided without Redis: not counted here.
    let batch: Vec<Job> = batch
        .into_iter()
        .filter(|job| !job.answer_to.is_closed())
        .collect();
    if batch.is_empty() {
        return;
    }
    let mut invocation = script.prepare_invoke();
    invocation.arg(batch.len());
    for job in &batch {
        invocation.key(&job.caller);
        if let Some(total) = &job.total {
            invocation.key(&**total);
        }
        invocation.arg(job.args.as_slice());
    }
    let answer: Result<Vec<i64>, String> =
        match tokio::time::timeout(timeout, invocation.invoke_async(connection)).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(err)) => Err(err.to_string()),
            Err(_) => Err(format!("no answer within {timeout:?}")),
        };
    match answer {
        Ok(answer) => split(&answer, batch),
        Err(err) => {
            for job in batch {
                let _ = job.answer_to.send(Err(err.clone()));
            }
        }
    }
}

/// Splits `{now, then per job: admitted, Q, Q x 3 values}` among the jobs.
fn split(answer: &[i64], batch: Vec<Job>) {
    let mut at = 1;
    for job in batch {
        let part = answer
            .get(at + 1)
            .and_then(|&checked| usize::try_from(checked).ok())
            .map(|checked| at..at + 2 + 3 * checked)
            .and_then(|range| answer.get(range));
        let reply = match part {
            Some(part) => {
                at += part.len();
                Ok(part.to_vec())
            }
            None => Err("a short answer from the redis script".to_string()),
        };
        let _ = job.answer_to.send(reply);
    }
}
