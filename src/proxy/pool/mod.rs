//! Connections to one upstream target: keep-alive HTTP/1.1 connections, one request
//! at a time each, or HTTP/2 connections that multiplex them ([`h2`]).
//!
//! A connection is taken from the pool for one exchange and comes back when the
//! response body has been read to its end (the body's `Lease` hands it back as the
//! body is dropped), so a pooled connection is always idle and ready for the next
//! request.
//! A connection idle for longer than [`IDLE_FOR`], or closed by the upstream, is
//! dropped instead of reused. A request that could not be written on a pooled
//! connection (the upstream closed it at that moment) is sent once more on a new one.
//!
//! A request whose client goes away while the upstream is still working on it (an
//! HTTP/2 `RST_STREAM`, a closed connection) does not throw its connection away:
//! the exchange is finished in the background ([`InFlight`]) and the connection
//! comes back to the pool if the response arrives within the upstream's `timeout`
//! and its body is at most [`DRAIN_AT_MOST`]. So abandoned requests do not make
//! sluice open a new upstream connection for each one; nor does a request abandoned
//! while its connection was being made ([`Pool::connect_kept`]). What the request holds for
//! as long as the upstream works on it (its concurrency permit) is held by that
//! background exchange until it ends, so the upstream never has more requests at
//! once than the cap allows, abandoned ones included. A request whose answer must
//! still be settled (its cost, a refund) carries an [`Orphan`]: the background
//! exchange tells it the answer (or why there is none) once the head arrives, and
//! reads the body on for it; over HTTP/2 such an exchange is finished the same way
//! rather than reset.
//!
//! Built on hyper's connection-level client: no connector layers, no executor
//! hand-off and no per-request boxing between the gateway and the socket.
//!
//! Pools belong to [`Pools`], not to a config snapshot: a reload keeps the pools (and
//! their idle keep-alive connections) of every target that still exists and drops the
//! others. How a pool reaches its target is [`Pool::connect`]'s one `match` on the
//! target's scheme: plain TCP for `http://`; `https://` (TLS) fits beside it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;

use bytes::Bytes;
use http::Uri;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio_rustls::TlsConnector;

use crate::config::{UpstreamConfig, UpstreamProtocol};
use crate::http::body::{Body, Upstream};

/// Idle connections are kept this long (nginx keepalive_timeout: 60 s).
pub(crate) const IDLE_FOR: Duration = Duration::from_secs(60);
/// Idle connections kept per target at most; more are closed when they come back.
pub(crate) const MAX_IDLE: usize = 512;
/// The most response body read for a client that went away, to keep its connection.
pub(crate) const DRAIN_AT_MOST: usize = 64 * 1024;

/// Why an exchange failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Failure {
    /// No connection could be made: the target is down or refuses.
    #[error("connect: {0}")]
    Connect(std::io::Error),
    /// The connection failed while sending or before the response head.
    #[error("{0}")]
    Exchange(hyper::Error),
    /// The client's body was cut by a limit while it went to an HTTP/2 target.
    #[error("{0}")]
    ClientBody(super::request_body::Cut),
    /// A gRPC call for a target that speaks HTTP/1.1: not sent.
    #[error("a gRPC call needs an HTTP/2 upstream")]
    NeedsH2,
    /// No response head by the exchange's deadline (the upstream's `timeout`).
    #[error("no response within the upstream's timeout")]
    Deadline,
}

mod connect;
mod h2;
mod in_flight;
mod replay;

pub(crate) use super::request_body::RequestBody;
use in_flight::InFlight;

/// What a request holds while the upstream works on it and its response streams
/// (a concurrency permit), released when both are over.
pub(crate) type Held = Box<dyn Send>;

/// Told the answer of an exchange whose client went away before the response head,
/// with the pool of the target it went to: the response (its body not read yet), or
/// why there is none. What it hands back is read on, off the request's path, until
/// its end or the bounds of [`in_flight`]; a body it watches is read on for its
/// watch as [`Body`] does.
pub(crate) type Orphan =
    Box<dyn FnOnce(&Pool, Result<Response<Body>, Failure>) -> Option<Response<Body>> + Send>;

/// What an exchange carries for its request while the upstream works on it, whether
/// or not the client is still there.
#[derive(Default)]
pub(crate) struct Riders {
    /// Released once the upstream has answered and the body is done with.
    pub held: Option<Held>,
    /// Told the answer if the client goes away before the response head.
    pub orphan: Option<Orphan>,
}

struct Idle {
    sender: SendRequest<RequestBody>,
    since: Instant,
}

/// How a pool's connections reach their target.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Transport {
    /// `http://`: plain TCP.
    Plain,
    /// `https://`: TLS, trusting the system's roots or the CA bundle at this path.
    Tls { ca_file: Option<PathBuf> },
}

/// What a pool's target speaks: known from `protocol`, or learnt from ALPN.
const SPEAKS_UNKNOWN: u8 = 0;
const SPEAKS_H1: u8 = 1;
const SPEAKS_H2: u8 = 2;

/// The pool of one target.
pub(crate) struct Pool {
    /// `host:port` to connect to.
    address: Arc<str>,
    transport: Transport,
    protocol: UpstreamProtocol,
    /// `SPEAKS_*`: HTTP/1.1, HTTP/2, or not known yet (`auto` before the first
    /// connection's ALPN).
    speaks: std::sync::atomic::AtomicU8,
    /// For https: the HTTP/1.1 connector, the one offering `h2` by ALPN, and the
    /// name the certificate must carry (SNI).
    tls: Option<(TlsConnector, TlsConnector, ServerName<'static>)>,
    idle: Mutex<Vec<Idle>>,
    /// HTTP/2: each worker thread's connection.
    h2: Mutex<Vec<h2::Multiplexed>>,
    /// HTTP/2: held while a connection is being made, so that a burst of requests
    /// makes one.
    connecting: tokio::sync::Mutex<()>,
    /// Until this wall-clock ms the target is skipped (it refused a connection).
    down_until_ms: AtomicU64,
}

/// Every target's pool, kept across config snapshots.
#[derive(Debug, Default)]
pub(crate) struct Pools {
    by_target: Mutex<HashMap<(Transport, String, UpstreamProtocol), Arc<Pool>>>,
}

impl Pools {
    /// The pools of `targets` (each list an upstream's), reusing the pool of every
    /// target already known; pools of targets no longer listed are dropped here (an
    /// old snapshot still serving keeps its own until it is done).
    pub(crate) fn resolve<'a>(
        &self,
        upstreams: impl IntoIterator<Item = &'a UpstreamConfig>,
    ) -> Vec<Vec<Arc<Pool>>> {
        let mut by_target = self.by_target.lock().unwrap_or_else(|e| e.into_inner());
        let mut kept = HashMap::with_capacity(by_target.len());
        let resolved = upstreams
            .into_iter()
            .map(|upstream| {
                upstream
                    .targets
                    .iter()
                    .map(|uri| {
                        let transport = match uri.scheme_str() {
                            Some("https") => Transport::Tls {
                                ca_file: upstream.ca_file.clone(),
                            },
                            _ => Transport::Plain,
                        };
                        let key = (transport, address_of(uri), upstream.protocol);
                        let pool = by_target.get(&key).cloned().unwrap_or_else(|| {
                            Pool::new(key.1.clone(), key.0.clone(), upstream.protocol)
                        });
                        kept.insert(key, pool.clone());
                        pool
                    })
                    .collect()
            })
            .collect();
        *by_target = kept;
        resolved
    }
}

/// `host:port` of a target, with the scheme's default port.
fn address_of(uri: &Uri) -> String {
    let authority = uri.authority().map_or("", |a| a.as_str());
    match (uri.port_u16(), uri.scheme_str()) {
        (Some(_), _) => authority.to_string(),
        (None, Some("https")) => format!("{authority}:443"),
        (None, _) => format!("{authority}:80"),
    }
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("address", &self.address)
            .field("transport", &self.transport)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Idle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idle").field("since", &self.since).finish()
    }
}

impl Pool {
    pub(crate) fn new(
        address: String,
        transport: Transport,
        protocol: UpstreamProtocol,
    ) -> Arc<Pool> {
        let tls = match &transport {
            Transport::Plain => None,
            Transport::Tls { ca_file } => {
                let host = address
                    .rsplit_once(':')
                    .map_or(address.as_str(), |(host, _)| host)
                    .trim_start_matches('[')
                    .trim_end_matches(']');
                let offered: &[&[u8]] = match protocol {
                    UpstreamProtocol::Auto => &[b"h2", b"http/1.1"],
                    _ => &[b"h2"],
                };
                let connector = |alpn| crate::tls::upstream::connector(ca_file.as_deref(), alpn);
                ServerName::try_from(host.to_string())
                    .ok()
                    .map(|name| (connector(&[b"http/1.1"]), connector(offered), name))
            }
        };
        let speaks = match (protocol, &transport) {
            (UpstreamProtocol::Http1, _) | (UpstreamProtocol::Auto, Transport::Plain) => SPEAKS_H1,
            (UpstreamProtocol::H2, _) => SPEAKS_H2,
            (UpstreamProtocol::Auto, Transport::Tls { .. }) => SPEAKS_UNKNOWN,
        };
        Arc::new(Pool {
            address: Arc::from(address),
            transport,
            protocol,
            speaks: std::sync::atomic::AtomicU8::new(speaks),
            tls,
            idle: Mutex::new(Vec::new()),
            h2: Mutex::new(Vec::new()),
            connecting: tokio::sync::Mutex::new(()),
            down_until_ms: AtomicU64::new(0),
        })
    }

    /// Whether the target may be tried at `now_ms`.
    pub(crate) fn is_up(&self, now_ms: u64) -> bool {
        self.down_until_ms.load(Ordering::Relaxed) <= now_ms
    }

    /// Skips the target until `until_ms`.
    pub(crate) fn mark_down(&self, until_ms: u64) {
        self.down_until_ms.store(until_ms, Ordering::Relaxed);
    }

    /// The `host:port` connected to.
    pub(crate) fn address(&self) -> &str {
        &self.address
    }

    /// The `host:port` connected to, shared (the access log keeps a reference).
    pub(crate) fn origin(&self) -> &Arc<str> {
        &self.address
    }

    /// Whether requests to the target may travel as HTTP/2 (a gRPC call needs it):
    /// `protocol = "h2"`, or `"auto"` on `https://` while ALPN has not said
    /// HTTP/1.1.
    pub(crate) fn may_speak_h2(&self) -> bool {
        self.speaks.load(Ordering::Relaxed) != SPEAKS_H1
    }

    /// Sends `request` (origin-form URI) and returns the response head; the body
    /// streams from the connection, which returns to the pool at the body's end. A
    /// new connection must be made within `connect_timeout`; if this future is
    /// dropped while the upstream works, the exchange is finished in the background
    /// until `deadline` at most, with its `riders` (see the module's documentation);
    /// what they hold otherwise rides on the response body.
    ///
    /// `request` and `riders` are taken only once the request is being sent: after a
    /// [`Failure::Connect`] they are still there, unsent, for another target.
    #[inline]
    pub(crate) async fn send(
        self: &Arc<Pool>,
        slot: &mut Option<Request<RequestBody>>,
        riders: &mut Riders,
        connect_timeout: Duration,
        deadline: Instant,
    ) -> Result<Response<Body>, Failure> {
        if self.speaks.load(Ordering::Relaxed) != SPEAKS_H1 {
            let sent = Box::pin(self.send_h2(slot, riders, connect_timeout, deadline));
            return sent.await;
        }
        self.send_h1(slot, riders, connect_timeout, deadline).await
    }

    /// [`Pool::send`] over HTTP/1.1.
    async fn send_h1(
        self: &Arc<Pool>,
        slot: &mut Option<Request<RequestBody>>,
        riders: &mut Riders,
        connect_timeout: Duration,
        deadline: Instant,
    ) -> Result<Response<Body>, Failure> {
        let mut request = slot.take().expect("a request to send");
        if let Some(mut sender) = self.take() {
            // The previous exchange has ended; the connection may still be finishing
            // it. If it closes instead, the request is not written and comes back.
            let _ = sender.ready().await;
            let exchange = sender.try_send_request(request);
            let conn = in_flight::Conn::H1(sender);
            match InFlight::new(exchange, conn, std::mem::take(riders), self, deadline).await {
                Ok(response) => return Ok(response),
                Err(failed) => {
                    let (mut err, kept) = *failed;
                    match err.take_message() {
                        // Not written: the pooled connection was closing. Try a new one.
                        Some(unsent) => (request, *riders) = (unsent, kept),
                        None => return Err(Failure::Exchange(err.into_error())),
                    }
                }
            }
        }
        let mut sender = match self.connect_kept(connect_timeout).await {
            Ok(sender) => sender,
            Err(failure) => {
                *slot = Some(request);
                return Err(failure);
            }
        };
        let exchange = sender.send_request(request);
        let conn = in_flight::Conn::H1(sender);
        InFlight::new(exchange, conn, std::mem::take(riders), self, deadline)
            .await
            .map_err(|failed| Failure::Exchange(failed.0))
    }

    /// A pooled connection that is open and not idle for too long.
    fn take(&self) -> Option<SendRequest<RequestBody>> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(Idle { sender, since }) = idle.pop() {
            if !sender.is_closed() && since.elapsed() < IDLE_FOR {
                return Some(sender);
            }
        }
        None
    }

    fn give_back(&self, sender: SendRequest<RequestBody>) {
        if sender.is_closed() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push(Idle {
                sender,
                since: Instant::now(),
            });
        }
    }

    fn attach(
        self: &Arc<Pool>,
        response: Response<Incoming>,
        sender: SendRequest<RequestBody>,
        held: Option<Held>,
    ) -> Response<Body> {
        response.map(|body| {
            let lease = Lease {
                sender: Some(sender),
                pool: self.clone(),
                _held: held,
            };
            // Boxed here rather than by the caller: the response is moved up
            // through the exchange's futures, cheaper with a pointer for its body.
            Body::upstream(body, lease)
        })
    }
}

/// The connection an upstream response body is read from, lent by its pool until
/// the body is done with: it goes back to the pool if the body was read to its end,
/// and is closed if the body was dropped before that.
struct Lease {
    /// Until it goes back to `pool` (or is closed with the lease).
    sender: Option<SendRequest<RequestBody>>,
    /// The pool of the target the body comes from.
    pool: Arc<Pool>,
    /// Released with the body.
    _held: Option<Held>,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("pool", &self.pool)
            .finish_non_exhaustive()
    }
}

impl Upstream for Lease {
    fn origin(&self) -> Option<&Arc<str>> {
        Some(&self.pool.address)
    }

    fn release(&mut self, ended: bool) {
        if let Some(sender) = self.sender.take()
            && ended
        {
            self.pool.give_back(sender);
        }
    }
}
