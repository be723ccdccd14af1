//! Consolidation: episodes past the scope's watermark become facts and playbooks
//! through the gates, in order — grounding, tombstones, dedup (near-identical text
//! without a model call, otherwise the judge over the five nearest current facts),
//! then owner-checked apply. A batch's writes, decisions, finished jobs and the
//! watermark move commit together, so a crash re-runs the batch and never doubles it.

mod budget;

use crate::gates;
use crate::review::Hold;
use crate::{Cairn, RequestContext, now};
use cairn_core::text::fingerprint;
use cairn_core::{
    AuditEvent, CandidateFact, Change, ChangeSet, ConsolidationJob, Decision, DecisionKind, Episode, Error,
    ExtractionInput, Extractor, Fact, FactStatus, Judge, Result, ReviewKind, ReviewStatus, Scope,
    SearchFilter, ShownFact, SimilarityScale, TextQuery, Tier, TombstoneReason, Usage, VectorQuery, new_id,
};
use chrono::{DateTime, Duration, Utc};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

pub use budget::TokenBudget;
use cairn_offline::language;
pub use cairn_offline::{OfflineExtractor, OfflineJudge};

/// Tunables of consolidation.
#[derive(Clone, Debug)]
pub struct ConsolidationSettings {
    /// Episodes extracted together and committed as one batch.
    pub batch_size: usize,
    /// Earlier episodes shown as context.
    pub context_episodes: usize,
    /// Current facts shown to the judge (always this many when the scope has them).
    pub judge_shown: usize,
    /// Token Jaccard at or above which a candidate is a duplicate without a model call.
    pub duplicate_jaccard: f64,
    /// Cosine similarity at or above which a candidate about the same subject matches a
    /// retracted value.
    pub tombstone_similarity: f32,
    /// Playbook candidates below this confidence are dropped.
    pub playbook_min_confidence: f32,
    /// How long a worker holds a job before another may take it.
    pub job_lease: Duration,
    /// First retry delay of a failed job; doubles per attempt up to `retry_max`.
    pub retry_base: Duration,
    pub retry_max: Duration,
    /// Failed runs after which a job is dead-lettered: kept, visible, not retried by
    /// itself until someone retries it.
    pub max_attempts: u32,
    /// Jobs a scope may have queued; past it an ingest queues none (a queued run reads
    /// every episode past the watermark anyway), so a flood cannot grow the queue.
    pub max_pending_jobs_per_scope: usize,
    /// Distinct assistant texts of the queued jobs shown to the extractor, newest kept.
    pub max_assistant_context: usize,
    /// Batches a background run consolidates before the scope gives up its turn.
    pub max_batches_per_run: usize,
    /// How long the job of an asynchronous ingest waits before it is due, so the
    /// ingests of a burst are consolidated by one run (each run reads every episode
    /// past the watermark and completes every queued job of its scope).
    pub settle: Duration,
    /// LLM tokens (input and output) a tenant's consolidation may spend per UTC day;
    /// 0 for no limit.
    pub tenant_token_budget: u64,
}

impl Default for ConsolidationSettings {
    fn default() -> Self {
        ConsolidationSettings {
            batch_size: 20,
            context_episodes: 5,
            judge_shown: 5,
            duplicate_jaccard: 0.85,
            tombstone_similarity: 0.9,
            playbook_min_confidence: 0.7,
            job_lease: Duration::seconds(120),
            retry_base: Duration::seconds(5),
            retry_max: Duration::minutes(10),
            max_attempts: 8,
            max_pending_jobs_per_scope: 8,
            max_assistant_context: 20,
            max_batches_per_run: 5,
            settle: Duration::milliseconds(500),
            tenant_token_budget: 0,
        }
    }
}

/// The extractor and judge in use, and what keeps runs of one scope apart.
#[derive(Clone)]
pub struct Consolidator {
    extractor: Arc<dyn Extractor>,
    judge: Arc<dyn Judge>,
    locks: Arc<Mutex<HashMap<String, Arc<ScopeLock>>>>,
    wake: Arc<tokio::sync::Notify>,
    /// The tenant whose job was claimed last: the next claim starts after it.
    last_tenant: Arc<Mutex<Option<String>>>,
    /// Tokens spent per tenant today, against the token budget.
    ledger: Arc<budget::Ledger>,
    /// The jobs this process is running now, so that a shutdown that cannot wait for
    /// them gives them back (see [`Cairn::give_back_running_jobs`]).
    running: Arc<Mutex<Vec<(Scope, String)>>>,
    /// The reference model the judge compares statements with, when the service's own
    /// model is another (see [`Consolidator::with_reference`]).
    reference: Option<Arc<dyn cairn_core::Embedder>>,
}

/// What serialises a scope's consolidation runs and its erasure. An erasure announces
/// itself before it waits, so a run in progress gives up at its next commit instead of
/// holding the erasure back for the rest of its episodes.
#[derive(Default)]
pub(crate) struct ScopeLock {
    exclusive: Arc<tokio::sync::Mutex<()>>,
    erasures_waiting: AtomicUsize,
}

impl ScopeLock {
    /// Fails when an erasure of the scope is waiting for this run.
    fn check_not_erasing(&self) -> Result<()> {
        if self.erasures_waiting.load(Ordering::SeqCst) > 0 {
            Err(Error::Conflict {
                code: cairn_core::ErrorCode::ScopeErased,
                message: "the user is being erased; consolidation stopped and wrote nothing further".into(),
            })
        } else {
            Ok(())
        }
    }
}

/// Counts an erasure as waiting until dropped (also when the erasing request is
/// cancelled while it waits).
struct WaitingErasure(Arc<ScopeLock>);

impl Drop for WaitingErasure {
    fn drop(&mut self) {
        self.0.erasures_waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Held by an erasure: no consolidation run of the scope is in progress while it lives.
pub(crate) struct ErasureGuard {
    // Declared first so the erasure stops counting as waiting before runs may start.
    _waiting: WaitingErasure,
    _exclusive: tokio::sync::OwnedMutexGuard<()>,
}

impl Default for Consolidator {
    fn default() -> Self {
        Consolidator::new(Arc::new(OfflineExtractor), Arc::new(OfflineJudge::default()))
    }
}

impl Consolidator {
    /// The offline extractor and judge; with an embedder the judge also matches
    /// single-valued slots by meaning.
    pub fn offline(embedder: Option<Arc<dyn cairn_core::Embedder>>) -> Self {
        let judge = embedder.map_or_else(OfflineJudge::default, OfflineJudge::with_embedder);
        Consolidator::new(Arc::new(OfflineExtractor), Arc::new(judge))
    }

    pub fn new(extractor: Arc<dyn Extractor>, judge: Arc<dyn Judge>) -> Self {
        Consolidator {
            extractor,
            judge,
            locks: Arc::default(),
            wake: Arc::default(),
            last_tenant: Arc::default(),
            ledger: Arc::default(),
            running: Arc::default(),
            reference: None,
        }
    }

    /// The judge compares a candidate with the facts it is shown through `reference`,
    /// the model the offline rules and their bars were written against, while recall and
    /// the stored vectors keep the service's own model. The facts shown are still
    /// chosen by the stored vectors: the nearest [`REFERENCE_POOL`] times the number
    /// shown are embedded again with the reference model, so the cost per candidate
    /// does not grow with the scope.
    #[must_use]
    pub fn with_reference(mut self, reference: Arc<dyn cairn_core::Embedder>) -> Self {
        self.reference = Some(reference);
        self
    }

    fn lock_for(&self, scope: &Scope) -> Result<Arc<ScopeLock>> {
        let key = format!("{}\u{1f}{}", scope.tenant(), scope.user());
        let mut locks = self
            .locks
            .lock()
            .map_err(|_| Error::Storage("consolidation lock table poisoned".into()))?;
        // Forget locks nobody holds, so the table stays as small as the active scopes.
        locks.retain(|_, lock| Arc::strong_count(lock) > 1);
        Ok(Arc::clone(locks.entry(key).or_default()))
    }

    /// Stops the scope's consolidation: a run in progress gives up before its next
    /// commit, and no run starts until the guard is dropped.
    pub(crate) async fn exclude_runs(&self, scope: &Scope) -> Result<ErasureGuard> {
        let lock = self.lock_for(scope)?;
        lock.erasures_waiting.fetch_add(1, Ordering::SeqCst);
        let waiting = WaitingErasure(Arc::clone(&lock));
        let exclusive = Arc::clone(&lock.exclusive).lock_owned().await;
        Ok(ErasureGuard {
            _waiting: waiting,
            _exclusive: exclusive,
        })
    }
}

/// What running one due job came to.
#[derive(Debug)]
pub enum JobRun {
    Done(ConsolidationOutcome),
    /// The run failed; the job runs again after a delay.
    Failed(Error),
    /// The run failed once too often; the job waits in the dead letters for a retry.
    DeadLettered(Error),
    /// Another process runs the scope's consolidation now: the job was given back,
    /// uncounted, to come due when that run's lease ends.
    Deferred,
}

/// How a consolidation run was asked for.
#[derive(Clone, Copy, Debug, Default)]
pub struct ConsolidateOptions {
    /// Return the decisions and write nothing.
    pub dry_run: bool,
    /// Re-read every episode of the scope, not only those past the watermark.
    pub from_start: bool,
    /// Stop after this many batches, leaving a queued job for the rest (background runs
    /// take turns with other scopes instead of following a flood of ingests).
    pub max_batches: Option<usize>,
    /// A background run: with the token budget spent it defers its work to a job due
    /// when the budget resets, where an explicit run is refused.
    pub background: bool,
}

/// What one run did (or, dry, would do).
#[derive(Clone, Debug)]
pub struct ConsolidationOutcome {
    pub run_id: String,
    pub dry_run: bool,
    pub episodes_read: usize,
    pub watermark: u64,
    pub decisions: Vec<Decision>,
    pub facts_created: Vec<Fact>,
    pub playbooks_created: usize,
    pub usage: Usage,
    pub extractor: String,
    pub judge: String,
    /// Set when the token budget ran out: the rest waits in a job due at this time.
    pub deferred_until: Option<DateTime<Utc>>,
    /// The tenant's token budget after the run, when one is configured.
    pub token_budget: Option<TokenBudget>,
    /// The tenant and its review queue after the run, when the run held outcomes.
    pub review_queue: Option<Box<(String, cairn_core::ReviewSummary)>>,
}

/// A current fact in the run's view: from the store, or created earlier in this run.
struct WorkingSet {
    facts: HashMap<String, Fact>,
    retired: HashSet<String>,
    /// Tombstones lifted earlier in this run (they stay in the run's list of values).
    lifted: HashSet<String>,
}

impl WorkingSet {
    fn current(&self) -> impl Iterator<Item = &Fact> {
        self.facts
            .values()
            .filter(|fact| !self.retired.contains(&fact.id) && fact.status != FactStatus::Pending)
    }

    /// Facts held for review: not current, but their values are not proposed again.
    fn pending(&self) -> impl Iterator<Item = &Fact> {
        self.facts
            .values()
            .filter(|fact| fact.status == FactStatus::Pending)
    }
}

/// One candidate at the gates, with what it is checked against.
struct Gated<'a> {
    candidate: &'a CandidateFact,
    vector: Option<&'a [f32]>,
    episodes: &'a HashMap<&'a str, &'a Episode>,
    /// Gate 1's verdict (`gates::grounding`), judged once for the batch's reads.
    grounded: std::result::Result<(), String>,
    nearby: Nearby,
}

/// What the store holds near one candidate. Read for every candidate of a batch at
/// once, before any is gated: nothing a batch plans is written before its commit, so
/// each read finds what it would find at the candidate's turn.
#[derive(Default)]
struct Nearby {
    /// The nearest current facts (its text and vector legs).
    neighbours: HashMap<String, Fact>,
    /// Facts of any status whose text matches, best first.
    matching: Vec<Fact>,
    /// The newest review of its value that is pending or was rejected.
    review: Option<cairn_core::Review>,
}

impl Cairn {
    /// Wakes the background worker (after an ingest queued a job).
    pub fn wake_consolidation(&self) {
        self.consolidator.wake.notify_one();
    }

    /// Resolves when an ingest wakes the worker.
    pub async fn consolidation_woken(&self) {
        self.consolidator.wake.notified().await;
    }

    /// How long an asynchronous ingest's job waits before it is due.
    pub fn consolidation_settle(&self) -> std::time::Duration {
        self.settings.consolidation.settle.to_std().unwrap_or_default()
    }

    /// Takes a due job (tenants take turns) and runs it. On failure the job is given
    /// back with a growing delay, or dead-lettered after `max_attempts`; its episodes
    /// stay stored and nothing is half-written. `None` when no job is due.
    pub async fn run_due_job(&self) -> Result<Option<JobRun>> {
        let settings = &self.settings.consolidation;
        let started = now();
        let after = self
            .consolidator
            .last_tenant
            .lock()
            .map_err(|_| Error::Storage("consolidation turn poisoned".into()))?
            .clone();
        let Some((scope, job)) = self
            .store
            .claim_job(started, started + settings.job_lease, after.as_deref())
            .await?
        else {
            return Ok(None);
        };
        if let Ok(mut last) = self.consolidator.last_tenant.lock() {
            *last = Some(scope.tenant().as_str().to_owned());
        }
        let context = RequestContext {
            request_id: job.request_id.clone(),
        };
        let options = ConsolidateOptions {
            max_batches: Some(settings.max_batches_per_run),
            background: true,
            ..ConsolidateOptions::default()
        };
        // The claim counted this attempt: a job whose runs kept killing their worker
        // (never released as failed) is dead-lettered instead of run once more.
        if job.attempts > settings.max_attempts {
            let error = Error::Storage(format!(
                "the worker stopped during each of the job's last {} runs",
                job.attempts - 1
            ));
            return self.dead_letter(&scope, &job, error).await.map(Some);
        }
        // One run per scope across every process: another process's run of this scope
        // gets the job back uncounted, due when its lease ends.
        let holder = format!("job:{}", job.id);
        let Some(lease) = self.lease_runs(&scope, &holder, None).await? else {
            self.store
                .defer_job(&scope, &job.id, now() + runs_lease())
                .await?;
            return Ok(Some(JobRun::Deferred));
        };
        let _running = Running::note(&self.consolidator.running, &scope, &job.id);
        let renewer = keep_job_leased(Arc::clone(&self.store), &scope, &job.id, settings.job_lease);
        let ran = self
            .consolidate_leased(&scope, &context, options, Some(&lease))
            .await;
        renewer.abort();
        lease.release().await;
        match ran {
            Ok(outcome) => Ok(Some(JobRun::Done(outcome))),
            Err(error) => self.after_failed_run(&scope, &job, error).await.map(Some),
        }
    }

    /// Gives a job whose run failed back: again after a doubling backoff, or into the
    /// dead letters once its attempts (each claim counted one) reach the bound.
    async fn after_failed_run(&self, scope: &Scope, job: &ConsolidationJob, error: Error) -> Result<JobRun> {
        let settings = &self.settings.consolidation;
        if job.attempts >= settings.max_attempts {
            return self.dead_letter(scope, job, error).await;
        }
        let exponent = job.attempts.saturating_sub(1).min(16);
        let delay = settings
            .retry_base
            .checked_mul(1_i32 << exponent.min(30))
            .unwrap_or(settings.retry_max)
            .min(settings.retry_max);
        tracing::warn!(
            tenant = %scope.tenant(),
            job = %job.id,
            attempts = job.attempts,
            retry_in_s = delay.num_seconds(),
            error = %error,
            "consolidation failed; the job will run again"
        );
        self.store
            .release_job(scope, &job.id, now() + delay, &error.to_string(), false)
            .await?;
        Ok(JobRun::Failed(error))
    }

    /// Puts a job into the dead letters with `error`: it is not claimed again until
    /// retried.
    async fn dead_letter(&self, scope: &Scope, job: &ConsolidationJob, error: Error) -> Result<JobRun> {
        tracing::error!(
            tenant = %scope.tenant(),
            job = %job.id,
            attempts = job.attempts,
            error = %error,
            "consolidation failed too often; the job is dead-lettered until retried"
        );
        self.store
            .release_job(scope, &job.id, now(), &error.to_string(), true)
            .await?;
        Ok(JobRun::DeadLettered(error))
    }

    /// Gives back the jobs this process's runs hold (a shutdown that could not wait for
    /// them): each is due again at once, its lease released, instead of waiting out the
    /// lease. Returns how many.
    pub async fn give_back_running_jobs(&self) -> usize {
        let running: Vec<(Scope, String)> = self
            .consolidator
            .running
            .lock()
            .map(|mut running| std::mem::take(&mut *running))
            .unwrap_or_default();
        let mut given = 0;
        for (scope, job_id) in running {
            match self.store.defer_job(&scope, &job_id, now()).await {
                Ok(()) => given += 1,
                Err(error) => {
                    tracing::warn!(job = %job_id, error = %error, "giving a job back failed; its lease runs out")
                }
            }
        }
        given
    }

    /// Takes the lease on the scope's runs for `holder`, waiting up to `wait` while
    /// another process holds it; `None` when it is still held elsewhere. The lease is
    /// renewed while the returned guard lives and released when it is dropped.
    async fn lease_runs(
        &self,
        scope: &Scope,
        holder: &str,
        wait: Option<std::time::Duration>,
    ) -> Result<Option<RunsLease>> {
        let deadline = wait.map(|wait| std::time::Instant::now() + wait);
        loop {
            let at = now();
            if self
                .store
                .lease_scope_runs(scope, holder, at, at + runs_lease())
                .await?
            {
                return Ok(Some(RunsLease::keep(
                    Arc::clone(&self.store),
                    scope.clone(),
                    holder.to_owned(),
                )));
            }
            match deadline {
                Some(deadline) if std::time::Instant::now() < deadline => {
                    tokio::time::sleep(std::time::Duration::from_millis(250)).await;
                }
                _ => return Ok(None),
            }
        }
    }

    /// The scope's consolidation jobs, queued and dead-lettered, oldest first.
    pub async fn jobs(&self, scope: &Scope) -> Result<Vec<ConsolidationJob>> {
        self.store.pending_jobs(scope).await
    }

    /// Makes a job due now, out of the dead letters and with no attempts counted.
    pub async fn retry_job(
        &self,
        scope: &Scope,
        context: &RequestContext,
        job_id: &str,
    ) -> Result<ConsolidationJob> {
        let at = now();
        let event = crate::audit_event(
            scope,
            context,
            "consolidation.retry",
            vec![job_id.to_owned()],
            serde_json::Value::Null,
        );
        let set = ChangeSet::new(event).with(Change::RetryJob {
            job_id: job_id.to_owned(),
            at,
        });
        self.store.commit(scope, set).await?;
        self.wake_consolidation();
        self.store
            .pending_jobs(scope)
            .await?
            .into_iter()
            .find(|job| job.id == job_id)
            .ok_or(Error::NotFound { what: "job" })
    }

    /// Runs consolidation of the scope now. Runs of one scope never interleave, in this
    /// process or across processes: a second waits for the first (another process's
    /// for at most [`RUNS_WAIT`], then a conflict), then finds the episodes consumed.
    pub async fn consolidate(
        &self,
        scope: &Scope,
        context: &RequestContext,
        options: ConsolidateOptions,
    ) -> Result<ConsolidationOutcome> {
        self.consolidate_leased(scope, context, options, None).await
    }

    /// [`Cairn::consolidate`], under `held`, the lease on the scope's runs the caller
    /// took, or under one it takes itself.
    async fn consolidate_leased(
        &self,
        scope: &Scope,
        context: &RequestContext,
        options: ConsolidateOptions,
        held: Option<&RunsLease>,
    ) -> Result<ConsolidationOutcome> {
        if !options.background {
            self.require_budget(scope).await?;
        }
        let lock = self.consolidator.lock_for(scope)?;
        lock.check_not_erasing()?;
        let run_id = new_id("run");
        // The lease on the scope's runs first, then this process's lock: the order the
        // background worker takes them in too. Taken the other way round, a request
        // waiting for the lease while holding the lock would wait out `RUNS_WAIT` for a
        // worker of this process that holds the lease and waits for the lock.
        let own_lease = match held {
            Some(_) => None,
            None => Some(
                self.lease_runs(scope, &run_id, Some(RUNS_WAIT))
                    .await?
                    .ok_or_else(|| Error::Conflict {
                        code: cairn_core::ErrorCode::WatermarkMoved,
                        message:
                            "another process is consolidating this user now; the episodes are stored and \
                                  its run takes them"
                                .into(),
                    })?,
            ),
        };
        let _guard = lock.exclusive.lock().await;
        lock.check_not_erasing()?;
        let ran = self.run_batches(scope, context, options, &lock, run_id).await;
        if let Some(lease) = own_lease {
            lease.release().await;
        }
        ran
    }

    /// The batches of a run, under the scope's lock and its lease on runs.
    async fn run_batches(
        &self,
        scope: &Scope,
        context: &RequestContext,
        options: ConsolidateOptions,
        lock: &ScopeLock,
        run_id: String,
    ) -> Result<ConsolidationOutcome> {
        let settings = self.settings.consolidation.clone();
        // Read before anything the run derives from: an erasure after it, in any
        // process, fences every commit of the run (`RequireGeneration`).
        let generation = self.store.generation(scope).await?;
        let mut watermark = self.store.watermark(scope).await?;
        let mut cursor = if options.from_start { 0 } else { watermark };
        let jobs = self.store.pending_jobs(scope).await?;
        let assistant_context = assistant_context(&jobs, settings.max_assistant_context);
        let job_ids: Vec<String> = jobs.iter().map(|job| job.id.clone()).collect();
        let mut outcome = ConsolidationOutcome {
            run_id: run_id.clone(),
            dry_run: options.dry_run,
            episodes_read: 0,
            watermark,
            decisions: Vec::new(),
            facts_created: Vec::new(),
            playbooks_created: 0,
            usage: Usage::default(),
            extractor: self.consolidator.extractor.name().to_owned(),
            judge: self.consolidator.judge.name().to_owned(),
            deferred_until: None,
            token_budget: None,
            review_queue: None,
        };
        let mut working = WorkingSet {
            facts: HashMap::new(),
            retired: HashSet::new(),
            lifted: HashSet::new(),
        };
        let retracted = self.retracted_values(scope).await?;
        let mut batches = 0;
        let mut turned_over = false;
        loop {
            let batch = self
                .store
                .episodes_after(scope, cursor, settings.batch_size)
                .await?;
            let Some(last) = batch.last().map(|logged| logged.position) else {
                break;
            };
            if let Some(resets_at) = self.budget_spent(scope).await {
                // The rest waits for the budget to reset, in a job of its own.
                outcome.deferred_until = Some(resets_at);
                if !options.dry_run {
                    lock.check_not_erasing()?;
                    let deferred = queued_job(
                        new_id("job"),
                        scope,
                        context,
                        assistant_context.clone(),
                        now(),
                        resets_at,
                    );
                    let event = crate::audit_event(
                        scope,
                        context,
                        "consolidation.deferred",
                        vec![deferred.id.clone()],
                        serde_json::json!({ "run_id": run_id, "until": resets_at.to_rfc3339(), "reason": "token_budget" }),
                    );
                    let set = ChangeSet::new(event)
                        .with(Change::RequireGeneration(generation))
                        .with(Change::CompleteJobs(job_ids.clone()))
                        .with(Change::EnqueueJob(deferred));
                    self.store.commit(scope, set).await?;
                }
                tracing::warn!(
                    tenant = %scope.tenant(),
                    run = %run_id,
                    until = %resets_at.to_rfc3339(),
                    "token budget spent; consolidation deferred"
                );
                break;
            }
            let episodes: Vec<Episode> = batch.into_iter().map(|logged| logged.episode).collect();
            let earlier = self
                .store
                .episodes_up_to(scope, cursor, settings.context_episodes)
                .await?
                .into_iter()
                .map(|logged| logged.episode)
                .collect::<Vec<_>>();
            outcome.episodes_read += episodes.len();
            // Ids in a batch derive from what the batch is (scope, watermark, episodes,
            // extractor): a replay after a crash writes the same ids, which a cluster
            // store then skips instead of doubling.
            let batch_key = format!(
                "{}|{}|{}|{}|{}|{}",
                scope.tenant(),
                scope.user(),
                watermark,
                episodes
                    .first()
                    .map(|episode| episode.id.as_str())
                    .unwrap_or_default(),
                episodes
                    .last()
                    .map(|episode| episode.id.as_str())
                    .unwrap_or_default(),
                self.consolidator.extractor.name()
            );
            let mut plan = Plan::new(&run_id, batch_key);
            // Everything the batch derives commits only while its evidence is stored, and
            // only if the scope was not erased since the run began.
            plan.changes.push(Change::RequireGeneration(generation));
            plan.changes.push(Change::RequireEpisodes(
                episodes.iter().map(|episode| episode.id.clone()).collect(),
            ));
            let planned = self
                .plan_batch(
                    scope,
                    &mut plan,
                    &mut working,
                    &retracted,
                    BatchInput {
                        episodes,
                        earlier,
                        assistant_context: assistant_context.clone(),
                    },
                )
                .await;
            // Tokens the provider spent count against the budget whether or not the
            // batch could be planned: a model that keeps failing must not spend for free.
            self.charge_tokens(scope, &plan.usage).await;
            planned?;
            outcome.usage.add(plan.usage);
            let next_watermark = watermark.max(last);
            let last_batch = self.store.episodes_after(scope, last, 1).await?.is_empty();
            batches += 1;
            let turn_over = !last_batch && options.max_batches.is_some_and(|most| batches >= most);
            turned_over |= turn_over;
            let more = !last_batch && !turn_over;
            if !more {
                plan.changes.push(Change::CompleteJobs(job_ids.clone()));
            }
            if turn_over {
                // The rest waits for this scope's next turn, as a job of its own.
                let id = plan.next_id("job");
                let at = now();
                plan.changes.push(Change::EnqueueJob(queued_job(
                    id,
                    scope,
                    context,
                    assistant_context.clone(),
                    at,
                    at,
                )));
            }
            plan.changes.push(Change::MoveWatermark {
                expected: watermark,
                to: next_watermark,
            });
            outcome.decisions.extend(plan.decisions.iter().cloned());
            outcome.facts_created.extend(plan.created.iter().cloned());
            outcome.playbooks_created += plan.playbooks;
            if !options.dry_run {
                // An erasure that began during this batch wins: nothing of it is written.
                lock.check_not_erasing()?;
                self.store
                    .commit(scope, plan.into_change_set(scope, context))
                    .await?;
            }
            watermark = next_watermark;
            cursor = last;
            if !more {
                break;
            }
        }
        // Episodes behind a gap (a position reserved, not yet written) wait for it: a
        // job comes due when the gap stops holding, so the scope's consolidation goes on
        // even if nothing else is ingested.
        let gap = if options.dry_run || outcome.deferred_until.is_some() || turned_over {
            None
        } else {
            self.store.gap_after(scope, cursor).await?
        };
        let waiting = gap.map(|at| {
            queued_job(
                new_id("job"),
                scope,
                context,
                assistant_context.clone(),
                now(),
                at,
            )
        });
        if outcome.episodes_read == 0
            && outcome.deferred_until.is_none()
            && !job_ids.is_empty()
            && !options.dry_run
        {
            // Nothing new (another run consumed the episodes): the jobs are done.
            let event = run_audit(scope, context, "consolidation.run", Vec::new(), &run_id, 0);
            let mut set = ChangeSet::new(event)
                .with(Change::RequireGeneration(generation))
                .with(Change::CompleteJobs(job_ids));
            if let Some(job) = waiting {
                set = set.with(Change::EnqueueJob(job));
            }
            self.store.commit(scope, set).await?;
        } else if let Some(job) = waiting {
            let event = crate::audit_event(
                scope,
                context,
                "consolidation.deferred",
                vec![job.id.clone()],
                serde_json::json!({ "run_id": run_id, "until": job.run_after.to_rfc3339(), "reason": "gap" }),
            );
            let set = ChangeSet::new(event)
                .with(Change::RequireGeneration(generation))
                .with(Change::EnqueueJob(job));
            self.store.commit(scope, set).await?;
        }
        outcome.watermark = watermark;
        outcome.token_budget = self.token_budget(scope).await;
        if !options.dry_run
            && outcome
                .decisions
                .iter()
                .any(|decision| decision.kind == DecisionKind::HeldForReview)
        {
            let summary = self.review_summary(scope).await?;
            outcome.review_queue = Some(Box::new((scope.tenant().as_str().to_owned(), summary)));
        }
        tracing::info!(
            tenant = %scope.tenant(),
            run = %run_id,
            episodes = outcome.episodes_read,
            decisions = outcome.decisions.len(),
            dry_run = options.dry_run,
            "consolidation run finished"
        );
        Ok(outcome)
    }

    async fn retracted_values(&self, scope: &Scope) -> Result<Vec<gates::Retracted>> {
        let mut values = Vec::new();
        for tombstone in self.store.list_tombstones(scope).await? {
            let fact = match tombstone.reason {
                // A retracted fact is kept (status retracted) and can be compared by meaning.
                TombstoneReason::Retracted => self.store.get_fact(scope, &tombstone.fact_id).await?,
                // A forgotten fact is erased: only its fingerprint remains.
                TombstoneReason::Forgotten => None,
            };
            values.push(gates::Retracted { tombstone, fact });
        }
        // Compared by the reference model when there is one: its vectors replace the
        // stored ones for the run.
        if let Some(reference) = &self.consolidator.reference {
            let texts: Vec<String> = values
                .iter()
                .filter_map(|value| value.fact.as_ref().map(|fact| fact.text.clone()))
                .collect();
            if !texts.is_empty() {
                let mut vectors = reference.embed(texts).await?.into_iter();
                for fact in values.iter_mut().filter_map(|value| value.fact.as_mut()) {
                    fact.embedding = vectors.next();
                }
            }
        }
        Ok(values)
    }

    /// Extracts from one batch and runs every candidate through the gates, collecting
    /// the changes and decisions in `plan`.
    async fn plan_batch(
        &self,
        scope: &Scope,
        plan: &mut Plan,
        working: &mut WorkingSet,
        retracted: &[gates::Retracted],
        batch: BatchInput,
    ) -> Result<()> {
        let settings = &self.settings.consolidation;
        let known = self.relevant_facts(scope, &batch.episodes).await?;
        for fact in &known {
            working
                .facts
                .entry(fact.id.clone())
                .or_insert_with(|| fact.clone());
        }
        let input = ExtractionInput {
            episodes: batch.episodes.clone(),
            earlier: batch.earlier.clone(),
            assistant_context: batch.assistant_context.clone(),
            known_facts: known,
        };
        let extraction = self.consolidator.extractor.extract(&input).await?;
        plan.usage.add(extraction.usage);
        if let Some(problem) = extraction.unusable {
            return Err(Error::Provider(problem));
        }
        for rejected in &extraction.rejected {
            plan.decide(
                DecisionKind::Refused,
                format!("extraction item rejected: {rejected}"),
                None,
                Vec::new(),
            );
        }
        let episodes_by_id: HashMap<&str, &Episode> = batch
            .episodes
            .iter()
            .map(|episode| (episode.id.as_str(), episode))
            .collect();
        let words = gates::Vocabulary::new(
            batch
                .episodes
                .iter()
                .chain(batch.earlier.iter())
                .map(|episode| episode.text.as_str()),
            batch.assistant_context.iter().map(String::as_str),
        );

        let mut candidates = Vec::new();
        for candidate in extraction.facts {
            match self.check_candidate(&candidate, &episodes_by_id) {
                Ok(()) => candidates.push(candidate),
                Err(reason) => plan.decide(
                    DecisionKind::Refused,
                    reason,
                    None,
                    candidate.source_episode_ids.clone(),
                ),
            }
        }
        let vectors = self
            .embed_all(
                candidates
                    .iter()
                    .map(|candidate| candidate.text.clone())
                    .collect(),
            )
            .await?;
        let grounded: Vec<std::result::Result<(), String>> = candidates
            .iter()
            .map(|candidate| gates::grounding(&candidate.text, &words))
            .collect();
        let wanted: Vec<bool> = grounded.iter().map(std::result::Result::is_ok).collect();
        let nearby = self.read_nearby(scope, &candidates, &vectors, &wanted).await?;
        for (((candidate, vector), grounded), nearby) in
            candidates.into_iter().zip(vectors).zip(grounded).zip(nearby)
        {
            let gated = Gated {
                candidate: &candidate,
                vector: vector.as_deref(),
                episodes: &episodes_by_id,
                grounded,
                nearby,
            };
            self.gate_candidate(scope, plan, working, retracted, gated)
                .await?;
        }

        for candidate in extraction.playbooks {
            if candidate.confidence < settings.playbook_min_confidence {
                plan.decide(
                    DecisionKind::Refused,
                    format!(
                        "playbook \"{}\" below the confidence threshold ({:.2} < {:.2})",
                        candidate.name, candidate.confidence, settings.playbook_min_confidence
                    ),
                    None,
                    candidate.source_episode_ids.clone(),
                );
                continue;
            }
            if candidate.steps.is_empty()
                || candidate.name.trim().is_empty()
                || candidate.trigger.trim().is_empty()
            {
                plan.decide(
                    DecisionKind::Refused,
                    "playbook without name, trigger or steps",
                    None,
                    Vec::new(),
                );
                continue;
            }
            let playbook = self
                .new_playbook(candidate.name, candidate.trigger, candidate.steps)
                .await?;
            let playbook = cairn_core::Playbook {
                id: plan.next_id("pb"),
                ..playbook
            };
            plan.decide(
                DecisionKind::New,
                format!(
                    "playbook \"{}\" with {} steps",
                    playbook.name,
                    playbook.steps.len()
                ),
                None,
                vec![playbook.id.clone()],
            );
            plan.playbooks += 1;
            plan.changes.push(Change::InsertPlaybook(playbook));
        }
        Ok(())
    }

    /// The candidate's vector from the reference model, with the model, when the
    /// service runs another one (see [`Consolidator::with_reference`]).
    async fn reference_vector(
        &self,
        text: &str,
    ) -> Result<Option<(&Arc<dyn cairn_core::Embedder>, Vec<f32>)>> {
        let Some(reference) = &self.consolidator.reference else {
            return Ok(None);
        };
        let vector = reference.embed(vec![text.to_owned()]).await?.into_iter().next();
        Ok(vector.map(|vector| (reference, vector)))
    }

    /// The current facts the judge is shown: the nearest by the stored vectors, or,
    /// with a reference model, the nearest by it among [`REFERENCE_POOL`] times as
    /// many picked by the stored vectors.
    async fn shown_to_judge(
        &self,
        working: &WorkingSet,
        text: &str,
        vector: Option<&[f32]>,
        by_reference: Option<&(&Arc<dyn cairn_core::Embedder>, Vec<f32>)>,
    ) -> Result<Vec<ShownFact>> {
        let limit = self.settings.consolidation.judge_shown;
        let scale = self.similarity_scale();
        Ok(match by_reference {
            Some((reference, own)) => {
                let pool = shown_facts(working, text, vector, scale, limit.saturating_mul(REFERENCE_POOL));
                compared_by_reference(reference.as_ref(), own, pool, limit).await?
            }
            None => shown_facts(working, text, vector, scale, limit),
        })
    }

    /// Runs one candidate through the gates in order (see `gates`), adding its changes
    /// and decision to `plan`.
    async fn gate_candidate(
        &self,
        scope: &Scope,
        plan: &mut Plan,
        working: &mut WorkingSet,
        retracted: &[gates::Retracted],
        gated: Gated<'_>,
    ) -> Result<()> {
        let settings = &self.settings.consolidation;
        let Gated {
            candidate,
            vector,
            episodes,
            grounded,
            nearby,
        } = gated;
        let sources = || candidate.source_episode_ids.clone();
        // Gate 1: grounding.
        if let Err(reason) = grounded {
            plan.decide(DecisionKind::DroppedUngrounded, reason, None, sources());
            return Ok(());
        }

        // Statements are compared by meaning with the reference model when the service's
        // own is another (see `Consolidator::with_reference`).
        let by_reference = self.reference_vector(&candidate.text).await?;
        let (compared, scale) = match &by_reference {
            Some((reference, own)) => (Some(own.as_slice()), reference.similarity_scale()),
            None => (vector, self.similarity_scale()),
        };

        // Gate 2: tombstones. A matched value is lifted only by a user episode ingested
        // after the tombstone that states it; a lift the review policy holds waits.
        let policy = self.review_policy(scope.tenant().as_str());
        let mut held_lift = None;
        if let Some(value) = gates::matching_tombstone(
            retracted,
            &working.lifted,
            &candidate.text,
            compared,
            settings.tombstone_similarity,
            scale,
        ) {
            let tombstone = &value.tombstone;
            let restatement = candidate
                .source_episode_ids
                .iter()
                .filter_map(|id| episodes.get(id.as_str()))
                .filter(|episode| gates::restates_retracted(value, episode, &candidate.text))
                .max_by_key(|episode| episode.ingested_at);
            let Some(evidence) = restatement else {
                // The reason names the tombstone, never the value: a forgotten value
                // must not come back as text in a decision.
                plan.decide(
                    DecisionKind::BlockedByTombstone,
                    format!(
                        "a candidate matches tombstone {} ({}) and no newer user episode states it",
                        tombstone.id,
                        tombstone.reason.as_str()
                    ),
                    None,
                    vec![tombstone.id.clone()],
                );
                return Ok(());
            };
            match policy.rule_of(
                ReviewKind::TombstoneLift,
                candidate.fact_type,
                candidate.confidence,
            ) {
                Some(rule) => held_lift = Some((tombstone.id.clone(), rule)),
                None => {
                    working.lifted.insert(tombstone.id.clone());
                    plan.changes.push(gates::lift(&tombstone.id, now()));
                    plan.decide(
                        DecisionKind::TombstoneLifted,
                        format!(
                            "user episode {} ingested after the tombstone states the value again",
                            evidence.id
                        ),
                        None,
                        vec![tombstone.id.clone(), evidence.id.clone()],
                    );
                    plan.lifts.push((tombstone.id.clone(), evidence.id.clone()));
                }
            }
        }

        // Gate 3: dedup, without a model: a current value, a value held for review or
        // rejected by a reviewer, or a value already derived from the same episode.
        for (id, fact) in nearby.neighbours {
            working.facts.entry(id).or_insert(fact);
        }
        let threshold = settings.duplicate_jaccard;
        let duplicate =
            if let Some(existing) = gates::near_duplicate(working.current(), &candidate.text, threshold) {
                Some((
                    existing.id.clone(),
                    format!("near-identical to current fact {}", existing.id),
                    Vec::new(),
                ))
            } else if let Some(held) = gates::near_duplicate(working.pending(), &candidate.text, threshold) {
                Some((
                    held.id.clone(),
                    format!("near-identical to fact {}, pending review", held.id),
                    Vec::new(),
                ))
            } else if let Some(review) = nearby.review {
                let state = if review.status == ReviewStatus::Rejected {
                    "rejected"
                } else {
                    "pending"
                };
                Some((
                    review.fact_id.clone(),
                    format!(
                        "the same value as fact {}, {state} in review {}",
                        review.fact_id, review.id
                    ),
                    vec![review.id.clone()],
                ))
            } else {
                derived_before(&nearby.matching, candidate, threshold).map(|previous| {
                    (
                        previous.id.clone(),
                        format!(
                            "already derived from the same episode as fact {} ({})",
                            previous.id,
                            previous.status.as_str()
                        ),
                        Vec::new(),
                    )
                })
            };
        if let Some((fact_id, reason, also)) = duplicate {
            let mut targets = vec![fact_id.clone()];
            targets.extend(also);
            plan.decide(DecisionKind::Duplicate, reason, Some(fact_id), targets);
            return Ok(());
        }

        // Gate 4: the judge, over the nearest current facts, its verdict resolved once.
        let shown = self
            .shown_to_judge(working, &candidate.text, vector, by_reference.as_ref())
            .await?;
        let (outcome, reason) = if shown.is_empty() {
            (
                gates::Outcome::New,
                "the scope holds no current fact to compare with".to_owned(),
            )
        } else {
            let judgement = self.consolidator.judge.judge(candidate, &shown).await?;
            plan.usage.add(judgement.usage);
            gates::resolve(judgement.verdict, judgement.reason, &shown)
        };
        let mut fact = new_fact(
            plan.next_id("fact"),
            candidate,
            episodes,
            vector.map(<[f32]>::to_vec),
        );

        // Gate 5: review. An outcome the tenant's policy holds is stored pending, with
        // what it would change, and changes nothing else until a person approves it.
        let proposal = match (&held_lift, &outcome) {
            (Some((tombstone_id, rule)), _) => Some((
                ReviewKind::TombstoneLift,
                Some(tombstone_id.clone()),
                Some(rule.clone()),
            )),
            (None, gates::Outcome::Updates(existing)) => {
                Some((ReviewKind::Supersession, Some(existing.id.clone()), None))
            }
            (None, gates::Outcome::New | gates::Outcome::Extends(_)) => {
                Some((ReviewKind::NewFact, None, None))
            }
            (None, gates::Outcome::Duplicate(_)) => None,
        };
        if let Some((kind, target_id, rule)) = proposal
            && let Some(rule) = rule.or_else(|| policy.rule_for(kind, &fact))
        {
            let hold = Hold {
                kind,
                rule,
                target_id,
                reason: format!("{}: {reason}", outcome.name()),
                origin: plan.run_id.clone(),
            };
            let decision_id = plan.next_id("dec");
            let (changes, held) = hold.changes(scope, &mut fact, decision_id);
            plan.changes.extend(changes);
            plan.decisions.push(held);
            plan.track(working, fact);
            return Ok(());
        }

        // Gate 6: apply.
        match outcome {
            gates::Outcome::New => {
                plan.decide(DecisionKind::New, reason, Some(fact.id.clone()), Vec::new());
                plan.insert(working, fact);
            }
            gates::Outcome::Duplicate(existing) => {
                plan.decide(
                    DecisionKind::Duplicate,
                    reason,
                    Some(existing.id.clone()),
                    vec![existing.id],
                );
            }
            gates::Outcome::Extends(existing) => {
                plan.changes.push(Change::InsertFact(fact.clone()));
                plan.changes.push(gates::extension(&fact, &existing));
                plan.decide(
                    DecisionKind::Extends,
                    reason,
                    Some(fact.id.clone()),
                    vec![existing.id],
                );
                plan.track(working, fact);
            }
            gates::Outcome::Updates(existing) => {
                plan.changes.push(Change::InsertFact(fact.clone()));
                plan.changes.extend(gates::supersede(
                    &existing,
                    &fact,
                    fact.created_at,
                    crate::facts::Contradiction::Natural,
                ));
                plan.decide(
                    DecisionKind::Updates,
                    reason,
                    Some(fact.id.clone()),
                    vec![existing.id.clone()],
                );
                plan.superseded.push(existing.id.clone());
                working.retired.insert(existing.id);
                plan.track(working, fact);
            }
        }
        Ok(())
    }

    /// Per-item validation of what an extractor returned.
    fn check_candidate(
        &self,
        candidate: &CandidateFact,
        episodes: &HashMap<&str, &Episode>,
    ) -> std::result::Result<(), String> {
        let text = candidate.text.trim();
        if text.is_empty() {
            return Err("candidate with empty text".to_owned());
        }
        if text.chars().count() > self.settings.max_text_chars {
            return Err("candidate text over the length limit".to_owned());
        }
        if !(0.0..=1.0).contains(&candidate.confidence) {
            return Err(format!("\"{text}\": confidence outside 0..1"));
        }
        if candidate.source_episode_ids.is_empty()
            || candidate
                .source_episode_ids
                .iter()
                .any(|id| !episodes.contains_key(id.as_str()))
        {
            return Err(format!(
                "\"{text}\": source episodes are not episodes of this batch"
            ));
        }
        if candidate
            .expires_in_hours
            .is_some_and(|hours| !(hours > 0.0 && hours <= 24.0 * 366.0 * 10.0))
        {
            return Err(format!("\"{text}\": expires_in_hours out of range"));
        }
        if let (Some(from), Some(to)) = (candidate.valid_from, candidate.valid_to)
            && from >= to
        {
            return Err(format!("\"{text}\": valid_to is not after valid_from"));
        }
        Ok(())
    }

    /// Current facts of the scope close to the batch's episodes (for the extractor).
    /// Every episode's legs go to the store together (one `_msearch` on a cluster).
    async fn relevant_facts(&self, scope: &Scope, episodes: &[Episode]) -> Result<Vec<Fact>> {
        let filter = current_filter(5);
        let texts: Vec<TextQuery> = episodes
            .iter()
            .map(|episode| TextQuery::new(filter.clone(), episode.text.clone()))
            .collect();
        let vectors: Vec<VectorQuery> = episodes
            .iter()
            .filter_map(|episode| episode.embedding.clone())
            .map(|vector| VectorQuery {
                filter: filter.clone(),
                vector,
            })
            .collect();
        let found = self.facts_found(scope, &texts, &vectors).await?;
        let mut facts: Vec<Fact> = found.into_values().collect();
        facts.sort_by_key(|fact| std::cmp::Reverse(fact.created_at));
        facts.truncate(20);
        Ok(facts)
    }

    /// What the store holds near each candidate that passed the grounding gate (the
    /// others get nothing: they are dropped before any of it is looked at), in one
    /// `search_legs` call and one read of reviews.
    async fn read_nearby(
        &self,
        scope: &Scope,
        candidates: &[CandidateFact],
        vectors: &[Option<Vec<f32>>],
        wanted: &[bool],
    ) -> Result<Vec<Nearby>> {
        let mut nearby: Vec<Nearby> = candidates.iter().map(|_| Nearby::default()).collect();
        let chosen: Vec<usize> = (0..candidates.len())
            .filter(|&index| wanted.get(index).copied().unwrap_or(false))
            .collect();
        if chosen.is_empty() {
            return Ok(nearby);
        }
        // Facts held for review come too: dedup must see their values.
        let neighbours = SearchFilter {
            include_pending: true,
            ..current_filter(self.settings.consolidation.judge_shown)
        };
        let mut history = current_filter(10);
        history.include_history = true;
        let texts: Vec<TextQuery> = chosen
            .iter()
            .map(|&index| TextQuery::new(neighbours.clone(), candidates[index].text.clone()))
            .chain(
                chosen
                    .iter()
                    .map(|&index| TextQuery::new(history.clone(), candidates[index].text.clone())),
            )
            .collect();
        let (with_vector, vector_queries): (Vec<usize>, Vec<VectorQuery>) = chosen
            .iter()
            .filter_map(|&index| {
                let vector = vectors.get(index)?.as_ref()?;
                Some((
                    index,
                    VectorQuery {
                        filter: neighbours.clone(),
                        vector: vector.clone(),
                    },
                ))
            })
            .unzip();
        let values: Vec<String> = chosen
            .iter()
            .map(|&index| fingerprint(&candidates[index].text))
            .collect();
        let ((text_legs, vector_legs), reviews) = futures_util::future::try_join(
            self.store.search_legs(scope, &texts, &vector_queries),
            self.store.held_or_rejected_values(scope, &values),
        )
        .await?;
        for (index, hits) in with_vector.into_iter().zip(vector_legs) {
            collect_facts(&mut nearby[index].neighbours, hits);
        }
        let mut text_legs = text_legs.into_iter();
        for &index in &chosen {
            collect_facts(
                &mut nearby[index].neighbours,
                text_legs.next().unwrap_or_default(),
            );
        }
        for (&index, value) in chosen.iter().zip(&values) {
            nearby[index].matching = text_legs
                .next()
                .unwrap_or_default()
                .into_iter()
                .filter_map(|hit| match hit.memory {
                    cairn_core::Memory::Fact(fact) => Some(fact),
                    _ => None,
                })
                .collect();
            nearby[index].review = reviews.get(value).cloned();
        }
        Ok(nearby)
    }

    /// The active facts the legs find, by id, in one `search_legs` call (one `_msearch`
    /// on a cluster).
    async fn facts_found(
        &self,
        scope: &Scope,
        texts: &[TextQuery],
        vectors: &[VectorQuery],
    ) -> Result<HashMap<String, Fact>> {
        let (text_legs, vector_legs) = self.store.search_legs(scope, texts, vectors).await?;
        let mut found = HashMap::new();
        for hits in vector_legs.into_iter().chain(text_legs) {
            collect_facts(&mut found, hits);
        }
        Ok(found)
    }
}

/// A fact of any status already derived from one of the candidate's episodes with
/// near-identical text, among the facts whose text matches it: re-reading old episodes
/// must not bring back what was retired.
fn derived_before(matching: &[Fact], candidate: &CandidateFact, threshold: f64) -> Option<Fact> {
    matching
        .iter()
        .find(|fact| {
            fact.source_episode_ids
                .iter()
                .any(|id| candidate.source_episode_ids.contains(id))
                && language::jaccard(&fact.text, &candidate.text) >= threshold
        })
        .cloned()
}

struct BatchInput {
    episodes: Vec<Episode>,
    earlier: Vec<Episode>,
    assistant_context: Vec<String>,
}

/// The changes and decisions of one batch, committed together.
struct Plan {
    /// What the batch is; ids issued in it derive from this and a counter.
    batch_key: String,
    issued: u64,
    run_id: String,
    changes: Vec<Change>,
    decisions: Vec<Decision>,
    created: Vec<Fact>,
    superseded: Vec<String>,
    /// Tombstones lifted, each with the episode that restated its value.
    lifts: Vec<(String, String)>,
    playbooks: usize,
    usage: Usage,
}

impl Plan {
    fn new(run_id: &str, batch_key: String) -> Self {
        Plan {
            batch_key,
            issued: 0,
            run_id: run_id.to_owned(),
            changes: Vec::new(),
            decisions: Vec::new(),
            created: Vec::new(),
            superseded: Vec::new(),
            lifts: Vec::new(),
            playbooks: 0,
            usage: Usage::default(),
        }
    }

    fn decide(
        &mut self,
        kind: DecisionKind,
        reason: impl Into<String>,
        fact_id: Option<String>,
        targets: Vec<String>,
    ) {
        let id = self.next_id("dec");
        self.decisions.push(Decision {
            id,
            kind,
            reason: reason.into(),
            fact_id,
            target_ids: targets,
            origin: self.run_id.clone(),
            created_at: now(),
        });
    }

    /// The next id of this batch: the same on a replay of the same batch.
    fn next_id(&mut self, prefix: &str) -> String {
        self.issued += 1;
        let digest = fingerprint(&format!("{} {} {prefix}", self.batch_key, self.issued));
        let hex = digest.trim_start_matches("sha256:");
        format!("{prefix}_{}", &hex[..32])
    }

    fn insert(&mut self, working: &mut WorkingSet, fact: Fact) {
        self.changes.push(Change::InsertFact(fact.clone()));
        self.track(working, fact);
    }

    fn track(&mut self, working: &mut WorkingSet, fact: Fact) {
        working.facts.insert(fact.id.clone(), fact.clone());
        self.created.push(fact);
    }

    fn into_change_set(self, scope: &Scope, context: &RequestContext) -> ChangeSet {
        let mut targets: Vec<String> = self.created.iter().map(|fact| fact.id.clone()).collect();
        targets.extend(self.superseded.iter().cloned());
        let event = run_audit(
            scope,
            context,
            "consolidation.run",
            targets,
            &self.run_id,
            self.decisions.len(),
        );
        let mut change_set = ChangeSet::new(event);
        change_set.changes = self.changes;
        change_set.decisions = self.decisions;
        // A lift is audited as its own action, with the evidence that allowed it.
        for (tombstone_id, episode_id) in self.lifts {
            change_set.audit.push(crate::audit_event(
                scope,
                context,
                "tombstone.lift",
                vec![tombstone_id],
                serde_json::json!({ "run_id": self.run_id, "evidence_episode_id": episode_id }),
            ));
        }
        change_set
    }
}

fn run_audit(
    scope: &Scope,
    context: &RequestContext,
    action: &str,
    targets: Vec<String>,
    run_id: &str,
    decisions: usize,
) -> AuditEvent {
    crate::audit_event(
        scope,
        context,
        action,
        targets,
        serde_json::json!({ "run_id": run_id, "decisions": decisions }),
    )
}

/// A consolidation job of the scope, queued at `created_at` and due at `run_after`,
/// with no attempts yet.
pub(crate) fn queued_job(
    id: String,
    scope: &Scope,
    context: &RequestContext,
    assistant_context: Vec<String>,
    created_at: DateTime<Utc>,
    run_after: DateTime<Utc>,
) -> ConsolidationJob {
    ConsolidationJob {
        id,
        subject: scope.subject().to_owned(),
        request_id: context.request_id.clone(),
        assistant_context,
        created_at,
        run_after,
        attempts: 0,
        last_error: None,
        dead_at: None,
    }
}

/// Assistant text of the pending jobs, each distinct text once, the newest `limit`.
fn assistant_context(jobs: &[ConsolidationJob], limit: usize) -> Vec<String> {
    let mut seen = HashSet::new();
    let mut newest_first: Vec<String> = jobs
        .iter()
        .rev()
        .flat_map(|job| job.assistant_context.iter().rev())
        .filter(|text| seen.insert(text.as_str()))
        .take(limit)
        .cloned()
        .collect();
    newest_first.reverse();
    newest_first
}

fn current_filter(limit: usize) -> SearchFilter {
    SearchFilter {
        tier: Tier::Semantic,
        as_of: now(),
        include_history: false,
        include_pending: false,
        valid_at: None,
        fact_types: Vec::new(),
        session_id: None,
        limit,
        with_vectors: true,
    }
}

fn collect_facts(found: &mut HashMap<String, Fact>, hits: Vec<cairn_core::TextHit>) {
    for hit in hits {
        if let cairn_core::Memory::Fact(fact) = hit.memory
            && fact.status == FactStatus::Active
        {
            found.entry(fact.id.clone()).or_insert(fact);
        }
    }
}

/// The `limit` current facts nearest the candidate, under aliases m1, m2, ..., with
/// their similarity on the reference scale of the judge's thresholds.
fn shown_facts(
    working: &WorkingSet,
    text: &str,
    vector: Option<&[f32]>,
    scale: SimilarityScale,
    limit: usize,
) -> Vec<ShownFact> {
    let scored: Vec<(f32, &Fact)> = working
        .current()
        .map(|fact| {
            let similarity = match (vector, &fact.embedding) {
                (Some(candidate), Some(existing)) => scale.statements(candidate, existing),
                _ => language::jaccard(text, &fact.text) as f32,
            };
            (similarity, fact)
        })
        .collect();
    nearest(scored, limit)
}

/// The `limit` facts of highest similarity (ties by id), under aliases m1, m2, ....
fn nearest<F: std::borrow::Borrow<Fact>>(mut scored: Vec<(f32, F)>, limit: usize) -> Vec<ShownFact> {
    scored.sort_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then_with(|| a.1.borrow().id.cmp(&b.1.borrow().id))
    });
    scored
        .into_iter()
        .take(limit)
        .enumerate()
        .map(|(index, (similarity, fact))| ShownFact {
            alias: format!("m{}", index + 1),
            fact: fact.borrow().clone(),
            similarity: Some(similarity),
        })
        .collect()
}

/// How many times the number of facts shown the reference model compares again.
pub const REFERENCE_POOL: usize = 4;

/// The `limit` facts of `pool` nearest the candidate (its reference vector `own`) by
/// the reference model's cosine, which becomes their similarity, realiased in order.
async fn compared_by_reference(
    reference: &dyn cairn_core::Embedder,
    own: &[f32],
    pool: Vec<ShownFact>,
    limit: usize,
) -> Result<Vec<ShownFact>> {
    if pool.is_empty() {
        return Ok(pool);
    }
    let theirs = reference
        .embed(pool.iter().map(|shown| shown.fact.text.clone()).collect())
        .await?;
    let scale = reference.similarity_scale();
    let scored: Vec<(f32, Fact)> = pool
        .into_iter()
        .zip(&theirs)
        .map(|(shown, vector)| (scale.statements(own, vector), shown.fact))
        .collect();
    Ok(nearest(scored, limit))
}

fn new_fact(
    id: String,
    candidate: &CandidateFact,
    episodes: &HashMap<&str, &Episode>,
    embedding: Option<Vec<f32>>,
) -> Fact {
    let said_at: Option<DateTime<Utc>> = candidate
        .source_episode_ids
        .iter()
        .filter_map(|id| episodes.get(id.as_str()))
        .map(|episode| episode.occurred_at)
        .max();
    let created_at = now();
    let expires_at = candidate.expires_in_hours.map(|hours| {
        said_at.unwrap_or(created_at) + Duration::milliseconds((hours * 3_600_000.0).round() as i64)
    });
    Fact {
        source_episode_ids: candidate.source_episode_ids.clone(),
        source_span: candidate.span.clone(),
        // Event time: from the statement's own date, else from when it was said.
        valid_from: candidate.valid_from.or(said_at.map(|at| at.min(created_at))),
        valid_to: candidate.valid_to,
        expires_at,
        embedding,
        ..Fact::new_active(
            id,
            candidate.fact_type,
            candidate.text.trim().to_owned(),
            candidate.confidence,
            created_at,
        )
    }
}

/// Renews a job's lease every third of its length until aborted (or until the job is
/// gone or no longer leased): a run longer than the lease is not handed to another
/// worker, which would inherit the run's scope lease (its holder names the job, so a
/// dead worker's job runs again at once elsewhere).
fn keep_job_leased(
    store: Arc<dyn cairn_core::MemoryStore>,
    scope: &Scope,
    job_id: &str,
    lease_length: Duration,
) -> tokio::task::JoinHandle<()> {
    let (scope, job_id) = (scope.clone(), job_id.to_owned());
    let every = (lease_length / 3)
        .to_std()
        .unwrap_or(std::time::Duration::from_secs(1))
        .max(std::time::Duration::from_millis(100));
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            match store.renew_job(&scope, &job_id, now() + lease_length).await {
                Ok(true) => {}
                Ok(false) => return,
                Err(error) => tracing::warn!(error = %error, "renewing a job's lease failed"),
            }
        }
    })
}

/// A job noted as running in this process for as long as its run lasts.
struct Running {
    running: Arc<Mutex<Vec<(Scope, String)>>>,
    job_id: String,
}

impl Running {
    fn note(running: &Arc<Mutex<Vec<(Scope, String)>>>, scope: &Scope, job_id: &str) -> Running {
        if let Ok(mut jobs) = running.lock() {
            jobs.push((scope.clone(), job_id.to_owned()));
        }
        Running {
            running: Arc::clone(running),
            job_id: job_id.to_owned(),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(mut jobs) = self.running.lock() {
            jobs.retain(|(_, id)| *id != self.job_id);
        }
    }
}

/// How long a lease on a scope's runs lasts unless renewed: a process that dies holding
/// it delays the scope's next run by at most this.
fn runs_lease() -> Duration {
    Duration::seconds(60)
}

/// How long an explicit run waits for another process's run of the same scope.
pub const RUNS_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// A lease on a scope's consolidation runs held by this process: renewed every third of
/// its length while the guard lives, released when it is dropped.
pub(crate) struct RunsLease {
    store: Arc<dyn cairn_core::MemoryStore>,
    scope: Scope,
    holder: String,
    renewer: tokio::task::JoinHandle<()>,
}

impl RunsLease {
    fn keep(store: Arc<dyn cairn_core::MemoryStore>, scope: Scope, holder: String) -> RunsLease {
        let renewer = {
            let (store, scope, holder) = (Arc::clone(&store), scope.clone(), holder.clone());
            tokio::spawn(async move {
                let every = runs_lease()
                    .to_std()
                    .unwrap_or(std::time::Duration::from_secs(60))
                    / 3;
                loop {
                    tokio::time::sleep(every).await;
                    let at = now();
                    match store
                        .lease_scope_runs(&scope, &holder, at, at + runs_lease())
                        .await
                    {
                        Ok(true) => {}
                        Ok(false) => {
                            tracing::warn!(tenant = %scope.tenant(), "the lease on a run was taken over");
                            return;
                        }
                        Err(error) => tracing::warn!(error = %error, "renewing a run's lease failed"),
                    }
                }
            })
        };
        RunsLease {
            store,
            scope,
            holder,
            renewer,
        }
    }
}

impl RunsLease {
    /// Releases the lease now, before the next run of this process may take it.
    async fn release(mut self) {
        self.renewer.abort();
        if let Err(error) = self.store.release_scope_runs(&self.scope, &self.holder).await {
            tracing::warn!(error = %error, "releasing a run's lease failed; it runs out");
        }
        self.holder.clear();
    }
}

impl Drop for RunsLease {
    /// A lease not released (a run that failed on its way) is released in the background.
    fn drop(&mut self) {
        self.renewer.abort();
        if self.holder.is_empty() {
            return;
        }
        let (store, scope, holder) = (Arc::clone(&self.store), self.scope.clone(), self.holder.clone());
        tokio::spawn(async move {
            if let Err(error) = store.release_scope_runs(&scope, &holder).await {
                tracing::warn!(error = %error, "releasing a run's lease failed; it runs out");
            }
        });
    }
}
