//! The status page and its JSON twin, end to end against the real binary: real
//! traffic makes refused and near-limit callers, bans and reload results appear in
//! `GET /admin/status`; who may read it and how (`auth`); and the page in a real
//! headless Chromium (`browser`).

#![allow(clippy::unwrap_used)] // a test fails by panicking

#[path = "../support/mod.rs"]
pub mod support;

mod binary;
mod browser;
mod decisions;
mod page;

use std::time::Duration;

use binary::Sluice;
use support::{Req, Toml, route};

/// Two routes: `/tight` (2 a minute for anonymous callers, 5 for acme), and `/open`;
/// automatic bans after 3 refusals.
fn config() -> String {
    Toml::new()
        .raw("[ban]\nafter = 3\nwithin = \"1m\"\nduration = \"10m\"")
        .policy(
            "tight",
            &[
                ("anonymous", "{ per_minute = 2 }"),
                ("registered", "{ per_minute = 5 }"),
            ],
        )
        .consumer("acme", support::ACME_SHA256)
        .route(
            route("tight", "/tight")
                .respond(200, "tight")
                .policy("tight"),
        )
        .route(route("open", "/open").respond(200, "open"))
        .build()
}

async fn get_from(sluice: &Sluice, path: &str, ip: &str) -> u16 {
    Req::get(path)
        .from(ip)
        .send(sluice.addr)
        .await
        .status
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_json_shows_refused_callers_bans_near_limit_callers_and_routes() {
    let sluice = Sluice::start(&config()).await;
    // 127.0.0.7 hammers: 2 admitted, then 429s; its third 429 bans it.
    let mut statuses = Vec::new();
    for _ in 0..8 {
        statuses.push(get_from(&sluice, "/tight", "127.0.0.7").await);
    }
    assert_eq!(&statuses[..5], [200, 200, 429, 429, 429]);
    assert!(statuses[5..].iter().all(|s| *s == 403), "{statuses:?}");
    // 127.0.0.8 is refused once; acme uses 4 of its 5 (80 %).
    for _ in 0..3 {
        get_from(&sluice, "/tight", "127.0.0.8").await;
    }
    for _ in 0..4 {
        let resp = Req::get("/tight")
            .header("x-api-key", "demo-key-acme")
            .send(sluice.addr)
            .await;
        assert_eq!(resp.status, 200);
    }

    let status = sluice.status().await;
    let refused = &status["refused"];
    assert_eq!(refused["algorithm"], "space-saving");
    assert_eq!(refused["total"], 4, "{refused:#}");
    assert_eq!(refused["error_bound"], 0, "{refused:#}");
    let top = &refused["callers"][0];
    assert_eq!(top["caller"], "ip:127.0.0.7", "{refused:#}");
    assert_eq!(
        (&top["count"], &top["policy"], &top["limit"]),
        (&3.into(), &"tight".into(), &"minute".into())
    );
    assert_eq!(refused["callers"][1]["caller"], "ip:127.0.0.8");
    assert_eq!(refused["callers"][1]["count"], 1);

    let near = &status["near_limit"]["callers"];
    let acme = near
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["caller"] == "consumer:acme");
    let acme = acme.unwrap_or_else(|| panic!("acme near its limit: {near:#}"));
    assert_eq!(
        (&acme["used"], &acme["limit"], &acme["window"]),
        (&4.into(), &5.into(), &"minute".into())
    );
    assert_eq!(acme["ratio"], 0.8);
    // The anonymous callers' second request used 2 of 2.
    assert!(
        near.as_array()
            .unwrap()
            .iter()
            .any(|c| c["caller"] == "ip:127.0.0.7")
    );

    let bans = status["bans"].as_array().unwrap();
    assert_eq!(bans.len(), 1, "{bans:?}");
    assert_eq!(
        (&bans[0]["caller"], &bans[0]["reason"]),
        (&"ip:127.0.0.7".into(), &"automatic".into())
    );
    assert!(bans[0]["remaining"].as_u64().unwrap() > 500);

    let routes = status["routes"].as_array().unwrap();
    let tight = routes.iter().find(|r| r["route"] == "tight").unwrap();
    assert!(tight["admitted_per_s"].as_f64().unwrap() > 0.0, "{tight:#}");
    assert!(tight["limited_per_s"].as_f64().unwrap() > 0.0, "{tight:#}");
    // A ban refuses before routing: its 403s count under no route.
    let none = routes.iter().find(|r| r["route"] == "none").unwrap();
    assert!(
        none["refused_per_s"].as_f64().unwrap() > 0.0,
        "banned 403s: {none:#}"
    );
    assert!(tight["p50_ms"].as_f64().is_some() && tight["p99_ms"].as_f64().is_some());

    assert_eq!(status["store"]["backend"], "memory");
    assert_eq!(status["store"]["fallback"], false);
    assert_eq!(status["identity"]["consumers_config"], 1);
    assert_eq!(status["config"]["generation"], 1);
    assert!(status["config"]["last_reload"].is_null());
    assert_eq!(status["scope"]["traffic"], "replica");
    assert!(
        status["process"]["version"]
            .as_str()
            .unwrap()
            .starts_with(env!("CARGO_PKG_VERSION"))
    );
    assert!(status["process"]["rss_bytes"].as_u64().unwrap() > 1_000_000);
    let summary = status["process"]["summary_bytes"].as_u64().unwrap();
    assert!(summary > 0 && summary < 64 << 20, "{summary}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_reload_shows_its_result_and_errors() {
    let sluice = Sluice::start(&config()).await;
    sluice.rewrite(&format!("{}\n[policies.tight]\nbogus = 1\n", config()));
    let resp = Req::post("/admin/reload", "")
        .header("authorization", &format!("Bearer {}", binary::TOKEN))
        .send(sluice.admin)
        .await;
    assert_eq!(resp.status, 400, "{}", resp.text());
    let status = sluice.status().await;
    let last = &status["config"]["last_reload"];
    assert_eq!(last["result"], "error", "{last:#}");
    let errors = last["errors"].as_array().unwrap();
    assert!(
        !errors.is_empty() && errors[0].as_str().unwrap().contains("gateway.toml"),
        "{last:#}"
    );
    assert_eq!(status["config"]["generation"], 1);
    // Fixed, the file is picked up by the watcher: the status says so.
    sluice.rewrite(&config().replace("per_minute = 5", "per_minute = 6"));
    let status = sluice
        .status_until(Duration::from_secs(10), "the good reload", |s| {
            s["config"]["last_reload"]["result"] == "ok"
        })
        .await;
    assert_eq!(status["config"]["generation"], 2);
    assert_eq!(
        status["config"]["last_reload"]["errors"],
        serde_json::json!([])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_needs_the_token() {
    let sluice = Sluice::start(&config()).await;
    let resp = Req::get("/admin/status").send(sluice.admin).await;
    resp.problem(401);
    let resp = Req::get("/admin/status")
        .header("authorization", "Bearer wrong")
        .send(sluice.admin)
        .await;
    resp.problem(401);
    let resp = Req::post("/admin/status", "").send(sluice.admin).await;
    assert_eq!(resp.status, 401);
}

/// The JSON's open connections of the gateway listener, as (HTTP/1, HTTP/2, WebSocket).
fn open(status: &serde_json::Value) -> (u64, u64, u64) {
    let connections = &status["process"]["connections"];
    let count = |protocol: &str| connections[protocol].as_u64().unwrap();
    (count("http1"), count("http2"), count("websocket"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_connections_are_shown_by_protocol_and_leave_when_closed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    let sluice = Sluice::start(&config()).await;
    let within = Duration::from_secs(10);
    sluice
        .status_until(within, "no connection open", |s| open(s) == (0, 0, 0))
        .await;
    // An HTTP/1.1 keep-alive connection after its answer, and one that sent nothing.
    let mut kept = TcpStream::connect(sluice.addr).await.unwrap();
    kept.write_all(b"GET /open HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    let mut answer = [0; 256];
    let n = kept.read(&mut answer).await.unwrap();
    assert!(answer[..n].starts_with(b"HTTP/1.1 200"));
    let silent = TcpStream::connect(sluice.addr).await.unwrap();
    // HTTP/2 with prior knowledge: the preface and an empty SETTINGS frame.
    let mut h2 = TcpStream::connect(sluice.addr).await.unwrap();
    h2.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    let status = sluice
        .status_until(within, "two HTTP/1 and one HTTP/2", |s| {
            open(s) == (2, 1, 0)
        })
        .await;
    let page = sluice.admin_get("/").await;
    assert_eq!(page.status, 200);
    assert!(
        page.text()
            .contains("<dd id=\"connections\">2 HTTP/1, 1 HTTP/2, 0 WebSocket</dd>"),
        "{status:#}"
    );
    drop((kept, silent, h2));
    sluice
        .status_until(within, "the closed connections gone", |s| {
            open(s) == (0, 0, 0)
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_every_replica_shows_the_fleets_near_limit_callers() {
    let redis = support::redis_server::RedisServer::start();
    let body = format!(
        // A store timeout a loaded machine cannot reach: a decision counted in the
        // replica's local fallback would not see the caller's Redis count.
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout = \"2s\"\n{}",
        redis.url(),
        config()
    );
    let (a, b) = (Sluice::start(&body).await, Sluice::start(&body).await);
    // 127.0.0.9 spends its 2 a minute on replica a only: the second finds the
    // window full (2 of 2), which a counts as near the limit.
    assert_eq!(get_from(&a, "/tight", "127.0.0.9").await, 200);
    assert_eq!(get_from(&a, "/tight", "127.0.0.9").await, 200);
    let near_on = |s: &serde_json::Value| {
        s["near_limit"]["callers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["caller"] == "ip:127.0.0.9")
    };
    assert!(near_on(&a.status().await));
    let status = b
        .status_until(
            Duration::from_secs(15),
            "a's near-limit caller on b",
            near_on,
        )
        .await;
    assert_eq!(status["scope"]["near_limit"], "fleet", "{status:#}");
    let row = (status["near_limit"]["callers"].as_array().unwrap())
        .iter()
        .find(|c| c["caller"] == "ip:127.0.0.9")
        .unwrap()
        .clone();
    assert_eq!(row["used"], 2, "{row:#}");
    assert_eq!(row["limit"], 2, "{row:#}");
    assert_eq!(row["policy"], "tight", "{row:#}");
    // Refused callers stay each replica's own.
    assert_eq!(status["scope"]["callers"], "replica");
    // Without Redis the list is the replica's.
    let alone = Sluice::start(&config()).await;
    assert_eq!(alone.status().await["scope"]["near_limit"], "replica");
}
