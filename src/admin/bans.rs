//! `/admin/bans`: list the bans in force, ban a caller by hand, lift a ban.
//!
//! ```text
//! GET    /admin/bans                 {"bans": [{"caller": "ip:1.2.3.4", "reason": "automatic",
//!                                     "remaining": 540, "refusals": 50}]}
//! POST   /admin/bans                 {"caller": "consumer:acme", "duration": "10m", "reason": "..."}
//! DELETE /admin/bans?caller=...      lifts an automatic or a manual ban
//! ```
//!
//! With Redis, bans are the fleet's: one made or lifted here reaches every replica
//! within a second.

use std::time::Duration;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use serde::{Deserialize, Serialize};

use super::{json, named_caller, problem, queried_caller, read_json};
use crate::gateway::Gateway;
use crate::http::body::Body;
use crate::http::rate_headers::ceil_secs;
use crate::store::{Ban, Reason};

/// The longest reason a manual ban may give.
const MAX_REASON_BYTES: usize = 256;

/// The longest manual ban.
const MAX_MANUAL: Duration = Duration::from_secs(365 * 86_400);

/// A ban as listed.
#[derive(Debug, Serialize)]
pub(crate) struct Listed {
    pub caller: String,
    pub reason: String,
    /// Seconds until the ban ends.
    pub remaining: u64,
    /// Refusals that led to it (0 for a manual ban).
    pub refusals: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BanRequest {
    caller: String,
    duration: String,
    reason: Option<String>,
}

pub(super) fn list(gateway: &Gateway) -> Response<Body> {
    json(
        StatusCode::OK,
        &serde_json::json!({ "bans": listed_now(gateway) }),
    )
}

/// The bans in force now.
pub(super) fn listed_now(gateway: &Gateway) -> Vec<Listed> {
    let now_ms = gateway.clock().now_ms();
    let bans = gateway.store().ban_table().list(now_ms);
    bans.iter().map(|(_, ban)| listed(ban, now_ms)).collect()
}

fn listed(ban: &Ban, now_ms: u64) -> Listed {
    Listed {
        caller: ban.caller.clone(),
        reason: ban.reason.text().to_string(),
        remaining: ceil_secs(ban.until_ms.saturating_sub(now_ms)),
        refusals: ban.refusals,
    }
}

pub(super) async fn add(gateway: &Gateway, request: Request<Incoming>) -> Response<Body> {
    let asked: BanRequest = match read_json(request).await {
        Ok(asked) => asked,
        Err(response) => return response,
    };
    let snapshot = gateway.snapshot();
    let target = match named_caller(&asked.caller, &snapshot) {
        Ok(target) => target,
        Err(response) => return *response,
    };
    if let Some(ip) = target.ip.filter(|ip| snapshot.exempt(*ip)) {
        return problem(
            StatusCode::BAD_REQUEST,
            &format!("{ip} is in [access] exempt: exempt callers are never banned"),
        );
    }
    let duration = match crate::config::parse_duration(&asked.duration) {
        Ok(duration) if duration <= MAX_MANUAL => duration,
        Ok(_) => {
            return problem(
                StatusCode::BAD_REQUEST,
                "duration must be at most 8760h (365 days)",
            );
        }
        Err(reason) => return problem(StatusCode::BAD_REQUEST, &reason),
    };
    // The reason is listed and logged: short, and one line of printable text.
    if let Some(reason) = &asked.reason
        && (reason.len() > MAX_REASON_BYTES || reason.chars().any(char::is_control))
    {
        return problem(
            StatusCode::BAD_REQUEST,
            "reason must be at most 256 bytes of text without control characters",
        );
    }
    let now_ms = gateway.clock().now_ms();
    let ban = Ban {
        caller: asked.caller.clone(),
        reason: Reason::Manual(asked.reason.unwrap_or_else(|| "manual".to_string())),
        until_ms: now_ms + duration.as_millis() as u64,
        refusals: 0,
        level: 0,
    };
    if !gateway.store().ban(target.key, ban.clone(), now_ms).await {
        return problem(
            StatusCode::INSUFFICIENT_STORAGE,
            "the ban table is full of live bans (ban.max_bans); none was made",
        );
    }
    gateway.admission().banned_here(&ban);
    json(StatusCode::CREATED, &listed(&ban, now_ms))
}

pub(super) async fn lift(gateway: &Gateway, request: &Request<Incoming>) -> Response<Body> {
    let snapshot = gateway.snapshot();
    let (caller, target) = match queried_caller(request, &snapshot) {
        Ok(found) => found,
        Err(response) => return *response,
    };
    let lifted = gateway
        .store()
        .lift(target.key, gateway.clock().now_ms())
        .await;
    tracing::info!(caller = %caller, lifted, "ban lifted through the admin API");
    json(
        StatusCode::OK,
        &serde_json::json!({"caller": caller, "lifted": lifted}),
    )
}
