"""Request dependencies: services from app state, and the two kinds of principal."""

from __future__ import annotations

import asyncio
import hmac
import uuid
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request
from fastapi.responses import JSONResponse
from temporalio.client import Client

from api.hub import EventHub
from config.settings import Settings
from config.temporal import connect_client
from core.contract import WRONG_AUDIENCE
from core.digests import sha256_hex
from core.errors import DomainError, Forbidden, NotFound, Unauthorized
from core.tokens import Audience
from db.capabilities import Capabilities
from db.catalog import Catalog
from db.connections import Connections
from db.identity import Identity
from db.store import Store
from db.triggers import Triggers
from db.usage import Metering
from integrations.sealing import Sealer
from integrations.urls import UrlPolicy
from services.connections import ConnectionService
from services.oauth_connect import OAuthConnect
from services.oauth_tokens import AccessTokens
from services.run_control import RunControl
from services.runs import RunFactory
from services.subscriptions import SubscriptionService
from services.triggers import TriggerService


@dataclass
class Services:
    settings: Settings
    store: Store
    tenant_id: str
    hub: EventHub
    admin_digest: str
    connections: Connections
    capabilities: Capabilities
    catalog: Catalog
    url_policy: UrlPolicy
    sealer: Sealer | None = None
    metering: Metering | None = None
    access_tokens: AccessTokens | None = None
    oauth: OAuthConnect | None = None
    """OAuth connect and access tokens exist only when credential storage does (a sealer)."""
    _temporal: Client | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def runs(self) -> RunFactory:
        """Run creation for every entry point (see ``services.runs``)."""
        return RunFactory(self.store, self.connections, self.capabilities, self.settings, self.temporal)

    @property
    def connection_service(self) -> ConnectionService:
        """Connecting MCP servers: static and OAuth connections, sign-in links, re-photographs."""
        return ConnectionService(
            self.connections, self.url_policy, self.sealer, self.oauth, self.access_tokens, self.public_base
        )

    @property
    def run_control(self) -> RunControl:
        """The one owner of runs' workflow handles (see ``services.run_control``)."""
        return RunControl(self.store, self.temporal, self.settings)

    @property
    def triggers(self) -> TriggerService:
        """The one firing path of trigger subscriptions (see ``services.triggers``)."""
        return TriggerService(
            self.store, self.connections, self.capabilities, self.settings, self.temporal, self.sealer
        )

    @property
    def subscriptions(self) -> SubscriptionService:
        """Managing trigger subscriptions (see ``services.subscriptions``)."""
        return SubscriptionService(self.store, self.connections, self.settings, self.temporal, self.sealer)

    @property
    def public_base(self) -> str:
        """The browser-facing base URL of this deployment (no trailing slash)."""
        return (self.settings.public_url or self.settings.api_url).rstrip("/")

    async def temporal(self) -> Client:
        if self._temporal is None:
            async with self._lock:
                if self._temporal is None:
                    self._temporal = await connect_client(self.settings)
        return self._temporal


async def services(request: Request) -> Services:
    svc: Services = request.app.state.services
    return svc


ServicesDep = Annotated[Services, Depends(services)]


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


async def operator(request: Request, svc: ServicesDep) -> Operator:
    token = bearer(request)
    if token is None or not hmac.compare_digest(sha256_hex(token), svc.admin_digest):
        if token is not None and await Identity(svc.store).resolve_pat(token) is not None:
            raise Forbidden(OPERATOR_ONLY)
        raise Unauthorized()
    return Operator(tenant_id=svc.tenant_id)


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
    request: Request, svc: Services, session_id: str, audience: Audience, *, allow_revoked: bool = False
) -> RunPrincipal:
    token = bearer(request)
    if token is None:
        raise Unauthorized()
    row = await svc.store.tokens.resolve_token(token)
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


async def trigger_principal(subscription_id: str, request: Request, svc: ServicesDep) -> TriggerPrincipal:
    """A live ``fbx_trig_`` token of exactly this subscription; anything else (the admin token, a
    revoked token, another subscription's token) is 401."""
    token = bearer(request)
    if token is None or not token.startswith("fbx_trig_"):
        raise Unauthorized()
    row = await Triggers(svc.store).resolve_token(token)
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


async def principal(request: Request, svc: ServicesDep) -> Principal:
    """The admin token, or a ``fbx_pat_`` token whose user, membership and org are live right now."""
    token = bearer(request)
    if token is None:
        raise Unauthorized()
    if hmac.compare_digest(sha256_hex(token), svc.admin_digest):
        return Principal(tenant_id=svc.tenant_id, kind="operator")
    found = await user_principal(svc, token)
    if found is None:
        raise Unauthorized()
    if found.read_only and request.method not in ("GET", "HEAD", "OPTIONS"):
        raise Forbidden("this token is read-only; this request needs a token that may write")
    return found


async def user_principal(svc: Services, token: str) -> Principal | None:
    """The PAT's member as of right now (user, membership and org live), or None."""
    row = await Identity(svc.store).resolve_pat(token)
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
