//! The request head, checked before anything else reads it: framing, `Host`, the
//! method's spelling, and the size limits.
//!
//! hyper parses the bytes; it leaves some choices to the application that a proxy
//! must make the strict way, because sluice and the upstream behind it are two
//! parsers, and wherever they could read one message differently an attacker can
//! smuggle a request past the limits (RFC 9112 section 11.2). So: reject, never
//! guess. Every refusal here is a 400 (413, 414, 431 for sizes) that closes the
//! connection, and nothing reaches the upstream.
//!
//! - `Transfer-Encoding` must be exactly `chunked` (one coding, one header line):
//!   `chunked, chunked` or `gzip, chunked` are refused, as is any coding sluice would
//!   have to pass on for the upstream to undo.
//! - `Content-Length` and `Transfer-Encoding` together are refused (RFC 9112 6.1
//!   allows a proxy to do so, and the request is a smuggling attempt in practice).
//!   Over HTTP/1 hyper drops the `Content-Length` of such a head before sluice sees
//!   it, so the connection's [`crate::http::wire::Scanner`] marks the request instead; it
//!   also marks a head with a line ended by LF alone, refused here too.
//! - Two `Content-Length` headers are refused (HTTP/2 passes equal ones on).
//! - An HTTP/1.1 request needs exactly one `Host`; a second one, or a value that is
//!   not `name[:port]` (`%`, spaces, `@`, a port that is not digits ...), is
//!   refused, and so is such a request target authority (HTTP/2 `:authority`).
//! - Over HTTP/2, a field value that begins or ends with a space or tab is refused
//!   (RFC 9113 section 8.2.1: the request is malformed; HTTP/1's parser trims
//!   them, and an upstream could read `" admin"` and `"admin"` differently), and so
//!   is a `:path` that does not begin with `/` (`?a=b` would otherwise reach the
//!   upstream as `/?a=b`, a target the client never sent).
//! - A standard method spelled in another case (`post`, `Get`) is refused: methods
//!   are case-sensitive (RFC 9110 9.1), so `post` is not `POST` to sluice's routes,
//!   but some upstreams upper-case it and would serve it as a POST.

use http::header::{AUTHORIZATION, CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
use http::{HeaderName, HeaderValue, Method, Request, Version};

use super::refusal::{Oversize, Refusal};
use super::wire::Malformed;

/// What the pass over a checked head found for the rest of the request path.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Head<'a> {
    /// The one `Host` header, if any.
    pub host: Option<&'a HeaderValue>,
    /// The one API key header, if any.
    pub key: Option<&'a HeaderValue>,
    /// The one `Authorization` header, if any.
    pub authorization: Option<&'a HeaderValue>,
}

/// The sizes a request may not exceed (`[server]`'s `max_uri_bytes`,
/// `max_header_bytes` and `max_body_bytes`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SizeLimits {
    /// The request target (path and query), in bytes.
    pub uri_bytes: usize,
    /// The head as sent: request line, names, values and their separators.
    pub header_bytes: usize,
    /// A declared `Content-Length`; 0: no limit.
    pub body_bytes: u64,
}

/// Checks `request`'s head against the framing rules and `limits`; `key_header` is
/// the header that carries API keys.
///
/// One pass over the headers gathers what the rules need, and the headers that
/// identification and routing read (lookups by name would hash each name again,
/// several times per request).
pub(crate) fn check<'a, B>(
    request: &'a Request<B>,
    limits: SizeLimits,
    key_header: &HeaderName,
) -> Result<Head<'a>, Refusal> {
    if let Some(malformed) = request.extensions().get::<Malformed>() {
        return Err(Refusal::Malformed(malformed.reason()));
    }
    let target = request
        .uri()
        .path_and_query()
        .map_or(0, |pq| pq.as_str().len());
    if target > limits.uri_bytes {
        return Err(Refusal::TooLarge(Oversize::Uri));
    }
    // HTTP/1's parser trims a value's surrounding whitespace and only reads a
    // target that begins with `/` (or an absolute one); HTTP/2 leaves both to us.
    let http2 = request.version() == Version::HTTP_2;
    if http2
        && let Some(path) = request.uri().path_and_query()
        && !path.as_str().starts_with(['/', '*'])
    {
        return Err(Refusal::Malformed(
            "an HTTP/2 :path that does not begin with /",
        ));
    }
    let seen = Seen::scan(request, key_header, http2);
    // hyper's read buffer cannot be smaller than 8 KiB, so a smaller limit is
    // applied here, to the head as sent: names, values and their separators.
    if target + request.method().as_str().len() + 12 + seen.bytes > limits.header_bytes {
        return Err(Refusal::TooLarge(Oversize::Headers));
    }
    seen.framing()?;
    seen.hosts(request)?;
    if seen.keys > 1 || seen.authorizations > 1 {
        return Err(Refusal::Malformed(
            "more than one API key or Authorization header",
        ));
    }
    check_method(request.method())?;
    if limits.body_bytes > 0
        && let Some(length) = seen.length
        && length
            .to_str()
            .ok()
            .and_then(|l| l.parse::<u64>().ok())
            .is_some_and(|l| l > limits.body_bytes)
    {
        return Err(Refusal::TooLarge(Oversize::Body));
    }
    Ok(Head {
        host: seen.host,
        key: seen.key,
        authorization: seen.authorization,
    })
}

/// What the one pass over a request's headers found: how many of each header the
/// rules count, the last of each, and the headers' size as sent.
#[derive(Default)]
struct Seen<'a> {
    /// Names, values and their separators.
    bytes: usize,
    /// An HTTP/2 value began or ended with whitespace.
    spaced: bool,
    codings: u32,
    /// The last `Transfer-Encoding` was `chunked`.
    chunked: bool,
    lengths: u32,
    length: Option<&'a HeaderValue>,
    hosts: u32,
    host: Option<&'a HeaderValue>,
    keys: u32,
    key: Option<&'a HeaderValue>,
    authorizations: u32,
    authorization: Option<&'a HeaderValue>,
}

impl<'a> Seen<'a> {
    /// Looks at every header of `request` once; `key_header` carries API keys.
    #[inline]
    fn scan<B>(request: &'a Request<B>, key_header: &HeaderName, http2: bool) -> Seen<'a> {
        let mut seen = Seen::default();
        for (name, value) in request.headers() {
            seen.bytes += name.as_str().len() + value.len() + 4;
            seen.spaced |= http2 && has_surrounding_space(value.as_bytes());
            if name == key_header {
                seen.keys += 1;
                seen.key = Some(value);
            } else if *name == AUTHORIZATION {
                seen.authorizations += 1;
                seen.authorization = Some(value);
            } else if *name == TRANSFER_ENCODING {
                seen.codings += 1;
                seen.chunked = value
                    .as_bytes()
                    .trim_ascii()
                    .eq_ignore_ascii_case(b"chunked");
            } else if *name == CONTENT_LENGTH {
                seen.lengths += 1;
                seen.length = Some(value);
            } else if *name == HOST {
                seen.hosts += 1;
                seen.host = Some(value);
            }
        }
        seen
    }

    /// The rules of the message's framing: a single `chunked` coding, one
    /// `Content-Length`, never both; no HTTP/2 value with surrounding whitespace.
    #[inline]
    fn framing(&self) -> Result<(), Refusal> {
        if self.spaced {
            return Err(Refusal::Malformed(
                "an HTTP/2 field value that begins or ends with whitespace",
            ));
        }
        if self.codings > 1 || (self.codings == 1 && !self.chunked) {
            return Err(Refusal::Malformed(
                "Transfer-Encoding other than a single \"chunked\"",
            ));
        }
        // Over HTTP/1 hyper refuses two different lengths and keeps one of two equal
        // ones; HTTP/2 passes both on, which some upstreams refuse and others read
        // one of (RFC 9110 section 8.6 lets a recipient reject them).
        if self.lengths > 1 {
            return Err(Refusal::Malformed("more than one Content-Length"));
        }
        if self.codings == 1 && self.length.is_some() {
            return Err(Refusal::Malformed(
                "both Content-Length and Transfer-Encoding",
            ));
        }
        Ok(())
    }

    /// The rules of the host: one `Host` (none only with an authority in the target,
    /// or before HTTP/1.1), and it and the target's authority host names.
    #[inline]
    fn hosts<B>(&self, request: &Request<B>) -> Result<(), Refusal> {
        match self.host {
            _ if self.hosts > 1 => return Err(Refusal::Malformed("more than one Host header")),
            Some(host) if !is_host(host.as_bytes()) => {
                return Err(Refusal::Malformed("a Host header that is not a host name"));
            }
            None if request.version() == Version::HTTP_11
                && request.uri().authority().is_none() =>
            {
                return Err(Refusal::Malformed("an HTTP/1.1 request without Host"));
            }
            _ => {}
        }
        // The request target's authority (HTTP/2 `:authority`, an HTTP/1.1
        // absolute-form target) is what routes match and what the upstream gets as
        // `Host`: the same rule as for `Host`.
        if let Some(authority) = request.uri().authority()
            && !is_host(authority.as_str().as_bytes())
        {
            return Err(Refusal::Malformed(
                "a request target authority that is not a host name",
            ));
        }
        Ok(())
    }
}

fn has_surrounding_space(value: &[u8]) -> bool {
    let space = |b: Option<&u8>| matches!(b, Some(b' ' | b'\t'));
    space(value.first()) || space(value.last())
}

/// Whether `host` is `name[:port]` as a `Host` header or a request target's
/// authority must be: a host name of letters, digits, `-`, `.` and `_`, or an IP
/// literal in brackets, then a port of digits. Anything else (userinfo, a port that
/// is not a number, a second colon) could name another host to a parser that reads
/// it as an authority than the one routes were matched on.
fn is_host(host: &[u8]) -> bool {
    if host.is_empty() || host.len() > 261 {
        return false;
    }
    let (name_ok, port) = match host.strip_prefix(b"[") {
        Some(literal) => match literal.iter().position(|&b| b == b']') {
            Some(end) => {
                let inside = &literal[..end];
                let ok = !inside.is_empty()
                    && inside
                        .iter()
                        .all(|&b| b.is_ascii_hexdigit() || matches!(b, b':' | b'.'));
                (ok, &literal[end + 1..])
            }
            None => return false,
        },
        None => {
            let end = host.iter().position(|&b| b == b':').unwrap_or(host.len());
            let name = &host[..end];
            let ok = !name.is_empty()
                && name
                    .iter()
                    .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
            (ok, &host[end..])
        }
    };
    let port_ok = match port {
        [] => true,
        [b':', digits @ ..] => digits.len() <= 5 && digits.iter().all(u8::is_ascii_digit),
        _ => false,
    };
    name_ok && port_ok
}

const STANDARD_METHODS: [&str; 9] = [
    "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
];

fn check_method(method: &Method) -> Result<(), Refusal> {
    // The standard methods in their one spelling are constants; only an extension
    // method can be a standard one in another case.
    let text = method.as_str();
    let standard = matches!(
        *method,
        Method::GET
            | Method::HEAD
            | Method::POST
            | Method::PUT
            | Method::DELETE
            | Method::CONNECT
            | Method::OPTIONS
            | Method::TRACE
            | Method::PATCH
    );
    if !standard
        && STANDARD_METHODS
            .iter()
            .any(|name| name.eq_ignore_ascii_case(text))
    {
        return Err(Refusal::Malformed(
            "a standard method in non-standard case (methods are case-sensitive)",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
