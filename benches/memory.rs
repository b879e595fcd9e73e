//! Bytes per tracked caller: process RSS growth while 1 000 000 callers make one
//! request each under a policy with two limits (per_minute = 10, per_day = 1000),
//! divided by the number of callers. Includes the hash tables' own overhead (control
//! bytes, empty slots at the load factor) and the allocator's.
//!
//! A second line measures busy callers the same way: 100 000 callers that each used
//! all of a per_minute = 100 limit (an exact log of 100 requests). A third measures
//! the first's callers under a policy that also sells billing periods (per_month =
//! 10 000, per_year = 100 000): what the two calendar windows add per caller. A
//! fourth measures keyed buckets (a policy with `key`, such as an organisation's
//! budget) under the first's policy with their key parts kept for the usage export
//! (`header:x-org=org-0000001&header:x-team=team-1`): what the side table adds per
//! bucket over the first line's, which a policy without `key` never pays.
//!
//! The allocator is the binary's (mimalloc), and RSS is read after it has returned
//! what it would return to the system shortly anyway (`mi_collect`): the freed halves
//! of tables that grew, which it otherwise keeps for a while.
//!
//! Run: `cargo bench --bench memory` (`CALLERS=N`, `BUSY_CALLERS=N` change the counts).

#![allow(clippy::unwrap_used)] // a benchmark fails by panicking

use futures_util::FutureExt;
use sluice::limit::{Anchor, Now, Report, Window, period, quota};
use sluice::store::{Scope, Store, Verdict};

/// The allocator the `sluice` binary uses, built with the same setting (see
/// `src/allocator.rs`), so its overhead is the one measured.
#[global_allocator]
static ALLOCATOR: allocator::Mimalloc = allocator::Mimalloc;

#[path = "../src/allocator.rs"]
#[allow(unsafe_code)]
mod allocator;

fn rss_bytes() -> u64 {
    // SAFETY: mi_collect only frees and purges the allocator's own free memory.
    #[allow(unsafe_code)]
    unsafe {
        libmimalloc_sys::mi_collect(true)
    };
    let statm = std::fs::read_to_string("/proc/self/statm").expect("linux /proc");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("statm has a resident field");
    pages * 4096
}

fn count_from_env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    // `cargo bench` passes --bench; nothing else to parse.
    one_request_each(count_from_env("CALLERS", 1_000_000));
    busy(count_from_env("BUSY_CALLERS", 100_000));
    with_periods(count_from_env("CALLERS", 1_000_000));
    keyed(count_from_env("CALLERS", 1_000_000));
}

fn keyed(buckets: u64) {
    let store = Store::memory(buckets as usize * 2);
    let counters = store.scope(
        "org",
        "anonymous",
        vec![quota(Window::Minute, 10), quota(Window::Day, 1_000)],
        &[],
    );
    let now = Now::sliding(1_763_700_000_000);
    let what = "keyed buckets with their parts";
    print_growth(what, &store, buckets, || {
        for bucket in 0..buckets {
            // A digest, as a keyed bucket's key is.
            let key = bucket.wrapping_mul(0x9e37_79b9_7f4a_7c15) | (1 << 63);
            admit_key(&store, &counters, key, &now);
            let parts = || {
                format!(
                    "header:x-org=org-{bucket:07}&header:x-team=team-{}",
                    bucket % 10
                )
            };
            store.name(&counters, key, now.ms, parts);
        }
    });
}

fn with_periods(callers: u64) {
    let store = Store::memory(callers as usize * 2);
    let counters = store.scope(
        "monthly",
        "anonymous",
        vec![
            quota(Window::Minute, 10),
            quota(Window::Day, 1_000),
            quota(Window::Month, 10_000),
            quota(Window::Year, 100_000),
        ],
        &[],
    );
    let ms = 1_763_700_000_000;
    let periods = period::periods(&jiff::tz::TimeZone::UTC, Anchor::CALENDAR, ms);
    let now = Now::sliding(ms).with_periods(periods);
    let what = "callers with per_month and per_year too";
    print_growth(what, &store, callers, || {
        for caller in 0..callers {
            admit(&store, &counters, caller, &now);
        }
    });
}

fn one_request_each(callers: u64) {
    let store = Store::memory(callers as usize * 2);
    let counters = store.scope(
        "standard",
        "anonymous",
        vec![quota(Window::Minute, 10), quota(Window::Day, 1_000)],
        &[],
    );
    let now = Now::sliding(1_763_700_000_000);
    print_growth("callers", &store, callers, || {
        for caller in 0..callers {
            admit(&store, &counters, caller, &now);
        }
    });
}

fn busy(callers: u64) {
    const LIMIT: u32 = 100;
    let store = Store::memory(callers as usize * 2);
    let counters = store.scope("busy", "anonymous", vec![quota(Window::Minute, LIMIT)], &[]);
    let start = 1_763_700_000_000;
    let what = format!("busy callers ({LIMIT} requests each in an exact per_minute = {LIMIT})");
    print_growth(&what, &store, callers, || {
        for caller in 0..callers {
            for i in 0..u64::from(LIMIT) {
                admit(&store, &counters, caller, &Now::sliding(start + i * 100));
            }
        }
    });
}

/// One request of caller number `caller` (an IPv4-style key, as anonymous callers
/// have), which must be admitted.
fn admit(store: &Store, counters: &Scope, caller: u64, now: &Now) {
    admit_key(store, counters, (0xffff << 32) | caller, now);
}

/// One request counted under limiter key `key`, which must be admitted.
fn admit_key(store: &Store, counters: &Scope, key: u64, now: &Now) {
    let mut report = Report::default();
    let verdict = store
        .decide(counters, key, now, 1, &mut report)
        .now_or_never();
    let verdict = verdict.expect("a memory store decides at once");
    assert_eq!(verdict, Verdict::Admitted);
}

/// Runs `fill`, which must leave `callers` callers tracked, and prints the process's
/// RSS growth per caller.
fn print_growth(what: &str, store: &Store, callers: u64, fill: impl FnOnce()) {
    let before = rss_bytes();
    fill();
    let after = rss_bytes();
    assert_eq!(store.tracked(), callers as usize);
    let per_caller = (after - before) as f64 / callers as f64;
    println!(
        "memory: {callers} {what}, RSS +{:.1} MiB, {per_caller:.1} bytes per caller",
        (after - before) as f64 / (1 << 20) as f64
    );
}
