//! The decision listener in a fleet: two replicas on one Redis Cluster, or on one
//! Sentinel-managed master, answer Envoy's rate limit service (Envoy's generated
//! client) and forward auth from one budget, with exact counts: the same callers
//! sent through either replica are admitted exactly their limit, a descriptor's own
//! limit counts once for the fleet, and a negative hit given back through one
//! replica is room on the other.

use crate::SERIAL;
use crate::support;
use crate::support::gateways;
use crate::support::redis_server;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use gateways::{Gateway, gateway, status};
use redis_server::cluster::RedisCluster;
use redis_server::sentinel::RedisSentinels;
use serde_json::{Value, json};
use support::{Req, within};

/// Sends `calls` to each replica's decision listener at once (each replica's in
/// order); every answer.
async fn rls_on_both(a: &Gateway, b: &Gateway, calls: Value) -> Vec<Value> {
    let mut tasks = Vec::new();
    for addr in [a.decision(), b.decision()] {
        let calls = calls.clone();
        tasks.push(tokio::task::spawn_blocking(move || {
            support::rls::rls(&addr.to_string(), &calls)
        }));
    }
    let mut answers = Vec::new();
    for task in tasks {
        answers.extend(within("Envoy's client", task).await.unwrap());
    }
    answers
}

/// How many answers have `overall_code` `code`.
fn codes(answers: &[Value], code: &str) -> usize {
    answers.iter().filter(|a| a["overall_code"] == code).count()
}

/// A forward-auth request for `GET /api/x` from `client`: its status.
async fn forward_auth(decision: SocketAddr, client: &str) -> u16 {
    let request = Req::get("/v1/forward-auth")
        .header("x-forwarded-method", "GET")
        .header("x-forwarded-host", "shop.example")
        .header("x-forwarded-uri", "/api/x")
        .header("x-forwarded-for", client);
    request.send(decision).await.status.as_u16()
}

/// Waits until both replicas decide in Redis (a replica may answer 503 while it
/// still finds the master; `on_error = "deny"` counts nothing then).
async fn wait_decided(a: &Gateway, b: &Gateway) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while status(a.addr, "127.0.9.250", "/api/warm").await != 200
        || status(b.addr, "127.0.9.250", "/api/warm").await != 200
    {
        assert!(
            Instant::now() < deadline,
            "no decision from Redis within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every door of both replicas counts one budget, exactly.
async fn decisions_are_fleet_exact(a: &Gateway, b: &Gateway) {
    wait_decided(a, b).await;
    let warmed = (a.store_errors(), b.store_errors());
    // RLS through a policy: 8 calls on each replica, one caller of 10 a minute.
    let address = json!({"domain": "edge", "descriptors": [
        {"entries": [["remote_address", "127.0.9.1"]]}]});
    let answers = rls_on_both(a, b, json!(vec![address; 8])).await;
    assert_eq!(
        (codes(&answers, "OK"), codes(&answers, "OVER_LIMIT")),
        (10, 6),
        "{answers:#?}"
    );
    // RLS through a descriptor's own limit: 5 a minute for the fleet.
    let own = json!({"domain": "any", "descriptors": [{"entries": [["k", "fleet"]],
        "limit": {"requests_per_unit": 5, "unit": "MINUTE"}}]});
    let answers = rls_on_both(a, b, json!(vec![own.clone(); 6])).await;
    assert_eq!(
        (codes(&answers, "OK"), codes(&answers, "OVER_LIMIT")),
        (5, 7)
    );
    // Given back through one replica: room on the other, exactly that much.
    let mut negative = own.clone();
    negative["descriptors"][0]["hits_addend"] = json!(2);
    negative["descriptors"][0]["negative"] = json!(true);
    let given = support::rls::rls(&a.decision().to_string(), &json!([negative]));
    assert_eq!(given[0]["statuses"][0]["limit_remaining"], 2, "{given:?}");
    // b remembers its refusals for at most a quarter second (the memo's fleet
    // bound): its first OK comes within that, then exactly one more fits.
    let started = Instant::now();
    loop {
        let one = support::rls::rls(&b.decision().to_string(), &json!([own.clone()]));
        if codes(&one, "OK") == 1 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the room given back through a never reached b: {one:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let after = support::rls::rls(&b.decision().to_string(), &json!(vec![own; 2]));
    assert_eq!((codes(&after, "OK"), codes(&after, "OVER_LIMIT")), (1, 1));
    // Forward auth: 8 on each replica for one client of 10 a minute.
    let mut tasks = Vec::new();
    for i in 0..16 {
        let decision = if i % 2 == 0 {
            a.decision()
        } else {
            b.decision()
        };
        tasks.push(tokio::spawn(forward_auth(decision, "127.0.9.2")));
    }
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.push(within("forward auth", task).await.unwrap());
    }
    statuses.sort();
    assert_eq!(statuses, [[200; 10].as_slice(), &[429; 6]].concat());
    // And what they counted is the fleet's: either replica's usage shows it all.
    for replica in [a, b] {
        let usage = (replica.admin(Req::get("/admin/usage?caller=ip:127.0.9.2"))).await;
        let used = &usage.json()["policies"][0]["limits"][0]["used"];
        assert_eq!(used, 10, "{}", usage.text());
    }
    assert_eq!((a.store_errors(), b.store_errors()), warmed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rls_and_forward_auth_count_one_budget_through_a_redis_cluster() {
    let _serial = SERIAL.lock().await;
    let cluster = RedisCluster::start(3, 1);
    let toml = format!(
        "[store]\nbackend = \"redis\"\n{}\non_error = \"deny\"\ntimeout = \"2s\"\n{}",
        cluster.seeds_toml(),
        support::rls::DOORS
    );
    let (a, b) = (gateway(&toml).await, gateway(&toml).await);
    decisions_are_fleet_exact(&a, &b).await;
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rls_and_forward_auth_count_one_budget_through_sentinel() {
    let _serial = SERIAL.lock().await;
    let setup = RedisSentinels::start();
    let toml = format!(
        "[store]\nbackend = \"redis\"\n{}\non_error = \"deny\"\ntimeout = \"1s\"\n{}",
        setup.sentinel_toml(),
        support::rls::DOORS
    );
    let (a, b) = (gateway(&toml).await, gateway(&toml).await);
    decisions_are_fleet_exact(&a, &b).await;
    a.stop().await;
    b.stop().await;
}
