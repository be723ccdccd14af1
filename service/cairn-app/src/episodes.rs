//! Ingest: storing what the user said as episodes.

use crate::{Cairn, RequestContext, audit_event, now, validate};
use cairn_core::{Change, ChangeSet, Episode, Error, Page, PageRequest, Result, Scope, new_id};
use chrono::{DateTime, Utc};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    User,
    Assistant,
}

#[derive(Clone, Debug)]
pub struct Message {
    pub role: Role,
    pub content: String,
    pub timestamp: Option<DateTime<Utc>>,
}

/// When consolidation should run after an ingest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ConsolidateMode {
    #[default]
    Async,
    Sync,
    None,
}

impl ConsolidateMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ConsolidateMode::Async => "async",
            ConsolidateMode::Sync => "sync",
            ConsolidateMode::None => "none",
        }
    }
}

#[derive(Clone, Debug)]
pub struct IngestRequest {
    pub messages: Vec<Message>,
    pub session_id: Option<String>,
    pub consolidate: ConsolidateMode,
}

/// What happened to consolidation for this ingest.
#[derive(Clone, Debug)]
pub struct ConsolidationReport {
    pub requested: ConsolidateMode,
    pub ran: bool,
    pub detail: String,
}

#[derive(Clone, Debug)]
pub struct IngestOutcome {
    pub episode_ids: Vec<String>,
    pub consolidation: ConsolidationReport,
}

impl Cairn {
    /// Stores each user message as an episode, durably, in one transaction. Assistant
    /// messages are never stored as evidence.
    pub async fn ingest(
        &self,
        scope: &Scope,
        context: &RequestContext,
        request: IngestRequest,
    ) -> Result<IngestOutcome> {
        let limits = &self.settings;
        if request.messages.is_empty() {
            return Err(Error::invalid("messages", "must hold at least one message"));
        }
        if request.messages.len() > limits.max_messages {
            return Err(Error::invalid(
                "messages",
                format!(
                    "holds {} messages; the limit is {}",
                    request.messages.len(),
                    limits.max_messages
                ),
            ));
        }
        let session_id = validate::label("session_id", request.session_id.as_deref())?;
        let ingested_at = now();
        let mut episodes = Vec::new();
        for (index, message) in request.messages.iter().enumerate() {
            let field = format!("messages[{index}].content");
            let content = validate::text(&field, &message.content, limits.max_text_chars)?;
            if message.role == Role::User {
                episodes.push(Episode {
                    id: new_id("epi"),
                    session_id: session_id.clone(),
                    text: content,
                    occurred_at: message.timestamp.unwrap_or(ingested_at),
                    ingested_at,
                    embedding: None,
                });
            }
        }
        if episodes.is_empty() {
            return Err(Error::invalid(
                "messages",
                "holds no user message; assistant messages are context, not evidence",
            ));
        }
        let vectors = self
            .embed_all(episodes.iter().map(|episode| episode.text.clone()).collect())
            .await?;
        for (episode, vector) in episodes.iter_mut().zip(vectors) {
            episode.embedding = vector;
        }
        let episode_ids: Vec<String> = episodes.iter().map(|episode| episode.id.clone()).collect();
        let event = audit_event(
            scope,
            context,
            "episode.ingest",
            episode_ids.clone(),
            serde_json::json!({ "count": episode_ids.len() }),
        );
        self.store
            .commit(
                scope,
                ChangeSet::new(event).with(Change::InsertEpisodes(episodes)),
            )
            .await?;
        Ok(IngestOutcome {
            episode_ids,
            consolidation: ConsolidationReport {
                requested: request.consolidate,
                ran: false,
                detail: "no consolidation pipeline is configured; episodes were stored only".to_owned(),
            },
        })
    }

    pub async fn get_episode(&self, scope: &Scope, episode_id: &str) -> Result<Episode> {
        self.store
            .get_episode(scope, episode_id)
            .await?
            .ok_or(Error::NotFound { what: "episode" })
    }

    pub async fn list_episodes(&self, scope: &Scope, page: &PageRequest) -> Result<Page<Episode>> {
        self.store.list_episodes(scope, page).await
    }
}
