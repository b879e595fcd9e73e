//! `/v1/forward-auth` as a proxy calls it: the original request from the
//! `X-Forwarded-*` headers, the client from `X-Forwarded-For` only behind a trusted
//! proxy, 200 with the quota or the refusal as the client should get it, and
//! nginx's mode.

use super::support::{self, ACME_SHA256, Req};
use super::{decision_addr, forwarded};

fn config(token: &str) -> String {
    format!(
        r#"
[decision]
listen = "127.0.0.1:0"
{token}

[identity]
trusted_proxies = ["127.0.0.1/32"]

[policies.standard]
anonymous = {{ per_minute = 3 }}
registered = {{ per_minute = 5 }}

[policies.capped]
anonymous = {{ per_minute = 100 }}
registered = {{ per_minute = 100 }}
concurrency = {{ max = 2 }}

[[consumers]]
name = "acme"
plan = "registered"
key_sha256 = "{ACME_SHA256}"

[[routes]]
name = "orders"
path_prefix = "/orders"
policy = "capped"

[[routes]]
name = "api"
path_prefix = "/api"
policy = "standard"
"#
    )
}

#[tokio::test]
async fn forward_auth_counts_each_forwarded_client_like_a_proxied_request() {
    let live = support::live(&config("")).await;
    let addr = decision_addr(&live);
    for left in [2, 1, 0] {
        let resp = forwarded("GET", "/api/items?page=2", "203.0.113.7")
            .send(addr)
            .await;
        assert_eq!(resp.status, 200, "{}", resp.text());
        assert_eq!(resp.sf_param("ratelimit", "minute", "r"), Some(left));
        assert_eq!(resp.sf_param("ratelimit-policy", "minute", "q"), Some(3));
    }
    let refused = forwarded("POST", "/api/items", "203.0.113.7")
        .send(addr)
        .await;
    let problem = refused.problem(429);
    assert!(refused.retry_after() >= 1);
    assert_eq!(refused.sf_param("ratelimit", "minute", "r"), Some(0));
    assert!(problem["detail"].as_str().unwrap().contains("route api"));

    // Another client behind the trusted proxy has its own budget.
    let other = forwarded("GET", "/api/items", "203.0.113.8")
        .send(addr)
        .await;
    assert_eq!(other.sf_param("ratelimit", "minute", "r"), Some(2));
    // An untrusted peer's X-Forwarded-For is not believed: the peer is the client.
    let untrusted = forwarded("GET", "/api/items", "203.0.113.7")
        .from("127.0.0.2")
        .send(addr)
        .await;
    assert_eq!(untrusted.status, 200);
    assert_eq!(untrusted.sf_param("ratelimit", "minute", "r"), Some(2));
    // The client's API key (an original header) makes it the consumer.
    let acme = forwarded("GET", "/api/items", "203.0.113.7")
        .header("x-api-key", "demo-key-acme")
        .send(addr)
        .await;
    assert_eq!(acme.sf_param("ratelimit", "minute", "r"), Some(4));
    let unknown = forwarded("GET", "/api/items", "203.0.113.9")
        .header("x-api-key", "not-a-key")
        .send(addr)
        .await;
    unknown.problem(401);
    // No route: the proxy's own 404.
    forwarded("GET", "/nothing", "203.0.113.7")
        .send(addr)
        .await
        .problem(404);

    // The same admission as the proxy path: the client's next proxied request is
    // refused too, from the counts forward auth made.
    let proxied = Req::get("/api/items")
        .header("x-forwarded-for", "203.0.113.7")
        .send(live.addr)
        .await;
    proxied.problem(429);

    let metrics = live.admin(Req::get("/metrics")).await.text();
    let series = |s: &str| support::metric(&metrics, s).unwrap_or(0.0);
    assert_eq!(
        series(r#"sluice_decisions_total{outcome="allowed",via="forward_auth"}"#),
        6.0
    );
    assert_eq!(
        series(r#"sluice_decisions_total{outcome="limited",via="forward_auth"}"#),
        1.0
    );
    assert_eq!(
        series(r#"sluice_requests_total{outcome="limited",plan="anonymous",route="api"}"#),
        2.0
    );
    let lines = live.access_log.wait_lines(10).await;
    let via: Vec<_> = (lines.iter())
        .filter(|l| l.contains(r#""via":"forward-auth""#))
        .collect();
    assert_eq!(via.len(), 9, "{lines:#?}");
    assert!(via[3].contains(r#""status":429"#) && via[3].contains(r#""method":"POST""#));
    assert!(via[3].contains(r#""path":"/api/items""#), "{}", via[3]);
    live.stop().await;
}

#[tokio::test]
async fn nginx_mode_answers_every_refusal_403_with_the_real_status() {
    let live = support::live(&config("")).await;
    let addr = decision_addr(&live);
    let ask = |client: &str| {
        Req::get("/v1/forward-auth?mode=nginx")
            .header("x-forwarded-method", "GET")
            .header("x-forwarded-uri", "/api/x")
            .header("x-forwarded-for", client)
    };
    for _ in 0..3 {
        assert_eq!(ask("198.51.100.1").send(addr).await.status, 200);
    }
    let refused = ask("198.51.100.1").send(addr).await;
    assert_eq!(refused.status, 403);
    assert_eq!(refused.header("x-sluice-status"), Some("429"));
    assert!(refused.retry_after() >= 1);
    assert_eq!(refused.sf_param("ratelimit", "minute", "r"), Some(0));
    // sluice's own 400 (no X-Forwarded-Uri) is a 403 for nginx too.
    let bad = Req::get("/v1/forward-auth?mode=nginx").send(addr).await;
    assert_eq!(bad.status, 403);
    assert_eq!(bad.header("x-sluice-status"), Some("400"));
    // Without the mode, the real status.
    let bad = Req::get("/v1/forward-auth").send(addr).await;
    bad.problem(400);
    live.stop().await;
}

#[tokio::test]
async fn a_route_capping_concurrency_is_refused_400_naming_the_cap_and_check_warns() {
    let live = support::live(&config("")).await;
    let addr = decision_addr(&live);
    let resp = forwarded("POST", "/orders", "203.0.113.7").send(addr).await;
    let problem = resp.problem(400);
    let detail = problem["detail"].as_str().unwrap();
    assert!(
        detail.contains("max 2") && detail.contains("orders"),
        "{detail}"
    );
    let metrics = live.admin(Req::get("/metrics")).await.text();
    let refused = r#"sluice_decisions_total{outcome="bad_request",via="forward_auth"}"#;
    assert_eq!(support::metric(&metrics, refused), Some(1.0));
    let usage = live
        .admin(Req::get("/admin/usage?caller=ip:203.0.113.7"))
        .await
        .json();
    let used = &usage["policies"][0]["limits"][0]["used"];
    assert!(used.is_null() || used == 0, "nothing counted: {usage}");
    live.stop().await;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, config("")).unwrap();
    let loaded = sluice::config::Config::load(&path).unwrap();
    let warned = loaded
        .warnings
        .iter()
        .any(|w| w.reason.contains("caps concurrency") && w.reason.contains("forward-auth"));
    assert!(warned, "{:?}", loaded.warnings);
}

#[tokio::test]
async fn without_the_token_nothing_is_decided_nor_charged() {
    let live = support::live(&config(r#"token = "s3cret""#)).await;
    let addr = decision_addr(&live);
    for _ in 0..5 {
        let resp = forwarded("GET", "/api/x", "203.0.113.7").send(addr).await;
        resp.problem(401);
        // Authorization is the client's, passed on: never the listener's token.
        let resp = forwarded("GET", "/api/x", "203.0.113.7")
            .header("authorization", "Bearer s3cret")
            .send(addr)
            .await;
        resp.problem(401);
    }
    // nginx's auth_request passes on only 401 and 403: in its mode, a 403 naming
    // the real status, as every refusal.
    let nginx = Req::get("/v1/forward-auth?mode=nginx")
        .header("x-forwarded-uri", "/api/x")
        .send(addr)
        .await;
    assert_eq!(nginx.status, 403);
    assert_eq!(nginx.header("x-sluice-status"), Some("401"));
    let resp = forwarded("GET", "/api/x", "203.0.113.7")
        .header("sluice-token", "s3cret")
        .send(addr)
        .await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.sf_param("ratelimit", "minute", "r"), Some(2));
    // Each refusal is counted and logged as the door's: the first line says who
    // was turned away and why (the flood after it is summarised).
    let metrics = live.admin(Req::get("/metrics")).await.text();
    let refused = r#"sluice_decisions_total{outcome="unauthorized",via="forward_auth"}"#;
    assert_eq!(support::metric(&metrics, refused), Some(11.0));
    let first: serde_json::Value =
        serde_json::from_str(&live.access_log.wait_lines(1).await[0]).unwrap();
    assert_eq!(first["via"], "forward-auth", "{first}");
    assert_eq!(first["status"], 401, "{first}");
    assert_eq!(first["outcome"], "unauthorized", "{first}");
    assert_eq!(first["path"], "/v1/forward-auth", "{first}");
    live.stop().await;
}

/// What the listener refuses before any door decides (no such endpoint, a request
/// that names no original) is counted and logged too.
#[tokio::test]
async fn a_request_for_no_endpoint_or_naming_no_request_is_counted_and_logged() {
    let live = support::live(&config("")).await;
    let addr = decision_addr(&live);
    let nothing = Req::get("/v1/nothing").send(addr).await;
    nothing.problem(404);
    let id = nothing
        .header("x-request-id")
        .expect("a request id")
        .to_string();
    let bad = Req::get("/v1/forward-auth")
        .from("127.0.0.2")
        .send(addr)
        .await;
    bad.problem(400);
    let metrics = live.admin(Req::get("/metrics")).await.text();
    for outcome in ["no_route", "bad_request"] {
        let series = format!(r#"sluice_decisions_total{{outcome="{outcome}",via="forward_auth"}}"#);
        assert_eq!(support::metric(&metrics, &series), Some(1.0), "{series}");
    }
    let lines: Vec<serde_json::Value> = (live.access_log.wait_lines(2).await.iter())
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let fields = |line: &serde_json::Value| {
        let text = |key: &str| line[key].as_str().unwrap_or("").to_string();
        (
            text("client"),
            text("path"),
            line["status"].as_u64(),
            text("outcome"),
            text("via"),
        )
    };
    let fields: Vec<_> = lines.iter().map(fields).collect();
    let expected = |client: &str, path: &str, status, outcome: &str| {
        let via = "forward-auth".to_string();
        (
            client.to_string(),
            path.to_string(),
            Some(status),
            outcome.to_string(),
            via,
        )
    };
    assert_eq!(
        fields,
        [
            expected("127.0.0.1", "/v1/nothing", 404, "no_route"),
            expected("127.0.0.2", "/v1/forward-auth", 400, "bad_request"),
        ]
    );
    assert_eq!(
        lines[0]["request_id"],
        id.as_str(),
        "the answer's id is its line's"
    );
    // In nginx's mode a wrong path is a 403 naming the real status, as every refusal.
    let nginx = Req::get("/v1/nothing?mode=nginx").send(addr).await;
    assert_eq!(nginx.status, 403);
    assert_eq!(nginx.header("x-sluice-status"), Some("404"));
    live.stop().await;
}
