"""The domain error tree. Translated to HTTP only in ``api/errors.py``.

Each class carries its HTTP status and a machine-readable ``code`` (the stable vocabulary of
``docs/api.md`` "Errors"); the body is ``{"error": message, "code": code}``.

DomainError
├── BadRequest          (400, bad_request) malformed or contradictory input
├── Unauthorized        (401, unauthorized) missing or unknown credential
├── Forbidden           (403, forbidden) authenticated but not allowed
├── NotFound            (404, not_found) missing, or not visible to the caller
├── Conflict            (409, conflict) lost a race, duplicate, not pending
├── Unprocessable       (422, unprocessable) semantically invalid (policy, harness, model)
├── TooBusy             (429, too_busy) a limit on concurrent work was reached; retry
├── UpstreamFailed      (502, upstream_failed) an upstream (MCP server, authorization server) failed
├── Unavailable         (503, unavailable) a dependency is down; retry
└── InvalidTransition   (409, invalid_transition) a run status edge the state machine forbids
"""

from __future__ import annotations

from typing import ClassVar, TypeVar

T = TypeVar("T")


class DomainError(Exception):
    status: ClassVar[int] = 400
    code: ClassVar[str | None] = "bad_request"

    def __init__(self, message: str, **details: str) -> None:
        super().__init__(message)
        self.message = message
        # Machine-readable facts that go into the error body beside "error" (e.g. a run's terminal state).
        self.details = details


class BadRequest(DomainError):
    status = 400


class Unauthorized(DomainError):
    status = 401
    code = "unauthorized"

    def __init__(self, message: str = "unauthorized") -> None:
        super().__init__(message)


class Forbidden(DomainError):
    status = 403
    code = "forbidden"


class NotFound(DomainError):
    status = 404
    code = "not_found"

    def __init__(self, message: str = "not found") -> None:
        super().__init__(message)


def found(value: T | None, message: str = "not found") -> T:
    """``value``, or :class:`NotFound` (``message``) when a lookup found nothing."""
    if value is None:
        raise NotFound(message)
    return value


class Conflict(DomainError):
    status = 409
    code = "conflict"


class Unprocessable(DomainError):
    status = 422
    code = "unprocessable"


class TooBusy(DomainError):
    """Retry later: a limit on concurrent work was reached (nothing was changed)."""

    status = 429
    code = "too_busy"


class UpstreamFailed(DomainError):
    status = 502
    code = "upstream_failed"


class Unavailable(DomainError):
    status = 503
    code = "unavailable"


class InvalidTransition(DomainError):
    status = 409
    code = "invalid_transition"


class GrantLost(UpstreamFailed):
    """The authorization server no longer honours the connection's grant (``invalid_grant``); ``.reason`` is
    the provider's explanation. The connection is now ``error``: reconnect to fix it."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"the OAuth grant of this connection was refused by its authorization server: {reason}")
        self.reason = reason
