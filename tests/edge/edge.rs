//! The front door against hostile bytes: request framing, `Host`, methods, identity
//! headers, path spellings upstreams read differently, size limits, and responses
//! from upstreams that break the rules. Each case sends the exact bytes on a raw
//! socket and checks what the client got and what a recording upstream received.

use crate::support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use support::{Req, Toml, Upstream, connect, gateway, read_until_closed, route, upstream, within};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use support::ACME_SHA256;

/// `POST /orders` limited on `tight.example`-free routing, a catch-all to the same
/// upstream, and a route that opts in to path parameters.
fn config(up: &Upstream, server: &str) -> String {
    Toml::new()
        .raw(&format!("[server]\n{server}"))
        .upstream("up", &[up.url()])
        .policy(
            "tight",
            &[
                ("anonymous", "{ per_minute = 100 }"),
                ("registered", "{ per_minute = 100 }"),
            ],
        )
        .consumer("acme", ACME_SHA256)
        .route(
            route("orders", "/orders")
                .methods(&["POST"])
                .upstream("up")
                .policy("tight"),
        )
        .route(
            route("matrix", "/matrix")
                .upstream("up")
                .with("path_parameters = true"),
        )
        .route(route("all", "/").upstream("up"))
        .build()
}

/// Sends `bytes` on a fresh connection and reads until the gateway closes it.
async fn probe(addr: SocketAddr, bytes: &[u8]) -> String {
    let mut stream = connect(addr, None).await;
    stream.write_all(bytes).await.unwrap();
    let received = read_until_closed(&mut stream, Duration::from_secs(5)).await;
    String::from_utf8_lossy(&received).into_owned()
}

/// How many responses `answer` holds (status lines).
fn answers(answer: &str) -> usize {
    answer
        .lines()
        .filter(|line| line.starts_with("HTTP/1."))
        .count()
}

/// The answer is one 400 problem (`status`), `Connection: close`, and the connection
/// was closed (`probe` returned).
#[track_caller]
fn assert_refused(answer: &str, status: u16, what: &str) {
    assert!(
        answer.starts_with(&format!("HTTP/1.1 {status} ")),
        "{what}: {answer}"
    );
    assert_eq!(answers(answer), 1, "{what}: one answer only: {answer}");
    assert!(
        answer.contains("application/problem+json"),
        "{what}: {answer}"
    );
    assert!(
        answer.to_ascii_lowercase().contains("connection: close"),
        "{what}: {answer}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ambiguous_framing_is_refused_and_nothing_reaches_the_upstream() {
    let up = upstream().await;
    let gw = gateway(&config(&up, "")).await;
    let smuggled = "GET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n";
    let cases: Vec<(&str, String)> = vec![
        (
            "Transfer-Encoding: chunked, chunked",
            format!("POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n{smuggled}"),
        ),
        (
            "Transfer-Encoding: gzip, chunked",
            "POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n".into(),
        ),
        (
            "two Transfer-Encoding lines",
            "POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n".into(),
        ),
        (
            "two Host headers",
            "GET /x HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\n\r\n".into(),
        ),
        ("HTTP/1.1 without Host", "GET /x HTTP/1.1\r\n\r\n".into()),
        (
            "Host no host name can hold",
            "GET /x HTTP/1.1\r\nHost: tight.example%2e\r\n\r\n".into(),
        ),
        ("Host with a space", "GET /x HTTP/1.1\r\nHost: a b\r\n\r\n".into()),
        ("Host with userinfo", "GET /x HTTP/1.1\r\nHost: u@a\r\n\r\n".into()),
        (
            "Host with a port that is not a number",
            "GET /x HTTP/1.1\r\nHost: tight.example:abc\r\n\r\n".into(),
        ),
        (
            "an absolute-form target with userinfo",
            "GET http://x@tight.example/x HTTP/1.1\r\nHost: tight.example\r\n\r\n".into(),
        ),
        (
            "a lower-case POST",
            "post /orders HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n".into(),
        ),
        ("a mixed-case GET", "gEt /x HTTP/1.1\r\nHost: a\r\n\r\n".into()),
        (
            "two API key headers",
            "GET /x HTTP/1.1\r\nHost: a\r\nX-API-Key: demo-key-acme\r\nX-API-Key: other\r\n\r\n".into(),
        ),
        (
            "two Authorization headers",
            "GET /x HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer demo-key-acme\r\nAuthorization: Bearer other\r\n\r\n".into(),
        ),
    ];
    for (what, bytes) in &cases {
        let answer = probe(gw.addr, bytes.as_bytes()).await;
        assert_refused(&answer, 400, what);
    }
    assert_eq!(up.seen().len(), 0, "{:?}", up.targets());
    gw.stop().await;
}

/// Heads hyper's parser accepts without a trace: Content-Length with
/// Transfer-Encoding (hyper drops the length), and lines ended by LF alone. sluice
/// watches the bytes for them and refuses the request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_lengths_and_bare_lf_heads_are_refused_on_any_request_of_a_connection() {
    let up = upstream().await;
    let gw = gateway(&config(&up, "")).await;
    let smuggled = "GET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n";
    let heads = [
        (
            "Content-Length then Transfer-Encoding",
            format!(
                "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n{smuggled}"
            ),
        ),
        (
            "Transfer-Encoding then Content-Length",
            format!(
                "POST /x HTTP/1.1\r\nHost: a\r\ntransfer-encoding: chunked\r\nCONTENT-LENGTH: 5\r\n\r\n0\r\n\r\n{smuggled}"
            ),
        ),
        (
            "an unparsable Content-Length after Transfer-Encoding",
            format!(
                "POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: x\r\n\r\n0\r\n\r\n{smuggled}"
            ),
        ),
        (
            "the request line ended by LF",
            "GET /x HTTP/1.1\nHost: a\r\n\r\n".into(),
        ),
        (
            "a header line ended by LF",
            "GET /x HTTP/1.1\r\nHost: a\nX-Other: 1\r\n\r\n".into(),
        ),
        (
            "the head ended by LF LF",
            "GET /x HTTP/1.1\nHost: a\n\n".into(),
        ),
    ];
    // Alone, and behind a good request with a body on the same connection: the
    // scanner follows the first body (fixed length, or chunked with an extension
    // and a trailer) to find the second head.
    let openers = [
        "",
        "POST /first HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n\r\n\r\n\r\n",
        "POST /first HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n4;x=y\r\n\n\n\n\n\r\n0\r\nX-T: 1\r\n\r\n",
    ];
    for (what, head) in &heads {
        for opener in openers {
            let before = up.seen().len();
            let answer = probe(gw.addr, format!("{opener}{head}").as_bytes()).await;
            let targets = up.targets()[before..].to_vec();
            if opener.is_empty() {
                assert_refused(&answer, 400, what);
                assert!(targets.is_empty(), "{what}: {targets:?}");
            } else {
                assert!(answer.starts_with("HTTP/1.1 200 "), "{what}: {answer}");
                let second = answer.split("HTTP/1.1 ").nth(2).unwrap_or_default();
                assert!(second.starts_with("400 "), "{what}: {answer}");
                assert_eq!(answer.matches("HTTP/1.1 ").count(), 2, "{what}: {answer}");
                assert_eq!(targets, ["/first"], "{what}");
            }
        }
    }
    // The same bytes inside a body are data: a body that holds such a head, and the
    // request after it, both go through.
    let inner = "GET /x HTTP/1.1\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n";
    let answer = probe(
        gw.addr,
        format!(
            "POST /first HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{inner}\r\n0\r\n\r\n\
             POST /second HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\n\r\n{inner}\
             GET /third HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
            inner.len(),
            inner.len()
        )
        .as_bytes(),
    )
    .await;
    assert_eq!(answer.matches("HTTP/1.1 200 ").count(), 3, "{answer}");
    let targets = up.targets();
    assert_eq!(
        targets[targets.len() - 3..],
        ["/first", "/second", "/third"]
    );
    let seen = up.seen();
    assert_eq!(seen[seen.len() - 3].body, inner);
    assert_eq!(seen[seen.len() - 2].body, inner);
    gw.stop().await;
}

/// The status of `request`, sent over HTTP/2 (prior knowledge) on a connection of
/// its own.
async fn h2_status(addr: SocketAddr, request: http::Request<()>) -> http::StatusCode {
    let tcp = connect(addr, None).await;
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let mut client: h2::client::SendRequest<bytes::Bytes> = client.ready().await.unwrap();
    let (response, _) = client.send_request(request, true).unwrap();
    response.await.unwrap().status()
}

/// Over HTTP/2 the `:authority` is the request's host: held to the `Host` rule (a
/// userinfo part would let a caller be routed, and limited, as one host while the
/// upstream reads another); two `content-length` headers are refused; and the cookie crumbs an HTTP/2 client sends one by one
/// reach the HTTP/1.1 upstream as one `Cookie` header (RFC 9113 section 8.2.3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_authority_is_held_to_the_host_rule_and_cookies_are_joined_upstream() {
    let up = upstream().await;
    let gw = gateway(&config(&up, "")).await;
    for bad in ["http://x@tight.example/q", "http://tight.example:80@x/q"] {
        let request = http::Request::get(bad).body(()).unwrap();
        assert_eq!(h2_status(gw.addr, request).await, 400, "{bad}");
    }
    // Two equal Content-Lengths: HTTP/2 would pass both on.
    let request = http::Request::post("http://tight.example/lengths")
        .header("content-length", "0")
        .header("content-length", "0")
        .body(())
        .unwrap();
    assert_eq!(h2_status(gw.addr, request).await, 400);
    let request = http::Request::get("http://tight.example/cookies")
        .header("cookie", "a=1")
        .header("cookie", "session=s2")
        .header("cookie", "c=3")
        .body(())
        .unwrap();
    assert_eq!(h2_status(gw.addr, request).await, 200);
    let seen = up.seen();
    assert_eq!(up.targets(), ["/cookies"]);
    let cookies: Vec<_> = seen[0].headers.get_all("cookie").iter().collect();
    assert_eq!(cookies, ["a=1; session=s2; c=3"]);
    assert_eq!(seen[0].header("host"), Some("tight.example"));
    gw.stop().await;
}

/// HTTP/2 hands field values over untrimmed and a `:path` as sent: a value with a
/// space or tab at either end is a malformed request (RFC 9113 section 8.2.1), and
/// so is a `:path` of only a query, which an HTTP/1.1 upstream would otherwise get
/// as `/?a=b`. Neither reaches the upstream; the same values in place do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_value_with_surrounding_space_or_a_path_without_a_slash_is_refused() {
    let up = upstream().await;
    let gw = gateway(&config(&up, "")).await;
    for value in [" acme", "acme ", "\tacme", "acme\t"] {
        let request = http::Request::get("http://tight.example/spaced")
            .header("x-tenant", value)
            .body(())
            .unwrap();
        assert_eq!(h2_status(gw.addr, request).await, 400, "{value:?}");
    }
    // The h2 client sends the target's path and query as they are: `:path: ?a=b`.
    let request = http::Request::get("http://tight.example?a=b")
        .body(())
        .unwrap();
    assert_eq!(h2_status(gw.addr, request).await, 400);
    assert_eq!(up.targets(), Vec::<String>::new());
    let request = http::Request::get("http://tight.example/kept?a=b")
        .header("x-tenant", "ac me")
        .body(())
        .unwrap();
    assert_eq!(h2_status(gw.addr, request).await, 200);
    assert_eq!(up.targets(), ["/kept?a=b"]);
    assert_eq!(up.seen()[0].header("x-tenant"), Some("ac me"));
    gw.stop().await;
}

/// A `CONNECT` is refused and ends its connection: what follows it on the wire is
/// not read as requests. (The head watch cannot follow a tunnel; were the connection
/// kept, a bare-LF or Content-Length + Transfer-Encoding head after it would go
/// through unwatched.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_is_refused_and_nothing_after_it_on_the_connection_is_served() {
    let up = upstream().await;
    let gw = gateway(&config(&up, "")).await;
    let tunnel = "CONNECT x.example:443 HTTP/1.1\r\nHost: x.example:443\r\n\r\n";
    let after = "POST /bare-lf HTTP/1.1\nHost: a\nContent-Length: 3\n\nabc\
                 GET /after HTTP/1.1\r\nHost: a\r\n\r\n\
                 POST /both HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
    // Sent at once.
    let answer = probe(gw.addr, format!("{tunnel}{after}").as_bytes()).await;
    assert_refused(&answer, 400, "CONNECT, then requests");
    assert!(answer.contains("CONNECT is not served"), "{answer}");
    // Behind a good request on the same connection.
    let answer = probe(
        gw.addr,
        format!("GET /first HTTP/1.1\r\nHost: a\r\n\r\n{tunnel}{after}").as_bytes(),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
    assert_eq!(answer.matches("HTTP/1.1 ").count(), 2, "{answer}");
    let second = answer.split("HTTP/1.1 ").nth(2).unwrap_or_default();
    assert!(second.starts_with("400 "), "{answer}");
    assert!(
        second.to_ascii_lowercase().contains("connection: close"),
        "{answer}"
    );
    // The next request after a pause: the connection was closed with the answer.
    let mut stream = connect(gw.addr, None).await;
    stream.write_all(tunnel.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _ = stream.write_all(b"GET /later HTTP/1.1\nHost: a\n\n").await;
    let answer = read_until_closed(&mut stream, Duration::from_secs(5)).await;
    assert_refused(
        &String::from_utf8_lossy(&answer),
        400,
        "CONNECT, a pause, a request",
    );
    assert_eq!(up.targets(), ["/first"]);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spelled_right_framing_and_methods_go_through() {
    let up = upstream().await;
    let gw = gateway(&config(&up, "")).await;
    // Spelled right, the same requests go through.
    let answer = probe(
        gw.addr,
        b"POST /orders HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
    assert_eq!(up.last().body, "abc");
    // An extension method passes, under its own name.
    let answer = probe(
        gw.addr,
        b"PURGE /x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
    assert_eq!(up.last().method.as_str(), "PURGE");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_chunk_from_the_client_is_a_400_not_a_502() {
    let up = upstream().await;
    let gw = gateway(&config(&up, "")).await;
    for (what, body) in [
        ("a chunk size that is not hex", "zz\r\nabc\r\n0\r\n\r\n"),
        ("a chunk longer than its size", "2\r\nabcdef\r\n0\r\n\r\n"),
    ] {
        let answer = probe(
            gw.addr,
            format!("POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n{body}")
                .as_bytes(),
        )
        .await;
        assert_refused(&answer, 400, what);
    }
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_headers_cannot_be_confused() {
    let up = upstream().await;
    let gw = gateway(&config(&up, "")).await;
    // `Bearer` with an empty token is an unknown key, not an anonymous caller.
    for authorization in ["Bearer ", "Bearer", "bearer   "] {
        let resp = gw
            .raw(&format!(
                "GET /x HTTP/1.1\r\nHost: a\r\nAuthorization: {authorization}\r\nConnection: close\r\n\r\n"
            ))
            .await;
        assert_eq!(resp.status, 401, "{authorization:?}: {}", resp.text());
    }
    // The scheme in any case.
    let resp = gw
        .raw("GET /x HTTP/1.1\r\nHost: a\r\nAuthorization: BEARER demo-key-acme\r\nConnection: close\r\n\r\n")
        .await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    // Underscored look-alikes of the key header, forged client addresses and a
    // Connection header naming Host: the upstream sees none of it, and Host stays.
    let resp = gw
        .raw(
            "GET /x HTTP/1.1\r\nHost: shop.example\r\nX_API_Key: stolen\r\nX_Forwarded_For: 6.6.6.6\r\n\
             Forwarded: for=6.6.6.6\r\nX-Real-IP: 6.6.6.6\r\nConnection: host, close\r\nX-Kept: yes\r\n\r\n",
        )
        .await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let seen = up.last();
    for gone in ["x_api_key", "x_forwarded_for", "forwarded", "x-real-ip"] {
        assert!(
            seen.headers.get(gone).is_none(),
            "{gone} reached the upstream: {:?}",
            seen.headers
        );
    }
    assert_eq!(seen.headers["host"], "shop.example");
    assert_eq!(seen.headers["x-kept"], "yes");
    assert_eq!(seen.headers["x-forwarded-for"], "127.0.0.1");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_parameters_and_overlong_escapes_are_refused_over_h1_and_h2() {
    let up = upstream().await;
    let gw = gateway(&config(&up, "")).await;
    for path in [
        "/admin;x",
        "/api;/x",
        "/orders;.json",
        "/a%3Bb",
        "/a%3bb",
        "/%c0%ae%c0%ae/admin",
        "/%c0%af",
        "/x%ff",
    ] {
        let h1 = gw.raw_get(path).await;
        assert_eq!(h1.status, 400, "h1 {path}: {}", h1.text());
        h1.problem(400);
        let h2 = Req::get(path).h2().send(gw.addr).await;
        assert_eq!(h2.status, 400, "h2 {path}: {}", h2.text());
    }
    assert_eq!(up.seen().len(), 0, "{:?}", up.targets());
    // A route that opts in passes matrix parameters through; valid UTF-8 passes.
    let resp = gw.raw_get("/matrix/x;v=1").await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(up.last().target, "/matrix/x;v=1");
    let resp = Req::get("/caf%C3%A9").h2().send(gw.addr).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(up.last().target, "/caf%C3%A9");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn size_limits_are_honoured_exactly() {
    let up = upstream().await;
    let gw = gateway(&config(
        &up,
        "max_header_bytes = 1024\nmax_uri_bytes = 200\nmax_body_bytes = 100",
    ))
    .await;
    let big_header = format!(
        "GET /x HTTP/1.1\r\nHost: a\r\nX-Big: {}\r\n\r\n",
        "v".repeat(1100)
    );
    assert_refused(
        &probe(gw.addr, big_header.as_bytes()).await,
        431,
        "a 1.1 KiB head",
    );
    let long_uri = format!("GET /{} HTTP/1.1\r\nHost: a\r\n\r\n", "a".repeat(200));
    assert_refused(
        &probe(gw.addr, long_uri.as_bytes()).await,
        414,
        "a 201-byte target",
    );
    // Declared too large: refused before the body is read, with no 100 Continue.
    let answer = probe(
        gw.addr,
        b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 101\r\nExpect: 100-continue\r\n\r\n",
    )
    .await;
    assert!(!answer.contains("100 Continue"), "{answer}");
    assert_refused(&answer, 413, "Content-Length 101");
    assert_eq!(up.seen().len(), 0);
    // At the limits, requests pass.
    let resp = gw
        .raw(&format!(
            "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\nConnection: close\r\n\r\n{}",
            "b".repeat(100)
        ))
        .await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    gw.stop().await;
}

/// An upstream that answers every request with `response`, verbatim, and counts
/// the connections it accepted.
async fn evil_upstream(response: &'static [u8]) -> EvilUpstream {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                continue;
            };
            counter.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let mut seen = Vec::new();
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => seen.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = stream.write_all(response).await;
                let _ = read_until_eof(&mut stream).await;
            });
        }
    });
    EvilUpstream {
        addr,
        accepted,
        task,
    }
}

/// An upstream answering one canned response per connection.
struct EvilUpstream {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for EvilUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn read_until_eof(stream: &mut tokio::net::TcpStream) -> std::io::Result<()> {
    let mut buf = [0u8; 1024];
    loop {
        if stream.read(&mut buf).await? == 0 {
            return Ok(());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_responses_that_break_the_rules_become_502() {
    for (what, response) in [
        (
            "Content-Length and Transfer-Encoding",
            &b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n2f\r\n0123456789012345678901234567890123456789012345\n\r\n0\r\n\r\n"[..],
        ),
        (
            "101 to a plain request",
            &b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n"[..],
        ),
        (
            "two Content-Length headers",
            &b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc"[..],
        ),
    ] {
        let evil = evil_upstream(response).await;
        let gw = gateway(
            &Toml::new()
                .upstream("evil", &[format!("http://{}", evil.addr)])
                .route(route("all", "/").upstream("evil"))
                .build(),
        )
        .await;
        let h1 = gw.raw_get("/x").await;
        assert_eq!(h1.status, 502, "h1, {what}: {}", h1.text());
        let h2 = Req::get("/x").h2().send(gw.addr).await;
        assert_eq!(h2.status, 502, "h2, {what}: {}", h2.text());
        // The connection that carried the bad response was dropped, not pooled: the
        // second request needed a connection of its own.
        assert_eq!(evil.accepted.load(Ordering::SeqCst), 2, "{what}");
        gw.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_get_the_http_version_they_spoke_whatever_the_upstream_spoke() {
    let old = evil_upstream(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok").await;
    let gw = gateway(
        &Toml::new()
            .upstream("old", &[format!("http://{}", old.addr)])
            .route(route("all", "/").upstream("old"))
            .build(),
    )
    .await;
    let answer = probe(
        gw.addr,
        b"GET /x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(answer.ends_with("ok"), "{answer}");
    gw.stop().await;
}

/// One dead target among two: a refused connect is retried once on the next target
/// (GET and POST alike: nothing was sent), so clients see no 502, the live target
/// gets each request once, and the limiter counts each request once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connect_is_retried_once_on_the_next_target() {
    let up = upstream().await;
    let dead = format!("http://127.0.0.1:{}", support::closed_port());
    let gw = gateway(
        &Toml::new()
            .upstream("pair", &[dead, up.url()])
            .policy("p", &[("anonymous", "{ per_minute = 6 }")])
            .route(route("all", "/").upstream("pair").policy("p"))
            .build(),
    )
    .await;
    for i in 0..6 {
        let resp = if i % 2 == 0 {
            Req::get(&format!("/get/{i}")).send(gw.addr).await
        } else {
            Req::post(&format!("/post/{i}"), "body").send(gw.addr).await
        };
        assert_eq!(resp.status, 200, "request {i}: {}", resp.text());
    }
    let targets = up.targets();
    assert_eq!(
        targets,
        [
            "/get/0", "/post/1", "/get/2", "/post/3", "/get/4", "/post/5"
        ]
    );
    assert!(
        up.seen()
            .iter()
            .filter(|s| s.method == "POST")
            .all(|s| s.body == "body")
    );
    // Six requests, six counted: the seventh is over the limit.
    let resp = Req::get("/get/6").send(gw.addr).await;
    assert_eq!(resp.status, 429, "{}", resp.text());
    gw.stop().await;
}

// ---- bodies that are too large or too slow, and readers that stop -------------------

/// Sends `head`, then one byte every `gap` for as long as the gateway listens;
/// returns what came back, how many body bytes it took before it answered, and how
/// long it took to answer.
async fn trickle(addr: SocketAddr, head: &str, gap: Duration) -> (String, usize, Duration) {
    let mut stream = connect(addr, None).await;
    stream.write_all(head.as_bytes()).await.unwrap();
    let started = std::time::Instant::now();
    let mut answer = Vec::new();
    let mut sent = 0;
    let mut buf = [0u8; 4096];
    // 20 bytes at most: a gateway that took more never cut the body.
    while sent < 20 {
        tokio::select! {
            read = stream.read(&mut buf) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            },
            _ = tokio::time::sleep(gap) => {
                if !answer.is_empty() || stream.write_all(b"x").await.is_err() {
                    // Answered or closed: collect what was answered.
                    let rest = read_until_closed(&mut stream, Duration::from_secs(5)).await;
                    answer.extend_from_slice(&rest);
                    break;
                }
                sent += 1;
            }
        }
    }
    (
        String::from_utf8_lossy(&answer).into_owned(),
        sent,
        started.elapsed(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickled_body_is_cut_with_408_and_the_upstream_connection_is_not_pinned() {
    let up = upstream().await;
    // The defaults: body_timeout 30 s, min_body_rate 1024 bytes/s after 10 s. One
    // byte every 2 s never pauses 30 s, but averages far under 1 KiB/s: cut at 10 s,
    // after about five bytes (a slow machine sends fewer, never more), long before
    // ten.
    let gw = gateway(&config(&up, "")).await;
    let head = "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 1048576\r\n\r\n";
    let (answer, sent, took) = trickle(gw.addr, head, Duration::from_secs(2)).await;
    assert!(answer.starts_with("HTTP/1.1 408 "), "{answer}");
    assert!(sent < 10, "cut after {sent} bytes");
    assert!(
        took >= Duration::from_secs(9),
        "cut after {took:?}, before 10 s"
    );
    gw.stop().await;

    // A pause longer than body_timeout: cut in the first pause or, on a slow
    // machine, the second.
    let gw = gateway(&config(&up, "body_timeout = \"1s\"\nmin_body_rate = 0")).await;
    let (answer, sent, _) = trickle(gw.addr, head, Duration::from_secs(3)).await;
    assert!(answer.starts_with("HTTP/1.1 408 "), "{answer}");
    assert!(sent <= 1, "cut after {sent} bytes");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_body_over_max_body_bytes_is_a_413() {
    let up = upstream().await;
    let gw = gateway(&config(&up, "max_body_bytes = 100")).await;
    let body = format!(
        "64\r\n{}\r\n64\r\n{}\r\n0\r\n\r\n",
        "a".repeat(100),
        "b".repeat(100)
    );
    let answer = probe(
        gw.addr,
        format!("POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n{body}")
            .as_bytes(),
    )
    .await;
    assert_refused(&answer, 413, "a 200-byte chunked body");
    // 100 bytes exactly pass.
    let answer = probe(
        gw.addr,
        b"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n64\r\naaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n0\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_a_large_response_is_cut_after_idle_timeout() {
    // 10 GiB, streamed: a client reading it all would take far longer than the test.
    let up = support::upstream_with(support::UpstreamOptions {
        stream_bytes: Some(10 << 30),
        ..Default::default()
    })
    .await;
    let gw = gateway(&config(&up, "idle_timeout = \"1s\"")).await;
    let mut stream = connect(gw.addr, None).await;
    stream
        .write_all(b"GET /big HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    // Read a little, then stop reading while the buffers fill.
    let mut buf = vec![0u8; 65536];
    let n = stream.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200 "));
    tokio::time::sleep(Duration::from_secs(5)).await;
    // The gateway has closed the connection: what is buffered drains, then EOF. Were
    // the stream still flowing, the reads would go on past 256 MiB.
    let started = std::time::Instant::now();
    let mut drained = 0usize;
    loop {
        match tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => drained += n,
            Err(_) => panic!("the connection stayed open, silent"),
        }
        assert!(
            drained < 256 << 20,
            "read {drained} bytes: the stream was never cut"
        );
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "still streaming"
        );
    }
    eprintln!("drained {drained} bytes in {:?}", started.elapsed());
    gw.stop().await;
}

// ---- HTTP/2 floods ----------------------------------------------------------------------

/// Rapid reset (CVE-2023-44487): HEADERS then RST_STREAM, 10 000 times on one
/// connection from 127.0.0.2, against a slow upstream. The gateway closes the
/// connection after a bounded number of abandoned requests, so the upstream sees a
/// bounded number of requests and connections; the flooder's address is refused new
/// connections for a while, and a well-behaved client elsewhere is still served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rapid_reset_flood_is_cut_off_with_goaway() {
    let up = support::upstream_with(support::UpstreamOptions {
        delay: Duration::from_millis(200),
        ..Default::default()
    })
    .await;
    let gw = gateway(&config(&up, "")).await;
    let flooder = Some("127.0.0.2".parse().unwrap());
    let tcp = connect(gw.addr, flooder).await;
    let (mut client, connection) = h2::client::handshake(tcp).await.unwrap();
    let driver = tokio::spawn(connection);
    // A request that is not reset is served.
    let (response, _) = client
        .clone()
        .ready()
        .await
        .unwrap()
        .send_request(http::Request::get("http://a/first").body(()).unwrap(), true)
        .unwrap();
    assert_eq!(response.await.unwrap().status(), 200);
    // Batches of 50 streams, each reset once the gateway has had 20 ms to start
    // working on it (resets of streams it had not accepted yet are h2's own
    // business: it closes such connections after 20).
    let mut sent = 0;
    'flood: while sent < 10_000 {
        let mut batch = Vec::new();
        for _ in 0..50 {
            let request = http::Request::get(format!("http://a/flood/{sent}"))
                .body(())
                .unwrap();
            let ready = tokio::time::timeout(Duration::from_secs(5), client.clone().ready()).await;
            let Ok(Ok(mut ready)) = ready else {
                break 'flood;
            };
            let Ok((response, stream)) = ready.send_request(request, true) else {
                break 'flood;
            };
            batch.push((response, stream));
            sent += 1;
            client = ready;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        for (_, mut stream) in batch {
            stream.send_reset(h2::Reason::CANCEL);
        }
    }
    // The connection was closed by the gateway long before 10 000.
    let ended = tokio::time::timeout(Duration::from_secs(10), driver).await;
    assert!(
        ended.is_ok(),
        "the flooding connection is still open after {sent} resets"
    );
    assert!(sent < 10_000, "all 10 000 resets were accepted");
    // Time for requests still on their way to reach the upstream before they are
    // counted: an "at most" has no event to wait for.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let reached = up.seen().len();
    let connections = up.connections();
    eprintln!(
        "{sent} streams sent and reset; {reached} requests and {connections} connections reached the upstream"
    );
    assert!(reached <= 400, "{reached} requests reached the upstream");
    assert!(connections <= 400, "{connections} upstream connections");
    // The flooder's address is refused at once: closed without a byte.
    let mut again = connect(gw.addr, flooder).await;
    let _ = again.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await;
    let answer = read_until_closed(&mut again, Duration::from_secs(5)).await;
    assert!(
        answer.is_empty(),
        "the flooder was served again: {answer:?}"
    );
    // Somebody else is served normally.
    let resp = Req::get("/after").h2().send(gw.addr).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    gw.stop().await;
}

/// A request abandoned while the upstream works on it (RST_STREAM) does not cost an
/// upstream connection: the exchange is finished in the background and its
/// connection goes back to the pool, so the next abandoned requests reuse it instead
/// of each opening a new one.
///
/// The route's concurrency cap (20, with a queue) paces the batches without a timer:
/// a background exchange holds its permit until its connection is back in the pool,
/// so a request of the next batch is only forwarded once a connection is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_streams_give_their_upstream_connections_back() {
    // Long enough that the resets arrive while the upstream still works on the
    // requests; nothing waits for it to pass.
    let up = support::upstream_with(support::UpstreamOptions {
        delay: Duration::from_millis(500),
        ..Default::default()
    })
    .await;
    let toml = Toml::new()
        .upstream("up", &[up.url()])
        .policy(
            "paced",
            &[
                ("anonymous", "{ per_minute = 1000 }"),
                (
                    "concurrency",
                    r#"{ max = 20, queue = 100, queue_timeout = "1h" }"#,
                ),
            ],
        )
        .route(route("all", "/").upstream("up").policy("paced"))
        .build();
    let gw = gateway(&toml).await;
    let tcp = connect(gw.addr, None).await;
    let (mut client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    // Four batches of 20 streams, each reset once all 20 reached the upstream.
    for batch in 1..=4 {
        let mut streams = Vec::new();
        for i in 0..20 {
            let request = http::Request::get(format!("http://a/abandoned/{batch}/{i}"))
                .body(())
                .unwrap();
            let mut ready = client.clone().ready().await.unwrap();
            let (response, stream) = ready.send_request(request, true).unwrap();
            streams.push((response, stream));
            client = ready;
        }
        within("the batch reaching the upstream", async {
            while up.count() < batch * 20 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        for (_, mut stream) in streams {
            stream.send_reset(h2::Reason::CANCEL);
        }
    }
    // Every batch was forwarded whole, on the first batch's connections.
    let mut targets = up.targets();
    assert_eq!(targets.len(), 80, "{targets:?}");
    targets.sort();
    targets.dedup();
    assert_eq!(targets.len(), 80, "no request reached the upstream twice");
    assert_eq!(
        up.connections(),
        20,
        "80 abandoned requests, 20 at a time, need 20 upstream connections"
    );
    // The connection still serves, on a pooled upstream connection.
    let (response, _) = client
        .ready()
        .await
        .unwrap()
        .send_request(http::Request::get("http://a/after").body(()).unwrap(), true)
        .unwrap();
    assert_eq!(response.await.unwrap().status(), 200);
    assert_eq!(up.connections(), 20, "no new upstream connection");
    gw.stop().await;
}

/// Underscored header names are dropped from requests only (what nginx does): an
/// upstream's own `X_Trace` response header reaches the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn underscored_headers_in_responses_reach_the_client() {
    let traced =
        evil_upstream(b"HTTP/1.1 200 OK\r\nX_Trace: abc\r\nContent-Length: 2\r\n\r\nok").await;
    let gw = gateway(
        &Toml::new()
            .upstream("up", &[format!("http://{}", traced.addr)])
            .route(route("all", "/").upstream("up"))
            .build(),
    )
    .await;
    let resp = gw.raw_get("/x").await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("x_trace"), Some("abc"), "{:?}", resp.headers);
    gw.stop().await;
}

/// One HTTP/2 frame: length, type, flags, stream id, payload.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// CONTINUATION flood: one HEADERS frame without END_HEADERS, then 20 000 small
/// CONTINUATION frames that never end the header block. The header list outgrows
/// `max_header_bytes`, the connection is closed, nothing reaches the upstream, and
/// the gateway serves others meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_continuation_flood_closes_the_connection() {
    let up = upstream().await;
    let gw = gateway(&config(&up, "")).await;
    let mut stream = connect(gw.addr, Some("127.0.0.2".parse().unwrap())).await;
    let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    bytes.extend(frame(0x4, 0, 0, &[])); // SETTINGS
    // :method GET, :scheme http, :path /, :authority a (HPACK, static table).
    let mut block = vec![0x82, 0x86, 0x84, 0x41, 0x01, b'a'];
    block.extend_from_slice(&[0x00, 0x03, b'x', b'-', b'a', 0x0a]);
    block.extend_from_slice(b"aaaaaaaaaa");
    bytes.extend(frame(0x1, 0x1, 1, &block)); // HEADERS, END_STREAM, no END_HEADERS
    let piece = [
        0x00, 0x03, b'x', b'-', b'b', 0x0a, b'b', b'b', b'b', b'b', b'b', b'b', b'b', b'b', b'b',
        b'b',
    ];
    let started = std::time::Instant::now();
    let mut written = 0;
    for _ in 0..20_000 {
        bytes.extend(frame(0x9, 0, 1, &piece)); // CONTINUATION, no END_HEADERS
        if bytes.len() > 64 * 1024 {
            if stream.write_all(&bytes).await.is_err() {
                break;
            }
            written += bytes.len();
            bytes.clear();
        }
    }
    // Whatever it answered (GOAWAY), the gateway closed the connection.
    let answer = read_until_closed(&mut stream, Duration::from_secs(10)).await;
    eprintln!(
        "closed after {written} bytes written, {} read, {:?}",
        answer.len(),
        started.elapsed()
    );
    assert!(written < 20_000 * 25, "the whole flood was accepted");
    assert_eq!(up.seen().len(), 0);
    // From another address: the flooder's may be refused for a while.
    let after = Req::get("/after").h2().from("127.0.0.3");
    assert_eq!(after.send(gw.addr).await.status, 200);
    gw.stop().await;
}

/// PING and SETTINGS floods from a client that never reads: 50 000 frames each. The
/// gateway must not buffer an answer per frame without bound; it keeps serving others,
/// and the flooding connection is closed or stalls, never a crash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ping_and_settings_floods_do_not_take_the_gateway_down() {
    let up = upstream().await;
    let gw = gateway(&config(&up, "")).await;
    for (what, one) in [
        ("PING", frame(0x6, 0, 0, &[1, 2, 3, 4, 5, 6, 7, 8])),
        (
            "SETTINGS",
            frame(0x4, 0, 0, &[0x00, 0x03, 0x00, 0x00, 0x00, 0x64]),
        ),
    ] {
        let mut stream = connect(gw.addr, None).await;
        let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        bytes.extend(frame(0x4, 0, 0, &[]));
        for _ in 0..50_000 {
            bytes.extend_from_slice(&one);
        }
        // Written without reading a byte back; bounded in time whatever the server does.
        let wrote = tokio::time::timeout(Duration::from_secs(5), stream.write_all(&bytes)).await;
        eprintln!(
            "{what} flood: write {}",
            match wrote {
                Ok(Ok(())) => "completed",
                Ok(Err(_)) => "refused (connection closed)",
                Err(_) => "stalled (server stopped reading)",
            }
        );
        let resp = Req::get("/meanwhile").h2().send(gw.addr).await;
        assert_eq!(resp.status, 200, "{what}: {}", resp.text());
        drop(stream);
    }
    gw.stop().await;
}
