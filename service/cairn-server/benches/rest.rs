//! The service over REST, as users call it: `cairn serve` (the binary built with this
//! benchmark) with its defaults, on the embedded store and on each search cluster
//! given with `--cluster URL`, side by side in one run. Every figure includes HTTP, JSON,
//! authentication, the query embedding, reranking and use counting as the defaults
//! have them; ingests ask for the default consolidation (`async`), so the worker runs
//! beside them. The per-tenant rate limit is off (it would cap the calls) unless
//! `--rate-limit N` sets it to N requests/s (burst at its default), high enough to
//! refuse nothing: then its cost is in the figures (on a cluster, the bucket every
//! replica shares). Prints figures; asserts nothing.
//!
//! Run with `cargo bench -p cairn-server --bench rest -- [FACTS] [--cluster URL]...
//! [--rate-limit N]` (see docs/src/results/benchmarks.md; `--cluster` once per cluster). The scope under test holds FACTS facts
//! (default 2000), and 20 other users of the tenant 100 each.
//!
//! Then the review queue: a second tenant whose policy (from the config file, the way an
//! operator sets one tenant's) holds supersessions. Its writes that supersede are held;
//! the queues are read, and each held change is approved or rejected.

use cairn_core::MemoryStore;
use cairn_inference::OnnxEmbedder;
use cairn_store_cluster::ClusterStore;
use cairn_store_sqlite::SqliteStore;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "common/mod.rs"]
mod common;
use common::{Sequence, load, percentile, scope, scope_of};

const SECRET: &str = "rest-benchmark-secret-0123456789abcdef";
const TENANT: &str = "bench-tenant";
const OTHER_USERS: usize = 20;
const FACTS_PER_OTHER_USER: usize = 100;
const QUERIES: usize = 300;
const SINGLE_CALLS: usize = 200;
const CALLERS: usize = 8;
const CALLS_PER_CALLER: usize = 40;
const BATCHES: usize = 50;
/// The tenant whose supersessions wait for review, and how many it holds.
const REVIEW_TENANT: &str = "review-bench";
const REVIEW_USERS: usize = 10;
const REVIEWS: usize = 100;

/// The figures of one backend.
struct Figures {
    backend: String,
    recall: (f64, f64, f64),
    single: f64,
    concurrent: f64,
    batches: f64,
    /// Per review operation: its name and p50 / p95 / p99 in ms.
    reviews: Vec<(&'static str, (f64, f64, f64))>,
}

/// A `cairn serve` process, stopped when dropped.
struct Server {
    child: Child,
    base: String,
    token: String,
    /// Reads, writes and reviews in the review tenant.
    reviewer: String,
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
        .stdout(log.try_clone().expect("log file"))
        .stderr(log);
    for (name, value) in env {
        command.env(name, value);
    }
    // One tenant's policy holds supersessions for review, as an operator sets it.
    let config = data.join("cairn.toml");
    std::fs::write(
        &config,
        format!("[tenants.{REVIEW_TENANT}]\nreview = \"supersession\"\n"),
    )
    .expect("config file");
    command.env("CAIRN_CONFIG", &config);
    let child = command.spawn().expect("cairn serve starts");
    let base = format!("http://127.0.0.1:{port}");
    let mint = |tenant: &str, scope: &str| {
        String::from_utf8(
            Command::new(binary())
                .args(["token", "mint", "--tenant", tenant, "--scope", scope])
                .env("CAIRN_JWT_SECRET", SECRET)
                .output()
                .expect("cairn token mint")
                .stdout,
        )
        .expect("a token")
        .trim()
        .to_owned()
    };
    let token = mint(TENANT, "memory:read,memory:write");
    let reviewer = mint(REVIEW_TENANT, "memory:read,memory:write,memory:review");
    let server = Server {
        child,
        base,
        token,
        reviewer,
    };
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
    send(
        client,
        server,
        &server.token,
        reqwest::Method::POST,
        path,
        Some(body),
    )
    .await
}

async fn send(
    client: &reqwest::Client,
    server: &Server,
    token: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> Value {
    let mut request = client
        .request(method, format!("{}{path}", server.base))
        .bearer_auth(token);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let answer = request.send().await.expect("the service answers");
    let status = answer.status();
    let body: Value = answer.json().await.expect("a JSON answer");
    assert!(status.is_success(), "{path}: {status} {body}");
    body
}

/// p50 / p95 / p99 of latencies, in ms.
fn spread(mut latencies: Vec<Duration>) -> (f64, f64, f64) {
    latencies.sort();
    (
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.95),
        percentile(&latencies, 0.99),
    )
}

/// The review queue of the review tenant: a held supersession per write, the user's
/// and the tenant's queues, and the decisions.
async fn measure_reviews(server: &Server, client: &reqwest::Client) -> Vec<(&'static str, (f64, f64, f64))> {
    let token = server.reviewer.as_str();
    let user = |index: usize| format!("/v1/users/reviewed-{}", index % REVIEW_USERS);
    let mut hold = Vec::with_capacity(REVIEWS);
    for index in 0..REVIEWS {
        let path = format!("{}/facts", user(index));
        let first = json!({ "text": format!("The user's locker number is {index}") });
        let old = send(client, server, token, reqwest::Method::POST, &path, Some(first)).await;
        let moved = json!({ "text": format!("The user's locker number is {}", index + 1000),
                            "supersedes": old["fact"]["id"] });
        let started = Instant::now();
        let answer = send(client, server, token, reqwest::Method::POST, &path, Some(moved)).await;
        hold.push(started.elapsed());
        assert_eq!(answer["decision"]["kind"], "HELD_FOR_REVIEW", "{answer}");
    }
    let mut user_queue = Vec::new();
    let mut reviews = Vec::new();
    for index in 0..REVIEW_USERS {
        let started = Instant::now();
        let page = send(
            client,
            server,
            token,
            reqwest::Method::GET,
            &format!("{}/reviews?limit=50", user(index)),
            None,
        )
        .await;
        user_queue.push(started.elapsed());
        for review in page["items"].as_array().into_iter().flatten() {
            reviews.push((index, review["id"].as_str().unwrap_or_default().to_owned()));
        }
    }
    assert_eq!(reviews.len(), REVIEWS, "every held change is queued");
    let mut tenant_queue = Vec::new();
    for _ in 0..REVIEW_USERS * 3 {
        let started = Instant::now();
        let page = send(
            client,
            server,
            token,
            reqwest::Method::GET,
            "/v1/reviews?limit=50",
            None,
        )
        .await;
        tenant_queue.push(started.elapsed());
        assert_eq!(page["counts"]["total"].as_u64(), Some(REVIEWS as u64));
    }
    let (mut approve, mut reject) = (Vec::new(), Vec::new());
    for (turn, (index, id)) in reviews.iter().enumerate() {
        let verb = if turn % 2 == 0 { "approve" } else { "reject" };
        let path = format!("{}/reviews/{id}/{verb}", user(*index));
        let started = Instant::now();
        send(client, server, token, reqwest::Method::POST, &path, None).await;
        if verb == "approve" {
            approve.push(started.elapsed());
        } else {
            reject.push(started.elapsed());
        }
    }
    vec![
        ("held write", spread(hold)),
        ("user queue", spread(user_queue)),
        ("tenant queue", spread(tenant_queue)),
        ("approve", spread(approve)),
        ("reject", spread(reject)),
    ]
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
        let query = sequence.question();
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
    let reviews = measure_reviews(server, client).await;
    Figures {
        backend,
        recall,
        single,
        concurrent,
        batches,
        reviews,
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
    let flag = |name: &str| -> Vec<String> {
        arguments
            .windows(2)
            .filter(|pair| pair[0] == name)
            .map(|pair| pair[1].clone())
            .collect()
    };
    let facts = arguments
        .iter()
        .enumerate()
        .filter(|(at, _)| *at == 0 || !arguments[at - 1].starts_with("--"))
        .find_map(|(_, argument)| argument.parse::<usize>().ok())
        .unwrap_or(2_000);
    let rate_limit = flag("--rate-limit").pop();
    // Each cluster runs after the embedded store, in the order given.
    let clusters = flag("--cluster");
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
        let limit = rate_limit.iter().map(|rate| ("CAIRN_RATE_LIMIT_PER_SECOND", rate.clone()));
        let env: Vec<(&str, String)> = [("CAIRN_BACKEND", "embedded".to_owned())]
            .into_iter()
            .chain(limit.clone())
            .collect();
        let server = serve(directory.path(), &env, &client).await;
        figures.push(measure("embedded".into(), &server, &client, &mut sequence).await);
        drop(server);

        for url in clusters {
            let prefix = format!("cairn-rest-bench-{}", std::process::id());
            let store = ClusterStore::connect(&url, &prefix, 384).await.expect("the cluster answers");
            store.bootstrap().await.expect("bootstrap");
            let name = format!("{} {}", store.engine().as_str(), store.version());
            let shared: Arc<dyn MemoryStore> = Arc::new(store.clone());
            preload(shared.as_ref(), facts, &mut sequence).await;
            let directory = tempfile::tempdir().expect("temp dir");
            let env: Vec<(&str, String)> = [
                ("CAIRN_BACKEND", store.engine().as_str().to_owned()),
                ("CAIRN_CLUSTER_URL", url.clone()),
                ("CAIRN_INDEX_PREFIX", prefix.clone()),
            ]
            .into_iter()
            .chain(limit.clone())
            .collect();
            let server = serve(directory.path(), &env, &client).await;
            // Timed once the node has merged the loaded segments, as it would have long
            // before a real scope reached this size (the recall benchmark times both).
            common::merges_settled(&url).await;
            figures.push(measure(name, &server, &client, &mut sequence).await);
            drop(server);
            store.delete_indices().await.expect("clean up");
        }

        let limited = match &rate_limit {
            Some(rate) => format!("the per-tenant rate limit at {rate}/s (refusing nothing)"),
            None => "the per-tenant rate limit off".to_owned(),
        };
        println!(
            "REST, cairn serve with its defaults but {limited}; {facts} facts in the recalled scope, \
             {OTHER_USERS} other users with {FACTS_PER_OTHER_USER} each; a cluster is timed once its merges settled"
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
        println!(
            "review queue: tenant {REVIEW_TENANT} holds supersessions (set in the config file); {REVIEWS} held over \
             {REVIEW_USERS} users, each approved or rejected; ms p50 / p95 / p99"
        );
        for figure in &figures {
            let cells: Vec<String> = figure
                .reviews
                .iter()
                .map(|(name, (p50, p95, p99))| format!("{name} {p50:.1} / {p95:.1} / {p99:.1}"))
                .collect();
            println!("{:<28} {}", figure.backend, cells.join(" · "));
        }
        if let [embedded, clusters @ ..] = figures.as_slice() {
            for cluster in clusters {
                println!(
                    "recall p95 ratio {} / embedded: {:.2}",
                    cluster.backend,
                    cluster.recall.1 / embedded.recall.1
                );
            }
        }
    });
}
