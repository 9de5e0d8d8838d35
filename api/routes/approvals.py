"""The approvals inbox and human decisions (a CAS in PostgreSQL, then a signal to the run)."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter

from activities import contracts as c
from api.deps import OperatorDep, ServicesDep
from api.routes.sessions import run_handle
from api.schemas import DecisionIn, approval_public
from core.errors import BadRequest
from workflows.run import RunWorkflow

log = logging.getLogger("fluidbox.api.approvals")
router = APIRouter(prefix="/v1/approvals", tags=["approvals"])

DECISIONS = {
    "approved_once": "approved_once",
    "approve": "approved_once",
    "allow": "approved_once",
    "approved_session": "approved_session",
    "denied": "denied",
    "deny": "denied",
}


@router.get("", summary="Pending approvals across runs")
async def inbox(op: OperatorDep, svc: ServicesDep) -> dict[str, Any]:
    """Every pending approval of the tenant, oldest first."""
    rows = await svc.store.list_approvals(op.tenant_id)
    return {"approvals": [approval_public(r) for r in rows]}


@router.post("/{approval_id}/decision", summary="Approve or deny")
async def decide(approval_id: str, body: DecisionIn, op: OperatorDep, svc: ServicesDep) -> dict[str, Any]:
    """Exactly one decision wins; a late or repeated one gets 409 ``approval is not pending``."""
    decision = DECISIONS.get(body.decision)
    if decision is None:
        raise BadRequest(f"unknown decision '{body.decision}'")
    row = await svc.store.decide_approval(op.tenant_id, approval_id, decision, op.name)
    try:
        await run_handle(await svc.temporal(), row["session_id"]).signal(
            RunWorkflow.approval_decided, c.ApprovalDecided(tool_call_id=row["tool_call_id"], status=decision)
        )
    except Exception:
        # Settled in PostgreSQL already; the workflow's slow re-read picks it up.
        log.warning("approval signal for run %s not delivered", row["session_id"], exc_info=True)
    return {"approval": approval_public(row)}
