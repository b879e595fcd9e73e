//! The ban steps of admission: a banned caller is refused (403) before anything is
//! counted, and a refusal that looks like abuse (a 429, an unknown key) is a strike
//! toward an automatic ban (`[ban]`). `exempt` callers are never banned nor refused
//! for a ban. How a struck caller is named in the ban list is `named`'s.
//!
//! With `[ban] mode = "shadow"` strikes are counted in a table of this process's own
//! ([`Admission::shadow_bans`]), never in the store: a would-be ban is logged and
//! counted (`sluice_shadow_bans_total`), and holds its caller's strikes for as long as
//! the ban would have lasted, as an enforced ban would, but bans nobody.

use super::Admission;
use crate::http::refusal::Refusal;
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
    pub(crate) fn banned_here(&self, ban: &Ban) {
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
