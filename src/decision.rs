//! The decision service: may this caller have `cost` more requests of this policy now?
//!
//! [`decide`] answers for the proxied path and for the decision API (`POST /v1/check`)
//! alike, so a decision-API call counts exactly like a proxied request by construction.
//! It takes the config snapshot, the policy and plan, the caller's limiter key, the
//! cost and the instant; asks the store (all or nothing over the plan's quotas and the
//! policy's `total`); counts refusals in `sluice_limit_rejections_total`; and returns a
//! [`Decision`]. Turning a decision into a response is the caller's business. An
//! admitted request that is refused later (the concurrency cap) gives its quota back
//! with [`Admission::refund`]; bans are checked before this, right after the caller is
//! identified.

use crate::config::PlanId;
use crate::limit::Report;
use crate::snapshot::{Limited, PlanLimit, PolicyId, Snapshot};
use crate::store::{CallerKey, Store, Verdict};

/// One question to the decision service.
#[derive(Debug, Clone, Copy)]
pub struct Ask {
    pub policy: PolicyId,
    pub plan: PlanId,
    pub caller: CallerKey,
    /// Requests to count (the decision API's `cost`; 1 for a proxied request).
    pub cost: u32,
    /// The caller is in `[access] exempt`: never limited (a `"deny"` plan still is).
    pub exempt: bool,
}

/// The answer.
#[derive(Debug)]
pub enum Decision<'a> {
    /// Not limited: the plan has no limits under the policy, or the caller is exempt.
    Unlimited,
    /// Counted; the report says what is left.
    Admitted(Admission<'a>),
    /// The plan may not use the policy (`"deny"`).
    Denied,
    /// Over a limit; the report says which and for how long.
    Limited {
        report: Box<Report>,
        limits: &'a Limited,
    },
    /// The memory store tracks `max_keys` callers that may not be evicted.
    Full,
    /// The shared store is down and `on_error = "deny"`.
    Unavailable,
}

/// An admitted request: its report, and what a refund of it needs.
#[derive(Debug)]
pub struct Admission<'a> {
    /// Boxed: a report is hundreds of bytes, and an admission travels by value
    /// through several futures on its way to the response's headers.
    pub report: Box<Report>,
    pub limits: &'a Limited,
    caller: CallerKey,
    cost: u32,
}

impl Admission<'_> {
    /// Gives the request's quota back: it was refused after it was admitted.
    pub async fn refund(&self, snapshot: &Snapshot, store: &Store, now_ms: u64) {
        let now = snapshot.days.now(now_ms);
        let at_ms = self.report.at_ms;
        store
            .refund(&self.limits.scope, self.caller, at_ms, &now, self.cost)
            .await;
    }
}

/// Decides `ask` at `now_ms` against `snapshot`'s limits, counting it if admitted.
pub async fn decide<'a>(
    snapshot: &'a Snapshot,
    store: &Store,
    ask: Ask,
    now_ms: u64,
) -> Decision<'a> {
    let limits = match snapshot.limits(ask.policy, ask.plan) {
        PlanLimit::Unlimited => return Decision::Unlimited,
        PlanLimit::Deny => return Decision::Denied,
        PlanLimit::Limited(_) if ask.exempt => return Decision::Unlimited,
        PlanLimit::Limited(limits) => limits,
    };
    let now = snapshot.days.now(now_ms);
    let mut report = Box::<Report>::default();
    let verdict = store
        .decide(&limits.scope, ask.caller, &now, ask.cost, &mut report)
        .await;
    match verdict {
        Verdict::Admitted => {
            report.admit(ask.cost);
            Decision::Admitted(Admission {
                report,
                limits,
                caller: ask.caller,
                cost: ask.cost,
            })
        }
        Verdict::Limited => {
            for (status, counter) in report.iter().zip(&limits.rejections) {
                if status.retry_ms.is_some() {
                    counter.inc();
                }
            }
            Decision::Limited { report, limits }
        }
        Verdict::Full => Decision::Full,
        Verdict::Unavailable => Decision::Unavailable,
    }
}
