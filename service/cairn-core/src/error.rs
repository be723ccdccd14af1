//! The error type shared by the domain, the use cases and every store adapter.

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
    Conflict { code: &'static str, message: String },
    /// The value matches a tombstone of this scope: it was retracted or forgotten.
    #[error("this value was retracted or forgotten in this scope")]
    Tombstoned { tombstone_id: String },
    /// The credential lacks a permission the operation needs.
    #[error("{message}")]
    Forbidden { code: &'static str, message: String },
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
        code: &'static str,
        message: String,
        retry_after_seconds: u64,
    },
}

impl Error {
    /// A stable snake_case code, part of the public contract.
    pub fn code(&self) -> &'static str {
        match self {
            Error::Invalid { .. } => "invalid_request",
            Error::NotFound { .. } => "not_found",
            Error::Conflict { code, .. } => code,
            Error::Tombstoned { .. } => "tombstoned",
            Error::Forbidden { code, .. } => code,
            Error::Storage(_) => "internal_error",
            Error::Unavailable(_) => "unavailable",
            Error::Provider(_) => "provider_error",
            Error::QuotaExhausted { code, .. } => code,
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
            code: "evidence_erased",
            message: format!("episode {episode_id} was erased; what was derived from it is not written"),
        }
    }

    /// An active fact of the scope already holds the value being written.
    pub fn duplicate() -> Self {
        Error::Conflict {
            code: "duplicate",
            message: "an active fact with the same normalized text exists".into(),
        }
    }

    pub fn not_active(what: &str) -> Self {
        Error::Conflict {
            code: "not_active",
            message: format!("{what} is no longer active"),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
