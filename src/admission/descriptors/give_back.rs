//! A negative descriptor (Envoy's `is_negative_hits`): its hits handed back to the
//! counters it matches, off their newest counts and never below zero (the store's
//! `give_back`), then its status read again. Called only once every descriptor of
//! the request has admitted, so a refused request gives nothing back.

use super::status::{report_status, status_of};
use super::target::{Target, policy_budget};
use super::{Descriptor, Status};
use crate::admission::Admission;
use crate::limit::{Anchor, Report};
use crate::snapshot::{PlanLimit, PlanLimits, Snapshot};
use crate::store::CallerKey;

impl Admission {
    /// Gives `descriptor`'s hits back to what `target` counts; its status after, or
    /// `None` when no counter applies (no rule, unlimited, a limit of 0).
    pub(super) async fn give_back(
        &self,
        snapshot: &Snapshot,
        domain: &str,
        descriptor: &Descriptor<'_>,
        target: &Target<'_>,
        now_ms: u64,
    ) -> Option<Status> {
        let hits = descriptor.hits;
        match target {
            Target::Counted {
                limits,
                stated,
                key,
                metric,
                ..
            } => {
                let report = self.given(snapshot, limits, *key, hits, now_ms).await;
                Some(status_of(stated.clone(), limits, &report, false, metric))
            }
            Target::Policy(policy) => {
                let PlanLimit::Limits(limits) =
                    snapshot.limits_for(policy.policy, policy.plan, None)
                else {
                    return None;
                };
                let budget = policy_budget(snapshot, domain, policy, &descriptor.entries);
                let report = self.given(snapshot, limits, budget.key, hits, now_ms).await;
                let name = format!(
                    "{}/{}",
                    snapshot.policy_name(policy.policy),
                    snapshot.plan_name(policy.plan)
                );
                Some(report_status(&name, limits, &report, false))
            }
            Target::None | Target::Unlimited { .. } | Target::Nothing { .. } => None,
        }
    }

    /// Gives `hits` back to `key` under `limits`; the counters' state after.
    async fn given(
        &self,
        snapshot: &Snapshot,
        limits: &PlanLimits,
        key: CallerKey,
        hits: u32,
        now_ms: u64,
    ) -> Box<Report> {
        let now = snapshot.instant(now_ms, limits, Anchor::default());
        self.store.give_back(&limits.scope, key, &now, hits).await;
        let mut report = Box::<Report>::default();
        self.store.peek(&limits.scope, key, &now, &mut report).await;
        report
    }
}
