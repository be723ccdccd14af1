//! The OpenAPI 3.1 document, generated from the route table so it cannot drift from it.

use crate::routes::ROUTES;
use cairn_core::Permission;
use serde_json::{Map, Value, json};

/// The request body schema of a route, by method and path.
fn request_schema(method: &str, path: &str) -> Option<&'static str> {
    match (method, path) {
        ("POST", "/v1/users/{user}/episodes") => Some("IngestRequest"),
        ("POST", "/v1/users/{user}/facts") => Some("FactWrite"),
        ("POST", "/v1/users/{user}/facts/{id}/retract") => Some("Retraction"),
        ("POST", "/v1/users/{user}/playbooks") => Some("PlaybookCreate"),
        ("POST", "/v1/users/{user}/playbooks/{id}/versions") => Some("PlaybookVersion"),
        ("POST", "/v1/users/{user}/playbooks/{id}/outcome") => Some("PlaybookOutcome"),
        ("POST", "/v1/users/{user}/recall") => Some("RecallRequest"),
        ("POST", "/v1/users/{user}/consolidate") => Some("ConsolidateRequest"),
        _ => None,
    }
}

fn query_parameters(method: &str, path: &str) -> Vec<Value> {
    let parameter = |name: &str, schema: Value, description: &str| json!({ "name": name, "in": "query", "required": false, "schema": schema, "description": description });
    let paging = || {
        vec![
            parameter(
                "limit",
                json!({ "type": "integer", "minimum": 1, "maximum": 200 }),
                "page size (default 50)",
            ),
            parameter(
                "cursor",
                json!({ "type": "string" }),
                "next_cursor of the previous page",
            ),
        ]
    };
    match (method, path) {
        ("GET", "/v1/users/{user}/facts") => {
            let mut parameters = vec![
                parameter(
                    "status",
                    json!({ "type": "string", "enum": ["active", "superseded", "retracted", "expired", "all"] }),
                    "status at as_of (default active)",
                ),
                parameter(
                    "as_of",
                    json!({ "type": "string", "format": "date-time" }),
                    "judge status at this time",
                ),
            ];
            parameters.extend(paging());
            parameters
        }
        ("GET", "/v1/users/{user}/profile") => vec![
            parameter(
                "query",
                json!({ "type": "string" }),
                "also recall memories for this query",
            ),
            parameter("k", json!({ "type": "integer" }), "recall results to include"),
            parameter(
                "as_of",
                json!({ "type": "string", "format": "date-time" }),
                "profile as of this time",
            ),
            parameter(
                "max_tokens",
                json!({ "type": "integer", "minimum": 50 }),
                "budget of the context block",
            ),
        ],
        ("GET", _) if !path.ends_with("}") || path.ends_with("{user}") => paging(),
        _ => Vec::new(),
    }
}

fn path_parameters(path: &str) -> Vec<Value> {
    ["user", "id"]
        .iter()
        .filter(|name| path.contains(&format!("{{{name}}}")))
        .map(|name| {
            json!({
                "name": name, "in": "path", "required": true,
                "schema": if *name == "user" {
                    json!({ "type": "string", "pattern": "^[A-Za-z0-9._:@-]{1,128}$" })
                } else {
                    json!({ "type": "string" })
                }
            })
        })
        .collect()
}

fn operation(method: &str, path: &str, permission: Option<Permission>, summary: &str) -> Value {
    let mut operation = Map::new();
    operation.insert("summary".into(), json!(summary));
    let mut parameters = path_parameters(path);
    parameters.extend(query_parameters(method, path));
    if !parameters.is_empty() {
        operation.insert("parameters".into(), Value::Array(parameters));
    }
    if let Some(schema) = request_schema(method, path) {
        operation.insert(
            "requestBody".into(),
            json!({ "required": !matches!(schema, "Retraction" | "ConsolidateRequest"),
                    "content": { "application/json": { "schema": { "$ref": format!("#/components/schemas/{schema}") } } } }),
        );
    }
    let success = if method == "POST"
        && !path.ends_with("/recall")
        && !path.ends_with("/retract")
        && !path.ends_with("/outcome")
        && !path.ends_with("/consolidate")
    {
        "201"
    } else {
        "200"
    };
    let mut responses = Map::new();
    responses.insert(
        success.into(),
        json!({ "description": "success", "content": { "application/json": {} } }),
    );
    if let Some(permission) = permission {
        operation.insert("security".into(), json!([{ "bearer": [permission.as_str()] }]));
        for (status, description) in [
            ("401", "missing, invalid or expired token"),
            ("403", "the token lacks the scope or is bound to another user"),
            ("404", "not found in this scope"),
            ("413", "body too large"),
            ("422", "malformed or invalid input"),
            ("429", "tenant rate limit exceeded; see Retry-After"),
        ] {
            responses.insert(
                status.into(),
                json!({ "description": description,
                "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }),
            );
        }
        if method != "GET" {
            responses.insert(
                "409".into(),
                json!({ "description": "conflict: not active, tombstoned, or version conflict",
                "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }),
            );
        }
    }
    operation.insert("responses".into(), Value::Object(responses));
    Value::Object(operation)
}

fn schemas() -> Value {
    let time = json!({ "type": "string", "format": "date-time" });
    json!({
        "Error": { "type": "object", "required": ["error"], "properties": { "error": {
            "type": "object", "required": ["code", "message", "request_id"],
            "properties": { "code": { "type": "string" }, "message": { "type": "string" }, "request_id": { "type": "string" } } } } },
        "IngestRequest": { "type": "object", "required": ["messages"], "additionalProperties": false, "properties": {
            "messages": { "type": "array", "minItems": 1, "items": { "type": "object", "required": ["role", "content"],
                "additionalProperties": false, "properties": {
                    "role": { "type": "string", "enum": ["user", "assistant"] },
                    "content": { "type": "string", "minLength": 1 }, "timestamp": time } } },
            "session_id": { "type": "string" },
            "consolidate": { "type": "string", "enum": ["async", "sync", "none"] } } },
        "FactWrite": { "type": "object", "required": ["text"], "additionalProperties": false, "properties": {
            "text": { "type": "string", "minLength": 1 },
            "fact_type": { "type": "string", "enum": ["identity", "preference", "constraint", "world", "event"] },
            "confidence": { "type": "number", "minimum": 0, "maximum": 1 },
            "supersedes": { "type": "string" },
            "contradiction": { "type": "string", "enum": ["natural", "harsh"] },
            "valid_from": time, "valid_to": time, "expires_at": time,
            "reassert": { "type": "boolean", "description": "the user restated a retracted or forgotten value first-hand; accepted only when a user episode ingested after the tombstone states the value" },
            "evidence_episode_id": { "type": "string", "description": "the episode restating the value (default: the newest such episode found)" } } },
        "Retraction": { "type": "object", "additionalProperties": false, "properties": { "reason": { "type": "string" } } },
        "PlaybookCreate": { "type": "object", "required": ["name", "trigger", "steps"], "additionalProperties": false, "properties": {
            "name": { "type": "string" }, "trigger": { "type": "string" },
            "steps": { "type": "array", "items": { "type": "string" }, "minItems": 1 } } },
        "PlaybookVersion": { "type": "object", "required": ["steps"], "additionalProperties": false, "properties": {
            "name": { "type": "string" }, "trigger": { "type": "string" },
            "steps": { "type": "array", "items": { "type": "string" }, "minItems": 1 },
            "base_version": { "type": "integer" } } },
        "ConsolidateRequest": { "type": "object", "additionalProperties": false, "properties": {
            "dry_run": { "type": "boolean", "description": "return the decisions and write nothing" },
            "from_start": { "type": "boolean", "description": "re-read every episode, not only those past the watermark" } } },
        "PlaybookOutcome": { "type": "object", "required": ["success"], "additionalProperties": false,
            "properties": { "success": { "type": "boolean" } } },
        "RecallRequest": { "type": "object", "required": ["query"], "additionalProperties": false, "properties": {
            "query": { "type": "string", "minLength": 1 },
            "tiers": { "type": "array", "items": { "type": "string", "enum": ["semantic", "episodic", "procedural"] } },
            "k": { "type": "integer", "minimum": 1, "maximum": 100 },
            "as_of": time,
            "include_history": { "type": "boolean" },
            "explain": { "type": "boolean" },
            "fact_types": { "type": "array", "items": { "type": "string" } },
            "session_id": { "type": "string" } } }
    })
}

pub fn document() -> Value {
    let mut paths = Map::new();
    for (method, path, permission, summary) in ROUTES {
        let entry = paths
            .entry(path.to_string())
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(methods) = entry {
            methods.insert(
                method.to_lowercase(),
                operation(method, path, *permission, summary),
            );
        }
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Cairn",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Multi-tenant memory service for AI agents. The tenant comes from the bearer token; the user from the path."
        },
        "paths": paths,
        "components": {
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer", "bearerFormat": "JWT" } },
            "schemas": schemas()
        }
    })
}
