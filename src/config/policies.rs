//! Plans and policies: which quotas each plan pays, and the cross-check that every
//! plan a caller can have is covered by every policy a route uses. Consumers are
//! `consumers`'.

use std::collections::{HashMap, HashSet};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use toml::Spanned;

use super::diagnostic::Diagnostics;
use super::limit_key::{KeyPart, LimitKey, OnMissing, parse_key, parse_on_missing};
use super::recover::{Value, section, table_entries};
use super::values::{duration_of, int_in};
use super::{ConcurrencyConfig, ConsumerConfig, PlanId, PlanRule, PolicyConfig, PolicyMode, raw};
use crate::config::route::Route;
use crate::limit::{Quota, Window};

/// The plan of a consumer that names none, and of a caller an auth layer names
/// without a plan the policies know.
pub(crate) const DEFAULT_PLAN: &str = "registered";

/// A policy's keys that are settings, not plans: no plan can take one of these names.
pub(crate) const SETTINGS: &[&str] = &[
    "total",
    "concurrency",
    "messages",
    "key",
    "on_missing",
    "mode",
    "shadow_headers",
];

/// Whether `name` can name a plan a consumer is on.
pub(crate) fn is_plan_name(name: &str) -> bool {
    !name.is_empty() && name != "anonymous" && !SETTINGS.contains(&name)
}

pub(super) struct Plans {
    pub(super) names: Vec<Arc<str>>,
}

impl Default for Plans {
    fn default() -> Self {
        Plans {
            names: vec![Arc::from("anonymous")],
        }
    }
}

impl Plans {
    pub(super) fn intern(&mut self, name: &str) -> PlanId {
        let index = match self.names.iter().position(|n| &**n == name) {
            Some(index) => index,
            None => {
                self.names.push(Arc::from(name));
                self.names.len() - 1
            }
        };
        PlanId(index as u16)
    }
}

pub(super) struct Policies {
    /// With the span of each policy's name, for cross-check diagnostics.
    pub(super) list: Vec<(std::ops::Range<usize>, PolicyConfig)>,
    pub(super) by_name: HashMap<String, usize>,
}

pub(super) fn compile_policies(
    d: &mut Diagnostics,
    plans: &mut Plans,
    raw: Vec<(Spanned<String>, Value)>,
    request_id_header: &http::HeaderName,
) -> Policies {
    let mut list = Vec::new();
    let mut by_name = HashMap::new();
    for (name, value) in raw {
        let policy = compile_policy(d, plans, &name, value, request_id_header);
        by_name.insert(policy.name.clone(), list.len());
        list.push((name.span(), policy));
    }
    for (_, policy) in &mut list {
        policy.plans.resize(plans.names.len(), None);
    }
    Policies { list, by_name }
}

/// What a policy's table says besides its plans' rules, as read.
#[derive(Default)]
struct Settings {
    shadow: bool,
    shadow_headers: Option<(bool, std::ops::Range<usize>)>,
    parts: Option<Vec<KeyPart>>,
    on_missing: Option<OnMissing>,
}

/// `[policies.NAME]`: its entries are plan names (a rule each) and the policy's
/// own settings.
fn compile_policy(
    d: &mut Diagnostics,
    plans: &mut Plans,
    name: &Spanned<String>,
    value: Value,
    request_id_header: &http::HeaderName,
) -> PolicyConfig {
    let key = format!("policies.{}", name.get_ref());
    let mut policy = PolicyConfig {
        name: name.get_ref().clone(),
        plans: Vec::new(),
        total: Vec::new(),
        concurrency: None,
        messages: Vec::new(),
        mode: PolicyMode::Enforce,
        key: None,
    };
    let mut read = Settings::default();
    for (entry, v) in table_entries(d, &key, value) {
        let entry_key = format!("{key}.{}", entry.get_ref());
        match entry.get_ref().as_str() {
            "mode" => match v.get_ref().as_str() {
                Some("enforce") => read.shadow = false,
                Some("shadow") => read.shadow = true,
                _ => d.error(
                    Some(v.span()),
                    &entry_key,
                    "expected \"enforce\" or \"shadow\"",
                ),
            },
            "shadow_headers" => match v.get_ref().as_bool() {
                Some(b) => read.shadow_headers = Some((b, v.span())),
                None => d.error(Some(v.span()), &entry_key, "expected true or false"),
            },
            // Billing periods belong to a caller (its anchor): a total over every
            // caller has none.
            "total" => {
                let why = "per_month and per_year are a caller's billing periods; a total cannot have them";
                if let Some(total) = rate_quotas(d, &entry_key, v, why) {
                    policy.total = total;
                }
            }
            "concurrency" => {
                if let Some(concurrency) = section::<raw::Concurrency>(d, &entry_key, v) {
                    policy.concurrency = compile_concurrency(d, &entry_key, &concurrency);
                }
            }
            // A billing period belongs to a request quota a caller pays for;
            // messages are limited by rate only.
            "messages" => {
                let why = "per_month and per_year are billing periods; messages take \
                           per_second, per_minute, per_hour or per_day";
                if let Some(messages) = rate_quotas(d, &entry_key, v, why) {
                    policy.messages = messages;
                }
            }
            "key" => read.parts = parse_key(d, &entry_key, v, request_id_header),
            "on_missing" => read.on_missing = parse_on_missing(d, &entry_key, v),
            plan_name => {
                if let Some(rule) = plan_rule(d, &entry_key, v) {
                    let id = usize::from(plans.intern(plan_name).0);
                    if policy.plans.len() <= id {
                        policy.plans.resize(id + 1, None);
                    }
                    policy.plans[id] = Some(rule);
                }
            }
        }
    }
    policy.mode = mode(d, &key, &read);
    if read.parts.is_none() && read.on_missing.is_some() {
        d.warn(
            Some(name.span()),
            &format!("{key}.on_missing"),
            "only used with key = [...]; ignored",
        );
    }
    policy.key = limit_key(read.parts, read.on_missing);
    policy
}

/// The quotas of a policy's `total` or `messages` table, which take no billing
/// period: each one given is an error saying `why`, and left out. `None` when the
/// table cannot be read at all.
fn rate_quotas(d: &mut Diagnostics, key: &str, v: Value, why: &str) -> Option<Vec<Quota>> {
    let span = v.span();
    let windows = section::<raw::Windows>(d, key, v)?;
    let mut given = quotas(d, key, windows);
    if given.iter().any(|q| q.window.is_period()) {
        d.error(Some(span), key, why);
        given.retain(|q| !q.window.is_period());
    }
    Some(given)
}

/// A policy's `key` and `on_missing`: `None` (the default, the caller's budget)
/// unless the key is something other than the consumer alone.
fn limit_key(parts: Option<Vec<KeyPart>>, on_missing: Option<OnMissing>) -> Option<LimitKey> {
    match parts {
        None => None,
        Some(parts) if parts == [KeyPart::Consumer] => None,
        Some(parts) => Some(LimitKey {
            parts,
            on_missing: on_missing.unwrap_or(OnMissing::Ip),
        }),
    }
}

/// A plan's rule: `"deny"`, or a table of limits.
fn plan_rule(d: &mut Diagnostics, key: &str, v: Value) -> Option<PlanRule> {
    if !v.get_ref().is_str() {
        return section::<raw::Windows>(d, key, v).map(|w| PlanRule::Limits(quotas(d, key, w)));
    }
    if v.get_ref().as_str() == Some("deny") {
        return Some(PlanRule::Deny);
    }
    let expected = "expected \"deny\" or a table of limits such as { per_minute = 10 }";
    d.error(Some(v.span()), key, expected);
    None
}

/// `mode` and `shadow_headers`.
fn mode(d: &mut Diagnostics, key: &str, read: &Settings) -> PolicyMode {
    match (read.shadow, &read.shadow_headers) {
        (true, headers) => PolicyMode::Shadow {
            headers: headers.as_ref().is_some_and(|(b, _)| *b),
        },
        (false, Some((_, span))) => {
            d.warn(
                Some(span.clone()),
                &format!("{key}.shadow_headers"),
                "has no effect unless mode = \"shadow\"",
            );
            PolicyMode::Enforce
        }
        (false, None) => PolicyMode::Enforce,
    }
}

pub(super) fn quotas(d: &mut Diagnostics, key: &str, raw: raw::Windows) -> Vec<Quota> {
    let windows = [
        (Window::Second, "per_second", raw.per_second),
        (Window::Minute, "per_minute", raw.per_minute),
        (Window::Hour, "per_hour", raw.per_hour),
        (Window::Day, "per_day", raw.per_day),
        (Window::Month, "per_month", raw.per_month),
        (Window::Year, "per_year", raw.per_year),
    ];
    let mut out = Vec::new();
    for (window, name, value) in windows {
        let Some(value) = value else { continue };
        let limit = *value.get_ref();
        match u32::try_from(limit).ok().and_then(NonZeroU32::new) {
            Some(limit) => out.push(Quota { window, limit }),
            None => d.error(
                Some(value.span()),
                &format!("{key}.{name}"),
                format!(
                    "must be between 1 and {} (use \"deny\" to refuse a plan), got {limit}",
                    u32::MAX
                ),
            ),
        }
    }
    out
}

/// A request waits this long in a concurrency queue when `queue_timeout` is not set:
/// long enough to ride out a burst, short enough that a client is not left hanging.
const DEFAULT_QUEUE_TIMEOUT: Duration = Duration::from_secs(1);

fn compile_concurrency(
    d: &mut Diagnostics,
    key: &str,
    raw: &raw::Concurrency,
) -> Option<ConcurrencyConfig> {
    let max = int_in(d, &format!("{key}.max"), &raw.max, 1, 1_000_000);
    let queue = match &raw.queue {
        Some(queue) => int_in(d, &format!("{key}.queue"), queue, 0, 1_000_000),
        None => Some(0),
    };
    let queue_timeout = duration_of(
        d,
        &format!("{key}.queue_timeout"),
        raw.queue_timeout.as_ref(),
        DEFAULT_QUEUE_TIMEOUT,
    );
    let per_caller = match &raw.per_caller {
        Some(n) => Some(int_in(d, &format!("{key}.per_caller"), n, 1, 1_000_000)?),
        None => None,
    };
    if let (Some(max), Some(per_caller)) = (max, per_caller)
        && per_caller > max
    {
        d.warn(
            raw.per_caller.as_ref().map(|p| p.span()),
            &format!("{key}.per_caller"),
            format!("is above max = {max}, so it never binds"),
        );
    }
    Some(ConcurrencyConfig {
        max: NonZeroU32::new(u32::try_from(max?).ok()?)?,
        queue: u32::try_from(queue?).ok()?,
        queue_timeout,
        per_caller: per_caller.and_then(|n| NonZeroU32::new(u32::try_from(n).ok()?)),
    })
}

pub(super) fn check_consumer_plans(
    d: &mut Diagnostics,
    plans: &Plans,
    consumers: &[ConsumerConfig],
    policies: &[(std::ops::Range<usize>, PolicyConfig)],
    routes: &[(std::ops::Range<usize>, Route)],
    named_plans: &[PlanId],
) {
    let mut reported = HashSet::new();
    // Each plan once, with the first consumer that has it: a consumers file may hold
    // a million consumers of a handful of plans.
    let mut first_of_plan: Vec<(PlanId, &str)> = Vec::new();
    for consumer in consumers {
        if !first_of_plan.iter().any(|(plan, _)| *plan == consumer.plan) {
            first_of_plan.push((consumer.plan, &consumer.name));
        }
    }
    let used = routes.iter().map(|(_, r)| r);
    for (route, index) in used.flat_map(|r| r.policies.iter().map(move |&p| (r, p))) {
        let (span, policy) = &policies[index.index()];
        let needed = std::iter::once((PlanId::ANONYMOUS, None))
            .chain(named_plans.iter().map(|&plan| {
                let who = "callers named by an identity header or JWT".to_string();
                (plan, Some(who))
            }))
            .chain(
                (first_of_plan.iter())
                    .map(|(plan, name)| (*plan, Some(format!("consumer \"{name}\"")))),
            );
        for (plan, consumer) in needed {
            if policy.rule(plan).is_some() || !reported.insert((index, plan)) {
                continue;
            }
            let plan_name = &plans.names[usize::from(plan.0)];
            let reason = match consumer {
                None => format!(
                    "no rule for plan \"anonymous\" (callers without a key on route \"{}\"); add anonymous = \"deny\" to require a key",
                    route.name
                ),
                Some(who) => format!(
                    "no rule for plan \"{plan_name}\" of {who} (used by route \"{}\")",
                    route.name
                ),
            };
            d.error(
                Some(span.clone()),
                &format!("policies.{}", policy.name),
                reason,
            );
        }
    }
}
