//! Answers from memory alone, with the memories that support them, or "not known".
//!
//! Offline, the answer is extractive: recall the current memories, and when the best
//! is close enough in meaning to the question (the cosine of the vector leg, at least
//! `Settings::answer_min_similarity`, calibrated on LoCoMo by `evals/run --answer`),
//! answer with its best sentence and cite it and the other memories above the bar.
//! Below the bar, `known` is false and nothing is cited: the memories do not say.
//!
//! With an answerer (an LLM provider), the answer is written from the recalled memories
//! alone, shown under aliases: the citations are the aliases it names that were shown,
//! and an answer that cites nothing it was shown is not known.

use crate::recall::memory_text;
use crate::{Cairn, RecallHit, RecallRequest};
use cairn_core::{Answerer, Memory, Result, Scope, ShownMemory, Tier};
use chrono::{DateTime, Utc};
use std::collections::HashMap;

/// At most this many memories are cited by an extractive answer.
const MAX_CITATIONS: usize = 3;
/// Memories recalled for an extractive answer, and shown to an answerer.
const EXTRACTIVE_RECALL: usize = 5;
const SHOWN_TO_ANSWERER: usize = 8;

#[derive(Clone, Debug)]
pub struct AnswerRequest {
    pub query: String,
    pub as_of: Option<DateTime<Utc>>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    /// The supporting sentence; empty when not known.
    pub answer: String,
    pub known: bool,
    /// Ids of the memories that support the answer, best first.
    pub citations: Vec<String>,
    /// The best memory's similarity to the question (cosine), which decided `known`.
    pub support: f64,
}

impl Answer {
    fn unknown(support: f64) -> Answer {
        Answer {
            answer: String::new(),
            known: false,
            citations: Vec::new(),
            support,
        }
    }
}

fn time_of(memory: &Memory) -> DateTime<Utc> {
    match memory {
        Memory::Fact(fact) => fact.created_at,
        Memory::Episode(episode) => episode.occurred_at,
        Memory::Playbook(playbook) => playbook.created_at,
    }
}

/// The best memory's cosine to the question (0 without a vector leg).
fn similarity(hit: &RecallHit) -> f64 {
    hit.explanation
        .as_ref()
        .and_then(|explanation| explanation.knn_similarity)
        .unwrap_or(0.0)
}

impl Cairn {
    /// Answers `request.query` from the scope's current memories (at `as_of`), citing
    /// the memories that support the answer, or says it is not known.
    pub async fn answer(&self, scope: &Scope, request: AnswerRequest) -> Result<Answer> {
        let query = crate::validate::text("query", &request.query, self.settings.max_text_chars)?;
        let mut recall = RecallRequest::new(query.clone());
        recall.tiers = vec![Tier::Semantic, Tier::Episodic];
        recall.k = Some(if self.answerer.is_some() {
            SHOWN_TO_ANSWERER
        } else {
            EXTRACTIVE_RECALL
        });
        recall.as_of = request.as_of;
        recall.explain = true;
        let result = self.recall(scope, recall).await?;
        if let Some(answerer) = &self.answerer {
            return composed(answerer.as_ref(), &query, &result.hits).await;
        }
        Ok(extractive(
            &query,
            &result.hits,
            self.settings.answer_min_similarity,
        ))
    }
}

/// An answer written by `answerer` from `hits` alone, cited by the aliases it was shown.
async fn composed(answerer: &dyn Answerer, question: &str, hits: &[RecallHit]) -> Result<Answer> {
    let support = hits.iter().map(similarity).fold(0.0, f64::max);
    if hits.is_empty() {
        return Ok(Answer::unknown(support));
    }
    let shown: Vec<ShownMemory> = hits
        .iter()
        .enumerate()
        .map(|(index, hit)| ShownMemory {
            alias: format!("m{}", index + 1),
            text: memory_text(&hit.memory),
            at: time_of(&hit.memory),
        })
        .collect();
    let ids: HashMap<&str, &str> = shown
        .iter()
        .zip(hits)
        .map(|(memory, hit)| (memory.alias.as_str(), hit.memory.id()))
        .collect();
    let composed = answerer.answer(question, &shown).await?;
    let mut citations: Vec<String> = Vec::new();
    for alias in &composed.citations {
        // Only what was shown can be cited; anything else is dropped.
        if let Some(id) = ids.get(alias.trim())
            && !citations.iter().any(|cited| cited == id)
        {
            citations.push((*id).to_owned());
        }
    }
    // An answer that cites nothing it was shown is not supported by the memories.
    if !composed.known || citations.is_empty() || composed.answer.is_empty() {
        return Ok(Answer::unknown(support));
    }
    Ok(Answer {
        answer: composed.answer,
        known: true,
        citations,
        support,
    })
}

/// The best supporting sentence of the recalled memories, when the best of them is close
/// enough in meaning to the question.
fn extractive(query: &str, hits: &[RecallHit], threshold: f64) -> Answer {
    // The best supported hit among the top ones (fusion may rank a lexical match first).
    let Some((support, chosen)) = hits
        .iter()
        .map(|hit| (similarity(hit), hit))
        .reduce(|kept, next| if next.0 > kept.0 { next } else { kept })
    else {
        return Answer::unknown(0.0);
    };
    if support < threshold {
        return Answer::unknown(support);
    }
    let mut citations = vec![chosen.memory.id().to_owned()];
    citations.extend(
        hits.iter()
            .filter(|hit| hit.memory.id() != chosen.memory.id() && similarity(hit) >= threshold)
            .map(|hit| hit.memory.id().to_owned())
            .take(MAX_CITATIONS - 1),
    );
    let answer = match &chosen.memory {
        Memory::Episode(episode) => best_sentence(&episode.text, query),
        other => memory_text(other),
    };
    Answer {
        answer,
        known: true,
        citations,
        support,
    }
}

/// The sentence of `text` sharing the most words with `query` (the first on a tie).
fn best_sentence(text: &str, query: &str) -> String {
    let words = |text: &str| -> std::collections::HashSet<String> {
        text.split(|c: char| !c.is_alphanumeric())
            .filter(|word| word.len() > 2)
            .map(str::to_lowercase)
            .collect()
    };
    let asked = words(query);
    text.split_inclusive(['.', '!', '?', '\n'])
        .map(str::trim)
        .filter(|sentence| !sentence.is_empty())
        .map(|sentence| (words(sentence).intersection(&asked).count(), sentence))
        .fold((0, None), |best: (usize, Option<&str>), (score, sentence)| {
            if best.1.is_none() || score > best.0 {
                (score, Some(sentence))
            } else {
                best
            }
        })
        .1
        .unwrap_or(text)
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::best_sentence;

    #[test]
    fn the_answer_is_the_sentence_that_meets_the_question() {
        assert_eq!(
            best_sentence(
                "I had a long week. We adopted a greyhound called Pepper!",
                "what is my dog called"
            ),
            "We adopted a greyhound called Pepper!"
        );
        assert_eq!(
            best_sentence("Just one sentence", "unrelated"),
            "Just one sentence"
        );
    }
}
