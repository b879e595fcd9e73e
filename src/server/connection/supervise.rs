//! The busy connection's supervisor: hyper serves it (its [`Stage`]), while one loop
//! watches what else can end it: the listener stopping (graceful close), too many
//! abandoned requests (rapid reset: GOAWAY(ENHANCE_YOUR_CALM), 503 for streams still
//! arriving, and the address remembered in `offenders`), and the time limits `timers`
//! keeps. A connection h2 itself closes with ENHANCE_YOUR_CALM is remembered the same
//! way. Each request reaches the handler through the connection's service
//! ([`service`]), which reports it to the connection's `Exchanges`.

use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use http::{Request, Response, Version};
use hyper::body::Incoming;
use hyper::service::service_fn;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tokio::time::{Instant, Sleep};

use super::stage::{Answering, Ended, Failure, Http, PREFACE, Stage};
use super::{HAND_BACK_AFTER, Kept, Start};
use crate::http::refusal::Refusal;
use crate::http::upgrade::{Drained, TakeOver, TakenOver};
use crate::http::wire::Marks;
use crate::server::conn::{Alpn, ConnInfo};
use crate::server::exchanges::{Answer, Exchanges, Watch};
use crate::server::timers::{Check, Timers};
use crate::server::tracked::Tracked;
use crate::server::{FloodGuard, Handler};

/// Supervises the connection while it is busy: hyper serves it, while one loop
/// watches what else can end it: the listener stopping, too many abandoned requests,
/// and the time limits. Returns what lasts once an HTTP/1 connection went idle with
/// hyper's state handed back; `None` once the connection ended.
pub(super) async fn supervise<H, IO>(
    kept: Box<Kept<IO, H>>,
    start: Start,
) -> Option<Box<Kept<IO, H>>>
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
    let service = service(
        &settings.handler,
        conn,
        &exchanges,
        &marks,
        &settings.drained,
    );
    if start == Start::Stop {
        timers.stop_idle_checks();
    }
    let http = &settings.builder;
    let io = Box::new(io);
    let (stage, first_check) = match start {
        Start::Open if conn.alpn == Some(Alpn::H2) => {
            (Stage::start_http2(http, *io, &service), next_check)
        }
        Start::Open => (Stage::Sniff(io, [0; PREFACE.len()], 0), next_check),
        Start::Serve => {
            let stage = Stage::start_http1(http, *io, &service, &exchanges);
            let look = Instant::now() + HAND_BACK_AFTER;
            (stage, next_check.min(look))
        }
        Start::Close | Start::Stop => (Stage::Closing(io), next_check),
    };
    let mut busy = Busy {
        stage,
        http,
        service: &service,
        handler: &*settings.handler,
        exchanges: &exchanges,
        timers: &mut timers,
        peer: conn.peer,
        closing: matches!(start, Start::Close | Start::Stop),
    };
    let (io, next_check) = match busy.run(first_check, &settings.stop).await {
        Left::Idle(io, next_check) => (io, next_check),
        Left::Gone => return None,
        Left::Switched(io, read_buf) => {
            let (stream, carried) = io.into_inner();
            let taken = TakenOver {
                stream: Box::new(stream),
                read_ahead: [read_buf, carried].concat().into(),
                hold: Box::new(slot),
                drained: settings.drained.clone(),
            };
            if let Some(take_over) = exchanges.switched() {
                take_over.give(taken);
            }
            return None;
        }
    };
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

/// The service a connection's requests reach the handler through: each one reported
/// to the connection's `exchanges` (handed over, then answered when its response
/// body ends), an HTTP/1 head hyper accepted silently marked for the head check, and
/// a request refused at once when the connection is closing after a flood or its
/// forwarded client is blocked for one. An HTTP/2 CONNECT carries `drained`, for
/// the WebSocket it may open.
fn service<H: Handler>(
    handler: &Arc<H>,
    conn: ConnInfo,
    exchanges: &Arc<Exchanges>,
    marks: &Arc<Marks>,
    drained: &watch::Receiver<bool>,
) -> impl hyper::service::Service<
    Request<Incoming>,
    Response = Response<Answer>,
    Error = Infallible,
    Future = Answering,
> + Clone
+ Unpin
+ Send
+ 'static {
    let peer = conn.peer;
    let shared = exchanges.clone();
    let gateway = handler.clone();
    let heads = marks.clone();
    // Behind a trusted proxy, floods are its clients': each request's is noted.
    let forwarded = matches!(handler.flood_guard(peer.ip()), FloodGuard::Forwarded(_));
    let drained = drained.clone();
    service_fn(move |request: Request<Incoming>| {
        // Boxed once, here: it travels through the handler's futures, and each move
        // of it by value would be a 264-byte copy.
        let mut request = Box::new(request);
        shared.receive(request.version());
        let http1 = request.version() <= Version::HTTP_11;
        if !http1 && request.method() == http::Method::CONNECT {
            request.extensions_mut().insert(Drained(drained.clone()));
        }
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
            let mut response = response;
            if http1 && response.status() == http::StatusCode::SWITCHING_PROTOCOLS {
                switch(&shared, &mut response);
            }
            Ok::<_, Infallible>(response.map(|body| watch.answered(body)))
        });
        answer
    })
}

/// Notes where the connection goes once the `101` is written, if it says (a `101`
/// that does not ends the connection).
fn switch(exchanges: &Exchanges, response: &mut Response<crate::http::body::Body>) {
    if let Some(take_over) = response.extensions_mut().remove::<TakeOver>() {
        exchanges.switch(take_over);
    }
}

/// A busy connection: where its stream is, and what its loop decides with.
struct Busy<'k, IO, S: hyper::service::HttpService<Incoming>, H> {
    stage: Stage<IO, S>,
    http: &'k Http,
    service: &'k S,
    handler: &'k H,
    exchanges: &'k Exchanges,
    timers: &'k mut Timers,
    peer: SocketAddr,
    /// Closing gracefully: the stop and flood signals no longer matter.
    closing: bool,
}

/// The signals a busy connection's loop watches besides its stage and its timer.
struct Signals<'p, 'n, F> {
    /// Fires when the listener stops.
    stopped: Pin<&'p mut F>,
    /// Whether the listener stopped, read without taking `stopped`'s lock.
    stop_seen: watch::Receiver<bool>,
    /// Fires when too many requests were abandoned.
    flood: Pin<&'p mut tokio::sync::futures::Notified<'n>>,
    /// The task's waker the signals were last polled with: they are polled (a lock
    /// each) only when the waker is new to them or their flags say they fired, not on
    /// every wake.
    registered: Option<Waker>,
}

impl<IO, S, H> Busy<'_, IO, S, H>
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
    H: Handler,
{
    /// Serves until the connection ends, goes idle with hyper's HTTP/1 state handed
    /// back (its stream, and when its timer is next due), or switches to a socket
    /// after a `101`.
    async fn run(&mut self, first_check: Instant, stop: &watch::Receiver<bool>) -> Left<IO> {
        let timer = tokio::time::sleep_until(first_check);
        tokio::pin!(timer);
        // Seen by a receiver of its own: `stopped` borrows `stop` for the loop's life.
        let mut stop = stop.clone();
        let stop_seen = stop.clone();
        let stopped = stop.changed();
        tokio::pin!(stopped);
        let exchanges: &Exchanges = self.exchanges;
        let flood = exchanges.flood.notified();
        tokio::pin!(flood);
        let mut signals = Signals {
            stopped,
            stop_seen,
            flood,
            registered: None,
        };
        loop {
            let polled = |cx: &mut Context<'_>| self.poll_event(cx, timer.as_mut(), &mut signals);
            match std::future::poll_fn(polled).await {
                Event::Ended(Ok(Ended::Idle(io))) => return Left::Idle(io, timer.deadline()),
                Event::Ended(Ok(Ended::Switched(io, read_buf))) => {
                    return Left::Switched(io, read_buf);
                }
                Event::Ended(Ok(Ended::Closed)) => return Left::Gone,
                Event::Ended(Err(err)) => {
                    tracing::debug!(peer = %self.peer, error = %err, "connection ended with an error");
                    if calmed_by_h2(&*err) {
                        remember_flood(self.handler, self.peer, self.exchanges);
                    }
                    return Left::Gone;
                }
                Event::Timer => {
                    if let Err(why) = self.on_timer(timer.as_mut()) {
                        tracing::debug!(peer = %self.peer, "{why}");
                        return Left::Gone;
                    }
                }
                Event::Stop => {
                    self.closing = true;
                    self.timers.stop_idle_checks();
                    self.stage.graceful_shutdown();
                }
                Event::Flood => self.on_flood(timer.as_mut()),
            }
        }
    }

    /// Moves the stage on, then looks at the timer and the signals: what woke the
    /// loop, if anything did.
    fn poll_event<F: Future>(
        &mut self,
        cx: &mut Context<'_>,
        mut timer: Pin<&mut Sleep>,
        signals: &mut Signals<'_, '_, F>,
    ) -> Poll<Event<IO>> {
        let mut started = false;
        let advanced = (self.stage).advance(
            cx,
            self.http,
            self.service,
            self.exchanges,
            self.closing,
            &mut started,
        );
        if let Poll::Ready(result) = advanced {
            return Poll::Ready(Event::Ended(result));
        }
        if started {
            // hyper holds the connection's state again: look whether it went idle in
            // a while (once per idle period, not per request).
            let at = Instant::now() + HAND_BACK_AFTER;
            if at < timer.deadline() {
                timer.as_mut().reset(at);
            }
        }
        if timer.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Event::Timer);
        }
        if self.closing {
            return Poll::Pending;
        }
        let registered = &mut signals.registered;
        let fresh = !registered.as_ref().is_some_and(|w| w.will_wake(cx.waker()));
        if fresh {
            *registered = Some(cx.waker().clone());
        }
        if (fresh || self.exchanges.flooded()) && signals.flood.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Event::Flood);
        }
        if (fresh || signals.stop_seen.has_changed().unwrap_or(true))
            && signals.stopped.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(Event::Stop);
        }
        Poll::Pending
    }

    /// The timer fired: the time limits say wait (handing hyper's idle HTTP/1 state
    /// back, if it is idle), close gracefully, or cut the connection (`Err`, why).
    fn on_timer(&mut self, mut timer: Pin<&mut Sleep>) -> Result<(), &'static str> {
        let now = Instant::now();
        let exchanges = self.exchanges;
        let head_due = exchanges.head_due(self.timers.header_timeout());
        match self.timers.check(now, head_due, &exchanges.active) {
            Check::Wait(mut next) => {
                if !self.closing && self.stage.hand_back_if_idle(exchanges) {
                    // Busy: hyper keeps its state, and is asked again later.
                    next = next.min(now + HAND_BACK_AFTER);
                }
                timer.as_mut().reset(next);
            }
            Check::Close(next) => {
                self.closing = true;
                self.stage.graceful_shutdown();
                timer.as_mut().reset(next);
            }
            Check::Cut(why) => return Err(why),
        }
        Ok(())
    }

    /// Too many requests abandoned: the flood is remembered, and the connection
    /// closes: GOAWAY(ENHANCE_YOUR_CALM) first, then h2's graceful close, a second at
    /// most; streams the client still opens meanwhile get 503.
    fn on_flood(&mut self, mut timer: Pin<&mut Sleep>) {
        let peer = self.peer;
        tracing::warn!(%peer, "too many requests cancelled on one connection; closing it");
        remember_flood(self.handler, peer, self.exchanges);
        self.closing = true;
        self.exchanges.close();
        self.exchanges.calm.store(true, Ordering::Relaxed);
        self.stage.graceful_shutdown();
        let at = Instant::now() + Duration::from_secs(1);
        self.timers.force_close_at(at);
        let next = timer.deadline().min(at);
        timer.as_mut().reset(next);
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

/// What a busy connection's loop left.
enum Left<IO> {
    /// Idle HTTP/1: its stream, and when its timer is next due.
    Idle(Box<Tracked<IO>>, Instant),
    /// Switched to a socket after a `101`: its stream, and the bytes hyper read
    /// past the upgrade's head.
    Switched(Box<Tracked<IO>>, bytes::Bytes),
    /// The connection ended.
    Gone,
}

/// What woke the connection loop.
enum Event<IO> {
    /// The connection ended (with the error if it failed), went idle or switched.
    Ended(Result<Ended<IO>, Failure>),
    /// The timer: a time limit may be due.
    Timer,
    /// The listener is stopping: close gracefully.
    Stop,
    /// Too many requests abandoned: close.
    Flood,
}
