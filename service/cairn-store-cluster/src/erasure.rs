//! Erasure as a fence in the store, so that it holds across every process that writes
//! to the cluster.
//!
//! A cluster has no transactions, and a commit writes its inserts after its commit
//! point (see `commit`): a process that checked a commit's preconditions before an
//! erasure could otherwise write it after the erasure's receipt. The scope's state
//! document carries a `generation`, which every erasure advances by compare-and-set
//! before it removes anything, marking the scope `erasing` until it is done:
//!
//! 1. every commit reads the generation it writes under: the one its operation started
//!    at (`Change::RequireGeneration`), else the one its ingest reserved positions
//!    under (the same compare-and-set), else a read at its check. A scope being erased
//!    refuses it (`scope_erased`);
//! 2. after writing, the commit reads the state again. When the generation moved or an
//!    erasure is under way, it deletes what it created and answers `scope_erased`. Its
//!    journal stays until then, so a process that dies in between leaves the deletion to
//!    recovery, which compares the journal's generation the same way before it rolls
//!    anything forward;
//! 3. the erasure, having advanced the generation, refreshes, turns every journal of
//!    the scope into an id-only stub (phase `fenced`: recovery deletes what it names),
//!    deletes the scope's documents in every index, and ends: the state starts over
//!    (sessions, audit key and watermark gone; positions kept so that none is used
//!    twice, the last one reserved becoming the floor consolidation reads from), and
//!    its audit event is written.
//!
//! A commit whose second read saw the old generation finished writing before the
//! erasure advanced it (a read by id is realtime), so the erasure's refreshed sweep
//! finds what it wrote. A commit that writes after the sweep sees the new generation
//! and takes back its own writes. An erasure whose process died midway is finished by
//! recovery (`recover_erasures`) from the audit event it noted in the state.

use crate::{ClusterStore, PAGE, Versioned, docs, query, records, state_id, watermark_id};
use cairn_core::{AuditEvent, ErasureReceipt, Error, Result, Scope, TenantId, UserId};
use chrono::Utc;
use serde_json::{Value, json};
use std::time::Duration;

/// The phase of a journal an erasure took over: its plan names only what to delete.
pub(crate) const FENCED: &str = "fenced";

/// A scope's generation and whether an erasure of it is under way, from its state
/// document.
pub(crate) fn generation_of(state: &Value) -> u64 {
    state["generation"].as_u64().unwrap_or(0)
}

pub(crate) fn erasing(state: &Value) -> bool {
    !state["erasing"].is_null()
}

impl ClusterStore {
    /// The scope's generation, read afresh; `scope_erased` while an erasure is under way.
    pub(crate) async fn current_generation(&self, scope: &Scope) -> Result<u64> {
        match self.state(scope).await? {
            Some(doc) if erasing(&doc.source) => Err(Error::scope_erased()),
            Some(doc) => Ok(generation_of(&doc.source)),
            None => Ok(0),
        }
    }

    /// Whether a commit written under `generation` still stands: the scope was not
    /// erased since, and no erasure is under way.
    pub(crate) async fn still_current(&self, scope: &Scope, generation: u64) -> Result<bool> {
        Ok(match self.state(scope).await? {
            Some(doc) => !erasing(&doc.source) && generation_of(&doc.source) == generation,
            None => generation == 0,
        })
    }

    /// Deletes the documents that the create lines of a journaled plan name (a commit
    /// the scope's erasure overtook), and the journal.
    pub(crate) async fn take_back(&self, scope: &Scope, plan: &Value, journal_id: &str) -> Result<()> {
        let tenant = scope.tenant().as_str();
        let mut lines: Vec<Value> = created(plan)
            .map(|(index, id)| json!({ "delete": { "_index": index, "_id": id, "routing": tenant } }))
            .collect();
        lines.push(
            json!({ "delete": { "_index": self.index("commits"), "_id": journal_id, "routing": tenant } }),
        );
        self.bulk_with(lines, &[404, 409], true).await?;
        self.tails.forget(scope);
        Ok(())
    }

    /// Erases the scope (see the module documentation) and counts what was removed.
    pub(crate) async fn erase(&self, scope: &Scope, audit: &AuditEvent) -> Result<ErasureReceipt> {
        let noted = json!({ "id": audit.id, "doc": docs::audit(scope, audit) });
        let now = docs::micros(Utc::now());
        let generation = self
            .edit_state(scope, "erasure", |state| {
                let generation = generation_of(state) + 1;
                state["generation"] = json!(generation);
                state["erasing"] = json!(now);
                state["erasure"] = noted.clone();
                Ok(crate::StateEdit::Write(generation))
            })
            .await?;
        let receipt = self.sweep(scope, generation).await?;
        self.end_erasure(scope, generation, &noted).await?;
        Ok(receipt)
    }

    /// Removes every document of the scope but its state, once the generation moved to
    /// `generation`.
    async fn sweep(&self, scope: &Scope, generation: u64) -> Result<ErasureReceipt> {
        self.statistics.written(scope);
        self.tails.forget(scope);
        self.reserved.forget(&state_id(scope));
        // Journals, ingests, use counts and state documents are written without a
        // refresh: every document written so far must be found.
        self.refresh_indices(&crate::INDICES).await?;
        self.fence_journals(scope, generation).await?;
        let receipt = ErasureReceipt {
            episodes: self.erase_where(scope, "episodes", Vec::new()).await?,
            facts: self.erase_where(scope, "facts", Vec::new()).await?,
            playbooks: self.erase_where(scope, "playbooks", Vec::new()).await?,
            playbook_versions: self.erase_where(scope, "playbook-versions", Vec::new()).await?,
            edges: self.erase_where(scope, "edges", Vec::new()).await?,
            tombstones: self.erase_where(scope, "tombstones", Vec::new()).await?,
            decisions: self.erase_where(scope, "decisions", Vec::new()).await?,
            jobs: self.erase_where(scope, "jobs", Vec::new()).await?,
            reviews: self.erase_where(scope, "reviews", Vec::new()).await?,
        };
        self.erase_where(scope, "usage", Vec::new()).await?;
        Ok(receipt)
    }

    /// Turns every journal of the scope into a stub that names only what its commit
    /// created (recovery deletes those), so no content of the scope stays in a journal
    /// and none is rolled forward.
    async fn fence_journals(&self, scope: &Scope, generation: u64) -> Result<()> {
        let tenant = scope.tenant().as_str();
        let mut body = query::scoped(scope, Vec::new(), Some(json!([{ "id": "asc" }])), PAGE);
        body["seq_no_primary_term"] = json!(true);
        for hit in self.scoped_all(scope, "commits", body).await? {
            let (seq_no, primary_term) = hit.version()?;
            let mut current = Some(Versioned {
                source: hit.source,
                seq_no,
                primary_term,
            });
            // A journal that changes meanwhile (its commit point) is read again.
            for _ in 0..10 {
                let Some(journal) = current.take() else { break };
                if journal.source["phase"].as_str() == Some(FENCED) {
                    break;
                }
                let names: Vec<Value> = created(&journal.source["plan"])
                    .map(|(index, id)| json!({ "create": { "_index": index, "_id": id } }))
                    .collect();
                let stub = json!({
                    "tenant": tenant, "user": scope.user().as_str(), "subject": journal.source["subject"],
                    "id": hit.id, "phase": FENCED, "at": docs::micros(Utc::now()),
                    "plan": { "lines": names, "generation": generation },
                });
                let answer = self
                    .put(
                        "commits",
                        &hit.id,
                        tenant,
                        stub,
                        Some((journal.seq_no, journal.primary_term)),
                        false,
                    )
                    .await?;
                if answer.status != 409 {
                    break;
                }
                current = self.get("commits", &hit.id, tenant).await?;
            }
        }
        Ok(())
    }

    /// Ends the erasure of `generation`: the state starts over but keeps its generation,
    /// and the positions reserved so far become its floor (new episodes come after
    /// them, and consolidation starts there), the watermark goes, and the noted audit
    /// event is written. A later erasure under way is left to end itself.
    async fn end_erasure(&self, scope: &Scope, generation: u64, noted: &Value) -> Result<()> {
        let ended = self
            .edit_state(scope, "erasure", |state| {
                if generation_of(state) != generation {
                    return Ok(crate::StateEdit::Keep(false));
                }
                let allocated = state["allocated"].as_u64().unwrap_or(0);
                let mut fresh = crate::fresh_state(scope);
                fresh["allocated"] = json!(allocated);
                fresh["floor"] = json!(allocated);
                fresh["generation"] = json!(generation);
                *state = fresh;
                Ok(crate::StateEdit::Write(true))
            })
            .await?;
        let tenant = scope.tenant().as_str();
        if ended {
            self.delete_doc("state", &watermark_id(scope), tenant, None, false)
                .await?;
        }
        if let (Some(id), Some(doc)) = (noted["id"].as_str(), noted.get("doc")) {
            self.create("audit", id, tenant, doc.clone()).await?;
        }
        self.statistics.written(scope);
        Ok(())
    }

    /// Finishes the erasures whose process stopped midway: scopes marked `erasing`
    /// longer ago than `older_than`. Returns how many it finished.
    pub(crate) async fn recover_erasures(&self, older_than: Duration) -> Result<u64> {
        self.refresh_indices(&["state"]).await?;
        let cutoff = docs::micros(Utc::now()) - i64::try_from(older_than.as_micros()).unwrap_or(i64::MAX);
        let body = json!({
            "query": { "range": { "erasing": { "lte": cutoff } } },
            "sort": [{ "id": "asc" }],
            "size": 100,
            "_source": ["tenant", "user", "generation", "erasure"],
        });
        let mut finished = 0;
        for hit in records::hits(&self.search("state", None, body).await?)? {
            let owner = |field: &str| hit.source[field].as_str().unwrap_or_default().to_owned();
            let tenant = TenantId::parse(&owner("tenant"))?;
            let user = UserId::parse(&owner("user"))?;
            let noted = hit.source["erasure"].clone();
            let subject = noted["doc"]["subject"].as_str().unwrap_or("recovery").to_owned();
            #[allow(clippy::disallowed_methods)]
            let scope = Scope::of_stored_record(tenant, user, subject);
            let generation = generation_of(&hit.source);
            self.sweep(&scope, generation).await?;
            self.end_erasure(&scope, generation, &noted).await?;
            tracing::warn!(tenant = %scope.tenant(), "finished an erasure whose process stopped midway");
            finished += 1;
        }
        Ok(finished)
    }
}

/// The documents a journaled plan creates: (index, id) of each create line.
pub(crate) fn created(plan: &Value) -> impl Iterator<Item = (String, String)> + '_ {
    plan["lines"].as_array().into_iter().flatten().filter_map(|line| {
        let create = line.get("create")?;
        Some((
            create["_index"].as_str()?.to_owned(),
            create["_id"].as_str()?.to_owned(),
        ))
    })
}
