//! LLM providers for consolidation and answers: OpenAI-compatible chat completions (OpenAI, Azure
//! OpenAI, Ollama, vLLM, LM Studio) with JSON-schema structured output, and Anthropic
//! messages with a forced tool call. Timeouts, bounded retries with backoff on 429 and
//! 5xx (honouring `Retry-After`), lenient JSON parsing with one corrective retry, and
//! token and cost accounting.

use async_trait::async_trait;
use cairn_core::{
    Answerer, CandidateFact, CandidatePlaybook, ComposedAnswer, Error, Extraction, ExtractionInput,
    Extractor, FactType, Judge, Judgement, Result, ShownFact, ShownMemory, Usage, Verdict,
};
use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use std::time::Duration;

/// Which wire protocol the provider speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProviderKind {
    /// `POST {base}/chat/completions` with a bearer key.
    OpenAi,
    /// `POST {base}/chat/completions?api-version=...` with an `api-key` header; the base
    /// URL names the deployment.
    Azure,
    /// `POST {base}/v1/messages` with `x-api-key`.
    Anthropic,
}

impl ProviderKind {
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "openai" | "ollama" | "vllm" | "lmstudio" => Some(ProviderKind::OpenAi),
            "azure" => Some(ProviderKind::Azure),
            "anthropic" => Some(ProviderKind::Anthropic),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::OpenAi => "openai",
            ProviderKind::Azure => "azure",
            ProviderKind::Anthropic => "anthropic",
        }
    }
}

/// How an OpenAI-compatible request asks for output that follows the schema.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ResponseFormat {
    /// `{"type": "json_schema", "json_schema": {"name", "schema", "strict": true}}`: OpenAI,
    /// Azure, Ollama, vLLM, LM Studio and llama.cpp's `llama-server`.
    #[default]
    JsonSchema,
    /// `{"type": "json_object", "schema": …}`: servers that constrain JSON mode by a schema
    /// given beside it (llama-cpp-python's server, which refuses `json_schema`).
    JsonObject,
}

impl ResponseFormat {
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "json_schema" => Some(ResponseFormat::JsonSchema),
            "json_object" => Some(ResponseFormat::JsonObject),
            _ => None,
        }
    }

    /// The `response_format` member of a chat-completions request.
    fn request(self, tool: &str, schema: &Value) -> Value {
        match self {
            ResponseFormat::JsonSchema => json!({
                "type": "json_schema",
                "json_schema": { "name": tool, "schema": schema, "strict": true }
            }),
            ResponseFormat::JsonObject => json!({ "type": "json_object", "schema": bounded(schema) }),
        }
    }
}

/// Longest string and list a grammar-constrained server may generate (`json_object`).
const GRAMMAR_MAX_LENGTH: u64 = 400;
const GRAMMAR_MAX_ITEMS: u64 = 8;

/// `schema` with a length bound on every string and list that has none. A server that
/// turns the schema into a grammar then cannot let a small model repeat itself until
/// the output limit cuts the object short; what it answers is still checked by every
/// gate. (OpenAI's strict mode refuses some of these keywords, so `json_schema`
/// requests go as they are.)
fn bounded(schema: &Value) -> Value {
    match schema {
        Value::Object(fields) => {
            let mut out: serde_json::Map<String, Value> = fields
                .iter()
                .map(|(key, value)| (key.clone(), bounded(value)))
                .collect();
            let types: Vec<&str> = match fields.get("type") {
                Some(Value::String(kind)) => vec![kind.as_str()],
                Some(Value::Array(kinds)) => kinds.iter().filter_map(Value::as_str).collect(),
                _ => Vec::new(),
            };
            if types.contains(&"string") && !fields.contains_key("enum") {
                out.entry("maxLength").or_insert(json!(GRAMMAR_MAX_LENGTH));
            }
            if types.contains(&"array") {
                out.entry("maxItems").or_insert(json!(GRAMMAR_MAX_ITEMS));
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(bounded).collect()),
        other => other.clone(),
    }
}

#[derive(Clone, Debug)]
pub struct LlmConfig {
    pub kind: ProviderKind,
    pub base_url: String,
    pub model: String,
    pub api_key: Option<String>,
    /// Azure's `api-version` query parameter.
    pub api_version: Option<String>,
    pub timeout: Duration,
    /// Retries after the first attempt on timeouts, 429 and 5xx.
    pub max_retries: u32,
    /// First backoff; doubles per retry.
    pub backoff: Duration,
    /// Longest wait honoured from a `Retry-After` header.
    pub max_retry_after: Duration,
    /// US dollars per million input and output tokens, for the cost estimate.
    pub input_price_per_mtok: f64,
    pub output_price_per_mtok: f64,
    pub max_output_tokens: u32,
    /// How OpenAI-compatible requests ask for schema-shaped output (not used by Anthropic,
    /// which is asked for a tool call).
    pub response_format: ResponseFormat,
}

/// How a provider error starts when the model's output was unusable twice.
const UNPARSEABLE: &str = "the model answered unparseable JSON twice";

/// One provider, shared by the extractor and the judge.
#[derive(Clone)]
pub struct LlmClient {
    http: reqwest::Client,
    config: LlmConfig,
    name: String,
}

/// What a structured call returned: the parsed object, or why the model's output could
/// not be used after the corrective retry, and what the calls cost either way.
struct Reply {
    value: std::result::Result<Value, String>,
    usage: Usage,
}

impl Reply {
    /// The object, or the provider error of output unusable twice.
    fn object(&self) -> Result<&Value> {
        self.value
            .as_ref()
            .map_err(|problem| Error::Provider(format!("{UNPARSEABLE}: {problem}")))
    }
}

impl LlmClient {
    pub fn new(config: LlmConfig) -> Result<Self> {
        let http = reqwest::Client::builder()
            .timeout(config.timeout)
            .build()
            .map_err(|error| Error::Provider(format!("LLM client: {error}")))?;
        let name = format!("{}:{}", config.kind.as_str(), config.model);
        Ok(LlmClient { http, config, name })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Asks for one JSON object matching `schema`. Unparseable output gets one
    /// corrective retry that shows the model its answer and the parse error; the tokens
    /// of both calls are in the reply even when the second answer is unusable too.
    async fn structured(&self, system: &str, user: &str, tool: &str, schema: &Value) -> Result<Reply> {
        let mut usage = Usage::default();
        let (text, spent) = self.call(system, user, None, tool, schema).await?;
        usage.add(spent);
        match parse_lenient(&text) {
            Ok(value) => Ok(Reply {
                value: Ok(value),
                usage,
            }),
            Err(problem) => {
                let correction = format!(
                    "Your previous answer could not be parsed as JSON ({problem}). Answer again with only \
                     one JSON object that matches the schema, and nothing else."
                );
                let (text, spent) = self
                    .call(system, user, Some((&text, &correction)), tool, schema)
                    .await?;
                usage.add(spent);
                Ok(Reply {
                    value: parse_lenient(&text),
                    usage,
                })
            }
        }
    }

    /// One logical call with bounded retries on timeouts, 429 and 5xx.
    async fn call(
        &self,
        system: &str,
        user: &str,
        correction: Option<(&str, &str)>,
        tool: &str,
        schema: &Value,
    ) -> Result<(String, Usage)> {
        let mut attempt = 0;
        loop {
            let wait = match self.attempt(system, user, correction, tool, schema).await {
                Ok(answer) => return Ok(answer),
                Err(Attempt::Fatal(error)) => return Err(error),
                Err(Attempt::Retryable { error, retry_after }) => {
                    if attempt >= self.config.max_retries {
                        return Err(Error::Provider(format!(
                            "{error} (gave up after {} attempts)",
                            attempt + 1
                        )));
                    }
                    if let Some(after) = retry_after.filter(|after| *after > self.config.max_retry_after) {
                        // Longer than a call may wait: fail now; the job retries later.
                        return Err(Error::Provider(format!(
                            "{error}; asked to retry after {} s",
                            after.as_secs()
                        )));
                    }
                    let backoff = self.config.backoff.saturating_mul(1 << attempt.min(10));
                    retry_after.unwrap_or(backoff)
                }
            };
            attempt += 1;
            tokio::time::sleep(wait).await;
        }
    }

    async fn attempt(
        &self,
        system: &str,
        user: &str,
        correction: Option<(&str, &str)>,
        tool: &str,
        schema: &Value,
    ) -> std::result::Result<(String, Usage), Attempt> {
        let mut messages = vec![json!({ "role": "user", "content": user })];
        if let Some((previous, fix)) = correction {
            messages.push(json!({ "role": "assistant", "content": previous }));
            messages.push(json!({ "role": "user", "content": fix }));
        }
        let request = match self.config.kind {
            ProviderKind::OpenAi | ProviderKind::Azure => {
                let mut all = vec![json!({ "role": "system", "content": system })];
                all.extend(messages);
                let body = json!({
                    "model": self.config.model,
                    "messages": all,
                    "temperature": 0,
                    "max_tokens": self.config.max_output_tokens,
                    "response_format": self.config.response_format.request(tool, schema)
                });
                let base = self.config.base_url.trim_end_matches('/');
                let url = match (&self.config.kind, &self.config.api_version) {
                    (ProviderKind::Azure, Some(version)) => {
                        format!("{base}/chat/completions?api-version={version}")
                    }
                    _ => format!("{base}/chat/completions"),
                };
                let mut request = self.http.post(url).json(&body);
                if self.config.kind == ProviderKind::Azure {
                    if let Some(key) = &self.config.api_key {
                        request = request.header("api-key", key);
                    }
                } else if let Some(key) = &self.config.api_key {
                    request = request.bearer_auth(key);
                }
                request
            }
            ProviderKind::Anthropic => {
                let body = json!({
                    "model": self.config.model,
                    "max_tokens": self.config.max_output_tokens,
                    "system": system,
                    "messages": messages,
                    "tools": [{ "name": tool, "description": "Record the answer.", "input_schema": schema }],
                    "tool_choice": { "type": "tool", "name": tool }
                });
                let base = self.config.base_url.trim_end_matches('/');
                let mut request = self
                    .http
                    .post(format!("{base}/v1/messages"))
                    .header("anthropic-version", "2023-06-01")
                    .json(&body);
                if let Some(key) = &self.config.api_key {
                    request = request.header("x-api-key", key);
                }
                request
            }
        };
        let response = request.send().await.map_err(|error| Attempt::Retryable {
            error: format!("request failed: {}", without_url(&error)),
            retry_after: None,
        })?;
        let status = response.status();
        if status.as_u16() == 429 || status.is_server_error() {
            let retry_after = response
                .headers()
                .get("retry-after")
                .and_then(|value| value.to_str().ok())
                .and_then(|value| value.trim().parse::<f64>().ok())
                .filter(|seconds| seconds.is_finite() && *seconds >= 0.0)
                .map(Duration::from_secs_f64);
            return Err(Attempt::Retryable {
                error: format!("the provider answered {status}"),
                retry_after,
            });
        }
        if !status.is_success() {
            return Err(Attempt::Fatal(Error::Provider(format!(
                "the provider answered {status}"
            ))));
        }
        let body: Value = response.json().await.map_err(|error| Attempt::Retryable {
            error: format!("unreadable response: {}", without_url(&error)),
            retry_after: None,
        })?;
        let (text, input_tokens, output_tokens) = match self.config.kind {
            ProviderKind::OpenAi | ProviderKind::Azure => {
                let message = &body["choices"][0]["message"];
                if let Some(refusal) = message["refusal"].as_str().filter(|text| !text.is_empty()) {
                    return Err(Attempt::Fatal(Error::Provider(format!(
                        "the model refused: {refusal}"
                    ))));
                }
                let text = message["content"].as_str().unwrap_or_default().to_owned();
                (
                    text,
                    &body["usage"]["prompt_tokens"],
                    &body["usage"]["completion_tokens"],
                )
            }
            ProviderKind::Anthropic => {
                if body["stop_reason"].as_str() == Some("refusal") {
                    return Err(Attempt::Fatal(Error::Provider("the model refused".to_owned())));
                }
                let blocks = body["content"].as_array().cloned().unwrap_or_default();
                let text = blocks
                    .iter()
                    .find(|block| block["type"] == "tool_use")
                    .map(|block| block["input"].to_string())
                    .or_else(|| {
                        blocks
                            .iter()
                            .find(|block| block["type"] == "text")
                            .and_then(|block| block["text"].as_str().map(str::to_owned))
                    })
                    .unwrap_or_default();
                (
                    text,
                    &body["usage"]["input_tokens"],
                    &body["usage"]["output_tokens"],
                )
            }
        };
        let input_tokens = input_tokens.as_u64().unwrap_or(0);
        let output_tokens = output_tokens.as_u64().unwrap_or(0);
        let usage = Usage {
            calls: 1,
            input_tokens,
            output_tokens,
            cost_usd: (input_tokens as f64 * self.config.input_price_per_mtok
                + output_tokens as f64 * self.config.output_price_per_mtok)
                / 1_000_000.0,
        };
        Ok((text, usage))
    }
}

enum Attempt {
    Retryable {
        error: String,
        retry_after: Option<Duration>,
    },
    Fatal(Error),
}

/// A reqwest error without the URL (it may carry a key in a query string).
fn without_url(error: &reqwest::Error) -> String {
    let kind = if error.is_timeout() {
        "timed out"
    } else if error.is_connect() {
        "could not connect"
    } else if error.is_decode() {
        "could not decode the body"
    } else {
        "transport error"
    };
    kind.to_owned()
}

/// The JSON object in a model's answer: as is, inside a code fence, or the outermost
/// `{...}` in surrounding prose.
pub fn parse_lenient(text: &str) -> std::result::Result<Value, String> {
    let trimmed = text.trim();
    if let Ok(value @ Value::Object(_)) = serde_json::from_str::<Value>(trimmed) {
        return Ok(value);
    }
    let unfenced = trimmed
        .strip_prefix("```json")
        .or_else(|| trimmed.strip_prefix("```"))
        .and_then(|rest| rest.strip_suffix("```"))
        .map(str::trim);
    if let Some(inner) = unfenced
        && let Ok(value @ Value::Object(_)) = serde_json::from_str::<Value>(inner)
    {
        return Ok(value);
    }
    match (trimmed.find('{'), trimmed.rfind('}')) {
        (Some(start), Some(end)) if start < end => serde_json::from_str::<Value>(&trimmed[start..=end])
            .map_err(|error| error.to_string())
            .and_then(|value| {
                if value.is_object() {
                    Ok(value)
                } else {
                    Err("not a JSON object".to_owned())
                }
            }),
        _ => Err("no JSON object in the answer".to_owned()),
    }
}

const EXTRACT_SYSTEM: &str = "You maintain long-term memory about one user. From the user's NEW messages, \
extract facts worth remembering about the user or their world, and procedures they follow. Rules: \
write each fact in the third person and self-contained (\"The user's husband Diego ...\", never \"he\"); \
one statement per fact; use only what the USER said — assistant messages are context to understand the \
user and are never evidence; fact_type is one of identity, preference, constraint, world, event; set \
expires_in_hours only for time-bound statements (\"exam tomorrow\" -> 48); set valid_from/valid_to \
(RFC 3339) only when the user gave dates; source_episode_ids lists the ids of the new messages that \
state the fact, and span quotes the words that support it. Skip small talk, questions and thanks. \
Playbooks: only explicit multi-step procedures, with a confidence.";

const JUDGE_SYSTEM: &str = "You keep a user's memory consistent. Compare a NEW candidate fact with \
existing current facts shown under aliases. Answer UPDATES with the alias when the candidate replaces \
that fact's value (it stopped being true); EXTENDS with the alias when it adds detail and both stay \
true; DUPLICATE with the alias when it says the same thing; NEW when it relates to none of them. \
Only use an alias that was shown.";

fn extraction_schema() -> Value {
    let nullable = |kind: &str| json!({ "type": [kind, "null"] });
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["facts", "playbooks"],
        "properties": {
            "facts": { "type": "array", "items": {
                "type": "object",
                "additionalProperties": false,
                "required": ["text", "fact_type", "confidence", "expires_in_hours", "valid_from", "valid_to",
                             "source_episode_ids", "span"],
                "properties": {
                    "text": { "type": "string" },
                    "fact_type": { "type": "string", "enum": ["identity", "preference", "constraint", "world", "event"] },
                    "confidence": { "type": "number" },
                    "expires_in_hours": nullable("number"),
                    "valid_from": nullable("string"),
                    "valid_to": nullable("string"),
                    "source_episode_ids": { "type": "array", "items": { "type": "string" } },
                    "span": nullable("string")
                }
            }},
            "playbooks": { "type": "array", "items": {
                "type": "object",
                "additionalProperties": false,
                "required": ["name", "trigger", "steps", "confidence", "source_episode_ids"],
                "properties": {
                    "name": { "type": "string" },
                    "trigger": { "type": "string" },
                    "steps": { "type": "array", "items": { "type": "string" } },
                    "confidence": { "type": "number" },
                    "source_episode_ids": { "type": "array", "items": { "type": "string" } }
                }
            }}
        }
    })
}

fn judge_schema() -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["verdict", "target", "reason"],
        "properties": {
            "verdict": { "type": "string", "enum": ["NEW", "UPDATES", "EXTENDS", "DUPLICATE"] },
            "target": { "type": ["string", "null"] },
            "reason": { "type": "string" }
        }
    })
}

/// Extraction through an LLM provider.
pub struct LlmExtractor {
    client: LlmClient,
}

impl LlmExtractor {
    pub fn new(client: LlmClient) -> Self {
        LlmExtractor { client }
    }
}

fn extraction_prompt(input: &ExtractionInput) -> String {
    let mut prompt = String::new();
    if !input.known_facts.is_empty() {
        prompt.push_str("Facts already known (for reference; do not repeat them unless changed):\n");
        for fact in &input.known_facts {
            prompt.push_str(&format!("- {}\n", fact.text));
        }
        prompt.push('\n');
    }
    if !input.earlier.is_empty() {
        prompt.push_str("Earlier user messages (context only):\n");
        for episode in &input.earlier {
            prompt.push_str(&format!(
                "- [{}] {}\n",
                episode.occurred_at.to_rfc3339(),
                episode.text
            ));
        }
        prompt.push('\n');
    }
    if !input.assistant_context.is_empty() {
        prompt.push_str("Assistant messages (context only, NOT evidence):\n");
        for text in &input.assistant_context {
            prompt.push_str(&format!("- {text}\n"));
        }
        prompt.push('\n');
    }
    prompt.push_str("NEW user messages:\n");
    for episode in &input.episodes {
        prompt.push_str(&format!(
            "- id={} at={}: {}\n",
            episode.id,
            episode.occurred_at.to_rfc3339(),
            episode.text
        ));
    }
    prompt
}

fn parse_time(value: &Value) -> std::result::Result<Option<DateTime<Utc>>, String> {
    match value {
        Value::Null => Ok(None),
        Value::String(text) if text.is_empty() => Ok(None),
        Value::String(text) => DateTime::parse_from_rfc3339(text)
            .map(|time| Some(time.with_timezone(&Utc)))
            .map_err(|_| format!("{text:?} is not an RFC 3339 time")),
        _ => Err("a time must be a string".to_owned()),
    }
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|item| item.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// One extracted fact, validated on its own: a bad item is rejected, not the batch.
fn candidate_fact(item: &Value) -> std::result::Result<CandidateFact, String> {
    let text = item["text"]
        .as_str()
        .map(str::trim)
        .filter(|text| !text.is_empty())
        .ok_or("a fact without text")?;
    let fact_type = item["fact_type"]
        .as_str()
        .and_then(|kind| FactType::parse(kind).ok())
        .ok_or_else(|| format!("{text:?}: unknown fact_type"))?;
    let confidence = item["confidence"].as_f64().unwrap_or(0.8);
    if !(0.0..=1.0).contains(&confidence) {
        return Err(format!("{text:?}: confidence {confidence} outside 0..1"));
    }
    let expires_in_hours = match &item["expires_in_hours"] {
        Value::Null => None,
        value => Some(
            value
                .as_f64()
                .ok_or_else(|| format!("{text:?}: expires_in_hours is not a number"))?,
        ),
    };
    Ok(CandidateFact {
        text: text.to_owned(),
        fact_type,
        confidence: confidence as f32,
        expires_in_hours,
        valid_from: parse_time(&item["valid_from"])
            .map_err(|error| format!("{text:?}: valid_from {error}"))?,
        valid_to: parse_time(&item["valid_to"]).map_err(|error| format!("{text:?}: valid_to {error}"))?,
        source_episode_ids: strings(&item["source_episode_ids"]),
        span: item["span"].as_str().map(str::to_owned),
    })
}

fn candidate_playbook(item: &Value) -> std::result::Result<CandidatePlaybook, String> {
    let name = item["name"]
        .as_str()
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .ok_or("a playbook without name")?;
    let trigger = item["trigger"].as_str().map(str::trim).unwrap_or_default();
    let steps = strings(&item["steps"]);
    if trigger.is_empty() || steps.is_empty() {
        return Err(format!("playbook {name:?} without trigger or steps"));
    }
    Ok(CandidatePlaybook {
        name: name.to_owned(),
        trigger: trigger.to_owned(),
        steps,
        confidence: item["confidence"].as_f64().unwrap_or(0.0).clamp(0.0, 1.0) as f32,
        source_episode_ids: strings(&item["source_episode_ids"]),
    })
}

#[async_trait]
impl Extractor for LlmExtractor {
    fn name(&self) -> &str {
        self.client.name()
    }

    async fn extract(&self, input: &ExtractionInput) -> Result<Extraction> {
        let reply = self
            .client
            .structured(
                EXTRACT_SYSTEM,
                &extraction_prompt(input),
                "record_memories",
                &extraction_schema(),
            )
            .await?;
        let value = match &reply.value {
            Ok(value) => value,
            Err(problem) => {
                return Ok(Extraction {
                    usage: reply.usage,
                    unusable: Some(format!("{UNPARSEABLE}: {problem}")),
                    ..Extraction::default()
                });
            }
        };
        let mut extraction = Extraction {
            usage: reply.usage,
            ..Extraction::default()
        };
        for item in value["facts"].as_array().into_iter().flatten() {
            match candidate_fact(item) {
                Ok(fact) => extraction.facts.push(fact),
                Err(reason) => extraction.rejected.push(reason),
            }
        }
        for item in value["playbooks"].as_array().into_iter().flatten() {
            match candidate_playbook(item) {
                Ok(playbook) => extraction.playbooks.push(playbook),
                Err(reason) => extraction.rejected.push(reason),
            }
        }
        Ok(extraction)
    }
}

/// Judgement through an LLM provider.
pub struct LlmJudge {
    client: LlmClient,
}

impl LlmJudge {
    pub fn new(client: LlmClient) -> Self {
        LlmJudge { client }
    }
}

#[async_trait]
impl Judge for LlmJudge {
    fn name(&self) -> &str {
        self.client.name()
    }

    async fn judge(&self, candidate: &CandidateFact, shown: &[ShownFact]) -> Result<Judgement> {
        let mut prompt = format!("Candidate: {}\n\nCurrent facts:\n", candidate.text);
        for fact in shown {
            prompt.push_str(&format!("{}: {}\n", fact.alias, fact.fact.text));
        }
        let reply = self
            .client
            .structured(JUDGE_SYSTEM, &prompt, "record_judgement", &judge_schema())
            .await?;
        let Ok(value) = reply.object() else {
            return Ok(Judgement {
                verdict: Verdict::New,
                reason: "the judge's answer was unusable; kept as new".to_owned(),
                usage: reply.usage,
            });
        };
        let reason = value["reason"].as_str().unwrap_or_default().to_owned();
        let target = value["target"].as_str().map(str::to_owned);
        // Unusable output becomes NEW: never a lost or wrongly retired fact.
        let verdict = match (value["verdict"].as_str(), target) {
            (Some("NEW"), _) => Verdict::New,
            (Some("UPDATES"), Some(alias)) => Verdict::Updates(alias),
            (Some("EXTENDS"), Some(alias)) => Verdict::Extends(alias),
            (Some("DUPLICATE"), Some(alias)) => Verdict::Duplicate(alias),
            _ => {
                return Ok(Judgement {
                    verdict: Verdict::New,
                    reason: format!("the judge's answer was unusable ({value}); kept as new"),
                    usage: reply.usage,
                });
            }
        };
        Ok(Judgement {
            verdict,
            reason,
            usage: reply.usage,
        })
    }
}

const ANSWER_SYSTEM: &str = "You answer a question about one user from their memories, shown under \
aliases with the time each was said or learned, and from nothing else. Every claim in the answer must \
come from a memory, and citations lists the alias of every memory the answer uses. When the memories \
do not answer the question, set known to false, leave the answer empty and cite nothing; never guess. \
When memories disagree, prefer the most recent one.";

fn answer_schema() -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["answer", "known", "citations"],
        "properties": {
            "answer": { "type": "string" },
            "known": { "type": "boolean" },
            "citations": { "type": "array", "items": { "type": "string" } }
        }
    })
}

/// Answers through an LLM provider, from the memories shown only.
pub struct LlmAnswerer {
    client: LlmClient,
}

impl LlmAnswerer {
    pub fn new(client: LlmClient) -> Self {
        LlmAnswerer { client }
    }
}

#[async_trait]
impl Answerer for LlmAnswerer {
    fn name(&self) -> &str {
        self.client.name()
    }

    async fn answer(&self, question: &str, shown: &[ShownMemory]) -> Result<ComposedAnswer> {
        let mut prompt = format!("Question: {question}\n\nMemories:\n");
        for memory in shown {
            prompt.push_str(&format!(
                "{} [{}]: {}\n",
                memory.alias,
                memory.at.to_rfc3339(),
                memory.text
            ));
        }
        let reply = self
            .client
            .structured(ANSWER_SYSTEM, &prompt, "record_answer", &answer_schema())
            .await?;
        let value = reply.object()?;
        Ok(ComposedAnswer {
            answer: value["answer"].as_str().unwrap_or_default().trim().to_owned(),
            known: value["known"].as_bool().unwrap_or(false),
            citations: strings(&value["citations"]),
            usage: reply.usage,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grammar_servers_get_bounded_strings_and_lists() {
        let plain = extraction_schema();
        let asked = ResponseFormat::JsonSchema.request("record", &plain);
        assert_eq!(
            asked["json_schema"]["schema"], plain,
            "json_schema requests go unchanged"
        );
        let asked = ResponseFormat::JsonObject.request("record", &plain);
        assert_eq!(asked["type"], "json_object");
        let facts = &asked["schema"]["properties"]["facts"];
        assert_eq!(facts["maxItems"], json!(GRAMMAR_MAX_ITEMS));
        let item = &facts["items"]["properties"];
        assert_eq!(item["text"]["maxLength"], json!(GRAMMAR_MAX_LENGTH));
        assert_eq!(
            item["span"]["maxLength"],
            json!(GRAMMAR_MAX_LENGTH),
            "a nullable string too"
        );
        assert!(
            item["fact_type"].get("maxLength").is_none(),
            "an enum is bounded already"
        );
        assert!(item["confidence"].get("maxLength").is_none());
        assert_eq!(
            item["source_episode_ids"]["items"]["maxLength"],
            json!(GRAMMAR_MAX_LENGTH)
        );
        assert_eq!(
            ResponseFormat::parse("json_object"),
            Some(ResponseFormat::JsonObject)
        );
        assert_eq!(ResponseFormat::parse("text"), None);
    }

    #[test]
    fn json_is_found_in_fences_and_prose() {
        assert!(parse_lenient(r#"{"facts": []}"#).is_ok());
        assert!(parse_lenient("```json\n{\"facts\": []}\n```").is_ok());
        assert!(parse_lenient("Sure! Here it is: {\"facts\": []} Hope that helps.").is_ok());
        assert!(parse_lenient("no json here").is_err());
        assert!(parse_lenient("[1, 2]").is_err());
    }
}
