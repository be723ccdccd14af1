"""Errors as exceptions: each carries the HTTP status, Cairn's error code and the id of
the request to quote when reporting it."""

from __future__ import annotations

from typing import Dict, Optional, Type


class CairnError(Exception):
    """Any error answer of the service (or a transport failure, with status 0)."""

    def __init__(self, status: int, code: str, message: str, request_id: Optional[str] = None,
                 retry_after: Optional[float] = None):
        super().__init__(f"{status} {code}: {message}" + (f" (request {request_id})" if request_id else ""))
        self.status = status
        self.code = code
        self.message = message
        self.request_id = request_id
        self.retry_after = retry_after


class AuthenticationError(CairnError):
    """401: the token is missing, invalid or expired."""


class PermissionDeniedError(CairnError):
    """403: the token lacks the scope, or is bound to another user."""


class NotFoundError(CairnError):
    """404: no such record in this scope (or no such route)."""


class ConflictError(CairnError):
    """409: not active, tombstoned, or a version or watermark moved."""


class PayloadTooLargeError(CairnError):
    """413: the body exceeds the server's limit."""


class InvalidRequestError(CairnError):
    """422: malformed or invalid input; nothing was changed."""


class RateLimitError(CairnError):
    """429: the tenant's rate limit or token budget; see `retry_after`."""


class ProviderError(CairnError):
    """502: the model provider failed; stored episodes are consolidated later."""


class UnavailableError(CairnError):
    """503: the store is unavailable; retry later."""


class ServerError(CairnError):
    """500 and other server errors; quote the request id."""


class ConnectionFailed(CairnError):
    """The service could not be reached at all."""


BY_STATUS: Dict[int, Type[CairnError]] = {
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    405: NotFoundError,
    409: ConflictError,
    413: PayloadTooLargeError,
    422: InvalidRequestError,
    429: RateLimitError,
    502: ProviderError,
    503: UnavailableError,
}


def error_for(status: int, body: object, request_id: Optional[str], retry_after: Optional[float]) -> CairnError:
    """The exception for an error answer, from its `{"error": {...}}` body when it has one."""
    code, message = "http_error", f"HTTP {status}"
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        detail = body["error"]
        code = str(detail.get("code", code))
        message = str(detail.get("message", message))
        request_id = detail.get("request_id") or request_id
    kind = BY_STATUS.get(status, ServerError if status >= 500 else CairnError)
    return kind(status, code, message, request_id, retry_after)
