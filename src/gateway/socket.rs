//! A WebSocket's life on the gateway's side: an admitted upgrade opens its socket
//! upstream ([`Gateway::open_socket`]); once the client's `101` is on its way, its
//! connection is taken over and the two sides joined ([`Opening::start`]) until the
//! socket closes, holding the request's concurrency permit (and `per_caller` slot)
//! and its connection's place under `max_connections` all the while; then the
//! socket's one access-log line is written.
//!
//! Whether the upgrade may happen is admission's (like any request), and so is
//! whether each client message may go on (a policy's `messages`, asked through the
//! relay's [`Gate`]); how bytes and frames pass is `proxy::tunnel`'s. Client
//! messages are counted in `sluice_ws_messages_total` as they pass.

use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode, Version};
use hyper::body::Incoming;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::sync::{oneshot, watch};

use super::{Forward, Gateway, outgoing};
use crate::admission::{Admitted, MessageLimit, MessageVerdict};
use crate::clock::Stopwatch;
use crate::concurrency::Permit;
use crate::config::route::Route;
use crate::http::body::Body;
use crate::http::refusal::Refusal;
use crate::http::upgrade::{self, Asks, Drained, Stream, TakeOver, TakenOver};
use crate::observe::access_log::{Entry, SocketLine, SocketRecord};
use crate::observe::metrics::sockets::RouteSockets;
use crate::proxy::tunnel::{Admit, Answered, Gate, Settings, Summary, Verdict, frames, relay};
use crate::snapshot::Snapshot;

/// Whether `request` opens a WebSocket on `route` (admission refused a malformed
/// upgrade already).
pub(super) fn asked(route: &Route, request: &Request<Incoming>) -> bool {
    route.websocket
        && matches!(
            upgrade::websocket(request),
            Ok(Asks::Upgrade | Asks::Connect)
        )
}

/// A socket the upstream accepted, waiting for its client's connection.
pub(super) struct Opening {
    /// The upstream's side.
    stream: Box<dyn Stream>,
    /// Bytes the upstream sent right after its `101`.
    upstream_ahead: Bytes,
    settings: Settings,
    /// The request's place under its policy's concurrency cap.
    permit: Option<Permit>,
    /// Where client messages are counted and, with a message limit, decided.
    gate: Messages,
    /// How the client's side arrives.
    client: Side,
}

/// How a socket's client side arrives once its answer is sent.
enum Side {
    /// An HTTP/1.1 connection, taken over after its `101` is written.
    Http1,
    /// An HTTP/2 stream, upgraded by hyper once its `200` is sent; and the
    /// listener's drain signal.
    Http2(OnUpgrade, Option<watch::Receiver<bool>>),
}

impl Gateway {
    /// Opens the socket the admitted upgrade `request` asks for upstream: the
    /// upstream's `101` for the client and the socket, or the upstream's other
    /// answer, or the refusal of an upstream that cannot be reached.
    pub(super) async fn open_socket(
        &self,
        snapshot: &Arc<Snapshot>,
        mut request: Box<Request<Incoming>>,
        to: Forward<'_>,
        admitted: &mut Admitted<'_>,
        entry: &mut Entry<'_, Snapshot>,
    ) -> Result<(Response<Body>, Option<Opening>), Refusal> {
        let client = match request.version() {
            Version::HTTP_2 => {
                let drained = request.extensions_mut().remove::<Drained>();
                let upgrade = hyper::upgrade::on(&mut *request);
                Side::Http2(upgrade, drained.map(|d| d.0))
            }
            _ => Side::Http1,
        };
        let started = Stopwatch::start();
        let out = outgoing(snapshot, &to, admitted, entry.request_id());
        let answered = (snapshot.upstreams)
            .open_socket(to.upstream, *request, &out, admitted.now_ms)
            .await;
        let secs = started.elapsed_secs();
        let route = Some(admitted.route.id);
        snapshot.route_metrics(route).upstream.observe(secs);
        let opened = match answered {
            Err(err) => {
                entry.labels.upstream(secs, None);
                return Err(Refusal::from(err));
            }
            Ok(Answered::Refused(response)) => {
                entry.labels.upstream(secs, Some(&response));
                return Ok((response, None));
            }
            Ok(Answered::Opened(opened)) => opened,
        };
        entry.labels.upstream(secs, Some(&opened.response));
        let live = &snapshot.server().live;
        let opening = Opening {
            stream: opened.stream,
            upstream_ahead: opened.read_ahead,
            settings: Settings {
                idle: live.tunnel_idle_timeout,
                max_message: live.max_body_bytes,
                extensions: opened.extensions,
            },
            permit: admitted.take_permit(),
            gate: Messages {
                metrics: self.metrics().sockets.route(&admitted.route.name),
                limit: (self.admission().message_limit(snapshot, admitted)).map(Arc::new),
            },
            client,
        };
        Ok((opened.response, Some(opening)))
    }
}

impl Opening {
    /// Whether `status`, the answer the client gets, opens the socket: `101` on
    /// HTTP/1.1, `200` to an HTTP/2 extended CONNECT.
    pub(super) fn opens(&self, status: StatusCode) -> bool {
        match self.client {
            Side::Http1 => status == StatusCode::SWITCHING_PROTOCOLS,
            Side::Http2(..) => status == StatusCode::OK,
        }
    }

    /// The socket is answered with `response`: its client side arrives once it is
    /// sent (an HTTP/1.1 connection taken over, an HTTP/2 stream upgraded), and the
    /// socket runs on a task of its own until it closes; then `line` is written.
    pub(super) fn start(mut self, response: &mut Response<Body>, line: Option<SocketLine>) {
        let client = match std::mem::replace(&mut self.client, Side::Http1) {
            Side::Http1 => {
                let (take_over, taken) = TakeOver::new();
                response.extensions_mut().insert(take_over);
                Client::Http1(taken)
            }
            Side::Http2(upgrade, drained) => Client::Http2(upgrade, drained),
        };
        self.gate.metrics.open.inc();
        tokio::spawn(self.run(client, line));
    }

    async fn run(self, client: Client, line: Option<SocketLine>) {
        let Opening {
            stream,
            upstream_ahead,
            settings,
            permit,
            gate,
            client: _,
        } = self;
        let metrics = gate.metrics.clone();
        let gate = Some(Box::new(gate) as Box<dyn Gate>);
        let summary = match client {
            Client::Http1(taken) => match taken.await {
                Ok(client) => {
                    let drained = drained(Some(client.drained));
                    let (from, ahead) = (client.stream, client.read_ahead);
                    let ahead = (ahead, upstream_ahead);
                    let summary = relay(from, stream, ahead, settings, gate, drained).await;
                    drop(client.hold);
                    summary
                }
                // The client's connection ended before its 101 went out.
                Err(_) => unopened(),
            },
            Client::Http2(upgrade, watch) => match upgrade.await {
                Ok(upgraded) => {
                    let from: Box<dyn Stream> = Box::new(TokioIo::new(upgraded));
                    let drained = drained(watch);
                    let ahead = (Bytes::new(), upstream_ahead);
                    relay(from, stream, ahead, settings, gate, drained).await
                }
                // The stream was reset before its 200 went out.
                Err(_) => unopened(),
            },
        };
        drop(permit);
        metrics.open.dec();
        if let Some(line) = line {
            line.close(SocketRecord {
                bytes_up: summary.bytes_up,
                bytes_down: summary.bytes_down,
                messages_up: summary.messages_up,
                messages_down: summary.messages_down,
                messages_limited: summary.limited,
                close_code: summary.close_code,
            });
        }
    }
}

/// A socket's client messages: counted as they pass, and decided by the caller's
/// message limit if it has one. Each message is counted under one outcome.
struct Messages {
    metrics: RouteSockets,
    limit: Option<Arc<MessageLimit>>,
}

impl Gate for Messages {
    /// Decided at once without a limit or with one in memory (no future boxed for
    /// each message); a Redis store's answer is waited for.
    fn admit(&mut self) -> Admit {
        let Some(limit) = &self.limit else {
            self.metrics.forwarded.inc();
            return Admit::Now(Verdict::Pass);
        };
        if let Some(verdict) = limit.decide_now() {
            return Admit::Now(counted(&self.metrics, verdict));
        }
        let (limit, metrics) = (limit.clone(), self.metrics.clone());
        let answer = async move { counted(&metrics, limit.decide().await) };
        Admit::Later(Box::pin(answer))
    }
}

/// Counts a message under the outcome `verdict` in `metrics`; what the relay does
/// with it.
fn counted(metrics: &RouteSockets, verdict: MessageVerdict) -> Verdict {
    let (counter, verdict) = match verdict {
        MessageVerdict::Pass => (&metrics.forwarded, Verdict::Pass),
        MessageVerdict::WouldLimit => (&metrics.would_limit, Verdict::Pass),
        MessageVerdict::Limited(secs) => (&metrics.limited, Verdict::Limited(secs)),
        MessageVerdict::Unavailable => (&metrics.unavailable, Verdict::Unavailable),
    };
    counter.inc();
    verdict
}

/// Where a started socket's client side comes from.
enum Client {
    Http1(oneshot::Receiver<TakenOver>),
    Http2(OnUpgrade, Option<watch::Receiver<bool>>),
}

/// The summary of a socket whose client went away before it opened.
fn unopened() -> Summary {
    Summary {
        close_code: frames::code::ABNORMAL,
        ..Summary::default()
    }
}

/// Completes once the listener's drain is over (never, if the listener is gone
/// without saying so, or there is none).
async fn drained(drained: Option<watch::Receiver<bool>>) {
    let Some(mut drained) = drained else {
        return std::future::pending().await;
    };
    while !*drained.borrow_and_update() {
        if drained.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
