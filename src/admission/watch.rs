//! What the status page learns from admission: each refusal by a limit (a 429 of a
//! window or of `per_caller`), and each admission that found one of the caller's
//! windows at or above 80 %, counted in the bounded summaries of
//! `observe::hitters`. A caller's name is made only when the summaries first meet
//! it in their current slot; an admission far from its limits costs one comparison
//! per window.

use super::{Admission, Standing, named};
use crate::config::PolicyId;
use crate::config::route::Route;
use crate::http::refusal::Refusal;
use crate::limit::{LimitStatus, Report};
use crate::observe::hitters::{RefusedBy, near_limit};
use crate::snapshot::Snapshot;
use crate::store::CallerKey;

impl Admission {
    /// Counts a proxied request's refusal by its route's limits.
    pub(super) fn watch_refused(
        &self,
        snapshot: &Snapshot,
        route: &Route,
        standing: Standing<'_>,
        refusal: &Refusal,
    ) {
        let limit = match refusal {
            Refusal::Limited { report, .. } => report.rejecting().next().unwrap_or("limit"),
            // A stacked route's limit names its policy already (`org-month`).
            Refusal::StackLimited(limited) => limited.violated.first().copied().unwrap_or("limit"),
            _ => "concurrency",
        };
        let name = || named::caller_name(snapshot, standing.caller, standing.named);
        let policy = match refusal {
            Refusal::StackLimited(_) => "",
            _ => route.policy.map_or("", |p| snapshot.policy_name(p)),
        };
        self.refused_by(standing.key, standing.now_ms, name, policy, limit);
    }

    /// Counts a refusal of the caller `key` by `policy`'s `limit`.
    pub(super) fn refused_by(
        &self,
        key: CallerKey,
        now_ms: u64,
        name: impl FnOnce() -> String,
        policy: &str,
        limit: &'static str,
    ) {
        self.hitters.refused(key, now_ms, || RefusedBy {
            caller: name().into(),
            policy: policy.into(),
            limit,
        });
    }

    /// Counts an admitted request whose report shows one of the caller's own
    /// windows (not a policy's `total`) at or above 80 % of its limit.
    pub(super) fn watch_near(
        &self,
        snapshot: &Snapshot,
        policy: PolicyId,
        standing: Standing<'_>,
        report: &Report,
    ) {
        let name = || named::caller_name(snapshot, standing.caller, standing.named);
        self.near_by(
            standing.key,
            standing.now_ms,
            name,
            snapshot,
            policy,
            report,
        );
    }

    /// Counts the caller `key` near a limit of `policy` if `report` says it is.
    pub(super) fn near_by(
        &self,
        key: CallerKey,
        now_ms: u64,
        name: impl FnOnce() -> String,
        snapshot: &Snapshot,
        policy: PolicyId,
        report: &Report,
    ) {
        if let Some(status) = fullest(report) {
            let at = (
                snapshot.policy_name(policy),
                status.quota.window.name(),
                status.used,
                status.quota.limit.get(),
            );
            self.hitters.near(key, now_ms, || name().into(), at);
        }
    }

    /// Counts an RLS descriptor an envoy_config rule (or a descriptor's own limit)
    /// counted: refused by `rule`, or admitted near one of its limits. The caller is
    /// named by the descriptor (`rls:domain:key=value,...`, clipped to a caller
    /// name's length); a `[[decision.descriptors]]` policy's descriptor is watched
    /// as `/v1/check`'s callers are.
    pub(super) fn watch_rule(
        &self,
        key: CallerKey,
        now_ms: u64,
        named: (&str, &[(&str, &str)]),
        rule: &str,
        report: &Report,
        refused: bool,
    ) {
        let name = || rule_caller(named.0, named.1);
        let rule = clip(rule, MAX_POLICY_NAME);
        if refused {
            let limit = report.rejecting().next().unwrap_or("limit");
            self.refused_by(key, now_ms, name, rule, limit);
        } else if let Some(status) = fullest(report) {
            let window = status.quota.window.name();
            let at = (rule, window, status.used, status.quota.limit.get());
            self.hitters.near(key, now_ms, || name().into(), at);
        }
    }
}

/// The fullest of a caller's own windows (not a policy's `total`) at or above 80 %
/// of its limit.
fn fullest(report: &Report) -> Option<&LimitStatus> {
    report
        .iter()
        .filter(|s| !s.total && near_limit(s.used, s.quota.limit.get()))
        .max_by_key(|s| u64::from(s.used) * 1_000 / u64::from(s.quota.limit.get()))
}

/// The longest rule name the status page's summaries keep.
const MAX_POLICY_NAME: usize = 64;

/// An RLS descriptor as the status page names its caller.
fn rule_caller(domain: &str, entries: &[(&str, &str)]) -> String {
    let mut name = format!("rls:{domain}:");
    for (i, (key, value)) in entries.iter().enumerate() {
        let comma = if i == 0 { "" } else { "," };
        name.push_str(&format!("{comma}{key}={value}"));
        if name.len() > MAX_CALLER_NAME {
            break;
        }
    }
    clip(&name, MAX_CALLER_NAME).to_string()
}

/// The longest caller name the summaries keep (a consumer's name and its prefix).
const MAX_CALLER_NAME: usize = crate::identity::MAX_NAME_BYTES + 9;

/// `text` cut to at most `max` bytes, on a character boundary.
fn clip(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}
