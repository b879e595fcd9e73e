//! Admission's third door: the descriptors of an Envoy rate limit request, each
//! counted by the rule it matches, all or nothing.
//!
//! A descriptor is matched first by `[[decision.descriptors]]` (a sluice policy:
//! its caller is the `remote_address` entry's address when it has one, so the
//! access lists, bans, strikes and the very budget of a proxied request from that
//! address apply; otherwise the entries' values name the budget), then by the
//! rules of `envoy_config` (counted under the rule, per distinct entries), and a
//! descriptor's own `limit` overrides the rule's, as in the reference service
//! (counted in one scope per distinct override, at most `[decision] max_overrides`
//! of them: [`overrides`]). A rule another matched rule `replaces` is not applied.
//! No rule: `OK`.
//!
//! All or nothing: the descriptors are charged in order; once one is refused, the
//! ones charged before it are given back and the rest are only looked at, so a
//! refused request costs nothing anywhere (the reference service charges every
//! descriptor and then ORs). A descriptor's hits of 0 looks without counting. A
//! negative descriptor (`is_negative_hits`) gives its hits back, off the newest
//! counts and never below zero, and only once every other descriptor of the request
//! has admitted: a refused request gives nothing back either ([`give_back`]). What
//! the answer means on the wire is the decision listener's.

mod give_back;
mod overrides;
mod status;
mod target;

use http::HeaderValue;

use super::question::Asked;
use super::{Account, Admission, Answer, decision};
use crate::config::PolicyDescriptor;
use crate::http::refusal::Outcome;
use crate::limit::{Anchor, Report, Window};
use crate::snapshot::{PlanLimit, RULE_PLAN, Snapshot};
pub(crate) use overrides::{Overflow, Overrides};
use status::{refused_status, report_status, status_of, unlimited};
use target::{Budget, Target, policy_budget, target, unreplaced};

/// One descriptor of a rate limit request, as admission reads it.
#[derive(Debug, Clone)]
pub(crate) struct Descriptor<'q> {
    /// Its entries, `(key, value)`, in order.
    pub entries: Vec<(&'q str, &'q str)>,
    /// Units to count: the request's `hits_addend` (0 read as 1), or the
    /// descriptor's own (where 0 only looks).
    pub hits: u32,
    /// The descriptor's own limit, `(requests_per_unit, unit)`, overriding its rule's.
    pub limit: Option<(u32, Window)>,
    /// `hits` are given back rather than counted (`is_negative_hits`).
    pub negative: bool,
}

/// The limit a status is about, as Envoy's `RateLimit` states it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stated {
    /// The rule's `name` (empty if it has none), or `policy/plan/window`.
    pub name: String,
    pub requests_per_unit: u32,
    pub window: Window,
}

/// The answer for one descriptor.
#[derive(Debug, Clone)]
pub(crate) struct Status {
    /// Refused (`OVER_LIMIT`).
    pub over: bool,
    /// The limit that applies; `None` when none does.
    pub limit: Option<Stated>,
    /// What the limit still admits (`u32::MAX` for an unlimited rule, 0 without
    /// any rule).
    pub remaining: u32,
    /// When its window has room again (over the limit), or empties.
    pub reset_ms: u64,
    /// `RateLimit-Policy` and `RateLimit` for it.
    pub headers: [Option<HeaderValue>; 2],
    /// How it was matched and answered, for `sluice_rls_descriptors_total`: the rule
    /// (`none` without one) and `ok`, `over_limit`, `shadow` or `unlimited`.
    pub metric: (String, &'static str),
}

/// The answer for a whole request.
#[derive(Debug)]
pub(crate) struct Descriptors {
    pub statuses: Vec<Status>,
    /// What the request counts as: allowed, or why it was refused.
    pub outcome: Outcome,
}

impl Admission {
    /// Decides the `asked` descriptors of `domain`, all or nothing; refused whole,
    /// with nothing counted, when their overrides need more than `max_overrides`
    /// scopes.
    pub(crate) async fn descriptors(
        &self,
        snapshot: &Snapshot,
        domain: &str,
        asked: &[Descriptor<'_>],
        max_overrides: usize,
    ) -> Result<Descriptors, Overflow> {
        let now_ms = self.clock.now_ms();
        let (store, metrics) = (&self.store, &self.metrics);
        let overrides = (self.overrides).scopes(store, metrics, domain, asked, max_overrides)?;
        let mut targets: Vec<Target<'_>> = (asked.iter().zip(&overrides))
            .map(|(d, o)| target(snapshot, domain, d, o.as_deref()))
            .collect();
        unreplaced(&mut targets);
        let mut statuses = Vec::with_capacity(asked.len());
        let mut charged = Vec::new();
        let mut outcome = Outcome::Allowed;
        for (descriptor, target) in asked.iter().zip(&targets) {
            // After a refusal the rest are only looked at: nothing more is counted.
            // A negative descriptor is looked at now, given back once all admit.
            let hits = match (outcome, descriptor.negative) {
                (Outcome::Allowed, false) => descriptor.hits,
                _ => 0,
            };
            let one = self.one(snapshot, domain, descriptor, target, hits, now_ms);
            let (status, counted, refused) = one.await;
            if let Some(counted) = counted {
                charged.push((statuses.len(), counted));
            }
            if outcome == Outcome::Allowed
                && let Some(refused) = refused
            {
                outcome = refused;
            }
            statuses.push(status);
        }
        if outcome == Outcome::Allowed {
            let negative =
                (asked.iter().zip(&targets).enumerate()).filter(|(_, (d, _))| d.negative);
            for (index, (descriptor, target)) in negative {
                let given = self.give_back(snapshot, domain, descriptor, target, now_ms);
                if let Some(status) = given.await {
                    statuses[index] = status;
                }
            }
        } else {
            for (index, counted) in charged {
                if let Some(units) = counted.refund(snapshot, &self.store, now_ms).await {
                    let status: &mut Status = &mut statuses[index];
                    status.remaining = status.remaining.saturating_add(units);
                }
            }
        }
        Ok(Descriptors { statuses, outcome })
    }

    /// One descriptor: its status, what was counted (to give back if another
    /// refuses), and how it refused the request, if it did.
    async fn one<'a>(
        &self,
        snapshot: &'a Snapshot,
        domain: &str,
        descriptor: &Descriptor<'_>,
        target: &Target<'a>,
        hits: u32,
        now_ms: u64,
    ) -> (Status, Option<decision::Counted<'a>>, Option<Outcome>) {
        match target {
            Target::None => (unlimited("none"), None, None),
            Target::Unlimited { rule } => (
                unlimited(&format!("{}.{}", rule.domain, rule.path)),
                None,
                None,
            ),
            Target::Nothing {
                stated,
                shadow,
                rule,
            } => {
                let metric = match rule {
                    Some(rule) => format!("{}.{}", rule.domain, rule.path),
                    None => "override".to_string(),
                };
                // A limit of 0 refuses whatever the descriptor would count; one that
                // counts nothing (its explicit `hits_addend` 0, or hits given back)
                // fits, as in the reference service (0 + 0 is not over 0).
                let counts = descriptor.hits > 0 && !descriptor.negative;
                let code = match (counts, *shadow) {
                    (false, _) => "ok",
                    (true, true) => "shadow",
                    (true, false) => "over_limit",
                };
                let status = Status {
                    over: counts && !shadow,
                    limit: Some(stated.clone()),
                    remaining: 0,
                    reset_ms: stated.window.length_ms(),
                    headers: [None, None],
                    metric: (metric, code),
                };
                let refused = (!shadow && hits > 0).then_some(Outcome::Limited);
                (status, None, refused)
            }
            Target::Counted {
                limits,
                stated,
                key,
                metric,
                ..
            } => {
                let counts = decision::Counts {
                    limits,
                    caller: *key,
                    cost: hits,
                    anchor: Anchor::default(),
                };
                let (report, counted, refused) = self.count(snapshot, counts, now_ms).await;
                if hits > 0 {
                    let named = (domain, descriptor.entries.as_slice());
                    let over = refused == Some(Outcome::Limited);
                    self.watch_rule(*key, now_ms, named, metric, &report, over);
                }
                let status = status_of(stated.clone(), limits, &report, refused.is_some(), metric);
                (status, counted, refused)
            }
            Target::Policy(policy) => {
                let budget = policy_budget(snapshot, domain, policy, &descriptor.entries);
                self.policy(snapshot, policy, &budget, hits, now_ms).await
            }
        }
    }

    /// Counts `counts` (looks only, for 0 units): the report, what was counted, and
    /// a refusal.
    async fn count<'a>(
        &self,
        snapshot: &Snapshot,
        counts: decision::Counts<'a>,
        now_ms: u64,
    ) -> (Box<Report>, Option<decision::Counted<'a>>, Option<Outcome>) {
        let limits = counts.limits;
        if counts.cost == 0 {
            let mut report = Box::<Report>::default();
            let now = snapshot.days.now(now_ms);
            (self.store)
                .peek(&limits.scope, counts.caller, &now, &mut report)
                .await;
            return (report, None, None);
        }
        let names = || (RULE_PLAN, RULE_PLAN);
        let decided =
            decision::decide_in(snapshot, &self.store, &self.metrics, counts, now_ms, names);
        match decided.await {
            decision::Decision::Admitted(counted) => {
                let report = counted.report.clone();
                (report, Some(counted), None)
            }
            decision::Decision::Limited { report, .. } => (report, None, Some(Outcome::Limited)),
            // A descriptor counts in one policy: no stacked decision comes back.
            decision::Decision::StackLimited(counted) => {
                (counted.report, None, Some(Outcome::Limited))
            }
            decision::Decision::Unavailable => (Box::default(), None, Some(Outcome::Unavailable)),
            decision::Decision::Unlimited | decision::Decision::Denied => {
                (Box::default(), None, None)
            }
        }
    }

    /// A `[[decision.descriptors]]` descriptor: decided as `/v1/check` decides a
    /// caller on a policy (access lists, bans, the rate decision, strikes).
    async fn policy<'a>(
        &self,
        snapshot: &'a Snapshot,
        policy: &PolicyDescriptor,
        budget: &Budget,
        hits: u32,
        now_ms: u64,
    ) -> (Status, Option<decision::Counted<'a>>, Option<Outcome>) {
        let name = format!(
            "{}/{}",
            snapshot.policy_name(policy.policy),
            snapshot.plan_name(policy.plan)
        );
        let account = Account {
            policy: policy.policy,
            plan: policy.plan,
            key: budget.key,
            anchor: Anchor::default(),
        };
        let limits = match snapshot.limits_for(policy.policy, policy.plan, None) {
            PlanLimit::Limits(limits) => limits,
            PlanLimit::Unlimited => return (unlimited(&name), None, None),
            PlanLimit::Deny => return (refused_status(&name), None, Some(Outcome::Unauthorized)),
        };
        if hits == 0 {
            let mut report = Box::<Report>::default();
            let now = snapshot.days.now(now_ms);
            (self.store)
                .peek(&limits.scope, budget.key, &now, &mut report)
                .await;
            let status = report_status(&name, limits, &report, false);
            return (status, None, None);
        }
        let asked = Asked {
            stack: &[],
            name: &budget.name,
            caller: &budget.caller,
            account,
            cost: hits,
        };
        match self.check(snapshot, asked).await {
            Answer::Decided(decision::Decision::Admitted(counted)) => {
                let status = report_status(&name, limits, &counted.report, false);
                (status, Some(counted), None)
            }
            Answer::Decided(decision::Decision::Limited { report, .. }) => {
                let status = report_status(&name, limits, &report, true);
                (status, None, Some(Outcome::Limited))
            }
            Answer::Decided(decision::Decision::StackLimited(counted)) => {
                let status = report_status(&name, limits, &counted.report, true);
                (status, None, Some(Outcome::Limited))
            }
            Answer::Decided(decision::Decision::Unlimited) => (unlimited(&name), None, None),
            Answer::Decided(decision::Decision::Denied) => {
                (refused_status(&name), None, Some(Outcome::Forbidden))
            }
            Answer::Banned { until_ms, now_ms } => {
                let mut status = refused_status(&name);
                status.reset_ms = until_ms.saturating_sub(now_ms);
                (status, None, Some(Outcome::Banned))
            }
            Answer::Decided(decision::Decision::Unavailable) => {
                (refused_status(&name), None, Some(Outcome::Unavailable))
            }
            Answer::Unauthorized | Answer::Charged { .. } | Answer::NotCharged => {
                (refused_status(&name), None, Some(Outcome::Unauthorized))
            }
        }
    }
}
