//! Fleet mode on a Sentinel-managed master: a master, a replica and three sentinels
//! on free loopback ports for each test.
//!
//! Gateways run in-process, each with a store of its own, on the real clock. Tests
//! take turns ([`SERIAL`]); every wait is bounded. The failover test prints the gap
//! and the admissions beyond the limit it measured
//! (`cargo test --test fleet -- sentinel:: --nocapture`).

use crate::SERIAL;
use crate::support;
use crate::support::gateways;
use crate::support::redis_server;

use std::time::{Duration, Instant};

use gateways::{failover, gateway, policies, status};
use redis_server::sentinel::RedisSentinels;
use support::within;

/// `[store]` through the sentinels, with `store` lines, then the policies and
/// routes of [`policies`].
fn config(setup: &RedisSentinels, store: &str, total: u32) -> String {
    format!(
        "[store]\nbackend = \"redis\"\n{}\n{store}\n{}",
        setup.sentinel_toml(),
        policies(total)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_find_the_master_through_the_sentinels_and_count_exactly() {
    let _serial = SERIAL.lock().await;
    let setup = RedisSentinels::start();
    let toml = config(&setup, "on_error = \"deny\"\ntimeout = \"1s\"", 1_000);
    let (a, b) = (gateway(&toml).await, gateway(&toml).await);
    // The first requests may come before the sentinels answered: 503 (deny), never
    // counted. Wait for the first decision from Redis.
    let deadline = Instant::now() + Duration::from_secs(5);
    while status(a.addr, "127.0.5.200", "/pooled").await != 200
        || status(b.addr, "127.0.5.200", "/pooled").await != 200
    {
        assert!(Instant::now() < deadline, "no master found within 5 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Errors while the master was still being found are expected; none after.
    let warmed = (a.store_errors(), b.store_errors());
    let mut tasks = Vec::new();
    for i in 0..16 {
        let addr = if i % 2 == 0 { a.addr } else { b.addr };
        tasks.push(tokio::spawn(async move {
            status(addr, "127.0.5.1", "/own").await
        }));
    }
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.push(within("a request", task).await.unwrap());
    }
    statuses.sort();
    assert_eq!(statuses, [[200; 10].as_slice(), &[429; 6]].concat());
    // The counters are in the master, and replicated.
    let own = |keys: Vec<String>| keys.iter().filter(|k| k.ends_with('}')).count();
    assert_eq!(own(setup.master.keys()), 1);
    let deadline = Instant::now() + Duration::from_secs(2);
    while own(setup.replica.keys()) != 1 {
        assert!(Instant::now() < deadline, "not replicated within 2 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!((a.store_errors(), b.store_errors()), warmed);
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn over_tls_the_sentinels_and_the_master_are_trusted_through_ca_file_and_no_other() {
    let _serial = SERIAL.lock().await;
    let (setup, ca) = RedisSentinels::start_tls();
    // The sentinels name the master's TLS port, by address: its certificate must
    // verify for 127.0.0.1 against the same CA as the sentinels' for `localhost`.
    assert_eq!(setup.named_master_port(), setup.tls_ports.master);
    let toml = |ca_line: &str| {
        format!(
            "[store]\nbackend = \"redis\"\n{}\n{ca_line}\non_error = \"deny\"\ntimeout = \"1s\"\n{}",
            setup.sentinel_tls_toml(),
            policies(1_000)
        )
    };
    let gw = gateway(&toml(&format!("ca_file = \"{}\"", ca.display()))).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while status(gw.addr, "127.0.5.200", "/pooled").await != 200 {
        assert!(
            Instant::now() < deadline,
            "no master found over TLS within 5 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut statuses = Vec::new();
    for _ in 0..12 {
        statuses.push(status(gw.addr, "127.0.5.1", "/own").await);
    }
    assert_eq!(statuses, [[200; 10].as_slice(), &[429; 2]].concat());
    let own = |keys: Vec<String>| keys.iter().filter(|k| k.ends_with('}')).count();
    assert_eq!(own(setup.master.keys()), 1, "the count is in the master");
    gw.stop().await;
    // Without the CA the system's roots trust neither: no decision, ever (deny: 503).
    let gw = gateway(&toml("")).await;
    for _ in 0..5 {
        assert_eq!(status(gw.addr, "127.0.5.2", "/own").await, 503);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(gw.store_errors() > 0);
    assert_eq!(
        own(setup.master.keys()),
        1,
        "nothing counted without the CA"
    );
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_master_is_followed_to_the_promoted_replica_and_the_gap_is_measured() {
    let _serial = SERIAL.lock().await;
    let mut setup = RedisSentinels::start();
    const TOTAL: usize = 400;
    let toml = config(
        &setup,
        "on_error = \"deny\"\ntimeout = \"200ms\"",
        TOTAL as u32,
    );
    let (a, b) = (gateway(&toml).await, gateway(&toml).await);
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut first = 0;
    while first != 200 {
        assert!(Instant::now() < deadline, "no master found within 5 s");
        first = status(a.addr, "127.0.4.200", "/pooled").await;
    }
    let replica_port = setup.replica.port();

    // 2 x 60 requests a second; the master dies after 2 s.
    let run = failover(
        &[&a, &b],
        "/pooled",
        &mut setup,
        |setup| setup.master.kill(),
        |setup| setup.named_master_port() == Some(replica_port),
    )
    .await;
    run.check("sentinel", 1, TOTAL);
    // The promoted replica holds the total now.
    assert!(setup.replica.keys().iter().any(|k| k.ends_with(":total")));
    assert_eq!(status(b.addr, "127.0.4.201", "/pooled").await, 429);
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_wait_replicas_a_decision_is_answered_only_once_the_replica_has_it() {
    let _serial = SERIAL.lock().await;
    let mut setup = RedisSentinels::start();
    let store = "on_error = \"deny\"\ntimeout = \"300ms\"\nwait_replicas = 1";
    let a = gateway(&config(&setup, store, 1_000)).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while status(a.addr, "127.0.5.200", "/pooled").await != 200 {
        assert!(Instant::now() < deadline, "no master found within 5 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut statuses = Vec::new();
    for _ in 0..11 {
        statuses.push(status(a.addr, "127.0.5.2", "/own").await);
    }
    assert_eq!(statuses, [[200; 10].as_slice(), &[429]].concat());
    // Every admitted count is on the replica when the answer comes.
    let own = |keys: Vec<String>| keys.iter().filter(|k| k.ends_with('}')).count();
    assert_eq!(own(setup.replica.keys()), 1);
    // A replica that does not acknowledge: no decision (deny: 503), though the
    // master answers.
    setup.replica.pause();
    assert_eq!(status(a.addr, "127.0.5.3", "/own").await, 503);
    setup.replica.resume();
    let deadline = Instant::now() + Duration::from_secs(5);
    while status(a.addr, "127.0.5.4", "/own").await != 200 {
        assert!(
            Instant::now() < deadline,
            "not back within 5 s of the replica"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    a.stop().await;
}
