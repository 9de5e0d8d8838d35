"""Liveness (no dependencies) and readiness (database + Temporal)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Response

from api import responses as out
from api.deps import ContextDep
from api.errors import errors
from core.harnesses import HARNESSES, RUNNABLE

router = APIRouter(tags=["health"])


@router.get("/v1/health", summary="Process liveness", response_model=out.Health, responses=errors())
async def health() -> out.Health:
    """Answers while the process runs; touches nothing."""
    return out.Health(status="ok")


@router.get(
    "/v1/ready",
    summary="Readiness: database and Temporal",
    response_model=out.Readiness,
    responses={**errors(), 503: {"model": out.Readiness, "description": "Not ready (same body, status not ready)."}},
)
@router.get("/v1/health/ready", include_in_schema=False)
async def ready(ctx: ContextDep, response: Response) -> out.Readiness:
    """200 only when PostgreSQL answers and the Temporal namespace is reachable."""
    db_ok = temporal_ok = False
    try:
        async with ctx.pool.acquire() as conn:
            db_ok = await asyncio.wait_for(conn.fetchval("SELECT true"), 5)
    except Exception:
        db_ok = False
    try:
        client = await asyncio.wait_for(ctx.temporal(), 5)
        await asyncio.wait_for(client.service_client.check_health(), 5)
        temporal_ok = True
    except Exception:
        temporal_ok = False
    ok = bool(db_ok and temporal_ok)
    response.status_code = 200 if ok else 503
    return out.Readiness(
        status="ready" if ok else "not ready",
        db=bool(db_ok),
        temporal=temporal_ok,
        provider=ctx.settings.sandbox_provider,
    )


@router.get("/v1/harnesses", summary="Harnesses and their models", response_model=out.Harnesses, responses=errors())
async def harnesses() -> out.Harnesses:
    """The single source of truth of harness ids and the models each accepts."""
    return out.Harnesses(
        harnesses=[out.Harness(id=hid, **h, available=hid in RUNNABLE) for hid, h in HARNESSES.items()],
        network=out.NetworkSupport(enforcer="none", supports_egress_grants=False),
    )
