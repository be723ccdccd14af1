//! Gaps in a scope's episode log, each judged by the age of its own reservation.
//!
//! An ingest reserves its episodes' positions in the scope's state document before it
//! writes them, so consolidation can meet a position that is reserved but not written:
//! an ingest still under way, or one abandoned (its process died, its embedding or its
//! bulk failed). A run waits at such a gap while the reservation is young, and passes
//! it once the reservation is older than the patience: by then the ingest either wrote
//! its episodes or never will.
//!
//! The state keeps when each recent reservation was made, so the age is the gap's own,
//! not the scope's newest reservation's (a scope that keeps receiving messages would
//! otherwise hold its gaps young forever): `reservations.recent` holds
//! `[last position, reserved at, since]` entries in position order, reservations made
//! within a second of an entry's first one merged into it (its time moves to the
//! latest, which only makes a gap wait a moment longer), and entries older than the
//! patience fold into `old_through` / `old_at`: every position up to `old_through` was
//! reserved at or before `old_at`. A state written before this bookkeeping existed
//! keeps its positions under `old_through` with its `allocated_at` as their time.

use serde_json::{Value, json};

/// Reservations made within this long of an entry's first are merged into it.
const MERGE_MICROS: i64 = 1_000_000;

/// One entry: positions after the previous entry's `last` up to `last`, reserved at
/// or before `at`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Entry {
    last: u64,
    at: i64,
    since: i64,
}

/// The reservation times of a scope's positions, read from its state document.
#[derive(Debug, Default)]
pub(crate) struct Reservations {
    old_through: u64,
    old_at: Option<i64>,
    recent: Vec<Entry>,
    /// Positions after the last entry were reserved by a process that keeps no
    /// entries (an earlier release during a rolling upgrade), at `allocated_at`.
    allocated: u64,
    allocated_at: Option<i64>,
}

impl Reservations {
    pub(crate) fn of(state: &Value) -> Reservations {
        let allocated = state["allocated"].as_u64().unwrap_or(0);
        let allocated_at = state["allocated_at"].as_i64();
        let kept = &state["reservations"];
        if !kept.is_object() {
            // Kept before entries existed: every position reserved so far, at the last time.
            return Reservations {
                old_through: allocated,
                old_at: allocated_at,
                recent: Vec::new(),
                allocated,
                allocated_at,
            };
        }
        let recent = kept["recent"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|entry| {
                Some(Entry {
                    last: entry[0].as_u64()?,
                    at: entry[1].as_i64()?,
                    since: entry[2].as_i64()?,
                })
            })
            .collect();
        Reservations {
            old_through: kept["old_through"].as_u64().unwrap_or(0),
            old_at: kept["old_at"].as_i64(),
            recent,
            allocated,
            allocated_at,
        }
    }

    /// Notes positions reserved up to `last` at `now` in the state document (before its
    /// `allocated` moves to `last`), folding entries reserved before `cutoff` into the
    /// old ones.
    pub(crate) fn record(state: &mut Value, last: u64, now: i64, cutoff: i64) {
        let mut kept = Reservations::of(state);
        let mut recent = Vec::with_capacity(kept.recent.len() + 1);
        for entry in kept.recent.drain(..) {
            if entry.at <= cutoff {
                kept.old_through = kept.old_through.max(entry.last);
                kept.old_at = Some(kept.old_at.map_or(entry.at, |at| at.max(entry.at)));
            } else {
                recent.push(entry);
            }
        }
        match recent.last_mut() {
            Some(entry) if now - entry.since < MERGE_MICROS && entry.last < last => {
                entry.last = last;
                entry.at = now;
            }
            _ => recent.push(Entry {
                last,
                at: now,
                since: now,
            }),
        }
        let entries: Vec<Value> = recent
            .iter()
            .map(|entry| json!([entry.last, entry.at, entry.since]))
            .collect();
        state["reservations"] = json!({
            "old_through": kept.old_through, "old_at": kept.old_at, "recent": entries,
        });
    }

    /// Whether any position from `from` to `to` (inclusive) was reserved after `cutoff`.
    pub(crate) fn young(&self, from: u64, to: u64, cutoff: i64) -> bool {
        self.first_young(from, to, cutoff).is_some()
    }

    /// When the earliest young reservation among positions `from` to `to` was made.
    fn first_young(&self, from: u64, to: u64, cutoff: i64) -> Option<i64> {
        if from > to {
            return None;
        }
        let young = |at: Option<i64>| at.filter(|at| *at > cutoff);
        if from <= self.old_through
            && let Some(at) = young(self.old_at)
        {
            return Some(at);
        }
        let mut below = self.old_through;
        for entry in &self.recent {
            // The entry holds the positions after `below` up to its `last`.
            if entry.at > cutoff && entry.last >= from && below < to {
                return Some(entry.at);
            }
            below = below.max(entry.last);
        }
        if below < to && below < self.allocated {
            return young(self.allocated_at);
        }
        None
    }

    /// When the first gap after `position` stops holding reads back: the earliest young
    /// reservation of a later position, plus the patience. `None` when none is young.
    pub(crate) fn settles_at(&self, position: u64, cutoff: i64, patience: i64) -> Option<i64> {
        self.first_young(position + 1, self.allocated, cutoff)
            .map(|at| at + patience)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATIENCE: i64 = 30_000_000;

    fn state_after(reservations: &[(u64, i64)]) -> Value {
        let mut state = json!({ "allocated": 0 });
        for &(last, at) in reservations {
            Reservations::record(&mut state, last, at, at - PATIENCE);
            state["allocated"] = json!(last);
            state["allocated_at"] = json!(at);
        }
        state
    }

    #[test]
    fn a_gap_ages_with_its_own_reservation_not_the_newest() {
        let second = 1_000_000;
        // Position 1 abandoned at 0 s; later ingests keep arriving every 5 s up to 40 s.
        let reservations: Vec<(u64, i64)> = (0..9)
            .map(|index| (index + 1, index as i64 * 5 * second))
            .collect();
        let state = state_after(&reservations);
        let kept = Reservations::of(&state);
        let now = 40 * second;
        let cutoff = now - PATIENCE;
        assert!(!kept.young(1, 1, cutoff), "the abandoned position is 40 s old");
        assert!(kept.young(9, 9, cutoff), "the newest is young");
        assert!(kept.young(5, 9, cutoff));
        assert!(
            !kept.young(1, 2, cutoff),
            "positions 1 and 2 are older than the patience"
        );
        // Entries older than the patience fold into one.
        let recent = state["reservations"]["recent"].as_array().map_or(0, Vec::len);
        assert!(recent <= 7, "{state}");
    }

    #[test]
    fn reservations_within_a_second_merge_and_keep_their_time_bound() {
        let state = state_after(&[(1, 0), (2, 300_000), (3, 900_000), (4, 1_200_000)]);
        let recent = state["reservations"]["recent"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert_eq!(recent.len(), 2, "{state}");
        let kept = Reservations::of(&state);
        // Position 1 counts as reserved at 0.9 s (its merged entry's time), no earlier.
        assert!(kept.young(1, 1, 800_000));
        assert!(!kept.young(1, 1, 900_000));
        assert_eq!(kept.settles_at(0, 0, PATIENCE), Some(900_000 + PATIENCE));
        assert_eq!(kept.settles_at(3, 0, PATIENCE), Some(1_200_000 + PATIENCE));
        assert_eq!(kept.settles_at(4, 0, PATIENCE), None, "nothing after the last");
    }

    #[test]
    fn a_state_kept_before_entries_ages_by_its_last_reservation() {
        let state = json!({ "allocated": 5, "allocated_at": 10 });
        let kept = Reservations::of(&state);
        assert!(kept.young(2, 2, 9));
        assert!(!kept.young(2, 2, 10));
        // An earlier release reserving beyond the entries is judged by allocated_at.
        let mut state = state_after(&[(1, 0)]);
        state["allocated"] = json!(3);
        state["allocated_at"] = json!(50);
        let kept = Reservations::of(&state);
        assert!(kept.young(2, 3, 40));
        assert!(!kept.young(2, 3, 50));
    }
}
