"""The front door's request guard, as plain ASGI (no per-request task or body stream re-wrapping).

For every HTTP request, in order: the body-size ceiling (the LLM facade and workspace archives have their
own, larger ones), JSON-only writes, and the planes rule: a Unix-socket connection (uvicorn reports the
server as ``(path, None)``) is a sandbox's gateway, which serves the runner plane (``/internal``) only.

Then, before a byte of any body is read, its credential (security invariant 9): a request with a body must
carry a token of the shape its plane takes (a run token on ``/internal``, the operator token, a personal
access token or a trigger token elsewhere), else 401. A body that may be over the JSON ceiling (a model call
or a workspace archive, chunked or declared longer) is received only once its token was looked up (live,
of the right audience and run), and only ``large_bodies`` at a time per process: a request that finds no
place within ``large_body_wait_secs`` is answered 429 ``too_busy`` with ``Retry-After``. A place is held
until the answer starts, so the bodies this process holds are bounded by places × ceiling.

Then a model call (``POST /internal/llm/…``) goes straight to the facade's own ASGI handler, everything
else to the router.
"""

from __future__ import annotations

import asyncio
import hmac
import math
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.deps import bearer, run_token, wrong_audience_response
from api.errors import domain_response, error_body
from core.digests import sha256_hex
from core.errors import DomainError
from core.llm_body import dialect_of_path
from core.llm_body import error_body as llm_error_body
from core.tokens import SESSION_TOKEN_PREFIX, Audience
from core.triggers import TRIGGER_TOKEN_PREFIX
from db.identity import PAT_PREFIX
from services.context import AppContext

WRITES = frozenset({"POST", "PUT", "PATCH"})
LLM_PREFIX = "/internal/llm"
# LiteLLM's usage callback authenticates with LiteLLM's own master key (and answers `ignored` without it): its
# body (a small JSON one, under the JSON ceiling like any) is the route's to judge.
LLM_USAGE_PATH = "/internal/llm-usage"
# A runner's final workspace (a gzip'd tar, api/routes/workspaces.py): its own ceiling and content type.
WORKSPACE_PREFIX, WORKSPACE_SUFFIX = "/internal/sessions/", "/workspace"
ARCHIVE_TYPES = ("application/gzip", "application/octet-stream")
# The tokens /v1 takes besides the operator's (whose shape the operator chooses).
USER_TOKEN_PREFIXES = (PAT_PREFIX, TRIGGER_TOKEN_PREFIX)
TOO_BUSY = "too many large request bodies are being received at once; retry"


def _is_workspace(path: str) -> bool:
    return path.startswith(WORKSPACE_PREFIX) and path.endswith(WORKSPACE_SUFFIX)


def _is_facade(path: str) -> bool:
    # The facade's own paths, not a sibling such as /internal/llm-usage (an ordinary JSON route).
    return path == LLM_PREFIX or path.startswith(LLM_PREFIX + "/")


class RequestGuard:
    def __init__(
        self,
        app: ASGIApp,
        *,
        limit: int,
        llm_limit: int,
        facade: ASGIApp | None = None,
        workspace_limit: int | None = None,
        large_bodies: int = 4,
        large_body_wait_secs: float = 15.0,
    ) -> None:
        self.app = app
        self.limit = limit
        self.llm_limit = llm_limit
        self.facade = facade
        self.workspace_limit = workspace_limit if workspace_limit is not None else limit
        self.slots = asyncio.Semaphore(large_bodies)
        self.slot_wait = large_body_wait_secs

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self.refusal(scope)
        if refusal is None and _has_body(scope):
            refusal = await self.credential_refusal(scope)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        target = self.app
        if self.facade is not None and scope["method"] == "POST" and _is_facade(scope["path"]):
            target = self.facade
        if not self.large(scope):
            await self.forward(target, scope, receive, send)
            return
        try:
            async with asyncio.timeout(self.slot_wait):
                await self.slots.acquire()
        except TimeoutError:
            await self.too_busy(scope["path"])(scope, receive, send)
            return
        held = True

        def release() -> None:
            nonlocal held
            if held:
                held = False
                self.slots.release()

        async def sending(message: Message) -> None:
            # The body has been read and judged once the answer starts (a model call's stream can run for
            # minutes after it: holding the place through it would bound runs, not bodies).
            if message["type"] == "http.response.start":
                release()
            await send(message)

        try:
            await self.forward(target, scope, receive, sending)
        finally:
            release()

    async def forward(self, target: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
        if _header(scope, b"transfer-encoding") is None:
            await target(scope, receive, send)
            return
        # No declared length: read up to the ceiling here, then hand the body on in one piece
        # (every route reads whole bodies anyway).
        chunks: list[bytes] = []
        size, more, cap = 0, True, self.cap(scope["path"])
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            chunks.append(chunk)
            size += len(chunk)
            more = bool(message.get("more_body", False))
            if size > cap:
                await self.too_large(scope["path"])(scope, receive, send)
                return
        await target(scope, _replay(b"".join(chunks), receive), send)

    def cap(self, path: str) -> int:
        # A model conversation grows with every turn; the facade takes what the providers take.
        if _is_facade(path):
            return self.llm_limit
        return self.workspace_limit if _is_workspace(path) else self.limit

    def large(self, scope: Scope) -> bool:
        """Whether this request's body may be over the JSON ceiling (one declared longer is on a path whose
        own ceiling admits it: ``refusal`` answered 413 otherwise)."""
        length = _header(scope, b"content-length")
        if length is not None and length.isdigit():
            return int(length) > self.limit
        return _header(scope, b"transfer-encoding") is not None and self.cap(scope["path"]) > self.limit

    def too_large(self, path: str) -> JSONResponse:
        cap = self.cap(path)
        if _is_facade(path):
            message = f"request body is over the {cap} byte limit of the LLM facade"
            return JSONResponse(
                {"type": "error", "error": {"type": "request_too_large", "message": message}}, status_code=413
            )
        return JSONResponse(error_body(f"request body is over the {cap} byte limit", 413), status_code=413)

    def too_busy(self, path: str) -> JSONResponse:
        # Model clients (the Anthropic and OpenAI SDKs) retry a 429 after its Retry-After by themselves.
        retry = {"retry-after": str(max(1, math.ceil(self.slot_wait)))}
        if _is_facade(path):
            body: dict[str, Any] = llm_error_body(dialect_of_path(path), 429, TOO_BUSY, "too_busy")
            return JSONResponse(body, status_code=429, headers=retry)
        return JSONResponse(error_body(TOO_BUSY, 429), status_code=429, headers=retry)

    def unauthorized(self, path: str) -> JSONResponse:
        if _is_facade(path):
            return JSONResponse(llm_error_body(dialect_of_path(path), 401, "unauthorized"), status_code=401)
        return JSONResponse(error_body("unauthorized", 401), status_code=401)

    async def credential_refusal(self, scope: Scope) -> JSONResponse | None:
        """401 for a body whose token cannot be one its path takes, judged from the headers alone; for a
        body that may be large, the route's own answer to its token (looked up) unless it is live."""
        path: str = scope["path"]
        if path == LLM_USAGE_PATH:
            return None
        request = Request(scope)
        ctx: AppContext = scope["app"].state.context
        facade = _is_facade(path)
        token = (request.headers.get("x-api-key") if facade else None) or bearer(request)
        if token is None:
            return self.unauthorized(path)
        if path.startswith("/internal/"):
            plausible = token.startswith(SESSION_TOKEN_PREFIX)
        else:
            admin = hmac.compare_digest(sha256_hex(token), ctx.admin_digest)
            plausible = admin or token.startswith(USER_TOKEN_PREFIXES)
        if not plausible:
            return self.unauthorized(path)
        if not self.large(scope):
            return None
        if facade:
            row = await ctx.tokens.resolve_token(token)
            if row is None or row.expired or row.revoked:
                return self.unauthorized(path)
            return None if row.audience == Audience.LLM.value else wrong_audience_response()
        if _is_workspace(path):
            try:
                await run_token(request, ctx, path[len(WORKSPACE_PREFIX) : -len(WORKSPACE_SUFFIX)], Audience.WORKSPACE)
            except DomainError as exc:
                return domain_response(exc)
            return None
        return self.unauthorized(path)  # unreachable: no other path takes a body over the JSON ceiling

    def refusal(self, scope: Scope) -> JSONResponse | None:
        path: str = scope["path"]
        length = _header(scope, b"content-length")
        ctype = _header(scope, b"content-type") or ""
        if length is not None and length.isdigit() and int(length) > self.cap(path):
            return self.too_large(path)
        has_body = _has_body(scope)
        if scope["method"] == "PUT" and _is_workspace(path):
            if not ctype.startswith(ARCHIVE_TYPES):
                return JSONResponse(error_body("expected content-type: application/gzip", 415), status_code=415)
        elif scope["method"] in WRITES and has_body and not ctype.startswith("application/json"):
            return JSONResponse(error_body("expected content-type: application/json", 415), status_code=415)
        server = scope.get("server")
        on_gateway = server is None or server[1] is None
        if on_gateway and not path.startswith("/internal/"):
            return JSONResponse(error_body("not found", 404), status_code=404)
        return None


def _has_body(scope: Scope) -> bool:
    return _header(scope, b"transfer-encoding") is not None or _header(scope, b"content-length") not in (None, "0")


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
