//! The scope statistics that score text candidates (how many records of a tier the
//! scope holds, and how many of them hold each query term), kept for a while after a
//! search counted them.
//!
//! Counting them is a `global` aggregation over every record of the scope in the tier,
//! by far the largest part of a text search's node time at thousands of records; the
//! figures change only when the scope is written. So the counts a search brought back
//! are kept per scope, tier and searched fields, and a later search whose terms are all
//! known leaves the aggregation out. They are dropped:
//! - when this process writes to the scope (a commit, an ingest, an erasure), and
//!   counts made until the index has refreshed after that write ([`REFRESH_LAG`]) are
//!   used once and not kept, since they may not see it yet;
//! - after [`KEPT_FOR`], so the writes of other processes reach the scores that late at
//!   most. Which records are found never depends on this cache: every search filters
//!   the index as it is; only the BM25 weights of the candidates may be that old.

use cairn_core::bm25::ScopeStatistics;
use cairn_core::{Scope, Tier};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long counts are used, at most, after a search made them.
pub const KEPT_FOR: Duration = Duration::from_secs(10);
/// The index refresh interval (the templates' `refresh_interval`) and a margin: counts
/// made sooner than this after this process wrote to the scope are not kept.
pub const REFRESH_LAG: Duration = Duration::from_millis(1_500);
/// Scopes kept at most; past it the cache starts over.
const SCOPES: usize = 10_000;
/// Terms kept per scope, tier and fields at most; past it new terms are not kept.
const TERMS: usize = 4_096;

/// Which counts: a tier of a scope, searched in the record's text alone or with the
/// context of an episode's neighbours too.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Counted {
    pub tier: Tier,
    pub with_context: bool,
}

#[derive(Default)]
struct ScopeEntry {
    /// Bumped by every write of this process to the scope.
    generation: u64,
    written_at: Option<Instant>,
    counts: HashMap<Counted, Counts>,
}

struct Counts {
    made_at: Instant,
    documents: u64,
    containing: HashMap<String, u64>,
}

/// Where a search stands: the scope's generation when the search was sent, so counts
/// that come back after a write of the scope are not kept.
#[derive(Clone, Copy, Debug)]
pub struct Ticket {
    generation: u64,
}

#[derive(Default)]
pub struct StatisticsCache {
    scopes: Mutex<HashMap<(String, String), ScopeEntry>>,
}

fn key(scope: &Scope) -> (String, String) {
    (
        scope.tenant().as_str().to_owned(),
        scope.user().as_str().to_owned(),
    )
}

impl StatisticsCache {
    /// The counts of `stems` when every one is known and fresh, with the ticket to
    /// keep what a search counts otherwise.
    pub fn lookup(
        &self,
        scope: &Scope,
        counted: Counted,
        stems: &[&str],
    ) -> (Option<ScopeStatistics>, Ticket) {
        self.lookup_at(scope, counted, stems, Instant::now())
    }

    fn lookup_at(
        &self,
        scope: &Scope,
        counted: Counted,
        stems: &[&str],
        now: Instant,
    ) -> (Option<ScopeStatistics>, Ticket) {
        let Ok(scopes) = self.scopes.lock() else {
            return (None, Ticket { generation: u64::MAX });
        };
        let Some(entry) = scopes.get(&key(scope)) else {
            return (None, Ticket { generation: 0 });
        };
        let ticket = Ticket {
            generation: entry.generation,
        };
        let known = entry
            .counts
            .get(&counted)
            .filter(|counts| now.saturating_duration_since(counts.made_at) < KEPT_FOR)
            .and_then(|counts| {
                let containing = stems
                    .iter()
                    .map(|stem| counts.containing.get(*stem).copied())
                    .collect::<Option<Vec<u64>>>()?;
                Some(ScopeStatistics {
                    documents: counts.documents,
                    containing,
                })
            });
        (known, ticket)
    }

    /// Keeps the counts a search made (answered at `now`), unless the scope was
    /// written since `ticket` or too recently for the index to show it.
    pub fn keep(
        &self,
        scope: &Scope,
        counted: Counted,
        stems: &[&str],
        statistics: &ScopeStatistics,
        ticket: Ticket,
        now: Instant,
    ) {
        let Ok(mut scopes) = self.scopes.lock() else {
            return;
        };
        if scopes.len() >= SCOPES && !scopes.contains_key(&key(scope)) {
            scopes.clear();
        }
        let entry = scopes.entry(key(scope)).or_default();
        let settled = entry
            .written_at
            .is_none_or(|written| now.saturating_duration_since(written) >= REFRESH_LAG);
        if entry.generation != ticket.generation || !settled {
            return;
        }
        let fresh = || Counts {
            made_at: now,
            documents: statistics.documents,
            containing: HashMap::new(),
        };
        let counts = entry.counts.entry(counted).or_insert_with(fresh);
        // Counts too old to use start over, so none outlives `KEPT_FOR`.
        if now.saturating_duration_since(counts.made_at) >= KEPT_FOR {
            *counts = fresh();
        }
        counts.documents = statistics.documents;
        for (stem, count) in stems.iter().zip(&statistics.containing) {
            if counts.containing.len() < TERMS || counts.containing.contains_key(*stem) {
                counts.containing.insert((*stem).to_owned(), *count);
            }
        }
    }

    /// This process wrote to the scope: its counts are dropped.
    pub fn written(&self, scope: &Scope) {
        self.written_at(scope, Instant::now());
    }

    fn written_at(&self, scope: &Scope, now: Instant) {
        let Ok(mut scopes) = self.scopes.lock() else {
            return;
        };
        if scopes.len() >= SCOPES && !scopes.contains_key(&key(scope)) {
            scopes.clear();
        }
        let entry = scopes.entry(key(scope)).or_default();
        entry.generation += 1;
        entry.written_at = Some(now);
        entry.counts.clear();
    }

    /// Writes whose scope is not known (a recovery pass): every count is
    /// dropped, and counts made before the index shows them are not kept.
    pub fn written_anywhere(&self) {
        let Ok(mut scopes) = self.scopes.lock() else {
            return;
        };
        let now = Instant::now();
        for entry in scopes.values_mut() {
            entry.generation += 1;
            entry.written_at = Some(now);
            entry.counts.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(user: &str) -> Scope {
        cairn_store_tests::scope("acme", user)
    }

    const FACTS: Counted = Counted {
        tier: Tier::Semantic,
        with_context: false,
    };

    /// The counts a search would use, if any.
    fn known(
        cache: &StatisticsCache,
        scope: &Scope,
        counted: Counted,
        stems: &[&str],
        at: Instant,
    ) -> Option<ScopeStatistics> {
        cache.lookup_at(scope, counted, stems, at).0
    }

    fn counts(documents: u64, containing: &[u64]) -> ScopeStatistics {
        ScopeStatistics {
            documents,
            containing: containing.to_vec(),
        }
    }

    #[test]
    fn counts_are_used_until_they_are_old_and_only_for_known_terms() {
        let cache = StatisticsCache::default();
        let alice = scope("alice");
        let start = Instant::now();
        let (first, ticket) = cache.lookup_at(&alice, FACTS, &["tea", "green"], start);
        assert_eq!(first, None);
        cache.keep(
            &alice,
            FACTS,
            &["tea", "green"],
            &counts(100, &[7, 3]),
            ticket,
            start,
        );
        let later = start + Duration::from_secs(1);
        assert_eq!(
            known(&cache, &alice, FACTS, &["green"], later),
            Some(counts(100, &[3]))
        );
        assert!(
            known(&cache, &alice, FACTS, &["green", "coffee"], later).is_none(),
            "a term never counted"
        );
        let episodes = Counted {
            tier: Tier::Episodic,
            with_context: true,
        };
        assert!(
            known(&cache, &alice, episodes, &["tea"], later).is_none(),
            "another tier"
        );
        assert!(
            known(&cache, &scope("bob"), FACTS, &["tea"], later).is_none(),
            "another scope"
        );
        assert!(
            known(&cache, &alice, FACTS, &["tea"], start + KEPT_FOR).is_none(),
            "too old"
        );
    }

    #[test]
    fn a_write_drops_the_scope_counts_and_counts_made_meanwhile_are_not_kept() {
        let cache = StatisticsCache::default();
        let alice = scope("alice");
        let start = Instant::now();
        let (_, ticket) = cache.lookup_at(&alice, FACTS, &["tea"], start);
        cache.keep(&alice, FACTS, &["tea"], &counts(100, &[7]), ticket, start);
        let (_, bob_ticket) = cache.lookup_at(&scope("bob"), FACTS, &["tea"], start);
        cache.keep(
            &scope("bob"),
            FACTS,
            &["tea"],
            &counts(5, &[1]),
            bob_ticket,
            start,
        );

        // A search sent before a write answers after it: its counts are used once only.
        let (_, sent) = cache.lookup_at(&alice, FACTS, &["milk"], start);
        cache.written_at(&alice, start);
        assert!(
            known(&cache, &alice, FACTS, &["tea"], start).is_none(),
            "dropped by the write"
        );
        assert_eq!(
            known(&cache, &scope("bob"), FACTS, &["tea"], start),
            Some(counts(5, &[1])),
            "another scope keeps its counts"
        );
        cache.keep(&alice, FACTS, &["milk"], &counts(101, &[2]), sent, start);
        assert_eq!(known(&cache, &alice, FACTS, &["milk"], start), None);

        // Counted before the index may show the write: not kept either.
        let soon = start + REFRESH_LAG / 2;
        let (_, ticket) = cache.lookup_at(&alice, FACTS, &["milk"], soon);
        cache.keep(&alice, FACTS, &["milk"], &counts(101, &[2]), ticket, soon);
        assert_eq!(known(&cache, &alice, FACTS, &["milk"], soon), None);

        let settled = start + REFRESH_LAG;
        let (_, ticket) = cache.lookup_at(&alice, FACTS, &["milk"], settled);
        cache.keep(&alice, FACTS, &["milk"], &counts(101, &[2]), ticket, settled);
        assert_eq!(
            known(&cache, &alice, FACTS, &["milk"], settled),
            Some(counts(101, &[2]))
        );

        cache.written_anywhere();
        assert_eq!(known(&cache, &alice, FACTS, &["milk"], settled), None);
        assert_eq!(known(&cache, &scope("bob"), FACTS, &["tea"], settled), None);
    }
}
