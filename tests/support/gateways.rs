//! In-process gateways of the fleet, Cluster and Sentinel tests, and the load they
//! are put under: requests from rotating callers at a steady rate, tallied by status,
//! with the gap (the first to the last answer that was not a decision of the store).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::{Req, Resp, within};
use sluice::app::{Options, Running};
use sluice::clock::Clock;
use sluice::config::Config;
use tokio::net::TcpListener;

/// `/own`: each caller 10 a minute. `/pooled`: each caller 1 000 a minute, all of them
/// together `total` a minute.
pub fn policies(total: u32) -> String {
    format!(
        r#"
[policies.own]
anonymous = {{ per_minute = 10 }}

[policies.pooled]
anonymous = {{ per_minute = 1_000 }}
total = {{ per_minute = {total} }}

[[routes]]
name = "own"
path_prefix = "/own"
respond = {{ status = 200 }}
policy = "own"

[[routes]]
name = "pooled"
path_prefix = "/pooled"
respond = {{ status = 200 }}
policy = "pooled"
"#
    )
}

/// A gateway in this process on loopback ports, with its admin listener and a Redis
/// store of its own: one replica of a fleet.
pub struct Gateway {
    /// The proxy listener.
    pub addr: SocketAddr,
    /// The admin listener.
    pub admin: SocketAddr,
    running: Option<Running>,
}

/// Starts a replica from `toml`, whose store must be Redis, on the real clock.
pub async fn gateway(toml: &str) -> Gateway {
    gateway_on(toml, Clock::system()).await
}

/// Starts a replica from `toml`, whose store must be Redis, on `clock` (a manual
/// clock decides when an open store breaker sends its probe).
pub async fn gateway_on(toml: &str, clock: Clock) -> Gateway {
    let config = Config::parse(Path::new("fleet.toml"), toml)
        .unwrap_or_else(|err| panic!("test config does not compile:\n{err}\n---\n{toml}"));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let running = sluice::app::start(
        config,
        Options {
            listeners: vec![listener],
            tls_listeners: Vec::new(),
            workers: Vec::new(),
            admin: Some(admin),
            clock,
            config_path: None,
            hangups: None,
            access_log: Box::new(std::io::sink()),
        },
    )
    .expect("the gateway starts");
    assert_eq!(running.gateway.store().backend(), "redis");
    Gateway {
        addr: running.addr(),
        admin: running.admin_addr.expect("an admin address"),
        running: Some(running),
    }
}

impl Gateway {
    fn running(&self) -> &Running {
        self.running.as_ref().expect("running")
    }

    /// The decision listener's address (`[decision] listen`), if the config has one.
    pub fn decision(&self) -> SocketAddr {
        self.running().decision_addr.expect("a [decision] listener")
    }

    /// Errors the store counted talking to Redis.
    pub fn store_errors(&self) -> u64 {
        self.running().gateway.store().errors()
    }

    /// GET `path` from 127.0.0.1.
    pub async fn get(&self, path: &str) -> Resp {
        Req::get(path).send(self.addr).await
    }

    /// GET `path` from the loopback address `ip`.
    pub async fn get_from(&self, ip: &str, path: &str) -> Resp {
        Req::get(path).from(ip).send(self.addr).await
    }

    /// Sends `request` to the admin listener.
    pub async fn admin(&self, request: Req) -> Resp {
        request.send(self.admin).await
    }

    /// `GET /readyz` on the admin listener.
    pub async fn readyz(&self) -> Resp {
        self.admin(Req::get("/readyz")).await
    }

    /// The `/metrics` text; asserts a 200.
    pub async fn metrics(&self) -> String {
        let resp = self.admin(Req::get("/metrics")).await;
        assert_eq!(resp.status, 200, "/metrics: {}", resp.text());
        resp.text()
    }

    /// The value of the sample `name` (with its labels, exactly as rendered).
    pub async fn metric(&self, name: &str) -> f64 {
        let text = self.metrics().await;
        sample(&text, name).unwrap_or_else(|| panic!("no sample {name} in /metrics:\n{text}"))
    }

    /// Stops it as SIGTERM would: drains, then returns.
    pub async fn stop(mut self) {
        if let Some(running) = self.running.take() {
            within("gateway stop", running.stop()).await;
        }
    }
}

/// The value of sample `name` (e.g. `sluice_store_errors_total{backend="redis"}`).
pub fn sample(metrics: &str, name: &str) -> Option<f64> {
    metrics.lines().find_map(|line| {
        let value = line.strip_prefix(name)?.strip_prefix(' ')?;
        value.trim().parse().ok()
    })
}

/// GET `path` from `ip`; the status, or 0 when no answer came.
pub async fn status(addr: SocketAddr, ip: &str, path: &str) -> u16 {
    match Req::get(path).from(ip).try_send(addr).await {
        Ok(resp) => resp.status.as_u16(),
        Err(_) => 0,
    }
}

/// Answers by status.
#[derive(Debug, Default, Clone, Copy)]
pub struct Tally {
    /// 200s.
    pub ok: usize,
    /// 429s.
    pub limited: usize,
    /// 503s.
    pub unavailable: usize,
    /// Anything else, no answer included.
    pub other: usize,
}

impl Tally {
    /// Counts one answer.
    pub fn add(&mut self, status: u16) {
        match status {
            200 => self.ok += 1,
            429 => self.limited += 1,
            503 => self.unavailable += 1,
            _ => self.other += 1,
        }
    }

    /// The tallies added up.
    pub fn sum(tallies: impl IntoIterator<Item = Tally>) -> Tally {
        tallies.into_iter().fold(Tally::default(), |all, t| Tally {
            ok: all.ok + t.ok,
            limited: all.limited + t.limited,
            unavailable: all.unavailable + t.unavailable,
            other: all.other + t.other,
        })
    }
}

/// What one replica saw while a load ran.
#[derive(Debug, Default)]
pub struct Run {
    /// Its answers by status.
    pub tally: Tally,
    /// From the first to the last answer that was not 200 or 429.
    pub gap: Option<(Instant, Instant)>,
}

impl Run {
    /// The runs' tallies together, and the length of their gaps together.
    pub fn merge(runs: &[Run]) -> (Tally, Duration) {
        let gap = runs.iter().filter_map(|r| r.gap).fold(
            None,
            |all: Option<(Instant, Instant)>, (first, last)| {
                Some(all.map_or((first, last), |(f, l)| (f.min(first), l.max(last))))
            },
        );
        (
            Tally::sum(runs.iter().map(|r| r.tally)),
            gap.map_or(Duration::ZERO, |(first, last)| last - first),
        )
    }
}

/// Sends GET `path` from 50 rotating callers (127.0.4.x) through `addr`,
/// `per_second` a second, until `stop`; one task per request, so a slow answer does
/// not slow the rest.
pub async fn load(
    addr: SocketAddr,
    path: &'static str,
    per_second: u32,
    stop: Arc<AtomicBool>,
) -> Run {
    let mut tasks = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1) / per_second);
    let mut n = 0u32;
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        n += 1;
        let ip = format!("127.0.4.{}", n % 50 + 1);
        tasks.push(tokio::spawn(async move {
            let status = status(addr, &ip, path).await;
            (status, Instant::now())
        }));
    }
    let mut run = Run::default();
    for task in tasks {
        let (status, at) = within("a load request", task).await.unwrap();
        run.tally.add(status);
        if status != 200 && status != 429 {
            run.gap = Some(match run.gap {
                None => (at, at),
                Some((first, last)) => (first.min(at), last.max(at)),
            });
        }
    }
    run
}

/// What a failover under load showed.
#[derive(Debug)]
pub struct Failover {
    /// Answers of every gateway's load together.
    pub tally: Tally,
    /// From the first to the last answer that was not a decision of the store.
    pub gap: Duration,
    /// From the kill until the new master was in place.
    pub promoted: Duration,
}

/// Loads `path` through every gateway at 60 requests a second each; after 2 s calls
/// `kill` on the Redis `servers`, waits (at most 20 s) until `promoted` holds of
/// them, then lets the load run 4 s more.
pub async fn failover<S>(
    gateways: &[&Gateway],
    path: &'static str,
    servers: &mut S,
    kill: impl FnOnce(&mut S),
    mut promoted: impl FnMut(&S) -> bool,
) -> Failover {
    let stop = Arc::new(AtomicBool::new(false));
    let loads: Vec<_> = gateways
        .iter()
        .map(|gw| tokio::spawn(load(gw.addr, path, 60, stop.clone())))
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let killed = Instant::now();
    kill(servers);
    let deadline = killed + Duration::from_secs(20);
    while !promoted(servers) {
        assert!(Instant::now() < deadline, "nobody promoted within 20 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let promoted = killed.elapsed();
    tokio::time::sleep(Duration::from_secs(4)).await;
    stop.store(true, Ordering::Relaxed);
    let mut runs = Vec::new();
    for task in loads {
        runs.push(within("the load", task).await.unwrap());
    }
    let (tally, gap) = Run::merge(&runs);
    Failover {
        tally,
        gap,
        promoted,
    }
}

impl Failover {
    /// Reports the failover, and checks what both topologies guarantee with
    /// `on_error = "deny"`: only 200, 429 and (in the gap) 503; the gap was seen; the
    /// limit `total` was reached through the new master (`before` requests were
    /// admitted before the load), give or take the few decisions around the kill:
    /// asynchronous replication loses at most a few (at 120 requests a second, 20 is
    /// generous), and a decision whose answer was lost is counted, not admitted.
    pub fn check(&self, what: &str, before: usize, total: usize) {
        let ok = self.tally.ok + before;
        eprintln!(
            "{what} failover: replica promoted {:?} after the kill; gap {:?} \
             ({} answers 503); admitted {ok} of a total of {total}: {} beyond it; {:?}",
            self.promoted,
            self.gap,
            self.tally.unavailable,
            ok.saturating_sub(total),
            self.tally,
        );
        assert_eq!(self.tally.other, 0, "only 200, 429 and (in the gap) 503");
        assert!(
            self.tally.unavailable > 0,
            "the kill was seen: on_error decided in the gap"
        );
        // A decision the dying master made and replicated, whose answer never came
        // back, is counted but not admitted: a few short of the total is right.
        assert!(
            ok + 5 >= total,
            "admitted {ok}: the new master was not used after the failover"
        );
        assert!(ok <= total + 20, "admitted {ok}, more than {total} + 20");
    }
}

/// A replica run as the `sluice` binary, a child process with a config file: the
/// fault tests measure the program operators run. It is the binary Cargo built for
/// the tests (the release one under `cargo test --release`), or the one `SLUICE_BIN`
/// names (e.g. `target/release/sluice`, built from the same tree).
pub struct Binary {
    /// The proxy listener.
    pub addr: SocketAddr,
    /// The admin listener.
    pub admin: SocketAddr,
    child: Option<std::process::Child>,
    /// Its config file's directory, removed with it.
    dir: std::path::PathBuf,
}

/// Starts `sluice run` with `toml` (a Redis store, no `[server]` or `[admin]`: they
/// are added, on free loopback ports), and waits until its admin listener answers.
pub async fn binary(toml: &str) -> Binary {
    let (port, admin) = (super::closed_port(), super::closed_port());
    let dir = std::env::temp_dir().join(format!("sluice-fleet-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("sluice.toml");
    let head = format!(
        "[server]\nlisten = \"127.0.0.1:{port}\"\n\n[admin]\nlisten = \"127.0.0.1:{admin}\"\n\n"
    );
    std::fs::write(&config, head + toml).unwrap();
    let program = std::env::var("SLUICE_BIN").unwrap_or(env!("CARGO_BIN_EXE_sluice").into());
    let child = std::process::Command::new(program)
        .args(["run", "-c", config.to_str().unwrap()])
        .env("SLUICE_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.join("stderr.log")).unwrap())
        .spawn()
        .expect("sluice run starts");
    let mut started = Binary {
        addr: ([127, 0, 0, 1], port).into(),
        admin: ([127, 0, 0, 1], admin).into(),
        child: Some(child),
        dir,
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while Req::get("/healthz").try_send(started.admin).await.is_err() {
        let exited = started.child.as_mut().and_then(|c| c.try_wait().unwrap());
        assert!(exited.is_none(), "sluice exited before serving: {exited:?}");
        assert!(
            Instant::now() < deadline,
            "sluice never served its admin listener"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    started
}

impl Binary {
    /// What it logged (warnings and errors) so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("stderr.log")).unwrap_or_default()
    }

    /// The `/metrics` text; asserts a 200.
    pub async fn metrics(&self) -> String {
        let resp = Req::get("/metrics").send(self.admin).await;
        assert_eq!(resp.status, 200, "/metrics: {}", resp.text());
        resp.text()
    }

    /// Errors the store counted talking to Redis (`sluice_store_errors_total`).
    pub async fn store_errors(&self) -> u64 {
        let name = "sluice_store_errors_total{backend=\"redis\"}";
        sample(&self.metrics().await, name).unwrap_or_default() as u64
    }

    /// Stops it with SIGTERM and waits (bounded) for it to exit with 0.
    pub async fn stop(mut self) {
        let mut child = self.child.take().expect("running");
        let pid = child.id().to_string();
        let sent = std::process::Command::new("kill")
            .args(["-s", "TERM", &pid])
            .status();
        assert!(sent.unwrap().success(), "kill -s TERM {pid}");
        let deadline = Instant::now() + Duration::from_secs(15);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "sluice did not exit after SIGTERM"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(status.success(), "sluice exited with {status}");
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
