//! Documents: domain records to the JSON kept in each index (`records` reads them
//! back). Times are microseconds since the epoch (the embedded store's clock);
//! `timestamp` is a date for dashboards.

use cairn_core::bm25::index_terms;
use cairn_core::text::fingerprint;
use cairn_core::{
    AuditEvent, ConsolidationJob, Decision, Edge, Episode, Fact, Playbook, Review, Scope, Tombstone,
};
use chrono::{DateTime, Utc};
use serde_json::{Value, json};

pub fn micros(at: DateTime<Utc>) -> i64 {
    at.timestamp_micros()
}

fn optional(at: Option<DateTime<Utc>>) -> Value {
    at.map_or(Value::Null, |at| json!(micros(at)))
}

/// A record's vector in its stored form (see `vectors`).
fn vector(embedding: Option<&Vec<f32>>) -> Value {
    embedding.map_or(Value::Null, |values| json!(crate::vectors::encode(values)))
}

pub fn timestamp(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

/// The fields every document carries.
fn owned(scope: &Scope, id: &str, mut body: Value) -> Value {
    body["tenant"] = json!(scope.tenant().as_str());
    body["user"] = json!(scope.user().as_str());
    body["id"] = json!(id);
    // `null` fields are left out: a missing field is how queries see "not set".
    if let Value::Object(map) = &mut body {
        map.retain(|_, value| !value.is_null());
    }
    body
}

/// Whether a fetched document belongs to the scope (ids are global; ownership is checked).
pub fn in_scope(scope: &Scope, source: &Value) -> bool {
    source["tenant"] == scope.tenant().as_str() && source["user"] == scope.user().as_str()
}

/// An episode's document; `context` holds the episodes before and after it in its
/// session, indexed beside the text with a lower weight.
pub fn episode(scope: &Scope, episode: &Episode, position: u64, context: Option<&str>) -> Value {
    owned(
        scope,
        &episode.id,
        json!({
            "session_id": episode.session_id,
            "text": episode.text,
            "terms": index_terms(&episode.text),
            "context": context,
            "context_terms": context.map(index_terms),
            "occurred_at": micros(episode.occurred_at),
            "ingested_at": micros(episode.ingested_at),
            "position": position,
            "vector": vector(episode.embedding.as_ref()),
            "timestamp": timestamp(episode.ingested_at),
        }),
    )
}

pub fn fact(scope: &Scope, fact: &Fact) -> Value {
    owned(
        scope,
        &fact.id,
        json!({
            "fact_type": fact.fact_type.as_str(),
            "text": fact.text,
            "terms": index_terms(&fact.text),
            "fingerprint": fingerprint(&fact.text),
            "confidence": fact.confidence,
            "status": fact.status.as_str(),
            "source_episode_ids": fact.source_episode_ids,
            "source_span": fact.source_span,
            "created_at": micros(fact.created_at),
            "superseded_at": optional(fact.superseded_at),
            "superseded_by": fact.superseded_by,
            "retracted_at": optional(fact.retracted_at),
            "retraction_reason": fact.retraction_reason,
            "valid_from": optional(fact.valid_from),
            "valid_to": optional(fact.valid_to),
            "expires_at": optional(fact.expires_at),
            "last_used_at": optional(fact.last_used_at),
            "use_count": fact.use_count,
            "vector": vector(fact.embedding.as_ref()),
            "timestamp": timestamp(fact.created_at),
        }),
    )
}

pub fn playbook(scope: &Scope, playbook: &Playbook) -> Value {
    owned(
        scope,
        &playbook.id,
        json!({
            "name": playbook.name,
            "trigger": playbook.trigger,
            "steps": playbook.steps,
            "text": playbook.searchable_text(),
            "terms": index_terms(&playbook.searchable_text()),
            "version": playbook.version,
            "success_count": playbook.success_count,
            "failure_count": playbook.failure_count,
            "created_at": micros(playbook.created_at),
            "updated_at": micros(playbook.updated_at),
            "last_used_at": optional(playbook.last_used_at),
            "use_count": playbook.use_count,
            "vector": vector(playbook.embedding.as_ref()),
            "timestamp": timestamp(playbook.updated_at),
        }),
    )
}

pub fn playbook_version(scope: &Scope, playbook: &Playbook) -> Value {
    owned(
        scope,
        &format!("{}:{}", playbook.id, playbook.version),
        json!({
            "playbook_id": playbook.id,
            "version": playbook.version,
            "name": playbook.name,
            "trigger": playbook.trigger,
            "steps": playbook.steps,
            "created_at": micros(playbook.updated_at),
        }),
    )
}

pub fn edge_id(edge: &Edge) -> String {
    format!("{}:{}:{}", edge.from_fact_id, edge.to_fact_id, edge.kind.as_str())
}

pub fn edge(scope: &Scope, edge: &Edge) -> Value {
    owned(
        scope,
        &edge_id(edge),
        json!({
            "from_fact_id": edge.from_fact_id,
            "to_fact_id": edge.to_fact_id,
            "kind": edge.kind.as_str(),
            "created_at": micros(edge.created_at),
        }),
    )
}

pub fn tombstone(scope: &Scope, tombstone: &Tombstone) -> Value {
    owned(
        scope,
        &tombstone.id,
        json!({
            "fingerprint": tombstone.fingerprint,
            "fact_id": tombstone.fact_id,
            "reason": tombstone.reason.as_str(),
            "created_at": micros(tombstone.created_at),
            "lifted_at": optional(tombstone.lifted_at),
        }),
    )
}

pub fn review(scope: &Scope, review: &Review) -> Value {
    owned(
        scope,
        &review.id,
        json!({
            "kind": review.kind.as_str(),
            "fact_id": review.fact_id,
            "target_id": review.target_id,
            "rule": review.rule,
            "reason": review.reason,
            "decision_id": review.decision_id,
            "evidence_episode_ids": review.evidence_episode_ids,
            "fingerprint": review.fingerprint,
            "origin": review.origin,
            "proposed_by": review.proposed_by,
            "created_at": micros(review.created_at),
            "status": review.status.as_str(),
            "resolved_at": optional(review.resolved_at),
            "resolved_by": review.resolved_by,
            "note": review.note,
        }),
    )
}

pub fn decision(scope: &Scope, decision: &Decision) -> Value {
    owned(
        scope,
        &decision.id,
        json!({
            "kind": decision.kind.as_str(),
            "reason": decision.reason,
            "fact_id": decision.fact_id,
            "target_ids": decision.target_ids,
            "origin": decision.origin,
            "created_at": micros(decision.created_at),
            "timestamp": timestamp(decision.created_at),
        }),
    )
}

pub fn audit(scope: &Scope, event: &AuditEvent) -> Value {
    owned(
        scope,
        &event.id,
        json!({
            "subject": event.subject,
            "action": event.action,
            "target_ids": event.target_ids,
            "request_id": event.request_id,
            "detail": event.detail,
            "at": micros(event.at),
            "timestamp": timestamp(event.at),
        }),
    )
}

pub fn job(scope: &Scope, job: &ConsolidationJob) -> Value {
    owned(
        scope,
        &job.id,
        json!({
            "subject": job.subject,
            "request_id": job.request_id,
            "assistant_context": job.assistant_context,
            "created_at": micros(job.created_at),
            "run_after": micros(job.run_after),
            "attempts": job.attempts,
            "last_error": job.last_error,
            "dead_at": optional(job.dead_at),
            // When the job last changed (queued, or failed): for dashboards.
            "timestamp": timestamp(job.created_at),
        }),
    )
}

/// A date aggregation's value (milliseconds since the epoch), if there is one.
pub fn epoch_millis(value: &Value) -> Option<DateTime<Utc>> {
    value
        .as_f64()
        .filter(|millis| millis.is_finite())
        .and_then(|millis| DateTime::from_timestamp_millis(millis as i64))
}
