//! A decision Redis runs after its caller was refused for the store's timeout
//! counts nothing. The gateway answers 503 (`on_error = "deny"`) after `[store]
//! timeout`, but the script call is already in Redis's socket: a Redis frozen with
//! SIGSTOP runs it once SIGCONT lets it. Each call carries its deadline in Redis's
//! clock and the script counts nothing past it. Through the `sluice run` binary,
//! against a real redis-server the test freezes and resumes.

use crate::SERIAL;
use crate::fleet::{Replica, config, replica};
use crate::support::redis_server::RedisServer;
use crate::support::{Req, within_for};

use std::time::Duration;

/// `used` of 127.0.0.1's minute window, as `/admin/usage` reads it from Redis.
async fn used(replica: &Replica) -> u64 {
    let usage = Req::get("/admin/usage?caller=ip:127.0.0.1")
        .send(replica.admin)
        .await;
    assert_eq!(usage.status, 200, "/admin/usage: {}", usage.text());
    let json = usage.json();
    json["policies"][0]["limits"][0]["used"]
        .as_u64()
        .unwrap_or_else(|| panic!("no minute window: {json}"))
}

/// The status of one request for `/hello` from `ip`.
async fn status(replica: &Replica, ip: &str) -> u16 {
    let resp = Req::get("/hello").from(ip).send(replica.addr).await;
    resp.status.as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_timeout_503_charges_nothing_when_the_frozen_redis_resumes() {
    let _serial = SERIAL.lock().await;
    let mut redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let body = config(
        &redis,
        "on_error = \"deny\"",
        "anonymous = { per_minute = 1000 }",
    );
    let gw = replica(dir.path(), "late", &body).await;
    for _ in 0..60 {
        assert_eq!(status(&gw, "127.0.0.1").await, 200, "redis up");
    }
    assert_eq!(used(&gw).await, 60, "each admitted request counted once");

    // Frozen: a concurrent burst (batched into a few script calls) and requests one
    // at a time; each waits the 50 ms timeout (or the open breaker) and gets 503,
    // while the calls sent before the breaker opened wait in Redis's socket.
    redis.pause();
    let burst: Vec<_> = (0..30)
        .map(|_| {
            let addr = gw.addr;
            tokio::spawn(async move {
                let resp = Req::get("/hello").from("127.0.0.1").send(addr).await;
                resp.status.as_u16()
            })
        })
        .collect();
    let mut refused = 0;
    for task in burst {
        assert_eq!(task.await.unwrap(), 503, "frozen redis, on_error = deny");
        refused += 1;
    }
    for _ in 0..10 {
        assert_eq!(status(&gw, "127.0.0.1").await, 503, "frozen redis");
        refused += 1;
    }

    // Resumed: Redis runs every call waiting in its socket. Once another caller is
    // decided in Redis again, /admin/usage (a call on the same connection, so run
    // after them) shows the 503s counted nothing.
    redis.resume();
    let mut attempt = 0;
    within_for("decided in redis again", Duration::from_secs(10), async {
        loop {
            attempt += 1;
            if status(&gw, &format!("127.0.1.{}", attempt % 250)).await == 200 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert_eq!(
        used(&gw).await,
        60,
        "the {refused} requests refused with 503 while redis was frozen charged nothing"
    );
    for _ in 0..5 {
        assert_eq!(status(&gw, "127.0.0.1").await, 200, "redis back");
    }
    assert_eq!(used(&gw).await, 65, "normal requests charge exactly again");
}

/// `sluice_store_errors_total` of `replica`.
async fn store_errors(replica: &Replica) -> f64 {
    let text = Req::get("/metrics").send(replica.admin).await.text();
    crate::support::gateways::sample(&text, "sluice_store_errors_total{backend=\"redis\"}")
        .unwrap_or_else(|| panic!("no store errors sample:\n{text}"))
}

/// The bans sync runs four times a second whether or not Redis answers: a dead
/// Redis (or the Cluster master holding the bans) is logged once per outage, and
/// each failed sync counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_bans_sync_is_logged_once_per_outage_and_counted() {
    let _serial = SERIAL.lock().await;
    let mut redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let body = config(&redis, "", "anonymous = { per_minute = 1000 }");
    let gw = replica(dir.path(), "bans", &body).await;
    assert_eq!(status(&gw, "127.0.0.1").await, 200);
    let failed = "the redis bans sync failed";
    let again = "the redis bans sync works again";

    for outage in 1..=2 {
        let before = store_errors(&gw).await;
        redis.kill();
        // Two seconds of syncs (8), each counted.
        within_for("failed syncs counted", Duration::from_secs(10), async {
            while store_errors(&gw).await < before + 8.0 {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
        assert_eq!(gw.log().matches(failed).count(), outage, "{}", gw.log());
        redis.restart();
        within_for("the sync working again", Duration::from_secs(10), async {
            while gw.log().matches(again).count() < outage {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
    }
    assert_eq!(gw.log().matches(failed).count(), 2, "{}", gw.log());
}
