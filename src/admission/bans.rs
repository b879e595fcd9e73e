//! The ban steps of admission: a banned caller is refused (403) before anything is
//! counted, and a refusal that looks like abuse (a 429, an unknown key) is a strike
//! toward an automatic ban (`[ban]`). `exempt` callers are never banned nor refused
//! for a ban. Also how a caller is named in the ban list and the log: `consumer:NAME`
//! or `ip:ADDRESS` (an IPv6 caller as the prefix it is keyed by).
//!
//! With `[ban] mode = "shadow"` strikes are counted in a table of this process's own
//! ([`Admission::shadow_bans`]), never in the store: a would-be ban is logged and
//! counted (`sluice_shadow_bans_total`), and holds its caller's strikes for as long as
//! the ban would have lasted, as an enforced ban would, but bans nobody.

use std::net::IpAddr;

use super::Admission;
use crate::http::refusal::Refusal;
use crate::identity::{Caller, CallerKind};
use crate::snapshot::Snapshot;
use crate::store::{Ban, CallerKey};

impl Admission {
    /// Step: a 403 for a banned caller (never for an exempt one).
    pub(super) fn unbanned(
        &self,
        exempt: bool,
        key: CallerKey,
        now_ms: u64,
    ) -> Result<(), Refusal> {
        match self.store.banned(key, now_ms) {
            Some(until_ms) if !exempt => Err(Refusal::Banned { until_ms, now_ms }),
            _ => Ok(()),
        }
    }

    /// Counts a refusal toward an automatic ban, when `[ban]` asks for them.
    pub(super) fn strike(
        &self,
        snapshot: &Snapshot,
        key: CallerKey,
        caller: impl FnOnce() -> String,
        now_ms: u64,
    ) {
        let Some(auto) = &snapshot.bans().automatic else {
            return;
        };
        if auto.shadow {
            // Counted apart, as the store would count it, in this process only.
            if let Some(ban) = self.shadow_bans.strike(key, caller, now_ms, auto) {
                self.metrics.cost.shadow_bans.inc();
                tracing::info!(
                    caller = %ban.caller,
                    refusals = ban.refusals,
                    seconds = ban.until_ms.saturating_sub(now_ms) / 1_000,
                    "caller would be banned ([ban] mode = \"shadow\": not banned)"
                );
            }
            return;
        }
        if let Some(ban) = self.store.strike(key, caller, now_ms, auto) {
            self.banned_here(&ban);
        }
    }

    /// Records a ban this replica made, automatically or by hand (metrics and the log);
    /// bans learnt from the fleet are not counted again here.
    pub fn banned_here(&self, ban: &Ban) {
        self.metrics
            .bans_total
            .with_label_values(&[ban.reason.label()])
            .inc();
        tracing::info!(
            caller = %ban.caller,
            reason = ban.reason.text(),
            refusals = ban.refusals,
            seconds = ban.until_ms.saturating_sub(self.clock.now_ms()) / 1_000,
            "caller banned"
        );
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

/// The name of a decision-API caller: its address as a proxied request from it would
/// be named, else the name it was asked about by.
pub(super) fn checked_name(snapshot: &Snapshot, name: &str, ip: Option<IpAddr>) -> String {
    match ip {
        Some(ip) => ip_name(snapshot, ip),
        None => name.to_string(),
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
