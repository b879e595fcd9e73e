//! The limiter's hot path allocates nothing: once a tracked caller's counters have
//! grown to their working size, deciding its requests (admitted or refused, windows
//! filling and draining) makes no heap allocation. Counted by a global allocator
//! that tallies the allocations of the calling thread.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use futures_util::FutureExt;
use sluice::limit::{Now, Report, Window, quota};
use sluice::store::{Scope, Store, Verdict};

struct CountingAllocator;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn count_one() {
    // `try_with`: the allocator also runs while thread locals are torn down.
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
}

// SAFETY: every call is forwarded unchanged to the system allocator.
// A global allocator is unsafe code by definition; this one only counts.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_one();
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count_one();
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_one();
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

fn decide(store: &Store, counters: &Scope, caller: u64, ms: u64) -> Verdict {
    let mut report = Report::default();
    let decided = store
        .decide(counters, caller, &Now::sliding(ms), 1, &mut report)
        .now_or_never();
    decided.expect("a memory store decides at once")
}

/// Runs `requests` requests of `callers` callers, one every `step_ms`, from `start_ms`;
/// returns the allocations made and how many requests were admitted and refused.
fn traffic(
    store: &Store,
    counters: &Scope,
    callers: u64,
    requests: u64,
    start_ms: u64,
    step_ms: u64,
) -> (u64, u64, u64) {
    let before = allocations();
    let (mut admitted, mut limited) = (0, 0);
    for i in 0..requests {
        match decide(store, counters, i % callers, start_ms + i * step_ms) {
            Verdict::Admitted => admitted += 1,
            Verdict::Limited => limited += 1,
            other => panic!("request {i}: {other:?}"),
        }
    }
    (allocations() - before, admitted, limited)
}

#[test]
fn a_saturated_exact_window_decides_without_allocating() {
    let store = Store::memory(1_000);
    // Five callers, each sending 150 requests a minute against 100 a minute: the log
    // fills, refuses, and drains as its oldest requests leave the window.
    let counters = store.scope("p", "anonymous", vec![quota(Window::Minute, 100)], &[]);
    let step = 60_000 / 150 / 5;
    let minute = 5 * 150;
    // Two minutes to grow every log to its working size.
    let (_, admitted, limited) = traffic(&store, &counters, 5, 2 * minute, 0, step);
    assert!(
        admitted > 0 && limited > 0,
        "{admitted} admitted, {limited} limited"
    );
    let (allocated, admitted, limited) =
        traffic(&store, &counters, 5, 3 * minute, 2 * minute * step, step);
    assert_eq!(allocated, 0, "allocations in three saturated minutes");
    assert!(admitted >= 3 * 5 * 99, "{admitted} admitted");
    assert!(limited > 0, "{limited} limited");
}

#[test]
fn bucketed_days_and_an_exact_minute_decide_without_allocating() {
    let store = Store::memory(1_000);
    // The memory target's policy: 10 a minute (exact) and 1 000 a day (bucketed).
    let quotas = vec![quota(Window::Minute, 10), quota(Window::Day, 1_000)];
    let counters = store.scope("p", "anonymous", quotas, &[]);
    // Three callers, one request every 20 s each: a run in every day bucket.
    let step = 20_000 / 3;
    let day = 86_400_000 / step;
    let (_, admitted, _) = traffic(&store, &counters, 3, 2 * day, 0, step);
    assert!(admitted > 0);
    let (allocated, admitted, limited) = traffic(&store, &counters, 3, day, 2 * day * step, step);
    assert_eq!(allocated, 0, "allocations in a day of steady traffic");
    assert!(
        admitted > 0 && limited > 0,
        "{admitted} admitted, {limited} limited"
    );
}

#[test]
fn a_policy_total_decides_without_allocating() {
    let store = Store::memory(1_000);
    let counters = store.scope(
        "p",
        "anonymous",
        vec![quota(Window::Second, 50)],
        &[quota(Window::Second, 120)],
    );
    // Twenty callers at 200 requests a second in all: the total refuses the excess.
    let (_, admitted, _) = traffic(&store, &counters, 20, 1_000, 0, 5);
    assert!(admitted > 0);
    let (allocated, admitted, limited) = traffic(&store, &counters, 20, 2_000, 5_000, 5);
    assert_eq!(allocated, 0, "allocations in ten seconds over the total");
    assert!(
        admitted >= 1_100 && limited > 0,
        "{admitted} admitted, {limited} limited"
    );
}
