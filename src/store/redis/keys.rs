//! Where counters live in Redis: each (policy, plan)'s key names ([`Bound`]), their
//! hash tags and Cluster slots, and a stacked decision's keys placed in one slot.
//! Policy and plan names are hashed into keys, never written as they are.
//!
//! It does not talk to Redis: the engine in the parent module does.

use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::batch::Shape;
use super::{shape, shards};
use crate::limit::{Now, Quota};
use crate::store::{CallerKey, Stacked};

/// Where a (policy, plan)'s counters live in Redis: this engine's part of a
/// [`Scope`]'s handle.
#[derive(Debug, Clone)]
pub(crate) struct Bound {
    /// Everything before the caller in the caller's key.
    caller_prefix: String,
    /// Everything after the caller (the closing brace of a per-caller hash tag).
    caller_suffix: &'static str,
    /// The policy's total, when it has one; shared by every request's batch job.
    pub(super) total: Option<Arc<str>>,
    /// The (policy, plan) in a key placed with another policy's bucket (a stacked
    /// decision's later policies): `<policy>:<plan>:`.
    placed_prefix: String,
    /// The quotas as the script reads them, for requests without calendar days.
    pub(super) shape: Arc<Shape>,
    /// The Cluster slot of every caller's counters, when they share the policy's
    /// hash tag (a policy with a total); else each caller's own.
    slot: Option<u16>,
}

impl Bound {
    pub(crate) fn new(policy: &str, plan: &str, quotas: &[Quota], total: &[Quota]) -> Bound {
        let shape = Arc::new(shape(quotas, total, &Now::sliding(0)));
        let (policy, plan) = (short_hash(policy), short_hash(plan));
        let placed_prefix = format!("{policy}:{plan}:");
        if total.is_empty() {
            Bound {
                caller_prefix: format!("sluice:{{{policy}:{plan}:"),
                caller_suffix: "}",
                total: None,
                placed_prefix,
                shape,
                slot: None,
            }
        } else {
            Bound {
                slot: Some(shards::slot(&format!("{{{policy}}}"))),
                caller_prefix: format!("sluice:{{{policy}}}:{plan}:"),
                caller_suffix: "",
                total: Some(format!("sluice:{{{policy}}}:total").into()),
                placed_prefix,
                shape,
            }
        }
    }

    pub(super) fn caller(&self, caller: CallerKey) -> String {
        format!("{}{caller:016x}{}", self.caller_prefix, self.caller_suffix)
    }

    /// The Cluster slot of `caller`'s counters (a stacked decision's are all in its
    /// first policy's).
    pub(super) fn slot(&self, caller: CallerKey) -> u16 {
        match self.slot {
            Some(slot) => slot,
            None => shards::slot(&self.caller(caller)),
        }
    }

    /// The `SCAN` pattern of every key of the policy: its hashed name is in each,
    /// whether the key is the caller's own or placed with another policy's.
    pub(super) fn pattern(&self) -> String {
        let policy = self.placed_prefix.split(':').next().unwrap_or_default();
        format!("sluice:*{policy}*")
    }

    /// The caller whose counters `key` holds under this (policy, plan): its own key,
    /// or one placed with the first policy's of a stacked route on a Cluster.
    pub(crate) fn owner(&self, key: &str) -> Option<CallerKey> {
        let own = (key.strip_prefix(self.caller_prefix.as_str()))
            .and_then(|rest| rest.strip_suffix(self.caller_suffix));
        let hex = match own {
            Some(hex) => hex,
            None => {
                let rest = key.strip_prefix("sluice:{")?;
                let (_, placed) = rest.split_once("}:s:")?;
                placed.strip_prefix(self.placed_prefix.as_str())?
            }
        };
        match hex.len() {
            16 => u64::from_str_radix(hex, 16).ok(),
            _ => None,
        }
    }

    /// The key of `caller`'s counters placed with the bucket whose hash tag is
    /// `tag` (the first policy's of a stacked decision): `sluice:{tag}:s:...`.
    fn placed(&self, tag: &str, caller: CallerKey) -> String {
        format!("sluice:{{{tag}}}:s:{}{caller:016x}", self.placed_prefix)
    }
}

/// Where the counters of each part of a stacked decision live. On one server (or a
/// Sentinel's master) each part's own key, as if the policy were used alone. On a
/// Cluster every key of one script call must sit in one slot: the first part's key
/// is its own (so a policy's counters are the same whether it is stacked first or
/// used alone), every later part's is placed under the first's hash tag.
pub(super) fn stacked_keys(parts: &[Stacked<'_>], bounds: &[&Bound], cluster: bool) -> Vec<String> {
    if !cluster {
        let each = parts.iter().zip(bounds);
        return each
            .map(|(part, bound)| bound.caller(part.caller))
            .collect();
    }
    let Some((first, first_bound)) = parts.first().zip(bounds.first()) else {
        return Vec::new();
    };
    let lead = first_bound.caller(first.caller);
    let tag = shards::hash_tag(&lead).to_string();
    let mut keys = vec![lead];
    for (part, bound) in parts.iter().zip(bounds).skip(1) {
        keys.push(bound.placed(&tag, part.caller));
    }
    keys
}

/// Names in keys are hashed: short, and free of `{` and `}`.
fn short_hash(name: &str) -> String {
    const_hex::encode(&Sha256::digest(name.as_bytes())[..6])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{Window, quota};

    #[test]
    fn a_policys_keys_name_their_caller_own_or_placed() {
        let minute = [quota(Window::Minute, 5)];
        for total in [&[][..], &minute[..]] {
            let bound = Bound::new("org", "registered", &minute, total);
            let other = Bound::new("org", "anonymous", &minute, total);
            let own = bound.caller(0xffff_7f00_0001);
            assert_eq!(bound.owner(&own), Some(0xffff_7f00_0001), "{own}");
            assert_eq!(other.owner(&own), None, "another plan's");
            let placed = bound.placed("abc:def:0123", 42);
            assert_eq!(bound.owner(&placed), Some(42), "{placed}");
            assert!(bound.pattern().starts_with("sluice:*"));
            let policy = bound.pattern().replace("sluice:*", "").replace('*', "");
            assert!(own.contains(&policy) && placed.contains(&policy));
        }
        let bound = Bound::new("org", "registered", &minute, &[]);
        assert_eq!(bound.owner("sluice:{abc}:total"), None);
        assert_eq!(bound.owner("sluice:bans"), None);
    }
}
