"""The front door's request guard, as plain ASGI (no per-request task or body stream re-wrapping).

For every HTTP request, in order: the body-size ceiling (the LLM facade has its own, larger one),
JSON-only writes, and the planes rule: a Unix-socket connection (uvicorn reports the server as
``(path, None)``) is a sandbox's gateway, which serves the runner plane (``/internal``) only. Then a
model call (``POST /internal/llm/…``) goes straight to the facade's own ASGI handler, everything else
to the router.
"""

from __future__ import annotations

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import error_body

WRITES = frozenset({"POST", "PUT", "PATCH"})
LLM_PREFIX = "/internal/llm"
# A runner's final workspace (a gzip'd tar, api/routes/workspaces.py): its own ceiling and content type.
WORKSPACE_PREFIX, WORKSPACE_SUFFIX = "/internal/sessions/", "/workspace"
ARCHIVE_TYPES = ("application/gzip", "application/octet-stream")


def _is_workspace(path: str) -> bool:
    return path.startswith(WORKSPACE_PREFIX) and path.endswith(WORKSPACE_SUFFIX)


def _is_llm(path: str) -> bool:
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
    ) -> None:
        self.app = app
        self.limit = limit
        self.llm_limit = llm_limit
        self.facade = facade
        self.workspace_limit = workspace_limit if workspace_limit is not None else limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self.refusal(scope)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        target = self.app
        if self.facade is not None and scope["method"] == "POST" and scope["path"].startswith(LLM_PREFIX + "/"):
            target = self.facade
        if _header(scope, b"transfer-encoding") is not None:
            # No declared length: read up to the ceiling here, then hand the body on in one piece
            # (every route reads whole JSON bodies anyway).
            body = bytearray()
            more = True
            while more:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                body += message.get("body", b"")
                more = bool(message.get("more_body", False))
                if len(body) > self.cap(scope["path"]):
                    await self.too_large(scope["path"])(scope, receive, send)
                    return
            await target(scope, _replay(bytes(body), receive), send)
            return
        await target(scope, receive, send)

    def cap(self, path: str) -> int:
        # A model conversation grows with every turn; the facade takes what the providers take.
        if _is_llm(path):
            return self.llm_limit
        return self.workspace_limit if _is_workspace(path) else self.limit

    def too_large(self, path: str) -> JSONResponse:
        cap = self.cap(path)
        if _is_llm(path):
            message = f"request body is over the {cap} byte limit of the LLM facade"
            return JSONResponse(
                {"type": "error", "error": {"type": "request_too_large", "message": message}}, status_code=413
            )
        return JSONResponse(error_body(f"request body is over the {cap} byte limit", 413), status_code=413)

    def refusal(self, scope: Scope) -> JSONResponse | None:
        path: str = scope["path"]
        length = _header(scope, b"content-length")
        ctype = _header(scope, b"content-type") or ""
        chunked = _header(scope, b"transfer-encoding") is not None
        if length is not None and length.isdigit() and int(length) > self.cap(path):
            return self.too_large(path)
        has_body = chunked or length not in (None, "0")
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
