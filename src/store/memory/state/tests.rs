use super::*;
use std::sync::Arc;

use crate::limit::{Now, Window, quota};
use crate::store::bans::{Ban, Reason};
use crate::store::memory::tests::{decide, memory_store};
use crate::store::{Handle, Scope, Store, Verdict};

fn store_with_traffic() -> (Arc<MemoryStore>, Store, Scope) {
    let (memory, store) = memory_store(100);
    let quotas = vec![quota(Window::Minute, 3)];
    let total = [quota(Window::Hour, 100)];
    let scope = store.scope("standard", "anonymous", quotas, &total);
    (memory, store, scope)
}

#[test]
fn counters_survive_a_save_and_restore() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sluice.state");
    let (memory, _store, counters) = store_with_traffic();
    for _ in 0..3 {
        assert_eq!(decide(&memory, &counters, 7, 1_000), Verdict::Admitted);
    }
    save(&memory, &path, 1_000).unwrap();

    let (memory, fresh, counters) = store_with_traffic();
    let restored = restore(&memory, &path, 2_000).unwrap().unwrap();
    assert_eq!(
        (restored.callers, restored.totals, restored.saved_at_ms),
        (1, 1, 1_000)
    );
    assert_eq!(decide(&memory, &counters, 7, 2_000), Verdict::Limited);
    assert_eq!(decide(&memory, &counters, 8, 2_000), Verdict::Admitted);
    assert_eq!(fresh.tracked(), 2);
}

#[test]
fn bans_survive_a_save_and_restore_and_end_when_they_would_have() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sluice.state");
    let (memory, _store, _) = store_with_traffic();
    let manual = Ban {
        caller: "consumer:a|b".to_string(),
        reason: Reason::Manual("scraping".to_string()),
        until_ms: 61_000,
        refusals: 0,
        level: 0,
    };
    let automatic = Ban {
        caller: "ip:1.2.3.4".to_string(),
        reason: Reason::Automatic,
        until_ms: 601_000,
        refusals: 50,
        level: 1,
    };
    memory.bans.set(1, manual.clone(), 1_000);
    memory.bans.set(2, automatic.clone(), 1_000);
    save(&memory, &path, 1_000).unwrap();

    let (memory, fresh, _) = store_with_traffic();
    let restored = restore(&memory, &path, 2_000).unwrap().unwrap();
    assert_eq!(restored.bans, 2);
    let bans = memory.bans.list(2_000);
    assert_eq!(bans, [(1, manual), (2, automatic)]);
    assert_eq!(fresh.banned(1, 60_999), Some(61_000));
    assert_eq!(fresh.banned(1, 61_000), None);
    // A restart after a ban ended does not bring it back.
    let (later, _, _) = store_with_traffic();
    let restored = restore(&later, &path, 100_000).unwrap().unwrap();
    assert_eq!(restored.bans, 1);
}

#[test]
fn a_caller_with_every_window_busy_survives_a_save_and_restore() {
    let quotas = vec![
        quota(Window::Second, 1_000),
        quota(Window::Minute, 1_000),
        quota(Window::Hour, 1_000),
    ];
    let (memory, store) = memory_store(10);
    let counters = store.scope("busy", "anonymous", quotas.clone(), &[]);
    // One request per hour bucket, then per minute bucket, then per second bucket:
    // each window ends up with about 125 live runs.
    let start = 1_000_000_000;
    let hour = (0..125).map(|i| start + i * 28_800);
    let end_of_hour = start + 125 * 28_800;
    let minute = (0..125).map(|i| end_of_hour + i * 480);
    let end_of_minute = end_of_hour + 125 * 480;
    let second = (0..125).map(|i| end_of_minute + i * 8);
    let mut last = 0;
    for ms in hour.chain(minute).chain(second) {
        assert_eq!(decide(&memory, &counters, 7, ms), Verdict::Admitted);
        last = ms;
    }
    let used = |scope: &Scope| {
        let Handle::Memory(bound) = &scope.handle else {
            panic!("a scope of another engine");
        };
        let mut runs = bound.table.snapshot(7, &Now::sliding(last)).unwrap();
        assert!(runs.words().len() > 700, "{} words", runs.words().len());
        quotas
            .iter()
            .map(|q| runs.used_at(q, &Now::sliding(last)))
            .collect::<Vec<_>>()
    };
    let before = used(&counters);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sluice.state");
    save(&memory, &path, last).unwrap();

    let (memory, fresh) = memory_store(10);
    let counters = fresh.scope("busy", "anonymous", quotas.clone(), &[]);
    let restored = restore(&memory, &path, last).unwrap().unwrap();
    assert_eq!(restored.callers, 1);
    assert_eq!(used(&counters), before);
}

#[test]
fn a_first_layout_file_is_read_and_its_exact_pairs_converted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sluice.state");
    // Version 1: plan "standard/anonymous" (3 a minute, exact), caller 7 with
    // (1 000 ms, 3 requests) as one pair; no totals.
    let minute = Window::Minute as usize;
    let header: u64 = (1 << (8 * minute)) | (1 << (8 * 5 + minute));
    let mut body = Vec::new();
    body.extend_from_slice(MAGIC);
    body.extend_from_slice(&1u32.to_le_bytes());
    body.extend_from_slice(&1_000u64.to_le_bytes());
    body.extend_from_slice(&1u32.to_le_bytes());
    for name in ["standard", "anonymous"] {
        body.extend_from_slice(&(name.len() as u32).to_le_bytes());
        body.extend_from_slice(name.as_bytes());
    }
    body.extend_from_slice(&1u64.to_le_bytes());
    body.extend_from_slice(&7u64.to_le_bytes());
    body.extend_from_slice(&4u32.to_le_bytes());
    for word in [header as u32, (header >> 32) as u32, 1_000, 3] {
        body.extend_from_slice(&word.to_le_bytes());
    }
    body.extend_from_slice(&0u32.to_le_bytes());
    let digest = Sha256::digest(&body);
    body.extend_from_slice(&digest);
    std::fs::write(&path, &body).unwrap();

    let (memory, _store, counters) = store_with_traffic();
    let restored = restore(&memory, &path, 2_000).unwrap().unwrap();
    assert_eq!(restored.callers, 1);
    assert_eq!(decide(&memory, &counters, 7, 2_000), Verdict::Limited);
    assert_eq!(decide(&memory, &counters, 7, 60_999), Verdict::Limited);
    assert_eq!(decide(&memory, &counters, 7, 61_000), Verdict::Admitted);
}

#[test]
fn missing_corrupt_and_foreign_files_are_reported_not_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sluice.state");
    let (memory, _store, counters) = store_with_traffic();
    let memory = &*memory;
    assert!(restore(memory, &path, 1_000).unwrap().is_none());

    std::fs::write(&path, b"{\"not\": \"ours\"}").unwrap();
    assert!(matches!(
        restore(memory, &path, 1_000),
        Err(StateError::Invalid { .. })
    ));

    decide(memory, &counters, 7, 1_000);
    save(memory, &path, 1_000).unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();
    let err = restore(memory, &path, 1_000).unwrap_err();
    assert!(err.to_string().contains("checksum mismatch"), "{err}");

    save(memory, &path, 1_000).unwrap();
    let stale = restore(memory, &path, 1_000 + 21 * 86_400_000).unwrap_err();
    assert!(stale.to_string().contains("20 days"), "{stale}");
}

#[test]
fn a_corrupt_file_is_set_aside_not_overwritten_by_the_next_save() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sluice.state");
    let (memory, _store, counters) = store_with_traffic();
    decide(&memory, &counters, 7, 1_000);
    save(&memory, &path, 1_000).unwrap();
    let mut torn = std::fs::read(&path).unwrap();
    torn.truncate(torn.len() / 2);
    std::fs::write(&path, &torn).unwrap();

    let restarted = MemoryStore::new(100, Some(path.clone()));
    restarted.restore_state(2_000);
    let aside = dir.path().join("sluice.state.corrupt-2000");
    assert_eq!(
        std::fs::read(&aside).unwrap(),
        torn,
        "the torn file, kept as it was"
    );
    assert!(
        !path.exists(),
        "the torn file no longer stands where the next save goes"
    );
    restarted.save_state(3_000);
    assert!(
        restore(&restarted, &path, 3_000).is_ok(),
        "the next save is whole"
    );
    assert_eq!(
        std::fs::read(&aside).unwrap(),
        torn,
        "and did not touch the set-aside file"
    );
}

#[test]
fn keyed_buckets_parts_survive_a_save_and_a_store_without_any_writes_version_3() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sluice.state");
    let (memory, store, counters) = store_with_traffic();
    assert_eq!(decide(&memory, &counters, 7, 1_000), Verdict::Admitted);
    save(&memory, &path, 1_000).unwrap();
    let version = |path: &Path| std::fs::read(path).unwrap()[8..12].to_vec();
    assert_eq!(version(&path), VERSION_NO_PARTS.to_le_bytes());

    store.name(&counters, 7, 1_000, || "header:x-org=acme".to_string());
    save(&memory, &path, 1_000).unwrap();
    assert_eq!(version(&path), VERSION.to_le_bytes());
    let (memory, _fresh, counters) = store_with_traffic();
    restore(&memory, &path, 2_000).unwrap().unwrap();
    let Handle::Memory(bound) = &counters.handle else {
        unreachable!("a memory store's scope")
    };
    let names = bound.known_names().unwrap();
    assert_eq!(names.get(7).as_deref(), Some("header:x-org=acme"));
    // Swept once its bucket is gone.
    names.sweep(2_000, |_| false);
    assert_eq!(names.get(7), None);
}
