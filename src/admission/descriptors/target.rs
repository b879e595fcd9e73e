//! Which rule counts a descriptor: a `[[decision.descriptors]]` policy, a
//! descriptor's own limit, an envoy_config rule or none; the rules other rules
//! replace; and the key a descriptor (or a policy descriptor's budget) is counted
//! under.

use std::net::IpAddr;

use xxhash_rust::xxh3::Xxh3Default;

use super::{Descriptor, Stated};
use crate::admission::NamedCaller;
use crate::config::descriptors::{DescriptorRule, RuleLimit};
use crate::config::{PlanId, PolicyDescriptor, ValuePattern};
use crate::limit::Window;
use crate::snapshot::{PlanLimits, Snapshot};
use crate::store::CallerKey;

/// What a descriptor is counted by.
pub(super) enum Target<'a> {
    /// No rule: `OK`.
    None,
    /// `unlimited: true`.
    Unlimited { rule: &'a DescriptorRule },
    /// `requests_per_unit: 0`: always over (unless in shadow mode).
    Nothing {
        stated: Stated,
        shadow: bool,
        rule: Option<&'a DescriptorRule>,
    },
    /// A rule's (or an override's) counters, under the descriptor's key.
    Counted {
        limits: &'a PlanLimits,
        stated: Stated,
        key: CallerKey,
        metric: String,
        rule: Option<&'a DescriptorRule>,
    },
    /// A `[[decision.descriptors]]` entry's policy.
    Policy(&'a PolicyDescriptor),
}

/// What counts `descriptor` of `domain`: a `[[decision.descriptors]]` entry, else
/// its own limit, else its envoy_config rule.
pub(super) fn target<'a>(
    snapshot: &'a Snapshot,
    domain: &str,
    descriptor: &Descriptor<'_>,
    overridden: Option<&'a PlanLimits>,
) -> Target<'a> {
    let Some(decision) = snapshot.decision() else {
        return Target::None;
    };
    let entries = &descriptor.entries;
    if let Some(policy) = (decision.descriptors.iter()).find(|p| p.matches(domain, entries)) {
        return Target::Policy(policy);
    }
    let rule = (decision.rules)
        .find(domain, entries.iter().copied())
        .map(|id| (id, decision.rules.rule(id)));
    let key = descriptor_key(domain, entries);
    let metric = |rule: Option<&DescriptorRule>| match rule {
        Some(rule) => format!("{}.{}", rule.domain, rule.path),
        None => "override".to_string(),
    };
    if let Some((requests, window)) = descriptor.limit {
        let name = rule.and_then(|(_, r)| r.name.clone()).unwrap_or_default();
        let stated = Stated {
            name,
            requests_per_unit: requests,
            window,
        };
        let rule = rule.map(|(_, r)| r);
        return match overridden {
            Some(limits) => Target::Counted {
                limits,
                stated,
                key,
                metric: metric(rule),
                rule,
            },
            None => Target::Nothing {
                stated,
                shadow: false,
                rule,
            },
        };
    }
    let Some((id, rule)) = rule else {
        return Target::None;
    };
    let stated = |requests, window| Stated {
        name: rule.name.clone().unwrap_or_default(),
        requests_per_unit: requests,
        window,
    };
    match (rule.limit, snapshot.rule_limits(id)) {
        (RuleLimit::Unlimited, _) => Target::Unlimited { rule },
        (RuleLimit::Quota(q), Some(limits)) => Target::Counted {
            limits,
            stated: stated(q.limit.get(), q.window),
            key,
            metric: metric(Some(rule)),
            rule: Some(rule),
        },
        (RuleLimit::Nothing, _) | (RuleLimit::Quota(_), None) => Target::Nothing {
            stated: stated(0, Window::Second),
            shadow: rule.shadow,
            rule: Some(rule),
        },
    }
}

/// Drops the targets whose rule another target's rule `replaces`.
pub(super) fn unreplaced(targets: &mut [Target<'_>]) {
    let replaced: Vec<String> = (targets.iter())
        .filter_map(target_rule)
        .flat_map(|rule| rule.replaces.iter().cloned())
        .collect();
    if replaced.is_empty() {
        return;
    }
    for target in targets.iter_mut() {
        let name = target_rule(target).and_then(|r| r.name.as_ref());
        if name.is_some_and(|n| replaced.contains(n)) {
            *target = Target::None;
        }
    }
}

/// The envoy_config rule behind a target, if one is.
fn target_rule<'a>(target: &Target<'a>) -> Option<&'a DescriptorRule> {
    match target {
        Target::Unlimited { rule } => Some(rule),
        Target::Nothing { rule, .. } | Target::Counted { rule, .. } => *rule,
        Target::None | Target::Policy(_) => None,
    }
}

/// A descriptor's counters key: its domain and entries.
fn descriptor_key(domain: &str, entries: &[(&str, &str)]) -> CallerKey {
    let mut hash = Xxh3Default::new();
    for part in std::iter::once(domain).chain(entries.iter().flat_map(|(k, v)| [*k, *v])) {
        hash.update(&(part.len() as u64).to_le_bytes());
        hash.update(part.as_bytes());
    }
    hash.digest()
}

/// Whose budget a `[[decision.descriptors]]` descriptor spends.
pub(super) struct Budget {
    /// The caller, as the ban list names it.
    pub(super) name: String,
    pub(super) caller: NamedCaller,
    /// The budget's key.
    pub(super) key: CallerKey,
}

/// The caller of a policy descriptor (its `remote_address`, if it has one) and
/// its budget: the caller's own when every other entry is pinned to one value,
/// else the caller's with the values of the free entries.
pub(super) fn policy_budget(
    snapshot: &Snapshot,
    domain: &str,
    policy: &PolicyDescriptor,
    entries: &[(&str, &str)],
) -> Budget {
    let address = (entries.iter())
        .find(|(key, _)| *key == REMOTE_ADDRESS)
        .and_then(|(_, value)| value.parse::<IpAddr>().ok());
    let free: Vec<&str> = (policy.entries.iter().zip(entries))
        .filter(|(pattern, (key, _))| {
            pattern.value != ValuePattern::Any || *key != REMOTE_ADDRESS || address.is_none()
        })
        .filter(|(pattern, _)| !matches!(pattern.value, ValuePattern::Exact(_)))
        .map(|(_, (_, value))| *value)
        .collect();
    let (name, caller) = match address {
        Some(ip) => (
            crate::admission::named::ip_name(snapshot, ip),
            NamedCaller {
                key: snapshot.identifier.ip_key(ip),
                plan: Some(PlanId::ANONYMOUS),
                consumer: None,
                ip: Some(ip),
            },
        ),
        None => (
            format!("rls:{domain}"),
            NamedCaller {
                key: descriptor_key(domain, &[]),
                plan: Some(policy.plan),
                consumer: None,
                ip: None,
            },
        ),
    };
    let key = match free.is_empty() {
        true => caller.key,
        false => {
            let mut hash = Xxh3Default::new();
            hash.update(&caller.key.to_le_bytes());
            for value in free {
                hash.update(&(value.len() as u64).to_le_bytes());
                hash.update(value.as_bytes());
            }
            hash.digest()
        }
    };
    Budget { name, caller, key }
}

/// The entry Envoy's `remote_address` action sends: the client's address.
const REMOTE_ADDRESS: &str = "remote_address";
