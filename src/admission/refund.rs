//! The refund step of admission, taken once the answer's status is known: a route's
//! `refund_on` statuses (an upstream's answer, or sluice's own 502/504 when the
//! upstream could not be reached or did not answer) give the request's cost back, so
//! a caller does not pay for an upstream's failure.
//!
//! The refund takes back exactly what admission counted, at the instant it counted
//! it (the store's contract), and is counted in `sluice_refunds_total{reason="status"}`.
//! The other refund, for capacity, is the concurrency hold's ([`super::hold`]).

use http::StatusCode;

use super::{Admission, Admitted};
use crate::observe::metrics::cost::REFUND_STATUS;
use crate::snapshot::Snapshot;

impl Admission {
    /// Step: gives the cost of `admitted` back when its answer's `status` is one of
    /// its route's `refund_on`; the RateLimit headers then show the refund.
    pub async fn refund_on(
        &self,
        snapshot: &Snapshot,
        admitted: &mut Admitted<'_>,
        status: StatusCode,
    ) {
        let route = admitted.route.1;
        if route.refund_on.is_empty() || !route.refund_on.contains(&status) {
            return;
        }
        let Some(counted) = admitted.counted.as_mut() else {
            return;
        };
        let now_ms = self.clock.now_ms();
        if let Some(cost) = counted.refund(snapshot, &self.store, now_ms).await {
            counted.report.refund(cost);
            // A refunded answer costs nothing, whatever it says (`cost_after`).
            counted.refunded();
            self.metrics.cost.refund(&route.name, REFUND_STATUS);
        }
    }
}
