"""One error shape for every route: ``{"error": "<what is wrong>"}`` with the right status."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from core.errors import DomainError

log = logging.getLogger("fluidbox.api")


def _describe(exc: RequestValidationError) -> tuple[int, str]:
    problems = []
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ()) if p not in ("body",)]
        where = ".".join(loc) or "body"
        kind = err.get("type", "")
        if kind == "json_invalid":
            return 400, f"malformed JSON body: {err.get('ctx', {}).get('error', err.get('msg'))}"
        if kind == "extra_forbidden":
            problems.append(f"unknown field '{where}'")
        elif kind == "missing":
            problems.append(f"missing field '{where}'")
        else:
            problems.append(f"{where}: {err.get('msg')}")
    return 400, "invalid request: " + "; ".join(problems)


def install(app: FastAPI) -> None:
    @app.exception_handler(DomainError)
    async def _domain(_: Request, exc: DomainError) -> JSONResponse:
        return JSONResponse({"error": exc.message, **exc.details}, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        status, message = _describe(exc)
        return JSONResponse({"error": message}, status_code=status)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail if isinstance(exc.detail, str | dict) else str(exc.detail)
        if isinstance(detail, dict):
            return JSONResponse(detail, status_code=exc.status_code, headers=exc.headers)
        message = "not found" if exc.status_code == 404 else detail
        return JSONResponse({"error": message}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse({"error": "internal error"}, status_code=500)
