//! The access log: one line per request on stdout, written off the request path.
//!
//! A request hands its [`Record`] to a bounded queue and goes on; one thread formats
//! the records and writes them. When stdout cannot keep up (a blocked pipe, a slow
//! log shipper), the queue fills and further records are dropped and counted in
//! `sluice_access_log_dropped_total`: a slow stdout never slows a request. Records
//! carry indexes into the config snapshot they were served with, and the writer turns
//! them into names, so a request does no formatting and copies no names.
//!
//! Under `[log] refused = "summary"` (the default) the writer leaves out a refusal
//! flood's repeats ([`summary`]): a caller hammering one route over its limit writes
//! a line a second, not a line a request.
//!
//! Never logged: API keys, `Authorization`, query strings.
//!
//! A request being served carries its [`Entry`] (`entry`), which gathers the line's
//! fields as admission learns them and hands the record over when the answer ends.

mod entry;
mod line;
mod summary;

pub(crate) use entry::{Entry, GrpcStatus, Labels, SocketLine};

use std::io::Write;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::time::Duration;

use http::{HeaderValue, Method};
use prometheus::IntCounter;
use serde::Serialize;

use crate::config::{AccessLogFormat, ConsumerId, PlanId, RouteId};
use crate::http::refusal::Outcome;
use line::{Stamp, format};
use summary::Summary;

/// The names behind a record's indexes: the config snapshot the request was served
/// with, which outlives the request for as long as its line waits to be written.
pub(crate) trait Names: Send + Sync + std::fmt::Debug {
    /// The name of consumer `id`.
    fn consumer_name(&self, id: ConsumerId) -> &str;
    /// The name of a plan.
    fn plan_name(&self, plan: PlanId) -> &str;
    /// The name of route `id`.
    fn route_name(&self, id: RouteId) -> &str;
    /// The prefix anonymous IPv6 callers are keyed by (`[identity] ipv6_prefix`).
    fn ipv6_prefix(&self) -> u8 {
        64
    }
}

/// Records waiting for the writer at most; beyond, they are dropped and counted.
const QUEUE: usize = 8_192;

/// What the log says about one request.
#[derive(Debug)]
pub(crate) struct Record {
    /// The config the request was served with: the names behind the indexes.
    pub names: Arc<dyn Names>,
    pub format: AccessLogFormat,
    /// Whether a refusal may be left out of the log and counted in the next line's
    /// `repeated` (`[log] refused = "summary"`).
    pub summarised: bool,
    /// When the request head arrived, in ms since the Unix epoch.
    pub time_ms: u64,
    pub request_id: HeaderValue,
    pub client: IpAddr,
    /// Index of the consumer; `None` for anonymous callers.
    pub consumer: Option<ConsumerId>,
    /// The name a trusted auth layer gave a caller the config does not list.
    pub named: Option<Box<str>>,
    pub plan: Option<PlanId>,
    pub route: Option<RouteId>,
    /// An RLS call's domain, logged as its route (`route` is then `None`).
    pub domain: Option<Box<str>>,
    pub method: Method,
    /// The normalised path without the query (or, for a path refused as unsafe,
    /// the path as sent).
    pub path: String,
    pub status: u16,
    pub outcome: Outcome,
    /// The limits that refused the request (boxed, as the next field: most requests
    /// have neither, which a box holds without allocating).
    pub violated: Box<[&'static str]>,
    /// The limits a shadow policy would have refused the request by.
    pub would_refuse: Box<[&'static str]>,
    /// `host:port` of the upstream target that answered.
    pub upstream: Option<String>,
    pub upstream_status: Option<u16>,
    pub upstream_duration: Option<Duration>,
    /// From the request head until the last byte of the response (or the client
    /// went away).
    pub duration: Duration,
    /// Response body bytes sent.
    pub bytes: u64,
    /// The door of the decision listener the request came through (`rls`,
    /// `forward-auth`); `None` for a proxied request.
    pub via: Option<&'static str>,
    /// A gRPC call's `grpc-status`, as the client got it.
    pub grpc_status: Option<u8>,
    /// A WebSocket's traffic, logged when it closed.
    pub socket: Option<SocketRecord>,
}

/// What a WebSocket carried, on its upgrade's line.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub(crate) struct SocketRecord {
    /// Frame bytes the client sent on.
    pub bytes_up: u64,
    /// Frame bytes the upstream sent on.
    pub bytes_down: u64,
    /// Messages the client sent on (a fragmented one counts once).
    pub messages_up: u64,
    /// Messages the upstream sent on.
    pub messages_down: u64,
    /// Client messages refused by the message limit (the socket then closed).
    pub messages_limited: u64,
    /// The first close frame's code, or sluice's own; 1006 when none was sent.
    pub close_code: u16,
}

/// The sending side of the access log, shared by every request. One `Arc`, so that
/// the copy an answer's body carries to its end costs one reference count, not one
/// for the queue and one for the counter.
#[derive(Debug, Clone)]
pub(crate) struct AccessLog(Arc<Sender>);

#[derive(Debug)]
struct Sender {
    queue: SyncSender<Box<Record>>,
    dropped: IntCounter,
}

impl AccessLog {
    /// Starts the writer thread; it writes to `out` until every sender is dropped,
    /// counting the refusals it leaves out in `suppressed`.
    pub(crate) fn start(
        out: impl Write + Send + 'static,
        dropped: IntCounter,
        suppressed: IntCounter,
    ) -> AccessLog {
        let (queue, records) = std::sync::mpsc::sync_channel(QUEUE);
        let summary = Summary::new(suppressed);
        std::thread::Builder::new()
            .name("access-log".to_string())
            .spawn(move || write_all(records, out, summary))
            .expect("the access log thread starts");
        AccessLog(Arc::new(Sender { queue, dropped }))
    }

    /// Queues `record`, or drops and counts it if the writer is behind. A record
    /// travels boxed, from the request's answer to the writer: made once in its box,
    /// it is never copied on the way (some 330 bytes moved five times, about 600
    /// instructions a logged request on the two threads, `docs/performance.md`).
    pub(crate) fn log(&self, record: Box<Record>) {
        match self.0.queue.try_send(record) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => self.0.dropped.inc(),
            Err(TrySendError::Disconnected(_)) => {}
        }
    }
}

/// How long the writer rests after each batch: lines are at most this late, and at
/// 100 000 requests a second a batch holds 1 000 records, well inside [`QUEUE`].
pub(crate) const BATCH_EVERY: std::time::Duration = std::time::Duration::from_millis(10);

/// Bytes of lines the writer gathers before it writes them out.
const WRITE_EVERY: usize = 64 * 1024;

/// How often at most the writer looks for held refusals whose key went quiet, while
/// it holds any.
const SWEEP_EVERY: Duration = Duration::from_millis(250);

/// The writer: formats records, writes them in batches, flushes when the queue is
/// empty. It then rests for [`BATCH_EVERY`] before it looks at the queue again, so a
/// busy gateway's requests never wake it one by one (a wake-up and a `write` per
/// request cost more than formatting the line); a quiet gateway's first line still
/// appears at once, as the writer waits for it in `recv`. Lines are formatted straight
/// into the batch, which is written whole (at most [`WRITE_EVERY`] bytes and a line).
/// Refusals the summary holds back are written when their key has been quiet for a
/// second, checked after each batch and, while any is held, every [`SWEEP_EVERY`].
fn write_all(records: Receiver<Box<Record>>, mut out: impl Write, mut summary: Summary) {
    let mut batch = Vec::with_capacity(WRITE_EVERY + 1024);
    let mut stamp = Stamp::default();
    let mut swept = std::time::Instant::now();
    loop {
        let first = match summary.holding() {
            true => match records.recv_timeout(SWEEP_EVERY) {
                Ok(record) => Some(record),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => break,
            },
            false => match records.recv() {
                Ok(record) => Some(record),
                Err(_) => break,
            },
        };
        let busy = first.is_some();
        let now = std::time::Instant::now();
        let mut next = first;
        while let Some(record) = next {
            if let Some((record, repeated)) = summary.admit(record, now) {
                format(&record, repeated, &mut stamp, &mut batch);
            }
            if batch.len() >= WRITE_EVERY {
                if out.write_all(&batch).is_err() {
                    return;
                }
                batch.clear();
            }
            next = records.try_recv().ok();
        }
        if summary.holding() && now.duration_since(swept) >= SWEEP_EVERY {
            swept = now;
            summary.expired(false, |record, repeated| {
                format(&record, repeated, &mut stamp, &mut batch);
            });
        }
        if !batch.is_empty() {
            if out.write_all(&batch).and_then(|()| out.flush()).is_err() {
                return;
            }
            batch.clear();
        }
        if busy {
            std::thread::sleep(BATCH_EVERY);
        }
    }
    // The senders are gone (the gateway stops): what is held is written as it is.
    summary.expired(true, |record, repeated| {
        format(&record, repeated, &mut stamp, &mut batch);
    });
    let _ = out.write_all(&batch).and_then(|()| out.flush());
}
