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
//! (a `ConnectionManager`), a Redis Cluster (the client's cluster connection, which
//! follows `MOVED` and `ASK`, refreshes its slot map when the topology changes and
//! pipelines to each node on a connection of its own), or the master a set of
//! sentinels names ([`super::sentinel`]), asked again whenever a call fails.
//!
//! Deliberately not here: what is sent (the batcher, `bans`) and what a failure means
//! for a request (`super::super::fallback`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, TlsCertificates, Value};
use tokio::runtime::Handle;
use tokio::sync::oneshot;

use super::sentinel::Follow;
use super::shards::{Shards, UNKNOWN};
use crate::config::RedisTarget;
use crate::store::StoreError;

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
    Cluster(ClusterConnection, Arc<Shards>),
    Sentinel(Arc<Follow>),
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
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
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
                Kind::Cluster(connection, Arc::default())
            }
            RedisTarget::Sentinel { master, nodes } => {
                let follow = Follow::new(master, nodes, timeout).map_err(open)?;
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
        };
        link.read_shards();
        Ok(link)
    }

    /// On a Redis Cluster, the node serving `key` as last read (`None` elsewhere, or
    /// when not known: the map is then read again).
    pub fn node_of(&self, key: &str) -> Option<u16> {
        let Kind::Cluster(_, shards) = &self.kind else {
            return None;
        };
        let node = shards.node_of(key);
        if node == UNKNOWN {
            self.read_shards();
            return None;
        }
        Some(node)
    }

    /// On a Redis Cluster, reads the slot map again (one read at a time), on the
    /// engine's thread.
    pub fn read_shards(&self) {
        let Kind::Cluster(connection, shards) = &self.kind else {
            return;
        };
        if !shards.start_reading() {
            return;
        }
        let (mut connection, shards, timeout) = (connection.clone(), shards.clone(), self.timeout);
        self.home.handle.spawn(async move {
            let mut slots = redis::cmd("CLUSTER");
            slots.arg("SLOTS");
            let read = tokio::time::timeout(
                timeout.max(Duration::from_millis(500)),
                slots.query_async::<Value>(&mut connection),
            );
            match read.await {
                Ok(Ok(answer)) if shards.update(&answer) => {}
                Ok(Ok(_)) => tracing::warn!("redis cluster: an unreadable CLUSTER SLOTS answer"),
                Ok(Err(err)) => tracing::warn!(error = %err, "redis cluster: no slot map"),
                Err(_) => tracing::warn!("redis cluster: no slot map within the timeout"),
            }
            shards.done_reading();
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

    /// Whether the target is a Redis Cluster: one script call may then only touch
    /// keys of one slot.
    pub fn is_cluster(&self) -> bool {
        matches!(self.kind, Kind::Cluster(..))
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
        let connection = match &self.kind {
            Kind::Server(c) => Connection::Server(c.clone()),
            Kind::Cluster(c, _) => Connection::Cluster(c.clone()),
            Kind::Sentinel(follow) => match follow.current() {
                Some(c) => Connection::Server(c),
                None => {
                    follow.lost(&self.home.handle);
                    return Err(StoreError::NoMaster);
                }
            },
        };
        let (timeout, call) = (self.timeout, query(connection));
        let answer = self.home.handle.spawn(async move {
            match tokio::time::timeout(timeout, call).await {
                Ok(answer) => answer.map_err(StoreError::from),
                Err(_) => Err(StoreError::Timeout(timeout)),
            }
        });
        let answer = answer.await.map_err(|_| StoreError::Stopped)?;
        if let (Err(_), Kind::Sentinel(follow)) = (&answer, &self.kind) {
            follow.lost(&self.home.handle);
        }
        answer
    }
}
