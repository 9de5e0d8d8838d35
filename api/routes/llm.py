"""The LLM facade (runner plane): metered, budgeted model traffic with the real key swapped in.

A sandbox holds no provider key. Its model client (the Claude Agent SDK, later Codex) points its base
URL at ``/internal/llm`` and presents the run's ``llm``-audience token as its API key. Per request:

    token (x-api-key or bearer) → audience → dialect path → upstream configured →
    [one transaction under the run's row lock: session accepts work → recorded usage under the caps
     (else ``budget.exceeded`` + finalize ``budget_exceeded``) → body refusals → reservation admission]
    → forward with the real key → stream back byte for byte while a meter reads the usage →
    after the upstream drains: ``usage_entries`` row + ``model.response`` event (reservation charged)

The upstream is read by its own task, so a client that disconnects mid-stream is still charged for
what the upstream reports. Errors use the provider's error shape, except ``wrong_audience`` which is
byte-stable for every runner route.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from api.deps import Services, ServicesDep, bearer, wrong_audience_response
from api.routes.sessions import run_handle
from core.redaction import MARK
from core.runspec import RunSpec
from core.tokens import Audience, token_digest
from core.usage import BodyMeter, Dialect, SseMeter, declared_max_output
from db.usage import Ask, Metering
from workflows.run import RunWorkflow

log = logging.getLogger("fluidbox.api.llm")
router = APIRouter(prefix="/internal/llm", tags=["internal"])

# Which upstream path each dialect's facade path reaches ("" is the bare base URL: Messages).
ROUTES: dict[Dialect, dict[str, str]] = {
    Dialect.ANTHROPIC: {
        "": "v1/messages",
        "v1/messages": "v1/messages",
        "v1/messages/count_tokens": "v1/messages/count_tokens",
    },
    Dialect.OPENAI: {"v1/responses": "v1/responses"},
}
FREE = frozenset({"v1/messages/count_tokens"})  # no model output, nothing to reserve or meter
ANTHROPIC_VERSION = "2023-06-01"
# Tools the provider would execute itself, outside the permission gate.
ANTHROPIC_SERVER_TOOLS = ("web_search", "web_fetch", "code_execution", "tool_search_tool", "mcp_toolset")
OPENAI_SERVER_TOOLS = ("web_search", "file_search", "code_interpreter", "image_generation", "mcp")
OPENAI_REFUSED_FIELDS = ("previous_response_id", "conversation", "prompt", "background")
# The one upstream answer that proves non-dispatch (the key was refused before any model work). Any other
# error may have been billed behind a proxy (LiteLLM retries and fallbacks), so it keeps its reservation.
RELEASE_STATUSES = frozenset({401})
# Sources the provider would fetch or load itself: outside the sandbox's network rule and the byte estimate.
FETCHED_SOURCES = frozenset({"url", "file"})
TOOL_USE_BLOCKS = ("tool_use", "server_tool_use", "mcp_tool_use")  # their "input" is free-form model JSON
MAX_CONTENT_DEPTH = 64
FETCH_REFUSAL = "the provider would fetch it outside the sandbox"
MAX_REMEMBERED_TOKENS = 65536
PASS_HEADERS = ("content-type", "request-id", "x-request-id", "retry-after")
ERROR_KINDS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


class FacadeError(Exception):
    """A refusal answered in the provider's error shape."""

    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code


def llm_error(dialect: Dialect, status: int, message: str, code: str | None = None) -> JSONResponse:
    kind = ERROR_KINDS.get(status, "api_error")
    if dialect is Dialect.OPENAI:
        return JSONResponse(
            {"error": {"message": message, "type": kind, "param": None, "code": code}}, status_code=status
        )
    error: dict[str, Any] = {"type": kind, "message": message}
    if code:
        error["code"] = code
    return JSONResponse({"type": "error", "error": error}, status_code=status)


def dialect_of(harness: str) -> Dialect:
    """codex speaks OpenAI Responses; claude-agent-sdk (and replay, for tests and demos) Anthropic."""
    return Dialect.OPENAI if harness == "codex" else Dialect.ANTHROPIC


def inspect_body(dialect: Dialect, raw: bytes, spec: RunSpec) -> tuple[dict[str, Any], bytes]:
    """Validate a request body for this run; returns it and the bytes to forward (edited for OpenAI)."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise FacadeError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise FacadeError(400, "request body must be a JSON object")
    model = body.get("model")
    if model != spec.model:
        raise FacadeError(422, f"model {model!r} is not valid for this session (its frozen model is '{spec.model}')")
    raw_tools = body.get("tools")
    tools: list[Any] = raw_tools if isinstance(raw_tools, list) else []
    if dialect is Dialect.ANTHROPIC:
        for tool in tools:
            kind = tool.get("type") if isinstance(tool, dict) else None
            if isinstance(kind, str) and kind.startswith(ANTHROPIC_SERVER_TOOLS):
                raise FacadeError(422, f"server-side tool type '{kind}' is not allowed: tools run through the gate")
        if body.get("mcp_servers"):
            raise FacadeError(422, "mcp_servers (provider-side MCP) is not allowed: tools run through the gate")
        for field in ("system", "messages"):
            _walk(body.get(field), field, _anthropic_fetch)
        return body, raw
    for field in OPENAI_REFUSED_FIELDS:
        if body.get(field):
            raise FacadeError(422, f"'{field}' is not allowed: every request carries its whole context")
    raw_items = body.get("input")
    items: list[Any] = raw_items if isinstance(raw_items, list) else []
    if any(isinstance(i, dict) and i.get("type") == "item_reference" for i in items):
        raise FacadeError(422, "item_reference inputs are not allowed: every request carries its whole context")
    for field in ("instructions", "input"):
        _walk(body.get(field), field, _openai_fetch)
    body["store"] = False
    if "tools" in body:
        body["tools"] = [
            t for t in tools if not (isinstance(t, dict) and str(t.get("type", "")).startswith(OPENAI_SERVER_TOOLS))
        ]
    return body, json.dumps(body, separators=(",", ":")).encode()


def _walk(root: Any, where: str, check: Callable[[dict[str, Any], str], tuple[str, ...]]) -> None:
    """Apply ``check(node, path)`` to every object under ``root`` (iteratively, depth-bounded: deeper is 422).

    ``check`` returns the keys of that object not to descend into (free-form JSON, not content)."""
    stack: list[tuple[Any, str, int]] = [(root, where, 0)]
    while stack:
        node, path, depth = stack.pop()
        if depth > MAX_CONTENT_DEPTH:
            raise FacadeError(422, f"'{where}' is nested deeper than {MAX_CONTENT_DEPTH} levels (at {path})")
        if isinstance(node, list):
            stack.extend((v, f"{path}[{i}]", depth + 1) for i, v in enumerate(node) if isinstance(v, (dict, list)))
        elif isinstance(node, dict):
            skip = check(node, path)
            stack.extend(
                (v, f"{path}.{k}", depth + 1) for k, v in node.items() if k not in skip and isinstance(v, (dict, list))
            )


def _anthropic_fetch(block: dict[str, Any], path: str) -> tuple[str, ...]:
    """Refuse a block whose source the provider would fetch (a URL) or load (a Files API file)."""
    kind = block.get("type")
    source = block.get("source")
    if isinstance(source, dict) and source.get("type") in FETCHED_SOURCES:
        raise FacadeError(
            422,
            f"content source type '{source['type']}' is not allowed ('{kind}' block, field 'source.type' at "
            f"{path}): {FETCH_REFUSAL}",
        )
    if kind == "container_upload":
        raise FacadeError(
            422, f"'container_upload' blocks (field 'file_id' at {path}) are not allowed: {FETCH_REFUSAL}"
        )
    return ("input",) if isinstance(kind, str) and kind.endswith(TOOL_USE_BLOCKS) else ()


def _openai_fetch(part: dict[str, Any], path: str) -> tuple[str, ...]:
    """Refuse an image given by URL or file id, and a file given by URL or file id (inline data stays)."""
    kind = part.get("type")
    fields: list[str] = []
    if kind in ("input_image", "computer_screenshot") or "image_url" in part:
        url = part.get("image_url")
        url = url.get("url") if isinstance(url, dict) else url
        if url is not None and not (isinstance(url, str) and url[:5].lower() == "data:"):
            fields.append("image_url")
        if part.get("file_id") is not None:
            fields.append("file_id")
    if kind == "input_file" or "file_url" in part:
        fields.extend(f for f in ("file_url", "file_id") if part.get(f) is not None)
    if fields:
        raise FacadeError(
            422,
            f"'{kind}' with '{fields[0]}' is not allowed (at {path}; only inline data: URLs and base64 file_data "
            f"are): {FETCH_REFUSAL}",
        )
    return ()


class Facade:
    """Per-process facade state: the shared upstream client and the tasks draining upstream streams."""

    def __init__(self, svc: Services) -> None:
        self.svc = svc
        self._client: httpx.AsyncClient | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        # token sha256 → (run id, audience): fixed when a token is minted, so it can be kept; whether the
        # token is still valid (revoked, expired) is checked by every admission, in the same statement.
        self.tokens: dict[str, tuple[str, str]] = {}

    def remember(self, digest: str, run_id: str, audience: str) -> None:
        if len(self.tokens) >= MAX_REMEMBERED_TOKENS:
            self.tokens.clear()
        self.tokens[digest] = (run_id, audience)

    @property
    def metering(self) -> Metering:
        assert self.svc.metering is not None
        return self.svc.metering

    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            timeout = httpx.Timeout(self.svc.settings.llm_upstream_timeout_secs, connect=10.0)
            limits = httpx.Limits(max_connections=512, max_keepalive_connections=64)
            self._client = httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False)
        return self._client

    async def close(self) -> None:
        tasks = list(self._tasks)
        if tasks:
            # In-flight streams get a moment to settle; anything left keeps its reservation (expiry charges it).
            _, pending = await asyncio.wait(tasks, timeout=5)
            for task in pending:
                task.cancel()
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def facade_of(app: FastAPI) -> Facade:
    facade: Facade | None = getattr(app.state, "llm_facade", None)
    if facade is None:
        facade = Facade(app.state.services)
        app.state.llm_facade = facade
    return facade


async def close_facade(app: FastAPI) -> None:
    facade: Facade | None = getattr(app.state, "llm_facade", None)
    if facade is not None:
        await facade.close()


async def sweep_reservations(metering: Metering, period: float) -> None:
    """Runs in every API process: expired reservations become conservative charges (a CAS per row)."""
    while True:
        try:
            await metering.expire_due()
        except Exception:
            log.warning("reservation expiry sweep failed; retrying", exc_info=True)
        await asyncio.sleep(period)


@router.api_route("", methods=["HEAD", "GET"], include_in_schema=False)
@router.api_route("/", methods=["HEAD", "GET"], include_in_schema=False)
async def probe() -> Response:
    """Model clients probe their base URL before the first call; nothing is forwarded."""
    return Response(status_code=200)


@router.post("/{rest:path}", summary="The LLM facade: a provider-dialect model call, metered and budgeted")
async def facade(rest: str, request: Request, svc: ServicesDep) -> Response:
    """Anthropic Messages or OpenAI Responses by the run's harness; see the module docstring."""
    started = time.perf_counter()
    path = rest.strip("/")
    guess = Dialect.OPENAI if path.endswith("responses") else Dialect.ANTHROPIC
    token = request.headers.get("x-api-key") or bearer(request)
    if not token:
        return llm_error(guess, 401, "unauthorized")
    fac = facade_of(request.app)
    digest = token_digest(token)
    known = fac.tokens.get(digest)
    if known is None:
        # First sight of this token in this process: resolve it (and check it) now.
        row = await svc.store.resolve_token(token)
        if row is None or row["expired"] or row["revoked"]:
            return llm_error(guess, 401, "unauthorized")
        known = (str(row["session_id"]), str(row["audience"]))
        fac.remember(digest, *known)
    run_id, audience = known
    if audience != Audience.LLM.value:
        return wrong_audience_response()
    spec = await svc.store.run_spec(run_id)
    dialect = dialect_of(spec.harness)
    upstream_path = ROUTES[dialect].get(path)
    if upstream_path is None:
        return llm_error(dialect, 404, f"no such {dialect.value} endpoint on the facade: '/{path}'")
    base = svc.settings.llm_upstream_url
    key = svc.settings.llm_key(dialect.value)
    if not base:
        return llm_error(dialect, 503, "no LLM upstream is configured: set FLUIDBOX_LLM_UPSTREAM_URL")
    if key is None:
        hint = "OPENAI_API_KEY" if dialect is Dialect.OPENAI else "ANTHROPIC_API_KEY"
        return llm_error(dialect, 503, f"no LLM upstream key is configured: set FLUIDBOX_LLM_UPSTREAM_KEY or {hint}")

    raw = await request.body()
    refusal: FacadeError | None = None
    ask: Ask | None = None
    forward = raw
    try:
        body, forward = inspect_body(dialect, raw, spec)
        ask = Ask(
            model=spec.model,
            input_tokens=len(forward),
            output_tokens=declared_max_output(dialect, body),
            reserve=upstream_path not in FREE,
        )
    except FacadeError as exc:
        refusal = exc
    verdict = await fac.metering.admit(spec, ask, digest)
    if verdict.kind == "unauthorized":
        fac.tokens.pop(digest, None)
        return llm_error(dialect, 401, "unauthorized")
    if verdict.kind == "inactive":
        return llm_error(dialect, 400, "session is not active")
    if verdict.kind == "exhausted":
        if verdict.stopped:
            await _signal_stop(svc, run_id)
        what = "cost" if verdict.budget == "max_cost_usd" else "token"
        return llm_error(dialect, 400, f"{what} budget exhausted")
    if refusal is not None:
        return llm_error(dialect, refusal.status, refusal.message, refusal.code)
    if verdict.kind == "refused":
        return llm_error(dialect, 429, verdict.message or "refused", verdict.code)

    headers = {"content-type": "application/json", "accept-encoding": "identity"}
    headers["accept"] = request.headers.get("accept", "application/json")
    if dialect is Dialect.ANTHROPIC:
        headers["x-api-key"] = key
        headers["anthropic-version"] = request.headers.get("anthropic-version", ANTHROPIC_VERSION)
        if beta := request.headers.get("anthropic-beta"):
            headers["anthropic-beta"] = beta
    else:
        headers["authorization"] = f"Bearer {key}"
    url = f"{base.rstrip('/')}/{upstream_path}"
    if request.url.query:
        url += f"?{request.url.query}"
    reservation = verdict.reservation_id
    client = fac.client()
    try:
        upstream = await client.send(client.build_request("POST", url, content=forward, headers=headers), stream=True)
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        if reservation:
            await fac.metering.release(run_id, reservation, "upstream unreachable")
        return llm_error(dialect, 502, f"the LLM upstream could not be reached ({type(exc).__name__})")
    except httpx.HTTPError as exc:
        # Sent, but no answer: the upstream may have served it, so the reservation stays (expiry charges it).
        log.warning("LLM upstream failed for run %s before answering: %s", run_id, type(exc).__name__)
        return llm_error(dialect, 502, f"the LLM upstream failed before answering ({type(exc).__name__})")

    passed = {k: v for k in PASS_HEADERS if (v := upstream.headers.get(k)) is not None}
    if upstream.status_code >= 300:
        content = await upstream.aread()
        await upstream.aclose()
        if reservation and upstream.status_code in RELEASE_STATUSES:
            await fac.metering.release(run_id, reservation, f"upstream refused ({upstream.status_code})")
        elif reservation:
            await fac.metering.unmetered(run_id, reservation, f"upstream answered {upstream.status_code}")
        content = content.replace(key.encode(), MARK.encode())
        return Response(content, status_code=upstream.status_code, headers=passed)

    streaming = upstream.headers.get("content-type", "").startswith("text/event-stream")
    if streaming:
        passed.update({"cache-control": "no-cache", "x-accel-buffering": "no"})
    elif "content-length" in upstream.headers:
        passed["content-length"] = upstream.headers["content-length"]
    meter = (SseMeter(dialect) if streaming else BodyMeter(dialect)) if reservation else None
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()
    listening = [True]

    async def pump() -> None:
        """Read the upstream to its end whatever the client does, then settle the reservation."""
        ttfb: int | None = None
        failure: str | None = None
        try:
            async for chunk in upstream.aiter_raw():
                if ttfb is None:
                    ttfb = int((time.perf_counter() - started) * 1000)
                if meter is not None:
                    meter.feed(chunk)
                if listening[0]:
                    queue.put_nowait(chunk)
        except httpx.HTTPError as exc:
            failure = f"upstream stream broke ({type(exc).__name__})"
        finally:
            queue.put_nowait(None)
            await upstream.aclose()
        if reservation is None or meter is None:
            return
        latency = int((time.perf_counter() - started) * 1000)
        try:
            usage = meter.result()
            if usage is None:
                await fac.metering.unmetered(run_id, reservation, failure or "no complete usage report")
            else:
                await fac.metering.charge(run_id, reservation, spec.model, usage, latency_ms=latency, ttfb_ms=ttfb)
        except Exception:
            log.exception("recording usage for reservation %s failed; it stays reserved", reservation)

    fac.spawn(pump())

    async def relay() -> AsyncIterator[bytes]:
        try:
            while (chunk := await queue.get()) is not None:
                yield chunk
        finally:
            listening[0] = False  # a client gone mid-stream: the pump keeps draining for the meter

    return StreamingResponse(relay(), status_code=upstream.status_code, headers=passed)


async def _signal_stop(svc: Services, run_id: str) -> None:
    """Wake the run's workflow at once (its supervisor would also find the durable intent)."""
    try:
        await run_handle(await svc.temporal(), run_id).signal(RunWorkflow.cancel)
    except Exception:
        log.warning("budget-stop signal for run %s not delivered; the supervisor will see the intent", run_id)
