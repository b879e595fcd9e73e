//! Header rewriting between client and upstream: hop-by-hop headers out (including
//! those named in `Connection`, except `Host`), the API key out,
//! `X-Forwarded-For/-Proto/-Host` in. `X-Forwarded-Proto` is the scheme of the
//! client's connection to sluice. From a peer that is not a trusted proxy, `Forwarded`
//! and `X-Real-IP` are removed (only sluice says who the client is). Header names with
//! an underscore are removed, as nginx does by default: PHP, Rack and CGI read
//! `X_API_Key` as `X-API-Key`, so such a header could carry a second key or a forged
//! address past sluice.

use std::net::IpAddr;

use bytes::Bytes;
use http::header::{COOKIE, HOST};
use http::{HeaderMap, HeaderName, HeaderValue};

use crate::http::rewritten::{
    FORWARDED, HOP_BY_HOP, NAMES_TEXT, X_FORWARDED_FOR, X_FORWARDED_HOST, X_FORWARDED_PROTO,
    X_REAL_IP, connection_tokens,
};

/// Which of [`NAMES_TEXT`] a message carried: one bit each, in the same order.
#[derive(Debug, Clone, Copy)]
struct Seen(u16);

impl Seen {
    const CONNECTION: u16 = 1;
    const HOP_BY_HOP: u16 = 0xff;
    const FORWARDED: u16 = 1 << 8;
    const X_REAL_IP: u16 = 1 << 9;
    const X_FORWARDED_FOR: u16 = 1 << 10;
    const X_FORWARDED_PROTO: u16 = 1 << 11;
    const X_FORWARDED_HOST: u16 = 1 << 12;

    fn has(self, bits: u16) -> bool {
        self.0 & bits != 0
    }
}

/// What the proxy needs to know about the request's origin.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Origin {
    pub peer: IpAddr,
    /// The scheme the client spoke to sluice: `http` or `https`.
    pub proto: &'static str,
    /// The peer is a trusted proxy: its `X-Forwarded-*` headers are kept and extended.
    pub peer_trusted: bool,
}

/// Rewrites request headers for the upstream: hop-by-hop and key headers out,
/// `X-Forwarded-*` in, `Host` kept (set from the authority for HTTP/2 clients).
pub(crate) fn prepare_request_headers(
    headers: &mut HeaderMap,
    authority: Option<&str>,
    origin: Origin,
    remove: &[&HeaderName],
) {
    // Removals and lookups by name hash the name each time: only those of headers
    // the request carries are made.
    let seen = strip(headers, true);
    for name in remove {
        headers.remove(*name);
    }
    if !origin.peer_trusted {
        if seen.has(Seen::FORWARDED) {
            headers.remove(&FORWARDED);
        }
        if seen.has(Seen::X_REAL_IP) {
            headers.remove(&X_REAL_IP);
        }
    }
    // The request target's authority (absolute-form, HTTP/2 :authority) is what the
    // route was matched on; it wins over a Host header (RFC 9112 section 3.2.2).
    let host = match authority.and_then(|a| HeaderValue::try_from(a).ok()) {
        Some(host) => {
            headers.insert(HOST, host.clone());
            Some(host)
        }
        // Origin-form (nearly every HTTP/1.1 request): the Host header stays as it is.
        None => headers.get(HOST).cloned(),
    };
    let peer = ip_header(origin.peer);
    // A trusted proxy's chain, every line of it (the limiter reads them all, as
    // one list), then the peer.
    let forwarded_for = match seen.has(Seen::X_FORWARDED_FOR) && origin.peer_trusted {
        true => {
            let mut chain = Vec::new();
            for line in headers.get_all(&X_FORWARDED_FOR) {
                chain.extend_from_slice(line.as_bytes());
                chain.extend_from_slice(b", ");
            }
            chain.extend_from_slice(peer.as_bytes());
            HeaderValue::from_bytes(&chain).unwrap_or(peer)
        }
        false => peer,
    };
    headers.insert(&X_FORWARDED_FOR, forwarded_for);
    // Seen, but perhaps named in `Connection` and gone: looked up when it was seen.
    let kept = |headers: &HeaderMap, bit, name| seen.has(bit) && headers.contains_key(name);
    if !(origin.peer_trusted && kept(headers, Seen::X_FORWARDED_PROTO, &X_FORWARDED_PROTO)) {
        headers.insert(&X_FORWARDED_PROTO, HeaderValue::from_static(origin.proto));
    }
    if !(origin.peer_trusted && kept(headers, Seen::X_FORWARDED_HOST, &X_FORWARDED_HOST)) {
        match host {
            Some(host) => {
                headers.insert(&X_FORWARDED_HOST, host);
            }
            None if seen.has(Seen::X_FORWARDED_HOST) => {
                headers.remove(&X_FORWARDED_HOST);
            }
            None => {}
        }
    }
}

/// Joins an HTTP/2 request's `cookie` headers into one, `; ` between them, as the
/// request goes upstream over HTTP/1.1 (RFC 9113 section 8.2.3): HTTP/2 clients
/// send each cookie as a header of its own, and an HTTP/1.1 application may read
/// only the first or the last `Cookie` line.
pub(crate) fn join_cookies(headers: &mut HeaderMap) {
    let mut crumbs = headers.get_all(COOKIE).iter();
    let (Some(first), Some(_)) = (crumbs.next(), crumbs.next()) else {
        return;
    };
    let mut joined = first.as_bytes().to_vec();
    for crumb in headers.get_all(COOKIE).iter().skip(1) {
        joined.extend_from_slice(b"; ");
        joined.extend_from_slice(crumb.as_bytes());
    }
    if let Ok(joined) = HeaderValue::from_bytes(&joined) {
        headers.insert(COOKIE, joined);
    }
}

/// Removes hop-by-hop headers and every header that `Connection` names (never
/// `Host`), from a response on its way to the client.
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    strip(headers, false);
}

/// Moves a response's header values into one allocation of their own, for a client
/// on HTTP/2. A value hyper parsed is a slice of the upstream connection's read
/// buffer (8 KiB or more), and h2's HPACK encoder keeps the values it indexes in the
/// client connection's table for as long as that connection lives: without the copy
/// each idle HTTP/2 connection kept one such buffer alive, about 4 KB of its resident
/// memory (`docs/performance.md`, "Idle connections"). HTTP/1.1 clients keep nothing.
pub(crate) fn detach_values(headers: &mut HeaderMap) {
    let len = headers.values().map(HeaderValue::len).sum();
    let mut all = Vec::with_capacity(len);
    for value in headers.values() {
        all.extend_from_slice(value.as_bytes());
    }
    let all = Bytes::from(all);
    let mut at = 0;
    for value in headers.values_mut() {
        let end = at + value.len();
        // The bytes were a header value already: the check cannot fail.
        if let Ok(mut own) = HeaderValue::from_maybe_shared(all.slice(at..end)) {
            own.set_sensitive(value.is_sensitive());
            *value = own;
        }
        at = end;
    }
}

/// Removes hop-by-hop headers, every header that `Connection` names (never `Host`),
/// and, for a request (`underscores`), every header whose name holds an underscore.
///
/// One pass over the names finds which hop-by-hop headers are there: a message has
/// a handful of headers, so comparing them costs less than a hashed removal of each
/// of the eight names, and most requests carry none of them. The same pass notes
/// the forwarding headers, for the request's rewrite.
fn strip(headers: &mut HeaderMap, underscores: bool) -> Seen {
    let mut present = 0u16;
    let mut underscored = false;
    for name in headers.keys() {
        // Comparing the texts (lengths first) is cheaper than comparing `HeaderName`s.
        let name = name.as_str();
        if let Some(i) = NAMES_TEXT.iter().position(|known| *known == name) {
            present |= 1 << i;
        }
        underscored |= underscores && name.as_bytes().contains(&b'_');
    }
    if underscored {
        let names: Vec<HeaderName> = headers
            .keys()
            .filter(|name| name.as_str().as_bytes().contains(&b'_'))
            .cloned()
            .collect();
        for name in names {
            headers.remove(name);
        }
    }
    let seen = Seen(present);
    if !seen.has(Seen::HOP_BY_HOP) {
        return seen;
    }
    if seen.has(Seen::CONNECTION) {
        let named: Vec<HeaderName> = connection_tokens(headers)
            .filter_map(|token| HeaderName::try_from(token).ok())
            .collect();
        for name in named {
            headers.remove(name);
        }
    }
    for (i, name) in HOP_BY_HOP.iter().enumerate() {
        if present & (1 << i) != 0 {
            headers.remove(name);
        }
    }
    seen
}

/// The text of an IP address as a header value. IPv4 (nearly every peer) is written
/// digit by digit; `Display` for addresses goes through the formatting machinery,
/// which cost more than the rest of the request-header rewrite together.
fn ip_header(ip: IpAddr) -> HeaderValue {
    let IpAddr::V4(v4) = ip else {
        return HeaderValue::try_from(ip.to_string()).expect("an IP is a header value");
    };
    let mut text = [0u8; 15];
    let mut len = 0;
    for (i, octet) in v4.octets().into_iter().enumerate() {
        if i > 0 {
            text[len] = b'.';
            len += 1;
        }
        let mut digits = itoa::Buffer::new();
        let digits = digits.format(octet).as_bytes();
        text[len..len + digits.len()].copy_from_slice(digits);
        len += digits.len();
    }
    HeaderValue::from_bytes(&text[..len]).expect("digits and dots are a header value")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(HeaderName::try_from(*name).unwrap(), value.parse().unwrap());
        }
        map
    }

    #[test]
    fn ip_header_is_the_address_as_displayed() {
        for ip in [
            "0.0.0.0",
            "127.0.0.1",
            "10.20.30.40",
            "255.255.255.255",
            "1.2.3.4",
            "::1",
            "2001:db8::7",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(ip_header(ip), ip.to_string().as_str());
        }
    }

    #[test]
    fn hop_by_hop_texts_name_the_hop_by_hop_headers() {
        let names: Vec<&str> = HOP_BY_HOP.iter().map(HeaderName::as_str).collect();
        assert_eq!(names, NAMES_TEXT[..8]);
        let forwarding = [
            (Seen::FORWARDED, &FORWARDED),
            (Seen::X_REAL_IP, &X_REAL_IP),
            (Seen::X_FORWARDED_FOR, &X_FORWARDED_FOR),
            (Seen::X_FORWARDED_PROTO, &X_FORWARDED_PROTO),
            (Seen::X_FORWARDED_HOST, &X_FORWARDED_HOST),
        ];
        for (bit, name) in forwarding {
            assert_eq!(NAMES_TEXT[bit.trailing_zeros() as usize], name.as_str());
        }
    }

    #[test]
    fn a_response_loses_its_connection_headers_and_what_they_name() {
        // `keep-alive` or `close` alone, in any case, names nothing else.
        for value in ["keep-alive", "Keep-Alive", "close", "CLOSE"] {
            let mut h = headers(&[
                ("connection", value),
                ("keep-alive", "timeout=5"),
                ("x-kept", "1"),
            ]);
            strip_hop_by_hop(&mut h);
            let names: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
            assert_eq!(names, ["x-kept"], "Connection: {value}");
        }
        // Named beside them, or on a second line, a header goes; `Host` never does.
        let mut h = headers(&[
            ("connection", "keep-alive, x-named"),
            ("connection", "close"),
            ("connection", "X-Other ,host"),
            ("x-named", "1"),
            ("x-other", "1"),
            ("host", "api.example.com"),
            ("x-kept", "1"),
        ]);
        strip_hop_by_hop(&mut h);
        let mut names: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        names.sort_unstable();
        assert_eq!(names, ["host", "x-kept"]);
    }

    #[test]
    fn forwarding_headers_a_client_names_in_connection_are_set_by_sluice() {
        // From a trusted proxy, X-Forwarded-Proto/-Host are kept as they came,
        // unless the proxy named them hop-by-hop: then sluice's own are set.
        let mut h = headers(&[
            ("connection", "x-forwarded-proto, x-forwarded-host"),
            ("x-forwarded-proto", "https"),
            ("x-forwarded-host", "other.example"),
            ("host", "api.example.com"),
        ]);
        let trusted = Origin {
            peer: "10.0.0.1".parse().unwrap(),
            proto: "http",
            peer_trusted: true,
        };
        prepare_request_headers(&mut h, None, trusted, &[]);
        assert_eq!(h["x-forwarded-proto"], "http");
        assert_eq!(h["x-forwarded-host"], "api.example.com");

        // From anyone else, Forwarded and X-Real-IP go, in any case of their names.
        let mut h = headers(&[
            ("Forwarded", "for=6.6.6.6"),
            ("X-Real-IP", "6.6.6.6"),
            ("host", "api.example.com"),
        ]);
        let untrusted = Origin {
            peer: "8.8.8.8".parse().unwrap(),
            proto: "http",
            peer_trusted: false,
        };
        prepare_request_headers(&mut h, None, untrusted, &[]);
        assert!(!h.contains_key("forwarded"), "{h:?}");
        assert!(!h.contains_key("x-real-ip"), "{h:?}");
        assert_eq!(h["x-forwarded-for"], "8.8.8.8");
    }

    #[test]
    fn detached_values_are_the_same_values() {
        let mut h = headers(&[
            ("server", "nginx"),
            ("content-type", "text/plain"),
            ("x-e", ""),
        ]);
        h.append("server", HeaderValue::from_static("second"));
        let mut secret = HeaderValue::from_static("s3cret");
        secret.set_sensitive(true);
        h.insert("x-secret", secret);
        let before = h.clone();
        detach_values(&mut h);
        assert_eq!(h, before);
        assert!(h["x-secret"].is_sensitive());
    }

    #[test]
    fn a_message_without_hop_by_hop_headers_keeps_all_of_them() {
        let mut h = headers(&[("host", "api"), ("accept", "*/*"), ("x-kept", "yes")]);
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 3);
    }

    #[test]
    fn hop_by_hop_and_connection_named_headers_are_removed() {
        let mut h = headers(&[
            ("connection", "Keep-Alive, x-secret-hop, close"),
            ("keep-alive", "timeout=5"),
            ("x-secret-hop", "1"),
            ("te", "trailers"),
            ("upgrade", "websocket"),
            ("x-kept", "yes"),
        ]);
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert_eq!(h["x-kept"], "yes");
    }

    #[test]
    fn forwarded_headers_are_extended_only_for_trusted_peers() {
        let key = HeaderName::from_static("x-api-key");
        let mut h = headers(&[
            ("x-forwarded-for", "6.6.6.6"),
            ("host", "api.example.com"),
            ("x-api-key", "k"),
        ]);
        let untrusted = Origin {
            peer: "8.8.8.8".parse().unwrap(),
            proto: "http",
            peer_trusted: false,
        };
        prepare_request_headers(&mut h, None, untrusted, &[&key]);
        assert_eq!(h["x-forwarded-for"], "8.8.8.8");
        assert_eq!(h["x-forwarded-host"], "api.example.com");
        assert_eq!(h["x-forwarded-proto"], "http");
        assert!(!h.contains_key("x-api-key"));

        let mut h = headers(&[
            ("x-forwarded-for", "6.6.6.6"),
            ("x-forwarded-proto", "https"),
        ]);
        let trusted = Origin {
            peer: "10.0.0.1".parse().unwrap(),
            proto: "http",
            peer_trusted: true,
        };
        prepare_request_headers(&mut h, Some("h2.example.com"), trusted, &[]);
        assert_eq!(h["x-forwarded-for"], "6.6.6.6, 10.0.0.1");
        assert_eq!(h["x-forwarded-proto"], "https");
        assert_eq!(h["host"], "h2.example.com");
    }
}
