//! `POST /v1/check`: the decision API for services that are not proxied.
//!
//! The body names a policy, a caller, optionally a plan and a cost (or a charge);
//! the answer is admission's (`crate::admission::Admission::answer`): every rule of
//! what may be asked and every decision is there, so a check counts exactly like a
//! proxied request of that caller on a route of that policy. This module reads the
//! question's JSON and writes the answer's, nothing else.

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use serde::{Deserialize, Serialize};

use super::{json, problem, read_json};
use crate::admission::{Answer, Counted, Decision, Question};
use crate::gateway::Gateway;
use crate::http::body::Body;
use crate::http::rate_headers::ceil_secs;
use crate::limit::Report;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckRequest {
    /// A policy's name, or a list of them decided all or nothing as on a route of
    /// several policies.
    policy: Policies,
    caller: String,
    plan: Option<String>,
    cost: Option<u32>,
    /// Units to charge now, whatever is left: a cost known after the fact.
    charge: Option<u32>,
    /// A keyed policy's parts: `{"header:x-tenant-id": "t1", "path:2": "orders"}`.
    #[serde(default)]
    key: std::collections::HashMap<String, String>,
}

/// `"policy": "standard"` or `"policy": ["org", "per_key"]`.
#[derive(Deserialize)]
#[serde(untagged)]
enum Policies {
    One(String),
    Several(Vec<String>),
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
    let asked: CheckRequest = match read_json(request).await {
        Ok(asked) => asked,
        Err(response) => return response,
    };
    let (policy, stack) = match &asked.policy {
        Policies::One(policy) => (policy.as_str(), &[][..]),
        Policies::Several(list) => match list.as_slice() {
            [] => return problem(StatusCode::BAD_REQUEST, "policy: an empty list"),
            [one] => (one.as_str(), &[][..]),
            several => (several[0].as_str(), several),
        },
    };
    let question = Question {
        policy,
        stack,
        caller: &asked.caller,
        plan: asked.plan.as_deref(),
        cost: asked.cost,
        charge: asked.charge,
        key: &asked.key,
    };
    let snapshot = gateway.snapshot();
    let answered = gateway.admission().answer(&snapshot, &question).await;
    let outcome = answered.as_ref().map_or("bad_request", outcome);
    let decisions = &gateway.metrics().decisions;
    decisions.with_label_values(&["check", outcome]).inc();
    match answered {
        Ok(answered) => json(StatusCode::OK, &rendered(answered)),
        Err(err) => problem(StatusCode::BAD_REQUEST, &err.to_string()),
    }
}

/// The `outcome` label of `sluice_decisions_total` for an answer.
fn outcome(answered: &Answer<'_>) -> &'static str {
    match answered {
        Answer::Decided(Decision::Limited { .. } | Decision::StackLimited(_)) => "limited",
        Answer::Decided(Decision::Denied) => "forbidden",
        Answer::Decided(Decision::Unavailable) => "unavailable",
        Answer::Banned { .. } => "banned",
        Answer::Unauthorized => "unauthorized",
        Answer::Decided(Decision::Admitted(_) | Decision::Unlimited)
        | Answer::Charged { .. }
        | Answer::NotCharged => "allowed",
    }
}

/// The JSON of admission's answer.
fn rendered(answered: Answer<'_>) -> CheckAnswer {
    match answered {
        Answer::Decided(Decision::Unlimited) => answer(true, 0, None),
        Answer::Decided(Decision::Denied) => CheckAnswer {
            denied: true,
            ..answer(false, 0, None)
        },
        Answer::Unauthorized => CheckAnswer {
            unauthorized: true,
            ..answer(false, 0, None)
        },
        Answer::Banned { until_ms, now_ms } => CheckAnswer {
            banned: true,
            ..answer(
                false,
                ceil_secs(until_ms.saturating_sub(now_ms)).max(1),
                None,
            )
        },
        Answer::Decided(Decision::Admitted(counted)) if counted.is_stacked() => CheckAnswer {
            would_refuse: counted.parts().flat_map(|p| p.report.fired()).collect(),
            ..stacked_answer(true, 0, &counted)
        },
        Answer::Decided(Decision::Admitted(counted)) => CheckAnswer {
            would_refuse: counted.report.fired().collect(),
            ..answer(true, 0, Some(&counted.report))
        },
        Answer::Decided(Decision::StackLimited(counted)) => {
            let retry = counted.parts().filter_map(|p| p.report.retry_ms()).max();
            let retry_after = ceil_secs(retry.unwrap_or(1_000)).max(1);
            stacked_answer(false, retry_after, &counted)
        }
        Answer::Decided(Decision::Limited { report, .. }) => {
            let retry_after = ceil_secs(report.retry_ms().unwrap_or(1_000)).max(1);
            answer(false, retry_after, Some(&report))
        }
        // A charge answers the caller's state after it: not allowed while in debt.
        Answer::Charged { units, report } => {
            let retry_after = report.retry_ms().map_or(0, |ms| ceil_secs(ms).max(1));
            CheckAnswer {
                charged: units,
                ..answer(retry_after == 0, retry_after, Some(&report))
            }
        }
        Answer::NotCharged => answer(true, 0, None),
        Answer::Decided(Decision::Unavailable) => answer(false, 1, None),
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The answer to a question about several policies: every limit of every policy,
/// named by policy and window (`"org-month"`), as the `RateLimit` headers name them.
fn stacked_answer(allowed: bool, retry_after: u64, counted: &Counted<'_>) -> CheckAnswer {
    let limits = (counted.parts())
        .flat_map(|part| part.report.iter().zip(part.limits.stacked_names.iter()))
        .map(|(s, name)| LimitAnswer {
            window: name,
            limit: s.quota.limit.get(),
            remaining: s.remaining(),
            reset_after: ceil_secs(s.retry_ms.unwrap_or(s.reset_ms)),
        })
        .collect();
    CheckAnswer {
        limits,
        ..answer(allowed, retry_after, None)
    }
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
