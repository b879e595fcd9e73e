//! A Redis that loses its data: restarted without persistence, or flushed. sluice
//! cannot give the counters back, but notices (its marker key is gone), logs,
//! counts (`sluice_store_resets_total`) and shows it in `/readyz`; a restart that
//! kept its data (an RDB file) is no reset. Against a real redis-server the test
//! starts, kills, restarts and flushes.

use crate::SERIAL;
use crate::support::gateways::{Gateway, gateway};
use crate::support::redis_server::cluster::RedisCluster;
use crate::support::redis_server::{MARKER, RedisServer};
use crate::support::within_for;

use std::time::Duration;

const RESETS: &str = "sluice_store_resets_total";

fn config(redis: &RedisServer) -> String {
    config_for(&format!("url = \"{}\"", redis.url()))
}

/// The config with `target` (`url = ...` or `cluster = [...]`) as the store.
fn config_for(target: &str) -> String {
    format!(
        r#"
[store]
backend = "redis"
{target}
on_error = "local"

[policies.shared]
anonymous = {{ per_minute = 2 }}

[[routes]]
name = "hello"
path_prefix = "/hello"
respond = {{ status = 200, body = "hello\n" }}
policy = "shared"
"#
    )
}

/// `/readyz` once it reports `resets` resets.
async fn readyz_with_resets(gw: &Gateway, resets: u64) -> serde_json::Value {
    within_for("the reset noticed", Duration::from_secs(15), async {
        loop {
            let resp = gw.readyz().await;
            let body = resp.json();
            if body["store_resets"].as_u64() >= Some(resets) {
                assert_eq!(resp.status, 200, "{body}");
                return body;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
}

/// Statuses of the caller 127.0.0.1 until Redis decides again: its 429 (the
/// counters it holds) or its 200s from a fresh window.
async fn until_decided_in_redis(gw: &Gateway, expect: u16) {
    let what = format!("decided in redis again, {expect}");
    within_for(&what, Duration::from_secs(15), async {
        loop {
            if gw.metric("sluice_store_fallback").await == 0.0
                && gw.get("/hello").await.status == expect
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restarted_empty_or_flushed_is_noticed_counted_and_shown_in_readyz() {
    let _serial = SERIAL.lock().await;
    let mut redis = RedisServer::start();
    let gw = gateway(&config(&redis)).await;
    within_for("the marker written", Duration::from_secs(10), async {
        while !redis.all_keys().iter().any(|k| k == MARKER) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    for _ in 0..2 {
        assert_eq!(gw.get("/hello").await.status, 200);
    }
    assert_eq!(gw.get("/hello").await.status, 429);
    let ready = gw.readyz().await;
    assert_eq!(ready.status, 200);
    let body = ready.json();
    assert_eq!(
        (body["store"].as_str(), body["store_resets"].as_u64()),
        (Some("ok"), Some(0)),
        "{body}"
    );

    // Restarted with its data (saved to its RDB file first): the counters and the
    // marker come back, no reset; the caller is still refused.
    let _: String = redis.query(&redis::cmd("SAVE"));
    redis.restart();
    until_decided_in_redis(&gw, 429).await;
    // Another caller uses its whole window (not refused yet, so nothing about it is
    // remembered outside Redis).
    for _ in 0..2 {
        assert_eq!(gw.get_from("127.0.0.2", "/hello").await.status, 200);
    }

    // Restarted empty: noticed once, as a restart.
    redis.kill();
    std::fs::remove_file(redis.dir().join("dump.rdb")).unwrap();
    redis.restart();
    let body = readyz_with_resets(&gw, 1).await;
    assert_eq!(
        body["store_resets"], 1,
        "the kept restart is no reset: {body}"
    );
    assert_eq!(
        body["last_store_reset"]["reason"], "restarted empty",
        "{body}"
    );
    assert_eq!(gw.metric(RESETS).await, 1.0);
    // As the docs say: every caller starts a fresh window.
    assert!(redis.keys().is_empty(), "{:?}", redis.keys());
    within_for("the breaker closed", Duration::from_secs(15), async {
        while gw.metric("sluice_store_fallback").await != 0.0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    for status in [200, 200, 429] {
        assert_eq!(gw.get_from("127.0.0.2", "/hello").await.status, status);
    }

    // Flushed: noticed as a flush.
    redis.flushall();
    let body = readyz_with_resets(&gw, 2).await;
    assert_eq!(body["store_resets"], 2, "{body}");
    assert_eq!(body["last_store_reset"]["reason"], "flushed", "{body}");
    assert_eq!(gw.metric(RESETS).await, 2.0);
    assert!(redis.all_keys().iter().any(|k| k == MARKER), "a new marker");
    gw.stop().await;
}

/// Whether `node` holds a Cluster master's reset marker.
fn holds_marker(node: &RedisServer) -> bool {
    node.all_keys()
        .iter()
        .any(|key| key.starts_with("sluice:epoch:{"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_cluster_master_that_is_not_the_first_is_noticed_and_named() {
    let _serial = SERIAL.lock().await;
    let cluster = RedisCluster::start(3, 1);
    let gw = gateway(&config_for(&cluster.seeds_toml())).await;
    let masters = cluster.masters();
    within_for("a marker on every master", Duration::from_secs(15), async {
        while !masters.iter().all(|&m| holds_marker(&cluster.nodes[m])) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert_eq!(gw.get("/hello").await.status, 200);
    // Not the master of the one marker there was (`sluice:epoch`'s slot).
    let first = cluster.master_of_slot(cluster.slot(MARKER));
    let victim = *masters.iter().find(|&&m| m != first).unwrap();
    let body = gw.readyz().await.json();
    assert_eq!(body["store_resets"], 0, "{body}");

    cluster.nodes[victim].flushall();
    let body = readyz_with_resets(&gw, 1).await;
    assert_eq!(body["store_resets"], 1, "one master flushed: {body}");
    assert_eq!(body["last_store_reset"]["reason"], "flushed", "{body}");
    let address = format!("127.0.0.1:{}", cluster.nodes[victim].port());
    assert_eq!(
        body["last_store_reset"]["master"],
        address.as_str(),
        "{body}"
    );
    assert_eq!(gw.metric(RESETS).await, 1.0);
    within_for("a new marker", Duration::from_secs(15), async {
        while !holds_marker(&cluster.nodes[victim]) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    gw.stop().await;
}
