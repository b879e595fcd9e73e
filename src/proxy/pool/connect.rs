//! Making a new connection to a pool's target: TCP, TLS for `https://` (with ALPN
//! choosing HTTP/2 or HTTP/1.1), the HTTP handshake, each step within the connect
//! timeout; and a request's connection made by a task of its own, so an abandoned
//! request's connection still reaches the pool.
//!
//! It does not choose between pooled and new connections: the parent module does.

use std::sync::Arc;
use std::time::Duration;

use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::{Failure, Pool, RequestBody, Transport, h2};
use crate::config::UpstreamProtocol;

impl Pool {
    /// A new connection, made by a task of its own: if the request that asked for it
    /// goes away meanwhile, the connection goes to the pool instead of being closed
    /// (a flood of abandoned requests would otherwise open one for each).
    pub(super) async fn connect_kept(
        self: &Arc<Pool>,
        timeout: Duration,
    ) -> Result<SendRequest<RequestBody>, Failure> {
        let (made, wanted) = tokio::sync::oneshot::channel();
        let pool = self.clone();
        tokio::spawn(async move {
            let made_h1 = match pool.connect(timeout, false).await {
                Ok(h2::Connected::H1(sender)) => Ok(sender),
                Ok(h2::Connected::H2(_)) => Err(Failure::Connect(std::io::Error::other(
                    "an HTTP/1.1 connection spoke HTTP/2",
                ))),
                Err(failure) => Err(failure),
            };
            if let Err(Ok(sender)) = made.send(made_h1) {
                pool.give_back(sender);
            }
        });
        wanted.await.unwrap_or_else(|_| {
            Err(Failure::Connect(std::io::Error::other(
                "the connecting task ended",
            )))
        })
    }

    /// A new connection to the target: HTTP/1.1, or with `h2` HTTP/2 (by prior
    /// knowledge on `http://`; on `https://` as ALPN settles it, HTTP/1.1 when an
    /// `auto` target chose it).
    pub(super) async fn connect(
        &self,
        timeout: Duration,
        h2: bool,
    ) -> Result<h2::Connected, Failure> {
        let stream = within(timeout, "connection", TcpStream::connect(&*self.address)).await?;
        stream.set_nodelay(true).map_err(Failure::Connect)?;
        match (&self.transport, &self.tls) {
            (Transport::Plain, _) if h2 => h2::handshake_h2(stream).await,
            (Transport::Plain, _) => handshake(stream).await,
            (Transport::Tls { .. }, Some((h1_connector, h2_connector, name))) => {
                let connector = if h2 { h2_connector } else { h1_connector };
                // A failed handshake (an untrusted or wrong certificate) is a target
                // that cannot be used, like one that refuses: skipped for a while.
                let stream = within(
                    timeout,
                    "TLS handshake",
                    connector.connect(name.clone(), stream),
                )
                .await?;
                let chose_h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
                match (h2, chose_h2, self.protocol) {
                    (true, true, _) => h2::handshake_h2(stream).await,
                    (true, false, UpstreamProtocol::H2) => {
                        Err(Failure::Connect(std::io::Error::new(
                            std::io::ErrorKind::InvalidData,
                            format!("{} did not agree to HTTP/2 (ALPN h2)", self.address),
                        )))
                    }
                    _ => handshake(stream).await,
                }
            }
            (Transport::Tls { .. }, None) => Err(Failure::Connect(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{} is not a name a certificate can carry", self.address),
            ))),
        }
    }

    /// A new connection to the target (over TLS for `https://`), for one use of its
    /// own: a WebSocket's upgrade, which never comes back to the pool.
    pub(crate) async fn open(
        &self,
        timeout: Duration,
    ) -> Result<Box<dyn crate::http::upgrade::Stream>, Failure> {
        let stream = within(timeout, "connection", TcpStream::connect(&*self.address)).await?;
        stream.set_nodelay(true).map_err(Failure::Connect)?;
        match (&self.transport, &self.tls) {
            (Transport::Plain, _) => Ok(Box::new(stream)),
            // An upgrade is HTTP/1.1: ALPN offers only that.
            (Transport::Tls { .. }, Some((connector, _, name))) => {
                let handshake = connector.connect(name.clone(), stream);
                Ok(Box::new(within(timeout, "TLS handshake", handshake).await?))
            }
            (Transport::Tls { .. }, None) => Err(Failure::Connect(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{} is not a name a certificate can carry", self.address),
            ))),
        }
    }
}

/// `step` of making a connection, as a [`Failure::Connect`] if it fails or takes
/// longer than `timeout`.
async fn within<T>(
    timeout: Duration,
    step: &str,
    future: impl Future<Output = std::io::Result<T>>,
) -> Result<T, Failure> {
    match tokio::time::timeout(timeout, future).await {
        Ok(result) => result.map_err(Failure::Connect),
        Err(_) => Err(Failure::Connect(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no {step} within {timeout:?}"),
        ))),
    }
}

/// HTTP/1.1 over `io`; the connection is driven by its own task.
async fn handshake<IO>(io: IO) -> Result<h2::Connected, Failure>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    // Flattened writes, as on the server side (see `server::http_builder`).
    let (sender, connection) = http1::Builder::new()
        .writev(false)
        .handshake(TokioIo::new(io))
        .await
        .map_err(Failure::Exchange)?;
    tokio::spawn(async move {
        if let Err(err) = connection.await {
            tracing::debug!(error = %err, "upstream connection ended");
        }
    });
    Ok(h2::Connected::H1(sender))
}
