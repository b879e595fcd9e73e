//! What admission hands back: the admitted request ([`Admitted`]: what forwarding,
//! settling and answering it need, and the `RateLimit` headers and guards of its
//! answer) or the refusal ([`Refused`]), each with what admission learnt of the
//! request ([`Learned`]) for its log line and metrics.

use std::borrow::Cow;
use std::net::IpAddr;

use http::HeaderMap;

use super::Counted;
use crate::concurrency::Permit;
use crate::config::route::Route;
use crate::config::{PolicyId, PolicyMode, RouteId};
use crate::http::body::Body;
use crate::http::rate_headers;
use crate::http::refusal::Refusal;
use crate::identity::Caller;
use crate::limit::Report;
use crate::snapshot::Snapshot;

/// A request admitted on a route: what answering it, forwarding it and settling it
/// need, and what admission learnt of it.
pub(crate) struct Admitted<'a> {
    /// The route it matched.
    pub route: &'a Route,
    /// The normalised path.
    pub path: Cow<'a, str>,
    /// Who is calling.
    pub caller: Caller,
    /// Which credential headers the request carried (they are not forwarded).
    pub presented: Presented,
    /// When the request was admitted.
    pub now_ms: u64,
    /// The name a trusted auth layer gave a caller the config does not list.
    pub(super) named: Option<Box<str>>,
    /// The limits a shadow policy would have refused the request by (empty unless
    /// one would have).
    pub(super) would_refuse: Vec<&'static str>,
    /// What the rate decision counted; `None` when the route does not limit the caller.
    pub(super) counted: Option<Counted<'a>>,
    /// The request's slot under the policy's concurrency cap.
    pub(super) permit: Option<Permit>,
    /// Requests the caller may still have in flight (`per_caller`), for the headers.
    pub(super) concurrency: Option<u32>,
    /// Keeps the route's in-flight gauge up while the request is served.
    pub(super) inflight: Inflight,
}

/// A request admission refused, with what it had learnt of the request by then.
#[derive(Debug)]
pub(crate) struct Refused<'a> {
    /// Why: the request's answer.
    pub refusal: Refusal,
    /// What was known when it was refused.
    known: Known<'a>,
}

/// What admission learnt of a request, admitted or refused, for its log line and
/// metrics: each part once its step was reached (a request refused for its head has
/// none, an admitted one has all).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Learned<'l> {
    /// The client address (after trusted proxies).
    pub client: Option<IpAddr>,
    /// The normalised path.
    pub path: Option<&'l str>,
    /// Who is calling.
    pub caller: Option<Caller>,
    /// The name a trusted auth layer gave a caller the config does not list.
    pub named: Option<&'l str>,
    /// The route the request matched.
    pub route: Option<RouteId>,
    /// The limits a shadow policy would have refused the request by.
    pub would_refuse: &'l [&'static str],
}

/// What the steps of `admit` learn as they go, kept for a refusal.
#[derive(Debug, Default)]
pub(super) struct Known<'a> {
    pub(super) client: Option<IpAddr>,
    pub(super) path: Option<Cow<'a, str>>,
    pub(super) caller: Option<Caller>,
    pub(super) named: Option<Box<str>>,
    pub(super) route: Option<RouteId>,
}

/// The credential headers a request carried, which forwarding removes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Presented {
    /// The API key header.
    pub key_header: bool,
    /// `Authorization` carried the caller's credential (an API key, or a JWT that
    /// `forward` does not keep).
    pub key_in_authorization: bool,
}

impl Refused<'_> {
    /// What admission learnt of the request before it refused it.
    pub(crate) fn learned(&self) -> Learned<'_> {
        let known = &self.known;
        Learned {
            client: known.client,
            path: known.path.as_deref(),
            caller: known.caller,
            named: known.named.as_deref(),
            route: known.route,
            would_refuse: &[],
        }
    }
}

/// The refusal of a request, with what the steps before it learnt.
pub(super) fn refused<'a>(refusal: Refusal, known: &mut Known<'a>) -> Refused<'a> {
    Refused {
        refusal,
        known: std::mem::take(known),
    }
}

impl Admitted<'_> {
    /// What admission learnt of the request.
    pub(crate) fn learned(&self) -> Learned<'_> {
        Learned {
            client: Some(self.caller.ip),
            path: Some(&self.path),
            caller: Some(self.caller),
            named: self.named.as_deref(),
            route: Some(self.route.id),
            would_refuse: &self.would_refuse,
        }
    }

    /// The request's concurrency slot, to ride with the upstream exchange: held while
    /// the upstream works, even for a client that went away meanwhile.
    pub(crate) fn take_permit(&mut self) -> Option<Permit> {
        self.permit.take()
    }

    /// The `RateLimit` headers the request's answer carries (empty without a policy),
    /// for an answer sluice makes in the upstream's place (a 502 or 504).
    pub(crate) fn rate_headers(&self, snapshot: &Snapshot) -> HeaderMap {
        let mut headers = HeaderMap::new();
        let (policy, counted) = (self.route.policy, self.counted.as_ref());
        add_headers(snapshot, policy, counted, self.concurrency, &mut headers);
        headers
    }

    /// Adds the RateLimit headers of the caller's limits on the route to `response`,
    /// and makes its body hold the request's in-flight count (and its concurrency
    /// slot, if still here) until the last byte is sent or the client goes away.
    pub(crate) fn answer(self, snapshot: &Snapshot, response: &mut http::Response<Body>) {
        add_headers(
            snapshot,
            self.route.policy,
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
    if let Some(counted) = counted.filter(|c| c.is_stacked()) {
        let (policy, state) = super::stacked::headers(counted, concurrency);
        if let Some(policy) = policy {
            headers.insert(&rate_headers::POLICY_HEADER, policy);
        }
        if let Some(state) = state {
            headers.insert(&rate_headers::STATE_HEADER, state);
        }
        return;
    }
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

/// Keeps `sluice_inflight_requests` of a route up while a request is served: it
/// rides on the response body until the last byte is sent or the client goes away.
pub(super) struct Inflight(prometheus::IntGauge);

impl Inflight {
    pub(super) fn enter(gauge: &prometheus::IntGauge) -> Inflight {
        gauge.inc();
        Inflight(gauge.clone())
    }
}

impl Drop for Inflight {
    fn drop(&mut self) {
        self.0.dec();
    }
}
