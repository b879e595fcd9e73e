//! Identity headers: a caller named by an auth layer in front of sluice.
//!
//! `consumer_header` (and `plan_header`) are believed only when the request's peer
//! (the TCP peer, not an address `X-Forwarded-For` claims) is in `trusted_proxies`.
//! From any other peer they are removed from the request before anything reads it:
//! not identification, not a limit key, not the upstream. A value names the consumer:
//! a consumer of the config is that consumer (its plan, its limits; `plan_header` is
//! not read, the config is the authority on its own consumers); any other value is a
//! caller of its own, counted under `consumer:VALUE` with the plan `plan_header` names
//! when every policy a route uses has a rule for it, else the default plan. Values are
//! bounded ([`super::MAX_NAME_BYTES`], visible ASCII): a longer or stranger one is a 400, as
//! is a header sent twice. This module does not decide which peers are trusted
//! ([`super::Identifier::is_trusted`]) nor what a caller may do.

use std::collections::HashMap;

use http::{HeaderMap, HeaderName};

use crate::config::{Config, PlanId};

/// What a trusted auth layer said about the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Asserted<'a> {
    /// The consumer named by `consumer_header`.
    pub consumer: &'a str,
    /// The plan named by `plan_header`, if sent.
    pub plan: Option<&'a str>,
}

/// Why identity headers from a trusted peer cannot be believed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum HeaderError {
    #[error("more than one identity header")]
    Repeated,
    #[error("an identity header longer than 256 bytes or not visible ASCII")]
    Invalid,
}

/// The identity headers of a config, and the plans they may name.
#[derive(Debug)]
pub(crate) struct IdentityHeaders {
    consumer: HeaderName,
    plan: Option<HeaderName>,
    /// Plans `plan_header` may name: those every policy a route uses has a rule for,
    /// so a named plan can never fall between policies and go unlimited.
    plans: HashMap<Box<str>, PlanId>,
    /// The plan of a named caller whose plan header is absent or names no such plan.
    default_plan: PlanId,
}

impl IdentityHeaders {
    /// `None` when the config sets no `consumer_header`.
    pub(crate) fn new(config: &Config) -> Option<IdentityHeaders> {
        let consumer = config.identity.consumer_header.clone()?;
        let plan_id = |name: &str| {
            let index = config.plans.iter().position(|p| **p == *name)?;
            Some(PlanId(index as u16))
        };
        let plans = named_plans(config);
        Some(IdentityHeaders {
            consumer,
            plan: config.identity.plan_header.clone(),
            plans,
            // Config compile interns the default plan whenever consumer_header is set.
            default_plan: plan_id(crate::config::DEFAULT_PLAN).unwrap_or(PlanId::ANONYMOUS),
        })
    }

    /// Removes both headers, every spelling and every copy (an untrusted peer's).
    pub(crate) fn strip(&self, headers: &mut HeaderMap) {
        // `remove` drops every value of the name; names are compared lower-cased.
        headers.remove(&self.consumer);
        if let Some(plan) = &self.plan {
            headers.remove(plan);
        }
    }

    /// What a trusted peer's request says; `None` without a consumer header (or with
    /// an empty one: the auth layer let an anonymous caller through).
    pub(crate) fn read<'a>(
        &self,
        headers: &'a HeaderMap,
    ) -> Result<Option<Asserted<'a>>, HeaderError> {
        let Some(consumer) = one_value(headers, &self.consumer)? else {
            return Ok(None);
        };
        let plan = match &self.plan {
            Some(name) => one_value(headers, name)?,
            None => None,
        };
        Ok(Some(Asserted { consumer, plan }))
    }

    /// The plan of a named caller that is not a consumer of the config.
    pub(crate) fn plan(&self, asserted: &Asserted<'_>) -> PlanId {
        asserted
            .plan
            .and_then(|name| self.plans.get(name).copied())
            .unwrap_or(self.default_plan)
    }
}

/// Plans an identity header or a token may name: those every policy a route uses
/// has a rule for, so a named plan can never fall between policies and go unlimited.
pub(crate) fn named_plans(config: &Config) -> HashMap<Box<str>, PlanId> {
    let covered = |plan: PlanId| {
        config
            .routes
            .iter()
            .flat_map(|route| route.policies.iter().copied())
            .all(|policy| config.policy(policy).rule(plan).is_some())
    };
    config
        .plans
        .iter()
        .enumerate()
        .map(|(index, name)| (name, PlanId(index as u16)))
        .filter(|&(_, plan)| plan != PlanId::ANONYMOUS && covered(plan))
        .map(|(name, plan)| (Box::from(&**name), plan))
        .collect()
}

/// The one non-empty value of `name`, bounded and visible ASCII.
fn one_value<'a>(
    headers: &'a HeaderMap,
    name: &HeaderName,
) -> Result<Option<&'a str>, HeaderError> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(HeaderError::Repeated);
    }
    let bytes = value.as_bytes().trim_ascii();
    if bytes.is_empty() {
        return Ok(None);
    }
    if !super::is_caller_name(bytes) {
        return Err(HeaderError::Invalid);
    }
    // Visible ASCII is UTF-8.
    std::str::from_utf8(bytes)
        .map(Some)
        .map_err(|_| HeaderError::Invalid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn headers(config_extra: &str) -> IdentityHeaders {
        let text = format!(
            r#"
            [identity]
            trusted_proxies = ["10.0.0.0/8"]
            consumer_header = "X-Consumer-Id"
            plan_header = "x-consumer-plan"
            {config_extra}
            [upstreams.up]
            targets = ["http://127.0.0.1:1"]
            [policies.p]
            anonymous = {{ per_minute = 1 }}
            registered = {{ per_minute = 2 }}
            gold = {{ per_minute = 3 }}
            [policies.q]
            anonymous = {{ per_minute = 1 }}
            registered = {{ per_minute = 2 }}
            silver = {{ per_minute = 3 }}
            [[routes]]
            name = "a"
            path_prefix = "/a"
            upstream = "up"
            policy = "p"
            "#
        );
        let config = Config::parse(Path::new("t.toml"), &text).unwrap();
        IdentityHeaders::new(&config).unwrap()
    }

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(HeaderName::try_from(*name).unwrap(), value.parse().unwrap());
        }
        map
    }

    #[test]
    fn values_are_read_once_bounded_and_visible() {
        let h = headers("");
        let read = |pairs: &[(&str, &str)]| {
            let owned = |a: Asserted<'_>| (a.consumer.to_string(), a.plan.map(str::to_string));
            h.read(&map(pairs)).map(|a| a.map(owned))
        };
        let pair = |c: &str, p: Option<&str>| Ok(Some((c.to_string(), p.map(str::to_string))));
        assert_eq!(read(&[]), Ok(None));
        assert_eq!(read(&[("x-consumer-id", "")]), Ok(None));
        assert_eq!(read(&[("x-consumer-id", "acme")]), pair("acme", None));
        assert_eq!(
            read(&[("X-CONSUMER-ID", "acme"), ("x-consumer-plan", "gold")]),
            pair("acme", Some("gold"))
        );
        assert_eq!(
            read(&[("x-consumer-id", "a"), ("x-consumer-id", "b")]),
            Err(HeaderError::Repeated)
        );
        assert_eq!(
            read(&[
                ("x-consumer-id", "a"),
                ("x-consumer-plan", "gold"),
                ("x-consumer-plan", "x")
            ]),
            Err(HeaderError::Repeated)
        );
        assert_eq!(read(&[("x-consumer-id", "a b")]), Err(HeaderError::Invalid));
        let long = "a".repeat(crate::identity::MAX_NAME_BYTES + 1);
        assert_eq!(read(&[("x-consumer-id", &long)]), Err(HeaderError::Invalid));
        let longest = "a".repeat(crate::identity::MAX_NAME_BYTES);
        assert!(read(&[("x-consumer-id", &longest)]).unwrap().is_some());
    }

    #[test]
    fn a_named_plan_counts_only_if_every_routed_policy_covers_it() {
        let h = headers("");
        let plan = |name| {
            h.plan(&Asserted {
                consumer: "c",
                plan: name,
            })
        };
        let registered = h.default_plan;
        assert_ne!(registered, PlanId::ANONYMOUS);
        assert_ne!(plan(Some("gold")), registered);
        // silver is only in a policy no route uses; anonymous is never named.
        assert_eq!(plan(Some("silver")), registered);
        assert_eq!(plan(Some("anonymous")), registered);
        assert_eq!(plan(Some("nope")), registered);
        assert_eq!(plan(None), registered);
    }

    #[test]
    fn strip_removes_every_copy_of_both() {
        let h = headers("");
        let mut m = map(&[
            ("X-Consumer-Id", "a"),
            ("x-consumer-id", "b"),
            ("x-consumer-plan", "gold"),
            ("x-other", "kept"),
        ]);
        h.strip(&mut m);
        assert_eq!(m.len(), 1);
        assert!(m.contains_key("x-other"));
    }
}
