//! [`RequestBody`]: the client's request body on its way upstream, held to the size
//! and time limits of `[server]`.
//!
//! A body larger than `max_body_bytes` (when no `Content-Length` said so up front),
//! one that pauses longer than `body_timeout` between two pieces, or one that has
//! taken more than [`RATE_AFTER`] and averages less than `min_body_rate` bytes a
//! second, is cut: the upstream exchange fails, the client gets 413 or 408, and a
//! trickling client cannot pin an upstream connection for as long as it likes.
//!
//! Whose the wait is, when the upstream's `timeout` passes before its answer, is
//! [`Stalled`]'s to say: a body waiting on its client is the client's stall (a 408,
//! which the route's `refund_on` never gives back), not the upstream's slowness.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Frame, Incoming, SizeHint};
use tokio::time::{Instant, Sleep};

use crate::config::ServerLive;

/// The average rate is enforced once a body has taken this long.
pub(crate) const RATE_AFTER: Duration = Duration::from_secs(10);

/// The longest pause of a stream's body: a year, as good as none (the connection's
/// own `idle_timeout` still closes one that moves nothing).
const STREAM_PAUSE: Duration = Duration::from_secs(365 * 86_400);

/// The limits one request body is held to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyLimits {
    /// 0 = none.
    pub max_bytes: u64,
    /// Longest pause between two pieces.
    pub pause: Duration,
    /// Bytes a second, averaged once the body has taken [`RATE_AFTER`]; 0 = none.
    pub min_rate: u64,
}

impl BodyLimits {
    /// These limits for a stream (a gRPC call) that may be quiet for as long as it
    /// lasts: its size is held to `max_bytes`, its pace to nothing.
    pub(crate) fn for_streams(self) -> BodyLimits {
        BodyLimits {
            max_bytes: self.max_bytes,
            pause: STREAM_PAUSE,
            min_rate: 0,
        }
    }

    /// The limits `[server]` sets.
    pub(crate) fn of(server: &ServerLive) -> BodyLimits {
        BodyLimits {
            max_bytes: server.max_body_bytes,
            pause: server.body_timeout,
            min_rate: server.min_body_rate,
        }
    }
}

/// Why a body was cut: the error the body fails with, found again in the failed
/// exchange's error ([`Cut::of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Cut {
    #[error("the request body is larger than server.max_body_bytes")]
    TooLarge,
    #[error("the request body is arriving too slowly")]
    TooSlow,
}

impl Cut {
    /// The cut behind a failed upstream exchange, if a limit cut the body.
    pub(crate) fn of(err: &hyper::Error) -> Option<Cut> {
        std::error::Error::source(err)?
            .downcast_ref::<Cut>()
            .copied()
    }
}

/// Whether the upstream exchange is waiting on the client for more of its body: set
/// while the body waits for the client's next piece, cleared when one comes and at
/// the body's end. A body the upstream stopped reading (its own back-pressure) is not
/// waiting on the client. Shared between the body and its exchange; only a request
/// that has a body has one.
#[derive(Debug, Clone, Default)]
pub(crate) struct Stalled(Arc<AtomicBool>);

impl Stalled {
    /// Whether the client owes the rest of its body and the exchange waits for it.
    pub(crate) fn now(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    fn set(&self, waiting: bool) {
        self.0.store(waiting, Ordering::Relaxed);
    }
}

/// The client's body, streamed upstream within [`BodyLimits`].
pub(crate) struct RequestBody {
    inner: Incoming,
    limits: BodyLimits,
    seen: u64,
    started: Option<Instant>,
    /// Fires at the next moment the body could break a time limit.
    timer: Option<Pin<Box<Sleep>>>,
    /// Set while the body waits on the client (none for a request without a body).
    stalled: Option<Stalled>,
}

impl std::fmt::Debug for RequestBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestBody")
            .field("seen", &self.seen)
            .finish_non_exhaustive()
    }
}

impl RequestBody {
    pub(crate) fn new(inner: Incoming, limits: BodyLimits) -> RequestBody {
        RequestBody {
            inner,
            limits,
            seen: 0,
            started: None,
            timer: None,
            stalled: None,
        }
    }

    /// Whether the exchange waits on the client for its body, from now on (`None`:
    /// the request has no body, so it never does).
    pub(crate) fn stalled(&mut self) -> Option<Stalled> {
        if hyper::body::Body::is_end_stream(&self.inner) {
            return None;
        }
        Some(self.stalled.get_or_insert_with(Stalled::default).clone())
    }

    /// The next instant a time limit could be broken, from `now`.
    fn next_deadline(&self, started: Instant, now: Instant) -> Instant {
        let pause = now + self.limits.pause;
        if self.limits.min_rate == 0 {
            return pause;
        }
        // The average falls below min_rate once elapsed > seen / min_rate.
        let rate_ok_for = Duration::from_secs_f64(self.seen as f64 / self.limits.min_rate as f64);
        pause.min(started + RATE_AFTER.max(rate_ok_for))
    }

    fn fail(&self, cut: Cut) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Poll::Ready(Some(Err(Box::new(cut))))
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl hyper::body::Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let now = Instant::now();
        let started = *this.started.get_or_insert(now);
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let Some(stalled) = &this.stalled {
            stalled.set(polled.is_pending());
        }
        match polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.seen += data.len() as u64;
                    if this.limits.max_bytes > 0 && this.seen > this.limits.max_bytes {
                        return this.fail(Cut::TooLarge);
                    }
                }
                let deadline = this.next_deadline(started, now);
                match &mut this.timer {
                    Some(timer) => timer.as_mut().reset(deadline),
                    None => this.timer = Some(Box::pin(tokio::time::sleep_until(deadline))),
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(err))) => Poll::Ready(Some(Err(Box::new(err)))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                // The timer is set, at each piece, to the first moment a time limit
                // could be broken if nothing more came: firing means it was.
                let deadline = this.next_deadline(started, now);
                let timer = this
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if timer.as_mut().poll(cx).is_ready() {
                    return this.fail(Cut::TooSlow);
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
