//! Prometheus metrics: one registry owned by the gateway (no global statics), every
//! metric of the design's table, labels taken from the config only.
//!
//! Label lookups cost a hash and a lock, so the request path never does them: each
//! config snapshot resolves the handles it needs once ([`RouteMetrics`]), and a
//! request only increments atomics. Callers' keys and IPs are never labels.

pub(crate) mod cost;
pub(crate) mod sockets;
mod table;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http::StatusCode;
use prometheus::{
    Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry,
    TextEncoder,
};

use crate::config::Config;
use crate::http::refusal::{OUTCOMES, Outcome};
use crate::limit::Window;
use table::{
    ACCESS_LOG_DROPPED, ACCESS_LOG_SUPPRESSED, BANS_ACTIVE, BANS_DROPPED, BANS_TOTAL, BUILD_INFO,
    CONFIG_GENERATION, CONFIG_RELOADS, CONSUMERS, DECISIONS, EVICTED_CALLERS, FLOOD_BLOCKED,
    GRPC_RESPONSES, INFLIGHT, JWKS_REFRESHES, LIMIT_REJECTIONS, QUEUE_DEPTH, QUEUE_LIMIT,
    QUEUE_WAIT, REQUEST_DURATION, REQUESTS, RESPONSES, RLS_DESCRIPTORS, STORE_BREAKER_OPEN,
    STORE_ERRORS, STORE_FALLBACK, STORE_RESETS, TLS_RELOADS, TRACKED_CALLERS,
    TRACKED_CALLERS_LIMIT, UPSTREAM_DURATION, USAGE_CREDITS, counter, counter_vec, gauge,
    gauge_vec, histogram_vec,
};

/// Route label of requests that matched no route (or were refused before routing).
pub(crate) const NO_ROUTE: &str = "none";
/// Plan label of requests whose caller was not identified.
pub(crate) const NO_PLAN: &str = "none";

/// Queue wait buckets in seconds: 1 ms to 30 s.
const WAIT_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Latency buckets in seconds: 100 µs to 10 s ...
const BUCKETS: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];
/// ... then as many of these as it takes to reach the longest a request can take.
const LONG_BUCKETS: [f64; 8] = [15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1_200.0, 3_600.0];

/// Latency buckets that reach the longest upstream timeout plus the longest queue
/// wait of `config`, so a request that ran into its timeout lands in a bucket of its
/// own rather than in `+Inf` with everything slower than 10 s. Fixed at start: a
/// reload that lengthens a timeout keeps the buckets until a restart.
fn longest_request(config: &Config) -> Duration {
    let upstream = config.upstreams.iter().map(|u| u.timeout).max();
    let queue = config
        .policies
        .iter()
        .filter_map(|p| p.concurrency.map(|c| c.queue_timeout))
        .max();
    upstream.unwrap_or_default() + queue.unwrap_or_default()
}

fn buckets(longest: Duration) -> Vec<f64> {
    let mut buckets = BUCKETS.to_vec();
    for bound in LONG_BUCKETS {
        if buckets
            .last()
            .is_some_and(|&last| Duration::from_secs_f64(last) >= longest)
        {
            break;
        }
        buckets.push(bound);
    }
    buckets
}

/// Status classes of `sluice_responses_total{code}`.
const CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// The gateway's Prometheus registry, served at `/metrics` on the admin listener.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    responses: IntCounterVec,
    grpc_responses: IntCounterVec,
    request_duration: HistogramVec,
    upstream_duration: HistogramVec,
    limit_rejections: IntCounterVec,
    inflight: IntGaugeVec,
    queue_depth: IntGaugeVec,
    queue_limit: IntGaugeVec,
    queue_wait: HistogramVec,
    /// `sluice_tracked_callers`: callers whose counters this process holds, read on
    /// each scrape.
    pub(crate) tracked_callers: IntGauge,
    /// `[store] max_keys`, so a dashboard or alert can compare.
    pub(crate) tracked_callers_limit: IntGauge,
    /// `sluice_evicted_callers_total`: callers evicted to make room for new ones,
    /// caught up with the store on each scrape.
    pub(crate) evicted_callers: IntCounter,
    /// `sluice_store_errors_total{backend}`: errors talking to the counter store,
    /// caught up with the store on each scrape.
    pub(crate) store_errors: IntCounterVec,
    /// `sluice_store_resets_total`: losses of the shared store's data (a Redis
    /// restarted empty or flushed) noticed, caught up with the store on each scrape.
    pub(crate) store_resets: IntCounter,
    /// `sluice_store_fallback`: 1 while Redis is down and `on_error` decides, read on
    /// each scrape.
    pub(crate) store_fallback: IntGauge,
    /// `sluice_store_breaker_open{node}`: per master of a Redis Cluster's slot map,
    /// 1 while its breaker is open; set anew on each scrape (a master no longer in
    /// the map leaves it).
    pub(crate) store_breaker_open: IntGaugeVec,
    /// `sluice_config_reloads_total{result}`: reloads installed (`ok`) and rejected
    /// (`error`).
    pub(crate) config_reloads: IntCounterVec,
    /// `sluice_tls_reloads_total{result}`: certificate files found changed and
    /// loaded (`ok`) or not loadable, the previous certificates kept (`error`).
    pub(crate) tls_reloads: IntCounterVec,
    /// `sluice_config_generation`: the config in force, 1 at start and one more per
    /// reload installed.
    pub(crate) config_generation: IntGauge,
    /// `sluice_bans_active`: callers banned now, as far as this replica knows,
    /// counted on each scrape.
    pub(crate) bans_active: IntGauge,
    /// `sluice_bans_total{reason}`: bans made through this replica, `automatic` or
    /// `manual`.
    pub(crate) bans_total: IntCounterVec,
    /// Offenders left unbanned because `max_bans` live bans filled the table.
    pub(crate) bans_dropped: IntCounter,
    /// `sluice_access_log_dropped_total`: access log lines dropped because stdout
    /// could not keep up.
    pub(crate) access_log_dropped: IntCounter,
    /// `sluice_access_log_suppressed_total`: refusals left out of the access log
    /// by `[log] refused = "summary"` (each counted in a line's `repeated`).
    pub(crate) access_log_suppressed: IntCounter,
    /// `sluice_flood_blocked_addresses`: addresses refused new connections after
    /// floods, counted on each scrape.
    pub(crate) flood_blocked: IntGauge,
    /// Shadow refusals, refunds and costs charged after responses.
    pub(crate) cost: cost::CostMetrics,
    /// Open WebSockets and their messages.
    pub(crate) sockets: sockets::SocketMetrics,
    /// `sluice_consumers{source}`: consumers of the config in force, from
    /// `[[consumers]]` (`config`) and from `consumers_file` (`file`).
    pub(crate) consumers: IntGaugeVec,
    /// `sluice_jwks_refreshes_total{result}`: fetches of `[identity.jwt] jwks_url`.
    pub(crate) jwks_refreshes: IntCounterVec,
    /// `sluice_decisions_total{via, outcome}`: what the decision listener's doors
    /// (`rls`, `forward_auth`) and `/v1/check` (`check`) answered.
    pub(crate) decisions: IntCounterVec,
    /// `sluice_rls_descriptors_total{descriptor, code}`: each RLS descriptor by the
    /// rule that matched it (`none`: no rule, answered OK) and its answer (`ok`,
    /// `over_limit`, `shadow`, `unlimited`).
    pub(crate) rls_descriptors: IntCounterVec,
    /// `sluice_usage_credits_total{policy}`: credits given through
    /// `POST /admin/usage/credit`.
    pub(crate) usage_credits: IntCounterVec,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::with_longest(Duration::ZERO)
    }
}

impl Metrics {
    /// The metrics of a gateway started with `config` (which sets the latency buckets).
    pub(crate) fn new(config: &Config) -> Metrics {
        Metrics::with_longest(longest_request(config))
    }

    /// Metrics whose latency buckets reach `longest`.
    pub(crate) fn with_longest(longest: Duration) -> Metrics {
        let r = &Registry::new();
        let latency = buckets(longest);
        let waits = WAIT_BUCKETS.to_vec();
        let metrics = Metrics {
            requests: counter_vec(r, REQUESTS, &["route", "plan", "outcome"]),
            responses: counter_vec(r, RESPONSES, &["route", "code"]),
            grpc_responses: counter_vec(r, GRPC_RESPONSES, &["route", "code"]),
            request_duration: histogram_vec(r, REQUEST_DURATION, &["route"], latency.clone()),
            upstream_duration: histogram_vec(r, UPSTREAM_DURATION, &["route"], latency),
            limit_rejections: counter_vec(r, LIMIT_REJECTIONS, &["policy", "plan", "window"]),
            inflight: gauge_vec(r, INFLIGHT, &["route"]),
            queue_depth: gauge_vec(r, QUEUE_DEPTH, &["policy"]),
            queue_limit: gauge_vec(r, QUEUE_LIMIT, &["policy"]),
            queue_wait: histogram_vec(r, QUEUE_WAIT, &["policy"], waits),
            tracked_callers: gauge(r, TRACKED_CALLERS),
            tracked_callers_limit: gauge(r, TRACKED_CALLERS_LIMIT),
            evicted_callers: counter(r, EVICTED_CALLERS),
            store_errors: counter_vec(r, STORE_ERRORS, &["backend"]),
            store_resets: counter(r, STORE_RESETS),
            store_fallback: gauge(r, STORE_FALLBACK),
            store_breaker_open: gauge_vec(r, STORE_BREAKER_OPEN, &["node"]),
            config_reloads: counter_vec(r, CONFIG_RELOADS, &["result"]),
            tls_reloads: counter_vec(r, TLS_RELOADS, &["result"]),
            config_generation: gauge(r, CONFIG_GENERATION),
            bans_active: gauge(r, BANS_ACTIVE),
            bans_total: counter_vec(r, BANS_TOTAL, &["reason"]),
            bans_dropped: counter(r, BANS_DROPPED),
            access_log_dropped: counter(r, ACCESS_LOG_DROPPED),
            access_log_suppressed: counter(r, ACCESS_LOG_SUPPRESSED),
            flood_blocked: gauge(r, FLOOD_BLOCKED),
            cost: cost::CostMetrics::register(r),
            sockets: sockets::SocketMetrics::register(r),
            consumers: gauge_vec(r, CONSUMERS, &["source"]),
            jwks_refreshes: counter_vec(r, JWKS_REFRESHES, &["result"]),
            decisions: counter_vec(r, DECISIONS, &["via", "outcome"]),
            usage_credits: counter_vec(r, USAGE_CREDITS, &["policy"]),
            rls_descriptors: counter_vec(r, RLS_DESCRIPTORS, &["descriptor", "code"]),
            registry: r.clone(),
        };
        let build_info = gauge_vec(r, BUILD_INFO, &["version", "commit"]);
        let commit = crate::observe::COMMIT;
        (build_info.with_label_values(&[env!("CARGO_PKG_VERSION"), commit])).set(1);
        let process = prometheus::process_collector::ProcessCollector::for_self();
        r.register(Box::new(process)).expect("unique metric");
        // Series that exist before anything happens, so dashboards see zeros.
        for result in ["ok", "error"] {
            metrics.config_reloads.with_label_values(&[result]);
            metrics.tls_reloads.with_label_values(&[result]);
        }
        for reason in ["automatic", "manual"] {
            metrics.bans_total.with_label_values(&[reason]);
        }
        metrics
    }

    /// The handles one route needs. Request and response series are created on
    /// first use, so `/metrics` holds no series for a route, plan and outcome that
    /// never happened.
    pub(crate) fn route(&self, route: &str, plans: &[&str]) -> RouteMetrics {
        let plans: Arc<[Box<str>]> = plans
            .iter()
            .chain(std::iter::once(&NO_PLAN))
            .map(|p| Box::from(*p))
            .collect();
        RouteMetrics {
            route: Box::from(route),
            requests_vec: self.requests.clone(),
            responses_vec: self.responses.clone(),
            requests: (0..plans.len()).map(|_| Default::default()).collect(),
            plans,
            responses: Default::default(),
            grpc: Arc::new(GrpcCounts {
                route: Box::from(route),
                vec: self.grpc_responses.clone(),
                by_code: Default::default(),
            }),
            duration: self.request_duration.with_label_values(&[route]),
            upstream: self.upstream_duration.with_label_values(&[route]),
            inflight: self.inflight.with_label_values(&[route]),
        }
    }

    /// Counts one RLS descriptor in `sluice_requests_total` under its rule's name
    /// (`route`; a name from the config, never a descriptor's values), plan `rls`.
    pub(crate) fn count_rule(&self, rule: &str, outcome: Outcome) {
        let labels = [rule, "rls", OUTCOMES[outcome as usize]];
        self.requests.with_label_values(&labels).inc();
    }

    /// The queue depth gauge and wait histogram of a policy's concurrency cap.
    pub(crate) fn queue(&self, policy: &str) -> (IntGauge, Histogram) {
        (
            self.queue_depth.with_label_values(&[policy]),
            self.queue_wait.with_label_values(&[policy]),
        )
    }

    /// Records the queue size of a policy's concurrency cap.
    pub(crate) fn set_queue_limit(&self, policy: &str, queue: u32) {
        self.queue_limit
            .with_label_values(&[policy])
            .set(i64::from(queue));
    }

    /// The rejection counter of (policy, plan, window).
    pub(crate) fn rejections(
        &self,
        policy: &str,
        plan: &str,
        window: Window,
        total: bool,
    ) -> IntCounter {
        let window = if total {
            window.total_name()
        } else {
            window.name()
        };
        self.limit_rejections
            .with_label_values(&[policy, plan, window])
    }

    /// Counts a refusal of a caller in debt (a window holding more than its limit after
    /// a cost charged afterwards) under `window = "cost"`.
    pub(crate) fn debt_rejection(&self, policy: &str, plan: &str) {
        self.limit_rejections
            .with_label_values(&[policy, plan, "cost"])
            .inc();
    }

    /// Counts a refusal by the concurrency cap of `policy` (503 for capacity, 429
    /// over `per_caller`) under `window = "concurrency"`; looked up when counted, as
    /// such refusals are off the hot path.
    pub(crate) fn concurrency_rejection(&self, policy: &str, plan: &str) {
        self.limit_rejections
            .with_label_values(&[policy, plan, "concurrency"])
            .inc();
    }

    /// The registry in Prometheus text format.
    pub fn render(&self) -> String {
        TextEncoder::new()
            .encode_to_string(&self.registry.gather())
            .unwrap_or_default()
    }
}

/// One route's metric handles, resolved once per config snapshot (request and
/// response counters on first use).
#[derive(Debug)]
pub(crate) struct RouteMetrics {
    route: Box<str>,
    /// Plan label values; the last is [`NO_PLAN`].
    plans: Arc<[Box<str>]>,
    requests_vec: IntCounterVec,
    responses_vec: IntCounterVec,
    /// `[plan][outcome]`.
    requests: Vec<[OnceLock<IntCounter>; OUTCOMES.len()]>,
    /// By status class.
    responses: [OnceLock<IntCounter>; CLASSES.len()],
    /// `sluice_grpc_responses_total`, by gRPC status; shared with the hooks that
    /// count a call when its trailers have gone out.
    pub(crate) grpc: Arc<GrpcCounts>,
    /// `sluice_request_duration_seconds`: request head to response head.
    pub(crate) duration: Histogram,
    /// `sluice_upstream_duration_seconds`: until the upstream's response headers.
    pub(crate) upstream: Histogram,
    /// `sluice_inflight_requests`: requests of the route being served, until the
    /// last byte of their response body is sent.
    pub(crate) inflight: IntGauge,
}

/// One route's `sluice_grpc_responses_total` series, made on first use.
#[derive(Debug)]
pub(crate) struct GrpcCounts {
    route: Box<str>,
    vec: IntCounterVec,
    by_code: [OnceLock<IntCounter>; crate::http::grpc::CODE_NAMES.len()],
}

impl GrpcCounts {
    /// Counts one call answered with gRPC status `code`.
    pub(crate) fn count(&self, code: u8) {
        let names = &crate::http::grpc::CODE_NAMES;
        let code = match usize::from(code) < names.len() {
            true => code,
            false => crate::http::grpc::UNKNOWN,
        };
        let index = usize::from(code);
        self.by_code[index]
            .get_or_init(|| self.vec.with_label_values(&[&*self.route, names[index]]))
            .inc();
    }
}

impl RouteMetrics {
    /// Counts one request of `plan` (None: not identified) with `outcome`.
    pub(crate) fn count(&self, plan: Option<usize>, outcome: Outcome) {
        let last = self.requests.len() - 1;
        let row = plan.unwrap_or(last).min(last);
        let index = outcome as usize;
        self.requests[row][index]
            .get_or_init(|| {
                let labels = [&*self.route, &*self.plans[row], OUTCOMES[index]];
                self.requests_vec.with_label_values(&labels)
            })
            .inc();
    }

    /// Counts one response by the class of its status.
    pub(crate) fn respond(&self, status: StatusCode) {
        let class = usize::from(status.as_u16() / 100).clamp(1, 5) - 1;
        self.responses[class]
            .get_or_init(|| {
                self.responses_vec
                    .with_label_values(&[&*self.route, CLASSES[class]])
            })
            .inc();
    }
}

/// One route's counts since start, as the status page samples them: requests by
/// outcome, and the request-duration histogram's cumulative buckets.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct RouteTotals {
    /// `[outcome]`, in the order of [`OUTCOMES`], summed over plans.
    pub outcomes: [u64; OUTCOMES.len()],
    /// `(upper bound in seconds, requests at or under it)`, `+Inf` last.
    pub buckets: Vec<(f64, u64)>,
}

impl Metrics {
    /// `sluice_decisions_total` by `(via, outcome)`, read from the registry (for
    /// the status page, never the request path).
    pub(crate) fn decision_totals(&self) -> std::collections::HashMap<(String, String), u64> {
        use prometheus::core::Collector;
        let mut totals = std::collections::HashMap::new();
        for family in self.decisions.collect() {
            for metric in family.get_metric() {
                let label = |name: &str| {
                    (metric.get_label().iter())
                        .find(|pair| pair.name() == name)
                        .map(|pair| pair.value().to_string())
                };
                if let (Some(via), Some(outcome)) = (label("via"), label("outcome")) {
                    totals.insert((via, outcome), metric.get_counter().get_value() as u64);
                }
            }
        }
        totals
    }

    /// Every route's totals, read from the registry (a lookup per series: for the
    /// status page, never the request path).
    pub(crate) fn route_totals(&self) -> std::collections::HashMap<String, RouteTotals> {
        use prometheus::core::Collector;
        let mut totals: std::collections::HashMap<String, RouteTotals> = Default::default();
        let label = |metric: &prometheus::proto::Metric, name: &str| {
            (metric.get_label().iter())
                .find(|pair| pair.name() == name)
                .map(|pair| pair.value().to_string())
        };
        for family in self.requests.collect() {
            for metric in family.get_metric() {
                let (Some(route), Some(outcome)) =
                    (label(metric, "route"), label(metric, "outcome"))
                else {
                    continue;
                };
                if let Some(index) = OUTCOMES.iter().position(|o| *o == outcome) {
                    let count = metric.get_counter().get_value() as u64;
                    totals.entry(route).or_default().outcomes[index] += count;
                }
            }
        }
        for family in self.request_duration.collect() {
            for metric in family.get_metric() {
                let Some(route) = label(metric, "route") else {
                    continue;
                };
                let histogram = metric.get_histogram();
                let mut buckets: Vec<(f64, u64)> = (histogram.get_bucket().iter())
                    .map(|b| (b.upper_bound(), b.cumulative_count()))
                    .collect();
                buckets.push((f64::INFINITY, histogram.get_sample_count()));
                totals.entry(route).or_default().buckets = buckets;
            }
        }
        totals
    }
}
