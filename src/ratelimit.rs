//! The `RateLimit-Policy` and `RateLimit` response headers
//! (draft-ietf-httpapi-ratelimit-headers), serialised as RFC 8941 lists with `sfv`.
//!
//! ```text
//! RateLimit-Policy: "minute";q=100;w=60, "day";q=100000;w=86400
//! RateLimit: "minute";r=42;t=17, "day";r=99012;t=3600
//! ```
//!
//! `q` is the quota, `w` the window in seconds, `r` what remains and `t` the seconds
//! until the oldest counted request leaves the window (quota starts coming back).
//! This module only formats; the numbers come from the limiter's [`Report`].

use http::HeaderValue;
use sfv::{Integer, ListSerializer, key_ref};

use crate::limit::{LimitStatus, Quota, Report};

/// Seconds, rounded up: a client that waits this long is never early.
pub fn ceil_secs(ms: u64) -> u64 {
    ms.div_ceil(1_000)
}

fn int(value: u64) -> Integer {
    Integer::try_from(value.min(999_999_999_999_999) as i64).unwrap_or(Integer::ZERO)
}

fn name(quota: &Quota, total: bool) -> &'static str {
    if total {
        quota.window.total_name()
    } else {
        quota.window.name()
    }
}

/// `RateLimit-Policy` for these quotas (fixed per route and plan, so callers cache it).
pub fn policy_header<'a>(
    quotas: impl IntoIterator<Item = (&'a Quota, bool)>,
) -> Option<HeaderValue> {
    let mut list = ListSerializer::new();
    for (quota, total) in quotas {
        let item_name = sfv::StringRef::from_str(name(quota, total)).ok()?;
        list.bare_item(item_name)
            .parameter(key_ref("q"), int(u64::from(quota.limit.get())))
            .parameter(key_ref("w"), int(quota.window.length_ms() / 1_000));
    }
    HeaderValue::try_from(list.finish()?).ok()
}

/// Which statuses of a report the headers show: the caller's own limits, plus any
/// `total` limit that rejected the request.
pub fn shown(report: &Report) -> impl Iterator<Item = &LimitStatus> {
    report.iter().filter(|s| !s.total || s.retry_ms.is_some())
}

/// `RateLimit` for the statuses of a decided request.
pub fn state_header(report: &Report) -> Option<HeaderValue> {
    let mut list = ListSerializer::new();
    for status in shown(report) {
        let item_name = sfv::StringRef::from_str(name(&status.quota, status.total)).ok()?;
        let t = status.retry_ms.unwrap_or(status.reset_ms);
        list.bare_item(item_name)
            .parameter(key_ref("r"), int(u64::from(status.remaining())))
            .parameter(key_ref("t"), int(ceil_secs(t)));
    }
    HeaderValue::try_from(list.finish()?).ok()
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use super::*;
    use crate::limit::Window;

    fn quota(window: Window, limit: u32) -> Quota {
        Quota {
            window,
            limit: NonZeroU32::new(limit).unwrap(),
        }
    }

    #[test]
    fn renders_the_documented_form() {
        let minute = quota(Window::Minute, 100);
        let day = quota(Window::Day, 100_000);
        let policy = policy_header([(&minute, false), (&day, false)]).unwrap();
        assert_eq!(policy, "\"minute\";q=100;w=60, \"day\";q=100000;w=86400");

        let mut report = Report::default();
        report.push(LimitStatus {
            quota: minute,
            total: false,
            used: 58,
            reset_ms: 16_001,
            retry_ms: None,
        });
        report.push(LimitStatus {
            quota: day,
            total: false,
            used: 988,
            reset_ms: 3_600_000,
            retry_ms: None,
        });
        report.push(LimitStatus {
            quota: quota(Window::Second, 5),
            total: true,
            used: 1,
            reset_ms: 5,
            retry_ms: None,
        });
        assert_eq!(
            state_header(&report).unwrap(),
            "\"minute\";r=42;t=17, \"day\";r=99012;t=3600"
        );
    }

    #[test]
    fn a_rejecting_total_is_shown() {
        let mut report = Report::default();
        report.push(LimitStatus {
            quota: quota(Window::Second, 5),
            total: true,
            used: 5,
            reset_ms: 300,
            retry_ms: Some(300),
        });
        assert_eq!(state_header(&report).unwrap(), "\"total-second\";r=0;t=1");
    }
}
