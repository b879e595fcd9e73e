//! The route/policy table `sluice check` prints: each route's match, target,
//! policies and their limits, cost and concurrency caps, and the automatic-ban
//! rule under it.

use sluice::config::route::{Destination, Route, Source};
use sluice::config::{Config, PlanRule};

/// The route/policy table `sluice check` prints.
pub(crate) fn table(config: &Config) -> String {
    let mut rows = vec![[
        "ROUTE".to_string(),
        "MATCH".to_string(),
        "TARGET".to_string(),
        "POLICY".to_string(),
        "LIMITS".to_string(),
        "COST".to_string(),
        "CONCURRENCY".to_string(),
    ]];
    for route in &config.routes {
        let methods = route
            .methods
            .as_ref()
            .map(|m| m.iter().map(|m| m.as_str()).collect::<Vec<_>>().join(","))
            .unwrap_or_else(|| "*".to_string());
        let host = route.host.as_deref().unwrap_or("");
        let target = match &route.destination {
            Destination::Upstream(id) => format!("upstream {}", config.upstream(*id).name),
            Destination::Respond { status, .. } => format!("respond {}", status.as_u16()),
        };
        let cost = cost_cell(route);
        let concurrency = concurrency_cell(config, route);
        let (policy, limits) = policy_cells(config, route);
        rows.push([
            route.name.clone(),
            format!("{methods} {host}{}", route.path_prefix),
            target,
            policy,
            limits,
            cost,
            concurrency,
        ]);
    }
    let widths: Vec<usize> = (0..7)
        .map(|col| rows.iter().map(|r| r[col].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:width$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    let bans = bans_cell(config);
    out.push_str(&format!(
        "bans: {bans}; at most {} held\n",
        config.ban.max_bans
    ));
    out
}

/// A route's cost as `sluice check` prints it: the cost charged up front, and what
/// the response adds when the route charges after it.
fn cost_cell(route: &Route) -> String {
    match &route.cost_after {
        None => route.cost.to_string(),
        Some(after) => {
            let source = match &after.source {
                Source::Header(name) => format!("header:{name}"),
                Source::Json(path) => format!("json:{}", path.keys().join(".")),
            };
            let (at, default) = (route.cost, after.default_cost);
            format!("{at} + after {source} (default {default})")
        }
    }
}

/// A route's concurrency caps as `sluice check` prints them, `-` when it has none.
fn concurrency_cell(config: &Config, route: &Route) -> String {
    // Each policy's cap, named when several are stacked.
    let caps: Vec<String> = (route.policies.iter())
        .filter_map(|&p| {
            let policy = config.policy(p);
            let c = policy.concurrency.as_ref()?;
            let per_caller = c.per_caller.map(|n| format!(", {n} per caller"));
            let cap = format!(
                "{} at once, queue {} for {:?}{}",
                c.max,
                c.queue,
                c.queue_timeout,
                per_caller.unwrap_or_default()
            );
            Some(match route.stacked() {
                true => format!("{} [{cap}]", policy.name),
                false => cap,
            })
        })
        .collect();
    match caps.is_empty() {
        true => "-".to_string(),
        false => caps.join(" + "),
    }
}

/// A route's policy names and their limits as `sluice check` prints them.
fn policy_cells(config: &Config, route: &Route) -> (String, String) {
    match route.policies.is_empty() {
        true => ("-".to_string(), "not limited".to_string()),
        false => {
            let names: Vec<&str> = (route.policies.iter())
                .map(|&p| config.policy(p).name.as_str())
                .collect();
            let limits: Vec<String> = (route.policies.iter())
                .map(|&p| policy_limits(config, config.policy(p)))
                .collect();
            match route.stacked() {
                false => (names.join(""), limits.join("")),
                true => {
                    let each = names.iter().zip(&limits);
                    let each: Vec<String> = each.map(|(n, l)| format!("{n} [{l}]")).collect();
                    (names.join(" + "), each.join(" + "))
                }
            }
        }
    }
}

/// The automatic-ban rule as `sluice check` prints it.
fn bans_cell(config: &Config) -> String {
    match &config.ban.automatic {
        None => "off: nobody is banned automatically (manual bans through /admin/bans)".to_string(),
        Some(ban) => format!(
            "{} 429s (or unknown-key 401s from one IP) within {:?} ban a caller for {:?}{}{}",
            ban.after,
            ban.within,
            ban.duration,
            if ban.escalate {
                ", doubling for a repeat offender (at most 24h)"
            } else {
                ""
            },
            if ban.shadow {
                "; shadow mode: logged and counted, nobody banned"
            } else {
                ""
            },
        ),
    }
}

/// A policy's limits as `sluice check` prints them: `plan: 100/minute; total: ...`.
fn policy_limits(config: &Config, policy: &sluice::config::PolicyConfig) -> String {
    let mut parts = Vec::new();
    for (plan, rule) in policy.plans.iter().enumerate() {
        let Some(rule) = rule else { continue };
        let text = match rule {
            PlanRule::Deny => "deny".to_string(),
            PlanRule::Limits(q) if q.is_empty() => "unlimited".to_string(),
            PlanRule::Limits(quotas) => quotas
                .iter()
                .map(|q| format!("{}/{}", q.limit, q.window.name()))
                .collect::<Vec<_>>()
                .join(" "),
        };
        parts.push(format!("{}: {text}", config.plans[plan]));
    }
    if !policy.total.is_empty() {
        let total = policy
            .total
            .iter()
            .map(|q| format!("{}/{}", q.limit, q.window.name()))
            .collect::<Vec<_>>()
            .join(" ");
        parts.push(format!("total: {total}"));
    }
    parts.join("; ")
}
