//! The edges of the upgrade path, in raw bytes against recording upstreams: an
//! `Upgrade` sluice must not forward, malformed upgrades, an upstream that switches
//! unasked, frames that break the protocol or a limit, and one client holding
//! thousands of sockets.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::sockets::{
    Binary, client_frame, connect, echo, masked_frame, raw_upgrade, refused_status, scripted,
};
use crate::support::{Req, Toml, live, metric, raw, route, upstream, within};

/// A plain route and a WebSocket route to the same upstream.
fn both(up: &str, server: &str, policy: &str) -> String {
    Toml::new()
        .raw(&format!("[server]\ndrain_timeout = \"1s\"\n{server}"))
        .upstream("up", &[up.to_string()])
        .raw(policy)
        .route(route("ws", "/ws").upstream("up").with("websocket = true"))
        .route(route("plain", "/").upstream("up"))
        .build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_on_a_route_without_websocket_reaches_the_upstream_as_a_plain_request() {
    let up = upstream().await;
    let gw = live(&both(&up.url(), "", "")).await;
    for connection in ["Upgrade", "keep-alive, Upgrade", "upgrade, keep-alive"] {
        let request = format!(
            "GET /api HTTP/1.1\r\nHost: gw.test\r\nConnection: {connection}\r\n\
             Upgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
             Sec-WebSocket-Version: 13\r\n\r\n"
        );
        let resp = raw(gw.addr, request.as_bytes()).await;
        assert_eq!(resp.status, 200, "{connection}: {}", resp.text());
        let seen = up.last();
        assert_eq!(seen.header("upgrade"), None, "{connection}");
        assert_eq!(seen.header("connection"), None, "{connection}");
    }
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_upgrade_on_a_websocket_route_is_400_and_counts_nothing() {
    let up = echo().await;
    let policy = "[policies.p]\nanonymous = { per_minute = 1 }";
    let toml = Toml::new()
        .upstream("up", &[up.url()])
        .raw(policy)
        .route(
            route("ws", "/ws")
                .upstream("up")
                .policy("p")
                .with("websocket = true"),
        )
        .build();
    let gw = live(&toml).await;
    let upgrade = "Connection: keep-alive, Upgrade\r\nUpgrade: websocket\r\n\
                   Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n";
    let cases = [
        format!("POST /ws HTTP/1.1\r\nHost: gw.test\r\n{upgrade}\r\n"),
        format!("GET /ws HTTP/1.1\r\nHost: gw.test\r\n{upgrade}Content-Length: 5\r\n\r\nhello"),
        format!(
            "GET /ws HTTP/1.1\r\nHost: gw.test\r\n{upgrade}Transfer-Encoding: chunked\r\n\r\n\
             5\r\nhello\r\n0\r\n\r\n"
        ),
    ];
    for request in &cases {
        let resp = raw(gw.addr, request.as_bytes()).await;
        assert_eq!(resp.status, 400, "{request}: {}", resp.text());
    }
    assert_eq!(up.handshakes(), 0);
    // Nothing was counted: the one upgrade a minute still opens.
    let (client, _) = connect(gw.addr, "/ws", &[]).await.unwrap();
    drop(client);
    gw.stop().await;
}

/// An upstream that answers every request `101 Switching Protocols`.
async fn switching_upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if stream.read(&mut byte).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let answer = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\
                              Connection: Upgrade\r\n\r\n";
                let _ = stream.write_all(answer.as_bytes()).await;
                let _ = stream.read(&mut [0; 64]).await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_switches_to_a_request_that_asked_for_no_upgrade_is_a_502() {
    let addr = switching_upstream().await;
    let gw = live(&both(&format!("http://{addr}"), "", "")).await;
    let plain = gw.get("/ws/plain-get").await;
    assert_eq!(plain.status, 502, "{}", plain.text());
    let smuggled = "GET /api HTTP/1.1\r\nHost: gw.test\r\nConnection: keep-alive, Upgrade\r\n\
                    Upgrade: websocket\r\n\r\n";
    let resp = raw(gw.addr, smuggled.as_bytes()).await;
    assert_eq!(resp.status, 502, "{}", resp.text());
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_the_upstream_sends_with_its_101_reaches_the_client() {
    // One write: the 101 (answering the RFC's sample key, raw_upgrade's) and a
    // greeting, which sluice reads with the 101's head.
    let answer = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\
        Connection: Upgrade\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n\
        \x81\x05hello";
    let (addr, _) = scripted(answer).await;
    let gw = live(&both(&format!("http://{addr}"), "", "")).await;
    let mut socket = raw_upgrade(gw.addr, "/ws").await;
    socket.until_text("hello").await;
    drop(socket);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_that_break_the_protocol_close_the_client_1002_and_the_upstream_1001() {
    let up = echo().await;
    let gw = live(&both(&up.url(), "", "")).await;
    let cases: [(Vec<u8>, u16); 4] = [
        (masked_frame(0x81, b"unmasked", false), 1002),
        (client_frame(0xC1, b"rsv1 without an extension"), 1002),
        (client_frame(0x83, b"reserved opcode"), 1002),
        (client_frame(0x80, b"continuation of nothing"), 1002),
    ];
    for (i, (frame, code)) in cases.iter().enumerate() {
        let mut socket = raw_upgrade(gw.addr, "/ws").await;
        socket
            .stream
            .write_all(&client_frame(0x81, b"fine"))
            .await
            .unwrap();
        socket.stream.write_all(frame).await.unwrap();
        assert_eq!(socket.close_code().await, Some(*code), "case {i}");
        let closes = up.closes(i + 1).await;
        assert_eq!(closes[i], Some(1001), "case {i}");
    }
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_over_max_body_bytes_is_1009_and_a_control_flood_1008() {
    let up = echo().await;
    let gw = live(&both(&up.url(), "max_body_bytes = 1000", "")).await;
    let mut socket = raw_upgrade(gw.addr, "/ws").await;
    let parts = [
        client_frame(0x01, &[b'a'; 600]),
        client_frame(0x80, &[b'b'; 600]),
    ]
    .concat();
    socket.stream.write_all(&parts).await.unwrap();
    assert_eq!(socket.close_code().await, Some(1009));
    assert_eq!(up.closes(1).await, [Some(1001)]);
    let mut socket = raw_upgrade(gw.addr, "/ws").await;
    let pings: Vec<u8> = (0..101).flat_map(|_| client_frame(0x89, b"p")).collect();
    socket.stream.write_all(&pings).await.unwrap();
    assert_eq!(socket.close_code().await, Some(1008));
    assert_eq!(up.closes(2).await[1], Some(1001));
    gw.stop().await;
}

/// Through the binary: a hundred control frames in a second pass (the socket still
/// echoes), the hundred-and-first closes it with 1008, and the upstream's side 1001.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_closes_a_socket_on_its_101st_control_frame_in_a_second() {
    let up = echo().await;
    let sluice = Binary::start(&both(&up.url(), "", "")).await;
    let pings: Vec<u8> = (0..100).flat_map(|_| client_frame(0x89, b"p")).collect();
    for attempt in 1.. {
        let mut socket = raw_upgrade(sluice.addr, "/ws").await;
        let burst = Instant::now();
        socket.stream.write_all(&pings).await.unwrap();
        socket
            .stream
            .write_all(&client_frame(0x81, b"after 100"))
            .await
            .unwrap();
        socket.until_text("after 100").await;
        // sluice's second began after `burst`: with half of it left, the next ping
        // is in it. (A machine too slow for that tries again.)
        if burst.elapsed() > Duration::from_millis(500) {
            assert!(attempt < 5, "never within half a second");
            continue;
        }
        socket
            .stream
            .write_all(&client_frame(0x89, b"p"))
            .await
            .unwrap();
        let close = socket.close().await;
        assert_eq!(close, Some((1008, "too many control frames".into())));
        assert_eq!(up.closes(attempt).await[attempt - 1], Some(1001));
        break;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_sockets_from_one_client_are_bounded_by_per_caller() {
    let up = echo().await;
    let server = "max_connections = 64";
    let policy = "[policies.p]\nanonymous = { per_second = 1000000 }\n\
                  concurrency = { max = 10000, per_caller = 5 }";
    let toml = Toml::new()
        .raw(&format!("[server]\ndrain_timeout = \"1s\"\n{server}"))
        .upstream("up", &[up.url()])
        .raw(policy)
        .route(
            route("ws", "/ws")
                .upstream("up")
                .policy("p")
                .with("websocket = true"),
        )
        .build();
    let gw = live(&toml).await;
    let mut held = Vec::new();
    for _ in 0..5 {
        held.push(connect(gw.addr, "/ws", &[]).await.unwrap().0);
    }
    let addr = gw.addr;
    let attempts = futures_util::stream::iter(0..10_000)
        .map(|_| async move {
            let request = "GET /ws HTTP/1.1\r\nHost: gw.test\r\nConnection: Upgrade\r\n\
                           Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
                           Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";
            raw(addr, request.as_bytes()).await.status.as_u16()
        })
        .buffer_unordered(32)
        .collect::<Vec<u16>>();
    let statuses = tokio::time::timeout(std::time::Duration::from_secs(300), attempts)
        .await
        .expect("10 000 upgrades answered");
    assert!(statuses.iter().all(|&s| s == 429), "{:?}", &statuses[..10]);
    assert_eq!(
        up.handshakes(),
        5,
        "only the five admitted reached the upstream"
    );
    let metrics = gw.admin(Req::get("/metrics")).await.text();
    assert_eq!(
        metric(&metrics, "sluice_ws_connections{route=\"ws\"}"),
        Some(5.0)
    );
    // The five held sockets still work.
    for client in &mut held {
        futures_util::SinkExt::send(client, "ping".into())
            .await
            .unwrap();
        within("the echo", client.next()).await.unwrap().unwrap();
    }
    let err = connect(gw.addr, "/ws", &[]).await.unwrap_err();
    assert_eq!(refused_status(&err), 429);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_whose_headers_come_in_pieces_pass_whole() {
    let up = echo().await;
    let gw = live(&both(&up.url(), "", "")).await;
    let mut socket = raw_upgrade(gw.addr, "/ws").await;
    socket.stream.set_nodelay(true).unwrap();
    // A 200-byte message (a 2-byte length) whose header comes a byte at a time, then
    // an empty one and a ping, each header whole, with the next header in the same
    // write as the empty payload.
    let long = client_frame(0x82, &[5; 200]);
    for byte in &long[..8] {
        socket.stream.write_all(&[*byte]).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    socket.stream.write_all(&long[8..]).await.unwrap();
    let rest = [
        client_frame(0x81, b""),
        client_frame(0x89, b"p"),
        client_frame(0x81, b"end"),
    ];
    socket.stream.write_all(&rest.concat()).await.unwrap();
    within("three messages upstream", async {
        while up.received().len() < 3 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await;
    let received = up.record.lock().unwrap().received.clone();
    assert_eq!(received, [vec![5; 200], vec![], b"end".to_vec()]);
    gw.stop().await;
}
