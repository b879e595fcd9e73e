//! `POST /v1/check`: the decision API for services that are not proxied.
//!
//! The body names a policy, a caller, optionally a plan and a cost; the answer is
//! admission's ([`crate::admission::Admission::check`]): the access lists, bans and
//! exemption of an `ip:` caller, the bans of any caller, then the rate decision, so a
//! check counts exactly like a proxied request of that caller on a route of that
//! policy.

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use serde::{Deserialize, Serialize};

use super::{CallerRef, json, problem, read_json};
use crate::admission::limit_key::named_budget_key;
use crate::admission::{CheckAsk, Decision};
use crate::config::PlanId;
use crate::config::PolicyId;
use crate::gateway::Gateway;
use crate::http::body::Body;
use crate::http::rate_headers::ceil_secs;
use crate::http::refusal::Refusal;
use crate::limit::Report;
use crate::observe::metrics::NO_ROUTE;
use crate::snapshot::{PlanLimit, Snapshot};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckRequest {
    policy: String,
    caller: String,
    plan: Option<String>,
    cost: Option<u32>,
    /// Units to charge now, whatever is left: a cost known after the fact.
    charge: Option<u32>,
    /// A keyed policy's parts: `{"header:x-tenant-id": "t1", "path:2": "orders"}`.
    #[serde(default)]
    key: std::collections::HashMap<String, String>,
}

#[derive(Serialize)]
struct CheckAnswer {
    allowed: bool,
    retry_after: u64,
    /// The caller's plan may not use the policy, or its address is in `[access] deny`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    denied: bool,
    /// The caller is banned; `retry_after` says until when.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    banned: bool,
    /// The caller is a disabled consumer, whose key a proxied request would find
    /// refused with 401; nothing is counted.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    unauthorized: bool,
    /// Units a `charge` counted.
    #[serde(skip_serializing_if = "is_zero")]
    charged: u32,
    /// A policy in shadow mode admitted what these limits would have refused.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    would_refuse: Vec<&'static str>,
    limits: Vec<LimitAnswer>,
}

#[derive(Serialize)]
struct LimitAnswer {
    window: &'static str,
    limit: u32,
    remaining: u32,
    reset_after: u64,
}

pub(super) async fn check(gateway: &Gateway, request: Request<Incoming>) -> Response<Body> {
    let ask: CheckRequest = match read_json(request).await {
        Ok(ask) => ask,
        Err(response) => return response,
    };
    let snapshot = gateway.snapshot();
    let Some(policy) = snapshot.policy_id(&ask.policy) else {
        return problem(
            StatusCode::BAD_REQUEST,
            &format!("unknown policy \"{}\"", ask.policy),
        );
    };
    let Some(target) = CallerRef::parse(&ask.caller, &snapshot) else {
        return problem(
            StatusCode::BAD_REQUEST,
            "caller must be kind:name, e.g. consumer:batch-job or ip:1.2.3.4",
        );
    };
    let plan = match (&ask.plan, target.plan) {
        (Some(name), _) => match snapshot.plan_id(name) {
            Some(plan) => plan,
            None => {
                return problem(StatusCode::BAD_REQUEST, &format!("unknown plan \"{name}\""));
            }
        },
        (None, Some(plan)) => plan,
        (None, None) => {
            return problem(StatusCode::BAD_REQUEST, "plan is required for this caller");
        }
    };
    // Like its key on the proxied path: refused as if unknown, before any count.
    if target
        .consumer
        .is_some_and(|i| snapshot.config().consumer(i).disabled)
    {
        let refused = CheckAnswer {
            unauthorized: true,
            ..answer(false, 0, None)
        };
        return json(StatusCode::OK, &refused);
    }
    if let Some(units) = ask.charge {
        if ask.cost.is_some() {
            return problem(StatusCode::BAD_REQUEST, "send cost or charge, not both");
        }
        return charge(gateway, &snapshot, (policy, plan, target.key), units).await;
    }
    let cost = ask.cost.unwrap_or(1);
    if cost == 0 {
        return problem(StatusCode::BAD_REQUEST, "cost must be at least 1");
    }
    if let Some(reason) = never_fits(&snapshot, policy, plan, cost) {
        return problem(StatusCode::BAD_REQUEST, &reason);
    }
    let budget = match named_budget_key(&snapshot, policy, target.key, &ask.key) {
        Ok(budget) => budget,
        // A proxied request lacking the part would get 401 under on_missing = "deny".
        Err(Refusal::LimitKeyMissing { .. }) => {
            let denied = CheckAnswer {
                denied: true,
                ..answer(false, 0, None)
            };
            return json(StatusCode::OK, &denied);
        }
        Err(refusal) => return problem(StatusCode::BAD_REQUEST, &refusal.to_string()),
    };
    let ask = CheckAsk {
        budget,
        name: &ask.caller,
        policy,
        plan,
        caller: target.key,
        consumer: target.consumer,
        ip: target.ip,
        cost,
    };
    let answer = match gateway.admission().check(&snapshot, ask).await {
        Ok(Decision::Unlimited) => answer(true, 0, None),
        Ok(Decision::Denied) | Err(Refusal::Denied) => CheckAnswer {
            denied: true,
            ..answer(false, 0, None)
        },
        Err(Refusal::Banned { until_ms, now_ms }) => CheckAnswer {
            banned: true,
            ..answer(
                false,
                ceil_secs(until_ms.saturating_sub(now_ms)).max(1),
                None,
            )
        },
        Ok(Decision::Admitted(counted)) => CheckAnswer {
            would_refuse: counted.report.fired().collect(),
            ..answer(true, 0, Some(&counted.report))
        },
        Ok(Decision::Limited { report, .. }) => {
            let retry_after = ceil_secs(report.retry_ms().unwrap_or(1_000)).max(1);
            answer(false, retry_after, Some(&report))
        }
        Ok(Decision::Unavailable) | Err(_) => answer(false, 1, None),
    };
    json(StatusCode::OK, &answer)
}

/// `"charge": N`: counts N units of the caller now, even past its limits (debt), and
/// answers its state after: `allowed` false while it is in debt.
async fn charge(
    gateway: &Gateway,
    snapshot: &Snapshot,
    who: (PolicyId, PlanId, crate::store::CallerKey),
    units: u32,
) -> Response<Body> {
    let mut report = Report::default();
    let admission = gateway.admission();
    if !admission
        .charge(snapshot, who, units, NO_ROUTE, &mut report)
        .await
    {
        return json(
            StatusCode::OK,
            &CheckAnswer {
                charged: 0,
                ..answer(true, 0, None)
            },
        );
    }
    let retry_after = report.retry_ms().map_or(0, |ms| ceil_secs(ms).max(1));
    let answer = CheckAnswer {
        charged: units,
        ..answer(retry_after == 0, retry_after, Some(&report))
    };
    json(StatusCode::OK, &answer)
}

/// Why `cost` can never be admitted by (policy, plan): a window smaller than the cost
/// never has room for it, so the honest answer is a 400, not a wait.
fn never_fits(snapshot: &Snapshot, policy: PolicyId, plan: PlanId, cost: u32) -> Option<String> {
    let PlanLimit::Limits(limits) = snapshot.limits(policy, plan) else {
        return None;
    };
    let scope = &limits.scope;
    let plan_quotas = scope.quotas().iter().map(|q| (q, q.window.name()));
    let total = scope.total().iter().map(|q| (q, q.window.total_name()));
    let (quota, name) = plan_quotas
        .chain(total)
        .find(|(q, _)| q.limit.get() < cost)?;
    Some(format!(
        "cost {cost} exceeds the \"{name}\" limit of {}: it can never be admitted",
        quota.limit
    ))
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn answer(allowed: bool, retry_after: u64, report: Option<&Report>) -> CheckAnswer {
    let limits = report
        .into_iter()
        .flat_map(Report::iter)
        .map(|s| LimitAnswer {
            window: if s.total {
                s.quota.window.total_name()
            } else {
                s.quota.window.name()
            },
            limit: s.quota.limit.get(),
            remaining: s.remaining(),
            reset_after: ceil_secs(s.retry_ms.unwrap_or(s.reset_ms)),
        })
        .collect();
    CheckAnswer {
        allowed,
        retry_after,
        denied: false,
        banned: false,
        unauthorized: false,
        would_refuse: Vec::new(),
        charged: 0,
        limits,
    }
}
