//! `GET /readyz`, by one rule: 503 while requests would be refused for a reason
//! readiness can see, otherwise 200; the body, either way, says the store's state,
//! the resets of its data seen, and the JWT key set's.
//!
//! Unready: the shared store does not answer and `on_error = "deny"` (every limited
//! request would be a 503), or the first fetch of `[identity.jwt] jwks_url` is still
//! in flight (a valid token would be a 401; bounded by the fetch's timeout). A first
//! fetch that failed is reported in the body and does not hold the gateway unready:
//! API-key and anonymous callers are served meanwhile, and the set is fetched again.
//! With `on_error = "local"` or `"allow"` a store that is down is `"fallback"`, ready.

use http::header::CONTENT_TYPE;
use http::{HeaderValue, Response, StatusCode};

use super::json;
use crate::gateway::Gateway;
use crate::http::body::Body;

/// The readiness answer of `gateway` now.
pub(super) async fn readyz(gateway: &Gateway) -> Response<Body> {
    let snapshot = gateway.snapshot();
    let store = gateway.store();
    // One ping: a Redis down under `deny` is unready; otherwise it says whether
    // requests are decided in Redis or by `on_error`.
    let ping = store.ping().await;
    let deny_down = ping == Some(false) && store.denies_when_down();
    let state = match (deny_down, ping) {
        (true, _) => "down",
        (false, None) => "memory",
        (false, Some(true)) => "ok",
        (false, Some(false)) => "fallback",
    };
    let (resets, last_reset) = store.resets();
    let now_ms = gateway.clock().now_ms();
    let mut body = serde_json::json!({
        "status": "ready",
        "generation": snapshot.generation,
        "store": state,
        "store_resets": resets,
    });
    if let Some(reset) = last_reset {
        body["last_store_reset"] = serde_json::json!({
            "reason": reset.reason,
            "seconds_ago": now_ms.saturating_sub(reset.at_ms) / 1000,
        });
        if let Some(master) = reset.master {
            body["last_store_reset"]["master"] = master.into();
        }
    }
    let mut fetching = false;
    if let Some((url, state)) = snapshot.identifier.jwks_state() {
        fetching = state.ok == 0 && state.errors == 0;
        let keys = match (state.ok, &state.last_error) {
            (0, None) => "fetching",
            (0, Some(_)) => "failed",
            (_, Some(_)) => "stale",
            (_, None) => "ok",
        };
        body["jwks"] = serde_json::json!({"url": url, "keys": keys, "state": state});
    }
    let unready = match (deny_down, fetching) {
        (true, _) => Some("the shared store is down and on_error = \"deny\""),
        (false, true) => Some("the first fetch of the JWT key set (jwks_url) is in flight"),
        (false, false) => None,
    };
    let Some(reason) = unready else {
        return json(StatusCode::OK, &body);
    };
    // A problem (RFC 9457) whose extension members are the same state.
    let status = StatusCode::SERVICE_UNAVAILABLE;
    body["type"] = "about:blank".into();
    body["title"] = status.canonical_reason().unwrap_or("Error").into();
    body["status"] = status.as_u16().into();
    body["detail"] = reason.into();
    let mut response = json(status, &body);
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    response
}
