//! End-to-end forwarding: what the upstream receives, what the client gets back,
//! path spellings, upstream failures, and the server's own protections.

use crate::support;

use std::time::{Duration, Instant};

use support::{
    Req, Toml, Upstream, UpstreamOptions, closed_port, connect, gateway, pattern, read_response,
    read_until_closed, route, upstream, upstream_with, within,
};
use tokio::io::AsyncWriteExt;

use support::ACME_SHA256;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_spellings_cannot_bypass_a_limited_route() {
    let up = upstream().await;
    // (what the client sends, what the upstream must receive)
    let spellings = [
        ("/admin", "/admin"),
        ("//admin", "/admin"),
        ("/x/../admin", "/admin"),
        ("/%61dmin", "/admin"),
        ("/%61%64%6D%69%6E", "/admin"),
        ("/admin/./", "/admin/"),
        ("/./admin", "/admin"),
        ("///admin//", "/admin/"),
        ("/x/%2e%2e/admin", "/admin"),
        ("/admin/sub/..", "/admin/"),
    ];
    let gw = gateway(
        &Toml::new()
            .upstream("up", &[up.url()])
            .policy(
                "admin",
                &[(
                    "anonymous",
                    &format!("{{ per_minute = {} }}", spellings.len()),
                )],
            )
            .route(route("admin", "/admin").upstream("up").policy("admin"))
            .route(route("open", "/").upstream("up"))
            .build(),
    )
    .await;

    for (i, (spelling, normalised)) in spellings.iter().enumerate() {
        let resp = gw.raw_get(spelling).await;
        assert_eq!(resp.status, 200, "{spelling}: {}", resp.text());
        assert_eq!(
            resp.sf_param("ratelimit", "minute", "r"),
            Some((spellings.len() - 1 - i) as i64),
            "{spelling} must count against the admin route's limit"
        );
        assert_eq!(
            up.last().target,
            *normalised,
            "{spelling} must reach the upstream normalised"
        );
    }
    for (spelling, _) in spellings {
        let resp = gw.raw_get(spelling).await;
        assert_eq!(resp.status, 429, "{spelling} escaped the admin limit");
    }
    // Path case is significant: /ADMIN is another path, served by the open route.
    let upper = gw.raw_get("/ADMIN").await;
    assert_eq!(upper.status, 200);
    assert!(upper.header("ratelimit").is_none(), "/ADMIN is not limited");
    assert_eq!(up.last().target, "/ADMIN");
    // Segment-aware prefix: /administrator is not /admin.
    let longer = gw.raw_get("/administrator").await;
    assert_eq!(longer.status, 200);
    assert!(longer.header("ratelimit").is_none());
    assert_eq!(up.count(), spellings.len() + 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsafe_path_spellings_are_400_problems() {
    let up = upstream().await;
    let gw = gateway(
        &Toml::new()
            .upstream("up", &[up.url()])
            .route(route("admin", "/admin").respond(403, "admin is closed"))
            .route(route("open", "/").upstream("up"))
            .build(),
    )
    .await;
    // Sanity: the direct spellings reach the admin route.
    let admin = gw.raw_get("/x/../admin").await;
    assert_eq!(admin.status, 403);
    assert_eq!(admin.text(), "admin is closed");
    for spelling in [
        "/admin%2Fx",
        "/admin%2fx",
        "/..",
        "/../admin",
        "/x/../../admin",
        "/%2e%2e/admin",
        "/admin%5Cx",
        "/admin%00",
        "/%zz",
    ] {
        let resp = gw.raw_get(spelling).await;
        resp.problem(400);
    }
    assert_eq!(up.count(), 0, "no unsafe spelling reached the upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstream_receives_the_normalised_path_and_the_original_query() {
    let up = upstream().await;
    let gw = gateway(
        &Toml::new()
            .upstream("up", &[up.url()])
            .route(route("api", "/api").upstream("up").strip_prefix())
            .route(route("keep", "/keep").upstream("up"))
            .build(),
    )
    .await;
    let cases = [
        ("/api//v1/./users/../items?x=1&y=%2F", "/v1/items?x=1&y=%2F"),
        ("/api?only=query", "/?only=query"),
        ("/api/", "/"),
        ("/%61pi/v2", "/v2"),
        (
            "/keep/%7euser/a/../b?q=a%20b&q=c",
            "/keep/~user/b?q=a%20b&q=c",
        ),
        ("/keep//x//y/", "/keep/x/y/"),
        ("/keep/%c3%a9", "/keep/%C3%A9"),
        // Already normalised: the target goes as it came, query and all.
        ("/keep/v1/items?x=1&y=%2F&", "/keep/v1/items?x=1&y=%2F&"),
        ("/keep/a?", "/keep/a?"),
        ("/keep/a", "/keep/a"),
    ];
    for (sent, expected) in cases {
        let resp = gw.raw_get(sent).await;
        assert_eq!(resp.status, 200, "{sent}: {}", resp.text());
        assert_eq!(up.last().target, expected, "upstream target for {sent}");
        assert_eq!(resp.text(), format!("up saw {expected}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_key_never_reaches_the_upstream() {
    let up = upstream().await;
    let gw = gateway(&acme_config(&up)).await;

    let resp = Req::get("/api/a")
        .header("x-api-key", "demo-key-acme")
        .header("x-other", "kept")
        .send(gw.addr)
        .await;
    assert_eq!(resp.status, 200);
    let seen = up.last();
    assert!(
        seen.headers.get("x-api-key").is_none(),
        "{:?}",
        seen.headers
    );
    assert_eq!(seen.header("x-other"), Some("kept"));

    // Header names are case-insensitive, on the raw wire too.
    let resp = gw
        .raw(
            "GET /api/b HTTP/1.1\r\nHost: gw.test\r\nX-API-KEY: demo-key-acme\r\n\
             Connection: close\r\n\r\n",
        )
        .await;
    assert_eq!(resp.status, 200);
    assert_eq!(
        resp.header("ratelimit-policy"),
        Some("\"minute\";q=100;w=60")
    );
    assert!(up.last().headers.get("x-api-key").is_none());

    let resp = Req::get("/api/c")
        .header("authorization", "Bearer demo-key-acme")
        .send(gw.addr)
        .await;
    assert_eq!(resp.status, 200);
    let seen = up.last();
    assert!(
        seen.headers.get("authorization").is_none(),
        "a bearer key leaked: {:?}",
        seen.headers
    );
    let leaked = seen
        .headers
        .values()
        .any(|v| v.as_bytes().windows(13).any(|w| w == b"demo-key-acme"));
    assert!(
        !leaked,
        "the key appears in a forwarded header: {:?}",
        seen.headers
    );

    // Authorization that is not the gateway's key is the upstream's business.
    let resp = Req::get("/api/d")
        .header("authorization", "Basic dXNlcjpwYXNz")
        .send(gw.addr)
        .await;
    assert_eq!(resp.status, 200);
    assert_eq!(
        up.last().header("authorization"),
        Some("Basic dXNlcjpwYXNz")
    );
    assert_eq!(up.count(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_sent_in_both_key_headers_is_not_forwarded() {
    let up = upstream().await;
    let gw = gateway(&acme_config(&up)).await;
    // The key in both headers: it is still the gateway's key, not the upstream's.
    let resp = Req::get("/api/both")
        .header("x-api-key", "demo-key-acme")
        .header("authorization", "Bearer demo-key-acme")
        .send(gw.addr)
        .await;
    assert_eq!(resp.status, 200);
    let seen = up.last();
    let leaked = seen
        .headers
        .values()
        .any(|v| v.as_bytes().windows(13).any(|w| w == b"demo-key-acme"));
    assert!(
        !leaked,
        "key sent in x-api-key and Authorization leaked upstream: {:?}",
        seen.headers
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hop_by_hop_headers_are_dropped_and_forwarding_headers_set() {
    let up = upstream_with(UpstreamOptions {
        hop_headers: true,
        ..UpstreamOptions::default()
    })
    .await;
    let gw = gateway(
        &Toml::new()
            .upstream("up", &[up.url()])
            .route(route("api", "/api").upstream("up"))
            .build(),
    )
    .await;
    let resp = gw
        .raw(
            "GET /api/hop?a=1 HTTP/1.1\r\n\
             Host: Shop.Example:8443\r\n\
             Connection: keep-alive, X-Secret-Hop\r\n\
             Keep-Alive: timeout=5\r\n\
             TE: trailers\r\n\
             Upgrade: websocket\r\n\
             Proxy-Authorization: Basic cHJveHk6cHc=\r\n\
             Proxy-Connection: keep-alive\r\n\
             X-Secret-Hop: 1\r\n\
             X-Forwarded-Proto: https\r\n\
             X-Forwarded-Host: evil.example\r\n\
             X-Kept: yes\r\n\
             \r\n",
        )
        .await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.text(), "up saw /api/hop?a=1");
    let seen = up.last();
    for hop in [
        "connection",
        "keep-alive",
        "te",
        "upgrade",
        "proxy-authorization",
        "proxy-connection",
        "x-secret-hop",
    ] {
        assert!(
            seen.headers.get(hop).is_none(),
            "hop-by-hop header {hop} reached the upstream: {:?}",
            seen.headers
        );
    }
    assert_eq!(seen.header("x-kept"), Some("yes"));
    assert_eq!(seen.header("host"), Some("Shop.Example:8443"));
    assert_eq!(seen.header("x-forwarded-for"), Some("127.0.0.1"));
    assert_eq!(
        seen.header("x-forwarded-proto"),
        Some("http"),
        "an untrusted client cannot claim https"
    );
    assert_eq!(seen.header("x-forwarded-host"), Some("Shop.Example:8443"));
    assert_eq!(
        seen.headers.get_all("x-forwarded-for").iter().count(),
        1,
        "one X-Forwarded-For"
    );

    // The upstream's own hop-by-hop headers do not reach the client.
    assert_eq!(resp.header("x-upstream"), Some("up"));
    assert!(resp.header("x-up-hop").is_none(), "{:?}", resp.headers);
    assert!(resp.header("keep-alive").is_none(), "{:?}", resp.headers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstream_status_headers_and_body_reach_the_client() {
    let up = upstream_with(UpstreamOptions {
        name: "maker",
        status: 201,
        body: Some(bytes::Bytes::from_static(b"{\"id\":7}")),
        ..UpstreamOptions::default()
    })
    .await;
    let gw = gateway(
        &Toml::new()
            .upstream("up", &[up.url()])
            .policy("p", &[("anonymous", "{ per_minute = 10 }")])
            .route(
                route("things", "/things")
                    .methods(&["POST"])
                    .upstream("up")
                    .policy("p"),
            )
            .build(),
    )
    .await;
    let resp = Req::post("/things", "name=seven")
        .header("content-type", "application/x-www-form-urlencoded")
        .send(gw.addr)
        .await;
    assert_eq!(resp.status, 201);
    assert_eq!(resp.text(), "{\"id\":7}");
    assert_eq!(resp.header("x-upstream"), Some("maker"));
    assert_eq!(
        resp.header("ratelimit-policy"),
        Some("\"minute\";q=10;w=60")
    );
    assert_eq!(resp.sf_param("ratelimit", "minute", "r"), Some(9));
    let seen = up.last();
    assert_eq!(seen.method, http::Method::POST);
    assert_eq!(seen.target, "/things");
    assert_eq!(&seen.body[..], b"name=seven");
    assert_eq!(
        seen.header("content-type"),
        Some("application/x-www-form-urlencoded")
    );
    // Another method does not match the route.
    gw.get("/things").await.problem(404);
}

fn one_route(up: &Upstream) -> String {
    Toml::new()
        .upstream("up", &[up.url()])
        .policy("p", &[("anonymous", "{ per_minute = 1000 }")])
        .route(route("all", "/").upstream("up").policy("p"))
        .build()
}

/// Route `/api` to `up`, limited, with the consumer `acme` (key `demo-key-acme`).
fn acme_config(up: &Upstream) -> String {
    Toml::new()
        .upstream("up", &[up.url()])
        .policy(
            "p",
            &[
                ("anonymous", "{ per_minute = 100 }"),
                ("registered", "{ per_minute = 100 }"),
            ],
        )
        .consumer("acme", ACME_SHA256)
        .route(route("api", "/api").upstream("up").policy("p"))
        .build()
}

#[tokio::test]
async fn upstream_connections_are_kept_alive_and_reused() {
    for stream_bytes in [None, Some(100_000)] {
        // A sized body, then a chunked one: both give their connection back.
        let up = upstream_with(UpstreamOptions {
            stream_bytes,
            ..UpstreamOptions::default()
        })
        .await;
        let gw = gateway(&one_route(&up)).await;
        for i in 0..50 {
            let resp = gw.get(&format!("/n/{i}")).await;
            assert_eq!(resp.status, 200, "request {i}");
            if let Some(len) = stream_bytes {
                assert_eq!(resp.body.len(), len);
            }
        }
        assert_eq!(up.count(), 50);
        assert!(
            up.connections() <= 5,
            "50 requests one after the other took {} upstream connections",
            up.connections()
        );
        gw.stop().await;
    }
}

#[tokio::test]
async fn an_upstream_closing_every_connection_still_gets_every_request() {
    let up = upstream_with(UpstreamOptions {
        close_each: true,
        ..UpstreamOptions::default()
    })
    .await;
    let gw = gateway(&one_route(&up)).await;
    for i in 0..30 {
        let resp = gw.get(&format!("/n/{i}")).await;
        assert_eq!(resp.status, 200, "request {i}: {}", resp.text());
        assert_eq!(resp.text(), format!("up saw /n/{i}"));
    }
    assert_eq!(up.count(), 30);
    assert_eq!(up.connections(), 30);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bodies_stream_both_ways_intact() {
    const UP: usize = 5 * 1024 * 1024;
    const DOWN: usize = 8 * 1024 * 1024 + 123;
    let up = upstream_with(UpstreamOptions {
        stream_bytes: Some(DOWN),
        ..UpstreamOptions::default()
    })
    .await;
    let gw = gateway(
        &Toml::new()
            .upstream("up", &[up.url()])
            .route(route("files", "/files").upstream("up"))
            .build(),
    )
    .await;
    let sent = pattern(UP);
    let resp = Req::post("/files/upload", sent.clone()).send(gw.addr).await;
    assert_eq!(resp.status, 200);
    let seen = up.last();
    assert_eq!(seen.body.len(), UP, "request body length at the upstream");
    assert!(
        seen.body[..] == sent[..],
        "request body corrupted on the way"
    );
    assert_eq!(resp.body.len(), DOWN, "response body length at the client");
    assert!(
        resp.body[..] == pattern(DOWN)[..],
        "response body corrupted"
    );

    // The same over HTTP/2.
    let resp = Req::post("/files/again", sent.clone())
        .h2()
        .send(gw.addr)
        .await;
    assert_eq!(resp.status, 200);
    assert_eq!(up.last().body.len(), UP);
    assert!(up.last().body[..] == sent[..]);
    assert!(resp.body[..] == pattern(DOWN)[..]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_route_is_a_404_problem() {
    let gw = gateway(
        &Toml::new()
            .route(route("demo", "/demo").respond(200, "hello"))
            .build(),
    )
    .await;
    assert_eq!(gw.get("/demo").await.text(), "hello");
    for path in ["/", "/other", "/demox", "/DEMO"] {
        let json = gw.get(path).await.problem(404);
        assert_eq!(json["title"], "Not Found");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_upstream_port_is_a_502_problem() {
    let port = closed_port();
    let gw = gateway(
        &Toml::new()
            .upstream("gone", &[format!("http://127.0.0.1:{port}")])
            .raw("connect_timeout = \"1s\"")
            .route(route("api", "/api").upstream("gone"))
            .build(),
    )
    .await;
    let json = gw.get("/api/x").await.problem(502);
    assert!(
        json["detail"].as_str().unwrap().contains("gone"),
        "detail names the upstream: {json}"
    );
    // Still 502 (not a hang or a crash) on the next try, over HTTP/2 too.
    Req::get("/api/y").h2().send(gw.addr).await.problem(502);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_upstream_is_a_504_problem_after_the_timeout() {
    let up = upstream_with(UpstreamOptions {
        delay: Duration::from_secs(3),
        ..UpstreamOptions::default()
    })
    .await;
    let gw = gateway(
        &Toml::new()
            .upstream("slow", &[up.url()])
            .raw("timeout = \"300ms\"")
            .route(route("api", "/api").upstream("slow"))
            .build(),
    )
    .await;
    let started = Instant::now();
    let resp = gw.get("/api/slow").await;
    let elapsed = started.elapsed();
    // A 504, not the upstream's 200 three seconds later: the timeout cut it.
    let json = resp.problem(504);
    assert!(json["detail"].as_str().unwrap().contains("slow"), "{json}");
    assert!(
        elapsed >= Duration::from_millis(250),
        "504 after {elapsed:?}, before the 300 ms timeout"
    );
    assert_eq!(up.count(), 1, "the request did reach the upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_spread_round_robin_over_targets() {
    let a = upstream_with(UpstreamOptions {
        name: "a",
        ..UpstreamOptions::default()
    })
    .await;
    let b = upstream_with(UpstreamOptions {
        name: "b",
        ..UpstreamOptions::default()
    })
    .await;
    let gw = gateway(
        &Toml::new()
            .upstream("pair", &[a.url(), b.url()])
            .route(route("api", "/").upstream("pair"))
            .build(),
    )
    .await;
    let mut answered = Vec::new();
    for i in 0..6 {
        let resp = gw.get(&format!("/r{i}")).await;
        assert_eq!(resp.status, 200);
        answered.push(resp.header("x-upstream").unwrap().to_string());
    }
    assert_eq!(a.count(), 3, "answers: {answered:?}");
    assert_eq!(b.count(), 3, "answers: {answered:?}");
    assert!(
        answered.windows(2).all(|w| w[0] != w[1]),
        "targets alternate: {answered:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_target_is_skipped_for_a_live_one() {
    let live = upstream().await;
    let gw = gateway(
        &Toml::new()
            .upstream(
                "pair",
                &[format!("http://127.0.0.1:{}", closed_port()), live.url()],
            )
            .raw("connect_timeout = \"1s\"")
            .route(route("api", "/").upstream("pair"))
            .build(),
    )
    .await;
    let mut statuses = Vec::new();
    for i in 0..6 {
        statuses.push(gw.get(&format!("/r{i}")).await.status.as_u16());
    }
    // At most the first attempt on the dead target fails; then it is skipped.
    assert!(
        statuses.iter().filter(|&&s| s == 502).count() <= 1,
        "statuses: {statuses:?}"
    );
    assert!(
        statuses[1..].iter().all(|&s| s == 200),
        "statuses: {statuses:?}"
    );
}

fn server_config(extra: &str) -> String {
    Toml::new()
        .raw(&format!("[server]\n{extra}"))
        .route(route("demo", "/demo").respond(200, "hello"))
        .build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_stalling_in_the_request_line_is_cut_after_header_timeout() {
    let gw = gateway(&server_config("header_timeout = \"1s\"")).await;
    let mut stream = connect(gw.addr, None).await;
    stream.write_all(b"GET /demo HT").await.unwrap();
    let elapsed = cut_without_answer(&mut stream).await;
    assert!(
        elapsed >= Duration::from_millis(800),
        "cut after {elapsed:?}, before header_timeout"
    );
    // A prompt client on a new connection is served normally.
    assert_eq!(gw.get("/demo").await.text(), "hello");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_trickling_headers_is_cut_after_header_timeout() {
    let gw = gateway(&server_config("header_timeout = \"1s\"")).await;
    let mut stream = connect(gw.addr, None).await;
    let (mut reader, mut writer) = stream.split();
    let started = Instant::now();
    // One header line every 300 ms for 6 s: bytes keep coming, the head never ends.
    let trickle = async {
        writer.write_all(b"GET /demo HTTP/1.1\r\n").await?;
        for i in 0..20 {
            tokio::time::sleep(Duration::from_millis(300)).await;
            writer
                .write_all(format!("X-Slow-{i}: 1\r\n").as_bytes())
                .await?;
        }
        Ok::<_, std::io::Error>(())
    };
    let closed = async {
        let mut buf = vec![0u8; 4096];
        loop {
            match tokio::io::AsyncReadExt::read(&mut reader, &mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    let outcome = within("trickled head", async {
        tokio::select! {
            () = closed => "closed",
            written = trickle => if written.is_err() { "write failed" } else { "finished" },
        }
    })
    .await;
    let elapsed = started.elapsed();
    // Cut before the 6 s trickle ended (the default header_timeout is 10 s), and
    // not before header_timeout.
    assert_ne!(
        outcome, "finished",
        "the server kept reading a trickled head for {elapsed:?}"
    );
    assert!(
        elapsed >= Duration::from_millis(800),
        "connection cut after {elapsed:?} ({outcome}) with header_timeout = 1s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_sends_nothing_is_cut_after_header_timeout() {
    let gw = gateway(&server_config("header_timeout = \"1s\"")).await;
    let mut stream = connect(gw.addr, None).await;
    cut_without_answer(&mut stream).await;
}

/// The next head on a keep-alive connection has a whole header_timeout (4 s) from
/// the answer before it: neither from the connection's start (it is over 4 s old
/// when it stalls) nor from the stalled head's first byte. Each deadline it could
/// wrongly have is at least a second away from the right one, and the test tells
/// them apart by a reference connection cut between them, not by its own clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_alive_client_stalling_in_its_next_head_is_cut_after_header_timeout() {
    // idle_timeout is far away: only header_timeout can cut this connection.
    let gw = gateway(&server_config(
        "header_timeout = \"4s\"\nidle_timeout = \"60s\"",
    ))
    .await;
    let mut stream = connect(gw.addr, None).await;
    for i in 0..3 {
        if i > 0 {
            // Each answer gives the next head a whole header_timeout.
            tokio::time::sleep(Duration::from_millis(1_500)).await;
        }
        stream
            .write_all(b"GET /demo HTTP/1.1\r\nHost: gw.test\r\n\r\n")
            .await
            .unwrap();
        let resp = within("keep-alive response", read_response(&mut stream))
            .await
            .unwrap();
        assert_eq!(resp.text(), "hello", "request {i}");
    }
    // The last answer came at L, the connection started about 3 s before it (4 s
    // from its start is L + 1 s). The next head is due at L + 4 s. A reference
    // connection that stalls in its first head 1 s later is due at L + 5 s.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut reference = connect(gw.addr, None).await;
    reference.write_all(b"GET /demo HT").await.unwrap();
    // At L + 2 s the client stalls in its next head. Counted from that head's first
    // byte it would be due at L + 6 s, after the reference.
    tokio::time::sleep(Duration::from_secs(1)).await;
    stream.write_all(b"GET /demo HT").await.unwrap();
    let mut stream = stream.into_std().unwrap();
    // Not cut already (as if counted from the connection's start), which a request
    // served on another connection meanwhile shows ...
    assert_eq!(gw.get("/demo").await.text(), "hello");
    assert_eq!(
        pending(&mut stream),
        None,
        "the stalled head was cut at once"
    );
    // ... but by the time the reference connection is.
    cut_without_answer(&mut reference).await;
    let received = pending(&mut stream)
        .expect("the stalled head was still open when the reference, due 1 s later, was cut");
    assert!(
        received.is_empty() || received.starts_with(b"HTTP/1.1 408"),
        "unexpected answer: {:?}",
        String::from_utf8_lossy(&received)
    );
}

/// What a non-blocking `stream` holds once the peer has closed it; `None` while it
/// is open with nothing more to read.
fn pending(stream: &mut std::net::TcpStream) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut received = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match stream.read(&mut chunk) {
            Ok(0) => return Some(received),
            Ok(n) => received.extend_from_slice(&chunk[..n]),
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => return None,
            Err(_) => return Some(received),
        }
    }
}

/// Waits until the server closes `stream`, which must get no answer but a 408;
/// returns how long that took. The wait is bounded at half the default
/// header_timeout (10 s): only a configured one cuts it in time.
async fn cut_without_answer(stream: &mut tokio::net::TcpStream) -> Duration {
    let started = Instant::now();
    let received = read_until_closed(stream, Duration::from_secs(5)).await;
    assert!(
        received.is_empty() || received.starts_with(b"HTTP/1.1 408"),
        "unexpected answer: {:?}",
        String::from_utf8_lossy(&received)
    );
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_served_longer_than_header_timeout_keeps_its_connection() {
    let up = upstream_with(UpstreamOptions {
        delay: Duration::from_millis(2_200),
        ..UpstreamOptions::default()
    })
    .await;
    let gw = gateway(
        &Toml::new()
            .raw("[server]\nheader_timeout = \"1s\"")
            .upstream("up", &[up.url()])
            .route(route("slow", "/slow").upstream("up"))
            .build(),
    )
    .await;
    let mut stream = connect(gw.addr, None).await;
    for i in 0..2 {
        stream
            .write_all(b"GET /slow HTTP/1.1\r\nHost: gw.test\r\n\r\n")
            .await
            .unwrap();
        let resp = within("slow response", read_response(&mut stream))
            .await
            .unwrap_or_else(|err| panic!("request {i} on the connection: {err}"));
        assert_eq!(resp.status, 200, "request {i}");
        assert_eq!(resp.text(), "up saw /slow");
    }
    assert_eq!(up.count(), 2);
    assert_eq!(up.connections(), 1, "one upstream connection, reused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_stalling_in_the_http2_preface_is_cut_after_header_timeout() {
    let gw = gateway(&server_config("header_timeout = \"1s\"")).await;
    let mut stream = connect(gw.addr, None).await;
    stream.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    // Bounded at half the default header_timeout (10 s).
    read_until_closed(&mut stream, Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_http2_client_is_closed_after_idle_timeout() {
    let gw = gateway(&server_config("idle_timeout = \"1s\"")).await;
    let mut stream = connect(gw.addr, None).await;
    // The client preface and an empty SETTINGS frame, then silence: the client is
    // gone and will never acknowledge anything the server sends.
    stream
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    // Bounded well below the default idle_timeout (60 s).
    read_until_closed(&mut stream, support::WAIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_headers_are_refused() {
    let gw = gateway(&server_config("max_header_bytes = 16384")).await;
    // Well under the limit: served.
    let fine = gw
        .raw(&format!(
            "GET /demo HTTP/1.1\r\nHost: gw.test\r\nX-Big: {}\r\nConnection: close\r\n\r\n",
            "a".repeat(8 * 1024)
        ))
        .await;
    assert_eq!(fine.status, 200);

    let mut stream = connect(gw.addr, None).await;
    let request = format!(
        "GET /demo HTTP/1.1\r\nHost: gw.test\r\nX-Big: {}\r\nConnection: close\r\n\r\n",
        "a".repeat(40 * 1024)
    );
    // The server may close before reading everything: a failed write is fine.
    let _ = within("write a big head", stream.write_all(request.as_bytes())).await;
    match within("response to a big head", read_response(&mut stream)).await {
        Ok(resp) => assert_eq!(resp.status, 431, "40 KB of headers: {}", resp.text()),
        Err(closed) => assert!(
            closed.contains("closed") || closed.contains("reset"),
            "neither 431 nor a closed connection: {closed}"
        ),
    }

    // The same limit applies to HTTP/2.
    let outcome = Req::get("/demo")
        .h2()
        .header("x-big", &"a".repeat(40 * 1024))
        .try_send(gw.addr)
        .await;
    if let Ok(resp) = outcome {
        assert_eq!(resp.status, 431, "HTTP/2 with 40 KB of headers");
    }
    // ... and the gateway still serves HTTP/2 afterwards.
    assert_eq!(Req::get("/demo").h2().send(gw.addr).await.text(), "hello");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_of_more_than_100_fields_is_refused_with_431() {
    let gw = gateway(&server_config("max_header_bytes = 16384")).await;
    // `fields` header fields in all, Host and Connection included.
    let head = |fields: usize| {
        let mut head = String::from("GET /demo HTTP/1.1\r\nHost: gw.test\r\nConnection: close\r\n");
        for i in 0..fields - 2 {
            head.push_str(&format!("X-F{i}: v\r\n"));
        }
        head + "\r\n"
    };
    // 100 fields, as Envoy's and HAProxy's defaults allow: served.
    let fine = gw.raw(&head(100)).await;
    assert_eq!(fine.status, 200, "{}", fine.text());
    for fields in [101, 150, 300] {
        let mut stream = connect(gw.addr, None).await;
        let _ = within(
            "write a long head",
            stream.write_all(head(fields).as_bytes()),
        )
        .await;
        let refused = within("response to a long head", read_response(&mut stream)).await;
        let refused = refused.unwrap_or_else(|e| panic!("{fields} fields: {e}"));
        assert_eq!(refused.status, 431, "{fields} fields: {}", refused.text());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keep_alive_connection_is_closed_after_idle_timeout() {
    let gw = gateway(&server_config("idle_timeout = \"1s\"")).await;
    let mut stream = connect(gw.addr, None).await;
    stream
        .write_all(b"GET /demo HTTP/1.1\r\nHost: gw.test\r\n\r\n")
        .await
        .unwrap();
    let resp = within("keep-alive response", read_response(&mut stream))
        .await
        .unwrap();
    assert_eq!(resp.text(), "hello");
    let started = Instant::now();
    // Bounded well below the default idle_timeout (60 s).
    read_until_closed(&mut stream, support::WAIT).await;
    assert!(
        started.elapsed() >= Duration::from_millis(700),
        "closed after {:?}, before idle_timeout",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_a_route_matched_is_the_host_the_upstream_sees() {
    let up = upstream().await;
    let gw = gateway(
        &Toml::new()
            .upstream("up", &[up.url()])
            .policy("admin", &[("anonymous", "{ per_minute = 1 }")])
            .route(
                route("admin-site", "/")
                    .host("admin.example.com")
                    .upstream("up")
                    .policy("admin"),
            )
            .route(route("public", "/").upstream("up"))
            .build(),
    )
    .await;
    // Host matching ignores case and port.
    let resp = gw
        .raw("GET /a HTTP/1.1\r\nHost: ADMIN.example.com:8080\r\nConnection: close\r\n\r\n")
        .await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("ratelimit-policy"), Some("\"minute\";q=1;w=60"));
    let resp = gw
        .raw("GET /b HTTP/1.1\r\nHost: admin.example.com\r\nConnection: close\r\n\r\n")
        .await;
    assert_eq!(resp.status, 429, "the admin site is limited");

    // An absolute-form target names another host than the Host header
    // (RFC 9112 section 3.2.2: the target's authority wins). Whatever sluice
    // matched, the upstream must not be shown the limited admin host for free.
    let before = up.count();
    for i in 0..3 {
        let resp = gw
            .raw(&format!(
                "GET http://public.example.com/c{i} HTTP/1.1\r\nHost: admin.example.com\r\n\
                 Connection: close\r\n\r\n"
            ))
            .await;
        if resp.status == 200 && up.count() > before {
            let seen = up.last();
            let host = seen.header("host").unwrap_or_default().to_ascii_lowercase();
            assert!(
                !host.starts_with("admin.example.com"),
                "request {i} was matched as {} but reached the upstream with Host: {host} \
                 (X-Forwarded-Host: {:?})",
                if resp.header("ratelimit").is_some() {
                    "admin-site"
                } else {
                    "public (not limited)"
                },
                seen.header("x-forwarded-host")
            );
        }
    }
}
