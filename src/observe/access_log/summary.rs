//! `[log] refused = "summary"`: a refusal flood's lines, at most one per caller, route
//! and outcome a second.
//!
//! The writer thread asks [`Summary::admit`] about every record before it formats it.
//! Admitted requests (and upstream errors, and clients that left) always pass. For a
//! refusal, the first of its caller, route and outcome in a second passes; the later
//! ones of that second are held back, one at a time: each newly held record replaces
//! (and so leaves out) the one held before it. The next line of that caller, route and
//! outcome carries in `repeated` how many of its refusals were left out since its last
//! line: the first refusal of a later second, or, once the key has been quiet for a
//! second (of real time, as the writer waits: a refusal's own time is when it
//! arrived), the last refusal held ([`Summary::expired`]). So every refusal is
//! either a line or counted in one line's `repeated`, and in
//! `sluice_access_log_suppressed_total`.
//!
//! It runs on the writer's thread, never on a request's: a request still hands its
//! record to the queue as before, and a refusal left out costs the writer a hash and a
//! table look-up instead of formatting and writing a line. It does not decide what is
//! logged when the queue is full: those records are dropped before they get here.

use std::hash::{BuildHasher, Hash, Hasher};
use std::time::{Duration, Instant};

use hashbrown::HashMap;
use prometheus::IntCounter;

use super::Record;
use crate::http::refusal::Outcome;

/// Keys (caller, route, outcome) followed at most; a key beyond is logged in full,
/// so a spray of fresh addresses bounds the table, never the log's truthfulness.
const MAX_KEYS: usize = 65_536;

/// How long a key must have been quiet before its held refusal is written.
const QUIET: Duration = Duration::from_secs(1);

/// One caller, route and outcome's refusals in its latest second.
#[derive(Debug)]
struct Slot {
    /// The second (since the Unix epoch) of the key's latest line.
    second: u64,
    /// Refusals left out since that line (the held one not counted).
    repeated: u64,
    /// The latest refusal of that second not yet written.
    held: Option<Box<Record>>,
    /// When the writer last saw a refusal of the key.
    touched: Instant,
}

/// The writer's memory of recent refusals.
#[derive(Debug)]
pub(super) struct Summary {
    slots: HashMap<u64, Slot>,
    hasher: foldhash::fast::RandomState,
    /// `sluice_access_log_suppressed_total`.
    suppressed: IntCounter,
}

impl Summary {
    pub(super) fn new(suppressed: IntCounter) -> Summary {
        Summary {
            slots: HashMap::new(),
            hasher: foldhash::fast::RandomState::default(),
            suppressed,
        }
    }

    /// Whether any refusal is held, to be written once its key has been quiet.
    pub(super) fn holding(&self) -> bool {
        !self.slots.is_empty()
    }

    /// What to write of `record`, seen by the writer at `now` (read once a batch):
    /// itself with the count of refusals left out before it, or nothing (it is held).
    pub(super) fn admit(
        &mut self,
        record: Box<Record>,
        now: Instant,
    ) -> Option<(Box<Record>, u64)> {
        if !record.summarised || !refusal(record.outcome) {
            return Some((record, 0));
        }
        let key = self.key(&record);
        let second = record.time_ms / 1000;
        let full = self.slots.len() >= MAX_KEYS;
        match self.slots.get_mut(&key) {
            Some(slot) if second <= slot.second => {
                slot.touched = now;
                if slot.held.replace(record).is_some() {
                    slot.repeated += 1;
                    self.suppressed.inc();
                }
                None
            }
            Some(slot) => {
                slot.touched = now;
                let mut repeated = std::mem::take(&mut slot.repeated);
                if slot.held.take().is_some() {
                    repeated += 1;
                    self.suppressed.inc();
                }
                slot.second = second;
                Some((record, repeated))
            }
            None => {
                if !full {
                    let slot = Slot {
                        second,
                        repeated: 0,
                        held: None,
                        touched: now,
                    };
                    self.slots.insert(key, slot);
                }
                Some((record, 0))
            }
        }
    }

    /// Hands `write` the refusals held by keys quiet for a second (every key's,
    /// with `all`), each with its count, and forgets those keys.
    pub(super) fn expired(&mut self, all: bool, mut write: impl FnMut(Box<Record>, u64)) {
        self.slots.retain(|_, slot| {
            if !all && slot.touched.elapsed() < QUIET {
                return true;
            }
            if let Some(held) = slot.held.take() {
                write(held, slot.repeated);
            }
            false
        });
    }

    /// The caller (its name, or when anonymous its address: an IPv6 one by the
    /// prefix the limiter keys it by, so a spray of one network's addresses is one
    /// caller here too), route (an RLS call's domain), outcome and door of `record`,
    /// hashed: 64 bits make two keys sharing a slot a once-in-an-age event that
    /// would merge two callers' counts for a second.
    fn key(&self, record: &Record) -> u64 {
        let mut h = self.hasher.build_hasher();
        match (&record.named, record.consumer) {
            (Some(named), _) => named.hash(&mut h),
            (None, Some(c)) => record.names.consumer_name(c).hash(&mut h),
            (None, None) => match record.client.to_canonical() {
                std::net::IpAddr::V6(v6) => {
                    let prefix = record.names.ipv6_prefix().min(128);
                    let bits = u128::from(v6)
                        & (u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0));
                    bits.hash(&mut h);
                }
                v4 => v4.hash(&mut h),
            },
        }
        let route = (record.route).map(|r| record.names.route_name(r));
        record.domain.as_deref().or(route).hash(&mut h);
        (record.outcome as u8).hash(&mut h);
        record.via.hash(&mut h);
        h.finish()
    }
}

/// Whether `outcome` is sluice's refusal (what a flood is made of), rather than an
/// admitted request, an upstream's failure or a client that left.
pub(super) fn refusal(outcome: Outcome) -> bool {
    !matches!(
        outcome,
        Outcome::Allowed | Outcome::UpstreamError | Outcome::ClientClosed
    )
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::config::{ConsumerId, PlanId, RouteId};
    use crate::observe::access_log::{Names, Record};
    use std::sync::Arc;

    #[derive(Debug)]
    struct Named;

    impl Names for Named {
        fn consumer_name(&self, _: ConsumerId) -> &str {
            "acme"
        }
        fn plan_name(&self, _: PlanId) -> &str {
            "registered"
        }
        fn route_name(&self, _: RouteId) -> &str {
            "api"
        }
    }

    /// A JSON record of `client` on route `api`, answered 429 as `outcome`.
    pub(in crate::observe::access_log) fn record(
        client: [u8; 4],
        outcome: Outcome,
        time_ms: u64,
        summarised: bool,
    ) -> Box<Record> {
        Box::new(Record {
            names: Arc::new(Named),
            format: crate::config::AccessLogFormat::Json,
            summarised,
            time_ms,
            request_id: http::HeaderValue::from_static("id"),
            client: client.into(),
            consumer: None,
            named: None,
            plan: None,
            route: Some(RouteId::new(0)),
            domain: None,
            method: http::Method::GET,
            path: super::super::Path::Normalised("/api".to_string()),
            status: 429,
            outcome,
            violated: Box::default(),
            would_refuse: Box::default(),
            upstream: None,
            upstream_status: None,
            upstream_duration: None,
            duration: Duration::ZERO,
            bytes: 0,
            via: None,
            grpc_status: None,
            socket: None,
        })
    }

    /// Every refusal is a line or counted in exactly one line's `repeated`, whatever
    /// the seconds and keys, and the counter is the sum of the `repeated` fields.
    #[test]
    fn every_refusal_is_a_line_or_in_one_lines_repeated() {
        let counter = IntCounter::new("s", "s").unwrap();
        let mut summary = Summary::new(counter.clone());
        let now = Instant::now();
        let (mut lines, mut repeated, mut sent) = (0u64, 0u64, 0u64);
        let mut tally = |written: Option<(Box<Record>, u64)>| {
            if let Some((_, n)) = written {
                lines += 1;
                repeated += n;
            }
        };
        // Two callers over three seconds, 100 refusals each a second; admitted
        // requests of the first in between.
        for second in 0..3u64 {
            for i in 0..100u64 {
                for client in [[10, 0, 0, 1], [10, 0, 0, 2]] {
                    let r = record(client, Outcome::Limited, second * 1000 + i, true);
                    tally(summary.admit(r, now));
                    sent += 1;
                }
                let ok = record([10, 0, 0, 1], Outcome::Allowed, second * 1000 + i, true);
                let (_, n) = summary.admit(ok, now).expect("admitted requests are lines");
                assert_eq!(n, 0);
            }
        }
        // Each caller: the first of each second is a line so far.
        assert_eq!(lines, 6);
        let mut flushed = Vec::new();
        summary.expired(true, |r, n| flushed.push((r, n)));
        assert_eq!(
            flushed.len(),
            2,
            "each caller's last refusal held, then written"
        );
        for (record, n) in flushed {
            lines += 1;
            repeated += n;
            assert_eq!(
                record.time_ms, 2_099,
                "the latest refusal is the one written"
            );
        }
        assert_eq!(lines + repeated, sent);
        assert_eq!(counter.get(), repeated);
        assert!(!summary.holding());
    }

    #[test]
    fn refused_all_and_other_outcomes_pass_untouched() {
        let mut summary = Summary::new(IntCounter::new("s", "s").unwrap());
        let now = Instant::now();
        for _ in 0..3 {
            let all = record([10, 0, 0, 1], Outcome::Limited, 5, false);
            assert!(summary.admit(all, now).is_some());
            for outcome in [Outcome::UpstreamError, Outcome::ClientClosed] {
                assert!(
                    summary
                        .admit(record([10, 0, 0, 1], outcome, 5, true), now)
                        .is_some()
                );
            }
        }
        assert!(!summary.holding());
        // Distinct outcomes of one caller are distinct keys.
        for outcome in [Outcome::Limited, Outcome::Banned, Outcome::Unauthorized] {
            let refused = record([10, 0, 0, 1], outcome, 5, true);
            assert_eq!(summary.admit(refused, now).map(|(_, n)| n), Some(0));
        }
    }

    /// Anonymous IPv6 callers of one /64 (the limiter's prefix) are one key.
    #[test]
    fn an_ipv6_spray_of_one_network_is_one_caller() {
        let mut summary = Summary::new(IntCounter::new("s", "s").unwrap());
        let now = Instant::now();
        let mut lines = 0;
        for i in 0..50u16 {
            let mut r = record([0, 0, 0, 0], Outcome::Limited, 5, true);
            r.client = std::net::Ipv6Addr::new(0x2001, 0xdb8, 0, 7, i, 1, 2, 3).into();
            lines += usize::from(summary.admit(r, now).is_some());
        }
        assert_eq!(lines, 1);
        let mut r = record([0, 0, 0, 0], Outcome::Limited, 5, true);
        r.client = std::net::Ipv6Addr::new(0x2001, 0xdb8, 0, 8, 0, 0, 0, 1).into();
        assert!(
            summary.admit(r, now).is_some(),
            "another /64 is another caller"
        );
    }

    /// A key quiet for less than a second keeps its held refusal; one quiet longer
    /// has it written.
    #[test]
    fn a_held_refusal_waits_for_its_key_to_be_quiet() {
        let mut summary = Summary::new(IntCounter::new("s", "s").unwrap());
        let long_ago = Instant::now() - QUIET * 2;
        for i in 0..3 {
            summary.admit(record([10, 0, 0, 1], Outcome::Limited, i, true), long_ago);
        }
        summary.admit(
            record([10, 0, 0, 2], Outcome::Limited, 0, true),
            Instant::now(),
        );
        summary.admit(
            record([10, 0, 0, 2], Outcome::Limited, 1, true),
            Instant::now(),
        );
        let mut written = Vec::new();
        summary.expired(false, |r, n| written.push((r.client, n)));
        assert_eq!(written, [([10, 0, 0, 1].into(), 1)]);
        assert!(summary.holding(), "the other key is still held");
    }
}
