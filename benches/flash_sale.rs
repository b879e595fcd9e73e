//! The flash sale of DESIGN.md through sluice and through nginx, in one run.
//!
//! A shop upstream (in this process) takes 50 ms an order and counts what reaches it:
//! the most orders in the works at once, and when each arrived. Each gateway protects
//! `POST /orders` with 1 order a second and 5 a minute per customer (by API key),
//! 2 000 a second in total and 200 in flight; then CALLERS customers send two orders
//! each, all at once, ROUNDS times (with a pause so per-customer windows empty).
//!
//! Printed per gateway (medians over the rounds): goodput (orders that reached the shop
//! per second of burst), p50/p99 of admitted (200) and of refused (429/503) answers, the
//! shop's peak in-flight, and the orders over the limits: those that arrived while 200
//! were already in the works, plus those that made some one-second window exceed 2 000.
//!
//! sluice: `concurrency = { max = 200, queue = 1_000, queue_timeout = "2s" }`.
//! nginx:  `limit_req` per key (1 r/s nodelay; 5 r/m with `burst=4 nodelay`, its nearest
//!         to "5 a minute"), a total `limit_req` of 2000 r/s with `burst=1000` (its queue:
//!         excess requests are delayed), and `limit_conn` 200; 429 and 503 statuses.
//!
//! Run through `benches/proxy/flash-sale.sh` (it builds sluice and installs nginx), or
//! `SLUICE_BIN=target/dist/sluice cargo bench --bench flash_sale`.
//! Environment: SLUICE_BIN, NGINX [nginx], CALLERS [3000], ROUNDS [3], SKIP (sluice|nginx).

#![allow(clippy::unwrap_used)] // a benchmark fails by panicking

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod support;

use support::{Gateway, env, free_port, percentile, wait_ready};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const PER_SECOND_TOTAL: usize = 2_000;
const MAX_IN_FLIGHT: usize = 200;
const ORDER_MS: u64 = 50;

/// What the shop saw.
#[derive(Default)]
struct Shop {
    in_flight: AtomicUsize,
    peak: AtomicUsize,
    /// Orders that arrived while MAX_IN_FLIGHT were already in the works.
    over_in_flight: AtomicUsize,
    arrivals: Mutex<Vec<Instant>>,
}

impl Shop {
    fn reset(&self) {
        self.peak.store(0, Ordering::SeqCst);
        self.over_in_flight.store(0, Ordering::SeqCst);
        self.arrivals.lock().unwrap().clear();
    }

    /// Orders that made a one-second window hold more than PER_SECOND_TOTAL.
    fn over_rate(&self) -> usize {
        let mut arrivals = self.arrivals.lock().unwrap().clone();
        arrivals.sort();
        let mut start = 0;
        let mut over = 0;
        for (i, t) in arrivals.iter().enumerate() {
            while t.duration_since(arrivals[start]) >= Duration::from_secs(1) {
                start += 1;
            }
            if i + 1 - start > PER_SECOND_TOTAL {
                over += 1;
            }
        }
        over
    }
}

/// The shop: every request takes ORDER_MS, answered `200 ordered`.
async fn shop(shop: Arc<Shop>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                continue;
            };
            let shop = shop.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let mut filled = 0;
                loop {
                    // One request at a time on a keep-alive connection.
                    let Some(end) = head_end(&buf[..filled]) else {
                        match stream.read(&mut buf[filled..]).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => filled += n,
                        }
                        if filled == buf.len() {
                            return;
                        }
                        continue;
                    };
                    let body = content_length(&buf[..end]);
                    while filled < end + body {
                        match stream.read(&mut buf[filled..]).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => filled += n,
                        }
                    }
                    let before = shop.in_flight.fetch_add(1, Ordering::SeqCst);
                    shop.peak.fetch_max(before + 1, Ordering::SeqCst);
                    if before >= MAX_IN_FLIGHT {
                        shop.over_in_flight.fetch_add(1, Ordering::SeqCst);
                    }
                    shop.arrivals.lock().unwrap().push(Instant::now());
                    tokio::time::sleep(Duration::from_millis(ORDER_MS)).await;
                    shop.in_flight.fetch_sub(1, Ordering::SeqCst);
                    let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 7\r\n\r\nordered";
                    if stream.write_all(answer).await.is_err() {
                        return;
                    }
                    buf.copy_within(end + body..filled, 0);
                    filled -= end + body;
                }
            });
        }
    });
    addr
}

fn head_end(bytes: &[u8]) -> Option<usize> {
    bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| i + 4)
}

fn content_length(head: &[u8]) -> usize {
    let text = String::from_utf8_lossy(head).to_ascii_lowercase();
    text.lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// One order from `key`: its status and how long the answer took.
async fn order(addr: SocketAddr, key: usize) -> (u16, Duration) {
    let started = Instant::now();
    let request = format!(
        "POST /orders HTTP/1.1\r\nHost: shop\r\nx-api-key: key-{key}\r\n\
         content-length: 2\r\nconnection: close\r\n\r\n{{}}"
    );
    let Ok(mut stream) = TcpStream::connect(addr).await else {
        return (0, started.elapsed());
    };
    if stream.write_all(request.as_bytes()).await.is_err() {
        return (0, started.elapsed());
    }
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut answer)).await;
    let status = answer
        .get(9..12)
        .and_then(|s| std::str::from_utf8(s).ok())
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, started.elapsed())
}

struct Round {
    goodput: f64,
    admitted: Vec<Duration>,
    refused: Vec<Duration>,
    other: usize,
    peak: usize,
    over: usize,
}

async fn burst(addr: SocketAddr, callers: usize, shop: &Shop) -> Round {
    shop.reset();
    let started = Instant::now();
    let orders: Vec<_> = (0..2 * callers)
        .map(|i| tokio::spawn(order(addr, i % callers)))
        .collect();
    let (mut admitted, mut refused, mut other) = (Vec::new(), Vec::new(), 0);
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    for order in orders {
        let (status, took) = order.await.unwrap();
        *statuses.entry(status).or_default() += 1;
        match status {
            200 => admitted.push(took),
            429 | 503 => refused.push(took),
            _ => other += 1,
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    if std::env::var_os("VERBOSE").is_some() {
        eprintln!("  statuses {statuses:?} in {elapsed:.2} s");
    }
    admitted.sort();
    refused.sort();
    Round {
        goodput: admitted.len() as f64 / elapsed,
        admitted,
        refused,
        other,
        peak: shop.peak.load(Ordering::SeqCst),
        over: shop.over_in_flight.load(Ordering::SeqCst) + shop.over_rate(),
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

fn sluice(dir: &Path, bin: &Path, port: u16, shop: SocketAddr, callers: usize) -> Gateway {
    let mut toml = format!(
        r#"[server]
listen = "127.0.0.1:{port}"
worker_threads = 1
max_connections = 20000
[admin]
listen = "127.0.0.1:{}"
[upstreams.shop]
targets = ["http://{shop}"]
[policies.flash_sale]
anonymous = "deny"
registered = {{ per_second = 1, per_minute = 5 }}
total = {{ per_second = {PER_SECOND_TOTAL} }}
concurrency = {{ max = {MAX_IN_FLIGHT}, queue = 1_000, queue_timeout = "2s" }}
[[routes]]
name = "orders"
path_prefix = "/orders"
methods = ["POST"]
upstream = "shop"
policy = "flash_sale"
"#,
        free_port()
    );
    for i in 0..callers {
        toml.push_str(&format!(
            "[[consumers]]\nname = \"c{i}\"\nkey = \"key-{i}\"\n"
        ));
    }
    let path = dir.join("sluice.toml");
    std::fs::write(&path, toml).unwrap();
    let child = Command::new(bin)
        .args(["run", "-c", path.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("sluice starts");
    Gateway(child)
}

fn nginx(dir: &Path, bin: &str, port: u16, shop: SocketAddr) -> Gateway {
    let conf = format!(
        r#"daemon off;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log error;
worker_rlimit_nofile 40000;
events {{ worker_connections 20000; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    # One key for everybody: an empty key would not be limited at all.
    map $request_method $everybody {{ default "all"; }}
    limit_req_zone $http_x_api_key zone=caller_second:32m rate=1r/s;
    limit_req_zone $http_x_api_key zone=caller_minute:32m rate=5r/m;
    limit_req_zone $everybody zone=total:1m rate={PER_SECOND_TOTAL}r/s;
    limit_conn_zone $everybody zone=inflight:1m;
    upstream shop {{ server {shop}; keepalive 256; }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location /orders {{
            if ($http_x_api_key = "") {{ return 401; }}
            limit_req zone=caller_second nodelay;
            limit_req zone=caller_minute burst=4 nodelay;
            limit_req zone=total burst=1000;
            limit_conn inflight {MAX_IN_FLIGHT};
            limit_req_status 429;
            limit_conn_status 503;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_pass http://shop;
        }}
    }}
}}
"#,
        dir = dir.display()
    );
    let path = dir.join("nginx.conf");
    std::fs::write(&path, conf).unwrap();
    let child = Command::new(bin)
        .args([
            "-p",
            &dir.display().to_string(),
            "-c",
            path.to_str().unwrap(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("nginx starts");
    Gateway(child)
}

fn main() {
    let callers: usize = env("CALLERS", 3_000);
    let rounds: usize = env("ROUNDS", 3);
    let skip = std::env::var("SKIP").unwrap_or_default();
    let sluice_bin = std::env::var("SLUICE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from("target/dist/sluice"));
    let nginx_bin = std::env::var("NGINX").unwrap_or_else(|_| "nginx".to_string());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let counts = Arc::new(Shop::default());
        let shop_addr = shop(counts.clone()).await;
        let dir = tempfile::tempdir().unwrap();
        println!(
            "flash sale: {callers} callers x 2 orders at once, {rounds} rounds, shop {ORDER_MS} ms an order"
        );
        println!(
            "{:<8} {:>10} {:>13} {:>13} {:>13} {:>13} {:>9} {:>6} {:>7}",
            "gateway", "goodput/s", "200 p50 ms", "200 p99 ms", "refused p50", "refused p99",
            "peak", "over", "errors"
        );
        for name in ["sluice", "nginx"] {
            if skip.split(',').any(|s| s == name) {
                continue;
            }
            let port = free_port();
            let subdir = dir.path().join(name);
            std::fs::create_dir_all(&subdir).unwrap();
            let _gateway = match name {
                "sluice" => sluice(&subdir, &sluice_bin, port, shop_addr, callers),
                _ => nginx(&subdir, &nginx_bin, port, shop_addr),
            };
            let addr: SocketAddr = ([127, 0, 0, 1], port).into();
            wait_ready(addr).await;
            let mut results = Vec::new();
            for round in 0..rounds {
                if round > 0 {
                    // Let every per-second window empty (the per-minute ones keep
                    // counting: later rounds see more 429s, for both gateways alike).
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
                results.push(burst(addr, callers, &counts).await);
            }
            let pick = |f: &dyn Fn(&Round) -> f64| median(results.iter().map(f).collect());
            println!(
                "{:<8} {:>10.0} {:>13.1} {:>13.1} {:>13.1} {:>13.1} {:>9.0} {:>6.0} {:>7.0}",
                name,
                pick(&|r| r.goodput),
                pick(&|r| percentile(&r.admitted, 0.50)),
                pick(&|r| percentile(&r.admitted, 0.99)),
                pick(&|r| percentile(&r.refused, 0.50)),
                pick(&|r| percentile(&r.refused, 0.99)),
                pick(&|r| r.peak as f64),
                pick(&|r| r.over as f64),
                pick(&|r| r.other as f64),
            );
        }
    });
}
