//! [`Body`]: the body of every response sluice sends, and what rides on it.
//!
//! A body is bytes sluice wrote itself (a refusal, a direct response) or a stream
//! read from an upstream (a [`Source`], which names the target it comes from). Either
//! can carry guards: values that must live exactly as long as the response is being
//! served, from admission until the last byte is sent or the client goes away (a
//! concurrency permit, an access-log record that wants the final byte count). Guards
//! are dropped when the body ends, fails, or is dropped unfinished, whichever comes
//! first; `on_end` hooks learn which it was and how many bytes went out.
//!
//! This module depends on nothing else in the crate: the proxy hands it its upstream
//! streams, refusals and the admin API their bytes. It does not read requests, build
//! error responses, or know about pools.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Frame, SizeHint};

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

/// Where the bytes of a streamed body come from: an upstream response's body, which
/// knows the target it is read from.
pub trait Source:
    hyper::body::Body<Data = Bytes, Error = hyper::Error> + Send + Unpin + 'static
{
    /// `host:port` of the upstream target the bytes come from, if they come from one.
    fn origin(&self) -> Option<&str> {
        None
    }
}

/// The body of a response sluice sends.
///
/// Boxed: a response is moved by value several times between the gateway and the
/// connection, and with a pointer for its body it is small enough to be copied
/// inline instead of through `memcpy` (272 bytes -> 128). The box holds the source
/// itself, so a body is one allocation whatever its bytes come from.
pub struct Body(Box<Inner<dyn Source>>);

struct Inner<S: Source + ?Sized> {
    sent: u64,
    /// Dropped when the body ends or is dropped.
    guards: Vec<Box<dyn Send>>,
    on_end: Vec<OnEnd>,
    /// Last: unsized in [`Body`].
    source: S,
}

/// Bytes sluice wrote; `None` once sent.
struct Full(Option<Bytes>);

impl hyper::body::Body for Full {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        Poll::Ready(self.0.take().map(|b| Ok(Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.as_ref().is_none_or(Bytes::is_empty)
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.0.as_ref().map_or(0, |b| b.len() as u64))
    }
}

impl Source for Full {}

impl std::fmt::Debug for Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let this = &self.0;
        let kind = match this.source.origin() {
            None => "full",
            Some(_) => "upstream",
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
        Body::new(Full(Some(bytes.into())))
    }

    /// An empty body.
    pub fn empty() -> Body {
        Body::new(Full(None))
    }

    /// A body streamed from `source`, e.g. an upstream response's.
    pub fn upstream(source: impl Source) -> Body {
        Body::new(source)
    }

    /// `host:port` of the upstream target that sent this body, if one did.
    pub fn origin(&self) -> Option<&str> {
        self.0.source.origin()
    }

    fn new(source: impl Source) -> Body {
        Body(Box::new(Inner {
            sent: 0,
            guards: Vec::new(),
            on_end: Vec::new(),
            source,
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

impl<S: Source + ?Sized> Inner<S> {
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
        let polled = Pin::new(&mut this.source).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.sent += data.len() as u64;
                }
                if this.source.is_end_stream() {
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
        self.0.source.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.0.source.size_hint()
    }
}

impl<S: Source + ?Sized> Drop for Inner<S> {
    fn drop(&mut self) {
        if !self.guards.is_empty() || !self.on_end.is_empty() {
            let complete = self.source.is_end_stream();
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

    /// An upstream's body as the proxy hands it over: chunks, and the target's name.
    struct Chunks(Vec<Bytes>);

    impl hyper::body::Body for Chunks {
        type Data = Bytes;
        type Error = hyper::Error;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
            Poll::Ready(self.0.pop().map(|b| Ok(Frame::data(b))))
        }

        fn is_end_stream(&self) -> bool {
            self.0.is_empty()
        }
    }

    impl Source for Chunks {
        fn origin(&self) -> Option<&str> {
            Some("10.0.0.1:80")
        }
    }

    #[tokio::test]
    async fn a_streamed_body_names_its_origin_and_counts_every_chunk() {
        assert_eq!(Body::full("local").origin(), None);
        let chunks = vec![Bytes::from("world"), Bytes::from("hello ")];
        let mut body = Body::upstream(Chunks(chunks));
        assert_eq!(body.origin(), Some("10.0.0.1:80"));
        let ended = Arc::new(AtomicU64::new(u64::MAX));
        let seen = ended.clone();
        body.on_end(move |end| {
            assert!(end.complete);
            seen.store(end.bytes, Ordering::SeqCst);
        });
        let bytes = body.collect().await.unwrap().to_bytes();
        assert_eq!(bytes, "hello world");
        assert_eq!(ended.load(Ordering::SeqCst), 11);
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
