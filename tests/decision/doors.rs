//! One admission behind every door: the same callers sent through the proxy,
//! `/v1/check`, Envoy's rate limit service (a `[[decision.descriptors]]` entry of
//! Envoy's `remote_address`) and forward auth spend one budget, and every door
//! sees the same count.

use serde_json::{Value, json};

use super::rls::rls;
use super::support::{self, Req};
use super::{decision_addr, forwarded};

/// What `/admin/usage` says `ip` used of its minute.
async fn used(live: &support::Live, ip: &str) -> u64 {
    let usage = live
        .admin(Req::get(&format!("/admin/usage?caller=ip:{ip}")))
        .await
        .json();
    let policy = &usage["policies"][0];
    assert_eq!(policy["policy"], "standard", "{usage}");
    policy["limits"][0]["used"].as_u64().unwrap()
}

async fn through_rls(addr: String, ip: &str, times: usize) -> Vec<Value> {
    let call = json!({"domain": "edge", "descriptors": [{"entries": [["remote_address", ip]]}]});
    let calls = json!(vec![call; times]);
    tokio::task::spawn_blocking(move || rls(&addr, &calls))
        .await
        .unwrap()
}

async fn check(live: &support::Live, ip: &str) -> Value {
    let body = json!({"policy": "standard", "caller": format!("ip:{ip}")});
    live.admin(Req::post("/v1/check", body.to_string()))
        .await
        .json()
}

#[tokio::test]
async fn the_proxy_check_rls_and_forward_auth_count_one_budget_alike() {
    let live = support::live(support::rls::DOORS).await;
    let decision = decision_addr(&live);
    for ip in ["203.0.113.1", "203.0.113.2", "203.0.113.3"] {
        // Two through each door.
        for _ in 0..2 {
            let proxied = Req::get("/api/x")
                .header("x-forwarded-for", ip)
                .send(live.addr)
                .await;
            assert_eq!(proxied.status, 200);
            assert_eq!(check(&live, ip).await["allowed"], true);
            let fa = forwarded("GET", "/api/x", ip).send(decision).await;
            assert_eq!(fa.status, 200);
        }
        let answers = through_rls(decision.to_string(), ip, 2).await;
        assert_eq!(answers[1]["overall_code"], "OK", "{answers:?}");
        assert_eq!(answers[1]["statuses"][0]["limit_remaining"], 2);
        assert_eq!(used(&live, ip).await, 8);

        // The last two of the budget, then every door refuses.
        let proxied = Req::get("/api/x")
            .header("x-forwarded-for", ip)
            .send(live.addr)
            .await;
        assert_eq!(proxied.sf_param("ratelimit", "minute", "r"), Some(1));
        let fa = forwarded("GET", "/api/x", ip).send(decision).await;
        assert_eq!(fa.sf_param("ratelimit", "minute", "r"), Some(0));
        Req::get("/api/x")
            .header("x-forwarded-for", ip)
            .send(live.addr)
            .await
            .problem(429);
        forwarded("GET", "/api/x", ip)
            .send(decision)
            .await
            .problem(429);
        assert_eq!(check(&live, ip).await["allowed"], false);
        let refused = through_rls(decision.to_string(), ip, 1).await;
        assert_eq!(refused[0]["overall_code"], "OVER_LIMIT");
        let limit = &refused[0]["statuses"][0]["current_limit"];
        assert_eq!(limit["requests_per_unit"], 10);
        assert_eq!(limit["unit"], "MINUTE");
        assert_eq!(used(&live, ip).await, 10, "refusals count nothing");
    }
    live.stop().await;
}
