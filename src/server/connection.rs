//! One connection's supervisor: hyper serves it, while one loop watches what else
//! can end it: the listener stopping (graceful close), too many abandoned requests
//! (rapid reset: GOAWAY(ENHANCE_YOUR_CALM), 503 for streams still arriving, and the
//! address remembered in `offenders`), and the time limits `timers` keeps. A
//! connection h2 itself closes with ENHANCE_YOUR_CALM is remembered the same way.
//!
//! The connection's requests report to it through [`Exchanges`]: each one handed
//! over, each one answered (when its response body ends or is dropped) and each one
//! abandoned, without a lock or a timer per request. Its stream is wrapped in a
//! [`Tracked`] that notes moved bytes for the idle check and shows HTTP/1 bytes to
//! the head scanner. This module does not accept connections or terminate TLS.

use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use http::{Request, Version};
use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, watch};
use tokio::time::Sleep;

use super::exchanges::{Answer, Exchanges, Watch};
use super::timers::{Check, ConnLimits, Timers};
use super::tracked::Tracked;
use super::{FloodGuard, Handler};
use crate::config::ServerStartup;
use crate::http::refusal::Refusal;
use crate::http::wire::{Marks, Scanner};
use crate::server::conn::{Alpn, ConnInfo};

/// hyper's HTTP/1.1 and HTTP/2 settings every connection of a listener is served
/// with.
#[derive(Clone)]
pub(crate) struct Http {
    http1: http1::Builder,
    http2: http2::Builder<TokioExecutor>,
}

/// The HTTP/1.1 and HTTP/2 settings every connection of a listener is served with.
pub(crate) fn http_builder(settings: &ServerStartup) -> Http {
    let mut http1 = http1::Builder::new();
    http1
        // header_timeout is kept by the connection's own timer (`serve_connection`):
        // hyper's arms a timer per request.
        .header_read_timeout(None)
        .max_buf_size(read_buffer(settings))
        .max_headers(256)
        // One flattened buffer and write(2) per response instead of writev over a
        // queue of buffers: for API-sized answers the copy is cheaper than the queue
        // (proxied: -1.7k instructions, -0.8 us CPU per request).
        .writev(false);
    let mut http2 = http2::Builder::new(TokioExecutor::new());
    http2
        .timer(TokioTimer::new())
        .max_header_list_size(settings.max_header_bytes as u32)
        .max_concurrent_streams(settings.h2_max_streams);
    Http { http1, http2 }
}

/// hyper's HTTP/1 read buffer, which bounds a request head: at least 8 KiB (hyper's
/// minimum; smaller `max_header_bytes` are enforced by the head checks).
pub(super) fn read_buffer(settings: &ServerStartup) -> usize {
    settings.max_header_bytes.max(8192)
}

/// What every connection of a listener is served with, shared by them all (a copy in
/// every connection would weigh on idle ones).
pub(crate) struct ConnSettings<H> {
    /// hyper's HTTP/1.1 and HTTP/2 settings ([`http_builder`]).
    pub builder: Http,
    /// Answers the connection's requests.
    pub handler: Arc<H>,
    /// Changes when the listener stops: the connection then closes gracefully.
    pub stop: watch::Receiver<bool>,
    /// The connection's time limits and its longest request head.
    pub limits: ConnLimits,
}

impl<H> ConnSettings<H> {
    /// How a listener started with `settings` serves its connections with `handler`
    /// until `stop` changes.
    pub(crate) fn new(
        settings: &ServerStartup,
        handler: Arc<H>,
        stop: watch::Receiver<bool>,
    ) -> ConnSettings<H> {
        ConnSettings {
            builder: http_builder(settings),
            handler,
            stop,
            limits: ConnLimits {
                idle: settings.idle_timeout,
                header: settings.header_timeout,
                max_head: read_buffer(settings),
            },
        }
    }
}

/// Serves one connection over `io` until it ends, `settings.stop` changes (graceful
/// close), or a time limit cuts it; `conn` goes with each request to the handler, and
/// `slot` is held until the connection ends.
///
/// One timer per connection keeps every time limit: it wakes when the next one could
/// be due and checks them against what the connection did meanwhile (requests handed
/// over and answered, bytes moved), so a request costs no timer of its own.
///
/// An HTTP/1 connection holds hyper's state (its read and write buffers, kilobytes)
/// and its supervisor ([`supervise`]: the service, the signals it watches) only while
/// it is busy: when the timer finds every request answered and hyper waiting for the
/// next head with none of it read ([`HAND_BACK_AFTER`] after the state was taken or
/// last found busy), hyper's state is ended without closing the stream and the
/// supervisor returns what lasts ([`Kept`]). The idle connection then waits with
/// only that, a timer and the stop signal ([`wait_idle`]); its next bytes start a
/// fresh supervisor and hyper state, carried over to them.
///
/// Not an `async fn`: its arguments would stay in the connection's task beside what
/// they became.
pub(crate) fn serve_connection<H, IO>(
    io: IO,
    conn: ConnInfo,
    settings: Arc<ConnSettings<H>>,
    slot: OwnedSemaphorePermit,
) -> impl Future<Output = ()> + Send + 'static
where
    H: Handler,
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // Boxed apart from the task: see `Kept`.
    let mut kept = Box::new(Kept::open(io, conn, settings, slot));
    async move {
        let mut start = Start::Open;
        loop {
            // Boxed: the busy supervisor's state (about 1.5 KB) is not carried by an
            // idle connection's task.
            kept = match Box::pin(supervise(kept, start)).await {
                Some(idle) => idle,
                None => return,
            };
            start = match wait_idle(&mut kept).await {
                Some(start) => start,
                None => return,
            };
        }
    }
}

/// What lasts for a connection's whole life, busy or idle: its stream and the state
/// its requests, its timers and its flood guard share.
///
/// Kept in a block of its own, not in the connection's task: a task holding it would
/// be a 1 KB block, the size class of blocks hyper allocates for a busy connection and
/// frees when it goes idle, whose holes stay resident beside every idle task. Apart,
/// an idle HTTP/1 connection's task is a 512-byte block and this a 448-byte one.
struct Kept<IO, H> {
    io: Tracked<IO>,
    conn: ConnInfo,
    settings: Arc<ConnSettings<H>>,
    exchanges: Arc<Exchanges>,
    /// HTTP/1 heads are watched for what hyper accepts without telling (see `wire`).
    marks: Arc<Marks>,
    timers: Timers,
    /// When the timer is to wake next.
    next_check: tokio::time::Instant,
    /// The connection's place under `max_connections`, freed when it ends.
    slot: OwnedSemaphorePermit,
}

impl<IO, H> Kept<IO, H>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    /// A connection just accepted (and its TLS handshake done).
    fn open(
        io: IO,
        conn: ConnInfo,
        settings: Arc<ConnSettings<H>>,
        slot: OwnedSemaphorePermit,
    ) -> Kept<IO, H> {
        let marks = Arc::new(Marks::default());
        let h2 = conn.alpn == Some(Alpn::H2);
        let scanner = (!h2).then(|| Scanner::new(settings.limits.max_head, marks.clone()));
        let exchanges = Arc::new(Exchanges::new());
        let mut io = Tracked::new(io, exchanges.clone(), scanner, h2);
        if !h2 {
            io.report_idle();
        }
        let timers = Timers::new(settings.limits, tokio::time::Instant::now());
        let next_check = timers.first_check();
        Kept {
            io,
            conn,
            settings,
            exchanges,
            marks,
            timers,
            next_check,
            slot,
        }
    }
}

impl<IO: AsyncRead + Unpin, H> Kept<IO, H> {
    /// Ready when the idle connection's client sent bytes (read and carried over to
    /// hyper) or closed, or a time limit passed.
    fn poll_idle(&mut self, cx: &mut Context<'_>, mut timer: Pin<&mut Sleep>) -> Poll<Woken> {
        let mut first = [0; 2048];
        let mut read = ReadBuf::new(&mut first);
        match Pin::new(&mut self.io).poll_read(cx, &mut read) {
            Poll::Ready(Ok(())) if read.filled().is_empty() => return Poll::Ready(Woken::Closed),
            Poll::Ready(Ok(())) => {
                self.io.carry(Bytes::copy_from_slice(read.filled()));
                return Poll::Ready(Woken::Bytes);
            }
            Poll::Ready(Err(err)) => return Poll::Ready(Woken::Failed(err)),
            Poll::Pending => {}
        }
        while timer.as_mut().poll(cx).is_ready() {
            let now = tokio::time::Instant::now();
            let head_due = self.exchanges.head_due(self.timers.header_timeout());
            match self.timers.check(now, head_due, &self.exchanges.active) {
                Check::Wait(next) => timer.as_mut().reset(next),
                Check::Close(next) => return Poll::Ready(Woken::Close(next)),
                Check::Cut(why) => return Poll::Ready(Woken::Cut(why)),
            }
        }
        self.next_check = timer.deadline();
        Poll::Pending
    }
}

/// How a supervisor takes the connection over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    /// Just opened: the protocol is yet to be seen (or ALPN chose `h2`).
    Open,
    /// Idle HTTP/1 whose client sent again: hyper serves from its next bytes.
    Serve,
    /// Idle too long: close gracefully.
    Close,
    /// The listener is stopping: close gracefully.
    Stop,
}

/// Supervises the connection while it is busy: hyper serves it, while one loop
/// watches what else can end it: the listener stopping, too many abandoned requests,
/// and the time limits. Returns what lasts once an HTTP/1 connection went idle with
/// hyper's state handed back; `None` once the connection ended.
async fn supervise<H, IO>(kept: Box<Kept<IO, H>>, start: Start) -> Option<Box<Kept<IO, H>>>
where
    H: Handler,
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let Kept {
        io,
        conn,
        settings,
        exchanges,
        marks,
        mut timers,
        next_check,
        slot,
    } = *kept;
    let ConnSettings {
        builder: http,
        handler,
        stop,
        ..
    } = &*settings;
    let peer = conn.peer;
    let shared = exchanges.clone();
    let gateway = handler.clone();
    let heads = marks.clone();
    // Behind a trusted proxy, floods are its clients': each request's is noted.
    let forwarded = matches!(handler.flood_guard(peer.ip()), FloodGuard::Forwarded(_));
    let service = service_fn(move |mut request: Request<Incoming>| {
        shared.receive(request.version());
        let http1 = request.version() <= Version::HTTP_11;
        if http1 {
            if let Some(malformed) = heads.take() {
                request.extensions_mut().insert(malformed);
            }
            if ends_keep_alive(request.version(), request.headers()) {
                shared.end_after_this();
            }
        }
        let gateway = gateway.clone();
        let client = forwarded
            .then(|| gateway.forwarded_client(&request, peer.ip()))
            .flatten();
        let blocked = client.and_then(|client| blocked_for(&*gateway, peer, client));
        let watch = Watch::new(shared.clone(), client);
        let closing = shared.closing();
        let shared = shared.clone();
        // Boxed: hyper hands an HTTP/1 connection state back only if the service's
        // future can be moved.
        let answer: Answering = Box::pin(async move {
            // The refusals are made here, not carried: the future stays as small as
            // it was before they were logged (it is moved into a box per request).
            let response = if closing {
                gateway.refuse(request, conn, Refusal::ConnectionClosing)
            } else if let Some(left) = blocked {
                let retry_after = left.as_secs() + u64::from(left.subsec_nanos() > 0);
                gateway.refuse(request, conn, Refusal::FloodBlocked { retry_after })
            } else {
                gateway.handle(request, conn).await
            };
            if http1 && ends_keep_alive(Version::HTTP_11, response.headers()) {
                shared.end_after_this();
            }
            Ok::<_, Infallible>(response.map(|body| watch.answered(body)))
        });
        answer
    });
    let mut closing = matches!(start, Start::Close | Start::Stop);
    if start == Start::Stop {
        timers.stop_idle_checks();
    }
    let io = Box::new(io);
    let (mut stage, first_check) = match start {
        Start::Open if conn.alpn == Some(Alpn::H2) => {
            (Stage::start_http2(http, *io, &service), next_check)
        }
        Start::Open => (Stage::Sniff(io, [0; PREFACE.len()], 0), next_check),
        Start::Serve => {
            let stage = Stage::start_http1(http, *io, &service, &exchanges);
            let look = tokio::time::Instant::now() + HAND_BACK_AFTER;
            (stage, next_check.min(look))
        }
        Start::Close | Start::Stop => (Stage::Closing(io), next_check),
    };
    let idle = {
        let timer = tokio::time::sleep_until(first_check);
        tokio::pin!(timer);
        // Seen by a receiver of its own: `stopped` borrows `stop` for the loop's life.
        let stop_seen = stop.clone();
        let mut stop = stop.clone();
        let stopped = stop.changed();
        tokio::pin!(stopped);
        let flood = exchanges.flood.notified();
        tokio::pin!(flood);
        // The stop and flood signals are polled (a lock each) only when the task's
        // waker is new to them or their flags say they fired, not on every wake.
        let mut registered: Option<std::task::Waker> = None;
        loop {
            let event = std::future::poll_fn(|cx| {
                let mut started = false;
                let advanced = stage.advance(cx, http, &service, &exchanges, closing, &mut started);
                if let Poll::Ready(result) = advanced {
                    return Poll::Ready(Event::Ended(result));
                }
                if started {
                    // hyper holds the connection's state again: look whether it went
                    // idle in a while (once per idle period, not per request).
                    let at = tokio::time::Instant::now() + HAND_BACK_AFTER;
                    if at < timer.deadline() {
                        timer.as_mut().reset(at);
                    }
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
                Event::Ended(Ok(Some(io))) => break Some((io, timer.deadline())),
                Event::Ended(Ok(None)) => break None,
                Event::Ended(Err(err)) => {
                    tracing::debug!(%peer, error = %err, "connection ended with an error");
                    if calmed_by_h2(&*err) {
                        remember_flood(&**handler, peer, &exchanges);
                    }
                    break None;
                }
                Event::Timer => {
                    let now = tokio::time::Instant::now();
                    let head_due = exchanges.head_due(timers.header_timeout());
                    match timers.check(now, head_due, &exchanges.active) {
                        Check::Wait(mut next) => {
                            if !closing && stage.hand_back_if_idle(&exchanges) {
                                // Busy: hyper keeps its state, and is asked again later.
                                next = next.min(now + HAND_BACK_AFTER);
                            }
                            timer.as_mut().reset(next);
                        }
                        Check::Close(next) => {
                            closing = true;
                            stage.graceful_shutdown();
                            timer.as_mut().reset(next);
                        }
                        Check::Cut(why) => {
                            tracing::debug!(%peer, "{why}");
                            break None;
                        }
                    }
                }
                Event::Stop => {
                    closing = true;
                    timers.stop_idle_checks();
                    stage.graceful_shutdown();
                }
                Event::Flood => {
                    tracing::warn!(%peer, "too many requests cancelled on one connection; closing it");
                    remember_flood(&**handler, peer, &exchanges);
                    closing = true;
                    // GOAWAY(ENHANCE_YOUR_CALM) first, then h2's graceful close; streams
                    // the client still opens meanwhile get 503.
                    exchanges.close();
                    exchanges.calm.store(true, Ordering::Relaxed);
                    stage.graceful_shutdown();
                    let at = tokio::time::Instant::now() + Duration::from_secs(1);
                    timers.force_close_at(at);
                    let next = timer.deadline().min(at);
                    timer.as_mut().reset(next);
                }
            }
        }
    };
    let (io, next_check) = idle?;
    Some(Box::new(Kept {
        io: *io,
        conn,
        settings,
        exchanges,
        marks,
        timers,
        next_check,
        slot,
    }))
}

/// Waits with an idle HTTP/1 connection, holding only what lasts, for the client's
/// next bytes (read and carried over to hyper), a time limit, or the listener's stop;
/// returns how a supervisor is to take it over, or `None` if the connection ended.
async fn wait_idle<H, IO>(kept: &mut Kept<IO, H>) -> Option<Start>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let woken = {
        let timer = tokio::time::sleep_until(kept.next_check);
        tokio::pin!(timer);
        let mut stop = kept.settings.stop.clone();
        let stopped = stop.changed();
        tokio::pin!(stopped);
        // `kept` is used through a method: a closure naming its fields would hold a
        // reference to each in the task.
        std::future::poll_fn(|cx| {
            if let Poll::Ready(woken) = kept.poll_idle(cx, timer.as_mut()) {
                return Poll::Ready(woken);
            }
            match stopped.as_mut().poll(cx) {
                Poll::Ready(_) => Poll::Ready(Woken::Stop),
                Poll::Pending => Poll::Pending,
            }
        })
        .await
    };
    let start = match woken {
        Woken::Bytes => Start::Serve,
        Woken::Closed => Start::Close,
        Woken::Stop => Start::Stop,
        Woken::Close(next) => {
            kept.next_check = next;
            Start::Close
        }
        Woken::Failed(err) => {
            let peer = kept.conn.peer;
            tracing::debug!(%peer, error = %err, "connection ended with an error");
            return None;
        }
        Woken::Cut(why) => {
            let peer = kept.conn.peer;
            tracing::debug!(%peer, "{why}");
            return None;
        }
    };
    Some(start)
}

/// What woke an idle connection.
enum Woken {
    /// The client sent bytes, now carried by the stream.
    Bytes,
    /// The client closed its side.
    Closed,
    /// The listener is stopping.
    Stop,
    /// Idle too long: close gracefully, and check again then.
    Close(tokio::time::Instant),
    /// A limit passed: drop the connection.
    Cut(&'static str),
    /// Reading failed.
    Failed(std::io::Error),
}

/// How long after it was last seen busy an HTTP/1 connection's hyper state (its
/// buffers, kilobytes) is handed back, if the connection is idle by then. Handing it
/// back after every answer cost a fresh state per request: +6 000 instructions per
/// proxied request (39 843 -> 45 804 under callgrind, one keep-alive connection).
const HAND_BACK_AFTER: Duration = Duration::from_secs(1);

/// What a client sends first on HTTP/2 (RFC 9113, 3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The future answering one request.
type Answering = Pin<Box<dyn Future<Output = Result<Response<Answer>, Infallible>> + Send>>;

/// Why a connection ended, if not cleanly.
type Failure = Box<dyn std::error::Error + Send + Sync>;

/// Where a connection's stream is: who holds it and what is done with it.
enum Stage<IO, S: hyper::service::HttpService<Incoming>> {
    /// A connection without ALPN `h2`: its first bytes say whether it is HTTP/2
    /// with prior knowledge (the preface) or HTTP/1.
    Sniff(Box<Tracked<IO>>, [u8; PREFACE.len()], usize),
    /// hyper serving HTTP/1; `true` once it was asked to end at its idle point.
    Http1(Box<Http1<IO, S>>, bool),
    /// hyper serving HTTP/2, to the connection's end.
    Http2(Pin<Box<Http2<IO, S>>>),
    /// The stream is being shut down.
    Closing(Box<Tracked<IO>>),
    Done,
}

type Http1<IO, S> = http1::Connection<TokioIo<Tracked<IO>>, S>;
type Http2<IO, S> = http2::Connection<TokioIo<Tracked<IO>>, S, TokioExecutor>;

impl<IO, S> Stage<IO, S>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: hyper::service::Service<
            Request<Incoming>,
            Response = Response<Answer>,
            Error = Infallible,
            Future = Answering,
        > + Clone
        + Unpin
        + Send
        + 'static,
{
    /// A fresh HTTP/1 connection state over `io`. A wait for bytes reported before
    /// it (the first bytes of the connection, or a wake without any) is not its own.
    fn start_http1(
        http: &Http,
        io: Tracked<IO>,
        service: &S,
        exchanges: &Exchanges,
    ) -> Stage<IO, S> {
        exchanges.waiting(false);
        let connection = http
            .http1
            .serve_connection(TokioIo::new(io), service.clone());
        Stage::Http1(Box::new(connection), false)
    }

    fn start_http2(http: &Http, io: Tracked<IO>, service: &S) -> Stage<IO, S> {
        let connection = http
            .http2
            .serve_connection(TokioIo::new(io), service.clone());
        Stage::Http2(Box::pin(connection))
    }

    /// Moves the connection on as far as it goes; ready when it ended, with the
    /// stream if hyper's HTTP/1 state was handed back at an idle point with nothing
    /// read ahead. `started` is set when a fresh HTTP/1 state took the stream.
    fn advance(
        &mut self,
        cx: &mut Context<'_>,
        http: &Http,
        service: &S,
        exchanges: &Exchanges,
        closing: bool,
        started: &mut bool,
    ) -> Poll<Result<Option<Box<Tracked<IO>>>, Failure>> {
        loop {
            match self {
                Stage::Sniff(io, buf, have) => {
                    let mut read = ReadBuf::new(&mut buf[*have..]);
                    if let Err(err) = ready!(Pin::new(&mut **io).poll_read(cx, &mut read)) {
                        *self = Stage::Done;
                        return Poll::Ready(Err(err.into()));
                    }
                    let got = read.filled().len();
                    if got == 0 {
                        // Closed before a request.
                        *self = Stage::Done;
                        return Poll::Ready(Ok(None));
                    }
                    *have += got;
                    let h2 = buf[..*have] == PREFACE[..*have];
                    if h2 && *have < PREFACE.len() {
                        continue;
                    }
                    let Stage::Sniff(mut io, buf, have) = std::mem::replace(self, Stage::Done)
                    else {
                        unreachable!()
                    };
                    io.carry(Bytes::copy_from_slice(&buf[..have]));
                    *self = match h2 {
                        true => Stage::start_http2(http, *io, service),
                        false => Stage::start_http1(http, *io, service, exchanges),
                    };
                    *started = !h2;
                }
                Stage::Http1(connection, handing) => match connection.poll_without_shutdown(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Err(err)) => {
                        *self = Stage::Done;
                        return Poll::Ready(Err(err.into()));
                    }
                    Poll::Ready(Ok(())) => {
                        let handed = *handing && !closing && !exchanges.ends();
                        let Stage::Http1(connection, _) = std::mem::replace(self, Stage::Done)
                        else {
                            unreachable!()
                        };
                        let parts = connection.into_parts();
                        let mut io = Box::new(parts.io.into_inner());
                        if !handed {
                            *self = Stage::Closing(io);
                            continue;
                        }
                        io.carry(parts.read_buf);
                        if !io.carries() {
                            return Poll::Ready(Ok(Some(io)));
                        }
                        *self = Stage::start_http1(http, *io, service, exchanges);
                    }
                },
                Stage::Http2(connection) => {
                    let result = ready!(connection.as_mut().poll(cx));
                    *self = Stage::Done;
                    return Poll::Ready(result.map(|()| None).map_err(Into::into));
                }
                Stage::Closing(io) => {
                    let _ = ready!(Pin::new(&mut **io).poll_shutdown(cx));
                    *self = Stage::Done;
                    return Poll::Ready(Ok(None));
                }
                Stage::Done => return Poll::Ready(Ok(None)),
            }
        }
    }

    /// If hyper serves HTTP/1 and every request is answered with nothing of the next
    /// one read, asks it to end there: it adds no `Connection: close` (no response is
    /// being written) and gives the stream back ([`Stage::advance`]). Whether hyper
    /// still holds the connection's state after this (and will be asked again).
    fn hand_back_if_idle(&mut self, exchanges: &Exchanges) -> bool {
        match self {
            Stage::Http1(connection, handing) if !*handing => {
                if exchanges.idle() && !exchanges.ends() {
                    Pin::new(&mut **connection).graceful_shutdown();
                    *handing = true;
                    return false;
                }
                true
            }
            _ => false,
        }
    }

    /// Closes gracefully: hyper finishes what it serves, a connection between
    /// requests closes now.
    fn graceful_shutdown(&mut self) {
        match self {
            Stage::Http1(connection, _) => Pin::new(&mut **connection).graceful_shutdown(),
            Stage::Http2(connection) => connection.as_mut().graceful_shutdown(),
            Stage::Sniff(..) => {
                let Stage::Sniff(io, ..) = std::mem::replace(self, Stage::Done) else {
                    unreachable!()
                };
                *self = Stage::Closing(io);
            }
            Stage::Closing(_) | Stage::Done => {}
        }
    }
}

/// Whether a message of `version` with `headers` ends keep-alive: `Connection:
/// close`, or HTTP/1.0 without `Connection: keep-alive` (as hyper reads them).
fn ends_keep_alive(version: Version, headers: &http::HeaderMap) -> bool {
    let has = |token: &str| {
        headers
            .get_all(http::header::CONNECTION)
            .iter()
            .any(|value| {
                value
                    .to_str()
                    .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
            })
    };
    match version {
        Version::HTTP_10 => !has("keep-alive"),
        Version::HTTP_11 => has("close"),
        _ => false,
    }
}

/// `peer`'s connection was cut for a flood: refuses its address new connections for
/// a while or, from a trusted proxy, the forwarded client behind most of the
/// abandoned requests `exchanges` counted (if one is) further requests.
fn remember_flood<H: Handler>(handler: &H, peer: SocketAddr, exchanges: &Exchanges) {
    let now = std::time::Instant::now();
    match handler.flood_guard(peer.ip()) {
        FloodGuard::Off => {}
        FloodGuard::Peer(offenders, key) => {
            let block = offenders.flooded(key, now);
            tracing::warn!(%peer, ?block, "connection cut for a flood; its address is refused new connections");
        }
        FloodGuard::Forwarded(offenders) => {
            if let Some(client) = exchanges.main_abandoner() {
                let block = offenders.flooded(client, now);
                tracing::warn!(%peer, %client, ?block, "trusted proxy's connection cut for a client's flood; the client is refused");
            }
        }
    }
}

/// How long the forwarded `client` of trusted proxy `peer` is still refused.
fn blocked_for<H: Handler>(handler: &H, peer: SocketAddr, client: IpAddr) -> Option<Duration> {
    match handler.flood_guard(peer.ip()) {
        FloodGuard::Forwarded(offenders) => {
            offenders.blocked_for(client, std::time::Instant::now())
        }
        _ => None,
    }
}

/// Whether h2 itself closed the connection with `GOAWAY(ENHANCE_YOUR_CALM)`: too many
/// streams reset before they were handed over, CONTINUATION or header-list abuse,
/// too many DATA frames or locally reset streams.
fn calmed_by_h2(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(err);
    while let Some(err) = cause {
        if let Some(h2) = err.downcast_ref::<h2::Error>() {
            return h2.is_go_away()
                && h2.is_library()
                && h2.reason() == Some(h2::Reason::ENHANCE_YOUR_CALM);
        }
        cause = err.source();
    }
    false
}

/// What woke the connection loop.
enum Event<IO> {
    /// The connection ended (with the error if it failed), or went idle: then with
    /// its stream.
    Ended(Result<Option<Box<Tracked<IO>>>, Failure>),
    /// The timer: a time limit may be due.
    Timer,
    /// The listener is stopping: close gracefully.
    Stop,
    /// Too many requests abandoned: close.
    Flood,
}
