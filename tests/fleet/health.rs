//! Store health under faults that come and go: a Redis that stalls for a moment every
//! second, and (on a Cluster) a master that dies or freezes while the others serve,
//! each through the `sluice` binary run with a config file ([`binary`]). Each test
//! prints what it measured (`cargo test --test fleet -- health:: --nocapture`); the
//! assertions are about answers and counters, never about how long anything took.

use crate::SERIAL;
use crate::support::gateways;
use crate::support::redis_server;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use gateways::{Binary, binary, load, policies, sample, status};
use redis_server::RedisServer;
use redis_server::cluster::RedisCluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stalls_of_a_fifth_of_each_second_cost_the_stalled_requests_not_all_of_them() {
    let _serial = SERIAL.lock().await;
    let mut redis = RedisServer::start();
    let toml = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\non_error = \"deny\"\ntimeout = \"120ms\"\n{}",
        redis.url(),
        policies(1_000_000)
    );
    // The timeout is shorter than a stall (each stall's calls fail), and long enough
    // that a busy machine (the test suite's other crates building and running) does
    // not make calls between the stalls fail too.
    let gw = binary(&toml).await;
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
    let errors = gw.store_errors().await;
    let answered = tally.ok + tally.limited + tally.unavailable + tally.other;
    eprintln!(
        "stalls of 200 ms every 1 s, on_error = deny: {} of {answered} answers 503 ({:.1} %), \
         {} admitted; {} store errors; {tally:?}",
        tally.unavailable,
        100.0 * tally.unavailable as f64 / answered as f64,
        tally.ok,
        errors,
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

/// `/wide`: each caller 100 000 a minute (never limited here), counters under the
/// caller's own hash tag, so callers spread over the masters.
const WIDE: &str = r#"
[policies.wide]
anonymous = { per_minute = 100_000 }

[[routes]]
name = "wide"
path_prefix = "/wide"
respond = { status = 200 }
policy = "wide"
"#;

/// What the callers of one master saw during a master's failover.
#[derive(Debug, Default)]
struct Side {
    ok: usize,
    unavailable: usize,
    other: usize,
    /// First and last 503, from the kill.
    gap: Option<(Duration, Duration)>,
    /// The status of the last request sent.
    last: u16,
}

/// One request per caller through `gw`, in turn, noting the key it added and the
/// master serving that key's slot (as `CLUSTER SLOTS` says): the caller's home.
async fn homes(
    gw: &Binary,
    cluster: &RedisCluster,
    callers: &[String],
) -> HashMap<String, (usize, u16)> {
    let all_keys = || -> HashSet<String> {
        (cluster.live())
            .flat_map(|node| node.keys())
            .filter(|key| key.starts_with("sluice:{") && key.ends_with('}'))
            .collect()
    };
    let mut known = all_keys();
    let mut homes = HashMap::new();
    for ip in callers {
        assert_eq!(
            status(gw.addr, ip, "/wide").await,
            200,
            "{ip} before the kill"
        );
        let now = all_keys();
        let added: Vec<&String> = now.difference(&known).collect();
        assert_eq!(added.len(), 1, "{ip} added one key: {added:?}");
        let slot = cluster.slot(added[0]);
        homes.insert(ip.clone(), (cluster.master_of_slot(slot), slot));
        known = now;
    }
    homes
}

/// Sends `/wide` from `callers` in turn, `per_second` a second, until `stop`; each
/// answer with its caller and when it came, from `from`.
async fn round_robin(
    addr: SocketAddr,
    callers: Vec<String>,
    per_second: u32,
    from: Instant,
    stop: Arc<AtomicBool>,
) -> Vec<(String, u16, Duration)> {
    let mut tick = tokio::time::interval(Duration::from_secs(1) / per_second);
    let mut tasks = Vec::new();
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let ip = callers[n % callers.len()].clone();
        n += 1;
        tasks.push(tokio::spawn(async move {
            let code = status(addr, &ip, "/wide").await;
            (ip, code, from.elapsed())
        }));
    }
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(
            crate::support::within("a load request", task)
                .await
                .unwrap(),
        );
    }
    answers
}

/// What a master's fault does to one master's callers.
enum Fault {
    /// `kill -9`, until the cluster promotes its replica.
    Kill,
    /// SIGSTOP for this long, then SIGCONT (shorter than the node timeout: no
    /// failover).
    Freeze(Duration),
}

/// What the callers of a dying master and of the others saw.
struct Outcome {
    /// The faulty master's callers.
    dead: Side,
    /// The other masters' callers.
    healthy: Side,
    /// Failed Redis calls (each waited for an answer) from the fault to the end.
    errors: u64,
    /// From the kill until a replica was promoted (a kill only).
    promoted: Option<Duration>,
    /// `sluice_store_breaker_open` showed the faulty master's breaker open (1) at
    /// one of the scrapes made during the fault.
    open_seen: bool,
    /// Masters whose `sluice_store_breaker_open` was 1 at the end.
    open_after: usize,
    /// The gateway's log (warnings and errors), for a failed assertion to show.
    log: String,
}

/// Whether `/metrics` shows the breaker of the master on `port` open.
async fn breaker_open(gw: &Binary, port: u16) -> bool {
    let name = format!("sluice_store_breaker_open{{node=\"127.0.0.1:{port}\"}}");
    sample(&gw.metrics().await, &name) == Some(1.0)
}

/// The masters `/metrics` shows with their breaker open.
async fn breakers_open(gw: &Binary) -> usize {
    (gw.metrics().await.lines())
        .filter(|line| line.starts_with("sluice_store_breaker_open{") && line.ends_with(" 1"))
        .count()
}

/// A Cluster of 3 masters and 3 replicas (`cluster-replica-validity-factor 0`,
/// `cluster-require-full-coverage` as `full_coverage`), a gateway with
/// `on_error = "deny"` and `timeout`, 150 requests a second from 30 callers spread
/// over the masters; after 2 s the master of the most callers suffers `fault`, and
/// the load runs 3 s after it is over.
async fn master_fault(full_coverage: &str, timeout: &str, fault: Fault) -> Outcome {
    let mut cluster = RedisCluster::start_with(
        3,
        1,
        &[
            "--cluster-replica-validity-factor",
            "0",
            "--cluster-require-full-coverage",
            full_coverage,
        ],
    );
    let toml = format!(
        "[store]\nbackend = \"redis\"\n{}\non_error = \"deny\"\ntimeout = \"{timeout}\"\n{WIDE}",
        cluster.seeds_toml()
    );
    let gw = binary(&toml).await;
    let callers: Vec<String> = (1..=30).map(|i| format!("127.0.6.{i}")).collect();
    let homes = homes(&gw, &cluster, &callers).await;
    let (victim, victim_slot) = *homes
        .values()
        .max_by_key(|&&(m, _)| homes.values().filter(|&&(h, _)| h == m).count())
        .unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let running = tokio::spawn(round_robin(
        gw.addr,
        callers.clone(),
        150,
        start,
        stop.clone(),
    ));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let errors_before = gw.store_errors().await;
    let hit = start.elapsed();
    let (mut promoted, mut open_seen) = (None, false);
    let port = cluster.nodes[victim].port();
    match fault {
        Fault::Kill => {
            cluster.nodes[victim].kill();
            let deadline = Instant::now() + Duration::from_secs(20);
            while cluster.master_of_slot(victim_slot) == victim {
                assert!(Instant::now() < deadline, "nobody promoted within 20 s");
                open_seen |= breaker_open(&gw, port).await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            promoted = Some(start.elapsed() - hit);
        }
        Fault::Freeze(how_long) => {
            cluster.nodes[victim].pause();
            let until = Instant::now() + how_long;
            while Instant::now() < until {
                open_seen |= breaker_open(&gw, port).await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            cluster.nodes[victim].resume();
        }
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    let answers = running.await.unwrap();
    let errors = gw.store_errors().await - errors_before;
    let open_after = breakers_open(&gw).await;
    let log = gw.log();

    let (mut dead, mut healthy) = (Side::default(), Side::default());
    for (ip, code, at) in &answers {
        let side = match homes[ip].0 == victim {
            true => &mut dead,
            false => &mut healthy,
        };
        match code {
            200 => side.ok += 1,
            503 => {
                side.unavailable += 1;
                let at = at.saturating_sub(hit);
                side.gap = Some(side.gap.map_or((at, at), |(f, l)| (f.min(at), l.max(at))));
            }
            _ => side.other += 1,
        }
        side.last = *code;
    }
    gw.stop().await;
    Outcome {
        dead,
        healthy,
        errors,
        promoted,
        open_seen,
        open_after,
        log,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_master_refuses_only_its_slots_callers_fast_and_the_others_stay_in_redis() {
    let _serial = SERIAL.lock().await;
    let Outcome {
        dead,
        healthy,
        errors,
        promoted,
        open_seen,
        open_after,
        log,
    } = master_fault("no", "250ms", Fault::Kill).await;
    eprintln!(
        "cluster master kill (full coverage no, on_error = deny, timeout 250 ms, 150 req/s): \
         replica promoted {promoted:?} after the kill; dead master's callers {dead:?}; \
         other callers {healthy:?}; store errors during the failover {errors}; \
         its breaker shown open {open_seen}, breakers open at the end {open_after}"
    );
    // Operators see which master's breaker opened, and that none is open after.
    assert!(
        open_seen,
        "sluice_store_breaker_open showed the dead master's"
    );
    assert_eq!(open_after, 0, "no breaker open once the replica serves");
    assert_eq!(
        healthy.unavailable + healthy.other,
        0,
        "the healthy masters' callers: {healthy:?}; the gateway's log:\n{log}"
    );
    assert!(healthy.ok > 0);
    assert_eq!(dead.other, 0, "{dead:?}");
    assert!(dead.unavailable > 0, "the kill was seen by its callers");
    // Fail fast: a 503 that waited for Redis is a store error (a failed call). Most
    // of the dead master's 503s never asked it: its breaker was open.
    assert!(
        errors * 2 < dead.unavailable as u64,
        "{errors} failed calls for {} 503s: each waited for the dead master",
        dead.unavailable
    );
    // Its callers are served by the promoted replica (the slot map read again).
    assert_eq!(
        dead.last, 200,
        "the new master serves the dead one's callers"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_full_coverage_the_cluster_refuses_every_slot_until_the_promotion_then_all_recover() {
    let _serial = SERIAL.lock().await;
    let Outcome {
        dead,
        healthy,
        errors,
        promoted,
        ..
    } = master_fault("yes", "250ms", Fault::Kill).await;
    eprintln!(
        "cluster master kill (full coverage yes, on_error = deny, timeout 250 ms, 150 req/s): \
         replica promoted {promoted:?} after the kill; dead master's callers {dead:?}; \
         other callers {healthy:?}; store errors during the failover {errors}"
    );
    // Redis itself refuses the healthy masters' slots (CLUSTERDOWN) while the dead
    // master is flagged failing: what they see is Redis's choice, not sluice's.
    assert_eq!(healthy.other + dead.other, 0, "{healthy:?} {dead:?}");
    assert!(dead.unavailable > 0, "the kill was seen by its callers");
    assert_eq!(
        (dead.last, healthy.last),
        (200, 200),
        "everyone served after it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_frozen_master_refuses_only_its_slots_callers_while_it_is_frozen() {
    let _serial = SERIAL.lock().await;
    let Outcome {
        dead,
        healthy,
        errors,
        open_seen,
        open_after,
        log,
        ..
    } = master_fault("no", "250ms", Fault::Freeze(Duration::from_millis(600))).await;
    eprintln!(
        "cluster master frozen 600 ms (SIGSTOP, on_error = deny, timeout 250 ms, 150 req/s): \
         its callers {dead:?}; other callers {healthy:?}; store errors {errors}; \
         its breaker shown open {open_seen}, breakers open at the end {open_after}"
    );
    assert_eq!(open_after, 0, "no breaker open once it answers again");
    assert_eq!(healthy.other + dead.other, 0, "{healthy:?} {dead:?}");
    assert!(dead.unavailable > 0, "the freeze was seen by its callers");
    // Calls in flight are counted per master: the frozen master's calls, waiting
    // for their timeout, hold only its own slots' requests.
    assert_eq!(
        healthy.unavailable, 0,
        "the healthy masters' callers: {healthy:?}, the frozen one's {dead:?}; \
         the gateway's log:\n{log}"
    );
    assert_eq!(dead.last, 200, "served again once it answers");
}
