//! The error type shared by the domain, the use cases and every store adapter.

/// Separates the general statement of an unavailable store's error from the specifics
/// that only the operator sees (see [`Error::public_detail`]).
pub const SPECIFICS: &str = " — ";

/// The closed set of machine codes an error carries, part of the public contract.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    InvalidRequest,
    NotFound,
    Tombstoned,
    InternalError,
    Unavailable,
    ProviderError,
    EvidenceErased,
    Duplicate,
    NotActive,
    ScopeNotEmpty,
    VersionConflict,
    TokenBudgetExhausted,
    ScopeErased,
    MappingMismatch,
    WatermarkMoved,
    StoreInUse,
    InsufficientScope,
    UserMismatch,
    MissingToken,
    TokenExpired,
    InvalidToken,
    RateLimited,
    PayloadTooLarge,
    RouteNotFound,
    MethodNotAllowed,
    // A review was already approved or rejected.
    ReviewResolved,
    // A review's change no longer applies: what it would change moved on meanwhile.
    ReviewStale,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidRequest => "invalid_request",
            ErrorCode::NotFound => "not_found",
            ErrorCode::Tombstoned => "tombstoned",
            ErrorCode::InternalError => "internal_error",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::ProviderError => "provider_error",
            ErrorCode::EvidenceErased => "evidence_erased",
            ErrorCode::Duplicate => "duplicate",
            ErrorCode::NotActive => "not_active",
            ErrorCode::ScopeNotEmpty => "scope_not_empty",
            ErrorCode::VersionConflict => "version_conflict",
            ErrorCode::TokenBudgetExhausted => "token_budget_exhausted",
            ErrorCode::ScopeErased => "scope_erased",
            ErrorCode::MappingMismatch => "mapping_mismatch",
            ErrorCode::WatermarkMoved => "watermark_moved",
            ErrorCode::StoreInUse => "store_in_use",
            ErrorCode::InsufficientScope => "insufficient_scope",
            ErrorCode::UserMismatch => "user_mismatch",
            ErrorCode::MissingToken => "missing_token",
            ErrorCode::TokenExpired => "token_expired",
            ErrorCode::InvalidToken => "invalid_token",
            ErrorCode::RateLimited => "rate_limited",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::RouteNotFound => "route_not_found",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::ReviewResolved => "review_resolved",
            ErrorCode::ReviewStale => "review_stale",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(self.as_str())
    }
}

impl PartialEq<&str> for ErrorCode {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// Every failure a use case can report. Each variant has a stable machine code
/// (see [`Error::code`]) that the server maps to exactly one HTTP status.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Input failed validation; `field` names the offending input.
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    /// The record does not exist in the caller's scope (it may exist elsewhere;
    /// that is never revealed).
    #[error("{what} not found")]
    NotFound { what: &'static str },
    /// The record exists but is no longer in the state the operation requires.
    #[error("{message}")]
    Conflict { code: ErrorCode, message: String },
    /// The value matches a tombstone of this scope: it was retracted or forgotten.
    #[error("this value was retracted or forgotten in this scope")]
    Tombstoned { tombstone_id: String },
    /// The credential lacks a permission the operation needs.
    #[error("{message}")]
    Forbidden { code: ErrorCode, message: String },
    /// The storage backend failed; the message is for logs, never for clients.
    #[error("storage failure: {0}")]
    Storage(String),
    /// The storage backend is not reachable right now.
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// A model provider (LLM, remote reranker) failed or answered unusably.
    #[error("model provider failure: {0}")]
    Provider(String),
    /// A quota of the tenant is spent until a known time (the LLM token budget).
    #[error("{message}")]
    QuotaExhausted {
        code: ErrorCode,
        message: String,
        retry_after_seconds: u64,
    },
}

impl Error {
    /// A stable snake_case code, part of the public contract.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::Invalid { .. } => ErrorCode::InvalidRequest,
            Error::NotFound { .. } => ErrorCode::NotFound,
            Error::Conflict { code, .. }
            | Error::Forbidden { code, .. }
            | Error::QuotaExhausted { code, .. } => *code,
            Error::Tombstoned { .. } => ErrorCode::Tombstoned,
            Error::Storage(_) => ErrorCode::InternalError,
            Error::Unavailable(_) => ErrorCode::Unavailable,
            Error::Provider(_) => ErrorCode::ProviderError,
        }
    }

    /// What went wrong, for an operator: the message, without the "storage unavailable"
    /// prefix an `Unavailable` error's display adds (readiness reports and store
    /// statuses report the reason itself).
    pub fn detail(&self) -> String {
        match self {
            Error::Unavailable(reason) => reason.clone(),
            other => other.to_string(),
        }
    }

    /// [`Error::detail`] without the specifics a backend adds after [`SPECIFICS`] (the
    /// cluster's own refusal text, with its accounts, realms and host names): what is
    /// wrong in general terms, for a caller who is not the operator.
    pub fn public_detail(&self) -> String {
        let detail = self.detail();
        match detail.split_once(SPECIFICS) {
            Some((general, _)) => general.to_owned(),
            None => detail,
        }
    }

    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Invalid {
            field: field.into(),
            message: message.into(),
        }
    }

    /// An episode a change was derived from is no longer stored (the scope was erased
    /// while the change was being prepared).
    pub fn evidence_erased(episode_id: &str) -> Self {
        Error::Conflict {
            code: ErrorCode::EvidenceErased,
            message: format!("episode {episode_id} was erased; what was derived from it is not written"),
        }
    }

    /// The scope was erased after the operation read what it writes from: nothing of
    /// it is written (an erasure fences every write that began before it).
    pub fn scope_erased() -> Self {
        Error::Conflict {
            code: ErrorCode::ScopeErased,
            message: "the user's memory was erased while this change was being made; nothing was written"
                .into(),
        }
    }

    /// Another import into the scope holds its claim.
    pub fn import_under_way() -> Self {
        Error::Conflict {
            code: ErrorCode::ScopeNotEmpty,
            message: "another import into this user is under way".into(),
        }
    }

    /// An active fact of the scope already holds the value being written.
    pub fn duplicate() -> Self {
        Error::Conflict {
            code: ErrorCode::Duplicate,
            message: "an active fact with the same normalized text exists".into(),
        }
    }

    pub fn review_resolved(review_id: &str) -> Self {
        Error::Conflict {
            code: ErrorCode::ReviewResolved,
            message: format!("review {review_id} was already decided"),
        }
    }

    pub fn not_active(what: &str) -> Self {
        Error::Conflict {
            code: ErrorCode::NotActive,
            message: format!("{what} is no longer active"),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
