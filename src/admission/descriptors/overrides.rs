//! The counters of descriptors' own `limit` overrides: one scope per distinct
//! (domain, unit, requests_per_unit), bound on first use and kept, so each keeps its
//! counts across requests and reloads.
//!
//! The values are the client's, so the scopes are bounded: at most `[decision]
//! max_overrides` distinct ones. A request that needs a new scope beyond the bound
//! binds none of its new ones and is refused whole ([`Overflow`]); the scopes bound
//! before it keep counting. A limit of 0 needs no scope (always over). The bound
//! counts every scope since start: counters cannot be unbound from a store without
//! losing the counts of overrides still in use, so a reload keeps them all.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use super::Descriptor;
use crate::config::descriptors::{RuleLimit, limit_of};
use crate::http::rate_headers;
use crate::limit::Window;
use crate::observe::metrics::Metrics;
use crate::snapshot::{PlanLimits, RULE_PLAN};
use crate::store::Store;

/// An override's scope, by (domain, unit, requests_per_unit).
type Key = (String, Window, u32);

/// Every override scope bound since start.
#[derive(Debug, Default)]
pub(crate) struct Overrides {
    bound: Mutex<HashMap<Key, Arc<PlanLimits>>>,
}

/// A request needing a new override scope beyond the bound.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the request needs a new limit override scope, and {max} distinct overrides \
     (domain, unit, requests_per_unit) are in use: at most {max} (decision.max_overrides)"
)]
pub(crate) struct Overflow {
    pub max: usize,
}

impl Overrides {
    /// The scope of each of `asked`'s overrides in `domain` (`None` without one, or
    /// for a limit of 0), binding the new ones if all of them fit under `max`.
    pub(crate) fn scopes(
        &self,
        store: &Store,
        metrics: &Metrics,
        domain: &str,
        asked: &[Descriptor<'_>],
        max: usize,
    ) -> Result<Vec<Option<Arc<PlanLimits>>>, Overflow> {
        let wanted: Vec<Option<Key>> = (asked.iter())
            .map(|d| match d.limit? {
                (0, _) => None,
                (requests, window) => Some((domain.to_string(), window, requests)),
            })
            .collect();
        let mut bound = self.bound.lock();
        let mut new: Vec<&Key> = (wanted.iter().flatten())
            .filter(|key| !bound.contains_key(*key))
            .collect();
        new.sort_unstable();
        new.dedup();
        if !new.is_empty() && bound.len() + new.len() > max {
            return Err(Overflow { max });
        }
        for key in new {
            if let Some(limits) = scope(store, metrics, key) {
                bound.insert(key.clone(), Arc::new(limits));
            }
        }
        Ok((wanted.iter())
            .map(|key| bound.get(key.as_ref()?).cloned())
            .collect())
    }
}

/// The counters of `requests` a `window` in `domain`; `None` for a limit that
/// counts nothing.
fn scope(store: &Store, metrics: &Metrics, (domain, window, requests): &Key) -> Option<PlanLimits> {
    let RuleLimit::Quota(quota) = limit_of(*requests, *window) else {
        return None;
    };
    let name = format!("rls-override:{domain}:{}:{}", window.name(), requests);
    Some(PlanLimits {
        periods: quota.window.is_period(),
        scope: store.scope(&name, RULE_PLAN, vec![quota], &[]),
        policy_header: rate_headers::policy_header([(&quota, false)], None),
        // Labelled `override`: the domain and the number are the request's.
        rejections: vec![metrics.rejections("override", RULE_PLAN, *window, false)],
        stacked_names: Box::default(),
        stacked_header: None,
        mode: crate::config::PolicyMode::Enforce,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asked(limits: &[(u32, Window)]) -> Vec<Descriptor<'static>> {
        (limits.iter())
            .map(|&limit| Descriptor {
                entries: vec![("k", "v")],
                hits: 1,
                limit: Some(limit),
                negative: false,
            })
            .collect()
    }

    #[test]
    fn new_scopes_beyond_the_bound_are_refused_and_old_ones_kept() {
        let store = Store::Memory(Arc::new(crate::store::MemoryStore::new(100, None)));
        let metrics = Metrics::default();
        let overrides = Overrides::default();
        let first = asked(&[
            (2, Window::Minute),
            (3, Window::Minute),
            (2, Window::Minute),
        ]);
        let scopes = overrides.scopes(&store, &metrics, "d", &first, 2).unwrap();
        assert!(Arc::ptr_eq(
            scopes[0].as_ref().unwrap(),
            scopes[2].as_ref().unwrap()
        ));
        let third = asked(&[(2, Window::Minute), (4, Window::Minute)]);
        assert_eq!(
            overrides
                .scopes(&store, &metrics, "d", &third, 2)
                .unwrap_err(),
            Overflow { max: 2 }
        );
        // Another domain is another scope; a limit of 0 needs none.
        let other = overrides.scopes(&store, &metrics, "e", &first[..1], 2);
        assert!(other.is_err());
        let zero = overrides.scopes(&store, &metrics, "e", &asked(&[(0, Window::Hour)]), 2);
        assert!(zero.unwrap()[0].is_none());
        let again = overrides.scopes(&store, &metrics, "d", &first, 2).unwrap();
        assert!(Arc::ptr_eq(
            scopes[1].as_ref().unwrap(),
            again[1].as_ref().unwrap()
        ));
        assert_eq!(overrides.bound.lock().len(), 2);
    }
}
