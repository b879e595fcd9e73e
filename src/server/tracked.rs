//! The stream a connection is served over: it notes moved bytes for the idle check,
//! shows HTTP/1 bytes to the head scanner, and on HTTP/2 slips a
//! `GOAWAY(ENHANCE_YOUR_CALM)` in between two of h2's frames when asked to.
//!
//! hyper's API closes an HTTP/2 connection gracefully with `GOAWAY(NO_ERROR)` only;
//! a client cut for a flood is told why with a frame of our own. The stream follows
//! h2's output frame by frame (nine header bytes, then the length they announce) so
//! the GOAWAY goes out whole and never inside another frame. The last stream id it
//! carries is 2^31-1, as in the first GOAWAY of h2's graceful close, which follows it:
//! streams already sent are still answered (503 on a closing connection). HTTP/2 is
//! told apart by the client's connection preface (or ALPN), so HTTP/1 connections
//! pay one branch per write.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::exchanges::Exchanges;
use crate::http::wire::Scanner;
use crate::observe::connections::Open;

/// What a client sends first on HTTP/2 (RFC 9113, 3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// GOAWAY on stream 0: last stream id 2^31-1, error ENHANCE_YOUR_CALM (0xb).
pub(super) const GOAWAY_CALM: [u8; 17] = [
    0, 0, 8, 0x7, 0, 0, 0, 0, 0, 0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 0x0b,
];

/// A stream that notes whether any byte moved since the last idle check, shows the
/// bytes it reads to the HTTP/1 head scanner and, on HTTP/2, sends
/// [`GOAWAY_CALM`] at the next frame boundary once the connection's
/// [`Exchanges::calm`] is set.
pub(super) struct Tracked<IO> {
    inner: IO,
    /// What the connection's supervisor reads: activity ([`Exchanges::active`]),
    /// the calm switch and, on HTTP/1, hyper going idle.
    exchanges: Arc<Exchanges>,
    scanner: Option<Scanner>,
    /// Preface bytes matched so far while the protocol is unknown.
    preface: Option<u8>,
    /// Where h2's output stands in its frames; HTTP/2 only (boxed: it would weigh on
    /// every idle HTTP/1 connection).
    frames: Option<Box<Frames>>,
    /// Bytes read from `inner` by an earlier HTTP/1 connection state and not parsed
    /// by it: the next reads return them first.
    carried: Bytes,
    /// HTTP/1: a read that finds nothing while every request is answered and no
    /// byte of another one came tells the exchanges that hyper went idle.
    report_idle: bool,
    /// The connection's place in the open connections by protocol.
    open: Open,
}

impl<IO> Tracked<IO> {
    /// `inner`, noting activity in `exchanges`, scanning HTTP/1 heads with
    /// `scanner`, following HTTP/2 frames from the start if ALPN chose `h2` (else
    /// from the client's preface), and sending the GOAWAY once the exchanges' calm
    /// switch is set.
    pub(super) fn new(
        inner: IO,
        exchanges: Arc<Exchanges>,
        scanner: Option<Scanner>,
        h2: bool,
        open: Open,
    ) -> Tracked<IO> {
        Tracked {
            inner,
            exchanges,
            scanner,
            preface: (!h2).then_some(0),
            frames: h2.then(Box::default),
            carried: Bytes::new(),
            report_idle: false,
            open,
        }
    }

    /// Tells the exchanges whether hyper's last read found nothing with no request
    /// in progress on the wire ([`Exchanges::waiting`]).
    pub(super) fn report_idle(&mut self) {
        self.report_idle = true;
    }

    /// Returns `bytes` (read earlier, not parsed yet) before anything still unread.
    pub(super) fn carry(&mut self, bytes: Bytes) {
        if bytes.is_empty() {
            return;
        }
        self.carried = match self.carried.is_empty() {
            true => bytes,
            false => [bytes, std::mem::take(&mut self.carried)].concat().into(),
        };
    }

    /// The stream itself, and the bytes read earlier not returned yet: for a
    /// connection that switched to a socket.
    pub(super) fn into_inner(self) -> (IO, Bytes) {
        (self.inner, self.carried)
    }

    /// Whether bytes read earlier are still to be returned.
    pub(super) fn carries(&self) -> bool {
        !self.carried.is_empty()
    }

    /// Notes `read`, the bytes a read just brought: activity, the HTTP/1 scanner,
    /// and the preface while the protocol is unknown.
    fn saw(&mut self, read: &[u8]) {
        self.exchanges.active.store(true, Ordering::Relaxed);
        if let Some(scanner) = &mut self.scanner {
            scanner.feed(read);
        }
        if let Some(matched) = self.preface.map(usize::from) {
            let expected = &PREFACE[matched..];
            let n = read.len().min(expected.len());
            if read[..n] != expected[..n] {
                self.preface = None;
            } else if matched + n == PREFACE.len() {
                self.preface = None;
                self.frames = Some(Box::default());
                self.open.http2();
            } else {
                // Below the preface's 24 bytes.
                self.preface = Some((matched + n) as u8);
            }
        }
    }
}

impl<IO: AsyncWrite + Unpin> Tracked<IO> {
    /// Sends the GOAWAY if it is asked for and h2's output is between frames; ready
    /// once it is out (or not due).
    fn poll_calm(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let Some(frames) = &mut self.frames else {
            return Poll::Ready(Ok(()));
        };
        if frames.calm_sent.is_none() {
            if !(frames.between() && self.exchanges.calm.load(Ordering::Relaxed)) {
                return Poll::Ready(Ok(()));
            }
            frames.calm_sent = Some(0);
        }
        while let Some(sent) = frames.calm_sent.filter(|&sent| sent < GOAWAY_CALM.len()) {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &GOAWAY_CALM[sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
            }
            frames.calm_sent = Some(sent + n);
        }
        Poll::Ready(Ok(()))
    }
}

/// Where an HTTP/2 output stream stands: inside a frame header, inside a payload,
/// or between two frames.
#[derive(Debug, Default)]
struct Frames {
    /// The header being written.
    head: [u8; 9],
    /// Bytes of `head` written so far.
    have: usize,
    /// Payload bytes of the current frame still to come.
    left: usize,
    /// Bytes of [`GOAWAY_CALM`] sent, once it began.
    calm_sent: Option<usize>,
}

impl Frames {
    /// Whether the next byte out starts a frame.
    fn between(&self) -> bool {
        self.have == 0 && self.left == 0
    }

    /// Follows `bytes`, written out.
    fn advance(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.left > 0 {
                let skip = self.left.min(bytes.len());
                self.left -= skip;
                bytes = &bytes[skip..];
                continue;
            }
            let take = (9 - self.have).min(bytes.len());
            self.head[self.have..self.have + take].copy_from_slice(&bytes[..take]);
            self.have += take;
            bytes = &bytes[take..];
            if self.have == 9 {
                let [a, b, c, ..] = self.head;
                self.left = usize::from(a) << 16 | usize::from(b) << 8 | usize::from(c);
                self.have = 0;
            }
        }
    }

    /// Follows the first `n` bytes of `bufs`, written out.
    fn advance_vectored(&mut self, bufs: &[std::io::IoSlice<'_>], mut n: usize) {
        for buf in bufs {
            if n == 0 {
                break;
            }
            let take = buf.len().min(n);
            self.advance(&buf[..take]);
            n -= take;
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Tracked<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if !this.carried.is_empty() {
            // Already seen when first read.
            let n = this.carried.len().min(buf.remaining());
            buf.put_slice(&this.carried.split_to(n));
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let poll = Pin::new(&mut this.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.saw(&buf.filled()[before..]);
            if this.report_idle {
                this.exchanges.waiting(false);
            }
        } else if poll.is_pending() && this.report_idle {
            // hyper does not read again once a read found nothing: this wait is
            // what it is left in when its response ends.
            let between = this.scanner.as_ref().is_some_and(Scanner::between_messages);
            this.exchanges.waiting(between);
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
        ready!(this.poll_calm(cx))?;
        let poll = Pin::new(&mut this.inner).poll_write(cx, data);
        // Only bytes that went out count: a write that waits on a client that stopped
        // reading is not activity, so idle_timeout cuts such a client.
        if let Poll::Ready(Ok(n)) = poll
            && n > 0
        {
            this.exchanges.active.store(true, Ordering::Relaxed);
            if let Some(frames) = &mut this.frames {
                frames.advance(&data[..n]);
            }
        }
        poll
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_calm(cx))?;
        let poll = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = poll
            && n > 0
        {
            this.exchanges.active.store(true, Ordering::Relaxed);
            if let Some(frames) = &mut this.frames {
                frames.advance_vectored(bufs, n);
            }
        }
        poll
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_calm(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_calm(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// One HTTP/2 frame: length, type, flags, stream id, payload.
    fn frame(kind: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len() as u32;
        let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, 0];
        out.extend_from_slice(&stream.to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    /// A Tracked over one end of a pipe, the other end, and its exchanges (with the
    /// calm switch).
    fn tracked(
        h2: bool,
    ) -> (
        Tracked<tokio::io::DuplexStream>,
        tokio::io::DuplexStream,
        Arc<Exchanges>,
    ) {
        let (ours, theirs) = tokio::io::duplex(1 << 16);
        let exchanges = Arc::new(Exchanges::new());
        (
            Tracked::new(ours, exchanges.clone(), None, h2, Open::new(h2, false)),
            theirs,
            exchanges,
        )
    }

    #[test]
    fn frames_are_followed_across_split_writes() {
        let mut frames = Frames::default();
        let data = frame(0x0, 1, &[7; 300]);
        let settings = frame(0x4, 0, &[]);
        let all = [data.clone(), settings].concat();
        for cut in [1, 4, 8, 9, 10, 200, 308] {
            frames.advance(&all[..cut]);
            assert!(!frames.between(), "inside the first frame after {cut}");
            frames.advance(&all[cut..data.len()]);
            assert!(frames.between(), "after the DATA frame ({cut})");
            frames.advance(&all[data.len()..data.len() + 5]);
            assert!(!frames.between());
            frames.advance(&all[data.len() + 5..]);
            assert!(frames.between(), "an empty frame ends with its header");
        }
    }

    #[tokio::test]
    async fn the_goaway_goes_out_between_two_frames_never_inside_one() {
        let (mut ours, mut theirs, exchanges) = tracked(true);
        let data = frame(0x0, 1, &[7; 100]);
        // Half a frame, then the GOAWAY is asked for: it must wait for the other half.
        ours.write_all(&data[..50]).await.unwrap();
        exchanges.calm.store(true, Ordering::Relaxed);
        ours.write_all(&data[50..]).await.unwrap();
        let next = frame(0x7, 0, &[0, 0, 0, 1, 0, 0, 0, 0]);
        ours.write_all(&next).await.unwrap();
        ours.flush().await.unwrap();
        drop(ours);
        let mut out = Vec::new();
        theirs.read_to_end(&mut out).await.unwrap();
        assert_eq!(out, [data, GOAWAY_CALM.to_vec(), next].concat());
    }

    #[tokio::test]
    async fn a_flush_alone_sends_the_goaway_once() {
        let (mut ours, mut theirs, exchanges) = tracked(true);
        exchanges.calm.store(true, Ordering::Relaxed);
        ours.flush().await.unwrap();
        ours.flush().await.unwrap();
        drop(ours);
        let mut out = Vec::new();
        theirs.read_to_end(&mut out).await.unwrap();
        assert_eq!(out, GOAWAY_CALM);
    }

    #[tokio::test]
    async fn http2_is_known_by_the_preface_and_http1_never_gets_a_goaway() {
        for (first, h2) in [
            (&PREFACE[..], true),
            (&b"POST / HTTP/1.1\r\n\r\n"[..], false),
            (&b"PRI * HTTP/1.1\r\n"[..], false),
        ] {
            let (mut ours, mut theirs, exchanges) = tracked(false);
            // The preface in two reads.
            theirs.write_all(&first[..3]).await.unwrap();
            let mut buf = [0; 64];
            let n = ours.read(&mut buf).await.unwrap();
            assert_eq!(n, 3);
            theirs.write_all(&first[3..]).await.unwrap();
            let mut rest = vec![0; first.len() - 3];
            ours.read_exact(&mut rest).await.unwrap();
            exchanges.calm.store(true, Ordering::Relaxed);
            ours.write_all(b"x").await.unwrap();
            drop(ours);
            let mut out = Vec::new();
            theirs.read_to_end(&mut out).await.unwrap();
            let expected = if h2 {
                [&GOAWAY_CALM[..], b"x"].concat()
            } else {
                b"x".to_vec()
            };
            assert_eq!(out, expected, "{:?}", String::from_utf8_lossy(first));
        }
    }
}
