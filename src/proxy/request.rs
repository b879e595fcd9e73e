//! The upstream request, built from the client's: its target (the normalised path,
//! the route's prefix stripped if it says so, the client's query) and its headers
//! (rewritten by [`super::headers`], the caller's credentials out, the request id and,
//! for a route that meters its answers, `Accept-Encoding: identity` in).
//!
//! This module decides nothing: admission said what the request is, and this is how
//! it reaches the upstream.

use std::borrow::Cow;

use http::header::{ACCEPT_ENCODING, AUTHORIZATION};
use http::uri::PathAndQuery;
use http::{HeaderName, HeaderValue, Request, Uri};

use super::headers::{Origin, prepare_request_headers};
use crate::config::route::{self, Route};

/// What the upstream request is built from besides the client's request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Outgoing<'a> {
    /// The route the request matched: its prefix (stripped with `strip_prefix`) and
    /// whether it meters its answers (`cost_after`).
    pub route: &'a Route,
    /// The normalised path.
    pub path: &'a str,
    /// The request target as the client sent it: its query and authority.
    pub uri: &'a Uri,
    /// The client's connection, for the `X-Forwarded-*` headers.
    pub origin: Origin,
    /// The API key header, if the request carried one: it does not go upstream.
    pub key_header: Option<&'a HeaderName>,
    /// `Authorization` carried the caller's credential: it does not go upstream.
    pub authorization: bool,
    /// The request id header, and the request's id (the client's, or a new one).
    pub request_id: (&'a HeaderName, &'a HeaderValue),
    /// A gRPC call: it travels only as HTTP/2, with `te: trailers`, and its
    /// `grpc-timeout` (if any) shortens the upstream's `timeout`.
    pub grpc: Option<GrpcCall>,
}

/// What forwarding a gRPC call needs to know of it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GrpcCall {
    /// Its `grpc-timeout`.
    pub timeout: Option<std::time::Duration>,
}

/// Marks a request whose client sent `te: trailers` (every gRPC call): an HTTP/2
/// upstream gets it back, after the hop-by-hop headers went.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TeTrailers;

/// Rewrites `request`'s headers for the upstream and answers its path and query
/// (`None` if they make no request target).
pub(crate) fn prepare<B>(request: &mut Request<B>, out: &Outgoing<'_>) -> Option<PathAndQuery> {
    let path_and_query = path_and_query(out);
    // Only headers that came are removed: a removal hashes the name.
    let remove: &[&HeaderName] = match (out.key_header, out.authorization) {
        (Some(key), true) => &[key, &AUTHORIZATION],
        (Some(key), false) => &[key],
        (None, true) => &[&AUTHORIZATION],
        (None, false) => &[],
    };
    let authority = out.uri.authority().map(|a| a.as_str());
    let headers = request.headers_mut();
    prepare_request_headers(headers, authority, out.origin, remove);
    // After the hop-by-hop headers went: a client's `Connection` cannot name it away.
    let (name, id) = out.request_id;
    headers.insert(name.clone(), id.clone());
    if out.route.cost_after.is_some() {
        // The cost is read from the answer as sent: a compressed one could not be
        // read, and the client would choose to be charged `default_cost`.
        headers.insert(ACCEPT_ENCODING, HeaderValue::from_static("identity"));
    }
    if out.grpc.is_some() {
        request.extensions_mut().insert(TeTrailers);
    }
    path_and_query
}

/// The upstream request's target at a target whose URIs start with `base` (empty:
/// origin-form, the connection is to the target already), or `None` if it makes
/// no URI.
pub(crate) fn upstream_uri(base: &str, path_and_query: Option<&PathAndQuery>) -> Option<Uri> {
    let path_and_query = path_and_query?;
    match base.is_empty() {
        true => Some(Uri::from(path_and_query.clone())),
        false => Uri::try_from(format!("{base}{path_and_query}")).ok(),
    }
}

/// The upstream's path and query: the normalised path (its prefix stripped if the
/// route says so) and the client's query.
///
/// Nearly every request's path is normalised already and keeps its prefix: its
/// target then goes upstream as the client sent it, the bytes hyper read shared,
/// not copied into a new string and parsed again.
fn path_and_query(out: &Outgoing<'_>) -> Option<PathAndQuery> {
    let route = out.route;
    let given = out.uri.path_and_query();
    if !route.strip_prefix && given.is_some_and(|given| given.path() == out.path) {
        return given.cloned();
    }
    let path = match route.strip_prefix {
        true => Cow::Owned(route::strip(&route.path_prefix, out.path)),
        false => Cow::Borrowed(out.path),
    };
    let text = match out.uri.query() {
        Some(query) => format!("{path}?{query}"),
        None => path.into_owned(),
    };
    PathAndQuery::from_maybe_shared(bytes::Bytes::from(text)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_with_a_base_path_prefixes_it() {
        let pq = PathAndQuery::from_static("/v1/items?x=1");
        let uri = |base| upstream_uri(base, Some(&pq)).map(|uri| uri.to_string());
        assert_eq!(uri("").as_deref(), Some("/v1/items?x=1"));
        assert_eq!(uri("/base").as_deref(), Some("/base/v1/items?x=1"));
        assert_eq!(upstream_uri("/base", None), None);
    }
}
