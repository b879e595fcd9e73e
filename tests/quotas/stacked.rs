//! Routes of several policies (`policy = ["org", "per_key", "per_ip"]`): every
//! policy must admit, each counting under its own key, all or nothing; the headers
//! name every limit by policy and window, a 429 the one that refused.

use crate::support::{Live, Req, Resp, live, sf_param, upstream};

/// An organisation's budget over its members' keys (`x-org`, as an auth layer in
/// front would set it), each key's own limit, and each client address's, on one
/// route to a recording upstream.
fn stacked(upstream: &str, per_ip_mode: &str) -> String {
    format!(
        r#"
[upstreams.api]
targets = ["{upstream}"]

[policies.org]
key = ["header:x-org"]
anonymous = "deny"
registered = {{ per_minute = 6 }}

[policies.per_key]
anonymous = "deny"
registered = {{ per_minute = 4 }}

[policies.per_ip]
key = ["ip"]
anonymous = "deny"
registered = {{ per_minute = 2 }}
{per_ip_mode}

[[consumers]]
name = "alice"
key = "key-alice"

[[consumers]]
name = "bob"
key = "key-bob"

[[routes]]
name = "api"
path_prefix = "/api"
upstream = "api"
policy = ["org", "per_key", "per_ip"]
"#
    )
}

/// A request of `key`'s holder, a member of organisation acme, from `ip`.
async fn call(gw: &Live, key: &str, ip: &str) -> Resp {
    Req::get("/api/orders")
        .header("x-api-key", key)
        .header("x-org", "acme")
        .from(ip)
        .send(gw.addr)
        .await
}

/// What is left of each limit, as the `RateLimit` header says: (org, per_key, per_ip).
fn left(resp: &Resp) -> (Option<i64>, Option<i64>, Option<i64>) {
    let state = resp.header("ratelimit").unwrap_or("");
    (
        sf_param(state, "org-minute", "r"),
        sf_param(state, "per_key-minute", "r"),
        sf_param(state, "per_ip-minute", "r"),
    )
}

#[tokio::test]
async fn three_stacked_policies_refuse_in_turn_and_a_refusal_charges_none_of_them() {
    let up = upstream().await;
    let gw = live(&stacked(&up.url(), "")).await;

    // alice from .1: her address's 2 a minute are spent first.
    let first = call(&gw, "key-alice", "127.0.8.1").await;
    assert_eq!(first.status, 200);
    assert_eq!(
        first.header("ratelimit-policy"),
        Some("\"org-minute\";q=6;w=60, \"per_key-minute\";q=4;w=60, \"per_ip-minute\";q=2;w=60")
    );
    assert_eq!(left(&first), (Some(5), Some(3), Some(1)));
    assert_eq!(call(&gw, "key-alice", "127.0.8.1").await.status, 200);
    // 1. per_ip refuses; org and per_key are not charged, however often it is tried.
    for _ in 0..3 {
        let refused = call(&gw, "key-alice", "127.0.8.1").await;
        let problem = refused.problem(429);
        assert_eq!(
            problem["violated-policies"],
            serde_json::json!(["per_ip-minute"])
        );
        let detail = problem["detail"].as_str().unwrap();
        assert!(detail.contains("policy per_ip"), "{detail}");
        assert!(refused.retry_after() >= 1);
        assert_eq!(left(&refused), (Some(4), Some(2), Some(0)));
    }

    // alice from .2: her key's 4 a minute run out (2 here).
    assert_eq!(
        left(&call(&gw, "key-alice", "127.0.8.2").await),
        (Some(3), Some(1), Some(1))
    );
    assert_eq!(
        left(&call(&gw, "key-alice", "127.0.8.2").await),
        (Some(2), Some(0), Some(0))
    );
    // 2. per_key refuses alice from a fresh address .3, which is not charged.
    for _ in 0..3 {
        let refused = call(&gw, "key-alice", "127.0.8.3").await;
        let problem = refused.problem(429);
        assert_eq!(
            problem["violated-policies"],
            serde_json::json!(["per_key-minute"])
        );
        assert!(
            problem["detail"]
                .as_str()
                .unwrap()
                .contains("policy per_key")
        );
        assert_eq!(left(&refused), (Some(2), Some(0), Some(2)));
    }

    // bob from .3: the organisation's 6 run out with his 2.
    assert_eq!(
        left(&call(&gw, "key-bob", "127.0.8.3").await),
        (Some(1), Some(3), Some(1))
    );
    assert_eq!(
        left(&call(&gw, "key-bob", "127.0.8.3").await),
        (Some(0), Some(2), Some(0))
    );
    // 3. org refuses bob from a fresh address .4: neither his key nor .4 is charged.
    for _ in 0..3 {
        let refused = call(&gw, "key-bob", "127.0.8.4").await;
        let problem = refused.problem(429);
        assert_eq!(
            problem["violated-policies"],
            serde_json::json!(["org-minute"])
        );
        assert!(problem["detail"].as_str().unwrap().contains("policy org"));
        assert_eq!(left(&refused), (Some(0), Some(2), Some(2)));
    }

    // Exactly the admitted requests reached the upstream.
    assert_eq!(up.count(), 6);
    // A minute on, each budget is whole again: nothing refused was ever counted.
    gw.advance_secs(61);
    let again = call(&gw, "key-bob", "127.0.8.4").await;
    assert_eq!(left(&again), (Some(5), Some(3), Some(1)));
    assert_eq!(up.count(), 7);
    gw.stop().await;
}

#[tokio::test]
async fn a_stacked_policy_in_shadow_mode_refuses_nothing_and_is_charged_nothing_when_over() {
    let up = upstream().await;
    let shadow = "mode = \"shadow\"\nshadow_headers = true";
    let gw = live(&stacked(&up.url(), shadow)).await;
    for expected in [(5, 3, 1), (4, 2, 0)] {
        let resp = call(&gw, "key-alice", "127.0.8.5").await;
        assert_eq!(resp.status, 200);
        let (a, b, c) = expected;
        assert_eq!(left(&resp), (Some(a), Some(b), Some(c)));
    }
    // per_ip would refuse: admitted, counted in org and per_key, not in per_ip.
    let over = call(&gw, "key-alice", "127.0.8.5").await;
    assert_eq!(over.status, 200);
    assert_eq!(left(&over), (Some(3), Some(1), Some(0)));
    let metrics = Req::get("/metrics").send(gw.admin).await.text();
    assert!(
        metrics.contains(
            "sluice_shadow_refusals_total{limit=\"minute\",plan=\"registered\",policy=\"per_ip\",route=\"api\"} 1"
        ),
        "{metrics}"
    );
    // An enforcing policy still refuses the lot: alice's key has one left.
    assert_eq!(call(&gw, "key-alice", "127.0.8.5").await.status, 200);
    let refused = call(&gw, "key-alice", "127.0.8.5").await;
    let problem = refused.problem(429);
    assert_eq!(
        problem["violated-policies"],
        serde_json::json!(["per_key-minute"])
    );
    assert_eq!(up.count(), 4);
    gw.stop().await;
}

#[tokio::test]
async fn the_decision_api_takes_a_list_of_policies_all_or_nothing() {
    let up = upstream().await;
    let gw = live(&stacked(&up.url(), "")).await;
    let check = |body: &str| Req::post("/v1/check", body.to_string()).send(gw.admin);
    let ask = r#"{"policy": ["org", "per_key"], "caller": "consumer:alice",
                  "key": {"header:x-org": "acme"}, "cost": 3}"#;
    let first = check(ask).await;
    assert_eq!(first.status, 200, "{}", first.text());
    let answer = first.json();
    assert_eq!(answer["allowed"], true);
    assert_eq!(
        answer["limits"],
        serde_json::json!([
            {"window": "org-minute", "limit": 6, "remaining": 3, "reset_after": 60},
            {"window": "per_key-minute", "limit": 4, "remaining": 1, "reset_after": 60}
        ])
    );
    // per_key has 1 left: refused, and org is not charged.
    let refused = check(ask).await.json();
    assert_eq!(refused["allowed"], false);
    assert_eq!(refused["limits"][0]["remaining"], 3);
    // A proxied request of alice sees the same counts: one budget per policy.
    let resp = call(&gw, "key-alice", "127.0.8.6").await;
    assert_eq!(left(&resp), (Some(2), Some(0), Some(1)));
    let twice = check(r#"{"policy": ["org", "org"], "caller": "consumer:alice"}"#).await;
    assert_eq!(twice.status, 400);
    assert!(twice.text().contains("listed twice"), "{}", twice.text());
    gw.stop().await;
}

#[test]
fn a_stack_is_checked_when_the_config_loads() {
    let cases = [
        (r#"policy = ["org", "nope"]"#, "unknown policy \"nope\""),
        (
            r#"policy = ["org", "org"]"#,
            "policy \"org\" is listed twice",
        ),
        (r#"policy = []"#, "an empty list"),
        (
            r#"policy = ["org", "pooled"]"#,
            "only the first policy of a stack may have a total",
        ),
    ];
    for (policy, expected) in cases {
        let toml = format!(
            r#"
[policies.org]
anonymous = {{ per_minute = 6 }}

[policies.pooled]
anonymous = {{ per_minute = 6 }}
total = {{ per_minute = 100 }}

[[routes]]
name = "api"
path_prefix = "/api"
respond = {{ status = 200 }}
{policy}
"#
        );
        let err = sluice::config::Config::parse(std::path::Path::new("gateway.toml"), &toml)
            .expect_err(policy)
            .to_string();
        assert!(err.contains(expected), "{policy}: {err}");
        assert!(
            err.contains("gateway.toml:13: routes[0].policy"),
            "{policy}: {err}"
        );
    }
    // First, a policy with a total may be stacked.
    let ok = r#"
[policies.org]
anonymous = { per_minute = 6 }

[policies.pooled]
anonymous = { per_minute = 6 }
total = { per_minute = 100 }

[[routes]]
name = "api"
path_prefix = "/api"
respond = { status = 200 }
policy = ["pooled", "org"]
"#;
    sluice::config::Config::parse(std::path::Path::new("gateway.toml"), ok).unwrap();
}

/// An organisation's monthly quota of 150 over a per-address monthly limit of 200,
/// on `store`: anonymous callers, the organisation named by `x-org`.
fn fleet_stacked(store: &str) -> String {
    format!(
        r#"
{store}

[policies.org]
key = ["header:x-org"]
anonymous = {{ per_month = 150 }}

[policies.per_ip]
anonymous = {{ per_month = 200, per_minute = 100_000 }}

[[routes]]
name = "api"
path_prefix = "/api"
respond = {{ status = 200, body = "ok\n" }}
policy = ["org", "per_ip"]
"#
    )
}

/// `count` requests of organisation `org` from 127.0.9.1, alternating between two
/// replicas, all at once.
async fn alternate_org(
    a: std::net::SocketAddr,
    b: std::net::SocketAddr,
    org: &'static str,
    count: usize,
) -> crate::support::gateways::Tally {
    let tasks: Vec<_> = (0..count)
        .map(|i| {
            let addr = if i % 2 == 0 { a } else { b };
            tokio::spawn(async move {
                let req = Req::get("/api").header("x-org", org).from("127.0.9.1");
                req.send(addr).await.status.as_u16()
            })
        })
        .collect();
    let mut tally = crate::support::gateways::Tally::default();
    for task in tasks {
        tally.add(crate::support::within("fleet request", task).await.unwrap());
    }
    tally
}

/// Two replicas share the organisation's month exactly, and the address's month
/// counts only what was admitted: a refusal by the organisation charged the address
/// nothing, on either replica. Then the same address calls for another
/// organisation: on one server its month has 20 left of 200 (180 admitted, a top-up
/// of 30 included); on a Cluster the
/// address's counters are placed with each organisation's (one slot per decision),
/// so it starts afresh there (docs/quotas.md).
async fn fleet_shares_a_stacked_quota_exactly(store: &str, cluster: bool) {
    let toml = fleet_stacked(store);
    let (a, b) = (
        crate::support::gateways::gateway(&toml).await,
        crate::support::gateways::gateway(&toml).await,
    );
    let tally = alternate_org(a.addr, b.addr, "acme", 240).await;
    assert_eq!(
        (tally.ok, tally.limited, tally.unavailable + tally.other),
        (150, 90, 0)
    );
    let refused = Req::get("/api")
        .header("x-org", "acme")
        .from("127.0.9.1")
        .send(b.addr)
        .await;
    let problem = refused.problem(429);
    assert_eq!(
        problem["violated-policies"],
        serde_json::json!(["org-month"])
    );
    let state = refused.header("ratelimit").unwrap();
    assert_eq!(sf_param(state, "org-month", "r"), Some(0));
    assert_eq!(sf_param(state, "per_ip-month", "r"), Some(50));

    // A top-up through one replica's admin API is the fleet's: exactly 30 more.
    let credit = r#"{"caller": "ip:127.0.9.1", "policy": "org", "amount": 30,
                     "key": {"header:x-org": "acme"}}"#;
    let credited = Req::post("/admin/usage/credit", credit).send(a.admin).await;
    assert_eq!(credited.status, 200, "{}", credited.text());
    assert_eq!(credited.json()["limits"][0]["used"], 120);
    let tally = alternate_org(a.addr, b.addr, "acme", 40).await;
    assert_eq!(
        (tally.ok, tally.limited, tally.unavailable + tally.other),
        (30, 10, 0)
    );

    let tally = alternate_org(a.addr, b.addr, "globex", 60).await;
    let expected = if cluster { (60, 0, 0) } else { (20, 40, 0) };
    assert_eq!(
        (tally.ok, tally.limited, tally.unavailable + tally.other),
        expected
    );
    assert_eq!((a.store_errors(), b.store_errors()), (0, 0));
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_on_one_redis_share_a_stacked_quota_exactly() {
    let server = crate::support::redis_server::RedisServer::start();
    let store = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\non_error = \"deny\"\ntimeout = \"2s\"",
        server.url()
    );
    fleet_shares_a_stacked_quota_exactly(&store, false).await;
    // One key per organisation and one for the address, as if each policy were
    // used alone.
    assert_eq!(server.keys().len(), 3, "{:?}", server.keys());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_on_a_cluster_share_a_stacked_quota_exactly() {
    let cluster = crate::support::redis_server::cluster::RedisCluster::start(3, 0);
    let store = format!(
        "[store]\nbackend = \"redis\"\n{}\non_error = \"deny\"\ntimeout = \"2s\"",
        cluster.seeds_toml()
    );
    fleet_shares_a_stacked_quota_exactly(&store, true).await;
}

/// A monthly plan sold to acme (10 a month) and a minute limit beside it.
fn monthly_credit() -> String {
    r#"
[policies.org]
anonymous = "deny"
registered = { per_month = 10, per_minute = 1_000 }

[policies.minutes]
anonymous = { per_minute = 5 }
registered = { per_minute = 1_000 }

[[consumers]]
name = "acme"
key = "key-acme"

[[routes]]
name = "api"
path_prefix = "/api"
respond = { status = 200 }
policy = "org"
"#
    .to_string()
}

#[tokio::test]
async fn a_credit_gives_back_exactly_its_amount_in_the_current_month_and_never_more_than_used() {
    let gw = live(&monthly_credit()).await;
    let acme = || {
        Req::get("/api")
            .header("x-api-key", "key-acme")
            .send(gw.addr)
    };
    let credit = |body: &'static str| Req::post("/admin/usage/credit", body).send(gw.admin);
    for _ in 0..10 {
        assert_eq!(acme().await.status, 200);
    }
    assert_eq!(acme().await.status, 429);
    let credited = credit(r#"{"caller": "consumer:acme", "policy": "org", "amount": 4}"#).await;
    assert_eq!(credited.status, 200, "{}", credited.text());
    let answer = credited.json();
    assert_eq!(answer["credited"], 4);
    assert_eq!(answer["plan"], "registered");
    let month = answer["limits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["window"] == "month")
        .unwrap()
        .clone();
    assert_eq!(
        (month["limit"].clone(), month["used"].clone()),
        (10.into(), 6.into())
    );
    // Exactly the credited amount, then refused again.
    for i in 0..4 {
        let resp = acme().await;
        assert_eq!(resp.status, 200, "credited request {}", i + 1);
        assert_eq!(resp.sf_param("ratelimit", "month", "r"), Some(3 - i));
    }
    assert_eq!(acme().await.status, 429);
    // The minute windows are not credited: a credit is for billing periods.
    let usage = gw
        .admin(Req::get("/admin/usage?caller=consumer:acme"))
        .await
        .json();
    let org = (usage["policies"].as_array().unwrap().iter())
        .find(|p| p["policy"] == "org")
        .unwrap();
    let used: Vec<(String, u64)> = (org["limits"].as_array().unwrap().iter())
        .map(|l| {
            (
                l["window"].as_str().unwrap().to_string(),
                l["used"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        used,
        [("minute".to_string(), 14), ("month".to_string(), 10)]
    );

    // A credit larger than the usage only empties it: 10 again, not 110.
    let big = credit(r#"{"caller": "consumer:acme", "policy": "org", "amount": 100}"#).await;
    assert_eq!(big.status, 200, "{}", big.text());
    for _ in 0..10 {
        assert_eq!(acme().await.status, 200);
    }
    assert_eq!(acme().await.status, 429);

    let metrics = Req::get("/metrics").send(gw.admin).await.text();
    assert!(
        metrics.contains("sluice_usage_credits_total{policy=\"org\"} 2"),
        "{metrics}"
    );
    // DELETE /admin/usage still resets every counter.
    let reset = Req::new(http::Method::DELETE, "/admin/usage?caller=consumer:acme")
        .send(gw.admin)
        .await;
    assert_eq!(reset.status, 200);
    assert_eq!(acme().await.status, 200);
    gw.stop().await;
}

#[tokio::test]
async fn a_credit_that_cannot_apply_is_a_clear_400() {
    let gw = live(&monthly_credit()).await;
    let cases = [
        (
            r#"{"caller": "consumer:acme", "policy": "nope", "amount": 1}"#,
            "unknown policy \"nope\"",
        ),
        (
            r#"{"caller": "consumer:acme", "policy": "org", "amount": 0}"#,
            "amount must be at least 1",
        ),
        (
            r#"{"caller": "someone", "policy": "org", "amount": 1}"#,
            "caller must be",
        ),
        (
            r#"{"caller": "consumer:acme", "policy": "minutes", "amount": 1}"#,
            "has no per_month or per_year",
        ),
        (
            r#"{"caller": "ip:127.0.0.1", "policy": "org", "amount": 1}"#,
            "does not limit plan anonymous",
        ),
        (r#"{"caller": "consumer:acme", "policy": "org"}"#, "amount"),
    ];
    for (body, expected) in cases {
        let resp = Req::post("/admin/usage/credit", body).send(gw.admin).await;
        let problem = resp.problem(400);
        let detail = problem["detail"].as_str().unwrap_or_default();
        assert!(detail.contains(expected), "{body}: {detail}");
    }
    let get = Req::get("/admin/usage/credit").send(gw.admin).await;
    assert_eq!(get.status, 405);
    gw.stop().await;
}

/// org over per_key, per_key capping one request in flight (no queue), to an
/// upstream that answers `status` after `delay_ms`; 500s are refunded.
fn stacked_capped(upstream: &str) -> String {
    format!(
        r#"
[upstreams.api]
targets = ["{upstream}"]

[policies.org]
key = ["header:x-org"]
anonymous = "deny"
registered = {{ per_minute = 6 }}

[policies.per_key]
anonymous = "deny"
registered = {{ per_minute = 4 }}
concurrency = {{ max = 1, queue = 0 }}

[[consumers]]
name = "alice"
key = "key-alice"

[[routes]]
name = "api"
path_prefix = "/api"
upstream = "api"
policy = ["org", "per_key"]
refund_on = [500]
"#
    )
}

#[tokio::test]
async fn a_later_policys_cap_holds_a_slot_and_its_503_refunds_every_policy() {
    let up = crate::support::upstream_with(crate::support::UpstreamOptions {
        delay: std::time::Duration::from_secs(2),
        ..Default::default()
    })
    .await;
    let gw = live(&stacked_capped(&up.url())).await;
    let addr = gw.addr;
    let held = tokio::spawn(async move {
        Req::get("/api/slow")
            .header("x-api-key", "key-alice")
            .header("x-org", "acme")
            .send(addr)
            .await
    });
    crate::support::within("the first request reaches the upstream", async {
        while up.count() == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    let refused = call(&gw, "key-alice", "127.0.8.7").await;
    assert_eq!(refused.status, 503, "{}", refused.text());
    let first = crate::support::within("the held request", held)
        .await
        .unwrap();
    assert_eq!(first.status, 200);
    // The 503 was given back in org and per_key alike: only the held request and
    // this one are counted.
    let next = call(&gw, "key-alice", "127.0.8.7").await;
    assert_eq!(next.status, 200);
    let state = next.header("ratelimit").unwrap();
    assert_eq!(sf_param(state, "org-minute", "r"), Some(4));
    assert_eq!(sf_param(state, "per_key-minute", "r"), Some(2));
    assert_eq!(up.count(), 2);
    gw.stop().await;
}

#[tokio::test]
async fn a_refunded_answer_of_a_stacked_route_gives_back_in_every_policy() {
    let up = crate::support::upstream_with(crate::support::UpstreamOptions {
        status: 500,
        ..Default::default()
    })
    .await;
    let gw = live(&stacked_capped(&up.url())).await;
    for _ in 0..6 {
        let resp = call(&gw, "key-alice", "127.0.8.8").await;
        assert_eq!(resp.status, 500);
        let state = resp.header("ratelimit").unwrap();
        assert_eq!(sf_param(state, "org-minute", "r"), Some(6), "{state}");
        assert_eq!(sf_param(state, "per_key-minute", "r"), Some(4), "{state}");
    }
    assert_eq!(up.count(), 6);
    gw.stop().await;
}

#[tokio::test]
async fn cost_after_settles_in_every_policy_of_a_stacked_route() {
    let up = crate::support::upstream_with(crate::support::UpstreamOptions {
        body: Some(bytes::Bytes::from_static(
            br#"{"usage": {"total_tokens": 5}}"#,
        )),
        ..Default::default()
    })
    .await;
    let toml = format!(
        r#"
[upstreams.api]
targets = ["{}"]

[policies.org]
key = ["header:x-org"]
anonymous = "deny"
registered = {{ per_minute = 100 }}

[policies.per_key]
anonymous = "deny"
registered = {{ per_minute = 50 }}

[[consumers]]
name = "alice"
key = "key-alice"

[[routes]]
name = "api"
path_prefix = "/api"
upstream = "api"
policy = ["org", "per_key"]
cost_after = "json:usage.total_tokens"
"#,
        up.url()
    );
    let gw = live(&toml).await;
    assert_eq!(call(&gw, "key-alice", "127.0.8.9").await.status, 200);
    // Each policy is charged the 4 more the answer said, once its body has ended.
    let used = |policy: &'static str| {
        let gw = &gw;
        async move {
            let query = "/admin/usage?caller=consumer:alice&header:x-org=acme";
            let usage = gw.admin(Req::get(query)).await.json();
            (usage["policies"].as_array().unwrap().iter())
                .find(|p| p["policy"] == policy)
                .map(|p| p["limits"][0]["used"].as_u64().unwrap())
        }
    };
    crate::support::within("the charge after the answer", async {
        while used("org").await != Some(5) || used("per_key").await != Some(5) {
            tokio::task::yield_now().await;
        }
    })
    .await;
    let next = call(&gw, "key-alice", "127.0.8.9").await;
    let state = next.header("ratelimit").unwrap();
    assert_eq!(sf_param(state, "org-minute", "r"), Some(94));
    assert_eq!(sf_param(state, "per_key-minute", "r"), Some(44));
    gw.stop().await;
}

#[test]
fn a_cluster_store_warns_of_a_stacked_policy_that_would_count_in_two_places() {
    let toml = r#"
[store]
backend = "redis"
cluster = ["redis://127.0.0.1:1"]

[policies.org]
key = ["header:x-org"]
anonymous = { per_month = 1000 }

[policies.per_ip]
anonymous = { per_minute = 5 }

[[routes]]
name = "api"
path_prefix = "/api"
respond = { status = 200 }
policy = ["org", "per_ip"]

[[routes]]
name = "web"
path_prefix = "/web"
respond = { status = 200 }
policy = "per_ip"
"#;
    let path = std::path::Path::new("gateway.toml");
    let config = sluice::config::Config::parse(path, toml).unwrap();
    let warnings: Vec<String> = config.warnings.iter().map(|w| w.to_string()).collect();
    assert!(
        warnings.iter().any(|w| w.contains("routes[0].policy")
            && w.contains("placed with policy org's buckets")
            && w.contains("route web")),
        "{warnings:?}"
    );
    // On one server each policy keeps its own keys: nothing to warn of.
    let single = toml.replace(
        "cluster = [\"redis://127.0.0.1:1\"]",
        "url = \"redis://127.0.0.1:1\"",
    );
    let config = sluice::config::Config::parse(path, &single).unwrap();
    assert!(
        config
            .warnings
            .iter()
            .all(|w| !w.to_string().contains("placed with"))
    );
}

/// An organisation's month first, each key's month after it, on a three-master
/// Cluster: the key's counters sit with the organisation's bucket, and the admin API
/// reads, credits, exports and resets them there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_a_later_policys_counters_are_read_credited_and_reset() {
    let cluster = crate::support::redis_server::cluster::RedisCluster::start(3, 0);
    let toml = format!(
        r#"
[store]
backend = "redis"
{}
timeout = "2s"

[policies.org]
key = ["header:x-org"]
anonymous = "deny"
registered = {{ per_month = 100 }}

[policies.per_key]
anonymous = "deny"
registered = {{ per_month = 5 }}

[[consumers]]
name = "alice"
key = "key-alice"

[[routes]]
name = "api"
path_prefix = "/api"
respond = {{ status = 200, body = "ok\n" }}
policy = ["org", "per_key"]
"#,
        cluster.seeds_toml()
    );
    let gw = live(&toml).await;
    // Redis counts billing periods by its own clock: the gateway's is set to it.
    let now = sluice::clock::Clock::system().now_ms();
    gw.clock.store(now, std::sync::atomic::Ordering::SeqCst);
    let call = || {
        Req::get("/api")
            .header("x-api-key", "key-alice")
            .header("x-org", "acme")
    };
    for _ in 0..3 {
        assert_eq!(call().send(gw.addr).await.status, 200);
    }
    let usage_url = "/admin/usage?caller=consumer:alice&header:x-org=acme";
    let month = |usage: &serde_json::Value, policy: &str| {
        let policies = usage["policies"].as_array().unwrap();
        let found = policies.iter().find(|p| p["policy"] == policy).unwrap();
        found["limits"][0]["used"].as_u64().unwrap()
    };
    let usage = gw.admin(Req::get(usage_url)).await.json();
    assert_eq!(
        (month(&usage, "org"), month(&usage, "per_key")),
        (3, 3),
        "{usage}"
    );

    let credit = r#"{"caller": "consumer:alice", "policy": "per_key", "amount": 2}"#;
    let credited = gw.admin(Req::post("/admin/usage/credit", credit)).await;
    assert_eq!(credited.status, 200, "{}", credited.text());
    assert_eq!(
        credited.json()["limits"][0]["used"],
        1,
        "{}",
        credited.text()
    );
    // 4 more fit the key's month of 5, the next is refused by it.
    for _ in 0..4 {
        assert_eq!(call().send(gw.addr).await.status, 200);
    }
    let refused = call().send(gw.addr).await;
    let problem = refused.problem(429);
    assert_eq!(
        problem["violated-policies"],
        serde_json::json!(["per_key-month"])
    );

    let export = gw
        .admin(Req::get("/admin/usage?policy=per_key&format=jsonl"))
        .await;
    let rows: Vec<serde_json::Value> = (export.text().lines())
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(rows.len(), 1, "{}", export.text());
    assert_eq!(rows[0]["caller"], "consumer:alice");
    assert_eq!(rows[0]["limits"][0]["used"], 5);

    let reset = gw.admin(Req::new(http::Method::DELETE, usage_url)).await;
    assert_eq!(reset.json()["reset"], 2, "{}", reset.text());
    let usage = gw.admin(Req::get(usage_url)).await.json();
    assert_eq!(
        (month(&usage, "org"), month(&usage, "per_key")),
        (0, 0),
        "{usage}"
    );
    gw.stop().await;
}
