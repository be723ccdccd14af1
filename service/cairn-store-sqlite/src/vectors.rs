//! In-memory vector indexes for the kNN leg, one per scope and tier.
//!
//! On the first kNN query of a scope in a tier, one SQL statement reads the scope's rows:
//! their ids, the columns the currency conditions test, and their vectors, which are kept
//! int8-quantised in one contiguous block (a quarter of the f32 bytes to stream per
//! query). A query applies the same conditions as the SQL restrictions of the text leg
//! to every row, scores the admitted rows on the quantised vectors, and returns the best
//! candidates; the caller rescores them exactly from the f32 vectors of the rows it loads.
//!
//! Every commit that changes the rows of a scope in a tier drops that index; the next
//! query rebuilds it. A generation counter per index keeps a query that read the rows
//! before a change from installing what it read after the change was committed.

use crate::rows::micros;
use cairn_core::{Scope, SearchFilter, Tier};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// What the currency conditions of one row test, as microseconds. Absent bounds are
/// `i64::MIN` or `i64::MAX`, so every test is a plain comparison.
#[derive(Clone, Debug)]
pub struct Currency {
    pub seq: i64,
    /// When the row became known: a fact's or playbook's creation, an episode's ingestion.
    pub known_from: i64,
    /// The earliest of expiry and the end of validity.
    pub until: i64,
    pub valid_from: i64,
    pub superseded_at: i64,
    /// Bit of the fact type (0 for episodes and playbooks).
    pub kind: u8,
    pub session: Option<Box<str>>,
}

impl Currency {
    fn admits(&self, conditions: &Conditions<'_>) -> bool {
        let at = conditions.as_of;
        self.known_from <= at
            && at < self.until
            && self.valid_from <= at
            && (conditions.include_history || at < self.superseded_at)
            && (conditions.kinds == 0 || conditions.kinds & (1 << self.kind) != 0)
            && conditions
                .session
                .is_none_or(|session| self.session.as_deref() == Some(session))
    }
}

/// The restrictions of a [`SearchFilter`] in the form rows are tested against.
struct Conditions<'a> {
    as_of: i64,
    include_history: bool,
    kinds: u32,
    session: Option<&'a str>,
}

impl<'a> Conditions<'a> {
    fn of(filter: &'a SearchFilter) -> Self {
        Conditions {
            as_of: micros(filter.as_of),
            include_history: filter.include_history,
            kinds: filter
                .fact_types
                .iter()
                .fold(0, |mask, fact_type| mask | (1 << (*fact_type as u8))),
            session: filter.session_id.as_deref(),
        }
    }
}

/// A vector quantised to int8 with one scale: `value ≈ code * scale`.
pub struct Quantised {
    codes: Vec<i8>,
    scale: f32,
}

impl Quantised {
    pub fn new(vector: &[f32]) -> Self {
        let largest = vector
            .iter()
            .fold(0f32, |largest, value| largest.max(value.abs()));
        let scale = if largest > 0.0 { largest / 127.0 } else { 1.0 };
        let codes = vector
            .iter()
            .map(|value| (value / scale).round().clamp(-127.0, 127.0) as i8)
            .collect();
        Quantised { codes, scale }
    }
}

fn dot(left: &[i8], right: &[i8]) -> i32 {
    left.iter()
        .zip(right)
        .map(|(a, b)| i32::from(*a) * i32::from(*b))
        .sum()
}

/// The rows of one scope in one tier that have a vector of the index's dimension.
pub struct ScopeIndex {
    dimension: usize,
    rows: Vec<Currency>,
    codes: Vec<i8>,
    scales: Vec<f32>,
}

impl ScopeIndex {
    pub fn new(dimension: usize) -> Self {
        ScopeIndex {
            dimension,
            rows: Vec::new(),
            codes: Vec::new(),
            scales: Vec::new(),
        }
    }

    /// Adds a row; a vector of another dimension is left out and never scores.
    pub fn push(&mut self, currency: Currency, vector: &[f32]) {
        if vector.len() != self.dimension {
            return;
        }
        let quantised = Quantised::new(vector);
        self.rows.push(currency);
        self.codes.extend_from_slice(&quantised.codes);
        self.scales.push(quantised.scale);
    }

    pub fn dimension(&self) -> usize {
        self.dimension
    }

    /// The `count` admitted rows with the highest approximate similarity to `query`, best
    /// first (ties by row id), as (approximate similarity, row id).
    pub fn candidates(&self, query: &[f32], filter: &SearchFilter, count: usize) -> Vec<(f32, i64)> {
        if query.len() != self.dimension || count == 0 {
            return Vec::new();
        }
        let conditions = Conditions::of(filter);
        let query = Quantised::new(query);
        let mut scored: Vec<(f32, i64)> = self
            .rows
            .iter()
            .zip(self.codes.chunks_exact(self.dimension))
            .zip(&self.scales)
            .filter(|((row, _), _)| row.admits(&conditions))
            .map(|((row, codes), scale)| (dot(&query.codes, codes) as f32 * query.scale * scale, row.seq))
            .collect();
        let keep = count.min(scored.len());
        if keep == 0 {
            return Vec::new();
        }
        let order = |a: &(f32, i64), b: &(f32, i64)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        scored.select_nth_unstable_by(keep - 1, order);
        scored.truncate(keep);
        scored.sort_by(order);
        scored
    }
}

type Key = (Tier, String, String);

#[derive(Default)]
struct Entry {
    generation: u64,
    index: Option<Arc<ScopeIndex>>,
}

/// The built indexes, by tier and scope.
#[derive(Default)]
pub struct VectorIndexes {
    entries: Mutex<HashMap<Key, Entry>>,
}

fn key(tier: Tier, scope: &Scope) -> Key {
    (
        tier,
        scope.tenant().as_str().to_owned(),
        scope.user().as_str().to_owned(),
    )
}

impl VectorIndexes {
    /// The index of a scope in a tier, built by `build` when there is none. An index
    /// read while a change to the same rows was committed is used once, not kept.
    pub fn get_or_build<E>(
        &self,
        tier: Tier,
        scope: &Scope,
        build: impl FnOnce() -> Result<ScopeIndex, E>,
    ) -> Result<Arc<ScopeIndex>, E> {
        let key = key(tier, scope);
        let generation = match self.entries.lock() {
            Ok(mut entries) => {
                let entry = entries.entry(key.clone()).or_default();
                if let Some(index) = &entry.index {
                    return Ok(Arc::clone(index));
                }
                Some(entry.generation)
            }
            Err(_) => None,
        };
        let index = Arc::new(build()?);
        if let (Some(generation), Ok(mut entries)) = (generation, self.entries.lock()) {
            let entry = entries.entry(key).or_default();
            if entry.generation == generation {
                entry.index = Some(Arc::clone(&index));
            }
        }
        Ok(index)
    }

    /// Drops the index of a scope in a tier, after a commit changed its rows.
    pub fn invalidate(&self, tier: Tier, scope: &Scope) {
        if let Ok(mut entries) = self.entries.lock() {
            let entry = entries.entry(key(tier, scope)).or_default();
            entry.generation += 1;
            entry.index = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeZone, Utc};

    fn row(seq: i64) -> Currency {
        Currency {
            seq,
            known_from: 0,
            until: i64::MAX,
            valid_from: i64::MIN,
            superseded_at: i64::MAX,
            kind: 0,
            session: None,
        }
    }

    fn filter() -> SearchFilter {
        SearchFilter {
            tier: Tier::Semantic,
            as_of: Utc.timestamp_opt(1_000, 0).single().expect("time"),
            include_history: false,
            fact_types: Vec::new(),
            session_id: None,
            limit: 10,
        }
    }

    #[test]
    fn quantised_scores_order_like_exact_cosine() {
        let vectors: Vec<Vec<f32>> = (0..40)
            .map(|i| {
                let raw: Vec<f32> = (0..32)
                    .map(|j| (((i * 31 + j * 17) % 23) as f32 - 11.0) / 7.0)
                    .collect();
                let norm = raw.iter().map(|v| v * v).sum::<f32>().sqrt();
                raw.iter().map(|v| v / norm).collect()
            })
            .collect();
        let mut index = ScopeIndex::new(32);
        for (seq, vector) in vectors.iter().enumerate() {
            index.push(row(seq as i64), vector);
        }
        let query = &vectors[7];
        let approximate = index.candidates(query, &filter(), 5);
        assert_eq!(approximate[0].1, 7);
        assert!((approximate[0].0 - 1.0).abs() < 0.02, "{approximate:?}");
        let mut exact: Vec<(f32, i64)> = vectors
            .iter()
            .enumerate()
            .map(|(seq, vector)| (cairn_core::cosine(query, vector), seq as i64))
            .collect();
        exact.sort_by(|a, b| b.0.total_cmp(&a.0));
        for ((approximate, _), (exact, _)) in approximate.iter().zip(&exact) {
            assert!(
                (approximate - exact).abs() < 0.03,
                "{approximate} against {exact}"
            );
        }
    }

    #[test]
    fn rows_outside_the_conditions_never_score() {
        let vector = [1.0f32, 0.0, 0.0, 0.0];
        let mut index = ScopeIndex::new(4);
        let at = micros(filter().as_of);
        index.push(
            Currency {
                known_from: at + 1,
                ..row(1)
            },
            &vector,
        );
        index.push(Currency { until: at, ..row(2) }, &vector);
        index.push(
            Currency {
                valid_from: at + 1,
                ..row(3)
            },
            &vector,
        );
        index.push(
            Currency {
                superseded_at: at,
                ..row(4)
            },
            &vector,
        );
        index.push(Currency { kind: 2, ..row(5) }, &vector);
        index.push(
            Currency {
                session: Some("s".into()),
                ..row(6)
            },
            &vector,
        );
        index.push(row(7), &[1.0, 0.0]);
        let seqs = |filter: &SearchFilter| -> Vec<i64> {
            index
                .candidates(&vector, filter, 10)
                .into_iter()
                .map(|(_, seq)| seq)
                .collect()
        };
        assert_eq!(seqs(&filter()), vec![5, 6]);
        let history = SearchFilter {
            include_history: true,
            ..filter()
        };
        assert_eq!(seqs(&history), vec![4, 5, 6]);
        let typed = SearchFilter {
            fact_types: vec![cairn_core::FactType::Constraint],
            ..filter()
        };
        assert_eq!(seqs(&typed), vec![5]);
        let session = SearchFilter {
            session_id: Some("s".into()),
            ..filter()
        };
        assert_eq!(seqs(&session), vec![6]);
    }
}
