//! Memory scenarios in the shape of published memory-layer evaluations: each scenario
//! starts a fresh scope, adds unrelated filler messages, then its own messages one
//! simulated hour apart (with retractions through the API where it says so), re-runs
//! consolidation from the start (re-reading old episodes must not bring anything back),
//! then asks its question at a given time.
//!
//! It reports Recall@3 of the expected current facts and the stale rate (share of
//! scenarios whose top 3 holds an outdated, retracted, expired or invented value) for
//! three modes — episodes only (RAG), memory (facts), both — and two pipelines: the
//! offline extractor and judge, and an LLM provider that is a FAKE: a scripted server on
//! loopback answering what an ideal model would, so the real client and gates run.
//! With `--llm URL`, a third pipeline runs against a real OpenAI-compatible server (a
//! local model: `scripts/llm start`); its failed runs are counted, not fatal, and each
//! pipeline's gate refusals, tokens and time per episode are printed beside the others.

mod harness;

use anyhow::Context;
use cairn_app::{
    Cairn, ConsolidateMode, ConsolidateOptions, Consolidator, IngestRequest, Message, RecallRequest,
    RequestContext, Role, Settings,
};
use cairn_core::{FactStatus, Memory, MemoryStore, PageRequest, Scope, StatusFilter, Tier};
use cairn_inference::OnnxEmbedder;
use cairn_inference::llm::{LlmClient, LlmConfig, LlmExtractor, LlmJudge, ProviderKind, ResponseFormat};
use cairn_store_sqlite::SqliteStore;
use chrono::{DateTime, Duration, Utc};
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Deserialize)]
struct Suite {
    /// (message, what an ideal extractor makes of it)
    fillers: Vec<(String, String)>,
    scenarios: Vec<Scenario>,
}

#[derive(Deserialize, Clone)]
struct Scenario {
    name: String,
    kind: String,
    turns: Vec<Turn>,
    question: String,
    ask_after_hours: i64,
    /// Each expected item: alternative lower-case substrings, any of which counts.
    expected: Vec<Vec<String>>,
    /// Lower-case substrings that mark an outdated, retracted, expired or invented value.
    stale: Vec<String>,
    script: ScriptSpec,
    /// The people, pets, places and organisations the user names (labels for entity
    /// linking), when the scenario names any.
    #[serde(default)]
    entities: Vec<GoldEntity>,
}

#[derive(Deserialize, Clone)]
struct GoldEntity {
    /// Its name, or its relation to the user when it has none ("sister").
    name: String,
    kind: String,
    /// The relation by which the user refers to it ("sister" for "my sister Anna").
    #[serde(default)]
    relation: Option<String>,
}

#[derive(Deserialize, Clone)]
struct Turn {
    user: String,
    #[serde(default)]
    assistant: Option<String>,
    /// Retract (through the API) the active fact containing this text, after the turn.
    #[serde(default)]
    retract: Option<String>,
    /// Simulated hours since the previous message (default 1); a long gap starts a new
    /// session in a conversation that spans days or weeks.
    #[serde(default)]
    after_hours: Option<i64>,
}

#[derive(Deserialize, Clone, Default)]
struct ScriptSpec {
    /// (turn index, fact text, fact type, expires_in_hours)
    facts: Vec<(usize, String, String, Option<f64>)>,
    /// (candidate contains, verdict, shown fact contains)
    judge: Vec<(String, String, String)>,
}

/// What the scripted fake answers for the scenario running now.
#[derive(Default)]
struct Script {
    facts: BTreeMap<String, Vec<(String, String, Option<f64>)>>,
    judge: Vec<(String, String, String)>,
}

const FILLERS_PER_SCENARIO: usize = 4;
const K: usize = 3;

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Rag,
    Memory,
    Both,
}

impl Mode {
    const ALL: [Mode; 3] = [Mode::Rag, Mode::Memory, Mode::Both];

    fn name(self) -> &'static str {
        match self {
            Mode::Rag => "episodes only (RAG)",
            Mode::Memory => "memory (facts)",
            Mode::Both => "both",
        }
    }

    fn tiers(self) -> Vec<Tier> {
        match self {
            Mode::Rag => vec![Tier::Episodic],
            Mode::Memory => vec![Tier::Semantic],
            Mode::Both => vec![Tier::Semantic, Tier::Episodic],
        }
    }
}

#[derive(Default, Clone)]
struct Score {
    scenarios: usize,
    recall: f64,
    stale: usize,
    stale_names: Vec<String>,
    missed_names: Vec<String>,
    /// Labelled entities, and those found with their kind (and relation, when labelled).
    entities: usize,
    entities_linked: usize,
    entities_missed: Vec<String>,
}

/// A real model server for the `llm` pipeline.
struct LocalLlm {
    url: String,
    model: String,
    format: ResponseFormat,
    max_tokens: u32,
}

/// What a pipeline's gates refused and what its runs cost, over every scenario.
#[derive(Default)]
struct Costs {
    episodes: usize,
    /// Synchronous runs (and the final re-read) that failed: the model's output was
    /// unusable twice, or the provider failed.
    failed_runs: usize,
    runs: usize,
    /// Decisions by kind, and judge verdicts naming an alias it was not shown.
    decisions: BTreeMap<&'static str, usize>,
    aliases_refused: usize,
    tokens: u64,
    seconds: f64,
}

fn scope_of(index: usize, pipeline: &str) -> anyhow::Result<Scope> {
    harness::scope(&format!("scenario-{pipeline}-{index}"), "user", "scenario-eval")
}

/// A minimal HTTP/1.1 server speaking the OpenAI chat-completions shape, answering from
/// the shared script. One request per connection.
async fn serve_fake(script: Arc<Mutex<Script>>) -> anyhow::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let script = Arc::clone(&script);
            tokio::spawn(async move {
                let mut buffer = Vec::new();
                let mut chunk = [0u8; 8192];
                let body_start;
                loop {
                    let Ok(read) = socket.read(&mut chunk).await else {
                        return;
                    };
                    if read == 0 {
                        return;
                    }
                    buffer.extend_from_slice(&chunk[..read]);
                    if let Some(end) = buffer.windows(4).position(|window| window == b"\r\n\r\n") {
                        body_start = end + 4;
                        break;
                    }
                }
                let head = String::from_utf8_lossy(&buffer[..body_start]).to_lowercase();
                let length = head
                    .lines()
                    .find_map(|line| line.strip_prefix("content-length:"))
                    .and_then(|value| value.trim().parse::<usize>().ok())
                    .unwrap_or(0);
                while buffer.len() < body_start + length {
                    let Ok(read) = socket.read(&mut chunk).await else {
                        return;
                    };
                    if read == 0 {
                        return;
                    }
                    buffer.extend_from_slice(&chunk[..read]);
                }
                let request: Value =
                    serde_json::from_slice(&buffer[body_start..body_start + length]).unwrap_or_default();
                let prompt = request["messages"][1]["content"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                let content = match script.lock() {
                    Ok(script) => answer(&script, &prompt).to_string(),
                    Err(_) => return,
                };
                let body = json!({
                    "choices": [{ "message": { "role": "assistant", "content": content } }],
                    "usage": { "prompt_tokens": prompt.len() / 4, "completion_tokens": content.len() / 4 }
                })
                .to_string();
                let response = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(response.as_bytes()).await;
            });
        }
    });
    Ok(format!("http://{address}/v1"))
}

fn answer(script: &Script, prompt: &str) -> Value {
    if let Some(rest) = prompt.strip_prefix("Candidate: ") {
        let candidate = rest.lines().next().unwrap_or_default();
        for (needle, verdict, target) in &script.judge {
            if !candidate.contains(needle.as_str()) {
                continue;
            }
            let alias = prompt
                .lines()
                .filter_map(|line| line.split_once(": "))
                .find(|(alias, fact)| alias.starts_with('m') && fact.contains(target.as_str()))
                .map(|(alias, _)| alias.to_owned());
            if let Some(alias) = alias {
                return json!({ "verdict": verdict, "target": alias, "reason": "scripted" });
            }
        }
        return json!({ "verdict": "NEW", "target": null, "reason": "scripted: unrelated" });
    }
    let mut facts = Vec::new();
    for line in prompt.lines() {
        let Some(rest) = line.strip_prefix("- id=") else {
            continue;
        };
        let Some((id, rest)) = rest.split_once(" at=") else {
            continue;
        };
        let Some((_, text)) = rest.split_once(": ") else {
            continue;
        };
        for (fact, kind, hours) in script.facts.get(text).into_iter().flatten() {
            facts.push(json!({
                "text": fact, "fact_type": kind, "confidence": 0.9, "expires_in_hours": hours,
                "valid_from": null, "valid_to": null, "source_episode_ids": [id], "span": text
            }));
        }
    }
    json!({ "facts": facts, "playbooks": [] })
}

/// Ingests one turn and consolidates it at once; answers why the run failed, if it did.
async fn ingest(
    cairn: &Cairn,
    scope: &Scope,
    turn: &Turn,
    at: DateTime<Utc>,
) -> anyhow::Result<Option<String>> {
    let context = RequestContext {
        request_id: "scenario".into(),
    };
    let mut messages = Vec::new();
    if let Some(assistant) = &turn.assistant {
        messages.push(Message {
            role: Role::Assistant,
            content: assistant.clone(),
            timestamp: Some(at),
        });
    }
    messages.push(Message {
        role: Role::User,
        content: turn.user.clone(),
        timestamp: Some(at),
    });
    let outcome = cairn
        .ingest(
            scope,
            &context,
            IngestRequest {
                messages,
                session_id: None,
                consolidate: ConsolidateMode::Sync,
            },
        )
        .await?;
    Ok(outcome.consolidation.error)
}

async fn retract(cairn: &Cairn, store: &dyn MemoryStore, scope: &Scope, needle: &str) -> anyhow::Result<()> {
    let facts = store
        .list_facts(
            scope,
            StatusFilter::Only(FactStatus::Active),
            Utc::now() + Duration::days(3650),
            &PageRequest {
                limit: 100,
                cursor: None,
            },
        )
        .await?;
    let context = RequestContext {
        request_id: "scenario".into(),
    };
    for fact in facts
        .items
        .iter()
        .filter(|fact| fact.text.to_lowercase().contains(needle))
    {
        cairn
            .retract_fact(
                scope,
                &context,
                &fact.id,
                Some("the user said it was never true".into()),
            )
            .await?;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn run_scenario(
    cairn: &Cairn,
    store: &dyn MemoryStore,
    script: Option<&Arc<Mutex<Script>>>,
    fillers: &[(String, String)],
    index: usize,
    pipeline: &str,
    scenario: &Scenario,
    scores: &mut BTreeMap<(&'static str, String), Score>,
    costs: &mut Costs,
    trace: bool,
) -> anyhow::Result<()> {
    let scope = scope_of(index, pipeline)?;
    let started = std::time::Instant::now();
    // Only a real model may fail a run; with it, failures are figures, not errors.
    let tolerant = pipeline == "llm";
    let failed = |error: Option<String>, costs: &mut Costs| -> anyhow::Result<()> {
        costs.runs += 1;
        match error {
            None => Ok(()),
            Some(error) if tolerant => {
                costs.failed_runs += 1;
                if trace {
                    eprintln!("[{pipeline}] {}: a run failed: {error}", scenario.name);
                }
                Ok(())
            }
            Some(error) => anyhow::bail!("consolidation failed: {error}"),
        }
    };
    if let Some(script) = script {
        let mut script = script.lock().map_err(|_| anyhow::anyhow!("script lock"))?;
        script.facts.clear();
        for (message, fact) in fillers {
            script
                .facts
                .entry(message.clone())
                .or_default()
                .push((fact.clone(), "event".into(), None));
        }
        for (turn, text, kind, hours) in &scenario.script.facts {
            let message = &scenario.turns[*turn].user;
            script
                .facts
                .entry(message.clone())
                .or_default()
                .push((text.clone(), kind.clone(), *hours));
        }
        script.judge = scenario.script.judge.clone();
    }
    let base = Utc::now() + Duration::hours(1);
    let chosen: Vec<&(String, String)> = (0..FILLERS_PER_SCENARIO)
        .map(|offset| &fillers[(index * 3 + offset) % fillers.len()])
        .collect();
    let mut hour = 0;
    for (message, _) in chosen {
        let turn = Turn {
            user: message.clone(),
            assistant: None,
            retract: None,
            after_hours: None,
        };
        failed(
            ingest(cairn, &scope, &turn, base + Duration::hours(hour)).await?,
            costs,
        )?;
        costs.episodes += 1;
        hour += 1;
    }
    for (position, turn) in scenario.turns.iter().enumerate() {
        if position > 0 {
            hour += turn.after_hours.unwrap_or(1) - 1;
        }
        let error = ingest(cairn, &scope, turn, base + Duration::hours(hour))
            .await
            .with_context(|| format!("scenario {:?}", scenario.name))?;
        failed(error, costs)?;
        costs.episodes += 1;
        if let Some(needle) = &turn.retract {
            retract(cairn, store, &scope, &needle.to_lowercase()).await?;
        }
        hour += 1;
    }
    // Re-reading every episode must not bring back what was retracted or superseded.
    let context = RequestContext {
        request_id: "scenario".into(),
    };
    let reread = cairn
        .consolidate(
            &scope,
            &context,
            ConsolidateOptions {
                dry_run: false,
                from_start: true,
                ..ConsolidateOptions::default()
            },
        )
        .await;
    failed(reread.err().map(|error| error.to_string()), costs)?;
    costs.seconds += started.elapsed().as_secs_f64();
    costs.tokens += cairn
        .token_budget(&scope)
        .await
        .map_or(0, |budget| budget.used_today);
    let decisions = store
        .list_decisions(
            &scope,
            None,
            &PageRequest {
                limit: 1000,
                cursor: None,
            },
        )
        .await?;
    for decision in &decisions.items {
        *costs.decisions.entry(decision.kind.as_str()).or_default() += 1;
        if decision.reason.contains("which it was not shown") {
            costs.aliases_refused += 1;
        }
    }
    if !scenario.entities.is_empty() {
        let found = cairn.entities(&scope).await?;
        let plain = |text: &str| text.to_lowercase().trim_end_matches("'s").to_owned();
        let score = scores.entry(("entities", "all".to_owned())).or_default();
        for gold in &scenario.entities {
            let linked = found.iter().any(|entity| {
                (plain(&entity.name) == plain(&gold.name)
                    || entity
                        .aliases
                        .iter()
                        .any(|alias| plain(alias) == plain(&gold.name)))
                    && entity.kind.as_str() == gold.kind
                    && gold.relation.as_ref().is_none_or(|relation| {
                        entity
                            .aliases
                            .iter()
                            .any(|alias| alias.eq_ignore_ascii_case(&format!("the user's {relation}")))
                    })
            });
            score.entities += 1;
            if linked {
                score.entities_linked += 1;
            } else {
                score
                    .entities_missed
                    .push(format!("{}: {}", scenario.name, gold.name));
            }
        }
    }
    let as_of = base + Duration::hours(hour - 1 + scenario.ask_after_hours);
    for mode in Mode::ALL {
        let result = cairn
            .recall(
                &scope,
                RecallRequest {
                    query: scenario.question.clone(),
                    tiers: mode.tiers(),
                    k: Some(K),
                    as_of: Some(as_of),
                    valid_at: None,
                    include_history: false,
                    include_pending: false,
                    explain: false,
                    fact_types: Vec::new(),
                    session_id: None,
                    entity: None,
                },
            )
            .await?;
        let texts: Vec<String> = result
            .hits
            .iter()
            .map(|hit| match &hit.memory {
                Memory::Episode(episode) => episode.text.to_lowercase(),
                Memory::Fact(fact) => fact.text.to_lowercase(),
                Memory::Playbook(playbook) => playbook.searchable_text().to_lowercase(),
            })
            .collect();
        let found = scenario
            .expected
            .iter()
            .filter(|alternatives| {
                alternatives
                    .iter()
                    .any(|needle| texts.iter().any(|text| text.contains(needle.as_str())))
            })
            .count();
        let recall = if scenario.expected.is_empty() {
            1.0
        } else {
            found as f64 / scenario.expected.len() as f64
        };
        let stale = scenario
            .stale
            .iter()
            .any(|needle| texts.iter().any(|text| text.contains(needle.as_str())));
        if trace && mode == Mode::Memory && (stale || recall < 1.0) {
            eprintln!("[{pipeline}] {}: top {K} = {texts:?}", scenario.name);
            let decisions = store
                .list_decisions(
                    &scope,
                    None,
                    &PageRequest {
                        limit: 50,
                        cursor: None,
                    },
                )
                .await?;
            for decision in decisions.items.iter().rev() {
                eprintln!("    {} {}", decision.kind.as_str(), decision.reason);
            }
            let facts = store
                .list_facts(
                    &scope,
                    StatusFilter::All,
                    as_of,
                    &PageRequest {
                        limit: 50,
                        cursor: None,
                    },
                )
                .await?;
            for fact in facts.items.iter().rev() {
                eprintln!("    fact {:?} {:?}: {}", fact.status, fact.fact_type, fact.text);
            }
        }
        for key in [
            (mode.name(), "all".to_owned()),
            (mode.name(), scenario.kind.clone()),
        ] {
            let score = scores.entry(key).or_default();
            score.scenarios += 1;
            score.recall += recall;
            if stale {
                score.stale += 1;
                score.stale_names.push(scenario.name.clone());
            }
            if recall < 1.0 {
                score.missed_names.push(scenario.name.clone());
            }
        }
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let mut arguments = std::env::args().skip(1);
    let data = PathBuf::from(
        arguments
            .next()
            .unwrap_or_else(|| "evals/scenarios/scenarios.json".into()),
    );
    let models = PathBuf::from(arguments.next().unwrap_or_else(|| ".models".into()));
    let mut options = Options::default();
    let mut llm_url = None;
    let mut llm = LocalLlm {
        url: String::new(),
        model: "smollm2-135m".into(),
        format: ResponseFormat::JsonObject,
        max_tokens: 512,
    };
    while let Some(argument) = arguments.next() {
        let mut value = |name: &str| {
            arguments
                .next()
                .ok_or_else(|| anyhow::anyhow!("{name} needs a value"))
        };
        match argument.as_str() {
            "--verbose" => options.verbose = true,
            "--llm" => llm_url = Some(value("--llm")?),
            "--llm-model" => llm.model = value("--llm-model")?,
            "--llm-format" => {
                llm.format = ResponseFormat::parse(&value("--llm-format")?)
                    .ok_or_else(|| anyhow::anyhow!("--llm-format: json_schema or json_object"))?;
            }
            "--llm-max-tokens" => llm.max_tokens = value("--llm-max-tokens")?.parse()?,
            "--limit" => options.limit = Some(value("--limit")?.parse()?),
            "--pipelines" => {
                options.pipelines = Some(value("--pipelines")?.split(',').map(str::to_owned).collect());
            }
            other => anyhow::bail!(
                "unknown option {other}; options: --verbose, --llm URL, --llm-model NAME, \
                 --llm-format json_schema|json_object, --llm-max-tokens N, --limit N, --pipelines a,b"
            ),
        }
    }
    options.llm = llm_url.map(|url| LocalLlm { url, ..llm });
    harness::runtime()?.block_on(run(data, models, options))?;
    Ok(())
}

/// How `scenarios` runs beyond its two paths.
#[derive(Default)]
struct Options {
    verbose: bool,
    /// The real model of the `llm` pipeline.
    llm: Option<LocalLlm>,
    /// Only the first scenarios (a slow model's sample).
    limit: Option<usize>,
    /// The pipelines to run: `offline`, `scripted-llm`, and `llm` with `--llm`.
    pipelines: Option<Vec<String>>,
}

/// One printed figure: a pipeline's Recall@3 and stale count in one mode.
#[derive(Debug)]
struct Figure {
    pipeline: &'static str,
    mode: &'static str,
    recall: f64,
    stale: usize,
    scenarios: usize,
}

async fn run(data: PathBuf, models: PathBuf, options: Options) -> anyhow::Result<Vec<Figure>> {
    let verbose = options.verbose;
    let mut suite: Suite = serde_json::from_str(
        &std::fs::read_to_string(&data).with_context(|| format!("cannot read {}", data.display()))?,
    )?;
    if let Some(limit) = options.limit {
        suite.scenarios.truncate(limit);
    }
    let mut pipelines: Vec<&'static str> = vec!["offline", "scripted-llm"];
    if options.llm.is_some() {
        pipelines.push("llm");
    }
    if let Some(chosen) = &options.pipelines {
        for name in chosen {
            if !pipelines.contains(&name.as_str()) {
                anyhow::bail!("--pipelines: {name} is not one of {pipelines:?} (llm needs --llm)");
            }
        }
        pipelines.retain(|pipeline| chosen.iter().any(|name| name == pipeline));
    }
    let embedder = Arc::new(OnnxEmbedder::load(&harness::embedder_config(&models))?);
    // As the service does: consolidation compares statements with the reference model.
    let reference: Option<Arc<dyn cairn_core::Embedder>> = match harness::embedder_config(&models).reference()
    {
        Some(config) => Some(Arc::new(OnnxEmbedder::load(&config)?)),
        None => None,
    };
    let script = Arc::new(Mutex::new(Script::default()));
    let fake_url = serve_fake(Arc::clone(&script)).await?;
    println!(
        "{} scenarios, {} filler messages each, k = {K}; the scripted-llm provider is a FAKE on loopback{}\n",
        suite.scenarios.len(),
        FILLERS_PER_SCENARIO,
        options.llm.as_ref().map_or(String::new(), |llm| format!(
            "; the llm pipeline is {} at {} ({} output tokens at most)",
            llm.model, llm.url, llm.max_tokens
        ))
    );
    let mut by_kind: BTreeMap<String, usize> = BTreeMap::new();
    for scenario in &suite.scenarios {
        *by_kind.entry(scenario.kind.clone()).or_default() += 1;
    }
    println!("scenarios per kind: {by_kind:?}\n");
    println!("| pipeline | mode | Recall@3 | stale rate |");
    println!("|---|---|---|---|");
    let mut figures = Vec::new();
    let mut all_costs = Vec::new();
    for pipeline in pipelines {
        let directory = tempfile::tempdir()?;
        let store: Arc<dyn MemoryStore> = Arc::new(SqliteStore::open(directory.path())?);
        let mut settings = Settings {
            bump_usage_on_recall: false,
            ..Settings::default()
        };
        // A budget no run reaches, so that each scenario's tenant counts its tokens.
        settings.consolidation.tenant_token_budget = u64::MAX / 4;
        let mut cairn = Cairn::new(Arc::clone(&store), Some(embedder.clone()), settings);
        if let Some(reference) = &reference {
            cairn = cairn.with_consolidator(
                Consolidator::offline(Some(Arc::clone(reference))).with_reference(Arc::clone(reference)),
            );
        }
        let mut shared_script = None;
        if pipeline == "scripted-llm" {
            let client = LlmClient::new(LlmConfig {
                kind: ProviderKind::OpenAi,
                base_url: fake_url.clone(),
                model: "scripted".into(),
                api_key: None,
                api_version: None,
                timeout: std::time::Duration::from_secs(10),
                max_retries: 1,
                backoff: std::time::Duration::from_millis(10),
                max_retry_after: std::time::Duration::from_secs(1),
                input_price_per_mtok: 0.0,
                output_price_per_mtok: 0.0,
                max_output_tokens: 1024,
                response_format: Default::default(),
            })?;
            cairn = cairn.with_consolidator(llm_consolidator(client, reference.as_ref()));
            shared_script = Some(&script);
        }
        if let (true, Some(llm)) = (pipeline == "llm", &options.llm) {
            let client = LlmClient::new(LlmConfig {
                kind: ProviderKind::OpenAi,
                base_url: llm.url.clone(),
                model: llm.model.clone(),
                api_key: None,
                api_version: None,
                timeout: std::time::Duration::from_secs(600),
                max_retries: 1,
                backoff: std::time::Duration::from_millis(200),
                max_retry_after: std::time::Duration::from_secs(5),
                input_price_per_mtok: 0.0,
                output_price_per_mtok: 0.0,
                max_output_tokens: llm.max_tokens,
                response_format: llm.format,
            })?;
            cairn = cairn.with_consolidator(llm_consolidator(client, reference.as_ref()));
        }
        let mut costs = Costs::default();
        let mut scores: BTreeMap<(&'static str, String), Score> = BTreeMap::new();
        for (index, scenario) in suite.scenarios.iter().enumerate() {
            run_scenario(
                &cairn,
                store.as_ref(),
                shared_script,
                &suite.fillers,
                index,
                pipeline,
                scenario,
                &mut scores,
                &mut costs,
                verbose,
            )
            .await?;
        }
        all_costs.push((pipeline, costs));
        for mode in Mode::ALL {
            let Some(score) = scores.get(&(mode.name(), "all".to_owned())) else {
                continue;
            };
            let figure = Figure {
                pipeline,
                mode: mode.name(),
                recall: score.recall / score.scenarios as f64,
                stale: score.stale,
                scenarios: score.scenarios,
            };
            println!(
                "| {} | {} | {:.3} | {:.1}% ({}/{}) |",
                figure.pipeline,
                figure.mode,
                figure.recall,
                100.0 * figure.stale as f64 / figure.scenarios as f64,
                figure.stale,
                figure.scenarios
            );
            figures.push(figure);
        }
        if let Some(score) = scores.get(&("entities", "all".to_owned())) {
            println!(
                "| {pipeline} | entity linking | {:.3} ({}/{}) | |",
                score.entities_linked as f64 / score.entities.max(1) as f64,
                score.entities_linked,
                score.entities
            );
            if verbose {
                eprintln!("  {pipeline} / entities missed: {:?}", score.entities_missed);
            }
        }
        if verbose {
            for ((mode, kind), score) in &scores {
                if kind == "all" || *mode == "entities" {
                    continue;
                }
                eprintln!(
                    "  {pipeline} / {mode} / {kind}: recall {:.2}, stale {}/{} {:?}, missed {:?}",
                    score.recall / score.scenarios as f64,
                    score.stale,
                    score.scenarios,
                    score.stale_names,
                    score.missed_names
                );
            }
        }
    }
    print_costs(&all_costs);
    Ok(figures)
}

/// Extraction and judgement through `client`, comparing statements with the
/// reference model when the service would.
fn llm_consolidator(client: LlmClient, reference: Option<&Arc<dyn cairn_core::Embedder>>) -> Consolidator {
    let consolidator = Consolidator::new(
        Arc::new(LlmExtractor::new(client.clone())),
        Arc::new(LlmJudge::new(client)),
    );
    match reference {
        Some(reference) => consolidator.with_reference(Arc::clone(reference)),
        None => consolidator,
    }
}

/// What each pipeline's gates refused and what its runs cost, in one table.
fn print_costs(all: &[(&str, Costs)]) {
    println!();
    println!(
        "| pipeline | new | dropped ungrounded | refused | blocked by tombstone | duplicates | aliases refused | failed runs | tokens / episode | s / episode |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for (pipeline, costs) in all {
        let count = |kind: &str| costs.decisions.get(kind).copied().unwrap_or(0);
        let episodes = costs.episodes.max(1) as f64;
        println!(
            "| {pipeline} | {} | {} | {} | {} | {} | {} | {}/{} | {:.0} | {:.2} |",
            count("NEW"),
            count("DROPPED_UNGROUNDED"),
            count("REFUSED"),
            count("BLOCKED_BY_TOMBSTONE"),
            count("DUPLICATE"),
            costs.aliases_refused,
            costs.failed_runs,
            costs.runs,
            costs.tokens as f64 / episodes,
            costs.seconds / episodes
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(alias: &str, text: &str) -> cairn_core::ShownFact {
        let now = Utc::now();
        cairn_core::ShownFact {
            alias: alias.to_owned(),
            fact: cairn_core::Fact::new_active(
                cairn_core::new_id("fact"),
                cairn_core::FactType::World,
                text.to_owned(),
                0.9,
                now,
            ),
            similarity: None,
        }
    }

    fn candidate(text: &str) -> cairn_core::CandidateFact {
        cairn_core::CandidateFact {
            text: text.to_owned(),
            fact_type: cairn_core::FactType::World,
            confidence: 0.9,
            expires_in_hours: None,
            valid_from: None,
            valid_to: None,
            source_episode_ids: Vec::new(),
            span: None,
        }
    }

    /// The offline judge with the real embedding model: a change in a single-valued
    /// slot that no word list names replaces the old value; an addition in a slot that
    /// holds several, or a change in another slot, does not.
    #[test]
    fn the_offline_judge_matches_single_valued_slots_by_meaning() {
        use cairn_core::{Judge, Verdict};
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
        let runtime = harness::runtime().expect("runtime");
        let embedder = Arc::new(
            OnnxEmbedder::load(&harness::embedder_config(&root.join(".models"))).expect("the model loads"),
        );
        let with_meaning = cairn_app::OfflineJudge::with_embedder(embedder);
        let rules_only = cairn_app::OfflineJudge::default();
        let verdict = |judge: &cairn_app::OfflineJudge, said: &str, known: &[&str]| {
            let shown: Vec<cairn_core::ShownFact> = known
                .iter()
                .enumerate()
                .map(|(index, text)| shown(&format!("m{}", index + 1), text))
                .collect();
            runtime
                .block_on(judge.judge(&candidate(said), &shown))
                .expect("a judgement")
                .verdict
        };
        let provider = [
            "The user tried a new bakery downtown.",
            "The user is on a Vodafone contract, 20GB, and it's way too expensive for what the user uses.",
        ];
        let ported = "The user ported their number to Lebara last week, 10 euros a month, so much better.";
        assert_eq!(
            verdict(&with_meaning, ported, &provider),
            Verdict::Updates("m2".into())
        );
        assert_eq!(verdict(&rules_only, ported, &provider), Verdict::New);
        // Hobbies hold several at once; a new one adds.
        assert_eq!(
            verdict(
                &with_meaning,
                "The user has started pottery classes as well.",
                &["The user climbs at the bouldering gym."],
            ),
            Verdict::New
        );
        // Not a change of job; not the user's phone; a change in the same slot.
        assert_eq!(
            verdict(
                &with_meaning,
                "The user started volunteering at a food bank.",
                &["The user works at Google."],
            ),
            Verdict::New
        );
        assert_eq!(
            verdict(
                &with_meaning,
                "The user's partner got a new phone.",
                &["The user has an iPhone 12."],
            ),
            Verdict::New
        );
        assert_eq!(
            verdict(
                &with_meaning,
                "The user takes the train to work now.",
                &["The user cycles to the office every day."],
            ),
            Verdict::Updates("m1".into())
        );
        // Another slot is not replaced.
        assert_eq!(
            verdict(
                &with_meaning,
                "The user started a new job at Datadog.",
                &["The user lives in Lisbon."],
            ),
            Verdict::New
        );
        // A relationship that ended outdates what the partner was called; someone
        // else's does not.
        let marriage = ["The user's husband Mark handles all their finances."];
        assert_eq!(
            verdict(
                &rules_only,
                "The user's divorce was finalised last week.",
                &marriage
            ),
            Verdict::Updates("m1".into())
        );
        assert_eq!(
            verdict(&rules_only, "The user's sister got divorced.", &marriage),
            Verdict::New
        );
        // A change of shift pattern, of how long without smoking, of a thing of the
        // user's told to be otherwise now.
        assert_eq!(
            verdict(
                &rules_only,
                "The user started nights this week, rota changed.",
                &["The user works day shifts at the hospital, 7 to 7."],
            ),
            Verdict::Updates("m1".into())
        );
        // A death ends what was current about the one who died; a birth a pregnancy.
        assert_eq!(
            verdict(
                &rules_only,
                "The user lost Bruno on Sunday.",
                &["The user's old labrador Bruno sleeps under their desk all day."],
            ),
            Verdict::Updates("m1".into())
        );
        assert_eq!(
            verdict(
                &rules_only,
                "The user's daughter Ada was born on Tuesday.",
                &["The user's wife is pregnant with their first, due in March."],
            ),
            Verdict::Updates("m1".into())
        );
        assert_eq!(
            verdict(
                &rules_only,
                "The user is three months smoke-free today.",
                &["The user smokes about a pack a week."],
            ),
            Verdict::Updates("m1".into())
        );
    }

    /// The write gates in `cairn-app`, over SQLite and without HTTP, with the offline
    /// pipeline and the scripted LLM: the ten held-out regression scenarios keep every
    /// expected fact current and nothing stale.
    #[test]
    fn the_gates_hold_on_the_regression_holdout() {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
        let figures = harness::runtime()
            .expect("runtime")
            .block_on(run(
                root.join("evals/scenarios/holdout.json"),
                root.join(".models"),
                Options::default(),
            ))
            .expect("the scenarios run");
        let memory: Vec<&Figure> = figures
            .iter()
            .filter(|figure| figure.mode == Mode::Memory.name())
            .collect();
        assert_eq!(memory.len(), 2, "{figures:?}");
        for figure in memory {
            assert_eq!(figure.scenarios, 10, "{figure:?}");
            assert!(figure.recall >= 0.99, "{figure:?}");
            assert_eq!(
                figure.stale, 0,
                "{} left a stale value current: {figure:?}",
                figure.pipeline
            );
        }
    }
}
