//! How a change set reaches the cluster whole or not at all: the commit journal.
//!
//! A cluster has no multi-document transactions. A commit first reads and checks every
//! precondition (scope, status, version, watermark, tombstones, evidence) and plans
//! its writes. It then records the whole plan as one journal document in
//! `<prefix>-commits`, in phase `prepared`: each conditional update with the document
//! as read and as it will be, the bulk inserts, and the deletions that follow. Then:
//!
//! 1. the conditional updates, each a compare-and-set on `if_seq_no`. A conflict puts
//!    back the updates already made, drops the journal and answers 409: nothing changed;
//! 2. the journal moves to `committed` by compare-and-set. This is the commit point;
//! 3. the inserts (`op_type=create`, so a replay doubles nothing), the episode
//!    contexts and the deletions, all idempotent;
//! 4. the journal is deleted.
//!
//! A plan without conditional updates (an ingest) is journaled as `committed` at once:
//! it has nothing to put back, so its journal is its commit point. When it needs no
//! read to write (no deletions, no context to read afresh), the journal is the first
//! line of the one bulk that writes everything else: a node applies a bulk it has
//! received whole, so the journal stands whenever any of it does, unless its own line
//! failed; any failure of that bulk makes the commit again the long way, journal first,
//! every step of which is idempotent. An ingest's journal
//! is not deleted before the ingest answers: it is retired, and its deletion rides in
//! the next bulk write, or in one batch a moment later (`RETIRE_AFTER`), or in this
//! process's next recovery pass, whichever comes first. Until then a recovery elsewhere
//! could only replay creates that are already there (episodes are never deleted one by
//! one; erasure deletes a scope's journals first).
//!
//! A process that fails anywhere in between leaves its journal behind, and recovery
//! (`MemoryStore::recover_commits`, run by every server in the background for
//! journals older than a patience) finishes it: a `committed` journal is rolled
//! forward, a `prepared` one rolled back (each updated document that still holds what
//! the commit wrote gets its old content back). Recovery claims a `prepared` journal
//! by moving it to `aborted` with a compare-and-set, so a commit that was only slow
//! can no longer reach its commit point, and puts back its own updates.

use crate::client::failure;
use crate::{ClusterStore, PAGE, Update, Versioned, docs, query, records, state_id};
use cairn_core::{Change, ChangeSet, Error, Result, Scope, TenantId, UserId};
use chrono::Utc;
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const PREPARED: &str = "prepared";
const COMMITTED: &str = "committed";
const ABORTED: &str = "aborted";

/// Attempts of a commit that lost a race on a counter (a playbook outcome), which
/// commutes and is simply made again.
const COUNTER_ATTEMPTS: usize = 20;

/// Journals one recovery pass resolves at most.
const RECOVERY_BATCH: usize = 100;

/// How long a retired journal waits for a bulk write to carry its deletion before it is
/// deleted on its own (far below the patience of any recovery).
const RETIRE_AFTER: Duration = Duration::from_millis(200);

/// Journals of finished ingests whose deletion is still to be sent: (tenant, id).
#[derive(Default)]
pub(crate) struct Retired {
    journals: Mutex<Vec<(String, String)>>,
    /// Whether a deletion of the retired journals is already scheduled.
    scheduled: AtomicBool,
}

impl Retired {
    fn take(&self) -> Vec<(String, String)> {
        self.journals
            .lock()
            .map(|mut journals| std::mem::take(&mut *journals))
            .unwrap_or_default()
    }
}

/// Ingests readied before their commit, by scope and first episode id: the positions
/// reserved for their episodes and, per session, the episode it ended with before (as
/// read, for its context). Bounded: an ingest that never commits (its embedding
/// failed) is forgotten with the oldest.
#[derive(Default)]
pub(crate) struct Prepared {
    ingests: Mutex<Vec<(String, ReadiedIngest)>>,
}

/// What [`Prepared`] holds for one ingest.
struct ReadiedIngest {
    first: u64,
    /// The scope's generation the positions were reserved under.
    generation: u64,
    /// [`ClusterStore::last_episode`] of each session of the ingest.
    ended_with: HashMap<String, Option<(IdText, Option<Versioned>)>>,
}

/// Readied ingests kept at most.
const PREPARED_INGESTS: usize = 256;

fn readied_key(scope: &Scope, episodes: &[cairn_core::Episode]) -> Option<String> {
    let first = episodes.first()?;
    Some(format!(
        "{}/{}/{}/{}",
        scope.tenant().as_str(),
        scope.user().as_str(),
        first.id,
        episodes.len()
    ))
}

impl Prepared {
    fn put(&self, key: String, ingest: ReadiedIngest) {
        if let Ok(mut ingests) = self.ingests.lock() {
            if ingests.len() >= PREPARED_INGESTS {
                ingests.remove(0);
            }
            ingests.push((key, ingest));
        }
    }

    fn take(&self, key: &str) -> Option<ReadiedIngest> {
        let mut ingests = self.ingests.lock().ok()?;
        let at = ingests.iter().position(|(held, _)| held == key)?;
        Some(ingests.remove(at).1)
    }
}

/// The episode each recent session ended with, as this process wrote it, at the
/// version its write answered: the session's next ingest appends to its context
/// without reading it back. An entry serves once, and only while the scope's state
/// still names that episode as the session's last. A document changed or deleted since
/// fails the versioned context write (a 409, tolerated: the context is ranking help
/// only), so an entry that went stale never writes over a change or brings back an
/// erased episode. Bounded: a process serving many sessions starts over now and then.
#[derive(Default)]
pub(crate) struct Tails {
    ended: Mutex<HashMap<(String, String), (String, Versioned)>>,
}

/// Sessions [`Tails`] remembers at most.
const TAILS: usize = 4096;

impl Tails {
    /// The episode `id` as written, when it is the one remembered for the session.
    fn take(&self, scope: &Scope, session: &str, id: &str) -> Option<Versioned> {
        let mut ended = self.ended.lock().ok()?;
        let (kept, written) = ended.remove(&(state_id(scope), session.to_owned()))?;
        (kept == id).then_some(written)
    }

    fn put(&self, scope: &Scope, session: String, id: String, written: Versioned) {
        if let Ok(mut ended) = self.ended.lock() {
            if ended.len() >= TAILS {
                ended.clear();
            }
            ended.insert((state_id(scope), session), (id, written));
        }
    }

    /// Forgets every session of the scope (an erasure).
    pub(crate) fn forget(&self, scope: &Scope) {
        let erased = state_id(scope);
        if let Ok(mut ended) = self.ended.lock() {
            ended.retain(|(owner, _), _| *owner != erased);
        }
    }

    /// Remembers the session ends of an ingest whose bulk `answer` created them.
    fn written(&self, scope: &Scope, ends: Vec<SessionEnd>, answer: &Value) {
        for end in ends {
            let created = answer["items"].as_array().into_iter().flatten().find_map(|item| {
                let create = &item["create"];
                (create["_id"].as_str() == Some(end.id.as_str()) && create["status"].as_u64() == Some(201))
                    .then(|| records::written_version(create).ok())
                    .flatten()
            });
            if let Some((seq_no, primary_term)) = created {
                let written = Versioned {
                    source: end.document,
                    seq_no,
                    primary_term,
                };
                self.put(scope, end.session, end.id, written);
            }
        }
    }
}

/// The last episode of a session in an ingest, as its create line holds it.
struct SessionEnd {
    session: String,
    id: String,
    document: Value,
}

/// Everything a commit writes after its checks.
struct Plan {
    updates: Vec<Update>,
    /// Bulk `create` lines: action and source pairs.
    lines: Vec<Value>,
    /// Stored episodes (by id) that get the text of the episode after them as context.
    contexts: Vec<(String, String)>,
    /// The same context changes as versioned bulk lines, for the stored episodes that
    /// planning read by id: the commit writes them with its inserts (a conflict leaves
    /// the context as it is; it is ranking help only). Not journaled: recovery applies
    /// `contexts` from a fresh read.
    context_lines: Vec<Value>,
    /// The episodes the sessions of an ingest end with (see [`Tails`]).
    ends: Vec<SessionEnd>,
    /// Deletions after the inserts: `{"erase_fact": id}` or `{"complete_jobs": [ids]}`.
    deferred: Vec<Value>,
    /// The scope's generation the commit is made under (see `erasure`).
    generation: u64,
    /// Whether the inserts are searchable when the commit answers (`refresh=true`). An
    /// ingest is not refreshed: its episodes are read by id at once and searched within
    /// the refresh interval; consolidation and erasure refresh what they search.
    refresh: bool,
}

impl Plan {
    fn is_empty(&self) -> bool {
        self.updates.is_empty()
            && self.lines.is_empty()
            && self.contexts.is_empty()
            && self.deferred.is_empty()
    }

    /// Whether every context change is one of the prepared versioned lines, so that
    /// writing the plan needs no read.
    fn contexts_prepared(&self) -> bool {
        let prepared = prepared_ids(&self.context_lines);
        self.contexts.iter().all(|(id, _)| prepared.contains(id.as_str()))
    }

    /// The plan as the journal holds it.
    fn to_json(&self) -> Value {
        let updates: Vec<Value> = self
            .updates
            .iter()
            .map(|update| {
                json!({ "index": update.index, "id": update.id,
                        "before": update.before.as_ref().map(|before| &before.source), "after": update.after })
            })
            .collect();
        let contexts: Vec<Value> = self
            .contexts
            .iter()
            .map(|(id, next)| json!({ "id": id, "next": next }))
            .collect();
        json!({ "updates": updates, "lines": self.lines, "contexts": contexts, "deferred": self.deferred,
                "refresh": self.refresh, "generation": self.generation })
    }
}

/// How the conditional updates of a plan went.
enum Applied {
    Done,
    /// A document changed since it was read; every update made was put back.
    Conflict {
        error: Error,
        commutative: bool,
    },
}

impl ClusterStore {
    /// Commits a change set through the journal (see the module documentation).
    pub(crate) async fn commit_change_set(&self, scope: &Scope, change_set: &ChangeSet) -> Result<()> {
        // Checked and written under claims on the values it checks or writes (see
        // `values`), so no other commit's check of them falls in between.
        let claims = self.claim_values(scope, &change_set.changes).await?;
        let committed = self.commit_claimed(scope, change_set).await;
        self.release_values(scope, claims).await;
        committed
    }

    async fn commit_claimed(&self, scope: &Scope, change_set: &ChangeSet) -> Result<()> {
        for _ in 0..COUNTER_ATTEMPTS {
            let (updates, generation) = self.check(scope, &change_set.changes).await?;
            let plan = self.plan(scope, change_set, updates, generation).await?;
            match self.write_plan(scope, plan).await? {
                Applied::Done => return Ok(()),
                Applied::Conflict {
                    commutative: true, ..
                } => continue,
                Applied::Conflict { error, .. } => return Err(error),
            }
        }
        Err(Error::Unavailable("playbook outcome: too much contention".into()))
    }

    /// Finishes every commit whose journal is older than `older_than`: rolls committed
    /// ones forward and the others back. Returns how many it resolved.
    pub(crate) async fn recover_journals(&self, older_than: Duration) -> Result<u64> {
        // This process's own finished journals are deleted, not rolled forward; journals
        // are written without a refresh, so the recent ones are made searchable.
        self.delete_retired().await?;
        self.refresh_indices(&["commits"]).await?;
        let cutoff = docs::micros(Utc::now()) - i64::try_from(older_than.as_micros()).unwrap_or(i64::MAX);
        let body = json!({
            "query": { "range": { "at": { "lte": cutoff } } },
            "sort": [{ "at": "asc" }, { "id": "asc" }],
            "size": RECOVERY_BATCH,
            "_source": ["tenant", "id"],
        });
        let mut resolved = 0;
        for hit in records::hits(&self.search("commits", None, body).await?)? {
            let journal: JournalHead = hit.read()?;
            if self.resolve_journal(&journal.tenant, &journal.id).await? {
                resolved += 1;
            }
        }
        Ok(resolved)
    }

    /// Rolls one left-behind journal forward or back; `false` when there was nothing
    /// to do (already resolved, or its commit is still moving).
    async fn resolve_journal(&self, tenant: &str, id: &str) -> Result<bool> {
        let Some(journal) = self.get("commits", id, tenant).await? else {
            return Ok(false);
        };
        let version = Some((journal.seq_no, journal.primary_term));
        let plan = &journal.source["plan"];
        match journal.source["phase"].as_str() {
            Some(COMMITTED) => {
                // A commit of a generation since erased is taken back, not finished.
                let scope = journal_scope(&journal.source)?;
                let generation = plan["generation"].as_u64().unwrap_or(0);
                if self.still_current(&scope, generation).await? {
                    self.roll_forward(&scope, plan, Vec::new()).await?;
                }
                if !self.still_current(&scope, generation).await? {
                    self.take_back(&scope, plan, id).await?;
                }
            }
            Some(crate::erasure::FENCED) => {
                let scope = journal_scope(&journal.source)?;
                self.take_back(&scope, plan, id).await?;
            }
            Some(PREPARED) => {
                let mut aborted = journal.source.clone();
                aborted["phase"] = json!(ABORTED);
                let claimed = self.put("commits", id, tenant, aborted, version, false).await?;
                if claimed.status == 409 {
                    return Ok(false);
                }
                self.roll_back(tenant, &journal.source["plan"]["updates"]).await?;
            }
            // Aborted by a recovery that stopped midway.
            _ => self.roll_back(tenant, &journal.source["plan"]["updates"]).await?,
        }
        self.delete_doc("commits", id, tenant, None, false).await?;
        Ok(true)
    }

    /// Journals the plan, makes its conditional updates, passes the commit point and
    /// writes the rest.
    async fn write_plan(&self, scope: &Scope, mut plan: Plan) -> Result<Applied> {
        if plan.is_empty() {
            return Ok(Applied::Done);
        }
        let tenant = scope.tenant().as_str();
        let id = cairn_core::new_id("commit");
        let recorded = plan.to_json();
        // A plan without conditional updates (an ingest, an insert) has nothing to put
        // back: its journal is written committed, and recovery can only finish it.
        let inserts_only = plan.updates.is_empty();
        let phase = if inserts_only { COMMITTED } else { PREPARED };
        let mut journal = json!({
            "tenant": tenant, "user": scope.user().as_str(), "subject": scope.subject(), "id": id,
            "phase": phase, "at": docs::micros(Utc::now()), "plan": recorded,
        });
        if inserts_only && plan.deferred.is_empty() && plan.contexts_prepared() {
            // One bulk, its journal first (see the module documentation). The journal
            // holds the inserts too, and the long way below reads them from there.
            let mut lines = vec![
                json!({ "create": { "_index": self.index("commits"), "_id": id, "routing": tenant } }),
                journal.clone(),
            ];
            lines.extend(self.committed_lines(plan.context_lines.clone(), std::mem::take(&mut plan.lines)));
            match self.bulk_with(lines, &[409], plan.refresh).await {
                Ok(answer) => {
                    if !self.still_current(scope, plan.generation).await? {
                        self.take_back(scope, &journal["plan"], &id).await?;
                        return Err(Error::scope_erased());
                    }
                    self.tails.written(scope, std::mem::take(&mut plan.ends), &answer);
                    self.end_journal(tenant, id, !plan.refresh).await?;
                    return Ok(Applied::Done);
                }
                Err(error) => {
                    tracing::debug!(error = %error, "an insert's bulk failed; journaling it first");
                }
            }
        }
        let Some(version) = self.write_journal(tenant, &id, &journal, None).await? else {
            return Err(Error::Storage(format!(
                "commits: a journal {id} already exists that this commit did not write"
            )));
        };
        if !inserts_only {
            if let conflict @ Applied::Conflict { .. } = self.apply_updates(tenant, &plan.updates).await? {
                self.delete_doc("commits", &id, tenant, None, false).await?;
                return Ok(conflict);
            }
            journal["phase"] = json!(COMMITTED);
            if self
                .write_journal(tenant, &id, &journal, Some(version))
                .await?
                .is_none()
            {
                // Recovery took this commit for abandoned, or the scope's erasure fenced
                // it, and rolls it back; so do we.
                self.roll_back(tenant, &journal["plan"]["updates"]).await?;
                if !self.still_current(scope, plan.generation).await? {
                    return Err(Error::scope_erased());
                }
                return Err(Error::Unavailable(
                    "the commit took too long and was rolled back; nothing was changed".into(),
                ));
            }
        }
        self.roll_forward(scope, &journal["plan"], plan.context_lines)
            .await?;
        if !self.still_current(scope, plan.generation).await? {
            self.take_back(scope, &journal["plan"], &id).await?;
            return Err(Error::scope_erased());
        }
        self.end_journal(tenant, id, inserts_only && !plan.refresh)
            .await?;
        Ok(Applied::Done)
    }

    /// Ends the journal of a written commit: retired (an ingest's), or deleted before
    /// the commit answers.
    async fn end_journal(&self, tenant: &str, id: String, retire: bool) -> Result<()> {
        if retire {
            self.retire(tenant, id);
        } else {
            self.delete_doc("commits", &id, tenant, None, false).await?;
        }
        Ok(())
    }

    /// Writes a journal: created when `version` is `None`, else replaced at that
    /// version. Answers the version written, or `None` when another writer changed it.
    ///
    /// When a primary shard is lost mid-write, the cluster repeats the write on the
    /// promoted copy, which may already hold it, and answers 409 for a write that
    /// landed. A conflict is therefore checked against the stored journal: the same
    /// phase and time are this write (journal ids are fresh, and only recovery writes
    /// another phase), and it stands.
    async fn write_journal(
        &self,
        tenant: &str,
        id: &str,
        journal: &Value,
        version: Option<(i64, i64)>,
    ) -> Result<Option<(i64, i64)>> {
        let answer = self
            .put("commits", id, tenant, journal.clone(), version, false)
            .await?;
        if answer.ok() {
            return records::written_version(&answer.body).map(Some);
        }
        if answer.status != 409 {
            return Err(failure("commits", &answer));
        }
        let stored = self.get("commits", id, tenant).await?;
        Ok(stored
            .filter(|stored| {
                stored.source["phase"] == journal["phase"] && stored.source["at"] == journal["at"]
            })
            .map(|stored| (stored.seq_no, stored.primary_term)))
    }

    /// Leaves a finished ingest's journal to be deleted with the next bulk write, or in
    /// a batch shortly after.
    fn retire(&self, tenant: &str, id: String) {
        let pushed = self
            .retired
            .journals
            .lock()
            .map(|mut journals| journals.push((tenant.to_owned(), id)))
            .is_ok();
        if pushed && !self.retired.scheduled.swap(true, Ordering::AcqRel) {
            let store = self.clone();
            tokio::spawn(async move {
                tokio::time::sleep(RETIRE_AFTER).await;
                if let Err(error) = store.delete_retired().await {
                    tracing::warn!(error = %error, "deleting finished journals failed; recovery will");
                }
            });
        }
    }

    /// Deletes every retired journal now.
    pub(crate) async fn delete_retired(&self) -> Result<()> {
        self.retired.scheduled.store(false, Ordering::Release);
        let lines = self.retired_deletions();
        self.bulk_with(lines, &[404], false).await.map(|_| ())
    }

    /// Bulk lines that delete the retired journals (taken: they are sent once).
    fn retired_deletions(&self) -> Vec<Value> {
        let index = self.index("commits");
        self.retired
            .take()
            .into_iter()
            .map(|(tenant, id)| json!({ "delete": { "_index": index, "_id": id, "routing": tenant } }))
            .collect()
    }

    /// Writes a committed plan's inserts, contexts and deletions; every step is
    /// idempotent, so a recovery may repeat what the commit already did.
    /// `context_lines` are contexts already made into versioned writes (see [`Plan`]);
    /// recovery has none and reads each stored episode afresh.
    async fn roll_forward(&self, scope: &Scope, plan: &Value, context_lines: Vec<Value>) -> Result<()> {
        let tenant = scope.tenant().as_str();
        let prepared = prepared_ids(&context_lines);
        // Contexts first, unrefreshed: they show with the inserts below.
        for context in plan["contexts"].as_array().into_iter().flatten() {
            let context: ContextStep = records::parse("commit journal context", context)?;
            if !prepared.contains(context.id.as_str()) {
                self.append_context(tenant, &context.id, &context.next).await?;
            }
        }
        let lines = self.committed_lines(
            context_lines,
            plan["lines"].as_array().cloned().unwrap_or_default(),
        );
        let refresh = plan["refresh"].as_bool().unwrap_or(true);
        self.bulk_with(lines, &[409], refresh).await?;
        for step in plan["deferred"].as_array().into_iter().flatten() {
            if let Some(fact_id) = step["erase_fact"].as_str() {
                self.erase_fact(scope, fact_id).await?;
            } else if let Some(job_ids) = step["complete_jobs"].as_array() {
                let finished = vec![json!({ "terms": { "id": job_ids } })];
                self.erase_where(scope, "jobs", finished).await?;
            } else {
                return Err(Error::Storage(format!("commit journal: unknown step {step}")));
            }
        }
        Ok(())
    }

    /// The bulk of a committed plan: the prepared contexts, the inserts, and the
    /// deletions of retired journals that ride with it.
    fn committed_lines(&self, context_lines: Vec<Value>, inserts: Vec<Value>) -> Vec<Value> {
        let mut lines = context_lines;
        lines.extend(inserts);
        lines.extend(self.retired_deletions());
        lines
    }

    /// Puts back the journaled updates whose documents still hold what the commit
    /// wrote; a document changed since is left as it is.
    async fn roll_back(&self, tenant: &str, updates: &Value) -> Result<()> {
        for update in updates.as_array().into_iter().flatten().rev() {
            let UpdateStep { index: kind, id } = records::parse("commit journal update", update)?;
            let Some(current) = self.get(&kind, &id, tenant).await? else {
                continue;
            };
            if without_usage(&current.source) != without_usage(&update["after"]) {
                continue;
            }
            let version = Some((current.seq_no, current.primary_term));
            if update["before"].is_null() {
                self.delete_doc(&kind, &id, tenant, version, true).await?;
            } else {
                // Uses counted since the commit stay counted.
                let mut before = update["before"].clone();
                for field in USAGE_FIELDS {
                    if !current.source[field].is_null() {
                        before[field] = current.source[field].clone();
                    }
                }
                let answer = self.put(&kind, &id, tenant, before, version, true).await?;
                if !answer.ok() && answer.status != 409 {
                    return Err(failure(&kind, &answer));
                }
            }
        }
        Ok(())
    }

    /// Deletes a fact and what links to it.
    async fn erase_fact(&self, scope: &Scope, fact_id: &str) -> Result<()> {
        let tenant = scope.tenant().as_str();
        self.delete("facts", fact_id, tenant).await?;
        self.delete_doc("usage", fact_id, tenant, None, false).await?;
        let linked = vec![json!({ "term": { "superseded_by": fact_id } })];
        let mut body = query::scoped(scope, linked, Some(json!([{ "id": "asc" }])), PAGE);
        body["seq_no_primary_term"] = json!(true);
        for hit in self.scoped_all(scope, "facts", body).await? {
            // Read again on a conflict: recall counts uses on facts outside commits.
            self.change_owned(scope, "facts", &hit.id, |source| {
                let Value::Object(map) = source else {
                    return false;
                };
                map.get("superseded_by").and_then(Value::as_str) == Some(fact_id)
                    && map.remove("superseded_by").is_some()
            })
            .await?;
        }
        let touching = json!({ "bool": { "should": [
            { "term": { "from_fact_id": fact_id } }, { "term": { "to_fact_id": fact_id } }
        ], "minimum_should_match": 1 } });
        self.erase_where(scope, "edges", vec![touching]).await?;
        // Its reviews go with it: a held one could be neither approved nor rejected any
        // more, and their reasons speak of its value.
        self.erase_where(scope, "reviews", vec![json!({ "term": { "fact_id": fact_id } })])
            .await?;
        Ok(())
    }

    /// Plans the writes of a checked change set: reserves episode positions and reads
    /// the session neighbours that give episodes their context.
    async fn plan(
        &self,
        scope: &Scope,
        change_set: &ChangeSet,
        updates: Vec<Update>,
        mut generation: Option<u64>,
    ) -> Result<Plan> {
        let tenant = scope.tenant().as_str();
        let mut lines = Vec::new();
        let mut create = |kind: &str, id: &str, body: Value| {
            lines.push(json!({ "create": { "_index": self.index(kind), "_id": id, "routing": tenant } }));
            lines.push(body);
        };
        let mut deferred = Vec::new();
        // Stored episodes that get the first new episode of their session as context,
        // once the new ones are written.
        let mut contexts = Vec::new();
        let mut context_lines = Vec::new();
        let mut ends = Vec::new();
        for change in &change_set.changes {
            match change {
                Change::InsertEpisodes(episodes) => {
                    let readied = readied_key(scope, episodes).and_then(|key| self.prepared.take(&key));
                    let (first, previous, mut ended_with) = match readied {
                        Some(ingest) => {
                            generation.get_or_insert(ingest.generation);
                            (ingest.first, HashMap::new(), ingest.ended_with)
                        }
                        None => {
                            let reservation = self.allocate_positions(scope, episodes).await?;
                            generation.get_or_insert(reservation.generation);
                            (reservation.first, reservation.previous, HashMap::new())
                        }
                    };
                    // Each episode is indexed with the episodes before and after it in its session.
                    let mut neighbours: Vec<Vec<String>> = vec![Vec::new(); episodes.len()];
                    let mut latest: HashMap<&str, usize> = HashMap::new();
                    for (index, episode) in episodes.iter().enumerate() {
                        let Some(session) = episode.session_id.as_deref() else {
                            continue;
                        };
                        match latest.insert(session, index) {
                            Some(before) => {
                                neighbours[index].push(episodes[before].text.clone());
                                neighbours[before].push(episode.text.clone());
                            }
                            None => {
                                let found = match ended_with.remove(session) {
                                    Some(found) => found,
                                    None => self.last_episode(scope, session, previous.get(session)).await?,
                                };
                                if let Some((stored, read)) = found {
                                    if let Some(read) = read
                                        && let Some(after) = with_context(&read.source, &episode.text)
                                    {
                                        context_lines.push(json!({ "index": {
                                            "_index": self.index("episodes"), "_id": stored.id, "routing": tenant,
                                            "if_seq_no": read.seq_no, "if_primary_term": read.primary_term
                                        } }));
                                        context_lines.push(after);
                                    }
                                    neighbours[index].push(stored.text);
                                    contexts.push((stored.id, episode.text.clone()));
                                }
                            }
                        }
                    }
                    for (offset, (episode, context)) in episodes.iter().zip(neighbours).enumerate() {
                        let context = (!context.is_empty()).then(|| context.join("\n"));
                        let document =
                            docs::episode(scope, episode, first + offset as u64, context.as_deref());
                        if let Some(session) = episode.session_id.as_deref()
                            && latest.get(session) == Some(&offset)
                        {
                            ends.push(SessionEnd {
                                session: session.to_owned(),
                                id: episode.id.clone(),
                                document: document.clone(),
                            });
                        }
                        create("episodes", &episode.id, document);
                    }
                }
                Change::InsertFact(fact) => create("facts", &fact.id, docs::fact(scope, fact)),
                Change::InsertEdge(edge) => create("edges", &docs::edge_id(edge), docs::edge(scope, edge)),
                Change::InsertTombstone(tombstone) => {
                    create("tombstones", &tombstone.id, docs::tombstone(scope, tombstone))
                }
                Change::InsertPlaybook(playbook) => {
                    create("playbooks", &playbook.id, docs::playbook(scope, playbook));
                    create(
                        "playbook-versions",
                        &format!("{}:{}", playbook.id, playbook.version),
                        docs::playbook_version(scope, playbook),
                    );
                }
                Change::AppendPlaybookVersion { playbook, .. } => create(
                    "playbook-versions",
                    &format!("{}:{}", playbook.id, playbook.version),
                    docs::playbook_version(scope, playbook),
                ),
                Change::EnqueueJob(job) => create("jobs", &job.id, docs::job(scope, job)),
                Change::InsertReview(review) => create("reviews", &review.id, docs::review(scope, review)),
                Change::EraseFact { fact_id } => deferred.push(json!({ "erase_fact": fact_id })),
                Change::CompleteJobs(job_ids) if !job_ids.is_empty() => {
                    deferred.push(json!({ "complete_jobs": job_ids }))
                }
                Change::CompleteJobs(_)
                | Change::RecordPlaybookOutcome { .. }
                | Change::SupersedeFact { .. }
                | Change::RetractFact { .. }
                | Change::ActivateFact { .. }
                | Change::ResolveReview { .. }
                | Change::LiftTombstone { .. }
                | Change::RequireEpisodes(_)
                | Change::RequireNoActiveValue { .. }
                | Change::RequireGeneration(_)
                | Change::RetryJob { .. }
                | Change::MoveWatermark { .. } => {}
            }
        }
        for decision in &change_set.decisions {
            create("decisions", &decision.id, docs::decision(scope, decision));
        }
        for event in &change_set.audit {
            create("audit", &event.id, docs::audit(scope, event));
        }
        // An ingest (episodes, and the job that consolidates them) is not refreshed.
        let ingest = change_set
            .changes
            .iter()
            .any(|change| matches!(change, Change::InsertEpisodes(_)))
            && change_set
                .changes
                .iter()
                .all(|change| matches!(change, Change::InsertEpisodes(_) | Change::EnqueueJob(_)));
        let refresh = !ingest;
        let generation = match generation {
            Some(generation) => generation,
            None => self.current_generation(scope).await?,
        };
        Ok(Plan {
            generation,
            refresh,
            updates,
            lines,
            contexts,
            context_lines,
            ends,
            deferred,
        })
    }

    /// Makes the conditional updates; on a conflict, puts back the ones already made.
    async fn apply_updates(&self, tenant: &str, updates: &[Update]) -> Result<Applied> {
        let mut done: Vec<(&Update, (i64, i64))> = Vec::new();
        for update in updates {
            let version = update
                .before
                .as_ref()
                .map(|before| (before.seq_no, before.primary_term));
            let answer = self
                .write_if(update.index, &update.id, tenant, update.after.clone(), version)
                .await?;
            if answer.status == 409 {
                for (previous, version) in done.into_iter().rev() {
                    let at = Some(version);
                    match &previous.before {
                        None => {
                            self.delete_doc(previous.index, &previous.id, tenant, at, true)
                                .await?;
                        }
                        Some(before) => {
                            self.write_if(previous.index, &previous.id, tenant, before.source.clone(), at)
                                .await?;
                        }
                    }
                }
                let error = match update.index {
                    "state" => Error::Conflict {
                        code: cairn_core::ErrorCode::WatermarkMoved,
                        message: "another consolidation run moved the watermark".into(),
                    },
                    "reviews" => Error::review_resolved(&update.id),
                    "playbooks" => Error::Conflict {
                        code: cairn_core::ErrorCode::VersionConflict,
                        message: format!("playbook {} changed concurrently", update.id),
                    },
                    _ => Error::not_active(&format!("{} {}", update.index.trim_end_matches('s'), update.id)),
                };
                // A use count that moved in between is no conflict: the commit is made again.
                let recounted = match &update.before {
                    Some(before) => self
                        .get(update.index, &update.id, tenant)
                        .await?
                        .is_some_and(|now| without_usage(&now.source) == without_usage(&before.source)),
                    None => false,
                };
                return Ok(Applied::Conflict {
                    error,
                    commutative: update.commutative || recounted,
                });
            }
            done.push((update, records::written_version(&answer.body)?));
        }
        Ok(Applied::Done)
    }

    /// Reserves the positions of an ingest's episodes and finds the episode each of its
    /// sessions ended with, for the commit that follows ([`Prepared`]).
    pub(crate) async fn prepare_ingest(&self, scope: &Scope, episodes: &[cairn_core::Episode]) -> Result<()> {
        let Some(key) = readied_key(scope, episodes) else {
            return Ok(());
        };
        let reservation = self.allocate_positions(scope, episodes).await?;
        let previous = reservation.previous;
        let mut ended_with = HashMap::new();
        for session in episodes
            .iter()
            .filter_map(|episode| episode.session_id.as_deref())
        {
            if !ended_with.contains_key(session) {
                let found = self.last_episode(scope, session, previous.get(session)).await?;
                ended_with.insert(session.to_owned(), found);
            }
        }
        self.prepared.put(
            key,
            ReadiedIngest {
                first: reservation.first,
                generation: reservation.generation,
                ended_with,
            },
        );
        Ok(())
    }

    /// The latest stored episode of a session: the one the scope's state names (as this
    /// process wrote it, see [`Tails`], else read by id, so an ingest not yet refreshed
    /// counts), else the latest a search finds (a session older than the state's memory
    /// of sessions).
    async fn last_episode(
        &self,
        scope: &Scope,
        session_id: &str,
        known: Option<&String>,
    ) -> Result<Option<(IdText, Option<Versioned>)>> {
        if let Some(id) = known {
            let stored = match self.tails.take(scope, session_id, id) {
                Some(written) => Some(written),
                None => self.owned(scope, "episodes", id).await?,
            };
            if let Some(stored) = stored {
                let head: IdText = records::parse("episode", &stored.source)?;
                return Ok(Some((head, Some(stored))));
            }
        }
        let body = query::last_of_session(scope, session_id);
        match self.scoped_search(scope, "episodes", body).await?.first() {
            Some(hit) => Ok(Some((hit.read()?, None))),
            None => Ok(None),
        }
    }

    /// Appends the text of the episode that followed a stored one to its context, once:
    /// a replay finds it there. A concurrent change to the same document wins; the
    /// context is ranking help only.
    async fn append_context(&self, tenant: &str, id: &str, next: &str) -> Result<()> {
        let Some(stored) = self.get("episodes", id, tenant).await? else {
            return Ok(());
        };
        let Some(source) = with_context(&stored.source, next) else {
            return Ok(());
        };
        let version = Some((stored.seq_no, stored.primary_term));
        let answer = self.put("episodes", id, tenant, source, version, false).await?;
        if answer.ok() || answer.status == 409 {
            Ok(())
        } else {
            Err(failure("episodes", &answer))
        }
    }
}

/// The stored episodes that prepared context lines write.
fn prepared_ids(context_lines: &[Value]) -> std::collections::HashSet<&str> {
    context_lines
        .iter()
        .filter_map(|line| line["index"]["_id"].as_str())
        .collect()
}

/// A stored episode with `next` appended to its context; `None` when it is there.
fn with_context(source: &Value, next: &str) -> Option<Value> {
    let context = match source["context"].as_str() {
        Some(context) if context == next || context.ends_with(&format!("\n{next}")) => return None,
        Some(context) if !context.is_empty() => format!("{context}\n{next}"),
        _ => next.to_owned(),
    };
    let mut source = source.clone();
    source["context_terms"] = json!(cairn_core::bm25::index_terms(&context));
    source["context"] = json!(context);
    Some(source)
}

/// The fields that recall's use counting changes outside of any commit.
const USAGE_FIELDS: [&str; 2] = ["use_count", "last_used_at"];

/// A document without its use counts, to compare what commits wrote.
fn without_usage(source: &Value) -> Value {
    let mut source = source.clone();
    if let Value::Object(map) = &mut source {
        for field in USAGE_FIELDS {
            map.remove(field);
        }
    }
    source
}

/// The scope a journal was written in.
fn journal_scope(journal: &Value) -> Result<Scope> {
    #[derive(Deserialize)]
    struct JournalOwner {
        tenant: String,
        user: String,
        subject: String,
    }
    let owner: JournalOwner = records::parse("commit journal", journal)?;
    let tenant = TenantId::parse(&owner.tenant)?;
    let user = UserId::parse(&owner.user)?;
    #[allow(clippy::disallowed_methods)]
    let scope = Scope::of_stored_record(tenant, user, owner.subject);
    Ok(scope)
}

/// A journal found by recovery.
#[derive(Deserialize)]
struct JournalHead {
    tenant: String,
    id: String,
}

/// A stored episode that gets a newer one's text as context.
#[derive(Deserialize)]
struct ContextStep {
    id: String,
    next: String,
}

/// A journaled conditional update (its `before` and `after` are whole documents).
#[derive(Deserialize)]
struct UpdateStep {
    index: String,
    id: String,
}

/// The id and text of a stored episode.
#[derive(Deserialize)]
struct IdText {
    id: String,
    text: String,
}
