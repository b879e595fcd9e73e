//! What a connection's requests report to it: each one handed over, each one
//! answered (its response body ended or was dropped) and each one abandoned, in
//! atomics shared with the connection's supervisor, without a lock or a timer per
//! request.
//!
//! The supervisor reads them for when the next request head is due
//! ([`Exchanges::head_due`]) and for the rapid-reset guard: a connection whose
//! client abandons [`MAX_CANCELLED`] requests is closed. This module does not close
//! connections or keep time limits itself.

use std::collections::HashMap;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use http::Version;
use parking_lot::Mutex;

use crate::http::body::Body;
use crate::http::upgrade::TakeOver;

/// Requests one connection may abandon before it is closed: browsers cancel a few
/// (navigation, aborted fetches); thousands are a rapid-reset attack.
pub(crate) const MAX_CANCELLED: u32 = 100;

/// What a connection's requests tell its timers and its flood guard: how many hyper
/// handed over, how many were answered (the response body ended or was dropped, or
/// the request was abandoned) and when the last one was, how many were abandoned.
pub(super) struct Exchanges {
    opened: quanta::Instant,
    received: AtomicU64,
    answered: AtomicU64,
    /// Nanoseconds after `opened` when the last answer ended.
    answered_at: AtomicU64,
    /// Set by the first HTTP/2 request: streams are not heads awaited in turn.
    http2: AtomicBool,
    cancelled: AtomicU32,
    /// Set when the connection is closing after a flood: new requests get 503.
    closing: AtomicBool,
    /// HTTP/1: set when a request or its answer ended keep-alive (`Connection:
    /// close`, HTTP/1.0 without `keep-alive`).
    last: AtomicBool,
    /// HTTP/1: set by the stream when a read found nothing and every byte read so
    /// far belonged to complete requests; cleared when bytes come.
    idle: AtomicBool,
    /// On a trusted proxy's connection: requests abandoned per forwarded client.
    abandoned_by: Mutex<HashMap<IpAddr, u32>>,
    /// Set by the stream whenever a byte moves; taken by the idle check.
    pub(super) active: AtomicBool,
    /// Set when an HTTP/2 client is to be told to calm down (a GOAWAY of our own).
    pub(super) calm: AtomicBool,
    /// Notified when the client has abandoned [`MAX_CANCELLED`] requests.
    pub(super) flood: tokio::sync::Notify,
    /// HTTP/1: where the connection goes once the `101` answered is written.
    take_over: Mutex<Option<TakeOver>>,
}

impl Exchanges {
    pub(super) fn new() -> Exchanges {
        Exchanges {
            opened: quanta::Instant::now(),
            received: AtomicU64::new(0),
            answered: AtomicU64::new(0),
            answered_at: AtomicU64::new(0),
            http2: AtomicBool::new(false),
            cancelled: AtomicU32::new(0),
            closing: AtomicBool::new(false),
            last: AtomicBool::new(false),
            idle: AtomicBool::new(false),
            abandoned_by: Mutex::new(HashMap::new()),
            active: AtomicBool::new(true),
            calm: AtomicBool::new(false),
            flood: tokio::sync::Notify::new(),
            take_over: Mutex::new(None),
        }
    }

    /// A `101` was answered: once hyper has written it, the connection goes to
    /// `take_over`.
    pub(super) fn switch(&self, take_over: TakeOver) {
        *self.take_over.lock() = Some(take_over);
    }

    /// Where the connection goes now that its `101` is written, if one was answered.
    pub(super) fn switched(&self) -> Option<TakeOver> {
        self.take_over.lock().take()
    }

    /// Whether a `101` was answered.
    pub(super) fn switching(&self) -> bool {
        self.take_over.lock().is_some()
    }

    /// The client abandoned enough requests to be closed.
    pub(super) fn flooded(&self) -> bool {
        self.cancelled.load(Ordering::Relaxed) >= MAX_CANCELLED
    }

    /// The connection is closing after a flood: requests still arriving get 503.
    pub(super) fn close(&self) {
        self.closing.store(true, Ordering::Relaxed);
    }

    /// Whether the connection is closing after a flood.
    pub(super) fn closing(&self) -> bool {
        self.closing.load(Ordering::Relaxed)
    }

    /// On a trusted proxy's connection cut for a flood: the forwarded client behind
    /// at least half of the abandoned requests, if one is.
    pub(super) fn main_abandoner(&self) -> Option<IpAddr> {
        let abandoned = self.abandoned_by.lock();
        let (client, count) = abandoned.iter().max_by_key(|(_, count)| **count)?;
        (*count * 2 >= MAX_CANCELLED).then_some(*client)
    }

    /// Every request hyper handed over has been answered (or abandoned).
    pub(super) fn settled(&self) -> bool {
        self.received.load(Ordering::Relaxed) == self.answered.load(Ordering::Relaxed)
    }

    /// The connection ends after the current exchange: the client or the answer
    /// said so.
    pub(super) fn end_after_this(&self) {
        self.last.store(true, Ordering::Relaxed);
    }

    /// Whether a request or its answer ended keep-alive.
    pub(super) fn ends(&self) -> bool {
        self.last.load(Ordering::Relaxed)
    }

    /// Whether hyper's last read found nothing while every byte read so far
    /// belonged to complete requests.
    pub(super) fn waiting(&self, between_messages: bool) {
        self.idle.store(between_messages, Ordering::Relaxed);
    }

    /// Whether hyper is waiting for the next request with every request answered
    /// and nothing of the next one read.
    pub(super) fn idle(&self) -> bool {
        self.idle.load(Ordering::Relaxed) && self.settled()
    }

    /// hyper handed over a request of `version`.
    pub(super) fn receive(&self, version: Version) {
        self.received.fetch_add(1, Ordering::Relaxed);
        if version == Version::HTTP_2 {
            self.http2.store(true, Ordering::Relaxed);
        }
    }

    /// A request was answered or abandoned.
    fn answer(&self) {
        // quanta's TSC read, the cheapest clock: this runs once per request.
        let at = (quanta::Instant::now() - self.opened).as_nanos();
        self.answered_at
            .store(u64::try_from(at).unwrap_or(u64::MAX), Ordering::Relaxed);
        self.answered.fetch_add(1, Ordering::Relaxed);
    }

    /// How long after the connection opened the awaited request head is due:
    /// `header_timeout` after the connection opened or its last answer ended. None
    /// while a request is being served, and on HTTP/2 once a request came (its idle
    /// streams are `idle_timeout`'s).
    pub(super) fn head_due(&self, header_timeout: Duration) -> Option<Duration> {
        let received = self.received.load(Ordering::Relaxed);
        if received == 0 {
            return Some(header_timeout);
        }
        if self.http2.load(Ordering::Relaxed) || received > self.answered.load(Ordering::Relaxed) {
            return None;
        }
        Some(Duration::from_nanos(self.answered_at.load(Ordering::Relaxed)) + header_timeout)
    }
}

/// Counts its request as cancelled if dropped before it is answered (against its
/// forwarded client too, on a trusted proxy's connection).
pub(super) struct Watch {
    exchanges: Option<Arc<Exchanges>>,
    client: Option<IpAddr>,
}

impl Watch {
    /// Watches a request of the connection `exchanges` serves, sent on behalf of
    /// `client` when it came through a trusted proxy.
    pub(super) fn new(exchanges: Arc<Exchanges>, client: Option<IpAddr>) -> Watch {
        Watch {
            exchanges: Some(exchanges),
            client,
        }
    }

    /// The request got its response: the connection learns when its body ends.
    pub(super) fn answered(mut self, body: Body) -> Answer {
        Answer {
            body,
            exchanges: self.exchanges.take(),
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Some(exchanges) = self.exchanges.take() {
            exchanges.answer();
            if let Some(client) = self.client {
                *exchanges.abandoned_by.lock().entry(client).or_default() += 1;
            }
            if exchanges.cancelled.fetch_add(1, Ordering::Relaxed) + 1 == MAX_CANCELLED {
                exchanges.flood.notify_one();
            }
        }
    }
}

/// A response body that tells its connection when it ends (or is dropped).
pub(super) struct Answer {
    body: Body,
    exchanges: Option<Arc<Exchanges>>,
}

impl hyper::body::Body for Answer {
    type Data = bytes::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Answer {
    fn drop(&mut self) {
        if let Some(exchanges) = self.exchanges.take() {
            exchanges.answer();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;

    use super::*;

    const HEADER: Duration = Duration::from_secs(10);

    #[test]
    fn the_first_head_is_due_header_timeout_after_the_open() {
        let exchanges = Exchanges::new();
        assert_eq!(exchanges.head_due(HEADER), Some(HEADER));
    }

    #[test]
    fn no_head_is_due_while_a_request_is_served_and_the_next_after_its_answer() {
        let exchanges = Exchanges::new();
        exchanges.receive(Version::HTTP_11);
        assert_eq!(exchanges.head_due(HEADER), None);
        exchanges.answer();
        exchanges
            .answered_at
            .store(3_000_000_000, Ordering::Relaxed);
        assert_eq!(
            exchanges.head_due(HEADER),
            Some(Duration::from_secs(3) + HEADER)
        );
    }

    #[test]
    fn on_http2_no_head_is_awaited_once_a_request_came() {
        let exchanges = Exchanges::new();
        exchanges.receive(Version::HTTP_2);
        exchanges.answer();
        assert_eq!(exchanges.head_due(HEADER), None);
    }

    #[test]
    fn an_abandoned_request_counts_as_answered_and_cancelled_an_answered_one_only_as_answered() {
        let exchanges = Arc::new(Exchanges::new());
        exchanges.receive(Version::HTTP_11);
        drop(Watch::new(exchanges.clone(), None));
        assert_eq!(exchanges.answered.load(Ordering::Relaxed), 1);
        assert_eq!(exchanges.cancelled.load(Ordering::Relaxed), 1);
        exchanges.receive(Version::HTTP_11);
        let answer = Watch::new(exchanges.clone(), None).answered(Body::empty());
        assert_eq!(
            exchanges.answered.load(Ordering::Relaxed),
            1,
            "not until it ends"
        );
        drop(answer);
        assert_eq!(exchanges.answered.load(Ordering::Relaxed), 2);
        assert_eq!(exchanges.cancelled.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn the_hundredth_abandoned_request_floods_and_wakes_the_connection() {
        let exchanges = Arc::new(Exchanges::new());
        let woken = |exchanges: &Exchanges| {
            let mut cx = Context::from_waker(std::task::Waker::noop());
            std::pin::pin!(exchanges.flood.notified())
                .poll(&mut cx)
                .is_ready()
        };
        for _ in 1..MAX_CANCELLED {
            drop(Watch::new(exchanges.clone(), None));
        }
        assert!(!exchanges.flooded());
        assert!(!woken(&exchanges));
        drop(Watch::new(exchanges.clone(), None));
        assert!(exchanges.flooded());
        assert!(woken(&exchanges));
    }
}

#[cfg(test)]
mod forwarded {
    use super::*;

    #[test]
    fn the_client_behind_half_the_abandoned_requests_is_the_flooder() {
        let exchanges = Arc::new(Exchanges::new());
        let (a, b): (IpAddr, IpAddr) = (
            "203.0.113.9".parse().unwrap(),
            "203.0.113.10".parse().unwrap(),
        );
        for _ in 0..49 {
            drop(Watch::new(exchanges.clone(), Some(a)));
        }
        for _ in 0..30 {
            drop(Watch::new(exchanges.clone(), Some(b)));
        }
        assert_eq!(exchanges.main_abandoner(), None, "49 of 100 is not half");
        drop(Watch::new(exchanges.clone(), Some(a)));
        assert_eq!(exchanges.main_abandoner(), Some(a));
        // An answered request is not abandoned.
        drop(Watch::new(exchanges.clone(), Some(b)).answered(Body::empty()));
        assert_eq!(exchanges.abandoned_by.lock()[&b], 30);
    }
}
