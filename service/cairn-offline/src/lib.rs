//! The offline adapter of Cairn's consolidation ports: an extractor and a judge made of
//! English rules (about 4,200 lines with their word lists), the default when no LLM
//! provider is configured, so the default install consolidates end to end with no model
//! download and no network.
//!
//! - `offline` — [`OfflineExtractor`] and [`OfflineJudge`], implementing
//!   `cairn_core::Extractor` and `cairn_core::Judge`;
//! - `discourse` — sentences and clauses, pronouns and fragments resolved against the
//!   previous statement;
//! - `meaning` — single-valued slots matched by meaning with the embedding model,
//!   where the word lists do not name the slot;
//! - [`language`] — stems, slots, subjects, distinctive words and word overlap, which
//!   the write gates of `cairn-app` use as well (grounding, tombstone matching,
//!   restatements, near-duplicates);
//! - [`when`] — the time a question asks about ("in June", "last week").

mod discourse;
pub mod language;
mod meaning;
mod offline;
pub mod when;

pub use meaning::SlotMeaning;
pub use offline::{OfflineExtractor, OfflineJudge};
