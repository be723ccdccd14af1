//! The MCP endpoint over real HTTP with the rmcp client: initialize, list tools and
//! prompts, call every tool, and the refusals that keep scopes apart.

use super::{ALL, SECRET, config, token, token_with};
use actix_web::{HttpServer, test, web};
use cairn_server::{build_state, http};
use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, CallToolResult, GetPromptRequestParams};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};

struct Running {
    base: String,
    state: web::Data<http::AppState>,
    _directory: tempfile::TempDir,
}

async fn start() -> Running {
    let directory = tempfile::tempdir().expect("temp dir");
    let state = web::Data::new(build_state(&config(&directory)).await.expect("state"));
    let shared = state.clone();
    let server = HttpServer::new(move || http::app(shared.clone()))
        .workers(1)
        .bind(("127.0.0.1", 0))
        .expect("bind");
    let address = server.addrs()[0];
    actix_web::rt::spawn(server.run());
    Running {
        base: format!("http://{address}/mcp"),
        state,
        _directory: directory,
    }
}

async fn connect(running: &Running, bearer: &str) -> RunningService<RoleClient, ()> {
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(running.base.clone()).auth_header(bearer.to_owned()),
    );
    ().serve(transport).await.expect("initialize")
}

async fn call(
    client: &RunningService<RoleClient, ()>,
    tool: &'static str,
    arguments: Value,
) -> CallToolResult {
    let Value::Object(arguments) = arguments else {
        panic!("arguments must be an object")
    };
    client
        .call_tool(CallToolRequestParams::new(tool).with_arguments(arguments))
        .await
        .expect("tool call")
}

fn structured(result: &CallToolResult) -> &Value {
    result.structured_content.as_ref().expect("structured content")
}

fn error_code(result: &CallToolResult) -> String {
    assert_eq!(result.is_error, Some(true), "{result:?}");
    structured(result)["error"]["code"]
        .as_str()
        .unwrap_or("")
        .to_owned()
}

#[actix_web::test]
async fn tools_work_end_to_end_over_http() {
    let running = start().await;
    let bound = token_with(
        "acme",
        "memory:read,memory:write",
        Some("alice"),
        3600,
        None,
        SECRET,
    );
    let client = connect(&running, &bound).await;

    let tools = client.list_all_tools().await.expect("tools");
    let mut names: Vec<&str> = tools.iter().map(|tool| tool.name.as_ref()).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "answer_from_memory",
            "forget_memory",
            "get_entity",
            "get_profile",
            "recall_memory",
            "record_playbook_outcome",
            "retract_memory",
            "write_memory"
        ]
    );
    let recall_tool = tools
        .iter()
        .find(|tool| tool.name == "recall_memory")
        .expect("recall tool");
    assert_eq!(
        recall_tool.annotations.as_ref().and_then(|a| a.read_only_hint),
        Some(true)
    );
    assert!(
        recall_tool
            .input_schema
            .get("properties")
            .and_then(|p| p.get("query"))
            .is_some()
    );
    let forget_tool = tools
        .iter()
        .find(|tool| tool.name == "forget_memory")
        .expect("forget tool");
    assert_eq!(
        forget_tool.annotations.as_ref().and_then(|a| a.destructive_hint),
        Some(true)
    );

    let written = call(
        &client,
        "write_memory",
        json!({ "text": "The user's favourite editor is Helix", "fact_type": "preference" }),
    )
    .await;
    assert_eq!(written.is_error, Some(false), "{written:?}");
    let first_id = structured(&written)["fact"]["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let replaced = call(
        &client,
        "write_memory",
        json!({ "text": "The user's favourite editor is Zed", "supersedes": first_id }),
    )
    .await;
    assert_eq!(structured(&replaced)["decision"]["kind"], "UPDATES");
    let second_id = structured(&replaced)["fact"]["id"]
        .as_str()
        .expect("id")
        .to_owned();

    let recalled = call(
        &client,
        "recall_memory",
        json!({ "query": "favourite editor", "tiers": ["semantic"] }),
    )
    .await;
    let ids: Vec<&str> = structured(&recalled)["hits"]
        .as_array()
        .expect("hits")
        .iter()
        .filter_map(|h| h["id"].as_str())
        .collect();
    assert_eq!(ids, vec![second_id.as_str()]);
    let with_history = call(
        &client,
        "recall_memory",
        json!({ "query": "favourite editor", "include_history": true }),
    )
    .await;
    assert_eq!(
        structured(&with_history)["hits"].as_array().map(Vec::len),
        Some(2)
    );

    let answered = call(
        &client,
        "answer_from_memory",
        json!({ "query": "What is my favourite editor?" }),
    )
    .await;
    assert_eq!(answered.is_error, Some(false), "{answered:?}");
    assert_eq!(structured(&answered)["known"], true, "{answered:?}");
    assert_eq!(
        structured(&answered)["citations"][0],
        second_id.as_str(),
        "the current fact"
    );
    let unknown = call(
        &client,
        "answer_from_memory",
        json!({ "query": "Which city was I born in?" }),
    )
    .await;
    assert_eq!(structured(&unknown)["known"], false, "{unknown:?}");

    let anna = call(
        &client,
        "write_memory",
        json!({ "text": "The user's sister Anna lives in Berlin", "fact_type": "world" }),
    )
    .await;
    let entity = call(&client, "get_entity", json!({ "name": "my sister" })).await;
    assert_eq!(entity.is_error, Some(false), "{entity:?}");
    assert_eq!(structured(&entity)["name"], "Anna");
    assert_eq!(
        structured(&entity)["facts"][0]["id"],
        structured(&anna)["fact"]["id"]
    );
    let about_anna = call(
        &client,
        "recall_memory",
        json!({ "query": "editor", "entity": "Anna", "valid_at": "2030-01-01T00:00:00Z" }),
    )
    .await;
    assert_eq!(
        structured(&about_anna)["hits"].as_array().map(Vec::len),
        Some(1),
        "{about_anna:?}"
    );
    let nobody = call(&client, "get_entity", json!({ "name": "Zebedee" })).await;
    assert_eq!(error_code(&nobody), "not_found");

    let profile = call(&client, "get_profile", json!({})).await;
    assert!(
        structured(&profile)["context"]
            .as_str()
            .is_some_and(|c| c.contains("Zed"))
    );

    let prompts = client.list_all_prompts().await.expect("prompts");
    assert_eq!(
        prompts.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
        ["context"]
    );
    let prompt = client
        .get_prompt(GetPromptRequestParams::new("context"))
        .await
        .expect("prompt");
    let rendered = serde_json::to_string(&prompt).expect("json");
    assert!(
        rendered.contains("The user's favourite editor is Zed"),
        "{rendered}"
    );

    // A playbook written over REST, its outcome recorded over MCP: one store behind both.
    let rest = test::init_service(http::app(running.state.clone())).await;
    let request = test::TestRequest::post()
        .uri("/v1/users/alice/playbooks")
        .insert_header(("authorization", format!("Bearer {bound}")))
        .set_json(json!({ "name": "Release", "trigger": "shipping a version", "steps": ["tag", "publish"] }))
        .to_request();
    let created: Value = test::call_and_read_body_json(&rest, request).await;
    let playbook_id = created["playbook"]["id"].as_str().expect("id");
    let outcome = call(
        &client,
        "record_playbook_outcome",
        json!({ "id": playbook_id, "success": true }),
    )
    .await;
    assert_eq!(structured(&outcome)["playbook"]["success_count"], 1);

    let retracted = call(
        &client,
        "retract_memory",
        json!({ "id": second_id, "reason": "joke" }),
    )
    .await;
    assert_eq!(structured(&retracted)["fact"]["status"], "retracted");
    let again = call(
        &client,
        "write_memory",
        json!({ "text": "The user's favourite editor is Zed" }),
    )
    .await;
    assert_eq!(error_code(&again), "tombstoned");
    let forgotten = call(&client, "forget_memory", json!({ "id": first_id })).await;
    assert_eq!(forgotten.is_error, Some(false));
    let missing = call(&client, "forget_memory", json!({ "id": first_id })).await;
    assert_eq!(error_code(&missing), "not_found");
    client.cancel().await.expect("close");
}

#[actix_web::test]
async fn refusals_keep_scopes_apart_and_change_nothing() {
    let running = start().await;
    let owner = connect(&running, &token("acme", ALL)).await;
    let written = call(
        &owner,
        "write_memory",
        json!({ "text": "Alice's locker code is 4411", "user": "alice" }),
    )
    .await;
    let fact_id = structured(&written)["fact"]["id"]
        .as_str()
        .expect("id")
        .to_owned();

    let unbound_without_user = call(&owner, "recall_memory", json!({ "query": "locker" })).await;
    assert_eq!(error_code(&unbound_without_user), "invalid_request");

    let other_tenant = connect(&running, &token("globex", ALL)).await;
    for (tool, arguments) in [
        ("forget_memory", json!({ "id": fact_id, "user": "alice" })),
        ("retract_memory", json!({ "id": fact_id, "user": "alice" })),
        (
            "write_memory",
            json!({ "text": "hijack", "supersedes": fact_id, "user": "alice" }),
        ),
    ] {
        assert_eq!(
            error_code(&call(&other_tenant, tool, arguments).await),
            "not_found",
            "{tool}"
        );
    }
    let leaked = call(
        &other_tenant,
        "recall_memory",
        json!({ "query": "locker code", "user": "alice" }),
    )
    .await;
    assert_eq!(structured(&leaked)["hits"], json!([]));

    let reader = connect(&running, &token("acme", "memory:read")).await;
    for (tool, arguments) in [
        ("write_memory", json!({ "text": "sneaky", "user": "alice" })),
        ("forget_memory", json!({ "id": fact_id, "user": "alice" })),
        ("retract_memory", json!({ "id": fact_id, "user": "alice" })),
        (
            "record_playbook_outcome",
            json!({ "id": "pb_x", "success": true, "user": "alice" }),
        ),
    ] {
        assert_eq!(
            error_code(&call(&reader, tool, arguments).await),
            "insufficient_scope",
            "{tool}"
        );
    }
    let bob = connect(
        &running,
        &token_with("acme", ALL, Some("bob"), 3600, None, SECRET),
    )
    .await;
    let crossing = call(
        &bob,
        "recall_memory",
        json!({ "query": "locker", "user": "alice" }),
    )
    .await;
    assert_eq!(error_code(&crossing), "user_mismatch");
    let bob_own = call(&bob, "forget_memory", json!({ "id": fact_id })).await;
    assert_eq!(error_code(&bob_own), "not_found");

    let kept = call(
        &owner,
        "recall_memory",
        json!({ "query": "locker code", "user": "alice" }),
    )
    .await;
    let hits = structured(&kept)["hits"].as_array().expect("hits");
    assert_eq!(hits.len(), 1, "nothing was changed by the refused calls");
    assert_eq!(hits[0]["status"], "active");

    let unauthenticated = StreamableHttpClientTransport::from_uri(running.base.clone());
    assert!(().serve(unauthenticated).await.is_err(), "no token, no session");
    let forged = token_with(
        "acme",
        ALL,
        None,
        3600,
        None,
        "a-different-secret-a-different-secret",
    );
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(running.base.clone()).auth_header(forged),
    );
    assert!(
        ().serve(transport).await.is_err(),
        "a forged token is refused before any MCP message"
    );
}
