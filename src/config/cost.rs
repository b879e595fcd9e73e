//! A route's cost keys: `cost`, `cost_after` and `default_cost`, `refund_on`, and the
//! bounds of a charge: `max_cost` (the most one answer can charge) and `reserve`
//! (what a `cost_after` request holds while it is in flight).
//!
//! Each key is read on its own with the route ([`compile_costs`]); what needs the
//! route's policies (a cost or a reservation no window can ever hold, the default
//! `max_cost`) is checked once they are known ([`check_costs`]).

use std::num::NonZeroU32;

use http::StatusCode;
use toml::Spanned;

use super::diagnostic::Diagnostics;
use super::policies::{Plans, Policies};
use super::values::int_in;
use super::{PlanRule, PolicyConfig, raw};
use crate::config::route::{CostAfter, Destination, Reserve, Route};

/// A request costs one unless the route says otherwise.
const DEFAULT_COST: NonZeroU32 = NonZeroU32::MIN;

/// What a route's cost keys compile to, before its policies are known.
pub(super) struct Costs {
    pub cost: NonZeroU32,
    pub cost_after: Option<CostAfter>,
    pub refund_on: Vec<StatusCode>,
    pub reserve: Option<Reserve>,
}

/// The cost keys of the route at `key`, going to `destination`.
pub(super) fn compile_costs(
    d: &mut Diagnostics,
    key: &str,
    route: &raw::Route,
    destination: Option<&Destination>,
) -> Costs {
    // A route whose destination is in error has its other errors reported, not
    // those of a cost_after that depends on it.
    let cost_after = destination.and_then(|to| compile_cost_after(d, key, route, to));
    let reserve = compile_reserve(d, key, route, cost_after.is_some());
    Costs {
        cost: compile_cost(d, key, route.cost.as_ref()),
        cost_after,
        refund_on: compile_refund_on(d, key, route.refund_on.as_deref()),
        reserve,
    }
}

/// Checks `route`'s costs against its `policies` and sets its `max_cost` (default:
/// the largest limit of its policies, a plan's or a `total`'s): a `cost` or a fixed
/// `reserve` that no window of a plan could ever hold is an error, and so is a
/// `max_cost` below `cost` or below the `reserve` (one answer could then charge less
/// than admission holds).
pub(super) fn check_costs(
    d: &mut Diagnostics,
    key: &str,
    raw: &raw::Route,
    route: &mut Route,
    (policies, plans): (&Policies, &Plans),
) {
    let used = || (route.policies.iter()).map(|p| &policies.list[p.index()].1);
    for policy in used() {
        if let (Some(cost), Some(reason)) =
            (&raw.cost, never_fits("cost", route.cost, policy, plans))
        {
            d.error(Some(cost.span()), &format!("{key}.cost"), reason);
        }
        if let (Some(at), Some(Reserve::Units(units))) = (&raw.reserve, route.reserve)
            && let Some(reason) = never_fits("reserve", units, policy, plans)
        {
            d.error(Some(at.span()), &format!("{key}.reserve"), reason);
        }
    }
    let largest = (used().flat_map(quotas_of).map(|q| q.limit)).max();
    let Some(at) = &raw.max_cost else {
        route.max_cost = largest.map_or(NonZeroU32::MAX, |largest| largest.max(route.cost));
        return;
    };
    let key = format!("{key}.max_cost");
    let Some(max_cost) = int_in(d, &key, at, 1, i64::from(u32::MAX))
        .and_then(|n| NonZeroU32::new(u32::try_from(n).ok()?))
    else {
        return;
    };
    route.max_cost = max_cost;
    let held = match route.reserve {
        Some(Reserve::Units(units)) => units.max(route.cost),
        _ => route.cost,
    };
    if route.max_cost < held {
        let what = format!(
            "max_cost {} is below what admission holds ({held}: the route's cost or reserve): lower those or raise max_cost",
            route.max_cost
        );
        d.error(Some(at.span()), &key, what);
    }
}

/// Every quota of `policy`: its plans' and its `total`'s.
fn quotas_of(policy: &PolicyConfig) -> impl Iterator<Item = &crate::limit::Quota> {
    let plans = (policy.plans.iter()).filter_map(|rule| match rule {
        Some(PlanRule::Limits(quotas)) => Some(quotas.iter()),
        _ => None,
    });
    plans.flatten().chain(policy.total.iter())
}

/// `cost`: 1 to 4 294 967 295 units a request counts at admission.
fn compile_cost(d: &mut Diagnostics, key: &str, cost: Option<&Spanned<i64>>) -> NonZeroU32 {
    let Some(cost) = cost else {
        return DEFAULT_COST;
    };
    int_in(d, &format!("{key}.cost"), cost, 1, i64::from(u32::MAX))
        .and_then(|n| NonZeroU32::new(u32::try_from(n).ok()?))
        .unwrap_or(DEFAULT_COST)
}

/// `cost_after` and `default_cost`: only for a route with an upstream, whose
/// answer can say what it cost.
fn compile_cost_after(
    d: &mut Diagnostics,
    key: &str,
    route: &raw::Route,
    destination: &Destination,
) -> Option<CostAfter> {
    let default_cost = route.default_cost.as_ref().and_then(|n| {
        let n = int_in(d, &format!("{key}.default_cost"), n, 0, i64::from(u32::MAX))?;
        u32::try_from(n).ok()
    });
    let Some(text) = &route.cost_after else {
        if let Some(n) = &route.default_cost {
            d.warn(
                Some(n.span()),
                &format!("{key}.default_cost"),
                "has no effect without cost_after",
            );
        }
        return None;
    };
    let at = format!("{key}.cost_after");
    if let Destination::Respond { .. } = destination {
        d.error(
            Some(text.span()),
            &at,
            "needs an upstream: a respond route's answer is sluice's own and says no cost",
        );
        return None;
    }
    if route.policy.is_none() {
        d.warn(
            Some(text.span()),
            &at,
            "has no effect on a route without a policy",
        );
    }
    match CostAfter::parse(text.get_ref(), default_cost.unwrap_or(DEFAULT_COST.get())) {
        Ok(cost_after) => Some(cost_after),
        Err(reason) => {
            d.error(Some(text.span()), &at, reason);
            None
        }
    }
}

/// `reserve`: units (1 to 4 294 967 295), or `"average"` (the caller's recent
/// average); only with `cost_after`, whose requests it holds for.
fn compile_reserve(
    d: &mut Diagnostics,
    key: &str,
    route: &raw::Route,
    metered: bool,
) -> Option<Reserve> {
    let raw = route.reserve.as_ref()?;
    let key = format!("{key}.reserve");
    let reserve = match raw.get_ref() {
        raw::Reserve::Units(n) => {
            let n = int_in(
                d,
                &key,
                &Spanned::new(raw.span(), *n),
                1,
                i64::from(u32::MAX),
            )?;
            Reserve::Units(NonZeroU32::new(u32::try_from(n).ok()?)?)
        }
        raw::Reserve::Named(name) if name == "average" => Reserve::Average,
        raw::Reserve::Named(name) => {
            let why = format!("expected a number of units or \"average\", got \"{name}\"");
            d.error(Some(raw.span()), &key, why);
            return None;
        }
    };
    if !metered {
        let why = "needs cost_after: it holds units for an answer whose cost is known at its end";
        d.error(Some(raw.span()), &key, why);
        return None;
    }
    Some(reserve)
}

/// `refund_on`: HTTP statuses (100 to 599) whose answers give the cost back.
fn compile_refund_on(
    d: &mut Diagnostics,
    key: &str,
    raw: Option<&[Spanned<i64>]>,
) -> Vec<StatusCode> {
    let key = format!("{key}.refund_on");
    raw.unwrap_or_default()
        .iter()
        .filter_map(|status| {
            let code = int_in(d, &key, status, 100, 599)?;
            StatusCode::from_u16(u16::try_from(code).ok()?).ok()
        })
        .collect()
}

/// Why admission's `units` (the route's `cost`, or its `reserve`: `what`) could never
/// be held under `policy`, if they could not: a window (of a plan, or the `total`)
/// smaller than them never has room, and no `Retry-After` would be honest. A plan
/// that should not use the route says `"deny"`.
fn never_fits(
    what: &str,
    units: NonZeroU32,
    policy: &PolicyConfig,
    plans: &Plans,
) -> Option<String> {
    let plan_quotas = policy
        .plans
        .iter()
        .enumerate()
        .filter_map(|(i, rule)| match rule {
            Some(PlanRule::Limits(quotas)) => Some((format!("plan {}", plans.names[i]), quotas)),
            _ => None,
        });
    let total = std::iter::once(("total".to_string(), &policy.total));
    for (whose, quotas) in plan_quotas.chain(total) {
        if let Some(quota) = quotas.iter().find(|q| q.limit < units) {
            return Some(format!(
                "{what} {units} exceeds the {} limit of {} for {whose} in policy \"{}\": such a request could never be admitted (lower the {what}, raise the limit, or set the plan to \"deny\")",
                quota.window.key(),
                quota.limit,
                policy.name
            ));
        }
    }
    None
}
