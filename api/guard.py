"""The front door's request guard, as plain ASGI (no per-request task or body stream re-wrapping).

For every HTTP request, in order: the body-size ceiling (the LLM facade has its own, larger one),
JSON-only writes, and the planes rule: a Unix-socket connection (uvicorn reports the server as
``(path, None)``) is a sandbox's gateway, which serves the runner plane (``/internal``) only.
"""

from __future__ import annotations

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

WRITES = frozenset({"POST", "PUT", "PATCH"})


class RequestGuard:
    def __init__(self, app: ASGIApp, *, limit: int, llm_limit: int) -> None:
        self.app = app
        self.limit = limit
        self.llm_limit = llm_limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self.refusal(scope)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def refusal(self, scope: Scope) -> JSONResponse | None:
        path: str = scope["path"]
        length: str | None = None
        ctype = ""
        for name, value in scope["headers"]:
            if name == b"content-length":
                length = value.decode("latin-1")
            elif name == b"content-type":
                ctype = value.decode("latin-1")
        # A model conversation grows with every turn; the facade takes what the providers take.
        facade = path.startswith("/internal/llm")
        cap = self.llm_limit if facade else self.limit
        if length is not None and length.isdigit() and int(length) > cap:
            if facade:
                message = f"request body is over the {cap} byte limit of the LLM facade"
                return JSONResponse(
                    {"type": "error", "error": {"type": "request_too_large", "message": message}}, status_code=413
                )
            return JSONResponse({"error": f"request body is over the {cap} byte limit"}, status_code=413)
        if scope["method"] in WRITES and length not in (None, "0") and not ctype.startswith("application/json"):
            return JSONResponse({"error": "expected content-type: application/json"}, status_code=415)
        server = scope.get("server")
        on_gateway = server is None or server[1] is None
        if on_gateway and not path.startswith("/internal/"):
            return JSONResponse({"error": "not found"}, status_code=404)
        return None
