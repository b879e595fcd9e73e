//! One immutable, compiled view of the config that a request is served with.
//!
//! Built from a [`Config`] and the store: routes ready to match, the identifier,
//! each route's per-plan limits resolved to the store's counters (so a request does
//! no name lookups) and the pre-rendered `RateLimit-Policy` headers. The gateway
//! holds the current snapshot in an `ArcSwap`; a request loads it once and uses it
//! throughout, so a reload never changes the rules under a request in flight.

use http::HeaderValue;
use ipnet::IpNet;
use std::net::IpAddr;

use crate::clock::Days;
use crate::config::{Config, PlanRule};
use crate::identity::Identifier;
use crate::proxy::Upstreams;
use crate::ratelimit;
use crate::route::Routes;
use crate::store::{Counters, Store};

/// What a route does with callers of one plan.
#[derive(Debug)]
pub enum PlanLimit {
    /// The plan may not use the route (401).
    Deny,
    /// Not limited.
    Unlimited,
    Limited {
        counters: Counters,
        /// `RateLimit-Policy` for this plan's quotas.
        policy_header: Option<HeaderValue>,
    },
}

/// A route's limits, indexed by plan.
#[derive(Debug)]
pub struct RouteLimits {
    pub plans: Vec<PlanLimit>,
}

#[derive(Debug)]
pub struct Snapshot {
    pub config: Config,
    pub routes: Routes,
    pub identifier: Identifier,
    /// Indexed like `routes`.
    pub limits: Vec<RouteLimits>,
    pub upstreams: Upstreams,
    pub days: Days,
}

impl Snapshot {
    pub fn build(config: Config, store: &Store) -> Snapshot {
        let limits = config
            .routes
            .iter()
            .map(|route| RouteLimits {
                plans: (0..config.plans.len())
                    .map(|plan| plan_limit(&config, route.policy, plan, store))
                    .collect(),
            })
            .collect();
        Snapshot {
            routes: Routes::new(config.routes.clone()),
            identifier: Identifier::new(&config),
            limits,
            upstreams: Upstreams::new(&config.upstreams),
            days: Days::new(&config.day),
            config,
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

fn plan_limit(config: &Config, policy: Option<usize>, plan: usize, store: &Store) -> PlanLimit {
    let Some(policy) = policy.map(|p| &config.policies[p]) else {
        return PlanLimit::Unlimited;
    };
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
    let policy_header = ratelimit::policy_header(quotas.iter().map(|q| (q, false)));
    PlanLimit::Limited {
        counters: store.counters(&policy.name, &config.plans[plan], quotas, &policy.total),
        policy_header,
    }
}
