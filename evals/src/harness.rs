//! What both evaluation binaries share: the embedding model they load, the runtime
//! they run on, and the scopes they create (each harness plays the authentication
//! layer for its own synthetic tenants).

use cairn_core::{Permission, Principal, Scope, TenantId};
use cairn_inference::EmbedderConfig;
use std::path::Path;

/// The embedding model named by `CAIRN_EMBEDDING_MODEL` (all-MiniLM-L6-v2 by default)
/// as provisioned by `scripts/setup` under `models`.
pub fn embedder_config(models: &Path) -> EmbedderConfig {
    EmbedderConfig {
        runtime_library: models.join("onnxruntime/libonnxruntime.so"),
        model_dir: models.join(embedding_model()),
        dimension: 384,
        intra_threads: 1,
        max_batch: 32,
        max_tokens: 256,
    }
}

/// The embedding model the evaluation runs with (`CAIRN_EMBEDDING_MODEL`).
#[allow(clippy::disallowed_methods)]
pub fn embedding_model() -> String {
    std::env::var("CAIRN_EMBEDDING_MODEL")
        .ok()
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "all-minilm-l6-v2".to_owned())
}

/// Two worker threads, as on the machine the figures are measured on.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
}

/// The scope of `user` in `tenant`, acted on by `subject`.
#[allow(clippy::disallowed_methods)]
pub fn scope(tenant: &str, user: &str, subject: &str) -> anyhow::Result<Scope> {
    let tenant = TenantId::parse(tenant).map_err(|error| anyhow::anyhow!("{error}"))?;
    Ok(
        Principal::from_verified_credential(subject.into(), tenant, None, vec![Permission::Admin])
            .scope_for(user, Permission::Admin)?,
    )
}
