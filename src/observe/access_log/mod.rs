//! The access log: one line per request on stdout, written off the request path.
//!
//! A request hands its [`Record`] to a bounded queue and goes on; one thread formats
//! the records and writes them. When stdout cannot keep up (a blocked pipe, a slow
//! log shipper), the queue fills and further records are dropped and counted in
//! `sluice_access_log_dropped_total`: a slow stdout never slows a request. Records
//! carry indexes into the config snapshot they were served with, and the writer turns
//! them into names, so a request does no formatting and copies no names.
//!
//! Never logged: API keys, `Authorization`, query strings.
//!
//! A request being served carries its [`Entry`] (`entry`), which gathers the line's
//! fields as admission learns them and hands the record over when the answer ends.

mod entry;

pub(crate) use entry::{Entry, Labels, SocketLine};

use std::io::Write;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::time::Duration;

use http::{HeaderValue, Method};
use prometheus::IntCounter;
use serde::Serialize;
use smallvec::SmallVec;

use crate::config::{AccessLogFormat, ConsumerId, PlanId, RouteId};
use crate::http::refusal::{OUTCOMES, Outcome};

/// The names behind a record's indexes: the config snapshot the request was served
/// with, which outlives the request for as long as its line waits to be written.
pub(crate) trait Names: Send + Sync + std::fmt::Debug {
    /// The name of consumer `id`.
    fn consumer_name(&self, id: ConsumerId) -> &str;
    /// The name of a plan.
    fn plan_name(&self, plan: PlanId) -> &str;
    /// The name of route `id`.
    fn route_name(&self, id: RouteId) -> &str;
}

/// Records waiting for the writer at most; beyond, they are dropped and counted.
const QUEUE: usize = 8_192;

/// What the log says about one request.
#[derive(Debug)]
pub(crate) struct Record {
    /// The config the request was served with: the names behind the indexes.
    pub names: Arc<dyn Names>,
    pub format: AccessLogFormat,
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
    /// The limits that refused the request.
    pub violated: SmallVec<[&'static str; 8]>,
    /// The limits a shadow policy would have refused the request by.
    pub would_refuse: SmallVec<[&'static str; 8]>,
    /// `host:port` of the upstream target that answered.
    pub upstream: Option<String>,
    pub upstream_status: Option<u16>,
    pub upstream_duration: Option<Duration>,
    /// From the request head until the last byte of the response (or the client
    /// went away).
    pub duration: Duration,
    /// Response body bytes sent.
    pub bytes: u64,
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
    /// The first close frame's code, or sluice's own; 1006 when none was sent.
    pub close_code: u16,
}

/// The sending side of the access log, shared by every request.
#[derive(Debug, Clone)]
pub(crate) struct AccessLog {
    queue: SyncSender<Record>,
    dropped: IntCounter,
}

impl AccessLog {
    /// Starts the writer thread; it writes to `out` until every sender is dropped.
    pub(crate) fn start(out: impl Write + Send + 'static, dropped: IntCounter) -> AccessLog {
        let (queue, records) = std::sync::mpsc::sync_channel(QUEUE);
        std::thread::Builder::new()
            .name("access-log".to_string())
            .spawn(move || write_all(records, out))
            .expect("the access log thread starts");
        AccessLog { queue, dropped }
    }

    /// Queues `record`, or drops and counts it if the writer is behind.
    pub(crate) fn log(&self, record: Record) {
        match self.queue.try_send(record) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => self.dropped.inc(),
            Err(TrySendError::Disconnected(_)) => {}
        }
    }
}

/// How long the writer rests after each batch: lines are at most this late, and at
/// 100 000 requests a second a batch holds 1 000 records, well inside [`QUEUE`].
pub(crate) const BATCH_EVERY: std::time::Duration = std::time::Duration::from_millis(10);

/// The writer: formats records, writes them in batches, flushes when the queue is
/// empty. It then rests for [`BATCH_EVERY`] before it looks at the queue again, so a
/// busy gateway's requests never wake it one by one (a wake-up and a `write` per
/// request cost more than formatting the line); a quiet gateway's first line still
/// appears at once, as the writer waits for it in `recv`.
fn write_all(records: Receiver<Record>, out: impl Write) {
    let mut out = std::io::BufWriter::with_capacity(64 * 1024, out);
    let mut line = Vec::with_capacity(512);
    while let Ok(mut record) = records.recv() {
        loop {
            line.clear();
            format(&record, &mut line);
            if out.write_all(&line).is_err() {
                return;
            }
            match records.try_recv() {
                Ok(next) => record = next,
                Err(_) => break,
            }
        }
        if out.flush().is_err() {
            return;
        }
        std::thread::sleep(BATCH_EVERY);
    }
}

/// The JSON form of a line; field names are the log's contract.
#[derive(Serialize)]
struct Line<'a> {
    time: String,
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
    websocket: Option<SocketRecord>,
}

fn format(record: &Record, out: &mut Vec<u8>) {
    let names = &record.names;
    let line = Line {
        time: i64::try_from(record.time_ms)
            .ok()
            .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
            .map(|t| format!("{t:.3}"))
            .unwrap_or_default(),
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
        websocket: record.socket.as_deref().copied(),
    };
    match record.format {
        AccessLogFormat::Json => json(&line, out),
        AccessLogFormat::Text | AccessLogFormat::Off => text(&line, out),
    }
    out.push(b'\n');
}

/// The line as `serde_json` writes a [`Line`] (the test below holds them equal),
/// field by field: a string that needs no escaping, as nearly every one does (names
/// from the config, hex request ids, normalised paths), is copied as it is instead
/// of through serde_json's escaping, byte by byte (`docs/performance.md`, "Figures
/// behind the code").
fn json(line: &Line, out: &mut Vec<u8>) {
    let mut fields = JsonFields { out, first: true };
    fields.str("time", &line.time);
    fields.str("request_id", line.request_id);
    fields.value("client", &line.client);
    fields.str("consumer", line.consumer);
    fields.str("plan", line.plan);
    fields.str("route", line.route);
    fields.str("method", line.method);
    fields.str("path", line.path);
    fields.value("status", &line.status);
    fields.str("outcome", line.outcome);
    fields.strs("violated", line.violated);
    if !line.would_refuse.is_empty() {
        fields.strs("would_refuse", line.would_refuse);
    }
    match line.upstream {
        Some(upstream) => fields.str("upstream", upstream),
        None => fields.value("upstream", &()),
    }
    fields.value("upstream_status", &line.upstream_status);
    fields.value("duration_ms", &line.duration_ms);
    fields.value("upstream_ms", &line.upstream_ms);
    fields.value("bytes", &line.bytes);
    if let Some(socket) = &line.websocket {
        fields.value("websocket", socket);
    }
    fields.out.push(b'}');
}

/// A JSON object being written, one field at a time.
struct JsonFields<'o> {
    out: &'o mut Vec<u8>,
    first: bool,
}

impl JsonFields<'_> {
    /// `"name":` (field names are plain ASCII).
    fn name(&mut self, name: &str) {
        self.out.push(if self.first { b'{' } else { b',' });
        self.first = false;
        self.out.push(b'"');
        self.out.extend_from_slice(name.as_bytes());
        self.out.extend_from_slice(b"\":");
    }

    fn str(&mut self, name: &str, value: &str) {
        self.name(name);
        string(self.out, value);
    }

    fn strs(&mut self, name: &str, values: &[&str]) {
        self.name(name);
        self.out.push(b'[');
        for (i, value) in values.iter().enumerate() {
            if i > 0 {
                self.out.push(b',');
            }
            string(self.out, value);
        }
        self.out.push(b']');
    }

    /// Anything else (numbers, null, an address), as serde_json writes it.
    fn value(&mut self, name: &str, value: &impl Serialize) {
        self.name(name);
        let _ = serde_json::to_writer(&mut *self.out, value);
    }
}

/// `value` as a JSON string: copied between quotes when nothing in it needs an
/// escape (a control character, `"` or `\\`), else escaped by serde_json.
fn string(out: &mut Vec<u8>, value: &str) {
    if value.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\') {
        let _ = serde_json::to_writer(&mut *out, value);
        return;
    }
    out.reserve(value.len() + 2);
    out.push(b'"');
    out.extend_from_slice(value.as_bytes());
    out.push(b'"');
}

/// `TIME CLIENT "METHOD PATH" STATUS BYTES DURATION_MS id=.. consumer=.. ...`: the
/// nginx order first, then sluice's fields as `key=value` (`-` when empty).
fn text(line: &Line, out: &mut Vec<u8>) {
    let dash = |v: Option<String>| v.unwrap_or_else(|| "-".to_string());
    let violated = match line.violated.is_empty() {
        true => "-".to_string(),
        false => line.violated.join(","),
    };
    let _ = write!(
        out,
        "{} {} \"{} {}\" {} {} {:.3} id={} consumer={} plan={} route={} outcome={} \
         violated={violated} upstream={} upstream_status={} upstream_ms={}",
        line.time,
        line.client,
        line.method,
        line.path.escape_debug(),
        line.status,
        line.bytes,
        line.duration_ms,
        line.request_id,
        line.consumer,
        line.plan,
        line.route,
        line.outcome,
        line.upstream.unwrap_or("-"),
        dash(line.upstream_status.map(|s| s.to_string())),
        dash(line.upstream_ms.map(|ms| format!("{ms:.3}"))),
    );
    if !line.would_refuse.is_empty() {
        let _ = write!(out, " would_refuse={}", line.would_refuse.join(","));
    }
    if let Some(s) = &line.websocket {
        let _ = write!(
            out,
            " ws_bytes_up={} ws_bytes_down={} ws_messages_up={} ws_messages_down={} ws_close={}",
            s.bytes_up, s.bytes_down, s.messages_up, s.messages_down, s.close_code
        );
    }
}

fn millis(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line<'a>(strings: &'a [&'a str; 9], violated: &'a [&'static str]) -> Line<'a> {
        Line {
            time: strings[0].to_string(),
            request_id: strings[1],
            client: "2001:db8::7".parse().unwrap(),
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
            websocket: (!strings[8].is_empty()).then(|| SocketRecord {
                bytes_up: 10,
                close_code: 1000,
                ..SocketRecord::default()
            }),
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
        for (strings, violated) in [
            (&plain, &[][..]),
            (&plain, &["minute", "hour"][..]),
            (&awkward, &["second"][..]),
        ] {
            let line = line(strings, violated);
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
