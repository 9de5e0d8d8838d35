"""One error shape for every route: ``{"error": "<what is wrong>", "code": "<stable code>"}``.

``error`` is the human sentence (clients written for the reference key on it, so it never changes);
``code`` is the machine-readable class of the refusal, from the small vocabulary in ``CODES`` (documented
in ``docs/api.md``, "Errors"). Two bodies keep the reference's exact bytes and carry no ``code``: the
runner plane's ``{"error":"wrong_audience"}`` (runners abort on it) and the LLM facade's provider-shaped
errors. ``ErrorBody`` and ``errors()`` describe the shape to OpenAPI, so every route can declare the
statuses it really answers.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from core.errors import DomainError

log = logging.getLogger("fluidbox.api")

# The code each status answers with when nothing more specific applies.
CODES: dict[int, str] = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "too_large",
    415: "unsupported_media_type",
    422: "unprocessable",
    429: "too_busy",
    500: "internal",
    502: "upstream_failed",
    503: "unavailable",
}
INVALID_REQUEST = "invalid_request"  # 400: the body, query or path did not parse (malformed JSON, a bad field)


def code_for(status: int) -> str:
    return CODES.get(status, "bad_request" if status < 500 else "internal")


def error_body(message: str, status: int, code: str | None = None) -> dict[str, str]:
    return {"error": message, "code": code or code_for(status)}


class ErrorBody(BaseModel):
    """Every error the API answers (the LLM facade answers in its provider's shape instead)."""

    model_config = ConfigDict(extra="allow", json_schema_extra={"additionalProperties": True})
    error: str = Field(description="What is wrong, in words (stable: clients may match on it).")
    code: str = Field(
        description="The machine-readable class: bad_request, invalid_request, unauthorized, forbidden, not_found, "
        "method_not_allowed, conflict, invalid_transition, too_large, unsupported_media_type, unprocessable, "
        "too_busy, internal, upstream_failed, unavailable."
    )


class RunnerErrorBody(BaseModel):
    """An error of the runner plane: ``ErrorBody``, or the byte-stable ``{"error":"wrong_audience"}``."""

    model_config = ConfigDict(extra="allow", json_schema_extra={"additionalProperties": True})
    error: str
    code: str | None = Field(default=None, description="Absent only on wrong_audience (byte-stable).")


DESCRIPTIONS: dict[int, str] = {
    400: "Bad input: malformed JSON, an unknown or missing field, a contradictory request.",
    401: "Missing or unknown credential.",
    403: "Authenticated, but not allowed.",
    404: "Not found, or not visible to the caller.",
    409: "Conflict: a duplicate, a lost race, not pending, or an invalid state change.",
    413: "The request body is over the size limit.",
    415: "A request body that is not application/json.",
    422: "Semantically invalid (policy, harness, model, schedule…).",
    429: "Too busy: a limit on concurrent work was reached; retry.",
    502: "An upstream (MCP server, authorization server) failed.",
    503: "A dependency is unavailable (credential storage, the workflow engine); retry later.",
}
# What every route can answer whatever it does: a bad body or query (400), and the request guard's
# size (413) and content-type (415) checks.
COMMON = (400, 413, 415)


def errors(*statuses: int, model: type[BaseModel] = ErrorBody) -> dict[int | str, dict[str, Any]]:
    """The ``responses=`` of a route: these statuses and the ones every route answers, in one error shape."""
    return {s: {"model": model, "description": DESCRIPTIONS[s]} for s in sorted({*COMMON, *statuses})}


def json_errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """``errors()`` for a route whose success is not JSON (an HTML page): FastAPI would document a
    ``model`` under the route's own media type, so the JSON error schema is named explicitly."""
    ref = {"$ref": f"#/components/schemas/{ErrorBody.__name__}"}
    return {
        s: {"description": DESCRIPTIONS[s], "content": {"application/json": {"schema": ref}}}
        for s in sorted({*COMMON, *statuses})
    }


def document(app: FastAPI) -> None:
    """Drop FastAPI's automatic 422 ``HTTPValidationError`` from ``/openapi.json``: a request that does
    not parse answers 400 ``invalid_request`` here (the reference's status), which every route documents."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = generate()
        for item in schema.get("paths", {}).values():
            for operation in item.values():
                auto = operation.get("responses", {}).get("422", {})
                ref = auto.get("content", {}).get("application/json", {}).get("schema", {}).get("$ref", "")
                if ref.endswith("/HTTPValidationError"):
                    del operation["responses"]["422"]
        for name in ("HTTPValidationError", "ValidationError"):
            schema.get("components", {}).get("schemas", {}).pop(name, None)
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


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


NUL_REFUSED = "contains a NUL character (\\u0000), which cannot be stored"
# PostgreSQL text and jsonb cannot hold U+0000 (character_not_in_repertoire, untranslatable_character).
NUL_SQLSTATES = frozenset({"22021", "22P05"})


def _nul_at(doc: Any) -> list[str] | None:
    """The location of the first string (or key) in a parsed JSON document that holds a NUL, or None.
    Iterative: a document nested as deep as the parser allows must not exhaust the stack here."""
    stack: list[tuple[list[str], Any]] = [([], doc)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, str):
            if "\x00" in value:
                return where
        elif isinstance(value, dict):
            for key, item in value.items():
                if "\x00" in key:
                    return [*where, key.replace("\x00", "\\u0000")]
                stack.append(([*where, key], item))
        elif isinstance(value, list):
            stack.extend(([*where, str(i)], item) for i, item in enumerate(value))
    return None


async def refuse_nul(request: Request) -> None:
    """Every route's first dependency: a NUL in a path or query parameter or in a JSON body's strings is
    400 ``invalid_request`` naming where, before the route (or its database) sees anything."""
    problems: list[dict[str, Any]] = []
    for kind, params in (("path", list(request.path_params.items())), ("query", request.query_params.multi_items())):
        for name, value in params:
            if "\x00" in str(value) or "\x00" in name:
                problems.append({"type": "nul", "loc": (kind, name.replace("\x00", "\\u0000")), "msg": NUL_REFUSED})
    route = request.scope.get("route")
    # Only a body the route itself parses as JSON (already read and cached by FastAPI): a raw body (a
    # workspace archive) is the route's to read, after its credential.
    if getattr(route, "body_field", None) is not None and request.headers.get("content-type", "").startswith(
        "application/json"
    ):
        raw = await request.body()
        # JSON can carry a NUL only escaped (a raw control character does not parse): most bodies stop here.
        if b"\\u0000" in raw:
            try:
                doc = await request.json()
            except ValueError:
                doc = None  # FastAPI already answered a body that does not parse
            where = _nul_at(doc)
            if where is not None:
                problems.append({"type": "nul", "loc": ("body", *where), "msg": NUL_REFUSED})
    if problems:
        raise RequestValidationError(problems)


def domain_response(exc: DomainError) -> JSONResponse:
    """A domain error's answer (also given by the request guard, ahead of the router)."""
    body: dict[str, str] = {"error": exc.message}
    if exc.code is not None:  # None: a body whose bytes the runner contract fixes (wrong_audience)
        body["code"] = exc.code
    return JSONResponse({**body, **exc.details}, status_code=exc.status)


def install(app: FastAPI) -> None:
    """The error handlers, the OpenAPI clean-up and :func:`refuse_nul` as a dependency of every route
    (so before any router is included)."""
    document(app)
    app.router.dependencies.append(Depends(refuse_nul))

    @app.exception_handler(DomainError)
    async def _domain(_: Request, exc: DomainError) -> JSONResponse:
        return domain_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        status, message = _describe(exc)
        return JSONResponse(error_body(message, status, INVALID_REQUEST), status_code=status)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail if isinstance(exc.detail, str | dict) else str(exc.detail)
        if isinstance(detail, dict):
            return JSONResponse(detail, status_code=exc.status_code, headers=exc.headers)
        message = "not found" if exc.status_code == 404 else detail
        if isinstance(exc.__cause__, RecursionError):
            # FastAPI's "There was an error parsing the body" for a body the JSON parser could not descend.
            message = "invalid request: the JSON body nests too deeply to be parsed"
            return JSONResponse(error_body(message, 400, INVALID_REQUEST), status_code=400)
        return JSONResponse(error_body(message, exc.status_code), status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        if getattr(exc, "sqlstate", None) in NUL_SQLSTATES:
            # What refuse_nul does not see (a NUL in a header, or text the route derived) still is bad input.
            log.warning("a NUL reached the database on %s %s", request.method, request.url.path)
            return JSONResponse(error_body(f"invalid request: a text value {NUL_REFUSED}", 400, INVALID_REQUEST), 400)
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse(error_body("internal error", 500), status_code=500)
