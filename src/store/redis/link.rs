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
//! Deliberately not here: what is sent (the batcher, `bans`) and what a failure means
//! for a request (`super::super::fallback`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::runtime::Handle;
use tokio::sync::oneshot;

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

/// The connection to one Redis, on the engine's thread; cheap to clone.
#[derive(Clone)]
pub struct Link {
    connection: ConnectionManager,
    home: Arc<Home>,
    /// How long any call may wait for Redis.
    timeout: Duration,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Link {
    /// A link to `url`, whose calls wait at most `timeout`. It connects lazily, so a
    /// Redis that is down at start is a fault like any other, but a URL the client
    /// cannot use, or a thread that cannot start, is an error now.
    pub fn open(url: &str, timeout: Duration) -> Result<Link, StoreError> {
        let open = |source| StoreError::Open {
            url: url.to_string(),
            source: Arc::new(source),
        };
        let client = redis::Client::open(url).map_err(open)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout.max(Duration::from_millis(200))))
            .set_response_timeout(Some(timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(500));
        let home = Home::start().map_err(|err| StoreError::Thread(Arc::new(err)))?;
        let connection = {
            // The manager's own task starts on the engine's runtime.
            let _inside = home.handle.enter();
            ConnectionManager::new_lazy_with_config(client, config).map_err(open)?
        };
        Ok(Link {
            connection,
            home: Arc::new(home),
            timeout,
        })
    }

    /// How long any call may wait for Redis.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Runs the call `query` makes with the connection on the engine's thread, and
    /// waits for its answer (at most the timeout) from whichever runtime asks.
    pub async fn query<T, Q, F>(&self, query: Q) -> Result<T, StoreError>
    where
        Q: FnOnce(ConnectionManager) -> F,
        F: Future<Output = redis::RedisResult<T>> + Send + 'static,
        T: Send + 'static,
    {
        let (timeout, call) = (self.timeout, query(self.connection.clone()));
        let answer = self.home.handle.spawn(async move {
            match tokio::time::timeout(timeout, call).await {
                Ok(answer) => answer.map_err(StoreError::from),
                Err(_) => Err(StoreError::Timeout(timeout)),
            }
        });
        answer.await.map_err(|_| StoreError::Stopped)?
    }
}
