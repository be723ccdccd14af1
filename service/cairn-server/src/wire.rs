//! Wire formats of the REST API: every request and response body is a type here, and
//! the OpenAPI document's schemas are generated from these types (see `openapi.rs`).
//! MCP tools answer with the same response types.

use cairn_app::{
    Answer, AnswerRequest, ConsolidateMode, ConsolidateOptions, ConsolidationOutcome, Contradiction, Entity,
    Explanation, FactInput, FactWriteOutcome, IngestOutcome, IngestRequest, Message, PlaybookInput,
    PlaybookVersionInput, Profile, RecallHit, RecallRequest, RecallResult, Role,
};
use cairn_core::{
    AuditEvent, ConsolidationJob, Decision, DecisionKind, Episode, ErasureReceipt, Error, Fact, FactStatus,
    FactType, Memory, Page, PageRequest, Playbook, StatusFilter, Tier, Tombstone, TombstoneReason,
};
use chrono::{DateTime, FixedOffset, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

const DEFAULT_PAGE: usize = 50;
const MAX_PAGE: usize = 200;

/// Parses an optional RFC 3339 time, naming the field when it is not one.
pub fn utc(field: &str, time: Option<&str>) -> Result<Option<DateTime<Utc>>, Error> {
    time.map(|text| {
        DateTime::<FixedOffset>::parse_from_rfc3339(text)
            .map(|time| time.with_timezone(&Utc))
            .map_err(|_| Error::invalid(field, "must be an RFC 3339 time such as 2026-01-31T09:00:00Z"))
    })
    .transpose()
}

/// A request body that must be a JSON object. Derived struct deserializers also read a
/// struct from a JSON array (its fields in order); the API documents objects only, so
/// every body is read through this, and `[...]` is refused as malformed.
#[derive(Debug)]
pub struct Object<T>(pub T);

impl<T> std::ops::Deref for Object<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Visit<T> {
            type Value = T;
            fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
                formatter.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map))
            }
        }
        deserializer
            .deserialize_map(Visit(std::marker::PhantomData))
            .map(Object)
    }
}

/// A point in time on the wire: RFC 3339 in UTC with microseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timestamp(pub DateTime<Utc>);

impl Serialize for Timestamp {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0.to_rfc3339_opts(chrono::SecondsFormat::Micros, true))
    }
}

impl JsonSchema for Timestamp {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Timestamp".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "type": "string", "format": "date-time" })
    }
}

fn time(time: DateTime<Utc>) -> Timestamp {
    Timestamp(time)
}

fn optional_time(value: Option<DateTime<Utc>>) -> Option<Timestamp> {
    value.map(Timestamp)
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MessageBody {
    #[schemars(extend("enum" = ["user", "assistant"]))]
    pub role: String,
    #[schemars(length(min = 1), regex(pattern = r"\S"))]
    pub content: String,
    /// When it was said (default: now).
    #[schemars(extend("format" = "date-time"))]
    pub timestamp: Option<String>,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IngestBody {
    /// User messages become episodes; assistant messages are context for extraction
    /// only, so at least one message must be the user's.
    #[schemars(length(min = 1), extend("contains" = { "type": "object", "properties": { "role": { "const": "user" } } }))]
    pub messages: Vec<MessageBody>,
    pub session_id: Option<String>,
    /// When consolidation runs (default `async`).
    #[schemars(extend("enum" = ["async", "sync", "none", null]))]
    pub consolidate: Option<String>,
}

impl IngestBody {
    pub fn into_request(self) -> Result<IngestRequest, Error> {
        let consolidate = match self.consolidate.as_deref() {
            None | Some("async") => ConsolidateMode::Async,
            Some("sync") => ConsolidateMode::Sync,
            Some("none") => ConsolidateMode::None,
            Some(_) => return Err(Error::invalid("consolidate", "must be async, sync or none")),
        };
        let messages = self
            .messages
            .into_iter()
            .enumerate()
            .map(|(index, message)| {
                let role = match message.role.as_str() {
                    "user" => Role::User,
                    "assistant" => Role::Assistant,
                    _ => {
                        return Err(Error::invalid(
                            format!("messages[{index}].role"),
                            "must be user or assistant",
                        ));
                    }
                };
                Ok(Message {
                    role,
                    content: message.content,
                    timestamp: utc(
                        &format!("messages[{index}].timestamp"),
                        message.timestamp.as_deref(),
                    )?,
                })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        Ok(IngestRequest {
            messages,
            session_id: self.session_id,
            consolidate,
        })
    }
}

/// The answer to an ingest.
#[derive(Serialize, JsonSchema)]
pub struct IngestResponse {
    /// The stored user messages, in order (assistant messages are not stored).
    pub episode_ids: Vec<String>,
    pub consolidation: IngestConsolidation,
}

/// What happened to consolidation for an ingest.
#[derive(Serialize, JsonSchema)]
pub struct IngestConsolidation {
    #[schemars(extend("enum" = ["async", "sync", "none"]))]
    pub requested: &'static str,
    /// A synchronous run finished (its outcome is `run`).
    pub ran: bool,
    /// A job is queued for the worker.
    pub queued: bool,
    pub job_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run: Option<ConsolidationResponse>,
    /// Why a synchronous run did not finish (the job stays queued and retries).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

pub fn ingest_response(outcome: &IngestOutcome) -> IngestResponse {
    let report = &outcome.consolidation;
    IngestResponse {
        episode_ids: outcome.episode_ids.clone(),
        consolidation: IngestConsolidation {
            requested: report.requested.as_str(),
            ran: report.outcome.is_some(),
            queued: report.outcome.is_none() && report.job_id.is_some(),
            job_id: report.job_id.clone(),
            run: report.outcome.as_ref().map(consolidation),
            error: report.error.clone(),
        },
    }
}

#[derive(Deserialize, Default, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConsolidateBody {
    #[serde(default)]
    pub dry_run: bool,
    /// Re-read every episode of the user, not only those past the watermark.
    #[serde(default)]
    pub from_start: bool,
}

impl ConsolidateBody {
    pub fn into_options(self) -> ConsolidateOptions {
        ConsolidateOptions {
            dry_run: self.dry_run,
            from_start: self.from_start,
            max_batches: None,
            background: false,
        }
    }
}

/// One consolidation run (or a dry run, which wrote nothing).
#[derive(Serialize, JsonSchema)]
pub struct ConsolidationResponse {
    pub run_id: String,
    pub dry_run: bool,
    pub episodes_read: usize,
    /// The position of the last episode the run read.
    pub watermark: u64,
    pub extractor: String,
    pub judge: String,
    pub decisions: Vec<DecisionResponse>,
    pub facts_created: Vec<FactResponse>,
    pub playbooks_created: usize,
    pub usage: ModelUsage,
    /// Set when the token budget ran out: the rest waits in a job due at this time.
    pub deferred_until: Option<Timestamp>,
    /// The tenant's token budget after the run, when one is configured.
    pub token_budget: Option<TokenBudgetResponse>,
}

/// Model calls and tokens a run spent.
#[derive(Serialize, JsonSchema)]
pub struct ModelUsage {
    pub llm_calls: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Estimated, when prices are configured.
    pub cost_usd: f64,
}

#[derive(Serialize, JsonSchema)]
pub struct TokenBudgetResponse {
    pub tokens_per_day: u64,
    pub used_today: u64,
    pub resets_at: Timestamp,
}

pub fn consolidation(outcome: &ConsolidationOutcome) -> ConsolidationResponse {
    let now = Utc::now();
    ConsolidationResponse {
        run_id: outcome.run_id.clone(),
        dry_run: outcome.dry_run,
        episodes_read: outcome.episodes_read,
        watermark: outcome.watermark,
        extractor: outcome.extractor.clone(),
        judge: outcome.judge.clone(),
        decisions: outcome.decisions.iter().map(decision).collect(),
        facts_created: outcome
            .facts_created
            .iter()
            .map(|created| fact(created, now))
            .collect(),
        playbooks_created: outcome.playbooks_created,
        usage: ModelUsage {
            llm_calls: outcome.usage.calls,
            input_tokens: outcome.usage.input_tokens,
            output_tokens: outcome.usage.output_tokens,
            cost_usd: outcome.usage.cost_usd,
        },
        deferred_until: optional_time(outcome.deferred_until),
        token_budget: outcome.token_budget.as_ref().map(|budget| TokenBudgetResponse {
            tokens_per_day: budget.tokens_per_day,
            used_today: budget.used_today,
            resets_at: time(budget.resets_at),
        }),
    }
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FactBody {
    #[schemars(length(min = 1), regex(pattern = r"\S"))]
    pub text: String,
    #[schemars(extend("enum" = ["identity", "preference", "constraint", "world", "event", null]))]
    pub fact_type: Option<String>,
    #[schemars(range(min = 0.0, max = 1.0))]
    pub confidence: Option<f32>,
    /// The id of an active fact this one replaces.
    pub supersedes: Option<String>,
    /// `natural` keeps the replaced fact as history; `harsh` retracts it.
    #[schemars(extend("enum" = ["natural", "harsh", null]))]
    pub contradiction: Option<String>,
    #[schemars(extend("format" = "date-time"))]
    pub valid_from: Option<String>,
    #[schemars(extend("format" = "date-time"))]
    pub valid_to: Option<String>,
    #[schemars(extend("format" = "date-time"))]
    pub expires_at: Option<String>,
    /// The user restated a retracted or forgotten value first-hand; accepted only when a
    /// user episode ingested after the tombstone states the value.
    #[serde(default)]
    pub reassert: bool,
    /// The episode restating the value (default: the newest such episode found).
    pub evidence_episode_id: Option<String>,
    /// Hold this write for a person's review, whatever the tenant's policy (which a
    /// request can add to, never relax).
    #[serde(default)]
    pub review: bool,
}

pub fn parse_contradiction(value: Option<&str>) -> Result<Contradiction, Error> {
    match value {
        None | Some("natural") => Ok(Contradiction::Natural),
        Some("harsh") => Ok(Contradiction::Harsh),
        Some(_) => Err(Error::invalid("contradiction", "must be natural or harsh")),
    }
}

impl FactBody {
    pub fn into_input(self) -> Result<FactInput, Error> {
        Ok(FactInput {
            text: self.text,
            fact_type: self.fact_type.as_deref().map(FactType::parse).transpose()?,
            confidence: self.confidence,
            supersedes: self.supersedes,
            contradiction: parse_contradiction(self.contradiction.as_deref())?,
            valid_from: utc("valid_from", self.valid_from.as_deref())?,
            valid_to: utc("valid_to", self.valid_to.as_deref())?,
            expires_at: utc("expires_at", self.expires_at.as_deref())?,
            reassert: self.reassert,
            evidence_episode_id: self.evidence_episode_id,
            review: self.review,
        })
    }
}

/// A fact, with its status at the time the request asked about.
#[derive(Clone, Serialize, JsonSchema)]
pub struct FactResponse {
    pub id: String,
    pub text: String,
    pub fact_type: FactType,
    pub confidence: f32,
    pub status: FactStatus,
    /// The user episodes the fact was distilled from.
    pub source_episode_ids: Vec<String>,
    /// The words of the episode that state it.
    pub source_span: Option<String>,
    pub created_at: Timestamp,
    pub superseded_at: Option<Timestamp>,
    pub superseded_by: Option<String>,
    pub retracted_at: Option<Timestamp>,
    pub retraction_reason: Option<String>,
    pub valid_from: Option<Timestamp>,
    pub valid_to: Option<Timestamp>,
    pub expires_at: Option<Timestamp>,
    pub last_used_at: Option<Timestamp>,
    pub use_count: u64,
}

pub fn fact(fact: &Fact, as_of: DateTime<Utc>) -> FactResponse {
    FactResponse {
        id: fact.id.clone(),
        text: fact.text.clone(),
        fact_type: fact.fact_type,
        confidence: fact.confidence,
        status: fact.status_at(as_of).unwrap_or(fact.status),
        source_episode_ids: fact.source_episode_ids.clone(),
        source_span: fact.source_span.clone(),
        created_at: time(fact.created_at),
        superseded_at: optional_time(fact.superseded_at),
        superseded_by: fact.superseded_by.clone(),
        retracted_at: optional_time(fact.retracted_at),
        retraction_reason: fact.retraction_reason.clone(),
        valid_from: optional_time(fact.valid_from),
        valid_to: optional_time(fact.valid_to),
        expires_at: optional_time(fact.expires_at),
        last_used_at: optional_time(fact.last_used_at),
        use_count: fact.use_count,
    }
}

/// One entry of the decision log: what a gate decided, and why.
#[derive(Clone, Serialize, JsonSchema)]
pub struct DecisionResponse {
    pub id: String,
    pub kind: DecisionKind,
    /// The gate that decided.
    #[schemars(extend("enum" = ["validation", "grounding", "tombstones", "dedup", "judge", "request", "review"]))]
    pub gate: &'static str,
    pub reason: String,
    pub fact_id: Option<String>,
    pub target_ids: Vec<String>,
    /// What made the decision: `api`, a consolidation run, an import.
    pub origin: String,
    pub created_at: Timestamp,
}

pub fn decision(decision: &Decision) -> DecisionResponse {
    DecisionResponse {
        id: decision.id.clone(),
        kind: decision.kind,
        gate: decision.kind.gate(),
        reason: decision.reason.clone(),
        fact_id: decision.fact_id.clone(),
        target_ids: decision.target_ids.clone(),
        origin: decision.origin.clone(),
        created_at: time(decision.created_at),
    }
}

/// The answer to a fact write: the fact (new, or the active duplicate) and the decision.
#[derive(Serialize, JsonSchema)]
pub struct FactWriteResponse {
    pub fact: FactResponse,
    pub decision: DecisionResponse,
    /// False when the write matched an existing active fact.
    pub created: bool,
}

pub fn fact_write_response(outcome: &FactWriteOutcome) -> FactWriteResponse {
    FactWriteResponse {
        fact: fact(&outcome.fact, Utc::now()),
        decision: decision(&outcome.decision),
        created: outcome.created,
    }
}

/// `{"fact": ...}`: one fact after a change.
#[derive(Serialize, JsonSchema)]
pub struct FactEnvelope {
    pub fact: FactResponse,
}

/// `{"forgotten": id}`: the fact is erased and its value tombstoned.
#[derive(Serialize, JsonSchema)]
pub struct Forgotten {
    pub forgotten: String,
}

#[derive(Clone, Serialize, JsonSchema)]
pub struct EpisodeResponse {
    pub id: String,
    pub session_id: Option<String>,
    pub text: String,
    pub occurred_at: Timestamp,
    pub ingested_at: Timestamp,
}

pub fn episode(episode: &Episode) -> EpisodeResponse {
    EpisodeResponse {
        id: episode.id.clone(),
        session_id: episode.session_id.clone(),
        text: episode.text.clone(),
        occurred_at: time(episode.occurred_at),
        ingested_at: time(episode.ingested_at),
    }
}

/// A playbook at one version, with its outcome counts.
#[derive(Clone, Serialize, JsonSchema)]
pub struct PlaybookResponse {
    pub id: String,
    pub name: String,
    pub trigger: String,
    pub steps: Vec<String>,
    pub version: u32,
    pub success_count: u64,
    pub failure_count: u64,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    pub last_used_at: Option<Timestamp>,
    pub use_count: u64,
}

pub fn playbook(playbook: &Playbook) -> PlaybookResponse {
    PlaybookResponse {
        id: playbook.id.clone(),
        name: playbook.name.clone(),
        trigger: playbook.trigger.clone(),
        steps: playbook.steps.clone(),
        version: playbook.version,
        success_count: playbook.success_count,
        failure_count: playbook.failure_count,
        created_at: time(playbook.created_at),
        updated_at: time(playbook.updated_at),
        last_used_at: optional_time(playbook.last_used_at),
        use_count: playbook.use_count,
    }
}

/// `{"playbook": ...}`: one playbook after a change.
#[derive(Serialize, JsonSchema)]
pub struct PlaybookEnvelope {
    pub playbook: PlaybookResponse,
}

/// Every version of a playbook, oldest first.
#[derive(Serialize, JsonSchema)]
pub struct PlaybookVersions {
    pub versions: Vec<PlaybookResponse>,
}

/// One audited change: who did what to which records, in which request.
#[derive(Clone, Serialize, JsonSchema)]
pub struct AuditEventResponse {
    pub id: String,
    pub at: Timestamp,
    /// The token subject that made the change.
    pub subject: String,
    pub tenant: String,
    pub user: String,
    pub action: String,
    pub target_ids: Vec<String>,
    pub request_id: String,
    pub detail: serde_json::Value,
}

pub fn audit_event(event: &AuditEvent) -> AuditEventResponse {
    AuditEventResponse {
        id: event.id.clone(),
        at: time(event.at),
        subject: event.subject.clone(),
        tenant: event.tenant.clone(),
        user: event.user.clone(),
        action: event.action.clone(),
        target_ids: event.target_ids.clone(),
        request_id: event.request_id.clone(),
        detail: event.detail.clone(),
    }
}

/// One page of a list; pass `next_cursor` as `cursor` for the next one (null at the end).
#[derive(Serialize, JsonSchema)]
#[schemars(rename = "{T}Page")]
pub struct PageOf<T> {
    pub items: Vec<T>,
    pub next_cursor: Option<String>,
}

pub fn page<T, R>(page: &Page<T>, render: impl Fn(&T) -> R) -> PageOf<R> {
    PageOf {
        items: page.items.iter().map(render).collect(),
        next_cursor: page.next_cursor.clone(),
    }
}

/// A consolidation job as clients see it: its state, attempts and last error (the
/// assistant context it carries is transient extraction input and is not shown).
#[derive(Serialize, JsonSchema)]
pub struct JobResponse {
    pub id: String,
    #[schemars(extend("enum" = ["queued", "dead"]))]
    pub state: &'static str,
    pub created_at: Timestamp,
    pub run_after: Timestamp,
    pub attempts: u32,
    pub last_error: Option<String>,
    pub dead_at: Option<Timestamp>,
}

pub fn job(job: &ConsolidationJob) -> JobResponse {
    JobResponse {
        id: job.id.clone(),
        state: if job.dead_at.is_some() { "dead" } else { "queued" },
        created_at: time(job.created_at),
        run_after: time(job.run_after),
        attempts: job.attempts,
        last_error: job.last_error.clone(),
        dead_at: optional_time(job.dead_at),
    }
}

/// The jobs of a user, queued and dead-lettered.
#[derive(Serialize, JsonSchema)]
pub struct JobList {
    pub items: Vec<JobResponse>,
}

/// `{"job": ...}`: one job after a change.
#[derive(Serialize, JsonSchema)]
pub struct JobEnvelope {
    pub job: JobResponse,
}

/// The receipt of an erasure: how many records of each kind were deleted.
#[derive(Serialize, JsonSchema)]
pub struct ErasureResponse {
    pub deleted: ErasedCounts,
}

#[derive(Serialize, JsonSchema)]
pub struct ErasedCounts {
    pub episodes: u64,
    pub facts: u64,
    pub playbooks: u64,
    pub playbook_versions: u64,
    pub edges: u64,
    pub tombstones: u64,
    pub decisions: u64,
    pub jobs: u64,
    /// Reviews of every status, the pending ones among them.
    pub reviews: u64,
}

pub fn erasure(receipt: &ErasureReceipt) -> ErasureResponse {
    ErasureResponse {
        deleted: ErasedCounts {
            episodes: receipt.episodes,
            facts: receipt.facts,
            playbooks: receipt.playbooks,
            playbook_versions: receipt.playbook_versions,
            edges: receipt.edges,
            tombstones: receipt.tombstones,
            decisions: receipt.decisions,
            jobs: receipt.jobs,
            reviews: receipt.reviews,
        },
    }
}

/// `GET /v1/users/{user}/decisions`: a page, of one kind when given.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DecisionsQuery {
    /// Page size (default 50).
    #[schemars(range(min = 1, max = 200))]
    pub limit: Option<usize>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
    /// Only decisions of this kind.
    pub kind: Option<DecisionKind>,
}

/// `GET /v1/users/{user}/episodes`: a page, of one session when given.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EpisodesQuery {
    /// Page size (default 50).
    #[schemars(range(min = 1, max = 200))]
    pub limit: Option<usize>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
    /// Only episodes of this session.
    #[schemars(length(min = 1, max = 128))]
    pub session_id: Option<String>,
}

/// A list returned whole (short by nature, so not paginated).
#[derive(Serialize, JsonSchema)]
#[schemars(rename = "{T}List")]
pub struct ListOf<T> {
    pub items: Vec<T>,
}

/// A value retracted or forgotten, refused from then on. The value itself is not
/// shown (the tombstone keeps only its fingerprint, and a forgotten fact is erased).
#[derive(Serialize, JsonSchema)]
pub struct TombstoneResponse {
    pub id: String,
    /// The fact whose value it refuses (gone when the fact was forgotten).
    pub fact_id: String,
    pub reason: TombstoneReason,
    pub created_at: Timestamp,
}

pub fn tombstone(tombstone: &Tombstone) -> TombstoneResponse {
    TombstoneResponse {
        id: tombstone.id.clone(),
        fact_id: tombstone.fact_id.clone(),
        reason: tombstone.reason,
        created_at: time(tombstone.created_at),
    }
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PageQuery {
    /// Page size (default 50).
    #[schemars(range(min = 1, max = 200))]
    pub limit: Option<usize>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

pub fn page_request(limit: Option<usize>, cursor: Option<String>) -> Result<PageRequest, Error> {
    let limit = limit.unwrap_or(DEFAULT_PAGE);
    if limit == 0 || limit > MAX_PAGE {
        return Err(Error::invalid(
            "limit",
            format!("must be between 1 and {MAX_PAGE}"),
        ));
    }
    Ok(PageRequest { limit, cursor })
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FactListQuery {
    /// Status at `as_of` (default `active`).
    #[schemars(extend("enum" = ["active", "superseded", "retracted", "expired", "all"]))]
    pub status: Option<String>,
    /// Judge status at this time (default now).
    #[schemars(extend("format" = "date-time"))]
    pub as_of: Option<String>,
    /// Page size (default 50).
    #[schemars(range(min = 1, max = 200))]
    pub limit: Option<usize>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

impl FactListQuery {
    pub fn status_filter(&self) -> Result<StatusFilter, Error> {
        match self.status.as_deref() {
            None => Ok(StatusFilter::Only(FactStatus::Active)),
            Some("all") => Ok(StatusFilter::All),
            Some(status) => FactStatus::parse(status).map(StatusFilter::Only),
        }
    }

    pub fn as_of(&self) -> Result<Option<DateTime<Utc>>, Error> {
        utc("as_of", self.as_of.as_deref())
    }
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RetractBody {
    #[schemars(regex(pattern = r"\S"))]
    pub reason: Option<String>,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PlaybookBody {
    #[schemars(length(min = 1), regex(pattern = r"\S"))]
    pub name: String,
    /// When the playbook applies.
    #[schemars(length(min = 1), regex(pattern = r"\S"))]
    pub trigger: String,
    #[schemars(length(min = 1), inner(length(min = 1), regex(pattern = r"\S")))]
    pub steps: Vec<String>,
}

impl PlaybookBody {
    pub fn into_input(self) -> PlaybookInput {
        PlaybookInput {
            name: self.name,
            trigger: self.trigger,
            steps: self.steps,
        }
    }
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PlaybookVersionBody {
    #[schemars(length(min = 1), regex(pattern = r"\S"))]
    pub name: Option<String>,
    #[schemars(length(min = 1), regex(pattern = r"\S"))]
    pub trigger: Option<String>,
    #[schemars(length(min = 1), inner(length(min = 1), regex(pattern = r"\S")))]
    pub steps: Vec<String>,
    /// The version this one is based on: 409 when another version was added since.
    #[schemars(range(min = 1, max = 4_294_967_295u32))]
    pub base_version: Option<u32>,
}

impl PlaybookVersionBody {
    pub fn into_input(self) -> PlaybookVersionInput {
        PlaybookVersionInput {
            name: self.name,
            trigger: self.trigger,
            steps: self.steps,
            base_version: self.base_version,
        }
    }
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OutcomeBody {
    pub success: bool,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RecallBody {
    #[schemars(length(min = 1), regex(pattern = r"\S"))]
    pub query: String,
    /// Tiers to search (default all three).
    #[schemars(length(max = 8), extend("items" = { "type": "string", "enum": ["semantic", "episodic", "procedural"] }))]
    pub tiers: Option<Vec<String>>,
    /// Hits to return (default 10).
    #[schemars(range(min = 1, max = 100))]
    pub k: Option<usize>,
    /// Recall what Cairn held current at this time (belief time; default now).
    #[schemars(extend("format" = "date-time"))]
    pub as_of: Option<String>,
    /// Recall what held in the world at this time (event time): facts whose validity
    /// contains it, superseded since or not, and episodes said by then.
    #[schemars(extend("format" = "date-time"))]
    pub valid_at: Option<String>,
    /// Also superseded, retracted and expired facts, marked with their status.
    #[serde(default)]
    pub include_history: bool,
    /// Also facts held for review, marked `"status": "pending"`.
    #[serde(default)]
    pub include_pending: bool,
    /// Each hit's BM25 and kNN ranks, scores, fused score and reranker score.
    #[serde(default)]
    pub explain: bool,
    #[schemars(length(max = 16), extend("items" = { "type": "string", "enum": ["identity", "preference", "constraint", "world", "event"] }))]
    pub fact_types: Option<Vec<String>>,
    /// Favour episodes of this session.
    pub session_id: Option<String>,
    /// Only memories that mention this entity: its id or one of its names ("Anna",
    /// "my sister"); 404 when no fact names it.
    #[schemars(length(min = 1, max = 200))]
    pub entity: Option<String>,
}

/// Most entries a `tiers` list may hold (there are three tiers; repeats are ignored).
pub const MAX_TIERS_LISTED: usize = 8;
/// Most entries a `fact_types` list may hold (repeats are ignored).
pub const MAX_FACT_TYPES_LISTED: usize = 16;

/// Refuses a list input longer than `cap`, before any entry is looked at, so the work
/// of a request is bounded by what it means rather than by its byte size.
fn capped<'a>(field: &str, values: Option<&'a [String]>, cap: usize) -> Result<&'a [String], Error> {
    let values = values.unwrap_or_default();
    if values.len() > cap {
        return Err(Error::invalid(
            field,
            format!("holds {} entries; at most {cap} are accepted", values.len()),
        ));
    }
    Ok(values)
}

pub fn parse_tiers(tiers: Option<&[String]>) -> Result<Vec<Tier>, Error> {
    capped("tiers", tiers, MAX_TIERS_LISTED)?
        .iter()
        .map(|tier| {
            Tier::parse(tier).ok_or_else(|| {
                Error::invalid(
                    "tiers",
                    format!("unknown tier {tier:?}; expected semantic, episodic or procedural"),
                )
            })
        })
        .collect()
}

pub fn parse_fact_types(fact_types: Option<&[String]>) -> Result<Vec<FactType>, Error> {
    capped("fact_types", fact_types, MAX_FACT_TYPES_LISTED)?
        .iter()
        .map(|fact_type| FactType::parse(fact_type))
        .collect()
}

impl RecallBody {
    pub fn into_request(self) -> Result<RecallRequest, Error> {
        Ok(RecallRequest {
            tiers: parse_tiers(self.tiers.as_deref())?,
            query: self.query,
            k: self.k,
            as_of: utc("as_of", self.as_of.as_deref())?,
            valid_at: utc("valid_at", self.valid_at.as_deref())?,
            include_history: self.include_history,
            include_pending: self.include_pending,
            explain: self.explain,
            fact_types: parse_fact_types(self.fact_types.as_deref())?,
            session_id: self.session_id,
            entity: self.entity,
        })
    }
}

/// Why a hit ranks where it does (with `explain: true`).
#[derive(Serialize, JsonSchema)]
pub struct ExplanationResponse {
    /// 1-based rank in the BM25 leg of its tier, and its BM25 score.
    pub bm25_rank: Option<usize>,
    pub bm25_score: Option<f64>,
    /// 1-based rank in the vector leg of its tier, and its cosine similarity.
    pub knn_rank: Option<usize>,
    pub knn_similarity: Option<f64>,
    pub fused_score: f64,
    /// The multiplier the recency, usage and confidence priors applied (1 when off).
    pub prior: f64,
    /// The multiplier for naming the people, places and things the query names by
    /// their capitalised names (1 when the hit names none of them).
    pub name_boost: f64,
    /// The multiplier for happening in the time the query asks about ("in June", "on
    /// May 3, 2023", "last week"): 1 when the query names no time or the hit's event
    /// time is elsewhere.
    pub time_boost: f64,
    /// The reranker's score, when a reranker rescored this hit.
    pub rerank_score: Option<f64>,
    /// The id of a newer current fact that holds the same single-valued slot (home,
    /// employer, diet, ...) with another value: this fact may be outdated, and ranks
    /// after every hit not so marked.
    pub possibly_outdated_by: Option<String>,
}

fn explanation(explanation: &Explanation) -> ExplanationResponse {
    ExplanationResponse {
        bm25_rank: explanation.bm25_rank,
        bm25_score: explanation.bm25_score,
        knn_rank: explanation.knn_rank,
        knn_similarity: explanation.knn_similarity,
        fused_score: explanation.fused_score,
        prior: explanation.prior,
        name_boost: explanation.name_boost,
        time_boost: explanation.time_boost,
        rerank_score: explanation.rerank_score,
        possibly_outdated_by: explanation.possibly_outdated_by.clone(),
    }
}

/// One recalled memory: the fields of every tier, then those of its own tier.
#[derive(Serialize, JsonSchema)]
#[schemars(transform = common_then_tier)]
pub struct RecallHitResponse {
    pub id: String,
    pub tier: Tier,
    pub text: String,
    pub score: f64,
    /// The record's status at `as_of` (episodes and playbooks are always active).
    pub status: FactStatus,
    #[serde(flatten)]
    pub details: HitDetails,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub explain: Option<ExplanationResponse>,
}

/// States a hit as `allOf` [the fields every tier has, `anyOf` the tier's own], which is
/// what the flattened enum means (generators read `properties` beside `anyOf` as a
/// union).
fn common_then_tier(schema: &mut schemars::Schema) {
    let Some(object) = schema.as_object_mut() else {
        return;
    };
    let Some(tiers) = object.remove("anyOf") else {
        return;
    };
    let mut common = serde_json::Map::new();
    for key in ["type", "properties", "required"] {
        if let Some(value) = object.remove(key) {
            common.insert(key.to_owned(), value);
        }
    }
    object.insert(
        "allOf".to_owned(),
        serde_json::json!([common, { "anyOf": tiers }]),
    );
}

/// The fields of a hit that belong to its tier.
#[derive(Serialize, JsonSchema)]
#[serde(untagged)]
pub enum HitDetails {
    Fact {
        fact_type: FactType,
        confidence: f32,
        created_at: Timestamp,
        superseded_by: Option<String>,
        valid_from: Option<Timestamp>,
        valid_to: Option<Timestamp>,
        expires_at: Option<Timestamp>,
    },
    Episode {
        session_id: Option<String>,
        occurred_at: Timestamp,
    },
    Playbook {
        name: String,
        trigger: String,
        steps: Vec<String>,
        version: u32,
    },
}

pub fn recall_hit(hit: &RecallHit) -> RecallHitResponse {
    let (text, details) = match &hit.memory {
        Memory::Fact(record) => (
            record.text.clone(),
            HitDetails::Fact {
                fact_type: record.fact_type,
                confidence: record.confidence,
                created_at: time(record.created_at),
                superseded_by: record.superseded_by.clone(),
                valid_from: optional_time(record.valid_from),
                valid_to: optional_time(record.valid_to),
                expires_at: optional_time(record.expires_at),
            },
        ),
        Memory::Episode(record) => (
            record.text.clone(),
            HitDetails::Episode {
                session_id: record.session_id.clone(),
                occurred_at: time(record.occurred_at),
            },
        ),
        Memory::Playbook(record) => (
            record.searchable_text(),
            HitDetails::Playbook {
                name: record.name.clone(),
                trigger: record.trigger.clone(),
                steps: record.steps.clone(),
                version: record.version,
            },
        ),
    };
    RecallHitResponse {
        id: hit.memory.id().to_owned(),
        tier: hit.memory.tier(),
        text,
        score: hit.score,
        status: hit.status,
        details,
        explain: hit.explanation.as_ref().map(explanation),
    }
}

/// The best memories for a query, best first.
#[derive(Serialize, JsonSchema)]
pub struct RecallResponse {
    pub hits: Vec<RecallHitResponse>,
    /// The time whose current memories were searched.
    pub as_of: Timestamp,
}

pub fn recall_response(result: &RecallResult) -> RecallResponse {
    RecallResponse {
        hits: result.hits.iter().map(recall_hit).collect(),
        as_of: time(result.as_of),
    }
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProfileQuery {
    /// Also recall memories for this query.
    pub query: Option<String>,
    /// Recall hits to include.
    #[schemars(range(min = 1, max = 100))]
    pub k: Option<usize>,
    /// The profile as of this time.
    #[schemars(extend("format" = "date-time"))]
    pub as_of: Option<String>,
    /// Budget of the context block, in tokens (default 1000).
    #[schemars(range(min = 50, max = 32000))]
    pub max_tokens: Option<usize>,
}

impl ProfileQuery {
    pub fn into_request(self) -> Result<cairn_app::ProfileRequest, Error> {
        Ok(cairn_app::ProfileRequest {
            as_of: utc("as_of", self.as_of.as_deref())?,
            query: self.query,
            k: self.k,
            max_tokens: self.max_tokens,
        })
    }
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AnswerBody {
    #[schemars(length(min = 1), regex(pattern = r"\S"))]
    pub query: String,
    /// Answer from what was current at this time (default now).
    #[schemars(extend("format" = "date-time"))]
    pub as_of: Option<String>,
}

impl AnswerBody {
    pub fn into_request(self) -> Result<AnswerRequest, Error> {
        Ok(AnswerRequest {
            as_of: utc("as_of", self.as_of.as_deref())?,
            query: self.query,
        })
    }
}

/// An answer from memory alone, or `known: false` when the memories do not support one.
#[derive(Serialize, JsonSchema)]
pub struct AnswerResponse {
    /// The answer; empty when not known. Offline it is the best supporting sentence.
    pub answer: String,
    pub known: bool,
    /// Ids of the memories (facts, episodes) that support the answer, best first.
    pub citations: Vec<String>,
}

pub fn answer_response(answer: Answer) -> AnswerResponse {
    AnswerResponse {
        answer: answer.answer,
        known: answer.known,
        citations: answer.citations,
    }
}

/// The profile's facts about one entity.
#[derive(Serialize, JsonSchema)]
pub struct EntityGroupResponse {
    pub id: String,
    pub name: String,
    #[schemars(extend("enum" = ["person", "pet", "place", "organisation"]))]
    pub kind: &'static str,
    pub fact_ids: Vec<String>,
}

/// A person, pet, place or organisation the user's facts name.
#[derive(Serialize, JsonSchema)]
pub struct EntitySummaryResponse {
    pub id: String,
    /// Its name, or its relation to the user when it has none.
    pub name: String,
    #[schemars(extend("enum" = ["person", "pet", "place", "organisation"]))]
    pub kind: &'static str,
    /// The ways facts refer to it ("Anna", "the user's sister").
    pub aliases: Vec<String>,
    /// How many current facts, and how many superseded or retracted ones, name it.
    pub facts: usize,
    pub history: usize,
}

pub fn entity_summary(entity: &Entity) -> EntitySummaryResponse {
    EntitySummaryResponse {
        id: entity.id.clone(),
        name: entity.name.clone(),
        kind: entity.kind.as_str(),
        aliases: entity.aliases.clone(),
        facts: entity.facts.len(),
        history: entity.history.len(),
    }
}

/// An entity's card: its current facts and their history, newest first.
#[derive(Serialize, JsonSchema)]
pub struct EntityResponse {
    pub id: String,
    pub name: String,
    #[schemars(extend("enum" = ["person", "pet", "place", "organisation"]))]
    pub kind: &'static str,
    pub aliases: Vec<String>,
    pub facts: Vec<FactResponse>,
    /// Superseded and retracted facts that named it.
    pub history: Vec<FactResponse>,
}

pub fn entity(entity: &Entity) -> EntityResponse {
    let now = Utc::now();
    EntityResponse {
        id: entity.id.clone(),
        name: entity.name.clone(),
        kind: entity.kind.as_str(),
        aliases: entity.aliases.clone(),
        facts: entity.facts.iter().map(|record| fact(record, now)).collect(),
        history: entity.history.iter().map(|record| fact(record, now)).collect(),
    }
}

/// What is known about the user: lasting facts, recent ones, optional recall hits, and
/// all of it as one block of text for a prompt.
#[derive(Serialize, JsonSchema)]
pub struct ProfileResponse {
    #[serde(rename = "static")]
    pub static_facts: Vec<FactResponse>,
    #[serde(rename = "dynamic")]
    pub dynamic_facts: Vec<FactResponse>,
    /// The profile's facts grouped by the entities they name.
    pub entities: Vec<EntityGroupResponse>,
    pub hits: Vec<RecallHitResponse>,
    pub context: String,
}

pub fn profile(profile: &Profile) -> ProfileResponse {
    let now = Utc::now();
    ProfileResponse {
        static_facts: profile
            .static_facts
            .iter()
            .map(|record| fact(record, now))
            .collect(),
        dynamic_facts: profile
            .dynamic_facts
            .iter()
            .map(|record| fact(record, now))
            .collect(),
        entities: profile
            .entities
            .iter()
            .map(|entity| EntityGroupResponse {
                id: entity.id.clone(),
                name: entity.name.clone(),
                kind: entity.kind.as_str(),
                fact_ids: entity.facts.iter().map(|fact| fact.id.clone()).collect(),
            })
            .collect(),
        hits: profile.hits.iter().map(recall_hit).collect(),
        context: profile.context.clone(),
    }
}

/// `?format=` of an import: `cairn` (the default) or `mem0`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ImportQuery {
    /// `cairn` (default) or `mem0`.
    #[schemars(extend("enum" = ["cairn", "mem0"]))]
    pub format: Option<String>,
}

/// One user of the tenant that holds memory.
#[derive(Serialize, JsonSchema)]
pub struct UserSummaryResponse {
    pub user: String,
    pub episodes: u64,
    /// Facts of every status.
    pub facts: u64,
    pub active_facts: u64,
    pub playbooks: u64,
    /// The latest write of the user.
    pub last_activity: Option<Timestamp>,
}

pub fn user_summary(user: &cairn_core::UserSummary) -> UserSummaryResponse {
    UserSummaryResponse {
        user: user.user.clone(),
        episodes: user.episodes,
        facts: user.facts,
        active_facts: user.active_facts,
        playbooks: user.playbooks,
        last_activity: optional_time(user.last_activity),
    }
}

/// The answer to an import.
#[derive(Serialize, JsonSchema)]
#[serde(tag = "format", rename_all = "snake_case")]
pub enum ImportResponse {
    /// A Cairn export: what it wrote, per kind.
    Cairn { imported: cairn_app::ImportReport },
    /// A mem0 `get_all` document: what became of each memory.
    Mem0 { imported: cairn_app::Mem0ImportReport },
}

/// `GET /healthz`.
#[derive(Serialize, JsonSchema)]
pub struct Liveness {
    #[schemars(extend("enum" = ["ok"]))]
    pub status: &'static str,
}

/// `GET /readyz`: 200 when the store answers, 503 with what to fix otherwise.
#[derive(Serialize, JsonSchema)]
pub struct Readiness {
    #[schemars(extend("enum" = ["ready", "unavailable"]))]
    pub status: &'static str,
    pub checks: ReadinessChecks,
    /// What an operator should know: a degraded cluster, or why the store is unreachable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

#[derive(Serialize, JsonSchema)]
pub struct ReadinessChecks {
    #[schemars(extend("enum" = ["ok", "degraded", "unreachable"]))]
    pub store: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["ok", "not_loaded"]))]
    pub models: Option<&'static str>,
}

/// Every error: a stable code, a message for people, and the request id to quote.
#[derive(Serialize, JsonSchema)]
pub struct ErrorResponse {
    pub error: ErrorDetail,
}

#[derive(Serialize, JsonSchema)]
pub struct ErrorDetail {
    pub code: cairn_core::ErrorCode,
    pub message: String,
    pub request_id: String,
}

/// The body of an import: a Cairn export, or with `?format=mem0` a mem0 `get_all`
/// document. Described here for the document; the handler reads the one `format` names.
#[derive(JsonSchema)]
#[serde(untagged)]
pub enum ImportBody {
    Cairn(Box<cairn_app::ScopeExport>),
    Mem0(cairn_app::Mem0Document),
}

/// `POST /ui/session`: a login ticket from `cairn token mint --ui`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LoginBody {
    #[schemars(length(min = 1))]
    pub ticket: String,
}

/// A console session token for the ticket's tenant, user binding and scopes.
#[derive(Serialize, JsonSchema)]
pub struct LoginResponse {
    pub token: String,
    pub expires_at: Timestamp,
}

/// An outcome held for review: what approving it changes, and why it waits.
#[derive(Serialize, JsonSchema)]
pub struct ReviewResponse {
    pub id: String,
    /// The user whose memory it changes.
    pub user: String,
    pub kind: cairn_core::ReviewKind,
    pub status: cairn_core::ReviewStatus,
    /// The policy rule that held it: `supersession`, `retraction`, `tombstone_lift`,
    /// `low_confidence`, `fact_type:<type>` or `all`.
    pub rule: String,
    /// Why the proposing path chose this outcome.
    pub reason: String,
    /// The `HELD_FOR_REVIEW` decision.
    pub decision_id: String,
    pub evidence_episode_ids: Vec<String>,
    /// `api`, or the consolidation run that proposed it.
    pub origin: String,
    /// The token subject that proposed it.
    pub proposed_by: String,
    pub created_at: Timestamp,
    /// The fact approval makes current (pending until then).
    pub fact: Option<FactResponse>,
    /// The fact a supersession or retraction retires, or the tombstone a lift lifts.
    pub target_id: Option<String>,
    /// The fact a supersession or retraction retires, as it is now.
    pub target: Option<FactResponse>,
    pub resolved_at: Option<Timestamp>,
    pub resolved_by: Option<String>,
    /// The reviewer's reason, when given.
    pub note: Option<String>,
}

pub fn review(item: &cairn_app::ReviewItem) -> ReviewResponse {
    let now = Utc::now();
    let review = &item.review;
    ReviewResponse {
        id: review.id.clone(),
        user: item.user.clone(),
        kind: review.kind,
        status: review.status,
        rule: review.rule.clone(),
        reason: review.reason.clone(),
        decision_id: review.decision_id.clone(),
        evidence_episode_ids: review.evidence_episode_ids.clone(),
        origin: review.origin.clone(),
        proposed_by: review.proposed_by.clone(),
        created_at: time(review.created_at),
        fact: item.fact.as_ref().map(|held| fact(held, now)),
        target_id: review.target_id.clone(),
        target: item.target.as_ref().map(|target| fact(target, now)),
        resolved_at: optional_time(review.resolved_at),
        resolved_by: review.resolved_by.clone(),
        note: review.note.clone(),
    }
}

/// Pending reviews by kind.
#[derive(Serialize, JsonSchema)]
pub struct ReviewCounts {
    pub total: u64,
    pub new_fact: u64,
    pub supersession: u64,
    pub retraction: u64,
    pub tombstone_lift: u64,
    /// When the oldest pending review was held.
    pub oldest: Option<Timestamp>,
}

pub fn review_counts(summary: &cairn_core::ReviewSummary) -> ReviewCounts {
    let count = |kind: cairn_core::ReviewKind| {
        summary
            .by_kind
            .iter()
            .find(|(held, _)| *held == kind)
            .map_or(0, |(_, count)| *count)
    };
    ReviewCounts {
        total: summary.total(),
        new_fact: count(cairn_core::ReviewKind::NewFact),
        supersession: count(cairn_core::ReviewKind::Supersession),
        retraction: count(cairn_core::ReviewKind::Retraction),
        tombstone_lift: count(cairn_core::ReviewKind::TombstoneLift),
        oldest: optional_time(summary.oldest),
    }
}

/// `GET /v1/reviews`: a page of the tenant's queue, oldest first, with its counts.
#[derive(Serialize, JsonSchema)]
pub struct ReviewQueueResponse {
    pub items: Vec<ReviewResponse>,
    pub next_cursor: Option<String>,
    pub counts: ReviewCounts,
}

/// The body of a rejection: why, and whether the value was never true (then it is
/// tombstoned: no write brings it back unless the user restates it).
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RejectBody {
    #[schemars(regex(pattern = r"\S"))]
    pub reason: Option<String>,
    #[serde(default)]
    pub tombstone: bool,
}

/// A review decision: the review, its fact after it, and the decision logged.
#[derive(Serialize, JsonSchema)]
pub struct ReviewDecisionResponse {
    pub review: ReviewResponse,
    pub fact: FactResponse,
    pub decision: DecisionResponse,
}

pub fn review_decision(user: &str, outcome: &cairn_app::ReviewOutcome) -> ReviewDecisionResponse {
    let item = cairn_app::ReviewItem {
        user: user.to_owned(),
        review: outcome.review.clone(),
        fact: Some(outcome.fact.clone()),
        target: None,
    };
    ReviewDecisionResponse {
        review: review(&item),
        fact: fact(&outcome.fact, Utc::now()),
        decision: decision(&outcome.decision),
    }
}
