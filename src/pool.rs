//! Keep-alive HTTP/1.1 connections to one upstream target.
//!
//! A connection is taken from the pool for one exchange and comes back when the
//! response body has been read to its end ([`UpstreamBody`] hands it back as it is
//! dropped), so a pooled connection is always idle and ready for the next request.
//! A connection idle for longer than [`IDLE_FOR`], or closed by the upstream, is
//! dropped instead of reused. A request that could not be written on a pooled
//! connection (the upstream closed it at that moment) is sent once more on a new one.
//!
//! Built on hyper's connection-level client: no connector layers, no executor
//! hand-off and no per-request boxing between the gateway and the socket.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// Idle connections are kept this long (nginx keepalive_timeout: 60 s).
pub const IDLE_FOR: Duration = Duration::from_secs(60);
/// Idle connections kept per target at most; more are closed when they come back.
pub const MAX_IDLE: usize = 512;

/// Why an exchange failed.
#[derive(Debug)]
pub enum Failure {
    /// No connection could be made: the target is down or refuses.
    Connect(std::io::Error),
    /// The connection failed while sending or before the response head.
    Exchange(hyper::Error),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Connect(err) => write!(f, "connect: {err}"),
            Failure::Exchange(err) => write!(f, "{err}"),
        }
    }
}

struct Idle {
    sender: SendRequest<Incoming>,
    since: Instant,
}

/// The pool of one target.
#[derive(Debug)]
pub struct Pool {
    /// `host:port` to connect to.
    address: String,
    connect_timeout: Duration,
    idle: Mutex<Vec<Idle>>,
}

impl std::fmt::Debug for Idle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idle").field("since", &self.since).finish()
    }
}

impl Pool {
    pub fn new(address: String, connect_timeout: Duration) -> Arc<Pool> {
        Arc::new(Pool {
            address,
            connect_timeout,
            idle: Mutex::new(Vec::new()),
        })
    }

    /// The `host:port` connected to.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Sends `request` (origin-form URI) and returns the response head; the body
    /// streams from the connection, which returns to the pool at the body's end.
    pub async fn send(
        self: &Arc<Pool>,
        mut request: Request<Incoming>,
    ) -> Result<Response<UpstreamBody>, Failure> {
        if let Some(mut sender) = self.take() {
            // The previous exchange has ended; the connection may still be finishing
            // it. If it closes instead, the request is not written and comes back.
            let _ = sender.ready().await;
            match sender.try_send_request(request).await {
                Ok(response) => return Ok(self.attach(response, sender)),
                Err(mut err) => match err.take_message() {
                    // Not written: the pooled connection was closing. Try a new one.
                    Some(unsent) => request = unsent,
                    None => return Err(Failure::Exchange(err.into_error())),
                },
            }
        }
        let mut sender = self.connect().await?;
        match sender.send_request(request).await {
            Ok(response) => Ok(self.attach(response, sender)),
            Err(err) => Err(Failure::Exchange(err)),
        }
    }

    /// A pooled connection that is open and not idle for too long.
    fn take(&self) -> Option<SendRequest<Incoming>> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(Idle { sender, since }) = idle.pop() {
            if !sender.is_closed() && since.elapsed() < IDLE_FOR {
                return Some(sender);
            }
        }
        None
    }

    fn give_back(&self, sender: SendRequest<Incoming>) {
        if sender.is_closed() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push(Idle {
                sender,
                since: Instant::now(),
            });
        }
    }

    async fn connect(&self) -> Result<SendRequest<Incoming>, Failure> {
        let stream = tokio::time::timeout(
            self.connect_timeout,
            TcpStream::connect(self.address.as_str()),
        )
        .await
        .map_err(|_| {
            Failure::Connect(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no connection within {:?}", self.connect_timeout),
            ))
        })?
        .map_err(Failure::Connect)?;
        stream.set_nodelay(true).map_err(Failure::Connect)?;
        let (sender, connection) = http1::Builder::new()
            .handshake(TokioIo::new(stream))
            .await
            .map_err(Failure::Exchange)?;
        tokio::spawn(async move {
            if let Err(err) = connection.await {
                tracing::debug!(error = %err, "upstream connection ended");
            }
        });
        Ok(sender)
    }

    fn attach(
        self: &Arc<Pool>,
        response: Response<Incoming>,
        sender: SendRequest<Incoming>,
    ) -> Response<UpstreamBody> {
        response.map(|body| UpstreamBody {
            body,
            ended: false,
            home: Some((sender, self.clone())),
        })
    }
}

/// An upstream response body; its connection goes back to the pool once the body
/// has been read to the end, and is closed if the body is dropped before that.
pub struct UpstreamBody {
    body: Incoming,
    ended: bool,
    home: Option<(SendRequest<Incoming>, Arc<Pool>)>,
}

impl std::fmt::Debug for UpstreamBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamBody")
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if let Poll::Ready(None) = polled {
            self.ended = true;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for UpstreamBody {
    fn drop(&mut self) {
        if let Some((sender, pool)) = self.home.take()
            && (self.ended || self.body.is_end_stream())
        {
            pool.give_back(sender);
        }
    }
}
