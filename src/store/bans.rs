//! Bans: callers shut out for a while, automatically or by hand.
//!
//! A caller is what the limiter keys on (a consumer, or a client IP with IPv6 per
//! prefix). Automatically, a caller is banned after `after` refusals inside `within`:
//! 429s, and unknown-key 401s counted against the client IP (credential stuffing).
//! With `escalate`, a repeat offender's next ban is twice as long as its last, up to a
//! day; an offence is remembered for a day after its ban ends.
//!
//! [`BanTable`] is the in-process table: the memory store's bans, and the Redis
//! store's copy of the fleet's bans (and its fallback while Redis is down). Per caller
//! it holds the refusals of the current and the previous `within` (weighted, the
//! usual sliding estimate) and the ban. It is bounded by `max_bans` callers: a full
//! table first drops what no longer matters (expired counts and bans), then the caller
//! with the fewest refusals that is not banned; live bans are never dropped to make
//! room, so filling the table cannot free an abuser. When every entry is a live ban, a
//! new offender is not recorded (counted in `dropped`) until a ban ends: it is still
//! limited, just not banned.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;

use super::CallerKey;
use crate::config::AutoBan;

const SHARDS: usize = 16;
/// How long an automatic ban's offence is remembered after it ends, for `escalate`.
const REMEMBER_MS: u64 = 86_400_000;
/// The longest ban escalation reaches.
const MAX_BAN_MS: u64 = 86_400_000;

/// Why a caller is banned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// Too many refusals inside `within`.
    Automatic,
    /// Through `POST /admin/bans`, with the operator's words.
    Manual(String),
}

impl Reason {
    /// The `reason` label of `sluice_bans_total`.
    pub fn label(&self) -> &'static str {
        match self {
            Reason::Automatic => "automatic",
            Reason::Manual(_) => "manual",
        }
    }

    /// What the admin API shows.
    pub fn text(&self) -> &str {
        match self {
            Reason::Automatic => "automatic",
            Reason::Manual(text) => text,
        }
    }
}

/// One ban.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ban {
    /// Who, as the admin API names callers: `ip:1.2.3.4`, `consumer:acme`.
    pub caller: String,
    /// Why: automatic (after `[ban] after` refusals) or by an operator.
    pub reason: Reason,
    /// Wall-clock ms at which it ends.
    pub until_ms: u64,
    /// Refusals that led to it (0 for a manual ban).
    pub refusals: u32,
    /// Automatic bans of this caller before this one that are still remembered.
    pub level: u32,
}

/// One caller's entry.
#[derive(Debug, Default)]
struct Entry {
    /// Start (ms) of the current `within` window, its refusals and the previous one's.
    window_ms: u64,
    current: u32,
    previous: u32,
    ban: Option<Ban>,
    /// Automatic bans remembered for escalation, and until when.
    level: u32,
    remember_until_ms: u64,
}

impl Entry {
    /// Refusals inside the `within` before `now_ms` (sliding estimate).
    fn refusals(&mut self, now_ms: u64, within_ms: u64) -> u32 {
        self.roll(now_ms, within_ms);
        let into = now_ms.saturating_sub(self.window_ms) as f64 / within_ms as f64;
        let previous = f64::from(self.previous) * (1.0 - into).max(0.0);
        self.current + previous.ceil() as u32
    }

    /// Moves the windows forward to the one holding `now_ms`.
    fn roll(&mut self, now_ms: u64, within_ms: u64) {
        let window = now_ms - now_ms % within_ms;
        if window == self.window_ms {
            return;
        }
        self.previous = if window == self.window_ms + within_ms {
            self.current
        } else {
            0
        };
        self.current = 0;
        self.window_ms = window;
    }

    fn banned_at(&self, now_ms: u64) -> bool {
        self.ban.as_ref().is_some_and(|b| b.until_ms > now_ms)
    }

    /// Nothing in it still matters at `now_ms`.
    fn is_stale(&self, now_ms: u64, within_ms: u64) -> bool {
        !self.banned_at(now_ms)
            && self.remember_until_ms <= now_ms
            && self.window_ms + 2 * within_ms <= now_ms
    }
}

/// The in-process ban table.
#[derive(Debug)]
pub struct BanTable {
    shards: Box<[Mutex<HashMap<CallerKey, Entry>>]>,
    /// Entries held, never above `max`.
    entries: AtomicUsize,
    max: AtomicUsize,
    /// Bans set (possibly ended since; exact after a sweep): 0 skips every lookup.
    active: AtomicUsize,
    /// Offenders not recorded because the table was full of live bans.
    dropped: AtomicU64,
}

impl BanTable {
    /// An empty table holding at most `max` bans (`[ban] max_bans`).
    pub fn new(max: usize) -> BanTable {
        BanTable {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            entries: AtomicUsize::new(0),
            max: AtomicUsize::new(max),
            active: AtomicUsize::new(0),
            dropped: AtomicU64::new(0),
        }
    }

    /// Applies a new `max_bans` (entries above it leave as they expire).
    pub fn set_max(&self, max: usize) {
        self.max.store(max, Ordering::Relaxed);
    }

    fn shard(&self, key: CallerKey) -> &Mutex<HashMap<CallerKey, Entry>> {
        &self.shards[(key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 60) as usize % SHARDS]
    }

    /// When `key`'s ban ends, if it is banned at `now_ms`.
    pub fn banned(&self, key: CallerKey, now_ms: u64) -> Option<u64> {
        if self.active.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let shard = self.shard(key).lock();
        let until = shard.get(&key)?.ban.as_ref()?.until_ms;
        (until > now_ms).then_some(until)
    }

    /// Counts one refusal of `key` at `now_ms`; returns the ban it earns, if this one
    /// crosses `auto.after`. `caller` names the caller, asked only for a new ban.
    pub fn strike(
        &self,
        key: CallerKey,
        caller: impl FnOnce() -> String,
        now_ms: u64,
        auto: &AutoBan,
    ) -> Option<Ban> {
        self.strikes(key, 1, caller, now_ms, auto)
    }

    /// Counts `count` refusals of `key` at `now_ms` (see [`BanTable::strike`]).
    pub fn strikes(
        &self,
        key: CallerKey,
        count: u32,
        caller: impl FnOnce() -> String,
        now_ms: u64,
        auto: &AutoBan,
    ) -> Option<Ban> {
        let within_ms = auto.within.as_millis().max(1) as u64;
        let mut shard = self.shard(key).lock();
        if !shard.contains_key(&key) && !self.make_room(&mut shard, now_ms, within_ms) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let entry = shard.entry(key).or_default();
        if entry.banned_at(now_ms) {
            return None;
        }
        entry.refusals(now_ms, within_ms);
        entry.current = entry.current.saturating_add(count);
        let refusals = entry.refusals(now_ms, within_ms);
        if refusals < auto.after.get() {
            return None;
        }
        let level = if entry.remember_until_ms > now_ms {
            entry.level
        } else {
            0
        };
        let base = auto.duration.as_millis() as u64;
        let duration = if auto.escalate {
            base.saturating_mul(1 << level.min(20)).min(MAX_BAN_MS)
        } else {
            base
        };
        let ban = Ban {
            caller: caller(),
            reason: Reason::Automatic,
            until_ms: now_ms + duration,
            refusals,
            level,
        };
        entry.level = level + 1;
        entry.remember_until_ms = ban.until_ms + REMEMBER_MS;
        entry.current = 0;
        entry.previous = 0;
        if entry.ban.replace(ban.clone()).is_none() {
            self.active.fetch_add(1, Ordering::Relaxed);
        }
        Some(ban)
    }

    /// Sets (or replaces) `key`'s ban; false if the table is full of live bans.
    pub fn set(&self, key: CallerKey, ban: Ban, now_ms: u64) -> bool {
        let mut shard = self.shard(key).lock();
        if !shard.contains_key(&key) && !self.make_room(&mut shard, now_ms, 1) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let entry = shard.entry(key).or_default();
        if ban.reason == Reason::Automatic {
            entry.level = ban.level + 1;
            entry.remember_until_ms = ban.until_ms + REMEMBER_MS;
        }
        if entry.ban.replace(ban).is_none() {
            self.active.fetch_add(1, Ordering::Relaxed);
        }
        true
    }

    /// Lifts `key`'s ban and forgets its offences; true if it was banned.
    pub fn lift(&self, key: CallerKey, now_ms: u64) -> bool {
        let mut shard = self.shard(key).lock();
        let Some(entry) = shard.remove(&key) else {
            return false;
        };
        self.entries.fetch_sub(1, Ordering::Relaxed);
        if entry.ban.is_some() {
            self.active.fetch_sub(1, Ordering::Relaxed);
        }
        entry.banned_at(now_ms)
    }

    /// Every live ban at `now_ms`, with its key.
    pub fn list(&self, now_ms: u64) -> Vec<(CallerKey, Ban)> {
        let mut bans = Vec::new();
        for shard in self.shards.iter() {
            for (key, entry) in shard.lock().iter() {
                if let Some(ban) = entry.ban.as_ref().filter(|b| b.until_ms > now_ms) {
                    bans.push((*key, ban.clone()));
                }
            }
        }
        bans.sort_by_key(|(_, ban)| ban.until_ms);
        bans
    }

    /// Live bans at `now_ms`.
    pub fn active(&self, now_ms: u64) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().values().filter(|e| e.banned_at(now_ms)).count())
            .sum()
    }

    /// Offenders not recorded because the table was full of live bans.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Entries held (bans, remembered offences and refusal counts).
    pub fn len(&self) -> usize {
        self.entries.load(Ordering::Relaxed)
    }

    /// Whether no caller is banned.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops what no longer matters at `now_ms` (ended bans are kept while their
    /// offence is remembered); returns how many entries went.
    pub fn sweep(&self, now_ms: u64, within_ms: u64) -> usize {
        let mut dropped = 0;
        let mut active = 0;
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            let before = shard.len();
            shard.retain(|_, e| !e.is_stale(now_ms, within_ms.max(1)));
            for entry in shard.values_mut() {
                if entry.ban.as_ref().is_some_and(|b| b.until_ms <= now_ms) {
                    entry.ban = None;
                }
                active += usize::from(entry.ban.is_some());
            }
            dropped += before - shard.len();
        }
        self.entries.fetch_sub(dropped, Ordering::Relaxed);
        self.active.store(active, Ordering::Relaxed);
        dropped
    }

    /// Room for one more entry in `shard`: under `max`, or by dropping a stale entry,
    /// or else the entry with the fewest refusals that is not banned. False if every
    /// entry of the shard is a live ban.
    fn make_room(
        &self,
        shard: &mut HashMap<CallerKey, Entry>,
        now_ms: u64,
        within_ms: u64,
    ) -> bool {
        let taken = self
            .entries
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.max.load(Ordering::Relaxed)).then_some(n + 1)
            })
            .is_ok();
        if taken {
            return true;
        }
        let victim = shard
            .iter_mut()
            .filter(|(_, e)| !e.banned_at(now_ms))
            .min_by_key(|(_, e)| {
                let stale = e.is_stale(now_ms, within_ms);
                (!stale, e.current + e.previous, e.remember_until_ms)
            })
            .map(|(key, _)| *key);
        let Some(victim) = victim else {
            return false;
        };
        if let Some(entry) = shard.remove(&victim)
            && entry.ban.is_some()
        {
            self.active.fetch_sub(1, Ordering::Relaxed);
        }
        // The victim's place goes to the new entry: the count stays.
        true
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;
    use std::time::Duration;

    use super::*;

    fn auto(after: u32, escalate: bool) -> AutoBan {
        AutoBan {
            after: NonZeroU32::new(after).unwrap(),
            within: Duration::from_secs(60),
            duration: Duration::from_secs(600),
            escalate,
            shadow: false,
        }
    }

    fn name() -> String {
        "ip:1.2.3.4".to_string()
    }

    #[test]
    fn after_refusals_inside_within_a_caller_is_banned_for_duration() {
        let table = BanTable::new(100);
        let rules = auto(3, false);
        assert!(table.strike(1, name, 1_000, &rules).is_none());
        assert!(table.strike(1, name, 2_000, &rules).is_none());
        let ban = table
            .strike(1, name, 3_000, &rules)
            .expect("the third refusal bans");
        assert_eq!(
            (ban.until_ms, ban.refusals, ban.reason),
            (603_000, 3, Reason::Automatic)
        );
        assert_eq!(table.banned(1, 602_999), Some(603_000));
        assert_eq!(table.banned(1, 603_000), None);
        assert_eq!(table.banned(2, 3_000), None, "only that caller");
    }

    #[test]
    fn refusals_spread_wider_than_within_do_not_ban() {
        let table = BanTable::new(100);
        let rules = auto(3, false);
        for minute in 0..10u64 {
            assert!(table.strike(1, name, minute * 70_000, &rules).is_none());
        }
    }

    #[test]
    fn a_repeat_offender_is_banned_twice_as_long_up_to_a_day() {
        let table = BanTable::new(100);
        let rules = auto(1, true);
        let mut now = 0;
        let mut lengths = Vec::new();
        for _ in 0..10 {
            let ban = table.strike(1, name, now, &rules).unwrap();
            lengths.push((ban.until_ms - now) / 60_000);
            now = ban.until_ms + 1_000;
        }
        assert_eq!(
            lengths,
            [10, 20, 40, 80, 160, 320, 640, 1_280, 1_440, 1_440]
        );
        // A day without offences and the next ban is the first again.
        let ban = table.strike(1, name, now + REMEMBER_MS, &rules).unwrap();
        assert_eq!(ban.until_ms - (now + REMEMBER_MS), 600_000);
    }

    #[test]
    fn a_full_table_drops_refusal_counts_but_never_live_bans() {
        let table = BanTable::new(4);
        let rules = auto(2, false);
        // Two banned callers, two with one refusal each.
        for key in [1, 2] {
            table.strike(key, name, 0, &rules);
            assert!(table.strike(key, name, 0, &rules).is_some());
        }
        table.strike(3, name, 0, &rules);
        table.strike(4, name, 0, &rules);
        assert_eq!(table.len(), 4);
        // New callers take the places of callers with refusal counts only...
        for key in 10..20 {
            table.strike(key, name, 1_000, &rules);
        }
        assert_eq!(table.len(), 4);
        assert!(table.banned(1, 1_000).is_some() && table.banned(2, 1_000).is_some());
        // ... and when every place is a live ban, a new offender is not recorded.
        let full = BanTable::new(2);
        for key in [1, 2] {
            full.strike(key, name, 0, &rules);
            full.strike(key, name, 0, &rules);
        }
        assert!(full.strike(3, name, 0, &rules).is_none());
        assert!(full.strike(3, name, 0, &rules).is_none());
        assert_eq!(full.dropped(), 2);
        assert_eq!(full.active(0), 2);
    }

    #[test]
    fn lifting_ends_a_ban_and_forgets_the_offence() {
        let table = BanTable::new(10);
        let rules = auto(1, true);
        table.strike(7, name, 0, &rules).unwrap();
        assert!(table.lift(7, 1));
        assert_eq!(table.banned(7, 1), None);
        let again = table.strike(7, name, 2, &rules).unwrap();
        assert_eq!(again.level, 0, "no escalation after a lift");
        assert!(!table.lift(8, 2));
    }
}
