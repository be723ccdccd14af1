//! In-memory copies of stored vectors, so a kNN query reads row ids from SQLite and
//! scores vectors already in memory instead of decoding every blob on every query.
//!
//! Rows enter the cache lazily, on the first query that needs them. SQLite may reuse
//! the rowid of a deleted row, so every change that deletes rows or replaces a vector
//! clears the cache of that table; the next query reloads what it needs.

use cairn_core::Tier;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A row id and its vector.
pub type RowVector = (i64, Arc<[f32]>);

#[derive(Default)]
pub struct VectorCache {
    tables: [Mutex<HashMap<i64, Arc<[f32]>>>; 3],
}

fn slot(tier: Tier) -> usize {
    match tier {
        Tier::Semantic => 0,
        Tier::Episodic => 1,
        Tier::Procedural => 2,
    }
}

impl VectorCache {
    /// The cached vectors of `seqs`, and the seqs that are not cached yet.
    pub fn lookup(&self, tier: Tier, seqs: &[i64]) -> (Vec<RowVector>, Vec<i64>) {
        let mut found = Vec::with_capacity(seqs.len());
        let mut missing = Vec::new();
        if let Ok(table) = self.tables[slot(tier)].lock() {
            for seq in seqs {
                match table.get(seq) {
                    Some(vector) => found.push((*seq, Arc::clone(vector))),
                    None => missing.push(*seq),
                }
            }
        } else {
            missing.extend_from_slice(seqs);
        }
        (found, missing)
    }

    pub fn remember(&self, tier: Tier, loaded: &[RowVector]) {
        if let Ok(mut table) = self.tables[slot(tier)].lock() {
            for (seq, vector) in loaded {
                table.insert(*seq, Arc::clone(vector));
            }
        }
    }

    /// Drops every cached vector of a tier (after deletions or replaced vectors).
    pub fn clear(&self, tier: Tier) {
        if let Ok(mut table) = self.tables[slot(tier)].lock() {
            table.clear();
        }
    }
}
