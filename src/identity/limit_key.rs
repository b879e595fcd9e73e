//! A policy's limit key: the values of its parts hashed into one limiter key.
//!
//! [`derive`] takes the policy's [`LimitKey`] and a function that reads each part's
//! value (from a proxied request, or from a decision-API body), and returns the key
//! the budget is counted under. Values are bounded ([`MAX_VALUE_BYTES`]) and only
//! their SHA-256 is kept, so neither the counters nor the logs hold raw header or
//! query values. A missing part follows `on_missing`. This module reads no request
//! itself and does not decide anything about limits.

use std::borrow::Cow;

use sha2::{Digest, Sha256};

use super::digest_key;
use crate::config::{KeyPart, LimitKey, OnMissing};
use crate::store::CallerKey;

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
    Ok(digest_key(hash.finalize().into()))
}

#[cfg(test)]
mod tests {
    use super::*;

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
