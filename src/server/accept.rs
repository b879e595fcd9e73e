//! The accept loop of one listener: a connection slot first, then a connection, each
//! served on a task of its own; on shutdown, the drain.
//!
//! At most `max_connections` are served at once: the loop waits for a free slot
//! before it accepts, leaving further clients in the kernel's backlog. This module
//! does not speak HTTP or keep time limits; `connection` does.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio_rustls::TlsAcceptor;

use super::Handler;
use super::connection::{Limits, http_builder, read_buffer, serve_connection};
use super::tls_accept::serve_tls;
use crate::config::ServerStartup;
use crate::conn::ConnInfo;

/// Serves `listener` until `shutdown` completes, then lets in-flight requests
/// finish (up to `drain_timeout`) and returns. At most `max_connections` are served
/// at once: `slots` holds that many permits, shared by every worker serving the
/// same address.
pub async fn serve<H: Handler>(
    listener: TcpListener,
    gateway: Arc<H>,
    settings: &ServerStartup,
    slots: Arc<Semaphore>,
    shutdown: impl Future<Output = ()>,
    tls: Option<TlsAcceptor>,
) {
    let builder = http_builder(settings);
    let grace = settings.drain_timeout;
    let (stop_tx, stop_rx) = watch::channel(false);
    let idle_timeout = settings.idle_timeout;
    let header_timeout = settings.header_timeout;
    let max_head = read_buffer(settings);
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
        let _ = stream.set_nodelay(true);
        let conn = ConnInfo::plain(peer, *local.as_ref().unwrap_or(&peer));
        let gateway = gateway.clone();
        let builder = builder.clone();
        let stop = stop_rx.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let limits = Limits {
                idle: idle_timeout,
                header: header_timeout,
                max_head,
            };
            match tls {
                None => serve_connection(builder, stream, conn, gateway, stop, limits).await,
                // Boxed: a handshake's state is kilobytes, which plain connections
                // should not carry in their task.
                Some(acceptor) => {
                    Box::pin(serve_tls(
                        acceptor, builder, stream, conn, gateway, stop, limits,
                    ))
                    .await
                }
            }
            drop(permit);
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    // Every connection holds a permit until it is done: wait for all of them.
    let all = settings.max_connections as u32;
    let _ = tokio::time::timeout(grace, slots.acquire_many(all)).await;
}
