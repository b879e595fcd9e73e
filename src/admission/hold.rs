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
use crate::config::PolicyMode;
use crate::config::route::Route;
use crate::http::refusal::Refusal;
use crate::identity::Caller;
use crate::observe::metrics::cost::REFUND_CAPACITY;
use crate::snapshot::Snapshot;

impl Admission {
    /// A slot under `cap` for the request `counted` admitted (`None`: the route does
    /// not limit the caller's rate), and what the request is counted as after it.
    pub(super) async fn hold<'a>(
        &self,
        snapshot: &'a Snapshot,
        cap: &Arc<Cap>,
        route: &Route,
        standing: Standing<'_>,
        ask: Option<Ask>,
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
            Err(_) if shadow(snapshot, route) => Ok(Passed {
                counted,
                permit: None,
                would_refuse: vec!["concurrency"],
            }),
            Err(refused) => {
                if let Some(policy) = route.policy {
                    let names = (
                        snapshot.policy_name(policy),
                        snapshot.plan_name(caller.plan),
                    );
                    self.metrics.concurrency_rejection(names.0, names.1);
                }
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
                Err(refusal(snapshot, route, counted.as_ref(), refused))
            }
        }
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
        ask: Option<Ask>,
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

/// Whether `route`'s policy is in shadow mode.
fn shadow(snapshot: &Snapshot, route: &Route) -> bool {
    route
        .policy
        .is_some_and(|p| matches!(snapshot.policy_mode(p), PolicyMode::Shadow { .. }))
}

/// The refusal of a request that got no slot: 429 over `per_caller`, else 503.
fn refusal(
    snapshot: &Snapshot,
    route: &Route,
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
                None => route.policy.and_then(|p| snapshot.cap_header(p)).cloned(),
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
