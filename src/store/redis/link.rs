//! The Redis engine's link: its connection, and the thread the connection lives on.
//!
//! Each worker serves its connections on a current-thread runtime of its own, and a
//! task spawned from a worker lives on that worker's runtime: it waits whenever that
//! worker is busy and ends with it. The connection manager spawns its reader task (and
//! each reconnection) on the runtime of whoever first uses it, or whoever sees it
//! fail. So the engine starts a thread of its own, with a current-thread runtime, when
//! the store is opened, and every Redis call of the engine is made there, whichever
//! runtime asks ([`Link::query`]): the batches of decisions (`super::batch`), bans,
//! resets, PING. The connection is therefore made, read and remade on that thread
//! only. The thread ends when the last [`Link`] is dropped, with the store and the
//! batchers that use it.
//!
//! The connection is one of three kinds, as `[store]` names the target: one server
//! (a `ConnectionManager`), a Redis Cluster, or the master a set of sentinels names
//! ([`super::sentinel`]), asked again whenever a call fails. A Redis Cluster is
//! reached two ways: the decisions go to each master on a `ConnectionManager` of the
//! engine's own, found with the slot map of [`super::shards`] (the same multiplexed,
//! pipelined connection, and the same cost per call, as one server's), and whatever
//! that map cannot route (a stale map, a slot being migrated), bans and resets go
//! through the client's cluster connection, which follows `MOVED` and `ASK` and
//! refreshes its own slot map when the topology changes.
//!
//! Deliberately not here: what is sent (the batcher, `bans`) and what a failure means
//! for a request (`super::super::fallback`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{
    Cmd, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, Pipeline, RedisFuture,
    TlsCertificates, Value,
};
use tokio::runtime::Handle;
use tokio::sync::oneshot;

use super::deadline::Skew;
use super::sentinel::Follow;
use super::shards::{Map, Shards};
use crate::config::RedisTarget;
use crate::store::StoreError;
use crate::store::breaker::Breaker;

/// The engine's thread.
struct Home {
    /// Its runtime, where the engine's tasks are spawned.
    handle: Handle,
    /// Dropped with the last link: the thread's runtime then stops, ending its tasks.
    _stop: oneshot::Sender<()>,
}

impl Home {
    /// Starts the thread and its runtime.
    fn start() -> std::io::Result<Home> {
        let (stop, stopped) = oneshot::channel::<()>();
        let (started, handle) = std::sync::mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name("sluice-redis".to_string())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build();
                match runtime {
                    Ok(runtime) => {
                        let _ = started.send(Ok(runtime.handle().clone()));
                        runtime.block_on(async {
                            let _ = stopped.await;
                        });
                    }
                    Err(err) => {
                        let _ = started.send(Err(err));
                    }
                }
            })?;
        let handle = handle
            .recv()
            .map_err(|_| std::io::Error::other("the thread ended before its runtime started"))??;
        Ok(Home {
            handle,
            _stop: stop,
        })
    }
}

/// A connection to the target, as a call uses it.
#[derive(Clone)]
pub enum Connection {
    /// One server (or the master the sentinels named).
    Server(ConnectionManager),
    /// A Redis Cluster: each command goes to the node serving its keys' slot.
    Cluster(ClusterConnection),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Server(c) => c.req_packed_command(cmd),
            Connection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Server(c) => c.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Server(c) => c.get_db(),
            Connection::Cluster(c) => c.get_db(),
        }
    }
}

/// What the link holds, by kind of target.
#[derive(Clone)]
enum Kind {
    Server(ConnectionManager),
    Cluster(ClusterConnection, Arc<Masters>),
    Sentinel(Arc<Follow>),
}

/// A Redis Cluster master as the engine reaches it.
#[derive(Clone)]
pub struct Master {
    /// The engine's own connection to it.
    pub connection: ConnectionManager,
    /// Its health: while it is open, the decisions of its slots do without it
    /// (`on_error`), and the other masters' are not affected.
    pub health: Arc<Breaker>,
    /// Its clock against the gateway's, for its calls' deadlines.
    pub skew: Arc<Skew>,
}

/// A Redis Cluster's slot map and the engine's own connection to each master.
struct Masters {
    shards: Shards<Master>,
    /// The first seed node's settings (user, password, database, TLS), with which
    /// each master is reached.
    seed: ConnectionInfo,
    ca: Option<Vec<u8>>,
    timeout: Duration,
}

impl Masters {
    /// A connection to the master at `host:port`, made when first used, and a
    /// fresh health.
    fn connect(&self, host: &str, port: u16) -> Option<Master> {
        let host = endpoint(host, self.seed.addr());
        let addr = match self.seed.addr() {
            ConnectionAddr::TcpTls { insecure, .. } => ConnectionAddr::TcpTls {
                host: host.to_string(),
                port,
                insecure: *insecure,
                tls_params: None,
            },
            _ => ConnectionAddr::Tcp(host.to_string(), port),
        };
        let info = self.seed.clone().set_addr(addr);
        let client = match &self.ca {
            Some(ca) => redis::Client::build_with_tls(
                info,
                TlsCertificates {
                    client_tls: None,
                    root_cert: Some(ca.clone()),
                },
            ),
            None => redis::Client::open(info),
        };
        let connection = client.and_then(|client| {
            ConnectionManager::new_lazy_with_config(client, manager_config(self.timeout))
        });
        match connection {
            Ok(connection) => Some(Master {
                connection,
                health: Arc::default(),
                skew: Arc::default(),
            }),
            Err(err) => {
                tracing::warn!(error = %err, master = %format!("{host}:{port}"), "redis cluster: cannot use a master");
                None
            }
        }
    }
}

/// The connection to the store's Redis, on the engine's thread; cheap to clone.
#[derive(Clone)]
pub struct Link {
    kind: Kind,
    home: Arc<Home>,
    /// How long any call may wait for Redis.
    timeout: Duration,
    /// Replicas that must have a decision's counts before it is answered.
    wait_replicas: u32,
    /// The server's clock against the gateway's (on a Cluster, for calls the
    /// cluster connection routes; each master has its own).
    skew: Arc<Skew>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// The host to reach a master at, as `CLUSTER SLOTS` names it: a node that knows no
/// address of its own (a cluster of one master that never met another node) names
/// none, or `?`, meaning the address it was asked at, the seed's.
fn endpoint<'a>(host: &'a str, seed: &'a ConnectionAddr) -> &'a str {
    match (host, seed) {
        ("" | "?", ConnectionAddr::Tcp(seed, _) | ConnectionAddr::TcpTls { host: seed, .. }) => {
            seed
        }
        _ => host,
    }
}

/// The settings of a connection to one server.
pub(super) fn manager_config(timeout: Duration) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout.max(Duration::from_millis(200))))
        .set_response_timeout(Some(timeout))
        .set_number_of_retries(1)
        .set_max_delay(Duration::from_millis(500))
}

impl Link {
    /// A link to `target`, whose calls wait at most `timeout`; `ca` (PEM) is trusted
    /// for `rediss://` instead of the system's roots. It connects lazily, so a Redis
    /// that is down at start is a fault like any other, but a URL the client cannot
    /// use, or a thread that cannot start, is an error now.
    pub fn open(
        target: &RedisTarget,
        ca: Option<Vec<u8>>,
        timeout: Duration,
    ) -> Result<Link, StoreError> {
        let named = match target {
            RedisTarget::Server(url) => url.clone(),
            RedisTarget::Cluster(nodes) | RedisTarget::Sentinel { nodes, .. } => nodes.join(","),
        };
        let open = |source| StoreError::Open {
            url: named.clone(),
            source: Arc::new(source),
        };
        let certs = || TlsCertificates {
            client_tls: None,
            root_cert: ca.clone(),
        };
        let home = Home::start().map_err(|err| StoreError::Thread(Arc::new(err)))?;
        // Each connection's own tasks start on the engine's runtime.
        let _inside = home.handle.enter();
        let kind = match target {
            RedisTarget::Server(url) => {
                let client = match ca {
                    Some(_) => redis::Client::build_with_tls(url.as_str(), certs()),
                    None => redis::Client::open(url.as_str()),
                }
                .map_err(open)?;
                let manager =
                    ConnectionManager::new_lazy_with_config(client, manager_config(timeout));
                Kind::Server(manager.map_err(open)?)
            }
            RedisTarget::Cluster(nodes) => {
                let mut builder = redis::cluster::ClusterClientBuilder::new(nodes.clone())
                    .connection_timeout(timeout.max(Duration::from_millis(200)))
                    .response_timeout(timeout)
                    .retries(2)
                    .min_retry_wait(5)
                    .max_retry_wait(100);
                if ca.is_some() {
                    builder = builder.certs(certs());
                }
                let client = builder.build().map_err(open)?;
                let config = redis::cluster::ClusterConfig::new()
                    .set_connection_timeout(timeout.max(Duration::from_millis(200)))
                    .set_response_timeout(timeout);
                let connection = client.get_pending_async_connection_with_config(config);
                let seed = nodes
                    .first()
                    .map_or("redis://127.0.0.1", String::as_str)
                    .into_connection_info()
                    .map_err(open)?;
                let masters = Masters {
                    shards: Shards::default(),
                    seed,
                    ca: ca.clone(),
                    timeout,
                };
                Kind::Cluster(connection, Arc::new(masters))
            }
            RedisTarget::Sentinel { master, nodes } => {
                let follow = Follow::new(master, nodes, ca.clone(), timeout).map_err(open)?;
                follow.lost(&home.handle);
                Kind::Sentinel(follow)
            }
        };
        drop(_inside);
        let link = Link {
            kind,
            home: Arc::new(home),
            timeout,
            wait_replicas: 0,
            skew: Arc::default(),
        };
        link.read_shards();
        Ok(link)
    }

    /// On a Redis Cluster, the slot map as last read, with a connection to each
    /// master (`None` elsewhere).
    pub fn shards(&self) -> Option<Arc<Map<Master>>> {
        match &self.kind {
            Kind::Cluster(_, masters) => Some(masters.shards.map()),
            _ => None,
        }
    }

    /// On a Redis Cluster, reads the slot map again (one read at a time), on the
    /// engine's thread.
    pub fn read_shards(&self) {
        let Kind::Cluster(connection, masters) = &self.kind else {
            return;
        };
        if !masters.shards.start_reading() {
            return;
        }
        // Asked of a master whose calls succeed, on the engine's own connection to
        // it: the cluster connection may pick the master that just died, or wait
        // for its own map. Before the first map, or with no healthy master, the
        // cluster connection asks.
        let healthy = (masters.shards.map().masters())
            .find(|master| !master.health.is_open())
            .map(|master| master.connection.clone());
        let (connection, masters, timeout) = (connection.clone(), masters.clone(), self.timeout);
        self.home.handle.spawn(async move {
            let mut slots = redis::cmd("CLUSTER");
            slots.arg("SLOTS");
            let wait = timeout.max(Duration::from_millis(500));
            let read = async {
                if let Some(mut master) = healthy
                    && let Ok(Ok(answer)) =
                        tokio::time::timeout(wait, slots.query_async::<Value>(&mut master)).await
                {
                    return Ok(Ok(answer));
                }
                let mut connection = connection;
                tokio::time::timeout(wait, slots.query_async::<Value>(&mut connection)).await
            };
            let connect = |host: &str, port| masters.connect(host, port);
            match read.await {
                Ok(Ok(answer)) if masters.shards.update(&answer, connect) => {}
                Ok(Ok(_)) => tracing::warn!("redis cluster: an unreadable CLUSTER SLOTS answer"),
                Ok(Err(err)) => tracing::warn!(error = %err, "redis cluster: no slot map"),
                Err(_) => tracing::warn!("redis cluster: no slot map within the timeout"),
            }
            masters.shards.done_reading();
        });
    }

    /// This link, with decisions answered only once `replicas` replicas have their
    /// counts.
    pub fn waiting_for(self, replicas: u32) -> Link {
        Link {
            wait_replicas: replicas,
            ..self
        }
    }

    /// Replicas that must have a decision's counts before it is answered (0: none).
    pub fn wait_replicas(&self) -> u32 {
        self.wait_replicas
    }

    /// How long any call may wait for Redis.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The server's clock against the gateway's, for calls not sent to a Cluster
    /// master of the slot map.
    pub fn skew(&self) -> Arc<Skew> {
        self.skew.clone()
    }

    /// Runs the call `query` makes with the connection on the engine's thread, and
    /// waits for its answer (at most the timeout) from whichever runtime asks. With
    /// Sentinel, a failed call has the sentinels asked for the master again.
    pub async fn query<T, Q, F>(&self, query: Q) -> Result<T, StoreError>
    where
        Q: FnOnce(Connection) -> F,
        F: Future<Output = redis::RedisResult<T>> + Send + 'static,
        T: Send + 'static,
    {
        self.start(None, query).await
    }

    /// Starts the call `query` makes on the engine's thread now, with `on` (a
    /// Cluster master's connection from [`Link::shards`]) or else the link's own
    /// connection; the future returned waits for its answer (at most the timeout).
    /// Calls started one after the other are in flight together.
    pub fn start<T, Q, F>(
        &self,
        on: Option<ConnectionManager>,
        query: Q,
    ) -> impl Future<Output = Result<T, StoreError>> + Send + 'static + use<T, Q, F>
    where
        Q: FnOnce(Connection) -> F,
        F: Future<Output = redis::RedisResult<T>> + Send + 'static,
        T: Send + 'static,
    {
        let follow = match &self.kind {
            Kind::Sentinel(follow) => Some((follow.clone(), self.home.handle.clone())),
            _ => None,
        };
        let connection = match (on, &self.kind) {
            (Some(c), _) => Some(Connection::Server(c)),
            (None, Kind::Server(c)) => Some(Connection::Server(c.clone())),
            (None, Kind::Cluster(c, _)) => Some(Connection::Cluster(c.clone())),
            (None, Kind::Sentinel(follow)) => follow.current().map(Connection::Server),
        };
        let answer = connection.map(|connection| {
            let (timeout, call) = (self.timeout, query(connection));
            self.home.handle.spawn(async move {
                match tokio::time::timeout(timeout, call).await {
                    Ok(answer) => answer.map_err(StoreError::from),
                    Err(_) => Err(StoreError::Timeout(timeout)),
                }
            })
        });
        async move {
            let answer = match answer {
                Some(answer) => answer.await.map_err(|_| StoreError::Stopped)?,
                None => Err(StoreError::NoMaster),
            };
            if let (Err(_), Some((follow, home))) = (&answer, follow) {
                follow.lost(&home);
            }
            answer
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_master_named_without_an_address_is_reached_at_the_seeds() {
        let seed = ConnectionAddr::Tcp("10.0.0.9".to_string(), 7000);
        assert_eq!(endpoint("", &seed), "10.0.0.9");
        assert_eq!(endpoint("?", &seed), "10.0.0.9");
        assert_eq!(endpoint("10.0.0.2", &seed), "10.0.0.2");
    }
}
