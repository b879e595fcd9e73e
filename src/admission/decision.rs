//! The rate decision: may this caller have `cost` more requests of this policy now?
//!
//! [`decide`] is the admission step both doors of [`super::Admission`] end in. It
//! takes the config snapshot, the policy and plan, the caller's limiter key, the cost
//! and the instant; asks the store (all or nothing over the plan's quotas and the
//! policy's `total`); counts refusals in `sluice_limit_rejections_total`; and returns a
//! [`Decision`]. [`refusal_on_route`] says what a decision means for a proxied request;
//! the decision API turns it into its JSON answer. An admitted request that is refused
//! later (the concurrency cap) gives its quota back with [`Counted::refund`].
//!
//! A policy in shadow mode decides exactly as if enforced, but a request its limits
//! would refuse is admitted anyway, charged nothing (as a refused one would be, so
//! that switching to enforce finds the very counters enforcement would have kept):
//! [`Counted::would_refuse`] says so, and admission reports it.

use crate::config::PolicyId;
use crate::config::route::Route;
use crate::config::{ConsumerId, PlanId, PolicyMode};
use crate::http::refusal::Refusal;
use crate::limit::{Anchor, Now, Periods, Quota, Report};
use crate::observe::metrics::Metrics;
use crate::snapshot::{PlanLimit, PlanLimits, Snapshot};
use crate::store::{CallerKey, Store, Verdict};

/// One question to the decision service.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ask<'k> {
    pub policy: PolicyId,
    pub plan: PlanId,
    pub caller: CallerKey,
    /// The consumer the caller is, if it is one: its own `limits` apply.
    pub consumer: Option<ConsumerId>,
    /// Units to count: the decision API's `cost`, or the route's `cost` for a proxied
    /// request.
    pub cost: u32,
    /// The caller is in `[access] exempt`: never limited (a `"deny"` plan still is).
    pub exempt: bool,
    /// A route of several policies: each policy, in order, with the key it counts
    /// under (the first's are `policy` and `caller`), decided all or nothing by
    /// [`super::stacked`]; empty for one policy.
    pub stack: &'k [(PolicyId, CallerKey)],
}

/// The answer.
#[derive(Debug)]
pub(crate) enum Decision<'a> {
    /// Not limited: the plan has no limits under the policy, or the caller is exempt.
    Unlimited,
    /// Counted; the report says what is left.
    Admitted(Counted<'a>),
    /// The plan may not use the policy (`"deny"`).
    Denied,
    /// Over a limit; the report says which and for how long.
    Limited {
        report: Box<Report>,
        limits: &'a PlanLimits,
    },
    /// Over a limit of a policy of a stacked route: every policy's report (the
    /// first policy's part, the others in its `stacked`), nothing counted in any.
    StackLimited(Box<Counted<'a>>),
    /// The shared store is down and `on_error = "deny"`.
    Unavailable,
}

/// What an admitted request was counted as: its report, and what a refund needs.
#[derive(Debug)]
pub(crate) struct Counted<'a> {
    /// Boxed: a report is hundreds of bytes, and an admission travels by value
    /// through several futures on its way to the response's headers.
    pub report: Box<Report>,
    pub limits: &'a PlanLimits,
    pub(super) caller: CallerKey,
    /// What was charged: the cost, or 0 for a would-be refusal of a shadow policy.
    pub(super) cost: u32,
    /// The billing periods it was counted in, if its quotas have any.
    pub(super) periods: Option<Periods>,
    /// In a stacked decision: the policy this part counted in (its name is part of
    /// its limits' names).
    pub(super) policy: Option<PolicyId>,
    /// A stacked decision's other policies, in the route's order, each counted in
    /// the same decision; empty otherwise.
    pub(super) stacked: Vec<Counted<'a>>,
}

impl Counted<'_> {
    /// The caller's limiter key.
    pub(crate) fn caller(&self) -> CallerKey {
        self.caller
    }

    /// What admission charged (0 for a would-be refusal of a shadow policy).
    pub(crate) fn charged(&self) -> u32 {
        self.cost
    }

    /// Records that `cost`, what was charged, was given back (in every policy of a
    /// stacked decision): the reports show it, and nothing is left to settle.
    pub(crate) fn refunded(&mut self, cost: u32) {
        if self.cost > 0 {
            self.report.refund(cost);
        }
        self.cost = 0;
        for part in &mut self.stacked {
            part.refunded(cost);
        }
    }

    /// Whether a shadow policy admitted the request although its limits would have
    /// refused it (nothing was charged there).
    pub(crate) fn would_refuse(&self) -> bool {
        self.parts().any(|part| part.report.rejected())
    }

    /// Whether this is a stacked decision's (a route of several policies).
    pub(crate) fn is_stacked(&self) -> bool {
        self.policy.is_some()
    }

    /// This part and a stacked decision's others, in the route's order.
    pub(crate) fn parts(&self) -> impl Iterator<Item = &Counted<'_>> {
        std::iter::once(self).chain(self.stacked.iter())
    }

    /// Gives the request's quota back: it was refused after it was admitted, or its
    /// answer is one its route refunds. Returns what was given back (`None` when
    /// nothing had been charged).
    pub(crate) async fn refund(
        &self,
        snapshot: &Snapshot,
        store: &Store,
        now_ms: u64,
    ) -> Option<u32> {
        if self.policy.is_some() {
            return self.refund_stacked(snapshot, store, now_ms).await;
        }
        if self.cost == 0 {
            return None;
        }
        let now = Now {
            periods: self.periods,
            ..snapshot.days.now(now_ms)
        };
        let at_ms = self.report.at_ms;
        store
            .refund(&self.limits.scope, self.caller, at_ms, &now, self.cost)
            .await;
        Some(self.cost)
    }
}

/// Decides `ask` at `now_ms` against `snapshot`'s limits, counting it if admitted.
pub(crate) async fn decide<'a>(
    snapshot: &'a Snapshot,
    store: &Store,
    metrics: &Metrics,
    ask: Ask<'_>,
    now_ms: u64,
) -> Decision<'a> {
    if !ask.stack.is_empty() {
        // Boxed: a single policy's decision does not carry its size.
        let stacked = Box::pin(super::stacked::decide(
            snapshot, store, metrics, ask, now_ms,
        ));
        return stacked.await;
    }
    let limits = match snapshot.limits_for(ask.policy, ask.plan, ask.consumer) {
        PlanLimit::Unlimited => return Decision::Unlimited,
        PlanLimit::Deny => return Decision::Denied,
        PlanLimit::Limits(_) if ask.exempt => return Decision::Unlimited,
        PlanLimit::Limits(limits) => limits,
    };
    let counts = Counts {
        limits,
        caller: ask.caller,
        cost: ask.cost,
        anchor: snapshot.anchor(ask.consumer),
    };
    decide_in(snapshot, store, metrics, counts, now_ms, || {
        (
            snapshot.policy_name(ask.policy),
            snapshot.plan_name(ask.plan),
        )
    })
    .await
}

/// `cost` more of `caller` in `limits`: what [`decide_in`] counts.
pub(crate) struct Counts<'a> {
    pub limits: &'a PlanLimits,
    pub caller: CallerKey,
    pub cost: u32,
    /// The day the caller's billing periods start on.
    pub anchor: Anchor,
}

/// Decides `counts` at `now_ms`, counting them if admitted; `names` gives the
/// policy and plan a refusal of a caller in debt is counted under.
pub(crate) async fn decide_in<'a, 'n>(
    snapshot: &Snapshot,
    store: &Store,
    metrics: &Metrics,
    counts: Counts<'a>,
    now_ms: u64,
    names: impl FnOnce() -> (&'n str, &'n str),
) -> Decision<'a> {
    let Counts {
        limits,
        caller,
        cost,
        anchor,
    } = counts;
    let now = snapshot.instant(now_ms, limits, anchor);
    let mut report = Box::<Report>::default();
    let verdict = (store.decide(&limits.scope, caller, &now, cost, &mut report)).await;
    match verdict {
        Verdict::Admitted => {
            report.admit(cost);
            Decision::Admitted(Counted {
                report,
                limits,
                caller,
                cost,
                periods: now.periods,
                policy: None,
                stacked: Vec::new(),
            })
        }
        Verdict::Limited if matches!(limits.mode, PolicyMode::Shadow { .. }) => {
            Decision::Admitted(Counted {
                report,
                limits,
                caller,
                cost: 0,
                periods: now.periods,
                policy: None,
                stacked: Vec::new(),
            })
        }
        Verdict::Limited => {
            let mut debt_counted = false;
            let mut names = Some(names);
            for (status, counter) in report.iter().zip(&limits.rejections) {
                match (status.retry_ms, status.in_debt()) {
                    (None, _) => {}
                    (Some(_), false) => counter.inc(),
                    // Debt is off the hot path: its series is looked up when counted.
                    (Some(_), true) if !debt_counted => {
                        debt_counted = true;
                        if let Some(names) = names.take() {
                            let (policy, plan) = names();
                            metrics.debt_rejection(policy, plan);
                        }
                    }
                    (Some(_), true) => {}
                }
            }
            Decision::Limited { report, limits }
        }
        Verdict::Unavailable => Decision::Unavailable,
    }
}

/// What `decision` means for a request on `route` by a caller of `plan`: what it was
/// counted as (`None`: not limited), or its refusal.
pub(crate) fn refusal_on_route<'a>(
    snapshot: &Snapshot,
    route: &Route,
    plan: PlanId,
    decision: Decision<'a>,
) -> Result<Option<Counted<'a>>, Refusal> {
    match decision {
        Decision::Unlimited => Ok(None),
        Decision::Admitted(counted) => Ok(Some(counted)),
        Decision::Denied if plan == PlanId::ANONYMOUS => Err(Refusal::KeyRequired {
            route: route.name.clone(),
        }),
        Decision::Denied => Err(Refusal::PlanDenied {
            plan: snapshot.plan_name(plan).to_string(),
            route: route.name.clone(),
        }),
        Decision::Limited { report, limits } => Err(Refusal::Limited {
            detail: limited_detail(snapshot, route, plan, &report),
            report,
            policy_header: limits.policy_header.clone(),
        }),
        Decision::StackLimited(counted) => {
            Err(super::stacked::refusal(snapshot, route, plan, &counted))
        }
        Decision::Unavailable => Err(Refusal::StoreUnavailable),
    }
}

/// "per_minute limit of 100 for plan registered on route orders"
///
/// The last one made on this thread is kept with what it was made from: a caller
/// hammering past its limit is refused for the same reason over and over, and
/// formatting it again each time was a twelfth of a 429's cost (`docs/performance.md`,
/// "Figures behind the code").
fn limited_detail(snapshot: &Snapshot, route: &Route, plan: PlanId, report: &Report) -> String {
    thread_local! {
        static LAST: std::cell::RefCell<Option<(DetailKey, String)>> =
            const { std::cell::RefCell::new(None) };
    }
    let Some(status) = report.iter().find(|s| s.retry_ms.is_some()) else {
        return format!("rate limit exceeded on route {}", route.name);
    };
    let key = DetailKey {
        generation: snapshot.generation,
        route: std::ptr::from_ref(route) as usize,
        plan,
        quota: status.quota,
        total: status.total,
    };
    LAST.with_borrow_mut(|last| {
        if let Some((_, detail)) = last.as_ref().filter(|(made_for, _)| *made_for == key) {
            return detail.clone();
        }
        let quota = status.quota;
        let detail = if status.total {
            let policy = route.policy.map_or("", |p| snapshot.policy_name(p));
            format!(
                "total {} limit of {} for policy {policy} on route {}",
                quota.window.key(),
                quota.limit,
                route.name
            )
        } else {
            format!(
                "{} limit of {} for plan {} on route {}",
                quota.window.key(),
                quota.limit,
                snapshot.plan_name(plan),
                route.name
            )
        };
        *last = Some((key, detail.clone()));
        detail
    })
}

/// What a refusal's detail is made from (routes are compared by address within
/// one snapshot generation).
#[derive(Clone, Copy, PartialEq)]
struct DetailKey {
    generation: u64,
    route: usize,
    plan: PlanId,
    quota: Quota,
    total: bool,
}
