//! `compile`: raw sections -> [`Config`], collecting every diagnostic.
//!
//! Each top-level section (and each route, consumer, upstream and policy) is
//! deserialised on its own, so one typo does not hide the errors after it. Cross
//! checks (unknown names, plans missing from a policy, duplicate or shadowed routes)
//! run once every section has been read.

use std::path::Path;
use std::sync::Arc;

use toml::Spanned;
use toml::de::DeTable;

use super::consumer_index::ConsumerIndex;
use super::consumers::{check_overrides, compile_consumers};
use super::decision::{Known, compile_decision};
use super::diagnostic::Diagnostics;
use super::identity::compile_identity;
use super::policies::{DEFAULT_PLAN, Plans, check_consumer_plans, compile_policies};
use super::recover::{Value, array_of, named_tables, named_values, section};
use super::routes::{compile_routes, compile_upstreams};
use super::settings::{
    compile_access, compile_admin, compile_ban, compile_limits, compile_log, compile_server,
};
use super::store::compile_store;
use super::{Config, ConfigError, IdentityConfig, PlanId, raw};

/// The top-level sections of `gateway.toml`.
const SECTIONS: [&str; 13] = [
    "server",
    "admin",
    "decision",
    "identity",
    "store",
    "limits",
    "access",
    "ban",
    "log",
    "upstreams",
    "policies",
    "consumers",
    "routes",
];

pub(crate) fn compile(path: &Path, text: &str) -> Result<Config, ConfigError> {
    let mut d = Diagnostics::new(path, text);
    let Some(raw) = read(&mut d, text) else {
        return Err(ConfigError {
            diagnostics: d.finish(),
        });
    };
    let server = compile_server(&mut d, path, raw.server.unwrap_or_default());
    let admin = compile_admin(&mut d, raw.admin.unwrap_or_default());
    let identity = compile_identity(&mut d, raw.identity.unwrap_or_default(), path);
    let store = compile_store(&mut d, raw.store.unwrap_or_default(), path);
    let (day, timezone) = compile_limits(&mut d, raw.limits.unwrap_or_default());
    let access = compile_access(&mut d, raw.access.unwrap_or_default());
    let ban = compile_ban(&mut d, raw.ban);
    let log = compile_log(&mut d, raw.log.unwrap_or_default());
    let upstreams = compile_upstreams(&mut d, path, raw.upstreams);
    let mut plans = Plans::default();
    let mut consumers = compile_consumers(&mut d, &mut plans, raw.consumers);
    let (consumers_from_file, consumer_index) = match &identity.consumers_file {
        Some(file) => super::consumers_file::load(&mut d, file, &mut plans, &mut consumers),
        None => (0, ConsumerIndex::new(&consumers)),
    };
    let named_plans = named_plans(&identity, &mut plans);
    let policies = compile_policies(&mut d, &mut plans, raw.policies, &log.request_id_header);
    let server_cors = server.live.cors.as_ref();
    let decided_elsewhere = raw.decision.is_some();
    let known = (&upstreams, &policies, &plans);
    let routes = compile_routes(&mut d, known, server_cors, raw.routes, decided_elsewhere);
    let known = Known {
        file: path,
        plans: &plans,
        policies: &policies,
    };
    let decision = (raw.decision).and_then(|raw| compile_decision(&mut d, &known, raw));
    if decision.is_some() {
        warn_capped_routes(&mut d, &policies, &routes);
    }
    check_consumer_plans(
        &mut d,
        &plans,
        &consumers,
        &policies.list,
        &routes,
        &named_plans,
    );
    check_overrides(&mut d, &consumers, &policies.list, &routes);
    warn_routes(&mut d, &store, &policies, &routes);

    let has_errors = d.has_errors();
    let diagnostics = d.finish();
    if has_errors {
        return Err(ConfigError { diagnostics });
    }
    Ok(Config {
        file: path.to_path_buf(),
        server,
        admin,
        decision,
        identity,
        store,
        day,
        timezone,
        access,
        ban,
        log,
        upstreams: upstreams.list,
        plans: plans.names,
        policies: policies.list.into_iter().map(|(_, p)| p).collect(),
        consumers: Arc::new(consumers),
        consumer_index: Arc::new(consumer_index),
        consumers_from_file,
        routes: routes.into_iter().map(|(_, r)| r).collect(),
        warnings: diagnostics,
    })
}

/// Warns of routes that will not do what they seem to: none at all (every request
/// a 404), on a Redis Cluster a policy counted in two places
/// ([`warn_split_on_cluster`]), or a message limit no socket is held to
/// ([`warn_unused_message_limits`]).
fn warn_routes(
    d: &mut Diagnostics,
    store: &super::StoreConfig,
    policies: &super::policies::Policies,
    routes: &[(std::ops::Range<usize>, super::Route)],
) {
    if let super::Backend::Redis {
        target: super::RedisTarget::Cluster(_),
        ..
    } = &store.backend
    {
        warn_split_on_cluster(d, policies, routes);
    }
    warn_unused_message_limits(d, policies, routes);
    if routes.is_empty() && !d.has_errors() {
        d.warn(
            None,
            "routes",
            "no routes: every request will get 404 (add a [[routes]] table)",
        );
    }
}

/// On a Redis Cluster, warns of a policy that follows another in a route's list and
/// is also used otherwise (alone, first, or behind another first policy): its
/// counters there are placed with the first policy's buckets (one slot per
/// decision), so the two uses count in different keys (docs/quotas.md).
fn warn_split_on_cluster(
    d: &mut Diagnostics,
    policies: &super::policies::Policies,
    routes: &[(std::ops::Range<usize>, super::Route)],
) {
    // Each policy's uses: `None` alone or first, `Some(first)` behind `first`.
    let mut uses: Vec<(super::PolicyId, Option<super::PolicyId>, usize)> = Vec::new();
    for (i, (_, route)) in routes.iter().enumerate() {
        let first = route.policies.first().copied();
        for (place, &policy) in route.policies.iter().enumerate() {
            uses.push((policy, first.filter(|_| place > 0), i));
        }
    }
    for (i, (span, route)) in routes.iter().enumerate() {
        let Some(&first) = route.policies.first() else {
            continue;
        };
        for &later in route.policies.iter().skip(1) {
            let Some(&(_, _, other)) = uses
                .iter()
                .find(|&&(policy, behind, _)| policy == later && behind != Some(first))
            else {
                continue;
            };
            let name = |id: super::PolicyId| &policies.list[id.index()].1.name;
            let reason = format!(
                "on a Redis Cluster, policy {}'s counters on route {} are placed with policy {}'s buckets (one slot per decision), so route {} counts it in other keys: the two do not share budgets",
                name(later),
                route.name,
                name(first),
                routes[other].1.name
            );
            d.warn(Some(span.clone()), &format!("routes[{i}].policy"), reason);
        }
    }
}

/// Warns of a policy's `messages` limit that no `websocket = true` route uses: only
/// WebSocket messages count against it, so it limits nothing.
fn warn_unused_message_limits(
    d: &mut Diagnostics,
    policies: &super::policies::Policies,
    routes: &[(std::ops::Range<usize>, super::Route)],
) {
    for (id, (span, policy)) in policies.list.iter().enumerate() {
        let on_a_socket = (routes.iter())
            .any(|(_, route)| route.websocket && route.policies.iter().any(|p| p.index() == id));
        if policy.messages.is_empty() || on_a_socket {
            continue;
        }
        let reason = format!(
            "policy {} limits WebSocket messages, but no route with websocket = true uses it: \
             the limit counts nothing",
            policy.name
        );
        d.warn(
            Some(span.clone()),
            &format!("policies.{}.messages", policy.name),
            reason,
        );
    }
}

/// Warns of routes whose policy caps concurrency: forward auth cannot decide them
/// (sluice never sees the response end there) and answers 400.
fn warn_capped_routes(
    d: &mut Diagnostics,
    policies: &super::policies::Policies,
    routes: &[(std::ops::Range<usize>, super::Route)],
) {
    for (i, (span, route)) in routes.iter().enumerate() {
        for policy in &route.policies {
            let policy = &policies.list[policy.index()].1;
            if let Some(cap) = policy.concurrency {
                let reason = format!(
                    "policy {} caps concurrency (max {}): forward-auth requests for route {} \
                 get 400, as sluice never sees their response end; proxy it through sluice",
                    policy.name, cap.max, route.name
                );
                d.warn(Some(span.clone()), &format!("routes[{i}].policy"), reason);
            }
        }
    }
}

/// Deserialises each section of `text` on its own, reporting unknown ones; `None`
/// when the text is not TOML.
fn read<'a>(d: &mut Diagnostics, text: &'a str) -> Option<RawFile<'a>> {
    let root = match DeTable::parse(text) {
        Ok(root) => root.into_inner(),
        Err(err) => {
            d.toml("", &err);
            return None;
        }
    };
    let mut raw = RawFile::default();
    for (key, value) in root {
        let name = key.get_ref().as_ref();
        match name {
            "server" => raw.server = section(d, name, value),
            "admin" => raw.admin = section(d, name, value),
            "decision" => raw.decision = section(d, name, value),
            "identity" => raw.identity = section(d, name, value),
            "store" => raw.store = section(d, name, value),
            "limits" => raw.limits = section(d, name, value),
            "access" => raw.access = section(d, name, value),
            "ban" => raw.ban = section(d, name, value),
            "log" => raw.log = section(d, name, value),
            "upstreams" => raw.upstreams = named_tables(d, name, value),
            "policies" => raw.policies = named_values(d, name, value),
            "consumers" => raw.consumers = array_of(d, name, value),
            "routes" => raw.routes = array_of(d, name, value),
            other => d.error_with_help(
                Some(key.span()),
                other,
                "unknown section",
                super::recover::suggestion(other, SECTIONS.to_vec()),
            ),
        }
    }
    Some(raw)
}

/// The plans callers named by an auth layer may get without a plan of their own,
/// which every policy a route uses must cover.
fn named_plans(identity: &IdentityConfig, plans: &mut Plans) -> Vec<PlanId> {
    let mut named_plans = Vec::new();
    // Callers an auth layer names without a plan (or with one no policy knows) get
    // the consumers' default plan.
    if identity.consumer_header.is_some() || identity.jwt.is_some() {
        named_plans.push(plans.intern(DEFAULT_PLAN));
    }
    // A JWT whose plan claim names no plan gets default_plan.
    if let Some(plan) = identity
        .jwt
        .as_ref()
        .and_then(|j| j.default_plan.as_deref())
    {
        named_plans.push(plans.intern(plan));
    }
    named_plans
}

#[derive(Default)]
struct RawFile<'a> {
    server: Option<raw::Server>,
    admin: Option<raw::Admin>,
    decision: Option<raw::Decision>,
    identity: Option<raw::Identity>,
    store: Option<raw::Store>,
    limits: Option<raw::Limits>,
    access: Option<raw::Access>,
    ban: Option<raw::Ban>,
    log: Option<raw::Log>,
    upstreams: Vec<(Spanned<String>, raw::Upstream)>,
    policies: Vec<(Spanned<String>, Value<'a>)>,
    consumers: Vec<(String, raw::Consumer)>,
    routes: Vec<(String, raw::Route)>,
}
