//! One behavioural suite, run against every store.
//!
//! Each behaviour is a function taking a [`Store`]; the [`suite!`] macro turns it into
//! a pair of tests, `memory::<behaviour>` and `redis::<behaviour>`, so the memory
//! store and the Redis store are held to literally the same assertions. The Redis
//! tests start their own `redis-server` (see `redis_server`) and use
//! `on_error = "deny"` with a generous timeout: a decision that did not come from
//! Redis shows up as `Unavailable`, and every test also checks afterwards that the
//! store counted no error and never fell back.
//!
//! Each behaviour also gets the [`Time`] it runs in. The memory store is handed every
//! instant, so its time is a manual clock that [`Time::pass`] moves at once: its
//! tests never sleep. Redis decides with its own clock (`TIME`), so its time is the
//! wall clock, `pass` sleeps, and windows that must pass are per-second ones.

use crate::support::redis_server;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis_server::RedisServer;
use sluice::config::{Backend, OnError, StoreConfig};
use sluice::limit::{LimitStatus, Now, Quota, Report, Window, quota};
use sluice::store::{CallerKey, Scope, Stacked, Store, Verdict};

// ---- the two stores -----------------------------------------------------------

/// A store under test, the time it runs in, and the Redis server it needs kept alive.
struct Subject {
    store: Store,
    time: Time,
    _server: Option<RedisServer>,
}

fn memory() -> Subject {
    Subject {
        store: Store::memory(100_000),
        time: Time::Manual(Arc::new(AtomicU64::new(crate::support::t0()))),
        _server: None,
    }
}

fn redis() -> Subject {
    let server = RedisServer::start();
    let config = StoreConfig {
        backend: Backend::Redis {
            target: sluice::config::RedisTarget::Server(server.url()),
            // Fail closed and wait long: a decision that does not come from Redis
            // is Unavailable, never a silent local one.
            on_error: OnError::Deny,
            timeout: Duration::from_secs(2),
            ca_file: None,
            wait_replicas: 0,
        },
        max_keys: 100_000,
        state_file: None,
    };
    let store = Store::open(&config, wall_ms()).expect("a redis store");
    assert_eq!(store.backend(), "redis");
    Subject {
        store,
        time: Time::Wall,
        _server: Some(server),
    }
}

/// Runs `behaviour` on the subject's store, then checks that the store never had
/// to fall back (so every decision really came from it).
async fn run<F, Fut>(subject: Subject, behaviour: F)
where
    F: FnOnce(Store, Time) -> Fut,
    Fut: Future<Output = ()>,
{
    let outcome = tokio::time::timeout(
        Duration::from_secs(20),
        behaviour(subject.store.clone(), subject.time.clone()),
    );
    outcome.await.expect("the behaviour took longer than 20 s");
    assert_eq!(
        subject.store.errors(),
        0,
        "the store had errors: some decisions did not come from it"
    );
    assert!(!subject.store.in_fallback(), "the store is in fallback");
}

/// `suite!(a, b)` = tests `memory::a`, `memory::b`, `redis::a`, `redis::b`.
macro_rules! suite {
    ($($behaviour:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test]
                async fn $behaviour() {
                    super::run(super::memory(), super::$behaviour).await;
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test]
                async fn $behaviour() {
                    super::run(super::redis(), super::$behaviour).await;
                }
            )*
        }
    };
}

suite!(
    a_burst_admits_exactly_the_limit_then_says_when_to_retry,
    a_bucketed_limit_admits_exactly_the_limit,
    a_request_refused_by_one_window_consumes_none_of_the_others,
    a_request_refused_by_the_total_consumes_none_of_the_callers_plan,
    a_request_refused_by_the_plan_consumes_none_of_the_total,
    the_total_counts_every_caller_together,
    callers_have_separate_budgets,
    a_cost_consumes_that_many_and_an_unaffordable_cost_consumes_nothing,
    a_larger_cost_is_told_its_own_wait_even_right_after_a_refusal,
    reset_forgets_a_caller_and_only_that_caller,
    a_per_second_window_frees_up_after_a_second,
    a_sliding_window_frees_each_request_a_window_after_it_was_made,
    a_calendar_day_counts_until_local_midnight,
    a_billing_month_counts_exactly_until_the_anchor_day_and_refunds,
    reports_match_the_memory_store_decision_for_decision,
    concurrent_callers_sharing_a_total_get_exactly_their_budgets,
    a_refund_gives_back_what_the_request_took_in_every_window_and_the_total,
    a_late_refund_takes_back_its_own_request_not_a_newer_one,
    a_refund_frees_a_caller_the_memo_remembered_as_refused,
    a_charge_counts_past_the_limit_and_refuses_until_the_debt_is_paid_back,
    a_stacked_decision_counts_in_every_scope_or_in_none,
    a_stacked_shadow_scope_refuses_nothing_and_is_not_charged_when_over,
    a_stacked_refund_gives_back_in_every_scope,
    a_credit_takes_off_the_current_periods_only_and_never_below_zero,
    a_give_back_takes_the_newest_counts_everywhere_and_never_below_zero,
);

// ---- helpers ----------------------------------------------------------------------

fn wall_ms() -> u64 {
    sluice::clock::Clock::system().now_ms()
}

/// The time a behaviour runs in: a manual clock for the memory store, the wall
/// clock for Redis (which decides with its own `TIME`).
#[derive(Clone)]
enum Time {
    Manual(Arc<AtomicU64>),
    Wall,
}

impl Time {
    fn now_ms(&self) -> u64 {
        match self {
            Time::Manual(ms) => ms.load(Ordering::SeqCst),
            Time::Wall => wall_ms(),
        }
    }

    fn now(&self) -> Now {
        Now::sliding(self.now_ms())
    }

    /// Milliseconds since `earlier` (a [`Time::now_ms`]).
    fn since(&self, earlier: u64) -> u64 {
        self.now_ms().saturating_sub(earlier)
    }

    /// Lets `span` pass: at once on the manual clock, asleep on the wall clock.
    async fn pass(&self, span: Duration) {
        match self {
            Time::Manual(ms) => {
                ms.fetch_add(span.as_millis() as u64, Ordering::SeqCst);
            }
            Time::Wall => tokio::time::sleep(span).await,
        }
    }

    /// Lets time pass until `ms` (a [`Time::now_ms`]), if it is still ahead.
    async fn until(&self, ms: u64) {
        let ahead = ms.saturating_sub(self.now_ms());
        self.pass(Duration::from_millis(ahead)).await;
    }
}

const A: CallerKey = 0xffff_7f00_0001;
const B: CallerKey = 0xffff_7f00_0002;
const C: CallerKey = 0xffff_7f00_0003;
const D: CallerKey = 0xffff_7f00_0004;

async fn decide_at(
    store: &Store,
    counters: &Scope,
    caller: CallerKey,
    at: &Now,
    cost: u32,
) -> (Verdict, Report) {
    let mut report = Report::default();
    let verdict = store.decide(counters, caller, at, cost, &mut report).await;
    (verdict, report)
}

async fn decide(
    time: &Time,
    store: &Store,
    counters: &Scope,
    caller: CallerKey,
    cost: u32,
) -> (Verdict, Report) {
    decide_at(store, counters, caller, &time.now(), cost).await
}

/// The status of `window` (plan or total) in `report`.
#[track_caller]
fn status(report: &Report, window: Window, total: bool) -> LimitStatus {
    *report
        .iter()
        .find(|s| s.quota.window == window && s.total == total)
        .unwrap_or_else(|| panic!("no {window:?} (total: {total}) status in {report:?}"))
}

/// Decides a request of `caller` that must be refused; the wait (ms) its plan's
/// `window` quota tells.
async fn refused_wait(
    time: &Time,
    store: &Store,
    counters: &Scope,
    caller: CallerKey,
    cost: u32,
    window: Window,
) -> u64 {
    let (verdict, report) = decide(time, store, counters, caller, cost).await;
    assert_eq!(
        verdict,
        Verdict::Limited,
        "caller {caller:x}, cost {cost}: {report:?}"
    );
    status(&report, window, false)
        .retry_ms
        .unwrap_or_else(|| panic!("no retry_ms for {window:?} in {report:?}"))
}

/// Admits `n` requests of `caller`, each of cost 1.
async fn admit_n(time: &Time, store: &Store, counters: &Scope, caller: CallerKey, n: u32) {
    for i in 0..n {
        let (verdict, report) = decide(time, store, counters, caller, 1).await;
        assert_eq!(
            verdict,
            Verdict::Admitted,
            "request {} of {n} of caller {caller:x}: {report:?}",
            i + 1
        );
    }
}

// ---- behaviours -----------------------------------------------------------------

async fn a_charge_counts_past_the_limit_and_refuses_until_the_debt_is_paid_back(
    store: Store,
    time: Time,
) {
    // An exact second, a bucketed hour and a total: a cost learnt after the answer
    // counts in every one of them, even past a limit (debt).
    let scope = store.scope(
        "charges",
        "anonymous",
        vec![quota(Window::Second, 3), quota(Window::Hour, 500)],
        &[quota(Window::Minute, 10)],
    );
    admit_n(&time, &store, &scope, A, 1).await;
    store.charge(&scope, A, &time.now(), 5).await;
    let mut report = Report::default();
    store.peek(&scope, A, &time.now(), &mut report).await;
    assert_eq!(status(&report, Window::Second, false).used, 6, "{report:?}");
    assert_eq!(status(&report, Window::Hour, false).used, 6, "{report:?}");
    // In debt: refused, and told to wait no longer than the second.
    let wait = refused_wait(&time, &store, &scope, A, 1, Window::Second).await;
    assert!((1..=1_000).contains(&wait), "wait {wait} ms");
    // The total counted the charge too: 4 of 10 left for everyone else.
    let (verdict, report) = decide(&time, &store, &scope, B, 3).await;
    assert_eq!(verdict, Verdict::Admitted, "{report:?}");
    // (A store reports what was counted before the request it admits.)
    assert_eq!(status(&report, Window::Minute, true).used, 6, "{report:?}");
    let (verdict, report) = decide(&time, &store, &scope, C, 2).await;
    assert_eq!(verdict, Verdict::Limited, "9 of 10 used: {report:?}");
    // A second later the debt has left the second window (not the hour).
    time.pass(Duration::from_millis(1_050)).await;
    let (verdict, report) = decide(&time, &store, &scope, A, 1).await;
    assert_eq!(verdict, Verdict::Admitted, "{report:?}");
    assert_eq!(status(&report, Window::Hour, false).used, 6, "{report:?}");
}

async fn a_refund_gives_back_what_the_request_took_in_every_window_and_the_total(
    store: Store,
    time: Time,
) {
    // An exact minute, a bucketed hour, and a total: a request refused after it was
    // admitted (the concurrency cap) must leave every count as it was before it.
    let scope = store.scope(
        "refunds",
        "anonymous",
        vec![quota(Window::Minute, 3), quota(Window::Hour, 500)],
        &[quota(Window::Minute, 4)],
    );
    admit_n(&time, &store, &scope, A, 2).await;
    let (verdict, admitted) = decide(&time, &store, &scope, A, 1).await;
    assert_eq!(verdict, Verdict::Admitted, "{admitted:?}");
    store
        .refund(&scope, A, admitted.at_ms, &time.now(), 1)
        .await;
    // A's third request is free again, in the minute, the hour and the total.
    let (verdict, report) = decide(&time, &store, &scope, A, 1).await;
    assert_eq!(verdict, Verdict::Admitted, "{report:?}");
    assert_eq!(status(&report, Window::Minute, false).used, 2, "{report:?}");
    assert_eq!(status(&report, Window::Hour, false).used, 2, "{report:?}");
    assert_eq!(status(&report, Window::Minute, true).used, 2, "{report:?}");
    // ... and nothing more: A is at its limit, and the total has one left for B.
    let (verdict, report) = decide(&time, &store, &scope, A, 1).await;
    assert_eq!(verdict, Verdict::Limited, "{report:?}");
    admit_n(&time, &store, &scope, B, 1).await;
    let (verdict, report) = decide(&time, &store, &scope, C, 1).await;
    assert_eq!(verdict, Verdict::Limited, "the total is full: {report:?}");
    assert!(
        status(&report, Window::Minute, true).retry_ms.is_some(),
        "{report:?}"
    );
}

async fn a_late_refund_takes_back_its_own_request_not_a_newer_one(store: Store, time: Time) {
    // A per-second window: the refunded request (the first) would leave the window a
    // second after it was made, the kept ones 600 ms later. After the refund, both
    // kept requests must still count when the first one's second is over; refunding
    // "the newest" instead would leave the first, which expires early.
    let scope = store.scope("late", "anonymous", vec![quota(Window::Second, 2)], &[]);
    // On the wall clock (Redis) a loaded machine can take the check past the
    // kept requests' own second, where it proves nothing: then it is made again
    // with another caller. On the manual clock the first try always checks.
    for caller in [A, B, C] {
        if let Some(report) = late_refund(&time, &store, &scope, caller).await {
            assert_eq!(
                status(&report, Window::Second, false).used,
                2,
                "both kept requests count until their own second is over: {report:?}"
            );
            return;
        }
    }
    panic!("three tries each took the check past the kept requests' second");
}

/// `caller`'s part of the late refund: the report 1 100 ms after its first request,
/// or `None` if time ran past 1 550 ms before it was taken.
async fn late_refund(
    time: &Time,
    store: &Store,
    scope: &Scope,
    caller: CallerKey,
) -> Option<Report> {
    let started = time.now_ms();
    let (verdict, first) = decide(time, store, scope, caller, 1).await;
    assert_eq!(verdict, Verdict::Admitted);
    time.pass(Duration::from_millis(600)).await;
    admit_n(time, store, scope, caller, 1).await;
    store
        .refund(scope, caller, first.at_ms, &time.now(), 1)
        .await;
    let (verdict, report) = decide(time, store, scope, caller, 1).await;
    assert_eq!(
        verdict,
        Verdict::Admitted,
        "the refunded slot is free: {report:?}"
    );
    let (verdict, report) = decide(time, store, scope, caller, 1).await;
    assert_eq!(verdict, Verdict::Limited, "two counted again: {report:?}");
    // A refund of an instant at which nothing was counted frees nothing.
    store
        .refund(scope, caller, first.at_ms - 5_000, &time.now(), 1)
        .await;
    time.until(started + 1_100).await;
    let mut report = Report::default();
    store.peek(scope, caller, &time.now(), &mut report).await;
    // Between the first request's expiry and the kept ones' (1 000 to 1 600 ms).
    (time.since(started) < 1_550).then_some(report)
}

async fn a_refund_frees_a_caller_the_memo_remembered_as_refused(store: Store, time: Time) {
    let scope = store.scope("memo", "anonymous", vec![quota(Window::Minute, 1)], &[]);
    let (verdict, admitted) = decide(&time, &store, &scope, A, 1).await;
    assert_eq!(verdict, Verdict::Admitted);
    // Refused, and remembered as refused for about a minute ...
    for _ in 0..3 {
        let (verdict, _) = decide(&time, &store, &scope, A, 1).await;
        assert_eq!(verdict, Verdict::Limited);
    }
    // ... until its admitted request is refunded.
    store
        .refund(&scope, A, admitted.at_ms, &time.now(), 1)
        .await;
    let (verdict, report) = decide(&time, &store, &scope, A, 1).await;
    assert_eq!(verdict, Verdict::Admitted, "{report:?}");
}

async fn concurrent_callers_sharing_a_total_get_exactly_their_budgets(store: Store, time: Time) {
    // 8 callers x 40 requests, all at once: the Redis store decides the requests that
    // wait together in one script call, several of the same caller and all of the
    // same total among them. Each caller may have 10 a minute (an exact log) and 150
    // an hour (bucketed); all together 60 a minute, so the total refuses 20 of the
    // 80 the plans would admit.
    let counters = std::sync::Arc::new(store.scope(
        "crowd",
        "anonymous",
        vec![quota(Window::Minute, 10), quota(Window::Hour, 150)],
        &[quota(Window::Minute, 60)],
    ));
    let callers: Vec<CallerKey> = (0..8).map(|i| 0xffff_7f01_0000 + i).collect();
    let decisions = callers.iter().flat_map(|&caller| {
        let (store, counters, time) = (store.clone(), counters.clone(), time.clone());
        (0..40).map(move |_| {
            let (store, counters, time) = (store.clone(), counters.clone(), time.clone());
            tokio::spawn(async move {
                let (verdict, _) = decide(&time, &store, &counters, caller, 1).await;
                (caller, verdict)
            })
        })
    });
    let mut admitted = std::collections::HashMap::<CallerKey, u32>::new();
    for decision in decisions.collect::<Vec<_>>() {
        let (caller, verdict) = decision.await.expect("a decision");
        assert!(
            matches!(verdict, Verdict::Admitted | Verdict::Limited),
            "{verdict:?}"
        );
        *admitted.entry(caller).or_default() += u32::from(verdict == Verdict::Admitted);
    }
    let total: u32 = admitted.values().sum();
    assert_eq!(
        total, 60,
        "the total admits exactly its limit: {admitted:?}"
    );
    // Each caller's own windows counted exactly what it was admitted, no more.
    for caller in &callers {
        let mine = admitted.get(caller).copied().unwrap_or(0);
        assert!(mine <= 10, "caller {caller:x} admitted {mine}");
        let (verdict, report) = decide(&time, &store, &counters, *caller, 1).await;
        assert_eq!(verdict, Verdict::Limited, "{report:?}");
        assert_eq!(
            status(&report, Window::Minute, false).used,
            mine,
            "{report:?}"
        );
        assert_eq!(
            status(&report, Window::Hour, false).used,
            mine,
            "{report:?}"
        );
    }
    let (verdict, report) = decide(&time, &store, &counters, 0xffff_7f01_00ff, 1).await;
    assert_eq!(verdict, Verdict::Limited, "{report:?}");
    assert_eq!(status(&report, Window::Minute, true).used, 60, "{report:?}");
}

async fn a_burst_admits_exactly_the_limit_then_says_when_to_retry(store: Store, time: Time) {
    let counters = store.scope("burst", "anonymous", vec![quota(Window::Minute, 5)], &[]);
    let started = time.now_ms();
    for i in 0..5 {
        let (verdict, report) = decide(&time, &store, &counters, A, 1).await;
        assert_eq!(verdict, Verdict::Admitted, "request {}: {report:?}", i + 1);
        let minute = status(&report, Window::Minute, false);
        assert_eq!(minute.used, i, "used before request {}", i + 1);
        assert_eq!(minute.retry_ms, None);
        assert!(
            minute.reset_ms > 0 && minute.reset_ms <= 60_000,
            "reset_ms {}",
            minute.reset_ms
        );
    }
    // The sixth, and every one after it, is refused until the first one leaves
    // the window: about a minute from the start, never 0, never more than W.
    for attempt in 0..5 {
        let (verdict, report) = decide(&time, &store, &counters, A, 1).await;
        assert_eq!(verdict, Verdict::Limited, "attempt {attempt}: {report:?}");
        let minute = status(&report, Window::Minute, false);
        assert_eq!(minute.used, 5, "{report:?}");
        let retry = minute
            .retry_ms
            .expect("the refusing quota says when to retry");
        let elapsed = time.since(started);
        assert!(retry > 0 && retry <= 60_000, "retry_ms {retry}");
        assert!(
            retry + elapsed + 250 >= 60_000,
            "retry_ms {retry} after {elapsed} ms: the first request leaves the window \
             only a minute after it was made"
        );
        assert_eq!(report.retry_ms(), Some(retry));
        assert!(report.rejected());
    }
}

async fn a_bucketed_limit_admits_exactly_the_limit(store: Store, time: Time) {
    // Above 125 per window the count is kept in 1/125-window buckets (480 ms here).
    let counters = store.scope(
        "bucketed",
        "anonymous",
        vec![quota(Window::Minute, 300)],
        &[],
    );
    admit_n(&time, &store, &counters, A, 300).await;
    let (verdict, report) = decide(&time, &store, &counters, A, 1).await;
    assert_eq!(verdict, Verdict::Limited, "request 301: {report:?}");
    let minute = status(&report, Window::Minute, false);
    assert_eq!(minute.used, 300);
    let retry = minute.retry_ms.expect("retry_ms");
    // A bucket counts until its last millisecond leaves the window: at most W + G.
    assert!(retry > 0 && retry <= 60_000 + 480, "retry_ms {retry}");
    assert!(retry >= 55_000, "retry_ms {retry}: the burst was just made");
}

async fn a_request_refused_by_one_window_consumes_none_of_the_others(store: Store, time: Time) {
    let quotas = vec![quota(Window::Minute, 2), quota(Window::Hour, 5)];
    let counters = store.scope("windows", "anonymous", quotas, &[]);
    admit_n(&time, &store, &counters, A, 2).await;
    // Refused by the minute, three times (cost 2, so each really reaches the store
    // instead of the memo of refused callers): the hour must not count any of them.
    for attempt in 0..3 {
        let (verdict, report) = decide(&time, &store, &counters, A, 2).await;
        assert_eq!(verdict, Verdict::Limited, "attempt {attempt}: {report:?}");
        let minute = status(&report, Window::Minute, false);
        let hour = status(&report, Window::Hour, false);
        assert!(minute.retry_ms.is_some(), "{report:?}");
        assert_eq!(
            hour.used, 2,
            "the hour counted a refused request: {report:?}"
        );
        assert_eq!(hour.retry_ms, None, "{report:?}");
    }
    // The same (policy, plan) counters seen through the hour alone: 3 of 5 left.
    let hour_only = store.scope("windows", "anonymous", vec![quota(Window::Hour, 5)], &[]);
    let (verdict, report) = decide(&time, &store, &hour_only, A, 3).await;
    assert_eq!(
        verdict,
        Verdict::Admitted,
        "the hour should still have 3 left: {report:?}"
    );
    assert_eq!(status(&report, Window::Hour, false).used, 2);
    let (verdict, report) = decide(&time, &store, &hour_only, A, 1).await;
    assert_eq!(
        verdict,
        Verdict::Limited,
        "the hour is full now: {report:?}"
    );
    assert_eq!(status(&report, Window::Hour, false).used, 5);
}

async fn a_request_refused_by_the_total_consumes_none_of_the_callers_plan(
    store: Store,
    time: Time,
) {
    let plan = vec![quota(Window::Minute, 3)];
    let counters = store.scope(
        "shared",
        "anonymous",
        plan.clone(),
        &[quota(Window::Minute, 4)],
    );
    admit_n(&time, &store, &counters, A, 3).await;
    admit_n(&time, &store, &counters, B, 1).await;
    // The total (4) is full: B's plan admits, the total refuses, nothing is counted.
    for cost in [1, 2, 2] {
        let (verdict, report) = decide(&time, &store, &counters, B, cost).await;
        assert_eq!(verdict, Verdict::Limited, "cost {cost}: {report:?}");
        let own = status(&report, Window::Minute, false);
        let total = status(&report, Window::Minute, true);
        assert_eq!(own.used, 1, "B's plan: {report:?}");
        assert_eq!(own.retry_ms, None, "B's plan admits: {report:?}");
        assert_eq!(total.used, 4, "{report:?}");
        let retry = total.retry_ms.expect("the total refuses");
        assert!(retry > 0 && retry <= 60_000, "retry_ms {retry}");
    }
    // Same policy and plan, a roomier total: B has exactly 2 left of its own 3.
    let roomier = store.scope("shared", "anonymous", plan, &[quota(Window::Minute, 100)]);
    let (verdict, report) = decide(&time, &store, &roomier, B, 2).await;
    assert_eq!(verdict, Verdict::Admitted, "B has 2 left: {report:?}");
    assert_eq!(status(&report, Window::Minute, false).used, 1);
    assert_eq!(status(&report, Window::Minute, true).used, 4);
    let (verdict, report) = decide(&time, &store, &roomier, B, 1).await;
    assert_eq!(verdict, Verdict::Limited, "B's plan is full: {report:?}");
    assert_eq!(status(&report, Window::Minute, false).used, 3);
}

async fn a_request_refused_by_the_plan_consumes_none_of_the_total(store: Store, time: Time) {
    let counters = store.scope(
        "shared",
        "anonymous",
        vec![quota(Window::Minute, 1)],
        &[quota(Window::Minute, 3)],
    );
    admit_n(&time, &store, &counters, A, 1).await;
    for cost in [2, 2, 3] {
        let (verdict, report) = decide(&time, &store, &counters, A, cost).await;
        assert_eq!(verdict, Verdict::Limited, "cost {cost}: {report:?}");
        assert!(status(&report, Window::Minute, false).retry_ms.is_some());
    }
    // The total counted A once: 2 are left, for B.
    let (verdict, report) = decide(&time, &store, &counters, B, 1).await;
    assert_eq!(verdict, Verdict::Admitted, "{report:?}");
    assert_eq!(status(&report, Window::Minute, true).used, 1, "{report:?}");
    admit_n(&time, &store, &counters, C, 1).await;
    let (verdict, report) = decide(&time, &store, &counters, D, 1).await;
    assert_eq!(verdict, Verdict::Limited, "the total is full: {report:?}");
    assert_eq!(status(&report, Window::Minute, false).used, 0);
    assert_eq!(status(&report, Window::Minute, true).used, 3);
}

async fn the_total_counts_every_caller_together(store: Store, time: Time) {
    let counters = store.scope(
        "total",
        "anonymous",
        vec![quota(Window::Minute, 100)],
        &[quota(Window::Minute, 5)],
    );
    for caller in 1..=5u64 {
        let (verdict, report) = decide(&time, &store, &counters, caller, 1).await;
        assert_eq!(verdict, Verdict::Admitted, "caller {caller}: {report:?}");
        assert_eq!(
            status(&report, Window::Minute, true).used,
            caller as u32 - 1
        );
        assert_eq!(status(&report, Window::Minute, false).used, 0);
    }
    for caller in 6..=8u64 {
        let (verdict, report) = decide(&time, &store, &counters, caller, 1).await;
        assert_eq!(verdict, Verdict::Limited, "caller {caller}: {report:?}");
        let total = status(&report, Window::Minute, true);
        assert_eq!(total.used, 5);
        let retry = total.retry_ms.expect("the total refuses");
        assert!(retry > 0 && retry <= 60_000, "retry_ms {retry}");
        assert_eq!(status(&report, Window::Minute, false).retry_ms, None);
    }
}

async fn callers_have_separate_budgets(store: Store, time: Time) {
    let counters = store.scope("separate", "anonymous", vec![quota(Window::Minute, 3)], &[]);
    admit_n(&time, &store, &counters, A, 3).await;
    let (verdict, _) = decide(&time, &store, &counters, A, 1).await;
    assert_eq!(verdict, Verdict::Limited);
    // B's budget is untouched by A's.
    for i in 0..3 {
        let (verdict, report) = decide(&time, &store, &counters, B, 1).await;
        assert_eq!(
            verdict,
            Verdict::Admitted,
            "B's request {}: {report:?}",
            i + 1
        );
        assert_eq!(status(&report, Window::Minute, false).used, i);
    }
    let (verdict, _) = decide(&time, &store, &counters, B, 1).await;
    assert_eq!(verdict, Verdict::Limited);
    // And the same plan under another policy is another budget.
    let other = store.scope("other", "anonymous", vec![quota(Window::Minute, 3)], &[]);
    admit_n(&time, &store, &other, A, 3).await;
}

async fn a_cost_consumes_that_many_and_an_unaffordable_cost_consumes_nothing(
    store: Store,
    time: Time,
) {
    let counters = store.scope("cost", "registered", vec![quota(Window::Minute, 10)], &[]);
    for used in [0, 4] {
        let (verdict, report) = decide(&time, &store, &counters, A, 4).await;
        assert_eq!(verdict, Verdict::Admitted, "{report:?}");
        assert_eq!(status(&report, Window::Minute, false).used, used);
    }
    // 8 used: a cost of 4 (or 3) does not fit and takes nothing.
    for cost in [4, 3, 4] {
        let (verdict, report) = decide(&time, &store, &counters, A, cost).await;
        assert_eq!(verdict, Verdict::Limited, "cost {cost}: {report:?}");
        let minute = status(&report, Window::Minute, false);
        assert_eq!(minute.used, 8, "{report:?}");
        let retry = minute.retry_ms.expect("retry_ms");
        assert!(retry > 0 && retry <= 60_000, "retry_ms {retry}");
    }
    // Exactly what is left fits.
    let (verdict, report) = decide(&time, &store, &counters, A, 2).await;
    assert_eq!(verdict, Verdict::Admitted, "2 were left: {report:?}");
    assert_eq!(status(&report, Window::Minute, false).used, 8);
    let (verdict, report) = decide(&time, &store, &counters, A, 1).await;
    assert_eq!(verdict, Verdict::Limited, "{report:?}");
    assert_eq!(status(&report, Window::Minute, false).used, 10);
    // A cost above the limit itself can never be admitted.
    let (verdict, _) = decide(&time, &store, &counters, B, 11).await;
    assert_eq!(verdict, Verdict::Limited);
    admit_n(&time, &store, &counters, B, 10).await;
}

async fn a_larger_cost_is_told_its_own_wait_even_right_after_a_refusal(store: Store, time: Time) {
    let counters = store.scope("waits", "registered", vec![quota(Window::Minute, 3)], &[]);
    // A and B: one request, then two more 600 ms later.
    admit_n(&time, &store, &counters, A, 1).await;
    admit_n(&time, &store, &counters, B, 1).await;
    let first = time.now_ms();
    time.pass(Duration::from_millis(600)).await;
    admit_n(&time, &store, &counters, A, 2).await;
    admit_n(&time, &store, &counters, B, 2).await;
    let second = time.now_ms();
    let due = |since: u64| 60_000u64.saturating_sub(time.since(since));

    // B asks for 2 at once: both places free up only when the later two leave.
    let retry = refused_wait(&time, &store, &counters, B, 2, Window::Minute).await;
    assert!(
        retry.abs_diff(due(second)) <= 150,
        "B, cost 2: retry_ms {retry}, expected about {}",
        due(second)
    );

    // A asks for 1: refused until the first request leaves...
    let retry = refused_wait(&time, &store, &counters, A, 1, Window::Minute).await;
    assert!(
        retry.abs_diff(due(first)) <= 150,
        "A, cost 1: retry_ms {retry}, expected about {}",
        due(first)
    );
    // ... then for 2, right after that refusal: told the same as B, not the wait
    // of a single request (a request may be answered from a memo of refusals only
    // if the memo's answer is true for its cost).
    let retry = refused_wait(&time, &store, &counters, A, 2, Window::Minute).await;
    assert!(
        retry.abs_diff(due(second)) <= 150,
        "A, cost 2 right after a refusal of cost 1: retry_ms {retry}, but 2 places \
         free up only in about {} ms (a single one in about {} ms)",
        due(second),
        due(first)
    );
}

async fn reset_forgets_a_caller_and_only_that_caller(store: Store, time: Time) {
    let counters = store.scope("reset", "anonymous", vec![quota(Window::Minute, 2)], &[]);
    admit_n(&time, &store, &counters, A, 2).await;
    admit_n(&time, &store, &counters, B, 2).await;
    let (verdict, _) = decide(&time, &store, &counters, A, 1).await;
    assert_eq!(verdict, Verdict::Limited);
    assert!(store.reset(&counters, A).await, "A was tracked");
    for i in 0..2 {
        let (verdict, report) = decide(&time, &store, &counters, A, 1).await;
        assert_eq!(
            verdict,
            Verdict::Admitted,
            "A after reset, request {}: {report:?}",
            i + 1
        );
        assert_eq!(status(&report, Window::Minute, false).used, i);
    }
    let (verdict, _) = decide(&time, &store, &counters, A, 1).await;
    assert_eq!(verdict, Verdict::Limited, "A's new budget is used up");
    let (verdict, report) = decide(&time, &store, &counters, B, 1).await;
    assert_eq!(verdict, Verdict::Limited, "B was not reset: {report:?}");
    assert!(!store.reset(&counters, C).await, "C was never tracked");
}

async fn a_per_second_window_frees_up_after_a_second(store: Store, time: Time) {
    let counters = store.scope("second", "anonymous", vec![quota(Window::Second, 3)], &[]);
    let started = time.now_ms();
    admit_n(&time, &store, &counters, A, 3).await;
    let (verdict, report) = decide(&time, &store, &counters, A, 1).await;
    assert_eq!(verdict, Verdict::Limited, "{report:?}");
    let retry = status(&report, Window::Second, false)
        .retry_ms
        .expect("retry_ms");
    assert!(retry > 0 && retry <= 1_000, "retry_ms {retry}");
    let elapsed = time.since(started);
    assert!(
        retry + elapsed + 100 >= 1_000,
        "retry_ms {retry} after {elapsed} ms"
    );
    // Wait as told (plus a little): admitted again.
    time.pass(Duration::from_millis(retry + 50)).await;
    let (verdict, report) = decide(&time, &store, &counters, A, 1).await;
    assert_eq!(
        verdict,
        Verdict::Admitted,
        "after {retry} ms + 50: {report:?}"
    );
    // A second after the burst the whole budget is back: two more fit, not three.
    time.until(started + 1_050).await;
    admit_n(&time, &store, &counters, A, 2).await;
    let (verdict, report) = decide(&time, &store, &counters, A, 1).await;
    assert_eq!(verdict, Verdict::Limited, "{report:?}");
}

async fn a_sliding_window_frees_each_request_a_window_after_it_was_made(store: Store, time: Time) {
    let counters = store.scope("sliding", "anonymous", vec![quota(Window::Second, 3)], &[]);
    let first = time.now_ms();
    admit_n(&time, &store, &counters, A, 1).await;
    time.pass(Duration::from_millis(400)).await;
    let second = time.now_ms();
    admit_n(&time, &store, &counters, A, 2).await;
    // Full: the first request frees its place 1 s after it was made, not before.
    let (verdict, report) = decide(&time, &store, &counters, A, 1).await;
    assert_eq!(verdict, Verdict::Limited, "{report:?}");
    let retry = status(&report, Window::Second, false)
        .retry_ms
        .expect("retry_ms");
    let due = 1_000u64.saturating_sub(time.since(first));
    assert!(
        retry.abs_diff(due) <= 100,
        "retry_ms {retry}, expected about {due}"
    );
    time.pass(Duration::from_millis(retry + 30)).await;
    // One place is free (the first request's), the two later ones still count.
    let (verdict, report) = decide(&time, &store, &counters, A, 1).await;
    assert_eq!(verdict, Verdict::Admitted, "{report:?}");
    assert_eq!(status(&report, Window::Second, false).used, 2, "{report:?}");
    let (verdict, report) = decide(&time, &store, &counters, A, 1).await;
    assert_eq!(verdict, Verdict::Limited, "{report:?}");
    let limit = status(&report, Window::Second, false);
    assert_eq!(limit.used, 3, "{report:?}");
    let retry = limit.retry_ms.expect("retry_ms");
    let due = 1_000u64.saturating_sub(time.since(second));
    assert!(
        retry.abs_diff(due) <= 100,
        "retry_ms {retry}, expected about {due}"
    );
}

async fn a_calendar_day_counts_until_local_midnight(store: Store, time: Time) {
    let paris = jiff::tz::TimeZone::get("Europe/Paris").expect("the Europe/Paris zone");
    // Right before midnight, the day would change under the test: wait it out.
    let day = sluice::limit::calendar::calendar_day(&paris, time.now_ms());
    let to_midnight = day.ends_ms.saturating_sub(time.now_ms());
    if to_midnight < 5_000 {
        time.pass(Duration::from_millis(to_midnight + 100)).await;
    }
    let at = || {
        let ms = time.now_ms();
        Now::new(ms, Some(sluice::limit::calendar::calendar_day(&paris, ms)))
    };
    let counters = store.scope("daily", "anonymous", vec![quota(Window::Day, 3)], &[]);
    for i in 0..3 {
        let (verdict, report) = decide_at(&store, &counters, A, &at(), 1).await;
        assert_eq!(verdict, Verdict::Admitted, "request {}: {report:?}", i + 1);
        let day = status(&report, Window::Day, false);
        assert_eq!(day.used, i);
    }
    let now = at();
    let day = now.calendar.expect("a calendar day");
    let to_midnight = day.ends_ms - now.ms;
    let (verdict, report) = decide_at(&store, &counters, A, &now, 1).await;
    assert_eq!(verdict, Verdict::Limited, "{report:?}");
    let daily = status(&report, Window::Day, false);
    assert_eq!(daily.used, 3);
    let retry = daily.retry_ms.expect("retry_ms");
    // Not 24 h after the first request: at the next Paris midnight.
    assert!(
        retry.abs_diff(to_midnight) <= 2_000,
        "retry_ms {retry}, but Paris midnight is {to_midnight} ms away"
    );
    assert!(
        daily.reset_ms.abs_diff(to_midnight) <= 2_000,
        "reset_ms {}, but Paris midnight is {to_midnight} ms away",
        daily.reset_ms
    );
    // Another caller has its own day.
    let (verdict, _) = decide_at(&store, &counters, B, &at(), 3).await;
    assert_eq!(verdict, Verdict::Admitted);
}

async fn a_billing_month_counts_exactly_until_the_anchor_day_and_refunds(store: Store, time: Time) {
    use jiff::civil::Date;
    use sluice::limit::{Anchor, period};
    let zone = jiff::tz::TimeZone::get("America/New_York").expect("the zone");
    // An anchor on tomorrow's day of the month: the period ends at tomorrow's local
    // midnight (or the month's last day's, for a 31st).
    let today: Date = jiff::Timestamp::from_millisecond(time.now_ms() as i64)
        .unwrap()
        .to_zoned(zone.clone())
        .date();
    let anchor = Anchor::of_date(today.tomorrow().unwrap());
    let at = || {
        let ms = time.now_ms();
        Now::sliding(ms).with_periods(period::periods(&zone, anchor, ms))
    };
    let first = at();
    let ends_ms = first.periods.unwrap().month.ends_ms;
    if ends_ms - first.ms < 5_000 {
        // The period would end under the test: wait it out.
        time.pass(Duration::from_millis(ends_ms - first.ms + 100))
            .await;
    }
    let plan = vec![
        quota(Window::Minute, 1_000_000),
        quota(Window::Month, 1_000_000),
        quota(Window::Year, 2_000_000),
    ];
    let counters = store.scope("monthly", "pro", plan, &[]);
    let (verdict, report) = decide_at(&store, &counters, A, &at(), 999_999).await;
    assert_eq!(verdict, Verdict::Admitted, "{report:?}");
    let (verdict, report) = decide_at(&store, &counters, A, &at(), 1).await;
    assert_eq!(verdict, Verdict::Admitted, "{report:?}");
    // Exactly the quota: the next unit is refused until the period ends.
    let now = at();
    let to_end = now.periods.unwrap().month.ends_ms - now.ms;
    let (verdict, report) = decide_at(&store, &counters, A, &now, 1).await;
    assert_eq!(verdict, Verdict::Limited, "{report:?}");
    let month = status(&report, Window::Month, false);
    assert_eq!(month.used, 1_000_000);
    let retry = month.retry_ms.expect("retry_ms");
    assert!(
        retry.abs_diff(to_end) <= 2_000,
        "retry_ms {retry}, but the period ends {to_end} ms from now"
    );
    let year = status(&report, Window::Year, false);
    assert_eq!(year.used, 1_000_000);
    assert!(year.retry_ms.is_none());
    // A refund of an admitted request gives its units back in every window.
    let admitted_at = at();
    let (verdict, report) = decide_at(&store, &counters, B, &admitted_at, 10).await;
    assert_eq!(verdict, Verdict::Admitted);
    store
        .refund(&counters, B, report.at_ms, &admitted_at, 10)
        .await;
    let mut peeked = Report::default();
    store.peek(&counters, B, &at(), &mut peeked).await;
    assert_eq!(status(&peeked, Window::Month, false).used, 0, "{peeked:?}");
    assert_eq!(status(&peeked, Window::Year, false).used, 0, "{peeked:?}");
}

/// Milliseconds two stores' times may differ by: the two decisions are a few ms
/// apart, and a bucketed window may put them in neighbouring buckets.
fn tolerance(quota: &Quota) -> u64 {
    if Window::is_exact(quota.limit.get()) {
        250
    } else {
        250 + quota.window.bucket_ms()
    }
}

async fn reports_match_the_memory_store_decision_for_decision(store: Store, time: Time) {
    let reference = Store::memory(1_000);
    let plan = vec![quota(Window::Minute, 5), quota(Window::Hour, 200)];
    let total = [quota(Window::Minute, 7)];
    let tested = store.scope("agree", "anonymous", plan.clone(), &total);
    let expected = reference.scope("agree", "anonymous", plan, &total);
    // A fixed, mixed sequence of callers and costs: admissions, plan refusals,
    // total refusals, unaffordable costs.
    // (A cost above 1 never follows a refusal of cost 1 of the same caller: that
    // case has its own behaviour above.)
    let sequence: [(CallerKey, u32); 16] = [
        (A, 1),
        (A, 2),
        (B, 1),
        (A, 3),
        (A, 2),
        (B, 4),
        (C, 1),
        (C, 2),
        (B, 3),
        (C, 6),
        (B, 1),
        (C, 1),
        (A, 1),
        (D, 2),
        (D, 1),
        (A, 1),
    ];
    for (step, (caller, cost)) in sequence.into_iter().enumerate() {
        let at = time.now();
        let (want_verdict, want) = decide_at(&reference, &expected, caller, &at, cost).await;
        let (verdict, got) = decide(&time, &store, &tested, caller, cost).await;
        let what = format!("step {step} (caller {caller:x}, cost {cost})");
        assert_eq!(
            verdict, want_verdict,
            "{what}: verdict\n memory: {want:?}\n tested: {got:?}"
        );
        let (got, want): (Vec<_>, Vec<_>) = (got.iter().collect(), want.iter().collect());
        assert_eq!(
            got.len(),
            want.len(),
            "{what}: statuses\n memory: {want:?}\n tested: {got:?}"
        );
        for (got, want) in got.iter().zip(&want) {
            assert_eq!(
                (got.quota, got.total, got.used, got.retry_ms.is_some()),
                (want.quota, want.total, want.used, want.retry_ms.is_some()),
                "{what}\n memory: {want:?}\n tested: {got:?}"
            );
            let slack = tolerance(&want.quota);
            assert!(
                got.reset_ms.abs_diff(want.reset_ms) <= slack,
                "{what}: reset_ms\n memory: {want:?}\n tested: {got:?}"
            );
            if let (Some(got_retry), Some(want_retry)) = (got.retry_ms, want.retry_ms) {
                assert!(
                    got_retry.abs_diff(want_retry) <= slack,
                    "{what}: retry_ms\n memory: {want:?}\n tested: {got:?}"
                );
            }
        }
    }
}

// ---- stacked decisions ------------------------------------------------------------

/// The parts of a stacked decision over `scopes`, each under its key, at `now`.
fn stack<'s>(scopes: &[(&'s Scope, CallerKey, bool)], now: Now) -> Vec<Stacked<'s>> {
    (scopes.iter())
        .map(|&(scope, caller, shadow)| Stacked {
            scope,
            caller,
            now,
            shadow,
        })
        .collect()
}

/// Decides `parts` with cost `cost`; the verdict and each part's `used` of its only
/// quota, and whether that quota refused.
async fn decide_stack(
    store: &Store,
    parts: &[Stacked<'_>],
    cost: u32,
) -> (Verdict, Vec<(u32, bool)>) {
    let mut reports = vec![Report::default(); parts.len()];
    let verdict = store.decide_stacked(parts, cost, &mut reports).await;
    let used = (reports.iter())
        .map(|r| {
            let s = r.iter().next().copied().expect("a status per part");
            (s.used, s.retry_ms.is_some())
        })
        .collect();
    (verdict, used)
}

async fn a_stacked_decision_counts_in_every_scope_or_in_none(store: Store, time: Time) {
    // An organisation (key C) of 5 over two members' keys (A, B) of 3 each.
    let org = store.scope("org", "registered", vec![quota(Window::Hour, 5)], &[]);
    let member = store.scope("member", "registered", vec![quota(Window::Hour, 3)], &[]);
    for _ in 0..3 {
        let parts = stack(&[(&org, C, false), (&member, A, false)], time.now());
        assert_eq!(decide_stack(&store, &parts, 1).await.0, Verdict::Admitted);
    }
    // A's key refuses: the organisation is not charged, however often.
    for _ in 0..3 {
        let parts = stack(&[(&org, C, false), (&member, A, false)], time.now());
        let (verdict, used) = decide_stack(&store, &parts, 1).await;
        assert_eq!(verdict, Verdict::Limited);
        assert_eq!(used, [(3, false), (3, true)]);
    }
    // B: 2 more fill the organisation; the third is refused by it, B not charged.
    for _ in 0..2 {
        let parts = stack(&[(&org, C, false), (&member, B, false)], time.now());
        assert_eq!(decide_stack(&store, &parts, 1).await.0, Verdict::Admitted);
    }
    let parts = stack(&[(&org, C, false), (&member, B, false)], time.now());
    let (verdict, used) = decide_stack(&store, &parts, 1).await;
    assert_eq!(verdict, Verdict::Limited);
    assert_eq!(used, [(5, true), (2, false)]);
    // Each scope seen alone: exactly what the admitted requests counted (a report
    // shows the counts before the request it decides).
    let (verdict, report) = decide(&time, &store, &member, B, 1).await;
    assert_eq!(verdict, Verdict::Admitted);
    assert_eq!(status(&report, Window::Hour, false).used, 2, "{report:?}");
    let (verdict, report) = decide(&time, &store, &org, C, 1).await;
    assert_eq!(verdict, Verdict::Limited);
    assert_eq!(status(&report, Window::Hour, false).used, 5);
}

async fn a_stacked_shadow_scope_refuses_nothing_and_is_not_charged_when_over(
    store: Store,
    time: Time,
) {
    let org = store.scope("org", "registered", vec![quota(Window::Hour, 10)], &[]);
    let shadow = store.scope("watch", "registered", vec![quota(Window::Hour, 2)], &[]);
    for expected in [(1, 1), (2, 2), (3, 2), (4, 2)] {
        let parts = stack(&[(&org, C, false), (&shadow, A, true)], time.now());
        let (verdict, used) = decide_stack(&store, &parts, 1).await;
        assert_eq!(verdict, Verdict::Admitted);
        // Reports show the counts before this request: the shadow part stays at 2.
        assert_eq!((used[0].0 + 1, used[1].0 + u32::from(!used[1].1)), expected);
    }
    let (_, report) = decide(&time, &store, &shadow, A, 0).await;
    assert_eq!(status(&report, Window::Hour, false).used, 2);
}

async fn a_stacked_refund_gives_back_in_every_scope(store: Store, time: Time) {
    let org = store.scope("org", "registered", vec![quota(Window::Hour, 5)], &[]);
    let member = store.scope("member", "registered", vec![quota(Window::Hour, 3)], &[]);
    let now = time.now();
    let parts = stack(&[(&org, C, false), (&member, A, false)], now);
    let mut reports = vec![Report::default(); 2];
    let verdict = store.decide_stacked(&parts, 2, &mut reports).await;
    assert_eq!(verdict, Verdict::Admitted);
    // Refunded at the instant the store decided at.
    let at = Now {
        ms: reports[0].at_ms,
        ..now
    };
    let parts = stack(&[(&org, C, false), (&member, A, false)], at);
    store.settle_stacked(&parts, &[2, 2], false).await;
    let (_, report) = decide(&time, &store, &member, A, 0).await;
    assert_eq!(status(&report, Window::Hour, false).used, 0, "{report:?}");
    let (_, report) = decide(&time, &store, &org, C, 0).await;
    assert_eq!(status(&report, Window::Hour, false).used, 0, "{report:?}");
}

async fn a_credit_takes_off_the_current_periods_only_and_never_below_zero(
    store: Store,
    time: Time,
) {
    use sluice::limit::{Anchor, period};
    let zone = jiff::tz::TimeZone::UTC;
    let at = || {
        let ms = time.now_ms();
        Now::sliding(ms).with_periods(period::periods(&zone, Anchor::CALENDAR, ms))
    };
    let first = at();
    let ends_ms = first.periods.unwrap().month.ends_ms;
    if ends_ms - first.ms < 5_000 {
        // The month would end under the test: wait it out.
        time.pass(Duration::from_millis(ends_ms - first.ms + 100))
            .await;
    }
    let plan = vec![quota(Window::Minute, 100), quota(Window::Month, 10)];
    let counters = store.scope("credited", "pro", plan, &[]);
    let (verdict, _) = decide_at(&store, &counters, A, &at(), 10).await;
    assert_eq!(verdict, Verdict::Admitted);
    assert!(store.credit(&counters, A, &at(), 4).await);
    let (verdict, report) = decide_at(&store, &counters, A, &at(), 0).await;
    assert_eq!(verdict, Verdict::Admitted);
    assert_eq!(status(&report, Window::Month, false).used, 6, "{report:?}");
    // The minute is not a billing period: untouched.
    assert_eq!(
        status(&report, Window::Minute, false).used,
        10,
        "{report:?}"
    );
    // More than what is used only empties the month.
    assert!(store.credit(&counters, A, &at(), 1_000).await);
    let (_, report) = decide_at(&store, &counters, A, &at(), 0).await;
    assert_eq!(status(&report, Window::Month, false).used, 0, "{report:?}");
    let (verdict, _) = decide_at(&store, &counters, A, &at(), 10).await;
    assert_eq!(verdict, Verdict::Admitted);
    let (verdict, _) = decide_at(&store, &counters, A, &at(), 1).await;
    assert_eq!(verdict, Verdict::Limited);
}

async fn a_give_back_takes_the_newest_counts_everywhere_and_never_below_zero(
    store: Store,
    time: Time,
) {
    // An exact minute, a bucketed second (8 ms buckets: the two admissions below
    // are two runs) and a total: units handed back without their instant (Envoy's
    // `is_negative_hits`) come off the newest counts of each.
    let scope = store.scope(
        "given-back",
        "anonymous",
        vec![quota(Window::Minute, 3), quota(Window::Second, 200)],
        &[quota(Window::Minute, 4)],
    );
    let started = time.now_ms();
    let (verdict, _) = decide(&time, &store, &scope, A, 2).await;
    assert_eq!(verdict, Verdict::Admitted);
    time.pass(Duration::from_millis(20)).await;
    admit_n(&time, &store, &scope, A, 1).await;
    store.give_back(&scope, A, &time.now(), 2).await;
    let (_, report) = decide(&time, &store, &scope, A, 0).await;
    assert_eq!(status(&report, Window::Minute, false).used, 1, "{report:?}");
    assert_eq!(status(&report, Window::Minute, true).used, 1, "{report:?}");
    if time.since(started) < 900 {
        // Across both runs of the second (unless it has slid past them already).
        assert_eq!(status(&report, Window::Second, false).used, 1, "{report:?}");
    }
    let (verdict, report) = decide(&time, &store, &scope, A, 2).await;
    assert_eq!(verdict, Verdict::Admitted, "{report:?}");
    let (verdict, report) = decide(&time, &store, &scope, A, 1).await;
    assert_eq!(verdict, Verdict::Limited, "3 of 3 again: {report:?}");
    // More than is counted only empties the windows: exactly 3 fit afterwards.
    store.give_back(&scope, A, &time.now(), 1_000).await;
    let (verdict, report) = decide(&time, &store, &scope, A, 3).await;
    assert_eq!(verdict, Verdict::Admitted, "{report:?}");
    assert_eq!(status(&report, Window::Minute, false).used, 0, "{report:?}");
    assert_eq!(status(&report, Window::Minute, true).used, 0, "{report:?}");
    let (verdict, report) = decide(&time, &store, &scope, A, 1).await;
    assert_eq!(verdict, Verdict::Limited, "{report:?}");
}
