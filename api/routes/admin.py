"""The operator surface for members: list, deactivate (the kill switch) and set roles.

Operator only (a valid PAT gets 403). Deactivation takes effect on the member's very next request
(their PATs answer 401) and on the next brokered call under any of their personal connections, in
runs already in flight too. Every accepted mutation is written to ``auth_audit_log``.
"""

from __future__ import annotations

from fastapi import APIRouter

from api import responses as out
from api.deps import ContextDep, OperatorDep
from api.errors import errors
from api.schemas import _Body
from core.errors import NotFound

router = APIRouter(prefix="/v1/admin/orgs", tags=["admin"])


class RolesIn(_Body):
    roles: list[str]


async def _org_id(ctx: ContextDep, slug: str) -> str:
    org = await ctx.identity.org(slug)
    if org is None:
        raise NotFound()
    return str(org.id)


@router.get(
    "/{slug}/members", summary="Members of an org", response_model=out.MemberList, responses=errors(401, 403, 404)
)
async def members(slug: str, _: OperatorDep, ctx: ContextDep) -> out.MemberList:
    """Every membership with its user's email, name, roles and status."""
    tenant_id = await _org_id(ctx, slug)
    return out.MemberList(members=[out.MemberPublic.model_validate(r) for r in await ctx.identity.members(tenant_id)])


@router.post(
    "/{slug}/members/{membership_id}/deactivate",
    summary="Deactivate a member (the kill switch)",
    response_model=out.MemberOut,
    responses=errors(401, 403, 404, 409),
)
async def deactivate(slug: str, membership_id: str, _: OperatorDep, ctx: ContextDep) -> out.MemberOut:
    """409 when already deactivated."""
    tenant_id = await _org_id(ctx, slug)
    row = await ctx.identity.deactivate(tenant_id, membership_id, actor=("operator", None))
    return out.MemberOut(member=out.MemberPublic.model_validate(row))


@router.post(
    "/{slug}/members/{membership_id}/roles",
    summary="Replace a member's roles",
    response_model=out.MemberOut,
    responses=errors(401, 403, 404, 409),
)
async def set_roles(slug: str, membership_id: str, body: RolesIn, _: OperatorDep, ctx: ContextDep) -> out.MemberOut:
    """``roles`` is a non-empty subset of member, approver, admin, owner."""
    tenant_id = await _org_id(ctx, slug)
    row = await ctx.identity.set_roles(tenant_id, membership_id, body.roles, actor=("operator", None))
    return out.MemberOut(member=out.MemberPublic.model_validate(row))
