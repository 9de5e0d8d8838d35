"""The runner plane (``/internal``): reached from the sandbox over the gateway socket.

Every route authenticates a run-scoped token and checks its audience first; the gate, discovery, brokered
calls and proposals are ``services.brokered_calls``.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Request
from pydantic import BaseModel, ConfigDict, Field

from api import responses as out
from api.deps import ContextDep, HubDep, bearer, run_token
from api.errors import RunnerErrorBody, errors
from core import events as ev
from core.contract import (
    EventPost,
    HeartbeatResponse,
    PermissionRequest,
    PermissionResponse,
    ResultPost,
    ToolDescribeRequest,
    ToolSearchRequest,
)
from core.errors import BadRequest, Unauthorized
from core.states import RunStatus, accepts_work, is_terminal
from core.tokens import Audience
from services.brokered_calls import Refused
from services.context import AppContext

router = APIRouter(prefix="/internal", tags=["internal"])
RUNNER_EVENT_TYPES = (ev.AGENT_MESSAGE, ev.RUN_ERROR, "tool.completed")
RUNNER_ACTORS = frozenset({"agent", "harness"})
RUNNER_TOKEN = (401, 403, 404)  # no or unknown token; wrong audience; a token of another run


def refusals(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return errors(*RUNNER_TOKEN, *statuses, model=RunnerErrorBody)


@router.get("/health", summary="Runner-plane liveness (no token, touches nothing)", response_model=out.Health,
            responses=errors())  # fmt: skip
async def health() -> out.Health:
    """What a runner (or a benchmark baseline) can reach on the gateway socket without a token."""
    return out.Health(status="ok")


@router.post(
    "/sessions/{run_id}/permission",
    summary="Gate one tool call",
    response_model_exclude_none=True,
    responses=refusals(429, 503),
)
async def permission(
    run_id: str, req: PermissionRequest, request: Request, ctx: ContextDep, hub: HubDep
) -> PermissionResponse:
    """Allow or deny now; or hold the request while a human decides (re-attaching on retry)."""
    await run_token(request, ctx, run_id, Audience.TOOL)
    return await ctx.brokered_calls.gate(run_id, req, hub)


async def _active_tool_token(request: Request, ctx: AppContext, run_id: str) -> None:
    """A ``tool`` token of this run, which still accepts work."""
    principal = await run_token(request, ctx, run_id, Audience.TOOL)
    if not accepts_work(principal.status):
        raise BadRequest("session is not active")


@router.post(
    "/sessions/{run_id}/tools/search",
    summary="tool_search: rank the run's frozen brokered tools",
    response_model=out.ToolSearchResult,
    responses=refusals(400),
)
async def tools_search(run_id: str, req: ToolSearchRequest, request: Request, ctx: ContextDep) -> out.ToolSearchResult:
    """Deferred discovery, answered from the frozen RunSpec; a slot whose connection cannot be used now is
    listed with ``needsAuthorization: true``, never left out. Reads only: nothing is gated or spent."""
    await _active_tool_token(request, ctx, run_id)
    found = await ctx.brokered_calls.search(run_id, req.query, req.limit)
    return out.ToolSearchResult(tools=[out.DiscoveredTool.model_validate(t) for t in found])


@router.post(
    "/sessions/{run_id}/tools/describe",
    summary="tool_describe: one frozen tool's schema",
    response_model=out.ToolDescription,
    responses=refusals(400),
)
async def tools_describe(
    run_id: str, req: ToolDescribeRequest, request: Request, ctx: ContextDep
) -> out.ToolDescription:
    """The frozen definition the gate validates a call against; a tool outside the run's frozen set is a 400."""
    await _active_tool_token(request, ctx, run_id)
    return out.ToolDescription.model_validate(await ctx.brokered_calls.describe(run_id, req.name))


class ConnectionProposal(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tool_call_id: str = Field(min_length=1, max_length=256)
    connection: dict[str, Any]


@router.post(
    "/sessions/{run_id}/connections/propose",
    summary="Propose a new URL-backed connection (dynamic connections)",
    response_model=out.ProposalResult,
    response_model_exclude_none=True,
    responses=refusals(400, 403),
)
async def propose_connection(
    run_id: str, req: ConnectionProposal, request: Request, ctx: ContextDep, hub: HubDep
) -> out.ProposalResult:
    """Refused with the reason unless the agent enables dynamic connections, the host is in its ``allowedHosts``
    and the proposal carries no command, arguments, environment or secret; then gated as ``ProposeConnection``
    (a human approval by default) and, once allowed, saved as a ``pending`` connection without a credential."""
    await _active_tool_token(request, ctx, run_id)
    saved = await ctx.brokered_calls.propose(run_id, req.tool_call_id, req.connection, hub)
    if isinstance(saved, Refused):
        return out.ProposalResult(ok=False, denied=True, message=saved.message)
    return out.ProposalResult(ok=True, connection_id=str(saved.id), status=saved.status)


@router.post(
    "/sessions/{run_id}/tools/call",
    summary="Execute a brokered MCP tool in the control plane",
    response_model=out.BrokeredResult,
    response_model_exclude_unset=True,
    responses=refusals(429, 503),
)
async def tools_call(
    run_id: str, req: PermissionRequest, request: Request, ctx: ContextDep, hub: HubDep
) -> out.BrokeredResult:
    """The same gate as /permission, then the execution claim and the call with the sealed credential."""
    await _active_tool_token(request, ctx, run_id)
    outcome = await ctx.brokered_calls.call(run_id, req, hub)
    if isinstance(outcome, Refused):
        return out.BrokeredResult.refused(outcome.message)
    return out.BrokeredResult.of(outcome)


@router.post(
    "/sessions/{run_id}/events",
    summary="Runner narration",
    response_model=out.EventAccepted,
    response_model_exclude_unset=True,
    responses=refusals(),
)
async def post_event(run_id: str, body: EventPost, request: Request, ctx: ContextDep) -> out.EventAccepted:
    """Stored redacted; a runner cannot write ``tool.requested`` (only the gate does)."""
    principal = await run_token(request, ctx, run_id, Audience.CONTROL)
    if body.body.type == ev.TOOL_REQUESTED:
        return out.EventAccepted(seq=None, dropped=ev.TOOL_REQUESTED)
    if body.body.type not in RUNNER_EVENT_TYPES:
        # Decisions, status changes and results are the server's to write, never a runner's.
        raise BadRequest(
            f"event type '{body.body.type}' cannot be posted by a runner (allowed: {', '.join(RUNNER_EVENT_TYPES)})"
        )
    if not accepts_work(principal.status) and principal.status != RunStatus.CANCELLING:
        raise BadRequest("session is not active")
    actor = body.actor if body.actor in RUNNER_ACTORS else "agent"  # a runner never speaks as a human
    event = ev.NewEvent(type=body.body.type, actor=actor, data=body.body.data)
    return out.EventAccepted(seq=await ctx.ledger.append_events(run_id, [event]))


@router.post("/sessions/{run_id}/heartbeat", summary="Runner liveness", responses=refusals())
async def heartbeat(run_id: str, request: Request, ctx: ContextDep) -> HeartbeatResponse:
    """``action: quiesce`` while the run is being cancelled (level-triggered)."""
    await run_token(request, ctx, run_id, Audience.CONTROL)
    status = await ctx.runs.heartbeat(run_id)
    return HeartbeatResponse(action="quiesce" if status == RunStatus.CANCELLING else None)


@router.post(
    "/sessions/{run_id}/result",
    summary="The runner's outcome",
    response_model=out.Ok,
    response_model_exclude_unset=True,
    responses=refusals(503),
)
async def result(run_id: str, body: ResultPost, request: Request, ctx: ContextDep) -> out.Ok:
    """Records the wind-down intent; the server alone decides the terminal status."""
    principal = await run_token(request, ctx, run_id, Audience.CONTROL, allow_revoked=True)
    if principal.revoked and not is_terminal(principal.status):
        raise Unauthorized()
    outcome = body.outcome if body.outcome in ("completed", "failed", "cancelled", "budget_exceeded") else "failed"
    reason = None if outcome == "completed" else f"runner reported {body.outcome}"
    created, status = await ctx.run_control.record_result(run_id, outcome, summary=body.summary, reason=reason)
    if is_terminal(status):
        return out.Ok(ok=True, note="already terminal")
    if not created:
        return out.Ok(ok=True, note="finalizing")
    return out.Ok(ok=True)


@router.post("/token/renew", summary="Extend the run's tokens", response_model=out.Renewed, responses=refusals())
async def renew(request: Request, ctx: ContextDep, body: dict[str, Any] = Body(default_factory=dict)) -> out.Renewed:
    """Extends all four tokens of the run (at most 3 h from now)."""
    token = bearer(request) or ""
    row = await ctx.tokens.resolve_token(token)
    if row is None:
        raise Unauthorized()
    principal = await run_token(request, ctx, str(row.session_id), Audience.CONTROL)
    ttl = body.get("ttl_secs", ctx.settings.token_ttl_secs)
    if not isinstance(ttl, int) or ttl <= 0:
        raise BadRequest("ttl_secs must be a positive integer")
    ttl = min(ttl, ctx.settings.token_ttl_secs)
    if not accepts_work(principal.status):
        raise BadRequest("session is not active — token cannot be renewed")
    await ctx.tokens.renew_tokens(principal.run_id, ttl)
    return out.Renewed(renewed=True, ttl_secs=ttl)
