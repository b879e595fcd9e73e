//! Bounded memory without lock-out, end to end: a spray of fresh addresses that each
//! spend part of their budget fills the memory store's `max_keys`; newcomers are still
//! admitted (callers are evicted, least recently seen first, whatever their usage),
//! the table stays within `max_keys`, and registered consumers keep their budgets.
//! Time only moves through the manual clock.

use crate::support;

use std::time::Duration;

use support::{ACME_SHA256, Live, Req, Resp, Toml, live, metric, route};

const MAX_KEYS: usize = 2_000;
/// The figure: three times `max_keys` fresh addresses.
const SPRAYED: usize = 6_000;

fn config(per_minute: u32) -> String {
    Toml::new()
        .raw(&format!("[store]\nmax_keys = {MAX_KEYS}"))
        .policy(
            "api",
            &[
                ("anonymous", &format!("{{ per_minute = {per_minute} }}")),
                ("registered", "{ per_minute = 5 }"),
            ],
        )
        .consumer("acme", ACME_SHA256)
        .raw("[[consumers]]\nname = \"beta\"\nkey = \"demo-key-beta\"")
        .route(route("api", "/").respond(200, "ok").policy("api"))
        .build()
}

/// The `n`th address of a range of fresh loopback addresses.
fn address(range: u8, n: usize) -> String {
    format!("127.{range}.{}.{}", n / 250, n % 250 + 1)
}

async fn send(gw: &Live, req: Req) -> Resp {
    req.send(gw.addr).await
}

#[track_caller]
fn assert_ok(resp: &Resp, what: &str) {
    assert_eq!(resp.status, 200, "{what}: {}", resp.text());
}

async fn metrics(gw: &Live) -> (f64, f64) {
    let text = gw.admin(Req::get("/metrics")).await.text();
    let tracked = metric(&text, "sluice_tracked_callers").expect("sluice_tracked_callers");
    let evicted = metric(&text, "sluice_evicted_callers_total").expect("evicted counter");
    (tracked, evicted)
}

/// Sprays [`SPRAYED`] fresh addresses, one request each (each spends `1 /
/// per_minute` of its budget, so none is idle), checking a newcomer every 500; every
/// request is admitted.
async fn spray(gw: &Live) {
    let mut newcomer = 0;
    for i in 0..SPRAYED {
        let resp = send(gw, Req::get("/").from(&address(1, i))).await;
        assert_ok(&resp, &format!("sprayed address {i}"));
        if i % 500 == 499 {
            newcomer += 1;
            let resp = send(gw, Req::get("/").from(&address(2, newcomer))).await;
            assert_ok(&resp, &format!("a newcomer after {} sprayed", i + 1));
        }
        gw.clock.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// What the old rule failed: every tracked caller was near a limit, so none could be
/// evicted and every newcomer got 503 "limiter full" with nobody ever evicted.
async fn a_spray_never_locks_newcomers_out(per_minute: u32) {
    let gw = live(&config(per_minute)).await;
    spray(&gw).await;
    for n in 0..10 {
        let resp = send(&gw, Req::get("/").from(&address(3, n))).await;
        assert_ok(&resp, "a newcomer after the spray");
    }
    let (tracked, evicted) = metrics(&gw).await;
    assert!(tracked <= MAX_KEYS as f64, "{tracked} tracked");
    assert!(
        tracked >= (MAX_KEYS - 1) as f64,
        "the table is full: {tracked}"
    );
    // Every address after the first `max_keys` made room for itself.
    assert!(evicted >= (SPRAYED - MAX_KEYS) as f64, "{evicted} evicted");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spray_of_half_spent_budgets_never_locks_newcomers_out() {
    a_spray_never_locks_newcomers_out(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spray_of_spent_budgets_never_locks_newcomers_out() {
    a_spray_never_locks_newcomers_out(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumers_near_their_limit_keep_their_budgets_through_a_spray() {
    let gw = live(&config(2)).await;
    let acme = || Req::get("/").header("x-api-key", "demo-key-acme");
    let beta = || Req::get("/").header("x-api-key", "demo-key-beta");
    // Both consumers spend 4 of their 5, from addresses the spray does not use.
    for _ in 0..4 {
        assert_ok(&send(&gw, acme().from("127.0.9.1")).await, "acme");
        assert_ok(&send(&gw, beta().from("127.0.9.2")).await, "beta");
    }
    spray(&gw).await;
    gw.clock.fetch_add(
        Duration::from_secs(1).as_millis() as u64,
        std::sync::atomic::Ordering::SeqCst,
    );
    for (name, req) in [("acme", acme as fn() -> Req), ("beta", beta)] {
        assert_ok(&send(&gw, req().from("127.0.9.3")).await, name);
        let refused = send(&gw, req().from("127.0.9.3")).await;
        assert_eq!(refused.status, 429, "{name}: {}", refused.text());
    }
    let (tracked, evicted) = metrics(&gw).await;
    // The consumers' space is reserved: the anonymous callers still fill `max_keys`.
    assert!(tracked <= (MAX_KEYS + 2) as f64, "{tracked} tracked");
    assert!(tracked >= (MAX_KEYS + 1) as f64, "{tracked} tracked");
    assert!(evicted >= (SPRAYED - MAX_KEYS) as f64, "{evicted} evicted");
    gw.stop().await;
}
