//! The concurrency step of admission: a slot under the policy's cap, waiting in its
//! queue if need be (`concurrency`), for a request the rate limits admitted.
//!
//! A request refused here (queue full, waited too long, `per_caller`) gives back the
//! quota it was admitted with, so a 503 for capacity costs the caller nothing. A
//! request that waited in the queue is counted again at the moment it leaves it. A
//! policy in shadow mode admits, without a slot, a request the cap would refuse
//! (after the same wait), and names `concurrency` among its would-be refusals.

use std::sync::Arc;

use super::{Admission, Ask, Counted, Passed, Standing};
use crate::concurrency::{Cap, NoSlot, Permit};
use crate::config::route::Route;
use crate::config::{PolicyId, PolicyMode};
use crate::http::refusal::Refusal;
use crate::identity::Caller;
use crate::observe::metrics::cost::REFUND_CAPACITY;
use crate::snapshot::Snapshot;

impl Admission {
    /// A slot under `cap`, `policy`'s, for the request `counted` admitted (`None`:
    /// the route does not limit the caller's rate), and what the request is counted
    /// as after it.
    pub(super) async fn hold<'a>(
        &self,
        snapshot: &'a Snapshot,
        (policy, cap): (PolicyId, &Arc<Cap>),
        route: &Route,
        standing: Standing<'_>,
        ask: Option<Ask<'_>>,
        counted: Option<Counted<'a>>,
    ) -> Result<Passed<'a>, Refusal> {
        let caller = standing.caller;
        match cap.acquire(standing.key).await {
            Ok(permit) => {
                let counted =
                    (self.dispatch(snapshot, route, caller, ask, counted, &permit)).await?;
                Ok(Passed {
                    counted,
                    permit: Some(permit),
                    would_refuse: Vec::new(),
                })
            }
            Err(_) if shadow(snapshot, policy) => Ok(Passed {
                counted,
                permit: None,
                would_refuse: vec!["concurrency"],
            }),
            Err(refused) => {
                let names = (
                    snapshot.policy_name(policy),
                    snapshot.plan_name(caller.plan),
                );
                self.metrics.concurrency_rejection(names.0, names.1);
                if let Some(counted) = &counted {
                    let now_ms = self.clock.now_ms();
                    if counted
                        .refund(snapshot, &self.store, now_ms)
                        .await
                        .is_some()
                    {
                        self.metrics.cost.refund(&route.name, REFUND_CAPACITY);
                    }
                }
                Err(refusal(snapshot, route, policy, counted.as_ref(), refused))
            }
        }
    }

    /// The slots of a route of several policies: one under each policy's cap, in the
    /// route's order, each held until the request ends; refused (and refunded in
    /// every policy) by the first cap that has no slot.
    pub(super) async fn hold_stacked<'a>(
        &self,
        snapshot: &'a Snapshot,
        route: &Route,
        standing: Standing<'_>,
        ask: Option<Ask<'_>>,
        counted: Option<Counted<'a>>,
    ) -> Result<Passed<'a>, Refusal> {
        let mut passed = Passed {
            counted,
            permit: None,
            would_refuse: Vec::new(),
        };
        for &policy in &route.policies {
            let Some(cap) = snapshot.cap(policy) else {
                continue;
            };
            let counted = passed.counted.take();
            let held = self.hold(snapshot, (policy, cap), route, standing, ask, counted);
            let next = held.await?;
            passed.counted = next.counted;
            passed.would_refuse.extend(next.would_refuse);
            passed.permit = match (passed.permit.take(), next.permit) {
                (Some(mut first), Some(permit)) => {
                    first.hold_also(permit);
                    Some(first)
                }
                (first, permit) => first.or(permit),
            };
        }
        Ok(passed)
    }

    /// A request that waited in the concurrency queue is counted again at the moment
    /// it leaves it: its rate quota is moved from the admission instant to now, so the
    /// upstream never sees more than a limit in any window, however long the queue
    /// held requests back. If the window filled up meanwhile, that is a 429.
    async fn dispatch<'a>(
        &self,
        snapshot: &'a Snapshot,
        route: &Route,
        caller: &Caller,
        ask: Option<Ask<'_>>,
        counted: Option<Counted<'a>>,
        permit: &Permit,
    ) -> Result<Option<Counted<'a>>, Refusal> {
        let counted = match counted {
            Some(counted) if permit.queued() => counted,
            counted => return Ok(counted),
        };
        let now_ms = self.clock.now_ms();
        counted.refund(snapshot, &self.store, now_ms).await;
        self.rate(snapshot, route, caller, ask, now_ms).await
    }
}

/// Whether `policy` is in shadow mode.
fn shadow(snapshot: &Snapshot, policy: PolicyId) -> bool {
    matches!(snapshot.policy_mode(policy), PolicyMode::Shadow { .. })
}

/// The refusal of a request that got no slot: 429 over `per_caller`, else 503.
fn refusal(
    snapshot: &Snapshot,
    route: &Route,
    policy: PolicyId,
    counted: Option<&Counted<'_>>,
    refused: NoSlot,
) -> Refusal {
    match refused {
        NoSlot::PerCaller { limit } => Refusal::Concurrent {
            detail: format!(
                "per_caller concurrency limit of {limit} on route {}",
                route.name
            ),
            report: counted.map(|c| c.report.clone()).unwrap_or_default(),
            policy_header: match counted {
                Some(counted) => counted.limits.policy_header.clone(),
                None => snapshot.cap_header(policy).cloned(),
            },
        },
        NoSlot::QueueFull { retry_after_secs } => Refusal::Capacity {
            body: snapshot.capacity_body(route.id).clone(),
            retry_after: retry_after_secs,
            timed_out: false,
        },
        NoSlot::TimedOut { retry_after_secs } => Refusal::Capacity {
            body: snapshot.capacity_body(route.id).clone(),
            retry_after: retry_after_secs,
            timed_out: true,
        },
    }
}
