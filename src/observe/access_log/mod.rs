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
use crate::http::refusal::{OUTCOMES, Outcome};
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
    pub method: Method,
    /// The normalised path without the query (or, for a path refused as unsafe,
    /// the path as sent).
    pub path: String,
    pub status: u16,
    pub outcome: Outcome,
    /// The limits that refused the request (boxed, as the next field: a record is
    /// copied into the writer's queue, and two inline lists of eight would be 272 of
    /// its bytes; most requests have neither, which a box holds without allocating).
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
    pub socket: Option<Box<SocketRecord>>,
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
    queue: SyncSender<Record>,
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

    /// Queues `record`, or drops and counts it if the writer is behind.
    pub(crate) fn log(&self, record: Record) {
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
fn write_all(records: Receiver<Record>, mut out: impl Write, mut summary: Summary) {
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

/// The time of the lines being written, RFC 3339 in UTC with milliseconds
/// (`2026-11-27T10:00:00.125Z`, as `jiff` writes it): formatted whole when a line
/// falls in another second than the last, else only its milliseconds rewritten.
#[derive(Debug, Default)]
struct Stamp {
    /// The second (since the Unix epoch) `text` is of, when it can be rewritten.
    second: Option<u64>,
    text: String,
}

impl Stamp {
    /// `ms` (since the Unix epoch) as the line's `time`.
    fn at(&mut self, ms: u64) -> &str {
        let second = ms / 1000;
        let millis = ms % 1000;
        if self.second == Some(second) {
            self.text.truncate(self.text.len() - 4);
            let digits = [millis / 100, millis / 10 % 10, millis % 10];
            self.text.extend(digits.map(|d| char::from(b'0' + d as u8)));
            self.text.push('Z');
        } else {
            self.text = i64::try_from(ms)
                .ok()
                .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
                .map(|t| format!("{t:.3}"))
                .unwrap_or_default();
            // Rewritten in place only in the shape expected: `.mmmZ` at the end.
            let shaped = self.text.len() > 5
                && self.text.as_bytes()[self.text.len() - 5] == b'.'
                && self.text.ends_with('Z');
            self.second = shaped.then_some(second);
        }
        &self.text
    }
}

/// The JSON form of a line; field names are the log's contract.
#[derive(Serialize)]
struct Line<'a> {
    time: &'a str,
    request_id: &'a str,
    client: IpAddr,
    consumer: &'a str,
    plan: &'a str,
    route: &'a str,
    method: &'a str,
    path: &'a str,
    status: u16,
    outcome: &'static str,
    violated: &'a [&'static str],
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    would_refuse: &'a [&'static str],
    upstream: Option<&'a str>,
    upstream_status: Option<u16>,
    duration_ms: f64,
    upstream_ms: Option<f64>,
    bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    via: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    websocket: Option<SocketRecord>,
    #[serde(skip_serializing_if = "Option::is_none")]
    grpc_status: Option<u8>,
    /// Refusals of the same caller, route and outcome left out of the log since its
    /// previous line (`[log] refused = "summary"`).
    #[serde(skip_serializing_if = "is_zero")]
    repeated: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn format(record: &Record, repeated: u64, stamp: &mut Stamp, out: &mut Vec<u8>) {
    let names = &record.names;
    let line = Line {
        time: stamp.at(record.time_ms),
        request_id: record.request_id.to_str().unwrap_or("-"),
        client: record.client.to_canonical(),
        consumer: match (&record.named, record.consumer) {
            (Some(named), _) => named,
            (None, Some(c)) => names.consumer_name(c),
            (None, None) => "anonymous",
        },
        plan: record
            .plan
            .map_or(crate::observe::metrics::NO_PLAN, |p| names.plan_name(p)),
        route: record
            .route
            .map_or(crate::observe::metrics::NO_ROUTE, |r| names.route_name(r)),
        method: record.method.as_str(),
        path: &record.path,
        status: record.status,
        outcome: OUTCOMES[record.outcome as usize],
        violated: &record.violated,
        would_refuse: &record.would_refuse,
        upstream: record.upstream.as_deref(),
        upstream_status: record.upstream_status,
        duration_ms: millis(record.duration),
        upstream_ms: record.upstream_duration.map(millis),
        bytes: record.bytes,
        via: record.via,
        grpc_status: record.grpc_status,
        websocket: record.socket.as_deref().copied(),
        repeated,
    };
    match record.format {
        AccessLogFormat::Json => json(&line, out),
        AccessLogFormat::Text | AccessLogFormat::Off => text(&line, out),
    }
    out.push(b'\n');
}

/// The line as `serde_json` writes a [`Line`] (the test below holds them equal),
/// field by field: each name with its punctuation is one copy, numbers go through
/// `itoa` and an IPv4 client is written digit by digit, and a string that needs no
/// escaping, as nearly every one does (names from the config, hex request ids,
/// normalised paths), is copied as it is instead of through serde_json's escaping,
/// byte by byte (`docs/performance.md`, "Access log").
fn json(line: &Line, out: &mut Vec<u8>) {
    out.extend_from_slice(b"{\"time\":");
    string(out, line.time);
    out.extend_from_slice(b",\"request_id\":");
    string(out, line.request_id);
    out.extend_from_slice(b",\"client\":");
    address(out, line.client);
    out.extend_from_slice(b",\"consumer\":");
    string(out, line.consumer);
    out.extend_from_slice(b",\"plan\":");
    string(out, line.plan);
    out.extend_from_slice(b",\"route\":");
    string(out, line.route);
    out.extend_from_slice(b",\"method\":");
    string(out, line.method);
    out.extend_from_slice(b",\"path\":");
    string(out, line.path);
    out.extend_from_slice(b",\"status\":");
    number(out, line.status);
    out.extend_from_slice(b",\"outcome\":");
    string(out, line.outcome);
    out.extend_from_slice(b",\"violated\":");
    strings(out, line.violated);
    if !line.would_refuse.is_empty() {
        out.extend_from_slice(b",\"would_refuse\":");
        strings(out, line.would_refuse);
    }
    out.extend_from_slice(b",\"upstream\":");
    match line.upstream {
        Some(upstream) => string(out, upstream),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"upstream_status\":");
    match line.upstream_status {
        Some(status) => number(out, status),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"duration_ms\":");
    let _ = serde_json::to_writer(&mut *out, &line.duration_ms);
    out.extend_from_slice(b",\"upstream_ms\":");
    let _ = serde_json::to_writer(&mut *out, &line.upstream_ms);
    out.extend_from_slice(b",\"bytes\":");
    number(out, line.bytes);
    if let Some(via) = line.via {
        out.extend_from_slice(b",\"via\":");
        string(out, via);
    }
    if let Some(socket) = &line.websocket {
        out.extend_from_slice(b",\"websocket\":");
        let _ = serde_json::to_writer(&mut *out, socket);
    }
    if let Some(code) = line.grpc_status {
        out.extend_from_slice(b",\"grpc_status\":");
        number(out, code);
    }
    if line.repeated > 0 {
        out.extend_from_slice(b",\"repeated\":");
        number(out, line.repeated);
    }
    out.push(b'}');
}

fn number(out: &mut Vec<u8>, n: impl itoa::Integer) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// `["a","b"]`.
fn strings(out: &mut Vec<u8>, values: &[&str]) {
    out.push(b'[');
    for (i, value) in values.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        string(out, value);
    }
    out.push(b']');
}

/// The address as a JSON string: an IPv4 one digit by digit, an IPv6 one as
/// `Display` writes it (neither needs escaping).
fn address(out: &mut Vec<u8>, client: IpAddr) {
    out.push(b'"');
    match client {
        IpAddr::V4(v4) => {
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push(b'.');
                }
                number(out, octet);
            }
        }
        IpAddr::V6(v6) => {
            let _ = write!(out, "{v6}");
        }
    }
    out.push(b'"');
}

/// `value` as a JSON string: copied between quotes when nothing in it needs an
/// escape, else escaped by serde_json.
fn string(out: &mut Vec<u8>, value: &str) {
    if needs_escape(value.as_bytes()) {
        let _ = serde_json::to_writer(&mut *out, value);
        return;
    }
    out.reserve(value.len() + 2);
    out.push(b'"');
    out.extend_from_slice(value.as_bytes());
    out.push(b'"');
}

/// Whether `bytes` hold one JSON must escape (a control character, `"` or `\`).
/// Every byte is looked at, without stopping at the first found: a loop the compiler
/// runs 16 bytes at a time, where one that stops early goes byte by byte (a fifth of
/// the writer's instructions a line, `docs/performance.md`, "Access log").
fn needs_escape(bytes: &[u8]) -> bool {
    let flagged = bytes.iter().fold(0u8, |flagged, &b| {
        flagged | u8::from(b < 0x20) | u8::from(b == b'"') | u8::from(b == b'\\')
    });
    flagged != 0
}

/// A text line's field: control characters (and the backslash that introduces an
/// escape) written as Rust escapes (`\n`, `\u{1b}`, `\\`), so no field can end a
/// line or forge another, whatever a name or a path holds.
struct Field<'a>(&'a str);

impl std::fmt::Display for Field<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use std::fmt::Write as _;
        let plain = |c: char| !c.is_control() && c != '\\';
        if self.0.chars().all(plain) {
            return f.write_str(self.0);
        }
        for c in self.0.chars() {
            match plain(c) {
                true => f.write_char(c)?,
                false => write!(f, "{}", c.escape_default())?,
            }
        }
        Ok(())
    }
}

/// `TIME CLIENT "METHOD PATH" STATUS BYTES DURATION_MS id=.. consumer=.. ...`: the
/// nginx order first, then sluice's fields as `key=value` (`-` when empty). Every
/// field that holds text is escaped ([`Field`]); the path's quotes too.
fn text(line: &Line, out: &mut Vec<u8>) {
    let dash = |v: Option<String>| v.unwrap_or_else(|| "-".to_string());
    let violated = match line.violated.is_empty() {
        true => "-".to_string(),
        false => Field(&line.violated.join(",")).to_string(),
    };
    let _ = write!(
        out,
        "{} {} \"{} {}\" {} {} {:.3} id={} consumer={} plan={} route={} outcome={} \
         violated={violated} upstream={} upstream_status={} upstream_ms={}",
        line.time,
        line.client,
        Field(line.method),
        line.path.escape_debug(),
        line.status,
        line.bytes,
        line.duration_ms,
        Field(line.request_id),
        Field(line.consumer),
        Field(line.plan),
        Field(line.route),
        line.outcome,
        Field(line.upstream.unwrap_or("-")),
        dash(line.upstream_status.map(|s| s.to_string())),
        dash(line.upstream_ms.map(|ms| format!("{ms:.3}"))),
    );
    if !line.would_refuse.is_empty() {
        let _ = write!(out, " would_refuse={}", Field(&line.would_refuse.join(",")));
    }
    if let Some(via) = line.via {
        let _ = write!(out, " via={via}");
    }
    if let Some(s) = &line.websocket {
        let _ = write!(
            out,
            " ws_bytes_up={} ws_bytes_down={} ws_messages_up={} ws_messages_down={} \
             ws_messages_limited={} ws_close={}",
            s.bytes_up,
            s.bytes_down,
            s.messages_up,
            s.messages_down,
            s.messages_limited,
            s.close_code
        );
    }
    if let Some(code) = line.grpc_status {
        let _ = write!(out, " grpc_status={code}");
    }
    if line.repeated > 0 {
        let _ = write!(out, " repeated={}", line.repeated);
    }
}

fn millis(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line<'a>(strings: &'a [&'a str; 9], violated: &'a [&'static str], client: &str) -> Line<'a> {
        Line {
            time: strings[0],
            request_id: strings[1],
            client: client.parse().unwrap(),
            consumer: strings[2],
            plan: strings[3],
            route: strings[4],
            method: strings[5],
            path: strings[6],
            status: 429,
            outcome: "limited",
            violated,
            would_refuse: if strings[8].is_empty() {
                &[]
            } else {
                &["minute"]
            },
            upstream: (!strings[7].is_empty()).then_some(strings[7]),
            upstream_status: (!strings[7].is_empty()).then_some(200),
            duration_ms: 0.125,
            upstream_ms: (!strings[7].is_empty()).then_some(12.5e-3),
            bytes: u64::MAX,
            via: (!strings[8].is_empty()).then_some("rls"),
            grpc_status: (!strings[8].is_empty()).then_some(8),
            websocket: (!strings[8].is_empty()).then(|| SocketRecord {
                bytes_up: 10,
                close_code: 1000,
                ..SocketRecord::default()
            }),
            repeated: if strings[8].is_empty() { 0 } else { 41 },
        }
    }

    #[test]
    fn the_json_line_is_what_serde_json_writes() {
        let plain = [
            "2026-11-27T10:00:00.000Z",
            "3f2b8c1e9a4d4e2f",
            "acme",
            "registered",
            "orders",
            "GET",
            "/orders/7",
            "127.0.0.1:8080",
            "",
        ];
        let awkward = [
            "",
            "id \"quoted\" \\ back",
            "ünïcödé",
            "tab\there",
            "new\nline",
            "PURGE",
            "/caf%C3%A9/\u{1}",
            "[::1]:9",
            "x",
        ];
        let clients = ["2001:db8::7", "203.0.113.9", "0.0.0.0", "255.255.255.255"];
        for (strings, violated) in [
            (&plain, &[][..]),
            (&plain, &["minute", "hour"][..]),
            (&awkward, &["second"][..]),
        ] {
            for client in clients {
                let line = line(strings, violated, client);
                let mut ours = Vec::new();
                json(&line, &mut ours);
                let theirs = serde_json::to_vec(&line).unwrap();
                assert_eq!(
                    String::from_utf8(ours).unwrap(),
                    String::from_utf8(theirs).unwrap()
                );
            }
        }
    }

    #[test]
    fn no_text_field_can_break_the_line() {
        let forged = [
            "2026-11-27T10:00:00.000Z",
            "id\nforged",
            "evil\n2026-11-27T10:00:01.000Z 10.0.0.1 \"GET /admin\" 200",
            "plan\r",
            "route\u{1b}[31m",
            "GET",
            "/p\u{0}ath\n",
            "up\tstream:1",
            "",
        ];
        let line = line(&forged, &[], "203.0.113.9");
        let mut out = Vec::new();
        text(&line, &mut out);
        let out = String::from_utf8(out).unwrap();
        assert!(
            !out.contains(['\n', '\r', '\u{1b}', '\u{0}', '\t']),
            "{out}"
        );
        assert!(
            out.contains(r"consumer=evil\n2026-11-27T10:00:01.000Z"),
            "{out}"
        );
        assert!(out.contains(r"route=route\u{1b}[31m"), "{out}");
        assert!(out.contains(r"upstream=up\tstream:1"), "{out}");
        assert!(out.contains(r#""GET /p\0ath\n""#), "{out}");
        let plain = Field("acme/o'brien@x.y").to_string();
        assert_eq!(plain, "acme/o'brien@x.y");
        assert_eq!(Field(r"a\b").to_string(), r"a\\b");
    }

    #[test]
    fn every_byte_json_escapes_is_found_wherever_it_is() {
        for b in 0..=u8::MAX {
            let must = b < 0x20 || b == b'"' || b == b'\\';
            for at in [0, 7, 16, 33, 39] {
                let mut bytes = [b'a'; 40];
                bytes[at] = b;
                assert_eq!(needs_escape(&bytes), must, "{b:#x} at {at}");
            }
        }
        assert!(!needs_escape(b""));
    }

    #[test]
    fn the_time_is_what_jiff_writes_across_seconds() {
        let mut stamp = Stamp::default();
        let start = 1_795_867_199_000_u64;
        let times = (0..2_500)
            .map(|i| start + i)
            .chain([0, 999, 1_000, start + 7, start]);
        for ms in times {
            let whole = jiff::Timestamp::from_millisecond(ms as i64).unwrap();
            assert_eq!(stamp.at(ms), format!("{whole:.3}"), "{ms}");
        }
    }
}
