//! Applies a change set inside one SQLite transaction, checking each precondition.

use crate::rows::{embedding_bytes, micros, optional_micros, scope_key};
use crate::storage;
use cairn_core::text::fingerprint;
use cairn_core::{
    AuditEvent, Change, ChangeSet, ConsolidationJob, Decision, Episode, Error, Fact, Playbook, Result,
    Review, Scope, Tombstone,
};
use rusqlite::{OptionalExtension, Transaction, params};

/// Row ids of the facts the change set erases, read before it is applied.
pub fn erased_fact_seqs(
    transaction: &Transaction<'_>,
    scope: &Scope,
    change_set: &ChangeSet,
) -> Result<Vec<i64>> {
    let mut seqs = Vec::new();
    for change in &change_set.changes {
        if let Change::EraseFact { fact_id } = change {
            let seq: Option<i64> = transaction
                .query_row(
                    "SELECT seq FROM facts WHERE id = ?1 AND tenant = ?2 AND user_id = ?3",
                    params![fact_id, scope.tenant().as_str(), scope.user().as_str()],
                    |row| row.get(0),
                )
                .optional()
                .map_err(storage)?;
            seqs.extend(seq);
        }
    }
    Ok(seqs)
}

pub fn apply(transaction: &Transaction<'_>, scope: &Scope, change_set: &ChangeSet) -> Result<()> {
    for change in &change_set.changes {
        apply_change(transaction, scope, change)?;
    }
    for decision in &change_set.decisions {
        insert_decision(transaction, scope, decision).map_err(storage)?;
    }
    for event in &change_set.audit {
        insert_audit(transaction, scope, event).map_err(storage)?;
    }
    Ok(())
}

fn apply_change(transaction: &Transaction<'_>, scope: &Scope, change: &Change) -> Result<()> {
    match change {
        Change::InsertEpisodes(episodes) => {
            for episode in episodes {
                insert_episode(transaction, scope, episode).map_err(storage)?;
            }
            Ok(())
        }
        Change::InsertFact(fact) => insert_fact(transaction, scope, fact),
        Change::SupersedeFact {
            fact_id,
            superseded_by,
            at,
            valid_to,
        } => {
            require_fact_status(transaction, scope, fact_id, &["active"])?;
            transaction
                .execute(
                    "UPDATE facts SET status = 'superseded', superseded_at = ?1, superseded_by = ?2, \
                     valid_to = CASE WHEN valid_to IS NULL AND (valid_from IS NULL OR valid_from < ?6) \
                     THEN ?6 ELSE valid_to END \
                     WHERE id = ?3 AND tenant = ?4 AND user_id = ?5 AND status = 'active'",
                    params![
                        micros(*at),
                        superseded_by,
                        fact_id,
                        scope.tenant().as_str(),
                        scope.user().as_str(),
                        optional_micros(*valid_to)
                    ],
                )
                .map_err(storage)?;
            Ok(())
        }
        Change::RetractFact { fact_id, reason, at } => {
            require_fact_status(transaction, scope, fact_id, &["active", "superseded", "pending"])?;
            transaction
                .execute(
                    "UPDATE facts SET status = 'retracted', retracted_at = ?1, retraction_reason = ?2 \
                     WHERE id = ?3 AND tenant = ?4 AND user_id = ?5",
                    params![
                        micros(*at),
                        reason,
                        fact_id,
                        scope.tenant().as_str(),
                        scope.user().as_str()
                    ],
                )
                .map_err(storage)?;
            Ok(())
        }
        Change::EraseFact { fact_id } => erase_fact(transaction, scope, fact_id),
        Change::ActivateFact { fact_id, at } => {
            require_fact_status(transaction, scope, fact_id, &["pending"])?;
            let value: String = transaction
                .query_row(
                    "SELECT fingerprint FROM facts WHERE id = ?1 AND tenant = ?2 AND user_id = ?3",
                    params![fact_id, scope.tenant().as_str(), scope.user().as_str()],
                    |row| row.get(0),
                )
                .map_err(storage)?;
            refuse_tombstoned(transaction, scope, &value)?;
            transaction
                .execute(
                    "UPDATE facts SET status = 'active', created_at = ?4 WHERE id = ?1 AND tenant = ?2 AND user_id = ?3",
                    params![fact_id, scope.tenant().as_str(), scope.user().as_str(), micros(*at)],
                )
                .map_err(storage)?;
            Ok(())
        }
        Change::InsertReview(review) => insert_review(transaction, scope, review).map_err(storage),
        Change::ResolveReview {
            review_id,
            status,
            at,
            by,
            note,
        } => {
            let current: Option<String> = transaction
                .query_row(
                    "SELECT status FROM reviews WHERE id = ?1 AND tenant = ?2 AND user_id = ?3",
                    params![review_id, scope.tenant().as_str(), scope.user().as_str()],
                    |row| row.get(0),
                )
                .optional()
                .map_err(storage)?;
            match current.as_deref() {
                None => return Err(Error::NotFound { what: "review" }),
                Some("pending") => {}
                Some(_) => return Err(Error::review_resolved(review_id)),
            }
            transaction
                .execute(
                    "UPDATE reviews SET status = ?1, resolved_at = ?2, resolved_by = ?3, note = ?4 \
                     WHERE id = ?5 AND tenant = ?6 AND user_id = ?7 AND status = 'pending'",
                    params![
                        status.as_str(),
                        micros(*at),
                        by,
                        note,
                        review_id,
                        scope.tenant().as_str(),
                        scope.user().as_str()
                    ],
                )
                .map_err(storage)?;
            Ok(())
        }
        Change::InsertEdge(edge) => {
            transaction
                .execute(
                    "INSERT OR IGNORE INTO edges (tenant, user_id, from_fact_id, to_fact_id, kind, created_at) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                    params![
                        scope.tenant().as_str(),
                        scope.user().as_str(),
                        edge.from_fact_id,
                        edge.to_fact_id,
                        edge.kind.as_str(),
                        micros(edge.created_at)
                    ],
                )
                .map_err(storage)?;
            Ok(())
        }
        Change::InsertTombstone(tombstone) => {
            insert_tombstone(transaction, scope, tombstone).map_err(storage)
        }
        Change::LiftTombstone { tombstone_id, at } => {
            let updated = transaction
                .execute(
                    "UPDATE tombstones SET lifted_at = ?1 \
                     WHERE id = ?2 AND tenant = ?3 AND user_id = ?4 AND lifted_at IS NULL",
                    params![
                        micros(*at),
                        tombstone_id,
                        scope.tenant().as_str(),
                        scope.user().as_str()
                    ],
                )
                .map_err(storage)?;
            one_row(updated, "tombstone")
        }
        Change::InsertPlaybook(playbook) => insert_playbook(transaction, scope, playbook).map_err(storage),
        Change::AppendPlaybookVersion {
            expected_version,
            playbook,
        } => append_playbook_version(transaction, scope, *expected_version, playbook),
        Change::RecordPlaybookOutcome {
            playbook_id,
            success,
            at,
        } => {
            let column = if *success {
                "success_count"
            } else {
                "failure_count"
            };
            let updated = transaction
                .execute(
                    &format!(
                        "UPDATE playbooks SET {column} = {column} + 1, last_used_at = ?1 \
                         WHERE id = ?2 AND tenant = ?3 AND user_id = ?4"
                    ),
                    params![
                        micros(*at),
                        playbook_id,
                        scope.tenant().as_str(),
                        scope.user().as_str()
                    ],
                )
                .map_err(storage)?;
            one_row(updated, "playbook")
        }
        Change::EnqueueJob(job) => insert_job(transaction, scope, job).map_err(storage),
        Change::CompleteJobs(job_ids) => {
            let mut statement = transaction
                .prepare_cached("DELETE FROM jobs WHERE id = ?1 AND tenant = ?2 AND user_id = ?3")
                .map_err(storage)?;
            for job_id in job_ids {
                statement
                    .execute(params![job_id, scope.tenant().as_str(), scope.user().as_str()])
                    .map_err(storage)?;
            }
            Ok(())
        }
        Change::RetryJob { job_id, at } => {
            let updated = transaction
                .execute(
                    "UPDATE jobs SET dead_at = NULL, attempts = 0, last_error = NULL, run_after = ?1, \
                     leased_until = CASE WHEN leased_until > ?1 THEN leased_until ELSE NULL END \
                     WHERE id = ?2 AND tenant = ?3 AND user_id = ?4",
                    params![
                        micros(*at),
                        job_id,
                        scope.tenant().as_str(),
                        scope.user().as_str()
                    ],
                )
                .map_err(storage)?;
            one_row(updated, "job")
        }
        Change::RequireEpisodes(episode_ids) => require_episodes(transaction, scope, episode_ids),
        Change::RequireNoActiveValue { fingerprint } => {
            let taken = transaction
                .prepare_cached(
                    "SELECT 1 FROM facts WHERE tenant = ?1 AND user_id = ?2 AND fingerprint = ?3 \
                     AND status = 'active'",
                )
                .and_then(|mut statement| {
                    statement.exists(params![
                        scope.tenant().as_str(),
                        scope.user().as_str(),
                        fingerprint
                    ])
                })
                .map_err(storage)?;
            if taken { Err(Error::duplicate()) } else { Ok(()) }
        }
        Change::MoveWatermark { expected, to } => move_watermark(transaction, scope, *expected, *to),
        Change::RequireGeneration(generation) => {
            if generation_of(transaction, scope)? == *generation {
                Ok(())
            } else {
                Err(Error::scope_erased())
            }
        }
    }
}

/// The scope's erasure generation (0 until its first erasure).
pub(crate) fn generation_of(connection: &rusqlite::Connection, scope: &Scope) -> Result<u64> {
    let generation: Option<i64> = connection
        .prepare_cached("SELECT generation FROM consolidation_state WHERE tenant = ?1 AND user_id = ?2")
        .and_then(|mut statement| {
            statement
                .query_row(params![scope.tenant().as_str(), scope.user().as_str()], |row| {
                    row.get(0)
                })
                .optional()
        })
        .map_err(storage)?;
    Ok(generation.map_or(0, |generation| u64::try_from(generation).unwrap_or(0)))
}

/// Fails with `evidence_erased` unless every listed episode is stored in the scope.
fn require_episodes(transaction: &Transaction<'_>, scope: &Scope, episode_ids: &[String]) -> Result<()> {
    let mut statement = transaction
        .prepare_cached("SELECT 1 FROM episodes WHERE id = ?1 AND tenant = ?2 AND user_id = ?3")
        .map_err(storage)?;
    for episode_id in episode_ids {
        let present = statement
            .exists(params![
                episode_id,
                scope.tenant().as_str(),
                scope.user().as_str()
            ])
            .map_err(storage)?;
        if !present {
            return Err(Error::evidence_erased(episode_id));
        }
    }
    Ok(())
}

/// An update of one record by id in the scope: `NotFound` unless it changed exactly one row.
fn one_row(updated: usize, what: &'static str) -> Result<()> {
    if updated == 1 {
        Ok(())
    } else {
        Err(Error::NotFound { what })
    }
}

fn insert_review(transaction: &Transaction<'_>, scope: &Scope, review: &Review) -> rusqlite::Result<()> {
    let evidence = serde_json::to_string(&review.evidence_episode_ids)
        .map_err(|error| rusqlite::Error::ToSqlConversionFailure(Box::new(error)))?;
    transaction.execute(
        "INSERT INTO reviews (id, tenant, user_id, kind, fact_id, target_id, rule, reason, decision_id, \
         evidence_episode_ids, fingerprint, origin, proposed_by, created_at, status, resolved_at, resolved_by, \
         note) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18)",
        params![
            review.id,
            scope.tenant().as_str(),
            scope.user().as_str(),
            review.kind.as_str(),
            review.fact_id,
            review.target_id,
            review.rule,
            review.reason,
            review.decision_id,
            evidence,
            review.fingerprint,
            review.origin,
            review.proposed_by,
            micros(review.created_at),
            review.status.as_str(),
            optional_micros(review.resolved_at),
            review.resolved_by,
            review.note,
        ],
    )?;
    Ok(())
}

fn insert_job(transaction: &Transaction<'_>, scope: &Scope, job: &ConsolidationJob) -> rusqlite::Result<()> {
    let context = serde_json::to_string(&job.assistant_context)
        .map_err(|error| rusqlite::Error::ToSqlConversionFailure(Box::new(error)))?;
    transaction.execute(
        "INSERT INTO jobs (id, tenant, user_id, subject, request_id, assistant_context, created_at, \
         run_after, attempts, last_error) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
        params![
            job.id,
            scope.tenant().as_str(),
            scope.user().as_str(),
            job.subject,
            job.request_id,
            context,
            micros(job.created_at),
            micros(job.run_after),
            job.attempts,
            job.last_error,
        ],
    )?;
    Ok(())
}

fn move_watermark(transaction: &Transaction<'_>, scope: &Scope, expected: u64, to: u64) -> Result<()> {
    let (tenant, user) = (scope.tenant().as_str(), scope.user().as_str());
    let current: u64 = transaction
        .query_row(
            "SELECT watermark FROM consolidation_state WHERE tenant = ?1 AND user_id = ?2",
            params![tenant, user],
            |row| row.get::<_, i64>(0),
        )
        .optional()
        .map_err(storage)?
        .map_or(0, |value| u64::try_from(value).unwrap_or(0));
    if current != expected {
        return Err(Error::Conflict {
            code: cairn_core::ErrorCode::WatermarkMoved,
            message: format!("another consolidation run moved the watermark from {expected} to {current}"),
        });
    }
    let to = i64::try_from(to).map_err(|_| Error::invalid("watermark", "is out of range"))?;
    transaction
        .execute(
            "INSERT INTO consolidation_state (tenant, user_id, watermark) VALUES (?1, ?2, ?3) \
             ON CONFLICT (tenant, user_id) DO UPDATE SET watermark = excluded.watermark",
            params![tenant, user, to],
        )
        .map_err(storage)?;
    Ok(())
}

/// The owner check: the fact must exist in this scope (else `NotFound`, whatever other
/// scope it may live in) and be in one of `allowed` states (else `not_active`).
fn require_fact_status(
    transaction: &Transaction<'_>,
    scope: &Scope,
    fact_id: &str,
    allowed: &[&str],
) -> Result<()> {
    let status: Option<String> = transaction
        .query_row(
            "SELECT status FROM facts WHERE id = ?1 AND tenant = ?2 AND user_id = ?3",
            params![fact_id, scope.tenant().as_str(), scope.user().as_str()],
            |row| row.get(0),
        )
        .optional()
        .map_err(storage)?;
    match status {
        None => Err(Error::NotFound { what: "fact" }),
        Some(status) if allowed.contains(&status.as_str()) => Ok(()),
        Some(status) => Err(Error::Conflict {
            code: cairn_core::ErrorCode::NotActive,
            message: format!("fact {fact_id} is {status}, so it cannot be changed this way"),
        }),
    }
}

fn insert_episode(transaction: &Transaction<'_>, scope: &Scope, episode: &Episode) -> rusqlite::Result<()> {
    // The previous episode of the session: indexed beside this one as its context, and
    // this one is appended to its context.
    let previous: Option<(i64, String)> = match &episode.session_id {
        Some(session_id) => transaction
            .prepare_cached(
                "SELECT seq, text FROM episodes WHERE tenant = ?1 AND user_id = ?2 AND session_id = ?3 \
                 ORDER BY seq DESC LIMIT 1",
            )?
            .query_row(
                params![scope.tenant().as_str(), scope.user().as_str(), session_id],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .optional()?,
        None => None,
    };
    transaction.execute(
        "INSERT INTO episodes (id, tenant, user_id, session_id, text, occurred_at, ingested_at, embedding) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![
            episode.id,
            scope.tenant().as_str(),
            scope.user().as_str(),
            episode.session_id,
            episode.text,
            micros(episode.occurred_at),
            micros(episode.ingested_at),
            embedding_bytes(episode.embedding.as_ref())
        ],
    )?;
    let seq = transaction.last_insert_rowid();
    transaction.execute(
        "INSERT INTO episodes_fts (rowid, text, scope_key, context) VALUES (?1, ?2, ?3, ?4)",
        params![
            seq,
            episode.text,
            scope_key(scope),
            previous.as_ref().map(|(_, text)| text)
        ],
    )?;
    if let Some((previous_seq, _)) = previous {
        transaction.execute(
            "UPDATE episodes_fts SET context = concat_ws(char(10), context, ?1) WHERE rowid = ?2",
            params![episode.text, previous_seq],
        )?;
    }
    Ok(())
}

/// The tombstone check sits inside the transaction, so no concurrent writer can slip a
/// retracted value back in between a check and the insert.
fn refuse_tombstoned(transaction: &Transaction<'_>, scope: &Scope, value_fingerprint: &str) -> Result<()> {
    let tombstone: Option<String> = transaction
        .query_row(
            "SELECT id FROM tombstones WHERE tenant = ?1 AND user_id = ?2 AND fingerprint = ?3 \
             AND lifted_at IS NULL",
            params![scope.tenant().as_str(), scope.user().as_str(), value_fingerprint],
            |row| row.get(0),
        )
        .optional()
        .map_err(storage)?;
    match tombstone {
        Some(tombstone_id) => Err(Error::Tombstoned { tombstone_id }),
        None => Ok(()),
    }
}

fn insert_fact(transaction: &Transaction<'_>, scope: &Scope, fact: &Fact) -> Result<()> {
    let value_fingerprint = fingerprint(&fact.text);
    // A pending fact changes nothing until approved (a held lift restates a tombstoned
    // value); its activation checks the tombstones.
    if fact.status != cairn_core::FactStatus::Pending {
        refuse_tombstoned(transaction, scope, &value_fingerprint)?;
    }
    let source_episode_ids =
        serde_json::to_string(&fact.source_episode_ids).map_err(|e| Error::Storage(e.to_string()))?;
    transaction
        .execute(
            "INSERT INTO facts (id, tenant, user_id, fact_type, text, fingerprint, confidence, status, \
             source_episode_ids, source_span, created_at, superseded_at, superseded_by, retracted_at, \
             retraction_reason, valid_from, valid_to, expires_at, last_used_at, use_count, embedding) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21)",
            params![
                fact.id,
                scope.tenant().as_str(),
                scope.user().as_str(),
                fact.fact_type.as_str(),
                fact.text,
                value_fingerprint,
                f64::from(fact.confidence),
                fact.status.as_str(),
                source_episode_ids,
                fact.source_span,
                micros(fact.created_at),
                optional_micros(fact.superseded_at),
                fact.superseded_by,
                optional_micros(fact.retracted_at),
                fact.retraction_reason,
                optional_micros(fact.valid_from),
                optional_micros(fact.valid_to),
                optional_micros(fact.expires_at),
                optional_micros(fact.last_used_at),
                i64::try_from(fact.use_count).unwrap_or(i64::MAX),
                embedding_bytes(fact.embedding.as_ref())
            ],
        )
        .map_err(storage)?;
    let seq = transaction.last_insert_rowid();
    transaction
        .execute(
            "INSERT INTO facts_fts (rowid, text, scope_key) VALUES (?1, ?2, ?3)",
            params![seq, fact.text, scope_key(scope)],
        )
        .map_err(storage)?;
    Ok(())
}

fn erase_fact(transaction: &Transaction<'_>, scope: &Scope, fact_id: &str) -> Result<()> {
    let tenant = scope.tenant().as_str();
    let user = scope.user().as_str();
    let seq: Option<i64> = transaction
        .query_row(
            "SELECT seq FROM facts WHERE id = ?1 AND tenant = ?2 AND user_id = ?3",
            params![fact_id, tenant, user],
            |row| row.get(0),
        )
        .optional()
        .map_err(storage)?;
    let Some(seq) = seq else {
        return Err(Error::NotFound { what: "fact" });
    };
    let statements: [(&str, Vec<&dyn rusqlite::ToSql>); 5] = [
        ("DELETE FROM facts_fts WHERE rowid = ?1", vec![&seq]),
        // The reviews of a forgotten fact go with it: a held one could be neither
        // approved nor rejected any more, and their reasons speak of its value.
        (
            "DELETE FROM reviews WHERE tenant = ?1 AND user_id = ?2 AND fact_id = ?3",
            vec![&tenant, &user, &fact_id],
        ),
        (
            "DELETE FROM edges WHERE tenant = ?1 AND user_id = ?2 AND (from_fact_id = ?3 OR to_fact_id = ?3)",
            vec![&tenant, &user, &fact_id],
        ),
        (
            "UPDATE facts SET superseded_by = NULL WHERE tenant = ?1 AND user_id = ?2 AND superseded_by = ?3",
            vec![&tenant, &user, &fact_id],
        ),
        ("DELETE FROM facts WHERE seq = ?1", vec![&seq]),
    ];
    for (sql, parameters) in statements {
        transaction.execute(sql, parameters.as_slice()).map_err(storage)?;
    }
    Ok(())
}

fn insert_tombstone(
    transaction: &Transaction<'_>,
    scope: &Scope,
    tombstone: &Tombstone,
) -> rusqlite::Result<()> {
    transaction.execute(
        "INSERT INTO tombstones (id, tenant, user_id, fingerprint, fact_id, reason, created_at, lifted_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![
            tombstone.id,
            scope.tenant().as_str(),
            scope.user().as_str(),
            tombstone.fingerprint,
            tombstone.fact_id,
            tombstone.reason.as_str(),
            micros(tombstone.created_at),
            optional_micros(tombstone.lifted_at)
        ],
    )?;
    Ok(())
}

fn steps_json(playbook: &Playbook) -> rusqlite::Result<String> {
    serde_json::to_string(&playbook.steps)
        .map_err(|error| rusqlite::Error::ToSqlConversionFailure(Box::new(error)))
}

fn insert_playbook_version(
    transaction: &Transaction<'_>,
    scope: &Scope,
    playbook: &Playbook,
) -> rusqlite::Result<()> {
    transaction.execute(
        "INSERT INTO playbook_versions (playbook_id, version, tenant, user_id, name, trigger_text, steps, created_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![
            playbook.id,
            playbook.version,
            scope.tenant().as_str(),
            scope.user().as_str(),
            playbook.name,
            playbook.trigger,
            steps_json(playbook)?,
            micros(playbook.updated_at)
        ],
    )?;
    Ok(())
}

fn insert_playbook(
    transaction: &Transaction<'_>,
    scope: &Scope,
    playbook: &Playbook,
) -> rusqlite::Result<()> {
    transaction.execute(
        "INSERT INTO playbooks (id, tenant, user_id, name, trigger_text, steps, version, success_count, \
         failure_count, created_at, updated_at, last_used_at, use_count, embedding) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 0, 0, ?8, ?9, NULL, 0, ?10)",
        params![
            playbook.id,
            scope.tenant().as_str(),
            scope.user().as_str(),
            playbook.name,
            playbook.trigger,
            steps_json(playbook)?,
            playbook.version,
            micros(playbook.created_at),
            micros(playbook.updated_at),
            embedding_bytes(playbook.embedding.as_ref())
        ],
    )?;
    let seq = transaction.last_insert_rowid();
    transaction.execute(
        "INSERT INTO playbooks_fts (rowid, text, scope_key) VALUES (?1, ?2, ?3)",
        params![seq, playbook.searchable_text(), scope_key(scope)],
    )?;
    insert_playbook_version(transaction, scope, playbook)
}

fn append_playbook_version(
    transaction: &Transaction<'_>,
    scope: &Scope,
    expected_version: u32,
    playbook: &Playbook,
) -> Result<()> {
    let current: Option<(i64, u32)> = transaction
        .query_row(
            "SELECT seq, version FROM playbooks WHERE id = ?1 AND tenant = ?2 AND user_id = ?3",
            params![playbook.id, scope.tenant().as_str(), scope.user().as_str()],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .optional()
        .map_err(storage)?;
    let Some((seq, version)) = current else {
        return Err(Error::NotFound { what: "playbook" });
    };
    if version != expected_version {
        return Err(Error::Conflict {
            code: cairn_core::ErrorCode::VersionConflict,
            message: format!(
                "playbook {} is at version {version}, not {expected_version}",
                playbook.id
            ),
        });
    }
    transaction
        .execute(
            "UPDATE playbooks SET name = ?1, trigger_text = ?2, steps = ?3, version = ?4, updated_at = ?5, \
             embedding = ?6 WHERE seq = ?7 AND version = ?8",
            params![
                playbook.name,
                playbook.trigger,
                steps_json(playbook).map_err(storage)?,
                playbook.version,
                micros(playbook.updated_at),
                embedding_bytes(playbook.embedding.as_ref()),
                seq,
                expected_version
            ],
        )
        .map_err(storage)?;
    transaction
        .execute("DELETE FROM playbooks_fts WHERE rowid = ?1", [seq])
        .map_err(storage)?;
    transaction
        .execute(
            "INSERT INTO playbooks_fts (rowid, text, scope_key) VALUES (?1, ?2, ?3)",
            params![seq, playbook.searchable_text(), scope_key(scope)],
        )
        .map_err(storage)?;
    insert_playbook_version(transaction, scope, playbook).map_err(storage)
}

fn insert_decision(
    transaction: &Transaction<'_>,
    scope: &Scope,
    decision: &Decision,
) -> rusqlite::Result<()> {
    let target_ids = serde_json::to_string(&decision.target_ids)
        .map_err(|error| rusqlite::Error::ToSqlConversionFailure(Box::new(error)))?;
    transaction.execute(
        // A replayed consolidation batch issues the same decision ids: recorded once.
        "INSERT OR IGNORE INTO decisions (id, tenant, user_id, kind, reason, fact_id, target_ids, origin, created_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        params![
            decision.id,
            scope.tenant().as_str(),
            scope.user().as_str(),
            decision.kind.as_str(),
            decision.reason,
            decision.fact_id,
            target_ids,
            decision.origin,
            micros(decision.created_at)
        ],
    )?;
    Ok(())
}

/// Audit rows take tenant and user from the scope, never from the event, so an event
/// cannot be filed under another scope.
pub fn insert_audit(
    transaction: &Transaction<'_>,
    scope: &Scope,
    event: &AuditEvent,
) -> rusqlite::Result<()> {
    let to_sql_error = |error: serde_json::Error| rusqlite::Error::ToSqlConversionFailure(Box::new(error));
    transaction.execute(
        "INSERT INTO audit_events (id, at, subject, tenant, user_id, action, target_ids, request_id, detail) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        params![
            event.id,
            micros(event.at),
            event.subject,
            scope.tenant().as_str(),
            scope.user().as_str(),
            event.action,
            serde_json::to_string(&event.target_ids).map_err(to_sql_error)?,
            event.request_id,
            serde_json::to_string(&event.detail).map_err(to_sql_error)?
        ],
    )?;
    Ok(())
}
