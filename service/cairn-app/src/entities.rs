//! Entities: the people, pets, places and organisations the user names, each with its
//! aliases ("my sister", "Anna") and the facts about it.
//!
//! Entities are read from the scope's facts, which are self-contained third-person
//! statements whose pronouns were resolved when they were written ("The user's sister
//! Anna is a nurse", never "She is a nurse"). A fact links to an entity when it mentions
//! it: by a relation the user has to it ("the user's sister"), by its name, or both in
//! one phrase, which is what makes "my sister" and "Anna" aliases of one entity. An
//! entity's id is derived from its name (or, unnamed, its relation), so it is stable
//! across reads and the same wherever the scope is stored.

use crate::{Cairn, now};
use cairn_core::{Error, Fact, FactStatus, PageRequest, Result, Scope, StatusFilter};
use std::collections::{BTreeMap, BTreeSet};

/// How many facts an entity read looks at at most (newest first).
const ENTITY_SCAN: usize = 5_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum EntityKind {
    Person,
    Pet,
    Place,
    Organisation,
}

impl EntityKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EntityKind::Person => "person",
            EntityKind::Pet => "pet",
            EntityKind::Place => "place",
            EntityKind::Organisation => "organisation",
        }
    }
}

/// One entity of a scope and the facts that mention it.
#[derive(Clone, Debug, PartialEq)]
pub struct Entity {
    pub id: String,
    /// Its name, or its relation to the user when it has none ("sister").
    pub name: String,
    pub kind: EntityKind,
    /// Every way the facts refer to it: its name and "the user's <relation>".
    pub aliases: Vec<String>,
    /// Current facts about it, newest first.
    pub facts: Vec<Fact>,
    /// Superseded and retracted facts about it, newest first.
    pub history: Vec<Fact>,
}

/// Relations to the user that name a person.
const PEOPLE: &[&str] = &[
    "sister",
    "brother",
    "mother",
    "mum",
    "mom",
    "father",
    "dad",
    "wife",
    "husband",
    "partner",
    "boyfriend",
    "girlfriend",
    "fiancé",
    "fiancée",
    "fiance",
    "son",
    "daughter",
    "friend",
    "boss",
    "manager",
    "colleague",
    "coworker",
    "neighbour",
    "neighbor",
    "cousin",
    "aunt",
    "uncle",
    "grandmother",
    "grandma",
    "grandfather",
    "grandpa",
    "niece",
    "nephew",
    "roommate",
    "flatmate",
    "therapist",
    "doctor",
    "dentist",
    "teacher",
    "coach",
    "baby",
];

/// Relations to the user that name an animal.
const PETS: &[&str] = &[
    "dog",
    "cat",
    "puppy",
    "kitten",
    "rabbit",
    "horse",
    "parrot",
    "hamster",
    "greyhound",
    "tortoise",
];

/// Relations to the user that name an organisation.
const ORGANISATIONS: &[&str] = &[
    "company",
    "employer",
    "startup",
    "school",
    "university",
    "team",
    "club",
];

/// Words before a name that make it a place or an organisation.
const PLACE_BEFORE: &[&str] = &["in", "to", "from", "near"];
const ORGANISATION_BEFORE: &[&str] = &["at", "for", "joined"];

/// Capitalised words that start a sentence or a statement and are not names.
const NOT_NAMES: &[&str] = &[
    "The",
    "A",
    "An",
    "It",
    "This",
    "That",
    "They",
    "He",
    "She",
    "We",
    "I",
    "Today",
    "Yesterday",
    "Tomorrow",
    "Now",
    "Also",
    "Last",
    "Next",
    "Every",
    "Since",
    "After",
    "Before",
    "When",
    "Just",
    "Recently",
    "Maybe",
];

/// Whether `word` reads as the verb of a third-person subject ("is", "works", "has").
fn third_person_verb(word: &str) -> bool {
    matches!(word, "is" | "was" | "has" | "had" | "and" | "will" | "can")
        || (word.len() > 2 && (word.ends_with('s') && !word.ends_with("ss") || word.ends_with("ed")))
}

/// One mention in a fact: a name, a relation to the user, or both ("sister Anna").
#[derive(Clone, Debug, PartialEq, Eq)]
struct Mention {
    name: Option<String>,
    relation: Option<String>,
    kind: EntityKind,
}

fn bare(word: &str) -> &str {
    let word = word.trim_matches(|c: char| !c.is_alphanumeric() && c != '\'' && c != '’');
    word.strip_suffix("'s")
        .or_else(|| word.strip_suffix("’s"))
        .unwrap_or(word)
}

fn is_name(word: &str) -> bool {
    let word = bare(word);
    word.chars().next().is_some_and(char::is_uppercase) && !NOT_NAMES.contains(&word)
}

fn relation_kind(word: &str) -> Option<EntityKind> {
    let word = word.to_lowercase();
    if PEOPLE.contains(&word.as_str()) {
        Some(EntityKind::Person)
    } else if PETS.contains(&word.as_str()) {
        Some(EntityKind::Pet)
    } else if ORGANISATIONS.contains(&word.as_str()) {
        Some(EntityKind::Organisation)
    } else {
        None
    }
}

/// A run of names from `start` ("Anna", "New York", "The Static" after "called").
fn name_at(words: &[&str], start: usize) -> Option<(String, usize)> {
    let mut end = start;
    while end < words.len() && is_name(words[end]) && end - start < 3 {
        end += 1;
        // A name ends at punctuation ("Anna, who ...").
        if words[end - 1].ends_with([',', '.', ';', ':', '!', '?']) {
            break;
        }
    }
    (end > start).then(|| {
        let name: Vec<&str> = words[start..end].iter().map(|word| bare(word)).collect();
        (name.join(" "), end)
    })
}

/// The entities one fact mentions.
fn mentions(text: &str) -> Vec<Mention> {
    let words: Vec<&str> = text.split_whitespace().collect();
    let mut found: Vec<Mention> = Vec::new();
    let mut taken = vec![false; words.len()];
    let lower: Vec<String> = words.iter().map(|word| bare(word).to_lowercase()).collect();
    let mut index = 0;
    while index < words.len() {
        // "the user's <relation> [<Name>]", "the user's best friend Tom", "the user's dog
        // called Pepper".
        // Facts say "their" for the user's own ("lives with their boyfriend Sam").
        let owned_by_user = index >= 1
            && (((lower[index - 1] == "user" || lower[index - 1] == "user’s")
                && (words[index - 1].ends_with("'s") || words[index - 1].ends_with("’s")))
                || lower[index - 1] == "their");
        let relation = if owned_by_user {
            let mut at = index;
            // Adjectives between the owner and the relation ("best", "older", "little").
            while at < words.len() && at < index + 2 && relation_kind(&lower[at]).is_none() {
                at += 1;
            }
            relation_kind(lower.get(at).map(String::as_str).unwrap_or_default())
                .map(|kind| (at, lower[at].clone(), kind))
        } else {
            None
        };
        if let Some((at, relation, kind)) = relation {
            let mut next = at + 1;
            let word_at = |at: usize| lower.get(at).map(String::as_str).unwrap_or_default();
            let copula = matches!(word_at(next), "is" | "was");
            // "sister Anna", "dog called Pepper", "dog is called Pepper", "manager is
            // Tom", "dog is a greyhound called Pepper".
            if copula && matches!(word_at(next + 1), "called" | "named") {
                next += 2;
            } else if matches!(word_at(next), "called" | "named")
                || (copula && name_at(&words, next + 1).is_some())
            {
                next += 1;
            } else {
                let article = next + usize::from(copula || words[at].ends_with(','));
                if matches!(word_at(article), "a" | "an")
                    && matches!(word_at(article + 2), "called" | "named")
                {
                    next = article + 3;
                }
            }
            let named = name_at(&words, next);
            for flag in taken
                .iter_mut()
                .take(named.as_ref().map_or(at + 1, |(_, end)| *end))
                .skip(index)
            {
                *flag = true;
            }
            index = named.as_ref().map_or(at + 1, |(_, end)| *end);
            found.push(Mention {
                name: named.map(|(name, _)| name),
                relation: Some(relation),
                kind,
            });
            continue;
        }
        index += 1;
    }
    // Names elsewhere: a place after "in"/"to", an organisation after "at"/"for", a pet
    // after "<animal> called", and a person as the subject of the statement.
    let mut index = 0;
    while index < words.len() {
        if taken[index] || !is_name(words[index]) {
            index += 1;
            continue;
        }
        let Some((name, end)) = name_at(&words, index) else {
            index += 1;
            continue;
        };
        let before = index.checked_sub(1).map(|at| lower[at].as_str());
        let two_before = index.checked_sub(2).map(|at| lower[at].as_str());
        // A relation word right before the name: "one cat, Miso" (in apposition), "the
        // school is St Anne's" (named by a copula).
        let related = |at: Option<usize>| at.and_then(|at| relation_kind(&lower[at]).map(|kind| (at, kind)));
        if index >= 1
            && words[index - 1].ends_with(',')
            && let Some((at, kind)) = related(Some(index - 1))
        {
            found.push(Mention {
                name: Some(name),
                relation: (kind != EntityKind::Organisation).then(|| lower[at].clone()),
                kind,
            });
            index = end;
            continue;
        }
        if matches!(before, Some("is" | "was"))
            && let Some((_, kind)) = related(index.checked_sub(2))
        {
            found.push(Mention {
                name: Some(name),
                relation: None,
                kind,
            });
            index = end;
            continue;
        }
        // "called <Name>" after a word of its kind in the same phrase: "a second cat
        // yesterday, a tabby called Tofu", "a startup called Lumen".
        // The first such word is the relation: "a dog, a greyhound called Pepper" is the
        // user's dog.
        let called = (matches!(before, Some("called" | "named")))
            .then(|| {
                let phrase: Vec<usize> = (index.saturating_sub(6)..index.saturating_sub(1))
                    .rev()
                    .take_while(|&at| !words[at].ends_with(['.', ';', '!', '?']))
                    .collect();
                phrase
                    .into_iter()
                    .rev()
                    .find_map(|at| relation_kind(&lower[at]).map(|kind| (at, kind)))
            })
            .flatten();
        if let Some((at, kind)) = called {
            found.push(Mention {
                name: Some(name),
                relation: (kind != EntityKind::Organisation).then(|| lower[at].clone()),
                kind,
            });
            index = end;
            continue;
        }
        let kind = match before {
            // "St Anne's school", "the Riverside club".
            _ if lower
                .get(end)
                .is_some_and(|word| ORGANISATIONS.contains(&word.as_str())) =>
            {
                Some(EntityKind::Organisation)
            }
            Some(word) if PLACE_BEFORE.contains(&word) => Some(EntityKind::Place),
            Some(word) if ORGANISATION_BEFORE.contains(&word) => Some(EntityKind::Organisation),
            Some("called" | "named") if two_before.is_some_and(|word| PETS.contains(&word)) => {
                Some(EntityKind::Pet)
            }
            // The subject: "Anna is a nurse", "Sam and the user broke up" (not a word
            // that only opens the sentence: "Quick intro: ...").
            None if lower.get(end).is_some_and(|word| third_person_verb(word)) => Some(EntityKind::Person),
            Some(_)
                if index >= 1
                    && words[..index]
                        .iter()
                        .all(|word| is_name(word) || bare(word) == "and") =>
            {
                Some(EntityKind::Person)
            }
            Some(_)
                if lower.get(end).is_some_and(|word| word == "and")
                    && lower.get(end + 1).is_some_and(|w| w == "the") =>
            {
                Some(EntityKind::Person)
            }
            _ => None,
        };
        if let Some(kind) = kind {
            found.push(Mention {
                name: Some(name),
                relation: None,
                kind,
            });
        }
        index = end;
    }
    found
}

/// A stable id for an entity key.
fn entity_id(key: &str) -> String {
    let digest = cairn_core::text::fingerprint(key);
    let hex = digest.rsplit(':').next().unwrap_or(&digest);
    format!("ent_{}", &hex[..hex.len().min(16)])
}

/// The entities of `facts` (newest first), each with the facts that mention it.
pub fn entities_of(facts: &[Fact]) -> Vec<Entity> {
    // Keys: "name:anna" for named entities, "relation:sister" for unnamed ones. A
    // relation met with a name anywhere belongs to that name (the newest, when several).
    let mut relation_names: BTreeMap<String, String> = BTreeMap::new();
    let per_fact: Vec<Vec<Mention>> = facts.iter().map(|fact| mentions(&fact.text)).collect();
    for mention in per_fact.iter().flatten() {
        if let (Some(name), Some(relation)) = (&mention.name, &mention.relation) {
            relation_names
                .entry(relation.clone())
                .or_insert_with(|| name.to_lowercase());
        }
    }
    struct Draft {
        name: String,
        kind: EntityKind,
        aliases: BTreeSet<String>,
        facts: Vec<Fact>,
        history: Vec<Fact>,
    }
    let mut drafts: BTreeMap<String, Draft> = BTreeMap::new();
    for (fact, found) in facts.iter().zip(&per_fact) {
        let mut linked: BTreeSet<String> = BTreeSet::new();
        for mention in found {
            let (key, name) = match (&mention.name, &mention.relation) {
                (Some(name), _) => (format!("name:{}", name.to_lowercase()), name.clone()),
                (None, Some(relation)) => match relation_names.get(relation) {
                    Some(name) => (format!("name:{name}"), String::new()),
                    None => (format!("relation:{relation}"), relation.clone()),
                },
                (None, None) => continue,
            };
            let draft = drafts.entry(key.clone()).or_insert_with(|| Draft {
                name: name.clone(),
                kind: mention.kind,
                aliases: BTreeSet::new(),
                facts: Vec::new(),
                history: Vec::new(),
            });
            if draft.name.is_empty() {
                draft.name = name.clone();
            }
            // A relation is the better witness of a kind than a position in a sentence.
            if mention.relation.is_some() {
                draft.kind = mention.kind;
            }
            if let Some(name) = &mention.name {
                draft.aliases.insert(name.clone());
            }
            if let Some(relation) = &mention.relation {
                draft.aliases.insert(format!("the user's {relation}"));
            }
            if linked.insert(key) {
                match fact.status {
                    FactStatus::Active => draft.facts.push(fact.clone()),
                    FactStatus::Superseded | FactStatus::Retracted | FactStatus::Expired => {
                        draft.history.push(fact.clone())
                    }
                    FactStatus::Forgotten | FactStatus::Pending => {}
                }
            }
        }
    }
    drafts
        .into_iter()
        .filter(|(_, draft)| !draft.facts.is_empty() || !draft.history.is_empty())
        .map(|(key, draft)| {
            let name = if draft.name.is_empty() {
                key.trim_start_matches("name:").to_owned()
            } else {
                draft.name
            };
            Entity {
                id: entity_id(&key),
                name,
                kind: draft.kind,
                aliases: draft.aliases.into_iter().collect(),
                facts: draft.facts,
                history: draft.history,
            }
        })
        .collect()
}

/// Whether `text` mentions one of `aliases` (whole words, any case).
pub fn mentions_any(text: &str, aliases: &[String]) -> bool {
    let words: Vec<String> = text
        .split_whitespace()
        .map(|word| bare(word).to_lowercase())
        .collect();
    aliases.iter().any(|alias| {
        let alias: Vec<String> = alias
            .split_whitespace()
            .map(|word| bare(word).to_lowercase())
            .collect();
        !alias.is_empty()
            && words
                .windows(alias.len())
                .any(|window| window == alias.as_slice())
    })
}

impl Cairn {
    /// The scope's facts of every status but forgotten, newest first (at most
    /// `ENTITY_SCAN`).
    async fn facts_for_entities(&self, scope: &Scope) -> Result<Vec<Fact>> {
        let mut facts = Vec::new();
        let mut page = PageRequest {
            limit: 500,
            cursor: None,
        };
        loop {
            let batch = self
                .store
                .list_facts(scope, StatusFilter::All, now(), &page)
                .await?;
            facts.extend(batch.items);
            match batch.next_cursor {
                Some(cursor) if facts.len() < ENTITY_SCAN => page.cursor = Some(cursor),
                _ => break,
            }
        }
        Ok(facts)
    }

    /// The entities the user's facts name, most mentioned first.
    pub async fn entities(&self, scope: &Scope) -> Result<Vec<Entity>> {
        let mut entities = entities_of(&self.facts_for_entities(scope).await?);
        entities.sort_by(|left, right| {
            (right.facts.len() + right.history.len())
                .cmp(&(left.facts.len() + left.history.len()))
                .then_with(|| left.name.cmp(&right.name))
        });
        Ok(entities)
    }

    /// One entity's card, by its id or by one of its aliases ("Anna", "sister",
    /// "the user's sister", "my sister").
    pub async fn entity(&self, scope: &Scope, wanted: &str) -> Result<Entity> {
        let wanted = wanted.trim();
        if wanted.is_empty() || wanted.chars().count() > 200 {
            return Err(Error::invalid(
                "entity",
                "must be an entity id or name of 1 to 200 characters",
            ));
        }
        let lowered = wanted.to_lowercase();
        let relation = lowered
            .strip_prefix("my ")
            .or_else(|| lowered.strip_prefix("the user's "))
            .unwrap_or(&lowered)
            .to_owned();
        self.entities(scope)
            .await?
            .into_iter()
            .find(|entity| {
                entity.id == wanted
                    || entity.name.to_lowercase() == lowered
                    || entity.aliases.iter().any(|alias| {
                        let alias = alias.to_lowercase();
                        alias == lowered || alias == format!("the user's {relation}")
                    })
            })
            .ok_or(Error::NotFound { what: "entity" })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_core::FactType;
    use chrono::Utc;

    fn fact(text: &str, status: FactStatus) -> Fact {
        Fact {
            status,
            ..Fact::new_active(
                cairn_core::new_id("fact"),
                FactType::World,
                text.to_owned(),
                0.9,
                Utc::now(),
            )
        }
    }

    #[test]
    fn names_given_by_a_copula_an_apposition_or_a_phrase_with_called() {
        let named = |text: &str| -> Vec<(Option<String>, Option<String>, EntityKind)> {
            mentions(text)
                .into_iter()
                .map(|mention| (mention.name, mention.relation, mention.kind))
                .collect()
        };
        assert_eq!(
            named("The user's new manager is Jonas."),
            vec![(Some("Jonas".into()), Some("manager".into()), EntityKind::Person)]
        );
        assert_eq!(
            named("The user's dog is a greyhound called Pepper."),
            vec![(Some("Pepper".into()), Some("dog".into()), EntityKind::Pet)]
        );
        assert_eq!(
            named("The user has one cat, Miso."),
            vec![(Some("Miso".into()), Some("cat".into()), EntityKind::Pet)]
        );
        assert_eq!(
            named("The user adopted a second cat yesterday, a tabby called Tofu."),
            vec![(Some("Tofu".into()), Some("cat".into()), EntityKind::Pet)]
        );
        assert_eq!(
            named("The user adopted a dog, a greyhound called Pepper."),
            vec![(Some("Pepper".into()), Some("dog".into()), EntityKind::Pet)]
        );
        assert_eq!(
            named("The user lives with their boyfriend Sam in Leeds."),
            vec![
                (Some("Sam".into()), Some("boyfriend".into()), EntityKind::Person),
                (Some("Leeds".into()), None, EntityKind::Place),
            ]
        );
        assert_eq!(
            named("The user's daughter goes to St Anne's school."),
            vec![
                (None, Some("daughter".into()), EntityKind::Person),
                (Some("St Anne".into()), None, EntityKind::Organisation),
            ]
        );
        assert_eq!(
            named("The user's daughter's school is St Anne's."),
            vec![
                (None, Some("daughter".into()), EntityKind::Person),
                (Some("St Anne".into()), None, EntityKind::Organisation),
            ]
        );
        // A name further on in another phrase is not the relation's.
        assert_eq!(
            named("The user's dog likes the beach in Brighton."),
            vec![
                (None, Some("dog".into()), EntityKind::Pet),
                (Some("Brighton".into()), None, EntityKind::Place),
            ]
        );
    }

    #[test]
    fn mentions_are_found_by_relation_name_and_position() {
        let found = mentions("The user's sister Anna lives in Berlin.");
        assert_eq!(
            found,
            vec![
                Mention {
                    name: Some("Anna".into()),
                    relation: Some("sister".into()),
                    kind: EntityKind::Person
                },
                Mention {
                    name: Some("Berlin".into()),
                    relation: None,
                    kind: EntityKind::Place
                },
            ]
        );
        let pet = mentions("The user adopted a greyhound called Pepper.");
        assert_eq!(pet[0].name.as_deref(), Some("Pepper"));
        assert_eq!(pet[0].kind, EntityKind::Pet);
        let work = mentions("The user works at Datadog as an engineer.");
        assert_eq!(work[0].kind, EntityKind::Organisation);
        assert_eq!(
            mentions("Sam and the user broke up last week.")[0]
                .name
                .as_deref(),
            Some("Sam")
        );
        assert!(
            mentions("The user uses VS Code every day.").is_empty(),
            "products are not entities"
        );
        assert!(
            mentions("Quick intro so you know them: the user is a researcher.").is_empty(),
            "a capitalised opener is not a name"
        );
        assert_eq!(
            mentions("Anna works as a nurse.")[0].name.as_deref(),
            Some("Anna")
        );
        let dog = mentions("The user's dog is called Pepper.");
        assert_eq!(dog[0].relation.as_deref(), Some("dog"));
        assert_eq!(dog[0].name.as_deref(), Some("Pepper"));
        assert_eq!(dog[0].kind, EntityKind::Pet);
    }

    #[test]
    fn a_relation_and_a_name_met_together_are_one_entity() {
        let facts = vec![
            fact("The user's sister is a nurse.", FactStatus::Active),
            fact("The user's sister Anna lives in Berlin.", FactStatus::Active),
            fact("Anna used to live in Hamburg.", FactStatus::Superseded),
            fact("The user lives in Lisbon.", FactStatus::Active),
        ];
        let entities = entities_of(&facts);
        let anna = entities
            .iter()
            .find(|entity| entity.name == "Anna")
            .expect("Anna");
        assert_eq!(anna.kind, EntityKind::Person);
        assert_eq!(
            anna.aliases,
            vec!["Anna".to_owned(), "the user's sister".to_owned()]
        );
        assert_eq!(anna.facts.len(), 2, "{anna:?}");
        assert_eq!(anna.history.len(), 1);
        let places: Vec<&str> = entities
            .iter()
            .filter(|entity| entity.kind == EntityKind::Place)
            .map(|entity| entity.name.as_str())
            .collect();
        assert_eq!(places, ["Berlin", "Hamburg", "Lisbon"]);
        assert_eq!(anna.id, entities_of(&facts[1..2])[0].id, "the id is stable");
        assert!(mentions_any("Anna is a nurse", &anna.aliases));
        assert!(mentions_any("The user's sister is a nurse.", &anna.aliases));
        assert!(!mentions_any("Annabel is a nurse", &anna.aliases));
    }
}
