//! The episode ids of the positions this process reserved lately, per scope.
//!
//! An ingest is not refreshed, so a search cannot see the episodes a consolidation run
//! is about to read; refreshing the episodes index for every run cost more than the
//! run's other requests together. A run whose positions were all reserved here reads
//! its episodes by id instead: a realtime multi-get, which needs no refresh (see
//! `ClusterStore::episodes_after`). An entry is only a hint: the store uses what the
//! read finds when it is in the scope and at the position asked, and falls back to the
//! search otherwise (positions another process reserved, an ingest that failed before
//! its write, a scope erased meanwhile). Bounded per scope and in scopes: a process
//! serving many scopes starts over now and then.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

/// Positions remembered per scope, the latest.
const PER_SCOPE: usize = 512;
/// Scopes remembered at most.
const SCOPES: usize = 4096;

#[derive(Default)]
pub(crate) struct Reserved {
    scopes: Mutex<HashMap<String, BTreeMap<u64, String>>>,
}

impl Reserved {
    /// Remembers that the positions from `first` on hold `ids`, in order.
    pub(crate) fn record<'a>(&self, scope: &str, first: u64, ids: impl IntoIterator<Item = &'a str>) {
        let Ok(mut scopes) = self.scopes.lock() else {
            return;
        };
        if scopes.len() >= SCOPES && !scopes.contains_key(scope) {
            scopes.clear();
        }
        let positions = scopes.entry(scope.to_owned()).or_default();
        for (position, id) in (first..).zip(ids) {
            positions.insert(position, id.to_owned());
        }
        while positions.len() > PER_SCOPE {
            positions.pop_first();
        }
    }

    /// The ids of every position from `from` to `to` (inclusive), in order; `None`
    /// unless each of them was reserved here.
    pub(crate) fn ids(&self, scope: &str, from: u64, to: u64) -> Option<Vec<String>> {
        let scopes = self.scopes.lock().ok()?;
        let positions = scopes.get(scope)?;
        (from..=to)
            .map(|position| positions.get(&position).cloned())
            .collect()
    }

    /// Forgets every position of the scope (an erasure starts its positions over).
    pub(crate) fn forget(&self, scope: &str) {
        if let Ok(mut scopes) = self.scopes.lock() {
            scopes.remove(scope);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_come_back_only_for_a_run_of_positions_reserved_here() {
        let reserved = Reserved::default();
        reserved.record("t/u", 1, ["e1", "e2"]);
        reserved.record("t/u", 4, ["e4"]);
        assert_eq!(
            reserved.ids("t/u", 1, 2),
            Some(vec!["e1".to_owned(), "e2".to_owned()])
        );
        assert_eq!(
            reserved.ids("t/u", 2, 4),
            None,
            "position 3 was reserved elsewhere"
        );
        assert_eq!(reserved.ids("t/u", 4, 4), Some(vec!["e4".to_owned()]));
        assert_eq!(reserved.ids("t/other", 1, 1), None);
        reserved.forget("t/u");
        assert_eq!(reserved.ids("t/u", 1, 1), None);
    }

    #[test]
    fn a_scope_keeps_its_latest_positions_and_a_full_map_starts_over() {
        let reserved = Reserved::default();
        let ids: Vec<String> = (1..=PER_SCOPE as u64 + 10).map(|at| format!("e{at}")).collect();
        reserved.record("t/u", 1, ids.iter().map(String::as_str));
        assert_eq!(
            reserved.ids("t/u", 1, 1),
            None,
            "the oldest positions are dropped"
        );
        let last = PER_SCOPE as u64 + 10;
        assert_eq!(
            reserved.ids("t/u", 11, last).map(|ids| ids.len()),
            Some(PER_SCOPE)
        );
        for scope in 0..SCOPES {
            reserved.record(&format!("t/{scope}"), 1, ["x"]);
        }
        assert_eq!(reserved.ids("t/u", last, last), None, "a full map starts over");
    }
}
