//! WebSocket message limits: a policy's `messages` decided for each message a caller
//! sends upstream, over all its sockets on the policy's routes.
//!
//! A message is one more unit in the store's strict sliding windows (the same as a
//! request's, fleet-exact with Redis), counted under the caller's limiter key (its
//! consumer, or its IP prefix) in the policy's counters of the plan `messages`, a
//! name no plan can take. A socket keeps the snapshot it opened with: its limits
//! stay those of its upgrade until it closes. What a refusal does to the socket
//! (close 1008, 1001 upstream) is the relay's; counting it is the socket's.

use std::sync::Arc;

use super::{Admission, Admitted};
use crate::clock::Clock;
use crate::config::{PolicyId, PolicyMode};
use crate::http::rate_headers::ceil_secs;
use crate::limit::Report;
use crate::snapshot::Snapshot;
use crate::store::{CallerKey, Store, Verdict};

/// One caller's message limit on one policy, for the sockets it opens.
#[derive(Debug)]
pub(crate) struct MessageLimit {
    /// The snapshot the socket opened with, which holds the limit's counters.
    snapshot: Arc<Snapshot>,
    policy: PolicyId,
    store: Store,
    clock: Clock,
    /// The caller's limiter key.
    caller: CallerKey,
}

/// What a message limit says of one more message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MessageVerdict {
    /// Counted: it goes upstream.
    Pass,
    /// Over the limit of a policy in shadow mode: it goes upstream, uncounted.
    WouldLimit,
    /// Over the limit: refused; one would be admitted after this many seconds.
    Limited(u64),
    /// The store cannot be reached and `on_error = "deny"`.
    Unavailable,
}

impl Admission {
    /// The message limit of the socket `admitted` opens with `snapshot`: `None` when
    /// its route's policy has no `messages`, or the client is `[access] exempt`.
    pub(crate) fn message_limit(
        &self,
        snapshot: &Arc<Snapshot>,
        admitted: &Admitted<'_>,
    ) -> Option<MessageLimit> {
        let policy = admitted.route.policy?;
        snapshot.message_limits(policy)?;
        if snapshot.exempt(admitted.caller.ip) {
            return None;
        }
        Some(MessageLimit {
            snapshot: snapshot.clone(),
            policy,
            store: self.store.clone(),
            clock: self.clock.clone(),
            caller: snapshot.identifier.key(&admitted.caller),
        })
    }
}

impl MessageLimit {
    /// Decides one more message now, counting it if it passes.
    pub(crate) async fn decide(&self) -> MessageVerdict {
        let Some(scope) = self.snapshot.message_limits(self.policy) else {
            return MessageVerdict::Pass;
        };
        let now = self.snapshot.days.now(self.clock.now_ms());
        let mut report = Report::default();
        let verdict = (self.store).decide(scope, self.caller, &now, 1, &mut report);
        self.verdict(verdict.await, &report)
    }

    /// [`MessageLimit::decide`] without waiting, when the store answers at once (in
    /// memory); `None` when its answer must be waited for (Redis).
    pub(crate) fn decide_now(&self) -> Option<MessageVerdict> {
        let Some(scope) = self.snapshot.message_limits(self.policy) else {
            return Some(MessageVerdict::Pass);
        };
        let now = self.snapshot.days.now(self.clock.now_ms());
        let mut report = Report::default();
        let verdict = (self.store).decide_now(scope, self.caller, &now, 1, &mut report)?;
        Some(self.verdict(verdict, &report))
    }

    /// What the store's `verdict` (and its `report`) says of the message.
    fn verdict(&self, verdict: Verdict, report: &Report) -> MessageVerdict {
        match verdict {
            Verdict::Admitted => MessageVerdict::Pass,
            Verdict::Limited => match self.snapshot.policy_mode(self.policy) {
                PolicyMode::Shadow { .. } => MessageVerdict::WouldLimit,
                PolicyMode::Enforce => {
                    let retry_ms = report.retry_ms().unwrap_or(1_000);
                    MessageVerdict::Limited(ceil_secs(retry_ms).max(1))
                }
            },
            Verdict::Unavailable => MessageVerdict::Unavailable,
        }
    }
}
