//! WebSocket upgrades as sluice reads them: which requests ask for one
//! ([`websocket`]), and how an HTTP/1.1 connection is given over to the socket once
//! its `101` is written ([`TakeOver`]).
//!
//! hyper serves sluice's HTTP/1 connections with its low-level API (a connection's
//! state is handed back while it is idle), which leaves upgrades to the caller: the
//! gateway puts a [`TakeOver`] on the `101` it answers, and the connection, once
//! hyper has written it, gives its stream (and the bytes hyper read past the head)
//! to it. An HTTP/2 socket (extended CONNECT, RFC 8441) stays on its stream: hyper
//! gives it over as an upgrade once the `200` is sent, and its connection puts
//! [`Drained`] on the request for it. This module decides nothing about routes or
//! limits.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::header::{CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING, UPGRADE};
use http::{HeaderMap, Method, Request, Version};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{oneshot, watch};

use crate::http::refusal::Refusal;

/// A byte stream a socket runs over: a client's connection, an upstream's.
pub(crate) trait Stream: AsyncRead + AsyncWrite + Send + Unpin {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin> Stream for T {}

/// What a request asks for, on a route that accepts WebSockets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Asks {
    /// A plain request (an `Upgrade` to anything else is removed as hop-by-hop).
    Plain,
    /// An HTTP/1.1 WebSocket upgrade.
    Upgrade,
    /// An HTTP/2 extended CONNECT with `:protocol = websocket` (RFC 8441).
    Connect,
}

/// What `request` asks for; a WebSocket upgrade that two parsers could read
/// differently (a body, another method) is refused, and so is an HTTP/2 CONNECT
/// that is not an extended CONNECT for `websocket` (sluice opens no other tunnel).
pub(crate) fn websocket<B>(request: &Request<B>) -> Result<Asks, Refusal> {
    if request.version() == Version::HTTP_2 {
        if request.method() != Method::CONNECT {
            return Ok(Asks::Plain);
        }
        return match request.extensions().get::<hyper::ext::Protocol>() {
            Some(protocol) if protocol.as_str().eq_ignore_ascii_case("websocket") => {
                Ok(Asks::Connect)
            }
            Some(_) => Err(Refusal::Malformed(
                "an extended CONNECT for a protocol other than websocket",
            )),
            None => Err(Refusal::Malformed(
                "a CONNECT without :protocol (sluice opens no tunnels)",
            )),
        };
    }
    let headers = request.headers();
    if request.version() != Version::HTTP_11 || !has_token(headers, UPGRADE, "websocket") {
        return Ok(Asks::Plain);
    }
    if !has_token(headers, CONNECTION, "upgrade") {
        // Not an upgrade (RFC 9110, 7.8): `Upgrade` goes as a hop-by-hop header.
        return Ok(Asks::Plain);
    }
    if request.method() != Method::GET {
        return Err(Refusal::Malformed("a WebSocket upgrade is a GET"));
    }
    if headers.contains_key(CONTENT_LENGTH) || headers.contains_key(TRANSFER_ENCODING) {
        return Err(Refusal::Malformed("a WebSocket upgrade carries no body"));
    }
    Ok(Asks::Upgrade)
}

/// What the admission of `request` on a route that does (`websocket`) or does not
/// accept WebSockets says of its upgrade: `Ok` to go on, else its refusal. On a route
/// without `websocket = true` an HTTP/1.1 `Upgrade` is a plain request's
/// hop-by-hop header, but an HTTP/2 CONNECT has no plain form: it is refused.
pub(crate) fn admissible<B>(request: &Request<B>, websocket_route: bool) -> Result<(), Refusal> {
    if websocket_route {
        return websocket(request).map(|_| ());
    }
    match request.version() == Version::HTTP_2 && request.method() == Method::CONNECT {
        true => Err(Refusal::Malformed(
            "a CONNECT on a route without websocket = true",
        )),
        false => Ok(()),
    }
}

/// The method `request` matches routes with: an HTTP/2 extended CONNECT opens a
/// WebSocket, as an HTTP/1.1 `GET` does.
pub(crate) fn route_method<B>(request: &Request<B>) -> &Method {
    match request.extensions().get::<hyper::ext::Protocol>() {
        Some(_) if request.method() == Method::CONNECT => &Method::GET,
        _ => request.method(),
    }
}

/// What an HTTP/2 extended CONNECT brings to its socket from its connection: the
/// signal that the listener's drain is over (the socket then closes, 1001).
#[derive(Debug, Clone)]
pub(crate) struct Drained(pub watch::Receiver<bool>);

/// Whether a `name` header lists `token` (any case).
fn has_token(headers: &HeaderMap, name: http::HeaderName, token: &str) -> bool {
    headers.get_all(name).iter().any(|value| {
        value
            .as_bytes()
            .split(|&b| b == b',')
            .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
    })
}

/// A client connection given over to its socket after the `101`.
pub(crate) struct TakenOver {
    /// The connection's stream.
    pub stream: Box<dyn Stream>,
    /// Bytes read from it past the upgrade's head.
    pub read_ahead: Bytes,
    /// What the connection held (its place under `max_connections`): the socket
    /// holds it now.
    pub hold: Box<dyn Send>,
    /// Changes when the listener's drain is over: the socket then closes (1001).
    pub drained: watch::Receiver<bool>,
}

/// Where an HTTP/1.1 connection goes once the `101` it carries is written: put on
/// the response by the gateway, taken off by the connection.
#[derive(Clone)]
pub(crate) struct TakeOver(Arc<Mutex<Option<oneshot::Sender<TakenOver>>>>);

impl TakeOver {
    /// A take-over and the receiver its connection arrives on.
    pub(crate) fn new() -> (TakeOver, oneshot::Receiver<TakenOver>) {
        let (sender, receiver) = oneshot::channel();
        (TakeOver(Arc::new(Mutex::new(Some(sender)))), receiver)
    }

    /// Gives the connection over; dropped (and closed) if the socket is gone.
    pub(crate) fn give(&self, taken: TakenOver) {
        let sender = self.0.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(sender) = sender {
            let _ = sender.send(taken);
        }
    }
}

impl std::fmt::Debug for TakeOver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TakeOver").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asks(method: &str, headers: &[(&str, &str)]) -> Result<Asks, Refusal> {
        let mut request = Request::builder().method(method).uri("/ws");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        websocket(&request.body(()).unwrap())
    }

    #[test]
    fn an_upgrade_names_websocket_and_is_listed_in_connection() {
        let firefox = [
            ("connection", "keep-alive, Upgrade"),
            ("upgrade", "websocket"),
        ];
        assert_eq!(asks("GET", &firefox).unwrap(), Asks::Upgrade);
        let plain = [("connection", "keep-alive"), ("upgrade", "websocket")];
        assert_eq!(asks("GET", &plain).unwrap(), Asks::Plain);
        let h2c = [("connection", "upgrade"), ("upgrade", "h2c")];
        assert_eq!(asks("GET", &h2c).unwrap(), Asks::Plain);
    }

    #[test]
    fn an_upgrade_with_a_body_or_another_method_is_refused() {
        let upgrade = [("connection", "upgrade"), ("upgrade", "WebSocket")];
        assert!(asks("POST", &upgrade).is_err());
        let with = |extra: (&'static str, &'static str)| [upgrade[0], upgrade[1], extra];
        assert!(asks("GET", &with(("content-length", "5"))).is_err());
        assert!(asks("GET", &with(("transfer-encoding", "chunked"))).is_err());
    }
}
