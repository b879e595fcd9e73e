//! Step: the budget key of a request on a keyed policy (`key = [...]`).
//!
//! A policy without `key` counts a request under its caller's key. A keyed policy
//! counts it under [`derive`] of its parts, read here from the request (or, for the
//! decision API and `/admin/usage`, from the parts the operator names). Values are
//! bounded ([`MAX_VALUE_BYTES`]) and only their SHA-256 is kept, so neither the
//! counters nor the logs hold raw header or query values; a missing part follows
//! `on_missing`. Bans, strikes and the per-caller concurrency cap stay with the
//! caller: a key decides which budget is spent, not who is hammering.

use std::borrow::Cow;
use std::collections::HashMap;

use http::{HeaderMap, HeaderName, Method, Uri};
use percent_encoding::{AsciiSet, CONTROLS, percent_encode};
use sha2::{Digest, Sha256};

use super::Standing;
use crate::config::PolicyId;
use crate::config::route::Route;
use crate::config::{KeyPart, LimitKey, OnMissing};
use crate::http::refusal::Refusal;
use crate::identity::jwt::Verified;
use crate::snapshot::{PlanLimit, Snapshot};
use crate::store::{CallerKey, Store};

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
pub(super) fn budget_key<'a>(
    snapshot: &Snapshot,
    from: &Sources<'a>,
) -> Result<CallerKey, Refusal> {
    match from.route.policy {
        Some(policy) => policy_budget_key(snapshot, policy, from),
        None => Ok(from.caller),
    }
}

/// Each policy of a route of several policies with the key the request spends its
/// budget under (each policy has its own `key`); empty for a route of one policy.
pub(super) fn stack_keys(
    snapshot: &Snapshot,
    from: &Sources<'_>,
) -> Result<Vec<(PolicyId, CallerKey)>, Refusal> {
    if !from.route.stacked() {
        return Ok(Vec::new());
    }
    (from.route.policies.iter())
        .map(|&policy| Ok((policy, policy_budget_key(snapshot, policy, from)?)))
        .collect()
}

/// The key the request spends `policy`'s budget under.
fn policy_budget_key<'a>(
    snapshot: &Snapshot,
    policy: PolicyId,
    from: &Sources<'a>,
) -> Result<CallerKey, Refusal> {
    let Some(key) = snapshot.policy_key(policy) else {
        return Ok(from.caller);
    };
    derive(key, |part| part_value(part, from), from.ip).map_err(refusal)
}

/// What the request holds of key part `part`.
fn part_value<'a>(part: &KeyPart, from: &Sources<'a>) -> PartValue<'a> {
    let one = |value: Option<Cow<'a, [u8]>>| value.map_or(PartValue::Missing, PartValue::One);
    match part {
        KeyPart::Consumer => PartValue::One(Cow::Owned(from.caller.to_be_bytes().to_vec())),
        KeyPart::Ip => PartValue::One(Cow::Owned(from.ip.to_be_bytes().to_vec())),
        KeyPart::Header(name) => header_value(from.headers, name),
        KeyPart::Claim(name) => one(from.token.and_then(|t| t.claim(name)).map(Cow::Owned)),
        KeyPart::Path(n) => one(segment(from.path, *n).map(|s| Cow::Borrowed(s.as_bytes()))),
        KeyPart::Query(name) => query_value(from.uri.query(), name),
        KeyPart::Route => PartValue::One(Cow::Borrowed(from.route.name.as_bytes())),
        KeyPart::Method => PartValue::One(Cow::Borrowed(from.method.as_str().as_bytes())),
    }
}

/// Notes the parts of the keyed buckets the request was decided in (its route's
/// policy, or each policy of a stacked route), so the usage export can name them.
/// A policy without `key`, and a request `on_missing = "ip"` counted as its client
/// IP, have no keyed bucket.
pub(super) fn name_buckets(
    store: &Store,
    snapshot: &Snapshot,
    from: &Sources<'_>,
    standing: Standing<'_>,
) {
    let Some(policy) = from.route.policy else {
        return;
    };
    let (caller, now_ms, stack) = (standing.caller, standing.now_ms, standing.stack);
    let one = [(policy, standing.budget)];
    let buckets = if stack.is_empty() { &one[..] } else { stack };
    for &(policy, bucket) in buckets {
        let Some(key) = snapshot.policy_key(policy) else {
            continue;
        };
        if bucket == from.ip || bucket == from.caller {
            continue;
        }
        let limits = snapshot.limits_for(policy, caller.plan, caller.consumer());
        if let PlanLimit::Limits(limits) = limits {
            store.name(&limits.scope, bucket, now_ms, || parts_text(key, from));
        }
    }
}

/// Characters a key part's name or value is written with as `%XX` in a bucket's
/// parts: those that would end it or start another, and controls.
const ESCAPED: &AsciiSet = &CONTROLS.add(b'%').add(b'&').add(b'=');

/// The parts of the request's bucket under `key`, as the usage export shows them:
/// `header:x-org=acme&path:2=orders` (a name or value's `%`, `&`, `=`, controls and
/// non-ASCII bytes as `%XX`; `consumer` and `ip` by the caller's key in hex, which
/// the export turns into its name; a missing part under `on_missing = "shared"`
/// empty).
pub(crate) fn parts_text(key: &LimitKey, from: &Sources<'_>) -> String {
    let mut text = String::new();
    for part in &key.parts {
        if !text.is_empty() {
            text.push('&');
        }
        let name = part.to_string();
        text.extend(percent_encode(name.as_bytes(), ESCAPED));
        text.push('=');
        match (part, part_value(part, from)) {
            (KeyPart::Consumer, _) => text.push_str(&format!("{:016x}", from.caller)),
            (KeyPart::Ip, _) => text.push_str(&format!("{:016x}", from.ip)),
            (_, PartValue::One(value)) => text.extend(percent_encode(&value, ESCAPED)),
            _ => {}
        }
    }
    text
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
    let value = |part: &KeyPart| -> PartValue<'_> {
        match part {
            KeyPart::Consumer | KeyPart::Ip => {
                PartValue::One(Cow::Owned(caller.to_be_bytes().to_vec()))
            }
            other => match parts.get(&other.to_string()) {
                Some(v) => PartValue::One(Cow::Borrowed(v.as_bytes())),
                None => PartValue::Missing,
            },
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
        KeyError::Repeated(part) => Refusal::LimitKeyRepeated {
            part: part.to_string(),
        },
    }
}

/// The value of header `name`, as the upstream will see it: trimmed, and missing
/// if the request's `Connection` header names it (a hop-by-hop header is removed
/// before the request goes upstream). Two copies are [`PartValue::Repeated`],
/// equal or not: readers differ on which copy they take, and a key that counted
/// the combination would give each spelling of one tenant a budget of its own.
fn header_value<'a>(headers: &'a HeaderMap, name: &HeaderName) -> PartValue<'a> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return PartValue::Missing;
    };
    if values.next().is_some() {
        return PartValue::Repeated;
    }
    if crate::http::rewritten::connection_names(headers, name) {
        return PartValue::Missing;
    }
    PartValue::One(Cow::Borrowed(value.as_bytes().trim_ascii()))
}

/// The `n`-th segment (from 1) of a normalised path.
fn segment(path: &str, n: u16) -> Option<&str> {
    path.split('/').skip(1).nth(usize::from(n) - 1)
}

/// The value of parameter `name` in `query`, decoded as an upstream decodes a form
/// (`%XX` escapes, `+` for a space) in the name and in the value, so that `t=Q1`,
/// `t=%51%31` and `%74=Q%31` are one value. A parameter given twice (`t=a&t=b`,
/// `t=&t=`) is [`PartValue::Repeated`]: upstreams differ on which copy they read.
fn query_value<'q>(query: Option<&'q str>, name: &str) -> PartValue<'q> {
    let Some(query) = query else {
        return PartValue::Missing;
    };
    let mut found = None;
    for pair in query.split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if *form_decode(key) != *name.as_bytes() {
            continue;
        }
        if found.is_some() {
            return PartValue::Repeated;
        }
        found = Some(form_decode(value));
    }
    found.map_or(PartValue::Missing, PartValue::One)
}

/// `text` with `+` read as a space and its `%XX` escapes decoded (one that is not
/// two hex digits stays as sent).
fn form_decode(text: &str) -> Cow<'_, [u8]> {
    if !text.contains(['+', '%']) {
        return Cow::Borrowed(text.as_bytes());
    }
    let spaced: Vec<u8> = text
        .bytes()
        .map(|b| if b == b'+' { b' ' } else { b })
        .collect();
    Cow::Owned(percent_encoding::percent_decode(&spaced).collect())
}

/// The longest part value keyed by; longer is a 400. Tenant ids, org ids, path
/// segments and API versions fit easily.
pub(crate) const MAX_VALUE_BYTES: usize = 256;

/// Why a request has no budget key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyError<'k> {
    /// A part is missing and `on_missing = "deny"`.
    Missing(&'k KeyPart),
    /// A part's value is longer than [`MAX_VALUE_BYTES`].
    TooLong(&'k KeyPart),
    /// A part is sent more than once (a header, a query parameter).
    Repeated(&'k KeyPart),
}

/// What a request holds of one key part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PartValue<'v> {
    /// Nothing, or an empty value.
    Missing,
    One(Cow<'v, [u8]>),
    /// More than one copy: which one counts would depend on who reads them.
    Repeated,
}

/// The limiter key of a request under `key`: `value` reads each part; `ip_key` is
/// the client IP's key, used for `on_missing = "ip"`.
pub(crate) fn derive<'k, 'v>(
    key: &'k LimitKey,
    mut value: impl FnMut(&KeyPart) -> PartValue<'v>,
    ip_key: CallerKey,
) -> Result<CallerKey, KeyError<'k>> {
    let mut hash = Sha256::new_with_prefix(b"limit-key");
    for (index, part) in key.parts.iter().enumerate() {
        // Each part is framed by its position and length: ("ab", "c") != ("a", "bc").
        hash.update([index as u8]);
        match value(part) {
            PartValue::Repeated => return Err(KeyError::Repeated(part)),
            PartValue::One(v) if v.len() > MAX_VALUE_BYTES => return Err(KeyError::TooLong(part)),
            PartValue::One(v) if !v.is_empty() => {
                hash.update([1]);
                hash.update((v.len() as u32).to_be_bytes());
                hash.update(&v);
            }
            _ => match key.on_missing {
                OnMissing::Ip => return Ok(ip_key),
                OnMissing::Deny => return Err(KeyError::Missing(part)),
                OnMissing::Shared => hash.update([0]),
            },
        }
    }
    Ok(crate::identity::digest_key(hash.finalize().into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_and_query_values() {
        let one = |v: &str| PartValue::One(Cow::Owned(v.as_bytes().to_vec()));
        assert_eq!(segment("/v1/orgs/42", 1), Some("v1"));
        assert_eq!(segment("/v1/orgs/42", 3), Some("42"));
        assert_eq!(segment("/v1/orgs/42", 4), None);
        assert_eq!(segment("/", 1), Some(""));
        assert_eq!(query_value(Some("a=1&org=x&b"), "org"), one("x"));
        assert_eq!(query_value(Some("orgs=x"), "org"), PartValue::Missing);
        assert_eq!(query_value(None, "org"), PartValue::Missing);
        // Read as an upstream decodes them.
        for spelled in [
            "org=Q1",
            "org=%51%31",
            "org=Q%31",
            "%6Frg=Q1",
            "o%72g=%51%31",
        ] {
            assert_eq!(query_value(Some(spelled), "org"), one("Q1"), "{spelled}");
        }
        assert_eq!(query_value(Some("org=a+b"), "org"), one("a b"));
        assert_eq!(query_value(Some("org=a%20b"), "org"), one("a b"));
        assert_eq!(query_value(Some("org=a%2Bb"), "org"), one("a+b"));
        assert_eq!(query_value(Some("org=100%"), "org"), one("100%"));
        assert_eq!(query_value(Some("org=%zz"), "org"), one("%zz"));
        // Twice, equal or not, empty or not.
        for twice in ["org=x&org=y", "org=x&org=x", "org=&org=", "org=x&%6Frg=x"] {
            assert_eq!(
                query_value(Some(twice), "org"),
                PartValue::Repeated,
                "{twice}"
            );
        }
    }

    #[test]
    fn a_header_named_in_connection_is_missing_and_two_copies_are_repeated() {
        let tenant = HeaderName::from_static("x-tenant");
        let headers = |pairs: &[(&'static str, &'static str)]| {
            let mut map = HeaderMap::new();
            for (name, value) in pairs {
                map.append(*name, http::HeaderValue::from_static(value));
            }
            map
        };
        let one = |v: &'static str| PartValue::One(Cow::Borrowed(v.as_bytes()));
        let h = headers(&[("x-tenant", " t1 ")]);
        assert_eq!(header_value(&h, &tenant), one("t1"));
        let h = headers(&[("x-tenant", "t1"), ("x-tenant", "t1")]);
        assert_eq!(header_value(&h, &tenant), PartValue::Repeated);
        let h = headers(&[("x-tenant", ""), ("x-tenant", "")]);
        assert_eq!(header_value(&h, &tenant), PartValue::Repeated);
        let h = headers(&[("x-tenant", "t1"), ("connection", "keep-alive, X-Tenant")]);
        assert_eq!(header_value(&h, &tenant), PartValue::Missing);
        let h = headers(&[("x-tenant", "t1"), ("connection", "x-tenants")]);
        assert_eq!(header_value(&h, &tenant), one("t1"));
    }

    fn key(parts: &[KeyPart], on_missing: OnMissing) -> LimitKey {
        LimitKey {
            parts: parts.to_vec(),
            on_missing,
        }
    }

    fn tenant() -> KeyPart {
        KeyPart::Header(http::HeaderName::from_static("x-tenant"))
    }

    fn of<'a>(values: &'a [(&'a KeyPart, &'a str)]) -> impl FnMut(&KeyPart) -> PartValue<'a> {
        |part| match values.iter().find(|(p, _)| *p == part) {
            Some((_, value)) => PartValue::One(Cow::Borrowed(value.as_bytes())),
            None => PartValue::Missing,
        }
    }

    #[test]
    fn a_repeated_part_is_refused_whatever_on_missing_says() {
        let t = tenant();
        for on_missing in [OnMissing::Ip, OnMissing::Deny, OnMissing::Shared] {
            let k = key(std::slice::from_ref(&t), on_missing);
            assert_eq!(
                derive(&k, |_: &KeyPart| PartValue::Repeated, 1),
                Err(KeyError::Repeated(&t))
            );
        }
    }

    #[test]
    fn distinct_combinations_get_distinct_keys() {
        let (t, p) = (tenant(), KeyPart::Path(2));
        let k = key(&[t.clone(), p.clone()], OnMissing::Shared);
        let a = derive(&k, of(&[(&t, "ab"), (&p, "c")]), 7).unwrap();
        let b = derive(&k, of(&[(&t, "a"), (&p, "bc")]), 7).unwrap();
        let a2 = derive(&k, of(&[(&t, "ab"), (&p, "c")]), 7).unwrap();
        assert_ne!(a, b);
        assert_eq!(a, a2);
        assert_ne!(a, 7);
        // Named key space: the top bit is set, as for consumers.
        assert!(a >> 63 == 1);
    }

    #[test]
    fn a_missing_part_follows_on_missing() {
        let t = tenant();
        let by_ip = key(std::slice::from_ref(&t), OnMissing::Ip);
        assert_eq!(derive(&by_ip, of(&[]), 42), Ok(42));
        let deny = key(std::slice::from_ref(&t), OnMissing::Deny);
        assert_eq!(derive(&deny, of(&[]), 42), Err(KeyError::Missing(&t)));
        let shared = key(std::slice::from_ref(&t), OnMissing::Shared);
        let one = derive(&shared, of(&[]), 1).unwrap();
        let other = derive(&shared, of(&[(&t, "")]), 2).unwrap();
        assert_eq!(one, other, "absent and empty share the one bucket");
        assert_ne!(one, derive(&shared, of(&[(&t, "x")]), 1).unwrap());
    }

    #[test]
    fn values_are_bounded() {
        let t = tenant();
        let k = key(std::slice::from_ref(&t), OnMissing::Ip);
        let long = "a".repeat(MAX_VALUE_BYTES + 1);
        assert_eq!(
            derive(&k, of(&[(&t, &long)]), 1),
            Err(KeyError::TooLong(&t))
        );
        let longest = "a".repeat(MAX_VALUE_BYTES);
        assert!(derive(&k, of(&[(&t, &longest)]), 1).is_ok());
    }
}
