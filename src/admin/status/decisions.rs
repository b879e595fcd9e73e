//! The decisions other proxies asked of this replica (Envoy's rate limit service,
//! forward auth, `/v1/check`), by door and outcome: counted since start and per
//! second over the traffic span, from `sluice_decisions_total` as the traffic
//! sampler reads it. Which rule or route decided them is in the routes' traffic
//! (`sluice_requests_total`), and their callers in the refused and near-limit lists.

use std::collections::BTreeMap;

use serde::Serialize;

use super::page::{esc, number, table};
use super::traffic::Sample;

/// Decisions of one door with one outcome.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct DecisionTraffic {
    /// `rls`, `forward_auth` or `check`.
    pub via: String,
    pub outcome: String,
    /// Since start.
    pub total: u64,
    /// Per second between the oldest sample kept and now.
    pub per_s: f64,
}

/// Every door and outcome seen, from `oldest` to `now`, by door then outcome.
pub(crate) fn between(oldest: &Sample, now: &Sample) -> Vec<DecisionTraffic> {
    let secs = now.at_ms.saturating_sub(oldest.at_ms) as f64 / 1_000.0;
    let sorted: BTreeMap<_, _> = now.decisions.iter().collect();
    sorted
        .into_iter()
        .map(|((via, outcome), &total)| {
            let before = oldest.decisions.get(&(via.clone(), outcome.clone()));
            let delta = total.saturating_sub(before.copied().unwrap_or(0));
            let per_s = match secs > 0.0 {
                true => (delta as f64 / secs * 1_000.0).round() / 1_000.0,
                false => 0.0,
            };
            DecisionTraffic {
                via: via.clone(),
                outcome: outcome.clone(),
                total,
                per_s,
            }
        })
        .collect()
}

/// The page's table of decisions.
pub(crate) fn render(html: &mut String, decisions: &[DecisionTraffic]) {
    let rows = decisions.iter().map(|d| {
        format!(
            "<th scope=\"row\">{}</th><td>{}</td><td>{}</td><td>{}</td>",
            esc(&d.via),
            esc(&d.outcome),
            d.total,
            number(d.per_s)
        )
    });
    let heads = ["Door", "Outcome", "Since start", "Per second"];
    let note = "This replica: Envoy's rate limit service (rls), forward auth and /v1/check, \
                per second over the last 5 minutes.";
    table(
        html,
        "decisions",
        "Decisions for other proxies",
        note,
        &heads,
        rows.collect(),
    );
}

#[cfg(test)]
mod tests {
    use super::{Sample, between};

    #[test]
    fn rates_per_door_and_outcome_over_the_span() {
        let at = |ms, counts: &[(&str, &str, u64)]| Sample {
            at_ms: ms,
            routes: Default::default(),
            decisions: (counts.iter())
                .map(|(v, o, n)| ((v.to_string(), o.to_string()), *n))
                .collect(),
        };
        let oldest = at(0, &[("rls", "allowed", 10)]);
        let now = at(
            10_000,
            &[("rls", "allowed", 60), ("forward_auth", "limited", 5)],
        );
        let rows = between(&oldest, &now);
        let seen: Vec<_> = (rows.iter())
            .map(|r| (r.via.as_str(), r.outcome.as_str(), r.total, r.per_s))
            .collect();
        assert_eq!(
            seen,
            [
                ("forward_auth", "limited", 5, 0.5),
                ("rls", "allowed", 60, 5.0)
            ]
        );
    }
}
