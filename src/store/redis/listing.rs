//! The Redis engine's part of a usage export: a policy's keys found with `SCAN`
//! (`MATCH` on the policy's hashed name, `COUNT` bounding each call), on one server
//! or on every master of a Cluster in turn; and a listed key's counters read by the
//! decision script at cost 0.

use std::collections::HashSet;
use std::sync::Arc;

use redis::aio::ConnectionManager;
use tokio::sync::oneshot;

use super::batch::{self, Job};
use super::keys::Bound;
use super::{Op, RedisStore, fill, shape};
use crate::limit::{Now, Quota, Report};
use crate::store::listing::{Cursor, Listed, Page};
use crate::store::{CallerKey, Scope, StoreError};

/// Keys one `SCAN` call looks at: a bound on each call's work in Redis.
const SCAN_COUNT: u64 = 1_000;

impl RedisStore {
    /// About `want` callers of `bounds` (a policy's plans) from `(node, scan)` on:
    /// whole `SCAN` batches, so the page may hold a batch more than `want`.
    pub(crate) async fn list(
        &self,
        bounds: &[&Bound],
        (mut node, mut scan): (u16, u64),
        want: usize,
    ) -> Result<Page, StoreError> {
        let Some(first) = bounds.first() else {
            return Ok((Vec::new(), None));
        };
        let pattern = first.pattern();
        let nodes = self.nodes()?;
        let mut listed = Vec::new();
        while let Some(on) = nodes.get(usize::from(node)) {
            let (next, keys) = self.scan(on.clone(), scan, &pattern).await?;
            for key in keys {
                let owner = (bounds.iter().enumerate())
                    .find_map(|(index, bound)| Some((index, bound.owner(&key)?)));
                if let Some((scope, caller)) = owner {
                    listed.push(Listed {
                        scope,
                        caller,
                        at: Some(key),
                    });
                }
            }
            (node, scan) = match next {
                0 => (node + 1, 0),
                next => (node, next),
            };
            if listed.len() >= want && usize::from(node) < nodes.len() {
                return Ok((listed, Some(Cursor::Redis { node, scan })));
            }
        }
        Ok((listed, None))
    }

    /// On a Cluster, the keys of `callers` placed with other policies' buckets (the
    /// later policies of stacked routes), found with `SCAN` on every master; none
    /// elsewhere, where every key is the caller's own.
    pub(crate) async fn placed(&self, callers: &[CallerKey]) -> Result<Vec<String>, StoreError> {
        if !self.cluster || callers.is_empty() {
            return Ok(Vec::new());
        }
        let wanted: HashSet<CallerKey> = callers.iter().copied().collect();
        let pattern = match callers {
            [one] => format!("sluice:{{*}}:s:*{one:016x}"),
            _ => "sluice:{*}:s:*".to_string(),
        };
        let mut found = Vec::new();
        for on in self.nodes()? {
            let mut scan = 0;
            loop {
                let (next, keys) = self.scan(on.clone(), scan, &pattern).await?;
                let tail = |key: &String| {
                    let hex = key.get(key.len().saturating_sub(16)..)?;
                    u64::from_str_radix(hex, 16).ok()
                };
                found.extend(
                    keys.into_iter()
                        .filter(|key| tail(key).is_some_and(|c| wanted.contains(&c))),
                );
                match next {
                    0 => break,
                    next => scan = next,
                }
            }
        }
        Ok(found)
    }

    /// Takes up to `amount` off the counts under `key` in its billing periods holding
    /// `now`: a refund, at that instant, of `scope`'s period quotas alone.
    pub(crate) async fn credit_key(
        &self,
        scope: &Scope,
        key: String,
        now: &Now,
        amount: u32,
    ) -> Result<(), StoreError> {
        let periods: Vec<Quota> = (scope.quotas.iter())
            .filter(|q| q.window.is_period())
            .copied()
            .collect();
        if periods.is_empty() {
            return Ok(());
        }
        let (answer_to, answer) = oneshot::channel();
        let job = Job {
            caller: key,
            total: None,
            cost: amount,
            refund_at: Some(now.ms),
            charge: false,
            shape: Arc::new(shape(&periods, &[], now)),
            answer_to,
            deadline: None,
            stacked: None,
        };
        batch::send(self.id, &self.link, job)?;
        tokio::time::timeout(self.timeout, answer)
            .await
            .map_err(|_| StoreError::Timeout(self.timeout))?
            .map_err(|_| StoreError::Stopped)?
            .map(drop)
    }

    /// What to `SCAN`: each master of a Cluster (in the slot map's order), or the
    /// one server (`None`: the link's own connection).
    fn nodes(&self) -> Result<Vec<Option<ConnectionManager>>, StoreError> {
        match self.link.shards() {
            None => Ok(vec![None]),
            Some(map) => {
                let masters: Vec<_> = map.masters().map(|m| Some(m.connection.clone())).collect();
                match masters.is_empty() {
                    true => Err(StoreError::NoMaster),
                    false => Ok(masters),
                }
            }
        }
    }

    /// One `SCAN` call: the next cursor and the keys matching `pattern`.
    async fn scan(
        &self,
        on: Option<ConnectionManager>,
        cursor: u64,
        pattern: &str,
    ) -> Result<(u64, Vec<String>), StoreError> {
        let pattern = pattern.to_string();
        self.link
            .start(on, move |mut connection| async move {
                redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(pattern)
                    .arg("COUNT")
                    .arg(SCAN_COUNT)
                    .query_async::<(u64, Vec<String>)>(&mut connection)
                    .await
            })
            .await
    }

    /// The counters under `key` (a caller's, as [`Bound::caller`] or a listing
    /// named it), counting nothing.
    pub(crate) async fn peek_key(
        &self,
        scope: &Scope,
        keys: &Bound,
        key: String,
        now: &Now,
        report: &mut Report,
    ) -> Result<(), StoreError> {
        let answer = self.call(scope, keys, key, now, 0, Op::Count).await?;
        fill(scope, &answer.statuses, answer.at_ms, report);
        Ok(())
    }
}
