//! The life of one request: identify the caller, match the route, check the limits,
//! forward or answer directly, add the RateLimit headers.
//!
//! [`Gateway::handle`] loads the config snapshot once and serves the whole request
//! with it; every refusal is an `Err(Refusal)` turned into a response in one place
//! (`refusal`). Whether a caller may have a request is the decision service's answer
//! (`decision`); network and timing concerns (accepting, timeouts, draining) belong to
//! `server`; forwarding belongs to `proxy`; counting belongs to the store.

use std::borrow::Cow;
use std::sync::Arc;

use arc_swap::ArcSwap;
use http::header::{AUTHORIZATION, CONTENT_TYPE};
use http::{HeaderName, Request, Response};
use hyper::body::Incoming;

use crate::access_log::{AccessLog, Record};
use crate::body::Body;
use crate::clock::{Clock, Stopwatch};
use crate::concurrency::{Cap, Caps, Permit, Refused};
use crate::config::{AccessLog as LogFormat, Config, PlanId};
use crate::conn::ConnInfo;
use crate::decision::{self, Admission, Ask, Decision};
use crate::identity::{Caller, CallerKind};
use crate::limit::{Quota, Report};
use crate::metrics::{Metrics, Outcome};
use crate::proxy::{Held, Origin, Pools};
use crate::ratelimit;
use crate::refusal::Refusal;
use crate::route::{self, Route, Target};
use crate::server::Handler;
use crate::snapshot::{Shared, Snapshot};
use crate::store::{CallerKey, Store, StoreError};

/// The gateway: the current config snapshot, the counters, the upstream pools, the
/// clock and metrics.
#[derive(Debug)]
pub struct Gateway {
    /// The config every new request is served with; replaced whole on reload.
    snapshot: ArcSwap<Snapshot>,
    /// Callers' counters; outlives snapshots so reloads keep history.
    store: Store,
    /// Upstream keep-alive pools; outlive snapshots so reloads keep connections.
    pools: Pools,
    /// Policies' concurrency caps; outlive snapshots so reloads keep permits.
    caps: Caps,
    clock: Clock,
    metrics: Metrics,
    access_log: AccessLog,
}

/// What the metrics (and the access log) of a request say, learnt as it is served.
#[derive(Debug, Default)]
struct Labels {
    route: Option<usize>,
    plan: Option<PlanId>,
    /// The rest is filled in only while the access log is on.
    log: bool,
    client: Option<std::net::IpAddr>,
    consumer: Option<usize>,
    path: Option<String>,
    upstream_secs: Option<f64>,
}

/// What the access log needs of a request before it is answered.
struct Logged {
    format: LogFormat,
    arrived_ms: u64,
    started: Stopwatch,
    method: http::Method,
    uri: http::Uri,
}

/// A request being served: if dropped with its `logged` still there, the client
/// went away before the answer, and the request is logged with status 499.
struct Unanswered<'a> {
    labels: Labels,
    logged: Option<Logged>,
    request_id: http::HeaderValue,
    snapshot: &'a arc_swap::Guard<Arc<Snapshot>>,
    log: &'a AccessLog,
}

impl Logged {
    /// The request's line as far as it is known: the caller, route and path from
    /// `labels`, and a 499 of a client that went away after `duration`, which an
    /// answered request overwrites with what it was answered.
    fn record(
        self,
        snapshot: Arc<Snapshot>,
        request_id: http::HeaderValue,
        labels: &mut Labels,
        duration: std::time::Duration,
    ) -> Record {
        Record {
            snapshot,
            format: self.format,
            time_ms: self.arrived_ms,
            request_id,
            client: labels
                .client
                .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED.into()),
            consumer: labels.consumer,
            plan: labels.plan,
            route: labels.route,
            method: self.method,
            path: labels
                .path
                .take()
                .unwrap_or_else(|| self.uri.path().to_string()),
            status: 499,
            outcome: Outcome::ClientClosed,
            violated: smallvec::SmallVec::new(),
            upstream: None,
            upstream_status: None,
            upstream_duration: labels.upstream_secs.map(std::time::Duration::from_secs_f64),
            duration,
            bytes: 0,
        }
    }
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if let Some(logged) = self.logged.take() {
            let took = std::time::Duration::from_secs_f64(logged.started.elapsed_secs());
            let record = logged.record(
                Arc::clone(self.snapshot),
                self.request_id.clone(),
                &mut self.labels,
                took,
            );
            self.log.log(record);
        }
    }
}

/// Keeps `sluice_inflight_requests` of a route up while a request is served: it
/// rides on the response body until the last byte is sent or the client goes away.
struct Inflight(prometheus::IntGauge);

impl Inflight {
    fn enter(gauge: &prometheus::IntGauge) -> Inflight {
        gauge.inc();
        Inflight(gauge.clone())
    }
}

impl Drop for Inflight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl Gateway {
    /// A gateway serving `config`, writing its access log to `log_out` (stdout when
    /// run); fails if its store cannot be used at all.
    pub fn new(
        config: Config,
        clock: Clock,
        log_out: impl std::io::Write + Send + 'static,
    ) -> Result<Gateway, StoreError> {
        let store = Store::open(&config.store, clock.now_ms())?;
        store.ban_table().set_max(config.ban.max_bans);
        let metrics = Metrics::new(&config);
        metrics
            .tracked_callers_limit
            .set(i64::try_from(config.store.max_keys).unwrap_or(i64::MAX));
        let access_log = AccessLog::start(log_out, metrics.access_log_dropped.clone());
        metrics.store_errors.with_label_values(&[store.backend()]);
        let pools = Pools::default();
        let caps = Caps::default();
        let shared = Shared {
            store: &store,
            pools: &pools,
            caps: &caps,
            metrics: &metrics,
        };
        let snapshot = Snapshot::build(config, 1, shared);
        metrics.config_generation.set(1);
        Ok(Gateway {
            snapshot: ArcSwap::from_pointee(snapshot),
            store,
            pools,
            caps,
            clock,
            metrics,
            access_log,
        })
    }

    /// The snapshot new requests are served with.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.load_full()
    }

    /// Serves new requests with `config` from now on; returns its generation.
    pub fn install(&self, config: Config) -> u64 {
        let generation = self.snapshot.load().generation + 1;
        self.store.ban_table().set_max(config.ban.max_bans);
        let shared = Shared {
            store: &self.store,
            pools: &self.pools,
            caps: &self.caps,
            metrics: &self.metrics,
        };
        let snapshot = Snapshot::build(config, generation, shared);
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

    /// Serves one request that came on `conn`.
    pub async fn handle(&self, request: Request<Incoming>, conn: ConnInfo) -> Response<Body> {
        let snapshot = self.snapshot.load();
        let started = Stopwatch::start();
        let format = snapshot.log().access;
        let id_header = snapshot.log().request_id_header.clone();
        let mut labels = Labels {
            log: format != LogFormat::Off,
            ..Labels::default()
        };
        // Boxed once: the request passes through two boxed futures on its way
        // upstream, and each move of it by value would be a 264-byte copy.
        let request = Box::new(request);
        let version = request.version();
        // Sent upstream with an admitted request (`forward`) and returned to the client.
        let request_id = crate::request_id::keep_or_new(request.headers().get(&id_header));
        // Kept for the log: the method, and the target whose path is logged when the
        // request is refused before its path is normalised.
        let logged = labels.log.then(|| Logged {
            format,
            arrived_ms: self.clock.now_ms(),
            started,
            method: request.method().clone(),
            uri: request.uri().clone(),
        });
        if labels.log {
            labels.client = Some(conn.peer.ip());
        }
        // A client that goes away before its answer drops this future: the guard
        // then logs the request as 499.
        let mut unanswered = Unanswered {
            labels,
            logged,
            request_id,
            snapshot: &snapshot,
            log: &self.access_log,
        };
        // Boxed: the request path's state is kilobytes, and hyper moves the service
        // future by value into its dispatcher; one copy into the box replaces the
        // later ones (memcpy per 429: 2 800 -> 2 300 instructions).
        let result = Box::pin(self.serve(
            &snapshot,
            request,
            conn,
            &unanswered.request_id,
            &mut unanswered.labels,
        ))
        .await;
        let logged = unanswered.logged.take();
        let mut labels = std::mem::take(&mut unanswered.labels);
        let request_id = std::mem::replace(
            &mut unanswered.request_id,
            http::HeaderValue::from_static(""),
        );
        drop(unanswered);
        let mut violated = smallvec::SmallVec::new();
        let mut failed_target = None;
        let (mut response, outcome) = match result {
            Ok(response) => (response, Outcome::Allowed),
            Err(refusal) => {
                let outcome = refusal.outcome();
                if labels.log {
                    violated = refusal.violated();
                    failed_target = refusal.target().map(str::to_string);
                }
                (refusal.into_response(), outcome)
            }
        };
        let metrics = labels
            .route
            .map_or(&snapshot.unrouted_metrics, |r| &snapshot.route_metrics[r]);
        metrics.count(labels.plan.map(|p| usize::from(p.0)), outcome);
        metrics.respond(response.status());
        metrics.duration.observe(started.elapsed_secs());
        // The client gets the version it spoke, whatever the upstream spoke.
        *response.version_mut() = version;
        response.headers_mut().insert(id_header, request_id.clone());
        if let Some(logged) = logged {
            let origin = response.body().origin().map(str::to_string);
            let record = Record {
                status: response.status().as_u16(),
                outcome,
                violated,
                upstream_status: origin.is_some().then(|| response.status().as_u16()),
                upstream: origin.or(failed_target),
                ..logged.record(
                    arc_swap::Guard::into_inner(snapshot),
                    request_id,
                    &mut labels,
                    // Set when the body's last byte is sent.
                    std::time::Duration::ZERO,
                )
            };
            let access_log = self.access_log.clone();
            response.body_mut().on_end(move |end| {
                let mut record = record;
                record.duration = std::time::Duration::from_secs_f64(started.elapsed_secs());
                record.bytes = end.bytes;
                access_log.log(record);
            });
        }
        response
    }

    async fn serve(
        &self,
        snapshot: &Snapshot,
        request: Box<Request<Incoming>>,
        conn: ConnInfo,
        request_id: &http::HeaderValue,
        labels: &mut Labels,
    ) -> Result<Response<Body>, Refusal> {
        let identifier = &snapshot.identifier;
        let head = crate::head::check(&request, snapshot.server(), identifier.api_key_header())?;
        let now_ms = self.clock.now_ms();
        let peer = conn.peer.ip();
        // The path below borrows from this copy, not from the request moved upstream.
        let uri = request.uri().clone();
        let path = crate::path::normalize(uri.path())?;
        let ip = identifier.client_ip(request.headers(), peer);
        if labels.log {
            labels.path = Some(path.to_string());
            labels.client = Some(ip);
        }
        if snapshot.denied(ip) {
            return Err(Refusal::Denied);
        }
        // Bans come right after identification: cheap for the banned, before routing.
        let exempt = snapshot.exempt(ip);
        let ip_key = identifier.ip_key(ip);
        self.check_ban(exempt, ip_key, now_ms)?;
        let caller = match identifier.identify_from(head.credentials, ip) {
            Ok(caller) => caller,
            Err(_) => {
                // Unknown keys count against the client IP: key after key is stuffing.
                if !exempt {
                    self.strike(snapshot, ip_key, || ip_name(snapshot, ip), now_ms);
                }
                return Err(Refusal::UnknownKey);
            }
        };
        labels.plan = Some(caller.plan);
        if let CallerKind::Consumer(index) = caller.kind {
            labels.consumer = Some(index);
        }
        let key = caller_key(snapshot, &caller);
        if key != ip_key {
            self.check_ban(exempt, key, now_ms)?;
        }
        let host = || {
            uri.authority()
                .map(|a| a.as_str())
                .or_else(|| head.host.and_then(|h| h.to_str().ok()))
                .map(route::host_of)
        };
        let (index, route) = snapshot
            .routes
            .find(host, &path, request.method())
            .ok_or(Refusal::NoRoute)?;
        labels.route = Some(index);
        if !route.path_parameters && crate::path::has_parameters(&path) {
            return Err(Refusal::BadPath(crate::path::PathError::Parameters));
        }
        let route_metrics = &snapshot.route_metrics[index];
        let inflight = Inflight::enter(&route_metrics.inflight);
        let ask = route.policy.map(|policy| Ask {
            policy,
            plan: caller.plan,
            caller: key,
            cost: 1,
            exempt,
        });
        let limited = async {
            let admission = self.admit(snapshot, route, &caller, ask, now_ms).await?;
            match route.policy.and_then(|p| snapshot.cap(p)) {
                // Boxed, like the upstream exchange below: large states that most
                // requests never enter would otherwise size (and be copied with)
                // every request's future.
                Some(cap) if !exempt => {
                    Box::pin(async {
                        let held = self
                            .hold(snapshot, cap, (index, route), key, admission.as_ref())
                            .await?;
                        self.dispatch(snapshot, route, &caller, ask, admission, held)
                            .await
                    })
                    .await
                }
                _ => Ok((admission, None)),
            }
        };
        let (admission, mut permit) = match limited.await {
            Err(refusal @ (Refusal::Limited { .. } | Refusal::Concurrent { .. })) => {
                if !exempt {
                    let name = || caller_name(snapshot, &caller);
                    self.strike(snapshot, key, name, self.clock.now_ms());
                }
                return Err(refusal);
            }
            decided => decided?,
        };

        let concurrency = permit.as_ref().and_then(Permit::caller_remaining);
        let mut response = match &route.target {
            Target::Respond {
                status,
                body,
                content_type,
            } => {
                let mut response = Response::new(Body::full(body.clone()));
                *response.status_mut() = *status;
                response
                    .headers_mut()
                    .insert(CONTENT_TYPE, content_type.clone());
                response
            }
            Target::Upstream(upstream) => {
                let path = match route.strip_prefix {
                    true => Cow::Owned(route::strip(&route.path_prefix, &path)),
                    false => path,
                };
                let forward = Forward {
                    upstream: *upstream,
                    path: &path,
                    query: uri.query(),
                    authority: uri.authority().map(|a| a.as_str()),
                    conn,
                    request_id,
                    key_header_given: head.credentials.key.is_some(),
                    key_in_authorization: identifier.key_in_authorization(head.credentials),
                    now_ms,
                };
                let started = Stopwatch::start();
                // The permit stays with the upstream exchange: held while the upstream
                // works, even for a client that went away meanwhile.
                let held = permit.take().map(|permit| Box::new(permit) as Held);
                let response = Box::pin(self.forward(snapshot, request, forward, held)).await;
                let secs = started.elapsed_secs();
                route_metrics.upstream.observe(secs);
                labels.upstream_secs = Some(secs);
                response?
            }
        };
        match (&admission, route.policy) {
            (Some(admission), _) => {
                let policy = admission.limits.policy_header.as_ref();
                let headers = response.headers_mut();
                ratelimit::add_headers(headers, policy, &admission.report, concurrency);
            }
            (None, Some(policy)) if concurrency.is_some() => {
                let header = snapshot.cap_header(policy);
                let headers = response.headers_mut();
                ratelimit::add_headers(headers, header, &Report::default(), concurrency);
            }
            _ => {}
        }
        let body = response.body_mut();
        body.guard(inflight);
        if let Some(permit) = permit {
            body.guard(permit);
        }
        Ok(response)
    }

    /// A 403 for a banned caller (never for an exempt one).
    fn check_ban(&self, exempt: bool, key: CallerKey, now_ms: u64) -> Result<(), Refusal> {
        match self.store.banned(key, now_ms) {
            Some(until_ms) if !exempt => Err(Refusal::Banned { until_ms, now_ms }),
            _ => Ok(()),
        }
    }

    /// Counts a refusal toward an automatic ban, when `[ban]` asks for them.
    fn strike(
        &self,
        snapshot: &Snapshot,
        key: CallerKey,
        caller: impl FnOnce() -> String,
        now_ms: u64,
    ) {
        let Some(auto) = &snapshot.bans().automatic else {
            return;
        };
        if let Some(ban) = self.store.strike(key, caller, now_ms, auto) {
            self.banned_here(&ban);
        }
    }

    /// Records a ban this replica made (metrics and the log).
    pub fn banned_here(&self, ban: &crate::store::Ban) {
        self.metrics
            .bans_total
            .with_label_values(&[ban.reason.label()])
            .inc();
        tracing::info!(
            caller = %ban.caller,
            reason = ban.reason.text(),
            refusals = ban.refusals,
            seconds = ban.until_ms.saturating_sub(self.clock.now_ms()) / 1_000,
            "caller banned"
        );
    }

    /// A slot under the policy's concurrency cap, waiting in its queue if need be;
    /// a request refused here gives back the rate quota it was admitted with.
    async fn hold(
        &self,
        snapshot: &Snapshot,
        cap: &Arc<Cap>,
        (index, route): (usize, &Route),
        key: CallerKey,
        admission: Option<&Admission<'_>>,
    ) -> Result<Permit, Refusal> {
        let refused = match cap.acquire(key).await {
            Ok(permit) => return Ok(permit),
            Err(refused) => refused,
        };
        if let Some(admission) = admission {
            admission
                .refund(snapshot, &self.store, self.clock.now_ms())
                .await;
        }
        Err(match refused {
            Refused::PerCaller { limit } => Refusal::Concurrent {
                detail: format!(
                    "per_caller concurrency limit of {limit} on route {}",
                    route.name
                ),
                report: admission.map(|a| a.report.clone()).unwrap_or_default(),
                policy_header: match admission {
                    Some(admission) => admission.limits.policy_header.clone(),
                    None => route.policy.and_then(|p| snapshot.cap_header(p)).cloned(),
                },
            },
            Refused::QueueFull { retry_after_secs } => Refusal::Capacity {
                body: snapshot.capacity_body(index).clone(),
                retry_after: retry_after_secs,
                timed_out: false,
            },
            Refused::TimedOut { retry_after_secs } => Refusal::Capacity {
                body: snapshot.capacity_body(index).clone(),
                retry_after: retry_after_secs,
                timed_out: true,
            },
        })
    }

    /// A request that waited in the concurrency queue is counted again at the moment
    /// it leaves it: its rate quota is moved from the admission instant to now, so the
    /// upstream never sees more than a limit in any window, however long the queue
    /// held requests back. If the window filled up meanwhile, that is a 429.
    async fn dispatch<'a>(
        &self,
        snapshot: &'a Snapshot,
        route: &Route,
        caller: &Caller,
        ask: Option<Ask>,
        admission: Option<Admission<'a>>,
        permit: Permit,
    ) -> Result<(Option<Admission<'a>>, Option<Permit>), Refusal> {
        let admission = match admission {
            Some(admission) if permit.queued() => admission,
            admission => return Ok((admission, Some(permit))),
        };
        let now_ms = self.clock.now_ms();
        admission.refund(snapshot, &self.store, now_ms).await;
        let again = self.admit(snapshot, route, caller, ask, now_ms).await?;
        Ok((again, Some(permit)))
    }

    /// Asks the decision service about the caller on the route; `None` if the route
    /// does not limit it.
    async fn admit<'a>(
        &self,
        snapshot: &'a Snapshot,
        route: &Route,
        caller: &Caller,
        ask: Option<Ask>,
        now_ms: u64,
    ) -> Result<Option<Admission<'a>>, Refusal> {
        let Some(ask) = ask else {
            return Ok(None);
        };
        match decision::decide(snapshot, &self.store, ask, now_ms).await {
            Decision::Unlimited => Ok(None),
            Decision::Admitted(admission) => Ok(Some(admission)),
            Decision::Denied if caller.plan == PlanId::ANONYMOUS => Err(Refusal::KeyRequired {
                route: route.name.clone(),
            }),
            Decision::Denied => Err(Refusal::PlanDenied {
                plan: snapshot.plan_name(caller.plan).to_string(),
                route: route.name.clone(),
            }),
            Decision::Limited { report, limits } => Err(Refusal::Limited {
                detail: limited_detail(snapshot, route, caller.plan, &report),
                report,
                policy_header: limits.policy_header.clone(),
            }),
            Decision::Full => Err(Refusal::LimiterFull),
            Decision::Unavailable => Err(Refusal::StoreUnavailable),
        }
    }

    /// Rewrites the request for the upstream and sends it.
    async fn forward(
        &self,
        snapshot: &Snapshot,
        mut request: Box<Request<Incoming>>,
        forward: Forward<'_>,
        held: Option<Held>,
    ) -> Result<Response<Body>, Refusal> {
        let path_and_query = match forward.query {
            Some(query) => format!("{}?{query}", forward.path),
            None => forward.path.to_string(),
        };
        let identifier = &snapshot.identifier;
        let key_header = identifier.api_key_header();
        // Only headers that came are removed: a removal hashes the name.
        let remove: &[&HeaderName] = match (forward.key_header_given, forward.key_in_authorization)
        {
            (true, true) => &[key_header, &AUTHORIZATION],
            (true, false) => &[key_header],
            (false, true) => &[&AUTHORIZATION],
            (false, false) => &[],
        };
        let peer = forward.conn.peer.ip().to_canonical();
        let origin = Origin {
            peer,
            proto: forward.conn.scheme.as_str(),
            peer_trusted: identifier.is_trusted(peer),
        };
        crate::proxy::prepare_request_headers(
            request.headers_mut(),
            forward.authority,
            origin,
            remove,
        );
        // After the hop-by-hop headers went: a client's `Connection` cannot name it away.
        request.headers_mut().insert(
            snapshot.log().request_id_header.clone(),
            forward.request_id.clone(),
        );
        let server = snapshot.server();
        let limits = crate::proxy::RequestLimits {
            max_bytes: server.max_body_bytes,
            pause: server.body_timeout,
            min_rate: server.min_body_rate,
        };
        snapshot
            .upstreams
            .forward(
                forward.upstream,
                *request,
                held,
                &path_and_query,
                limits,
                forward.now_ms,
            )
            .await
    }
}

/// Where an admitted request goes upstream.
struct Forward<'a> {
    upstream: usize,
    /// The normalised (and, if the route says so, stripped) path.
    path: &'a str,
    query: Option<&'a str>,
    /// The request target's authority (absolute-form, HTTP/2 `:authority`).
    authority: Option<&'a str>,
    conn: ConnInfo,
    /// The request's id (the client's, or a new one), sent upstream with it.
    request_id: &'a http::HeaderValue,
    /// The request carried the API key header (which is not forwarded).
    key_header_given: bool,
    /// The API key came in `Authorization: Bearer`, which then is not forwarded.
    key_in_authorization: bool,
    now_ms: u64,
}

impl Handler for Gateway {
    fn handle(
        &self,
        request: Request<Incoming>,
        conn: ConnInfo,
    ) -> impl Future<Output = Response<Body>> + Send {
        Gateway::handle(self, request, conn)
    }
}

/// The limiter key of a caller: its consumer, or its IP (prefix).
fn caller_key(snapshot: &Snapshot, caller: &Caller) -> CallerKey {
    match caller.kind {
        CallerKind::Consumer(index) => snapshot.identifier.consumer_key(index),
        CallerKind::Anonymous => snapshot.identifier.ip_key(caller.ip),
    }
}

/// How the admin API names a caller: `consumer:NAME` or `ip:ADDRESS` (an IPv6
/// caller as the prefix it is keyed by).
fn caller_name(snapshot: &Snapshot, caller: &Caller) -> String {
    match caller.kind {
        CallerKind::Consumer(index) => format!("consumer:{}", snapshot.consumer_name(index)),
        CallerKind::Anonymous => ip_name(snapshot, caller.ip),
    }
}

fn ip_name(snapshot: &Snapshot, ip: std::net::IpAddr) -> String {
    match ip.to_canonical() {
        std::net::IpAddr::V4(v4) => format!("ip:{v4}"),
        std::net::IpAddr::V6(v6) => {
            let prefix = snapshot.identifier.ipv6_prefix();
            let net = ipnet::Ipv6Net::new(v6, prefix).map_or(v6, |n| n.trunc().addr());
            format!("ip:{net}/{prefix}")
        }
    }
}

/// "per_minute limit of 100 for plan registered on route orders"
///
/// The last one made on this thread is kept with what it was made from: a caller
/// hammering past its limit is refused for the same reason over and over, and
/// formatting it again cost about 1 800 of a 429's 21 900 instructions.
fn limited_detail(snapshot: &Snapshot, route: &Route, plan: PlanId, report: &Report) -> String {
    thread_local! {
        static LAST: std::cell::RefCell<Option<(DetailKey, String)>> =
            const { std::cell::RefCell::new(None) };
    }
    let Some(status) = report.iter().find(|s| s.retry_ms.is_some()) else {
        return format!("rate limit exceeded on route {}", route.name);
    };
    let key = DetailKey {
        generation: snapshot.generation,
        route: std::ptr::from_ref(route) as usize,
        plan,
        quota: status.quota,
        total: status.total,
    };
    LAST.with_borrow_mut(|last| {
        if let Some((_, detail)) = last.as_ref().filter(|(made_for, _)| *made_for == key) {
            return detail.clone();
        }
        let quota = status.quota;
        let detail = if status.total {
            let policy = route.policy.map_or("", |p| snapshot.policy_name(p));
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
                snapshot.plan_name(plan),
                route.name
            )
        };
        *last = Some((key, detail.clone()));
        detail
    })
}

/// What a refusal's detail is made from (routes are compared by address within
/// one snapshot generation).
#[derive(Clone, Copy, PartialEq)]
struct DetailKey {
    generation: u64,
    route: usize,
    plan: PlanId,
    quota: Quota,
    total: bool,
}
