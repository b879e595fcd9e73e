//! Accepting connections and speaking HTTP: the accept loop, per-connection limits
//! and timeouts, and graceful shutdown.
//!
//! hyper 1 through hyper-util's auto builder (HTTP/1.1, and HTTP/2 with prior
//! knowledge). One timer per connection keeps `header_timeout` (a request head is due
//! that long after the connection opened or its previous response ended) and
//! `idle_timeout`, checked against what the connection did meanwhile. At most
//! `max_connections` are served at once: the accept loop waits for a free slot,
//! leaving further clients in the kernel's backlog. A connection that moves no
//! bytes for `idle_timeout` is closed gracefully. A connection is served over any
//! `AsyncRead + AsyncWrite` stream ([`serve_connection`]), so a TLS stream plugs in
//! where a TCP one does, and each request reaches the [`Handler`] with the
//! connection's [`ConnInfo`]. The bytes an HTTP/1 connection reads also go past a
//! [`crate::http::wire::Scanner`], whose marks ride on the requests they concern. This
//! module knows nothing about routes or limits.
//!
//! - `accept`: the accept loop ([`serve`]), its connection slots and the drain.
//! - `tls_accept`: the TLS handshake within `header_timeout`, ALPN into [`ConnInfo`].
//! - `connection`: one connection's life ([`serve_connection`]): while busy, a
//!   supervisor with hyper, the stop and rapid-reset signals and the timer; while an
//!   HTTP/1 connection is idle, only its stream, its timer and the stop signal.
//! - `exchanges`: what a connection's requests report to it: handed over, answered,
//!   abandoned.
//! - `timers`: the time limits of one connection, kept by one timer.
//! - `tracked`: the stream a connection is served over: moved bytes, the HTTP/1
//!   head scanner, the GOAWAY(ENHANCE_YOUR_CALM) of a connection cut for a flood.
//! - `offenders`: addresses refused new connections after their connections were
//!   cut for floods.

mod accept;
pub(crate) mod conn;
mod connection;
mod exchanges;
mod offenders;
mod timers;
mod tls_accept;
mod tracked;
pub(crate) mod workers;

use std::future::Future;
use std::net::IpAddr;

use http::{Request, Response};
use hyper::body::Incoming;

use crate::http::body::Body;
use crate::http::refusal::Refusal;
use crate::server::conn::ConnInfo;

pub(crate) use accept::{Listening, serve};
pub(crate) use offenders::{Offenders, key as offender_key};

/// Something that answers requests: the gateway, or the admin API.
pub(crate) trait Handler: Send + Sync + 'static {
    /// Whether this listener's connections are in the open connections by
    /// protocol (`crate::observe::connections`): the gateway's are, the admin's and
    /// the decision listener's are not.
    const COUNTED: bool = false;

    /// Answers `request`, which came on `conn`. Boxed where it arrives: it is
    /// moved through several futures, 264 bytes a move by value.
    fn handle(
        &self,
        request: Box<Request<Incoming>>,
        conn: ConnInfo,
    ) -> impl Future<Output = Response<Body>> + Send;

    /// Answers `request` with `refusal`, which its connection decided (it is
    /// closing, or its client is blocked for a flood).
    fn refuse(
        &self,
        _request: Box<Request<Incoming>>,
        _conn: ConnInfo,
        refusal: Refusal,
    ) -> Response<Body> {
        refusal.into_response()
    }

    /// Whether a route opens WebSockets: HTTP/2 connections then advertise extended
    /// CONNECT (RFC 8441). Asked as each HTTP/2 connection starts.
    fn websockets(&self) -> bool {
        false
    }

    /// How floods on `peer`'s connections are remembered.
    fn flood_guard(&self, _peer: IpAddr) -> FloodGuard<'_> {
        FloodGuard::Off
    }

    /// The client a trusted proxy `peer` forwarded `request` for, keyed as in the
    /// offenders table.
    fn forwarded_client(&self, _request: &Request<Incoming>, _peer: IpAddr) -> Option<IpAddr> {
        None
    }
}

/// How floods on a peer's connections are remembered.
pub(crate) enum FloodGuard<'a> {
    /// They are not (a listener that keeps no table).
    Off,
    /// The peer's address, under this key, is refused new connections after a flood.
    Peer(&'a Offenders, IpAddr),
    /// A trusted proxy: its connections carry many clients, so its address is never
    /// refused; the forwarded client behind a flood is, request by request.
    Forwarded(&'a Offenders),
}
