//! The storage port: what every backend (embedded, search cluster) must provide.
//!
//! Every method takes a [`Scope`] first. Mutations are expressed as a [`ChangeSet`]
//! that a backend applies atomically, checking each change's precondition (the record
//! is in this scope and in the expected state) and writing the audit events and
//! decisions in the same transaction. A change set cannot be built without an audit
//! event, so no mutation goes unaudited.

use crate::error::{Error, Result};
use crate::limits::{RateGrant, RateQuota, TenantLimits};
use crate::model::{
    AuditEvent, ConsolidationJob, Decision, DecisionKind, Episode, Fact, FactStatus, FactType, LoggedEpisode,
    Playbook, Review, ReviewKind, ReviewStatus, Tombstone,
};
use crate::scope::Scope;
use async_trait::async_trait;
use chrono::{DateTime, NaiveDate, Utc};

/// Where a move of the stored vectors to another embedding space stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reembedding {
    /// The space the stored vectors are in (`model/dimension`), if any was claimed.
    pub current: Option<String>,
    /// The space being moved to.
    pub target: String,
    /// Records with a vector built in the target space, and records still to build.
    pub built: u64,
    pub remaining: u64,
}

/// A record whose vector is to be built again: the text it is embedded from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToReembed {
    pub tier: Tier,
    pub id: String,
    pub text: String,
}

/// A vector built in the target space for the record of `tier` and `id`, from `text`
/// (a record whose text changed since is skipped).
#[derive(Clone, Debug, PartialEq)]
pub struct Reembedded {
    pub tier: Tier,
    pub id: String,
    pub text: String,
    pub vector: Vec<f32>,
}

/// The three memory tiers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    Episodic,
    Semantic,
    Procedural,
}

impl Tier {
    pub const ALL: [Tier; 3] = [Tier::Semantic, Tier::Episodic, Tier::Procedural];

    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Episodic => "episodic",
            Tier::Semantic => "semantic",
            Tier::Procedural => "procedural",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        Tier::ALL.into_iter().find(|tier| tier.as_str() == value)
    }
}

/// One state change, applied with its precondition checked inside the transaction.
#[derive(Clone, Debug)]
pub enum Change {
    InsertEpisodes(Vec<Episode>),
    InsertFact(Fact),
    /// Precondition: the fact is in scope (else `NotFound`) and active (else `not_active`).
    SupersedeFact {
        fact_id: String,
        superseded_by: String,
        at: DateTime<Utc>,
        /// When the old fact stopped holding in the world (event time, the new fact's
        /// `valid_from`): it becomes the old fact's `valid_to` when that is unset and
        /// later than its `valid_from`.
        valid_to: Option<DateTime<Utc>>,
    },
    /// Precondition: the fact is in scope and active, superseded or pending (a rejected
    /// review retracts its pending fact).
    RetractFact {
        fact_id: String,
        reason: Option<String>,
        at: DateTime<Utc>,
    },
    /// Erases the fact, its vector, its index entries, its edges and its reviews.
    /// Precondition: the fact is in scope.
    EraseFact {
        fact_id: String,
    },
    InsertEdge(crate::model::Edge),
    InsertTombstone(Tombstone),
    /// Precondition: the tombstone is in scope and not lifted.
    LiftTombstone {
        tombstone_id: String,
        at: DateTime<Utc>,
    },
    InsertPlaybook(Playbook),
    /// Precondition: the playbook is in scope and at `expected_version`.
    AppendPlaybookVersion {
        expected_version: u32,
        playbook: Playbook,
    },
    /// Precondition: the playbook is in scope.
    RecordPlaybookOutcome {
        playbook_id: String,
        success: bool,
        at: DateTime<Utc>,
    },
    /// Makes a pending fact active (an approved review) as learned at `at`: its
    /// `created_at` moves there, so reads as of an earlier time do not see it.
    /// Precondition: the fact is in scope (else `NotFound`) and pending (else
    /// `not_active`), and its value is not tombstoned (else `Tombstoned`).
    ActivateFact {
        fact_id: String,
        at: DateTime<Utc>,
    },
    InsertReview(Review),
    /// Records a reviewer's decision. Precondition: the review is in scope (else
    /// `NotFound`) and still pending (else the conflict `review_resolved`), so of two
    /// reviewers deciding at once exactly one commits.
    ResolveReview {
        review_id: String,
        status: ReviewStatus,
        at: DateTime<Utc>,
        by: String,
        note: Option<String>,
    },
    /// Queues a consolidation of the scope.
    EnqueueJob(ConsolidationJob),
    /// Removes finished jobs of the scope (ids not found are ignored: a replay is a no-op).
    CompleteJobs(Vec<String>),
    /// Makes a job of the scope due again at `at`, with no attempts counted and out of
    /// the dead letters; a lease that lasts past `at` stays (a worker is running the job
    /// now). Precondition: the job is in scope (else `NotFound`).
    RetryJob {
        job_id: String,
        at: DateTime<Utc>,
    },
    /// Precondition only: every listed episode is still stored in the scope (else the
    /// conflict `evidence_erased`). What was derived from episodes commits only while
    /// they exist, so nothing derived can be written after the scope is erased.
    RequireEpisodes(Vec<String>),
    /// Precondition only: no active fact of the scope has this value fingerprint (else
    /// the conflict `duplicate`), so of two identical writes racing, one is a duplicate.
    RequireNoActiveValue {
        fingerprint: String,
    },
    /// Precondition only: the scope has not been erased since its generation was read
    /// as `generation` ([`MemoryStore::generation`]), and no erasure of it is under
    /// way (else the conflict `scope_erased`). An operation that reads before it writes,
    /// or writes in several commits (a consolidation run, an import), carries the
    /// generation it started at, so an erasure in between fences everything it would
    /// still write.
    RequireGeneration(u64),
    /// Moves the scope's consolidation watermark. Precondition: it is still at
    /// `expected` (else `watermark_moved`), so two runs can never both apply a batch.
    MoveWatermark {
        expected: u64,
        to: u64,
    },
}

/// An atomic unit of mutation: changes, the decisions that explain them and at least
/// one audit event.
#[derive(Clone, Debug)]
pub struct ChangeSet {
    pub changes: Vec<Change>,
    pub decisions: Vec<Decision>,
    pub audit: Vec<AuditEvent>,
}

impl ChangeSet {
    pub fn new(audit: AuditEvent) -> Self {
        ChangeSet {
            changes: Vec::new(),
            decisions: Vec::new(),
            audit: vec![audit],
        }
    }

    pub fn with(mut self, change: Change) -> Self {
        self.changes.push(change);
        self
    }

    pub fn with_decision(mut self, decision: Decision) -> Self {
        self.decisions.push(decision);
        self
    }
}

/// A page request: at most `limit` items after the opaque `cursor`.
#[derive(Clone, Debug, Default)]
pub struct PageRequest {
    pub limit: usize,
    pub cursor: Option<String>,
}

/// Uses of one fact or playbook, counted since the last flush.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UseCount {
    pub id: String,
    pub count: u64,
    pub last_used_at: DateTime<Utc>,
}

#[derive(Clone, Debug)]
pub struct Page<T> {
    pub items: Vec<T>,
    /// Pass back to get the next page; `None` on the last page.
    pub next_cursor: Option<String>,
}

impl<T> Page<T> {
    /// The same page with each item turned into another.
    pub fn map<U>(self, item: impl FnMut(T) -> U) -> Page<U> {
        Page {
            items: self.items.into_iter().map(item).collect(),
            next_cursor: self.next_cursor,
        }
    }
}

/// Which facts a listing returns, judged at `as_of`.
#[derive(Clone, Copy, Debug)]
pub enum StatusFilter {
    Only(FactStatus),
    All,
}

/// What both retrieval legs restrict themselves to: one tier of the scope, records
/// current at `as_of`, optional fact types and session, and how many to return.
#[derive(Clone, Debug)]
pub struct SearchFilter {
    pub tier: Tier,
    pub as_of: DateTime<Utc>,
    /// Also return facts superseded by `as_of`.
    pub include_history: bool,
    /// Also return facts pending review.
    pub include_pending: bool,
    /// Event time: facts that held in the world at this time (their validity interval
    /// and expiry contain it), superseded since or not, and episodes said by then.
    /// Without it, validity and expiry are tested at `as_of`.
    pub valid_at: Option<DateTime<Utc>>,
    pub fact_types: Vec<FactType>,
    pub session_id: Option<String>,
    pub limit: usize,
    /// Whether hits must carry their embedding. `false` lets a store leave vectors out of
    /// what it reads (recall ranks by the scores alone; consolidation compares vectors).
    pub with_vectors: bool,
}

/// A full-text query, restricted by its filter inside the query.
#[derive(Clone, Debug)]
pub struct TextQuery {
    pub filter: SearchFilter,
    pub text: String,
    /// Episodes only: the weight of an episode's context (the episodes before and after
    /// it in its session) against its own text. 0 searches the text alone.
    pub context_weight: f64,
}

impl TextQuery {
    /// The default weight of an episode's context, chosen on the LoCoMo evaluation.
    pub const CONTEXT_WEIGHT: f64 = 0.5;

    /// A query with the default context weight.
    pub fn new(filter: SearchFilter, text: impl Into<String>) -> Self {
        TextQuery {
            filter,
            text: text.into(),
            context_weight: Self::CONTEXT_WEIGHT,
        }
    }

    /// Whether the query searches episodes' context: an episodic query with a positive,
    /// finite context weight.
    pub fn searches_context(&self) -> bool {
        self.filter.tier == Tier::Episodic && self.context_weight > 0.0 && self.context_weight.is_finite()
    }
}

/// A nearest-neighbour query, restricted by its filter before ranking (pre-filter).
#[derive(Clone, Debug)]
pub struct VectorQuery {
    pub filter: SearchFilter,
    /// A unit vector of the store's embedding dimension.
    pub vector: Vec<f32>,
}

/// A record of any tier.
#[derive(Clone, Debug)]
pub enum Memory {
    Episode(Episode),
    Fact(Fact),
    Playbook(Playbook),
}

impl Memory {
    pub fn id(&self) -> &str {
        match self {
            Memory::Episode(episode) => &episode.id,
            Memory::Fact(fact) => &fact.id,
            Memory::Playbook(playbook) => &playbook.id,
        }
    }

    pub fn tier(&self) -> Tier {
        match self {
            Memory::Episode(_) => Tier::Episodic,
            Memory::Fact(_) => Tier::Semantic,
            Memory::Playbook(_) => Tier::Procedural,
        }
    }
}

/// One match, best first; `score` is BM25 for text legs and cosine similarity for
/// vector legs (higher is better in both).
#[derive(Clone, Debug)]
pub struct TextHit {
    pub memory: Memory,
    pub score: f64,
}

/// One user of a tenant that holds memory, with what it holds and when it last changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserSummary {
    pub user: String,
    pub episodes: u64,
    /// Facts of every status.
    pub facts: u64,
    /// Facts whose stored status is active (some may have expired since).
    pub active_facts: u64,
    pub playbooks: u64,
    /// The latest write of the user: a record's time or an audit event's.
    pub last_activity: Option<DateTime<Utc>>,
}

/// What erasing a whole scope removed, per kind of record.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ErasureReceipt {
    pub episodes: u64,
    pub facts: u64,
    pub playbooks: u64,
    pub playbook_versions: u64,
    pub edges: u64,
    pub tombstones: u64,
    pub decisions: u64,
    pub jobs: u64,
    /// Reviews of every status, pending ones among them.
    pub reviews: u64,
}

/// A review with the user whose scope holds it (the tenant's queue spans users).
#[derive(Clone, Debug, PartialEq)]
pub struct UserReview {
    pub user: String,
    pub review: Review,
}

/// A tenant's review queue at a glance: pending reviews by kind, and the oldest.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReviewSummary {
    pub by_kind: Vec<(ReviewKind, u64)>,
    pub oldest: Option<DateTime<Utc>>,
}

impl ReviewSummary {
    pub fn total(&self) -> u64 {
        self.by_kind.iter().map(|(_, count)| count).sum()
    }
}

/// One tenant's queue of outcomes pending review: how many, and since when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantQueue {
    pub tenant: String,
    pub pending: u64,
    pub oldest: Option<DateTime<Utc>>,
}

/// The page cursor of a review listing (oldest first): the last item's time and id.
pub fn review_cursor(review: &Review) -> String {
    format!("{}.{}", review.created_at.timestamp_micros(), review.id)
}

/// Reads a [`review_cursor`]; a malformed one is a bad request.
pub fn parse_review_cursor(cursor: &str) -> Result<(i64, String)> {
    let invalid = || crate::error::Error::invalid("cursor", "not a cursor of this list");
    let (at, id) = cursor.split_once('.').ok_or_else(invalid)?;
    let at: i64 = at.parse().map_err(|_| invalid())?;
    if id.is_empty() || id.len() > 64 || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return Err(invalid());
    }
    Ok((at, id.to_owned()))
}

/// The storage port. Implementations must keep every read and write inside `scope`.
#[async_trait]
pub trait MemoryStore: Send + Sync + 'static {
    /// Succeeds when the backend answers.
    async fn ping(&self) -> Result<()>;

    /// What the last successful ping found wrong without failing (a search cluster
    /// serving with some replicas missing), for readiness reports.
    fn degraded(&self) -> Option<String> {
        None
    }

    /// Applies every change atomically, or none (returning the first failed precondition).
    async fn commit(&self, scope: &Scope, change_set: ChangeSet) -> Result<()>;

    /// Readies the commit that will insert `episodes` (not yet embedded), while they are
    /// embedded: a search cluster reserves their positions in the scope's log and reads
    /// the stored episodes that get them as context. The next commit inserting them uses
    /// what was readied; a commit that never comes leaves unused positions, which the
    /// log allows. By default there is nothing to ready.
    async fn prepare_episodes(&self, _scope: &Scope, _episodes: &[Episode]) -> Result<()> {
        Ok(())
    }

    /// Finishes the commits that a failure left half-applied and that are older than
    /// `older_than`, across every scope; returns how many. A backend whose commits are
    /// transactions has none and answers 0.
    async fn recover_commits(&self, older_than: std::time::Duration) -> Result<u64>;

    async fn get_fact(&self, scope: &Scope, fact_id: &str) -> Result<Option<Fact>>;

    /// The facts of the scope with these ids, in the order asked; ids not found in the
    /// scope are left out. By default one [`MemoryStore::get_fact`] each; a backend
    /// whose reads are round trips fetches them together.
    async fn get_facts(&self, scope: &Scope, fact_ids: &[String]) -> Result<Vec<Fact>> {
        let mut facts = Vec::with_capacity(fact_ids.len());
        for fact_id in fact_ids {
            facts.extend(self.get_fact(scope, fact_id).await?);
        }
        Ok(facts)
    }

    /// The facts this one superseded (their `superseded_by` names it), oldest first.
    async fn list_superseded_by(&self, scope: &Scope, fact_id: &str) -> Result<Vec<Fact>>;

    /// Facts newest first, filtered by their status at `as_of`.
    async fn list_facts(
        &self,
        scope: &Scope,
        status: StatusFilter,
        as_of: DateTime<Utc>,
        page: &PageRequest,
    ) -> Result<Page<Fact>>;

    /// Active facts whose normalized text has this fingerprint.
    async fn find_active_facts_by_fingerprint(&self, scope: &Scope, fingerprint: &str) -> Result<Vec<Fact>>;

    /// The unlifted tombstone with this fingerprint, if any.
    async fn find_tombstone(&self, scope: &Scope, fingerprint: &str) -> Result<Option<Tombstone>>;

    async fn get_episode(&self, scope: &Scope, episode_id: &str) -> Result<Option<Episode>>;

    /// Episodes newest first.
    /// Episodes newest first, of one session when `session` says so.
    async fn list_episodes(
        &self,
        scope: &Scope,
        session: Option<&str>,
        page: &PageRequest,
    ) -> Result<Page<Episode>>;

    async fn get_playbook(&self, scope: &Scope, playbook_id: &str) -> Result<Option<Playbook>>;

    /// Every version of a playbook, oldest first.
    async fn playbook_versions(&self, scope: &Scope, playbook_id: &str) -> Result<Vec<Playbook>>;

    async fn list_playbooks(&self, scope: &Scope, page: &PageRequest) -> Result<Page<Playbook>>;

    /// Gives facts and playbooks found by a search their current use counts (a store
    /// that counts apart from the records, as a cluster does, applies them here; the
    /// embedded store's search hits carry them already).
    async fn apply_usage(&self, _scope: &Scope, _memories: &mut [&mut Memory]) -> Result<()> {
        Ok(())
    }

    /// Makes every ingest so far searchable. On the embedded store every commit is
    /// searchable when it answers; a search cluster does not refresh its indices for an
    /// ingest (its episodes are readable by id at once, and searchable within the index
    /// refresh interval), and this refreshes them now.
    async fn make_ingests_searchable(&self) -> Result<()> {
        Ok(())
    }

    /// BM25 full-text search in one tier, scope and currency applied inside the query.
    async fn search_text(&self, scope: &Scope, query: &TextQuery) -> Result<Vec<TextHit>>;

    /// Cosine nearest neighbours in one tier among records that are in scope and current
    /// at `as_of`; `score` is the cosine similarity, best first.
    async fn search_vector(&self, scope: &Scope, query: &VectorQuery) -> Result<Vec<TextHit>>;

    /// [`MemoryStore::search_text`] for several queries of one recall, the hits of each
    /// in order. Runs them concurrently, unless a backend sends them together.
    async fn search_texts(&self, scope: &Scope, queries: &[TextQuery]) -> Result<Vec<Vec<TextHit>>> {
        futures_util::future::try_join_all(queries.iter().map(|query| self.search_text(scope, query))).await
    }

    /// [`MemoryStore::search_vector`] for several queries of one recall, like
    /// [`MemoryStore::search_texts`].
    async fn search_vectors(&self, scope: &Scope, queries: &[VectorQuery]) -> Result<Vec<Vec<TextHit>>> {
        futures_util::future::try_join_all(queries.iter().map(|query| self.search_vector(scope, query))).await
    }

    /// Every leg of one recall: the hits of each text query, then of each vector query,
    /// in order. By default the two groups run concurrently, each as
    /// [`MemoryStore::search_texts`] and [`MemoryStore::search_vectors`] run it.
    async fn search_legs(
        &self,
        scope: &Scope,
        texts: &[TextQuery],
        vectors: &[VectorQuery],
    ) -> Result<(Vec<Vec<TextHit>>, Vec<Vec<TextHit>>)> {
        futures_util::future::try_join(
            self.search_texts(scope, texts),
            self.search_vectors(scope, vectors),
        )
        .await
    }

    /// The pending review queue of every tenant that has one, the deepest `limit` first.
    /// Store-wide and naming tenants: for the operator's metrics alone, so that every
    /// process shows the same queues whichever served the reviews.
    async fn review_queues(&self, limit: usize) -> Result<Vec<TenantQueue>>;

    /// Records `key` (a console login ticket's id) as used until `until`, once across
    /// every process: `true` the first time, `false` while an earlier use of it has not
    /// expired at `now`. Not scoped: a key names itself (it is random and unguessable).
    async fn use_once(&self, key: &str, now: DateTime<Utc>, until: DateTime<Utc>) -> Result<bool>;

    /// Takes between `least` and `want` cells of the tenant's request rate at `now`,
    /// from a bucket the store keeps for every process that shares it (see
    /// [`RateQuota::take`]). `None`: this store keeps no shared limits, and each process
    /// limits its own requests (the default, and the embedded store's way).
    async fn take_rate(
        &self,
        _tenant: &TenantLimits,
        _quota: RateQuota,
        _want: u32,
        _least: u32,
        _now: DateTime<Utc>,
    ) -> Result<Option<RateGrant>> {
        Ok(None)
    }

    /// Adds `tokens` to the LLM tokens the tenant spent on `day` (UTC) and answers the
    /// day's total, kept for every process that shares the store and across restarts
    /// (0 tokens reads it). `None`: this store keeps no shared budget, and each process
    /// counts its own (the default, and the embedded store's way).
    async fn spend_tokens(
        &self,
        _tenant: &TenantLimits,
        _day: NaiveDate,
        _tokens: u64,
    ) -> Result<Option<u64>> {
        Ok(None)
    }

    /// Records which embedding model and dimension the stored vectors use, or checks
    /// that they match what was recorded before (a mismatch is an error: vectors of two
    /// models cannot be compared).
    async fn claim_embedding_space(&self, model_id: &str, dimension: usize) -> Result<()>;

    /// Starts (or resumes) moving every stored vector to the embedding space `target`
    /// (`model/dimension`): the new vectors are built beside the current ones, which
    /// keep serving, and replace them in one step ([`MemoryStore::finish_reembedding`]).
    /// Starting towards another target than an unfinished one drops what was built.
    /// For the operator's `cairn reembed` only: it spans every scope, as a backup does.
    async fn start_reembedding(&self, _target: &str) -> Result<Reembedding> {
        Err(Error::Unavailable(
            "re-embedding is not supported on this backend yet".into(),
        ))
    }

    /// Up to `limit` records that hold a vector and have none built in the target
    /// space yet, with the text their vector is made from.
    async fn pending_reembedding(&self, _limit: usize) -> Result<Vec<ToReembed>> {
        Err(Error::Unavailable(
            "re-embedding is not supported on this backend yet".into(),
        ))
    }

    /// Keeps vectors built in the target space, by tier and id; a record erased or
    /// changed since it was read is skipped (it is read again, or is gone).
    async fn store_reembedded(&self, _vectors: Vec<Reembedded>) -> Result<()> {
        Err(Error::Unavailable(
            "re-embedding is not supported on this backend yet".into(),
        ))
    }

    /// When no record is left to build, replaces every vector with the one built and
    /// claims the target space, in one step; otherwise changes nothing. Answers where
    /// the move stands (`remaining` 0 and `current` the target once switched).
    async fn finish_reembedding(&self) -> Result<Reembedding> {
        Err(Error::Unavailable(
            "re-embedding is not supported on this backend yet".into(),
        ))
    }

    /// Adds batched use counts to facts and playbooks of the scope (ids of other scopes
    /// and of erased records are skipped); `last_used_at` only moves forward.
    async fn record_usage(&self, scope: &Scope, uses: &[UseCount]) -> Result<()>;

    /// The tenant's users that hold any episode, fact or playbook, by user id; the
    /// cursor is the last user id of the previous page.
    async fn list_users(
        &self,
        tenant: &crate::scope::TenantScope,
        page: &PageRequest,
    ) -> Result<Page<UserSummary>>;

    /// Decisions newest first, of one kind when `kind` says so.
    async fn list_decisions(
        &self,
        scope: &Scope,
        kind: Option<DecisionKind>,
        page: &PageRequest,
    ) -> Result<Page<Decision>>;

    async fn get_review(&self, scope: &Scope, review_id: &str) -> Result<Option<Review>>;

    /// Pending reviews of the scope, oldest first (by creation time, then id); the
    /// cursor is a [`review_cursor`].
    async fn list_reviews(&self, scope: &Scope, page: &PageRequest) -> Result<Page<Review>>;

    /// Pending reviews of every user of the tenant, each with its user, oldest first,
    /// like [`MemoryStore::list_reviews`].
    async fn list_tenant_reviews(
        &self,
        tenant: &crate::scope::TenantScope,
        page: &PageRequest,
    ) -> Result<Page<UserReview>>;

    /// The tenant's pending reviews counted by kind, and the oldest one's time.
    async fn review_summary(&self, tenant: &crate::scope::TenantScope) -> Result<ReviewSummary>;

    /// Reviews of the scope, of any status, whose pending fact had this value
    /// fingerprint, newest first.
    async fn find_reviews_by_fingerprint(&self, scope: &Scope, fingerprint: &str) -> Result<Vec<Review>>;

    /// For each of the value fingerprints that has one, the newest review of the scope
    /// with that fingerprint that is pending or rejected, by fingerprint: what
    /// [`MemoryStore::find_reviews_by_fingerprint`] finds first of those statuses. By
    /// default one read per fingerprint, unless a backend reads them together.
    async fn held_or_rejected_values(
        &self,
        scope: &Scope,
        fingerprints: &[String],
    ) -> Result<std::collections::HashMap<String, Review>> {
        let mut found = std::collections::HashMap::new();
        for value in fingerprints {
            if found.contains_key(value) {
                continue;
            }
            if let Some(review) = self
                .find_reviews_by_fingerprint(scope, value)
                .await?
                .into_iter()
                .find(|review| matches!(review.status, ReviewStatus::Pending | ReviewStatus::Rejected))
            {
                found.insert(value.clone(), review);
            }
        }
        Ok(found)
    }

    /// Audit events newest first.
    async fn list_audit(&self, scope: &Scope, page: &PageRequest) -> Result<Page<AuditEvent>>;

    /// Unlifted tombstones of the scope, newest first.
    async fn list_tombstones(&self, scope: &Scope) -> Result<Vec<Tombstone>>;

    /// The scope's secret for keyed fingerprints in the audit trail: the stored one, or
    /// `candidate` stored now when the scope has none. Erasing the scope destroys it, so
    /// fingerprints left in the audit can no longer confirm a guessed value.
    async fn audit_key(&self, scope: &Scope, candidate: [u8; 32]) -> Result<Vec<u8>>;

    /// The secret key of the scope's tenant (not of its user): `candidate` the first
    /// time, the stored key after, the same for every user of the tenant and never
    /// removed by a user's erasure. It seals what an export carries that a reader of
    /// the file must not confirm by guessing (tombstoned values); it never leaves the
    /// store otherwise.
    async fn tenant_key(&self, scope: &Scope, candidate: [u8; 32]) -> Result<Vec<u8>>;

    /// The scope's consolidation watermark: the position of the last consolidated
    /// episode (0 before the first run).
    async fn watermark(&self, scope: &Scope) -> Result<u64>;

    /// Episodes with a position after `position`, oldest first, at most `limit`.
    async fn episodes_after(&self, scope: &Scope, position: u64, limit: usize) -> Result<Vec<LoggedEpisode>>;

    /// When the scope's log holds positions after `position` that are reserved but not
    /// written yet, at which [`MemoryStore::episodes_after`] waits: the time at which the
    /// first of them stops holding reads back (its reservation is then old enough to be
    /// taken for abandoned). `None` when nothing after `position` waits; always `None`
    /// where episodes are written in the transaction that reserves their positions.
    async fn gap_after(&self, _scope: &Scope, _position: u64) -> Result<Option<DateTime<Utc>>> {
        Ok(None)
    }

    /// Episodes with a position at or before `position`, the newest `limit` of them,
    /// oldest first.
    async fn episodes_up_to(&self, scope: &Scope, position: u64, limit: usize) -> Result<Vec<LoggedEpisode>>;

    /// Queued consolidation jobs of the scope, oldest first.
    async fn pending_jobs(&self, scope: &Scope) -> Result<Vec<ConsolidationJob>>;

    /// How many consolidation jobs of the scope are queued, counted up to `up_to` (an
    /// ingest only asks whether the queue is full).
    async fn count_pending_jobs(&self, scope: &Scope, up_to: usize) -> Result<usize> {
        Ok(self.pending_jobs(scope).await?.len().min(up_to))
    }

    /// Leases a job due at `now` until `lease_until`, counting an attempt (so a run that
    /// kills its worker counts too), and returns it, attempts included, with the scope it
    /// was enqueued in. Tenants take turns: the job is the oldest due job of the first tenant
    /// (in name order) after `after_tenant` that has one, wrapping around, so one
    /// tenant's backlog cannot hold back the others. Leased and dead-lettered jobs are
    /// not handed out; a job whose worker died runs again when its lease ends.
    async fn claim_job(
        &self,
        now: DateTime<Utc>,
        lease_until: DateTime<Utc>,
        after_tenant: Option<&str>,
    ) -> Result<Option<(Scope, ConsolidationJob)>>;

    /// Gives a leased job back after a failed run (its claim counted the attempt), not
    /// due before `run_after`; with `dead`, into the dead letters instead (not claimed
    /// again until a `RetryJob`).
    async fn release_job(
        &self,
        scope: &Scope,
        job_id: &str,
        run_after: DateTime<Utc>,
        error: &str,
        dead: bool,
    ) -> Result<()>;

    /// Claims the scope for a Cairn import, by compare-and-set in the store, so that at
    /// most one import writes into a scope at a time across every process. `claim` names
    /// the import, and claiming again under the same name renews it. A claim of another
    /// import answers the conflict `scope_not_empty`, unless it was last renewed before
    /// `stale_before` (its process stopped). Erasing the scope ends every claim.
    async fn claim_import(
        &self,
        scope: &Scope,
        claim: &str,
        now: DateTime<Utc>,
        stale_before: DateTime<Utc>,
    ) -> Result<()>;

    /// Ends the import claim `claim`; another import's claim is left as it is.
    async fn release_import(&self, scope: &Scope, claim: &str) -> Result<()>;

    /// The scope's erasure generation: 0 until it is first erased, advanced by every
    /// erasure before it removes anything. [`Change::RequireGeneration`] compares it.
    async fn generation(&self, scope: &Scope) -> Result<u64>;

    /// Extends the lease of a job this worker runs to `until` (its attempts unchanged),
    /// so a run longer than the lease is not handed to another worker while it lives.
    /// `false` when the job is gone or no longer leased.
    async fn renew_job(&self, scope: &Scope, job_id: &str, until: DateTime<Utc>) -> Result<bool>;

    /// Gives a leased job back without counting its attempt (the run never started: its
    /// scope was being consolidated elsewhere, or the service stopped), due at
    /// `run_after`. A job no longer there is ignored.
    async fn defer_job(&self, scope: &Scope, job_id: &str, run_after: DateTime<Utc>) -> Result<()>;

    /// Takes the lease on the scope's consolidation runs for `holder` until `until`, by
    /// compare-and-set in the store, so one run per scope runs at a time across every
    /// process: granted when there is none, when it ended before `now`, or when it is
    /// already `holder`'s (a renewal); `false` while another holder's lasts.
    async fn lease_scope_runs(
        &self,
        scope: &Scope,
        holder: &str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Result<bool>;

    /// Ends `holder`'s lease on the scope's runs; another holder's is left as it is.
    async fn release_scope_runs(&self, scope: &Scope, holder: &str) -> Result<()>;

    /// Removes every record of the scope (the audit trail keeps its id-only events and
    /// gains `audit`) and counts what was removed. The scope's generation advances
    /// first: no write that began before the erasure (a commit that checked its
    /// preconditions, an ingest that reserved its positions, a recovery that rolls a
    /// journal forward) leaves anything in the scope once the receipt is answered.
    async fn erase_scope(&self, scope: &Scope, audit: AuditEvent) -> Result<ErasureReceipt>;
}
