//! Accepting connections and speaking HTTP: the accept loop, per-connection limits
//! and timeouts, and graceful shutdown.
//!
//! hyper 1 through hyper-util's auto builder (HTTP/1.1, and HTTP/2 with prior
//! knowledge). One timer per connection keeps `header_timeout` (a request head is due
//! that long after the connection opened or its previous response ended) and
//! `idle_timeout`, checked against what the connection did meanwhile. At most
//! `max_connections` are served at once: the accept loop waits for a free slot,
//! leaving further clients in the kernel's backlog. A connection that moves no
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
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
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

use crate::body::Body;
use crate::config::ServerConfig;
use crate::conn::{Alpn, ConnInfo, Scheme};
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
        // header_timeout is kept by the connection's own timer (`serve_connection`):
        // hyper's arms a timer per request.
        .header_read_timeout(None)
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
///
/// One timer per connection keeps every time limit: it wakes when the next one could
/// be due and checks them against what the connection did meanwhile (requests handed
/// over and answered, bytes moved), so a request costs no timer of its own.
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
    let exchanges = Arc::new(Exchanges::new());
    let shared = exchanges.clone();
    let service = service_fn(move |mut request: Request<Incoming>| {
        shared.receive(request.version());
        if request.version() <= Version::HTTP_11
            && let Some(malformed) = marks.take()
        {
            request.extensions_mut().insert(malformed);
        }
        let gateway = gateway.clone();
        let watch = Watch(Some(shared.clone()));
        async move {
            let response = gateway.handle(request, conn).await;
            Ok::<_, Infallible>(response.map(|body| watch.answered(body)))
        }
    });
    let connection = builder.serve_connection(io, service);
    tokio::pin!(connection);
    let mut timers = Timers::new(limits, tokio::time::Instant::now());
    let timer = tokio::time::sleep_until(timers.first_check());
    tokio::pin!(timer);
    // Seen by a receiver of its own: `stopped` borrows `stop` for the loop's life.
    let stop_seen = stop.clone();
    let stopped = stop.changed();
    tokio::pin!(stopped);
    let flood = exchanges.flood.notified();
    tokio::pin!(flood);
    let mut closing = false;
    // The stop and flood signals are polled (a lock each) only when the task's waker
    // is new to them or their flags say they fired, not on every wake.
    let mut registered: Option<std::task::Waker> = None;
    loop {
        let event = std::future::poll_fn(|cx| {
            if let Poll::Ready(result) = connection.as_mut().poll(cx) {
                return Poll::Ready(Event::Ended(result));
            }
            if timer.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Event::Timer);
            }
            if closing {
                return Poll::Pending;
            }
            let fresh = !registered.as_ref().is_some_and(|w| w.will_wake(cx.waker()));
            if fresh {
                registered = Some(cx.waker().clone());
            }
            if (fresh || exchanges.flooded()) && flood.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Event::Flood);
            }
            if (fresh || stop_seen.has_changed().unwrap_or(true))
                && stopped.as_mut().poll(cx).is_ready()
            {
                return Poll::Ready(Event::Stop);
            }
            Poll::Pending
        })
        .await;
        match event {
            Event::Ended(result) => {
                if let Err(err) = result {
                    tracing::debug!(%peer, error = %err, "connection ended with an error");
                }
                return;
            }
            Event::Timer => {
                let now = tokio::time::Instant::now();
                match timers.check(now, &exchanges, &active) {
                    Check::Wait(next) => timer.as_mut().reset(next),
                    Check::Close(next) => {
                        closing = true;
                        connection.as_mut().graceful_shutdown();
                        timer.as_mut().reset(next);
                    }
                    Check::Cut(why) => {
                        tracing::debug!(%peer, "{why}");
                        return;
                    }
                }
            }
            Event::Stop => {
                closing = true;
                timers.stop_idle_checks();
                connection.as_mut().graceful_shutdown();
            }
            Event::Flood => {
                tracing::warn!(%peer, "too many requests cancelled on one connection; closing it");
                closing = true;
                connection.as_mut().graceful_shutdown();
                let at = tokio::time::Instant::now() + Duration::from_secs(1);
                timers.force_close_at(at);
                let next = timer.deadline().min(at);
                timer.as_mut().reset(next);
            }
        }
    }
}

/// What woke the connection loop.
enum Event<E> {
    /// The connection ended, with hyper's error if it failed.
    Ended(Result<(), E>),
    /// The timer: a time limit may be due.
    Timer,
    /// The listener is stopping: close gracefully.
    Stop,
    /// Too many requests abandoned: close.
    Flood,
}

/// Requests one connection may abandon before it is closed: browsers cancel a few
/// (navigation, aborted fetches); thousands are a rapid-reset attack.
pub const MAX_CANCELLED: u32 = 100;

/// What a connection's requests tell its timers and its flood guard: how many hyper
/// handed over, how many were answered (the response body ended or was dropped, or
/// the request was abandoned) and when the last one was, how many were abandoned.
struct Exchanges {
    opened: quanta::Instant,
    received: AtomicU64,
    answered: AtomicU64,
    /// Nanoseconds after `opened` when the last answer ended.
    answered_at: AtomicU64,
    /// Set by the first HTTP/2 request: streams are not heads awaited in turn.
    http2: AtomicBool,
    cancelled: AtomicU32,
    flood: tokio::sync::Notify,
}

impl Exchanges {
    fn new() -> Exchanges {
        Exchanges {
            opened: quanta::Instant::now(),
            received: AtomicU64::new(0),
            answered: AtomicU64::new(0),
            answered_at: AtomicU64::new(0),
            http2: AtomicBool::new(false),
            cancelled: AtomicU32::new(0),
            flood: tokio::sync::Notify::new(),
        }
    }

    /// The client abandoned enough requests to be closed.
    fn flooded(&self) -> bool {
        self.cancelled.load(Ordering::Relaxed) >= MAX_CANCELLED
    }

    fn receive(&self, version: Version) {
        self.received.fetch_add(1, Ordering::Relaxed);
        if version == Version::HTTP_2 {
            self.http2.store(true, Ordering::Relaxed);
        }
    }

    fn answer(&self) {
        // quanta's TSC read, the cheapest clock: this runs once per request.
        let at = (quanta::Instant::now() - self.opened).as_nanos();
        self.answered_at
            .store(u64::try_from(at).unwrap_or(u64::MAX), Ordering::Relaxed);
        self.answered.fetch_add(1, Ordering::Relaxed);
    }

    /// How long after the connection opened the awaited request head is due:
    /// `header_timeout` after the connection opened or its last answer ended. None
    /// while a request is being served, and on HTTP/2 once a request came (its idle
    /// streams are `idle_timeout`'s).
    fn head_due(&self, header_timeout: Duration) -> Option<Duration> {
        let received = self.received.load(Ordering::Relaxed);
        if received == 0 {
            return Some(header_timeout);
        }
        if self.http2.load(Ordering::Relaxed) || received > self.answered.load(Ordering::Relaxed) {
            return None;
        }
        Some(Duration::from_nanos(self.answered_at.load(Ordering::Relaxed)) + header_timeout)
    }
}

/// What the connection's timer found.
enum Check {
    /// Nothing is due before this.
    Wait(tokio::time::Instant),
    /// Idle: close gracefully, and check again then.
    Close(tokio::time::Instant),
    /// A limit passed: drop the connection.
    Cut(&'static str),
}

/// The time limits of one connection, all kept by one timer.
struct Timers {
    opened: tokio::time::Instant,
    header_timeout: Duration,
    /// A quarter of `idle_timeout`: the idle check's period.
    tick: Duration,
    /// The next idle check, until the connection is closing.
    idle_check: Option<tokio::time::Instant>,
    quiet_ticks: u32,
    /// A connection asked to close that has not closed by then is dropped.
    force_close: Option<tokio::time::Instant>,
}

impl Timers {
    fn new(limits: Limits, opened: tokio::time::Instant) -> Timers {
        let tick = limits.idle / 4;
        Timers {
            opened,
            header_timeout: limits.header,
            tick,
            idle_check: Some(opened + tick),
            quiet_ticks: 0,
            force_close: None,
        }
    }

    /// When the timer first wakes: the first head or idle check, whichever is due
    /// first.
    fn first_check(&self) -> tokio::time::Instant {
        self.earliest(self.opened + self.header_timeout)
    }

    /// Checks every limit at `now`.
    fn check(
        &mut self,
        now: tokio::time::Instant,
        exchanges: &Exchanges,
        active: &AtomicBool,
    ) -> Check {
        if self.force_close.is_some_and(|at| now >= at) {
            return Check::Cut("connection did not close gracefully in time; dropping it");
        }
        // A request being served puts the head check off by a whole header_timeout:
        // its answer ends later than now, so the head after it is due later still.
        let head_due = match exchanges.head_due(self.header_timeout) {
            Some(due) => self.opened + due,
            None => now + self.header_timeout,
        };
        if now >= head_due {
            return Check::Cut("no request head within header_timeout");
        }
        let mut close = false;
        if let Some(at) = self.idle_check
            && now >= at
        {
            // A connection is closed after between 1 and 1.25 idle_timeouts without a
            // byte in either direction.
            if active.swap(false, Ordering::Relaxed) {
                self.quiet_ticks = 0;
                self.idle_check = Some(now + self.tick);
            } else {
                self.quiet_ticks += 1;
                if self.quiet_ticks >= 4 {
                    close = true;
                    self.idle_check = None;
                    self.force_close = Some(now + self.tick * 4);
                } else {
                    self.idle_check = Some(now + self.tick);
                }
            }
        }
        let next = self.earliest(head_due);
        if close {
            Check::Close(next)
        } else {
            Check::Wait(next)
        }
    }

    /// No more idle checks: the connection is closing for another reason.
    fn stop_idle_checks(&mut self) {
        self.idle_check = None;
    }

    /// Drops the connection at `at` if it has not closed by then (the timer must
    /// wake by then too).
    fn force_close_at(&mut self, at: tokio::time::Instant) {
        self.idle_check = None;
        self.force_close = Some(at);
    }

    fn earliest(&self, head_due: tokio::time::Instant) -> tokio::time::Instant {
        [Some(head_due), self.idle_check, self.force_close]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(head_due)
    }
}

/// Counts its request as cancelled if dropped before it is answered.
struct Watch(Option<Arc<Exchanges>>);

impl Watch {
    /// The request got its response: the connection learns when its body ends.
    fn answered(mut self, body: Body) -> Answer {
        Answer {
            body,
            exchanges: self.0.take(),
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Some(exchanges) = self.0.take() {
            exchanges.answer();
            if exchanges.cancelled.fetch_add(1, Ordering::Relaxed) + 1 == MAX_CANCELLED {
                exchanges.flood.notify_one();
            }
        }
    }
}

/// A response body that tells its connection when it ends (or is dropped).
struct Answer {
    body: Body,
    exchanges: Option<Arc<Exchanges>>,
}

impl hyper::body::Body for Answer {
    type Data = bytes::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Answer {
    fn drop(&mut self) {
        if let Some(exchanges) = self.exchanges.take() {
            exchanges.answer();
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
