//! WebSockets over HTTP/2 (extended CONNECT, RFC 8441), in raw HTTP/2 frames (h2's
//! client) against the recording echo upstream: the setting advertised, the CONNECT
//! admitted like any request and sent upstream as an HTTP/1.1 upgrade, frames both
//! ways on the stream, the message limit, the drain's 1001, and the CONNECTs sluice
//! refuses.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use h2::RecvStream;
use h2::client::SendRequest;
use http::Method;
use serde_json::Value;

use crate::sockets::{client_frame, echo, raw_upgrade, scripted};
use crate::support::{Req, Toml, live, raw, route, upstream, within};

/// A WebSocket route `/chat` to `up` and a plain route `/` to `plain`, with policy
/// `p` on the first.
fn config(up: &str, plain: &str, policy: &str) -> String {
    Toml::new()
        .raw("[server]\ndrain_timeout = \"1s\"\n")
        .upstream("chat", &[up.to_string()])
        .upstream("plain", &[plain.to_string()])
        .raw(&format!("[policies.p]\n{policy}"))
        .route(
            route("chat", "/chat")
                .upstream("chat")
                .policy("p")
                .with("websocket = true"),
        )
        .route(route("plain", "/").upstream("plain"))
        .build()
}

/// Only the plain route `/` to `plain`.
fn plain_only(plain: &str) -> String {
    Toml::new()
        .raw("[server]\ndrain_timeout = \"1s\"\n")
        .upstream("plain", &[plain.to_string()])
        .route(route("plain", "/").upstream("plain"))
        .build()
}

/// An HTTP/2 connection to `addr` (prior knowledge), its settings received (a
/// PING answered: the server's SETTINGS came before its PONG).
async fn h2(addr: SocketAddr) -> SendRequest<Bytes> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (client, mut connection) = h2::client::handshake(tcp).await.unwrap();
    let mut ping = connection.ping_pong().unwrap();
    tokio::spawn(connection);
    within("a PONG", ping.ping(h2::Ping::opaque()))
        .await
        .unwrap();
    within("ready", client.ready()).await.unwrap()
}

/// A CONNECT to `path` with `protocol` (none: a plain CONNECT to an authority).
fn connect_request(path: &str, protocol: Option<&str>) -> http::Request<()> {
    let mut request = http::Request::builder()
        .method(Method::CONNECT)
        .header("sec-websocket-version", "13");
    request = match protocol {
        Some(protocol) => request
            .uri(format!("http://gw.test{path}"))
            .extension(h2::ext::Protocol::from(protocol)),
        None => request.uri("gw.test:443"),
    };
    request.body(()).unwrap()
}

/// Reads the stream until `n` bytes came (or it ended): what came.
async fn read(body: &mut RecvStream, n: usize) -> Vec<u8> {
    within("frames on the stream", async {
        let mut got = Vec::new();
        while got.len() < n {
            match body.data().await {
                Some(Ok(data)) => {
                    let _ = body.flow_control().release_capacity(data.len());
                    got.extend_from_slice(&data);
                }
                _ => break,
            }
        }
        got
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extended_connect_opens_a_websocket_upstream_as_an_http1_upgrade() {
    let up = echo().await;
    let plain = upstream().await;
    let policy = "anonymous = { per_minute = 10 }\nmessages = { per_minute = 2 }";
    let gw = live(&config(&up.url(), &plain.url(), policy)).await;
    let mut client = h2(gw.addr).await;
    assert!(client.is_extended_connect_protocol_enabled());
    let (response, mut stream) = client
        .send_request(connect_request("/chat/room", Some("websocket")), false)
        .unwrap();
    let response = within("the CONNECT's answer", response).await.unwrap();
    assert_eq!(response.status(), 200);
    let headers = response.headers();
    assert!(!headers.contains_key("sec-websocket-accept"), "{headers:?}");
    let ratelimit = headers.get("ratelimit").unwrap().to_str().unwrap();
    assert!(
        ratelimit.contains("r=9"),
        "the CONNECT is counted: {ratelimit}"
    );
    let mut body = response.into_body();
    // Two messages: one whole, one in two fragments with a ping between.
    let frames = [
        client_frame(0x81, b"hello"),
        client_frame(0x02, b"wor"),
        client_frame(0x89, b"p"),
        client_frame(0x80, b"ld"),
    ]
    .concat();
    stream.send_data(frames.into(), false).unwrap();
    // The echoes (unmasked), and the upstream's pong between them, in some order.
    let got = read(&mut body, 7 + 3 + 7).await;
    assert!(got.windows(7).any(|w| w == b"\x81\x05hello"), "{got:?}");
    assert!(got.windows(7).any(|w| w == b"\x82\x05world"), "{got:?}");
    // What the upstream was sent: an HTTP/1.1 upgrade with a key sluice made.
    let handshake = up.record.lock().unwrap().handshakes[0].clone();
    assert_eq!(handshake["upgrade"], "websocket");
    assert_eq!(handshake["sec-websocket-version"], "13");
    assert_eq!(handshake["sec-websocket-key"].len(), 24);
    assert_eq!(up.received(), ["hello", "world"]);
    // A third message is over the limit: a close frame on the stream, 1001 upstream.
    stream
        .send_data(client_frame(0x81, b"third").into(), false)
        .unwrap();
    let close = read(&mut body, 4).await;
    assert_eq!(
        (close[0], &close[2..4]),
        (0x88, &[0x03, 0xf0][..]),
        "{close:?}"
    );
    assert_eq!(up.closes(1).await, [Some(1001)]);
    assert_eq!(up.received(), ["hello", "world"]);
    let lines = gw.access_log.wait_lines(1).await;
    let line: Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(line["status"], 200, "{line}");
    assert_eq!(line["path"], "/chat/room", "{line}");
    assert_eq!(line["websocket"]["messages_up"], 2, "{line}");
    assert_eq!(line["websocket"]["messages_limited"], 1, "{line}");
    assert_eq!(line["websocket"]["close_code"], 1008, "{line}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connects_that_are_not_a_websocket_on_a_websocket_route_are_refused() {
    let up = echo().await;
    let plain = upstream().await;
    let policy = "anonymous = { per_minute = 10 }";
    let gw = live(&config(&up.url(), &plain.url(), policy)).await;
    let cases = [
        (
            "/chat",
            Some("connect-udp"),
            "a protocol other than websocket",
        ),
        // A plain CONNECT names an authority, no path: refused before any route.
        ("", None, "path must start with '/'"),
        (
            "/other",
            Some("websocket"),
            "a route without websocket = true",
        ),
    ];
    for (path, protocol, detail) in cases {
        let mut client = h2(gw.addr).await;
        let (response, _stream) = client
            .send_request(connect_request(path, protocol), false)
            .unwrap();
        let response = within("the CONNECT's answer", response).await.unwrap();
        assert_eq!(response.status(), 400, "{path} {protocol:?}");
        let body = read(&mut response.into_body(), usize::MAX).await;
        let body = String::from_utf8_lossy(&body);
        assert!(body.contains(detail), "{path} {protocol:?}: {body}");
    }
    assert_eq!(up.handshakes(), 0);
    assert!(plain.seen().is_empty(), "{:?}", plain.seen());
    // The refusals counted nothing: ten upgrades a minute are all left.
    let mut client = h2(gw.addr).await;
    let (response, _stream) = client
        .send_request(connect_request("/chat", Some("websocket")), false)
        .unwrap();
    let response = within("the CONNECT's answer", response).await.unwrap();
    let ratelimit = response.headers().get("ratelimit").unwrap();
    assert!(ratelimit.to_str().unwrap().contains("r=9"), "{ratelimit:?}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extended_connect_is_advertised_once_a_reload_adds_a_websocket_route() {
    let up = echo().await;
    let plain = upstream().await;
    let gw = live(&plain_only(&plain.url())).await;
    let before = h2(gw.addr).await;
    assert!(!before.is_extended_connect_protocol_enabled());
    let policy = "anonymous = { per_minute = 10 }";
    std::fs::write(&gw.path, config(&up.url(), &plain.url(), policy)).unwrap();
    let reload = gw.admin(Req::post("/admin/reload", "")).await;
    assert_eq!(reload.status, 200, "{}", reload.text());
    // A connection opened since advertises it, and a socket opens on it.
    let mut client = h2(gw.addr).await;
    assert!(client.is_extended_connect_protocol_enabled());
    let (response, mut stream) = client
        .send_request(connect_request("/chat", Some("websocket")), false)
        .unwrap();
    let response = within("the CONNECT's answer", response).await.unwrap();
    assert_eq!(response.status(), 200);
    stream
        .send_data(client_frame(0x81, b"after").into(), false)
        .unwrap();
    assert_eq!(read(&mut response.into_body(), 7).await, b"\x81\x05after");
    assert_eq!(up.handshakes(), 1);
    // An HTTP/2 setting cannot be taken back (RFC 8441, 3): a reload that removes
    // the last WebSocket route stops advertising it to new connections only.
    std::fs::write(&gw.path, plain_only(&plain.url())).unwrap();
    let reload = gw.admin(Req::post("/admin/reload", "")).await;
    assert_eq!(reload.status, 200, "{}", reload.text());
    assert!(!h2(gw.addr).await.is_extended_connect_protocol_enabled());
    drop(before);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_the_gateway_closes_an_http2_socket_1001_after_the_drain() {
    let up = echo().await;
    let plain = upstream().await;
    let gw = live(&config(
        &up.url(),
        &plain.url(),
        "anonymous = { per_minute = 10 }",
    ))
    .await;
    let mut client = h2(gw.addr).await;
    let (response, mut stream) = client
        .send_request(connect_request("/chat", Some("websocket")), false)
        .unwrap();
    let response = within("the CONNECT's answer", response).await.unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    stream
        .send_data(client_frame(0x81, b"before").into(), false)
        .unwrap();
    assert_eq!(read(&mut body, 8).await, b"\x81\x06before");
    let stopping = tokio::spawn(gw.stop());
    let close = read(&mut body, 4).await;
    assert_eq!(
        (close[0], &close[2..4]),
        (0x88, &[0x03, 0xe9][..]),
        "{close:?}"
    );
    assert_eq!(up.closes(1).await, [Some(1001)]);
    within("the stop", stopping).await.unwrap();
}

/// A `101` with a `Sec-WebSocket-Accept` that answers only the RFC's sample key.
const SAMPLE_101: &[u8] = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\
    Connection: Upgrade\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switch_whose_accept_does_not_answer_the_key_is_a_502_on_both_versions() {
    let (addr, heads) = scripted(SAMPLE_101).await;
    let plain = upstream().await;
    let policy = "anonymous = { per_minute = 10 }";
    let gw = live(&config(&format!("http://{addr}"), &plain.url(), policy)).await;
    // Over HTTP/2 the key is sluice's own: only sluice can check the answer.
    let mut client = h2(gw.addr).await;
    let (response, _stream) = client
        .send_request(connect_request("/chat", Some("websocket")), false)
        .unwrap();
    let response = within("the CONNECT's answer", response).await.unwrap();
    assert_eq!(response.status(), 502);
    // Over HTTP/1.1 the client's key (not the RFC's sample, which the upstream
    // answers) gets the same answer, not a 101 its client would have to refuse.
    let upgrade = "GET /chat HTTP/1.1\r\nHost: gw.test\r\nConnection: Upgrade\r\n\
                   Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
                   Sec-WebSocket-Key: AAAAAAAAAAAAAAAAAAAAAA==\r\n\r\n";
    let resp = raw(gw.addr, upgrade.as_bytes()).await;
    assert_eq!(resp.status, 502, "{}", resp.text());
    assert_eq!(heads.load(Ordering::SeqCst), 2, "both reached the upstream");
    // The sample key, which the upstream's accept does answer, opens.
    drop(raw_upgrade(gw.addr, "/chat").await);
    gw.stop().await;
}
