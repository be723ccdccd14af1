//! Consolidation end to end: the offline pipeline, and a FAKE LLM provider — a scripted
//! server on loopback speaking the OpenAI and Anthropic wire formats — so the real
//! provider client, retries and parsing run.

use super::{ALL, call, config, drop_indices, harness_with, token, until_ready};
use actix_web::http::{Method, StatusCode};
use actix_web::test;
use actix_web::web;
use cairn_server::{build_state, http, spawn_consolidation_worker};
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the fake does to the next call, before answering from its script.
#[derive(Clone, Debug)]
pub enum Fault {
    Status(u16, Option<&'static str>),
    Malformed,
    Refusal,
    Sleep(Duration),
}

/// A scripted extracted fact: text, fact_type, expires_in_hours.
pub type ScriptedFact = (&'static str, &'static str, Option<f64>);

/// The fake's script: facts to extract per user message, and verdicts per candidate.
#[derive(Default)]
pub struct Script {
    /// (exact user message, [(fact text, fact_type, expires_in_hours)])
    pub extract: Vec<(&'static str, Vec<ScriptedFact>)>,
    /// (candidate text contains, verdict, target: a substring of a shown fact, or a raw alias)
    pub judge: Vec<(&'static str, &'static str, Target)>,
    /// (question contains, answer — empty for not known, cited memories)
    pub answers: Vec<(&'static str, &'static str, Vec<Target>)>,
    pub faults: VecDeque<Fault>,
    pub calls: usize,
}

#[derive(Clone, Copy, Debug)]
pub enum Target {
    /// The alias of the shown fact containing this text.
    Shown(&'static str),
    /// Exactly this string, shown or not.
    Raw(&'static str),
}

pub type SharedScript = Arc<Mutex<Script>>;

/// The alias of the shown memory (`m1 [time]: text`) containing `text`.
fn memory_alias(prompt: &str, text: &str) -> Option<String> {
    prompt
        .lines()
        .filter_map(|line| line.split_once("]: "))
        .find(|(_, memory)| memory.contains(text))
        .and_then(|(head, _)| head.split_whitespace().next())
        .map(str::to_owned)
}

fn answer(script: &mut Script, prompt: &str) -> Value {
    if let Some(question) = prompt.strip_prefix("Question: ") {
        let question = question.lines().next().unwrap_or_default();
        let Some((_, said, cited)) = script
            .answers
            .iter()
            .find(|(needle, _, _)| question.contains(needle))
        else {
            return json!({ "answer": "", "known": false, "citations": [] });
        };
        let citations: Vec<Value> = cited
            .iter()
            .filter_map(|target| match target {
                Target::Raw(raw) => Some(json!(raw)),
                Target::Shown(text) => memory_alias(prompt, text).map(Value::from),
            })
            .collect();
        return json!({ "answer": said, "known": !said.is_empty(), "citations": citations });
    }
    if let Some(candidate) = prompt.strip_prefix("Candidate: ") {
        let candidate = candidate.lines().next().unwrap_or_default();
        let rule = script
            .judge
            .iter()
            .find(|(needle, _, _)| candidate.contains(needle));
        let Some((_, verdict, target)) = rule else {
            return json!({ "verdict": "NEW", "target": null, "reason": "scripted: unrelated" });
        };
        let target = match target {
            Target::Raw(raw) => json!(raw),
            Target::Shown(text) => prompt
                .lines()
                .filter_map(|line| line.split_once(": "))
                .find(|(alias, fact)| alias.starts_with('m') && fact.contains(text))
                .map_or(Value::Null, |(alias, _)| json!(alias)),
        };
        return json!({ "verdict": verdict, "target": target, "reason": "scripted verdict" });
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
        for (message, extracted) in &script.extract {
            if *message == text {
                for (fact, kind, hours) in extracted {
                    facts.push(json!({
                        "text": fact, "fact_type": kind, "confidence": 0.9,
                        "expires_in_hours": hours, "valid_from": null, "valid_to": null,
                        "source_episode_ids": [id], "span": text
                    }));
                }
            }
        }
    }
    json!({ "facts": facts, "playbooks": [] })
}

/// Starts the fake on loopback; returns its base URL.
pub async fn fake_llm(script: SharedScript) -> String {
    let server = actix_web::HttpServer::new(move || {
        let script = Arc::clone(&script);
        actix_web::App::new().default_service(web::to(move |request: actix_web::HttpRequest, body: web::Json<Value>| {
            let script = Arc::clone(&script);
            async move {
                let anthropic = request.path().ends_with("/messages");
                let (fault, reply) = {
                    let mut script = script.lock().expect("script lock");
                    script.calls += 1;
                    let prompt = if anthropic {
                        body["messages"][0]["content"].as_str().unwrap_or_default().to_owned()
                    } else {
                        body["messages"][1]["content"].as_str().unwrap_or_default().to_owned()
                    };
                    let fault = script.faults.pop_front();
                    (fault, answer(&mut script, &prompt))
                };
                let mut content = reply.to_string();
                match fault {
                    Some(Fault::Sleep(duration)) => tokio::time::sleep(duration).await,
                    Some(Fault::Status(status, retry_after)) => {
                        let mut response = actix_web::HttpResponse::build(
                            actix_web::http::StatusCode::from_u16(status).expect("status"),
                        );
                        if let Some(seconds) = retry_after {
                            response.insert_header(("retry-after", seconds));
                        }
                        return response.json(json!({ "error": { "message": "scripted failure" } }));
                    }
                    Some(Fault::Malformed) => content = "Sure! Here are the facts: facts = [oops".to_owned(),
                    Some(Fault::Refusal) => {
                        return actix_web::HttpResponse::Ok().json(if anthropic {
                            json!({ "stop_reason": "refusal", "content": [], "usage": { "input_tokens": 5, "output_tokens": 0 } })
                        } else {
                            json!({ "choices": [{ "message": { "role": "assistant", "content": null,
                                "refusal": "I can't help with that." } }], "usage": { "prompt_tokens": 5, "completion_tokens": 0 } })
                        });
                    }
                    None => {}
                }
                let usage_in = body.to_string().len() as u64 / 4;
                actix_web::HttpResponse::Ok().json(if anthropic {
                    let input: Value = serde_json::from_str(&content).unwrap_or(Value::String(content.clone()));
                    if input.is_object() {
                        json!({ "stop_reason": "tool_use", "content": [{ "type": "tool_use", "id": "t1",
                            "name": "record", "input": input }],
                            "usage": { "input_tokens": usage_in, "output_tokens": 40 } })
                    } else {
                        json!({ "stop_reason": "end_turn", "content": [{ "type": "text", "text": content }],
                            "usage": { "input_tokens": usage_in, "output_tokens": 40 } })
                    }
                } else {
                    json!({ "choices": [{ "message": { "role": "assistant", "content": content } }],
                        "usage": { "prompt_tokens": usage_in, "completion_tokens": 40 } })
                })
            }
        }))
    })
    .workers(1)
    .bind(("127.0.0.1", 0))
    .expect("bind");
    let address = server.addrs()[0];
    actix_web::rt::spawn(server.run());
    format!("http://{address}")
}

fn sneaker_script() -> Script {
    Script {
        extract: vec![
            (
                "I love Adidas sneakers",
                vec![("The user loves Adidas sneakers.", "preference", None)],
            ),
            (
                "My Adidas broke after a month",
                vec![("The user's Adidas sneakers broke after a month.", "event", None)],
            ),
            (
                "I'm switching to Puma",
                vec![("The user is switching to Puma sneakers.", "preference", None)],
            ),
        ],
        judge: vec![
            ("broke after a month", "EXTENDS", Target::Shown("loves Adidas")),
            ("switching to Puma", "UPDATES", Target::Shown("loves Adidas")),
        ],
        ..Script::default()
    }
}

fn llm_config(config: &mut cairn_server::config::Config, kind: &str, url: String) {
    config.llm_kind = Some(kind.to_owned());
    config.llm_base_url = Some(url);
    config.llm_model = Some("scripted".to_owned());
    config.llm_api_key = Some("fake-key".to_owned());
    config.llm_retry_backoff_ms = 10;
    config.llm_max_retries = 2;
    config.llm_input_price_per_mtok = 1.0;
    config.llm_output_price_per_mtok = 2.0;
}

macro_rules! ingest {
    ($service:expr, $bearer:expr, $user:expr, $($messages:tt)+) => {{
        let (status, body, _) = call(
            $service,
            Method::POST,
            &format!("/v1/users/{}/episodes", $user),
            Some($bearer),
            Some(json!({ "messages": json!($($messages)+), "consolidate": "sync" })),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        body
    }};
}

/// The `items` of a listing route, asserting it answered 200.
macro_rules! items {
    ($service:expr, $bearer:expr, $path:expr) => {{
        let (status, body, _) = call($service, Method::GET, $path, Some($bearer), None).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body["items"].as_array().cloned().unwrap_or_default()
    }};
}

/// The answer route's body for `$user`'s question, asserting it answered 200.
macro_rules! answer {
    ($service:expr, $bearer:expr, $user:expr, $query:expr) => {{
        let (status, body, _) = call(
            $service,
            Method::POST,
            &format!("/v1/users/{}/answer", $user),
            Some($bearer),
            Some(json!({ "query": $query })),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body
    }};
}

macro_rules! facts {
    ($service:expr, $bearer:expr, $user:expr) => {
        items!(
            $service,
            $bearer,
            &format!("/v1/users/{}/facts?status=all&limit=100", $user)
        )
    };
}

macro_rules! decisions {
    ($service:expr, $bearer:expr, $user:expr) => {
        items!(
            $service,
            $bearer,
            &format!("/v1/users/{}/decisions?limit=100", $user)
        )
    };
}

/// The user's facts once the background worker has written some, or as many as asked
/// (by default polls for up to 30 s: the worker's retries back off, and tests run side
/// by side on few cores).
macro_rules! facts_eventually {
    ($service:expr, $bearer:expr, $user:expr) => {
        facts_eventually!($service, $bearer, $user, 1, 600)
    };
    // Polls every 50 ms, at most `$polls` times, until `$at_least` facts are there.
    ($service:expr, $bearer:expr, $user:expr, $at_least:expr, $polls:expr) => {{
        let mut found = Vec::new();
        for _ in 0..$polls {
            found = facts!($service, $bearer, $user);
            if found.len() >= $at_least {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        found
    }};
}

/// Ingests one user message per text, with the given consolidation mode, and asserts
/// the episodes were stored.
macro_rules! ingest_said {
    ($service:expr, $bearer:expr, $user:expr, $texts:expr, $mode:expr) => {{
        let messages: Vec<Value> = $texts
            .iter()
            .map(|text| json!({ "role": "user", "content": text }))
            .collect();
        let (status, body, _) = call(
            $service,
            Method::POST,
            &format!("/v1/users/{}/episodes", $user),
            Some($bearer),
            Some(json!({ "messages": messages, "consolidate": $mode })),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }};
}

/// "I love <place>" for each place.
fn loves(places: &[&str]) -> Vec<String> {
    places.iter().map(|place| format!("I love {place}")).collect()
}

fn status_of<'a>(facts: &'a [Value], needle: &str) -> Vec<&'a str> {
    facts
        .iter()
        .filter(|fact| fact["text"].as_str().unwrap_or_default().contains(needle))
        .map(|fact| fact["status"].as_str().unwrap_or_default())
        .collect()
}

async fn sneaker_sequence(llm: Option<(&str, SharedScript)>) {
    let url = match &llm {
        Some((_, script)) => Some(fake_llm(Arc::clone(script)).await),
        None => None,
    };
    let kind = llm.as_ref().map(|(kind, _)| (*kind).to_owned());
    let harness = harness_with(move |config| {
        if let (Some(kind), Some(url)) = (kind, url) {
            llm_config(config, &kind, url);
        }
    })
    .await;
    let service = &harness.service;
    let owner = token("acme", ALL);
    for said in [
        "I love Adidas sneakers",
        "My Adidas broke after a month",
        "I'm switching to Puma",
    ] {
        let body = ingest!(service, &owner, "sam", [{ "role": "user", "content": said }]);
        assert_eq!(body["consolidation"]["ran"], true, "{body}");
    }
    let facts = facts!(service, &owner, "sam");
    assert_eq!(status_of(&facts, "loves Adidas"), ["superseded"], "{facts:#?}");
    assert_eq!(status_of(&facts, "Puma"), ["active"], "{facts:#?}");
    assert_eq!(
        status_of(&facts, "broke"),
        ["active"],
        "an event extends, it does not retire"
    );

    let (status, body, _) = call(
        service,
        Method::POST,
        "/v1/users/sam/recall",
        Some(&owner),
        Some(json!({ "query": "what sneakers should I buy", "k": 3, "tiers": ["semantic"] })),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let hits = body["hits"].as_array().expect("hits");
    assert!(
        hits.iter()
            .all(|hit| hit["status"] == "active"
                && !hit["text"].as_str().unwrap_or("").contains("loves Adidas")),
        "no stale fact in the top 3: {hits:#?}"
    );
    assert!(
        hits.iter()
            .any(|hit| hit["text"].as_str().unwrap_or("").contains("Puma")),
        "{hits:#?}"
    );

    let decisions = decisions!(service, &owner, "sam");
    let kinds: Vec<&str> = decisions
        .iter()
        .filter_map(|decision| decision["kind"].as_str())
        .collect();
    assert!(
        kinds.contains(&"UPDATES") && kinds.contains(&"EXTENDS") && kinds.contains(&"NEW"),
        "{kinds:?}"
    );
}

#[actix_web::test]
async fn the_sneaker_sequence_ends_with_puma_current_offline() {
    sneaker_sequence(None).await;
}

#[actix_web::test]
async fn the_sneaker_sequence_ends_with_puma_current_with_a_scripted_openai_provider() {
    let script = Arc::new(Mutex::new(sneaker_script()));
    sneaker_sequence(Some(("openai", Arc::clone(&script)))).await;
    assert!(
        script.lock().expect("lock").calls >= 5,
        "3 extractions and 2 judgements at least"
    );
}

#[actix_web::test]
async fn the_sneaker_sequence_ends_with_puma_current_with_a_scripted_anthropic_provider() {
    let script = Arc::new(Mutex::new(sneaker_script()));
    sneaker_sequence(Some(("anthropic", Arc::clone(&script)))).await;
}

#[actix_web::test]
async fn with_a_scripted_provider_answers_cite_only_what_was_shown() {
    let mut script = sneaker_script();
    script.answers = vec![
        // Cites the Puma fact, and an alias it was never shown (dropped).
        (
            "sneakers",
            "You switched to Puma.",
            vec![Target::Shown("Puma"), Target::Raw("m42")],
        ),
        // An answer whose only citation was never shown is not supported.
        ("guitar", "A Fender, probably.", vec![Target::Raw("m42")]),
        ("birthday", "", vec![]),
    ];
    let script = Arc::new(Mutex::new(script));
    let url = fake_llm(Arc::clone(&script)).await;
    let harness = harness_with(move |config| llm_config(config, "openai", url)).await;
    let service = &harness.service;
    let owner = token("acme", ALL);
    for said in ["I love Adidas sneakers", "I'm switching to Puma"] {
        ingest!(service, &owner, "sam", [{ "role": "user", "content": said }]);
    }
    let puma = facts!(service, &owner, "sam")
        .into_iter()
        .find(|fact| fact["text"].as_str().is_some_and(|text| text.contains("Puma")))
        .expect("the Puma fact");
    let calls = script.lock().expect("lock").calls;
    let sneakers = answer!(service, &owner, "sam", "Which sneakers do I wear?");
    assert_eq!(sneakers["known"], true, "{sneakers}");
    assert_eq!(sneakers["answer"], "You switched to Puma.");
    assert_eq!(
        sneakers["citations"],
        json!([puma["id"]]),
        "only the shown memory is cited"
    );
    assert_eq!(
        script.lock().expect("lock").calls,
        calls + 1,
        "one provider call per answer"
    );
    let guitar = answer!(service, &owner, "sam", "Which guitar do I play?");
    assert_eq!(guitar, json!({ "answer": "", "known": false, "citations": [] }));
    let birthday = answer!(service, &owner, "sam", "When is my birthday?");
    assert_eq!(birthday["known"], false, "{birthday}");
}

/// Offline, a question about someone the memories do not name is not known, however
/// close in meaning they are; the same question about the user is, and so is the
/// question by the user's own name once they have said it.
#[actix_web::test]
async fn offline_answers_about_someone_else_are_not_known() {
    let harness = harness_with(|_| ()).await;
    let service = &harness.service;
    let owner = token("acme", ALL);
    for user in ["kim", "mel"] {
        ingest!(service, &owner, user, [{ "role": "user",
            "content": "Thanks, Melanie! I painted a watercolour of the sunset over the lake" }]);
    }
    let mine = answer!(service, &owner, "kim", "What did I paint of the lake at sunset?");
    assert_eq!(mine["known"], true, "{mine}");
    assert!(
        mine["answer"]
            .as_str()
            .is_some_and(|text| text.contains("watercolour")),
        "{mine}"
    );
    // "Melanie" is only addressed, not spoken of: nothing says what she painted.
    let hers = answer!(
        service,
        &owner,
        "kim",
        "What did Melanie paint of the lake at sunset?"
    );
    assert_eq!(hers, json!({ "answer": "", "known": false, "citations": [] }));

    ingest!(service, &owner, "mel", [{ "role": "user", "content": "My name is Melanie" }]);
    let own = answer!(
        service,
        &owner,
        "mel",
        "What did Melanie paint of the lake at sunset?"
    );
    assert_eq!(own["known"], true, "{own}");
    assert!(
        own["answer"]
            .as_str()
            .is_some_and(|text| text.contains("watercolour")),
        "{own}"
    );
}

#[actix_web::test]
async fn what_only_the_assistant_said_is_not_remembered() {
    let script = Arc::new(Mutex::new(Script {
        extract: vec![
            // A model that wrongly attributes the assistant's suggestion to the user.
            (
                "ok thanks",
                vec![(
                    "The user plans to buy the Nimbus 25 running shoes.",
                    "preference",
                    None,
                )],
            ),
            (
                "I bought the Nimbus 25",
                vec![("The user bought the Nimbus 25.", "event", None)],
            ),
        ],
        ..Script::default()
    }));
    let url = fake_llm(Arc::clone(&script)).await;
    let harness = harness_with(move |config| llm_config(config, "openai", url)).await;
    let service = &harness.service;
    let owner = token("acme", ALL);
    let body = ingest!(
        service,
        &owner,
        "kim",
        [
            { "role": "assistant", "content": "For long runs, try the Nimbus 25." },
            { "role": "user", "content": "ok thanks" }
        ]
    );
    let decisions = body["consolidation"]["run"]["decisions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        decisions
            .iter()
            .any(|decision| decision["kind"] == "DROPPED_UNGROUNDED"
                && decision["reason"].as_str().unwrap_or("").contains("nimbus")),
        "{body}"
    );
    assert!(
        facts!(service, &owner, "kim").is_empty(),
        "no fact mentions Nimbus"
    );

    ingest!(service, &owner, "kim", [{ "role": "user", "content": "I bought the Nimbus 25" }]);
    let facts = facts!(service, &owner, "kim");
    assert_eq!(status_of(&facts, "Nimbus 25"), ["active"], "{facts:#?}");

    // Offline, the same conversation yields nothing about Nimbus either: the assistant
    // text is never read by the offline extractor.
    let offline = harness_with(|_| {}).await;
    ingest!(
        &offline.service,
        &owner,
        "kim",
        [
            { "role": "assistant", "content": "For long runs, try the Nimbus 25." },
            { "role": "user", "content": "ok thanks" }
        ]
    );
    assert!(facts!(&offline.service, &owner, "kim").is_empty());
}

/// A service on another embedding model than the reference still compares statements
/// with the reference: e5-small-v2 puts "name is Bob" and "name is Robert" above the
/// tombstone gate's bar on any common scale, which made a new name lift the retracted
/// one and bring it back.
#[actix_web::test]
async fn another_embedding_model_compares_statements_by_the_reference() {
    let harness = harness_with(|config| config.embedding_model = "e5-small-v2".into()).await;
    let service = &harness.service;
    let owner = token("acme", ALL);
    ingest!(service, &owner, "rob", [{ "role": "user", "content": "My name is Bob" }]);
    let facts = facts!(service, &owner, "rob");
    assert_eq!(status_of(&facts, "Bob"), ["active"], "{facts:#?}");
    let id = facts[0]["id"].as_str().expect("id").to_owned();
    let (status, body, _) = call(
        service,
        Method::POST,
        &format!("/v1/users/rob/facts/{id}/retract"),
        Some(&owner),
        Some(json!({ "reason": "that was a joke" })),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");

    let body = ingest!(service, &owner, "rob", [{ "role": "user", "content": "My name is Robert" }]);
    let kinds: Vec<&str> = body["consolidation"]["run"]["decisions"]
        .as_array()
        .expect("decisions")
        .iter()
        .filter_map(|d| d["kind"].as_str())
        .collect();
    assert_eq!(kinds, ["NEW"], "{body}");
    let facts = facts!(service, &owner, "rob");
    assert_eq!(status_of(&facts, "Bob"), ["retracted"], "{facts:#?}");
    assert_eq!(status_of(&facts, "Robert"), ["active"], "{facts:#?}");
}

#[actix_web::test]
async fn a_retracted_fact_stays_retracted_when_old_episodes_are_re_read() {
    let harness = harness_with(|_| {}).await;
    let service = &harness.service;
    let owner = token("acme", ALL);
    ingest!(service, &owner, "lee", [{ "role": "user", "content": "I am allergic to cats" }]);
    let facts = facts!(service, &owner, "lee");
    assert_eq!(facts.len(), 1, "{facts:#?}");
    let id = facts[0]["id"].as_str().expect("id").to_owned();
    let (status, body, _) = call(
        service,
        Method::POST,
        &format!("/v1/users/lee/facts/{id}/retract"),
        Some(&owner),
        Some(json!({ "reason": "the user was joking" })),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");

    let (status, body, _) = call(
        service,
        Method::POST,
        "/v1/users/lee/consolidate",
        Some(&owner),
        Some(json!({ "from_start": true })),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["episodes_read"], 1, "{body}");
    let kinds: Vec<&str> = body["decisions"]
        .as_array()
        .expect("decisions")
        .iter()
        .filter_map(|d| d["kind"].as_str())
        .collect();
    assert_eq!(kinds, ["BLOCKED_BY_TOMBSTONE"], "{body}");
    let facts = facts!(service, &owner, "lee");
    assert_eq!(
        status_of(&facts, "allergic"),
        ["retracted"],
        "not re-created: {facts:#?}"
    );

    // The user says it again, first-hand and later than the tombstone: it comes back.
    let body = ingest!(service, &owner, "lee", [{ "role": "user", "content": "I'm allergic to cats" }]);
    let kinds: Vec<&str> = body["consolidation"]["run"]["decisions"]
        .as_array()
        .expect("decisions")
        .iter()
        .filter_map(|d| d["kind"].as_str())
        .collect();
    assert!(
        kinds.contains(&"TOMBSTONE_LIFTED") && kinds.contains(&"NEW"),
        "{kinds:?}"
    );
    let facts = facts!(service, &owner, "lee");
    let mut statuses = status_of(&facts, "allergic");
    statuses.sort_unstable();
    assert_eq!(statuses, ["active", "retracted"], "{facts:#?}");
}

#[actix_web::test]
async fn a_judge_naming_anything_it_was_not_shown_changes_nothing_elsewhere() {
    let harness_script = Arc::new(Mutex::new(Script::default()));
    let url = fake_llm(Arc::clone(&harness_script)).await;
    let harness = harness_with(move |config| llm_config(config, "openai", url)).await;
    let service = &harness.service;
    let owner = token("acme", ALL);
    // Another scope's fact, with a known id.
    let (status, other, _) = call(
        service,
        Method::POST,
        "/v1/users/other/facts",
        Some(&owner),
        Some(json!({ "text": "The user lives in Oslo." })),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{other}");
    let foreign_id: &'static str = Box::leak(
        other["fact"]["id"]
            .as_str()
            .expect("id")
            .to_owned()
            .into_boxed_str(),
    );
    let (status, _, _) = call(
        service,
        Method::POST,
        "/v1/users/ana/facts",
        Some(&owner),
        Some(json!({ "text": "The user lives in Rome." })),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    {
        let mut script = harness_script.lock().expect("lock");
        script.extract = vec![
            (
                "I live in Madrid now",
                vec![("The user lives in Madrid.", "identity", None)],
            ),
            (
                "I work at Acme",
                vec![("The user works at Acme.", "identity", None)],
            ),
        ];
        script.judge = vec![
            ("Madrid", "UPDATES", Target::Raw(foreign_id)),
            ("Acme", "UPDATES", Target::Raw("m7")),
        ];
    }
    let body = ingest!(
        service,
        &owner,
        "ana",
        [{ "role": "user", "content": "I live in Madrid now" }, { "role": "user", "content": "I work at Acme" }]
    );
    let decisions = body["consolidation"]["run"]["decisions"]
        .as_array()
        .cloned()
        .expect("decisions");
    assert_eq!(decisions.len(), 2, "{body}");
    assert!(
        decisions.iter().all(|decision| decision["kind"] == "NEW"),
        "{decisions:#?}"
    );
    assert!(
        decisions
            .iter()
            .all(|decision| decision["reason"].as_str().unwrap_or("").contains("not shown"))
    );
    let other_facts = facts!(service, &owner, "other");
    assert_eq!(
        status_of(&other_facts, "Oslo"),
        ["active"],
        "the other scope's fact is untouched"
    );
    let facts = facts!(service, &owner, "ana");
    assert_eq!(
        status_of(&facts, "Rome"),
        ["active"],
        "nothing retired on a bad alias"
    );
}

#[actix_web::test]
async fn a_time_bound_fact_expires() {
    let harness = harness_with(|_| {}).await;
    let service = &harness.service;
    let owner = token("acme", ALL);
    ingest!(service, &owner, "eve", [{ "role": "user", "content": "I have an exam tomorrow" }]);
    let recall = |hours: i64| {
        let as_of = (chrono::Utc::now() + chrono::Duration::hours(hours)).to_rfc3339();
        json!({ "query": "exam", "tiers": ["semantic"], "as_of": as_of })
    };
    let (_, soon, _) = call(
        service,
        Method::POST,
        "/v1/users/eve/recall",
        Some(&owner),
        Some(recall(1)),
    )
    .await;
    assert!(
        soon["hits"]
            .as_array()
            .expect("hits")
            .iter()
            .any(|hit| hit["text"].as_str().unwrap_or("").contains("exam")),
        "{soon}"
    );
    let (_, later, _) = call(
        service,
        Method::POST,
        "/v1/users/eve/recall",
        Some(&owner),
        Some(recall(72)),
    )
    .await;
    assert!(later["hits"].as_array().expect("hits").is_empty(), "{later}");
}

#[actix_web::test]
async fn a_dry_run_writes_nothing() {
    let harness = harness_with(|_| {}).await;
    let service = &harness.service;
    let owner = token("acme", ALL);
    let (status, body, _) = call(
        service,
        Method::POST,
        "/v1/users/max/episodes",
        Some(&owner),
        Some(json!({ "messages": [{ "role": "user", "content": "I moved to Lisbon" }], "consolidate": "none" })),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let dry = json!({ "dry_run": true });
    let (status, body, _) = call(
        service,
        Method::POST,
        "/v1/users/max/consolidate",
        Some(&owner),
        Some(dry),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["dry_run"], true);
    assert_eq!(body["decisions"][0]["kind"], "NEW", "{body}");
    assert!(
        facts!(service, &owner, "max").is_empty(),
        "a dry run writes nothing"
    );
    assert!(decisions!(service, &owner, "max").is_empty(), "nor any decision");
    let (_, body, _) = call(
        service,
        Method::POST,
        "/v1/users/max/consolidate",
        Some(&owner),
        None,
    )
    .await;
    assert_eq!(
        body["facts_created"][0]["text"], "The user moved to Lisbon.",
        "{body}"
    );
    let (_, again, _) = call(
        service,
        Method::POST,
        "/v1/users/max/consolidate",
        Some(&owner),
        None,
    )
    .await;
    assert_eq!(again["episodes_read"], 0, "the watermark moved: {again}");
    assert_eq!(facts!(service, &owner, "max").len(), 1);
}

/// Erasure wins over a consolidation run in progress: the run's extraction is held up
/// by the provider, the erasure arrives meanwhile, and after the receipt nothing derived
/// from the erased episodes exists or appears.
#[actix_web::test]
async fn erasure_during_a_consolidation_run_leaves_nothing_behind() {
    let said: Vec<&'static str> = (0..20)
        .map(|index| &*Box::leak(format!("I collect stamps from country number {index}").into_boxed_str()))
        .collect();
    let script = Arc::new(Mutex::new(Script {
        extract: said
            .iter()
            .map(|message| (*message, vec![(*message, "preference", None)]))
            .collect(),
        ..Script::default()
    }));
    let url = fake_llm(Arc::clone(&script)).await;
    let harness = harness_with(move |config| llm_config(config, "openai", url)).await;
    let service = &harness.service;
    let owner = token("acme", ALL);
    ingest_said!(service, &owner, "eve", said, "none");

    script.lock().expect("lock").faults = vec![Fault::Sleep(Duration::from_millis(700))].into();
    let consolidate = call(
        service,
        Method::POST,
        "/v1/users/eve/consolidate",
        Some(&owner),
        None,
    );
    let erase = async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        call(service, Method::DELETE, "/v1/users/eve", Some(&owner), None).await
    };
    let ((run_status, run, _), (erase_status, receipt, _)) = tokio::join!(consolidate, erase);
    assert_eq!(erase_status, StatusCode::OK, "{receipt}");
    assert_eq!(receipt["deleted"]["episodes"], 20, "{receipt}");
    assert_eq!(receipt["deleted"]["facts"], 0, "{receipt}");
    assert_eq!(run_status, StatusCode::CONFLICT, "{run}");
    assert_eq!(run["error"]["code"], "scope_erased", "{run}");

    assert!(
        facts!(service, &owner, "eve").is_empty(),
        "no fact outlives the receipt"
    );
    assert!(decisions!(service, &owner, "eve").is_empty());
    let (status, recall, _) = call(
        service,
        Method::POST,
        "/v1/users/eve/recall",
        Some(&owner),
        Some(json!({ "query": "which stamps does the user collect" })),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{recall}");
    assert_eq!(recall["hits"], json!([]), "{recall}");
    let (status, again, _) = call(
        service,
        Method::POST,
        "/v1/users/eve/consolidate",
        Some(&owner),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["episodes_read"], 0, "{again}");
    assert!(facts!(service, &owner, "eve").is_empty());
}

#[actix_web::test]
async fn provider_failures_keep_episodes_and_retry_later() {
    let script = Arc::new(Mutex::new(Script {
        extract: vec![(
            "I drink oat milk",
            vec![("The user drinks oat milk.", "preference", None)],
        )],
        ..Script::default()
    }));
    let url = fake_llm(Arc::clone(&script)).await;
    let harness = harness_with(move |config| {
        llm_config(config, "openai", url);
        config.llm_timeout_ms = 300;
        config.llm_max_retry_after_ms = 1_000;
    })
    .await;
    let service = &harness.service;
    let owner = token("acme", ALL);
    let message = json!([{ "role": "user", "content": "I drink oat milk" }]);

    // Each failure that outlasts the retries: the ingest is acknowledged, nothing is written.
    let failures = [
        vec![Fault::Status(500, None); 3],
        vec![Fault::Sleep(Duration::from_millis(800)); 3],
        vec![Fault::Malformed, Fault::Malformed],
        vec![Fault::Refusal],
        vec![Fault::Status(429, Some("120")); 3],
    ];
    for (round, faults) in failures.into_iter().enumerate() {
        script.lock().expect("lock").faults = faults.into();
        let body = ingest!(service, &owner, "ola", message.clone());
        assert_eq!(body["consolidation"]["ran"], false, "round {round}: {body}");
        assert!(
            body["consolidation"]["error"].is_string(),
            "round {round}: {body}"
        );
        assert!(body["consolidation"]["job_id"].is_string());
        assert!(
            facts!(service, &owner, "ola").is_empty(),
            "round {round}: nothing half-written"
        );
    }
    let (_, episodes, _) = call(service, Method::GET, "/v1/users/ola/episodes", Some(&owner), None).await;
    assert_eq!(
        episodes["items"].as_array().map(Vec::len),
        Some(5),
        "every episode is stored"
    );

    // Transient trouble within the retry budget: 429 with Retry-After, a 503, then one
    // malformed answer that the corrective retry fixes.
    script.lock().expect("lock").faults = vec![
        Fault::Status(429, Some("0")),
        Fault::Status(503, None),
        Fault::Malformed,
    ]
    .into();
    let (status, body, _) = call(
        service,
        Method::POST,
        "/v1/users/ola/consolidate",
        Some(&owner),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["episodes_read"], 5, "{body}");
    assert!(body["usage"]["llm_calls"].as_u64().unwrap_or(0) >= 2, "{body}");
    assert!(body["usage"]["cost_usd"].as_f64().unwrap_or(0.0) > 0.0, "{body}");
    let facts = facts!(service, &owner, "ola");
    assert_eq!(
        status_of(&facts, "oat milk"),
        ["active"],
        "one fact, the rest duplicates: {facts:#?}"
    );

    let (_, metrics, _) = call(service, Method::GET, "/metrics", None, None).await;
    let metrics = metrics.as_str().unwrap_or_default().to_owned();
    assert!(
        metrics.contains("cairn_llm_tokens_total{direction=\"input\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("cairn_consolidation_decisions_total{kind=\"NEW\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("cairn_consolidation_runs_total{result=\"error\",trigger=\"sync\"} 5"),
        "{metrics}"
    );
}

/// A job that keeps failing is dead-lettered after `CAIRN_CONSOLIDATION_MAX_ATTEMPTS`
/// runs: kept with its error, listed, counted in the metrics and never retried by the
/// worker, until a retry makes it due; then it runs once.
#[actix_web::test]
async fn a_job_failing_too_often_waits_in_the_dead_letters_until_retried() {
    let script = Arc::new(Mutex::new(Script {
        extract: vec![(
            "I restore old clocks",
            vec![("The user restores old clocks.", "preference", None)],
        )],
        // Every call of two job runs fails (each run makes three calls).
        faults: vec![Fault::Status(500, None); 6].into(),
        ..Script::default()
    }));
    let url = fake_llm(Arc::clone(&script)).await;
    let directory = tempfile::tempdir().expect("temp dir");
    let mut configured = config(&directory);
    llm_config(&mut configured, "openai", url);
    configured.consolidation_retry_base_ms = 50;
    configured.consolidation_max_attempts = 2;
    let state = web::Data::new(build_state(&configured).await.expect("state"));
    let worker = spawn_consolidation_worker(state.clone());
    let service = test::init_service(http::app(state)).await;
    let owner = token("acme", ALL);
    let reader = token("acme", "memory:read");
    let (status, body, _) = call(
        &service,
        Method::POST,
        "/v1/users/cal/episodes",
        Some(&owner),
        Some(json!({ "messages": [{ "role": "user", "content": "I restore old clocks" }] })),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let mut dead = Value::Null;
    for _ in 0..100 {
        let jobs = items!(&service, &reader, "/v1/users/cal/jobs");
        if let Some(job) = jobs.iter().find(|job| job["state"] == "dead") {
            dead = job.clone();
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(dead["attempts"], 2, "{dead}");
    assert!(
        dead["last_error"].as_str().is_some_and(|error| !error.is_empty()),
        "{dead}"
    );
    let calls = script.lock().expect("lock").calls;
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        script.lock().expect("lock").calls,
        calls,
        "the worker leaves a dead letter alone"
    );
    assert!(facts!(&service, &owner, "cal").is_empty());
    let (_, metrics, _) = call(&service, Method::GET, "/metrics", None, None).await;
    assert!(
        metrics
            .as_str()
            .unwrap_or_default()
            .contains("cairn_consolidation_dead_letters_total 1"),
        "{metrics}"
    );

    let id = dead["id"].as_str().expect("job id");
    let retry = format!("/v1/users/cal/jobs/{id}/retry");
    let (status, _, _) = call(&service, Method::POST, &retry, Some(&reader), None).await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "retrying needs the write permission"
    );
    let (status, _, _) = call(
        &service,
        Method::POST,
        "/v1/users/cal/jobs/job_unknown/retry",
        Some(&owner),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, body, _) = call(&service, Method::POST, &retry, Some(&owner), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (body["job"]["state"].clone(), body["job"]["attempts"].clone()),
        (json!("queued"), json!(0))
    );
    let found = facts_eventually!(&service, &owner, "cal");
    worker.abort();
    assert_eq!(status_of(&found, "clocks"), ["active"], "{found:#?}");
    assert!(
        items!(&service, &reader, "/v1/users/cal/jobs").is_empty(),
        "the job is done"
    );
    let trail = items!(&service, &owner, "/v1/users/cal/audit?limit=100");
    assert!(
        trail.iter().any(|event| event["action"] == "consolidation.retry"),
        "{trail:#?}"
    );
}

/// A background run stops after its share of batches and queues the rest as a job of
/// its own, so a scope with a long backlog takes turns with the others; the backlog is
/// still consolidated in full, each episode once.
#[actix_web::test]
async fn a_long_backlog_is_consolidated_in_turns() {
    let directory = tempfile::tempdir().expect("temp dir");
    let mut configured = config(&directory);
    configured.consolidation_batch_size = 2;
    configured.consolidation_max_batches_per_run = 2;
    let state = web::Data::new(build_state(&configured).await.expect("state"));
    let service = test::init_service(http::app(state.clone())).await;
    let owner = token("acme", ALL);
    let places = [
        "Lisbon", "Kyoto", "Oslo", "Quito", "Hanoi", "Dakar", "Perth", "Lima", "Riga", "Cusco",
    ];
    ingest_said!(&service, &owner, "kim", loves(&places), "async");
    let worker = spawn_consolidation_worker(state);
    let found = facts_eventually!(&service, &owner, "kim", places.len(), 200);
    worker.abort();
    assert_eq!(
        found.len(),
        places.len(),
        "every episode consolidated once: {found:#?}"
    );
    let trail = items!(&service, &owner, "/v1/users/kim/audit?limit=100");
    let batches: Vec<&Value> = trail
        .iter()
        .filter(|event| event["action"] == "consolidation.run")
        .collect();
    let runs: std::collections::HashSet<&str> = batches
        .iter()
        .filter_map(|event| event["detail"]["run_id"].as_str())
        .collect();
    assert_eq!(
        (batches.len(), runs.len()),
        (5, 3),
        "five batches of two, in runs of at most two batches: {trail:#?}"
    );
    assert!(
        items!(&service, &owner, "/v1/users/kim/jobs").is_empty(),
        "no job left"
    );
}

#[actix_web::test]
async fn the_background_worker_consolidates_queued_ingests() {
    let directory = tempfile::tempdir().expect("temp dir");
    let state = web::Data::new(build_state(&config(&directory)).await.expect("state"));
    let worker = spawn_consolidation_worker(state.clone());
    let service = test::init_service(http::app(state)).await;
    let owner = token("acme", ALL);
    let (status, body, _) = call(
        &service,
        Method::POST,
        "/v1/users/bo/episodes",
        Some(&owner),
        Some(json!({ "messages": [{ "role": "user", "content": "I work at Globex" }] })),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["consolidation"]["requested"], "async");
    assert_eq!(body["consolidation"]["queued"], true, "{body}");
    let found = facts_eventually!(&service, &owner, "bo");
    worker.abort();
    assert_eq!(status_of(&found, "Globex"), ["active"], "{found:#?}");
}

/// The jobs of asynchronous ingests come due after the settle window, and the ingests
/// of a burst are consolidated by one run, which completes every one of their jobs.
#[actix_web::test]
async fn a_burst_of_ingests_is_consolidated_by_one_run() {
    let directory = tempfile::tempdir().expect("temp dir");
    let mut configured = config(&directory);
    configured.consolidation_settle_ms = 1_500;
    let state = web::Data::new(build_state(&configured).await.expect("state"));
    let worker = spawn_consolidation_worker(state.clone());
    let service = test::init_service(http::app(state)).await;
    let owner = token("acme", ALL);
    let places = ["Lisbon", "Kyoto", "Oslo"];
    for said in loves(&places) {
        ingest_said!(&service, &owner, "noa", [said], "async");
    }
    let queued = items!(&service, &owner, "/v1/users/noa/jobs");
    assert_eq!(queued.len(), places.len(), "{queued:#?}");
    for job in &queued {
        let at = |field: &str| {
            chrono::DateTime::parse_from_rfc3339(job[field].as_str().expect("a time")).expect("RFC 3339")
        };
        assert_eq!(
            (at("run_after") - at("created_at")).num_milliseconds(),
            1_500,
            "due one settle window after the ingest: {job:#?}"
        );
    }
    let found = facts_eventually!(&service, &owner, "noa", places.len(), 200);
    worker.abort();
    assert_eq!(found.len(), places.len(), "{found:#?}");
    let runs: Vec<Value> = items!(&service, &owner, "/v1/users/noa/audit?limit=100")
        .into_iter()
        .filter(|event| event["action"] == "consolidation.run")
        .collect();
    assert_eq!(runs.len(), 1, "one run for the burst: {runs:#?}");
    assert!(
        items!(&service, &owner, "/v1/users/noa/jobs").is_empty(),
        "the run completed every job of the burst"
    );
}

#[actix_web::test]
async fn a_failed_job_is_retried_by_the_worker_with_backoff() {
    let script = Arc::new(Mutex::new(Script {
        extract: vec![
            (
                "I collect vinyl records",
                vec![("The user collects vinyl records.", "preference", None)],
            ),
            // One invalid item beside a valid one: the item is refused, the batch is not.
            (
                "I'm a night owl",
                vec![("The user is a night owl.", "opinion", None)],
            ),
        ],
        faults: vec![Fault::Status(500, None); 3].into(),
        ..Script::default()
    }));
    let url = fake_llm(Arc::clone(&script)).await;
    let directory = tempfile::tempdir().expect("temp dir");
    let mut configured = config(&directory);
    llm_config(&mut configured, "openai", url);
    configured.consolidation_retry_base_ms = 100;
    let state = web::Data::new(build_state(&configured).await.expect("state"));
    let worker = spawn_consolidation_worker(state.clone());
    let service = test::init_service(http::app(state)).await;
    let owner = token("acme", ALL);
    let (status, body, _) = call(
        &service,
        Method::POST,
        "/v1/users/vic/episodes",
        Some(&owner),
        Some(json!({ "messages": [
            { "role": "user", "content": "I collect vinyl records" },
            { "role": "user", "content": "I'm a night owl" }
        ] })),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let found = facts_eventually!(&service, &owner, "vic");
    assert_eq!(status_of(&found, "vinyl"), ["active"], "{found:#?}");
    assert_eq!(found.len(), 1, "the invalid item was not written: {found:#?}");
    let decisions = decisions!(&service, &owner, "vic");
    assert!(
        decisions.iter().any(|decision| decision["kind"] == "REFUSED"
            && decision["reason"].as_str().unwrap_or("").contains("fact_type")),
        "{decisions:#?}"
    );
    let calls = script.lock().expect("lock").calls;
    assert!(
        calls >= 4,
        "three failed calls (one job attempt), then a retry that succeeded: {calls}"
    );
    // The worker counts a run once its commit has returned, so the facts can be read a
    // moment before the count moves.
    let succeeded = "cairn_consolidation_runs_total{result=\"ok\",trigger=\"job\"} 1";
    let mut metrics = String::new();
    for _ in 0..300 {
        let (_, body, _) = call(&service, Method::GET, "/metrics", None, None).await;
        metrics = body.as_str().unwrap_or_default().to_owned();
        if metrics.contains(succeeded) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    worker.abort();
    assert!(
        metrics.contains("cairn_consolidation_runs_total{result=\"error\",trigger=\"job\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("cairn_consolidation_runs_total{result=\"ok\",trigger=\"job\"} 1"),
        "{metrics}"
    );
}

#[actix_web::test]
async fn concurrent_runs_of_one_user_never_double_a_batch() {
    let harness = harness_with(|_| {}).await;
    let service = &harness.service;
    let owner = token("acme", ALL);
    let said = [
        "I live in Nantes",
        "I work at Airbus",
        "I'm vegetarian",
        "I love sailing",
    ];
    ingest_said!(service, &owner, "zoe", said, "none");
    let run = || {
        call(
            service,
            Method::POST,
            "/v1/users/zoe/consolidate",
            Some(&owner),
            None,
        )
    };
    let (first, second, third) = futures_util::join!(run(), run(), run());
    let read: Vec<u64> = [first, second, third]
        .iter()
        .map(|(status, body, _)| {
            assert_eq!(*status, StatusCode::OK, "{body}");
            body["episodes_read"].as_u64().unwrap_or(99)
        })
        .collect();
    assert_eq!(
        read.iter().sum::<u64>(),
        4,
        "exactly one run consumed the batch: {read:?}"
    );
    let facts = facts!(service, &owner, "zoe");
    assert_eq!(
        facts.len(),
        4,
        "{facts:#?} {:#?}",
        decisions!(service, &owner, "zoe")
    );
}

/// A worker of this process takes a user's lease on runs while an explicit run of the
/// same user waits for that lease: the explicit run waits for the worker's run and then
/// runs, instead of holding the process's lock against the worker until it gives up
/// (409 after `RUNS_WAIT`, the worker stuck behind it all that time).
#[actix_web::test]
async fn an_explicit_run_waiting_for_the_lease_does_not_hold_up_the_worker() {
    use cairn_core::MemoryStore;
    let harness = harness_with(|config| config.consolidation_settle_ms = 0).await;
    let service = &harness.service;
    let owner = token("acme", ALL);
    ingest_said!(service, &owner, "lea", ["I live in Nantes"], "async");
    // Another process holds the user's runs for now.
    let outside = cairn_store_sqlite::SqliteStore::open_beside_service(harness._directory.path())
        .expect("a second handle on the store");
    let scope = super::scope_of("acme", "lea");
    let at = chrono::Utc::now();
    assert!(
        outside
            .lease_scope_runs(&scope, "outside", at, at + chrono::Duration::seconds(60))
            .await
            .expect("lease")
    );
    let explicit = call(
        service,
        Method::POST,
        "/v1/users/lea/consolidate",
        Some(&owner),
        None,
    );
    let worker = async {
        // The explicit run is waiting for the lease by now; the other process lets go
        // and this process's worker takes the lease at once.
        tokio::time::sleep(Duration::from_millis(600)).await;
        outside
            .release_scope_runs(&scope, "outside")
            .await
            .expect("release");
        loop {
            if let Some(run) = harness.state.cairn.run_due_job().await.expect("run") {
                break run;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let ((status, body, _), run) = futures_util::join!(explicit, worker);
    assert_eq!(
        status,
        StatusCode::OK,
        "the explicit run ran after the worker's: {body}"
    );
    let read = match &run {
        cairn_app::JobRun::Done(outcome) => outcome.episodes_read,
        // The explicit run's poll took the lease first (rarely): the job waits for it.
        cairn_app::JobRun::Deferred => 0,
        other => panic!("the worker ran its job: {other:?}"),
    };
    assert_eq!(
        read as u64 + body["episodes_read"].as_u64().unwrap_or(99),
        1,
        "one run read the episode: {run:?} {body}"
    );
    assert_eq!(facts!(service, &owner, "lea").len(), 1);
}

#[actix_web::test]
async fn a_described_procedure_becomes_a_playbook() {
    let harness = harness_with(|_| {}).await;
    let service = &harness.service;
    let owner = token("acme", ALL);
    let body = ingest!(
        service,
        &owner,
        "pat",
        [{ "role": "user", "content": "When I deploy, I first run the tests, then tag the release, then update the changelog" }]
    );
    assert_eq!(body["consolidation"]["run"]["playbooks_created"], 1, "{body}");
    let (status, playbooks, _) = call(
        service,
        Method::GET,
        "/v1/users/pat/playbooks",
        Some(&owner),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{playbooks}");
    let steps = playbooks["items"][0]["steps"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(steps.len(), 3, "{playbooks}");
}

/// A tenant's LLM token budget: the background run that spends it defers the rest of
/// the backlog to a job due when the UTC day turns, an explicit run is refused with
/// 429 until then, and another tenant's consolidation goes on.
#[actix_web::test]
async fn a_spent_token_budget_defers_background_runs_and_refuses_explicit_ones() {
    let places = ["Lisbon", "Kyoto", "Oslo", "Quito", "Hanoi", "Dakar"];
    let script = Arc::new(Mutex::new(Script {
        extract: vec![
            (
                "I love Lisbon",
                vec![("The user loves Lisbon.", "preference", None)],
            ),
            (
                "I love Kyoto",
                vec![("The user loves Kyoto.", "preference", None)],
            ),
            ("I love Oslo", vec![("The user loves Oslo.", "preference", None)]),
            (
                "I love Quito",
                vec![("The user loves Quito.", "preference", None)],
            ),
            (
                "I love Hanoi",
                vec![("The user loves Hanoi.", "preference", None)],
            ),
            (
                "I love Dakar",
                vec![("The user loves Dakar.", "preference", None)],
            ),
        ],
        ..Script::default()
    }));
    let url = fake_llm(Arc::clone(&script)).await;
    let directory = tempfile::tempdir().expect("temp dir");
    let mut configured = config(&directory);
    llm_config(&mut configured, "openai", url);
    configured.consolidation_batch_size = 2;
    // Less than one batch costs: the first batch runs, then the budget is spent.
    configured.consolidation_token_budget = 50;
    let state = web::Data::new(build_state(&configured).await.expect("state"));
    let service = test::init_service(http::app(state.clone())).await;
    let owner = token("acme", ALL);
    ingest_said!(&service, &owner, "ines", loves(&places), "async");
    let worker = spawn_consolidation_worker(state);
    let mut deferred = Value::Null;
    for _ in 0..200 {
        let jobs = items!(&service, &owner, "/v1/users/ines/jobs");
        if let Some(job) = jobs.iter().find(|job| {
            job["run_after"]
                .as_str()
                .and_then(|at| chrono::DateTime::parse_from_rfc3339(at).ok())
                .is_some_and(|at| at > chrono::Utc::now() + chrono::Duration::seconds(5))
        }) {
            deferred = job.clone();
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let tomorrow = (chrono::Utc::now().date_naive() + chrono::Duration::days(1))
        .and_hms_opt(0, 0, 0)
        .expect("midnight")
        .and_utc();
    let due = deferred["run_after"]
        .as_str()
        .and_then(|at| chrono::DateTime::parse_from_rfc3339(at).ok())
        .expect("a deferred job");
    assert_eq!(due, tomorrow, "{deferred}");
    let found = facts!(&service, &owner, "ines");
    assert_eq!(
        found.len(),
        2,
        "one batch of two, then the budget was spent: {found:#?}"
    );
    let trail = items!(&service, &owner, "/v1/users/ines/audit?limit=100");
    assert!(
        trail
            .iter()
            .any(|event| event["action"] == "consolidation.deferred"),
        "{trail:#?}"
    );
    let (_, metrics, _) = call(&service, Method::GET, "/metrics", None, None).await;
    assert!(
        metrics
            .as_str()
            .unwrap_or_default()
            .contains(r#"cairn_consolidation_runs_total{result="deferred",trigger="job"} 1"#),
        "{metrics}"
    );

    let calls = script.lock().expect("lock").calls;
    let request = test::TestRequest::post()
        .uri("/v1/users/ines/consolidate")
        .insert_header(("authorization", format!("Bearer {owner}")))
        .set_json(json!({}))
        .to_request();
    let refused = test::call_service(&service, request).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry_after: i64 = refused
        .headers()
        .get("retry-after")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse().ok())
        .expect("Retry-After");
    assert!((1..=86_400).contains(&retry_after), "{retry_after}");
    let body: Value = test::read_body_json(refused).await;
    assert_eq!(body["error"]["code"], "token_budget_exhausted", "{body}");
    assert_eq!(
        script.lock().expect("lock").calls,
        calls,
        "no LLM call once spent"
    );

    // Another tenant has its own budget.
    let other = token("globex", ALL);
    let body = ingest!(&service, &other, "ines", [{ "role": "user", "content": "I love Quito" }]);
    assert_eq!(
        body["consolidation"]["run"]["token_budget"]["tokens_per_day"], 50,
        "the budget is reported: {body}"
    );
    worker.abort();
    assert_eq!(facts!(&service, &other, "ines").len(), 1);
}

/// On a search cluster the tenant's token budget is counted in the store: what a run on
/// one replica spent refuses an explicit run on another, and on a replica started
/// afterwards (a rolling update hands out no fresh budget).
#[actix_web::test]
async fn replicas_on_a_cluster_share_one_token_budget_that_survives_a_restart() {
    use cairn_server::config::Backend;
    for (variable, backend) in [
        ("CAIRN_TEST_OPENSEARCH_URL", Backend::Opensearch),
        ("CAIRN_TEST_ELASTICSEARCH_URL", Backend::Elasticsearch),
    ] {
        let Some(url) = super::test_cluster(variable) else {
            eprintln!("skipped on {backend:?}: {variable} is not set");
            continue;
        };
        let script = Arc::new(Mutex::new(Script {
            extract: vec![(
                "I love Lisbon",
                vec![("The user loves Lisbon.", "preference", None)],
            )],
            ..Script::default()
        }));
        let llm = fake_llm(Arc::clone(&script)).await;
        let prefix = format!("cairn-api-{}", uuid::Uuid::now_v7().simple());
        let replica = || {
            harness_with(|config| {
                config.backend = backend;
                config.cluster_url = Some(url.clone());
                config.index_prefix = prefix.clone();
                // Less than one batch costs.
                config.consolidation_token_budget = 50;
                llm_config(config, "openai", llm.clone());
            })
        };
        let (first, second) = (replica().await, replica().await);
        for harness in [&first, &second] {
            until_ready(&harness.service, &format!("{backend:?}: the replica")).await;
        }
        let owner = token("acme", ALL);
        let body = ingest!(&first.service, &owner, "lea", [{ "role": "user", "content": "I love Lisbon" }]);
        let used = body["consolidation"]["run"]["token_budget"]["used_today"]
            .as_u64()
            .unwrap_or(0);
        assert!(used >= 50, "{backend:?}: the run spent the budget: {body}");
        let calls = script.lock().expect("script").calls;
        let refused = |service| {
            let owner = owner.clone();
            async move {
                let (status, body, _) = call(
                    service,
                    Method::POST,
                    "/v1/users/lea/consolidate",
                    Some(&owner),
                    Some(json!({})),
                )
                .await;
                (
                    status,
                    body["error"]["code"].as_str().unwrap_or_default().to_owned(),
                )
            }
        };
        assert_eq!(
            refused(&second.service).await,
            (StatusCode::TOO_MANY_REQUESTS, "token_budget_exhausted".to_owned()),
            "{backend:?}: the other replica knows the budget is spent"
        );
        let restarted = replica().await;
        until_ready(&restarted.service, &format!("{backend:?}: the restarted replica")).await;
        assert_eq!(
            refused(&restarted.service).await,
            (StatusCode::TOO_MANY_REQUESTS, "token_budget_exhausted".to_owned()),
            "{backend:?}: a restart hands out no fresh budget"
        );
        assert_eq!(
            script.lock().expect("script").calls,
            calls,
            "{backend:?}: no LLM call once spent"
        );
        drop_indices(&url, &prefix).await;
    }
}

/// Two current facts in one single-valued slot (written explicitly, so no judge compared
/// them): recall ranks the later statement first and marks the earlier one as possibly
/// outdated; two values of an attribute that holds several ("also allergic to
/// shellfish") are no conflict.
#[actix_web::test]
async fn recall_marks_the_earlier_of_two_values_in_one_slot() {
    let harness = harness_with(|_| ()).await;
    let service = &harness.service;
    let bearer = token("acme", ALL);
    let recall = |user: &'static str, query: &'static str| {
        let bearer = bearer.clone();
        async move {
            let (status, body, _) = call(
                service,
                Method::POST,
                &format!("/v1/users/{user}/recall"),
                Some(&bearer),
                Some(json!({ "query": query, "k": 5, "tiers": ["semantic"], "explain": true })),
            )
            .await;
            assert_eq!(status, StatusCode::OK, "{body}");
            body["hits"].as_array().cloned().unwrap_or_default()
        }
    };
    // Consolidation sees this change ("since my last cigarette" in the smoking slot)...
    ingest!(service, &bearer, "u0", [{ "role": "user", "content": "I smoke about ten cigarettes a day",
        "timestamp": "2026-01-05T09:00:00Z" }]);
    ingest!(service, &bearer, "u0", [{ "role": "user", "content": "It's been a month since my last cigarette",
        "timestamp": "2026-03-05T09:00:00Z" }]);
    let current = items!(service, &bearer, "/v1/users/u0/facts?status=active");
    assert_eq!(current.len(), 1, "{current:#?}");
    assert!(
        current[0]["text"]
            .as_str()
            .is_some_and(|text| text.contains("last cigarette")),
        "{current:#?}"
    );
    // ...and explicit writes, which no judge compares, leave both current: recall ranks them.
    for (text, valid_from) in [
        (
            "The user smokes about ten cigarettes a day.",
            "2026-01-05T09:00:00Z",
        ),
        (
            "It has been a month since the user's last cigarette.",
            "2026-03-05T09:00:00Z",
        ),
    ] {
        let (status, body, _) = call(
            service,
            Method::POST,
            "/v1/users/u1/facts",
            Some(&bearer),
            Some(json!({ "text": text, "valid_from": valid_from })),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    let hits = recall("u1", "does the user smoke").await;
    let position = |needle: &str| {
        hits.iter()
            .position(|hit| hit["text"].as_str().is_some_and(|text| text.contains(needle)))
    };
    let (Some(earlier), Some(later)) = (position("ten cigarettes"), position("last cigarette")) else {
        panic!("both statements are current facts: {hits:#?}");
    };
    assert!(later < earlier, "{hits:#?}");
    assert_eq!(
        hits[earlier]["explain"]["possibly_outdated_by"], hits[later]["id"],
        "{hits:#?}"
    );
    assert!(
        hits[later]["explain"]["possibly_outdated_by"].is_null(),
        "{hits:#?}"
    );

    ingest!(service, &bearer, "u2", [{ "role": "user", "content": "I am allergic to peanuts",
        "timestamp": "2026-01-05T09:00:00Z" }]);
    ingest!(service, &bearer, "u2", [{ "role": "user", "content": "I'm also allergic to shellfish",
        "timestamp": "2026-03-05T09:00:00Z" }]);
    let hits = recall("u2", "what food allergies does the user have").await;
    assert!(hits.len() >= 2, "{hits:#?}");
    assert!(
        hits.iter()
            .all(|hit| hit["explain"]["possibly_outdated_by"].is_null()),
        "{hits:#?}"
    );
}

/// On a search cluster, an ingest that reserved its position and never wrote it leaves
/// a gap in the user's episode log. A run that meets the gap while it is young reads
/// nothing behind it, and does not take its jobs for done: a job comes due when the gap
/// stops holding, and that run consolidates what came after it without another ingest.
#[actix_web::test]
async fn a_run_held_by_a_gap_comes_back_when_it_stops_holding() {
    use cairn_core::MemoryStore;
    use cairn_server::config::Backend;
    for (variable, backend) in [
        ("CAIRN_TEST_OPENSEARCH_URL", Backend::Opensearch),
        ("CAIRN_TEST_ELASTICSEARCH_URL", Backend::Elasticsearch),
    ] {
        let Some(url) = super::test_cluster(variable) else {
            eprintln!("skipped on {backend:?}: {variable} is not set");
            continue;
        };
        let prefix = format!("cairn-api-{}", uuid::Uuid::now_v7().simple());
        let patience = Duration::from_secs(5);
        let harness = harness_with(|config| {
            config.backend = backend;
            config.cluster_url = Some(url.clone());
            config.index_prefix = prefix.clone();
            config.cluster_gap_patience_ms = 5_000;
        })
        .await;
        let service = &harness.service;
        until_ready(service, &format!("{backend:?}: the service")).await;
        // Another process reserves the first position for an ingest and dies before
        // writing it.
        let elsewhere = cairn_store_cluster::ClusterStore::connect(&url, &prefix, 384)
            .await
            .expect("a second process");
        elsewhere.bootstrap().await.expect("bootstrap");
        let scope = super::scope_of("acme", "gap");
        let now = chrono::Utc::now();
        let lost = cairn_core::Episode {
            id: cairn_core::new_id("epi"),
            session_id: None,
            text: "I keep bees".into(),
            occurred_at: now,
            ingested_at: now,
            embedding: None,
        };
        elsewhere
            .prepare_episodes(&scope, &[lost])
            .await
            .expect("a reservation never written");

        let owner = token("acme", ALL);
        let (status, body, _) = call(
            service,
            Method::POST,
            "/v1/users/gap/episodes",
            Some(&owner),
            Some(
                json!({ "messages": [{ "role": "user", "content": "I live in Porto" }],
                         "consolidate": "async" }),
            ),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        // The job is due after the settle window, and claimed by a search: within the
        // refresh interval.
        let next_run = || async {
            for _ in 0..50 {
                if let Some(run) = harness.state.cairn.run_due_job().await.expect("run") {
                    return Some(run);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            None
        };
        let run = next_run().await;
        assert!(
            matches!(&run, Some(cairn_app::JobRun::Done(outcome)) if outcome.episodes_read == 0),
            "{backend:?}: the young gap holds the run: {run:?}"
        );
        let jobs = items!(service, &owner, "/v1/users/gap/jobs");
        assert_eq!(jobs.len(), 1, "{backend:?}: a job waits for the gap: {jobs:?}");

        tokio::time::sleep(patience).await;
        let run = next_run().await;
        assert!(
            matches!(&run, Some(cairn_app::JobRun::Done(outcome)) if outcome.episodes_read == 1),
            "{backend:?}: the run reads past the old gap: {run:?}"
        );
        let facts = items!(service, &owner, "/v1/users/gap/facts");
        assert!(
            facts
                .iter()
                .any(|fact| fact["text"].as_str().is_some_and(|text| text.contains("Porto"))),
            "{backend:?}: {facts:?}"
        );
        assert!(items!(service, &owner, "/v1/users/gap/jobs").is_empty());
        elsewhere
            .delete_indices()
            .await
            .expect("delete the test's indices");
    }
}

/// Two replicas (two services on one cluster prefix, each with its own process-local
/// lock) asked to consolidate the same user at once: the store's lease on the user's
/// runs lets one extract while the other waits, then finds the episodes consumed. Each
/// batch is extracted once, and both runs answer 200.
#[actix_web::test]
async fn two_replicas_consolidating_one_user_extract_each_batch_once() {
    use cairn_server::config::Backend;
    for (variable, backend) in [
        ("CAIRN_TEST_OPENSEARCH_URL", Backend::Opensearch),
        ("CAIRN_TEST_ELASTICSEARCH_URL", Backend::Elasticsearch),
    ] {
        let Some(url) = super::test_cluster(variable) else {
            eprintln!("skipped on {backend:?}: {variable} is not set");
            continue;
        };
        let script = Arc::new(Mutex::new(Script {
            extract: vec![(
                "I love Lisbon",
                vec![("The user loves Lisbon.", "preference", None)],
            )],
            faults: vec![Fault::Sleep(Duration::from_millis(1500))].into(),
            ..Script::default()
        }));
        let llm = fake_llm(Arc::clone(&script)).await;
        let prefix = format!("cairn-api-{}", uuid::Uuid::now_v7().simple());
        let replica = || {
            harness_with(|config| {
                config.backend = backend;
                config.cluster_url = Some(url.clone());
                config.index_prefix = prefix.clone();
                llm_config(config, "openai", llm.clone());
            })
        };
        let (first, second) = (replica().await, replica().await);
        for harness in [&first, &second] {
            until_ready(&harness.service, &format!("{backend:?}: the replica")).await;
        }
        let owner = token("acme", ALL);
        let (status, body, _) = call(
            &first.service,
            Method::POST,
            "/v1/users/lea/episodes",
            Some(&owner),
            Some(json!({ "messages": [{ "role": "user", "content": "I love Lisbon" }], "consolidate": "none" })),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        let run = |service| {
            let owner = owner.clone();
            async move {
                call(
                    service,
                    Method::POST,
                    "/v1/users/lea/consolidate",
                    Some(&owner),
                    Some(json!({})),
                )
                .await
            }
        };
        let ((one, first_run, _), (other, second_run, _)) =
            tokio::join!(run(&first.service), run(&second.service));
        assert_eq!(
            (one, other),
            (StatusCode::OK, StatusCode::OK),
            "{backend:?}: {first_run} {second_run}"
        );
        let read: Vec<u64> = [&first_run, &second_run]
            .iter()
            .map(|outcome| outcome["episodes_read"].as_u64().unwrap_or(u64::MAX))
            .collect();
        let mut sorted = read.clone();
        sorted.sort_unstable();
        assert_eq!(
            sorted,
            vec![0, 1],
            "{backend:?}: one run read the episode: {first_run} {second_run}"
        );
        assert_eq!(
            script.lock().expect("script").calls,
            1,
            "{backend:?}: the batch was extracted once"
        );
        let facts = items!(&first.service, &owner, "/v1/users/lea/facts");
        assert_eq!(facts.len(), 1, "{backend:?}: {facts:?}");
        drop_indices(&url, &prefix).await;
    }
}

/// A claim counts an attempt, so a job whose runs keep killing their worker (each one
/// claimed, none released as failed) is dead-lettered once its attempts pass the bound
/// instead of being run again.
#[actix_web::test]
async fn a_job_that_keeps_killing_its_worker_is_dead_lettered() {
    use cairn_core::MemoryStore;
    use cairn_server::config::Backend;
    let Some(url) = super::test_cluster("CAIRN_TEST_OPENSEARCH_URL") else {
        eprintln!("skipped: CAIRN_TEST_OPENSEARCH_URL is not set");
        return;
    };
    let prefix = format!("cairn-api-{}", uuid::Uuid::now_v7().simple());
    let harness = harness_with(|config| {
        config.backend = Backend::Opensearch;
        config.cluster_url = Some(url.clone());
        config.index_prefix = prefix.clone();
        config.consolidation_max_attempts = 3;
    })
    .await;
    until_ready(&harness.service, "the service").await;
    let store = cairn_store_cluster::ClusterStore::connect(&url, &prefix, 384)
        .await
        .expect("the test cluster");
    store.bootstrap().await.expect("bootstrap");
    let scope = super::scope_of("acme", "crashy");
    let now = chrono::Utc::now();
    // Three claims whose worker died before releasing the job.
    let job = cairn_core::ConsolidationJob {
        id: cairn_core::new_id("job"),
        subject: "acme-service".into(),
        request_id: "req_test".into(),
        assistant_context: Vec::new(),
        created_at: now,
        run_after: now,
        attempts: 3,
        last_error: None,
        dead_at: None,
    };
    let event = cairn_core::AuditEvent {
        id: cairn_core::new_id("aud"),
        at: now,
        subject: "acme-service".into(),
        tenant: "acme".into(),
        user: "crashy".into(),
        action: "episode.ingest".into(),
        target_ids: Vec::new(),
        request_id: "req_test".into(),
        detail: Value::Null,
    };
    store
        .commit(
            &scope,
            cairn_core::ChangeSet::new(event).with(cairn_core::Change::EnqueueJob(job.clone())),
        )
        .await
        .expect("enqueue");
    let mut run = None;
    for _ in 0..50 {
        run = harness.state.cairn.run_due_job().await.expect("run");
        if run.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        matches!(run, Some(cairn_app::JobRun::DeadLettered(_))),
        "the fourth claim dead-letters it: {run:?}"
    );
    let owner = token("acme", ALL);
    let jobs = items!(&harness.service, &owner, "/v1/users/crashy/jobs");
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(jobs[0]["state"], "dead", "{jobs:?}");
    store.delete_indices().await.expect("clean up");
}

/// Tokens spent on output the model got wrong twice count against the tenant's budget:
/// a run that fails on unusable output still charges what the provider reported, so a
/// model that keeps failing cannot spend without limit through retried jobs.
#[actix_web::test]
async fn tokens_spent_on_unusable_output_count_against_the_budget() {
    let script = Arc::new(Mutex::new(Script {
        extract: vec![(
            "I love Lisbon",
            vec![("The user loves Lisbon.", "preference", None)],
        )],
        faults: vec![Fault::Malformed, Fault::Malformed].into(),
        ..Script::default()
    }));
    let url = fake_llm(Arc::clone(&script)).await;
    let harness = harness_with(move |config| {
        llm_config(config, "openai", url);
        config.consolidation_token_budget = 1_000_000;
    })
    .await;
    let service = &harness.service;
    let owner = token("acme", ALL);
    let failed = ingest!(service, &owner, "ines", [{ "role": "user", "content": "I love Lisbon" }]);
    assert_eq!(failed["consolidation"]["ran"], false, "{failed}");
    assert!(
        failed["consolidation"]["error"]
            .as_str()
            .is_some_and(|error| error.contains("unparseable")),
        "{failed}"
    );
    assert!(facts!(service, &owner, "ines").is_empty());
    assert_eq!(
        script.lock().expect("lock").calls,
        2,
        "one call and its corrective retry"
    );

    let (status, body, _) = call(
        service,
        Method::POST,
        "/v1/users/ines/consolidate",
        Some(&owner),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let this_run = body["usage"]["input_tokens"].as_u64().unwrap_or(0)
        + body["usage"]["output_tokens"].as_u64().unwrap_or(0);
    let used = body["token_budget"]["used_today"].as_u64().unwrap_or(0);
    assert!(this_run > 0, "{body}");
    // The failed run's two calls each reported 40 output tokens and their input.
    assert!(
        used >= this_run + 80,
        "the failed run's tokens were not charged: {used} used, {this_run} by the run that worked"
    );
}
