//! Documents as the cluster answers them, read through typed structs: a [`Hit`] carries
//! a document's id, version (`_seq_no`, `_primary_term`) and source once, and each
//! document kind has a struct its source must fit. A missing or mistyped field is a
//! storage error naming the index kind and the field, never a default: a hit without a
//! version cannot turn into a conditional write that always conflicts, nor a document
//! without an id into a write to id "".

use cairn_core::{
    AuditEvent, ConsolidationJob, Decision, DecisionKind, Episode, Error, Fact, FactStatus, FactType,
    Playbook, Result, Review, ReviewKind, ReviewStatus, Tombstone, TombstoneReason,
};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Parses `value` as a `T`, with the path of the field at fault in the error.
pub fn parse<T: DeserializeOwned>(what: &str, value: &Value) -> Result<T> {
    serde_path_to_error::deserialize(value).map_err(|error| {
        let path = error.path().to_string();
        let inner = error.into_inner();
        if path == "." {
            Error::Storage(format!("{what}: {inner}"))
        } else {
            Error::Storage(format!("{what}: field {path}: {inner}"))
        }
    })
}

/// One document of a get, search or multi-get answer.
#[derive(Clone, Debug, Deserialize)]
pub struct Hit {
    #[serde(rename = "_id")]
    pub id: String,
    #[serde(rename = "_index")]
    pub index: String,
    #[serde(rename = "_routing", default)]
    pub routing: Option<String>,
    #[serde(rename = "_seq_no", default)]
    seq_no: Option<i64>,
    #[serde(rename = "_primary_term", default)]
    primary_term: Option<i64>,
    /// Absent when the search asked for no source, or a get found nothing.
    #[serde(rename = "_source", default)]
    pub source: Value,
    /// The sort values of a sorted search (for `search_after`).
    #[serde(default)]
    pub sort: Option<Value>,
    /// Set by gets: whether the document exists.
    #[serde(default)]
    pub found: Option<bool>,
    /// The doc-value fields a search asked for, each as an array of values.
    #[serde(default)]
    pub fields: Value,
}

impl Hit {
    /// The version a compare-and-set needs; an error when the answer carries none
    /// (a search without `seq_no_primary_term`).
    pub fn version(&self) -> Result<(i64, i64)> {
        match (self.seq_no, self.primary_term) {
            (Some(seq_no), Some(primary_term)) => Ok((seq_no, primary_term)),
            _ => Err(Error::Storage(format!(
                "{} {}: the answer carries no _seq_no/_primary_term",
                self.index, self.id
            ))),
        }
    }

    /// The source as a `T` (see [`parse`]).
    pub fn read<T: DeserializeOwned>(&self) -> Result<T> {
        parse(&format!("{} {}", self.index, self.id), &self.source)
    }

    /// The routing the document was written with; an error when the answer lacks it.
    pub fn routing(&self) -> Result<&str> {
        self.routing.as_deref().ok_or_else(|| {
            Error::Storage(format!(
                "{} {}: the answer carries no _routing",
                self.index, self.id
            ))
        })
    }
}

/// The hits of a search answer.
pub fn hits(body: &Value) -> Result<Vec<Hit>> {
    parse("search answer hits", &body["hits"]["hits"])
}

/// The version in a write answer (`_seq_no`, `_primary_term`).
pub fn written_version(body: &Value) -> Result<(i64, i64)> {
    #[derive(Deserialize)]
    struct Written {
        #[serde(rename = "_seq_no")]
        seq_no: i64,
        #[serde(rename = "_primary_term")]
        primary_term: i64,
    }
    let written: Written = parse("write answer", body)?;
    Ok((written.seq_no, written.primary_term))
}

/// A time stored as microseconds since the epoch.
fn time(field: &str, micros: i64) -> Result<DateTime<Utc>> {
    DateTime::from_timestamp_micros(micros)
        .ok_or_else(|| Error::Storage(format!("field {field}: {micros} is not a time")))
}

fn optional_time(field: &str, micros: Option<i64>) -> Result<Option<DateTime<Utc>>> {
    micros.map(|micros| time(field, micros)).transpose()
}

/// Who a document belongs to: every document carries its tenant and user.
#[derive(Deserialize)]
pub struct Owner {
    pub tenant: String,
    pub user: String,
}

/// A fact's or playbook's use counts, which recall updates.
#[derive(Deserialize)]
pub struct Usage {
    pub use_count: u64,
    pub last_used_at: Option<i64>,
}

#[derive(Deserialize)]
pub struct EpisodeDoc {
    id: String,
    session_id: Option<String>,
    text: String,
    occurred_at: i64,
    ingested_at: i64,
    position: u64,
    #[serde(default)]
    vector: Option<String>,
    #[serde(default)]
    embedding: Option<Vec<f32>>,
}

impl EpisodeDoc {
    pub fn into_logged(self) -> Result<(u64, Episode)> {
        Ok((
            self.position,
            Episode {
                occurred_at: time("occurred_at", self.occurred_at)?,
                ingested_at: time("ingested_at", self.ingested_at)?,
                id: self.id,
                session_id: self.session_id,
                text: self.text,
                embedding: crate::vectors::stored(self.vector, self.embedding)?,
            },
        ))
    }
}

#[derive(Deserialize)]
pub struct FactDoc {
    id: String,
    fact_type: String,
    text: String,
    confidence: f32,
    status: String,
    source_episode_ids: Vec<String>,
    source_span: Option<String>,
    created_at: i64,
    superseded_at: Option<i64>,
    superseded_by: Option<String>,
    retracted_at: Option<i64>,
    retraction_reason: Option<String>,
    valid_from: Option<i64>,
    valid_to: Option<i64>,
    expires_at: Option<i64>,
    last_used_at: Option<i64>,
    use_count: u64,
    #[serde(default)]
    vector: Option<String>,
    #[serde(default)]
    embedding: Option<Vec<f32>>,
}

impl TryFrom<FactDoc> for Fact {
    type Error = Error;

    fn try_from(doc: FactDoc) -> Result<Fact> {
        Ok(Fact {
            fact_type: FactType::parse(&doc.fact_type)
                .map_err(|_| Error::Storage(format!("field fact_type: unknown type {:?}", doc.fact_type)))?,
            status: FactStatus::parse(&doc.status)
                .map_err(|_| Error::Storage(format!("field status: unknown status {:?}", doc.status)))?,
            created_at: time("created_at", doc.created_at)?,
            superseded_at: optional_time("superseded_at", doc.superseded_at)?,
            retracted_at: optional_time("retracted_at", doc.retracted_at)?,
            valid_from: optional_time("valid_from", doc.valid_from)?,
            valid_to: optional_time("valid_to", doc.valid_to)?,
            expires_at: optional_time("expires_at", doc.expires_at)?,
            last_used_at: optional_time("last_used_at", doc.last_used_at)?,
            id: doc.id,
            text: doc.text,
            confidence: doc.confidence,
            source_episode_ids: doc.source_episode_ids,
            source_span: doc.source_span,
            superseded_by: doc.superseded_by,
            retraction_reason: doc.retraction_reason,
            use_count: doc.use_count,
            embedding: crate::vectors::stored(doc.vector, doc.embedding)?,
        })
    }
}

#[derive(Deserialize)]
pub struct PlaybookDoc {
    id: String,
    name: String,
    trigger: String,
    steps: Vec<String>,
    version: u32,
    success_count: u64,
    failure_count: u64,
    created_at: i64,
    updated_at: i64,
    last_used_at: Option<i64>,
    use_count: u64,
    #[serde(default)]
    vector: Option<String>,
    #[serde(default)]
    embedding: Option<Vec<f32>>,
}

impl TryFrom<PlaybookDoc> for Playbook {
    type Error = Error;

    fn try_from(doc: PlaybookDoc) -> Result<Playbook> {
        Ok(Playbook {
            created_at: time("created_at", doc.created_at)?,
            updated_at: time("updated_at", doc.updated_at)?,
            last_used_at: optional_time("last_used_at", doc.last_used_at)?,
            id: doc.id,
            name: doc.name,
            trigger: doc.trigger,
            steps: doc.steps,
            version: doc.version,
            success_count: doc.success_count,
            failure_count: doc.failure_count,
            use_count: doc.use_count,
            embedding: crate::vectors::stored(doc.vector, doc.embedding)?,
        })
    }
}

/// One kept version of a playbook.
#[derive(Deserialize)]
pub struct PlaybookVersionDoc {
    playbook_id: String,
    version: u32,
    name: String,
    trigger: String,
    steps: Vec<String>,
    created_at: i64,
}

impl TryFrom<PlaybookVersionDoc> for Playbook {
    type Error = Error;

    fn try_from(doc: PlaybookVersionDoc) -> Result<Playbook> {
        let at = time("created_at", doc.created_at)?;
        Ok(Playbook {
            id: doc.playbook_id,
            name: doc.name,
            trigger: doc.trigger,
            steps: doc.steps,
            version: doc.version,
            success_count: 0,
            failure_count: 0,
            created_at: at,
            updated_at: at,
            last_used_at: None,
            use_count: 0,
            embedding: None,
        })
    }
}

#[derive(Deserialize)]
pub struct TombstoneDoc {
    id: String,
    fingerprint: String,
    fact_id: String,
    reason: String,
    created_at: i64,
    lifted_at: Option<i64>,
}

impl TryFrom<TombstoneDoc> for Tombstone {
    type Error = Error;

    fn try_from(doc: TombstoneDoc) -> Result<Tombstone> {
        Ok(Tombstone {
            reason: match doc.reason.as_str() {
                "forgotten" => TombstoneReason::Forgotten,
                "retracted" => TombstoneReason::Retracted,
                other => return Err(Error::Storage(format!("field reason: unknown reason {other:?}"))),
            },
            created_at: time("created_at", doc.created_at)?,
            lifted_at: optional_time("lifted_at", doc.lifted_at)?,
            id: doc.id,
            fingerprint: doc.fingerprint,
            fact_id: doc.fact_id,
        })
    }
}

#[derive(Deserialize)]
pub struct ReviewDoc {
    id: String,
    kind: String,
    fact_id: String,
    target_id: Option<String>,
    rule: String,
    reason: String,
    decision_id: String,
    evidence_episode_ids: Vec<String>,
    fingerprint: String,
    origin: String,
    proposed_by: String,
    created_at: i64,
    status: String,
    resolved_at: Option<i64>,
    resolved_by: Option<String>,
    note: Option<String>,
}

impl TryFrom<ReviewDoc> for Review {
    type Error = Error;

    fn try_from(doc: ReviewDoc) -> Result<Review> {
        Ok(Review {
            kind: ReviewKind::parse(&doc.kind)
                .ok_or_else(|| Error::Storage(format!("field kind: unknown review kind {:?}", doc.kind)))?,
            status: ReviewStatus::parse(&doc.status).ok_or_else(|| {
                Error::Storage(format!("field status: unknown review status {:?}", doc.status))
            })?,
            created_at: time("created_at", doc.created_at)?,
            resolved_at: optional_time("resolved_at", doc.resolved_at)?,
            id: doc.id,
            fact_id: doc.fact_id,
            target_id: doc.target_id,
            rule: doc.rule,
            reason: doc.reason,
            decision_id: doc.decision_id,
            evidence_episode_ids: doc.evidence_episode_ids,
            fingerprint: doc.fingerprint,
            origin: doc.origin,
            proposed_by: doc.proposed_by,
            resolved_by: doc.resolved_by,
            note: doc.note,
        })
    }
}

#[derive(Deserialize)]
pub struct DecisionDoc {
    id: String,
    kind: String,
    reason: String,
    fact_id: Option<String>,
    target_ids: Vec<String>,
    origin: String,
    created_at: i64,
}

impl TryFrom<DecisionDoc> for Decision {
    type Error = Error;

    fn try_from(doc: DecisionDoc) -> Result<Decision> {
        Ok(Decision {
            kind: DecisionKind::parse(&doc.kind)
                .ok_or_else(|| Error::Storage(format!("field kind: unknown decision kind {:?}", doc.kind)))?,
            created_at: time("created_at", doc.created_at)?,
            id: doc.id,
            reason: doc.reason,
            fact_id: doc.fact_id,
            target_ids: doc.target_ids,
            origin: doc.origin,
        })
    }
}

#[derive(Deserialize)]
pub struct AuditDoc {
    id: String,
    at: i64,
    subject: String,
    tenant: String,
    user: String,
    action: String,
    target_ids: Vec<String>,
    request_id: String,
    #[serde(default)]
    detail: Value,
}

impl TryFrom<AuditDoc> for AuditEvent {
    type Error = Error;

    fn try_from(doc: AuditDoc) -> Result<AuditEvent> {
        Ok(AuditEvent {
            at: time("at", doc.at)?,
            id: doc.id,
            subject: doc.subject,
            tenant: doc.tenant,
            user: doc.user,
            action: doc.action,
            target_ids: doc.target_ids,
            request_id: doc.request_id,
            detail: doc.detail,
        })
    }
}

#[derive(Deserialize)]
pub struct JobDoc {
    id: String,
    subject: String,
    request_id: String,
    assistant_context: Vec<String>,
    created_at: i64,
    run_after: i64,
    attempts: u32,
    last_error: Option<String>,
    dead_at: Option<i64>,
}

impl TryFrom<JobDoc> for ConsolidationJob {
    type Error = Error;

    fn try_from(doc: JobDoc) -> Result<ConsolidationJob> {
        Ok(ConsolidationJob {
            created_at: time("created_at", doc.created_at)?,
            run_after: time("run_after", doc.run_after)?,
            dead_at: optional_time("dead_at", doc.dead_at)?,
            id: doc.id,
            subject: doc.subject,
            request_id: doc.request_id,
            assistant_context: doc.assistant_context,
            attempts: doc.attempts,
            last_error: doc.last_error,
        })
    }
}

/// Reads a source as the domain record `R` through its document struct `D`, naming the
/// field at fault.
pub fn record<D, R>(what: &str, source: &Value) -> Result<R>
where
    D: DeserializeOwned,
    R: TryFrom<D, Error = Error>,
{
    let doc: D = parse(what, source)?;
    R::try_from(doc).map_err(|error| match error {
        Error::Storage(message) => Error::Storage(format!("{what}: {message}")),
        other => other,
    })
}

pub fn read_fact(source: &Value) -> Result<Fact> {
    record::<FactDoc, Fact>("fact", source)
}

pub fn read_episode(source: &Value) -> Result<(u64, Episode)> {
    parse::<EpisodeDoc>("episode", source)?
        .into_logged()
        .map_err(|error| match error {
            Error::Storage(message) => Error::Storage(format!("episode: {message}")),
            other => other,
        })
}

pub fn read_playbook(source: &Value) -> Result<Playbook> {
    record::<PlaybookDoc, Playbook>("playbook", source)
}

pub fn read_playbook_version(source: &Value) -> Result<Playbook> {
    record::<PlaybookVersionDoc, Playbook>("playbook version", source)
}

pub fn read_tombstone(source: &Value) -> Result<Tombstone> {
    record::<TombstoneDoc, Tombstone>("tombstone", source)
}

pub fn read_review(source: &Value) -> Result<Review> {
    record::<ReviewDoc, Review>("review", source)
}

pub fn read_decision(source: &Value) -> Result<Decision> {
    record::<DecisionDoc, Decision>("decision", source)
}

pub fn read_audit(source: &Value) -> Result<AuditEvent> {
    record::<AuditDoc, AuditEvent>("audit event", source)
}

pub fn read_job(source: &Value) -> Result<ConsolidationJob> {
    record::<JobDoc, ConsolidationJob>("job", source)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fact() -> Value {
        json!({
            "tenant": "acme", "user": "alice", "id": "f1", "fact_type": "preference",
            "text": "The user likes tea", "terms": "the user like tea", "fingerprint": "sha256:x",
            "confidence": 0.9, "status": "active", "source_episode_ids": ["e1"],
            "created_at": 1_700_000_000_000_000_i64, "use_count": 2, "timestamp": "2023-11-14T22:13:20Z"
        })
    }

    #[test]
    fn a_whole_document_reads_as_its_record() {
        let read = read_fact(&fact()).expect("fact");
        assert_eq!(
            (read.id.as_str(), read.use_count, read.status),
            ("f1", 2, FactStatus::Active)
        );
        assert!(read.superseded_at.is_none() && read.embedding.is_none());
    }

    #[test]
    fn a_missing_or_mistyped_field_is_an_error_naming_it() {
        for (field, value, expected) in [
            ("id", None, "missing field `id`"),
            ("created_at", Some(json!("yesterday")), "field created_at"),
            ("use_count", Some(json!(-1)), "field use_count"),
            ("status", Some(json!("dormant")), "field status"),
            ("created_at", Some(json!(i64::MAX)), "field created_at"),
        ] {
            let mut source = fact();
            match value {
                None => {
                    source.as_object_mut().expect("object").remove(field);
                }
                Some(value) => source[field] = value,
            }
            let error = read_fact(&source).expect_err("refused").to_string();
            assert!(error.contains(expected), "{field}: {error}");
        }
    }

    #[test]
    fn a_hit_without_a_version_cannot_be_written_conditionally() {
        let answer = json!({ "hits": { "hits": [
            { "_index": "cairn-jobs", "_id": "j1", "_routing": "acme", "_source": { "id": "j1" } }
        ] } });
        let found = hits(&answer).expect("hits");
        let error = found[0].version().expect_err("no version").to_string();
        assert!(error.contains("_seq_no"), "{error}");
        let no_id = json!({ "hits": { "hits": [{ "_index": "cairn-jobs", "_source": {} }] } });
        let error = hits(&no_id).expect_err("no id").to_string();
        assert!(error.contains("_id"), "{error}");
    }
}
