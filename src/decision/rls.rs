//! Envoy's rate limit service (`envoy.service.ratelimit.v3`): a `RateLimitRequest`
//! read into admission's descriptors, and admission's answer written back as a
//! `RateLimitResponse`.
//!
//! What the request may hold is checked before anything is counted: at most
//! `max_descriptors` descriptors, each at most 8 KiB of keys and values, with at
//! least one entry, no control characters and a known unit in a limit override;
//! else `INVALID_ARGUMENT` (a message larger than all of that together:
//! `RESOURCE_EXHAUSTED`, as is a request whose `limit` overrides need a new counter
//! scope beyond `max_overrides`). `hits_addend` is read as Envoy and the reference service
//! read it: the request's 0 means 1 (the wire cannot tell it from unset); a
//! descriptor's own, a wrapper, overrides it, and its explicit 0 looks without
//! counting. `is_negative_hits` (envoy-types' v3 `RateLimitDescriptor` carries it,
//! field 4) gives the descriptor's hits back: admission takes them off the newest
//! counts, never below zero, and only if the whole request admits.
//!
//! Every call is one access-log line (`"via": "rls"`), its domain as the route and
//! the peer as the client; refusals are summarised like any (`[log] refused`).

use std::net::IpAddr;
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::HeaderValue as EnvoyHeader;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code as RlsCode, DescriptorStatus, RateLimit, rate_limit::Unit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use prost::Message;
use smallvec::SmallVec;

use super::grpc::{self, Code};
use crate::admission::{Descriptor, Descriptors, Stated, Status};
use crate::gateway::Gateway;
use crate::http::body::Body;
use crate::http::rate_headers::{POLICY_HEADER, STATE_HEADER, ceil_secs};
use crate::http::refusal::{OUTCOMES, Outcome};
use crate::limit::Window;
use crate::observe::access_log::{Entry, GrpcStatus};
use crate::snapshot::Snapshot;

/// The one method served.
const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
/// Keys and values of one descriptor, at most.
const DESCRIPTOR_BYTES: usize = 8 * 1024;

/// Answers one gRPC call from `peer`, and logs it: `"via": "rls"`, the domain as
/// its route, and as its status what the answer means to the proxy's client (200
/// for `OK`, 429 for `OVER_LIMIT`, whatever refused it: the outcome says what did);
/// a call refused before it is decided, with its gRPC code's HTTP status.
pub(super) async fn serve(
    gateway: &Gateway,
    snapshot: &Arc<Snapshot>,
    request: Request<Incoming>,
    peer: IpAddr,
) -> Response<Body> {
    let mut entry = gateway.entry(snapshot, &request, peer);
    entry.labels.via("rls");
    let (mut response, outcome) = answer(gateway, snapshot, request, &mut entry).await;
    let status = match outcome {
        Outcome::Allowed => StatusCode::OK,
        Outcome::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Outcome::BadRequest => StatusCode::BAD_REQUEST,
        Outcome::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        Outcome::NoRoute => StatusCode::NOT_FOUND,
        _ => StatusCode::TOO_MANY_REQUESTS,
    };
    // A trailers-only answer states its code in the head; a message, in its trailers.
    let code =
        (response.headers().get(crate::http::grpc::STATUS)).and_then(crate::http::grpc::code_of);
    let grpc = code.map_or(GrpcStatus::AtEnd, GrpcStatus::Known);
    entry.decided(&mut response, status.as_u16(), outcome, grpc);
    response
}

/// The answer to one call, and what it counts as; the domain and the windows that
/// refused it go to its log `entry`.
async fn answer(
    gateway: &Gateway,
    snapshot: &Snapshot,
    request: Request<Incoming>,
    entry: &mut Entry<'_, Snapshot>,
) -> (Response<Body>, Outcome) {
    let metrics = gateway.metrics();
    let refused = |code: Code, reason: &str| {
        let outcome = match code {
            Code::ResourceExhausted => Outcome::TooLarge,
            Code::Unavailable => Outcome::Unavailable,
            Code::Unimplemented => Outcome::NoRoute,
            _ => Outcome::BadRequest,
        };
        let label = OUTCOMES[outcome as usize];
        metrics.decisions.with_label_values(&["rls", label]).inc();
        (grpc::status(code, reason), outcome)
    };
    if request.uri().path() != SHOULD_RATE_LIMIT {
        let reason = format!("unknown method {}", request.uri().path());
        return refused(Code::Unimplemented, &reason);
    }
    // The listener looked at this snapshot's section before it came here.
    let Some(decision) = snapshot.decision() else {
        return refused(Code::Unavailable, "[decision] is not configured");
    };
    let max = decision.max_descriptors;
    // Room for `max` full descriptors and their framing: anything larger cannot be
    // a request that is going to be answered.
    let limit = max * (DESCRIPTOR_BYTES + 64) + 1024;
    let bytes = match grpc::read_message(request, limit).await {
        Ok(bytes) => bytes,
        Err((code, reason)) => return refused(code, &reason),
    };
    let asked = match RateLimitRequest::decode(bytes) {
        Ok(asked) => asked,
        Err(err) => return refused(Code::InvalidArgument, &format!("malformed request: {err}")),
    };
    entry.labels.domain(&asked.domain);
    let descriptors = match read(&asked, max) {
        Ok(descriptors) => descriptors,
        Err(reason) => return refused(Code::InvalidArgument, &reason),
    };
    let admission = gateway.admission();
    let max_overrides = decision.max_overrides;
    let answered = admission.descriptors(snapshot, &asked.domain, &descriptors, max_overrides);
    let answered = match answered.await {
        Ok(answered) => answered,
        Err(overflow) => return refused(Code::ResourceExhausted, &overflow.to_string()),
    };
    count(gateway, &answered);
    entry.violated(&violated(&answered.statuses));
    let outcome = answered.outcome;
    if outcome == Outcome::Unavailable {
        let reason = "the rate limit store is unavailable";
        return (grpc::status(Code::Unavailable, reason), outcome);
    }
    let response = grpc::message(&response(answered, decision.rate_headers));
    (response, outcome)
}

/// The metrics of a decided call: its descriptors by rule and code, the rules'
/// own outcomes, and the call's.
fn count(gateway: &Gateway, answered: &Descriptors) {
    let metrics = gateway.metrics();
    for status in &answered.statuses {
        let (rule, code) = (&status.metric.0, status.metric.1);
        metrics
            .rls_descriptors
            .with_label_values(&[rule.as_str(), code])
            .inc();
        if rule != "none" {
            let outcome = match (status.over, answered.outcome) {
                (true, Outcome::Allowed) => Outcome::Limited,
                (true, refused) => refused,
                (false, _) => Outcome::Allowed,
            };
            metrics.count_rule(rule, outcome);
        }
    }
    let outcome = OUTCOMES[answered.outcome as usize];
    metrics.decisions.with_label_values(&["rls", outcome]).inc();
}

/// The windows of the descriptors over their limits, each named once, in the
/// request's order (the log's `violated`, as an HTTP refusal's).
fn violated(statuses: &[Status]) -> SmallVec<[&'static str; 8]> {
    let mut names = SmallVec::new();
    for status in statuses.iter().filter(|s| s.over) {
        if let Some(stated) = &status.limit {
            let name = stated.window.name();
            if !names.contains(&name) {
                names.push(name);
            }
        }
    }
    names
}

/// The request's descriptors as admission reads them, or why they cannot be.
fn read(asked: &RateLimitRequest, max: usize) -> Result<Vec<Descriptor<'_>>, String> {
    if asked.domain.is_empty() {
        return Err("the domain must not be empty".into());
    }
    if asked.descriptors.is_empty() {
        return Err("the request has no descriptors".into());
    }
    if asked.descriptors.len() > max {
        return Err(format!(
            "{} descriptors: at most {max} (decision.max_descriptors)",
            asked.descriptors.len()
        ));
    }
    let hits = asked.hits_addend.max(1);
    (asked.descriptors.iter().enumerate())
        .map(|(i, d)| descriptor(d, hits).map_err(|reason| format!("descriptor {i}: {reason}")))
        .collect()
}

fn descriptor(raw: &RateLimitDescriptor, hits: u32) -> Result<Descriptor<'_>, String> {
    if raw.entries.is_empty() {
        return Err("no entries".into());
    }
    let size: usize = (raw.entries.iter())
        .map(|e| e.key.len() + e.value.len())
        .sum();
    if size > DESCRIPTOR_BYTES {
        return Err(format!(
            "{size} bytes of keys and values: at most {DESCRIPTOR_BYTES}"
        ));
    }
    let text = |e: &str| !e.bytes().any(|b| (b < 0x20 && b != b'\t') || b == 0x7f);
    if raw
        .entries
        .iter()
        .any(|e| e.key.is_empty() || !text(&e.key) || !text(&e.value))
    {
        return Err("an empty key, or a control character in a key or value".into());
    }
    let hits = match raw.hits_addend {
        Some(own) => u32::try_from(own.value).map_err(|_| "hits_addend is too large")?,
        None => hits,
    };
    let limit = match &raw.limit {
        None => None,
        Some(limit) => Some((limit.requests_per_unit, window(limit.unit)?)),
    };
    Ok(Descriptor {
        entries: (raw.entries.iter())
            .map(|e| (e.key.as_str(), e.value.as_str()))
            .collect(),
        hits,
        limit,
        negative: raw.is_negative_hits,
    })
}

/// The window of an override's unit.
fn window(unit: i32) -> Result<Window, String> {
    match Unit::try_from(unit) {
        Ok(Unit::Second) => Ok(Window::Second),
        Ok(Unit::Minute) => Ok(Window::Minute),
        Ok(Unit::Hour) => Ok(Window::Hour),
        Ok(Unit::Day) => Ok(Window::Day),
        Ok(Unit::Month) => Ok(Window::Month),
        Ok(Unit::Year) => Ok(Window::Year),
        Ok(other) => Err(format!(
            "limit unit {}: sluice counts second, minute, hour and day windows and \
             calendar months and years",
            other.as_str_name()
        )),
        Err(_) => Err(format!("unknown limit unit {unit}")),
    }
}

/// The unit of a window.
fn unit(window: Window) -> Unit {
    match window {
        Window::Second => Unit::Second,
        Window::Minute => Unit::Minute,
        Window::Hour => Unit::Hour,
        Window::Day => Unit::Day,
        Window::Month => Unit::Month,
        Window::Year => Unit::Year,
    }
}

/// Admission's answer as Envoy reads it.
fn response(answered: Descriptors, rate_headers: bool) -> RateLimitResponse {
    let over = answered.outcome != Outcome::Allowed;
    let code = |over: bool| match over {
        true => RlsCode::OverLimit as i32,
        false => RlsCode::Ok as i32,
    };
    let headers = match rate_headers {
        true => headers(&answered.statuses, over),
        false => Vec::new(),
    };
    RateLimitResponse {
        overall_code: code(over),
        statuses: (answered.statuses.iter())
            .map(|status| DescriptorStatus {
                code: code(status.over),
                current_limit: status.limit.as_ref().map(rate_limit),
                limit_remaining: status.remaining,
                duration_until_reset: (status.limit.is_some()).then(|| duration(status.reset_ms)),
                quota: None,
            })
            .collect(),
        response_headers_to_add: headers,
        ..RateLimitResponse::default()
    }
}

fn rate_limit(stated: &Stated) -> RateLimit {
    RateLimit {
        name: stated.name.clone(),
        requests_per_unit: stated.requests_per_unit,
        unit: unit(stated.window) as i32,
    }
}

fn duration(ms: u64) -> ProtoDuration {
    ProtoDuration {
        seconds: i64::try_from(ms / 1_000).unwrap_or(i64::MAX),
        nanos: ((ms % 1_000) * 1_000_000) as i32,
    }
}

/// The RateLimit headers of the descriptor that binds: the first refused, else the
/// one with the least left; and `Retry-After` when the request is refused.
fn headers(statuses: &[Status], over: bool) -> Vec<EnvoyHeader> {
    let limited = statuses.iter().filter(|s| s.limit.is_some());
    let binding = match over {
        true => statuses.iter().find(|s| s.over),
        false => limited.min_by_key(|s| s.remaining),
    };
    let Some(binding) = binding else {
        return Vec::new();
    };
    let names = [POLICY_HEADER.as_str(), STATE_HEADER.as_str()];
    let mut headers: Vec<EnvoyHeader> = (names.iter().zip(&binding.headers))
        .filter_map(|(name, value)| Some(header(name, value.as_ref()?.to_str().ok()?)))
        .collect();
    if over {
        let seconds = ceil_secs(binding.reset_ms).max(1).to_string();
        headers.push(header("retry-after", &seconds));
    }
    headers
}

fn header(key: &str, value: &str) -> EnvoyHeader {
    EnvoyHeader {
        key: key.to_string(),
        value: value.to_string(),
        ..EnvoyHeader::default()
    }
}
