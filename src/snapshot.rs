//! One immutable, compiled view of the config that a request is served with.
//!
//! Built from a [`Config`], the store and the metrics registry: routes ready to
//! match, the identifier, each policy's per-plan limits resolved to the store's
//! counters (so a request does no name lookups), the pre-rendered `RateLimit-Policy`
//! headers and the metric handles. The gateway holds the current snapshot in an
//! `ArcSwap`; a request loads it once and uses it throughout, so a reload never
//! changes the rules under a request in flight.

use std::net::IpAddr;

use http::HeaderValue;
use ipnet::IpNet;
use prometheus::IntCounter;

use crate::clock::Days;
use crate::config::{Config, PlanId, PlanRule};
use crate::identity::Identifier;
use crate::metrics::{Metrics, NO_ROUTE, RouteMetrics};
use crate::proxy::Upstreams;
use crate::ratelimit;
use crate::route::Routes;
use crate::store::{Counters, Store};

/// What a policy does with callers of one plan.
#[derive(Debug)]
pub enum PlanLimit {
    /// The plan may not use routes of the policy (401).
    Deny,
    /// Not limited.
    Unlimited,
    Limited(Box<Limited>),
}

/// The limits of one (policy, plan), ready to check.
#[derive(Debug)]
pub struct Limited {
    pub counters: Counters,
    /// `RateLimit-Policy` for this plan's quotas.
    pub policy_header: Option<HeaderValue>,
    /// `sluice_limit_rejections_total` per quota: the plan's, then the total's.
    pub rejections: Vec<IntCounter>,
}

/// A policy's limits, indexed by plan.
#[derive(Debug)]
pub struct PolicyLimits {
    pub plans: Vec<PlanLimit>,
}

#[derive(Debug)]
pub struct Snapshot {
    pub config: Config,
    /// Which config this is: 1 at start, +1 per successful reload.
    pub generation: u64,
    pub routes: Routes,
    pub identifier: Identifier,
    /// Indexed like `config.policies`.
    pub policies: Vec<PolicyLimits>,
    pub upstreams: Upstreams,
    pub days: Days,
    /// Indexed like `routes`.
    pub route_metrics: Vec<RouteMetrics>,
    /// For requests refused before a route matched.
    pub unrouted_metrics: RouteMetrics,
}

impl Snapshot {
    pub fn build(config: Config, generation: u64, store: &Store, metrics: &Metrics) -> Snapshot {
        let plan_names: Vec<&str> = config.plans.iter().map(|p| &**p).collect();
        let policies = (0..config.policies.len())
            .map(|policy| PolicyLimits {
                plans: (0..config.plans.len())
                    .map(|plan| plan_limit(&config, policy, plan, store, metrics))
                    .collect(),
            })
            .collect();
        let route_metrics = config
            .routes
            .iter()
            .map(|route| metrics.route(&route.name, &plan_names))
            .collect();
        Snapshot {
            generation,
            routes: Routes::new(config.routes.clone()),
            identifier: Identifier::new(&config),
            policies,
            upstreams: Upstreams::new(&config.upstreams),
            days: Days::new(&config.day),
            route_metrics,
            unrouted_metrics: metrics.route(NO_ROUTE, &plan_names),
            config,
        }
    }

    /// What route `route`'s policy does with callers of `plan`.
    pub fn plan_limit(&self, route: usize, plan: PlanId) -> &PlanLimit {
        match self.routes.get(route).policy {
            Some(policy) => &self.policies[policy].plans[usize::from(plan.0)],
            None => &PlanLimit::Unlimited,
        }
    }

    /// Whether `ip` is in `[access] deny`.
    pub fn denied(&self, ip: IpAddr) -> bool {
        contains(&self.config.access.deny, ip)
    }

    /// Whether `ip` is in `[access] exempt` (never limited).
    pub fn exempt(&self, ip: IpAddr) -> bool {
        contains(&self.config.access.exempt, ip)
    }
}

fn contains(nets: &[IpNet], ip: IpAddr) -> bool {
    nets.iter().any(|net| net.contains(&ip))
}

fn plan_limit(
    config: &Config,
    policy: usize,
    plan: usize,
    store: &Store,
    metrics: &Metrics,
) -> PlanLimit {
    let policy = &config.policies[policy];
    let quotas = match &policy.plans[plan] {
        Some(PlanRule::Deny) => return PlanLimit::Deny,
        Some(PlanRule::Limits(quotas)) => quotas.clone(),
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
    let policy_header = ratelimit::policy_header(quotas.iter().map(|q| (q, false)));
    PlanLimit::Limited(Box::new(Limited {
        counters: store.counters(&policy.name, plan_name, quotas, &policy.total),
        policy_header,
        rejections,
    }))
}
