//! The metric table: every series' name and help text, and how a metric is made and
//! registered. The names are the contract `docs/operations.md` lists.

use prometheus::core::Collector;
use prometheus::{
    HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

/// A metric's name and help text.
pub(super) type Desc = (&'static str, &'static str);

pub(super) const REQUESTS: Desc = (
    "sluice_requests_total",
    "Requests by route, caller plan and outcome.",
);
pub(super) const RESPONSES: Desc = (
    "sluice_responses_total",
    "Responses by route and status class the client got (an upstream's status included).",
);
pub(super) const GRPC_RESPONSES: Desc = (
    "sluice_grpc_responses_total",
    "gRPC calls by route and the grpc-status the client got (sluice's refusals included).",
);
pub(super) const REQUEST_DURATION: Desc = (
    "sluice_request_duration_seconds",
    "Time from request head to response head, by route.",
);
pub(super) const UPSTREAM_DURATION: Desc = (
    "sluice_upstream_duration_seconds",
    "Time the upstream took to answer with response headers, by route.",
);
pub(super) const LIMIT_REJECTIONS: Desc = (
    "sluice_limit_rejections_total",
    "Requests refused by a limit, by policy, plan and window.",
);
pub(super) const INFLIGHT: Desc = (
    "sluice_inflight_requests",
    "Requests being served, by route.",
);
pub(super) const QUEUE_DEPTH: Desc = (
    "sluice_queue_depth",
    "Requests waiting in a policy's concurrency queue.",
);
pub(super) const QUEUE_LIMIT: Desc = (
    "sluice_queue_limit",
    "Requests a policy's concurrency queue holds at most (its queue setting).",
);
pub(super) const QUEUE_WAIT: Desc = (
    "sluice_queue_wait_seconds",
    "Time requests waited in a policy's concurrency queue, however the wait ended.",
);
pub(super) const STORE_ERRORS: Desc = (
    "sluice_store_errors_total",
    "Errors talking to the counter store, by backend.",
);
pub(super) const STORE_RESETS: Desc = (
    "sluice_store_resets_total",
    "Losses of the shared store's data noticed (a Redis restarted empty or flushed): every caller started a fresh window.",
);
pub(super) const CONFIG_RELOADS: Desc =
    ("sluice_config_reloads_total", "Config reloads by result.");
pub(super) const EVICTED_CALLERS: Desc = (
    "sluice_evicted_callers_total",
    "Idle callers evicted to make room for new ones.",
);
pub(super) const BANS_DROPPED: Desc = (
    "sluice_bans_dropped_total",
    "Offenders not recorded for a ban because max_bans live bans filled the table.",
);
pub(super) const ACCESS_LOG_DROPPED: Desc = (
    "sluice_access_log_dropped_total",
    "Access log lines dropped because stdout could not keep up.",
);
pub(super) const ACCESS_LOG_SUPPRESSED: Desc = (
    "sluice_access_log_suppressed_total",
    "Refusals left out of the access log by [log] refused = \"summary\" (counted in a line's repeated).",
);
pub(super) const BUILD_INFO: Desc = (
    "sluice_build_info",
    "1, labelled with the version and commit of the running binary.",
);
pub(super) const TRACKED_CALLERS: Desc = (
    "sluice_tracked_callers",
    "Callers whose counters are kept in memory.",
);
pub(super) const TRACKED_CALLERS_LIMIT: Desc = (
    "sluice_tracked_callers_limit",
    "Callers the memory store tracks at most ([store] max_keys).",
);
pub(super) const STORE_FALLBACK: Desc = (
    "sluice_store_fallback",
    "1 while the shared store is down and on_error is in force.",
);
pub(super) const STORE_BREAKER_OPEN: Desc = (
    "sluice_store_breaker_open",
    "1 while the breaker of a Redis Cluster master (node) is open and on_error decides its slots' requests.",
);
pub(super) const CONFIG_GENERATION: Desc = (
    "sluice_config_generation",
    "Number of the config in force (1 at start).",
);
pub(super) const BANS_ACTIVE: Desc = ("sluice_bans_active", "Callers currently banned.");
pub(super) const BANS_TOTAL: Desc = ("sluice_bans_total", "Bans made by this replica, by reason.");
pub(super) const FLOOD_BLOCKED: Desc = (
    "sluice_flood_blocked_addresses",
    "Addresses refused new connections after floods.",
);
pub(super) const CONSUMERS: Desc = (
    "sluice_consumers",
    "Consumers of the config in force, by where they are listed.",
);
pub(super) const TLS_RELOADS: Desc = (
    "sluice_tls_reloads_total",
    "Loads of changed TLS certificate files, by result (error: the previous certificates keep serving).",
);
pub(super) const JWKS_REFRESHES: Desc = (
    "sluice_jwks_refreshes_total",
    "Fetches of the JWT key set (jwks_url), by result.",
);

pub(super) const DECISIONS: Desc = (
    "sluice_decisions_total",
    "Decisions asked of the decision listener and /v1/check, by door (via) and outcome.",
);
pub(super) const USAGE_CREDITS: Desc = (
    "sluice_usage_credits_total",
    "Credits given back to callers' current billing periods through the admin API, by policy.",
);
pub(super) const RLS_DESCRIPTORS: Desc = (
    "sluice_rls_descriptors_total",
    "Envoy rate limit descriptors by the rule that matched them (none: no rule) and answer.",
);

/// Registers `metric` in `registry` and hands it back.
pub(super) fn register<M: Collector + Clone + 'static>(registry: &Registry, metric: M) -> M {
    registry
        .register(Box::new(metric.clone()))
        .expect("unique metric");
    metric
}

/// An `IntCounter`, registered in `registry`.
pub(crate) fn counter(registry: &Registry, (name, help): Desc) -> IntCounter {
    register(registry, IntCounter::new(name, help).expect("valid metric"))
}

/// An `IntCounterVec` with `labels`, registered in `registry`.
pub(crate) fn counter_vec(
    registry: &Registry,
    (name, help): Desc,
    labels: &[&str],
) -> IntCounterVec {
    let metric = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
    register(registry, metric)
}

/// An `IntGauge`, registered in `registry`.
pub(super) fn gauge(registry: &Registry, (name, help): Desc) -> IntGauge {
    register(registry, IntGauge::new(name, help).expect("valid metric"))
}

/// An `IntGaugeVec` with `labels`, registered in `registry`.
pub(super) fn gauge_vec(registry: &Registry, (name, help): Desc, labels: &[&str]) -> IntGaugeVec {
    let metric = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
    register(registry, metric)
}

/// A `HistogramVec` with `labels` and `buckets`, registered in `registry`.
pub(super) fn histogram_vec(
    registry: &Registry,
    (name, help): Desc,
    labels: &[&str],
    buckets: Vec<f64>,
) -> HistogramVec {
    let opts = HistogramOpts::new(name, help).buckets(buckets);
    register(
        registry,
        HistogramVec::new(opts, labels).expect("valid metric"),
    )
}
