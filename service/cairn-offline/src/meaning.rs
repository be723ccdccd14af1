//! Slots by meaning: attributes of a person's life that hold one value at a time, each
//! described by a few prototype statements and matched with the embedding model, where
//! the word lists of `language` do not name the slot ("ported my number to Lebara" and
//! "on a Vodafone contract" are both the user's mobile provider; "I commute by bike
//! now" and "I drive a Civic to work" are both how the user gets to work).
//!
//! A statement is in a slot when its cosine to the slot's closest prototype (on the
//! reference scale, `cairn_core::SimilarityScale`) is at least [`IN_SLOT`] and beats
//! every other slot's by [`MARGIN`]. Only attributes that hold one
//! value at a time are slots: hobbies, allergies, likes or languages spoken can be
//! several at once. They are described too, so that a statement closest to one of them
//! is in no slot; the rest is left to the rules.

use cairn_core::{Embedder, Result, SimilarityScale};
use std::sync::{Arc, OnceLock};

/// Single-valued attributes, each with prototype statements in the form facts take.
const SLOTS: &[(&str, &[&str])] = &[
    (
        "home",
        &[
            "The user lives in Berlin.",
            "The user moved into a flat in Lisbon.",
            "The user's home is a house in Leeds.",
        ],
    ),
    (
        "employer",
        &[
            "The user works at Google.",
            "The user started a new job at a bank.",
            "The user's employer is a startup.",
        ],
    ),
    (
        "job title",
        &[
            "The user is a software engineer.",
            "The user was promoted to senior manager.",
            "The user works as a nurse.",
        ],
    ),
    (
        "team at work",
        &[
            "The user is on the payments team at work.",
            "The user transferred to another team at work.",
        ],
    ),
    (
        "manager",
        &["The user's manager is Anna.", "The user reports to a new boss."],
    ),
    (
        "relationship status",
        &[
            "The user is married.",
            "The user has a girlfriend.",
            "The user is single.",
        ],
    ),
    (
        "diet",
        &[
            "The user is vegetarian.",
            "The user eats meat.",
            "The user follows a vegan diet.",
        ],
    ),
    (
        "smoking",
        &[
            "The user smokes cigarettes.",
            "The user quit smoking.",
            "The user vapes every day.",
        ],
    ),
    (
        "alcohol",
        &[
            "The user drinks alcohol at weekends.",
            "The user stopped drinking alcohol.",
        ],
    ),
    (
        "commute",
        &[
            "The user drives to work.",
            "The user commutes by train.",
            "The user cycles to the office.",
        ],
    ),
    (
        "car",
        &["The user owns a Honda Civic.", "The user bought an electric car."],
    ),
    (
        "mobile phone",
        &["The user's phone is an iPhone.", "The user has an Android phone."],
    ),
    (
        "mobile provider",
        &[
            "The user's mobile phone provider is Vodafone.",
            "The user has a phone contract with T-Mobile.",
            "The user's phone plan costs 20 euros a month.",
        ],
    ),
    (
        "laptop",
        &[
            "The user's laptop is a MacBook.",
            "The user uses a ThinkPad laptop.",
        ],
    ),
    (
        "bank",
        &[
            "The user banks with Barclays.",
            "The user opened a current account at a new bank.",
        ],
    ),
    (
        "gym",
        &[
            "The user trains at a gym.",
            "The user works out at home.",
            "The user has a gym membership.",
        ],
    ),
    (
        "studies",
        &[
            "The user studies at university.",
            "The user is taking an evening course.",
            "The user is enrolled in a degree.",
        ],
    ),
    (
        "energy supplier",
        &[
            "The user's energy supplier is British Gas.",
            "The user switched their gas and electricity to a cheaper supplier.",
        ],
    ),
    (
        "broadband provider",
        &[
            "The user's broadband is with Virgin Media.",
            "The user changed internet provider at home.",
        ],
    ),
    (
        "web browser",
        &[
            "The user browses the web with Chrome.",
            "The user's browser is Firefox.",
        ],
    ),
    (
        "operating system",
        &[
            "The user's computer runs Windows.",
            "The user installed Linux on their desktop.",
        ],
    ),
    (
        "training goal",
        &[
            "The user is training for a marathon.",
            "The user's goal is to run a half marathon.",
        ],
    ),
];

/// Attributes that hold several values at once, described the same way: a statement
/// closest to one of them is in no single-valued slot ("also allergic to shellfish" is
/// nearer allergies than diet; "started pottery classes" nearer hobbies than the gym).
const MANY: &[(&str, &[&str])] = &[
    (
        "allergies",
        &[
            "The user is allergic to peanuts.",
            "The user has a shellfish allergy.",
        ],
    ),
    (
        "likes",
        &[
            "The user loves sushi.",
            "The user likes spicy food.",
            "The user enjoys jazz music.",
        ],
    ),
    (
        "hobbies",
        &[
            "The user plays the guitar.",
            "The user has taken up pottery classes.",
            "The user enjoys hiking at weekends.",
        ],
    ),
    (
        "languages",
        &["The user speaks Spanish.", "The user is learning Japanese."],
    ),
];

/// The least cosine to a slot's closest prototype for a statement to be in the slot.
pub const IN_SLOT: f32 = 0.4;

/// How far the closest slot must beat the next one.
pub const MARGIN: f32 = 0.1;

/// A slot's name, whether it holds one value at a time, and its prototypes' vectors.
type Prototypes = Vec<(&'static str, bool, Vec<Vec<f32>>)>;

/// Every attribute with whether it is single-valued.
fn attributes() -> impl Iterator<Item = (&'static str, bool, &'static [&'static str])> {
    SLOTS
        .iter()
        .map(|(name, statements)| (*name, true, *statements))
        .chain(MANY.iter().map(|(name, statements)| (*name, false, *statements)))
}

/// The slots' prototypes with the embedder that made them, embedded on first use.
pub struct SlotMeaning {
    embedder: Arc<dyn Embedder>,
    prototypes: OnceLock<Prototypes>,
}

impl std::fmt::Debug for SlotMeaning {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("SlotMeaning")
            .field("model", &self.embedder.model_id())
            .finish()
    }
}

impl SlotMeaning {
    pub fn new(embedder: Arc<dyn Embedder>) -> Self {
        SlotMeaning {
            embedder,
            prototypes: OnceLock::new(),
        }
    }

    async fn prototypes(&self) -> Result<&[(&'static str, bool, Vec<Vec<f32>>)]> {
        if let Some(prototypes) = self.prototypes.get() {
            return Ok(prototypes);
        }
        let texts: Vec<String> = attributes()
            .flat_map(|(_, _, statements)| statements.iter().map(|statement| (*statement).to_owned()))
            .collect();
        let mut vectors = self.embedder.embed(texts).await?.into_iter();
        let embedded: Prototypes = attributes()
            .map(|(name, single, statements)| {
                (name, single, vectors.by_ref().take(statements.len()).collect())
            })
            .collect();
        // Two first uses at once embed twice; either result is the same.
        let _ = self.prototypes.set(embedded);
        Ok(self.prototypes.get().map(Vec::as_slice).unwrap_or_default())
    }

    /// The slot of each text, or `None` where no slot is clearly its own.
    pub async fn slots(&self, texts: &[&str]) -> Result<Vec<Option<&'static str>>> {
        let prototypes = self.prototypes().await?;
        let vectors = self
            .embedder
            .embed(texts.iter().map(|text| (*text).to_owned()).collect())
            .await?;
        let scale = self.embedder.similarity_scale();
        Ok(vectors
            .iter()
            .map(|vector| slot_of(vector, prototypes, scale))
            .collect())
    }
}

impl SlotMeaning {
    /// Every attribute with the statement's cosine (on the reference scale) to its
    /// closest prototype, closest first: what [`SlotMeaning::slots`] decides on, shown
    /// for the evaluation of a model.
    pub async fn closeness(&self, text: &str) -> Result<Vec<(&'static str, f32)>> {
        let prototypes = self.prototypes().await?;
        let vectors = self.embedder.embed(vec![text.to_owned()]).await?;
        let Some(vector) = vectors.first() else {
            return Ok(Vec::new());
        };
        Ok(closest(vector, prototypes, self.embedder.similarity_scale())
            .into_iter()
            .map(|(best, name, _)| (name, best))
            .collect())
    }

    /// The slot of a statement already embedded with this model (a stored fact's
    /// vector), or `None` where no slot is clearly its own.
    pub async fn slot_of_vector(&self, vector: &[f32]) -> Result<Option<&'static str>> {
        Ok(slot_of(
            vector,
            self.prototypes().await?,
            self.embedder.similarity_scale(),
        ))
    }
}

/// Every attribute with the statement's cosine (on the reference scale `scale`
/// carries the model's onto) to its closest prototype, and whether it is single-valued,
/// closest first.
fn closest(
    vector: &[f32],
    prototypes: &[(&'static str, bool, Vec<Vec<f32>>)],
    scale: SimilarityScale,
) -> Vec<(f32, &'static str, bool)> {
    let mut scored: Vec<(f32, &'static str, bool)> = prototypes
        .iter()
        .map(|(name, single, examples)| {
            let best = examples
                .iter()
                .map(|example| scale.statements(vector, example))
                .fold(f32::MIN, f32::max);
            (best, *name, *single)
        })
        .collect();
    scored.sort_by(|left, right| right.0.total_cmp(&left.0));
    scored
}

/// The single-valued slot a statement's vector is clearly in: closest to it by
/// [`MARGIN`] over every other attribute, several-valued ones included (see
/// [`closest`]).
fn slot_of(
    vector: &[f32],
    prototypes: &[(&'static str, bool, Vec<Vec<f32>>)],
    scale: SimilarityScale,
) -> Option<&'static str> {
    match closest(vector, prototypes, scale).as_slice() {
        [(best, name, true), (next, _, _), ..] if *best >= IN_SLOT && best - next >= MARGIN => Some(name),
        [(best, name, true)] if *best >= IN_SLOT => Some(name),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_statement_is_in_a_slot_only_when_it_is_clearly_closest() {
        let prototypes = vec![
            ("home", true, vec![vec![1.0, 0.0, 0.0, 0.0]]),
            ("employer", true, vec![vec![0.0, 1.0, 0.0, 0.0]]),
            ("hobbies", false, vec![vec![0.0, 0.0, 0.0, 1.0]]),
        ];
        assert_eq!(
            slot_of(&[0.9, 0.1, 0.0, 0.0], &prototypes, SimilarityScale::REFERENCE),
            Some("home")
        );
        // Close to both.
        assert_eq!(
            slot_of(&[0.7, 0.7, 0.0, 0.0], &prototypes, SimilarityScale::REFERENCE),
            None
        );
        // Close to neither.
        assert_eq!(
            slot_of(&[0.1, 0.1, 0.99, 0.0], &prototypes, SimilarityScale::REFERENCE),
            None
        );
        // Closest to an attribute that holds several values.
        assert_eq!(
            slot_of(&[0.3, 0.0, 0.0, 0.95], &prototypes, SimilarityScale::REFERENCE),
            None
        );
    }
}
