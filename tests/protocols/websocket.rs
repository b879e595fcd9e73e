//! WebSockets through sluice, end to end with real clients and an echo upstream:
//! the upgrade admitted like any request, messages both ways, the permit held while
//! the socket is open, one access-log line at its close, the idle timeout and the
//! drain.

use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use crate::sockets::{connect, echo, refused_status, until_closed};
use crate::support::{Req, Toml, live, metric, route, within};

fn chat(up: &str, policy: &str, server: &str) -> String {
    Toml::new()
        .raw(&format!("[server]\ndrain_timeout = \"1s\"\n{server}"))
        .upstream("chat", &[up.to_string()])
        .raw(policy)
        .route(
            route("chat", "/chat")
                .upstream("chat")
                .policy("p")
                .with("websocket = true"),
        )
        .build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_pass_both_ways_and_the_socket_is_logged_once_at_its_close() {
    let up = echo().await;
    let toml = chat(
        &up.url(),
        "[policies.p]\nanonymous = { per_minute = 10 }",
        "",
    );
    let gw = live(&toml).await;
    let (mut client, response) = connect(gw.addr, "/chat/room", &[]).await.unwrap();
    assert_eq!(response.status(), 101);
    let ratelimit = response
        .headers()
        .get("ratelimit")
        .unwrap()
        .to_str()
        .unwrap();
    assert!(
        ratelimit.contains("r=9"),
        "the upgrade is counted: {ratelimit}"
    );
    assert!(response.headers().contains_key("x-request-id"));
    client.send(Message::text("hello")).await.unwrap();
    client
        .send(Message::binary(vec![7u8; 70_000]))
        .await
        .unwrap();
    let first = within("the echo", client.next()).await.unwrap().unwrap();
    assert_eq!(first, Message::text("hello"));
    let second = within("the echo", client.next()).await.unwrap().unwrap();
    assert_eq!(second.len(), 70_000);
    let metrics = gw.admin(Req::get("/metrics")).await.text();
    assert_eq!(
        metric(&metrics, "sluice_ws_connections{route=\"chat\"}"),
        Some(1.0)
    );
    assert!(
        gw.access_log.lines().is_empty(),
        "the line waits for the close"
    );
    let bye = CloseFrame {
        code: CloseCode::Normal,
        reason: "bye".into(),
    };
    client.close(Some(bye)).await.unwrap();
    let (_, code) = until_closed(&mut client).await;
    assert_eq!(code.map(|c| c.0), Some(1000));
    assert_eq!(up.closes(1).await, [Some(1000)]);
    let lines = gw.access_log.wait_lines(1).await;
    assert_eq!(lines.len(), 1, "{lines:?}");
    let line: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(line["status"], 101);
    assert_eq!(line["route"], "chat");
    assert_eq!(line["path"], "/chat/room");
    let socket = &line["websocket"];
    assert_eq!(socket["messages_up"], 2, "{line}");
    assert_eq!(socket["messages_down"], 2, "{line}");
    assert_eq!(socket["close_code"], 1000, "{line}");
    assert!(socket["bytes_up"].as_u64().unwrap() > 70_000, "{line}");
    assert!(socket["bytes_down"].as_u64().unwrap() > 70_000, "{line}");
    let metrics = gw.admin(Req::get("/metrics")).await.text();
    assert_eq!(
        metric(&metrics, "sluice_ws_connections{route=\"chat\"}"),
        Some(0.0)
    );
    let forwarded = "sluice_ws_messages_total{outcome=\"forwarded\",route=\"chat\"}";
    assert_eq!(metric(&metrics, forwarded), Some(2.0));
    // What the upstream's handshake carried: the upgrade, sluice's forwarding headers.
    let handshake = up.record.lock().unwrap().handshakes[0].clone();
    assert_eq!(handshake["upgrade"], "websocket");
    assert!(handshake.contains_key("x-forwarded-for"));
    assert!(handshake.contains_key("sec-websocket-key"));
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_is_refused_like_any_request_and_never_reaches_the_upstream() {
    let up = echo().await;
    let toml = chat(
        &up.url(),
        "[policies.p]\nanonymous = { per_minute = 1 }",
        "",
    );
    let gw = live(&toml).await;
    let (mut client, _) = connect(gw.addr, "/chat", &[]).await.unwrap();
    let err = connect(gw.addr, "/chat", &[]).await.unwrap_err();
    assert_eq!(refused_status(&err), 429);
    let unknown = connect(gw.addr, "/chat", &[("x-api-key", "nobody")]).await;
    assert_eq!(refused_status(&unknown.unwrap_err()), 401);
    assert_eq!(
        up.handshakes(),
        1,
        "only the admitted upgrade reached the upstream"
    );
    client.close(None).await.unwrap();
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_socket_holds_its_concurrency_slot_until_it_closes() {
    let up = echo().await;
    let policy = "[policies.p]\nanonymous = { per_minute = 100 }\n\
                  concurrency = { max = 100, per_caller = 2 }";
    let gw = live(&chat(&up.url(), policy, "")).await;
    let (mut first, _) = connect(gw.addr, "/chat", &[]).await.unwrap();
    let (second, _) = connect(gw.addr, "/chat", &[]).await.unwrap();
    let third = connect(gw.addr, "/chat", &[]).await.unwrap_err();
    assert_eq!(
        refused_status(&third),
        429,
        "per_caller = 2 bounds open sockets"
    );
    // Idle sockets still hold their slots: nothing changes while they are open.
    first.send(Message::text("still here")).await.unwrap();
    within("the echo", first.next()).await.unwrap().unwrap();
    let again = connect(gw.addr, "/chat", &[]).await.unwrap_err();
    assert_eq!(refused_status(&again), 429);
    first.close(None).await.unwrap();
    until_closed(&mut first).await;
    // The slot comes back once the socket is done with: a new one opens.
    let reopened = within("a slot to come back", async {
        loop {
            match connect(gw.addr, "/chat", &[]).await {
                Ok((client, _)) => return client,
                Err(err) => assert_eq!(refused_status(&err), 429),
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    drop((second, reopened));
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_idle_for_tunnel_idle_timeout_is_closed_1001_both_ways() {
    let up = echo().await;
    let toml = chat(
        &up.url(),
        "[policies.p]\nanonymous = { per_minute = 10 }",
        "tunnel_idle_timeout = \"300ms\"",
    );
    let gw = live(&toml).await;
    let (mut client, _) = connect(gw.addr, "/chat", &[]).await.unwrap();
    client.send(Message::text("one")).await.unwrap();
    let (messages, code) = until_closed(&mut client).await;
    assert_eq!(messages, [Message::text("one")]);
    assert_eq!(code.map(|c| c.0), Some(1001));
    assert_eq!(up.closes(1).await, [Some(1001)]);
    let lines = gw.access_log.wait_lines(1).await;
    let line: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(line["websocket"]["close_code"], 1001, "{line}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_the_gateway_closes_open_sockets_1001_after_the_drain() {
    let up = echo().await;
    let toml = chat(
        &up.url(),
        "[policies.p]\nanonymous = { per_minute = 10 }",
        "",
    );
    let gw = live(&toml).await;
    let (mut client, _) = connect(gw.addr, "/chat", &[]).await.unwrap();
    client.send(Message::text("before")).await.unwrap();
    within("the echo", client.next()).await.unwrap().unwrap();
    let log = gw.access_log.clone();
    let stopping = tokio::spawn(gw.stop());
    let (_, code) = until_closed(&mut client).await;
    assert_eq!(code.map(|c| c.0), Some(1001));
    assert_eq!(up.closes(1).await, [Some(1001)]);
    within("the stop", stopping).await.unwrap();
    let lines = log.wait_lines(1).await;
    let line: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(line["websocket"]["messages_up"], 1, "{line}");
}
