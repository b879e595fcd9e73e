//! Decisions asked by other proxies on the status page and its JSON: the doors
//! (Envoy's rate limit service, forward auth, `/v1/check`) by outcome, the rules
//! and routes that decided them in the traffic per route and in
//! `sluice_requests_total`, and the callers they limited in the refused and
//! near-limit lists.

use serde_json::{Value, json};

use crate::binary::{Sluice, TOKEN};
use crate::support::{Req, free_port, rls::rls};

/// `tight` (2 a minute) on the proxy route `/tight` and on Envoy's
/// `remote_address` in domain `edge`, with the decision listener on `decision`.
fn config(decision: u16) -> String {
    format!(
        r#"
[decision]
listen = "127.0.0.1:{decision}"

[identity]
trusted_proxies = ["127.0.0.1/32"]

[policies.tight]
anonymous = {{ per_minute = 2 }}

[[decision.descriptors]]
domain = "edge"
entries = ["remote_address"]
policy = "tight"

[[routes]]
name = "tight"
path_prefix = "/tight"
policy = "tight"
respond = {{ status = 200 }}
"#
    )
}

async fn forward_auth(decision: u16, client: &str) -> u16 {
    let request = Req::get("/v1/forward-auth")
        .header("x-forwarded-method", "GET")
        .header("x-forwarded-uri", "/tight/x")
        .header("x-forwarded-for", client);
    let addr = ([127, 0, 0, 1], decision).into();
    request.send(addr).await.status.as_u16()
}

/// The row of `rows` whose `key` is `value`.
fn row<'a>(rows: &'a Value, key: &str, value: &str) -> &'a Value {
    (rows.as_array().unwrap().iter())
        .find(|r| r[key] == value)
        .unwrap_or_else(|| panic!("no {key} {value} in {rows:#}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_show_by_door_and_outcome_with_their_rules_and_limited_callers() {
    let decision = free_port();
    let sluice = Sluice::start(&config(decision)).await;
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(forward_auth(decision, "127.0.0.21").await);
    }
    assert_eq!(statuses, [200, 200, 429]);
    let own = json!({"domain": "any", "descriptors": [{"entries": [["k", "v"]],
        "limit": {"requests_per_unit": 2, "unit": "MINUTE"}}]});
    let address = json!({"domain": "edge", "descriptors": [
        {"entries": [["remote_address", "127.0.0.22"]]}]});
    let calls = json!([own, own, own, address, address, address]);
    let addr = format!("127.0.0.1:{decision}");
    let answers = tokio::task::spawn_blocking(move || rls(&addr, &calls))
        .await
        .unwrap();
    let codes: Vec<_> = (answers.iter())
        .map(|a| a["overall_code"].as_str().unwrap_or("?"))
        .collect();
    let expected = ["OK", "OK", "OVER_LIMIT", "OK", "OK", "OVER_LIMIT"];
    assert_eq!(codes, expected, "{answers:#?}");
    let check = json!({"policy": "tight", "caller": "ip:127.0.0.23"});
    let checked = Req::post("/v1/check", check.to_string())
        .header("authorization", &format!("Bearer {TOKEN}"))
        .send(sluice.admin)
        .await;
    assert_eq!(checked.json()["allowed"], true, "{}", checked.text());

    let status = sluice.status().await;
    let decisions = &status["decisions"];
    let total = |via: &str, outcome: &str| {
        (decisions.as_array().unwrap().iter())
            .find(|d| d["via"] == via && d["outcome"] == outcome)
            .map_or(0, |d| d["total"].as_u64().unwrap())
    };
    assert_eq!(total("forward_auth", "allowed"), 2, "{decisions:#}");
    assert_eq!(total("forward_auth", "limited"), 1);
    assert_eq!(total("rls", "allowed"), 4);
    assert_eq!(total("rls", "limited"), 2);
    assert_eq!(total("check", "allowed"), 1);
    // The rules and routes that decided them, in the traffic per route.
    let routes = &status["routes"];
    for name in ["tight", "override", "tight/anonymous"] {
        let route = row(routes, "route", name);
        assert!(route["limited_per_s"].as_f64().unwrap() > 0.0, "{route:#}");
    }
    // Their limited callers: forward auth's client, Envoy's address, and a
    // descriptor counted by its own limit, named by its values.
    let refused = &status["refused"]["callers"];
    for caller in ["ip:127.0.0.21", "ip:127.0.0.22"] {
        assert_eq!(row(refused, "caller", caller)["policy"], "tight");
    }
    let descriptor = row(refused, "caller", "rls:any:k=v");
    assert_eq!(
        (&descriptor["policy"], &descriptor["limit"]),
        (&json!("override"), &json!("minute"))
    );
    let near = row(&status["near_limit"]["callers"], "caller", "rls:any:k=v");
    assert_eq!(
        (&near["used"], &near["limit"]),
        (&json!(2), &json!(2)),
        "{near:#}"
    );

    // The page draws the same, without JavaScript.
    let page = sluice.admin_get("/").await.text();
    assert!(page.contains("<table id=\"decisions\">"), "{page}");
    let drawn = "<th scope=\"row\">forward_auth</th><td>limited</td><td>1</td>";
    assert!(page.contains(drawn), "{page}");

    // sluice_requests_total: forward auth under its route, RLS under its rules.
    let metrics = sluice.admin_get("/metrics").await.text();
    for line in [
        r#"sluice_requests_total{outcome="limited",plan="anonymous",route="tight"} 1"#,
        r#"sluice_requests_total{outcome="allowed",plan="rls",route="override"} 2"#,
        r#"sluice_requests_total{outcome="limited",plan="rls",route="override"} 1"#,
        r#"sluice_requests_total{outcome="allowed",plan="rls",route="tight/anonymous"} 2"#,
        r#"sluice_requests_total{outcome="limited",plan="rls",route="tight/anonymous"} 1"#,
        r#"sluice_decisions_total{outcome="limited",via="rls"} 2"#,
        r#"sluice_limit_rejections_total{plan="rls",policy="override",window="minute"} 1"#,
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
    for value in ["route=\"any", "rls-override:any"] {
        assert!(
            !metrics.contains(value),
            "a request's value as a label: {value}"
        );
    }
}
