//! The fleet's board: each replica posts a small document under a name (the status
//! page's near-limit callers) and every replica reads all of them back, so that what
//! one replica saw is shown by all.
//!
//! One Redis hash per name, under one hash tag (one Cluster slot): a field per
//! replica holding `<ms> <document>`, `ms` when it was posted. A post older than
//! [`STALE_MS`] is from a replica that stopped posting: it is ignored and removed.
//! The hash expires a minute (`KEEP_MS`) after the last post, so a fleet that stops leaves
//! nothing behind.

use super::link::Link;
use crate::store::StoreError;

/// A post older than this (ms) is no longer read.
pub const STALE_MS: u64 = 10_000;
/// The board's hash lives this long (ms) after its last post.
const KEEP_MS: u64 = 60_000;

fn key(name: &str) -> String {
    format!("sluice:{{sluice-board}}:{name}")
}

/// Posts `document` as `replica`'s under `name`, at `now_ms`.
pub async fn post(
    link: &Link,
    name: &str,
    replica: &str,
    now_ms: u64,
    document: String,
) -> Result<(), StoreError> {
    let (key, field, value) = (
        key(name),
        replica.to_string(),
        format!("{now_ms} {document}"),
    );
    link.query(|mut connection| async move {
        redis::pipe()
            .atomic()
            .hset(&key, field, value)
            .ignore()
            .pexpire(&key, KEEP_MS as i64)
            .ignore()
            .query_async::<()>(&mut connection)
            .await
    })
    .await
}

/// The documents posted under `name` in the last [`STALE_MS`] before `now_ms`, in
/// no particular order; older posts are removed.
pub async fn read(link: &Link, name: &str, now_ms: u64) -> Result<Vec<String>, StoreError> {
    let key = key(name);
    let posts: Vec<(String, String)> = {
        let key = key.clone();
        link.query(|mut connection| async move {
            redis::cmd("HGETALL")
                .arg(key)
                .query_async::<Vec<(String, String)>>(&mut connection)
                .await
        })
        .await?
    };
    let mut fresh = Vec::with_capacity(posts.len());
    let mut stale = Vec::new();
    for (replica, value) in posts {
        let Some((at, document)) = value.split_once(' ') else {
            stale.push(replica);
            continue;
        };
        match at.parse::<u64>() {
            Ok(at) if now_ms.saturating_sub(at) <= STALE_MS => fresh.push(document.to_string()),
            _ => stale.push(replica),
        }
    }
    if !stale.is_empty() {
        // Best effort: a post that stays is ignored again next time.
        let _ = link
            .query(|mut connection| async move {
                redis::cmd("HDEL")
                    .arg(key)
                    .arg(stale)
                    .query_async::<u64>(&mut connection)
                    .await
            })
            .await;
    }
    Ok(fresh)
}
