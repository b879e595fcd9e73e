//! Each policy's limits bound to the store for one snapshot: per plan, for each
//! consumer with limits of its own, and per envoy_config rule; each with its
//! `RateLimit-Policy` header and rejection counters made once.
//!
//! It decides nothing: admission reads these per request.

use std::collections::HashMap;

use super::{PlanLimit, PlanLimits, RULE_PLAN};
use crate::config::descriptors::{DescriptorRule, RuleLimit};
use crate::config::{Config, ConsumerConfig, ConsumerId, PlanId, PlanRule, PolicyMode};
use crate::http::rate_headers;
use crate::observe::metrics::Metrics;
use crate::store::Store;

/// What `policy` does with callers of `plan`; for `consumer`, with its own limits
/// in place of the plan's (counted in the plan's counters, so a change keeps them).
pub(super) fn plan_limit(
    config: &Config,
    policy: usize,
    plan: usize,
    consumer: Option<&ConsumerConfig>,
    store: &Store,
    metrics: &Metrics,
) -> PlanLimit {
    let policy = &config.policies[policy];
    let quotas = match &policy.plans[plan] {
        Some(PlanRule::Deny) => return PlanLimit::Deny,
        Some(PlanRule::Limits(quotas)) => match consumer {
            Some(consumer) => consumer.effective(quotas),
            None => quotas.clone(),
        },
        // Compile guarantees every plan a caller can have is covered by the
        // policies routes use; plans nobody can have are not limited.
        None => Vec::new(),
    };
    if quotas.is_empty() && policy.total.is_empty() {
        return PlanLimit::Unlimited;
    }
    let plan_name = &config.plans[plan];
    let rejections = quotas
        .iter()
        .map(|q| (q, false))
        .chain(policy.total.iter().map(|q| (q, true)))
        .map(|(q, total)| metrics.rejections(&policy.name, plan_name, q.window, total))
        .collect();
    let per_caller = policy
        .concurrency
        .and_then(|c| c.per_caller)
        .map(|n| n.get());
    let policy_header = rate_headers::policy_header(quotas.iter().map(|q| (q, false)), per_caller);
    let periods = quotas.iter().any(|q| q.window.is_period());
    let stacked_names: Box<[&'static str]> = (quotas.iter().map(|q| q.window.name()))
        .chain(policy.total.iter().map(|q| q.window.total_name()))
        .map(|limit| rate_headers::stacked_name(&policy.name, limit))
        .collect();
    let stacked_header = rate_headers::stacked_policy_header(&quotas, &stacked_names);
    PlanLimit::Limits(Box::new(PlanLimits {
        stacked_names,
        stacked_header,
        periods,
        scope: store.scope(&policy.name, plan_name, quotas, &policy.total),
        policy_header,
        rejections,
        mode: policy.mode,
    }))
}

/// The limits of consumers with limits of their own, for every policy: their
/// plan's, overridden where the consumer says.
pub(super) fn overrides(
    config: &Config,
    store: &Store,
    metrics: &Metrics,
) -> HashMap<ConsumerId, (PlanId, Vec<PlanLimit>)> {
    (config.consumers.iter().enumerate())
        .filter(|(_, consumer)| !consumer.limits.is_empty())
        .map(|(index, consumer)| {
            let plan = usize::from(consumer.plan.0);
            let limits = (0..config.policies.len())
                .map(|p| plan_limit(config, p, plan, Some(consumer), store, metrics))
                .collect();
            (ConsumerId::new(index), (consumer.plan, limits))
        })
        .collect()
}

/// The counters of an envoy_config rule, kept under `rls:DOMAIN:PATH` (so a reload
/// that keeps the rule keeps its counts), or `None` if it counts nothing.
pub(super) fn rule_limit(
    rule: &DescriptorRule,
    store: &Store,
    metrics: &Metrics,
) -> Option<PlanLimits> {
    let RuleLimit::Quota(quota) = rule.limit else {
        return None;
    };
    let name = format!("rls:{}:{}", rule.domain, rule.path);
    Some(PlanLimits {
        periods: quota.window.is_period(),
        scope: store.scope(&name, RULE_PLAN, vec![quota], &[]),
        policy_header: rate_headers::policy_header([(&quota, false)], None),
        rejections: vec![metrics.rejections(&name, RULE_PLAN, quota.window, false)],
        stacked_names: Box::default(),
        stacked_header: None,
        mode: match rule.shadow {
            true => PolicyMode::Shadow { headers: true },
            false => PolicyMode::Enforce,
        },
    })
}
