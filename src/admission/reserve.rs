//! What a `cost_after` request holds at admission, and the bound on what one answer
//! charges.
//!
//! A route's `reserve` makes admission count the reservation (instead of `cost`,
//! when larger) while the request is in flight, so that concurrent requests are
//! admitted only while their reservations fit; the settle replaces it with the
//! actual when the answer ends. `reserve = "average"` reserves what the caller's
//! recent answers on the route cost ([`Averages`]: a fixed table per process, so a
//! spray of fresh callers costs no memory, only the averages it pushes out), and
//! `default_cost` for a caller it has none of. A reservation never exceeds the
//! route's `max_cost`, nor the smallest window of the caller's plan (it could never
//! be admitted). The charge of one answer is clamped at `max_cost`
//! ([`Admission::clamp`]): logged (at most once a second) and counted in
//! `sluice_cost_clamped_total`.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{Admission, Standing};
use crate::config::route::{Reserve, Route};
use crate::snapshot::{PlanLimit, Snapshot};
use crate::store::CallerKey;

/// Callers' averages kept at once (per process, over all routes): 32 KiB.
const SLOTS: usize = 4096;

/// Each caller's recent average cost on each `reserve = "average"` route: one slot
/// per (route, caller), picked by a hash, holding the hash's high half as a tag and
/// the average (an exponentially weighted one, each new answer weighing 1/4). A
/// caller whose slot another took is a caller without an average.
#[derive(Debug)]
pub(crate) struct Averages {
    slots: Box<[AtomicU64]>,
}

impl Default for Averages {
    fn default() -> Averages {
        Averages {
            slots: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl Averages {
    /// The slot and tag of `caller` on `route`.
    fn place(route: &str, caller: CallerKey) -> (usize, u32) {
        // FNV-1a over the route's name, then the caller's key mixed in.
        let named = (route.bytes()).fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        let mixed = (named ^ caller.rotate_left(29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let tag = (mixed >> 32) as u32 | 1;
        ((mixed as usize) % SLOTS, tag)
    }

    /// `caller`'s recent average on `route`, if it has one.
    pub(crate) fn get(&self, route: &str, caller: CallerKey) -> Option<u32> {
        let (slot, tag) = Self::place(route, caller);
        let packed = self.slots[slot].load(Ordering::Relaxed);
        ((packed >> 32) as u32 == tag).then_some(packed as u32)
    }

    /// Adds an answer of `cost` to `caller`'s average on `route`.
    pub(crate) fn record(&self, route: &str, caller: CallerKey, cost: u32) {
        let (slot, tag) = Self::place(route, caller);
        let average = match self.get(route, caller) {
            // Rounded to the nearest unit, so that it reaches a steady cost.
            Some(before) => ((u64::from(before) * 3 + u64::from(cost) + 2) / 4) as u32,
            None => cost,
        };
        let packed = u64::from(tag) << 32 | u64::from(average);
        self.slots[slot].store(packed, Ordering::Relaxed);
    }
}

/// When a clamp was last logged (ms since the epoch), so that an upstream that
/// reports huge costs on every answer does not flood the log.
static CLAMP_LOGGED_MS: AtomicU64 = AtomicU64::new(0);

impl Admission {
    /// What admission counts for a request of `route` by the caller `standing`
    /// describes: the route's `cost`, or with `reserve` the reservation when
    /// larger, within `max_cost` and the smallest window of the caller's plan.
    pub(super) fn held(&self, snapshot: &Snapshot, route: &Route, standing: Standing<'_>) -> u32 {
        let cost = route.cost.get();
        let reserved = match (route.reserve, &route.cost_after) {
            (Some(Reserve::Units(units)), _) => units.get(),
            (Some(Reserve::Average), Some(cost_after)) => (self.averages)
                .get(&route.name, standing.budget)
                .unwrap_or(cost_after.default_cost),
            _ => return cost,
        };
        let caller = standing.caller;
        let smallest = (route.policies.iter())
            .filter_map(|&policy| {
                match snapshot.limits_for(policy, caller.plan, caller.consumer()) {
                    PlanLimit::Limits(limits) => {
                        let scope = &limits.scope;
                        scope
                            .quotas()
                            .iter()
                            .chain(scope.total())
                            .map(|q| q.limit.get())
                            .min()
                    }
                    _ => None,
                }
            })
            .min()
            .unwrap_or(u32::MAX);
        reserved.min(route.max_cost.get()).min(smallest).max(cost)
    }

    /// `cost`, what an answer of `route` says it cost, bounded by the route's
    /// `max_cost`; a clamp is counted and logged.
    pub(super) fn clamp(
        metrics: &crate::observe::metrics::cost::CostMetrics,
        route: &Route,
        cost: u32,
        now_ms: u64,
    ) -> u32 {
        let max = route.max_cost.get();
        if cost <= max {
            return cost;
        }
        metrics.clamped.with_label_values(&[&route.name]).inc();
        let last = CLAMP_LOGGED_MS.load(Ordering::Relaxed);
        if now_ms >= last + 1_000
            && CLAMP_LOGGED_MS
                .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(route = %route.name, said = cost, max_cost = max, "an answer's cost was clamped at the route's max_cost (sluice_cost_clamped_total counts every one)");
        }
        max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_average_follows_its_callers_answers_and_a_stranger_has_none() {
        let averages = Averages::default();
        assert_eq!(averages.get("chat", 7), None);
        averages.record("chat", 7, 40);
        assert_eq!(averages.get("chat", 7), Some(40));
        averages.record("chat", 7, 80);
        assert_eq!(averages.get("chat", 7), Some(50));
        for _ in 0..20 {
            averages.record("chat", 7, 80);
        }
        assert_eq!(
            averages.get("chat", 7),
            Some(79),
            "recent answers weigh most"
        );
        assert_eq!(averages.get("chat", 8), None, "another caller");
        assert_eq!(averages.get("other", 7), None, "another route");
    }

    #[test]
    fn a_spray_of_callers_keeps_the_table_its_size() {
        let averages = Averages::default();
        for caller in 0..100_000 {
            averages.record("chat", caller, 10);
        }
        assert_eq!(averages.slots.len(), SLOTS);
        let known = (0..100_000)
            .filter(|&c| averages.get("chat", c).is_some())
            .count();
        assert!(known <= SLOTS, "{known}");
    }
}
