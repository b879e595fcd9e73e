//! The steps of admission taken once the answer is known: the refund of a route's
//! `refund_on` statuses, and the meter of a `cost_after` route.
//!
//! - Refund: an upstream's answer whose status is one of the route's `refund_on`
//!   (or sluice's own 502/504 when the upstream could not be reached or did not
//!   answer) gives the request's cost back, so a caller does not pay for an
//!   upstream's failure. The refund takes back exactly what admission counted, at
//!   the instant it counted it (the store's contract), and is counted in
//!   `sluice_refunds_total{reason="status"}`. The other refund, for capacity, is the
//!   concurrency hold's (`hold`).
//! - Meter: a `cost_after` route's answer says what it cost (`crate::meter` reads
//!   it as it streams by); when its body ends, the difference with what admission
//!   counted is settled: more is charged, whether or not it fits (the balance may go
//!   below zero: debt, which every window of the caller then refuses until it is paid
//!   back, with an exact `Retry-After` and `r=0`), less is refunded. Charged units
//!   are counted in `sluice_cost_charged_total`.

use std::sync::Arc;

use http::Response;

use super::{Account, Admission, Admitted};
use crate::config::RouteId;
use crate::config::route::Destination;
use crate::http::body::Body;
use crate::http::refusal::Refusal;
use crate::limit::Now;
use crate::meter::{Found, Meter};
use crate::observe::metrics::cost::REFUND_STATUS;
use crate::snapshot::{PlanLimit, Snapshot};
use crate::store::Stacked;

impl Admission {
    /// Steps, once `admitted` is `answered` (by its route itself, its upstream, or
    /// sluice's 502 or 504 in the upstream's place): the refund its status may earn,
    /// then the meter of a `cost_after` route. Sluice's own 502 or 504 is given the
    /// quota, as the upstream's answer would have carried it.
    pub(crate) async fn settle(
        &self,
        snapshot: &Arc<Snapshot>,
        admitted: &mut Admitted<'_>,
        answered: &mut Result<Response<Body>, Refusal>,
    ) {
        let route = admitted.route;
        if let Destination::Upstream(_) = route.destination
            && !route.refund_on.is_empty()
        {
            let status = (answered.as_ref()).map_or_else(Refusal::status, Response::status);
            self.refund_on(snapshot, admitted, status).await;
        }
        match answered {
            Err(refusal) => refusal.carry_rate(admitted.rate_headers(snapshot)),
            Ok(response) if route.cost_after.is_some() => {
                self.meter(snapshot, admitted, response);
            }
            Ok(_) => {}
        }
    }

    /// Step: gives the cost of `admitted` back when its answer's `status` is one of
    /// its route's `refund_on`; the RateLimit headers then show the refund.
    async fn refund_on(
        &self,
        snapshot: &Snapshot,
        admitted: &mut Admitted<'_>,
        status: http::StatusCode,
    ) {
        let route = admitted.route;
        if !route.refund_on.contains(&status) {
            return;
        }
        let Some(counted) = admitted.counted.as_mut() else {
            return;
        };
        let now_ms = self.clock.now_ms();
        if let Some(cost) = counted.refund(snapshot, &self.store, now_ms).await {
            // A refunded answer costs nothing, whatever it says (`cost_after`).
            counted.refunded(cost);
            self.metrics.cost.refund(&route.name, REFUND_STATUS);
        }
    }

    /// Step, for a route with `cost_after`: puts a meter on the response body, and
    /// when the body ends charges the difference between what the response said it
    /// cost (or `default_cost`) and what admission counted: more is charged now
    /// (possibly into debt), less is refunded at the admission instant.
    fn meter(
        &self,
        snapshot: &Arc<Snapshot>,
        admitted: &Admitted<'_>,
        response: &mut Response<Body>,
    ) {
        let route = admitted.route;
        let (Some(cost_after), Some(policy), Some(counted)) =
            (&route.cost_after, route.policy, admitted.counted.as_ref())
        else {
            return;
        };
        // A would-be refusal of a shadow policy was charged nothing: as if refused.
        let charged = counted
            .parts()
            .map(|part| part.charged())
            .max()
            .unwrap_or(0);
        if charged == 0 {
            return;
        }
        let anchor = snapshot.anchor(admitted.caller.consumer());
        // A route of several policies settles in each what it was charged there.
        let stack = match counted.is_stacked() {
            false => Vec::new(),
            true => (counted.parts())
                .filter_map(|part| {
                    let account = Account {
                        policy: part.policy?,
                        plan: admitted.caller.plan,
                        key: part.caller(),
                        anchor,
                    };
                    Some((account, part.charged(), part.report.at_ms))
                })
                .collect(),
        };
        let settle = Settle {
            snapshot: Arc::clone(snapshot),
            store: self.store.clone(),
            clock: self.clock.clone(),
            metrics: self.metrics.cost.clone(),
            route: route.id,
            account: Account {
                policy,
                plan: admitted.caller.plan,
                key: counted.caller(),
                anchor,
            },
            stack,
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
    /// Whose budget the difference is settled in.
    account: Account,
    /// A route of several policies: each policy's account, what was charged there
    /// and when (the first is `account`'s); empty for one policy.
    stack: Vec<(Account, u32, u64)>,
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
        if !self.stack.is_empty() {
            return self.settle_stacked(cost).await;
        }
        let Account {
            policy,
            plan,
            key,
            anchor,
        } = self.account;
        let PlanLimit::Limits(limits) = self.snapshot.limits(policy, plan) else {
            return;
        };
        let now = self.snapshot.instant(self.clock.now_ms(), limits, anchor);
        if cost > self.charged {
            let more = cost - self.charged;
            self.store.charge(&limits.scope, key, &now, more).await;
            let route = &self.snapshot.routes.get(self.route).name;
            let policy = self.snapshot.policy_name(policy);
            self.metrics
                .charged
                .with_label_values(&[route, policy])
                .inc_by(u64::from(more));
        } else {
            let back = self.charged - cost;
            self.store
                .refund(&limits.scope, key, self.at_ms, &now, back)
                .await;
        }
    }
}

impl Settle {
    /// Settles a stacked decision in each of its policies, in the counters it was
    /// counted in: more is charged where something was charged at admission, less is
    /// refunded there.
    async fn settle_stacked(self, cost: u32) {
        let now_ms = self.clock.now_ms();
        let day = self.snapshot.days.now(now_ms);
        let (mut parts, mut costs, mut policies) = (Vec::new(), Vec::new(), Vec::new());
        let charging = cost > self.charged;
        for &(account, charged, at_ms) in &self.stack {
            let PlanLimit::Limits(limits) = self.snapshot.limits(account.policy, account.plan)
            else {
                continue;
            };
            let now = self.snapshot.instant(now_ms, limits, account.anchor);
            let (now, units) = match charging {
                true => (now, cost.saturating_sub(charged)),
                false => (Now { ms: at_ms, ..now }, charged.saturating_sub(cost)),
            };
            let units = if charged == 0 { 0 } else { units };
            parts.push(Stacked {
                scope: &limits.scope,
                caller: account.key,
                now: Now {
                    calendar: day.calendar,
                    ..now
                },
                shadow: false,
            });
            costs.push(units);
            policies.push(account.policy);
        }
        self.store.settle_stacked(&parts, &costs, charging).await;
        if charging {
            let route = &self.snapshot.routes.get(self.route).name;
            for (&policy, units) in policies.iter().zip(&costs) {
                let policy = self.snapshot.policy_name(policy);
                (self.metrics.charged)
                    .with_label_values(&[route, policy])
                    .inc_by(u64::from(*units));
            }
        }
    }
}
