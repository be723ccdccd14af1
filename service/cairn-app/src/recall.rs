//! Recall: retrieval legs per tier, reciprocal rank fusion, and explanations.

use crate::{Cairn, Fusion, now, validate};
use cairn_core::{
    Error, FactStatus, FactType, Memory, Result, Scope, SearchFilter, TextHit, TextQuery, Tier, VectorQuery,
};
use chrono::{DateTime, Utc};
use std::collections::HashMap;

#[derive(Clone, Copy)]
enum Leg {
    Bm25,
    Knn,
}

/// Maps a leg's raw scores to [0, 1]: BM25 divided by the leg's best score, cosine
/// similarity min-max scaled over the leg.
struct LegScale {
    low: f64,
    high: f64,
}

impl LegScale {
    fn of(leg: Leg, hits: &[cairn_core::TextHit]) -> Self {
        let high = hits.iter().map(|hit| hit.score).fold(f64::MIN, f64::max);
        let low = match leg {
            Leg::Bm25 => 0.0,
            Leg::Knn => hits.iter().map(|hit| hit.score).fold(f64::MAX, f64::min),
        };
        LegScale { low, high }
    }

    fn apply(&self, score: f64) -> f64 {
        let span = self.high - self.low;
        if span > f64::EPSILON {
            ((score - self.low) / span).clamp(0.0, 1.0)
        } else {
            1.0
        }
    }
}

impl Cairn {
    /// Reorders the best fused hits by the reranker's scores. A failing or malformed
    /// reranker leaves the fused order as it was: reranking may improve recall, never
    /// break it.
    async fn rerank(&self, query: &str, hits: &mut [RecallHit]) {
        let Some(reranker) = &self.reranker else { return };
        let count = self.settings.rerank_candidates.min(hits.len());
        if count < 2 {
            return;
        }
        let documents: Vec<String> = hits[..count].iter().map(|hit| memory_text(&hit.memory)).collect();
        match reranker.rerank(query, documents).await {
            Ok(scores) if scores.len() == count && scores.iter().all(|score| score.is_finite()) => {
                for (hit, score) in hits[..count].iter_mut().zip(scores) {
                    if let Some(explanation) = hit.explanation.as_mut() {
                        explanation.rerank_score = Some(score);
                    }
                }
                hits[..count].sort_by(|left, right| {
                    let score = |hit: &RecallHit| {
                        hit.explanation
                            .as_ref()
                            .and_then(|e| e.rerank_score)
                            .unwrap_or(0.0)
                    };
                    score(right).total_cmp(&score(left))
                });
            }
            Ok(scores) => {
                tracing::warn!(
                    reranker = reranker.name(),
                    expected = count,
                    got = scores.len(),
                    "reranker answered unusable scores; keeping the fused order"
                );
            }
            Err(error) => {
                tracing::warn!(reranker = reranker.name(), error = %error, "reranker failed; keeping the fused order");
            }
        }
    }
}

/// Multipliers applied to fused scores: newer, more used and more confident records
/// rank higher. Every weight is 0 by default (no multiplier), because the evaluation
/// data cannot show any of them helping (its turns share one ingest time, are never
/// used and have full confidence); deployments can turn them on.
#[derive(Clone, Debug, PartialEq)]
pub struct Priors {
    /// Boost of a brand-new record, halving every `recency_half_life_days`.
    pub recency_weight: f64,
    pub recency_half_life_days: f64,
    /// Boost per doubling of a record's use count, capped at 1 in total.
    pub usage_weight: f64,
    /// Penalty for missing confidence: the multiplier falls by `confidence_weight * (1 - confidence)`.
    pub confidence_weight: f64,
}

impl Default for Priors {
    fn default() -> Self {
        Priors {
            recency_weight: 0.0,
            recency_half_life_days: 30.0,
            usage_weight: 0.0,
            confidence_weight: 0.0,
        }
    }
}

impl Priors {
    pub fn multiplier(&self, memory: &Memory, as_of: DateTime<Utc>) -> f64 {
        let (born, use_count, confidence) = match memory {
            Memory::Fact(fact) => (fact.created_at, fact.use_count, f64::from(fact.confidence)),
            Memory::Episode(episode) => (episode.occurred_at, 0, 1.0),
            Memory::Playbook(playbook) => (playbook.updated_at, playbook.use_count, 1.0),
        };
        let age_days = ((as_of - born).num_seconds().max(0) as f64) / 86_400.0;
        let half_life = self.recency_half_life_days.max(f64::EPSILON);
        let recency = self.recency_weight * 0.5f64.powf(age_days / half_life);
        let usage = self.usage_weight * ((use_count as f64 + 1.0).log2() / 10.0).min(1.0);
        let confidence = -self.confidence_weight * (1.0 - confidence.clamp(0.0, 1.0));
        (1.0 + recency + usage + confidence).max(0.0)
    }
}

/// One (possibly empty) hit list per tier: a leg that did not run has none.
fn legs_or_empty(legs: Vec<Vec<TextHit>>, tiers: usize) -> Vec<Vec<TextHit>> {
    if legs.is_empty() {
        vec![Vec::new(); tiers]
    } else {
        legs
    }
}

/// The values in first-seen order, each once.
fn distinct<T: PartialEq + Copy>(values: &[T]) -> Vec<T> {
    let mut unique = Vec::new();
    for value in values {
        if !unique.contains(value) {
            unique.push(*value);
        }
    }
    unique
}

/// The reciprocal rank fusion contribution of a 1-based `rank` in a leg of `weight`.
pub fn rrf(weight: f64, k: f64, rank: usize) -> f64 {
    weight / (k + rank as f64)
}

#[derive(Clone, Debug)]
pub struct RecallRequest {
    pub query: String,
    pub tiers: Vec<Tier>,
    pub k: Option<usize>,
    /// Belief time: what Cairn held current at this time (default now).
    pub as_of: Option<DateTime<Utc>>,
    /// Event time: what held in the world at this time, by the facts' validity (from
    /// the episodes they came from, or the dates they state), superseded since or not.
    pub valid_at: Option<DateTime<Utc>>,
    pub include_history: bool,
    /// Also facts held for review (their hits' status says `pending`).
    pub include_pending: bool,
    pub explain: bool,
    pub fact_types: Vec<FactType>,
    pub session_id: Option<String>,
    /// Only memories that mention this entity (its id or one of its names).
    pub entity: Option<String>,
}

impl RecallRequest {
    pub fn new(query: impl Into<String>) -> Self {
        RecallRequest {
            query: query.into(),
            tiers: Vec::new(),
            k: None,
            as_of: None,
            valid_at: None,
            include_history: false,
            include_pending: false,
            explain: false,
            fact_types: Vec::new(),
            session_id: None,
            entity: None,
        }
    }
}

/// Why a hit ranked where it did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Explanation {
    /// 1-based rank in the BM25 leg of its tier, and its BM25 score.
    pub bm25_rank: Option<usize>,
    pub bm25_score: Option<f64>,
    /// 1-based rank in the vector leg of its tier, and its cosine similarity.
    pub knn_rank: Option<usize>,
    pub knn_similarity: Option<f64>,
    pub fused_score: f64,
    /// The multiplier the recency, usage and confidence priors applied (1 when off).
    pub prior: f64,
    /// The multiplier for naming what the query names (1 when it names none of it, or
    /// the boost is off; see [`crate::Settings::name_boost`]).
    pub name_boost: f64,
    /// The multiplier for an event time in the time the query asks about (1 when the
    /// query names no time, the hit's time is elsewhere, or the boost is off; see
    /// [`crate::Settings::time_boost`]).
    pub time_boost: f64,
    /// The reranker's score, when a reranker rescored this hit.
    pub rerank_score: Option<f64>,
    /// A newer current fact that holds the same single-valued slot with another value
    /// (see [`Cairn::demote_conflicts`]): this one may be outdated, and ranks after
    /// every hit not so marked.
    pub possibly_outdated_by: Option<String>,
}

#[derive(Clone, Debug)]
pub struct RecallHit {
    pub memory: Memory,
    /// The status of the record at `as_of`.
    pub status: FactStatus,
    pub score: f64,
    pub explanation: Option<Explanation>,
}

#[derive(Clone, Debug)]
pub struct RecallResult {
    pub hits: Vec<RecallHit>,
    pub as_of: DateTime<Utc>,
}

impl Cairn {
    /// Returns the best `k` memories for `query` among what is current at `as_of`.
    pub async fn recall(&self, scope: &Scope, request: RecallRequest) -> Result<RecallResult> {
        let query = validate::text("query", &request.query, self.settings.max_text_chars)?;
        let k = request.k.unwrap_or(10);
        if k == 0 || k > self.settings.max_k {
            return Err(Error::invalid(
                "k",
                format!("must be between 1 and {}", self.settings.max_k),
            ));
        }
        let session_id = validate::label("session_id", request.session_id.as_deref())?;
        let as_of = request.as_of.unwrap_or_else(now);
        // An unknown entity is a 404, not an empty answer that looks like "nothing known".
        let entity = match request.entity.as_deref() {
            Some(wanted) => Some(self.entity(scope, wanted).await?),
            None => None,
        };
        // Each tier runs two legs once, however often a request names it.
        let tiers = if request.tiers.is_empty() {
            Tier::ALL.to_vec()
        } else {
            distinct(&request.tiers)
        };
        let fact_types = distinct(&request.fact_types);

        // Two legs per tier, BM25 and kNN; the store applies scope and currency inside
        // each query. Every leg of every tier runs concurrently, and the BM25 legs do not
        // wait for the query embedding, which is computed once for every vector leg.
        let weights = (self.settings.bm25_weight, self.settings.knn_weight);
        let filters: Vec<SearchFilter> = tiers
            .iter()
            .map(|tier| SearchFilter {
                tier: *tier,
                as_of,
                include_history: request.include_history,
                include_pending: request.include_pending,
                valid_at: request.valid_at,
                fact_types: fact_types.clone(),
                session_id: session_id.clone(),
                limit: self.settings.candidates_per_leg,
                with_vectors: false,
            })
            .collect();
        // A leg with no weight cannot change the ranking, so it is not run. The text legs
        // are searched while the query is embedded (on a cluster, the text legs of every
        // tier in one `_msearch`, then the vector legs in another).
        let text_queries: Vec<TextQuery> = if weights.0 > 0.0 {
            filters
                .iter()
                .map(|filter| TextQuery {
                    context_weight: self.settings.episode_context_weight,
                    ..TextQuery::new(filter.clone(), query.clone())
                })
                .collect()
        } else {
            Vec::new()
        };
        let embedding = async {
            match &self.embedder {
                Some(embedder) if weights.1 > 0.0 => {
                    Ok(embedder.embed_queries(vec![query.clone()]).await?.pop())
                }
                Some(_) | None => Ok(None),
            }
        };
        let vector_queries = |vector: Option<Vec<f32>>| -> Vec<VectorQuery> {
            let Some(vector) = vector else {
                return Vec::new();
            };
            filters
                .iter()
                .map(|filter| VectorQuery {
                    // Facts found by meaning bring their vectors, for the slot check.
                    filter: SearchFilter {
                        with_vectors: self.slots.is_some() && filter.tier == Tier::Semantic,
                        limit: self.settings.knn_candidates.unwrap_or(filter.limit),
                        ..filter.clone()
                    },
                    vector: vector.clone(),
                })
                .collect()
        };
        let vector_legs = async {
            let vectors = vector_queries(embedding.await?);
            self.store.search_vectors(scope, &vectors).await
        };
        let (text_legs, vector_legs) =
            futures_util::future::try_join(self.store.search_texts(scope, &text_queries), vector_legs)
                .await?;
        let text_legs = legs_or_empty(text_legs, filters.len());
        let vector_legs = legs_or_empty(vector_legs, filters.len());
        let mut fused: HashMap<String, (Memory, Explanation)> = HashMap::new();
        for (text_leg, vector_leg) in text_legs.into_iter().zip(vector_legs) {
            for (leg, weight, hits) in [
                (Leg::Bm25, weights.0, text_leg),
                (Leg::Knn, weights.1, vector_leg),
            ] {
                let scale = LegScale::of(leg, &hits);
                for (index, hit) in hits.into_iter().enumerate() {
                    let rank = index + 1;
                    let contribution = match self.settings.fusion {
                        Fusion::ReciprocalRank => rrf(weight, self.settings.rrf_k, rank),
                        Fusion::ScaledScores => weight * scale.apply(hit.score),
                    };
                    let entry = fused
                        .entry(hit.memory.id().to_owned())
                        .or_insert_with(|| (hit.memory.clone(), Explanation::default()));
                    if let (Memory::Fact(kept), Memory::Fact(found)) = (&mut entry.0, &hit.memory)
                        && kept.embedding.is_none()
                    {
                        kept.embedding.clone_from(&found.embedding);
                    }
                    match leg {
                        Leg::Bm25 => {
                            entry.1.bm25_rank = Some(rank);
                            entry.1.bm25_score = Some(hit.score);
                        }
                        Leg::Knn => {
                            entry.1.knn_rank = Some(rank);
                            entry.1.knn_similarity = Some(hit.score);
                        }
                    }
                    entry.1.fused_score += contribution;
                }
            }
        }

        let mut fused: Vec<(Memory, Explanation)> = fused.into_values().collect();
        if let Some(entity) = &entity {
            fused.retain(|(memory, _)| crate::entities::mentions_any(&memory_text(memory), &entity.aliases));
        }
        // Use counts weigh in the priors only when their weight is set, and only then
        // are they read: no answer shows a hit's count (REST, MCP, profiles and
        // answers say what a memory holds, not how often it was used), and on a store
        // that counts apart from its records, as a cluster does, the read is one more
        // request after the searches.
        if self.settings.priors.usage_weight != 0.0 {
            let mut memories: Vec<&mut Memory> = fused.iter_mut().map(|(memory, _)| memory).collect();
            self.store.apply_usage(scope, &mut memories).await?;
        }
        // Without a boost or a name in the query, no hit's text is read for names.
        let names = if self.settings.name_boost == 0.0 {
            Vec::new()
        } else {
            query_names(&query)
        };
        let asked = if self.settings.time_boost == 0.0 {
            None
        } else {
            cairn_offline::when::asked(&query, as_of)
        };
        let mut hits: Vec<RecallHit> = fused
            .into_iter()
            .map(|(memory, mut explanation)| {
                explanation.prior = self.settings.priors.multiplier(&memory, as_of);
                explanation.name_boost = if names.is_empty() {
                    1.0
                } else {
                    name_multiplier(self.settings.name_boost, &names, &memory_text(&memory))
                };
                explanation.time_boost = match (&asked, event_time(&memory)) {
                    (Some(asked), Some(at)) if asked.holds(at) => 1.0 + self.settings.time_boost,
                    _ => 1.0,
                };
                RecallHit {
                    status: match &memory {
                        Memory::Fact(fact) => fact.status_at(as_of).unwrap_or(FactStatus::Active),
                        Memory::Episode(_) | Memory::Playbook(_) => FactStatus::Active,
                    },
                    score: explanation.fused_score
                        * explanation.prior
                        * explanation.name_boost
                        * explanation.time_boost,
                    explanation: Some(explanation),
                    memory,
                }
            })
            .collect();
        hits.sort_by(|left, right| {
            right
                .score
                .total_cmp(&left.score)
                .then_with(|| {
                    let left_bm25 = left
                        .explanation
                        .as_ref()
                        .and_then(|e| e.bm25_score)
                        .unwrap_or(0.0);
                    let right_bm25 = right
                        .explanation
                        .as_ref()
                        .and_then(|e| e.bm25_score)
                        .unwrap_or(0.0);
                    right_bm25.total_cmp(&left_bm25)
                })
                .then_with(|| left.memory.id().cmp(right.memory.id()))
        });
        self.rerank(&query, &mut hits).await;
        self.demote_conflicts(&mut hits).await;
        hits.truncate(k);
        for hit in &mut hits {
            if let Memory::Fact(fact) = &mut hit.memory {
                fact.embedding = None;
            }
        }
        if !request.explain {
            for hit in &mut hits {
                hit.explanation = None;
            }
        }
        if self.settings.bump_usage_on_recall {
            let used: Vec<String> = hits
                .iter()
                .filter(|hit| matches!(hit.memory, Memory::Fact(_) | Memory::Playbook(_)))
                .map(|hit| hit.memory.id().to_owned())
                .collect();
            self.usage.note(scope, &used, now());
        }
        Ok(RecallResult { hits, as_of })
    }
}

/// How many of the best hits are checked for two current facts holding one slot.
const CONFLICT_WINDOW: usize = 20;

impl Cairn {
    /// When two current facts among the best hits hold the same single-valued slot of
    /// the user (by meaning: home, employer, diet, ...; see `cairn_offline::SlotMeaning`)
    /// with different values, the one stated earlier may be outdated: consolidation
    /// replaces a fact only on a clear sign of change, and what it missed is ranked
    /// here, the newer first. The older is marked in its explanation and moves after
    /// every hit not so marked; it is still returned when there is room. Facts about
    /// someone else, events, and a newer statement that repeats the older's value are
    /// no conflict.
    async fn demote_conflicts(&self, hits: &mut Vec<RecallHit>) {
        let Some(slots) = &self.slots else {
            return;
        };
        let mut held: Vec<(usize, &'static str)> = Vec::new();
        for (index, hit) in hits.iter().enumerate().take(CONFLICT_WINDOW) {
            let Memory::Fact(fact) = &hit.memory else {
                continue;
            };
            let Some(vector) = fact.embedding.as_deref() else {
                continue;
            };
            if hit.status != FactStatus::Active || cairn_offline::language::mentions_someone(&fact.text) {
                continue;
            }
            match slots.slot_of_vector(vector).await {
                Ok(Some(slot)) => held.push((index, slot)),
                Ok(None) => {}
                Err(error) => {
                    tracing::warn!(error = %error, "slot check skipped");
                    return;
                }
            }
        }
        let fact_at = |index: usize| match &hits[index].memory {
            Memory::Fact(fact) => Some(fact),
            Memory::Episode(_) | Memory::Playbook(_) => None,
        };
        let mut outdated: HashMap<usize, String> = HashMap::new();
        for &(older, slot) in &held {
            let Some(old) = fact_at(older).filter(|fact| fact.fact_type != FactType::Event) else {
                continue;
            };
            let newer = held
                .iter()
                .filter(|(other, theirs)| *other != older && *theirs == slot)
                .filter_map(|(other, _)| fact_at(*other))
                .filter(|new| stated_at(new) > stated_at(old) && !stands_beside(old, new))
                .max_by_key(|new| stated_at(new));
            if let Some(newer) = newer {
                outdated.insert(older, newer.id.clone());
            }
        }
        if outdated.is_empty() {
            return;
        }
        let (mut kept, mut demoted) = (Vec::new(), Vec::new());
        for (index, mut hit) in hits.drain(..).enumerate() {
            match outdated.remove(&index) {
                Some(by) => {
                    hit.explanation
                        .get_or_insert_with(Explanation::default)
                        .possibly_outdated_by = Some(by);
                    demoted.push(hit);
                }
                None => kept.push(hit),
            }
        }
        kept.append(&mut demoted);
        *hits = kept;
    }
}

/// When a fact became true as stated: its event time, else when it was written.
fn stated_at(fact: &cairn_core::Fact) -> DateTime<Utc> {
    fact.valid_from.unwrap_or(fact.created_at)
}

/// Whether `new` can stand beside `old`: it still names every word of `old`'s value
/// (`language::repeats_value`), repeats one of its names ("my Berlin flat" beside
/// "between Madrid and Berlin"), or says it adds to it ("also", "as well").
fn stands_beside(old: &cairn_core::Fact, new: &cairn_core::Fact) -> bool {
    use cairn_offline::language;
    let names = language::names(&new.text);
    language::repeats_value(&new.text, &old.text)
        || language::names(&old.text).iter().any(|name| names.contains(name))
        || language::adds_to(&new.text)
}

/// The names a query asks about: its capitalised words after the first ("When did
/// Caroline go to Lisbon?" names Caroline and Lisbon), "I" aside, each once.
fn query_names(query: &str) -> Vec<String> {
    let mut names: Vec<String> = cairn_offline::language::names(query).into_iter().collect();
    names.sort();
    names
}

/// `1 + boost × (share of names that text names)`. A name counts where the text writes
/// it capitalised, so the month "May" or the name "Will" is not found in "you may" or
/// "I will".
fn name_multiplier(boost: f64, names: &[String], text: &str) -> f64 {
    if boost == 0.0 || names.is_empty() {
        return 1.0;
    }
    let written: std::collections::HashSet<String> = text
        .split(|c: char| !c.is_alphanumeric() && c != '\'')
        .map(|word| word.strip_suffix("'s").unwrap_or(word))
        .filter(|word| word.chars().next().is_some_and(char::is_uppercase))
        .map(str::to_lowercase)
        .collect();
    let named = names
        .iter()
        .filter(|name| written.contains(name.as_str()))
        .count();
    1.0 + boost * named as f64 / names.len() as f64
}

/// When what a memory tells of happened: an episode when it was said, a fact from when
/// it holds (else when it was recorded); a playbook has no such time.
fn event_time(memory: &Memory) -> Option<DateTime<Utc>> {
    match memory {
        Memory::Episode(episode) => Some(episode.occurred_at),
        Memory::Fact(fact) => Some(stated_at(fact)),
        Memory::Playbook(_) => None,
    }
}

/// The text a memory is searched and shown by.
pub(crate) fn memory_text(memory: &Memory) -> String {
    match memory {
        Memory::Fact(fact) => fact.text.clone(),
        Memory::Episode(episode) => episode.text.clone(),
        Memory::Playbook(playbook) => playbook.searchable_text(),
    }
}

#[cfg(test)]
mod tests {
    use super::rrf;

    #[test]
    fn reciprocal_rank_fusion_on_known_rankings() {
        // A document first in one leg and third in the other, against one second in both.
        let first_and_third = rrf(1.0, 60.0, 1) + rrf(1.0, 60.0, 3);
        assert!((first_and_third - (1.0 / 61.0 + 1.0 / 63.0)).abs() < 1e-12);
        let tenth_in_both = rrf(1.0, 60.0, 10) * 2.0;
        assert!(
            tenth_in_both > rrf(1.0, 60.0, 1),
            "agreement of two legs beats one leg's top rank"
        );
        assert_eq!(rrf(0.0, 60.0, 1), 0.0, "a zero weight switches a leg off");
        assert!((rrf(2.0, 10.0, 5) - 2.0 / 15.0).abs() < 1e-12);
    }
}

#[cfg(test)]
mod name_tests {
    use super::{name_multiplier, query_names};

    #[test]
    fn a_name_counts_where_it_is_written_capitalised() {
        let names = query_names("When did Caroline go to Lisbon in May?");
        assert_eq!(names, vec!["caroline", "lisbon", "may"]);
        let third = 1.0 / 3.0;
        let boost = |text: &str| name_multiplier(0.6, &names, text);
        assert!((boost("Caroline: I flew to Lisbon in May!") - 1.6).abs() < 1e-9);
        assert!((boost("Caroline's trip") - (1.0 + 0.6 * third)).abs() < 1e-9);
        assert_eq!(boost("you may go, caroline"), 1.0, "lower case is not the name");
        assert_eq!(boost("Melanie: no plans"), 1.0);
        assert_eq!(name_multiplier(0.0, &names, "Caroline"), 1.0, "0 turns it off");
        assert_eq!(query_names("what did she do?"), Vec::<String>::new());
        assert_eq!(name_multiplier(0.6, &[], "Caroline"), 1.0);
    }
}

#[cfg(test)]
mod prior_tests {
    use super::Priors;
    use cairn_core::{Episode, Memory};
    use chrono::{Duration, Utc};

    fn episode(days_old: i64) -> Memory {
        let at = Utc::now() - Duration::days(days_old);
        Memory::Episode(Episode {
            id: "epi".into(),
            session_id: None,
            text: "x".into(),
            occurred_at: at,
            ingested_at: at,
            embedding: None,
        })
    }

    #[test]
    fn priors_are_neutral_by_default_and_favour_recent_records_when_on() {
        let now = Utc::now();
        assert_eq!(Priors::default().multiplier(&episode(400), now), 1.0);
        let recency = Priors {
            recency_weight: 0.5,
            recency_half_life_days: 30.0,
            ..Priors::default()
        };
        let fresh = recency.multiplier(&episode(0), now);
        let month = recency.multiplier(&episode(30), now);
        let old = recency.multiplier(&episode(3000), now);
        assert!((fresh - 1.5).abs() < 1e-3, "{fresh}");
        assert!(
            (month - 1.25).abs() < 1e-3,
            "one half-life halves the boost: {month}"
        );
        assert!((1.0..1.001).contains(&old), "{old}");
    }
}
