//! The check step of a commit: every precondition of a change set (the scope owns
//! each record, statuses and versions allow the change, the watermark and tombstones
//! agree, the cited evidence is still stored) is read and checked before anything is
//! written, and turned into the conditional updates the commit makes (see `commit`).

use crate::{ClusterStore, Update, Versioned, docs, records, require_status, watermark_id, watermark_source};
use cairn_core::text::fingerprint;
use cairn_core::{Change, Error, FactStatus, MemoryStore, Result, Scope};
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};

impl ClusterStore {
    /// Reads and checks every precondition of the change set; returns the conditional
    /// updates to make, and the scope's generation the commit is made under (see
    /// `erasure`): the one it requires, else (but for an ingest, whose reservation of
    /// positions reads it) the current one.
    pub(crate) async fn check(
        &self,
        scope: &Scope,
        changes: &[Change],
    ) -> Result<(Vec<Update>, Option<u64>)> {
        let mut updates = Vec::new();
        // The generation is read before anything else: a commit whose other reads follow
        // an erasure's sweep sees that erasure's generation, or its mark.
        let required = changes.iter().find_map(|change| match change {
            Change::RequireGeneration(generation) => Some(*generation),
            _ => None,
        });
        let ingest = changes
            .iter()
            .any(|change| matches!(change, Change::InsertEpisodes(_)));
        let generation = if ingest && required.is_none() {
            None
        } else {
            let current = self.current_generation(scope).await?;
            if required.is_some_and(|required| required != current) {
                return Err(Error::scope_erased());
            }
            Some(current)
        };
        let mut lifted = Vec::new();
        // The tombstones of every inserted value, in one search.
        let inserted: Vec<String> = changes
            .iter()
            .filter_map(|change| match change {
                Change::InsertFact(fact) if fact.status != FactStatus::Pending => {
                    Some(fingerprint(&fact.text))
                }
                _ => None,
            })
            .collect();
        let tombstoned = self.tombstones_of(scope, &inserted).await?;
        for change in changes {
            match change {
                Change::SupersedeFact {
                    fact_id,
                    superseded_by,
                    at,
                    valid_to,
                } => {
                    let doc = self.fact_doc(scope, fact_id).await?;
                    let fact = records::read_fact(&doc.source)?;
                    if fact.status == FactStatus::Superseded
                        && fact.superseded_by.as_deref() == Some(superseded_by)
                    {
                        continue; // replayed
                    }
                    require_status(&fact, &[FactStatus::Active])?;
                    let mut after = doc.source.clone();
                    after["status"] = json!("superseded");
                    after["superseded_at"] = json!(docs::micros(*at));
                    after["superseded_by"] = json!(superseded_by);
                    if let Some(to) = valid_to
                        && fact.valid_to.is_none()
                        && fact.valid_from.is_none_or(|from| from < *to)
                    {
                        after["valid_to"] = json!(docs::micros(*to));
                    }
                    updates.push(Update::new("facts", fact_id.clone(), Some(doc), after));
                }
                Change::RetractFact { fact_id, reason, at } => {
                    let doc = self.fact_doc(scope, fact_id).await?;
                    let fact = records::read_fact(&doc.source)?;
                    require_status(
                        &fact,
                        &[FactStatus::Active, FactStatus::Superseded, FactStatus::Pending],
                    )?;
                    let mut after = doc.source.clone();
                    after["status"] = json!("retracted");
                    after["retracted_at"] = json!(docs::micros(*at));
                    if let Some(reason) = reason {
                        after["retraction_reason"] = json!(reason);
                    }
                    updates.push(Update::new("facts", fact_id.clone(), Some(doc), after));
                }
                Change::EraseFact { fact_id } => {
                    self.fact_doc(scope, fact_id).await?;
                }
                Change::ActivateFact { fact_id, at } => {
                    let doc = self.fact_doc(scope, fact_id).await?;
                    let fact = records::read_fact(&doc.source)?;
                    require_status(&fact, &[FactStatus::Pending])?;
                    let value = fingerprint(&fact.text);
                    if !lifted.contains(&value)
                        && let Some(tombstone) = self.find_tombstone(scope, &value).await?
                    {
                        return Err(Error::Tombstoned {
                            tombstone_id: tombstone.id,
                        });
                    }
                    let mut after = doc.source.clone();
                    after["status"] = json!("active");
                    after["created_at"] = json!(docs::micros(*at));
                    after["timestamp"] = json!(docs::timestamp(*at));
                    updates.push(Update::new("facts", fact_id.clone(), Some(doc), after));
                }
                Change::ResolveReview {
                    review_id,
                    status,
                    at,
                    by,
                    note,
                } => {
                    let doc = self
                        .owned(scope, "reviews", review_id)
                        .await?
                        .ok_or(Error::NotFound { what: "review" })?;
                    if doc.source["status"].as_str() != Some("pending") {
                        return Err(Error::review_resolved(review_id));
                    }
                    let mut after = doc.source.clone();
                    after["status"] = json!(status.as_str());
                    after["resolved_at"] = json!(docs::micros(*at));
                    after["resolved_by"] = json!(by);
                    after["note"] = json!(note);
                    updates.push(Update::new("reviews", review_id.clone(), Some(doc), after));
                }
                Change::LiftTombstone { tombstone_id, at } => {
                    let doc = self
                        .owned(scope, "tombstones", tombstone_id)
                        .await?
                        .ok_or(Error::NotFound { what: "tombstone" })?;
                    if !doc.source["lifted_at"].is_null() {
                        return Err(Error::Conflict {
                            code: cairn_core::ErrorCode::NotActive,
                            message: format!("tombstone {tombstone_id} is already lifted"),
                        });
                    }
                    let mut after = doc.source.clone();
                    after["lifted_at"] = json!(docs::micros(*at));
                    lifted.push(doc.source["fingerprint"].as_str().unwrap_or_default().to_owned());
                    updates.push(Update::new("tombstones", tombstone_id.clone(), Some(doc), after));
                }
                // A pending fact changes nothing until approved; its activation checks.
                Change::InsertFact(fact) if fact.status == FactStatus::Pending => {}
                Change::InsertFact(fact) => {
                    let value = fingerprint(&fact.text);
                    if !lifted.contains(&value)
                        && let Some(tombstone_id) = tombstoned.get(&value)
                    {
                        return Err(Error::Tombstoned {
                            tombstone_id: tombstone_id.clone(),
                        });
                    }
                }
                Change::AppendPlaybookVersion {
                    expected_version,
                    playbook,
                } => {
                    let doc = self
                        .owned(scope, "playbooks", &playbook.id)
                        .await?
                        .ok_or(Error::NotFound { what: "playbook" })?;
                    let current = doc.source["version"].as_u64().unwrap_or(0);
                    if current != u64::from(*expected_version) {
                        return Err(Error::Conflict {
                            code: cairn_core::ErrorCode::VersionConflict,
                            message: format!(
                                "playbook {} is at version {current}, not {expected_version}",
                                playbook.id
                            ),
                        });
                    }
                    let mut after = docs::playbook(scope, playbook);
                    after["success_count"] = doc.source["success_count"].clone();
                    after["failure_count"] = doc.source["failure_count"].clone();
                    after["use_count"] = doc.source["use_count"].clone();
                    after["created_at"] = doc.source["created_at"].clone();
                    if !doc.source["last_used_at"].is_null() {
                        after["last_used_at"] = doc.source["last_used_at"].clone();
                    }
                    updates.push(Update::new("playbooks", playbook.id.clone(), Some(doc), after));
                }
                Change::RecordPlaybookOutcome {
                    playbook_id,
                    success,
                    at,
                } => {
                    // A counter is a compare-and-set like any update (no script, so a
                    // node without scripting serves it); a racing outcome retries.
                    let doc = self
                        .owned(scope, "playbooks", playbook_id)
                        .await?
                        .ok_or(Error::NotFound { what: "playbook" })?;
                    let field = if *success {
                        "success_count"
                    } else {
                        "failure_count"
                    };
                    let mut after = doc.source.clone();
                    after[field] = json!(doc.source[field].as_u64().unwrap_or(0) + 1);
                    after["last_used_at"] = json!(docs::micros(*at));
                    updates.push(Update {
                        index: "playbooks",
                        id: playbook_id.clone(),
                        before: Some(doc),
                        after,
                        commutative: true,
                    });
                }
                Change::MoveWatermark { expected, to } => {
                    let (current, doc) = self.watermark_doc(scope).await?;
                    if current != *expected {
                        return Err(Error::Conflict {
                            code: cairn_core::ErrorCode::WatermarkMoved,
                            message: format!(
                                "another consolidation run moved the watermark from {expected} to {current}"
                            ),
                        });
                    }
                    let after = watermark_source(scope, *to);
                    updates.push(Update::new("state", watermark_id(scope), doc, after));
                }
                Change::RequireEpisodes(episode_ids) => {
                    self.require_episodes(scope, episode_ids).await?;
                }
                Change::RequireNoActiveValue { fingerprint } => {
                    if !self
                        .find_active_facts_by_fingerprint(scope, fingerprint)
                        .await?
                        .is_empty()
                    {
                        return Err(Error::duplicate());
                    }
                }
                Change::RetryJob { job_id, at } => {
                    let doc = self
                        .owned(scope, "jobs", job_id)
                        .await?
                        .ok_or(Error::NotFound { what: "job" })?;
                    let mut after = doc.source.clone();
                    let at = docs::micros(*at);
                    after["attempts"] = json!(0);
                    after["run_after"] = json!(at);
                    // A live lease stays: the worker holding it is still running the job.
                    let live = doc.source["leased_until"]
                        .as_i64()
                        .is_some_and(|until| until > at);
                    if let Value::Object(map) = &mut after {
                        for field in ["dead_at", "last_error"] {
                            map.remove(field);
                        }
                        if !live {
                            map.remove("leased_until");
                        }
                    }
                    updates.push(Update::new("jobs", job_id.clone(), Some(doc), after));
                }
                Change::InsertEpisodes(_)
                | Change::InsertEdge(_)
                | Change::InsertTombstone(_)
                | Change::InsertReview(_)
                | Change::InsertPlaybook(_)
                | Change::EnqueueJob(_)
                | Change::RequireGeneration(_)
                | Change::CompleteJobs(_) => {}
            }
        }
        Ok((updates, generation))
    }

    /// Fails with `evidence_erased` unless every listed episode is stored in the scope.
    async fn require_episodes(&self, scope: &Scope, episode_ids: &[String]) -> Result<()> {
        if episode_ids.is_empty() {
            return Ok(());
        }
        // By id (a realtime multi-get): an ingest is not refreshed, and its episodes are
        // evidence the moment it answers.
        let ids: Vec<&str> = episode_ids.iter().map(String::as_str).collect();
        let fields = ["tenant", "user", "id"];
        let found: HashSet<&str> = self
            .scoped_multi_get(scope, "episodes", &ids, Some(&fields), true)
            .await?
            .iter()
            .zip(&ids)
            .filter(|(hit, _)| hit.is_some())
            .map(|(_, id)| *id)
            .collect();
        match episode_ids.iter().find(|id| !found.contains(id.as_str())) {
            Some(missing) => Err(Error::evidence_erased(missing)),
            None => Ok(()),
        }
    }

    async fn fact_doc(&self, scope: &Scope, fact_id: &str) -> Result<Versioned> {
        self.owned(scope, "facts", fact_id)
            .await?
            .ok_or(Error::NotFound { what: "fact" })
    }

    /// The unlifted tombstone of each value that has one, by value: the newest, as
    /// `find_tombstone` reads it one value at a time.
    async fn tombstones_of(&self, scope: &Scope, values: &[String]) -> Result<HashMap<String, String>> {
        let mut found = HashMap::new();
        if values.is_empty() {
            return Ok(found);
        }
        let unlifted = json!({ "bool": { "must_not": { "exists": { "field": "lifted_at" } } } });
        let body = crate::query::newest_per_value(scope, values, unlifted);
        for hit in self.scoped_search(scope, "tombstones", body).await? {
            let tombstone = records::read_tombstone(&hit.source)?;
            found.entry(tombstone.fingerprint).or_insert(tombstone.id);
        }
        Ok(found)
    }
}
