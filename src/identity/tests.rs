//! Table tests of identification: keys, forwarding headers, limiter keys.

use super::*;
use crate::config::Config;
use std::path::Path;

fn identifier(extra: &str) -> Identifier {
    let text = format!(
        r#"
        [identity]
        trusted_proxies = ["10.0.0.0/8", "127.0.0.1"]
        {extra}
        [[consumers]]
        name = "acme"
        key = "secret-acme"
        plan = "gold"
        "#
    );
    Identifier::new(&Config::parse(Path::new("t.toml"), &text).unwrap())
}

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.append(HeaderName::try_from(*name).unwrap(), value.parse().unwrap());
    }
    map
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

#[test]
fn keys_identify_consumers_from_either_header() {
    let id = identifier("");
    let by_header = id
        .identify(&headers(&[("x-api-key", "secret-acme")]), ip("1.1.1.1"))
        .unwrap();
    assert_eq!(by_header.kind, CallerKind::Consumer(ConsumerId::new(0)));
    assert_eq!(by_header.plan, PlanId(1));
    let by_bearer = id
        .identify(
            &headers(&[("authorization", "Bearer secret-acme")]),
            ip("1.1.1.1"),
        )
        .unwrap();
    assert_eq!(by_bearer.kind, CallerKind::Consumer(ConsumerId::new(0)));
    let lower = id
        .identify(
            &headers(&[("authorization", "bearer secret-acme")]),
            ip("1.1.1.1"),
        )
        .unwrap();
    assert_eq!(lower.kind, CallerKind::Consumer(ConsumerId::new(0)));
}

#[test]
fn unknown_or_empty_keys_are_errors_not_anonymous() {
    let id = identifier("");
    for value in ["nope", "", "secret-acm"] {
        assert_eq!(
            id.identify(&headers(&[("x-api-key", value)]), ip("1.1.1.1")),
            Err(IdentityError::UnknownKey),
            "{value:?}"
        );
    }
    assert_eq!(
        id.identify(&headers(&[("authorization", "Bearer nope")]), ip("1.1.1.1")),
        Err(IdentityError::UnknownKey)
    );
    let basic = id
        .identify(
            &headers(&[("authorization", "Basic Zm9vOmJhcg==")]),
            ip("1.1.1.1"),
        )
        .unwrap();
    assert_eq!(basic.kind, CallerKind::Anonymous);
}

#[test]
fn forwarded_for_is_believed_only_from_trusted_proxies() {
    let id = identifier("");
    let xff = headers(&[("x-forwarded-for", "6.6.6.6, 7.7.7.7")]);
    // An untrusted peer's header is ignored.
    assert_eq!(id.client_ip(&xff, ip("8.8.8.8")), ip("8.8.8.8"));
    // From a trusted proxy, the rightmost untrusted entry is the client.
    assert_eq!(id.client_ip(&xff, ip("10.1.2.3")), ip("7.7.7.7"));
    let chain = headers(&[("x-forwarded-for", "6.6.6.6, 7.7.7.7, 10.9.9.9")]);
    assert_eq!(id.client_ip(&chain, ip("127.0.0.1")), ip("7.7.7.7"));
    let split = headers(&[
        ("x-forwarded-for", "6.6.6.6"),
        ("x-forwarded-for", "10.0.0.2"),
    ]);
    assert_eq!(id.client_ip(&split, ip("10.0.0.1")), ip("6.6.6.6"));
    let garbled = headers(&[("x-forwarded-for", "6.6.6.6, nonsense")]);
    assert_eq!(id.client_ip(&garbled, ip("10.0.0.1")), ip("10.0.0.1"));
    let ports = headers(&[("x-forwarded-for", "[2001:db8::1]:443, 5.5.5.5:80")]);
    assert_eq!(id.client_ip(&ports, ip("10.0.0.1")), ip("5.5.5.5"));
    let forwarded = headers(&[(
        "forwarded",
        "for=192.0.2.60;proto=http, for=\"[2001:db8::2]\"",
    )]);
    assert_eq!(id.client_ip(&forwarded, ip("10.0.0.1")), ip("2001:db8::2"));
    let mapped = headers(&[("x-forwarded-for", "::ffff:9.9.9.9")]);
    assert_eq!(id.client_ip(&mapped, ip("::ffff:10.0.0.1")), ip("9.9.9.9"));
}

#[test]
fn ipv6_callers_are_keyed_per_prefix_and_mapped_ipv4_as_ipv4() {
    assert_eq!(
        ip_key(ip("2001:db8:1:2:aaaa::1"), 64),
        ip_key(ip("2001:db8:1:2:bbbb::9"), 64)
    );
    assert_ne!(
        ip_key(ip("2001:db8:1:2::1"), 64),
        ip_key(ip("2001:db8:1:3::1"), 64)
    );
    assert_ne!(
        ip_key(ip("2001:db8:1:2::1"), 128),
        ip_key(ip("2001:db8:1:2::2"), 128)
    );
    assert_eq!(ip_key(ip("::ffff:1.2.3.4"), 64), ip_key(ip("1.2.3.4"), 64));
    assert_ne!(ip_key(ip("1.2.3.4"), 64), ip_key(ip("1.2.3.5"), 64));
    assert_ne!(name_key("consumer:acme"), ip_key(ip("1.2.3.4"), 64));
    assert_ne!(name_key("consumer:acme"), name_key("consumer:acme2"));
    assert_eq!(named_consumer_key("acme"), name_key("consumer:acme"));
}
