//! Prometheus metrics: one registry owned by the gateway (no global statics), every
//! metric of the design's table, labels taken from the config only.
//!
//! Label lookups cost a hash and a lock, so the request path never does them: each
//! config snapshot resolves the handles it needs once ([`RouteMetrics`]), and a
//! request only increments atomics. Callers' keys and IPs are never labels.

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

use crate::limit::Window;

/// Outcomes of `sluice_requests_total`, in [`Outcome`] order.
pub const OUTCOMES: [&str; 11] = [
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
];

/// How a request ended, for `sluice_requests_total{outcome}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Allowed,
    Limited,
    Unauthorized,
    Forbidden,
    Banned,
    NoRoute,
    UpstreamError,
    Unavailable,
    BadRequest,
    /// Over a size limit: 413, 414, 431.
    TooLarge,
    /// Waited the concurrency queue's `queue_timeout` without getting a slot.
    QueuedTimeout,
}

/// Route label of requests that matched no route (or were refused before routing).
pub const NO_ROUTE: &str = "none";
/// Plan label of requests whose caller was not identified.
pub const NO_PLAN: &str = "none";

/// Queue wait buckets in seconds: 1 ms to 30 s.
const WAIT_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Latency buckets in seconds: 100 µs to 10 s.
const BUCKETS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 10.0,
];

#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    request_duration: HistogramVec,
    upstream_duration: HistogramVec,
    limit_rejections: IntCounterVec,
    inflight: IntGaugeVec,
    queue_depth: IntGaugeVec,
    queue_wait: HistogramVec,
    pub tracked_callers: IntGauge,
    pub evicted_callers: IntCounter,
    pub store_errors: IntCounterVec,
    pub store_fallback: IntGauge,
    pub config_reloads: IntCounterVec,
    pub config_generation: IntGauge,
    pub bans_active: IntGauge,
    pub bans_total: IntCounterVec,
    /// Offenders left unbanned because `max_bans` live bans filled the table.
    pub bans_dropped: IntCounter,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let counter_vec = |name: &str, help: &str, labels: &[&str]| {
            let metric = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
            registry
                .register(Box::new(metric.clone()))
                .expect("unique metric");
            metric
        };
        let histogram_vec = |name: &str, help: &str| {
            let opts = HistogramOpts::new(name, help).buckets(BUCKETS.to_vec());
            let metric = HistogramVec::new(opts, &["route"]).expect("valid metric");
            registry
                .register(Box::new(metric.clone()))
                .expect("unique metric");
            metric
        };
        let gauge = |name: &str, help: &str| {
            let metric = IntGauge::new(name, help).expect("valid metric");
            registry
                .register(Box::new(metric.clone()))
                .expect("unique metric");
            metric
        };
        let requests = counter_vec(
            "sluice_requests_total",
            "Requests by route, caller plan and outcome.",
            &["route", "plan", "outcome"],
        );
        let request_duration = histogram_vec(
            "sluice_request_duration_seconds",
            "Time from request head to response head, by route.",
        );
        let upstream_duration = histogram_vec(
            "sluice_upstream_duration_seconds",
            "Time the upstream took to answer with response headers, by route.",
        );
        let limit_rejections = counter_vec(
            "sluice_limit_rejections_total",
            "Requests refused by a limit, by policy, plan and window.",
            &["policy", "plan", "window"],
        );
        let inflight = IntGaugeVec::new(
            Opts::new(
                "sluice_inflight_requests",
                "Requests being served, by route.",
            ),
            &["route"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(inflight.clone()))
            .expect("unique metric");
        let queue_depth = IntGaugeVec::new(
            Opts::new(
                "sluice_queue_depth",
                "Requests waiting in a policy's concurrency queue.",
            ),
            &["policy"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(queue_depth.clone()))
            .expect("unique metric");
        let queue_wait = HistogramVec::new(
            HistogramOpts::new(
                "sluice_queue_wait_seconds",
                "Time requests waited in a policy's concurrency queue, however the wait ended.",
            )
            .buckets(WAIT_BUCKETS.to_vec()),
            &["policy"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(queue_wait.clone()))
            .expect("unique metric");
        let store_errors = counter_vec(
            "sluice_store_errors_total",
            "Errors talking to the counter store, by backend.",
            &["backend"],
        );
        let config_reloads = counter_vec(
            "sluice_config_reloads_total",
            "Config reloads by result.",
            &["result"],
        );
        let evicted_callers = IntCounter::new(
            "sluice_evicted_callers_total",
            "Idle callers evicted to make room for new ones.",
        )
        .expect("valid metric");
        registry
            .register(Box::new(evicted_callers.clone()))
            .expect("unique metric");
        let bans_dropped = IntCounter::new(
            "sluice_bans_dropped_total",
            "Offenders not recorded for a ban because max_bans live bans filled the table.",
        )
        .expect("valid metric");
        registry
            .register(Box::new(bans_dropped.clone()))
            .expect("unique metric");
        let metrics = Metrics {
            requests,
            request_duration,
            upstream_duration,
            limit_rejections,
            inflight,
            queue_depth,
            queue_wait,
            tracked_callers: gauge(
                "sluice_tracked_callers",
                "Callers whose counters are kept in memory.",
            ),
            evicted_callers,
            store_errors,
            store_fallback: gauge(
                "sluice_store_fallback",
                "1 while the shared store is down and on_error is in force.",
            ),
            config_reloads,
            config_generation: gauge(
                "sluice_config_generation",
                "Number of the config in force (1 at start).",
            ),
            bans_active: gauge("sluice_bans_active", "Callers currently banned."),
            bans_total: counter_vec(
                "sluice_bans_total",
                "Bans made by this replica, by reason.",
                &["reason"],
            ),
            bans_dropped,
            registry,
        };
        // Series that exist before anything happens, so dashboards see zeros.
        for result in ["ok", "error"] {
            metrics.config_reloads.with_label_values(&[result]);
        }
        for reason in ["automatic", "manual"] {
            metrics.bans_total.with_label_values(&[reason]);
        }
        metrics
    }

    /// The handles one route needs, for every plan name (plus [`NO_PLAN`]).
    pub fn route(&self, route: &str, plans: &[&str]) -> RouteMetrics {
        let requests = plans
            .iter()
            .chain(std::iter::once(&NO_PLAN))
            .map(|plan| {
                OUTCOMES
                    .iter()
                    .map(|outcome| self.requests.with_label_values(&[route, plan, outcome]))
                    .collect()
            })
            .collect();
        RouteMetrics {
            requests,
            duration: self.request_duration.with_label_values(&[route]),
            upstream: self.upstream_duration.with_label_values(&[route]),
            inflight: self.inflight.with_label_values(&[route]),
        }
    }

    /// The queue depth gauge and wait histogram of a policy's concurrency cap.
    pub fn queue(&self, policy: &str) -> (IntGauge, Histogram) {
        (
            self.queue_depth.with_label_values(&[policy]),
            self.queue_wait.with_label_values(&[policy]),
        )
    }

    /// The rejection counter of (policy, plan, window).
    pub fn rejections(&self, policy: &str, plan: &str, window: Window, total: bool) -> IntCounter {
        let window = if total {
            window.total_name()
        } else {
            window.name()
        };
        self.limit_rejections
            .with_label_values(&[policy, plan, window])
    }

    /// The registry in Prometheus text format.
    pub fn render(&self) -> String {
        TextEncoder::new()
            .encode_to_string(&self.registry.gather())
            .unwrap_or_default()
    }
}

/// One route's metric handles, resolved once per config snapshot.
#[derive(Debug, Clone)]
pub struct RouteMetrics {
    /// `[plan][outcome]`; the last plan row is [`NO_PLAN`].
    requests: Vec<Vec<IntCounter>>,
    pub duration: Histogram,
    pub upstream: Histogram,
    pub inflight: IntGauge,
}

impl RouteMetrics {
    /// Counts one request of `plan` (None: not identified) with `outcome`.
    pub fn count(&self, plan: Option<usize>, outcome: Outcome) {
        let row = plan
            .unwrap_or(self.requests.len() - 1)
            .min(self.requests.len() - 1);
        self.requests[row][outcome as usize].inc();
    }
}
