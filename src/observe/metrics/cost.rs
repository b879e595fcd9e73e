//! The metrics of what requests cost and of the limits that would refuse them:
//! shadow refusals and bans, refunds, and (with `cost_after`) units charged after responses,
//! responses whose cost was not found, and those whose cost was clamped at `max_cost`.
//!
//! These series are counted off the hot path (a would-be refusal, a refund, the end
//! of a costed response), so they are looked up by label when counted rather than
//! resolved per snapshot.

use prometheus::{IntCounter, IntCounterVec, Registry};

use super::table::{Desc, counter, counter_vec};

/// `refund` reason: the answer's status is in the route's `refund_on`.
pub(crate) const REFUND_STATUS: &str = "status";
/// `refund` reason: the concurrency cap refused the request after it was counted.
pub(crate) const REFUND_CAPACITY: &str = "capacity";

/// The cost and shadow-mode series.
#[derive(Debug, Clone)]
pub(crate) struct CostMetrics {
    /// `sluice_shadow_refusals_total{route,policy,plan,limit}`.
    shadow_refusals: IntCounterVec,
    /// `sluice_shadow_bans_total`: bans `[ban] mode = "shadow"` would have made.
    pub shadow_bans: IntCounter,
    /// `sluice_refunds_total{route,reason}`.
    refunds: IntCounterVec,
    /// `sluice_cost_charged_total{route,policy}`.
    pub charged: IntCounterVec,
    /// `sluice_cost_unknown_total{route}`.
    pub unknown: IntCounterVec,
    /// `sluice_cost_clamped_total{route}`.
    pub clamped: IntCounterVec,
}

const SHADOW_REFUSALS: Desc = (
    "sluice_shadow_refusals_total",
    "Requests a policy in shadow mode would have refused, by route, policy, plan and limit.",
);
const SHADOW_BANS: Desc = (
    "sluice_shadow_bans_total",
    "Bans that [ban] mode = \"shadow\" would have made (nobody was banned).",
);
const REFUNDS: Desc = (
    "sluice_refunds_total",
    "Requests whose cost was given back, by route and reason (status, capacity).",
);
const CHARGED: Desc = (
    "sluice_cost_charged_total",
    "Cost units charged after responses (cost_after), by route and policy.",
);
const CLAMPED: Desc = (
    "sluice_cost_clamped_total",
    "Answers whose cost was above the route's max_cost and was charged as max_cost, by route.",
);
const UNKNOWN: Desc = (
    "sluice_cost_unknown_total",
    "Responses whose cost_after found nothing (default_cost charged), by route.",
);

impl CostMetrics {
    /// The series, registered in `registry`.
    pub(crate) fn register(registry: &Registry) -> CostMetrics {
        let counter_vec = |desc, labels: &[&str]| counter_vec(registry, desc, labels);
        CostMetrics {
            shadow_refusals: counter_vec(SHADOW_REFUSALS, &["route", "policy", "plan", "limit"]),
            shadow_bans: counter(registry, SHADOW_BANS),
            refunds: counter_vec(REFUNDS, &["route", "reason"]),
            charged: counter_vec(CHARGED, &["route", "policy"]),
            unknown: counter_vec(UNKNOWN, &["route"]),
            clamped: counter_vec(CLAMPED, &["route"]),
        }
    }

    /// Counts a would-be refusal by `limit` (a window, `total-*`, `concurrency`).
    pub(crate) fn shadow_refusal(&self, route: &str, policy: &str, plan: &str, limit: &str) {
        self.shadow_refusals
            .with_label_values(&[route, policy, plan, limit])
            .inc();
    }

    /// Counts a refund on `route` for `reason` ([`REFUND_STATUS`], [`REFUND_CAPACITY`]).
    pub(crate) fn refund(&self, route: &str, reason: &str) {
        self.refunds.with_label_values(&[route, reason]).inc();
    }
}
