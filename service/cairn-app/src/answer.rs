//! Answers from memory alone, with the memories that support them, or "not known".
//!
//! Offline, the answer is extractive: recall the current memories, and when the best
//! is close enough in meaning to the question (the cosine of the vector leg on the
//! reference scale of the thresholds by meaning, `cairn_core::SimilarityScale`, at
//! least `Settings::answer_min_similarity`, calibrated on LoCoMo by `evals/run --answer`),
//! answer with its best sentence and cite it and the other memories above the bar.
//! Below the bar, `known` is false and nothing is cited: the memories do not say.
//! A question that names someone ("What did Melanie paint?") is answered only from
//! memories that name them too: a memory about somebody else ("Caroline: I painted a
//! sunset") may be close in meaning but does not say, unless the name is the user's own
//! (a current fact "The user's name is Melanie").
//!
//! With an answerer (an LLM provider), the answer is written from the recalled memories
//! alone, shown under aliases: the citations are the aliases it names that were shown,
//! and an answer that cites nothing it was shown is not known.

use crate::recall::memory_text;
use crate::{Cairn, RecallHit, RecallRequest};
use cairn_core::{Answerer, Memory, Result, Scope, ShownMemory, SimilarityScale, Tier};
use cairn_offline::language;
use chrono::{DateTime, Utc};
use std::collections::{HashMap, HashSet};

/// At most this many memories are cited by an extractive answer.
const MAX_CITATIONS: usize = 3;
/// Memories recalled for an extractive answer, and shown to an answerer.
const EXTRACTIVE_RECALL: usize = 5;
const SHOWN_TO_ANSWERER: usize = 8;
/// Names of a question put to the lookup of the user's own name, at most: one recall
/// answers for all of them.
const NAMES_ASKED: usize = 8;
/// Facts looked at for the user's own name.
const NAME_LOOKUP: usize = 3;

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
    /// The best similarity (cosine, on the reference scale) to the question of a memory
    /// that names someone the question names, which decided `known`.
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

/// What a memory must reach to support an answer: `threshold`, a cosine to the question
/// on the reference scale, which `scale` carries the model's cosines onto.
#[derive(Clone, Copy)]
struct Bar {
    threshold: f64,
    scale: SimilarityScale,
}

impl Bar {
    /// A memory's cosine to the question on the reference scale (0 without a vector leg).
    fn similarity(&self, hit: &RecallHit) -> f64 {
        hit.explanation
            .as_ref()
            .and_then(|explanation| explanation.knn_similarity)
            .map_or(0.0, |cosine| f64::from(self.scale.queries.apply(cosine as f32)))
    }
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
        let bar = Bar {
            threshold: self.settings.answer_min_similarity,
            scale: self.similarity_scale(),
        };
        if let Some(answerer) = &self.answerer {
            return composed(answerer.as_ref(), &query, &result.hits, bar).await;
        }
        let asked = language::names(&query);
        let answer = extractive(&query, &result.hits, bar, &asked);
        if answer.known || asked.is_empty() {
            return Ok(answer);
        }
        // Refused for a name: if the name is the user's own, every memory is about them.
        // One lookup of the user's name slot, however many names the question holds.
        let users = self.users_names(scope, &asked, request.as_of).await?;
        let own: HashSet<String> = asked.intersection(&users).cloned().collect();
        if own.is_empty() {
            return Ok(answer);
        }
        let others: HashSet<String> = asked.difference(&own).cloned().collect();
        Ok(extractive(&query, &result.hits, bar, &others))
    }

    /// The names (lower-cased) that current facts of the scope in the user's name slot
    /// (the one consolidation keeps, `language::slot`) give, found by one recall that
    /// asks for the user's name among the `asked` ones (the first [`NAMES_ASKED`]).
    async fn users_names(
        &self,
        scope: &Scope,
        asked: &HashSet<String>,
        as_of: Option<DateTime<Utc>>,
    ) -> Result<HashSet<String>> {
        let mut candidates: Vec<&String> = asked.iter().collect();
        candidates.sort();
        candidates.truncate(NAMES_ASKED);
        let names: Vec<&str> = candidates.into_iter().map(String::as_str).collect();
        let mut recall = RecallRequest::new(format!("the user's name is {}", names.join(" or ")));
        recall.tiers = vec![Tier::Semantic];
        recall.k = Some(NAME_LOOKUP);
        recall.as_of = as_of;
        let result = self.recall(scope, recall).await?;
        Ok(result
            .hits
            .iter()
            .filter_map(|hit| match &hit.memory {
                Memory::Fact(fact)
                    if language::slot(&fact.text).is_some_and(|slot| slot.name() == "name") =>
                {
                    Some(language::names(&fact.text))
                }
                Memory::Fact(_) | Memory::Episode(_) | Memory::Playbook(_) => None,
            })
            .flatten()
            .collect())
    }
}

/// An answer written by `answerer` from `hits` alone, cited by the aliases it was shown.
async fn composed(answerer: &dyn Answerer, question: &str, hits: &[RecallHit], bar: Bar) -> Result<Answer> {
    let support = hits.iter().map(|hit| bar.similarity(hit)).fold(0.0, f64::max);
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

/// Whether `memory` names someone in `asked` (lower-cased names), at any position, other
/// than in addressing them ("Thanks, Caroline!" is said to Caroline, not about her).
fn names_one(memory: &Memory, asked: &HashSet<String>) -> bool {
    if asked.is_empty() {
        return true;
    }
    let text = memory_text(memory);
    let addressed = addressed(&text);
    text.split(|c: char| !c.is_alphanumeric())
        .map(str::to_lowercase)
        .any(|word| asked.contains(&word) && !addressed.contains(&word))
}

/// Words that open a greeting or a thanks before the name of whoever is addressed.
const GREETINGS: &[&str] = &[
    "hey",
    "hi",
    "hello",
    "thanks",
    "thank",
    "you",
    "yo",
    "oh",
    "wow",
    "yes",
    "yeah",
    "yep",
    "sure",
    "sorry",
    "congrats",
    "congratulations",
    "bye",
    "dear",
    "morning",
    "night",
];

/// The names `text` addresses someone by (lower-cased): a capitalised word followed by
/// a comma or an end of sentence, after a comma, a semicolon, the start of the text or a
/// greeting ("Hey Mel!", "..., Caroline.").
fn addressed(text: &str) -> HashSet<String> {
    let words: Vec<&str> = text.split_whitespace().collect();
    let mut names = HashSet::new();
    for (index, word) in words.iter().enumerate() {
        let Some(last) = word.chars().last() else {
            continue;
        };
        let name = word.trim_end_matches(|c: char| !c.is_alphanumeric());
        if !matches!(last, '!' | ',' | '.' | '?')
            || !name.chars().next().is_some_and(char::is_uppercase)
            || !name.chars().all(char::is_alphabetic)
        {
            continue;
        }
        let after_break = match index.checked_sub(1).map(|before| words[before]) {
            None => true,
            Some(before) => {
                before.ends_with([',', ';'])
                    || GREETINGS.contains(
                        &before
                            .trim_matches(|c: char| !c.is_alphanumeric())
                            .to_lowercase()
                            .as_str(),
                    )
            }
        };
        if after_break {
            names.insert(name.to_lowercase());
        }
    }
    names
}

/// The best supporting sentence of the recalled memories that name someone the
/// question names (`asked`), when the best of them is close enough in meaning to the
/// question.
fn extractive(query: &str, hits: &[RecallHit], bar: Bar, asked: &HashSet<String>) -> Answer {
    let hits: Vec<&RecallHit> = hits.iter().filter(|hit| names_one(&hit.memory, asked)).collect();
    // The best supported hit among the top ones (fusion may rank a lexical match first).
    let Some((support, chosen)) = hits
        .iter()
        .copied()
        .map(|hit| (bar.similarity(hit), hit))
        .reduce(|kept, next| if next.0 > kept.0 { next } else { kept })
    else {
        return Answer::unknown(0.0);
    };
    if support < bar.threshold {
        return Answer::unknown(support);
    }
    let mut citations = vec![chosen.memory.id().to_owned()];
    citations.extend(
        hits.iter()
            .filter(|hit| hit.memory.id() != chosen.memory.id() && bar.similarity(hit) >= bar.threshold)
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
    use super::{addressed, best_sentence};

    #[test]
    fn a_name_said_to_someone_is_not_said_of_them() {
        let names = |text: &str| {
            let mut names: Vec<String> = addressed(text).into_iter().collect();
            names.sort();
            names
        };
        assert_eq!(
            names("Melanie: Thanks, Caroline! The race was great."),
            ["caroline"]
        );
        assert_eq!(names("Hey Mel! I saw Anna. Yes, Tom, she did."), ["mel", "tom"]);
        assert!(names("Caroline: I went to a support group with Anna yesterday").is_empty());
        assert!(names("I met Anna, and then we went home").is_empty());
    }

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
