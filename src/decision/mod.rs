//! The decision listener: sluice as the rate limiter of a proxy someone already
//! runs. One port (`[decision] listen`) serves gRPC over HTTP/2 (h2c, or TLS with
//! `[decision.tls]`) and HTTP/1.1:
//!
//! - `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` ([`rls`]), the
//!   protocol of Envoy's rate limit filter (and so of Istio, Emissary, Contour and
//!   Gloo), on any request whose content type is `application/grpc`;
//! - `/v1/forward-auth` ([`forward_auth`]), for Traefik ForwardAuth, Caddy
//!   `forward_auth`, Envoy `ext_authz` in HTTP mode and nginx `auth_request`.
//!
//! Both translate, then ask admission: the same service the proxy path and
//! `/v1/check` ask, so the doors cannot disagree about a caller. The optional
//! token (`sluice-token`, a header or gRPC metadata; never `Authorization`, which
//! forward auth passes on from the client) is checked before anything is read or
//! charged; a request without it, like every refusal before a door decides, is still
//! logged and counted in `sluice_decisions_total`. The connection limits and timeouts are the listener's own, kept by
//! `server` like any listener's; the token and the rules come from the config
//! snapshot of each request, so they reload with it. This module decides nothing
//! itself and holds no state.

mod forward_auth;
mod grpc;
mod rls;

use std::net::IpAddr;
use std::sync::Arc;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;

use crate::gateway::Gateway;
use crate::http::body::Body;
use crate::http::refusal::{OUTCOMES, Outcome, admin_problem};
use crate::observe::access_log::GrpcStatus;
use crate::server::Handler;
use crate::server::conn::ConnInfo;
use crate::snapshot::Snapshot;

/// The header (or gRPC metadata) that carries `[decision] token`.
const TOKEN_HEADER: &str = "sluice-token";

/// The decision listener's requests, answered with the gateway's snapshot,
/// admission and access log.
pub(crate) struct DecisionListener {
    gateway: Arc<Gateway>,
}

impl DecisionListener {
    pub(crate) fn new(gateway: Arc<Gateway>) -> DecisionListener {
        DecisionListener { gateway }
    }

    async fn route(&self, request: Request<Incoming>, conn: ConnInfo) -> Response<Body> {
        let snapshot = self.gateway.snapshot();
        let peer = conn.peer.ip();
        let refused =
            |status, reason: &str| refuse(&self.gateway, &snapshot, &request, peer, status, reason);
        let Some(decision) = snapshot.decision() else {
            // The section was removed by a reload; the listener stops with the process.
            return refused(
                StatusCode::SERVICE_UNAVAILABLE,
                "[decision] is not configured",
            );
        };
        if !authorized(decision.token.as_deref(), &request) {
            return refused(StatusCode::UNAUTHORIZED, "missing or wrong sluice-token");
        }
        if grpc::is_grpc(&request) {
            return rls::serve(&self.gateway, &snapshot, request, peer).await;
        }
        if request.uri().path() != forward_auth::PATH {
            return refused(StatusCode::NOT_FOUND, "not a decision endpoint");
        }
        forward_auth::serve(&self.gateway, &snapshot, request, conn).await
    }
}

/// A call refused before its door decides anything (a wrong token, the section gone
/// by a reload, no such endpoint, a forward-auth request that names no request):
/// answered in the door's terms (a gRPC status for an RLS call, problem+json
/// otherwise, as a 403 naming it when `?mode=nginx` asks, as for every refusal),
/// counted in `sluice_decisions_total` and logged as the door's own
/// lines are, with `status` as the line's status.
fn refuse(
    gateway: &Gateway,
    snapshot: &Arc<Snapshot>,
    request: &Request<Incoming>,
    peer: IpAddr,
    status: StatusCode,
    reason: &str,
) -> Response<Body> {
    let (outcome, code) = match status {
        StatusCode::UNAUTHORIZED => (Outcome::Unauthorized, grpc::Code::Unauthenticated),
        StatusCode::NOT_FOUND => (Outcome::NoRoute, grpc::Code::Unimplemented),
        StatusCode::BAD_REQUEST => (Outcome::BadRequest, grpc::Code::InvalidArgument),
        _ => (Outcome::Unavailable, grpc::Code::Unavailable),
    };
    let rpc = grpc::is_grpc(request);
    let (via, label) = match rpc {
        true => ("rls", "rls"),
        false => ("forward-auth", "forward_auth"),
    };
    let metrics = gateway.metrics();
    let outcome_label = OUTCOMES[outcome as usize];
    metrics
        .decisions
        .with_label_values(&[label, outcome_label])
        .inc();
    let mut entry = gateway.entry(snapshot, request, peer);
    entry.labels.via(via);
    let (mut response, logged) = match rpc {
        true => (grpc::status(code, reason), GrpcStatus::Known(code as u8)),
        false => (admin_problem(status, reason), GrpcStatus::None),
    };
    let id_header = &snapshot.log().request_id_header;
    (response.headers_mut()).insert(id_header, entry.request_id().clone());
    entry.decided(&mut response, status.as_u16(), outcome, logged);
    match !rpc && forward_auth::for_nginx_asked(request) {
        true => forward_auth::for_nginx(response),
        false => response,
    }
}

/// Whether `request` carries the token, when one is configured (compared in
/// constant time).
fn authorized(token: Option<&str>, request: &Request<Incoming>) -> bool {
    let Some(token) = token else {
        return true;
    };
    let sent = request.headers().get(TOKEN_HEADER).map(|v| v.as_bytes());
    sent.is_some_and(|sent| subtle::ConstantTimeEq::ct_eq(sent, token.as_bytes()).into())
}

impl Handler for DecisionListener {
    fn handle(
        &self,
        request: Box<Request<Incoming>>,
        conn: ConnInfo,
    ) -> impl Future<Output = Response<Body>> + Send {
        self.route(*request, conn)
    }
}
