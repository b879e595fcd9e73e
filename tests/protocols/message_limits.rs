//! WebSocket message limits (a policy's `messages`): exact at the boundary on a
//! manual clock and shared by all of a caller's sockets; fragments, control frames
//! and frames that break a rule counted as DESIGN says, in raw frames against a
//! recording echo upstream; and the binary with the `websockets` package's client
//! and echo server on both sides.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio_tungstenite::tungstenite::Message;

use crate::grpc::{python, script};
use crate::sockets::{client_frame, connect, echo, masked_frame, raw_upgrade, until_closed};
use crate::support::{Live, Req, Toml, closed_port, live, metric, route, within};

/// A WebSocket route `chat` on `up` whose policy `p` has `policy`'s lines.
fn chat(up: &str, policy: &str, server: &str) -> String {
    Toml::new()
        .raw(&format!("[server]\ndrain_timeout = \"1s\"\n{server}"))
        .upstream("chat", &[up.to_string()])
        .raw(&format!("[policies.p]\n{policy}"))
        .route(
            route("chat", "/chat")
                .upstream("chat")
                .policy("p")
                .with("websocket = true"),
        )
        .build()
}

/// `sluice_ws_messages_total` of route `chat` for `outcome`.
async fn messages(gw: &Live, outcome: &str) -> Option<f64> {
    let metrics = gw.admin(Req::get("/metrics")).await.text();
    let series = format!("sluice_ws_messages_total{{outcome=\"{outcome}\",route=\"chat\"}}");
    metric(&metrics, &series)
}

/// Sends `text` and reads its echo.
async fn echoed(client: &mut crate::sockets::Client, text: &str) {
    client.send(Message::text(text)).await.unwrap();
    let echo = within("the echo", client.next()).await.unwrap().unwrap();
    assert_eq!(echo, Message::text(text));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sixth_message_in_a_second_closes_1008_and_a_second_later_five_more_pass() {
    let up = echo().await;
    let policy = "anonymous = { per_minute = 100 }\nregistered = { per_minute = 100 }\n\
                  messages = { per_second = 5 }";
    let consumer = "[[consumers]]\nname = \"acme\"\nkey = \"acme-key\"\n";
    let gw = live(&(chat(&up.url(), policy, "") + consumer)).await;
    let (mut first, _) = connect(gw.addr, "/chat", &[]).await.unwrap();
    let (mut second, _) = connect(gw.addr, "/chat", &[]).await.unwrap();
    // One budget over all the caller's sockets: 3 on one, 2 on the other.
    for text in ["a1", "a2", "a3"] {
        echoed(&mut first, text).await;
    }
    assert_eq!(
        messages(&gw, "forwarded").await,
        Some(3.0),
        "counted as they pass, not when the socket closes"
    );
    for text in ["b1", "b2"] {
        echoed(&mut second, text).await;
    }
    second.send(Message::text("b3")).await.unwrap();
    let (after, close) = until_closed(&mut second).await;
    assert!(after.is_empty(), "{after:?}");
    let (code, reason) = close.unwrap();
    assert_eq!(
        (code, reason.as_str()),
        (1008, "rate limited; retry after 1 s")
    );
    assert_eq!(
        up.closes(1).await,
        [Some(1001)],
        "the upstream side is told"
    );
    assert_eq!(up.received(), ["a1", "a2", "a3", "b1", "b2"]);
    assert_eq!(messages(&gw, "limited").await, Some(1.0));
    let line: Value = serde_json::from_str(&gw.access_log.wait_lines(1).await[0]).unwrap();
    let socket = &line["websocket"];
    assert_eq!(socket["messages_up"], 2, "{line}");
    assert_eq!(socket["messages_limited"], 1, "{line}");
    assert_eq!(socket["close_code"], 1008, "{line}");
    // The first socket is still open, and a second later it has five more.
    gw.advance_secs(1);
    for i in 0..5 {
        echoed(&mut first, &format!("c{i}")).await;
    }
    first.send(Message::text("c5")).await.unwrap();
    let (_, close) = until_closed(&mut first).await;
    assert_eq!(close.unwrap().0, 1008);
    assert_eq!(up.closes(2).await[1], Some(1001));
    assert_eq!(up.received().len(), 10);
    assert_eq!(messages(&gw, "forwarded").await, Some(10.0));
    assert_eq!(messages(&gw, "limited").await, Some(2.0));
    // Another caller has its own budget.
    let (mut other, _) = connect(gw.addr, "/chat", &[("x-api-key", "acme-key")])
        .await
        .unwrap();
    for i in 0..5 {
        echoed(&mut other, &format!("d{i}")).await;
    }
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fragmented_message_counts_once_and_control_frames_not_at_all() {
    let up = echo().await;
    let policy = "anonymous = { per_minute = 100 }\nmessages = { per_minute = 2 }";
    let gw = live(&chat(&up.url(), policy, "")).await;
    let mut socket = raw_upgrade(gw.addr, "/chat").await;
    let frames = [
        client_frame(0x89, b"ping"),
        client_frame(0x01, b"fra"),
        client_frame(0x89, b"ping inside"),
        client_frame(0x00, b"gme"),
        client_frame(0x8A, b"unasked pong"),
        client_frame(0x80, b"nted"),
        client_frame(0x89, b"ping"),
        client_frame(0x82, b"second"),
        client_frame(0x89, b"ping"),
    ]
    .concat();
    socket.stream.write_all(&frames).await.unwrap();
    within("both messages upstream", async {
        while up.received().len() < 2 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(up.received(), ["fragmented", "second"]);
    socket
        .stream
        .write_all(&client_frame(0x81, b"third"))
        .await
        .unwrap();
    let close = socket.close().await.unwrap();
    assert_eq!(close.0, 1008);
    assert!(
        close.1.starts_with("rate limited; retry after "),
        "{close:?}"
    );
    assert_eq!(up.closes(1).await, [Some(1001)]);
    assert_eq!(up.received(), ["fragmented", "second"]);
    let line: Value = serde_json::from_str(&gw.access_log.wait_lines(1).await[0]).unwrap();
    assert_eq!(line["websocket"]["messages_up"], 2, "{line}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_message_passes_no_byte_and_a_frame_that_breaks_a_rule_counts_nothing() {
    let up = echo().await;
    let policy = "anonymous = { per_minute = 100 }\nmessages = { per_minute = 3 }";
    let gw = live(&chat(&up.url(), policy, "max_body_bytes = 1000")).await;
    // A frame over max_body_bytes: 1009, and not counted.
    let mut socket = raw_upgrade(gw.addr, "/chat").await;
    let frames = [client_frame(0x81, b"one"), client_frame(0x82, &[7; 2000])].concat();
    socket.stream.write_all(&frames).await.unwrap();
    assert_eq!(socket.close_code().await, Some(1009));
    // An unmasked frame: 1002, and not counted.
    let mut socket = raw_upgrade(gw.addr, "/chat").await;
    let unmasked = masked_frame(0x81, b"unmasked", false);
    socket.stream.write_all(&unmasked).await.unwrap();
    assert_eq!(socket.close_code().await, Some(1002));
    assert_eq!(up.closes(2).await, [Some(1001), Some(1001)]);
    // So two more pass; the next is refused on its header, before any of its bytes
    // (here, the first 10 of 900) go on: the upstream reads a whole close frame.
    let mut socket = raw_upgrade(gw.addr, "/chat").await;
    let frames = [client_frame(0x81, b"two"), client_frame(0x81, b"three")].concat();
    socket.stream.write_all(&frames).await.unwrap();
    let over = client_frame(0x82, &[9; 900]);
    socket
        .stream
        .write_all(&over[..2 + 2 + 4 + 10])
        .await
        .unwrap();
    assert_eq!(socket.close_code().await, Some(1008));
    assert_eq!(up.closes(3).await[2], Some(1001));
    assert_eq!(up.received(), ["one", "two", "three"]);
    gw.stop().await;
}

#[test]
fn message_limits_take_no_billing_period_and_no_unknown_window() {
    let parse = |policy: &str| {
        let toml = chat("http://127.0.0.1:9", policy, "");
        let path = std::path::Path::new("gateway.toml");
        sluice::config::Config::parse(path, &toml)
            .unwrap_err()
            .to_string()
    };
    let period = parse("anonymous = { per_minute = 10 }\nmessages = { per_month = 5 }");
    assert!(period.contains("policies.p.messages"), "{period}");
    assert!(period.contains("per_month and per_year"), "{period}");
    let unknown = parse("anonymous = { per_minute = 10 }\nmessages = { per_week = 5 }");
    assert!(unknown.contains("per_week"), "{unknown}");
    let zero = parse("anonymous = { per_minute = 10 }\nmessages = { per_second = 0 }");
    assert!(zero.contains("policies.p.messages.per_second"), "{zero}");
}

// ---- the binary, with the websockets package on both sides -------------------------

/// The echo server of `ws_echo.py`, serving until dropped.
struct PyEcho {
    child: Child,
    port: u16,
    /// One JSON line per socket that ended.
    sockets: Arc<Mutex<Vec<Value>>>,
}

impl PyEcho {
    fn start() -> PyEcho {
        let mut child = python()
            .arg(script("ws_echo.py"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3 runs");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = lines.next().and_then(Result::ok).unwrap_or_default();
        let port = (first.strip_prefix("listening ").and_then(|p| p.parse().ok()))
            .unwrap_or_else(|| {
                panic!("ws_echo.py did not start (is websockets installed? scripts/test installs it): {first:?}")
            });
        let sockets = Arc::new(Mutex::new(Vec::new()));
        let seen = sockets.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                seen.lock()
                    .unwrap()
                    .push(serde_json::from_str(&line).unwrap());
            }
        });
        PyEcho {
            child,
            port,
            sockets,
        }
    }

    /// Waits until `n` sockets have ended; returns their lines.
    async fn sockets(&self, n: usize) -> Vec<Value> {
        within("the echo server's sockets to end", async {
            loop {
                let sockets = self.sockets.lock().unwrap().clone();
                if sockets.len() >= n {
                    return sockets;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
    }
}

impl Drop for PyEcho {
    fn drop(&mut self) {
        drop(self.child.stdin.take().map(|mut stdin| stdin.flush()));
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `ws_client.py`: one socket to `url`, `count` messages; its JSON result.
async fn py_client(url: &str, count: usize) -> Value {
    let mut command = tokio::process::Command::from(python());
    command
        .arg(script("ws_client.py"))
        .arg(url)
        .arg(count.to_string())
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let output = within("ws_client.py", command.output()).await.unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "ws_client.py failed: {}\n{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(&stdout).unwrap()
}

/// Through the binary (`sluice run`, the system clock): the websockets package's
/// client sends 7 messages where 5 a minute are allowed, through sluice to the
/// package's echo server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_limits_the_messages_of_a_websockets_client() {
    let up = PyEcho::start();
    let (port, admin) = (closed_port(), closed_port());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    let policy = "anonymous = { per_minute = 100 }\nmessages = { per_minute = 5 }";
    let listen = format!("listen = \"127.0.0.1:{port}\"");
    let toml = chat(&format!("http://127.0.0.1:{}", up.port), policy, &listen)
        + &format!("\n[admin]\nlisten = \"127.0.0.1:{admin}\"\n");
    std::fs::write(&path, toml).unwrap();
    let mut sluice = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
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
    let url = format!("ws://{addr}/chat");
    let first = py_client(&url, 7).await;
    let second = py_client(&url, 1).await;
    let metrics = Req::get("/metrics")
        .send(([127, 0, 0, 1], admin).into())
        .await
        .text();
    let ended = up.sockets(2).await;
    let _ = sluice.kill();
    let _ = sluice.wait();
    assert_eq!(
        first["echoed"],
        serde_json::json!(["m0", "m1", "m2", "m3", "m4"]),
        "{first}"
    );
    assert_eq!(first["close_code"], 1008, "{first}");
    let reason = first["close_reason"].as_str().unwrap();
    let secs: u64 = (reason.strip_prefix("rate limited; retry after "))
        .and_then(|rest| rest.strip_suffix(" s"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{reason}"));
    assert!((1..=60).contains(&secs), "{reason}");
    // The budget is the caller's, over its sockets: the next socket's first message
    // is refused too.
    assert_eq!(second["echoed"], serde_json::json!([]), "{second}");
    assert_eq!(second["close_code"], 1008, "{second}");
    let upstream: Vec<_> = ended
        .iter()
        .map(|s| (&s["messages"], &s["close_code"]))
        .collect();
    let five = serde_json::json!(["m0", "m1", "m2", "m3", "m4"]);
    let none = serde_json::json!([]);
    assert_eq!(
        upstream,
        [(&five, &Value::from(1001)), (&none, &Value::from(1001))]
    );
    let series =
        |outcome| format!("sluice_ws_messages_total{{outcome=\"{outcome}\",route=\"chat\"}}");
    assert_eq!(
        metric(&metrics, &series("forwarded")),
        Some(5.0),
        "{metrics}"
    );
    assert_eq!(metric(&metrics, &series("limited")), Some(2.0), "{metrics}");
}
