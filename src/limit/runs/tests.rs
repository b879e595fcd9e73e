//! Tests of [`Runs`]: exact logs, buckets, conversions and the word layout.
use super::*;
use crate::limit::{CalendarDay, Window, quota};

fn attempt(runs: &mut Runs, quotas: &[Quota], ms: u64) -> Report {
    let now = Now::sliding(ms);
    let mut report = Report::default();
    if runs.check(quotas, &now, 1, false, &mut report) {
        runs.commit(quotas, &now, 1);
    }
    report
}

/// Counters after one request at each of `times` (each must be admitted).
fn after_requests(quotas: &[Quota], times: &[u64]) -> Runs {
    let mut runs = Runs::default();
    for &ms in times {
        assert!(
            !attempt(&mut runs, quotas, ms).rejected(),
            "refused at {ms}"
        );
    }
    runs
}

#[test]
fn a_small_limit_is_exact_and_waits_exactly_one_window() {
    let quotas = [quota(Window::Minute, 3)];
    let mut runs = Runs::default();
    for ms in [0, 10, 20] {
        assert!(!attempt(&mut runs, &quotas, ms).rejected());
    }
    let report = attempt(&mut runs, &quotas, 30);
    assert!(report.rejected());
    // The first request (at 0) leaves the window at 60_000.
    assert_eq!(report.retry_ms(), Some(60_000 - 30));
    assert!(attempt(&mut runs, &quotas, 59_999).rejected());
    assert!(!attempt(&mut runs, &quotas, 60_000).rejected());
}

#[test]
fn a_large_limit_counts_in_buckets_and_waits_for_the_whole_bucket() {
    let quotas = [quota(Window::Minute, 200)];
    let mut runs = Runs::default();
    for i in 0..200 {
        assert!(!attempt(&mut runs, &quotas, 100 + i).rejected());
    }
    let report = attempt(&mut runs, &quotas, 1_000);
    // Bucket 0 is [0, 480): it stops counting at 480 + 60_000 - 1.
    assert_eq!(report.retry_ms(), Some(60_479 - 1_000));
    assert!(attempt(&mut runs, &quotas, 60_478).rejected());
    assert!(!attempt(&mut runs, &quotas, 60_479).rejected());
}

#[test]
fn a_reload_across_the_exact_threshold_never_releases_a_request_early() {
    let mut runs = after_requests(&[quota(Window::Minute, 2)], &[100, 5_000]);
    // Now 200 a minute: bucketed. The two requests still count...
    let bucketed = [quota(Window::Minute, 200)];
    assert_eq!(runs.used_at(&bucketed[0], &Now::sliding(60_099)), 2);
    // ...the first until the end of its 480 ms bucket, not before.
    assert_eq!(runs.used_at(&bucketed[0], &Now::sliding(60_478)), 2);
    assert_eq!(runs.used_at(&bucketed[0], &Now::sliding(60_479)), 1);
    // And back to exact: each bucket becomes its last millisecond.
    let exact = [quota(Window::Minute, 2)];
    assert_eq!(runs.used_at(&exact[0], &Now::sliding(60_479)), 1);
    assert_eq!(runs.used_at(&exact[0], &Now::sliding(65_279)), 0);
}

#[test]
fn one_request_in_two_windows_stays_inline() {
    let quotas = [quota(Window::Minute, 10), quota(Window::Day, 1000)];
    let mut runs = Runs::default();
    attempt(&mut runs, &quotas, 5);
    assert_eq!(runs.heap_bytes(), 0);
    // Header, one exact millisecond, the day's total and its (bucket, count) run.
    assert_eq!(runs.words.len(), 6);
    assert_eq!(std::mem::size_of::<Runs>(), 32);
}

#[test]
fn a_rejected_request_counts_in_no_window() {
    let quotas = [quota(Window::Second, 100), quota(Window::Minute, 1)];
    let mut runs = Runs::default();
    attempt(&mut runs, &quotas, 0);
    let before = runs.clone();
    let report = attempt(&mut runs, &quotas, 500);
    assert!(report.rejected());
    assert_eq!(runs.runs(Window::Second as usize).count(), 1);
    assert_eq!(runs, before);
}

#[test]
fn calendar_days_reset_at_midnight() {
    let quotas = [quota(Window::Day, 2)];
    let day = |index, ms| {
        Now::new(
            ms,
            Some(CalendarDay {
                index,
                starts_ms: 0,
                ends_ms: 1_000,
            }),
        )
    };
    let mut runs = Runs::default();
    for _ in 0..2 {
        let mut report = Report::default();
        assert!(runs.check(&quotas, &day(1, 10), 1, false, &mut report));
        runs.commit(&quotas, &day(1, 10), 1);
    }
    let mut report = Report::default();
    assert!(!runs.check(&quotas, &day(1, 900), 1, false, &mut report));
    assert_eq!(report.retry_ms(), Some(100));
    let mut report = Report::default();
    assert!(runs.check(&quotas, &day(2, 1_000), 1, false, &mut report));
}

#[test]
fn a_full_run_list_holds_requests_longer_never_shorter() {
    let mut runs = Runs::default();
    for bucket in 0..MAX_RUNS as u32 {
        runs.add(Window::Second as usize, bucket, 1);
    }
    // One more bucket than there is room for: the newest run moves up to it.
    runs.add(Window::Second as usize, MAX_RUNS as u32 + 7, 1);
    assert_eq!(runs.len(Window::Second as usize), MAX_RUNS);
    let newest = runs.runs(Window::Second as usize).last().unwrap();
    assert_eq!(newest, (MAX_RUNS as u32 + 7, 2));
    assert!(Runs::from_words(runs.words()).is_some());
}

#[test]
fn an_exact_log_takes_one_word_per_request() {
    let quotas = [quota(Window::Minute, 100)];
    let mut runs = after_requests(&quotas, &[0, 0, 7, 9]);
    let minute = Window::Minute as usize;
    let header: u64 = (4 << (LEN_BITS * minute)) | (1 << (EXACT_SHIFT + minute));
    let words = [header as u32, (header >> 32) as u32, 0, 0, 7, 9];
    assert_eq!(runs.words.as_slice(), &words);
    assert!(Runs::from_words(runs.words()).is_some());
    assert!(Runs::from_words(&runs.words()[..5]).is_none());
    // The two requests at 0 leave together; the count is the number of words.
    let now = Now::sliding(60_000);
    assert_eq!(runs.used_at(&quotas[0], &now), 2);
    assert_eq!(runs.words.len(), 4);
}

#[test]
fn a_bucketed_window_keeps_its_total_through_adds_and_expiry() {
    let quotas = [quota(Window::Second, 1_000)];
    // Buckets of 8 ms: 0, 0, 1, 62.
    let mut runs = after_requests(&quotas, &[0, 3, 10, 500]);
    assert_eq!(&runs.words[HEADER_WORDS..], &[4, 0, 2, 1, 1, 62, 1]);
    // Bucket 0 counts while t < 8 + 1 000 - 1.
    assert_eq!(runs.used_at(&quotas[0], &Now::sliding(1_006)), 4);
    assert_eq!(runs.used_at(&quotas[0], &Now::sliding(1_007)), 2);
    assert_eq!(&runs.words[HEADER_WORDS..], &[2, 1, 1, 62, 1]);
    assert!(Runs::from_words(runs.words()).is_some());
    // A total that disagrees with its runs is malformed.
    let mut words = runs.words().to_vec();
    words[HEADER_WORDS] = 3;
    assert!(Runs::from_words(&words).is_none());
    // Once every run has expired the slot takes no words at all.
    assert_eq!(runs.used_at(&quotas[0], &Now::sliding(2_000)), 0);
    assert_eq!(runs.words.len(), HEADER_WORDS);
}

#[test]
fn first_layout_pairs_become_one_word_per_exact_request() {
    let (minute, day) = (Window::Minute as usize, Window::Day as usize);
    let header: u64 =
        (2 << (LEN_BITS * minute)) | (1 << (LEN_BITS * day)) | (1 << (EXACT_SHIFT + minute));
    // Minute (exact): 1 request at 100, 2 at 5 000. Day (bucketed): 7 in bucket 0.
    let v1 = [header as u32, (header >> 32) as u32, 100, 1, 5_000, 2, 0, 7];
    let runs = Runs::from_v1_words(&v1).unwrap();
    assert_eq!(
        runs.runs(minute).collect::<Vec<_>>(),
        [(100, 1), (5_000, 1), (5_000, 1)]
    );
    assert_eq!(runs.runs(day).collect::<Vec<_>>(), [(0, 7)]);
    assert_eq!(Runs::from_words(runs.words()), Some(runs));
    // A pair too many for the header is malformed.
    assert!(Runs::from_v1_words(&[v1.as_slice(), &[9, 1]].concat()).is_none());
}

#[test]
fn a_full_bucket_becomes_the_newest_exact_requests_and_never_admits_early() {
    let mut runs = Runs::default();
    // 300 requests at once under 1 000 a minute: one bucket, [0, 480).
    for _ in 0..3 {
        let now = Now::sliding(100);
        let mut report = Report::default();
        let quotas = [quota(Window::Minute, 1_000)];
        assert!(runs.check(&quotas, &now, 100, false, &mut report));
        runs.commit(&quotas, &now, 100);
    }
    // Reloaded to 100 a minute: exact, 255 words kept, all at the bucket's last ms.
    let exact = quota(Window::Minute, 100);
    assert_eq!(runs.used_at(&exact, &Now::sliding(1_000)), MAX_RUNS as u32);
    assert_eq!(runs.used_at(&exact, &Now::sliding(60_478)), MAX_RUNS as u32);
    assert_eq!(runs.used_at(&exact, &Now::sliding(60_479)), 0);
}

#[test]
fn idle_callers_prune_to_nothing() {
    let quotas = [quota(Window::Second, 5), quota(Window::Minute, 5)];
    let mut runs = Runs::default();
    attempt(&mut runs, &quotas, 0);
    assert!(!runs.prune_all(&Now::sliding(30_000)));
    assert!(runs.prune_all(&Now::sliding(61_000)));
    assert!(runs.words.is_empty());
}

#[test]
fn a_late_refund_takes_back_its_own_request_not_a_newer_one() {
    for limit in [3, 200] {
        let quotas = [quota(Window::Minute, limit)];
        let mut runs = after_requests(&quotas, &[1_000, 2_000, 30_000]);
        runs.refund(&quotas, &Now::sliding(2_000), 1);
        // The refunded request (at 2 000) is gone; the one at 30 000 still counts
        // until it leaves the window.
        assert_eq!(runs.used_at(&quotas[0], &Now::sliding(30_000)), 2);
        let after_first = if limit == 3 { 61_000 } else { 61_439 };
        assert_eq!(runs.used_at(&quotas[0], &Now::sliding(after_first)), 1);
        assert_eq!(runs.used_at(&quotas[0], &Now::sliding(89_999)), 1);
        // A refund of a request that was never counted (or already expired) frees nothing.
        runs.refund(&quotas, &Now::sliding(45_000), 1);
        runs.refund(&quotas, &Now::sliding(1_000), 1);
        assert_eq!(runs.used_at(&quotas[0], &Now::sliding(89_999)), 1);
    }
}

#[test]
fn a_caller_says_when_it_was_last_seen() {
    let quotas = [quota(Window::Minute, 10), quota(Window::Hour, 400)];
    let runs = after_requests(&quotas, &[1_000, 2_000, 3_000, 4_000]);
    // The exact minute knows the millisecond; the bucketed hour only its bucket's end.
    assert_eq!(runs.last_seen_ms(&Now::sliding(5_000)), 28_799);
    let minute = [quota(Window::Minute, 10)];
    let exact = after_requests(&minute, &[1_000, 4_000]);
    assert_eq!(exact.last_seen_ms(&Now::sliding(5_000)), 4_000);
    // A bucketed window answers to the bucket: the hour's bucket ends at 28 799.
    let hour = [quota(Window::Hour, 400)];
    let runs = after_requests(&hour, &[1_000]);
    assert_eq!(runs.last_seen_ms(&Now::sliding(5_000)), 28_799);
    assert_eq!(Runs::default().last_seen_ms(&Now::sliding(5_000)), 0);
}

mod periods {
    use super::*;
    use crate::limit::period::{Anchor, periods};
    use jiff::Timestamp;
    use jiff::tz::TimeZone;

    fn ms(text: &str) -> u64 {
        text.parse::<Timestamp>().unwrap().as_millisecond() as u64
    }

    fn at(zone: &TimeZone, anchor: Anchor, ms: u64) -> Now {
        Now::sliding(ms).with_periods(periods(zone, anchor, ms))
    }

    fn offer(runs: &mut Runs, quotas: &[Quota], now: &Now, cost: u32) -> Report {
        let mut report = Report::default();
        if runs.check(quotas, now, cost, false, &mut report) {
            runs.commit(quotas, now, cost);
        }
        report
    }

    #[test]
    fn a_monthly_quota_admits_exactly_its_limit_and_resets_on_the_first() {
        let utc = TimeZone::UTC;
        let quotas = [quota(Window::Month, 1_000_000)];
        let mut runs = Runs::default();
        let start = ms("2026-01-31T23:00:00Z");
        // 999 999 in large steps, then exactly one more.
        let first = offer(
            &mut runs,
            &quotas,
            &at(&utc, Anchor::CALENDAR, start),
            999_999,
        );
        assert!(!first.rejected());
        let now = at(&utc, Anchor::CALENDAR, start + 1_000);
        assert!(!offer(&mut runs, &quotas, &now, 1).rejected());
        let refused = offer(
            &mut runs,
            &quotas,
            &at(&utc, Anchor::CALENDAR, start + 2_000),
            1,
        );
        assert!(refused.rejected());
        // Retry-After is exactly the time to local midnight on February 1st.
        let midnight = ms("2026-02-01T00:00:00Z");
        assert_eq!(refused.retry_ms(), Some(midnight - start - 2_000));
        assert_eq!(refused.iter().next().unwrap().used, 1_000_000);
        let last = at(&utc, Anchor::CALENDAR, midnight - 1);
        assert!(offer(&mut runs, &quotas, &last, 1).rejected());
        let new_month = at(&utc, Anchor::CALENDAR, midnight);
        let report = offer(&mut runs, &quotas, &new_month, 1);
        assert!(!report.rejected());
        assert_eq!(report.iter().next().unwrap().used, 0);
        // Three words: the slot's total, its one bucket and the count.
        assert_eq!(runs.words().len(), 2 + 3);
    }

    #[test]
    fn a_dst_change_moves_the_reset_by_the_hour_it_takes() {
        let paris = TimeZone::get("Europe/Paris").unwrap();
        let quotas = [quota(Window::Month, 2), quota(Window::Year, 10)];
        let mut runs = Runs::default();
        let now = ms("2026-03-28T12:00:00+01:00");
        let a = Anchor::CALENDAR;
        assert!(!offer(&mut runs, &quotas, &at(&paris, a, now), 2).rejected());
        let refused = offer(&mut runs, &quotas, &at(&paris, a, now), 1);
        // From noon on the 28th to April 1st 00:00 +02:00: 3 days 12 hours less the
        // hour the clocks skip on the 29th.
        assert_eq!(refused.retry_ms(), Some((3 * 24 + 12 - 1) * 3_600_000));
        let statuses: Vec<_> = refused.iter().collect();
        assert_eq!(statuses[1].reset_ms, ms("2027-01-01T00:00:00+01:00") - now);
    }

    #[test]
    fn an_anchor_on_the_31st_resets_on_the_last_day_of_february() {
        let utc = TimeZone::UTC;
        let anchor = Anchor::of_date(jiff::civil::date(2026, 1, 31));
        let quotas = [quota(Window::Month, 1)];
        let mut runs = Runs::default();
        let t = ms("2026-02-27T23:59:59Z");
        assert!(!offer(&mut runs, &quotas, &at(&utc, anchor, t), 1).rejected());
        let refused = offer(&mut runs, &quotas, &at(&utc, anchor, t), 1);
        assert_eq!(refused.retry_ms(), Some(1_000));
        let feb28 = ms("2026-02-28T00:00:00Z");
        assert!(!offer(&mut runs, &quotas, &at(&utc, anchor, feb28), 1).rejected());
        // The next period ends on March 31st.
        let refused = offer(&mut runs, &quotas, &at(&utc, anchor, feb28), 1);
        assert_eq!(refused.retry_ms(), Some(ms("2026-03-31T00:00:00Z") - feb28));
    }

    #[test]
    fn period_counts_expire_without_knowing_the_anchor_and_survive_the_words() {
        let utc = TimeZone::UTC;
        let quotas = [quota(Window::Minute, 5), quota(Window::Month, 100)];
        let mut runs = Runs::default();
        let t = ms("2026-05-20T10:00:00Z");
        let anchor = Anchor::of_date(jiff::civil::date(2026, 1, 25));
        assert!(!offer(&mut runs, &quotas, &at(&utc, anchor, t), 3).rejected());
        let copy = Runs::from_words(runs.words()).expect("well formed");
        assert_eq!(copy, runs);
        // The sweeper's instant carries no periods: the month still counts ...
        assert!(!runs.clone().prune_all(&Now::sliding(t + 120_000)));
        // ... until its period ends on the 25th.
        assert!(runs.prune_all(&Now::sliding(ms("2026-05-25T00:00:00Z"))));
        // A refund at the admission's instant takes the period's units back.
        let mut runs = Runs::default();
        let now = at(&utc, anchor, t);
        offer(&mut runs, &quotas, &now, 4);
        runs.refund(&quotas, &now, 4);
        assert_eq!(runs.used_at(&quotas[1], &now), 0);
    }

    #[test]
    fn state_words_of_the_earlier_layout_still_read() {
        // One calendar-day run as written before billing periods existed: the
        // header counts 1 run in slot 4; no bits above the exact flags.
        let header: u64 = 1 << 32;
        let words = [header as u32, (header >> 32) as u32, 7, 20_000, 7];
        let runs = Runs::from_words(&words).expect("an older layout reads");
        assert_eq!(runs.words(), &words);
        let mut bad = words;
        bad[1] |= 1 << 31;
        assert!(Runs::from_words(&bad).is_none());
    }
}
