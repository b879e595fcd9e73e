//! Quotas people sell: monthly and yearly billing periods (calendar and anchored),
//! kept across restarts by the state file and shared by a fleet through Redis (one
//! server and a Cluster).
//!
//! In-process gateways run on a manual clock where the test moves time; the real
//! binary is started with `SLUICE_TEST_NOW` to live through a month's end; fleet
//! tests run on the real clock, as Redis decides by its own.

#![allow(clippy::unwrap_used)] // a test fails by panicking

mod export;
mod process;
mod stacked;
#[path = "../support/mod.rs"]
pub mod support;

use process::Proc;
use support::gateways::{Tally, gateway, status};
use support::redis_server::RedisServer;
use support::redis_server::cluster::RedisCluster;
use support::{ACME_SHA256, Req, gateway_at, ms, within};

/// A monthly plan in Paris time: acme counts calendar months, beta billing months
/// from the 31st.
fn monthly(extra: &str) -> String {
    format!(
        r#"
[limits]
timezone = "Europe/Paris"
{extra}
[policies.plans]
anonymous = {{ per_minute = 100 }}
registered = {{ per_month = 3, per_year = 100 }}

[[consumers]]
name = "acme"
key_sha256 = "{ACME_SHA256}"

[[consumers]]
name = "beta"
key = "demo-key-beta"
billing_anchor = "2026-01-31"

[[routes]]
name = "api"
path_prefix = "/api"
respond = {{ status = 200, body = "ok\n" }}
policy = "plans"
"#
    )
}

fn as_acme() -> Req {
    Req::get("/api").header("x-api-key", "demo-key-acme")
}

fn as_beta() -> Req {
    Req::get("/api").header("x-api-key", "demo-key-beta")
}

#[tokio::test]
async fn a_month_ends_at_local_midnight_and_an_anchored_month_on_the_shorter_months_last_day() {
    // Paris, 2026-02-27 23:59:50.
    let gw = gateway_at(&monthly(""), ms("2026-02-27T22:59:50Z")).await;
    for who in [as_acme, as_beta] {
        for i in 0..3 {
            let resp = who().send(gw.addr).await;
            assert_eq!(resp.status, 200, "request {}", i + 1);
            assert_eq!(resp.sf_param("ratelimit", "month", "r"), Some(2 - i));
            assert_eq!(resp.sf_param("ratelimit-policy", "month", "q"), Some(3));
        }
    }
    let acme = as_acme().send(gw.addr).await;
    let problem = acme.problem(429);
    assert_eq!(problem["violated-policies"], serde_json::json!(["month"]));
    // Until March 1st 00:00 in Paris: a day and ten seconds.
    assert_eq!(acme.retry_after(), 86_410);
    assert_eq!(acme.sf_param("ratelimit", "month", "t"), Some(86_410));
    // beta's month started on January 31st: the next starts on February 28th.
    let beta = as_beta().send(gw.addr).await;
    assert_eq!(beta.status, 429);
    assert_eq!(beta.retry_after(), 10);

    gw.set_ms(ms("2026-02-27T23:00:00Z"));
    assert_eq!(as_beta().send(gw.addr).await.status, 200);
    assert_eq!(as_acme().send(gw.addr).await.status, 429);
    gw.set_ms(ms("2026-02-28T23:00:00Z") - 1);
    assert_eq!(as_acme().send(gw.addr).await.status, 429);
    gw.set_ms(ms("2026-02-28T23:00:00Z"));
    let resp = as_acme().send(gw.addr).await;
    assert_eq!(resp.status, 200);
    // The year counts on: 4 of 100 used since January 1st.
    assert_eq!(resp.sf_param("ratelimit", "year", "r"), Some(96));
    gw.stop().await;
}

#[tokio::test]
async fn retry_after_is_exact_across_the_spring_dst_change() {
    // Paris, Saturday 2026-03-28 12:00 +01:00; clocks skip 02:00-03:00 on the 29th.
    let gw = gateway_at(&monthly(""), ms("2026-03-28T11:00:00Z")).await;
    for _ in 0..3 {
        assert_eq!(as_acme().send(gw.addr).await.status, 200);
    }
    let resp = as_acme().send(gw.addr).await;
    assert_eq!(resp.status, 429);
    // To April 1st 00:00 +02:00: 3 days 12 hours, less the skipped hour.
    assert_eq!(resp.retry_after(), (3 * 24 + 11) * 3_600);
    gw.stop().await;
}

#[tokio::test]
async fn billing_anchors_are_read_from_the_consumers_file_and_bad_ones_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("consumers.jsonl");
    std::fs::write(
        &file,
        format!(
            "{{\"name\":\"gamma\",\"key_sha256\":\"{}\",\"billing_anchor\":\"2026-05-15\"}}\n",
            const_hex::encode(<sha2::Sha256 as sha2::Digest>::digest(b"demo-key-gamma"))
        ),
    )
    .unwrap();
    let extra = format!(
        "[identity]\nconsumers_file = {:?}\n",
        file.display().to_string()
    );
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, monthly(&extra)).unwrap();
    let config = sluice::config::Config::load(&path).unwrap();
    let (clock, handle) = sluice::clock::Clock::manual(ms("2026-07-14T21:59:59Z"));
    let running = sluice::app::start_local(config, clock).await.unwrap();
    let gamma = || Req::get("/api").header("x-api-key", "demo-key-gamma");
    for _ in 0..3 {
        assert_eq!(gamma().send(running.addr()).await.status, 200);
    }
    let resp = gamma().send(running.addr()).await;
    // Paris, July 14th 23:59:59: the month from the 15th starts in one second.
    assert_eq!(resp.retry_after(), 1);
    handle.store(
        ms("2026-07-14T22:00:00Z"),
        std::sync::atomic::Ordering::SeqCst,
    );
    assert_eq!(gamma().send(running.addr()).await.status, 200);
    within("stop", running.stop()).await;

    let bad = monthly("").replace("2026-01-31", "2026-02-30");
    let err = sluice::config::Config::parse(std::path::Path::new("t.toml"), &bad).unwrap_err();
    assert!(
        err.to_string().contains("consumers[1].billing_anchor"),
        "{err}"
    );
    let total = monthly("").replace(
        "registered = { per_month = 3, per_year = 100 }",
        "registered = { per_month = 3 }\ntotal = { per_month = 10 }",
    );
    let err = sluice::config::Config::parse(std::path::Path::new("t.toml"), &total).unwrap_err();
    assert!(err.to_string().contains("policies.plans.total"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_state_file_keeps_a_month_across_restarts_until_it_ends() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    let run = |at: &'static str| {
        let path = path.clone();
        let cwd = dir.path().to_path_buf();
        async move {
            let (port, admin) = (support::free_port(), support::free_port());
            let body = monthly("[store]\nstate_file = \"sluice.state\"\n");
            let text = format!(
                "[server]\nlisten = \"127.0.0.1:{port}\"\n[admin]\nlisten = \"127.0.0.1:{admin}\"\n{body}"
            );
            std::fs::write(&path, text).unwrap();
            let mut proc = Proc::spawn(&path, &cwd, &[("SLUICE_TEST_NOW", at)]);
            proc.ready(port, "/not-a-route").await;
            (proc, std::net::SocketAddr::from(([127, 0, 0, 1], port)))
        }
    };
    // Paris, February 27th 23:59: spend acme's month and beta's.
    let (mut proc, addr) = run("2026-02-27T22:59:00Z").await;
    for who in [as_acme, as_beta] {
        for _ in 0..3 {
            assert_eq!(who().send(addr).await.status, 200);
        }
        assert_eq!(who().send(addr).await.status, 429);
    }
    proc.stop().await;
    assert!(dir.path().join("sluice.state").exists());

    // A restart in the same minute: both months are still spent.
    let (mut proc, addr) = run("2026-02-27T22:59:30Z").await;
    assert_eq!(as_acme().send(addr).await.status, 429);
    assert_eq!(as_beta().send(addr).await.status, 429);
    proc.stop().await;

    // February 28th: beta's new month (anchored on the 31st) began, acme's did not.
    let (mut proc, addr) = run("2026-02-27T23:00:05Z").await;
    let beta = as_beta().send(addr).await;
    assert_eq!(beta.status, 200, "{}", proc.stderr());
    assert_eq!(beta.sf_param("ratelimit", "month", "r"), Some(2));
    let acme = as_acme().send(addr).await;
    assert_eq!(acme.status, 429);
    let wait = acme.retry_after();
    assert!((86_390..=86_395).contains(&wait), "Retry-After {wait}");
    proc.stop().await;

    // March 1st: acme's new month.
    let (mut proc, addr) = run("2026-02-28T23:00:00Z").await;
    let acme = as_acme().send(addr).await;
    assert_eq!(acme.status, 200);
    assert_eq!(acme.sf_param("ratelimit", "month", "r"), Some(2));
    assert_eq!(acme.sf_param("ratelimit", "year", "r"), Some(96));
    proc.stop().await;
}

/// A monthly quota of `limit` for every anonymous caller, on `store`.
fn fleet_monthly(store: &str, limit: u32) -> String {
    format!(
        r#"
{store}

[policies.plans]
anonymous = {{ per_month = {limit}, per_year = 1_000_000 }}

[[routes]]
name = "api"
path_prefix = "/api"
respond = {{ status = 200, body = "ok\n" }}
policy = "plans"
"#
    )
}

/// `count` requests from 127.0.3.1, alternating between two replicas, all at once.
async fn alternate(a: std::net::SocketAddr, b: std::net::SocketAddr, count: usize) -> Tally {
    let tasks: Vec<_> = (0..count)
        .map(|i| {
            let addr = if i % 2 == 0 { a } else { b };
            tokio::spawn(async move { status(addr, "127.0.3.1", "/api").await })
        })
        .collect();
    let mut tally = Tally::default();
    for task in tasks {
        tally.add(within("fleet request", task).await.unwrap());
    }
    tally
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_on_one_redis_share_one_monthly_quota_exactly() {
    let server = RedisServer::start();
    let store = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\non_error = \"deny\"\ntimeout = \"2s\"",
        server.url()
    );
    let toml = fleet_monthly(&store, 150);
    let (a, b) = (gateway(&toml).await, gateway(&toml).await);
    let tally = alternate(a.addr, b.addr, 240).await;
    assert_eq!(
        (tally.ok, tally.limited, tally.unavailable + tally.other),
        (150, 90, 0)
    );
    // The caller's key lives until its month ends, and no longer.
    let keys = server.keys();
    assert_eq!(keys.len(), 1, "{keys:?}");
    let ttl_ms = server.pttl(&keys[0]);
    let now = sluice::clock::Clock::system().now_ms();
    let year_end = sluice::limit::period::periods(
        &jiff::tz::TimeZone::UTC,
        sluice::limit::Anchor::CALENDAR,
        now,
    )
    .year
    .ends_ms;
    assert!(ttl_ms > 0, "the key has no expiry");
    assert!(
        ttl_ms as u64 <= year_end - now + 5_000,
        "a ttl of {ttl_ms} ms outlives the year"
    );
    assert_eq!((a.store_errors(), b.store_errors()), (0, 0));
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_on_a_cluster_share_one_monthly_quota_exactly() {
    let cluster = RedisCluster::start(3, 0);
    let store = format!(
        "[store]\nbackend = \"redis\"\n{}\non_error = \"deny\"\ntimeout = \"2s\"",
        cluster.seeds_toml()
    );
    let toml = fleet_monthly(&store, 150);
    let (a, b) = (gateway(&toml).await, gateway(&toml).await);
    let tally = alternate(a.addr, b.addr, 240).await;
    assert_eq!(
        (tally.ok, tally.limited, tally.unavailable + tally.other),
        (150, 90, 0)
    );
    assert_eq!((a.store_errors(), b.store_errors()), (0, 0));
    a.stop().await;
    b.stop().await;
    // A restarted replica finds the month where the fleet left it.
    let c = gateway(&toml).await;
    assert_eq!(c.get_from("127.0.3.1", "/api").await.status, 429);
    c.stop().await;
}
