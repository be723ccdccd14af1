//! The consolidation ports: an extractor turns new episodes into candidate facts and
//! playbooks, a judge relates one candidate to the scope's nearest current facts.
//!
//! Both have an LLM implementation and a deterministic offline one; the gates that
//! decide what is written live in the use cases and apply to either.

use crate::error::Result;
use crate::model::{Episode, Fact, FactType};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// What an extraction sees. The assistant text is transient context: it may explain
/// what the user meant, but it is never evidence.
#[derive(Clone, Debug)]
pub struct ExtractionInput {
    /// Episodes past the watermark, oldest first: the evidence to extract from.
    pub episodes: Vec<Episode>,
    /// Up to N earlier episodes, oldest first, for context (coreference, topic).
    pub earlier: Vec<Episode>,
    /// What the assistant said around these episodes.
    pub assistant_context: Vec<String>,
    /// Current facts of the scope relevant to the new episodes.
    pub known_facts: Vec<Fact>,
}

/// One candidate fact, before any gate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CandidateFact {
    /// Third person and self-contained ("The user's husband Diego ...").
    pub text: String,
    pub fact_type: FactType,
    pub confidence: f32,
    /// Set for time-bound statements ("an exam tomorrow"): hours after the statement.
    pub expires_in_hours: Option<f64>,
    /// Only when the user dated it.
    pub valid_from: Option<DateTime<Utc>>,
    pub valid_to: Option<DateTime<Utc>>,
    /// Ids of the episodes that state it (a subset of the input episodes).
    pub source_episode_ids: Vec<String>,
    /// The words of the episode that support it.
    pub span: Option<String>,
}

/// One candidate playbook (a procedure the user follows or asked to keep).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CandidatePlaybook {
    pub name: String,
    pub trigger: String,
    pub steps: Vec<String>,
    pub confidence: f32,
    pub source_episode_ids: Vec<String>,
}

/// Model calls and tokens spent by one extraction or judgement.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    pub calls: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Estimated cost in US dollars, when prices are configured.
    pub cost_usd: f64,
}

impl Usage {
    pub fn add(&mut self, other: Usage) {
        self.calls += other.calls;
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cost_usd += other.cost_usd;
    }
}

#[derive(Clone, Debug, Default)]
pub struct Extraction {
    pub facts: Vec<CandidateFact>,
    pub playbooks: Vec<CandidatePlaybook>,
    pub usage: Usage,
    /// Items the extractor returned but validation rejected, with the reason.
    pub rejected: Vec<String>,
    /// Set when the model's output could not be used at all: the run fails with this
    /// error once the tokens spent on it (`usage`) are counted.
    pub unusable: Option<String>,
}

#[async_trait]
pub trait Extractor: Send + Sync + 'static {
    /// `offline`, or the provider and model, for decisions and metrics.
    fn name(&self) -> &str;

    async fn extract(&self, input: &ExtractionInput) -> Result<Extraction>;
}

/// A current fact shown to the judge under a short alias (`m1` ... `m5`).
#[derive(Clone, Debug)]
pub struct ShownFact {
    pub alias: String,
    pub fact: Fact,
    /// Cosine similarity to the candidate, when vectors exist.
    pub similarity: Option<f32>,
}

/// How a candidate relates to the facts it was shown. Targets are aliases, checked by
/// the caller against what was shown.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    New,
    Updates(String),
    Extends(String),
    Duplicate(String),
}

#[derive(Clone, Debug)]
pub struct Judgement {
    pub verdict: Verdict,
    pub reason: String,
    pub usage: Usage,
}

#[async_trait]
pub trait Judge: Send + Sync + 'static {
    fn name(&self) -> &str;

    async fn judge(&self, candidate: &CandidateFact, shown: &[ShownFact]) -> Result<Judgement>;
}

/// One recalled memory shown to an answerer under a short alias (`m1` ... `m8`).
#[derive(Clone, Debug)]
pub struct ShownMemory {
    pub alias: String,
    pub text: String,
    /// When it was said (episodes) or learned (facts and playbooks).
    pub at: DateTime<Utc>,
}

/// An answer composed from shown memories. Citations are aliases, checked by the
/// caller against what was shown.
#[derive(Clone, Debug, PartialEq)]
pub struct ComposedAnswer {
    pub answer: String,
    pub known: bool,
    pub citations: Vec<String>,
    pub usage: Usage,
}

/// Writes an answer to a question from the memories it is shown and nothing else.
#[async_trait]
pub trait Answerer: Send + Sync + 'static {
    fn name(&self) -> &str;

    async fn answer(&self, question: &str, shown: &[ShownMemory]) -> Result<ComposedAnswer>;
}
