"""Request dependencies: services from app state, and the two kinds of principal."""

from __future__ import annotations

import asyncio
import hmac
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.responses import JSONResponse
from temporalio.client import Client

from api.hub import EventHub
from config.settings import Settings
from config.temporal import connect_client
from core.contract import WRONG_AUDIENCE
from core.digests import sha256_hex
from core.errors import DomainError, NotFound, Unauthorized
from core.tokens import Audience
from db.capabilities import Capabilities
from db.catalog import Catalog
from db.connections import Connections
from db.store import Store
from integrations.sealing import Sealer
from integrations.urls import UrlPolicy
from services.runs import RunFactory


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
    _temporal: Client | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def runs(self) -> RunFactory:
        """Run creation for every entry point (see ``services.runs``)."""
        return RunFactory(self.store, self.connections, self.capabilities, self.settings, self.temporal)

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


def _bearer(request: Request) -> str | None:
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
    token = _bearer(request)
    if token is None or not hmac.compare_digest(sha256_hex(token), svc.admin_digest):
        raise Unauthorized()
    return Operator(tenant_id=svc.tenant_id)


OperatorDep = Annotated[Operator, Depends(operator)]


class WrongAudience(DomainError):
    status = 403

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
    token = _bearer(request)
    if token is None:
        raise Unauthorized()
    row: dict[str, Any] | None = await svc.store.resolve_token(token)
    if row is None or row["expired"] or (row["revoked"] and not allow_revoked):
        raise Unauthorized()
    if row["audience"] != audience.value:
        raise WrongAudience()
    if row["session_id"] != session_id:
        raise NotFound()
    return RunPrincipal(row["session_id"], row["tenant_id"], row["audience"], row["status"], row["revoked"])
