//! Small English helpers shared by the gates and the offline pipeline: first-person
//! detection, verb agreement, slots (subject + attribute), and distinctive tokens.

use cairn_core::text::tokens;
use std::collections::HashSet;

/// Whether `phrase` occurs in `lower` on word boundaries.
pub fn contains_phrase(lower: &str, phrase: &str) -> bool {
    let mut start = 0;
    while let Some(found) = lower[start..].find(phrase) {
        let at = start + found;
        let end = at + phrase.len();
        let before = lower[..at].chars().next_back();
        let after = lower[end..].chars().next();
        let boundary = |c: Option<char>| c.is_none_or(|c| !c.is_alphanumeric());
        if boundary(before) && boundary(after) {
            return true;
        }
        start = at + phrase.len().max(1);
        if start >= lower.len() {
            break;
        }
    }
    false
}

/// Whether a clause starting with this (lower-case) word is a new first-person statement.
pub fn is_first_person_start(word: &str) -> bool {
    matches!(
        word.trim_matches(',').replace('’', "'").as_str(),
        "i" | "i'm" | "i've" | "i'd" | "i'll" | "my" | "we" | "we're" | "we've" | "our"
    )
}

const ADVERBS: &[&str] = &[
    "really",
    "just",
    "also",
    "usually",
    "always",
    "never",
    "still",
    "now",
    "recently",
    "finally",
    "often",
    "sometimes",
    "mostly",
    "totally",
    "absolutely",
    "definitely",
    "actually",
    "already",
    "currently",
    "rarely",
    "only",
    "even",
    "basically",
    "seriously",
    "honestly",
    "kind",
    "sort",
    "somewhat",
    "mainly",
    "generally",
    "no",
    "not",
    "barely",
    "hardly",
    "typically",
    "normally",
    "occasionally",
    "probably",
    "certainly",
];

pub fn is_adverb(word: &str) -> bool {
    ADVERBS.contains(&word)
}

const MODALS: &[&str] = &[
    "can",
    "could",
    "will",
    "would",
    "should",
    "might",
    "must",
    "may",
    "shall",
    "can't",
    "cannot",
    "won't",
    "wouldn't",
    "shouldn't",
    "couldn't",
    "didn't",
    "did",
    "had",
    "was",
    "were",
    "is",
    "has",
    "does",
];

const IRREGULAR_PAST: &[&str] = &[
    "split",
    "was",
    "were",
    "had",
    "did",
    "went",
    "bought",
    "got",
    "made",
    "took",
    "left",
    "began",
    "broke",
    "saw",
    "met",
    "found",
    "lost",
    "ran",
    "wrote",
    "ate",
    "gave",
    "came",
    "became",
    "felt",
    "thought",
    "told",
    "said",
    "knew",
    "sold",
    "spent",
    "paid",
    "won",
    "fell",
    "drove",
    "flew",
    "quit",
    "kept",
    "built",
    "caught",
    "taught",
    "brought",
    "heard",
    "held",
    "read",
    "sent",
    "slept",
    "stood",
    "understood",
    "wore",
    "grew",
    "drew",
    "chose",
    "forgot",
    "hurt",
    "put",
    "set",
    "cut",
    "let",
    "hit",
    "swam",
    "sang",
    "began",
    "rode",
    "woke",
    "gotten",
    "rewrote",
    "tore",
    "spoke",
    "froze",
    "swore",
    "shook",
    "threw",
    "sat",
    "sank",
    "drank",
    "forgave",
    "fought",
];

pub fn is_past_tense(word: &str) -> bool {
    IRREGULAR_PAST.contains(&word)
        || word
            .strip_prefix("re")
            .is_some_and(|base| IRREGULAR_PAST.contains(&base))
        || (word.len() > 4 && word.ends_with("ed"))
}

/// The verb agreeing with a third-person singular subject: "love" → "loves",
/// "have" → "has", "go" → "goes"; past tenses and modals stay as they are.
pub fn third_person_verb(word: &str) -> String {
    let lower = word.to_lowercase();
    if MODALS.contains(&lower.as_str()) || is_past_tense(&lower) || !lower.chars().all(char::is_alphabetic) {
        return word.to_owned();
    }
    match lower.as_str() {
        "have" => return "has".to_owned(),
        // "used to": a past tense too short for the suffix rule.
        "used" => return word.to_owned(),
        "am" | "are" | "be" => return "is".to_owned(),
        "do" => return "does".to_owned(),
        "go" => return "goes".to_owned(),
        _ => {}
    }
    if lower.ends_with("ss") || lower.ends_with("sh") || lower.ends_with("ch") || lower.ends_with('x') {
        return format!("{word}es");
    }
    if lower.ends_with('s') {
        return word.to_owned();
    }
    if lower.ends_with('y') && lower.len() > 1 {
        let before = lower.chars().rev().nth(1).unwrap_or('a');
        if !"aeiou".contains(before) {
            return format!("{}ies", &word[..word.len() - 1]);
        }
    }
    if lower.ends_with('o') {
        return format!("{word}es");
    }
    format!("{word}s")
}

pub fn number(word: &str) -> Option<f64> {
    let named = [
        ("a", 1.0),
        ("an", 1.0),
        ("one", 1.0),
        ("two", 2.0),
        ("three", 3.0),
        ("four", 4.0),
        ("five", 5.0),
        ("six", 6.0),
        ("seven", 7.0),
        ("ten", 10.0),
        ("couple", 2.0),
        ("few", 3.0),
    ];
    word.parse::<f64>().ok().or_else(|| {
        named
            .iter()
            .find(|(name, _)| *name == word)
            .map(|(_, value)| *value)
    })
}

/// Words that say little about what a fact is about.
const GENERIC: &[&str] = &[
    "user",
    "users",
    "the",
    "a",
    "an",
    "is",
    "was",
    "are",
    "be",
    "been",
    "has",
    "have",
    "had",
    "does",
    "do",
    "did",
    "and",
    "or",
    "but",
    "to",
    "of",
    "in",
    "on",
    "at",
    "for",
    "with",
    "from",
    "by",
    "as",
    "it",
    "its",
    "that",
    "this",
    "their",
    "they",
    "them",
    "s",
    "now",
    "really",
    "just",
    "also",
    "very",
    "so",
    "not",
    "no",
    "will",
    "would",
    "can",
    "could",
    "after",
    "before",
    "about",
    "into",
    "than",
    "then",
    "too",
    "some",
    "any",
    "all",
    "lot",
    "lots",
    "bit",
    "thing",
    "things",
    "new",
    "currently",
    "recently",
    "still",
    "my",
    "i",
    "me",
    "t",
];

/// Lower-case tokens that carry content, with a trailing plural or verb `s` removed.
pub fn content_tokens(text: &str) -> HashSet<String> {
    tokens(text)
        .into_iter()
        .filter(|token| !GENERIC.contains(&token.as_str()))
        .map(|token| stem(&token))
        .collect()
}

/// Whether `said` states `value`: every content word of the value (more than one
/// letter; generic words such as "user" left out, so "The user lives in Porto" is
/// stated by "I live in Porto") occurs in what was said, both reduced by the Porter
/// stemmer, the one recall matches words with ("lives", "live" and "living" meet).
pub fn states_value(said: &str, value: &str) -> bool {
    let stems = |text: &str| -> HashSet<String> {
        tokens(text)
            .into_iter()
            .filter(|token| !GENERIC.contains(&token.as_str()))
            .map(|token| cairn_core::porter::stem(&token))
            .collect()
    };
    let words = stems(said);
    let needed: Vec<String> = stems(value)
        .into_iter()
        .filter(|token| token.chars().count() > 1)
        .collect();
    !needed.is_empty() && needed.iter().all(|token| words.contains(token))
}

/// A light stem: enough that "sneaker" meets "sneakers" and "loves" meets "love".
pub fn stem(token: &str) -> String {
    let token = token.to_lowercase();
    for suffix in ["ies", "es", "s"] {
        if token.len() > suffix.len() + 2 && token.ends_with(suffix) && !token.ends_with("ss") {
            let base = &token[..token.len() - suffix.len()];
            return if suffix == "ies" {
                format!("{base}y")
            } else {
                base.to_owned()
            };
        }
    }
    token
}

/// A word's root across its verb forms as well as its plural ("transferring",
/// "transferred" and "transfer" share "transfer"; "moving", "moved" and "move" share
/// "mov"): the suffixes "-ing" and "-ed" go where at least three letters stay, with a
/// doubled last consonant undone, and a final "e" goes.
pub fn root(token: &str) -> String {
    let stemmed = stem(token);
    for suffix in ["ing", "ed"] {
        if let Some(base) = stemmed.strip_suffix(suffix)
            && base.chars().count() >= 3
        {
            let mut letters = base.chars().rev();
            return match (letters.next(), letters.next()) {
                (Some(last), Some(before)) if last == before && !"aeiouslz".contains(last) => {
                    base[..base.len() - last.len_utf8()].to_owned()
                }
                _ => base.trim_end_matches('e').to_owned(),
            };
        }
    }
    stemmed.trim_end_matches('e').to_owned()
}

/// Token-set Jaccard similarity after normalisation.
pub fn jaccard(left: &str, right: &str) -> f64 {
    let left: HashSet<String> = tokens(left).into_iter().collect();
    let right: HashSet<String> = tokens(right).into_iter().collect();
    if left.is_empty() && right.is_empty() {
        return 1.0;
    }
    left.intersection(&right).count() as f64 / left.union(&right).count() as f64
}

/// The tokens of `text` that identify something specific: numbers and versions,
/// capitalised words other than the sentence opener, and long rare-looking words.
pub fn distinctive_tokens(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut sentence_start = true;
    for raw in text.split_whitespace() {
        let word = raw.trim_matches(|c: char| !c.is_alphanumeric());
        if word.is_empty() {
            continue;
        }
        let lower = word.to_lowercase();
        let capitalised = word.chars().next().is_some_and(char::is_uppercase) && !sentence_start;
        let numeric = word.chars().any(|c| c.is_ascii_digit());
        let long = lower.chars().count() >= 10;
        let generic = GENERIC.contains(&lower.as_str()) || lower == "user's";
        if (capitalised || numeric || long) && !generic {
            for token in tokens(word) {
                if !GENERIC.contains(&token.as_str()) {
                    found.push(token);
                }
            }
        }
        sentence_start = raw.ends_with(['.', '!', '?']);
    }
    found
}

/// What a fact is about, coarsely: an attribute of the user that holds one value at a
/// time (where they live, their employer, diet) or a product category.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slot {
    name: String,
    exclusive: bool,
}

impl Slot {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A new value of an exclusive slot replaces the old one.
    pub fn is_exclusive(&self) -> bool {
        self.exclusive
    }
}

const EXCLUSIVE_SLOTS: &[(&str, &[&str])] = &[
    // The user's own name; "his name is Omar" names someone else.
    ("name", &["user's name is", "my name is", "called me", "go by"]),
    ("age", &["years old", "turned"]),
    (
        "residence",
        &[
            "live in",
            "lives in",
            "living in",
            "moved to",
            "moving to",
            "relocated",
            "relocating",
            "based in",
            "home is",
            "apartment in",
            "house in",
            "moved from",
            "live near",
            "live alone",
            "lives alone",
            "living alone",
            "moved in with",
            "moving in with",
            "moved into",
            // Renting, owning or sharing a home.
            "share a flat",
            "shares a flat",
            "sharing a flat",
            "share a house",
            "shares a house",
            "flat in",
            "place in",
            "own place",
            "keys to",
            "rent a",
            "rents a",
            "renting a",
        ],
    ),
    (
        "studies",
        &[
            "master's",
            "masters",
            "degree",
            "phd",
            "mba",
            "msc",
            "mph",
            "bachelor's",
            "undergrad",
            "dissertation",
            "thesis",
            "semester",
            "studying",
            "graduation",
        ],
    ),
    (
        "employment",
        &[
            "work at",
            "works at",
            "work for",
            "works for",
            "working at",
            "working for",
            "job at",
            "job as",
            "works as",
            "work as",
            "employer",
            "hired",
            "joined",
            "new job",
            "startup",
            "started at",
            "position at",
            "role at",
            "laid off",
            "got a job",
            "first day at",
            "teach",
            "lecture",
            "lectures",
            "lecturing",
            "lecturer",
            "retired",
            "resigned",
            "fired",
            "made redundant",
        ],
    ),
    (
        "diet",
        &[
            "vegetarian",
            "vegan",
            "pescatarian",
            "keto",
            "diet",
            "eat meat",
            "eats meat",
            "eating meat",
            "eat fish",
            "eats fish",
            "eating fish",
            "carnivore",
            "paleo",
            "plant-based",
            "plant based",
        ],
    ),
    (
        "smoking",
        &[
            "smoke",
            "smokes",
            "smoking",
            "smoker",
            "cigarette",
            "vape",
            "vapes",
            "vaping",
        ],
    ),
    (
        "shift pattern",
        &[
            "day shift",
            "night shift",
            "early shift",
            "late shift",
            "on nights",
            "started nights",
            "working nights",
            "works nights",
            "rota",
        ],
    ),
    (
        "workplace",
        &[
            "office",
            "remote",
            "work from home",
            "works from home",
            "working from home",
            "working from",
            "works from",
            "wfh",
            "hybrid",
        ],
    ),
    (
        "work terms",
        &[
            "contract",
            "permanent",
            "full time",
            "full-time",
            "part time",
            "part-time",
            "days a week",
            "freelance",
        ],
    ),
    (
        "relationship",
        &[
            "married",
            "engaged",
            "divorced",
            "single",
            "girlfriend",
            "boyfriend",
            "dating",
            "broke up",
            "partner",
            "seeing someone",
        ],
    ),
];

const CATEGORY_SLOTS: &[(&str, &[&str])] = &[
    (
        "footwear",
        &[
            "sneaker",
            "sneakers",
            "shoes",
            "trainers",
            "running shoes",
            "adidas",
            "puma",
            "nike",
            "reebok",
            "asics",
            "hoka",
            "brooks",
            "new balance",
            "saucony",
            "vans",
            "converse",
        ],
    ),
    (
        "phone",
        &["phone", "iphone", "android", "pixel", "galaxy", "smartphone"],
    ),
    (
        "car",
        &[
            "car",
            "drives a",
            "toyota",
            "honda",
            "tesla",
            "bmw",
            "ford",
            "volkswagen",
            "subaru",
            "audi",
        ],
    ),
    (
        "computer",
        &["laptop", "macbook", "computer", "thinkpad", "desktop"],
    ),
    (
        "editor",
        &[
            "editor",
            "vim",
            "emacs",
            "vscode",
            "vs code",
            "neovim",
            "intellij",
            "sublime",
            "zed",
            "helix",
            "pycharm",
            "webstorm",
            "xcode",
            "notepad++",
        ],
    ),
    ("coffee", &["coffee", "espresso", "latte", "tea"]),
    (
        "music service",
        &[
            "spotify",
            "apple music",
            "tidal",
            "deezer",
            "youtube music",
            "soundcloud",
            "pandora",
        ],
    ),
    (
        "gym",
        &[
            "gym", "workout", "work out", "running", "yoga", "cycling", "swimming",
        ],
    ),
    ("pet", &["dog", "cat", "puppy", "kitten", "pet"]),
    (
        "language",
        &[
            "learning spanish",
            "learning french",
            "learning german",
            "learning japanese",
            "learning",
        ],
    ),
];

/// People and animals a fact can be about other than the user ("the user's sister ...").
const RELATIONS: &[&str] = &[
    "sister",
    "brother",
    "mother",
    "mom",
    "mum",
    "father",
    "dad",
    "wife",
    "husband",
    "partner",
    "son",
    "daughter",
    "kids",
    "children",
    "friend",
    "boss",
    "neighbour",
    "neighbor",
    "dog",
    "cat",
    "team",
    "parents",
    "grandmother",
    "grandfather",
    "aunt",
    "uncle",
    "cousin",
    "roommate",
    "flatmate",
    "housemate",
    "colleague",
    "girlfriend",
    "boyfriend",
];

/// Whether `text` speaks of someone other than the user, by a relation ("the user's
/// partner", "their sister"): a slot matched by meaning alone is then not the user's.
pub fn mentions_someone(text: &str) -> bool {
    text.split_whitespace().any(|word| {
        let word = word
            .trim_matches(|c: char| !c.is_alphanumeric() && c != '\'')
            .to_lowercase();
        let word = word.strip_suffix("'s").unwrap_or(&word);
        RELATIONS.contains(&word) && word != "team"
    })
}

/// The name of someone the statement says died or was lost ("We lost Bruno on
/// Sunday", "Rufus passed away", "had to put Rufus down"), lower-cased, or `None`.
pub fn death_of(text: &str) -> Option<String> {
    let words: Vec<&str> = text.split_whitespace().collect();
    let name = |word: &str| -> Option<String> {
        let bare = word.trim_matches(|c: char| !c.is_alphanumeric());
        (bare.chars().next().is_some_and(char::is_uppercase) && bare.len() > 1 && bare != "I")
            .then(|| bare.to_lowercase())
    };
    for (index, pair) in words.windows(2).enumerate() {
        let [first, second] = pair else {
            continue;
        };
        let verb = first.to_lowercase();
        let after = second.to_lowercase();
        let after = after.trim_matches(|c: char| !c.is_alphanumeric());
        // "lost Bruno", "put Rufus down", "Bruno died", "Rufus passed away".
        let put_down = verb == "put"
            && words
                .get(index + 2)
                .is_some_and(|word| word.to_lowercase().starts_with("down"));
        let found = if (matches!(verb.as_str(), "lost" | "buried") && index > 0) || put_down {
            name(second)
        } else if matches!(after, "died" | "passed") && index > 0 {
            name(first)
        } else {
            None
        };
        if found.is_some() {
            return found;
        }
    }
    None
}

/// Whether a statement tells of a birth, which ends a pregnancy.
pub fn tells_a_birth(text: &str) -> bool {
    let lower = text.to_lowercase();
    [
        "was born",
        "were born",
        "gave birth",
        "had the baby",
        "had our baby",
        "had their baby",
    ]
    .iter()
    .any(|phrase| contains_phrase(&lower, phrase))
}

/// Whether a fact holds a pregnancy.
pub fn holds_a_pregnancy(text: &str) -> bool {
    let lower = text.to_lowercase();
    [
        "pregnant",
        "expecting a baby",
        "expecting their first",
        "due in",
        "due on",
    ]
    .iter()
    .any(|phrase| contains_phrase(&lower, phrase))
}

/// What the user may call a partner.
const PARTNERS: &[&str] = &[
    "girlfriend",
    "boyfriend",
    "partner",
    "husband",
    "wife",
    "fiancé",
    "fiancée",
    "fiance",
    "fiancee",
];

/// What a statement tells of the user's relationship: that it ended, or that it
/// moved on to an engagement or a marriage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PartnerChange {
    Ended,
    Engaged,
    Married,
}

/// The change of relationship a statement of the user's tells ("The user's divorce was
/// finalised", "Tom and the user split up", "The user is engaged"), or `None`.
pub fn partner_change(text: &str) -> Option<PartnerChange> {
    let lower = text.to_lowercase();
    let said = |phrases: &[&str]| phrases.iter().any(|phrase| contains_phrase(&lower, phrase));
    if said(&[
        "divorce",
        "divorced",
        "broke up",
        "split up",
        "separated",
        "break-up",
        "breakup",
    ]) {
        Some(PartnerChange::Ended)
    } else if said(&["engaged", "proposed", "engagement"]) {
        Some(PartnerChange::Engaged)
    } else if said(&["got married", "married now", "wedding was", "newlyweds"]) {
        Some(PartnerChange::Married)
    } else {
        None
    }
}

/// The word a fact calls the user's partner by ("the user's husband Mark ..."), if it
/// names one.
pub fn names_partner(text: &str) -> Option<&'static str> {
    let lower = text.to_lowercase();
    PARTNERS
        .iter()
        .find(|partner| {
            contains_phrase(&lower, &format!("the user's {partner}"))
                || contains_phrase(&lower, &format!("their {partner}"))
        })
        .copied()
}

/// Whether a partner called `partner` is no longer called so after `change`: any
/// partner after an end, a girlfriend, boyfriend or partner after an engagement, and a
/// fiancé(e) too after a marriage.
pub fn outdated_partner(change: PartnerChange, partner: &str) -> bool {
    match change {
        PartnerChange::Ended => true,
        PartnerChange::Engaged => matches!(partner, "girlfriend" | "boyfriend" | "partner"),
        PartnerChange::Married => !matches!(partner, "husband" | "wife"),
    }
}

/// Jobs, so "a nurse at St. Mary's" is about employment.
const PROFESSIONS: &[&str] = &[
    "nurse",
    "engineer",
    "teacher",
    "doctor",
    "developer",
    "designer",
    "manager",
    "tester",
    "accountant",
    "lawyer",
    "chef",
    "translator",
    "architect",
    "analyst",
    "consultant",
    "researcher",
    "scientist",
    "intern",
    "programmer",
    "barista",
    "cashier",
    "pilot",
    "electrician",
    "plumber",
    "librarian",
    "professor",
    "student",
];

/// Whether `phrase` occurs in `lower`, also as a plural ("espressos", "shoes").
fn mentions(lower: &str, phrase: &str) -> bool {
    contains_phrase(lower, phrase)
        || contains_phrase(lower, &format!("{phrase}s"))
        || contains_phrase(lower, &format!("{phrase}es"))
}

/// The slot of a fact's text, if it has one: an attribute, qualified by whom it is
/// about when that is not the user ("sister: employment"). "favourite X" is its own
/// exclusive slot.
pub fn slot(text: &str) -> Option<Slot> {
    let lower = text.to_lowercase();
    // Whose slot: the user's, or a relation's ("the user's sister").
    let about = lower
        .strip_prefix("the user's ")
        .and_then(|rest| rest.split_whitespace().next())
        .filter(|word| RELATIONS.contains(word))
        .map(stem);
    attribute_slot(&lower).map(|slot| match about {
        Some(about) => Slot {
            name: format!("{about}: {}", slot.name),
            exclusive: slot.exclusive,
        },
        None => slot,
    })
}

/// The people named after a relation of the user in `texts` ("the user's sister Anna"
/// names Anna as the sister): lower-cased name to relation.
pub fn relation_names<'a>(
    texts: impl IntoIterator<Item = &'a str>,
) -> std::collections::HashMap<String, String> {
    let mut names = std::collections::HashMap::new();
    for text in texts {
        let words: Vec<&str> = text.split_whitespace().collect();
        for window in words.windows(4) {
            let [the, users, relation, name] = window else {
                continue;
            };
            let name: String = name.chars().take_while(|c| c.is_alphabetic()).collect();
            let relation = relation.to_lowercase();
            if the.eq_ignore_ascii_case("the")
                && users.eq_ignore_ascii_case("user's")
                && RELATIONS.contains(&relation.as_str())
                && name.chars().next().is_some_and(char::is_uppercase)
            {
                names.insert(name.to_lowercase(), relation);
            }
        }
    }
    names
}

/// [`slot`], also qualified when the text is about a person `known` names by a relation
/// ("Anna became a doctor", Anna being the user's sister, holds "sister: profession"),
/// so a change about someone the user knows is never taken for the user's own.
pub fn slot_among(text: &str, known: &std::collections::HashMap<String, String>) -> Option<Slot> {
    let slot = slot(text)?;
    if slot.name.contains(": ") {
        return Some(slot);
    }
    let first: String = text
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .chars()
        .take_while(|c| c.is_alphabetic())
        .collect();
    let about = first
        .chars()
        .next()
        .is_some_and(char::is_uppercase)
        .then(|| known.get(&first.to_lowercase()))
        .flatten();
    Some(match about {
        Some(relation) => Slot {
            name: format!("{}: {}", stem(relation), slot.name),
            exclusive: slot.exclusive,
        },
        None => slot,
    })
}

fn attribute_slot(lower: &str) -> Option<Slot> {
    let lower = lower.to_owned();
    for marker in ["favourite ", "favorite "] {
        if let Some(position) = lower.find(marker) {
            let rest = &lower[position + marker.len()..];
            let noun: String = rest.chars().take_while(|c| c.is_alphanumeric()).collect();
            if !noun.is_empty() {
                return Some(Slot {
                    name: format!("favourite {}", stem(&noun)),
                    exclusive: true,
                });
            }
        }
    }
    // A job the text gives someone: not "the doctor" or "their doctor", who is someone
    // the user deals with.
    let words: Vec<&str> = lower.split_whitespace().collect();
    let professional = PROFESSIONS.iter().any(|job| {
        words.iter().enumerate().any(|(index, word)| {
            let bare = word.trim_matches(|c: char| !c.is_alphanumeric());
            (bare == *job || bare == format!("{job}s"))
                && !(index > 0 && matches!(words[index - 1], "the" | "their" | "my" | "his" | "her" | "our"))
        })
    });
    for (name, phrases) in EXCLUSIVE_SLOTS {
        if phrases.iter().any(|phrase| mentions(&lower, phrase)) || (*name == "employment" && professional) {
            return Some(Slot {
                name: (*name).to_owned(),
                exclusive: true,
            });
        }
    }
    for (name, phrases) in CATEGORY_SLOTS {
        if phrases.iter().any(|phrase| mentions(&lower, phrase)) {
            return Some(Slot {
                name: (*name).to_owned(),
                exclusive: false,
            });
        }
    }
    None
}

/// Whether a token only names a slot ("lives", "works") rather than its value.
pub fn is_slot_word(token: &str) -> bool {
    const WORDS: &[&str] = &[
        "live",
        "liv",
        "move",
        "moved",
        "moving",
        "work",
        "working",
        "job",
        "favourite",
        "favorite",
        "love",
        "like",
        "prefer",
        "based",
        "home",
        "eat",
        "diet",
        "sneaker",
        "shoe",
        "drive",
        "use",
        "using",
        "called",
        "name",
        "year",
        "old",
        "start",
        "started",
        "switch",
        "switching",
        "switched",
        "now",
        "enjoy",
        "own",
    ];
    WORDS.contains(&token)
}

/// Whether the text announces that a previous value stopped holding.
pub fn announces_change(text: &str) -> bool {
    let lower = text.to_lowercase();
    [
        "switching to",
        "switched to",
        "switch to",
        "changed to",
        "changing to",
        "changed",
        "moved to",
        "moving to",
        "no longer",
        "not anymore",
        "anymore",
        "instead",
        "stopped",
        "quit",
        "gave up",
        "replaced",
        "went back to",
        "now prefers",
        "now uses",
        "new job",
        "first day",
        "started at",
        "relocated",
        "broke up",
        "divorced",
        "used to",
        "rescheduled",
        "postponed",
        "cancelled",
        "canceled",
        "moved",
        "turned",
        "sold",
        "left",
        "became",
        "now",
        "these days",
        "single",
        "joined",
        // The end of a job or a course, told as what happened to the user.
        "laid off",
        "let go",
        "fired",
        "made redundant",
        "resigned",
        "retired",
        "graduated",
        "transferred",
        "promoted",
        // The end of a thing or a state, and a new stage of a life.
        "no more",
        "got rid of",
        "done with",
        "graduation",
        "split up",
        "separated",
        "divorce",
        "engaged",
        "got married",
        "starts at",
        "starting at",
        "first week",
        "went remote",
        "fully remote",
        "keys to",
        "sober",
        "again",
        "back at",
        "back in",
        "back home",
        "back with",
        "switched",
        "switching",
        "bumped",
        "handed in",
        "permanent",
    ]
    .iter()
    .any(|phrase| contains_phrase(&lower, phrase))
        || lower.split_whitespace().any(|word| {
            word.trim_matches(|c: char| !c.is_alphanumeric() && c != '-')
                .ends_with("-free")
        })
}

/// The value a change statement says no longer holds, as content tokens, taken from
/// the statement itself: "switching from Slack to Teams", "Svelte instead of React",
/// "replaced Evernote with Obsidian", "ditched Chrome for Firefox", "not using Todoist
/// anymore", "no longer vegetarian", "left the Riverside Rowing Club", "dropped the 3.8
/// version", "sold the Civic", "closed my Barclays account". Empty when the statement
/// names no old value. The value ends at the next word that starts what replaces it or
/// qualifies the change ("to", "with", "for", "last", ...).
pub fn departed_value(text: &str) -> Vec<String> {
    // (marker, whether the old value comes before the marker rather than after it)
    const AFTER: &[&str] = &[
        "switching from",
        "switched from",
        "switch from",
        "moving from",
        "moved from",
        "migrating from",
        "migrated from",
        "moving away from",
        "moved away from",
        "moved off",
        "from",
        "instead of",
        "rather than",
        "replaced",
        "replacing",
        "swapped",
        "ditched",
        "got rid of",
        "getting rid of",
        "notice at",
        "goodbye",
        "bye bye",
        "farewell",
        "no more",
        "done with",
        "finished with",
        "not using",
        "no longer using",
        "no longer uses",
        "no longer on",
        "no longer at",
        "no longer with",
        "no longer",
        "not on",
        "stopped using",
        "stopped",
        "gave up",
        "given up",
        "quit",
        "left",
        "dropped",
        "sold",
        "closed",
        "cancelled",
        "canceled",
        "paused",
        "retired",
        "used to be",
    ];
    const BEFORE: &[&str] = &[
        "is gone",
        "is out",
        "is behind",
        "is retired",
        "is sold",
        "is off",
        "is over",
        "is finished",
        "is cancelled",
        "is canceled",
        "came off",
        "ended",
        "died",
        "expired",
        "anymore",
    ];
    const ENDS: &[&str] = &[
        "to",
        "with",
        "for",
        "and",
        "but",
        "so",
        "because",
        "since",
        "now",
        "anymore",
        "last",
        "this",
        "yesterday",
        "today",
        "ago",
        "after",
        "in",
        "at",
        "over",
        "on",
        "as",
        "is",
        "was",
        "which",
        "who",
        "that",
        "too",
        "again",
        "everything",
        "finally",
        "then",
        "from",
    ];
    const SKIP: &[&str] = &[
        "the",
        "my",
        "our",
        "their",
        "his",
        "her",
        "a",
        "an",
        "of",
        "using",
        "use",
        "uses",
        "on",
        "at",
        "with",
        "user",
        "user's",
        "team",
        "team's",
        "membership",
        "account",
        "version",
        "subscription",
        "contract",
    ];
    let lower = text.to_lowercase();
    // Each word, and whether a clause ends after it ("Cancelled Spotify, Apple Music
    // came free": the value is Spotify alone).
    let (words, clause_ends): (Vec<String>, Vec<bool>) = lower
        .split_whitespace()
        .map(|word| {
            (
                word.trim_matches(|c: char| !c.is_alphanumeric() && c != '.' && c != '-')
                    .trim_end_matches('.')
                    .to_owned(),
                word.ends_with([',', ';', ':', '!', '?']),
            )
        })
        .filter(|(word, _)| !word.is_empty())
        .unzip();
    // The same tokens `content_tokens` gives a stored fact, so they can be compared.
    let value_tokens = |value: &[String]| -> Vec<String> {
        let mut tokens: Vec<String> = content_tokens(&value.join(" "))
            .into_iter()
            .filter(|token| !SKIP.contains(&token.as_str()) && !is_slot_word(token))
            .collect();
        tokens.sort();
        tokens
    };
    for marker in AFTER {
        let marker_words: Vec<&str> = marker.split(' ').collect();
        for start in 0..words.len() {
            if words.len() < start + marker_words.len()
                || words[start..start + marker_words.len()]
                    .iter()
                    .zip(&marker_words)
                    .any(|(word, marker)| word != marker)
            {
                continue;
            }
            // "cron is retired": the value comes before a participle (below).
            if start > 0
                && matches!(words[start - 1].as_str(), "is" | "was" | "are" | "were")
                && BEFORE.contains(&format!("is {marker}").as_str())
            {
                continue;
            }
            let after = start + marker_words.len();
            let mut value = Vec::new();
            for (word, ends) in words[after..].iter().zip(&clause_ends[after..]) {
                if ENDS.contains(&word.as_str()) && !value_tokens(&value).is_empty() {
                    break;
                }
                value.push(word.clone());
                if value.len() >= 5 || *ends {
                    break;
                }
            }
            let tokens = value_tokens(&value);
            if !tokens.is_empty() {
                return tokens;
            }
        }
    }
    // "exported everything out of LastPass into Bitwarden", "moved the project off AWS
    // onto Hetzner": what lies between "out of" or "off" and where it went.
    for start in 0..words.len() {
        let after = match (words[start].as_str(), words.get(start + 1).map(String::as_str)) {
            ("out", Some("of")) => start + 2,
            ("off", _) => start + 1,
            _ => continue,
        };
        let Some(to) = words
            .iter()
            .skip(after)
            .take(5)
            .position(|word| matches!(word.as_str(), "into" | "onto" | "to" | "for"))
        else {
            continue;
        };
        let tokens = value_tokens(&words[after..after + to]);
        if !tokens.is_empty() {
            return tokens;
        }
    }
    for marker in BEFORE {
        let marker_words: Vec<&str> = marker.split(' ').collect();
        for end in 0..words.len() {
            if words.len() < end + marker_words.len()
                || words[end..end + marker_words.len()]
                    .iter()
                    .zip(&marker_words)
                    .any(|(word, marker)| word != marker)
            {
                continue;
            }
            // The nearest content word before the marker ("QWERTY is behind me").
            if let Some(tokens) = words[..end]
                .iter()
                .rev()
                .take(3)
                .map(|word| value_tokens(std::slice::from_ref(word)))
                .find(|tokens| !tokens.is_empty())
            {
                return tokens;
            }
        }
    }
    Vec::new()
}

/// Nouns with the word that qualifies them ("the search team" → ("team", "search"),
/// "night shifts" → ("shift", "night")): pairs of adjacent content words.
pub fn qualified_nouns(text: &str) -> Vec<(String, String)> {
    let words: Vec<String> = text
        .split_whitespace()
        .map(|word| {
            word.trim_matches(|c: char| !c.is_alphanumeric() && c != '-')
                .to_lowercase()
        })
        .collect();
    words
        .windows(2)
        .filter(|pair| {
            pair.iter().all(|word| {
                !word.is_empty()
                    && !GENERIC.contains(&word.as_str())
                    && !is_adverb(word)
                    && !is_slot_word(&stem(word))
                    && !is_past_tense(word)
                    && !matches!(word.as_str(), "user's" | "their" | "his" | "her" | "our")
            })
        })
        .map(|pair| (stem(&pair[1]), stem(&pair[0])))
        .collect()
}

/// Whether a fact tells of something the user did or changed: a change phrase, or a
/// past-tense verb right after "The user" ("The user transferred to ...").
pub fn tells_a_change(text: &str) -> bool {
    let mut words = text.split_whitespace().map(|word| word.to_lowercase());
    let acted = matches!(
        (words.next().as_deref(), words.next().as_deref()),
        (Some("the"), Some("user"))
    ) && words
        .find(|word| !is_adverb(word))
        .is_some_and(|verb| is_past_tense(&verb) && !matches!(verb.as_str(), "was" | "were" | "had" | "did"));
    acted || announces_change(text)
}

/// The names in `text`: capitalised words after its first (Bath, ThinkPad, X1),
/// lower-cased; "I" is not a name.
pub fn names(text: &str) -> HashSet<String> {
    text.split_whitespace()
        .skip(1)
        .map(|word| word.trim_matches(|c: char| !c.is_alphanumeric()))
        .map(|word| word.strip_suffix("'s").unwrap_or(word))
        .filter(|word| word.chars().next().is_some_and(char::is_uppercase) && *word != "I")
        .map(str::to_lowercase)
        .collect()
}

/// The people named together with the user as a subject ("Sam and the user broke up",
/// "The user's boyfriend Sam and the user live ..."), lower-cased.
pub fn companions(text: &str) -> HashSet<String> {
    let Some((before, _)) = text.split_once(" and the user") else {
        return HashSet::new();
    };
    before
        .split_whitespace()
        .map(|word| word.trim_matches(|c: char| !c.is_alphanumeric()))
        .filter(|word| word.chars().next().is_some_and(char::is_uppercase) && *word != "The")
        .map(str::to_lowercase)
        .collect()
}

/// Whether `candidate` names another value than `old` does: a name `old` lacks, while
/// `old` has a name the candidate does not repeat ("a house in Bath" against "a flat in
/// Bristol"; "new ThinkPad X1" against "a 2017 MacBook Air").
pub fn names_another_value(candidate: &str, old: &str) -> bool {
    let theirs = names(old);
    let ours = names(candidate);
    ours.iter().any(|name| !theirs.contains(name)) && theirs.iter().any(|name| !ours.contains(name))
}

/// Whether `candidate` still names every word of `old`'s value (its content words other
/// than slot words): a restatement or a detail of the same value, not another one.
pub fn repeats_value(candidate: &str, old: &str) -> bool {
    let words = content_tokens(candidate);
    content_tokens(old)
        .iter()
        .filter(|token| !is_slot_word(token))
        .all(|token| words.contains(token))
}

/// Whether `word` opens a question ("What ...", "Should I ...", "Is it ...").
pub fn opens_question(word: &str) -> bool {
    let word = word
        .trim_matches(|c: char| !c.is_alphanumeric() && c != '\'')
        .to_lowercase()
        .replace('’', "'");
    matches!(
        word.as_str(),
        "what"
            | "how"
            | "why"
            | "where"
            | "when"
            | "which"
            | "who"
            | "whose"
            | "whom"
            | "should"
            | "can"
            | "could"
            | "would"
            | "will"
            | "shall"
            | "may"
            | "might"
            | "do"
            | "does"
            | "did"
            | "is"
            | "are"
            | "am"
            | "was"
            | "were"
            | "have"
            | "has"
            | "any"
            | "isn't"
            | "aren't"
            | "don't"
            | "doesn't"
            | "didn't"
            | "won't"
            | "wouldn't"
            | "can't"
            | "shouldn't"
    )
}

/// Whether `text` presents itself as an addition to what was said before ("also
/// allergic to shellfish", "spicy ramen too", "pottery classes as well", "another
/// flat"): a second value beside the first, not in its place.
pub fn adds_to(text: &str) -> bool {
    let lower = text.to_lowercase();
    let words: Vec<&str> = lower
        .split_whitespace()
        .map(|word| word.trim_matches(|c: char| !c.is_alphanumeric()))
        .collect();
    says_also(text) || words.contains(&"another")
}

/// Whether `words` end in an addition's closing word: "too", or "as well" ("Penicillin
/// too", "oat milk as well"), punctuation aside.
pub fn ends_an_addition(words: &[&str]) -> bool {
    let bare = |word: &str| word.trim_matches(|c: char| !c.is_alphanumeric()).to_lowercase();
    match words {
        [.., last] if bare(last) == "too" => true,
        [.., before, last] => bare(last) == "well" && bare(before) == "as",
        _ => false,
    }
}

/// Whether `text` says it comes on top of what holds ("I also started Japanese", "and
/// penicillin too", "as well"): unlike "another", which may name a replacement
/// ("moved to another team"), these never announce one. "Too" counts where it ends a
/// clause ("penicillin too."), not before what it intensifies ("too much with work").
pub fn says_also(text: &str) -> bool {
    let lower = text.to_lowercase();
    let raw: Vec<&str> = lower.split_whitespace().collect();
    raw.iter().enumerate().any(|(index, raw_word)| {
        match raw_word.trim_matches(|c: char| !c.is_alphanumeric()) {
            "also" | "additionally" | "besides" => true,
            "too" => index + 1 == raw.len() || raw_word.ends_with(['.', ',', '!', '?', ';', ')']),
            _ => false,
        }
    }) || contains_phrase(&lower, "as well")
        || contains_phrase(&lower, "in addition")
}

/// Whether `text` presents something as new ("my new ThinkPad", "our new place").
pub fn says_new(text: &str) -> bool {
    text.split_whitespace().any(|word| {
        word.trim_matches(|c: char| !c.is_alphanumeric())
            .eq_ignore_ascii_case("new")
    })
}

/// Whether two texts share a content token (beyond generic words): the same subject.
pub fn shares_subject(left: &str, right: &str) -> bool {
    let left = content_tokens(left);
    let right = content_tokens(right);
    left.iter()
        .any(|token| !is_slot_word(token) && right.contains(token))
}

#[cfg(test)]
mod tests {

    /// The user's own restatement of a value states it, in the forms people say it.
    #[test]
    fn natural_restatements_state_the_value() {
        let table = [
            ("The user lives in Oslo.", "I live in Oslo."),
            ("The user lives in Oslo.", "I'm living in Oslo again"),
            ("The user works as a nurse", "I work as a nurse"),
            ("The user works as a nurse", "I'm working as a nurse these days"),
            ("The user likes hiking", "I like hiking"),
            ("The user loves sneakers", "I love my sneaker collection"),
            ("The user studies chemistry", "I'm studying chemistry"),
            ("The user owns two cats", "I own two cats"),
            ("The user's sister lives in Porto", "My sister lives in Porto"),
            ("The user drives to work", "I drive to work"),
            ("The user married Anna", "I'm married to Anna"),
        ];
        for (value, said) in table {
            assert!(states_value(said, value), "{said:?} states {value:?}");
        }
        let unstated = [
            ("The user lives in Oslo.", "I live in Bergen."),
            ("The user works as a nurse", "I work as a teacher"),
            ("The user likes hiking", "I like swimming"),
        ];
        for (value, said) in unstated {
            assert!(!states_value(said, value), "{said:?} does not state {value:?}");
        }
    }
    use super::*;

    #[test]
    fn a_named_relation_has_slots_of_its_own() {
        let known = relation_names([
            "The user's sister Anna is a nurse.",
            "The user works as a teacher.",
        ]);
        assert_eq!(known.get("anna").map(String::as_str), Some("sister"));
        let hers = slot_among("Anna became a doctor.", &known).map(|slot| slot.name().to_owned());
        let sisters =
            slot_among("The user's sister Anna is a nurse.", &known).map(|slot| slot.name().to_owned());
        let users = slot_among("The user works as a teacher.", &known).map(|slot| slot.name().to_owned());
        assert!(hers.is_some() && hers == sisters, "{hers:?} {sisters:?}");
        assert_ne!(hers, users);
        // A capitalised word that names nobody known leaves the slot as it was.
        assert_eq!(
            slot_among("Python is the user's favourite language.", &known).map(|slot| slot.name().to_owned()),
            slot("Python is the user's favourite language.").map(|slot| slot.name().to_owned())
        );
    }

    #[test]
    fn another_named_value_is_told_apart_from_a_repeated_one() {
        assert!(names_another_value(
            "The user bought a house in Bath with a garden.",
            "The user lives in a one-bed flat in Bristol."
        ));
        assert!(names_another_value(
            "The user's new ThinkPad X1 arrived today, the MacBook goes to their niece.",
            "The user codes on a 2017 MacBook Air."
        ));
        assert!(!names_another_value(
            "The user went to the Louvre in Paris.",
            "The user lives in Paris."
        ));
        assert!(!names_another_value(
            "The user loves hiking.",
            "The user lives in Paris."
        ));
        assert!(says_new("our new place") && !says_new("renewed"));
        assert_eq!(
            companions("Sam and the user broke up last week."),
            HashSet::from(["sam".to_owned()])
        );
        assert!(companions("The user moved to Berlin.").is_empty());
    }

    #[test]
    fn verbs_agree_with_a_third_person_subject() {
        assert_eq!(third_person_verb("love"), "loves");
        assert_eq!(third_person_verb("have"), "has");
        assert_eq!(third_person_verb("watch"), "watches");
        assert_eq!(third_person_verb("study"), "studies");
        assert_eq!(third_person_verb("play"), "plays");
        assert_eq!(third_person_verb("bought"), "bought");
        assert_eq!(third_person_verb("moved"), "moved");
        assert_eq!(third_person_verb("can"), "can");
    }

    #[test]
    fn slots_group_one_attribute() {
        assert_eq!(
            slot("The user lives in Berlin.").map(|s| s.name),
            Some("residence".into())
        );
        assert_eq!(
            slot("The user moved to Lisbon.").map(|s| s.name),
            Some("residence".into())
        );
        assert_eq!(
            slot("The user's favorite color is blue.").map(|s| s.name),
            Some("favourite color".into())
        );
        assert_eq!(
            slot("The user is switching to Puma.").map(|s| s.name),
            Some("footwear".into())
        );
        assert_eq!(
            slot("The user loves Adidas sneakers.").map(|s| s.name),
            Some("footwear".into())
        );
        assert!(slot("The user has a sister.").is_none());
        assert_eq!(
            slot("The user's sister Ana works as an architect.").map(|s| s.name),
            Some("sister: employment".into())
        );
        assert_eq!(
            slot("The user is a nurse at St. Mary's hospital.").map(|s| s.name),
            Some("employment".into())
        );
        assert_eq!(
            slot("The user drinks three espressos a day.").map(|s| s.name),
            Some("coffee".into())
        );
        // Living alone somewhere, moving in with someone, and the end of a job.
        for (text, name) in [
            ("The user lives alone in a studio in Brooklyn.", "residence"),
            ("The user moved in with their boyfriend in Queens.", "residence"),
            ("The user teaches chemistry at a high school.", "employment"),
            ("The user retired as of Friday.", "employment"),
        ] {
            assert_eq!(slot(text).map(|s| s.name), Some(name.into()), "{text}");
        }
    }

    #[test]
    fn a_relationship_that_ends_or_moves_on_outdates_what_the_partner_was_called() {
        assert_eq!(
            partner_change("The user's divorce was finalised last week."),
            Some(PartnerChange::Ended)
        );
        assert_eq!(
            partner_change("Trip's off, Tom and the user split up last month."),
            Some(PartnerChange::Ended)
        );
        assert_eq!(
            partner_change("The user is engaged."),
            Some(PartnerChange::Engaged)
        );
        assert_eq!(partner_change("The user lives in Leeds."), None);
        assert_eq!(
            names_partner("The user's husband Mark handles all their finances."),
            Some("husband")
        );
        assert_eq!(names_partner("The user's sister Anna is a nurse."), None);
        assert!(outdated_partner(PartnerChange::Ended, "husband"));
        assert!(outdated_partner(PartnerChange::Engaged, "girlfriend"));
        assert!(!outdated_partner(PartnerChange::Engaged, "wife"));
        assert!(!outdated_partner(PartnerChange::Married, "husband"));
    }

    #[test]
    fn verb_forms_share_a_root() {
        assert_eq!(root("transferring"), root("transfer"));
        assert_eq!(root("transferred"), "transfer");
        assert_eq!(root("moving"), root("move"));
        assert_eq!(root("moved"), root("moves"));
        assert_eq!(root("falling"), "fall");
        assert_ne!(root("thing"), root("th"));
        assert_eq!(root("bed"), "bed");
    }

    #[test]
    fn a_death_names_who_died_and_a_birth_ends_a_pregnancy() {
        assert_eq!(
            death_of("The user lost Bruno on Sunday."),
            Some("bruno".to_owned())
        );
        assert_eq!(
            death_of("The user had to put Rufus down."),
            Some("rufus".to_owned())
        );
        assert_eq!(
            death_of("The user's dog Bruno died on Sunday."),
            Some("bruno".to_owned())
        );
        assert_eq!(death_of("The user lost their keys."), None);
        assert_eq!(death_of("The user put Anna in touch with a recruiter."), None);
        assert!(tells_a_birth("The user's daughter Ada was born on Tuesday."));
        assert!(holds_a_pregnancy(
            "The user's wife is pregnant with their first, due in March."
        ));
        assert!(!holds_a_pregnancy("The user's report is due."));
    }

    #[test]
    fn the_value_a_change_ends_stops_at_its_clause() {
        let departed = |text: &str| departed_value(text).join(" ");
        assert_eq!(
            departed("The user cancelled Spotify, Apple Music came free with their new phone plan."),
            "spotify"
        );
        assert_eq!(
            departed("No more Sublime for them, Zed does everything."),
            "sublime"
        );
        assert_eq!(departed("The user got rid of the Golf."), "golf");
        assert_eq!(
            departed("After the breach the user exported everything out of LastPass into Bitwarden."),
            "lastpass"
        );
        assert_eq!(
            departed("The user moved the side project off AWS onto a couple of Hetzner boxes."),
            "aws"
        );
        assert_eq!(
            departed("The user put Fedora on the desktop, goodbye Windows."),
            "window"
        );
        assert_eq!(departed("The user ran out of coffee."), "");
        assert!(announces_change("The user is three months smoke-free today."));
        assert!(announces_change(
            "The user started nights this week, rota changed."
        ));
        assert!(!announces_change("The user works day shifts at the hospital."));
    }

    #[test]
    fn the_end_of_a_job_and_a_past_state_are_changes() {
        for text in [
            "The user got laid off yesterday along with half their team.",
            "The user retired as of Friday.",
            "The user used to be vegetarian.",
        ] {
            assert!(announces_change(text), "{text}");
        }
        assert!(!announces_change("The user teaches chemistry at a high school."));
        assert_eq!(
            departed_value("The user used to be vegetarian."),
            vec!["vegetarian"]
        );
        assert_eq!(third_person_verb("used"), "used");
        assert_eq!(third_person_verb("need"), "needs");
    }

    #[test]
    fn a_change_names_the_value_it_replaces() {
        let departed = |text: &str| departed_value(text).join(" ");
        assert_eq!(
            departed("The user's team is switching from Slack to Microsoft Teams."),
            "slack"
        );
        assert_eq!(
            departed("The user's team chose PostgreSQL instead of MongoDB for the rewrite."),
            "mongodb"
        );
        assert_eq!(departed("The user replaced Evernote with Obsidian."), "evernote");
        assert_eq!(departed("The user ditched Chrome for Firefox."), "chrome");
        assert_eq!(
            departed("The user left the Riverside Rowing Club last month."),
            "club riverside rowing"
        );
        assert_eq!(
            departed("The user finally switched to Colemak, QWERTY is behind them."),
            "qwerty"
        );
        assert_eq!(
            departed("The user finished moving CI from Jenkins to GitHub Actions."),
            "jenkin"
        );
        // An end told of the thing itself.
        assert_eq!(departed("The user tore their calf, so Berlin is off."), "berlin");
        assert_eq!(departed("The user's cast came off today."), "cast");
        assert_eq!(
            departed("Cron is retired and every pipeline is a Dagster job now."),
            "cron"
        );
        assert!(departed("The user lives in Porto.").is_empty());
        assert!(departed("The user is switching to Puma.").is_empty());
    }

    #[test]
    fn jaccard_is_one_for_equal_sets_and_falls_with_difference() {
        assert!((jaccard("The user loves tea", "the user LOVES tea!") - 1.0).abs() < 1e-9);
        assert!(jaccard("The user loves tea", "The user loves coffee") < 0.85);
        assert!(jaccard("a b", "c d") < 0.01);
    }

    #[test]
    fn an_addition_is_told_by_also_too_and_as_well_not_by_too_much() {
        assert!(says_also("I also started Japanese on Duolingo"));
        assert!(says_also("Oh and penicillin too, I found out the hard way"));
        assert!(says_also("pottery classes as well"));
        assert!(says_also("spicy ramen too"));
        assert!(!says_also("I dropped the course, too much with work"));
        assert!(!says_also("I moved to another team"));
        assert!(ends_an_addition(&["penicillin", "too,"]));
        assert!(ends_an_addition(&["oat", "milk", "as", "well"]));
        assert!(!ends_an_addition(&["very", "well"]));
        assert!(adds_to("another flat in Leeds"));
        assert!(!adds_to("it was too far to commute"));
    }

    #[test]
    fn distinctive_tokens_are_names_numbers_and_rare_words() {
        assert_eq!(
            distinctive_tokens("The user bought the Nimbus 25 shoes."),
            vec!["nimbus".to_owned(), "25".to_owned()]
        );
        assert!(distinctive_tokens("The user likes tea.").is_empty());
    }
}
