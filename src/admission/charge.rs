//! The charge step: a cost learnt after the response (`cost_after`, or the decision
//! API's `charge`), counted whether or not it fits.
//!
//! Admission counted the route's `cost`; when the response ends, the rest is
//! charged. The balance may go below zero (debt): every window of the caller then
//! refuses it until the window has paid the debt back, with an exact `Retry-After`
//! and `r=0`. Charged units are counted in `sluice_cost_charged_total`.

use super::Admission;
use crate::config::PlanId;
use crate::limit::Report;
use crate::snapshot::{PlanLimit, PolicyId, Snapshot};
use crate::store::CallerKey;

impl Admission {
    /// Charges `units` of `caller` under (`policy`, `plan`) now, whether or not they
    /// fit, counting them for `route` (`none` for the decision API); then fills
    /// `report` with the caller's state. False if the plan is not limited by the policy.
    pub async fn charge(
        &self,
        snapshot: &Snapshot,
        (policy, plan, caller): (PolicyId, PlanId, CallerKey),
        units: u32,
        route: &str,
        report: &mut Report,
    ) -> bool {
        let PlanLimit::Limits(limits) = snapshot.limits(policy, plan) else {
            return false;
        };
        let now = snapshot.days.now(self.clock.now_ms());
        self.store.charge(&limits.scope, caller, &now, units).await;
        self.metrics
            .cost
            .charged
            .with_label_values(&[route, snapshot.policy_name(policy)])
            .inc_by(u64::from(units));
        self.store.peek(&limits.scope, caller, &now, report).await;
        true
    }
}
