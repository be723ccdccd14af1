"""Python client for Cairn, the multi-tenant memory service for AI agents."""

from ._client import DEFAULT_URL, AsyncCairn, Cairn
from ._errors import (
    AuthenticationError,
    CairnError,
    ConflictError,
    ConnectionFailed,
    InvalidRequestError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    ProviderError,
    RateLimitError,
    ServerError,
    UnavailableError,
)
from ._models import (
    AuditEvent,
    Answer,
    Consolidation,
    Entity,
    EntitySummary,
    Decision,
    Episode,
    ErasureReceipt,
    Explanation,
    Fact,
    FactWrite,
    ImportResult,
    IngestResult,
    Job,
    Playbook,
    Profile,
    RecallHit,
    RecallResult,
    Review,
    ReviewCounts,
    ReviewDecision,
    Tombstone,
    UserSummary,
)

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_URL", "AsyncCairn", "Cairn",
    "AuthenticationError", "CairnError", "ConflictError", "ConnectionFailed", "InvalidRequestError",
    "NotFoundError", "PayloadTooLargeError", "PermissionDeniedError", "ProviderError", "RateLimitError",
    "ServerError", "UnavailableError",
    "Answer", "AuditEvent", "Consolidation", "Entity", "EntitySummary", "Decision", "Episode", "ErasureReceipt", "Explanation", "Fact", "FactWrite",
    "ImportResult", "IngestResult", "Job", "Playbook", "Profile", "RecallHit", "RecallResult",
    "Review", "ReviewCounts", "ReviewDecision", "Tombstone", "UserSummary",
]
