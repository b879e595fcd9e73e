//! One access-log line: a [`Record`] turned into text (`nginx` order, then
//! `key=value`) or JSON, with the record's indexes resolved to names and its time
//! written as RFC 3339. A request formats its own line when its answer ends; the
//! writer formats the refusals its summary lets through.
//!
//! It does not queue, batch or write: the writer in the parent module does.

use std::io::Write;
use std::net::IpAddr;
use std::time::Duration;

use serde::Serialize;

use super::{Record, SocketRecord};
use crate::config::AccessLogFormat;
use crate::http::refusal::OUTCOMES;

/// The time of the lines being written, RFC 3339 in UTC with milliseconds
/// (`2026-11-27T10:00:00.125Z`, as `jiff` writes it): formatted whole when a line
/// falls in another second than the last, else only its milliseconds rewritten.
#[derive(Debug, Default)]
pub(super) struct Stamp {
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
            let digit = |d: u64| char::from(b'0' + d as u8);
            self.text.push(digit(millis / 100));
            self.text.push(digit(millis / 10 % 10));
            self.text.push(digit(millis % 10));
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

pub(super) fn format(record: &Record, repeated: u64, stamp: &mut Stamp, out: &mut Vec<u8>) {
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
        route: match (&record.domain, record.route) {
            (Some(domain), _) => domain,
            (None, Some(r)) => names.route_name(r),
            (None, None) => crate::observe::metrics::NO_ROUTE,
        },
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
        websocket: record.socket,
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
    plain(out, line.time);
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
    plain(out, line.method);
    out.extend_from_slice(b",\"path\":");
    string(out, line.path);
    out.extend_from_slice(b",\"status\":");
    number(out, line.status);
    out.extend_from_slice(b",\"outcome\":");
    plain(out, line.outcome);
    out.extend_from_slice(b",\"violated\":");
    strings(out, line.violated);
    if !line.would_refuse.is_empty() {
        out.extend_from_slice(b",\"would_refuse\":");
        strings(out, line.would_refuse);
    }
    out.extend_from_slice(b",\"upstream\":");
    nullable(out, line.upstream, string);
    out.extend_from_slice(b",\"upstream_status\":");
    nullable(out, line.upstream_status, number);
    out.extend_from_slice(b",\"duration_ms\":");
    milliseconds(out, line.duration_ms);
    out.extend_from_slice(b",\"upstream_ms\":");
    nullable(out, line.upstream_ms, milliseconds);
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

/// `value` written by `write`, or `null`.
fn nullable<T>(out: &mut Vec<u8>, value: Option<T>, write: impl FnOnce(&mut Vec<u8>, T)) {
    match value {
        Some(value) => write(out, value),
        None => out.extend_from_slice(b"null"),
    }
}

fn number(out: &mut Vec<u8>, n: impl itoa::Integer) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// Milliseconds as serde_json writes an `f64` (its shortest form that reads back
/// the same). A duration of the log is a whole number of microseconds ([`millis`]),
/// whose shortest form is its decimal with at most three digits after the point
/// (`0.282`, `12.5`, `3.0`): written with integers, not through the float
/// formatter; any other value goes to serde_json.
fn milliseconds(out: &mut Vec<u8>, ms: f64) {
    // Below 1e15 µs (31 years) a double is far finer than a microsecond; a value
    // that is not a whole number of them fails the test and goes to serde_json.
    let micros = (ms * 1e3 + 0.5) as u64;
    if !(0.0..1e12).contains(&ms) || ms.is_sign_negative() || micros as f64 / 1e3 != ms {
        let _ = serde_json::to_writer(&mut *out, &ms);
        return;
    }
    number(out, micros / 1000);
    let fraction = micros % 1000;
    let digit = |d: u64| b'0' + d as u8;
    out.push(b'.');
    out.push(digit(fraction / 100));
    if !fraction.is_multiple_of(100) {
        out.push(digit(fraction / 10 % 10));
        if !fraction.is_multiple_of(10) {
            out.push(digit(fraction % 10));
        }
    }
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
    plain(out, value);
}

/// `value`, which needs no escape by how it is made, as a JSON string: the time
/// (written here), the method (an HTTP token) and the outcome (a fixed word).
fn plain(out: &mut Vec<u8>, value: &str) {
    debug_assert!(!needs_escape(value.as_bytes()), "{value:?} needs an escape");
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
mod tests;
