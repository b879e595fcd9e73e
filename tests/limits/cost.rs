//! What a request costs: a route's `cost` charged against every window of its
//! policy (and its `total`) at admission, in memory and in Redis, in the RateLimit
//! headers and in the decision API. Memory tests move time with the manual clock;
//! Redis decides with its own clock, so its tests only count.

use crate::support;
use crate::support::redis_server;

use std::path::Path;

use redis_server::RedisServer;
use serde_json::{Value, json};
use sluice::config::Config;
use support::{Live, Req, Resp, live};

/// A policy `priced` of ten per minute (twelve for every caller together), a route that costs
/// `cost` and one that costs the default.
fn priced(store: &str, cost: u32) -> String {
    format!(
        r#"
{store}
[policies.priced]
anonymous = {{ per_minute = 10 }}
total = {{ per_minute = 12 }}

[[routes]]
name = "report"
path_prefix = "/report"
respond = {{ status = 200, body = "report\n" }}
policy = "priced"
cost = {cost}

[[routes]]
name = "cheap"
path_prefix = "/cheap"
respond = {{ status = 200, body = "cheap\n" }}
policy = "priced"
"#
    )
}

#[track_caller]
fn remaining(resp: &Resp, window: &str) -> Option<i64> {
    resp.sf_param("ratelimit", window, "r")
}

async fn check(gw: &Live, body: Value) -> Resp {
    gw.admin(Req::post("/v1/check", body.to_string())).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_cost_is_charged_against_every_window_and_the_total() {
    let gw = live(&priced("", 3)).await;

    let first = gw.get("/report").await;
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(remaining(&first, "minute"), Some(7), "{first:?}");

    gw.advance_secs(10);
    let second = gw.get("/report").await;
    assert_eq!(remaining(&second, "minute"), Some(4));
    // A route without `cost` costs one, from the same budget.
    let cheap = gw.get("/cheap").await;
    assert_eq!(cheap.status, 200);
    assert_eq!(remaining(&cheap, "minute"), Some(3));

    gw.advance_secs(10);
    let third = gw.get("/report").await;
    assert_eq!(third.status, 200);
    assert_eq!(remaining(&third, "minute"), Some(0));

    // Three more units would need the first request's three to leave the window,
    // at +60 s; it is +20 s.
    let refused = gw.get("/report").await;
    let problem = refused.problem(429);
    assert_eq!(problem["violated-policies"], json!(["minute"]));
    assert_eq!(refused.retry_after(), 40);
    // The total counted every unit: ten of twelve are used. A refused request
    // charged nothing, so another caller still gets one cheap request...
    let other = Req::get("/cheap").from("127.0.0.2").send(gw.addr).await;
    assert_eq!(other.status, 200, "{}", other.text());
    assert_eq!(remaining(&other, "minute"), Some(9));
    // ... but not three more units: the total is what refuses it.
    let over_total = Req::get("/report").from("127.0.0.2").send(gw.addr).await;
    let problem = over_total.problem(429);
    assert_eq!(problem["violated-policies"], json!(["total-minute"]));
    assert_eq!(over_total.retry_after(), 40);

    gw.advance_secs(40);
    let back = gw.get("/report").await;
    assert_eq!(back.status, 200, "the first request's units left at +60 s");
    assert_eq!(remaining(&back, "minute"), Some(0));
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_decision_api_charges_its_cost_and_refuses_one_that_never_fits() {
    let gw = live(&priced("", 3)).await;
    let ask = |cost: u32| json!({"policy": "priced", "caller": "ip:10.0.0.1", "plan": "anonymous", "cost": cost});

    let answer = check(&gw, ask(4)).await.json();
    assert_eq!(answer["allowed"], true, "{answer}");
    let minute = answer["limits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["window"] == "minute")
        .unwrap()
        .clone();
    assert_eq!(minute["remaining"], 6, "{answer}");

    let too_much = check(&gw, ask(7)).await.json();
    assert_eq!(too_much["allowed"], false, "{too_much}");
    assert_eq!(too_much["retry_after"], 60, "{too_much}");

    // Eleven can never fit a limit of ten: no wait would be honest.
    let never = check(&gw, ask(11)).await;
    let problem = never.problem(400);
    assert_eq!(
        problem["detail"],
        "cost 11 exceeds the \"minute\" limit of 10: it can never be admitted"
    );
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_on_one_redis_charge_the_route_cost_once_each() {
    let redis = RedisServer::start();
    let store = format!("[store]\nbackend = \"redis\"\nurl = \"{}\"\n", redis.url());
    let a = live(&priced(&store, 4)).await;
    let b = live(&priced(&store, 4)).await;

    let first = a.get("/report").await;
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(remaining(&first, "minute"), Some(6));
    let second = b.get("/report").await;
    assert_eq!(second.status, 200, "{}", second.text());
    assert_eq!(remaining(&second, "minute"), Some(2));
    let refused = a.get("/report").await;
    refused.problem(429);
    let retry = refused.retry_after();
    assert!((1..=60).contains(&retry), "Retry-After {retry}");
    // Two units are left, on either replica.
    let cheap = b.get("/cheap").await;
    assert_eq!(remaining(&cheap, "minute"), Some(1));
    a.stop().await;
    b.stop().await;
}

fn errors(text: &str) -> Vec<String> {
    match Config::parse(Path::new("gateway.toml"), text) {
        Ok(_) => Vec::new(),
        Err(err) => err.errors().map(|d| d.to_string()).collect(),
    }
}

#[test]
fn a_cost_of_zero_or_beyond_a_limit_is_a_config_error_with_line_and_key() {
    let zero = errors(&priced("", 0));
    assert_eq!(zero.len(), 1, "{zero:?}");
    assert!(
        zero[0].starts_with(
            "error: gateway.toml:12: routes[0].cost: must be between 1 and 4294967295, got 0"
        ),
        "{zero:?}"
    );
    let big = errors(&priced("", 11));
    assert_eq!(big.len(), 1, "{big:?}");
    assert!(
        big[0].contains("routes[0].cost: cost 11 exceeds the per_minute limit of 10 for plan anonymous in policy \"priced\""),
        "{big:?}"
    );
    // The total counts too.
    let text = priced("", 10).replace("total = { per_minute = 12 }", "total = { per_minute = 5 }");
    let total = errors(&text);
    assert!(
        total
            .iter()
            .any(|e| e.contains("exceeds the per_minute limit of 5 for total")),
        "{total:?}"
    );
    // "deny" plans never count; a cost within every limit compiles.
    assert!(errors(&priced("", 10)).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refund_on_gives_the_cost_back_for_upstream_failures_and_sluices_502() {
    let failing = support::upstream_with(support::UpstreamOptions {
        status: 503,
        ..Default::default()
    })
    .await;
    let down = support::closed_port();
    let gw = live(&format!(
        r#"
[upstreams.failing]
targets = ["{}"]
[upstreams.down]
targets = ["http://127.0.0.1:{down}"]

[policies.priced]
anonymous = {{ per_minute = 10 }}

[[routes]]
name = "flaky"
path_prefix = "/flaky"
upstream = "failing"
policy = "priced"
cost = 4
refund_on = [502, 503]

[[routes]]
name = "gone"
path_prefix = "/gone"
upstream = "down"
policy = "priced"
cost = 4
refund_on = [502]

[[routes]]
name = "kept"
path_prefix = "/kept"
upstream = "failing"
policy = "priced"
cost = 4
"#,
        failing.url()
    ))
    .await;

    // The upstream's 503 is passed on, and the four units come back.
    for _ in 0..3 {
        let flaky = gw.get("/flaky").await;
        assert_eq!(flaky.status, 503);
        assert_eq!(remaining(&flaky, "minute"), Some(10), "{flaky:?}");
    }
    assert_eq!(failing.count(), 3, "each reached the upstream");
    // sluice's own 502 (nothing listens) comes back too.
    // It carries the quota as the upstream's answer would, as before the request.
    let gone = gw.get("/gone").await;
    gone.problem(502);
    assert_eq!(remaining(&gone, "minute"), Some(10), "{gone:?}");
    assert!(gone.header("ratelimit-policy").is_some(), "{gone:?}");
    // Without refund_on, a failure costs what it costs.
    let kept = gw.get("/kept").await;
    assert_eq!(kept.status, 503);
    assert_eq!(remaining(&kept, "minute"), Some(6));
    let after = check(
        &gw,
        json!({"policy": "priced", "caller": "ip:127.0.0.1", "plan": "anonymous", "cost": 6}),
    )
    .await
    .json();
    assert_eq!(after["allowed"], true, "only /kept was charged: {after}");

    let text = gw.admin(Req::get("/metrics")).await.text();
    let refunds = |route: &str| {
        support::metric(
            &text,
            &format!("sluice_refunds_total{{reason=\"status\",route=\"{route}\"}}"),
        )
    };
    assert_eq!(refunds("flaky"), Some(3.0), "{text}");
    assert_eq!(refunds("gone"), Some(1.0), "{text}");
    assert_eq!(refunds("kept"), None, "{text}");
    gw.stop().await;
}

#[test]
fn refund_on_takes_http_statuses_only() {
    let text = priced("", 1).replace("cost = 1", "cost = 1\nrefund_on = [503, 42]");
    let errors = errors(&text);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].contains("routes[0].refund_on: must be between 100 and 599, got 42"),
        "{errors:?}"
    );
}

/// A policy of `limit` units a minute and a route `/chat` under it.
fn tokens(store: &str, limit: u32) -> String {
    format!(
        r#"
{store}
[policies.tokens]
anonymous = {{ per_minute = {limit} }}

[[routes]]
name = "chat"
path_prefix = "/chat"
respond = {{ status = 200, body = "ok\n" }}
policy = "tokens"
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_past_the_limit_is_debt_refused_until_paid_back_with_an_exact_retry_after() {
    let gw = live(&tokens("", 100)).await;
    let caller = json!({"policy": "tokens", "caller": "ip:127.0.0.1", "plan": "anonymous"});
    let first = gw.get("/chat").await;
    assert_eq!(remaining(&first, "minute"), Some(99));

    // +10 s: the response turned out to cost 150 more: 151 of 100 used.
    gw.advance_secs(10);
    let mut charge = caller.clone();
    charge["charge"] = json!(150);
    let charged = check(&gw, charge).await.json();
    assert_eq!(charged["charged"], 150, "{charged}");
    assert_eq!(charged["allowed"], false, "in debt: {charged}");
    assert_eq!(charged["retry_after"], 60, "{charged}");
    assert_eq!(charged["limits"][0]["remaining"], 0, "{charged}");

    // +20 s: refused until the 150 leave the window at +70 s, r=0.
    gw.advance_secs(10);
    let refused = gw.get("/chat").await;
    refused.problem(429);
    assert_eq!(refused.retry_after(), 50);
    assert_eq!(remaining(&refused, "minute"), Some(0));
    // +69 s: still one second to go.
    gw.advance_secs(49);
    assert_eq!(gw.get("/chat").await.retry_after(), 1);
    gw.advance_secs(1);
    let paid = gw.get("/chat").await;
    assert_eq!(paid.status, 200, "the debt is paid back: {}", paid.text());
    assert_eq!(remaining(&paid, "minute"), Some(99));

    let text = gw.admin(Req::get("/metrics")).await.text();
    let series = "sluice_cost_charged_total{policy=\"tokens\",route=\"none\"}";
    assert_eq!(support::metric(&text, series), Some(150.0), "{text}");
    // Both refusals were the debt's, and are counted as such.
    let debt =
        "sluice_limit_rejections_total{plan=\"anonymous\",policy=\"tokens\",window=\"cost\"}";
    assert_eq!(support::metric(&text, debt), Some(2.0), "{text}");
    let minute =
        "sluice_limit_rejections_total{plan=\"anonymous\",policy=\"tokens\",window=\"minute\"}";
    assert_eq!(support::metric(&text, minute).unwrap_or(0.0), 0.0, "{text}");
    // cost and charge are two questions.
    let mut both = caller.clone();
    both["cost"] = json!(1);
    both["charge"] = json!(1);
    check(&gw, both).await.problem(400);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_on_one_redis_see_one_charge_once() {
    let redis = RedisServer::start();
    let store = format!("[store]\nbackend = \"redis\"\nurl = \"{}\"\n", redis.url());
    let a = live(&tokens(&store, 1000)).await;
    let b = live(&tokens(&store, 1000)).await;
    let first = a.get("/chat").await;
    assert_eq!(remaining(&first, "minute"), Some(999));
    let charge =
        json!({"policy": "tokens", "caller": "ip:127.0.0.1", "plan": "anonymous", "charge": 1200});
    let charged = check(&b, charge).await.json();
    assert_eq!(charged["allowed"], false, "{charged}");
    assert_eq!(charged["limits"][0]["remaining"], 0, "{charged}");
    // Exactly 1 + 1200 units are counted, wherever one asks.
    let peek =
        json!({"policy": "tokens", "caller": "ip:127.0.0.1", "plan": "anonymous", "charge": 0});
    let seen = check(&a, peek).await.json();
    assert_eq!(seen["allowed"], false, "{seen}");
    for gw in [&a, &b] {
        let refused = gw.get("/chat").await;
        refused.problem(429);
        let retry = refused.retry_after();
        // A window of more than 125 counts in buckets of 1/125 of it (0.48 s).
        assert!((59..=61).contains(&retry), "Retry-After {retry}");
        assert_eq!(remaining(&refused, "minute"), Some(0));
    }
    let usage = a
        .admin(Req::get("/admin/usage?caller=ip:127.0.0.1"))
        .await
        .json();
    let used = &usage["policies"][0]["limits"][0]["used"];
    assert_eq!(used, 1201, "{usage}");
    a.stop().await;
    b.stop().await;
}
