//! The headers sluice removes or writes itself before a request goes upstream: the
//! hop-by-hop ones (RFC 9110 section 7.6.1), those a `Connection` header names, and
//! the forwarding ones (`X-Forwarded-*`, `Forwarded`, `X-Real-IP`).
//!
//! One list, read by the proxy's rewrite (`crate::proxy::headers`), by the limit keys
//! (a key must read what the upstream will see) and by the config (a limit key on a
//! rewritten header is an error). This module rewrites nothing itself.

use http::header::CONNECTION;
use http::{HeaderMap, HeaderName};

pub(crate) static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
pub(crate) static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
pub(crate) static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
pub(crate) static FORWARDED: HeaderName = HeaderName::from_static("forwarded");
pub(crate) static X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");

/// Headers that describe one connection, not the message (RFC 9110 section 7.6.1).
pub(crate) static HOP_BY_HOP: [HeaderName; 8] = [
    HeaderName::from_static("connection"),
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    HeaderName::from_static("te"),
    HeaderName::from_static("trailer"),
    HeaderName::from_static("transfer-encoding"),
    HeaderName::from_static("upgrade"),
    HeaderName::from_static("proxy-authorization"),
];

/// The names of [`HOP_BY_HOP`] as text, in the same order, then the forwarding
/// headers a request's rewrite looks for.
pub(crate) const NAMES_TEXT: [&str; 13] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "proxy-authorization",
    "forwarded",
    "x-real-ip",
    "x-forwarded-for",
    "x-forwarded-proto",
    "x-forwarded-host",
];

/// Whether the `Connection` header of `headers` names `name` (which then does not
/// go upstream; `Host` always does).
pub(crate) fn connection_names(headers: &HeaderMap, name: &HeaderName) -> bool {
    connection_tokens(headers).any(|token| token.eq_ignore_ascii_case(name.as_str()))
}

/// Whether sluice removes or rewrites the header `name` (lower case) before a
/// request goes upstream: a hop-by-hop header, or a forwarding one sluice writes.
pub(crate) fn is_rewritten(name: &str) -> bool {
    NAMES_TEXT.contains(&name)
}

/// The headers a message's `Connection` header names, as sent: its tokens but
/// `keep-alive` and `close` (which name none) and `Host` (never removed).
pub(crate) fn connection_tokens(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(CONNECTION)
        .iter()
        // Either is nearly always the whole value, which then needs no splitting.
        .filter(|v| {
            let v = v.as_bytes();
            !v.eq_ignore_ascii_case(b"keep-alive") && !v.eq_ignore_ascii_case(b"close")
        })
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|token| {
            !token.eq_ignore_ascii_case("keep-alive")
                && !token.eq_ignore_ascii_case("close")
                && !token.eq_ignore_ascii_case("host")
        })
}
