//! What a statement means in its conversation: openers that carry no content ("FYI",
//! "Just so you know", "Quick update:"), pronouns that point back at what the user
//! named before ("We adopted a dog. She's a greyhound."), and fragments that continue
//! the previous statement ("I'm allergic to peanuts. Also tree nuts.").

/// Discourse markers that open a statement without adding to it, longest first.
const MARKERS: &[&str] = &[
    "just so you know",
    "forgot to say",
    "forgot to mention",
    "it turns out",
    "turns out",
    "quick update",
    "update on my life",
    "big news",
    "bad news",
    "good news",
    "great news",
    "for what it's worth",
    "i should mention that",
    "i should mention",
    "i should say",
    "to be honest",
    "long story short",
    "remember that",
    "note to self",
    "by the way",
    "scrap that",
    "oh and",
    "fun fact",
    "honestly",
    "for your information",
    "for the record",
    "for reference",
    "for context",
    "for clarity",
    "keep in mind that",
    "keep in mind",
    "worth mentioning",
    "worth noting",
    "don't forget that",
    "don't forget",
    "quick note",
    "random fact",
    "oh and also",
    "oh also",
    "not gonna lie",
    "just saying",
    "heads up",
    "side note",
    "fyi",
    "fwiw",
    "imho",
    "imo",
    "iirc",
    "afaik",
    "tbf",
    "ngl",
    "psa",
    "btw",
    "tbh",
    "lol",
    "haha",
    "ugh",
    "wow",
    "so",
];

/// Strips what opens a clause without content: a short label ending in a colon
/// ("Quick update:", "Note to self:"), discourse markers ("FYI", "just so you know",
/// "I should mention"), and a word said twice by mistake ("my my").
pub fn strip_openers(clause: &str) -> String {
    let mut text = clause.trim().to_owned();
    loop {
        let before = text.clone();
        // A longer label is a heading when a statement of the user's follows it
        // ("Quick background since you're new: I'm 34, ...").
        if let Some((label, rest)) = text.split_once(':')
            && !label.is_empty()
            && !rest.trim().is_empty()
            && !label.chars().any(|c| c.is_ascii_digit())
            && (label.split_whitespace().count() <= 4
                || (label.split_whitespace().count() <= 8
                    && !label
                        .split_whitespace()
                        .next()
                        .is_some_and(|first| crate::language::is_first_person_start(&first.to_lowercase()))
                    && rest
                        .split_whitespace()
                        .next()
                        .is_some_and(|first| crate::language::is_first_person_start(&first.to_lowercase()))))
        {
            text = rest.trim().to_owned();
        }
        let lower = text.to_lowercase();
        for marker in MARKERS {
            if let Some(rest) = lower.strip_prefix(marker)
                && (rest.is_empty() || rest.starts_with([' ', ',', ':']))
            {
                text = text[marker.len()..]
                    .trim_start_matches([',', ':', ' '])
                    .to_owned();
                break;
            }
        }
        if let Some(rest) = strip_framing(&text).or_else(|| strip_hedge(&text)) {
            text = rest;
        }
        // The same markers said last ("I'm colour blind btw", "..., just so you know").
        let lower = text.to_lowercase();
        let trimmed = lower.trim_end_matches(['.', '!', ' ']);
        for marker in MARKERS.iter().filter(|marker| **marker != "so") {
            if let Some(rest) = trimmed.strip_suffix(marker)
                && rest.ends_with([' ', ','])
                && rest.trim_end_matches([' ', ',']).split_whitespace().count() >= 2
            {
                // Lower-casing may change lengths outside ASCII: then nothing is cut.
                if let Some(kept) = text.get(..rest.trim_end_matches([' ', ',']).len()) {
                    text = kept.to_owned();
                }
                break;
            }
        }
        if text == before {
            break;
        }
    }
    let text = drop_asides(&text);
    let mut words: Vec<&str> = Vec::new();
    for word in text.split_whitespace() {
        if words
            .last()
            .is_some_and(|last| last.eq_ignore_ascii_case(word) && !word.chars().any(|c| c.is_ascii_digit()))
        {
            continue;
        }
        words.push(word);
    }
    words.join(" ")
}

/// Chat words that stand for a laugh or a tone and say nothing about anything, wherever
/// they are said ("My cat is called Biscuit haha", "the best language imo, ...").
const INTERJECTIONS: &[&str] = &[
    "haha", "hahaha", "hah", "hehe", "lol", "lolol", "lmao", "rofl", "xd", "imo", "imho", "tbh", "tbf",
    "ngl", "fwiw", "iirc", "afaik", "btw", "omg", "lowkey", "highkey", "rn", "xx", "xoxo", ":)", ":-)", ":(",
    ":d", ";)", ":p",
];

/// Whether a character is a pictograph or part of one (emoji, their joiners and
/// variation selectors, flags).
fn is_pictograph(c: char) -> bool {
    matches!(u32::from(c), 0x1F000..=0x1FAFF | 0x2600..=0x27BF | 0x2B00..=0x2BFF | 0xFE0F | 0x200D | 0x20E3)
}

/// A chat message as plain statements: pictographs between words end a clause as a
/// comma would ("just got my first tattoo 🎉 a small fern on my wrist"), elsewhere they
/// go, and interjections ([`INTERJECTIONS`]) go wherever they are, the punctuation
/// after them staying with the word before.
pub fn plain_chat(text: &str) -> String {
    let mut spaced = String::with_capacity(text.len());
    let mut in_pictographs = false;
    for c in text.chars() {
        if is_pictograph(c) {
            if !in_pictographs {
                spaced.push_str(" , ");
            }
            in_pictographs = true;
        } else {
            in_pictographs = false;
            spaced.push(c);
        }
    }
    let mut words: Vec<String> = Vec::new();
    for word in spaced.split_whitespace() {
        let core = word.trim_end_matches([',', '.', '!', '?', ';']);
        let ending = &word[core.len()..];
        let lower = core.to_lowercase();
        if lower.is_empty() || INTERJECTIONS.contains(&lower.as_str()) {
            match words.last_mut() {
                Some(last) if !last.ends_with([',', '.', '!', '?', ';']) => last.push_str(ending),
                Some(_) => {}
                None => {}
            }
            continue;
        }
        words.push(word.to_owned());
    }
    words.join(" ")
}

/// Whether a part said after a comma only tells the listener why it was said ("in case
/// that matters for the desk setup", "if that helps", "since you asked").
fn says_why_it_was_said(part: &str) -> bool {
    const OPENERS: &[&str] = &[
        "in case",
        "just in case",
        "if that",
        "if it",
        "if this",
        "since you",
        "as you",
    ];
    const RELEVANCE: &[&str] = &[
        "matters",
        "matter",
        "helps",
        "help",
        "relevant",
        "useful",
        "important",
        "you",
        "you're",
    ];
    let lower = part.trim().to_lowercase();
    OPENERS
        .iter()
        .any(|opener| crate::language::contains_phrase(&lower, opener) && lower.starts_with(opener))
        && lower
            .split_whitespace()
            .skip(1)
            .any(|word| RELEVANCE.contains(&word.trim_matches(|c: char| !c.is_alphanumeric() && c != '\'')))
}

/// Fillers said in passing, between commas or in brackets.
const FILLERS: &[&str] = &[
    "uh",
    "um",
    "umm",
    "er",
    "erm",
    "like",
    "you know",
    "i mean",
    "basically",
    "literally",
    "actually",
    "honestly",
    "seriously",
    "frankly",
    "anyway",
    "anyways",
];

/// Drops what is said in passing inside a statement: a marker or a filler between
/// commas or in brackets ("I, uh, live in Ghent", "I am, honestly, a vegan", "I live in
/// Ghent (btw)"), and the same said last after a comma ("..., fwiw").
fn drop_asides(text: &str) -> String {
    let aside = |part: &str| {
        let part = part
            .trim()
            .trim_matches(|c: char| matches!(c, '(' | ')' | '.' | '!'))
            .to_lowercase();
        !part.is_empty()
            && (MARKERS.contains(&part.as_str())
                || FILLERS.contains(&part.as_str())
                || says_why_it_was_said(&part))
    };
    let mut text = text.to_owned();
    // In brackets, anywhere.
    while let Some(open) = text.find('(') {
        let Some(close) = text[open..].find(')').map(|at| open + at) else {
            break;
        };
        if !aside(&text[open + 1..close]) {
            break;
        }
        text = format!("{}{}", text[..open].trim_end(), &text[close + 1..]);
    }
    // Between commas, or last after one; never the first part, which holds the subject.
    let parts: Vec<&str> = text.split(',').collect();
    if parts.len() < 2 {
        return text;
    }
    let mut kept = parts[0].to_owned();
    let mut dropped = false;
    for part in &parts[1..] {
        if aside(part) {
            dropped = true;
        } else {
            // The commas around a dropped aside go with it.
            if !dropped {
                kept.push(',');
            }
            kept.push_str(part);
            dropped = false;
        }
    }
    kept
}

/// Words that make a lead-in part of the statement rather than a frame around it: a
/// condition or time ("When I deploy, I ...", "Last week I ..."), a place, or another
/// subject beside the user ("Sam and I ...").
const BOUND: &[&str] = &[
    "when",
    "whenever",
    "if",
    "unless",
    "after",
    "before",
    "since",
    "because",
    "although",
    "though",
    "while",
    "until",
    "once",
    "as",
    "where",
    "today",
    "yesterday",
    "tonight",
    "tomorrow",
    "last",
    "this",
    "next",
    "now",
    "ago",
    "then",
    "in",
    "on",
    "at",
    "to",
    "from",
    "for",
    "with",
    "and",
    "or",
    "of",
    "who",
    "what",
    "which",
    "how",
    "why",
    "do",
    "does",
    "did",
    "can",
    "could",
    "should",
    "would",
    "will",
    "is",
    "are",
    "was",
    "were",
];

/// How a request to the assistant opens.
const REQUESTS: &[&str] = &[
    "can", "could", "would", "will", "please", "pls", "you", "do", "don't", "just", "make",
];

/// Lead-in words that always bind the statement: a condition or a time.
const SUBORDINATE: &[&str] = &[
    "when",
    "whenever",
    "if",
    "unless",
    "after",
    "before",
    "since",
    "because",
    "although",
    "though",
    "while",
    "until",
    "once",
    "today",
    "yesterday",
    "tonight",
    "tomorrow",
    "last",
    "this",
    "next",
    "ago",
    "what",
    "which",
    "who",
    "how",
    "why",
    "where",
    "whether",
];

/// Verbs that frame a statement as something said or to keep in mind ("I should
/// mention I ...", "I forgot to tell you that my ...").
const TELLING: &[&str] = &[
    "mention", "say", "tell", "add", "note", "share", "flag", "know", "remind", "remember", "forget",
    "forgot", "admit", "confess",
];

/// A lead-in that frames a first-person statement without adding to it, wherever the
/// list of markers does not know it: a few words before the first "I", "my" or "we"
/// ("Heads up, I'm ...", "Not gonna lie, I ...", "Random but my ..."), or the user
/// saying they tell something ("I ought to mention that I ..."). A lead-in that binds
/// the statement (a condition, a time, a place, another subject, a name, a number)
/// stays. The statement without the lead-in, or `None`.
fn strip_framing(text: &str) -> Option<String> {
    let words: Vec<&str> = text.split_whitespace().collect();
    let first_person = |word: &&str| crate::language::is_first_person_start(&bare(word));
    let telling = words.first().is_some_and(|word| bare(word) == "i");
    let start = usize::from(telling);
    let at = start + words.get(start..)?.iter().position(first_person)?;
    let lead = &words[..at];
    // A request to keep it in mind: "Can you remember that my ...", "Please note I ...",
    // "You should know that I ...".
    let asking = !telling
        && lead
            .first()
            .is_some_and(|word| REQUESTS.contains(&bare(word).as_str()))
        && lead.iter().any(|word| {
            let word = bare(word);
            TELLING.contains(&word.as_str()) || word == "mind"
        });
    if lead.is_empty() || lead.len() > if telling || asking { 7 } else { 4 } {
        return None;
    }
    if asking {
        let binds = lead.iter().enumerate().any(|(index, word)| {
            SUBORDINATE.contains(&bare(word).as_str())
                || word.chars().any(|c| c.is_ascii_digit())
                || (index > 0 && word.chars().next().is_some_and(char::is_uppercase))
        });
        return (!binds).then(|| words[at..].join(" "));
    }
    let framed = if telling {
        lead.iter().any(|word| TELLING.contains(&bare(word).as_str()))
    } else {
        let last = lead[lead.len() - 1];
        lead.len() <= 3 || last.ends_with([',', ':', ';', '!', '-', '—']) || bare(last) == "that"
    };
    let binds = lead.iter().enumerate().any(|(index, word)| {
        let word_bare = bare(word);
        (BOUND.contains(&word_bare.as_str()) && !(telling && matches!(word_bare.as_str(), "should" | "to")))
            // A verb: the lead is the statement, its subject left out ("Passed my test"),
            // unless a comma ends it ("Just saying, I ...").
            || (!telling
                && !lead[lead.len() - 1].ends_with([',', ':', ';', '!', '-', '—'])
                && (crate::language::is_past_tense(&word_bare)
                    || word_bare.ends_with("ing")
                    || word_bare == "got"))
            || word.chars().any(|c| c.is_ascii_digit())
            || (index > 0 && word.chars().next().is_some_and(char::is_uppercase))
    });
    // "Penicillin too, I found out the hard way": a lead that ends in "too" or "as
    // well" adds a value, and the rest is an aside.
    let adds_a_value = lead.len() >= 2 && crate::language::ends_an_addition(lead);
    if !framed || binds || adds_a_value {
        return None;
    }
    Some(words[at..].join(" "))
}

/// "I think it replaces Vim for me now" → "it replaces Vim for me now": an opinion
/// verb before a pronoun subject leaves the pronoun to be resolved ([`resolve`]).
/// `None` when the clause does not open so.
fn strip_hedge(text: &str) -> Option<String> {
    let words: Vec<&str> = text.split_whitespace().collect();
    let hedged = words.len() > 3
        && bare(words[0]) == "i"
        && matches!(
            bare(words[1]).as_str(),
            "think" | "guess" | "believe" | "reckon" | "suppose"
        )
        && matches!(
            bare(words[2]).replace('’', "'").as_str(),
            "it" | "he" | "she" | "they" | "it's" | "he's" | "she's" | "they're"
        );
    hedged.then(|| words[2..].join(" "))
}

/// The last name in a fact, for "it" to point at: "The user spent the weekend setting
/// up Zed." → "Zed". Sentence-initial words and "The user" are not names.
fn last_name(fact: &str) -> Option<String> {
    let words: Vec<&str> = fact.trim_end_matches('.').split_whitespace().collect();
    let mut name: Vec<String> = Vec::new();
    let mut last = None;
    for word in words.iter().skip(1) {
        let clean = word.trim_matches(|c: char| !c.is_alphanumeric());
        if clean.chars().next().is_some_and(char::is_uppercase) {
            name.push(clean.to_owned());
        } else if !name.is_empty() {
            last = Some(name.join(" "));
            name.clear();
        }
        if word.ends_with([',', ';']) && !name.is_empty() {
            last = Some(name.join(" "));
            name.clear();
        }
    }
    if !name.is_empty() {
        last = Some(name.join(" "));
    }
    last
}

/// A chat statement with its subject left out gets it back ("Got promoted to staff
/// engineer" → "I got promoted …", "Sold the Civic" → "I sold the Civic"), and one
/// led by its time ("Today was my first day at Datadog") is turned around ("My first
/// day at Datadog was today"), so the user is its subject.
pub fn restore_subject(clause: &str) -> String {
    const TIMES: &[&str] = &[
        "today",
        "yesterday",
        "tonight",
        "this morning",
        "last night",
        "last week",
    ];
    const ONGOING: &[&str] = &[
        "getting",
        "starting",
        "switching",
        "moving",
        "looking",
        "planning",
        "heading",
        "going",
        "trying",
        "working",
        "leaving",
        "joining",
        "learning",
    ];
    let lower = clause.to_lowercase();
    for time in TIMES {
        for verb in ["was", "is"] {
            let lead = format!("{time} {verb} my ");
            if lower.starts_with(&lead) {
                let rest = clause[lead.len()..].trim_end_matches(['.', '!']);
                return format!("My {rest} {verb} {time}");
            }
        }
    }
    let words: Vec<&str> = clause.split_whitespace().collect();
    // Adverbs before the verb are passed over ("Officially retired", "Just eating ..."),
    // and "all" before a past tense ("All settled in Amsterdam now").
    let Some(position) = words.iter().enumerate().position(|(index, word)| {
        let word = bare(word);
        !(crate::language::is_adverb(&word)
            || word == "just"
            || is_manner_adverb(&word)
            || (word == "all"
                && words
                    .get(index + 1)
                    .is_some_and(|next| crate::language::is_past_tense(&bare(next)))))
    }) else {
        return clause.to_owned();
    };
    let first = bare(words[position]);
    let next = words.get(position + 1).map(|next| bare(next));
    // "The divorce was finalised", "Graduation was yesterday": an event of a life told
    // without whose it is, the user's own when nobody else is named before its verb.
    let event_at = usize::from(first == "the");
    if position == 0
        && words
            .get(event_at)
            .is_some_and(|noun| LIFE_EVENTS.contains(&bare(noun).as_str()))
        && words
            .get(event_at + 1)
            .is_some_and(|verb| EVENT_VERBS.contains(&bare(verb).as_str()))
    {
        return format!("My {}", lower_first(&words[event_at..].join(" ")));
    }
    // "Three months smoke-free today", "Two weeks sober": how long the user has been in
    // a state, told without the user.
    if position == 0
        && crate::language::number(&first).is_some()
        && next.as_deref().is_some_and(|unit| {
            matches!(
                unit,
                "day" | "days" | "week" | "weeks" | "month" | "months" | "year" | "years"
            )
        })
        && words.get(2).is_some_and(|state| {
            let state = bare(state);
            state.ends_with("-free") || STATES.contains(&state.as_str())
        })
    {
        return format!("I'm {}", lower_first(&words.join(" ")));
    }
    // "The new place is ...", "First week on the fraud team went well": a thing of the
    // user's, or the user's first time somewhere, told without its owner.
    if position == 0
        && first == "the"
        && next.as_deref().is_some_and(|next| OWN.contains(&next))
        && words
            .get(2)
            .is_some_and(|noun| noun.chars().next().is_some_and(char::is_lowercase))
    {
        return format!("My {}", words[1..].join(" "));
    }
    let verb_first = (crate::language::is_past_tense(&first)
        && !matches!(first.as_str(), "was" | "were" | "did" | "had"))
        || first == "got";
    let rest = words[position..].join(" ");
    let lowered = rest
        .chars()
        .next()
        .map(|c| format!("{}{}", c.to_lowercase(), &rest[c.len_utf8()..]))
        .unwrap_or_default();
    if first == "first"
        && next
            .as_deref()
            .is_some_and(|next| matches!(next, "day" | "week" | "month" | "shift" | "class" | "lesson"))
    {
        return format!("My {lowered}");
    }
    // A participle that says how the user is ("Obsessed with ...") is no verb of
    // theirs ("I obsessed with ...").
    let state = first.ends_with("ed")
        && first.len() > 4
        && next
            .as_deref()
            .is_some_and(|next| matches!(next, "with" | "about" | "of" | "by"));
    if verb_first && !state {
        return format!("I {lowered}");
    }
    // "Can't run at the moment", "Don't eat pork": a negated verb with its subject left
    // out.
    if NEGATED.contains(&first.replace('’', "'").as_str())
        && next
            .as_deref()
            .is_some_and(|next| next.chars().all(char::is_alphabetic) && !AUXILIARIES.contains(&next))
    {
        return format!("I {lowered}");
    }
    // "Officially done with my MPH", "Obsessed with cold water swimming": a state the
    // user is in, told without the user.
    if (first == "done" || state)
        && next
            .as_deref()
            .is_some_and(|next| matches!(next, "with" | "about" | "of" | "by"))
    {
        return format!("I'm {lowered}");
    }
    // "Taking a few weeks off", "Eating balanced meals now": what the user is doing,
    // a present participle followed by what it acts on, not by a verb of its own
    // ("Meeting went well").
    let participle = first.len() >= 6
        && first.ends_with("ing")
        && !THING_NOUNS.contains(&first.as_str())
        && next.as_deref().is_some_and(|next| {
            // A past tense in "-ed" after it is an adjective ("eating balanced meals").
            let irregular_past = crate::language::is_past_tense(next) && !next.ends_with("ed");
            !AUXILIARIES.contains(&next)
                && !irregular_past
                && !matches!(next, "is" | "goes" | "makes" | "starts" | "begins")
        });
    if ONGOING.contains(&first.as_str()) || participle {
        return format!("I'm {lowered}");
    }
    // "New goal is a half marathon": a thing of the user's told without its owner, an
    // adjective of one's own things and a lower-case noun before the verb.
    if OWN.contains(&first.as_str())
        && words.get(position + 1).is_some_and(|noun| {
            noun.chars().next().is_some_and(char::is_lowercase) && !AUXILIARIES.contains(&bare(noun).as_str())
        })
        && words
            .get(position + 2)
            .is_some_and(|verb| matches!(bare(verb).as_str(), "is" | "was" | "are" | "were"))
    {
        return format!("My {lowered}");
    }
    clause.to_owned()
}

/// Negated auxiliaries that open a statement with its subject left out.
const NEGATED: &[&str] = &[
    "can't",
    "cannot",
    "won't",
    "don't",
    "didn't",
    "haven't",
    "hasn't",
    "couldn't",
    "wouldn't",
    "shouldn't",
];

/// Events of a person's life that are someone's own ("the divorce", "graduation").
const LIFE_EVENTS: &[&str] = &[
    "divorce",
    "graduation",
    "wedding",
    "engagement",
    "transfer",
    "promotion",
    "retirement",
    "breakup",
    "separation",
    "move",
    "relocation",
    "surgery",
    "operation",
    "interview",
    "internship",
    "probation",
    "diagnosis",
    "adoption",
    "honeymoon",
];

/// Verbs that tell what happened to such an event.
const EVENT_VERBS: &[&str] = &[
    "was", "is", "went", "got", "came", "has", "had", "finally", "happened", "ended", "starts", "started",
];

/// States a person is in for a while, which a duration before them tells how long
/// ("two weeks sober"); any "-free" state as well ("smoke-free").
const STATES: &[&str] = &[
    "sober",
    "clean",
    "married",
    "engaged",
    "divorced",
    "single",
    "retired",
    "vegan",
    "vegetarian",
    "pregnant",
    "unemployed",
];

/// `text` with its first letter in lower case.
fn lower_first(text: &str) -> String {
    let mut chars = text.chars();
    chars
        .next()
        .map(|c| format!("{}{}", c.to_lowercase(), chars.as_str()))
        .unwrap_or_default()
}

/// Words in "-ing" that name a thing rather than what someone is doing.
const THING_NOUNS: &[&str] = &[
    "nothing",
    "something",
    "anything",
    "everything",
    "morning",
    "evening",
    "wedding",
    "building",
    "meeting",
    "ceiling",
    "pudding",
    "sibling",
    "darling",
    "feeling",
    "ending",
    "during",
    "string",
    "spring",
    "thing",
    "painting",
    "clothing",
    "housing",
    "parking",
    "training",
    "funding",
    "setting",
    "booking",
    "earring",
    "offspring",
    "opening",
    "outing",
];

/// An adverb of manner or time in "-ly" that may open a chat statement before its
/// verb ("Officially retired as of Friday", "Finally caved ..."); words in "-ly" that
/// are nouns or adjectives are not.
fn is_manner_adverb(word: &str) -> bool {
    // Words of five letters or fewer ("early", "daily", "only") are never taken.
    const NOT: &[&str] = &[
        "family", "friendly", "lovely", "weekly", "monthly", "yearly", "supply", "lonely", "likely",
        "elderly", "assembly", "anomaly", "deadly", "costly", "lively", "timely", "homely", "chilly",
        "woolly", "wobbly", "bubbly", "cuddly", "orderly", "worldly",
    ];
    word.len() > 5 && word.ends_with("ly") && word.chars().all(char::is_alphabetic) && !NOT.contains(&word)
}

/// Adjectives that open a thing of one's own when the owner is left out ("New goal is
/// ...", "Current plan is ...").
const OWN: &[&str] = &[
    "new",
    "next",
    "current",
    "latest",
    "main",
    "only",
    "favourite",
    "favorite",
    "usual",
];

/// A statement about a thing the user spoke of before, told as its end ("The cast came
/// off today" after "it's in a cast for six weeks", "cron is retired" after "scripts
/// run by cron"), without the user as its subject. It is kept, a thing introduced by
/// "the" or "our" made the user's ("The user's cast came off today."), so the judge
/// can end the fact that held it. `known` holds the content tokens of what the user
/// said and the scope's facts. `None` for anything else, so remarks about the world
/// stay out.
pub fn about_known_thing(clause: &str, known: &std::collections::HashSet<String>) -> Option<String> {
    let words: Vec<&str> = clause.split_whitespace().collect();
    let owned = matches!(bare(words.first()?).as_str(), "the" | "our");
    let thing = bare(words.get(usize::from(owned))?);
    let departed = crate::language::departed_value(clause);
    // "The school run is on the cargo bike now": a thing of the user's that is told
    // to be otherwise now is a change to it too.
    let otherwise_now = owned && crate::language::contains_phrase(&clause.to_lowercase(), "now");
    if words.len() < 3
        || !crate::language::content_tokens(&thing).contains(&crate::language::stem(&thing))
        || !known.contains(&crate::language::stem(&thing))
        || !(departed.contains(&crate::language::stem(&thing)) || otherwise_now)
    {
        return None;
    }
    let text = clause.trim().trim_end_matches(['.', '!', ',', ':']);
    Some(if owned {
        format!(
            "The user's {}.",
            words[1..].join(" ").trim_end_matches(['.', '!', ',', ':'])
        )
    } else {
        as_sentence(text)?
    })
}

const AUXILIARIES: &[&str] = &[
    "is", "are", "was", "were", "has", "have", "had", "can", "can't", "cannot", "could", "will", "would",
    "does", "doesn't", "don't", "not", "also", "really", "still", "just", "should",
];
const PREPOSITIONS: &[&str] = &["to", "of", "in", "on", "with", "for", "about", "at", "from", "by"];
const DETERMINERS: &[&str] = &[
    "a", "an", "the", "their", "some", "one", "two", "used", "new", "second", "old",
];

/// Nouns of time, which a determiner before them does not make a thing of the user's.
const TIME_NOUNS: &[&str] = &[
    "weekend",
    "morning",
    "afternoon",
    "evening",
    "night",
    "day",
    "week",
    "month",
    "year",
    "summer",
    "winter",
    "spring",
    "autumn",
    "holidays",
];

/// `text` as a sentence: its first letter capitalised and a full stop at its end.
/// `None` for an empty text.
pub(crate) fn as_sentence(text: &str) -> Option<String> {
    let mut chars = text.chars();
    let first = chars.next()?;
    Some(format!("{}{}.", first.to_uppercase(), chars.as_str()))
}

pub(crate) fn bare(word: &str) -> String {
    word.trim_matches(|c: char| !c.is_alphanumeric() && c != '\'')
        .to_lowercase()
}

/// Who or what a third-person fact is about, as a noun phrase another statement can
/// use as its subject: "The user's sister Anna lives in Vienna." → "The user's sister
/// Anna"; "The user adopted a dog." → "The user's dog"; "The user has a cat called
/// Nori." → "The user's cat Nori". `None` when the fact names nothing but the user.
pub fn referent(fact: &str) -> Option<String> {
    let words: Vec<&str> = fact.trim_end_matches('.').split_whitespace().collect();
    if words.len() >= 3 && words[0].eq_ignore_ascii_case("the") && words[1] == "user's" {
        let mut phrase = Vec::new();
        let mut named = false;
        for word in &words[2..] {
            let clean = word.trim_matches(|c: char| !c.is_alphanumeric());
            let lower = clean.to_lowercase();
            let capital = clean.chars().next().is_some_and(char::is_uppercase);
            if capital {
                named = true;
                phrase.push(clean);
            } else if named
                || phrase.len() >= 2
                || AUXILIARIES.contains(&lower.as_str())
                || (!phrase.is_empty() && (lower.ends_with('s') || lower.ends_with("ed")))
            {
                break;
            } else {
                phrase.push(clean);
            }
            if word.ends_with(',') {
                break;
            }
        }
        return (!phrase.is_empty()).then(|| format!("The user's {}", phrase.join(" ")));
    }
    if words.len() >= 4 && words[0].eq_ignore_ascii_case("the") && words[1] == "user" {
        // The object of the user's verb: after its first determiner that does not
        // open a time ("the weekend", "last week").
        let start = (2..words.len()).find(|&index| {
            DETERMINERS.contains(&bare(words[index]).as_str())
                && !words
                    .get(index + 1)
                    .is_some_and(|next| TIME_NOUNS.contains(&bare(next).as_str()))
        })?;
        let mut phrase: Vec<String> = Vec::new();
        let mut index = start;
        while index < words.len() && DETERMINERS.contains(&bare(words[index]).as_str()) {
            index += 1;
        }
        while index < words.len() {
            let word = words[index];
            let lower = bare(word);
            if lower == "called" || lower == "named" {
                if let Some(name) = words.get(index + 1) {
                    phrase.push(name.trim_matches(|c: char| !c.is_alphanumeric()).to_owned());
                }
                break;
            }
            if PREPOSITIONS.contains(&lower.as_str()) || lower.is_empty() || phrase.len() >= 3 {
                break;
            }
            phrase.push(word.trim_matches(|c: char| !c.is_alphanumeric()).to_owned());
            if word.ends_with(',') {
                break;
            }
            index += 1;
        }
        return (!phrase.is_empty()).then(|| format!("The user's {}", phrase.join(" ")));
    }
    None
}

/// What a fact says the user does, without its object, for a fragment that continues
/// it: "The user is allergic to peanuts." → "The user is allergic to"; "The user
/// cannot eat shellfish." → "The user cannot eat"; "The user speaks Spanish." → "The
/// user speaks".
pub fn predicate(fact: &str) -> Option<String> {
    let words: Vec<&str> = fact.trim_end_matches('.').split_whitespace().collect();
    if words.len() < 3 || !words[0].eq_ignore_ascii_case("the") || words[1] != "user" {
        return None;
    }
    let mut phrase = vec!["The", "user"];
    let mut index = 2;
    while index < words.len() && AUXILIARIES.contains(&bare(words[index]).as_str()) {
        phrase.push(words[index]);
        index += 1;
    }
    phrase.push(words.get(index)?);
    if let Some(next) = words.get(index + 1)
        && PREPOSITIONS.contains(&bare(next).as_str())
    {
        phrase.push(next);
    }
    Some(phrase.join(" "))
}

/// Whether a message opens by going on from what the user said before: "And ...",
/// "Oh and ...", "Oh, also ...", "Plus ...".
pub fn continues(message: &str) -> bool {
    let words: Vec<String> = message.split_whitespace().take(2).map(bare).collect();
    let opener = |word: &str| matches!(word, "and" | "also" | "plus");
    match words.as_slice() {
        [first, ..] if opener(first) => true,
        [first, second, ..] => first == "oh" && opener(second),
        _ => false,
    }
}

/// A clause rewritten with what the conversation supplies, when it needs it: a
/// pronoun subject becomes the thing named last ("She's a greyhound called Pepper."
/// after "The user adopted a dog." → "The user's dog is a greyhound called Pepper."), a
/// fragment continuing a statement takes its predicate ("Also tree nuts, especially
/// cashews." → "The user is allergic to tree nuts, especially cashews."), and a bare
/// description is about the thing named last ("Black, very shy." → "The user's cat
/// Nori is black, very shy."). Fragments continue only a statement of the same
/// message (`same_message`); a pronoun may point into an earlier one. `None` when the
/// clause stands on its own or nothing before it fits.
pub fn resolve(clause: &str, previous: Option<&str>, same_message: bool) -> Option<String> {
    const ACKNOWLEDGEMENTS: &[&str] = &[
        "ok", "okay", "thanks", "thank", "cool", "nice", "sure", "great", "yes", "yeah", "no", "maybe",
        "hmm", "sounds", "good", "cute", "wow", "see", "right", "perfect", "awesome", "fine",
    ];
    let previous = previous?;
    let words: Vec<&str> = clause.split_whitespace().collect();
    let first = bare(words.first()?);
    let rest = words[1..].join(" ");
    let rest = rest.trim_end_matches(['.', '!']);
    let sentence = |text: String| as_sentence(text.trim().trim_end_matches([',', '.']));
    let first = first.replace('’', "'");
    // What the fact before is about; for a thing ("it") without one, the name said last.
    let subject_of = |previous: &str| {
        if matches!(first.as_str(), "it" | "it's") {
            referent(previous).or_else(|| last_name(previous))
        } else {
            referent(previous)
        }
    };
    match first.as_str() {
        "he" | "she" | "it" | "they" if !rest.is_empty() => {
            let subject = subject_of(previous)?;
            let rest = rest
                .split_whitespace()
                .map(|word| match bare(word).as_str() {
                    "her" | "his" | "its" => "their".to_owned(),
                    "me" => word.replacen("me", "the user", 1),
                    "my" => word.replacen("my", "the user's", 1),
                    _ => word.to_owned(),
                })
                .collect::<Vec<_>>()
                .join(" ");
            sentence(format!("{subject} {rest}"))
        }
        // "Her name is Luna", "His office is in Leeds": a thing of the one named last.
        "her" | "his" | "its" | "their" if words.len() >= 3 => {
            let subject = subject_of(previous)?;
            let tail = words[2..].join(" ");
            let tail = tail.trim_end_matches(['.', '!']);
            match (bare(words[1]).as_str(), tail.strip_prefix("is ")) {
                ("name", Some(name)) => sentence(format!("{subject} is called {name}")),
                _ => sentence(format!("{subject}'s {} {tail}", words[1])),
            }
        }
        "he's" | "she's" | "it's" | "they're" if !rest.is_empty() => {
            let subject = subject_of(previous)?;
            sentence(format!("{subject} is {rest}"))
        }
        _ if !same_message
            || words
                .iter()
                .any(|word| ACKNOWLEDGEMENTS.contains(&bare(word).as_str())) =>
        {
            None
        }
        "also" | "or" | "plus" | "and" if !rest.is_empty() && words.len() <= 8 => {
            let verb = predicate(previous)?;
            sentence(format!("{verb} {rest}"))
        }
        _ if words.len() <= 8
            && words
                .iter()
                .any(|word| matches!(bare(word).as_str(), "too" | "either"))
            && !words
                .iter()
                .any(|word| AUXILIARIES.contains(&bare(word).as_str())) =>
        {
            let verb = predicate(previous)?;
            sentence(format!("{verb} {}", clause.trim_end_matches(['.', '!'])))
        }
        _ if words.len() <= 4
            && words
                .iter()
                .all(|word| word.chars().next().is_some_and(|c| !c.is_uppercase()) || word == &words[0])
            && !words
                .iter()
                .any(|word| AUXILIARIES.contains(&bare(word).as_str())) =>
        {
            let subject = referent(previous)?;
            sentence(format!(
                "{subject} is {}",
                clause.trim_end_matches(['.', '!']).to_lowercase()
            ))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openers_without_content_are_stripped() {
        assert_eq!(
            strip_openers("FYI I'm lactose intolerant"),
            "I'm lactose intolerant"
        );
        assert_eq!(
            strip_openers("Just so you know, I'm colour blind"),
            "I'm colour blind"
        );
        assert_eq!(strip_openers("Quick update: we moved"), "we moved");
        assert_eq!(strip_openers("I should mention I use VS Code"), "I use VS Code");
        assert_eq!(strip_openers("My my favourite band"), "My favourite band");
        assert_eq!(strip_openers("I live in Porto"), "I live in Porto");
        assert_eq!(strip_openers("Meeting at 10:30 today"), "Meeting at 10:30 today");
    }

    #[test]
    fn a_subject_left_out_after_an_adverb_or_before_a_participle_comes_back() {
        for (said, restored) in [
            ("Officially retired as of Friday", "I retired as of Friday"),
            ("Just eating balanced meals now", "I'm eating balanced meals now"),
            (
                "Taking a few weeks off before job hunting",
                "I'm taking a few weeks off before job hunting",
            ),
            (
                "The new place, Iron Works, has better squat racks",
                "My new place, Iron Works, has better squat racks",
            ),
            (
                "First week on the fraud team went well",
                "My first week on the fraud team went well",
            ),
        ] {
            assert_eq!(restore_subject(said), restored, "{said}");
        }
        // Nouns in "-ing" and "-ly", and a thing that is not the user's, stay as said.
        for said in [
            "Meeting went well",
            "Nothing new here",
            "Morning runs are the best",
            "Family is visiting next week",
            "Training starts Monday",
            "The weather is nice",
        ] {
            assert_eq!(restore_subject(said), said, "{said}");
        }
        // The rule reads no meaning: a new thing of the world is taken for the user's.
        assert_eq!(restore_subject("The new season is out"), "My new season is out");
    }

    #[test]
    fn a_possessive_pronoun_takes_the_thing_named_last() {
        let cat = Some("The user's cat has been sneezing a lot.");
        assert_eq!(
            resolve("Her name is Luna and she's 12", cat, true).as_deref(),
            Some("The user's cat is called Luna and she's 12.")
        );
        assert_eq!(
            resolve(
                "His office is in Leeds",
                Some("The user's brother Sam is an engineer."),
                false
            )
            .as_deref(),
            Some("The user's brother Sam's office is in Leeds.")
        );
        assert_eq!(resolve("Her name is Luna", None, true), None);
    }

    #[test]
    fn a_subject_left_out_comes_back() {
        assert_eq!(
            restore_subject("Got promoted to staff engineer this morning"),
            "I got promoted to staff engineer this morning"
        );
        assert_eq!(
            restore_subject("Finally switched to Colemak"),
            "I switched to Colemak"
        );
        assert_eq!(
            restore_subject("Sold the Civic, bought a Tesla"),
            "I sold the Civic, bought a Tesla"
        );
        assert_eq!(
            restore_subject("Today was my first day at Datadog!"),
            "My first day at Datadog was today"
        );
        assert_eq!(
            restore_subject("Moving to Berlin in May"),
            "I'm moving to Berlin in May"
        );
        assert_eq!(restore_subject("I live in Porto"), "I live in Porto");
        assert_eq!(restore_subject("Was great"), "Was great");
    }

    #[test]
    fn referents_name_what_a_fact_is_about() {
        assert_eq!(
            referent("The user's sister Anna lives in Vienna.").as_deref(),
            Some("The user's sister Anna")
        );
        assert_eq!(
            referent("The user's manager is Tom.").as_deref(),
            Some("The user's manager")
        );
        assert_eq!(
            referent("The user adopted a dog.").as_deref(),
            Some("The user's dog")
        );
        assert_eq!(
            referent("The user has a cat called Nori.").as_deref(),
            Some("The user's cat Nori")
        );
        assert_eq!(
            referent("The user bought a used Volvo.").as_deref(),
            Some("The user's Volvo")
        );
        assert_eq!(referent("The user is vegetarian."), None);
    }

    #[test]
    fn an_opinion_before_a_pronoun_leaves_the_pronoun_to_resolve() {
        assert_eq!(
            strip_openers("I think it replaces Vim for me now"),
            "it replaces Vim for me now"
        );
        assert_eq!(strip_openers("I think I'm vegan now"), "I think I'm vegan now");
        assert_eq!(
            resolve(
                "it replaces Vim for me now",
                Some("The user spent the weekend setting up Zed."),
                true
            )
            .as_deref(),
            Some("Zed replaces Vim for the user now.")
        );
        // A time is not what "it" points at; the thing the user named is.
        assert_eq!(
            resolve("It sleeps all day", Some("The user adopted a dog."), true).as_deref(),
            Some("The user's dog sleeps all day.")
        );
        assert_eq!(
            resolve("It's expensive", Some("The user moved to Berlin."), true).as_deref(),
            Some("Berlin is expensive.")
        );
        assert_eq!(
            restore_subject("All settled in Amsterdam now"),
            "I settled in Amsterdam now"
        );
        assert_eq!(restore_subject("All good here"), "All good here");
    }

    #[test]
    fn a_message_that_opens_with_and_goes_on_from_before() {
        assert!(continues("Oh and penicillin too, I found out the hard way."));
        assert!(continues("Oh, also the dog"));
        assert!(continues("and oat milk"));
        assert!(!continues("Oh no, I missed the train"));
        assert!(!continues("Andrew is my cousin"));
        assert!(!continues("ok"));
    }

    #[test]
    fn pronouns_and_fragments_take_their_meaning_from_before() {
        assert_eq!(
            resolve(
                "She's a greyhound called Pepper.",
                Some("The user adopted a dog."),
                false
            )
            .as_deref(),
            Some("The user's dog is a greyhound called Pepper.")
        );
        assert_eq!(
            resolve(
                "It needs new brakes.",
                Some("The user bought a used Volvo."),
                true
            )
            .as_deref(),
            Some("The user's Volvo needs new brakes.")
        );
        assert_eq!(
            resolve(
                "Also tree nuts, especially cashews.",
                Some("The user is allergic to peanuts."),
                true
            )
            .as_deref(),
            Some("The user is allergic to tree nuts, especially cashews.")
        );
        assert_eq!(
            resolve(
                "French too, but only a little.",
                Some("The user speaks Spanish fluently."),
                true
            )
            .as_deref(),
            Some("The user speaks French too, but only a little.")
        );
        assert_eq!(
            resolve("Black, very shy.", Some("The user has a cat called Nori."), true).as_deref(),
            Some("The user's cat Nori is black, very shy.")
        );
        assert_eq!(resolve("She's great.", None, true), None);
        assert_eq!(
            resolve("ok thanks", Some("The user has a cat called Nori."), true),
            None
        );
        assert_eq!(
            resolve("Black, very shy.", Some("The user has a cat called Nori."), false),
            None
        );
        assert_eq!(
            resolve("It is raining.", Some("The user is vegetarian."), true),
            None
        );
    }

    #[test]
    fn a_thing_of_the_users_told_without_its_owner_gets_one() {
        assert_eq!(
            restore_subject("New goal is just a half marathon in the spring."),
            "My new goal is just a half marathon in the spring."
        );
        assert_eq!(restore_subject("New York is lovely"), "New York is lovely");
        assert_eq!(restore_subject("Next is the hard part"), "Next is the hard part");
    }

    #[test]
    fn an_event_of_a_life_and_a_time_in_a_state_are_the_users() {
        assert_eq!(
            restore_subject("The divorce was finalised last week"),
            "My divorce was finalised last week"
        );
        assert_eq!(
            restore_subject("Graduation was yesterday"),
            "My graduation was yesterday"
        );
        assert_eq!(
            restore_subject("Three months smoke-free today"),
            "I'm three months smoke-free today"
        );
        assert_eq!(restore_subject("Two weeks sober"), "I'm two weeks sober");
        assert_eq!(
            restore_subject("Can't run at the moment"),
            "I can't run at the moment"
        );
        assert_eq!(
            restore_subject("Obsessed with cold water swimming"),
            "I'm obsessed with cold water swimming"
        );
        assert_eq!(restore_subject("Moved to Leeds"), "I moved to Leeds");
        assert_eq!(
            restore_subject("Officially done with my MPH"),
            "I'm done with my MPH"
        );
        // Not an event of a life, or not a state.
        assert_eq!(restore_subject("The weather was awful"), "The weather was awful");
        assert_eq!(
            restore_subject("Three weeks until the exam"),
            "Three weeks until the exam"
        );
    }

    #[test]
    fn the_end_of_a_thing_the_user_spoke_of_is_kept() {
        let known: std::collections::HashSet<String> = crate::language::content_tokens(
            "The user broke their wrist, it's in a cast for six weeks. Scripts run by cron.",
        );
        assert_eq!(
            about_known_thing("The cast came off today!", &known).as_deref(),
            Some("The user's cast came off today.")
        );
        assert_eq!(
            about_known_thing("cron is retired and every pipeline is a Dagster job now", &known).as_deref(),
            Some("Cron is retired and every pipeline is a Dagster job now.")
        );
        let known = crate::language::content_tokens("I drive a 2012 Golf, mostly for the school run.");
        assert_eq!(
            about_known_thing("The school run is on the cargo bike now", &known).as_deref(),
            Some("The user's school run is on the cargo bike now.")
        );
        assert_eq!(about_known_thing("The weather is lovely now", &known), None);
        let known = crate::language::content_tokens(
            "The user broke their wrist, it's in a cast for six weeks. Scripts run by cron.",
        );
        // Not an end, or not something the user spoke of.
        assert_eq!(about_known_thing("The cast was itchy", &known), None);
        assert_eq!(about_known_thing("The meeting is over", &known), None);
        assert_eq!(about_known_thing("It is raining", &known), None);
    }

    #[test]
    fn a_frame_around_a_statement_is_stripped_but_not_what_binds_it() {
        let cases = [
            ("Heads up, I'm moving to Ghent", "I'm moving to Ghent"),
            ("Not gonna lie, I hate cilantro", "I hate cilantro"),
            ("Random but my cat is called Nori", "my cat is called Nori"),
            ("I forgot to tell you that I quit my job", "I quit my job"),
            (
                "I ought to mention my sister lives in Vienna",
                "my sister lives in Vienna",
            ),
            ("I'm colour blind btw", "I'm colour blind"),
            ("For the record, I'm a nurse", "I'm a nurse"),
            (
                "Can you remember that my son is allergic to eggs",
                "my son is allergic to eggs",
            ),
            ("Please keep in mind I'm colour blind", "I'm colour blind"),
            ("You should know that I work nights", "I work nights"),
            (
                "Make a note that our office moved to Leeds",
                "our office moved to Leeds",
            ),
            ("Keep in mind that my son is diabetic", "my son is diabetic"),
            ("I, uh, live in Ghent", "I live in Ghent"),
            ("I am, honestly, a vegan", "I am a vegan"),
            ("I live in Ghent (btw)", "I live in Ghent"),
            ("I live in Ghent, fwiw", "I live in Ghent"),
            ("Also, just saying, I'm vegan", "I'm vegan"),
            (
                "I live in Ghent, like my sister",
                "I live in Ghent, like my sister",
            ),
            ("I live in Ghent now, just so you know.", "I live in Ghent now"),
        ];
        for (said, expected) in cases {
            assert_eq!(strip_openers(said), expected, "stripping {said:?}");
        }
        for kept in [
            "When I deploy, I run the tests",
            "Last week I moved to Berlin",
            "Sam and I broke up",
            "In Berlin I rent a flat",
            "I think I like tea",
            "I live in Porto and my sister lives in Vienna",
            "Because of the rain I stayed home",
            "Passed my driving test this morning!",
            "Cancelled my PureGym membership",
            "Starting my new job on Monday",
            "Can you remember what I said yesterday about my sister",
        ] {
            assert_eq!(strip_openers(kept), kept, "keeping {kept:?}");
        }
    }
}
