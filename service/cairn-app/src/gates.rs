//! The write gates, in the order a candidate fact passes them: grounding, tombstones,
//! dedup, judge, review, apply. A consolidation run sends each extracted candidate
//! through all of them (`consolidation`); an explicit write goes through tombstones,
//! dedup, review and apply (`facts`); an approved review through apply (`review`). Each
//! gate is a named function here, so every path decides the same way and builds the
//! same changes.

use crate::facts::Contradiction;
use cairn_core::text::{fingerprint, tokens};
use cairn_core::{
    Change, Edge, EdgeKind, Episode, Fact, ShownFact, SimilarityScale, Tombstone, TombstoneReason, Verdict,
    new_id,
};
use cairn_offline::language;
use chrono::{DateTime, Utc};
use std::collections::HashSet;

/// The stemmed words the user said, and those only the assistant said, in a batch,
/// with the roots of the user's ([`language::root`]: a model may say "transferring"
/// where the user said "transfer").
pub(crate) struct Vocabulary {
    user: HashSet<String>,
    user_roots: HashSet<String>,
    assistant: HashSet<String>,
}

impl Vocabulary {
    pub(crate) fn new<'a>(
        user_texts: impl IntoIterator<Item = &'a str>,
        assistant_texts: impl IntoIterator<Item = &'a str>,
    ) -> Self {
        let stems = |texts: &mut dyn Iterator<Item = &'a str>| -> HashSet<String> {
            texts
                .flat_map(tokens)
                .map(|token| language::stem(&token))
                .collect()
        };
        let user = stems(&mut user_texts.into_iter());
        Vocabulary {
            user_roots: user.iter().map(|stem| language::root(stem)).collect(),
            user,
            assistant: stems(&mut assistant_texts.into_iter()),
        }
    }
}

/// Gate 1, grounding: names, numbers, versions and rare words of a candidate must come
/// from the user's own episodes. One that only the assistant said is the classic
/// invented memory; one nobody said (a model's embellishment, or an assistant turn no
/// longer at hand when old episodes are re-read) is dropped as well. So is a candidate
/// of common words none of which the user said ("The user loves science fiction" from
/// "Since you love science fiction, try The Expanse" answering "Can you recommend a
/// book?"). `Err` holds why.
pub(crate) fn grounding(text: &str, words: &Vocabulary) -> Result<(), String> {
    let ungrounded: Vec<String> = language::distinctive_tokens(text)
        .into_iter()
        .filter(|token| {
            !words.user.contains(&language::stem(token)) && !words.user_roots.contains(&language::root(token))
        })
        .collect();
    if ungrounded.is_empty() {
        let content = language::content_tokens(text);
        if content.is_empty() || content.iter().any(|token| words.user.contains(token)) {
            return Ok(());
        }
        let mut unsaid: Vec<&str> = content.iter().map(String::as_str).collect();
        unsaid.sort_unstable();
        let from_assistant = content.iter().any(|token| words.assistant.contains(token));
        return Err(format!(
            "\"{text}\" holds no word the user said ({}){}",
            unsaid.join(", "),
            if from_assistant {
                "; the assistant said some"
            } else {
                ""
            }
        ));
    }
    let from_assistant = ungrounded
        .iter()
        .any(|token| words.assistant.contains(&language::stem(token)));
    Err(format!(
        "\"{text}\" carries {} that {}",
        ungrounded.join(", "),
        if from_assistant {
            "only the assistant said"
        } else {
            "the user never said"
        }
    ))
}

/// A retracted or forgotten value the tombstone gate compares candidates with.
pub(crate) struct Retracted {
    pub tombstone: Tombstone,
    /// The retracted fact, kept so a candidate can be compared by meaning (a forgotten
    /// fact is erased: only its fingerprint remains).
    pub fact: Option<Fact>,
}

/// Gate 2, tombstones: the unlifted tombstone a candidate matches, by its fingerprint
/// or, for a retracted fact, by meaning (cosine at least `similarity` on the reference
/// scale `scale` carries the model's cosines onto, and the same slot or subject).
/// Tombstones in `lifted` were lifted earlier in the same run.
pub(crate) fn matching_tombstone<'a>(
    retracted: &'a [Retracted],
    lifted: &HashSet<String>,
    text: &str,
    vector: Option<&[f32]>,
    similarity: f32,
    scale: SimilarityScale,
) -> Option<&'a Retracted> {
    let value = fingerprint(text);
    retracted.iter().find(|candidate| {
        candidate.tombstone.lifted_at.is_none()
            && !lifted.contains(&candidate.tombstone.id)
            && (candidate.tombstone.fingerprint == value
                || candidate.fact.as_ref().is_some_and(|fact| {
                    let close = match (vector, &fact.embedding) {
                        (Some(new), Some(old)) => scale.statements(new, old) >= similarity,
                        _ => false,
                    };
                    close
                        && (language::slot(&fact.text) == language::slot(text)
                            || language::shares_subject(&fact.text, text))
                }))
    })
}

/// Whether `episode` restates a tombstoned `value` first-hand: a user episode ingested
/// after the tombstone that holds the value's content words. Only such an episode
/// lifts a tombstone.
pub(crate) fn restates(tombstone: &Tombstone, episode: &Episode, value: &str) -> bool {
    episode.ingested_at > tombstone.created_at && language::states_value(&episode.text, value)
}

/// Whether `episode` restates the value `matched` retired, for a `candidate` that
/// matched it ([`matching_tombstone`]). By fingerprint the candidate is that value, so
/// the episode must state the candidate. By meaning the candidate may hold another
/// value (a new name where a retracted one stood): the episode must state the retracted
/// fact itself, so that saying something else never lifts the tombstone of a value the
/// user took back.
pub(crate) fn restates_retracted(matched: &Retracted, episode: &Episode, candidate: &str) -> bool {
    if matched.tombstone.fingerprint == fingerprint(candidate) {
        return restates(&matched.tombstone, episode, candidate);
    }
    matched
        .fact
        .as_ref()
        .is_some_and(|fact| restates(&matched.tombstone, episode, &fact.text))
}

/// The change that lifts a tombstone.
pub(crate) fn lift(tombstone_id: &str, at: DateTime<Utc>) -> Change {
    Change::LiftTombstone {
        tombstone_id: tombstone_id.to_owned(),
        at,
    }
}

/// Gate 3, dedup without a model: the first fact whose text is near-identical to
/// `text` (word Jaccard at least `threshold`).
pub(crate) fn near_duplicate<'a>(
    facts: impl IntoIterator<Item = &'a Fact>,
    text: &str,
    threshold: f64,
) -> Option<&'a Fact> {
    facts
        .into_iter()
        .find(|fact| language::jaccard(&fact.text, text) >= threshold)
}

/// What the judge decided, with the fact it named resolved among those it was shown.
#[derive(Clone, Debug)]
pub(crate) enum Outcome {
    New,
    Duplicate(Fact),
    Extends(Fact),
    Updates(Fact),
}

impl Outcome {
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Outcome::New => "NEW",
            Outcome::Duplicate(_) => "DUPLICATE",
            Outcome::Extends(_) => "EXTENDS",
            Outcome::Updates(_) => "UPDATES",
        }
    }
}

/// Gate 4, the judge's verdict resolved once: a target must be one of the facts shown
/// (by alias); a verdict naming anything else keeps the candidate as new.
pub(crate) fn resolve(verdict: Verdict, reason: String, shown: &[ShownFact]) -> (Outcome, String) {
    let named = |alias: &str| {
        shown
            .iter()
            .find(|shown| shown.alias == alias)
            .map(|shown| shown.fact.clone())
    };
    let (alias, outcome): (String, fn(Fact) -> Outcome) = match verdict {
        Verdict::New => return (Outcome::New, reason),
        Verdict::Duplicate(alias) => (alias, Outcome::Duplicate),
        Verdict::Extends(alias) => (alias, Outcome::Extends),
        Verdict::Updates(alias) => (alias, Outcome::Updates),
    };
    match named(&alias) {
        Some(fact) => (outcome(fact), reason),
        None => (
            Outcome::New,
            format!("the judge named {alias}, which it was not shown; kept as new"),
        ),
    }
}

/// Gate 6, apply: the changes that retire `old` for `new` at `at`. A natural change
/// supersedes it (kept as history, its validity ending when the new value's begins) and
/// links the two; a harsh one retracts and tombstones it (it was never true). The store
/// re-checks inside the commit that `old` is in the scope and still active.
pub(crate) fn supersede(
    old: &Fact,
    new: &Fact,
    at: DateTime<Utc>,
    contradiction: Contradiction,
) -> Vec<Change> {
    match contradiction {
        Contradiction::Natural => vec![
            Change::SupersedeFact {
                fact_id: old.id.clone(),
                superseded_by: new.id.clone(),
                at,
                valid_to: Some(new.valid_from.unwrap_or(at)),
            },
            Change::InsertEdge(Edge {
                from_fact_id: new.id.clone(),
                to_fact_id: old.id.clone(),
                kind: EdgeKind::Updates,
                created_at: at,
            }),
        ],
        Contradiction::Harsh => retraction(old, Some("contradicted by a newer statement"), at),
    }
}

/// The changes that retract a fact and tombstone its value.
pub(crate) fn retraction(fact: &Fact, reason: Option<&str>, at: DateTime<Utc>) -> Vec<Change> {
    vec![retract(fact, reason, at), tombstone(fact, at)]
}

/// The change that retracts a fact (its value is not tombstoned by it).
pub(crate) fn retract(fact: &Fact, reason: Option<&str>, at: DateTime<Utc>) -> Change {
    Change::RetractFact {
        fact_id: fact.id.clone(),
        reason: reason.map(str::to_owned),
        at,
    }
}

/// The change that tombstones a retracted fact's value.
pub(crate) fn tombstone(fact: &Fact, at: DateTime<Utc>) -> Change {
    Change::InsertTombstone(Tombstone {
        id: new_id("tomb"),
        fingerprint: fingerprint(&fact.text),
        fact_id: fact.id.clone(),
        reason: TombstoneReason::Retracted,
        created_at: at,
        lifted_at: None,
    })
}

/// The link of a fact that adds detail to another (both stay current).
pub(crate) fn extension(new: &Fact, old: &Fact) -> Change {
    Change::InsertEdge(Edge {
        from_fact_id: new.id.clone(),
        to_fact_id: old.id.clone(),
        kind: EdgeKind::Extends,
        created_at: new.created_at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_core::{FactStatus, MemoryStore};
    use cairn_store_tests::{audit, fact, scope};

    #[test]
    fn grounding_drops_what_only_the_assistant_said() {
        let words = Vocabulary::new(
            ["I moved to Lisbon in 2024"],
            ["Welcome to Lisbon, see you at Nimbus"],
        );
        assert!(grounding("The user moved to Lisbon in 2024", &words).is_ok());
        let invented = grounding("The user works at Nimbus", &words).expect_err("assistant's word");
        assert!(
            invented.contains("Nimbus") && invented.contains("only the assistant said"),
            "{invented}"
        );
        let nobody = grounding("The user moved to Porto", &words).expect_err("nobody said it");
        assert!(nobody.contains("the user never said"), "{nobody}");
        // Another form of a verb the user said is theirs.
        let words = Vocabulary::new(["The transfer went through, I start at the Berlin office"], []);
        assert!(grounding("The user is transferring to the Berlin office", &words).is_ok());
        assert!(grounding("The user is relocating to the Berlin office", &words).is_err());
    }

    #[test]
    fn grounding_drops_common_words_only_the_assistant_said() {
        let words = Vocabulary::new(
            ["Can you recommend a book for my holiday?", "ok I'll look for it"],
            ["Since you love science fiction, try The Expanse."],
        );
        let invented =
            grounding("The user loves science fiction", &words).expect_err("the assistant's claim");
        assert!(
            invented.contains("fiction") && invented.contains("the assistant said some"),
            "{invented}"
        );
        let nobody = grounding("The user enjoys gardening", &words).expect_err("nobody said it");
        assert!(nobody.contains("no word the user said"), "{nobody}");
        // One word of the user's own is enough: a model may phrase the rest itself.
        assert!(grounding("The user wants a book for the holiday", &words).is_ok());
        assert!(
            grounding(
                "The user is planning a holiday with science fiction books",
                &words
            )
            .is_ok()
        );
    }

    #[test]
    fn the_judge_names_only_facts_it_was_shown() {
        let old = fact("The user lives in Porto", Utc::now());
        let shown = vec![ShownFact {
            alias: "m1".into(),
            fact: old.clone(),
            similarity: None,
        }];
        let (outcome, _) = resolve(Verdict::Updates("m1".into()), "moved".into(), &shown);
        assert!(matches!(outcome, Outcome::Updates(target) if target.id == old.id));
        let (outcome, reason) = resolve(Verdict::Updates("m7".into()), "moved".into(), &shown);
        assert!(matches!(outcome, Outcome::New));
        assert!(reason.contains("m7"), "{reason}");
        assert_eq!(resolve(Verdict::New, "new".into(), &shown).0.name(), "NEW");
    }

    #[test]
    fn a_candidate_matches_a_tombstone_by_value_not_once_lifted() {
        let retracted = fact("The user is allergic to peanuts", Utc::now());
        let tombstone = Tombstone {
            id: new_id("tomb"),
            fingerprint: fingerprint(&retracted.text),
            fact_id: retracted.id.clone(),
            reason: TombstoneReason::Retracted,
            created_at: Utc::now(),
            lifted_at: None,
        };
        let values = vec![Retracted {
            tombstone: tombstone.clone(),
            fact: Some(retracted.clone()),
        }];
        let none = HashSet::new();
        let text = "the user is ALLERGIC to peanuts!";
        assert!(matching_tombstone(&values, &none, text, None, 0.9, SimilarityScale::REFERENCE).is_some());
        assert!(
            matching_tombstone(
                &values,
                &none,
                "The user likes tea",
                None,
                0.9,
                SimilarityScale::REFERENCE
            )
            .is_none()
        );
        let lifted: HashSet<String> = [tombstone.id.clone()].into();
        assert!(matching_tombstone(&values, &lifted, text, None, 0.9, SimilarityScale::REFERENCE).is_none());
        let old = Episode {
            id: "e1".into(),
            session_id: None,
            text: "I am allergic to peanuts".into(),
            occurred_at: tombstone.created_at,
            ingested_at: tombstone.created_at - chrono::Duration::seconds(1),
            embedding: None,
        };
        assert!(
            !restates(&tombstone, &old, &retracted.text),
            "said before the tombstone"
        );
        let newer = Episode {
            ingested_at: tombstone.created_at + chrono::Duration::seconds(1),
            ..old
        };
        assert!(restates(&tombstone, &newer, &retracted.text));
    }

    /// A tombstone matched by meaning is lifted only by the retracted value said again,
    /// never by an episode that states the candidate's other value.
    #[test]
    fn only_the_retracted_value_said_again_lifts_a_tombstone_matched_by_meaning() {
        let at = Utc::now();
        let bob = fact("The user's name is Bob", at);
        let matched = Retracted {
            tombstone: Tombstone {
                id: new_id("tomb"),
                fingerprint: fingerprint(&bob.text),
                fact_id: bob.id.clone(),
                reason: TombstoneReason::Retracted,
                created_at: at,
                lifted_at: None,
            },
            fact: Some(bob.clone()),
        };
        let said = |text: &str| Episode {
            id: new_id("epi"),
            session_id: None,
            text: text.into(),
            occurred_at: at,
            ingested_at: at + chrono::Duration::seconds(1),
            embedding: None,
        };
        let robert = "The user's name is Robert";
        let new_name = said("My name is Robert");
        assert!(
            restates(&matched.tombstone, &new_name, robert),
            "the episode states the candidate"
        );
        assert!(
            !restates_retracted(&matched, &new_name, robert),
            "but not the retracted value: Bob's tombstone stays"
        );
        assert!(restates_retracted(
            &matched,
            &said("Actually my name is Bob"),
            robert
        ));
        let same = "the user's NAME is bob";
        assert!(
            restates_retracted(&matched, &said("My name is Bob"), same),
            "by fingerprint"
        );
        assert!(!restates_retracted(&matched, &said("My name is Robert"), same));
        let forgotten = Retracted {
            tombstone: matched.tombstone.clone(),
            fact: None,
        };
        assert!(!restates_retracted(
            &forgotten,
            &said("Actually my name is Bob"),
            robert
        ));
    }

    /// The apply gate's changes commit on the embedded store with the statuses they promise.
    #[tokio::test]
    async fn supersession_and_retraction_commit_as_promised() {
        let directory = tempfile::tempdir().expect("temp dir");
        let store = cairn_store_sqlite::SqliteStore::open(directory.path()).expect("store");
        let alice = scope("acme", "alice");
        let at = Utc::now();
        for contradiction in [Contradiction::Natural, Contradiction::Harsh] {
            let old = fact(&format!("The user drives a blue car {contradiction:?}"), at);
            let new = fact(&format!("The user drives a red car {contradiction:?}"), at);
            store
                .commit(
                    &alice,
                    cairn_core::ChangeSet::new(audit(&alice, "fact.create"))
                        .with(Change::InsertFact(old.clone())),
                )
                .await
                .expect("insert");
            let mut set = cairn_core::ChangeSet::new(audit(&alice, "fact.supersede"));
            set.changes = supersede(&old, &new, at, contradiction);
            set.changes.push(Change::InsertFact(new.clone()));
            store.commit(&alice, set).await.expect("supersede");
            let stored = store.get_fact(&alice, &old.id).await.expect("get").expect("kept");
            let expected = match contradiction {
                Contradiction::Natural => FactStatus::Superseded,
                Contradiction::Harsh => FactStatus::Retracted,
            };
            assert_eq!(stored.status, expected);
            let tombstoned = store
                .find_tombstone(&alice, &fingerprint(&old.text))
                .await
                .expect("find")
                .is_some();
            assert_eq!(tombstoned, contradiction == Contradiction::Harsh);
            // Retiring it again is refused inside the commit.
            let mut again = cairn_core::ChangeSet::new(audit(&alice, "fact.supersede"));
            again.changes = supersede(&old, &new, at, Contradiction::Natural);
            assert!(store.commit(&alice, again).await.is_err());
        }
    }
}
