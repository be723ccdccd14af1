//! Conversions between domain records and SQLite rows.

use cairn_core::{
    AuditEvent, ConsolidationJob, Decision, DecisionKind, Episode, Fact, FactStatus, FactType, Playbook,
    Review, ReviewKind, ReviewStatus, Scope, Tombstone, TombstoneReason,
};
use chrono::{DateTime, Utc};
use rusqlite::Row;
use rusqlite::types::Type;

/// Times are stored as integer microseconds since the epoch, so comparisons are exact.
pub fn micros(at: DateTime<Utc>) -> i64 {
    at.timestamp_micros()
}

pub fn optional_micros(at: Option<DateTime<Utc>>) -> Option<i64> {
    at.map(micros)
}

fn conversion_error(index: usize, message: String) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(index, Type::Text, message.into())
}

fn time_at(row: &Row<'_>, index: usize) -> rusqlite::Result<DateTime<Utc>> {
    let value: i64 = row.get(index)?;
    DateTime::from_timestamp_micros(value)
        .ok_or_else(|| conversion_error(index, format!("timestamp {value} out of range")))
}

pub fn optional_time_at(row: &Row<'_>, index: usize) -> rusqlite::Result<Option<DateTime<Utc>>> {
    let value: Option<i64> = row.get(index)?;
    value
        .map(|micros| {
            DateTime::from_timestamp_micros(micros)
                .ok_or_else(|| conversion_error(index, format!("timestamp {micros} out of range")))
        })
        .transpose()
}

fn json_at<T: serde::de::DeserializeOwned>(row: &Row<'_>, index: usize) -> rusqlite::Result<T> {
    let text: String = row.get(index)?;
    serde_json::from_str(&text).map_err(|error| conversion_error(index, error.to_string()))
}

pub fn count_at(row: &Row<'_>, index: usize) -> rusqlite::Result<u64> {
    let value: i64 = row.get(index)?;
    Ok(u64::try_from(value).unwrap_or(0))
}

/// Vectors are little-endian f32 sequences.
pub fn embedding_bytes(embedding: Option<&Vec<f32>>) -> Option<Vec<u8>> {
    embedding.map(|values| values.iter().flat_map(|value| value.to_le_bytes()).collect())
}

/// The values of a stored vector ([`embedding_bytes`] read back).
pub fn embedding_values(bytes: &[u8]) -> impl Iterator<Item = f32> + '_ {
    bytes
        .chunks_exact(4)
        .map(|chunk| f32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]))
}

fn embedding_at(row: &Row<'_>, index: usize) -> rusqlite::Result<Option<Vec<f32>>> {
    let bytes: Option<Vec<u8>> = row.get(index)?;
    Ok(bytes.map(|bytes| embedding_values(&bytes).collect()))
}

pub const EPISODE_COLUMNS: &str =
    "e.seq, e.id, e.session_id, e.text, e.occurred_at, e.ingested_at, e.embedding";

pub fn episode(row: &Row<'_>) -> rusqlite::Result<Episode> {
    Ok(Episode {
        id: row.get(1)?,
        session_id: row.get(2)?,
        text: row.get(3)?,
        occurred_at: time_at(row, 4)?,
        ingested_at: time_at(row, 5)?,
        embedding: embedding_at(row, 6)?,
    })
}

pub const FACT_COLUMNS: &str = "f.seq, f.id, f.fact_type, f.text, f.confidence, f.status, \
     f.source_episode_ids, f.source_span, f.created_at, f.superseded_at, f.superseded_by, \
     f.retracted_at, f.retraction_reason, f.valid_from, f.valid_to, f.expires_at, \
     f.last_used_at, f.use_count, f.embedding";

pub fn fact(row: &Row<'_>) -> rusqlite::Result<Fact> {
    let fact_type: String = row.get(2)?;
    let status: String = row.get(5)?;
    Ok(Fact {
        id: row.get(1)?,
        fact_type: FactType::parse(&fact_type).map_err(|e| conversion_error(2, e.to_string()))?,
        text: row.get(3)?,
        confidence: row.get::<_, f64>(4)? as f32,
        status: FactStatus::parse(&status).map_err(|e| conversion_error(5, e.to_string()))?,
        source_episode_ids: json_at(row, 6)?,
        source_span: row.get(7)?,
        created_at: time_at(row, 8)?,
        superseded_at: optional_time_at(row, 9)?,
        superseded_by: row.get(10)?,
        retracted_at: optional_time_at(row, 11)?,
        retraction_reason: row.get(12)?,
        valid_from: optional_time_at(row, 13)?,
        valid_to: optional_time_at(row, 14)?,
        expires_at: optional_time_at(row, 15)?,
        last_used_at: optional_time_at(row, 16)?,
        use_count: count_at(row, 17)?,
        embedding: embedding_at(row, 18)?,
    })
}

pub const PLAYBOOK_COLUMNS: &str = "p.seq, p.id, p.name, p.trigger_text, p.steps, p.version, \
     p.success_count, p.failure_count, p.created_at, p.updated_at, p.last_used_at, \
     p.use_count, p.embedding";

pub fn playbook(row: &Row<'_>) -> rusqlite::Result<Playbook> {
    let version: i64 = row.get(5)?;
    Ok(Playbook {
        id: row.get(1)?,
        name: row.get(2)?,
        trigger: row.get(3)?,
        steps: json_at(row, 4)?,
        version: u32::try_from(version).map_err(|e| conversion_error(5, e.to_string()))?,
        success_count: count_at(row, 6)?,
        failure_count: count_at(row, 7)?,
        created_at: time_at(row, 8)?,
        updated_at: time_at(row, 9)?,
        last_used_at: optional_time_at(row, 10)?,
        use_count: count_at(row, 11)?,
        embedding: embedding_at(row, 12)?,
    })
}

pub const DECISION_COLUMNS: &str = "seq, id, kind, reason, fact_id, target_ids, origin, created_at";

pub fn decision(row: &Row<'_>) -> rusqlite::Result<Decision> {
    let kind: String = row.get(2)?;
    Ok(Decision {
        id: row.get(1)?,
        kind: DecisionKind::parse(&kind)
            .ok_or_else(|| conversion_error(2, format!("unknown decision kind {kind}")))?,
        reason: row.get(3)?,
        fact_id: row.get(4)?,
        target_ids: json_at(row, 5)?,
        origin: row.get(6)?,
        created_at: time_at(row, 7)?,
    })
}

pub const AUDIT_COLUMNS: &str =
    "seq, id, at, subject, tenant, user_id, action, target_ids, request_id, detail";

pub fn audit_event(row: &Row<'_>) -> rusqlite::Result<AuditEvent> {
    Ok(AuditEvent {
        id: row.get(1)?,
        at: time_at(row, 2)?,
        subject: row.get(3)?,
        tenant: row.get(4)?,
        user: row.get(5)?,
        action: row.get(6)?,
        target_ids: json_at(row, 7)?,
        request_id: row.get(8)?,
        detail: json_at(row, 9)?,
    })
}

/// The scope token indexed beside each full-text row: `s` followed by the hex of a
/// 64-bit FNV-1a hash of tenant and user. A collision costs only index selectivity,
/// because every query also filters on the scope columns.
pub fn scope_key(scope: &Scope) -> String {
    scope_key_of(scope.tenant().as_str(), scope.user().as_str())
}

/// [`scope_key`] from the stored tenant and user columns.
pub fn scope_key_of(tenant: &str, user: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in tenant.bytes().chain([0u8]).chain(user.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("s{hash:016x}")
}

pub const TOMBSTONE_COLUMNS: &str = "id, fingerprint, fact_id, reason, created_at, lifted_at";

pub fn tombstone(row: &Row<'_>) -> rusqlite::Result<Tombstone> {
    let reason: String = row.get(3)?;
    Ok(Tombstone {
        id: row.get(0)?,
        fingerprint: row.get(1)?,
        fact_id: row.get(2)?,
        reason: if reason == "forgotten" {
            TombstoneReason::Forgotten
        } else {
            TombstoneReason::Retracted
        },
        created_at: time_at(row, 4)?,
        lifted_at: optional_time_at(row, 5)?,
    })
}

pub const REVIEW_COLUMNS: &str = "id, kind, fact_id, target_id, rule, reason, decision_id, \
     evidence_episode_ids, fingerprint, origin, proposed_by, created_at, status, resolved_at, resolved_by, note";

pub fn review(row: &Row<'_>) -> rusqlite::Result<Review> {
    let kind: String = row.get(1)?;
    let status: String = row.get(12)?;
    Ok(Review {
        id: row.get(0)?,
        kind: ReviewKind::parse(&kind).ok_or_else(|| conversion_error(1, format!("review kind {kind}")))?,
        fact_id: row.get(2)?,
        target_id: row.get(3)?,
        rule: row.get(4)?,
        reason: row.get(5)?,
        decision_id: row.get(6)?,
        evidence_episode_ids: json_at(row, 7)?,
        fingerprint: row.get(8)?,
        origin: row.get(9)?,
        proposed_by: row.get(10)?,
        created_at: time_at(row, 11)?,
        status: ReviewStatus::parse(&status)
            .ok_or_else(|| conversion_error(12, format!("review status {status}")))?,
        resolved_at: optional_time_at(row, 13)?,
        resolved_by: row.get(14)?,
        note: row.get(15)?,
    })
}

/// [`review`] with the user column after the review's own.
pub fn user_review(row: &Row<'_>) -> rusqlite::Result<cairn_core::UserReview> {
    Ok(cairn_core::UserReview {
        user: row.get(16)?,
        review: review(row)?,
    })
}

pub const JOB_COLUMNS: &str =
    "id, subject, request_id, assistant_context, created_at, run_after, attempts, last_error, dead_at";

pub fn job(row: &Row<'_>) -> rusqlite::Result<ConsolidationJob> {
    Ok(ConsolidationJob {
        id: row.get(0)?,
        subject: row.get(1)?,
        request_id: row.get(2)?,
        assistant_context: json_at(row, 3)?,
        created_at: time_at(row, 4)?,
        run_after: time_at(row, 5)?,
        attempts: row.get(6)?,
        last_error: row.get(7)?,
        dead_at: optional_time_at(row, 8)?,
    })
}
