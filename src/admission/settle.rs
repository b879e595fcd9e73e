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
//! - A client gone before the answer: a request whose client leaves before the
//!   response head is settled all the same, as if the client had stayed
//!   ([`Admission::orphan`]): the upstream's answer is awaited off the request's
//!   path, refunded by its status or metered as it is read on, so leaving early
//!   never turns a costed answer into the admission cost alone.
//!
//! A refund is for the upstream's failures only: an answer of the upstream, or
//! sluice's 502 or 504 in its place. Sluice's refusals of the client's own body (a
//! 408 for a stalled body, a 400 for one cut off, a 413) are never given back,
//! whatever `refund_on` lists.

use std::sync::Arc;

use http::Response;

use super::reserve::Averages;
use super::{Account, Admission, Admitted};
use crate::config::route::{Destination, Reserve, Route};
use crate::config::{ConsumerId, RouteId};
use crate::http::body::Body;
use crate::http::refusal::{Outcome, Refusal};
use crate::limit::Now;
use crate::meter::{Found, Meter};
use crate::observe::metrics::cost::REFUND_STATUS;
use crate::proxy::{Orphan, ProxyError};
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
            && refunded_by(route, answered)
        {
            self.refund_on(snapshot, admitted).await;
        }
        match answered {
            Err(refusal) => refusal.carry_rate(admitted.rate_headers(snapshot)),
            Ok(response) if route.cost_after.is_some() => {
                self.meter(snapshot, admitted, response);
            }
            Ok(_) => {}
        }
    }

    /// Step: gives the cost of `admitted` back, its answer being one its route
    /// refunds; the RateLimit headers then show the refund.
    async fn refund_on(&self, snapshot: &Snapshot, admitted: &mut Admitted<'_>) {
        let route = admitted.route;
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
        if let Some(settle) = self.bill(snapshot, admitted) {
            settle.meter(response);
        }
    }

    /// What becomes of `admitted`'s answer if its client goes away once the request
    /// is on its way upstream and before the response head: it is settled as if the
    /// client had stayed (refunded by its status, or metered as the rest of it is
    /// read, off the request's path). `None` when the route has nothing to settle.
    pub(crate) fn orphan(
        &self,
        snapshot: &Arc<Snapshot>,
        admitted: &Admitted<'_>,
    ) -> Option<Orphan> {
        let route = admitted.route;
        if route.cost_after.is_none() && route.refund_on.is_empty() {
            return None;
        }
        let settle = self.bill(snapshot, admitted)?;
        Some(Box::new(move |answered| settle.orphaned(answered)))
    }

    /// What settling `admitted`'s answer needs, owned; `None` when nothing was
    /// charged (the route does not limit the caller, or a shadow policy's would-be
    /// refusal was charged nothing: as if refused).
    fn bill(&self, snapshot: &Arc<Snapshot>, admitted: &Admitted<'_>) -> Option<Settle> {
        let route = admitted.route;
        let (policy, counted) = (route.policy?, admitted.counted.as_ref()?);
        let charged = counted
            .parts()
            .map(|part| part.charged())
            .max()
            .unwrap_or(0);
        if charged == 0 {
            return None;
        }
        let consumer = admitted.caller.consumer();
        let anchor = snapshot.anchor(consumer);
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
        Some(Settle {
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
            consumer,
            stack,
            charged,
            at_ms: counted.report.at_ms,
            averages: (route.reserve == Some(Reserve::Average)).then(|| Arc::clone(&self.averages)),
        })
    }
}

/// Whether `answered` is an answer `route` gives the request's cost back for: its
/// status is one of `refund_on`, and the failure is the upstream's (its own answer,
/// or sluice's 502 or 504 in its place), never a refusal of the client's body.
fn refunded_by(route: &Route, answered: &Result<Response<Body>, Refusal>) -> bool {
    let status = match answered {
        Ok(response) => response.status(),
        Err(refusal) if refusal.outcome() == Outcome::UpstreamError => refusal.status(),
        Err(_) => return false,
    };
    route.refund_on.contains(&status)
}

/// What settling an admitted request's answer needs, owned: it outlives the
/// request's future (a body that ends after the client went away, or an answer
/// that comes after).
struct Settle {
    snapshot: Arc<Snapshot>,
    store: crate::store::Store,
    clock: crate::clock::Clock,
    metrics: crate::observe::metrics::cost::CostMetrics,
    route: RouteId,
    /// Whose budget the difference is settled in.
    account: Account,
    /// The consumer the caller is, if it is one: its own `limits` apply.
    consumer: Option<ConsumerId>,
    /// A route of several policies: each policy's account, what was charged there
    /// and when (the first is `account`'s); empty for one policy.
    stack: Vec<(Account, u32, u64)>,
    /// What admission counted, at `at_ms` (the store's instant).
    charged: u32,
    at_ms: u64,
    /// With `reserve = "average"`: where the caller's average learns the cost.
    averages: Option<Arc<Averages>>,
}

impl Settle {
    /// Puts a meter on `response`'s body that settles what it says it cost when the
    /// body ends (a route without `cost_after` has nothing to meter).
    fn meter(self, response: &mut Response<Body>) {
        let snapshot = Arc::clone(&self.snapshot);
        let Some(cost_after) = &snapshot.routes.get(self.route).cost_after else {
            return;
        };
        let meter = Meter::new(cost_after, response.headers(), move |found| self.run(found));
        response.body_mut().watch(meter);
    }

    /// Settles the answer of a request whose client went away before its head, as
    /// [`Admission::settle`] would have: a refund by status, else the meter (the
    /// rest of the body is read for it by the caller); hands back what to read.
    fn orphaned(self, answered: Result<Response<Body>, ProxyError>) -> Option<Response<Body>> {
        let answered = answered.map_err(Refusal::from);
        let route = self.snapshot.routes.get(self.route);
        if refunded_by(route, &answered) {
            self.metrics.refund(&route.name, REFUND_STATUS);
            self.spawn(0);
            return answered.ok();
        }
        let mut response = answered.ok()?;
        self.meter(&mut response);
        Some(response)
    }

    /// Charges or refunds the difference, off the response's path: what the
    /// answer said (or `default_cost`), at most the route's `max_cost`.
    fn run(self, found: Found) {
        let route = self.snapshot.routes.get(self.route);
        let cost = match (found, &route.cost_after) {
            (Found::Said(n), _) => u32::try_from(n).unwrap_or(u32::MAX),
            (Found::Unknown, cost_after) => {
                self.metrics.unknown.with_label_values(&[&route.name]).inc();
                cost_after.as_ref().map_or(self.charged, |c| c.default_cost)
            }
        };
        let cost = Admission::clamp(&self.metrics, route, cost, self.clock.now_ms());
        if let Some(averages) = &self.averages {
            averages.record(&route.name, self.account.key, cost);
        }
        self.spawn(cost);
    }

    /// Settles at `cost` on a task of its own (nothing to do if admission counted
    /// exactly that).
    fn spawn(self, cost: u32) {
        if cost == self.charged {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            let route = &self.snapshot.routes.get(self.route).name;
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
        let PlanLimit::Limits(limits) = self.snapshot.limits_for(policy, plan, self.consumer)
        else {
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
