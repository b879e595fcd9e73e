//! Where a connection's stream is ([`Stage`]): sniffed for the HTTP/2 preface, served
//! by hyper's HTTP/1 (and handed back at an idle point) or HTTP/2, or shut down; and
//! hyper's settings every connection of a listener is served with ([`Http`]).
//!
//! A stage only moves the stream on when polled; what ends a connection otherwise
//! (time limits, floods, the listener stopping) is the supervisor's.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::super::exchanges::{Answer, Exchanges};
use super::super::tracked::Tracked;
use crate::config::ServerStartup;

/// hyper's HTTP/1.1 and HTTP/2 settings every connection of a listener is served
/// with.
#[derive(Clone)]
pub(crate) struct Http {
    http1: http1::Builder,
    /// HTTP/2 without extended CONNECT (RFC 8441) advertised, and with it.
    http2: [http2::Builder<TokioExecutor>; 2],
    /// Whether the config has a `websocket = true` route now: asked as each HTTP/2
    /// connection starts, so that one a reload adds is advertised to new connections.
    websockets: Arc<dyn Fn() -> bool + Send + Sync>,
}

/// The HTTP/1.1 and HTTP/2 settings every connection of a listener is served with;
/// while `websockets` says a route opens WebSockets, new HTTP/2 connections advertise
/// extended CONNECT (RFC 8441).
pub(crate) fn http_builder(
    settings: &ServerStartup,
    websockets: Arc<dyn Fn() -> bool + Send + Sync>,
) -> Http {
    let mut http1 = http1::Builder::new();
    http1
        // header_timeout is kept by the connection's own timer (`serve_connection`):
        // hyper's arms a timer per request.
        .header_read_timeout(None)
        .max_buf_size(read_buffer(settings))
        // hyper's default of 100 header fields (Envoy's `max_headers_count` and
        // HAProxy's `tune.http.maxhdr` are 100 and 101): above it hyper allocates
        // and fills two arrays per request head, about 3 000 instructions a request
        // (`docs/performance.md`).
        // One flattened buffer and write(2) per response instead of writev over a
        // queue of buffers: for API-sized answers the copy is cheaper than the queue
        // (`docs/performance.md`, "Figures behind the code").
        .writev(false);
    let mut http2 = http2::Builder::new(TokioExecutor::new());
    http2
        .timer(TokioTimer::new())
        .max_header_list_size(settings.max_header_bytes as u32)
        .max_concurrent_streams(settings.h2_max_streams);
    let plain = http2.clone();
    http2.enable_connect_protocol();
    Http {
        http1,
        http2: [plain, http2],
        websockets,
    }
}

/// hyper's HTTP/1 read buffer, which bounds a request head: at least 8 KiB (hyper's
/// minimum; smaller `max_header_bytes` are enforced by the head checks).
pub(crate) fn read_buffer(settings: &ServerStartup) -> usize {
    settings.max_header_bytes.max(8192)
}

/// What a client sends first on HTTP/2 (RFC 9113, 3.4).
pub(super) const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The future answering one request.
pub(super) type Answering =
    Pin<Box<dyn Future<Output = Result<Response<Answer>, Infallible>> + Send>>;

/// Why a connection ended, if not cleanly.
pub(super) type Failure = Box<dyn std::error::Error + Send + Sync>;

/// How a stage ended.
pub(super) enum Ended<IO> {
    /// The connection is over.
    Closed,
    /// hyper's HTTP/1 state was handed back at an idle point: the stream.
    Idle(Box<Tracked<IO>>),
    /// A `101` was written: the stream, and the bytes hyper read past the head.
    Switched(Box<Tracked<IO>>, Bytes),
}

/// Where a connection's stream is: who holds it and what is done with it.
pub(super) enum Stage<IO, S: hyper::service::HttpService<Incoming>> {
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
    pub(super) fn start_http1(
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

    pub(super) fn start_http2(http: &Http, io: Tracked<IO>, service: &S) -> Stage<IO, S> {
        let connection = http.http2[usize::from((http.websockets)())]
            .serve_connection(TokioIo::new(io), service.clone());
        Stage::Http2(Box::pin(connection))
    }

    /// Moves the connection on as far as it goes; ready when it ended, with the
    /// stream if hyper's HTTP/1 state was handed back at an idle point with nothing
    /// read ahead, or once a `101` was written. `started` is set when a fresh HTTP/1
    /// state took the stream.
    pub(super) fn advance(
        &mut self,
        cx: &mut Context<'_>,
        http: &Http,
        service: &S,
        exchanges: &Exchanges,
        closing: bool,
        started: &mut bool,
    ) -> Poll<Result<Ended<IO>, Failure>> {
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
                        return Poll::Ready(Ok(Ended::Closed));
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
                        if let Some(ended) = self.http1_ended(http, service, exchanges, handed) {
                            return Poll::Ready(Ok(ended));
                        }
                    }
                },
                Stage::Http2(connection) => {
                    let result = ready!(connection.as_mut().poll(cx));
                    *self = Stage::Done;
                    return Poll::Ready(result.map(|()| Ended::Closed).map_err(Into::into));
                }
                Stage::Closing(io) => {
                    let _ = ready!(Pin::new(&mut **io).poll_shutdown(cx));
                    *self = Stage::Done;
                    return Poll::Ready(Ok(Ended::Closed));
                }
                Stage::Done => return Poll::Ready(Ok(Ended::Closed)),
            }
        }
    }

    /// hyper's HTTP/1 state let the stream go (`handed`: at an idle point it was asked
    /// to end at): the stream after a `101`, or idle with nothing read ahead; else the
    /// next stage (shut down, or a fresh HTTP/1 state for the bytes read ahead).
    fn http1_ended(
        &mut self,
        http: &Http,
        service: &S,
        exchanges: &Exchanges,
        handed: bool,
    ) -> Option<Ended<IO>> {
        let Stage::Http1(connection, _) = std::mem::replace(self, Stage::Done) else {
            unreachable!()
        };
        let parts = connection.into_parts();
        let mut io = Box::new(parts.io.into_inner());
        if exchanges.switching() {
            return Some(Ended::Switched(io, parts.read_buf));
        }
        if !handed {
            *self = Stage::Closing(io);
            return None;
        }
        io.carry(parts.read_buf);
        if !io.carries() {
            return Some(Ended::Idle(io));
        }
        *self = Stage::start_http1(http, *io, service, exchanges);
        None
    }

    /// If hyper serves HTTP/1 and every request is answered with nothing of the next
    /// one read, asks it to end there: it adds no `Connection: close` (no response is
    /// being written) and gives the stream back ([`Stage::advance`]). Whether hyper
    /// still holds the connection's state after this (and will be asked again).
    pub(super) fn hand_back_if_idle(&mut self, exchanges: &Exchanges) -> bool {
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
    pub(super) fn graceful_shutdown(&mut self) {
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
