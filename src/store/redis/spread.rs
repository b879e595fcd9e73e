//! A Redis Cluster's batcher: each batch split by master, one script call each on
//! the engine's own connection to that master, with the calls in flight counted per
//! master, and by hash tag, through the cluster connection, for what the slot map
//! cannot route (see `super::batch`).

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use tokio::sync::mpsc;

use super::batch::{IN_FLIGHT, Job, MAX_BATCH, answer_all, gather, invoke, still_waiting};
use super::link::{Link, Master};
use super::shards::{UNKNOWN, hash_tag};
use crate::store::StoreError;

/// Where a batcher's calls go, each with its own count of calls in flight and its
/// own queue: a master of the slot map, or (`master` none) the cluster connection.
struct Gate {
    /// The master (its breaker's address names it while the gate lives).
    master: Option<Master>,
    /// Calls in flight.
    busy: usize,
    /// Jobs for this master that wait for one of its calls to end.
    waiting: Vec<Job>,
}

impl Gate {
    /// What names the gate: its master's breaker's address (0: the cluster
    /// connection's).
    fn id(&self) -> usize {
        self.master
            .as_ref()
            .map_or(0, |master| Arc::as_ptr(&master.health) as usize)
    }
}

/// A Redis Cluster batcher: each batch is split by master, and each master has at
/// most [`IN_FLIGHT`] of this batcher's calls in flight, its own. A master that is
/// frozen or dead holds only its own slots' requests while its calls wait for their
/// timeout; the parts for the other masters go at once. Requests for a master whose
/// calls are all in flight wait in its gate and go together, up to [`MAX_BATCH`] a
/// call, when one of them ends.
pub(super) async fn batcher(link: Link, mut queue: mpsc::UnboundedReceiver<Job>) {
    let (freed, mut ended) = mpsc::unbounded_channel::<usize>();
    let mut gates: Vec<Gate> = Vec::new();
    loop {
        tokio::select! {
            biased;
            Some(id) = ended.recv() => {
                if let Some(gate) = gates.iter_mut().find(|gate| gate.id() == id) {
                    gate.busy -= 1;
                }
            }
            first = queue.recv() => {
                let Some(first) = first else {
                    return;
                };
                let batch = gather(first, &mut queue).await;
                route(&link, &mut gates, batch);
            }
        }
        for gate in &mut gates {
            send(&link, gate, &freed);
        }
        gates.retain(|gate| gate.busy > 0 || !gate.waiting.is_empty());
    }
}

/// Adds each job of `batch` to the gate of the master serving its slot, as the slot
/// map has it now, or (a slot the map does not know) the cluster connection's.
fn route(link: &Link, gates: &mut Vec<Gate>, batch: Vec<Job>) {
    let Some(shards) = link.shards() else {
        answer_all(Err(StoreError::Protocol("no slot map")), batch);
        return;
    };
    for job in batch {
        let node = shards.node_of(&job.caller);
        let master = (node != UNKNOWN).then(|| shards.node(node));
        let id = master.map_or(0, |master| Arc::as_ptr(&master.health) as usize);
        let at = match gates.iter().position(|gate| gate.id() == id) {
            Some(at) => at,
            None => {
                gates.push(Gate {
                    master: master.cloned(),
                    busy: 0,
                    waiting: Vec::new(),
                });
                gates.len() - 1
            }
        };
        gates[at].waiting.push(job);
    }
}

/// Starts calls for `gate`'s waiting jobs while it has fewer than [`IN_FLIGHT`] in
/// flight, [`MAX_BATCH`] jobs a call at most; each call says on `freed` when it ends.
fn send(link: &Link, gate: &mut Gate, freed: &mpsc::UnboundedSender<usize>) {
    while gate.busy < IN_FLIGHT && !gate.waiting.is_empty() {
        let part: Vec<Job> = match gate.waiting.len() <= MAX_BATCH {
            true => std::mem::take(&mut gate.waiting),
            false => gate.waiting.drain(..MAX_BATCH).collect(),
        };
        gate.busy += 1;
        let (link, master, freed, id) =
            (link.clone(), gate.master.clone(), freed.clone(), gate.id());
        tokio::spawn(async move {
            call(&link, master.as_ref(), part).await;
            let _ = freed.send(id);
        });
    }
}

/// Sends `part` as one call to `master`, or one call per hash tag through the
/// cluster connection (no master: a slot the map does not know), and hands each job
/// its answer.
async fn call(link: &Link, master: Option<&Master>, part: Vec<Job>) {
    let part = still_waiting(part);
    if part.is_empty() {
        return;
    }
    match master {
        Some(master) => {
            let spread = !one_tag(&part);
            let call = invoke(link, &part, spread, Some(master));
            settle(link, Some(call), part).await;
        }
        None => {
            link.read_shards();
            by_tag_routed(link, part).await;
        }
    }
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
