//! Cost after the response against a real streaming upstream started by the test:
//! chunked JSON and server-sent events with a final usage event, an answer without
//! usage, a header, a 100 MB body (streamed in bounded memory), and a client that goes
//! away mid-stream (still charged what the upstream reports at the end). The body
//! reaches the client unchanged; the difference is charged when it ends, possibly
//! into debt, refused with an exact Retry-After until paid back.

use crate::support;
use crate::support::redis_server;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Response;
use http_body_util::StreamBody;
use hyper::body::Frame;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use sluice::config::Config;
use support::{Live, Req, live};
use tokio::net::TcpListener;

/// `{"id":"x", ... "usage":{"total_tokens":N}}` in three pieces.
fn json_pieces(tokens: u64) -> Vec<String> {
    vec![
        r#"{"id":"cmpl-1","choices":[{"text":"hel"#.to_string(),
        format!(r#"lo"}}],"usage":{{"prompt_tokens":3,"total_tokens":{tokens}"#),
        "}}".to_string(),
    ]
}

/// An event stream whose last-but-one event carries the usage.
fn sse_pieces(tokens: u64) -> Vec<String> {
    vec![
        "event: delta\ndata: {\"delta\":\"Hel\"}\n\n".to_string(),
        "data: {\"delta\":\"lo\"}\n\n: keep-alive\n\n".to_string(),
        format!("data: {{\"delta\":\"\",\"usage\":{{\"total_tokens\":{tokens}}}}}\n\n"),
        "data: [DONE]\n\n".to_string(),
    ]
}

/// The test's upstream: `/json/N`, `/sse/N`, `/none`, `/header/N`, `/big/MB` and
/// `/slow-sse/N` (usage after a pause), each streamed in pieces 10 ms apart.
pub(super) async fn upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let service = service_fn(|request: http::Request<_>| async move {
                    let mut response = answer(request.uri().path());
                    // What the gateway asked for, for the test to see.
                    if let Some(asked) = request.headers().get("accept-encoding") {
                        let seen = response.headers_mut();
                        seen.insert("x-seen-accept-encoding", asked.clone());
                    }
                    Ok::<_, Infallible>(response)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

type Pieces = StreamBody<
    std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<Frame<Bytes>, Infallible>> + Send>>,
>;

fn answer(path: &str) -> Response<Pieces> {
    let mut parts = path.trim_start_matches('/').split('/');
    let what = parts.next().unwrap_or("");
    let n: u64 = parts.next().and_then(|n| n.parse().ok()).unwrap_or(0);
    let (content_type, pieces, pause) = match what {
        "json" | "fail" => ("application/json", owned(json_pieces(n)), 0),
        "sse" => ("text/event-stream", owned(sse_pieces(n)), 0),
        "slow-sse" => ("text/event-stream", owned(sse_pieces(n)), 400),
        "cased-sse" => ("Text/Event-Stream; charset=utf-8", owned(sse_pieces(n)), 0),
        "header" | "twice" => ("application/json", vec![Bytes::from_static(b"{}")], 0),
        // Not JSON's grammar: a leading zero.
        "octal" => (
            "application/json",
            vec![Bytes::from_static(br#"{"usage":{"total_tokens":042}}"#)],
            0,
        ),
        "big" => {
            // One megabyte shared by every piece: the upstream holds 1 MB, not N.
            let pad = Bytes::from("x".repeat(1 << 20));
            let mut pieces = vec![Bytes::from_static(br#"{"pad":""#)];
            pieces.extend((0..n).map(|_| pad.clone()));
            pieces.push(Bytes::from_static(br#"","usage":{"total_tokens":7}}"#));
            ("application/json", pieces, 0)
        }
        _ => (
            "application/json",
            vec![Bytes::from_static(br#"{"id":"no usage here"}"#)],
            0,
        ),
    };
    let last = pieces.len() - 1;
    let paced = n < 1_000 && what != "big";
    let frames = futures_util::stream::unfold(0usize, move |i| {
        let piece = pieces.get(i).cloned();
        async move {
            let piece = piece?;
            let gap = if i + 1 == last { pause.max(10) } else { 10 };
            if paced {
                tokio::time::sleep(Duration::from_millis(gap)).await;
            }
            Some((Ok(Frame::data(piece)), i + 1))
        }
    });
    let mut response = Response::new(StreamBody::new(Box::pin(frames) as _));
    if what == "fail" {
        *response.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
    }
    let headers = response.headers_mut();
    headers.insert("content-type", content_type.parse().unwrap());
    if what == "twice" {
        headers.append("x-tokens", "7".parse().unwrap());
    }
    if what == "header" || what == "twice" {
        headers.append("x-tokens", n.to_string().parse().unwrap());
    }
    response
}

fn owned(pieces: Vec<String>) -> Vec<Bytes> {
    pieces.into_iter().map(Bytes::from).collect()
}

pub(super) fn config(up: SocketAddr) -> String {
    format!(
        r#"
[upstreams.llm]
targets = ["http://{up}"]

[policies.tokens]
anonymous = {{ per_minute = 100 }}

[[routes]]
name = "header"
path_prefix = "/header"
upstream = "llm"
policy = "tokens"
cost_after = "header:x-tokens"

[[routes]]
name = "twice"
path_prefix = "/twice"
upstream = "llm"
policy = "tokens"
cost_after = "header:x-tokens"

[[routes]]
name = "chat"
path_prefix = "/"
upstream = "llm"
policy = "tokens"
cost_after = "json:usage.total_tokens"
default_cost = 5
refund_on = [503]
# Above the policy's largest limit (the default): one answer may take the caller
# into debt past its whole minute.
max_cost = 1_000
"#
    )
}

/// Units counted for `ip` once they settle at `expected` (the charge runs after the
/// body ended); panics after 5 s.
pub(super) async fn settles(gw: &Live, ip: &str, expected: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut used = 0;
    while Instant::now() < deadline {
        let usage = gw
            .admin(Req::get(&format!("/admin/usage?caller=ip:{ip}")))
            .await
            .json();
        used = usage["policies"][0]["limits"][0]["used"]
            .as_u64()
            .unwrap_or(0);
        if used == expected {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{ip}: {used} units counted, not {expected}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_answer_charges_its_usage_into_debt_with_an_exact_retry_after() {
    let gw = live(&config(upstream().await)).await;
    let resp = Req::get("/json/120").from("127.0.0.2").send(gw.addr).await;
    assert_eq!(resp.status, 200);
    assert_eq!(
        resp.text(),
        json_pieces(120).concat(),
        "the body is unchanged"
    );
    assert_eq!(
        resp.sf_param("ratelimit", "minute", "r"),
        Some(99),
        "1 at admission"
    );
    settles(&gw, "127.0.0.2", 120).await;

    // 120 of 100: in debt until the 120 leave the window, a minute after admission.
    let refused = Req::get("/json/1").from("127.0.0.2").send(gw.addr).await;
    refused.problem(429);
    assert_eq!(refused.retry_after(), 60);
    assert_eq!(refused.sf_param("ratelimit", "minute", "r"), Some(0));
    gw.advance_secs(59);
    let refused = Req::get("/json/1").from("127.0.0.2").send(gw.addr).await;
    assert_eq!(refused.retry_after(), 1);
    gw.advance_secs(1);
    let paid = Req::get("/json/1").from("127.0.0.2").send(gw.addr).await;
    assert_eq!(paid.status, 200, "{}", paid.text());

    let text = gw.admin(Req::get("/metrics")).await.text();
    let series = "sluice_cost_charged_total{policy=\"tokens\",route=\"chat\"}";
    assert_eq!(support::metric(&text, series), Some(119.0), "{text}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_streams_headers_and_unknown_answers_each_charge_what_they_said() {
    let gw = live(&config(upstream().await)).await;
    let sse = Req::get("/sse/80").from("127.0.0.3").send(gw.addr).await;
    assert_eq!(sse.text(), sse_pieces(80).concat());
    assert_eq!(sse.header("content-type"), Some("text/event-stream"));
    settles(&gw, "127.0.0.3", 80).await;

    // Media types are case-insensitive.
    let cased = Req::get("/cased-sse/40")
        .from("127.0.0.6")
        .send(gw.addr)
        .await;
    assert_eq!(cased.text(), sse_pieces(40).concat());
    settles(&gw, "127.0.0.6", 40).await;
    // A client cannot ask for an answer the meter could not read.
    let gzip = Req::get("/json/3")
        .from("127.0.0.7")
        .header("accept-encoding", "gzip, br")
        .send(gw.addr)
        .await;
    assert_eq!(gzip.header("x-seen-accept-encoding"), Some("identity"));
    settles(&gw, "127.0.0.7", 3).await;

    let header = Req::get("/header/30").from("127.0.0.4").send(gw.addr).await;
    assert_eq!(header.status, 200);
    settles(&gw, "127.0.0.4", 30).await;
    // Sent twice, the last copy counts (as a JSON body's last field does).
    let twice = Req::get("/twice/30").from("127.0.0.8").send(gw.addr).await;
    assert_eq!(twice.status, 200);
    assert_eq!(
        twice.headers.get_all("x-tokens").iter().count(),
        2,
        "both go to the client"
    );
    settles(&gw, "127.0.0.8", 30).await;

    // No usage in the answer, or a number JSON does not allow: default_cost,
    // counted as unknown.
    let none = Req::get("/none").from("127.0.0.5").send(gw.addr).await;
    assert_eq!(none.status, 200);
    settles(&gw, "127.0.0.5", 5).await;
    let octal = Req::get("/octal").from("127.0.0.10").send(gw.addr).await;
    assert_eq!(octal.status, 200);
    settles(&gw, "127.0.0.10", 5).await;
    let text = gw.admin(Req::get("/metrics")).await.text();
    let unknown = "sluice_cost_unknown_total{route=\"chat\"}";
    assert_eq!(support::metric(&text, unknown), Some(2.0), "{text}");

    // A refunded answer costs nothing, whatever usage it reports.
    let failed = Req::get("/fail/50").from("127.0.0.9").send(gw.addr).await;
    assert_eq!(failed.status, 503);
    assert_eq!(failed.sf_param("ratelimit", "minute", "r"), Some(100));
    let ok = Req::get("/json/2").from("127.0.0.9").send(gw.addr).await;
    assert_eq!(ok.status, 200);
    settles(&gw, "127.0.0.9", 2).await;
    gw.stop().await;
}

/// The peak resident set of this process (the gateway, the upstream and the
/// client all run in it), in bytes.
fn peak_memory() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb << 10
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_100_mb_answer_streams_through_in_bounded_memory_and_charges_its_usage() {
    use http_body_util::{BodyExt, Empty};
    let gw = live(&config(upstream().await)).await;
    let before = peak_memory();
    let stream = support::connect(gw.addr, Some("127.0.0.6".parse().unwrap())).await;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let request = http::Request::get("/big/100")
        .header("host", "gw")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let started = Instant::now();
    let mut body = sender.send_request(request).await.unwrap().into_body();
    // Read as it streams, keeping only a count and the last bytes.
    let (mut received, mut tail) = (0usize, Vec::new());
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            received += data.len();
            tail.extend_from_slice(&data[data.len().saturating_sub(64)..]);
            tail.drain(..tail.len().saturating_sub(64));
        }
    }
    let grown = peak_memory().saturating_sub(before);
    println!(
        "100 MB streamed in {:?}; peak resident set grew {} KiB",
        started.elapsed(),
        grown >> 10
    );
    assert_eq!(received, (100 << 20) + 37, "every byte arrives");
    assert!(tail.ends_with(br#"","usage":{"total_tokens":7}}"#));
    // A gateway that held the answer would grow by 100 MB; frames in flight are a
    // few megabytes at most.
    assert!(grown < 32 << 20, "peak resident set grew {grown} bytes");
    settles(&gw, "127.0.0.6", 7).await;
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_mid_stream_is_charged_what_the_upstream_reports() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let gw = live(&config(upstream().await)).await;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.7:0".parse().unwrap()).unwrap();
    let mut stream = socket.connect(gw.addr).await.unwrap();
    stream
        .write_all(b"GET /slow-sse/90 HTTP/1.1\r\nHost: gw\r\n\r\n")
        .await
        .unwrap();
    let mut first = [0u8; 256];
    let n = stream.read(&mut first).await.unwrap();
    assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"));
    // Gone before the usage event, which comes 400 ms later: sluice reads on.
    drop(stream);
    settles(&gw, "127.0.0.7", 90).await;
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_on_one_redis_charge_each_answer_exactly_once() {
    let redis = redis_server::RedisServer::start();
    let up = upstream().await;
    let store = format!("[store]\nbackend = \"redis\"\nurl = \"{}\"\n", redis.url());
    let toml = format!("{store}{}", config(up));
    let a = live(&toml).await;
    let b = live(&toml).await;
    // 40 + 30 + 25 tokens through two replicas, one caller.
    let first = Req::get("/json/40").from("127.0.0.8").send(a.addr).await;
    assert_eq!(first.status, 200);
    settles(&a, "127.0.0.8", 40).await;
    let second = Req::get("/sse/30").from("127.0.0.8").send(b.addr).await;
    assert_eq!(second.status, 200);
    settles(&a, "127.0.0.8", 70).await;
    let third = Req::get("/header/25").from("127.0.0.8").send(a.addr).await;
    assert_eq!(third.status, 200);
    settles(&b, "127.0.0.8", 95).await;
    // 5 left on either replica: a sixth-unit answer goes into debt there.
    let more = Req::get("/json/10").from("127.0.0.8").send(b.addr).await;
    assert_eq!(more.sf_param("ratelimit", "minute", "r"), Some(4));
    settles(&a, "127.0.0.8", 105).await;
    let refused = Req::get("/json/1").from("127.0.0.8").send(a.addr).await;
    refused.problem(429);
    assert_eq!(refused.sf_param("ratelimit", "minute", "r"), Some(0));
    a.stop().await;
    b.stop().await;
}

#[test]
fn cost_after_needs_an_upstream_and_a_known_source() {
    let errors = |text: &str| match Config::parse(Path::new("gateway.toml"), text) {
        Ok(_) => Vec::new(),
        Err(err) => err.errors().map(|d| d.to_string()).collect::<Vec<_>>(),
    };
    let respond = r#"
[policies.p]
anonymous = { per_minute = 10 }

[[routes]]
name = "demo"
path_prefix = "/demo"
respond = { status = 200 }
policy = "p"
cost_after = "json:usage.total_tokens"
"#;
    let found = errors(respond);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("routes[0].cost_after: needs an upstream"),
        "{found:?}"
    );
    let bad = config("127.0.0.1:1".parse().unwrap()).replace("json:usage.total_tokens", "body:x");
    let found = errors(&bad);
    assert!(
        found
            .iter()
            .any(|e| e.contains("expected \"header:NAME\" or \"json:PATH\"")),
        "{found:?}"
    );
}
