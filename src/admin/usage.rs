//! `GET` and `DELETE /admin/usage?caller=...`: a caller's counters per policy and
//! plan, and resetting them.

use std::collections::HashMap;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use serde::Serialize;

use super::{json, queried_caller, query_pairs};
use crate::admission::named_budget_key;
use crate::gateway::Gateway;
use crate::http::body::Body;
use crate::http::rate_headers::ceil_secs;
use crate::limit::Report;
use crate::snapshot::PlanLimit;

#[derive(Serialize)]
struct Usage {
    caller: String,
    policies: Vec<UsagePolicy>,
}

#[derive(Serialize)]
struct UsagePolicy {
    policy: String,
    plan: String,
    limits: Vec<UsageLimit>,
}

#[derive(Serialize)]
struct UsageLimit {
    window: &'static str,
    limit: u32,
    used: u32,
    reset_after: u64,
}

/// The caller's usage, or with `reset` its counters forgotten.
pub(super) async fn usage(
    gateway: &Gateway,
    request: &Request<Incoming>,
    reset: bool,
) -> Response<Body> {
    let snapshot = gateway.snapshot();
    let (caller, target) = match queried_caller(request, &snapshot) {
        Ok(found) => found,
        Err(response) => return *response,
    };
    let parts = key_params(request);
    let now_ms = gateway.clock().now_ms();
    let anchor = snapshot.anchor(target.consumer);
    let store = gateway.store();
    let mut policies = Vec::new();
    let mut cleared = 0;
    for policy in snapshot.policies() {
        let plans: Vec<_> = match target.plan {
            Some(plan) => vec![plan],
            None => snapshot.plans().collect(),
        };
        for plan in plans {
            let PlanLimit::Limits(limited) = snapshot.limits_for(policy, plan, target.consumer)
            else {
                continue;
            };
            // A keyed policy's budget of the parts the query names (a missing part
            // under on_missing = "deny" has no budget to show).
            let Ok(key) = named_budget_key(&snapshot, policy, target.key, &parts) else {
                continue;
            };
            if reset {
                cleared += usize::from(store.reset(&limited.scope, key).await);
                continue;
            }
            let mut report = Report::default();
            let now = snapshot.instant(now_ms, limited, anchor);
            store.peek(&limited.scope, key, &now, &mut report).await;
            let limits = report
                .iter()
                .filter(|s| !s.total)
                .map(|s| UsageLimit {
                    window: s.quota.window.name(),
                    limit: s.quota.limit.get(),
                    used: s.used,
                    reset_after: if s.used == 0 {
                        0
                    } else {
                        ceil_secs(s.reset_ms)
                    },
                })
                .collect();
            policies.push(UsagePolicy {
                policy: snapshot.policy_name(policy).to_string(),
                plan: snapshot.plan_name(plan).to_string(),
                limits,
            });
        }
    }
    if reset {
        tracing::info!(caller = %caller, cleared, "usage reset through the admin API");
        return json(
            StatusCode::OK,
            &serde_json::json!({"caller": caller, "reset": cleared}),
        );
    }
    json(StatusCode::OK, &Usage { caller, policies })
}

/// The limit key parts a usage query names: every parameter but `caller`
/// (`header:x-tenant-id=t1&path:2=orders`), decoded.
fn key_params(request: &Request<Incoming>) -> HashMap<String, String> {
    query_pairs(request)
        .filter(|(name, _)| name != "caller")
        .map(|(name, value)| (name.into_owned(), value.into_owned()))
        .collect()
}
