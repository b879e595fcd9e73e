//! One connection's life ([`serve_connection`]): busy, with a supervisor
//! (`supervise`) that lets hyper serve it (`stage`) while it watches what else can
//! end it; idle (HTTP/1 between requests), with only what lasts ([`Kept`]), a timer
//! and the stop signal.
//!
//! The connection's requests report to it through [`Exchanges`]: each one handed
//! over, each one answered (when its response body ends or is dropped) and each one
//! abandoned, without a lock or a timer per request. Its stream is wrapped in a
//! [`Tracked`] that notes moved bytes for the idle check and shows HTTP/1 bytes to
//! the head scanner. This module does not accept connections or terminate TLS.

mod stage;
mod supervise;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, watch};
use tokio::time::Sleep;

use super::Handler;
use super::exchanges::Exchanges;
use super::timers::{Check, ConnLimits, Timers};
use super::tracked::Tracked;
use crate::config::ServerStartup;
use crate::http::wire::{Marks, Scanner};
use crate::observe::connections::Open;
use crate::server::conn::{Alpn, ConnInfo};
use stage::http_builder;
pub(crate) use stage::{Http, read_buffer};
use supervise::supervise;

/// What every connection of a listener is served with, shared by them all (a copy in
/// every connection would weigh on idle ones).
pub(crate) struct ConnSettings<H> {
    /// hyper's HTTP/1.1 and HTTP/2 settings ([`http_builder`]).
    pub builder: Http,
    /// Answers the connection's requests.
    pub handler: Arc<H>,
    /// Changes when the listener stops: the connection then closes gracefully.
    pub stop: watch::Receiver<bool>,
    /// Changes when the listener's drain is over: a connection switched to a
    /// WebSocket then closes it (1001).
    pub drained: watch::Receiver<bool>,
    /// The connection's time limits and its longest request head.
    pub limits: ConnLimits,
}

impl<H: super::Handler> ConnSettings<H> {
    /// How a listener started with `settings` serves its connections with `handler`
    /// until `stop` changes; its sockets close when `drained` does.
    pub(crate) fn new(
        settings: &ServerStartup,
        handler: Arc<H>,
        stop: watch::Receiver<bool>,
        drained: watch::Receiver<bool>,
    ) -> ConnSettings<H> {
        let asked = Arc::clone(&handler);
        ConnSettings {
            builder: http_builder(settings, Arc::new(move || asked.websockets())),
            handler,
            stop,
            drained,
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
            let busy = Box::pin(supervise(kept, start));
            kept = match busy.await {
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
    /// HTTP/1 heads are watched for what hyper accepts without telling (see `crate::http::wire`).
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
    H: Handler,
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
        let open = Open::new(h2, H::COUNTED);
        let mut io = Tracked::new(io, exchanges.clone(), scanner, h2, open);
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
/// back after every answer cost a fresh state per request, a seventh more
/// instructions per proxied request (`docs/performance.md`, "Figures behind the
/// code").
const HAND_BACK_AFTER: Duration = Duration::from_secs(1);
