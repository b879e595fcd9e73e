//! Browsers on a route with `cors` (or under `[server] cors`): a preflight is
//! answered before admission ([`Gateway::preflight`]), so it never counts against a
//! limit nor is refused by one, and every answer of the route, sluice's refusals
//! included, carries the CORS headers an allowed origin needs to read it
//! ([`Browser`]). With `preflight = "upstream"` allowed preflights go upstream
//! instead, still uncharged, at most `preflight_limit` a second per client IP
//! ([`Preflights`]).
//!
//! The rules themselves (which origin, method and headers, which headers answer
//! them) are `http::cors`'s.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use http::header::{ACCESS_CONTROL_REQUEST_HEADERS, HOST, ORIGIN};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use hyper::body::Incoming;
use parking_lot::Mutex;

use super::{Forward, Gateway};
use crate::config::route::{self, Destination, Route};
use crate::http::body::Body;
use crate::http::cors::{self, Cors, Preflight};
use crate::http::refusal::Refusal;
use crate::observe::access_log::Entry;
use crate::proxy::{BodyLimits, Carried, Origin, Outgoing};
use crate::server::conn::ConnInfo;
use crate::snapshot::Snapshot;

/// What a request's answer owes a browser.
#[derive(Debug)]
pub(super) enum Browser {
    /// Nothing: no route (nor `[server]`) has `cors`.
    Unseen,
    /// A preflight, answered with its CORS headers already.
    Preflight,
    /// A request with this `Origin` (or none) to a route with these rules (or
    /// `[server]`'s, or none): its answer gets their CORS headers, the upstream's
    /// own `Access-Control-*` out.
    Request(Option<HeaderValue>, Option<Arc<Cors>>),
}

impl Browser {
    /// What `request`'s answer owes a browser under `snapshot`. The route is found
    /// here, as admission will find it, so that an answer made before admission
    /// knows its route (a 401, a ban's 403) carries its rules too.
    pub(super) fn of<B>(snapshot: &Snapshot, request: &Request<B>) -> Browser {
        if !snapshot.routes.any_cors() {
            return Browser::Unseen;
        }
        let origin = request.headers().get(ORIGIN).cloned();
        let rules = match crate::http::path::normalize(request.uri().path()) {
            Ok(path) => (snapshot.routes)
                .find(|| host_of(request), &path, request.method())
                .map_or_else(|| snapshot.server().live.cors.clone(), |r| r.cors.clone()),
            Err(_) => snapshot.server().live.cors.clone(),
        };
        Browser::Request(origin, rules)
    }

    /// Puts the CORS headers of the request's route (else `[server] cors`) on
    /// `response`.
    pub(super) fn answer(self, response: &mut Response<Body>) {
        if let Browser::Request(origin, Some(rules)) = self {
            rules.answer(origin, response.headers_mut());
        }
    }
}

/// The host `request` is for (its target's authority, else `Host`), as routes
/// match it.
fn host_of<B>(request: &Request<B>) -> Option<&str> {
    (request.uri().authority().map(|a| a.as_str()))
        .or_else(|| request.headers().get(HOST).and_then(|h| h.to_str().ok()))
        .map(route::host_of)
}

/// How many preflights each client IP sent upstream in the current second, for
/// `preflight_limit`. Bounded: past [`MAX_CLIENTS`] addresses, those of earlier
/// seconds are dropped.
#[derive(Debug, Default)]
pub(crate) struct Preflights {
    /// Client IP → (the second, preflights in it).
    seen: Mutex<HashMap<IpAddr, (u64, u32)>>,
}

/// Client IPs the preflight counts hold at most before old seconds are dropped.
const MAX_CLIENTS: usize = 100_000;

impl Preflights {
    /// Counts a preflight of `client` at `now_ms`; whether it is within
    /// `per_second`.
    fn admit(&self, client: IpAddr, per_second: u32, now_ms: u64) -> bool {
        let second = now_ms / 1_000;
        let mut seen = self.seen.lock();
        if seen.len() >= MAX_CLIENTS {
            seen.retain(|_, (at, _)| *at == second);
        }
        let (at, count) = seen.entry(client).or_insert((second, 0));
        if *at != second {
            (*at, *count) = (second, 0);
        }
        *count += 1;
        *count <= per_second
    }
}

impl Gateway {
    /// Answers `request` if it is a CORS preflight for a route with `cors`: a 204
    /// with the `Access-Control-*` headers (or the upstream's answer, with
    /// `preflight = "upstream"`), or a 403 without them for an origin, method or
    /// header the route does not allow. Any other request is handed back.
    pub(super) async fn preflight(
        &self,
        snapshot: &Snapshot,
        request: Box<Request<Incoming>>,
        conn: ConnInfo,
        entry: &mut Entry<'_, Snapshot>,
    ) -> Result<Result<Response<Body>, Refusal>, Box<Request<Incoming>>> {
        if !snapshot.routes.any_cors() || !cors::is_preflight(&request) {
            return Err(request);
        }
        let Some(method) = cors::requested_method(&request) else {
            return Err(request);
        };
        let identifier = &snapshot.identifier;
        let limits = snapshot.server().size_limits();
        let head = match crate::http::head::check(&request, limits, identifier.api_key_header()) {
            Ok(head) => head,
            Err(refusal) => return Ok(Err(refusal)),
        };
        let uri = request.uri().clone();
        let path = match crate::http::path::normalize(uri.path()) {
            Ok(path) => path,
            Err(err) => return Ok(Err(err.into())),
        };
        let host = || {
            (uri.authority().map(|a| a.as_str()))
                .or_else(|| head.host.and_then(|h| h.to_str().ok()))
                .map(route::host_of)
        };
        let Some(route) = snapshot.routes.find_for_preflight(host, &path, &method) else {
            return Err(request);
        };
        let Some(rules) = route.cors.clone() else {
            return Err(request);
        };
        let client = identifier.client_ip(request.headers(), conn.peer.ip());
        entry.labels.client_and_path(client, &path);
        entry.labels.route = Some(route.id);
        if snapshot.denied(client) {
            return Ok(Err(Refusal::Denied));
        }
        if let Err(denied) = rules.check_preflight(request.headers()) {
            return Ok(Err(Refusal::CorsDenied(denied.detail())));
        }
        let asked = asked(request.headers());
        let (per_second, upstream) = match (rules.preflight, &route.destination) {
            (Preflight::Upstream { per_second }, Destination::Upstream(id)) => (per_second, *id),
            _ => return Ok(Ok(no_content(&rules, &asked))),
        };
        let now_ms = self.clock().now_ms();
        if !self.preflights.admit(client, per_second, now_ms) {
            return Ok(Err(Refusal::PreflightLimited));
        }
        let to = Forward {
            upstream,
            uri: &uri,
            conn,
            grpc: None,
        };
        let out = outgoing(snapshot, &to, route, &path, entry.request_id());
        let limits = BodyLimits::of(&snapshot.server().live);
        let answered: Result<Response<Body>, Refusal> = (snapshot.upstreams)
            .forward(
                to.upstream,
                request,
                &out,
                Carried::default(),
                limits,
                now_ms,
            )
            .await;
        entry.labels.upstream(0.0, answered.as_ref().ok());
        Ok(answered.map(|mut response| {
            rules.answer_preflight(&asked, response.headers_mut());
            response
        }))
    }
}

/// A preflight answered by sluice itself: a 204 with the `Access-Control-*`
/// headers for what it `asked`.
fn no_content(rules: &Cors, asked: &HeaderMap) -> Response<Body> {
    let mut response = Response::new(Body::full(bytes::Bytes::new()));
    *response.status_mut() = StatusCode::NO_CONTENT;
    rules.answer_preflight(asked, response.headers_mut());
    response
}

/// What a preflight sent on `to` its upstream is built from: no key header, no
/// `Authorization` to strip, not a gRPC call.
fn outgoing<'a>(
    snapshot: &'a Snapshot,
    to: &Forward<'a>,
    route: &'a Route,
    path: &'a str,
    request_id: &'a HeaderValue,
) -> Outgoing<'a> {
    let peer = to.conn.peer.ip().to_canonical();
    Outgoing {
        route,
        path,
        uri: to.uri,
        origin: Origin {
            peer,
            proto: to.conn.scheme.as_str(),
            peer_trusted: snapshot.identifier.is_trusted(peer),
        },
        key_header: None,
        authorization: false,
        request_id: (&snapshot.log().request_id_header, request_id),
        grpc: None,
    }
}

/// What a preflight asked for: its `Origin` and `Access-Control-Request-Headers`.
fn asked(headers: &HeaderMap) -> HeaderMap {
    let mut asked = HeaderMap::new();
    for name in [ORIGIN, ACCESS_CONTROL_REQUEST_HEADERS] {
        if let Some(value) = headers.get(&name) {
            asked.insert(name, value.clone());
        }
    }
    asked
}
