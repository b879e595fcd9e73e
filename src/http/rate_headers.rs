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
//! `RateLimit-Policy` is built once per snapshot with `sfv`; `RateLimit` changes with
//! every response, so it is written directly: its item names are fixed tokens and
//! its parameters integers, and the tests check that `sfv` parses it back.

use std::cell::RefCell;

use http::{HeaderMap, HeaderName, HeaderValue};
use sfv::{Integer, ListSerializer, key_ref};

use crate::limit::{LimitStatus, Quota, Report};

/// The header that carries [`policy_header`].
pub(crate) static POLICY_HEADER: HeaderName = HeaderName::from_static("ratelimit-policy");
/// The header that carries [`state_header_with`].
pub(crate) static STATE_HEADER: HeaderName = HeaderName::from_static("ratelimit");

/// Seconds, rounded up: a client that waits this long is never early.
pub(crate) fn ceil_secs(ms: u64) -> u64 {
    ms.div_ceil(1_000)
}

fn int(value: u64) -> Integer {
    Integer::try_from(value.min(MAX_INTEGER) as i64).unwrap_or(Integer::ZERO)
}

fn name(quota: &Quota, total: bool) -> &'static str {
    if total {
        quota.window.total_name()
    } else {
        quota.window.name()
    }
}

/// The policy item of a per-caller concurrency cap: `"concurrency";q=N;qu=...`.
const CONCURRENCY: &str = "concurrency";
/// The draft's quota unit for requests in flight at once.
const CONCURRENT_REQUESTS: &str = "concurrent-requests";

/// `RateLimit-Policy` for these quotas, and for a per-caller concurrency cap of
/// `concurrency` requests in flight (fixed per route and plan, so callers cache it).
pub(crate) fn policy_header<'a>(
    quotas: impl IntoIterator<Item = (&'a Quota, bool)>,
    concurrency: Option<u32>,
) -> Option<HeaderValue> {
    let mut list = ListSerializer::new();
    for (quota, total) in quotas {
        let item_name = sfv::StringRef::from_str(name(quota, total)).ok()?;
        list.bare_item(item_name)
            .parameter(key_ref("q"), int(u64::from(quota.limit.get())))
            .parameter(key_ref("w"), int(quota.window.length_ms() / 1_000));
    }
    if let Some(limit) = concurrency {
        let unit = sfv::StringRef::from_str(CONCURRENT_REQUESTS).ok()?;
        list.bare_item(sfv::StringRef::from_str(CONCURRENCY).ok()?)
            .parameter(key_ref("q"), int(u64::from(limit)))
            .parameter(key_ref("qu"), unit);
    }
    HeaderValue::try_from(list.finish()?).ok()
}

/// The name of a limit of a stacked route's policy, as its headers and refusals call
/// it: the policy's name and the limit's (`"org-month"`, `"per_key-total-minute"`).
/// Interned: made once per name a config ever holds (when a snapshot is built), so
/// a refusal names it without allocating, as it names a single policy's limits.
pub(crate) fn stacked_name(policy: &str, limit: &str) -> &'static str {
    static NAMES: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());
    let name = format!("{policy}-{limit}");
    let mut names = NAMES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(&known) = names.iter().find(|known| **known == name) {
        return known;
    }
    let interned: &'static str = Box::leak(name.into_boxed_str());
    names.push(interned);
    interned
}

/// `RateLimit-Policy` for the quotas of one policy of a stacked route, each named
/// by `names` (from [`stacked_name`]).
pub(crate) fn stacked_policy_header<'a>(
    quotas: impl IntoIterator<Item = &'a Quota>,
    names: &[&'static str],
) -> Option<HeaderValue> {
    let mut list = ListSerializer::new();
    for (quota, name) in quotas.into_iter().zip(names) {
        let item_name = sfv::StringRef::from_str(name).ok()?;
        list.bare_item(item_name)
            .parameter(key_ref("q"), int(u64::from(quota.limit.get())))
            .parameter(key_ref("w"), int(quota.window.length_ms() / 1_000));
    }
    HeaderValue::try_from(list.finish()?).ok()
}

/// The headers of a stacked route's policies, joined in order: each part's
/// `RateLimit-Policy`, and `RateLimit` for each part's report, its statuses named
/// by the part's names (plan quotas, then total quotas, as the report holds them).
pub(crate) fn stacked_headers<'r>(
    parts: impl IntoIterator<Item = (Option<&'r HeaderValue>, &'r [&'static str], &'r Report)>,
    concurrency: Option<u32>,
) -> (Option<HeaderValue>, Option<HeaderValue>) {
    let (mut policy, mut state) = (Vec::with_capacity(128), Vec::with_capacity(128));
    for (header, names, report) in parts {
        if let Some(header) = header {
            if !policy.is_empty() {
                policy.extend_from_slice(b", ");
            }
            policy.extend_from_slice(header.as_bytes());
        }
        let statuses = report.iter().zip(names);
        for (status, name) in statuses.filter(|(s, _)| !s.total || s.retry_ms.is_some()) {
            if !state.is_empty() {
                state.extend_from_slice(b", ");
            }
            let t = status.retry_ms.unwrap_or(status.reset_ms);
            state.push(b'"');
            state.extend_from_slice(name.as_bytes());
            state.extend_from_slice(b"\";r=");
            put_int(&mut state, u64::from(status.remaining()));
            state.extend_from_slice(b";t=");
            put_int(&mut state, ceil_secs(t));
        }
    }
    if let Some(remaining) = concurrency {
        if !state.is_empty() {
            state.extend_from_slice(b", ");
        }
        state.extend_from_slice(b"\"concurrency\";r=");
        put_int(&mut state, u64::from(remaining));
    }
    let value = |text: Vec<u8>| match text.is_empty() {
        true => None,
        false => HeaderValue::from_maybe_shared(bytes::Bytes::from(text)).ok(),
    };
    (value(policy), value(state))
}

/// Which statuses of a report the headers show: the caller's own limits, plus any
/// `total` limit that rejected the request.
pub(crate) fn shown(report: &Report) -> impl Iterator<Item = &LimitStatus> {
    report.iter().filter(|s| !s.total || s.retry_ms.is_some())
}

/// `RateLimit` for the statuses of a decided request and, with a per-caller
/// concurrency cap, the requests the caller may still start now.
pub(crate) fn state_header_with(report: &Report, concurrency: Option<u32>) -> Option<HeaderValue> {
    let mut text = Vec::with_capacity(64);
    write_state(&mut text, report, concurrency);
    if text.is_empty() {
        return None;
    }
    HeaderValue::from_maybe_shared(bytes::Bytes::from(text)).ok()
}

/// `RateLimit` of a refused request, as [`state_header_with`] writes it. A caller
/// hammering past its limit is told the same thing for a second at a time, so the
/// last value made on this thread is shared when the next is the same, rather than
/// allocated again.
pub(crate) fn refused_state_header(
    report: &Report,
    concurrency: Option<u32>,
) -> Option<HeaderValue> {
    thread_local! {
        /// A buffer to write into, and the last value made from it.
        static LAST: RefCell<(Vec<u8>, Option<HeaderValue>)> =
            const { RefCell::new((Vec::new(), None)) };
    }
    LAST.with_borrow_mut(|(text, last)| {
        text.clear();
        write_state(text, report, concurrency);
        if text.is_empty() {
            return None;
        }
        if let Some(made) = last
            .as_ref()
            .filter(|made| made.as_bytes() == text.as_slice())
        {
            return Some(made.clone());
        }
        let made = HeaderValue::from_maybe_shared(bytes::Bytes::copy_from_slice(text)).ok()?;
        *last = Some(made.clone());
        Some(made)
    })
}

/// The items of `RateLimit`: each shown status, then the concurrency cap's.
#[inline(always)]
fn write_state(text: &mut Vec<u8>, report: &Report, concurrency: Option<u32>) {
    for status in shown(report) {
        if !text.is_empty() {
            text.extend_from_slice(b", ");
        }
        let t = status.retry_ms.unwrap_or(status.reset_ms);
        text.push(b'"');
        text.extend_from_slice(name(&status.quota, status.total).as_bytes());
        text.extend_from_slice(b"\";r=");
        put_int(text, u64::from(status.remaining()));
        text.extend_from_slice(b";t=");
        put_int(text, ceil_secs(t));
    }
    if let Some(remaining) = concurrency {
        if !text.is_empty() {
            text.extend_from_slice(b", ");
        }
        text.extend_from_slice(b"\"concurrency\";r=");
        put_int(text, u64::from(remaining));
    }
}

/// `Retry-After` (or any count of seconds) as a header value; up to 99 without
/// allocating, which covers every refusal by a per-second or per-minute limit.
pub(crate) fn seconds_header(secs: u64) -> HeaderValue {
    match secs {
        0..10 => HeaderValue::from_static(&SECONDS[2 * secs as usize + 1..2 * secs as usize + 2]),
        10..100 => HeaderValue::from_static(&SECONDS[2 * secs as usize..2 * secs as usize + 2]),
        _ => HeaderValue::from(secs),
    }
}

/// "00" to "99", two digits each.
static SECONDS: &str = match std::str::from_utf8(&two_digits()) {
    Ok(text) => text,
    Err(_) => panic!("digits are ASCII"),
};

const fn two_digits() -> [u8; 200] {
    let mut text = [0; 200];
    let mut i = 0;
    while i < 100 {
        text[2 * i] = b'0' + (i / 10) as u8;
        text[2 * i + 1] = b'0' + (i % 10) as u8;
        i += 1;
    }
    text
}

/// Adds `RateLimit-Policy` (pre-rendered per route and plan) and `RateLimit` for a
/// decided request (`concurrency`: what a per-caller cap leaves the caller).
pub(crate) fn add_headers(
    headers: &mut HeaderMap,
    policy: Option<&HeaderValue>,
    report: &Report,
    concurrency: Option<u32>,
) {
    if let Some(policy) = policy {
        headers.insert(&POLICY_HEADER, policy.clone());
    }
    if let Some(state) = state_header_with(report, concurrency) {
        headers.insert(&STATE_HEADER, state);
    }
}

/// A structured-field integer (at most 15 digits) in decimal.
fn put_int(text: &mut Vec<u8>, value: u64) {
    let mut digits = itoa::Buffer::new();
    text.extend_from_slice(digits.format(value.min(MAX_INTEGER)).as_bytes());
}

/// The largest integer a structured field can carry (RFC 8941 section 3.3.1).
const MAX_INTEGER: u64 = 999_999_999_999_999;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{Window, quota};

    #[test]
    fn seconds_are_plain_decimals_from_the_table_and_beyond_it() {
        for secs in [0, 1, 7, 9, 10, 42, 59, 60, 99, 100, 3_600, 86_400] {
            assert_eq!(seconds_header(secs), secs.to_string().as_str(), "{secs}");
        }
    }

    #[test]
    fn renders_the_documented_form() {
        let minute = quota(Window::Minute, 100);
        let day = quota(Window::Day, 100_000);
        let policy = policy_header([(&minute, false), (&day, false)], None).unwrap();
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
            state_header_with(&report, None).unwrap(),
            "\"minute\";r=42;t=17, \"day\";r=99012;t=3600"
        );
    }

    #[test]
    fn a_refused_state_header_is_the_same_text_and_shared_when_repeated() {
        let refused = |used: u32, retry_ms: u64| {
            let mut report = Report::default();
            report.push(LimitStatus {
                quota: quota(Window::Minute, 1),
                total: false,
                used,
                reset_ms: 60_000,
                retry_ms: Some(retry_ms),
            });
            report
        };
        for concurrency in [None, Some(0)] {
            let report = refused(1, 41_500);
            let first = refused_state_header(&report, concurrency).unwrap();
            assert_eq!(first, state_header_with(&report, concurrency).unwrap());
            let again = refused_state_header(&report, concurrency).unwrap();
            assert_eq!(first.as_bytes().as_ptr(), again.as_bytes().as_ptr());
            let later = refused(1, 40_500);
            let other = refused_state_header(&later, concurrency).unwrap();
            assert_eq!(other, state_header_with(&later, concurrency).unwrap());
            assert_ne!(other, first);
        }
    }

    #[test]
    fn every_state_header_is_a_structured_list_that_sfv_reads_back() {
        for window in Window::ALL {
            for total in [false, true] {
                let mut report = Report::default();
                report.push(LimitStatus {
                    quota: quota(window, u32::MAX),
                    total,
                    used: 7,
                    reset_ms: u64::MAX,
                    retry_ms: total.then_some(1),
                });
                let header = state_header_with(&report, None).unwrap();
                let list = sfv::Parser::new(header.as_bytes())
                    .parse::<sfv::List>()
                    .unwrap();
                let [sfv::ListEntry::Item(item)] = list.as_slice() else {
                    panic!("one item expected in {header:?}");
                };
                let expected = if total {
                    window.total_name()
                } else {
                    window.name()
                };
                assert_eq!(item.bare_item.as_string().unwrap().as_str(), expected);
                let r = item.params.get("r").and_then(|v| v.as_integer()).unwrap();
                assert_eq!(i64::from(r), i64::from(u32::MAX - 7));
                let t = item.params.get("t").and_then(|v| v.as_integer()).unwrap();
                let t_expected = if total { 1 } else { MAX_INTEGER as i64 };
                assert_eq!(i64::from(t), t_expected);
            }
        }
    }

    #[test]
    fn a_per_caller_cap_is_an_item_in_concurrent_requests() {
        let minute = quota(Window::Minute, 5);
        let policy = policy_header([(&minute, false)], Some(2)).unwrap();
        assert_eq!(
            policy,
            "\"minute\";q=5;w=60, \"concurrency\";q=2;qu=\"concurrent-requests\""
        );
        let mut report = Report::default();
        report.push(LimitStatus {
            quota: minute,
            total: false,
            used: 1,
            reset_ms: 60_000,
            retry_ms: None,
        });
        let state = state_header_with(&report, Some(0)).unwrap();
        assert_eq!(state, "\"minute\";r=4;t=60, \"concurrency\";r=0");
        // Both parse as structured lists, and a cap alone is a header on its own.
        for header in [
            &policy,
            &state,
            &state_header_with(&Report::default(), Some(1)).unwrap(),
        ] {
            sfv::Parser::new(header.as_bytes())
                .parse::<sfv::List>()
                .unwrap_or_else(|e| panic!("{header:?}: {e}"));
        }
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
        assert_eq!(
            state_header_with(&report, None).unwrap(),
            "\"total-second\";r=0;t=1"
        );
    }
}
