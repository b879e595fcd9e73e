//! Envoy's rate limit calls in the access log, as an operator reads it: one JSON
//! line a call with `"via": "rls"`, the domain as the route, the proxy as the
//! client, what the answer means to the proxy's client as the status, the windows
//! over their limits as `violated`, and a refusal flood summarised like the proxy's.

use serde_json::{Value, json};

use super::rls::rls;
use super::{decision_addr, support};

const CONFIG: &str = r#"
[decision]
listen = "127.0.0.1:0"

[policies.standard]
anonymous = { per_minute = 1 }

[[decision.descriptors]]
domain = "edge"
entries = ["remote_address"]
policy = "standard"
"#;

const METHOD: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// Envoy's own client's answers to `calls`, made to `live`'s decision listener.
async fn calling(live: &support::Live, calls: Value) -> Vec<Value> {
    let addr = decision_addr(live).to_string();
    tokio::task::spawn_blocking(move || rls(&addr, &calls))
        .await
        .unwrap()
}

/// `sluice_decisions_total{via="rls"}` of `outcome`.
async fn decisions(live: &support::Live, outcome: &str) -> Option<f64> {
    let metrics = live.admin(support::Req::get("/metrics")).await.text();
    let series = format!(r#"sluice_decisions_total{{outcome="{outcome}",via="rls"}}"#);
    support::metric(&metrics, &series)
}

#[tokio::test]
async fn each_call_is_one_line_via_rls_and_refusals_are_summarised() {
    let live = support::live(CONFIG).await;
    let call = json!({"domain": "edge",
                      "descriptors": [{"entries": [["remote_address", "203.0.113.1"]]}]});
    let mut calls = vec![call; 4];
    calls.push(json!({"domain": "", "descriptors": [{"entries": [["k", "v"]]}]}));
    let answers = calling(&live, json!(calls)).await;
    let codes: Vec<_> = answers[..4].iter().map(|a| &a["overall_code"]).collect();
    assert_eq!(codes, ["OK", "OVER_LIMIT", "OVER_LIMIT", "OVER_LIMIT"]);
    assert_eq!(answers[4]["grpc"], "INVALID_ARGUMENT");

    // The OK, the first OVER_LIMIT, the bad call, and (once the caller has been
    // quiet for a second) the last OVER_LIMIT, counting the one left out.
    let lines: Vec<Value> = (live.access_log.wait_lines(4).await.iter())
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines.len(), 4, "{lines:#?}");
    for line in &lines {
        assert_eq!(line["via"], "rls", "{line}");
        assert_eq!(line["client"], "127.0.0.1");
        assert_eq!(line["method"], "POST");
        assert_eq!(line["path"], METHOD);
        assert!(line["duration_ms"].as_f64().unwrap() >= 0.0);
    }
    let fields = |line: &Value| {
        let route = line["route"].as_str().unwrap().to_string();
        let status = line["status"].as_u64().unwrap();
        let outcome = line["outcome"].as_str().unwrap().to_string();
        let grpc = line["grpc_status"].as_u64().unwrap();
        (route, status, outcome, grpc, line["repeated"].as_u64())
    };
    let owned = |route: &str, status, outcome: &str, grpc, repeated| {
        (
            route.to_string(),
            status,
            outcome.to_string(),
            grpc,
            repeated,
        )
    };
    assert_eq!(fields(&lines[0]), owned("edge", 200, "allowed", 0, None));
    assert_eq!(fields(&lines[1]), owned("edge", 429, "limited", 0, None));
    assert_eq!(
        fields(&lines[2]),
        owned("none", 400, "bad_request", 3, None)
    );
    assert_eq!(fields(&lines[3]), owned("edge", 429, "limited", 0, Some(1)));
    // The window that refused, as an HTTP refusal's line names it.
    let violated: Vec<_> = lines.iter().map(|line| &line["violated"]).collect();
    assert_eq!(
        violated,
        [
            &json!([]),
            &json!(["minute"]),
            &json!([]),
            &json!(["minute"])
        ]
    );
    live.stop().await;
}

/// A call without the listener's token is refused before anything is read: it is
/// still one line (`UNAUTHENTICATED`, 401, no domain read) and counted.
#[tokio::test]
async fn a_call_without_the_token_is_logged_and_counted() {
    let live =
        support::live(&CONFIG.replace("[decision]\n", "[decision]\ntoken = \"s3cret\"\n")).await;
    let call = json!([{"domain": "edge",
                       "descriptors": [{"entries": [["remote_address", "203.0.113.1"]]}]}]);
    let answers = calling(&live, call).await;
    assert_eq!(answers[0]["grpc"], "UNAUTHENTICATED", "{}", answers[0]);
    let lines = live.access_log.wait_lines(1).await;
    assert_eq!(lines.len(), 1, "{lines:#?}");
    let line: Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(line["via"], "rls", "{line}");
    assert_eq!(line["status"], 401, "{line}");
    assert_eq!(line["outcome"], "unauthorized", "{line}");
    assert_eq!(line["grpc_status"], 16, "{line}");
    assert_eq!(line["route"], "none", "{line}");
    assert_eq!(decisions(&live, "unauthorized").await, Some(1.0));
    live.stop().await;
}

/// A call to a method the listener does not serve is UNIMPLEMENTED, logged as a
/// 404 and counted as `no_route`.
#[tokio::test]
async fn a_call_to_another_method_is_unimplemented_logged_and_counted() {
    let live = support::live(CONFIG).await;
    let method = "/envoy.service.ratelimit.v2.RateLimitService/ShouldRateLimit";
    let call = json!([{"domain": "edge", "method": method,
                       "descriptors": [{"entries": [["remote_address", "203.0.113.1"]]}]}]);
    let answers = calling(&live, call).await;
    assert_eq!(answers[0]["grpc"], "UNIMPLEMENTED", "{}", answers[0]);
    let lines = live.access_log.wait_lines(1).await;
    let line: Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(
        (line["status"].as_u64(), line["outcome"].as_str()),
        (Some(404), Some("no_route")),
        "{line}"
    );
    assert_eq!(line["path"], method, "{line}");
    assert_eq!(decisions(&live, "no_route").await, Some(1.0));
    live.stop().await;
}
