//! The rate decision of a route of several policies (`policy = ["org", "per_key",
//! "per_ip"]`): every policy must admit, all or nothing.
//!
//! Each policy counts the request under its own budget key (its `key`, else the
//! caller's), against its own quotas for the caller's plan, in its own mode. The
//! store decides all of them at once ([`Store::decide_stacked`]): a refusal by any
//! enforcing policy counts nothing in any, and a policy in shadow mode that would
//! refuse is charged nothing and refuses nothing. A policy that does not limit the
//! plan (or an exempt caller) takes no part; a policy that denies the plan refuses
//! the request (401) before anything is counted.
//!
//! The answer is one [`Counted`] per policy that took part: the first holds the
//! others (`stacked`), so a refund (the concurrency cap, `refund_on`) gives back in
//! every policy what it was charged, in the counters the decision counted in. The
//! `RateLimit` headers list every limit of every policy, named by policy and window
//! (`"org-month"`); a 429 names the limits that refused in `violated-policies` and
//! the first of them in its `detail`.

use http::HeaderValue;

use super::decision::{Ask, Counted, Decision};
use crate::config::route::Route;
use crate::config::{PlanId, PolicyId, PolicyMode};
use crate::http::rate_headers;
use crate::http::refusal::{Refusal, StackLimited};
use crate::limit::{Now, Report};
use crate::observe::metrics::Metrics;
use crate::snapshot::{PlanLimit, PlanLimits, Snapshot};
use crate::store::{CallerKey, Stacked, Store, Verdict};

/// Decides `ask`, whose `stack` names every policy of the route and its key, at
/// `now_ms`, all or nothing.
pub(super) async fn decide<'a>(
    snapshot: &'a Snapshot,
    store: &Store,
    metrics: &Metrics,
    ask: Ask<'_>,
    now_ms: u64,
) -> Decision<'a> {
    let mut taking_part: Vec<(PolicyId, CallerKey, &'a PlanLimits)> =
        Vec::with_capacity(ask.stack.len());
    for &(policy, key) in ask.stack {
        match snapshot.limits_for(policy, ask.plan, ask.consumer) {
            PlanLimit::Deny => return Decision::Denied,
            PlanLimit::Unlimited => {}
            PlanLimit::Limits(_) if ask.exempt => {}
            PlanLimit::Limits(limits) => taking_part.push((policy, key, limits)),
        }
    }
    if taking_part.is_empty() {
        return Decision::Unlimited;
    }
    let anchor = snapshot.anchor(ask.consumer);
    let parts: Vec<Stacked<'_>> = (taking_part.iter())
        .map(|&(_, key, limits)| Stacked {
            scope: &limits.scope,
            caller: key,
            now: snapshot.instant(now_ms, limits, anchor),
            shadow: matches!(limits.mode, PolicyMode::Shadow { .. }),
        })
        .collect();
    let mut reports = vec![Report::default(); parts.len()];
    let verdict = store.decide_stacked(&parts, ask.cost, &mut reports).await;
    let admitted = match verdict {
        Verdict::Unavailable => return Decision::Unavailable,
        verdict => verdict == Verdict::Admitted,
    };
    let mut counted: Vec<Counted<'a>> = Vec::with_capacity(parts.len());
    for ((&(policy, key, limits), part), report) in taking_part.iter().zip(&parts).zip(reports) {
        let mut report = Box::new(report);
        let charged = admitted && !report.rejected();
        if charged {
            report.admit(ask.cost);
        } else if !admitted && !part.shadow {
            count_rejections(snapshot, metrics, policy, ask.plan, limits, &report);
        }
        counted.push(Counted {
            report,
            limits,
            caller: key,
            cost: if charged { ask.cost } else { 0 },
            periods: part.now.periods,
            policy: Some(policy),
            stacked: Vec::new(),
        });
    }
    let mut first = counted.remove(0);
    first.stacked = counted;
    match admitted {
        true => Decision::Admitted(first),
        false => Decision::StackLimited(Box::new(first)),
    }
}

/// Counts the refusals of an enforcing policy's limits in
/// `sluice_limit_rejections_total` (a window in debt once, under `cost`).
fn count_rejections(
    snapshot: &Snapshot,
    metrics: &Metrics,
    policy: PolicyId,
    plan: PlanId,
    limits: &PlanLimits,
    report: &Report,
) {
    let mut debt_counted = false;
    for (status, counter) in report.iter().zip(&limits.rejections) {
        match (status.retry_ms, status.in_debt()) {
            (None, _) => {}
            (Some(_), false) => counter.inc(),
            (Some(_), true) if !debt_counted => {
                debt_counted = true;
                metrics.debt_rejection(snapshot.policy_name(policy), snapshot.plan_name(plan));
            }
            (Some(_), true) => {}
        }
    }
}

/// The 429 of a stacked decision that refused: the limits of the enforcing policies
/// that refused in `violated-policies`, the first in `detail`, `Retry-After` until
/// every one of them would admit, and every policy's headers.
pub(super) fn refusal(
    snapshot: &Snapshot,
    route: &Route,
    plan: PlanId,
    counted: &Counted<'_>,
) -> Refusal {
    let mut violated = smallvec::SmallVec::new();
    let mut retry_ms = 0;
    let mut detail = None;
    let refusing = counted
        .parts()
        .filter(|part| !matches!(part.limits.mode, PolicyMode::Shadow { .. }));
    for part in refusing {
        let statuses = part.report.iter().zip(part.limits.stacked_names.iter());
        for (status, &name) in statuses {
            let Some(wait) = status.retry_ms else {
                continue;
            };
            violated.push(name);
            retry_ms = retry_ms.max(wait);
            if detail.is_none() {
                let policy = part.policy.map_or("", |p| snapshot.policy_name(p));
                let (window, limit) = (status.quota.window.key(), status.quota.limit);
                detail = Some(match status.total {
                    true => format!(
                        "total {window} limit of {limit} for policy {policy} on route {}",
                        route.name
                    ),
                    false => format!(
                        "{window} limit of {limit} for plan {} in policy {policy} on route {}",
                        snapshot.plan_name(plan),
                        route.name
                    ),
                });
            }
        }
    }
    let (policy_header, state_header) = headers(counted, None);
    Refusal::StackLimited(Box::new(StackLimited {
        detail: detail.unwrap_or_else(|| format!("rate limit exceeded on route {}", route.name)),
        violated,
        retry_ms,
        policy_header,
        state_header,
    }))
}

/// `RateLimit-Policy` and `RateLimit` of every policy of a stacked decision (but a
/// shadow policy's whose `shadow_headers` is off), each limit named by its policy.
pub(super) fn headers(
    counted: &Counted<'_>,
    concurrency: Option<u32>,
) -> (Option<HeaderValue>, Option<HeaderValue>) {
    let shown = counted
        .parts()
        .filter(|part| part.limits.mode != (PolicyMode::Shadow { headers: false }))
        .map(|part| {
            let limits = part.limits;
            (
                limits.stacked_header.as_ref(),
                &*limits.stacked_names,
                &*part.report,
            )
        });
    rate_headers::stacked_headers(shown, concurrency)
}

impl Counted<'_> {
    /// Gives back, in every policy of a stacked decision, what it was charged there,
    /// in the counters the decision counted in; the most any policy was charged, or
    /// `None` if none was.
    pub(super) async fn refund_stacked(
        &self,
        snapshot: &Snapshot,
        store: &Store,
        now_ms: u64,
    ) -> Option<u32> {
        let costs: Vec<u32> = self.parts().map(Counted::charged).collect();
        let charged = costs.iter().copied().max().unwrap_or(0);
        if charged == 0 {
            return None;
        }
        let day = snapshot.days.now(now_ms);
        let parts: Vec<Stacked<'_>> = (self.parts())
            .map(|part| Stacked {
                scope: &part.limits.scope,
                caller: part.caller(),
                now: Now {
                    ms: part.report.at_ms,
                    periods: part.periods,
                    ..day
                },
                shadow: false,
            })
            .collect();
        store.settle_stacked(&parts, &costs, false).await;
        Some(charged)
    }
}
