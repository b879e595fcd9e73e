//! TLS on an accepted connection: the rustls handshake, within `header_timeout`, and
//! the negotiated ALPN protocol into the connection's [`ConnInfo`].
//!
//! Certificates are chosen by `tls::Certificates` (SNI, files re-read on change);
//! this module only runs the handshake and hands the stream to `serve_connection`.

use std::sync::Arc;

use tokio::sync::OwnedSemaphorePermit;
use tokio_rustls::TlsAcceptor;

use super::Handler;
use super::connection::{ConnSettings, serve_connection};
use crate::server::conn::{Alpn, ConnInfo, Scheme};

/// Completes the TLS handshake on `stream` with `acceptor` within `header_timeout`,
/// then serves the connection with the negotiated ALPN protocol in its [`ConnInfo`];
/// `slot` is held until the connection ends.
pub(super) async fn serve_tls<H: Handler>(
    acceptor: TlsAcceptor,
    stream: tokio::net::TcpStream,
    conn: ConnInfo,
    settings: Arc<ConnSettings<H>>,
    slot: OwnedSemaphorePermit,
) {
    // The handshake counts against header_timeout: a client that stalls in it holds
    // a connection slot no longer than a slow request head.
    let stream = match tokio::time::timeout(settings.limits.header, acceptor.accept(stream)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(err)) => {
            tracing::debug!(peer = %conn.peer, error = %err, "TLS handshake failed");
            return;
        }
        Err(_) => {
            tracing::debug!(peer = %conn.peer, "no TLS handshake within header_timeout");
            return;
        }
    };
    let alpn = match stream.get_ref().1.alpn_protocol() {
        Some(b"h2") => Some(Alpn::H2),
        Some(b"http/1.1") => Some(Alpn::Http11),
        _ => None,
    };
    let conn = ConnInfo {
        scheme: Scheme::Https,
        alpn,
        ..conn
    };
    serve_connection(stream, conn, settings, slot).await;
}
