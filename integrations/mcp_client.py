"""The broker's MCP client: photograph a server's tool surface, execute one brokered tool call.

Both operations run in the control plane (never in the sandbox) over Streamable HTTP with the
legacy ``initialize`` handshake, offering protocol ``2025-11-25`` and accepting a server that
negotiates ``2025-11-25`` or ``2025-06-18`` (domain.md §9). Every operation opens its own
short-lived MCP session: connect, initialize, act, close (DELETE).

Exceptions (raised by :func:`photograph`; :func:`call_tool` never raises for upstream trouble,
it classifies it into a :class:`CallOutcome`)::

    McpClientError              anything else that went wrong talking to the server
    ├── Unreachable             connection refused, DNS failure, no answer to initialize in time
    ├── AuthRejected            the server answered HTTP 401/403
    ├── UnsupportedProtocol     negotiated version outside {2025-11-25, 2025-06-18}
    └── PaginationError         tools/list exceeded max_pages, repeated a cursor or a tool name

``call_tool`` outcomes (the four-state execution claim, domain.md §9):

- ``failed_before_send`` — positive proof the ``tools/call`` was never sent: connect refused /
  DNS failure, initialize refused (auth, HTTP error, JSON-RPC error, timeout), unsupported
  protocol, protocol drift against the frozen snapshot. The only re-claimable state.
- ``succeeded`` — a tool result without ``isError``.
- ``failed_upstream`` — definitive upstream failure: a tool result with ``isError`` (kept as
  is), a JSON-RPC error response, or an HTTP 4xx answer to the ``tools/call`` POST. For the
  last two the result is synthesized as ``{"content": [text], "is_error": true}`` so every
  definitive outcome carries a runner-facing result.
- ``ambiguous`` — the request went out and the outcome is unknown: timeout, connection
  dropped mid-response, HTTP 5xx without a JSON-RPC body, a malformed result. Never retried.

The mcp SDK (2.x) turns transport trouble into synthetic JSON-RPC errors that look like the
server's own (``-32000 "SSE stream ended without a response"``, ``-32603 "Server returned an
error response"``…) and drops the HTTP status. This module therefore watches HTTP statuses
through an ``httpx2`` response hook and recognizes the SDK's stand-in errors, so a dropped
connection is ``ambiguous`` and only a real server error is ``failed_upstream``.

Pinning: given ``pin`` (the :class:`~integrations.urls.AdmittedUrl` the caller just got for the
URL), every request connects to one of the admitted addresses, keeping the original ``Host`` and
TLS server name, and a request for any other origin is refused (:mod:`integrations.pinning`);
without it the HTTP client resolves the name again when it connects.

Credentials: header values are only ever handed to the HTTP client; no message, log line or
exception produced here contains them, and URLs are shown without userinfo or query string.
"""

from __future__ import annotations

import functools
import json
import logging
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

import anyio
import httpx2
from mcp import types
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from core.digests import document_digest
from integrations.pinning import PinnedTransport
from integrations.urls import AdmittedUrl

__all__ = [
    "ACCEPTED_PROTOCOLS",
    "OFFERED_PROTOCOL",
    "AuthRejected",
    "CallOutcome",
    "McpClientError",
    "Outcome",
    "PaginationError",
    "Photograph",
    "Unreachable",
    "UnsupportedProtocol",
    "call_tool",
    "drift_message",
    "photograph",
]

logger = logging.getLogger(__name__)

OFFERED_PROTOCOL = "2025-11-25"
ACCEPTED_PROTOCOLS: frozenset[str] = frozenset({"2025-11-25", "2025-06-18"})
CLIENT_INFO = types.Implementation(name="fluidbox-broker", version="0.1.0")

# Once an operation has its answer, closing the session (DELETE + task teardown) gets this long at most.
_TEARDOWN_GRACE = 5.0
_ERROR_TEXT_LIMIT = 500

Outcome = Literal["succeeded", "failed_upstream", "failed_before_send", "ambiguous"]


# --------------------------------------------------------------------------------------------------------------------
# Errors


class McpClientError(Exception):
    """Talking to an MCP server failed (base class; messages never contain credentials)."""


class Unreachable(McpClientError):
    """The server could not be reached (refused, DNS, no answer to initialize in time)."""


class AuthRejected(McpClientError):
    """The server rejected the credential (HTTP 401/403)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class UnsendableHeaders(McpClientError):
    """A header value (the credential) is no valid HTTP header value: nothing was sent; bad input, not a failure
    of the server."""


def _unsendable(headers: dict[str, str]) -> str | None:
    for name, value in headers.items():
        if not all(" " <= ch <= "~" for ch in value):
            return f"the {name} header (the credential) is not printable ASCII and cannot be sent"
    return None


class UnsupportedProtocol(McpClientError):
    """The server negotiated a protocol version the broker does not accept."""

    def __init__(self, version: str) -> None:
        accepted = ", ".join(sorted(ACCEPTED_PROTOCOLS))
        super().__init__(f"server negotiates unsupported MCP protocol version {version!r} (accepted: {accepted})")
        self.version = version


class PaginationError(McpClientError):
    """``tools/list`` pagination did not converge; no partial tool set is ever returned."""


def drift_message(new: str, old: str) -> str:
    """The protocol-drift refusal text; ``{id}`` is left literal for the caller to fill."""
    return (
        f"mcp protocol drift: server now negotiates '{new}' but this run's frozen snapshot recorded '{old}'"
        " — run POST /v1/connections/{id}/tools/refresh to re-photograph"
    )


# --------------------------------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class Photograph:
    """A server's complete tool surface: tools ``{"name", "description", "input_schema"}`` sorted by name."""

    protocol_version: str
    tools: list[dict[str, Any]]

    @property
    def digest(self) -> str:
        """``sha256:`` + hex sha256 of the canonical JSON (sorted keys, compact) of ``tools``."""
        return document_digest(self.tools)


@dataclass(frozen=True)
class CallOutcome:
    """One brokered ``tools/call``: ``result`` is ``{"content", "is_error", "structured_content"?}``.

    ``result`` is set for ``succeeded`` and ``failed_upstream``; ``error`` is set for every
    outcome except ``succeeded``.
    """

    outcome: Outcome
    result: dict[str, Any] | None
    error: str | None
    auth_rejected: bool = False
    """The server answered HTTP 401 before running anything: the bearer token was not accepted (an OAuth
    caller refreshes it and tries once more)."""


# --------------------------------------------------------------------------------------------------------------------
# Plumbing


@dataclass
class _Wire:
    """HTTP statuses seen per JSON-RPC method (the SDK hides them behind synthetic errors)."""

    status: dict[str, int] = field(default_factory=dict)

    async def on_response(self, response: httpx2.Response) -> None:
        request = response.request
        if request.method != "POST":
            return
        try:
            body = json.loads(request.content)
        except (ValueError, httpx2.HTTPError):
            return
        if isinstance(body, dict) and isinstance(body.get("method"), str) and "id" in body:
            self.status[body["method"]] = response.status_code


def _safe_url(url: str) -> str:
    """``scheme://host[:port]/path`` — no userinfo, query or fragment (they may carry secrets)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        host = f"[{host}]" if ":" in host else host
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<invalid url>"
    if not parts.scheme or not parts.hostname:
        return "<invalid url>"
    return f"{parts.scheme}://{host}{port}{parts.path}"


def _clip(text: str) -> str:
    return text if len(text) <= _ERROR_TEXT_LIMIT else text[:_ERROR_TEXT_LIMIT] + "…"


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]


def _describe(exc: BaseException) -> str:
    """A credential-free description of a transport failure (type and message only)."""
    parts = []
    for leaf in _leaves(exc):
        text = str(leaf).strip()
        parts.append(f"{type(leaf).__name__}: {text}" if text else type(leaf).__name__)
    return _clip("; ".join(parts))


def _is_connect_failure(exc: BaseException) -> bool:
    """True when every leaf is a failure to establish the TCP/TLS connection (nothing was sent)."""
    leaves = _leaves(exc)
    return bool(leaves) and all(isinstance(leaf, httpx2.ConnectError | httpx2.ConnectTimeout) for leaf in leaves)


# (code, message prefix) of the errors the SDK's transport/dispatcher fabricate when no JSON-RPC
# answer was received (mcp/client/streamable_http.py, mcp/shared/jsonrpc_dispatcher.py).
_SDK_STANDINS: tuple[tuple[int, str], ...] = (
    (types.CONNECTION_CLOSED, "Connection closed"),
    (types.CONNECTION_CLOSED, "SSE stream"),
    (types.REQUEST_TIMEOUT, "Request "),
    (types.INTERNAL_ERROR, "Server returned an error response"),
    (types.INVALID_REQUEST, "Session terminated"),
    (types.INVALID_REQUEST, "server answered a request with 202 Accepted"),
    (types.INVALID_REQUEST, "Unexpected content type"),
    (types.INVALID_REQUEST, "Redirect to "),
    (types.METHOD_NOT_FOUND, "Not Found"),
    (types.PARSE_ERROR, "Failed to parse"),
)


def _is_sdk_standin(err: MCPError) -> bool:
    return any(err.code == code and err.message.startswith(prefix) for code, prefix in _SDK_STANDINS)


def _rpc_error_text(err: MCPError) -> str:
    return _clip(f"MCP error {err.code}: {err.message}")


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """One verifying TLS context per process: loading the CA bundle costs ~17 ms, on every call otherwise."""
    return ssl.create_default_context()


@asynccontextmanager
async def _open_session(
    url: str,
    headers: dict[str, str],
    timeout: float,
    wire: _Wire,
    pin: AdmittedUrl | None = None,
    tls: ssl.SSLContext | None = None,
) -> AsyncIterator[ClientSession]:
    # Read timeout is left to the caller's cancel scopes (each phase is bounded there); connect,
    # write and pool waits are bounded here. trust_env=False: no proxy or .netrc from the environment.
    # With a pin, every request connects to an address admission vetted and nothing is resolved again.
    http = httpx2.AsyncClient(
        headers=headers,
        timeout=httpx2.Timeout(timeout, read=None),
        event_hooks={"response": [wire.on_response]},
        trust_env=False,
        verify=tls or _tls_context(),
        transport=PinnedTransport(pin, verify=tls or _tls_context()) if pin is not None else None,
    )
    async with http, streamable_http_client(url, http_client=http) as (read, write):
        async with ClientSession(read, write, client_info=CLIENT_INFO) as session:
            yield session


async def _initialize(session: ClientSession) -> str:
    """The legacy handshake offering exactly ``OFFERED_PROTOCOL``; returns the negotiated version.

    Raises ``UnsupportedProtocol`` (before ``notifications/initialized``) or lets ``MCPError`` /
    ``ValidationError`` through for the caller to classify.
    """
    result = await session.send_request(
        types.InitializeRequest(
            params=types.InitializeRequestParams(
                protocol_version=OFFERED_PROTOCOL,
                capabilities=types.ClientCapabilities(),
                client_info=CLIENT_INFO,
            )
        ),
        types.InitializeResult,
    )
    if result.protocol_version not in ACCEPTED_PROTOCOLS:
        raise UnsupportedProtocol(result.protocol_version)
    session.adopt(result)
    await session.send_notification(types.InitializedNotification())
    return result.protocol_version


def _initialize_failure(err: MCPError | ValidationError, wire: _Wire, url: str) -> McpClientError:
    status = wire.status.get("initialize")
    if status in (401, 403):
        return AuthRejected(f"the server rejected the credential (HTTP {status}) at {_safe_url(url)}", status)
    if isinstance(err, ValidationError):
        return McpClientError(f"malformed initialize result from {_safe_url(url)}")
    if status is not None and status >= 400:
        return McpClientError(f"initialize refused with HTTP {status} at {_safe_url(url)}")
    if _is_sdk_standin(err):
        return Unreachable(f"initialize got no answer from {_safe_url(url)} ({err.message})")
    return McpClientError(f"initialize failed at {_safe_url(url)}: {_rpc_error_text(err)}")


# --------------------------------------------------------------------------------------------------------------------
# photograph


def _tool_json(tool: types.Tool) -> dict[str, Any]:
    schema = json.loads(json.dumps(tool.input_schema))  # plain JSON, detached from the model
    return {"name": tool.name, "description": tool.description or "", "input_schema": schema}


async def _list_all_tools(session: ClientSession, max_pages: int) -> list[dict[str, Any]]:
    tools: dict[str, dict[str, Any]] = {}
    seen: set[str] = set()
    cursor: str | None = None
    pages = 0
    while True:
        params = types.PaginatedRequestParams(cursor=cursor) if cursor is not None else None
        result = await session.list_tools(params=params)
        pages += 1
        for tool in result.tools:
            if tool.name in tools:
                raise PaginationError(f"tools/list returned tool {tool.name!r} twice (page {pages})")
            tools[tool.name] = _tool_json(tool)
        cursor = result.next_cursor
        if cursor is None:
            return [tools[name] for name in sorted(tools)]
        if cursor in seen:
            raise PaginationError(f"tools/list repeated a cursor after {pages} pages")
        if pages >= max_pages:
            raise PaginationError(f"tools/list did not finish within {max_pages} pages")
        seen.add(cursor)


async def photograph(
    url: str,
    headers: dict[str, str],
    *,
    timeout: float = 30.0,
    max_pages: int = 50,
    pin: AdmittedUrl | None = None,
    tls: ssl.SSLContext | None = None,
) -> Photograph:
    """Initialize (offering ``2025-11-25``) and list every tool across all ``tools/list`` pages.

    ``timeout`` bounds the whole operation (connect, initialize, every page); closing the
    session afterwards gets a few more seconds at most. ``pin`` (the admission of ``url``)
    makes every request connect to its vetted addresses only (see :mod:`integrations.pinning`).
    Raises a :class:`McpClientError`.
    """
    if (unsendable := _unsendable(headers)) is not None:
        raise UnsendableHeaders(unsendable)
    wire = _Wire()
    photo: Photograph | None = None
    failure: McpClientError | None = None
    initialized = False
    # Exceptions raised inside the session's task groups come out wrapped in ExceptionGroups,
    # so failures are recorded here and raised after the session has closed.
    try:
        with anyio.CancelScope(deadline=anyio.current_time() + timeout) as bound:
            async with _open_session(url, headers, timeout, wire, pin, tls) as session:
                try:
                    version = await _initialize(session)
                    initialized = True
                    photo = Photograph(protocol_version=version, tools=await _list_all_tools(session, max_pages))
                except McpClientError as exc:
                    failure = exc
                except (MCPError, ValidationError) as exc:
                    if not initialized:
                        failure = _initialize_failure(exc, wire, url)
                    elif wire.status.get("tools/list") in (401, 403):
                        status = wire.status["tools/list"]
                        text = f"the server rejected the credential (HTTP {status}) on tools/list"
                        failure = AuthRejected(text, status)
                    elif isinstance(exc, ValidationError):
                        failure = McpClientError(f"malformed tools/list result from {_safe_url(url)}")
                    else:
                        failure = McpClientError(f"tools/list failed at {_safe_url(url)}: {_rpc_error_text(exc)}")
                bound.deadline = anyio.current_time() + min(timeout, _TEARDOWN_GRACE)
    except Exception as exc:
        if photo is not None:
            logger.debug("mcp session teardown failed after a complete photograph: %s", _describe(exc))
            return photo
        if failure is None:
            if not initialized:
                failure = Unreachable(f"cannot reach MCP server at {_safe_url(url)}: {_describe(exc)}")
            else:
                failure = McpClientError(f"MCP connection to {_safe_url(url)} failed: {_describe(exc)}")
    if photo is not None:
        return photo
    if failure is not None:
        raise failure
    if not initialized:
        raise Unreachable(f"MCP server at {_safe_url(url)} did not complete initialize within {timeout}s")
    raise McpClientError(f"tools/list at {_safe_url(url)} did not complete within {timeout}s")


# --------------------------------------------------------------------------------------------------------------------
# call_tool


def _result_json(result: types.CallToolResult) -> dict[str, Any]:
    out: dict[str, Any] = {
        "content": [block.model_dump(mode="json", by_alias=True, exclude_none=True) for block in result.content],
        "is_error": bool(result.is_error),
    }
    if result.structured_content is not None:
        out["structured_content"] = json.loads(json.dumps(result.structured_content))
    return out


def _synthetic_error_result(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "is_error": True}


def _first_text(result: types.CallToolResult) -> str:
    for block in result.content:
        if isinstance(block, types.TextContent):
            return _clip(block.text)
    return ""


def _classify_call_error(err: MCPError, wire: _Wire, name: str) -> CallOutcome:
    status = wire.status.get("tools/call")
    if not _is_sdk_standin(err):
        text = _rpc_error_text(err)
        return CallOutcome("failed_upstream", _synthetic_error_result(text), f"tools/call {name!r} failed: {text}")
    if status is not None and 400 <= status < 500:
        text = f"server refused tools/call with HTTP {status}"
        return CallOutcome(
            "failed_upstream",
            _synthetic_error_result(text),
            f"tools/call {name!r}: {text}",
            auth_rejected=status == 401,
        )
    if status is not None and status >= 500:
        return CallOutcome("ambiguous", None, f"tools/call {name!r} answered HTTP {status} — outcome unknown")
    return CallOutcome("ambiguous", None, f"tools/call {name!r} lost its answer ({err.message}) — outcome unknown")


def _before_send(error: str) -> CallOutcome:
    return CallOutcome("failed_before_send", None, error)


async def call_tool(
    url: str,
    headers: dict[str, str],
    name: str,
    arguments: dict[str, Any],
    *,
    expected_protocol: str | None,
    timeout: float = 30.0,
    pin: AdmittedUrl | None = None,
    tls: ssl.SSLContext | None = None,
) -> CallOutcome:
    """Execute one ``tools/call`` in a fresh session and classify the outcome (never raises for upstream trouble).

    ``expected_protocol`` is the frozen snapshot's version; a server now negotiating anything
    else is refused before the call is sent (the drift message keeps ``{id}`` literal).
    ``timeout`` bounds initialize and, separately, the ``tools/call`` itself. ``pin`` (the
    admission of ``url``) makes every request connect to its vetted addresses only; without it
    the name is resolved again at connect time. ``tls``: the context that verifies the server
    (default: the system's trust store), e.g. one trusting a device relay's own CA.
    """
    if (unsendable := _unsendable(headers)) is not None:
        return _before_send(unsendable)
    wire = _Wire()
    outcome: CallOutcome | None = None
    sent = False  # the tools/call request has been handed to the transport
    try:
        with anyio.CancelScope(deadline=anyio.current_time() + 2 * timeout + _TEARDOWN_GRACE) as bound:
            async with _open_session(url, headers, timeout, wire, pin, tls) as session:
                outcome = await _initialize_for_call(session, wire, url, expected_protocol, timeout)
                if outcome is None:
                    sent = True
                    outcome = await _send_call(session, wire, name, arguments, timeout)
                bound.deadline = anyio.current_time() + min(timeout, _TEARDOWN_GRACE)
    except Exception as exc:
        if outcome is None:
            if not sent:
                outcome = _before_send(f"cannot reach MCP server at {_safe_url(url)}: {_describe(exc)}")
            elif _is_connect_failure(exc):
                outcome = _before_send(f"tools/call {name!r} could not connect: {_describe(exc)}")
            else:
                outcome = CallOutcome("ambiguous", None, f"tools/call {name!r} connection failed: {_describe(exc)}")
        else:
            logger.debug("mcp session teardown failed after tools/call %r: %s", name, _describe(exc))
    if outcome is None:  # only the overall bound can get here
        if sent:
            outcome = CallOutcome("ambiguous", None, f"tools/call {name!r} did not finish — outcome unknown")
        else:
            outcome = _before_send(f"MCP server at {_safe_url(url)} did not complete initialize in time")
    logger.debug("tools/call %r at %s: %s", name, _safe_url(url), outcome.outcome)
    return outcome


async def _handshake(
    session: ClientSession, wire: _Wire, url: str, timeout: float
) -> tuple[str | None, CallOutcome | None]:
    """Initialize within ``timeout``: the negotiated version, or a ``failed_before_send`` outcome."""
    version: str | None = None
    with anyio.move_on_after(timeout):
        try:
            version = await _initialize(session)
        except McpClientError as exc:
            return None, _before_send(str(exc))
        except (MCPError, ValidationError) as exc:
            failure = _initialize_failure(exc, wire, url)
            rejected = isinstance(failure, AuthRejected) and failure.status == 401
            return None, CallOutcome("failed_before_send", None, str(failure), auth_rejected=rejected)
    if version is None:
        return None, _before_send(f"MCP server at {_safe_url(url)} did not complete initialize within {timeout}s")
    return version, None


async def _initialize_for_call(
    session: ClientSession, wire: _Wire, url: str, expected_protocol: str | None, timeout: float
) -> CallOutcome | None:
    """Handshake + drift check; returns a ``failed_before_send`` outcome, or None to proceed."""
    version, failure = await _handshake(session, wire, url, timeout)
    if failure is not None:
        return failure
    if expected_protocol is not None and version != expected_protocol:
        return _before_send(drift_message(str(version), expected_protocol))
    return None


async def _send_call(
    session: ClientSession, wire: _Wire, name: str, arguments: dict[str, Any], timeout: float
) -> CallOutcome:
    # send_request, not ClientSession.call_tool: the latter may issue an extra tools/list to
    # validate structured output, and output validation is not the broker's business.
    request = _call_request(name, arguments)
    with anyio.move_on_after(timeout):
        try:
            result = await session.send_request(request, types.CallToolResult)
        except MCPError as err:
            return _classify_call_error(err, wire, name)
        except ValidationError:
            return _malformed(name)
        return _classify_result(result, name)
    return _no_answer(name, timeout)


def _call_request(name: str, arguments: dict[str, Any]) -> types.CallToolRequest:
    return types.CallToolRequest(params=types.CallToolRequestParams(name=name, arguments=arguments))


def _classify_result(result: types.CallToolResult, name: str) -> CallOutcome:
    body = _result_json(result)
    if body["is_error"]:
        text = _first_text(result)
        error = f"tool {name!r} returned isError" + (f": {text}" if text else "")
        return CallOutcome("failed_upstream", body, error)
    return CallOutcome("succeeded", body, None)


def _malformed(name: str) -> CallOutcome:
    return CallOutcome("ambiguous", None, f"tools/call {name!r} returned a malformed result — outcome unknown")


def _no_answer(name: str, timeout: float) -> CallOutcome:
    return CallOutcome("ambiguous", None, f"tools/call {name!r} got no answer within {timeout}s — outcome unknown")
