//! The inspector console at `/ui`: a dependency-free page set embedded in the binary,
//! talking to the public REST API only. Served with a Content-Security-Policy that
//! admits the page's own script and style and nothing inline.

use crate::auth::{self, AuthError};
use crate::error::ApiError;
use crate::http::AppState;
use crate::wire;
use actix_web::http::header::{self, HeaderValue};
use actix_web::{HttpResponse, web};

const INDEX: &str = include_str!("../ui/index.html");
const SCRIPT: &str = include_str!("../ui/app.js");
const STYLE: &str = include_str!("../ui/app.css");

/// Only the page's own files, no inline script or style, no framing, and requests only
/// to this origin.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

fn asset(content_type: &'static str, body: &'static str) -> HttpResponse {
    let mut response = HttpResponse::Ok()
        .content_type(content_type)
        .insert_header((
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ))
        .insert_header((header::REFERRER_POLICY, HeaderValue::from_static("no-referrer")))
        .insert_header((header::CACHE_CONTROL, HeaderValue::from_static("no-cache")))
        // Browsers older than `frame-ancestors` honour this instead.
        .insert_header((header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")))
        .body(body);
    response.headers_mut().insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    response
}

async fn index() -> HttpResponse {
    asset("text/html; charset=utf-8", INDEX)
}

async fn script() -> HttpResponse {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

async fn style() -> HttpResponse {
    asset("text/css; charset=utf-8", STYLE)
}

/// Redeems a login ticket (from `cairn token mint --ui`) for a console session token:
/// once, within its two minutes.
async fn session(
    state: web::Data<AppState>,
    body: web::Json<wire::Object<wire::LoginBody>>,
) -> Result<HttpResponse, ApiError> {
    let claims = state.verifier.login_ticket(&body.ticket)?;
    let Some(secret) = state.login_secret.as_deref() else {
        return Err(cairn_core::Error::invalid(
            "ticket",
            "login links need the server's HS256 secret (CAIRN_JWT_SECRET); paste a token instead",
        )
        .into());
    };
    let jti = claims.jti.clone().unwrap_or_default();
    // Once across every replica sharing the store, for as long as the ticket verifies
    // (its expiry plus the clock leeway).
    let verifies_until = chrono::DateTime::from_timestamp(state.verifier.accepted_until(&claims), 0)
        .unwrap_or_else(chrono::Utc::now);
    if !state
        .cairn
        .use_once(&format!("ui-login:{jti}"), verifies_until)
        .await?
    {
        return Err(AuthError::Invalid("this login ticket was already used".into()).into());
    }
    let (token, expires) = auth::mint_session(&claims, secret)
        .map_err(|error| ApiError::Core(cairn_core::Error::Storage(format!("minting a session: {error}"))))?;
    tracing::info!(tenant = %claims.tenant, subject = %claims.sub, "console login ticket redeemed");
    let expires_at = chrono::DateTime::from_timestamp(expires, 0).unwrap_or_else(chrono::Utc::now);
    // The answer is a bearer token: no cache may keep it.
    Ok(HttpResponse::Ok()
        .insert_header((header::CACHE_CONTROL, HeaderValue::from_static("no-store")))
        .insert_header((header::PRAGMA, HeaderValue::from_static("no-cache")))
        .json(wire::LoginResponse {
            token,
            expires_at: wire::Timestamp(expires_at),
        }))
}

pub fn register(config: &mut web::ServiceConfig) {
    config
        .route("/ui/session", web::post().to(session))
        .route("/ui", web::get().to(index))
        .route("/ui/", web::get().to(index))
        .route("/ui/assets/app.js", web::get().to(script))
        .route("/ui/assets/app.css", web::get().to(style));
}
