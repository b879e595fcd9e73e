//! How a request ended, as `sluice_requests_total{outcome}` and the access log name it.

/// Outcomes of `sluice_requests_total`, in [`Outcome`] order.
pub(crate) const OUTCOMES: [&str; 12] = [
    "allowed",
    "limited",
    "unauthorized",
    "forbidden",
    "banned",
    "no_route",
    "upstream_error",
    "unavailable",
    "bad_request",
    "too_large",
    "queued_timeout",
    "client_closed",
];

/// How a request ended, for `sluice_requests_total{outcome}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Served: the upstream's answer (whatever its status) or the route's own.
    Allowed,
    /// 429: over a rate limit, or over the policy's `per_caller` concurrency.
    Limited,
    /// 401: an unknown API key, or a plan the route's policy denies (for `anonymous`:
    /// the route requires a key).
    Unauthorized,
    /// 403: the client address is in `[access] deny`.
    Forbidden,
    /// 403: the caller is banned.
    Banned,
    /// 404: no route matches.
    NoRoute,
    /// 502 or 504: the upstream could not be reached, answered what may not be passed
    /// on, or did not answer in time.
    UpstreamError,
    /// 503: the concurrency cap and its queue are full, the store is down with
    /// `on_error = "deny"`, or the limiter holds `max_keys` callers it cannot evict.
    Unavailable,
    /// 400 or 408: a malformed head, path or body, or a body that came too slowly.
    BadRequest,
    /// Over a size limit: 413, 414, 431.
    TooLarge,
    /// Waited the concurrency queue's `queue_timeout` without getting a slot.
    QueuedTimeout,
    /// The client went away before its answer (status 499 in the access log, as
    /// nginx logs it). Access log only: `sluice_requests_total` does not count it.
    ClientClosed,
}
