//! A descriptor's status: what is stated of its limit, what is left, when it
//! resets, its RateLimit headers and its metric labels, from a decision's report.

use http::HeaderValue;

use super::{Stated, Status};
use crate::http::rate_headers;
use crate::limit::{Quota, Report};
use crate::snapshot::PlanLimits;

/// The status of a descriptor no limit applies to: `none` matched no rule (0
/// remaining, as the reference service answers), else an unlimited one (all).
pub(super) fn unlimited(metric: &str) -> Status {
    let (code, remaining) = match metric {
        "none" => ("ok", 0),
        _ => ("unlimited", u32::MAX),
    };
    Status {
        over: false,
        limit: None,
        remaining,
        reset_ms: 0,
        headers: [None, None],
        metric: (metric.to_string(), code),
    }
}

/// The status of a descriptor refused before any limit (a ban, a denied plan).
pub(super) fn refused_status(metric: &str) -> Status {
    Status {
        over: true,
        limit: None,
        remaining: 0,
        reset_ms: 1_000,
        headers: [None, None],
        metric: (metric.to_string(), "over_limit"),
    }
}

/// The status of a rule's descriptor from its report.
pub(super) fn status_of(
    stated: Stated,
    limits: &PlanLimits,
    report: &Report,
    over: bool,
    metric: &str,
) -> Status {
    let (remaining, reset_ms) = binding(report);
    let shadow = report.rejected() && !over;
    Status {
        over,
        limit: Some(stated),
        remaining,
        reset_ms,
        headers: headers(limits, report),
        metric: (metric.to_string(), code(over, shadow)),
    }
}

/// The status of a policy's descriptor from its report: the limit nearest to
/// refusing (or the one that refused) is the one stated.
pub(super) fn report_status(
    name: &str,
    limits: &PlanLimits,
    report: &Report,
    over: bool,
) -> Status {
    let (remaining, reset_ms) = binding(report);
    let limit = binding_quota(report).map(|(quota, window_name)| Stated {
        name: format!("{name}/{window_name}"),
        requests_per_unit: quota.limit.get(),
        window: quota.window,
    });
    let shadow = report.rejected() && !over;
    Status {
        over,
        limit,
        remaining,
        reset_ms,
        headers: headers(limits, report),
        metric: (name.to_string(), code(over, shadow)),
    }
}

fn code(over: bool, shadow: bool) -> &'static str {
    match (over, shadow) {
        (true, _) => "over_limit",
        (false, true) => "shadow",
        (false, false) => "ok",
    }
}

/// The RateLimit headers of a report.
fn headers(limits: &PlanLimits, report: &Report) -> [Option<HeaderValue>; 2] {
    [
        limits.policy_header.clone(),
        rate_headers::state_header_with(report, None),
    ]
}

/// What the binding limit of a report leaves, and when it has room again (refused)
/// or empties.
fn binding(report: &Report) -> (u32, u64) {
    let refusing = report.iter().find(|s| s.retry_ms.is_some());
    let nearest = refusing.or_else(|| report.iter().min_by_key(|s| s.remaining()));
    match nearest {
        Some(status) => (
            status.remaining(),
            status.retry_ms.unwrap_or(status.reset_ms),
        ),
        None => (u32::MAX, 0),
    }
}

/// The binding limit's quota and name.
fn binding_quota(report: &Report) -> Option<(Quota, &'static str)> {
    let refusing = report.iter().find(|s| s.retry_ms.is_some());
    let nearest = refusing.or_else(|| report.iter().min_by_key(|s| s.remaining()));
    nearest.map(|s| (s.quota, s.limit_name()))
}
