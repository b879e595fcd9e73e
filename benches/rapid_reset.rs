//! A well-behaved client's latency while other clients flood sluice with HTTP/2
//! rapid resets (CVE-2023-44487): HEADERS then RST_STREAM, as fast as sluice takes
//! them, reconnecting at once whenever sluice closes or refuses the connection.
//!
//! An upstream in this process answers after UPSTREAM_MS and counts the requests and
//! connections that reach it. The well-behaved client sends GETs one after another on
//! GOOD_CONNECTIONS HTTP/1.1 keep-alive connections from 127.0.0.3 for SECONDS,
//! first alone (the baseline), then while ATTACKERS flooding clients run, attacker
//! `i` from 127.0.1.`i+1` (sluice refuses a flooder's address new connections for a
//! while, so each needs an address of its own). Printed: the good client's p50/p99
//! and requests/s in both phases and their ratio (the target: p99 under attack within
//! 2x the baseline), the streams the attackers wrote and reset (on a refused
//! connection they go nowhere), the connections they made, and what reached the
//! upstream.
//!
//! Run through `benches/proxy/rapid-reset.sh` (it builds sluice), or
//! `SLUICE_BIN=target/dist/sluice cargo bench --bench rapid_reset`.
//! Environment: SLUICE_BIN, SECONDS [10], ATTACKERS [2], GOOD_CONNECTIONS [4],
//! UPSTREAM_MS [2], BATCH [50] (streams sent before they are all reset), RATE [0]
//! (streams per second per attacker; 0: as fast as sluice takes them). The attack
//! the edge issue describes, one connection resetting 10 000 streams in 5 s, is
//! `ATTACKERS=1 RATE=2000 SECONDS=5`.

#![allow(clippy::unwrap_used)] // a benchmark fails by panicking

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpSocket, TcpStream};

mod support;

use support::{Gateway, env, free_port, percentile, wait_ready};

#[derive(Default)]
struct Seen {
    requests: AtomicUsize,
    connections: AtomicUsize,
    /// Requests of the flood (`/flood`), among `requests`.
    flood: AtomicUsize,
}

async fn upstream(delay: Duration, seen: Arc<Seen>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            seen.connections.fetch_add(1, Ordering::Relaxed);
            let seen = seen.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request: http::Request<_>| {
                    seen.requests.fetch_add(1, Ordering::Relaxed);
                    if request.uri().path() == "/flood" {
                        seen.flood.fetch_add(1, Ordering::Relaxed);
                    }
                    async move {
                        tokio::time::sleep(delay).await;
                        Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                            Bytes::from_static(b"{\"ok\":true}\n"),
                        )))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

async fn start_sluice(upstream: SocketAddr, dir: &std::path::Path) -> (Gateway, SocketAddr) {
    let bin = std::env::var("SLUICE_BIN").unwrap_or_else(|_| "target/dist/sluice".into());
    let (port, admin) = (free_port(), free_port());
    let config = format!(
        r#"
[server]
listen = "127.0.0.1:{port}"
worker_threads = 1
[admin]
listen = "127.0.0.1:{admin}"
[log]
access = "off"
[upstreams.up]
targets = ["http://{upstream}"]
[policies.api]
anonymous = {{ per_second = 1_000_000 }}
[[routes]]
name = "all"
path_prefix = "/"
upstream = "up"
policy = "api"
"#
    );
    let path = dir.join("gateway.toml");
    std::fs::write(&path, config).unwrap();
    let sluice = Gateway(
        Command::new(&bin)
            .args(["run", "-c"])
            .arg(&path)
            .env(
                "SLUICE_LOG",
                std::env::var("SLUICE_LOG").unwrap_or_else(|_| "error".into()),
            )
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {bin}: {e}")),
    );
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    wait_ready(addr).await;
    (sluice, addr)
}

/// A connection to `addr` from `from`.
async fn connect_from(addr: SocketAddr, from: IpAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from, 0))?;
    socket.connect(addr).await
}

/// The well-behaved client's address.
const GOOD: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3));

/// Sequential GETs on `connections` keep-alive connections until `stop`; latencies.
async fn good_client(addr: SocketAddr, connections: u64, stop: Arc<AtomicBool>) -> Vec<Duration> {
    let tasks: Vec<_> = (0..connections)
        .map(|_| {
            let stop = stop.clone();
            tokio::spawn(async move {
                let tcp = connect_from(addr, GOOD).await.unwrap();
                tcp.set_nodelay(true).unwrap();
                let (mut sender, connection) =
                    hyper::client::conn::http1::handshake(TokioIo::new(tcp))
                        .await
                        .unwrap();
                tokio::spawn(connection);
                let mut latencies = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let request = http::Request::get("/good")
                        .header("host", "bench")
                        .body(Empty::<Bytes>::new())
                        .unwrap();
                    let started = Instant::now();
                    sender.ready().await.unwrap();
                    let response = sender.send_request(request).await.unwrap();
                    assert_eq!(response.status(), 200);
                    response.into_body().collect().await.unwrap();
                    latencies.push(started.elapsed());
                }
                latencies
            })
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    all.sort();
    all
}

#[derive(Default)]
struct Attack {
    streams: AtomicUsize,
    connections: AtomicUsize,
}

/// From `from`: HEADERS then RST_STREAM in batches of `batch`, reconnecting when
/// closed.
async fn attacker(
    addr: SocketAddr,
    from: IpAddr,
    (batch, rate): (u64, u64),
    stop: Arc<AtomicBool>,
    attack: Arc<Attack>,
) {
    let started = tokio::time::Instant::now();
    let mut sent = 0;
    while !stop.load(Ordering::Relaxed) {
        let Ok(tcp) = connect_from(addr, from).await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        attack.connections.fetch_add(1, Ordering::Relaxed);
        let Ok((mut client, connection)) = h2::client::handshake(tcp).await else {
            continue;
        };
        let driver = tokio::spawn(connection);
        'connection: while !stop.load(Ordering::Relaxed) {
            let mut streams = Vec::new();
            for _ in 0..batch {
                let ready = tokio::time::timeout(Duration::from_secs(1), client.clone().ready());
                let Ok(Ok(mut ready)) = ready.await else {
                    break 'connection;
                };
                let request = http::Request::get("http://bench/flood").body(()).unwrap();
                let Ok((_, stream)) = ready.send_request(request, true) else {
                    break 'connection;
                };
                streams.push(stream);
                client = ready;
            }
            // Long enough for sluice to have started on them, shorter than the upstream.
            tokio::time::sleep(Duration::from_micros(500)).await;
            attack.streams.fetch_add(streams.len(), Ordering::Relaxed);
            for mut stream in streams {
                stream.send_reset(h2::Reason::CANCEL);
            }
            sent += batch;
            if rate > 0 {
                let due = started + Duration::from_secs_f64(sent as f64 / rate as f64);
                tokio::time::sleep_until(due).await;
            }
        }
        driver.abort();
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let seconds = Duration::from_secs(env("SECONDS", 10));
    let attackers = env("ATTACKERS", 2);
    let good = env("GOOD_CONNECTIONS", 4);
    let batch = (env("BATCH", 50), env("RATE", 0));
    let seen = Arc::new(Seen::default());
    let up = upstream(Duration::from_millis(env("UPSTREAM_MS", 2)), seen.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let (_sluice, addr) = start_sluice(up, dir.path()).await;

    let phase = |attack: bool, seconds: Duration| {
        let seen = seen.clone();
        async move {
            let stop = Arc::new(AtomicBool::new(false));
            let flood = Arc::new(Attack::default());
            let before = (
                seen.requests.load(Ordering::Relaxed),
                seen.connections.load(Ordering::Relaxed),
            );
            let attackers: Vec<_> = (0..if attack { attackers } else { 0 })
                .map(|i| {
                    let from = IpAddr::V4(Ipv4Addr::new(127, 0, 1, i as u8 + 1));
                    tokio::spawn(attacker(addr, from, batch, stop.clone(), flood.clone()))
                })
                .collect();
            let client = tokio::spawn(good_client(addr, good, stop.clone()));
            tokio::time::sleep(seconds).await;
            stop.store(true, Ordering::Relaxed);
            let latencies = client.await.unwrap();
            for task in attackers {
                let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
            }
            let reached = (
                seen.requests.load(Ordering::Relaxed) - before.0,
                seen.connections.load(Ordering::Relaxed) - before.1,
            );
            (latencies, flood, reached)
        }
    };
    // Warm-up, then the baseline, then the attack.
    phase(false, Duration::from_secs(1)).await;
    let (baseline, _, base_reached) = phase(false, seconds).await;
    let (attacked, flood, reached) = phase(true, seconds).await;
    println!(
        "good client, {good} keep-alive connections, {}s per phase, upstream {} ms",
        seconds.as_secs(),
        env("UPSTREAM_MS", 2)
    );
    let report = |phase: &str, latencies: &[Duration], (requests, connections): (usize, usize)| {
        println!(
            "  {phase:<13} {:>8.0} req/s  p50 {:.2} ms  p99 {:.2} ms  (upstream: {requests} requests, {connections} connections)",
            latencies.len() as f64 / seconds.as_secs_f64(),
            percentile(latencies, 0.50),
            percentile(latencies, 0.99),
        );
    };
    report("baseline:", &baseline, base_reached);
    report("under attack:", &attacked, reached);
    let ratio = percentile(&attacked, 0.99) / percentile(&baseline, 0.99);
    println!(
        "  p99 under attack / baseline: {ratio:.2}x (target <= 2x)  {}",
        if ratio <= 2.0 { "meets" } else { "misses" }
    );
    println!(
        "attack: {attackers} flooding clients wrote and reset {} streams over {} connections; {} reached the upstream (sluice cuts a connection at its 100th abandoned request, then refuses its address new connections: 1 s, doubling at each repeat)",
        flood.streams.load(Ordering::Relaxed),
        flood.connections.load(Ordering::Relaxed),
        seen.flood.load(Ordering::Relaxed),
    );
}
