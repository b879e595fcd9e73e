//! The charge step: a cost learnt after the response (`cost_after`, or the decision
//! API's `charge`), counted whether or not it fits.
//!
//! Admission counted the route's `cost`; when the response ends, the rest is
//! charged. The balance may go below zero (debt): every window of the caller then
//! refuses it until the window has paid the debt back, with an exact `Retry-After`
//! and `r=0`. Charged units are counted in `sluice_cost_charged_total`.

use std::sync::Arc;

use http::Response;

use super::{Admission, Admitted};
use crate::config::PolicyId;
use crate::config::{PlanId, RouteId};
use crate::http::body::Body;
use crate::limit::Report;
use crate::meter::{Found, Meter};
use crate::snapshot::{PlanLimit, Snapshot};
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

impl Admission {
    /// Step, for a route with `cost_after`: puts a meter on the response body, and
    /// when the body ends charges the difference between what the response said it
    /// cost (or `default_cost`) and what admission counted: more is charged now
    /// (possibly into debt), less is refunded at the admission instant.
    pub fn meter(
        &self,
        snapshot: &Arc<Snapshot>,
        admitted: &Admitted<'_>,
        response: &mut Response<Body>,
    ) {
        let route = admitted.route.1;
        let (Some(cost_after), Some(policy), Some(counted)) =
            (&route.cost_after, route.policy, admitted.counted.as_ref())
        else {
            return;
        };
        // A would-be refusal of a shadow policy was charged nothing: as if refused.
        let charged = counted.charged();
        if charged == 0 {
            return;
        }
        let settle = Settle {
            snapshot: Arc::clone(snapshot),
            store: self.store.clone(),
            clock: self.clock.clone(),
            metrics: self.metrics.cost.clone(),
            route: admitted.route.0,
            who: (policy, admitted.caller.plan, counted.caller()),
            charged,
            at_ms: counted.report.at_ms,
            default_cost: cost_after.default_cost,
        };
        let meter = Meter::new(cost_after, response.headers(), move |found| {
            settle.run(found)
        });
        response.body_mut().watch(meter);
    }
}

/// What settling a metered response needs once its body has ended.
struct Settle {
    snapshot: Arc<Snapshot>,
    store: crate::store::Store,
    clock: crate::clock::Clock,
    metrics: crate::observe::metrics::cost::CostMetrics,
    route: RouteId,
    who: (PolicyId, PlanId, CallerKey),
    /// What admission counted, at `at_ms` (the store's instant).
    charged: u32,
    at_ms: u64,
    default_cost: u32,
}

impl Settle {
    /// Charges or refunds the difference, off the response's path.
    fn run(self, found: Found) {
        let route = &self.snapshot.routes.get(self.route).name;
        let cost = match found {
            Found::Said(n) => u32::try_from(n).unwrap_or(u32::MAX),
            Found::Unknown => {
                self.metrics.unknown.with_label_values(&[route]).inc();
                self.default_cost
            }
        };
        if cost == self.charged {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(route = %route, "a response's cost could not be settled outside the runtime");
            return;
        };
        runtime.spawn(async move { self.settle(cost).await });
    }

    async fn settle(self, cost: u32) {
        let (policy, plan, caller) = self.who;
        let PlanLimit::Limits(limits) = self.snapshot.limits(policy, plan) else {
            return;
        };
        let now = self.snapshot.days.now(self.clock.now_ms());
        if cost > self.charged {
            let more = cost - self.charged;
            self.store.charge(&limits.scope, caller, &now, more).await;
            let route = &self.snapshot.routes.get(self.route).name;
            let policy = self.snapshot.policy_name(policy);
            self.metrics
                .charged
                .with_label_values(&[route, policy])
                .inc_by(u64::from(more));
        } else {
            let back = self.charged - cost;
            self.store
                .refund(&limits.scope, caller, self.at_ms, &now, back)
                .await;
        }
    }
}
