"""Send one brokered HTTP request described by a frozen tool's ``request`` recipe (``openapi`` and ``http``).

A recipe (photographed with the tool, so a run sends exactly what it froze)::

    {"method": "POST", "path": "/repos/{owner}/{repo}/issues",
     "params": [{"name": "owner", "in": "path", "arg": "owner"}, ...],   # in: path | query | header
     "body": "body" | "*" | null,        # the argument sent as the JSON body ("*": every argument no param took)
     "media_type": "application/json"}

Order for every call: the arguments are validated against the frozen input schema (nothing is sent when they
break it) → the request is built (path values percent-encoded one segment each; an argument can never set a
header or query parameter that carries the credential) → the base URL is admitted again and the request
connects only to the vetted addresses (no redirects, no proxies from the environment; the connection's kept
client is reused only while it is pinned to exactly the addresses this admission vetted) → the answer is read up
to ``max_response_bytes`` → the result keeps the status, the allowed response headers and the (possibly
truncated) body.

Outcomes: connect refused / URL refused / invalid arguments → ``failed_before_send``; HTTP < 400 →
``succeeded``; 4xx → ``failed_upstream`` (401 flags ``auth_rejected``); 5xx, a dropped connection or a timeout
after sending → ``ambiguous`` (never retried).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import quote

import httpx2

from core.gate import schema_problems
from integrations.mcp_client import CallOutcome, _describe, _tls_context
from integrations.pinning import PinnedClients, PinnedTransport, PinViolation
from integrations.transports import TransportConnection, TransportDeps
from integrations.transports._auth import auth_definition, credential_parts, reserved_names
from integrations.urls import AdmittedUrl, UrlRefused

# Response headers a tool result may carry; anything else (cookies, auth challenges, server internals) is dropped.
ALLOWED_RESPONSE_HEADERS = frozenset(
    {
        "content-type", "content-length", "content-language", "etag", "last-modified", "location", "link",
        "retry-after", "x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset", "x-ratelimit-used",
        "x-request-id", "x-github-request-id",
    }
)  # fmt: skip
NEVER_RESPONSE_HEADERS = frozenset({"set-cookie", "authorization", "www-authenticate", "proxy-authenticate"})
HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
KEEP_IDLE_SECS = 2.0  # a connection's client (and its open TCP/TLS connections) outlives its last call this long


def config_problem(config: dict[str, Any]) -> str | None:
    """Why the response settings shared by ``openapi`` and ``http`` are malformed, or None."""
    cap = config.get("max_response_bytes")
    if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
        return "`max_response_bytes` must be a positive integer"
    headers = config.get("response_headers")
    if headers is not None and (not isinstance(headers, list) or not all(isinstance(h, str) for h in headers)):
        return "`response_headers` must be a list of header names"
    return None


def default_access(method: str) -> str:
    """GET and HEAD read; every other method writes."""
    return "read" if method.upper() in ("GET", "HEAD") else "write"


def _before_send(error: str) -> CallOutcome:
    return CallOutcome("failed_before_send", None, error)


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def build(conn: TransportConnection, tool: dict[str, Any], arguments: dict[str, Any]) -> dict[str, Any] | str:
    """The request to send (method, url, params, headers, json), or why it cannot be built (nothing sent)."""
    recipe = tool.get("request")
    if not isinstance(recipe, dict) or recipe.get("method") not in HTTP_METHODS:
        return f"tool '{tool.get('name')}' has no request recipe — refresh the snapshot"
    auth = auth_definition(conn)
    no_headers, no_query = reserved_names(auth)
    path = str(recipe["path"])
    query: list[tuple[str, str]] = []
    headers: dict[str, str] = {}
    for param in recipe.get("params", []):
        arg = param["arg"]
        if arg not in arguments or arguments[arg] is None:
            if param["in"] == "path":
                return f"missing path argument '{arg}'"
            continue
        value = arguments[arg]
        where = param["in"]
        if where == "path":
            # One path segment per value: '/', '?', '#' and '..' are encoded, never interpreted.
            path = path.replace("{" + param["name"] + "}", quote(_scalar(value), safe=""))
        elif where == "query":
            if param["name"] in no_query:
                return f"argument '{arg}' would set the query parameter that carries the credential"
            values = value if isinstance(value, list) else [value]
            query.extend((param["name"], _scalar(v)) for v in values)
        elif where == "header":
            if param["name"].lower() in no_headers or param["name"].lower() == "host":
                return f"argument '{arg}' would set a reserved header"
            headers[param["name"]] = _scalar(value)
    auth_headers, auth_query = credential_parts(conn)
    request: dict[str, Any] = {
        "method": recipe["method"],
        "url": conn.base_url.rstrip("/") + path,
        "params": query + list(auth_query.items()),
        "headers": {**headers, **auth_headers},
    }
    body_arg = recipe.get("body")
    if body_arg == "*":  # every argument no parameter took
        taken = {p["arg"] for p in recipe.get("params", [])}
        request["json"] = {k: v for k, v in arguments.items() if k not in taken}
    elif body_arg and body_arg in arguments:
        request["json"] = arguments[body_arg]
    if "json" in request:
        request["headers"]["Content-Type"] = recipe.get("media_type") or "application/json"
    return request


@asynccontextmanager
async def _use(
    deps: TransportDeps, conn: TransportConnection, admitted: AdmittedUrl, clients: PinnedClients | None
) -> AsyncIterator[httpx2.AsyncClient]:
    """The connection's kept client when ``clients`` is given (key: connection id and its authorization
    generation), else a client for this one call."""
    if clients is None:
        async with _client(deps, admitted) as client:
            yield client
        return
    async with clients.client(f"{conn.id}:{conn.generation}", admitted) as client:
        yield client


def _decode(raw: bytes, content_type: str, truncated: bool) -> Any:
    text = raw.decode("utf-8", errors="replace")
    if not truncated and "json" in content_type.lower() and text.strip():
        try:
            return json.loads(text)
        except ValueError:
            return text
    return text


def _result(status: int, headers: httpx2.Headers, raw: bytes, truncated: bool, extra: frozenset[str]) -> dict[str, Any]:
    allowed = (ALLOWED_RESPONSE_HEADERS | extra) - NEVER_RESPONSE_HEADERS
    kept = {k.lower(): v for k, v in headers.items() if k.lower() in allowed}
    body = _decode(raw, headers.get("content-type", ""), truncated)
    text = raw.decode("utf-8", errors="replace")
    structured: dict[str, Any] = {"status": status, "headers": kept, "body": body}
    if truncated:
        structured["truncated"] = True
    return {"content": [{"type": "text", "text": text}], "is_error": status >= 400, "structured_content": structured}


def _client(deps: TransportDeps, admitted: AdmittedUrl) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(
        timeout=httpx2.Timeout(deps.timeout),
        follow_redirects=False,
        trust_env=False,
        verify=_tls_context(),
        transport=PinnedTransport(admitted, verify=_tls_context()),
    )


def kept_clients(deps: TransportDeps, idle_secs: float = KEEP_IDLE_SECS) -> PinnedClients:
    """The clients a provider keeps between calls (one per connection and admitted address set)."""
    return PinnedClients(lambda admitted: _client(deps, admitted), idle_secs=idle_secs)


async def send(
    deps: TransportDeps,
    conn: TransportConnection,
    tool: dict[str, Any],
    arguments: dict[str, Any],
    clients: PinnedClients | None = None,
) -> CallOutcome:
    """Validate, build, admit and send one request; classify the outcome (never raises for upstream trouble)."""
    name = str(tool.get("name"))
    problem = schema_problems(tool.get("input_schema"), arguments)
    if problem is not None:
        return _before_send(f"tool '{name}': {problem}")
    built = build(conn, tool, arguments)
    if isinstance(built, str):
        return _before_send(f"tool '{name}': {built}")
    try:
        admitted = await deps.url_policy.admit(conn.base_url)
    except UrlRefused as err:
        return _before_send(str(err))
    cap = int(conn.config.get("max_response_bytes") or deps.max_response_bytes)
    cap = min(cap, deps.max_response_bytes)
    extra = frozenset(h.lower() for h in conn.config.get("response_headers", []) if isinstance(h, str))
    sent = False
    try:
        async with _use(deps, conn, admitted, clients) as client:
            request = client.build_request(**built)
            sent = True
            response = await client.send(request, stream=True)
            try:
                raw = bytearray()
                truncated = False
                async for chunk in response.aiter_bytes():
                    raw.extend(chunk)
                    if len(raw) > cap:
                        truncated = True
                        del raw[cap:]
                        break
            finally:
                await response.aclose()
    except (httpx2.ConnectError, httpx2.ConnectTimeout, PinViolation) as err:
        return _before_send(f"tool '{name}' could not connect: {_describe(err)}")
    except httpx2.HTTPError as err:
        if not sent:
            return _before_send(f"tool '{name}': {_describe(err)}")
        return CallOutcome("ambiguous", None, f"tool '{name}' lost its answer ({_describe(err)}) — outcome unknown")
    status = response.status_code
    if status >= 500:
        return CallOutcome("ambiguous", None, f"tool '{name}' answered HTTP {status} — outcome unknown")
    result = _result(status, response.headers, bytes(raw), truncated, extra)
    if status >= 400:
        return CallOutcome(
            "failed_upstream", result, f"tool '{name}' answered HTTP {status}", auth_rejected=status == 401
        )
    return CallOutcome("succeeded", result, None)


class KeptClientsProvider:
    """What the ``openapi`` and ``http`` providers share: a pinned client per connection kept between calls,
    and calls sent through :func:`send`. Each subclass photographs its own way (``list_tools``)."""

    def __init__(self, deps: TransportDeps) -> None:
        self.deps = deps
        self.clients = kept_clients(deps)

    async def call_tool(
        self, conn: TransportConnection, tool: dict[str, Any], arguments: dict[str, Any]
    ) -> CallOutcome:
        return await send(self.deps, conn, tool, arguments, self.clients)

    async def close(self) -> None:
        """Close the kept clients (and their connections)."""
        await self.clients.aclose()
