//! `GET /admin/status`: what an operator asks during an incident, as one JSON
//! document (the status page's twin): traffic per route over five minutes
//! (`traffic`), the callers refused most and nearest a limit in the last minute
//! (`observe::hitters`), the bans, the concurrency caps, the store, identity, the
//! config's reloads and the process.
//!
//! Everything is read when asked, from what the gateway keeps anyway; the only
//! work of its own is the traffic sampler ([`Admin::sample_traffic`]) on the admin
//! runtime. Traffic and the refused callers are this replica's; with Redis the bans
//! and the near-limit callers are the fleet's (`fleet`; `scope` says which is which).

pub(crate) mod decisions;
pub(crate) mod fleet;
pub(crate) mod page;
pub(crate) mod traffic;

use std::time::Instant;

use http::header::{CACHE_CONTROL, CONTENT_TYPE};
use http::{HeaderValue, Response, StatusCode};
use serde::Serialize;

use super::reload::LastReload;
use super::{Admin, Via};
use crate::config::{Backend, RedisTarget};
use crate::gateway::Gateway;
use crate::http::body::Body;
use crate::observe::hitters::{Hitters, NearLimit, RefusedBy, SLOT_MS, SLOTS, Top};
use traffic::{RouteTraffic, Sample};

/// The whole status.
#[derive(Debug, Serialize)]
pub(crate) struct Status {
    /// When it was read (ms since the epoch).
    pub at_ms: u64,
    /// How often the page reads it again.
    pub refresh_s: u64,
    /// Whose figures these are: `replica` (this process) or `fleet` (the store's).
    pub scope: Scope,
    pub process: Process,
    pub config: ConfigState,
    pub routes: Vec<RouteTraffic>,
    /// The decision listener's and `/v1/check`'s, by door and outcome.
    pub decisions: Vec<decisions::DecisionTraffic>,
    pub refused: Callers<RefusedBy>,
    pub near_limit: Callers<NearCaller>,
    pub bans: Vec<super::bans::Listed>,
    pub concurrency: Vec<Concurrency>,
    pub store: StoreState,
    pub identity: Identity,
}

#[derive(Debug, Serialize)]
pub(crate) struct Scope {
    pub traffic: &'static str,
    /// The refused callers'.
    pub callers: &'static str,
    pub near_limit: &'static str,
    pub bans: &'static str,
}

#[derive(Debug, Serialize)]
pub(crate) struct Process {
    pub version: &'static str,
    pub uptime_s: u64,
    /// Resident memory, from `/proc` (`None` where there is none).
    pub rss_bytes: Option<u64>,
    /// The most the refused and near-limit summaries can take, whatever the
    /// number of callers.
    pub summary_bytes: usize,
    /// The gateway listener's open connections by protocol.
    pub connections: Connections,
}

/// Open connections of the gateway listener: HTTP/1 and HTTP/2 connections (a
/// connection that switched to a WebSocket counts only as a WebSocket).
#[derive(Debug, Serialize)]
pub(crate) struct Connections {
    pub http1: usize,
    pub http2: usize,
    pub websocket: u64,
}

#[derive(Debug, Serialize)]
pub(crate) struct ConfigState {
    pub generation: u64,
    pub last_reload: Option<LastReload>,
}

/// A heavy-hitter list of the last minute.
#[derive(Debug, Serialize)]
pub(crate) struct Callers<T> {
    /// Seconds it covers at most (the current slot and the ones before it).
    pub window_s: u64,
    pub algorithm: &'static str,
    #[serde(flatten)]
    pub top: Top<T>,
}

/// A caller near a limit, with its fullest window's share.
#[derive(Debug, Serialize)]
pub(crate) struct NearCaller {
    #[serde(flatten)]
    pub at: NearLimit,
    pub ratio: f64,
}

#[derive(Debug, Serialize)]
pub(crate) struct Concurrency {
    pub policy: String,
    pub in_use: u64,
    pub max: u32,
    pub queued: u32,
    pub queue: u32,
}

#[derive(Debug, Serialize)]
pub(crate) struct StoreState {
    pub backend: &'static str,
    /// The servers it talks to (without credentials).
    pub nodes: Vec<String>,
    /// A PING's round trip now, in ms; `None` for memory or when it failed.
    pub ping_ms: Option<f64>,
    pub reachable: Option<bool>,
    pub errors: u64,
    /// `on_error` is deciding because Redis is down.
    pub fallback: bool,
    pub tracked_callers: usize,
    pub max_keys: usize,
}

#[derive(Debug, Serialize)]
pub(crate) struct Identity {
    /// Consumers of the config in force, from `[[consumers]]` and from the file.
    pub consumers_config: i64,
    pub consumers_file: i64,
    pub jwks: Option<Jwks>,
}

#[derive(Debug, Serialize)]
pub(crate) struct Jwks {
    pub url: String,
    #[serde(flatten)]
    pub state: crate::identity::jwks::FetchState,
}

impl Admin {
    /// Samples every route's totals every few seconds, for five minutes of rates.
    pub(crate) async fn sample_traffic(self: std::sync::Arc<Self>) {
        let mut every = tokio::time::interval(traffic::SAMPLE_EVERY);
        loop {
            every.tick().await;
            self.traffic.record(sample(&self.gateway));
        }
    }

    /// The status now.
    pub(crate) async fn status(&self) -> Status {
        let gateway = &self.gateway;
        // The last reload before the config: a reload swaps its config in before it
        // records its result, so an "ok" read here is never shown beside the
        // generation it replaced.
        let last_reload = self.reloader.last();
        let snapshot = gateway.snapshot();
        let now_ms = gateway.clock().now_ms();
        let redis = gateway.store().backend() == "redis";
        let hitters = gateway.admission().hitters();
        let (near_limit, fleet) = fleet::near(gateway, hitters.top_near(now_ms), now_ms).await;
        let now = sample(gateway);
        Status {
            at_ms: now_ms,
            refresh_s: 2,
            scope: Scope {
                traffic: "replica",
                callers: "replica",
                near_limit: if fleet { "fleet" } else { "replica" },
                bans: if redis { "fleet" } else { "replica" },
            },
            process: Process {
                version: crate::observe::VERSION,
                uptime_s: self.started.elapsed().as_secs(),
                rss_bytes: rss_bytes(),
                summary_bytes: Hitters::max_bytes(),
                connections: connections(gateway),
            },
            config: ConfigState {
                generation: snapshot.generation,
                last_reload,
            },
            routes: self.traffic.report(now.clone()),
            decisions: self.traffic.decisions(&now),
            refused: callers(hitters.top_refused(now_ms)),
            near_limit: near(near_limit),
            bans: super::bans::listed_now(gateway),
            concurrency: concurrency(gateway),
            store: store(gateway).await,
            identity: identity(gateway),
        }
    }
}

impl Admin {
    /// `GET /`: the status page, drawn now; a session's page carries its CSRF token
    /// for the lift buttons.
    pub(super) async fn page(&self, via: Option<&Via>) -> Response<Body> {
        let csrf = match via {
            Some(Via::Session(session)) => Some(session.csrf.as_str()),
            _ => None,
        };
        let status = self.status().await;
        match nonce() {
            Some(nonce) => html(StatusCode::OK, page::render(&status, &nonce, csrf), &nonce),
            None => super::problem(
                StatusCode::INTERNAL_SERVER_ERROR,
                "no random bytes for a nonce",
            ),
        }
    }
}

/// A fresh CSP nonce: 16 random bytes in hex.
pub(super) fn nonce() -> Option<String> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).ok()?;
    Some(const_hex::encode(bytes))
}

/// An HTML answer whose inline style and script carry `nonce`, under a CSP that
/// allows nothing else, never cached, never framed.
pub(super) fn html(status: StatusCode, body: String, nonce: &str) -> Response<Body> {
    let mut response = Response::new(Body::full(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    let policy = HeaderValue::try_from(page::policy(nonce));
    if let Ok(policy) = policy {
        headers.insert("content-security-policy", policy);
    }
    let fixed = [
        (CONTENT_TYPE, "text/html; charset=utf-8"),
        (CACHE_CONTROL, "no-store"),
        (http::header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (http::header::X_FRAME_OPTIONS, "DENY"),
        (http::header::REFERRER_POLICY, "same-origin"),
    ];
    for (name, value) in fixed {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// Every route's totals and the decisions' now.
fn sample(gateway: &Gateway) -> Sample {
    Sample {
        at_ms: gateway.clock().now_ms(),
        routes: gateway.metrics().route_totals(),
        decisions: gateway.metrics().decision_totals(),
    }
}

fn callers<T>(top: Top<T>) -> Callers<T> {
    Callers {
        window_s: SLOT_MS * SLOTS as u64 / 1_000,
        algorithm: "space-saving",
        top,
    }
}

fn near(top: Top<NearLimit>) -> Callers<NearCaller> {
    let Top {
        total,
        error_bound,
        callers: found,
    } = top;
    let found = found.into_iter().map(|counted| {
        let ratio = f64::from(counted.tag.used) / f64::from(counted.tag.limit.max(1));
        crate::observe::hitters::Counted {
            count: counted.count,
            tag: NearCaller {
                ratio: (ratio * 1_000.0).round() / 1_000.0,
                at: counted.tag,
            },
        }
    });
    callers(Top {
        total,
        error_bound,
        callers: found.collect(),
    })
}

fn concurrency(gateway: &Gateway) -> Vec<Concurrency> {
    let snapshot = gateway.snapshot();
    snapshot
        .policies()
        .filter_map(|policy| {
            let cap = snapshot.cap(policy)?;
            let max = cap.max();
            Some(Concurrency {
                policy: snapshot.policy_name(policy).to_string(),
                in_use: u64::from(max).saturating_sub(cap.available() as u64),
                max,
                queued: cap.waiting(),
                queue: cap.queue(),
            })
        })
        .collect()
}

async fn store(gateway: &Gateway) -> StoreState {
    let snapshot = gateway.snapshot();
    let config = &snapshot.config().store;
    let store = gateway.store();
    let started = Instant::now();
    let reachable = store.ping().await;
    let took = started.elapsed().as_secs_f64() * 1_000.0;
    StoreState {
        backend: store.backend(),
        nodes: match &config.backend {
            Backend::Memory => Vec::new(),
            Backend::Redis { target, .. } => nodes(target),
        },
        ping_ms: reachable
            .filter(|up| *up)
            .map(|_| (took * 1_000.0).round() / 1_000.0),
        reachable,
        errors: store.errors(),
        fallback: store.in_fallback(),
        tracked_callers: store.tracked(),
        max_keys: config.max_keys,
    }
}

/// The servers a Redis target names, without any password in their URLs.
fn nodes(target: &RedisTarget) -> Vec<String> {
    let urls: Vec<&String> = match target {
        RedisTarget::Server(url) => vec![url],
        RedisTarget::Cluster(urls) => urls.iter().collect(),
        RedisTarget::Sentinel { nodes, .. } => nodes.iter().collect(),
    };
    urls.into_iter()
        .map(|url| without_credentials(url))
        .collect()
}

fn without_credentials(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}{}", &url[..scheme + 3], &url[at + 1..])
        }
        _ => url.to_string(),
    }
}

fn identity(gateway: &Gateway) -> Identity {
    let consumers = &gateway.metrics().consumers;
    let snapshot = gateway.snapshot();
    Identity {
        consumers_config: consumers.with_label_values(&["config"]).get(),
        consumers_file: consumers.with_label_values(&["file"]).get(),
        jwks: (snapshot.identifier.jwks_state()).map(|(url, state)| Jwks { url, state }),
    }
}

/// This process's resident memory, as `process_resident_memory_bytes` reads it.
fn connections(gateway: &Gateway) -> Connections {
    let open = crate::observe::connections::counts();
    Connections {
        http1: open.http1,
        http2: open.http2,
        websocket: gateway.metrics().sockets.open(),
    }
}

fn rss_bytes() -> Option<u64> {
    use prometheus::core::Collector;
    let process = prometheus::process_collector::ProcessCollector::for_self();
    let families = process.collect();
    let rss = families
        .iter()
        .find(|f| f.name() == "process_resident_memory_bytes")?;
    Some(rss.get_metric().first()?.get_gauge().get_value() as u64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn node_urls_lose_their_passwords() {
        assert_eq!(
            super::without_credentials("redis://:secret@10.0.0.1:6379/0"),
            "redis://10.0.0.1:6379/0"
        );
        assert_eq!(
            super::without_credentials("rediss://user:p@ss@host:6380"),
            "rediss://host:6380"
        );
        assert_eq!(super::without_credentials("redis://host"), "redis://host");
    }
}
