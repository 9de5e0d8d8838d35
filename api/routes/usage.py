"""What a run spent: model usage, cost and registered tool calls."""

from __future__ import annotations

from fastapi import APIRouter

from api import responses as out
from api.deps import ContextDep, OperatorDep
from api.errors import errors
from core.errors import NotFound

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])


@router.get(
    "/{run_id}/cost",
    summary="The run's usage, cost and tool calls",
    response_model=out.CostReport,
    responses=errors(401, 403, 404),
)
async def session_cost(run_id: str, op: OperatorDep, ctx: ContextDep) -> out.CostReport:
    """``usage`` totals as on the run, ``tool_calls`` (registered intents), a per-model/source
    ``breakdown`` (cost null for unpriced models) and the ``reservations`` still in flight."""
    if await ctx.runs.get_run(op.tenant_id, run_id) is None:
        raise NotFound()
    assert ctx.metering is not None
    return out.CostReport.model_validate(await ctx.metering.report(run_id))
