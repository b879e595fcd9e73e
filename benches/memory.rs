//! Bytes per tracked caller: process RSS growth while 1 000 000 callers make one
//! request each under a policy with two limits (per_minute = 10, per_day = 1000),
//! divided by the number of callers. Includes the hash tables' own overhead (control
//! bytes, empty slots at the load factor) and the allocator's.
//!
//! Run: `cargo bench --bench memory` (prints one line; `CALLERS=N` to change the count).

use std::num::NonZeroU32;

use sluice::limit::{Now, Quota, Report, Window};
use sluice::store::{Store, Verdict};

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("linux /proc");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("statm has a resident field");
    pages * 4096
}

fn main() {
    // `cargo bench` passes --bench; nothing else to parse.
    let callers: u64 = std::env::var("CALLERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let quota = |window, limit| Quota {
        window,
        limit: NonZeroU32::new(limit).expect("non-zero"),
    };
    let store = Store::memory(callers as usize * 2);
    let counters = store.counters(
        "standard",
        "anonymous",
        vec![quota(Window::Minute, 10), quota(Window::Day, 1_000)],
        &[],
    );
    let now = Now::sliding(1_763_700_000_000);
    let before = rss_bytes();
    for caller in 0..callers {
        // IPv4-style keys, as anonymous callers have.
        let key = (0xffff << 32) | caller;
        let mut report = Report::default();
        let verdict = store.local().decide(&counters, key, &now, 1, &mut report);
        assert_eq!(verdict, Verdict::Admitted);
    }
    let after = rss_bytes();
    assert_eq!(store.tracked(), callers as usize);
    let per_caller = (after - before) as f64 / callers as f64;
    println!(
        "memory: {callers} callers, RSS +{:.1} MiB, {per_caller:.1} bytes per caller",
        (after - before) as f64 / (1 << 20) as f64
    );
}
