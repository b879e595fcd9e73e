//! The life of one request, as a story: admit it, respond or forward it, settle
//! it, answer it; count and log it.
//!
//! `Gateway::handle` loads the config snapshot once and serves the whole request
//! with it; `Gateway::serve` is the story in a few lines. Whether the request may go
//! ahead, and what it costs, is admission's answer (`admission`: the head, the path,
//! the caller, bans, the route, the limits and the concurrency cap; after the
//! answer, the refund and the meter); every refusal is an `Err(Refusal)` turned into
//! a response in one place (`http::refusal`); the request as the upstream gets it is
//! proxy's to build (`proxy`); the request's log line is its `access_log::Entry`,
//! filled with what admission learnt. Network and timing concerns (accepting,
//! timeouts, draining) belong to `server`; counting belongs to the store. This module
//! decides nothing and builds no error response. An admitted WebSocket upgrade opens
//! its socket upstream and lives on after its `101` (`socket`); a browser's CORS
//! preflight is answered before admission, and every answer for an allowed origin
//! carries the CORS headers (`cors`).
//!
//! Making the gateway and swapping its config on reload is `install`; what the
//! server asks of it (serve, refuse, flood keys) is `handler`.

mod cors;
mod handler;
mod install;
mod socket;

use std::sync::Arc;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderValue, Request, Response, StatusCode, Uri, Version};
use hyper::body::Incoming;

use crate::admission::{Admission, Admitted, Learned};
use crate::clock::{Clock, Stopwatch};
use crate::concurrency::Caps;
use crate::config::UpstreamId;
use crate::config::route::Destination;
use crate::http::body::Body;
use crate::http::refusal::{Outcome, Refusal};
use crate::observe::access_log::{AccessLog, Entry, GrpcStatus, Labels};
use crate::observe::metrics::{GrpcCounts, Metrics};
use crate::proxy::{BodyLimits, Carried, GrpcCall, Held, Origin, Outgoing, Pools};
use crate::server::Offenders;
use crate::server::conn::ConnInfo;
use crate::snapshot::Snapshot;
use crate::store::Store;
use cors::Browser;

/// The gateway: the current config snapshot, admission (with the counters, the
/// clock and metrics), the upstream pools and the access log.
#[derive(Debug)]
pub struct Gateway {
    /// The config every new request is served with; replaced whole on reload.
    snapshot: ArcSwap<Snapshot>,
    /// Decides every request; owns the counters, which outlive snapshots so reloads
    /// keep history.
    admission: Admission,
    /// Upstream keep-alive pools; outlive snapshots so reloads keep connections.
    pools: Pools,
    /// Policies' concurrency caps; outlive snapshots so reloads keep permits.
    caps: Caps,
    access_log: AccessLog,
    /// Addresses refused new connections after floods; outlive snapshots.
    offenders: Offenders,
    /// Preflights each client IP sent upstream this second (`preflight_limit`).
    preflights: cors::Preflights,
}

impl Gateway {
    /// The admission service, which the decision API shares.
    pub(crate) fn admission(&self) -> &Admission {
        &self.admission
    }

    /// The counters and bans, which outlive reloads.
    pub fn store(&self) -> &Store {
        self.admission.store()
    }

    /// The clock every decision and log line is stamped with.
    pub(crate) fn clock(&self) -> &Clock {
        self.admission.clock()
    }

    /// The addresses refused new connections after floods.
    pub(crate) fn offenders(&self) -> &Offenders {
        &self.offenders
    }

    /// The metrics the admin listener serves at `/metrics`.
    pub fn metrics(&self) -> &Metrics {
        self.admission.metrics()
    }

    /// Serves one request that came on `conn`: admit it, respond or forward it,
    /// settle it, answer it; count and log it.
    pub(crate) async fn handle(
        &self,
        mut request: Box<Request<Incoming>>,
        conn: ConnInfo,
    ) -> Response<Body> {
        let snapshot = self.snapshot.load();
        let peer = conn.peer.ip();
        let version = ready(&snapshot, &mut request, peer);
        let grpc = crate::http::grpc::is_call(version, request.headers());
        // A client that goes away before its answer drops this future: the entry
        // then logs the request as 499.
        let mut entry = self.entry(&snapshot, &request, peer);
        // Boxed: the request path's state is kilobytes, and hyper moves the service
        // future by value into its dispatcher; one copy into the box replaces the
        // later ones (`docs/performance.md`, "Figures behind the code").
        let mut browser = Browser::of(&snapshot, &request);
        // Boxed apart: most gateways answer no browser, and their requests' futures
        // should not carry a preflight's state.
        let request = match browser {
            Browser::Unseen => Err(request),
            _ => {
                let preflight = Box::pin(self.preflight(&snapshot, request, conn, &mut entry));
                preflight.await
            }
        };
        let mut socket = None;
        let served = match request {
            Ok(answered) => {
                browser = Browser::Preflight;
                answered
            }
            Err(request) => {
                // Boxed in a statement of its own: the temporary of a
                // `Box::pin(f(..)).await` lives until the await ends, which would size
                // f's whole future into this one as well (6 104 bytes against 1 176).
                let serving =
                    Box::pin(self.serve(&snapshot, request, conn, grpc, &mut entry, &mut socket));
                serving.await
            }
        };
        let answer = Answer { version, grpc };
        close(&snapshot, &mut entry, served, answer, socket, browser)
    }

    /// Answers a request its connection refused before the gateway saw it (the
    /// connection is closing, or its client is blocked for a flood) the way the
    /// gateway answers its own refusals: with the same headers, counted and logged.
    pub(crate) fn refuse(
        &self,
        mut request: Box<Request<Incoming>>,
        conn: ConnInfo,
        refusal: Refusal,
    ) -> Response<Body> {
        let snapshot = self.snapshot.load();
        let peer = conn.peer.ip();
        let version = ready(&snapshot, &mut request, peer);
        let grpc = crate::http::grpc::is_call(version, request.headers());
        let mut entry = self.entry(&snapshot, &request, peer);
        let client = (snapshot.identifier).client_ip(request.headers(), peer);
        entry.labels.client(client);
        let browser = Browser::of(&snapshot, &request);
        let answer = Answer { version, grpc };
        close(&snapshot, &mut entry, Err(refusal), answer, None, browser)
    }

    /// Decides `original`, a request another proxy asks about (forward auth), sent
    /// to it by `peer`, exactly as if sluice were proxying it (`via` names the door
    /// in the access log), with the `snapshot` the door read its token from; answers
    /// 200 with its quota's headers, or its refusal. Counted and logged like a
    /// proxied request.
    pub(crate) async fn decide_forwarded(
        &self,
        snapshot: &Arc<Snapshot>,
        mut original: Request<()>,
        peer: std::net::IpAddr,
        via: &'static str,
    ) -> (Response<Body>, Outcome) {
        (snapshot.identifier).strip_untrusted(original.headers_mut(), peer);
        let mut entry = self.entry(snapshot, &original, peer);
        entry.labels.via(via);
        let uri = original.uri().clone();
        let admitted = self
            .admission
            .admit_forwarded(snapshot, &original, &uri, peer);
        let served = match admitted.await {
            Ok(admitted) => {
                learnt(&mut entry.labels, admitted.learned());
                let mut response = Response::new(Body::full(Bytes::new()));
                admitted.answer(snapshot, &mut response);
                Ok(response)
            }
            Err(refused) => {
                learnt(&mut entry.labels, refused.learned());
                Err(refused.refusal)
            }
        };
        let outcome = served
            .as_ref()
            .err()
            .map_or(Outcome::Allowed, Refusal::outcome);
        let answer = Answer {
            version: original.version(),
            grpc: false,
        };
        let response = close(snapshot, &mut entry, served, answer, None, Browser::Unseen);
        (response, outcome)
    }

    /// The log entry of `request` from `peer`, with its request id (the decision
    /// listener's RLS calls are logged with one too).
    pub(crate) fn entry<'a, B>(
        &'a self,
        snapshot: &'a Arc<Snapshot>,
        request: &Request<B>,
        peer: std::net::IpAddr,
    ) -> Entry<'a, Snapshot> {
        let id_header = &snapshot.log().request_id_header;
        let request_id = crate::http::request_id::keep_or_new(request.headers().get(id_header));
        let now_ms = || self.clock().now_ms();
        Entry::open(
            &self.access_log,
            snapshot,
            snapshot.log().access,
            snapshot.log().refused,
            request,
            peer,
            request_id,
            now_ms,
        )
    }

    /// The request's story, as `DESIGN.md` tells it: admitted (or refused), answered
    /// by its route or its upstream, settled (a refund by status, the meter of its
    /// cost), and answered with its quota. A WebSocket the upstream accepted is left
    /// in `socket`, to start once its `101` is on its way.
    async fn serve(
        &self,
        snapshot: &Arc<Snapshot>,
        request: Box<Request<Incoming>>,
        conn: ConnInfo,
        grpc: bool,
        entry: &mut Entry<'_, Snapshot>,
        socket: &mut Option<socket::Opening>,
    ) -> Result<Response<Body>, Refusal> {
        // A gRPC call's deadline is read before anything is charged for it.
        let grpc = match grpc {
            true => Some(GrpcCall {
                timeout: crate::http::grpc::timeout(request.headers())?,
            }),
            false => None,
        };
        // The path borrows from this copy, not from the request moved upstream.
        let uri = request.uri().clone();
        let admitted = self
            .admission
            .admit(snapshot, &request, &uri, conn.peer.ip());
        let mut admitted = match admitted.await {
            Ok(admitted) => admitted,
            Err(refused) => {
                learnt(&mut entry.labels, refused.learned());
                return Err(refused.refusal);
            }
        };
        learnt(&mut entry.labels, admitted.learned());
        let mut answered = match &admitted.route.destination {
            Destination::Respond {
                status,
                body,
                content_type,
            } => Ok(respond(*status, body, content_type)),
            Destination::Upstream(upstream) => {
                let to = Forward {
                    upstream: *upstream,
                    uri: &uri,
                    conn,
                    grpc,
                };
                if socket::asked(admitted.route, &request) {
                    let opening =
                        Box::pin(self.open_socket(snapshot, request, to, &mut admitted, entry));
                    opening.await.map(|(response, opening)| {
                        *socket = opening;
                        response
                    })
                } else {
                    let fwd = Box::pin(self.forward(snapshot, request, to, &mut admitted, entry));
                    fwd.await
                }
            }
        };
        (self.admission)
            .settle(snapshot, &mut admitted, &mut answered)
            .await;
        let mut response = answered?;
        admitted.answer(snapshot, &mut response);
        Ok(response)
    }

    /// Sends the admitted request to its upstream: the request as the upstream gets
    /// it is proxy's to build; the time it took and who answered go to the entry.
    async fn forward(
        &self,
        snapshot: &Arc<Snapshot>,
        request: Box<Request<Incoming>>,
        to: Forward<'_>,
        admitted: &mut Admitted<'_>,
        entry: &mut Entry<'_, Snapshot>,
    ) -> Result<Response<Body>, Refusal> {
        let started = Stopwatch::start();
        // The permit stays with the upstream exchange: held while the upstream
        // works, even for a client that went away meanwhile.
        let carried = Carried {
            held: admitted
                .take_permit()
                .map(|permit| Box::new(permit) as Held),
            // A client gone before the answer is settled all the same.
            orphan: self.admission.orphan(snapshot, admitted),
        };
        let out = outgoing(snapshot, &to, admitted, entry.request_id());
        let limits = BodyLimits::of(&snapshot.server().live);
        let response = (snapshot.upstreams)
            .forward(to.upstream, request, &out, carried, limits, admitted.now_ms)
            .await;
        let secs = started.elapsed_secs();
        let route = Some(admitted.route.id);
        snapshot.route_metrics(route).upstream.observe(secs);
        entry.labels.upstream(secs, response.as_ref().ok());
        response
    }
}

/// Where an admitted request goes upstream, and what it came with.
struct Forward<'a> {
    upstream: UpstreamId,
    /// The request target as the client sent it (query, authority).
    uri: &'a Uri,
    /// The connection it came on (peer, scheme).
    conn: ConnInfo,
    /// A gRPC call, and its deadline.
    grpc: Option<GrpcCall>,
}

/// How the client is answered: in the HTTP version it spoke, and for a gRPC call in
/// gRPC's terms.
#[derive(Debug, Clone, Copy)]
struct Answer {
    version: Version,
    grpc: bool,
}

/// What the upstream request of `admitted`, going `to` its upstream, is built from.
fn outgoing<'a>(
    snapshot: &'a Snapshot,
    to: &Forward<'a>,
    admitted: &'a Admitted<'_>,
    request_id: &'a HeaderValue,
) -> Outgoing<'a> {
    let identifier = &snapshot.identifier;
    let peer = to.conn.peer.ip().to_canonical();
    let presented = admitted.presented;
    Outgoing {
        route: admitted.route,
        path: &admitted.path,
        uri: to.uri,
        origin: Origin {
            peer,
            proto: to.conn.scheme.as_str(),
            peer_trusted: identifier.is_trusted(peer),
        },
        key_header: presented.key_header.then(|| identifier.api_key_header()),
        authorization: presented.key_in_authorization,
        request_id: (&snapshot.log().request_id_header, request_id),
        grpc: to.grpc,
    }
}

/// A direct response: the route's own status, body and content type.
fn respond(status: StatusCode, body: &Bytes, content_type: &HeaderValue) -> Response<Body> {
    let mut response = Response::new(Body::full(body.clone()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, content_type.clone());
    response
}

/// What admission learnt of a request, into its log line and metric labels.
fn learnt(labels: &mut Labels, learned: Learned<'_>) {
    if let (Some(client), Some(path)) = (learned.client, learned.path) {
        labels.client_and_path(client, path);
    }
    if let Some(caller) = learned.caller {
        labels.caller(caller.plan, caller.consumer(), learned.named);
    }
    labels.route = learned.route;
    if !learned.would_refuse.is_empty() {
        labels.would_refuse(learned.would_refuse.iter().copied().collect());
    }
}

/// Readies `request` from `peer` for the rest of the path; returns the HTTP version
/// it came in, for its answer.
fn ready(snapshot: &Snapshot, request: &mut Request<Incoming>, peer: std::net::IpAddr) -> Version {
    // Before anything reads the request: only a trusted auth layer names callers.
    (snapshot.identifier).strip_untrusted(request.headers_mut(), peer);
    let version = request.version();
    // An HTTP/2 client's cookie crumbs are one `Cookie` header from here on, as the
    // HTTP/1.1 upstream will get them (a limit key reads that one header).
    if version == Version::HTTP_2 {
        crate::proxy::join_cookies(request.headers_mut());
    }
    version
}

/// The answer to a request that was `served` (or refused): counted, given the
/// client's HTTP version and the request id (a refused gRPC call its gRPC form),
/// and logged once it is sent (or, for a `101` that opened a `socket`, once the
/// socket closes).
fn close(
    snapshot: &Snapshot,
    entry: &mut Entry<'_, Snapshot>,
    served: Result<Response<Body>, Refusal>,
    answer: Answer,
    socket: Option<socket::Opening>,
    browser: Browser,
) -> Response<Body> {
    let Answer { version, grpc } = answer;
    let (mut response, outcome) = match served {
        Ok(response) => (response, Outcome::Allowed),
        Err(refusal) => {
            entry.refused(&refusal);
            let outcome = refusal.outcome();
            let response = match grpc {
                true => refusal.into_grpc_response(),
                false => refusal.into_response(),
            };
            (response, outcome)
        }
    };
    let labels = &entry.labels;
    let metrics = snapshot.route_metrics(labels.route);
    metrics.count(labels.plan.map(|p| usize::from(p.0)), outcome);
    metrics.respond(response.status());
    metrics.duration.observe(entry.elapsed_secs());
    // The client gets the version it spoke, whatever the upstream spoke.
    *response.version_mut() = version;
    let request_id = entry.request_id().clone();
    let id_header = &snapshot.log().request_id_header;
    response.headers_mut().insert(id_header.clone(), request_id);
    browser.answer(&mut response);
    match socket.filter(|socket| socket.opens(response.status())) {
        Some(socket) => {
            let line = entry.switched(&response);
            socket.start(&mut response, line);
        }
        None => {
            let grpc = match grpc {
                true => grpc_status(&mut response, &metrics.grpc),
                false => GrpcStatus::None,
            };
            entry.answered(&mut response, outcome, grpc);
        }
    }
    response
}

/// A gRPC call's status as the client gets it, counted in
/// `sluice_grpc_responses_total`: in the head of a trailers-only answer (sluice's
/// refusals among them), else in the trailers, counted when they have gone out.
fn grpc_status(response: &mut Response<Body>, counts: &Arc<GrpcCounts>) -> GrpcStatus {
    let status = response.headers().get(crate::http::grpc::STATUS);
    if let Some(code) = status.and_then(crate::http::grpc::code_of) {
        counts.count(code);
        return GrpcStatus::Known(code);
    }
    let counts = counts.clone();
    response.body_mut().on_end(move |end| {
        if let Some(code) = GrpcStatus::AtEnd.of(end) {
            counts.count(code);
        }
    });
    GrpcStatus::AtEnd
}
