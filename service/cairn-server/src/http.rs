//! The actix-web application: shared state, the authenticated-caller extractor, the
//! request middleware (request ids, logs, metrics) and body/query/path error handling.

use crate::auth::{AuthError, Verifier};
use crate::error::{ApiError, REQUEST_ID, json_error};
use crate::mcp::CairnMcp;
use crate::metrics::Metrics;
use crate::rate::RateLimit;
use crate::routes;
use actix_web::body::MessageBody;
use actix_web::dev::{Payload, ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::middleware::{Next, from_fn};
use actix_web::{FromRequest, HttpMessage, HttpRequest, web};
use cairn_app::{Cairn, RequestContext};
use cairn_core::{Permission, Principal, Scope, TenantLimits, new_id};
use rmcp_actix_web::transport::StreamableHttpService;
use std::time::Instant;
use tracing::Instrument;

/// Everything a request handler may need, shared by all workers.
pub struct AppState {
    pub cairn: Cairn,
    pub verifier: Verifier,
    /// The per-tenant request rate (none: unlimited).
    pub rate: Option<RateLimit>,
    /// Requests' worth of the tenant's quota that an explicit consolidation run costs.
    pub consolidation_run_cost: u32,
    pub metrics: Metrics,
    pub max_body_bytes: usize,
    /// The body limit of an import, which carries a whole user's memory.
    pub max_import_bytes: usize,
    pub metrics_require_auth: bool,
    /// The operator's scrape credential: the only one that reads per-tenant series.
    pub metrics_token: Option<String>,
    /// Whether the service answers over its own TLS: every answer then carries
    /// `Strict-Transport-Security`.
    pub strict_transport: bool,
    /// The MCP transport, built once and shared by every worker.
    pub mcp: StreamableHttpService<CairnMcp>,
    /// The HS256 secret console sessions are signed with (none: login links are off).
    pub login_secret: Option<String>,
}

impl AppState {
    pub fn new(
        cairn: Cairn,
        verifier: Verifier,
        rate_limit_per_second: u32,
        rate_limit_burst: u32,
        max_body_bytes: usize,
        metrics_require_auth: bool,
        mcp_allowed_hosts: Option<Vec<String>>,
    ) -> anyhow::Result<Self> {
        let mcp = crate::mcp::service(cairn.clone(), max_body_bytes, mcp_allowed_hosts);
        Ok(AppState {
            mcp,
            cairn,
            verifier,
            rate: RateLimit::new(rate_limit_per_second, rate_limit_burst),
            consolidation_run_cost: 10,
            metrics: Metrics::new()?,
            max_body_bytes,
            max_import_bytes: 64 * 1024 * 1024,
            metrics_require_auth,
            metrics_token: None,
            strict_transport: false,
            login_secret: None,
        })
    }

    /// Charges an explicit consolidation run (a synchronous ingest, `POST /consolidate`)
    /// against the tenant's quota: a run does the work of many requests.
    pub async fn charge_run(&self, tenant: &TenantLimits) -> Result<(), ApiError> {
        match &self.rate {
            Some(rate) => rate.admit(&self.cairn, tenant, self.consolidation_run_cost).await,
            None => Ok(()),
        }
    }

    /// Admits one request of `tenant`, or says how long to wait.
    async fn admit(&self, tenant: &TenantLimits) -> Result<(), ApiError> {
        match &self.rate {
            Some(rate) => rate.admit(&self.cairn, tenant, 1).await,
            None => Ok(()),
        }
    }
}

/// The id of the current request, stored in the request extensions by the middleware.
#[derive(Clone)]
pub struct RequestId(pub String);

/// A caller whose bearer token verified and who is within the tenant's rate limit.
pub struct Authenticated {
    pub principal: Principal,
    pub context: RequestContext,
}

impl Authenticated {
    /// The scope of `user` for an operation that needs `permission`.
    pub fn scope(&self, user: &str, permission: Permission) -> Result<Scope, ApiError> {
        Ok(self.principal.scope_for(user, permission)?)
    }

    /// The whole tenant, for admin reads across its users.
    pub fn tenant_scope(&self) -> Result<cairn_core::TenantScope, ApiError> {
        Ok(self.principal.tenant_scope()?)
    }

    /// The whole tenant, for a read across its users that needs `permission`.
    pub fn tenant_scope_for(&self, permission: Permission) -> Result<cairn_core::TenantScope, ApiError> {
        Ok(self.principal.tenant_scope_for(permission)?)
    }
}

/// Verifies the bearer token, applies the tenant's rate limit and records the tenant in
/// the request span. REST routes and the MCP endpoint share this one check.
pub async fn authenticate(request: &HttpRequest) -> Result<Authenticated, ApiError> {
    let state = request
        .app_data::<web::Data<AppState>>()
        .ok_or_else(|| ApiError::Core(cairn_core::Error::Storage("application state missing".into())))?;
    let header = request
        .headers()
        .get(actix_web::http::header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .ok_or(AuthError::Missing)?;
    let token = match header.split_once(' ') {
        Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty() => {
            token.trim()
        }
        _ => return Err(AuthError::Missing.into()),
    };
    let principal = state.verifier.verify_fresh(token).await?;
    tracing::Span::current().record("tenant", principal.tenant().as_str());
    state.admit(&principal.limits()).await?;
    let request_id = request
        .extensions()
        .get::<RequestId>()
        .map(|id| id.0.clone())
        .unwrap_or_else(crate::error::current_request_id);
    Ok(Authenticated {
        principal,
        context: RequestContext { request_id },
    })
}

impl FromRequest for Authenticated {
    type Error = ApiError;
    type Future = futures_util::future::LocalBoxFuture<'static, Result<Self, ApiError>>;

    fn from_request(request: &HttpRequest, _payload: &mut Payload) -> Self::Future {
        let request = request.clone();
        Box::pin(async move { authenticate(&request).await })
    }
}

fn valid_incoming_request_id(value: &HeaderValue) -> Option<String> {
    let text = value.to_str().ok()?;
    let valid = (1..=64).contains(&text.len())
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    valid.then(|| text.to_owned())
}

const REQUEST_ID_HEADER: &str = "x-request-id";

/// Gives each request an id (a valid incoming `X-Request-Id` is kept), a tracing span
/// with request id and tenant, a log line, and its metrics.
async fn request_middleware(
    request: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let request_id = request
        .headers()
        .get(REQUEST_ID_HEADER)
        .and_then(valid_incoming_request_id)
        .unwrap_or_else(|| new_id("req"));
    request.extensions_mut().insert(RequestId(request_id.clone()));
    // Only known methods are named, in the log and in the metrics alike.
    let method = crate::metrics::method_label(request.method());
    let route = request.match_pattern().unwrap_or_else(|| "unmatched".to_owned());
    let span = tracing::info_span!(
        "request",
        request_id = %request_id,
        method = %method,
        route = %route,
        tenant = tracing::field::Empty,
        trace_id = tracing::field::Empty,
    );
    // With tracing on, every log line of the request names its trace.
    let trace_id = {
        use opentelemetry::trace::TraceContextExt;
        use tracing_opentelemetry::OpenTelemetrySpanExt;
        span.context().span().span_context().trace_id()
    };
    if trace_id != opentelemetry::trace::TraceId::INVALID {
        span.record("trace_id", tracing::field::display(trace_id));
    }
    let state = request.app_data::<web::Data<AppState>>().cloned();
    let started = Instant::now();
    let mut response = REQUEST_ID
        .scope(request_id.clone(), next.call(request))
        .instrument(span.clone())
        .await?;
    let elapsed = started.elapsed();
    let status = response.status().as_u16();
    if let Ok(value) = HeaderValue::from_str(&request_id) {
        response
            .headers_mut()
            .insert(HeaderName::from_static(REQUEST_ID_HEADER), value);
    }
    if state.as_ref().is_some_and(|state| state.strict_transport) {
        response.headers_mut().insert(
            actix_web::http::header::STRICT_TRANSPORT_SECURITY,
            HeaderValue::from_static("max-age=31536000"),
        );
    }
    if let Some(state) = state {
        state
            .metrics
            .observe_request(&route, method, status, elapsed.as_secs_f64());
    }
    span.in_scope(|| {
        tracing::info!(
            status,
            latency_ms = elapsed.as_secs_f64() * 1000.0,
            "request completed"
        );
    });
    Ok(response)
}

/// Registers every route, the shared state and the input error handlers.
pub fn configure(state: web::Data<AppState>) -> impl FnOnce(&mut web::ServiceConfig) {
    move |config: &mut web::ServiceConfig| {
        let limit = state.max_body_bytes;
        crate::mcp::register(config, &state);
        config
            .app_data(state)
            .app_data(
                web::JsonConfig::default()
                    .limit(limit)
                    .error_handler(move |error, _| json_error(error, limit).into()),
            )
            .app_data(web::QueryConfig::default().error_handler(|error, _| {
                ApiError::Malformed(format!("the query string is not valid: {error}")).into()
            }))
            .app_data(web::PathConfig::default().error_handler(|error, _| {
                ApiError::Malformed(format!("the path is not valid: {error}")).into()
            }))
            .configure(routes::register);
    }
}

/// The whole application, as served and as tested in process.
pub fn app(
    state: web::Data<AppState>,
) -> actix_web::App<
    impl actix_web::dev::ServiceFactory<
        ServiceRequest,
        Config = (),
        Response = ServiceResponse<impl MessageBody>,
        Error = actix_web::Error,
        InitError = (),
    >,
> {
    actix_web::App::new()
        .configure(configure(state))
        .wrap(from_fn(request_middleware))
}
