//! The shadow step of admission: what a policy in `mode = "shadow"` would have
//! refused, reported instead of refused.
//!
//! The rate decision ([`super::decision`]) and the concurrency hold ([`super::hold`])
//! decide a shadow policy's requests exactly as if enforced; where they would refuse,
//! they admit and name the limit that would have refused. This step counts each name
//! in `sluice_shadow_refusals_total`; admission hands them on with what it learnt
//! of the request, for the access log (`would_refuse`). It refuses nothing.

use super::Admission;
use crate::config::route::Route;
use crate::config::{PlanId, PolicyId};
use crate::observe::metrics::NO_ROUTE;
use crate::snapshot::Snapshot;

impl Admission {
    /// Step: counts what the shadow policy of `route` would have refused.
    pub(super) fn shadowed(
        &self,
        snapshot: &Snapshot,
        route: &Route,
        plan: PlanId,
        would_refuse: &[&'static str],
    ) {
        let Some(policy) = route.policy else { return };
        self.count_shadowed(snapshot, &route.name, policy, plan, would_refuse);
    }

    /// Step, on a route of several policies: counts what each shadow policy of the
    /// stacked decision `counted` would have refused, under its own name.
    pub(super) fn shadowed_stack(
        &self,
        snapshot: &Snapshot,
        route: &Route,
        plan: PlanId,
        counted: &super::Counted<'_>,
    ) {
        for part in counted.parts().filter(|part| part.report.rejected()) {
            let Some(policy) = part.policy else { continue };
            let fired: Vec<&'static str> = part.report.fired().collect();
            self.count_shadowed(snapshot, &route.name, policy, plan, &fired);
        }
    }

    /// Counts each limit of `would_refuse` in `sluice_shadow_refusals_total` (the
    /// decision API has no route: `none`).
    pub(super) fn count_shadowed(
        &self,
        snapshot: &Snapshot,
        route: &str,
        policy: PolicyId,
        plan: PlanId,
        would_refuse: &[&'static str],
    ) {
        let route = if route.is_empty() { NO_ROUTE } else { route };
        let (policy, plan) = (snapshot.policy_name(policy), snapshot.plan_name(plan));
        for limit in would_refuse {
            self.metrics.cost.shadow_refusal(route, policy, plan, limit);
        }
    }
}
