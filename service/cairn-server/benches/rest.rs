//! The service over REST, as users call it: `cairn serve` (the binary built with this
//! benchmark) with its defaults, on the embedded store and, given `--cluster URL`, on
//! a search cluster, side by side in one run. Every figure includes HTTP, JSON,
//! authentication, the query embedding, reranking and use counting as the defaults
//! have them; ingests ask for the default consolidation (`async`), so the worker runs
//! beside them. The per-tenant rate limit is off (it would cap the calls). Prints
//! figures; asserts nothing.
//!
//! Run with `cargo bench -p cairn-server --bench rest -- [FACTS] [--cluster URL]`
//! (see README). The scope under test holds FACTS facts (default 2000), and 20 other
//! users of the tenant 100 each.

use cairn_core::MemoryStore;
use cairn_inference::OnnxEmbedder;
use cairn_store_cluster::ClusterStore;
use cairn_store_sqlite::SqliteStore;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "common/mod.rs"]
mod common;
use common::{OBJECTS, SUBJECTS, Sequence, load, percentile, scope, scope_of};

const SECRET: &str = "rest-benchmark-secret-0123456789abcdef";
const TENANT: &str = "bench-tenant";
const OTHER_USERS: usize = 20;
const FACTS_PER_OTHER_USER: usize = 100;
const QUERIES: usize = 300;
const SINGLE_CALLS: usize = 200;
const CALLERS: usize = 8;
const CALLS_PER_CALLER: usize = 40;
const BATCHES: usize = 50;

/// The figures of one backend.
struct Figures {
    backend: String,
    recall: (f64, f64, f64),
    single: f64,
    concurrent: f64,
    batches: f64,
}

/// A `cairn serve` process, stopped when dropped.
struct Server {
    child: Child,
    base: String,
    token: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_cairn"))
}

fn models() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.models")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .expect("a free port")
}

/// Starts the service on `data` with `env`, waits until it is ready, mints a token.
async fn serve(data: &Path, env: &[(&str, String)], client: &reqwest::Client) -> Server {
    let port = free_port();
    let log = std::fs::File::create(data.join("serve.log")).expect("log file");
    let mut command = Command::new(binary());
    command
        .arg("serve")
        .env("CAIRN_LISTEN", format!("127.0.0.1:{port}"))
        .env("CAIRN_DATA_DIR", data)
        .env("CAIRN_MODELS_DIR", models())
        .env("CAIRN_JWT_SECRET", SECRET)
        // The one default changed: the per-tenant rate limit (50 requests/s) would cap
        // a benchmark that calls as fast as it can.
        .env("CAIRN_RATE_LIMIT_PER_SECOND", "0")
        .stdout(Stdio::null())
        .stderr(log);
    for (name, value) in env {
        command.env(name, value);
    }
    let child = command.spawn().expect("cairn serve starts");
    let base = format!("http://127.0.0.1:{port}");
    let token = String::from_utf8(
        Command::new(binary())
            .args([
                "token",
                "mint",
                "--tenant",
                TENANT,
                "--scope",
                "memory:read,memory:write",
            ])
            .env("CAIRN_JWT_SECRET", SECRET)
            .output()
            .expect("cairn token mint")
            .stdout,
    )
    .expect("a token")
    .trim()
    .to_owned();
    let server = Server { child, base, token };
    let started = Instant::now();
    loop {
        let ready = client.get(format!("{}/readyz", server.base)).send().await;
        if ready.is_ok_and(|answer| answer.status().is_success()) {
            return server;
        }
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "cairn serve did not become ready; see {}",
            data.join("serve.log").display()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn post(client: &reqwest::Client, server: &Server, path: &str, body: Value) -> Value {
    let answer = client
        .post(format!("{}{path}", server.base))
        .bearer_auth(&server.token)
        .json(&body)
        .send()
        .await
        .expect("the service answers");
    let status = answer.status();
    let body: Value = answer.json().await.expect("a JSON answer");
    assert!(status.is_success(), "{path}: {status} {body}");
    body
}

fn message(text: String) -> Value {
    json!({ "role": "user", "content": text })
}

/// Recall latency, then ingest throughput: single episodes from one caller, from
/// several callers at once (each its own user), and batches of 20.
async fn measure(
    backend: String,
    server: &Server,
    client: &reqwest::Client,
    sequence: &mut Sequence,
) -> Figures {
    let mut latencies = Vec::with_capacity(QUERIES);
    for round in 0..QUERIES + 20 {
        let query = format!(
            "what does the {} think about {}",
            SUBJECTS[sequence.next(SUBJECTS.len())],
            OBJECTS[sequence.next(OBJECTS.len())]
        );
        let started = Instant::now();
        let answer = post(
            client,
            server,
            "/v1/users/user-1/recall",
            json!({ "query": query, "k": 10 }),
        )
        .await;
        if round >= 20 {
            latencies.push(started.elapsed());
        }
        assert!(answer["hits"].as_array().is_some_and(|hits| !hits.is_empty()));
    }
    latencies.sort();
    let recall = (
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.95),
        percentile(&latencies, 0.99),
    );

    let started = Instant::now();
    for index in 0..SINGLE_CALLS {
        let body = json!({ "messages": [message(sequence.sentence(index))], "session_id": "single" });
        post(client, server, "/v1/users/user-1/episodes", body).await;
    }
    let single = SINGLE_CALLS as f64 / started.elapsed().as_secs_f64();

    let started = Instant::now();
    let callers: Vec<_> = (0..CALLERS)
        .map(|caller| {
            let client = client.clone();
            let base = server.base.clone();
            let token = server.token.clone();
            let texts: Vec<String> = (0..CALLS_PER_CALLER)
                .map(|index| sequence.sentence(index))
                .collect();
            tokio::spawn(async move {
                for text in texts {
                    let answer = client
                        .post(format!("{base}/v1/users/caller-{caller}/episodes"))
                        .bearer_auth(&token)
                        .json(&json!({ "messages": [message(text)], "session_id": "concurrent" }))
                        .send()
                        .await
                        .expect("the service answers");
                    assert!(answer.status().is_success(), "{}", answer.status());
                }
            })
        })
        .collect();
    for caller in callers {
        caller.await.expect("caller");
    }
    let concurrent = (CALLERS * CALLS_PER_CALLER) as f64 / started.elapsed().as_secs_f64();

    let started = Instant::now();
    for batch in 0..BATCHES {
        let messages: Vec<Value> = (0..20)
            .map(|index| message(sequence.sentence(batch * 20 + index)))
            .collect();
        post(
            client,
            server,
            "/v1/users/user-2/episodes",
            json!({ "messages": messages, "session_id": "batches" }),
        )
        .await;
    }
    let batches = (BATCHES * 20) as f64 / started.elapsed().as_secs_f64();
    Figures {
        backend,
        recall,
        single,
        concurrent,
        batches,
    }
}

/// Writes the facts the benchmark recalls from, straight into the store (fixture
/// loading, not measured).
async fn preload(store: &dyn MemoryStore, facts: usize, sequence: &mut Sequence) {
    let config = cairn_server::config::Config {
        models_dir: models(),
        ..Default::default()
    };
    let embedder = OnnxEmbedder::load(&config.embedder()).expect("run scripts/setup first");
    for other in 0..OTHER_USERS {
        let other_scope = scope_of(TENANT, &format!("other-{other}"));
        load(store, &embedder, &other_scope, FACTS_PER_OTHER_USER, sequence).await;
    }
    load(store, &embedder, &scope(TENANT), facts, sequence).await;
}

fn main() {
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    let facts = arguments
        .iter()
        .find_map(|argument| argument.parse::<usize>().ok())
        .unwrap_or(2_000);
    let cluster = common::flag_value(&arguments, "--cluster");
    let runtime = common::runtime();
    runtime.block_on(async {
        let client = reqwest::Client::new();
        let mut figures = Vec::new();
        let mut sequence = Sequence(0x2545_f491_4f6c_dd1d);

        let directory = tempfile::tempdir().expect("temp dir");
        {
            let store = SqliteStore::open(directory.path()).expect("store");
            preload(&store, facts, &mut sequence).await;
        }
        let server = serve(directory.path(), &[("CAIRN_BACKEND", "embedded".into())], &client).await;
        figures.push(measure("embedded".into(), &server, &client, &mut sequence).await);
        drop(server);

        if let Some(url) = cluster {
            let prefix = format!("cairn-rest-bench-{}", std::process::id());
            let store = ClusterStore::connect(&url, &prefix, 384).await.expect("the cluster answers");
            store.bootstrap().await.expect("bootstrap");
            let name = format!("{} {}", store.engine().as_str(), store.version());
            let shared: Arc<dyn MemoryStore> = Arc::new(store.clone());
            preload(shared.as_ref(), facts, &mut sequence).await;
            let directory = tempfile::tempdir().expect("temp dir");
            let env = [
                ("CAIRN_BACKEND", store.engine().as_str().to_owned()),
                ("CAIRN_CLUSTER_URL", url.clone()),
                ("CAIRN_INDEX_PREFIX", prefix.clone()),
            ];
            let server = serve(directory.path(), &env, &client).await;
            figures.push(measure(name, &server, &client, &mut sequence).await);
            drop(server);
            store.delete_indices().await.expect("clean up");
        }

        println!(
            "REST, cairn serve with its defaults but the per-tenant rate limit off; {facts} facts in the recalled scope, \
             {OTHER_USERS} other users with {FACTS_PER_OTHER_USER} each"
        );
        println!(
            "{:<28} {:>26} {:>14} {:>18} {:>14}",
            "backend", "recall p50/p95/p99 ms", "single eps/s", format!("{CALLERS} callers eps/s"), "batch eps/s"
        );
        for figure in &figures {
            println!(
                "{:<28} {:>26} {:>14.0} {:>18.0} {:>14.0}",
                figure.backend,
                format!("{:.1} / {:.1} / {:.1}", figure.recall.0, figure.recall.1, figure.recall.2),
                figure.single,
                figure.concurrent,
                figure.batches
            );
        }
        if let [embedded, cluster] = figures.as_slice() {
            println!(
                "recall p95 ratio {} / embedded: {:.2}",
                cluster.backend,
                cluster.recall.1 / embedded.recall.1
            );
        }
    });
}
