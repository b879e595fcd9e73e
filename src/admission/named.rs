//! How the admin API and the decision API name a caller: `consumer:NAME` or
//! `ip:ADDRESS` (an IPv6 caller as the prefix it is keyed by), read
//! ([`NamedCaller::parse`]) and written (the ban list's and the log's names).
//!
//! A caller so named is the one a proxied request of that consumer, or from that
//! address, would be: the same limiter key and plan.

use std::net::IpAddr;

use crate::config::{ConsumerId, PlanId};
use crate::identity::{Caller, CallerKind, name_key};
use crate::snapshot::Snapshot;
use crate::store::CallerKey;

/// A caller named as `consumer:NAME` or `ip:ADDRESS`, with its limiter key and
/// default plan.
pub(crate) struct NamedCaller {
    /// Its limiter key.
    pub key: CallerKey,
    /// The plan the caller has, when it is known (an IP, a configured consumer).
    pub plan: Option<PlanId>,
    /// The configured consumer it names, if any.
    pub consumer: Option<ConsumerId>,
    /// The address, for an `ip:` caller.
    pub ip: Option<IpAddr>,
}

impl NamedCaller {
    /// The caller `text` names, or `None` if it names none.
    pub(crate) fn parse(text: &str, snapshot: &Snapshot) -> Option<NamedCaller> {
        let (kind, name) = text.split_once(':')?;
        match kind {
            "ip" => {
                // An IPv6 caller may be named by its prefix, as the ban list shows it;
                // any other prefix would name a range that the ban would not cover.
                let (address, prefix) = match name.split_once('/') {
                    Some((address, prefix)) => (address, Some(prefix)),
                    None => (name, None),
                };
                let ip: IpAddr = address.parse().ok()?;
                let own = snapshot.identifier.ipv6_prefix();
                if prefix.is_some_and(|p| ip.is_ipv4() || p.parse() != Ok(own)) {
                    return None;
                }
                Some(NamedCaller {
                    key: snapshot.identifier.ip_key(ip),
                    plan: Some(PlanId::ANONYMOUS),
                    consumer: None,
                    ip: Some(ip),
                })
            }
            "consumer" if crate::identity::is_caller_name(name.as_bytes()) => {
                let consumer = snapshot.consumer_index(name);
                Some(NamedCaller {
                    key: name_key(text),
                    plan: consumer.map(|c| snapshot.consumer_plan(c)),
                    consumer,
                    ip: None,
                })
            }
            _ => None,
        }
    }
}

/// How the admin API names a caller: `consumer:NAME` or `ip:ADDRESS`; `named` is the
/// name an auth layer gave a caller the config does not list.
pub(super) fn caller_name(snapshot: &Snapshot, caller: &Caller, named: Option<&str>) -> String {
    match caller.kind {
        CallerKind::Consumer(index) => format!("consumer:{}", snapshot.consumer_name(index)),
        CallerKind::Named(_) => format!("consumer:{}", named.unwrap_or_default()),
        CallerKind::Anonymous => ip_name(snapshot, caller.ip),
    }
}

/// `ip:ADDRESS`, or for IPv6 `ip:PREFIX/LEN` as anonymous IPv6 callers are keyed.
pub(super) fn ip_name(snapshot: &Snapshot, ip: IpAddr) -> String {
    match ip.to_canonical() {
        IpAddr::V4(v4) => format!("ip:{v4}"),
        IpAddr::V6(v6) => {
            let prefix = snapshot.identifier.ipv6_prefix();
            let net = ipnet::Ipv6Net::new(v6, prefix).map_or(v6, |n| n.trunc().addr());
            format!("ip:{net}/{prefix}")
        }
    }
}
