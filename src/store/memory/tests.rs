use super::*;
use crate::limit::{Quota, Window, quota};
use crate::store::{Handle, Store};

fn minute(limit: u32) -> Vec<Quota> {
    vec![quota(Window::Minute, limit)]
}

/// A memory store, and the same store behind the contract.
pub(crate) fn memory_store(max_keys: usize) -> (Arc<MemoryStore>, Store) {
    let memory = Arc::new(MemoryStore::new(max_keys, None));
    (memory.clone(), Store::Memory(memory))
}

/// Decides one request in the memory engine itself, without the memo in front.
pub(crate) fn decide(store: &MemoryStore, scope: &Scope, key: u64, ms: u64) -> Verdict {
    let Handle::Memory(bound) = &scope.handle else {
        panic!("a scope of another engine");
    };
    store.decide(
        scope,
        bound,
        key,
        &Now::sliding(ms),
        1,
        &mut Report::default(),
    )
}

fn tracked(scope: &Scope, key: u64, ms: u64) -> bool {
    let Handle::Memory(bound) = &scope.handle else {
        panic!("a scope of another engine");
    };
    bound.table.snapshot(key, &Now::sliding(ms)).is_some()
}

/// The rule this replaces protected callers near a limit and refused newcomers
/// when every tracked caller was near one: a spray of fresh keys
/// that each used half a budget locked every newcomer out.
#[test]
fn a_flood_of_new_callers_is_never_refused_and_evicts_whatever_the_usage() {
    let (memory, store) = memory_store(10);
    let counters = store.scope("p", "anonymous", minute(2), &[]);
    // Ten callers, each at its limit.
    for key in 0..10 {
        for _ in 0..2 {
            assert_eq!(decide(&memory, &counters, key, 1_000), Verdict::Admitted);
        }
    }
    // A flood of fresh keys, each near its limit too, finds the store full.
    for key in 100..1_100 {
        assert_eq!(
            decide(&memory, &counters, key, 2_000 + key),
            Verdict::Admitted
        );
    }
    assert_eq!(store.tracked(), 10);
    assert_eq!(store.evicted(), 1_000);
    // The first ten were the least recently seen: gone, and back with a fresh
    // budget, as any fresh key of the flood had.
    for key in 0..10 {
        assert!(!tracked(&counters, key, 5_000), "caller {key}");
    }
    assert_eq!(decide(&memory, &counters, 0, 5_000), Verdict::Admitted);
    assert_eq!(store.tracked(), 10);
}

#[test]
fn idle_callers_are_evicted_before_active_ones() {
    let (memory, store) = memory_store(4);
    let counters = store.scope("p", "anonymous", minute(5), &[]);
    // Two callers seen long ago (idle a minute later), two busy ones seen since.
    for key in [1, 2] {
        assert_eq!(decide(&memory, &counters, key, 0), Verdict::Admitted);
    }
    for key in [3, 4] {
        assert_eq!(decide(&memory, &counters, key, 30_000), Verdict::Admitted);
    }
    let later = 61_000;
    for key in [5, 6] {
        assert_eq!(decide(&memory, &counters, key, later), Verdict::Admitted);
    }
    assert_eq!(store.evicted(), 2);
    assert_eq!(store.tracked(), 4);
    for key in [1, 2] {
        assert!(!tracked(&counters, key, later), "idle caller {key}");
    }
    for key in [3, 4, 5, 6] {
        assert!(tracked(&counters, key, later), "active caller {key}");
    }
}

#[test]
fn the_least_recently_seen_is_evicted_whatever_its_usage() {
    let (memory, store) = memory_store(3);
    let counters = store.scope("p", "anonymous", minute(2), &[]);
    // Caller 1 spends its whole budget first; 2 and 3 use half of theirs later.
    assert_eq!(decide(&memory, &counters, 1, 1_000), Verdict::Admitted);
    assert_eq!(decide(&memory, &counters, 1, 1_001), Verdict::Admitted);
    assert_eq!(decide(&memory, &counters, 1, 1_002), Verdict::Limited);
    assert_eq!(decide(&memory, &counters, 2, 2_000), Verdict::Admitted);
    assert_eq!(decide(&memory, &counters, 3, 3_000), Verdict::Admitted);
    // A newcomer takes the place of the least recently seen: caller 1, at its limit.
    assert_eq!(decide(&memory, &counters, 4, 4_000), Verdict::Admitted);
    assert!(!tracked(&counters, 1, 4_000));
    assert_eq!(store.evicted(), 1);
    // Caller 2 keeps sending, so the next newcomer evicts caller 3 instead.
    assert_eq!(decide(&memory, &counters, 2, 5_000), Verdict::Admitted);
    assert_eq!(decide(&memory, &counters, 5, 6_000), Verdict::Admitted);
    assert!(!tracked(&counters, 3, 6_000));
    for key in [2, 4, 5] {
        assert!(tracked(&counters, key, 6_000), "caller {key}");
    }
    // Caller 2 still has its spent budget.
    assert_eq!(decide(&memory, &counters, 2, 7_000), Verdict::Limited);
}

#[test]
fn consumers_are_never_evicted_and_take_no_slot() {
    let (memory, store) = memory_store(2);
    let counters = store.scope("p", "registered", minute(5), &[]);
    // Consumer 7 was counted before the store knew it for one (counters restored
    // from a state file come back before the config names the consumers).
    for ms in 1..=4 {
        assert_eq!(decide(&memory, &counters, 7, ms), Verdict::Admitted);
    }
    memory.reserve([7, 8]);
    for ms in 11..=14 {
        assert_eq!(decide(&memory, &counters, 8, ms), Verdict::Admitted);
    }
    // Both slots stay free for other callers: a flood fills them, and evicts
    // only its own.
    for key in 100..1_100 {
        assert_eq!(
            decide(&memory, &counters, key, 1_000 + key),
            Verdict::Admitted
        );
    }
    assert_eq!(store.tracked(), 2 + 2);
    assert_eq!(store.evicted(), 998);
    // Each consumer that used 4 of 5 has exactly one left.
    for key in [7, 8] {
        assert_eq!(decide(&memory, &counters, key, 3_000), Verdict::Admitted);
        assert_eq!(decide(&memory, &counters, key, 3_001), Verdict::Limited);
    }
    // No longer a consumer: its counters take a slot if there is one (there is
    // not here, so they go, counted as an eviction).
    memory.reserve([8]);
    assert!(!tracked(&counters, 7, 3_002));
    assert_eq!(store.tracked(), 2 + 1);
    assert_eq!(store.evicted(), 999);
    assert_eq!(decide(&memory, &counters, 8, 3_003), Verdict::Limited);
}

#[test]
fn evicting_a_banned_callers_counters_keeps_its_ban() {
    let (memory, store) = memory_store(1);
    let counters = store.scope("p", "anonymous", minute(5), &[]);
    assert_eq!(decide(&memory, &counters, 1, 1_000), Verdict::Admitted);
    let ban = crate::store::Ban {
        caller: "ip:127.0.0.1".to_string(),
        reason: crate::store::Reason::Manual("abuse".to_string()),
        until_ms: 600_000,
        refusals: 0,
        level: 0,
    };
    assert!(store.ban_table().set(1, ban, 1_000));
    assert_eq!(decide(&memory, &counters, 2, 2_000), Verdict::Admitted);
    assert!(!tracked(&counters, 1, 2_000));
    assert_eq!(store.banned(1, 2_000), Some(600_000));
}

#[test]
fn the_sweep_drops_idle_callers_only() {
    let (memory, store) = memory_store(100);
    let counters = store.scope("p", "anonymous", minute(5), &[]);
    decide(&memory, &counters, 1, 0);
    decide(&memory, &counters, 2, 30_000);
    assert_eq!(memory.sweep(&Now::sliding(61_500)), 1);
    assert_eq!(store.tracked(), 1);
    assert_eq!(memory.sweep(&Now::sliding(100_000)), 1);
    assert_eq!(store.tracked(), 0);
}

/// A cost known after the response is charged to a caller evicted while it was
/// being served (newcomers churned the table meanwhile): it is tracked again with
/// the charge, not let off.
#[test]
fn a_charge_after_the_response_follows_a_caller_evicted_meanwhile() {
    let (memory, store) = memory_store(2);
    let counters = store.scope("p", "anonymous", minute(10), &[]);
    let Handle::Memory(bound) = &counters.handle else {
        panic!("a scope of another engine");
    };
    assert_eq!(decide(&memory, &counters, 1, 1_000), Verdict::Admitted);
    // While caller 1's response streams, two newcomers take both slots.
    for key in [2, 3] {
        assert_eq!(decide(&memory, &counters, key, 2_000), Verdict::Admitted);
    }
    assert!(!tracked(&counters, 1, 3_000), "caller 1 was evicted");
    memory.charge(&counters, bound, 1, &Now::sliding(4_000), 8);
    assert!(tracked(&counters, 1, 4_000), "caller 1 is tracked again");
    assert_eq!(store.tracked(), 2);
    // 8 charged (the admission was evicted with the counters), 10 a minute: two
    // more requests fit.
    assert_eq!(decide(&memory, &counters, 1, 5_000), Verdict::Admitted);
    assert_eq!(decide(&memory, &counters, 1, 5_001), Verdict::Admitted);
    assert_eq!(decide(&memory, &counters, 1, 5_002), Verdict::Limited);
}
