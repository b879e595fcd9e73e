//! `[[consumers]]`: each consumer's name, plan, key (its SHA-256) and own `limits`,
//! and the warning for an override no routed policy uses.

use std::collections::{HashMap, HashSet};

use sha2::{Digest, Sha256};

use super::diagnostic::Diagnostics;
use super::policies::{DEFAULT_PLAN, Plans, is_plan_name, quotas};
use super::{ConsumerConfig, PlanId, PlanRule, PolicyConfig, raw};
use crate::config::route::Route;
use crate::limit::Anchor;

/// The longest caller name believed, wherever it comes from (`[[consumers]]`, the
/// consumers file, an identity header, a token's claim, the admin API): tenant and
/// consumer ids (UUIDs, Kong consumer ids, e-mail addresses) fit easily.
pub(crate) const MAX_NAME_BYTES: usize = 256;

/// Whether `name` may name a caller: 1 to [`MAX_NAME_BYTES`] bytes of visible ASCII,
/// which a ban listing, a log line and a store key carry as they are.
pub(crate) fn is_caller_name(name: &[u8]) -> bool {
    !name.is_empty() && name.len() <= MAX_NAME_BYTES && name.iter().all(u8::is_ascii_graphic)
}

/// Why `name` cannot name a consumer, or `None` when it can ([`is_caller_name`]).
pub(super) fn caller_name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("must not be empty".to_string());
    }
    if name.len() > MAX_NAME_BYTES {
        return Some(format!(
            "is {} bytes long; a caller name is at most {MAX_NAME_BYTES}",
            name.len()
        ));
    }
    let (at, c) = name.char_indices().find(|(_, c)| !c.is_ascii_graphic())?;
    let what = match c {
        ' ' => "a space".to_string(),
        '\n' => "a newline".to_string(),
        c if c.is_ascii_control() => format!("the control character {:?}", c),
        c => format!("{c:?}, which is not ASCII"),
    };
    Some(format!(
        "holds {what} at byte {at}; a caller name is visible ASCII (letters, digits, \
         punctuation; no spaces or control characters), as identity headers and claims are"
    ))
}

pub(super) fn compile_consumers(
    d: &mut Diagnostics,
    plans: &mut Plans,
    raw: Vec<(String, raw::Consumer)>,
) -> Vec<ConsumerConfig> {
    let mut seen_names = HashSet::new();
    let mut seen_keys: HashMap<[u8; 32], String> = HashMap::new();
    let mut out = Vec::new();
    for (key, consumer) in raw {
        let name = consumer.name.get_ref().clone();
        if let Some(problem) = caller_name_problem(&name) {
            d.error(Some(consumer.name.span()), &format!("{key}.name"), problem);
        } else if !seen_names.insert(name.clone()) {
            d.error(
                Some(consumer.name.span()),
                &format!("{key}.name"),
                format!("duplicate consumer \"{name}\""),
            );
        }
        let Some(plan) = consumer_plan(d, &key, &consumer, plans) else {
            continue;
        };
        let Some(hash) = consumer_key(d, &key, &consumer) else {
            continue;
        };
        if let Some(other) = seen_keys.insert(hash, name.clone()) {
            d.error(
                Some(consumer.name.span()),
                &key,
                format!("has the same key as consumer \"{other}\""),
            );
        }
        let limits = match consumer.limits {
            Some(windows) => {
                let limits = quotas(d, &format!("{key}.limits"), windows.into_inner());
                if limits.is_empty() {
                    d.warn(
                        Some(consumer.name.span()),
                        &format!("{key}.limits"),
                        "sets no window, so it changes nothing",
                    );
                }
                limits
            }
            None => Vec::new(),
        };
        let anchor = consumer.billing_anchor.as_ref().and_then(|date| {
            billing_anchor(date.get_ref())
                .map_err(|why| d.error(Some(date.span()), &format!("{key}.billing_anchor"), why))
                .ok()
        });
        out.push(ConsumerConfig {
            name,
            plan,
            key_sha256: hash,
            limits,
            disabled: consumer.disabled.unwrap_or(false),
            anchor,
        });
    }
    out
}

/// A consumer's `billing_anchor`, a date such as `2026-03-15`: its periods start on
/// that day of the month (and of the year, for `per_year`).
pub(super) fn billing_anchor(text: &str) -> Result<Anchor, String> {
    text.parse::<jiff::civil::Date>()
        .map(Anchor::of_date)
        .map_err(|_| format!("expected a date such as \"2026-03-15\", got \"{text}\""))
}

/// A consumer's `plan`, interned (`registered` by default); `None` for a name no
/// consumer may have.
fn consumer_plan(
    d: &mut Diagnostics,
    key: &str,
    consumer: &raw::Consumer,
    plans: &mut Plans,
) -> Option<PlanId> {
    match &consumer.plan {
        Some(p) if p.get_ref() == "anonymous" => {
            d.error(
                Some(p.span()),
                &format!("{key}.plan"),
                "\"anonymous\" is the plan of callers without a key; pick another name",
            );
            None
        }
        Some(p) if !is_plan_name(p.get_ref()) => {
            d.error(
                Some(p.span()),
                &format!("{key}.plan"),
                format!(
                    "\"{}\" is a reserved policy key, not a plan name",
                    p.get_ref()
                ),
            );
            None
        }
        Some(p) => Some(plans.intern(p.get_ref())),
        None => Some(plans.intern(DEFAULT_PLAN)),
    }
}

/// The SHA-256 of a consumer's key: its `key_sha256`, or its plain `key` hashed
/// (with a warning).
fn consumer_key(d: &mut Diagnostics, key: &str, consumer: &raw::Consumer) -> Option<[u8; 32]> {
    match (&consumer.key_sha256, &consumer.key) {
        (Some(hex_key), None) => match ConsumerConfig::key_hash(hex_key.get_ref()) {
            Some(hash) => Some(hash),
            None => {
                d.error(
                    Some(hex_key.span()),
                    &format!("{key}.key_sha256"),
                    "must be 64 hex digits (see `sluice hash-key KEY`)",
                );
                None
            }
        },
        (None, Some(plain)) => {
            if plain.get_ref().is_empty() {
                d.error(
                    Some(plain.span()),
                    &format!("{key}.key"),
                    "must not be empty",
                );
                return None;
            }
            d.warn(
                Some(plain.span()),
                &format!("{key}.key"),
                "plain-text key in the config; store key_sha256 instead (`sluice hash-key KEY`)",
            );
            Some(Sha256::digest(plain.get_ref().as_bytes()).into())
        }
        (Some(_), Some(plain)) => {
            d.error(
                Some(plain.span()),
                &format!("{key}.key"),
                "set key_sha256 or key, not both",
            );
            None
        }
        (None, None) => {
            d.error(
                Some(consumer.name.span()),
                key,
                "needs key_sha256 (or key for demos)",
            );
            None
        }
    }
}

/// Warns of a consumer's `limits` window that no routed policy limits its plan by:
/// an override replaces a value, it does not add a window.
pub(super) fn check_overrides(
    d: &mut Diagnostics,
    consumers: &[ConsumerConfig],
    policies: &[(std::ops::Range<usize>, PolicyConfig)],
    routes: &[(std::ops::Range<usize>, Route)],
) {
    for (index, consumer) in consumers.iter().enumerate() {
        for own in &consumer.limits {
            let limited = routes
                .iter()
                .flat_map(|(_, route)| route.policies.iter().copied())
                .any(|p| match policies[p.index()].1.rule(consumer.plan) {
                    Some(PlanRule::Limits(quotas)) => quotas.iter().any(|q| q.window == own.window),
                    _ => false,
                });
            if !limited {
                d.warn(
                    None,
                    &format!("consumers[{index}].limits.{}", own.window.key()),
                    format!(
                        "no routed policy limits plan of consumer \"{}\" per {}: the override changes nothing",
                        consumer.name,
                        own.window.name()
                    ),
                );
            }
        }
    }
}
