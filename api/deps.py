"""Request dependencies: the process's context from app state, and the kinds of principal."""

from __future__ import annotations

import hmac
import uuid
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.responses import JSONResponse

from api.hub import EventHub
from core.contract import WRONG_AUDIENCE
from core.digests import sha256_hex
from core.errors import DomainError, Forbidden, NotFound, Unauthorized
from core.tokens import Audience
from services.context import AppContext


async def context(request: Request) -> AppContext:
    """The process's object graph (``services.context``), built once by ``create_app``'s lifespan."""
    ctx: AppContext = request.app.state.context
    return ctx


ContextDep = Annotated[AppContext, Depends(context)]


async def boot_tenant(request: Request) -> str:
    """The boot organization's id: the operator's tenant."""
    tenant: str = request.app.state.boot_tenant
    return tenant


BootTenantDep = Annotated[str, Depends(boot_tenant)]


async def event_hub(request: Request) -> EventHub:
    """The process's one LISTEN connection, fanning ledger notifications out to live streams."""
    hub: EventHub = request.app.state.hub
    return hub


HubDep = Annotated[EventHub, Depends(event_hub)]


def bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


@dataclass
class Operator:
    tenant_id: str
    name: str = "operator"


async def operator(request: Request, ctx: ContextDep, tenant: BootTenantDep) -> Operator:
    token = bearer(request)
    if token is None or not is_admin(ctx, token):
        if token is not None and await ctx.identity.resolve_pat(token) is not None:
            raise Forbidden(OPERATOR_ONLY)
        raise Unauthorized()
    return Operator(tenant_id=tenant)


def is_admin(ctx: AppContext, token: str) -> bool:
    """The operator token, compared by digest in constant time (no token configured: nothing matches)."""
    return bool(ctx.admin_digest) and hmac.compare_digest(sha256_hex(token), ctx.admin_digest)


OperatorDep = Annotated[Operator, Depends(operator)]


class WrongAudience(DomainError):
    """403 ``{"error":"wrong_audience"}``, byte-stable (runners abort on it), hence no ``code``."""

    status = 403
    code = None

    def __init__(self) -> None:
        super().__init__("wrong_audience")


def wrong_audience_response() -> JSONResponse:
    return JSONResponse(WRONG_AUDIENCE, status_code=403)


@dataclass
class RunPrincipal:
    run_id: str
    tenant_id: str
    audience: str
    status: str
    revoked: bool


async def run_token(
    request: Request, ctx: AppContext, session_id: str, audience: Audience, *, allow_revoked: bool = False
) -> RunPrincipal:
    token = bearer(request)
    if token is None:
        raise Unauthorized()
    row = await ctx.tokens.resolve_token(token)
    if row is None or row.expired or (row.revoked and not allow_revoked):
        raise Unauthorized()
    if row.audience != audience.value:
        raise WrongAudience()
    if str(row.session_id) != session_id:
        raise NotFound()
    return RunPrincipal(str(row.session_id), str(row.tenant_id), row.audience, row.status, row.revoked)


@dataclass
class TriggerPrincipal:
    subscription_id: str
    tenant_id: str


async def trigger_principal(subscription_id: str, request: Request, ctx: ContextDep) -> TriggerPrincipal:
    """A live ``fbx_trig_`` token of exactly this subscription; anything else (the admin token, a
    revoked token, another subscription's token) is 401."""
    token = bearer(request)
    if token is None or not token.startswith("fbx_trig_"):
        raise Unauthorized()
    row = await ctx.trigger_records.resolve_token(token)
    if row is None or str(row.subscription_id) != subscription_id.lower():
        raise Unauthorized()
    return TriggerPrincipal(str(row.subscription_id), str(row.tenant_id))


TriggerDep = Annotated[TriggerPrincipal, Depends(trigger_principal)]


# ---- principals of the data plane: the operator or a user (PAT) ----------------------------------

OPERATOR_ONLY = "this endpoint requires the operator (admin) token; a personal access token is not accepted here"
READ_ALL_ROLES = frozenset({"approver", "admin", "owner"})
MUTATE_ROLES = frozenset({"admin", "owner"})


@dataclass(frozen=True)
class Principal:
    """Who is calling ``/v1``: the operator (every permission, no user) or a member via a PAT."""

    tenant_id: str
    kind: str  # operator | user
    user_id: str | None = None
    membership_id: str | None = None
    roles: frozenset[str] = frozenset()
    email: str | None = None
    name: str | None = None
    org_slug: str | None = None
    org_display_name: str | None = None
    read_only: bool = False
    """A read-only PAT: refused (403) on every method but GET, HEAD and OPTIONS."""

    @property
    def is_operator(self) -> bool:
        return self.kind == "operator"

    @property
    def reads_all_runs(self) -> bool:
        """Operator, approver, admin, owner; a plain member sees only the runs it invoked."""
        return self.is_operator or bool(self.roles & READ_ALL_ROLES)

    @property
    def mutates_resources(self) -> bool:
        """Operator, admin, owner (agents, policies, org connections, bundles, catalog entries)."""
        return self.is_operator or bool(self.roles & MUTATE_ROLES)

    def sees_run_invoked_by(self, invoker: uuid.UUID | str | None) -> bool:
        """Whether the caller may see a run its invoker (``invoked_by_user_id``) started."""
        return self.reads_all_runs or (invoker is not None and str(invoker) == self.user_id)


async def principal(request: Request, ctx: ContextDep, tenant: BootTenantDep) -> Principal:
    """The admin token, or a ``fbx_pat_`` token whose user, membership and org are live right now."""
    token = bearer(request)
    if token is None:
        raise Unauthorized()
    if is_admin(ctx, token):
        return Principal(tenant_id=tenant, kind="operator")
    found = await user_principal(ctx, token)
    if found is None:
        raise Unauthorized()
    if found.read_only and request.method not in ("GET", "HEAD", "OPTIONS"):
        raise Forbidden("this token is read-only; this request needs a token that may write")
    return found


async def user_principal(ctx: AppContext, token: str) -> Principal | None:
    """The PAT's member as of right now (user, membership and org live), or None."""
    row = await ctx.identity.resolve_pat(token)
    if row is None:
        return None
    return Principal(
        tenant_id=str(row.tenant_id),
        kind="user",
        user_id=str(row.user_id),
        membership_id=str(row.membership_id),
        roles=frozenset(row.roles),
        email=row.email,
        name=row.name,
        org_slug=row.org_slug,
        org_display_name=row.org_display_name,
        read_only=row.read_only,
    )


PrincipalDep = Annotated[Principal, Depends(principal)]
