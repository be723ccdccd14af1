//! The Cairn service: the only crate that knows actix-web, JWTs, rate limits,
//! telemetry set-up and wire formats. It turns configuration into a running server.

pub mod auth;
pub mod cli;
pub mod config;
pub mod console;
pub mod dashboards;
pub mod error;
pub mod http;
pub mod mcp;
pub mod metrics;
pub mod openapi;
pub mod rate;
pub mod reference;
pub mod rerank;
pub mod routes;
pub mod telemetry;
pub mod tls;
pub mod wire;

use anyhow::Context;
use cairn_app::{Cairn, ConsolidationSettings, Consolidator, JobRun, Settings};
use cairn_core::MemoryStore;
use cairn_store_cluster::{Access, ClusterStore, Credentials, Engine};
use cairn_store_sqlite::SqliteStore;
use config::{Backend, Config};
use std::sync::Arc;

/// Opens the configured store.
pub fn open_store(config: &Config) -> anyhow::Result<Arc<dyn MemoryStore>> {
    match config.backend {
        Backend::Embedded => {
            let budget = config.vector_cache_mb.saturating_mul(1024 * 1024);
            let store =
                SqliteStore::open_with_vector_budget(&config.data_dir, budget).with_context(|| {
                    format!(
                        "CAIRN_DATA_DIR: cannot open the embedded store in {}",
                        config.data_dir.display()
                    )
                })?;
            Ok(Arc::new(store))
        }
        Backend::Opensearch | Backend::Elasticsearch => Ok(Arc::new(cluster_store(config)?)),
    }
}

/// The search-cluster store of the configuration (not contacted yet).
pub fn cluster_store(config: &Config) -> anyhow::Result<ClusterStore> {
    let engine = match config.backend {
        Backend::Elasticsearch => Engine::Elasticsearch,
        _ => Engine::OpenSearch,
    };
    let url = config
        .cluster_url
        .as_deref()
        .context("CAIRN_CLUSTER_URL is required with a search-cluster backend")?;
    let access = cluster_access(config)?;
    if access.insecure {
        tracing::warn!(
            "CAIRN_CLUSTER_TLS_INSECURE is set: the search cluster's certificate is NOT verified; anyone on the path can read and change every memory. Use CAIRN_CLUSTER_CA_CERT instead."
        );
        eprintln!(
            "cairn: WARNING: CAIRN_CLUSTER_TLS_INSECURE is set: the search cluster's certificate is not verified"
        );
    }
    ClusterStore::with_access(
        url,
        &access,
        engine,
        &config.index_prefix,
        config.embedding_dimension,
    )
    .map(|store| {
        store
            .with_replicas(config.cluster_replicas)
            .with_gap_patience(std::time::Duration::from_millis(config.cluster_gap_patience_ms))
    })
    .map_err(|error| anyhow::anyhow!("CAIRN_CLUSTER_URL: {error}"))
}

/// The credentials and TLS files of the configuration, read and checked.
fn cluster_access(config: &Config) -> anyhow::Result<Access> {
    let read = |name: &str, path: &std::path::Path| -> anyhow::Result<Vec<u8>> {
        let bytes = std::fs::read(path).with_context(|| format!("{name}: cannot read {}", path.display()))?;
        if !String::from_utf8_lossy(&bytes).contains("-----BEGIN ") {
            anyhow::bail!("{name}: {} is not a PEM file", path.display());
        }
        Ok(bytes)
    };
    let credentials = match (
        &config.cluster_username,
        &config.cluster_password,
        &config.cluster_api_key,
        &config.cluster_bearer_token,
    ) {
        (Some(username), Some(password), _, _) => Some(Credentials::Basic {
            username: username.clone(),
            password: password.clone(),
        }),
        (_, _, Some(key), _) => Some(Credentials::ApiKey(key.trim().to_owned())),
        (_, _, _, Some(token)) => Some(Credentials::Bearer(token.trim().to_owned())),
        _ => None,
    };
    let ca_pem = config
        .cluster_ca_cert
        .as_deref()
        .map(|path| read("CAIRN_CLUSTER_CA_CERT", path))
        .transpose()?;
    let client_pem = match (&config.cluster_client_cert, &config.cluster_client_key) {
        (Some(cert), Some(key)) => {
            let mut pem = read("CAIRN_CLUSTER_CLIENT_CERT", cert)?;
            pem.push(b'\n');
            pem.extend(read("CAIRN_CLUSTER_CLIENT_KEY", key)?);
            Some(pem)
        }
        _ => None,
    };
    Ok(Access {
        credentials,
        ca_pem,
        client_pem,
        insecure: config.cluster_tls_insecure,
    })
}

/// Brings a search-cluster store into service in the background: bootstrap (retried
/// every 2 s while the cluster is unreachable), which claims the embedding space before
/// it allows anything. Until then readiness fails and reads and writes answer 503; a
/// mapping that disagrees with `mappings/`, or vectors of another embedding model,
/// stop it with the problem in the log and in every refusal.
pub fn prepare_cluster(store: ClusterStore, cairn: Cairn) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let space = cairn.embedding_space();
        let claiming = space
            .as_ref()
            .map(|(model, dimension)| (model.as_str(), *dimension));
        loop {
            match store.bootstrap_claiming(claiming).await {
                Ok(report) => {
                    tracing::info!(
                        engine = store.engine().as_str(),
                        version = %store.version(),
                        created = report.created.len(),
                        existing = report.existing.len(),
                        backfilled = report.backfilled,
                        recorded = report.recorded,
                        replicas = report.replicas,
                        data_nodes = report.data_nodes,
                        analysis = report.analysis.describe(),
                        "search cluster ready"
                    );
                    if !report.vectors_in_source.is_empty() {
                        tracing::warn!(
                            indices = %report.vectors_in_source.join(", "),
                            "these indices keep vectors in _source (made by an earlier version), so recall reads \
                             more per hit; export and import each user into a new index prefix to move them"
                        );
                    }
                    return;
                }
                Err(error @ cairn_core::Error::Conflict { .. }) => {
                    tracing::error!(error = %error, "search cluster indices do not match mappings/; not using them");
                    return;
                }
                Err(error) if store.refusal().is_some() => {
                    tracing::error!(error = %error, "the search cluster cannot be used as configured; not using it");
                    return;
                }
                Err(error) => {
                    tracing::warn!(error = %error, "search cluster not ready; retrying in 2 s");
                    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
                }
            }
        }
    })
}

/// The HS256 secret development mode uses when no key is configured: read from the data
/// directory, or generated there on first use.
pub fn dev_secret(config: &Config) -> anyhow::Result<Option<String>> {
    // Any configured key, an identity provider's JWKS included, is the one to trust:
    // development mode never adds a secret of its own beside it.
    if !config.dev
        || config.jwt_secret.is_some()
        || config.jwt_public_keys.is_some()
        || config.jwt_jwks_url.is_some()
    {
        return Ok(None);
    }
    let path = config.dev_secret_path();
    if let Ok(secret) = std::fs::read_to_string(&path) {
        let secret = secret.trim().to_owned();
        if secret.len() >= 32 {
            return Ok(Some(secret));
        }
    }
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("cannot create {}", config.data_dir.display()))?;
    let bytes: [u8; 32] = rand::random();
    let secret: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
    write_private_file(&path, &secret)?;
    eprintln!(
        "cairn: development mode: generated an HS256 secret in {} (do not use in production)",
        path.display()
    );
    Ok(Some(secret))
}

#[cfg(unix)]
fn write_private_file(path: &std::path::Path, contents: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    file.write_all(contents.as_bytes())?;
    Ok(())
}

#[cfg(not(unix))]
fn write_private_file(path: &std::path::Path, contents: &str) -> anyhow::Result<()> {
    std::fs::write(path, contents).with_context(|| format!("cannot write {}", path.display()))
}

/// Builds the shared application state from a validated configuration: keys, store,
/// and the local embedding model (whose vectors must match what the store holds).
/// The use cases over `store`, with the embedder, consolidation providers and rerankers
/// the configuration names.
pub fn build_cairn(config: &Config, store: Arc<dyn MemoryStore>) -> anyhow::Result<Cairn> {
    let embedder = cairn_inference::OnnxEmbedder::load(&config.embedder())
        .context("the embedding model could not be loaded (CAIRN_MODELS_DIR)")?;
    let settings = Settings {
        max_text_chars: config.max_text_chars,
        bump_usage_on_recall: config.bump_usage_on_recall,
        rrf_k: config.rrf_k,
        fusion: match config.fusion {
            crate::config::FusionKind::Scores => cairn_app::Fusion::ScaledScores,
            crate::config::FusionKind::Rrf => cairn_app::Fusion::ReciprocalRank,
        },
        bm25_weight: config.bm25_weight,
        knn_weight: config.knn_weight,
        episode_context_weight: config.episode_context_weight,
        name_boost: config.name_boost,
        time_boost: config.time_boost,
        candidates_per_leg: config.candidates_per_leg,
        knn_candidates: Some(config.knn_candidates.min(config.candidates_per_leg)),
        priors: cairn_app::Priors {
            recency_weight: config.recency_weight,
            recency_half_life_days: config.recency_half_life_days,
            usage_weight: config.usage_weight,
            confidence_weight: config.confidence_weight,
        },
        rerank_candidates: config.rerank_candidates,
        review: config.review_policies()?,
        export_key: config.export_key.clone(),
        consolidation: ConsolidationSettings {
            batch_size: config.consolidation_batch_size,
            context_episodes: config.consolidation_context_episodes,
            retry_base: chrono::Duration::milliseconds(
                i64::try_from(config.consolidation_retry_base_ms).unwrap_or(i64::MAX),
            ),
            job_lease: chrono::Duration::seconds(
                i64::try_from(config.consolidation_lease_seconds).unwrap_or(120),
            ),
            max_attempts: config.consolidation_max_attempts,
            max_batches_per_run: config.consolidation_max_batches_per_run,
            settle: chrono::Duration::milliseconds(
                i64::try_from(config.consolidation_settle_ms).unwrap_or(500),
            ),
            tenant_token_budget: config.consolidation_token_budget,
            ..ConsolidationSettings::default()
        },
        ..Settings::default()
    };
    let embedder: Arc<dyn cairn_core::Embedder> = Arc::new(embedder);
    // Another model than the reference: consolidation still compares statements with the
    // reference, which its rules and bars were written against.
    let reference: Option<Arc<dyn cairn_core::Embedder>> = match config.embedder().reference() {
        Some(reference) => Some(Arc::new(
            cairn_inference::OnnxEmbedder::load(&reference)
                .context("the reference model could not be loaded (CAIRN_MODELS_DIR)")?,
        )),
        None => None,
    };
    let mut cairn = Cairn::new(store, Some(Arc::clone(&embedder)), settings);
    let mut consolidator = match config.llm() {
        Some(llm) => {
            let client = cairn_inference::llm::LlmClient::new(llm)?;
            cairn = cairn.with_answerer(Arc::new(cairn_inference::llm::LlmAnswerer::new(client.clone())));
            Consolidator::new(
                Arc::new(cairn_inference::llm::LlmExtractor::new(client.clone())),
                Arc::new(cairn_inference::llm::LlmJudge::new(client)),
            )
        }
        None => Consolidator::offline(Some(reference.clone().unwrap_or(embedder))),
    };
    if let Some(reference) = reference {
        consolidator = consolidator.with_reference(reference);
    }
    cairn = cairn.with_consolidator(consolidator);
    if let Some(url) = &config.rerank_url {
        let reranker = rerank::RemoteReranker::new(
            url.clone(),
            config.rerank_model.clone(),
            config.rerank_api_key.clone(),
            std::time::Duration::from_millis(config.rerank_timeout_ms),
        )?;
        cairn = cairn.with_reranker(Arc::new(reranker));
    }
    if config.rerank_offline.is_some() {
        let reranker = cairn_inference::LateInteractionReranker::load(&config.embedder())
            .context("CAIRN_RERANK_OFFLINE")?;
        cairn = cairn.with_reranker(Arc::new(reranker));
    }
    if let Some(model_dir) = &config.rerank_model_dir {
        let reranker = cairn_inference::CrossEncoderReranker::load(
            &config.embedder().runtime_library,
            model_dir,
            config.inference_threads,
        )
        .context("CAIRN_RERANK_MODEL_DIR")?;
        cairn = cairn.with_reranker(Arc::new(reranker));
    }
    Ok(cairn)
}

pub async fn build_state(config: &Config) -> anyhow::Result<http::AppState> {
    let secret = dev_secret(config)?;
    let verifier = auth::Verifier::from_config(config, secret.as_deref())?;
    // A JWKS URL is read once at start; an identity provider that is down then is
    // retried by the first requests rather than keeping the service down.
    match verifier.fetch_remote_keys().await {
        Ok(Some(keys)) => tracing::info!(keys, "JWKS fetched"),
        Ok(None) => {}
        Err(error) => {
            tracing::warn!(error = %error, "fetching the JWKS failed; it is tried again on requests")
        }
    }
    let cluster = match config.backend {
        Backend::Embedded => None,
        Backend::Opensearch | Backend::Elasticsearch => Some(cluster_store(config)?),
    };
    let store: Arc<dyn MemoryStore> = match &cluster {
        Some(cluster) => Arc::new(cluster.clone()),
        None => open_store(config)?,
    };
    let cairn = build_cairn(config, store)?;
    match cluster {
        // The cluster may be down at start: it is brought into service in the background.
        Some(cluster) => {
            prepare_cluster(cluster, cairn.clone());
        }
        None => cairn
            .claim_embedding_space()
            .await
            .context("CAIRN_EMBEDDING_MODEL_DIR")?,
    }
    let mut state = http::AppState::new(
        cairn,
        verifier,
        config.rate_limit_per_second,
        config.rate_limit_burst,
        config.max_body_bytes,
        config.metrics_require_auth,
        config.mcp_allowed_hosts(),
    )?;
    state.consolidation_run_cost = config.consolidation_run_cost;
    state.max_import_bytes = config.max_import_bytes;
    state.metrics_token = config.metrics_token.clone();
    state.strict_transport = config.tls_cert.is_some();
    state.login_secret = secret.or_else(|| config.jwt_secrets().first().map(|secret| (*secret).to_owned()));
    Ok(state)
}

/// How often the maintenance task writes the use counts noted by recalls.
const USAGE_FLUSH_EVERY: std::time::Duration = std::time::Duration::from_secs(1);
/// How often it looks for cluster commits that a failed process left half-applied.
const RECOVERY_EVERY: std::time::Duration = std::time::Duration::from_secs(10);
/// How old a commit journal must be before recovery takes it over: far beyond how long
/// a live commit takes, so recovery only finishes the commits of failed processes (a
/// commit that is merely slow is rolled back safely all the same).
pub const RECOVERY_PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);

/// Store maintenance until the process stops: writes recall use counts in batches, and
/// finishes commits that a failed process left half-applied (cluster backends).
pub fn spawn_maintenance(state: actix_web::web::Data<http::AppState>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut since_recovery = RECOVERY_EVERY;
        loop {
            tokio::time::sleep(USAGE_FLUSH_EVERY).await;
            if let Err(error) = state.cairn.flush_usage().await {
                tracing::warn!(error = %error, "writing use counts failed; they are kept for the next flush");
            }
            since_recovery += USAGE_FLUSH_EVERY;
            if since_recovery >= RECOVERY_EVERY {
                since_recovery = std::time::Duration::ZERO;
                match state.cairn.recover_commits(RECOVERY_PATIENCE).await {
                    Ok(0) => {}
                    Ok(resolved) => {
                        tracing::warn!(
                            resolved,
                            "finished commits that a failed process left half-applied"
                        )
                    }
                    Err(error) => tracing::warn!(error = %error, "commit recovery failed"),
                }
            }
        }
    })
}

/// The background consolidation worker: runs queued jobs until stopped.
pub struct ConsolidationWorker {
    stop: tokio::sync::watch::Sender<bool>,
    handle: tokio::task::JoinHandle<()>,
}

impl ConsolidationWorker {
    /// Stops taking jobs and waits up to `grace` for the run in progress to finish; a run
    /// still going then is cut off and its job given back, due at once, instead of
    /// waiting out its lease. Returns whether the worker finished within the grace.
    pub async fn stop(
        self,
        state: &actix_web::web::Data<http::AppState>,
        grace: std::time::Duration,
    ) -> bool {
        let _ = self.stop.send(true);
        let mut handle = self.handle;
        if tokio::time::timeout(grace, &mut handle).await.is_ok() {
            return true;
        }
        let given = state.cairn.give_back_running_jobs().await;
        handle.abort();
        tracing::warn!(
            jobs = given,
            "shutting down mid-run: the run's job was given back for another worker"
        );
        false
    }

    /// Cuts the worker off at once (tests).
    pub fn abort(&self) {
        self.handle.abort();
    }
}

/// Runs queued consolidation jobs until stopped: woken by ingests (after the settle
/// window, when their jobs come due), and polling once a second for retries that came
/// due.
pub fn spawn_consolidation_worker(state: actix_web::web::Data<http::AppState>) -> ConsolidationWorker {
    let (stop, mut stopping) = tokio::sync::watch::channel(false);
    let handle = tokio::spawn(async move {
        while !*stopping.borrow() {
            match state.cairn.run_due_job().await {
                Ok(Some(JobRun::Done(outcome))) => state.metrics.observe_consolidation(&outcome, "job"),
                Ok(None) => {
                    tokio::select! {
                        () = state.cairn.consolidation_woken() => {
                            tokio::time::sleep(state.cairn.consolidation_settle()).await;
                        }
                        () = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                        _ = stopping.changed() => {}
                    }
                }
                Ok(Some(JobRun::Failed(_))) => {
                    // Logged with the job; the job is released with a backoff.
                    state.metrics.observe_consolidation_failure("job");
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                }
                Ok(Some(JobRun::DeadLettered(_))) => {
                    state.metrics.observe_consolidation_failure("job");
                    state.metrics.observe_dead_letter();
                }
                // Another process runs the scope: the job comes back when its lease ends.
                Ok(Some(JobRun::Deferred)) => {}
                Err(error) => {
                    // The queue itself failed (the store is down): wait before trying again.
                    tracing::warn!(error = %error, "claiming a consolidation job failed");
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                }
            }
        }
    });
    ConsolidationWorker { stop, handle }
}
