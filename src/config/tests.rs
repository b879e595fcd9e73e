//! Table tests of the config compiler: what an operator sees for each mistake.

use std::path::Path;

use http::Method;

use super::*;
use crate::limit::{Window, quota};

fn compile(text: &str) -> Result<Config, ConfigError> {
    Config::parse(Path::new("gateway.toml"), text)
}

/// The errors of `text`, rendered as `sluice check` prints them.
fn errors(text: &str) -> Vec<String> {
    match compile(text) {
        Ok(_) => Vec::new(),
        Err(err) => err.errors().map(|d| d.to_string()).collect(),
    }
}

fn warnings(text: &str) -> Vec<String> {
    compile(text)
        .expect("compiles")
        .warnings
        .iter()
        .map(|d| d.to_string())
        .collect()
}

const BASE: &str = r#"
[upstreams.shop]
targets = ["http://127.0.0.1:3000"]

[policies.standard]
anonymous = { per_minute = 10, per_day = 1_000 }
registered = { per_minute = 100 }

[[routes]]
name = "api"
path_prefix = "/api"
upstream = "shop"
policy = "standard"
"#;

#[test]
fn the_shipped_example_compiles_without_errors() {
    let text = include_str!("../../gateway.toml");
    let config = compile(text).expect("gateway.toml compiles");
    assert!(config.routes.iter().any(|r| r.name == "demo"));
    assert_eq!(config.consumers.len(), 1);
}

#[test]
fn defaults_fill_every_optional_setting() {
    let config = compile(BASE).unwrap();
    assert_eq!(
        config.server.startup.listen,
        vec!["0.0.0.0:8080".parse().unwrap()]
    );
    assert_eq!(
        config.server.startup.header_timeout,
        Duration::from_secs(10)
    );
    assert_eq!(config.server.startup.max_header_bytes, 16_384);
    assert_eq!(config.admin.listen, "127.0.0.1:9090".parse().unwrap());
    assert_eq!(config.identity.api_key_header, "x-api-key");
    assert_eq!(config.identity.ipv6_prefix, 64);
    assert_eq!(config.store.max_keys, 1_000_000);
    assert!(matches!(config.day, DayMode::Sliding));
    let quotas = match config.policies[0].rule(PlanId::ANONYMOUS) {
        Some(PlanRule::Limits(quotas)) => quotas.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        quotas,
        vec![quota(Window::Minute, 10), quota(Window::Day, 1000)]
    );
}

#[test]
fn an_unknown_key_is_an_error_with_file_line_and_key() {
    let text = format!("{BASE}\n[server]\nlisten = \"127.0.0.1:8080\"\nheader_timout = \"5s\"\n");
    let errs = errors(&text);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(
        errs[0].starts_with(
            "error: gateway.toml:17: server.header_timout: unknown key `header_timout` \
             (did you mean `header_timeout`?)"
        ),
        "{}",
        errs[0]
    );
}

#[test]
fn a_typo_does_not_hide_the_other_errors_of_its_section() {
    let text = format!(
        "{BASE}\n[server]\nidle_timout = \"5s\"\nmax_header_bytes = \"big\"\n\
         header_timeout = \"5x\"\nmax_uri_bytes = 10\n"
    );
    let errs = errors(&text);
    let expected = [
        "gateway.toml:16: server.idle_timout: unknown key `idle_timout` (did you mean `idle_timeout`?)",
        "gateway.toml:17: server.max_header_bytes: expected an integer, found the string \"big\"",
        "gateway.toml:18: server.header_timeout: invalid duration \"5x\"",
        "gateway.toml:19: server.max_uri_bytes: must be between",
    ];
    assert_eq!(errs.len(), expected.len(), "{errs:#?}");
    for (want, got) in expected.iter().zip(&errs) {
        assert!(got.contains(want), "expected {want}, got {got}");
    }
}

#[test]
fn a_diagnostic_shows_the_line_with_a_caret_under_the_key() {
    let text = format!("{BASE}\n[server]\nidle_timout = \"5s\"\n");
    let err = compile(&text).unwrap_err();
    let rendered = err.errors().next().unwrap().render(false);
    let expected = "error: server.idle_timout: unknown key `idle_timout`\n  \
                    --> gateway.toml:16:1\n   |\n16 | idle_timout = \"5s\"\n   \
                    | ^^^^^^^^^^^ did you mean `idle_timeout`?";
    assert_eq!(rendered.trim_end(), expected);
}

#[test]
fn no_routes_and_tiny_header_limits_are_reported() {
    let no_routes = "[upstreams.shop]\ntargets = [\"http://127.0.0.1:1\"]\n";
    assert!(
        warnings(no_routes)
            .iter()
            .any(|w| w.contains("routes: no routes: every request will get 404")),
        "{:?}",
        warnings(no_routes)
    );
    let tiny = format!("{BASE}\n[server]\nmax_header_bytes = 100\n");
    assert!(
        errors(&tiny)
            .iter()
            .any(|e| e.contains("server.max_header_bytes: must be between 256")),
        "{:?}",
        errors(&tiny)
    );
}

#[test]
fn every_error_is_reported_at_once() {
    let text = r#"
[server]
idle_timeout = "soon"

[upstreams.shop]
targets = ["ftp://x"]

[policies.standard]
anonymous = { per_minute = 0 }
registered = { per_mnute = 5 }

[[routes]]
name = "a"
path_prefix = "/a"
upstream = "nowhere"
policy = "standard"

[[routes]]
name = "b"
path_prefix = "/b"
upstream = "shop"
policy = "missing"
"#;
    let errs = errors(text);
    let expected = [
        (
            "gateway.toml:3: server.idle_timeout",
            "invalid duration \"soon\"",
        ),
        (
            "gateway.toml:6: upstreams.shop.targets[0]",
            "must start with http://",
        ),
        (
            "gateway.toml:9: policies.standard.anonymous.per_minute",
            "must be between 1",
        ),
        (
            "gateway.toml:10: policies.standard.registered.per_mnute",
            "unknown key `per_mnute` (did you mean `per_minute`?)",
        ),
        (
            "gateway.toml:15: routes[0].upstream",
            "unknown upstream \"nowhere\"",
        ),
        (
            "gateway.toml:22: routes[1].policy",
            "unknown policy \"missing\"",
        ),
    ];
    assert_eq!(errs.len(), expected.len(), "{errs:#?}");
    for ((location, reason), err) in expected.iter().zip(&errs) {
        assert!(
            err.contains(location) && err.contains(reason),
            "expected {location}: {reason}, got {err}"
        );
    }
}

#[test]
fn syntax_errors_name_the_line() {
    let errs = errors("[server]\nlisten = \n");
    assert_eq!(errs.len(), 1);
    assert!(errs[0].starts_with("error: gateway.toml:2"), "{}", errs[0]);
}

#[test]
fn a_consumer_cannot_be_on_a_plan_named_after_a_policy_setting() {
    for setting in [
        "total",
        "concurrency",
        "key",
        "on_missing",
        "mode",
        "shadow_headers",
    ] {
        let text =
            format!("{BASE}\n[[consumers]]\nname = \"acme\"\nplan = \"{setting}\"\nkey = \"k1\"\n");
        let errs = errors(&text);
        assert!(
            errs.iter().any(|e| e.contains("consumers[0].plan")
                && e.contains(&format!("\"{setting}\" is a reserved policy key"))),
            "{setting}: {errs:#?}"
        );
    }
}

#[test]
fn cross_checks_catch_missing_plans_and_duplicate_routes() {
    let text = format!(
        r#"{BASE}
[[consumers]]
name = "acme"
plan = "gold"
key = "k1"

[[routes]]
name = "api"
path_prefix = "/other"
upstream = "shop"
"#
    );
    let errs = errors(&text);
    assert!(
        errs.iter().any(|e| e.contains("policies.standard")
            && e.contains("no rule for plan \"gold\" of consumer \"acme\"")),
        "{errs:#?}"
    );
    assert!(
        errs.iter()
            .any(|e| e.contains("routes[1].name") && e.contains("duplicate route name \"api\"")),
        "{errs:#?}"
    );
}

#[test]
fn a_policy_without_an_anonymous_rule_is_an_error_on_a_route() {
    let text = BASE.replace("anonymous = { per_minute = 10, per_day = 1_000 }\n", "");
    let errs = errors(&text);
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert!(errs[0].contains("add anonymous = \"deny\""), "{}", errs[0]);
}

#[test]
fn shadowed_routes_and_plain_keys_are_warnings() {
    let text = format!(
        r#"{BASE}
[[routes]]
name = "api-v1"
path_prefix = "/api/v1"
methods = ["GET"]
upstream = "shop"

[[consumers]]
name = "acme"
key = "plain"
"#
    );
    let warns = warnings(&text);
    assert!(
        warns
            .iter()
            .any(|w| w.contains("route \"api-v1\" is unreachable: route \"api\"")),
        "{warns:#?}"
    );
    assert!(
        warns
            .iter()
            .any(|w| w.contains("consumers[0].key") && w.contains("plain-text key")),
        "{warns:#?}"
    );
}

#[test]
fn a_route_is_not_shadowed_by_a_narrower_method_list() {
    let text = BASE.replace(
        "upstream = \"shop\"\npolicy",
        "methods = [\"POST\"]\nupstream = \"shop\"\npolicy",
    ) + "\n[[routes]]\nname = \"api-all\"\npath_prefix = \"/api\"\nupstream = \"shop\"\n";
    assert!(warnings(&text).is_empty());
}

#[test]
fn deny_plans_totals_and_calendar_days_compile() {
    let text = r#"
[limits]
day = "calendar"
timezone = "Europe/Paris"

[policies.flash_sale]
anonymous = "deny"
registered = { per_second = 1, per_minute = 5 }
total = { per_second = 2_000 }

[[routes]]
name = "orders"
path_prefix = "/orders/"
methods = ["post"]
respond = { status = 201, body = "ok" }
policy = "flash_sale"
"#;
    let config = compile(text).unwrap();
    assert!(matches!(config.day, DayMode::Calendar(_)));
    let policy = &config.policies[0];
    assert_eq!(policy.rule(PlanId::ANONYMOUS), Some(&PlanRule::Deny));
    assert_eq!(policy.total, vec![quota(Window::Second, 2_000)]);
    assert_eq!(config.routes[0].path_prefix, "/orders");
    assert_eq!(config.routes[0].methods, Some(vec![Method::POST]));
}

#[test]
fn bad_values_in_global_sections_are_errors() {
    let text = r#"
[limits]
day = "calendar"
timezone = "Mars/Olympus"

[identity]
trusted_proxies = ["10.0.0.0/33"]
ipv6_prefix = 200

[store]
backend = "etcd"

[admin]
token = "env:SLUICE_TEST_TOKEN_THAT_IS_NOT_SET"

[wat]
x = 1
"#;
    let errs = errors(text);
    for needle in [
        "limits.timezone: unknown IANA time zone \"Mars/Olympus\"",
        "identity.trusted_proxies[0]",
        "identity.ipv6_prefix: must be between 1 and 128",
        "store.backend: unknown backend \"etcd\"",
        "admin.token: environment variable SLUICE_TEST_TOKEN_THAT_IS_NOT_SET",
        "wat: unknown section",
    ] {
        assert!(
            errs.iter().any(|e| e.contains(needle)),
            "missing {needle}: {errs:#?}"
        );
    }
}

#[test]
fn a_ban_section_turns_automatic_bans_on_with_its_defaults() {
    assert_eq!(compile(BASE).unwrap().ban.automatic, None);
    let text = format!("{BASE}\n[ban]\n");
    let ban = compile(&text).unwrap().ban;
    let auto = ban.automatic.unwrap();
    assert_eq!(
        (
            auto.after.get(),
            auto.within,
            auto.duration,
            auto.escalate,
            ban.max_bans
        ),
        (
            50,
            Duration::from_secs(60),
            Duration::from_secs(600),
            true,
            100_000
        )
    );
    let text = format!("{BASE}\n[ban]\nafter = 0\nduration = \"2d\"\nescalat = true\n");
    let errs = errors(&text);
    assert!(errs.iter().any(|e| e.contains("escalat")), "{errs:#?}");
    let text = format!("{BASE}\n[ban]\nafter = 0\nduration = \"48h\"\n");
    let errs = errors(&text);
    assert!(errs.iter().any(|e| e.contains("ban.after")), "{errs:#?}");
    assert!(
        errs.iter()
            .any(|e| e.contains("ban.duration: must be at most 24h")),
        "{errs:#?}"
    );
}

#[test]
fn the_redis_backend_needs_a_url_and_a_known_on_error_mode() {
    let text = format!("{BASE}\n[store]\nbackend = \"redis\"\non_error = \"maybe\"\n");
    let errs = errors(&text);
    assert!(
        errs.iter()
            .any(|e| e.contains("store.url: the redis backend needs url")),
        "{errs:#?}"
    );
    assert!(
        errs.iter()
            .any(|e| e.contains("store.on_error: unknown mode \"maybe\"")),
        "{errs:#?}"
    );
    let text = format!(
        "{BASE}\n[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:6390/0\"\non_error = \"deny\"\ntimeout = \"20ms\"\n"
    );
    let config = compile(&text).unwrap();
    assert_eq!(
        config.store.backend,
        Backend::Redis {
            target: RedisTarget::Server("redis://127.0.0.1:6390/0".to_string()),
            on_error: OnError::Deny,
            timeout: Duration::from_millis(20),
            ca_file: None,
            wait_replicas: 0,
        }
    );
    let text = format!("{BASE}\n[store]\nurl = \"redis://x\"\n");
    assert!(
        warnings(&text)
            .iter()
            .any(|w| w.contains("only used by the redis backend"))
    );
}

#[test]
fn a_redis_url_the_client_cannot_use_is_an_error_not_a_silent_memory_store() {
    for (url, why) in [
        ("http://127.0.0.1:6379", "is not a redis:// URL"),
        ("redis://127.0.0.1:6379/notanumber", "cannot be used"),
    ] {
        let text = format!("{BASE}\n[store]\nbackend = \"redis\"\nurl = \"{url}\"\n");
        let errs = errors(&text);
        assert!(
            errs.iter()
                .any(|e| e.contains("store.url") && e.contains(why)),
            "{url}: {errs:#?}"
        );
    }
    // Managed Redis speaks TLS: rediss:// URLs are usable.
    let text = format!(
        "{BASE}\n[store]\nbackend = \"redis\"\nurl = \"rediss://user:pw@redis.example:6380/0\"\n"
    );
    assert!(errors(&text).is_empty(), "{:#?}", errors(&text));
}

#[test]
fn a_route_host_is_read_like_a_request_host() {
    for (written, kept) in [
        ("Shop.Example.com", "shop.example.com"),
        ("shop.example.com:8443", "shop.example.com"),
        ("shop.example.com.", "shop.example.com"),
        ("[::1]:8080", "[::1]"),
        ("[::1]", "[::1]"),
    ] {
        let text = format!(
            "[[routes]]\nname = \"h\"\nhost = \"{written}\"\npath_prefix = \"/h\"\nrespond = {{ status = 200 }}\n"
        );
        let config = compile(&text).unwrap_or_else(|err| panic!("{written}: {err}"));
        assert_eq!(config.routes[0].host.as_deref(), Some(kept), "{written}");
        assert_eq!(
            crate::config::route::host_of(written.to_ascii_lowercase().as_str()),
            kept
        );
    }
}

#[test]
fn a_key_hash_is_exactly_64_hex_digits() {
    let digits = "8649cdebee753898fd50e01408a9e438aa5090249bc3e51b65f33dce973b0873";
    let hash = ConsumerConfig::key_hash(digits).expect("64 hex digits");
    assert_eq!(hash[0], 0x86);
    assert_eq!(hash[31], 0x73);
    assert_eq!(
        ConsumerConfig::key_hash(&format!("  {digits}\n")),
        Some(hash)
    );
    assert_eq!(ConsumerConfig::key_hash(&digits.to_uppercase()), Some(hash));
    for wrong in [
        &digits[1..],
        &format!("{digits}0")[..],
        &format!("0x{}", &digits[2..])[..],
        &format!("0x{digits}")[..],
        &format!("{}g", &digits[1..])[..],
        "",
    ] {
        assert_eq!(ConsumerConfig::key_hash(wrong), None, "{wrong:?}");
    }
}
