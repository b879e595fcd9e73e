//! WebSockets upstream: an admitted upgrade goes to the upstream as an HTTP/1.1
//! upgrade on a connection of its own (never pooled, never reused), and on the
//! upstream's `101` the two sides are joined ([`relay`]) until either closes.
//!
//! [`Upstreams::open_socket`] sends the upgrade and reads the answer: a `101` that
//! switches to `websocket` is an [`Opened`] socket (its headers for the client's
//! `101`, the negotiated extensions, the stream); any other answer goes to the client
//! like a plain response. An HTTP/2 client's extended CONNECT (RFC 8441) goes upstream
//! as the same HTTP/1.1 upgrade (a `GET` with a `Sec-WebSocket-Key` sluice makes),
//! and the upstream's `101` comes back to it as a `200` without the handshake's
//! HTTP/1.1 headers. The frames are read by [`frames`] as the relay passes
//! them on. This module does not decide whether a socket may open or a message may
//! pass (admission does, through the relay's [`Gate`]).

pub(crate) mod frames;
mod relay;

use std::time::Duration;

use bytes::Bytes;
use http::header::{
    CONNECTION, HOST, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_EXTENSIONS, SEC_WEBSOCKET_KEY, UPGRADE,
};
use http::{HeaderValue, Method, Request, Response, StatusCode, Version};
use http_body_util::Empty;
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;

use super::pool::{Failure, Pool};
use super::{ProxyError, Target, Upstream, Upstreams, request, strip_hop_by_hop};
use crate::config::UpstreamId;
use crate::http::body::Body;
use crate::http::upgrade::Stream;
pub(crate) use frames::Extensions;
pub(crate) use relay::{Admit, Gate, Settings, Summary, Verdict, relay};

/// A socket the upstream accepted.
pub(crate) struct Opened {
    /// The upstream's `101` (hop-by-hop headers out, the upgrade's back in): what
    /// the client's `101` carries.
    pub response: Response<Body>,
    /// What the `101` negotiated.
    pub extensions: Extensions,
    /// The upstream's side of the socket.
    pub stream: Box<dyn Stream>,
    /// Bytes the upstream sent right after its `101`.
    pub read_ahead: Bytes,
}

/// What opening a socket came to: the socket, or the upstream's answer that is not
/// a switch (its `400`, `403`, `426` ...), which the client gets as it is.
pub(crate) enum Answered {
    Opened(Opened),
    Refused(Response<Body>),
}

impl Upstreams {
    /// Sends the WebSocket upgrade `request` to upstream `id`, rewritten as `out`
    /// says, on a new connection; the upstream's answer within its `timeout`.
    pub(crate) async fn open_socket(
        &self,
        id: UpstreamId,
        mut request: Request<Incoming>,
        out: &request::Outgoing<'_>,
        now_ms: u64,
    ) -> Result<Answered, ProxyError> {
        let upstream = &self.list[id.index()];
        let path_and_query = request::prepare(&mut request, out);
        let target = upstream.pick(now_ms);
        let bad_uri = || ProxyError::BadUri {
            upstream: upstream.name.clone(),
            target: target.pool.address().to_string(),
        };
        let uri =
            request::upstream_uri(&target.base, path_and_query.as_ref()).ok_or_else(bad_uri)?;
        let (mut parts, _) = request.into_parts();
        let over_h2 = parts.version == Version::HTTP_2;
        parts.uri = uri;
        parts.version = Version::HTTP_11;
        let headers = &mut parts.headers;
        if over_h2 {
            // RFC 8441, 5: the CONNECT carries no key and expects no accept; the
            // upstream's handshake needs one.
            parts.method = Method::GET;
            headers.insert(SEC_WEBSOCKET_KEY, new_key());
        }
        let accept = headers.get(SEC_WEBSOCKET_KEY).map(accept_of);
        if !headers.contains_key(HOST) {
            headers.insert(HOST, target.authority.clone());
        }
        headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(UPGRADE, HeaderValue::from_static("websocket"));
        let request = Request::from_parts(parts, Empty::<Bytes>::new());
        let deadline = tokio::time::Instant::now() + upstream.timeout;
        let exchange = upgrade(&target.pool, request, upstream.connect_timeout);
        let answered = match tokio::time::timeout_at(deadline, exchange).await {
            Ok(Ok(answered)) => upstream.switched(target, answered, accept),
            Ok(Err(failure)) => Err(upstream.failed(target, failure, now_ms)),
            Err(_) => Err(ProxyError::Timeout {
                upstream: upstream.name.clone(),
                target: Some(target.pool.address().to_string()),
            }),
        };
        match (answered, over_h2) {
            (Ok(Answered::Opened(mut opened)), true) => {
                let response = &mut opened.response;
                *response.status_mut() = StatusCode::OK;
                let headers = response.headers_mut();
                for name in [CONNECTION, UPGRADE, SEC_WEBSOCKET_ACCEPT] {
                    headers.remove(name);
                }
                Ok(Answered::Opened(opened))
            }
            (answered, _) => answered,
        }
    }
}

/// A `Sec-WebSocket-Key`: 16 random bytes in base64 (RFC 6455, 4.1).
fn new_key() -> HeaderValue {
    key_of(fastrand::u128(..).to_be_bytes())
}

/// `bytes` in base64, as a `Sec-WebSocket-Key`.
fn key_of(bytes: [u8; 16]) -> HeaderValue {
    base64(&bytes)
}

/// The `Sec-WebSocket-Accept` that answers `key` (RFC 6455, 4.2.2): the base64 of
/// the SHA-1 of the key and the protocol's GUID.
fn accept_of(key: &HeaderValue) -> HeaderValue {
    const GUID: &[u8] = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
    let mut context = ring::digest::Context::new(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY);
    context.update(key.as_bytes());
    context.update(GUID);
    base64(context.finish().as_ref())
}

/// `bytes` in base64 (with padding), as a header value.
fn base64(bytes: &[u8]) -> HeaderValue {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut key = Vec::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        let sextets = [n >> 18, n >> 12, n >> 6, n];
        for (i, sextet) in sextets.iter().enumerate() {
            key.push(match i <= chunk.len() {
                true => ALPHABET[(sextet & 63) as usize],
                false => b'=',
            });
        }
    }
    HeaderValue::from_bytes(&key).expect("base64 is a valid header value")
}

impl Upstream {
    /// The socket `target` opened, or its answer for the client. A `101` must
    /// switch to `websocket` and carry `accept`, the answer to the key sent (when
    /// one was: an HTTP/1.1 client's own, or the one sluice made).
    fn switched(
        &self,
        target: &Target,
        answered: Switch,
        accept: Option<HeaderValue>,
    ) -> Result<Answered, ProxyError> {
        let (mut response, stream) = match answered {
            Switch::Not(response) => {
                let address = std::sync::Arc::clone(target.pool.origin());
                let mut response = response.map(|body| Body::upstream(body, Single(address)));
                strip_hop_by_hop(response.headers_mut());
                return Ok(Answered::Refused(response));
            }
            Switch::To(response, stream) => (response, stream),
        };
        let headers = response.headers_mut();
        let websocket = (headers.get_all(UPGRADE).iter())
            .any(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"));
        let bad = |reason| ProxyError::BadResponse {
            upstream: self.name.clone(),
            target: target.pool.address().to_string(),
            reason,
        };
        if !websocket {
            return Err(bad(
                "101 Switching Protocols to something other than websocket",
            ));
        }
        if accept.is_some_and(|accept| headers.get(SEC_WEBSOCKET_ACCEPT) != Some(&accept)) {
            return Err(bad(
                "101 whose Sec-WebSocket-Accept does not answer the key",
            ));
        }
        strip_hop_by_hop(headers);
        headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(UPGRADE, HeaderValue::from_static("websocket"));
        let values = headers.get_all(SEC_WEBSOCKET_EXTENSIONS).iter();
        let extensions = Extensions::negotiated(values.map(HeaderValue::as_bytes));
        let (stream, read_ahead) = stream;
        Ok(Answered::Opened(Opened {
            response: response.map(|()| Body::full(Bytes::new())),
            extensions,
            stream,
            read_ahead,
        }))
    }
}

/// The upstream's answer to an upgrade.
enum Switch {
    /// A `101`, and the switched stream with the bytes read past the `101`.
    To(Response<()>, (Box<dyn Stream>, Bytes)),
    /// Anything else.
    Not(Response<Incoming>),
}

/// Sends the upgrade on a new connection to `pool`'s target.
async fn upgrade(
    pool: &Pool,
    request: Request<Empty<Bytes>>,
    connect_timeout: Duration,
) -> Result<Switch, Failure> {
    let stream = pool.open(connect_timeout).await?;
    let (mut sender, connection) = http1::Builder::new()
        .handshake(TokioIo::new(stream))
        .await
        .map_err(Failure::Exchange)?;
    tokio::spawn(async move {
        if let Err(err) = connection.with_upgrades().await {
            tracing::debug!(error = %err, "upstream upgrade connection ended");
        }
    });
    let mut response = sender
        .send_request(request)
        .await
        .map_err(Failure::Exchange)?;
    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        return Ok(Switch::Not(response));
    }
    let upgraded = hyper::upgrade::on(&mut response)
        .await
        .map_err(Failure::Exchange)?;
    // The connection's own stream, out of hyper's two layers around it (each read
    // and write through them costs two more dynamic calls and buffer conversions).
    let stream = match upgraded.downcast::<TokioIo<Box<dyn Stream>>>() {
        // (The bytes copied: hyper's whole read buffer would stay with the socket.)
        Ok(parts) => (
            parts.io.into_inner(),
            Bytes::copy_from_slice(&parts.read_buf),
        ),
        Err(upgraded) => (
            Box::new(TokioIo::new(upgraded)) as Box<dyn Stream>,
            Bytes::new(),
        ),
    };
    Ok(Switch::To(response.map(|_| ()), stream))
}

/// The body of an answer from a connection of its own: nothing goes back to a pool.
struct Single(std::sync::Arc<str>);

impl crate::http::body::Upstream for Single {
    fn origin(&self) -> Option<&std::sync::Arc<str>> {
        Some(&self.0)
    }

    fn release(&mut self, _ended: bool) {}
}

#[cfg(test)]
mod key_tests {
    use super::*;

    #[test]
    fn a_key_is_sixteen_bytes_in_base64() {
        // RFC 6455, 1.3's example nonce.
        assert_eq!(key_of(*b"the sample nonce"), "dGhlIHNhbXBsZSBub25jZQ==");
        assert_ne!(new_key(), new_key());
    }

    #[test]
    fn the_accept_answers_the_key() {
        // RFC 6455, 1.3's example.
        let key = HeaderValue::from_static("dGhlIHNhbXBsZSBub25jZQ==");
        assert_eq!(accept_of(&key), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    }
}
