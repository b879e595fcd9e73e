//! A policy's `key = [...]` and `on_missing`: what one budget belongs to.
//!
//! Parsed here into [`LimitKey`]; the value of each part is read from a request, and
//! hashed into a limiter key, by admission's budget step (`crate::admission`).

use toml::de::DeValue;

use super::diagnostic::Diagnostics;
use super::recover::Value;

/// The longest `header:`/`query:`/`claim:` name accepted.
const MAX_NAME: usize = 128;

/// One part of a limit key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPart {
    /// The caller: its consumer, or its client IP when anonymous.
    Consumer,
    /// The client IP (IPv6 per `ipv6_prefix`).
    Ip,
    /// A request header's value (the name lower-cased).
    Header(http::HeaderName),
    /// A claim of the caller's verified JWT.
    Claim(String),
    /// The N-th segment (from 1) of the normalised path.
    Path(u16),
    /// A query parameter's value, decoded as a form is (`%XX`, `+`).
    Query(String),
    /// The route's name.
    Route,
    /// The request method.
    Method,
}

impl std::fmt::Display for KeyPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyPart::Consumer => f.write_str("consumer"),
            KeyPart::Ip => f.write_str("ip"),
            KeyPart::Header(name) => write!(f, "header:{name}"),
            KeyPart::Claim(name) => write!(f, "claim:{name}"),
            KeyPart::Path(n) => write!(f, "path:{n}"),
            KeyPart::Query(name) => write!(f, "query:{name}"),
            KeyPart::Route => f.write_str("route"),
            KeyPart::Method => f.write_str("method"),
        }
    }
}

/// What a request that lacks a part of the key is counted as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnMissing {
    /// By its client IP, as an anonymous caller is (the default): never a bucket
    /// shared by everyone.
    Ip,
    /// 401: the request must carry every part.
    Deny,
    /// The missing part counts as one value: one bucket for all such requests.
    Shared,
}

/// A policy's `key` and `on_missing`; absent (or `["consumer"]`), a budget is the
/// caller's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitKey {
    /// The parts, in the order written; a budget per distinct combination.
    pub parts: Vec<KeyPart>,
    /// `on_missing` (default `"ip"`).
    pub on_missing: OnMissing,
}

/// Parses `key = [...]`. The request id header (`[log] request_id_header`) is no
/// part: every request carries its own id (or gets a new one), so it would give each
/// request a budget of its own.
pub(super) fn parse_key(
    d: &mut Diagnostics,
    key: &str,
    value: Value,
    request_id_header: &http::HeaderName,
) -> Option<Vec<KeyPart>> {
    let span = value.span();
    let DeValue::Array(items) = value.into_inner() else {
        d.error(
            Some(span),
            key,
            "expected a list such as [\"consumer\", \"path:2\"]",
        );
        return None;
    };
    let mut parts = Vec::new();
    for item in items {
        let span = item.span();
        let Some(text) = item.get_ref().as_str() else {
            d.error(Some(span), key, "each part is a string");
            return None;
        };
        match parse_part(text) {
            Ok(part) if parts.contains(&part) => {
                d.error(Some(span), key, format!("\"{text}\" is listed twice"));
            }
            Ok(KeyPart::Header(name)) if name == *request_id_header => d.error(
                Some(span),
                key,
                format!(
                    "\"{text}\": {name} is the request id header ([log] request_id_header), \
                     new for every request, so each request would get a budget of its own"
                ),
            ),
            Ok(part) => parts.push(part),
            Err(reason) => d.error(Some(span), key, format!("\"{text}\": {reason}")),
        }
    }
    if parts.is_empty() {
        d.error(Some(span), key, "needs at least one part");
        return None;
    }
    Some(parts)
}

fn parse_part(text: &str) -> Result<KeyPart, String> {
    let named = |name: &str| match name.len() {
        0 => Err("needs a name after ':'".to_string()),
        n if n > MAX_NAME => Err(format!("names are at most {MAX_NAME} bytes")),
        _ => Ok(name.to_string()),
    };
    match text.split_once(':') {
        None => match text {
            "consumer" => Ok(KeyPart::Consumer),
            "ip" => Ok(KeyPart::Ip),
            "route" => Ok(KeyPart::Route),
            "method" => Ok(KeyPart::Method),
            _ => Err(PARTS.to_string()),
        },
        Some(("header", name)) => {
            let name = named(name)?;
            match http::HeaderName::try_from(name.to_ascii_lowercase()) {
                Ok(header) if crate::http::rewritten::is_rewritten(header.as_str()) => {
                    Err(format!(
                        "sluice rewrites or removes {header} before the upstream sees it, so a \
                     client could name any budget with it (the client address is \"ip\")"
                    ))
                }
                Ok(header) if !name.contains('_') => Ok(KeyPart::Header(header)),
                _ => Err("not a header name (letters, digits and '-')".to_string()),
            }
        }
        Some(("claim", name)) => Ok(KeyPart::Claim(named(name)?)),
        Some(("query", name)) => Ok(KeyPart::Query(named(name)?)),
        Some(("path", n)) => match n.parse::<u16>() {
            Ok(n) if (1..=64).contains(&n) => Ok(KeyPart::Path(n)),
            _ => Err("path:N takes a segment number from 1 to 64".to_string()),
        },
        Some(_) => Err(PARTS.to_string()),
    }
}

const PARTS: &str = "unknown part (expected consumer, ip, header:NAME, claim:NAME, path:N, query:NAME, route or method)";

/// Parses `on_missing`.
pub(super) fn parse_on_missing(d: &mut Diagnostics, key: &str, value: Value) -> Option<OnMissing> {
    let span = value.span();
    match value.get_ref().as_str() {
        Some("ip") => Some(OnMissing::Ip),
        Some("deny") => Some(OnMissing::Deny),
        Some("shared") => Some(OnMissing::Shared),
        _ => {
            d.error(Some(span), key, "expected \"ip\", \"deny\" or \"shared\"");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_parse_and_bad_ones_say_why() {
        assert_eq!(parse_part("consumer"), Ok(KeyPart::Consumer));
        assert_eq!(parse_part("path:2"), Ok(KeyPart::Path(2)));
        assert_eq!(
            parse_part("header:X-Tenant-Id"),
            Ok(KeyPart::Header(http::HeaderName::from_static(
                "x-tenant-id"
            )))
        );
        assert_eq!(parse_part("query:org"), Ok(KeyPart::Query("org".into())));
        assert_eq!(
            parse_part("claim:org_id"),
            Ok(KeyPart::Claim("org_id".into()))
        );
        for bad in [
            "path:0",
            "path:x",
            "header:",
            "header:a b",
            "header:x_t",
            "user",
            "cookie:a",
            "header:X-Forwarded-For",
            "header:forwarded",
            "header:x-real-ip",
            "header:connection",
            "header:te",
        ] {
            assert!(parse_part(bad).is_err(), "{bad}");
        }
        assert!(
            parse_part("header:x-real-ip")
                .unwrap_err()
                .contains("rewrites or removes x-real-ip")
        );
        assert_eq!(
            parse_part("header:X-Tenant-Id").unwrap().to_string(),
            "header:x-tenant-id"
        );
    }
}
