//! The admin listener: routing and authorisation of metrics, health, reload, usage and
//! the decision API.
//!
//! | method and path | what |
//! | --- | --- |
//! | `GET /metrics` | Prometheus text format |
//! | `GET /healthz`, `GET /readyz` | liveness; readiness: 503 while requests would be refused for it ([`ready`]) |
//! | `GET /` | the status page, or its login form; `POST /login`, `POST /logout` ([`session`]) |
//! | `GET /admin/status` | the status page's JSON: traffic, refused and near-limit callers, bans, caps, store, identity, reloads, process ([`status`]) |
//! | `POST /admin/reload` | reload the config file now: 200, or 400 with every error |
//! | `GET`/`DELETE /admin/usage?caller=ip:1.2.3.4` | a caller's counters; reset them ([`usage`]) |
//! | `GET /admin/usage?policy=P&format=jsonl` | every tracked caller's usage in a policy, a page at a time ([`export`]) |
//! | `POST /admin/usage/credit` | units back in a caller's current billing periods ([`usage`]) |
//! | `GET`/`POST`/`DELETE /admin/bans` | list, add and lift bans ([`bans`]) |
//! | `POST /v1/check` | the decision API: counts like a proxied request ([`check`]) |
//!
//! `/`, `/admin/*` and `/v1/check` need `Authorization: Bearer <token>` when `[admin]
//! token` is set (compared in constant time; an address that keeps sending wrong
//! tokens has its answers slowed down), or the status page's session cookie, with
//! which a change also needs the page's CSRF token ([`session`]). Without a token on a non-loopback listener
//! only `/metrics`, `/healthz` and `/readyz` answer; the rest is 403. Every error is problem+json. This module does no limiting of its
//! own: it asks the gateway's store, through the current snapshot.

mod bans;
mod check;
mod export;
mod ready;
pub(crate) mod reload;
mod session;
mod status;
mod usage;

/// The status page's fleet part: this replica's near-limit callers, posted for every
/// replica's page (Redis only), by the maintenance every `NEAR_LIMIT_POST_TICKS`.
pub(crate) use status::fleet::{
    POST_EVERY_TICKS as NEAR_LIMIT_POST_TICKS, post as post_near_limit,
};

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_TYPE};
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde::Serialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::gateway::Gateway;
use crate::http::body::Body;
use crate::server::conn::ConnInfo;
// The admin API's refusals are built where every refusal is.
use crate::admin::reload::Reloader;
use crate::admission::NamedCaller;
use crate::http::refusal::admin_problem as problem;
use crate::server::Handler;
use crate::snapshot::Snapshot;

/// Largest accepted body of an admin request.
const MAX_BODY: usize = 64 * 1024;

/// How a request to the admin API is authorised.
enum Via {
    /// No token is set and the listener is loopback.
    Open,
    /// `Authorization: Bearer <token>`.
    Bearer,
    /// The status page's session cookie.
    Session(session::Session),
}

/// Wrong tokens from one address before its answers are slowed down.
const FREE_FAILURES: u32 = 5;
/// The longest an answer to a wrong token is held back.
const MAX_DELAY: Duration = Duration::from_secs(5);
/// Addresses whose failures are remembered (the map is cleared when it is full).
const MAX_TRACKED: usize = 10_000;

/// The admin API over a gateway.
pub(crate) struct Admin {
    gateway: Arc<Gateway>,
    reloader: Arc<Reloader>,
    /// SHA-256 of the token: compared in constant time whatever the lengths.
    token: Option<[u8; 32]>,
    /// The listener is not loopback: without a token, only the probes answer.
    exposed: bool,
    /// Wrong tokens per client address (the count, and the first one's time).
    failures: parking_lot::Mutex<HashMap<IpAddr, (u32, Instant)>>,
    /// When the admin API started: the process's uptime, near enough.
    started: Instant,
    /// Five minutes of every route's totals, for the status page's rates.
    traffic: status::traffic::Traffic,
    /// The status page's logged-in browsers.
    sessions: session::Sessions,
}

impl Admin {
    pub(crate) fn new(
        gateway: Arc<Gateway>,
        reloader: Arc<Reloader>,
        token: Option<String>,
        exposed: bool,
    ) -> Admin {
        Admin {
            gateway,
            reloader,
            token: token.map(|t| Sha256::digest(t.as_bytes()).into()),
            exposed,
            failures: parking_lot::Mutex::new(HashMap::new()),
            started: Instant::now(),
            traffic: status::traffic::Traffic::default(),
            sessions: session::Sessions::default(),
        }
    }

    async fn route(&self, request: Request<Incoming>, peer: IpAddr) -> Response<Body> {
        let path = request.uri().path().to_string();
        let method = request.method().clone();
        // HEAD is GET without the body (hyper sends none): what probes often use.
        let read = method == Method::GET || method == Method::HEAD;
        let page = matches!(path.as_str(), "/" | "/login" | "/logout");
        let protected = page || path.starts_with("/admin/") || path == "/v1/check";
        if protected && self.token.is_none() && self.exposed {
            return problem(
                StatusCode::FORBIDDEN,
                "the admin API answers off loopback only with [admin] token set; /metrics, /healthz and /readyz are open",
            );
        }
        if path == "/login" {
            return self.login(request, peer).await;
        }
        let via = self.authorise(request.headers());
        match &via {
            None if path == "/" && read => return self.login_page(StatusCode::UNAUTHORIZED, false),
            None if protected => {
                tokio::time::sleep(self.failed_from(peer)).await;
                let mut response = problem(
                    StatusCode::UNAUTHORIZED,
                    "a valid admin bearer token is required",
                );
                response
                    .headers_mut()
                    .insert("www-authenticate", HeaderValue::from_static("Bearer"));
                return response;
            }
            Some(Via::Open) if protected && !open_request_allowed(&request, read) => {
                return problem(
                    StatusCode::FORBIDDEN,
                    "the tokenless admin API answers requests to a loopback host, and takes changes only from its own origin or from clients that send no Origin (curl, scripts)",
                );
            }
            Some(Via::Session(session))
                if protected && !read && !session.allows_change(request.headers()) =>
            {
                return problem(
                    StatusCode::FORBIDDEN,
                    "a change authorised by the session cookie needs the status page's X-CSRF-Token, from its own origin",
                );
            }
            _ => {}
        }
        match (&method, path.as_str()) {
            (_, "/") if read => self.page(via.as_ref()).await,
            (&Method::POST, "/logout") => self.logout(&request),
            (_, "/metrics") if read => self.metrics(),
            (_, "/healthz") if read => json(StatusCode::OK, &serde_json::json!({"status": "ok"})),
            (_, "/readyz") if read => ready::readyz(&self.gateway).await,
            (_, "/admin/status") if read => json(StatusCode::OK, &self.status().await),
            (&Method::POST, "/admin/reload") => self.reload(),
            (&Method::GET, "/admin/usage") if exporting(&request) => {
                export::export(&self.gateway, &request).await
            }
            (&Method::GET, "/admin/usage") => usage::usage(&self.gateway, &request, false).await,
            (&Method::DELETE, "/admin/usage") => usage::usage(&self.gateway, &request, true).await,
            (&Method::POST, "/admin/usage/credit") => usage::credit(&self.gateway, request).await,
            (&Method::POST, "/v1/check") => check::check(&self.gateway, request).await,
            (&Method::GET, "/admin/bans") => bans::list(&self.gateway),
            (&Method::POST, "/admin/bans") => bans::add(&self.gateway, request).await,
            (&Method::DELETE, "/admin/bans") => bans::lift(&self.gateway, &request).await,
            (_, path) => match allowed(path) {
                Some(allow) => {
                    let mut response = problem(
                        StatusCode::METHOD_NOT_ALLOWED,
                        "method not allowed on this path",
                    );
                    let allow = HeaderValue::from_static(allow);
                    response.headers_mut().insert(http::header::ALLOW, allow);
                    response
                }
                None => problem(StatusCode::NOT_FOUND, "no such admin endpoint"),
            },
        }
    }

    /// How the request is authorised, if it is: the admin API is open (no token,
    /// loopback), or it carries the token as `Authorization: Bearer <token>` (the
    /// scheme in any case), or a live session's cookie. Digests are compared, so
    /// neither the token's bytes nor its length show in the time taken.
    fn authorise(&self, headers: &http::HeaderMap) -> Option<Via> {
        let Some(token) = &self.token else {
            return Some(Via::Open);
        };
        let presented = headers
            .get(AUTHORIZATION)
            .map(|v| v.as_bytes().trim_ascii())
            .and_then(|v| v.split_at_checked(7))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case(b"bearer "))
            .map(|(_, rest)| rest.trim_ascii());
        match presented {
            Some(presented) if self.is_token(presented, token) => Some(Via::Bearer),
            Some(_) => None,
            None => self.sessions.find(headers).map(Via::Session),
        }
    }

    /// Whether `presented` is the token whose digest is `token`.
    fn is_token(&self, presented: &[u8], token: &[u8; 32]) -> bool {
        let digest: [u8; 32] = Sha256::digest(presented).into();
        bool::from(digest.ct_eq(token))
    }

    /// Counts a wrong token from `peer`; returns how long to hold its answer back:
    /// nothing for the first few in a minute, then doubling up to [`MAX_DELAY`].
    fn failed_from(&self, peer: IpAddr) -> Duration {
        let mut failures = self.failures.lock();
        if failures.len() >= MAX_TRACKED {
            failures.clear();
        }
        let entry = failures.entry(peer).or_insert((0, Instant::now()));
        if entry.1.elapsed() > Duration::from_secs(60) {
            *entry = (0, Instant::now());
        }
        entry.0 += 1;
        match entry.0.checked_sub(FREE_FAILURES) {
            None | Some(0) => Duration::ZERO,
            Some(over) => {
                (Duration::from_millis(100) * 2u32.saturating_pow(over.min(10))).min(MAX_DELAY)
            }
        }
    }

    /// `POST /admin/reload`: the new generation and what only a restart applies, or
    /// every error of the rejected file.
    fn reload(&self) -> Response<Body> {
        match self.reloader.reload() {
            Ok(reloaded) => {
                let restart_only: Vec<String> = reloaded
                    .restart_only
                    .iter()
                    .map(|d| d.to_string())
                    .collect();
                json(
                    StatusCode::OK,
                    &serde_json::json!({
                        "status": "reloaded",
                        "generation": reloaded.generation,
                        "restart_only": restart_only,
                    }),
                )
            }
            Err(err) => {
                let errors: Vec<String> = err.errors().map(|d| d.to_string()).collect();
                let mut response = json(
                    StatusCode::BAD_REQUEST,
                    &serde_json::json!({
                        "type": "about:blank",
                        "title": "Bad Request",
                        "status": 400,
                        "detail": "the new config was rejected; the old one keeps serving",
                        "errors": errors,
                    }),
                );
                response.headers_mut().insert(
                    CONTENT_TYPE,
                    HeaderValue::from_static("application/problem+json"),
                );
                response
            }
        }
    }

    fn metrics(&self) -> Response<Body> {
        let metrics = self.gateway.metrics();
        let store = self.gateway.store();
        metrics.tracked_callers.set(store.tracked() as i64);
        let errors = metrics.store_errors.with_label_values(&[store.backend()]);
        let store_errors = store.errors();
        if store_errors > errors.get() {
            errors.inc_by(store_errors - errors.get());
        }
        metrics.store_fallback.set(i64::from(store.in_fallback()));
        metrics.store_breaker_open.reset();
        for (node, open) in store.masters_health() {
            (metrics
                .store_breaker_open
                .with_label_values(&[node.as_str()]))
            .set(i64::from(open));
        }
        let (resets, _) = store.resets();
        if resets > metrics.store_resets.get() {
            metrics
                .store_resets
                .inc_by(resets - metrics.store_resets.get());
        }
        let now_ms = self.gateway.clock().now_ms();
        metrics
            .bans_active
            .set(store.ban_table().active(now_ms) as i64);
        let dropped = store.ban_table().dropped();
        if dropped > metrics.bans_dropped.get() {
            metrics
                .bans_dropped
                .inc_by(dropped - metrics.bans_dropped.get());
        }
        let blocked = self.gateway.offenders().blocked_count(Instant::now());
        metrics.flood_blocked.set(blocked as i64);
        let evicted = store.evicted();
        let counted = metrics.evicted_callers.get();
        if evicted > counted {
            metrics.evicted_callers.inc_by(evicted - counted);
        }
        let mut response = Response::new(Body::full(metrics.render()));
        response.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        );
        response
    }
}

impl Handler for Admin {
    async fn handle(&self, request: Box<Request<Incoming>>, conn: ConnInfo) -> Response<Body> {
        self.route(*request, conn.peer.ip()).await
    }
}

async fn read_body(request: Request<Incoming>) -> Result<Bytes, Response<Body>> {
    let limited = http_body_util::Limited::new(request.into_body(), MAX_BODY);
    match limited.collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(_) => Err(problem(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request body too large or unreadable",
        )),
    }
}

/// A request body as JSON of type `T`: 400 with the reason when it is not, 413
/// when it is too large.
async fn read_json<T: serde::de::DeserializeOwned>(
    request: Request<Incoming>,
) -> Result<T, Response<Body>> {
    let body = read_body(request).await?;
    serde_json::from_slice(&body).map_err(|err| {
        problem(
            StatusCode::BAD_REQUEST,
            &format!("invalid request body: {err}"),
        )
    })
}

/// Whether the open (tokenless, loopback) admin API answers `request`. A web page
/// the operator visits can make the browser send requests to loopback: its
/// cross-site `POST`s carry a foreign `Origin`, and a page that rebinds its own name
/// to 127.0.0.1 sends that name as `Host`. So the `Host` (or HTTP/2's `:authority`)
/// must name a loopback address or `localhost`, and a change must come from its own
/// origin or from a client that sends none.
fn open_request_allowed(request: &Request<Incoming>, read: bool) -> bool {
    let headers = request.headers();
    // A request with no host at all (HTTP/1.0) comes from no browser; a `Host` that
    // is not text names no loopback.
    let loopback_host = match headers.get(http::header::HOST) {
        Some(host) => host.to_str().is_ok_and(is_loopback_host),
        None => (request.uri().authority()).is_none_or(|a| is_loopback_host(a.as_str())),
    };
    loopback_host && (read || session::same_origin(headers))
}

/// Whether `host` (a `Host` header: a name or address, maybe with a port) names
/// this machine's loopback.
fn is_loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(bracketed) => bracketed.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The methods an admin path answers, for the `Allow` header of a 405; `None` for
/// a path that is not an endpoint.
fn allowed(path: &str) -> Option<&'static str> {
    Some(match path {
        "/" | "/metrics" | "/healthz" | "/readyz" | "/admin/status" => "GET, HEAD",
        "/logout" => "POST",
        "/admin/reload" | "/v1/check" | "/admin/usage/credit" => "POST",
        "/admin/usage" => "GET, DELETE",
        "/admin/bans" => "GET, POST, DELETE",
        _ => return None,
    })
}

/// A refusal to answer with; boxed, as errors should be small.
type Refused = Box<Response<Body>>;

/// The caller named by `text`, or the 400 that says how to name one.
fn named_caller(text: &str, snapshot: &Snapshot) -> Result<NamedCaller, Refused> {
    NamedCaller::parse(text, snapshot).ok_or_else(|| {
        Box::new(problem(
            StatusCode::BAD_REQUEST,
            "caller must be ip:ADDRESS or consumer:NAME",
        ))
    })
}

/// The caller of the `caller=` query parameter, as written and resolved, or the 400.
fn queried_caller(
    request: &Request<Incoming>,
    snapshot: &Snapshot,
) -> Result<(String, NamedCaller), Refused> {
    let Some(caller) = caller_param(request) else {
        return Err(Box::new(problem(
            StatusCode::BAD_REQUEST,
            "the caller parameter is required, e.g. caller=ip:1.2.3.4",
        )));
    };
    let target = named_caller(&caller, snapshot)?;
    Ok((caller, target))
}

/// The `caller=` parameter of a query, decoded.
fn caller_param(request: &Request<Incoming>) -> Option<String> {
    query_pairs(request)
        .find(|(name, _)| name == "caller")
        .map(|(_, value)| value.into_owned())
}

/// The parameters of a request's query, decoded as a form is (`+` as a space,
/// `%XX` escapes; a bad escape stays as written, bytes that are not UTF-8 become
/// U+FFFD).
/// `GET /admin/usage` names a policy, not a caller: the usage export.
fn exporting<B>(request: &Request<B>) -> bool {
    query_pairs(request).any(|(name, _)| name == "policy")
}

fn query_pairs<B>(request: &Request<B>) -> form_urlencoded::Parse<'_> {
    form_urlencoded::parse(request.uri().query().unwrap_or("").as_bytes())
}

fn json(status: StatusCode, value: &impl Serialize) -> Response<Body> {
    let mut response = Response::new(Body::full(serde_json::to_vec(value).unwrap_or_default()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

#[cfg(test)]
mod tests {
    use super::query_pairs;

    fn decoded(raw: &str) -> String {
        let request = http::Request::get(format!("/admin/usage?caller={raw}"))
            .body(())
            .unwrap();
        query_pairs(&request).next().unwrap().1.into_owned()
    }

    #[test]
    fn query_values_decode_escapes_and_plus_and_keep_bad_escapes() {
        for (raw, decoded) in [
            ("consumer%3Aacme", "consumer:acme"),
            ("ip%3A2001%3Adb8%3A%3A1", "ip:2001:db8::1"),
            ("a+b", "a b"),
            ("a%2Bb", "a+b"),
            ("100%25", "100%"),
            ("%zz%4", "%zz%4"),
            ("caf%C3%A9", "café"),
            ("bad%FF", "bad\u{FFFD}"),
        ] {
            assert_eq!(super::tests::decoded(raw), decoded, "{raw}");
        }
    }
}
