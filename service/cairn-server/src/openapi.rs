//! The OpenAPI 3.1 document, generated from the route table and the wire types, so it
//! cannot drift from what the handlers accept and answer.

use crate::routes::{ROUTES, Route};
use crate::wire::ErrorResponse;
use schemars::generate::SchemaSettings;
use schemars::transform::{ReplaceBoolSchemas, Transform};
use schemars::{Schema, SchemaGenerator};
use serde_json::{Map, Value, json};

/// Error statuses every authenticated route may answer, with what they mean.
const ERRORS: [(u16, &str); 9] = [
    (401, "missing, invalid or expired token"),
    (403, "the token lacks the scope or is bound to another user"),
    (404, "not found in this scope"),
    (
        409,
        "conflict: not active, tombstoned, a version or watermark moved",
    ),
    (413, "body too large"),
    (422, "malformed or invalid input"),
    (429, "rate limit or token budget exceeded; see Retry-After"),
    (500, "internal error; quote the request id"),
    (
        503,
        "the store is unavailable; retry later (see Retry-After when given)",
    ),
];

/// Routes that may wait on a model provider (a synchronous consolidation run).
fn calls_provider(route: &Route) -> bool {
    route.path.ends_with("/consolidate") || route.path.ends_with("/episodes") && route.method == "POST"
}

/// Replaces `true` schemas (any JSON) with `{}`, leaving `additionalProperties` alone.
fn any_as_object() -> ReplaceBoolSchemas {
    let mut transform = ReplaceBoolSchemas::default();
    transform.skip_additional_properties = true;
    transform
}

fn generator() -> SchemaGenerator {
    let mut settings = SchemaSettings::draft2020_12();
    settings.definitions_path = "/components/schemas".into();
    settings.meta_schema = None;
    // `{}` rather than `true` for "any JSON": both are valid, but client generators
    // read only the object form.
    settings.transforms.push(Box::new(any_as_object()));
    settings.into_generator()
}

/// A type's fields as query parameters (none is required).
fn query_parameters(schema: Schema) -> Vec<Value> {
    let value = schema.to_value();
    let Some(properties) = value["properties"].as_object() else {
        return Vec::new();
    };
    properties
        .iter()
        .map(|(name, property)| {
            let mut property = property.clone();
            let description = property
                .as_object_mut()
                .and_then(|object| object.remove("description"));
            // A query value is never JSON null.
            if let Some(types) = property["type"].as_array() {
                let kept: Vec<Value> = types.iter().filter(|kind| *kind != "null").cloned().collect();
                property["type"] = if kept.len() == 1 {
                    kept[0].clone()
                } else {
                    Value::Array(kept)
                };
            }
            let mut parameter = json!({ "name": name, "in": "query", "required": false, "schema": property });
            if let Some(description) = description {
                parameter["description"] = description;
            }
            parameter
        })
        .collect()
}

fn path_parameters(path: &str) -> Vec<Value> {
    ["user", "id"]
        .iter()
        .filter(|name| path.contains(&format!("{{{name}}}")))
        .map(|name| {
            let (schema, description) = if *name == "user" {
                (
                    json!({ "type": "string", "pattern": "^(?!\\.{1,2}$)[A-Za-z0-9._:@-]{1,128}$" }),
                    "the user whose memory this is, inside the token's tenant",
                )
            } else if path.contains("/entities/") {
                (
                    json!({ "type": "string", "minLength": 1 }),
                    "the entity's id or one of its names (\"Anna\", \"my sister\")",
                )
            } else {
                (json!({ "type": "string", "minLength": 1 }), "the record's id")
            };
            json!({ "name": name, "in": "path", "required": true, "schema": schema, "description": description })
        })
        .collect()
}

fn json_content(mut schema: Schema) -> Value {
    any_as_object().transform(&mut schema);
    json!({ "application/json": { "schema": schema.to_value() } })
}

fn operation(route: &Route, generator: &mut SchemaGenerator) -> Value {
    let mut operation = Map::new();
    operation.insert("operationId".into(), json!(route.operation_id));
    operation.insert("summary".into(), json!(route.summary));
    operation.insert("tags".into(), json!([route.tag]));
    let mut parameters = path_parameters(route.path);
    if let Some(query) = route.query {
        // Inline: a query type is a list of parameters, not a body schema.
        let mut inline = generator.settings().clone();
        inline.inline_subschemas = true;
        parameters.extend(query_parameters(query(&mut inline.into_generator())));
    }
    if !parameters.is_empty() {
        operation.insert("parameters".into(), Value::Array(parameters));
    }
    if let Some(body) = &route.request {
        let mut content = json_content((body.schema)(generator));
        if let Some(example) = body
            .example
            .and_then(|text| serde_json::from_str::<Value>(text).ok())
        {
            content["application/json"]["example"] = example;
        }
        operation.insert(
            "requestBody".into(),
            json!({ "required": body.required, "content": content }),
        );
    }
    let mut responses = Map::new();
    for (status, schema) in route.success {
        let description = if *status == 503 { "not ready" } else { "success" };
        responses.insert(
            status.to_string(),
            json!({ "description": description, "content": json_content(schema(generator)) }),
        );
    }
    if route.success.is_empty() {
        // Not JSON: the console's page, or the Prometheus text format.
        let media = if route.path.starts_with("/ui") {
            "text/html"
        } else {
            "text/plain"
        };
        responses.insert(
            "200".into(),
            json!({ "description": "success", "content": { media: { "schema": { "type": "string" } } } }),
        );
    }
    if route.permission.is_none() && route.request.is_some() {
        // A public route with a body (a login ticket) can still refuse it.
        let error = generator.subschema_for::<ErrorResponse>().to_value();
        for (status, description) in [
            (401, "the credential in the body was refused"),
            (413, "body too large"),
            (422, "malformed or invalid input"),
        ] {
            responses.insert(
                status.to_string(),
                json!({ "description": description, "content": { "application/json": { "schema": error } } }),
            );
        }
    }
    if let Some(permission) = route.permission {
        operation.insert("security".into(), json!([{ "bearer": [permission.as_str()] }]));
        let error = generator.subschema_for::<ErrorResponse>().to_value();
        for (status, description) in ERRORS {
            let applies = match status {
                409 => route.method != "GET",
                413 => route.request.is_some(),
                _ => true,
            };
            if applies {
                responses.insert(
                    status.to_string(),
                    json!({ "description": description, "content": { "application/json": { "schema": error } } }),
                );
            }
        }
        if calls_provider(route) {
            responses.insert(
                "502".into(),
                json!({ "description": "the model provider failed; the episodes are stored and consolidation retries",
                        "content": { "application/json": { "schema": error } } }),
            );
        }
    }
    operation.insert("responses".into(), Value::Object(responses));
    Value::Object(operation)
}

/// The whole document.
pub fn document() -> Value {
    let mut generator = generator();
    let mut paths = Map::new();
    for route in ROUTES {
        let entry = paths
            .entry(route.path.to_owned())
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(methods) = entry {
            methods.insert(route.method.to_lowercase(), operation(route, &mut generator));
        }
    }
    // Every error answer, including those of routes outside the table (an unknown route).
    generator.subschema_for::<ErrorResponse>();
    let schemas: Map<String, Value> = generator.take_definitions(true).into_iter().collect();
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Cairn",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Multi-tenant memory service for AI agents. The tenant comes from the bearer token; the user from the path.",
            "license": { "name": "Apache-2.0", "identifier": "Apache-2.0" }
        },
        "servers": [{ "url": "/", "description": "the Cairn server that serves this document" }],
        "tags": [
            { "name": "episodes", "description": "what users said: the evidence" },
            { "name": "facts", "description": "facts distilled or written through the gates" },
            { "name": "playbooks", "description": "procedures with versions and outcomes" },
            { "name": "recall", "description": "hybrid search over every tier, and the profile" },
            { "name": "consolidation", "description": "runs, jobs and the decision log" },
            { "name": "reviews", "description": "outcomes held for a person's approval" },
            { "name": "admin", "description": "tenant administration: users, audit, erasure, portability" },
            { "name": "mcp", "description": "the hosted MCP endpoint" },
            { "name": "operations", "description": "health, readiness, metrics and this document" }
        ],
        "paths": paths,
        "components": {
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer", "bearerFormat": "JWT" } },
            "schemas": schemas
        }
    })
}
