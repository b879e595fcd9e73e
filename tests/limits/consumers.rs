//! End-to-end consumers: per-consumer `limits` overrides and `disabled` consumers,
//! through the proxy, the RateLimit headers, `/admin/usage` and `/v1/check`.

use crate::support;

use sluice::config::Config;
use support::{ACME_SHA256, Live, Req, Resp, live, upstream};

fn config(up: &str) -> String {
    format!(
        r#"
        [identity]
        trusted_proxies = ["127.0.0.2"]
        consumer_header = "x-consumer-id"
        [upstreams.up]
        targets = ["{up}"]
        [policies.p]
        anonymous = {{ per_minute = 1 }}
        registered = {{ per_minute = 3, per_hour = 100 }}
        [[consumers]]
        name = "acme"
        key_sha256 = "{ACME_SHA256}"
        limits = {{ per_minute = 5 }}
        [[consumers]]
        name = "beta"
        key = "demo-key-beta"
        [[consumers]]
        name = "gone"
        key = "demo-key-gone"
        disabled = true
        [[routes]]
        name = "api"
        path_prefix = "/api"
        upstream = "up"
        policy = "p"
        "#
    )
}

async fn get(gw: &Live, key: &str) -> Resp {
    Req::get("/api/x")
        .header("x-api-key", key)
        .send(gw.addr)
        .await
}

async fn admitted(gw: &Live, key: &str) -> usize {
    for n in 0..20 {
        let resp = get(gw, key).await;
        match resp.status.as_u16() {
            200 => continue,
            429 => return n,
            other => panic!("{key}: status {other}: {}", resp.text()),
        }
    }
    20
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumers_own_limits_replace_its_plans_for_those_windows_only() {
    let up = upstream().await;
    let gw = live(&config(&up.url())).await;
    let first = get(&gw, "demo-key-acme").await;
    assert_eq!(first.status, 200);
    // The headers show acme's own minute limit and the plan's hour limit.
    assert_eq!(
        first.header("ratelimit-policy"),
        Some("\"minute\";q=5;w=60, \"hour\";q=100;w=3600")
    );
    assert_eq!(admitted(&gw, "demo-key-acme").await, 4);
    // beta, on the same plan without an override, has the plan's 3.
    assert_eq!(admitted(&gw, "demo-key-beta").await, 3);
    let usage = gw
        .admin(Req::get("/admin/usage?caller=consumer:acme"))
        .await
        .json();
    let limits = &usage["policies"][0]["limits"];
    assert_eq!(limits[0]["window"], "minute", "{usage}");
    assert_eq!(limits[0]["limit"], 5, "{usage}");
    assert_eq!(limits[0]["used"], 5, "{usage}");
    assert_eq!(limits[1]["limit"], 100, "{usage}");
    // The decision API applies the same override.
    let check = serde_json::json!({"policy": "p", "caller": "consumer:acme"}).to_string();
    let answer = gw.admin(Req::post("/v1/check", check)).await.json();
    assert_eq!(answer["allowed"], false, "{answer}");
    assert_eq!(answer["limits"][0]["limit"], 5, "{answer}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disabled_consumer_is_refused_as_if_unknown() {
    let up = upstream().await;
    let gw = live(&config(&up.url())).await;
    let refused = get(&gw, "demo-key-gone").await.problem(401);
    let unknown = get(&gw, "no-such-key").await.problem(401);
    assert_eq!(refused["detail"], unknown["detail"]);
    // Named by a trusted auth layer: refused too.
    let named = Req::get("/api/x")
        .header("x-consumer-id", "gone")
        .from("127.0.0.2")
        .send(gw.addr)
        .await;
    named.problem(401);
    assert_eq!(up.count(), 0);
    gw.stop().await;
}

#[test]
fn an_override_of_a_window_the_plan_lacks_is_a_warning() {
    let text = r#"
        [upstreams.up]
        targets = ["http://127.0.0.1:1"]
        [policies.p]
        anonymous = { per_minute = 1 }
        registered = { per_minute = 3 }
        [[consumers]]
        name = "acme"
        key = "k"
        limits = { per_hour = 5 }
        [[routes]]
        name = "r"
        path_prefix = "/"
        upstream = "up"
        policy = "p"
    "#;
    let config = Config::parse(std::path::Path::new("gateway.toml"), text).unwrap();
    let warned = config
        .warnings
        .iter()
        .map(ToString::to_string)
        .any(|w| w.contains("consumers[0].limits.per_hour") && w.contains("changes nothing"));
    assert!(warned, "{:?}", config.warnings);
    let bad = text.replace("per_hour = 5", "per_minute = 0");
    let err = Config::parse(std::path::Path::new("gateway.toml"), &bad).unwrap_err();
    assert!(
        err.to_string().contains("consumers[0].limits.per_minute"),
        "{err}"
    );
}
