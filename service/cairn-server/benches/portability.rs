//! Backup and data portability at size, on the embedded store with the real embedding
//! model: `cairn backup` of a store of FACTS facts (default 100,000, in 10 scopes), and
//! the export, erase and import round trip of one user of USER_FACTS facts (default
//! 10,000) through the use cases the routes call. Prints figures; checks only that the
//! round trip kept every fact.
//!
//! Run with `cargo bench -p cairn-server --bench portability [-- FACTS USER_FACTS]`.

#[path = "common/mod.rs"]
mod common;

use cairn_app::{Cairn, RequestContext, Settings};
use cairn_core::{Embedder, MemoryStore, PageRequest, StatusFilter};
use cairn_inference::OnnxEmbedder;
use cairn_store_sqlite::SqliteStore;
use common::{Sequence, load, peak_rss_mib, scope};
use std::sync::Arc;
use std::time::Instant;

fn main() {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|argument| argument.parse().ok())
        .collect();
    let facts = sizes.first().copied().unwrap_or(100_000);
    let user_facts = sizes.get(1).copied().unwrap_or(10_000).min(facts);
    let runtime = common::runtime();
    runtime.block_on(async {
        let directory = tempfile::tempdir().expect("temp dir");
        let store: Arc<dyn MemoryStore> = Arc::new(SqliteStore::open(directory.path()).expect("store"));
        let models = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.models");
        let config = cairn_server::config::Config {
            models_dir: models,
            ..Default::default()
        };
        let embedder: Arc<dyn Embedder> =
            Arc::new(OnnxEmbedder::load(&config.embedder()).expect("run scripts/setup first"));
        let mut sequence = Sequence(0x9e37_79b9_7f4a_7c15);
        let user = scope("portability-tenant");
        let started = Instant::now();
        load(
            store.as_ref(),
            embedder.as_ref(),
            &user,
            user_facts,
            &mut sequence,
        )
        .await;
        let others = facts - user_facts;
        for index in 0..9 {
            let count = others / 9 + usize::from(index < others % 9);
            load(
                store.as_ref(),
                embedder.as_ref(),
                &scope(&format!("other-{index}")),
                count,
                &mut sequence,
            )
            .await;
        }
        println!(
            "loaded {facts} facts ({user_facts} in one user) in {:.0} s",
            started.elapsed().as_secs_f64()
        );

        let database = directory.path().join("cairn.sqlite3");
        let target = directory.path().join("backup.sqlite3");
        let started = Instant::now();
        let report = cairn_store_sqlite::backup(directory.path(), &target).expect("backup");
        println!(
            "backup of {facts} facts: {:.2} s, {:.1} MiB (store file {:.1} MiB)",
            started.elapsed().as_secs_f64(),
            report.bytes as f64 / 1048576.0,
            std::fs::metadata(&database).map(|meta| meta.len()).unwrap_or(0) as f64 / 1048576.0
        );

        let cairn = Cairn::new(
            Arc::clone(&store),
            Some(Arc::clone(&embedder)),
            Settings::default(),
        );
        let context = RequestContext {
            request_id: "bench".into(),
        };
        let started = Instant::now();
        let document = cairn.export_scope(&user).await.expect("export");
        let exported = started.elapsed();
        let bytes = serde_json::to_vec(&document).expect("serialise").len();
        cairn.erase_user(&user, &context).await.expect("erase");
        let started = Instant::now();
        let imported = cairn
            .import_scope(&user, &context, document)
            .await
            .expect("import");
        let import_time = started.elapsed();
        assert_eq!(imported.facts, user_facts);
        let page = store
            .list_facts(
                &user,
                StatusFilter::All,
                chrono::Utc::now(),
                &PageRequest {
                    limit: 1,
                    cursor: None,
                },
            )
            .await
            .expect("list");
        assert!(!page.items.is_empty());
        println!(
            "round trip of {user_facts} facts: export {:.2} s ({:.1} MiB of JSON), import {:.1} s \
             (re-embedding included), peak RSS {:.0} MiB",
            exported.as_secs_f64(),
            bytes as f64 / 1048576.0,
            import_time.as_secs_f64(),
            peak_rss_mib()
        );
    });
}
