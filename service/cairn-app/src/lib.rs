//! Cairn's use cases. REST handlers and MCP tools both call these functions; nothing
//! here knows about HTTP, JSON wire formats or a particular store.

mod answer;
mod consolidation;
mod entities;
mod episodes;
mod facts;
mod gates;
mod playbooks;
mod portability;
mod profile;
mod recall;
mod reembed;
mod review;
mod sealed;
mod usage;
mod validate;

pub use answer::{Answer, AnswerRequest};
pub use consolidation::{
    ConsolidateOptions, ConsolidationOutcome, ConsolidationSettings, Consolidator, JobRun, OfflineExtractor,
    OfflineJudge,
};
pub use entities::{Entity, EntityKind};
pub use episodes::{ConsolidateMode, ConsolidationReport, IngestOutcome, IngestRequest, Message, Role};
pub use facts::{Contradiction, FactInput, FactWriteOutcome};
pub use playbooks::{PlaybookInput, PlaybookVersionInput};
pub use portability::{
    ExportedDecision, ExportedEpisode, ExportedFact, ExportedPlaybook, ExportedPlaybookVersion,
    ExportedTombstone, ImportReport, Mem0Document, Mem0ImportReport, Mem0Memory, Mem0Metadata, ScopeExport,
};
pub use profile::{Profile, ProfileRequest};
pub use recall::{Explanation, Priors, RecallHit, RecallRequest, RecallResult, rrf};
pub use reembed::ReembedProgress;
pub use review::{ReviewItem, ReviewOutcome, ReviewPolicies, ReviewPolicy, TenantQueue};
pub use usage::UsageLog;

use cairn_core::{
    AuditEvent, Decision, DecisionKind, Embedder, ErasureReceipt, MemoryStore, Page, PageRequest, Reranker,
    Result, Scope, TextQuery, Tombstone, new_id,
};
use chrono::{DateTime, Utc};
use std::sync::Arc;

/// How the retrieval legs of a tier are combined.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fusion {
    /// Reciprocal rank fusion: each leg adds `weight / (rrf_k + rank)`.
    ReciprocalRank,
    /// A weighted sum of each leg's scores scaled to [0, 1] within the leg (BM25 by its
    /// best score, cosine by min-max), so score gaps count, not only ranks.
    ScaledScores,
}

/// Limits and tunables of the use cases, set from the service configuration.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Longest accepted text of a message, fact, trigger or step, in characters.
    pub max_text_chars: usize,
    /// Most messages accepted in one ingest call.
    pub max_messages: usize,
    /// Candidates taken from each retrieval leg before fusion.
    pub candidates_per_leg: usize,
    /// Candidates of the vector legs, when not `candidates_per_leg`. Twenty measured
    /// the same as fifty on LoCoMo (evals/run) at about two thirds of a cluster's kNN
    /// time.
    pub knn_candidates: Option<usize>,
    /// The reciprocal rank fusion constant.
    pub rrf_k: f64,
    pub fusion: Fusion,
    /// Weight of the BM25 legs in fusion.
    pub bm25_weight: f64,
    /// Weight of the vector legs in fusion.
    pub knn_weight: f64,
    /// BM25 weight of an episode's context (the episodes before and after it in its session)
    /// against its own text; 0 searches episodes by their own text alone.
    pub episode_context_weight: f64,
    /// Largest `k` a recall may ask for.
    pub max_k: usize,
    /// How many of the best fused hits a configured reranker rescores.
    pub rerank_candidates: usize,
    /// Recency, usage and confidence multipliers on fused scores (off by default).
    pub priors: Priors,
    /// How much a hit that names the people, places and things the query names gains:
    /// its fused score is multiplied by `1 + name_boost × (share of the query's names
    /// it names)`, over every candidate before the cut. 0 turns it off.
    pub name_boost: f64,
    /// How much a hit whose event time falls in the time the query asks about ("in
    /// June", "on May 3, 2023", "last week"; see `cairn_offline::when`) gains: its fused
    /// score is multiplied by `1 + time_boost`, over every candidate before the cut.
    /// 0 turns it off.
    pub time_boost: f64,
    /// Whether recall counts returned facts and playbooks as used (in memory, written in
    /// batches by [`Cairn::flush_usage`]).
    pub bump_usage_on_recall: bool,
    pub consolidation: ConsolidationSettings,
    /// The cosine between a question and its best memory at or above which an answer
    /// is known (see `answer.rs`).
    pub answer_min_similarity: f64,
    /// Which outcomes wait for a person, per tenant (none by default).
    pub review: ReviewPolicies,
    /// The key that seals tombstoned values in exports (`sealed.rs`); none: each
    /// tenant's key kept in the store.
    pub export_key: Option<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_text_chars: 8_000,
            max_messages: 100,
            candidates_per_leg: 50,
            knn_candidates: Some(20),
            rrf_k: 60.0,
            // Measured on LoCoMo (evals/run): scaled-score fusion weighted towards BM25
            // beats BM25 alone, where plain reciprocal rank fusion falls below it.
            fusion: Fusion::ScaledScores,
            bm25_weight: 0.7,
            knn_weight: 0.3,
            episode_context_weight: TextQuery::CONTEXT_WEIGHT,
            max_k: 100,
            bump_usage_on_recall: true,
            priors: Priors::default(),
            // Measured on LoCoMo (evals/run): chosen on conversations 1-3, held on 4-5.
            name_boost: 0.5,
            // Measured on LoCoMo (evals/run --only "time boost"): chosen on
            // conversations 1-3, held on 4-5.
            time_boost: 2.0,
            rerank_candidates: 20,
            consolidation: ConsolidationSettings::default(),
            // Calibrated on LoCoMo (evals/run --answer).
            answer_min_similarity: 0.5,
            review: ReviewPolicies::default(),
            export_key: None,
        }
    }
}

/// Who asked, for the audit trail: the scope carries the subject, this the request.
#[derive(Clone, Debug)]
pub struct RequestContext {
    pub request_id: String,
}

/// The memory service: every use case, over one store.
#[derive(Clone)]
pub struct Cairn {
    store: Arc<dyn MemoryStore>,
    embedder: Option<Arc<dyn Embedder>>,
    reranker: Option<Arc<dyn Reranker>>,
    /// Writes answers from recalled memories (an LLM); without one, answers are extractive.
    answerer: Option<Arc<dyn cairn_core::Answerer>>,
    consolidator: Consolidator,
    settings: Settings,
    /// Uses noted by recalls, written in batches by [`Cairn::flush_usage`].
    usage: Arc<UsageLog>,
    /// Single-valued slots by meaning, which recall uses to notice two current facts
    /// holding one slot (with the embedder; see `recall.rs`).
    slots: Option<Arc<cairn_offline::SlotMeaning>>,
}

impl Cairn {
    /// The service over a store, with an embedder for the vector legs (without one,
    /// records are stored unembedded and recall runs on the text legs alone).
    pub fn new(store: Arc<dyn MemoryStore>, embedder: Option<Arc<dyn Embedder>>, settings: Settings) -> Self {
        let slots = embedder
            .clone()
            .map(|embedder| Arc::new(cairn_offline::SlotMeaning::new(embedder)));
        Cairn {
            store,
            consolidator: Consolidator::offline(embedder.clone()),
            embedder,
            reranker: None,
            answerer: None,
            slots,
            settings,
            usage: Arc::default(),
        }
    }

    /// Replaces the offline extractor and judge (with an LLM provider's).
    pub fn with_consolidator(mut self, consolidator: Consolidator) -> Self {
        self.consolidator = consolidator;
        self
    }

    /// Adds a reranking stage after fusion. When it fails, recall keeps the fused order.
    pub fn with_reranker(mut self, reranker: Arc<dyn Reranker>) -> Self {
        self.reranker = Some(reranker);
        self
    }

    /// Answers are written by `answerer` from the recalled memories (see `answer.rs`).
    pub fn with_answerer(mut self, answerer: Arc<dyn cairn_core::Answerer>) -> Self {
        self.answerer = Some(answerer);
        self
    }

    /// How the embedder's cosines read on the reference scale of the thresholds by
    /// meaning (the reference scale itself without an embedder).
    pub(crate) fn similarity_scale(&self) -> cairn_core::SimilarityScale {
        self.embedder
            .as_ref()
            .map_or(cairn_core::SimilarityScale::REFERENCE, |embedder| {
                embedder.similarity_scale()
            })
    }

    /// The local embedding model's id and dimension, when one is loaded.
    pub fn embedding_space(&self) -> Option<(String, usize)> {
        self.embedder
            .as_ref()
            .map(|embedder| (embedder.model_id().to_owned(), embedder.dimension()))
    }

    /// Checks the store's vectors were made by this embedder, recording it on first use.
    pub async fn claim_embedding_space(&self) -> Result<()> {
        match &self.embedder {
            Some(embedder) => {
                self.store
                    .claim_embedding_space(embedder.model_id(), embedder.dimension())
                    .await
            }
            None => Ok(()),
        }
    }

    /// Whether a local embedding model is loaded.
    pub fn has_embedder(&self) -> bool {
        self.embedder.is_some()
    }

    /// Embeds texts when an embedder is configured; `None` for each text otherwise.
    pub(crate) async fn embed_all(&self, texts: Vec<String>) -> Result<Vec<Option<Vec<f32>>>> {
        match &self.embedder {
            Some(embedder) => Ok(embedder.embed(texts).await?.into_iter().map(Some).collect()),
            None => Ok(vec![None; texts.len()]),
        }
    }

    pub(crate) async fn embed_one(&self, text: &str) -> Result<Option<Vec<f32>>> {
        Ok(self.embed_all(vec![text.to_owned()]).await?.pop().flatten())
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Records a one-time key (a console login ticket's id) as used until `until`:
    /// `true` the first time across every process sharing the store, `false` after.
    pub async fn use_once(&self, key: &str, until: DateTime<Utc>) -> Result<bool> {
        self.store.use_once(key, now(), until).await
    }

    /// Takes between `least` and `want` cells of the tenant's request rate from the
    /// bucket the store keeps for every process; `None` when it keeps none (see
    /// `MemoryStore::take_rate`).
    pub async fn take_rate(
        &self,
        tenant: &cairn_core::TenantLimits,
        quota: cairn_core::RateQuota,
        want: u32,
        least: u32,
    ) -> Result<Option<cairn_core::RateGrant>> {
        self.store.take_rate(tenant, quota, want, least, now()).await
    }

    /// Whether the store answers.
    pub async fn ready(&self) -> Result<()> {
        self.store.ping().await
    }

    /// What the store reports wrong while still serving (see `MemoryStore::degraded`).
    pub fn degraded(&self) -> Option<String> {
        self.store.degraded()
    }

    pub async fn decisions(
        &self,
        scope: &Scope,
        kind: Option<DecisionKind>,
        page: &PageRequest,
    ) -> Result<Page<Decision>> {
        self.store.list_decisions(scope, kind, page).await
    }

    /// The scope's tombstones that still refuse their value, newest first: a fingerprint,
    /// the fact it came from, why and when (never the value itself).
    pub async fn tombstones(&self, scope: &Scope) -> Result<Vec<Tombstone>> {
        self.store.list_tombstones(scope).await
    }

    /// The tenant's users that hold memory, by user id, with counts and last activity.
    pub async fn users(
        &self,
        tenant: &cairn_core::TenantScope,
        page: &PageRequest,
    ) -> Result<Page<cairn_core::UserSummary>> {
        if let Some(cursor) = &page.cursor {
            cairn_core::UserId::parse(cursor)
                .map_err(|_| cairn_core::Error::invalid("cursor", "not a cursor of this list"))?;
        }
        self.store.list_users(tenant, page).await
    }

    pub async fn audit_trail(&self, scope: &Scope, page: &PageRequest) -> Result<Page<AuditEvent>> {
        self.store.list_audit(scope, page).await
    }

    /// Erases everything of the scope across every tier and returns what was removed.
    pub async fn erase_user(&self, scope: &Scope, context: &RequestContext) -> Result<ErasureReceipt> {
        // The store's erasure is the fence: it advances the scope's generation before it
        // removes anything, and no commit that began before (a run, an ingest, an
        // import, a recovery, in any process) leaves anything behind it. In this
        // process, a run in progress also stops before its next commit, and none starts
        // until the scope is erased.
        let _runs_excluded = self.consolidator.exclude_runs(scope).await?;
        self.usage.forget(scope);
        let event = audit_event(scope, context, "user.erase", Vec::new(), serde_json::Value::Null);
        let receipt = self.store.erase_scope(scope, event).await?;
        tracing::info!(
            tenant = %scope.tenant(),
            facts = receipt.facts,
            episodes = receipt.episodes,
            "scope erased"
        );
        Ok(receipt)
    }
}

pub(crate) fn now() -> DateTime<Utc> {
    Utc::now()
}

pub(crate) fn audit_event(
    scope: &Scope,
    context: &RequestContext,
    action: &str,
    target_ids: Vec<String>,
    detail: serde_json::Value,
) -> AuditEvent {
    AuditEvent {
        id: new_id("aud"),
        at: now(),
        subject: scope.subject().to_owned(),
        tenant: scope.tenant().as_str().to_owned(),
        user: scope.user().as_str().to_owned(),
        action: action.to_owned(),
        target_ids,
        request_id: context.request_id.clone(),
        detail,
    }
}

pub(crate) fn decision(
    kind: DecisionKind,
    reason: impl Into<String>,
    fact_id: Option<String>,
    target_ids: Vec<String>,
) -> Decision {
    Decision {
        id: new_id("dec"),
        kind,
        reason: reason.into(),
        fact_id,
        target_ids,
        origin: "api".to_owned(),
        created_at: now(),
    }
}
