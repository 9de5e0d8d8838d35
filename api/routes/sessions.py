"""Runs (the API calls them sessions): create, read, cancel, outputs, the ledger and its live stream."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from api import responses as out
from api.deps import ContextDep, HubDep, Principal, PrincipalDep, bearer, user_principal
from api.errors import errors
from api.schemas import SessionCreate
from core.errors import BadRequest, Forbidden, NotFound
from core.runspec import InvocationContext, workspace_doc
from core.states import RunStatus
from db.ledger import LedgerEvent
from db.models.runs import Run
from services.context import AppContext
from services.runs import RunRequest

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])

STREAM_BATCH = 500
SEQ_MAX = 2**63 - 1  # ledger sequence numbers are PostgreSQL bigints
REPOLL_SECS = 2.0
KEEPALIVE_SECS = 15.0


async def _run(ctx: AppContext, tenant_id: str, run_id: str) -> Run:
    row = await ctx.runs.get_run(tenant_id, run_id)
    if row is None:
        raise NotFound()
    return row


async def _visible_run(ctx: AppContext, who: Principal, run_id: str) -> Run:
    """The run if the caller may see it; a plain member sees only runs it invoked (else 404)."""
    row = await _run(ctx, who.tenant_id, run_id)
    if not who.sees_run_invoked_by(row.invoked_by_user_id):
        raise NotFound()
    return row


@router.post("", summary="Start a run", response_model=out.SessionOut, responses=errors(401, 403, 409, 422, 503))
async def create_session(body: SessionCreate, who: PrincipalDep, ctx: ContextDep) -> out.SessionOut:
    """Freeze the RunSpec, record the run as ``created`` and start its workflow; returns at once."""
    if body.workspace is not None and body.repo is not None:
        raise BadRequest("provide either `workspace` or legacy `repo`, not both")
    request = RunRequest(
        agent=body.agent,
        task=body.task,
        workspace=workspace_doc(body.workspace or body.repo),
        autonomous=body.autonomous,
        budgets=body.budgets,
        bindings=body.bindings,
        capabilities=body.capabilities,
        when_unavailable="park",  # an interactive run waits for a connection unless its requirement says fail
    )
    if who.is_operator:
        row = await ctx.run_factory.create(
            who.tenant_id, request, InvocationContext(kind="manual", actor="operator"), invoked_by_kind="operator"
        )
    else:  # a local_copy workspace (asked for or the revision's default) is refused with 403 there
        row = await ctx.run_factory.create(
            who.tenant_id,
            request,
            InvocationContext(kind="manual", actor=f"user:{who.user_id}"),
            invoked_by_kind="user",
            invoked_by_user_id=who.user_id,
        )
    return out.SessionOut(session=out.SessionPublic.model_validate(row))


@router.get("", summary="List runs", response_model=out.SessionList, responses=errors(400, 401))
async def list_sessions(
    who: PrincipalDep,
    ctx: ContextDep,
    limit: int = Query(default=50, ge=1, le=500),
    status: str | None = Query(default=None, description="Only runs in this status, e.g. waiting_for_connection."),
) -> out.SessionList:
    """Newest first; a plain member sees only the runs it invoked."""
    if status is not None and status not in {s.value for s in RunStatus}:
        raise BadRequest(f"unknown status '{status}' (known: {', '.join(s.value for s in RunStatus)})")
    if who.reads_all_runs:
        rows = await ctx.runs.list_runs(who.tenant_id, limit, status)
    else:
        rows = await ctx.identity.runs_invoked_by(who.tenant_id, who.user_id or "", limit, status)
    return out.SessionList(sessions=[out.SessionPublic.model_validate(r) for r in rows])


@router.get(
    "/{run_id}", summary="A run with its usage totals", response_model=out.SessionDetail, responses=errors(401, 404)
)
async def get_session(run_id: str, who: PrincipalDep, ctx: ContextDep) -> out.SessionDetail:
    """404 when the run does not exist or is not visible to the caller."""
    row = await _visible_run(ctx, who, run_id)
    return out.SessionDetail(session=out.SessionPublic.model_validate(row), usage=await ctx.runs.usage_totals(run_id))


@router.post(
    "/{run_id}/cancel", summary="Cancel a run", response_model=out.Cancelled, responses=errors(401, 403, 404, 503)
)
async def cancel_session(run_id: str, who: PrincipalDep, ctx: ContextDep) -> out.Cancelled:
    """``cancelled: false`` when the run is already terminal or already winding down (not an error)."""
    row = await _visible_run(ctx, who, run_id)
    invoker = str(row.invoked_by_user_id) if row.invoked_by_user_id is not None else None
    if not who.mutates_resources and invoker != who.user_id:
        raise Forbidden("cancelling another member's run requires the admin or owner role")
    created = await ctx.run_control.cancel(run_id)
    return out.Cancelled(cancelled=created)


@router.get(
    "/{run_id}/outputs", summary="The run's diff and summary", response_model=out.Outputs, responses=errors(401, 404)
)
async def outputs(run_id: str, who: PrincipalDep, ctx: ContextDep) -> out.Outputs:
    """The diff against the pristine workspace, the summary, and whether the gate was ever consulted."""
    row = await _visible_run(ctx, who, run_id)
    arts = await ctx.runs.artifacts(run_id)
    by_kind = {a.kind: a for a in arts}
    diff = by_kind.get("diff")
    return out.Outputs(
        status=row.status,
        diff=diff.content if diff else None,
        summary=row.result_summary,
        gate_consulted=await ctx.runs.has_gate_calls(run_id),
        artifacts=[out.ArtifactPublic.model_validate(a) for a in arts],
    )


@router.get(
    "/{run_id}/artifacts", summary="The run's artifacts", response_model=out.ArtifactList, responses=errors(401, 404)
)
async def artifacts(run_id: str, who: PrincipalDep, ctx: ContextDep) -> out.ArtifactList:
    """The diff (``changes.patch``) and the summary (``summary.md``)."""
    await _visible_run(ctx, who, run_id)
    return out.ArtifactList(artifacts=[out.ArtifactPublic.model_validate(a) for a in await ctx.runs.artifacts(run_id)])


@router.get(
    "/{run_id}/approvals",
    summary="Every tool intent and approval of the run",
    response_model=out.ApprovalList,
    responses=errors(401, 404),
)
async def session_approvals(run_id: str, who: PrincipalDep, ctx: ContextDep) -> out.ApprovalList:
    """Includes auto-decided intents, not only human approvals."""
    await _visible_run(ctx, who, run_id)
    rows = await ctx.approvals.list_approvals(who.tenant_id, run_id=run_id)
    return out.ApprovalList(approvals=[out.ApprovalPublic.of(r) for r in rows])


@router.get(
    "/{run_id}/events",
    summary="The ledger, after a sequence number",
    response_model=out.EventList,
    responses=errors(401, 404),
)
async def events(
    run_id: str,
    who: PrincipalDep,
    ctx: ContextDep,
    after: int = Query(default=0, ge=0, le=SEQ_MAX),
    limit: int = Query(default=500, ge=1, le=1000),
) -> out.EventList:
    """Ordered by ``seq``, strictly greater than ``after``."""
    await _visible_run(ctx, who, run_id)
    rows = await ctx.ledger.events_after(run_id, after, limit)
    return out.EventList(events=[out.EventPublic.model_validate(r) for r in rows])


def _sse(row: LedgerEvent) -> str:
    data = {
        "seq": row.seq,
        "type": row.type,
        "actor": row.actor,
        "payload": row.payload,
        "occurred_at": row.occurred_at.isoformat(),
    }
    return f"id: {row.seq}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


SSE = {
    "description": "Server-sent events: `id: <seq>` and `data: {seq, type, actor, payload, occurred_at}` per "
    "ledger event, `: keep-alive` comments while quiet.",
    "content": {"text/event-stream": {"schema": {"type": "string"}}},
}


@router.get(
    "/{run_id}/events/stream",
    summary="The ledger as server-sent events",
    response_class=StreamingResponse,
    responses={200: SSE, **errors(401, 404)},
)
async def stream(run_id: str, request: Request, who: PrincipalDep, ctx: ContextDep, hub: HubDep) -> StreamingResponse:
    """Resumes after ``Last-Event-ID``; the same catch-up query as polling, woken by NOTIFY."""
    await _visible_run(ctx, who, run_id)
    raw = request.headers.get("last-event-id", "0").strip() or "0"
    if not raw.isdigit() or len(raw) > 19 or int(raw) > SEQ_MAX:
        raise BadRequest("Last-Event-ID must be a non-negative integer sequence number")
    start = int(raw)
    # A member's stream is re-authorized as it runs: deactivation or a lost role ends it.
    pat = None if who.is_operator else bearer(request)

    async def still_allowed() -> bool:
        if pat is None:
            return True
        now = await user_principal(ctx, pat)
        row = await ctx.runs.get_run(who.tenant_id, run_id)
        return now is not None and row is not None and now.sees_run_invoked_by(row.invoked_by_user_id)

    async def body() -> AsyncIterator[str]:
        last = start
        loop = asyncio.get_running_loop()
        quiet_since = loop.time()
        with hub.subscribe(run_id) as woken:
            while True:
                if not await still_allowed():
                    return
                woken.clear()
                rows = await ctx.ledger.events_after(run_id, last, STREAM_BATCH)
                for row in rows:
                    yield _sse(row)
                    last = row.seq
                if len(rows) == STREAM_BATCH:
                    continue
                if rows:
                    quiet_since = loop.time()
                elif loop.time() - quiet_since >= KEEPALIVE_SECS:
                    yield ": keep-alive\n\n"
                    quiet_since = loop.time()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken.wait(), REPOLL_SECS)

    return StreamingResponse(
        body(), media_type="text/event-stream", headers={"cache-control": "no-cache", "x-accel-buffering": "no"}
    )
