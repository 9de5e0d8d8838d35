"""Result deliveries: the signed webhooks a finished run sends to its destinations."""

from __future__ import annotations

from fastapi import APIRouter

from api import responses as out
from api.deps import ContextDep, OperatorDep
from api.errors import errors
from core.errors import NotFound

router = APIRouter(tags=["deliveries"])


@router.get(
    "/v1/sessions/{run_id}/deliveries",
    summary="The run's result deliveries",
    response_model=out.DeliveryList,
    responses=errors(401, 403, 404),
)
async def session_deliveries(run_id: str, op: OperatorDep, ctx: ContextDep) -> out.DeliveryList:
    """One row per webhook destination: status ``pending|delivered|failed|skipped``, attempts, last error."""
    if await ctx.runs.get_run(op.tenant_id, run_id) is None:
        raise NotFound()
    rows = await ctx.deliveries.for_run(run_id)
    return out.DeliveryList(deliveries=[out.DeliveryPublic.model_validate(r) for r in rows])
