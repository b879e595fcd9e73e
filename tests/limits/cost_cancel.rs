//! A client that leaves before the response head pays what the upstream reports:
//! raw HTTP/1.1 sockets closed with RST or FIN, and raw HTTP/2 frames resetting their
//! stream (RST_STREAM), each once the recording upstream has the request and before
//! its answer, on a `cost_after` route (and, over HTTP/2, after the head, before the
//! event that carries the usage). The answer is read on without the client:
//! its usage is charged, an answer without usage costs `default_cost`, an upstream
//! failure is refunded (`refund_on`); a client that stalls its own body is a 408 and
//! pays.

use crate::support;

use std::net::IpAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use support::{Live, Req, Toml, Upstream, UpstreamOptions, live, route, upstream_with};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The upstream's answer: 60 tokens.
const USAGE: &str = r#"{"id":"cmpl-1","usage":{"prompt_tokens":9,"total_tokens":60}}"#;

/// An upstream answering `status` with `body` after `delay_ms`, recording requests.
async fn recording(status: u16, body: &str, delay_ms: u64) -> Upstream {
    upstream_with(UpstreamOptions {
        status,
        body: Some(Bytes::from(body.to_string())),
        delay: Duration::from_millis(delay_ms),
        ..Default::default()
    })
    .await
}

/// The upstreams behind the gateway: usage after 300 ms, an answer without usage,
/// a 503, and one slower than its upstream's 500 ms `timeout`.
struct Upstreams {
    tokens: Upstream,
    silent: Upstream,
    failing: Upstream,
    slow: Upstream,
}

async fn upstreams() -> Upstreams {
    Upstreams {
        tokens: recording(200, USAGE, 300).await,
        silent: recording(200, r#"{"id":"no usage"}"#, 300).await,
        failing: recording(503, USAGE, 300).await,
        slow: recording(200, USAGE, 2_000).await,
    }
}

/// One metered route per upstream, on one policy: `cost_after` the usage,
/// `default_cost = 7`, refunds for the upstream's 502, 503 and 504.
fn config(up: &Upstreams, extra: &str) -> String {
    let metered = |name: &str, path: &str| {
        route(name, path)
            .upstream(name)
            .policy("tokens")
            .with(r#"cost_after = "json:usage.total_tokens""#)
            .with("default_cost = 7")
            .with("refund_on = [502, 503, 504]")
    };
    Toml::new()
        .raw(extra)
        .raw(&format!(
            "[upstreams.tokens]\ntargets = [\"{}\"]\ntimeout = \"1s\"",
            up.tokens.url()
        ))
        .upstream("silent", &[up.silent.url()])
        .upstream("failing", &[up.failing.url()])
        .raw(&format!(
            "[upstreams.slow]\ntargets = [\"{}\"]\ntimeout = \"500ms\"",
            up.slow.url()
        ))
        .policy("tokens", &[("anonymous", "{ per_minute = 1_000 }")])
        .route(metered("tokens", "/chat"))
        .route(metered("silent", "/silent"))
        .route(metered("failing", "/failing"))
        .route(metered("slow", "/slow"))
        .build()
}

/// Units `ip` has used this minute, by the admin API.
async fn used(gw: &Live, ip: &str) -> u64 {
    let usage = gw
        .admin(Req::get(&format!("/admin/usage?caller=ip:{ip}")))
        .await
        .json();
    usage["policies"][0]["limits"][0]["used"]
        .as_u64()
        .unwrap_or(0)
}

/// Waits (up to 5 s) for `ip`'s usage to settle at `expected`; then checks that it
/// stays there for another 300 ms (nothing more is charged or refunded later).
async fn settles(gw: &Live, ip: &str, expected: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut seen = used(gw, ip).await;
    while seen != expected && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        seen = used(gw, ip).await;
    }
    assert_eq!(seen, expected, "{ip}: {seen} units used, not {expected}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(used(gw, ip).await, expected, "{ip}: the usage moved again");
}

/// Waits until `upstream` has received `n` requests (the request is on its way).
async fn reached(upstream: &Upstream, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while upstream.count() < n {
        assert!(
            Instant::now() < deadline,
            "the upstream never got request {n}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// How an HTTP/1.1 client goes away.
#[derive(Clone, Copy, Debug)]
enum Leave {
    /// SO_LINGER 0, then close: the peer gets RST.
    Reset,
    /// An orderly close: FIN.
    Fin,
}

/// Sends `GET path` from `ip` on a raw HTTP/1.1 socket and leaves as `leave` says
/// once `upstream` has the request, before its answer.
async fn h1_leaves(gw: &Live, ip: &str, path: &str, upstream: &Upstream, leave: Leave) {
    let before = upstream.count();
    let mut stream = support::connect(gw.addr, Some(ip.parse().unwrap())).await;
    let request = format!("GET {path} HTTP/1.1\r\nHost: gw\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    reached(upstream, before + 1).await;
    match leave {
        Leave::Reset => socket2::SockRef::from(&stream)
            .set_linger(Some(Duration::ZERO))
            .unwrap(),
        Leave::Fin => stream.shutdown().await.unwrap(),
    }
    drop(stream);
}

/// One HTTP/2 frame.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// The client preface, an empty SETTINGS, and HEADERS (END_STREAM, END_HEADERS) of
/// `GET path` on stream 1: HPACK static entries and literals without indexing.
fn h2_get(path: &str) -> Vec<u8> {
    let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    bytes.extend(frame(0x4, 0, 0, &[]));
    let mut block = vec![0x82, 0x86, 0x04, path.len() as u8];
    block.extend_from_slice(path.as_bytes());
    block.extend_from_slice(&[0x01, 0x02, b'g', b'w']);
    bytes.extend(frame(0x1, 0x5, 1, &block));
    bytes
}

/// Opens stream 1 of a raw HTTP/2 connection from `ip` with `GET path`, and resets
/// it (RST_STREAM, CANCEL) once `upstream` has the request; the connection stays
/// open, and is handed back.
async fn h2_resets(gw: &Live, ip: &str, path: &str, upstream: &Upstream) -> TcpStream {
    let before = upstream.count();
    let mut stream = support::connect(gw.addr, Some(ip.parse().unwrap())).await;
    stream.write_all(&h2_get(path)).await.unwrap();
    reached(upstream, before + 1).await;
    stream
        .write_all(&frame(0x3, 0, 1, &8u32.to_be_bytes()))
        .await
        .unwrap();
    stream
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_before_the_head_pays_what_the_upstream_reports() {
    let up = upstreams().await;
    let gw = live(&config(&up, "")).await;

    // HTTP/1.1, RST and FIN: the usage, 60, not the admission's 1.
    h1_leaves(&gw, "127.0.1.1", "/chat", &up.tokens, Leave::Reset).await;
    settles(&gw, "127.0.1.1", 60).await;
    h1_leaves(&gw, "127.0.1.2", "/chat", &up.tokens, Leave::Fin).await;
    settles(&gw, "127.0.1.2", 60).await;
    // HTTP/2: the stream reset, the connection kept.
    let conn = h2_resets(&gw, "127.0.1.3", "/chat", &up.tokens).await;
    settles(&gw, "127.0.1.3", 60).await;
    drop(conn);

    // An answer that does not say: default_cost, counted as unknown.
    h1_leaves(&gw, "127.0.1.4", "/silent", &up.silent, Leave::Reset).await;
    settles(&gw, "127.0.1.4", 7).await;
    let conn = h2_resets(&gw, "127.0.1.5", "/silent", &up.silent).await;
    settles(&gw, "127.0.1.5", 7).await;
    drop(conn);

    // The upstream's failures are refunded, whether it says so (503) or does not
    // answer within its timeout (504).
    h1_leaves(&gw, "127.0.1.6", "/failing", &up.failing, Leave::Reset).await;
    settles(&gw, "127.0.1.6", 0).await;
    h1_leaves(&gw, "127.0.1.7", "/slow", &up.slow, Leave::Fin).await;
    settles(&gw, "127.0.1.7", 0).await;

    let text = gw.admin(Req::get("/metrics")).await.text();
    let unknown = "sluice_cost_unknown_total{route=\"silent\"}";
    assert_eq!(support::metric(&text, unknown), Some(2.0), "{text}");
    let refunds = "sluice_refunds_total{reason=\"status\",route=\"failing\"}";
    assert_eq!(support::metric(&text, refunds), Some(1.0), "{text}");
    let charged = "sluice_cost_charged_total{policy=\"tokens\",route=\"tokens\"}";
    assert_eq!(support::metric(&text, charged), Some(3.0 * 59.0), "{text}");
    // Every request reached its upstream exactly once.
    let counts = [&up.tokens, &up.silent, &up.failing, &up.slow].map(Upstream::count);
    assert_eq!(counts, [3, 2, 1, 1]);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stalls_its_body_gets_408_and_pays() {
    let up = upstreams().await;
    let gw = live(&config(&up, "[server]\nbody_timeout = \"30s\"")).await;
    // Ten of the hundred bytes announced, then nothing: the upstream (which reads
    // the whole body before answering) waits, and its 1 s timeout passes first.
    let ip: IpAddr = "127.0.1.20".parse().unwrap();
    let mut stream = support::connect(gw.addr, Some(ip)).await;
    let head = "POST /chat HTTP/1.1\r\nHost: gw\r\nContent-Length: 100\r\n\r\n0123456789";
    stream.write_all(head.as_bytes()).await.unwrap();
    let started = Instant::now();
    let response = support::within("the stalled request's answer", async {
        support::read_response(&mut stream).await.unwrap()
    })
    .await;
    let waited = started.elapsed();
    let problem = response.problem(408);
    // The upstream's 1 s timeout, not the 30 s body_timeout (`within` gives up long
    // before that): never sooner than the timeout, however fast the machine.
    assert!(
        waited >= Duration::from_millis(900),
        "answered after {waited:?}"
    );
    assert_eq!(problem["status"], 408);
    // Charged: the stall is the client's, whatever refund_on says of 504.
    settles(&gw, "127.0.1.20", 1).await;
    let seen = up.tokens.seen();
    assert!(
        seen.iter().all(|s| s.body.len() < 100),
        "the upstream never had the whole request"
    );

    // A body that arrives in full is the upstream's to answer: a 504 from an
    // upstream that is too slow is still refunded.
    let slow = Req::post("/slow", "x".repeat(100))
        .from("127.0.1.21")
        .send(gw.addr)
        .await;
    slow.problem(504);
    assert_eq!(slow.sf_param("ratelimit", "minute", "r"), Some(1_000));
    settles(&gw, "127.0.1.21", 0).await;
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstream_sees_each_abandoned_request_once_and_the_connection_comes_back() {
    let up = upstreams().await;
    let gw = live(&config(&up, "")).await;
    for i in 0..3 {
        h1_leaves(&gw, "127.0.1.40", "/chat", &up.tokens, Leave::Reset).await;
        settles(&gw, "127.0.1.40", 60 * (i + 1)).await;
    }
    // Read to its end off the request's path, each answer's connection went back
    // to the pool: three requests, one connection.
    assert_eq!(up.tokens.connections(), 1);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_on_one_redis_charge_each_abandoned_answer_once() {
    let redis = crate::support::redis_server::RedisServer::start();
    let up = upstreams().await;
    let store = format!("[store]\nbackend = \"redis\"\nurl = \"{}\"", redis.url());
    let a = live(&config(&up, &store)).await;
    let b = live(&config(&up, &store)).await;
    // One caller, a reset on each replica: 60 + 60, seen alike from both.
    h1_leaves(&a, "127.0.1.50", "/chat", &up.tokens, Leave::Reset).await;
    settles(&b, "127.0.1.50", 60).await;
    let conn = h2_resets(&b, "127.0.1.50", "/chat", &up.tokens).await;
    settles(&a, "127.0.1.50", 120).await;
    drop(conn);
    h1_leaves(&b, "127.0.1.50", "/failing", &up.failing, Leave::Fin).await;
    settles(&a, "127.0.1.50", 120).await;
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_stream_reset_after_the_head_is_charged_what_the_upstream_reports() {
    let up = super::cost_after::upstream().await;
    let gw = live(&super::cost_after::config(up)).await;
    let mut stream = support::connect(gw.addr, Some("127.0.1.60".parse().unwrap())).await;
    // The usage event comes 400 ms after the others.
    stream.write_all(&h2_get("/slow-sse/90")).await.unwrap();
    let (mut buf, mut chunk, mut head) = (Vec::new(), [0u8; 4096], false);
    support::within("the answer's HEADERS", async {
        while !head {
            let n = stream.read(&mut chunk).await.unwrap();
            assert!(n > 0, "the gateway closed the connection");
            buf.extend_from_slice(&chunk[..n]);
            while buf.len() >= 9 {
                let len =
                    usize::from(buf[0]) << 16 | usize::from(buf[1]) << 8 | usize::from(buf[2]);
                if buf.len() < 9 + len {
                    break;
                }
                head |= buf[3] == 0x1 && buf[5..9] == 1u32.to_be_bytes();
                buf.drain(..9 + len);
            }
        }
    })
    .await;
    stream
        .write_all(&frame(0x3, 0, 1, &8u32.to_be_bytes()))
        .await
        .unwrap();
    super::cost_after::settles(&gw, "127.0.1.60", 90).await;
    drop(stream);
    gw.stop().await;
}
