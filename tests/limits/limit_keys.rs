//! End-to-end limit keys: a policy's `key = [...]` decides what one budget belongs to,
//! `on_missing` what a request lacking a part is counted as; the same keys in the
//! memory and Redis stores, `/v1/check` and `/admin/usage`; keyed buckets bounded by
//! `max_keys` without lock-out.

use crate::support;
use crate::support::redis_server;

use redis_server::RedisServer;
use support::{Live, Req, Resp, live, metric};

const TENANT: &str = "x-tenant-id";

fn config(store: &str, key: &str, on_missing: &str) -> String {
    format!(
        r#"
        {store}
        [policies.p]
        anonymous = {{ per_minute = 2 }}
        key = {key}
        {on_missing}
        [[routes]]
        name = "api"
        path_prefix = "/api"
        respond = {{ status = 200, body = "ok" }}
        policy = "p"
        "#
    )
}

async fn send(gw: &Live, path: &str, from: &str, tenant: Option<&str>) -> Resp {
    let mut req = Req::get(path).from(from);
    if let Some(tenant) = tenant {
        req = req.header(TENANT, tenant);
    }
    req.send(gw.addr).await
}

#[track_caller]
fn status(resp: &Resp) -> u16 {
    resp.status.as_u16()
}

/// One tenant's budget whoever calls; another tenant's is its own; a request without
/// the header is counted by its IP (never one bucket for all); the decision API and
/// the usage API see the same budgets.
async fn tenants_share_one_budget(store: &str) {
    let gw = live(&config(store, &format!("[\"header:{TENANT}\"]"), "")).await;
    assert_eq!(
        status(&send(&gw, "/api/x", "127.0.0.1", Some("t1")).await),
        200
    );
    assert_eq!(
        status(&send(&gw, "/api/x", "127.0.0.2", Some("t1")).await),
        200
    );
    let refused = send(&gw, "/api/x", "127.0.0.3", Some("t1")).await;
    refused.problem(429);
    assert_eq!(
        status(&send(&gw, "/api/x", "127.0.0.3", Some("t2")).await),
        200
    );
    // No header: by IP, two each.
    for from in ["127.0.0.4", "127.0.0.5"] {
        for _ in 0..2 {
            assert_eq!(
                status(&send(&gw, "/api/x", from, None).await),
                200,
                "{from}"
            );
        }
        send(&gw, "/api/x", from, None).await.problem(429);
    }
    // The usage API, given the part, shows t2's budget: one used of two.
    let usage = gw
        .admin(Req::get(&format!(
            "/admin/usage?caller=ip:127.0.0.9&header:{TENANT}=t2"
        )))
        .await
        .json();
    let minute = &usage["policies"][0]["limits"][0];
    assert_eq!(
        (minute["used"].clone(), minute["limit"].clone()),
        (1.into(), 2.into()),
        "{usage}"
    );
    // The decision API spends t2's last request; the proxy then refuses t2.
    let check = serde_json::json!({
        "policy": "p", "caller": "ip:127.0.0.9", "key": {format!("header:{TENANT}"): "t2"}
    });
    let answer = gw
        .admin(Req::post("/v1/check", check.to_string()))
        .await
        .json();
    assert_eq!(answer["allowed"], true, "{answer}");
    send(&gw, "/api/x", "127.0.0.6", Some("t2"))
        .await
        .problem(429);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_keyed_policy_gives_each_tenant_one_budget_in_memory() {
    tenants_share_one_budget("").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_keyed_policy_gives_each_tenant_one_budget_in_redis() {
    let redis = RedisServer::start();
    let store = format!("[store]\nbackend = \"redis\"\nurl = \"{}\"", redis.url());
    tenants_share_one_budget(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_lacking_a_part_follows_on_missing() {
    let key = format!("[\"header:{TENANT}\"]");
    // deny: 401 with a problem body that names the part.
    let gw = live(&config("", &key, "on_missing = \"deny\"")).await;
    let problem = send(&gw, "/api/x", "127.0.0.1", None).await.problem(401);
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("header:x-tenant-id"),
        "{problem}"
    );
    assert_eq!(
        status(&send(&gw, "/api/x", "127.0.0.1", Some("t1")).await),
        200
    );
    gw.stop().await;
    // shared: one bucket for every request without the header, whoever sends it.
    let gw = live(&config("", &key, "on_missing = \"shared\"")).await;
    assert_eq!(status(&send(&gw, "/api/x", "127.0.0.1", None).await), 200);
    assert_eq!(status(&send(&gw, "/api/x", "127.0.0.2", None).await), 200);
    send(&gw, "/api/x", "127.0.0.3", None).await.problem(429);
    // An empty header is missing too.
    send(&gw, "/api/x", "127.0.0.3", Some(""))
        .await
        .problem(429);
    assert_eq!(
        status(&send(&gw, "/api/x", "127.0.0.3", Some("t1")).await),
        200
    );
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_query_and_method_parts_split_budgets() {
    let gw = live(&config(
        "",
        "[\"consumer\", \"path:2\", \"query:org\", \"method\"]",
        "",
    ))
    .await;
    for path in ["/api/a?org=1", "/api/b?org=1", "/api/a?org=2"] {
        for _ in 0..2 {
            assert_eq!(
                status(&send(&gw, path, "127.0.0.1", None).await),
                200,
                "{path}"
            );
        }
        send(&gw, path, "127.0.0.1", None).await.problem(429);
    }
    // The same combination from another caller is another budget ("consumer").
    assert_eq!(
        status(&send(&gw, "/api/a?org=1", "127.0.0.2", None).await),
        200
    );
    // A value over 256 bytes is refused, not truncated into someone else's bucket.
    let long = format!("/api/a?org={}", "x".repeat(257));
    send(&gw, &long, "127.0.0.1", None).await.problem(400);
    let long_header = "y".repeat(257);
    let gw2 = live(&config("", &format!("[\"header:{TENANT}\"]"), "")).await;
    send(&gw2, "/api/x", "127.0.0.1", Some(&long_header))
        .await
        .problem(400);
    gw.stop().await;
    gw2.stop().await;
}

/// Every way of naming one tenant twice, or of hiding the key from the upstream,
/// is refused or counted as what the upstream will see: two copies of the key header
/// (equal, empty, over HTTP/1.1 or HTTP/2) or of the key parameter are a 400; a key
/// header named in `Connection` (removed before the upstream) is missing; a parameter
/// spelled with escapes or `+` is the value the upstream decodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_part_twice_hidden_or_escaped_names_no_new_budget() {
    let gw = live(&config(
        "",
        &format!("[\"header:{TENANT}\"]"),
        "on_missing = \"deny\"",
    ))
    .await;
    for h2 in [false, true] {
        for (first, second) in [("t1", "t1"), ("t1", "junk"), ("", "")] {
            let mut req = Req::get("/api/x")
                .header(TENANT, first)
                .header(TENANT, second);
            if h2 {
                req = req.h2();
            }
            let problem = req.send(gw.addr).await.problem(400);
            assert!(
                problem["detail"]
                    .as_str()
                    .is_some_and(|d| d.contains("more than once")),
                "{problem}"
            );
        }
    }
    let hidden = Req::get("/api/x")
        .header(TENANT, "t-hidden")
        .header("connection", &format!("keep-alive, {TENANT}"))
        .send(gw.addr)
        .await;
    hidden.problem(401);
    gw.stop().await;

    let gw = live(&config("", "[\"query:org\"]", "")).await;
    for _ in 0..2 {
        assert_eq!(
            status(&send(&gw, "/api/a?org=Q1", "127.0.0.1", None).await),
            200
        );
    }
    for spelled in ["org=%51%31", "org=Q%31", "%6Frg=Q1", "o%72g=%51%31&x=1"] {
        send(&gw, &format!("/api/a?{spelled}"), "127.0.0.2", None)
            .await
            .problem(429);
    }
    assert_eq!(
        status(&send(&gw, "/api/a?org=a+b", "127.0.0.1", None).await),
        200
    );
    assert_eq!(
        status(&send(&gw, "/api/a?org=a%20b", "127.0.0.1", None).await),
        200
    );
    send(&gw, "/api/a?org=a%20b", "127.0.0.1", None)
        .await
        .problem(429);
    for twice in ["org=1&org=2", "org=&org=", "org=1&%6Frg=1"] {
        send(&gw, &format!("/api/a?{twice}"), "127.0.0.1", None)
            .await
            .problem(400);
    }
    gw.stop().await;
}

/// Distinct tenants to spray: far more than `max_keys`, as a client inventing a
/// header value per request would send.
const SPRAYED: usize = 100_000;

/// Sends `requests` one after the other on one keep-alive connection from
/// 127.0.0.1 to `addr`, returning each answer's status and body.
async fn on_one_connection(
    addr: std::net::SocketAddr,
    requests: Vec<http::Request<String>>,
) -> Vec<(u16, bytes::Bytes)> {
    use http_body_util::BodyExt;
    let stream = support::connect(addr, Some("127.0.0.1".parse().unwrap())).await;
    let io = hyper_util::rt::TokioIo::new(stream);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
    tokio::spawn(conn);
    let mut answers = Vec::with_capacity(requests.len());
    for request in requests {
        sender.ready().await.unwrap();
        let response = sender.send_request(request).await.unwrap();
        let status = response.status().as_u16();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        answers.push((status, body));
    }
    answers
}

/// A client that makes up a new header value for each request must not grow the
/// gateway's memory (tracked keys stay within `max_keys`, the rest evicted and
/// counted), nor lock anyone out: every request of the spray, and a newcomer's
/// during and after it, is admitted, with the newcomer's budget still enforced.
/// Most values come as proxied requests, some through the decision API, which
/// takes the same parts in its body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distinct_header_values_stay_within_max_keys_and_lock_nobody_out() {
    let store = "[store]\nmax_keys = 100";
    let gw = live(&config(store, &format!("[\"header:{TENANT}\"]"), "")).await;
    let proxied = |i: usize| {
        let request = http::Request::get("/api/x").header("host", "gw");
        let request = request.header(TENANT, format!("spray-{i}"));
        request.body(String::new()).unwrap()
    };
    let checked = |i: usize| {
        let body = format!(
            r#"{{"policy": "p", "caller": "ip:127.0.0.1", "key": {{"header:{TENANT}": "spray-{i}"}}}}"#
        );
        let request = http::Request::post("/v1/check").header("host", "127.0.0.1");
        request.body(body).unwrap()
    };
    // Three connections of proxied requests and one of checks, at once.
    let connections = 4;
    let mut sprays = Vec::new();
    for c in 0..connections {
        let values = (c..SPRAYED).step_by(connections);
        let (addr, requests): (_, Vec<_>) = if c == 0 {
            (gw.admin, values.map(checked).collect())
        } else {
            (gw.addr, values.map(proxied).collect())
        };
        sprays.push(tokio::spawn(on_one_connection(addr, requests)));
    }
    // A newcomer in the middle of the spray is admitted.
    let during = send(&gw, "/api/x", "127.0.0.2", Some("newcomer-q7")).await;
    assert_eq!(status(&during), 200, "{}", during.text());
    let mut answered = 0;
    for (c, spray) in sprays.into_iter().enumerate() {
        for (status, body) in spray.await.unwrap() {
            let text = String::from_utf8_lossy(&body);
            assert_eq!(status, 200, "connection {c}: {text}");
            if c == 0 {
                let answer: serde_json::Value = serde_json::from_slice(&body).unwrap();
                assert_eq!(answer["allowed"], true, "{answer}");
            }
            answered += 1;
        }
    }
    assert_eq!(answered, SPRAYED);
    let text = gw.admin(Req::get("/metrics")).await.text();
    let tracked = metric(&text, "sluice_tracked_callers").unwrap();
    assert!(tracked <= 100.0, "tracked {tracked}");
    let evicted = metric(&text, "sluice_evicted_callers_total").unwrap();
    assert!(evicted >= (SPRAYED * 95 / 100) as f64, "evicted {evicted}");
    // A newcomer after it is admitted too, and its budget (2) is still enforced.
    for _ in 0..2 {
        let after = send(&gw, "/api/x", "127.0.0.3", Some("newcomer-z9")).await;
        assert_eq!(status(&after), 200, "{}", after.text());
    }
    send(&gw, "/api/x", "127.0.0.3", Some("newcomer-z9"))
        .await
        .problem(429);
    // Raw values are kept nowhere the operator reads: not in the access log.
    let lines = gw.access_log.lines().join("\n");
    assert!(
        !lines.contains("spray-1") && !lines.contains("newcomer-"),
        "access log holds raw values"
    );
    gw.stop().await;
}

#[test]
fn bad_keys_are_config_errors() {
    for (key, reason) in [
        ("[\"user\"]", "unknown part"),
        ("[\"path:0\"]", "path:N"),
        ("[\"ip\", \"ip\"]", "listed twice"),
        ("[]", "at least one part"),
        ("\"ip\"", "expected a list"),
        (
            "[\"header:X-Forwarded-For\"]",
            "rewrites or removes x-forwarded-for",
        ),
        ("[\"header:connection\"]", "rewrites or removes connection"),
        (
            "[\"header:X-Request-Id\"]",
            "x-request-id is the request id header",
        ),
    ] {
        let text = config("", key, "");
        let err = sluice::config::Config::parse(std::path::Path::new("gateway.toml"), &text)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("policies.p.key") && err.contains(reason),
            "{key}: {err}"
        );
    }
    // The request id header is whichever [log] names; the default is then a header
    // like any other.
    let renamed = "[log]\nrequest_id_header = \"x-trace-id\"";
    let err = sluice::config::Config::parse(
        std::path::Path::new("gateway.toml"),
        &config(renamed, "[\"header:x-trace-id\"]", ""),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("policies.p.key") && err.contains("x-trace-id is the request id header"),
        "{err}"
    );
    let text = config(renamed, "[\"header:x-request-id\"]", "");
    sluice::config::Config::parse(std::path::Path::new("gateway.toml"), &text).unwrap();
    let text = config("", "[\"ip\"]", "on_missing = \"maybe\"");
    let err = sluice::config::Config::parse(std::path::Path::new("gateway.toml"), &text)
        .unwrap_err()
        .to_string();
    assert!(err.contains("policies.p.on_missing"), "{err}");
}
