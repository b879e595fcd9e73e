//! gRPC through sluice, with grpcio's client and server (Python, started by the
//! tests): every kind of call passes frame by frame with its trailers, a refused call
//! is a gRPC status the client reads (RESOURCE_EXHAUSTED with the exact retry time),
//! a call for an HTTP/1.1 upstream is refused as UNAVAILABLE naming the fix.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use crate::support::{Req, live, metric, within};

/// The greeter (`greeter.py`), serving on an ephemeral loopback port until dropped.
pub(crate) struct Greeter {
    child: Child,
    pub port: u16,
    /// The lines it printed after "listening": one per call, with its metadata.
    calls: Arc<Mutex<Vec<String>>>,
}

/// The Python the tests run grpcio and websockets with; `scripts/test` installs
/// both for it.
pub(crate) fn python() -> Command {
    let mut command = Command::new("python3");
    command.env("PYTHONUNBUFFERED", "1");
    command
}

pub(crate) fn script(name: &str) -> String {
    format!("{}/tests/protocols/{name}", env!("CARGO_MANIFEST_DIR"))
}

impl Greeter {
    pub(crate) fn start() -> Greeter {
        let mut child = python()
            .arg(script("greeter.py"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3 runs");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = lines.next().and_then(Result::ok).unwrap_or_default();
        let port = first
            .strip_prefix("listening ")
            .and_then(|port| port.parse().ok())
            .unwrap_or_else(|| {
                panic!("greeter.py did not start (is grpcio installed? scripts/test installs it): {first:?}")
            });
        let calls = Arc::new(Mutex::new(Vec::new()));
        let seen = calls.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                seen.lock().unwrap().push(line);
            }
        });
        Greeter { child, port, calls }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The calls it received so far ("call METHOD key=value ...").
    pub(crate) fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
}

impl Drop for Greeter {
    fn drop(&mut self) {
        drop(self.child.stdin.take().map(|mut stdin| stdin.flush()));
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Makes `calls` (see `grpc_call.py`) to `addr` with grpcio; one JSON result each.
pub(crate) async fn grpc_calls(addr: SocketAddr, calls: &[&str]) -> Vec<Value> {
    let mut command = tokio::process::Command::from(python());
    command
        .arg(script("grpc_call.py"))
        .arg(addr.to_string())
        .args(calls)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let output = within("grpc_call.py", command.output()).await.unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "grpc_call.py failed: {}\n{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// A gateway config: `[upstreams.greeter]` at `url` with `protocol`, and `routes`.
fn config(url: &str, protocol: &str, routes: &str) -> String {
    format!(
        r#"
[upstreams.greeter]
targets = ["{url}"]
protocol = "{protocol}"

[policies.hello]
anonymous = {{ per_minute = 2 }}

{routes}
"#
    )
}

const ROUTES: &str = r#"
[[routes]]
name = "hello"
path_prefix = "/greet.Greeter/SayHello"
upstream = "greeter"
policy = "hello"

[[routes]]
name = "greeter"
path_prefix = "/greet.Greeter/"
upstream = "greeter"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_call_passes_with_its_messages_and_trailers() {
    let greeter = Greeter::start();
    let gateway = live(&config(&greeter.url(), "h2", ROUTES)).await;
    let results = grpc_calls(
        gateway.addr,
        &[
            "unary:SayHello:bob",
            "server:Count:4",
            "client:Sum:ab,cde,f",
            "bidi:Chat:one,two,three",
        ],
    )
    .await;
    let codes: Vec<_> = results
        .iter()
        .map(|r| r["code"].as_str().unwrap())
        .collect();
    assert_eq!(codes, ["OK"; 4], "{results:#?}");
    assert_eq!(results[0]["messages"], serde_json::json!(["hello bob"]));
    assert_eq!(
        results[0]["trailing"]["x-tokens"], "7",
        "the upstream's trailer reaches the client"
    );
    assert_eq!(results[0]["initial"]["ratelimit"], "\"minute\";r=1;t=60");
    assert_eq!(
        results[1]["messages"],
        serde_json::json!(["0", "1", "2", "3"])
    );
    assert_eq!(results[2]["messages"], serde_json::json!(["6"]));
    assert_eq!(
        results[3]["messages"],
        serde_json::json!(["ONE", "TWO", "THREE"])
    );
    let calls = greeter.calls();
    assert_eq!(calls.len(), 4, "{calls:?}");
    assert!(
        calls.iter().all(|call| call.contains("x-request-id=")),
        "the request id goes upstream: {calls:?}"
    );
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limited_call_is_resource_exhausted_with_the_exact_retry_time() {
    let greeter = Greeter::start();
    let gateway = live(&config(&greeter.url(), "h2", ROUTES)).await;
    let results = grpc_calls(gateway.addr, &["unary:SayHello:a", "unary:SayHello:b"]).await;
    assert!(results.iter().all(|r| r["code"] == "OK"), "{results:#?}");
    gateway.advance_secs(15);
    let refused = &grpc_calls(gateway.addr, &["unary:SayHello:c"]).await[0];
    assert_eq!(refused["code"], "RESOURCE_EXHAUSTED", "{refused:#?}");
    assert_eq!(
        refused["details"],
        "per_minute limit of 2 for plan anonymous on route hello"
    );
    let trailing = &refused["trailing"];
    assert_eq!(trailing["retry-after"], "45", "{trailing:#?}");
    assert_eq!(trailing["grpc-retry-pushback-ms"], "45000");
    assert_eq!(trailing["ratelimit"], "\"minute\";r=0;t=45");
    assert_eq!(trailing["ratelimit-policy"], "\"minute\";q=2;w=60");
    assert_eq!(
        greeter.calls().len(),
        2,
        "the refused call never reached it"
    );

    let lines = gateway.access_log.wait_lines(3).await;
    let refused_line: Value = serde_json::from_str(&lines[2]).unwrap();
    assert_eq!(refused_line["outcome"], "limited");
    assert_eq!(
        refused_line["status"], 200,
        "the HTTP status the client got"
    );
    assert_eq!(refused_line["grpc_status"], 8);
    let ok_line: Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(
        ok_line["grpc_status"], 0,
        "read from the upstream's trailers"
    );

    let metrics = gateway.admin(Req::get("/metrics")).await.text();
    let count = |code: &str| {
        let series = format!("sluice_grpc_responses_total{{code=\"{code}\",route=\"hello\"}}");
        metric(&metrics, &series)
    };
    assert_eq!(count("OK"), Some(2.0), "{metrics}");
    assert_eq!(count("RESOURCE_EXHAUSTED"), Some(1.0));
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_for_an_http1_upstream_is_unavailable_and_names_the_fix() {
    let greeter = Greeter::start();
    let gateway = live(&config(&greeter.url(), "http1", ROUTES)).await;
    let refused = &grpc_calls(gateway.addr, &["unary:SayHello:a"]).await[0];
    assert_eq!(refused["code"], "UNAVAILABLE", "{refused:#?}");
    assert_eq!(
        refused["details"],
        "upstream greeter speaks HTTP/1.1; a gRPC call needs protocol = \"h2\" in [upstreams.greeter]"
    );
    assert!(greeter.calls().is_empty(), "nothing was sent as HTTP/1.1");
    let lines = gateway.access_log.wait_lines(1).await;
    let line: Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(line["outcome"], "upstream_error");
    assert_eq!(line["grpc_status"], 14);
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_route_and_an_unreachable_upstream_are_grpc_statuses() {
    let dead = crate::support::closed_port();
    let toml = config(
        &format!("http://127.0.0.1:{dead}"),
        "h2",
        r#"
[[routes]]
name = "greeter"
path_prefix = "/greet.Greeter/"
upstream = "greeter"
"#,
    );
    let gateway = live(&toml).await;
    let results = grpc_calls(gateway.addr, &["unary:SayHello:a"]).await;
    assert_eq!(results[0]["code"], "UNAVAILABLE", "{results:#?}");
    assert_eq!(
        results[0]["details"],
        "upstream greeter could not be reached"
    );
    gateway.stop().await;

    let toml = config("http://127.0.0.1:1", "h2", "");
    let gateway = live(&toml).await;
    let results = grpc_calls(gateway.addr, &["unary:SayHello:a"]).await;
    assert_eq!(results[0]["code"], "UNIMPLEMENTED", "{results:#?}");
    assert_eq!(results[0]["details"], "no route matches this request");
    gateway.stop().await;
}

/// Through the binary: `sluice run` with an h2 upstream, calls of every kind, and
/// the limit's refusal as grpcio's client reads it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_carries_grpc_calls() {
    let greeter = Greeter::start();
    let port = crate::support::closed_port();
    let admin = crate::support::closed_port();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:{port}\"\n[admin]\nlisten = \"127.0.0.1:{admin}\"\n{}",
        config(&greeter.url(), "h2", ROUTES)
    );
    std::fs::write(&path, toml).unwrap();
    let mut sluice = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["run", "-c", path.to_str().unwrap()])
        .env_remove("SLUICE_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("sluice runs");
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    within("sluice listening", async {
        while tokio::net::TcpStream::connect(addr).await.is_err() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let results = grpc_calls(
        addr,
        &[
            "unary:SayHello:x",
            "server:Count:2",
            "client:Sum:a,b",
            "bidi:Chat:a,b",
            "unary:SayHello:y",
            "unary:SayHello:z",
        ],
    )
    .await;
    let codes: Vec<_> = results
        .iter()
        .map(|r| r["code"].as_str().unwrap())
        .collect();
    let _ = sluice.kill();
    let _ = sluice.wait();
    assert_eq!(
        codes,
        ["OK", "OK", "OK", "OK", "OK", "RESOURCE_EXHAUSTED"],
        "{results:#?}"
    );
    assert_eq!(results[1]["messages"], serde_json::json!(["0", "1"]));
    assert_eq!(results[3]["messages"], serde_json::json!(["A", "B"]));
    let trailing = &results[5]["trailing"];
    let retry_after: u64 = trailing["retry-after"].as_str().unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry_after), "{trailing:#?}");
    assert_eq!(
        trailing["grpc-retry-pushback-ms"],
        (retry_after * 1000).to_string()
    );
}
