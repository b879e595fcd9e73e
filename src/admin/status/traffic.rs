//! Traffic per route over the last five minutes, from the metrics the request path
//! counts anyway: the admin runtime samples every route's totals every
//! [`SAMPLE_EVERY`] and keeps five minutes of samples; a reader adds a sample of
//! now and takes differences. Nothing is added to the request path.
//!
//! Rates are requests per second between the oldest sample kept and now; p50 and
//! p99 are read from the request-duration histogram's buckets over the same span,
//! interpolated within a bucket as Prometheus' `histogram_quantile` does (so they
//! are as precise as the buckets). The sparklines are the same figures per sample
//! interval.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use parking_lot::Mutex;
use serde::Serialize;

use super::decisions::DecisionTraffic;
use crate::observe::metrics::RouteTotals;

/// How often the routes' totals are sampled.
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// The span rates and quantiles cover.
pub(crate) const SPAN: Duration = Duration::from_secs(300);
/// Samples kept: the span's, and one more to measure it from.
const KEPT: usize = (SPAN.as_secs() / SAMPLE_EVERY.as_secs()) as usize + 1;

/// Outcomes the page groups as refused: every refusal that is neither a limit's
/// (429) nor an upstream's failure.
const REFUSED: [&str; 8] = [
    "unauthorized",
    "forbidden",
    "banned",
    "no_route",
    "unavailable",
    "bad_request",
    "too_large",
    "queued_timeout",
];

/// Routes' totals at an instant (ms of the gateway's clock), and the decision
/// listener's by `(via, outcome)`.
#[derive(Debug, Clone)]
pub(crate) struct Sample {
    pub at_ms: u64,
    pub routes: HashMap<String, RouteTotals>,
    pub decisions: HashMap<(String, String), u64>,
}

/// Five minutes of samples.
#[derive(Debug, Default)]
pub(crate) struct Traffic {
    samples: Mutex<VecDeque<Sample>>,
}

/// One route's traffic over the span, as the status page shows it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct RouteTraffic {
    pub route: String,
    /// Seconds the rates cover (less than five minutes just after start).
    pub span_s: f64,
    pub admitted_per_s: f64,
    pub limited_per_s: f64,
    pub refused_per_s: f64,
    pub upstream_errors_per_s: f64,
    /// Request head to response head, in milliseconds; `None` without requests.
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    /// The same per sample interval, oldest first, for the sparklines.
    pub series: Series,
}

/// Per-interval figures of one route, oldest first.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub(crate) struct Series {
    pub admitted: Vec<f64>,
    pub limited: Vec<f64>,
    pub refused: Vec<f64>,
    pub upstream_errors: Vec<f64>,
    pub p99_ms: Vec<f64>,
}

impl Traffic {
    /// Keeps `sample`, dropping what is older than the span.
    pub(crate) fn record(&self, sample: Sample) {
        let mut samples = self.samples.lock();
        samples.push_back(sample);
        while samples.len() > KEPT {
            samples.pop_front();
        }
    }

    /// Every route's traffic from the oldest sample kept to `now` (a sample taken
    /// just now), in route name order.
    pub(crate) fn report(&self, now: Sample) -> Vec<RouteTraffic> {
        let samples = self.samples.lock();
        let mut points: Vec<&Sample> = samples.iter().collect();
        if points.last().is_none_or(|last| last.at_ms < now.at_ms) {
            points.push(&now);
        }
        let mut names: Vec<&String> = now.routes.keys().collect();
        names.sort();
        names
            .into_iter()
            .map(|name| route_traffic(name, &points))
            .collect()
    }

    /// The decision listener's doors and outcomes from the oldest sample kept to
    /// `now`.
    pub(crate) fn decisions(&self, now: &Sample) -> Vec<DecisionTraffic> {
        let samples = self.samples.lock();
        let oldest = samples.front().filter(|s| s.at_ms <= now.at_ms);
        super::decisions::between(oldest.unwrap_or(now), now)
    }
}

fn route_traffic(name: &str, points: &[&Sample]) -> RouteTraffic {
    let empty = RouteTotals::default();
    let totals = |i: usize| points[i].routes.get(name).unwrap_or(&empty);
    let (first, last) = (0, points.len() - 1);
    let span_s = (points[last].at_ms.saturating_sub(points[first].at_ms)) as f64 / 1_000.0;
    let rates = Rates::between(totals(first), totals(last), span_s);
    let mut series = Series::default();
    for i in 1..points.len() {
        let secs = (points[i].at_ms.saturating_sub(points[i - 1].at_ms)) as f64 / 1_000.0;
        let rates = Rates::between(totals(i - 1), totals(i), secs);
        series.admitted.push(rates.admitted);
        series.limited.push(rates.limited);
        series.refused.push(rates.refused);
        series.upstream_errors.push(rates.upstream_errors);
        let p99 = quantile(totals(i - 1), totals(i), 0.99);
        series.p99_ms.push(p99.unwrap_or(0.0));
    }
    RouteTraffic {
        route: name.to_string(),
        span_s,
        admitted_per_s: rates.admitted,
        limited_per_s: rates.limited,
        refused_per_s: rates.refused,
        upstream_errors_per_s: rates.upstream_errors,
        p50_ms: quantile(totals(first), totals(last), 0.5),
        p99_ms: quantile(totals(first), totals(last), 0.99),
        series,
    }
}

/// Requests per second of each group between two samples `secs` apart.
struct Rates {
    admitted: f64,
    limited: f64,
    refused: f64,
    upstream_errors: f64,
}

impl Rates {
    fn between(old: &RouteTotals, new: &RouteTotals, secs: f64) -> Rates {
        let delta = |outcome: &str| {
            let index = crate::http::refusal::OUTCOMES
                .iter()
                .position(|o| *o == outcome);
            index.map_or(0, |i| new.outcomes[i].saturating_sub(old.outcomes[i]))
        };
        let rate = |count: u64| match secs > 0.0 {
            true => round(count as f64 / secs),
            false => 0.0,
        };
        Rates {
            admitted: rate(delta("allowed")),
            limited: rate(delta("limited")),
            refused: rate(REFUSED.iter().map(|o| delta(o)).sum()),
            upstream_errors: rate(delta("upstream_error")),
        }
    }
}

/// The `q` quantile of the requests counted between `old` and `new`, in ms.
fn quantile(old: &RouteTotals, new: &RouteTotals, q: f64) -> Option<f64> {
    let counts: Vec<(f64, u64)> = (new.buckets.iter())
        .enumerate()
        .map(|(i, &(bound, count))| {
            let before = old.buckets.get(i).map_or(0, |b| b.1);
            (bound, count.saturating_sub(before))
        })
        .collect();
    let total = counts.last()?.1;
    if total == 0 {
        return None;
    }
    let rank = q * total as f64;
    let mut lower = (0.0, 0u64);
    for &(bound, count) in &counts {
        if count as f64 >= rank {
            if bound.is_infinite() {
                // Beyond the last finite bucket: its bound is all that is known.
                return Some(round(lower.0 * 1_000.0));
            }
            let within = (count - lower.1) as f64;
            let share = match within > 0.0 {
                true => (rank - lower.1 as f64) / within,
                false => 1.0,
            };
            return Some(round((lower.0 + (bound - lower.0) * share) * 1_000.0));
        }
        lower = (bound, count);
    }
    None
}

/// Three decimals are all a page shows.
fn round(value: f64) -> f64 {
    (value * 1_000.0).round() / 1_000.0
}

#[cfg(test)]
mod tests {
    use super::{RouteTotals, Sample, Traffic, quantile};

    fn totals(allowed: u64, limited: u64, buckets: &[(f64, u64)]) -> RouteTotals {
        let mut outcomes = [0; crate::http::refusal::OUTCOMES.len()];
        (outcomes[0], outcomes[1]) = (allowed, limited);
        RouteTotals {
            outcomes,
            buckets: buckets.to_vec(),
        }
    }

    #[test]
    fn rates_and_quantiles_over_the_samples() {
        let traffic = Traffic::default();
        let at = |ms, t: RouteTotals| Sample {
            at_ms: ms,
            routes: [("api".to_string(), t)].into(),
            decisions: Default::default(),
        };
        traffic.record(at(
            0,
            totals(0, 0, &[(0.01, 0), (0.1, 0), (f64::INFINITY, 0)]),
        ));
        traffic.record(at(
            5_000,
            totals(50, 5, &[(0.01, 40), (0.1, 50), (f64::INFINITY, 55)]),
        ));
        let now = at(
            10_000,
            totals(100, 10, &[(0.01, 80), (0.1, 100), (f64::INFINITY, 110)]),
        );
        let report = traffic.report(now);
        assert_eq!(report.len(), 1);
        let api = &report[0];
        assert_eq!(
            (api.admitted_per_s, api.limited_per_s, api.span_s),
            (10.0, 1.0, 10.0)
        );
        assert_eq!(api.series.admitted, vec![10.0, 10.0]);
        // 55 of 110 are at or under 10 ms: the median is at the first bucket's top.
        assert_eq!(api.p50_ms, Some(6.875));
        // The last 10 % are slower than 100 ms: the last finite bound is all we know.
        assert_eq!(api.p99_ms, Some(100.0));
    }

    #[test]
    fn no_requests_no_quantile() {
        let none = totals(0, 0, &[(0.01, 0), (f64::INFINITY, 0)]);
        assert_eq!(quantile(&none, &none, 0.5), None);
        assert_eq!(
            quantile(&RouteTotals::default(), &RouteTotals::default(), 0.5),
            None
        );
    }
}
