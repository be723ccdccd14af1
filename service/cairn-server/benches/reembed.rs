//! `cairn reembed` as an operator runs it: N facts in one scope stored with
//! all-MiniLM-L6-v2 vectors, then the real binary moves them to e5-small-v2. Prints the
//! time, the rate and the command's peak RSS; asserts nothing.
//!
//! Run with `cargo bench -p cairn-server --bench reembed -- 10000 100000` (see docs/src/evaluation/embedding-models.md).

use cairn_core::{Embedder, MemoryStore};
use cairn_inference::OnnxEmbedder;
use cairn_store_sqlite::SqliteStore;
use std::time::Instant;

#[path = "common/mod.rs"]
mod common;
use common::{Sequence, load, scope};

fn main() {
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    let mut sizes: Vec<usize> = arguments
        .iter()
        .filter_map(|argument| argument.parse().ok())
        .collect();
    if sizes.is_empty() {
        sizes = vec![10_000, 100_000];
    }
    let models = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.models");
    let runtime = common::runtime();
    for size in sizes {
        let directory = tempfile::tempdir().expect("temp dir");
        let started = Instant::now();
        runtime.block_on(async {
            let store = SqliteStore::open(directory.path()).expect("store");
            let config = cairn_server::config::Config {
                models_dir: models.clone(),
                ..Default::default()
            };
            let embedder = OnnxEmbedder::load(&config.embedder()).expect("run scripts/setup first");
            store
                .claim_embedding_space(embedder.model_id(), embedder.dimension())
                .await
                .expect("claim");
            load(
                &store,
                &embedder,
                &scope("reembed-tenant"),
                size,
                &mut Sequence(0x9e37_79b9_7f4a_7c15),
            )
            .await;
        });
        println!(
            "{size} facts stored with all-minilm-l6-v2 in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        // Under /usr/bin/time when there is one, for the command's own peak RSS.
        let timer = std::path::Path::new("/usr/bin/time");
        let mut command = if timer.exists() {
            let mut command = std::process::Command::new(timer);
            command
                .args(["-f", "peak RSS %M KiB"])
                .arg(env!("CARGO_BIN_EXE_cairn"));
            command
        } else {
            std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
        };
        command
            .arg("reembed")
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("CAIRN_DATA_DIR", directory.path())
            .env("CAIRN_MODELS_DIR", &models)
            .env("CAIRN_EMBEDDING_MODEL", "e5-small-v2");
        let started = Instant::now();
        let output = command.output().expect("run cairn reembed");
        let seconds = started.elapsed().as_secs_f64();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "cairn reembed failed: {stderr}");
        let peak = stderr
            .lines()
            .find_map(|line| line.strip_prefix("peak RSS "))
            .unwrap_or("not measured (no /usr/bin/time)");
        println!(
            "cairn reembed to e5-small-v2: {size} facts in {seconds:.1} s = {:.0} facts/s, peak RSS {peak}",
            size as f64 / seconds
        );
    }
}
