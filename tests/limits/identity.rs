//! End-to-end identity: callers named by a trusted auth layer's headers, and those
//! headers stripped (never believed, never forwarded) from every other peer. Requests
//! go over raw TCP, so every spelling reaches the gateway as written.

use crate::support;

use std::net::IpAddr;
use std::path::Path;

use sluice::config::Config;
use support::{ACME_SHA256, Gateway, Resp, Toml, Upstream, gateway, raw_from, route, upstream};

/// The auth layer's address: the only trusted proxy.
const TRUSTED: &str = "127.0.0.2";
/// Any other client.
const UNTRUSTED: &str = "127.0.0.1";

fn config(up: &str) -> String {
    let plans = |extra: (&'static str, &'static str)| {
        [
            ("anonymous", "{ per_minute = 2 }"),
            ("registered", "{ per_minute = 3 }"),
            extra,
        ]
    };
    Toml::new()
        .raw(&format!(
            "[identity]\ntrusted_proxies = [\"{TRUSTED}\"]\n\
             consumer_header = \"X-Consumer-Id\"\nplan_header = \"x-consumer-plan\""
        ))
        .upstream("up", &[up.to_string()])
        .policy("p", &plans(("gold", "{ per_minute = 5 }")))
        .policy("other", &plans(("silver", "{ per_minute = 50 }")))
        .consumer("acme", ACME_SHA256)
        .raw("plan = \"gold\"")
        .route(route("api", "/api").upstream("up").policy("p"))
        .build()
}

async fn start() -> (Upstream, Gateway) {
    let up = upstream().await;
    let gw = gateway(&config(&up.url())).await;
    (up, gw)
}

/// GET /api/x from `from` with `headers` (raw lines, each ending in CRLF).
async fn get(gw: &Gateway, from: &str, headers: &str) -> Resp {
    let request =
        format!("GET /api/x HTTP/1.1\r\nHost: gw.test\r\n{headers}Connection: close\r\n\r\n");
    let from: IpAddr = from.parse().unwrap();
    raw_from(Some(from), gw.addr, request.as_bytes()).await
}

/// Sends until refused; the number admitted (at most `bound`).
async fn admitted(gw: &Gateway, from: &str, headers: &str, bound: usize) -> usize {
    for n in 0..bound {
        let resp = get(gw, from, headers).await;
        match resp.status.as_u16() {
            200 => continue,
            429 => return n,
            other => panic!("status {other} for {headers:?}: {}", resp.text()),
        }
    }
    bound
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_headers_from_an_untrusted_peer_are_stripped_in_every_spelling() {
    let spellings = [
        "X-Consumer-Id: acme\r\n",
        "x-consumer-id:acme\r\n",
        "X-CONSUMER-ID:   acme   \r\n",
        "x-consumer-id: acme\r\nX-Consumer-Id: tenant-2\r\n",
        "X-Consumer-Id: tenant-1\r\nX-Consumer-Plan: gold\r\n",
        "x-consumer-plan: gold\r\n",
        "x_consumer_id: acme\r\nX_Consumer_Plan: gold\r\n",
    ];
    for headers in spellings {
        let (up, gw) = start().await;
        // Counted as the anonymous client it is: 2 a minute, whatever it claims.
        assert_eq!(
            admitted(&gw, UNTRUSTED, headers, 10).await,
            2,
            "{headers:?}"
        );
        assert_eq!(up.count(), 2);
        for seen in up.seen() {
            for name in [
                "x-consumer-id",
                "x-consumer-plan",
                "x_consumer_id",
                "x_consumer_plan",
            ] {
                assert_eq!(seen.header(name), None, "{name} forwarded for {headers:?}");
            }
        }
        gw.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_auth_layer_names_callers_and_their_plans() {
    let (up, gw) = start().await;
    // A caller the config does not list: the plan header's plan, its own budget.
    let gold = "X-Consumer-Id: tenant-1\r\nX-Consumer-Plan: gold\r\n";
    assert_eq!(admitted(&gw, TRUSTED, gold, 10).await, 5);
    // The headers reach the upstream from the auth layer as sent.
    let seen = up.last();
    assert_eq!(seen.header("x-consumer-id"), Some("tenant-1"));
    assert_eq!(seen.header("x-consumer-plan"), Some("gold"));
    // Another name is another caller; without a plan header, the default plan.
    assert_eq!(
        admitted(&gw, TRUSTED, "x-consumer-id: tenant-2\r\n", 10).await,
        3
    );
    // A plan a routed policy has no rule for is not believed: the default plan.
    let silver = "x-consumer-id: tenant-3\r\nx-consumer-plan: silver\r\n";
    assert_eq!(admitted(&gw, TRUSTED, silver, 10).await, 3);
    let unknown = "x-consumer-id: tenant-4\r\nx-consumer-plan: platinum\r\n";
    assert_eq!(admitted(&gw, TRUSTED, unknown, 10).await, 3);
    // The auth layer's own anonymous traffic (no header, or an empty one) is anonymous.
    assert_eq!(admitted(&gw, TRUSTED, "x-consumer-id: \r\n", 10).await, 2);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_consumer_of_the_config_keeps_its_plan_and_budget() {
    let (_up, gw) = start().await;
    // acme is gold in the config: the header's plan is not read for it.
    let acme = "x-consumer-id: acme\r\nx-consumer-plan: registered\r\n";
    for _ in 0..3 {
        assert_eq!(get(&gw, TRUSTED, acme).await.status, 200);
    }
    // Its API key spends the same budget: 5 in all.
    let key = "x-api-key: demo-key-acme\r\n";
    assert_eq!(admitted(&gw, UNTRUSTED, key, 10).await, 2);
    assert_eq!(get(&gw, TRUSTED, acme).await.status, 429);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_key_comes_before_the_auth_layers_header() {
    let (_up, gw) = start().await;
    let both = "x-consumer-id: tenant-9\r\nx-api-key: demo-key-acme\r\n";
    // acme's budget (5), not tenant-9's default plan (3).
    assert_eq!(admitted(&gw, TRUSTED, both, 10).await, 5);
    // A wrong key is a 401 even with the header: never a fall-back.
    let wrong = "x-consumer-id: tenant-9\r\nx-api-key: nope\r\n";
    get(&gw, TRUSTED, wrong).await.problem(401);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_peers_repeated_or_oversized_identity_header_is_a_400() {
    let (up, gw) = start().await;
    let long = format!("x-consumer-id: {}\r\n", "a".repeat(257));
    for headers in [
        "x-consumer-id: a\r\nX-Consumer-Id: b\r\n".to_string(),
        "x-consumer-id: a\r\nx-consumer-plan: gold\r\nx-consumer-plan: registered\r\n".to_string(),
        long,
        "x-consumer-id: caf\u{e9}\r\n".to_string(),
    ] {
        get(&gw, TRUSTED, &headers).await.problem(400);
    }
    assert_eq!(up.count(), 0);
    // The longest accepted value is 256 bytes.
    let longest = format!("x-consumer-id: {}\r\n", "a".repeat(256));
    assert_eq!(get(&gw, TRUSTED, &longest).await.status, 200);
    gw.stop().await;
}

#[test]
fn identity_header_settings_are_checked() {
    let parse = |identity: &str, plans: &str| {
        let text = format!(
            r#"
            [identity]
            trusted_proxies = ["10.0.0.1"]
            {identity}
            [upstreams.up]
            targets = ["http://127.0.0.1:1"]
            [policies.p]
            anonymous = {{ per_minute = 1 }}
            {plans}
            [[routes]]
            name = "r"
            path_prefix = "/"
            upstream = "up"
            policy = "p"
            "#
        );
        match Config::parse(Path::new("gateway.toml"), &text) {
            Ok(_) => String::new(),
            Err(err) => err.to_string(),
        }
    };
    let registered = "registered = { per_minute = 2 }";
    assert_eq!(parse("consumer_header = \"x-consumer-id\"", registered), "");
    let err = parse("plan_header = \"x-plan\"", registered);
    assert!(
        err.contains("identity.plan_header") && err.contains("needs consumer_header"),
        "{err}"
    );
    let err = parse("consumer_header = \"x_consumer\"", registered);
    assert!(err.contains("identity.consumer_header"), "{err}");
    let err = parse("consumer_header = \"x-api-key\"", registered);
    assert!(err.contains("must differ"), "{err}");
    let err = parse(
        "consumer_header = \"x-c\"\nplan_header = \"X-C\"",
        registered,
    );
    assert!(err.contains("must differ from consumer_header"), "{err}");
    // Named callers default to plan registered: every routed policy needs a rule.
    let err = parse("consumer_header = \"x-consumer-id\"", "");
    assert!(
        err.contains("gateway.toml") && err.contains("no rule for plan \"registered\""),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_log_names_a_header_named_caller() {
    let up = upstream().await;
    let gw = support::live(&config(&up.url())).await;
    let resp = support::Req::get("/api/x")
        .header("x-consumer-id", "tenant-77")
        .from(TRUSTED)
        .send(gw.addr)
        .await;
    assert_eq!(resp.status, 200);
    let lines = gw.access_log.wait_lines(1).await;
    let line: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(line["consumer"], "tenant-77", "{line}");
    assert_eq!(line["plan"], "registered", "{line}");
    gw.stop().await;
}
