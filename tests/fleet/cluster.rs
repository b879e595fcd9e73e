//! Fleet mode on a Redis Cluster: three masters, three replicas, made by
//! `redis-cli --cluster create` on free loopback ports for each test.
//!
//! Gateways run in-process, each with a store of its own (two replicas of the
//! fleet), on the real clock: Redis decides with its own `TIME`. Tests take turns
//! ([`SERIAL`]); every wait is bounded. The failover test prints the gap and the
//! admissions beyond the limit it measured (`cargo test --test fleet -- cluster:: --nocapture`).

use crate::SERIAL;
use crate::support;
use crate::support::gateways;
use crate::support::redis_server;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use gateways::{Run, Tally, failover, gateway, load, policies, status};
use redis_server::RedisServer;
use redis_server::cluster::RedisCluster;
use support::{Req, within};

/// `[store]` on `cluster` with extra lines, then the policies and routes.
fn config(cluster: &RedisCluster, store: &str, rest: &str) -> String {
    format!(
        "[store]\nbackend = \"redis\"\n{}\n{store}\n\n{rest}",
        cluster.seeds_toml()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_on_a_three_master_cluster_admit_exactly_each_callers_limit_and_the_total() {
    let _serial = SERIAL.lock().await;
    let cluster = RedisCluster::start(3, 1);
    // Fail closed: a decision that did not come from the cluster would be a 503.
    let toml = config(
        &cluster,
        "on_error = \"deny\"\ntimeout = \"2s\"",
        &policies(150),
    );
    let (a, b) = (gateway(&toml).await, gateway(&toml).await);

    // 40 callers, 16 requests each to /own (limit 10) and 6 to /pooled (total 150),
    // all at once, alternating between the two replicas.
    let mut tasks = Vec::new();
    for caller in 0..40 {
        let ip = format!("127.0.2.{}", caller + 1);
        for (path, count) in [("/own", 16), ("/pooled", 6)] {
            for i in 0..count {
                let addr = if i % 2 == 0 { a.addr } else { b.addr };
                let ip = ip.clone();
                tasks.push(tokio::spawn(async move {
                    (caller, path, status(addr, &ip, path).await)
                }));
            }
        }
    }
    let mut own = vec![Tally::default(); 40];
    let mut pooled = Tally::default();
    for task in tasks {
        let (caller, path, status) = within("cluster requests", task).await.unwrap();
        match path {
            "/own" => own[caller].add(status),
            _ => pooled.add(status),
        }
    }
    for (caller, tally) in own.iter().enumerate() {
        assert_eq!(
            (tally.ok, tally.limited, tally.unavailable + tally.other),
            (10, 6, 0),
            "caller {caller} on /own"
        );
    }
    assert_eq!(
        (pooled.ok, pooled.limited, pooled.unavailable + pooled.other),
        (150, 90, 0),
        "/pooled"
    );
    assert_eq!((a.store_errors(), b.store_errors()), (0, 0));
    // Each caller's /own counters are under a tag of its own, spread over the
    // masters; the pooled ones (callers admitted before the total ran out, and the
    // total) share the policy's tag, on one master.
    let keys: Vec<Vec<String>> = cluster
        .masters()
        .into_iter()
        .map(|i| cluster.nodes[i].keys())
        .collect();
    let own: Vec<usize> = keys
        .iter()
        .map(|on| on.iter().filter(|k| k.ends_with('}')).count())
        .collect();
    assert_eq!(own.iter().sum::<usize>(), 40, "{keys:#?}");
    assert!(
        own.iter().all(|&n| n > 0),
        "every master holds counters: {own:?}"
    );
    let pooled = keys
        .iter()
        .filter(|on| on.iter().any(|k| k.ends_with(":total")))
        .count();
    assert_eq!(pooled, 1, "{keys:#?}");
    assert_eq!((a.store_errors(), b.store_errors()), (0, 0));
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_ban_made_through_one_replica_is_enforced_by_the_other_on_a_cluster() {
    let _serial = SERIAL.lock().await;
    let cluster = RedisCluster::start(3, 1);
    let toml = format!(
        "{}\n[ban]\nafter = 3\nwithin = \"1m\"\nduration = \"10m\"\n",
        config(
            &cluster,
            "on_error = \"deny\"\ntimeout = \"1s\"",
            &policies(1_000)
        )
    );
    let (a, b) = (gateway(&toml).await, gateway(&toml).await);
    // A manual ban through a's admin API reaches b.
    let made = Req::post(
        "/admin/bans",
        r#"{"caller": "ip:127.0.3.9", "duration": "5m", "reason": "scraper"}"#,
    )
    .header("content-type", "application/json")
    .send(a.admin)
    .await;
    assert_eq!(made.status, 201, "{}", made.text());
    // An automatic ban earned through b (10 admitted, then 3 refusals) reaches a.
    for _ in 0..13 {
        status(b.addr, "127.0.3.10", "/own").await;
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut seen = (0, 0);
    while Instant::now() < deadline {
        seen = (
            status(b.addr, "127.0.3.9", "/own").await,
            status(a.addr, "127.0.3.10", "/own").await,
        );
        if seen == (403, 403) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(seen, (403, 403), "each replica enforces the other's ban");
    a.stop().await;
    b.stop().await;
}

/// The master holding `key`'s slot.
fn master_of(cluster: &RedisCluster, key: &str) -> usize {
    cluster.master_of_slot(cluster.slot(key))
}

/// The pooled policy's total key (its hash tag is the policy's).
fn total_key(cluster: &RedisCluster) -> String {
    cluster
        .masters()
        .into_iter()
        .flat_map(|i| cluster.nodes[i].keys())
        .find(|key| key.ends_with(":total"))
        .expect("the pooled policy's total key")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_master_is_followed_to_its_replica_the_gap_follows_on_error_and_is_measured() {
    let _serial = SERIAL.lock().await;
    let mut cluster = RedisCluster::start(3, 1);
    const TOTAL: usize = 400;
    let store = "on_error = \"deny\"\ntimeout = \"200ms\"";
    let toml = config(&cluster, store, &policies(TOTAL as u32));
    let (a, b) = (gateway(&toml).await, gateway(&toml).await);
    assert_eq!(status(a.addr, "127.0.4.200", "/pooled").await, 200);
    let key = total_key(&cluster);
    let victim = master_of(&cluster, &key);

    // 2 x 60 requests a second; the master holding the total dies after 2 s. Until
    // the replica is promoted and found, answers are 503 (on_error = "deny").
    let run = failover(
        &[&a, &b],
        "/pooled",
        &mut cluster,
        |cluster| cluster.nodes[victim].kill(),
        |cluster| master_of(cluster, &key) != victim,
    )
    .await;
    // One admitted before the load.
    run.check("cluster", 1, TOTAL);
    let after = status(a.addr, "127.0.4.201", "/pooled").await;
    assert_eq!(after, 429, "the promoted replica holds the total");
    a.stop().await;
    b.stop().await;
}

/// Moves `slot` from master `from` to master `to` the way `redis-cli --cluster
/// reshard` does: IMPORTING, MIGRATING, MIGRATE of its keys, then NODE everywhere.
fn migrate_slot(cluster: &RedisCluster, slot: u16, from: usize, to: usize) {
    let (source, target) = (&cluster.nodes[from], &cluster.nodes[to]);
    let setslot = |node: &RedisServer, how: &str, id: &str| {
        let _: String = node.query(
            redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg(how)
                .arg(id),
        );
    };
    setslot(target, "IMPORTING", &cluster.id(from));
    setslot(source, "MIGRATING", &cluster.id(to));
    loop {
        let keys: Vec<String> = source.query(
            redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(slot)
                .arg(100),
        );
        if keys.is_empty() {
            break;
        }
        let _: redis::Value = source.query(
            redis::cmd("MIGRATE")
                .arg("127.0.0.1")
                .arg(target.port())
                .arg("")
                .arg(0)
                .arg(5_000)
                .arg("KEYS")
                .arg(&keys),
        );
    }
    let to_id = cluster.id(to);
    for i in cluster.masters() {
        setslot(&cluster.nodes[i], "NODE", &to_id);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slots_migrated_under_load_lose_no_count_and_no_request_fails() {
    let _serial = SERIAL.lock().await;
    let cluster = RedisCluster::start(3, 1);
    const TOTAL: usize = 300;
    let store = "on_error = \"deny\"\ntimeout = \"1s\"";
    let toml = config(&cluster, store, &policies(TOTAL as u32));
    let (a, b) = (gateway(&toml).await, gateway(&toml).await);
    // The pooled total's slot, and the slot of one caller's /own counters (in a call
    // with other callers of its node: the map goes stale under it).
    assert_eq!(status(a.addr, "127.0.4.200", "/pooled").await, 200);
    assert_eq!(status(a.addr, "127.0.4.7", "/own").await, 200);
    let total = total_key(&cluster);
    let own = cluster
        .masters()
        .into_iter()
        .flat_map(|i| cluster.nodes[i].keys())
        .find(|key| key.ends_with("0000ffff7f000407}"))
        .expect("127.0.4.7's /own counters");
    let moves: Vec<(String, u16, usize, usize)> = [total, own]
        .into_iter()
        .map(|key| {
            let from = master_of(&cluster, &key);
            let to = *cluster.masters().iter().find(|&&m| m != from).unwrap();
            let slot = cluster.slot(&key);
            (key, slot, from, to)
        })
        .collect();

    let stop = Arc::new(AtomicBool::new(false));
    let mut loads = Vec::new();
    for addr in [a.addr, b.addr] {
        loads.push(tokio::spawn(load(addr, "/pooled", 70, stop.clone())));
        loads.push(tokio::spawn(load(addr, "/own", 40, stop.clone())));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let moving = Instant::now();
    for (_, slot, from, to) in &moves {
        migrate_slot(&cluster, *slot, *from, *to);
    }
    let moved = moving.elapsed();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    stop.store(true, Ordering::Relaxed);
    let mut runs = Vec::new();
    for task in loads {
        runs.push(within("the load", task).await.unwrap());
    }
    let (pooled, _) = Run::merge(&[runs.remove(0), runs.remove(1)]);
    let (own, _) = Run::merge(&runs);
    eprintln!("2 slots moved in {moved:?} under load: /pooled {pooled:?}, /own {own:?}");
    for (key, _, _, to) in &moves {
        assert_eq!(master_of(&cluster, key), *to);
        assert!(cluster.nodes[*to].keys().contains(key), "{key} moved");
    }
    for (path, tally) in [("/pooled", pooled), ("/own", own)] {
        assert_eq!(
            (tally.unavailable, tally.other),
            (0, 0),
            "{path}: no request failed during the migrations"
        );
    }
    // Every count survived the moves: the total was reached exactly (one admitted
    // before the load), and each of the 50 callers now gets exactly what its 10 a
    // minute leave (the load gave each fewer than 10).
    assert_eq!(pooled.ok + 1, TOTAL, "{pooled:?}");
    assert_eq!(status(b.addr, "127.0.4.201", "/pooled").await, 429);
    let mut after = 0;
    for n in 1..=50 {
        let ip = format!("127.0.4.{n}");
        while status(a.addr, &ip, "/own").await == 200 {
            after += 1;
            assert!(after <= 500, "/own never refuses");
        }
    }
    assert_eq!(own.ok + 1 + after, 50 * 10, "/own: {own:?}, {after} after");
    assert_eq!((a.store_errors(), b.store_errors()), (0, 0));
    a.stop().await;
    b.stop().await;
}

/// One request packed as the limit script reads it (`src/store/redis/limit.lua`):
/// one shape of one caller quota and one total quota (per minute, exact ms), then
/// the request: `cost` with `flags`, caller key 2, total key 3 (1-based); no
/// deadline.
fn packed_request(cost: u32, flags: u32, caller_limit: u32, total_limit: u32) -> Vec<u8> {
    let mut packed = Vec::new();
    packed.extend(1u16.to_le_bytes());
    packed.extend(1u16.to_le_bytes());
    packed.extend(0f64.to_le_bytes());
    packed.extend([1u8, 1, 0, 0]);
    for limit in [caller_limit, total_limit] {
        packed.push(1);
        packed.extend(limit.to_le_bytes());
        packed.extend(1u32.to_le_bytes());
    }
    packed.extend((cost | flags).to_le_bytes());
    packed.extend(2u16.to_le_bytes());
    packed.extend(3u16.to_le_bytes());
    packed.extend(1u16.to_le_bytes());
    packed
}

/// The `used` figures of the one request in a script answer: `now`, admitted, Q,
/// then (used, reset, retry) per quota checked.
fn used_in(answer: &[u8]) -> Vec<f64> {
    let checked = usize::from(answer[9]);
    (0..checked)
        .map(|q| {
            let at = 10 + 24 * q;
            f64::from_le_bytes(answer[at..at + 8].try_into().unwrap())
        })
        .collect()
}

#[test]
fn a_charge_in_a_call_that_spans_slots_counts_in_the_policys_total() {
    // A call carrying several hash tags of one Cluster node declares only its first
    // key and names the rest in its arguments: a charge (a cost known after the
    // response) must find the policy's total there too, as admissions do.
    let node = RedisServer::start_cluster();
    let script = format!(
        "#!lua flags=allow-cross-slot-keys\n{}",
        include_str!("../../src/store/redis/limit.lua")
    );
    let keys = ["sluice:{a}:first", "sluice:{b}:caller", "sluice:{c}:total"];
    let spread = |packed: Vec<u8>| -> Vec<u8> {
        let mut eval = redis::cmd("EVAL");
        eval.arg(&script).arg(1).arg(keys[0]).arg(packed);
        for key in keys {
            eval.arg(key);
        }
        node.query(&eval)
    };
    const CHARGE: u32 = 1 << 30;
    spread(packed_request(7, CHARGE, 10, 100));
    let report = spread(packed_request(0, 0, 10, 100));
    assert_eq!(
        used_in(&report),
        [7.0, 7.0],
        "caller and total after a charge of 7"
    );
    assert!(
        node.keys().contains(&keys[2].to_string()),
        "{:?}",
        node.keys()
    );
}
