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
//! counted. The connection limits and timeouts are the listener's own, kept by
//! `server` like any listener's; the token and the rules come from the config
//! snapshot of each request, so they reload with it. This module decides nothing
//! itself and holds no state.

mod forward_auth;
mod grpc;
mod rls;

use std::sync::Arc;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;

use crate::gateway::Gateway;
use crate::http::body::Body;
use crate::http::refusal::admin_problem;
use crate::server::Handler;
use crate::server::conn::ConnInfo;

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
        let grpc = grpc::is_grpc(&request);
        let Some(decision) = snapshot.decision() else {
            // The section was removed by a reload; the listener stops with the process.
            let reason = "[decision] is not configured";
            return match grpc {
                true => grpc::status(grpc::Code::Unavailable, reason),
                false => admin_problem(StatusCode::SERVICE_UNAVAILABLE, reason),
            };
        };
        if !authorized(decision.token.as_deref(), &request) {
            let reason = "missing or wrong sluice-token";
            return match grpc {
                true => grpc::status(grpc::Code::Unauthenticated, reason),
                false => admin_problem(StatusCode::UNAUTHORIZED, reason),
            };
        }
        if grpc {
            return rls::serve(&self.gateway, &snapshot, request, conn.peer.ip()).await;
        }
        match request.uri().path() {
            forward_auth::PATH => forward_auth::serve(&self.gateway, request, conn).await,
            _ => admin_problem(StatusCode::NOT_FOUND, "not a decision endpoint"),
        }
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
