//! Hybrid recall latency (BM25 + kNN, query embedding included) at 10k facts in one
//! scope, on the embedded store, through
//! the same use-case function the REST handler calls. Prints figures; asserts nothing.
//!
//! Run with `cargo bench -p cairn-server --bench recall` (see README).

use cairn_app::{Cairn, FactInput, RecallRequest, RequestContext, Settings};
use cairn_core::{FactType, Permission, Principal, Scope, TenantId};
use cairn_store_sqlite::SqliteStore;
use std::sync::Arc;
use std::time::{Duration, Instant};

const SUBJECTS: &[&str] = &[
    "sister",
    "manager",
    "dentist",
    "neighbour",
    "coach",
    "landlord",
    "cousin",
    "teacher",
];
const VERBS: &[&str] = &[
    "prefers",
    "dislikes",
    "recommends",
    "mentioned",
    "bought",
    "booked",
    "cancelled",
    "visited",
];
const OBJECTS: &[&str] = &[
    "oat milk",
    "a trip to Kyoto",
    "the jazz festival",
    "sourdough bread",
    "a standing desk",
    "hiking boots",
    "the Friday meeting",
    "a vegan restaurant",
    "an electric bike",
    "the chess club",
    "a piano lesson",
    "green tea",
    "the marathon",
    "a guitar",
    "the pottery class",
    "a rental car",
];

/// A deterministic pseudo-random sequence (xorshift), so runs are comparable.
struct Sequence(u64);

impl Sequence {
    fn next(&mut self, bound: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % bound as u64) as usize
    }
}

#[allow(clippy::disallowed_methods)]
fn scope(tenant: &str) -> Scope {
    let tenant = TenantId::parse(tenant).expect("tenant");
    Principal::from_verified_credential("bench".into(), tenant, None, vec![Permission::Admin])
        .scope_for("user-1", Permission::Admin)
        .expect("scope")
}

fn percentile(sorted: &[Duration], share: f64) -> f64 {
    let index = ((sorted.len() as f64 - 1.0) * share).round() as usize;
    sorted[index].as_secs_f64() * 1000.0
}

async fn fill(cairn: &Cairn, scope: &Scope, count: usize, sequence: &mut Sequence) -> Duration {
    let context = RequestContext {
        request_id: "bench".into(),
    };
    let started = Instant::now();
    for index in 0..count {
        let text = format!(
            "The user's {} {} {} (note {index})",
            SUBJECTS[sequence.next(SUBJECTS.len())],
            VERBS[sequence.next(VERBS.len())],
            OBJECTS[sequence.next(OBJECTS.len())]
        );
        cairn
            .write_fact(
                scope,
                &context,
                FactInput {
                    text,
                    fact_type: Some(FactType::World),
                    ..FactInput::default()
                },
            )
            .await
            .expect("write");
    }
    started.elapsed()
}

fn main() {
    let facts: usize = 10_000;
    let queries: usize = 500;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let directory = tempfile::tempdir().expect("temp dir");
        let store = SqliteStore::open(directory.path()).expect("store");
        let settings = Settings { bump_usage_on_recall: false, ..Settings::default() };
        let models = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.models");
        let config = cairn_server::config::Config { models_dir: models, ..Default::default() };
        let embedder = cairn_inference::OnnxEmbedder::load(&config.embedder()).expect("run scripts/setup first");
        let cairn = Cairn::new(Arc::new(store), Some(Arc::new(embedder)), settings);
        let mut sequence = Sequence(0x9e37_79b9_7f4a_7c15);
        let measured = scope("bench-tenant");
        let write_time = fill(&cairn, &measured, facts, &mut sequence).await;
        // Another tenant's facts share the index, as in a real multi-tenant store.
        fill(&cairn, &scope("noise-tenant"), facts, &mut sequence).await;

        let mut latencies = Vec::with_capacity(queries);
        let mut hits = 0usize;
        for _ in 0..queries {
            let query = format!(
                "what does the {} think about {}",
                SUBJECTS[sequence.next(SUBJECTS.len())],
                OBJECTS[sequence.next(OBJECTS.len())]
            );
            let mut request = RecallRequest::new(query);
            request.k = Some(10);
            request.tiers = vec![cairn_core::Tier::Semantic];
            let started = Instant::now();
            let result = cairn.recall(&measured, request).await.expect("recall");
            latencies.push(started.elapsed());
            hits += result.hits.len();
        }
        latencies.sort();
        println!("hybrid recall (BM25 + kNN, query embedded), embedded store, {facts} facts in the scope (+{facts} in another tenant)");
        println!(
            "  writes: {facts} facts in {:.1} s ({:.0} writes/s, embedded one by one, one durable transaction each)",
            write_time.as_secs_f64(),
            facts as f64 / write_time.as_secs_f64()
        );
        println!(
            "  recall k=10 over {queries} queries: p50 {:.2} ms, p95 {:.2} ms, p99 {:.2} ms, max {:.2} ms; mean hits {:.1}",
            percentile(&latencies, 0.50),
            percentile(&latencies, 0.95),
            percentile(&latencies, 0.99),
            percentile(&latencies, 1.0),
            hits as f64 / queries as f64
        );
    });
}
