//! The offline pipeline: a deterministic extractor that rewrites first-person user
//! statements as third-person facts, and a deterministic judge that relates a candidate
//! to the facts it is shown by slot (same subject and attribute) and similarity.
//!
//! Neither needs a model download or a network; both are the default when no LLM
//! provider is configured, so the default install consolidates end to end.

use crate::meaning::SlotMeaning;
use crate::{discourse, language};
use cairn_core::{
    CandidateFact, CandidatePlaybook, Embedder, Extraction, ExtractionInput, Extractor, FactType, Judge,
    Judgement, Result, ShownFact, Usage, Verdict,
};
use chrono::{DateTime, Datelike, Duration, Utc, Weekday};
use std::sync::Arc;

/// Rules over the user's own sentences; the assistant context is never read.
#[derive(Clone, Debug, Default)]
pub struct OfflineExtractor;

#[async_trait::async_trait]
impl Extractor for OfflineExtractor {
    fn name(&self) -> &str {
        "offline"
    }

    async fn extract(&self, input: &ExtractionInput) -> Result<Extraction> {
        let mut extraction = Extraction::default();
        let names = known_names(input);
        // The last statement made, for pronouns and fragments that continue it.
        let mut previous: Option<String> = input.earlier.last().and_then(|episode| {
            clauses(&episode.text)
                .iter()
                .rev()
                .find_map(|clause| third_person(&discourse::strip_openers(clause)))
        });
        // What the user spoke of: the scope's known facts and the earlier messages, then
        // each statement of this batch as it is taken.
        let mut known_things: std::collections::HashSet<String> = input
            .known_facts
            .iter()
            .map(|fact| fact.text.as_str())
            .chain(input.earlier.iter().map(|episode| episode.text.as_str()))
            .flat_map(language::content_tokens)
            .collect();
        for episode in &input.episodes {
            // A message that opens as a continuation ("Oh and penicillin too") goes on
            // from the user's statement before it, like a fragment of the same message.
            let mut same_message = discourse::continues(&episode.text);
            for said in clauses(&episode.text) {
                let clause = discourse::restore_subject(&discourse::strip_openers(&said));
                if clause.is_empty() {
                    continue;
                }
                if let Some(playbook) = playbook(&clause) {
                    extraction.playbooks.push(CandidatePlaybook {
                        source_episode_ids: vec![episode.id.clone()],
                        ..playbook
                    });
                    continue;
                }
                let Some(text) = third_person(&clause)
                    .or_else(|| discourse::resolve(&clause, previous.as_deref(), same_message))
                    .or_else(|| acts_on_the_user(&clause))
                    .or_else(|| about_someone_known(&clause, &names))
                    .or_else(|| discourse::about_known_thing(&clause, &known_things))
                    .or_else(|| for_the_user(&clause))
                else {
                    continue;
                };
                known_things.extend(language::content_tokens(&text));
                previous = Some(text.clone());
                same_message = true;
                let lower = said.to_lowercase();
                let expires_in_hours = expiry_hours(&lower, episode.occurred_at);
                let fact_type = classify(&lower, expires_in_hours.is_some());
                let hedged = ["maybe", "might", "probably", "i think", "not sure", "perhaps"]
                    .iter()
                    .any(|word| language::contains_phrase(&lower, word));
                extraction.facts.push(CandidateFact {
                    text,
                    fact_type,
                    confidence: if hedged { 0.6 } else { 0.9 },
                    expires_in_hours,
                    valid_from: None,
                    valid_to: None,
                    source_episode_ids: vec![episode.id.clone()],
                    span: Some(said.clone()),
                });
            }
        }
        Ok(extraction)
    }
}

/// Names the user has used (capitalised words after their sentence's first word), in
/// this batch, the earlier episodes and the known facts.
fn known_names(input: &ExtractionInput) -> std::collections::HashSet<String> {
    let texts = input
        .episodes
        .iter()
        .chain(input.earlier.iter())
        .map(|episode| episode.text.as_str())
        .chain(input.known_facts.iter().map(|fact| fact.text.as_str()));
    let mut names = std::collections::HashSet::new();
    for text in texts {
        for sentence in sentences(text) {
            for word in sentence.split_whitespace().skip(1) {
                let word = word.trim_matches(|c: char| !c.is_alphanumeric());
                if word.chars().next().is_some_and(char::is_uppercase) && word.len() > 1 && word != "I" {
                    names.insert(word.to_owned());
                }
            }
        }
    }
    names
}

/// A statement about someone or something the user named before ("Biscuit is a
/// beagle"), kept as it was said.
fn about_someone_known(clause: &str, names: &std::collections::HashSet<String>) -> Option<String> {
    let words: Vec<&str> = clause.split_whitespace().collect();
    let first = words.first()?.trim_matches(|c: char| !c.is_alphanumeric());
    let verb = words.get(1)?.to_lowercase();
    if words.len() < 3 || !names.contains(first) || language::is_first_person_start(&verb) {
        return None;
    }
    let text = clause.trim().trim_end_matches([',', ':']);
    Some(format!("{text}."))
}

/// Splits a message into statements: sentences, then clauses joined by a conjunction
/// that starts a new first-person statement ("... and I ...", "..., but my ...").
pub fn clauses(text: &str) -> Vec<String> {
    let mut result = Vec::new();
    for sentence in announced(sentences(&discourse::plain_chat(text))) {
        let sentence = sentence.trim();
        // A statement that ends in a short question ("Planning my move to Amsterdam next
        // month, any tips?") keeps the statement.
        let sentence = match sentence
            .strip_suffix('?')
            .and_then(|asked| asked.rsplit_once(','))
        {
            Some((statement, question))
                if question.split_whitespace().count() <= 4
                    && statement.split_whitespace().count() >= 3
                    && !statement
                        .split_whitespace()
                        .next()
                        .is_some_and(language::opens_question) =>
            {
                statement.trim()
            }
            _ => sentence,
        };
        // A question says nothing about the user, except what it takes for granted
        // ("... on my new Framework laptop?").
        let asked = match sentence.rfind('?') {
            Some(index) => &sentence[..index],
            None => "",
        };
        result.extend(asked.split('?').filter_map(taken_for_granted));
        if sentence.is_empty() || sentence.ends_with('?') {
            continue;
        }
        // Questions inside a longer message end at their question mark.
        let sentence = match sentence.rfind('?') {
            Some(index) => sentence[index + 1..].trim(),
            None => sentence,
        };
        let words: Vec<&str> = sentence.split_whitespace().collect();
        let mut current: Vec<&str> = Vec::new();
        for (index, word) in words.iter().enumerate() {
            let bare = word.trim_matches(',').to_lowercase();
            let next = words.get(index + 1).map(|next| next.to_lowercase());
            let starts_statement = next.as_deref().is_some_and(language::is_first_person_start);
            let conjunction = matches!(
                bare.as_str(),
                "and" | "but" | "so" | "although" | "though" | "while"
            );
            // "My boyfriend Sam and I live ...", "Sam and I broke up": one statement with
            // a compound subject.
            // After a lead-in ("Trip's off, Tom and I split up"), the subject is what
            // follows its comma.
            let subject = match current.iter().rposition(|word| word.ends_with(',')) {
                Some(comma) => &current[comma + 1..],
                None => &current[..],
            };
            let compound_subject = bare == "and"
                && !subject.is_empty()
                && subject.len() <= 3
                && (subject
                    .first()
                    .is_some_and(|first| matches!(first.to_lowercase().as_str(), "my" | "our"))
                    || subject
                        .iter()
                        .all(|word| word.chars().next().is_some_and(char::is_uppercase)));
            // "I'm 34, I rent a one-bed in Leeds": a statement of the user's, then another
            // after a comma.
            // (after a heading ending in a colon, the statement opens after it).
            let user_speaks = |word: &str| {
                matches!(
                    word.to_lowercase().replace('’', "'").trim_matches(','),
                    "i" | "i'm" | "i've" | "i'd" | "we" | "we're" | "we've"
                )
            };
            let opener = match current.iter().rposition(|word| word.ends_with(':')) {
                Some(heading) => current.get(heading + 1),
                None => current.first(),
            };
            // A statement with its subject left out opens with its verb ("Handed in my
            // notice at Boots, I'm doing locum shifts").
            let subjectless = |word: &str| {
                let word = discourse::bare(word);
                language::is_past_tense(&word) && !matches!(word.as_str(), "was" | "were" | "had" | "did")
            };
            let after_statement = word.ends_with(',')
                && opener.is_some_and(|opener| {
                    user_speaks(opener) || (subjectless(opener) && !current.is_empty())
                })
                && next.as_deref().is_some_and(user_speaks);
            if after_statement {
                current.push(word);
                result.push(current.join(" ").trim_end_matches(',').to_owned());
                current.clear();
                continue;
            }
            if conjunction && starts_statement && !current.is_empty() && !compound_subject {
                result.push(current.join(" ").trim_end_matches(',').to_owned());
                current.clear();
                continue;
            }
            // "I live in Porto and work as a nurse": a second statement whose subject is
            // left out; it becomes one of its own, so each holds its own slot.
            if let Some(subject) = elided_subject(&current, &bare, &words[index + 1..]) {
                result.push(current.join(" ").trim_end_matches(',').to_owned());
                current.clear();
                current.push(subject);
                continue;
            }
            current.push(word);
            // "Penicillin too, I found out the hard way": an addition ends its clause.
            if word.ends_with(',') && starts_statement && language::ends_an_addition(&current) {
                result.push(current.join(" ").trim_end_matches(',').to_owned());
                current.clear();
            }
        }
        if !current.is_empty() {
            result.push(current.join(" ").trim_end_matches(',').to_owned());
        }
    }
    result.retain(|clause| !clause.is_empty());
    result
}

/// Verbs in their base form that open a second statement of the user's after "and" or
/// "but" with the subject left out ("... and work as a nurse", "... and have a cat").
const SECOND_STATEMENT_VERBS: &[&str] = &[
    "work",
    "live",
    "study",
    "teach",
    "train",
    "own",
    "rent",
    "drive",
    "ride",
    "use",
    "have",
    "love",
    "like",
    "hate",
    "prefer",
    "enjoy",
    "play",
    "eat",
    "drink",
    "speak",
    "run",
    "swim",
    "climb",
    "cycle",
    "walk",
    "cook",
    "bake",
    "write",
    "read",
    "listen",
    "watch",
    "code",
    "manage",
    "lead",
    "coach",
    "volunteer",
    "attend",
    "commute",
    "share",
    "keep",
    "need",
    "want",
    "plan",
    "practise",
    "practice",
    "go",
    "visit",
    "support",
    "follow",
    "avoid",
    "take",
    "wear",
    "sing",
    "paint",
    "draw",
    "design",
    "care",
    "look",
    "raise",
    "grow",
    "collect",
    "host",
    "belong",
    "know",
    "make",
];

/// The subject to restore when `conjunction` opens a second statement of the user's
/// whose subject is left out: "I live in Porto and work as a nurse" (a base-form verb
/// after a clause opened by "I" or "we" that says something), or "I moved to Lisbon
/// and started at a clinic" (a past tense after a clause whose verb is past too). A
/// verb ending the sentence ("I balance family and work") is no statement.
fn elided_subject(current: &[&str], conjunction: &str, rest: &[&str]) -> Option<&'static str> {
    if !matches!(conjunction, "and" | "but") || rest.len() < 2 {
        return None;
    }
    let opener = current
        .first()?
        .to_lowercase()
        .replace('’', "'")
        .trim_matches(',')
        .to_owned();
    // A clause of two words says something when its opener holds the verb ("I'm vegan").
    let (subject, shortest) = match opener.as_str() {
        "i" => ("I", 3),
        "i'm" | "i've" => ("I", 2),
        "we" => ("We", 3),
        "we're" | "we've" => ("We", 2),
        _ => return None,
    };
    if current.len() < shortest {
        return None;
    }
    // Only a clause with no comma inside: after one, what follows may belong to a list.
    if current.iter().any(|word| word.ends_with(',')) {
        return None;
    }
    let next = discourse::bare(rest.first()?);
    let verb_of_clause = current
        .iter()
        .skip(1)
        .map(|word| discourse::bare(word))
        .find(|word| !language::is_adverb(word));
    let past = |word: &str| language::is_past_tense(word) && !matches!(word, "was" | "were" | "had" | "did");
    let base = SECOND_STATEMENT_VERBS.contains(&next.as_str());
    let past_after_past = past(&next) && verb_of_clause.as_deref().is_some_and(past);
    (base || past_after_past).then_some(subject)
}

/// What a question takes for granted about the user: a new thing of theirs ("What
/// settings should I use on my new Framework laptop" → "I have a new Framework
/// laptop"; its names, then the one noun they qualify), or `None`.
fn taken_for_granted(question: &str) -> Option<String> {
    const ENDS: &[&str] = &[
        "to", "of", "in", "on", "with", "for", "about", "at", "from", "by", "and", "or", "but", "is", "was",
        "be", "that", "if", "when", "so",
    ];
    let words: Vec<&str> = question.split_whitespace().collect();
    let at = words
        .windows(2)
        .position(|pair| pair[0].eq_ignore_ascii_case("my") && pair[1].eq_ignore_ascii_case("new"))?;
    let mut thing = Vec::new();
    for word in &words[at + 2..] {
        let bare = word.trim_matches(|c: char| !c.is_alphanumeric() && c != '-');
        if bare.is_empty() || ENDS.contains(&bare.to_lowercase().as_str()) {
            break;
        }
        thing.push(bare);
        // Names, then the noun they qualify ("Framework laptop", "puppy").
        let named = bare.chars().next().is_some_and(char::is_uppercase);
        if !named || thing.len() >= 4 || word.ends_with([',', ';', ':']) {
            break;
        }
    }
    (!thing.is_empty()).then(|| format!("I have a new {}", thing.join(" ")))
}

/// A news headline of the user's own and what it is, said as two sentences ("new job!
/// backend dev at stripe") made one statement ("My new job is backend dev at stripe").
fn announced(sentences: Vec<String>) -> Vec<String> {
    let mut result: Vec<String> = Vec::with_capacity(sentences.len());
    let mut sentences = sentences.into_iter().peekable();
    while let Some(sentence) = sentences.next() {
        let words: Vec<String> = sentence
            .split_whitespace()
            .map(|word| word.trim_matches(|c: char| !c.is_alphanumeric()).to_lowercase())
            .collect();
        let headline = match words.as_slice() {
            [new, noun] | [_, new, noun] if new == "new" => {
                (words.len() == 2 || words[0] == "my")
                    && !matches!(noun.as_str(), "year" | "week" | "month" | "day" | "me")
            }
            _ => false,
        };
        let told = sentences.peek().is_some_and(|next| {
            let first = next.split_whitespace().next().unwrap_or_default();
            let opener = discourse::bare(first).replace('’', "'");
            // A sentence with a subject of its own says something else about it.
            let own_subject = matches!(
                opener.as_str(),
                "it" | "it's"
                    | "he"
                    | "he's"
                    | "she"
                    | "she's"
                    | "they"
                    | "they're"
                    | "this"
                    | "that"
                    | "there"
                    | "there's"
            );
            !own_subject
                && !next.trim().is_empty()
                && !next.trim_end().ends_with('?')
                && !language::is_first_person_start(&first.to_lowercase())
                && !language::opens_question(first)
        });
        match sentences.next_if(|_| headline && told) {
            Some(what) => {
                let thing = words[words.len() - 1].clone();
                result.push(format!("My new {thing} is {}", what.trim()));
            }
            None => result.push(sentence),
        }
    }
    result
}

/// Sentences of a message: split at `.`, `!`, `;` and line breaks, except after a
/// common abbreviation ("St. Mary's", "Dr. Lee") or inside a number ("5.1").
fn sentences(text: &str) -> Vec<String> {
    const ABBREVIATIONS: &[&str] = &[
        "st", "dr", "mr", "mrs", "ms", "jr", "sr", "vs", "e.g", "i.e", "etc", "mt", "no",
    ];
    let mut result = Vec::new();
    let mut current = String::new();
    let chars: Vec<char> = text.chars().collect();
    for (index, &c) in chars.iter().enumerate() {
        let ends = match c {
            '!' | ';' | '\n' => true,
            '.' => {
                let word: String = current
                    .chars()
                    .rev()
                    .take_while(|c| c.is_alphanumeric() || *c == '.')
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect();
                let next = chars.get(index + 1).copied();
                let in_number = word.chars().last().is_some_and(|c| c.is_ascii_digit())
                    && next.is_some_and(|c| c.is_ascii_digit());
                !(in_number || ABBREVIATIONS.contains(&word.to_lowercase().as_str()))
            }
            _ => false,
        };
        if ends {
            result.push(std::mem::take(&mut current));
        } else {
            current.push(c);
        }
    }
    result.push(current);
    result
}

/// The clause rewritten about the user in the third person, or `None` when it says
/// nothing about the user (small talk, thanks, a question, a request to the assistant).
pub fn third_person(clause: &str) -> Option<String> {
    let words: Vec<&str> = clause.split_whitespace().collect();
    let lower: Vec<String> = words
        .iter()
        .map(|word| {
            word.trim_matches(|c: char| !c.is_alphanumeric() && c != '\'' && c != '’')
                .to_lowercase()
        })
        .collect();
    // A statement about the user has the user as a subject or owner ("I", "my",
    // "we"), not only as an object ("sounds good to me").
    if !lower.iter().any(|word| language::is_first_person_start(word)) {
        return None;
    }
    // Requests and politeness addressed to the assistant are not statements about the user.
    let opening = lower.first().map(String::as_str).unwrap_or_default();
    if matches!(
        opening,
        "please" | "can" | "could" | "would" | "thanks" | "thank" | "ok" | "okay"
    ) && !lower
        .iter()
        .skip(1)
        .any(|word| matches!(word.as_str(), "i" | "i'm" | "my"))
    {
        return None;
    }
    // Two words can state something ("I'm vegetarian"), or only acknowledge ("I see").
    let acknowledgement = lower.len() == 2
        && matches!(
            lower[1].as_str(),
            "see"
                | "know"
                | "agree"
                | "think"
                | "guess"
                | "understand"
                | "fine"
                | "good"
                | "ok"
                | "okay"
                | "sure"
                | "bet"
                | "mean"
                | "suppose"
                | "hope"
                | "wonder"
                | "do"
                | "am"
                | "will"
                | "can"
                | "did"
        );
    if lower.len() < 2 || acknowledgement {
        return None;
    }
    let mut out: Vec<String> = Vec::new();
    let mut conjugate_next = false;
    let mut index = 0;
    while index < words.len() {
        let word = words[index];
        let bare = lower[index].replace('’', "'");
        let trailing: String = word
            .chars()
            .rev()
            .take_while(|c| matches!(c, ',' | ':' | ')' | '"'))
            .collect();
        let next = lower.get(index + 1).map(String::as_str);
        let replacement: Option<Vec<&str>> = match bare.as_str() {
            "i'm" | "im" => Some(vec!["the user is"]),
            "i've" => Some(vec!["the user has"]),
            "i'd" => Some(vec!["the user would"]),
            "i'll" => Some(vec!["the user will"]),
            "i" | "we" => match next {
                Some("am") | Some("are") => {
                    index += 1;
                    Some(vec!["the user is"])
                }
                Some("was") | Some("were") => {
                    index += 1;
                    Some(vec!["the user was"])
                }
                Some("have") => {
                    index += 1;
                    Some(vec!["the user has"])
                }
                Some("do") => {
                    index += 1;
                    Some(vec!["the user does"])
                }
                Some("don't") | Some("dont") | Some("don’t") => {
                    index += 1;
                    Some(vec!["the user doesn't"])
                }
                _ => {
                    conjugate_next = true;
                    Some(vec!["the user"])
                }
            },
            "we're" => Some(vec!["the user is"]),
            "we've" => Some(vec!["the user has"]),
            // Once "the user" is the subject, later mentions read "their" and "them".
            "my" | "our" if out.is_empty() => Some(vec!["the user's"]),
            "my" | "our" => Some(vec!["their"]),
            "mine" | "ours" => Some(vec!["theirs"]),
            "me" | "us" => Some(vec!["them"]),
            "myself" => Some(vec!["themselves"]),
            _ => None,
        };
        match replacement {
            Some(parts) => {
                out.push(format!(
                    "{}{}",
                    parts.join(" "),
                    trailing.chars().rev().collect::<String>()
                ));
            }
            None if conjugate_next => {
                if language::is_adverb(&bare) {
                    out.push(word.to_owned());
                } else {
                    conjugate_next = false;
                    let stripped = word.trim_end_matches([',', ':']);
                    out.push(format!(
                        "{}{}",
                        language::third_person_verb(stripped),
                        trailing.chars().rev().collect::<String>()
                    ));
                }
            }
            None => out.push(word.to_owned()),
        }
        index += 1;
    }
    let mut text = out.join(" ");
    // Openers that carry no content ("Yeah, ...", "Well ...", "Actually ...").
    loop {
        let trimmed = text.trim_start();
        let Some(first) = trimmed.split_whitespace().next() else {
            break;
        };
        let bare = first.trim_matches(|c: char| !c.is_alphanumeric()).to_lowercase();
        if !matches!(
            bare.as_str(),
            "yeah"
                | "yes"
                | "well"
                | "so"
                | "actually"
                | "oh"
                | "also"
                | "btw"
                | "anyway"
                | "hey"
                | "hi"
                | "ok"
                | "okay"
        ) {
            break;
        }
        text = trimmed[first.len()..].to_owned();
    }
    discourse::as_sentence(text.trim().trim_end_matches([',', ':']))
}

/// A statement of what someone did to the user ("Ocado made me permanent today",
/// "physio signed me off today"): "me" right after a past tense, no "I" in it, and not
/// a request or a question. The user's words in it become the user's ("The physio
/// signed the user off today."); `None` for anything else.
fn acts_on_the_user(clause: &str) -> Option<String> {
    let words: Vec<&str> = clause.split_whitespace().collect();
    let lower: Vec<String> = words.iter().map(|word| discourse::bare(word)).collect();
    let at = lower
        .windows(2)
        .position(|pair| language::is_past_tense(&pair[0]) && pair[1] == "me")?;
    let opening = lower.first().map(String::as_str).unwrap_or_default();
    if language::opens_question(opening)
        || matches!(
            opening,
            "please" | "thanks" | "thank" | "can" | "could" | "would" | "will"
        )
        || lower
            .iter()
            .any(|word| language::is_first_person_start(word) && word != "my")
        || at == 0
    {
        return None;
    }
    let out: Vec<String> = words
        .iter()
        .zip(&lower)
        .map(|(word, bare)| {
            let ending = &word[word.trim_end_matches(|c: char| !c.is_alphanumeric()).len()..];
            match bare.as_str() {
                "me" => format!("the user{ending}"),
                "my" => format!("their{ending}"),
                "mine" => format!("theirs{ending}"),
                "myself" => format!("themselves{ending}"),
                _ => (*word).to_owned(),
            }
        })
        .collect();
    discourse::as_sentence(out.join(" ").trim().trim_end_matches([',', ':', '.', '!']))
}

/// A statement that holds "for me" without the user as its subject ("it's swimming
/// instead of running for me now"), about the user; `None` for anything else, and for
/// a request ("can you find one for me").
fn for_the_user(clause: &str) -> Option<String> {
    let words: Vec<&str> = clause.split_whitespace().collect();
    let lower: Vec<String> = words
        .iter()
        .map(|word| word.trim_matches(|c: char| !c.is_alphanumeric()).to_lowercase())
        .collect();
    let at = lower
        .windows(2)
        .position(|pair| pair[0] == "for" && pair[1] == "me")?;
    let opening = lower.first().map(String::as_str).unwrap_or_default();
    if language::opens_question(opening)
        || matches!(opening, "please" | "thanks" | "thank")
        || lower.len() < 4
    {
        return None;
    }
    let mut out: Vec<String> = words.iter().map(|word| (*word).to_owned()).collect();
    out[at + 1] = out[at + 1].replacen("me", "the user", 1);
    discourse::as_sentence(out.join(" ").trim().trim_end_matches([',', ':', '.', '!']))
}

/// Hours until a time-bound statement stops being true, counted from when it was said.
pub fn expiry_hours(lower: &str, said_at: DateTime<Utc>) -> Option<f64> {
    let fixed = [
        ("tonight", 24.0),
        ("today", 24.0),
        ("this morning", 24.0),
        ("this afternoon", 24.0),
        ("this evening", 24.0),
        ("right now", 24.0),
        ("tomorrow", 48.0),
        ("this weekend", 96.0),
        ("this week", 168.0),
        ("next week", 336.0),
        ("this month", 744.0),
        ("next month", 1488.0),
    ];
    for (phrase, hours) in fixed {
        if language::contains_phrase(lower, phrase) {
            return Some(hours);
        }
    }
    let words: Vec<&str> = lower
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    let until_end_of = |days_ahead: i64| -> Option<f64> {
        let end_of_day = said_at.date_naive() + Duration::days(days_ahead + 1);
        let end = end_of_day.and_hms_opt(0, 0, 0)?.and_utc();
        Some(((end - said_at).num_minutes() as f64 / 60.0).max(1.0))
    };
    if language::contains_phrase(lower, "end of the month")
        || language::contains_phrase(lower, "end of month")
    {
        let next_month = said_at
            .date_naive()
            .with_day(1)?
            .checked_add_months(chrono::Months::new(1))?;
        return until_end_of((next_month - said_at.date_naive()).num_days() - 1);
    }
    for (index, word) in words.iter().enumerate() {
        // A day named for an event ("on Sunday", "this Friday", "next Tuesday", "until
        // Thursday", "due Monday"), resolved against when it was said: through the end
        // of that day ("next" is the one after the coming one).
        if let Some(day) = weekday(word)
            && index > 0
            && matches!(
                words[index - 1],
                "on" | "this" | "next" | "by" | "until" | "till" | "til" | "due" | "before" | "coming"
            )
        {
            let today = said_at.weekday().num_days_from_monday() as i64;
            let target = day.num_days_from_monday() as i64;
            let mut days_ahead = (target - today).rem_euclid(7);
            if words[index - 1] == "next" {
                days_ahead += 7;
            }
            return until_end_of(days_ahead);
        }
        // "in two weeks", "in 3 days": the event is then, and over after it.
        if *word == "in"
            && let (Some(count), Some(unit)) = (
                words.get(index + 1).and_then(|n| language::number(n)),
                words.get(index + 2),
            )
        {
            let hours = match unit.trim_end_matches('s') {
                "day" => 24.0,
                "week" => 168.0,
                "month" => 744.0,
                _ => continue,
            };
            return Some(count * hours + 24.0);
        }
        // "for the next 3 days", "for 2 weeks".
        if *word == "for" {
            let rest = &words[index + 1..];
            let rest = if rest.first() == Some(&"the") {
                &rest[1..]
            } else {
                rest
            };
            let rest = if rest.first() == Some(&"next") {
                &rest[1..]
            } else {
                rest
            };
            if let (Some(count), Some(unit)) = (rest.first().and_then(|n| language::number(n)), rest.get(1)) {
                let hours = match unit.trim_end_matches('s') {
                    "hour" => 1.0,
                    "day" => 24.0,
                    "week" => 168.0,
                    "month" => 744.0,
                    _ => continue,
                };
                return Some(count * hours);
            }
        }
    }
    None
}

fn weekday(word: &str) -> Option<Weekday> {
    match word {
        "monday" => Some(Weekday::Mon),
        "tuesday" => Some(Weekday::Tue),
        "wednesday" => Some(Weekday::Wed),
        "thursday" => Some(Weekday::Thu),
        "friday" => Some(Weekday::Fri),
        "saturday" => Some(Weekday::Sat),
        "sunday" => Some(Weekday::Sun),
        _ => None,
    }
}

/// The fact type of a first-person clause.
pub fn classify(lower: &str, time_bound: bool) -> FactType {
    let any = |words: &[&str]| words.iter().any(|word| language::contains_phrase(lower, word));
    if time_bound {
        return FactType::Event;
    }
    if any(&[
        "allergic",
        "allergy",
        "intolerant",
        "vegetarian",
        "vegan",
        "pescatarian",
        "gluten",
        "diet",
        "can't eat",
        "cannot eat",
        "don't eat",
        "do not eat",
        "no longer eat",
        "avoid",
        "kosher",
        "halal",
        "budget",
        "can't have",
        "sober",
        "keto",
    ]) {
        return FactType::Constraint;
    }
    if any(&[
        "love",
        "loves",
        "like",
        "likes",
        "prefer",
        "enjoy",
        "hate",
        "dislike",
        "favorite",
        "favourite",
        "fan of",
        "into",
        "switching to",
        "switched to",
        "switch to",
        "can't stand",
        "rather",
        "obsessed",
    ]) {
        return FactType::Preference;
    }
    if any(&[
        "my name",
        "years old",
        "live in",
        "living in",
        "moved to",
        "moving to",
        "relocated",
        "work at",
        "work for",
        "work as",
        "job",
        "born",
        "married",
        "wife",
        "husband",
        "partner",
        "daughter",
        "son",
        "kids",
        "children",
        "i'm from",
        "i am from",
        "grew up",
        "engineer",
        "teacher",
        "nurse",
        "doctor",
        "student",
        "studying",
        "retired",
        "girlfriend",
        "boyfriend",
        "pronouns",
    ]) {
        return FactType::Identity;
    }
    let first_words: Vec<&str> = lower.split_whitespace().take(4).collect();
    if first_words.iter().any(|word| language::is_past_tense(word)) {
        return FactType::Event;
    }
    FactType::World
}

/// "When X, I first A, then B, then C" or "my routine for X: A, B, C": a procedure
/// the user follows, kept as a playbook candidate when it has at least two steps.
pub fn playbook(clause: &str) -> Option<CandidatePlaybook> {
    let lower = clause.to_lowercase();
    let (trigger, body) = if let Some(rest) = lower
        .strip_prefix("whenever ")
        .or_else(|| lower.strip_prefix("when "))
        .or_else(|| lower.strip_prefix("every time "))
    {
        let comma = rest.find(',')?;
        (
            rest[..comma].trim().to_owned(),
            rest[comma + 1..].trim().to_owned(),
        )
    } else if let Some(position) = lower
        .find("my routine for ")
        .or_else(|| lower.find("my process for "))
    {
        let rest = &lower[position + 15..];
        let colon = rest.find([':', ','])?;
        (
            rest[..colon].trim().to_owned(),
            rest[colon + 1..].trim().to_owned(),
        )
    } else {
        return None;
    };
    let body = body.trim_start_matches("i ").trim_start_matches("first ");
    let steps: Vec<String> = body
        .split(", then ")
        .flat_map(|part| part.split(" then "))
        .flat_map(|part| part.split(", and "))
        .flat_map(|part| part.split(", "))
        .map(|step| {
            step.trim()
                .trim_start_matches("i ")
                .trim_start_matches("then ")
                .trim()
                .to_owned()
        })
        .filter(|step| !step.is_empty())
        .collect();
    if steps.len() < 2 || trigger.is_empty() {
        return None;
    }
    Some(CandidatePlaybook {
        name: format!("When {trigger}"),
        trigger,
        steps,
        confidence: 0.8,
        source_episode_ids: Vec::new(),
    })
}

/// Same-slot detection plus similarity, with no language model; with the embedding
/// model, slots are also matched by meaning (see `meaning`).
#[derive(Clone, Debug, Default)]
pub struct OfflineJudge {
    meaning: Option<Arc<SlotMeaning>>,
}

impl OfflineJudge {
    /// The judge that also matches single-valued slots by meaning with `embedder`.
    pub fn with_embedder(embedder: Arc<dyn Embedder>) -> Self {
        OfflineJudge {
            meaning: Some(Arc::new(SlotMeaning::new(embedder))),
        }
    }

    /// A change whose statement is, by meaning, in the same single-valued slot as a
    /// lasting fact shown ("ported my number to Lebara" against "on a Vodafone
    /// contract") replaces it, unless it repeats the fact's value. Meaning alone does
    /// not tell whose slot it is or whether the value changed, so both statements must
    /// be about the user alone, and the candidate must say it changed ("now",
    /// "switched", ...) or name another value than the fact ("Lebara" for "Vodafone"):
    /// "started volunteering at a food bank" does not end a job.
    async fn same_slot_by_meaning<'a>(
        &self,
        candidate: &CandidateFact,
        lasting: &[&'a ShownFact],
    ) -> Result<Option<(&'a ShownFact, &'static str)>> {
        let Some(meaning) = &self.meaning else {
            return Ok(None);
        };
        let announced = language::announces_change(&candidate.text);
        let lasting: Vec<&'a ShownFact> = lasting
            .iter()
            .copied()
            .filter(|shown_fact| {
                !language::mentions_someone(&shown_fact.fact.text)
                    && (announced || language::names_another_value(&candidate.text, &shown_fact.fact.text))
            })
            .collect();
        if lasting.is_empty() || language::mentions_someone(&candidate.text) {
            return Ok(None);
        }
        let texts: Vec<&str> = std::iter::once(candidate.text.as_str())
            .chain(lasting.iter().map(|shown_fact| shown_fact.fact.text.as_str()))
            .collect();
        let slots = meaning.slots(&texts).await?;
        let Some(Some(slot)) = slots.first() else {
            return Ok(None);
        };
        Ok(lasting.iter().zip(&slots[1..]).find_map(|(shown_fact, theirs)| {
            let repeats = language::repeats_value(&candidate.text, &shown_fact.fact.text);
            (*theirs == Some(*slot) && !repeats).then_some((*shown_fact, *slot))
        }))
    }
}

/// Below this similarity an unrelated-slot fact is not treated as the same subject.
const EXTENDS_SIMILARITY: f32 = 0.75;

/// At or above this similarity, a change told as an event replaces a lasting fact.
const CHANGE_SIMILARITY: f32 = 0.45;
/// The same, when the change names another value than the fact ("ported my number to
/// Lebara" against "on a Vodafone contract").
const NAMED_CHANGE_SIMILARITY: f32 = 0.35;

#[async_trait::async_trait]
impl Judge for OfflineJudge {
    fn name(&self) -> &str {
        "offline"
    }

    async fn judge(&self, candidate: &CandidateFact, shown: &[ShownFact]) -> Result<Judgement> {
        let judgement = |verdict: Verdict, reason: String| Judgement {
            verdict,
            reason,
            usage: Usage::default(),
        };
        // Slots are per person: someone the user named by a relation has their own.
        let known = language::relation_names(
            shown
                .iter()
                .map(|shown_fact| shown_fact.fact.text.as_str())
                .chain([candidate.text.as_str()]),
        );
        let candidate_slot = language::slot_among(&candidate.text, &known);
        let changing = language::announces_change(&candidate.text);
        let mut ranked: Vec<&ShownFact> = shown.iter().collect();
        ranked.sort_by(|a, b| {
            b.similarity
                .unwrap_or(0.0)
                .total_cmp(&a.similarity.unwrap_or(0.0))
        });
        // A change that names the value it replaces ("from X", "instead of X", "left X")
        // supersedes the shown fact holding that value, slot or not; a lasting fact
        // before an event about the same thing.
        let departed = language::departed_value(&candidate.text);
        if !departed.is_empty() {
            let holders: Vec<&&ShownFact> = ranked
                .iter()
                .filter(|shown_fact| {
                    // Not an earlier statement of the same departure.
                    let theirs = language::departed_value(&shown_fact.fact.text);
                    let old = language::content_tokens(&shown_fact.fact.text);
                    departed.iter().all(|token| old.contains(token))
                        && (theirs.is_empty() || !theirs.iter().all(|token| departed.contains(token)))
                })
                .collect();
            let holder = holders
                .iter()
                .find(|shown_fact| shown_fact.fact.fact_type != FactType::Event)
                .or(holders.first());
            if let Some(holder) = holder {
                return Ok(judgement(
                    Verdict::Updates(holder.alias.clone()),
                    // The reason outlives the fact it replaces (a decision is kept when
                    // the fact is forgotten): it names no word of the old value.
                    "the statement names the value it replaces".to_owned(),
                ));
            }
        }
        // A change the user announces together with someone named in a lasting fact ("Sam
        // and I broke up" against "my boyfriend Sam and I live together") ends that fact.
        if changing {
            let named = language::companions(&candidate.text);
            if let Some(holder) = ranked.iter().find(|shown_fact| {
                shown_fact.fact.fact_type != FactType::Event
                    && !named.is_empty()
                    && language::names(&shown_fact.fact.text)
                        .iter()
                        .any(|name| named.contains(name))
            }) {
                return Ok(judgement(
                    Verdict::Updates(holder.alias.clone()),
                    "a change announced about a name the fact holds".to_owned(),
                ));
            }
        }
        // A death ends what was current about the one who died ("we lost Bruno on
        // Sunday" against "Bruno sleeps under my desk"); a birth ends a pregnancy.
        let died = language::death_of(&candidate.text);
        let born = language::tells_a_birth(&candidate.text);
        if (died.is_some() || born)
            && let Some(holder) = ranked.iter().find(|shown_fact| {
                shown_fact.fact.fact_type != FactType::Event
                    && (died
                        .as_ref()
                        .is_some_and(|name| language::names(&shown_fact.fact.text).contains(name))
                        || (born && language::holds_a_pregnancy(&shown_fact.fact.text)))
            })
        {
            return Ok(judgement(
                Verdict::Updates(holder.alias.clone()),
                "a death or a birth ends what the fact held".to_owned(),
            ));
        }
        // A relationship of the user's that ended ("the divorce was finalised") or moved on
        // ("we're engaged") outdates the lasting fact that calls the partner by what
        // they no longer are ("my husband Mark ...", "my girlfriend Priya ...").
        if let Some(change) = language::partner_change(&candidate.text)
            && !language::mentions_someone(&candidate.text)
            && let Some(holder) = ranked.iter().find(|shown_fact| {
                shown_fact.fact.fact_type != FactType::Event
                    && language::names_partner(&shown_fact.fact.text)
                        .is_some_and(|partner| language::outdated_partner(change, partner))
            })
        {
            return Ok(judgement(
                Verdict::Updates(holder.alias.clone()),
                "a change of relationship outdates what the partner was called".to_owned(),
            ));
        }
        // A change to another kind of the same thing ("transferred to the search team"
        // against "on the ads team", "night shifts" against "day shifts") replaces the
        // lasting fact that held the old kind, unless the candidate still names it.
        if language::tells_a_change(&candidate.text) {
            let kinds = language::qualified_nouns(&candidate.text);
            let candidate_words = language::content_tokens(&candidate.text);
            for shown_fact in &ranked {
                if shown_fact.fact.fact_type == FactType::Event {
                    continue;
                }
                let replaced =
                    language::qualified_nouns(&shown_fact.fact.text)
                        .into_iter()
                        .find(|(noun, old)| {
                            !candidate_words.contains(old)
                                && kinds.iter().any(|(new_noun, new)| new_noun == noun && new != old)
                        });
                if let Some((noun, _)) = replaced {
                    return Ok(judgement(
                        Verdict::Updates(shown_fact.alias.clone()),
                        // No word of the old value: the reason outlives the fact.
                        format!("a change from one {noun} to another"),
                    ));
                }
            }
        }
        // A change in a single-valued slot named by meaning, not by the word lists.
        // A statement that says it comes on top ("I also started Japanese") replaces
        // nothing by meaning alone.
        let also = language::says_also(&candidate.text);
        // A slot the word lists name for the candidate but for no fact shown ("moved in
        // with ..." against "lives alone in a studio ...") is matched by meaning too.
        // The shown fact most similar to the candidate among those in its slot.
        // A lasting fact before an event in the same slot.
        let in_slot: Option<&ShownFact> = candidate_slot.as_ref().and_then(|slot| {
            let mut holders = ranked.iter().copied().filter(|shown_fact| {
                language::slot_among(&shown_fact.fact.text, &known).as_ref() == Some(slot)
            });
            let first = holders.next()?;
            Some(
                std::iter::once(first)
                    .chain(holders)
                    .find(|shown_fact| shown_fact.fact.fact_type != FactType::Event)
                    .unwrap_or(first),
            )
        });
        if in_slot.is_none()
            && !also
            && (changing || language::tells_a_change(&candidate.text) || language::says_new(&candidate.text))
        {
            let lasting: Vec<&ShownFact> = ranked
                .iter()
                .copied()
                .filter(|shown_fact| shown_fact.fact.fact_type != FactType::Event)
                .collect();
            if let Some((holder, slot)) = self.same_slot_by_meaning(candidate, &lasting).await? {
                return Ok(judgement(
                    Verdict::Updates(holder.alias.clone()),
                    format!("same {slot} slot by meaning; a change to another value"),
                ));
            }
        }
        // A change told as an event ("today was my first day at Datadog", "we broke
        // up") replaces the lasting fact closest to it in meaning, when that is close.
        if language::tells_a_change(&candidate.text)
            && !also
            && let Some(closest) = ranked
                .iter()
                .find(|shown_fact| shown_fact.fact.fact_type != FactType::Event)
            && closest.similarity.unwrap_or(0.0)
                >= if language::names_another_value(&candidate.text, &closest.fact.text) {
                    NAMED_CHANGE_SIMILARITY
                } else {
                    CHANGE_SIMILARITY
                }
            && candidate_slot.is_none()
        {
            return Ok(judgement(
                Verdict::Updates(closest.alias.clone()),
                format!(
                    "a change close in meaning ({:.2}) to a lasting fact",
                    closest.similarity.unwrap_or(0.0)
                ),
            ));
        }
        if let (Some(slot), Some(shown_fact)) = (&candidate_slot, in_slot) {
            let keeps_value = language::repeats_value(&candidate.text, &shown_fact.fact.text);
            let event_meets_lasting =
                candidate.fact_type == FactType::Event && shown_fact.fact.fact_type != FactType::Event;
            let alias = shown_fact.alias.clone();
            // An event that moves the slot to another named value ("bought a house in
            // Bath" against "a flat in Bristol", "my new ThinkPad" against "a MacBook
            // Air") replaces it.
            if event_meets_lasting
                && !keeps_value
                && (language::tells_a_change(&candidate.text) || language::says_new(&candidate.text))
                && language::names_another_value(&candidate.text, &shown_fact.fact.text)
            {
                return Ok(judgement(
                    Verdict::Updates(alias),
                    format!("same {} slot; a change to another named value", slot.name()),
                ));
            }
            // An event the user did in a slot that holds one value, naming nothing the
            // fact named, moves the slot on ("started nights" against "day shifts").
            let shared_name = language::names(&candidate.text)
                .iter()
                .any(|name| language::names(&shown_fact.fact.text).contains(name));
            let moves_on = slot.is_exclusive()
                && !keeps_value
                && !shared_name
                && language::tells_a_change(&candidate.text);
            if (event_meets_lasting || keeps_value) && !changing && !moves_on {
                return Ok(judgement(
                    Verdict::Extends(alias),
                    format!(
                        "same {} slot; adds detail without replacing the value",
                        slot.name()
                    ),
                ));
            }
            if slot.is_exclusive() || changing {
                return Ok(judgement(
                    Verdict::Updates(alias),
                    format!("same {} slot with a new value", slot.name()),
                ));
            }
            return Ok(judgement(
                Verdict::Extends(alias),
                format!("same {} slot; both can hold", slot.name()),
            ));
        }
        if let Some(best) = ranked.first()
            && best.similarity.unwrap_or(0.0) >= EXTENDS_SIMILARITY
            && language::shares_subject(&candidate.text, &best.fact.text)
        {
            return Ok(judgement(
                Verdict::Extends(best.alias.clone()),
                "close in meaning and about the same subject".to_owned(),
            ));
        }
        Ok(judgement(
            Verdict::New,
            "no shown fact holds this slot or subject".to_owned(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_statement_keeps_its_place_before_a_short_question_and_an_addition_ends_a_clause() {
        assert_eq!(
            clauses("Planning my move from Berlin to Amsterdam next month, any tips?"),
            vec!["Planning my move from Berlin to Amsterdam next month"]
        );
        assert!(clauses("What should I pack for Lisbon, any tips?").is_empty());
        assert!(clauses("Should I take the job, thoughts?").is_empty());
        assert_eq!(
            clauses("Oh and penicillin too, I found out the hard way."),
            vec!["Oh and penicillin too", "I found out the hard way"]
        );
        // Two statements of the user's joined by a comma are two clauses; a lead-in
        // before the comma is not a statement of its own.
        assert_eq!(
            clauses(
                "Quick background since you're new: I'm 34, I rent a one-bed in Leeds, and I work as a paramedic."
            ),
            vec![
                "Quick background since you're new: I'm 34",
                "I rent a one-bed in Leeds",
                "I work as a paramedic"
            ]
        );
        assert_eq!(
            clauses("When I deploy, I run the tests"),
            vec!["When I deploy, I run the tests"]
        );
        assert_eq!(
            clauses("Handed in my notice at Boots, I'm doing locum shifts from next week."),
            vec![
                "Handed in my notice at Boots",
                "I'm doing locum shifts from next week"
            ]
        );
    }

    #[test]
    fn a_question_keeps_what_it_takes_for_granted() {
        assert_eq!(
            clauses(
                "What export settings should I use in Premiere on my new Framework laptop? Sold the MacBook to a friend."
            ),
            vec!["I have a new Framework laptop", "Sold the MacBook to a friend"]
        );
        assert_eq!(
            clauses("Can my new puppy eat grapes?"),
            vec!["I have a new puppy"]
        );
        assert!(clauses("What should I pack for Lisbon?").is_empty());
    }

    #[test]
    fn what_someone_did_to_the_user_is_about_the_user() {
        assert_eq!(
            acts_on_the_user("Ocado made me permanent today"),
            Some("Ocado made the user permanent today.".to_owned())
        );
        assert_eq!(
            acts_on_the_user("physio signed me off today, running again from monday"),
            Some("Physio signed the user off today, running again from monday.".to_owned())
        );
        assert_eq!(acts_on_the_user("Can you remind me tomorrow"), None);
        assert_eq!(acts_on_the_user("Tell me a joke"), None);
        assert_eq!(acts_on_the_user("I asked them to call me"), None);
    }

    #[test]
    fn chat_words_and_pictographs_say_nothing() {
        assert_eq!(
            clauses("My cat is called Biscuit haha, my daughter named her"),
            vec!["My cat is called Biscuit, my daughter named her"]
        );
        assert_eq!(
            clauses("just got my first tattoo 🎉 a small fern on my wrist 🌿"),
            vec!["just got my first tattoo, a small fern on my wrist"]
        );
        assert_eq!(
            third_person(&discourse::strip_openers(
                "P.S. I'm left-handed, in case that matters for the desk setup"
            )),
            Some("The user is left-handed.".to_owned())
        );
        assert_eq!(
            third_person(&discourse::strip_openers(
                "I cycle to work, if it rains I take the bus"
            )),
            Some("The user cycles to work, if it rains the user takes the bus.".to_owned())
        );
    }

    #[test]
    fn first_person_statements_become_third_person_facts() {
        let cases = [
            ("I love Adidas sneakers", "The user loves Adidas sneakers."),
            (
                "My Adidas broke after a month",
                "The user's Adidas broke after a month.",
            ),
            ("I'm switching to Puma", "The user is switching to Puma."),
            (
                "I moved to Berlin last month",
                "The user moved to Berlin last month.",
            ),
            (
                "I just started a new job at Stripe",
                "The user just started a new job at Stripe.",
            ),
            ("I don't eat meat anymore", "The user doesn't eat meat anymore."),
            ("I have an exam tomorrow", "The user has an exam tomorrow."),
            (
                "Yeah, I usually watch films with my sister",
                "The user usually watches films with their sister.",
            ),
            (
                "I'm a nurse at St. Mary's hospital",
                "The user is a nurse at St. Mary's hospital.",
            ),
            ("I am allergic to peanuts", "The user is allergic to peanuts."),
        ];
        for (said, expected) in cases {
            assert_eq!(
                third_person(said).as_deref(),
                Some(expected),
                "rewriting {said:?}"
            );
        }
        assert_eq!(third_person("ok thanks"), None);
        assert_eq!(third_person("sounds good to me"), None);
        assert_eq!(third_person("Nice"), None);
        assert_eq!(third_person("I see"), None);
        assert_eq!(
            third_person("I'm vegetarian"),
            Some("The user is vegetarian.".into())
        );
    }

    #[test]
    fn a_headline_and_what_it_is_make_one_statement() {
        assert_eq!(
            clauses("new job! backend dev at stripe, started monday"),
            vec!["My new job is backend dev at stripe, started monday"]
        );
        // A time, a question, or a sentence with a subject of its own after it is not
        // what it is.
        assert_eq!(
            clauses("My new bike. It's a gravel bike"),
            vec!["My new bike", "It's a gravel bike"]
        );
        assert_eq!(
            clauses("New year! Feeling good"),
            vec!["New year", "Feeling good"]
        );
        assert_eq!(clauses("new job! I love it"), vec!["new job", "I love it"]);
        assert_eq!(clauses("new job! any advice?"), vec!["new job"]);
    }

    #[test]
    fn what_holds_for_the_user_is_about_the_user() {
        assert_eq!(
            for_the_user("Knees are shot so it's swimming instead of running for me now").as_deref(),
            Some("Knees are shot so it's swimming instead of running for the user now.")
        );
        assert_eq!(for_the_user("Can you find a recipe for me"), None);
        assert_eq!(for_the_user("for me"), None);
        assert_eq!(for_the_user("The weather is nice today"), None);
        assert_eq!(
            third_person("I used to be vegetarian").as_deref(),
            Some("The user used to be vegetarian.")
        );
    }

    #[test]
    fn a_compound_subject_stays_one_statement() {
        assert_eq!(
            clauses("My boyfriend Sam and I live together in Leeds"),
            vec!["My boyfriend Sam and I live together in Leeds".to_owned()]
        );
        assert_eq!(
            clauses("Sam and I broke up last week"),
            vec!["Sam and I broke up last week".to_owned()]
        );
    }

    #[test]
    fn a_second_statement_with_its_subject_left_out_stands_alone() {
        assert_eq!(
            clauses("I live in Porto and work as a nurse at Santo António hospital."),
            vec!["I live in Porto", "I work as a nurse at Santo António hospital"]
        );
        assert_eq!(
            clauses("I moved to Lisbon and started at a clinic"),
            vec!["I moved to Lisbon", "I started at a clinic"]
        );
        assert_eq!(
            clauses("I'm vegan and run marathons on weekends"),
            vec!["I'm vegan", "I run marathons on weekends"]
        );
        assert_eq!(
            clauses("We rent a flat in Leeds and have two cats"),
            vec!["We rent a flat in Leeds", "We have two cats"]
        );
        let facts: Vec<Option<String>> =
            clauses("I live in Porto and work as a nurse at Santo António hospital.")
                .iter()
                .map(|clause| third_person(clause))
                .collect();
        assert_eq!(
            facts,
            vec![
                Some("The user lives in Porto.".to_owned()),
                Some("The user works as a nurse at Santo António hospital.".to_owned())
            ]
        );
        for one in [
            "I like fish and chips",
            "I balance family and work",
            "I was born in Porto and raised in Lisbon",
            "My sister lives in Porto and works as a nurse",
            "I bought eggs, milk and cheese",
        ] {
            assert_eq!(clauses(one), vec![one.to_owned()], "{one}");
        }
    }

    #[test]
    fn compound_sentences_split_into_statements() {
        assert_eq!(
            clauses("I love Adidas and I hate Nike. What do you think? My sister runs too"),
            vec!["I love Adidas", "I hate Nike", "My sister runs too"]
        );
        assert_eq!(
            clauses("Django 5.1 is great. I saw Dr. Lee at St. Mary's"),
            vec!["Django 5.1 is great", "I saw Dr. Lee at St. Mary's"]
        );
    }

    #[test]
    fn time_bound_statements_expire() {
        let monday = DateTime::parse_from_rfc3339("2026-11-30T10:00:00Z")
            .expect("valid time")
            .with_timezone(&Utc);
        assert_eq!(expiry_hours("i have an exam tomorrow", monday), Some(48.0));
        assert_eq!(expiry_hours("i'm in paris this week", monday), Some(168.0));
        assert_eq!(expiry_hours("i'm in lisbon until friday", monday), Some(110.0));
        assert_eq!(expiry_hours("i'm off sugar for 3 days", monday), Some(72.0));
        // Named days resolve against when it was said (a Monday, 10:00).
        assert_eq!(expiry_hours("the report is due this friday", monday), Some(110.0));
        assert_eq!(expiry_hours("my flight is on sunday at 6am", monday), Some(158.0));
        assert_eq!(
            expiry_hours("dentist next tuesday", monday),
            Some(14.0 + 24.0 * 8.0)
        );
        assert_eq!(expiry_hours("my exam is in two weeks", monday), Some(360.0));
        assert_eq!(
            expiry_hours("tax filing is due at the end of the month", monday),
            Some(14.0)
        );
        assert_eq!(expiry_hours("we rehearse on thursdays", monday), None);
        assert_eq!(expiry_hours("i live in berlin", monday), None);
        assert_eq!(classify("i have an exam tomorrow", true), FactType::Event);
        assert_eq!(classify("i'm vegetarian now", false), FactType::Constraint);
        assert_eq!(classify("i love adidas sneakers", false), FactType::Preference);
        assert_eq!(classify("i work at stripe", false), FactType::Identity);
        assert_eq!(classify("my adidas broke after a month", false), FactType::Event);
    }

    #[test]
    fn procedures_become_playbooks() {
        let found =
            playbook("When I deploy, I first run the tests, then tag the release, then update the changelog")
                .expect("a playbook");
        assert_eq!(found.trigger, "i deploy");
        assert_eq!(
            found.steps,
            vec!["run the tests", "tag the release", "update the changelog"]
        );
        assert!(
            playbook("When it rains, I stay home").is_none(),
            "one step is not a procedure"
        );
    }
}
