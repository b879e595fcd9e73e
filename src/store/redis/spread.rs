//! Splitting a batch for a Redis Cluster: by node, one script call each, and by hash
//! tag when a node turns out not to serve one of its keys (see `super::batch`).

use std::collections::HashMap;

use tokio::task::JoinSet;

use super::batch::{Job, answer_all, invoke};
use super::link::Link;
use super::shards::hash_tag;
use crate::store::StoreError;

/// Sends the jobs of one Cluster node as one call; if the node does not serve them
/// all (the map was stale), as one call per hash tag.
pub(super) async fn on_node(link: &Link, part: Vec<Job>) {
    let mut tags = by_tag(part);
    if tags.len() == 1 {
        let one = tags.remove(0);
        return answer_all(invoke(link, &one, false).await, one);
    }
    let jobs: Vec<Job> = tags.into_iter().flatten().collect();
    match invoke(link, &jobs, true).await {
        Err(StoreError::Redis(err)) if not_served(&err) => {
            link.read_shards();
            let mut calls = JoinSet::new();
            for one in by_tag(jobs) {
                let link = link.clone();
                calls.spawn(async move { answer_all(invoke(&link, &one, false).await, one) });
            }
            while calls.join_next().await.is_some() {}
        }
        answer => answer_all(answer, jobs),
    }
}

/// Whether a node refused a call because it does not serve one of its keys (the
/// script touches them all before writing: nothing was counted).
fn not_served(err: &redis::RedisError) -> bool {
    let text = err.to_string();
    text.contains("non local key") || text.contains("CROSSSLOT") || text.contains("same slot")
}

/// A batch split by the Cluster node of its jobs' keys, as last read; the jobs of no
/// known node form a part of their own.
pub(super) fn by_node(link: &Link, batch: Vec<Job>) -> Vec<Vec<Job>> {
    let mut parts: Vec<(Option<u16>, Vec<Job>)> = Vec::new();
    for job in batch {
        let node = link.node_of(&job.caller);
        match parts.iter_mut().find(|(n, _)| *n == node) {
            Some((_, part)) => part.push(job),
            None => parts.push((node, vec![job])),
        }
    }
    parts
        .into_iter()
        .flat_map(|(node, part)| match node {
            Some(_) => vec![part],
            None => by_tag(part),
        })
        .collect()
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
