//! Step: the budget key of a request on a keyed policy (`key = [...]`).
//!
//! A policy without `key` counts a request under its caller's key. A keyed policy
//! counts it under [`crate::identity::limit_key::derive`] of its parts, read here from
//! the request (or, for the decision API and `/admin/usage`, from the parts the
//! operator names). Bans, strikes and the per-caller concurrency cap stay with the
//! caller: a key decides which budget is spent, not who is hammering.

use std::borrow::Cow;
use std::collections::HashMap;

use http::{HeaderMap, HeaderName, Method, Uri};

use crate::config::KeyPart;
use crate::identity::jwt::Verified;
use crate::identity::limit_key::{KeyError, derive};
use crate::refusal::Refusal;
use crate::route::Route;
use crate::snapshot::{PolicyId, Snapshot};
use crate::store::CallerKey;

/// What a proxied request offers a limit key.
pub(super) struct Sources<'a> {
    pub route: &'a Route,
    pub method: &'a Method,
    pub headers: &'a HeaderMap,
    pub uri: &'a Uri,
    /// The normalised path.
    pub path: &'a str,
    /// The caller's limiter key, and its client IP's.
    pub caller: CallerKey,
    pub ip: CallerKey,
    /// The caller's verified JWT, for `claim:` parts.
    pub token: Option<&'a Verified>,
}

/// The key the request spends its route's budget under.
pub(super) fn budget_key(snapshot: &Snapshot, from: &Sources<'_>) -> Result<CallerKey, Refusal> {
    let Some(policy) = from.route.policy else {
        return Ok(from.caller);
    };
    let Some(key) = snapshot.policy_key(policy) else {
        return Ok(from.caller);
    };
    let value = |part: &KeyPart| -> Option<Cow<'_, [u8]>> {
        match part {
            KeyPart::Consumer => Some(Cow::Owned(from.caller.to_be_bytes().to_vec())),
            KeyPart::Ip => Some(Cow::Owned(from.ip.to_be_bytes().to_vec())),
            KeyPart::Header(name) => header_value(from.headers, name),
            KeyPart::Claim(name) => from.token.and_then(|t| t.claim(name)).map(Cow::Owned),
            KeyPart::Path(n) => segment(from.path, *n).map(|s| Cow::Borrowed(s.as_bytes())),
            KeyPart::Query(name) => query_value(from.uri.query(), name).map(Cow::Owned),
            KeyPart::Route => Some(Cow::Borrowed(from.route.name.as_bytes())),
            KeyPart::Method => Some(Cow::Borrowed(from.method.as_str().as_bytes())),
        }
    };
    derive(key, value, from.ip).map_err(refusal)
}

/// The key a caller named by the admin API spends `policy`'s budget under, with the
/// key parts in `parts` (`"header:x-tenant-id"` -> `"t1"`; `route` and `method` too).
/// `caller` stands for both `consumer` and `ip`, and for a missing part under
/// `on_missing = "ip"`.
pub(crate) fn named_budget_key(
    snapshot: &Snapshot,
    policy: PolicyId,
    caller: CallerKey,
    parts: &HashMap<String, String>,
) -> Result<CallerKey, Refusal> {
    let Some(key) = snapshot.policy_key(policy) else {
        return Ok(caller);
    };
    let value = |part: &KeyPart| -> Option<Cow<'_, [u8]>> {
        match part {
            KeyPart::Consumer | KeyPart::Ip => Some(Cow::Owned(caller.to_be_bytes().to_vec())),
            other => parts
                .get(&other.to_string())
                .map(|v| Cow::Borrowed(v.as_bytes())),
        }
    };
    derive(key, value, caller).map_err(refusal)
}

fn refusal(err: KeyError<'_>) -> Refusal {
    match err {
        KeyError::Missing(part) => Refusal::LimitKeyMissing {
            part: part.to_string(),
        },
        KeyError::TooLong(part) => Refusal::LimitKeyTooLong {
            part: part.to_string(),
        },
    }
}

/// Every value of header `name`, joined by a newline (which no value can hold), so
/// a repeated header is its own combination rather than whichever copy comes first.
fn header_value<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Option<Cow<'a, [u8]>> {
    let mut values = headers.get_all(name).iter();
    let first = values.next()?.as_bytes().trim_ascii();
    let Some(second) = values.next() else {
        return Some(Cow::Borrowed(first));
    };
    let mut joined = first.to_vec();
    for value in std::iter::once(second).chain(values) {
        joined.push(b'\n');
        joined.extend_from_slice(value.as_bytes().trim_ascii());
    }
    Some(Cow::Owned(joined))
}

/// The `n`-th segment (from 1) of a normalised path.
fn segment(path: &str, n: u16) -> Option<&str> {
    path.split('/').skip(1).nth(usize::from(n) - 1)
}

/// Every value of parameter `name` in `query`, as sent, joined by `&` (which no
/// value can hold): upstreams differ on which copy of a repeated parameter they read.
fn query_value(query: Option<&str>, name: &str) -> Option<Vec<u8>> {
    let mut found: Option<Vec<u8>> = None;
    for pair in query?.split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if key == name {
            match &mut found {
                None => found = Some(value.as_bytes().to_vec()),
                Some(joined) => {
                    joined.push(b'&');
                    joined.extend_from_slice(value.as_bytes());
                }
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_and_query_values() {
        assert_eq!(segment("/v1/orgs/42", 1), Some("v1"));
        assert_eq!(segment("/v1/orgs/42", 3), Some("42"));
        assert_eq!(segment("/v1/orgs/42", 4), None);
        assert_eq!(segment("/", 1), Some(""));
        assert_eq!(query_value(Some("a=1&org=x&b"), "org"), Some(b"x".to_vec()));
        assert_eq!(
            query_value(Some("org=x&org=y"), "org"),
            Some(b"x&y".to_vec())
        );
        assert_eq!(query_value(Some("orgs=x"), "org"), None);
        assert_eq!(query_value(None, "org"), None);
    }
}
