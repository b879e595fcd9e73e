//! The gateway listeners' open connections by protocol, for the status page: HTTP/1
//! and HTTP/2 here, WebSockets in `sluice_ws_connections`.
//!
//! A connection holds one [`Open`] for its life; it counts as HTTP/1 until its
//! client's preface (or ALPN) shows HTTP/2, and stops counting when it ends or
//! switches to a WebSocket. Two process-wide atomics: an add when a connection opens
//! and one when it closes, nothing per request.

use std::sync::atomic::{AtomicUsize, Ordering};

static HTTP1: AtomicUsize = AtomicUsize::new(0);
static HTTP2: AtomicUsize = AtomicUsize::new(0);

/// Open connections by protocol, now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counts {
    pub http1: usize,
    pub http2: usize,
}

/// Connections open now.
pub(crate) fn counts() -> Counts {
    Counts {
        http1: HTTP1.load(Ordering::Relaxed),
        http2: HTTP2.load(Ordering::Relaxed),
    }
}

/// One open connection's place in the counts (if its listener is counted), given
/// back when dropped.
#[derive(Debug)]
pub(crate) struct Open {
    h2: bool,
    counted: bool,
}

impl Open {
    /// A connection just accepted: HTTP/2 when ALPN said so, else HTTP/1 until its
    /// preface says otherwise ([`Open::http2`]). Counted only if `counted` (the
    /// gateway listener's connections).
    pub(crate) fn new(h2: bool, counted: bool) -> Open {
        if counted {
            counter(h2).fetch_add(1, Ordering::Relaxed);
        }
        Open { h2, counted }
    }

    /// The connection turned out to be HTTP/2 (its client sent the preface).
    pub(crate) fn http2(&mut self) {
        if self.counted && !self.h2 {
            HTTP1.fetch_sub(1, Ordering::Relaxed);
            HTTP2.fetch_add(1, Ordering::Relaxed);
        }
        self.h2 = true;
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        if self.counted {
            counter(self.h2).fetch_sub(1, Ordering::Relaxed);
        }
    }
}

fn counter(h2: bool) -> &'static AtomicUsize {
    match h2 {
        true => &HTTP2,
        false => &HTTP1,
    }
}
