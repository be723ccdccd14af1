//! Ingest: storing what the user said as episodes.

use crate::consolidation::queued_job;
use crate::{Cairn, ConsolidateOptions, ConsolidationOutcome, RequestContext, audit_event, now, validate};
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
    /// The queued job (async, and sync as the fallback when the run fails).
    pub job_id: Option<String>,
    /// The synchronous run, when one ran and finished.
    pub outcome: Option<ConsolidationOutcome>,
    /// Why a synchronous run did not finish (the job stays queued and retries).
    pub error: Option<String>,
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
        let mut assistant_context = Vec::new();
        for (index, message) in request.messages.iter().enumerate() {
            let field = format!("messages[{index}].content");
            let content = validate::text(&field, &message.content, limits.max_text_chars)?;
            match message.role {
                Role::User => episodes.push(Episode {
                    id: new_id("epi"),
                    session_id: session_id.clone(),
                    text: content,
                    occurred_at: message.timestamp.unwrap_or(ingested_at),
                    ingested_at,
                    embedding: None,
                }),
                // Context for extraction only: kept with the job, deleted with it.
                Role::Assistant => assistant_context.push(content),
            }
        }
        if episodes.is_empty() {
            return Err(Error::invalid(
                "messages",
                "holds no user message; assistant messages are context, not evidence",
            ));
        }
        // The queue is read while the episodes are embedded.
        let queued = async {
            match request.consolidate {
                ConsolidateMode::None => Ok(0),
                ConsolidateMode::Async | ConsolidateMode::Sync => {
                    let full = self.settings.consolidation.max_pending_jobs_per_scope;
                    self.store.count_pending_jobs(scope, full).await
                }
            }
        };
        // So is the store readied for the commit (a cluster reserves the positions).
        let (vectors, queued, ()) = futures_util::future::try_join3(
            self.embed_all(episodes.iter().map(|episode| episode.text.clone()).collect()),
            queued,
            self.store.prepare_episodes(scope, &episodes),
        )
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
        let mut change_set = ChangeSet::new(event).with(Change::InsertEpisodes(episodes));
        // The job is queued in the same transaction as the episodes, so an acknowledged
        // ingest is consolidated even if the process dies right after answering.
        // A queued run reads every episode past the watermark, so a scope whose queue is
        // full needs no further job: a flood of ingests cannot grow the queue.
        let queue_full = match request.consolidate {
            ConsolidateMode::None => false,
            ConsolidateMode::Async | ConsolidateMode::Sync => {
                queued >= self.settings.consolidation.max_pending_jobs_per_scope
            }
        };
        let job_id = match request.consolidate {
            ConsolidateMode::None => None,
            ConsolidateMode::Async | ConsolidateMode::Sync if queue_full => None,
            ConsolidateMode::Async | ConsolidateMode::Sync => {
                // An asynchronous job waits for the rest of a burst; a synchronous
                // ingest's job is the fallback of its run, due at once.
                let due = match request.consolidate {
                    ConsolidateMode::Async => ingested_at + self.settings.consolidation.settle,
                    _ => ingested_at,
                };
                let job = queued_job(new_id("job"), scope, context, assistant_context, ingested_at, due);
                let id = job.id.clone();
                change_set = change_set.with(Change::EnqueueJob(job));
                Some(id)
            }
        };
        self.store.commit(scope, change_set).await?;
        let mut report = ConsolidationReport {
            requested: request.consolidate,
            job_id,
            outcome: None,
            error: None,
        };
        match request.consolidate {
            ConsolidateMode::Async => self.wake_consolidation(),
            ConsolidateMode::Sync => match self
                .consolidate(scope, context, ConsolidateOptions::default())
                .await
            {
                Ok(outcome) => report.outcome = Some(outcome),
                Err(error) => {
                    tracing::warn!(tenant = %scope.tenant(), error = %error, "synchronous consolidation failed; queued");
                    report.error = Some(match &error {
                        Error::Provider(_) | Error::Unavailable(_) => error.to_string(),
                        _ => error.code().as_str().to_owned(),
                    });
                    self.wake_consolidation();
                }
            },
            ConsolidateMode::None => {}
        }
        Ok(IngestOutcome {
            episode_ids,
            consolidation: report,
        })
    }

    pub async fn get_episode(&self, scope: &Scope, episode_id: &str) -> Result<Episode> {
        self.store
            .get_episode(scope, episode_id)
            .await?
            .ok_or(Error::NotFound { what: "episode" })
    }

    pub async fn list_episodes(
        &self,
        scope: &Scope,
        session: Option<&str>,
        page: &PageRequest,
    ) -> Result<Page<Episode>> {
        let session = validate::label("session_id", session)?;
        self.store.list_episodes(scope, session.as_deref(), page).await
    }
}
