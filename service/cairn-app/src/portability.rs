//! Data portability: a scope's whole memory as one document, and that document (or a
//! mem0 `get_all` export) taken back in.
//!
//! An export holds episodes (oldest first, with how many of them were consolidated),
//! facts of every status with their supersession history, playbooks with every
//! version, tombstones, the decision log and the pending reviews (each pending fact's
//! held change). Vectors are left out: they belong to an embedding model, and an import
//! embeds again with the one configured.
//!
//! A Cairn import fills an empty scope and gives every record a new id (ids are
//! global in a search cluster, and the original records may still exist elsewhere),
//! keeping every reference between records. A mem0 import writes each memory through
//! the same gates as an explicit write: tombstones, exact duplicates, validation.

use crate::facts::FactInput;
use crate::{Cairn, RequestContext, audit_event, now, validate};
use cairn_core::{
    Change, ChangeSet, Decision, DecisionKind, Edge, EdgeKind, Episode, Error, Fact, FactStatus, FactType,
    Page, PageRequest, Playbook, Result, Review, ReviewKind, ReviewStatus, Scope, StatusFilter, Tombstone,
    TombstoneReason, new_id,
};
use chrono::{DateTime, NaiveDateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};

/// The `format` field of a Cairn export.
pub const FORMAT: &str = "cairn-export";
/// The version of the export document this build writes and reads.
pub const VERSION: u32 = 1;
/// Records read per page while exporting.
const PAGE: usize = 500;
/// Changes per commit while importing (a commit is one transaction or journal).
const CHANGES_PER_COMMIT: usize = 500;

/// The prefix of the origin (and proposer) of every decision and review an import
/// brings: shown wherever they are, with what the document said after it.
pub const IMPORTED: &str = "import:";

/// `value` marked as brought by an import, within a label's 128 characters.
fn imported(value: &str) -> String {
    let mut marked = format!("{IMPORTED}{value}");
    while marked.len() > 128 {
        marked.pop();
    }
    marked
}

/// An import's claim on its scope not renewed for this long was left by a process that
/// stopped; another import may take the scope (each part renews it).
const IMPORT_CLAIM_STALE: chrono::Duration = chrono::Duration::minutes(10);
/// Texts embedded per call while importing.
const EMBED_BATCH: usize = 64;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ScopeExport {
    pub format: String,
    pub version: u32,
    pub exported_at: DateTime<Utc>,
    pub tenant: String,
    pub user: String,
    /// How many of the episodes, from the oldest, consolidation had read.
    pub consolidated_episodes: usize,
    pub episodes: Vec<ExportedEpisode>,
    pub facts: Vec<ExportedFact>,
    pub playbooks: Vec<ExportedPlaybook>,
    pub tombstones: Vec<ExportedTombstone>,
    pub decisions: Vec<ExportedDecision>,
    /// The review queue: one pending review for each pending fact (absent from exports
    /// made before review existed).
    #[serde(default)]
    pub reviews: Vec<ExportedReview>,
}

/// A pending review: the held change of a pending fact.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExportedReview {
    pub id: String,
    pub kind: ReviewKind,
    /// The pending fact.
    pub fact_id: String,
    /// The fact it supersedes or retracts, or the tombstone it lifts.
    pub target_id: Option<String>,
    pub rule: String,
    pub reason: String,
    /// The `HELD_FOR_REVIEW` decision.
    pub decision_id: String,
    pub evidence_episode_ids: Vec<String>,
    pub origin: String,
    pub proposed_by: String,
    pub created_at: DateTime<Utc>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExportedEpisode {
    pub id: String,
    pub session_id: Option<String>,
    pub text: String,
    pub occurred_at: DateTime<Utc>,
    pub ingested_at: DateTime<Utc>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExportedFact {
    pub id: String,
    pub fact_type: FactType,
    pub text: String,
    pub confidence: f32,
    pub status: FactStatus,
    pub source_episode_ids: Vec<String>,
    pub source_span: Option<String>,
    pub created_at: DateTime<Utc>,
    pub superseded_at: Option<DateTime<Utc>>,
    pub superseded_by: Option<String>,
    pub retracted_at: Option<DateTime<Utc>>,
    pub retraction_reason: Option<String>,
    pub valid_from: Option<DateTime<Utc>>,
    pub valid_to: Option<DateTime<Utc>>,
    pub expires_at: Option<DateTime<Utc>>,
    pub last_used_at: Option<DateTime<Utc>>,
    pub use_count: u64,
}

/// A playbook as its versions, oldest first; the last is the current one.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExportedPlaybook {
    pub id: String,
    pub versions: Vec<ExportedPlaybookVersion>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExportedPlaybookVersion {
    pub version: u32,
    pub name: String,
    pub trigger: String,
    pub steps: Vec<String>,
    pub success_count: u64,
    pub failure_count: u64,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub last_used_at: Option<DateTime<Utc>>,
    pub use_count: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExportedTombstone {
    pub id: String,
    pub fingerprint: String,
    pub fact_id: String,
    pub reason: TombstoneReason,
    pub created_at: DateTime<Utc>,
    pub lifted_at: Option<DateTime<Utc>>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExportedDecision {
    pub id: String,
    pub kind: DecisionKind,
    pub reason: String,
    pub fact_id: Option<String>,
    pub target_ids: Vec<String>,
    pub origin: String,
    pub created_at: DateTime<Utc>,
}

/// What a Cairn import wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct ImportReport {
    pub episodes: usize,
    pub facts: usize,
    pub playbooks: usize,
    pub playbook_versions: usize,
    pub tombstones: usize,
    pub decisions: usize,
    pub reviews: usize,
}

/// A mem0 `get_all` document: `{"results": [...]}` (with or without a total), a
/// `{"memories": [...]}` file, or the bare list older releases return.
// Read by its first token (a list, or an object whose `results` or `memories` holds the
// list), straight into memories: an untagged enum would first buffer the whole document
// as a generic tree, about fifteen times its size.
#[derive(Clone, Debug, schemars::JsonSchema)]
#[serde(untagged)]
pub enum Mem0Document {
    Results { results: Vec<Mem0Memory> },
    Memories { memories: Vec<Mem0Memory> },
    List(Vec<Mem0Memory>),
}

impl<'de> Deserialize<'de> for Mem0Document {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        struct Shape;
        impl<'de> serde::de::Visitor<'de> for Shape {
            type Value = Mem0Document;

            fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
                formatter.write_str("a list of memories, or an object with `results` or `memories`")
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut list: A,
            ) -> std::result::Result<Mem0Document, A::Error> {
                let mut memories = Vec::with_capacity(list.size_hint().unwrap_or(0).min(4096));
                while let Some(memory) = list.next_element()? {
                    memories.push(memory);
                }
                Ok(Mem0Document::List(memories))
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Mem0Document, A::Error> {
                let mut found = None;
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    match key.as_ref() {
                        "results" | "memories" if found.is_some() => {
                            return Err(serde::de::Error::custom("holds both `results` and `memories`"));
                        }
                        "results" => {
                            found = Some(Mem0Document::Results {
                                results: map.next_value()?,
                            })
                        }
                        "memories" => {
                            found = Some(Mem0Document::Memories {
                                memories: map.next_value()?,
                            })
                        }
                        // `total`, `relations` and the like: skipped without being kept.
                        _ => {
                            map.next_value::<serde::de::IgnoredAny>()?;
                        }
                    }
                }
                found.ok_or_else(|| serde::de::Error::missing_field("results"))
            }
        }
        deserializer.deserialize_any(Shape)
    }
}

/// One mem0 memory; fields Cairn has no use for (`hash`, `agent_id`, ...) are ignored.
#[derive(Clone, Debug, Deserialize, schemars::JsonSchema)]
pub struct Mem0Memory {
    pub id: Option<String>,
    pub memory: String,
    pub user_id: Option<String>,
    pub created_at: Option<String>,
    pub updated_at: Option<String>,
    // Any JSON; only a string `fact_type` in an object is read, the rest skipped
    // without being kept.
    #[schemars(with = "Option<serde_json::Value>")]
    pub metadata: Option<Mem0Metadata>,
}

/// What Cairn reads of a mem0 memory's metadata: its `fact_type`, when it is a string.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mem0Metadata {
    pub fact_type: Option<String>,
}

impl<'de> Deserialize<'de> for Mem0Metadata {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        struct Read;
        impl<'de> serde::de::Visitor<'de> for Read {
            type Value = Mem0Metadata;

            fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
                formatter.write_str("any JSON value")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Mem0Metadata, A::Error> {
                let mut read = Mem0Metadata::default();
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    if key == "fact_type" {
                        if let serde_json::Value::String(fact_type) = map.next_value()? {
                            read.fact_type = Some(fact_type);
                        }
                    } else {
                        map.next_value::<serde::de::IgnoredAny>()?;
                    }
                }
                Ok(read)
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut list: A,
            ) -> std::result::Result<Mem0Metadata, A::Error> {
                while list.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(Mem0Metadata::default())
            }

            fn visit_bool<E>(self, _: bool) -> std::result::Result<Mem0Metadata, E> {
                Ok(Mem0Metadata::default())
            }

            fn visit_i64<E>(self, _: i64) -> std::result::Result<Mem0Metadata, E> {
                Ok(Mem0Metadata::default())
            }

            fn visit_u64<E>(self, _: u64) -> std::result::Result<Mem0Metadata, E> {
                Ok(Mem0Metadata::default())
            }

            fn visit_f64<E>(self, _: f64) -> std::result::Result<Mem0Metadata, E> {
                Ok(Mem0Metadata::default())
            }

            fn visit_str<E>(self, _: &str) -> std::result::Result<Mem0Metadata, E> {
                Ok(Mem0Metadata::default())
            }

            fn visit_unit<E>(self) -> std::result::Result<Mem0Metadata, E> {
                Ok(Mem0Metadata::default())
            }
        }
        deserializer.deserialize_any(Read)
    }
}

/// What a mem0 import did with each memory.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct Mem0ImportReport {
    /// Written as new active facts.
    pub created: usize,
    /// Already held as an active fact of the scope (or twice in the document).
    pub duplicates: usize,
    /// Refused by a tombstone: the user retracted or forgot the value.
    pub tombstoned: usize,
}

impl Cairn {
    /// Everything of the scope, as one document.
    pub async fn export_scope(&self, scope: &Scope) -> Result<ScopeExport> {
        let watermark = self.store.watermark(scope).await?;
        let mut episodes = Vec::new();
        let mut consolidated_episodes = 0;
        let mut position = 0;
        loop {
            let batch = self.store.episodes_after(scope, position, PAGE).await?;
            let Some(last) = batch.last() else { break };
            position = last.position;
            for logged in batch {
                if logged.position <= watermark {
                    consolidated_episodes += 1;
                }
                episodes.push(exported_episode(logged.episode));
            }
        }
        let as_of = now();
        let mut facts: Vec<ExportedFact> = every_page(|page| async move {
            self.store
                .list_facts(scope, StatusFilter::All, as_of, &page)
                .await
        })
        .await?
        .into_iter()
        .map(exported_fact)
        .collect();
        facts.reverse();
        let mut playbooks = Vec::new();
        for playbook in
            every_page(|page| async move { self.store.list_playbooks(scope, &page).await }).await?
        {
            let versions = self.store.playbook_versions(scope, &playbook.id).await?;
            playbooks.push(ExportedPlaybook {
                id: playbook.id,
                versions: versions.into_iter().map(exported_version).collect(),
            });
        }
        playbooks.reverse();
        // The file names no tombstoned value a reader could confirm by guessing.
        let sealer = self.sealer(scope).await?;
        let tombstones = self
            .store
            .list_tombstones(scope)
            .await?
            .into_iter()
            .map(|tombstone| {
                Ok(ExportedTombstone {
                    id: tombstone.id,
                    fingerprint: sealer.seal(&tombstone.fingerprint)?,
                    fact_id: tombstone.fact_id,
                    reason: tombstone.reason,
                    created_at: tombstone.created_at,
                    lifted_at: tombstone.lifted_at,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let mut decisions: Vec<ExportedDecision> =
            every_page(|page| async move { self.store.list_decisions(scope, None, &page).await })
                .await?
                .into_iter()
                .map(|decision| ExportedDecision {
                    id: decision.id,
                    kind: decision.kind,
                    reason: decision.reason,
                    fact_id: decision.fact_id,
                    target_ids: decision.target_ids,
                    origin: decision.origin,
                    created_at: decision.created_at,
                })
                .collect();
        decisions.reverse();
        let reviews = every_page(|page| async move { self.store.list_reviews(scope, &page).await })
            .await?
            .into_iter()
            .map(|review| ExportedReview {
                id: review.id,
                kind: review.kind,
                fact_id: review.fact_id,
                target_id: review.target_id,
                rule: review.rule,
                reason: review.reason,
                decision_id: review.decision_id,
                evidence_episode_ids: review.evidence_episode_ids,
                origin: review.origin,
                proposed_by: review.proposed_by,
                created_at: review.created_at,
            })
            .collect();
        Ok(ScopeExport {
            format: FORMAT.to_owned(),
            version: VERSION,
            exported_at: now(),
            tenant: scope.tenant().as_str().to_owned(),
            user: scope.user().as_str().to_owned(),
            consolidated_episodes,
            episodes,
            facts,
            playbooks,
            tombstones,
            decisions,
            reviews,
        })
    }

    /// Takes a Cairn export into this scope, which must hold no memory yet. Every record
    /// gets a new id; references between records follow. The document is checked whole
    /// before anything is written; bad input changes nothing.
    pub async fn import_scope(
        &self,
        scope: &Scope,
        context: &RequestContext,
        mut document: ScopeExport,
    ) -> Result<ImportReport> {
        self.open_tombstones(scope, &mut document).await?;
        self.check_export(&document)?;
        // No consolidation run of the scope reads episodes while they arrive.
        let _runs_excluded = self.consolidator.exclude_runs(scope).await?;
        // An erasure after this read, in any process, fences every later part.
        let generation = self.store.generation(scope).await?;
        // One import at a time into a scope, in any process: a second finds the claim.
        let claim = new_id("import");
        self.store
            .claim_import(scope, &claim, now(), now() - IMPORT_CLAIM_STALE)
            .await?;
        let imported = self
            .import_claimed(scope, context, document, &claim, generation)
            .await;
        if let Err(error) = self.store.release_import(scope, &claim).await {
            tracing::warn!(error = %error, "releasing an import's claim failed; it goes stale");
        }
        imported
    }

    /// [`Cairn::import_scope`] once the scope is claimed: checks it is empty, then
    /// writes the document in parts, renewing the claim before each.
    async fn import_claimed(
        &self,
        scope: &Scope,
        context: &RequestContext,
        document: ScopeExport,
        claim: &str,
        generation: u64,
    ) -> Result<ImportReport> {
        self.require_empty(scope).await?;

        let mut ids: HashMap<String, String> = HashMap::new();
        for episode in &document.episodes {
            ids.insert(episode.id.clone(), new_id("epi"));
        }
        for fact in &document.facts {
            ids.insert(fact.id.clone(), new_id("fact"));
        }
        for playbook in &document.playbooks {
            ids.insert(playbook.id.clone(), new_id("pb"));
        }
        for tombstone in &document.tombstones {
            ids.insert(tombstone.id.clone(), new_id("tomb"));
        }
        for decision in &document.decisions {
            ids.insert(decision.id.clone(), new_id("dec"));
        }
        // References to records the export does not hold (a forgotten fact named by a
        // tombstone or a decision) keep their old id: they point at nothing either way.
        let map = |id: &str| ids.get(id).cloned().unwrap_or_else(|| id.to_owned());

        let episode_vectors = self
            .embed_batched(
                document
                    .episodes
                    .iter()
                    .map(|episode| episode.text.clone())
                    .collect(),
            )
            .await?;
        let fact_vectors = self
            .embed_batched(document.facts.iter().map(|fact| fact.text.clone()).collect())
            .await?;

        let mut changes = Vec::new();
        let episodes: Vec<Episode> = document
            .episodes
            .iter()
            .zip(episode_vectors)
            .map(|(episode, embedding)| Episode {
                id: map(&episode.id),
                session_id: episode.session_id.clone(),
                text: episode.text.clone(),
                occurred_at: episode.occurred_at,
                ingested_at: episode.ingested_at,
                embedding,
            })
            .collect();
        for chunk in episodes.chunks(CHANGES_PER_COMMIT) {
            changes.push(Change::InsertEpisodes(chunk.to_vec()));
        }
        for (fact, embedding) in document.facts.iter().zip(fact_vectors) {
            // A write that lands during the import holds the value once: the write or
            // the import's part, whichever commits second, is refused as the duplicate.
            if fact.status == FactStatus::Active {
                changes.push(Change::RequireNoActiveValue {
                    fingerprint: cairn_core::text::fingerprint(&fact.text),
                });
            }
            changes.push(Change::InsertFact(Fact {
                id: map(&fact.id),
                fact_type: fact.fact_type,
                text: fact.text.clone(),
                confidence: fact.confidence,
                status: fact.status,
                source_episode_ids: fact.source_episode_ids.iter().map(|id| map(id)).collect(),
                source_span: fact.source_span.clone(),
                created_at: fact.created_at,
                superseded_at: fact.superseded_at,
                superseded_by: fact.superseded_by.as_deref().map(map),
                retracted_at: fact.retracted_at,
                retraction_reason: fact.retraction_reason.clone(),
                valid_from: fact.valid_from,
                valid_to: fact.valid_to,
                expires_at: fact.expires_at,
                last_used_at: fact.last_used_at,
                use_count: fact.use_count,
                embedding,
            }));
        }
        // Supersessions are also edges (the newer fact updates the older one).
        for fact in &document.facts {
            if let Some(newer) = &fact.superseded_by {
                changes.push(Change::InsertEdge(Edge {
                    from_fact_id: map(newer),
                    to_fact_id: map(&fact.id),
                    kind: EdgeKind::Updates,
                    created_at: fact.superseded_at.unwrap_or(fact.created_at),
                }));
            }
        }
        let mut playbook_versions = 0;
        for exported in &document.playbooks {
            let texts: Vec<String> = exported
                .versions
                .iter()
                .map(|version| playbook_of(&map(&exported.id), version, None).searchable_text())
                .collect();
            let vectors = self.embed_batched(texts).await?;
            let mut previous: Option<u32> = None;
            for (version, embedding) in exported.versions.iter().zip(vectors) {
                let playbook = playbook_of(&map(&exported.id), version, embedding);
                playbook_versions += 1;
                changes.push(match previous {
                    None => Change::InsertPlaybook(playbook),
                    Some(expected_version) => Change::AppendPlaybookVersion {
                        expected_version,
                        playbook,
                    },
                });
                previous = Some(version.version);
            }
        }
        for tombstone in &document.tombstones {
            changes.push(Change::InsertTombstone(Tombstone {
                id: map(&tombstone.id),
                fingerprint: tombstone.fingerprint.clone(),
                fact_id: map(&tombstone.fact_id),
                reason: tombstone.reason,
                created_at: tombstone.created_at,
                lifted_at: tombstone.lifted_at,
            }));
        }
        for review in &document.reviews {
            let fact = document.facts.iter().find(|fact| fact.id == review.fact_id);
            changes.push(Change::InsertReview(Review {
                id: new_id("rev"),
                kind: review.kind,
                fact_id: map(&review.fact_id),
                target_id: review.target_id.as_deref().map(map),
                rule: review.rule.clone(),
                reason: review.reason.clone(),
                decision_id: map(&review.decision_id),
                evidence_episode_ids: review.evidence_episode_ids.iter().map(|id| map(id)).collect(),
                fingerprint: cairn_core::text::fingerprint(fact.map_or("", |fact| fact.text.as_str())),
                // Imported history says so wherever it is shown: it was not proposed
                // here, by that subject, but brought in by this import.
                origin: imported(&review.origin),
                proposed_by: imported(&review.proposed_by),
                created_at: review.created_at,
                status: ReviewStatus::Pending,
                resolved_at: None,
                resolved_by: None,
                note: None,
            }));
        }
        let decisions: Vec<Decision> = document
            .decisions
            .iter()
            .map(|decision| Decision {
                id: map(&decision.id),
                kind: decision.kind,
                reason: decision.reason.clone(),
                fact_id: decision.fact_id.as_deref().map(map),
                target_ids: decision.target_ids.iter().map(|id| map(id)).collect(),
                origin: imported(&decision.origin),
                created_at: decision.created_at,
            })
            .collect();

        let report = ImportReport {
            episodes: document.episodes.len(),
            facts: document.facts.len(),
            playbooks: document.playbooks.len(),
            playbook_versions,
            tombstones: document.tombstones.len(),
            decisions: decisions.len(),
            reviews: document.reviews.len(),
        };
        // The history the document brings (decisions, and the subjects it says
        // proposed its held changes) is audited with the import that brought it.
        let mut proposers: Vec<&str> = document
            .reviews
            .iter()
            .map(|review| review.proposed_by.as_str())
            .collect();
        proposers.sort_unstable();
        proposers.dedup();
        proposers.truncate(20);
        let detail = serde_json::json!({
            "format": FORMAT,
            "exported_from": { "tenant": document.tenant, "user": document.user },
            "exported_at": document.exported_at,
            "records": report,
            "history": { "decisions": report.decisions, "reviews": report.reviews,
                         "proposed_by": proposers, "origin": IMPORTED },
        });
        let mut decisions = decisions.into_iter();
        let mut part = 0;
        let mut pending = changes.into_iter().peekable();
        while pending.peek().is_some() || decisions.len() > 0 {
            part += 1;
            let mut set = ChangeSet::new(audit_event(
                scope,
                context,
                "user.import",
                Vec::new(),
                if part == 1 {
                    detail.clone()
                } else {
                    serde_json::json!({ "part": part })
                },
            ));
            self.store
                .claim_import(scope, claim, now(), now() - IMPORT_CLAIM_STALE)
                .await?;
            set.changes.push(Change::RequireGeneration(generation));
            set.changes.extend(pending.by_ref().take(CHANGES_PER_COMMIT));
            // A value's precondition commits with its fact.
            if matches!(set.changes.last(), Some(Change::RequireNoActiveValue { .. }))
                && let Some(fact) = pending.next()
            {
                set.changes.push(fact);
            }
            set.decisions.extend(decisions.by_ref().take(CHANGES_PER_COMMIT));
            self.store.commit(scope, set).await?;
        }
        if document.consolidated_episodes > 0 {
            self.mark_consolidated(scope, context, document.consolidated_episodes, generation)
                .await?;
        }
        tracing::info!(tenant = %scope.tenant(), facts = report.facts, episodes = report.episodes, "scope imported");
        Ok(report)
    }

    /// Writes each mem0 memory as a fact through the write gates. The whole document is
    /// checked first: memories of another user, empty or oversized text, or unreadable
    /// timestamps refuse the import before anything is written.
    pub async fn import_mem0(
        &self,
        scope: &Scope,
        context: &RequestContext,
        document: Mem0Document,
    ) -> Result<Mem0ImportReport> {
        let memories = match document {
            Mem0Document::Results { results: list }
            | Mem0Document::Memories { memories: list }
            | Mem0Document::List(list) => list,
        };
        let mut inputs = Vec::with_capacity(memories.len());
        for (index, memory) in memories.iter().enumerate() {
            let field = |name: &str| format!("results[{index}].{name}");
            if let Some(user) = &memory.user_id
                && user != scope.user().as_str()
            {
                return Err(Error::invalid(
                    field("user_id"),
                    format!("belongs to user {user:?}, not {:?}", scope.user().as_str()),
                ));
            }
            let text = validate::text(&field("memory"), &memory.memory, self.settings.max_text_chars)?;
            let created_at = memory
                .created_at
                .as_deref()
                .map(|at| mem0_time(at).ok_or_else(|| Error::invalid(field("created_at"), "not a timestamp")))
                .transpose()?;
            if let Some(at) = memory.updated_at.as_deref()
                && mem0_time(at).is_none()
            {
                return Err(Error::invalid(field("updated_at"), "not a timestamp"));
            }
            let fact_type = memory
                .metadata
                .as_ref()
                .and_then(|metadata| metadata.fact_type.as_deref())
                .map(FactType::parse)
                .transpose()
                .map_err(|_| Error::invalid(field("metadata.fact_type"), "not a fact type"))?;
            inputs.push(FactInput {
                text,
                fact_type,
                // When mem0 learned it: the earliest the fact is known to hold.
                valid_from: created_at.filter(|at| *at <= now()),
                ..FactInput::default()
            });
        }
        let mut report = Mem0ImportReport::default();
        for input in inputs {
            match self.write_fact(scope, context, input).await {
                Ok(outcome) if outcome.created => report.created += 1,
                Ok(_) => report.duplicates += 1,
                Err(Error::Tombstoned { .. }) => report.tombstoned += 1,
                Err(Error::Conflict {
                    code: cairn_core::ErrorCode::Duplicate,
                    ..
                }) => report.duplicates += 1,
                Err(error) => return Err(error),
            }
        }
        Ok(report)
    }

    /// Opens the document's sealed tombstones (see `sealed.rs`) into the values they
    /// block. A value written unsealed (`sha256:…`, as files made before sealing) is
    /// taken as it is; one sealed under another key refuses the import.
    async fn open_tombstones(&self, scope: &Scope, document: &mut ScopeExport) -> Result<()> {
        if document.tombstones.is_empty() {
            return Ok(());
        }
        let sealer = self.sealer(scope).await?;
        for (index, tombstone) in document.tombstones.iter_mut().enumerate() {
            if tombstone.fingerprint.starts_with(crate::sealed::SEALED) {
                tombstone.fingerprint = sealer.open(&tombstone.fingerprint).ok_or_else(|| {
                    Error::invalid(
                        format!("tombstones[{index}].fingerprint"),
                        "is sealed with another key: exports move between services that share CAIRN_EXPORT_KEY",
                    )
                })?;
            }
            let raw = tombstone.fingerprint.strip_prefix("sha256:").unwrap_or_default();
            if raw.len() != 64 || !raw.bytes().all(|byte| byte.is_ascii_hexdigit()) {
                return Err(Error::invalid(
                    format!("tombstones[{index}].fingerprint"),
                    "is neither sealed nor a sha256 fingerprint",
                ));
            }
        }
        Ok(())
    }

    /// Checks a Cairn export whole: its format, texts, unique ids and references.
    fn check_export(&self, document: &ScopeExport) -> Result<()> {
        if document.format != FORMAT {
            return Err(Error::invalid("format", format!("must be {FORMAT:?}")));
        }
        if document.version != VERSION {
            return Err(Error::invalid(
                "version",
                format!("this build reads version {VERSION}, not {}", document.version),
            ));
        }
        if document.consolidated_episodes > document.episodes.len() {
            return Err(Error::invalid(
                "consolidated_episodes",
                "is more than the episodes the document holds",
            ));
        }
        let limit = self.settings.max_text_chars;
        let mut seen = HashSet::new();
        let mut unique = |field: String, id: &str| {
            if id.is_empty() || !seen.insert(id.to_owned()) {
                return Err(Error::invalid(field, "ids must be present and unique"));
            }
            Ok(())
        };
        for (index, episode) in document.episodes.iter().enumerate() {
            unique(format!("episodes[{index}].id"), &episode.id)?;
            validate::text(&format!("episodes[{index}].text"), &episode.text, limit)?;
            validate::label(
                &format!("episodes[{index}].session_id"),
                episode.session_id.as_deref(),
            )?;
        }
        // Every record is held to the limits of the route that writes its kind.
        let optional = |field: String, value: Option<&String>| match value {
            Some(value) => validate::text(&field, value, limit).map(|_| ()),
            None => Ok(()),
        };
        for (index, fact) in document.facts.iter().enumerate() {
            unique(format!("facts[{index}].id"), &fact.id)?;
            validate::text(&format!("facts[{index}].text"), &fact.text, limit)?;
            validate::confidence(Some(fact.confidence))?;
            optional(format!("facts[{index}].source_span"), fact.source_span.as_ref())?;
            optional(
                format!("facts[{index}].retraction_reason"),
                fact.retraction_reason.as_ref(),
            )?;
        }
        for (index, playbook) in document.playbooks.iter().enumerate() {
            unique(format!("playbooks[{index}].id"), &playbook.id)?;
            if playbook.versions.is_empty() {
                return Err(Error::invalid(
                    format!("playbooks[{index}].versions"),
                    "must not be empty",
                ));
            }
            for (at, version) in playbook.versions.iter().enumerate() {
                let field = format!("playbooks[{index}].versions[{at}]");
                validate::text(&format!("{field}.name"), &version.name, limit)?;
                validate::text(&format!("{field}.trigger"), &version.trigger, limit)?;
                validate::steps(&format!("{field}.steps"), &version.steps, limit)?;
                if at > 0 && version.version <= playbook.versions[at - 1].version {
                    return Err(Error::invalid(format!("{field}.version"), "versions must ascend"));
                }
            }
        }
        for (index, tombstone) in document.tombstones.iter().enumerate() {
            unique(format!("tombstones[{index}].id"), &tombstone.id)?;
        }
        for (index, decision) in document.decisions.iter().enumerate() {
            unique(format!("decisions[{index}].id"), &decision.id)?;
            validate::text(&format!("decisions[{index}].reason"), &decision.reason, limit)?;
            validate::label(&format!("decisions[{index}].origin"), Some(&decision.origin))?;
        }
        // Each pending fact waits on exactly one review, and each review on a pending fact.
        let mut reviewed = HashSet::new();
        for (index, review) in document.reviews.iter().enumerate() {
            unique(format!("reviews[{index}].id"), &review.id)?;
            validate::text(&format!("reviews[{index}].reason"), &review.reason, limit)?;
            validate::label(&format!("reviews[{index}].rule"), Some(&review.rule))?;
            validate::label(&format!("reviews[{index}].origin"), Some(&review.origin))?;
            validate::label(
                &format!("reviews[{index}].proposed_by"),
                Some(&review.proposed_by),
            )?;
            let pending = document
                .facts
                .iter()
                .any(|fact| fact.id == review.fact_id && fact.status == FactStatus::Pending);
            if !pending || !reviewed.insert(review.fact_id.as_str()) {
                return Err(Error::invalid(
                    format!("reviews[{index}].fact_id"),
                    "must name a pending fact of the document, once",
                ));
            }
            let needs_target = review.kind != ReviewKind::NewFact;
            if needs_target != review.target_id.is_some() {
                return Err(Error::invalid(
                    format!("reviews[{index}].target_id"),
                    "names what a supersession, retraction or lift changes, and only then",
                ));
            }
        }
        if let Some(index) = document
            .facts
            .iter()
            .position(|fact| fact.status == FactStatus::Pending && !reviewed.contains(fact.id.as_str()))
        {
            return Err(Error::invalid(
                format!("facts[{index}].status"),
                "a pending fact needs its review in the document's reviews",
            ));
        }
        let facts: HashSet<&str> = document.facts.iter().map(|fact| fact.id.as_str()).collect();
        let episodes: HashSet<&str> = document
            .episodes
            .iter()
            .map(|episode| episode.id.as_str())
            .collect();
        // A value the document's own unlifted tombstones refuse is never active in it.
        let refused: HashSet<&str> = document
            .tombstones
            .iter()
            .filter(|tombstone| tombstone.lifted_at.is_none())
            .map(|tombstone| tombstone.fingerprint.as_str())
            .collect();
        let mut active = HashSet::new();
        for (index, fact) in document.facts.iter().enumerate() {
            if fact.status == FactStatus::Active
                && refused.contains(cairn_core::text::fingerprint(&fact.text).as_str())
            {
                return Err(Error::invalid(
                    format!("facts[{index}].text"),
                    "an unlifted tombstone of the document refuses this value",
                ));
            }
            if let Some(newer) = &fact.superseded_by
                && !facts.contains(newer.as_str())
            {
                return Err(Error::invalid(
                    format!("facts[{index}].superseded_by"),
                    "names a fact the document does not hold",
                ));
            }
            if let Some(source) = fact
                .source_episode_ids
                .iter()
                .find(|id| !episodes.contains(id.as_str()))
            {
                return Err(Error::invalid(
                    format!("facts[{index}].source_episode_ids"),
                    format!("{source} is not an episode of the document"),
                ));
            }
            if fact.status == FactStatus::Active && !active.insert(cairn_core::text::fingerprint(&fact.text))
            {
                return Err(Error::invalid(
                    format!("facts[{index}].text"),
                    "another active fact holds the same value",
                ));
            }
        }
        Ok(())
    }

    /// A Cairn import goes into an empty scope only: merging two histories would break
    /// the invariants each of them keeps.
    async fn require_empty(&self, scope: &Scope) -> Result<()> {
        let one = PageRequest {
            limit: 1,
            cursor: None,
        };
        // An ingest that just answered counts.
        self.store.make_ingests_searchable().await?;
        let holds_memory = !self
            .store
            .list_episodes(scope, None, &one)
            .await?
            .items
            .is_empty()
            || !self
                .store
                .list_facts(scope, StatusFilter::All, now(), &one)
                .await?
                .items
                .is_empty()
            || !self.store.list_playbooks(scope, &one).await?.items.is_empty()
            || !self.store.list_tombstones(scope).await?.is_empty();
        if holds_memory {
            return Err(Error::Conflict {
                code: cairn_core::ErrorCode::ScopeNotEmpty,
                message: "an import goes into a user with no memory; erase the user first".into(),
            });
        }
        Ok(())
    }

    /// Moves the (new, empty) scope's watermark past its first `count` episodes.
    async fn mark_consolidated(
        &self,
        scope: &Scope,
        context: &RequestContext,
        count: usize,
        generation: u64,
    ) -> Result<()> {
        let expected = self.store.watermark(scope).await?;
        let mut seen = 0;
        let mut position = expected;
        while seen < count {
            let batch = self
                .store
                .episodes_after(scope, position, PAGE.min(count - seen))
                .await?;
            let Some(last) = batch.last() else { break };
            position = last.position;
            seen += batch.len();
        }
        let event = audit_event(
            scope,
            context,
            "user.import",
            Vec::new(),
            serde_json::json!({ "consolidated_episodes": count }),
        );
        self.store
            .commit(
                scope,
                ChangeSet::new(event)
                    .with(Change::RequireGeneration(generation))
                    .with(Change::MoveWatermark {
                        expected,
                        to: position,
                    }),
            )
            .await
    }

    async fn embed_batched(&self, texts: Vec<String>) -> Result<Vec<Option<Vec<f32>>>> {
        let mut vectors = Vec::with_capacity(texts.len());
        for chunk in texts.chunks(EMBED_BATCH) {
            vectors.extend(self.embed_all(chunk.to_vec()).await?);
        }
        Ok(vectors)
    }
}

/// Every item of a listing, a page of [`PAGE`] at a time, in the listing's order.
async fn every_page<T, Fut>(mut fetch: impl FnMut(PageRequest) -> Fut) -> Result<Vec<T>>
where
    Fut: std::future::Future<Output = Result<Page<T>>>,
{
    let mut items = Vec::new();
    let mut cursor = None;
    loop {
        let page = fetch(PageRequest { limit: PAGE, cursor }).await?;
        items.extend(page.items);
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(items),
        }
    }
}

fn exported_episode(episode: Episode) -> ExportedEpisode {
    ExportedEpisode {
        id: episode.id,
        session_id: episode.session_id,
        text: episode.text,
        occurred_at: episode.occurred_at,
        ingested_at: episode.ingested_at,
    }
}

fn exported_fact(fact: Fact) -> ExportedFact {
    ExportedFact {
        id: fact.id,
        fact_type: fact.fact_type,
        text: fact.text,
        confidence: fact.confidence,
        status: fact.status,
        source_episode_ids: fact.source_episode_ids,
        source_span: fact.source_span,
        created_at: fact.created_at,
        superseded_at: fact.superseded_at,
        superseded_by: fact.superseded_by,
        retracted_at: fact.retracted_at,
        retraction_reason: fact.retraction_reason,
        valid_from: fact.valid_from,
        valid_to: fact.valid_to,
        expires_at: fact.expires_at,
        last_used_at: fact.last_used_at,
        use_count: fact.use_count,
    }
}

fn exported_version(playbook: Playbook) -> ExportedPlaybookVersion {
    ExportedPlaybookVersion {
        version: playbook.version,
        name: playbook.name,
        trigger: playbook.trigger,
        steps: playbook.steps,
        success_count: playbook.success_count,
        failure_count: playbook.failure_count,
        created_at: playbook.created_at,
        updated_at: playbook.updated_at,
        last_used_at: playbook.last_used_at,
        use_count: playbook.use_count,
    }
}

fn playbook_of(id: &str, version: &ExportedPlaybookVersion, embedding: Option<Vec<f32>>) -> Playbook {
    Playbook {
        id: id.to_owned(),
        name: version.name.clone(),
        trigger: version.trigger.clone(),
        steps: version.steps.clone(),
        version: version.version,
        success_count: version.success_count,
        failure_count: version.failure_count,
        created_at: version.created_at,
        updated_at: version.updated_at,
        last_used_at: version.last_used_at,
        use_count: version.use_count,
        embedding,
    }
}

/// A mem0 timestamp: RFC 3339, or ISO 8601 without an offset (read as UTC).
fn mem0_time(text: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(text)
        .map(|at| at.with_timezone(&Utc))
        .ok()
        .or_else(|| {
            NaiveDateTime::parse_from_str(text, "%Y-%m-%dT%H:%M:%S%.f")
                .ok()
                .map(|naive| naive.and_utc())
        })
}

#[cfg(test)]
mod tests {
    use super::{Mem0Document, mem0_time};

    #[test]
    fn mem0_timestamps_with_and_without_offsets() {
        let offset = mem0_time("2024-07-20T01:30:36.275141-07:00").expect("offset");
        assert_eq!(offset.to_rfc3339(), "2024-07-20T08:30:36.275141+00:00");
        let naive = mem0_time("2024-07-26T10:29:36.630547").expect("naive");
        assert_eq!(naive.to_rfc3339(), "2024-07-26T10:29:36.630547+00:00");
        assert!(mem0_time("last tuesday").is_none());
    }

    /// Each shape of a mem0 document is read by its first token, other keys skipped,
    /// and only a string `fact_type` of the metadata kept.
    #[test]
    fn mem0_documents_are_read_by_their_shape() {
        let memory = r#"{"memory": "The user likes tea", "hash": "x", "metadata": {"fact_type": "preference", "deep": {"a": [1, 2, {"b": null}]}}}"#;
        let read = |text: String| serde_json::from_str::<Mem0Document>(&text);
        let memories = |document: Mem0Document| match document {
            Mem0Document::Results { results: list }
            | Mem0Document::Memories { memories: list }
            | Mem0Document::List(list) => list,
        };
        for text in [
            format!(r#"{{"total": 1, "results": [{memory}], "relations": [{{"x": 1}}]}}"#),
            format!(r#"{{"memories": [{memory}]}}"#),
            format!("[{memory}]"),
        ] {
            let list = memories(read(text.clone()).expect(&text));
            assert_eq!(list.len(), 1, "{text}");
            assert_eq!(list[0].memory, "The user likes tea");
            assert_eq!(
                list[0]
                    .metadata
                    .as_ref()
                    .and_then(|metadata| metadata.fact_type.as_deref()),
                Some("preference")
            );
        }
        for metadata in [
            r#""a string""#,
            "[1, 2]",
            "7",
            "true",
            "null",
            r#"{"fact_type": 3}"#,
        ] {
            let text = format!(r#"[{{"memory": "m", "metadata": {metadata}}}]"#);
            let list = memories(read(text.clone()).expect(&text));
            assert_eq!(
                list[0]
                    .metadata
                    .as_ref()
                    .and_then(|metadata| metadata.fact_type.clone()),
                None,
                "{text}"
            );
        }
        for refused in [
            r#"{"total": 0}"#,
            r#"{"results": [], "memories": []}"#,
            "7",
            r#""text""#,
        ] {
            assert!(read(refused.to_owned()).is_err(), "{refused}");
        }
    }
}
