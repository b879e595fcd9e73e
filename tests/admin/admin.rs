//! The admin listener as an operator and a non-proxied service use it: the bearer
//! token, the loopback rule, `/admin/usage` and the decision API `/v1/check`.

use crate::support;

use support::free_port;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use http::Method;
use serde_json::{Value, json};
use support::{Live, Req, Route, Toml, live, route};

const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");

use support::ACME_SHA256;
/// sha256 of "batch-key-1".
const BATCH_SHA256: &str = "039ff8289cc37eefa54e3386f448c2ec4ec4cadf71ec12ce4fb2c3b899408ea7";

/// What the admin tests ask of a [`Live`] gateway.
impl Live {
    /// `GET /admin/usage?caller=...` as JSON, asserting 200.
    async fn usage(&self, caller: &str) -> Value {
        let resp = self
            .admin(Req::get(&format!("/admin/usage?caller={caller}")))
            .await;
        assert_eq!(resp.status, 200, "usage of {caller}: {}", resp.text());
        assert_eq!(resp.header("content-type"), Some("application/json"));
        resp.json()
    }

    /// `POST /v1/check` with `body`, asserting 200; the answer as JSON.
    async fn check(&self, body: Value) -> Value {
        let resp = self.admin(Req::post("/v1/check", body.to_string())).await;
        assert_eq!(resp.status, 200, "check {body}: {}", resp.text());
        resp.json()
    }
}

/// The limits entry for `policy` and `plan` in a usage answer.
#[track_caller]
fn usage_limits(usage: &Value, policy: &str, plan: &str) -> Vec<Value> {
    usage["policies"]
        .as_array()
        .unwrap_or_else(|| panic!("no policies array: {usage}"))
        .iter()
        .find(|p| p["policy"] == policy && p["plan"] == plan)
        .unwrap_or_else(|| panic!("no {policy}/{plan} entry in {usage}"))["limits"]
        .as_array()
        .unwrap_or_else(|| panic!("no limits array: {usage}"))
        .clone()
}

#[track_caller]
fn window<'a>(limits: &'a [Value], name: &str) -> &'a Value {
    limits
        .iter()
        .find(|l| l["window"] == name)
        .unwrap_or_else(|| panic!("no {name} window in {limits:?}"))
}

// ---- 7. the admin token ------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_endpoints_need_the_bearer_token_but_metrics_and_health_do_not() {
    // Unique to this test: the environment is shared by every test of the binary.
    const VAR: &str = "SLUICE_TEST_ADMIN_TOKEN_ADMIN_RS_3B9F1C";
    const TOKEN: &str = "s3cret-admin-token-3b9f1c";
    // SAFETY: no other test reads or writes this variable, and std serialises its
    // own environment access.
    #[allow(unsafe_code)]
    unsafe {
        std::env::set_var(VAR, TOKEN)
    };
    let live = live(
        &Toml::new()
            .raw(&format!("[admin]\ntoken = \"env:{VAR}\""))
            .policy("standard", &[("anonymous", "{ per_minute = 5 }")])
            .route(api_route())
            .build(),
    )
    .await;
    assert_eq!(live.get("/api").await.status, 200);

    let usage = "/admin/usage?caller=ip:127.0.0.1";
    let check = || {
        Req::post(
            "/v1/check",
            json!({"policy": "standard", "caller": "ip:10.0.0.1"}).to_string(),
        )
    };
    let delete = || Req::new(Method::DELETE, usage);
    let reload = || Req::post("/admin/reload", "");
    let protected = [
        ("GET /admin/usage", Req::get(usage)),
        ("DELETE /admin/usage", delete()),
        ("POST /admin/reload", reload()),
        ("POST /v1/check", check()),
    ];
    // Each refused request from its own address: wrong tokens from one address are
    // slowed down, which is tested below.
    let mut source = 10;
    for (what, req) in protected {
        for (how, req) in [
            ("no token", req.clone()),
            (
                "a wrong token",
                req.clone().header("authorization", "Bearer not-the-token"),
            ),
            (
                "the token in another scheme",
                req.clone()
                    .header("authorization", &format!("Basic {TOKEN}")),
            ),
            (
                "the token as an API key",
                req.clone().header("x-api-key", TOKEN),
            ),
        ] {
            source += 1;
            let resp = live.admin(req.from(&format!("127.0.0.{source}"))).await;
            resp.problem(401);
            assert_eq!(
                resp.header("www-authenticate"),
                Some("Bearer"),
                "{what} with {how}"
            );
        }
    }
    // Nothing was reset or counted by the refused requests.
    let bearer = format!("Bearer {TOKEN}");
    let resp = live
        .admin(Req::get(usage).header("authorization", &bearer))
        .await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(
        window(
            &usage_limits(&resp.json(), "standard", "anonymous"),
            "minute"
        )["used"],
        1
    );
    let resp = live.admin(check().header("authorization", &bearer)).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.json()["allowed"], true);
    let resp = live.admin(reload().header("authorization", &bearer)).await;
    assert_eq!(resp.status, 200, "{}", resp.text());

    for open in ["/metrics", "/healthz", "/readyz"] {
        let resp = live.admin(Req::get(open)).await;
        assert_eq!(resp.status, 200, "{open} needs no token: {}", resp.text());
    }
    // The scheme in any case.
    for scheme in ["BEARER", "bearer", "BeArEr"] {
        let resp = live
            .admin(Req::get(usage).header("authorization", &format!("{scheme} {TOKEN}")))
            .await;
        assert_eq!(resp.status, 200, "{scheme}: {}", resp.text());
    }
    // A token of another length, or a prefix of the right one, is just wrong.
    for wrong in [&TOKEN[..TOKEN.len() - 1], "s", &format!("{TOKEN}x")] {
        let resp = live
            .admin(
                Req::get(usage)
                    .header("authorization", &format!("Bearer {wrong}"))
                    .from("127.0.0.99"),
            )
            .await;
        resp.problem(401);
    }
    // One address guessing: five wrong tokens are answered at once, then the answers
    // slow down (100 ms, 200 ms, 400 ms ...); other addresses are not slowed.
    let guess = || {
        Req::get(usage)
            .header("authorization", "Bearer guess")
            .from("127.0.0.77")
    };
    for _ in 0..7 {
        live.admin(guess()).await.problem(401);
    }
    let started = Instant::now();
    live.admin(guess()).await.problem(401);
    let slowed = started.elapsed();
    assert!(
        slowed >= Duration::from_millis(350),
        "the 8th wrong token took {slowed:?}"
    );
    // The 9th guess is held back (1.6 s); meanwhile another address is answered.
    {
        let held = live.admin(guess());
        tokio::pin!(held);
        let other = live.admin(Req::get(usage).from("127.0.0.78"));
        tokio::select! {
            biased;
            _ = &mut held => panic!("the guessing address was answered before another address"),
            resp = other => resp.problem(401),
        };
        held.await.problem(401);
    }
    live.stop().await;
}

/// DESIGN: off loopback without a token, only the probes answer (Prometheus and a
/// container's health checks work); the admin API and the decision API get 403.
#[test]
fn an_admin_listener_off_loopback_without_a_token_serves_only_metrics_and_probes() {
    let dir = tempfile::tempdir().unwrap();
    let (port, admin_port) = (free_port(), free_port());
    let path = dir.path().join("gateway.toml");
    std::fs::write(
        &path,
        format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\n[admin]\nlisten = \"0.0.0.0:{admin_port}\"\n\
             [[routes]]\nname = \"ping\"\npath_prefix = \"/ping\"\nrespond = {{ status = 200 }}\n"
        ),
    )
    .unwrap();
    let mut child = Command::new(SLUICE)
        .args(["run", "-c", path.to_str().unwrap()])
        .current_dir(dir.path())
        .env_remove("SLUICE_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("sluice starts");
    let started = Instant::now();
    while admin_answer(admin_port, "GET", "/healthz", None).is_none() {
        assert!(child.try_wait().unwrap().is_none(), "sluice exited");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no admin listener"
        );
        std::thread::sleep(Duration::from_millis(25));
    }
    let answers: Vec<(&str, &str, Option<String>)> = [
        ("GET", "/metrics"),
        ("GET", "/healthz"),
        ("GET", "/readyz"),
        ("GET", "/admin/usage?caller=ip:127.0.0.1"),
        ("POST", "/admin/reload"),
        ("GET", "/admin/bans"),
        ("POST", "/v1/check"),
    ]
    .into_iter()
    .map(|(method, path)| (method, path, admin_answer(admin_port, method, path, None)))
    .collect();
    let _ = child.kill();
    let _ = child.wait();
    for (method, path, answer) in answers {
        let answer = answer.unwrap_or_default();
        let want = if path.starts_with("/admin") || path == "/v1/check" {
            "403"
        } else {
            "200"
        };
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {want}")),
            "{method} {path}: {answer}"
        );
    }
}

/// One request to the admin listener on `port`; the whole answer, if there was one.
fn admin_answer(port: u16, method: &str, path: &str, token: Option<&str>) -> Option<String> {
    use std::io::Write;
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: admin\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    text.starts_with("HTTP/").then_some(text)
}

#[test]
fn an_admin_listener_off_loopback_with_a_token_starts_and_protects_admin() {
    const VAR: &str = "SLUICE_TEST_OFF_LOOPBACK_TOKEN_9D2E";
    const TOKEN: &str = "off-loopback-token-9d2e";
    let dir = tempfile::tempdir().unwrap();
    let (port, admin_port) = (free_port(), free_port());
    let path = dir.path().join("gateway.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[server]
listen = "127.0.0.1:{port}"

[admin]
listen = "0.0.0.0:{admin_port}"
token = "env:{VAR}"

[[routes]]
name = "ping"
path_prefix = "/ping"
respond = {{ status = 200 }}
"#
        ),
    )
    .unwrap();
    let mut child = Command::new(SLUICE)
        .args(["run", "-c", path.to_str().unwrap()])
        .current_dir(dir.path())
        .env_remove("SLUICE_CONFIG")
        .env(VAR, TOKEN)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sluice starts");
    let answer = |path: &str, token| admin_answer(admin_port, "GET", path, token);
    let started = Instant::now();
    let health = loop {
        // Only an HTTP answer counts (a loopback connect can reach itself).
        if let Some(text) = answer("/healthz", None) {
            break text;
        }
        if let Some(status) = child.try_wait().unwrap() {
            let mut stderr = String::new();
            let _ = child.stderr.take().unwrap().read_to_string(&mut stderr);
            panic!("sluice exited with {status:?} although a token is set:\n{stderr}");
        }
        if started.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the admin listener never answered");
        }
        std::thread::sleep(Duration::from_millis(25));
    };
    let usage = answer("/admin/usage?caller=ip:127.0.0.1", None).unwrap_or_default();
    let authorized = answer("/admin/usage?caller=ip:127.0.0.1", Some(TOKEN)).unwrap_or_default();
    let _ = child.kill();
    let _ = child.wait();
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    assert!(usage.starts_with("HTTP/1.1 401"), "{usage}");
    assert!(authorized.starts_with("HTTP/1.1 200"), "{authorized}");
}

// ---- 8. usage -----------------------------------------------------------------------

/// `/api`, answered `ok` by the gateway, limited by policy `standard`.
fn api_route() -> Route {
    route("api", "/api").respond(200, "ok\n").policy("standard")
}

fn usage_config() -> String {
    Toml::new()
        .policy(
            "standard",
            &[
                ("anonymous", "{ per_minute = 5, per_day = 100 }"),
                ("registered", "{ per_minute = 10 }"),
            ],
        )
        .consumer("acme", ACME_SHA256)
        .route(api_route())
        .build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_shows_a_callers_counters_and_delete_resets_them() {
    let live = live(&usage_config()).await;
    for _ in 0..3 {
        assert_eq!(live.get("/api").await.status, 200);
    }
    live.advance_secs(10);

    let usage = live.usage("ip:127.0.0.1").await;
    assert_eq!(usage["caller"], "ip:127.0.0.1", "{usage}");
    let limits = usage_limits(&usage, "standard", "anonymous");
    let minute = window(&limits, "minute");
    assert_eq!(minute["limit"], 5, "{usage}");
    assert_eq!(minute["used"], 3, "{usage}");
    let reset = minute["reset_after"].as_u64().expect("reset_after seconds");
    // The requests leave the window in 50 s, counted up to one 1-s bucket longer.
    assert!(
        (50..=51).contains(&reset),
        "the first request leaves the window in 50 to 51 s: {usage}"
    );
    let day = window(&limits, "day");
    assert_eq!(
        (day["limit"].as_u64(), day["used"].as_u64()),
        (Some(100), Some(3))
    );
    let day_reset = day["reset_after"].as_u64().unwrap();
    assert!(
        (86_390..=86_390 + 1_440).contains(&day_reset),
        "a day minus 10 s, plus up to one 24-min bucket: {usage}"
    );
    // Percent-encoded as a browser or curl --data-urlencode would send it.
    let encoded = live.usage("ip%3A127.0.0.1").await;
    assert_eq!(
        window(&usage_limits(&encoded, "standard", "anonymous"), "minute")["used"],
        3
    );
    // Reading usage counts nothing.
    let again = live.usage("ip:127.0.0.1").await;
    assert_eq!(
        window(&usage_limits(&again, "standard", "anonymous"), "minute")["used"],
        3
    );
    // Another address has its own, untouched counters.
    let other = live.usage("ip:127.0.0.9").await;
    assert_eq!(
        window(&usage_limits(&other, "standard", "anonymous"), "minute")["used"],
        0
    );

    let resp = live
        .admin(Req::new(Method::DELETE, "/admin/usage?caller=ip:127.0.0.1"))
        .await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let usage = live.usage("ip:127.0.0.1").await;
    let limits = usage_limits(&usage, "standard", "anonymous");
    assert_eq!(window(&limits, "minute")["used"], 0, "{usage}");
    assert_eq!(window(&limits, "day")["used"], 0, "{usage}");
    // The caller has its whole budget again: 5 admitted, the 6th limited.
    for i in 0..5 {
        let resp = live.get("/api").await;
        assert_eq!(resp.status, 200, "request {} after the reset", i + 1);
        assert_eq!(resp.sf_param("ratelimit", "minute", "r"), Some(4 - i));
    }
    live.get("/api").await.problem(429);

    // A configured consumer, by name.
    for _ in 0..2 {
        let resp = Req::get("/api")
            .header("x-api-key", "demo-key-acme")
            .send(live.addr)
            .await;
        assert_eq!(resp.status, 200);
    }
    let usage = live.usage("consumer:acme").await;
    assert_eq!(usage["caller"], "consumer:acme");
    let limits = usage_limits(&usage, "standard", "registered");
    let minute = window(&limits, "minute");
    assert_eq!(
        (minute["limit"].as_u64(), minute["used"].as_u64()),
        (Some(10), Some(2))
    );
    assert!(minute["reset_after"].as_u64().unwrap() > 0);
    assert!(
        usage["policies"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["plan"] == "registered"),
        "a consumer is shown with its own plan only: {usage}"
    );
    let resp = live
        .admin(Req::new(
            Method::DELETE,
            "/admin/usage?caller=consumer:acme",
        ))
        .await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let usage = live.usage("consumer:acme").await;
    assert_eq!(
        window(&usage_limits(&usage, "standard", "registered"), "minute")["used"],
        0
    );

    for bad in [
        "/admin/usage",
        "/admin/usage?caller=127.0.0.1",
        "/admin/usage?caller=ip:not-an-ip",
    ] {
        live.admin(Req::get(bad)).await.problem(400);
    }
    live.stop().await;
}

// ---- 9. the decision API ------------------------------------------------------------

fn check_config() -> String {
    Toml::new()
        .policy(
            "standard",
            &[
                ("anonymous", "{ per_minute = 2 }"),
                ("registered", "{ per_minute = 5 }"),
            ],
        )
        .consumer("batch-job", BATCH_SHA256)
        .route(api_route())
        .build()
}

fn ask(caller: &str, cost: u32) -> Value {
    json!({"policy": "standard", "caller": caller, "plan": "registered", "cost": cost})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_decision_api_counts_exactly_like_a_proxied_request() {
    assert_eq!(
        sha256_hex("batch-key-1"),
        BATCH_SHA256,
        "test constant matches `sluice hash-key batch-key-1`"
    );
    let live = live(&check_config()).await;

    for i in 0..4u64 {
        let answer = live.check(ask("consumer:batch-job", 1)).await;
        assert_eq!(answer["allowed"], true, "check {}: {answer}", i + 1);
        assert_eq!(answer["retry_after"], 0, "{answer}");
        let minute = window(answer["limits"].as_array().unwrap(), "minute");
        assert_eq!(minute["limit"], 5, "{answer}");
        assert_eq!(minute["remaining"], 4 - i, "check {}: {answer}", i + 1);
    }
    // The same consumer through the proxy: the 5th of 5.
    let resp = Req::get("/api")
        .header("x-api-key", "batch-key-1")
        .send(live.addr)
        .await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.sf_param("ratelimit", "minute", "r"), Some(0));
    // Budget spent: both paths refuse.
    let answer = live.check(ask("consumer:batch-job", 1)).await;
    assert_eq!(answer["allowed"], false, "{answer}");
    let retry = answer["retry_after"].as_u64().expect("retry_after seconds");
    // 60 s after the first check, plus up to one 1-s bucket.
    assert!((60..=61).contains(&retry), "{answer}");
    let limits = answer["limits"].as_array().unwrap();
    assert!(!limits.is_empty(), "{answer}");
    for limit in limits {
        assert_eq!(limit["remaining"], 0, "{answer}");
    }
    let resp = Req::get("/api")
        .header("x-api-key", "batch-key-1")
        .send(live.addr)
        .await;
    resp.problem(429);
    // The usage API agrees: 5 used (a refused check counts nothing).
    let usage = live.usage("consumer:batch-job").await;
    assert_eq!(
        window(&usage_limits(&usage, "standard", "registered"), "minute")["used"],
        5,
        "{usage}"
    );

    // When retry_after has passed, the budget is back.
    live.advance_secs(retry);
    let answer = live.check(ask("consumer:batch-job", 1)).await;
    assert_eq!(answer["allowed"], true, "{answer}");

    // cost > 1 consumes that many, all or nothing.
    let caller = "consumer:reporting-job";
    let answer = live.check(ask(caller, 3)).await;
    assert_eq!(answer["allowed"], true, "{answer}");
    assert_eq!(
        window(answer["limits"].as_array().unwrap(), "minute")["remaining"],
        2
    );
    let answer = live.check(ask(caller, 3)).await;
    assert_eq!(answer["allowed"], false, "3 more do not fit in 2: {answer}");
    assert!(answer["retry_after"].as_u64().unwrap() > 0, "{answer}");
    let answer = live.check(ask(caller, 2)).await;
    assert_eq!(
        answer["allowed"], true,
        "the refused cost-3 check consumed nothing: {answer}"
    );
    assert_eq!(
        window(answer["limits"].as_array().unwrap(), "minute")["remaining"],
        0
    );
    // cost defaults to 1; an IP caller uses its anonymous plan without naming it.
    let answer = live
        .check(json!({"policy": "standard", "caller": "ip:10.1.2.3"}))
        .await;
    assert_eq!(answer["allowed"], true, "{answer}");
    assert_eq!(
        window(answer["limits"].as_array().unwrap(), "minute")["remaining"],
        1
    );

    // Mistakes are 400 problems, and count nothing.
    for (body, word) in [
        (
            json!({"policy": "nope", "caller": "consumer:batch-job", "plan": "registered"}),
            "nope",
        ),
        (
            json!({"policy": "standard", "caller": "consumer:x", "plan": "platinum"}),
            "platinum",
        ),
        (
            json!({"policy": "standard", "caller": "consumer:x", "plan": "registered", "cost": 0}),
            "cost",
        ),
        (json!({"policy": "standard", "caller": "nobody"}), "caller"),
    ] {
        let resp = live.admin(Req::post("/v1/check", body.to_string())).await;
        let problem = resp.problem(400);
        assert!(
            problem["detail"].as_str().unwrap().contains(word),
            "{body}: {problem}"
        );
    }
    live.admin(Req::post("/v1/check", "{not json"))
        .await
        .problem(400);
    live.stop().await;
}

/// A check is admitted exactly like a proxied request of the same caller: an `ip:`
/// caller in `[access] deny` is denied, an exempt one is never counted, a banned one
/// (by hand or automatically) is refused with the ban's time left, and refusals a
/// check earns are strikes toward the same ban a proxied request would earn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_decision_api_applies_access_lists_exemption_and_bans() {
    let lists_and_bans = r#"
[access]
deny = ["10.8.0.0/16"]
exempt = ["10.9.0.0/16"]

[ban]
after = 3
within = "1m"
duration = "10m"
"#;
    let live = live(&format!("{lists_and_bans}{}", check_config())).await;
    let ask = |caller: &str| json!({"policy": "standard", "caller": caller});

    // Denied by the access lists: not allowed, and nothing counted.
    let answer = live.check(ask("ip:10.8.1.2")).await;
    assert_eq!(
        (&answer["allowed"], &answer["denied"]),
        (&json!(false), &json!(true)),
        "{answer}"
    );
    // Exempt: allowed however often, never counted.
    for _ in 0..5 {
        let answer = live.check(ask("ip:10.9.0.5")).await;
        assert_eq!(
            answer["allowed"], true,
            "an exempt caller is never limited: {answer}"
        );
    }
    let used = minute_used(&live, "ip:10.9.0.5", "anonymous").await;
    assert_eq!(used, 0, "an exempt caller is not counted");

    // Banned by hand: a consumer and an address are refused until the ban ends.
    for caller in ["consumer:batch-job", "ip:10.1.2.3"] {
        let made = live
            .admin(Req::post(
                "/admin/bans",
                json!({"caller": caller, "duration": "5m"}).to_string(),
            ))
            .await;
        assert_eq!(made.status, 201, "{}", made.text());
        let mut question = ask(caller);
        question["plan"] = json!(if caller.starts_with("consumer") {
            "registered"
        } else {
            "anonymous"
        });
        let answer = live.check(question).await;
        assert_eq!(answer["allowed"], false, "{caller} is banned: {answer}");
        assert_eq!(answer["banned"], true, "{answer}");
        let retry = answer["retry_after"].as_u64().unwrap();
        assert!(
            (299..=300).contains(&retry),
            "the ban's time left: {answer}"
        );
    }
    let used = minute_used(&live, "consumer:batch-job", "registered").await;
    assert_eq!(used, 0, "a banned caller's check counts nothing");

    // Banned by its checks: refusals are strikes, and the ban holds for proxied
    // requests from that address too.
    let caller = "ip:127.0.0.61";
    let answers: Vec<bool> = checks_allowed(&live, ask(caller), 5).await;
    assert_eq!(
        answers,
        [true, true, false, false, false],
        "two fit, then 429s"
    );
    let answer = live.check(ask(caller)).await;
    assert_eq!(
        (&answer["allowed"], &answer["banned"]),
        (&json!(false), &json!(true)),
        "three refused checks ban the caller: {answer}"
    );
    let proxied = Req::get("/api").from("127.0.0.61").send(live.addr).await;
    let problem = proxied.problem(403);
    assert!(
        problem["type"]
            .as_str()
            .unwrap()
            .ends_with("abnormal-usage-detected"),
        "{problem}"
    );
    live.stop().await;
}

/// What `caller` of `plan` used of its minute on policy `standard`.
async fn minute_used(live: &Live, caller: &str, plan: &str) -> u64 {
    let usage = live.usage(caller).await;
    let minute = window(&usage_limits(&usage, "standard", plan), "minute").clone();
    minute["used"]
        .as_u64()
        .unwrap_or_else(|| panic!("no used count: {usage}"))
}

/// `allowed` of `n` checks of `body`, one after another.
async fn checks_allowed(live: &Live, body: Value, n: usize) -> Vec<bool> {
    let mut allowed = Vec::with_capacity(n);
    for _ in 0..n {
        allowed.push(live.check(body.clone()).await["allowed"] == true);
    }
    allowed
}

fn sha256_hex(text: &str) -> String {
    let out = Command::new(SLUICE)
        .args(["hash-key", text])
        .output()
        .expect("sluice hash-key runs");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}
