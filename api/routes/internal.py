"""The runner plane (``/internal``): reached from the sandbox over the gateway socket.

Every route authenticates a run-scoped token and checks its audience first.
"""

from __future__ import annotations

import asyncio
from asyncio import FIRST_COMPLETED
from typing import Any

from fastapi import APIRouter, Body, Request
from pydantic import BaseModel, ConfigDict, Field

from api import responses as out
from api.deps import ContextDep, HubDep, bearer, run_token
from api.errors import RunnerErrorBody, errors
from api.hub import EventHub
from core import discovery
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
from core.digests import input_digest
from core.dynamic_connections import PROPOSE_CONNECTION, check_proposal
from core.errors import BadRequest, Unauthorized
from core.runspec import RunSpec
from core.states import RunStatus, accepts_work, is_terminal
from core.tokens import Audience
from core.tools import split_mcp
from db.connections import CLAIM_TTL_SECS, MAX_ATTEMPTS
from db.models.connections import ToolExecutionClaim
from services.context import AppContext

router = APIRouter(prefix="/internal", tags=["internal"])
RUNNER_EVENT_TYPES = (ev.AGENT_MESSAGE, ev.RUN_ERROR, "tool.completed")
RUNNER_ACTORS = frozenset({"agent", "harness"})
INACTIVE = PermissionResponse(decision="deny", message="session is not active")
SETTLED_RECHECK_SECS = 2.0  # a held tool call re-reads its approval this often without a wake-up


async def gate(ctx: AppContext, hub: EventHub, run_id: str, req: PermissionRequest) -> PermissionResponse:
    """The one gate: answered from PostgreSQL, or held until the tool call's approval is settled.

    A held call waits on two things at once: the run's approval update (the workflow owns the wait,
    its expiry and its cancellation) and the approval row itself, re-read whenever the run's ledger
    moves (the decision's ``approval.decided`` wakes it through LISTEN/NOTIFY). The row is the
    authority either way: a human decision is a compare-and-swap there before the workflow hears
    of it, so answering from it as soon as it settles skips a workflow task on the wake path."""
    outcome = await ctx.gates.decide_call(run_id, req.tool_call_id, req.tool, req.input, req.via)
    if outcome.verdict == "allow":
        return PermissionResponse(decision="allow")
    if outcome.verdict == "deny":
        return PermissionResponse(decision="deny", message=outcome.message)
    with hub.subscribe(run_id) as moved:
        held = asyncio.create_task(_held_by_workflow(ctx, run_id, req))
        try:
            while True:
                moved.clear()  # before the read: a decision committed after it still wakes the wait
                settled = await ctx.approvals.settled_verdict(run_id, req.tool_call_id)
                if settled is not None:
                    return PermissionResponse(decision=settled.verdict, message=settled.message)
                woken = asyncio.create_task(moved.wait())
                try:
                    # The periodic re-read covers a NOTIFY lost while the hub reconnects.
                    await asyncio.wait({held, woken}, timeout=SETTLED_RECHECK_SECS, return_when=FIRST_COMPLETED)
                finally:
                    woken.cancel()
                if held.done():
                    return held.result()
        finally:
            held.cancel()
            if held.done() and not held.cancelled():
                held.exception()  # answered from the row meanwhile: its outcome is not needed, nor logged


async def _held_by_workflow(ctx: ContextDep, run_id: str, req: PermissionRequest) -> PermissionResponse:
    verdict = await ctx.run_control.await_approval(run_id, req.tool_call_id)
    if verdict is None:
        return INACTIVE
    if verdict.decision == "allow":
        return PermissionResponse(decision="allow")
    return PermissionResponse(decision="deny", message=verdict.message or "denied")


RUNNER_TOKEN = (401, 403, 404)  # no or unknown token; wrong audience; a token of another run


def refusals(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return errors(*RUNNER_TOKEN, *statuses, model=RunnerErrorBody)


@router.get("/health", summary="Runner-plane liveness (no token, touches nothing)", response_model=out.Health,
            responses=errors())  # fmt: skip
async def health() -> dict[str, str]:
    """What a runner (or a benchmark baseline) can reach on the gateway socket without a token."""
    return {"status": "ok"}


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
    return await gate(ctx, hub, run_id, req)


async def _deferred_spec(ctx: ContextDep, run_id: str, request: Request) -> RunSpec:
    principal = await run_token(request, ctx, run_id, Audience.TOOL)
    if not accepts_work(principal.status):
        raise BadRequest("session is not active")
    spec = await ctx.runs.run_spec(run_id)
    if spec.tool_discovery != "deferred":
        raise BadRequest("this run sees its brokered tools directly: tool discovery is not deferred")
    return spec


@router.post(
    "/sessions/{run_id}/tools/search",
    summary="tool_search: rank the run's frozen brokered tools",
    response_model=out.ToolSearchResult,
    responses=refusals(400),
)
async def tools_search(run_id: str, req: ToolSearchRequest, request: Request, ctx: ContextDep) -> dict[str, Any]:
    """Deferred discovery, answered from the frozen RunSpec; a slot whose connection cannot be used now is
    listed with ``needsAuthorization: true``, never left out. Reads only: nothing is gated or spent."""
    spec = await _deferred_spec(ctx, run_id, request)
    unusable = await ctx.connections.unusable_slots(run_id)
    return {"tools": discovery.search(spec, req.query, req.limit, unusable)}


@router.post(
    "/sessions/{run_id}/tools/describe",
    summary="tool_describe: one frozen tool's schema",
    response_model=out.ToolDescription,
    responses=refusals(400),
)
async def tools_describe(run_id: str, req: ToolDescribeRequest, request: Request, ctx: ContextDep) -> dict[str, Any]:
    """The frozen definition the gate validates a call against; a tool outside the run's frozen set is a 400."""
    spec = await _deferred_spec(ctx, run_id, request)
    found = discovery.describe(spec, req.name, await ctx.connections.unusable_slots(run_id))
    if found is None:
        raise BadRequest(f"tool '{req.name}' is not in this run's frozen tool set (names are mcp__<slot>__<tool>)")
    return found


def stale_claim_event(claim: ToolExecutionClaim) -> ev.NewEvent:
    return ev.NewEvent(
        type="tool.brokered",
        data={
            "tool_call_id": claim.tool_call_id,
            "tool": claim.tool,
            "binding_id": str(claim.binding_id),
            "ok": False,
            "outcome": "ambiguous",
            "error": "dispatcher lost while the call was in flight",
        },
    )


def _envelope(claim: ToolExecutionClaim) -> dict[str, Any]:
    state = claim.state
    if state in ("succeeded", "failed_upstream"):
        # Definitive outcomes: upstream failure travels as result.is_error (MCP convention).
        return {"ok": True, "result": claim.result}
    if state == "refused":
        return {"ok": False, "denied": True, "message": claim.error}
    if state == "ambiguous":
        return {"ok": False, "error": "brokered call outcome ambiguous — not retried"}
    if state == "failed_before_send":
        if claim.attempts >= MAX_ATTEMPTS:
            return {
                "ok": False,
                "error": f"brokered dispatch failed before send on {claim.attempts} attempts — not retried "
                "(execution attempts exhausted)",
            }
        return {"ok": False, "error": claim.error}
    return {"ok": False, "error": "execution in flight; retry later"}


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
) -> dict[str, Any]:
    """Refused with the reason unless the agent enables dynamic connections, the host is in its ``allowedHosts``
    and the proposal carries no command, arguments, environment or secret; then gated as ``ProposeConnection``
    (a human approval by default) and, once allowed, saved as a ``pending`` connection without a credential."""
    principal = await run_token(request, ctx, run_id, Audience.TOOL)
    if not accepts_work(principal.status):
        raise BadRequest("session is not active")
    spec = await ctx.runs.run_spec(run_id)
    proposal = check_proposal(spec.harness_config, req.connection)
    proposal["base_url"] = (await ctx.connection_service.admit(proposal["base_url"])).url
    await ctx.connections.record_proposal(run_id, req.tool_call_id, proposal)
    decision = await gate(
        ctx, hub, run_id, PermissionRequest(tool_call_id=req.tool_call_id, tool=PROPOSE_CONNECTION, input=proposal)
    )
    if decision.decision != "allow":
        return {"ok": False, "denied": True, "message": decision.message}
    row, _ = await ctx.connections.save_proposal(spec.tenant_id, run_id, req.tool_call_id, proposal, spec.agent_name)
    return {"ok": True, "connection_id": str(row.id), "status": row.status}


@router.post(
    "/sessions/{run_id}/tools/call",
    summary="Execute a brokered MCP tool in the control plane",
    response_model=out.BrokeredResult,
    response_model_exclude_unset=True,
    responses=refusals(429, 503),
)
async def tools_call(
    run_id: str, req: PermissionRequest, request: Request, ctx: ContextDep, hub: HubDep
) -> dict[str, Any]:
    """The same gate as /permission, then the execution claim and the call with the sealed credential."""
    principal = await run_token(request, ctx, run_id, Audience.TOOL)
    if not accepts_work(principal.status):
        raise BadRequest("session is not active")
    spec = await ctx.runs.run_spec(run_id)
    split = split_mcp(req.tool)
    surface = next((b for b in spec.brokered if split and b["slot"] == split[0]), None)
    if (
        split
        and surface is None
        and any(s.get("name") == split[0] for bundle in spec.capabilities for s in bundle.get("servers", []))
    ):
        raise BadRequest(f"tool '{req.tool}' is sandbox-class — it executes inside the sandbox, not through the broker")
    if surface is not None and surface.get("transport") == "sandbox_cli":
        raise BadRequest(
            f"tool '{req.tool}' is a sandbox CLI tool — it executes inside the sandbox, not through the broker"
        )
    if surface is None:
        # Refused before the gate: nothing is registered and no budget is spent.
        raise BadRequest(
            f"tool '{req.tool}' is not a brokered tool of this run (brokered tools are mcp__<slot>__<tool>)"
        )
    decision = await gate(ctx, hub, run_id, req)
    if decision.decision == "deny":
        return {"ok": False, "denied": True, "message": decision.message}
    digest = input_digest(req.tool, req.input)
    registered = await ctx.connections.register_claim(
        run_id, req.tool_call_id, digest, surface["binding_id"], req.tool, req.input
    )
    claim = registered.claim
    if registered.lapsed:
        # This call's own claim has been in flight past its TTL (by the database's clock, the one that wrote
        # claimed_at): its dispatcher died, so it becomes ambiguous instead of being re-attached. Other calls'
        # stale claims are swept when they are retried, or settled ambiguous when the run ends; a call whose claim
        # has not lapsed skips the sweep (a transaction of three round trips on every call otherwise).
        await ctx.connections.expire_stale(run_id, CLAIM_TTL_SECS, stale_claim_event)
        claim = await ctx.connections.claim(run_id, req.tool_call_id, digest) or claim
    if claim.state in ("registered", "failed_before_send", "claimed") and claim.attempts < MAX_ATTEMPTS:
        # The attempt number is in the update id: a duplicate re-attaches to the same execution,
        # and only a proven pre-send failure ever gets a fresh one.
        attempt = claim.attempts + (0 if claim.state == "claimed" else 1)
        await ctx.run_control.broker(run_id, req.tool_call_id, digest, attempt)
        claim = await ctx.connections.claim(run_id, req.tool_call_id, digest) or claim
    return _envelope(claim)


@router.post(
    "/sessions/{run_id}/events",
    summary="Runner narration",
    response_model=out.EventAccepted,
    response_model_exclude_unset=True,
    responses=refusals(),
)
async def post_event(run_id: str, body: EventPost, request: Request, ctx: ContextDep) -> dict[str, Any]:
    """Stored redacted; a runner cannot write ``tool.requested`` (only the gate does)."""
    principal = await run_token(request, ctx, run_id, Audience.CONTROL)
    if body.body.type == ev.TOOL_REQUESTED:
        return {"seq": None, "dropped": ev.TOOL_REQUESTED}
    if body.body.type not in RUNNER_EVENT_TYPES:
        # Decisions, status changes and results are the server's to write, never a runner's.
        raise BadRequest(
            f"event type '{body.body.type}' cannot be posted by a runner (allowed: {', '.join(RUNNER_EVENT_TYPES)})"
        )
    if not accepts_work(principal.status) and principal.status != RunStatus.CANCELLING:
        raise BadRequest("session is not active")
    actor = body.actor if body.actor in RUNNER_ACTORS else "agent"  # a runner never speaks as a human
    event = ev.NewEvent(type=body.body.type, actor=actor, data=body.body.data)
    return {"seq": await ctx.ledger.append_events(run_id, [event])}


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
async def result(run_id: str, body: ResultPost, request: Request, ctx: ContextDep) -> dict[str, Any]:
    """Records the wind-down intent; the server alone decides the terminal status."""
    principal = await run_token(request, ctx, run_id, Audience.CONTROL, allow_revoked=True)
    if principal.revoked and not is_terminal(principal.status):
        raise Unauthorized()
    outcome = body.outcome if body.outcome in ("completed", "failed", "cancelled", "budget_exceeded") else "failed"
    reason = None if outcome == "completed" else f"runner reported {body.outcome}"
    created, status = await ctx.run_control.record_result(run_id, outcome, summary=body.summary, reason=reason)
    if is_terminal(status):
        return {"ok": True, "note": "already terminal"}
    if not created:
        return {"ok": True, "note": "finalizing"}
    return {"ok": True}


@router.post("/token/renew", summary="Extend the run's tokens", response_model=out.Renewed, responses=refusals())
async def renew(request: Request, ctx: ContextDep, body: dict[str, Any] = Body(default_factory=dict)) -> dict[str, Any]:
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
    return {"renewed": True, "ttl_secs": ttl}
