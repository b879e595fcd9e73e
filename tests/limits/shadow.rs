//! Shadow mode as an owner rolls a new limit out: a policy in `mode = "shadow"`
//! counts exactly as if enforced and refuses nothing, reports each would-be refusal
//! (access log `would_refuse`, `sluice_shadow_refusals_total`), shows the RateLimit
//! headers only with `shadow_headers`, and a reload to `enforce` keeps every counter.

use crate::support;

use serde_json::{Value, json};
use support::{Live, Req, Toml, live, metric, route};

/// A policy `rollout` of two a minute, in `mode`, on the `demo` route.
fn config(mode: &str, extra: &str) -> String {
    Toml::new()
        .raw("[log]\naccess = \"json\"")
        .policy(
            "rollout",
            &[
                ("anonymous", "{ per_minute = 2 }"),
                ("mode", &format!("{mode:?}")),
            ],
        )
        .raw(extra)
        .route(
            route("demo", "/demo")
                .respond(200, "hello\n")
                .policy("rollout"),
        )
        .build()
}

async fn metrics(gw: &Live) -> String {
    gw.admin(Req::get("/metrics")).await.text()
}

const SHADOW_MINUTE: &str = "sluice_shadow_refusals_total{limit=\"minute\",plan=\"anonymous\",policy=\"rollout\",route=\"demo\"}";

/// The access log's JSON lines, once `n` are written.
async fn log_lines(gw: &Live, n: usize) -> Vec<Value> {
    let lines = gw.access_log.wait_lines(n).await;
    assert!(lines.len() >= n, "{lines:?}");
    lines
        .iter()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_policy_refuses_nothing_but_logs_and_counts_what_it_would_refuse() {
    let gw = live(&config("shadow", "")).await;
    for i in 0..4 {
        let resp = gw.get("/demo").await;
        assert_eq!(resp.status, 200, "request {i}: {}", resp.text());
        assert_eq!(resp.text(), "hello\n");
        assert_eq!(
            resp.header("ratelimit"),
            None,
            "no headers without shadow_headers"
        );
        assert_eq!(resp.header("ratelimit-policy"), None);
        gw.advance_secs(1);
    }
    let lines = log_lines(&gw, 4).await;
    assert_eq!(lines[0].get("would_refuse"), None, "{}", lines[0]);
    assert_eq!(lines[1].get("would_refuse"), None, "{}", lines[1]);
    assert_eq!(lines[2]["would_refuse"], json!(["minute"]), "{}", lines[2]);
    assert_eq!(lines[3]["would_refuse"], json!(["minute"]), "{}", lines[3]);
    assert_eq!(lines[3]["status"], 200);
    assert_eq!(lines[3]["violated"], json!([]));

    let text = metrics(&gw).await;
    assert_eq!(metric(&text, SHADOW_MINUTE), Some(2.0), "{text}");
    // Nothing was refused: no rejection, and every request allowed.
    assert_eq!(
        metric(
            &text,
            "sluice_requests_total{outcome=\"allowed\",plan=\"anonymous\",route=\"demo\"}"
        ),
        Some(4.0)
    );
    assert_eq!(
        metric(
            &text,
            "sluice_limit_rejections_total{plan=\"anonymous\",policy=\"rollout\",window=\"minute\"}"
        ),
        Some(0.0)
    );

    // The decision API answers the same way: allowed, with what would refuse it.
    let check = json!({"policy": "rollout", "caller": "ip:127.0.0.1", "plan": "anonymous"});
    let answer = gw
        .admin(Req::post("/v1/check", check.to_string()))
        .await
        .json();
    assert_eq!(answer["allowed"], true, "{answer}");
    assert_eq!(answer["would_refuse"], json!(["minute"]), "{answer}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_headers_show_callers_the_would_be_ratelimit_headers() {
    let gw = live(&config("shadow", "shadow_headers = true")).await;
    let first = gw.get("/demo").await;
    assert_eq!(
        first.header("ratelimit-policy"),
        Some("\"minute\";q=2;w=60")
    );
    assert_eq!(first.sf_param("ratelimit", "minute", "r"), Some(1));
    gw.advance_secs(5);
    gw.get("/demo").await;
    let third = gw.get("/demo").await;
    assert_eq!(third.status, 200);
    assert_eq!(third.sf_param("ratelimit", "minute", "r"), Some(0));
    assert_eq!(third.sf_param("ratelimit", "minute", "t"), Some(55));
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_from_shadow_to_enforce_keeps_every_counter() {
    let gw = live(&config("shadow", "")).await;
    // Two admitted and charged at +0 s and +10 s; a third at +20 s would be refused,
    // so (like a refused request) it charges nothing.
    for _ in 0..3 {
        assert_eq!(gw.get("/demo").await.status, 200);
        gw.advance_secs(10);
    }
    std::fs::write(&gw.path, config("enforce", "")).unwrap();
    let reload = gw.admin(Req::post("/admin/reload", "")).await;
    assert_eq!(reload.status, 200, "{}", reload.text());

    // +30 s: the shadow-mode counters are the enforced ones.
    let refused = gw.get("/demo").await;
    refused.problem(429);
    assert_eq!(
        refused.retry_after(),
        30,
        "the +0 s request leaves at +60 s"
    );
    gw.advance_secs(30);
    let back = gw.get("/demo").await;
    assert_eq!(back.status, 200, "{}", back.text());
    assert_eq!(back.sf_param("ratelimit", "minute", "r"), Some(0));
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ban_shadow_mode_counts_the_would_be_ban_and_bans_nobody() {
    let toml = config("enforce", "").replace(
        "[log]",
        "[ban]\nafter = 3\nwithin = \"1m\"\nduration = \"10m\"\nmode = \"shadow\"\n\n[log]",
    );
    let gw = live(&toml).await;
    assert_eq!(gw.get("/demo").await.status, 200);
    assert_eq!(gw.get("/demo").await.status, 200);
    // Eight 429s: an enforced [ban] would have banned at the third (403 after).
    for i in 0..8 {
        let resp = gw.get("/demo").await;
        assert_eq!(resp.status, 429, "refusal {i} is a 429, never a 403");
    }
    let text = metrics(&gw).await;
    assert_eq!(
        metric(&text, "sluice_shadow_bans_total"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        metric(&text, "sluice_bans_total{reason=\"automatic\"}"),
        Some(0.0)
    );
    assert_eq!(metric(&text, "sluice_bans_active"), Some(0.0));
    // Nobody is in the ban list.
    let bans = gw.admin(Req::get("/admin/bans")).await.json();
    assert_eq!(bans["bans"], json!([]), "{bans}");
    // Past the minute the caller is served again, as it would be without [ban].
    gw.advance_secs(61);
    assert_eq!(gw.get("/demo").await.status, 200);
    gw.stop().await;
}
