//! Forwarding admitted requests upstream and their responses back.
//!
//! An upstream's targets are tried round robin; a target whose connection failed is
//! skipped for a few seconds. Each target has a pool of keep-alive connections
//! ([`pool`]) that outlives config snapshots. Requests are rewritten by [`headers`]
//! (hop-by-hop and API key out, `X-Forwarded-*` in); bodies stream both ways, and the
//! response body is a [`Body`] that can carry guards until its last byte. What goes
//! wrong is a [`ProxyError`]: a target that cannot be reached or answers what must not
//! reach the client, no answer within `timeout`, or a client body cut by a limit. This
//! module does not decide whether to forward (the gateway does), nor what the client
//! is answered when forwarding fails (`refusal` does: 502, 504, 413, 408, 400).

mod error;
pub(crate) mod headers;
pub(crate) mod pool;
mod request;
pub(crate) mod request_body;
pub(crate) mod tunnel;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::header::HOST;
use http::uri::PathAndQuery;
use http::{HeaderValue, Request, Response, Version};

use crate::config::{UpstreamConfig, UpstreamId};
use crate::http::body::Body;

pub(crate) use error::ProxyError;
use headers::detach_values;
pub(crate) use headers::{Origin, join_cookies, strip_hop_by_hop};
pub(crate) use pool::Held;
pub(crate) use pool::Pools;
use pool::{Failure, Pool, Riders};
pub(crate) use request::{GrpcCall, Outgoing};
pub(crate) use request_body::BodyLimits;
use request_body::{Cut, RequestBody, Stalled};

/// Told what came of a request whose client went away before the response head, as
/// the client would have been answered: the upstream's response (its body not read
/// yet, hop-by-hop headers removed), or the error sluice would have answered in its
/// place. What it hands back is read on off the request's path (a body it watches,
/// for its watch, for up to a minute; any other, a little, to keep its connection).
pub(crate) type Orphan =
    Box<dyn FnOnce(Result<Response<Body>, ProxyError>) -> Option<Response<Body>> + Send>;

/// What a forwarded request carries besides itself, whether or not its client stays.
#[derive(Default)]
pub(crate) struct Carried {
    /// Kept until the upstream has answered and the response body has been sent,
    /// or the client went away and the upstream has answered (a concurrency permit).
    pub held: Option<Held>,
    /// Told the answer if the client goes away once the request is on its way and
    /// before the response head.
    pub orphan: Option<Orphan>,
}

/// How long a target that refused a connection is skipped.
const DOWN_FOR_MS: u64 = 5_000;

#[derive(Debug)]
struct Target {
    /// `host:port`, e.g. `127.0.0.1:3000`.
    authority: HeaderValue,
    /// Base path of the target without a trailing slash ("" for none).
    base: String,
    pool: Arc<Pool>,
}

#[derive(Debug)]
struct Upstream {
    name: String,
    targets: Vec<Target>,
    next: AtomicUsize,
    connect_timeout: Duration,
    timeout: Duration,
}

/// The upstreams of one config snapshot.
#[derive(Debug)]
pub(crate) struct Upstreams {
    list: Vec<Upstream>,
}

impl Upstreams {
    /// The upstreams of a config, with the pools of `pools` (kept across reloads).
    pub(crate) fn new(configs: &[UpstreamConfig], pools: &Pools) -> Upstreams {
        let resolved = pools.resolve(configs);
        let list = configs
            .iter()
            .zip(resolved)
            .map(|(config, pools)| Upstream {
                name: config.name.clone(),
                targets: config
                    .targets
                    .iter()
                    .zip(pools)
                    .map(|(uri, pool)| {
                        let authority = uri.authority().map_or("", |a| a.as_str());
                        Target {
                            authority: HeaderValue::try_from(authority)
                                .expect("an authority is a header value"),
                            base: uri.path().trim_end_matches('/').to_string(),
                            pool,
                        }
                    })
                    .collect(),
                next: AtomicUsize::new(0),
                connect_timeout: config.connect_timeout,
                timeout: config.timeout,
            })
            .collect();
        Upstreams { list }
    }

    /// Sends `request` to upstream `id`, rewritten as `out` says, and returns the
    /// upstream's response, hop-by-hop headers removed, with what it `carried`: its
    /// guard rides on the response body; its orphan, if the client goes away before
    /// the head, is told the answer (an upstream that does not answer within
    /// `timeout` then is the 504 the client would have had, or its 408 if the client
    /// was still to send its body).
    ///
    /// A failure is a [`ProxyError`], handed over as the caller's error type: turned
    /// into it where the failure is found, so that the response of every request
    /// that did not fail is not moved once more on its way out.
    pub(crate) async fn forward<E: From<ProxyError>>(
        &self,
        id: UpstreamId,
        mut request: Box<Request<hyper::body::Incoming>>,
        out: &Outgoing<'_>,
        carried: Carried,
        limits: BodyLimits,
        now_ms: u64,
    ) -> Result<Response<Body>, E> {
        let upstream = &self.list[id.index()];
        let path_and_query = request::prepare(&mut *request, out);
        // A stream may be quiet for as long as the call lasts: only its size is held.
        let limits = match out.grpc {
            Some(_) => limits.for_streams(),
            None => limits,
        };
        let mut request = (*request).map(|body| RequestBody::new(body, limits));
        let stalled = request.body_mut().stalled();
        let host_given = request.headers().contains_key(HOST);
        let h2_client = request.version() == Version::HTTP_2;
        *request.version_mut() = Version::HTTP_11;
        let mut slot = Some(request);
        let Carried { held, orphan } = carried;
        let mut riders = Riders {
            held,
            orphan: orphan.map(|orphan| upstream.orphan(orphan, stalled.clone(), now_ms)),
        };
        let deadline = tokio::time::Instant::now() + upstream.timeout_for(out.grpc);
        // A target that refuses the connection had nothing sent to it: the request
        // goes once to the next target (whatever its method), so one dead target
        // does not become client 502s. One `timeout` covers both tries.
        // The target tried last, for the log line of a 502 or 504.
        let mut tried = None;
        let exchange = async {
            let mut retried = false;
            loop {
                let target = upstream.pick(now_ms);
                tried = Some(target);
                if out.grpc.is_some() && !target.pool.may_speak_h2() {
                    return (target, Some(Err(Failure::NeedsH2)));
                }
                let request = slot.as_mut().expect("the request is not sent yet");
                if !target.aim(request, path_and_query.as_ref(), host_given) {
                    return (target, None);
                }
                let result = target
                    .pool
                    .send(&mut slot, &mut riders, upstream.connect_timeout, deadline)
                    .await;
                match result {
                    Err(Failure::Connect(err))
                        if !retried && slot.is_some() && upstream.targets.len() > 1 =>
                    {
                        target.pool.mark_down(now_ms + DOWN_FOR_MS);
                        tracing::warn!(upstream = %upstream.name, target = %target.pool.address(), error = %err, "upstream target refused; trying the next");
                        retried = true;
                    }
                    result => return (target, Some(result)),
                }
            }
        };
        // Pinned in place, so that the timeout's moves do not copy the exchange.
        let sent = tokio::time::timeout_at(deadline, std::pin::pin!(exchange)).await;
        let Ok((target, result)) = sent else {
            let target = tried.map(|target| target.pool.address());
            return Err(E::from(upstream.late(target, stalled.as_ref())));
        };
        let Some(mut result) = result else {
            return Err(E::from(ProxyError::BadUri {
                upstream: upstream.name.clone(),
                target: target.pool.address().to_string(),
            }));
        };
        if let (true, Ok(response)) = (h2_client, &mut result) {
            detach_values(response.headers_mut());
        }
        upstream
            .answered(&target.pool, result, now_ms)
            .map_err(E::from)
    }
}

impl Target {
    /// Points `request` at this target: its URI under the target's base path
    /// ([`request::upstream_uri`]), and its `Host` unless the client gave one. False
    /// if the path makes no URI.
    #[inline]
    fn aim<B>(
        &self,
        request: &mut Request<B>,
        path_and_query: Option<&PathAndQuery>,
        host_given: bool,
    ) -> bool {
        let Some(uri) = request::upstream_uri(&self.base, path_and_query) else {
            return false;
        };
        *request.uri_mut() = uri;
        if !host_given {
            request.headers_mut().insert(HOST, self.authority.clone());
        }
        true
    }
}

impl Upstream {
    /// How long an exchange may take for its response head: the upstream's
    /// `timeout`, or a gRPC call's shorter `grpc-timeout`.
    #[inline]
    fn timeout_for(&self, grpc: Option<GrpcCall>) -> Duration {
        match grpc.and_then(|call| call.timeout) {
            Some(asked) => asked.min(self.timeout),
            None => self.timeout,
        }
    }

    /// `orphan`, told what an exchange of this upstream came to as the client would
    /// have been (see [`Upstreams::forward`]).
    fn orphan(&self, orphan: Orphan, stalled: Option<Stalled>, now_ms: u64) -> pool::Orphan {
        let name = self.name.clone();
        Box::new(
            move |pool: &Pool, result: Result<Response<Body>, Failure>| {
                let upstream = Named(&name);
                let answered = match result {
                    Err(Failure::Deadline) => {
                        Err(upstream.late(Some(pool.address()), stalled.as_ref()))
                    }
                    result => upstream.answered(pool, result, now_ms),
                };
                orphan(answered)
            },
        )
    }

    /// What the exchange with `pool`'s target came to: the response, hop-by-hop
    /// headers removed, or the error.
    #[inline(always)]
    fn answered(
        &self,
        pool: &Pool,
        result: Result<Response<Body>, Failure>,
        now_ms: u64,
    ) -> Result<Response<Body>, ProxyError> {
        Named(&self.name).answered(pool, result, now_ms)
    }

    /// No response head within `timeout` from `target` (if one was tried).
    #[cold]
    fn late(&self, target: Option<&str>, stalled: Option<&Stalled>) -> ProxyError {
        Named(&self.name).late(target, stalled)
    }

    /// The error of an exchange with `target` that failed (see [`Named::failed`]).
    #[cold]
    fn failed(&self, target: &Target, err: Failure, now_ms: u64) -> ProxyError {
        Named(&self.name).failed(&target.pool, err, now_ms)
    }
}

/// An upstream's name: what its errors are told with, whoever asks (a request, or
/// the background exchange of one whose client went away).
struct Named<'a>(&'a str);

impl Named<'_> {
    /// What the exchange with `pool`'s target came to: the response, hop-by-hop
    /// headers removed, or the error.
    #[inline(always)]
    fn answered(
        &self,
        pool: &Pool,
        result: Result<Response<Body>, Failure>,
        now_ms: u64,
    ) -> Result<Response<Body>, ProxyError> {
        let address = pool.address();
        match result {
            Ok(mut response) => {
                if let Some(reason) = unacceptable(&response) {
                    // Dropped unread: its connection closes instead of going back.
                    tracing::warn!(upstream = %self.0, target = %address, reason, "upstream response refused");
                    return Err(ProxyError::BadResponse {
                        upstream: self.0.to_string(),
                        target: address.to_string(),
                        reason,
                    });
                }
                strip_hop_by_hop(response.headers_mut());
                Ok(response)
            }
            Err(err) => Err(self.failed(pool, err, now_ms)),
        }
    }

    /// No response head within `timeout` from `target` (if one was tried): the
    /// upstream's 504, unless the exchange was waiting on the client for its body
    /// (`stalled`): then the client's stall, a 408.
    #[cold]
    fn late(&self, target: Option<&str>, stalled: Option<&Stalled>) -> ProxyError {
        if stalled.is_some_and(Stalled::now) {
            return ProxyError::BodyTooSlow;
        }
        ProxyError::Timeout {
            upstream: self.0.to_string(),
            target: target.map(str::to_string),
        }
    }

    /// The error of an exchange with `pool`'s target that failed: the client's body
    /// (cut by a limit, or malformed), or the target (not reached: it is skipped a
    /// while; or the exchange broke).
    #[cold]
    fn failed(&self, pool: &Pool, err: Failure, now_ms: u64) -> ProxyError {
        match err {
            Failure::ClientBody(Cut::TooLarge) => return ProxyError::BodyTooLarge,
            Failure::ClientBody(Cut::TooSlow) => return ProxyError::BodyTooSlow,
            Failure::NeedsH2 => {
                tracing::warn!(upstream = %self.0, "a gRPC call refused: the upstream speaks HTTP/1.1; set protocol = \"h2\"");
                return ProxyError::NeedsH2 {
                    upstream: self.0.to_string(),
                };
            }
            Failure::Deadline => return self.late(Some(pool.address()), None),
            _ => {}
        }
        if let Failure::Exchange(err) = &err
            && client_body_failed(err)
        {
            return match Cut::of(err) {
                Some(Cut::TooLarge) => ProxyError::BodyTooLarge,
                Some(Cut::TooSlow) => ProxyError::BodyTooSlow,
                None => ProxyError::BadBody,
            };
        }
        if let Failure::Connect(_) = err {
            pool.mark_down(now_ms + DOWN_FOR_MS);
        }
        let address = pool.address();
        tracing::warn!(upstream = %self.0, target = %address, error = %err, "upstream request failed");
        let (upstream, target) = (self.0.to_string(), address.to_string());
        match err {
            Failure::Connect(source) => ProxyError::Connect {
                upstream,
                target,
                source,
            },
            Failure::Exchange(source) => ProxyError::Exchange {
                upstream,
                target,
                source,
            },
            Failure::ClientBody(_) | Failure::NeedsH2 | Failure::Deadline => {
                unreachable!("answered above")
            }
        }
    }
}

/// Why an upstream response must not reach the client, if it must not: framing the
/// client's parser could read differently from hyper's, or a protocol switch nobody
/// asked for (sluice forwards no `Upgrade`).
fn unacceptable<B>(response: &Response<B>) -> Option<&'static str> {
    let headers = response.headers();
    if response.status() == http::StatusCode::SWITCHING_PROTOCOLS {
        return Some("101 Switching Protocols to a request that asked for no upgrade");
    }
    if headers.contains_key(http::header::TRANSFER_ENCODING)
        && headers.contains_key(http::header::CONTENT_LENGTH)
    {
        return Some("both Content-Length and Transfer-Encoding");
    }
    let mut lengths = headers.get_all(http::header::CONTENT_LENGTH).iter();
    if let (Some(_), Some(_)) = (lengths.next(), lengths.next()) {
        return Some("more than one Content-Length");
    }
    None
}

/// Whether an exchange failed because the client's request body did (a malformed
/// chunk, a client that went away mid-body, a limit of [`RequestBody`]): the client's
/// fault, not the upstream's.
fn client_body_failed(err: &hyper::Error) -> bool {
    err.is_user() && std::error::Error::source(err).is_some()
}

impl Upstream {
    /// The next target in round-robin order that is not marked down (or the next one
    /// if all are).
    fn pick(&self, now_ms: u64) -> &Target {
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let count = self.targets.len();
        (0..count)
            .map(|i| &self.targets[(start + i) % count])
            .find(|t| t.pool.is_up(now_ms))
            .unwrap_or(&self.targets[start % count])
    }
}
