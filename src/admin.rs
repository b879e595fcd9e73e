//! The admin listener: metrics, health, reload, usage and the decision API.
//!
//! | method and path | what |
//! | --- | --- |
//! | `GET /metrics` | Prometheus text format |
//! | `GET /healthz`, `GET /readyz` | liveness; readiness (config loaded, store answers) |
//! | `POST /admin/reload` | reload the config file now: 200, or 400 with every error |
//! | `GET`/`DELETE /admin/usage?caller=ip:1.2.3.4` | a caller's counters; reset them |
//! | `POST /v1/check` | the decision API: counts like a proxied request |
//!
//! `/admin/*` and `/v1/check` need `Authorization: Bearer <token>` when `[admin]
//! token` is set. Every error is problem+json. This module does no limiting of its
//! own: it asks the gateway's store, through the current snapshot.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_TYPE};
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq;

use crate::body::{Body, full};
use crate::config::PlanId;
use crate::gateway::Gateway;
use crate::identity::name_key;
use crate::limit::Report;
use crate::ratelimit::ceil_secs;
use crate::reload::Reloader;
use crate::server::Handler;
use crate::snapshot::{PlanLimit, Snapshot};
use crate::store::{CallerKey, Verdict};

/// Largest accepted body of an admin request.
const MAX_BODY: usize = 64 * 1024;

/// The admin API over a gateway.
pub struct Admin {
    gateway: Arc<Gateway>,
    reloader: Arc<Reloader>,
    token: Option<String>,
}

impl Admin {
    pub fn new(gateway: Arc<Gateway>, reloader: Arc<Reloader>, token: Option<String>) -> Admin {
        Admin {
            gateway,
            reloader,
            token,
        }
    }

    async fn route(&self, request: Request<Incoming>) -> Response<Body> {
        let path = request.uri().path().to_string();
        let method = request.method().clone();
        let protected = path.starts_with("/admin/") || path == "/v1/check";
        if protected && !self.authorized(&request) {
            let mut response = problem(
                StatusCode::UNAUTHORIZED,
                "a valid admin bearer token is required",
            );
            response
                .headers_mut()
                .insert("www-authenticate", HeaderValue::from_static("Bearer"));
            return response;
        }
        match (&method, path.as_str()) {
            (&Method::GET, "/metrics") => self.metrics(),
            (&Method::GET, "/healthz") => {
                json(StatusCode::OK, &serde_json::json!({"status": "ok"}))
            }
            (&Method::GET, "/readyz") => {
                let generation = self.gateway.snapshot().generation;
                if self.gateway.store().ready().await {
                    json(
                        StatusCode::OK,
                        &serde_json::json!({"status": "ready", "generation": generation}),
                    )
                } else {
                    problem(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "the shared store is down and on_error = \"deny\"",
                    )
                }
            }
            (&Method::POST, "/admin/reload") => match self.reloader.reload() {
                Ok(generation) => json(
                    StatusCode::OK,
                    &serde_json::json!({"status": "reloaded", "generation": generation}),
                ),
                Err(err) => {
                    let errors: Vec<String> = err.errors().map(|d| d.to_string()).collect();
                    let mut response = json(
                        StatusCode::BAD_REQUEST,
                        &serde_json::json!({
                            "type": "about:blank",
                            "title": "Bad Request",
                            "status": 400,
                            "detail": "the new config was rejected; the old one keeps serving",
                            "errors": errors,
                        }),
                    );
                    response.headers_mut().insert(
                        CONTENT_TYPE,
                        HeaderValue::from_static("application/problem+json"),
                    );
                    response
                }
            },
            (&Method::GET, "/admin/usage") => self.usage(&request, false).await,
            (&Method::DELETE, "/admin/usage") => self.usage(&request, true).await,
            (&Method::POST, "/v1/check") => self.check(request).await,
            (_, "/admin/bans") => problem(
                StatusCode::NOT_IMPLEMENTED,
                "automatic bans are not supported yet",
            ),
            (
                _,
                "/metrics" | "/healthz" | "/readyz" | "/admin/reload" | "/admin/usage"
                | "/v1/check",
            ) => problem(
                StatusCode::METHOD_NOT_ALLOWED,
                "method not allowed on this path",
            ),
            _ => problem(StatusCode::NOT_FOUND, "no such admin endpoint"),
        }
    }

    fn authorized(&self, request: &Request<Incoming>) -> bool {
        let Some(token) = &self.token else {
            return true;
        };
        let presented = request
            .headers()
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .unwrap_or("");
        bool::from(presented.as_bytes().ct_eq(token.as_bytes()))
    }

    fn metrics(&self) -> Response<Body> {
        let metrics = self.gateway.metrics();
        let store = self.gateway.store();
        metrics.tracked_callers.set(store.tracked() as i64);
        let errors = metrics.store_errors.with_label_values(&[store.backend()]);
        let store_errors = store.errors();
        if store_errors > errors.get() {
            errors.inc_by(store_errors - errors.get());
        }
        metrics.store_fallback.set(i64::from(store.in_fallback()));
        let evicted = store.evicted();
        let counted = metrics.evicted_callers.get();
        if evicted > counted {
            metrics.evicted_callers.inc_by(evicted - counted);
        }
        let mut response = Response::new(full(metrics.render()));
        response.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        );
        response
    }

    /// `GET` or `DELETE /admin/usage?caller=...`.
    async fn usage(&self, request: &Request<Incoming>, reset: bool) -> Response<Body> {
        let caller = request
            .uri()
            .query()
            .unwrap_or("")
            .split('&')
            .find_map(|pair| pair.strip_prefix("caller="))
            .map(percent_decode);
        let Some(caller) = caller else {
            return problem(
                StatusCode::BAD_REQUEST,
                "the caller parameter is required, e.g. caller=ip:1.2.3.4",
            );
        };
        let snapshot = self.gateway.snapshot();
        let Some(target) = CallerRef::parse(&caller, &snapshot) else {
            return problem(
                StatusCode::BAD_REQUEST,
                "caller must be ip:ADDRESS or consumer:NAME",
            );
        };
        let now = snapshot.days.now(self.gateway.clock().now_ms());
        let store = self.gateway.store();
        let mut policies = Vec::new();
        let mut cleared = 0;
        for (policy, limits) in snapshot.config.policies.iter().zip(&snapshot.policies) {
            let plans: Vec<PlanId> = match target.plan {
                Some(plan) => vec![plan],
                None => (0..snapshot.config.plans.len())
                    .map(|p| PlanId(p as u16))
                    .collect(),
            };
            for plan in plans {
                let PlanLimit::Limited(limited) = &limits.plans[usize::from(plan.0)] else {
                    continue;
                };
                if reset {
                    cleared += usize::from(store.reset(&limited.counters, target.key).await);
                    continue;
                }
                let mut report = Report::default();
                store
                    .peek(&limited.counters, target.key, &now, &mut report)
                    .await;
                let limits = report
                    .iter()
                    .filter(|s| !s.total)
                    .map(|s| UsageLimit {
                        window: s.quota.window.name(),
                        limit: s.quota.limit.get(),
                        used: s.used,
                        reset_after: if s.used == 0 {
                            0
                        } else {
                            ceil_secs(s.reset_ms)
                        },
                    })
                    .collect();
                policies.push(UsagePolicy {
                    policy: policy.name.clone(),
                    plan: snapshot.config.plan_name(plan).to_string(),
                    limits,
                });
            }
        }
        if reset {
            tracing::info!(caller = %caller, cleared, "usage reset through the admin API");
            return json(
                StatusCode::OK,
                &serde_json::json!({"caller": caller, "reset": cleared}),
            );
        }
        json(StatusCode::OK, &Usage { caller, policies })
    }

    /// `POST /v1/check`.
    async fn check(&self, request: Request<Incoming>) -> Response<Body> {
        let body = match read_body(request).await {
            Ok(body) => body,
            Err(response) => return response,
        };
        let ask: CheckRequest = match serde_json::from_slice(&body) {
            Ok(ask) => ask,
            Err(err) => {
                return problem(
                    StatusCode::BAD_REQUEST,
                    &format!("invalid request body: {err}"),
                );
            }
        };
        let snapshot = self.gateway.snapshot();
        let Some(policy) = snapshot
            .config
            .policies
            .iter()
            .position(|p| p.name == ask.policy)
        else {
            return problem(
                StatusCode::BAD_REQUEST,
                &format!("unknown policy \"{}\"", ask.policy),
            );
        };
        let Some(target) = CallerRef::parse(&ask.caller, &snapshot) else {
            return problem(
                StatusCode::BAD_REQUEST,
                "caller must be kind:name, e.g. consumer:batch-job or ip:1.2.3.4",
            );
        };
        let plan = match (&ask.plan, target.plan) {
            (Some(name), _) => match snapshot.config.plans.iter().position(|p| **p == **name) {
                Some(plan) => PlanId(plan as u16),
                None => {
                    return problem(StatusCode::BAD_REQUEST, &format!("unknown plan \"{name}\""));
                }
            },
            (None, Some(plan)) => plan,
            (None, None) => {
                return problem(StatusCode::BAD_REQUEST, "plan is required for this caller");
            }
        };
        let cost = ask.cost.unwrap_or(1);
        if cost == 0 {
            return problem(StatusCode::BAD_REQUEST, "cost must be at least 1");
        }
        let answer = match &snapshot.policies[policy].plans[usize::from(plan.0)] {
            PlanLimit::Deny => CheckAnswer {
                allowed: false,
                retry_after: 0,
                denied: true,
                limits: Vec::new(),
            },
            PlanLimit::Unlimited => CheckAnswer {
                allowed: true,
                retry_after: 0,
                denied: false,
                limits: Vec::new(),
            },
            PlanLimit::Limited(limited) => {
                let now = snapshot.days.now(self.gateway.clock().now_ms());
                let mut report = Report::default();
                let verdict = self
                    .gateway
                    .store()
                    .decide(&limited.counters, target.key, &now, cost, &mut report)
                    .await;
                let allowed = verdict == Verdict::Admitted;
                if allowed {
                    report.admit(cost);
                }
                let retry_after = match verdict {
                    Verdict::Admitted => 0,
                    Verdict::Limited => ceil_secs(report.retry_ms().unwrap_or(1_000)).max(1),
                    Verdict::Full | Verdict::Unavailable => 1,
                };
                let limits = report
                    .iter()
                    .map(|s| LimitAnswer {
                        window: if s.total {
                            s.quota.window.total_name()
                        } else {
                            s.quota.window.name()
                        },
                        limit: s.quota.limit.get(),
                        remaining: s.remaining(),
                        reset_after: ceil_secs(s.retry_ms.unwrap_or(s.reset_ms)),
                    })
                    .collect();
                CheckAnswer {
                    allowed,
                    retry_after,
                    denied: false,
                    limits,
                }
            }
        };
        json(StatusCode::OK, &answer)
    }
}

impl Handler for Admin {
    async fn handle(&self, request: Request<Incoming>, _peer: SocketAddr) -> Response<Body> {
        self.route(request).await
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckRequest {
    policy: String,
    caller: String,
    plan: Option<String>,
    cost: Option<u32>,
}

#[derive(Serialize)]
struct Usage {
    caller: String,
    policies: Vec<UsagePolicy>,
}

#[derive(Serialize)]
struct UsagePolicy {
    policy: String,
    plan: String,
    limits: Vec<UsageLimit>,
}

#[derive(Serialize)]
struct UsageLimit {
    window: &'static str,
    limit: u32,
    used: u32,
    reset_after: u64,
}

#[derive(Serialize)]
struct CheckAnswer {
    allowed: bool,
    retry_after: u64,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    denied: bool,
    limits: Vec<LimitAnswer>,
}

#[derive(Serialize)]
struct LimitAnswer {
    window: &'static str,
    limit: u32,
    remaining: u32,
    reset_after: u64,
}

/// A caller named in an admin request, with its limiter key and default plan.
struct CallerRef {
    key: CallerKey,
    /// The plan the caller has, when it is known (an IP, a configured consumer).
    plan: Option<PlanId>,
}

impl CallerRef {
    fn parse(text: &str, snapshot: &Snapshot) -> Option<CallerRef> {
        let (kind, name) = text.split_once(':')?;
        if name.is_empty() {
            return None;
        }
        match kind {
            "ip" => {
                let ip: IpAddr = name.parse().ok()?;
                Some(CallerRef {
                    key: snapshot.identifier.ip_key(ip),
                    plan: Some(PlanId::ANONYMOUS),
                })
            }
            "consumer" => Some(CallerRef {
                key: name_key(text),
                plan: snapshot
                    .config
                    .consumers
                    .iter()
                    .find(|c| c.name == name)
                    .map(|c| c.plan),
            }),
            _ => Some(CallerRef {
                key: name_key(text),
                plan: None,
            }),
        }
    }
}

async fn read_body(request: Request<Incoming>) -> Result<Bytes, Response<Body>> {
    let limited = http_body_util::Limited::new(request.into_body(), MAX_BODY);
    match limited.collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(_) => Err(problem(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request body too large or unreadable",
        )),
    }
}

/// Decodes `%XX` in a query value (and `+` as space); bad escapes stay as written.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let decoded = match bytes[i] {
            b'%' if i + 2 < bytes.len() => hex(bytes[i + 1]).zip(hex(bytes[i + 2])),
            _ => None,
        };
        match (decoded, bytes[i]) {
            (Some((high, low)), _) => {
                out.push(high * 16 + low);
                i += 3;
                continue;
            }
            (None, b'+') => out.push(b' '),
            (None, byte) => out.push(byte),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn json(status: StatusCode, value: &impl Serialize) -> Response<Body> {
    let mut response = Response::new(full(serde_json::to_vec(value).unwrap_or_default()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn problem(status: StatusCode, detail: &str) -> Response<Body> {
    let mut response = json(
        status,
        &serde_json::json!({
            "type": "about:blank",
            "title": status.canonical_reason().unwrap_or("Error"),
            "status": status.as_u16(),
            "detail": detail,
        }),
    );
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    response
}
