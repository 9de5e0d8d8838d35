"""Who am I, and my personal access tokens.

There is no browser login in this build, so no route here can mint a PAT: minting needs a browser
session (spec), and the operator token belongs to no membership. Tokens are minted by the local
admin command ``fluidbox users token`` (see ``cli/users.py``), which writes to the database directly.
"""

from __future__ import annotations

from fastapi import APIRouter

from api import responses as out
from api.deps import ContextDep, Principal, PrincipalDep
from api.errors import errors
from core.errors import Forbidden

router = APIRouter(prefix="/v1/auth", tags=["auth"])

OPERATOR_HAS_NO_TOKENS = "personal access tokens belong to a membership; the operator token has none"
PAT_CANNOT_MANAGE = "a personal access token cannot mint, extend, or revoke tokens — use a browser session"


def _no_token_management(who: Principal) -> Forbidden:
    return Forbidden(OPERATOR_HAS_NO_TOKENS if who.is_operator else PAT_CANNOT_MANAGE)


@router.get(
    "/me",
    summary="The caller: the operator, or a user with their org and roles",
    response_model=out.Me,
    response_model_exclude_unset=True,
    responses=errors(401),
)
async def me(who: PrincipalDep) -> out.Me:
    """``{"operator": true}`` for the admin token; otherwise the member behind the PAT."""
    if who.is_operator:
        return out.Me(operator=True)
    return out.Me(
        user_id=who.user_id,
        membership_id=who.membership_id,
        org=out.OrgRef(slug=who.org_slug, display_name=who.org_display_name),
        user=out.UserRef(email=who.email, name=who.name),
        roles=sorted(who.roles),
        auth_kind="pat",
    )


@router.get(
    "/tokens",
    summary="The caller's personal access tokens (never the tokens themselves)",
    response_model=out.PatList,
    responses=errors(401, 403),
)
async def list_tokens(who: PrincipalDep, ctx: ContextDep) -> out.PatList:
    """Name, display prefix, expiry and last use of each of the member's PATs."""
    if who.is_operator or who.membership_id is None:
        raise Forbidden(OPERATOR_HAS_NO_TOKENS)
    return out.PatList(tokens=[out.PatPublic.model_validate(t) for t in await ctx.identity.tokens(who.membership_id)])


@router.post(
    "/tokens",
    summary="Mint a personal access token (browser session only)",
    response_model=out.PatMinted,
    responses=errors(401, 403),
)
async def mint_token(who: PrincipalDep) -> out.PatMinted:
    """Always 403 here: neither the operator nor a PAT may mint; use ``fluidbox users token``."""
    raise _no_token_management(who)


@router.delete(
    "/tokens/{token_id}",
    summary="Revoke a personal access token (browser session only)",
    response_model=out.PatRevoked,
    responses=errors(401, 403, 404),
)
async def revoke_token(token_id: str, who: PrincipalDep) -> out.PatRevoked:
    """Always 403 here, for the same reason as minting."""
    raise _no_token_management(who)
