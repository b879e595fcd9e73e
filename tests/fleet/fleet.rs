//! Fleet mode: gateways sharing their limits through Redis.
//!
//! Every test starts its own `redis-server` on a free loopback port (never a Redis
//! it did not start) and kills, pauses or restarts it to inject faults. The exact
//! fleet-wide limit is checked with four `sluice run` processes; the fault tests run
//! gateways in-process (real clock: Redis decides with its own `TIME`) to read their
//! store and metrics directly. Tests take turns ([`SERIAL`]): their latency bounds
//! must not depend on a neighbour's thousand-request burst. Every wait is bounded.

use crate::SERIAL;
use crate::support;
use crate::support::gateways;
use crate::support::redis_server;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use gateways::{Gateway, gateway, sample};
use redis_server::RedisServer;
use sluice::clock::Clock;
use sluice::config::Config;
use sluice::store::breaker::PROBE_AFTER_MS;
use support::free_port;
use support::{Req, Resp, within};

/// How long sluice may take to use Redis again once it answers.
const RECOVERY: Duration = Duration::from_secs(5);

const ROUTE: &str = r#"
[[routes]]
name = "hello"
path_prefix = "/hello"
respond = { status = 200, body = "hello\n" }
policy = "shared"
"#;

/// `[store]` for `redis` with extra lines, the `shared` policy and a `/hello` route.
pub(crate) fn config(redis: &RedisServer, store: &str, policy: &str) -> String {
    format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\n{store}\n\n[policies.shared]\n{policy}\n{ROUTE}",
        redis.url()
    )
}

const FALLBACK: &str = "sluice_store_fallback";
const REDIS_ERRORS: &str = "sluice_store_errors_total{backend=\"redis\"}";

#[track_caller]
fn assert_status(resp: &Resp, status: u16, what: &str) {
    assert_eq!(
        resp.status.as_u16(),
        status,
        "{what}; body: {}",
        resp.text()
    );
}

/// Sends requests, each from a fresh caller (127.0.1.N: a caller refused by the
/// local fallback stays refused for a while, and would never reach Redis again),
/// until `done` holds; panics after [`RECOVERY`].
async fn until_recovered<F, Fut>(gw: &Gateway, what: &str, mut done: F)
where
    F: FnMut(Resp) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + RECOVERY;
    for attempt in 1.. {
        let ip = format!("127.0.1.{}", attempt % 250);
        let resp = gw.get_from(&ip, "/hello").await;
        if done(resp).await {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not recovered {RECOVERY:?} after redis came back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ---- a. one exact limit across replicas ----------------------------------------------

/// A `sluice run` process.
pub(crate) struct Replica {
    child: Child,
    pub(crate) addr: SocketAddr,
    pub(crate) admin: SocketAddr,
    log: PathBuf,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Replica {
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// Starts `sluice run` with `body` plus its own listen and admin ports, and waits
/// until `/readyz` answers 200.
pub(crate) async fn replica(dir: &Path, name: &str, body: &str) -> Replica {
    let (port, admin_port) = (free_port(), free_port());
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:{port}\"\n\n[admin]\nlisten = \"127.0.0.1:{admin_port}\"\n\n{body}"
    );
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, toml).unwrap();
    let log = dir.join(format!("{name}.log"));
    let child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["run", "-c", path.to_str().unwrap()])
        .env_remove("SLUICE_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("sluice run starts");
    let mut replica = Replica {
        child,
        addr: ([127, 0, 0, 1], port).into(),
        admin: ([127, 0, 0, 1], admin_port).into(),
        log,
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Ok(resp) = Req::get("/readyz").try_send(replica.admin).await
            && resp.status == 200
        {
            return replica;
        }
        if let Ok(Some(status)) = replica.child.try_wait() {
            panic!(
                "{name} exited ({status}) before serving:\n{}",
                replica.log()
            );
        }
        assert!(
            Instant::now() < deadline,
            "{name} was not ready within 15 s:\n{}",
            replica.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_replicas_admit_exactly_the_shared_limit_of_a_thousand_concurrent_requests() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    // Fail closed with a generous timeout: a decision that did not come from Redis
    // would be a 503 here, never a silently local (and inexact) 200.
    let body = config(
        &redis,
        "on_error = \"deny\"\ntimeout = \"2s\"",
        "anonymous = { per_minute = 100 }",
    );
    let mut replicas = Vec::new();
    for i in 0..4 {
        replicas.push(replica(dir.path(), &format!("replica{i}"), &body).await);
    }
    let addrs: Vec<SocketAddr> = replicas.iter().map(|r| r.addr).collect();

    // 1 000 requests of one caller (127.0.0.1), all at once, round robin.
    let started = Instant::now();
    let gate = Arc::new(tokio::sync::Barrier::new(1_000));
    let tasks: Vec<_> = (0..1_000)
        .map(|i| {
            let addr = addrs[i % addrs.len()];
            let gate = gate.clone();
            tokio::spawn(async move {
                let mut stream = support::connect(addr, None).await;
                gate.wait().await;
                within("a fleet request", async {
                    use tokio::io::AsyncWriteExt;
                    stream
                        .write_all(
                            b"GET /hello HTTP/1.1\r\nHost: fleet\r\nConnection: close\r\n\r\n",
                        )
                        .await
                        .unwrap();
                    support::read_response(&mut stream).await
                })
                .await
                .map(|resp| (i % 4, resp.status.as_u16()))
            })
        })
        .collect();
    let mut admitted = [0usize; 4];
    let mut limited = 0;
    let mut other = Vec::new();
    for task in tasks {
        match within("fleet requests", task).await.expect("request task") {
            Ok((replica, 200)) => admitted[replica] += 1,
            Ok((_, 429)) => limited += 1,
            Ok((replica, status)) => other.push(format!("replica{replica}: {status}")),
            Err(err) => other.push(err),
        }
    }
    let elapsed = started.elapsed();
    let logs: String = replicas.iter().map(|r| r.log()).collect();
    assert!(
        other.is_empty(),
        "answers other than 200/429: {other:?}\nlogs:\n{logs}"
    );
    assert_eq!(
        (admitted.iter().sum::<usize>(), limited),
        (100, 900),
        "admitted per replica: {admitted:?}; logs:\n{logs}"
    );
    // Each replica received 250 requests: with budgets of their own they would have
    // admitted 100 each. Which replica spent the shared 100 depends on whose batch
    // reached Redis first (often all of it through one), so it is not asserted.
    let keys = redis.keys();
    assert_eq!(keys.len(), 1, "one caller, one key: {keys:?}");
    // And every replica tells the caller the same thing now.
    for replica in &replicas {
        let resp = Req::get("/hello").send(replica.addr).await;
        assert_status(&resp, 429, "after the burst");
        let metrics = Req::get("/metrics").send(replica.admin).await.text();
        assert_eq!(sample(&metrics, REDIS_ERRORS), Some(0.0), "{metrics}");
    }
    // A replica started now (no memory of its own) refuses the caller too: the
    // counts live in Redis, so a restart hands out no fresh budget.
    let late = replica(dir.path(), "late", &body).await;
    let resp = Req::get("/hello").send(late.addr).await;
    assert_status(&resp, 429, "a replica started after the burst");
    assert!(resp.retry_after() >= 1);
    eprintln!("1 000 requests through 4 replicas in {elapsed:?}");
}

// ---- b. faults ----------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_on_error_local_a_dead_redis_falls_back_to_local_limits_and_recovers() {
    let _serial = SERIAL.lock().await;
    let mut redis = RedisServer::start();
    let gw = gateway(&config(
        &redis,
        "on_error = \"local\"",
        "anonymous = { per_minute = 5 }",
    ))
    .await;

    for _ in 0..2 {
        assert_status(&gw.get("/hello").await, 200, "redis up");
    }
    assert_eq!(redis.keys().len(), 1, "the caller is counted in redis");
    assert_eq!(gw.metric(FALLBACK).await, 0.0);
    assert_eq!(gw.metric(REDIS_ERRORS).await, 0.0);

    redis.kill();
    // Decided locally: the local limiter never saw the two requests counted in
    // Redis, so it admits its own 5, then refuses.
    let mut statuses = Vec::new();
    for _ in 0..8 {
        let resp = gw.get("/hello").await;
        if resp.status == 429 {
            assert!(resp.retry_after() >= 1, "Retry-After of a local refusal");
        }
        statuses.push(resp.status.as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429, 429]);
    assert_eq!(gw.metric(FALLBACK).await, 1.0, "the breaker is open");
    assert!(gw.metric(REDIS_ERRORS).await > 0.0);

    redis.restart();
    assert!(redis.keys().is_empty(), "the restarted redis starts empty");
    until_recovered(&gw, "on_error = local", |resp| {
        let gw = &gw;
        async move {
            assert_status(&resp, 200, "recovering");
            gw.metric(FALLBACK).await == 0.0
        }
    })
    .await;
    // Decisions come from Redis again: the request was counted there, and more
    // requests add no errors.
    let keys = redis.keys().len();
    assert!(keys > 0, "no key in redis after recovery");
    let errors = gw.store_errors();
    for _ in 0..3 {
        assert_status(&gw.get_from("127.0.0.3", "/hello").await, 200, "recovered");
    }
    assert_eq!(gw.store_errors(), errors, "errors after recovery");
    assert_eq!(
        redis.keys().len(),
        keys + 1,
        "127.0.0.3 is counted in redis"
    );
    gw.stop().await;
}

/// The PINGs `redis` has answered since it started (`INFO commandstats`).
fn pings(redis: &RedisServer) -> u64 {
    let stats: String = redis.query(redis::cmd("INFO").arg("commandstats"));
    stats
        .lines()
        .find_map(|line| line.strip_prefix("cmdstat_ping:calls="))
        .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_on_error_deny_a_dead_redis_means_503_and_not_ready_until_it_is_back() {
    let _serial = SERIAL.lock().await;
    let mut redis = RedisServer::start();
    let gw = gateway(&config(
        &redis,
        "on_error = \"deny\"",
        "anonymous = { per_minute = 100 }",
    ))
    .await;
    assert_status(&gw.get("/hello").await, 200, "redis up");
    assert_status(&gw.readyz().await, 200, "/readyz with redis up");
    // One PING per /readyz, not one to decide readiness and one for the body.
    let before = pings(&redis);
    for _ in 0..10 {
        assert_status(&gw.readyz().await, 200, "/readyz with redis up");
    }
    assert_eq!(pings(&redis) - before, 10, "PINGs for 10 /readyz");

    redis.kill();
    for _ in 0..5 {
        let resp = gw.get("/hello").await;
        resp.problem(503);
        assert!(resp.retry_after() >= 1, "Retry-After on a 503");
    }
    gw.readyz().await.problem(503);
    assert_eq!(gw.metric(FALLBACK).await, 1.0);
    assert!(gw.metric(REDIS_ERRORS).await > 0.0);

    redis.restart();
    until_recovered(
        &gw,
        "on_error = deny",
        |resp| async move { resp.status == 200 },
    )
    .await;
    assert_status(&gw.readyz().await, 200, "/readyz after recovery");
    assert_status(&gw.get("/hello").await, 200, "after recovery");
    assert_eq!(gw.metric(FALLBACK).await, 0.0);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_on_error_allow_a_dead_redis_admits_beyond_the_limit() {
    let _serial = SERIAL.lock().await;
    let mut redis = RedisServer::start();
    let gw = gateway(&config(
        &redis,
        "on_error = \"allow\"",
        "anonymous = { per_minute = 2 }",
    ))
    .await;
    for _ in 0..2 {
        assert_status(&gw.get("/hello").await, 200, "redis up");
    }
    redis.kill();
    for _ in 0..6 {
        let resp = gw.get("/hello").await;
        assert_status(&resp, 200, "fail open");
    }
    assert_status(&gw.readyz().await, 200, "allow keeps the replica ready");
    assert_eq!(gw.metric(FALLBACK).await, 1.0);

    redis.restart();
    until_recovered(&gw, "on_error = allow", |_| {
        let gw = &gw;
        async move { gw.metric(FALLBACK).await == 0.0 }
    })
    .await;
    // Limits apply again (the restarted Redis forgot the earlier counts).
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(gw.get_from("127.0.0.4", "/hello").await.status.as_u16());
    }
    assert_eq!(statuses, [200, 200, 429]);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_redis_never_makes_requests_hang() {
    let _serial = SERIAL.lock().await;
    let mut redis = RedisServer::start();
    // The default timeout (50 ms) and on_error (local). The manual clock says when
    // the open breaker sends a probe.
    let (clock, now_ms) = Clock::manual(support::t0());
    let gw = gateways::gateway_on(
        &config(&redis, "", "anonymous = { per_minute = 1000 }"),
        clock,
    )
    .await;
    assert_status(&gw.get("/hello").await, 200, "redis up");

    // Paused, Redis never answers: a request that waited for it would never be
    // answered (each request is bounded by the client's `within`), one that waits
    // the store's timeout is decided locally.
    redis.pause();
    for _ in 0..10 {
        let resp = gw.get("/hello").await;
        assert_status(&resp, 200, "decided locally");
    }
    // A concurrent burst: every request is answered while Redis stays paused.
    let addr = gw.addr;
    let burst: Vec<_> = (0..20)
        .map(|_| {
            tokio::spawn(async move {
                let resp = Req::get("/hello").send(addr).await;
                resp.status.as_u16()
            })
        })
        .collect();
    for task in burst {
        let status = within("burst", task).await.unwrap();
        assert_eq!(status, 200);
    }
    assert_eq!(gw.metric(FALLBACK).await, 1.0, "the breaker is open");
    // Time for the open breaker's probe: the first request is sent to Redis, times
    // out and is decided locally, as are the ones after it.
    now_ms.fetch_add(PROBE_AFTER_MS, Ordering::SeqCst);
    for _ in 0..3 {
        let resp = gw.get("/hello").await;
        assert_status(&resp, 200, "decided locally");
    }
    assert_eq!(gw.metric(FALLBACK).await, 1.0);
    assert!(gw.metric(REDIS_ERRORS).await > 0.0);

    redis.resume();
    until_recovered(&gw, "after SIGCONT", |resp| {
        let gw = &gw;
        // The next attempt may be the probe that closes the breaker.
        now_ms.fetch_add(PROBE_AFTER_MS, Ordering::SeqCst);
        async move {
            assert_status(&resp, 200, "recovering");
            gw.metric(FALLBACK).await == 0.0
        }
    })
    .await;
    let (keys, errors) = (redis.keys().len(), gw.store_errors());
    for _ in 0..3 {
        assert_status(&gw.get_from("127.0.0.3", "/hello").await, 200, "recovered");
    }
    assert_eq!(gw.store_errors(), errors, "errors after recovery");
    assert_eq!(
        redis.keys().len(),
        keys + 1,
        "127.0.0.3 is counted in redis"
    );
    gw.stop().await;
}

// ---- c. keys: TTLs and hash tags -------------------------------------------------------

/// The hash tag of a key: what is between its first `{` and the next `}`.
fn hash_tag(key: &str) -> &str {
    let open = key
        .find('{')
        .unwrap_or_else(|| panic!("no hash tag in {key}"));
    let close = key[open..]
        .find('}')
        .unwrap_or_else(|| panic!("unclosed hash tag in {key}"));
    &key[open + 1..open + close]
}

const TWO_POLICIES: &str = r#"
[policies.pooled]
anonymous = { per_second = 5, per_minute = 50, per_day = 1_000 }
total = { per_minute = 500 }

[policies.own]
anonymous = { per_minute = 5, per_hour = 50 }

[[routes]]
name = "pooled"
path_prefix = "/pooled"
respond = { status = 200, body = "pooled\n" }
policy = "pooled"

[[routes]]
name = "own"
path_prefix = "/own"
respond = { status = 200, body = "own\n" }
policy = "own"
"#;

fn two_policies(redis: &RedisServer, store: &str) -> String {
    format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\n{store}\n{TWO_POLICIES}",
        redis.url()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_expires_after_its_longest_window_and_a_total_shares_its_callers_hash_tag() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let gw = gateway(&two_policies(
        &redis,
        "on_error = \"deny\"\ntimeout = \"1s\"",
    ))
    .await;
    for ip in ["127.0.0.1", "127.0.0.2"] {
        for path in ["/pooled", "/own"] {
            assert_status(&gw.get_from(ip, path).await, 200, path);
        }
    }
    let keys = redis.keys();
    assert_eq!(keys.len(), 5, "2 callers x 2 policies + 1 total: {keys:?}");
    // Every key expires, and not before its longest window is over.
    for key in &keys {
        let ttl = redis.pttl(key);
        let tag = hash_tag(key);
        let (at_least, at_most) = if key.ends_with(":total") {
            // total: per_minute 500, kept in 480 ms buckets
            (55_000, 60_000 + 480 + 1_000)
        } else if keys.iter().filter(|k| hash_tag(k) == tag).count() > 1 {
            // pooled caller: per_day 1 000, kept in 691.2 s buckets
            (86_000_000, 86_400_000 + 691_200 + 1_000)
        } else {
            // own caller: per_hour 50, exact
            (3_590_000, 3_600_000 + 1_000)
        };
        assert!(
            ttl >= at_least && ttl <= at_most,
            "PTTL {key} = {ttl}, expected within [{at_least}, {at_most}]"
        );
    }
    // The pooled policy's callers and its total share one tag: one request's keys
    // are in one cluster slot. The own policy's callers each have their own tag.
    let totals: Vec<&String> = keys.iter().filter(|k| k.ends_with(":total")).collect();
    assert_eq!(totals.len(), 1, "{keys:?}");
    let pooled_tag = hash_tag(totals[0]);
    let pooled: Vec<&String> = keys.iter().filter(|k| hash_tag(k) == pooled_tag).collect();
    assert_eq!(pooled.len(), 3, "two callers and the total: {keys:?}");
    let mut own_tags: Vec<&str> = keys
        .iter()
        .map(|k| hash_tag(k))
        .filter(|tag| *tag != pooled_tag)
        .collect();
    own_tags.sort();
    own_tags.dedup();
    assert_eq!(
        own_tags.len(),
        2,
        "one tag per caller of the own policy: {keys:?}"
    );
    assert_eq!(gw.store_errors(), 0);
    gw.stop().await;
}

/// Redis Cluster refuses a script whose keys are not all in one slot (CROSSSLOT); a
/// one-node cluster holds every slot, so this checks exactly that one request's
/// keys (the ones sent with EVALSHA, not only those written) share a slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_redis_cluster_node_every_request_keys_share_one_slot() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start_cluster();
    let gw = gateway(&two_policies(
        &redis,
        "on_error = \"deny\"\ntimeout = \"1s\"",
    ))
    .await;
    for path in ["/pooled", "/own"] {
        let resp = gw.get(path).await;
        // Redis's own error counts name the refusal (CROSSSLOT); plain ERRs come
        // from this test's client probing CLIENT SETINFO, unknown before Redis 7.2.
        let errors: String = redis.query(redis::cmd("INFO").arg("errorstats"));
        let errors: Vec<&str> = errors
            .lines()
            .filter(|line| line.starts_with("errorstat_") && !line.starts_with("errorstat_ERR:"))
            .collect();
        assert_status(
            &resp,
            200,
            &format!(
                "{path} on a one-node Redis Cluster (store errors: {}; redis errors: {errors:?})",
                gw.store_errors()
            ),
        );
    }
    assert_eq!(gw.store_errors(), 0);
    assert_eq!(redis.keys().len(), 3, "{:?}", redis.keys());
    gw.stop().await;
}

// ---- d. NOSCRIPT -------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_script_flush_the_script_is_loaded_again() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let gw = gateway(&config(
        &redis,
        "on_error = \"deny\"\ntimeout = \"1s\"",
        "anonymous = { per_minute = 3 }",
    ))
    .await;
    assert_status(&gw.get("/hello").await, 200, "first request");
    let scripts = |redis: &RedisServer| -> i64 {
        let info: String = redis.query(redis::cmd("INFO").arg("memory"));
        sample(&info.replace(':', " "), "number_of_cached_scripts").unwrap_or(-1.0) as i64
    };
    // Two scripts: the limiter's, and the bans' (polled every 250 ms).
    let both_loaded = |what: &'static str| {
        let redis = &redis;
        within(what, async move {
            while scripts(redis) != 2 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    both_loaded("both scripts are loaded").await;
    redis.script_flush();
    for i in 0..2 {
        assert_status(
            &gw.get("/hello").await,
            200,
            &format!("request {i} after SCRIPT FLUSH"),
        );
    }
    both_loaded("both scripts were loaded again").await;
    assert_eq!(
        gw.store_errors(),
        0,
        "NOSCRIPT must not count as a store error"
    );
    // All three were counted in Redis (on_error = "deny": nothing is decided
    // anywhere else), so the fourth is refused, by Redis.
    gw.get("/hello").await.problem(429);
    assert_eq!(gw.store_errors(), 0);
    assert_eq!(redis.keys().len(), 1, "{:?}", redis.keys());
    gw.stop().await;
}

// ---- the admin API in fleet mode ------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_usage_shows_and_resets_the_shared_counts_from_any_replica() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let toml = config(
        &redis,
        "on_error = \"deny\"\ntimeout = \"1s\"",
        "anonymous = { per_minute = 5 }",
    );
    let (a, b) = (gateway(&toml).await, gateway(&toml).await);
    for _ in 0..3 {
        assert_status(&a.get("/hello").await, 200, "through replica a");
    }
    for (name, replica) in [("a", &a), ("b", &b)] {
        let usage = replica
            .admin(Req::get("/admin/usage?caller=ip:127.0.0.1"))
            .await;
        assert_status(&usage, 200, "/admin/usage");
        let json = usage.json();
        let minute = &json["policies"][0]["limits"][0];
        assert_eq!(minute["window"], "minute", "{json}");
        assert_eq!(
            minute["used"], 3,
            "replica {name}: /admin/usage must show the 3 requests counted in redis: {json}"
        );
    }
    // A reset through replica b frees the caller on replica a.
    let reset = b
        .admin(Req::new(
            http::Method::DELETE,
            "/admin/usage?caller=ip:127.0.0.1",
        ))
        .await;
    assert_status(&reset, 200, "DELETE /admin/usage");
    let mut statuses = Vec::new();
    for _ in 0..6 {
        statuses.push(a.get("/hello").await.status.as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429], "after the reset");
    a.stop().await;
    b.stop().await;
}

/// A Redis store that cannot be built at all (a URL the client rejects) refuses to
/// start with the reason, instead of counting in memory as if nothing were wrong. The
/// config compiler rejects such URLs first; this is the same rule one layer down, for
/// a config built in code.
#[tokio::test]
async fn a_redis_store_that_cannot_be_built_refuses_to_start() {
    let mut config = Config::parse(
        Path::new("fleet.toml"),
        "[[routes]]\nname = \"r\"\npath_prefix = \"/\"\nrespond = { status = 200 }\n",
    )
    .unwrap();
    config.store.backend = sluice::config::Backend::Redis {
        target: sluice::config::RedisTarget::Server(
            "redis://127.0.0.1:6379/notanumber".to_string(),
        ),
        on_error: sluice::config::OnError::Local,
        timeout: Duration::from_millis(50),
        ca_file: None,
        wait_replicas: 0,
    };
    let err = match sluice::app::start_local(config, Clock::system()).await {
        Ok(_) => panic!("a gateway started with an unusable redis url"),
        Err(err) => err.to_string(),
    };
    assert!(
        err.contains("cannot use redis at redis://127.0.0.1:6379/notanumber"),
        "{err}"
    );
}

// ---- bans shared by the fleet ---------------------------------------------------------

const ABNORMAL: &str = "https://iana.org/assignments/http-problem-types#abnormal-usage-detected";

/// The statuses of `count` requests for `/hello` from `ip` to `replica`, in order.
async fn statuses_of(replica: &Replica, ip: &str, count: usize) -> Vec<u16> {
    let mut statuses = Vec::new();
    for _ in 0..count {
        let resp = Req::get("/hello").from(ip).send(replica.addr).await;
        statuses.push(resp.status.as_u16());
    }
    statuses
}

/// Polls `replica` as `ip` until it answers `status`, for at most `within`; returns
/// how long that took.
async fn until_status(replica: &Replica, ip: &str, status: u16, within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let resp = Req::get("/hello").from(ip).send(replica.addr).await;
        if resp.status == status {
            if status == 403 {
                assert_eq!(resp.problem(403)["type"], ABNORMAL);
                assert!(resp.retry_after() >= 1);
            }
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "{ip} still got {} from a replica after {within:?}:\n{}",
            resp.status,
            replica.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Three `sluice run` replicas and one Redis: a ban earned through one replica is
/// enforced by every replica within a second; a manual ban made through one and a
/// lift through another reach all of them; the ban keys carry TTLs; and with Redis
/// dead and `on_error = "local"`, each replica bans on its own counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ban_earned_through_one_replica_is_enforced_by_every_replica_within_a_second() {
    let _serial = SERIAL.lock().await;
    let mut redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let body = format!(
        "{}\n[ban]\nafter = 4\nwithin = \"1m\"\nduration = \"10m\"\n",
        config(
            &redis,
            "on_error = \"local\"\ntimeout = \"100ms\"",
            "anonymous = { per_minute = 3 }",
        )
    );
    let mut replicas = Vec::new();
    for name in ["a", "b", "c"] {
        replicas.push(replica(dir.path(), name, &body).await);
    }
    let (a, b, c) = (&replicas[0], &replicas[1], &replicas[2]);

    // 127.0.0.7 spends its 3 through a, then ignores four 429s: banned.
    let statuses = statuses_of(a, "127.0.0.7", 7).await;
    assert_eq!(statuses, [200, 200, 200, 429, 429, 429, 429]);
    let on_a = until_status(a, "127.0.0.7", 403, support::WAIT).await;
    // Every other replica shuts it out too, within a second of the ban: the one
    // bound DESIGN promises for bans ("from every replica within 1 s").
    for other in [b, c] {
        let took = until_status(other, "127.0.0.7", 403, Duration::from_secs(1)).await;
        eprintln!("ban on a after {on_a:?}, on another replica after {took:?}");
    }
    // Each replica lists it, with the refusals that led to it.
    let listed = Req::get("/admin/bans").send(c.admin).await.json();
    let bans = listed["bans"].as_array().unwrap();
    assert_eq!(bans.len(), 1, "{listed}");
    assert_eq!(bans[0]["caller"], "ip:127.0.0.7");
    assert_eq!(bans[0]["reason"], "automatic");
    assert!(bans[0]["refusals"].as_u64().unwrap() >= 4, "{listed}");
    // The ban lives in Redis under the bans' hash tag, with a TTL near its duration.
    let ban_keys: Vec<String> = redis
        .keys()
        .into_iter()
        .filter(|k| k.starts_with("sluice:{sluice-bans}:"))
        .collect();
    assert!(!ban_keys.is_empty());
    for key in &ban_keys {
        let ttl: i64 = redis.query(redis::cmd("PTTL").arg(key));
        assert!(ttl > 0, "{key} has no TTL ({ttl})");
        assert!(ttl <= 86_400_000 + 600_000 + 60_000, "{key}: {ttl} ms");
    }

    // Lifted through b: a and c serve it again (its minute is still spent: 429).
    let lifted = Req::new(http::Method::DELETE, "/admin/bans?caller=ip:127.0.0.7")
        .send(b.admin)
        .await;
    assert_eq!(lifted.status, 200, "{}", lifted.text());
    for other in [a, c] {
        until_status(other, "127.0.0.7", 429, support::WAIT).await;
    }

    // A manual ban through c reaches a and b.
    let made = Req::post(
        "/admin/bans",
        r#"{"caller": "ip:127.0.0.9", "duration": "5m", "reason": "scraper"}"#,
    )
    .header("content-type", "application/json")
    .send(c.admin)
    .await;
    assert_eq!(made.status, 201, "{}", made.text());
    for other in [a, b] {
        until_status(other, "127.0.0.9", 403, Duration::from_secs(1)).await;
    }
    let active = |r: &Replica| {
        let admin = r.admin;
        async move {
            let metrics = Req::get("/metrics").send(admin).await.text();
            sample(&metrics, "sluice_bans_active")
        }
    };
    assert_eq!(active(a).await, Some(1.0));

    // Redis dies; with on_error = "local" each replica counts and bans on its own.
    redis.kill();
    let statuses = statuses_of(b, "127.0.0.11", 8).await;
    assert_eq!(
        statuses,
        [200, 200, 200, 429, 429, 429, 429, 403],
        "local ban on b"
    );
    // The manual ban made while Redis was up is still enforced from memory: the
    // very next request is refused.
    let resp = Req::get("/hello").from("127.0.0.9").send(a.addr).await;
    assert_eq!(
        resp.problem(403)["type"],
        ABNORMAL,
        "the ban held from memory"
    );
    // a never heard of b's local ban: it counts 127.0.0.11 from zero.
    let resp = Req::get("/hello").from("127.0.0.11").send(a.addr).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
}

// ---- the store's own thread and upkeep --------------------------------------------------

/// The Redis store is tied to no runtime that used it: a store opened and first used
/// on one runtime decides from another while the first is idle, and keeps deciding
/// after the first is shut down (as a worker's is), every decision from Redis.
#[test]
fn a_redis_store_keeps_deciding_after_the_runtime_that_first_used_it_is_gone() {
    use sluice::config::{Backend, OnError, StoreConfig};
    use sluice::limit::{Now, Report, Window, quota};
    use sluice::store::{Store, Verdict};

    let _serial = SERIAL.blocking_lock();
    let redis = RedisServer::start();
    let config = StoreConfig {
        backend: Backend::Redis {
            target: sluice::config::RedisTarget::Server(redis.url()),
            // A decision that does not come from Redis is Unavailable.
            on_error: OnError::Deny,
            timeout: Duration::from_secs(2),
            ca_file: None,
            wait_replicas: 0,
        },
        max_keys: 1_000,
        state_file: None,
    };
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let first = runtime();
    let clock = Clock::system();
    let store = {
        let _inside = first.enter();
        Store::open(&config, clock.now_ms()).expect("a redis store")
    };
    let scope = store.scope("lifetime", "anonymous", vec![quota(Window::Minute, 3)], &[]);
    let decide = |runtime: &tokio::runtime::Runtime| {
        runtime.block_on(async {
            let mut report = Report::default();
            let now = Now::sliding(clock.now_ms());
            let verdict = store.decide(&scope, 7, &now, 1, &mut report).await;
            (verdict, report.iter().map(|s| s.used).collect::<Vec<_>>())
        })
    };

    // Each report says what was used before the request.
    assert_eq!(decide(&first), (Verdict::Admitted, vec![0]));
    let second = runtime();
    assert_eq!(decide(&second), (Verdict::Admitted, vec![1]));
    drop(first);
    assert_eq!(decide(&second), (Verdict::Admitted, vec![2]));
    assert_eq!(decide(&second), (Verdict::Limited, vec![3]));
    assert_eq!(redis.keys().len(), 1, "the caller is counted in redis");
    assert_eq!(store.errors(), 0);
    assert!(!store.in_fallback());
}

/// A ban the fleet makes from this replica's refusals comes back through the store's
/// upkeep (the ban sync): counted in `sluice_bans_total` and enforced here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ban_made_in_redis_from_this_replicas_refusals_is_counted_and_enforced() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let body = format!(
        "{}\n[ban]\nafter = 2\nwithin = \"1m\"\nduration = \"10m\"\n",
        config(&redis, "", "anonymous = { per_minute = 1 }")
    );
    let gw = gateway(&body).await;
    let banned = "sluice_bans_total{reason=\"automatic\"}";
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(gw.get_from("127.0.0.21", "/hello").await.status.as_u16());
    }
    assert_eq!(statuses, [200, 429, 429]);
    let started = Instant::now();
    loop {
        let resp = gw.get_from("127.0.0.21", "/hello").await;
        if resp.status == 403 {
            break;
        }
        assert_status(&resp, 429, "before the ban reaches this replica");
        // DESIGN's bound for a ban to reach every replica is 1 s; 2 s leaves the
        // loaded machine a second of margin.
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "no ban within 2 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(gw.metric(banned).await, 1.0);
    gw.stop().await;
}

// ---- rediss:// and ca_file -------------------------------------------------------------

/// A redis-server speaking TLS on a port of its own (its plain port stays for the
/// test's own commands), with a certificate for `localhost` from a private CA whose
/// PEM is at the returned path.
fn tls_redis(dir: &Path) -> (RedisServer, u16, PathBuf) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let path = |name: &str| dir.join(name).to_string_lossy().into_owned();
    std::fs::write(path("ca.pem"), ca.pem()).unwrap();
    std::fs::write(path("redis.pem"), cert.pem()).unwrap();
    std::fs::write(path("redis-key.pem"), key.serialize_pem()).unwrap();
    let tls_port = free_port();
    let redis = RedisServer::start_args(
        [
            "--tls-port",
            &tls_port.to_string(),
            "--tls-cert-file",
            &path("redis.pem"),
            "--tls-key-file",
            &path("redis-key.pem"),
            "--tls-ca-cert-file",
            &path("ca.pem"),
            "--tls-auth-clients",
            "no",
        ]
        .map(String::from)
        .to_vec(),
    );
    (redis, tls_port, dir.join("ca.pem"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rediss_store_trusts_its_ca_file_and_no_other() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let (redis, tls_port, ca) = tls_redis(dir.path());
    let store = |ca_line: &str| {
        format!(
            "[store]\nbackend = \"redis\"\nurl = \"rediss://localhost:{tls_port}/0\"\n{ca_line}\n\
             on_error = \"deny\"\ntimeout = \"1s\"\n\n[policies.shared]\n\
             anonymous = {{ per_minute = 3 }}\n{ROUTE}"
        )
    };
    // The private CA is trusted: decisions come from Redis (deny would be 503).
    let gw = gateway(&store(&format!("ca_file = \"{}\"", ca.display()))).await;
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(gw.get("/hello").await.status.as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 429]);
    assert_eq!(redis.keys().len(), 1, "{:?}", redis.keys());
    gw.stop().await;
    // Without it the system's roots do not know the CA: no decision from Redis.
    let gw = gateway(&store("")).await;
    assert_status(&gw.get("/hello").await, 503, "an untrusted certificate");
    assert!(gw.store_errors() > 0);
    gw.stop().await;
}
