//! Wire formats of the REST API, converted by hand to and from the use-case types.

use cairn_app::{
    ConsolidateMode, ConsolidateOptions, ConsolidationOutcome, Contradiction, Explanation, FactInput,
    FactWriteOutcome, IngestOutcome, IngestRequest, Message, PlaybookInput, PlaybookVersionInput, Profile,
    RecallHit, RecallRequest, RecallResult, Role,
};
use cairn_core::{
    AuditEvent, ConsolidationJob, Decision, Episode, ErasureReceipt, Error, Fact, FactStatus, FactType,
    Memory, Page, PageRequest, Playbook, StatusFilter, Tier,
};
use chrono::{DateTime, FixedOffset, Utc};
use serde::Deserialize;
use serde_json::{Value, json};

const DEFAULT_PAGE: usize = 50;
const MAX_PAGE: usize = 200;

/// Parses an optional RFC 3339 time, naming the field when it is not one.
fn utc(field: &str, time: Option<&str>) -> Result<Option<DateTime<Utc>>, Error> {
    time.map(|text| {
        DateTime::<FixedOffset>::parse_from_rfc3339(text)
            .map(|time| time.with_timezone(&Utc))
            .map_err(|_| Error::invalid(field, "must be an RFC 3339 time such as 2026-01-31T09:00:00Z"))
    })
    .transpose()
}

fn time(time: DateTime<Utc>) -> Value {
    Value::String(time.to_rfc3339_opts(chrono::SecondsFormat::Micros, true))
}

fn optional_time(value: Option<DateTime<Utc>>) -> Value {
    value.map(time).unwrap_or(Value::Null)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessageBody {
    pub role: String,
    pub content: String,
    pub timestamp: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IngestBody {
    pub messages: Vec<MessageBody>,
    pub session_id: Option<String>,
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

pub fn ingest_response(outcome: &IngestOutcome) -> Value {
    let report = &outcome.consolidation;
    let mut consolidation = json!({
        "requested": report.requested.as_str(),
        "ran": report.outcome.is_some(),
        "queued": report.outcome.is_none() && report.job_id.is_some(),
        "job_id": report.job_id,
    });
    if let Some(run) = &report.outcome {
        consolidation["run"] = self::consolidation(run);
    }
    if let Some(error) = &report.error {
        consolidation["error"] = json!(error);
    }
    json!({ "episode_ids": outcome.episode_ids, "consolidation": consolidation })
}

#[derive(Deserialize, Default)]
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

pub fn consolidation(outcome: &ConsolidationOutcome) -> Value {
    let now = Utc::now();
    json!({
        "run_id": outcome.run_id,
        "dry_run": outcome.dry_run,
        "episodes_read": outcome.episodes_read,
        "watermark": outcome.watermark,
        "extractor": outcome.extractor,
        "judge": outcome.judge,
        "decisions": outcome.decisions.iter().map(decision).collect::<Vec<_>>(),
        "facts_created": outcome.facts_created.iter().map(|created| fact(created, now)).collect::<Vec<_>>(),
        "playbooks_created": outcome.playbooks_created,
        "usage": {
            "llm_calls": outcome.usage.calls,
            "input_tokens": outcome.usage.input_tokens,
            "output_tokens": outcome.usage.output_tokens,
            "cost_usd": outcome.usage.cost_usd,
        },
        "deferred_until": outcome.deferred_until.map(|at| at.to_rfc3339()),
        "token_budget": outcome.token_budget.as_ref().map(|budget| json!({
            "tokens_per_day": budget.tokens_per_day,
            "used_today": budget.used_today,
            "resets_at": budget.resets_at.to_rfc3339(),
        })),
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FactBody {
    pub text: String,
    pub fact_type: Option<String>,
    pub confidence: Option<f32>,
    pub supersedes: Option<String>,
    pub contradiction: Option<String>,
    pub valid_from: Option<String>,
    pub valid_to: Option<String>,
    pub expires_at: Option<String>,
    #[serde(default)]
    pub reassert: bool,
    pub evidence_episode_id: Option<String>,
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
        })
    }
}

pub fn fact(fact: &Fact, as_of: DateTime<Utc>) -> Value {
    json!({
        "id": fact.id,
        "text": fact.text,
        "fact_type": fact.fact_type.as_str(),
        "confidence": fact.confidence,
        "status": fact.status_at(as_of).unwrap_or(fact.status).as_str(),
        "source_episode_ids": fact.source_episode_ids,
        "source_span": fact.source_span,
        "created_at": time(fact.created_at),
        "superseded_at": optional_time(fact.superseded_at),
        "superseded_by": fact.superseded_by,
        "retracted_at": optional_time(fact.retracted_at),
        "retraction_reason": fact.retraction_reason,
        "valid_from": optional_time(fact.valid_from),
        "valid_to": optional_time(fact.valid_to),
        "expires_at": optional_time(fact.expires_at),
        "last_used_at": optional_time(fact.last_used_at),
        "use_count": fact.use_count,
    })
}

pub fn decision(decision: &Decision) -> Value {
    json!({
        "id": decision.id,
        "kind": decision.kind.as_str(),
        "reason": decision.reason,
        "fact_id": decision.fact_id,
        "target_ids": decision.target_ids,
        "origin": decision.origin,
        "created_at": time(decision.created_at),
    })
}

pub fn fact_write_response(outcome: &FactWriteOutcome) -> Value {
    json!({
        "fact": fact(&outcome.fact, Utc::now()),
        "decision": decision(&outcome.decision),
        "created": outcome.created,
    })
}

pub fn episode(episode: &Episode) -> Value {
    json!({
        "id": episode.id,
        "session_id": episode.session_id,
        "text": episode.text,
        "occurred_at": time(episode.occurred_at),
        "ingested_at": time(episode.ingested_at),
    })
}

pub fn playbook(playbook: &Playbook) -> Value {
    json!({
        "id": playbook.id,
        "name": playbook.name,
        "trigger": playbook.trigger,
        "steps": playbook.steps,
        "version": playbook.version,
        "success_count": playbook.success_count,
        "failure_count": playbook.failure_count,
        "created_at": time(playbook.created_at),
        "updated_at": time(playbook.updated_at),
        "last_used_at": optional_time(playbook.last_used_at),
        "use_count": playbook.use_count,
    })
}

pub fn audit_event(event: &AuditEvent) -> Value {
    json!({
        "id": event.id,
        "at": time(event.at),
        "subject": event.subject,
        "tenant": event.tenant,
        "user": event.user,
        "action": event.action,
        "target_ids": event.target_ids,
        "request_id": event.request_id,
        "detail": event.detail,
    })
}

pub fn page<T>(page: &Page<T>, render: impl Fn(&T) -> Value) -> Value {
    json!({
        "items": page.items.iter().map(render).collect::<Vec<_>>(),
        "next_cursor": page.next_cursor,
    })
}

/// A consolidation job as clients see it: its state, attempts and last error (the
/// assistant context it carries is transient extraction input and is not shown).
pub fn job(job: &ConsolidationJob) -> Value {
    json!({
        "id": job.id,
        "state": if job.dead_at.is_some() { "dead" } else { "queued" },
        "created_at": time(job.created_at),
        "run_after": time(job.run_after),
        "attempts": job.attempts,
        "last_error": job.last_error,
        "dead_at": optional_time(job.dead_at),
    })
}

pub fn erasure(receipt: &ErasureReceipt) -> Value {
    json!({
        "deleted": {
            "episodes": receipt.episodes,
            "facts": receipt.facts,
            "playbooks": receipt.playbooks,
            "playbook_versions": receipt.playbook_versions,
            "edges": receipt.edges,
            "tombstones": receipt.tombstones,
            "decisions": receipt.decisions,
            "jobs": receipt.jobs,
        }
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PageQuery {
    pub limit: Option<usize>,
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FactListQuery {
    pub status: Option<String>,
    pub as_of: Option<String>,
    pub limit: Option<usize>,
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetractBody {
    pub reason: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlaybookBody {
    pub name: String,
    pub trigger: String,
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlaybookVersionBody {
    pub name: Option<String>,
    pub trigger: Option<String>,
    pub steps: Vec<String>,
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutcomeBody {
    pub success: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecallBody {
    pub query: String,
    pub tiers: Option<Vec<String>>,
    pub k: Option<usize>,
    pub as_of: Option<String>,
    #[serde(default)]
    pub include_history: bool,
    #[serde(default)]
    pub explain: bool,
    pub fact_types: Option<Vec<String>>,
    pub session_id: Option<String>,
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
            include_history: self.include_history,
            explain: self.explain,
            fact_types: parse_fact_types(self.fact_types.as_deref())?,
            session_id: self.session_id,
        })
    }
}

fn explanation(explanation: &Explanation) -> Value {
    json!({
        "bm25_rank": explanation.bm25_rank,
        "bm25_score": explanation.bm25_score,
        "knn_rank": explanation.knn_rank,
        "knn_similarity": explanation.knn_similarity,
        "fused_score": explanation.fused_score,
        "prior": explanation.prior,
        "rerank_score": explanation.rerank_score,
    })
}

pub fn recall_hit(hit: &RecallHit) -> Value {
    let (text, details) = match &hit.memory {
        Memory::Fact(record) => (
            record.text.clone(),
            json!({ "fact_type": record.fact_type.as_str(), "confidence": record.confidence,
                    "created_at": time(record.created_at), "superseded_by": record.superseded_by,
                    "valid_from": optional_time(record.valid_from), "valid_to": optional_time(record.valid_to),
                    "expires_at": optional_time(record.expires_at) }),
        ),
        Memory::Episode(record) => (
            record.text.clone(),
            json!({ "session_id": record.session_id, "occurred_at": time(record.occurred_at) }),
        ),
        Memory::Playbook(record) => (
            record.searchable_text(),
            json!({ "name": record.name, "trigger": record.trigger, "steps": record.steps, "version": record.version }),
        ),
    };
    let mut value = json!({
        "id": hit.memory.id(),
        "tier": hit.memory.tier().as_str(),
        "text": text,
        "score": hit.score,
        "status": hit.status.as_str(),
    });
    if let (Value::Object(target), Value::Object(extra)) = (&mut value, details) {
        target.extend(extra);
        if let Some(explained) = &hit.explanation {
            target.insert("explain".into(), explanation(explained));
        }
    }
    value
}

pub fn recall_response(result: &RecallResult) -> Value {
    json!({
        "hits": result.hits.iter().map(recall_hit).collect::<Vec<_>>(),
        "as_of": time(result.as_of),
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileQuery {
    pub query: Option<String>,
    pub k: Option<usize>,
    pub as_of: Option<String>,
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

pub fn profile(profile: &Profile) -> Value {
    let now = Utc::now();
    json!({
        "static": profile.static_facts.iter().map(|record| fact(record, now)).collect::<Vec<_>>(),
        "dynamic": profile.dynamic_facts.iter().map(|record| fact(record, now)).collect::<Vec<_>>(),
        "hits": profile.hits.iter().map(recall_hit).collect::<Vec<_>>(),
        "context": profile.context,
    })
}

/// `?format=` of an import: `cairn` (the default) or `mem0`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImportQuery {
    pub format: Option<String>,
}

pub fn user_summary(user: &cairn_core::UserSummary) -> Value {
    json!({
        "user": user.user,
        "episodes": user.episodes,
        "facts": user.facts,
        "active_facts": user.active_facts,
        "playbooks": user.playbooks,
        "last_activity": user.last_activity.map(time),
    })
}
