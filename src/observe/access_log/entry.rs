//! One request's line while the request is served: what is learnt of it as it goes
//! ([`Labels`]), and the [`Entry`] that writes the line when the answer's last byte is
//! sent, or as a 499 when the client goes away first.
//!
//! The labels feed the metrics too (route and plan), so they are kept whether the log
//! is on or off; what only the log needs (client, path, upstream time) is kept only
//! while it is on, so a gateway with the log off copies no path.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Method, Request, Response, Uri};

use super::line::{Head, Tail, consumer_name, plan_name, route_name};
use super::{AccessLog, Names, Path, Record, SocketRecord};
use crate::clock::Stopwatch;
use crate::config::{AccessLogFormat, ConsumerId, PlanId, RefusedLog, RouteId};
use crate::http::body::Body;
use crate::http::refusal::{OUTCOMES, Outcome, Refusal};

/// The limits a shadow policy would have refused a request by: window names
/// (`minute`, `total-minute`) and `concurrency`. Boxed, as the record has it: empty,
/// as for nearly every request, it allocates nothing.
pub(crate) type WouldRefuse = Box<[&'static str]>;

/// `host:port` of an upstream target, shared with its pool.
type Origin = Arc<str>;

/// Bytes of an RLS call's domain the log keeps: a domain names a rule file, and a
/// longer one (the message may be megabytes) would only bloat its line.
const DOMAIN_BYTES: usize = 256;

/// What the metrics and the access log say of a request, learnt as it is served.
#[derive(Debug, Default)]
pub(crate) struct Labels {
    /// Index of the route that matched.
    pub route: Option<RouteId>,
    /// The caller's plan, once identified.
    pub plan: Option<PlanId>,
    /// The rest is kept only while the access log is on.
    log: bool,
    client: Option<IpAddr>,
    consumer: Option<ConsumerId>,
    /// The name a trusted auth layer gave a caller the config does not list.
    named: Option<Box<str>>,
    /// The request's target as sent, whose path is logged unless normalising
    /// changed it (`path`) or the request was refused before.
    sent: Option<Uri>,
    /// The normalised path, when it differs from the one sent.
    path: Option<String>,
    upstream_secs: Option<f64>,
    /// The upstream target that answered, and its status.
    answered_by: Option<(Origin, u16)>,
    would_refuse: WouldRefuse,
    /// The decision listener's door the request came through.
    via: Option<&'static str>,
    /// An RLS call's domain, logged as its route.
    domain: Option<Box<str>>,
}

impl Labels {
    /// The request came through the decision listener's door `via` (`rls`,
    /// `forward-auth`).
    pub(crate) fn via(&mut self, via: &'static str) {
        self.via = Some(via);
    }

    /// The domain of an RLS call, logged as its route: at most [`DOMAIN_BYTES`] of
    /// it, as the caller sent it (escaped as every field is); an empty one leaves
    /// the route `none`.
    pub(crate) fn domain(&mut self, domain: &str) {
        if self.log && !domain.is_empty() {
            let mut end = domain.len().min(DOMAIN_BYTES);
            while !domain.is_char_boundary(end) {
                end -= 1;
            }
            self.domain = Some(Box::from(&domain[..end]));
        }
    }

    /// The client IP (after trusted proxies) and the normalised path.
    pub(crate) fn client_and_path(&mut self, client: IpAddr, path: &str) {
        if self.log {
            self.client = Some(client);
            if self.sent.as_ref().map(Uri::path) != Some(path) {
                self.path = Some(path.to_string());
            }
        }
    }

    /// The client IP (after trusted proxies) of a request refused before admission.
    pub(crate) fn client(&mut self, client: IpAddr) {
        if self.log {
            self.client = Some(client);
        }
    }

    /// Who the caller turned out to be: its plan, the configured consumer it is (if
    /// it is one), and `named`: the name an auth layer gave it.
    pub(crate) fn caller(
        &mut self,
        plan: PlanId,
        consumer: Option<ConsumerId>,
        named: Option<&str>,
    ) {
        self.plan = Some(plan);
        self.consumer = consumer;
        if self.log {
            self.named = named.map(Box::from);
        }
    }

    /// What a shadow policy would have refused the request by.
    pub(crate) fn would_refuse(&mut self, limits: WouldRefuse) {
        if self.log {
            self.would_refuse = limits;
        }
    }

    /// How long the upstream took to answer, and its `response` if it did: kept
    /// before anything else is awaited, so that a client that goes away after the
    /// upstream answered (while a refund is settled, say) is logged with it.
    pub(crate) fn upstream(&mut self, secs: f64, response: Option<&Response<Body>>) {
        if self.log {
            self.upstream_secs = Some(secs);
            self.answered_by = response.and_then(|response| {
                let origin = response.body().origin()?;
                Some((Arc::clone(origin), response.status().as_u16()))
            });
        }
    }
}

/// What the line needs of a request before it is answered.
struct Logged {
    format: AccessLogFormat,
    summarised: bool,
    arrived_ms: u64,
    method: Method,
}

/// What a response says of a gRPC call's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GrpcStatus {
    /// Not a gRPC call.
    None,
    /// In the response head (a trailers-only answer).
    Known(u8),
    /// In the trailers, at the body's end.
    AtEnd,
}

impl GrpcStatus {
    /// The status once the body ended as `end` says: one that ended without a status
    /// is what a client makes of it, UNKNOWN, or CANCELLED when it was cut.
    pub(crate) fn of(self, end: crate::http::body::End) -> Option<u8> {
        use crate::http::grpc::{CANCELLED, UNKNOWN};
        match self {
            GrpcStatus::None => None,
            GrpcStatus::Known(code) => Some(code),
            GrpcStatus::AtEnd => Some(end.grpc_status.unwrap_or(match end.complete {
                true => UNKNOWN,
                false => CANCELLED,
            })),
        }
    }
}

/// A request's line while it is served. Dropped with its request unanswered (the
/// client went away and hyper dropped the request's future), it logs a 499.
pub(crate) struct Entry<'a, N: Names + 'static> {
    pub labels: Labels,
    logged: Option<Logged>,
    /// What a refusal said of the request: the limits that refused it, and the
    /// upstream target that failed.
    refused: Option<(Box<[&'static str]>, Option<Origin>)>,
    request_id: HeaderValue,
    started: Stopwatch,
    /// The config snapshot the request is served with, which names what the record
    /// holds indexes of.
    names: &'a Arc<N>,
    log: &'a AccessLog,
}

impl<'a, N: Names + 'static> Entry<'a, N> {
    /// The entry of `request`, which came from `peer` at `arrived_ms` (read only when
    /// the log is on) and is known by `request_id`; the log's `format` is the
    /// snapshot's, and so is how it logs refusals (`refused`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn open<B>(
        log: &'a AccessLog,
        names: &'a Arc<N>,
        format: AccessLogFormat,
        refused: RefusedLog,
        request: &Request<B>,
        peer: IpAddr,
        request_id: HeaderValue,
        arrived_ms: impl FnOnce() -> u64,
    ) -> Entry<'a, N> {
        let started = Stopwatch::start();
        let on = format != AccessLogFormat::Off;
        let logged = on.then(|| Logged {
            format,
            summarised: refused == RefusedLog::Summary,
            arrived_ms: arrived_ms(),
            method: request.method().clone(),
        });
        Entry {
            labels: Labels {
                log: on,
                client: on.then_some(peer),
                sent: on.then(|| request.uri().clone()),
                ..Labels::default()
            },
            logged,
            refused: None,
            request_id,
            started,
            names,
            log,
        }
    }

    /// The request's id, sent upstream with it and back to the client.
    pub(crate) fn request_id(&self) -> &HeaderValue {
        &self.request_id
    }

    /// Seconds since the request arrived.
    pub(crate) fn elapsed_secs(&self) -> f64 {
        self.started.elapsed_secs()
    }

    /// The request was refused with `refusal`, which is about to become its answer.
    pub(crate) fn refused(&mut self, refusal: &Refusal) {
        if self.logged.is_some() {
            let target = refusal.target().map(Arc::from);
            let violated = refusal.violated().into_vec().into_boxed_slice();
            self.refused = Some((violated, target));
        }
    }

    /// The request was refused by the windows named `violated` without a
    /// [`Refusal`] of its own: an RLS call answered `OVER_LIMIT`.
    pub(crate) fn violated(&mut self, violated: &[&'static str]) {
        if self.logged.is_some() && !violated.is_empty() {
            self.refused = Some((violated.into(), None));
        }
    }

    /// The request is answered with `response`, which carries its id: its line is
    /// written when the response's last byte is sent.
    /// Once answered, the entry logs nothing when dropped.
    /// A gRPC call's `grpc` status is known now (a trailers-only answer), or read
    /// from the trailers as they go out.
    pub(crate) fn answered(
        &mut self,
        response: &mut Response<Body>,
        outcome: Outcome,
        grpc: GrpcStatus,
    ) {
        let status = response.status().as_u16();
        self.decided(response, status, outcome, grpc);
    }

    /// As [`Entry::answered`], the line saying `status` rather than the
    /// response's: an RLS call is always answered 200, and its line says what its
    /// decision means to the proxy's client (429 for `OVER_LIMIT`).
    pub(crate) fn decided(
        &mut self,
        response: &mut Response<Body>,
        status: u16,
        outcome: Outcome,
        grpc: GrpcStatus,
    ) {
        let Some(logged) = self.logged.take() else {
            return;
        };
        let (violated, failed_target) = self.refused.take().unwrap_or_default();
        let (access_log, started) = (self.log.clone(), self.started);
        if AccessLog::in_halves(logged.format, logged.summarised, outcome) {
            let line = self.head(&logged, status, outcome, &violated, failed_target);
            let upstream = self.labels.upstream_secs.map(secs_to_duration);
            let via = self.labels.via;
            response.body_mut().on_end(move |end| {
                let took = started.elapsed();
                let tail = Tail::answered(took, upstream, end.bytes, via, grpc.of(end));
                access_log.end(line, &tail);
            });
            return;
        }
        let record = self.answered_record(logged, status, outcome, violated, failed_target);
        // `duration` and `bytes` are set when the body's last byte is sent.
        response.body_mut().on_end(move |end| {
            let mut record = record;
            record.duration = started.elapsed();
            record.bytes = end.bytes;
            record.grpc_status = grpc.of(end);
            access_log.log(record);
        });
    }

    /// The record of a request answered `status` with `outcome`, refused by the
    /// limits `violated` or failed by the upstream target `failed` (if it was), as
    /// far as it is known at the answer: the line [`Entry::head`] formats in halves.
    fn answered_record(
        &mut self,
        logged: Logged,
        status: u16,
        outcome: Outcome,
        violated: Box<[&'static str]>,
        failed: Option<Origin>,
    ) -> Box<Record> {
        let mut record = self.record(logged, Duration::ZERO);
        record.status = status;
        record.outcome = outcome;
        record.violated = violated;
        if record.upstream.is_none() {
            record.upstream = failed;
        }
        record
    }

    /// The head of the line of a request answered `status` with `outcome`, refused
    /// by the limits `violated` or failed by the upstream target `failed` (if it was
    /// refused or failed), formatted now ([`AccessLog::begin`]).
    fn head(
        &self,
        logged: &Logged,
        status: u16,
        outcome: Outcome,
        violated: &[&'static str],
        failed: Option<Origin>,
    ) -> Vec<u8> {
        let labels = &self.labels;
        let names: &dyn Names = &**self.names;
        let (upstream, upstream_status) = match &labels.answered_by {
            Some((origin, status)) => (Some(&**origin), Some(*status)),
            None => (failed.as_deref(), None),
        };
        let path = match (&labels.path, &labels.sent) {
            (Some(path), _) => path.as_str(),
            (None, Some(sent)) => sent.path(),
            (None, None) => "",
        };
        let head = Head {
            request_id: self.request_id.to_str().unwrap_or("-"),
            client: labels
                .client
                .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED.into())
                .to_canonical(),
            consumer: consumer_name(names, labels.named.as_deref(), labels.consumer),
            plan: plan_name(names, labels.plan),
            route: route_name(names, labels.domain.as_deref(), labels.route),
            method: logged.method.as_str(),
            path,
            status,
            outcome: OUTCOMES[outcome as usize],
            violated,
            would_refuse: &labels.would_refuse,
            upstream,
            upstream_status,
        };
        AccessLog::begin(logged.arrived_ms, &head)
    }

    /// The line as far as it is known: the caller, route and path from the labels, and
    /// a 499 of a client that went away after `duration`, which an answered request
    /// overwrites with what it was answered. Made in its box, which it travels in.
    fn record(&mut self, logged: Logged, duration: Duration) -> Box<Record> {
        let labels = &mut self.labels;
        let (upstream, upstream_status) = match labels.answered_by.take() {
            Some((origin, status)) => (Some(origin), Some(status)),
            None => (None, None),
        };
        Box::new(Record {
            names: Arc::clone(self.names) as Arc<dyn Names>,
            format: logged.format,
            summarised: logged.summarised,
            time_ms: logged.arrived_ms,
            // The request is done with its id: it is logged last.
            request_id: std::mem::replace(&mut self.request_id, HeaderValue::from_static("")),
            client: labels
                .client
                .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED.into()),
            consumer: labels.consumer,
            named: labels.named.take(),
            plan: labels.plan,
            route: labels.route,
            domain: labels.domain.take(),
            method: logged.method,
            path: match (labels.path.take(), labels.sent.take()) {
                (Some(path), _) => Path::Normalised(path),
                (None, Some(sent)) => Path::Sent(sent),
                (None, None) => Path::Normalised(String::new()),
            },
            status: 499,
            outcome: Outcome::ClientClosed,
            violated: Box::default(),
            would_refuse: std::mem::take(&mut labels.would_refuse),
            upstream,
            upstream_status,
            upstream_duration: labels.upstream_secs.map(secs_to_duration),
            duration,
            bytes: 0,
            via: labels.via,
            grpc_status: None,
            socket: None,
        })
    }

    /// The request is answered with `response`, a `101` that opened a WebSocket:
    /// its line is written when the socket closes ([`SocketLine::close`]), with
    /// what the socket carried. Once answered, the entry logs nothing when dropped.
    pub(crate) fn switched(&mut self, response: &Response<Body>) -> Option<SocketLine> {
        let logged = self.logged.take()?;
        let mut record = self.record(logged, Duration::ZERO);
        record.status = response.status().as_u16();
        record.outcome = Outcome::Allowed;
        Some(SocketLine {
            record,
            log: self.log.clone(),
            started: self.started,
        })
    }
}

/// A WebSocket's line, written when it closes.
#[derive(Debug)]
pub(crate) struct SocketLine {
    record: Box<Record>,
    log: AccessLog,
    started: Stopwatch,
}

impl SocketLine {
    /// Writes the line: the socket's life from the upgrade's head, and `socket`.
    pub(crate) fn close(mut self, socket: SocketRecord) {
        self.record.duration = self.started.elapsed();
        self.record.bytes = socket.bytes_down;
        self.record.socket = Some(socket);
        self.log.log(self.record);
    }
}

impl<N: Names + 'static> Drop for Entry<'_, N> {
    fn drop(&mut self) {
        if let Some(logged) = self.logged.take() {
            let took = self.started.elapsed();
            let record = self.record(logged, took);
            self.log.log(record);
        }
    }
}

/// `secs` (a measured time, never negative) as a [`Duration`] of whole nanoseconds:
/// a multiplication, where `Duration::from_secs_f64`'s exact rounding took about 45
/// instructions a call; the log writes microseconds.
fn secs_to_duration(secs: f64) -> Duration {
    Duration::from_nanos((secs * 1e9) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::access_log::line::{Stamp, format, json_tail};
    use prometheus::IntCounter;

    #[derive(Debug)]
    struct Config;

    impl Names for Config {
        fn consumer_name(&self, _: ConsumerId) -> &str {
            "acme"
        }
        fn plan_name(&self, _: PlanId) -> &str {
            "registered"
        }
        fn route_name(&self, _: RouteId) -> &str {
            "orders \"v2\""
        }
    }

    /// What a test request learnt before its answer.
    #[derive(Default)]
    struct Learnt {
        normalised: Option<&'static str>,
        client: bool,
        caller: Option<(Option<ConsumerId>, Option<&'static str>)>,
        route: Option<RouteId>,
        domain: Option<&'static str>,
        answered_by: Option<u16>,
        upstream_secs: Option<f64>,
        would_refuse: &'static [&'static str],
        violated: &'static [&'static str],
        failed: bool,
        via: Option<&'static str>,
    }

    /// The entry of a request on `log` that learnt what `learnt` says.
    fn entry<'a>(log: &'a AccessLog, names: &'a Arc<Config>, learnt: &Learnt) -> Entry<'a, Config> {
        let request = Request::get("/orders//7?key=secret").body(()).unwrap();
        let mut entry = Entry::open(
            log,
            names,
            AccessLogFormat::Json,
            RefusedLog::All,
            &request,
            [203, 0, 113, 9].into(),
            HeaderValue::from_static("3f2b8c1e"),
            || 1_795_867_199_123,
        );
        let labels = &mut entry.labels;
        if !learnt.client {
            labels.client = None;
        }
        if let Some(path) = learnt.normalised {
            labels.client_and_path([10, 0, 0, 1].into(), path);
        }
        if let Some((consumer, named)) = learnt.caller {
            labels.caller(PlanId(1), consumer, named);
        }
        labels.route = learnt.route;
        if let Some(domain) = learnt.domain {
            labels.domain(domain);
        }
        labels.answered_by = (learnt.answered_by).map(|s| (Arc::from("10.0.0.5:8080"), s));
        labels.upstream_secs = learnt.upstream_secs;
        labels.would_refuse(learnt.would_refuse.into());
        if let Some(via) = learnt.via {
            labels.via(via);
        }
        let failed = learnt.failed.then(|| Arc::from("10.0.0.6:8080"));
        entry.refused = Some((learnt.violated.into(), failed));
        entry
    }

    /// How the test's requests end: after 4.321 ms, 512 bytes, gRPC status 8.
    const TOOK: Duration = Duration::from_micros(4_321);
    const BYTES: u64 = 512;
    const GRPC: Option<u8> = Some(8);

    /// `entry`'s line answered 429, formatted in halves.
    fn in_halves(mut entry: Entry<'_, Config>) -> String {
        let logged = entry.logged.take().unwrap();
        let (violated, failed) = entry.refused.take().unwrap();
        let mut line = entry.head(&logged, 429, Outcome::Limited, &violated, failed);
        let upstream = entry.labels.upstream_secs.map(secs_to_duration);
        let tail = Tail::answered(TOOK, upstream, BYTES, entry.labels.via, GRPC);
        json_tail(&tail, &mut line);
        line.push(b'\n');
        String::from_utf8(line).unwrap()
    }

    /// `entry`'s line answered 429, formatted from its record.
    fn of_record(mut entry: Entry<'_, Config>) -> String {
        let logged = entry.logged.take().unwrap();
        let (violated, failed) = entry.refused.take().unwrap();
        let mut record = entry.answered_record(logged, 429, Outcome::Limited, violated, failed);
        record.duration = TOOK;
        record.bytes = BYTES;
        record.grpc_status = GRPC;
        let mut line = Vec::new();
        format(&record, 0, &mut Stamp::default(), &mut line);
        String::from_utf8(line).unwrap()
    }

    /// A JSON line formatted in halves is the line of the record the same request
    /// makes, byte for byte, whatever it learnt: each field is taken from the labels
    /// twice (`Entry::head`, `Entry::record`), and this holds the two together.
    #[test]
    fn a_line_in_halves_is_the_line_of_the_record() {
        let counter = |name| IntCounter::new(name, name).unwrap();
        let log = AccessLog::start(std::io::sink(), counter("d"), counter("s"));
        let names = Arc::new(Config);
        let cases = [
            Learnt::default(),
            Learnt {
                normalised: Some("/orders/7"),
                client: true,
                caller: Some((Some(ConsumerId::new(3)), None)),
                route: Some(RouteId::new(0)),
                answered_by: Some(201),
                upstream_secs: Some(0.012_345),
                ..Learnt::default()
            },
            Learnt {
                client: true,
                caller: Some((None, Some("team \"a\"\tb"))),
                route: Some(RouteId::new(0)),
                upstream_secs: Some(2.5),
                violated: &["minute", "total-hour"],
                would_refuse: &["second"],
                failed: true,
                ..Learnt::default()
            },
            Learnt {
                normalised: Some("/caf\u{e9}/\u{1}"),
                domain: Some("edge\nproxy"),
                via: Some("rls"),
                answered_by: Some(200),
                failed: true,
                ..Learnt::default()
            },
        ];
        for (i, learnt) in cases.iter().enumerate() {
            let halves = in_halves(entry(&log, &names, learnt));
            let whole = of_record(entry(&log, &names, learnt));
            assert_eq!(halves, whole, "case {i}");
        }
    }
}
