//! The refusal memo: a lossy, lock-free record of callers known to be refused until
//! some instant, in front of every engine.
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
//! A refund breaks "only time admits": it frees quota early. A refund forgets the
//! refunded caller, and a refund of a policy's `total` moves the policy's refund epoch
//! on, which voids every remembered refusal that a `total` quota took part in. In a
//! fleet, a refund, credit or given-back hit through another replica cannot reach
//! this memo, so with Redis a refusal is remembered for at most [`FLEET_KEEP_MS`]:
//! what another replica frees is seen here that much later at the latest.
//!
//! The statuses kept with a refusal are those of the refused request: for the
//! caller's own windows `used` can only have fallen since (nothing of this caller is
//! admitted meanwhile), so what the memo reports is never more generous than the truth.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};

use super::{CallerKey, Scope};
use crate::limit::{LimitStatus, Report};

const SLOTS: usize = 1_024;
/// The longest a refusal decided by Redis is remembered (see the module's doc).
pub const FLEET_KEEP_MS: u64 = 250;
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
    /// Number of statuses (low 4 bits), which of them refused (bits 4..12), whether
    /// a `total` quota refused (bit 12), and the policy's refund epoch (high 32 bits).
    meta: AtomicU64,
    /// Per status: `used` (high 32 bits) and the low 32 bits of the ms at which its
    /// oldest counted request stops counting.
    statuses: [AtomicU64; STATUSES],
}

const TOTAL_REFUSED: u64 = 1 << 12;

/// Callers known to be refused, and until when: answered without asking an engine.
#[derive(Debug)]
pub struct Memo {
    slots: Box<[Slot]>,
    /// The policy's refund epoch, shared by the memos of all its plans.
    refunds: Arc<AtomicU32>,
}

/// The memo hash of a caller.
fn hash(caller: CallerKey) -> u64 {
    caller.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(31)
}

impl Memo {
    /// An empty memo; `refunds` is the policy's refund epoch.
    pub fn new(refunds: Arc<AtomicU32>) -> Memo {
        Memo {
            slots: (0..SLOTS).map(|_| Slot::default()).collect(),
            refunds,
        }
    }

    fn slot(&self, key: CallerKey) -> &Slot {
        &self.slots[hash(key) as usize % SLOTS]
    }

    /// If `key` is known to be refused at `now_ms` under `scope`, fills `report` with
    /// what it was told (times brought up to date) and returns true. Only single
    /// requests: a larger cost may have to wait longer than the remembered wait.
    pub fn recall(
        &self,
        scope: &Scope,
        key: CallerKey,
        now_ms: u64,
        cost: u32,
        report: &mut Report,
    ) -> bool {
        if cost != 1 {
            return false;
        }
        let slot = self.slot(key);
        let seq = slot.seq.load(Ordering::Acquire);
        if seq & 1 == 1 || slot.key.load(Ordering::Relaxed) != key {
            return false;
        }
        let until = slot.until.load(Ordering::Relaxed);
        if until <= now_ms {
            return false;
        }
        let meta = slot.meta.load(Ordering::Relaxed);
        if meta & TOTAL_REFUSED != 0 && (meta >> 32) as u32 != self.refunds.load(Ordering::Relaxed)
        {
            return false;
        }
        let len = (meta & 0xf) as usize;
        let mut packed = [0u64; STATUSES];
        for (value, status) in packed.iter_mut().zip(&slot.statuses).take(len) {
            *value = status.load(Ordering::Relaxed);
        }
        fence(Ordering::Acquire);
        if slot.seq.load(Ordering::Relaxed) != seq {
            return false;
        }
        let (plan, total) = (scope.quotas(), scope.total());
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
    /// binding refusal ends, or for at most `keep_ms` (a fleet's store, whose counts
    /// another replica's refund or credit can lower). Only single requests (cost 1)
    /// are remembered: a larger request can be refused for longer than a single one
    /// would be.
    pub fn remember(
        &self,
        key: CallerKey,
        now_ms: u64,
        cost: u32,
        report: &Report,
        keep_ms: Option<u64>,
    ) {
        if cost != 1 {
            return;
        }
        let Some((_, retry_ms)) = report.binding_rejection() else {
            return;
        };
        let slot = self.slot(key);
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
        let mut meta = u64::from(self.refunds.load(Ordering::Relaxed)) << 32;
        for (i, status) in report.iter().take(STATUSES).enumerate() {
            meta = (meta & !0xf) | (i as u64 + 1);
            if status.retry_ms.is_some() {
                meta |= 1 << (4 + i);
                if status.total {
                    meta |= TOTAL_REFUSED;
                }
            }
            let ends = now_ms + status.retry_ms.unwrap_or(status.reset_ms);
            let packed = (u64::from(status.used) << 32) | (ends & 0xffff_ffff);
            slot.statuses[i].store(packed, Ordering::Relaxed);
        }
        slot.key.store(key, Ordering::Relaxed);
        let kept = keep_ms.map_or(retry_ms, |keep| retry_ms.min(keep));
        slot.until.store(now_ms + kept, Ordering::Relaxed);
        slot.meta.store(meta, Ordering::Relaxed);
        slot.seq.store(seq + 2, Ordering::Release);
    }

    /// Forgets a refunded request's caller; a refund of a `total` also voids every
    /// refusal a `total` took part in, whoever was refused.
    pub fn forget_refunded(&self, key: CallerKey, total: bool) {
        self.forget(key);
        if total {
            self.refunds.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Forgets `key` (its counters were reset or refunded).
    pub fn forget(&self, key: CallerKey) {
        let slot = self.slot(key);
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
    use super::*;
    use crate::limit::{Window, quota};
    use crate::store::Store;

    fn status(
        quota: crate::limit::Quota,
        total: bool,
        used: u32,
        reset_ms: u64,
        retry_ms: Option<u64>,
    ) -> LimitStatus {
        LimitStatus {
            quota,
            total,
            used,
            reset_ms,
            retry_ms,
        }
    }

    #[test]
    fn remembers_what_a_refused_caller_was_told_until_it_ends() {
        let plan = [quota(Window::Minute, 5), quota(Window::Day, 100)];
        let scope = Store::memory(10).scope("p", "anonymous", plan.to_vec(), &[]);
        let mut told = Report::default();
        told.push(status(plan[0], false, 5, 500, Some(500)));
        told.push(status(plan[1], false, 40, 9_000, None));
        let memo = &scope.memo;
        assert!(!memo.recall(&scope, 7, 1_000, 1, &mut Report::default()));
        memo.remember(7, 1_000, 1, &told, None);

        let mut report = Report::default();
        assert!(memo.recall(&scope, 7, 1_200, 1, &mut report));
        let statuses: Vec<_> = report.iter().copied().collect();
        assert_eq!(statuses[0].retry_ms, Some(300));
        assert_eq!(statuses[1].used, 40);
        assert_eq!(statuses[1].reset_ms, 8_800);
        assert_eq!(statuses[1].retry_ms, None);

        // A larger cost is not answered from the memo; another caller is not
        // refused; the refusal ends on time; a forgotten caller is asked again.
        assert!(!memo.recall(&scope, 7, 1_200, 2, &mut Report::default()));
        assert!(!memo.recall(&scope, 8, 1_200, 1, &mut Report::default()));
        assert!(!memo.recall(&scope, 7, 1_500, 1, &mut Report::default()));
        memo.forget(7);
        assert!(!memo.recall(&scope, 7, 1_200, 1, &mut Report::default()));
    }

    #[test]
    fn a_refund_of_the_total_voids_refusals_the_total_took_part_in() {
        let plan = [quota(Window::Minute, 5)];
        let total = [quota(Window::Second, 10)];
        let store = Store::memory(10);
        let gold = store.scope("p", "gold", plan.to_vec(), &total);
        let free = store.scope("p", "anonymous", plan.to_vec(), &total);
        let mut by_total = Report::default();
        by_total.push(status(plan[0], false, 1, 60_000, None));
        by_total.push(status(total[0], true, 10, 900, Some(900)));
        let mut by_plan = Report::default();
        by_plan.push(status(plan[0], false, 5, 60_000, Some(60_000)));
        gold.memo.remember(1, 1_000, 1, &by_total, None);
        free.memo.remember(2, 1_000, 1, &by_total, None);
        free.memo.remember(3, 1_000, 1, &by_plan, None);
        // Caller 9 of the gold plan is refunded: the total has room again, so the
        // refusals it made are forgotten in every plan of the policy.
        gold.memo.forget_refunded(9, true);
        assert!(!gold.memo.recall(&gold, 1, 1_100, 1, &mut Report::default()));
        assert!(!free.memo.recall(&free, 2, 1_100, 1, &mut Report::default()));
        // A refusal by the caller's own plan still stands: a refund of someone else
        // does not free this caller's minute.
        assert!(free.memo.recall(&free, 3, 1_100, 1, &mut Report::default()));
    }
}
