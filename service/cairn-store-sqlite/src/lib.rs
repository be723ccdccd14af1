//! The embedded store: SQLite (WAL, `synchronous=FULL`) with FTS5 for BM25, in one
//! data directory and with no services.
//!
//! One writer connection serialises transactions; a few reader connections serve
//! queries concurrently. All SQLite work runs on the blocking thread pool, never on
//! the async executor.

mod backup;
mod commit;
mod cursor;
mod reembed;
mod rows;
mod schema;
mod search;
mod vectors;

use cairn_core::{
    AuditEvent, Change, ChangeSet, ConsolidationJob, Decision, DecisionKind, Episode, ErasureReceipt, Error,
    Fact, FactStatus, LoggedEpisode, MemoryStore, Page, PageRequest, Playbook, Reembedded, Reembedding,
    Result, Review, ReviewKind, ReviewSummary, Scope, StatusFilter, TenantId, TenantScope, TextHit,
    TextQuery, Tier, ToReembed, Tombstone, UseCount, UserId, UserSummary, VectorQuery,
};
use chrono::{DateTime, Utc};
use rows::micros;
use rusqlite::{Connection, OptionalExtension, params};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

const READER_CONNECTIONS: usize = 4;
pub use backup::{BackupReport, DataDirLock, RestoreReport, UPGRADE_BACKUPS, backup, lock_data_dir, restore};

const DATABASE_FILE: &str = "cairn.sqlite3";

/// A SQLite failure as the port reports it.
pub(crate) fn storage(error: rusqlite::Error) -> Error {
    Error::Storage(error.to_string())
}

struct Inner {
    writer: Mutex<Connection>,
    readers: Vec<Mutex<Connection>>,
    next_reader: AtomicUsize,
    path: PathBuf,
    vectors: vectors::VectorIndexes,
    /// The secret page cursors are enciphered under (see `cursor.rs`).
    cursor_key: [u8; 32],
    /// The embedding space this process claimed: once another process moves the
    /// store's vectors elsewhere (`cairn reembed`), vector reads and writes refuse.
    claimed_space: Mutex<Option<String>>,
    /// How far `pending_reembedding` has read each tier, by `seq`.
    reembed_after: Mutex<[i64; 3]>,
}

/// A command run beside the service reads the whole file once: through read() calls
/// and a small page cache, not a memory map that would keep every page it touched
/// resident.
fn beside(connection: &Connection, beside_service: bool) -> Result<()> {
    if beside_service {
        connection.pragma_update(None, "mmap_size", 0).map_err(storage)?;
    }
    Ok(())
}

impl Inner {
    /// Refuses once the stored vectors were moved to another space than this process
    /// claimed (by `cairn reembed` beside it): its model's vectors no longer compare.
    fn check_space(&self, connection: &Connection) -> Result<()> {
        let claimed = self
            .claimed_space
            .lock()
            .map_err(|_| Error::Storage("claimed space poisoned".into()))?
            .clone();
        let Some(claimed) = claimed else {
            return Ok(());
        };
        match reembed::current_space(connection)? {
            Some(current) if current != claimed => Err(Error::Unavailable(format!(
                "the store's vectors were moved to {current} (cairn reembed); restart the service with \
                 CAIRN_EMBEDDING_MODEL={}",
                current.split('/').next().unwrap_or(&current)
            ))),
            Some(_) | None => Ok(()),
        }
    }
}

/// The embedded backend. Cheap to clone; clones share connections.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

impl SqliteStore {
    /// Opens (creating if needed) the store in `data_dir` and brings its schema up to date.
    pub fn open(data_dir: &Path) -> Result<Self> {
        SqliteStore::open_with_vector_budget(data_dir, vectors::DEFAULT_BUDGET_BYTES)
    }

    /// Opens the store with the in-memory vector indexes held to `budget` bytes (past
    /// it, the least recently used scope indexes are dropped and rebuilt on demand).
    pub fn open_with_vector_budget(data_dir: &Path, budget: usize) -> Result<Self> {
        SqliteStore::open_as(data_dir, budget, false)
    }

    /// Opens the store beside the process that serves it (`cairn reembed`): the schema
    /// must be current already, and the leases the service holds are left as they are.
    pub fn open_beside_service(data_dir: &Path) -> Result<Self> {
        SqliteStore::open_as(data_dir, vectors::DEFAULT_BUDGET_BYTES, true)
    }

    fn open_as(data_dir: &Path, budget: usize, beside_service: bool) -> Result<Self> {
        std::fs::create_dir_all(data_dir).map_err(|error| {
            Error::Unavailable(format!(
                "cannot create data directory {}: {error}",
                data_dir.display()
            ))
        })?;
        let path = data_dir.join(DATABASE_FILE);
        backup::keep_private(data_dir, &path)?;
        let mut writer = Connection::open(&path).map_err(storage)?;
        schema::configure(&writer).map_err(storage)?;
        beside(&writer, beside_service)?;
        // A store written by an older release is copied aside before its schema changes,
        // so an upgrade can be rolled back by restoring the copy with the old binary.
        let version = schema::version(&writer).map_err(storage)?;
        if version > schema::SCHEMA_VERSION {
            return Err(Error::Unavailable(format!(
                "{} was written by a newer Cairn (schema {version}; this build knows up to {}): \
                 run that release, or restore the copy its upgrade left in {}",
                path.display(),
                schema::SCHEMA_VERSION,
                data_dir.join(UPGRADE_BACKUPS).display()
            )));
        }
        if beside_service && version != schema::SCHEMA_VERSION {
            return Err(Error::Unavailable(format!(
                "{} has schema {version}, not {}: start this release's `cairn serve` once first",
                path.display(),
                schema::SCHEMA_VERSION
            )));
        }
        if version > 0 && version < schema::SCHEMA_VERSION {
            let copy = backup::before_upgrade(&writer, data_dir, version)?;
            tracing::info!(from = version, to = schema::SCHEMA_VERSION, backup = %copy.display(), "upgrading the embedded store's schema");
        }
        if !beside_service {
            schema::migrate(&mut writer).map_err(storage)?;
            // The embedded store belongs to one serving process: a lease left in the
            // file was held by a process that is gone, so its job is due again now (its
            // attempt counted), and its scope's runs are free.
            writer
                .execute_batch(
                    "UPDATE jobs SET leased_until = NULL WHERE leased_until IS NOT NULL; \
                     UPDATE consolidation_state SET runs_holder = NULL, runs_until = NULL \
                     WHERE runs_holder IS NOT NULL;",
                )
                .map_err(storage)?;
        }
        // The secret page cursors are enciphered under: made once, kept in the file.
        writer
            .execute(
                "INSERT OR IGNORE INTO schema_meta (key, value) VALUES ('cursor_key', hex(randomblob(32)))",
                [],
            )
            .map_err(storage)?;
        let stored: String = writer
            .query_row(
                "SELECT value FROM schema_meta WHERE key = 'cursor_key'",
                [],
                |row| row.get(0),
            )
            .map_err(storage)?;
        let cursor_key: [u8; 32] = hex::decode(&stored)
            .ok()
            .and_then(|bytes| bytes.try_into().ok())
            .ok_or_else(|| Error::Storage("schema_meta cursor_key is not 32 hex-encoded bytes".into()))?;
        let readers = (0..READER_CONNECTIONS)
            .map(|_| {
                let reader = Connection::open(&path).map_err(storage)?;
                schema::configure(&reader).map_err(storage)?;
                beside(&reader, beside_service)?;
                Ok(Mutex::new(reader))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                writer: Mutex::new(writer),
                readers,
                next_reader: AtomicUsize::new(0),
                path,
                vectors: vectors::VectorIndexes::with_budget(budget),
                cursor_key,
                claimed_space: Mutex::new(None),
                reembed_after: Mutex::new([0; 3]),
            }),
        })
    }

    /// Scope vector indexes held in memory, and their approximate bytes.
    pub fn vector_index_usage(&self) -> (usize, usize) {
        self.inner.vectors.usage()
    }

    /// The database file, for operators and diagnostics.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Pending reviews of a tenant (of one user when `user` says so), each with its
    /// user, oldest first, after the page's [`cairn_core::review_cursor`].
    async fn review_page(
        &self,
        tenant: &str,
        user: Option<String>,
        page: &PageRequest,
    ) -> Result<Page<cairn_core::UserReview>> {
        let tenant = tenant.to_owned();
        let after = page
            .cursor
            .as_deref()
            .map(cairn_core::parse_review_cursor)
            .transpose()?;
        let limit = page.limit.max(1);
        self.read(move |connection| {
            let (after_at, after_id) = after.unwrap_or((i64::MIN, String::new()));
            let mut statement = connection
                .prepare_cached(&format!(
                    "SELECT {}, user_id FROM reviews WHERE tenant = ?1 AND (?2 IS NULL OR user_id = ?2) \
                     AND status = 'pending' AND (created_at > ?3 OR (created_at = ?3 AND id > ?4)) \
                     ORDER BY created_at, id LIMIT ?5",
                    rows::REVIEW_COLUMNS
                ))
                .map_err(storage)?;
            let fetch = i64::try_from(limit).unwrap_or(i64::MAX).saturating_add(1);
            let mut items = statement
                .query_map(
                    params![tenant, user, after_at, after_id, fetch],
                    rows::user_review,
                )
                .map_err(storage)?
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(storage)?;
            let next_cursor = if items.len() > limit {
                items.truncate(limit);
                items.last().map(|item| cairn_core::review_cursor(&item.review))
            } else {
                None
            };
            Ok(Page { items, next_cursor })
        })
        .await
    }

    async fn episode_log(
        &self,
        scope: &Scope,
        sql: String,
        position: u64,
        limit: usize,
    ) -> Result<Vec<LoggedEpisode>> {
        let scope = scope.clone();
        let position = i64::try_from(position).unwrap_or(i64::MAX);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.read(move |connection| {
            let mut statement = connection.prepare_cached(&sql).map_err(storage)?;
            statement
                .query_map(
                    params![scope.tenant().as_str(), scope.user().as_str(), position, limit],
                    |row| {
                        Ok(LoggedEpisode {
                            position: u64::try_from(row.get::<_, i64>(0)?).unwrap_or(0),
                            episode: rows::episode(row)?,
                        })
                    },
                )
                .map_err(storage)?
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(storage)
        })
        .await
    }

    async fn read<T, F>(&self, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
    {
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || {
            let index = inner.next_reader.fetch_add(1, Ordering::Relaxed) % inner.readers.len();
            let connection = inner.readers[index]
                .lock()
                .map_err(|_| Error::Storage("reader connection poisoned".into()))?;
            work(&connection)
        })
        .await
        .map_err(|error| Error::Storage(format!("store task failed: {error}")))?
    }

    async fn write<T, F>(&self, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T> + Send + 'static,
    {
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || {
            let mut connection = inner
                .writer
                .lock()
                .map_err(|_| Error::Storage("writer connection poisoned".into()))?;
            inner.check_space(&connection)?;
            work(&mut connection)
        })
        .await
        .map_err(|error| Error::Storage(format!("store task failed: {error}")))?
    }
}

/// The `seq` of the last item of the previous page, from its cursor.
fn cursor_seq(key: &[u8; 32], scope: &Scope, page: &PageRequest) -> Result<i64> {
    match &page.cursor {
        None => Ok(i64::MAX),
        Some(text) => cursor::open(key, scope, text)
            .ok_or_else(|| Error::invalid("cursor", "is not a cursor this service issued")),
    }
}

/// Runs a newest-first page query whose first column is `seq` and whose parameters
/// are `(tenant, user, cursor, limit)` followed by `extra`.
fn page_query<T>(
    connection: &Connection,
    key: &[u8; 32],
    sql: &str,
    scope: &Scope,
    page: &PageRequest,
    extra: &[&dyn rusqlite::ToSql],
    map: fn(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
) -> Result<Page<T>> {
    let cursor = cursor_seq(key, scope, page)?;
    let limit = i64::try_from(page.limit.max(1)).unwrap_or(i64::MAX);
    let fetch = limit.saturating_add(1);
    let tenant = scope.tenant().as_str();
    let user = scope.user().as_str();
    let mut parameters: Vec<&dyn rusqlite::ToSql> = vec![&tenant, &user, &cursor, &fetch];
    parameters.extend_from_slice(extra);
    let mut statement = connection.prepare_cached(sql).map_err(storage)?;
    let mut rows = statement.query(parameters.as_slice()).map_err(storage)?;
    let mut items = Vec::new();
    let mut last_seq = None;
    while let Some(row) = rows.next().map_err(storage)? {
        if items.len() as i64 == limit {
            return Ok(Page {
                items,
                next_cursor: last_seq.map(|seq: i64| cursor::seal(key, scope, seq)),
            });
        }
        last_seq = Some(row.get::<_, i64>(0).map_err(storage)?);
        items.push(map(row).map_err(storage)?);
    }
    Ok(Page {
        items,
        next_cursor: None,
    })
}

/// SQL conditions selecting facts by their status at `?5` (the `as_of` micros), and
/// whether the condition reads `?5` at all.
fn status_condition(status: StatusFilter) -> (&'static str, bool) {
    let condition = status_condition_text(status);
    (condition, condition.contains("?5"))
}

fn status_condition_text(status: StatusFilter) -> &'static str {
    match status {
        StatusFilter::All => "1 = 1",
        StatusFilter::Only(FactStatus::Active) => {
            "f.status IN ('active', 'superseded') AND f.created_at <= ?5 \
             AND (f.superseded_at IS NULL OR f.superseded_at > ?5) \
             AND (f.expires_at IS NULL OR f.expires_at > ?5)"
        }
        StatusFilter::Only(FactStatus::Expired) => {
            "f.status IN ('active', 'superseded') AND f.created_at <= ?5 \
             AND (f.superseded_at IS NULL OR f.superseded_at > ?5) \
             AND f.expires_at IS NOT NULL AND f.expires_at <= ?5"
        }
        StatusFilter::Only(FactStatus::Superseded) => "f.status = 'superseded' AND f.superseded_at <= ?5",
        StatusFilter::Only(FactStatus::Retracted) => "f.status = 'retracted'",
        // Forgotten facts are erased; nothing can match.
        StatusFilter::Only(FactStatus::Forgotten) => "0 = 1",
        StatusFilter::Only(FactStatus::Pending) => "f.status = 'pending'",
    }
}

/// The records of `tier` whose rows a change set adds or alters in a way the kNN leg
/// sees: membership, vectors, or the columns its currency conditions test. (Erased facts
/// are gone after the commit and are handled by row id.)
fn rows_changed_in(change_set: &ChangeSet, tier: Tier) -> Vec<&str> {
    let mut ids = Vec::new();
    for change in &change_set.changes {
        match change {
            Change::InsertEpisodes(episodes) if tier == Tier::Episodic => {
                ids.extend(episodes.iter().map(|episode| episode.id.as_str()))
            }
            Change::InsertFact(fact) if tier == Tier::Semantic => ids.push(fact.id.as_str()),
            Change::SupersedeFact { fact_id, .. }
            | Change::RetractFact { fact_id, .. }
            | Change::ActivateFact { fact_id, .. }
                if tier == Tier::Semantic =>
            {
                ids.push(fact_id.as_str())
            }
            Change::InsertPlaybook(playbook) | Change::AppendPlaybookVersion { playbook, .. }
                if tier == Tier::Procedural =>
            {
                ids.push(playbook.id.as_str())
            }
            Change::InsertEpisodes(_)
            | Change::InsertFact(_)
            | Change::SupersedeFact { .. }
            | Change::RetractFact { .. }
            | Change::ActivateFact { .. }
            | Change::InsertReview(_)
            | Change::ResolveReview { .. }
            | Change::EraseFact { .. }
            | Change::InsertPlaybook(_)
            | Change::AppendPlaybookVersion { .. }
            | Change::InsertEdge(_)
            | Change::InsertTombstone(_)
            | Change::LiftTombstone { .. }
            | Change::RecordPlaybookOutcome { .. }
            | Change::EnqueueJob(_)
            | Change::CompleteJobs(_)
            | Change::RetryJob { .. }
            | Change::RequireEpisodes(_)
            | Change::RequireNoActiveValue { .. }
            | Change::RequireGeneration(_)
            | Change::MoveWatermark { .. } => {}
        }
    }
    ids
}

#[async_trait::async_trait]
impl MemoryStore for SqliteStore {
    async fn ping(&self) -> Result<()> {
        self.read(|connection| {
            connection
                .query_row("SELECT 1", [], |row| row.get::<_, i64>(0))
                .map_err(|error| Error::Unavailable(error.to_string()))?;
            Ok(())
        })
        .await
    }

    async fn recover_commits(&self, _older_than: std::time::Duration) -> Result<u64> {
        // Every commit is one SQLite transaction: nothing is ever left half-applied.
        Ok(0)
    }

    async fn commit(&self, scope: &Scope, change_set: ChangeSet) -> Result<()> {
        let scope = scope.clone();
        let inner = Arc::clone(&self.inner);
        self.write(move |connection| {
            let transaction = connection.transaction().map_err(storage)?;
            // Erased rows are gone after the commit: their row ids are read before.
            let erased = commit::erased_fact_seqs(&transaction, &scope, &change_set)?;
            commit::apply(&transaction, &scope, &change_set)?;
            transaction.commit().map_err(storage)?;
            // The vector index of every tier whose rows changed takes the changed rows in.
            for tier in Tier::ALL {
                let ids = rows_changed_in(&change_set, tier);
                if ids.is_empty() && (tier != Tier::Semantic || erased.is_empty()) {
                    continue;
                }
                // A scope without an index in memory needs no delta: its next query builds
                // one from the committed rows.
                if !inner.vectors.wants_delta(tier, &scope) {
                    continue;
                }
                match search::delta(connection, &scope, tier, &ids) {
                    Ok(mut delta) => {
                        if tier == Tier::Semantic {
                            delta.removals.extend(erased.iter().copied());
                        }
                        inner.vectors.apply(tier, &scope, delta);
                    }
                    // The commit stands; the index is rebuilt by the next query.
                    Err(_) => inner.vectors.invalidate(tier, &scope),
                }
            }
            Ok(())
        })
        .await
    }

    async fn get_fact(&self, scope: &Scope, fact_id: &str) -> Result<Option<Fact>> {
        let scope = scope.clone();
        let fact_id = fact_id.to_owned();
        self.read(move |connection| {
            connection
                .prepare_cached(&format!(
                    "SELECT {} FROM facts f WHERE f.id = ?1 AND f.tenant = ?2 AND f.user_id = ?3",
                    rows::FACT_COLUMNS
                ))
                .and_then(|mut statement| {
                    statement
                        .query_row(
                            params![fact_id, scope.tenant().as_str(), scope.user().as_str()],
                            rows::fact,
                        )
                        .optional()
                })
                .map_err(storage)
        })
        .await
    }

    async fn list_facts(
        &self,
        scope: &Scope,
        status: StatusFilter,
        as_of: DateTime<Utc>,
        page: &PageRequest,
    ) -> Result<Page<Fact>> {
        let scope = scope.clone();
        let page = page.clone();
        let key = self.inner.cursor_key;
        self.read(move |connection| {
            let (condition, reads_as_of) = status_condition(status);
            let sql = format!(
                "SELECT {} FROM facts f WHERE f.tenant = ?1 AND f.user_id = ?2 AND f.seq < ?3 \
                 AND {condition} ORDER BY f.seq DESC LIMIT ?4",
                rows::FACT_COLUMNS,
            );
            let as_of = micros(as_of);
            let extra: &[&dyn rusqlite::ToSql] = if reads_as_of { &[&as_of] } else { &[] };
            page_query(connection, &key, &sql, &scope, &page, extra, rows::fact)
        })
        .await
    }

    async fn list_superseded_by(&self, scope: &Scope, fact_id: &str) -> Result<Vec<Fact>> {
        let scope = scope.clone();
        let fact_id = fact_id.to_owned();
        self.read(move |connection| {
            let mut statement = connection
                .prepare_cached(&format!(
                    "SELECT {} FROM facts f WHERE f.tenant = ?1 AND f.user_id = ?2 \
                     AND f.superseded_by = ?3 ORDER BY f.seq",
                    rows::FACT_COLUMNS
                ))
                .map_err(storage)?;
            let facts = statement
                .query_map(
                    params![scope.tenant().as_str(), scope.user().as_str(), fact_id],
                    rows::fact,
                )
                .map_err(storage)?
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(storage)?;
            Ok(facts)
        })
        .await
    }

    async fn find_active_facts_by_fingerprint(&self, scope: &Scope, fingerprint: &str) -> Result<Vec<Fact>> {
        let scope = scope.clone();
        let fingerprint = fingerprint.to_owned();
        self.read(move |connection| {
            let mut statement = connection
                .prepare_cached(&format!(
                    "SELECT {} FROM facts f WHERE f.tenant = ?1 AND f.user_id = ?2 \
                     AND f.fingerprint = ?3 AND f.status = 'active' ORDER BY f.seq",
                    rows::FACT_COLUMNS
                ))
                .map_err(storage)?;
            let facts = statement
                .query_map(
                    params![scope.tenant().as_str(), scope.user().as_str(), fingerprint],
                    rows::fact,
                )
                .map_err(storage)?
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(storage)?;
            Ok(facts)
        })
        .await
    }

    async fn find_tombstone(&self, scope: &Scope, fingerprint: &str) -> Result<Option<Tombstone>> {
        let scope = scope.clone();
        let fingerprint = fingerprint.to_owned();
        self.read(move |connection| {
            connection
                .query_row(
                    &format!(
                        "SELECT {} FROM tombstones WHERE tenant = ?1 AND user_id = ?2 AND fingerprint = ?3 \
                         AND lifted_at IS NULL ORDER BY seq DESC LIMIT 1",
                        rows::TOMBSTONE_COLUMNS
                    ),
                    params![scope.tenant().as_str(), scope.user().as_str(), fingerprint],
                    rows::tombstone,
                )
                .optional()
                .map_err(storage)
        })
        .await
    }

    async fn get_episode(&self, scope: &Scope, episode_id: &str) -> Result<Option<Episode>> {
        let scope = scope.clone();
        let episode_id = episode_id.to_owned();
        self.read(move |connection| {
            connection
                .query_row(
                    &format!(
                        "SELECT {} FROM episodes e WHERE e.id = ?1 AND e.tenant = ?2 AND e.user_id = ?3",
                        rows::EPISODE_COLUMNS
                    ),
                    params![episode_id, scope.tenant().as_str(), scope.user().as_str()],
                    rows::episode,
                )
                .optional()
                .map_err(storage)
        })
        .await
    }

    async fn list_episodes(
        &self,
        scope: &Scope,
        session: Option<&str>,
        page: &PageRequest,
    ) -> Result<Page<Episode>> {
        let scope = scope.clone();
        let page = page.clone();
        let session = session.map(str::to_owned);
        let key = self.inner.cursor_key;
        self.read(move |connection| {
            let sql = format!(
                "SELECT {} FROM episodes e WHERE e.tenant = ?1 AND e.user_id = ?2 AND e.seq < ?3 \
                 AND (?5 IS NULL OR e.session_id = ?5) ORDER BY e.seq DESC LIMIT ?4",
                rows::EPISODE_COLUMNS
            );
            page_query(connection, &key, &sql, &scope, &page, &[&session], rows::episode)
        })
        .await
    }

    async fn get_playbook(&self, scope: &Scope, playbook_id: &str) -> Result<Option<Playbook>> {
        let scope = scope.clone();
        let playbook_id = playbook_id.to_owned();
        self.read(move |connection| {
            connection
                .query_row(
                    &format!(
                        "SELECT {} FROM playbooks p WHERE p.id = ?1 AND p.tenant = ?2 AND p.user_id = ?3",
                        rows::PLAYBOOK_COLUMNS
                    ),
                    params![playbook_id, scope.tenant().as_str(), scope.user().as_str()],
                    rows::playbook,
                )
                .optional()
                .map_err(storage)
        })
        .await
    }

    async fn playbook_versions(&self, scope: &Scope, playbook_id: &str) -> Result<Vec<Playbook>> {
        let Some(current) = self.get_playbook(scope, playbook_id).await? else {
            return Ok(Vec::new());
        };
        let scope = scope.clone();
        self.read(move |connection| {
            let mut statement = connection
                .prepare_cached(
                    "SELECT version, name, trigger_text, steps, created_at FROM playbook_versions \
                     WHERE playbook_id = ?1 AND tenant = ?2 AND user_id = ?3 ORDER BY version",
                )
                .map_err(storage)?;
            let versions = statement
                .query_map(
                    params![current.id, scope.tenant().as_str(), scope.user().as_str()],
                    |row| {
                        let steps: String = row.get(3)?;
                        let created_at: i64 = row.get(4)?;
                        Ok(Playbook {
                            version: row.get(0)?,
                            name: row.get(1)?,
                            trigger: row.get(2)?,
                            steps: serde_json::from_str(&steps).unwrap_or_default(),
                            updated_at: DateTime::from_timestamp_micros(created_at).unwrap_or_default(),
                            embedding: None,
                            ..current.clone()
                        })
                    },
                )
                .map_err(storage)?
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(storage)?;
            Ok(versions)
        })
        .await
    }

    async fn list_playbooks(&self, scope: &Scope, page: &PageRequest) -> Result<Page<Playbook>> {
        let scope = scope.clone();
        let page = page.clone();
        let key = self.inner.cursor_key;
        self.read(move |connection| {
            let sql = format!(
                "SELECT {} FROM playbooks p WHERE p.tenant = ?1 AND p.user_id = ?2 AND p.seq < ?3 \
                 ORDER BY p.seq DESC LIMIT ?4",
                rows::PLAYBOOK_COLUMNS
            );
            page_query(connection, &key, &sql, &scope, &page, &[], rows::playbook)
        })
        .await
    }

    async fn search_text(&self, scope: &Scope, query: &TextQuery) -> Result<Vec<TextHit>> {
        let scope = scope.clone();
        let query = query.clone();
        self.read(move |connection| search::search_text(connection, &scope, &query))
            .await
    }

    async fn search_vector(&self, scope: &Scope, query: &VectorQuery) -> Result<Vec<TextHit>> {
        let scope = scope.clone();
        let query = query.clone();
        let inner = Arc::clone(&self.inner);
        self.read(move |connection| {
            inner.check_space(connection)?;
            search::search_vector(connection, &inner.vectors, &scope, &query)
        })
        .await
    }

    async fn claim_embedding_space(&self, model_id: &str, dimension: usize) -> Result<()> {
        let claimed = format!("{model_id}/{dimension}");
        let inner = Arc::clone(&self.inner);
        let model = model_id.to_owned();
        self.write(move |connection| {
            let existing: Option<String> = connection
                .query_row(
                    "SELECT value FROM schema_meta WHERE key = 'embedding_space'",
                    [],
                    |row| row.get(0),
                )
                .optional()
                .map_err(storage)?;
            match existing {
                Some(existing) if existing == claimed => {}
                Some(existing) => {
                    return Err(Error::Unavailable(format!(
                        "the store holds vectors of {existing} but the configured embedding model is {claimed}; \
                         run `cairn reembed` with CAIRN_EMBEDDING_MODEL={model} to move the stored vectors \
                         to it, or configure CAIRN_EMBEDDING_MODEL={} again",
                        existing.split('/').next().unwrap_or(&existing)
                    )));
                }
                None => {
                    connection
                        .execute(
                            "INSERT INTO schema_meta (key, value) VALUES ('embedding_space', ?1)",
                            [&claimed],
                        )
                        .map_err(storage)?;
                }
            }
            *inner
                .claimed_space
                .lock()
                .map_err(|_| Error::Storage("claimed space poisoned".into()))? = Some(claimed);
            Ok(())
        })
        .await
    }

    async fn start_reembedding(&self, target: &str) -> Result<Reembedding> {
        let target = target.to_owned();
        let inner = Arc::clone(&self.inner);
        self.write(move |connection| {
            *inner
                .reembed_after
                .lock()
                .map_err(|_| Error::Storage("re-embedding cursor poisoned".into()))? = [0; 3];
            reembed::start(connection, &target)
        })
        .await
    }

    async fn pending_reembedding(&self, limit: usize) -> Result<Vec<ToReembed>> {
        let inner = Arc::clone(&self.inner);
        self.read(move |connection| {
            let mut after = inner
                .reembed_after
                .lock()
                .map_err(|_| Error::Storage("re-embedding cursor poisoned".into()))?;
            let found = reembed::pending(connection, &mut after, limit)?;
            if !found.is_empty() {
                return Ok(found);
            }
            // Past the end: once more from the start, for records changed behind the
            // cursor (their built vectors were dropped).
            *after = [0; 3];
            reembed::pending(connection, &mut after, limit)
        })
        .await
    }

    async fn store_reembedded(&self, vectors: Vec<Reembedded>) -> Result<()> {
        self.write(move |connection| reembed::store(connection, vectors))
            .await
    }

    async fn finish_reembedding(&self) -> Result<Reembedding> {
        let inner = Arc::clone(&self.inner);
        let (status, switched) = self.write(reembed::finish).await?;
        if switched {
            // Every index this process holds was built from the vectors just replaced.
            inner.vectors.clear();
            if let Ok(mut claimed) = inner.claimed_space.lock()
                && claimed.is_some()
            {
                *claimed = status.current.clone();
            }
        }
        Ok(status)
    }

    async fn record_usage(&self, scope: &Scope, uses: &[UseCount]) -> Result<()> {
        if uses.is_empty() {
            return Ok(());
        }
        let scope = scope.clone();
        let uses = uses.to_vec();
        self.write(move |connection| {
            let transaction = connection.transaction().map_err(storage)?;
            for table in ["facts", "playbooks"] {
                let mut statement = transaction
                    .prepare_cached(&format!(
                        "UPDATE {table} SET use_count = use_count + ?1, \
                         last_used_at = max(coalesce(last_used_at, ?2), ?2) \
                         WHERE id = ?3 AND tenant = ?4 AND user_id = ?5"
                    ))
                    .map_err(storage)?;
                for usage in &uses {
                    statement
                        .execute(params![
                            i64::try_from(usage.count).unwrap_or(i64::MAX),
                            micros(usage.last_used_at),
                            usage.id,
                            scope.tenant().as_str(),
                            scope.user().as_str()
                        ])
                        .map_err(storage)?;
                }
            }
            transaction.commit().map_err(storage)
        })
        .await
    }

    async fn list_users(&self, tenant: &TenantScope, page: &PageRequest) -> Result<Page<UserSummary>> {
        let tenant = tenant.tenant().as_str().to_owned();
        let after = page.cursor.clone().unwrap_or_default();
        let limit = page.limit;
        self.read(move |connection| {
            // Per table, the tenant's users past the cursor (each table's scope index
            // starts with tenant and user), merged by user.
            let mut statement = connection
                .prepare_cached(
                    "SELECT user_id, sum(episodes), sum(facts), sum(active), sum(playbooks), max(at) FROM ( \
                       SELECT user_id, count(*) AS episodes, 0 AS facts, 0 AS active, 0 AS playbooks, \
                              max(ingested_at) AS at FROM episodes WHERE tenant = ?1 AND user_id > ?2 GROUP BY user_id \
                       UNION ALL SELECT user_id, 0, count(*), sum(status = 'active'), 0, max(created_at) \
                              FROM facts WHERE tenant = ?1 AND user_id > ?2 GROUP BY user_id \
                       UNION ALL SELECT user_id, 0, 0, 0, count(*), max(updated_at) \
                              FROM playbooks WHERE tenant = ?1 AND user_id > ?2 GROUP BY user_id \
                     ) GROUP BY user_id ORDER BY user_id LIMIT ?3",
                )
                .map_err(storage)?;
            let limit_value = i64::try_from(limit).unwrap_or(i64::MAX);
            let mut users: Vec<UserSummary> = statement
                .query_map(params![tenant, after, limit_value], |row| {
                    Ok(UserSummary {
                        user: row.get(0)?,
                        episodes: rows::count_at(row, 1)?,
                        facts: rows::count_at(row, 2)?,
                        active_facts: rows::count_at(row, 3)?,
                        playbooks: rows::count_at(row, 4)?,
                        last_activity: rows::optional_time_at(row, 5)?,
                    })
                })
                .map_err(storage)?
                .collect::<rusqlite::Result<_>>()
                .map_err(storage)?;
            // Mutations without a record of their own (a retraction, a forgetting) show in
            // the audit trail: its latest event counts as activity too.
            let mut latest = connection
                .prepare_cached(
                    "SELECT at FROM audit_events WHERE tenant = ?1 AND user_id = ?2 ORDER BY seq DESC LIMIT 1",
                )
                .map_err(storage)?;
            for user in &mut users {
                let at: Option<i64> = latest
                    .query_row(params![tenant, user.user], |row| row.get(0))
                    .optional()
                    .map_err(storage)?;
                let at = at.and_then(DateTime::from_timestamp_micros);
                user.last_activity = user.last_activity.max(at);
            }
            let next_cursor = (users.len() == limit && limit > 0)
                .then(|| users.last().map(|user| user.user.clone()))
                .flatten();
            Ok(Page {
                items: users,
                next_cursor,
            })
        })
        .await
    }

    async fn list_decisions(
        &self,
        scope: &Scope,
        kind: Option<DecisionKind>,
        page: &PageRequest,
    ) -> Result<Page<Decision>> {
        let scope = scope.clone();
        let page = page.clone();
        let key = self.inner.cursor_key;
        self.read(move |connection| {
            let sql = format!(
                "SELECT {} FROM decisions WHERE tenant = ?1 AND user_id = ?2 AND seq < ?3 \
                 AND (?5 IS NULL OR kind = ?5) ORDER BY seq DESC LIMIT ?4",
                rows::DECISION_COLUMNS
            );
            let kind = kind.map(DecisionKind::as_str);
            page_query(connection, &key, &sql, &scope, &page, &[&kind], rows::decision)
        })
        .await
    }

    async fn list_audit(&self, scope: &Scope, page: &PageRequest) -> Result<Page<AuditEvent>> {
        let scope = scope.clone();
        let page = page.clone();
        let key = self.inner.cursor_key;
        self.read(move |connection| {
            let sql = format!(
                "SELECT {} FROM audit_events WHERE tenant = ?1 AND user_id = ?2 AND seq < ?3 \
                 ORDER BY seq DESC LIMIT ?4",
                rows::AUDIT_COLUMNS
            );
            page_query(connection, &key, &sql, &scope, &page, &[], rows::audit_event)
        })
        .await
    }

    async fn get_review(&self, scope: &Scope, review_id: &str) -> Result<Option<Review>> {
        let scope = scope.clone();
        let review_id = review_id.to_owned();
        self.read(move |connection| {
            connection
                .prepare_cached(&format!(
                    "SELECT {} FROM reviews WHERE id = ?1 AND tenant = ?2 AND user_id = ?3",
                    rows::REVIEW_COLUMNS
                ))
                .and_then(|mut statement| {
                    statement
                        .query_row(
                            params![review_id, scope.tenant().as_str(), scope.user().as_str()],
                            rows::review,
                        )
                        .optional()
                })
                .map_err(storage)
        })
        .await
    }

    async fn list_reviews(&self, scope: &Scope, page: &PageRequest) -> Result<Page<Review>> {
        let user = scope.user().as_str().to_owned();
        Ok(self
            .review_page(scope.tenant().as_str(), Some(user), page)
            .await?
            .map(|item| item.review))
    }

    async fn list_tenant_reviews(
        &self,
        tenant: &TenantScope,
        page: &PageRequest,
    ) -> Result<Page<cairn_core::UserReview>> {
        self.review_page(tenant.tenant().as_str(), None, page).await
    }

    async fn review_queues(&self, limit: usize) -> Result<Vec<cairn_core::TenantQueue>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.read(move |connection| {
            let mut statement = connection
                .prepare_cached(
                    "SELECT tenant, count(*), min(created_at) FROM reviews WHERE status = 'pending' \
                     GROUP BY tenant ORDER BY count(*) DESC, tenant LIMIT ?1",
                )
                .map_err(storage)?;
            statement
                .query_map(params![limit], |row| {
                    Ok(cairn_core::TenantQueue {
                        tenant: row.get(0)?,
                        pending: rows::count_at(row, 1)?,
                        oldest: rows::optional_time_at(row, 2)?,
                    })
                })
                .map_err(storage)?
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(storage)
        })
        .await
    }

    async fn review_summary(&self, tenant: &TenantScope) -> Result<ReviewSummary> {
        let tenant = tenant.tenant().as_str().to_owned();
        self.read(move |connection| {
            let mut statement = connection
                .prepare_cached(
                    "SELECT kind, count(*), min(created_at) FROM reviews \
                     WHERE tenant = ?1 AND status = 'pending' GROUP BY kind ORDER BY kind",
                )
                .map_err(storage)?;
            let rows = statement
                .query_map(params![tenant], |row| {
                    Ok((
                        row.get::<_, String>(0)?,
                        rows::count_at(row, 1)?,
                        rows::optional_time_at(row, 2)?,
                    ))
                })
                .map_err(storage)?
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(storage)?;
            let mut summary = ReviewSummary::default();
            for (kind, count, oldest) in rows {
                if let Some(kind) = ReviewKind::parse(&kind) {
                    summary.by_kind.push((kind, count));
                }
                summary.oldest = match (summary.oldest, oldest) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
            Ok(summary)
        })
        .await
    }

    async fn find_reviews_by_fingerprint(&self, scope: &Scope, fingerprint: &str) -> Result<Vec<Review>> {
        let scope = scope.clone();
        let fingerprint = fingerprint.to_owned();
        self.read(move |connection| {
            let mut statement = connection
                .prepare_cached(&format!(
                    "SELECT {} FROM reviews WHERE tenant = ?1 AND user_id = ?2 AND fingerprint = ?3 \
                     ORDER BY seq DESC LIMIT 100",
                    rows::REVIEW_COLUMNS
                ))
                .map_err(storage)?;
            statement
                .query_map(
                    params![scope.tenant().as_str(), scope.user().as_str(), fingerprint],
                    rows::review,
                )
                .map_err(storage)?
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(storage)
        })
        .await
    }

    async fn list_tombstones(&self, scope: &Scope) -> Result<Vec<Tombstone>> {
        let scope = scope.clone();
        self.read(move |connection| {
            let mut statement = connection
                .prepare_cached(&format!(
                    "SELECT {} FROM tombstones WHERE tenant = ?1 AND user_id = ?2 AND lifted_at IS NULL \
                     ORDER BY seq DESC",
                    rows::TOMBSTONE_COLUMNS
                ))
                .map_err(storage)?;
            statement
                .query_map(
                    params![scope.tenant().as_str(), scope.user().as_str()],
                    rows::tombstone,
                )
                .map_err(storage)?
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(storage)
        })
        .await
    }

    async fn audit_key(&self, scope: &Scope, candidate: [u8; 32]) -> Result<Vec<u8>> {
        let scope = scope.clone();
        self.write(move |connection| {
            let (tenant, user) = (scope.tenant().as_str(), scope.user().as_str());
            connection
                .execute(
                    "INSERT INTO consolidation_state (tenant, user_id, watermark, audit_key) \
                     VALUES (?1, ?2, 0, ?3) ON CONFLICT (tenant, user_id) \
                     DO UPDATE SET audit_key = coalesce(audit_key, excluded.audit_key)",
                    params![tenant, user, candidate.as_slice()],
                )
                .map_err(storage)?;
            connection
                .query_row(
                    "SELECT audit_key FROM consolidation_state WHERE tenant = ?1 AND user_id = ?2",
                    params![tenant, user],
                    |row| row.get::<_, Vec<u8>>(0),
                )
                .map_err(storage)
        })
        .await
    }

    async fn tenant_key(&self, scope: &Scope, candidate: [u8; 32]) -> Result<Vec<u8>> {
        // The tenant's row has the empty user id, which no user has (and so no
        // erasure removes).
        let tenant = scope.tenant().as_str().to_owned();
        self.write(move |connection| {
            connection
                .execute(
                    "INSERT INTO consolidation_state (tenant, user_id, watermark, audit_key) \
                     VALUES (?1, '', 0, ?2) ON CONFLICT (tenant, user_id) \
                     DO UPDATE SET audit_key = coalesce(audit_key, excluded.audit_key)",
                    params![tenant, candidate.as_slice()],
                )
                .map_err(storage)?;
            connection
                .query_row(
                    "SELECT audit_key FROM consolidation_state WHERE tenant = ?1 AND user_id = ''",
                    params![tenant],
                    |row| row.get::<_, Vec<u8>>(0),
                )
                .map_err(storage)
        })
        .await
    }

    async fn watermark(&self, scope: &Scope) -> Result<u64> {
        let scope = scope.clone();
        self.read(move |connection| {
            let value: Option<i64> = connection
                .query_row(
                    "SELECT watermark FROM consolidation_state WHERE tenant = ?1 AND user_id = ?2",
                    params![scope.tenant().as_str(), scope.user().as_str()],
                    |row| row.get(0),
                )
                .optional()
                .map_err(storage)?;
            Ok(value.map_or(0, |value| u64::try_from(value).unwrap_or(0)))
        })
        .await
    }

    async fn episodes_after(&self, scope: &Scope, position: u64, limit: usize) -> Result<Vec<LoggedEpisode>> {
        let sql = format!(
            "SELECT {} FROM episodes e WHERE e.tenant = ?1 AND e.user_id = ?2 AND e.seq > ?3 \
             ORDER BY e.seq ASC LIMIT ?4",
            rows::EPISODE_COLUMNS
        );
        let mut episodes = self.episode_log(scope, sql, position, limit).await?;
        episodes.sort_by_key(|logged| logged.position);
        Ok(episodes)
    }

    async fn episodes_up_to(&self, scope: &Scope, position: u64, limit: usize) -> Result<Vec<LoggedEpisode>> {
        let sql = format!(
            "SELECT {} FROM episodes e WHERE e.tenant = ?1 AND e.user_id = ?2 AND e.seq <= ?3 \
             ORDER BY e.seq DESC LIMIT ?4",
            rows::EPISODE_COLUMNS
        );
        let mut episodes = self.episode_log(scope, sql, position, limit).await?;
        episodes.sort_by_key(|logged| logged.position);
        Ok(episodes)
    }

    async fn pending_jobs(&self, scope: &Scope) -> Result<Vec<ConsolidationJob>> {
        let scope = scope.clone();
        self.read(move |connection| {
            let mut statement = connection
                .prepare_cached(&format!(
                    "SELECT {} FROM jobs WHERE tenant = ?1 AND user_id = ?2 ORDER BY seq ASC",
                    rows::JOB_COLUMNS
                ))
                .map_err(storage)?;
            statement
                .query_map(params![scope.tenant().as_str(), scope.user().as_str()], rows::job)
                .map_err(storage)?
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(storage)
        })
        .await
    }

    async fn count_pending_jobs(&self, scope: &Scope, up_to: usize) -> Result<usize> {
        let scope = scope.clone();
        let up_to = i64::try_from(up_to).unwrap_or(i64::MAX);
        self.read(move |connection| {
            connection
                .prepare_cached(
                    "SELECT COUNT(*) FROM (SELECT 1 FROM jobs WHERE tenant = ?1 AND user_id = ?2 LIMIT ?3)",
                )
                .map_err(storage)?
                .query_row(
                    params![scope.tenant().as_str(), scope.user().as_str(), up_to],
                    |row| row.get::<_, i64>(0),
                )
                .map(|count| usize::try_from(count).unwrap_or(0))
                .map_err(storage)
        })
        .await
    }

    async fn claim_job(
        &self,
        now: DateTime<Utc>,
        lease_until: DateTime<Utc>,
        after_tenant: Option<&str>,
    ) -> Result<Option<(Scope, ConsolidationJob)>> {
        let after_tenant = after_tenant.map(str::to_owned);
        self.write(move |connection| {
            let transaction = connection.transaction().map_err(storage)?;
            // The next tenant in name order with a due job, wrapping around.
            let next_due = |after: Option<&str>| {
                transaction
                    .query_row(
                        "SELECT seq, tenant, user_id FROM jobs \
                         WHERE run_after <= ?1 AND (leased_until IS NULL OR leased_until <= ?1) \
                         AND dead_at IS NULL AND tenant > ?2 \
                         ORDER BY tenant, run_after, seq LIMIT 1",
                        params![micros(now), after.unwrap_or("")],
                        |row| {
                            let seq: i64 = row.get(0)?;
                            let tenant: String = row.get(1)?;
                            let user: String = row.get(2)?;
                            Ok((seq, tenant, user))
                        },
                    )
                    .optional()
                    .map_err(storage)
            };
            let claimed = match next_due(after_tenant.as_deref())? {
                Some(found) => Some(found),
                None if after_tenant.is_some() => next_due(None)?,
                None => None,
            };
            let Some((seq, tenant, user)) = claimed else {
                return Ok(None);
            };
            transaction
                .execute(
                    "UPDATE jobs SET leased_until = ?1, attempts = attempts + 1 WHERE seq = ?2",
                    params![micros(lease_until), seq],
                )
                .map_err(storage)?;
            let job = transaction
                .query_row(
                    &format!("SELECT {} FROM jobs WHERE seq = ?1", rows::JOB_COLUMNS),
                    params![seq],
                    rows::job,
                )
                .map_err(storage)?;
            transaction.commit().map_err(storage)?;
            // The job was written under an authenticated scope; a row that no longer
            // parses as one is reported, never guessed at.
            let tenant = TenantId::parse(&tenant)?;
            let user = UserId::parse(&user)?;
            #[allow(clippy::disallowed_methods)]
            let scope = Scope::of_stored_record(tenant, user, job.subject.clone());
            Ok(Some((scope, job)))
        })
        .await
    }

    async fn release_job(
        &self,
        scope: &Scope,
        job_id: &str,
        run_after: DateTime<Utc>,
        error: &str,
        dead: bool,
    ) -> Result<()> {
        let scope = scope.clone();
        let job_id = job_id.to_owned();
        let error = error.to_owned();
        self.write(move |connection| {
            let dead_at = dead.then(|| micros(Utc::now()));
            connection
                .execute(
                    "UPDATE jobs SET leased_until = NULL, run_after = ?1, \
                     last_error = ?2, dead_at = ?3 WHERE id = ?4 AND tenant = ?5 AND user_id = ?6",
                    params![
                        micros(run_after),
                        error,
                        dead_at,
                        job_id,
                        scope.tenant().as_str(),
                        scope.user().as_str()
                    ],
                )
                .map_err(storage)?;
            Ok(())
        })
        .await
    }

    async fn renew_job(&self, scope: &Scope, job_id: &str, until: DateTime<Utc>) -> Result<bool> {
        let (scope, job_id) = (scope.clone(), job_id.to_owned());
        self.write(move |connection| {
            connection
                .execute(
                    "UPDATE jobs SET leased_until = ?1 WHERE id = ?2 AND tenant = ?3 AND user_id = ?4 \
                     AND leased_until IS NOT NULL",
                    params![
                        micros(until),
                        job_id,
                        scope.tenant().as_str(),
                        scope.user().as_str()
                    ],
                )
                .map(|changed| changed == 1)
                .map_err(storage)
        })
        .await
    }

    async fn defer_job(&self, scope: &Scope, job_id: &str, run_after: DateTime<Utc>) -> Result<()> {
        let (scope, job_id) = (scope.clone(), job_id.to_owned());
        self.write(move |connection| {
            connection
                .execute(
                    "UPDATE jobs SET leased_until = NULL, run_after = ?1, \
                     attempts = max(attempts - 1, 0) WHERE id = ?2 AND tenant = ?3 AND user_id = ?4",
                    params![
                        micros(run_after),
                        job_id,
                        scope.tenant().as_str(),
                        scope.user().as_str()
                    ],
                )
                .map(|_| ())
                .map_err(storage)
        })
        .await
    }

    async fn lease_scope_runs(
        &self,
        scope: &Scope,
        holder: &str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Result<bool> {
        let (scope, holder) = (scope.clone(), holder.to_owned());
        self.write(move |connection| {
            let (tenant, user) = (scope.tenant().as_str(), scope.user().as_str());
            let taken = connection
                .execute(
                    "INSERT INTO consolidation_state (tenant, user_id, watermark, runs_holder, runs_until) \
                     VALUES (?1, ?2, 0, ?3, ?4) ON CONFLICT (tenant, user_id) DO UPDATE SET \
                     runs_holder = excluded.runs_holder, runs_until = excluded.runs_until \
                     WHERE runs_holder IS NULL OR runs_holder = excluded.runs_holder OR runs_until <= ?5",
                    params![tenant, user, holder, micros(until), micros(now)],
                )
                .map_err(storage)?;
            Ok(taken == 1)
        })
        .await
    }

    async fn release_scope_runs(&self, scope: &Scope, holder: &str) -> Result<()> {
        let (scope, holder) = (scope.clone(), holder.to_owned());
        self.write(move |connection| {
            connection
                .execute(
                    "UPDATE consolidation_state SET runs_holder = NULL, runs_until = NULL \
                     WHERE tenant = ?1 AND user_id = ?2 AND runs_holder = ?3",
                    params![scope.tenant().as_str(), scope.user().as_str(), holder],
                )
                .map(|_| ())
                .map_err(storage)
        })
        .await
    }

    async fn use_once(&self, key: &str, now: DateTime<Utc>, until: DateTime<Utc>) -> Result<bool> {
        let key = key.to_owned();
        self.write(move |connection| {
            let transaction = connection.transaction().map_err(storage)?;
            transaction
                .execute("DELETE FROM used_once WHERE until < ?1", params![micros(now)])
                .map_err(storage)?;
            let first = transaction
                .execute(
                    "INSERT INTO used_once (key, until) VALUES (?1, ?2) ON CONFLICT (key) DO NOTHING",
                    params![key, micros(until)],
                )
                .map_err(storage)?;
            transaction.commit().map_err(storage)?;
            Ok(first == 1)
        })
        .await
    }

    async fn claim_import(
        &self,
        scope: &Scope,
        claim: &str,
        now: DateTime<Utc>,
        stale_before: DateTime<Utc>,
    ) -> Result<()> {
        let (scope, claim) = (scope.clone(), claim.to_owned());
        self.write(move |connection| {
            let transaction = connection.transaction().map_err(storage)?;
            let (tenant, user) = (scope.tenant().as_str(), scope.user().as_str());
            let held: Option<(Option<String>, Option<i64>)> = transaction
                .query_row(
                    "SELECT import_claim, import_claimed_at FROM consolidation_state \
                     WHERE tenant = ?1 AND user_id = ?2",
                    params![tenant, user],
                    |row| Ok((row.get(0)?, row.get(1)?)),
                )
                .optional()
                .map_err(storage)?;
            if let Some((Some(other), Some(at))) = held
                && other != claim
                && at >= rows::micros(stale_before)
            {
                return Err(Error::import_under_way());
            }
            transaction
                .execute(
                    "INSERT INTO consolidation_state (tenant, user_id, watermark, import_claim, import_claimed_at) \
                     VALUES (?1, ?2, 0, ?3, ?4) ON CONFLICT (tenant, user_id) DO UPDATE SET \
                     import_claim = excluded.import_claim, import_claimed_at = excluded.import_claimed_at",
                    params![tenant, user, claim, rows::micros(now)],
                )
                .map_err(storage)?;
            transaction.commit().map_err(storage)
        })
        .await
    }

    async fn release_import(&self, scope: &Scope, claim: &str) -> Result<()> {
        let (scope, claim) = (scope.clone(), claim.to_owned());
        self.write(move |connection| {
            connection
                .execute(
                    "UPDATE consolidation_state SET import_claim = NULL, import_claimed_at = NULL \
                     WHERE tenant = ?1 AND user_id = ?2 AND import_claim = ?3",
                    params![scope.tenant().as_str(), scope.user().as_str(), claim],
                )
                .map(|_| ())
                .map_err(storage)
        })
        .await
    }

    async fn generation(&self, scope: &Scope) -> Result<u64> {
        let scope = scope.clone();
        self.read(move |connection| commit::generation_of(connection, &scope))
            .await
    }

    async fn erase_scope(&self, scope: &Scope, audit: AuditEvent) -> Result<ErasureReceipt> {
        let scope = scope.clone();
        let inner = Arc::clone(&self.inner);
        self.write(move |connection| {
            let transaction = connection.transaction().map_err(storage)?;
            let tenant = scope.tenant().as_str();
            let user = scope.user().as_str();
            let erase = |sql: &str| -> Result<u64> {
                transaction
                    .execute(sql, params![tenant, user])
                    .map(|count| count as u64)
                    .map_err(storage)
            };
            for table in ["episodes", "facts", "playbooks"] {
                erase(&format!(
                    "DELETE FROM {table}_fts WHERE rowid IN \
                     (SELECT seq FROM {table} WHERE tenant = ?1 AND user_id = ?2)"
                ))?;
            }
            let receipt = ErasureReceipt {
                episodes: erase("DELETE FROM episodes WHERE tenant = ?1 AND user_id = ?2")?,
                facts: erase("DELETE FROM facts WHERE tenant = ?1 AND user_id = ?2")?,
                playbooks: erase("DELETE FROM playbooks WHERE tenant = ?1 AND user_id = ?2")?,
                playbook_versions: erase("DELETE FROM playbook_versions WHERE tenant = ?1 AND user_id = ?2")?,
                edges: erase("DELETE FROM edges WHERE tenant = ?1 AND user_id = ?2")?,
                tombstones: erase("DELETE FROM tombstones WHERE tenant = ?1 AND user_id = ?2")?,
                decisions: erase("DELETE FROM decisions WHERE tenant = ?1 AND user_id = ?2")?,
                jobs: erase("DELETE FROM jobs WHERE tenant = ?1 AND user_id = ?2")?,
                reviews: erase("DELETE FROM reviews WHERE tenant = ?1 AND user_id = ?2")?,
            };
            // The scope's state starts over (watermark, and the audit key destroyed) but
            // keeps its generation, advanced: a commit that read the scope before this
            // erasure and requires its generation fails (`scope_erased`).
            erase(
                "INSERT INTO consolidation_state (tenant, user_id, watermark, generation) \
                 VALUES (?1, ?2, 0, 1) ON CONFLICT (tenant, user_id) DO UPDATE SET \
                 watermark = 0, audit_key = NULL, generation = generation + 1, \
                 import_claim = NULL, import_claimed_at = NULL",
            )?;
            commit::insert_audit(&transaction, &scope, &audit).map_err(storage)?;
            transaction.commit().map_err(storage)?;
            for tier in Tier::ALL {
                inner.vectors.invalidate(tier, &scope);
            }
            // The erased pages' earlier images live on in the write-ahead log until it is
            // checkpointed: copy it into the database (whose freed pages secure_delete
            // zeroed) and truncate it now. A reader in the middle of a query can keep
            // the log from being truncated; then the next checkpoint finishes the work.
            if let Err(error) = connection.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())) {
                tracing::warn!(error = %error, "checkpoint after erasure failed");
            }
            Ok(receipt)
        })
        .await
    }
}
