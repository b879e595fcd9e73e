//! Bans end to end (memory store): callers that keep hammering after their 429s, or
//! try key after key, are shut out of every route; bans are listed, made and lifted
//! through the admin API, survive reloads and restarts, and stay bounded. And key
//! sprays: fresh callers that fill the limiter's table neither free an abuser nor
//! lock newcomers out. Fleet bans through Redis are in `fleet.rs`.

use crate::support;

use std::path::Path;
use std::time::Duration;

use http::Method;
use serde_json::json;
use sluice::config::Config;
use support::{Req, Resp, Toml, gateway, route};

const ABNORMAL: &str = "https://iana.org/assignments/http-problem-types#abnormal-usage-detected";
use support::ACME_SHA256;

/// Two limited routes of different policies and an unlimited one, `[ban]` as given.
fn config(ban: &str) -> String {
    Toml::new()
        .raw(ban)
        .raw("[identity]\ntrusted_proxies = [\"127.0.0.100\"]")
        .raw("[access]\nexempt = [\"127.0.0.50\"]")
        .policy(
            "tight",
            &[
                ("anonymous", "{ per_minute = 2 }"),
                ("registered", "{ per_minute = 2 }"),
            ],
        )
        .policy(
            "loose",
            &[
                ("anonymous", "{ per_minute = 100 }"),
                ("registered", "{ per_minute = 100 }"),
            ],
        )
        .consumer("acme", ACME_SHA256)
        .route(
            route("tight", "/tight")
                .respond(200, "tight")
                .policy("tight"),
        )
        .route(
            route("loose", "/loose")
                .respond(200, "loose")
                .policy("loose"),
        )
        .route(route("open", "/open").respond(200, "open"))
        .build()
}

const AUTO: &str = "[ban]\nafter = 3\nwithin = \"1m\"\nduration = \"10m\"\nescalate = true";

#[track_caller]
fn assert_banned(resp: &Resp, seconds: u64) {
    let problem = resp.problem(403);
    assert_eq!(problem["type"], ABNORMAL, "{problem}");
    let retry = resp.retry_after();
    assert!(
        retry <= seconds && retry + 2 >= seconds,
        "Retry-After {retry}, expected about {seconds}"
    );
}

async fn from(gw: &support::Gateway, ip: &str, path: &str) -> Resp {
    Req::get(path).from(ip).send(gw.addr).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_hammering_past_its_429s_is_banned_from_every_route_then_let_back() {
    let gw = gateway(&config(AUTO)).await;
    let ip = "127.0.0.2";
    for _ in 0..2 {
        assert_eq!(from(&gw, ip, "/tight").await.status, 200);
    }
    // Three 429s inside a minute earn a ban...
    for _ in 0..3 {
        from(&gw, ip, "/tight").await.problem(429);
    }
    // ... which shuts the caller out of every route, limited or not.
    for path in ["/tight", "/loose", "/open", "/nowhere"] {
        assert_banned(&from(&gw, ip, path).await, 600);
    }
    // Others are not affected.
    assert_eq!(from(&gw, "127.0.0.3", "/loose").await.status, 200);
    // Retry-After counts down; at the end the caller is back (and its minute is over).
    gw.advance_secs(240);
    assert_banned(&from(&gw, ip, "/open").await, 360);
    gw.advance_secs(360);
    assert_eq!(from(&gw, ip, "/tight").await.status, 200);
    // A repeat offence is banned twice as long (escalate).
    from(&gw, ip, "/tight").await;
    for _ in 0..3 {
        from(&gw, ip, "/tight").await.problem(429);
    }
    assert_banned(&from(&gw, ip, "/open").await, 1_200);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ip_that_tries_key_after_key_is_banned_even_with_a_good_key() {
    let gw = gateway(&config(AUTO)).await;
    let ip = "127.0.0.4";
    for i in 0..3 {
        let resp = Req::get("/loose")
            .from(ip)
            .header("x-api-key", &format!("guess-{i}"))
            .send(gw.addr)
            .await;
        resp.problem(401);
    }
    // Credential stuffing: the IP is banned; a key found by stuffing is no way back in.
    assert_banned(&from(&gw, ip, "/open").await, 600);
    let good = Req::get("/loose")
        .from(ip)
        .header("x-api-key", "demo-key-acme")
        .send(gw.addr)
        .await;
    assert_banned(&good, 600);
    // The consumer itself is not banned: from elsewhere its key works.
    let elsewhere = Req::get("/loose")
        .from("127.0.0.5")
        .header("x-api-key", "demo-key-acme")
        .send(gw.addr)
        .await;
    assert_eq!(elsewhere.status, 200);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exempt_callers_are_never_banned_and_a_forged_forwarded_for_bans_only_its_sender() {
    let gw = gateway(&config(AUTO)).await;
    // Exempt: never limited, never banned, even with bad keys.
    for i in 0..10 {
        let resp = Req::get("/tight")
            .from("127.0.0.50")
            .header("x-api-key", &format!("guess-{i}"))
            .send(gw.addr)
            .await;
        resp.problem(401);
    }
    assert_eq!(from(&gw, "127.0.0.50", "/tight").await.status, 200);
    // An untrusted peer naming a victim in X-Forwarded-For is counted as itself.
    for _ in 0..5 {
        Req::get("/tight")
            .from("127.0.0.6")
            .header("x-forwarded-for", "127.0.0.7")
            .send(gw.addr)
            .await;
    }
    assert_banned(&from(&gw, "127.0.0.6", "/open").await, 600);
    assert_eq!(from(&gw, "127.0.0.7", "/open").await.status, 200);
    // Through the trusted proxy, the client it names is the caller: that client is
    // banned, the proxy is not.
    for _ in 0..5 {
        Req::get("/tight")
            .from("127.0.0.100")
            .header("x-forwarded-for", "127.0.0.8")
            .send(gw.addr)
            .await;
    }
    let via_proxy = Req::get("/open")
        .from("127.0.0.100")
        .header("x-forwarded-for", "127.0.0.8")
        .send(gw.addr)
        .await;
    assert_banned(&via_proxy, 600);
    let other = Req::get("/open")
        .from("127.0.0.100")
        .header("x-forwarded-for", "127.0.0.9")
        .send(gw.addr)
        .await;
    assert_eq!(other.status, 200);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bans_are_listed_made_and_lifted_through_the_admin_api_and_counted() {
    let live = support::live(&config(AUTO)).await;
    // An automatic ban ...
    for _ in 0..5 {
        Req::get("/tight").from("127.0.0.11").send(live.addr).await;
    }
    // ... and a manual one, for a consumer.
    let made = live
        .admin(Req::post(
            "/admin/bans",
            r#"{"caller": "consumer:acme", "duration": "5m", "reason": "scraping"}"#,
        ))
        .await;
    assert_eq!(made.status, 201, "{}", made.text());
    let keyed = Req::get("/loose")
        .from("127.0.0.12")
        .header("authorization", "Bearer demo-key-acme")
        .send(live.addr)
        .await;
    assert_banned(&keyed, 300);
    let listed = live.admin(Req::get("/admin/bans")).await;
    assert_eq!(listed.status, 200);
    let bans = listed.json()["bans"].as_array().unwrap().clone();
    assert_eq!(bans.len(), 2, "{bans:?}");
    let by_caller = |caller: &str| {
        bans.iter()
            .find(|b| b["caller"] == caller)
            .unwrap_or_else(|| panic!("no ban of {caller} in {bans:?}"))
            .clone()
    };
    let auto = by_caller("ip:127.0.0.11");
    assert_eq!(auto["reason"], "automatic");
    assert_eq!(auto["refusals"], 3);
    assert_eq!(auto["remaining"], 600);
    let manual = by_caller("consumer:acme");
    assert_eq!(
        (manual["reason"].as_str(), manual["refusals"].as_u64()),
        (Some("scraping"), Some(0))
    );
    assert_eq!(manual["remaining"], 300);
    // Exempt callers cannot be banned by hand either; bad requests are explained.
    let exempt = live
        .admin(Req::post(
            "/admin/bans",
            r#"{"caller": "ip:127.0.0.50", "duration": "1m"}"#,
        ))
        .await;
    exempt.problem(400);
    let bad = live
        .admin(Req::post(
            "/admin/bans",
            r#"{"caller": "ip:127.0.0.13", "duration": "soon"}"#,
        ))
        .await;
    bad.problem(400);
    // A caller the ban would not reach, a range it would not cover, a name or reason
    // a listing or a log line could not carry, a duration past a year: 400, no ban.
    let long_name = format!("consumer:{}", "n".repeat(257));
    let long_reason = "r".repeat(257);
    let refused = [
        json!({"caller": "Consumer:acme", "duration": "1m"}),
        json!({"caller": "IP:127.0.0.14", "duration": "1m"}),
        json!({"caller": "foo:bar", "duration": "1m"}),
        json!({"caller": "ip:127.0.0.15/8", "duration": "1m"}),
        json!({"caller": "ip:::1/7", "duration": "1m"}),
        json!({"caller": "consumer:a b", "duration": "1m"}),
        json!({"caller": "consumer:a\nforged log line", "duration": "1m"}),
        json!({"caller": long_name, "duration": "1m"}),
        json!({"caller": "consumer:acme", "duration": "1m", "reason": "a\nb"}),
        json!({"caller": "consumer:acme", "duration": "1m", "reason": long_reason}),
        json!({"caller": "consumer:acme", "duration": "8761h"}),
    ];
    for body in refused {
        let answer = live.admin(Req::post("/admin/bans", body.to_string())).await;
        assert_eq!(answer.status, 400, "{body}: {}", answer.text());
    }
    let listed = live.admin(Req::get("/admin/bans")).await.json();
    assert_eq!(listed["bans"].as_array().unwrap().len(), 2, "{listed}");
    // A 405 says what the path answers; HEAD is GET without a body.
    let put = live.admin(Req::new(Method::PUT, "/admin/bans")).await;
    assert_eq!(put.status, 405);
    assert_eq!(put.header("allow"), Some("GET, POST, DELETE"));
    let head = live.admin(Req::new(Method::HEAD, "/healthz")).await;
    assert_eq!(head.status, 200);
    // Metrics: both bans active, one of each reason, and the refusals counted as banned.
    let metrics = live.admin(Req::get("/metrics")).await.text();
    for (series, value) in [
        ("sluice_bans_active", 2.0),
        ("sluice_bans_total{reason=\"automatic\"}", 1.0),
        ("sluice_bans_total{reason=\"manual\"}", 1.0),
    ] {
        assert_eq!(
            support::metric(&metrics, series),
            Some(value),
            "{series}\n{metrics}"
        );
    }
    let banned = metrics
        .lines()
        .filter(|l| l.starts_with("sluice_requests_total") && l.contains("outcome=\"banned\""))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum::<f64>();
    assert!(banned >= 1.0, "no request counted as banned:\n{metrics}");
    // Lifting ends both kinds at once.
    for caller in ["ip:127.0.0.11", "consumer:acme"] {
        let lifted = live
            .admin(Req::new(
                http::Method::DELETE,
                &format!("/admin/bans?caller={caller}"),
            ))
            .await;
        assert_eq!(lifted.status, 200, "{}", lifted.text());
        assert_eq!(lifted.json()["lifted"], true);
    }
    assert_eq!(
        Req::get("/open")
            .from("127.0.0.11")
            .send(live.addr)
            .await
            .status,
        200
    );
    let listed = live.admin(Req::get("/admin/bans")).await;
    assert_eq!(listed.json()["bans"], serde_json::json!([]));
    // The longest manual ban.
    let year = json!({"caller": "ip:127.0.0.16", "duration": "8760h"}).to_string();
    assert_eq!(live.admin(Req::post("/admin/bans", year)).await.status, 201);
    live.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bans_survive_a_reload() {
    let gw = gateway(&config(AUTO)).await;
    for _ in 0..5 {
        from(&gw, "127.0.0.14", "/tight").await;
    }
    assert_banned(&from(&gw, "127.0.0.14", "/open").await, 600);
    // A new config (limits raised) keeps the ban.
    let raised = config(AUTO).replace("per_minute = 2 ", "per_minute = 50 ");
    gw.install(Config::parse(Path::new("bans.toml"), &raised).unwrap());
    assert_banned(&from(&gw, "127.0.0.14", "/open").await, 600);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_ban_table_keeps_its_bans_and_new_offenders_are_still_limited() {
    let gw = support::live(&config(&format!("{AUTO}\nmax_bans = 2"))).await;
    let from = |ip: &'static str, path: &'static str| Req::get(path).from(ip).send(gw.addr);
    for ip in ["127.0.0.21", "127.0.0.22"] {
        for _ in 0..5 {
            from(ip, "/tight").await;
        }
        assert_banned(&from(ip, "/open").await, 600);
    }
    // The table is full of live bans: a third offender is not banned, only limited,
    // and the first two stay banned.
    for _ in 0..10 {
        let resp = from("127.0.0.23", "/tight").await;
        assert!(resp.status == 200 || resp.status == 429, "{}", resp.status);
    }
    from("127.0.0.23", "/tight").await.problem(429);
    assert_eq!(from("127.0.0.23", "/open").await.status, 200);
    for ip in ["127.0.0.21", "127.0.0.22"] {
        assert_banned(&from(ip, "/open").await, 600);
    }
    // The operator sees it: two bans active, the third offender's refusals dropped.
    let metrics = gw.admin(Req::get("/metrics")).await.text();
    assert_eq!(support::metric(&metrics, "sluice_bans_active"), Some(2.0));
    let dropped = support::metric(&metrics, "sluice_bans_dropped_total").unwrap();
    assert!(dropped >= 1.0, "{metrics}");
    gw.stop().await;
}

// ---- key sprays -----------------------------------------------------------------

/// Spray three times `max_keys` fresh callers (X-Forwarded-For through the trusted
/// proxy) while an abuser hammers: the abuser stays limited the whole time, callers
/// are evicted and counted, the table never holds more than `max_keys`, and a new
/// well-behaved caller arriving during and after the spray gets 200, not 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_spray_neither_frees_an_abuser_nor_locks_newcomers_out() {
    const MAX_KEYS: usize = 200;
    let gw = gateway(
        &Toml::new()
            .raw(&format!("[store]\nmax_keys = {MAX_KEYS}"))
            .raw("[identity]\ntrusted_proxies = [\"127.0.0.100\"]")
            .policy("api", &[("anonymous", "{ per_minute = 10 }")])
            .route(route("api", "/").respond(200, "ok").policy("api"))
            .build(),
    )
    .await;
    let via = |client: String| {
        Req::get("/")
            .from("127.0.0.100")
            .header("x-forwarded-for", &client)
    };
    // The abuser spends its minute.
    for _ in 0..10 {
        assert_eq!(via("10.0.0.1".to_string()).send(gw.addr).await.status, 200);
    }
    let mut newcomer = 0;
    for i in 0..3 * MAX_KEYS {
        let sprayed = via(format!("10.1.{}.{}", i / 250, i % 250))
            .send(gw.addr)
            .await;
        assert_eq!(
            sprayed.status,
            200,
            "sprayed caller {i}: {}",
            sprayed.text()
        );
        if i % 50 == 0 {
            let abuser = via("10.0.0.1".to_string()).send(gw.addr).await;
            abuser.problem(429);
            newcomer += 1;
            let fresh = via(format!("10.2.0.{newcomer}")).send(gw.addr).await;
            assert_eq!(
                fresh.status,
                200,
                "a newcomer during the spray: {}",
                fresh.text()
            );
        }
        gw.advance(Duration::from_millis(10));
    }
    let abuser = via("10.0.0.1".to_string()).send(gw.addr).await;
    abuser.problem(429);
    let after = via("10.3.0.1".to_string()).send(gw.addr).await;
    assert_eq!(after.status, 200, "a newcomer after the spray");
    let store = gw.store();
    assert!(store.tracked() <= MAX_KEYS, "{} tracked", store.tracked());
    assert!(
        store.evicted() >= 2 * MAX_KEYS as u64,
        "{} evicted",
        store.evicted()
    );
    gw.stop().await;
}
