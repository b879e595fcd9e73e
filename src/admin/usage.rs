//! `GET` and `DELETE /admin/usage?caller=...`: a caller's counters per policy and
//! plan, and resetting them; `POST /admin/usage/credit`: units given back in a
//! caller's current billing periods of a policy (a top-up after a payment). On a
//! Redis Cluster whose config stacks policies, a later policy's counters sit with the
//! first policy's bucket: they are searched for (`Store::placed`) and read, reset
//! and credited with the caller's own.

use std::collections::HashMap;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use serde::{Deserialize, Serialize};

use super::{json, named_caller, problem, queried_caller, query_pairs, read_json};
use crate::admission::{NamedCaller, named_budget_key};
use crate::config::{PlanId, PolicyId};
use crate::gateway::Gateway;
use crate::http::body::Body;
use crate::http::rate_headers::ceil_secs;
use crate::limit::{Now, Report};
use crate::snapshot::{PlanLimit, PlanLimits, Snapshot};
use crate::store::listing::Listed;
use crate::store::{CallerKey, Scope, Store};

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
    let budgets = budgets(&snapshot, &target, &parts);
    let keys: Vec<CallerKey> = budgets.iter().map(|b| b.key).collect();
    let store = gateway.store();
    let placed = match placed(store, &snapshot, &keys).await {
        Ok(placed) => placed,
        Err(response) => return response,
    };
    let now_ms = gateway.clock().now_ms();
    let anchor = snapshot.anchor(target.consumer);
    let mut policies = Vec::new();
    let mut cleared = 0;
    for budget in budgets {
        let (limited, key) = (budget.limits, budget.key);
        let elsewhere = store.placed_under(&limited.scope, key, &placed);
        if reset {
            cleared += usize::from(store.reset(&limited.scope, key).await);
            for listed in &elsewhere {
                cleared += usize::from(store.reset_listed(&limited.scope, listed).await);
            }
            continue;
        }
        let now = snapshot.instant(now_ms, limited, anchor);
        let report = peek(store, &limited.scope, key, &elsewhere, &now).await;
        policies.push(UsagePolicy {
            policy: snapshot.policy_name(budget.policy).to_string(),
            plan: snapshot.plan_name(budget.plan).to_string(),
            limits: usage_limits(&report),
        });
    }
    answer(caller, &target, reset, cleared, policies)
}

/// What `usage` found: the caller's usage, its reset, or the 404 of a consumer
/// nobody knows.
fn answer(
    caller: String,
    target: &NamedCaller,
    reset: bool,
    cleared: usize,
    policies: Vec<UsagePolicy>,
) -> Response<Body> {
    // A consumer the config does not list is known only by what was counted for it
    // (a name from a token or an auth layer): with nothing counted, there is none.
    let unknown = caller.starts_with("consumer:")
        && target.consumer.is_none()
        && match reset {
            true => cleared == 0,
            false => (policies.iter().flat_map(|p| &p.limits)).all(|l| l.used == 0),
        };
    if unknown {
        let name = caller.trim_start_matches("consumer:");
        return problem(
            StatusCode::NOT_FOUND,
            &format!(
                "no consumer \"{name}\": none in the config or the consumers file, and nothing counted for that name"
            ),
        );
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

/// One (policy, plan) a caller named by the admin API has a budget in, and the key
/// that budget is counted under.
struct Budget<'s> {
    policy: PolicyId,
    plan: PlanId,
    limits: &'s PlanLimits,
    key: CallerKey,
}

/// Every (policy, plan) the caller is limited by (its own plan if it has one), with
/// its budget key from the query's parts (a missing part under `on_missing =
/// "deny"` has no budget to show).
fn budgets<'s>(
    snapshot: &'s Snapshot,
    target: &NamedCaller,
    parts: &HashMap<String, String>,
) -> Vec<Budget<'s>> {
    let mut budgets = Vec::new();
    for policy in snapshot.policies() {
        let plans: Vec<_> = match target.plan {
            Some(plan) => vec![plan],
            None => snapshot.plans().collect(),
        };
        for plan in plans {
            let PlanLimit::Limits(limits) = snapshot.limits_for(policy, plan, target.consumer)
            else {
                continue;
            };
            if let Ok(key) = named_budget_key(snapshot, policy, target.key, parts) {
                budgets.push(Budget {
                    policy,
                    plan,
                    limits,
                    key,
                });
            }
        }
    }
    budgets
}

/// The keys of `keys` placed with a first policy's bucket (on a Redis Cluster whose
/// config stacks policies), or the 503 when Redis cannot be searched.
async fn placed(
    store: &Store,
    snapshot: &Snapshot,
    keys: &[CallerKey],
) -> Result<Vec<String>, Response<Body>> {
    if !snapshot.config().routes.iter().any(|route| route.stacked()) {
        return Ok(Vec::new());
    }
    store.placed(keys).await.map_err(|err| {
        let why = format!("the store could not be searched for the caller's counters: {err}");
        problem(StatusCode::SERVICE_UNAVAILABLE, &why)
    })
}

/// The caller's counters under `scope`: its own key's, or, when those are empty,
/// the fullest of those placed with another policy's bucket (`elsewhere`).
async fn peek(
    store: &Store,
    scope: &Scope,
    key: CallerKey,
    elsewhere: &[Listed],
    now: &Now,
) -> Report {
    let mut report = Report::default();
    store.peek(scope, key, now, &mut report).await;
    let used = |report: &Report| report.iter().map(|s| u64::from(s.used)).sum::<u64>();
    for listed in elsewhere {
        let mut placed = Report::default();
        let read = store.peek_listed(scope, listed, now, &mut placed).await;
        if read.is_ok() && used(&placed) > used(&report) {
            report = placed;
        }
    }
    report
}

/// `POST /admin/usage/credit`'s body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreditRequest {
    /// `consumer:NAME` or `ip:ADDRESS`.
    caller: String,
    /// The policy whose periods are credited.
    policy: String,
    /// Units to give back (at least 1).
    amount: u32,
    /// The plan whose counters are credited; by default the caller's own.
    plan: Option<String>,
    /// A keyed policy's parts, as `/v1/check` takes them.
    #[serde(default)]
    key: HashMap<String, String>,
}

#[derive(Serialize)]
struct Credited {
    caller: String,
    policy: String,
    plan: String,
    credited: u32,
    /// The caller's windows of the policy after the credit.
    limits: Vec<UsageLimit>,
}

/// Gives `amount` units back in the caller's current billing periods (`per_month`,
/// `per_year`) of the policy: never below zero used. Logged and counted in
/// `sluice_usage_credits_total`; with Redis, for the whole fleet at once.
pub(super) async fn credit(gateway: &Gateway, request: Request<Incoming>) -> Response<Body> {
    let asked: CreditRequest = match read_json(request).await {
        Ok(asked) => asked,
        Err(response) => return response,
    };
    let snapshot = gateway.snapshot();
    let Some(policy) = snapshot.policy_id(&asked.policy) else {
        let unknown = format!("unknown policy \"{}\"", asked.policy);
        return problem(StatusCode::BAD_REQUEST, &unknown);
    };
    let target = match named_caller(&asked.caller, &snapshot) {
        Ok(target) => target,
        Err(response) => return *response,
    };
    let plan = match plan_to_credit(&snapshot, asked.plan.as_deref(), &target) {
        Ok(plan) => plan,
        Err(response) => return *response,
    };
    if asked.amount == 0 {
        return problem(StatusCode::BAD_REQUEST, "amount must be at least 1");
    }
    let (policy_name, plan_name) = (snapshot.policy_name(policy), snapshot.plan_name(plan));
    let PlanLimit::Limits(limits) = snapshot.limits_for(policy, plan, target.consumer) else {
        let why =
            format!("policy {policy_name} does not limit plan {plan_name}: nothing to credit");
        return problem(StatusCode::BAD_REQUEST, &why);
    };
    if !limits.periods {
        let why = format!(
            "policy {policy_name} has no per_month or per_year for plan {plan_name}: a credit goes to billing periods"
        );
        return problem(StatusCode::BAD_REQUEST, &why);
    }
    let key = match named_budget_key(&snapshot, policy, target.key, &asked.key) {
        Ok(key) => key,
        Err(refusal) => return problem(StatusCode::BAD_REQUEST, &refusal.to_string()),
    };
    let now = snapshot.instant(
        gateway.clock().now_ms(),
        limits,
        snapshot.anchor(target.consumer),
    );
    let store = gateway.store();
    let placed = match placed(store, &snapshot, &[key]).await {
        Ok(placed) => store.placed_under(&limits.scope, key, &placed),
        Err(response) => return response,
    };
    if !credit_placed(store, &limits.scope, key, &placed, &now, asked.amount).await {
        return problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "the shared store did not answer: nothing was credited",
        );
    }
    gateway
        .metrics()
        .usage_credits
        .with_label_values(&[policy_name])
        .inc();
    tracing::info!(
        caller = %asked.caller,
        policy = %policy_name,
        plan = %plan_name,
        amount = asked.amount,
        "usage credited through the admin API"
    );
    let report = peek(store, &limits.scope, key, &placed, &now).await;
    json(
        StatusCode::OK,
        &Credited {
            caller: asked.caller,
            policy: policy_name.to_string(),
            plan: plan_name.to_string(),
            credited: asked.amount,
            limits: usage_limits(&report),
        },
    )
}

/// The plan whose counters a credit goes to: the one `asked` for, else the caller's
/// own (unknown for a caller the config does not list).
fn plan_to_credit(
    snapshot: &Snapshot,
    asked: Option<&str>,
    target: &NamedCaller,
) -> Result<PlanId, Box<Response<Body>>> {
    let bad = |why: &str| Box::new(problem(StatusCode::BAD_REQUEST, why));
    match (asked, target.plan) {
        (Some(name), _) => {
            (snapshot.plan_id(name)).ok_or_else(|| bad(&format!("unknown plan \"{name}\"")))
        }
        (None, Some(plan)) => Ok(plan),
        (None, None) => Err(bad("plan is required for this caller")),
    }
}

/// Credits `amount` to `key`'s counters and to those `placed` with them; false if
/// the shared store did not answer for one of them.
async fn credit_placed(
    store: &Store,
    scope: &Scope,
    key: CallerKey,
    placed: &[Listed],
    now: &Now,
    amount: u32,
) -> bool {
    let mut credited = store.credit(scope, key, now, amount).await;
    for listed in placed {
        credited &= (store.credit_listed(scope, listed, now, amount)).await;
    }
    credited
}

/// The caller's own windows of a report, as `/admin/usage` shows them.
fn usage_limits(report: &Report) -> Vec<UsageLimit> {
    report
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
        .collect()
}

/// The limit key parts a usage query names: every parameter but `caller`
/// (`header:x-tenant-id=t1&path:2=orders`), decoded.
fn key_params(request: &Request<Incoming>) -> HashMap<String, String> {
    query_pairs(request)
        .filter(|(name, _)| name != "caller")
        .map(|(name, value)| (name.into_owned(), value.into_owned()))
        .collect()
}
