//! The route table as a contract: the OpenAPI document it generates is reviewed as a
//! snapshot, and every route refuses a token holding the permission just below its own.

use super::{SECRET, error_code, harness_with};
use actix_web::dev::{Service, ServiceResponse};
use actix_web::http::{Method, StatusCode};
use actix_web::test as web_test;
use cairn_core::Permission;
use cairn_server::auth::{MintRequest, mint};
use cairn_server::routes::ROUTES;
use serde_json::Value;

const SNAPSHOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/openapi.json");

/// The document must equal the reviewed snapshot. After an intended change, rewrite it
/// with `CAIRN_UPDATE_SNAPSHOT=1 cargo test -p cairn-server --test api contract` and
/// review the diff.
#[test]
fn openapi_document_matches_its_snapshot() {
    let document = cairn_server::openapi::document();
    let rendered = serde_json::to_string_pretty(&document).expect("render") + "\n";
    assert_current(SNAPSHOT, &rendered, "the OpenAPI document is now");
}

/// Fails unless the file at `path` holds `rendered` (what `what` names renders). With
/// `CAIRN_UPDATE_SNAPSHOT=1` the file is rewritten first, for review in the diff.
fn assert_current(path: &str, rendered: &str, what: &str) {
    #[expect(
        clippy::disallowed_methods,
        reason = "a test's own switch, not service configuration"
    )]
    if std::env::var_os("CAIRN_UPDATE_SNAPSHOT").is_some() {
        std::fs::write(path, rendered).expect("write the file");
    }
    let current = std::fs::read_to_string(path).expect("read the file");
    assert!(
        current == rendered,
        "{path} is not what {what}; review the change and rewrite it with CAIRN_UPDATE_SNAPSHOT=1"
    );
}

const CONFIGURATION: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../docs/src/reference/configuration.md"
);

/// The configuration reference page is generated from the settings: every key is in
/// exactly one row and the page equals what the code renders (rewrite it with
/// `CAIRN_UPDATE_SNAPSHOT=1 cargo test -p cairn-server --test api contract`).
#[test]
fn the_configuration_reference_is_current() {
    let (missing, wrong) = cairn_server::reference::coverage();
    assert!(
        missing.is_empty(),
        "settings without a row in the reference: {missing:?}"
    );
    assert!(
        wrong.is_empty(),
        "rows naming a setting twice or one that does not exist: {wrong:?}"
    );
    let rendered = cairn_server::reference::markdown();
    assert_current(CONFIGURATION, &rendered, "the settings render");
}

const COMMAND_LINE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/src/reference/cli.md");

/// The command line reference page is the help of every command (rewrite it with
/// `CAIRN_UPDATE_SNAPSHOT=1 cargo test -p cairn-server --test api contract`).
#[test]
fn the_command_line_reference_is_current() {
    let rendered = cairn_server::reference::command_line();
    for command in [
        "`cairn serve`",
        "`cairn token mint`",
        "`cairn reembed`",
        "`cairn dashboards export`",
    ] {
        assert!(rendered.contains(command), "{command} is not in the reference");
    }
    assert_current(COMMAND_LINE, &rendered, "the command line renders");
}

const ERRORS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/src/reference/errors.md");

/// An error the service answers with `code`, as the code is raised.
fn raised(code: cairn_core::ErrorCode) -> cairn_server::error::ApiError {
    use cairn_core::{Error as Core, ErrorCode::*};
    use cairn_server::auth::AuthError;
    use cairn_server::error::ApiError;
    let message = String::from("test");
    match code {
        InvalidRequest => ApiError::Core(Core::invalid("field", "test")),
        MissingToken => ApiError::Auth(AuthError::Missing),
        TokenExpired => ApiError::Auth(AuthError::Expired),
        InvalidToken => ApiError::Auth(AuthError::Invalid(message)),
        InsufficientScope | UserMismatch => ApiError::Core(Core::Forbidden { code, message }),
        NotFound => ApiError::Core(Core::NotFound { what: "fact" }),
        RouteNotFound => ApiError::RouteNotFound,
        MethodNotAllowed => ApiError::MethodNotAllowed { allow: "GET".into() },
        PayloadTooLarge => ApiError::PayloadTooLarge { limit: 1 },
        RateLimited => ApiError::RateLimited {
            retry_after_seconds: 1,
        },
        TokenBudgetExhausted => ApiError::Core(Core::QuotaExhausted {
            code,
            message,
            retry_after_seconds: 1,
        }),
        Tombstoned => ApiError::Core(Core::Tombstoned {
            tombstone_id: "tomb_1".into(),
        }),
        ProviderError => ApiError::Core(Core::Provider(message)),
        Unavailable => ApiError::Core(Core::Unavailable(message)),
        InternalError => ApiError::Core(Core::Storage(message)),
        Duplicate | NotActive | VersionConflict | EvidenceErased | ScopeErased | ScopeNotEmpty
        | WatermarkMoved | ReviewResolved | ReviewStale | StoreInUse | MappingMismatch => {
            ApiError::Core(Core::Conflict { code, message })
        }
    }
}

/// The error reference lists every code once, with the status the service answers it
/// with (rewrite the page with `CAIRN_UPDATE_SNAPSHOT=1`).
#[test]
fn the_error_reference_is_current() {
    let schema = serde_json::to_value(schemars::schema_for!(cairn_core::ErrorCode)).expect("schema");
    let values = schema["enum"]
        .as_array()
        .or_else(|| schema["oneOf"].as_array())
        .map_or(0, Vec::len);
    let listed: std::collections::HashSet<_> = cairn_server::reference::ERROR_CODES.iter().collect();
    assert_eq!(
        listed.len(),
        cairn_server::reference::ERROR_CODES.len(),
        "a code is listed twice"
    );
    assert_eq!(listed.len(), values, "every code is listed: {schema}");
    for code in cairn_server::reference::ERROR_CODES {
        let (status, answered, _) = raised(code).parts();
        assert_eq!(answered, code);
        assert_eq!(
            status.as_u16(),
            cairn_server::reference::error(code).0,
            "the reference gives {code} another status than the service answers"
        );
    }
    let rendered = cairn_server::reference::errors();
    assert_current(ERRORS, &rendered, "the error codes render");
}

const MCP_TOOLS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../docs/src/reference/mcp-tools.md"
);

/// The MCP tools reference is what `tools/list` describes (rewrite it with
/// `CAIRN_UPDATE_SNAPSHOT=1`).
#[test]
fn the_mcp_tools_reference_is_current() {
    let rendered = cairn_server::reference::mcp_tools();
    for tool in cairn_server::mcp::CairnMcp::tools() {
        assert!(
            rendered.contains(&format!("## `{}`", tool.name)),
            "{} is not in the reference",
            tool.name
        );
    }
    assert!(rendered.contains("| `query` | string | yes |"), "{rendered}");
    assert_current(MCP_TOOLS, &rendered, "the tools describe");
}

const METRICS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/src/reference/metrics.md");

/// The metrics reference is what `/metrics` exposes (rewrite it with
/// `CAIRN_UPDATE_SNAPSHOT=1`).
#[test]
fn the_metrics_reference_is_current() {
    let rendered = cairn_server::reference::metrics();
    for family in [
        "| `cairn_http_requests_total` | counter | `method`, `route`, `status` |",
        "| `cairn_http_request_duration_seconds` | histogram | `method`, `route` |",
        "| `cairn_review_queue_depth` | gauge | `tenant` |",
        "| `cairn_review_queue_pending` | gauge | none |",
    ] {
        assert!(rendered.contains(family), "{family} is not in {rendered}");
    }
    assert_current(METRICS, &rendered, "/metrics exposes");
}

const REST: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/src/reference/rest.md");

/// The REST reference renders every operation of the OpenAPI document (rewrite it with
/// `CAIRN_UPDATE_SNAPSHOT=1`).
#[test]
fn the_rest_reference_is_current() {
    let rendered = cairn_server::reference::rest();
    for route in ROUTES {
        let heading = format!("### `{} {}`", route.method.to_uppercase(), route.path);
        assert!(rendered.contains(&heading), "{heading} is not in the reference");
    }
    assert_current(REST, &rendered, "the OpenAPI document renders");
}

#[test]
fn the_document_describes_every_route_fully() {
    let document = cairn_server::openapi::document();
    let schemas = document["components"]["schemas"].as_object().expect("schemas");
    let mut operation_ids = std::collections::HashSet::new();
    for route in ROUTES {
        let operation = &document["paths"][route.path][route.method.to_lowercase()];
        assert!(operation.is_object(), "{} {} missing", route.method, route.path);
        assert!(
            operation_ids.insert(route.operation_id),
            "operationId {} is used twice",
            route.operation_id
        );
        assert_eq!(operation["operationId"], route.operation_id);
        assert_eq!(operation["tags"][0], route.tag);
        assert!(
            document["tags"]
                .as_array()
                .is_some_and(|tags| tags.iter().any(|tag| tag["name"] == route.tag)),
            "the tag {} of {} {} is not declared",
            route.tag,
            route.method,
            route.path
        );
        let responses = operation["responses"].as_object().expect("responses");
        for (status, response) in responses {
            let schema = &response["content"]["application/json"]["schema"];
            if !schema.is_null() {
                if let Some(target) = schema.get("$ref").and_then(Value::as_str) {
                    let name = target.trim_start_matches("#/components/schemas/");
                    assert!(
                        schemas.contains_key(name),
                        "{status} of {} names {name}",
                        route.path
                    );
                }
            } else {
                assert!(
                    route.success.is_empty() && status == "200",
                    "{} {} answers {status} without a JSON schema",
                    route.method,
                    route.path
                );
            }
        }
        if route.permission.is_some() {
            for status in ["401", "403", "422", "429", "500", "503"] {
                assert!(
                    responses.contains_key(status),
                    "{} {} does not document {status}",
                    route.method,
                    route.path
                );
            }
            assert!(operation["security"][0]["bearer"].is_array());
        }
        if let Some(body) = &route.request {
            assert!(
                body.example.is_some(),
                "{} {} has a body but no example",
                route.method,
                route.path
            );
            assert!(operation["requestBody"]["content"]["application/json"]["example"].is_object());
        }
    }
    // Every error code the service can answer with is in the document's closed set.
    let codes = &schemas["ErrorCode"]["enum"];
    assert!(
        codes
            .as_array()
            .is_some_and(|codes| codes.iter().any(|code| code == "version_conflict")),
        "{codes}"
    );
}

/// A request as a client sends it (with a `Host`, which the MCP endpoint checks).
async fn send<S, B>(
    service: &S,
    method: Method,
    path: &str,
    bearer: &str,
    body: Option<Value>,
) -> (StatusCode, Value)
where
    S: Service<actix_http::Request, Response = ServiceResponse<B>, Error = actix_web::Error>,
    B: actix_web::body::MessageBody,
{
    let mut request = web_test::TestRequest::default()
        .method(method)
        .uri(path)
        .insert_header(("host", "localhost"))
        .insert_header(("accept", "application/json, text/event-stream"))
        .insert_header(("authorization", format!("Bearer {bearer}")));
    if let Some(body) = body {
        request = request.set_json(body);
    }
    let response = web_test::call_service(service, request.to_request()).await;
    let status = response.status();
    let bytes = web_test::read_body(response).await;
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

fn token_holding(permissions: &[Permission]) -> String {
    mint(
        &MintRequest {
            subject: "contract-service".into(),
            tenant: "contract".into(),
            scopes: permissions
                .iter()
                .map(|permission| permission.as_str().to_owned())
                .collect(),
            user: None,
            ttl_seconds: 600,
            audience: None,
            issuer: None,
        },
        Some(SECRET),
        None,
    )
    .expect("mint")
}

#[actix_web::test]
async fn every_route_refuses_the_permission_just_below_its_own() {
    let harness = harness_with(|_| ()).await;
    let service = &harness.service;
    let mut checked = 0;
    for route in ROUTES {
        let Some(permission) = route.permission else {
            continue;
        };
        // Admin holds everything; write does not imply read.
        let below: &[Permission] = match permission {
            Permission::Admin => &[Permission::Read, Permission::Write, Permission::Review],
            // Reviewing is apart from writing: a writer cannot approve its own proposals.
            Permission::Review => &[Permission::Read, Permission::Write],
            Permission::Write => &[Permission::Read],
            Permission::Read => &[],
        };
        let concrete = route.path.replace("{user}", "u1").replace("{id}", "none");
        let body = route
            .request
            .as_ref()
            .and_then(|body| body.example)
            .map(|example| serde_json::from_str::<Value>(example).expect("example is JSON"));
        let method = Method::from_bytes(route.method.as_bytes()).expect("method");
        let (status, answer) = send(
            service,
            method.clone(),
            &concrete,
            &token_holding(below),
            body.clone(),
        )
        .await;
        assert_eq!(
            (status, error_code(&answer)),
            (StatusCode::FORBIDDEN, "insufficient_scope"),
            "{} {} with {below:?}: {answer}",
            route.method,
            route.path
        );
        // The permission itself gets past the check (whatever the route then answers).
        let (status, answer) = send(service, method, &concrete, &token_holding(&[permission]), body).await;
        assert_ne!(
            status,
            StatusCode::FORBIDDEN,
            "{} {} with {permission:?}: {answer}",
            route.method,
            route.path
        );
        checked += 1;
    }
    assert!(checked >= 25, "only {checked} routes checked");
}

/// Serde reads a struct from a JSON array of its fields in order; the API takes objects
/// only, so each of these (which serde alone would accept) is refused and changes nothing.
#[actix_web::test]
async fn bodies_in_array_form_are_refused() {
    let harness = harness_with(|_| ()).await;
    let service = &harness.service;
    let admin = token_holding(&[Permission::Admin]);
    let cases = [
        (
            Method::POST,
            "/v1/users/u1/facts",
            serde_json::json!(["I live in Porto"]),
        ),
        (Method::POST, "/v1/users/u1/recall", serde_json::json!(["Porto"])),
        (Method::POST, "/v1/users/u1/consolidate", serde_json::json!([])),
        (
            Method::POST,
            "/v1/users/u1/playbooks/none/outcome",
            serde_json::json!([true]),
        ),
        (Method::POST, "/ui/session", serde_json::json!(["ticket"])),
    ];
    for (method, path, body) in cases {
        let (status, answer) = send(service, method, path, &admin, Some(body.clone())).await;
        assert_eq!(
            (status, error_code(&answer)),
            (StatusCode::UNPROCESSABLE_ENTITY, "invalid_request"),
            "{path} with {body}: {answer}"
        );
    }
    let (status, answer) = send(service, Method::GET, "/v1/users/u1/facts", &admin, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(answer["items"], serde_json::json!([]), "{answer}");
}

const LOGS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/src/reference/logs.md");

/// The log fields reference lists exactly the fields the sources log: every `tracing`
/// event and span of every crate is read, and each named field must be in the table of
/// `telemetry.rs`, each listed field used (rewrite the page with `CAIRN_UPDATE_SNAPSHOT=1`).
#[test]
fn the_log_fields_reference_is_current() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut logged = std::collections::BTreeSet::new();
    let mut calls = 0;
    for source in rust_sources(&root) {
        let text = std::fs::read_to_string(&source).expect("read a source file");
        for arguments in logging_calls(&text) {
            calls += 1;
            logged.extend(logged_fields(&arguments));
        }
    }
    assert!(
        calls > 40,
        "only {calls} logging calls were found; the scanner is broken"
    );
    for expected in ["request_id", "tenant", "status", "latency_ms", "error", "job"] {
        assert!(
            logged.contains(expected),
            "{expected} was not found among {logged:?}"
        );
    }
    let listed: std::collections::BTreeSet<String> = cairn_server::telemetry::LOG_FIELDS
        .iter()
        .map(|field| field.name.to_owned())
        .collect();
    assert_eq!(
        listed.len(),
        cairn_server::telemetry::LOG_FIELDS.len(),
        "a field is listed twice"
    );
    let missing: Vec<_> = logged.difference(&listed).collect();
    let unused: Vec<_> = listed.difference(&logged).collect();
    assert!(missing.is_empty(), "logged but not in LOG_FIELDS: {missing:?}");
    assert!(unused.is_empty(), "in LOG_FIELDS but never logged: {unused:?}");
    assert_current(
        LOGS,
        &cairn_server::reference::logs(),
        "the log field table renders",
    );
}

/// Every `.rs` file under a `src` directory of the service's crates.
fn rust_sources(root: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut pending: Vec<std::path::PathBuf> = std::fs::read_dir(root)
        .expect("list the crates")
        .filter_map(|entry| entry.ok().map(|entry| entry.path().join("src")))
        .filter(|path| path.is_dir())
        .collect();
    while let Some(directory) = pending.pop() {
        for entry in std::fs::read_dir(&directory).expect("list a source directory") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|extension| extension == "rs") {
                found.push(path);
            }
        }
    }
    found
}

/// The argument lists of the `tracing` events and spans in `text`, each split at its
/// top-level commas (string literals and brackets respected), with whether it is a span.
fn logging_calls(text: &str) -> Vec<(bool, Vec<String>)> {
    const MACROS: [&str; 7] = [
        "trace",
        "debug",
        "info",
        "warn",
        "error",
        "info_span",
        "debug_span",
    ];
    let mut calls = Vec::new();
    for (start, _) in text.match_indices("tracing::") {
        let rest = &text[start + "tracing::".len()..];
        let Some(name) = MACROS.iter().find(|name| rest.starts_with(&format!("{name}!("))) else {
            continue;
        };
        let body = &rest[name.len() + 2..];
        let (mut depth, mut quoted, mut escaped) = (1_usize, false, false);
        let (mut arguments, mut current) = (Vec::new(), String::new());
        for character in body.chars() {
            if quoted {
                current.push(character);
                match (escaped, character) {
                    (true, _) => escaped = false,
                    (false, '\\') => escaped = true,
                    (false, '"') => quoted = false,
                    _ => {}
                }
                continue;
            }
            match character {
                '"' => {
                    quoted = true;
                    current.push(character);
                }
                '(' | '[' | '{' => {
                    depth += 1;
                    current.push(character);
                }
                ')' | ']' | '}' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                    current.push(character);
                }
                ',' if depth == 1 => arguments.push(std::mem::take(&mut current).trim().to_owned()),
                _ => current.push(character),
            }
        }
        if !current.trim().is_empty() {
            arguments.push(current.trim().to_owned());
        }
        calls.push((name.ends_with("span"), arguments));
    }
    calls
}

/// The field names of one call: `name = value`, `name` and `%name`/`?name` shorthands,
/// up to the message (an event's format arguments follow it; a span's name comes first).
fn logged_fields((span, arguments): &(bool, Vec<String>)) -> Vec<String> {
    let mut fields = Vec::new();
    for (index, argument) in arguments.iter().enumerate() {
        if argument.starts_with('"') {
            if *span && index == 0 {
                continue;
            }
            break;
        }
        let bare = argument.trim_start_matches(['%', '?']);
        let name: String = bare
            .chars()
            .take_while(|character| character.is_ascii_alphanumeric() || *character == '_')
            .collect();
        let after = bare[name.len()..].trim_start();
        let shorthand = after.is_empty();
        let assigned = after.starts_with('=') && !after.starts_with("==");
        if !name.is_empty() && (shorthand || assigned) {
            fields.push(name);
        }
    }
    fields
}
