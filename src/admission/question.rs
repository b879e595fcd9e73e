//! Admission's second door: a caller, named as the admin API names callers, asked
//! about a policy: may it spend `cost` now, or charge `charge` whatever is left?
//!
//! `POST /v1/check` asks it today, and the decision listener (an Envoy rate limit
//! request, whose descriptors name a policy, a caller and key parts) will ask the
//! same [`Question`]. The answer is the proxied path's: the access lists, bans and
//! exemption of an `ip:` caller, the bans of any caller, the budget key of a keyed
//! policy, then the rate decision, so a question counts exactly like a proxied
//! request of that caller on a route of that policy. A limited caller earns its
//! strike; what a shadow policy would have refused is counted.
//!
//! Every rule about what may be asked is here too (an unknown name, a cost that can
//! never fit, a disabled consumer); the door's callers only read and write their
//! own format.

use std::collections::HashMap;
use std::net::IpAddr;

use super::decision::{self, Decision};
use super::{Account, Admission, NamedCaller, access, budget, named};
use crate::config::{PlanId, PolicyId};
use crate::http::refusal::Refusal;
use crate::limit::Report;
use crate::observe::metrics::NO_ROUTE;
use crate::snapshot::{PlanLimit, Snapshot};

/// A question about a caller on a policy, or on several at once.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Question<'q> {
    /// The policy, by name; with several, the first.
    pub policy: &'q str,
    /// Several policies, by name, decided all or nothing as on a route of several
    /// policies (`["org", "per_key"]`); empty for one.
    pub stack: &'q [String],
    /// The caller: `consumer:NAME` or `ip:ADDRESS`.
    pub caller: &'q str,
    /// The plan to decide as; by default the caller's own (an address's is
    /// `anonymous`, a configured consumer's its plan).
    pub plan: Option<&'q str>,
    /// Units to count if they fit (default 1).
    pub cost: Option<u32>,
    /// Units to charge now, whatever is left: a cost known after the fact.
    pub charge: Option<u32>,
    /// A keyed policy's parts: `header:x-tenant-id` -> `t1`, `path:2` -> `orders`.
    pub key: &'q HashMap<String, String>,
}

/// What admission answers a [`Question`].
#[derive(Debug)]
pub(crate) enum Answer<'a> {
    /// The rate decision, as a proxied request of the caller would get it. An
    /// address in `[access] deny`, and a question lacking a part of the policy's key
    /// under `on_missing = "deny"`, are [`Decision::Denied`] too, as such a request
    /// would be refused.
    Decided(Decision<'a>),
    /// The caller is banned until `until_ms`.
    Banned { until_ms: u64, now_ms: u64 },
    /// The caller is a disabled consumer, whose key a proxied request would find
    /// refused with 401; nothing is counted.
    Unauthorized,
    /// `charge` units were counted; the report says the caller's state after them.
    Charged { units: u32, report: Box<Report> },
    /// Nothing to charge: the plan is not limited by the policy.
    NotCharged,
}

/// A question that cannot be answered as asked: its text says why.
#[derive(Debug, thiserror::Error)]
pub(crate) enum QuestionError {
    #[error("unknown policy \"{0}\"")]
    UnknownPolicy(String),
    #[error("policy \"{0}\" is listed twice")]
    PolicyTwice(String),
    #[error("charge takes one policy: charge each policy of a list on its own")]
    ChargeStack,
    #[error("caller must be kind:name, e.g. consumer:batch-job or ip:1.2.3.4")]
    BadCaller,
    #[error("unknown plan \"{0}\"")]
    UnknownPlan(String),
    #[error("plan is required for this caller")]
    PlanRequired,
    #[error("send cost or charge, not both")]
    CostAndCharge,
    #[error("cost must be at least 1")]
    ZeroCost,
    /// A window smaller than the cost never has room for it, so the honest answer is
    /// an error, not a wait.
    #[error("cost {cost} exceeds the \"{window}\" limit of {limit}: it can never be admitted")]
    NeverFits {
        cost: u32,
        window: &'static str,
        limit: u32,
    },
    /// A key part that no request could send (too long, given twice).
    #[error("{0}")]
    BadKey(Refusal),
}

impl Admission {
    /// Answers `question` against `snapshot`, counting (or charging) what it asks.
    pub(crate) async fn answer<'a>(
        &self,
        snapshot: &'a Snapshot,
        question: &Question<'_>,
    ) -> Result<Answer<'a>, QuestionError> {
        let policy = (snapshot.policy_id(question.policy))
            .ok_or_else(|| QuestionError::UnknownPolicy(question.policy.to_string()))?;
        let mut stacked: Vec<PolicyId> = Vec::with_capacity(question.stack.len());
        for name in question.stack {
            let id = (snapshot.policy_id(name))
                .ok_or_else(|| QuestionError::UnknownPolicy(name.to_string()))?;
            if stacked.contains(&id) {
                return Err(QuestionError::PolicyTwice(name.to_string()));
            }
            stacked.push(id);
        }
        let caller =
            NamedCaller::parse(question.caller, snapshot).ok_or(QuestionError::BadCaller)?;
        let plan = plan(snapshot, question.plan, caller.plan)?;
        // Like its key on the proxied path: refused as if unknown, before any count.
        if caller
            .consumer
            .is_some_and(|c| snapshot.consumer_disabled(c))
        {
            return Ok(Answer::Unauthorized);
        }
        if let Some(units) = question.charge {
            if question.cost.is_some() {
                return Err(QuestionError::CostAndCharge);
            }
            if !stacked.is_empty() {
                return Err(QuestionError::ChargeStack);
            }
            let account = Account {
                policy,
                plan,
                key: caller.key,
                anchor: snapshot.anchor(caller.consumer),
            };
            return Ok(self.charge_now(snapshot, account, units).await);
        }
        let cost = question.cost.unwrap_or(1);
        if cost == 0 {
            return Err(QuestionError::ZeroCost);
        }
        for &policy in std::iter::once(&policy).chain(&stacked) {
            never_fits(snapshot, policy, plan, cost)?;
        }
        let key_of =
            |policy| match budget::named_budget_key(snapshot, policy, caller.key, question.key) {
                Ok(budget) => Ok(Ok(budget)),
                // A proxied request lacking the part would get 401 under on_missing = "deny".
                Err(Refusal::LimitKeyMissing { .. }) => Ok(Err(Answer::Decided(Decision::Denied))),
                Err(refusal) => Err(QuestionError::BadKey(refusal)),
            };
        let budget = match key_of(policy)? {
            Ok(budget) => budget,
            Err(denied) => return Ok(denied),
        };
        let mut stack = Vec::with_capacity(stacked.len());
        for policy in stacked {
            match key_of(policy)? {
                Ok(budget) => stack.push((policy, budget)),
                Err(denied) => return Ok(denied),
            }
        }
        let asked = Asked {
            stack: &stack,
            name: question.caller,
            caller: &caller,
            account: Account {
                policy,
                plan,
                key: budget,
                anchor: snapshot.anchor(caller.consumer),
            },
            cost,
        };
        Ok(self.check(snapshot, asked).await)
    }

    /// The access lists, bans and exemption of a proxied request, then its rate
    /// decision; a limited caller earns its strike.
    pub(super) async fn check<'a>(&self, snapshot: &'a Snapshot, asked: Asked<'_>) -> Answer<'a> {
        let now_ms = self.clock.now_ms();
        let exempt = match asked.caller.ip {
            Some(ip) => match access(snapshot, ip) {
                Ok(exempt) => exempt,
                Err(_) => return Answer::Decided(Decision::Denied),
            },
            None => false,
        };
        if let Err(Refusal::Banned { until_ms, now_ms }) =
            self.unbanned(exempt, asked.caller.key, now_ms)
        {
            return Answer::Banned { until_ms, now_ms };
        }
        let Account {
            policy, plan, key, ..
        } = asked.account;
        let ask = decision::Ask {
            policy,
            plan,
            caller: key,
            consumer: asked.caller.consumer,
            cost: asked.cost,
            exempt,
            stack: asked.stack,
        };
        let decision = decision::decide(snapshot, &self.store, &self.metrics, ask, now_ms).await;
        match &decision {
            Decision::Admitted(counted) if counted.would_refuse() => {
                let would_refuse: Vec<_> = counted.report.fired().collect();
                self.count_shadowed(snapshot, NO_ROUTE, policy, plan, &would_refuse);
            }
            Decision::Admitted(counted) => {
                let name = || checked_name(snapshot, asked.name, asked.caller.ip);
                self.near_by(
                    asked.caller.key,
                    now_ms,
                    name,
                    snapshot,
                    policy,
                    &counted.report,
                );
            }
            Decision::Limited { report, .. } if !exempt => {
                let name = || checked_name(snapshot, asked.name, asked.caller.ip);
                self.strike(snapshot, asked.caller.key, name, self.clock.now_ms());
                let limit = report.rejecting().next().unwrap_or("limit");
                let policy_name = snapshot.policy_name(policy);
                self.refused_by(asked.caller.key, now_ms, name, policy_name, limit);
            }
            Decision::StackLimited(_) if !exempt => {
                let name = || checked_name(snapshot, asked.name, asked.caller.ip);
                self.strike(snapshot, asked.caller.key, name, self.clock.now_ms());
            }
            _ => {}
        }
        Answer::Decided(decision)
    }

    /// `charge`: counts `units` in `account` now, even past its limits (debt), and
    /// answers the caller's state after them.
    async fn charge_now<'a>(
        &self,
        snapshot: &Snapshot,
        account: Account,
        units: u32,
    ) -> Answer<'a> {
        let Account {
            policy,
            plan,
            key,
            anchor,
        } = account;
        let PlanLimit::Limits(limits) = snapshot.limits(policy, plan) else {
            return Answer::NotCharged;
        };
        let now = snapshot.instant(self.clock.now_ms(), limits, anchor);
        self.store.charge(&limits.scope, key, &now, units).await;
        self.metrics
            .cost
            .charged
            .with_label_values(&[NO_ROUTE, snapshot.policy_name(policy)])
            .inc_by(u64::from(units));
        let mut report = Box::<Report>::default();
        self.store.peek(&limits.scope, key, &now, &mut report).await;
        Answer::Charged { units, report }
    }
}

/// A question once its names are resolved: who, whose budget, how much.
#[derive(Clone, Copy)]
pub(super) struct Asked<'q> {
    /// The caller as the question named it.
    pub(super) name: &'q str,
    pub(super) caller: &'q NamedCaller,
    /// The policy and plan, and the caller's budget key under the policy.
    pub(super) account: Account,
    pub(super) cost: u32,
    /// Several policies asked at once: each with the caller's budget key under it,
    /// the first being `account`'s; empty for one policy.
    pub(super) stack: &'q [(PolicyId, crate::store::CallerKey)],
}

/// The plan a question decides as: the one it names, else the caller's own.
fn plan(
    snapshot: &Snapshot,
    asked: Option<&str>,
    own: Option<PlanId>,
) -> Result<PlanId, QuestionError> {
    match (asked, own) {
        (Some(name), _) => {
            (snapshot.plan_id(name)).ok_or_else(|| QuestionError::UnknownPlan(name.to_string()))
        }
        (None, Some(plan)) => Ok(plan),
        (None, None) => Err(QuestionError::PlanRequired),
    }
}

/// Refuses a `cost` that (policy, plan) can never admit: a window smaller than the
/// cost never has room for it.
fn never_fits(
    snapshot: &Snapshot,
    policy: PolicyId,
    plan: PlanId,
    cost: u32,
) -> Result<(), QuestionError> {
    let PlanLimit::Limits(limits) = snapshot.limits(policy, plan) else {
        return Ok(());
    };
    let scope = &limits.scope;
    let plan_quotas = scope.quotas().iter().map(|q| (q, q.window.name()));
    let total = scope.total().iter().map(|q| (q, q.window.total_name()));
    match plan_quotas.chain(total).find(|(q, _)| q.limit.get() < cost) {
        Some((quota, window)) => Err(QuestionError::NeverFits {
            cost,
            window,
            limit: quota.limit.get(),
        }),
        None => Ok(()),
    }
}

/// The name of a decision-API caller in the ban list: its address as a proxied
/// request from it would be named, else the name it was asked about by.
fn checked_name(snapshot: &Snapshot, name: &str, ip: Option<IpAddr>) -> String {
    match ip {
        Some(ip) => named::ip_name(snapshot, ip),
        None => name.to_string(),
    }
}
