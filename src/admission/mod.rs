//! Admission: may this request go ahead now, and on what terms?
//!
//! [`Admission`] is one service with two doors: [`Admission::admit`] for a proxied
//! request and [`Admission::check`] for `POST /v1/check`. Both run the same named
//! steps in the same order, so a check counts exactly like a proxied request of that
//! caller by construction:
//!
//! ```text
//! head check -> path normalisation -> client IP -> access lists -> IP ban
//!   -> identification (unknown key: strike) -> consumer ban -> route
//!   -> rate decision -> concurrency hold and queue (refund on 503; counted again
//!      when it leaves the queue) -> strike after a 429 -> shadow report
//! ```
//!
//! (The decision API names its caller and policy instead of sending a request, so it
//! starts at the access lists and has no route; it holds no concurrency slot, as it
//! has no response to hold it for.) Every step either passes the request on or
//! refuses it with a [`Refusal`]; none builds a response. The rate decision itself is
//! [`decision`]; bans and strikes are [`bans`]; the concurrency hold is [`hold`];
//! what a policy in shadow mode would have refused is reported by [`shadow`]. Once
//! the answer's status is known, [`refund`] gives back the cost of a request whose
//! status is one of its route's `refund_on`.

mod bans;
mod charge;
pub(crate) mod decision;
mod hold;
pub(crate) mod limit_key;
mod refund;
mod shadow;

use std::borrow::Cow;
use std::net::IpAddr;
use std::sync::Arc;

use http::{HeaderMap, Request, Uri};

use crate::clock::Clock;
use crate::concurrency::Permit;
use crate::config::PolicyId;
use crate::config::route::{self, Route};
use crate::config::{ConsumerId, PlanId, PolicyMode, RouteId};
use crate::http::body::Body;
use crate::http::head::Head;
use crate::http::rate_headers;
use crate::http::refusal::Refusal;
use crate::identity::jwt::Verified;
use crate::identity::{Caller, CallerKind, Credentials, IdentityError};
use crate::limit::Report;
use crate::observe::access_log::{Labels, WouldRefuse};
use crate::observe::metrics::Metrics;
use crate::server::conn::ConnInfo;
use crate::snapshot::Snapshot;
use crate::store::{BanTable, CallerKey, Store};

pub(crate) use decision::{Ask, Counted, Decision};

/// The admission service: the counters it decides with, the clock and the metrics.
#[derive(Debug)]
pub struct Admission {
    /// Callers' counters and bans; outlives snapshots so reloads keep history.
    store: Store,
    clock: Clock,
    metrics: Metrics,
    /// Strikes and would-be bans of `[ban] mode = "shadow"`, in this process only.
    shadow_bans: BanTable,
}

/// Callers `shadow_bans` tracks at most (the default `max_bans`).
const SHADOW_BANS: usize = 100_000;

/// A request admitted on a route: what forwarding it and answering it need.
pub struct Admitted<'a> {
    /// Index of the route in the snapshot's table, and the route.
    pub route: (RouteId, &'a Route),
    /// The normalised path.
    pub path: Cow<'a, str>,
    pub caller: Caller,
    /// Which credential headers the request carried (they are not forwarded).
    pub presented: Presented,
    /// When the request was admitted.
    pub now_ms: u64,
    /// What the rate decision counted; `None` when the route does not limit the caller.
    counted: Option<Counted<'a>>,
    /// The request's slot under the policy's concurrency cap.
    permit: Option<Permit>,
    /// Requests the caller may still have in flight (`per_caller`), for the headers.
    concurrency: Option<u32>,
    inflight: Inflight,
}

/// The credential headers a request carried, which forwarding removes.
#[derive(Debug, Clone, Copy)]
pub struct Presented {
    /// The API key header.
    pub key_header: bool,
    /// `Authorization: Bearer` carried the API key.
    pub key_in_authorization: bool,
}

/// A question to the decision API: a caller named by the admin API's `kind:name`.
#[derive(Debug, Clone, Copy)]
pub struct CheckAsk<'n> {
    /// The caller as the request named it (`consumer:NAME`, `ip:ADDRESS`, ...).
    pub name: &'n str,
    pub policy: PolicyId,
    pub plan: PlanId,
    pub caller: CallerKey,
    /// The key the caller spends the policy's budget under: `caller`, or for a keyed
    /// policy the key of the parts the question names.
    pub budget: CallerKey,
    /// The configured consumer the caller names, if it names one.
    pub consumer: Option<ConsumerId>,
    /// The caller's address, for an `ip:` caller: access lists and exemption apply.
    pub ip: Option<IpAddr>,
    pub cost: u32,
}

impl Admission {
    pub fn new(store: Store, clock: Clock, metrics: Metrics) -> Admission {
        Admission {
            store,
            clock,
            metrics,
            shadow_bans: BanTable::new(SHADOW_BANS),
        }
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

    /// Admits a proxied `request` (whose target is `uri`) that came on `conn`, or
    /// refuses it; what is learnt on the way goes into `labels`.
    pub async fn admit<'a, B>(
        &self,
        snapshot: &'a Snapshot,
        request: &Request<B>,
        uri: &'a Uri,
        conn: &ConnInfo,
        labels: &mut Labels,
    ) -> Result<Admitted<'a>, Refusal> {
        let identifier = &snapshot.identifier;
        let limits = snapshot.server().size_limits();
        let head = crate::http::head::check(request, limits, identifier.api_key_header())?;
        let path = crate::http::path::normalize(uri.path())?;
        let now_ms = self.clock.now_ms();
        let ip = identifier.client_ip(request.headers(), conn.peer.ip());
        labels.client_and_path(ip, &path);
        let exempt = access(snapshot, ip)?;
        // Bans come right after the access lists: cheap for the banned, before routing.
        let ip_key = identifier.ip_key(ip);
        self.unbanned(exempt, ip_key, now_ms)?;
        let mut credentials = Credentials {
            key: head.key,
            authorization: head.authorization,
            asserted: None,
        };
        // Only a trusted proxy's request still carries them (see `Gateway::handle`).
        credentials.asserted = identifier.asserted(request.headers())?;
        let (caller, token) = self.identify(snapshot, credentials, ip, exempt, now_ms)?;
        let named = match (caller.kind, &token) {
            (CallerKind::Named(_), Some(token)) => Some(&*token.consumer),
            (CallerKind::Named(_), None) => credentials.asserted.map(|a| a.consumer),
            _ => None,
        };
        labels.caller(caller.plan, caller.consumer(), named);
        let key = identifier.key(&caller);
        if key != ip_key {
            self.unbanned(exempt, key, now_ms)?;
        }
        let (index, route) = find_route(snapshot, request, uri, &head, &path)?;
        labels.route = Some(index);
        let sources = limit_key::Sources {
            route,
            method: request.method(),
            headers: request.headers(),
            uri,
            path: &path,
            caller: key,
            ip: ip_key,
            token: token.as_deref(),
        };
        let budget = limit_key::budget_key(snapshot, &sources)?;
        let inflight = Inflight::enter(&snapshot.route_metrics(Some(index)).inflight);
        let mut would_refuse = WouldRefuse::new();
        let (counted, permit) = self
            .limit(
                snapshot,
                (index, route),
                (&caller, named, key, budget),
                exempt,
                now_ms,
                &mut would_refuse,
            )
            .await?;
        if !would_refuse.is_empty() {
            self.shadowed(snapshot, route, caller.plan, would_refuse, labels);
        }
        Ok(Admitted {
            route: (index, route),
            path,
            caller,
            presented: Presented {
                key_header: head.key.is_some(),
                key_in_authorization: identifier.key_in_authorization(credentials),
            },
            now_ms,
            concurrency: permit.as_ref().and_then(Permit::caller_remaining),
            counted,
            permit,
            inflight,
        })
    }

    /// Decides `ask` for the decision API: the access lists, bans and exemption of a
    /// proxied request, then its rate decision; a limited caller earns its strike.
    pub async fn check<'a>(
        &self,
        snapshot: &'a Snapshot,
        ask: CheckAsk<'_>,
    ) -> Result<Decision<'a>, Refusal> {
        let now_ms = self.clock.now_ms();
        let exempt = match ask.ip {
            Some(ip) => access(snapshot, ip)?,
            None => false,
        };
        self.unbanned(exempt, ask.caller, now_ms)?;
        let question = Ask {
            policy: ask.policy,
            plan: ask.plan,
            caller: ask.budget,
            consumer: ask.consumer,
            cost: ask.cost,
            exempt,
        };
        let decision =
            decision::decide(snapshot, &self.store, &self.metrics, question, now_ms).await;
        if let Decision::Admitted(counted) = &decision
            && counted.would_refuse()
        {
            let would_refuse: WouldRefuse = counted.report.fired().collect();
            self.count_shadowed(snapshot, "", ask.policy, ask.plan, &would_refuse);
        }
        if matches!(decision, Decision::Limited { .. }) && !exempt {
            let name = || bans::checked_name(snapshot, ask.name, ask.ip);
            self.strike(snapshot, ask.caller, name, self.clock.now_ms());
        }
        Ok(decision)
    }

    /// Step: who is calling: a bearer JWT's caller, else the API key's consumer or
    /// an identity header's caller. A presented key that matches no consumer, or a
    /// token that does not verify, is a 401 and a strike against the client IP: key
    /// after key (or token after token) is guessing.
    fn identify(
        &self,
        snapshot: &Snapshot,
        credentials: Credentials<'_>,
        ip: IpAddr,
        exempt: bool,
        now_ms: u64,
    ) -> Result<(Caller, Option<Arc<Verified>>), Refusal> {
        let identifier = &snapshot.identifier;
        let identified = match identifier.identify_token(credentials, ip, now_ms) {
            Some(token) => token.map(|(caller, token)| (caller, Some(token))),
            None => identifier.identify_from(credentials, ip).map(|c| (c, None)),
        };
        identified.map_err(|err| {
            let refusal = match err {
                IdentityError::TwoCredentials => {
                    return Refusal::Malformed("an API key and a bearer token in one request");
                }
                IdentityError::UnknownKey => Refusal::UnknownKey,
                IdentityError::InvalidToken(reason) => Refusal::InvalidToken(reason),
            };
            if !exempt {
                let name = || bans::ip_name(snapshot, ip);
                self.strike(snapshot, identifier.ip_key(ip), name, now_ms);
            }
            refusal
        })
    }

    /// Step: the rate decision, then the concurrency hold; a 429 from either is a
    /// strike toward a ban. What a shadow policy would have refused goes into
    /// `would_refuse`.
    async fn limit<'a>(
        &self,
        snapshot: &'a Snapshot,
        (index, route): (RouteId, &'a Route),
        (caller, named, key, budget): (&Caller, Option<&str>, CallerKey, CallerKey),
        exempt: bool,
        now_ms: u64,
        would_refuse: &mut WouldRefuse,
    ) -> Result<(Option<Counted<'a>>, Option<Permit>), Refusal> {
        let consumer = match caller.kind {
            CallerKind::Consumer(index) => Some(index),
            _ => None,
        };
        let ask = route.policy.map(|policy| Ask {
            policy,
            plan: caller.plan,
            caller: budget,
            consumer,
            cost: route.cost.get(),
            exempt,
        });
        let limited = async {
            let counted = self.rate(snapshot, route, caller, ask, now_ms).await?;
            match route.policy.and_then(|p| snapshot.cap(p)) {
                // Boxed: large states that most requests never enter would otherwise
                // size (and be copied with) every request's future.
                Some(cap) if !exempt => {
                    let who = (caller, key);
                    let held = (ask, counted, &mut *would_refuse);
                    Box::pin(self.hold(snapshot, cap, (index, route), who, held)).await
                }
                _ => Ok((counted, None)),
            }
        };
        match limited.await {
            Err(refusal @ (Refusal::Limited { .. } | Refusal::Concurrent { .. })) => {
                if !exempt {
                    let name = || bans::caller_name(snapshot, caller, named);
                    self.strike(snapshot, key, name, self.clock.now_ms());
                }
                Err(refusal)
            }
            Ok((counted, permit)) => {
                if let Some(counted) = counted.as_ref().filter(|c| c.would_refuse()) {
                    would_refuse.extend(counted.report.fired());
                }
                Ok((counted, permit))
            }
            refused => refused,
        }
    }

    /// Asks the decision service about the caller on the route; `None` if the route
    /// does not limit it.
    async fn rate<'a>(
        &self,
        snapshot: &'a Snapshot,
        route: &Route,
        caller: &Caller,
        ask: Option<Ask>,
        now_ms: u64,
    ) -> Result<Option<Counted<'a>>, Refusal> {
        let Some(ask) = ask else {
            return Ok(None);
        };
        let decision = decision::decide(snapshot, &self.store, &self.metrics, ask, now_ms).await;
        decision::refusal_on_route(snapshot, route, caller.plan, decision)
    }
}

impl Admitted<'_> {
    /// The request's concurrency slot, to ride with the upstream exchange: held while
    /// the upstream works, even for a client that went away meanwhile.
    pub fn take_permit(&mut self) -> Option<Permit> {
        self.permit.take()
    }

    /// The `RateLimit` headers the request's answer carries (empty without a policy),
    /// for an answer sluice makes in the upstream's place (a 502 or 504).
    pub fn rate_headers(&self, snapshot: &Snapshot) -> HeaderMap {
        let mut headers = HeaderMap::new();
        let (policy, counted) = (self.route.1.policy, self.counted.as_ref());
        add_headers(snapshot, policy, counted, self.concurrency, &mut headers);
        headers
    }

    /// Adds the RateLimit headers of the caller's limits on the route to `response`,
    /// and makes its body hold the request's in-flight count (and its concurrency
    /// slot, if still here) until the last byte is sent or the client goes away.
    pub fn answer(self, snapshot: &Snapshot, response: &mut http::Response<Body>) {
        add_headers(
            snapshot,
            self.route.1.policy,
            self.counted.as_ref(),
            self.concurrency,
            response.headers_mut(),
        );
        let body = response.body_mut();
        body.guard(self.inflight);
        if let Some(permit) = self.permit {
            body.guard(permit);
        }
    }
}

/// `RateLimit-Policy` and `RateLimit` for what the request was counted against (and
/// the caller's concurrency share, with `per_caller`).
fn add_headers(
    snapshot: &Snapshot,
    policy: Option<PolicyId>,
    counted: Option<&Counted<'_>>,
    concurrency: Option<u32>,
    headers: &mut HeaderMap,
) {
    if let Some(policy) = policy
        && snapshot.policy_mode(policy) == (PolicyMode::Shadow { headers: false })
    {
        return;
    }
    match (counted, policy) {
        (Some(counted), _) => {
            let header = counted.limits.policy_header.as_ref();
            rate_headers::add_headers(headers, header, &counted.report, concurrency);
        }
        (None, Some(policy)) if concurrency.is_some() => {
            let header = snapshot.cap_header(policy);
            rate_headers::add_headers(headers, header, &Report::default(), concurrency);
        }
        _ => {}
    }
}

/// Step: the access lists. `[access] deny` is a 403; the answer says whether the
/// address is `exempt` (never limited nor banned).
fn access(snapshot: &Snapshot, ip: IpAddr) -> Result<bool, Refusal> {
    match snapshot.denied(ip) {
        true => Err(Refusal::Denied),
        false => Ok(snapshot.exempt(ip)),
    }
}

/// Step: the route, the first that matches in file order (404 if none); a path with
/// `;` parameters is a 400 unless the route accepts them.
fn find_route<'a, B>(
    snapshot: &'a Snapshot,
    request: &Request<B>,
    uri: &Uri,
    head: &Head<'_>,
    path: &str,
) -> Result<(RouteId, &'a Route), Refusal> {
    let host = || {
        uri.authority()
            .map(|a| a.as_str())
            .or_else(|| head.host.and_then(|h| h.to_str().ok()))
            .map(route::host_of)
    };
    let route = snapshot
        .routes
        .find(host, path, request.method())
        .ok_or(Refusal::NoRoute)?;
    if !route.path_parameters && crate::http::path::has_parameters(path) {
        return Err(Refusal::BadPath(crate::http::path::PathError::Parameters));
    }
    Ok((route.id, route))
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
