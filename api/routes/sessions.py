"""Runs (the API calls them sessions): create, read, cancel, outputs, the ledger and its live stream."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from temporalio.client import WorkflowHandle
from temporalio.common import (
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)

from activities import contracts as c
from activities.env import runner_env
from api.deps import OperatorDep, Services, ServicesDep
from api.routes.agents import workspace_doc
from api.schemas import (
    ARTIFACT_FIELDS,
    EVENT_FIELDS,
    SESSION_FIELDS,
    SessionCreate,
    approval_public,
    pick,
)
from core.capabilities import frozen_entry
from core.digests import document_digest
from core.errors import BadRequest, NotFound, Unavailable, Unprocessable
from core.harnesses import RUNNABLE
from core.redaction import scrub_text
from core.runspec import InvocationContext, WorkspaceSpec, freeze
from core.states import RunStatus
from db.ids import new_id
from workflows.run import RunWorkflow

log = logging.getLogger("fluidbox.api.sessions")
router = APIRouter(prefix="/v1/sessions", tags=["sessions"])

STREAM_BATCH = 500
MAX_RUNNER_ENV_BYTES = 512 * 1024
REPOLL_SECS = 2.0
KEEPALIVE_SECS = 15.0


async def _run(svc: Services, tenant_id: str, run_id: str) -> dict[str, Any]:
    row = await svc.store.get_run(tenant_id, run_id)
    if row is None:
        raise NotFound()
    return row


def run_handle(client: Any, run_id: str) -> WorkflowHandle[Any, Any]:
    handle: WorkflowHandle[Any, Any] = client.get_workflow_handle(c.workflow_id(run_id))
    return handle


def timing(svc: Services) -> c.Timing:
    s = svc.settings
    return c.Timing(
        liveness_check_secs=s.liveness_check_secs,
        heartbeat_stale_secs=s.heartbeat_stale_secs,
        quiesce_secs=s.quiesce_secs,
        approval_recheck_secs=s.approval_recheck_secs,
    )


async def freeze_capabilities(
    svc: Services, pins: list[dict[str, Any]], keep: list[str] | None
) -> list[dict[str, Any]]:
    """The revision's pinned bundles, narrowed (remove-only) by the run's keep-list; ``[]`` strips all."""
    if keep is not None:
        pinned = {p["name"] for p in pins}
        extra = sorted(set(keep) - pinned)
        if extra:
            raise BadRequest(f"capabilities can only narrow: {', '.join(extra)} not attached to this agent's revision")
        pins = [p for p in pins if p["name"] in keep]
    rows = await svc.capabilities.by_ids([p["id"] for p in pins])
    frozen = [frozen_entry(rows[p["id"]]) for p in pins]
    aliases = [s["name"] for b in frozen for s in b["servers"]]
    clash = sorted({a for a in aliases if aliases.count(a) > 1})
    if clash:
        raise BadRequest(f"capability-server alias collision: {', '.join(clash)} is defined by more than one bundle")
    return frozen


def same_url(a: str, b: str) -> bool:
    pa, pb = urlsplit(a), urlsplit(b)
    return (pa.scheme.lower(), pa.netloc.lower(), pa.path.rstrip("/")) == (
        pb.scheme.lower(),
        pb.netloc.lower(),
        pb.path.rstrip("/"),
    )


async def resolve_bindings(
    svc: Services, tenant_id: str, requirements: list[dict[str, Any]], explicit: dict[str, str] | None
) -> list[dict[str, Any]]:
    """Bind every requirement to one active organization connection whose latest snapshot covers
    the required tools, fail closed: an unresolvable requirement refuses the run before anything
    provisions or spends. The effective surface is exactly the required tools."""
    explicit = explicit or {}
    unknown = sorted(set(explicit) - {r["slot"] for r in requirements})
    if unknown:
        raise BadRequest(f"unknown requirement slot(s) in bindings: {', '.join(unknown)}")
    frozen = []
    for req in requirements:
        slot, url, needed = req["slot"], req["connector"]["url"], list(req["required_tools"])
        if req.get("binding_mode") == "invoking_user":
            # Personal connections belong to signed-in users; an operator-started run has no user.
            raise BadRequest(
                f"requirement slot '{slot}' binds to the invoking user's personal connection, and a run "
                "started with the operator token has no user"
            )
        candidates = [c for c in await svc.connections.candidates(tenant_id) if same_url(c["base_url"], url)]
        if slot in explicit:
            candidates = [c for c in candidates if str(c["id"]) == explicit[slot]]
            if not candidates:
                raise BadRequest(
                    f"binding for slot '{slot}': connection {explicit[slot]} is not an active organization "
                    f"connection to {url}"
                )
        chosen = None
        for cand in candidates:
            names = {t["name"] for t in cand["tools_json"]}
            if set(needed) <= names:
                chosen = cand
                break
        if chosen is None:
            raise BadRequest(
                f"requirement slot '{slot}' cannot be bound: no active connection covers {', '.join(needed)} on {url}"
            )
        tools = sorted((t for t in chosen["tools_json"] if t["name"] in needed), key=lambda t: t["name"])
        frozen.append(
            {
                "slot": slot,
                "url": url,
                "binding_id": new_id(),
                "connection_id": str(chosen["id"]),
                "authorization_generation": chosen["authorization_generation"],
                "owner_type": chosen["owner_type"],
                "binding_mode": req.get("binding_mode", "organization"),
                "snapshot_version": chosen["snapshot_version"],
                "protocol_version": chosen["protocol_version"],
                "tools": tools,
                "tools_digest": document_digest(tools),
            }
        )
    return frozen


@router.post("", status_code=201, summary="Start a run")
async def create_session(body: SessionCreate, op: OperatorDep, svc: ServicesDep) -> dict[str, Any]:
    """Freeze the RunSpec, record the run as ``created`` and start its workflow; returns at once."""
    if body.workspace is not None and body.repo is not None:
        raise BadRequest("provide either `workspace` or legacy `repo`, not both")
    store = svc.store
    agent = await store.find_agent(op.tenant_id, body.agent)
    if agent is None:
        raise BadRequest(f"unknown agent '{body.agent}'")
    async with store.pool.acquire() as conn:
        revision = await store.latest_revision(conn, agent["id"])
        if revision is None:
            raise BadRequest("agent has no revisions")
        policy_row = await store.policy_head_by_id(conn, str(revision["policy_id"]))
    capabilities = await freeze_capabilities(svc, revision["capability_bundles"] or [], body.capabilities)
    brokered = await resolve_bindings(svc, op.tenant_id, revision["connection_requirements"] or [], body.bindings)
    sandbox_aliases = {s["name"] for b in capabilities for s in b["servers"]}
    for surface in brokered:
        if surface["slot"] in sandbox_aliases:
            raise BadRequest(
                f"requirement slot '{surface['slot']}' collides with a sandbox capability server of the same "
                "alias — rename the slot"
            )
    if revision["harness"] not in RUNNABLE:
        raise Unprocessable(
            f"harness '{revision['harness']}' cannot run in this build yet (runnable: {', '.join(sorted(RUNNABLE))})"
        )
    ws_doc = workspace_doc(body.workspace or body.repo)
    run_id = new_id()
    spec = freeze(
        run_id=run_id,
        tenant_id=op.tenant_id,
        agent=agent,
        revision=revision,
        policy_row=policy_row,
        task=body.task,
        workspace=WorkspaceSpec.model_validate(ws_doc) if ws_doc else None,
        autonomous=body.autonomous,
        budget_override=body.budgets,
        invocation=InvocationContext(kind="manual", actor=op.name),
        brokered=brokered,
        capabilities=capabilities,
    )
    size = sum(len(k) + len(v) + 2 for k, v in runner_env(spec, svc.settings).items())
    if size > MAX_RUNNER_ENV_BYTES:
        raise Unprocessable(
            f"runner environment is {size} bytes, over the {MAX_RUNNER_ENV_BYTES} byte ceiling — "
            "shorten the task/system prompt or the replay script"
        )
    row = await store.create_run(
        spec,
        invoked_by_kind="operator",
        also=lambda conn: svc.connections.insert_bindings(conn, op.tenant_id, run_id, brokered),
    )
    try:
        client = await svc.temporal()
        await client.start_workflow(
            RunWorkflow.run,
            c.RunInput(
                run_id=run_id,
                agent_name=spec.agent_name,
                max_wall_clock_secs=spec.budgets.max_wall_clock_secs,
                timing=timing(svc),
            ),
            id=c.workflow_id(run_id),
            task_queue=svc.settings.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            search_attributes=TypedSearchAttributes(
                [SearchAttributePair(c.RUN_STATUS, "created"), SearchAttributePair(c.AGENT_NAME, spec.agent_name)]
            ),
            static_summary=scrub_text(f"{spec.agent_name}: {spec.task[:120]}"),
        )
    except Exception as exc:
        log.exception("could not start the workflow of run %s", run_id)
        reason = f"could not start the run workflow: {type(exc).__name__}"
        with contextlib.suppress(Exception):
            await store.request_finalization(run_id, "failed", reason=reason)
            await store.transition(run_id, RunStatus.FINALIZING, reason)
            await store.finish(run_id, RunStatus.FAILED, reason, None, "failed", [], [])
        raise Unavailable("the workflow engine is unavailable; the run was not started") from exc
    return {"session": pick(row, SESSION_FIELDS)}


@router.get("", summary="List runs")
async def list_sessions(
    op: OperatorDep, svc: ServicesDep, limit: int = Query(default=50, ge=1, le=500)
) -> dict[str, Any]:
    """Newest first."""
    rows = await svc.store.list_runs(op.tenant_id, limit)
    return {"sessions": [pick(r, SESSION_FIELDS) for r in rows]}


@router.get("/{run_id}", summary="A run with its usage totals")
async def get_session(run_id: str, op: OperatorDep, svc: ServicesDep) -> dict[str, Any]:
    """404 when the run does not exist or is not visible to the caller."""
    row = await _run(svc, op.tenant_id, run_id)
    return {"session": pick(row, SESSION_FIELDS), "usage": await svc.store.usage_totals(run_id)}


@router.post("/{run_id}/cancel", summary="Cancel a run")
async def cancel_session(run_id: str, op: OperatorDep, svc: ServicesDep) -> dict[str, bool]:
    """``cancelled: false`` when the run is already terminal or already winding down (not an error)."""
    await _run(svc, op.tenant_id, run_id)
    created, _ = await svc.store.request_finalization(run_id, "cancelled", reason="cancelled by user", quiesce=True)
    if created:
        try:
            await run_handle(await svc.temporal(), run_id).signal(RunWorkflow.cancel)
        except Exception:
            # The intent is durable; the workflow's supervisor sees it on its next check.
            log.warning("cancel signal for run %s not delivered", run_id, exc_info=True)
    return {"cancelled": created}


@router.get("/{run_id}/outputs", summary="The run's diff and summary")
async def outputs(run_id: str, op: OperatorDep, svc: ServicesDep) -> dict[str, Any]:
    """The diff against the pristine workspace, the summary, and whether the gate was ever consulted."""
    row = await _run(svc, op.tenant_id, run_id)
    arts = await svc.store.artifacts(run_id)
    by_kind = {a["kind"]: a for a in arts}
    diff = by_kind.get("diff")
    return {
        "status": row["status"],
        "diff": diff["content"] if diff else None,
        "summary": row["result_summary"],
        "gate_consulted": await svc.store.has_gate_calls(run_id),
        "artifacts": [pick(a, ARTIFACT_FIELDS) for a in arts],
    }


@router.get("/{run_id}/artifacts", summary="The run's artifacts")
async def artifacts(run_id: str, op: OperatorDep, svc: ServicesDep) -> dict[str, Any]:
    """The diff (``changes.patch``) and the summary (``summary.md``)."""
    await _run(svc, op.tenant_id, run_id)
    return {"artifacts": [pick(a, ARTIFACT_FIELDS) for a in await svc.store.artifacts(run_id)]}


@router.get("/{run_id}/approvals", summary="Every tool intent and approval of the run")
async def session_approvals(run_id: str, op: OperatorDep, svc: ServicesDep) -> dict[str, Any]:
    """Includes auto-decided intents, not only human approvals."""
    await _run(svc, op.tenant_id, run_id)
    rows = await svc.store.list_approvals(op.tenant_id, run_id=run_id)
    return {"approvals": [approval_public(r) for r in rows]}


@router.get("/{run_id}/events", summary="The ledger, after a sequence number")
async def events(
    run_id: str,
    op: OperatorDep,
    svc: ServicesDep,
    after: int = Query(default=0, ge=0),
    limit: int = Query(default=500, ge=1, le=1000),
) -> dict[str, Any]:
    """Ordered by ``seq``, strictly greater than ``after``."""
    await _run(svc, op.tenant_id, run_id)
    rows = await svc.store.events_after(run_id, after, limit)
    return {"events": [pick(r, EVENT_FIELDS) for r in rows]}


def _sse(row: dict[str, Any]) -> str:
    data = {
        "seq": row["seq"],
        "type": row["type"],
        "actor": row["actor"],
        "payload": row["payload"],
        "occurred_at": row["occurred_at"].isoformat(),
    }
    return f"id: {row['seq']}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


@router.get("/{run_id}/events/stream", summary="The ledger as server-sent events")
async def stream(run_id: str, request: Request, op: OperatorDep, svc: ServicesDep) -> StreamingResponse:
    """Resumes after ``Last-Event-ID``; the same catch-up query as polling, woken by NOTIFY."""
    await _run(svc, op.tenant_id, run_id)
    raw = request.headers.get("last-event-id", "0").strip() or "0"
    if not raw.isdigit():
        raise BadRequest("Last-Event-ID must be a non-negative integer sequence number")
    start = int(raw)

    async def body() -> AsyncIterator[str]:
        last = start
        loop = asyncio.get_running_loop()
        quiet_since = loop.time()
        with svc.hub.subscribe(run_id) as woken:
            while True:
                woken.clear()
                rows = await svc.store.events_after(run_id, last, STREAM_BATCH)
                for row in rows:
                    yield _sse(row)
                    last = row["seq"]
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
