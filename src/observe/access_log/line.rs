//! One access-log line: a [`Record`] turned into text (`nginx` order, then
//! `key=value`) or JSON, with the record's indexes resolved to names and its time
//! written as RFC 3339. A request formats its own line (a JSON line's [`Head`] when
//! it is answered, its [`Tail`] when the answer ends); the writer formats the
//! refusals its summary lets through.
//!
//! It does not queue, batch or write: the writer in the parent module does.

use std::io::Write;
use std::net::IpAddr;
use std::time::Duration;

use serde::Serialize;

use super::{Names, Record, SocketRecord};
use crate::config::{AccessLogFormat, ConsumerId, PlanId, RouteId};
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
    pub(super) fn at(&mut self, ms: u64) -> &str {
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

/// The JSON form of a line; field names are the log's contract. A request answered
/// with a JSON log formats its time and [`Head`] when it is answered and its
/// [`Tail`] when the answer ends; a record formats all three at once.
#[derive(Serialize)]
struct Line<'a> {
    time: &'a str,
    #[serde(flatten)]
    head: Head<'a>,
    #[serde(flatten)]
    tail: Tail,
}

/// What a line says that is known when the request is answered.
#[derive(Serialize)]
pub(super) struct Head<'a> {
    pub request_id: &'a str,
    pub client: IpAddr,
    pub consumer: Name<'a>,
    pub plan: Name<'a>,
    pub route: Name<'a>,
    pub method: &'a str,
    pub path: &'a str,
    pub status: u16,
    pub outcome: &'static str,
    pub violated: &'a [&'static str],
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub would_refuse: &'a [&'static str],
    pub upstream: Option<&'a str>,
    pub upstream_status: Option<u16>,
}

/// What a line says that is known only when the answer's last byte is sent.
#[derive(Serialize)]
pub(super) struct Tail {
    duration_ms: Millis,
    upstream_ms: Option<Millis>,
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

impl Tail {
    /// The tail of an answered request's line, which took `duration` and sent
    /// `bytes` of body; its upstream took `upstream` (if it was asked).
    pub(super) fn answered(
        duration: Duration,
        upstream: Option<Duration>,
        bytes: u64,
        via: Option<&'static str>,
        grpc_status: Option<u8>,
    ) -> Tail {
        Tail {
            duration_ms: Millis::of(duration),
            upstream_ms: upstream.map(Millis::of),
            bytes,
            via,
            websocket: None,
            grpc_status,
            repeated: 0,
        }
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A name a line gives the caller, its plan or its route, and whether it is known
/// to need no escape: a fixed word, or a plan or route name of a config in which
/// none needs one ([`Names::plain_names`], checked when the config is compiled), so
/// that the line copies it without looking at its bytes.
#[derive(Clone, Copy)]
pub(super) struct Name<'a> {
    pub text: &'a str,
    pub plain: bool,
}

impl Serialize for Name<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.text)
    }
}

/// The name a line gives the caller: the one an auth layer gave it, the configured
/// consumer's, or `anonymous`.
pub(super) fn consumer_name<'a>(
    names: &'a dyn Names,
    named: Option<&'a str>,
    consumer: Option<ConsumerId>,
) -> Name<'a> {
    match (named, consumer) {
        (Some(named), _) => Name {
            text: named,
            plain: false,
        },
        (None, Some(c)) => Name {
            text: names.consumer_name(c),
            plain: false,
        },
        (None, None) => Name {
            text: "anonymous",
            plain: true,
        },
    }
}

/// The name a line gives the caller's plan.
pub(super) fn plan_name(names: &dyn Names, plan: Option<PlanId>) -> Name<'_> {
    match plan {
        Some(p) => Name {
            text: names.plan_name(p),
            plain: names.plain_names(),
        },
        None => Name {
            text: crate::observe::metrics::NO_PLAN,
            plain: true,
        },
    }
}

/// The name a line gives the route: an RLS call's domain, the route's, or `none`.
pub(super) fn route_name<'a>(
    names: &'a dyn Names,
    domain: Option<&'a str>,
    route: Option<RouteId>,
) -> Name<'a> {
    match (domain, route) {
        (Some(domain), _) => Name {
            text: domain,
            plain: false,
        },
        (None, Some(r)) => Name {
            text: names.route_name(r),
            plain: names.plain_names(),
        },
        (None, None) => Name {
            text: crate::observe::metrics::NO_ROUTE,
            plain: true,
        },
    }
}

/// `record`'s line, its `repeated` refusals left out before it, in the record's
/// format, with its time written by `stamp`.
pub(super) fn format(record: &Record, repeated: u64, stamp: &mut Stamp, out: &mut Vec<u8>) {
    let names = &*record.names;
    let line = Line {
        time: stamp.at(record.time_ms),
        head: Head {
            request_id: record.request_id.to_str().unwrap_or("-"),
            client: record.client.to_canonical(),
            consumer: consumer_name(names, record.named.as_deref(), record.consumer),
            plan: plan_name(names, record.plan),
            route: route_name(names, record.domain.as_deref(), record.route),
            method: record.method.as_str(),
            path: record.path.as_str(),
            status: record.status,
            outcome: OUTCOMES[record.outcome as usize],
            violated: &record.violated,
            would_refuse: &record.would_refuse,
            upstream: record.upstream.as_deref(),
            upstream_status: record.upstream_status,
        },
        tail: Tail {
            duration_ms: Millis::of(record.duration),
            upstream_ms: record.upstream_duration.map(Millis::of),
            bytes: record.bytes,
            via: record.via,
            websocket: record.socket,
            grpc_status: record.grpc_status,
            repeated,
        },
    };
    match record.format {
        AccessLogFormat::Json => json(&line, out),
        AccessLogFormat::Text | AccessLogFormat::Off => text(&line, out),
    }
    out.push(b'\n');
}

/// The line as `serde_json` writes a [`Line`] (the test below holds them equal),
/// field by field: the quotes around a string field are one copy with the names and
/// punctuation beside them, numbers go through `itoa` and an IPv4 client is written
/// digit by digit, and a string that needs no escaping, as nearly every one does
/// (names from the config, hex request ids, normalised paths), is copied as it is
/// (`docs/performance.md`, "Access log").
fn json(line: &Line, out: &mut Vec<u8>) {
    json_head(line.time, &line.head, out);
    json_tail(&line.tail, out);
}

/// A JSON line's opening brace, its `time` and the fields of `head`.
pub(super) fn json_head(time: &str, head: &Head, out: &mut Vec<u8>) {
    // Written by the writer, an HTTP token, a fixed word: none needs an escape.
    for plain in [time, head.method, head.outcome] {
        debug_assert!(!needs_escape(plain.as_bytes()), "{plain:?} needs an escape");
    }
    out.extend_from_slice(b"{\"time\":\"");
    out.extend_from_slice(time.as_bytes());
    out.extend_from_slice(b"\",\"request_id\":\"");
    contents(out, head.request_id);
    out.extend_from_slice(b"\",\"client\":\"");
    address(out, head.client);
    out.extend_from_slice(b"\",\"consumer\":\"");
    name(out, head.consumer);
    out.extend_from_slice(b"\",\"plan\":\"");
    name(out, head.plan);
    out.extend_from_slice(b"\",\"route\":\"");
    name(out, head.route);
    out.extend_from_slice(b"\",\"method\":\"");
    out.extend_from_slice(head.method.as_bytes());
    out.extend_from_slice(b"\",\"path\":\"");
    contents(out, head.path);
    out.extend_from_slice(b"\",\"status\":");
    number(out, head.status);
    out.extend_from_slice(b",\"outcome\":\"");
    out.extend_from_slice(head.outcome.as_bytes());
    out.extend_from_slice(b"\",\"violated\":");
    strings(out, head.violated);
    if !head.would_refuse.is_empty() {
        out.extend_from_slice(b",\"would_refuse\":");
        strings(out, head.would_refuse);
    }
    out.extend_from_slice(b",\"upstream\":");
    nullable(out, head.upstream, string);
    out.extend_from_slice(b",\"upstream_status\":");
    nullable(out, head.upstream_status, number);
}

/// The fields of `tail` and the line's closing brace (not its newline).
pub(super) fn json_tail(tail: &Tail, out: &mut Vec<u8>) {
    out.extend_from_slice(b",\"duration_ms\":");
    milliseconds(out, tail.duration_ms);
    out.extend_from_slice(b",\"upstream_ms\":");
    nullable(out, tail.upstream_ms, milliseconds);
    out.extend_from_slice(b",\"bytes\":");
    number(out, tail.bytes);
    if let Some(via) = tail.via {
        out.extend_from_slice(b",\"via\":");
        string(out, via);
    }
    if let Some(socket) = &tail.websocket {
        out.extend_from_slice(b",\"websocket\":");
        let _ = serde_json::to_writer(&mut *out, socket);
    }
    if let Some(code) = tail.grpc_status {
        out.extend_from_slice(b",\"grpc_status\":");
        number(out, code);
    }
    if tail.repeated > 0 {
        out.extend_from_slice(b",\"repeated\":");
        number(out, tail.repeated);
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

/// A duration as the log writes it: whole microseconds, shown as milliseconds.
#[derive(Debug, Clone, Copy)]
struct Millis(u64);

impl Millis {
    /// `d` to the nearest microsecond.
    fn of(d: Duration) -> Millis {
        let micros = u64::from(d.subsec_nanos() + 500) / 1000;
        Millis(d.as_secs().saturating_mul(1_000_000).saturating_add(micros))
    }

    fn as_f64(self) -> f64 {
        self.0 as f64 / 1e3
    }
}

impl Serialize for Millis {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_f64(self.as_f64())
    }
}

/// Milliseconds as serde_json writes their `f64` (its shortest form that reads back
/// the same), written with integers: below 10^15 µs (31 years) the decimal of a
/// whole number of microseconds, with at most three digits after the point and its
/// trailing zeros dropped (`0.282`, `12.5`, `3.0`), has at most 15 significant
/// digits, so no shorter one reads back as the same double. Beyond, serde_json
/// writes it.
fn milliseconds(out: &mut Vec<u8>, ms: Millis) {
    let micros = ms.0;
    if micros >= 1_000_000_000_000_000 {
        let _ = serde_json::to_writer(&mut *out, &ms.as_f64());
        return;
    }
    // Written from the right into a buffer copied out whole: a duration is mostly a
    // digit or three before the point, fewer steps than itoa's and a push a digit.
    let mut text = [0u8; 20];
    let mut at = text.len();
    let digit = |n: u64| b'0' + (n % 10) as u8;
    let (mut fraction, places) = match micros % 1000 {
        f if f % 100 == 0 => (f / 100, 1),
        f if f % 10 == 0 => (f / 10, 2),
        f => (f, 3),
    };
    for _ in 0..places {
        at -= 1;
        text[at] = digit(fraction);
        fraction /= 10;
    }
    at -= 1;
    text[at] = b'.';
    let mut whole = micros / 1000;
    loop {
        at -= 1;
        text[at] = digit(whole);
        whole /= 10;
        if whole == 0 {
            break;
        }
    }
    out.extend_from_slice(&text[at..]);
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

/// The address as a JSON string's contents: an IPv4 one digit by digit, an IPv6
/// one as `Display` writes it (neither needs escaping).
fn address(out: &mut Vec<u8>, client: IpAddr) {
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
}

/// `value` as a JSON string.
fn string(out: &mut Vec<u8>, value: &str) {
    out.push(b'"');
    contents(out, value);
    out.push(b'"');
}

/// `value` as the contents of a JSON string, between quotes the caller writes:
/// copied as it is when nothing in it needs an escape, else escaped by serde_json.
fn contents(out: &mut Vec<u8>, value: &str) {
    match needs_escape(value.as_bytes()) {
        false => out.extend_from_slice(value.as_bytes()),
        true => escaped(out, value),
    }
}

/// `name` as the contents of a JSON string: copied as it is when known plain.
fn name(out: &mut Vec<u8>, name: Name) {
    debug_assert!(!name.plain || !needs_escape(name.text.as_bytes()));
    match name.plain {
        true => out.extend_from_slice(name.text.as_bytes()),
        false => contents(out, name.text),
    }
}

/// `value` escaped by serde_json, without the quotes it writes around it (the
/// caller writes its own): out of the way of the strings that need nothing, as
/// nearly every one.
#[cold]
#[inline(never)]
fn escaped(out: &mut Vec<u8>, value: &str) {
    let start = out.len();
    let _ = serde_json::to_writer(&mut *out, value);
    out.pop();
    out.remove(start);
}

/// Whether `text` holds no character JSON must escape.
pub(crate) fn json_plain(text: &str) -> bool {
    !needs_escape(text.as_bytes())
}

/// Whether `bytes` hold one JSON must escape (a control character, `"` or `\`).
/// Eight bytes at a time in a word, the last eight overlapping the ones before
/// (a string of a line is short: a loop of the compiler's vector code went byte by
/// byte on all but 16 or 32 of its bytes, about 50 instructions a string); a
/// string under eight bytes byte by byte.
fn needs_escape(bytes: &[u8]) -> bool {
    let len = bytes.len();
    if len < 8 {
        return bytes.iter().any(|&b| b < 0x20 || b == b'"' || b == b'\\');
    }
    let mut flagged = 0;
    let mut at = 0;
    while at + 8 <= len {
        flagged |= escapes(word(bytes, at));
        at += 8;
    }
    if at < len {
        flagged |= escapes(word(bytes, len - 8));
    }
    flagged != 0
}

/// The eight bytes of `bytes` from `at`, as one word.
fn word(bytes: &[u8], at: usize) -> u64 {
    let eight: [u8; 8] = bytes[at..at + 8].try_into().expect("a slice of eight");
    u64::from_le_bytes(eight)
}

/// The high bit of each byte of `x` (eight bytes) that JSON must escape, and
/// perhaps of bytes above one that must (a borrow); none when none must.
fn escapes(x: u64) -> u64 {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = ONES * 0x80;
    let below = |x: u64, n: u64| x.wrapping_sub(ONES * n) & !x & HIGHS;
    below(x, 0x20)
        | below(x ^ (ONES * u64::from(b'"')), 1)
        | below(x ^ (ONES * u64::from(b'\\')), 1)
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
    let (head, tail) = (&line.head, &line.tail);
    let dash = |v: Option<String>| v.unwrap_or_else(|| "-".to_string());
    let violated = match head.violated.is_empty() {
        true => "-".to_string(),
        false => Field(&head.violated.join(",")).to_string(),
    };
    let _ = write!(
        out,
        "{} {} \"{} {}\" {} {} {:.3} id={} consumer={} plan={} route={} outcome={} \
         violated={violated} upstream={} upstream_status={} upstream_ms={}",
        line.time,
        head.client,
        Field(head.method),
        head.path.escape_debug(),
        head.status,
        tail.bytes,
        tail.duration_ms.as_f64(),
        Field(head.request_id),
        Field(head.consumer.text),
        Field(head.plan.text),
        Field(head.route.text),
        head.outcome,
        Field(head.upstream.unwrap_or("-")),
        dash(head.upstream_status.map(|s| s.to_string())),
        dash(tail.upstream_ms.map(|ms| format!("{:.3}", ms.as_f64()))),
    );
    if !head.would_refuse.is_empty() {
        let _ = write!(out, " would_refuse={}", Field(&head.would_refuse.join(",")));
    }
    if let Some(via) = tail.via {
        let _ = write!(out, " via={via}");
    }
    if let Some(s) = &tail.websocket {
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
    if let Some(code) = tail.grpc_status {
        let _ = write!(out, " grpc_status={code}");
    }
    if tail.repeated > 0 {
        let _ = write!(out, " repeated={}", tail.repeated);
    }
}

#[cfg(test)]
mod tests;
