//! The fleet's bans in Redis (`bans.lua`), kept in step with each replica's table.
//!
//! Refusals are not sent one by one: a replica adds them up per caller and flushes
//! them every [`SYNC_EVERY`] in one script call, which counts them toward the ban
//! rules and bans whoever crossed them. In the same beat it polls the callers whose
//! ban changed since the last poll (made or lifted by any replica, or through any
//! replica's admin API) into its own [`BanTable`], which answers the per-request
//! checks. So a ban reached through one replica is enforced by every replica within
//! two beats plus a round trip, well within a second. Keys expire with their bans.

use std::collections::HashMap;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use super::super::bans::{Ban, BanTable, Reason};
use super::super::{CallerKey, StoreError};
use super::link::Link;
use crate::config::AutoBan;

/// How often refusals are flushed and bans polled.
pub const SYNC_EVERY: Duration = Duration::from_millis(250);
/// The longest ban escalation reaches.
const MAX_BAN_MS: u64 = 86_400_000;

/// The script, loaded once per Redis and called by its SHA-1; static, so that a call
/// built here can be sent to the engine's thread.
static SCRIPT: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("bans.lua")));

/// Refusals waiting for the next flush, per caller: how many, and the caller's name.
type Pending = HashMap<CallerKey, (u32, String)>;

/// The fleet's bans in Redis: this replica's refusals flushed out, everyone's bans
/// polled in.
pub struct RedisBans {
    link: Link,
    pending: Mutex<(Pending, Option<AutoBan>)>,
    /// Redis ms of the last poll's changes; 0 before the first (a full load).
    since_ms: AtomicU64,
}

impl std::fmt::Debug for RedisBans {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBans").finish_non_exhaustive()
    }
}

impl RedisBans {
    /// The fleet's bans, reached through the store's connection thread.
    pub fn new(link: Link) -> RedisBans {
        RedisBans {
            link,
            pending: Mutex::default(),
            since_ms: AtomicU64::new(0),
        }
    }

    /// Adds a refusal of `key` to the next flush.
    pub fn queue(&self, key: CallerKey, caller: impl FnOnce() -> String, auto: &AutoBan) {
        let mut pending = self.pending.lock();
        pending.1 = Some(*auto);
        pending.0.entry(key).or_insert_with(|| (0, caller())).0 += 1;
    }

    /// Takes the refusals waiting for a flush (and the rules they count under).
    pub fn take(&self) -> (Pending, Option<AutoBan>) {
        std::mem::take(&mut *self.pending.lock())
    }

    /// Counts `refusals` in Redis; returns the bans that made, for the caller to
    /// record and then set in its table (recorded first, so that nobody is refused
    /// for a ban `sluice_bans_total` does not count yet).
    pub async fn flush(
        &self,
        refusals: &Pending,
        auto: &AutoBan,
    ) -> Result<Vec<(CallerKey, Ban)>, StoreError> {
        if refusals.is_empty() {
            return Ok(Vec::new());
        }
        let mut call = self.call("strike");
        call.arg(auto.after.get())
            .arg(auto.within.as_millis().max(1) as u64)
            .arg(auto.duration.as_millis() as u64)
            .arg(if auto.escalate { "1" } else { "0" })
            .arg(MAX_BAN_MS);
        for (key, (count, caller)) in refusals {
            call.arg(format!("{key:016x}"))
                .arg(*count)
                .arg(escape(caller));
        }
        let made: Vec<String> = self.invoke(call).await?;
        let mut bans = Vec::new();
        for line in made {
            if let Some((key, Some(ban))) = parse(&line) {
                bans.push((key, ban));
            }
        }
        Ok(bans)
    }

    /// A manual ban of `key` for `duration_ms`, in Redis first.
    pub async fn ban(
        &self,
        key: CallerKey,
        ban: &Ban,
        duration_ms: u64,
    ) -> Result<Ban, StoreError> {
        let mut call = self.call("ban");
        call.arg(format!("{key:016x}"))
            .arg(duration_ms.max(1))
            .arg(escape(ban.reason.text()))
            .arg(escape(&ban.caller));
        let line: String = self.invoke(call).await?;
        match parse(&line) {
            Some((_, Some(ban))) => Ok(ban),
            _ => Err(StoreError::Protocol("a malformed ban from the script")),
        }
    }

    /// Ends `key`'s ban in Redis; true if there was one.
    pub async fn lift(&self, key: CallerKey) -> Result<bool, StoreError> {
        let mut call = self.call("lift");
        call.arg(format!("{key:016x}"));
        let existed: i64 = self.invoke(call).await?;
        Ok(existed > 0)
    }

    /// Brings `table` up to date with every ban changed since the last poll.
    pub async fn poll(&self, table: &BanTable, now_ms: u64) -> Result<(), StoreError> {
        let mut call = self.call("poll");
        call.arg(self.since_ms.load(Ordering::Relaxed));
        let answer: Vec<String> = self.invoke(call).await?;
        let Some((redis_now, changes)) = answer.split_first() else {
            return Err(StoreError::Protocol("an empty poll answer"));
        };
        for line in changes {
            match parse(line) {
                Some((key, Some(ban))) => {
                    table.set(key, ban, now_ms);
                }
                Some((key, None)) => {
                    table.lift(key, now_ms);
                }
                None => {}
            }
        }
        // The next poll overlaps this one by a second: changes made in the same
        // millisecond as this poll are not missed, and applying one twice is harmless.
        let redis_now: u64 = redis_now.parse().unwrap_or(0);
        self.since_ms
            .store(redis_now.saturating_sub(1_000).max(1), Ordering::Relaxed);
        Ok(())
    }

    /// An invocation of operation `op`, routed by the slot of the bans' hash tag.
    fn call(&self, op: &str) -> redis::ScriptInvocation<'static> {
        let mut call = SCRIPT.prepare_invoke();
        call.key(ACTIVE_KEY).arg(op);
        call
    }

    /// Sends `call` on the engine's thread and waits for its answer.
    async fn invoke<T: redis::FromRedisValue + Send + 'static>(
        &self,
        call: redis::ScriptInvocation<'static>,
    ) -> Result<T, StoreError> {
        self.link
            .query(|mut connection| async move { call.invoke_async(&mut connection).await })
            .await
    }
}

/// The index of live bans; every bans key shares its hash tag.
const ACTIVE_KEY: &str = "sluice:{sluice-bans}:active";

/// Names and reasons travel inside `|`-separated values.
fn escape(text: &str) -> String {
    text.replace('%', "%25").replace('|', "%7C")
}

fn unescape(text: &str) -> String {
    text.replace("%7C", "|").replace("%25", "%")
}

/// `HEX|until|refusals|level|reason|caller` (or `HEX|` for no ban).
fn parse(line: &str) -> Option<(CallerKey, Option<Ban>)> {
    let (hex, rest) = line.split_once('|')?;
    let key = u64::from_str_radix(hex, 16).ok()?;
    if rest.is_empty() {
        return Some((key, None));
    }
    let mut fields = rest.splitn(5, '|');
    let until_ms = fields.next()?.parse::<f64>().ok()? as u64;
    let refusals = fields.next()?.parse::<f64>().ok()? as u32;
    let level = fields.next()?.parse::<f64>().ok()? as u32;
    let reason = match unescape(fields.next()?).as_str() {
        "automatic" => Reason::Automatic,
        text => Reason::Manual(text.to_string()),
    };
    let caller = unescape(fields.next()?);
    Some((
        key,
        Some(Ban {
            caller,
            reason,
            until_ms,
            refusals,
            level,
        }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bans_travel_with_their_names_and_reasons_intact() {
        let line = format!(
            "{:016x}|1774000600000|50|1|{}|{}",
            7u64,
            escape("stuffing | keys 100%"),
            escape("consumer:a|b")
        );
        let (key, ban) = parse(&line).unwrap();
        let ban = ban.unwrap();
        assert_eq!(key, 7);
        assert_eq!(ban.until_ms, 1_774_000_600_000);
        assert_eq!((ban.refusals, ban.level), (50, 1));
        assert_eq!(
            ban.reason,
            Reason::Manual("stuffing | keys 100%".to_string())
        );
        assert_eq!(ban.caller, "consumer:a|b");
        assert_eq!(parse(&format!("{:016x}|", 9u64)), Some((9, None)));
        assert_eq!(parse("zz|"), None);
    }
}
