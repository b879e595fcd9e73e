//! Routes and route matching: the first route, in file order, whose host, path
//! prefix and methods all match the (already normalised) request.
//!
//! Prefixes are segment-aware: `/orders` matches `/orders` and `/orders/1`, never
//! `/ordersX`. Hosts compare case-insensitively without the port. The config compiles
//! `[[routes]]` into [`Route`]s; this module knows nothing of limits or upstreams
//! beyond the indexes a route carries, and hands back the index of the route.

use std::num::NonZeroU32;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, StatusCode};

use memchr::memmem::Finder;

use super::{PolicyId, RouteId, UpstreamId};

/// One compiled `[[routes]]` entry.
#[derive(Debug, Clone)]
pub struct Route {
    /// The route's place in match order.
    pub id: RouteId,
    /// `name`, unique: the `route` label of metrics and how logs and problems name it.
    pub name: String,
    /// Lower-case host without port.
    pub host: Option<String>,
    /// Normalised, without a trailing slash (except the root `/`).
    pub path_prefix: String,
    /// `methods`: the methods the route matches; `None` matches any.
    pub methods: Option<Vec<Method>>,
    /// `upstream` or `respond`: where the route's requests go.
    pub destination: Destination,
    /// Index of the route's policy in the config, if it is limited: the first of
    /// `policies`.
    pub policy: Option<PolicyId>,
    /// Every policy the route names, in order (`policy = ["org", "per_key"]`): all
    /// must admit a request, all or nothing. Empty without a policy; one for most
    /// routes.
    pub policies: Box<[PolicyId]>,
    /// `strip_prefix`: the upstream receives the path without `path_prefix`
    /// (`/api/v1` under `/api` goes up as `/v1`).
    pub strip_prefix: bool,
    /// `;` path parameters (matrix parameters) are passed on instead of refused.
    pub path_parameters: bool,
    /// `cost` (default 1): what one request counts against every window of the
    /// route's policy at admission.
    pub cost: NonZeroU32,
    /// `refund_on` (default none): answers with these statuses (the upstream's, or
    /// sluice's 502/504) give the request's cost back.
    pub refund_on: Vec<StatusCode>,
    /// `cost_after` and `default_cost`: the rest of the cost, learnt from the
    /// response and charged when it ends.
    pub cost_after: Option<CostAfter>,
    /// `max_cost` (default: the largest limit of the route's policies): the most
    /// one answer can charge; a larger one is clamped to it, logged and counted.
    pub max_cost: NonZeroU32,
    /// `reserve` (`cost_after` only): what admission holds for a request while it
    /// is in flight, instead of `cost` when larger, settled to the actual at its end.
    pub reserve: Option<Reserve>,
    /// `websocket`: WebSocket upgrades (HTTP/1.1 `Upgrade`, HTTP/2 extended
    /// CONNECT) are forwarded; elsewhere `Upgrade` is a hop-by-hop header.
    pub websocket: bool,
    /// `cors` (or `[server] cors`): how browsers from other origins are answered.
    pub(crate) cors: Option<Arc<crate::http::cors::Cors>>,
}

impl Route {
    /// Whether the route names several policies (`policy = ["org", "per_key"]`).
    pub fn stacked(&self) -> bool {
        self.policies.len() > 1
    }
}

/// Where a route's requests go.
#[derive(Debug, Clone)]
pub enum Destination {
    /// Index of the upstream in the config.
    Upstream(UpstreamId),
    /// A direct response, no upstream.
    Respond {
        /// `respond.status`, 200 to 599.
        status: StatusCode,
        /// `respond.body`, sent as written (empty by default).
        body: Bytes,
        /// `respond.content_type` (default `text/plain; charset=utf-8`).
        content_type: HeaderValue,
    },
}

/// What a `cost_after` request holds at admission while it is in flight
/// (`reserve`), so that concurrent requests are admitted only while their
/// reservations fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reserve {
    /// `reserve = N`: N units.
    Units(NonZeroU32),
    /// `reserve = "average"`: what the caller's recent answers on the route cost on
    /// average (`default_cost` while it has none).
    Average,
}

/// Where a response says what it cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// `header:NAME`: a response header, or a trailer of that name.
    Header(HeaderName),
    /// `json:PATH`: a field of a JSON body, or of an event of an event stream.
    Json(Arc<JsonPath>),
}

/// A route's `cost_after` and `default_cost`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CostAfter {
    /// `cost_after`: where the response says it.
    pub source: Source,
    /// Charged instead when the response does not say (default 1).
    pub default_cost: u32,
}

impl CostAfter {
    /// Parses `header:NAME` or `json:PATH`.
    pub fn parse(text: &str, default_cost: u32) -> Result<CostAfter, String> {
        let source = match text.split_once(':') {
            Some(("header", name)) => HeaderName::from_bytes(name.trim().as_bytes())
                .map(Source::Header)
                .map_err(|_| format!("\"{name}\" is not a header name"))?,
            Some(("json", path)) => {
                let keys: Vec<String> = path.split('.').map(str::to_string).collect();
                if keys.iter().any(String::is_empty) {
                    return Err(format!(
                        "\"{path}\" is not a path such as usage.total_tokens"
                    ));
                }
                Source::Json(Arc::new(JsonPath::new(keys)))
            }
            _ => return Err("expected \"header:NAME\" or \"json:PATH\"".to_string()),
        };
        Ok(CostAfter {
            source,
            default_cost,
        })
    }
}

/// A `json:PATH`: the keys leading to the field, built once per route.
#[derive(Debug, Clone)]
pub struct JsonPath {
    keys: Box<[String]>,
    /// Finds the last key as a document holding the field must spell it, quoted
    /// (`"total_tokens"`); none when the key holds a line end (an event's data lines,
    /// joined by line ends, could then form it without these bytes in the stream).
    last_key: Option<Finder<'static>>,
}

impl JsonPath {
    /// The path of `keys` (`usage.total_tokens` as `["usage", "total_tokens"]`).
    pub fn new(keys: Vec<String>) -> JsonPath {
        let last_key = keys
            .last()
            .filter(|key| !key.contains(['\r', '\n']))
            .map(|key| Finder::new(format!("\"{key}\"").as_bytes()).into_owned());
        JsonPath {
            keys: keys.into_boxed_slice(),
            last_key,
        }
    }

    /// The keys, outermost first.
    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    /// Finds the bytes every document holding the field contains: its last key,
    /// quoted and without escapes.
    pub fn last_key(&self) -> Option<&Finder<'static>> {
        self.last_key.as_ref()
    }
}

impl PartialEq for JsonPath {
    fn eq(&self, other: &JsonPath) -> bool {
        self.keys == other.keys
    }
}

impl Eq for JsonPath {}

/// The routes of one config snapshot, in match order.
#[derive(Debug)]
pub struct Routes {
    routes: Vec<Route>,
    /// A route has `cors`: requests are looked at for browsers' headers.
    any_cors: bool,
}

impl Routes {
    /// The routes in match order (the config's file order).
    pub fn new(routes: Vec<Route>) -> Routes {
        let any_cors = routes.iter().any(|route| route.cors.is_some());
        Routes { routes, any_cors }
    }

    /// Whether any route opens WebSockets (`websocket = true`).
    pub fn any_websocket(&self) -> bool {
        self.routes.iter().any(|route| route.websocket)
    }

    /// Whether any route answers browsers (`cors`).
    pub fn any_cors(&self) -> bool {
        self.any_cors
    }

    /// The first route matching `host` (no port, any case), `path` and `method`.
    /// `host` is asked for only when a route names a host: most configs name none,
    /// and finding the request's host costs as much as the rest of the match.
    pub fn find<'h>(
        &self,
        host: impl FnOnce() -> Option<&'h str>,
        path: &str,
        method: &Method,
    ) -> Option<&Route> {
        let host = std::cell::LazyCell::new(host);
        self.routes.iter().find(|route| {
            route
                .host
                .as_deref()
                .is_none_or(|h| host.is_some_and(|host| host.eq_ignore_ascii_case(h)))
                && prefix_matches(&route.path_prefix, path)
                && route.methods.as_ref().is_none_or(|m| m.contains(method))
        })
    }

    /// The route a browser's preflight asking for `method` is about: the first
    /// matching `method`, else the first matching host and path whatever its
    /// methods (whose `cors` then refuses the method).
    pub fn find_for_preflight<'h>(
        &self,
        host: impl Fn() -> Option<&'h str>,
        path: &str,
        method: &Method,
    ) -> Option<&Route> {
        (self.find(&host, path, method)).or_else(|| {
            let host = host();
            self.routes.iter().find(|route| {
                route
                    .host
                    .as_deref()
                    .is_none_or(|h| host.is_some_and(|host| host.eq_ignore_ascii_case(h)))
                    && prefix_matches(&route.path_prefix, path)
            })
        })
    }

    /// The route `id` (of this config: panics past the end).
    pub fn get(&self, id: RouteId) -> &Route {
        &self.routes[id.index()]
    }
}

/// Whether `prefix` (normalised, no trailing slash unless `/`) covers `path`
/// segment by segment.
pub fn prefix_matches(prefix: &str, path: &str) -> bool {
    if prefix == "/" {
        return true;
    }
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

/// The path the upstream receives when a route strips its prefix.
pub fn strip(prefix: &str, path: &str) -> String {
    if prefix == "/" {
        return path.to_string();
    }
    match path.strip_prefix(prefix) {
        Some("") | None => "/".to_string(),
        Some(rest) => rest.to_string(),
    }
}

/// The request host without the port (and without a trailing dot), as written.
pub fn host_of(authority: &str) -> &str {
    let host = match authority.rsplit_once(':') {
        Some((name, port))
            if port.bytes().all(|b| b.is_ascii_digit())
                && (!name.contains(':') || name.ends_with(']')) =>
        {
            name
        }
        _ => authority,
    };
    host.trim_end_matches('.')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use std::path::Path;

    fn routes() -> Routes {
        let config = Config::parse(
            Path::new("t.toml"),
            r#"
            [[routes]]
            name = "orders-post"
            path_prefix = "/orders"
            methods = ["POST"]
            respond = { status = 201 }
            [[routes]]
            name = "shop-host"
            host = "Shop.Example.com"
            path_prefix = "/"
            respond = { status = 200 }
            [[routes]]
            name = "orders"
            path_prefix = "/orders/"
            respond = { status = 200 }
            [[routes]]
            name = "root"
            path_prefix = "/"
            respond = { status = 404 }
            "#,
        )
        .unwrap();
        Routes::new(config.routes)
    }

    fn find(host: Option<&str>, path: &str, method: Method) -> &'static str {
        let routes = Box::leak(Box::new(routes()));
        routes
            .find(|| host, path, &method)
            .map(|r| r.name.as_str())
            .unwrap_or("none")
    }

    #[test]
    fn the_host_is_not_asked_for_until_a_route_names_one() {
        let routes = routes();
        // "orders-post" comes before any route with a host.
        let found = routes.find(|| panic!("host asked for"), "/orders", &Method::POST);
        assert_eq!(found.map(|r| r.name.as_str()), Some("orders-post"));
        let asked = std::cell::Cell::new(0);
        let found = routes.find(
            || {
                asked.set(asked.get() + 1);
                Some("shop.example.com")
            },
            "/other",
            &Method::GET,
        );
        assert_eq!(found.map(|r| r.name.as_str()), Some("shop-host"));
        assert_eq!(asked.get(), 1, "asked by the route that names a host");
    }

    #[test]
    fn first_match_in_file_order_on_host_prefix_and_method() {
        assert_eq!(find(None, "/orders", Method::POST), "orders-post");
        assert_eq!(find(None, "/orders/7", Method::POST), "orders-post");
        assert_eq!(find(None, "/orders/7", Method::GET), "orders");
        assert_eq!(find(None, "/ordersX", Method::POST), "root");
        assert_eq!(
            find(Some("shop.example.com"), "/orders", Method::GET),
            "shop-host"
        );
        assert_eq!(find(Some("other.example.com"), "/x", Method::GET), "root");
    }

    #[test]
    fn prefixes_match_whole_segments() {
        assert!(prefix_matches("/api", "/api"));
        assert!(prefix_matches("/api", "/api/v1"));
        assert!(!prefix_matches("/api", "/apix"));
        assert!(!prefix_matches("/api", "/ap"));
        assert!(prefix_matches("/", "/anything"));
    }

    #[test]
    fn stripping_keeps_an_absolute_path() {
        assert_eq!(strip("/api", "/api"), "/");
        assert_eq!(strip("/api", "/api/v1/x"), "/v1/x");
        assert_eq!(strip("/", "/x"), "/x");
    }

    #[test]
    fn hosts_lose_port_and_case() {
        assert_eq!(host_of("Shop.Example.COM:8080"), "Shop.Example.COM");
        assert_eq!(host_of("example.com."), "example.com");
        assert_eq!(host_of("[::1]:80"), "[::1]");
    }
}
