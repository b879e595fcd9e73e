//! Store health under faults that come and go: a Redis that stalls for a moment every
//! second, and (on a Cluster) a master that dies while the others serve. Each test
//! prints what it measured (`cargo test --test fleet -- health:: --nocapture`); the
//! assertions are about answers and counters, never about how long anything took.

use crate::SERIAL;
use crate::support::gateways;
use crate::support::redis_server;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use gateways::{gateway, load, policies};
use redis_server::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stalls_of_a_fifth_of_each_second_cost_the_stalled_requests_not_all_of_them() {
    let _serial = SERIAL.lock().await;
    let mut redis = RedisServer::start();
    let toml = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\non_error = \"deny\"\ntimeout = \"50ms\"\n{}",
        redis.url(),
        policies(1_000_000)
    );
    let gw = gateway(&toml).await;
    let stop = Arc::new(AtomicBool::new(false));
    let running = tokio::spawn(load(gw.addr, "/pooled", 200, stop.clone()));
    // Six seconds of Redis frozen (SIGSTOP) 200 ms of every 1 000.
    const ROUNDS: u32 = 6;
    for _ in 0..ROUNDS {
        tokio::time::sleep(Duration::from_millis(800)).await;
        redis.pause();
        tokio::time::sleep(Duration::from_millis(200)).await;
        redis.resume();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let run = running.await.unwrap();
    let tally = run.tally;
    let answered = tally.ok + tally.limited + tally.unavailable + tally.other;
    eprintln!(
        "stalls of 200 ms every 1 s, on_error = deny: {} of {answered} answers 503 ({:.1} %), \
         {} admitted; {} store errors; {tally:?}",
        tally.unavailable,
        100.0 * tally.unavailable as f64 / answered as f64,
        tally.ok,
        gw.store_errors(),
    );
    assert_eq!(
        tally.other + tally.limited,
        0,
        "only 200 and (in a stall) 503"
    );
    assert!(tally.unavailable > 0, "the stalls were seen");
    // A fifth of each second frozen, and the calls in flight when it froze: the
    // rest is decided in Redis. A breaker that opened on each stall refused them all.
    assert!(
        tally.ok * 2 > answered,
        "most requests are decided in Redis between the stalls: {tally:?}"
    );
    gw.stop().await;
}
