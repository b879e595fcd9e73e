//! [`Body`]: the body of every response sluice sends, and what rides on it.
//!
//! A body is bytes sluice wrote itself (a refusal, a direct response) or an upstream's
//! stream. Either can carry guards: values that must live exactly as long as the
//! response is being served, from admission until the last byte is sent or the client
//! goes away (a concurrency permit, an access-log record that wants the final byte
//! count). Guards are dropped when the body ends, fails, or is dropped unfinished,
//! whichever comes first; `on_end` hooks learn which it was and how many bytes went out.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Frame, SizeHint};

use super::pool::{Pool, UpstreamBody};

/// How a body ended, for `on_end` hooks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct End {
    /// Body bytes handed to the connection.
    pub bytes: u64,
    /// True when the body was sent to its end; false when it failed or the client
    /// went away first.
    pub complete: bool,
}

type OnEnd = Box<dyn FnOnce(End) + Send>;

/// The body of a response sluice sends.
///
/// Boxed: a response is moved by value several times between the gateway and the
/// connection, and with a pointer for its body it is small enough to be copied
/// inline instead of through `memcpy` (272 bytes -> 120).
pub struct Body(Box<Inner>);

struct Inner {
    kind: Kind,
    /// The upstream target that sent an upstream body.
    origin: Option<std::sync::Arc<Pool>>,
    sent: u64,
    /// Dropped when the body ends or is dropped.
    guards: Vec<Box<dyn Send>>,
    on_end: Vec<OnEnd>,
}

enum Kind {
    /// Bytes sluice wrote; `None` once sent.
    Full(Option<Bytes>),
    Upstream(UpstreamBody),
}

impl std::fmt::Debug for Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let this = &self.0;
        let kind = match &this.kind {
            Kind::Full(_) => "full",
            Kind::Upstream(_) => "upstream",
        };
        f.debug_struct("Body")
            .field("kind", &kind)
            .field("sent", &this.sent)
            .field("guards", &this.guards.len())
            .finish_non_exhaustive()
    }
}

impl Body {
    /// A body of these bytes.
    pub fn full(bytes: impl Into<Bytes>) -> Body {
        Body::new(Kind::Full(Some(bytes.into())))
    }

    /// An empty body.
    pub fn empty() -> Body {
        Body::new(Kind::Full(None))
    }

    /// The body of a response from the upstream target `origin`.
    pub fn upstream(body: UpstreamBody, origin: std::sync::Arc<Pool>) -> Body {
        let mut new = Body::new(Kind::Upstream(body));
        new.0.origin = Some(origin);
        new
    }

    /// `host:port` of the upstream target that sent this body, if one did.
    pub fn origin(&self) -> Option<&str> {
        self.0.origin.as_deref().map(Pool::address)
    }

    fn new(kind: Kind) -> Body {
        Body(Box::new(Inner {
            kind,
            origin: None,
            sent: 0,
            guards: Vec::new(),
            on_end: Vec::new(),
        }))
    }

    /// Keeps `guard` alive until the body ends or the client goes away.
    pub fn guard(&mut self, guard: impl Send + 'static) {
        self.0.guards.push(Box::new(guard));
    }

    /// Calls `hook` once, when the body ends or the client goes away.
    pub fn on_end(&mut self, hook: impl FnOnce(End) + Send + 'static) {
        self.0.on_end.push(Box::new(hook));
    }
}

impl Inner {
    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Full(bytes) => bytes.as_ref().is_none_or(Bytes::is_empty),
            Kind::Upstream(body) => hyper::body::Body::is_end_stream(body),
        }
    }

    fn finish(&mut self, complete: bool) {
        self.guards.clear();
        let end = End {
            bytes: self.sent,
            complete,
        };
        for hook in self.on_end.drain(..) {
            hook(end);
        }
    }
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self.0;
        let polled = match &mut this.kind {
            Kind::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            Kind::Upstream(body) => Pin::new(body).poll_frame(cx),
        };
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.sent += data.len() as u64;
                }
                if this.is_end_stream() {
                    this.finish(true);
                }
            }
            Poll::Ready(Some(Err(_))) => this.finish(false),
            Poll::Ready(None) => this.finish(true),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        match &self.0.kind {
            Kind::Full(bytes) => SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64)),
            Kind::Upstream(body) => body.size_hint(),
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if !self.guards.is_empty() || !self.on_end.is_empty() {
            let complete = self.is_end_stream();
            self.finish(complete);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use http_body_util::BodyExt;

    use super::*;

    /// A guard that counts its drops.
    struct Counted(Arc<AtomicU64>);

    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn guards_live_until_the_last_byte_and_hooks_see_the_bytes_sent() {
        let dropped = Arc::new(AtomicU64::new(0));
        let ended = Arc::new(AtomicU64::new(u64::MAX));
        let mut body = Body::full("hello");
        body.guard(Counted(dropped.clone()));
        let seen = ended.clone();
        body.on_end(move |end| {
            assert!(end.complete);
            seen.store(end.bytes, Ordering::SeqCst);
        });
        assert_eq!(dropped.load(Ordering::SeqCst), 0);
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "hello");
        assert_eq!(
            dropped.load(Ordering::SeqCst),
            1,
            "released at the last byte"
        );
        assert_eq!(ended.load(Ordering::SeqCst), 5);
        drop(body);
        assert_eq!(dropped.load(Ordering::SeqCst), 1, "released once");
    }

    #[test]
    fn a_body_dropped_unsent_releases_its_guards_as_incomplete() {
        let dropped = Arc::new(AtomicU64::new(0));
        let complete = Arc::new(AtomicU64::new(2));
        let mut body = Body::full("never sent");
        body.guard(Counted(dropped.clone()));
        let seen = complete.clone();
        body.on_end(move |end| seen.store(u64::from(end.complete), Ordering::SeqCst));
        drop(body);
        assert_eq!(dropped.load(Ordering::SeqCst), 1);
        assert_eq!(complete.load(Ordering::SeqCst), 0);
    }
}
