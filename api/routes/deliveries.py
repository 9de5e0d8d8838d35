"""Result deliveries: the signed webhooks a finished run sends to its destinations."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from api.deps import OperatorDep, ServicesDep
from api.schemas import pick
from core.errors import NotFound
from db.deliveries import Deliveries

router = APIRouter(tags=["deliveries"])

DELIVERY_FIELDS = (
    "id",
    "session_id",
    "subscription_id",
    "destination",
    "status",
    "attempts",
    "last_status_code",
    "last_error",
    "payload_digest",
    "next_attempt_at",
    "last_attempt_at",
    "delivered_at",
    "created_at",
    "updated_at",
)


@router.get("/v1/sessions/{run_id}/deliveries", summary="The run's result deliveries")
async def session_deliveries(run_id: str, op: OperatorDep, svc: ServicesDep) -> dict[str, Any]:
    """One row per webhook destination: status ``pending|delivered|failed|skipped``, attempts, last error."""
    if await svc.store.get_run(op.tenant_id, run_id) is None:
        raise NotFound()
    rows = await Deliveries(svc.store).for_run(run_id)
    return {"deliveries": [pick(r, DELIVERY_FIELDS) for r in rows]}
