//! WebSocket message limits in fleet mode: two replicas on one Redis share each
//! caller's message budget, and a message that cannot be decided while Redis is
//! down with `on_error = "deny"` closes its socket with 1013.

use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

use crate::SERIAL;
use crate::sockets::{Client, connect, echo, until_closed};
use crate::support::gateways::{Gateway, gateway};
use crate::support::redis_server::RedisServer;
use crate::support::within;

/// A WebSocket route `/chat` to `up`, a message limit of `messages`, on `redis`.
fn config(redis: &RedisServer, up: &str, store: &str, messages: &str) -> String {
    format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\n{store}\n\n\
         [upstreams.chat]\ntargets = [\"{up}\"]\n\n\
         [policies.p]\nanonymous = {{ per_minute = 100 }}\nmessages = {messages}\n\n\
         [[routes]]\nname = \"chat\"\npath_prefix = \"/chat\"\nupstream = \"chat\"\n\
         policy = \"p\"\nwebsocket = true\n",
        redis.url()
    )
}

async fn echoed(client: &mut Client, text: &str) {
    client.send(Message::text(text)).await.unwrap();
    let echo = within("the echo", client.next()).await.unwrap().unwrap();
    assert_eq!(echo, Message::text(text));
}

/// Sends `text`; the close frame the socket then gets.
async fn refused(client: &mut Client, text: &str) -> (u16, String) {
    client.send(Message::text(text)).await.unwrap();
    let (messages, close) = until_closed(client).await;
    assert!(messages.is_empty(), "{messages:?}");
    close.expect("a close frame")
}

async fn series(gw: &Gateway, outcome: &str) -> f64 {
    let name = format!("sluice_ws_messages_total{{outcome=\"{outcome}\",route=\"chat\"}}");
    gw.metric(&name).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_one_callers_message_budget() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let up = echo().await;
    let toml = config(&redis, &up.url(), "", "{ per_minute = 4 }");
    let (one, two) = (gateway(&toml).await, gateway(&toml).await);
    let (mut a, _) = connect(one.addr, "/chat", &[]).await.unwrap();
    let (mut b, _) = connect(two.addr, "/chat", &[]).await.unwrap();
    for i in 1..=2 {
        echoed(&mut a, &format!("a{i}")).await;
        echoed(&mut b, &format!("b{i}")).await;
    }
    let (code, reason) = refused(&mut a, "a3").await;
    assert_eq!(code, 1008);
    assert!(reason.starts_with("rate limited; retry after "), "{reason}");
    assert_eq!(refused(&mut b, "b3").await.0, 1008);
    assert_eq!(up.received(), ["a1", "b1", "a2", "b2"]);
    assert_eq!(series(&one, "forwarded").await, 2.0);
    assert_eq!(series(&two, "limited").await, 1.0);
    one.stop().await;
    two.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_on_error_deny_a_message_redis_cannot_decide_closes_1013() {
    let _serial = SERIAL.lock().await;
    let mut redis = RedisServer::start();
    let up = echo().await;
    let store = "on_error = \"deny\"";
    let gw = gateway(&config(&redis, &up.url(), store, "{ per_minute = 100 }")).await;
    let (mut client, _) = connect(gw.addr, "/chat", &[]).await.unwrap();
    echoed(&mut client, "before").await;
    redis.kill();
    let (code, reason) = refused(&mut client, "during").await;
    assert_eq!((code, reason.as_str()), (1013, "limit store unavailable"));
    assert_eq!(up.closes(1).await, [Some(1001)]);
    assert_eq!(up.received(), ["before"]);
    assert_eq!(series(&gw, "unavailable").await, 1.0);
    gw.stop().await;
}
