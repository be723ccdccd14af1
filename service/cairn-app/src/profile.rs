//! Profile (core memory): lasting facts, recent dynamic facts, and a prompt block.

use crate::{Cairn, RecallHit, RecallRequest, now};
use cairn_core::{Error, Fact, FactStatus, Memory, PageRequest, Result, Scope, StatusFilter};
use chrono::{DateTime, Utc};

/// How many active facts a profile reads at most.
const PROFILE_SCAN: usize = 500;
const DYNAMIC_FACTS: usize = 20;

#[derive(Clone, Debug, Default)]
pub struct ProfileRequest {
    pub query: Option<String>,
    pub k: Option<usize>,
    pub as_of: Option<DateTime<Utc>>,
    /// Approximate token budget of the context block (4 characters a token).
    pub max_tokens: Option<usize>,
}

#[derive(Clone, Debug)]
pub struct Profile {
    pub static_facts: Vec<Fact>,
    pub dynamic_facts: Vec<Fact>,
    /// The entities the profile's facts name, each with the ids of its facts.
    pub entities: Vec<crate::Entity>,
    pub hits: Vec<RecallHit>,
    pub context: String,
}

impl Cairn {
    pub async fn profile(&self, scope: &Scope, request: ProfileRequest) -> Result<Profile> {
        let max_tokens = request.max_tokens.unwrap_or(1_000);
        if !(50..=32_000).contains(&max_tokens) {
            return Err(Error::invalid("max_tokens", "must be between 50 and 32000"));
        }
        if let Some(k) = request.k
            && (k == 0 || k > self.settings.max_k)
        {
            return Err(Error::invalid(
                "k",
                format!("must be between 1 and {}", self.settings.max_k),
            ));
        }
        let as_of = request.as_of.unwrap_or_else(now);
        let mut active = Vec::new();
        let mut page = PageRequest {
            limit: 200,
            cursor: None,
        };
        loop {
            let batch = self
                .store
                .list_facts(scope, StatusFilter::Only(FactStatus::Active), as_of, &page)
                .await?;
            active.extend(batch.items.into_iter().filter(|fact| fact.valid_at(as_of)));
            match batch.next_cursor {
                Some(cursor) if active.len() < PROFILE_SCAN => page.cursor = Some(cursor),
                _ => break,
            }
        }
        let (static_facts, mut dynamic_facts): (Vec<Fact>, Vec<Fact>) =
            active.into_iter().partition(|fact| fact.fact_type.is_lasting());
        dynamic_facts.truncate(DYNAMIC_FACTS);

        let hits = match request.query.as_deref().map(str::trim) {
            Some(query) if !query.is_empty() => {
                let mut recall = RecallRequest::new(query);
                recall.k = request.k;
                recall.as_of = Some(as_of);
                self.recall(scope, recall).await?.hits
            }
            _ => Vec::new(),
        };
        let context = context_block(&static_facts, &dynamic_facts, &hits, max_tokens * 4);
        let all: Vec<Fact> = static_facts.iter().chain(&dynamic_facts).cloned().collect();
        let entities = crate::entities::entities_of(&all);
        Ok(Profile {
            static_facts,
            dynamic_facts,
            entities,
            hits,
            context,
        })
    }
}

/// A plain-text block for a prompt, cut at `budget_chars` on a line boundary.
fn context_block(
    static_facts: &[Fact],
    dynamic_facts: &[Fact],
    hits: &[RecallHit],
    budget_chars: usize,
) -> String {
    let mut sections: Vec<(&str, Vec<String>)> = vec![
        (
            "What is known about the user:",
            static_facts.iter().map(|fact| fact.text.clone()).collect(),
        ),
        (
            "Recent facts:",
            dynamic_facts.iter().map(|fact| fact.text.clone()).collect(),
        ),
    ];
    let relevant: Vec<String> = hits
        .iter()
        .filter(|hit| {
            !matches!(&hit.memory, Memory::Fact(fact) if static_facts.iter().chain(dynamic_facts).any(|known| known.id == fact.id))
        })
        .map(|hit| match &hit.memory {
            Memory::Fact(fact) => fact.text.clone(),
            Memory::Episode(episode) => format!("The user said: {}", episode.text),
            Memory::Playbook(playbook) => playbook.searchable_text(),
        })
        .collect();
    sections.push(("Relevant memories:", relevant));

    let mut block = String::new();
    for (heading, lines) in sections {
        if lines.is_empty() {
            continue;
        }
        let mut section = format!("{heading}\n");
        let mut wrote_line = false;
        for line in lines {
            let entry = format!("- {line}\n");
            if block.len() + section.len() + entry.len() > budget_chars {
                break;
            }
            section.push_str(&entry);
            wrote_line = true;
        }
        if wrote_line {
            block.push_str(&section);
        }
    }
    block.trim_end().to_owned()
}
