//! The upstream request, built from the client's: its target (the normalised path,
//! the route's prefix stripped if it says so, the client's query) and its headers
//! (rewritten by [`super::headers`], the caller's credentials out, the request id and,
//! for a route that meters its answers, `Accept-Encoding: identity` in).
//!
//! This module decides nothing: admission said what the request is, and this is how
//! it reaches the upstream.

use std::borrow::Cow;

use http::header::{ACCEPT_ENCODING, AUTHORIZATION};
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

/// Rewrites `request`'s headers for the upstream and answers its path and query.
pub(crate) fn prepare<B>(request: &mut Request<B>, out: &Outgoing<'_>) -> String {
    let route = out.route;
    let path = match route.strip_prefix {
        true => Cow::Owned(route::strip(&route.path_prefix, out.path)),
        false => Cow::Borrowed(out.path),
    };
    let path_and_query = match out.uri.query() {
        Some(query) => format!("{path}?{query}"),
        None => path.into_owned(),
    };
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
    if route.cost_after.is_some() {
        // The cost is read from the answer as sent: a compressed one could not be
        // read, and the client would choose to be charged `default_cost`.
        headers.insert(ACCEPT_ENCODING, HeaderValue::from_static("identity"));
    }
    if out.grpc.is_some() {
        request.extensions_mut().insert(TeTrailers);
    }
    path_and_query
}
