//! [`Taped`]: a request body sent to an HTTP/2 upstream, kept (by reference, not
//! copied) until the upstream has taken the request, so that a request the upstream
//! says it never processed (a GOAWAY below its stream, a `REFUSED_STREAM`) can be
//! sent once more on another connection.
//!
//! Only what was sent is kept: the frames' `Bytes` (reference-counted, so the data is
//! shared with the frames on the wire, not copied), up to [`TAPE_AT_MOST`] bytes; a
//! longer body is not kept and its request not resent. The unsent rest stays in the
//! client's body, which the tape owns, so a resend reads the kept frames again and
//! then the rest as it comes.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use hyper::body::{Body, Frame, SizeHint};

use super::RequestBody;
use crate::proxy::request_body::Cut;

/// The most request body kept for a resend (a gRPC unary call, a JSON request).
pub(crate) const TAPE_AT_MOST: usize = 64 * 1024;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One reading of the client's body: the kept frames from the start, then the rest.
pub(crate) struct Taped {
    reel: Arc<Mutex<Reel>>,
    /// The next kept frame this reading sends.
    at: usize,
}

struct Reel {
    body: RequestBody,
    /// The frames sent so far, while they fit in [`TAPE_AT_MOST`].
    frames: Vec<Kept>,
    bytes: usize,
    /// More was sent than was kept: no resend.
    overflowed: bool,
    /// The limit that cut the body, if one did.
    cut: Option<Cut>,
}

enum Kept {
    Data(Bytes),
    Trailers(HeaderMap),
}

impl Taped {
    /// The first reading of `body`.
    pub(crate) fn new(body: RequestBody) -> Taped {
        let reel = Reel {
            body,
            frames: Vec::new(),
            bytes: 0,
            overflowed: false,
            cut: None,
        };
        Taped {
            reel: Arc::new(Mutex::new(reel)),
            at: 0,
        }
    }

    /// A handle on the same tape, for [`Taped::rewind`] and [`Taped::cut`] once this
    /// reading has gone to hyper.
    pub(crate) fn reel(&self) -> Taped {
        Taped {
            reel: self.reel.clone(),
            at: 0,
        }
    }

    /// A new reading from the start, if everything sent so far was kept.
    pub(crate) fn rewind(&self) -> Option<Taped> {
        let reel = self.reel.lock().unwrap_or_else(|e| e.into_inner());
        (!reel.overflowed && reel.cut.is_none()).then(|| Taped {
            reel: self.reel.clone(),
            at: 0,
        })
    }

    /// Keeps nothing more: the upstream has answered, no resend can come.
    pub(crate) fn stop(&self) {
        let mut reel = self.reel.lock().unwrap_or_else(|e| e.into_inner());
        reel.overflowed = true;
        reel.frames = Vec::new();
    }

    /// The limit that cut the body, if one did (the exchange's error then is the
    /// client's).
    pub(crate) fn cut(&self) -> Option<Cut> {
        self.reel.lock().unwrap_or_else(|e| e.into_inner()).cut
    }
}

impl std::fmt::Debug for Taped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Taped").field("at", &self.at).finish()
    }
}

impl Body for Taped {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let at = self.at;
        let mut reel = self.reel.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(kept) = reel.frames.get(at) {
            let frame = match kept {
                Kept::Data(data) => Frame::data(data.clone()),
                Kept::Trailers(trailers) => Frame::trailers(trailers.clone()),
            };
            drop(reel);
            self.at += 1;
            return Poll::Ready(Some(Ok(frame)));
        }
        let polled = Pin::new(&mut reel.body).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) if !reel.overflowed => {
                let size = frame.data_ref().map_or(0, Bytes::len);
                if reel.bytes + size > TAPE_AT_MOST {
                    reel.overflowed = true;
                    reel.frames = Vec::new();
                } else {
                    reel.bytes += size;
                    let kept = match (frame.data_ref(), frame.trailers_ref()) {
                        (Some(data), _) => Kept::Data(data.clone()),
                        (None, Some(trailers)) => Kept::Trailers(trailers.clone()),
                        (None, None) => return polled,
                    };
                    reel.frames.push(kept);
                    drop(reel);
                    self.at += 1;
                }
            }
            Poll::Ready(Some(Err(err))) => reel.cut = err.downcast_ref::<Cut>().copied(),
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        let reel = self.reel.lock().unwrap_or_else(|e| e.into_inner());
        self.at >= reel.frames.len() && reel.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let reel = self.reel.lock().unwrap_or_else(|e| e.into_inner());
        match reel.frames.is_empty() {
            true => reel.body.size_hint(),
            false => SizeHint::default(),
        }
    }
}
