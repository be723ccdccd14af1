//! The one typed configuration: defaults, then a TOML file, then `CAIRN_*` environment
//! variables, validated once at start. Nothing else in the service reads the environment.

use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// Which store the service runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    Embedded,
    Opensearch,
    Elasticsearch,
}

/// How recall combines the BM25 and kNN legs of a tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FusionKind {
    /// Each leg's scores scaled to 0..1, then weighted (the default: it measured better
    /// on LoCoMo).
    Scores,
    /// Reciprocal rank fusion.
    Rrf,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Json,
    Text,
}

/// The local embedding models `scripts/setup` provisions (`CAIRN_EMBEDDING_MODEL`), the
/// default first.
pub const EMBEDDING_MODELS: [&str; 3] = ["all-minilm-l6-v2", "bge-small-en-v1.5", "e5-small-v2"];

#[derive(Clone, Debug, Deserialize, serde::Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub listen: String,
    pub data_dir: PathBuf,
    pub backend: Backend,
    pub cluster_url: Option<String>,
    /// Basic authentication to the search cluster.
    pub cluster_username: Option<String>,
    pub cluster_password: Option<String>,
    /// An Elasticsearch API key, in its encoded (`base64(id:key)`) form.
    pub cluster_api_key: Option<String>,
    pub cluster_bearer_token: Option<String>,
    /// PEM file of the CA (or CAs) that signed the cluster's certificate.
    pub cluster_ca_cert: Option<PathBuf>,
    /// PEM files of the client certificate and its key, for mutual TLS.
    pub cluster_client_cert: Option<PathBuf>,
    pub cluster_client_key: Option<PathBuf>,
    /// Skip verifying the cluster's certificate (warned about at start).
    pub cluster_tls_insecure: bool,
    /// Replicas of each index; unset: 1 on a cluster of several data nodes, 0 on one.
    pub cluster_replicas: Option<u32>,
    /// How long a reserved episode position may stay unwritten (an ingest under way)
    /// before consolidation takes it for abandoned and reads past it, in milliseconds.
    pub cluster_gap_patience_ms: u64,
    pub index_prefix: String,
    /// HS256 secrets, separated by whitespace: every one verifies, the first signs.
    pub jwt_secret: Option<String>,
    pub jwt_public_keys: Option<PathBuf>,
    /// A JWKS served over HTTP(S), cached and fetched again on an unknown `kid`.
    pub jwt_jwks_url: Option<String>,
    /// How long fetched JWKS keys are used before they are fetched again, in seconds.
    pub jwt_jwks_refresh_seconds: u64,
    /// Accepted audiences, comma-separated (the token's `aud` must hold one).
    pub jwt_audience: Option<String>,
    /// Accepted issuers, comma-separated.
    pub jwt_issuer: Option<String>,
    /// Clock skew tolerated on `exp` and `nbf`, in seconds.
    pub jwt_leeway_seconds: u64,
    /// The longest token lifetime (`exp - iat`) accepted, in seconds; 0 for no limit.
    pub jwt_max_ttl_seconds: u64,
    pub models_dir: PathBuf,
    /// The ONNX Runtime library; default `<models_dir>/onnxruntime/libonnxruntime.so`.
    pub onnxruntime_library: Option<PathBuf>,
    /// The local embedding model, one of [`EMBEDDING_MODELS`], found under
    /// `models_dir` as provisioned by `scripts/setup`.
    pub embedding_model: String,
    /// The embedding model directory (model.onnx + tokenizer.json, and optionally
    /// cairn-model.json); default `<models_dir>/<embedding_model>`.
    pub embedding_model_dir: Option<PathBuf>,
    pub embedding_dimension: usize,
    /// ONNX Runtime threads inside one inference run: two by default (one on a one-core
    /// machine). The embedder's runs are serialised on its one inference thread, so it
    /// takes at most this many cores; a local reranker, when configured, runs its own
    /// session beside it with as many.
    pub inference_threads: usize,
    /// How a tier's legs combine.
    pub fusion: FusionKind,
    /// Weights of the BM25 and kNN legs in fusion.
    pub bm25_weight: f64,
    pub knn_weight: f64,
    /// Reciprocal rank fusion constant.
    pub rrf_k: f64,
    /// Candidates each retrieval leg contributes to fusion.
    pub candidates_per_leg: usize,
    /// Candidates each vector leg contributes, when fewer than `candidates_per_leg`:
    /// the kNN search is a recall's largest cost on a search cluster.
    pub knn_candidates: usize,
    /// BM25 weight of an episode's context (the episodes before and after it in its session).
    pub episode_context_weight: f64,
    /// How much a hit that names what the query names gains (a multiplier of at most
    /// `1 + name_boost`); 0 turns it off.
    pub name_boost: f64,
    /// How much a hit whose event time falls in the time the query names gains (a
    /// multiplier of `1 + time_boost`); 0 turns it off.
    pub time_boost: f64,
    /// Recall priors (multipliers on fused scores); 0 turns each off.
    pub recency_weight: f64,
    pub recency_half_life_days: f64,
    pub usage_weight: f64,
    pub confidence_weight: f64,
    /// A remote rerank endpoint (`{query, documents}` → scores); unset: no reranking.
    pub rerank_url: Option<String>,
    /// A local cross-encoder directory (model.onnx + tokenizer.json); unset: none.
    pub rerank_model_dir: Option<PathBuf>,
    /// `late-interaction`: the offline reranker over the embedding model's token vectors.
    pub rerank_offline: Option<String>,
    pub rerank_model: Option<String>,
    pub rerank_api_key: Option<String>,
    pub rerank_timeout_ms: u64,
    pub rerank_candidates: usize,
    pub llm_kind: Option<String>,
    pub llm_base_url: Option<String>,
    pub llm_model: Option<String>,
    pub llm_api_key: Option<String>,
    /// Azure OpenAI's `api-version`.
    pub llm_api_version: Option<String>,
    pub llm_timeout_ms: u64,
    /// Retries after the first attempt on timeouts, 429 and 5xx.
    pub llm_max_retries: u32,
    pub llm_retry_backoff_ms: u64,
    /// Longest `Retry-After` honoured inside one call; longer waits fail the run, which retries later.
    pub llm_max_retry_after_ms: u64,
    pub llm_max_output_tokens: u32,
    /// US dollars per million tokens, for the cost estimate in metrics and run results.
    /// `json_schema` or `json_object` (see `ResponseFormat`).
    pub llm_response_format: String,
    pub llm_input_price_per_mtok: f64,
    pub llm_output_price_per_mtok: f64,
    /// Run queued consolidation jobs in the background (off: only sync and manual runs).
    pub consolidation_worker: bool,
    /// On SIGTERM, how long requests in flight and a consolidation run in progress may
    /// take to finish, in seconds, before they are cut off (a run's job is given back).
    pub shutdown_grace_seconds: u64,
    /// Episodes extracted and committed together.
    pub consolidation_batch_size: usize,
    /// Earlier episodes given to extraction as context.
    pub consolidation_context_episodes: usize,
    /// First retry delay of a failed job (doubles per attempt, at most 10 minutes).
    pub consolidation_retry_base_ms: u64,
    /// How long a worker holds a job before it is handed out again.
    pub consolidation_lease_seconds: u64,
    /// Failed runs after which a consolidation job is dead-lettered until retried.
    pub consolidation_max_attempts: u32,
    /// Batches a background run consolidates before its scope gives up its turn.
    pub consolidation_max_batches_per_run: usize,
    /// How long an asynchronous ingest's consolidation job waits before it is due, so a
    /// burst of ingests is consolidated by one run.
    pub consolidation_settle_ms: u64,
    /// LLM tokens (input and output) a tenant's consolidation may spend per UTC day;
    /// 0 for no limit.
    pub consolidation_token_budget: u64,
    /// Requests' worth of the tenant's rate limit that an explicit consolidation run
    /// (a synchronous ingest, `POST /consolidate`) costs.
    pub consolidation_run_cost: u32,
    /// Sustained requests per second allowed to one tenant; 0 disables the limit.
    pub rate_limit_per_second: u32,
    /// Requests a tenant may send in a burst above the sustained rate.
    pub rate_limit_burst: u32,
    pub max_body_bytes: usize,
    /// The body limit of `POST /v1/users/{user}/import`.
    pub max_import_bytes: usize,
    pub max_text_chars: usize,
    /// Whether `/metrics` needs an admin token.
    pub metrics_require_auth: bool,
    /// The operator's scrape credential (at least 32 bytes), sent as a bearer token:
    /// only it reads the series that name tenants. No tenant token does.
    pub metrics_token: Option<String>,
    /// The key that seals tombstoned values in exports (at least 32 bytes); the same on
    /// every service that exchanges exports. Unset: each tenant's key kept in the store.
    pub export_key: Option<String>,
    /// OTLP/HTTP collector base URL (traces go to `<url>/v1/traces`); unset disables export.
    pub otlp_endpoint: Option<String>,
    pub log_level: String,
    pub log_format: LogFormat,
    /// Development mode: without a configured key, generate an HS256 secret into the
    /// data directory (and say so) instead of refusing to start.
    pub dev: bool,
    pub workers: usize,
    pub bump_usage_on_recall: bool,
    /// Memory budget of the embedded store's in-memory vector indexes, in MiB; past it,
    /// the least recently used scopes' indexes are dropped and rebuilt on demand.
    pub vector_cache_mb: usize,
    /// Comma-separated hosts (or host:port) the MCP endpoint answers to; unset means
    /// loopback only, `*` disables the check (put a trusted proxy in front then).
    pub mcp_allowed_hosts: Option<String>,
    /// PEM certificate chain and private key: with both, the listener serves HTTPS.
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// Outcomes held for a person's review, comma-separated: `supersession`,
    /// `retraction`, `tombstone_lift`, `low_confidence`, `fact_type:<type>`, `all`;
    /// empty holds none.
    pub review: String,
    /// Below this confidence, `low_confidence` holds a fact.
    pub review_min_confidence: f32,
    /// Per-tenant settings (config file only): `[tenants.<name>]` with `review` and
    /// `review_min_confidence`, each defaulting to the settings above.
    pub tenants: std::collections::BTreeMap<String, TenantConfig>,
}

/// Settings of one tenant that override the service-wide ones.
#[derive(Clone, Debug, Default, Deserialize, serde::Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct TenantConfig {
    pub review: Option<String>,
    pub review_min_confidence: Option<f32>,
}

/// Two intra-op threads cut a short text's embedding by about a quarter on two cores
/// (spinning is off, so an idle pool leaves the cores to a search node beside it).
fn default_inference_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |cores| cores.get().min(2))
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:8080".into(),
            data_dir: PathBuf::from("./data"),
            backend: Backend::Embedded,
            cluster_url: None,
            cluster_username: None,
            cluster_password: None,
            cluster_api_key: None,
            cluster_bearer_token: None,
            cluster_ca_cert: None,
            cluster_client_cert: None,
            cluster_client_key: None,
            cluster_tls_insecure: false,
            cluster_replicas: None,
            cluster_gap_patience_ms: 30_000,
            index_prefix: "cairn".into(),
            jwt_secret: None,
            jwt_public_keys: None,
            jwt_jwks_url: None,
            jwt_jwks_refresh_seconds: 600,
            jwt_audience: None,
            jwt_issuer: None,
            jwt_leeway_seconds: 30,
            jwt_max_ttl_seconds: 0,
            models_dir: PathBuf::from("./.models"),
            onnxruntime_library: None,
            embedding_model: EMBEDDING_MODELS[0].to_owned(),
            embedding_model_dir: None,
            embedding_dimension: 384,
            inference_threads: default_inference_threads(),
            fusion: FusionKind::Scores,
            bm25_weight: 0.7,
            knn_weight: 0.3,
            rrf_k: 60.0,
            candidates_per_leg: 50,
            knn_candidates: 20,
            episode_context_weight: cairn_core::TextQuery::CONTEXT_WEIGHT,
            // Measured on LoCoMo (evals/run --only "name boost"): chosen on conversations
            // 1-3, held on 4-5.
            name_boost: 0.5,
            time_boost: cairn_app::Settings::default().time_boost,
            recency_weight: 0.0,
            recency_half_life_days: 30.0,
            usage_weight: 0.0,
            confidence_weight: 0.0,
            rerank_url: None,
            rerank_model_dir: None,
            rerank_offline: None,
            rerank_model: None,
            rerank_api_key: None,
            rerank_timeout_ms: 2_000,
            rerank_candidates: 20,
            llm_kind: None,
            llm_base_url: None,
            llm_model: None,
            llm_api_key: None,
            llm_api_version: None,
            llm_timeout_ms: 30_000,
            llm_max_retries: 3,
            llm_retry_backoff_ms: 500,
            llm_max_retry_after_ms: 30_000,
            llm_max_output_tokens: 2_048,
            llm_response_format: "json_schema".to_owned(),
            llm_input_price_per_mtok: 0.0,
            llm_output_price_per_mtok: 0.0,
            consolidation_worker: true,
            shutdown_grace_seconds: 25,
            consolidation_batch_size: 20,
            consolidation_context_episodes: 5,
            consolidation_retry_base_ms: 5_000,
            consolidation_lease_seconds: 120,
            consolidation_max_attempts: 8,
            consolidation_token_budget: 0,
            consolidation_max_batches_per_run: 5,
            consolidation_settle_ms: 500,
            consolidation_run_cost: 10,
            rate_limit_per_second: 50,
            rate_limit_burst: 100,
            max_body_bytes: 1024 * 1024,
            max_import_bytes: 64 * 1024 * 1024,
            max_text_chars: 8_000,
            metrics_require_auth: false,
            metrics_token: None,
            export_key: None,
            otlp_endpoint: None,
            log_level: "info".into(),
            log_format: LogFormat::Json,
            dev: false,
            workers: 2,
            bump_usage_on_recall: true,
            vector_cache_mb: 256,
            mcp_allowed_hosts: None,
            tls_cert: None,
            tls_key: None,
            review: String::new(),
            review_min_confidence: 0.5,
            tenants: std::collections::BTreeMap::new(),
        }
    }
}

/// How an environment value is parsed before it joins the file's table.
#[derive(Clone, Copy)]
pub(crate) enum Kind {
    Text,
    Integer,
    Float,
    Boolean,
}

/// Every configuration key; its environment name is `CAIRN_` + the upper-cased key.
pub(crate) const KEYS: &[(&str, Kind)] = &[
    ("listen", Kind::Text),
    ("data_dir", Kind::Text),
    ("backend", Kind::Text),
    ("cluster_url", Kind::Text),
    ("cluster_username", Kind::Text),
    ("cluster_password", Kind::Text),
    ("cluster_api_key", Kind::Text),
    ("cluster_bearer_token", Kind::Text),
    ("cluster_ca_cert", Kind::Text),
    ("cluster_client_cert", Kind::Text),
    ("cluster_client_key", Kind::Text),
    ("cluster_tls_insecure", Kind::Boolean),
    ("cluster_replicas", Kind::Integer),
    ("cluster_gap_patience_ms", Kind::Integer),
    ("index_prefix", Kind::Text),
    ("jwt_secret", Kind::Text),
    ("jwt_public_keys", Kind::Text),
    ("jwt_jwks_url", Kind::Text),
    ("jwt_jwks_refresh_seconds", Kind::Integer),
    ("jwt_audience", Kind::Text),
    ("jwt_issuer", Kind::Text),
    ("jwt_leeway_seconds", Kind::Integer),
    ("jwt_max_ttl_seconds", Kind::Integer),
    ("models_dir", Kind::Text),
    ("onnxruntime_library", Kind::Text),
    ("embedding_model", Kind::Text),
    ("embedding_model_dir", Kind::Text),
    ("embedding_dimension", Kind::Integer),
    ("inference_threads", Kind::Integer),
    ("fusion", Kind::Text),
    ("bm25_weight", Kind::Float),
    ("knn_weight", Kind::Float),
    ("rrf_k", Kind::Float),
    ("candidates_per_leg", Kind::Integer),
    ("knn_candidates", Kind::Integer),
    ("episode_context_weight", Kind::Float),
    ("name_boost", Kind::Float),
    ("time_boost", Kind::Float),
    ("recency_weight", Kind::Float),
    ("recency_half_life_days", Kind::Float),
    ("usage_weight", Kind::Float),
    ("confidence_weight", Kind::Float),
    ("rerank_url", Kind::Text),
    ("rerank_model_dir", Kind::Text),
    ("rerank_offline", Kind::Text),
    ("rerank_model", Kind::Text),
    ("rerank_api_key", Kind::Text),
    ("rerank_timeout_ms", Kind::Integer),
    ("rerank_candidates", Kind::Integer),
    ("llm_kind", Kind::Text),
    ("llm_base_url", Kind::Text),
    ("llm_model", Kind::Text),
    ("llm_api_key", Kind::Text),
    ("llm_api_version", Kind::Text),
    ("llm_timeout_ms", Kind::Integer),
    ("llm_max_retries", Kind::Integer),
    ("llm_retry_backoff_ms", Kind::Integer),
    ("llm_max_retry_after_ms", Kind::Integer),
    ("llm_max_output_tokens", Kind::Integer),
    ("llm_response_format", Kind::Text),
    ("llm_input_price_per_mtok", Kind::Float),
    ("llm_output_price_per_mtok", Kind::Float),
    ("consolidation_worker", Kind::Boolean),
    ("shutdown_grace_seconds", Kind::Integer),
    ("consolidation_batch_size", Kind::Integer),
    ("consolidation_context_episodes", Kind::Integer),
    ("consolidation_retry_base_ms", Kind::Integer),
    ("consolidation_lease_seconds", Kind::Integer),
    ("consolidation_max_attempts", Kind::Integer),
    ("consolidation_token_budget", Kind::Integer),
    ("consolidation_max_batches_per_run", Kind::Integer),
    ("consolidation_settle_ms", Kind::Integer),
    ("consolidation_run_cost", Kind::Integer),
    ("rate_limit_per_second", Kind::Integer),
    ("rate_limit_burst", Kind::Integer),
    ("max_body_bytes", Kind::Integer),
    ("max_import_bytes", Kind::Integer),
    ("max_text_chars", Kind::Integer),
    ("metrics_require_auth", Kind::Boolean),
    ("metrics_token", Kind::Text),
    ("export_key", Kind::Text),
    ("otlp_endpoint", Kind::Text),
    ("log_level", Kind::Text),
    ("log_format", Kind::Text),
    ("dev", Kind::Boolean),
    ("workers", Kind::Integer),
    ("bump_usage_on_recall", Kind::Boolean),
    ("vector_cache_mb", Kind::Integer),
    ("mcp_allowed_hosts", Kind::Text),
    ("tls_cert", Kind::Text),
    ("tls_key", Kind::Text),
    ("review", Kind::Text),
    ("review_min_confidence", Kind::Float),
];

/// Settings that may be given as a file instead, through the same name with `_FILE`
/// appended (mounted secrets).
pub(crate) const SECRETS: &[&str] = &[
    "jwt_secret",
    "metrics_token",
    "export_key",
    "llm_api_key",
    "rerank_api_key",
    "cluster_username",
    "cluster_password",
    "cluster_api_key",
    "cluster_bearer_token",
];

/// The content of a `<NAME>_FILE` secret, without its trailing line break.
fn secret_file(name: &str, path: Option<String>) -> Result<Option<String>, ConfigError> {
    let Some(path) = path else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(&path)
        .map_err(|error| config_error(format!("{name}_FILE"), format!("cannot read {path}: {error}")))?;
    Ok(Some(text.trim_end_matches(['\n', '\r']).to_owned()))
}

/// A configuration problem, naming the key (or environment variable) at fault.
#[derive(Debug, thiserror::Error)]
#[error("configuration error: {key}: {message}")]
pub struct ConfigError {
    pub key: String,
    pub message: String,
}

fn config_error(key: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError {
        key: key.into(),
        message: message.into(),
    }
}

impl Config {
    /// The cluster's credentials and TLS settings must be complete, unambiguous and
    /// usable with the URL's scheme. Messages name settings, never their values.
    fn validate_cluster_access(&self) -> Result<(), ConfigError> {
        // One URL, or several nodes of one cluster separated by commas.
        for url in self
            .cluster_url
            .iter()
            .flat_map(|urls| urls.split(','))
            .map(str::trim)
        {
            let Some((scheme, rest)) = url.split_once("://") else {
                return Err(config_error(
                    "CAIRN_CLUSTER_URL",
                    "must be an http:// or https:// URL",
                ));
            };
            let scheme = scheme.to_ascii_lowercase();
            if !matches!(scheme.as_str(), "http" | "https") {
                return Err(config_error(
                    "CAIRN_CLUSTER_URL",
                    "must be an http:// or https:// URL",
                ));
            }
            let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
            if authority.contains('@') {
                return Err(config_error(
                    "CAIRN_CLUSTER_URL",
                    "must not hold credentials; set CAIRN_CLUSTER_USERNAME and CAIRN_CLUSTER_PASSWORD",
                ));
            }
            let tls = self.cluster_ca_cert.is_some()
                || self.cluster_client_cert.is_some()
                || self.cluster_tls_insecure;
            if tls && scheme != "https" {
                return Err(config_error(
                    "CAIRN_CLUSTER_URL",
                    "TLS settings (CAIRN_CLUSTER_CA_CERT, CAIRN_CLUSTER_CLIENT_CERT, CAIRN_CLUSTER_TLS_INSECURE) need an https:// URL",
                ));
            }
        }
        if self.cluster_username.is_some() != self.cluster_password.is_some() {
            return Err(config_error(
                if self.cluster_username.is_some() {
                    "CAIRN_CLUSTER_PASSWORD"
                } else {
                    "CAIRN_CLUSTER_USERNAME"
                },
                "basic authentication needs both CAIRN_CLUSTER_USERNAME and CAIRN_CLUSTER_PASSWORD",
            ));
        }
        let schemes = [
            self.cluster_username.is_some(),
            self.cluster_api_key.is_some(),
            self.cluster_bearer_token.is_some(),
        ];
        if schemes.iter().filter(|set| **set).count() > 1 {
            return Err(config_error(
                "CAIRN_CLUSTER_API_KEY",
                "set one of CAIRN_CLUSTER_USERNAME/PASSWORD, CAIRN_CLUSTER_API_KEY and CAIRN_CLUSTER_BEARER_TOKEN",
            ));
        }
        for (name, value) in [
            ("CAIRN_CLUSTER_USERNAME", &self.cluster_username),
            ("CAIRN_CLUSTER_PASSWORD", &self.cluster_password),
            ("CAIRN_CLUSTER_API_KEY", &self.cluster_api_key),
            ("CAIRN_CLUSTER_BEARER_TOKEN", &self.cluster_bearer_token),
        ] {
            if value
                .as_ref()
                .is_some_and(|value| value.is_empty() || value.chars().any(char::is_control))
            {
                return Err(config_error(
                    name,
                    "must be non-empty text without control characters",
                ));
            }
        }
        if self.cluster_client_cert.is_some() != self.cluster_client_key.is_some() {
            return Err(config_error(
                if self.cluster_client_cert.is_some() {
                    "CAIRN_CLUSTER_CLIENT_KEY"
                } else {
                    "CAIRN_CLUSTER_CLIENT_CERT"
                },
                "mutual TLS needs both CAIRN_CLUSTER_CLIENT_CERT and CAIRN_CLUSTER_CLIENT_KEY",
            ));
        }
        if self.cluster_tls_insecure && self.cluster_ca_cert.is_some() {
            return Err(config_error(
                "CAIRN_CLUSTER_TLS_INSECURE",
                "skips verification, so CAIRN_CLUSTER_CA_CERT would be ignored; set one of them",
            ));
        }
        Ok(())
    }

    /// Reads the process environment (and the file it names with `CAIRN_CONFIG`, or
    /// `file` when given) into a validated configuration.
    #[allow(clippy::disallowed_methods)]
    pub fn load(file: Option<&Path>) -> Result<Config, ConfigError> {
        let variables: Vec<(String, String)> = std::env::vars().collect();
        Config::from_sources(file, &variables)
    }

    /// Layers a file and the given `CAIRN_*` variables over the defaults, then validates.
    pub fn from_sources(file: Option<&Path>, variables: &[(String, String)]) -> Result<Config, ConfigError> {
        let lookup = |name: &str| {
            variables
                .iter()
                .find(|(key, _)| key == name)
                .map(|(_, value)| value.clone())
        };
        let file = file
            .map(Path::to_path_buf)
            .or_else(|| lookup("CAIRN_CONFIG").map(PathBuf::from));
        let mut table = match &file {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|error| {
                    config_error("CAIRN_CONFIG", format!("cannot read {}: {error}", path.display()))
                })?;
                text.parse::<toml::Table>()
                    .map_err(|error| config_error(path.display().to_string(), error.to_string()))?
            }
            None => toml::Table::new(),
        };
        for (key, kind) in KEYS {
            let name = format!("CAIRN_{}", key.to_uppercase());
            let from_file = if SECRETS.contains(key) {
                secret_file(&name, lookup(&format!("{name}_FILE")))?
            } else {
                None
            };
            let raw = match (lookup(&name), from_file) {
                (Some(_), Some(_)) => {
                    return Err(config_error(
                        &name,
                        format!("set either {name} or {name}_FILE, not both"),
                    ));
                }
                (Some(raw), None) | (None, Some(raw)) => raw,
                (None, None) => continue,
            };
            // An empty cluster setting is an unset one (a template's blank variable).
            if raw.is_empty() && key.starts_with("cluster_") {
                continue;
            }
            let value = match kind {
                Kind::Text => toml::Value::String(raw),
                Kind::Integer => raw
                    .trim()
                    .parse::<i64>()
                    .map(toml::Value::Integer)
                    .map_err(|_| config_error(&name, format!("expected a whole number, got {raw:?}")))?,
                Kind::Float => raw
                    .trim()
                    .parse::<f64>()
                    .map(toml::Value::Float)
                    .map_err(|_| config_error(&name, format!("expected a number, got {raw:?}")))?,
                Kind::Boolean => match raw.trim().to_ascii_lowercase().as_str() {
                    "1" | "true" | "yes" | "on" => toml::Value::Boolean(true),
                    "0" | "false" | "no" | "off" | "" => toml::Value::Boolean(false),
                    _ => {
                        return Err(config_error(
                            &name,
                            format!("expected true or false, got {raw:?}"),
                        ));
                    }
                },
            };
            table.insert((*key).to_owned(), value);
        }
        let config: Config = toml::Value::Table(table)
            .try_into()
            .map_err(|error: toml::de::Error| {
                config_error(
                    file.as_ref()
                        .map(|path| path.display().to_string())
                        .unwrap_or_else(|| "environment".into()),
                    error.message().to_owned(),
                )
            })?;
        config.validate()?;
        Ok(config)
    }

    /// The review policy of every tenant: the service-wide one, and each tenant's
    /// overrides from the file.
    pub fn review_policies(&self) -> Result<cairn_app::ReviewPolicies, ConfigError> {
        let default = cairn_app::ReviewPolicy::parse(&self.review, self.review_min_confidence)
            .map_err(|error| config_error("CAIRN_REVIEW", error.to_string()))?;
        let mut tenants = std::collections::HashMap::new();
        for (tenant, settings) in &self.tenants {
            cairn_core::TenantId::parse(tenant)
                .map_err(|error| config_error(format!("tenants.{tenant}"), error.to_string()))?;
            let policy = cairn_app::ReviewPolicy::parse(
                settings.review.as_deref().unwrap_or(&self.review),
                settings
                    .review_min_confidence
                    .unwrap_or(self.review_min_confidence),
            )
            .map_err(|error| config_error(format!("tenants.{tenant}.review"), error.to_string()))?;
            tenants.insert(tenant.clone(), policy);
        }
        Ok(cairn_app::ReviewPolicies { default, tenants })
    }

    fn validate(&self) -> Result<(), ConfigError> {
        self.review_policies()?;
        self.listen.parse::<SocketAddr>().map_err(|_| {
            config_error(
                "CAIRN_LISTEN",
                format!("{:?} is not an address:port", self.listen),
            )
        })?;
        if self.jwt_secret.is_some() && self.jwt_secrets().is_empty() {
            return Err(config_error("CAIRN_JWT_SECRET", "holds no secret"));
        }
        if self.jwt_secrets().iter().any(|secret| secret.len() < 32) {
            return Err(config_error(
                "CAIRN_JWT_SECRET",
                "every secret must be at least 32 bytes",
            ));
        }
        if self.backend != Backend::Embedded && self.cluster_url.is_none() {
            return Err(config_error(
                "CAIRN_CLUSTER_URL",
                "is required when CAIRN_BACKEND is a search cluster",
            ));
        }
        self.validate_cluster_access()?;
        if !self
            .index_prefix
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
            || self.index_prefix.is_empty()
        {
            return Err(config_error(
                "CAIRN_INDEX_PREFIX",
                "must be lower-case letters, digits, - and _",
            ));
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Err(config_error(
                if self.tls_cert.is_some() {
                    "CAIRN_TLS_KEY"
                } else {
                    "CAIRN_TLS_CERT"
                },
                "HTTPS needs both CAIRN_TLS_CERT and CAIRN_TLS_KEY",
            ));
        }
        if self.max_body_bytes < 1024 {
            return Err(config_error("CAIRN_MAX_BODY_BYTES", "must be at least 1024"));
        }
        if self.max_import_bytes < self.max_body_bytes {
            return Err(config_error(
                "CAIRN_MAX_IMPORT_BYTES",
                "must be at least CAIRN_MAX_BODY_BYTES",
            ));
        }
        if self.max_text_chars == 0 {
            return Err(config_error("CAIRN_MAX_TEXT_CHARS", "must be positive"));
        }
        if self.rate_limit_per_second > 0 && self.rate_limit_burst == 0 {
            return Err(config_error(
                "CAIRN_RATE_LIMIT_BURST",
                "must be positive when a rate limit is set",
            ));
        }
        if self.embedding_dimension == 0 {
            return Err(config_error("CAIRN_EMBEDDING_DIMENSION", "must be positive"));
        }
        if !EMBEDDING_MODELS.contains(&self.embedding_model.as_str()) {
            return Err(config_error(
                "CAIRN_EMBEDDING_MODEL",
                format!("must be one of {}", EMBEDDING_MODELS.join(", ")),
            ));
        }
        for (name, weight) in [
            ("CAIRN_BM25_WEIGHT", self.bm25_weight),
            ("CAIRN_KNN_WEIGHT", self.knn_weight),
        ] {
            if !(weight.is_finite() && weight >= 0.0) {
                return Err(config_error(name, "must be a non-negative number"));
            }
        }
        if self.bm25_weight + self.knn_weight <= 0.0 {
            return Err(config_error(
                "CAIRN_BM25_WEIGHT",
                "the BM25 and kNN weights cannot both be 0",
            ));
        }
        if !(self.rrf_k.is_finite() && self.rrf_k >= 0.0) {
            return Err(config_error("CAIRN_RRF_K", "must be a non-negative number"));
        }
        if !(1..=1000).contains(&self.candidates_per_leg) {
            return Err(config_error(
                "CAIRN_CANDIDATES_PER_LEG",
                "must be between 1 and 1000",
            ));
        }
        if !(1..=1000).contains(&self.knn_candidates) {
            return Err(config_error("CAIRN_KNN_CANDIDATES", "must be between 1 and 1000"));
        }
        if !(self.episode_context_weight.is_finite() && (0.0..=1.0).contains(&self.episode_context_weight)) {
            return Err(config_error(
                "CAIRN_EPISODE_CONTEXT_WEIGHT",
                "must be a number between 0 and 1",
            ));
        }
        for (key, value) in [
            ("CAIRN_NAME_BOOST", self.name_boost),
            ("CAIRN_TIME_BOOST", self.time_boost),
        ] {
            if !(value.is_finite() && (0.0..=10.0).contains(&value)) {
                return Err(config_error(key, "must be a number between 0 and 10"));
            }
        }
        for (key, value) in [
            ("CAIRN_RECENCY_WEIGHT", self.recency_weight),
            ("CAIRN_USAGE_WEIGHT", self.usage_weight),
            ("CAIRN_CONFIDENCE_WEIGHT", self.confidence_weight),
        ] {
            if !(value.is_finite() && (0.0..=10.0).contains(&value)) {
                return Err(config_error(key, "must be a number between 0 and 10"));
            }
        }
        if !(self.recency_half_life_days.is_finite() && self.recency_half_life_days > 0.0) {
            return Err(config_error(
                "CAIRN_RECENCY_HALF_LIFE_DAYS",
                "must be a positive number",
            ));
        }
        if let Some(url) = &self.rerank_url
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            return Err(config_error(
                "CAIRN_RERANK_URL",
                "must be an http:// or https:// URL",
            ));
        }
        if let Some(kind) = &self.llm_kind {
            if cairn_inference::llm::ProviderKind::parse(kind).is_none() {
                return Err(config_error(
                    "CAIRN_LLM_KIND",
                    "must be openai, azure, anthropic, ollama, vllm or lmstudio",
                ));
            }
            match &self.llm_base_url {
                Some(url) if url.starts_with("http://") || url.starts_with("https://") => {}
                _ => {
                    return Err(config_error(
                        "CAIRN_LLM_BASE_URL",
                        "an http:// or https:// URL is required with CAIRN_LLM_KIND",
                    ));
                }
            }
            if self
                .llm_model
                .as_deref()
                .is_none_or(|model| model.trim().is_empty())
            {
                return Err(config_error("CAIRN_LLM_MODEL", "is required with CAIRN_LLM_KIND"));
            }
        } else if self.llm_base_url.is_some() || self.llm_model.is_some() {
            return Err(config_error(
                "CAIRN_LLM_KIND",
                "is required when CAIRN_LLM_BASE_URL or CAIRN_LLM_MODEL is set",
            ));
        }
        if cairn_inference::llm::ResponseFormat::parse(&self.llm_response_format).is_none() {
            return Err(config_error(
                "CAIRN_LLM_RESPONSE_FORMAT",
                "must be json_schema or json_object",
            ));
        }
        if self.llm_timeout_ms == 0 {
            return Err(config_error("CAIRN_LLM_TIMEOUT_MS", "must be positive"));
        }
        if self.llm_max_retries > 10 {
            return Err(config_error("CAIRN_LLM_MAX_RETRIES", "must be at most 10"));
        }
        for (key, value) in [
            ("CAIRN_LLM_INPUT_PRICE_PER_MTOK", self.llm_input_price_per_mtok),
            ("CAIRN_LLM_OUTPUT_PRICE_PER_MTOK", self.llm_output_price_per_mtok),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(config_error(key, "must be a non-negative number"));
            }
        }
        if !(1..=200).contains(&self.consolidation_batch_size) {
            return Err(config_error(
                "CAIRN_CONSOLIDATION_BATCH_SIZE",
                "must be between 1 and 200",
            ));
        }
        if self.consolidation_context_episodes > 100 {
            return Err(config_error(
                "CAIRN_CONSOLIDATION_CONTEXT_EPISODES",
                "must be at most 100",
            ));
        }
        if !(1..=1000).contains(&self.consolidation_max_batches_per_run) {
            return Err(config_error(
                "CAIRN_CONSOLIDATION_MAX_BATCHES_PER_RUN",
                "must be between 1 and 1000",
            ));
        }
        if self.export_key.as_deref().is_some_and(|key| key.len() < 32) {
            return Err(config_error(
                "CAIRN_EXPORT_KEY",
                "must be at least 32 bytes (a random secret shared by the services that exchange exports)",
            ));
        }
        if self
            .metrics_token
            .as_deref()
            .is_some_and(|token| token.len() < 32)
        {
            return Err(config_error(
                "CAIRN_METRICS_TOKEN",
                "must be at least 32 bytes (a random secret for the operator's scraper)",
            ));
        }
        if !(100..=600_000).contains(&self.cluster_gap_patience_ms) {
            return Err(config_error(
                "CAIRN_CLUSTER_GAP_PATIENCE_MS",
                "must be between 100 and 600000 (ten minutes)",
            ));
        }
        if self.consolidation_settle_ms > 60_000 {
            return Err(config_error(
                "CAIRN_CONSOLIDATION_SETTLE_MS",
                "must be at most 60000 (one minute)",
            ));
        }
        if !(1..=100).contains(&self.consolidation_max_attempts) {
            return Err(config_error(
                "CAIRN_CONSOLIDATION_MAX_ATTEMPTS",
                "must be between 1 and 100",
            ));
        }
        if self.consolidation_lease_seconds == 0 {
            return Err(config_error(
                "CAIRN_CONSOLIDATION_LEASE_SECONDS",
                "must be positive",
            ));
        }
        if self.rerank_url.is_some() && self.rerank_model_dir.is_some() {
            return Err(config_error(
                "CAIRN_RERANK_MODEL_DIR",
                "choose one reranker: a model directory or CAIRN_RERANK_URL",
            ));
        }
        if !(2..=200).contains(&self.rerank_candidates) {
            return Err(config_error(
                "CAIRN_RERANK_CANDIDATES",
                "must be between 2 and 200",
            ));
        }
        if self.workers == 0 {
            return Err(config_error("CAIRN_WORKERS", "must be positive"));
        }
        if !(1..=1_048_576).contains(&self.vector_cache_mb) {
            return Err(config_error(
                "CAIRN_VECTOR_CACHE_MB",
                "must be between 1 and 1048576",
            ));
        }
        if self.mcp_allowed_hosts().is_some_and(|hosts| hosts.is_empty())
            && self.mcp_allowed_hosts.as_deref().map(str::trim) != Some("*")
        {
            return Err(config_error(
                "CAIRN_MCP_ALLOWED_HOSTS",
                "lists no host; use * to disable the check",
            ));
        }
        if let Some(endpoint) = &self.otlp_endpoint
            && !(endpoint.starts_with("http://") || endpoint.starts_with("https://"))
        {
            return Err(config_error(
                "CAIRN_OTLP_ENDPOINT",
                "must be an http:// or https:// URL",
            ));
        }
        Ok(())
    }

    /// The MCP endpoint's accepted `Host` values: `None` keeps the loopback-only default,
    /// an empty list (from `*`) disables the check.
    pub fn mcp_allowed_hosts(&self) -> Option<Vec<String>> {
        let hosts = self.mcp_allowed_hosts.as_deref()?;
        if hosts.trim() == "*" {
            return Some(Vec::new());
        }
        Some(
            hosts
                .split(',')
                .map(str::trim)
                .filter(|host| !host.is_empty())
                .map(str::to_owned)
                .collect(),
        )
    }

    /// The embedder settings, with defaults under the models directory.
    pub fn embedder(&self) -> cairn_inference::EmbedderConfig {
        cairn_inference::EmbedderConfig {
            runtime_library: self
                .onnxruntime_library
                .clone()
                .unwrap_or_else(|| self.models_dir.join("onnxruntime").join("libonnxruntime.so")),
            model_dir: self
                .embedding_model_dir
                .clone()
                .unwrap_or_else(|| self.models_dir.join(&self.embedding_model)),
            dimension: self.embedding_dimension,
            intra_threads: self.inference_threads.max(1),
            max_batch: 32,
            max_tokens: 256,
        }
    }

    /// The LLM provider settings, when one is configured.
    pub fn llm(&self) -> Option<cairn_inference::llm::LlmConfig> {
        let kind = cairn_inference::llm::ProviderKind::parse(self.llm_kind.as_deref()?)?;
        Some(cairn_inference::llm::LlmConfig {
            kind,
            base_url: self.llm_base_url.clone()?,
            model: self.llm_model.clone()?,
            api_key: self.llm_api_key.clone(),
            api_version: self.llm_api_version.clone(),
            timeout: std::time::Duration::from_millis(self.llm_timeout_ms),
            max_retries: self.llm_max_retries,
            backoff: std::time::Duration::from_millis(self.llm_retry_backoff_ms),
            max_retry_after: std::time::Duration::from_millis(self.llm_max_retry_after_ms),
            input_price_per_mtok: self.llm_input_price_per_mtok,
            output_price_per_mtok: self.llm_output_price_per_mtok,
            max_output_tokens: self.llm_max_output_tokens,
            response_format: cairn_inference::llm::ResponseFormat::parse(&self.llm_response_format)
                .unwrap_or_default(),
        })
    }

    /// Where development mode keeps its generated HS256 secret.
    /// The configured HS256 secrets, in order (the first signs minted tokens).
    pub fn jwt_secrets(&self) -> Vec<&str> {
        self.jwt_secret
            .as_deref()
            .map(|secrets| secrets.split_whitespace().collect())
            .unwrap_or_default()
    }

    pub fn dev_secret_path(&self) -> PathBuf {
        self.data_dir.join("dev-jwt-secret")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn variables(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn fusion_is_chosen_by_name_with_valid_weights() {
        let defaults = Config::from_sources(None, &[]).expect("defaults");
        assert_eq!(
            (defaults.fusion, defaults.bm25_weight, defaults.knn_weight),
            (FusionKind::Scores, 0.7, 0.3)
        );
        let rrf = Config::from_sources(
            None,
            &variables(&[("CAIRN_FUSION", "rrf"), ("CAIRN_KNN_WEIGHT", "1")]),
        )
        .expect("rrf");
        assert_eq!((rrf.fusion, rrf.knn_weight), (FusionKind::Rrf, 1.0));
        for (pairs, key) in [
            (vec![("CAIRN_FUSION", "borda")], "environment"),
            (vec![("CAIRN_BM25_WEIGHT", "-1")], "CAIRN_BM25_WEIGHT"),
            (
                vec![("CAIRN_BM25_WEIGHT", "0"), ("CAIRN_KNN_WEIGHT", "0")],
                "CAIRN_BM25_WEIGHT",
            ),
        ] {
            let error = Config::from_sources(None, &variables(&pairs)).expect_err("refused");
            assert_eq!(error.key, key, "{error}");
        }
    }

    #[test]
    fn vector_legs_take_fewer_candidates_unless_told_otherwise() {
        let defaults = Config::from_sources(None, &[]).expect("defaults");
        assert_eq!((defaults.candidates_per_leg, defaults.knn_candidates), (50, 20));
        let wider = Config::from_sources(None, &variables(&[("CAIRN_KNN_CANDIDATES", "50")])).expect("50");
        assert_eq!(wider.knn_candidates, 50);
        for value in ["0", "1001", "many"] {
            let error = Config::from_sources(None, &variables(&[("CAIRN_KNN_CANDIDATES", value)]))
                .expect_err("refused");
            assert!(error.to_string().contains("CAIRN_KNN_CANDIDATES"), "{error}");
        }
    }

    #[test]
    fn cluster_access_settings_are_complete_and_unambiguous() {
        let cluster = |extra: &[(&str, &str)]| {
            // The first of two settings of one name wins: `extra` overrides the defaults.
            let mut pairs = extra.to_vec();
            pairs.extend_from_slice(&[
                ("CAIRN_BACKEND", "elasticsearch"),
                ("CAIRN_CLUSTER_URL", "https://search.internal:9200"),
            ]);
            Config::from_sources(None, &variables(&pairs))
        };
        let secret = "hunter2-very-secret";
        let basic = cluster(&[
            ("CAIRN_CLUSTER_USERNAME", "cairn"),
            ("CAIRN_CLUSTER_PASSWORD", secret),
        ])
        .expect("basic authentication");
        assert_eq!(basic.cluster_password.as_deref(), Some(secret));
        let cases: Vec<(Vec<(&str, &str)>, &str)> = vec![
            (
                vec![("CAIRN_CLUSTER_USERNAME", "cairn")],
                "CAIRN_CLUSTER_PASSWORD",
            ),
            (vec![("CAIRN_CLUSTER_PASSWORD", secret)], "CAIRN_CLUSTER_USERNAME"),
            (
                vec![
                    ("CAIRN_CLUSTER_API_KEY", secret),
                    ("CAIRN_CLUSTER_BEARER_TOKEN", secret),
                ],
                "CAIRN_CLUSTER_API_KEY",
            ),
            (
                vec![("CAIRN_CLUSTER_CLIENT_CERT", "/tls/client.pem")],
                "CAIRN_CLUSTER_CLIENT_KEY",
            ),
            (
                vec![
                    ("CAIRN_CLUSTER_TLS_INSECURE", "true"),
                    ("CAIRN_CLUSTER_CA_CERT", "/tls/ca.pem"),
                ],
                "CAIRN_CLUSTER_TLS_INSECURE",
            ),
            (
                vec![(
                    "CAIRN_CLUSTER_URL",
                    "https://cairn:hunter2-very-secret@search:9200",
                )],
                "CAIRN_CLUSTER_URL",
            ),
            (
                vec![
                    ("CAIRN_CLUSTER_URL", "http://search:9200"),
                    ("CAIRN_CLUSTER_CA_CERT", "/tls/ca.pem"),
                ],
                "CAIRN_CLUSTER_URL",
            ),
        ];
        for (extra, key) in cases {
            let error = cluster(&extra).expect_err("refused");
            assert_eq!(error.key, key, "{extra:?}");
            assert!(!error.to_string().contains(secret), "{error}");
        }
        // Blank settings (an unfilled template variable) are unset.
        let blank = cluster(&[("CAIRN_CLUSTER_CA_CERT", ""), ("CAIRN_CLUSTER_API_KEY", "")]).expect("blank");
        assert!(blank.cluster_ca_cert.is_none() && blank.cluster_api_key.is_none());
        // Secrets come from files too.
        let directory = std::env::temp_dir().join(format!("cairn-cluster-{}", std::process::id()));
        std::fs::create_dir_all(&directory).expect("temp dir");
        let file = directory.join("key");
        std::fs::write(&file, format!("{secret}\n")).expect("write");
        let from_file =
            cluster(&[("CAIRN_CLUSTER_API_KEY_FILE", &file.display().to_string())]).expect("file");
        assert_eq!(from_file.cluster_api_key.as_deref(), Some(secret));
        std::fs::remove_dir_all(&directory).ok();
    }

    #[test]
    fn the_embedding_model_is_one_of_the_provisioned_ones() {
        let config = Config::from_sources(None, &variables(&[("CAIRN_EMBEDDING_MODEL", "e5-small-v2")]))
            .expect("valid");
        assert!(config.embedder().model_dir.ends_with("e5-small-v2"));
        assert!(
            Config::from_sources(None, &variables(&[]))
                .expect("valid")
                .embedder()
                .model_dir
                .ends_with("all-minilm-l6-v2"),
            "MiniLM by default"
        );
        let wrong = Config::from_sources(None, &variables(&[("CAIRN_EMBEDDING_MODEL", "gpt-embed")]))
            .expect_err("unknown model");
        assert_eq!(wrong.key, "CAIRN_EMBEDDING_MODEL");
        assert!(wrong.message.contains("bge-small-en-v1.5"), "{}", wrong.message);
    }

    #[test]
    fn secrets_come_from_files_and_several_jwt_secrets_are_accepted() {
        let directory = std::env::temp_dir().join(format!("cairn-secrets-{}", std::process::id()));
        std::fs::create_dir_all(&directory).expect("temp dir");
        let file = directory.join("jwt");
        let (old, new) = ("o".repeat(32), "n".repeat(40));
        std::fs::write(&file, format!("{new}\n{old}\n")).expect("write");
        let path = file.display().to_string();
        let config =
            Config::from_sources(None, &variables(&[("CAIRN_JWT_SECRET_FILE", &path)])).expect("valid");
        assert_eq!(config.jwt_secrets(), vec![new.as_str(), old.as_str()]);
        let both = Config::from_sources(
            None,
            &variables(&[("CAIRN_JWT_SECRET_FILE", &path), ("CAIRN_JWT_SECRET", &old)]),
        )
        .expect_err("both refused");
        assert_eq!(both.key, "CAIRN_JWT_SECRET");
        let short = Config::from_sources(
            None,
            &variables(&[("CAIRN_JWT_SECRET", &format!("{new} too-short"))]),
        )
        .expect_err("a short secret is refused");
        assert!(short.message.contains("every secret"), "{short:?}");
        let missing = Config::from_sources(
            None,
            &variables(&[("CAIRN_LLM_API_KEY_FILE", "/nonexistent/cairn-key")]),
        )
        .expect_err("an unreadable file is refused");
        assert_eq!(missing.key, "CAIRN_LLM_API_KEY_FILE");
        std::fs::remove_dir_all(&directory).ok();
    }

    #[test]
    fn review_policies_come_per_tenant_from_the_file() {
        let directory = std::env::temp_dir().join(format!("cairn-review-{}", std::process::id()));
        std::fs::create_dir_all(&directory).expect("temp dir");
        let file = directory.join("cairn.toml");
        std::fs::write(
            &file,
            "review = \"supersession\"\n[tenants.clinic]\nreview = \"all\"\n\
             [tenants.shop]\nreview = \"low_confidence\"\nreview_min_confidence = 0.7\n",
        )
        .expect("write");
        let config = Config::from_sources(Some(&file), &[]).expect("valid");
        let policies = config.review_policies().expect("policies");
        assert!(policies.for_tenant("acme").supersession && !policies.for_tenant("acme").all);
        assert!(policies.for_tenant("clinic").all);
        let shop = policies.for_tenant("shop");
        assert!(shop.low_confidence && !shop.supersession);
        assert!((shop.min_confidence - 0.7).abs() < 1e-6);
        // The environment names the default; a bad rule names where it is.
        let strict =
            Config::from_sources(Some(&file), &[("CAIRN_REVIEW".into(), "all".into())]).expect("valid");
        assert!(strict.review_policies().expect("policies").for_tenant("acme").all);
        let wrong = Config::from_sources(None, &[("CAIRN_REVIEW".into(), "everything".into())])
            .expect_err("unknown rule");
        assert_eq!(wrong.key, "CAIRN_REVIEW");
        std::fs::write(&file, "[tenants.shop]\nreview = \"fact_type:health\"\n").expect("write");
        let wrong = Config::from_sources(Some(&file), &[]).expect_err("unknown fact type");
        assert_eq!(wrong.key, "tenants.shop.review");
        std::fs::remove_dir_all(&directory).ok();
    }

    #[test]
    fn defaults_apply_without_sources() {
        let config = Config::from_sources(None, &[]).expect("defaults are valid");
        assert_eq!(config.listen, "127.0.0.1:8080");
        assert_eq!(config.backend, Backend::Embedded);
        assert_eq!(config.index_prefix, "cairn");
        assert_eq!(config.data_dir, PathBuf::from("./data"));
    }

    #[test]
    fn environment_overrides_file_and_bad_values_name_the_key() {
        let directory = std::env::temp_dir().join(format!("cairn-config-{}", std::process::id()));
        std::fs::create_dir_all(&directory).expect("temp dir");
        let file = directory.join("cairn.toml");
        std::fs::write(&file, "listen = \"127.0.0.1:9000\"\nrate_limit_per_second = 5\n").expect("write");
        let config = Config::from_sources(Some(&file), &variables(&[("CAIRN_LISTEN", "127.0.0.1:9100")]))
            .expect("valid");
        assert_eq!(config.listen, "127.0.0.1:9100");
        assert_eq!(config.rate_limit_per_second, 5);

        let error = Config::from_sources(None, &variables(&[("CAIRN_RATE_LIMIT_BURST", "many")]))
            .expect_err("not a number");
        assert_eq!(error.key, "CAIRN_RATE_LIMIT_BURST");
        let error =
            Config::from_sources(None, &variables(&[("CAIRN_JWT_SECRET", "short")])).expect_err("short");
        assert_eq!(error.key, "CAIRN_JWT_SECRET");
        let error =
            Config::from_sources(None, &variables(&[("CAIRN_BACKEND", "mongodb")])).expect_err("unknown");
        assert!(error.message.contains("mongodb"), "{}", error.message);
        let error =
            Config::from_sources(None, &variables(&[("CAIRN_BACKEND", "opensearch")])).expect_err("no url");
        assert_eq!(error.key, "CAIRN_CLUSTER_URL");
        std::fs::write(&file, "colour = \"blue\"\n").expect("write");
        let error = Config::from_sources(Some(&file), &[]).expect_err("unknown key");
        assert!(error.message.contains("colour"), "{}", error.message);
    }
}
