//! Envoy rate limit descriptors → the rule that limits them: the rules of
//! envoyproxy/ratelimit's YAML files (`[decision] envoy_config`, read by its `yaml` module)
//! as a tree per domain, and the lookup that walks it.
//!
//! A request descriptor is a list of entries (`key`, `value`). Its rule is found
//! the way the reference service finds it, level by level: an entry matches a
//! rule of its key and exact value, else the first rule of its key whose value
//! ends in `*` and is a prefix of it, else the rule of its key without a value (any
//! value); the descriptor's rule is the one its last entry reaches, if that one has
//! a `rate_limit`. What the rule means for a request (replaces, counting, shadow
//! mode) is the decision listener's; this module only finds it. It reads no clock
//! and counts nothing.

pub(super) mod yaml;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::path::PathBuf;

use crate::limit::{Quota, Window};

/// The index of a rule in [`DescriptorRules::rules`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RuleId(pub u32);

impl RuleId {
    /// The index into the rule list.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// A `rate_limit` of a descriptor file, compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescriptorRule {
    /// The domain it is in.
    pub domain: String,
    /// The entries leading to it as the reference service names them,
    /// `key_value.key` (a rule without a value is its key alone).
    pub path: String,
    /// `rate_limit.name`, if it has one (what `replaces` names).
    pub name: Option<String>,
    /// What it allows.
    pub limit: RuleLimit,
    /// `shadow_mode: true`: decided and reported, never refused.
    pub shadow: bool,
    /// The names of the rules this one replaces when both apply to one request.
    pub replaces: Vec<String>,
    /// The file and line it was read from, for its metric name and errors.
    pub file: PathBuf,
    /// The line of its `rate_limit`.
    pub line: usize,
}

/// What a rule allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleLimit {
    /// `unlimited: true`: never limited, never counted.
    Unlimited,
    /// `requests_per_unit: 0`: every request is over the limit (the reference
    /// service's reading), nothing counted.
    Nothing,
    /// `requests_per_unit` per `unit`, counted in a sliding window of the unit.
    Quota(Quota),
}

impl RuleLimit {
    /// The limit as Envoy's `RateLimit` states it: requests per unit and the unit.
    pub fn requests_per_unit(&self) -> Option<(u32, Window)> {
        match self {
            RuleLimit::Unlimited => None,
            RuleLimit::Nothing => Some((0, Window::Second)),
            RuleLimit::Quota(q) => Some((q.limit.get(), q.window)),
        }
    }
}

/// The unit of a rate limit as envoyproxy/ratelimit writes it, or a reason it
/// cannot be counted by sluice.
pub fn unit(name: &str) -> Result<Window, String> {
    match name.to_ascii_lowercase().as_str() {
        "second" => Ok(Window::Second),
        "minute" => Ok(Window::Minute),
        "hour" => Ok(Window::Hour),
        "day" => Ok(Window::Day),
        "month" => Ok(Window::Month),
        "year" => Ok(Window::Year),
        "week" => Err(format!(
            "unit {name} is not supported: sluice counts second, minute, hour and day \
             windows and calendar months and years, no weeks"
        )),
        other => Err(format!(
            "unknown unit \"{other}\": expected second, minute, hour, day, month or year"
        )),
    }
}

/// A quota of `requests` per `window`, or the rule's other readings of a count.
pub fn limit_of(requests: u32, window: Window) -> RuleLimit {
    match NonZeroU32::new(requests) {
        Some(limit) => RuleLimit::Quota(Quota { window, limit }),
        None => RuleLimit::Nothing,
    }
}

/// One level of a domain's tree: the rules reachable by one more entry.
#[derive(Debug, Default, Clone)]
struct Level {
    /// `key` -> `value` -> node.
    exact: HashMap<String, HashMap<String, usize>>,
    /// `(key, value prefix)` -> node, in file order (the first match wins).
    prefixes: Vec<(String, String, usize)>,
    /// `key` (a rule without a value) -> node.
    any: HashMap<String, usize>,
}

impl Level {
    fn find(&self, key: &str, value: &str) -> Option<usize> {
        let exact = self.exact.get(key).and_then(|values| values.get(value));
        exact
            .copied()
            .or_else(|| {
                (self.prefixes.iter())
                    .find(|(k, prefix, _)| k == key && value.starts_with(prefix.as_str()))
                    .map(|(_, _, node)| *node)
            })
            .or_else(|| self.any.get(key).copied())
    }
}

/// A node of a domain's tree: the rule it holds, and the level below it.
#[derive(Debug, Default, Clone)]
struct Node {
    rule: Option<RuleId>,
    below: Level,
}

/// Every descriptor file's rules, by domain.
#[derive(Debug, Default, Clone)]
pub struct DescriptorRules {
    /// Every rule with a `rate_limit`, in file order.
    pub rules: Vec<DescriptorRule>,
    /// Each domain's first level.
    domains: HashMap<String, Level>,
    nodes: Vec<Node>,
}

impl DescriptorRules {
    /// The rule of a descriptor of `domain` with these `(key, value)` entries, if one
    /// applies.
    pub fn find<'e>(
        &self,
        domain: &str,
        entries: impl IntoIterator<Item = (&'e str, &'e str)>,
    ) -> Option<RuleId> {
        let mut level = self.domains.get(domain)?;
        let mut reached = None;
        for (key, value) in entries {
            let node = &self.nodes[level.find(key, value)?];
            reached = Some(node);
            level = &node.below;
        }
        reached.and_then(|node| node.rule)
    }

    /// Whether any file defines `domain`.
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// The rule `id`.
    pub fn rule(&self, id: RuleId) -> &DescriptorRule {
        &self.rules[id.index()]
    }

    /// A new node for the descriptor `key` (`value`) under `parent`; an error if the
    /// level already has one of that key and value.
    fn add(
        &mut self,
        parent: Parent<'_>,
        key: &str,
        value: Option<&str>,
    ) -> Result<usize, &'static str> {
        let node = self.nodes.len();
        let level = match parent {
            Parent::Domain(domain) => self.domains.entry(domain.to_string()).or_default(),
            Parent::Node(index) => &mut self.nodes[index].below,
        };
        let taken = match value {
            None => level.any.insert(key.to_string(), node).is_some(),
            Some(v) if v.ends_with('*') => {
                let prefix = v.trim_end_matches('*').to_string();
                let dup = (level.prefixes.iter()).any(|(k, p, _)| k == key && *p == prefix);
                if !dup {
                    level.prefixes.push((key.to_string(), prefix, node));
                }
                dup
            }
            Some(v) => (level.exact.entry(key.to_string()).or_default())
                .insert(v.to_string(), node)
                .is_some(),
        };
        if taken {
            return Err(
                "duplicate descriptor: another one at this level has the same key and value",
            );
        }
        self.nodes.push(Node::default());
        Ok(node)
    }
}

/// Where a descriptor of a file hangs: at its domain's top, or below another.
#[derive(Clone, Copy)]
enum Parent<'a> {
    Domain(&'a str),
    Node(usize),
}
