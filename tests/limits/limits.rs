//! End-to-end rate limiting: who the caller is, which budget a request spends,
//! what a limited caller is told. Time only moves through the manual clock.

use crate::support;

use support::{Req, Resp, Toml, gateway, gateway_at, ms, route, upstream};

const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";
use support::ACME_SHA256;

fn demo_route(policy: &str) -> String {
    Toml::new()
        .route(
            route("demo", "/demo")
                .respond(200, "hello from sluice\n")
                .policy(policy),
        )
        .build()
}

#[track_caller]
fn assert_ok(resp: &Resp) {
    assert_eq!(resp.status, 200, "body: {}", resp.text());
}

#[track_caller]
fn assert_limited(resp: &Resp) -> serde_json::Value {
    let json = resp.problem(429);
    assert_eq!(json["type"], QUOTA_EXCEEDED, "{json}");
    assert_eq!(json["title"], "Too Many Requests", "{json}");
    json
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anonymous_caller_gets_exactly_the_minute_limit_then_a_precise_429() {
    let gw = gateway(&format!(
        r#"
        [policies.standard]
        anonymous = {{ per_minute = 5 }}
        {}
        "#,
        demo_route("standard")
    ))
    .await;

    // Five requests two seconds apart: all admitted, `r` counting down.
    for i in 0..5 {
        let resp = gw.get("/demo").await;
        assert_ok(&resp);
        assert_eq!(resp.text(), "hello from sluice\n");
        assert_eq!(
            resp.header("ratelimit-policy"),
            Some("\"minute\";q=5;w=60"),
            "request {i}"
        );
        assert_eq!(
            resp.sf_param("ratelimit", "minute", "r"),
            Some(4 - i),
            "request {i}: {:?}",
            resp.header("ratelimit")
        );
        let t = resp.sf_param("ratelimit", "minute", "t").unwrap();
        assert!((1..=61).contains(&t), "t={t} must be when quota comes back");
        gw.advance_secs(2);
    }

    // The sixth, at +10 s, is refused: the first request leaves the window at +60 s.
    let limited = gw.get("/demo").await;
    let json = assert_limited(&limited);
    assert_eq!(json["violated-policies"], serde_json::json!(["minute"]));
    assert_eq!(
        json["detail"], "per_minute limit of 5 for plan anonymous on route demo",
        "the detail names the limit"
    );
    assert_eq!(
        limited.header("ratelimit-policy"),
        Some("\"minute\";q=5;w=60")
    );
    assert_eq!(limited.sf_param("ratelimit", "minute", "r"), Some(0));
    let retry_after = limited.retry_after();
    assert!(
        (50..=51).contains(&retry_after),
        "Retry-After {retry_after}: the oldest request leaves the window 50 s from now \
         (51 with 1 s buckets)"
    );
    assert_eq!(
        limited.sf_param("ratelimit", "minute", "t"),
        Some(retry_after as i64),
        "RateLimit t of a refused request is its Retry-After"
    );

    // Still refused one second early, with a non-zero Retry-After.
    gw.advance_secs(retry_after - 1);
    let early = gw.get("/demo").await;
    assert_limited(&early);
    assert_eq!(early.retry_after(), 1, "one second left");

    // Admitted exactly when Retry-After said; refused requests were not counted.
    gw.advance_secs(1);
    let admitted = gw.get("/demo").await;
    assert_ok(&admitted);
    assert_eq!(admitted.sf_param("ratelimit", "minute", "r"), Some(0));
    // ... and the next one is refused again (the other four still count).
    assert_limited(&gw.get("/demo").await);
}

/// A refusal's headers are sluice's own: none of the request's (a forged
/// `Retry-After`, `RateLimit` or `Content-Type`, a `Set-Cookie`) comes back in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_carries_its_own_headers_and_none_of_the_request() {
    let gw = gateway(&format!(
        r#"
        [policies.standard]
        anonymous = {{ per_minute = 1 }}
        {}
        "#,
        demo_route("standard")
    ))
    .await;
    let evil = |req: Req| {
        req.header("x-echo-me", "from-the-client")
            .header("set-cookie", "session=stolen")
            .header("content-type", "text/html")
            .header("retry-after", "9999")
            .header("ratelimit", "\"minute\";r=1000;t=1")
            .header("www-authenticate", "Basic")
    };
    assert_ok(&evil(Req::get("/demo")).send(gw.addr).await);
    let refused = [
        (evil(Req::get("/demo")).send(gw.addr).await, 429),
        (
            evil(Req::get("/demo").header("x-api-key", "no-such-key"))
                .send(gw.addr)
                .await,
            401,
        ),
        (evil(Req::get("/elsewhere")).send(gw.addr).await, 404),
    ];
    for (resp, status) in refused {
        resp.problem(status);
        let mut names: Vec<&str> = resp.headers.keys().map(|n| n.as_str()).collect();
        names.sort_unstable();
        let expected: &[&str] = match status {
            429 => &[
                "content-length",
                "content-type",
                "date",
                "ratelimit",
                "ratelimit-policy",
                "retry-after",
                "x-request-id",
            ],
            401 => &[
                "content-length",
                "content-type",
                "date",
                "www-authenticate",
                "x-request-id",
            ],
            _ => &["content-length", "content-type", "date", "x-request-id"],
        };
        assert_eq!(names, expected, "{status}: {:?}", resp.headers);
        for name in [
            "content-type",
            "retry-after",
            "ratelimit",
            "www-authenticate",
        ] {
            assert!(
                resp.headers.get_all(name).iter().count() <= 1,
                "{status}: {name} twice"
            );
        }
        assert_eq!(
            resp.header("content-type"),
            Some("application/problem+json")
        );
        assert_ne!(resp.header("retry-after"), Some("9999"));
        assert_ne!(resp.header("www-authenticate"), Some("Basic"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_is_never_zero_and_a_burst_recovers_after_one_window() {
    let gw = gateway(&format!(
        r#"
        [policies.p]
        anonymous = {{ per_minute = 3 }}
        {}
        "#,
        demo_route("p")
    ))
    .await;
    for _ in 0..3 {
        assert_ok(&gw.get("/demo").await);
    }
    let first = gw.get("/demo").await;
    assert_limited(&first);
    let retry_after = first.retry_after();
    assert!(retry_after >= 1);
    // Walk up to the admission second by second: every refusal says when to come back.
    for waited in 1..retry_after {
        gw.advance_secs(1);
        let resp = gw.get("/demo").await;
        assert_limited(&resp);
        assert_eq!(
            resp.retry_after(),
            retry_after - waited,
            "after waiting {waited} s"
        );
    }
    gw.advance_secs(1);
    for left in [2, 1, 0] {
        let resp = gw.get("/demo").await;
        assert_ok(&resp);
        assert_eq!(resp.sf_param("ratelimit", "minute", "r"), Some(left));
    }
    assert_limited(&gw.get("/demo").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calendar_day_resets_at_local_midnight_of_the_configured_zone() {
    // 00:30 in Paris is 23:30 UTC the day before.
    let start = ms("2026-01-15T00:30:00+01:00");
    let gw = gateway_at(
        &format!(
            r#"
            [limits]
            day = "calendar"
            timezone = "Europe/Paris"
            [policies.daily]
            anonymous = {{ per_day = 3 }}
            {}
            "#,
            demo_route("daily")
        ),
        start,
    )
    .await;

    for left in [2, 1, 0] {
        let resp = gw.get("/demo").await;
        assert_ok(&resp);
        assert_eq!(resp.header("ratelimit-policy"), Some("\"day\";q=3;w=86400"));
        assert_eq!(resp.sf_param("ratelimit", "day", "r"), Some(left));
    }
    let limited = gw.get("/demo").await;
    let json = assert_limited(&limited);
    assert_eq!(json["violated-policies"], serde_json::json!(["day"]));
    let midnight_paris = ms("2026-01-16T00:00:00+01:00");
    assert_eq!(
        limited.retry_after(),
        (midnight_paris - start) / 1000,
        "Retry-After must point at local midnight in Paris"
    );

    // UTC midnight passes (01:00 in Paris): no reset.
    gw.set_ms(ms("2026-01-15T00:00:30Z"));
    assert_limited(&gw.get("/demo").await);
    // One second before Paris midnight: still exhausted.
    gw.set_ms(midnight_paris - 1_000);
    let last = gw.get("/demo").await;
    assert_limited(&last);
    assert_eq!(last.retry_after(), 1);
    // Paris midnight: a fresh day.
    gw.set_ms(midnight_paris);
    for left in [2, 1, 0] {
        let resp = gw.get("/demo").await;
        assert_ok(&resp);
        assert_eq!(resp.sf_param("ratelimit", "day", "r"), Some(left));
    }
    assert_limited(&gw.get("/demo").await);
}

fn keyed_config(anonymous: &str) -> String {
    format!(
        r#"
        [policies.standard]
        anonymous = {anonymous}
        registered = {{ per_minute = 4 }}
        [[consumers]]
        name = "acme"
        key_sha256 = "{ACME_SHA256}"
        {}
        "#,
        demo_route("standard")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registered_key_in_either_header_spends_the_plan_budget() {
    let gw = gateway(&keyed_config("{ per_minute = 2 }")).await;
    let with_header = || Req::get("/demo").header("x-api-key", "demo-key-acme");
    let with_bearer = || Req::get("/demo").header("authorization", "Bearer demo-key-acme");

    for (i, req) in [with_header(), with_bearer(), with_header(), with_bearer()]
        .into_iter()
        .enumerate()
    {
        let resp = req.send(gw.addr).await;
        assert_ok(&resp);
        assert_eq!(
            resp.header("ratelimit-policy"),
            Some("\"minute\";q=4;w=60"),
            "registered plan's quota"
        );
        assert_eq!(
            resp.sf_param("ratelimit", "minute", "r"),
            Some(3 - i as i64)
        );
    }
    // Both spellings belong to one consumer: the budget is spent for both.
    for req in [with_header(), with_bearer()] {
        let json = assert_limited(&req.send(gw.addr).await);
        assert_eq!(
            json["detail"],
            "per_minute limit of 4 for plan registered on route demo"
        );
    }
    // The anonymous budget of the same IP is separate and untouched.
    for left in [1, 0] {
        let resp = gw.get("/demo").await;
        assert_ok(&resp);
        assert_eq!(resp.header("ratelimit-policy"), Some("\"minute\";q=2;w=60"));
        assert_eq!(resp.sf_param("ratelimit", "minute", "r"), Some(left));
    }
    assert_limited(&gw.get("/demo").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_key_is_401_never_anonymous() {
    let gw = gateway(&keyed_config("{ per_minute = 2 }")).await;
    let attempts = [
        Req::get("/demo").header("x-api-key", "demo-key-acmeX"),
        Req::get("/demo").header("X-Api-Key", "nope"),
        Req::get("/demo").header("authorization", "Bearer nope"),
        Req::get("/demo").header("x-api-key", ""),
    ];
    for req in attempts {
        let resp = req.clone().send(gw.addr).await;
        resp.problem(401);
        assert!(
            resp.header("ratelimit").is_none(),
            "a 401 spends no budget: {req:?}"
        );
    }
    // Those requests did not spend the anonymous budget.
    assert_ok(&gw.get("/demo").await);
    assert_ok(&gw.get("/demo").await);
    assert_limited(&gw.get("/demo").await);
    // A limited anonymous caller cannot escape with a made-up key either.
    Req::get("/demo")
        .header("x-api-key", "made-up")
        .send(gw.addr)
        .await
        .problem(401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deny_plan_makes_anonymous_callers_401() {
    let gw = gateway(&keyed_config("\"deny\"")).await;
    let resp = gw.get("/demo").await;
    let json = resp.problem(401);
    assert!(
        json["detail"].as_str().unwrap().contains("demo"),
        "detail names the route: {json}"
    );
    assert_eq!(resp.header("www-authenticate"), Some("Bearer"));
    let keyed = Req::get("/demo")
        .header("authorization", "Bearer demo-key-acme")
        .send(gw.addr)
        .await;
    assert_ok(&keyed);
    assert_eq!(keyed.text(), "hello from sluice\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distinct_client_ips_have_distinct_budgets() {
    let gw = gateway(&format!(
        r#"
        [policies.p]
        anonymous = {{ per_minute = 2 }}
        {}
        "#,
        demo_route("p")
    ))
    .await;
    for ip in ["127.0.0.2", "127.0.0.3"] {
        for left in [1, 0] {
            let resp = Req::get("/demo").from(ip).send(gw.addr).await;
            assert_ok(&resp);
            assert_eq!(
                resp.sf_param("ratelimit", "minute", "r"),
                Some(left),
                "{ip}"
            );
        }
        assert_limited(&Req::get("/demo").from(ip).send(gw.addr).await);
    }
    // 127.0.0.1 was not touched by either.
    assert_ok(&gw.get("/demo").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_sharing_a_policy_share_the_budget() {
    let answering = |name: &str, policy: &str| {
        route(name, &format!("/{name}"))
            .respond(200, name)
            .policy(policy)
    };
    let gw = gateway(
        &Toml::new()
            .policy("shared", &[("anonymous", "{ per_minute = 3 }")])
            .policy("own", &[("anonymous", "{ per_minute = 1 }")])
            .route(answering("a", "shared"))
            .route(answering("b", "shared"))
            .route(answering("c", "own"))
            .build(),
    )
    .await;
    for (path, left) in [("/a", 2), ("/b", 1), ("/a/x", 0)] {
        let resp = gw.get(path).await;
        assert_ok(&resp);
        assert_eq!(
            resp.sf_param("ratelimit", "minute", "r"),
            Some(left),
            "{path}"
        );
    }
    let on_b = assert_limited(&gw.get("/b").await);
    assert_eq!(
        on_b["detail"],
        "per_minute limit of 3 for plan anonymous on route b"
    );
    assert_limited(&gw.get("/a").await);
    // A route with its own policy has its own budget.
    let own = gw.get("/c").await;
    assert_ok(&own);
    assert_eq!(own.header("ratelimit-policy"), Some("\"minute\";q=1;w=60"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_total_limit_counts_every_caller_and_rejections_spend_nothing() {
    let gw = gateway(&format!(
        r#"
        [policies.shop]
        anonymous = {{ per_day = 100 }}
        registered = {{ per_day = 100 }}
        total = {{ per_minute = 3 }}
        [[consumers]]
        name = "acme"
        key_sha256 = "{ACME_SHA256}"
        {}
        "#,
        demo_route("shop")
    ))
    .await;
    assert_ok(&Req::get("/demo").from("127.0.0.2").send(gw.addr).await);
    assert_ok(&Req::get("/demo").from("127.0.0.3").send(gw.addr).await);
    let keyed = Req::get("/demo")
        .header("x-api-key", "demo-key-acme")
        .send(gw.addr)
        .await;
    assert_ok(&keyed);
    assert_eq!(keyed.sf_param("ratelimit", "day", "r"), Some(99));

    // A fourth, fresh caller: its own budget is full, the total is not.
    let limited = Req::get("/demo").from("127.0.0.4").send(gw.addr).await;
    let json = assert_limited(&limited);
    assert_eq!(
        json["violated-policies"],
        serde_json::json!(["total-minute"])
    );
    assert_eq!(
        json["detail"],
        "total per_minute limit of 3 for policy shop on route demo"
    );
    assert_eq!(limited.sf_param("ratelimit", "total-minute", "r"), Some(0));
    assert_eq!(limited.sf_param("ratelimit", "day", "r"), Some(100));
    let retry_after = limited.retry_after();
    assert!(
        (60..=61).contains(&retry_after),
        "Retry-After {retry_after}"
    );

    gw.advance_secs(retry_after - 1);
    assert_limited(&Req::get("/demo").from("127.0.0.4").send(gw.addr).await);
    gw.advance_secs(1);
    // The refused requests did not spend 127.0.0.4's daily budget.
    let admitted = Req::get("/demo").from("127.0.0.4").send(gw.addr).await;
    assert_ok(&admitted);
    assert_eq!(admitted.sf_param("ratelimit", "day", "r"), Some(99));
}

fn xff_config(trusted: &str, up: &str) -> String {
    Toml::new()
        .raw(&format!("[identity]\ntrusted_proxies = [{trusted}]"))
        .upstream("up", &[up.to_string()])
        .policy("p", &[("anonymous", "{ per_minute = 3 }")])
        .route(route("api", "/api").upstream("up").policy("p"))
        .build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spoofed_forwarded_for_from_an_untrusted_peer_does_not_escape_the_limit() {
    let up = upstream().await;
    let gw = gateway(&xff_config("", &up.url())).await;
    for i in 0..3 {
        let resp = Req::get("/api/x")
            .header("x-forwarded-for", &format!("203.0.113.{i}"))
            .send(gw.addr)
            .await;
        assert_ok(&resp);
        // The upstream is told the real peer, not the spoofed address.
        assert_eq!(up.last().header("x-forwarded-for"), Some("127.0.0.1"));
    }
    for spoof in ["203.0.113.77", "198.51.100.1, 203.0.113.78"] {
        let resp = Req::get("/api/x")
            .header("x-forwarded-for", spoof)
            .send(gw.addr)
            .await;
        assert_limited(&resp);
        let resp = Req::get("/api/x")
            .header(
                "forwarded",
                &format!("for={}", spoof.split(',').next().unwrap()),
            )
            .send(gw.addr)
            .await;
        assert_limited(&resp);
    }
    assert_eq!(up.count(), 3, "refused requests never reach the upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_for_from_a_trusted_proxy_names_the_caller() {
    let up = upstream().await;
    let gw = gateway(&xff_config("\"127.0.0.1\"", &up.url())).await;
    let via_proxy = |client: &str| {
        Req::get("/api/x")
            .header("x-forwarded-for", client)
            .send(gw.addr)
    };
    for left in [2, 1, 0] {
        let resp = via_proxy("198.51.100.7").await;
        assert_ok(&resp);
        assert_eq!(resp.sf_param("ratelimit", "minute", "r"), Some(left));
    }
    assert_limited(&via_proxy("198.51.100.7").await);
    // Another client behind the same proxy has its own budget.
    let other = via_proxy("198.51.100.8").await;
    assert_ok(&other);
    assert_eq!(other.sf_param("ratelimit", "minute", "r"), Some(2));
    assert_eq!(
        up.last().header("x-forwarded-for"),
        Some("198.51.100.8, 127.0.0.1"),
        "the trusted chain is extended with the proxy"
    );
    // A chain in several lines is one list: the limiter's client (the last, a
    // fresh one here) is the one the upstream's chain names last before the proxy.
    let lines = Req::get("/api/x")
        .header("x-forwarded-for", "9.9.9.1")
        .header("x-forwarded-for", "9.9.9.2, 9.9.9.3")
        .header("x-forwarded-for", "198.51.100.9")
        .send(gw.addr)
        .await;
    assert_ok(&lines);
    assert_eq!(lines.sf_param("ratelimit", "minute", "r"), Some(2));
    let seen = up.last();
    assert_eq!(
        seen.headers
            .get_all("x-forwarded-for")
            .iter()
            .collect::<Vec<_>>(),
        ["9.9.9.1, 9.9.9.2, 9.9.9.3, 198.51.100.9, 127.0.0.1"],
        "every line of the trusted chain, then the proxy"
    );
    // The proxy itself (no XFF) is a caller of its own.
    let own = gw.get("/api/x").await;
    assert_ok(&own);
    assert_eq!(own.sf_param("ratelimit", "minute", "r"), Some(2));
    // An untrusted peer's XFF is still ignored: 127.0.0.2 is keyed as itself.
    for left in [2, 1, 0] {
        let resp = Req::get("/api/x")
            .from("127.0.0.2")
            .header("x-forwarded-for", "198.51.100.99")
            .send(gw.addr)
            .await;
        assert_ok(&resp);
        assert_eq!(resp.sf_param("ratelimit", "minute", "r"), Some(left));
    }
    let resp = Req::get("/api/x")
        .from("127.0.0.2")
        .header("x-forwarded-for", "198.51.100.100")
        .send(gw.addr)
        .await;
    assert_limited(&resp);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_requests_are_served_and_limited_like_http1() {
    let up = upstream().await;
    let gw = gateway(
        &Toml::new()
            .upstream("up", &[up.url()])
            .policy("p", &[("anonymous", "{ per_minute = 3 }")])
            .route(route("api", "/api").upstream("up").policy("p"))
            .build(),
    )
    .await;
    let h2 = Req::get("/api/one?x=1").h2().send(gw.addr).await;
    assert_ok(&h2);
    assert_eq!(h2.version, http::Version::HTTP_2);
    assert_eq!(h2.text(), "up saw /api/one?x=1");
    assert_eq!(h2.sf_param("ratelimit", "minute", "r"), Some(2));
    let seen = up.last();
    assert_eq!(seen.target, "/api/one?x=1");
    let authority = gw.addr.to_string();
    assert_eq!(
        seen.header("host"),
        Some(authority.as_str()),
        "Host from :authority"
    );
    assert_eq!(seen.header("x-forwarded-host"), Some(authority.as_str()));

    let h1 = gw.get("/api/two").await;
    assert_ok(&h1);
    assert_eq!(h1.sf_param("ratelimit", "minute", "r"), Some(1));
    assert_ok(&Req::get("/api/three").h2().send(gw.addr).await);
    let limited = Req::get("/api/four").h2().send(gw.addr).await;
    assert_eq!(limited.version, http::Version::HTTP_2);
    let json = assert_limited(&limited);
    assert_eq!(json["violated-policies"], serde_json::json!(["minute"]));
    assert!(limited.retry_after() >= 1);
    assert_eq!(
        limited.header("ratelimit-policy"),
        Some("\"minute\";q=3;w=60")
    );
    assert_limited(&gw.get("/api/five").await);
    assert_eq!(up.count(), 3);
}
