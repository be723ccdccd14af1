//! The one mapping from errors to HTTP responses, with the stable JSON error shape
//! `{"error":{"code","message","request_id"}}`.

use crate::auth::AuthError;
use crate::wire::{ErrorDetail, ErrorResponse};
use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderValue};
use actix_web::{HttpResponse, ResponseError};
use cairn_core::ErrorCode;

tokio::task_local! {
    /// The id of the request being served, set by the request middleware so that every
    /// error response can carry it.
    pub static REQUEST_ID: String;
}

/// The request id of the current request, or `unknown` outside one.
pub fn current_request_id() -> String {
    REQUEST_ID
        .try_with(Clone::clone)
        .unwrap_or_else(|_| "unknown".to_owned())
}

/// Every error a route can answer with.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error(transparent)]
    Core(#[from] cairn_core::Error),
    #[error(transparent)]
    Auth(#[from] AuthError),
    #[error("rate limit exceeded for this tenant")]
    RateLimited { retry_after_seconds: u64 },
    #[error("the request body exceeds the limit of {limit} bytes")]
    PayloadTooLarge { limit: usize },
    /// The body, query or path could not be read (bad JSON, unknown field, wrong type).
    #[error("{0}")]
    Malformed(String),
    #[error("no such route")]
    RouteNotFound,
    #[error("this route does not answer this method; it answers {allow}")]
    MethodNotAllowed { allow: String },
}

impl ApiError {
    /// Status, stable code and client-facing message. Exhaustive on purpose: a new
    /// error variant must decide here how it is shown.
    pub fn parts(&self) -> (StatusCode, ErrorCode, String) {
        use cairn_core::Error as Core;
        match self {
            ApiError::Core(error) => {
                let status = match error {
                    Core::Invalid { .. } => StatusCode::UNPROCESSABLE_ENTITY,
                    Core::NotFound { .. } => StatusCode::NOT_FOUND,
                    Core::Conflict { .. } | Core::Tombstoned { .. } => StatusCode::CONFLICT,
                    Core::Forbidden { .. } => StatusCode::FORBIDDEN,
                    Core::Storage(_) => StatusCode::INTERNAL_SERVER_ERROR,
                    Core::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
                    Core::Provider(_) => StatusCode::BAD_GATEWAY,
                    Core::QuotaExhausted { .. } => StatusCode::TOO_MANY_REQUESTS,
                };
                let message = match error {
                    Core::Storage(_) => {
                        "an internal error occurred; quote the request id when reporting it".to_owned()
                    }
                    Core::Unavailable(_) => "the store is unavailable; retry later".to_owned(),
                    Core::Provider(_) => {
                        "the model provider failed; the episodes are stored and consolidation will retry"
                            .to_owned()
                    }
                    Core::Invalid { .. }
                    | Core::QuotaExhausted { .. }
                    | Core::NotFound { .. }
                    | Core::Conflict { .. }
                    | Core::Tombstoned { .. }
                    | Core::Forbidden { .. } => error.to_string(),
                };
                (status, error.code(), message)
            }
            ApiError::Auth(error) => (StatusCode::UNAUTHORIZED, error.code(), error.to_string()),
            ApiError::RateLimited { .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                ErrorCode::RateLimited,
                self.to_string(),
            ),
            ApiError::PayloadTooLarge { .. } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                ErrorCode::PayloadTooLarge,
                self.to_string(),
            ),
            ApiError::Malformed(message) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                ErrorCode::InvalidRequest,
                message.clone(),
            ),
            ApiError::RouteNotFound => (StatusCode::NOT_FOUND, ErrorCode::RouteNotFound, self.to_string()),
            ApiError::MethodNotAllowed { .. } => (
                StatusCode::METHOD_NOT_ALLOWED,
                ErrorCode::MethodNotAllowed,
                self.to_string(),
            ),
        }
    }

    /// The error as clients see it, over REST and MCP alike; server-side failures are
    /// logged here, once, with the request id.
    pub fn report(&self, request_id: &str) -> (StatusCode, ErrorResponse) {
        let (status, code, message) = self.parts();
        if status.is_server_error() {
            tracing::error!(request_id = %request_id, code = code.as_str(), error = %self, "request failed");
        }
        let body = ErrorResponse {
            error: ErrorDetail {
                code,
                message,
                request_id: request_id.to_owned(),
            },
        };
        (status, body)
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.parts().0
    }

    fn error_response(&self) -> HttpResponse {
        let (status, body) = self.report(&current_request_id());
        let mut response = HttpResponse::build(status);
        match self {
            ApiError::Auth(_) => {
                response.insert_header((
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"cairn\""),
                ));
            }
            ApiError::RateLimited { retry_after_seconds }
            | ApiError::Core(cairn_core::Error::QuotaExhausted {
                retry_after_seconds, ..
            }) => {
                response.insert_header((header::RETRY_AFTER, retry_after_seconds.to_string()));
            }
            ApiError::MethodNotAllowed { allow } => {
                response.insert_header((header::ALLOW, allow.clone()));
            }
            ApiError::Core(_)
            | ApiError::PayloadTooLarge { .. }
            | ApiError::Malformed(_)
            | ApiError::RouteNotFound => {}
        }
        response.json(body)
    }
}

/// Converts body-reading failures: an oversized body is a 413, anything else a 422.
pub fn json_error(error: actix_web::error::JsonPayloadError, limit: usize) -> ApiError {
    use actix_web::error::{JsonPayloadError, PayloadError};
    match error {
        JsonPayloadError::Overflow { .. } | JsonPayloadError::OverflowKnownLength { .. } => {
            ApiError::PayloadTooLarge { limit }
        }
        JsonPayloadError::Payload(PayloadError::Overflow) => ApiError::PayloadTooLarge { limit },
        JsonPayloadError::ContentType => {
            ApiError::Malformed("the body must be JSON with Content-Type: application/json".into())
        }
        JsonPayloadError::Deserialize(error) => {
            ApiError::Malformed(format!("the body is not valid: {error}"))
        }
        other => ApiError::Malformed(format!("the body could not be read: {other}")),
    }
}
