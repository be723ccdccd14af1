//! Recall latency and ingest throughput on the embedded store, through the same
//! use-case functions the REST handlers call, with the real embedding model. Prints
//! figures; asserts nothing.
//!
//! Run with `cargo bench -p cairn-server --bench recall` (see docs/src/results/benchmarks.md). Sizes can be
//! narrowed with arguments, e.g. `-- 1000 10000`.

use cairn_app::{
    Cairn, ConsolidateMode, FactInput, IngestRequest, Message, RecallRequest, RequestContext, Role, Settings,
};
use cairn_core::{Embedder, MemoryStore, Tier};
use cairn_inference::OnnxEmbedder;
use cairn_store_cluster::ClusterStore;
use cairn_store_sqlite::SqliteStore;
use std::sync::Arc;
use std::time::{Duration, Instant};

const OTHER_SCOPES: usize = 100;
const FACTS_PER_OTHER_SCOPE: usize = 100;
const QUERIES: usize = 300;
const ALTERNATIONS: usize = 100;

#[path = "common/mod.rs"]
mod common;
use common::{Sequence, load, peak_rss_mib, percentile, scope};

fn main() {
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    let sizes: Vec<usize> = arguments
        .iter()
        .filter_map(|argument| argument.parse().ok())
        .collect();
    // `--opensearch URL` runs on a search cluster (fresh indices, deleted afterwards).
    let opensearch = common::flag_value(&arguments, "--opensearch");
    // `--legs bm25` or `--legs knn` times one leg alone, to see where the time goes.
    let legs = common::flag_value(&arguments, "--legs").unwrap_or_else(|| "both".into());
    // `--model NAME` embeds with another provisioned model (`CAIRN_EMBEDDING_MODEL`).
    let model = common::flag_value(&arguments, "--model");
    let sizes = if sizes.is_empty() {
        vec![1_000, 10_000, 100_000]
    } else {
        sizes
    };
    // `--log cairn_store_cluster=debug` logs every cluster request with its time.
    if let Some(filter) = common::flag_value(&arguments, "--log") {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .init();
    }
    let runtime = common::runtime();
    runtime.block_on(async {
        let directory = tempfile::tempdir().expect("temp dir");
        let cluster = match &opensearch {
            Some(url) => {
                let prefix = format!("cairn-bench-{}", std::process::id());
                println!("index prefix: {prefix}");
                let cluster = ClusterStore::connect(url, &prefix, 384).await.expect("the cluster answers");
                cluster.bootstrap().await.expect("bootstrap");
                println!("backend: {} {}", cluster.engine().as_str(), cluster.version());
                Some(cluster)
            }
            None => {
                println!("backend: embedded");
                None
            }
        };
        let store: Arc<dyn MemoryStore> = match &cluster {
            Some(cluster) => Arc::new(cluster.clone()),
            None => Arc::new(SqliteStore::open(directory.path()).expect("store")),
        };
        let models = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.models");
        let mut config = cairn_server::config::Config { models_dir: models, ..Default::default() };
        if let Some(model) = &model {
            config.embedding_model = model.clone();
        }
        println!("embedding model: {}", config.embedding_model);
        let embedder: Arc<dyn Embedder> =
            Arc::new(OnnxEmbedder::load(&config.embedder()).expect("run scripts/setup first"));
        // The service's defaults, use counting included: recall notes uses in memory and
        // a task writes them each second, as `cairn serve`'s maintenance task does.
        let mut settings = Settings::default();
        match legs.as_str() {
            "bm25" => settings.knn_weight = 0.0,
            "knn" => settings.bm25_weight = 0.0,
            _ => {}
        }
        let cairn = Cairn::new(Arc::clone(&store), Some(Arc::clone(&embedder)), settings);
        let flusher = cairn.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                flusher.flush_usage().await.expect("write use counts");
            }
        });
        let mut sequence = Sequence(0x9e37_79b9_7f4a_7c15);

        // Ingest throughput: episodes through the ingest use case, embedding included, all
        // of one session (so each is indexed with its neighbours as context).
        let episodes = if legs == "both" { 2_000 } else { 0 };
        let ingest_scope = scope("ingest-tenant");
        let context = RequestContext { request_id: "bench".into() };
        let started = Instant::now();
        for batch in 0..episodes / 20 {
            let messages = (0..20)
                .map(|i| Message { role: Role::User, content: sequence.sentence(batch * 20 + i), timestamp: None })
                .collect();
            let request = IngestRequest { messages, session_id: Some("bench-session".into()), consolidate: ConsolidateMode::None };
            cairn.ingest(&ingest_scope, &context, request).await.expect("ingest");
        }
        let ingest_seconds = started.elapsed().as_secs_f64();
        if episodes > 0 {
            println!(
            "ingest: {episodes} episodes in calls of 20 in {ingest_seconds:.1} s = {:.0} episodes/s (embedding included)",
            episodes as f64 / ingest_seconds
            );
        }
        let started = Instant::now();
        for index in 0..episodes / 10 {
            let messages = vec![Message { role: Role::User, content: sequence.sentence(index), timestamp: None }];
            let request = IngestRequest { messages, session_id: Some("bench-session".into()), consolidate: ConsolidateMode::None };
            cairn.ingest(&ingest_scope, &context, request).await.expect("ingest");
        }
        if episodes > 0 {
            println!(
                "ingest: {} single-episode calls = {:.0} episodes/s",
                episodes / 10,
                (episodes / 10) as f64 / started.elapsed().as_secs_f64()
            );
        }

        for other in 0..OTHER_SCOPES {
            load(store.as_ref(), embedder.as_ref(), &scope(&format!("other-{other}")), FACTS_PER_OTHER_SCOPE, &mut sequence)
                .await;
        }
        println!("{OTHER_SCOPES} other scopes with {FACTS_PER_OTHER_SCOPE} facts each are present");
        let measured = scope("bench-tenant");
        let mut loaded = 0;
        for size in sizes {
            load(store.as_ref(), embedder.as_ref(), &measured, size - loaded, &mut sequence).await;
            loaded = size;
            if let Some(url) = &opensearch {
                let latencies = timed_recalls(&cairn, &measured, &mut sequence).await;
                println!(
                    "recall k=10, {legs} legs, {size} facts, right after loading them: \
                     p50 {:.1} ms, p95 {:.1} ms, p99 {:.1} ms",
                    percentile(&latencies, 0.50),
                    percentile(&latencies, 0.95),
                    percentile(&latencies, 0.99)
                );
                let waited = common::merges_settled(url).await;
                println!("the node's merges settled {:.1} s later", waited.as_secs_f64());
            }
            let latencies = timed_recalls(&cairn, &measured, &mut sequence).await;
            println!(
                "recall k=10, {legs} legs, {size} facts in the scope: p50 {:.1} ms, p95 {:.1} ms, p99 {:.1} ms",
                percentile(&latencies, 0.50),
                percentile(&latencies, 0.95),
                percentile(&latencies, 0.99)
            );
            // A scope that alternates writes and recalls: each recall follows a write.
            let mut alternating = Vec::with_capacity(ALTERNATIONS);
            for index in 0..ALTERNATIONS {
                let input = FactInput {
                    text: sequence.sentence(1_000_000 + loaded + index),
                    ..FactInput::default()
                };
                cairn.write_fact(&measured, &context, input).await.expect("write");
                let mut request = RecallRequest::new("what does the coach think about green tea");
                request.k = Some(10);
                request.tiers = vec![Tier::Semantic];
                let started = Instant::now();
                cairn.recall(&measured, request).await.expect("recall");
                alternating.push(started.elapsed());
            }
            loaded += ALTERNATIONS;
            alternating.sort();
            println!(
                "recall right after a write ({ALTERNATIONS} alternations), {size} facts: p50 {:.1} ms, p95 {:.1} ms",
                percentile(&alternating, 0.50),
                percentile(&alternating, 0.95)
            );
        }
        let started = Instant::now();
        for _ in 0..100 {
            embedder
                .embed_queries(vec!["what does the coach think about green tea".into()])
                .await
                .expect("embed");
        }
        println!("query embedding alone: {:.1} ms per query", started.elapsed().as_secs_f64() * 10.0);
        println!("peak RSS: {:.0} MiB", peak_rss_mib());
        // `--keep` leaves the cluster's indices in place, to look at them afterwards.
        if let Some(cluster) = cluster.filter(|_| !arguments.iter().any(|argument| argument == "--keep")) {
            cluster.delete_indices().await.expect("clean up");
        }
    });
}

/// The times of [`QUERIES`] recalls of varied questions, sorted, after 20 unmeasured.
async fn timed_recalls(cairn: &Cairn, scope: &cairn_core::Scope, sequence: &mut Sequence) -> Vec<Duration> {
    let mut latencies = Vec::with_capacity(QUERIES);
    for warm in 0..QUERIES + 20 {
        let query = sequence.question();
        let mut request = RecallRequest::new(query);
        request.k = Some(10);
        request.tiers = vec![Tier::Semantic];
        let started = Instant::now();
        let result = cairn.recall(scope, request).await.expect("recall");
        if warm >= 20 {
            latencies.push(started.elapsed());
        }
        assert!(!result.hits.is_empty());
    }
    latencies.sort();
    latencies
}
