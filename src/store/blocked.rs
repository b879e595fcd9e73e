//! A lossy, lock-free memo of callers known to be refused until some instant.
//!
//! Once a caller is over a limit, every further request until that limit frees up
//! is refused too: only time passing can admit it (more traffic only adds counts).
//! Remembering "caller X is refused until T, and this is what it was told" lets those
//! requests be answered with a few atomic loads and no shard lock: the common case
//! of an abuser hammering, or of threads fighting over one hot key.
//!
//! Each slot is a small seqlock made of atomics (no `unsafe`): a writer makes the
//! sequence odd, writes, and makes it even again; a reader that sees the sequence
//! change, or odd, treats the slot as empty. Slots are indexed by the caller's hash
//! and hold the full caller key, so a hit is never another caller's. Writers that find
//! a slot busy skip it: a miss only means the request takes the normal path. A memo
//! belongs to one config snapshot, so a reload that raises a limit forgets it.
//!
//! The statuses kept with a refusal are those of the refused request: for the
//! caller's own windows `used` can only have fallen since (nothing of this caller is
//! admitted meanwhile), so what the memo reports is never more generous than the truth.

use std::sync::atomic::{AtomicU64, Ordering, fence};

use crate::limit::{LimitStatus, Quota, Report};

const SLOTS: usize = 1_024;
/// A report holds at most four plan and four total statuses.
const STATUSES: usize = 8;

#[derive(Debug, Default)]
#[repr(align(64))]
struct Slot {
    /// Even when stable, odd while a writer is inside.
    seq: AtomicU64,
    key: AtomicU64,
    /// Wall-clock ms at which the refusal ends; 0 = empty.
    until: AtomicU64,
    /// Number of statuses (low 4 bits) and which of them refused (bits 4..12).
    meta: AtomicU64,
    /// Per status: `used` (high 32 bits) and the low 32 bits of the ms at which its
    /// oldest counted request stops counting.
    statuses: [AtomicU64; STATUSES],
}

#[derive(Debug)]
pub struct Blocked {
    slots: Box<[Slot]>,
}

impl Default for Blocked {
    fn default() -> Self {
        Blocked {
            slots: (0..SLOTS).map(|_| Slot::default()).collect(),
        }
    }
}

/// The memo hash of a caller, for stores that do not hash callers themselves.
pub fn hash(caller: u64) -> u64 {
    caller.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(31)
}

impl Blocked {
    fn slot(&self, hash: u64) -> &Slot {
        &self.slots[hash as usize % SLOTS]
    }

    /// If `key` is known to be refused at `now_ms`, fills `report` with what it was
    /// told (times brought up to date) and returns true. `plan` and `total` are the
    /// quotas the statuses refer to, in report order.
    pub fn check(
        &self,
        hash: u64,
        key: u64,
        now_ms: u64,
        quotas: (&[Quota], &[Quota]),
        report: &mut Report,
    ) -> bool {
        let slot = self.slot(hash);
        let seq = slot.seq.load(Ordering::Acquire);
        if seq & 1 == 1 || slot.key.load(Ordering::Relaxed) != key {
            return false;
        }
        let until = slot.until.load(Ordering::Relaxed);
        if until <= now_ms {
            return false;
        }
        let meta = slot.meta.load(Ordering::Relaxed);
        let len = (meta & 0xf) as usize;
        let mut packed = [0u64; STATUSES];
        for (value, status) in packed.iter_mut().zip(&slot.statuses).take(len) {
            *value = status.load(Ordering::Relaxed);
        }
        fence(Ordering::Acquire);
        if slot.seq.load(Ordering::Relaxed) != seq {
            return false;
        }
        let (plan, total) = quotas;
        for (i, value) in packed.iter().enumerate().take(len) {
            let (quota, is_total) = match i.checked_sub(plan.len()) {
                None => (plan[i], false),
                Some(j) if j < total.len() => (total[j], true),
                Some(_) => return false,
            };
            let ends = (*value as u32).wrapping_sub(now_ms as u32) as i32;
            let left = u64::try_from(ends).unwrap_or(0);
            let refused = meta & (1 << (4 + i)) != 0;
            report.push(LimitStatus {
                quota,
                total: is_total,
                used: (*value >> 32) as u32,
                reset_ms: left,
                retry_ms: refused.then_some(left.max(1)),
            });
        }
        true
    }

    /// Remembers that `key` was refused at `now_ms` with `report`, until the
    /// binding refusal ends. Only single requests (cost 1) may be remembered: a
    /// larger request can be refused for longer than a single one would be.
    pub fn insert(&self, hash: u64, key: u64, now_ms: u64, report: &Report) {
        let Some((_, retry_ms)) = report.binding_rejection() else {
            return;
        };
        let slot = self.slot(hash);
        let seq = slot.seq.load(Ordering::Relaxed);
        if seq & 1 == 1
            || slot
                .seq
                .compare_exchange(seq, seq + 1, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        fence(Ordering::Release);
        let mut meta = 0u64;
        for (i, status) in report.iter().take(STATUSES).enumerate() {
            meta = (meta & !0xf) | (i as u64 + 1);
            if status.retry_ms.is_some() {
                meta |= 1 << (4 + i);
            }
            let ends = now_ms + status.retry_ms.unwrap_or(status.reset_ms);
            let packed = (u64::from(status.used) << 32) | (ends & 0xffff_ffff);
            slot.statuses[i].store(packed, Ordering::Relaxed);
        }
        slot.key.store(key, Ordering::Relaxed);
        slot.until.store(now_ms + retry_ms, Ordering::Relaxed);
        slot.meta.store(meta, Ordering::Relaxed);
        slot.seq.store(seq + 2, Ordering::Release);
    }

    /// Forgets `key` (its counters were reset).
    pub fn forget(&self, hash: u64, key: u64) {
        let slot = self.slot(hash);
        let seq = slot.seq.load(Ordering::Relaxed);
        if slot.key.load(Ordering::Relaxed) == key
            && seq & 1 == 0
            && slot
                .seq
                .compare_exchange(seq, seq + 1, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            fence(Ordering::Release);
            slot.until.store(0, Ordering::Relaxed);
            slot.seq.store(seq + 2, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use super::*;
    use crate::limit::Window;

    fn quota(window: Window, limit: u32) -> Quota {
        Quota {
            window,
            limit: NonZeroU32::new(limit).unwrap(),
        }
    }

    #[test]
    fn remembers_what_a_refused_caller_was_told_until_it_ends() {
        let plan = [quota(Window::Minute, 5), quota(Window::Day, 100)];
        let mut told = Report::default();
        told.push(LimitStatus {
            quota: plan[0],
            total: false,
            used: 5,
            reset_ms: 500,
            retry_ms: Some(500),
        });
        told.push(LimitStatus {
            quota: plan[1],
            total: false,
            used: 40,
            reset_ms: 9_000,
            retry_ms: None,
        });
        let blocked = Blocked::default();
        let mut report = Report::default();
        assert!(!blocked.check(11, 7, 1_000, (&plan, &[]), &mut report));
        blocked.insert(11, 7, 1_000, &told);

        let mut report = Report::default();
        assert!(blocked.check(11, 7, 1_200, (&plan, &[]), &mut report));
        let statuses: Vec<_> = report.iter().copied().collect();
        assert_eq!(statuses[0].retry_ms, Some(300));
        assert_eq!(statuses[1].used, 40);
        assert_eq!(statuses[1].reset_ms, 8_800);
        assert_eq!(statuses[1].retry_ms, None);

        // Another caller in the same slot is not refused; the refusal ends on time.
        assert!(!blocked.check(11, 8, 1_200, (&plan, &[]), &mut Report::default()));
        assert!(!blocked.check(11, 7, 1_500, (&plan, &[]), &mut Report::default()));
        blocked.forget(11, 7);
        assert!(!blocked.check(11, 7, 1_200, (&plan, &[]), &mut Report::default()));
    }
}
