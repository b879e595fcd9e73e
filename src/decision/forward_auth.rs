//! `/v1/forward-auth` (any method): the original request rebuilt from the
//! `X-Forwarded-Method`, `-Proto`, `-Host` and `-Uri` headers a proxy sends (its
//! other headers, the API key and `Authorization` among them, are the original
//! request's), decided by admission exactly as if sluice were proxying it.
//!
//! The answer is 200 with the RateLimit headers, or the refusal the proxy returns
//! to its client as it is (429, 401, 403, 503 problem+json with `Retry-After`).
//! `?mode=nginx` is for nginx's `auth_request`, which accepts only 2xx, 401 and
//! 403: every refusal becomes a 403 carrying `X-Sluice-Status: <the real status>`
//! and the same headers, which the documented nginx snippet turns back into the
//! real answer. The client address is the peer, or `X-Forwarded-For` when the peer
//! is in `trusted_proxies`, as on the proxy path (admission reads it).

use std::sync::Arc;

use http::header::{CONNECTION, CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri};
use hyper::body::Incoming;

use crate::gateway::Gateway;
use crate::http::body::Body;
use crate::http::refusal::OUTCOMES;
use crate::server::conn::ConnInfo;
use crate::snapshot::Snapshot;

/// Where forward-auth requests come.
pub(super) const PATH: &str = "/v1/forward-auth";

static FORWARDED_METHOD: HeaderName = HeaderName::from_static("x-forwarded-method");
static FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
static FORWARDED_URI: HeaderName = HeaderName::from_static("x-forwarded-uri");
/// The real status of a refusal answered as 403 for nginx.
static SLUICE_STATUS: HeaderName = HeaderName::from_static("x-sluice-status");

/// Decides one forward-auth request.
pub(super) async fn serve(
    gateway: &Gateway,
    snapshot: &Arc<Snapshot>,
    request: Request<Incoming>,
    conn: ConnInfo,
) -> Response<Body> {
    let nginx = for_nginx_asked(&request);
    let metrics = gateway.metrics();
    let peer = conn.peer.ip();
    let original = match original(&request) {
        Ok(original) => original,
        Err(reason) => {
            let bad = StatusCode::BAD_REQUEST;
            return super::refuse(gateway, snapshot, &request, peer, bad, &reason);
        }
    };
    let (response, outcome) = gateway
        .decide_forwarded(snapshot, original, peer, "forward-auth")
        .await;
    let outcome = OUTCOMES[outcome as usize];
    (metrics
        .decisions
        .with_label_values(&["forward_auth", outcome]))
    .inc();
    match nginx {
        true => for_nginx(response),
        false => response,
    }
}

/// The request the proxy asks about: its method, target and headers.
fn original(request: &Request<Incoming>) -> Result<Request<()>, String> {
    let headers = request.headers();
    let text = |name: &HeaderName| -> Result<Option<&str>, String> {
        match headers.get(name) {
            None => Ok(None),
            Some(value) => {
                (value.to_str().map(Some)).map_err(|_| format!("{name} is not visible ASCII"))
            }
        }
    };
    let target = text(&FORWARDED_URI)?.ok_or("X-Forwarded-Uri is missing")?;
    let path = PathAndQuery::try_from(target)
        .ok()
        .filter(|_| target.starts_with('/'))
        .ok_or_else(|| format!("X-Forwarded-Uri \"{target}\" is not a request target"))?;
    let method = match text(&FORWARDED_METHOD)? {
        Some(method) => Method::from_bytes(method.as_bytes())
            .map_err(|_| format!("X-Forwarded-Method \"{method}\" is not a method"))?,
        None => request.method().clone(),
    };
    let mut uri = Uri::builder().path_and_query(path);
    let host = text(&FORWARDED_HOST)?;
    if let Some(host) = host {
        let authority = Authority::try_from(host)
            .map_err(|_| format!("X-Forwarded-Host \"{host}\" is not a host"))?;
        let scheme = match text(&FORWARDED_PROTO)? {
            Some("https") => Scheme::HTTPS,
            _ => Scheme::HTTP,
        };
        uri = uri.scheme(scheme).authority(authority);
    }
    let uri = uri
        .build()
        .map_err(|err| format!("the forwarded target: {err}"))?;
    let mut original = Request::new(());
    *original.method_mut() = method;
    *original.uri_mut() = uri;
    *original.headers_mut() = passed_on(headers, host);
    Ok(original)
}

/// The original request's headers: the auth request's, without the forwarding
/// headers, the token and the auth request's own framing; `Host` the forwarded one.
fn passed_on(headers: &HeaderMap, host: Option<&str>) -> HeaderMap {
    let own = [
        &FORWARDED_METHOD,
        &FORWARDED_PROTO,
        &FORWARDED_HOST,
        &FORWARDED_URI,
        &CONTENT_LENGTH,
        &TRANSFER_ENCODING,
        &CONNECTION,
    ];
    let mut passed = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        if own.contains(&name) || name.as_str() == super::TOKEN_HEADER {
            continue;
        }
        passed.append(name, value.clone());
    }
    if let Some(host) = host.and_then(|h| HeaderValue::from_str(h).ok()) {
        passed.insert(HOST, host);
    }
    passed
}

/// Whether `request` asks for answers nginx's `auth_request` can pass on
/// (`?mode=nginx`).
pub(super) fn for_nginx_asked<B>(request: &Request<B>) -> bool {
    (request.uri().query().unwrap_or(""))
        .split('&')
        .any(|pair| pair == "mode=nginx")
}

/// A refusal as nginx's `auth_request` can pass it on: 403 with the real status in
/// `X-Sluice-Status`; a 2xx is left as it is.
pub(super) fn for_nginx(mut response: Response<Body>) -> Response<Body> {
    let status = response.status();
    if status.is_success() {
        return response;
    }
    (response.headers_mut()).insert(&SLUICE_STATUS, HeaderValue::from(status.as_u16()));
    *response.status_mut() = StatusCode::FORBIDDEN;
    response
}
