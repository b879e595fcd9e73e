//! The access log and request ids, as an operator reads them: one line per request
//! with the fields the design lists, no secrets, the same id upstream, in the
//! response and in the log, and a stdout that stops reading never slows a request.

use crate::support;
use crate::support::redis_server;

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use serde_json::Value;
use support::{Live, Req, SharedLog, live, live_logging_to, upstream, within, within_for};

use support::ACME_SHA256;

fn config(upstream_url: &str, log: &str) -> String {
    format!(
        r#"
{log}

[upstreams.api]
targets = ["{upstream_url}"]

[policies.standard]
anonymous = {{ per_minute = 1 }}
registered = {{ per_minute = 100 }}

[[consumers]]
name = "acme"
key_sha256 = "{ACME_SHA256}"

[[routes]]
name = "api"
path_prefix = "/api"
upstream = "api"
policy = "standard"
"#
    )
}

fn json(line: &str) -> Value {
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
}

async fn lines(live: &Live, n: usize) -> Vec<String> {
    let lines = live.access_log.wait_lines(n).await;
    assert_eq!(lines.len(), n, "{lines:#?}");
    lines
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_is_one_json_line_with_the_designed_fields_and_no_secrets() {
    let up = upstream().await;
    let live = live(&config(&up.url(), "")).await;

    let registered = Req::get("/api//items/./7?token=s3cret-query")
        .header("x-api-key", "demo-key-acme")
        .header("x-request-id", "3f2b8c1e-9a4d-4e2f-8b7a-1c2d3e4f5a6b")
        .send(live.addr)
        .await;
    assert_eq!(registered.status, 200);
    let bearer = Req::get("/api/other")
        .header("authorization", "Bearer demo-key-acme")
        .send(live.addr)
        .await;
    assert_eq!(bearer.status, 200);
    let anonymous = live.get("/api/a").await;
    assert_eq!(anonymous.status, 200);
    let limited = live.get("/api/b?secret=q").await;
    assert_eq!(limited.status, 429);
    let nowhere = live.get("/elsewhere").await;
    assert_eq!(nowhere.status, 404);

    let lines = lines(&live, 5).await;
    for line in &lines {
        for secret in [
            "demo-key-acme",
            "s3cret-query",
            "secret=q",
            "Bearer",
            "token=",
        ] {
            assert!(!line.contains(secret), "{secret} logged: {line}");
        }
    }
    let first = json(&lines[0]);
    assert_eq!(first["request_id"], "3f2b8c1e-9a4d-4e2f-8b7a-1c2d3e4f5a6b");
    assert_eq!(first["client"], "127.0.0.1");
    assert_eq!(first["consumer"], "acme");
    assert_eq!(first["plan"], "registered");
    assert_eq!(first["route"], "api");
    assert_eq!(first["method"], "GET");
    assert_eq!(first["path"], "/api/items/7", "normalised, no query");
    assert_eq!(first["status"], 200);
    assert_eq!(first["outcome"], "allowed");
    assert_eq!(first["violated"], serde_json::json!([]));
    assert_eq!(first["upstream"], up.url().trim_start_matches("http://"));
    assert_eq!(first["upstream_status"], 200);
    assert_eq!(first["bytes"], registered.body.len() as u64);
    assert!(first["duration_ms"].as_f64().unwrap() > 0.0);
    let upstream_ms = first["upstream_ms"].as_f64().unwrap();
    assert!(upstream_ms > 0.0 && upstream_ms <= first["duration_ms"].as_f64().unwrap());
    let time = first["time"].as_str().unwrap();
    assert!(
        time.parse::<jiff::Timestamp>().is_ok() && time.ends_with('Z'),
        "{time}"
    );

    assert_eq!(json(&lines[1])["consumer"], "acme", "Bearer key identified");
    let anon = json(&lines[2]);
    assert_eq!(anon["consumer"], "anonymous");
    assert_eq!(anon["plan"], "anonymous");
    let refused = json(&lines[3]);
    assert_eq!(refused["status"], 429);
    assert_eq!(refused["outcome"], "limited");
    assert_eq!(refused["violated"], serde_json::json!(["minute"]));
    assert_eq!(refused["upstream"], Value::Null);
    assert_eq!(refused["upstream_status"], Value::Null);
    assert_eq!(refused["bytes"], limited.body.len() as u64);
    let unrouted = json(&lines[4]);
    assert_eq!(unrouted["route"], "none");
    assert_eq!(unrouted["outcome"], "no_route");
    assert_eq!(up.count(), 3, "only the admitted requests went upstream");
    live.stop().await;
}

/// Route names are free text: one that needs JSON escapes is escaped in every
/// line (names are copied unlooked-at only when the config has none such).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_name_that_needs_escapes_is_escaped_in_its_json_line() {
    let up = upstream().await;
    let named =
        config(&up.url(), "").replace(r#"name = "api""#, r#"name = "api \"v2\" \\ \t tab""#);
    let live = live(&named).await;
    assert_eq!(live.get("/api/a").await.status, 200);
    assert_eq!(live.get("/api/b").await.status, 429);
    let lines = lines(&live, 2).await;
    for line in &lines {
        assert!(!line.contains('\t'), "a raw tab in {line}");
        let line = json(line);
        assert_eq!(line["route"], "api \"v2\" \\ \t tab");
        assert_eq!(line["plan"], "anonymous");
    }
    assert_eq!(json(&lines[0])["status"], 200);
    assert_eq!(json(&lines[1])["status"], 429);
    live.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_id_is_kept_or_made_and_is_the_same_upstream_in_the_response_and_in_the_log() {
    let up = upstream().await;
    // Every refusal a line, in order: two 429s of one caller follow each other.
    let live = live(&config(&up.url(), "[log]\nrefused = \"all\"")).await;

    // Kept: a well-formed id from a proxy in front.
    let kept = Req::get("/api/1")
        .header("x-request-id", "01HQ3Z5V2K8M9N0P1Q2R3S4T5V")
        .send(live.addr)
        .await;
    assert_eq!(
        kept.header("x-request-id"),
        Some("01HQ3Z5V2K8M9N0P1Q2R3S4T5V")
    );
    assert_eq!(
        up.last().header("x-request-id"),
        Some("01HQ3Z5V2K8M9N0P1Q2R3S4T5V")
    );

    // A client naming the id header in `Connection` does not strip it from the
    // upstream's copy: the id is set after the hop-by-hop headers are removed.
    let named = Req::get("/api/1")
        .header("x-api-key", "demo-key-acme")
        .header("connection", "x-request-id")
        .header("x-request-id", "hop-by-hop-named-id")
        .send(live.addr)
        .await;
    assert_eq!(named.header("x-request-id"), Some("hop-by-hop-named-id"));
    assert_eq!(
        up.last().header("x-request-id"),
        Some("hop-by-hop-named-id")
    );

    // Replaced: ids a log or an upstream must not be handed.
    let long = "a".repeat(129);
    let mut made = Vec::new();
    for bad in ["two words", "quote\"d", "semi;colon", "", long.as_str()] {
        let resp = Req::get("/api/2")
            .header("x-api-key", "demo-key-acme")
            .header("x-request-id", bad)
            .send(live.addr)
            .await;
        let id = resp.header("x-request-id").expect("an id").to_string();
        assert_ne!(id, bad);
        assert_eq!(id.len(), 32, "{id}");
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
        assert_eq!(up.last().header("x-request-id"), Some(id.as_str()));
        let copies = up.last().headers.get_all("x-request-id").iter().count();
        assert_eq!(copies, 1, "exactly one id upstream");
        made.push(id);
    }
    made.sort();
    made.dedup();
    assert_eq!(made.len(), 5, "every generated id differs");

    // None sent: one is made. Refusals carry one too.
    let fresh = live.get("/api/3").await;
    assert_eq!(fresh.header("x-request-id").map(str::len), Some(32));
    let limited = live.get("/api/4").await;
    assert_eq!(limited.status, 429);
    let refused_id = limited.header("x-request-id").expect("a 429 has an id");
    let not_found = live.get("/nope").await;
    assert!(not_found.header("x-request-id").is_some());
    let bad_path = Req::get("/api/x;jsessionid=1").send(live.addr).await;
    assert_eq!(bad_path.status, 400);
    assert!(bad_path.header("x-request-id").is_some());

    let lines = lines(&live, 11).await;
    assert_eq!(json(&lines[0])["request_id"], "01HQ3Z5V2K8M9N0P1Q2R3S4T5V");
    assert_eq!(json(&lines[1])["request_id"], "hop-by-hop-named-id");
    for (i, id) in made.iter().enumerate() {
        assert!(
            lines[2..7]
                .iter()
                .any(|l| json(l)["request_id"] == id.as_str()),
            "generated id {i} logged"
        );
    }
    assert_eq!(json(&lines[8])["request_id"], refused_id);
    live.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_request_id_header_text_format_and_off() {
    let up = upstream().await;
    let text = config(
        &up.url(),
        "[log]\naccess = \"text\"\nrequest_id_header = \"X-Correlation-ID\"",
    );
    let live = live(&text).await;
    let resp = Req::get("/api/t?q=1")
        .header("x-correlation-id", "corr-42")
        .header("x-api-key", "demo-key-acme")
        .send(live.addr)
        .await;
    assert_eq!(resp.header("x-correlation-id"), Some("corr-42"));
    assert_eq!(up.last().header("x-correlation-id"), Some("corr-42"));
    assert!(resp.header("x-request-id").is_none());
    let line = &lines(&live, 1).await[0];
    let port = up.url().rsplit(':').next().unwrap().to_string();
    for field in [
        " 127.0.0.1 \"GET /api/t\" 200 ",
        " id=corr-42 consumer=acme plan=registered route=api outcome=allowed violated=- ",
        &format!(" upstream=127.0.0.1:{port} upstream_status=200 upstream_ms="),
    ] {
        assert!(line.contains(field), "{field:?} not in {line}");
    }
    assert!(!line.contains("q=1"), "{line}");

    // Off: nothing is written, ids still flow.
    std::fs::write(&live.path, config(&up.url(), "[log]\naccess = \"off\"")).unwrap();
    let reloaded = live.admin(Req::post("/admin/reload", "")).await;
    assert_eq!(reloaded.status, 200, "{}", reloaded.text());
    let quiet = live.get("/api/off").await;
    assert_eq!(quiet.header("x-request-id").map(str::len), Some(32));
    // Back on: lines are written in order, so once the next request's line is
    // there, a line of the request made while off would be there too.
    std::fs::write(&live.path, text).unwrap();
    let reloaded = live.admin(Req::post("/admin/reload", "")).await;
    assert_eq!(reloaded.status, 200, "{}", reloaded.text());
    live.get("/api/on").await;
    let lines = lines(&live, 2).await;
    assert!(lines[1].contains("\"GET /api/on\""), "{}", lines[1]);
    assert_eq!(lines.len(), 2, "off writes nothing: {lines:?}");
    live.stop().await;
}

/// A stdout that blocks every write until released, like a pipe nobody reads.
#[derive(Clone, Default)]
struct Stuck {
    released: Arc<(Mutex<bool>, Condvar)>,
    out: SharedLog,
}

impl Stuck {
    fn release(&self) {
        *self.released.0.lock().unwrap() = true;
        self.released.1.notify_all();
    }
}

impl std::io::Write for Stuck {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let (lock, freed) = &*self.released;
        let mut released = lock.lock().unwrap();
        while !*released {
            released = freed.wait(released).unwrap();
        }
        self.out.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_stdout_never_delays_requests_and_dropped_lines_are_counted() {
    let stuck = Stuck::default();
    let toml = r#"
[[routes]]
name = "ping"
path_prefix = "/ping"
respond = { status = 200, body = "pong" }
"#;
    let live = live_logging_to(toml, Box::new(stuck.clone())).await;
    // More requests than the log's queue holds (8 192), over keep-alive connections.
    const CLIENTS: usize = 8;
    const EACH: usize = 1_200;
    let uri: http::Uri = format!("http://{}/ping", live.addr).parse().unwrap();
    // Were a request to wait for the stuck log, they would never all be answered.
    within_for(
        "9 600 requests with stdout blocked",
        Duration::from_secs(120),
        async {
            let mut tasks = Vec::new();
            for _ in 0..CLIENTS {
                let uri = uri.clone();
                tasks.push(tokio::spawn(async move {
                    let client = hyper_util::client::legacy::Client::builder(
                        hyper_util::rt::TokioExecutor::new(),
                    )
                    .build_http::<http_body_util::Empty<bytes::Bytes>>();
                    for _ in 0..EACH {
                        let resp = client.get(uri.clone()).await.expect("served");
                        assert_eq!(resp.status(), 200);
                        http_body_util::BodyExt::collect(resp.into_body())
                            .await
                            .unwrap();
                    }
                }));
            }
            for task in tasks {
                task.await.unwrap();
            }
        },
    )
    .await;
    let total = CLIENTS * EACH;
    let dropped = live_dropped(&live).await;
    assert!(
        dropped > 0 && dropped <= total - 8_192,
        "dropped {dropped} of {total}"
    );
    // Released, the writer catches up: every request is a line or a dropped count.
    stuck.release();
    let written = stuck.out.wait_lines(total - dropped).await.len();
    assert_eq!(written + dropped, total);
    live.stop().await;
}

async fn live_dropped(live: &Live) -> usize {
    let text = live.admin(Req::get("/metrics")).await.text();
    support::metric(&text, "sluice_access_log_dropped_total").expect("the counter") as usize
}

/// A 502 or 504 names the target that failed, as nginx's `$upstream_addr` does, so
/// an operator can tell which replica of an upstream is down or slow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_502_or_504_line_names_the_target_that_failed() {
    // Nothing listens on `dead`; `mute` accepts and never answers.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mute = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mute_addr = mute.local_addr().unwrap();
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = mute.accept().await {
            held.push(stream);
        }
    });
    let config = format!(
        r#"
[upstreams.dead]
targets = ["http://{dead}"]
[upstreams.mute]
targets = ["http://{mute_addr}"]
timeout = "300ms"
[[routes]]
name = "dead"
path_prefix = "/dead"
upstream = "dead"
[[routes]]
name = "mute"
path_prefix = "/mute"
upstream = "mute"
"#
    );
    let live = live(&config).await;
    assert_eq!(live.get("/dead").await.status, 502);
    assert_eq!(live.get("/mute").await.status, 504);
    let lines = lines(&live, 2).await;
    let (bad, slow) = (json(&lines[0]), json(&lines[1]));
    assert_eq!(bad["status"], 502);
    assert_eq!(bad["outcome"], "upstream_error");
    assert_eq!(bad["upstream"], dead.to_string());
    assert_eq!(bad["upstream_status"], Value::Null);
    assert_eq!(slow["status"], 504);
    assert_eq!(slow["upstream"], mute_addr.to_string());
    assert_eq!(slow["upstream_status"], Value::Null);
    live.stop().await;
    silent.abort();
}

/// A client that goes away before its answer still gets its line, with nginx's 499:
/// one line per request, whoever ends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_before_its_answer_is_logged_as_499() {
    use tokio::io::AsyncWriteExt;
    let up = support::upstream_with(support::UpstreamOptions {
        delay: std::time::Duration::from_millis(800),
        ..Default::default()
    })
    .await;
    let live = live(&config(&up.url(), "")).await;
    let mut client = support::connect(live.addr, None).await;
    client
        .write_all(b"GET /api/slow?q=1 HTTP/1.1\r\nHost: a\r\nX-API-Key: demo-key-acme\r\n\r\n")
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    drop(client);
    let lines = within("the 499 line", lines(&live, 1)).await;
    let gone = json(&lines[0]);
    assert_eq!(gone["status"], 499, "{gone}");
    assert_eq!(gone["outcome"], "client_closed");
    assert_eq!(gone["consumer"], "acme");
    assert_eq!(gone["route"], "api");
    assert_eq!(gone["path"], "/api/slow");
    assert_eq!(gone["upstream_status"], Value::Null);
    let took = gone["duration_ms"].as_f64().unwrap();
    assert!((150.0..800.0).contains(&took), "{took}");
    live.stop().await;
}

/// A client that goes away after the upstream answered, while its refund is still
/// being settled with a Redis that stopped answering, is logged as a 499 that names
/// the upstream and what it answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_after_the_upstream_answered_is_logged_with_the_upstream_status() {
    use tokio::io::AsyncWriteExt;
    let mut redis = redis_server::RedisServer::start();
    let up = support::upstream_with(support::UpstreamOptions {
        delay: std::time::Duration::from_millis(400),
        status: 500,
        ..Default::default()
    })
    .await;
    let store = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout = \"3s\"\n",
        redis.url()
    );
    let config = config(&up.url(), &store).replace(
        "policy = \"standard\"",
        "policy = \"standard\"\nrefund_on = [500]",
    );
    let live = live(&config).await;
    let mut client = support::connect(live.addr, None).await;
    client
        .write_all(b"GET /api/refunded HTTP/1.1\r\nHost: a\r\nX-API-Key: demo-key-acme\r\n\r\n")
        .await
        .unwrap();
    // Admitted by Redis (the request reached the upstream, which answers 400 ms
    // later), then Redis stops: the refund after the upstream's 500 waits for it,
    // and the client leaves while it does. The pause after it covers the upstream's
    // delay: nothing shows when its answer is in.
    within("the request reaches the upstream", async {
        while up.count() == 0 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await;
    redis.pause();
    tokio::time::sleep(std::time::Duration::from_millis(650)).await;
    assert_eq!(up.targets(), ["/api/refunded"], "the upstream was asked");
    drop(client);
    let lines = within("the 499 line", lines(&live, 1)).await;
    redis.resume();
    let gone = json(&lines[0]);
    assert_eq!(gone["status"], 499, "{gone}");
    assert_eq!(gone["outcome"], "client_closed");
    assert_eq!(gone["upstream_status"], 500, "{gone}");
    assert_eq!(
        gone["upstream"],
        up.url().trim_start_matches("http://"),
        "{gone}"
    );
    assert!(gone["upstream_ms"].as_f64().unwrap() >= 350.0, "{gone}");
    live.stop().await;
}

/// Lines that are refusals, and the refusals they stand for (each line itself and its
/// `repeated`), once the writer has let the last held one out.
async fn refusal_lines(live: &Live, refusals: u64) -> (Vec<Value>, u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let lines: Vec<Value> = (live.access_log.lines().iter())
            .map(|l| json(l))
            .filter(|l| l["status"] == 429)
            .collect();
        let repeated: u64 = lines.iter().filter_map(|l| l["repeated"].as_u64()).sum();
        if lines.len() as u64 + repeated >= refusals || std::time::Instant::now() > deadline {
            return (lines, repeated);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn suppressed(live: &Live) -> f64 {
    let text = live.admin(Req::get("/metrics")).await.text();
    support::metric(&text, "sluice_access_log_suppressed_total").expect("the counter")
}

/// A caller hammering past its limit writes a line a second, not one a refusal: the
/// refusals left out are counted in the next line's `repeated` (the last ones in a
/// line written once the caller has been quiet for a second) and in
/// `sluice_access_log_suppressed_total`; admitted requests are each logged, and
/// another caller's refusals are its own key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_flood_is_a_line_a_second_with_the_rest_counted_in_repeated() {
    let up = upstream().await;
    let live = live(&config(&up.url(), "")).await;
    const FLOOD: u64 = 300;
    assert_eq!(live.get("/api/first").await.status, 200);
    for i in 0..FLOOD {
        assert_eq!(live.get("/api/flood").await.status, 429);
        if i % 15 == 0 {
            let admitted = Req::get("/api/admitted")
                .header("x-api-key", "demo-key-acme")
                .send(live.addr)
                .await;
            assert_eq!(admitted.status, 200);
        }
    }
    // Another anonymous caller (its own address) over the same limit.
    let other = |path: &'static str| Req::get(path).from("127.0.0.7").send(live.addr);
    assert_eq!(other("/api/o").await.status, 200);
    assert_eq!(other("/api/o").await.status, 429);

    let (lines, repeated) = refusal_lines(&live, FLOOD + 1).await;
    let flood: Vec<_> = (lines.iter())
        .filter(|l| l["client"] == "127.0.0.1")
        .collect();
    let flood_repeated: u64 = flood.iter().filter_map(|l| l["repeated"].as_u64()).sum();
    assert_eq!(
        flood.len() as u64 + flood_repeated,
        FLOOD,
        "every refusal is a line or in one line's repeated: {flood:#?}"
    );
    assert!(flood_repeated > 0 && flood.len() < 30, "{flood:#?}");
    let theirs: Vec<_> = (lines.iter())
        .filter(|l| l["client"] == "127.0.0.7")
        .collect();
    assert_eq!(
        theirs.len(),
        1,
        "another caller's first refusal is its own line"
    );
    assert_eq!(theirs[0]["outcome"], "limited");
    assert_eq!(suppressed(&live).await, repeated as f64);

    let all = live.access_log.lines();
    let admitted = all
        .iter()
        .filter(|l| json(l)["path"] == "/api/admitted")
        .count();
    assert_eq!(
        admitted as u64,
        FLOOD / 15,
        "every admitted request is a line"
    );
    live.stop().await;
}

/// `[log] refused = "all"` writes a line for every refusal, as before the summary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_all_logs_every_refusal() {
    let up = upstream().await;
    let live = live(&config(&up.url(), "[log]\nrefused = \"all\"")).await;
    assert_eq!(live.get("/api/first").await.status, 200);
    for _ in 0..50 {
        assert_eq!(live.get("/api/flood").await.status, 429);
    }
    let (lines, repeated) = refusal_lines(&live, 50).await;
    assert_eq!((lines.len(), repeated), (50, 0));
    assert_eq!(suppressed(&live).await, 0.0);
    live.stop().await;
}

#[test]
fn an_unknown_refused_mode_is_a_config_error_naming_the_key() {
    let text = config("http://127.0.0.1:9", "[log]\nrefused = \"some\"");
    let path = std::path::Path::new("gateway.toml");
    let err = sluice::config::Config::parse(path, &text)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("log.refused") && err.contains("\"summary\" or \"all\""),
        "{err}"
    );
}
