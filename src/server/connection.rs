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
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::Duration;

use http::{Request, Version};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;

use super::exchanges::{Exchanges, Watch};
use super::timers::{Check, Timers};
use super::tracked::Tracked;
use super::{FloodGuard, Handler};
use crate::config::ServerStartup;
use crate::conn::{Alpn, ConnInfo};
use crate::refusal::Refusal;
use crate::wire::{Marks, Scanner};

/// The HTTP/1.1 and HTTP/2 settings every connection of a listener is served with.
pub(crate) fn http_builder(settings: &ServerStartup) -> auto::Builder<TokioExecutor> {
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
pub(super) fn read_buffer(settings: &ServerStartup) -> usize {
    settings.max_header_bytes.max(8192)
}

/// What every connection of a listener is served with.
pub(crate) struct ConnSettings<H> {
    /// hyper's HTTP/1.1 and HTTP/2 settings ([`http_builder`]).
    pub builder: auto::Builder<TokioExecutor>,
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
            builder: http_builder(settings),
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
pub(crate) async fn serve_connection<H, IO>(io: IO, conn: ConnInfo, settings: ConnSettings<H>)
where
    H: Handler,
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let ConnSettings {
        builder,
        handler: gateway,
        mut stop,
        limits,
    } = settings;
    let peer = conn.peer;
    let active = Arc::new(AtomicBool::new(true));
    // HTTP/1 heads are watched for what hyper accepts without telling (see `wire`).
    let marks = Arc::new(Marks::default());
    let scanner =
        (conn.alpn != Some(Alpn::H2)).then(|| Scanner::new(limits.max_head, marks.clone()));
    let calm = Arc::new(AtomicBool::new(false));
    let h2 = conn.alpn == Some(Alpn::H2);
    let io = TokioIo::new(Tracked::new(io, active.clone(), scanner, h2, calm.clone()));
    let exchanges = Arc::new(Exchanges::new());
    let shared = exchanges.clone();
    let guard = gateway.clone();
    // Behind a trusted proxy, floods are its clients': each request's is noted.
    let forwarded = matches!(guard.flood_guard(peer.ip()), FloodGuard::Forwarded(_));
    let service = service_fn(move |mut request: Request<Incoming>| {
        shared.receive(request.version());
        if request.version() <= Version::HTTP_11
            && let Some(malformed) = marks.take()
        {
            request.extensions_mut().insert(malformed);
        }
        let gateway = gateway.clone();
        let client = forwarded
            .then(|| gateway.forwarded_client(&request, peer.ip()))
            .flatten();
        let blocked = client.and_then(|client| blocked_for(&*gateway, peer, client));
        let watch = Watch::new(shared.clone(), client);
        let closing = shared.closing();
        async move {
            let response = if closing {
                Refusal::ConnectionClosing.into_response()
            } else if let Some(left) = blocked {
                let retry_after = left.as_secs() + u64::from(left.subsec_nanos() > 0);
                Refusal::FloodBlocked { retry_after }.into_response()
            } else {
                gateway.handle(request, conn).await
            };
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
                remember_flood(&*guard, peer, &exchanges);
                closing = true;
                // GOAWAY(ENHANCE_YOUR_CALM) first, then h2's graceful close; streams
                // the client still opens meanwhile get 503.
                exchanges.close();
                calm.store(true, Ordering::Relaxed);
                connection.as_mut().graceful_shutdown();
                let at = tokio::time::Instant::now() + Duration::from_secs(1);
                timers.force_close_at(at);
                let next = timer.deadline().min(at);
                timer.as_mut().reset(next);
            }
        }
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
