//! The near-limit callers of the whole fleet, with Redis: each replica posts its own
//! summary on the store's board every [`POST_EVERY_TICKS`] seconds, and the status
//! merges the fresh posts of every other replica with its own summary read now.
//!
//! A caller near a limit in several replicas is one row: its counts added, its
//! fullest window kept. The merged error bound is the sum of the replicas' (each
//! summary may be off by its own). A replica that stopped posting drops out after
//! the board's staleness bound (`store::redis::board::STALE_MS`).

use std::collections::HashMap;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use crate::gateway::Gateway;
use crate::limit::Window;
use crate::observe::hitters::{Counted, NearLimit, TOP, Top};

/// The board's name for near-limit summaries.
const BOARD: &str = "near-limit";
/// Posts go out every this many maintenance ticks (seconds).
pub(crate) const POST_EVERY_TICKS: u64 = 2;

/// This process's name on the board: random, made once.
fn replica() -> &'static str {
    static REPLICA: OnceLock<String> = OnceLock::new();
    REPLICA.get_or_init(|| const_hex::encode(fastrand::u64(..).to_be_bytes()))
}

/// One replica's post.
#[derive(Debug, Serialize, Deserialize)]
struct Posted {
    replica: String,
    total: u64,
    error_bound: u64,
    callers: Vec<PostedCaller>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct PostedCaller {
    count: u64,
    caller: String,
    policy: String,
    window: String,
    used: u32,
    limit: u32,
}

/// Posts this replica's near-limit summary on the fleet's board (Redis only;
/// nothing in memory mode). A post Redis does not take is simply missed: the next
/// one follows.
pub(crate) async fn post(gateway: &Gateway) {
    let store = gateway.store();
    if store.backend() != "redis" {
        return;
    }
    let now_ms = gateway.clock().now_ms();
    let top = gateway.admission().hitters().top_near(now_ms);
    let posted = Posted {
        replica: replica().to_string(),
        total: top.total,
        error_bound: top.error_bound,
        callers: (top.callers.into_iter())
            .map(|c| PostedCaller {
                count: c.count,
                caller: c.tag.caller.into(),
                policy: c.tag.policy.into(),
                window: c.tag.window.to_string(),
                used: c.tag.used,
                limit: c.tag.limit,
            })
            .collect(),
    };
    let Ok(document) = serde_json::to_string(&posted) else {
        return;
    };
    store.post(BOARD, replica(), now_ms, document).await;
}

/// The near-limit callers to show: with Redis and a board that answers, the
/// fleet's (this replica's `own` summary merged with the other replicas' posts) and
/// `true`; else `own` and `false`.
pub(crate) async fn near(
    gateway: &Gateway,
    own: Top<NearLimit>,
    now_ms: u64,
) -> (Top<NearLimit>, bool) {
    let Some(documents) = gateway.store().board(BOARD, now_ms).await else {
        return (own, false);
    };
    let others: Vec<Posted> = (documents.iter())
        .filter_map(|d| serde_json::from_str::<Posted>(d).ok())
        .filter(|p| p.replica != replica())
        .collect();
    (merge(own, others), true)
}

/// `own` with the `others`' summaries added in: one row per caller and policy, its
/// counts summed and its fullest window kept; the [`TOP`] heaviest.
fn merge(own: Top<NearLimit>, others: Vec<Posted>) -> Top<NearLimit> {
    let mut total = own.total;
    let mut error_bound = own.error_bound;
    let mut rows: HashMap<(Box<str>, Box<str>), Counted<NearLimit>> = HashMap::new();
    let mut add = |row: Counted<NearLimit>| {
        let key = (row.tag.caller.clone(), row.tag.policy.clone());
        match rows.get_mut(&key) {
            None => {
                rows.insert(key, row);
            }
            Some(have) => {
                have.count += row.count;
                if ratio(&row.tag) > ratio(&have.tag) {
                    have.tag = row.tag;
                }
            }
        }
    };
    own.callers.into_iter().for_each(&mut add);
    for posted in others {
        total += posted.total;
        error_bound += posted.error_bound;
        for c in posted.callers {
            add(Counted {
                count: c.count,
                tag: NearLimit {
                    caller: c.caller.into(),
                    policy: c.policy.into(),
                    window: window_named(&c.window),
                    used: c.used,
                    limit: c.limit,
                },
            });
        }
    }
    let mut callers: Vec<Counted<NearLimit>> = rows.into_values().collect();
    callers.sort_by(|a, b| {
        b.count
            .cmp(&a.count)
            .then_with(|| a.tag.caller.cmp(&b.tag.caller))
    });
    callers.truncate(TOP);
    Top {
        total,
        error_bound,
        callers,
    }
}

fn ratio(at: &NearLimit) -> f64 {
    f64::from(at.used) / f64::from(at.limit.max(1))
}

/// The static name of a window another replica wrote (`minute`, `total-minute`).
fn window_named(name: &str) -> &'static str {
    (Window::ALL.iter())
        .flat_map(|w| [w.name(), w.total_name()])
        .find(|known| *known == name)
        .unwrap_or("window")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn near(caller: &str, used: u32, limit: u32, count: u64) -> Counted<NearLimit> {
        Counted {
            count,
            tag: NearLimit {
                caller: caller.into(),
                policy: "standard".into(),
                window: "minute",
                used,
                limit,
            },
        }
    }

    fn posted(replica: &str, callers: &[(&str, u32, u64)]) -> Posted {
        Posted {
            replica: replica.into(),
            total: callers.iter().map(|c| c.2).sum(),
            error_bound: 1,
            callers: (callers.iter())
                .map(|&(caller, used, count)| PostedCaller {
                    count,
                    caller: caller.into(),
                    policy: "standard".into(),
                    window: "total-minute".into(),
                    used,
                    limit: 100,
                })
                .collect(),
        }
    }

    #[test]
    fn a_caller_seen_by_several_replicas_is_one_row_with_its_counts_added() {
        let own = Top {
            total: 5,
            error_bound: 0,
            callers: vec![near("ip:10.0.0.1", 85, 100, 5)],
        };
        let others = vec![
            posted("b", &[("ip:10.0.0.1", 95, 3), ("ip:10.0.0.2", 80, 9)]),
            posted("c", &[("ip:10.0.0.2", 81, 1)]),
        ];
        let merged = merge(own, others);
        assert_eq!(merged.total, 5 + 12 + 1);
        assert_eq!(merged.error_bound, 2);
        let rows: Vec<(&str, u64, u32, &str)> = (merged.callers.iter())
            .map(|c| (&*c.tag.caller, c.count, c.tag.used, c.tag.window))
            .collect();
        assert_eq!(
            rows,
            [
                ("ip:10.0.0.2", 10, 81, "total-minute"),
                ("ip:10.0.0.1", 8, 95, "total-minute"),
            ]
        );
    }
}
