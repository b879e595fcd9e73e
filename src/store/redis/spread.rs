//! Splitting a batch for a Redis Cluster: by master, one script call each on the
//! engine's own connection to that master, and by hash tag, through the cluster
//! connection, for what the slot map cannot route (see `super::batch`).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use smallvec::SmallVec;

use super::batch::{Job, answer_all, invoke};
use super::link::{Link, Master};
use super::shards::{Map, UNKNOWN, hash_tag};
use crate::store::StoreError;

/// Sends `batch` as one call per master of `shards` (all in flight together), and
/// hands each job its answer as soon as its master's call is done: a master that is
/// slow or dead never holds up another's answers. Jobs of a slot the map does not
/// know, and the jobs of a call the master refused unwritten (the map was stale, or
/// the master is gone), are sent one call per hash tag through the cluster
/// connection, which routes and redirects them.
pub(super) async fn run(link: &Link, shards: &Map<Master>, batch: Vec<Job>) {
    let (parts, unknown) = by_node(shards, batch);
    let mut calls: SmallVec<[_; 4]> = parts
        .into_iter()
        .map(|(node, part)| {
            let spread = !one_tag(&part);
            let call = invoke(link, &part, spread, Some(shards.node(node)));
            settle(link, Some(call), part)
        })
        .collect();
    if !unknown.is_empty() {
        link.read_shards();
        calls.push(settle(link, None, unknown));
    }
    join(calls).await;
}

/// Hands `part` the answer of `call`, or (no call, or one the master refused
/// unwritten) sends it again one call per hash tag through the cluster connection.
async fn settle<C>(link: &Link, call: Option<C>, part: Vec<Job>)
where
    C: Future<Output = Result<Vec<u8>, StoreError>>,
{
    let Some(call) = call else {
        return by_tag_routed(link, part).await;
    };
    match call.await {
        Err(StoreError::Redis(err)) if not_served(&err) => {
            link.read_shards();
            by_tag_routed(link, part).await;
        }
        Err(err) => {
            // A master that fails may have been replaced: read the map again.
            link.read_shards();
            answer_all(Err(err), part);
        }
        answer => answer_all(answer, part),
    }
}

/// Runs `futures` together until every one is done.
async fn join<F: Future<Output = ()>>(futures: impl IntoIterator<Item = F>) {
    let mut futures: SmallVec<[Option<Pin<Box<F>>>; 4]> =
        futures.into_iter().map(|f| Some(Box::pin(f))).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for slot in &mut futures {
            if let Some(future) = slot {
                match future.as_mut().poll(cx) {
                    Poll::Ready(()) => *slot = None,
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await
}

/// Sends `jobs` one call per hash tag, all in flight together, through the cluster
/// connection.
async fn by_tag_routed(link: &Link, jobs: Vec<Job>) {
    let calls: Vec<_> = by_tag(jobs)
        .into_iter()
        .map(|one| (invoke(link, &one, false, None), one))
        .collect();
    for (call, one) in calls {
        answer_all(call.await, one);
    }
}

/// Whether a master refused a call without running it: it does not serve one of its
/// keys (`MOVED`, `ASK`, or the script's touch of every key before writing),
/// or the cluster is not ready for the slot. Nothing was counted, so the call may
/// be sent again another way. A refused connection is not one of these: the master
/// is gone, and sending its requests again through the cluster connection would
/// only wait on that connection's retries of the same dead node; they fail now
/// (the master's breaker counts them) and the map is read again.
fn not_served(err: &redis::RedisError) -> bool {
    if err.is_cluster_error() {
        return true;
    }
    let text = err.to_string();
    text.contains("non local key") || text.contains("CROSSSLOT") || text.contains("same slot")
}

/// Whether every job of `part` has the same hash tag (one slot: its keys can all be
/// declared).
fn one_tag(part: &[Job]) -> bool {
    let first = hash_tag(&part[0].caller);
    part[1..].iter().all(|job| hash_tag(&job.caller) == first)
}

/// A batch's parts by master: the master's index and its jobs.
type Parts = SmallVec<[(u16, Vec<Job>); 4]>;

/// A batch split by the master of its jobs' keys, as `shards` has them, in order
/// within each part; and the jobs of no known master.
fn by_node(shards: &Map<Master>, batch: Vec<Job>) -> (Parts, Vec<Job>) {
    let mut parts = Parts::new();
    let mut unknown = Vec::new();
    let size = batch.len();
    for job in batch {
        let node = shards.node_of(&job.caller);
        if node == UNKNOWN {
            unknown.push(job);
            continue;
        }
        match parts.iter_mut().find(|(n, _)| *n == node) {
            Some((_, part)) => part.push(job),
            None => {
                let mut part = Vec::with_capacity(size);
                part.push(job);
                parts.push((node, part));
            }
        }
    }
    (parts, unknown)
}

/// A batch split by its jobs' hash tags, in order within each part.
fn by_tag(batch: Vec<Job>) -> Vec<Vec<Job>> {
    let mut parts: Vec<Vec<Job>> = Vec::new();
    let mut part_of: HashMap<String, usize> = HashMap::new();
    for job in batch {
        let tag = hash_tag(&job.caller).to_string();
        match part_of.get(&tag) {
            Some(&at) => parts[at].push(job),
            None => {
                part_of.insert(tag, parts.len());
                parts.push(vec![job]);
            }
        }
    }
    parts
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio::sync::oneshot;

    use super::super::batch::Shape;
    use super::*;

    fn job(caller: &str, total: Option<&str>, cost: u32, limit: u32) -> Job {
        let mut shape = Shape::new(1, usize::from(total.is_some()), 0);
        shape.quota(1, limit, 1);
        Job {
            caller: caller.to_string(),
            total: total.map(Arc::from),
            cost,
            refund_at: None,
            charge: false,
            shape: Arc::new(shape),
            answer_to: oneshot::channel().0,
            deadline: None,
            stacked: None,
        }
    }

    #[test]
    fn a_cluster_batch_is_split_by_hash_tag_keeping_each_tags_order() {
        let a1 = job("sluice:{p:q:a}", None, 1, 10);
        let t1 = job("sluice:{t}:q:b", Some("sluice:{t}:total"), 1, 10);
        let a2 = job("sluice:{p:q:a}", None, 2, 10);
        let t2 = job("sluice:{t}:q:c", Some("sluice:{t}:total"), 1, 10);
        let plain = job("untagged{}", None, 1, 10);
        let parts = by_tag(vec![a1, t1, a2, t2, plain]);
        let shown: Vec<Vec<(&str, u32)>> = parts
            .iter()
            .map(|part| part.iter().map(|j| (j.caller.as_str(), j.cost)).collect())
            .collect();
        assert_eq!(
            shown,
            [
                vec![("sluice:{p:q:a}", 1), ("sluice:{p:q:a}", 2)],
                vec![("sluice:{t}:q:b", 1), ("sluice:{t}:q:c", 1)],
                vec![("untagged{}", 1)],
            ]
        );
    }
}
