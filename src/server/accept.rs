//! The accept loop of one listener: a connection slot first, then a connection, each
//! served on a task of its own; on shutdown, the drain.
//!
//! At most `max_connections` are served at once: the loop waits for a free slot
//! before it accepts, leaving further clients in the kernel's backlog. A connection
//! from an address blocked for floods (`offenders`) is closed as soon as it is
//! accepted, before any TLS or HTTP work. This module
//! does not speak HTTP or keep time limits; `connection` does.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio_rustls::TlsAcceptor;

use super::connection::{ConnSettings, serve_connection};
use super::tls_accept::serve_tls;
use super::{FloodGuard, Handler};
use crate::config::ServerStartup;
use crate::server::conn::ConnInfo;

/// A bound listener and what its connections are served with.
pub(crate) struct Listening<H> {
    /// The socket connections are accepted from.
    pub listener: TcpListener,
    /// Answers every request of every connection.
    pub handler: Arc<H>,
    /// The `[server]` start-up settings: timeouts, hyper's limits, the connection
    /// cap and the drain.
    pub settings: ServerStartup,
    /// `max_connections` permits, shared by every worker serving the same address: a
    /// connection holds one until it ends.
    pub slots: Arc<Semaphore>,
    /// Does the TLS handshake on every connection; `None` serves plain HTTP.
    pub tls: Option<TlsAcceptor>,
}

/// Serves `listening` until `shutdown` completes, then lets in-flight requests
/// finish and open WebSockets run (up to `drain_timeout`), closes the sockets still
/// open (1001) and returns. At most `max_connections` are served
/// at once: a connection waits for one of the `slots`.
pub(crate) async fn serve<H: Handler>(listening: Listening<H>, shutdown: impl Future<Output = ()>) {
    let Listening {
        listener,
        handler,
        settings,
        slots,
        tls,
    } = listening;
    let grace = settings.drain_timeout;
    let (stop_tx, stop_rx) = watch::channel(false);
    let (drained_tx, drained_rx) = watch::channel(false);
    let served = Arc::new(ConnSettings::new(
        &settings,
        handler.clone(),
        stop_rx,
        drained_rx,
    ));
    let local = listener.local_addr();
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            _ = &mut shutdown => break,
            permit = slots.clone().acquire_owned() => permit.expect("semaphore is never closed"),
        };
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        if let FloodGuard::Peer(offenders, key) = handler.flood_guard(peer.ip())
            && offenders.blocked(key, Instant::now())
        {
            tracing::debug!(%peer, "refused: the address is blocked after a flood");
            drop(stream);
            continue;
        }
        let _ = stream.set_nodelay(true);
        let conn = ConnInfo::plain(peer, *local.as_ref().unwrap_or(&peer));
        let served = served.clone();
        let tls = tls.clone();
        // Not an async block: what it captured would stay in the task beside the
        // connection's state.
        match tls {
            None => tokio::spawn(serve_connection(stream, conn, served, permit)),
            // Boxed: a handshake's state is kilobytes, which plain connections should
            // not carry in their task.
            Some(acceptor) => {
                tokio::spawn(Box::pin(serve_tls(acceptor, stream, conn, served, permit)))
            }
        };
    }
    drop(listener);
    let _ = stop_tx.send(true);
    // Every connection holds a permit until it is done: wait for all of them.
    let all = settings.max_connections as u32;
    if tokio::time::timeout(grace, slots.acquire_many(all))
        .await
        .is_err()
    {
        // WebSockets are still open (or requests still in flight): the sockets are
        // closed now (1001), and their close frames given a moment to go out.
        let _ = drained_tx.send(true);
        let _ = tokio::time::timeout(SOCKETS_CLOSE, slots.acquire_many(all)).await;
    }
}

/// How long open WebSockets have to send their close frames once the drain is over.
const SOCKETS_CLOSE: Duration = Duration::from_secs(1);
