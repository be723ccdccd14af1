//! REST handlers: each extracts its input, calls one use case and converts the result.

use crate::error::ApiError;
use crate::http::{AppState, Authenticated};
use crate::openapi;
use crate::wire::{self, page_request};
use actix_web::{HttpRequest, HttpResponse, web};
use cairn_core::Permission;

type Reply = Result<HttpResponse, ApiError>;
type State = web::Data<AppState>;
type UserPath = web::Path<String>;
type ItemPath = web::Path<(String, String)>;

/// Produces a schema (a `$ref` for named types) in the document's generator.
pub type SchemaFn = fn(&mut schemars::SchemaGenerator) -> schemars::Schema;

fn schema<T: schemars::JsonSchema>(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    generator.subschema_for::<T>()
}

/// A route's JSON request body.
pub struct RequestBody {
    pub schema: SchemaFn,
    /// False where an empty body means the defaults.
    pub required: bool,
    /// An example body, as JSON text.
    pub example: Option<&'static str>,
}

/// One route of the service: the OpenAPI document is generated from this table, and
/// tests check that each entry is served, that its answers match its schemas, and that
/// a token with the permission just below its own is refused.
pub struct Route {
    pub method: &'static str,
    pub path: &'static str,
    /// The scope a token needs; `None` for public routes.
    pub permission: Option<Permission>,
    /// Success statuses with their JSON bodies (empty: not JSON, e.g. `/metrics`).
    pub success: &'static [(u16, SchemaFn)],
    pub request: Option<RequestBody>,
    /// The query string's fields, as a type.
    pub query: Option<SchemaFn>,
    pub summary: &'static str,
    pub operation_id: &'static str,
    pub tag: &'static str,
}

/// Every route of the service.
pub const ROUTES: &[Route] = &[
    Route {
        method: "POST",
        path: "/v1/users/{user}/episodes",
        permission: Some(Permission::Write),
        success: &[(201, schema::<wire::IngestResponse>)],
        request: Some(RequestBody {
            schema: schema::<wire::IngestBody>,
            required: true,
            example: Some(
                r#"{"messages": [{"role": "user", "content": "I moved to Lisbon last spring."}, {"role": "assistant", "content": "How do you like it?"}], "session_id": "chat-42"}"#,
            ),
        }),
        query: None,
        summary: "Store what the user said as episodes",
        operation_id: "ingestEpisodes",
        tag: "episodes",
    },
    Route {
        method: "GET",
        path: "/v1/users/{user}/episodes",
        permission: Some(Permission::Read),
        success: &[(200, schema::<wire::PageOf<wire::EpisodeResponse>>)],
        request: None,
        query: Some(schema::<wire::EpisodesQuery>),
        summary: "List episodes, newest first, optionally of one session",
        operation_id: "listEpisodes",
        tag: "episodes",
    },
    Route {
        method: "GET",
        path: "/v1/users/{user}/episodes/{id}",
        permission: Some(Permission::Read),
        success: &[(200, schema::<wire::EpisodeResponse>)],
        request: None,
        query: None,
        summary: "One episode",
        operation_id: "getEpisode",
        tag: "episodes",
    },
    Route {
        method: "POST",
        path: "/v1/users/{user}/facts",
        permission: Some(Permission::Write),
        success: &[
            (201, schema::<wire::FactWriteResponse>),
            (200, schema::<wire::FactWriteResponse>),
        ],
        request: Some(RequestBody {
            schema: schema::<wire::FactBody>,
            required: true,
            example: Some(
                r#"{"text": "The user is vegetarian.", "fact_type": "preference", "confidence": 0.9}"#,
            ),
        }),
        query: None,
        summary: "Write a fact through the gates (200 when an active fact already holds it)",
        operation_id: "writeFact",
        tag: "facts",
    },
    Route {
        method: "GET",
        path: "/v1/users/{user}/facts",
        permission: Some(Permission::Read),
        success: &[(200, schema::<wire::PageOf<wire::FactResponse>>)],
        request: None,
        query: Some(schema::<wire::FactListQuery>),
        summary: "List facts by status",
        operation_id: "listFacts",
        tag: "facts",
    },
    Route {
        method: "GET",
        path: "/v1/users/{user}/facts/{id}",
        permission: Some(Permission::Read),
        success: &[(200, schema::<wire::FactResponse>)],
        request: None,
        query: None,
        summary: "One fact, any status",
        operation_id: "getFact",
        tag: "facts",
    },
    Route {
        method: "GET",
        path: "/v1/users/{user}/facts/{id}/history",
        permission: Some(Permission::Read),
        success: &[(200, schema::<wire::ListOf<wire::FactResponse>>)],
        request: None,
        query: None,
        summary: "A fact's supersession history, oldest first: what it replaced, itself, what replaced it",
        operation_id: "getFactHistory",
        tag: "facts",
    },
    Route {
        method: "GET",
        path: "/v1/users/{user}/tombstones",
        permission: Some(Permission::Read),
        success: &[(200, schema::<wire::ListOf<wire::TombstoneResponse>>)],
        request: None,
        query: None,
        summary: "Values retracted or forgotten and refused from then on, newest first",
        operation_id: "listTombstones",
        tag: "facts",
    },
    Route {
        method: "GET",
        path: "/v1/users/{user}/entities",
        permission: Some(Permission::Read),
        success: &[(200, schema::<wire::ListOf<wire::EntitySummaryResponse>>)],
        request: None,
        query: None,
        summary: "The people, pets, places and organisations the user's facts name, most mentioned first",
        operation_id: "listEntities",
        tag: "facts",
    },
    Route {
        method: "GET",
        path: "/v1/users/{user}/entities/{id}",
        permission: Some(Permission::Read),
        success: &[(200, schema::<wire::EntityResponse>)],
        request: None,
        query: None,
        summary: "An entity's card (by id or name, e.g. \"Anna\" or \"my sister\"): its current facts and their history",
        operation_id: "getEntity",
        tag: "facts",
    },
    Route {
        method: "POST",
        path: "/v1/users/{user}/facts/{id}/retract",
        permission: Some(Permission::Write),
        success: &[(200, schema::<wire::FactEnvelope>)],
        request: Some(RequestBody {
            schema: schema::<wire::RetractBody>,
            required: false,
            example: Some(r#"{"reason": "the user said this was a joke"}"#),
        }),
        query: None,
        summary: "Retract a fact: it was never true",
        operation_id: "retractFact",
        tag: "facts",
    },
    Route {
        method: "DELETE",
        path: "/v1/users/{user}/facts/{id}",
        permission: Some(Permission::Write),
        success: &[(200, schema::<wire::Forgotten>)],
        request: None,
        query: None,
        summary: "Forget (erase) a fact",
        operation_id: "forgetFact",
        tag: "facts",
    },
    Route {
        method: "POST",
        path: "/v1/users/{user}/playbooks",
        permission: Some(Permission::Write),
        success: &[(201, schema::<wire::PlaybookEnvelope>)],
        request: Some(RequestBody {
            schema: schema::<wire::PlaybookBody>,
            required: true,
            example: Some(
                r#"{"name": "Deploy", "trigger": "the user asks to deploy", "steps": ["run the tests", "tag the release", "deploy"]}"#,
            ),
        }),
        query: None,
        summary: "Create a playbook",
        operation_id: "createPlaybook",
        tag: "playbooks",
    },
    Route {
        method: "GET",
        path: "/v1/users/{user}/playbooks",
        permission: Some(Permission::Read),
        success: &[(200, schema::<wire::PageOf<wire::PlaybookResponse>>)],
        request: None,
        query: Some(schema::<wire::PageQuery>),
        summary: "List playbooks",
        operation_id: "listPlaybooks",
        tag: "playbooks",
    },
    Route {
        method: "GET",
        path: "/v1/users/{user}/playbooks/{id}",
        permission: Some(Permission::Read),
        success: &[(200, schema::<wire::PlaybookResponse>)],
        request: None,
        query: None,
        summary: "One playbook at its current version",
        operation_id: "getPlaybook",
        tag: "playbooks",
    },
    Route {
        method: "GET",
        path: "/v1/users/{user}/playbooks/{id}/versions",
        permission: Some(Permission::Read),
        success: &[(200, schema::<wire::PlaybookVersions>)],
        request: None,
        query: None,
        summary: "Every version of a playbook",
        operation_id: "listPlaybookVersions",
        tag: "playbooks",
    },
    Route {
        method: "POST",
        path: "/v1/users/{user}/playbooks/{id}/versions",
        permission: Some(Permission::Write),
        success: &[(201, schema::<wire::PlaybookEnvelope>)],
        request: Some(RequestBody {
            schema: schema::<wire::PlaybookVersionBody>,
            required: true,
            example: Some(r#"{"steps": ["run the tests", "tag the release", "deploy"], "base_version": 1}"#),
        }),
        query: None,
        summary: "Add a playbook version",
        operation_id: "addPlaybookVersion",
        tag: "playbooks",
    },
    Route {
        method: "POST",
        path: "/v1/users/{user}/playbooks/{id}/outcome",
        permission: Some(Permission::Write),
        success: &[(200, schema::<wire::PlaybookEnvelope>)],
        request: Some(RequestBody {
            schema: schema::<wire::OutcomeBody>,
            required: true,
            example: Some(r#"{"success": true}"#),
        }),
        query: None,
        summary: "Record a playbook outcome",
        operation_id: "recordPlaybookOutcome",
        tag: "playbooks",
    },
    Route {
        method: "POST",
        path: "/v1/users/{user}/recall",
        permission: Some(Permission::Read),
        success: &[(200, schema::<wire::RecallResponse>)],
        request: Some(RequestBody {
            schema: schema::<wire::RecallBody>,
            required: true,
            example: Some(r#"{"query": "where does the user live?", "k": 5, "explain": true}"#),
        }),
        query: None,
        summary: "Recall memories for a query",
        operation_id: "recall",
        tag: "recall",
    },
    Route {
        method: "POST",
        path: "/v1/users/{user}/answer",
        permission: Some(Permission::Read),
        success: &[(200, schema::<wire::AnswerResponse>)],
        request: Some(RequestBody {
            schema: schema::<wire::AnswerBody>,
            required: true,
            example: Some(r#"{"query": "what is the user's dog called?"}"#),
        }),
        query: None,
        summary: "Answer a question from memory alone, citing the memories, or say it is not known",
        operation_id: "answer",
        tag: "recall",
    },
    Route {
        method: "GET",
        path: "/v1/users/{user}/profile",
        permission: Some(Permission::Read),
        success: &[(200, schema::<wire::ProfileResponse>)],
        request: None,
        query: Some(schema::<wire::ProfileQuery>),
        summary: "Lasting and recent facts with a context block",
        operation_id: "getProfile",
        tag: "recall",
    },
    Route {
        method: "POST",
        path: "/v1/users/{user}/consolidate",
        permission: Some(Permission::Write),
        success: &[(200, schema::<wire::ConsolidationResponse>)],
        request: Some(RequestBody {
            schema: schema::<wire::ConsolidateBody>,
            required: false,
            example: Some(r#"{"dry_run": true}"#),
        }),
        query: None,
        summary: "Consolidate the user's new episodes now (or a dry run that writes nothing)",
        operation_id: "consolidate",
        tag: "consolidation",
    },
    Route {
        method: "GET",
        path: "/v1/users/{user}/decisions",
        permission: Some(Permission::Read),
        success: &[(200, schema::<wire::PageOf<wire::DecisionResponse>>)],
        request: None,
        query: Some(schema::<wire::DecisionsQuery>),
        summary: "The decision log, newest first, optionally of one kind",
        operation_id: "listDecisions",
        tag: "consolidation",
    },
    Route {
        method: "GET",
        path: "/v1/users/{user}/jobs",
        permission: Some(Permission::Read),
        success: &[(200, schema::<wire::JobList>)],
        request: None,
        query: None,
        summary: "Consolidation jobs of the user, queued and dead-lettered, with their errors",
        operation_id: "listJobs",
        tag: "consolidation",
    },
    Route {
        method: "POST",
        path: "/v1/users/{user}/jobs/{id}/retry",
        permission: Some(Permission::Write),
        success: &[(200, schema::<wire::JobEnvelope>)],
        request: None,
        query: None,
        summary: "Make a consolidation job due now, out of the dead letters",
        operation_id: "retryJob",
        tag: "consolidation",
    },
    Route {
        method: "GET",
        path: "/v1/users/{user}/audit",
        permission: Some(Permission::Admin),
        success: &[(200, schema::<wire::PageOf<wire::AuditEventResponse>>)],
        request: None,
        query: Some(schema::<wire::PageQuery>),
        summary: "The audit trail of the scope",
        operation_id: "listAudit",
        tag: "admin",
    },
    Route {
        method: "GET",
        path: "/v1/users/{user}/reviews",
        permission: Some(Permission::Review),
        success: &[(200, schema::<wire::PageOf<wire::ReviewResponse>>)],
        request: None,
        query: Some(schema::<wire::PageQuery>),
        summary: "The user's outcomes held for review, oldest first",
        operation_id: "listUserReviews",
        tag: "reviews",
    },
    Route {
        method: "GET",
        path: "/v1/reviews",
        permission: Some(Permission::Review),
        success: &[(200, schema::<wire::ReviewQueueResponse>)],
        request: None,
        query: Some(schema::<wire::PageQuery>),
        summary: "The tenant's review queue, oldest first, with counts by kind (a token bound to no user)",
        operation_id: "listReviews",
        tag: "reviews",
    },
    Route {
        method: "POST",
        path: "/v1/users/{user}/reviews/{id}/approve",
        permission: Some(Permission::Review),
        success: &[(200, schema::<wire::ReviewDecisionResponse>)],
        request: None,
        query: None,
        summary: "Apply a held change (409 when what it changes moved on, or it was decided)",
        operation_id: "approveReview",
        tag: "reviews",
    },
    Route {
        method: "POST",
        path: "/v1/users/{user}/reviews/{id}/reject",
        permission: Some(Permission::Review),
        success: &[(200, schema::<wire::ReviewDecisionResponse>)],
        request: Some(RequestBody {
            schema: schema::<wire::RejectBody>,
            required: false,
            example: Some(r#"{"reason": "the user never lived there", "tombstone": true}"#),
        }),
        query: None,
        summary: "Drop a held change; with tombstone, the value was never true",
        operation_id: "rejectReview",
        tag: "reviews",
    },
    Route {
        method: "GET",
        path: "/v1/users",
        permission: Some(Permission::Admin),
        success: &[(200, schema::<wire::PageOf<wire::UserSummaryResponse>>)],
        request: None,
        query: Some(schema::<wire::PageQuery>),
        summary: "The tenant's users that hold memory, with counts and last activity",
        operation_id: "listUsers",
        tag: "admin",
    },
    Route {
        method: "DELETE",
        path: "/v1/users/{user}",
        permission: Some(Permission::Admin),
        success: &[(200, schema::<wire::ErasureResponse>)],
        request: None,
        query: None,
        summary: "Erase the whole user",
        operation_id: "eraseUser",
        tag: "admin",
    },
    Route {
        method: "GET",
        path: "/v1/users/{user}/export",
        permission: Some(Permission::Admin),
        success: &[(200, schema::<cairn_app::ScopeExport>)],
        request: None,
        query: None,
        summary: "Everything of the user as one JSON document",
        operation_id: "exportUser",
        tag: "admin",
    },
    Route {
        method: "POST",
        path: "/v1/users/{user}/import",
        permission: Some(Permission::Admin),
        success: &[(201, schema::<wire::ImportResponse>)],
        request: Some(RequestBody {
            schema: schema::<wire::ImportBody>,
            required: true,
            example: Some(r#"{"results": [{"id": "m-1", "memory": "Likes green tea", "user_id": "alice"}]}"#),
        }),
        query: Some(schema::<wire::ImportQuery>),
        summary: "An export (or, with ?format=mem0, a mem0 get_all document) back in",
        operation_id: "importUser",
        tag: "admin",
    },
    Route {
        method: "POST",
        path: "/mcp",
        permission: Some(Permission::Read),
        success: &[(200, schema::<serde_json::Value>)],
        request: Some(RequestBody {
            schema: schema::<serde_json::Value>,
            required: true,
            example: Some(r#"{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}"#),
        }),
        query: None,
        summary: "MCP streamable HTTP endpoint (JSON-RPC): needs memory:read or memory:write; each tool checks its own scope",
        operation_id: "mcp",
        tag: "mcp",
    },
    Route {
        method: "GET",
        path: "/ui",
        permission: None,
        success: &[],
        request: None,
        query: None,
        summary: "The inspector console (HTML; it signs in with a bearer token and uses this API)",
        operation_id: "console",
        tag: "operations",
    },
    Route {
        method: "POST",
        path: "/ui/session",
        permission: None,
        success: &[(200, schema::<wire::LoginResponse>)],
        request: Some(RequestBody {
            schema: schema::<wire::LoginBody>,
            required: true,
            example: Some(r#"{"ticket": "eyJ0eXAiOiJKV1QiLCJhbGciOiJIUzI1NiJ9..."}"#),
        }),
        query: None,
        summary: "Redeem a console login ticket (cairn token mint --ui) once for a session token",
        operation_id: "consoleSession",
        tag: "operations",
    },
    Route {
        method: "GET",
        path: "/healthz",
        permission: None,
        success: &[(200, schema::<wire::Liveness>)],
        request: None,
        query: None,
        summary: "Liveness",
        operation_id: "healthz",
        tag: "operations",
    },
    Route {
        method: "GET",
        path: "/readyz",
        permission: None,
        success: &[(200, schema::<wire::Readiness>), (503, schema::<wire::Readiness>)],
        request: None,
        query: None,
        summary: "Readiness: store reachable",
        operation_id: "readyz",
        tag: "operations",
    },
    Route {
        method: "GET",
        path: "/metrics",
        permission: None,
        success: &[],
        request: None,
        query: None,
        summary: "Prometheus metrics (text exposition format)",
        operation_id: "metrics",
        tag: "operations",
    },
    Route {
        method: "GET",
        path: "/openapi.json",
        permission: None,
        success: &[(200, schema::<serde_json::Value>)],
        request: None,
        query: None,
        summary: "This document",
        operation_id: "openapi",
        tag: "operations",
    },
];

pub fn register(config: &mut web::ServiceConfig) {
    config
        .route("/healthz", web::get().to(healthz))
        .route("/readyz", web::get().to(readyz))
        .route("/metrics", web::get().to(metrics))
        .route("/openapi.json", web::get().to(openapi_document))
        .configure(crate::console::register)
        .route("/v1/users", web::get().to(list_users))
        .route("/v1/reviews", web::get().to(tenant_reviews))
        .service(
            web::scope("/v1/users/{user}")
                .route("", web::delete().to(erase_user))
                .route("/episodes", web::post().to(ingest))
                .route("/episodes", web::get().to(list_episodes))
                .route("/episodes/{id}", web::get().to(get_episode))
                .route("/facts", web::post().to(write_fact))
                .route("/facts", web::get().to(list_facts))
                .route("/facts/{id}", web::get().to(get_fact))
                .route("/facts/{id}/history", web::get().to(fact_history))
                .route("/tombstones", web::get().to(tombstones))
                .route("/entities", web::get().to(entities))
                .route("/entities/{id}", web::get().to(entity))
                .route("/facts/{id}", web::delete().to(forget_fact))
                .route("/facts/{id}/retract", web::post().to(retract_fact))
                .route("/playbooks", web::post().to(create_playbook))
                .route("/playbooks", web::get().to(list_playbooks))
                .route("/playbooks/{id}", web::get().to(get_playbook))
                .route("/playbooks/{id}/versions", web::get().to(playbook_versions))
                .route("/playbooks/{id}/versions", web::post().to(new_playbook_version))
                .route("/playbooks/{id}/outcome", web::post().to(record_outcome))
                .route("/recall", web::post().to(recall))
                .route("/answer", web::post().to(answer))
                .route("/profile", web::get().to(profile))
                .route("/consolidate", web::post().to(consolidate))
                .route("/decisions", web::get().to(decisions))
                .route("/jobs", web::get().to(jobs))
                .route("/jobs/{id}/retry", web::post().to(retry_job))
                .route("/audit", web::get().to(audit))
                .route("/reviews", web::get().to(user_reviews))
                .route("/reviews/{id}/approve", web::post().to(approve_review))
                .route("/reviews/{id}/reject", web::post().to(reject_review))
                .route("/export", web::get().to(export_user))
                .route("/import", web::post().to(import_user)),
        )
        .default_service(web::to(not_found));
}

/// An optional JSON body: none when empty, and when present it must be valid and within
/// the limit (a body that does not parse is refused, never taken for the defaults).
async fn optional_body<T: serde::de::DeserializeOwned>(
    payload: web::Payload,
    limit: usize,
) -> Result<Option<T>, ApiError> {
    let body = payload
        .to_bytes_limited(limit)
        .await
        .map_err(|_| ApiError::PayloadTooLarge { limit })?
        .map_err(|error| ApiError::Malformed(format!("the body could not be read: {error}")))?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    serde_json::from_slice::<wire::Object<T>>(&body)
        .map(|object| Some(object.0))
        .map_err(|error| ApiError::Malformed(format!("the body is not valid: {error}")))
}

/// Whether a request path matches a route template such as `/v1/users/{user}/facts`.
fn matches_template(template: &str, path: &str) -> bool {
    let mut expected = template.split('/');
    let mut actual = path.split('/');
    loop {
        match (expected.next(), actual.next()) {
            (None, None) => return true,
            (Some(part), Some(segment)) if part.starts_with('{') && !segment.is_empty() => {}
            (Some(part), Some(segment)) if part == segment => {}
            _ => return false,
        }
    }
}

/// No route answers the request: 405 with `Allow` when the path exists with other
/// methods, 404 otherwise.
async fn not_found(request: HttpRequest) -> Reply {
    let path = request.path();
    let allowed: Vec<&str> = ROUTES
        .iter()
        .filter(|route| matches_template(route.path, path))
        .map(|route| route.method)
        .collect();
    if allowed.is_empty() {
        Err(ApiError::RouteNotFound)
    } else {
        Err(ApiError::MethodNotAllowed {
            allow: allowed.join(", "),
        })
    }
}

async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(wire::Liveness { status: "ok" })
}

async fn readyz(state: State, request: HttpRequest) -> HttpResponse {
    match state.cairn.ready().await {
        Ok(()) => {
            let models = if state.cairn.has_embedder() {
                "ok"
            } else {
                "not_loaded"
            };
            let degraded = state.cairn.degraded();
            HttpResponse::Ok().json(wire::Readiness {
                status: "ready",
                checks: wire::ReadinessChecks {
                    store: if degraded.is_some() { "degraded" } else { "ok" },
                    models: Some(models),
                },
                detail: degraded,
            })
        }
        Err(error) => {
            tracing::warn!(error = %error, "store not ready");
            // What is wrong in general terms (credentials rejected, an unknown CA, the
            // node down); the cluster's own words, which name its accounts, realms and
            // hosts, are for the log and the operator's credential alone. Messages from
            // the store never hold a secret.
            let detail = if is_operator(&state, &request) {
                error.detail()
            } else {
                error.public_detail()
            };
            HttpResponse::ServiceUnavailable().json(wire::Readiness {
                status: "unavailable",
                checks: wire::ReadinessChecks {
                    store: "unreachable",
                    models: None,
                },
                detail: Some(detail),
            })
        }
    }
}

/// Whether the request carries the operator's scrape credential (compared in constant
/// time).
fn is_operator(state: &AppState, request: &HttpRequest) -> bool {
    let Some(expected) = state.metrics_token.as_deref() else {
        return false;
    };
    let given = request
        .headers()
        .get(actix_web::http::header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .unwrap_or_default();
    given.len() == expected.len()
        && given
            .bytes()
            .zip(expected.bytes())
            .fold(0_u8, |differ, (a, b)| differ | (a ^ b))
            == 0
}

/// The Prometheus metrics. Series that name a tenant are shown only to the operator's
/// credential (`CAIRN_METRICS_TOKEN`); everyone else, tenant admins included, reads
/// them summed over tenants.
async fn metrics(state: State, request: HttpRequest) -> Reply {
    let operator = is_operator(&state, &request);
    if state.metrics_require_auth && !operator {
        use actix_web::FromRequest;
        let caller = Authenticated::extract(&request).await?;
        if !caller.principal.has(Permission::Admin) {
            return Err(cairn_core::Error::Forbidden {
                code: cairn_core::ErrorCode::InsufficientScope,
                message: "metrics need the memory:admin scope".into(),
            }
            .into());
        }
    }
    state.metrics.recount_review_queues(&state.cairn).await;
    Ok(HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(state.metrics.render(operator)))
}

async fn openapi_document() -> HttpResponse {
    HttpResponse::Ok().json(openapi::document())
}

async fn ingest(
    caller: Authenticated,
    user: UserPath,
    body: web::Json<wire::Object<wire::IngestBody>>,
    state: State,
) -> Reply {
    let scope = caller.scope(&user, Permission::Write)?;
    let request = body.into_inner().0.into_request()?;
    if request.consolidate == cairn_app::ConsolidateMode::Sync {
        state.charge_run(&scope.limits()).await?;
    }
    let outcome = state.cairn.ingest(&scope, &caller.context, request).await?;
    if let Some(run) = &outcome.consolidation.outcome {
        state.metrics.observe_consolidation(run, "sync");
    } else if outcome.consolidation.error.is_some() {
        state.metrics.observe_consolidation_failure("sync");
    }
    Ok(HttpResponse::Created().json(wire::ingest_response(&outcome)))
}

async fn consolidate(caller: Authenticated, user: UserPath, payload: web::Payload, state: State) -> Reply {
    let scope = caller.scope(&user, Permission::Write)?;
    let options = optional_body::<wire::ConsolidateBody>(payload, state.max_body_bytes)
        .await?
        .map(wire::ConsolidateBody::into_options)
        .unwrap_or_default();
    state.charge_run(&scope.limits()).await?;
    let outcome = match state.cairn.consolidate(&scope, &caller.context, options).await {
        Ok(outcome) => outcome,
        Err(error) => {
            state.metrics.observe_consolidation_failure("manual");
            return Err(error.into());
        }
    };
    state.metrics.observe_consolidation(&outcome, "manual");
    Ok(HttpResponse::Ok().json(wire::consolidation(&outcome)))
}

async fn list_episodes(
    caller: Authenticated,
    user: UserPath,
    query: web::Query<wire::EpisodesQuery>,
    state: State,
) -> Reply {
    let scope = caller.scope(&user, Permission::Read)?;
    let query = query.into_inner();
    let page = state
        .cairn
        .list_episodes(
            &scope,
            query.session_id.as_deref(),
            &page_request(query.limit, query.cursor)?,
        )
        .await?;
    Ok(HttpResponse::Ok().json(wire::page(&page, wire::episode)))
}

async fn get_episode(caller: Authenticated, path: ItemPath, state: State) -> Reply {
    let (user, id) = path.into_inner();
    let scope = caller.scope(&user, Permission::Read)?;
    let episode = state.cairn.get_episode(&scope, &id).await?;
    Ok(HttpResponse::Ok().json(wire::episode(&episode)))
}

async fn write_fact(
    caller: Authenticated,
    user: UserPath,
    body: web::Json<wire::Object<wire::FactBody>>,
    state: State,
) -> Reply {
    let scope = caller.scope(&user, Permission::Write)?;
    let outcome = state
        .cairn
        .write_fact(&scope, &caller.context, body.into_inner().0.into_input()?)
        .await?;
    if outcome.decision.kind == cairn_core::DecisionKind::HeldForReview {
        state.metrics.refresh_review_queue(&state.cairn, &scope).await;
    }
    let response = wire::fact_write_response(&outcome);
    Ok(if outcome.created {
        HttpResponse::Created().json(response)
    } else {
        HttpResponse::Ok().json(response)
    })
}

async fn list_facts(
    caller: Authenticated,
    user: UserPath,
    query: web::Query<wire::FactListQuery>,
    state: State,
) -> Reply {
    let scope = caller.scope(&user, Permission::Read)?;
    let query = query.into_inner();
    let status = query.status_filter()?;
    let as_of = query.as_of()?;
    let page = state
        .cairn
        .list_facts(&scope, status, as_of, &page_request(query.limit, query.cursor)?)
        .await?;
    let as_of = as_of.unwrap_or_else(chrono::Utc::now);
    Ok(HttpResponse::Ok().json(wire::page(&page, |fact| wire::fact(fact, as_of))))
}

async fn get_fact(caller: Authenticated, path: ItemPath, state: State) -> Reply {
    let (user, id) = path.into_inner();
    let scope = caller.scope(&user, Permission::Read)?;
    let fact = state.cairn.get_fact(&scope, &id).await?;
    Ok(HttpResponse::Ok().json(wire::fact(&fact, chrono::Utc::now())))
}

async fn fact_history(caller: Authenticated, path: ItemPath, state: State) -> Reply {
    let (user, id) = path.into_inner();
    let scope = caller.scope(&user, Permission::Read)?;
    let now = chrono::Utc::now();
    let history = state.cairn.fact_history(&scope, &id).await?;
    Ok(HttpResponse::Ok().json(wire::ListOf {
        items: history.iter().map(|fact| wire::fact(fact, now)).collect(),
    }))
}

async fn entities(caller: Authenticated, user: UserPath, state: State) -> Reply {
    let scope = caller.scope(&user, Permission::Read)?;
    let entities = state.cairn.entities(&scope).await?;
    Ok(HttpResponse::Ok().json(wire::ListOf {
        items: entities.iter().map(wire::entity_summary).collect(),
    }))
}

async fn entity(caller: Authenticated, path: ItemPath, state: State) -> Reply {
    let (user, wanted) = path.into_inner();
    let scope = caller.scope(&user, Permission::Read)?;
    let entity = state.cairn.entity(&scope, &wanted).await?;
    Ok(HttpResponse::Ok().json(wire::entity(&entity)))
}

async fn tombstones(caller: Authenticated, user: UserPath, state: State) -> Reply {
    let scope = caller.scope(&user, Permission::Read)?;
    let tombstones = state.cairn.tombstones(&scope).await?;
    Ok(HttpResponse::Ok().json(wire::ListOf {
        items: tombstones.iter().map(wire::tombstone).collect(),
    }))
}

async fn retract_fact(caller: Authenticated, path: ItemPath, payload: web::Payload, state: State) -> Reply {
    let (user, id) = path.into_inner();
    let scope = caller.scope(&user, Permission::Write)?;
    let reason = optional_body::<wire::RetractBody>(payload, state.max_body_bytes)
        .await?
        .and_then(|body| body.reason);
    let fact = state
        .cairn
        .retract_fact(&scope, &caller.context, &id, reason)
        .await?;
    Ok(HttpResponse::Ok().json(wire::FactEnvelope {
        fact: wire::fact(&fact, chrono::Utc::now()),
    }))
}

async fn forget_fact(caller: Authenticated, path: ItemPath, state: State) -> Reply {
    let (user, id) = path.into_inner();
    let scope = caller.scope(&user, Permission::Write)?;
    state.cairn.forget_fact(&scope, &caller.context, &id).await?;
    // A held fact's review went with it.
    state.metrics.refresh_review_queue(&state.cairn, &scope).await;
    Ok(HttpResponse::Ok().json(wire::Forgotten { forgotten: id }))
}

async fn create_playbook(
    caller: Authenticated,
    user: UserPath,
    body: web::Json<wire::Object<wire::PlaybookBody>>,
    state: State,
) -> Reply {
    let scope = caller.scope(&user, Permission::Write)?;
    let playbook = state
        .cairn
        .create_playbook(&scope, &caller.context, body.into_inner().0.into_input())
        .await?;
    Ok(HttpResponse::Created().json(wire::PlaybookEnvelope {
        playbook: wire::playbook(&playbook),
    }))
}

async fn list_playbooks(
    caller: Authenticated,
    user: UserPath,
    query: web::Query<wire::PageQuery>,
    state: State,
) -> Reply {
    let scope = caller.scope(&user, Permission::Read)?;
    let query = query.into_inner();
    let page = state
        .cairn
        .list_playbooks(&scope, &page_request(query.limit, query.cursor)?)
        .await?;
    Ok(HttpResponse::Ok().json(wire::page(&page, wire::playbook)))
}

async fn get_playbook(caller: Authenticated, path: ItemPath, state: State) -> Reply {
    let (user, id) = path.into_inner();
    let scope = caller.scope(&user, Permission::Read)?;
    let playbook = state.cairn.get_playbook(&scope, &id).await?;
    Ok(HttpResponse::Ok().json(wire::playbook(&playbook)))
}

async fn playbook_versions(caller: Authenticated, path: ItemPath, state: State) -> Reply {
    let (user, id) = path.into_inner();
    let scope = caller.scope(&user, Permission::Read)?;
    let versions = state.cairn.playbook_versions(&scope, &id).await?;
    Ok(HttpResponse::Ok().json(wire::PlaybookVersions {
        versions: versions.iter().map(wire::playbook).collect(),
    }))
}

async fn new_playbook_version(
    caller: Authenticated,
    path: ItemPath,
    body: web::Json<wire::Object<wire::PlaybookVersionBody>>,
    state: State,
) -> Reply {
    let (user, id) = path.into_inner();
    let scope = caller.scope(&user, Permission::Write)?;
    let playbook = state
        .cairn
        .new_playbook_version(&scope, &caller.context, &id, body.into_inner().0.into_input())
        .await?;
    Ok(HttpResponse::Created().json(wire::PlaybookEnvelope {
        playbook: wire::playbook(&playbook),
    }))
}

async fn record_outcome(
    caller: Authenticated,
    path: ItemPath,
    body: web::Json<wire::Object<wire::OutcomeBody>>,
    state: State,
) -> Reply {
    let (user, id) = path.into_inner();
    let scope = caller.scope(&user, Permission::Write)?;
    let playbook = state
        .cairn
        .record_playbook_outcome(&scope, &caller.context, &id, body.success)
        .await?;
    Ok(HttpResponse::Ok().json(wire::PlaybookEnvelope {
        playbook: wire::playbook(&playbook),
    }))
}

async fn recall(
    caller: Authenticated,
    user: UserPath,
    body: web::Json<wire::Object<wire::RecallBody>>,
    state: State,
) -> Reply {
    let scope = caller.scope(&user, Permission::Read)?;
    let result = state
        .cairn
        .recall(&scope, body.into_inner().0.into_request()?)
        .await?;
    Ok(HttpResponse::Ok().json(wire::recall_response(&result)))
}

async fn answer(
    caller: Authenticated,
    user: UserPath,
    body: web::Json<wire::Object<wire::AnswerBody>>,
    state: State,
) -> Reply {
    let scope = caller.scope(&user, Permission::Read)?;
    let answer = state
        .cairn
        .answer(&scope, body.into_inner().0.into_request()?)
        .await?;
    Ok(HttpResponse::Ok().json(wire::answer_response(answer)))
}

async fn profile(
    caller: Authenticated,
    user: UserPath,
    query: web::Query<wire::ProfileQuery>,
    state: State,
) -> Reply {
    let scope = caller.scope(&user, Permission::Read)?;
    let profile = state
        .cairn
        .profile(&scope, query.into_inner().into_request()?)
        .await?;
    Ok(HttpResponse::Ok().json(wire::profile(&profile)))
}

async fn decisions(
    caller: Authenticated,
    user: UserPath,
    query: web::Query<wire::DecisionsQuery>,
    state: State,
) -> Reply {
    let scope = caller.scope(&user, Permission::Read)?;
    let query = query.into_inner();
    let page = state
        .cairn
        .decisions(&scope, query.kind, &page_request(query.limit, query.cursor)?)
        .await?;
    Ok(HttpResponse::Ok().json(wire::page(&page, wire::decision)))
}

async fn jobs(caller: Authenticated, user: UserPath, state: State) -> Reply {
    let scope = caller.scope(&user, Permission::Read)?;
    let jobs = state.cairn.jobs(&scope).await?;
    Ok(HttpResponse::Ok().json(wire::JobList {
        items: jobs.iter().map(wire::job).collect(),
    }))
}

async fn retry_job(caller: Authenticated, path: ItemPath, state: State) -> Reply {
    let (user, id) = path.into_inner();
    let scope = caller.scope(&user, Permission::Write)?;
    let job = state.cairn.retry_job(&scope, &caller.context, &id).await?;
    Ok(HttpResponse::Ok().json(wire::JobEnvelope { job: wire::job(&job) }))
}

async fn audit(
    caller: Authenticated,
    user: UserPath,
    query: web::Query<wire::PageQuery>,
    state: State,
) -> Reply {
    let scope = caller.scope(&user, Permission::Admin)?;
    let query = query.into_inner();
    let page = state
        .cairn
        .audit_trail(&scope, &page_request(query.limit, query.cursor)?)
        .await?;
    Ok(HttpResponse::Ok().json(wire::page(&page, wire::audit_event)))
}

async fn erase_user(caller: Authenticated, user: UserPath, state: State) -> Reply {
    let scope = caller.scope(&user, Permission::Admin)?;
    let receipt = state.cairn.erase_user(&scope, &caller.context).await?;
    Ok(HttpResponse::Ok().json(wire::erasure(&receipt)))
}

async fn export_user(caller: Authenticated, user: UserPath, state: State) -> Reply {
    let scope = caller.scope(&user, Permission::Admin)?;
    let document = state.cairn.export_scope(&scope).await?;
    Ok(HttpResponse::Ok().json(document))
}

async fn import_user(
    caller: Authenticated,
    user: UserPath,
    query: web::Query<wire::ImportQuery>,
    payload: web::Payload,
    state: State,
) -> Reply {
    let scope = caller.scope(&user, Permission::Admin)?;
    let limit = state.max_import_bytes;
    let body = payload
        .to_bytes_limited(limit)
        .await
        .map_err(|_| ApiError::PayloadTooLarge { limit })?
        .map_err(|error| ApiError::Malformed(format!("the body could not be read: {error}")))?;
    let report = match query.format.as_deref().unwrap_or("cairn") {
        "cairn" => {
            let document = serde_json::from_slice::<wire::Object<_>>(&body)
                .map_err(|error| ApiError::Malformed(format!("the body is not a Cairn export: {error}")))?
                .0;
            let report = state
                .cairn
                .import_scope(&scope, &caller.context, document)
                .await?;
            wire::ImportResponse::Cairn { imported: report }
        }
        "mem0" => {
            let document = serde_json::from_slice(&body).map_err(|error| {
                ApiError::Malformed(format!("the body is not a mem0 get_all document: {error}"))
            })?;
            let report = state.cairn.import_mem0(&scope, &caller.context, document).await?;
            wire::ImportResponse::Mem0 { imported: report }
        }
        other => {
            return Err(cairn_core::Error::invalid(
                "format",
                format!("must be cairn or mem0, not {other:?}"),
            )
            .into());
        }
    };
    Ok(HttpResponse::Created().json(report))
}

async fn list_users(caller: Authenticated, query: web::Query<wire::PageQuery>, state: State) -> Reply {
    let tenant = caller.tenant_scope()?;
    let query = query.into_inner();
    let page = state
        .cairn
        .users(&tenant, &page_request(query.limit, query.cursor)?)
        .await?;
    Ok(HttpResponse::Ok().json(wire::page(&page, wire::user_summary)))
}

async fn user_reviews(
    caller: Authenticated,
    user: UserPath,
    query: web::Query<wire::PageQuery>,
    state: State,
) -> Reply {
    let scope = caller.scope(&user, Permission::Review)?;
    let query = query.into_inner();
    let page = state
        .cairn
        .reviews(&scope, &page_request(query.limit, query.cursor)?)
        .await?;
    Ok(HttpResponse::Ok().json(wire::page(&page, wire::review)))
}

async fn tenant_reviews(caller: Authenticated, query: web::Query<wire::PageQuery>, state: State) -> Reply {
    let tenant = caller.tenant_scope_for(Permission::Review)?;
    let query = query.into_inner();
    let queue = state
        .cairn
        .tenant_reviews(&tenant, &page_request(query.limit, query.cursor)?, |user| {
            caller.scope(user, Permission::Review).map_err(|_| {
                cairn_core::Error::Storage(format!("review of user {user} outside the caller's reach"))
            })
        })
        .await?;
    state
        .metrics
        .observe_review_queue(tenant.tenant().as_str(), &queue.summary);
    Ok(HttpResponse::Ok().json(wire::ReviewQueueResponse {
        items: queue.page.items.iter().map(wire::review).collect(),
        next_cursor: queue.page.next_cursor,
        counts: wire::review_counts(&queue.summary),
    }))
}

async fn approve_review(caller: Authenticated, path: ItemPath, state: State) -> Reply {
    let (user, id) = path.into_inner();
    let scope = caller.scope(&user, Permission::Review)?;
    let outcome = state.cairn.approve_review(&scope, &caller.context, &id).await?;
    state.metrics.refresh_review_queue(&state.cairn, &scope).await;
    Ok(HttpResponse::Ok().json(wire::review_decision(&user, &outcome)))
}

async fn reject_review(caller: Authenticated, path: ItemPath, payload: web::Payload, state: State) -> Reply {
    let (user, id) = path.into_inner();
    let scope = caller.scope(&user, Permission::Review)?;
    let body = optional_body::<wire::RejectBody>(payload, state.max_body_bytes).await?;
    let (reason, tombstone) = body.map_or((None, false), |body| (body.reason, body.tombstone));
    let outcome = state
        .cairn
        .reject_review(&scope, &caller.context, &id, reason, tombstone)
        .await?;
    state.metrics.refresh_review_queue(&state.cairn, &scope).await;
    Ok(HttpResponse::Ok().json(wire::review_decision(&user, &outcome)))
}
