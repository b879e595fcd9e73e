//! The access log: one line per request on stdout, written off the request path.
//!
//! A request formats its line on its own thread (a JSON line in two halves: the
//! fields known when it is answered, then the durations and bytes when the answer
//! ends), appends it to what is pending for the writer and goes on; one thread
//! writes the pending lines in batches. When stdout cannot keep up (a blocked pipe,
//! a slow log shipper), what is pending reaches its bound and further lines are
//! dropped and counted in `sluice_access_log_dropped_total`: a slow stdout never
//! slows a request. A line that is kept as a [`Record`] until the answer ends (a
//! text line, a refusal the summary decides on, a 499, a WebSocket's) carries
//! indexes into the config snapshot it was served with, which the formatting turns
//! into names.
//!
//! Under `[log] refused = "summary"` (the default) the writer leaves out a refusal
//! flood's repeats ([`summary`]): a caller hammering one route over its limit writes
//! a line a second, not a line a request. Such a refusal is handed to the writer as
//! its record, which the writer formats if the summary lets it through.
//!
//! Never logged: API keys, `Authorization`, query strings.
//!
//! A request being served carries its [`Entry`] (`entry`), which gathers the line's
//! fields as admission learns them and hands its line (or its record) over when the
//! answer ends.

mod entry;
mod line;
mod summary;

pub(crate) use entry::{Entry, GrpcStatus, Labels, SocketLine};
pub(crate) use line::json_plain;

use std::io::Write;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use http::{HeaderValue, Method, Uri};
use prometheus::IntCounter;
use serde::Serialize;

use crate::config::{AccessLogFormat, ConsumerId, PlanId, RouteId};
use crate::http::refusal::Outcome;
use line::{Head, Tail};
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
    /// Whether no plan and no route name holds a character JSON must escape
    /// (checked once, when the config is compiled): the log then copies them
    /// without looking.
    fn plain_names(&self) -> bool {
        false
    }
    /// The prefix anonymous IPv6 callers are keyed by (`[identity] ipv6_prefix`).
    fn ipv6_prefix(&self) -> u8 {
        64
    }
}

/// The room a line formatted in halves is given at first: a proxied request's line
/// is about 300 bytes.
const LINE_BYTES: usize = 512;

/// Lines and refusals waiting for the writer at most; beyond, they are dropped and
/// counted.
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
    pub path: Path,
    pub status: u16,
    pub outcome: Outcome,
    /// The limits that refused the request (boxed, as the next field: most requests
    /// have neither, which a box holds without allocating).
    pub violated: Box<[&'static str]>,
    /// The limits a shadow policy would have refused the request by.
    pub would_refuse: Box<[&'static str]>,
    /// `host:port` of the upstream target that answered (its pool's, shared).
    pub upstream: Option<Arc<str>>,
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

/// A line's path: the request's target as sent when normalising left its path as
/// it was, as for nearly every request (the target is kept anyway, and keeping it
/// costs a reference count where a copy of the path cost an allocation), else the
/// normalised path.
#[derive(Debug)]
pub(crate) enum Path {
    Sent(Uri),
    Normalised(String),
}

impl Path {
    pub(crate) fn as_str(&self) -> &str {
        match self {
            Path::Sent(uri) => uri.path(),
            Path::Normalised(path) => path,
        }
    }
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
/// the copy an answer's body carries to its end costs one reference count.
#[derive(Debug, Clone)]
pub(crate) struct AccessLog(Arc<Sender>);

#[derive(Debug)]
struct Sender {
    pending: Arc<Mutex<Pending>>,
    /// The writer, woken by the first line of a batch.
    writer: std::thread::Thread,
    dropped: IntCounter,
}

/// What the requests handed over since the writer last looked.
#[derive(Debug, Default)]
struct Pending {
    /// The lines the requests formatted, in the order their answers ended.
    lines: Vec<u8>,
    /// How many lines `lines` holds.
    count: usize,
    /// Refusals the summary decides on, on the writer's thread, each with the length
    /// `lines` had when it came: where its line, if any, falls among them.
    refusals: Vec<(usize, Box<Record>)>,
    /// Every sender is gone (the gateway stops): the writer writes what is left
    /// and ends.
    closed: bool,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.lines.is_empty() && self.refusals.is_empty()
    }
}

/// A request thread's own line buffer and clock text: a line is formatted there and
/// then copied into [`Pending`] in one short hold of its lock.
#[derive(Debug, Default)]
struct Scratch {
    line: Vec<u8>,
    stamp: Stamp,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::default();
}

impl AccessLog {
    /// Starts the writer thread; it writes to `out` until every sender is dropped,
    /// counting the refusals it leaves out in `suppressed`.
    pub(crate) fn start(
        out: impl Write + Send + 'static,
        dropped: IntCounter,
        suppressed: IntCounter,
    ) -> AccessLog {
        let pending = Arc::new(Mutex::new(Pending::default()));
        let summary = Summary::new(suppressed);
        let handed = Arc::clone(&pending);
        let writer = std::thread::Builder::new()
            .name("access-log".to_string())
            .spawn(move || write_all(&handed, out, summary))
            .expect("the access log thread starts");
        AccessLog(Arc::new(Sender {
            pending,
            writer: writer.thread().clone(),
            dropped,
        }))
    }

    /// Logs `record`: formats its line on the request's thread and hands the line to
    /// the writer, or, for a refusal `[log] refused = "summary"` may leave out, hands
    /// the record itself to the writer's summary. Dropped and counted if the writer
    /// is behind. The line is formatted here, not on the writer: the record's blocks
    /// are then freed on the thread that allocated them, and no channel carries it
    /// (`docs/performance.md`, "Access log").
    pub(crate) fn log(&self, record: Box<Record>) {
        let sender = &*self.0;
        if record.summarised && summary::refusal(record.outcome) {
            sender.hand(|pending| {
                let at = pending.lines.len();
                pending.refusals.push((at, record));
            });
            return;
        }
        SCRATCH.with_borrow_mut(|scratch| {
            scratch.line.clear();
            format(&record, 0, &mut scratch.stamp, &mut scratch.line);
            sender.hand(|pending| {
                pending.lines.extend_from_slice(&scratch.line);
                pending.count += 1;
            });
        });
    }

    /// Whether a request answered with `outcome` has its line formatted in two
    /// halves, its head when it is answered ([`AccessLog::begin`]) and its tail when
    /// the answer ends ([`AccessLog::end`]), so that no record is made of it: every
    /// JSON line but a refusal the summary may leave out. Text lines are rare enough
    /// to keep the record.
    fn in_halves(format: AccessLogFormat, summarised: bool, outcome: Outcome) -> bool {
        format == AccessLogFormat::Json && !(summarised && summary::refusal(outcome))
    }

    /// A JSON line's head, `head` at `time_ms`, in a buffer of its own that the
    /// answer's end completes.
    fn begin(time_ms: u64, head: &Head) -> Vec<u8> {
        let mut line = Vec::with_capacity(LINE_BYTES);
        SCRATCH.with_borrow_mut(|scratch| {
            line::json_head(scratch.stamp.at(time_ms), head, &mut line);
        });
        line
    }

    /// Completes `line`, a head from [`AccessLog::begin`], with `tail` and hands it
    /// to the writer.
    fn end(&self, mut line: Vec<u8>, tail: &Tail) {
        line::json_tail(tail, &mut line);
        line.push(b'\n');
        self.0.hand(|pending| {
            pending.lines.extend_from_slice(&line);
            pending.count += 1;
        });
    }
}

impl Sender {
    /// Adds to what is pending with `add`, or drops and counts it when [`QUEUE`]
    /// lines and refusals already wait; the first of a batch wakes the writer.
    fn hand(&self, add: impl FnOnce(&mut Pending)) {
        let mut pending = lock(&self.pending);
        if pending.count + pending.refusals.len() >= QUEUE {
            drop(pending);
            self.dropped.inc();
            return;
        }
        let woken = pending.is_empty();
        add(&mut pending);
        drop(pending);
        if woken {
            self.writer.unpark();
        }
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        lock(&self.pending).closed = true;
        self.writer.unpark();
    }
}

/// The lock of what is pending; one a panicking holder left is taken as it is (a
/// holder only appends bytes or records, which leaves nothing half made).
fn lock(pending: &Mutex<Pending>) -> std::sync::MutexGuard<'_, Pending> {
    pending
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// How long the writer rests after each batch: lines are at most this late, and at
/// 100 000 requests a second a batch holds 1 000 lines, well inside [`QUEUE`].
pub(crate) const BATCH_EVERY: std::time::Duration = std::time::Duration::from_millis(10);

/// How often at most the writer looks for held refusals whose key went quiet, while
/// it holds any.
const SWEEP_EVERY: Duration = Duration::from_millis(250);

/// The writer: takes what the requests handed over, whole, lets the summary decide
/// on the refusals among it, writes it and flushes. It then rests for
/// [`BATCH_EVERY`] before it looks again, so a busy gateway's requests never wake it
/// one by one (a wake-up and a `write` per request cost more than formatting the
/// line); a quiet gateway's first line still appears at once, as the first line of a
/// batch wakes the writer. Refusals the summary holds back are written when their
/// key has been quiet for a second, checked after each batch and, while any is
/// held, every [`SWEEP_EVERY`].
fn write_all(pending: &Mutex<Pending>, mut out: impl Write, mut summary: Summary) {
    let mut taken = Pending::default();
    let mut batch = Vec::new();
    let mut stamp = Stamp::default();
    let mut swept = std::time::Instant::now();
    loop {
        let closed = {
            let mut pending = lock(pending);
            std::mem::swap(&mut pending.lines, &mut taken.lines);
            std::mem::swap(&mut pending.refusals, &mut taken.refusals);
            pending.count = 0;
            pending.closed
        };
        let busy = !taken.is_empty();
        let now = std::time::Instant::now();
        let mut from = 0;
        for (at, record) in taken.refusals.drain(..) {
            batch.extend_from_slice(&taken.lines[from..at]);
            from = at;
            if let Some((record, repeated)) = summary.admit(record, now) {
                format(&record, repeated, &mut stamp, &mut batch);
            }
        }
        // Without refusals, as on a gateway that is not flooded, the requests' lines
        // are written as they came, without a copy. Held refusals whose key went
        // quiet come after this batch's lines: they are written late by design.
        let lines = &taken.lines[from..];
        let expiring = summary.holding() && (closed || now.duration_since(swept) >= SWEEP_EVERY);
        let written = match batch.is_empty() && !expiring {
            true => out.write_all(lines),
            false => {
                batch.extend_from_slice(lines);
                if expiring {
                    swept = now;
                    summary.expired(closed, |record, repeated| {
                        format(&record, repeated, &mut stamp, &mut batch);
                    });
                }
                out.write_all(&batch)
            }
        };
        if (busy || !batch.is_empty()) && written.and_then(|()| out.flush()).is_err() {
            return;
        }
        taken.lines.clear();
        batch.clear();
        if closed {
            return;
        }
        match (busy, summary.holding()) {
            (true, _) => std::thread::sleep(BATCH_EVERY),
            (false, true) => std::thread::park_timeout(SWEEP_EVERY),
            (false, false) => std::thread::park(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use summary::tests::record;

    /// stdout, shared with the test.
    #[derive(Debug, Clone, Default)]
    struct Out(Arc<Mutex<Vec<u8>>>);

    impl Write for Out {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The lines a request formats and the refusals the writer's summary decides on
    /// come out in the order their answers ended; a refusal held back is written
    /// when the gateway stops.
    #[test]
    fn lines_and_summarised_refusals_keep_the_order_their_answers_ended() {
        let out = Out::default();
        let counter = |name| IntCounter::new(name, name).unwrap();
        let log = AccessLog::start(out.clone(), counter("d"), counter("s"));
        let allowed = |client| {
            let mut record = record(client, Outcome::Allowed, 1_000, true);
            record.status = 200;
            record
        };
        log.log(allowed([10, 0, 0, 1]));
        log.log(record([10, 0, 0, 2], Outcome::Limited, 1_000, true));
        log.log(allowed([10, 0, 0, 3]));
        // The same caller's next refusal in that second is held back.
        log.log(record([10, 0, 0, 2], Outcome::Limited, 1_400, true));
        log.log(allowed([10, 0, 0, 4]));
        drop(log);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let lines = loop {
            let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
            let lines: Vec<serde_json::Value> = text
                .lines()
                .map(|line| serde_json::from_str(line).unwrap())
                .collect();
            if lines.len() >= 5 || std::time::Instant::now() > deadline {
                break lines;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let seen: Vec<(&str, u64)> = lines
            .iter()
            .map(|line| {
                (
                    line["client"].as_str().unwrap(),
                    line["status"].as_u64().unwrap(),
                )
            })
            .collect();
        let want = [
            ("10.0.0.1", 200),
            ("10.0.0.2", 429),
            ("10.0.0.3", 200),
            ("10.0.0.4", 200),
            ("10.0.0.2", 429),
        ];
        assert_eq!(seen, want);
        assert_eq!(lines[4]["time"], "1970-01-01T00:00:01.400Z");
    }
}
