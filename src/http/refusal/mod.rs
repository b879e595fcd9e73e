//! Every way sluice refuses a request, and the one place each becomes a response.
//!
//! Handlers return `Err(Refusal)`; [`Refusal::into_response`] turns it into an
//! `application/problem+json` body (RFC 9457) with the right status and headers.
//! Nothing else in the request path builds an error response. The errors of lower
//! layers become refusals here too, each in one `From`: a `ProxyError` is a 502,
//! 504, 413, 408 or 400.

use bytes::Bytes;
use http::header::{RETRY_AFTER, WWW_AUTHENTICATE};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use smallvec::SmallVec;

use crate::http::body::Body;
use crate::http::path::PathError;
use crate::http::rate_headers;
use crate::limit::Report;

mod grpc;
mod outcome;
mod problem;

pub(crate) use outcome::{OUTCOMES, Outcome};
use problem::{Problem, problem_body, problem_response};
pub(crate) use problem::{admin_problem, capacity_body};

const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";
const ABNORMAL_USAGE: &str =
    "https://iana.org/assignments/http-problem-types#abnormal-usage-detected";
const REDUCED_CAPACITY: &str =
    "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity";

/// What was too large in a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Oversize {
    /// The request target: 414.
    Uri,
    /// The head (request line and headers): 431.
    Headers,
    /// The body, declared or streamed: 413.
    Body,
}

/// What a 429 of a stacked route says: every limit of every policy in the headers,
/// the ones that refused by name.
#[derive(Debug)]
pub(crate) struct StackLimited {
    /// "per_month limit of 10000 for plan free in policy org on route api"
    pub detail: String,
    /// The refusing limits, named by policy and window (`"org-month"`).
    pub violated: SmallVec<[&'static str; 8]>,
    /// Until every refusing limit would admit the request.
    pub retry_ms: u64,
    /// `RateLimit-Policy` and `RateLimit` of every policy of the route.
    pub policy_header: Option<HeaderValue>,
    pub state_header: Option<HeaderValue>,
}

/// Why a request was not served normally.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Refusal {
    #[error("{0}")]
    BadPath(#[from] PathError),
    /// A request head that two parsers could read differently ([`crate::http::head`]).
    #[error("malformed request: {0}")]
    Malformed(&'static str),
    /// The client's body broke off or was not valid chunked framing.
    #[error("the request body is malformed or was cut off")]
    BadBody,
    /// The body paused longer than `body_timeout`, or came slower than `min_body_rate`.
    #[error("the request body arrived too slowly (server.body_timeout, server.min_body_rate)")]
    BodyTimeout,
    #[error("{}", match .0 {
        Oversize::Uri => "the request target is longer than server.max_uri_bytes",
        Oversize::Headers => "the request head is larger than server.max_header_bytes",
        Oversize::Body => "the request body is larger than server.max_body_bytes",
    })]
    TooLarge(Oversize),
    #[error("the API key is not valid")]
    UnknownKey,
    /// A bearer JWT that is bad, expired or cannot be verified (RFC 6750 invalid_token).
    #[error("the bearer token is not valid: {0}")]
    InvalidToken(&'static str),
    #[error("route {route} requires an API key")]
    KeyRequired { route: String },
    #[error("plan {plan} may not use route {route}")]
    PlanDenied { plan: String, route: String },
    /// The request lacks a part of its policy's limit key, and `on_missing = "deny"`.
    #[error("this route's rate limit needs {part} in the request")]
    LimitKeyMissing { part: String },
    /// A limit key part's value is longer than the gateway keys by.
    #[error("the value of {part} is longer than 256 bytes")]
    LimitKeyTooLong { part: String },
    /// A limit key part (a header, a query parameter) is sent more than once.
    #[error("{part} is sent more than once: which copy counts would depend on who reads it")]
    LimitKeyRepeated { part: String },
    #[error("requests from this address are not allowed")]
    Denied,
    /// The caller is banned (automatically, or by an operator) until `until_ms`.
    #[error("this caller is banned; Retry-After says for how long")]
    Banned { until_ms: u64, now_ms: u64 },
    #[error("no route matches this request")]
    NoRoute,
    /// A forward-auth request to a route whose policy caps concurrency: sluice would
    /// hold a slot until the response ends, which it never sees there.
    #[error(
        "route {route} caps concurrency (policy {policy}: max {max}), which forward auth \
         cannot hold: sluice never sees the response end; proxy the route through sluice"
    )]
    CapNotHere {
        route: String,
        policy: String,
        max: u32,
    },
    /// A browser's preflight for an origin, method or header the route's `cors`
    /// does not allow.
    #[error("{0}")]
    CorsDenied(&'static str),
    /// More preflights a second from one client IP than `preflight_limit` allows.
    #[error("too many preflight requests from this address; retry in a second")]
    PreflightLimited,
    #[error("{detail}")]
    Limited {
        detail: String,
        report: Box<Report>,
        policy_header: Option<HeaderValue>,
    },
    /// A limit of one of a stacked route's policies (`policy = ["org", "per_key"]`)
    /// refused the request; nothing was counted in any of them.
    #[error("{}", .0.detail)]
    StackLimited(Box<StackLimited>),
    /// The caller already has its `per_caller` requests in flight on the policy.
    #[error("{detail}")]
    Concurrent {
        detail: String,
        /// The rate limits' statuses (the request was admitted by them, then refunded).
        report: Box<Report>,
        policy_header: Option<HeaderValue>,
    },
    /// The policy's concurrency cap is full and its queue too, or the wait timed out.
    /// `body` is the route's problem, rendered once per snapshot ([`capacity_body`]).
    #[error("the route is at capacity; try again shortly")]
    Capacity {
        body: Bytes,
        retry_after: u64,
        timed_out: bool,
    },
    #[error("the rate limit store is unavailable; try again shortly")]
    StoreUnavailable,
    /// The request came on an HTTP/2 connection being closed for a flood of
    /// abandoned requests.
    #[error("this connection is closing after too many abandoned requests")]
    ConnectionClosing,
    /// The client, forwarded by a trusted proxy, flooded a connection with abandoned
    /// requests and is refused for `retry_after` seconds more.
    #[error(
        "requests from this client are refused for a while after a flood of abandoned requests"
    )]
    FloodBlocked { retry_after: u64 },
    /// `target` is the address tried last, for the access log (none if the request
    /// could not be addressed to any); `rate`: the admitted request's `RateLimit`
    /// headers, which sluice's own 502 or 504 carries as the upstream's answer would
    /// have (after a `refund_on` refund, the quota as it was before the request).
    #[error("upstream {upstream} could not be reached")]
    BadGateway {
        upstream: String,
        target: Option<String>,
        rate: Option<Box<HeaderMap>>,
    },
    /// A gRPC call on a route whose upstream speaks HTTP/1.1: never sent.
    #[error(
        "upstream {upstream} speaks HTTP/1.1; a gRPC call needs protocol = \"h2\" in [upstreams.{upstream}]"
    )]
    NeedsH2 { upstream: String },
    /// A gRPC call whose `grpc-timeout` is malformed.
    #[error("{0}")]
    BadGrpcTimeout(#[from] crate::http::grpc::BadTimeout),
    #[error("upstream {upstream} did not answer in time")]
    GatewayTimeout {
        upstream: String,
        target: Option<String>,
        rate: Option<Box<HeaderMap>>,
    },
}

/// What a refusal's answer says besides its status ([`Refusal::said`]).
struct Said {
    /// The problem type.
    kind: &'static str,
    detail: String,
    retry_after: Option<u64>,
    headers: [Option<(&'static HeaderName, HeaderValue)>; 2],
    /// The whole body, when it was rendered before (a full concurrency cap's).
    rendered: Option<Bytes>,
}

impl Refusal {
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            Refusal::BadPath(_)
            | Refusal::Malformed(_)
            | Refusal::BadBody
            | Refusal::LimitKeyTooLong { .. }
            | Refusal::LimitKeyRepeated { .. }
            | Refusal::CapNotHere { .. }
            | Refusal::BadGrpcTimeout(_) => StatusCode::BAD_REQUEST,
            Refusal::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            Refusal::TooLarge(Oversize::Uri) => StatusCode::URI_TOO_LONG,
            Refusal::TooLarge(Oversize::Headers) => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Refusal::TooLarge(Oversize::Body) => StatusCode::PAYLOAD_TOO_LARGE,
            Refusal::UnknownKey
            | Refusal::InvalidToken(_)
            | Refusal::KeyRequired { .. }
            | Refusal::PlanDenied { .. }
            | Refusal::LimitKeyMissing { .. } => StatusCode::UNAUTHORIZED,
            Refusal::Denied
            | Refusal::CorsDenied(_)
            | Refusal::Banned { .. }
            | Refusal::FloodBlocked { .. } => StatusCode::FORBIDDEN,
            Refusal::NoRoute => StatusCode::NOT_FOUND,
            Refusal::Limited { .. }
            | Refusal::StackLimited(_)
            | Refusal::Concurrent { .. }
            | Refusal::PreflightLimited => StatusCode::TOO_MANY_REQUESTS,
            Refusal::StoreUnavailable | Refusal::ConnectionClosing | Refusal::Capacity { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Refusal::BadGateway { .. } | Refusal::NeedsH2 { .. } => StatusCode::BAD_GATEWAY,
            Refusal::GatewayTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    /// The outcome label of `sluice_requests_total`.
    pub(crate) fn outcome(&self) -> Outcome {
        match self {
            Refusal::BadPath(_)
            | Refusal::Malformed(_)
            | Refusal::BadBody
            | Refusal::BodyTimeout
            | Refusal::LimitKeyTooLong { .. }
            | Refusal::LimitKeyRepeated { .. }
            | Refusal::CapNotHere { .. }
            | Refusal::BadGrpcTimeout(_) => Outcome::BadRequest,
            Refusal::TooLarge(_) => Outcome::TooLarge,
            Refusal::UnknownKey
            | Refusal::InvalidToken(_)
            | Refusal::KeyRequired { .. }
            | Refusal::PlanDenied { .. }
            | Refusal::LimitKeyMissing { .. } => Outcome::Unauthorized,
            Refusal::Denied | Refusal::CorsDenied(_) => Outcome::Forbidden,
            Refusal::Banned { .. } | Refusal::FloodBlocked { .. } => Outcome::Banned,
            Refusal::NoRoute => Outcome::NoRoute,
            Refusal::Limited { .. }
            | Refusal::StackLimited(_)
            | Refusal::Concurrent { .. }
            | Refusal::PreflightLimited => Outcome::Limited,
            Refusal::Capacity {
                timed_out: true, ..
            } => Outcome::QueuedTimeout,
            Refusal::StoreUnavailable | Refusal::ConnectionClosing | Refusal::Capacity { .. } => {
                Outcome::Unavailable
            }
            Refusal::BadGateway { .. }
            | Refusal::GatewayTimeout { .. }
            | Refusal::NeedsH2 { .. } => Outcome::UpstreamError,
        }
    }

    /// Whether the connection must close after this answer: what follows a request
    /// refused for its framing or size cannot be trusted to be the next request.
    pub(crate) fn closes_connection(&self) -> bool {
        matches!(
            self,
            Refusal::Malformed(_) | Refusal::BadBody | Refusal::BodyTimeout | Refusal::TooLarge(_)
        )
    }

    /// Gives a 502 or 504 the `RateLimit` headers of the request it answers.
    pub(crate) fn carry_rate(&mut self, headers: HeaderMap) {
        if let Refusal::BadGateway { rate, .. } | Refusal::GatewayTimeout { rate, .. } = self
            && !headers.is_empty()
        {
            *rate = Some(Box::new(headers));
        }
    }

    /// The upstream target a 502 or 504 came from, for the access log.
    pub(crate) fn target(&self) -> Option<&str> {
        match self {
            Refusal::BadGateway { target, .. } | Refusal::GatewayTimeout { target, .. } => {
                target.as_deref()
            }
            _ => None,
        }
    }

    /// The names of the limits that refused the request (`violated-policies`).
    pub(crate) fn violated(&self) -> SmallVec<[&'static str; 8]> {
        match self {
            Refusal::Limited { report, .. } => report.rejecting().collect(),
            Refusal::StackLimited(limited) => limited.violated.clone(),
            Refusal::Concurrent { .. } => smallvec::smallvec!["concurrency"],
            _ => SmallVec::new(),
        }
    }

    /// The refusal's response: problem+json (RFC 9457), its status, and the headers
    /// it calls for (`Retry-After`, the `RateLimit` headers of a 429, a challenge of a
    /// 401, `Connection: close` after a malformed request).
    pub(crate) fn into_response(mut self) -> Response<Body> {
        let status = self.status();
        let close = self.closes_connection();
        let violated = self.violated();
        let rate = match &mut self {
            Refusal::BadGateway { rate, .. } | Refusal::GatewayTimeout { rate, .. } => rate.take(),
            _ => None,
        };
        let said = self.said();
        let body = said.rendered.unwrap_or_else(|| {
            problem_body(&Problem {
                kind: said.kind,
                title: status.canonical_reason().unwrap_or("Error"),
                status: status.as_u16(),
                detail: said.detail,
                violated: &violated,
            })
        });
        let mut response = problem_response(status, body);
        let h = response.headers_mut();
        if let Some(seconds) = said.retry_after {
            h.insert(RETRY_AFTER, rate_headers::seconds_header(seconds));
        }
        for (name, value) in said.headers.into_iter().flatten() {
            h.insert(name, value);
        }
        if let Some(rate) = rate {
            h.extend(*rate);
        }
        if close {
            h.insert(http::header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }

    /// What the answer says besides its status: the problem's type and detail (or
    /// its body, rendered already), `Retry-After`, and up to two more headers.
    #[inline(always)]
    fn said(self) -> Said {
        match self {
            Refusal::Limited {
                detail,
                report,
                policy_header,
            } => Said::quota(
                // Formatted once, when the request was refused.
                detail,
                rate_headers::ceil_secs(report.retry_ms().unwrap_or(1_000)).max(1),
                policy_header,
                rate_headers::refused_state_header(&report, None),
            ),
            Refusal::StackLimited(limited) => {
                let retry_after = rate_headers::ceil_secs(limited.retry_ms).max(1);
                let StackLimited {
                    detail,
                    policy_header,
                    state_header,
                    ..
                } = *limited;
                Said::quota(detail, retry_after, policy_header, state_header)
            }
            Refusal::Concurrent {
                detail,
                report,
                policy_header,
            } => {
                let state_header = rate_headers::refused_state_header(&report, Some(0));
                Said::quota(detail, 1, policy_header, state_header)
            }
            refusal @ Refusal::FloodBlocked { retry_after: secs } => {
                Said::abnormal_usage(refusal.to_string(), secs.max(1))
            }
            refusal @ Refusal::Banned { until_ms, now_ms } => {
                let secs = rate_headers::ceil_secs(until_ms.saturating_sub(now_ms)).max(1);
                Said::abnormal_usage(refusal.to_string(), secs)
            }
            Refusal::Capacity {
                body,
                retry_after: secs,
                ..
            } => Said {
                retry_after: Some(secs),
                rendered: Some(body),
                ..Said::plain(String::new())
            },
            refusal @ (Refusal::StoreUnavailable
            | Refusal::ConnectionClosing
            | Refusal::PreflightLimited) => Said {
                retry_after: Some(1),
                ..Said::plain(refusal.to_string())
            },
            refusal @ (Refusal::UnknownKey | Refusal::KeyRequired { .. }) => {
                Said::challenge(refusal.to_string(), HeaderValue::from_static("Bearer"))
            }
            refusal @ Refusal::InvalidToken(_) => {
                let challenge = HeaderValue::from_static("Bearer error=\"invalid_token\"");
                Said::challenge(refusal.to_string(), challenge)
            }
            refusal => Said::plain(refusal.to_string()),
        }
    }
}

impl Said {
    /// A refusal that says only its detail.
    #[inline(always)]
    fn plain(detail: String) -> Said {
        Said {
            kind: "about:blank",
            detail,
            retry_after: None,
            headers: [None, None],
            rendered: None,
        }
    }

    /// A quota's refusal (429): its policy and what is left, and when to retry.
    #[inline(always)]
    fn quota(
        detail: String,
        retry_after: u64,
        policy_header: Option<HeaderValue>,
        state_header: Option<HeaderValue>,
    ) -> Said {
        Said {
            kind: QUOTA_EXCEEDED,
            retry_after: Some(retry_after),
            headers: [
                policy_header.map(|policy| (&rate_headers::POLICY_HEADER, policy)),
                state_header.map(|state| (&rate_headers::STATE_HEADER, state)),
            ],
            ..Said::plain(detail)
        }
    }

    /// A caller shut out for a while (a flood's block, a ban), and when to retry.
    fn abnormal_usage(detail: String, retry_after: u64) -> Said {
        Said {
            kind: ABNORMAL_USAGE,
            retry_after: Some(retry_after),
            ..Said::plain(detail)
        }
    }

    /// A 401 and the challenge that says what to present.
    fn challenge(detail: String, challenge: HeaderValue) -> Said {
        Said {
            headers: [Some((&WWW_AUTHENTICATE, challenge)), None],
            ..Said::plain(detail)
        }
    }
}

#[cfg(test)]
mod tests;
