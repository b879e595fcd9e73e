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
use std::sync::atomic::{AtomicBool, Ordering};
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
use tokio::sync::watch;

use super::exchanges::{Answer, Exchanges, Watch};
use super::timers::{Check, Timers};
use super::tracked::Tracked;
use super::{FloodGuard, Handler};
use crate::config::ServerStartup;
use crate::conn::{Alpn, ConnInfo};
use crate::refusal::Refusal;
use crate::wire::{Marks, Scanner};

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

/// What every connection of a listener is served with.
pub(crate) struct ConnSettings<H> {
    /// hyper's HTTP/1.1 and HTTP/2 settings ([`http_builder`]), shared: a copy in
    /// every connection would weigh on idle ones.
    pub builder: Arc<Http>,
    /// Answers the connection's requests.
    pub handler: Arc<H>,
    /// Changes when the listener stops: the connection then closes gracefully.
    pub stop: watch::Receiver<bool>,
    /// The connection's time limits and its longest request head.
    pub limits: Limits,
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
            builder: Arc::new(http_builder(settings)),
            handler,
            stop,
            limits: Limits {
                idle: settings.idle_timeout,
                header: settings.header_timeout,
                max_head: read_buffer(settings),
            },
        }
    }
}

// By hand: a derived Clone would ask `H: Clone`, and only the Arc is cloned.
impl<H> Clone for ConnSettings<H> {
    fn clone(&self) -> ConnSettings<H> {
        ConnSettings {
            builder: self.builder.clone(),
            handler: self.handler.clone(),
            stop: self.stop.clone(),
            limits: self.limits,
        }
    }
}

/// The per-connection limits.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// No byte in either direction for this long closes the connection.
    pub idle: Duration,
    /// The first request head must arrive within this.
    pub header: Duration,
    /// hyper's HTTP/1 read buffer: no request head is longer.
    pub max_head: usize,
}

/// Serves one connection over `io` until it ends, `settings.stop` changes (graceful
/// close), or a time limit cuts it; `conn` goes with each request to the handler.
///
/// One timer per connection keeps every time limit: it wakes when the next one could
/// be due and checks them against what the connection did meanwhile (requests handed
/// over and answered, bytes moved), so a request costs no timer of its own.
///
/// An HTTP/1 connection holds hyper's state (its read and write buffers, kilobytes)
/// only while it is busy: when the timer finds every request answered and hyper
/// waiting for the next head with none of it read ([`HAND_BACK_AFTER`] after the
/// state was taken or last found busy), the state is ended without closing the
/// stream ([`Stage::Http1`]), and a fresh one starts when the client sends again,
/// with any bytes read ahead carried over. An idle keep-alive connection is left
/// with the stream and this supervisor.
pub(crate) async fn serve_connection<H, IO>(io: IO, conn: ConnInfo, settings: ConnSettings<H>)
where
    H: Handler,
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let ConnSettings {
        builder: http,
        handler: gateway,
        mut stop,
        limits,
    } = settings;
    let peer = conn.peer;
    let active = Arc::new(AtomicBool::new(true));
    // HTTP/1 heads are watched for what hyper accepts without telling (see `wire`).
    let marks = Arc::new(Marks::default());
    let h2 = conn.alpn == Some(Alpn::H2);
    let scanner = (!h2).then(|| Scanner::new(limits.max_head, marks.clone()));
    let calm = Arc::new(AtomicBool::new(false));
    let exchanges = Arc::new(Exchanges::new());
    let mut io = Tracked::new(io, active.clone(), scanner, h2, calm.clone());
    if !h2 {
        io.report_idle_to(exchanges.clone());
    }
    let shared = exchanges.clone();
    let guard = gateway.clone();
    // Behind a trusted proxy, floods are its clients': each request's is noted.
    let forwarded = matches!(guard.flood_guard(peer.ip()), FloodGuard::Forwarded(_));
    let service = service_fn(move |mut request: Request<Incoming>| {
        shared.receive(request.version());
        let http1 = request.version() <= Version::HTTP_11;
        if http1 {
            if let Some(malformed) = marks.take() {
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
            let response = if closing {
                Refusal::ConnectionClosing.into_response()
            } else if let Some(left) = blocked {
                let retry_after = left.as_secs() + u64::from(left.subsec_nanos() > 0);
                Refusal::FloodBlocked { retry_after }.into_response()
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
    let mut stage = match h2 {
        true => Stage::start_http2(&http, io, &service),
        false => Stage::Sniff(Box::new(io), [0; PREFACE.len()], 0),
    };
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
            let mut started = false;
            let advanced = stage.advance(cx, &http, &service, &exchanges, closing, &mut started);
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
            Event::Ended(result) => {
                if let Err(err) = result {
                    tracing::debug!(%peer, error = %err, "connection ended with an error");
                    if calmed_by_h2(&*err) {
                        remember_flood(&*guard, peer, &exchanges);
                    }
                }
                return;
            }
            Event::Timer => {
                let now = tokio::time::Instant::now();
                let head_due = exchanges.head_due(timers.header_timeout());
                match timers.check(now, head_due, &active) {
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
                        return;
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
                remember_flood(&*guard, peer, &exchanges);
                closing = true;
                // GOAWAY(ENHANCE_YOUR_CALM) first, then h2's graceful close; streams
                // the client still opens meanwhile get 503.
                exchanges.close();
                calm.store(true, Ordering::Relaxed);
                stage.graceful_shutdown();
                let at = tokio::time::Instant::now() + Duration::from_secs(1);
                timers.force_close_at(at);
                let next = timer.deadline().min(at);
                timer.as_mut().reset(next);
            }
        }
    }
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
    /// HTTP/1 between requests: no hyper state; the next bytes start one.
    Waiting(Box<Tracked<IO>>),
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

    /// Moves the connection on as far as it goes; ready when it ended. `started` is
    /// set when a fresh HTTP/1 state took the stream.
    fn advance(
        &mut self,
        cx: &mut Context<'_>,
        http: &Http,
        service: &S,
        exchanges: &Exchanges,
        closing: bool,
        started: &mut bool,
    ) -> Poll<Result<(), Failure>> {
        // A connection that just went idle waits for a wake before it starts anew.
        let mut just_idle = false;
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
                        return Poll::Ready(Ok(()));
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
                Stage::Waiting(_) if just_idle => return Poll::Pending,
                Stage::Waiting(_) => {
                    let Stage::Waiting(io) = std::mem::replace(self, Stage::Done) else {
                        unreachable!()
                    };
                    *self = Stage::start_http1(http, *io, service, exchanges);
                    *started = true;
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
                        if io.carries() {
                            *self = Stage::start_http1(http, *io, service, exchanges);
                        } else {
                            *self = Stage::Waiting(io);
                            just_idle = true;
                        }
                    }
                },
                Stage::Http2(connection) => {
                    let result = ready!(connection.as_mut().poll(cx));
                    *self = Stage::Done;
                    return Poll::Ready(result.map_err(Into::into));
                }
                Stage::Closing(io) => {
                    let _ = ready!(Pin::new(&mut **io).poll_shutdown(cx));
                    *self = Stage::Done;
                    return Poll::Ready(Ok(()));
                }
                Stage::Done => return Poll::Ready(Ok(())),
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
            Stage::Sniff(..) | Stage::Waiting(_) => {
                let (Stage::Sniff(io, ..) | Stage::Waiting(io)) =
                    std::mem::replace(self, Stage::Done)
                else {
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
enum Event {
    /// The connection ended, with the error if it failed.
    Ended(Result<(), Failure>),
    /// The timer: a time limit may be due.
    Timer,
    /// The listener is stopping: close gracefully.
    Stop,
    /// Too many requests abandoned: close.
    Flood,
}
