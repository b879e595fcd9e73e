//! [`Body`]: the body of every response sluice sends, and what rides on it.
//!
//! A body is bytes sluice wrote itself (a refusal, a direct response) or an upstream
//! response's body, streamed as hyper reads it, with its [`Upstream`] end: the
//! target it comes from and the connection it is read from. Either can carry guards:
//! values that must live exactly as long as the response is being served, from
//! admission until the last byte is sent or the client goes away (a concurrency
//! permit, an access-log record that wants the final byte count). Guards are dropped
//! when the body ends, fails, or is dropped unfinished, whichever comes first;
//! `on_end` hooks learn which it was and how many bytes went out. A [`Watch`] sees
//! every frame as it goes out; when the client goes away before the end of a
//! watched upstream body, the rest is read off the request's path for the watch.
//!
//! This module depends on nothing outside `http` (it reads a gRPC trailer's status
//! with `grpc`): the proxy hands it upstream
//! bodies, refusals and the admin API their bytes. It does not read requests, build
//! error responses, or know what becomes of a connection (the proxy's pool does).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Frame, Incoming, SizeHint};
use smallvec::SmallVec;

/// How a body ended, for `on_end` hooks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct End {
    /// Body bytes handed to the connection.
    pub bytes: u64,
    /// True when the body was sent to its end; false when it failed or the client
    /// went away first.
    pub complete: bool,
    /// The `grpc-status` of the trailers that went out, if any did and carried one.
    pub grpc_status: Option<u8>,
}

type OnEnd = Box<dyn FnOnce(End) + Send>;

/// Something that reads a body's frames as they are sent (a cost scanner), and
/// learns how the body ended.
pub(crate) trait Watch: Send + 'static {
    /// Sees each frame (data or trailers) before it goes to the client.
    fn frame(&mut self, frame: &Frame<Bytes>);

    /// The body ended (or was dropped unfinished).
    fn end(self: Box<Self>, end: End);
}

/// The upstream end of a streamed body: where it comes from, and what becomes of
/// the connection it is read from once the body is done with.
pub(crate) trait Upstream: Send + 'static {
    /// `host:port` of the upstream target the body comes from, shared with its pool
    /// (the access log keeps a reference, not a copy).
    fn origin(&self) -> Option<&std::sync::Arc<str>>;

    /// Called once, as the body is dropped: `ended` when it was read to its end (its
    /// connection is free for another request), false when it was left unfinished.
    fn release(&mut self, ended: bool);
}

/// The body of a response sluice sends.
///
/// Boxed: a response is moved by value several times between the gateway and the
/// connection, and with a pointer for its body it is small enough to be copied
/// inline instead of through `memcpy` (272 bytes -> 128). The box holds a streamed
/// body's upstream end too, so a body is one allocation whatever its bytes are.
pub(crate) struct Body(Box<Inner<dyn Upstream>>);

struct Inner<U: Upstream + ?Sized> {
    kind: Kind,
    sent: u64,
    /// The `grpc-status` of the trailers sent.
    grpc_status: Option<u8>,
    /// Dropped when the body ends or is dropped. Inline: an admitted request's
    /// body carries one or two (the in-flight gauge, a concurrency permit), and the
    /// logged one a hook, which a `Vec` would each allocate a list for.
    guards: SmallVec<[Box<dyn Send>; 2]>,
    on_end: SmallVec<[OnEnd; 1]>,
    /// Reads the frames as they go by; told the end like `on_end`.
    watch: Option<Box<dyn Watch>>,
    /// The upstream end of a [`Kind::Streamed`] body; [`Local`] for bytes sluice
    /// wrote. Last: unsized in [`Body`].
    upstream: U,
}

enum Kind {
    /// Bytes sluice wrote; `None` once sent.
    Full(Option<Bytes>),
    /// Bytes sluice wrote, then trailers (a gRPC answer's `grpc-status`); each
    /// `None` once sent.
    Trailed(Option<Bytes>, Option<Box<http::HeaderMap>>),
    /// An upstream response's body; `ended` once it was read to its end.
    Streamed { body: Incoming, ended: bool },
    /// Bytes sluice writes as it goes (a long admin answer), from a task; `None`
    /// once the task has dropped its end (the body is complete then).
    Written(Option<tokio::sync::mpsc::Receiver<Bytes>>),
}

/// The upstream end of a body sluice wrote itself: none.
struct Local;

impl Upstream for Local {
    fn origin(&self) -> Option<&std::sync::Arc<str>> {
        None
    }

    fn release(&mut self, _: bool) {}
}

impl std::fmt::Debug for Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let this = &self.0;
        let kind = match this.kind {
            Kind::Full(_) => "full",
            Kind::Trailed(..) => "trailed",
            Kind::Streamed { .. } => "upstream",
            Kind::Written(_) => "written",
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
    pub(crate) fn full(bytes: impl Into<Bytes>) -> Body {
        Body::new(Kind::Full(Some(bytes.into())), Local)
    }

    /// These bytes, then these trailers.
    pub(crate) fn trailed(bytes: impl Into<Bytes>, trailers: http::HeaderMap) -> Body {
        Body::new(
            Kind::Trailed(Some(bytes.into()), Some(Box::new(trailers))),
            Local,
        )
    }

    /// A body of the chunks a task sends on `chunks`, in order, until it drops its
    /// end. The channel's bound is the task's back pressure: a slow client holds it
    /// at its next send.
    pub(crate) fn written(chunks: tokio::sync::mpsc::Receiver<Bytes>) -> Body {
        Body::new(Kind::Written(Some(chunks)), Local)
    }

    /// An empty body.
    #[cfg(test)]
    pub(crate) fn empty() -> Body {
        Body::new(Kind::Full(None), Local)
    }

    /// The body of an upstream response, read from `upstream`'s connection.
    pub(crate) fn upstream(body: Incoming, upstream: impl Upstream) -> Body {
        Body::new(Kind::Streamed { body, ended: false }, upstream)
    }

    /// `host:port` of the upstream target that sent this body, if one did.
    pub(crate) fn origin(&self) -> Option<&std::sync::Arc<str>> {
        match self.0.kind {
            Kind::Full(_) | Kind::Trailed(..) | Kind::Written(_) => None,
            Kind::Streamed { .. } => self.0.upstream.origin(),
        }
    }

    fn new(kind: Kind, upstream: impl Upstream) -> Body {
        Body(Box::new(Inner {
            kind,
            sent: 0,
            grpc_status: None,
            guards: SmallVec::new(),
            on_end: SmallVec::new(),
            watch: None,
            upstream,
        }))
    }

    /// Keeps `guard` alive until the body ends or the client goes away.
    pub(crate) fn guard(&mut self, guard: impl Send + 'static) {
        self.0.guards.push(Box::new(guard));
    }

    /// Shows every frame to `watch` as it is sent, and then how the body ended.
    pub(crate) fn watch(&mut self, watch: impl Watch) {
        self.0.watch = Some(Box::new(watch));
    }

    /// Calls `hook` once, when the body ends or the client goes away.
    pub(crate) fn on_end(&mut self, hook: impl FnOnce(End) + Send + 'static) {
        self.0.on_end.push(Box::new(hook));
    }
}

impl<U: Upstream + ?Sized> Inner<U> {
    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Full(bytes) => bytes.as_ref().is_none_or(Bytes::is_empty),
            Kind::Trailed(bytes, trailers) => bytes.is_none() && trailers.is_none(),
            Kind::Streamed { body, ended } => *ended || hyper::body::Body::is_end_stream(body),
            Kind::Written(chunks) => chunks.is_none(),
        }
    }

    fn finish(&mut self, complete: bool) {
        self.guards.clear();
        let end = End {
            bytes: self.sent,
            complete,
            grpc_status: self.grpc_status,
        };
        for hook in self.on_end.drain(..) {
            hook(end);
        }
        if let Some(watch) = self.watch.take() {
            watch.end(end);
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
            Kind::Trailed(bytes, trailers) => Poll::Ready(match bytes.take() {
                Some(bytes) => Some(Ok(Frame::data(bytes))),
                None => trailers.take().map(|t| Ok(Frame::trailers(*t))),
            }),
            Kind::Streamed { body, ended } => {
                let polled = Pin::new(body).poll_frame(cx);
                if let Poll::Ready(None) = polled {
                    *ended = true;
                }
                polled
            }
            Kind::Written(chunks) => match chunks.as_mut().map(|c| c.poll_recv(cx)) {
                Some(Poll::Ready(Some(bytes))) => Poll::Ready(Some(Ok(Frame::data(bytes)))),
                Some(Poll::Ready(None)) | None => {
                    *chunks = None;
                    Poll::Ready(None)
                }
                Some(Poll::Pending) => Poll::Pending,
            },
        };
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(watch) = &mut this.watch {
                    watch.frame(frame);
                }
                match (frame.data_ref(), frame.trailers_ref()) {
                    (Some(data), _) => this.sent += data.len() as u64,
                    (None, Some(trailers)) => {
                        let status = trailers.get(crate::http::grpc::STATUS);
                        this.grpc_status = status.and_then(crate::http::grpc::code_of);
                    }
                    (None, None) => {}
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
            Kind::Trailed(..) | Kind::Written(_) => SizeHint::default(),
            Kind::Streamed { body, .. } => body.size_hint(),
        }
    }
}

/// How long a watched body is read on after its client went away.
const DRAIN_FOR: std::time::Duration = std::time::Duration::from_secs(60);

impl<U: Upstream + ?Sized> Inner<U> {
    /// The client went away before the end of a watched upstream body: the upstream
    /// may still finish it, and the watch wants its end (a cost at the end of a
    /// stream). Reads the rest off the request's path, for at most [`DRAIN_FOR`],
    /// sending nothing anywhere.
    fn drain_for_watch(&mut self) {
        let unfinished = matches!(self.kind, Kind::Streamed { ended: false, .. });
        if !unfinished || self.is_end_stream() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (Some(mut watch), Kind::Streamed { mut body, .. }) = (
            self.watch.take(),
            std::mem::replace(&mut self.kind, Kind::Full(None)),
        ) else {
            return;
        };
        let (sent, mut grpc_status) = (self.sent, self.grpc_status);
        runtime.spawn(async move {
            use http_body_util::BodyExt;
            let read = async {
                while let Some(frame) = body.frame().await {
                    let frame = frame.ok()?;
                    if let Some(trailers) = frame.trailers_ref() {
                        let status = trailers.get(crate::http::grpc::STATUS);
                        grpc_status = status.and_then(crate::http::grpc::code_of);
                    }
                    watch.frame(&frame);
                }
                Some(())
            };
            let complete = matches!(tokio::time::timeout(DRAIN_FOR, read).await, Ok(Some(())));
            watch.end(End {
                bytes: sent,
                complete,
                grpc_status,
            });
        });
    }
}

impl<U: Upstream + ?Sized> Drop for Inner<U> {
    fn drop(&mut self) {
        let complete = self.is_end_stream();
        if self.watch.is_some() && !complete {
            // Takes the watch and the upstream body with it (the connection is then
            // not given back to the pool: it is still being read).
            self.drain_for_watch();
        }
        if !self.guards.is_empty() || !self.on_end.is_empty() || self.watch.is_some() {
            self.finish(complete);
        }
        if let Kind::Streamed { .. } = self.kind {
            let ended = self.is_end_stream();
            self.upstream.release(ended);
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
    fn a_local_body_names_no_origin() {
        assert_eq!(Body::full("local").origin(), None);
        assert_eq!(Body::empty().origin(), None);
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
