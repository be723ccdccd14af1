//! REST handlers: each extracts its input, calls one use case and converts the result.

use crate::error::ApiError;
use crate::http::{AppState, Authenticated};
use crate::openapi;
use crate::wire::{self, page_request};
use actix_web::{HttpRequest, HttpResponse, web};
use cairn_core::Permission;
use serde_json::json;

type Reply = Result<HttpResponse, ApiError>;
type State = web::Data<AppState>;
type UserPath = web::Path<String>;
type ItemPath = web::Path<(String, String)>;

/// Every route of the service, with the permission it needs: the OpenAPI document is
/// generated from this table, and a test checks that each entry is served.
pub const ROUTES: &[(&str, &str, Option<Permission>, &str)] = &[
    (
        "POST",
        "/v1/users/{user}/episodes",
        Some(Permission::Write),
        "Store what the user said as episodes",
    ),
    (
        "GET",
        "/v1/users/{user}/episodes",
        Some(Permission::Read),
        "List episodes, newest first",
    ),
    (
        "GET",
        "/v1/users/{user}/episodes/{id}",
        Some(Permission::Read),
        "One episode",
    ),
    (
        "POST",
        "/v1/users/{user}/facts",
        Some(Permission::Write),
        "Write a fact through the gates",
    ),
    (
        "GET",
        "/v1/users/{user}/facts",
        Some(Permission::Read),
        "List facts by status",
    ),
    (
        "GET",
        "/v1/users/{user}/facts/{id}",
        Some(Permission::Read),
        "One fact, any status",
    ),
    (
        "POST",
        "/v1/users/{user}/facts/{id}/retract",
        Some(Permission::Write),
        "Retract a fact: it was never true",
    ),
    (
        "DELETE",
        "/v1/users/{user}/facts/{id}",
        Some(Permission::Write),
        "Forget (erase) a fact",
    ),
    (
        "POST",
        "/v1/users/{user}/playbooks",
        Some(Permission::Write),
        "Create a playbook",
    ),
    (
        "GET",
        "/v1/users/{user}/playbooks",
        Some(Permission::Read),
        "List playbooks",
    ),
    (
        "GET",
        "/v1/users/{user}/playbooks/{id}",
        Some(Permission::Read),
        "One playbook at its current version",
    ),
    (
        "GET",
        "/v1/users/{user}/playbooks/{id}/versions",
        Some(Permission::Read),
        "Every version of a playbook",
    ),
    (
        "POST",
        "/v1/users/{user}/playbooks/{id}/versions",
        Some(Permission::Write),
        "Add a playbook version",
    ),
    (
        "POST",
        "/v1/users/{user}/playbooks/{id}/outcome",
        Some(Permission::Write),
        "Record a playbook outcome",
    ),
    (
        "POST",
        "/v1/users/{user}/recall",
        Some(Permission::Read),
        "Recall memories for a query",
    ),
    (
        "GET",
        "/v1/users/{user}/profile",
        Some(Permission::Read),
        "Lasting and recent facts with a context block",
    ),
    (
        "POST",
        "/v1/users/{user}/consolidate",
        Some(Permission::Write),
        "Consolidate the user's new episodes now (or a dry run that writes nothing)",
    ),
    (
        "GET",
        "/v1/users/{user}/decisions",
        Some(Permission::Read),
        "The decision log",
    ),
    (
        "GET",
        "/v1/users/{user}/jobs",
        Some(Permission::Read),
        "Consolidation jobs of the user, queued and dead-lettered, with their errors",
    ),
    (
        "POST",
        "/v1/users/{user}/jobs/{id}/retry",
        Some(Permission::Write),
        "Make a consolidation job due now, out of the dead letters",
    ),
    (
        "GET",
        "/v1/users/{user}/audit",
        Some(Permission::Admin),
        "The audit trail of the scope",
    ),
    (
        "GET",
        "/v1/users",
        Some(Permission::Admin),
        "The tenant's users that hold memory, with counts and last activity",
    ),
    (
        "DELETE",
        "/v1/users/{user}",
        Some(Permission::Admin),
        "Erase the whole user",
    ),
    (
        "GET",
        "/v1/users/{user}/export",
        Some(Permission::Admin),
        "Everything of the user as one JSON document",
    ),
    (
        "POST",
        "/v1/users/{user}/import",
        Some(Permission::Admin),
        "An export (or, with ?format=mem0, a mem0 get_all document) back in",
    ),
    (
        "POST",
        "/mcp",
        Some(Permission::Read),
        "MCP streamable HTTP endpoint; each tool checks its own scope",
    ),
    ("GET", "/healthz", None, "Liveness"),
    ("GET", "/readyz", None, "Readiness: store reachable"),
    ("GET", "/metrics", None, "Prometheus metrics"),
    ("GET", "/openapi.json", None, "This document"),
];

pub fn register(config: &mut web::ServiceConfig) {
    config
        .route("/healthz", web::get().to(healthz))
        .route("/readyz", web::get().to(readyz))
        .route("/metrics", web::get().to(metrics))
        .route("/openapi.json", web::get().to(openapi_document))
        .route("/v1/users", web::get().to(list_users))
        .service(
            web::scope("/v1/users/{user}")
                .route("", web::delete().to(erase_user))
                .route("/episodes", web::post().to(ingest))
                .route("/episodes", web::get().to(list_episodes))
                .route("/episodes/{id}", web::get().to(get_episode))
                .route("/facts", web::post().to(write_fact))
                .route("/facts", web::get().to(list_facts))
                .route("/facts/{id}", web::get().to(get_fact))
                .route("/facts/{id}", web::delete().to(forget_fact))
                .route("/facts/{id}/retract", web::post().to(retract_fact))
                .route("/playbooks", web::post().to(create_playbook))
                .route("/playbooks", web::get().to(list_playbooks))
                .route("/playbooks/{id}", web::get().to(get_playbook))
                .route("/playbooks/{id}/versions", web::get().to(playbook_versions))
                .route("/playbooks/{id}/versions", web::post().to(new_playbook_version))
                .route("/playbooks/{id}/outcome", web::post().to(record_outcome))
                .route("/recall", web::post().to(recall))
                .route("/profile", web::get().to(profile))
                .route("/consolidate", web::post().to(consolidate))
                .route("/decisions", web::get().to(decisions))
                .route("/jobs", web::get().to(jobs))
                .route("/jobs/{id}/retry", web::post().to(retry_job))
                .route("/audit", web::get().to(audit))
                .route("/export", web::get().to(export_user))
                .route("/import", web::post().to(import_user)),
        )
        .default_service(web::to(not_found));
}

async fn not_found() -> Reply {
    Err(ApiError::RouteNotFound)
}

async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({ "status": "ok" }))
}

async fn readyz(state: State) -> HttpResponse {
    match state.cairn.ready().await {
        Ok(()) => {
            let models = if state.cairn.has_embedder() {
                "ok"
            } else {
                "not_loaded"
            };
            let mut body = json!({ "status": "ready", "checks": { "store": "ok", "models": models } });
            if let Some(note) = state.cairn.degraded() {
                body["checks"]["store"] = json!("degraded");
                body["detail"] = json!(note);
            }
            HttpResponse::Ok().json(body)
        }
        Err(error) => {
            tracing::warn!(error = %error, "store not ready");
            // What an operator must fix (credentials rejected, an unknown CA, the node
            // down); messages from the store never hold a secret.
            let detail = error.detail();
            HttpResponse::ServiceUnavailable().json(json!({
                "status": "unavailable",
                "checks": { "store": "unreachable" },
                "detail": detail
            }))
        }
    }
}

async fn metrics(state: State, request: HttpRequest) -> Reply {
    if state.metrics_require_auth {
        use actix_web::FromRequest;
        let caller = Authenticated::extract(&request).await?;
        if !caller.principal.has(Permission::Admin) {
            return Err(cairn_core::Error::Forbidden {
                code: "insufficient_scope",
                message: "metrics need the memory:admin scope".into(),
            }
            .into());
        }
    }
    Ok(HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(state.metrics.render()))
}

async fn openapi_document() -> HttpResponse {
    HttpResponse::Ok().json(openapi::document())
}

async fn ingest(
    caller: Authenticated,
    user: UserPath,
    body: web::Json<wire::IngestBody>,
    state: State,
) -> Reply {
    let scope = caller.scope(&user, Permission::Write)?;
    let request = body.into_inner().into_request()?;
    if request.consolidate == cairn_app::ConsolidateMode::Sync {
        state.charge_run(scope.tenant().as_str())?;
    }
    let outcome = state.cairn.ingest(&scope, &caller.context, request).await?;
    if let Some(run) = &outcome.consolidation.outcome {
        state.metrics.observe_consolidation(run, "sync");
    } else if outcome.consolidation.error.is_some() {
        state.metrics.observe_consolidation_failure("sync");
    }
    Ok(HttpResponse::Created().json(wire::ingest_response(&outcome)))
}

async fn consolidate(
    caller: Authenticated,
    user: UserPath,
    body: Option<web::Json<wire::ConsolidateBody>>,
    state: State,
) -> Reply {
    let scope = caller.scope(&user, Permission::Write)?;
    let options = body
        .map(|body| body.into_inner().into_options())
        .unwrap_or_default();
    state.charge_run(scope.tenant().as_str())?;
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
    query: web::Query<wire::PageQuery>,
    state: State,
) -> Reply {
    let scope = caller.scope(&user, Permission::Read)?;
    let query = query.into_inner();
    let page = state
        .cairn
        .list_episodes(&scope, &page_request(query.limit, query.cursor)?)
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
    body: web::Json<wire::FactBody>,
    state: State,
) -> Reply {
    let scope = caller.scope(&user, Permission::Write)?;
    let outcome = state
        .cairn
        .write_fact(&scope, &caller.context, body.into_inner().into_input()?)
        .await?;
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

async fn retract_fact(caller: Authenticated, path: ItemPath, payload: web::Payload, state: State) -> Reply {
    let (user, id) = path.into_inner();
    let scope = caller.scope(&user, Permission::Write)?;
    // The body is optional here, but when present it must be valid and within the limit.
    let limit = state.max_body_bytes;
    let body = payload
        .to_bytes_limited(limit)
        .await
        .map_err(|_| ApiError::PayloadTooLarge { limit })?
        .map_err(|error| ApiError::Malformed(format!("the body could not be read: {error}")))?;
    let reason = if body.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        serde_json::from_slice::<wire::RetractBody>(&body)
            .map_err(|error| ApiError::Malformed(format!("the body is not valid: {error}")))?
            .reason
    };
    let fact = state
        .cairn
        .retract_fact(&scope, &caller.context, &id, reason)
        .await?;
    Ok(HttpResponse::Ok().json(json!({ "fact": wire::fact(&fact, chrono::Utc::now()) })))
}

async fn forget_fact(caller: Authenticated, path: ItemPath, state: State) -> Reply {
    let (user, id) = path.into_inner();
    let scope = caller.scope(&user, Permission::Write)?;
    state.cairn.forget_fact(&scope, &caller.context, &id).await?;
    Ok(HttpResponse::Ok().json(json!({ "forgotten": id })))
}

async fn create_playbook(
    caller: Authenticated,
    user: UserPath,
    body: web::Json<wire::PlaybookBody>,
    state: State,
) -> Reply {
    let scope = caller.scope(&user, Permission::Write)?;
    let playbook = state
        .cairn
        .create_playbook(&scope, &caller.context, body.into_inner().into_input())
        .await?;
    Ok(HttpResponse::Created().json(json!({ "playbook": wire::playbook(&playbook) })))
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
    Ok(HttpResponse::Ok()
        .json(json!({ "versions": versions.iter().map(wire::playbook).collect::<Vec<_>>() })))
}

async fn new_playbook_version(
    caller: Authenticated,
    path: ItemPath,
    body: web::Json<wire::PlaybookVersionBody>,
    state: State,
) -> Reply {
    let (user, id) = path.into_inner();
    let scope = caller.scope(&user, Permission::Write)?;
    let playbook = state
        .cairn
        .new_playbook_version(&scope, &caller.context, &id, body.into_inner().into_input())
        .await?;
    Ok(HttpResponse::Created().json(json!({ "playbook": wire::playbook(&playbook) })))
}

async fn record_outcome(
    caller: Authenticated,
    path: ItemPath,
    body: web::Json<wire::OutcomeBody>,
    state: State,
) -> Reply {
    let (user, id) = path.into_inner();
    let scope = caller.scope(&user, Permission::Write)?;
    let playbook = state
        .cairn
        .record_playbook_outcome(&scope, &caller.context, &id, body.success)
        .await?;
    Ok(HttpResponse::Ok().json(json!({ "playbook": wire::playbook(&playbook) })))
}

async fn recall(
    caller: Authenticated,
    user: UserPath,
    body: web::Json<wire::RecallBody>,
    state: State,
) -> Reply {
    let scope = caller.scope(&user, Permission::Read)?;
    let result = state
        .cairn
        .recall(&scope, body.into_inner().into_request()?)
        .await?;
    Ok(HttpResponse::Ok().json(wire::recall_response(&result)))
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
    query: web::Query<wire::PageQuery>,
    state: State,
) -> Reply {
    let scope = caller.scope(&user, Permission::Read)?;
    let query = query.into_inner();
    let page = state
        .cairn
        .decisions(&scope, &page_request(query.limit, query.cursor)?)
        .await?;
    Ok(HttpResponse::Ok().json(wire::page(&page, wire::decision)))
}

async fn jobs(caller: Authenticated, user: UserPath, state: State) -> Reply {
    let scope = caller.scope(&user, Permission::Read)?;
    let jobs = state.cairn.jobs(&scope).await?;
    Ok(HttpResponse::Ok().json(json!({ "items": jobs.iter().map(wire::job).collect::<Vec<_>>() })))
}

async fn retry_job(caller: Authenticated, path: ItemPath, state: State) -> Reply {
    let (user, id) = path.into_inner();
    let scope = caller.scope(&user, Permission::Write)?;
    let job = state.cairn.retry_job(&scope, &caller.context, &id).await?;
    Ok(HttpResponse::Ok().json(json!({ "job": wire::job(&job) })))
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
            let document = serde_json::from_slice(&body)
                .map_err(|error| ApiError::Malformed(format!("the body is not a Cairn export: {error}")))?;
            let report = state
                .cairn
                .import_scope(&scope, &caller.context, document)
                .await?;
            json!({ "format": "cairn", "imported": report })
        }
        "mem0" => {
            let document = serde_json::from_slice(&body).map_err(|error| {
                ApiError::Malformed(format!("the body is not a mem0 get_all document: {error}"))
            })?;
            let report = state.cairn.import_mem0(&scope, &caller.context, document).await?;
            json!({ "format": "mem0", "imported": report })
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
