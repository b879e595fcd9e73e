//! Accepting connections and speaking HTTP: the accept loop, per-connection limits
//! and timeouts, and graceful shutdown.
//!
//! hyper 1 through hyper-util's auto builder (HTTP/1.1, and HTTP/2 with prior
//! knowledge), with a tokio `Timer` so `header_timeout` really cuts slow clients.
//! At most `max_connections` are served at once: the accept loop waits for a free
//! slot, leaving further clients in the kernel's backlog. A connection that moves no
//! bytes for `idle_timeout` is closed gracefully. A connection is served over any
//! `AsyncRead + AsyncWrite` stream ([`serve_connection`]), so a TLS stream plugs in
//! where a TCP one does, and each request reaches the [`Handler`] with the
//! connection's [`ConnInfo`]. The bytes an HTTP/1 connection reads also go past a
//! [`crate::wire::Scanner`], whose marks ride on the requests they concern. This
//! module knows nothing about routes or limits.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response, Version};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio_rustls::TlsAcceptor;

use crate::config::ServerConfig;
use crate::conn::{Alpn, ConnInfo, Scheme};
use crate::proxy::Body;
use crate::wire::{Marks, Scanner};

/// Something that answers requests: the gateway, or the admin API.
pub trait Handler: Send + Sync + 'static {
    fn handle(
        &self,
        request: Request<Incoming>,
        conn: ConnInfo,
    ) -> impl Future<Output = Response<Body>> + Send;
}

/// Serves `listener` until `shutdown` completes, then lets in-flight requests
/// finish (up to `drain_timeout`) and returns. At most `max_connections` are served
/// at once: `slots` holds that many permits, shared by every worker serving the
/// same address.
pub async fn serve<H: Handler>(
    listener: TcpListener,
    gateway: Arc<H>,
    settings: &ServerConfig,
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

/// Completes the TLS handshake within `header_timeout`, then serves the connection
/// with the negotiated ALPN protocol in its [`ConnInfo`].
async fn serve_tls<H: Handler>(
    acceptor: TlsAcceptor,
    builder: auto::Builder<TokioExecutor>,
    stream: tokio::net::TcpStream,
    conn: ConnInfo,
    gateway: Arc<H>,
    stop: watch::Receiver<bool>,
    limits: Limits,
) {
    // The handshake counts against header_timeout: a client that stalls in it holds
    // a connection slot no longer than a slow request head.
    let stream = match tokio::time::timeout(limits.header, acceptor.accept(stream)).await {
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
    serve_connection(builder, stream, conn, gateway, stop, limits).await;
}

/// The HTTP/1.1 and HTTP/2 settings every connection of a listener is served with.
pub fn http_builder(settings: &ServerConfig) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(settings.header_timeout)
        .max_buf_size(read_buffer(settings))
        .max_headers(256)
        // One flattened buffer and write(2) per response instead of writev over a
        // queue of buffers: for API-sized answers the copy is cheaper than the queue
        // (proxied: -1.7k instructions, -0.8 us CPU per request).
        .writev(false);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(settings.max_header_bytes as u32)
        .max_concurrent_streams(settings.h2_max_streams);
    builder
}

/// hyper's HTTP/1 read buffer, which bounds a request head: at least 8 KiB (hyper's
/// minimum; smaller `max_header_bytes` are enforced by the head checks).
fn read_buffer(settings: &ServerConfig) -> usize {
    settings.max_header_bytes.max(8192)
}

/// The per-connection limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// No byte in either direction for this long closes the connection.
    pub idle: Duration,
    /// The first request head must arrive within this.
    pub header: Duration,
    /// hyper's HTTP/1 read buffer: no request head is longer.
    pub max_head: usize,
}

/// Serves one connection over `io` until it ends, `stop` changes (graceful close), or
/// a time limit cuts it.
pub async fn serve_connection<H, IO>(
    builder: auto::Builder<TokioExecutor>,
    io: IO,
    conn: ConnInfo,
    gateway: Arc<H>,
    mut stop: watch::Receiver<bool>,
    limits: Limits,
) where
    H: Handler,
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let peer = conn.peer;
    let (idle_timeout, header_timeout) = (limits.idle, limits.header);
    let first_request = Arc::new(AtomicBool::new(false));
    let seen = first_request.clone();
    let active = Arc::new(AtomicBool::new(true));
    // HTTP/1 heads are watched for what hyper accepts without telling (see `wire`).
    let marks = Arc::new(Marks::default());
    let scanner =
        (conn.alpn != Some(Alpn::H2)).then(|| Scanner::new(limits.max_head, marks.clone()));
    let io = TokioIo::new(Tracked {
        inner: io,
        active: active.clone(),
        scanner,
    });
    // Requests the client abandoned before their answer (an HTTP/2 RST_STREAM, or a
    // closed connection): past MAX_CANCELLED, the connection is closed (GOAWAY), so
    // a rapid-reset flood cannot make sluice start upstream work without end.
    let cancelled = Arc::new(Cancelled::default());
    let counter = cancelled.clone();
    let service = service_fn(move |mut request: Request<Incoming>| {
        seen.store(true, Ordering::Relaxed);
        if request.version() <= Version::HTTP_11
            && let Some(malformed) = marks.take()
        {
            request.extensions_mut().insert(malformed);
        }
        let gateway = gateway.clone();
        let watch = Watch(Some(counter.clone()));
        async move {
            let response = gateway.handle(request, conn).await;
            watch.done();
            Ok::<_, Infallible>(response)
        }
    });
    let connection = builder.serve_connection(io, service);
    tokio::pin!(connection);
    // The idle check runs four times per idle_timeout: a connection is closed after
    // between 1 and 1.25 idle_timeouts without a byte in either direction.
    let tick = idle_timeout / 4;
    let mut quiet_ticks = 0;
    let mut closing = false;
    let mut header_pending = true;
    let header_deadline = tokio::time::sleep(header_timeout);
    tokio::pin!(header_deadline);
    let force_close = tokio::time::sleep(Duration::from_secs(86_400 * 365));
    tokio::pin!(force_close);
    let mut idle_closing = false;
    loop {
        tokio::select! {
            _ = &mut header_deadline, if header_pending => {
                header_pending = false;
                if !first_request.load(Ordering::Relaxed) {
                    tracing::debug!(%peer, "no request head within header_timeout");
                    return;
                }
            }
            _ = &mut force_close, if idle_closing => {
                tracing::debug!(%peer, "idle connection did not close gracefully; dropping it");
                return;
            }
            result = connection.as_mut() => {
                if let Err(err) = result {
                    tracing::debug!(%peer, error = %err, "connection ended with an error");
                }
                return;
            }
            _ = tokio::time::sleep(tick), if !closing => {
                if active.swap(false, Ordering::Relaxed) {
                    quiet_ticks = 0;
                } else {
                    quiet_ticks += 1;
                    if quiet_ticks >= 4 {
                        closing = true;
                        idle_closing = true;
                        force_close.as_mut().reset(tokio::time::Instant::now() + tick * 4);
                        connection.as_mut().graceful_shutdown();
                    }
                }
            }
            _ = stop.changed(), if !closing => {
                closing = true;
                connection.as_mut().graceful_shutdown();
            }
            _ = cancelled.flood.notified(), if !closing => {
                tracing::warn!(%peer, "too many requests cancelled on one connection; closing it");
                closing = true;
                connection.as_mut().graceful_shutdown();
                force_close.as_mut().reset(tokio::time::Instant::now() + Duration::from_secs(1));
                idle_closing = true;
            }
        }
    }
}

/// Requests one connection may abandon before it is closed: browsers cancel a few
/// (navigation, aborted fetches); thousands are a rapid-reset attack.
pub const MAX_CANCELLED: u32 = 100;

/// Counts a connection's abandoned requests.
#[derive(Default)]
struct Cancelled {
    count: std::sync::atomic::AtomicU32,
    flood: tokio::sync::Notify,
}

/// Counts its request as cancelled if dropped before [`Watch::done`].
struct Watch(Option<Arc<Cancelled>>);

impl Watch {
    fn done(mut self) {
        self.0 = None;
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Some(cancelled) = self.0.take()
            && cancelled.count.fetch_add(1, Ordering::Relaxed) + 1 == MAX_CANCELLED
        {
            cancelled.flood.notify_one();
        }
    }
}

/// A stream that notes whether any byte moved since the last idle check, and shows
/// the bytes it reads to the HTTP/1 head scanner.
struct Tracked<IO> {
    inner: IO,
    active: Arc<AtomicBool>,
    scanner: Option<Scanner>,
}

impl<IO: AsyncRead + Unpin> AsyncRead for Tracked<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let poll = Pin::new(&mut this.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.active.store(true, Ordering::Relaxed);
            if let Some(scanner) = &mut this.scanner {
                scanner.feed(&buf.filled()[before..]);
            }
        }
        poll
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Tracked<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_write(cx, data);
        // Only bytes that went out count: a write that waits on a client that stopped
        // reading is not activity, so idle_timeout cuts such a client.
        if let Poll::Ready(Ok(n)) = poll
            && n > 0
        {
            this.active.store(true, Ordering::Relaxed);
        }
        poll
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = poll
            && n > 0
        {
            this.active.store(true, Ordering::Relaxed);
        }
        poll
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
