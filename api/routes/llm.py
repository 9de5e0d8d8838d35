"""The LLM facade (runner plane): metered, budgeted model traffic with the real key swapped in.

A sandbox holds no provider key. Its model client (the Claude Agent SDK, later Codex) points its base
URL at ``/internal/llm`` and presents the run's ``llm``-audience token as its API key. Per request:

    token (x-api-key or bearer) → audience → dialect path → upstream configured →
    [one statement, serialized per run: token still valid → session accepts work → recorded usage under
     the caps (else ``budget.exceeded`` + finalize ``budget_exceeded``) → body refusals → reservation]
    → forward with the real key → stream back byte for byte while a meter reads the usage →
    after the upstream drains: ``usage_entries`` row + ``model.response`` event (reservation charged)

``POST /internal/llm/…`` is served by :func:`serve`, plain ASGI called by the request guard ahead of the
router, and the upstream by one pooled aiohttp session per process: both halve what the facade adds
before the first byte (docs/decisions.md). The upstream is read to its end whatever the client does,
so a client that disconnects mid-stream is still charged for what the upstream reports; a stream that
breaks ends with the provider's SSE error event. Errors use the provider's error shape, except
``wrong_audience`` which is byte-stable for every runner route.

This module is the ASGI handling and the reservation's bookkeeping; the body checks and error shapes are
pure (:mod:`core.llm_body`) and the upstream client is :mod:`integrations.llm_upstream`. It also answers
LiteLLM's usage callback (``POST /internal/llm-usage``), a stub: the facade is the metering source.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Body
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Message, Receive, Scope, Send

from api import responses as out
from api.deps import ContextDep, bearer, wrong_audience_response
from api.errors import errors
from core.errors import DomainError
from core.llm_body import FREE, ROUTES, FacadeError, dialect_of, dialect_of_path, error_body, inspect_body, stream_error
from core.tokens import Audience, token_digest
from core.usage import BodyMeter, Dialect, SseMeter, declared_max_output
from db.usage import Ask, Metering
from integrations import llm_upstream as up
from services.context import AppContext

log = logging.getLogger("fluidbox.api.llm")
PREFIX = "/internal/llm"
router = APIRouter(prefix="/internal", tags=["internal"])

# The one upstream answer that proves non-dispatch (the key was refused before any model work). Any other
# error may have been billed behind a proxy (LiteLLM retries and fallbacks), so it keeps its reservation.
RELEASE_STATUSES = frozenset({401})
MAX_REMEMBERED_TOKENS = 65536
CLIENT_SEND_TIMEOUT_SECS = 60.0


def llm_error(dialect: Dialect, status: int, message: str, code: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(dialect, status, message, code), status_code=status)


class Facade:
    """Per-process facade state: the shared upstream client and the token → run map."""

    def __init__(self, ctx: AppContext) -> None:
        self.ctx = ctx
        settings = ctx.settings
        self.upstream = up.LlmUpstream(
            timeout_secs=settings.llm_upstream_timeout_secs, keepalive_secs=settings.llm_upstream_keepalive_secs
        )
        # token sha256 → (run id, audience): fixed when a token is minted, so it can be kept; whether the
        # token is still valid (revoked, expired) is checked by every admission, in the same statement.
        self.tokens: dict[str, tuple[str, str]] = {}

    def remember(self, digest: str, run_id: str, audience: str) -> None:
        if len(self.tokens) >= MAX_REMEMBERED_TOKENS:
            self.tokens.clear()
        self.tokens[digest] = (run_id, audience)

    @property
    def metering(self) -> Metering:
        assert self.ctx.metering is not None
        return self.ctx.metering


def facade_of(app: Starlette) -> Facade:
    facade: Facade | None = getattr(app.state, "llm_facade", None)
    if facade is None:
        facade = Facade(app.state.context)
        app.state.llm_facade = facade
    return facade


async def close_facade(app: Starlette) -> None:
    facade: Facade | None = getattr(app.state, "llm_facade", None)
    if facade is not None:
        await facade.upstream.close()


async def sweep_reservations(metering: Metering, period: float) -> None:
    """Runs in every API process: expired reservations become conservative charges (a CAS per row)."""
    while True:
        try:
            await metering.expire_due()
        except Exception:
            log.warning("reservation expiry sweep failed; retrying", exc_info=True)
        await asyncio.sleep(period)


@router.api_route("/llm", methods=["HEAD", "GET"], include_in_schema=False)
@router.api_route("/llm/", methods=["HEAD", "GET"], include_in_schema=False)
async def probe() -> Response:
    """Model clients probe their base URL before the first call; nothing is forwarded."""
    return Response(status_code=200)


@router.post(
    "/llm-usage",
    summary="LiteLLM's usage callback (a stub: usage is metered by the facade)",
    response_model=out.LlmUsageAck,
    response_model_exclude_unset=True,
    responses=errors(),
)
async def llm_usage(request: Request, ctx: ContextDep, _report: Any = Body(default=None)) -> out.LlmUsageAck:
    """Any JSON body. ``{"ok": true}`` when ``Authorization`` carries ``LITELLM_MASTER_KEY`` (bare or after a
    scheme such as ``Bearer``), else ``{"ignored": "unauthenticated"}``; nothing is stored either way, so a
    proxy configured with this callback never fails and never counts a request twice."""
    key = ctx.settings.litellm_master_key
    presented = request.headers.get("authorization", "").strip()
    secret = key.get_secret_value().encode() if key is not None else b""
    candidates = (presented, presented.partition(" ")[2].strip())
    if secret and any(hmac.compare_digest(c.encode(), secret) for c in candidates):
        return out.LlmUsageAck(ok=True)
    return out.LlmUsageAck(ignored="unauthenticated")


async def serve(scope: Scope, receive: Receive, send: Send) -> None:
    """The facade, as plain ASGI in front of the router (see :mod:`api.guard`): a model call's first byte
    waits for nothing it does not need (no routing table walk, no dependency solving, no response task)."""
    started = time.perf_counter()
    request = Request(scope, receive)
    path = str(scope["path"])[len(PREFIX) + 1 :].strip("/")
    guess = dialect_of_path(path)
    try:
        answer = await _admit_and_forward(request, path, guess, started)
    except DomainError as exc:
        answer = llm_error(guess, exc.status, exc.message)
    except Exception:
        log.exception("the LLM facade failed on a request")
        answer = llm_error(guess, 500, "internal error in the LLM facade")
    if isinstance(answer, Response):
        await answer(scope, receive, send)
    else:
        await answer.relay(send)


@dataclass
class Forward:
    """An admitted request the upstream answered 2xx: relayed to the client while the meter reads it."""

    facade: Facade
    upstream: up.UpstreamResponse
    headers: list[tuple[bytes, bytes]]
    run_id: str
    model: str
    reservation: str | None
    meter: SseMeter | BodyMeter | None
    started: float
    dialect: Dialect
    streaming: bool

    async def relay(self, send: Send) -> None:
        """Send each upstream chunk on as it arrives; read the upstream to its end whatever the client
        does (one gone mid-stream is still charged), then settle the reservation."""
        client = _Client(send)
        ttfb: int | None = None
        failure: str | None = None
        await client.send({"type": "http.response.start", "status": self.upstream.status, "headers": self.headers})
        try:
            async for chunk in up.chunks(self.upstream):
                if ttfb is None:
                    ttfb = int((time.perf_counter() - self.started) * 1000)
                if self.meter is not None:
                    self.meter.feed(chunk)
                await client.send({"type": "http.response.body", "body": chunk, "more_body": True})
        except up.READ_ERRORS as exc:
            failure = f"upstream stream broke ({type(exc).__name__})"
        finally:
            if failure is None:
                self.upstream.release()  # back to the pool when read to its end, else closed
            else:
                self.upstream.close()
        end = b""
        if failure is not None:
            log.warning("LLM upstream stream for run %s broke: %s", self.run_id, failure)
            # A stream that breaks must not look complete: SSE clients get the provider's mid-stream error
            # event; a plain body stays short of its Content-Length, so the server drops the connection.
            end = stream_error(self.dialect, f"the LLM {failure}") if self.streaming else b""
        await client.send({"type": "http.response.body", "body": end, "more_body": False})
        if self.reservation is None or self.meter is None:
            return
        latency = int((time.perf_counter() - self.started) * 1000)
        metering = self.facade.metering
        try:
            usage = self.meter.result()
            if usage is not None:
                await metering.charge(
                    self.run_id, self.reservation, self.model, usage, latency_ms=latency, ttfb_ms=ttfb
                )
            elif failure is not None:
                await metering.unmetered(self.run_id, self.reservation, failure)
            else:  # read to its end, and still no usage we could parse
                await metering.unparsed(self.run_id)
        except Exception:
            log.exception("recording usage for reservation %s failed; it stays reserved", self.reservation)


class _Client:
    """The client side of a relay: once a send fails or stalls, later sends are skipped (and the upstream
    is still read to its end for the meter)."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.listening = True

    async def send(self, message: Message) -> None:
        if not self.listening:
            return
        try:
            # A client that keeps its connection open but stops reading would otherwise hold this task, the
            # upstream connection and the upstream's generation (its read timer is off while paused).
            async with asyncio.timeout(CLIENT_SEND_TIMEOUT_SECS):
                await self._send(message)
        except Exception:
            # The client disconnected (OSError), stopped reading (TimeoutError), or the server refused the
            # message (a body short of its Content-Length): the server drops the connection itself.
            self.listening = False


async def _admit_and_forward(request: Request, path: str, guess: Dialect, started: float) -> Response | Forward:
    token = request.headers.get("x-api-key") or bearer(request)
    if not token:
        return llm_error(guess, 401, "unauthorized")
    ctx: AppContext = request.app.state.context
    fac = facade_of(request.app)
    digest = token_digest(token)
    known = fac.tokens.get(digest)
    if known is None:
        # First sight of this token in this process: resolve it (and check it) now.
        row = await ctx.tokens.resolve_token(token)
        if row is None or row.expired or row.revoked:
            return llm_error(guess, 401, "unauthorized")
        known = (str(row.session_id), row.audience)
        fac.remember(digest, *known)
    run_id, audience = known
    if audience != Audience.LLM.value:
        return wrong_audience_response()
    spec = await ctx.runs.run_spec(run_id)
    dialect = dialect_of(spec)
    upstream_path = ROUTES[dialect].get(path)
    if upstream_path is None:
        return llm_error(dialect, 404, f"no such {dialect.value} endpoint on the facade: '/{path}'")
    base = ctx.settings.llm_upstream_url
    key = ctx.settings.llm_key(dialect.value)
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
            await _signal_stop(ctx, run_id)
        what = "cost" if verdict.budget == "max_cost_usd" else "token"
        return llm_error(dialect, 400, f"{what} budget exhausted")
    if refusal is not None:
        return llm_error(dialect, refusal.status, refusal.message, refusal.code)
    if verdict.kind == "refused":
        return llm_error(dialect, 429, verdict.message or "refused", verdict.code)

    reservation = verdict.reservation_id
    url = up.request_url(base, upstream_path, request.scope.get("query_string", b"").decode("latin-1"))
    try:
        upstream = await fac.upstream.post(url, forward, up.request_headers(dialect, key, request.headers))
    except up.Unreachable as exc:
        # Nothing was sent: the reservation goes back.
        if reservation:
            await fac.metering.release(run_id, reservation, "upstream unreachable")
        return llm_error(dialect, 502, f"the LLM upstream could not be reached ({exc})")
    except up.NoAnswer as exc:
        # Sent, but no answer: the upstream may have served it, so the reservation stays (expiry charges it).
        log.warning("LLM upstream failed for run %s before answering: %s", run_id, exc)
        return llm_error(dialect, 502, f"the LLM upstream failed before answering ({exc})")

    passed = up.passed_headers(upstream)
    if upstream.status >= 300:
        content = await up.error_content(upstream, key)
        if reservation and upstream.status in RELEASE_STATUSES:
            await fac.metering.release(run_id, reservation, f"upstream refused ({upstream.status})")
        elif reservation:
            await fac.metering.unmetered(run_id, reservation, f"upstream answered {upstream.status}")
        if content is None:
            return llm_error(dialect, upstream.status, f"the LLM upstream answered {upstream.status}")
        return Response(content, status_code=upstream.status, headers=passed)

    try:
        headers, streaming = up.relay_headers(upstream, passed)
        meter = (SseMeter(dialect) if streaming else BodyMeter(dialect)) if reservation else None
        return Forward(fac, upstream, headers, run_id, spec.model, reservation, meter, started, dialect, streaming)
    except BaseException:
        upstream.close()
        if reservation:
            await fac.metering.unmetered(run_id, reservation, "the facade failed while relaying the answer")
        raise


async def _signal_stop(ctx: AppContext, run_id: str) -> None:
    """Wake the run's workflow at once (its supervisor would also find the durable intent)."""
    await ctx.run_control.wake_for_budget(run_id)
