//! The problem+json body (RFC 9457) every refusal answers with, and the response
//! that carries it. A refusal flood's bodies are shared: the last one rendered on a
//! thread is reused when the next is the same.
//!
//! It does not decide a refusal's status, type or headers: the parent module does.

use std::cell::RefCell;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderValue, Response, StatusCode};
use serde::Serialize;

use super::REDUCED_CAPACITY;
use crate::http::body::Body;

/// A problem as RFC 9457 writes it.
#[derive(Serialize)]
pub(super) struct Problem<'a> {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub title: &'static str,
    pub status: u16,
    pub detail: String,
    #[serde(rename = "violated-policies", skip_serializing_if = "<[_]>::is_empty")]
    pub violated: &'a [&'static str],
}

/// A rendered problem body and what it was rendered from.
struct Rendered {
    status: u16,
    kind: &'static str,
    detail: String,
    violated: Vec<&'static str>,
    body: Bytes,
}

thread_local! {
    /// The last problem body rendered on this thread. A caller hammering past its
    /// limit gets the same refusal over and over, so its bodies are shared rather
    /// than serialised again (`docs/performance.md`, "Figures behind the code").
    static LAST_RENDERED: RefCell<Option<Rendered>> = const { RefCell::new(None) };
}

/// The problem body of every 503 for a full concurrency cap on route `route`: the
/// same for each such refusal, so each snapshot renders it once per route.
pub(crate) fn capacity_body(route: &str) -> Bytes {
    let status = StatusCode::SERVICE_UNAVAILABLE;
    let problem = Problem {
        kind: REDUCED_CAPACITY,
        title: status.canonical_reason().unwrap_or("Error"),
        status: status.as_u16(),
        detail: format!("route {route} is at capacity; try again shortly"),
        violated: &[],
    };
    Bytes::from(serde_json::to_vec(&problem).unwrap_or_default())
}

/// A refusal by the admin API (a bad request to it, a missing token): a problem of
/// type `about:blank` saying `detail`, built here like every other refusal.
pub(crate) fn admin_problem(status: StatusCode, detail: &str) -> Response<Body> {
    let problem = Problem {
        kind: "about:blank",
        title: status.canonical_reason().unwrap_or("Error"),
        status: status.as_u16(),
        detail: detail.to_string(),
        violated: &[],
    };
    let body = Bytes::from(serde_json::to_vec(&problem).unwrap_or_default());
    problem_response(status, body)
}

/// A response of `status` carrying the problem+json `body`.
pub(super) fn problem_response(status: StatusCode, body: Bytes) -> Response<Body> {
    let mut response = Response::new(Body::full(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    response
}

/// The JSON body of `problem`, reused when it is the same as the last one.
pub(super) fn problem_body(problem: &Problem) -> Bytes {
    LAST_RENDERED.with_borrow_mut(|last| {
        if let Some(rendered) = last.as_ref().filter(|r| {
            r.status == problem.status
                && r.kind == problem.kind
                && r.detail == problem.detail
                && r.violated == problem.violated
        }) {
            return rendered.body.clone();
        }
        let body = Bytes::from(serde_json::to_vec(problem).unwrap_or_default());
        *last = Some(Rendered {
            status: problem.status,
            kind: problem.kind,
            detail: problem.detail.clone(),
            violated: problem.violated.to_vec(),
            body: body.clone(),
        });
        body
    })
}
