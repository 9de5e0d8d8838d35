"""The domain error tree. Translated to HTTP only in ``api/errors.py``.

DomainError
├── BadRequest          (400) malformed or contradictory input
├── Unauthorized        (401) missing or unknown credential
├── Forbidden           (403) authenticated but not allowed
├── NotFound            (404) missing, or not visible to the caller
├── Conflict            (409) lost a race, duplicate, not pending
├── Unprocessable       (422) semantically invalid (policy, harness, model)
├── UpstreamFailed      (502) an upstream (MCP server, authorization server) failed
├── Unavailable         (503) a dependency is down; retry
└── InvalidTransition   (409) a run status edge the state machine forbids
"""

from __future__ import annotations


class DomainError(Exception):
    status: int = 400

    def __init__(self, message: str, **details: str) -> None:
        super().__init__(message)
        self.message = message
        # Machine-readable facts that go into the error body beside "error" (e.g. a run's terminal state).
        self.details = details


class BadRequest(DomainError):
    status = 400


class Unauthorized(DomainError):
    status = 401

    def __init__(self, message: str = "unauthorized") -> None:
        super().__init__(message)


class Forbidden(DomainError):
    status = 403


class NotFound(DomainError):
    status = 404

    def __init__(self, message: str = "not found") -> None:
        super().__init__(message)


class Conflict(DomainError):
    status = 409


class Unprocessable(DomainError):
    status = 422


class TooBusy(DomainError):
    """Retry later: a limit on concurrent work was reached (nothing was changed)."""

    status = 429


class UpstreamFailed(DomainError):
    status = 502


class Unavailable(DomainError):
    status = 503


class InvalidTransition(DomainError):
    status = 409


class GrantLost(UpstreamFailed):
    """The authorization server no longer honours the connection's grant (``invalid_grant``); ``.reason`` is
    the provider's explanation. The connection is now ``error``: reconnect to fix it."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"the OAuth grant of this connection was refused by its authorization server: {reason}")
        self.reason = reason
