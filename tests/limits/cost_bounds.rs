//! Bounded charges against the real streaming upstream of `cost_after`: one answer
//! charges at most the route's `max_cost` (by default the largest limit of its
//! policy), whatever number it reports, and the clamp is counted; a `reserve` holds
//! units for each request in flight, so concurrent streams of one caller are admitted
//! only while their reservations fit, then settled to what they cost. The test that
//! measures the over-admission prints its numbers (`docs/cost.md` quotes them).

use crate::support;

use std::path::Path;
use std::time::{Duration, Instant};

use sluice::config::Config;
use support::{Live, Req, live};

use super::cost_after::upstream;

/// A 100-a-minute, 1 000-a-day policy with a `total`, and a route per case on the
/// cost_after upstream: `/header/N` reports N in `x-tokens`, `/slow-sse/N` sends its
/// usage event 400 ms after the others.
fn config(up: std::net::SocketAddr) -> String {
    format!(
        r#"
[upstreams.llm]
targets = ["http://{up}"]

[policies.tokens]
anonymous = {{ per_minute = 100, per_day = 1_000 }}

[policies.shared]
anonymous = {{ per_minute = 100 }}
total = {{ per_minute = 1_000 }}

[[routes]]
name = "header"
path_prefix = "/header"
upstream = "llm"
policy = "tokens"
cost_after = "header:x-tokens"

[[routes]]
name = "capped"
path_prefix = "/capped"
strip_prefix = true
upstream = "llm"
policy = "shared"
cost_after = "header:x-tokens"
max_cost = 50

[[routes]]
name = "free"
path_prefix = "/free"
strip_prefix = true
upstream = "llm"
policy = "tokens"
cost_after = "json:usage.total_tokens"

[[routes]]
name = "fixed"
path_prefix = "/fixed"
strip_prefix = true
upstream = "llm"
policy = "tokens"
cost_after = "json:usage.total_tokens"
reserve = 40

[[routes]]
name = "average"
path_prefix = "/average"
strip_prefix = true
upstream = "llm"
policy = "tokens"
cost_after = "json:usage.total_tokens"
default_cost = 10
reserve = "average"
"#
    )
}

/// Units `ip` has used in `policy`'s window `window` (0: the minute, 1: the day).
async fn used(gw: &Live, ip: &str, policy: &str, window: usize) -> u64 {
    let usage = gw
        .admin(Req::get(&format!("/admin/usage?caller=ip:{ip}")))
        .await
        .json();
    let policies = usage["policies"].as_array().cloned().unwrap_or_default();
    let found = policies.iter().find(|p| p["policy"] == policy);
    found.map_or(0, |p| p["limits"][window]["used"].as_u64().unwrap_or(0))
}

/// Waits (up to 5 s) until `ip` has used `expected` in `policy`'s window `window`.
async fn settles(gw: &Live, ip: &str, policy: &str, window: usize, expected: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut seen = used(gw, ip, policy, window).await;
    while seen != expected && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        seen = used(gw, ip, policy, window).await;
    }
    assert_eq!(seen, expected, "{ip} in {policy}[{window}]");
}

async fn metric(gw: &Live, series: &str) -> Option<f64> {
    support::metric(&gw.admin(Req::get("/metrics")).await.text(), series)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_answer_charges_at_most_max_cost_and_the_clamp_is_counted() {
    let gw = live(&config(upstream().await)).await;
    // u64::MAX tokens: charged the policy's largest limit, the day's 1 000 (it was
    // 4 294 967 295, a day's lock-out from one answer).
    let huge = Req::get("/header/18446744073709551615")
        .from("127.0.2.1")
        .send(gw.addr)
        .await;
    assert_eq!(huge.status, 200);
    settles(&gw, "127.0.2.1", "tokens", 1, 1_000).await;
    let clamped = "sluice_cost_clamped_total{route=\"header\"}";
    assert_eq!(metric(&gw, clamped).await, Some(1.0));
    // An answer within the bound is charged as it says, and not counted.
    let fair = Req::get("/header/30").from("127.0.2.2").send(gw.addr).await;
    assert_eq!(fair.status, 200);
    settles(&gw, "127.0.2.2", "tokens", 0, 30).await;
    assert_eq!(metric(&gw, clamped).await, Some(1.0));

    // max_cost = 50 under a total of 1 000 a minute: one huge answer takes 50 of
    // the total, and every other caller is still served.
    let huge = Req::get("/capped/header/4000000000")
        .from("127.0.2.3")
        .send(gw.addr)
        .await;
    assert_eq!(huge.status, 200);
    settles(&gw, "127.0.2.3", "shared", 0, 50).await;
    let capped = "sluice_cost_clamped_total{route=\"capped\"}";
    assert_eq!(metric(&gw, capped).await, Some(1.0));
    for i in 4..14 {
        let other = Req::get("/capped/header/1")
            .from(&format!("127.0.2.{i}"))
            .send(gw.addr)
            .await;
        assert_eq!(other.status, 200, "caller {i}: {}", other.text());
    }
    gw.stop().await;
}

/// Sends `n` requests for `path` from `ip` at once; answers how many were admitted.
async fn burst(gw: &Live, ip: &str, path: &str, n: usize) -> usize {
    let requests = (0..n).map(|_| {
        let (addr, ip, path) = (gw.addr, ip.to_string(), path.to_string());
        tokio::spawn(async move { Req::get(&path).from(&ip).send(addr).await.status })
    });
    let mut admitted = 0;
    for request in requests.collect::<Vec<_>>() {
        match request.await.unwrap().as_u16() {
            200 => admitted += 1,
            429 => {}
            other => panic!("status {other}"),
        }
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_streams_are_admitted_only_while_their_reservations_fit() {
    let gw = live(&config(upstream().await)).await;
    // 50 streams at once from a 100-a-minute caller, each using 40 tokens, its
    // usage coming 400 ms after its head: all are in flight before any settles.
    let mut report = Vec::new();
    for (route, ip) in [
        ("free", "127.0.3.1"),
        ("fixed", "127.0.3.2"),
        ("average", "127.0.3.3"),
    ] {
        let admitted = burst(&gw, ip, &format!("/{route}/slow-sse/40"), 50).await;
        // The day's count: a minute's exact log holds a debt of 255 at most.
        settles(&gw, ip, "tokens", 1, admitted as u64 * 40).await;
        report.push((route, admitted, admitted * 40));
    }
    // The average route once more, a minute later: the caller's average is 40 now.
    gw.advance_secs(61);
    let admitted = burst(&gw, "127.0.3.3", "/average/slow-sse/40", 50).await;
    let before = report[2].2 as u64;
    settles(&gw, "127.0.3.3", "tokens", 1, before + admitted as u64 * 40).await;
    report.push(("average, learnt", admitted, admitted * 40));
    for (route, admitted, units) in &report {
        println!(
            "reserve on route {route}: 50 concurrent streams, {admitted} admitted, {units} units for a limit of 100"
        );
    }
    // Without a reserve every stream is admitted on its cost of 1: 20x the limit.
    assert!(report[0].1 >= 40, "{report:?}");
    // reserve = 40: two fit (80), a third would hold 120.
    assert_eq!(report[1].1, 2, "{report:?}");
    // reserve = "average": a new caller holds default_cost (10), so ten fit; once
    // its answers are known, two.
    assert_eq!(report[2].1, 10, "{report:?}");
    assert_eq!(report[3].1, 2, "{report:?}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_is_settled_to_the_actual_either_way() {
    let gw = live(&config(upstream().await)).await;
    // 40 held; the answer says 7: 33 back, at the admission instant.
    let small = Req::get("/fixed/json/7")
        .from("127.0.4.1")
        .send(gw.addr)
        .await;
    assert_eq!(small.status, 200);
    assert_eq!(
        small.sf_param("ratelimit", "minute", "r"),
        Some(60),
        "the reservation shows in the headers"
    );
    settles(&gw, "127.0.4.1", "tokens", 0, 7).await;
    // 40 held; the answer says 90: 50 more.
    let big = Req::get("/fixed/json/90")
        .from("127.0.4.2")
        .send(gw.addr)
        .await;
    assert_eq!(big.status, 200);
    settles(&gw, "127.0.4.2", "tokens", 0, 90).await;
    gw.stop().await;
}

#[test]
fn max_cost_and_reserve_are_checked_against_the_route_and_its_policy() {
    let errors = |route: &str| {
        let text = format!(
            "[upstreams.llm]\ntargets = [\"http://127.0.0.1:1\"]\n\
             [policies.p]\nanonymous = {{ per_minute = 100 }}\n\
             [[routes]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = \"llm\"\npolicy = \"p\"\n{route}"
        );
        match Config::parse(Path::new("gateway.toml"), &text) {
            Ok(_) => Vec::new(),
            Err(err) => err.errors().map(|d| d.to_string()).collect::<Vec<_>>(),
        }
    };
    let metered = "cost_after = \"json:usage.total_tokens\"\n";
    assert_eq!(
        errors(&format!("{metered}reserve = 40\nmax_cost = 80")),
        Vec::<String>::new()
    );
    assert_eq!(
        errors(&format!("{metered}reserve = \"average\"")),
        Vec::<String>::new()
    );
    let cases = [
        ("reserve = 40", "routes[0].reserve: needs cost_after"),
        (
            &format!("{metered}reserve = \"median\"") as &str,
            "expected a number of units or \"average\", got \"median\"",
        ),
        (
            &format!("{metered}reserve = 101"),
            "reserve 101 exceeds the per_minute limit of 100 for plan anonymous",
        ),
        (
            &format!("{metered}reserve = 0"),
            "routes[0].reserve: must be between 1 and",
        ),
        (
            "cost = 10\nmax_cost = 5",
            "max_cost 5 is below what admission holds (10",
        ),
        (
            &format!("{metered}reserve = 40\nmax_cost = 30"),
            "max_cost 30 is below what admission holds (40",
        ),
        ("max_cost = 0", "routes[0].max_cost: must be between 1 and"),
    ];
    for (route, expected) in cases {
        let found = errors(route);
        assert!(
            found.iter().any(|e| e.contains(expected)),
            "{route:?}: {found:?}"
        );
    }
}
