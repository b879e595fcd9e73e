//! [`Runs::give_back`]: units handed back without the instant they were counted
//! at (Envoy's `is_negative_hits`), taken off the newest entries of every window.
//!
//! A refund ([`Runs::refund`]) knows the instant it undoes; a give-back does not,
//! so it undoes the most recent counts: the window then holds what it would have
//! held had the last units never been counted. Nothing below zero is taken, and
//! the oldest entries stay, so no window frees room earlier than its oldest
//! remaining request allows.

use super::{Now, Quota, Runs};

impl Runs {
    /// Takes up to `units` off each quota's window at `now`, newest entries first.
    pub fn give_back(&mut self, quotas: &[Quota], now: &Now, units: u32) {
        for quota in quotas {
            let (slot, clock) = self.prepare(quota, now);
            let mut left = units;
            while left > 0 {
                let span = self.prune(slot, &clock);
                let words = self.span_words(span);
                let Some(newest) = words.chunks_exact(span.width).last() else {
                    break;
                };
                let before = self.used(span);
                self.remove(slot, newest[0], left);
                let after = self.used(self.span(slot));
                if after >= before {
                    break;
                }
                left = left.saturating_sub(before - after);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{Report, Window, quota};

    fn count(runs: &mut Runs, quotas: &[Quota], ms: u64, cost: u32) -> bool {
        let now = Now::sliding(ms);
        let mut report = Report::default();
        let admitted = runs.check(quotas, &now, cost, false, &mut report);
        if admitted {
            runs.commit(quotas, &now, cost);
        }
        admitted
    }

    #[test]
    fn an_exact_window_gives_back_its_newest_requests_and_keeps_its_oldest() {
        let quotas = [quota(Window::Minute, 3)];
        let mut runs = Runs::default();
        for ms in [0, 10, 20] {
            assert!(count(&mut runs, &quotas, ms, 1));
        }
        runs.give_back(&quotas, &Now::sliding(30), 2);
        assert_eq!(runs.used_at(&quotas[0], &Now::sliding(30)), 1);
        assert!(count(&mut runs, &quotas, 40, 2));
        assert!(!count(&mut runs, &quotas, 50, 1));
        // The request at 0 was kept: room again at 60_000, not before.
        assert!(!count(&mut runs, &quotas, 59_999, 1));
        assert!(count(&mut runs, &quotas, 60_000, 1));
    }

    #[test]
    fn a_bucketed_window_gives_back_across_runs_and_never_below_zero() {
        let quotas = [quota(Window::Minute, 200), quota(Window::Second, 150)];
        let mut runs = Runs::default();
        assert!(count(&mut runs, &quotas, 100, 50));
        assert!(count(&mut runs, &quotas, 1_500, 100));
        runs.give_back(&quotas, &Now::sliding(1_600), 120);
        assert_eq!(runs.used_at(&quotas[0], &Now::sliding(1_600)), 30);
        // The second's window had only the 100 of 1_500 left: it empties.
        assert_eq!(runs.used_at(&quotas[1], &Now::sliding(1_600)), 0);
        runs.give_back(&quotas, &Now::sliding(1_700), 1_000);
        assert_eq!(runs.used_at(&quotas[0], &Now::sliding(1_700)), 0);
        assert!(count(&mut runs, &quotas, 1_800, 150));
    }
}
