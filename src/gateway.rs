//! The life of one request: identify the caller, match the route, check the limits,
//! forward or answer directly, add the RateLimit headers.
//!
//! [`Gateway::handle`] loads the config snapshot once and serves the whole request
//! with it; every refusal is an `Err(Refusal)` turned into a response in one place
//! (`refusal`). Network and timing concerns (accepting, timeouts, draining) belong to
//! `server`; counting belongs to the store.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use arc_swap::ArcSwap;
use http::header::{CONTENT_TYPE, HOST};
use http::{HeaderName, HeaderValue, Request, Response};
use hyper::body::Incoming;

use crate::body::{self, Body};
use crate::clock::{Clock, Stopwatch};
use crate::config::{Config, PlanId, RouteConfig, RouteTarget};
use crate::identity::{Caller, CallerKind};
use crate::limit::Report;
use crate::metrics::{Metrics, Outcome};
use crate::proxy::{self, Origin};
use crate::ratelimit;
use crate::refusal::Refusal;
use crate::route;
use crate::snapshot::{PlanLimit, Snapshot};
use crate::store::{Store, Verdict};

/// The gateway: the current config snapshot, the counters, the clock and metrics.
#[derive(Debug)]
pub struct Gateway {
    /// The config every new request is served with; replaced whole on reload.
    snapshot: ArcSwap<Snapshot>,
    /// Callers' counters; outlives snapshots so reloads keep history.
    store: Store,
    clock: Clock,
    metrics: Metrics,
}

/// The limits a request was admitted under, for its response headers.
struct Admission {
    report: Report,
    policy_header: Option<HeaderValue>,
}

/// What the metrics of a request are labelled with, learnt as it is served.
#[derive(Debug, Default)]
struct Labels {
    route: Option<usize>,
    plan: Option<PlanId>,
}

/// Keeps `sluice_inflight_requests` of a route up while a request is served.
struct Inflight<'a>(&'a prometheus::IntGauge);

impl<'a> Inflight<'a> {
    fn enter(gauge: &'a prometheus::IntGauge) -> Inflight<'a> {
        gauge.inc();
        Inflight(gauge)
    }
}

impl Drop for Inflight<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl Gateway {
    pub fn new(config: Config, clock: Clock) -> Gateway {
        let store = Store::from_config(&config.store).unwrap_or_else(|err| {
            tracing::error!("{err}; counting in memory instead");
            Store::memory(config.store.max_keys)
        });
        if let Some(path) = &config.store.state_file {
            match store.restore_state(path, clock.now_ms()) {
                Ok(Some(restored)) => tracing::info!(
                    file = %path.display(),
                    callers = restored.callers,
                    totals = restored.totals,
                    dropped = restored.dropped,
                    saved_at_ms = restored.saved_at_ms,
                    "counters restored from the state file"
                ),
                Ok(None) => {
                    tracing::info!(file = %path.display(), "no state file yet; counters start empty")
                }
                Err(err) => tracing::error!("{err}; counters start empty"),
            }
        }
        let metrics = Metrics::new();
        metrics.store_errors.with_label_values(&[store.backend()]);
        let snapshot = Snapshot::build(config, 1, &store, &metrics);
        metrics.config_generation.set(1);
        Gateway {
            snapshot: ArcSwap::from_pointee(snapshot),
            store,
            clock,
            metrics,
        }
    }

    /// The snapshot new requests are served with.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.load_full()
    }

    /// Serves new requests with `config` from now on; returns its generation.
    pub fn install(&self, config: Config) -> u64 {
        let generation = self.snapshot.load().generation + 1;
        let snapshot = Snapshot::build(config, generation, &self.store, &self.metrics);
        self.snapshot.store(Arc::new(snapshot));
        self.metrics.config_generation.set(generation as i64);
        generation
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Serves one request from `peer`.
    pub async fn handle(&self, request: Request<Incoming>, peer: SocketAddr) -> Response<Body> {
        let snapshot = self.snapshot.load();
        let started = Stopwatch::start();
        let mut labels = Labels::default();
        let result = self.serve(&snapshot, request, peer.ip(), &mut labels).await;
        let (response, outcome) = match result {
            Ok(response) => (response, Outcome::Allowed),
            Err(refusal) => {
                let outcome = refusal.outcome();
                (refusal.into_response(), outcome)
            }
        };
        let metrics = labels
            .route
            .map_or(&snapshot.unrouted_metrics, |r| &snapshot.route_metrics[r]);
        metrics.count(labels.plan.map(|p| usize::from(p.0)), outcome);
        metrics.duration.observe(started.elapsed_secs());
        response
    }

    async fn serve(
        &self,
        snapshot: &Snapshot,
        mut request: Request<Incoming>,
        peer: IpAddr,
        labels: &mut Labels,
    ) -> Result<Response<Body>, Refusal> {
        let now_ms = self.clock.now_ms();
        let uri = request.uri().clone();
        let path = crate::path::normalize(uri.path())?;
        let caller = snapshot
            .identifier
            .identify(request.headers(), peer)
            .map_err(|_| Refusal::UnknownKey)?;
        labels.plan = Some(caller.plan);
        if snapshot.denied(caller.ip) {
            return Err(Refusal::Denied);
        }
        let host = uri
            .authority()
            .map(|a| a.as_str())
            .or_else(|| request.headers().get(HOST).and_then(|h| h.to_str().ok()))
            .map(route::host_of);
        let (index, route) = snapshot
            .routes
            .find(host, &path, request.method())
            .ok_or(Refusal::NoRoute)?;
        labels.route = Some(index);
        let route_metrics = &snapshot.route_metrics[index];
        let _inflight = Inflight::enter(&route_metrics.inflight);
        let admission = self.admit(snapshot, index, route, &caller, now_ms).await?;

        let mut response = match &route.target {
            RouteTarget::Respond {
                status,
                body,
                content_type,
            } => {
                let mut response = Response::new(body::full(body.clone()));
                *response.status_mut() = *status;
                response
                    .headers_mut()
                    .insert(CONTENT_TYPE, content_type.clone());
                response
            }
            RouteTarget::Upstream(upstream) => {
                let upstream_path = if route.strip_prefix {
                    std::borrow::Cow::Owned(route::strip(&route.path_prefix, &path))
                } else {
                    path
                };
                let path_and_query = match uri.query() {
                    Some(query) => format!("{upstream_path}?{query}"),
                    None => upstream_path.into_owned(),
                };
                let identifier = &snapshot.identifier;
                let key_header = identifier.api_key_header();
                let remove: &[&HeaderName] = if identifier.key_in_authorization(request.headers()) {
                    &[key_header, &http::header::AUTHORIZATION]
                } else {
                    &[key_header]
                };
                let origin = Origin {
                    peer: peer.to_canonical(),
                    peer_trusted: identifier.is_trusted(peer.to_canonical()),
                };
                proxy::prepare_request_headers(
                    request.headers_mut(),
                    uri.authority().map(|a| a.as_str()),
                    origin,
                    remove,
                );
                let started = Stopwatch::start();
                let response = snapshot
                    .upstreams
                    .forward(*upstream, request, &path_and_query, now_ms)
                    .await;
                route_metrics.upstream.observe(started.elapsed_secs());
                response?.map(http_body_util::Either::Right)
            }
        };
        if let Some(admission) = admission {
            let headers = response.headers_mut();
            if let Some(policy) = admission.policy_header {
                headers.insert(&ratelimit::POLICY_HEADER, policy);
            }
            if let Some(state) = ratelimit::state_header(&admission.report) {
                headers.insert(&ratelimit::STATE_HEADER, state);
            }
        }
        Ok(response)
    }

    /// Checks the caller against the route's limits; `None` if it is not limited.
    async fn admit(
        &self,
        snapshot: &Snapshot,
        index: usize,
        route: &RouteConfig,
        caller: &Caller,
        now_ms: u64,
    ) -> Result<Option<Admission>, Refusal> {
        let limited = match snapshot.plan_limit(index, caller.plan) {
            PlanLimit::Unlimited => return Ok(None),
            PlanLimit::Deny if caller.plan == PlanId::ANONYMOUS => {
                return Err(Refusal::KeyRequired {
                    route: route.name.clone(),
                });
            }
            PlanLimit::Deny => {
                return Err(Refusal::PlanDenied {
                    plan: snapshot.config.plan_name(caller.plan).to_string(),
                    route: route.name.clone(),
                });
            }
            PlanLimit::Limited(limited) => limited,
        };
        if snapshot.exempt(caller.ip) {
            return Ok(None);
        }
        let key = match caller.kind {
            CallerKind::Consumer(index) => snapshot.identifier.consumer_key(index),
            CallerKind::Anonymous => snapshot.identifier.ip_key(caller.ip),
        };
        let now = snapshot.days.now(now_ms);
        let mut report = Report::default();
        match self
            .store
            .decide(&limited.counters, key, &now, 1, &mut report)
            .await
        {
            Verdict::Admitted => {
                report.admit(1);
                Ok(Some(Admission {
                    report,
                    policy_header: limited.policy_header.clone(),
                }))
            }
            Verdict::Limited => {
                for (i, status) in report.iter().enumerate() {
                    if status.retry_ms.is_some()
                        && let Some(counter) = limited.rejections.get(i)
                    {
                        counter.inc();
                    }
                }
                Err(Refusal::Limited {
                    detail: limited_detail(snapshot, route, caller.plan, &report),
                    report: Box::new(report),
                    policy_header: limited.policy_header.clone(),
                })
            }
            Verdict::Full => Err(Refusal::LimiterFull),
            Verdict::Unavailable => Err(Refusal::StoreUnavailable),
        }
    }
}

/// "per_minute limit of 100 for plan registered on route orders"
fn limited_detail(
    snapshot: &Snapshot,
    route: &RouteConfig,
    plan: PlanId,
    report: &Report,
) -> String {
    let Some(status) = report.iter().find(|s| s.retry_ms.is_some()) else {
        return format!("rate limit exceeded on route {}", route.name);
    };
    let quota = status.quota;
    if status.total {
        let policy = route
            .policy
            .map_or("", |p| snapshot.config.policies[p].name.as_str());
        format!(
            "total {} limit of {} for policy {policy} on route {}",
            quota.window.key(),
            quota.limit,
            route.name
        )
    } else {
        format!(
            "{} limit of {} for plan {} on route {}",
            quota.window.key(),
            quota.limit,
            snapshot.config.plan_name(plan),
            route.name
        )
    }
}
