//! The embedded store's schema and connection settings.

use rusqlite::{Connection, OptionalExtension};

pub const SCHEMA_VERSION: i64 = 8;

/// Durability, safety and read settings applied to every connection. `synchronous=FULL`
/// in WAL mode means an acknowledged commit survives a crash of the process or the
/// machine; `secure_delete` overwrites erased content instead of leaving it in free pages.
pub fn configure(connection: &Connection) -> rusqlite::Result<()> {
    connection.pragma_update(None, "journal_mode", "WAL")?;
    connection.pragma_update(None, "synchronous", "FULL")?;
    connection.pragma_update(None, "foreign_keys", "ON")?;
    connection.pragma_update(None, "secure_delete", "ON")?;
    // Reads go through a memory map instead of read() calls into a 2 MB page cache:
    // scanning a scope's rows for the vector leg then costs no copying.
    connection.pragma_update(None, "mmap_size", 1_i64 << 32)?;
    connection.pragma_update(None, "cache_size", -32_768)?;
    connection.busy_timeout(std::time::Duration::from_secs(10))?;
    Ok(())
}

/// The schema version of an open store; 0 for a new (empty) one.
pub fn version(connection: &Connection) -> rusqlite::Result<i64> {
    let exists: bool = connection.query_row(
        "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'schema_meta'",
        [],
        |row| row.get(0),
    )?;
    if !exists {
        return Ok(0);
    }
    let current: Option<String> = connection
        .query_row("SELECT value FROM schema_meta WHERE key = 'version'", [], |row| {
            row.get(0)
        })
        .optional()?;
    Ok(current.and_then(|value| value.parse::<i64>().ok()).unwrap_or(0))
}

/// Creates every table once; later versions add migrations keyed on `SCHEMA_VERSION`.
pub fn migrate(connection: &mut Connection) -> rusqlite::Result<()> {
    let transaction = connection.transaction()?;
    transaction.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);",
    )?;
    let version = version(&transaction)?;
    if version < 1 {
        transaction.execute_batch(SCHEMA)?;
    }
    if version < 2 {
        transaction.execute_batch(CONSOLIDATION)?;
    }
    if version < 3 {
        transaction.execute_batch(EPISODE_CONTEXT)?;
        reindex_episodes(&transaction)?;
    }
    if version < 4 {
        transaction.execute_batch(DEAD_LETTERS)?;
    }
    if version < 5 {
        transaction.execute_batch(AUDIT_KEYS)?;
    }
    if version < 6 {
        transaction.execute_batch(REVIEWS)?;
    }
    if version < 7 {
        transaction.execute_batch(GENERATIONS)?;
    }
    if version < 8 {
        transaction.execute_batch(REEMBEDDING)?;
    }
    if version < SCHEMA_VERSION {
        transaction.execute(
            "INSERT INTO schema_meta (key, value) VALUES ('version', ?1) \
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            [SCHEMA_VERSION.to_string()],
        )?;
    }
    transaction.commit()
}

/// Each full-text table indexes the record text plus a per-scope token (`scope_key`,
/// weight 0 in ranking), so a full-text match is restricted to the scope inside the
/// index itself, before any join. Text is Porter-stemmed ("lives" matches "live").
const SCHEMA: &str = r#"
CREATE TABLE episodes (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    tenant TEXT NOT NULL,
    user_id TEXT NOT NULL,
    session_id TEXT,
    text TEXT NOT NULL,
    occurred_at INTEGER NOT NULL,
    ingested_at INTEGER NOT NULL,
    embedding BLOB
);
CREATE INDEX episodes_scope ON episodes (tenant, user_id, ingested_at, session_id, seq);
CREATE VIRTUAL TABLE episodes_fts USING fts5 (text, scope_key, tokenize = 'porter unicode61 remove_diacritics 2');
INSERT INTO episodes_fts (episodes_fts, rank) VALUES ('secure-delete', 1);

CREATE TABLE facts (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    tenant TEXT NOT NULL,
    user_id TEXT NOT NULL,
    fact_type TEXT NOT NULL,
    text TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    confidence REAL NOT NULL,
    status TEXT NOT NULL,
    source_episode_ids TEXT NOT NULL,
    source_span TEXT,
    created_at INTEGER NOT NULL,
    superseded_at INTEGER,
    superseded_by TEXT,
    retracted_at INTEGER,
    retraction_reason TEXT,
    valid_from INTEGER,
    valid_to INTEGER,
    expires_at INTEGER,
    last_used_at INTEGER,
    use_count INTEGER NOT NULL DEFAULT 0,
    embedding BLOB
);
CREATE INDEX facts_scope ON facts (tenant, user_id, seq);
CREATE INDEX facts_fingerprint ON facts (tenant, user_id, fingerprint);
-- Covers every currency condition; listings by scope and status read it. (Version 1
-- built it for the vector leg, which now keeps its own in-memory index per scope.)
CREATE INDEX facts_currency ON facts (tenant, user_id, status, created_at, superseded_at, expires_at,
    valid_from, valid_to, fact_type, seq);
CREATE VIRTUAL TABLE facts_fts USING fts5 (text, scope_key, tokenize = 'porter unicode61 remove_diacritics 2');
INSERT INTO facts_fts (facts_fts, rank) VALUES ('secure-delete', 1);

CREATE TABLE edges (
    tenant TEXT NOT NULL,
    user_id TEXT NOT NULL,
    from_fact_id TEXT NOT NULL,
    to_fact_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (from_fact_id, to_fact_id, kind)
);
CREATE INDEX edges_scope ON edges (tenant, user_id);
CREATE INDEX edges_to ON edges (to_fact_id);

CREATE TABLE tombstones (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    tenant TEXT NOT NULL,
    user_id TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    fact_id TEXT NOT NULL,
    reason TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    lifted_at INTEGER
);
CREATE INDEX tombstones_scope ON tombstones (tenant, user_id, fingerprint);

CREATE TABLE playbooks (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    tenant TEXT NOT NULL,
    user_id TEXT NOT NULL,
    name TEXT NOT NULL,
    trigger_text TEXT NOT NULL,
    steps TEXT NOT NULL,
    version INTEGER NOT NULL,
    success_count INTEGER NOT NULL DEFAULT 0,
    failure_count INTEGER NOT NULL DEFAULT 0,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    last_used_at INTEGER,
    use_count INTEGER NOT NULL DEFAULT 0,
    embedding BLOB
);
CREATE INDEX playbooks_scope ON playbooks (tenant, user_id, seq);
CREATE VIRTUAL TABLE playbooks_fts USING fts5 (text, scope_key, tokenize = 'porter unicode61 remove_diacritics 2');
INSERT INTO playbooks_fts (playbooks_fts, rank) VALUES ('secure-delete', 1);

CREATE TABLE playbook_versions (
    playbook_id TEXT NOT NULL,
    version INTEGER NOT NULL,
    tenant TEXT NOT NULL,
    user_id TEXT NOT NULL,
    name TEXT NOT NULL,
    trigger_text TEXT NOT NULL,
    steps TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (playbook_id, version)
);
CREATE INDEX playbook_versions_scope ON playbook_versions (tenant, user_id);

CREATE TABLE decisions (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    tenant TEXT NOT NULL,
    user_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    reason TEXT NOT NULL,
    fact_id TEXT,
    target_ids TEXT NOT NULL,
    origin TEXT NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE INDEX decisions_scope ON decisions (tenant, user_id, seq);

CREATE TABLE audit_events (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    at INTEGER NOT NULL,
    subject TEXT NOT NULL,
    tenant TEXT NOT NULL,
    user_id TEXT NOT NULL,
    action TEXT NOT NULL,
    target_ids TEXT NOT NULL,
    request_id TEXT NOT NULL,
    detail TEXT NOT NULL
);
CREATE INDEX audit_scope ON audit_events (tenant, user_id, seq);
CREATE TRIGGER audit_events_append_only_update BEFORE UPDATE ON audit_events
BEGIN SELECT RAISE(ABORT, 'audit events are append-only'); END;
CREATE TRIGGER audit_events_append_only_delete BEFORE DELETE ON audit_events
BEGIN SELECT RAISE(ABORT, 'audit events are append-only'); END;
"#;

/// Version 3: an episode is indexed with the texts of the episodes before and after it in
/// its session as a second, lower-weighted column, so a short reply ("yes, since March")
/// is found by the words of what it answers, and a statement by the words of the reply.
/// The full-text table is rebuilt by [`reindex_episodes`].
const EPISODE_CONTEXT: &str = r#"
CREATE INDEX episodes_session ON episodes (tenant, user_id, session_id, seq);
DROP TABLE episodes_fts;
CREATE VIRTUAL TABLE episodes_fts USING fts5 (text, scope_key, context, tokenize = 'porter unicode61 remove_diacritics 2');
INSERT INTO episodes_fts (episodes_fts, rank) VALUES ('secure-delete', 1);
"#;

/// Fills the episodes' full-text table from the stored episodes, each with its context.
fn reindex_episodes(transaction: &rusqlite::Transaction<'_>) -> rusqlite::Result<()> {
    let mut episodes = transaction.prepare(
        "SELECT seq, tenant, user_id, text, CASE WHEN session_id IS NULL THEN NULL ELSE \
         concat_ws(char(10), LAG(text) OVER session, LEAD(text) OVER session) END FROM episodes \
         WINDOW session AS (PARTITION BY tenant, user_id, session_id ORDER BY seq)",
    )?;
    let mut insert = transaction
        .prepare("INSERT INTO episodes_fts (rowid, text, scope_key, context) VALUES (?1, ?2, ?3, ?4)")?;
    let mut rows = episodes.query([])?;
    while let Some(row) = rows.next()? {
        let tenant: String = row.get(1)?;
        let user: String = row.get(2)?;
        let text: String = row.get(3)?;
        let context: Option<String> = row.get(4)?;
        insert.execute(rusqlite::params![
            row.get::<_, i64>(0)?,
            text,
            crate::rows::scope_key_of(&tenant, &user),
            context
        ])?;
    }
    Ok(())
}

/// Version 2: the consolidation watermark per scope and the durable job queue. A job's
/// `assistant_context` is transient extraction context, deleted with the job.
const CONSOLIDATION: &str = r#"
CREATE TABLE consolidation_state (
    tenant TEXT NOT NULL,
    user_id TEXT NOT NULL,
    watermark INTEGER NOT NULL,
    PRIMARY KEY (tenant, user_id)
);

CREATE TABLE jobs (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    tenant TEXT NOT NULL,
    user_id TEXT NOT NULL,
    subject TEXT NOT NULL,
    request_id TEXT NOT NULL,
    assistant_context TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    run_after INTEGER NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    leased_until INTEGER
);
CREATE INDEX jobs_due ON jobs (run_after, seq);
CREATE INDEX jobs_scope ON jobs (tenant, user_id, seq);
"#;

/// Version 4: dead-lettered jobs (failed too often, not claimed until retried), and an
/// index that lets tenants take turns at the job queue.
const DEAD_LETTERS: &str = r#"
ALTER TABLE jobs ADD COLUMN dead_at INTEGER;
CREATE INDEX jobs_by_tenant ON jobs (tenant, run_after, seq);
"#;

/// Version 5: each scope's secret for the keyed fingerprints its audit events keep,
/// deleted with the scope's state when it is erased.
const AUDIT_KEYS: &str = r#"
ALTER TABLE consolidation_state ADD COLUMN audit_key BLOB;
"#;

/// Version 6: outcomes held for a person's review. A pending review's fact is stored
/// with status `pending`; the review says what approving it changes.
const REVIEWS: &str = r#"
CREATE TABLE reviews (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    tenant TEXT NOT NULL,
    user_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    fact_id TEXT NOT NULL,
    target_id TEXT,
    rule TEXT NOT NULL,
    reason TEXT NOT NULL,
    decision_id TEXT NOT NULL,
    evidence_episode_ids TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    origin TEXT NOT NULL,
    proposed_by TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    status TEXT NOT NULL,
    resolved_at INTEGER,
    resolved_by TEXT,
    note TEXT
);
CREATE INDEX reviews_queue ON reviews (tenant, status, created_at, id);
CREATE INDEX reviews_scope ON reviews (tenant, user_id, status, created_at, id);
CREATE INDEX reviews_value ON reviews (tenant, user_id, fingerprint);
"#;

/// Version 7: each scope's erasure generation, advanced by every erasure (which keeps
/// the scope's state row for it), so a change that read the scope before an erasure
/// can require that nothing was erased since (`Change::RequireGeneration`); the claim
/// of an import under way; the lease on the scope's consolidation runs; and keys used
/// once (console login tickets).
const GENERATIONS: &str = r#"
ALTER TABLE consolidation_state ADD COLUMN generation INTEGER NOT NULL DEFAULT 0;
ALTER TABLE consolidation_state ADD COLUMN import_claim TEXT;
ALTER TABLE consolidation_state ADD COLUMN import_claimed_at INTEGER;
ALTER TABLE consolidation_state ADD COLUMN runs_holder TEXT;
ALTER TABLE consolidation_state ADD COLUMN runs_until INTEGER;
CREATE TABLE used_once (key TEXT PRIMARY KEY, until INTEGER NOT NULL);
"#;

/// Vectors of another embedding space built beside the current ones (`cairn reembed`),
/// by tier and record id. A record deleted, or whose text or vector changes, loses its
/// built vector, so the move never carries a vector of erased or outdated text.
const REEMBEDDING: &str = r#"
CREATE TABLE reembedding (
    tier TEXT NOT NULL,
    id TEXT NOT NULL,
    embedding BLOB NOT NULL,
    PRIMARY KEY (tier, id)
) WITHOUT ROWID;
CREATE TRIGGER episodes_reembedding_deleted AFTER DELETE ON episodes
    BEGIN DELETE FROM reembedding WHERE tier = 'episodic' AND id = OLD.id; END;
CREATE TRIGGER episodes_reembedding_changed AFTER UPDATE OF text, embedding ON episodes
    BEGIN DELETE FROM reembedding WHERE tier = 'episodic' AND id = OLD.id; END;
CREATE TRIGGER facts_reembedding_deleted AFTER DELETE ON facts
    BEGIN DELETE FROM reembedding WHERE tier = 'semantic' AND id = OLD.id; END;
CREATE TRIGGER facts_reembedding_changed AFTER UPDATE OF text, embedding ON facts
    BEGIN DELETE FROM reembedding WHERE tier = 'semantic' AND id = OLD.id; END;
CREATE TRIGGER playbooks_reembedding_deleted AFTER DELETE ON playbooks
    BEGIN DELETE FROM reembedding WHERE tier = 'procedural' AND id = OLD.id; END;
CREATE TRIGGER playbooks_reembedding_changed AFTER UPDATE OF name, trigger_text, steps, embedding ON playbooks
    BEGIN DELETE FROM reembedding WHERE tier = 'procedural' AND id = OLD.id; END;
"#;
