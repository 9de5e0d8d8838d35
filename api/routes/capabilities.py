"""Capability bundles: sandbox-class MCP servers, published as append-only versions."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from api import responses as out
from api.deps import ContextDep, OperatorDep
from api.errors import errors
from core.capabilities import parse_bundle
from core.digests import document_digest
from core.errors import found

router = APIRouter(prefix="/v1/capabilities", tags=["capabilities"])


@router.post(
    "",
    summary="Publish a capability bundle (a new version when the name exists)",
    response_model=out.BundleOut,
    responses=errors(401, 403, 409),
)
async def publish(body: dict[str, Any], op: OperatorDep, ctx: ContextDep) -> out.BundleOut:
    """Sandbox-class servers only; brokered tools are connection requirements now."""
    bundle = parse_bundle(body)
    definition = bundle.model_dump(mode="json", by_alias=True, exclude_none=True)
    row = await ctx.capabilities.publish(
        op.tenant_id, bundle.name, bundle.description, definition, document_digest(definition)
    )
    return out.BundleOut(bundle=out.BundleSummary.of(row))


@router.get("", summary="List capability bundles", response_model=out.BundleList, responses=errors(401, 403))
async def list_bundles(op: OperatorDep, ctx: ContextDep) -> out.BundleList:
    """Every version, newest first within a name."""
    return out.BundleList(bundles=[out.BundleSummary.of(r) for r in await ctx.capabilities.all(op.tenant_id)])


@router.get(
    "/{bundle_id}",
    summary="One bundle version with its servers and tools",
    response_model=out.BundleDetail,
    responses=errors(401, 403, 404),
)
async def get_bundle(bundle_id: str, op: OperatorDep, ctx: ContextDep) -> out.BundleDetail:
    """Tools are listed by name and description; schemas are in the frozen RunSpec of each run."""
    return out.BundleDetail.of(found(await ctx.capabilities.get(op.tenant_id, bundle_id)))
