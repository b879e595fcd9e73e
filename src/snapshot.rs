//! One immutable, compiled view of the config that a request is served with.
//!
//! Built from a [`Config`], the store, the upstream pools and the metrics registry:
//! routes ready to match, the identifier, each policy's per-plan limits bound to the
//! store ([`Scope`], so a request does no name lookups), the pre-rendered
//! `RateLimit-Policy` headers and the metric handles. The gateway holds the current
//! snapshot in an `ArcSwap`; a request loads it once and uses it throughout, so a
//! reload never changes the rules under a request in flight. The config itself stays
//! private: callers ask the snapshot for what they need by name or index.

mod limits;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::HeaderValue;
use ipnet::IpNet;
use prometheus::IntCounter;

use crate::concurrency::{Cap, Caps};
use crate::config::descriptors::RuleId;
use crate::config::route::Routes;
use crate::config::{
    BanConfig, Config, ConsumerId, DecisionConfig, LimitKey, LogConfig, PlanId, PolicyId,
    PolicyMode, RouteId, ServerConfig,
};
use crate::http::rate_headers;
use crate::http::refusal;
use crate::identity::Identifier;
use crate::limit::calendar::Days;
use crate::limit::period::Calendars;
use crate::limit::{Anchor, Now};
use crate::observe::access_log::Names;
use crate::observe::metrics::{Metrics, NO_ROUTE, RouteMetrics};
use crate::proxy::{Pools, Upstreams};
use crate::store::{Scope, Store};
use limits::{overrides, plan_limit, rule_limit};

/// What a policy does with callers of one plan.
#[derive(Debug)]
pub(crate) enum PlanLimit {
    /// The plan may not use routes of the policy (401).
    Deny,
    /// Not limited.
    Unlimited,
    /// The plan's quotas and the policy's `total`, checked all or nothing.
    Limits(Box<PlanLimits>),
}

/// The limits of one (policy, plan), ready to check.
#[derive(Debug)]
pub(crate) struct PlanLimits {
    /// The quotas bound to the store's counters: what a request is decided against.
    pub(crate) scope: Scope,
    /// `RateLimit-Policy` for this plan's quotas.
    pub(crate) policy_header: Option<HeaderValue>,
    /// `sluice_limit_rejections_total` per quota: the plan's, then the total's.
    pub(crate) rejections: Vec<IntCounter>,
    /// Each quota's name on a route of several policies (`"org-month"`): the plan's,
    /// then the total's.
    pub(crate) stacked_names: Box<[&'static str]>,
    /// `RateLimit-Policy` for this plan's quotas on a route of several policies.
    pub(crate) stacked_header: Option<HeaderValue>,
    /// The policy's `mode`: in shadow, a would-be refusal is admitted.
    pub(crate) mode: PolicyMode,
    /// Whether a quota is a billing period (`per_month`, `per_year`): its instants
    /// then carry the caller's periods.
    pub(crate) periods: bool,
}

/// One config compiled for serving; a request uses the snapshot it loaded from its
/// first step to its last.
#[derive(Debug)]
pub struct Snapshot {
    config: Config,
    /// Which config this is: 1 at start, +1 per successful reload.
    pub(crate) generation: u64,
    /// The routes, in match order.
    pub(crate) routes: Routes,
    /// Finds the caller of a request: a consumer by API key, or the client IP.
    pub(crate) identifier: Identifier,
    /// `[policy][plan]`, indexed like the config's policies and plans.
    limits: Vec<Vec<PlanLimit>>,
    /// The limits of consumers with their own `limits`, by consumer index: their
    /// plan, and per policy what it does with them.
    overrides: HashMap<ConsumerId, (PlanId, Vec<PlanLimit>)>,
    /// Each policy's concurrency cap, if it has one.
    caps: Vec<Option<Arc<Cap>>>,
    /// Each policy's `RateLimit-Policy` for callers whose plan has no rate limits
    /// (only a per-caller concurrency cap to show).
    cap_headers: Vec<Option<HeaderValue>>,
    /// The upstreams, each with its targets' keep-alive pools.
    pub(crate) upstreams: Upstreams,
    /// Turns clock readings into instants, with the local day when `per_day` is
    /// calendar.
    pub(crate) days: Days,
    /// Turns clock readings into billing periods of `[limits] timezone`.
    calendars: Calendars,
    /// Indexed like `routes`.
    route_metrics: Vec<RouteMetrics>,
    /// Each route's 503 problem body for a full concurrency cap, indexed like `routes`.
    capacity_bodies: Vec<Bytes>,
    /// For requests refused before a route matched.
    unrouted_metrics: RouteMetrics,
    /// The limits of `[decision] envoy_config`'s rules, indexed like its rules;
    /// `None` for a rule that counts nothing (`unlimited`, 0 a unit).
    rule_limits: Vec<Option<PlanLimits>>,
    /// Each policy's WebSocket message limits (`messages`), if it has them.
    message_limits: Vec<Option<Scope>>,
    /// Whether no plan and no route name needs a JSON escape (`Names::plain_names`).
    plain_names: bool,
}

impl Snapshot {
    /// Compiles `config` as generation `generation`, binding its limits, caps, pools
    /// and metric handles to `runtime`.
    pub(crate) fn build(config: Config, generation: u64, runtime: Shared<'_>) -> Snapshot {
        let Shared {
            store,
            pools,
            caps,
            metrics,
        } = runtime;
        let plan_names: Vec<&str> = config.plans.iter().map(|p| &**p).collect();
        let limits = (0..config.policies.len())
            .map(|policy| {
                (0..config.plans.len())
                    .map(|plan| plan_limit(&config, policy, plan, None, store, metrics))
                    .collect()
            })
            .collect();
        let overrides = overrides(&config, store, metrics);
        let caps = caps.resolve(
            config
                .policies
                .iter()
                .map(|p| (p.name.as_str(), p.concurrency.as_ref())),
            metrics,
        );
        let cap_headers = config
            .policies
            .iter()
            .map(|p| {
                let per_caller = p.concurrency.and_then(|c| c.per_caller);
                per_caller.and_then(|n| rate_headers::policy_header([], Some(n.get())))
            })
            .collect();
        let route_metrics = config
            .routes
            .iter()
            .map(|route| metrics.route(&route.name, &plan_names))
            .collect();
        let capacity_bodies = config
            .routes
            .iter()
            .map(|route| refusal::capacity_body(&route.name))
            .collect();
        let identifier = Identifier::new(&config);
        count_consumers(&config, metrics);
        let message_limits = (config.policies.iter())
            .map(|p| {
                let quotas = Some(p.messages.clone()).filter(|q| !q.is_empty());
                quotas.map(|quotas| store.scope(&p.name, MESSAGES_PLAN, quotas, &[]))
            })
            .collect();
        let rule_limits = (config.decision.iter())
            .flat_map(|decision| decision.rules.rules.iter())
            .map(|rule| rule_limit(rule, store, metrics))
            .collect();
        // Consumers' counters are kept apart from `max_keys` and never evicted.
        store
            .reserve(ConsumerId::all(config.consumers.len()).map(|id| identifier.consumer_key(id)));
        let plain_names = (plan_names.iter().copied())
            .chain(config.routes.iter().map(|r| r.name.as_str()))
            .all(crate::observe::access_log::json_plain);
        Snapshot {
            plain_names,
            generation,
            routes: Routes::new(config.routes.clone()),
            identifier,
            limits,
            overrides,
            caps,
            cap_headers,
            upstreams: Upstreams::new(&config.upstreams, pools),
            days: Days::new(&config.day),
            calendars: Calendars::new(config.timezone.clone()),
            route_metrics,
            capacity_bodies,
            unrouted_metrics: metrics.route(NO_ROUTE, &plan_names),
            rule_limits,
            message_limits,
            config,
        }
    }

    /// What `policy` does with callers of `plan`.
    pub(crate) fn limits(&self, policy: PolicyId, plan: PlanId) -> &PlanLimit {
        &self.limits[policy.index()][usize::from(plan.0)]
    }

    /// What `policy` does with callers of `plan`, for consumer `consumer` (if the
    /// caller is one): its own limits, if it has them and is asked about its plan.
    pub(crate) fn limits_for(
        &self,
        policy: PolicyId,
        plan: PlanId,
        consumer: Option<ConsumerId>,
    ) -> &PlanLimit {
        if let Some(consumer) = consumer
            && !self.overrides.is_empty()
            && let Some((own_plan, limits)) = self.overrides.get(&consumer)
            && *own_plan == plan
        {
            return &limits[policy.index()];
        }
        self.limits(policy, plan)
    }

    /// The limits of envoy_config rule `rule`; `None` if it counts nothing.
    pub(crate) fn rule_limits(&self, rule: RuleId) -> Option<&PlanLimits> {
        self.rule_limits.get(rule.index()).and_then(Option::as_ref)
    }

    /// The WebSocket message limits of `policy`, if it has them.
    pub(crate) fn message_limits(&self, policy: PolicyId) -> Option<&Scope> {
        self.message_limits[policy.index()].as_ref()
    }

    /// `[decision]`, if the config has one.
    pub(crate) fn decision(&self) -> Option<&DecisionConfig> {
        self.config.decision.as_ref()
    }

    /// The day `consumer`'s billing periods start on (the calendar's for anyone else).
    pub(crate) fn anchor(&self, consumer: Option<ConsumerId>) -> Anchor {
        consumer
            .and_then(|id| self.config.consumer(id).anchor)
            .unwrap_or_default()
    }

    /// The instant `ms` as `limits` are decided at: with the billing periods from
    /// `anchor` when they count any (one cached lookup), else without.
    pub(crate) fn instant(&self, ms: u64, limits: &PlanLimits, anchor: Anchor) -> Now {
        let now = self.days.now(ms);
        match limits.periods {
            true => now.with_periods(self.calendars.periods(anchor, ms)),
            false => now,
        }
    }

    /// The concurrency cap of `policy`, if it has one.
    pub fn cap(&self, policy: PolicyId) -> Option<&Arc<Cap>> {
        self.caps[policy.index()].as_ref()
    }

    /// `RateLimit-Policy` of `policy` for a plan without rate limits.
    pub(crate) fn cap_header(&self, policy: PolicyId) -> Option<&HeaderValue> {
        self.cap_headers[policy.index()].as_ref()
    }

    /// The 503 problem body of `route` for a full concurrency cap.
    pub(crate) fn capacity_body(&self, route: RouteId) -> &Bytes {
        &self.capacity_bodies[route.index()]
    }

    /// The metric handles of `route`, or of requests refused before a route matched.
    pub(crate) fn route_metrics(&self, route: Option<RouteId>) -> &RouteMetrics {
        match route {
            Some(route) => &self.route_metrics[route.index()],
            None => &self.unrouted_metrics,
        }
    }

    /// Whether `ip` is in `[access] deny`.
    pub(crate) fn denied(&self, ip: IpAddr) -> bool {
        contains(&self.config.access.deny, ip)
    }

    /// Whether `ip` is in `[access] exempt` (never limited).
    pub(crate) fn exempt(&self, ip: IpAddr) -> bool {
        contains(&self.config.access.exempt, ip)
    }

    /// The name of a plan.
    pub(crate) fn plan_name(&self, plan: PlanId) -> &str {
        self.config.plan_name(plan)
    }

    /// Every plan, in id order.
    pub(crate) fn plans(&self) -> impl Iterator<Item = PlanId> + use<> {
        (0..self.config.plans.len()).map(|p| PlanId(p as u16))
    }

    /// The plan called `name`.
    pub(crate) fn plan_id(&self, name: &str) -> Option<PlanId> {
        self.config
            .plans
            .iter()
            .position(|p| **p == *name)
            .map(|p| PlanId(p as u16))
    }

    /// The `mode` of a policy: enforce, or shadow.
    pub(crate) fn policy_mode(&self, policy: PolicyId) -> PolicyMode {
        self.config.policy(policy).mode
    }

    /// The `key` of `policy`, if it counts by one (not by caller).
    pub(crate) fn policy_key(&self, policy: PolicyId) -> Option<&LimitKey> {
        self.config.policy(policy).key.as_ref()
    }

    /// The name of a policy.
    pub(crate) fn policy_name(&self, policy: PolicyId) -> &str {
        &self.config.policy(policy).name
    }

    /// Every policy, in id order.
    pub(crate) fn policies(&self) -> impl Iterator<Item = PolicyId> + use<> {
        PolicyId::all(self.config.policies.len())
    }

    /// The policy called `name`.
    pub fn policy_id(&self, name: &str) -> Option<PolicyId> {
        let index = self.config.policies.iter().position(|p| p.name == name)?;
        Some(PolicyId::new(index))
    }

    /// The name of consumer `index`.
    pub(crate) fn consumer_name(&self, id: ConsumerId) -> &str {
        &self.config.consumer(id).name
    }

    /// The index of the consumer called `name`.
    pub(crate) fn consumer_index(&self, name: &str) -> Option<ConsumerId> {
        self.identifier.consumer_index(name)
    }

    /// Whether consumer `id` is `disabled`: its key is refused as if unknown.
    pub(crate) fn consumer_disabled(&self, id: ConsumerId) -> bool {
        self.config.consumer(id).disabled
    }

    /// The plan of consumer `index`.
    pub(crate) fn consumer_plan(&self, id: ConsumerId) -> PlanId {
        self.config.consumer(id).plan
    }

    /// The `[server]` settings (listeners are only read at start).
    pub(crate) fn server(&self) -> &ServerConfig {
        &self.config.server
    }

    /// The `[ban]` settings.
    pub(crate) fn bans(&self) -> &BanConfig {
        &self.config.ban
    }

    /// The `[log]` settings.
    pub(crate) fn log(&self) -> &LogConfig {
        &self.config.log
    }

    /// The config, for comparing a reload with what runs.
    pub(crate) fn config(&self) -> &Config {
        &self.config
    }
}

impl Names for Snapshot {
    fn consumer_name(&self, id: ConsumerId) -> &str {
        Snapshot::consumer_name(self, id)
    }

    fn plan_name(&self, plan: PlanId) -> &str {
        Snapshot::plan_name(self, plan)
    }

    fn route_name(&self, id: RouteId) -> &str {
        &self.routes.get(id).name
    }

    fn plain_names(&self) -> bool {
        self.plain_names
    }

    fn ipv6_prefix(&self) -> u8 {
        self.identifier.ipv6_prefix()
    }
}

/// What outlives snapshots and each one is bound to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shared<'a> {
    /// The counters; found by policy and plan name, so a reload keeps callers' history.
    pub(crate) store: &'a Store,
    /// The upstream keep-alive pools, so a reload keeps open connections.
    pub(crate) pools: &'a Pools,
    /// The policies' concurrency caps, so a reload keeps the slots in use.
    pub(crate) caps: &'a Caps,
    /// The metrics registry the snapshot's handles are taken from.
    pub(crate) metrics: &'a Metrics,
}

/// The plan name a policy's message limits are counted under: a policy's setting,
/// so no plan can have it.
pub(crate) const MESSAGES_PLAN: &str = "messages";

/// The plan name an envoy_config rule's counters are kept under.
pub(crate) const RULE_PLAN: &str = "rls";

fn contains(nets: &[IpNet], ip: IpAddr) -> bool {
    nets.iter().any(|net| net.contains(&ip))
}

/// Sets `sluice_consumers` by where consumers came from: the config or the
/// consumers file.
fn count_consumers(config: &Config, metrics: &Metrics) {
    let from_file = config.consumers_from_file;
    let counts = [
        ("config", config.consumers.len() - from_file),
        ("file", from_file),
    ];
    for (source, count) in counts {
        let count = i64::try_from(count).unwrap_or(i64::MAX);
        metrics.consumers.with_label_values(&[source]).set(count);
    }
}
