//! The gateway as the server sees it ([`Handler`]): requests to serve or refuse,
//! whether WebSockets are on, and the key under which a peer's flood is remembered
//! (the peer, or the client a trusted proxy forwarded).
//!
//! It does not accept connections or time them: `server` does.

use http::{Request, Response};
use hyper::body::Incoming;

use super::Gateway;
use crate::http::body::Body;
use crate::http::refusal::Refusal;
use crate::server::conn::ConnInfo;
use crate::server::{FloodGuard, Handler};

impl Handler for Gateway {
    const COUNTED: bool = true;

    fn handle(
        &self,
        request: Box<Request<Incoming>>,
        conn: ConnInfo,
    ) -> impl Future<Output = Response<Body>> + Send {
        Gateway::handle(self, request, conn)
    }

    fn refuse(
        &self,
        request: Box<Request<Incoming>>,
        conn: ConnInfo,
        refusal: Refusal,
    ) -> Response<Body> {
        Gateway::refuse(self, request, conn, refusal)
    }

    /// Whether the config now in force has a `websocket = true` route.
    fn websockets(&self) -> bool {
        self.snapshot.load().routes.any_websocket()
    }

    /// Every peer but a trusted proxy, IPv6 per `ipv6_prefix`; behind a trusted
    /// proxy, the forwarded client. An `[access] exempt` address is never blocked
    /// (its flooding connection is still cut): exemption is the operator's word
    /// that the address is their own (a health checker, an internal job).
    fn flood_guard(&self, peer: std::net::IpAddr) -> FloodGuard<'_> {
        let snapshot = self.snapshot.load();
        let identifier = &snapshot.identifier;
        if identifier.is_trusted(peer.to_canonical()) {
            return FloodGuard::Forwarded(&self.offenders);
        }
        if snapshot.exempt(peer.to_canonical()) {
            return FloodGuard::Off;
        }
        let key = crate::server::offender_key(peer, identifier.ipv6_prefix());
        FloodGuard::Peer(&self.offenders, key)
    }

    /// The client `X-Forwarded-For` or `Forwarded` names, as admission reads it.
    fn forwarded_client(
        &self,
        request: &Request<Incoming>,
        peer: std::net::IpAddr,
    ) -> Option<std::net::IpAddr> {
        let snapshot = self.snapshot.load();
        let identifier = &snapshot.identifier;
        let client = identifier.client_ip(request.headers(), peer);
        if snapshot.exempt(client) {
            return None;
        }
        Some(crate::server::offender_key(
            client,
            identifier.ipv6_prefix(),
        ))
    }
}
