//! In-process gateways of the Cluster and Sentinel tests, and the load they are put
//! under: requests from rotating callers at a steady rate, tallied by status, with
//! the gap (the first to the last answer that was not a decision of the store).

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::common::{Req, within};
use sluice::clock::Clock;
use sluice::config::Config;
use sluice::{Options, Running};
use tokio::net::TcpListener;

/// A gateway in this process on loopback ports, with its admin listener and a store
/// of its own: one replica of a fleet.
pub(crate) struct Gateway {
    pub(crate) addr: SocketAddr,
    pub(crate) admin: SocketAddr,
    running: Option<Running>,
}

pub(crate) async fn gateway(toml: &str) -> Gateway {
    let config = Config::parse(Path::new("fleet.toml"), toml)
        .unwrap_or_else(|err| panic!("test config does not compile:\n{err}\n---\n{toml}"));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let running = sluice::start(
        config,
        Options {
            listeners: vec![listener],
            tls_listeners: Vec::new(),
            workers: Vec::new(),
            admin: Some(admin),
            clock: Clock::system(),
            config_path: None,
            hangups: None,
            access_log: Box::new(std::io::sink()),
        },
    )
    .expect("the gateway starts");
    Gateway {
        addr: running.addr(),
        admin: running.admin_addr.expect("an admin address"),
        running: Some(running),
    }
}

impl Gateway {
    /// Errors the store counted talking to Redis.
    pub(crate) fn store_errors(&self) -> u64 {
        self.running
            .as_ref()
            .expect("running")
            .gateway
            .store()
            .errors()
    }

    pub(crate) async fn stop(mut self) {
        if let Some(running) = self.running.take() {
            within("gateway stop", running.stop()).await;
        }
    }
}

/// GET `path` from `ip`; the status, or 0 when no answer came.
pub(crate) async fn status(addr: SocketAddr, ip: &str, path: &str) -> u16 {
    match Req::get(path).from(ip).try_send(addr).await {
        Ok(resp) => resp.status.as_u16(),
        Err(_) => 0,
    }
}

/// Answers by status.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Tally {
    pub(crate) ok: usize,
    pub(crate) limited: usize,
    pub(crate) unavailable: usize,
    pub(crate) other: usize,
}

impl Tally {
    pub(crate) fn add(&mut self, status: u16) {
        match status {
            200 => self.ok += 1,
            429 => self.limited += 1,
            503 => self.unavailable += 1,
            _ => self.other += 1,
        }
    }

    pub(crate) fn sum(tallies: impl IntoIterator<Item = Tally>) -> Tally {
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
pub(crate) struct Run {
    pub(crate) tally: Tally,
    /// From the first to the last answer that was not 200 or 429.
    pub(crate) gap: Option<(Instant, Instant)>,
}

impl Run {
    /// The runs' tallies together, and the length of their gaps together.
    pub(crate) fn merge(runs: &[Run]) -> (Tally, Duration) {
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
pub(crate) async fn load(
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
