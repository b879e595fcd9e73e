//! UpstreamNames and routes: targets, matching rules, direct responses, and the
//! warning for a route that an earlier one shadows.

use std::collections::{HashMap, HashSet};
use std::num::NonZeroU32;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, StatusCode};
use toml::Spanned;

use super::diagnostic::Diagnostics;
use super::policies::{Plans, Policies};
use super::values::duration_of;
use super::{UpstreamConfig, UpstreamProtocol, raw};
use crate::config::route::{Destination, Route};
use crate::config::{PolicyId, RouteId, UpstreamId};
use crate::http::cors::Cors;
use crate::tls::pki;

/// Time to set up a TCP connection on a healthy network, with room for a SYN retry.
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Whole response headers; long enough for slow reports, short enough to free slots.
const DEFAULT_UPSTREAM_TIMEOUT: Duration = Duration::from_secs(30);

pub(super) struct UpstreamNames {
    pub(super) list: Vec<UpstreamConfig>,
    pub(super) by_name: HashMap<String, usize>,
}

pub(super) fn compile_upstreams(
    d: &mut Diagnostics,
    file: &Path,
    raw: Vec<(Spanned<String>, raw::Upstream)>,
) -> UpstreamNames {
    let mut list = Vec::new();
    let mut by_name = HashMap::new();
    for (name, upstream) in raw {
        let key = format!("upstreams.{}", name.get_ref());
        let mut targets = Vec::new();
        for (i, target) in upstream.targets.get_ref().iter().enumerate() {
            match parse_target(target.get_ref()) {
                Ok(uri) => targets.push(uri),
                Err(reason) => d.error(Some(target.span()), &format!("{key}.targets[{i}]"), reason),
            }
        }
        if upstream.targets.get_ref().is_empty() {
            d.error(
                Some(upstream.targets.span()),
                &format!("{key}.targets"),
                "needs at least one target",
            );
        }
        let connect_timeout = duration_of(
            d,
            &format!("{key}.connect_timeout"),
            upstream.connect_timeout.as_ref(),
            DEFAULT_CONNECT_TIMEOUT,
        );
        let timeout = duration_of(
            d,
            &format!("{key}.timeout"),
            upstream.timeout.as_ref(),
            DEFAULT_UPSTREAM_TIMEOUT,
        );
        let ca_file = upstream.ca_file.as_ref().map(|ca| {
            let path = file.parent().unwrap_or(Path::new("")).join(ca.get_ref());
            if let Err(reason) = pki::roots_from(&path) {
                d.error(
                    Some(ca.span()),
                    &format!("{key}.ca_file"),
                    reason.to_string(),
                );
            }
            path
        });
        let protocol = match upstream
            .protocol
            .as_ref()
            .map(|p| (p.get_ref().as_str(), p))
        {
            None | Some(("http1", _)) => UpstreamProtocol::Http1,
            Some(("h2", _)) => UpstreamProtocol::H2,
            Some(("auto", _)) => UpstreamProtocol::Auto,
            Some((other, spanned)) => {
                d.error(
                    Some(spanned.span()),
                    &format!("{key}.protocol"),
                    format!("\"{other}\" is not a protocol: \"http1\", \"h2\" or \"auto\""),
                );
                UpstreamProtocol::Http1
            }
        };
        by_name.insert(name.get_ref().clone(), list.len());
        list.push(UpstreamConfig {
            name: name.into_inner(),
            targets,
            connect_timeout,
            timeout,
            ca_file,
            protocol,
        });
    }
    UpstreamNames { list, by_name }
}

/// An upstream target: `http://host:port` or `https://host:port` with an optional
/// base path.
fn parse_target(text: &str) -> Result<http::Uri, String> {
    let uri: http::Uri = text
        .parse()
        .map_err(|_| format!("\"{text}\" is not a URL"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {}
        _ => return Err(format!("\"{text}\" must start with http:// or https://")),
    }
    if uri.authority().is_none() {
        return Err(format!("\"{text}\" has no host"));
    }
    if uri.query().is_some() {
        return Err(format!("\"{text}\" must not have a query string"));
    }
    Ok(uri)
}

/// The `[[routes]]`, each with the span of its table in the file (for diagnostics
/// about it), in file order.
pub(super) fn compile_routes(
    d: &mut Diagnostics,
    (upstreams, policies, plans): (&UpstreamNames, &Policies, &Plans),
    server_cors: Option<&Arc<Cors>>,
    raw: Vec<(String, raw::Route)>,
    decided_elsewhere: bool,
) -> Vec<(std::ops::Range<usize>, Route)> {
    let mut names = HashSet::new();
    let mut out: Vec<(std::ops::Range<usize>, Route)> = Vec::new();
    for (key, route) in raw {
        let name = route.name.get_ref().clone();
        if !names.insert(name.clone()) {
            d.error(
                Some(route.name.span()),
                &format!("{key}.name"),
                format!("duplicate route name \"{name}\""),
            );
        }
        let known = Known {
            upstreams,
            policies,
            server_cors,
            id: RouteId::new(out.len()),
            decided_elsewhere,
        };
        let Some(compiled) = compile_route(d, &key, &route, known) else {
            continue;
        };
        let mut compiled = compiled;
        super::cost::check_costs(d, &key, &route, &mut compiled, (policies, plans));
        if let Some((_, earlier)) = out.iter().find(|(_, earlier)| shadows(earlier, &compiled)) {
            d.warn(
                Some(route.name.span()),
                &format!("{key}.name"),
                format!("route \"{}\" is unreachable: route \"{}\" before it matches every request it would", compiled.name, earlier.name),
            );
        }
        out.push((route.name.span(), compiled));
    }
    out
}

/// What a route may name, and the id it gets.
#[derive(Clone, Copy)]
struct Known<'a> {
    upstreams: &'a UpstreamNames,
    policies: &'a Policies,
    /// `[server] cors`, for routes without their own.
    server_cors: Option<&'a Arc<Cors>>,
    id: RouteId,
    /// The config has a `[decision]` listener, whose forward auth decides routes
    /// that another proxy forwards: such a route needs no upstream.
    decided_elsewhere: bool,
}

/// The route at `key`; `None` (with the diagnostics) when its prefix, destination or
/// policy cannot be used. Every part is checked whatever fails before it, so one run
/// of `sluice check` names every error of every route.
fn compile_route(
    d: &mut Diagnostics,
    key: &str,
    route: &raw::Route,
    known: Known,
) -> Option<Route> {
    let prefix = route.path_prefix.get_ref();
    let path_prefix = match crate::http::path::normalize(prefix) {
        Ok(p) if p.len() > 1 => Some(p.trim_end_matches('/').to_string()),
        Ok(p) => Some(p.into_owned()),
        Err(err) => {
            let key = format!("{key}.path_prefix");
            d.error(
                Some(route.path_prefix.span()),
                &key,
                format!("\"{prefix}\": {err}"),
            );
            None
        }
    };
    // Read like a request's host (route::host_of), so the two always compare:
    // an IPv6 literal keeps its brackets and loses its port.
    let host = route.host.as_ref().map(|h| {
        let host = h.get_ref().to_ascii_lowercase();
        crate::config::route::host_of(&host).to_string()
    });
    let methods = compile_methods(d, key, route);
    let destination = compile_destination(d, key, route, known);
    let websocket = route.websocket.unwrap_or(false);
    if websocket && matches!(destination, Some(Destination::Respond { .. })) {
        let why = "websocket = true needs an upstream to join the sockets to";
        d.error(Some(route.name.span()), &format!("{key}.websocket"), why);
    }
    let policies = compile_policy_list(d, key, route, known.policies);
    let cors = match &route.cors {
        Some(cors) => super::cors::compile_cors(
            d,
            &format!("{key}.cors"),
            cors.get_ref(),
            methods.as_deref(),
        ),
        None => known.server_cors.cloned(),
    };
    let costs = super::cost::compile_costs(d, key, route, destination.as_ref());
    let policies = policies?;
    Some(Route {
        cors,
        id: known.id,
        name: route.name.get_ref().clone(),
        host,
        path_prefix: path_prefix?,
        methods,
        cost_after: costs.cost_after,
        destination: destination?,
        policy: policies.first().copied(),
        policies,
        strip_prefix: route.strip_prefix.unwrap_or(false),
        path_parameters: route.path_parameters.unwrap_or(false),
        websocket,
        cost: costs.cost,
        refund_on: costs.refund_on,
        // Set by `check_costs` once the policies are known.
        max_cost: NonZeroU32::MAX,
        reserve: costs.reserve,
    })
}

/// "did you mean `orders`?" for the nearest of `names` to a misspelled one, else the
/// names there are (a few), else nothing.
fn name_suggestion<'a>(
    unknown: &str,
    names: impl Iterator<Item = &'a str>,
    what: &str,
) -> Option<String> {
    let mut names: Vec<&str> = names.collect();
    names.sort_unstable();
    let best = (names.iter())
        .map(|name| (strsim::jaro_winkler(unknown, name), *name))
        .max_by(|a, b| a.0.total_cmp(&b.0));
    match best {
        Some((score, name)) if score >= 0.8 => Some(format!("did you mean `{name}`?")),
        _ if names.is_empty() => Some(format!("no {what} are defined")),
        _ if names.len() <= 8 => Some(format!("{what} defined: {}", names.join(", "))),
        _ => None,
    }
}

/// `policy`: one name or a list of them (`["org", "per_key"]`), each a known policy,
/// none twice. In a list only the first may have a `total`: every counter of one
/// stacked decision sits in one Redis Cluster slot, placed by the first policy's
/// budget, and a `total` is one counter shared by every caller (docs/quotas.md).
/// `None` (with the diagnostics) when the list cannot be used.
fn compile_policy_list(
    d: &mut Diagnostics,
    key: &str,
    route: &raw::Route,
    policies: &Policies,
) -> Option<Box<[PolicyId]>> {
    let Some(names) = &route.policy else {
        return Some(Box::default());
    };
    let (span, at) = (names.span(), format!("{key}.policy"));
    let names = names.get_ref().as_slice();
    if names.is_empty() {
        d.error(
            Some(span),
            &at,
            "an empty list: name a policy, or leave policy out for a route that is not limited",
        );
        return None;
    }
    let mut ids: Vec<PolicyId> = Vec::with_capacity(names.len());
    let mut usable = true;
    for name in names {
        match policies.by_name.get(name) {
            Some(&index) if ids.contains(&PolicyId::new(index)) => {
                let twice = format!("policy \"{name}\" is listed twice");
                d.error(Some(span.clone()), &at, twice);
                usable = false;
            }
            Some(&index) => ids.push(PolicyId::new(index)),
            None => {
                let unknown = format!("unknown policy \"{name}\"");
                let known = policies.by_name.keys().map(String::as_str);
                let help = name_suggestion(name, known, "policies");
                d.error_with_help(Some(span.clone()), &at, unknown, help);
                usable = false;
            }
        }
    }
    for (place, id) in ids.iter().enumerate().skip(1) {
        let policy = &policies.list[id.index()].1;
        if !policy.total.is_empty() {
            let why = format!(
                "policy \"{}\" has a total and is not first in the list: only the first policy of a stack may have a total (every counter of one decision shares the first policy's Redis slot, and a total is one counter for every caller)",
                policy.name
            );
            d.error(Some(span.clone()), &format!("{at}[{place}]"), why);
            usable = false;
        }
    }
    usable.then(|| ids.into_boxed_slice())
}

/// `methods`, upper-cased; a name that is not a method is a diagnostic.
fn compile_methods(d: &mut Diagnostics, key: &str, route: &raw::Route) -> Option<Vec<Method>> {
    route.methods.as_ref().map(|methods| {
        methods
            .iter()
            .filter_map(|m| {
                Method::from_bytes(m.get_ref().to_ascii_uppercase().as_bytes())
                    .map_err(|_| {
                        d.error(
                            Some(m.span()),
                            &format!("{key}.methods"),
                            format!("\"{}\" is not an HTTP method", m.get_ref()),
                        )
                    })
                    .ok()
            })
            .collect::<Vec<_>>()
    })
}

/// `upstream` or `respond`: exactly one of them.
fn compile_destination(
    d: &mut Diagnostics,
    key: &str,
    route: &raw::Route,
    known: Known,
) -> Option<Destination> {
    let upstreams = known.upstreams;
    match (&route.upstream, &route.respond) {
        (Some(up), None) => match upstreams.by_name.get(up.get_ref()) {
            Some(&index) => Some(Destination::Upstream(UpstreamId::new(index))),
            None => {
                let unknown = format!("unknown upstream \"{}\"", up.get_ref());
                let names = upstreams.by_name.keys().map(String::as_str);
                let help = name_suggestion(up.get_ref(), names, "upstreams");
                d.error_with_help(Some(up.span()), &format!("{key}.upstream"), unknown, help);
                None
            }
        },
        (None, Some(respond)) => compile_respond(d, key, respond),
        (Some(up), Some(_)) => {
            d.error(Some(up.span()), key, "set upstream or respond, not both");
            None
        }
        // Decided for another proxy (forward auth); proxied here, it is a 404.
        (None, None) if known.decided_elsewhere => Some(Destination::Respond {
            status: http::StatusCode::NOT_FOUND,
            body: bytes::Bytes::from(
                serde_json::to_vec(&serde_json::json!({
                    "type": "about:blank",
                    "title": "Not Found",
                    "status": 404,
                    "detail": format!(
                        "route {} is decided for another proxy (forward auth) and has no upstream here",
                        route.name.get_ref()
                    ),
                }))
                .unwrap_or_default(),
            ),
            content_type: http::HeaderValue::from_static("application/problem+json"),
        }),
        (None, None) => {
            let needs = "needs an upstream or a respond table (or a [decision] listener, \
                         to be decided for another proxy only)";
            d.error(Some(route.name.span()), key, needs);
            None
        }
    }
}

pub(super) fn compile_respond(
    d: &mut Diagnostics,
    key: &str,
    respond: &Spanned<raw::Respond>,
) -> Option<Destination> {
    let r = respond.get_ref();
    let status = u16::try_from(*r.status.get_ref())
        .ok()
        .filter(|s| (200..=599).contains(s))
        .and_then(|s| StatusCode::from_u16(s).ok());
    let Some(status) = status else {
        d.error(
            Some(r.status.span()),
            &format!("{key}.respond.status"),
            "must be an HTTP status between 200 and 599",
        );
        return None;
    };
    let content_type = match &r.content_type {
        None => HeaderValue::from_static("text/plain; charset=utf-8"),
        Some(ct) => match HeaderValue::try_from(ct.get_ref().as_str()) {
            Ok(v) => v,
            Err(_) => {
                d.error(
                    Some(ct.span()),
                    &format!("{key}.respond.content_type"),
                    "is not a valid header value",
                );
                return None;
            }
        },
    };
    Some(Destination::Respond {
        status,
        body: Bytes::from(r.body.clone().unwrap_or_default()),
        content_type,
    })
}

/// Whether `earlier` matches every request that `later` matches.
fn shadows(earlier: &Route, later: &Route) -> bool {
    let host = earlier.host.is_none() || earlier.host == later.host;
    let path = crate::config::route::prefix_matches(&earlier.path_prefix, &later.path_prefix);
    let methods = match (&earlier.methods, &later.methods) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(e), Some(l)) => l.iter().all(|m| e.contains(m)),
    };
    host && path && methods
}
