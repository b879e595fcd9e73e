//! HTTP/2 connections to one upstream target (`protocol = "h2"`, or `"auto"` where
//! ALPN chose `h2`): each worker thread multiplexes its requests to the target on one
//! connection, made on first use (h2c prior knowledge on `http://`, ALPN `h2` on
//! `https://`) and kept open by PING.
//!
//! A target that sends GOAWAY drains its connection: the requests already on it go
//! on to their ends, new ones go to a new connection. GOAWAY is seen as the bytes
//! arrive ([`Sniffed`] reads the frame headers, never a payload), before hyper has
//! handled it, so no request is sent on a connection known to be going away. A
//! request the target says it did not process (a stream above the GOAWAY's last
//! stream id, or reset with `REFUSED_STREAM`, RFC 9113 section 8.7) is sent once more
//! on a new connection, its body read again from the [`Taped`] frames; any other
//! failure is not retried (the target may have acted on it).
//!
//! Flow control is hyper's, per stream: a response body is read from the connection
//! only as fast as the client takes it, and each stream's window is small next to
//! the connection's, so a slow client stops its own stream, not its neighbours.

use std::sync::atomic::AtomicBool;
use std::thread::ThreadId;

use http::header::HOST;
use http::uri::{Authority, Scheme};
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use super::replay::Taped;
use super::*;
use crate::proxy::request::TeTrailers;

/// A PING goes to an upstream connection idle this long ...
const PING_EVERY: Duration = Duration::from_secs(30);
/// ... and the connection is closed if its answer takes longer than this.
const PING_TIMEOUT: Duration = Duration::from_secs(20);
/// Each response stream's receive window: what one slow client can leave unread.
const STREAM_WINDOW: u32 = 1024 * 1024;
/// The connection's receive window: the largest HTTP/2 allows, so that only the
/// streams' own windows ever stop a target (one stalled stream never holds up the
/// others).
const CONNECTION_WINDOW: u32 = (1 << 31) - 1;

/// One worker thread's HTTP/2 connection to the target.
pub(super) struct Multiplexed {
    thread: ThreadId,
    sender: http2::SendRequest<Taped>,
    /// Set when the target's GOAWAY arrived: no new request goes on it.
    away: Arc<AtomicBool>,
}

impl Multiplexed {
    fn usable(&self) -> bool {
        !self.away.load(Ordering::Relaxed) && !self.sender.is_closed()
    }
}

/// What connecting to a target made.
pub(super) enum Connected {
    H1(SendRequest<RequestBody>),
    H2(Multiplexed),
}

impl Pool {
    /// This thread's open HTTP/2 connection to the target, if there is one; closed
    /// and drained ones are dropped on the way.
    fn multiplexed(&self) -> Option<http2::SendRequest<Taped>> {
        let thread = std::thread::current().id();
        let mut conns = self.h2.lock().unwrap_or_else(|e| e.into_inner());
        conns.retain(Multiplexed::usable);
        let conn = conns.iter().find(|c| c.thread == thread)?;
        Some(conn.sender.clone())
    }

    /// This thread's connection, made if need be (one connect at a time per target).
    /// `Ok(None)`: ALPN chose HTTP/1.1 (`protocol = "auto"`); the connection is in
    /// the HTTP/1.1 pool.
    async fn h2_sender(
        self: &Arc<Pool>,
        timeout: Duration,
    ) -> Result<Option<http2::SendRequest<Taped>>, Failure> {
        if let Some(sender) = self.multiplexed() {
            return Ok(Some(sender));
        }
        let _connecting = self.connecting.lock().await;
        if let Some(sender) = self.multiplexed() {
            return Ok(Some(sender));
        }
        match self.connect(timeout, true).await? {
            Connected::H2(conn) => {
                let sender = conn.sender.clone();
                self.speaks.store(SPEAKS_H2, Ordering::Relaxed);
                let mut conns = self.h2.lock().unwrap_or_else(|e| e.into_inner());
                conns.push(conn);
                Ok(Some(sender))
            }
            Connected::H1(sender) => {
                self.speaks.store(SPEAKS_H1, Ordering::Relaxed);
                self.give_back(sender);
                Ok(None)
            }
        }
    }

    /// Sends `request` over HTTP/2: [`Pool::send`] for targets that speak it. Until
    /// a connection is there, `slot` keeps the request (a target that cannot be
    /// reached had nothing sent to it).
    pub(super) async fn send_h2(
        self: &Arc<Pool>,
        slot: &mut Option<Request<RequestBody>>,
        riders: &mut Riders,
        connect_timeout: Duration,
        deadline: Instant,
    ) -> Result<Response<Body>, Failure> {
        let Some(mut sender) = self.h2_sender(connect_timeout).await? else {
            // `auto`, and ALPN chose HTTP/1.1.
            return self.send_h1(slot, riders, connect_timeout, deadline).await;
        };
        let request = slot.take().expect("a request to send");
        let (mut head, body) = request.into_parts();
        self.address_h2(&mut head);
        let body = Taped::new(body);
        let tape = body.reel();
        let mut sent = sender.send_request(Request::from_parts(head.clone(), body));
        let mut resent = false;
        loop {
            let err = match self.answer_h2(sent, riders, deadline).await {
                Ok(response) => {
                    tape.stop();
                    return Ok(response);
                }
                Err(err) => err,
            };
            if let Some(cut) = tape.cut() {
                return Err(Failure::ClientBody(cut));
            }
            let body = match (resent, not_processed(&err)) {
                (false, true) => tape.rewind(),
                _ => None,
            };
            let Some(body) = body else {
                return Err(Failure::Exchange(err));
            };
            tracing::debug!(target_address = %self.address, error = %err, "upstream did not process the request; sending it again");
            sender = match self.h2_sender(connect_timeout).await {
                Ok(Some(sender)) => sender,
                _ => return Err(Failure::Exchange(err)),
            };
            sent = sender.send_request(Request::from_parts(head.clone(), body));
            resent = true;
        }
    }

    /// The answer to a request sent on a stream: the response, its body holding
    /// `riders`' guard. Without an orphan to tell, a client that goes away meanwhile
    /// resets the stream (the upstream learns it, as a gRPC server learns of a
    /// cancelled call); with one, the exchange is finished in the background
    /// ([`InFlight`]) so that what the upstream answers can be settled.
    async fn answer_h2(
        self: &Arc<Pool>,
        sent: impl Future<Output = Result<Response<Incoming>, hyper::Error>> + Send + 'static,
        riders: &mut Riders,
        deadline: Instant,
    ) -> Result<Response<Body>, hyper::Error> {
        if riders.orphan.is_none() {
            let response = sent.await?;
            return Ok(self.attach_h2(response, riders.held.take()));
        }
        let conn = super::in_flight::Conn::H2;
        let exchange = InFlight::new(sent, conn, std::mem::take(riders), self, deadline);
        exchange.await.map_err(|failed| {
            let (err, kept) = *failed;
            *riders = kept;
            err
        })
    }

    /// `response`'s body as sluice sends it, read from its stream, holding `held`.
    pub(super) fn attach_h2(
        self: &Arc<Pool>,
        response: Response<Incoming>,
        held: Option<Held>,
    ) -> Response<Body> {
        let lease = Stream {
            pool: self.clone(),
            _held: held,
        };
        response.map(|body| Body::upstream(body, lease))
    }

    /// Gives an origin-form request the absolute target HTTP/2 carries as
    /// `:scheme` and `:authority`: the target's scheme, the `Host` the request
    /// was to be sent with (the client's, else the target's).
    fn address_h2(&self, head: &mut http::request::Parts) {
        head.version = http::Version::HTTP_2;
        if head.extensions.remove::<TeTrailers>().is_some() {
            head.headers
                .insert(http::header::TE, http::HeaderValue::from_static("trailers"));
        }
        let scheme = match self.transport {
            Transport::Plain => Scheme::HTTP,
            Transport::Tls { .. } => Scheme::HTTPS,
        };
        let authority = head
            .headers
            .remove(HOST)
            .and_then(|host| Authority::try_from(host.as_bytes()).ok())
            .or_else(|| Authority::try_from(&*self.address).ok());
        let mut parts = std::mem::take(&mut head.uri).into_parts();
        parts.scheme = Some(scheme);
        parts.authority = authority;
        if parts.path_and_query.is_none() {
            parts.path_and_query = Some(http::uri::PathAndQuery::from_static("/"));
        }
        head.uri = Uri::from_parts(parts).unwrap_or_default();
    }
}

/// Whether the target said it never processed the request that failed with `err`:
/// its stream was above the last one a GOAWAY named, or it was refused
/// (`REFUSED_STREAM`). Such a request is safe to send again, whatever its method.
pub(super) fn not_processed(err: &hyper::Error) -> bool {
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        if let Some(h2) = cause.downcast_ref::<::h2::Error>() {
            return (h2.is_go_away() && h2.is_remote())
                || h2.reason() == Some(::h2::Reason::REFUSED_STREAM);
        }
        source = cause.source();
    }
    false
}

/// HTTP/2 over `io`, driven by its own task, GOAWAY watched for.
pub(super) async fn handshake_h2<IO>(io: IO) -> Result<Connected, Failure>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let away = Arc::new(AtomicBool::new(false));
    let io = Sniffed {
        io,
        scan: FrameScan::default(),
        away: away.clone(),
    };
    let (sender, connection) = http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .keep_alive_interval(PING_EVERY)
        .keep_alive_timeout(PING_TIMEOUT)
        .keep_alive_while_idle(true)
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .handshake(TokioIo::new(io))
        .await
        .map_err(Failure::Exchange)?;
    tokio::spawn(async move {
        if let Err(err) = connection.await {
            tracing::debug!(error = %err, "upstream HTTP/2 connection ended");
        }
    });
    Ok(Connected::H2(Multiplexed {
        thread: std::thread::current().id(),
        sender,
        away,
    }))
}

/// The end of a response body read from an HTTP/2 stream: the connection stays
/// with the pool whatever becomes of the body (dropping it resets its stream).
struct Stream {
    pool: Arc<Pool>,
    /// Released with the body.
    _held: Option<Held>,
}

impl crate::http::body::Upstream for Stream {
    fn origin(&self) -> Option<&Arc<str>> {
        Some(&self.pool.address)
    }

    fn release(&mut self, _ended: bool) {}
}

/// An upstream connection's bytes, read through a [`FrameScan`] that flags the
/// target's GOAWAY.
struct Sniffed<IO> {
    io: IO,
    scan: FrameScan,
    away: Arc<AtomicBool>,
}

/// Where the server-to-client byte stream is among HTTP/2 frames: the 9-byte frame
/// headers are read, payloads skipped.
#[derive(Default)]
struct FrameScan {
    header: [u8; 9],
    have: usize,
    skip: usize,
}

/// The frame type of GOAWAY (RFC 9113 section 6.8).
const GOAWAY: u8 = 0x7;

impl FrameScan {
    /// Reads `bytes`, the next of the stream; true if a GOAWAY frame began in them.
    fn goaway_in(&mut self, mut bytes: &[u8]) -> bool {
        let mut seen = false;
        while !bytes.is_empty() {
            if self.skip > 0 {
                let n = self.skip.min(bytes.len());
                self.skip -= n;
                bytes = &bytes[n..];
                continue;
            }
            let n = (9 - self.have).min(bytes.len());
            self.header[self.have..self.have + n].copy_from_slice(&bytes[..n]);
            self.have += n;
            bytes = &bytes[n..];
            if self.have == 9 {
                let [a, b, c, kind, ..] = self.header;
                self.skip = usize::from(a) << 16 | usize::from(b) << 8 | usize::from(c);
                seen |= kind == GOAWAY;
                self.have = 0;
            }
        }
        seen
    }
}

impl<IO: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Sniffed<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        if this.scan.goaway_in(&buf.filled()[before..]) {
            this.away.store(true, Ordering::Relaxed);
        }
        polled
    }
}

impl<IO: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Sniffed<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, payload: usize) -> Vec<u8> {
        let mut bytes = vec![(payload >> 16) as u8, (payload >> 8) as u8, payload as u8];
        bytes.extend([kind, 0, 0, 0, 0, 0]);
        bytes.extend(std::iter::repeat_n(0x07, payload));
        bytes
    }

    #[test]
    fn a_goaway_is_found_among_frames_however_the_bytes_are_cut() {
        let mut stream = frame(0x4, 18); // SETTINGS
        stream.extend(frame(0x0, 70_000)); // DATA whose payload is full of 0x07 bytes
        stream.extend(frame(0x6, 8)); // PING
        let quiet = stream.len();
        stream.extend(frame(GOAWAY, 8));
        for cut in [1, 2, 7, 9, 10, 4096] {
            let mut scan = FrameScan::default();
            let seen_early = stream[..quiet]
                .chunks(cut)
                .any(|piece| scan.goaway_in(piece));
            assert!(!seen_early, "no GOAWAY before it comes (pieces of {cut})");
            let seen = stream[quiet..]
                .chunks(cut)
                .any(|piece| scan.goaway_in(piece));
            assert!(seen, "the GOAWAY is seen (pieces of {cut})");
        }
    }
}
