//! sluice: a rate-limiting API gateway.
//!
//! # Architecture
//!
//! ```text
//! server (accept, HTTP/1.1 + HTTP/2, timeouts)
//!   -> gateway::Gateway::handle            one config snapshot per request
//!        path::normalize                   400 on unsafe spellings
//!        identity::Identifier::identify    API key (401 if unknown) or client IP
//!        snapshot::Snapshot::denied        [access] deny -> 403
//!        route::Routes::find               first match in file order, else 404
//!        store::Store::decide              all-or-nothing over the plan's and the
//!          limit::Runs (pure core)         policy's total windows -> 429
//!        proxy::Upstreams::forward         pooled keep-alive client -> 502 / 504
//!        ratelimit                         RateLimit-Policy / RateLimit headers
//!   <- refusal::Refusal::into_response     every error response, problem+json
//! ```
//!
//! `config` turns `gateway.toml` into validated runtime types; `snapshot` resolves
//! them against the store once per config; `clock` is the only wall-clock reader.
//! The limiter core in `limit` is pure: state and instant in, verdict and new state
//! out, so it is tested against an exact oracle with a manual clock.

pub mod body;
pub mod clock;
pub mod config;
pub mod gateway;
pub mod identity;
pub mod limit;
pub mod path;
pub mod proxy;
pub mod ratelimit;
pub mod refusal;
pub mod route;
pub mod server;
pub mod snapshot;
pub mod store;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::clock::Clock;
use crate::config::Config;
use crate::gateway::Gateway;

/// How often callers whose windows are all empty are dropped from memory.
const SWEEP_EVERY: Duration = Duration::from_secs(10);
/// In-flight requests get this long to finish once shutdown starts.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(30);

/// Serves `config` on its listen addresses until `shutdown` completes.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    let mut listeners = Vec::new();
    for addr in &config.server.listen {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|err| anyhow::anyhow!("cannot listen on {addr}: {err}"))?;
        tracing::info!(addr = %listener.local_addr()?, "listening");
        listeners.push(listener);
    }
    let running = start_on(config, listeners, Clock::system());
    shutdown.await;
    tracing::info!("shutting down: draining in-flight requests");
    running.stop().await;
    Ok(())
}

/// A gateway serving in the background (tests start one on port 0).
pub struct Running {
    pub addrs: Vec<SocketAddr>,
    pub gateway: Arc<Gateway>,
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl Running {
    /// The first listen address.
    pub fn addr(&self) -> SocketAddr {
        self.addrs[0]
    }

    /// Stops accepting, drains in-flight requests and waits until done.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

/// Starts serving `config` on already-bound listeners with `clock`.
pub fn start_on(config: Config, listeners: Vec<TcpListener>, clock: Clock) -> Running {
    let addrs = listeners
        .iter()
        .filter_map(|l| l.local_addr().ok())
        .collect();
    let settings = config.server.clone();
    let gateway = Arc::new(Gateway::new(config, clock));
    let (stop, stopped) = oneshot::channel::<()>();
    let (stop_all, _) = tokio::sync::broadcast::channel::<()>(1);
    let mut servers = Vec::new();
    for listener in listeners {
        let mut stopped = stop_all.subscribe();
        let gateway = gateway.clone();
        let settings = settings.clone();
        servers.push(tokio::spawn(async move {
            let shutdown = async move {
                let _ = stopped.recv().await;
            };
            server::serve(listener, gateway, &settings, shutdown, DEFAULT_GRACE).await;
        }));
    }
    let sweeper = {
        let gateway = gateway.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(SWEEP_EVERY);
            loop {
                every.tick().await;
                gateway.clock().resync();
                let snapshot = gateway.snapshot();
                let now = snapshot.days.now(gateway.clock().now_ms());
                let dropped = gateway.store().sweep(&now);
                if dropped > 0 {
                    tracing::debug!(dropped, "dropped idle callers");
                }
            }
        })
    };
    let task = tokio::spawn(async move {
        let _ = stopped.await;
        let _ = stop_all.send(());
        for server in servers {
            let _ = server.await;
        }
        sweeper.abort();
    });
    Running {
        addrs,
        gateway,
        stop,
        task,
    }
}

/// Starts `config` on one fresh loopback port (tests and examples).
pub async fn start_local(config: Config, clock: Clock) -> std::io::Result<Running> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    Ok(start_on(config, vec![listener], clock))
}
