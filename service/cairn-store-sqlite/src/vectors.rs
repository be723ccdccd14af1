//! In-memory vector indexes for the kNN leg, one per scope and tier.
//!
//! On the first kNN query of a scope in a tier, one SQL statement reads the scope's rows:
//! their ids, the columns the currency conditions test, and their vectors, which are kept
//! int8-quantised in one contiguous block (a quarter of the f32 bytes to stream per
//! query). A query applies the same conditions as the SQL restrictions of the text leg
//! to every row, scores the admitted rows on the quantised vectors, and returns the best
//! candidates; the caller rescores them exactly from the f32 vectors of the rows it loads.
//!
//! Every commit that changes the rows of a scope in a tier hands its index the rows it
//! changed, re-read after the commit (new rows added, changed rows replaced, removed rows
//! marked dead), so a large scope that alternates writes and recalls is never rebuilt
//! per recall; an index that is mostly dead rows is dropped and rebuilt by the next
//! query. A generation counter per index keeps a query that read the rows before a
//! change from installing what it read after the change was committed.
//!
//! The indexes live within a memory budget: past it, the least recently used are
//! dropped. Erasing a scope drops its indexes and their entries.

use crate::rows::micros;
use cairn_core::{Scope, SearchFilter, Tier};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

/// What the currency conditions of one row test, as microseconds. Absent bounds are
/// `i64::MIN` or `i64::MAX`, so every test is a plain comparison.
#[derive(Clone, Debug)]
pub struct Currency {
    pub seq: i64,
    /// When the row became known: a fact's or playbook's creation, an episode's ingestion.
    pub known_from: i64,
    pub expires: i64,
    /// The end of validity (event time).
    pub valid_to: i64,
    /// The start of validity (event time); for episodes, when they were said.
    pub valid_from: i64,
    pub superseded_at: i64,
    /// Bit of the fact type (0 for episodes and playbooks).
    pub kind: u8,
    /// A fact pending review: found only when the filter includes pending facts.
    pub pending: bool,
    pub session: Option<Box<str>>,
}

impl Currency {
    fn admits(&self, conditions: &Conditions<'_>) -> bool {
        let at = conditions.as_of;
        let event = conditions.event;
        let held = if conditions.event_time {
            event < self.valid_to
        } else {
            conditions.include_history || at < self.valid_to
        };
        self.known_from <= at
            && (!self.pending || conditions.include_pending)
            && event < self.expires
            && self.valid_from <= event
            && held
            && (conditions.event_time || conditions.include_history || at < self.superseded_at)
            && (conditions.kinds == 0 || conditions.kinds & (1 << self.kind) != 0)
            && conditions
                .session
                .is_none_or(|session| self.session.as_deref() == Some(session))
    }
}

/// The restrictions of a [`SearchFilter`] in the form rows are tested against.
struct Conditions<'a> {
    as_of: i64,
    /// `valid_at`, else `as_of`.
    event: i64,
    event_time: bool,
    include_history: bool,
    include_pending: bool,
    kinds: u32,
    session: Option<&'a str>,
}

impl<'a> Conditions<'a> {
    fn of(filter: &'a SearchFilter) -> Self {
        Conditions {
            as_of: micros(filter.as_of),
            event: micros(filter.valid_at.unwrap_or(filter.as_of)),
            event_time: filter.valid_at.is_some(),
            include_history: filter.include_history,
            include_pending: filter.include_pending,
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

/// The rows of one scope in one tier that have a vector of the index's dimension, in
/// ascending row id order. Rows removed since the index was built stay in place as
/// dead rows (never admitted) until the index is rebuilt.
pub struct ScopeIndex {
    dimension: usize,
    rows: Vec<Currency>,
    codes: Vec<i8>,
    scales: Vec<f32>,
    dead: usize,
    /// Bytes of the rows' session ids (kept as rows change, so measuring is O(1)).
    session_bytes: usize,
}

fn session_len(row: &Currency) -> usize {
    row.session.as_ref().map_or(0, |session| session.len())
}

/// A removed row: known from the end of time, so no condition admits it.
const DEAD: i64 = i64::MAX;

impl ScopeIndex {
    pub fn new(dimension: usize) -> Self {
        ScopeIndex {
            dimension,
            rows: Vec::new(),
            codes: Vec::new(),
            scales: Vec::new(),
            dead: 0,
            session_bytes: 0,
        }
    }

    /// Adds a row, or replaces the row with the same id; a vector of another dimension
    /// is left out (and removes the row it would replace).
    pub fn push(&mut self, currency: Currency, vector: &[f32]) {
        if vector.len() != self.dimension {
            self.remove(currency.seq);
            return;
        }
        let quantised = Quantised::new(vector);
        self.session_bytes += session_len(&currency);
        let at = self.rows.partition_point(|row| row.seq < currency.seq);
        if self.rows.get(at).is_some_and(|row| row.seq == currency.seq) {
            if self.rows[at].known_from == DEAD {
                self.dead -= 1;
            }
            self.session_bytes -= session_len(&self.rows[at]);
            self.rows[at] = currency;
            self.codes[at * self.dimension..(at + 1) * self.dimension].copy_from_slice(&quantised.codes);
            self.scales[at] = quantised.scale;
        } else if at == self.rows.len() {
            self.rows.push(currency);
            self.codes.extend_from_slice(&quantised.codes);
            self.scales.push(quantised.scale);
        } else {
            self.rows.insert(at, currency);
            let offset = at * self.dimension;
            self.codes.splice(offset..offset, quantised.codes);
            self.scales.insert(at, quantised.scale);
        }
    }

    /// Takes a row out of every result (it stays allocated until the next rebuild).
    pub fn remove(&mut self, seq: i64) {
        let at = self.rows.partition_point(|row| row.seq < seq);
        if let Some(row) = self.rows.get_mut(at)
            && row.seq == seq
            && row.known_from != DEAD
        {
            self.session_bytes -= session_len(row);
            row.known_from = DEAD;
            row.session = None;
            self.dead += 1;
        }
    }

    pub fn dimension(&self) -> usize {
        self.dimension
    }

    /// Rows held, live or dead.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether removals have left more dead rows than live ones, so a rebuild pays.
    fn mostly_dead(&self) -> bool {
        self.dead > 64 && self.dead * 2 > self.rows.len()
    }

    /// Approximate heap bytes held.
    pub fn bytes(&self) -> usize {
        self.rows.capacity() * std::mem::size_of::<Currency>()
            + self.codes.capacity()
            + self.scales.capacity() * std::mem::size_of::<f32>()
            + self.session_bytes
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

/// How a commit changed the rows of one scope in one tier, for its index: rows (re)read
/// after the commit, and rows gone.
#[derive(Default)]
pub struct Delta {
    pub upserts: Vec<(Currency, Vec<f32>)>,
    pub removals: Vec<i64>,
}

type Key = (Tier, String, String);

/// A built index, shared by the queries reading it and the commits updating it.
pub type SharedIndex = Arc<RwLock<ScopeIndex>>;

#[derive(Default)]
struct Entry {
    /// Bumped whenever the rows change without the index taking the change in, so a
    /// build that read the rows before does not install what it read.
    generation: u64,
    /// Builds of this entry under way; an entry with one is not forgotten.
    building: usize,
    index: Option<SharedIndex>,
    /// What the index held when last measured.
    bytes: usize,
    last_used: u64,
}

#[derive(Default)]
struct Table {
    entries: HashMap<Key, Entry>,
    /// Sum of the entries' `bytes`.
    bytes: usize,
    clock: u64,
}

impl Table {
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Drops the least recently used indexes until the total fits `budget`.
    fn evict(&mut self, budget: usize) {
        while self.bytes > budget {
            let Some(oldest) = self
                .entries
                .iter()
                .filter(|(_, entry)| entry.index.is_some())
                .min_by_key(|(_, entry)| entry.last_used)
                .map(|(key, _)| key.clone())
            else {
                return;
            };
            self.forget(&oldest);
        }
    }

    /// Removes an entry's index; the entry itself goes too unless a build is under way.
    fn forget(&mut self, key: &Key) {
        if let Some(entry) = self.entries.get_mut(key) {
            self.bytes -= entry.bytes;
            entry.bytes = 0;
            entry.index = None;
            entry.generation += 1;
            if entry.building == 0 {
                self.entries.remove(key);
            }
        }
    }
}

/// The built indexes, by tier and scope, within a memory budget: past it, the least
/// recently used indexes are dropped (and rebuilt by their scope's next query).
pub struct VectorIndexes {
    table: Mutex<Table>,
    budget: usize,
}

impl Default for VectorIndexes {
    fn default() -> Self {
        VectorIndexes::with_budget(DEFAULT_BUDGET_BYTES)
    }
}

/// The default memory budget of the vector indexes.
pub const DEFAULT_BUDGET_BYTES: usize = 256 * 1024 * 1024;

fn key(tier: Tier, scope: &Scope) -> Key {
    (
        tier,
        scope.tenant().as_str().to_owned(),
        scope.user().as_str().to_owned(),
    )
}

impl VectorIndexes {
    pub fn with_budget(budget: usize) -> Self {
        VectorIndexes {
            table: Mutex::new(Table::default()),
            budget,
        }
    }

    /// The index of a scope in a tier, built by `build` when there is none. An index
    /// read while a change to the same rows was committed is used once, not kept.
    pub fn get_or_build<E>(
        &self,
        tier: Tier,
        scope: &Scope,
        build: impl FnOnce() -> Result<ScopeIndex, E>,
    ) -> Result<SharedIndex, E> {
        let key = key(tier, scope);
        let generation = match self.table.lock() {
            Ok(mut table) => {
                let now = table.tick();
                let entry = table.entries.entry(key.clone()).or_default();
                if let Some(index) = &entry.index {
                    entry.last_used = now;
                    return Ok(Arc::clone(index));
                }
                entry.building += 1;
                Some(entry.generation)
            }
            Err(_) => None,
        };
        let built = build();
        let Ok(mut table) = self.table.lock() else {
            return built.map(|index| Arc::new(RwLock::new(index)));
        };
        let now = table.tick();
        let keep = match table.entries.get_mut(&key) {
            Some(entry) => {
                entry.building = entry.building.saturating_sub(1);
                generation == Some(entry.generation) && entry.index.is_none()
            }
            None => false,
        };
        let outcome = built.map(|index| {
            let bytes = index.bytes();
            (Arc::new(RwLock::new(index)), bytes)
        });
        match (&outcome, table.entries.get_mut(&key)) {
            (Ok((shared, bytes)), Some(entry)) if keep => {
                entry.index = Some(Arc::clone(shared));
                entry.bytes = *bytes;
                entry.last_used = now;
                table.bytes += *bytes;
                table.evict(self.budget);
            }
            // Not kept: leave no entry behind for a scope nobody is building.
            (_, Some(entry)) if entry.index.is_none() && entry.building == 0 => {
                table.entries.remove(&key);
            }
            _ => {}
        }
        outcome.map(|(shared, _)| shared)
    }

    /// Whether a commit that changed a scope's rows in a tier must hand the index its
    /// changed rows (an index is held). When not, a build under way is told not to
    /// install what it read, in the same step.
    pub fn wants_delta(&self, tier: Tier, scope: &Scope) -> bool {
        let Ok(mut table) = self.table.lock() else {
            return false;
        };
        match table.entries.get_mut(&key(tier, scope)) {
            Some(entry) if entry.index.is_some() => true,
            Some(entry) => {
                entry.generation += 1;
                false
            }
            None => false,
        }
    }

    /// Takes a commit's changes to a scope's rows in a tier into its index, when one is
    /// built; a build under way is told not to install what it read.
    pub fn apply(&self, tier: Tier, scope: &Scope, delta: Delta) {
        let Ok(mut table) = self.table.lock() else {
            return;
        };
        let key = key(tier, scope);
        let Some(entry) = table.entries.get_mut(&key) else {
            return;
        };
        let Some(index) = entry.index.clone() else {
            entry.generation += 1;
            return;
        };
        let measured = match index.write() {
            Ok(mut index) => {
                for seq in delta.removals {
                    index.remove(seq);
                }
                for (currency, vector) in delta.upserts {
                    index.push(currency, &vector);
                }
                (!index.mostly_dead()).then(|| index.bytes())
            }
            Err(_) => None,
        };
        match measured {
            Some(bytes) => {
                let before = entry.bytes;
                entry.bytes = bytes;
                table.bytes = table.bytes - before + bytes;
                table.evict(self.budget);
            }
            // Mostly dead rows (or a poisoned lock): rebuilt by the next query.
            None => table.forget(&key),
        }
    }

    /// Drops the index of a scope in a tier (the scope was erased).
    pub fn invalidate(&self, tier: Tier, scope: &Scope) {
        if let Ok(mut table) = self.table.lock() {
            table.forget(&key(tier, scope));
        }
    }

    /// Drops every index (the stored vectors were all replaced).
    pub fn clear(&self) {
        if let Ok(mut table) = self.table.lock() {
            let keys: Vec<Key> = table.entries.keys().cloned().collect();
            for key in keys {
                table.forget(&key);
            }
        }
    }

    /// Indexes held and their approximate bytes.
    pub fn usage(&self) -> (usize, usize) {
        match self.table.lock() {
            Ok(table) => (
                table
                    .entries
                    .values()
                    .filter(|entry| entry.index.is_some())
                    .count(),
                table.bytes,
            ),
            Err(_) => (0, 0),
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
            expires: i64::MAX,
            valid_to: i64::MAX,
            valid_from: i64::MIN,
            superseded_at: i64::MAX,
            kind: 0,
            pending: false,
            session: None,
        }
    }

    fn filter() -> SearchFilter {
        SearchFilter {
            tier: Tier::Semantic,
            as_of: Utc.timestamp_opt(1_000, 0).single().expect("time"),
            include_history: false,
            include_pending: false,
            valid_at: None,
            fact_types: Vec::new(),
            session_id: None,
            limit: 10,
            with_vectors: true,
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
    fn rows_are_replaced_inserted_in_order_and_removed() {
        let mut index = ScopeIndex::new(2);
        index.push(row(5), &[1.0, 0.0]);
        index.push(row(9), &[0.0, 1.0]);
        index.push(row(7), &[0.6, 0.8]);
        let best = |index: &ScopeIndex, query: &[f32]| index.candidates(query, &filter(), 1)[0].1;
        assert_eq!(
            best(&index, &[0.6, 0.8]),
            7,
            "a row inserted between others is found"
        );
        index.push(row(5), &[0.0, -1.0]);
        assert_eq!(index.len(), 3, "a pushed row with a known id replaces it");
        assert_eq!(best(&index, &[0.0, -1.0]), 5);
        index.remove(9);
        index.remove(9);
        let found: Vec<i64> = index
            .candidates(&[0.0, 1.0], &filter(), 10)
            .into_iter()
            .map(|(_, seq)| seq)
            .collect();
        assert_eq!(found, vec![7, 5], "a removed row never scores");
        index.push(row(9), &[0.0, 1.0]);
        assert_eq!(best(&index, &[0.0, 1.0]), 9, "a removed row can come back");
        index.push(row(7), &[1.0, 0.0, 0.0]);
        assert_eq!(
            best(&index, &[0.6, 0.8]),
            9,
            "a vector of another dimension takes the row out"
        );
    }

    #[test]
    fn the_session_bytes_follow_replacements_and_removals() {
        let mut index = ScopeIndex::new(2);
        let with_session = |seq, session: &str| Currency {
            session: Some(session.into()),
            ..row(seq)
        };
        let counted = |index: &ScopeIndex| -> usize { index.rows.iter().map(session_len).sum() };
        index.push(with_session(1, "morning"), &[1.0, 0.0]);
        index.push(with_session(2, "evening"), &[0.0, 1.0]);
        index.push(with_session(1, "noon"), &[1.0, 0.0]);
        assert_eq!((index.session_bytes, counted(&index)), (11, 11));
        index.remove(2);
        index.remove(2);
        assert_eq!((index.session_bytes, counted(&index)), (4, 4));
        index.push(with_session(2, "night"), &[0.0, 1.0, 0.0]);
        assert_eq!((index.session_bytes, counted(&index)), (4, 4));
    }

    #[allow(clippy::disallowed_methods)]
    fn scope(user: &str) -> Scope {
        let tenant = cairn_core::TenantId::parse("acme").expect("tenant");
        cairn_core::Principal::from_verified_credential(
            "test".into(),
            tenant,
            None,
            vec![cairn_core::Permission::Read],
        )
        .scope_for(user, cairn_core::Permission::Read)
        .expect("scope")
    }

    fn built(rows: usize) -> Result<ScopeIndex, String> {
        let mut index = ScopeIndex::new(8);
        for seq in 0..rows {
            index.push(row(seq as i64), &[0.5; 8]);
        }
        Ok(index)
    }

    #[test]
    fn indexes_stay_within_their_budget_least_recently_used_first() {
        let one = built(100).expect("index").bytes();
        let indexes = VectorIndexes::with_budget(one * 3);
        for user in ["a", "b", "c"] {
            indexes
                .get_or_build(Tier::Semantic, &scope(user), || built(100))
                .expect("build");
        }
        assert_eq!(indexes.usage(), (3, one * 3));
        // "a" is used again, so "b" is the least recently used when "d" arrives.
        indexes
            .get_or_build(Tier::Semantic, &scope("a"), || Err("rebuilt".to_owned()))
            .expect("kept");
        indexes
            .get_or_build(Tier::Semantic, &scope("d"), || built(100))
            .expect("build");
        assert_eq!(indexes.usage(), (3, one * 3));
        let rebuilt = indexes.get_or_build(Tier::Semantic, &scope("b"), || Err("rebuilt".to_owned()));
        assert_eq!(rebuilt.err().as_deref(), Some("rebuilt"), "b was evicted");
        indexes
            .get_or_build(Tier::Semantic, &scope("a"), || Err("rebuilt".to_owned()))
            .expect("a was kept");

        // An index larger than the whole budget is used once, not kept.
        let small = VectorIndexes::with_budget(one / 2);
        small
            .get_or_build(Tier::Semantic, &scope("a"), || built(100))
            .expect("build");
        assert_eq!(small.usage(), (0, 0));
    }

    #[test]
    fn deltas_update_an_index_in_place_and_erasure_leaves_nothing() {
        let indexes = VectorIndexes::with_budget(usize::MAX);
        let alice = scope("alice");
        indexes
            .get_or_build(Tier::Semantic, &alice, || built(10))
            .expect("build");
        indexes.apply(
            Tier::Semantic,
            &alice,
            Delta {
                upserts: vec![(row(10), vec![1.0; 8])],
                removals: vec![3],
            },
        );
        let shared = indexes
            .get_or_build(Tier::Semantic, &alice, || Err("rebuilt".to_owned()))
            .expect("updated in place, not dropped");
        {
            let index = shared.read().expect("read");
            let found: Vec<i64> = index
                .candidates(&[0.5; 8], &filter(), 20)
                .into_iter()
                .map(|(_, seq)| seq)
                .collect();
            assert_eq!(found.len(), 10);
            assert!(found.contains(&10) && !found.contains(&3), "{found:?}");
        }
        // Removing most rows drops the index for a rebuild instead of scanning the dead.
        let many = VectorIndexes::with_budget(usize::MAX);
        many.get_or_build(Tier::Semantic, &alice, || built(200))
            .expect("build");
        many.apply(
            Tier::Semantic,
            &alice,
            Delta {
                upserts: Vec::new(),
                removals: (0..150).collect(),
            },
        );
        assert_eq!(many.usage(), (0, 0));

        // A scope's entry goes with its erasure; one never queried gets none.
        indexes.invalidate(Tier::Semantic, &alice);
        indexes.apply(Tier::Semantic, &scope("never-queried"), Delta::default());
        assert_eq!(indexes.usage(), (0, 0));
        assert!(indexes.table.lock().expect("table").entries.is_empty());
    }

    #[test]
    fn only_a_held_index_wants_deltas_and_a_build_under_way_is_stopped() {
        let indexes = VectorIndexes::with_budget(usize::MAX);
        let alice = scope("alice");
        assert!(!indexes.wants_delta(Tier::Semantic, &alice));
        indexes
            .get_or_build(Tier::Semantic, &alice, || {
                assert!(!indexes.wants_delta(Tier::Semantic, &alice), "nothing held yet");
                built(5)
            })
            .expect("build");
        assert_eq!(
            indexes.usage(),
            (0, 0),
            "the change during the build stops its install"
        );
        indexes
            .get_or_build(Tier::Semantic, &alice, || built(5))
            .expect("build");
        assert!(indexes.wants_delta(Tier::Semantic, &alice));
    }

    #[test]
    fn a_build_that_read_before_a_change_is_used_once() {
        let indexes = VectorIndexes::with_budget(usize::MAX);
        let alice = scope("alice");
        indexes
            .get_or_build(Tier::Semantic, &alice, || {
                // A commit lands while the rows are being read.
                indexes.apply(Tier::Semantic, &alice, Delta::default());
                built(5)
            })
            .expect("build");
        assert_eq!(indexes.usage(), (0, 0), "not installed");
        assert!(indexes.table.lock().expect("table").entries.is_empty());
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
        index.push(
            Currency {
                expires: at,
                ..row(2)
            },
            &vector,
        );
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
        index.push(
            Currency {
                pending: true,
                ..row(8)
            },
            &vector,
        );
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
            include_pending: false,
            ..filter()
        };
        assert_eq!(seqs(&history), vec![4, 5, 6]);
        assert_eq!(
            seqs(&filter()),
            vec![5, 6],
            "a pending fact is not found by default"
        );
        let pending = SearchFilter {
            include_pending: true,
            ..filter()
        };
        assert_eq!(seqs(&pending), vec![5, 6, 8]);
        // At an earlier event time: what held then, superseded since or not; what
        // expired later had not expired then.
        let then = SearchFilter {
            valid_at: Some(filter().as_of - chrono::Duration::microseconds(1)),
            ..filter()
        };
        assert_eq!(seqs(&then), vec![2, 4, 5, 6]);
        let mut ended = ScopeIndex::new(4);
        ended.push(
            Currency {
                valid_to: at - 10,
                ..row(8)
            },
            &vector,
        );
        ended.push(
            Currency {
                valid_from: at - 10,
                ..row(9)
            },
            &vector,
        );
        let ended_seqs = |filter: &SearchFilter| -> Vec<i64> {
            ended
                .candidates(&vector, filter, 10)
                .into_iter()
                .map(|(_, seq)| seq)
                .collect()
        };
        assert_eq!(ended_seqs(&filter()), vec![9]);
        let before = SearchFilter {
            valid_at: Some(filter().as_of - chrono::Duration::microseconds(20)),
            ..filter()
        };
        assert_eq!(ended_seqs(&before), vec![8]);
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
