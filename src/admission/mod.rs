//! Admission: may this request go ahead now, and on what terms? The only place that
//! decides.
//!
//! [`Admission`] is one service with two doors, both of which run the same named
//! steps in the same order, so that every door counts exactly like a proxied request
//! of that caller by construction:
//!
//! - [`Admission::admit`]: a request described by its head (a proxied request today;
//!   a forward-auth request of the decision listener will be one too):
//!
//!   ```text
//!   head check -> path normalisation -> client IP -> access lists -> IP ban
//!     -> identification (unknown key: strike) -> consumer ban -> route
//!     -> budget key -> rate decision -> concurrency hold and queue (refund on 503;
//!        counted again when it leaves the queue) -> strike after a 429
//!     -> shadow report
//!   ```
//!
//! - [`Admission::answer`]: a caller named as the admin API names callers, asked
//!   about a policy (`POST /v1/check` today; an Envoy rate limit request will be
//!   one). It starts at the access lists, has no route, and holds no concurrency
//!   slot, as it has no response to hold it for; it can also charge a cost known
//!   after the fact.
//!
//! Every step either passes the request on or refuses it with a [`Refusal`]; none
//! builds a response. What a step learnt (the client, the caller, the route) comes
//! back with the answer, admitted or refused, for the access log and the metrics:
//! admission writes neither. The rate decision itself is `decision`; bans and
//! strikes are `bans`; the budget key of a keyed policy is `budget`; the
//! concurrency hold is `hold`; what a policy in shadow mode would have refused is
//! reported by `shadow`; what the status page is told of refused and near-limit
//! callers is `watch`'s. Once the answer's status is known, `settle` gives back the
//! cost of a request whose status is one of its route's `refund_on`, and meters a
//! `cost_after` answer for what it cost. A WebSocket's messages are decided one by
//! one after its upgrade was admitted, by the policy's `messages` (`messages`).
//!
//! A route names one policy or several (`policy = ["org", "per_key"]`). A route of
//! several policies changes the steps, not the doors: each policy's budget key is
//! found (`budget`), the rate decision is one all-or-nothing decision over all of
//! them (`stacked`), and the concurrency hold takes a slot under each policy's cap.

mod admitted;
mod bans;
mod budget;
mod decision;
mod descriptors;
mod hold;
mod messages;
mod named;
mod question;
mod reserve;
mod settle;
mod shadow;
mod stacked;
mod watch;

use std::borrow::Cow;
use std::net::IpAddr;
use std::sync::Arc;

use http::{Request, Uri};

use crate::clock::Clock;
use crate::concurrency::Permit;
use crate::config::PolicyId;
use crate::config::route::{self, Route};
use crate::http::head::Head;
use crate::http::refusal::Refusal;
use crate::identity::jwt::Verified;
use crate::identity::{Caller, CallerKind, Credentials, IdentityError};
use crate::observe::hitters::Hitters;
use crate::observe::metrics::Metrics;
use crate::snapshot::Snapshot;
use crate::store::{BanTable, CallerKey, Store};

pub(crate) use admitted::{Admitted, Learned, Presented, Refused};
use admitted::{Inflight, Known, refused};
pub(crate) use budget::named_budget_key;
use decision::Ask;
pub(crate) use decision::{Counted, Decision};
pub(crate) use descriptors::{Descriptor, Descriptors, Stated, Status};
pub(crate) use messages::{MessageLimit, MessageVerdict};
pub(crate) use named::NamedCaller;
pub(crate) use question::{Answer, Question};

/// The admission service: the counters it decides with, the clock and the metrics.
#[derive(Debug)]
pub(crate) struct Admission {
    /// Callers' counters and bans; outlives snapshots so reloads keep history.
    store: Store,
    /// Stamps every decision.
    clock: Clock,
    /// Rejections, refunds, charges, bans and shadow reports are counted here.
    metrics: Metrics,
    /// Strikes and would-be bans of `[ban] mode = "shadow"`, in this process only.
    shadow_bans: BanTable,
    /// The callers refused most and nearest a limit in the last minute, for the
    /// status page; in this process only.
    hitters: Hitters,
    /// Callers' recent average costs on `reserve = "average"` routes, in this
    /// process only; shared with the settles that add to them.
    averages: Arc<reserve::Averages>,
    /// The counters of RLS descriptors' own limits, bounded; kept across reloads.
    overrides: descriptors::Overrides,
}

/// Callers `shadow_bans` tracks at most (the default `max_bans`).
const SHADOW_BANS: usize = 100_000;

/// A request's standing before its limits, worked out once by a door and handed to
/// every step after it: who asks, the keys it is counted and banned under, and when.
#[derive(Debug, Clone, Copy)]
struct Standing<'c> {
    caller: &'c Caller,
    /// The name an auth layer gave the caller, for the ban list.
    named: Option<&'c str>,
    /// The caller's limiter key: bans, strikes and the per-caller cap go by it.
    key: CallerKey,
    /// The key the request spends its policy's budget under (`key`, unless the
    /// policy counts by `key = [...]`).
    budget: CallerKey,
    /// A route of several policies: each, with the key the request spends its
    /// budget under; empty for one policy.
    stack: &'c [(PolicyId, CallerKey)],
    /// The client address is in `[access] exempt`: never limited nor banned.
    exempt: bool,
    /// When the request is decided.
    now_ms: u64,
}

/// Whose budget a count is made in: a policy's, for a plan, under a key (the caller's,
/// or its budget key under a keyed policy).
#[derive(Debug, Clone, Copy)]
struct Account {
    policy: PolicyId,
    plan: crate::config::PlanId,
    key: CallerKey,
    /// The day the caller's billing periods start on.
    anchor: crate::limit::Anchor,
}

/// What the limit steps let through: what the request was counted as, its slot, and
/// what a shadow policy would have refused it by.
struct Passed<'a> {
    counted: Option<Counted<'a>>,
    permit: Option<Permit>,
    would_refuse: Vec<&'static str>,
}

impl Admission {
    /// The service deciding with `store`, stamping decisions with `clock` and
    /// counting what it does in `metrics`.
    pub(crate) fn new(store: Store, clock: Clock, metrics: Metrics) -> Admission {
        Admission {
            store,
            clock,
            metrics,
            shadow_bans: BanTable::new(SHADOW_BANS),
            hitters: Hitters::default(),
            averages: Arc::default(),
            overrides: descriptors::Overrides::default(),
        }
    }

    /// The callers refused most and nearest a limit in the last minute.
    pub(crate) fn hitters(&self) -> &Hitters {
        &self.hitters
    }

    /// The counters and bans, which outlive reloads.
    pub(crate) fn store(&self) -> &Store {
        &self.store
    }

    /// The clock every decision is stamped with.
    pub(crate) fn clock(&self) -> &Clock {
        &self.clock
    }

    /// The metrics admission counts in.
    pub(crate) fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Admits `request` (whose target is `uri`), sent by `peer`, or refuses it; either
    /// way with what was learnt of it. The steps, in order:
    pub(crate) async fn admit<'a, B>(
        &self,
        snapshot: &'a Snapshot,
        request: &Request<B>,
        uri: &'a Uri,
        peer: IpAddr,
    ) -> Result<Admitted<'a>, Refused<'a>> {
        let mut known = Known::default();
        let identifier = &snapshot.identifier;
        let (head, path) =
            well_formed(snapshot, request, uri).map_err(|r| refused(r, &mut known))?;
        let now_ms = self.clock.now_ms();
        let ip = identifier.client_ip(request.headers(), peer);
        (known.client, known.path) = (Some(ip), Some(path.clone()));
        let exempt = access(snapshot, ip).map_err(|r| refused(r, &mut known))?;
        // Bans come right after the access lists: cheap for the banned, before routing.
        let ip_key = identifier.ip_key(ip);
        (self.unbanned(exempt, ip_key, now_ms)).map_err(|r| refused(r, &mut known))?;
        let mut credentials = credentials(&head);
        // Only a trusted proxy's request still carries them (see `Gateway::handle`).
        credentials.asserted = (identifier.asserted(request.headers()))
            .map_err(|err| refused(err.into(), &mut known))?;
        let (caller, token) = (self.identify(snapshot, credentials, ip, exempt, now_ms))
            .map_err(|r| refused(r, &mut known))?;
        (known.caller, known.named) = (Some(caller), named(&caller, &token, credentials));
        let key = identifier.key(&caller);
        if key != ip_key {
            (self.unbanned(exempt, key, now_ms)).map_err(|r| refused(r, &mut known))?;
        }
        let route = (find_route(snapshot, request, uri, &head, &path))
            .map_err(|r| refused(r, &mut known))?;
        known.route = Some(route.id);
        // Refused before anything counts: a malformed upgrade costs nothing.
        (crate::http::upgrade::admissible(request, route.websocket))
            .map_err(|r| refused(r, &mut known))?;
        let sources = budget::Sources {
            route,
            method: request.method(),
            headers: request.headers(),
            uri,
            path: &path,
            caller: key,
            ip: ip_key,
            token: token.as_deref(),
        };
        let budget = budget::budget_key(snapshot, &sources).map_err(|r| refused(r, &mut known))?;
        let stack = budget::stack_keys(snapshot, &sources).map_err(|r| refused(r, &mut known))?;
        let inflight = Inflight::enter(&snapshot.route_metrics(Some(route.id)).inflight);
        let standing = Standing {
            caller: &caller,
            named: known.named.as_deref(),
            key,
            budget,
            stack: &stack,
            exempt,
            now_ms,
        };
        let limited = self.limit(snapshot, route, standing).await;
        budget::name_buckets(&self.store, snapshot, &sources, standing);
        let passed = match limited {
            Ok(passed) => passed,
            Err(refusal) => return Err(refused(refusal, &mut known)),
        };
        Ok(Admitted {
            route,
            path,
            caller,
            presented: Presented {
                key_header: head.key.is_some(),
                key_in_authorization: identifier.key_in_authorization(credentials),
            },
            now_ms,
            named: known.named,
            would_refuse: passed.would_refuse,
            concurrency: passed.permit.as_ref().and_then(Permit::caller_remaining),
            counted: passed.counted,
            permit: passed.permit,
            inflight,
        })
    }

    /// [`Self::admit`] for a forward-auth request: the same steps, but a route whose
    /// policy caps concurrency is refused (400) before any of them, as a slot would
    /// be held until a response end sluice never sees there.
    pub(crate) async fn admit_forwarded<'a, B>(
        &self,
        snapshot: &'a Snapshot,
        request: &Request<B>,
        uri: &'a Uri,
        peer: IpAddr,
    ) -> Result<Admitted<'a>, Refused<'a>> {
        if let Some(refusal) = cap_not_here(snapshot, request, uri) {
            return Err(refused(refusal, &mut Known::default()));
        }
        self.admit(snapshot, request, uri, peer).await
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
                let name = || named::ip_name(snapshot, ip);
                self.strike(snapshot, identifier.ip_key(ip), name, now_ms);
            }
            refusal
        })
    }

    /// Steps: the rate decision, then the concurrency hold; a 429 from either is a
    /// strike toward a ban.
    async fn limit<'a>(
        &self,
        snapshot: &'a Snapshot,
        route: &'a Route,
        standing: Standing<'_>,
    ) -> Result<Passed<'a>, Refusal> {
        let ask = route.policy.map(|policy| Ask {
            policy,
            plan: standing.caller.plan,
            caller: standing.budget,
            consumer: standing.caller.consumer(),
            cost: self.held(snapshot, route, standing),
            exempt: standing.exempt,
            stack: standing.stack,
        });
        let limited = async {
            let now_ms = standing.now_ms;
            let counted = self
                .rate(snapshot, route, standing.caller, ask, now_ms)
                .await?;
            match route.policy.and_then(|p| Some((p, snapshot.cap(p)?))) {
                _ if route.stacked() && !standing.exempt => {
                    let held = Box::pin(self.hold_stacked(snapshot, route, standing, ask, counted));
                    held.await
                }
                // Boxed: large states that most requests never enter would otherwise
                // size every request's future (its memory, not its copies: a new
                // future is copied into its box with only its arguments).
                Some(cap) if !standing.exempt => {
                    let held = Box::pin(self.hold(snapshot, cap, route, standing, ask, counted));
                    held.await
                }
                _ => Ok(Passed {
                    counted,
                    permit: None,
                    would_refuse: Vec::new(),
                }),
            }
        };
        match limited.await {
            Err(
                refusal @ (Refusal::Limited { .. }
                | Refusal::StackLimited(_)
                | Refusal::Concurrent { .. }),
            ) => {
                if !standing.exempt {
                    let name = || named::caller_name(snapshot, standing.caller, standing.named);
                    self.strike(snapshot, standing.key, name, self.clock.now_ms());
                }
                self.watch_refused(snapshot, route, standing, &refusal);
                Err(refusal)
            }
            Ok(mut passed) => {
                if let (Some(counted), Some(policy)) = (&passed.counted, route.policy) {
                    self.watch_near(snapshot, policy, standing, &counted.report);
                }
                if let Some(counted) = passed.counted.as_ref().filter(|c| c.would_refuse()) {
                    if counted.stacked.is_empty() {
                        passed.would_refuse.extend(counted.report.fired());
                    } else {
                        self.shadowed_stack(snapshot, route, standing.caller.plan, counted);
                        let parts = counted.parts().map(|part| &part.report);
                        passed.would_refuse.extend(parts.flat_map(|r| r.fired()));
                    }
                }
                if !passed.would_refuse.is_empty() && !route.stacked() {
                    self.shadowed(snapshot, route, standing.caller.plan, &passed.would_refuse);
                }
                Ok(passed)
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
        ask: Option<Ask<'_>>,
        now_ms: u64,
    ) -> Result<Option<Counted<'a>>, Refusal> {
        let Some(ask) = ask else {
            return Ok(None);
        };
        let decision = decision::decide(snapshot, &self.store, &self.metrics, ask, now_ms).await;
        decision::refusal_on_route(snapshot, route, caller.plan, decision)
    }
}

/// Steps: the head check (framing, sizes, the credential headers), then the path's
/// normalisation. A request that fails either is a 400, refused before anything is
/// known of who sent it.
#[inline]
fn well_formed<'r, 'u, B>(
    snapshot: &Snapshot,
    request: &'r Request<B>,
    uri: &'u Uri,
) -> Result<(Head<'r>, Cow<'u, str>), Refusal> {
    let limits = snapshot.server().size_limits();
    let key_header = snapshot.identifier.api_key_header();
    let head = crate::http::head::check(request, limits, key_header)?;
    let path = crate::http::path::normalize(uri.path())?;
    Ok((head, path))
}

/// The credential headers the head check found, as identification reads them.
fn credentials<'h>(head: &Head<'h>) -> Credentials<'h> {
    Credentials {
        key: head.key,
        authorization: head.authorization,
        asserted: None,
    }
}

/// The name a trusted auth layer gave `caller`, when the config does not list it:
/// its token's consumer claim, or its identity header's.
fn named(
    caller: &Caller,
    token: &Option<Arc<Verified>>,
    credentials: Credentials<'_>,
) -> Option<Box<str>> {
    match (caller.kind, token) {
        (CallerKind::Named(_), Some(token)) => Some(token.consumer.clone()),
        (CallerKind::Named(_), None) => credentials.asserted.map(|a| Box::from(a.consumer)),
        _ => None,
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

/// The refusal of a forward-auth request whose route's policy caps concurrency.
fn cap_not_here<B>(snapshot: &Snapshot, request: &Request<B>, uri: &Uri) -> Option<Refusal> {
    let path = crate::http::path::normalize(uri.path()).ok()?;
    let host = || {
        (uri.authority().map(|a| a.as_str()))
            .or_else(|| request.headers().get(http::header::HOST)?.to_str().ok())
            .map(route::host_of)
    };
    let route = snapshot.routes.find(host, &path, request.method())?;
    let (policy, cap) = (route.policies.iter()).find_map(|&p| Some((p, snapshot.cap(p)?)))?;
    Some(Refusal::CapNotHere {
        route: route.name.to_string(),
        policy: snapshot.policy_name(policy).to_string(),
        max: cap.max(),
    })
}

/// Step: the route, the first that matches in file order (404 if none); a path with
/// `;` parameters is a 400 unless the route accepts them.
fn find_route<'a, B>(
    snapshot: &'a Snapshot,
    request: &Request<B>,
    uri: &Uri,
    head: &Head<'_>,
    path: &str,
) -> Result<&'a Route, Refusal> {
    let host = || {
        uri.authority()
            .map(|a| a.as_str())
            .or_else(|| head.host.and_then(|h| h.to_str().ok()))
            .map(route::host_of)
    };
    let route = snapshot
        .routes
        .find(host, path, crate::http::upgrade::route_method(request))
        .ok_or(Refusal::NoRoute)?;
    if !route.path_parameters && crate::http::path::has_parameters(path) {
        return Err(Refusal::BadPath(crate::http::path::PathError::Parameters));
    }
    Ok(route)
}
