//! Load and soak tool: runs a real `cairn serve` and drives it over REST the way
//! backend services call it, then checks integrity.
//!
//! Modes:
//! - `mixed` (default): `--tenants` × `--users` scopes; about 70% recall, 25% ingest and
//!   5% mutations (fact write, supersede, retract, forget, erase) for `--seconds`, from
//!   `--workers` concurrent clients. With `--kill-every N` the server is killed with
//!   SIGKILL every N seconds and restarted (the soak).
//! - `fill`: every scope once (ingest, fact write, recall), then the server's RSS: what
//!   holding that many scopes costs.
//! - `fairness`: one tenant floods ingest while another ingests and recalls at a steady
//!   pace; the steady tenant's recall latency and consolidation delay, with and without
//!   the flood.
//!
//! Every run ends with an integrity check: every acknowledged write is present, no hit
//! belongs to another scope (each scope's texts carry a marker word of its own), and no
//! erased, forgotten or retracted record comes back. Any violation fails the run.
//!
//! The server's environment passes through (`CAIRN_BACKEND`, `CAIRN_CLUSTER_URL`, ...);
//! the tool sets the listen address, data directory, signing secret and log level.

use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const SECRET: &str = "load-tool-secret-load-tool-secret-0123456789";

#[derive(Clone)]
struct Options {
    mode: String,
    bin: PathBuf,
    data_dir: PathBuf,
    tenants: usize,
    users: usize,
    workers: usize,
    seconds: u64,
    kill_every: Option<u64>,
    rounds: usize,
    extra_env: Vec<(String, String)>,
}

fn options() -> Result<Options> {
    let mut options = Options {
        mode: "mixed".into(),
        bin: PathBuf::from("target/release/cairn"),
        data_dir: std::env::temp_dir().join(format!("cairn-load-{}", std::process::id())),
        tenants: 100,
        users: 10,
        workers: 16,
        seconds: 60,
        kill_every: None,
        rounds: 20,
        extra_env: Vec::new(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or_else(|| anyhow!("{arg} needs a value"));
        match arg.as_str() {
            "--mode" => options.mode = value()?,
            "--bin" => options.bin = PathBuf::from(value()?),
            "--data-dir" => options.data_dir = PathBuf::from(value()?),
            "--tenants" => options.tenants = value()?.parse()?,
            "--users" => options.users = value()?.parse()?,
            "--workers" => options.workers = value()?.parse()?,
            "--seconds" => options.seconds = value()?.parse()?,
            "--kill-every" => options.kill_every = Some(value()?.parse()?),
            "--rounds" => options.rounds = value()?.parse()?,
            "--env" => {
                let pair = value()?;
                let (key, val) = pair
                    .split_once('=')
                    .ok_or_else(|| anyhow!("--env takes KEY=VALUE"))?;
                options.extra_env.push((key.to_owned(), val.to_owned()));
            }
            other => bail!("unknown argument {other}"),
        }
    }
    Ok(options)
}

/// The server process under test.
struct Server {
    options: Arc<Options>,
    port: u16,
    child: Option<Child>,
}

impl Server {
    fn new(options: Arc<Options>) -> Result<Self> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        drop(listener);
        Ok(Server {
            options,
            port,
            child: None,
        })
    }

    fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn command(&self) -> Command {
        let mut command = Command::new(&self.options.bin);
        command
            .env("CAIRN_LISTEN", format!("127.0.0.1:{}", self.port))
            .env("CAIRN_DATA_DIR", &self.options.data_dir)
            .env("CAIRN_JWT_SECRET", SECRET)
            .env("CAIRN_LOG_LEVEL", "warn");
        for (key, value) in &self.options.extra_env {
            command.env(key, value);
        }
        command
    }

    /// Starts the server and waits until it is ready; returns how long that took.
    async fn start(&mut self, client: &reqwest::Client) -> Result<Duration> {
        std::fs::create_dir_all(&self.options.data_dir)?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.options.data_dir.join("server.log"))?;
        let started = Instant::now();
        let child = self
            .command()
            .arg("serve")
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .spawn()
            .with_context(|| format!("starting {}", self.options.bin.display()))?;
        self.child = Some(child);
        let ready = format!("{}/readyz", self.base());
        while started.elapsed() < Duration::from_secs(120) {
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                bail!("the server exited with {status}; see its server.log");
            }
            if let Ok(response) = client.get(&ready).send().await
                && response.status().is_success()
            {
                return Ok(started.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        bail!("the server was not ready within 120 s")
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn stop(&mut self) {
        if let Some(child) = self.child.take() {
            let _ = Command::new("kill").arg(child.id().to_string()).status();
            let mut child = child;
            let _ = child.wait();
        }
    }

    fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn mint(&self, tenant: &str) -> Result<String> {
        let output = self
            .command()
            .args([
                "token",
                "mint",
                "--tenant",
                tenant,
                "--scope",
                "memory:read,memory:write,memory:admin",
                "--ttl",
                "12h",
            ])
            .output()?;
        if !output.status.success() {
            bail!("token mint: {}", String::from_utf8_lossy(&output.stderr));
        }
        Ok(String::from_utf8(output.stdout)?.trim().to_owned())
    }
}

fn rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// A small deterministic generator, so runs are repeatable.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, bound: usize) -> usize {
        (self.next() % bound.max(1) as u64) as usize
    }
}

/// What the tool knows a scope must and must not hold.
#[derive(Default)]
struct ScopeState {
    /// Acknowledged episodes and explicit facts that must exist.
    episodes: HashSet<String>,
    facts: HashSet<String>,
    /// Explicit facts that are active (candidates for supersede, retract, forget).
    active: Vec<String>,
    /// Retracted facts: never in recall; with the time they were acknowledged.
    retracted: HashMap<String, Instant>,
    /// Records that must never be seen again (erased, forgotten), from when.
    gone: HashMap<String, Instant>,
    /// Every record id recall has shown for this scope (erased with it).
    seen: HashSet<String>,
}

struct Scope {
    tenant: usize,
    user: String,
    marker: String,
    state: tokio::sync::Mutex<ScopeState>,
}

#[derive(Default)]
struct Tally {
    latencies: BTreeMap<&'static str, Vec<u32>>,
    statuses: BTreeMap<String, u64>,
    /// Requests that found no server (it was being restarted).
    unreachable: u64,
    violations: Vec<String>,
    unattributed_hits: u64,
}

struct Run {
    client: reqwest::Client,
    base: String,
    tokens: Vec<String>,
    scopes: Vec<Scope>,
    markers: HashMap<String, usize>,
    tally: Mutex<Tally>,
    stop: AtomicBool,
    ops: AtomicU64,
}

const TOPICS: &[&str] = &[
    "I am learning to play the cello",
    "My sister lives in Valencia",
    "I prefer green tea in the morning",
    "I am training for a half marathon",
    "My favourite author is Ursula Le Guin",
    "I work on the billing service",
    "I am allergic to shellfish",
    "My dog is called Biscuit",
    "I drive a blue hatchback",
    "I am planning a trip to Kyoto",
];

const QUESTIONS: &[&str] = &[
    "what music does the user play",
    "where does the family live",
    "what does the user drink",
    "which sport does the user train for",
    "favourite books",
    "what does the user work on",
    "food allergies",
    "pets",
    "what car",
    "travel plans",
];

fn marker(tenant: usize, user: usize) -> String {
    // Letters only, so tokenizers keep it whole; unique per scope.
    let mut value = String::from("zq");
    for digit in format!("{tenant}x{user}").chars() {
        value.push(match digit {
            'x' => 'x',
            d => (b'a' + d.to_digit(10).unwrap_or(0) as u8) as char,
        });
    }
    value.push_str("vk");
    value
}

/// A fact only the tool writes (no ingested message mentions lockers), so consolidation
/// never touches it: its supersessions, retractions and forgets are the tool's alone.
fn locker_code(scope: &Scope, rng: &mut Rng) -> String {
    format!(
        "The user's {} locker code is {}",
        scope.marker,
        rng.below(1_000_000)
    )
}

impl Run {
    async fn call(
        &self,
        route: &'static str,
        method: reqwest::Method,
        path: &str,
        token: &str,
        body: Option<Value>,
    ) -> Option<(u16, Value)> {
        let mut request = self
            .client
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let started = Instant::now();
        let response = request.send().await;
        let elapsed = started.elapsed().as_micros().min(u128::from(u32::MAX)) as u32;
        match response {
            Ok(response) => {
                let status = response.status().as_u16();
                if let Ok(mut tally) = self.tally.lock() {
                    tally.latencies.entry(route).or_default().push(elapsed);
                    *tally.statuses.entry(format!("{route} {status}")).or_default() += 1;
                }
                let body = response.json::<Value>().await.unwrap_or(Value::Null);
                Some((status, body))
            }
            Err(_) => {
                if let Ok(mut tally) = self.tally.lock() {
                    tally.unreachable += 1;
                }
                // The server is restarting: do not spin.
                tokio::time::sleep(Duration::from_millis(50)).await;
                None
            }
        }
    }

    fn violation(&self, message: String) {
        if let Ok(mut tally) = self.tally.lock() {
            if tally.violations.len() < 50 {
                eprintln!("load: VIOLATION {message}");
            }
            tally.violations.push(message);
        }
    }

    fn path(&self, scope: &Scope, rest: &str) -> String {
        format!("/v1/users/{}{rest}", scope.user)
    }

    async fn recall(&self, scope: &Scope, rng: &mut Rng) {
        let question = QUESTIONS[rng.below(QUESTIONS.len())];
        let sent = Instant::now();
        let Some((status, body)) = self
            .call(
                "recall",
                reqwest::Method::POST,
                &self.path(scope, "/recall"),
                &self.tokens[scope.tenant],
                Some(json!({ "query": format!("{question} {}", scope.marker), "k": 10 })),
            )
            .await
        else {
            return;
        };
        if status != 200 {
            return;
        }
        let hits = body["hits"].as_array().cloned().unwrap_or_default();
        let mut state = scope.state.lock().await;
        for hit in hits {
            let id = hit["id"].as_str().unwrap_or_default().to_owned();
            let text = hit["text"].as_str().unwrap_or_default().to_lowercase();
            let owners: Vec<usize> = text
                .split(|c: char| !c.is_alphanumeric())
                .filter_map(|word| self.markers.get(word).copied())
                .collect();
            let own = self.markers.get(&scope.marker).copied();
            if owners.iter().any(|owner| Some(*owner) != own) {
                self.violation(format!("cross-scope hit {id} in {}: {text}", scope.marker));
            } else if owners.is_empty()
                && let Ok(mut tally) = self.tally.lock()
            {
                tally.unattributed_hits += 1;
            }
            if state.gone.get(&id).is_some_and(|at| *at < sent) {
                self.violation(format!(
                    "resurrection: {id} recalled in {} after it was erased",
                    scope.marker
                ));
            }
            if state.retracted.get(&id).is_some_and(|at| *at < sent) {
                self.violation(format!("retracted {id} recalled in {}", scope.marker));
            }
            state.seen.insert(id);
        }
    }

    async fn ingest(&self, scope: &Scope, rng: &mut Rng) {
        let topic = TOPICS[rng.below(TOPICS.len())];
        let session = format!("s{}", rng.below(4));
        let mut state = scope.state.lock().await;
        let Some((status, body)) = self
            .call(
                "ingest",
                reqwest::Method::POST,
                &self.path(scope, "/episodes"),
                &self.tokens[scope.tenant],
                Some(json!({ "session_id": session, "messages": [
                    { "role": "assistant", "content": "Tell me more." },
                    { "role": "user", "content": format!("{topic}, says {}", scope.marker) }
                ] })),
            )
            .await
        else {
            return;
        };
        if status == 201 {
            for id in body["episode_ids"].as_array().into_iter().flatten() {
                if let Some(id) = id.as_str() {
                    state.episodes.insert(id.to_owned());
                }
            }
        }
    }

    async fn mutate(&self, scope: &Scope, rng: &mut Rng) {
        let token = &self.tokens[scope.tenant];
        let mut state = scope.state.lock().await;
        let roll = rng.below(100);
        let pick = |state: &ScopeState, rng: &mut Rng| -> Option<String> {
            (!state.active.is_empty()).then(|| state.active[rng.below(state.active.len())].clone())
        };
        if roll < 35 || state.active.is_empty() {
            let text = locker_code(scope, rng);
            if let Some((201, body)) = self
                .call(
                    "fact_write",
                    reqwest::Method::POST,
                    &self.path(scope, "/facts"),
                    token,
                    Some(json!({ "text": text, "fact_type": "world" })),
                )
                .await
                && let Some(id) = body["fact"]["id"].as_str()
            {
                state.facts.insert(id.to_owned());
                state.active.push(id.to_owned());
            }
        } else if roll < 60 {
            let Some(old) = pick(&state, rng) else { return };
            let text = locker_code(scope, rng);
            if let Some((201, body)) = self
                .call(
                    "supersede",
                    reqwest::Method::POST,
                    &self.path(scope, "/facts"),
                    token,
                    Some(json!({ "text": text, "supersedes": old })),
                )
                .await
                && let Some(id) = body["fact"]["id"].as_str()
            {
                state.active.retain(|active| *active != old);
                state.facts.insert(id.to_owned());
                state.active.push(id.to_owned());
            }
        } else if roll < 75 {
            let Some(id) = pick(&state, rng) else { return };
            if let Some((200, _)) = self
                .call(
                    "retract",
                    reqwest::Method::POST,
                    &self.path(scope, &format!("/facts/{id}/retract")),
                    token,
                    Some(json!({ "reason": "load test" })),
                )
                .await
            {
                state.active.retain(|active| *active != id);
                state.retracted.insert(id, Instant::now());
            }
        } else if roll < 92 {
            let Some(id) = pick(&state, rng) else { return };
            if let Some((200, _)) = self
                .call(
                    "forget",
                    reqwest::Method::DELETE,
                    &self.path(scope, &format!("/facts/{id}")),
                    token,
                    None,
                )
                .await
            {
                state.active.retain(|active| *active != id);
                state.facts.remove(&id);
                state.gone.insert(id, Instant::now());
            }
        } else if let Some((200, _)) = self
            .call(
                "erase",
                reqwest::Method::DELETE,
                &self.path(scope, ""),
                token,
                None,
            )
            .await
        {
            let now = Instant::now();
            let state = &mut *state;
            let everything = state
                .episodes
                .drain()
                .chain(state.facts.drain())
                .chain(state.seen.drain())
                .chain(state.retracted.drain().map(|(id, _)| id));
            for id in everything {
                state.gone.insert(id, now);
            }
            state.active.clear();
        }
    }

    async fn worker(self: Arc<Self>, seed: u64) {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        while !self.stop.load(Ordering::Relaxed) {
            let scope = &self.scopes[rng.below(self.scopes.len())];
            let roll = rng.below(100);
            if roll < 70 {
                self.recall(scope, &mut rng).await;
            } else if roll < 95 {
                self.ingest(scope, &mut rng).await;
            } else {
                self.mutate(scope, &mut rng).await;
            }
            self.ops.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Every page of a listing route.
    async fn list_all(&self, scope: &Scope, route: &str) -> Option<HashSet<String>> {
        let mut ids = HashSet::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut path = self.path(scope, &format!("{route}limit=100"));
            if let Some(cursor) = &cursor {
                path.push_str(&format!("&cursor={cursor}"));
            }
            let (status, body) = self
                .call(
                    "integrity",
                    reqwest::Method::GET,
                    &path,
                    &self.tokens[scope.tenant],
                    None,
                )
                .await?;
            if status == 429 {
                // The tenant's quota: wait for it, then read the same page again.
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            if status != 200 {
                self.violation(format!("listing {path} answered {status}"));
                return None;
            }
            for item in body["items"].as_array().into_iter().flatten() {
                if let Some(id) = item["id"].as_str() {
                    ids.insert(id.to_owned());
                }
            }
            match body["next_cursor"].as_str() {
                Some(next) => cursor = Some(next.to_owned()),
                None => return Some(ids),
            }
        }
    }

    /// Every acknowledged write present; nothing erased or forgotten present.
    async fn check_integrity(&self) -> (usize, usize) {
        let mut checked = 0;
        let mut missing = 0;
        for scope in &self.scopes {
            let state = scope.state.lock().await;
            let (Some(episodes), Some(facts)) = (
                self.list_all(scope, "/episodes?").await,
                self.list_all(scope, "/facts?status=all&").await,
            ) else {
                continue;
            };
            for id in &state.episodes {
                checked += 1;
                if !episodes.contains(id) {
                    missing += 1;
                    self.violation(format!(
                        "acknowledged episode {id} of {} is missing",
                        scope.marker
                    ));
                }
            }
            for id in &state.facts {
                checked += 1;
                if !facts.contains(id) {
                    missing += 1;
                    self.violation(format!("acknowledged fact {id} of {} is missing", scope.marker));
                }
            }
            for id in state.gone.keys() {
                if episodes.contains(id) || facts.contains(id) {
                    self.violation(format!("erased or forgotten {id} of {} is present", scope.marker));
                }
            }
        }
        (checked, missing)
    }
}

fn percentile(sorted: &[u32], fraction: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let index = ((sorted.len() as f64 - 1.0) * fraction).round() as usize;
    f64::from(sorted[index.min(sorted.len() - 1)]) / 1000.0
}

fn report_latencies(tally: &Tally, seconds: f64) {
    let total: usize = tally.latencies.values().map(Vec::len).sum();
    println!(
        "throughput: {:.1} requests/s ({total} requests in {seconds:.0} s)",
        total as f64 / seconds
    );
    println!("| route | requests | p50 ms | p95 ms | p99 ms |");
    println!("|---|---:|---:|---:|---:|");
    for (route, samples) in &tally.latencies {
        let mut sorted = samples.clone();
        sorted.sort_unstable();
        println!(
            "| {route} | {} | {:.1} | {:.1} | {:.1} |",
            sorted.len(),
            percentile(&sorted, 0.5),
            percentile(&sorted, 0.95),
            percentile(&sorted, 0.99)
        );
    }
    println!("statuses: {:?}", tally.statuses);
}

async fn setup(options: &Arc<Options>, server: &mut Server, client: &reqwest::Client) -> Result<Arc<Run>> {
    let ready_in = server.start(client).await?;
    println!("server ready in {:.2} s", ready_in.as_secs_f64());
    let mut tokens = Vec::new();
    for tenant in 0..options.tenants {
        tokens.push(server.mint(&format!("t{tenant}"))?);
    }
    let mut scopes = Vec::new();
    let mut markers = HashMap::new();
    for tenant in 0..options.tenants {
        for user in 0..options.users {
            let marker = marker(tenant, user);
            markers.insert(marker.clone(), scopes.len());
            scopes.push(Scope {
                tenant,
                user: format!("u{user}"),
                marker,
                state: tokio::sync::Mutex::new(ScopeState::default()),
            });
        }
    }
    Ok(Arc::new(Run {
        client: client.clone(),
        base: server.base(),
        tokens,
        scopes,
        markers,
        tally: Mutex::new(Tally::default()),
        stop: AtomicBool::new(false),
        ops: AtomicU64::new(0),
    }))
}

fn verdict(run: &Run, checked: usize, missing: usize) -> Result<()> {
    let tally = run.tally.lock().map_err(|_| anyhow!("tally lock"))?;
    let failures: u64 = tally
        .statuses
        .iter()
        .filter(|(key, _)| {
            let status = key.rsplit(' ').next().unwrap_or("");
            !(status.starts_with('2') || status == "429")
        })
        .map(|(_, count)| count)
        .sum();
    let cross = tally
        .violations
        .iter()
        .filter(|violation| violation.starts_with("cross-scope"))
        .count();
    let resurrections = tally
        .violations
        .iter()
        .filter(|violation| violation.starts_with("resurrection") || violation.starts_with("retracted"))
        .count();
    println!(
        "integrity: {checked} acknowledged writes checked, {missing} missing; {cross} cross-scope hits; \
         {resurrections} resurrections; {} hits without a marker (derived text); \
         {failures} responses other than 2xx/429; {} requests found no server",
        tally.unattributed_hits, tally.unreachable
    );
    if !tally.violations.is_empty() || failures > 0 {
        bail!(
            "{} violations, {failures} failed responses",
            tally.violations.len()
        );
    }
    Ok(())
}

async fn mixed(options: Arc<Options>) -> Result<()> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .pool_max_idle_per_host(options.workers)
        .build()?;
    let mut server = Server::new(Arc::clone(&options))?;
    let run = setup(&options, &mut server, &client).await?;
    let started = Instant::now();
    let workers: Vec<_> = (0..options.workers)
        .map(|index| tokio::spawn(Arc::clone(&run).worker(index as u64 + 1)))
        .collect();
    let mut rss = Vec::new();
    let mut recoveries = Vec::new();
    let mut next_kill = options
        .kill_every
        .map(|every| started + Duration::from_secs(every));
    while started.elapsed() < Duration::from_secs(options.seconds) {
        tokio::time::sleep(Duration::from_secs(5)).await;
        if let Some(sample) = server.pid().and_then(rss_mib) {
            rss.push((started.elapsed().as_secs(), sample));
        }
        if let Some(at) = next_kill
            && Instant::now() >= at
        {
            server.kill();
            let recovered = server.start(&client).await?;
            recoveries.push(recovered.as_secs_f64());
            next_kill = options
                .kill_every
                .map(|every| Instant::now() + Duration::from_secs(every));
        }
    }
    run.stop.store(true, Ordering::Relaxed);
    for worker in workers {
        let _ = worker.await;
    }
    let seconds = started.elapsed().as_secs_f64();
    // Reads after a crash must find every acknowledged write: restart once more first.
    if options.kill_every.is_some() {
        server.kill();
        recoveries.push(server.start(&client).await?.as_secs_f64());
    }
    {
        let tally = run.tally.lock().map_err(|_| anyhow!("tally lock"))?;
        println!(
            "mixed load: {} tenants x {} users, {} workers, {seconds:.0} s, {} operations",
            options.tenants,
            options.users,
            options.workers,
            run.ops.load(Ordering::Relaxed)
        );
        report_latencies(&tally, seconds);
    }
    println!(
        "rss MiB over time: {}",
        rss.iter()
            .map(|(at, mib)| format!("{at}s={mib:.0}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    if !recoveries.is_empty() {
        let worst = recoveries.iter().copied().fold(0.0, f64::max);
        let mean = recoveries.iter().sum::<f64>() / recoveries.len() as f64;
        println!(
            "kill -9: {} restarts, recovery to ready mean {mean:.2} s, worst {worst:.2} s",
            recoveries.len()
        );
    }
    let (checked, missing) = run.check_integrity().await;
    server.stop();
    verdict(&run, checked, missing)
}

async fn fill(options: Arc<Options>) -> Result<()> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()?;
    let mut server = Server::new(Arc::clone(&options))?;
    let run = setup(&options, &mut server, &client).await?;
    let pid = server.pid().ok_or_else(|| anyhow!("no server"))?;
    let baseline = rss_mib(pid).unwrap_or(0.0);
    let started = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..options.workers)
        .map(|index| {
            let run = Arc::clone(&run);
            let next = Arc::clone(&next);
            tokio::spawn(async move {
                let mut rng = Rng(index as u64 + 7);
                loop {
                    let at = next.fetch_add(1, Ordering::Relaxed) as usize;
                    let Some(scope) = run.scopes.get(at) else { break };
                    run.ingest(scope, &mut rng).await;
                    run.mutate(scope, &mut rng).await;
                    run.recall(scope, &mut rng).await;
                }
            })
        })
        .collect();
    let mut samples = Vec::new();
    let total = run.scopes.len();
    while workers.iter().any(|worker| !worker.is_finished()) {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let done = (next.load(Ordering::Relaxed) as usize).min(total);
        if let Some(mib) = rss_mib(pid) {
            samples.push((done, mib));
        }
    }
    for worker in workers {
        let _ = worker.await;
    }
    let seconds = started.elapsed().as_secs_f64();
    let after = rss_mib(pid).unwrap_or(0.0);
    println!(
        "fill: {total} scopes (each: one ingest, one fact write, one recall) in {seconds:.0} s; \
         rss {baseline:.0} MiB before, {after:.0} MiB after, peak {:.0} MiB",
        samples.iter().map(|(_, mib)| *mib).fold(after, f64::max)
    );
    println!(
        "rss MiB by scopes filled: {}",
        samples
            .iter()
            .step_by((samples.len() / 12).max(1))
            .map(|(done, mib)| format!("{done}={mib:.0}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    {
        let tally = run.tally.lock().map_err(|_| anyhow!("tally lock"))?;
        report_latencies(&tally, seconds);
    }
    let (checked, missing) = run.check_integrity().await;
    server.stop();
    verdict(&run, checked, missing)
}

/// Polls until a fact derived from `episode` appears; returns how long that took.
async fn consolidation_delay(run: &Run, scope: &Scope, episode: &str, since: Instant) -> Option<f64> {
    while since.elapsed() < Duration::from_secs(120) {
        let (status, body) = run
            .call(
                "facts_poll",
                reqwest::Method::GET,
                &run.path(scope, "/facts?limit=100"),
                &run.tokens[scope.tenant],
                None,
            )
            .await?;
        if status == 200
            && body["items"].as_array().into_iter().flatten().any(|fact| {
                fact["source_episode_ids"]
                    .as_array()
                    .is_some_and(|ids| ids.iter().any(|id| id == episode))
            })
        {
            return Some(since.elapsed().as_secs_f64());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

async fn steady_tenant(run: Arc<Run>, scope_index: usize, rounds: usize) -> (Vec<u32>, Vec<f64>) {
    let scope = &run.scopes[scope_index];
    let mut rng = Rng(99);
    let mut recalls = Vec::new();
    let mut delays = Vec::new();
    for round in 0..rounds {
        let sent = Instant::now();
        let said = format!("I moved to city number {round} last week, says {}", scope.marker);
        let Some((201, body)) = run
            .call(
                "steady_ingest",
                reqwest::Method::POST,
                &run.path(scope, "/episodes"),
                &run.tokens[scope.tenant],
                Some(json!({ "messages": [{ "role": "user", "content": said }] })),
            )
            .await
        else {
            continue;
        };
        match body["episode_ids"][0].as_str() {
            Some(episode) => match consolidation_delay(&run, scope, episode, sent).await {
                Some(delay) => delays.push(delay),
                None => eprintln!("load: round {round}: no fact within 120 s"),
            },
            None => continue,
        }
        for _ in 0..5 {
            let started = Instant::now();
            run.recall(scope, &mut rng).await;
            recalls.push(started.elapsed().as_micros() as u32);
        }
    }
    (recalls, delays)
}

async fn fairness(options: Arc<Options>) -> Result<()> {
    let options = Arc::new(Options {
        tenants: 2,
        users: 1,
        kill_every: None,
        ..Options::clone(&options)
    });
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()?;
    let mut server = Server::new(Arc::clone(&options))?;
    let run = setup(&options, &mut server, &client).await?;
    let rounds = options.rounds;
    let summary = |label: &str, (recalls, delays): (Vec<u32>, Vec<f64>)| {
        let mut sorted = recalls;
        sorted.sort_unstable();
        let mut delays_sorted: Vec<u32> = delays.iter().map(|d| (d * 1_000_000.0) as u32).collect();
        delays_sorted.sort_unstable();
        println!(
            "| {label} | {:.1} | {:.1} | {:.0} | {:.0} | {} |",
            percentile(&sorted, 0.5),
            percentile(&sorted, 0.95),
            percentile(&delays_sorted, 0.5),
            percentile(&delays_sorted, 0.95),
            delays.len()
        );
    };
    println!(
        "| steady tenant | recall p50 ms | recall p95 ms | consolidation delay p50 ms | p95 ms | facts seen |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    let quiet = steady_tenant(Arc::clone(&run), 1, rounds).await;
    summary("alone", quiet);
    // The flood: tenant 0 ingests as fast as its workers can.
    let flooding = Arc::new(AtomicBool::new(true));
    let flooders: Vec<_> = (0..options.workers)
        .map(|index| {
            let run = Arc::clone(&run);
            let flooding = Arc::clone(&flooding);
            tokio::spawn(async move {
                let mut rng = Rng(index as u64 + 1000);
                while flooding.load(Ordering::Relaxed) {
                    run.ingest(&run.scopes[0], &mut rng).await;
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let flooded = steady_tenant(Arc::clone(&run), 1, rounds).await;
    summary("while another tenant floods ingest", flooded);
    flooding.store(false, Ordering::Relaxed);
    for flooder in flooders {
        let _ = flooder.await;
    }
    {
        let tally = run.tally.lock().map_err(|_| anyhow!("tally lock"))?;
        let flood = tally.latencies.get("ingest").map_or(0, Vec::len);
        println!("flood: {flood} ingests; statuses {:?}", tally.statuses);
    }
    let (checked, missing) = run.check_integrity().await;
    server.stop();
    verdict(&run, checked, missing)
}

fn main() -> Result<()> {
    let options = Arc::new(options()?);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let outcome = runtime.block_on(async {
        match options.mode.as_str() {
            "mixed" => mixed(Arc::clone(&options)).await,
            "fill" => fill(Arc::clone(&options)).await,
            "fairness" => fairness(Arc::clone(&options)).await,
            other => Err(anyhow!("unknown mode {other}: mixed, fill or fairness")),
        }
    });
    let _ = std::fs::remove_dir_all(&options.data_dir);
    outcome
}
