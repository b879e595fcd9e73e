//! Wiring: the listeners, the worker threads, the admin listener, config reloads and
//! background maintenance, started together and stopped in order.
//!
//! [`run`] is what `sluice run` serves; [`start`] and [`start_local`] start a gateway
//! in the background (tests start one on port 0). This module decides nothing about
//! requests: it builds the [`Gateway`] and hands it every listener.

mod serving;
mod watch;

pub use crate::observe::VERSION;
pub use crate::server::workers::{WorkerSockets, count as worker_threads, set_upkeep};

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use prometheus::IntCounterVec;
use tokio::net::TcpListener;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use crate::admin::Admin;
use crate::admin::reload::Reloader;
use crate::clock::Clock;
use crate::config::Config;
use crate::gateway::Gateway;
use crate::server::workers;
use crate::store::Upkeep;
use crate::tls::certificates::{CHECK_EVERY, Certificates};
use serving::Serving;
use tokio_rustls::TlsAcceptor;

/// How often the config file (and the files it reads) are looked at when no change
/// event comes.
const CONFIG_POLL_EVERY: Duration = Duration::from_secs(1);

/// How often the maintenance task runs: it re-anchors the clock every tick.
const TICK: Duration = Duration::from_secs(1);
/// Every this many ticks, callers whose windows are all empty are dropped from memory.
const SWEEP_TICKS: u32 = 10;

/// Serves the config at `path` until `shutdown` completes, then drains.
pub async fn run(
    path: &Path,
    config: Config,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    if !config.admin.listen.ip().is_loopback() && config.admin.token.is_none() {
        tracing::warn!(
            addr = %config.admin.listen,
            "admin listener off loopback without [admin] token: only /metrics, /healthz and /readyz answer"
        );
    }
    // Before anything listens: a SIGHUP during start-up must reload, not kill.
    let hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .map_err(|err| anyhow::anyhow!("cannot install the SIGHUP handler: {err}"))?;
    let count = workers::count(config.server.startup.worker_threads);
    let mut sockets: Vec<workers::WorkerSockets> = (0..count)
        .map(|_| workers::WorkerSockets::default())
        .collect();
    let tls_addrs = config.server.startup.tls.iter().flat_map(|tls| &tls.listen);
    let addrs = config.server.startup.listen.iter().map(|a| (a, false));
    for (addr, tls) in addrs.chain(tls_addrs.map(|a| (a, true))) {
        let group = workers::bind_group(*addr, count)
            .map_err(|err| anyhow::anyhow!("cannot listen on {addr}: {err}"))?;
        let bound = group[0].local_addr()?;
        match tls {
            false => tracing::info!(addr = %bound, workers = count, "listening"),
            true => tracing::info!(addr = %bound, workers = count, "listening (TLS)"),
        }
        for (worker, socket) in sockets.iter_mut().zip(group) {
            let list = if tls {
                &mut worker.tls
            } else {
                &mut worker.plain
            };
            list.push(socket);
        }
    }
    let admin = TcpListener::bind(config.admin.listen)
        .await
        .map_err(|err| {
            anyhow::anyhow!(
                "cannot listen on admin address {}: {err}",
                config.admin.listen
            )
        })?;
    tracing::info!(addr = %admin.local_addr()?, "admin listening");
    let options = Options {
        listeners: Vec::new(),
        tls_listeners: Vec::new(),
        workers: sockets,
        admin: Some(admin),
        clock: Clock::system(),
        config_path: Some(path.to_path_buf()),
        hangups: Some(hangups),
        access_log: Box::new(std::io::stdout()),
    };
    let running = start(config, options)?;
    shutdown.await;
    tracing::info!("shutting down: draining in-flight requests");
    running.stop().await;
    tracing::info!("stopped");
    Ok(())
}

/// What a gateway is started with.
pub struct Options {
    /// Bound client-facing listeners, served on the caller's runtime.
    pub listeners: Vec<TcpListener>,
    /// Bound client-facing listeners that speak TLS with `[server.tls]`'s certificates,
    /// served on the caller's runtime.
    pub tls_listeners: Vec<TcpListener>,
    /// Client-facing sockets served by worker threads (`server::workers`), one entry per
    /// worker; `sluice run` puts every listener here.
    pub workers: Vec<workers::WorkerSockets>,
    /// A bound admin listener, if the admin API should be served.
    pub admin: Option<TcpListener>,
    /// The clock limits are decided by: the system clock when run, a manual one in tests.
    pub clock: Clock,
    /// The config file, to reload on change, SIGHUP and `POST /admin/reload`.
    pub config_path: Option<PathBuf>,
    /// SIGHUP, installed by the caller before it bound anything; reloads the config.
    pub hangups: Option<tokio::signal::unix::Signal>,
    /// Where the access log goes (stdout when run).
    pub access_log: Box<dyn std::io::Write + Send>,
}

/// A gateway serving in the background (tests start one on port 0).
pub struct Running {
    /// The plain client-facing listeners' addresses (with port 0 resolved).
    pub addrs: Vec<SocketAddr>,
    /// The TLS listeners' addresses.
    pub tls_addrs: Vec<SocketAddr>,
    /// The admin listener's address; `None` without an admin listener.
    pub admin_addr: Option<SocketAddr>,
    /// The decision listener's address (`[decision] listen`, port 0 resolved);
    /// `None` without `[decision]`.
    pub decision_addr: Option<SocketAddr>,
    /// The gateway every listener serves (its store, snapshot, metrics and clock).
    pub gateway: Arc<Gateway>,
    stop: broadcast::Sender<()>,
    tasks: Vec<workers::Finished>,
    background: Vec<JoinHandle<()>>,
    /// The store's own background work, stopped last.
    upkeep: Upkeep,
}

impl Running {
    /// The first listen address.
    pub fn addr(&self) -> SocketAddr {
        self.addrs[0]
    }

    /// Stops accepting, lets in-flight requests finish (up to `drain_timeout`),
    /// stops the store (which writes its state one last time) and waits until done.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        for task in self.tasks {
            let _ = task.await;
        }
        for task in self.background {
            task.abort();
        }
        self.upkeep.stop().await;
    }
}

/// Starts serving `config` with `options`; fails if the store cannot be used at all
/// or the TLS certificates do not load.
pub fn start(config: Config, options: Options) -> anyhow::Result<Running> {
    let Options {
        listeners,
        tls_listeners,
        workers,
        admin,
        clock,
        config_path,
        hangups,
        access_log,
    } = options;
    let first = workers.first();
    let addrs = addresses(&listeners, first.iter().flat_map(|w| &w.plain));
    let tls_addrs = addresses(&tls_listeners, first.iter().flat_map(|w| &w.tls));
    let certificates = match (&config.server.startup.tls, tls_addrs.is_empty()) {
        (_, true) => None,
        (None, false) => anyhow::bail!("TLS listeners without [server.tls]"),
        (Some(tls), false) => Some(Certificates::load(tls).map_err(anyhow::Error::msg)?),
    };
    let admin_addr = admin.as_ref().and_then(|l| l.local_addr().ok());
    let token = config.admin.token.clone();
    let exposed = admin_addr.is_some_and(|a| !a.ip().is_loopback());
    let settings = config.server.startup.clone();
    let decision = config
        .decision
        .as_ref()
        .map(decision_listener)
        .transpose()?;
    let gateway = Arc::new(Gateway::new(config, clock, access_log)?);
    let (stop, _) = broadcast::channel::<()>(1);
    let serving = Serving {
        gateway: &gateway,
        settings: &settings,
        acceptor: (certificates.as_ref()).map(|c| TlsAcceptor::from(c.server_config())),
        stop: &stop,
    };
    let mut tasks = serving.here(listeners, tls_listeners);
    tasks.extend(serving.on_workers(workers)?);
    let reloader = config_path.map(|path| Arc::new(Reloader::new(&path, gateway.clone())));
    let reloads = &gateway.metrics().tls_reloads;
    let mut background = watch_files(certificates, reloads, reloader.as_ref(), hangups);
    let decision_addr = decision.as_ref().and_then(|d| d.listener.local_addr().ok());
    if let Some(decision) = decision {
        let acceptor =
            (decision.certificates.as_ref()).map(|c| TlsAcceptor::from(c.server_config()));
        tasks.push(serving.decision(decision.listener, decision.settings, acceptor));
        background.extend(watch_files(decision.certificates, reloads, None, None));
    }
    if let Some(listener) = admin {
        let reloader =
            reloader.unwrap_or_else(|| Arc::new(Reloader::new(Path::new(""), gateway.clone())));
        let admin = Arc::new(Admin::new(gateway.clone(), reloader, token, exposed));
        background.push(tokio::spawn(admin.clone().sample_traffic()));
        tasks.push(serving.admin(listener, admin));
    }
    background.push(tokio::spawn(maintain(gateway.clone())));
    let upkeep = {
        let banned = gateway.clone();
        gateway.store().start(gateway.clock(), move |ban| {
            banned.admission().banned_here(ban)
        })
    };
    Ok(Running {
        addrs,
        tls_addrs,
        admin_addr,
        decision_addr,
        gateway,
        stop,
        tasks,
        background,
        upkeep,
    })
}

/// The decision listener, bound, with its settings and certificates.
struct Decision {
    listener: TcpListener,
    settings: crate::config::ServerStartup,
    certificates: Option<Arc<Certificates>>,
}

/// Binds `[decision] listen` and loads `[decision.tls]`'s certificates.
fn decision_listener(config: &crate::config::DecisionConfig) -> anyhow::Result<Decision> {
    let addr = config.listen;
    let bound = std::net::TcpListener::bind(addr)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .and_then(TcpListener::from_std)
        .map_err(|err| anyhow::anyhow!("cannot listen on decision address {addr}: {err}"))?;
    let certificates = (config.connections.tls.as_ref())
        .map(|tls| Certificates::load(tls).map_err(anyhow::Error::msg))
        .transpose()?;
    match &certificates {
        None => tracing::info!(addr = %bound.local_addr()?, "decision listening"),
        Some(_) => tracing::info!(addr = %bound.local_addr()?, "decision listening (TLS)"),
    }
    Ok(Decision {
        listener: bound,
        settings: config.connections.clone(),
        certificates,
    })
}

/// The addresses of `listeners` and of a worker's `sockets` (port 0 resolved).
fn addresses<'a>(
    listeners: &[TcpListener],
    sockets: impl Iterator<Item = &'a std::net::TcpListener>,
) -> Vec<SocketAddr> {
    (listeners.iter().map(|l| l.local_addr()))
        .chain(sockets.map(|l| l.local_addr()))
        .filter_map(Result::ok)
        .collect()
}

/// Watches the TLS certificates' files (counting their loads in `reloads`) and the
/// config's, and reloads the config on SIGHUP: the tasks doing so.
fn watch_files(
    certificates: Option<Arc<Certificates>>,
    reloads: &IntCounterVec,
    reloader: Option<&Arc<Reloader>>,
    hangups: Option<tokio::signal::unix::Signal>,
) -> Vec<JoinHandle<()>> {
    let mut background = Vec::new();
    if let Some(certificates) = certificates {
        let watched = Arc::new(CertificateFiles(certificates, reloads.clone()));
        let watching = watch::watch(watched, CHECK_EVERY, "TLS certificate");
        background.push(tokio::spawn(watching));
    }
    if let Some(reloader) = reloader {
        let watched = Arc::new(ConfigFiles(reloader.clone()));
        let watching = watch::watch(watched, CONFIG_POLL_EVERY, "config");
        background.push(tokio::spawn(watching));
        if let Some(hangups) = hangups {
            background.push(tokio::spawn(reload_on_sighup(reloader.clone(), hangups)));
        }
    }
    background
}

/// Starts `config` on one fresh loopback port with `clock` (tests and examples).
pub async fn start_local(config: Config, clock: Clock) -> anyhow::Result<Running> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let tls_listeners = match config.server.startup.tls {
        Some(_) => vec![TcpListener::bind("127.0.0.1:0").await?],
        None => Vec::new(),
    };
    let options = Options {
        listeners: vec![listener],
        tls_listeners,
        workers: Vec::new(),
        admin: None,
        clock,
        config_path: None,
        hangups: None,
        access_log: Box::new(std::io::sink()),
    };
    start(config, options)
}

/// Background maintenance: re-anchors the clock every tick, posts this replica's
/// near-limit callers for the fleet's status pages (with Redis) every other tick,
/// drops idle callers every [`SWEEP_TICKS`] (what is idle depends on the config's
/// calendar and ban rules). The
/// store's own upkeep (state file, fleet bans) is the store's: [`Store::start`].
///
/// [`Store::start`]: crate::store::Store::start
async fn maintain(gateway: Arc<Gateway>) {
    let mut every = tokio::time::interval(TICK);
    every.tick().await;
    for tick in 1u64.. {
        every.tick().await;
        gateway.clock().resync();
        if tick % crate::admin::NEAR_LIMIT_POST_TICKS == 0 {
            crate::admin::post_near_limit(&gateway).await;
        }
        if tick % u64::from(SWEEP_TICKS) == 0 {
            let snapshot = gateway.snapshot();
            let now = snapshot.days.now(gateway.clock().now_ms());
            let within_ms = snapshot
                .bans()
                .automatic
                .map_or(1, |auto| auto.within.as_millis() as u64);
            let dropped = gateway.store().sweep(&now, within_ms);
            if dropped > 0 {
                tracing::debug!(dropped, "dropped idle callers");
            }
        }
    }
}

/// The config's files, as the file watcher sees them.
struct ConfigFiles(Arc<Reloader>);

impl watch::Watched for ConfigFiles {
    fn files(&self) -> Vec<PathBuf> {
        self.0.files()
    }

    fn check(&self) {
        self.0.reload_if_changed();
    }
}

/// The TLS listener's certificate files, as the file watcher sees them, and the
/// counter of their loads by result (`sluice_tls_reloads_total`).
struct CertificateFiles(Arc<Certificates>, IntCounterVec);

impl watch::Watched for CertificateFiles {
    fn files(&self) -> Vec<PathBuf> {
        self.0.files()
    }

    fn check(&self) {
        if let Some(loaded) = self.0.check() {
            let result = if loaded { "ok" } else { "error" };
            self.1.with_label_values(&[result]).inc();
        }
    }
}

async fn reload_on_sighup(reloader: Arc<Reloader>, mut hangups: tokio::signal::unix::Signal) {
    while hangups.recv().await.is_some() {
        tracing::info!("SIGHUP: reloading the config");
        let reloader = reloader.clone();
        let _ = tokio::task::spawn_blocking(move || reloader.reload()).await;
    }
}

/// The status the admin listener at `addr` answers `GET /readyz` with (`sluice
/// health`).
pub async fn readyz(addr: SocketAddr) -> anyhow::Result<u16> {
    let url = http::Uri::try_from(format!("http://{addr}/readyz"))?;
    let asked = crate::http::client::Get {
        accept: None,
        ca_file: None,
    };
    let response = crate::http::client::get(&url, asked).await?;
    Ok(response.status().as_u16())
}
